"""The compiled path of the binary wire format: receive and send many messages per call.

Per message, the pure pyzmq path costs a Python call per frame (each building a
``Frame`` or a ``bytes``), a regular-expression match, a ``NamedTuple`` and a NumPy
array on the way in, and a header formatted in Python plus three ``send`` calls on the
way out: about 20 µs of interpreter time per sample, most of the service's CPU. The
kernels here do the same work in one Numba call per batch, calling libzmq directly
(:mod:`streamfhmm.io._libzmq`) without the GIL:

* :func:`recv_samples` drains a SUB socket: each message's frames are received and
  counted, the canonical input (``[topic, {"seq":<int>,"ts":<number>}, 8 D bytes]``
  with an ASCII topic and finite values) is decoded into arrays, and consecutive samples
  of one topic with consecutive sequence numbers are grouped into runs. The first
  message that is anything else (a heartbeat, JSON, a non-canonical header, a malformed
  message) stops the call with its frames in a scratch buffer, for the Python decoder
  (:func:`streamfhmm.io.wire.decode_input`) to handle exactly as before.
* :func:`send_posteriors` formats and sends the binary output messages of one stream.

The time stamp travels as text: ``"ts"`` of an output header is the number's text
from the input header, character for character (the same JSON number), so nothing
converts it to binary and back on the hot path.

Both paths produce the same messages (the Python encoder repeats the number text of a
canonical header too, given it as a :class:`~streamfhmm.io.wire.TsText`, and writes
``repr`` of the float for any other header) and the same decoded values;
tests/test_fastwire.py checks it message by message against the Python encoder and
decoder.
"""
from __future__ import annotations

import numpy as np

from ..kernels._jit import jit
from ._libzmq import (EAGAIN, EINTR, ZMQ_DONTWAIT, ZMQ_RCVMORE, ZMQ_SNDMORE, call_errno, call_getsockopt,
                      call_recv, call_send)
from .floatrepr import REPR_MAX_BYTES, put_repr
from .wire import TS_TEXT_BYTES

__all__ = ["STOP_FULL", "STOP_EMPTY", "STOP_SLOW", "STOP_ERROR",
           "recv_message", "recv_samples", "send_posteriors", "json_message_bytes"]

#: why :func:`recv_samples` returned: ``max_messages`` received, queue empty, a message
#: for the Python decoder waits in the scratch frames, libzmq error (errno in status[2])
STOP_FULL, STOP_EMPTY, STOP_SLOW, STOP_ERROR = 0, 1, 2, 3

_SEQ_KEY = np.frombuffer(b'{"seq":', dtype=np.uint8).copy()
_TS_KEY = np.frombuffer(b',"ts":', dtype=np.uint8).copy()   # (input and output headers)
_OUT_T = np.frombuffer(b',"t":', dtype=np.uint8).copy()
_OUT_VERSION = np.frombuffer(b',"version":', dtype=np.uint8).copy()
_OUT_FLAGS = np.frombuffer(b',"flags":', dtype=np.uint8).copy()
_OUT_CHAINS = np.frombuffer(b',"n_chains":', dtype=np.uint8).copy()
_OUT_THETA = np.frombuffer(b',"theta":[', dtype=np.uint8).copy()
_OUT_RHO = np.frombuffer(b'],"rho":[', dtype=np.uint8).copy()
_OUT_MEAN = np.frombuffer(b'],"mean":[', dtype=np.uint8).copy()
_NULL = np.frombuffer(b"null", dtype=np.uint8).copy()
_MAX_EXP = 276   # 10**(31 + 276) < DBL_MAX: a ts text within TS_TEXT_BYTES is finite


# -- receive ---------------------------------------------------------------------------
@jit
def _digits(h, p, n):
    """The run of decimal digits at ``h[p:n]``: (the value of its first 18, its end, its
    length)."""
    v = 0
    q = p
    while q < n and 48 <= h[q] <= 57:
        if q - p < 18:
            v = v * 10 + (h[q] - 48)
        q += 1
    return v, q, q - p


@jit
def _starts(h, p, n, key):
    """Whether ``h[p:n]`` begins with ``key``."""
    if p + key.shape[0] > n:
        return False
    for i in range(key.shape[0]):
        if h[p + i] != key[i]:
            return False
    return True


@jit
def _parse_header(h, n, out):
    """Match ``{"seq":<int>,"ts":<number>}`` (the form every streamfhmm producer writes).

    ``<int>`` is ``0|[1-9][0-9]{0,17}`` (below 10**18, so below 2**63); ``<number>``
    is a JSON number of at most TS_TEXT_BYTES characters whose exponent keeps it finite.
    On a match returns True with ``out = (seq, ts_start, ts_len)``.
    """
    if not _starts(h, 0, n, _SEQ_KEY):
        return False
    p = _SEQ_KEY.shape[0]
    seq, q, nd = _digits(h, p, n)
    if nd == 0 or nd > 18 or (nd > 1 and h[p] == 48):        # no leading zero
        return False
    if not _starts(h, q, n, _TS_KEY):
        return False
    start = p = q + _TS_KEY.shape[0]
    if p < n and h[p] == 45:                                  # -
        p += 1
    _, q, nd = _digits(h, p, n)
    if nd == 0 or (nd > 1 and h[p] == 48):
        return False
    p = q
    if p < n and h[p] == 46:                                  # .
        _, p, nd = _digits(h, p + 1, n)
        if nd == 0:
            return False
    if p < n and (h[p] == 101 or h[p] == 69):                # e E
        p += 1
        negative = p < n and h[p] == 45
        if p < n and (h[p] == 43 or h[p] == 45):
            p += 1
        e, p, nd = _digits(h, p, n)
        if nd == 0 or nd > 3 or (not negative and e > _MAX_EXP):
            return False
    length = p - start
    if length > TS_TEXT_BYTES or p + 1 != n or h[p] != 125:  # }
        return False
    out[0] = seq
    out[1] = start
    out[2] = length
    return True


@jit
def recv_message(fn_recv, fn_getsockopt, fn_errno, sock, frames, frame_len, first_flags, more):
    """Receive one message frame by frame: frame i into ``frames[min(i, 3)]`` (truncated
    to the row; its whole size in ``frame_len``), so a fourth row absorbs the frames
    past the third.

    ``first_flags`` are the ``zmq_recv`` flags of the first frame (``ZMQ_DONTWAIT``, or 0
    to block); the rest of a message is there at once. ``more`` (int64, (2,)) is scratch
    for ``ZMQ_RCVMORE`` and its size.

    Returns
    -------
    (int, int)
        ``(n_frames, 0)``; ``(0, errno)`` when no first frame came (``EAGAIN``: none
        queued); ``(-1, errno)`` when libzmq failed inside a message.
    """
    cap = frames.shape[1]
    n_frames = 0
    while True:
        row = min(n_frames, 3)
        r = call_recv(fn_recv, sock, frames[row].ctypes.data, cap,
                      np.int32(first_flags if n_frames == 0 else ZMQ_DONTWAIT))
        if r < 0:
            err = call_errno(fn_errno)
            if n_frames == 0:
                return 0, err
            if err == EINTR or err == EAGAIN:
                continue
            return -1, err
        frame_len[row] = r
        n_frames += 1
        more[0] = 0
        more[1] = 4            # RCVMORE is an int: 4 bytes, read into the low half
        if call_getsockopt(fn_getsockopt, sock, np.int32(ZMQ_RCVMORE), more.ctypes.data,
                           more[1:].ctypes.data) != 0:
            return -1, call_errno(fn_errno)
        if more[0] == 0:
            return n_frames, 0


@jit
def recv_samples(fn_recv, fn_getsockopt, fn_errno, sock, max_messages, n_features,
                 frames, frame_len, topic, topic_len, seq, ts_text, ts_len, values, value_bytes,
                 run_start, status):
    """Receive up to ``max_messages`` messages from a SUB socket without blocking.

    Parameters
    ----------
    fn_recv, fn_getsockopt, fn_errno : int
        Addresses of ``zmq_recv``, ``zmq_getsockopt`` and ``zmq_errno``.
    sock : int
        The socket's ``void *`` (``socket.underlying``).
    max_messages, n_features : int
        K (at most the rows of the outputs) and D.
    frames : ndarray of uint8, shape (4, cap)
        Scratch for one message's frames (a fourth row absorbs frames past the third);
        ``cap`` is one more than the largest valid frame.
    frame_len : ndarray of int64, shape (4,)
        Out: the sizes of the scratch frames (of the message that stopped the call).
    topic : ndarray of uint8, shape (K, 256); topic_len : ndarray of int64, shape (K,)
    seq : ndarray of int64, shape (K,)
    ts_text : ndarray of uint8, shape (K, TS_TEXT_BYTES); ts_len : ndarray of int64, shape (K,)
    values : ndarray of float64, shape (K, D)
    value_bytes : ndarray of uint8, shape (K, 8 D)
        The same memory as ``values`` (little-endian machine).
    run_start : ndarray of int64, shape (K + 1,)
        Out: runs of samples of one topic with consecutive sequence numbers are
        ``run_start[r] : run_start[r + 1]``.
    status : ndarray of int64, shape (4,)
        Out: ``[why, n_frames, errno, n_runs]``; ``why`` one of STOP_FULL, STOP_EMPTY,
        STOP_SLOW (the scratch holds a message of ``n_frames`` frames for the Python
        decoder), STOP_ERROR (libzmq failed with ``errno``).

    Returns
    -------
    int
        k, the canonical samples decoded into rows ``0 .. k-1``.
    """
    more = np.zeros(2, np.int64)
    parsed = np.zeros(3, np.int64)
    k = 0
    n_runs = 0
    status[0] = STOP_FULL
    status[1] = 0
    status[2] = 0
    while k < max_messages:
        n_frames, err = recv_message(fn_recv, fn_getsockopt, fn_errno, sock, frames, frame_len,
                                     ZMQ_DONTWAIT, more)
        if n_frames <= 0:
            _stop_no_message(n_frames, err, status)
            break
        if not _decode_canonical(frames, frame_len, n_frames, n_features, values[k], value_bytes[k], parsed):
            status[0] = STOP_SLOW
            status[1] = n_frames
            break
        tl = frame_len[0]
        topic_len[k] = tl
        for i in range(tl):
            topic[k, i] = frames[0, i]
        _keep_seq_ts(frames, parsed, k, seq, ts_text, ts_len)
        new_run = k == 0 or seq[k] != seq[k - 1] + 1 or topic_len[k] != topic_len[k - 1]
        if not new_run:
            for i in range(tl):
                if topic[k, i] != topic[k - 1, i]:
                    new_run = True
                    break
        if new_run:
            run_start[n_runs] = k
            n_runs += 1
        k += 1
    run_start[n_runs] = k
    status[3] = n_runs
    return k


@jit
def _stop_no_message(n_frames, err, status):
    """``status[0]``, ``status[2]`` after :func:`recv_message` returned no message:
    STOP_EMPTY (nothing queued, or a signal) or STOP_ERROR with the errno."""
    idle = n_frames == 0 and (err == EAGAIN or err == EINTR)
    status[0] = STOP_EMPTY if idle else STOP_ERROR
    status[2] = 0 if idle else err


@jit
def _decode_canonical(frames, frame_len, n_frames, n_features, values_row, bytes_row, parsed):
    """Whether the message in the scratch ``frames`` is the canonical input: three frames,
    an ASCII topic of at most 255 bytes, the header :func:`_parse_header` matches
    (``parsed`` receives seq, ts start, ts length) and D = ``n_features`` values, finite
    or NaN (missing; every value may be), which are copied into ``values_row`` (through
    its bytes, ``bytes_row``)."""
    nbytes = 8 * n_features
    # (a frame longer than the scratch was truncated: MAXMSGSIZE keeps that from
    # happening, and nothing here reads past the scratch whatever the lengths say)
    if not (n_frames == 3 and frame_len[0] <= 255 and frame_len[1] < frames.shape[1]
            and frame_len[2] == nbytes):
        return False
    for i in range(frame_len[0]):
        if frames[0, i] >= 128:      # non-ASCII topics: UTF-8 checked in Python
            return False
    if not _parse_header(frames[1], frame_len[1], parsed):
        return False
    for i in range(nbytes):
        bytes_row[i] = frames[2, i]
    for j in range(n_features):
        v = values_row[j]
        if v == v and v - v != 0.0:   # an infinity (NaN, a missing value, passes)
            return False
    return True


@jit
def _keep_seq_ts(frames, parsed, k, seq, ts_text, ts_len):
    """Row k of ``seq``, ``ts_text``, ``ts_len`` from a decoded canonical header."""
    seq[k] = parsed[0]
    start = parsed[1]
    ts_len[k] = parsed[2]
    for i in range(parsed[2]):
        ts_text[k, i] = frames[1, start + i]


# -- send ------------------------------------------------------------------------------
@jit
def _put(buf, p, text):
    for i in range(text.shape[0]):
        buf[p + i] = text[i]
    return p + text.shape[0]


@jit
def _put_int(buf, p, v):
    if v < 0:
        buf[p] = 45
        p += 1
        u = -v
    else:
        u = v
    nd = 1
    x = u
    while x >= 10:
        x //= 10
        nd += 1
    for i in range(nd - 1, -1, -1):
        buf[p + i] = 48 + u % 10
        u //= 10
    return p + nd


@jit
def _send_frame(fn_send, fn_errno, sock, address, size, flags, first, status):
    """Send one frame; returns 1 sent, 0 dropped (the first frame only), -1 error."""
    while True:
        if call_send(fn_send, sock, address, size, flags) >= 0:
            return 1
        err = call_errno(fn_errno)
        if err == EINTR:
            continue
        if err == EAGAIN:
            if first:
                return 0
            continue                       # the rest of a message whose first frame went out
        status[0] = err
        return -1


@jit
def send_posteriors(fn_send, fn_errno, sock, topic, seq, t, ts_text, ts_len, version, flags,
                    theta, rho, mean, header, payload, status, json_prefix):
    """Format and send n output messages of one stream.

    Binary (``json_prefix`` empty): message k is ``[topic, {"seq":s,"t":t,"ts":<ts
    text>,"version":v,"flags":f,"n_chains":M}, θ_k ‖ ρ_k ‖ mean_k as little-endian
    float64]``; JSON: one frame ``{"topic":<name>,"seq":s,"t":t,"ts":<ts text>,
    "version":v,"flags":f,"theta":[…],"rho":[…],"mean":[…]}``, numbers as ``json.dumps``
    writes them (:mod:`.floatrepr`; a non-finite value as ``null``)
    (:mod:`streamfhmm.io.wire`).

    Parameters
    ----------
    fn_send, fn_errno, sock : int
        Addresses of ``zmq_send`` and ``zmq_errno``; the socket's ``void *``.
    topic : ndarray of uint8, shape (L,)
    seq, t, version, flags : ndarray of int64, shape (n,)
    ts_text : ndarray of uint8, shape (n, TS_TEXT_BYTES); ts_len : ndarray of int64, shape (n,)
    theta, rho : ndarray of float64, shape (n, M)
    mean : ndarray of float64, shape (n, D)
    header : ndarray of uint8
        Scratch for a header (at least 160 + TS_TEXT_BYTES bytes) or a JSON message
        (:func:`json_message_bytes`).
    payload : ndarray of float64, shape (2 M + D,)
        Scratch.
    status : ndarray of int64, shape (2,)
        Out: ``[errno, dropped]``; errno 0 unless libzmq failed (the call then stops).
    json_prefix : ndarray of uint8
        Empty for binary output; for JSON ``{"topic":<the topic as a JSON string>,"seq":``.

    Returns
    -------
    int
        Messages sent.
    """
    status[0] = 0
    status[1] = 0
    sent = 0
    for k in range(seq.shape[0]):
        r = _send_posterior(fn_send, fn_errno, sock, topic, seq[k], t[k], ts_text[k], ts_len[k],
                            version[k], flags[k], theta[k], rho[k], mean[k], header, payload, status,
                            json_prefix)
        if r < 0:
            return sent
        if r == 0:
            status[1] += 1
        else:
            sent += 1
    return sent


@jit
def _send_posterior(fn_send, fn_errno, sock, topic, seq, t, ts_text, ts_len, version, flags,
                    theta, rho, mean, header, payload, status, json_prefix):
    """Format and send one output message (see :func:`send_posteriors`; ``theta``,
    ``rho``, ``mean`` and ``ts_text`` are its rows). Returns 1 sent, 0 dropped (a full
    queue with ``ZMQ_DONTWAIT``), -1 libzmq failed (errno in ``status[0]``)."""
    M = theta.shape[0]
    D = mean.shape[0]
    if json_prefix.shape[0]:
        p = _put(header, 0, json_prefix)
        p = _common_fields(header, p, seq, t, ts_text, ts_len, version, flags)
        p = _put_floats(header, _put(header, p, _OUT_THETA), theta)
        p = _put_floats(header, _put(header, p, _OUT_RHO), rho)
        p = _put_floats(header, _put(header, p, _OUT_MEAN), mean)
        header[p] = 93                     # ]
        header[p + 1] = 125                # }
        return _send_frame(fn_send, fn_errno, sock, header.ctypes.data, p + 2, np.int32(0), True, status)
    p = _put(header, 0, _SEQ_KEY)
    p = _common_fields(header, p, seq, t, ts_text, ts_len, version, flags)
    p = _put(header, p, _OUT_CHAINS)
    p = _put_int(header, p, M)
    header[p] = 125
    p += 1
    for j in range(M):
        payload[j] = theta[j]
        payload[M + j] = rho[j]
    for j in range(D):
        payload[2 * M + j] = mean[j]
    more = np.int32(ZMQ_SNDMORE)
    r = _send_frame(fn_send, fn_errno, sock, topic.ctypes.data, topic.shape[0], more, True, status)
    if r <= 0:
        return r
    if _send_frame(fn_send, fn_errno, sock, header.ctypes.data, p, more, False, status) < 0:
        return -1
    if _send_frame(fn_send, fn_errno, sock, payload.ctypes.data, 8 * (2 * M + D), np.int32(0),
                   False, status) < 0:
        return -1
    return 1


@jit
def _common_fields(buf, p, seq, t, ts_text, ts_len, version, flags):
    """``<seq>,"t":<t>,"ts":<ts text>,"version":<v>,"flags":<f>`` at ``buf[p:]``."""
    p = _put_int(buf, p, seq)
    p = _put(buf, p, _OUT_T)
    p = _put_int(buf, p, t)
    p = _put(buf, p, _TS_KEY)
    for i in range(ts_len):
        buf[p + i] = ts_text[i]
    p += ts_len
    p = _put(buf, p, _OUT_VERSION)
    p = _put_int(buf, p, version)
    p = _put(buf, p, _OUT_FLAGS)
    return _put_int(buf, p, flags)


@jit
def _put_floats(buf, p, x):
    """The JSON numbers of x, comma-separated (``null`` for a non-finite value)."""
    for j in range(x.shape[0]):
        if j:
            buf[p] = 44                    # ,
            p += 1
        v = x[j]
        if v - v == 0.0:
            p = put_repr(buf, p, v)
        else:
            p = _put(buf, p, _NULL)
    return p


def json_message_bytes(prefix_len: int, n_chains: int, n_features: int) -> int:
    """An upper bound on the bytes of a JSON output message (its scratch size)."""
    return prefix_len + 160 + TS_TEXT_BYTES + (REPR_MAX_BYTES + 1) * (2 * n_chains + n_features)
