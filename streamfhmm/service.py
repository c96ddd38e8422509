"""The serve loop: ZeroMQ samples in, one engine state per topic, posteriors out.

:class:`StreamService` ties a :class:`~streamfhmm.io.zmq.ZmqSource`, a
:class:`~streamfhmm.io.zmq.ZmqSink` and one :class:`~streamfhmm.stream.engine.StreamEngine`
per stream topic into a ``zmq.Poller`` loop:

* every valid sample goes to its topic's engine; every posterior the engine emits is
  published with the sequence number and time stamp of the sample it is about (runs of
  consecutive samples of one topic, when the input is backed up, go through the
  engine's block path ``push_many``);
* a discontinuity in a stream's sequence numbers (a gap, a publisher restarting (at 0,
  or elsewhere: :class:`~streamfhmm.io.zmq.ZmqSource`'s ``resync_after``),
  the first sample after a resume that lost samples) ends the engine's sequence first:
  the posteriors pending in the smoothing lag are emitted from edge-padded windows
  (flagged ``FLAG_EDGE``) and the next sample starts a new sequence. During an engine's
  warm-up it is counted but does not end the warm-up: the samples on both sides go
  into the one warm-up buffer (ending it would start the model from the samples
  buffered so far);
* malformed messages, sequence gaps, stale sequence numbers, samples the engine
  refuses and topics past ``max_streams`` are counted and skipped — input never stops
  the loop;
* a new topic that finds ``max_streams`` streams takes the place of a stream the
  service retires: one that ended, or (``retire_idle``) one idle long enough. With a
  checkpoint directory the retired stream is checkpointed and resumes where it was
  when its topic comes back (its numbers checked against the checkpoint's); without
  one its topic starts a new engine. Topics that end (or go idle, with
  ``retire_idle``) thus do not keep new ones out, as long as their checkpoints can be
  written; topics that neither end nor go quiet do;
* idle streams (and the idle service) send one-way heartbeats;
* with a checkpoint directory, each stream is checkpointed every
  ``checkpoint_every`` samples, when it ends and at shutdown, and a new service
  resumes the streams found there that had not ended (at most ``max_streams``, the
  last checkpointed first; the others when their topics come back), reporting how
  many samples were lost since its checkpoint
  (the sequence numbers between the checkpoint's last one and the first one received
  after the restart). After a crash, the posteriors of samples that were inside the
  smoothing lag at the checkpoint are published again: delivery is at-least-once.
  The positions ``t`` go back to the checkpoint's too, so the ``t`` of a posterior
  published between the checkpoint and the crash comes again, for a sample received
  after the restart: ``(topic, seq)`` identifies a posterior's sample, ``t`` does not
  across a crash (a stop by SIGTERM checkpoints last and repeats nothing);
  what a crash in the middle of a checkpoint left (engine files no record names,
  temporary files older than an hour) is removed at the start;
* :meth:`StreamService.request_stop` (e.g. from a signal handler the host installs)
  makes :meth:`StreamService.run` drain the queued input (for at most ``drain_timeout``
  seconds: a publisher that never pauses cannot keep it from stopping), flush the
  engines, publish, checkpoint and return. With a checkpoint directory an engine still
  in its warm-up is not flushed: its checkpoint keeps the buffer, and the warm-up goes
  on when the service is started again.

``wait_subscribers`` counts the subscriptions that reach the output socket. A consumer
whose SUB socket stays connected while the service restarts resends its subscription
only when it next polls or receives on that socket (libzmq processes the reconnection
in the owner's thread), which a consumer blocked in ``recv`` does.

Checkpoint directory layout: per stream, ``stream-<topic hex>.json`` (the commit
record: topic, last sequence number, stream position, the (t, seq, ts) of samples
still inside the smoothing lag, each ``ts`` the number text it arrived as, the engine
file's name) and the engine checkpoint it names, ``stream-<topic hex>.<generation>.npz``.
The record is replaced atomically after the engine file is complete, so a crash at any
moment leaves the previous consistent pair.

The library installs no signal handlers and configures no logging.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import threading
import time

import numpy as np
import zmq

from .io.checkpoint import write_atomically
from .io.fastwire import STOP_ERROR, STOP_SLOW
from .io.lane import LANE_STATUS, serve_lane
from .io.wire import (JSON_NUMBER, SEQ_LIMIT, TS_TEXT_BYTES, Heartbeat, SampleRun, check_topic,
                      encode_heartbeat, encode_sample, topic_name, ts_from_text, ts_text, TsText)
from .io.zmq import RateLimitedLog, ZmqSink, ZmqSource
from .stream.engine import _CHUNK as _ENGINE_CHUNK
from .stream.engine import PosteriorBatch

__all__ = ["StreamService", "CheckpointError", "start_metrics_server", "MetricsServer",
           "read_stream_record"]

logger = logging.getLogger(__name__)

_RECORD_TAG = "streamfhmm.service-stream"
_RECORD_VERSION = 2   # 2: "ended" and "run" (version 1 records: not ended, run unknown)
#: a record's "ended" flag as :meth:`StreamService._checkpoint` writes it (json.dumps)
_ENDED_TEXT = b'"ended": true'
_GOES_ON_TEXT = b'"ended": false'
#: seconds before a stream whose retirement failed (its checkpoint) is tried again
_RETIRE_RETRY = 10.0
#: seconds a topic whose checkpoint is of another width is refused without loading it
#: again, and how many such topics are remembered
_REFUSE_FOR = 60.0
_REFUSED_KEPT = 1024
#: a stream's file stem (:func:`_stream_stem`); its record, an engine file, and a
#: temporary file of an atomic write (:func:`~streamfhmm.io.checkpoint.write_atomically`)
_STEM = r"stream-(?:[0-9a-f]*|h[0-9a-f]{40})"
_RECORD_RE = re.compile(rf"^{_STEM}\.json$")
_ENGINE_FILE_RE = re.compile(rf"^{_STEM}\.\d+\.npz$")
_TMP_FILE_RE = re.compile(rf"^\.{_STEM}\.(?:\d+\.npz|json)\.tmp-\d+-\d+$")
#: a record or engine file set aside (:meth:`StreamService._set_aside`)
_UNUSABLE_RE = re.compile(rf"^{_STEM}\.(?:\d+\.npz|json)\.unusable$")
#: seconds after which a temporary file of a checkpoint directory is a crash's leftover
_TMP_MAX_AGE = 3600.0
#: a JSON number's text (what a time stamp arrives as, or ``repr`` of a finite float)
_JSON_NUMBER = re.compile(JSON_NUMBER + rb"\Z").match


#: messages per general-path read of a lane service waiting for its lane to apply again
#: (a gap or restart closed the engine's sequence, and the next sample opens another; the
#: source's bookkeeping or the engine's position disagreeing with the stream's)
_GENERAL_READ = 8
#: most streams in the table among which the lane looks for the only one not ended
_LANE_SCAN = 16


class CheckpointError(ValueError):
    """A checkpoint directory entry that is not a valid stream checkpoint."""


class _Everything:
    """A container holding everything (a source without sequence bookkeeping)."""

    def __contains__(self, item):
        return True


_ALL = _Everything()


class _WidthError(CheckpointError):
    """A stream checkpoint of an engine with another number of features than the
    service reads (its configuration, not the file, is at fault)."""


def _mtime(path: str) -> float:
    """When the file at ``path`` was last written (now if it cannot be read)."""
    try:
        return os.path.getmtime(path)
    except OSError:
        return time.time()


def _record_says_ended(path: str) -> bool:
    """Whether the record at ``path``, one :func:`read_stream_record` refuses, reads as
    JSON with ``"ended": true`` (then it is not resumed at the start but set aside when
    its topic comes back)."""
    try:
        with open(path, "rb") as fh:
            rec = json.loads(fh.read())
        return isinstance(rec, dict) and rec.get("ended") is True
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False


class _Pending:
    """(t, seq, ts) of the samples pushed whose posterior is not yet published.

    A FIFO of consecutive stream positions ``t0 .. t0 + n - 1`` in arrays, the time
    stamps kept as the JSON number text they arrived in (what the output header
    repeats; see :class:`~streamfhmm.io.wire.SampleRun`). Iterating yields
    ``(t, seq, ts)`` with ``ts`` a float.
    """

    __slots__ = ("t0", "head", "n", "seq", "text", "tlen")

    def __init__(self, capacity: int = 256):
        self.t0 = 0
        self.head = 0
        self.n = 0
        self.seq = np.zeros(capacity, np.int64)
        self.text = np.zeros((capacity, TS_TEXT_BYTES), np.uint8)
        self.tlen = np.zeros(capacity, np.int64)

    def __len__(self):
        return self.n

    def __iter__(self):
        h = self.head
        for i in range(self.n):
            yield self.t0 + i, int(self.seq[h + i]), ts_from_text(self.text[h + i], self.tlen[h + i])

    def _room(self, t: int, k: int) -> int:
        """Make room for k entries at position t (the next one); returns their index."""
        if self.n == 0:
            self.t0, self.head = t, 0
        elif t != self.t0 + self.n:
            raise ValueError(f"pending positions must be consecutive: {t} after {self.t0 + self.n - 1}")
        end = self.head + self.n
        if end + k > self.seq.shape[0]:
            need = self.n + k
            if need <= self.seq.shape[0] // 2:   # compact
                sl = slice(self.head, end)
                self.seq[:self.n] = self.seq[sl]
                self.text[:self.n] = self.text[sl]
                self.tlen[:self.n] = self.tlen[sl]
            else:
                cap = max(2 * self.seq.shape[0], 2 * need)
                seq, text, tlen = (np.zeros(cap, np.int64), np.zeros((cap, TS_TEXT_BYTES), np.uint8),
                                   np.zeros(cap, np.int64))
                seq[:self.n] = self.seq[self.head:end]
                text[:self.n] = self.text[self.head:end]
                tlen[:self.n] = self.tlen[self.head:end]
                self.seq, self.text, self.tlen = seq, text, tlen
            self.head = 0
            end = self.n
        self.n += k
        return end

    def append(self, t: int, seq: int, ts: float):
        self.append_text(t, seq, ts_text(ts))

    def append_text(self, t: int, seq: int, text: bytes):
        """Position t: sequence number and time-stamp text (at most TS_TEXT_BYTES)."""
        i = self._room(int(t), 1)
        self.seq[i] = seq
        self.text[i, :len(text)] = np.frombuffer(text, np.uint8)
        self.tlen[i] = len(text)

    def json_text(self) -> str:
        """The JSON text of ``[[t, seq, ts], ...]``, each ``ts`` the number text it
        arrived as (a text that is no JSON number: ``repr`` of its float)."""
        h = self.head
        rows = []
        for i, seq in enumerate(self.seq[h:h + self.n].tolist()):
            txt = self.text[h + i, :self.tlen[h + i]].tobytes()
            if not _JSON_NUMBER(txt):
                txt = ts_text(float(txt))
            rows.append(b"[%d,%d,%s]" % (self.t0 + i, seq, txt))
        return (b"[" + b",".join(rows) + b"]").decode("ascii")

    def append_row(self, t: int, run: SampleRun, i: int):
        j = self._room(int(t), 1)
        self.seq[j] = run.seq[i]
        self.text[j] = run.ts_text[i]
        self.tlen[j] = run.ts_len[i]

    def extend(self, records):
        for t, seq, ts in records:
            self.append(t, seq, ts)

    def append_run(self, t: int, run: SampleRun):
        self.append_arrays(t, run.seq, run.ts_text, run.ts_len)

    def append_arrays(self, t: int, seq, text, tlen):
        """Positions t … t+k-1: sequence numbers, time-stamp texts and their lengths."""
        k = seq.shape[0]
        i = self._room(int(t), k)
        self.seq[i:i + k] = seq
        self.text[i:i + k] = text
        self.tlen[i:i + k] = tlen

    def _drop_before(self, t: int):
        k = min(self.n, max(0, t - self.t0))
        self.head += k
        self.t0 += k
        self.n -= k

    def pop(self, t: int):
        """(seq, ts) of position t, dropping it and anything before; (-1, 0.0) if absent.
        ``ts`` is a :class:`~streamfhmm.io.wire.TsText`: the encoder repeats its text."""
        self._drop_before(t)
        if self.n == 0 or self.t0 != t:
            return -1, 0.0
        h = self.head
        out = int(self.seq[h]), TsText.from_row(self.text[h], self.tlen[h])
        self._drop_before(t + 1)
        return out

    def holds(self, t: int, k: int) -> bool:
        """Whether positions t .. t+k-1 are all pending."""
        return self.n > 0 and self.t0 <= t and t + k <= self.t0 + self.n

    def take(self, t: int, k: int):
        """(seq, ts_text, ts_len) of positions t .. t+k-1, dropping them and anything
        before; positions not pending get seq -1 and ts 0. The arrays may be views,
        valid until the next append."""
        self._drop_before(t)
        h = self.head
        if self.n >= k and self.t0 == t:
            self.head += k
            self.t0 += k
            self.n -= k
            return self.seq[h:h + k], self.text[h:h + k], self.tlen[h:h + k]
        seq = np.full(k, -1, np.int64)
        text = np.zeros((k, TS_TEXT_BYTES), np.uint8)
        tlen = np.ones(k, np.int64)
        text[:, 0] = ord("0")
        if self.n and self.t0 == t:
            m = min(k, self.n)
            seq[:m] = self.seq[h:h + m]
            text[:m] = self.text[h:h + m]
            tlen[:m] = self.tlen[h:h + m]
        self._drop_before(t + k)
        return seq, text, tlen


class _Stream:
    __slots__ = ("topic", "name", "engine", "pending", "t_next", "last_seq", "last_out",
                 "since_checkpoint", "generation", "resumed_seq", "samples", "posteriors",
                 "lost_on_resume", "ended", "lane", "last_in", "retire_failed", "returned",
                 "record_ended", "held", "end_key")

    def __init__(self, topic: bytes, engine):
        self.topic = topic
        self.name = topic_name(topic)
        self.engine = engine
        self.pending = _Pending()   # (t, seq, ts) of samples pushed, posterior not yet published
        self.t_next = 0             # stream position of the next sample
        self.last_seq = -1          # last sequence number pushed
        self.last_out = time.monotonic()
        self.since_checkpoint = 0
        self.generation = 0
        self.resumed_seq = None     # the checkpoint's last seq, until the first sample after resume
        self.samples = 0
        self.posteriors = 0
        self.lost_on_resume = 0
        self.ended = False
        self.lane = None            # the serving lane's output arrays, made at its first use
        self.last_in = time.monotonic()   # when its last sample was taken (or it was made)
        self.retire_failed = -math.inf    # when retiring it last failed (its checkpoint)
        self.returned = False       # resumed when its topic came back (not at the start)
        self.record_ended = False   # its record on disk says "ended"
        self.held = False           # its learner held (ended, or idle: learn_idle) till a sample
        self.end_key = None         # _engine_key before its end checkpoint (None: none written)


#: seconds without a sample after which a stream's learner is held (StreamService, serve)
DEFAULT_LEARN_IDLE = 60.0


def _pause_learner(engine, paused: bool):
    """Hold (or let go on) the learner of ``engine`` if it has one to hold
    (:meth:`StreamEngine._pause_learner`): the learners of ended streams, which stay in
    the table until a new topic needs their place, and of idle ones took the CPU of the
    live ones (and of the host), stepping on reservoirs that no longer change."""
    pause = getattr(engine, "_pause_learner", None)
    if pause is not None:
        try:
            pause(paused)
        except Exception as exc:  # noqa: BLE001 - a host engine's must not stop the service
            logger.warning("holding or releasing the learner of an engine failed: %s", exc)


#: the engine metrics that change with everything an engine's checkpoint holds but the
#: segments pending for its learner (a checkpoint writes them, and draining them into the
#: reservoir later gives what the resumed engine's drain gives); see _engine_key
_KEY_METRICS = ("samples", "emitted", "rejected", "learner_steps", "discarded_steps",
                "dropped_segments", "snapshot_version", "learning", "learner_duty")


def _engine_key(engine):
    """What changes when ``engine``'s checkpoint would (see ``_KEY_METRICS``), or None
    when it cannot say (an engine whose ``metrics()`` lacks one of them, or fails)."""
    try:
        m = engine.metrics()
        return tuple(m[k] for k in _KEY_METRICS)
    except Exception:  # noqa: BLE001 - a host engine's: then checkpoint as always
        return None


def _learning(engine) -> bool:
    """Whether ``engine`` has a learner that learns (False if it cannot say)."""
    try:
        return bool(getattr(engine, "learning", False))
    except Exception:  # noqa: BLE001 - a host engine's must not stop the service
        return False


def _engine_steps(engine) -> int:
    """The learner steps ``engine`` has taken (0 if it cannot say)."""
    try:
        n = getattr(engine, "learner_steps", None)   # cheap where the engine has it
        return int(n if n is not None else engine.metrics().get("learner_steps", 0))
    except Exception:  # noqa: BLE001 - a status line must never break the service
        return 0


class _ThreadFilter(logging.Filter):
    """Drops the records one thread logs."""

    def __init__(self, ident: int):
        super().__init__()
        self.ident = ident

    def filter(self, record):
        return record.thread != self.ident


def warm_lane(engine_factory, X, format: str = "binary", timeout: float = 120.0) -> int:
    """Compile (or load from the kernel cache) what a one-stream service runs, the
    serving lane included, before a real service subscribes: ``X`` (n, D) goes through
    a throwaway :class:`StreamService` over inproc sockets.

    A first run after installing otherwise compiles the lane kernel (about 13 s) at
    its first read, with the publisher streaming ahead. Returns the samples the lane
    handled (0 where it does not apply, e.g. exact posteriors).
    """
    X = np.ascontiguousarray(X, dtype="<f8")
    ctx = zmq.Context()
    name = f"inproc://streamfhmm-warm-{os.getpid()}-{id(X)}"
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(name + "-in")
    source = ZmqSource(name + "-in", X.shape[1], hwm=0, context=ctx)
    sink = ZmqSink(name + "-out", format=format, hwm=0, context=ctx)
    # silent: its stream and its final status line are not the user's (serve -v logged
    # "new stream 'warm'" and "36 samples" before its own banner); only this thread's
    # records are dropped, any other service in the process still logs
    svc = StreamService(source, sink, engine_factory, heartbeat_interval=0, batch_size=64, batch_wait=0)
    quiet = _ThreadFilter(threading.get_ident())
    logger.addFilter(quiet)
    deadline = time.monotonic() + timeout
    try:
        while not source.socket.poll(1):        # the subscription reaches the PUB: a probe
            if time.monotonic() > deadline:
                return 0
            pub.send_multipart(encode_heartbeat(b"warm-probe", 0, 0.0))
        while source.socket.poll(0):
            svc.read()
        # the first sample opens the stream on the general path, the rest goes through
        # the lane (a cold engine's warm-up samples through the general path as well)
        read = 0
        for lo, hi in ((0, 1), (1, X.shape[0])):
            for i in range(lo, hi):
                pub.send_multipart(encode_sample(b"warm", i, float(i), X[i]))
            while read < hi and time.monotonic() < deadline:
                if source.socket.poll(10):
                    read += svc.read()
    finally:
        try:
            svc.shutdown()
        finally:
            logger.removeFilter(quiet)
            source.close(0)
            sink.close(0)
            pub.close(0)
            ctx.term()
    return svc.lane_samples


def _check_count(name: str, value, low: int, unit: str):
    """A ValueError unless ``value`` is a whole number >= ``low`` (a bool is no count)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
    if not (ok and math.isfinite(value) and value == int(value) and value >= low):
        raise ValueError(f"{name} must be >= {low} {unit} (a whole number), got {value!r}")


def _check_seconds(name: str, value):
    """A ValueError unless ``value`` is a number of seconds >= 0 (inf allowed: never)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")


def make_checkpoint_dir(path) -> str | None:
    """Make ``path`` a checkpoint directory (created if missing); None, or why it cannot
    be one (a file of that name, no permission)."""
    try:
        if os.path.exists(path) and not os.path.isdir(path):
            return "it is a file, not a directory"
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _warming_up(engine) -> bool:
    """Whether ``engine`` is still buffering its warm-up (an engine of the host's own
    without the ``warming_up`` attribute never is)."""
    return bool(getattr(engine, "warming_up", False))


def _stream_stem(topic: bytes) -> str:
    h = topic.hex()
    if len(h) > 200:
        h = "h" + hashlib.sha1(topic).hexdigest()
    return f"stream-{h}"


def _engine_file(stem: str, generation: int) -> str:
    """The name of a stream's engine checkpoint of ``generation`` (``stem``: the stream's
    :func:`_stream_stem`, or a path ending in it)."""
    return f"{stem}.{generation}.npz"


def _atomic_write_text(path: str, text: str):
    write_atomically(path, lambda fh: fh.write(text), mode="w")


def _record_int(v, key: str, low: int) -> int:
    """``v`` (the record's ``key``), an integer in [low, 2**63), else ValueError."""
    if type(v) is not int or not low <= v < SEQ_LIMIT:
        raise ValueError(f"{key} must be an integer in [{low}, 2**63), got {v!r}")
    return v


def read_stream_record(path: str) -> dict:
    """Read and validate one stream record of a checkpoint directory.

    Returns
    -------
    dict
        ``topic`` (bytes), ``seq``, ``t_next``, ``pending`` (list of (t, seq, ts)),
        ``pending_text`` (the JSON number text of each pending ``ts``, bytes),
        ``generation``, ``file`` (the engine checkpoint's full path), ``time``,
        ``ended`` (True when the stream had ended, or was retired to make room for
        another: such a record is resumed when its topic comes back, not when the
        service starts), ``run`` (the id of the service run that wrote it, or "").

    Raises
    ------
    CheckpointError
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read()   # (a long warm-up's pending samples make it tens of MB)
        rec = json.loads(raw)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path} is not a streamfhmm stream checkpoint record: {exc}") from None
    if not isinstance(rec, dict) or rec.get("format") != _RECORD_TAG:
        raise CheckpointError(f"{path} is not a streamfhmm stream checkpoint record (no "
                              f"'{_RECORD_TAG}' tag)")
    if rec.get("version") not in (1, _RECORD_VERSION) or type(rec.get("version")) is not int:
        raise CheckpointError(f"{path} has record version {rec.get('version')!r}; this streamfhmm "
                              f"reads versions 1 to {_RECORD_VERSION}")
    try:
        topic = bytes.fromhex(rec["topic"])
        seq, t_next, gen = (_record_int(rec["seq"], "seq", -1), _record_int(rec["t_next"], "t_next", 0),
                            _record_int(rec["generation"], "generation", 0))
        pending = [(_record_int(t, "t", 0), _record_int(s, "seq", 0), float(ts))
                   for t, s, ts in rec["pending"]]
        texts = [p[2] for p in json.loads(raw, parse_float=str, parse_int=str)["pending"]] if pending else []
        fname = str(rec["file"])
        when = float(rec["time"])
        if not math.isfinite(when):
            raise ValueError(f"time must be a finite number, got {rec['time']!r}")
        ended = rec.get("ended", False)   # (absent from version 1 records)
        if type(ended) is not bool:
            raise TypeError(f"'ended' must be true or false, got {ended!r}")
        run = rec.get("run", "")
        if type(run) is not str:
            raise TypeError(f"'run' must be a string, got {run!r}")
        check_topic(topic)  # the service publishes under it
    except (KeyError, TypeError, ValueError, OverflowError) as exc:  # WireError is a ValueError
        raise CheckpointError(f"{path} is a damaged stream checkpoint record: {exc!r}") from None
    if any(b[0] != a[0] + 1 for a, b in zip(pending, pending[1:])) or (
            pending and pending[-1][0] >= t_next) or not all(math.isfinite(p[2]) for p in pending):
        raise CheckpointError(f"{path} is a damaged stream checkpoint record: its pending samples "
                              "must have consecutive positions before t_next and finite time stamps")
    if os.path.basename(fname) != fname:
        raise CheckpointError(f"{path} names an engine file outside its directory: {fname!r}")
    # the names the service writes: a record copied or renamed to another stream's name
    # would resume that stream from this one's state (and two records one engine file)
    stem = _stream_stem(topic)
    if os.path.basename(path) != stem + ".json" or fname != _engine_file(stem, gen):
        raise CheckpointError(f"{path} is a damaged stream checkpoint record: a record of topic "
                              f"{topic!r}, generation {gen} is named {stem}.json and names the "
                              f"engine file {_engine_file(stem, gen)}, not {os.path.basename(path)} "
                              f"and {fname}")
    full = os.path.join(os.path.dirname(path), fname)
    if not os.path.isfile(full):
        raise CheckpointError(f"{path} names the engine checkpoint {fname}, which is missing")
    texts = [txt.encode() if type(txt) is str and len(txt) <= TS_TEXT_BYTES and _JSON_NUMBER(txt.encode())
             else ts_text(p[2]) for p, txt in zip(pending, texts)]
    return {"topic": topic, "seq": seq, "t_next": t_next, "pending": pending, "pending_text": texts,
            "generation": gen, "file": full, "time": when, "ended": ended, "run": run}


class StreamService:
    """Serve posteriors for every stream topic arriving on a ZeroMQ source.

    Parameters
    ----------
    source : ZmqSource
        Created with ``subscribe=False`` if ``wait_subscribers`` is used (the service
        subscribes once its consumers are there).
    sink : ZmqSink
    engine_factory : callable
        ``engine_factory(topic: bytes) -> engine`` for a new stream. An engine has
        ``push(x) -> list[Posterior]``, ``flush() -> list[Posterior]``, ``close()``,
        ``checkpoint(path)`` and ``metrics() -> dict``; it may have ``warming_up``
        (bool; False if it has not), as :class:`StreamEngine` has.
    resume_engine : callable, optional
        ``resume_engine(path) -> engine`` (e.g. ``StreamEngine.resume``); needed with
        ``checkpoint_dir``.
    checkpoint_dir : str, optional
        Directory of stream checkpoints (created if missing, and made again if it is
        deleted while the service runs). At the start the streams found there that had
        not ended are resumed, at most ``max_streams`` of them, the last checkpointed
        first; the others, and the streams that had ended or were retired, resume when
        their topic comes back. A checkpoint that cannot be resumed then (damaged,
        missing) is set aside (``.unusable`` appended to its files' names) and the topic
        starts anew (``resume_failures``); one of an engine of another width is refused
        (``engine_rejected``) and kept.
    checkpoint_every : int, optional
        Checkpoint a stream after this many of its samples (None: only when it ends, is
        retired, and at shutdown, as always): at the end of the read batch
        (``batch_size``) in which they are reached, after its posteriors are published.
    heartbeat_interval : float
        Seconds of idleness after which a stream (and the service) sends a heartbeat;
        0 disables heartbeats.
    status_interval : float
        Seconds between status lines (0: none).
    status : callable, optional
        ``status(line: str)`` receives the status lines (default: the logger at INFO).
    max_streams : int
        Most streams held at once. A new topic that finds the table full takes the place
        of a stream the service retires: an ended one (its publisher sent the end
        heartbeat), the longest without a sample first, else, with ``retire_idle``, one
        without a sample for at least ``retire_idle`` seconds (its smoothing lag is
        published first, as at an end). A retired stream is checkpointed (with a
        checkpoint directory; an ended one whose engine has not changed since its end
        checkpoint keeps that one, as at the shutdown) and its engine closed; when its topic comes back it
        resumes from that checkpoint (without a directory: a new engine from
        ``engine_factory``). If that checkpoint fails the stream stays (not tried again
        for 10 s) and the new topic's samples are skipped; so are they when no stream can
        be retired (counted in ``streams_full``). Counted in ``retired``. The source
        follows a retired (or, after a restart, an ended) topic's numbers until a new
        topic needs the place (:meth:`ZmqSource.release`): a late repeat is then stale.
        Once it gave them up, the topic starts afresh there: a repeat of an old number
        is taken for a publisher restart and its posterior published again (delivery is
        at-least-once), and samples lost meanwhile count in ``lost_on_resume`` only, not
        in the gaps.
    retire_idle : float, optional
        Seconds without a sample after which a stream that never ended may be retired
        to make room (None: only ended streams are). A stream is never retired while
        the table has room.
    learn_idle : float, optional
        Seconds without a sample after which a stream's background learner is held
        (default 60; None: never), as an ended stream's is at once, until its next
        sample: with nothing new in its reservoir, its steps would only take the CPU
        (``learner_duty`` of a core each) from the streams still running and from the
        host. Holding changes neither the engine's ``learning`` nor its checkpoints.
        Counted in ``learners_held``.
    checkpoint_retain : float, optional
        Seconds the checkpoint of a stream that ended or was retired, and that the
        service does not hold, is kept after it was written (None: for ever). Then it is
        removed (its record, then its engine file; counted in ``checkpoints_removed``)
        and the topic, if it comes back, starts a new stream. Without it a service whose
        topics come and go grows its checkpoint directory by one engine file per topic
        ever seen (2.9 MB for the power model of bench/soak.py, learning) and reads
        every record at each start. Checkpoints of streams that had neither ended nor
        been retired (a stop, a crash: they resume at the next start) are never
        removed, nor those of ended streams that went on (their record is written again
        as not ended at their next sample). A retired stream still warming up (its
        buffered samples kept in its checkpoint, without posteriors) loses them with it.
        Files set aside (``.unusable``) longer ago than this are removed at the start.
        The ages are read from the records (the wall clock) at the start, then kept on
        the monotonic clock. Needs ``checkpoint_dir``.
    wait_subscribers : int
        Subscribe to the input only once this many consumers subscribed to the output.
    batch_size : int
        Messages read per wake-up before heartbeats and status are looked at.
    batch_threshold : int
        Runs of at least this many consecutive samples of one topic go through the
        engine's ``push_many`` (when it has one); shorter ones through ``push``.
    log_interval : float
        Seconds between two log lines about the same kind of problem.
    batch_wait : float
        Seconds of adaptive batching: when the last read found more than one message
        waiting (they arrive faster than they are handled one by one), the next read waits
        until ``batch_wait`` after it, so that messages are handled in batches, each
        waiting at most ``batch_wait``, and the per-wake-up cost (system calls, a compiled
        call each way, the stream bookkeeping) is divided among them. A message that finds
        the service idle is handled at once. 0 reads on every wake-up.
    lane : bool
        Serve a single stream (or the one live stream among ended ones) through the
        compiled serving lane
        (:mod:`streamfhmm.io.lane`) when the wire path allows it (compiled receive and
        send, an engine with the block path): one compiled call per read for receive,
        recognition and publication. False: always the general path
        (same messages, more interpreter work per read).
    drain_timeout : float
        Seconds that shutdown spends at most reading the input still queued (a publisher
        that keeps sending would otherwise keep the service from stopping); then the
        engines are flushed and checkpointed whatever is left unread, which a resumed
        service counts as lost (``lost_on_resume``).
    """

    def __init__(self, source: ZmqSource, sink: ZmqSink, engine_factory, *, resume_engine=None,
                 checkpoint_dir: str | None = None, checkpoint_every: int | None = None,
                 heartbeat_interval: float = 1.0, status_interval: float = 0.0, status=None,
                 max_streams: int = 1024, wait_subscribers: int = 0, batch_size: int = 256,
                 batch_threshold: int = 4, log_interval: float = 10.0, batch_wait: float = 250e-6,
                 lane: bool = True, drain_timeout: float = 5.0, retire_idle: float | None = None,
                 checkpoint_retain: float | None = None,
                 learn_idle: float | None = DEFAULT_LEARN_IDLE):
        if checkpoint_every is not None:
            _check_count("checkpoint_every", checkpoint_every, 1, "samples")
        if checkpoint_every is not None and checkpoint_dir is None:
            raise ValueError("checkpoint_every needs a checkpoint directory")
        if checkpoint_dir is not None and resume_engine is None:
            raise ValueError("a checkpoint directory needs resume_engine (the streams it keeps "
                             "are resumed from it), e.g. StreamEngine.resume")
        _check_count("max_streams", max_streams, 1, "streams")
        _check_count("batch_size", batch_size, 1, "messages per read")   # 0 never read: a busy loop
        _check_count("wait_subscribers", wait_subscribers, 0, "subscriptions")
        for name, value in (("heartbeat_interval", heartbeat_interval), ("status_interval", status_interval),
                            ("log_interval", log_interval), ("drain_timeout", drain_timeout)):
            _check_seconds(name, value)
        if retire_idle is not None:
            _check_seconds("retire_idle", retire_idle)
        if learn_idle is not None:
            _check_seconds("learn_idle", learn_idle)
            if not learn_idle > 0:
                raise ValueError(f"learn_idle must be a number of seconds > 0 (None: never hold "
                                 f"a learner for idleness), got {learn_idle!r}")
        if checkpoint_retain is not None:
            _check_seconds("checkpoint_retain", checkpoint_retain)
            if checkpoint_dir is None:
                raise ValueError("checkpoint_retain needs a checkpoint directory (it removes "
                                 "the checkpoints of streams that ended or were retired)")
        self.source = source
        self.sink = sink
        self.engine_factory = engine_factory
        self.resume_engine = resume_engine
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.checkpoint_every = None if checkpoint_every is None else int(checkpoint_every)
        self.heartbeat_interval = float(heartbeat_interval)
        self.status_interval = float(status_interval)
        self._status = status or (lambda line: logger.info("%s", line))
        self.max_streams = int(max_streams)
        self.wait_subscribers = int(wait_subscribers)
        self.batch_size = int(batch_size)
        self.batch_threshold = max(2, int(batch_threshold))
        if not 0 <= float(batch_wait) <= 1:
            raise ValueError(f"batch_wait must be in [0, 1] seconds, got {batch_wait}")
        self.batch_wait = float(batch_wait)
        self.drain_timeout = float(drain_timeout)
        self.retire_idle = None if retire_idle is None else float(retire_idle)
        self.learn_idle = None if learn_idle is None else float(learn_idle)
        # (inf removes nothing: as None, without a note per retired topic kept for ever)
        self.checkpoint_retain = (None if checkpoint_retain is None or math.isinf(checkpoint_retain)
                                  else float(checkpoint_retain))
        #: the checkpoints ``checkpoint_retain`` removes in time: by file stem, (the wall
        #: time it was written, its topic or None, its engine files), oldest first
        self._retained: dict[str, tuple] = {}
        self._block = None  # whether the engines have push_many (known at the first stream)
        self._lane = bool(lane) and source.fast and sink.fast
        self._lane_status = np.zeros(len(LANE_STATUS), np.int64)
        self.lane_samples = 0   # samples the serving lane handled
        self._log = RateLimitedLog(logger, log_interval)
        self._stop = threading.Event()
        self.streams: dict[bytes, _Stream] = {}
        self._refused: dict[bytes, float] = {}   # topics refused for their width, and when
        # the source's sequence bookkeeping by topic (a host's own source may have none)
        self._source_streams = source.streams if hasattr(source, "set_last_seq") else _ALL
        self.counters = {"samples": 0, "posteriors": 0, "engine_rejected": 0, "streams_full": 0,
                         "heartbeats_in": 0, "heartbeats_out": 0, "checkpoints": 0,
                         "checkpoint_failures": 0, "lost_on_resume": 0, "ends": 0, "unmatched": 0,
                         "retired": 0, "resume_failures": 0, "checkpoints_removed": 0}
        #: streams whose checkpoint at shutdown failed (a restart resumes them from an
        #: older one): ``streamfhmm serve`` then exits 1
        self.final_checkpoint_failures: list[str] = []
        self.started = time.monotonic()
        self._run_id = os.urandom(8).hex()   # (names this run in the records it writes)
        self._last_status = (self.started, 0, 0)   # time, samples, learner steps of this run
        # learner steps the engines held when this service resumed them (not counted in
        # this run's rate), and those of the engines it retired (at their retirement)
        self._steps_inherited = 0
        self._steps_retired = 0
        self._last_any_out = self.started
        self._closed = False
        if self.checkpoint_dir is not None:
            problem = make_checkpoint_dir(self.checkpoint_dir)
            if problem:
                raise CheckpointError(f"cannot use {self.checkpoint_dir} as the checkpoint "
                                      f"directory: {problem}")
            self._resume_all()

    # -- control ---------------------------------------------------------------------
    def request_stop(self):
        """Ask :meth:`run` to drain, checkpoint and return (safe from a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- resume / checkpoint -----------------------------------------------------------
    def _resume_all(self):
        listing = os.listdir(self.checkpoint_dir)
        names = sorted(n for n in listing if _RECORD_RE.match(n))
        if names and self.resume_engine is None:
            raise ValueError(f"{self.checkpoint_dir} holds stream checkpoints but no resume_engine "
                             "was given")

        kept = set()   # the engine files of the records left for their topics' return
        retained = []  # (time, stem, topic, engine files) of those that had ended
        try:
            live = []
            for name in names:
                path = os.path.join(self.checkpoint_dir, name)
                stem = name[:-len(".json")]
                try:
                    rec = read_stream_record(path)
                except CheckpointError:
                    if _record_says_ended(path):
                        # left for its topic's return, which sets it aside; its engine
                        # files are not leftovers
                        files = [f for f in listing if f.startswith(stem + ".")
                                 and _ENGINE_FILE_RE.match(f)]
                        kept.update(files)
                        retained.append((_mtime(path), stem, None, files))
                        continue
                    raise
                if rec["ended"]:
                    self._left_for_return(rec, kept)
                    retained.append((rec["time"], stem, rec["topic"], [os.path.basename(rec["file"])]))
                else:
                    live.append(rec)
            # at most max_streams, the most recently checkpointed first: the others (a
            # restart with a smaller --max-streams) resume when their topics come back
            live.sort(key=lambda rec: rec["time"], reverse=True)
            for rec in live[:self.max_streams]:
                self._resume_one(rec)
            for rec in live[self.max_streams:]:
                self._left_for_return(rec, kept)
            if len(live) > self.max_streams:
                logger.warning("%d stream checkpoints in %s beyond max_streams (%d): those streams "
                               "resume when their topics come back", len(live) - self.max_streams,
                               self.checkpoint_dir, self.max_streams)
        except BaseException:
            for st in self.streams.values():
                st.engine.close()
            self.streams.clear()
            raise
        self._remove_leftovers(listing, kept)
        if self.checkpoint_retain is not None:
            for when, stem, topic, files in sorted(retained, key=lambda r: r[0]):
                self._retain(stem, topic, files, when)
            self._remove_set_aside(listing)
            n = self._forget_expired()
            if n:
                logger.info("removed the checkpoints of %d stream(s) that ended or were retired "
                            "more than %g s ago (checkpoint_retain)", n, self.checkpoint_retain)

    def _left_for_return(self, rec: dict, kept: set):
        """A record not resumed at the start: its engine file is kept, and the source
        follows its topic's numbers from the record's (released: given up, if need be,
        for a new topic), so that a late repeat is stale when the topic comes back."""
        kept.add(os.path.basename(rec["file"]))
        if self._source_streams is not _ALL:   # (a source with sequence bookkeeping)
            self.source.set_last_seq(rec["topic"], rec["seq"])
            self._release(rec["topic"])

    def _remove_leftovers(self, listing, kept=()):
        """Remove what a crash in the middle of a checkpoint leaves in the directory: engine
        files no record names (a new generation whose record was not yet written, an old
        one not yet removed, a first one without a record) and temporary files of atomic
        writes older than an hour. Only files of the service's own name patterns, among
        ``listing`` (the directory's names); ``kept`` names the engine files of the
        records not resumed at the start (ended or retired streams', those past
        ``max_streams``)."""
        named = {_engine_file(_stream_stem(st.topic), st.generation) for st in self.streams.values()}
        named.update(kept)
        now = time.time()
        for name in listing:
            path = os.path.join(self.checkpoint_dir, name)
            try:
                if _ENGINE_FILE_RE.match(name) and name not in named or (
                        _TMP_FILE_RE.match(name) and now - os.path.getmtime(path) > _TMP_MAX_AGE):
                    os.remove(path)
                    logger.info("removed %s, a leftover of an interrupted checkpoint", path)
            except OSError as exc:   # (gone already, or not ours to remove)
                logger.warning("could not remove the leftover %s: %s", path, exc)

    # -- checkpoint_retain ---------------------------------------------------------------
    def _retain(self, stem: str, topic: bytes | None, files, when: float | None = None):
        """Note the checkpoint of a stream the service does not hold (ended or retired),
        written at wall time ``when`` (a record's; None: now), for removal
        ``checkpoint_retain`` seconds after. Kept on the monotonic clock (a step of the
        wall clock moves no removal made during the run), never later than now, so that
        the notes stay oldest first."""
        if self.checkpoint_retain is None:
            return
        now = time.monotonic()
        noted = now if when is None else now - max(0.0, time.time() - when)
        self._retained.pop(stem, None)
        self._retained[stem] = (noted, topic, list(files))

    def _forget_expired(self):
        """Remove the noted checkpoints written more than ``checkpoint_retain`` seconds
        ago: the record first (a crash then leaves an engine file no record names, which
        the next start removes), then its engine files. Returns how many."""
        if not self._retained:
            return 0
        removed = 0
        limit = time.monotonic() - self.checkpoint_retain
        while self._retained:
            stem, (when, topic, files) = next(iter(self._retained.items()))
            if when > limit:
                break
            del self._retained[stem]
            if topic is not None and topic in self.streams:   # (served again: not ours)
                continue
            try:
                os.remove(os.path.join(self.checkpoint_dir, stem + ".json"))
            except FileNotFoundError:
                pass
            except OSError as exc:   # (tried again at the next start)
                self._log("retain", "could not remove the checkpoint record %s.json: %s", stem, exc)
                continue
            for name in files:
                try:
                    os.remove(os.path.join(self.checkpoint_dir, name))
                except FileNotFoundError:
                    pass
                except OSError as exc:   # (a leftover without its record: the next start removes it)
                    self._log("retain", "could not remove the engine checkpoint %s: %s", name, exc)
            if topic is not None:
                self._refused.pop(topic, None)
            self.counters["checkpoints_removed"] += 1
            removed += 1
            logger.debug("removed the checkpoint of stream %r, written %.0f s ago "
                         "(checkpoint_retain %g s)", stem if topic is None else topic_name(topic),
                         time.monotonic() - when, self.checkpoint_retain)
        return removed

    def _remove_set_aside(self, listing):
        """At the start: remove the files set aside (``.unusable``) longer ago than
        ``checkpoint_retain`` seconds."""
        limit = time.time() - self.checkpoint_retain
        for name in listing:
            if _UNUSABLE_RE.match(name):
                path = os.path.join(self.checkpoint_dir, name)
                if _mtime(path) <= limit:
                    try:
                        os.remove(path)
                    except OSError as exc:
                        logger.warning("could not remove %s, set aside earlier: %s", path, exc)

    def _resume_one(self, rec: dict, returning: bool = False, engine=None) -> _Stream:
        """Resume the stream of record ``rec`` (:func:`read_stream_record`): at the start,
        or (``returning``) when its topic comes back (an ended or retired stream, one past
        ``max_streams`` at the start), from ``engine`` if :meth:`_load` gave it already."""
        if engine is None:
            engine = self._load(rec)
        st = _Stream(rec["topic"], engine)
        st.t_next = rec["t_next"]
        st.last_seq = rec["seq"]
        for (t, seq, _), text in zip(rec["pending"], rec["pending_text"]):
            st.pending.append_text(t, seq, text)   # (the text the samples arrived with)
        st.generation = rec["generation"]
        st.resumed_seq = rec["seq"]
        st.returned = returning
        # an ended or retired stream's lag was published (unless a warm-up was kept):
        # nothing to end again
        st.ended = rec["ended"] and not _warming_up(engine)
        st.record_ended = rec["ended"]
        if st.ended:
            self._hold(st)
        # (retired by this run: its steps were counted among the retired ones until now)
        self._add_stream(st, retired_here=returning and rec["run"] == self._run_id)
        if not returning:
            self.source.set_last_seq(st.topic, rec["seq"])
        age = time.time() - rec["time"]
        (logger.info if returning else logger.warning)(
            "stream %r resumed from checkpoint %s: last sequence number %d, stream position "
            "%d, written %.1f s ago", st.name, os.path.basename(rec["file"]), rec["seq"],
            rec["t_next"], age)
        return st

    def _load(self, rec: dict):
        """The engine of record ``rec``, checked against it and against this service
        (CheckpointError; :class:`_WidthError` for an engine of another width)."""
        try:
            engine = self.resume_engine(rec["file"])
        except Exception as exc:   # (whatever a damaged file makes a resume raise)
            raise CheckpointError(f"cannot resume stream {rec['topic']!r} from "
                                  f"{rec['file']}: {exc}") from None
        n_eng = getattr(engine, "n_samples", rec["t_next"])
        if n_eng != rec["t_next"]:
            engine.close()
            raise CheckpointError(f"{rec['file']} holds {n_eng} samples but its record says "
                                  f"{rec['t_next']}: not a consistent checkpoint")
        d_eng = getattr(engine, "n_features", None)
        if d_eng is not None and d_eng != self.source.n_features:
            # (it would refuse every sample of the stream, for ever)
            engine.close()
            raise _WidthError(f"{rec['file']} is an engine of {d_eng} features per sample, "
                              f"this service reads {self.source.n_features}: resume with the "
                              "model it was written with, or use another checkpoint directory")
        return engine

    def checkpoint(self, stream: _Stream | None = None):
        """Checkpoint one stream (or every stream) now."""
        if self.checkpoint_dir is None:
            raise ValueError("this service has no checkpoint directory")
        for st in ([stream] if stream is not None else list(self.streams.values())):
            self._checkpoint(st)

    def _checkpoint(self, st: _Stream, final: bool = False, ended: bool | None = None,
                    engine_file: bool | None = True) -> bool:
        """Checkpoint one stream (engine file, then its record); whether it was written.
        Without ``engine_file`` only the record is written again, naming the engine file
        there (an ended stream unchanged since its end checkpoint: :meth:`_end_stands`),
        dated now as a full checkpoint would be (``checkpoint_retain`` counts from it at
        a start); not counted in ``checkpoints``. ``None``: without it when the end
        checkpoint stands.

        A failure is counted and logged (rate-limited); one at shutdown (``final``) is
        always logged and its stream named in :attr:`final_checkpoint_failures`. The
        record of an ended stream says so (``"ended"``; ``ended`` overrides ``st.ended``):
        it resumes when its topic comes back, not at the next start."""
        stem = os.path.join(self.checkpoint_dir, _stream_stem(st.topic))
        if engine_file is None:
            engine_file = not self._end_stands(st)
        gen = st.generation + 1 if engine_file else st.generation
        path = _engine_file(stem, gen)
        try:
            if not os.path.isdir(self.checkpoint_dir):   # deleted while the service runs
                os.makedirs(self.checkpoint_dir, exist_ok=True)
                logger.warning("the checkpoint directory %s was missing: made it again",
                               self.checkpoint_dir)
            if engine_file:
                st.engine.checkpoint(path)
            rec = {"format": _RECORD_TAG, "version": _RECORD_VERSION, "topic": st.topic.hex(),
                   "seq": st.last_seq, "t_next": st.t_next, "generation": gen,
                   "file": os.path.basename(path), "time": time.time(),
                   "ended": st.ended if ended is None else ended,
                   "run": self._run_id}
            # the time stamps as the number texts they arrived as (json.dumps would write
            # repr of their floats): a resumed stream publishes them as it received them
            text = json.dumps(rec)[:-1] + ', "pending": ' + st.pending.json_text() + "}"
            _atomic_write_text(f"{stem}.json", text)
        except (OSError, ValueError) as exc:
            self.counters["checkpoint_failures"] += 1
            st.since_checkpoint = 0   # try again after another checkpoint_every samples
            if final:   # (the rate limit dropped it within 10 s of a periodic failure)
                self.final_checkpoint_failures.append(st.name)
                logger.warning("the shutdown checkpoint of stream %r failed: %s; a restart "
                               "resumes it from its last checkpoint written", st.name, exc)
            else:
                self._log("checkpoint", "checkpoint of stream %r failed: %s", st.name, exc)
            return False
        st.since_checkpoint = 0
        st.record_ended = rec["ended"]
        if not engine_file:
            return True
        old = _engine_file(stem, st.generation)
        st.generation = gen
        self.counters["checkpoints"] += 1
        if os.path.exists(old):
            try:
                os.remove(old)
            except OSError:
                pass
        return True

    # -- the loop ----------------------------------------------------------------------
    def run(self, time_budget: float | None = None, max_samples: int | None = None) -> dict:
        """Serve until :meth:`request_stop`, the time budget or ``max_samples``; then shut down.

        Returns
        -------
        dict
            :meth:`metrics` at the end.
        """
        if time_budget is not None:
            _check_seconds("time_budget", time_budget)   # (NaN would serve forever)
        if max_samples is not None:
            _check_count("max_samples", max_samples, 0, "samples")
        deadline = None if time_budget is None else time.monotonic() + time_budget
        if self.wait_subscribers > 0:
            ok = self.sink.wait_for_subscribers(self.wait_subscribers, should_stop=self._stop.is_set,
                                                timeout=None if deadline is None else
                                                max(0.0, deadline - time.monotonic()))
            if ok:
                logger.info("%d subscription(s) to the output", self.sink.n_subscribers())
        self.source.subscribe()
        poller = zmq.Poller()
        src, snk = self.source.socket, self.sink.socket
        poller.register(src, zmq.POLLIN)
        poller.register(snk, zmq.POLLIN)
        tick = 0.1
        if self.heartbeat_interval > 0:
            tick = min(tick, self.heartbeat_interval / 2)
        # (whole milliseconds, at least 1: int() made a heartbeat below 2 ms a poll of 0 ms,
        # an idle loop spinning on a core)
        poll_ms = max(1, math.ceil(tick * 1000))
        last_tick = time.monotonic()
        last_read = 0.0
        last_count = 0   # messages of the last read (> 1: they queue up)
        drain = True
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(poll_ms))
                if snk in events:
                    self.sink.poll_subscriptions()
                if src in events:
                    if self.batch_wait and last_count > 1:
                        wait = last_read + self.batch_wait - time.perf_counter()
                        if wait > 0:
                            time.sleep(wait)
                    last_read = time.perf_counter()
                    last_count = self.read()
                now = time.monotonic()
                if now - last_tick >= tick:
                    last_tick = now
                    self._housekeeping(now)
                    if deadline is not None and now >= deadline:
                        break
                if max_samples is not None and self.counters["samples"] >= max_samples:
                    drain = False   # (the queued input is not read: N was asked for)
                    break
        finally:
            self.shutdown(drain=drain)
        return self.metrics()

    def read(self) -> int:
        """Handle the messages waiting (up to ``batch_size``), without blocking; returns
        how many were read.

        A service with one stream (or one not ended among a few: :meth:`_lane_stream`) on
        the compiled wire path reads through the serving lane; a message the lane does
        not take (another topic, a break in the sequence, a heartbeat, anything for the
        Python decoder) is handled on the general path (``recv_runs`` then
        :meth:`process`), and the lane goes on after it.
        """
        left = self.batch_size
        n = 0
        while left > 0:
            st = self._lane_stream() if self._lane else None
            lane = st is not None
            if lane:
                k, done = self._lane_read(st, left)
                n += k
                left -= k
                if done:
                    break
                if k:
                    continue
            # the general path: a few messages at a time while the lane may take over again
            items = self.source.recv_runs(min(left, _GENERAL_READ) if lane else left, copy=False)
            if not items:
                break
            self.process(items)
            m = sum(len(it) if type(it) is SampleRun else 1 for it in items)
            n += m
            left -= m
            if not lane:
                break
        return n

    def _lane_stream(self) -> _Stream | None:
        """The stream the serving lane may serve: the only one, or the only one not ended
        among at most ``_LANE_SCAN`` (ended streams stay in the table until a new topic
        needs their place, so topics that come and go would otherwise leave the lane
        for good once a second one arrived), if it has not ended, is not waiting for its
        first sample after a resume, and its engine can take the lane (its
        ``_lane_ready``: not warming up, not exact, ...); None otherwise (the read goes
        the general way in full, not ``_GENERAL_READ`` messages at a time)."""
        streams = self.streams
        if not self._block:
            return None
        if len(streams) == 1:
            live = next(iter(streams.values()))
        elif len(streams) > _LANE_SCAN:
            return None
        else:
            live = None
            for st in streams.values():
                if not st.ended:
                    if live is not None:
                        return None
                    live = st
            if live is None:
                return None
        if live.ended or live.resumed_seq is not None:   # (until a sample of it comes)
            return None
        ready = getattr(live.engine, "_lane_ready", None)
        return live if ready is not None and ready() else None

    def _lane_read(self, st: _Stream, max_messages: int):
        """The serving lane on stream ``st``: ``(messages read, done)``; ``done`` when
        the queue was emptied or ``max_messages`` read (nothing for the general path)."""
        engine = st.engine
        # (st is _lane_stream's: not ended, not waiting after a resume, its engine's
        # _lane_ready true; the state is None while no sequence is open)
        state = engine._lane_state()
        if state is None or st.last_seq < 0 or st.last_seq >= SEQ_LIMIT - 1:
            # (the lane takes the next number as an int64: after 2**63 - 1 there is none,
            # and the general path counts what comes as a restart or stale)
            return 0, False
        source, sink = self.source, self.sink
        sst = source.streams.get(st.topic)
        pend = st.pending
        t = state.t
        if sst is None or sst.last_seq != st.last_seq or st.t_next != t or (pend.n and pend.t0 + pend.n != t):
            return 0, False   # (the general path's bookkeeping disagrees: let it handle this)
        K = min(max_messages, _ENGINE_CHUNK)
        lane = st.lane
        if lane is None or lane[0].shape[0] < K:
            M, D = state.W.shape[0] - 1, source.n_features   # (W is (M + 1, D))
            lane = st.lane = (np.empty(K, np.int64), np.empty((K, M)), np.empty((K, M)), np.empty((K, D)),
                              np.empty(K, np.int64), np.empty(K, np.int64), np.frombuffer(st.topic, np.uint8))
        tau, theta, rho, mean, version, flags, topic = lane
        header, payload, json_prefix = sink.send_scratch(st.topic, theta.shape[1], mean.shape[1])
        b = source.buffers(K)
        lib = source._lib
        status = self._lane_status
        k = serve_lane(lib.recv, lib.getsockopt, lib.errno, lib.send, source.socket.underlying,
                       sink.socket.underlying, K, source.n_features, topic, st.last_seq + 1,
                       b["frames"], b["frame_len"], b["seq"], b["ts_text"], b["ts_len"], b["values"],
                       b["value_bytes"], pend.seq, pend.text, pend.tlen, pend.head, pend.t0, pend.n,
                       *state, tau, theta, rho, mean, version, flags, header, payload,
                       sink._status, status, json_prefix)
        why, n_frames, err, ne, sent = status.tolist()
        if k:
            self.lane_samples += k
            last = st.last_seq + k
            source._accept(st.topic, sst, st.last_seq + 1, k)   # (consecutive: no gap, nothing stale)
            engine._lane_commit(b["values"][:k], t, ne)
            pend.append_arrays(t, b["seq"][:k], b["ts_text"][:k], b["ts_len"][:k])
            self._accepted(st, last, k)
            if ne:
                pend._drop_before(int(tau[ne - 1]) + 1)
                sink._count(sent)   # (raises on a send error, like send_block)
                self._published(st, ne)
            self._maybe_checkpoint(st, k)
        if why == STOP_ERROR:
            raise zmq.ZMQError(err)
        if why == STOP_SLOW:
            item = source.feed_scratch(n_frames)
            if item is not None:
                self.process([item])
            return k + 1, False
        return k, True

    def process(self, items):
        """Handle decoded messages (samples, runs of samples and heartbeats) from the
        source, in order.

        Runs (:class:`~streamfhmm.io.wire.SampleRun`) and consecutive samples of one
        topic, ``batch_threshold`` or more, go through the engine's block path
        (``push_many``), others one by one (``push``).
        """
        n = len(items)
        i = 0
        while i < n:
            item = items[i]
            kind = type(item)
            if kind is Heartbeat:
                self._heartbeat_in(item)
                i += 1
                continue
            if kind is SampleRun:
                self._push_samples(item.topic, item)
                i += 1
                continue
            topic = item.topic
            j = i + 1
            while (j < n and type(items[j]) is kind and items[j].topic == topic
                   and items[j].seq == items[j - 1].seq + 1):
                j += 1
            self._push_samples(topic, items[i:j] if j - i > 1 else (item,))
            i = j

    def _push_samples(self, topic: bytes, run):
        """Push a SampleRun, or a sequence of Samples of one topic with consecutive seq."""
        st = self.streams.get(topic)
        if st is None:
            st = self._new_stream(topic, len(run))
            if st is None:
                return
        is_run = type(run) is SampleRun
        seq0 = int(run.seq[0]) if is_run else run[0].seq
        if st.resumed_seq is not None:
            self._report_resume(st, seq0)
        if st.last_seq >= 0 and seq0 != st.last_seq + 1 and not st.ended \
                and not _warming_up(st.engine):
            # a discontinuity ends the sequence: the smoothing lag is emitted (edge-padded)
            # and the engine starts a new sequence with this sample. Not during a warm-up:
            # flushing would start the model from the few samples buffered so far (one lost
            # or refused message cut a week's warm-up short); the buffer joins both sides
            self._flush(st)
        engine = st.engine
        n = len(run)
        if self._block and n >= self.batch_threshold:
            try:
                batch = engine.push_many(run.values if is_run else np.stack([s.values for s in run]))
            except ValueError:
                pass  # one bad sample refuses the whole block: find it one by one
            else:
                if is_run:
                    st.pending.append_run(st.t_next, run)
                    last = int(run.seq[-1])
                else:
                    t = st.t_next
                    for s in run:
                        st.pending.append(t, s.seq, s.ts)
                        t += 1
                    last = run[-1].seq
                self._accepted(st, last, n)
                if len(batch):
                    self._publish_batch(st, batch)
                self._maybe_checkpoint(st, n)
                return
        if is_run:
            self._push_one_by_one(st, run.seq.tolist(), run.values,
                                  lambda i: st.pending.append_row(st.t_next, run, i))
        else:
            self._push_one_by_one(st, [s.seq for s in run], [s.values for s in run],
                                  lambda i: st.pending.append(st.t_next, run[i].seq, run[i].ts))

    def _push_one_by_one(self, st: _Stream, seqs, rows, add_pending):
        """Samples through ``push``, their posteriors published together (before any
        checkpoint, which must not count them as pending). ``add_pending(i)`` records
        sample i at position ``st.t_next``."""
        push = st.engine.push
        posts = []
        for i, x in enumerate(rows):
            try:
                got = push(x)
            except ValueError as exc:
                self.counters["engine_rejected"] += 1
                self._log("engine", "stream %r: the engine refused sample %d: %s", st.name, seqs[i], exc)
                continue
            add_pending(i)
            self._accepted(st, seqs[i], 1)
            posts.extend(got)
            if posts and self.checkpoint_every is not None and st.since_checkpoint + 1 >= self.checkpoint_every:
                self._publish(st, posts)
                posts = []
            self._maybe_checkpoint(st, 1)
        if posts:
            self._publish(st, posts)

    def _accepted(self, st: _Stream, last_seq: int, n: int):
        st.t_next += n
        st.last_seq = last_seq
        st.samples += n
        if st.record_ended:
            self._record_goes_on(st)
        st.ended = False
        st.end_key = None
        if st.held:
            st.held = False
            _pause_learner(st.engine, False)
        st.last_in = time.monotonic()
        self.counters["samples"] += n
        if st.topic not in self._source_streams:
            # the source gave up the topic's bookkeeping within the read that brought it
            # back (a new topic needed the place): it follows the stream's numbers again
            self.source.set_last_seq(st.topic, last_seq)

    def _record_goes_on(self, st: _Stream):
        """The first sample after an end: the stream's record, written as ended, is
        written again as not ended (nothing else changes: it still describes its engine
        file), so that after a crash the stream resumes at the start and no
        ``checkpoint_retain`` removes it. A failure is counted and logged; the next
        checkpoint writes the record anew."""
        st.record_ended = False
        path = os.path.join(self.checkpoint_dir, _stream_stem(st.topic) + ".json")
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
            # (as the text: its pending time stamps stay the number texts they arrived as;
            # _checkpoint writes the flag once, and no other field can hold that text)
            if raw.count(_ENDED_TEXT) != 1:
                raise ValueError("it is not a record this service wrote as ended")
            _atomic_write_text(path, raw.replace(_ENDED_TEXT, _GOES_ON_TEXT).decode())
        except (OSError, ValueError) as exc:
            self.counters["checkpoint_failures"] += 1
            self._log("checkpoint", "the record of stream %r, which goes on after its end, "
                      "could not be written as not ended: %s", st.name, exc)

    def _maybe_checkpoint(self, st: _Stream, n: int):
        if self.checkpoint_every is not None:
            st.since_checkpoint += n
            if st.since_checkpoint >= self.checkpoint_every:
                self._checkpoint(st)

    def _report_resume(self, st: _Stream, seq: int):
        c = st.resumed_seq
        st.resumed_seq = None
        if st.returned:   # (topics that come and go: rate-limited, and silent if none lost)
            if seq > c + 1:
                st.lost_on_resume = seq - c - 1
                self.counters["lost_on_resume"] += seq - c - 1
                self._log("returned", "stream %r came back at sequence number %d; its checkpoint "
                          "ended at %d: %d sample(s) lost meanwhile", st.name, seq, c, seq - c - 1)
            return
        if seq > c:
            lost = seq - c - 1
            st.lost_on_resume = lost
            self.counters["lost_on_resume"] += lost
            logger.warning("stream %r: first sample after the resume has sequence number %d; "
                           "the checkpoint ended at %d: %d sample(s) lost since the checkpoint",
                           st.name, seq, c, lost)
        else:
            logger.warning("stream %r: first sample after the resume has sequence number %d, "
                           "not after the checkpoint's %d: the publisher restarted", st.name, seq, c)

    def _new_stream(self, topic: bytes, n: int = 1):
        """The stream of a topic not in the table (new, or come back), or None (its ``n``
        samples counted and skipped).

        Order: the place first (whether a stream could be retired, nothing done yet),
        then the topic's checkpoint (loaded, so that one this service refuses costs no
        stream its place), then the retirement."""
        full = len(self.streams) >= self.max_streams
        victim = self._room_candidate() if full else None
        if full and victim is None:
            return self._skip(topic, n, "streams_full", "skipped %d sample(s) of a new topic %r: "
                              "already %d streams (max_streams), none ended%s", n, topic_name(topic),
                              len(self.streams), "" if self.retire_idle is None
                              else f" or idle for {self.retire_idle:g} s")
        refused = self._refused.get(topic)
        if refused is not None and time.monotonic() - refused < _REFUSE_FOR:
            return self._skip(topic, n, "engine_rejected", "skipped %d sample(s) of topic %r: its "
                              "checkpoint is of another width (refused %.0f s ago)", n,
                              topic_name(topic), time.monotonic() - refused)
        rec = self._record(topic)
        engine = None
        if rec is not None:
            try:
                engine = self._load(rec)
            except _WidthError as exc:   # (this service's configuration, not the record)
                self._refused.pop(topic, None)
                self._refused[topic] = time.monotonic()
                if len(self._refused) > _REFUSED_KEPT:
                    del self._refused[next(iter(self._refused))]
                return self._skip(topic, n, "engine_rejected", "cannot resume the stream of "
                                  "topic %r: %s", topic_name(topic), exc)
            except CheckpointError as exc:
                self._set_aside(topic, exc)
                rec = None
        if victim is not None and not self._retire(victim):
            if engine is not None:
                engine.close()
            return self._skip(topic, n, "streams_full", "skipped %d sample(s) of a new topic %r: "
                              "retiring stream %r failed", n, topic_name(topic), victim.name)
        if rec is not None:
            return self._resume_one(rec, returning=True, engine=engine)
        try:
            engine = self.engine_factory(topic)
        except (OSError, ValueError) as exc:
            return self._skip(topic, n, "engine_rejected", "cannot start an engine for topic %r: %s",
                              topic_name(topic), exc)
        st = _Stream(topic, engine)
        self._add_stream(st)
        logger.info("new stream %r", st.name)
        return st

    def _skip(self, topic: bytes, n: int, counter: str, *log):
        """Count ``n`` samples of a topic not served in ``counter``, log (rate-limited),
        and release the topic's bookkeeping in the source; None."""
        self.counters[counter] += n
        self._log(counter, *log)
        self._release(topic)
        return None

    def _record(self, topic: bytes) -> dict | None:
        """The checkpoint record of ``topic``'s stream left in the directory (an ended or
        retired stream's, or one past ``max_streams`` at the start), or None. A record
        that cannot be read is set aside (:meth:`_set_aside`): the topic then starts anew."""
        if self.checkpoint_dir is None:
            return None
        path = os.path.join(self.checkpoint_dir, _stream_stem(topic) + ".json")
        if not os.path.exists(path):
            return None
        try:
            return read_stream_record(path)
        except CheckpointError as exc:
            self._set_aside(topic, exc)
            return None

    def _set_aside(self, topic: bytes, exc):
        """Rename the record of ``topic`` that cannot be resumed, and the engine files of
        its name, with the suffix ``.unusable`` (kept for a look: a new stream's
        checkpoints take other names; a later set-aside replaces them; with
        ``checkpoint_retain`` a start removes them once older), so that the topic
        starts anew instead of being refused for ever; counted in ``resume_failures``."""
        self.counters["resume_failures"] += 1
        stem = _stream_stem(topic)
        self._retained.pop(stem, None)
        for name in os.listdir(self.checkpoint_dir):
            if name == stem + ".json" or (name.startswith(stem + ".") and _ENGINE_FILE_RE.match(name)):
                path = os.path.join(self.checkpoint_dir, name)
                try:
                    os.replace(path, path + ".unusable")
                except OSError as err:
                    self._log("set_aside", "could not set aside %s: %s", path, err)
                    continue
                try:
                    os.utime(path + ".unusable")   # (set aside now: checkpoint_retain's time)
                except OSError as err:
                    self._log("set_aside", "could not date %s.unusable: %s", path, err)
        self._log("set_aside", "stream %r cannot be resumed (%s): its checkpoint is set aside "
                  "(%s.json.unusable) and the topic starts a new stream", topic_name(topic), exc,
                  os.path.join(self.checkpoint_dir, stem))

    def _room_candidate(self):
        """The stream to retire for a new topic, or None: an ended one, the longest
        without a sample first, else, with ``retire_idle``, one without a sample for at
        least ``retire_idle`` seconds, the longest first; a stream whose retirement failed
        in the last ``_RETIRE_RETRY`` seconds is not one."""
        now = time.monotonic()
        ready = [st for st in self.streams.values() if now - st.retire_failed >= _RETIRE_RETRY]
        ended = [st for st in ready if st.ended]
        if ended:
            return min(ended, key=lambda st: st.last_in)
        if self.retire_idle is not None and ready:
            st = min(ready, key=lambda st: st.last_in)
            if now - st.last_in >= self.retire_idle:
                return st
        return None

    def _retire(self, st: _Stream) -> bool:
        """Take ``st`` out of the table to make room: publish its smoothing lag (unless it
        ended, or a checkpoint keeps its warm-up), checkpoint it as ended (with a
        checkpoint directory; if that fails the stream stays, its lag published), close
        its engine. Whether it was retired."""
        warming = _warming_up(st.engine)   # (ended or not: an end does not flush it)
        keep = self.checkpoint_dir is not None and warming
        if (not st.ended or warming) and not keep:
            self._flush(st)
            st.ended = True
            self._hold(st)   # (it stays if the checkpoint fails)
        # (ended in the record: resumed when its topic comes back, not at a start); the
        # end checkpoint stands if nothing changed since (its learner is held): under
        # churn the second write doubled the checkpoint traffic
        if (self.checkpoint_dir is not None
                and not self._checkpoint(st, ended=True, engine_file=None)):
            st.retire_failed = time.monotonic()
            return False
        self._steps_retired += _engine_steps(st.engine)
        del self.streams[st.topic]
        self._release(st.topic)
        if self.checkpoint_retain is not None:
            stem = _stream_stem(st.topic)
            self._retain(stem, st.topic, [_engine_file(stem, st.generation)])
        try:
            st.engine.close()
        except Exception as exc:  # noqa: BLE001 - a failed close must not stop the service
            logger.warning("closing the engine of stream %r failed: %s", st.name, exc)
        self.counters["retired"] += 1
        logger.info("retired stream %r to make room (%d samples; %s)", st.name, st.samples,
                    "checkpointed: it resumes if its topic comes back" if self.checkpoint_dir
                    else "no checkpoint directory: its topic coming back starts a new engine")
        return True

    def _end_stands(self, st: _Stream) -> bool:
        """Whether ``st``'s end checkpoint (record ended) holds its engine as it is, and
        its files are still there (a directory removed meanwhile is written afresh)."""
        if not (st.end_key is not None and st.ended and st.record_ended
                and _engine_key(st.engine) == st.end_key):
            return False
        stem = os.path.join(self.checkpoint_dir, _stream_stem(st.topic))
        return os.path.isfile(_engine_file(stem, st.generation)) and os.path.isfile(f"{stem}.json")

    def _release(self, topic: bytes):
        """The source may give up the bookkeeping of a topic not served (when it can)."""
        release = getattr(self.source, "release", None)
        if release is not None:
            release(topic)

    def _add_stream(self, st: _Stream, retired_here: bool = False):
        """Register a new or resumed stream: its engine decides the block path (the
        first engine's ``push_many``), and the learner steps it already holds (a
        checkpoint's) are not this run's, unless this run retired it (``retired_here``):
        they move back from the retired engines' count."""
        self.streams[st.topic] = st
        if self._retained:
            self._retained.pop(_stream_stem(st.topic), None)
        hold = getattr(self.source, "hold", None)
        if hold is not None:
            hold(st.topic)
        steps = _engine_steps(st.engine)
        if retired_here:
            self._steps_retired -= steps
        else:
            self._steps_inherited += steps
        if self._block is None:
            self._block = callable(getattr(st.engine, "push_many", None))

    def _publish(self, st: _Stream, posts):
        """Publish a list of Posterior (the ``push`` and ``flush`` paths)."""
        if len(posts) > 1:   # (one is cheaper through the Python encoder than a compiled call)
            self._publish_batch(st, PosteriorBatch.from_posteriors(posts))
        else:
            self._send_each(st, posts)

    def _send_each(self, st: _Stream, posts):
        sent = 0
        for p in posts:
            seq, ts = st.pending.pop(p.t)
            if seq < 0:   # no pending sample (a host's engine emitting a position twice):
                # no sequence number to publish it under; counted, never raised
                self.counters["unmatched"] += 1
                self._log("unmatched", "stream %r: the engine emitted position %d, which has no "
                          "pending sample: not published", st.name, p.t)
                continue
            self.sink.send(st.topic, seq, ts, p)
            sent += 1
        self._published(st, sent)

    def _publish_batch(self, st: _Stream, batch):
        n = len(batch.t)
        t0 = int(batch.t[0])
        if int(batch.t[-1]) - t0 != n - 1 or not st.pending.holds(t0, n):
            self._send_each(st, batch)   # (an engine that skips or repeats positions)
            return
        seq, text, tlen = st.pending.take(t0, n)
        self.sink.send_block(st.topic, seq, text, tlen, batch)
        self._published(st, n)

    def _published(self, st: _Stream, n: int):
        st.posteriors += n
        self.counters["posteriors"] += n
        st.last_out = self._last_any_out = time.monotonic()

    def _heartbeat_in(self, hb: Heartbeat):
        self.counters["heartbeats_in"] += 1
        if not hb.end:
            return
        st = self.streams.get(hb.topic)
        if st is None or st.ended:
            return
        self.counters["ends"] += 1
        logger.info("stream %r ended at sequence number %d", st.name, hb.seq)
        if not _warming_up(st.engine):
            # (not a warm-up, as after a gap: it would start the model from the samples
            # buffered so far; the buffer waits for the stream to go on, and a retirement
            # or the shutdown without a checkpoint to keep it flushes it, as a live one)
            self._flush(st)
        st.ended = True
        self._hold(st)   # (until a sample of it comes again)
        if self.checkpoint_dir is not None:
            # (a crash then leaves it ended: it resumes when its topic comes back, and
            # does not hold a place in the table after the restart)
            key = _engine_key(st.engine)   # (taken first: a change after it is seen)
            if self._checkpoint(st):
                st.end_key = key

    def _flush(self, st: _Stream):
        try:
            posts = st.engine.flush()
        except ValueError as exc:
            self._log("flush", "stream %r: flush failed: %s", st.name, exc)
            return
        if posts:
            self._publish(st, posts)

    def _hold(self, st: _Stream):
        """Hold the learner of ``st`` until its next sample (:meth:`_accepted`)."""
        if not st.held:
            st.held = True
            _pause_learner(st.engine, True)

    def _hold_idle(self, now: float):
        """Hold the learners of the streams without a sample for ``learn_idle`` seconds."""
        for st in list(self.streams.values()):
            if not st.held and now - st.last_in >= self.learn_idle:
                self._hold(st)

    def _housekeeping(self, now: float):
        self.source.maintain()
        if self._retained:
            self._forget_expired()
        if self.learn_idle is not None:
            self._hold_idle(now)
        hb = self.heartbeat_interval
        if hb > 0:
            for st in list(self.streams.values()):
                if now - st.last_out >= hb:
                    self.sink.send_heartbeat(st.topic, st.last_seq, t=st.t_next)
                    st.last_out = now
                    self.counters["heartbeats_out"] += 1
            if now - self._last_any_out >= hb:
                self.sink.send_service_heartbeat(len(self.streams))
                self._last_any_out = now
                self.counters["heartbeats_out"] += 1
        if self.status_interval > 0 and now - self._last_status[0] >= self.status_interval:
            self._status(self.status_line(now))
            self._last_status = (now, self.counters["samples"],
                                 self._learner_steps() - self._steps_inherited)

    def _learner_steps(self) -> int:
        """Learner steps of every engine so far (those the checkpoints it resumed held,
        and those of the engines it retired, included)."""
        return sum(_engine_steps(st.engine) for st in list(self.streams.values())) + self._steps_retired

    def status_line(self, now: float | None = None, prefix: str = "streamfhmm serve:") -> str:
        """One line: samples and rate, streams, gaps, malformed messages, input
        disconnections, checkpoints, learner steps (a resumed checkpoint's included) and
        their rate (rates since the previous status line, of this run's steps only), the
        learners held (if any), subscribers."""
        now = time.monotonic() if now is None else now
        t_prev, n_prev, s_prev = self._last_status
        dt = max(now - t_prev, 1e-9)
        n = self.counters["samples"]
        rate = (n - n_prev) / dt
        m = self.metrics(engines=False)
        bad = ", ".join(f"{k} {v}" for k, v in m["malformed"].items() if v) or "none"
        steps = self._learner_steps()
        run_steps = steps - self._steps_inherited
        return (f"{prefix} {n:,} samples ({rate:,.0f}/s), {m['posteriors']:,} posteriors, "
                f"{len(self.streams)} stream(s), gaps {m['gaps']} ({m['gap_samples']} samples), "
                f"malformed {m['malformed_total']} ({bad}), "
                f"input disconnects {m['input_disconnects']}, stale {m['stale']}, "
                f"rejected {m['engine_rejected']}, checkpoints {m['checkpoints']}"
                + (f" ({m['checkpoint_failures']} failed)" if m["checkpoint_failures"] else "")
                + f", lost on resume {m['lost_on_resume']}"
                + (f", retired {m['retired']}" if m["retired"] else "")
                + (f", checkpoints removed {m['checkpoints_removed']}" if m["checkpoints_removed"] else "")
                + f", learner steps {steps} "
                f"({max(run_steps - s_prev, 0) / dt:,.0f}/s), "
                + (f"learners held {m['learners_held']}, " if m["learners_held"] else "")
                + f"subscriptions {self.sink.n_subscribers()}")

    # -- shutdown ----------------------------------------------------------------------
    def shutdown(self, drain: bool = True):
        """Drain the queued input (for at most ``drain_timeout`` seconds; not if
        ``drain`` is false, as when :meth:`run` stops at its ``max_samples``), flush every
        engine, publish, checkpoint, close engines."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.drain_timeout
        try:
            while drain:
                if time.monotonic() >= deadline:   # (a publisher flooding: stop reading)
                    logger.warning("stopped draining the input after %g s (drain_timeout): "
                                   "the messages still queued are not read", self.drain_timeout)
                    break
                items = self.source.recv_runs(self.batch_size)
                if not items:
                    break
                self.process(items)
        except zmq.ZMQError as exc:
            logger.warning("draining the input failed: %s", exc)
        for st in list(self.streams.values()):
            # a warm-up the checkpoint keeps goes on after a restart; without a checkpoint
            # (or if writing it fails) this is its samples' last chance of a posterior:
            # the model starts from them
            warming = _warming_up(st.engine)   # (ended or not: an end does not flush it)
            keep = self.checkpoint_dir is not None and warming
            if (not st.ended or warming) and not keep:
                self._flush(st)
            if self.checkpoint_dir is not None:
                written = self._checkpoint(st, final=True, engine_file=None)
                if keep and not written:
                    self._flush(st)
            try:
                st.engine.close()
            except Exception as exc:  # noqa: BLE001 - closing must go on for every stream
                logger.warning("closing the engine of stream %r failed: %s", st.name, exc)
        logger.info("%s", self.status_line())

    # -- metrics -----------------------------------------------------------------------
    def metrics(self, engines: bool = True) -> dict:
        """Counters of the service (and, with ``engines``, each engine's ``metrics()``).

        Keys: ``samples``, ``posteriors``, ``streams``, ``learners_held`` (streams whose
        learner, learning, is held: ended, or idle for ``learn_idle``), ``malformed`` (by kind),
        ``malformed_total``, ``gaps``, ``gap_samples``, ``stale``, ``restarts``,
        ``input_disconnects`` (input connections that ended: a publisher leaving, or
        libzmq dropping one for a frame past the size bound), ``input_reconnects`` (the
        service's own reconnections after such a drop),
        ``engine_rejected``, ``streams_full``, ``retired`` (streams retired to make room for
        a new topic), ``resume_failures`` (records set aside), ``checkpoints_removed``
        (checkpoints of ended or retired streams removed after ``checkpoint_retain``),
        ``heartbeats_in``, ``heartbeats_out``,
        ``checkpoints``, ``checkpoint_failures``, ``lost_on_resume``, ``ends``,
        ``unmatched`` (posteriors of positions with no pending sample, not published),
        ``published``, ``subscribers``, ``uptime``; ``engines`` maps a topic (str) to
        its engine's metrics.
        """
        seqs = list(self.source.streams.values())
        gone = getattr(self.source, "evicted_totals", None)   # (bookkeeping the source gave up)
        if gone is not None:
            seqs.append(gone)
        out = dict(self.counters)
        out["streams_full"] += getattr(self.source, "untracked", 0)
        out.update(streams=len(self.streams),
                   learners_held=sum(st.held and _learning(st.engine)
                                     for st in list(self.streams.values())),
                   malformed=dict(self.source.errors),
                   malformed_total=self.source.n_malformed,
                   gaps=sum(s.gaps for s in seqs), gap_samples=sum(s.gap_samples for s in seqs),
                   stale=sum(s.stale for s in seqs),
                   restarts=sum(s.restarts for s in seqs),
                   input_disconnects=getattr(self.source, "disconnects", 0),
                   input_reconnects=getattr(self.source, "reconnects", 0),
                   published=self.sink.sent, subscribers=self.sink.n_subscribers(),
                   uptime=time.monotonic() - self.started)
        if engines:
            eng = {}
            for st in list(self.streams.values()):
                try:
                    eng[st.name] = dict(st.engine.metrics())
                except Exception:  # noqa: BLE001 - metrics must never break the service
                    eng[st.name] = {}
            out["engines"] = eng
        return out


def require_prometheus():
    """The ``prometheus_client`` module, or RuntimeError saying which extra installs it."""
    try:
        import prometheus_client
    except ImportError:
        raise RuntimeError("metrics need the prometheus-client package: "
                           "pip install 'streamfhmm[metrics]'") from None
    return prometheus_client


def start_metrics_server(service: StreamService, port: int, addr: str = "127.0.0.1"):
    """Serve the service's metrics in Prometheus text format on ``http://addr:port/metrics``.

    Needs the optional package ``prometheus-client`` (``pip install "streamfhmm[metrics]"``).

    Returns
    -------
    MetricsServer
        ``port`` is the port bound (useful with ``port=0``); ``close()`` stops it.

    Raises
    ------
    ValueError
        ``port`` is not in [0, 65535].
    OSError
        The port cannot be bound (e.g. already in use).
    """
    if isinstance(port, bool) or not isinstance(port, (int, np.integer)) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in [0, 65535] (0: any free port), got {port!r}")
    port = int(port)
    prometheus_client = require_prometheus()
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    counters = {
        "samples": "samples pushed into the engines",
        "posteriors": "posteriors published",
        "malformed": "malformed input messages skipped",
        "gaps": "sequence gaps seen (events)",
        "gap_samples": "sequence numbers never received",
        "stale": "repeated or out-of-order sequence numbers skipped",
        "restarts": "publisher restarts (sequence number back to 0)",
        "input_disconnects": "input connections that ended (a publisher leaving, or dropped "
                             "by libzmq for a frame past the size bound)",
        "input_reconnects": "reconnections after libzmq dropped the input connection",
        "engine_rejected": "samples the engine refused",
        "unmatched": "posteriors of positions with no pending sample (not published)",
        "streams_full": "messages (samples and heartbeats) of new topics skipped past max_streams",
        "retired": "streams retired (checkpointed and closed) to make room for a new topic",
        "heartbeats_in": "input heartbeats received",
        "heartbeats_out": "heartbeats published",
        "checkpoints": "stream checkpoints written",
        "checkpoint_failures": "stream checkpoints that failed",
        "lost_on_resume": "samples lost between a stream's checkpoint and its resume (at a "
                          "restart, or when its topic came back)",
        "resume_failures": "stream checkpoints that could not be resumed (set aside)",
        "checkpoints_removed": "checkpoints of ended or retired streams removed after "
                               "checkpoint_retain seconds",
    }

    class _Collector:
        def collect(self):
            m = service.metrics()
            for key, doc in counters.items():
                if key == "malformed":
                    c = CounterMetricFamily("streamfhmm_malformed", doc, labels=["kind"])
                    for kind, v in m["malformed"].items():
                        c.add_metric([kind], v)
                else:
                    c = CounterMetricFamily(f"streamfhmm_{key}", doc, value=m[key])
                yield c
            yield GaugeMetricFamily("streamfhmm_streams", "streams being served", value=m["streams"])
            yield GaugeMetricFamily("streamfhmm_learners_held", "streams whose learner is held "
                                    "(ended, or idle for learn_idle)", value=m["learners_held"])
            yield GaugeMetricFamily("streamfhmm_subscribers", "output subscriptions", value=m["subscribers"])
            yield GaugeMetricFamily("streamfhmm_uptime_seconds", "seconds since start", value=m["uptime"])
            families = {}
            for topic, em in m.get("engines", {}).items():
                for k, v in em.items():
                    if isinstance(v, bool) or not isinstance(v, (int, float)):
                        continue
                    name = "streamfhmm_engine_" + re.sub(r"[^a-zA-Z0-9_]", "_", str(k))
                    g = families.get(name)
                    if g is None:
                        g = families[name] = GaugeMetricFamily(name, f"engine metric {k}", labels=["topic"])
                    g.add_metric([topic], float(v))
            yield from families.values()

    registry = prometheus_client.CollectorRegistry()
    registry.register(_Collector())
    result = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(result[0] if isinstance(result, tuple) else result)


class MetricsServer:
    """The running metrics HTTP server: ``port`` (the one bound) and :meth:`close`."""

    def __init__(self, server):
        self.server = server
        self.port = server.server_address[1] if server is not None else None

    def close(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
