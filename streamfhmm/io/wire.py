"""The ZeroMQ wire format: encoding, decoding and validation of every message.

Input (a sensor sample), either form is accepted on the same socket:

* **multipart** ``[topic, header, payload]``

  - ``topic``: 0 to 255 bytes of UTF-8 naming the stream (one engine state per topic);
  - ``header``: a JSON object of at most 1024 bytes with ``"seq"`` (int,
    ``0 <= seq < 2**63``, consecutive per topic) and ``"ts"`` (finite number, the
    sample's time stamp in seconds); other keys are ignored;
  - ``payload``: exactly ``8 * D`` bytes, D little-endian IEEE-754 float64 (``"<f8"``).

* **one frame** of JSON ``{"topic": "name", "seq": 12, "ts": 1.7e9, "values": [...]}``
  with D numbers (``null`` for a missing value); ``"topic"`` is optional (default
  ``""``) and should come first, in compact form, so that ZeroMQ's byte-prefix
  subscription ``{"topic":"name"`` selects it. At most ``2048 + 32 D`` bytes.

NaN (binary) or ``null`` (JSON) marks a missing value; an infinity is refused. A
sample with every value missing is a sample (a sensor that is alive and read nothing:
the engine imputes it from its window and flags its posterior imputed), not a gap in
the stream's sequence numbers (which ends the engine's sequence).

An input **heartbeat** (one-way, a publisher that is alive but idle) is the
multipart ``[topic, {"heartbeat": true, "seq": last_seq_sent, "ts": now}, b""]``
(``last_seq_sent`` is -1 before the first sample); with ``"end": true`` it marks the
end of the stream (the service then flushes the stream's smoothing lag). As one
frame: ``{"topic": ..., "heartbeat": true, "seq": ..., "ts": ...}``.

Output (one posterior per input sample, in order), ``--format binary``:

* ``topic``: the input topic;
* ``header``: JSON ``{"seq": s, "t": t, "ts": ts, "version": v, "flags": f,
  "n_chains": M}`` where ``seq`` and ``ts`` are those of the input sample the posterior
  is about, ``t`` the 0-based position of that sample in the stream (consecutive per
  topic, so a gap in ``t`` is an output message lost; after a crash the service goes
  back to its last checkpoint's position, so a ``t`` can come again for another
  sample: ``seq`` identifies the sample), ``version`` the parameter
  snapshot that produced it and ``flags`` the bit set of
  :mod:`streamfhmm.stream.posterior` (1 imputed, 2 warm-up, 4 edge);
* ``payload``: ``2 M + D`` little-endian float64: θ (M values, ``q(s_t^m = 1)``),
  then ρ (M), then the reconstructed mean (D).

``--format json``: one frame ``{"topic": "name", "seq": s, "t": t, "ts": ts,
"version": v, "flags": f, "theta": [...], "rho": [...], "mean": [...]}`` (written as
``json.dumps(..., separators=(",", ":"))`` does; a non-finite value is ``null``).

In both formats ``ts`` is the input's time-stamp number, as the text it arrived as when
its header was canonical (``{"seq":<int>,"ts":<number>}``, what every streamfhmm producer
writes; texts of up to ``TS_TEXT_BYTES``), whichever encoder publishes it (the compiled
paths, and the Python ones given a :class:`TsText`), else as ``repr`` of its float.

Output heartbeat (when a stream, or the whole service, is idle):
``[topic, {"heartbeat": true, "seq": last_seq_received, "t": next_t, "ts": now}, b""]``
per stream (``next_t`` the position the stream's next sample will take), and on the
empty topic ``[b"", {"heartbeat": true, "streams": n, "ts": now}, b""]`` for the
service; as one JSON frame with ``"topic"`` first in ``--format json``. An empty
payload is what tells a heartbeat from a posterior.

Sizes are bounded per frame before anything is allocated: a receiving socket refuses
any frame over :func:`max_frame_bytes` (libzmq's ``MAXMSGSIZE``, which drops the
connection; the source reconnects), and the header and JSON lengths are checked before
parsing. libzmq has no bound on a message's number of frames, and hands a multipart
message over only once it is whole: one of 50,000 frames under the bound each is held
whole (100 MB) before it is refused as ``frames``. On a network, take input from
trusted peers only (CURVE, ``serve --curve-*``).

Every decoding error is a :class:`WireError` whose ``kind`` is one of
:data:`ERROR_KINDS`.

Examples
--------
>>> import numpy as np
>>> frames = encode_sample(b"s1", 7, 1.5, np.array([1.0, 2.0]))
>>> s = decode_input(frames, n_features=2)
>>> s.topic, s.seq, s.ts, s.values.tolist()
(b's1', 7, 1.5, [1.0, 2.0])
"""
from __future__ import annotations

import json
import math
import re
from typing import NamedTuple

import numpy as np

__all__ = [
    "ERROR_KINDS", "WireError", "Sample", "SampleRun", "Heartbeat", "PosteriorMessage",
    "MAX_TOPIC_BYTES", "MAX_HEADER_BYTES", "SEQ_LIMIT", "max_json_bytes", "max_frame_bytes",
    "TS_TEXT_BYTES", "ts_text", "ts_from_text", "TsText", "check_topic", "topic_name",
    "encode_sample", "encode_heartbeat", "encode_posterior", "encode_posterior_batch",
    "encode_service_heartbeat",
    "decode_input", "decode_output", "subscription_prefixes",
]

#: the kinds of malformed input, each counted separately
ERROR_KINDS = (
    "frames",     # neither 1 nor 3 frames
    "topic",      # topic longer than MAX_TOPIC_BYTES or not UTF-8 (a source: or outside its topics)
    "json",       # header or one-frame message not parseable JSON (or too large to parse)
    "fields",     # JSON parsed, but seq / ts / values / heartbeat missing or of the wrong type
    "size",       # payload not 8 * D bytes, or a JSON "values" list not of length D
    "nonfinite",  # an infinite value
)

#: the longest time-stamp text carried as text (:class:`SampleRun`; longer ones are
#: decoded to a float)
TS_TEXT_BYTES = 32
MAX_TOPIC_BYTES = 255
MAX_HEADER_BYTES = 1024
#: sequence numbers are below this (int64 on the compiled paths)
SEQ_LIMIT = 2**63
_LE_F8 = np.dtype("<f8")
#: a JSON number (RFC 8259 §6), as a bytes pattern
JSON_NUMBER = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
#: ``{"seq":<int>,"ts":<JSON number>}`` exactly (a fast path; anything else goes to json)
_CANONICAL_HEADER = re.compile(rb'\{"seq":(0|[1-9][0-9]{0,18}),"ts":(' + JSON_NUMBER + rb')\}\Z').match


def max_json_bytes(n_features: int) -> int:
    """The largest one-frame JSON message accepted for ``n_features`` values."""
    return 2048 + 32 * int(n_features)


def max_frame_bytes(n_features: int) -> int:
    """A bound on every input frame (for ZeroMQ's ``MAXMSGSIZE``): nothing larger is valid."""
    return max(max_json_bytes(n_features), 8 * int(n_features), MAX_HEADER_BYTES)


class WireError(ValueError):
    """A malformed message; ``kind`` is one of :data:`ERROR_KINDS`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Sample(NamedTuple):
    """One decoded input sample.

    Attributes
    ----------
    topic : bytes
    seq : int
    ts : float
    values : ndarray of float64, shape (D,)
        Read-only; NaN marks a missing value.
    """

    topic: bytes
    seq: int
    ts: float
    values: np.ndarray


def ts_text(ts: float) -> bytes:
    """The JSON number text of a time stamp, as the encoders write it: the text it
    arrived as (a :class:`TsText`), else ``repr``."""
    text = getattr(ts, "text", None)
    return b"%r" % float(ts) if text is None else text


def ts_from_text(text, length: int) -> float:
    """The float of a time-stamp text: the first ``length`` bytes of a uint8 row."""
    return float(text[:length].tobytes())


class TsText(float):
    """A time stamp that keeps the JSON number text it arrived as (``text``, bytes).

    A float wherever a float is taken; :func:`encode_posterior` repeats ``text`` in the
    output, as the block encoders do, not ``repr`` of the float (``1700000041`` came
    back as ``1700000041.0`` from a posterior published alone, character for character
    from one published in a block).
    """

    __slots__ = ("text",)

    def __new__(cls, text: bytes):
        self = super().__new__(cls, text)
        self.text = bytes(text)
        return self

    def __reduce__(self):   # (pickle and copy rebuilt it from the float, not the text)
        return TsText, (self.text,)

    @classmethod
    def from_row(cls, text, length: int) -> "TsText":
        """The time stamp of a text row: the first ``length`` bytes of a uint8 row (as
        :func:`ts_from_text`, keeping the text)."""
        return cls(text[:length].tobytes())


class SampleRun:
    """Consecutive samples of one stream (consecutive sequence numbers), as arrays.

    What the compiled receive path (:mod:`streamfhmm.io.fastwire`) returns in place of
    one :class:`Sample` each; the time stamps are kept as the text they arrived in.

    Attributes
    ----------
    topic : bytes
    seq : ndarray of int64, shape (n,)
        ``seq[0], seq[0] + 1, ...``.
    ts_text : ndarray of uint8, shape (n, TS_TEXT_BYTES)
        Row i holds the JSON number text of sample i's ``"ts"`` in its first
        ``ts_len[i]`` bytes.
    ts_len : ndarray of int64, shape (n,)
    values : ndarray of float64, shape (n, D)
        Read-only; NaN marks a missing value.
    """

    __slots__ = ("topic", "seq", "ts_text", "ts_len", "values")

    def __init__(self, topic: bytes, seq, ts_text, ts_len, values):
        self.topic, self.seq, self.ts_text, self.ts_len, self.values = topic, seq, ts_text, ts_len, values

    def __len__(self):
        return self.seq.shape[0]

    def __repr__(self):
        n = len(self)
        return (f"SampleRun(topic={self.topic!r}, seq={int(self.seq[0]) if n else None}.."
                f"{int(self.seq[-1]) if n else None}, n={n})")

    @property
    def ts(self) -> np.ndarray:
        """The time stamps as float64, shape (n,)."""
        return np.array([ts_from_text(r, m) for r, m in zip(self.ts_text, self.ts_len.tolist())],
                        dtype=np.float64)

    def samples(self) -> list:
        """The run as one :class:`Sample` each."""
        return [Sample(self.topic, s, ts, v)
                for s, ts, v in zip(self.seq.tolist(), self.ts.tolist(), self.values)]


class Heartbeat(NamedTuple):
    """A one-way heartbeat: the publisher of ``topic`` is alive and sent up to ``seq``.

    ``end`` marks the end of the stream (input only); ``t`` is the next stream
    position (output only, -1 otherwise); ``streams`` the number of streams (service
    heartbeat on the empty topic, -1 otherwise).
    """

    topic: bytes
    seq: int
    ts: float
    end: bool = False
    t: int = -1
    streams: int = -1


class PosteriorMessage(NamedTuple):
    """One decoded output posterior (see the module docstring)."""

    topic: bytes
    seq: int
    t: int
    ts: float
    version: int
    flags: int
    theta: np.ndarray
    rho: np.ndarray
    mean: np.ndarray


# -- helpers ---------------------------------------------------------------------------
def _topic_bytes(topic) -> bytes:
    if isinstance(topic, str):
        topic = topic.encode("utf-8")
    topic = bytes(topic)
    if len(topic) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic must be at most {MAX_TOPIC_BYTES} bytes, got {len(topic)}")
    try:
        topic.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"topic must be UTF-8, got {topic!r}") from None
    return topic


def topic_name(topic: bytes) -> str:
    """A topic as messages and logs name its stream: UTF-8, bad bytes replaced."""
    return topic.decode("utf-8", "replace")


def check_topic(topic: bytes) -> bytes:
    """``topic`` if it is valid UTF-8 of at most :data:`MAX_TOPIC_BYTES`; else WireError."""
    if len(topic) > MAX_TOPIC_BYTES:
        raise WireError("topic", f"topic of {len(topic)} bytes (at most {MAX_TOPIC_BYTES})")
    try:
        topic.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("topic", f"topic is not UTF-8: {topic[:40]!r}") from None
    return topic


def _loads(frame: bytes, limit: int, what: str):
    if len(frame) > limit:
        raise WireError("json", f"{what} of {len(frame)} bytes (at most {limit})")
    try:
        obj = json.loads(frame)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise WireError("json", f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise WireError("json", f"{what} is nested too deeply") from None
    if type(obj) is not dict:
        raise WireError("fields", f"{what} must be a JSON object, got {type(obj).__name__}")
    return obj


def _seq_ts(obj: dict, what: str, allow_minus_one: bool = False) -> tuple[int, float]:
    seq = obj.get("seq")
    if type(seq) is not int or not ((-1 if allow_minus_one else 0) <= seq < SEQ_LIMIT):
        raise WireError("fields", f"{what} needs \"seq\", an integer in [0, 2**63), got {seq!r}")
    ts = obj.get("ts")
    if type(ts) is not float and type(ts) is not int:
        raise WireError("fields", f"{what} needs \"ts\", a number, got {ts!r}")
    ts = _finite_ts(ts)
    if ts is None:
        raise WireError("fields", f"{what} needs a finite \"ts\", got {obj.get('ts')!r:.40}")
    return seq, ts


def _finite_ts(ts) -> float | None:
    """``float(ts)`` for a JSON int or float, None if not finite (JSON ints are unbounded)."""
    try:
        ts = float(ts)
    except OverflowError:
        return None
    return ts if math.isfinite(ts) else None


def _check_values(x: np.ndarray) -> np.ndarray:
    # fast path: a finite (Python, warning-free) sum means every value is finite
    if math.isfinite(sum(x.tolist())) if x.shape[0] <= 32 else np.isfinite(x).all():
        return x
    if np.isinf(x).any():
        i = int(np.flatnonzero(np.isinf(x))[0])
        raise WireError("nonfinite", f"value {i} is {x[i]}")
    return x


def _heartbeat(topic: bytes, obj: dict, what: str) -> Heartbeat:
    if obj.get("heartbeat") is not True:
        raise WireError("fields", f"{what} with an empty payload must be a heartbeat "
                                  "({\"heartbeat\": true, ...})")
    seq, ts = _seq_ts(obj, what, allow_minus_one=True)
    end = obj.get("end", False)
    if type(end) is not bool:
        raise WireError("fields", f"{what}: \"end\" must be true or false, got {end!r}")
    return Heartbeat(topic, seq, ts, end)


# -- input ----------------------------------------------------------------------------
def decode_input(frames, n_features: int) -> Sample | Heartbeat:
    """Decode and validate one input message.

    Parameters
    ----------
    frames : list of bytes
        The message's frames as received (``socket.recv_multipart()``).
    n_features : int
        The expected number of values D.

    Returns
    -------
    Sample or Heartbeat

    Raises
    ------
    WireError
        With ``kind`` in :data:`ERROR_KINDS`. Sizes are checked before anything is
        allocated or parsed from a frame.
    """
    n = len(frames)
    if n == 3:
        topic, header, payload = frames
        check_topic(topic)
        # (a header over the bound goes to _loads, which refuses it, whatever its form)
        m = _CANONICAL_HEADER(header) if len(header) <= MAX_HEADER_BYTES else None
        if m is not None and len(payload):
            # the compact form every streamfhmm producer writes: parsed without json
            seq = int(m.group(1))
            # (its text kept, as the compiled decoder keeps it: the output repeats it)
            ts = TsText(m.group(2)) if len(m.group(2)) <= TS_TEXT_BYTES else float(m.group(2))
            if seq >= SEQ_LIMIT or not math.isfinite(ts):
                raise WireError("fields", f"header needs \"seq\" in [0, 2**63) and a finite \"ts\", "
                                          f"got {header[:80]!r}")
        else:
            obj = _loads(header, MAX_HEADER_BYTES, "header")
            if len(payload) == 0:
                return _heartbeat(topic, obj, "header")
            seq, ts = _seq_ts(obj, "header")
        if len(payload) != 8 * n_features:
            raise WireError("size", f"payload of {len(payload)} bytes; expected {8 * n_features} "
                                    f"({n_features} little-endian float64)")
        return Sample(topic, seq, ts, _check_values(np.frombuffer(payload, dtype=_LE_F8)))
    if n == 1:
        obj = _loads(frames[0], max_json_bytes(n_features), "one-frame JSON message")
        topic = obj.get("topic", "")
        if type(topic) is not str:
            raise WireError("fields", f"\"topic\" must be a string, got {topic!r}")
        topic = topic.encode("utf-8", "surrogatepass")
        check_topic(topic)
        values = obj.get("values")
        if values is None:
            return _heartbeat(topic, obj, "one-frame JSON message without \"values\"")
        seq, ts = _seq_ts(obj, "one-frame JSON message")
        if type(values) is not list:
            raise WireError("fields", f"\"values\" must be a list of numbers, got {type(values).__name__}")
        if len(values) != n_features:
            raise WireError("size", f"\"values\" has {len(values)} numbers; expected {n_features}")
        for v in values:
            if v is not None and type(v) is not float and type(v) is not int:
                raise WireError("fields", f"\"values\" must hold numbers or null, got {v!r}")
        try:
            x = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        except OverflowError:
            raise WireError("nonfinite", "a value overflows float64") from None
        x.flags.writeable = False
        return Sample(topic, seq, ts, _check_values(x))
    raise WireError("frames", f"message of {n} frames; expected 3 ([topic, header, payload]) "
                              "or 1 (JSON)")


#: the float types of a time stamp on the publish path's fast checks
_FLOATS = (float, TsText)
#: the placeholder of a time stamp in a JSON body, before its text is spliced in
_TS_SLOT = b',"ts":0,"version":'


def _ts_spliced(body: bytes, text: bytes) -> bytes:
    """A JSON output ``body`` written with ``"ts": 0``, its time stamp's ``text`` put in
    (the topic, a JSON string, cannot hold the placeholder unescaped)."""
    return body.replace(_TS_SLOT, b',"ts":' + text + b',"version":', 1)


def _check_seq_ts(seq, ts) -> tuple[int, float]:
    """``seq`` and ``ts`` of a message to encode, as int and float: an integer in
    [0, 2**63) and a finite number (what the decoders accept), else ValueError."""
    if type(seq) is int and type(ts) in _FLOATS and 0 <= seq < SEQ_LIMIT and ts - ts == 0.0:
        return seq, ts   # (the usual case, on the publish path: no conversion)
    if isinstance(seq, (bool, np.bool_)) or not isinstance(seq, (int, np.integer)) \
            or not 0 <= seq < SEQ_LIMIT:
        raise ValueError(f"seq must be an integer in [0, 2**63), got {seq!r}")
    if isinstance(ts, (bool, np.bool_)) or not isinstance(ts, (int, float, np.integer, np.floating)) \
            or not math.isfinite(ts):
        raise ValueError(f"ts must be a finite number, got {ts!r}")
    return int(seq), float(ts)


def _check_seqs_tss(seqs, tss, n: int) -> tuple[list, list]:
    """:func:`_check_seq_ts` for the n sequence numbers and time stamps of a batch, as lists."""
    if (type(seqs) is list and type(tss) is list and len(seqs) == n == len(tss)
            and all(type(v) is int and 0 <= v < SEQ_LIMIT for v in seqs)
            and all(type(v) in _FLOATS and v - v == 0.0 for v in tss)):
        return seqs, tss   # (the usual case, on the publish path: no conversion)
    seqs, tss = np.asarray(seqs), np.asarray(tss)
    if seqs.shape != (n,) or tss.shape != (n,):
        raise ValueError(f"seqs and tss must have shape ({n},) (one per posterior), got "
                         f"{seqs.shape} and {tss.shape}")
    if n and (seqs.dtype.kind not in "iu" or seqs.min() < 0 or seqs.max() >= SEQ_LIMIT):
        raise ValueError(f"seqs must be integers in [0, 2**63), got {seqs[:5].tolist()!r}...")
    if n and (tss.dtype.kind not in "iuf" or not np.isfinite(tss).all()):
        raise ValueError(f"tss must be finite numbers, got {tss[:5].tolist()!r}...")
    return seqs.tolist(), tss.astype(np.float64).tolist()


def encode_sample(topic, seq: int, ts: float, values, format: str = "binary") -> list[bytes]:
    """The frames of one input sample (what ``streamfhmm replay`` publishes).

    Parameters
    ----------
    topic : bytes or str
    seq : int
        In [0, 2**63).
    ts : float
        Finite.
    values : array_like, shape (D,)
    format : {"binary", "json"}

    Raises
    ------
    ValueError
        For a ``seq``, ``ts`` or ``format`` the wire does not carry.
    """
    topic = _topic_bytes(topic)
    seq, ts = _check_seq_ts(seq, ts)
    if format == "binary":
        return [topic, b'{"seq":%d,"ts":%r}' % (seq, ts),
                np.ascontiguousarray(values, dtype=_LE_F8).tobytes()]
    if format == "json":
        vals = [None if v != v else v for v in np.asarray(values, dtype=np.float64).tolist()]
        return [_json_dumps({"topic": topic.decode("utf-8"), "seq": seq, "ts": ts, "values": vals})]
    raise ValueError(f"format must be 'binary' or 'json', got {format!r}")


def encode_heartbeat(topic, seq: int, ts: float, end: bool = False, format: str = "binary",
                     t: int | None = None) -> list[bytes]:
    """A one-way heartbeat on ``topic`` (``seq`` the last sequence number sent, -1 if none).

    ``end=True`` marks the end of an input stream; ``t`` (output heartbeats) is the
    stream's next position.
    """
    topic = _topic_bytes(topic)
    obj = {"heartbeat": True, "seq": int(seq)}
    if t is not None:
        obj["t"] = int(t)
    obj["ts"] = float(ts)
    if end:
        obj["end"] = True
    if format == "binary":
        return [topic, _json_dumps(obj), b""]
    if format == "json":
        return [_json_dumps({"topic": topic.decode("utf-8"), **obj})]
    raise ValueError(f"format must be 'binary' or 'json', got {format!r}")


def encode_service_heartbeat(n_streams: int, ts: float, format: str = "binary") -> list[bytes]:
    """The service's own heartbeat, on the empty topic."""
    obj = {"heartbeat": True, "streams": int(n_streams), "ts": float(ts)}
    if format == "binary":
        return [b"", _json_dumps(obj), b""]
    if format == "json":
        return [_json_dumps({"topic": "", **obj})]
    raise ValueError(f"format must be 'binary' or 'json', got {format!r}")


def subscription_prefixes(prefix) -> list[bytes]:
    """The ZeroMQ subscriptions that select the topics beginning with ``prefix``.

    For a non-empty prefix: the multipart form's topic frame, and the compact one-frame
    JSON form ``{"topic":"prefix...`` with the prefix as JSON text, both as Python's
    ``json`` writes it (non-ASCII characters as ``\\uXXXX``) and as raw UTF-8 (as
    JavaScript's ``JSON.stringify`` and most other encoders write it) where the two
    differ; ``[b""]`` (everything) for an empty one.
    """
    prefix = _topic_bytes(prefix)
    if not prefix:
        return [b""]
    name = prefix.decode("utf-8")
    subs = [prefix]
    for ascii_only in (True, False):
        sub = b'{"topic":' + json.dumps(name, ensure_ascii=ascii_only).encode("utf-8")[:-1]
        if sub not in subs:
            subs.append(sub)
    return subs


def _json_dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


# -- output ---------------------------------------------------------------------------
def encode_posterior(topic, seq: int, ts: float, post, format: str = "binary") -> list[bytes]:
    """The frames of one output posterior.

    Parameters
    ----------
    topic : bytes or str
    seq, ts :
        Sequence number and time stamp of the input sample the posterior is about
        (an integer in [0, 2**63), a finite number: else ValueError).
    post : Posterior
        With ``t``, ``theta`` (M,), ``rho`` (M,), ``mean`` (D,), ``version``, ``flags``.
    format : {"binary", "json"}
    """
    topic = _topic_bytes(topic)
    seq, _ = _check_seq_ts(seq, ts)
    text = ts_text(ts)   # (a TsText's own text, else repr)
    theta, rho, mean = post.theta, post.rho, post.mean
    if format == "binary":
        header = b'{"seq":%d,"t":%d,"ts":%s,"version":%d,"flags":%d,"n_chains":%d}' % (
            seq, post.t, text, post.version, post.flags, theta.shape[0])
        return [topic, header, np.concatenate((theta, rho, mean)).astype(_LE_F8, copy=False).tobytes()]
    if format == "json":
        return [_ts_spliced(_json_dumps({"topic": topic.decode("utf-8"), "seq": seq, "t": int(post.t),
                                         "ts": 0, "version": int(post.version),
                                         "flags": int(post.flags), "theta": _finite_list(theta),
                                         "rho": _finite_list(rho), "mean": _finite_list(mean)}),
                            text)]
    raise ValueError(f"format must be 'binary' or 'json', got {format!r}")


def encode_posterior_batch(topic, seqs, tss, batch, format: str = "binary") -> list:
    """The frames of several posteriors of one stream (one list of frames per posterior).

    ``batch`` has arrays ``t`` (n,), ``theta`` (n, M), ``rho`` (n, M), ``mean`` (n, D),
    ``version`` (n,), ``flags`` (n,) (a :class:`~streamfhmm.stream.engine.PosteriorBatch`);
    ``seqs`` and ``tss`` (n,) are the input sequence numbers and time stamps (integers
    in [0, 2**63) and finite numbers: else ValueError).
    """
    topic = _topic_bytes(topic)
    n = len(batch.t)
    seqs, checked = _check_seqs_tss(seqs, tss, n)
    # the time stamps' texts: a TsText's own (as encode_posterior), else repr
    ts_b = [ts_text(x) for x in (checked if isinstance(tss, np.ndarray) else tss)]
    t, version, flags = batch.t.tolist(), batch.version.tolist(), batch.flags.tolist()
    M = batch.theta.shape[1]
    if format == "binary":
        packed = np.concatenate((batch.theta, batch.rho, batch.mean), axis=1).astype(_LE_F8, copy=False)
        return [[topic, b'{"seq":%d,"t":%d,"ts":%s,"version":%d,"flags":%d,"n_chains":%d}' % (
                    seqs[k], t[k], ts_b[k], version[k], flags[k], M), packed[k].tobytes()]
                for k in range(n)]
    if format == "json":
        name = topic.decode("utf-8")
        if (np.isfinite(batch.theta).all() and np.isfinite(batch.rho).all()
                and np.isfinite(batch.mean).all()):   # (tss: finite, _check_seqs_tss)
            # what json.dumps writes for these (floats as repr), from one template
            D = batch.mean.shape[1]
            template = ('{"topic":%s,"seq":%%d,"t":%%d,"ts":%%s,"version":%%d,"flags":%%d,"theta":[%s],'
                        '"rho":[%s],"mean":[%s]}' % (json.dumps(name).replace("%", "%%"), ",".join(["%r"] * M),
                                                     ",".join(["%r"] * M), ",".join(["%r"] * D)))
            rows = np.concatenate((batch.theta, batch.rho, batch.mean), axis=1).tolist()
            return [[(template % (seqs[k], t[k], ts_b[k].decode("ascii"), version[k], flags[k],
                                  *rows[k])).encode("utf-8")]
                    for k in range(n)]
        return [[_ts_spliced(_json_dumps({"topic": name, "seq": seqs[k], "t": t[k], "ts": 0,
                              "version": version[k], "flags": flags[k],
                              "theta": _finite_list(batch.theta[k]), "rho": _finite_list(batch.rho[k]),
                              "mean": _finite_list(batch.mean[k])}), ts_b[k])]
                for k in range(n)]
    raise ValueError(f"format must be 'binary' or 'json', got {format!r}")


def _finite_list(a) -> list:
    return [v if math.isfinite(v) else None for v in np.asarray(a, dtype=np.float64).tolist()]


def decode_output(frames) -> PosteriorMessage | Heartbeat:
    """Decode one output message of ``streamfhmm serve`` (either format).

    Returns
    -------
    PosteriorMessage or Heartbeat

    Raises
    ------
    WireError
    """
    n = len(frames)
    if n == 3:
        topic, header, payload = frames
        obj = _loads(header, MAX_HEADER_BYTES, "header")
    elif n == 1:
        obj = _loads(frames[0], 1 << 26, "one-frame JSON message")
        topic = obj.get("topic")
        if type(topic) is not str:
            raise WireError("fields", f"\"topic\" must be a string, got {topic!r}")
        topic = check_topic(topic.encode("utf-8", "surrogatepass"))
        payload = None
    else:
        raise WireError("frames", f"message of {n} frames; expected 3 or 1")
    ts = obj.get("ts")
    ts = _finite_ts(ts) if type(ts) in (int, float) else None
    if obj.get("heartbeat") is True:
        seq, t, streams = obj.get("seq", -1), obj.get("t", -1), obj.get("streams", -1)
        if ts is None or type(seq) is not int or type(t) is not int or type(streams) is not int:
            raise WireError("fields", f"malformed heartbeat {obj!r:.200}")
        return Heartbeat(topic, seq, ts, False, t, streams)
    fields = [obj.get(k) for k in ("seq", "t", "version", "flags")]
    if ts is None or any(type(v) is not int for v in fields):
        raise WireError("fields", f"output header needs integer seq/t/version/flags and a finite ts, "
                                  f"got {obj!r:.200}")
    seq, t, version, flags = fields
    if payload is not None:
        M = obj.get("n_chains")
        if type(M) is not int or M < 1 or len(payload) % 8 or len(payload) // 8 <= 2 * M:
            raise WireError("size", f"payload of {len(payload)} bytes does not fit n_chains={M!r}")
        v = np.frombuffer(payload, dtype=_LE_F8)
        theta, rho, mean = v[:M], v[M:2 * M], v[2 * M:]
    else:
        try:
            theta, rho, mean = (np.array([np.nan if a is None else a for a in obj[k]], dtype=np.float64)
                                for k in ("theta", "rho", "mean"))
        except (KeyError, TypeError, ValueError, OverflowError):
            raise WireError("fields", "JSON output lacks theta/rho/mean lists") from None
    return PosteriorMessage(topic, seq, t, ts, version, flags, theta, rho, mean)
