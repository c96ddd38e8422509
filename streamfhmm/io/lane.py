"""The serving lane: one compiled call per wake-up of ``serve`` for its common case.

When a service serves one stream on the compiled wire path, the work of a wake-up —
receive the queued samples, run them through the recognition network, publish their
posteriors — is :func:`serve_lane`: libzmq's receive, the canonical input decoder of
:mod:`.fastwire`, the engine's block kernel
(:func:`streamfhmm.kernels.online.recognition_block`) and the output encoder (binary,
or JSON with :mod:`.floatrepr`'s numbers), in one Numba call without the GIL. Python
then does the bookkeeping of the block (sequence numbers, counters, the learner's
subchains, checkpoints) once (``StreamService._lane_read``).

Before, the same wake-up made three compiled calls (``recv_samples``,
``recognition_block``, ``send_posteriors``) glued by some 90 µs of interpreter work
(runs, batches, the pending FIFO, argument checks), as much as the three calls
themselves for ten samples (bench/serve_loop.py prints both).

The lane stops at the first message that is not the next canonical sample of its
stream (another topic, a gap, a heartbeat, anything for the Python decoder): that
message waits in the scratch frames, the service handles it on the general path, and
the lane goes on after it. tests/test_lane.py runs the same traffic with and without
the lane: the same output headers byte for byte and the same posteriors.
"""
from __future__ import annotations

import numpy as np

from ..kernels._jit import jit
from ..kernels.online import recognition_block
from ._libzmq import ZMQ_DONTWAIT
from .fastwire import (STOP_FULL, STOP_SLOW, _decode_canonical, _keep_seq_ts, _send_posterior,
                       _stop_no_message, recv_message)

__all__ = ["serve_lane", "LANE_STATUS"]

#: the fields of :func:`serve_lane`'s ``status`` array
LANE_STATUS = ("why", "n_frames", "errno", "emitted", "sent")


@jit
def serve_lane(fn_recv, fn_getsockopt, fn_errno, fn_send, in_sock, out_sock, max_messages,
               n_features, topic, next_seq, frames, frame_len, seq, ts_text, ts_len, values,
               value_bytes, pend_seq, pend_text, pend_len, pend_head, pend_t0, pend_n,
               ring, capacity, t, seq_start, window, lag, hist, mean, scale, weights, layout, W,
               version, Z, cs, zs, xw, hidden, info, tau, theta, rho, out_mean, out_version,
               out_flags, header, payload, send_status, status, json_prefix):
    """Receive the next samples of one stream, recognise them, publish their posteriors.

    Parameters
    ----------
    fn_recv, fn_getsockopt, fn_errno, fn_send : int
        Addresses of libzmq's functions (:mod:`._libzmq`).
    in_sock, out_sock : int
        The SUB and the XPUB sockets' ``void *``.
    max_messages, n_features : int
        K (at most the rows of the buffers, and of the engine's scratch) and D.
    topic : ndarray of uint8, shape (L,)
        The stream's topic.
    next_seq : int
        The sequence number the next sample must have.
    frames, frame_len :
        Receive scratch (:func:`.fastwire.recv_samples`); on STOP_SLOW it holds the
        message that stopped the call.
    seq, ts_text, ts_len, values, value_bytes :
        Out: the samples received, rows ``0 .. k-1`` (as :func:`.fastwire.recv_samples`).
    pend_seq, pend_text, pend_len : ndarray
        The stream's pending (seq, ts text, ts length) FIFO arrays; entries
        ``pend_head .. pend_head + pend_n - 1`` are positions ``pend_t0 …``.
    ring … info :
        The engine's block-kernel state, from ``ring`` to ``hidden`` and ``info``
        (:func:`~streamfhmm.kernels.online.recognition_block`; ``t`` is the position of
        the first sample received).
    tau, theta, rho, out_mean, out_version, out_flags :
        Out: the posteriors emitted (rows ``0 .. ne-1``), shapes ``(K,)``, ``(K, M)``,
        ``(K, D)``.
    header, payload, send_status :
        Send scratch and ``[errno, dropped]`` (:meth:`.zmq.ZmqSink.send_scratch`).
    status : ndarray of int64, shape (5,)
        Out: ``[why, n_frames, errno, ne, sent]`` — why the receive stopped (STOP_FULL,
        STOP_EMPTY, STOP_SLOW with the message's ``n_frames`` in the scratch,
        STOP_ERROR with ``errno``), the posteriors emitted and those sent (a send error
        leaves its errno in ``send_status[0]`` and stops the sending).
    json_prefix : ndarray of uint8
        Empty: binary output; else JSON output, each message beginning so
        (:func:`.fastwire.send_posteriors`).

    Returns
    -------
    int
        k, the samples received, recognised and written to the engine's ring.

    Notes
    -----
    The output message of posterior τ repeats the sequence number and time-stamp text
    of sample τ: from this call's rows when ``τ ≥ t``, else from the pending FIFO
    (``seq`` -1 and ``ts`` 0 when absent, as the service's general path does).
    """
    more = np.zeros(2, np.int64)
    parsed = np.zeros(3, np.int64)
    for i in range(status.shape[0]):
        status[i] = 0
    status[0] = STOP_FULL
    send_status[0] = 0
    send_status[1] = 0
    L = topic.shape[0]
    k = 0
    while k < max_messages:
        n_frames, err = recv_message(fn_recv, fn_getsockopt, fn_errno, in_sock, frames, frame_len,
                                     ZMQ_DONTWAIT, more)
        if n_frames <= 0:
            _stop_no_message(n_frames, err, status)
            break
        ok = (_decode_canonical(frames, frame_len, n_frames, n_features, values[k], value_bytes[k], parsed)
              and parsed[0] == next_seq + k and frame_len[0] == L)
        if ok:
            for i in range(L):
                if frames[0, i] != topic[i]:
                    ok = False
                    break
        if not ok:
            status[0] = STOP_SLOW
            status[1] = n_frames
            break
        _keep_seq_ts(frames, parsed, k, seq, ts_text, ts_len)
        k += 1
    if k == 0:
        return 0
    ne = recognition_block(values[:k], ring, capacity, t, seq_start, window, lag, hist, mean, scale,
                           weights, layout, W, version, 0, Z, cs, zs, xw, hidden, tau, theta, rho,
                           out_mean, out_version, out_flags, info)
    status[3] = ne
    absent = np.zeros(1, np.uint8)
    absent[0] = 48                         # "0"
    sent = 0
    for i in range(ne):
        p = tau[i]
        if p >= t:
            j = p - t
            r = _send_posterior(fn_send, fn_errno, out_sock, topic, seq[j], p, ts_text[j], ts_len[j],
                                out_version[i], out_flags[i], theta[i], rho[i], out_mean[i], header,
                                payload, send_status, json_prefix)
        elif pend_t0 <= p < pend_t0 + pend_n:
            j = pend_head + p - pend_t0
            r = _send_posterior(fn_send, fn_errno, out_sock, topic, pend_seq[j], p, pend_text[j],
                                pend_len[j], out_version[i], out_flags[i], theta[i], rho[i],
                                out_mean[i], header, payload, send_status, json_prefix)
        else:
            r = _send_posterior(fn_send, fn_errno, out_sock, topic, -1, p, absent, 1, out_version[i],
                                out_flags[i], theta[i], rho[i], out_mean[i], header, payload,
                                send_status, json_prefix)
        if r < 0:
            break
        if r == 0:
            send_status[1] += 1
        else:
            sent += 1
    status[4] = sent
    return k
