"""A light load generator and receiver for bench/zmq.py: compiled, like the service.

On a 2-core machine the benchmark's own client shares the processors with the service
it measures; written in Python (three ``send`` calls, a formatted header and two clock
reads per sample; a ``recv`` per frame and a parse per posterior) it takes about a core
at 20,000 messages/s. These kernels do the same through libzmq directly
(:mod:`streamfhmm.io._libzmq`), so the measurement costs less of the machine it measures:

* :func:`send_burst` publishes consecutive samples ``[topic, {"seq":s,"ts":<text>},
  8 D bytes]`` — the wire format of :mod:`streamfhmm.io.wire`;
* :func:`receive` takes output messages off a SUB socket (blocking, so the process
  sleeps until one arrives), time-stamps each on arrival with ``CLOCK_MONOTONIC`` (the
  clock of ``time.perf_counter`` on Linux) and records the first arrival of each input
  sequence number.

:func:`available` says whether this platform has what they need; bench/zmq.py falls back
to its pure pyzmq client otherwise.
"""
from __future__ import annotations

import ctypes
import sys
import time

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from streamfhmm.io import _libzmq
from streamfhmm.io._libzmq import ZMQ_SNDMORE, call_io
from streamfhmm.io.fastwire import _digits, _put, _put_int, recv_message
from streamfhmm.kernels._jit import jit

CLOCK_REALTIME = 0    # Linux
CLOCK_MONOTONIC = 1


def sleep_function() -> int | None:
    """Address of libc's ``nanosleep``."""
    try:
        return ctypes.cast(ctypes.CDLL(None).nanosleep, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def clock_function() -> int | None:
    """Address of libc's ``clock_gettime`` where it is the clock of ``perf_counter``."""
    if not sys.platform.startswith("linux"):
        return None
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        return None
    try:
        return ctypes.cast(ctypes.CDLL(None).clock_gettime, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def available() -> bool:
    return (_libzmq.functions() is not None and clock_function() is not None
            and sleep_function() is not None)


@intrinsic
def _call_clock(typingctx, fn, clock, timespec):
    """``int clock_gettime(int clock, struct timespec *ts)`` at address ``fn``."""
    sig = types.int32(types.intp, types.int32, types.intp)

    def codegen(context, builder, signature, args):
        fn, clock, ts = args
        i32 = ir.IntType(32)
        f = builder.inttoptr(fn, ir.FunctionType(i32, [i32, ir.IntType(8).as_pointer()]).as_pointer())
        return builder.call(f, [clock, builder.inttoptr(ts, ir.IntType(8).as_pointer())])
    return sig, codegen


@intrinsic
def _call_sleep(typingctx, fn, request):
    """``int nanosleep(const struct timespec *req, struct timespec *rem)`` at ``fn``
    (``rem`` NULL)."""
    sig = types.int32(types.intp, types.intp)

    def codegen(context, builder, signature, args):
        fn, req = args
        i8p = ir.IntType(8).as_pointer()
        f = builder.inttoptr(fn, ir.FunctionType(ir.IntType(32), [i8p, i8p]).as_pointer())
        return builder.call(f, [builder.inttoptr(req, i8p), ir.Constant(i8p, None)])
    return sig, codegen


@jit
def _now(fn_clock, ts):
    _call_clock(fn_clock, np.int32(CLOCK_MONOTONIC), ts.ctypes.data)
    return ts[0] + ts[1] * 1e-9


_SEQ = np.frombuffer(b'{"seq":', dtype=np.uint8).copy()
_TS = np.frombuffer(b',"ts":', dtype=np.uint8).copy()
_KEY = np.frombuffer(b'"seq":', dtype=np.uint8).copy()
_HEARTBEAT = np.frombuffer(b'"heartbeat"', dtype=np.uint8).copy()


@jit
def _send_sample(fn_send, sock, topic, header, seq, ts_text, n_text, row):
    """Format ``{"seq":seq,"ts":<ts_text[:n_text]>}`` and send ``[topic, header, row]``;
    False if libzmq refused."""
    q = _put(header, 0, _SEQ)
    q = _put_int(header, q, seq)
    q = _put(header, q, _TS)
    for i in range(n_text):
        header[q + i] = ts_text[i]
    q += n_text
    header[q] = 125
    q += 1
    more = np.int32(ZMQ_SNDMORE)
    return (call_io(fn_send, sock, topic.ctypes.data, topic.shape[0], more) >= 0
            and call_io(fn_send, sock, header.ctypes.data, q, more) >= 0
            and call_io(fn_send, sock, row.ctypes.data, 8 * row.shape[0], np.int32(0)) >= 0)


@jit
def send_burst(fn_send, sock, topic, seq0, ts_text, rows, header):
    """Publish ``rows`` (n, D) as samples ``seq0 … seq0 + n - 1`` with time stamp text
    ``ts_text``; blocks while a high-water mark is reached. Returns how many were sent."""
    for k in range(rows.shape[0]):
        if not _send_sample(fn_send, sock, topic, header, seq0 + k, ts_text, ts_text.shape[0], rows[k]):
            return k
    return rows.shape[0]


@jit
def paced_send(fn_send, fn_clock, fn_sleep, sock, topic, seq0, rows, t0, period, t_sent, header):
    """Publish ``rows`` (n, D) as samples ``seq0 …``, sample k due at monotonic time
    ``t0 + k · period``: the process sleeps (``nanosleep``) until a sample is due and then
    sends every sample due. ``t_sent[k]`` gets the monotonic time just before sample k is
    sent; its ``"ts"`` is the wall-clock time, to the microsecond. Returns how many were
    sent."""
    n = rows.shape[0]
    mono = np.zeros(2, np.int64)
    wall = np.zeros(2, np.int64)
    req = np.zeros(2, np.int64)
    text = np.zeros(32, np.uint8)
    k = 0
    while k < n:
        now = _now(fn_clock, mono)
        wait = t0 + k * period - now
        if wait > 0:
            req[0] = int(wait)
            req[1] = int((wait - req[0]) * 1e9)
            _call_sleep(fn_sleep, req.ctypes.data)
            continue
        due = min(n, int((now - t0) / period) + 1)
        while k < due:
            _call_clock(fn_clock, np.int32(CLOCK_REALTIME), wall.ctypes.data)
            p = _put_int(text, 0, wall[0])
            text[p] = 46                              # .
            us = wall[1] // 1000
            for i in range(6):
                text[p + 6 - i] = 48 + us % 10
                us //= 10
            p += 7
            t_sent[k] = _now(fn_clock, mono)
            if not _send_sample(fn_send, sock, topic, header, seq0 + k, text, p, rows[k]):
                return k
            k += 1
    return k


@jit
def _find(buf, n, key, start):
    for i in range(start, n - key.shape[0] + 1):
        ok = True
        for j in range(key.shape[0]):
            if buf[i + j] != key[j]:
                ok = False
                break
        if ok:
            return i
    return -1


@jit
def receive(fn_recv, fn_getsockopt, fn_errno, fn_clock, sock, frames, times, max_messages):
    """Receive up to ``max_messages`` output messages (blocking up to the socket's
    RCVTIMEO for the first frame of each); ``times[s]`` gets the arrival time of the first
    posterior of input sequence number ``s`` (if NaN), ``times[-1]`` counts them.
    Heartbeats are skipped. Returns the messages taken (0 on timeout)."""
    n_seq = times.shape[0] - 1
    cap = frames.shape[1]
    more = np.zeros(2, np.int64)
    ts = np.zeros(2, np.int64)
    lens = np.zeros(4, np.int64)
    got = 0
    while got < max_messages:
        n_frames, _ = recv_message(fn_recv, fn_getsockopt, fn_errno, sock, frames, lens, 0, more)
        if n_frames <= 0:
            return got          # timeout (EAGAIN), interrupted or failed
        t = _now(fn_clock, ts)
        got += 1
        h = 1 if n_frames == 3 else 0
        if n_frames == 3 and lens[2] == 0:
            continue                                    # a heartbeat (binary)
        hn = min(lens[h], cap)
        if _find(frames[h], min(hn, 80), _HEARTBEAT, 0) >= 0:
            continue                                    # a heartbeat (JSON)
        i = _find(frames[h], hn, _KEY, 0)
        if i < 0:
            continue
        s, _, nd = _digits(frames[h], i + _KEY.shape[0], hn)
        if nd == 0 or s >= n_seq:
            continue
        if times[s] != times[s]:
            times[s] = t
            times[n_seq] += 1
    return got
