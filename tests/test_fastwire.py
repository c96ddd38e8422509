"""The compiled wire path (streamfhmm.io.fastwire) against the Python codec it replaces.

The reference is the pure pyzmq path of the same classes (``fast=False``): the same
messages are published to two subscribers, one per path, over real sockets on
127.0.0.1, and everything they decode, count and send must agree.
"""
import time

import numpy as np
import pytest
import zmq

from streamfhmm.io import _libzmq
from streamfhmm.io.wire import (ERROR_KINDS, TS_TEXT_BYTES, Heartbeat, Sample, SampleRun, encode_heartbeat, encode_sample,
                                max_frame_bytes)
from streamfhmm.io.zmq import ZmqSink, ZmqSource
from streamfhmm.stream.engine import PosteriorBatch

pytestmark = pytest.mark.skipif(_libzmq.functions() is None,
                                reason="libzmq's functions are not reachable from this pyzmq")

D = 3


@pytest.fixture
def pair():
    """A PUB and two sources subscribed to it: the compiled path and the Python one."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    fast = ZmqSource(f"tcp://127.0.0.1:{port}", D, hwm=0, context=ctx)
    slow = ZmqSource(f"tcp://127.0.0.1:{port}", D, hwm=0, context=ctx, fast=False)
    assert fast.fast and not slow.fast
    # handshake: publish probes until both have one (no sleep-based synchronisation)
    deadline = time.monotonic() + 20
    got = [False, False]
    while not all(got):
        assert time.monotonic() < deadline, "subscribers did not connect"
        pub.send_multipart([b"probe", b'{"heartbeat":true,"seq":-1,"ts":0}', b""])
        for i, s in enumerate((fast, slow)):
            if s.socket.poll(10):
                s.recv_ready(1000)
                got[i] = True
    for s in (fast, slow):   # drain late probes, forget the probe stream
        while s.socket.poll(50):
            s.recv_ready(1000)
        s.streams.clear()
    yield pub, fast, slow
    fast.close(0)
    slow.close(0)
    pub.close(0)
    ctx.term()


def _drain(source, n_expected_end, method):
    """Items from a source until the end heartbeat of topic b"end" arrives."""
    out = []
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "the end marker did not arrive"
        if not source.socket.poll(100):
            continue
        items = method(source)
        for it in items:
            if type(it) is Heartbeat and it.topic == b"end":
                out.extend(items[:items.index(it)])
                return out
        out.extend(items)


def _expand(items):
    """Runs as one Sample each, so that both paths compare item by item."""
    out = []
    for it in items:
        if type(it) is SampleRun:
            out.extend(it.samples())
        else:
            out.append(it)
    return out


def _same(a, b):
    assert len(a) == len(b), (len(a), len(b))
    for x, y in zip(a, b):
        assert type(x) is type(y), (x, y)
        if type(x) is Sample:
            assert (x.topic, x.seq, x.ts) == (y.topic, y.seq, y.ts), (x, y)
            np.testing.assert_array_equal(x.values, y.values)
        else:
            assert x == y


def _headers():
    """Headers on and just off the canonical form, with what the payload must be."""
    return [b'{"seq":0,"ts":0}', b'{"seq":7,"ts":1.5}', b'{"seq":8,"ts":-0.25}', b'{"seq":9,"ts":1e3}',
            b'{"seq":10,"ts":1E-300}', b'{"seq":11,"ts":2.5e+10}', b'{"seq":12,"ts":1764127792.1234567}',
            b'{"seq":13,"ts":123456789012345678901234567890.5}',       # 32 characters: too long
            b'{"seq":14,"ts":1e999}',                                   # not finite
            b'{"seq":15,"ts":1e276}', b'{"seq":16,"ts":1e277}', b'{"seq":17,"ts":-1e-999}',
            b'{"seq":999999999999999999,"ts":1}',                       # 18 digits
            b'{"seq":9223372036854775807,"ts":1}',                     # 19 digits: 2**63 - 1
            b'{"seq":9223372036854775808,"ts":1}',                     # 2**63: refused
            b'{"seq":012,"ts":1}', b'{"seq":19,"ts":01}', b'{"seq":20,"ts":1.}', b'{"seq":21,"ts":.5}',
            b'{"seq":22,"ts":1e}', b'{"seq":23,"ts":1}x', b'{"seq":24,"ts":1} ', b'{"seq": 25,"ts":1}',
            b'{"ts":1,"seq":26}', b'{"seq":27,"ts":1,"extra":2}', b'{"seq":-1,"ts":1}', b'{"seq":28,"ts":true}',
            b'{"seq":29,"ts":"1"}', b'{"seq":30}', b'{"seq":31,"ts":NaN}', b'{"seq":32,"ts":1', b'']


def test_headers_decode_as_in_python(pair):
    pub, fast, slow = pair
    seed = 20261126
    print("seed", seed)
    rng = np.random.default_rng(seed)
    for h in _headers():
        pub.send_multipart([b"h", h, rng.normal(size=D).tobytes()])
    pub.send_multipart(encode_heartbeat(b"end", 0, 0.0, end=True))
    a = _drain(fast, 1, lambda s: s.recv_runs(64))
    b = _drain(slow, 1, lambda s: s.recv_ready(64))
    _same(_expand(a), b)
    assert fast.errors == slow.errors and sum(fast.errors.values()) > 5
    assert any(type(it) is SampleRun for it in a)   # the canonical ones took the compiled path
    # the time stamps of runs keep their text, which parses to what Python parsed
    for it in a:
        if type(it) is SampleRun:
            assert it.ts_text.shape[1] == TS_TEXT_BYTES
            assert all(m <= TS_TEXT_BYTES for m in it.ts_len.tolist())


def _random_traffic(rng, n):
    """Frames of n messages: samples of three topics (with gaps, repeats and restarts),
    heartbeats, JSON samples, every kind of malformed message, NaN and odd topics."""
    seqs = {b"a": 0, b"bb": 0, "\u00e9t\u00e9".encode(): 0}
    out = []
    for _ in range(n):
        u = rng.random()
        topic = list(seqs)[int(rng.integers(len(seqs)))]
        x = rng.normal(size=D)
        if u < 0.80:
            if rng.random() < 0.05:
                x[int(rng.integers(D))] = np.nan
            r = rng.random()
            if r < 0.02:
                seqs[topic] += int(rng.integers(2, 5))       # a gap
            elif r < 0.03:
                seqs[topic] = max(0, seqs[topic] - 3)        # repeats (stale)
            elif r < 0.035:
                seqs[topic] = 0                              # a restart
            out.append(encode_sample(topic, seqs[topic], float(rng.normal() * 1e9), x))
            seqs[topic] += 1
        elif u < 0.84:
            out.append(encode_heartbeat(topic, seqs[topic] - 1, 1.0))
        elif u < 0.88:
            out.append(encode_sample(topic, seqs[topic], 2.0, x, format="json"))
            seqs[topic] += 1
        elif u < 0.89:   # a sample without a value (the Python decoder's)
            out.append(encode_sample(topic, seqs[topic], 3.0, np.full(D, np.nan)))
            seqs[topic] += 1
        else:
            bad = [[topic, b'{"seq":1,"ts":0}'],
                   [topic, b'{"seq":1,"ts":0}', x.tobytes(), b"x"],
                   [b"\xff\xfe", b'{"seq":1,"ts":0}', x.tobytes()],
                   [topic, b"not json", x.tobytes()],
                   [topic, b'{"seq":"x","ts":0}', x.tobytes()],
                   [topic, b'{"seq":1,"ts":0}', x.tobytes()[:-8]],
                   [topic, b'{"seq":1,"ts":0}', np.array([1.0, np.inf, 0.0]).tobytes()],
                   [b"x" * 256, b'{"seq":1,"ts":0}', x.tobytes()],
                   [b'{"topic":"a","seq":1,"ts":1,"values":[1,2]}']]
            out.append(bad[int(rng.integers(len(bad)))])
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 7, 500])
def test_random_traffic_decodes_and_counts_as_in_python(pair, seed, batch):
    print("seed", seed)
    pub, fast, slow = pair
    rng = np.random.default_rng(seed)
    for frames in _random_traffic(rng, 3000):
        pub.send_multipart(frames)
    pub.send_multipart(encode_heartbeat(b"end", 0, 0.0, end=True))
    a = _drain(fast, 1, lambda s: s.recv_runs(batch))
    b = _drain(slow, 1, lambda s: s.recv_ready(batch))
    _same(_expand(a), b)
    assert fast.errors == slow.errors
    assert all(fast.errors[k] > 0 for k in ERROR_KINDS)
    fs = {k: v for k, v in fast.streams.items() if k != b"end"}
    ss = {k: v for k, v in slow.streams.items() if k != b"end"}
    assert fs == ss
    assert sum(st.gaps for st in fs.values()) > 0 and sum(st.stale for st in fs.values()) > 0
    runs = [it for it in a if type(it) is SampleRun]
    assert runs and (batch == 1 or max(len(r) for r in runs) > 1)
    for r in runs:   # a run is one topic with consecutive sequence numbers
        assert np.all(np.diff(r.seq) == 1)


def test_views_stay_valid_across_slow_messages(pair):
    """copy=False runs of one call are not overwritten by the same call's later samples."""
    pub, fast, _ = pair
    for seq in range(40):
        pub.send_multipart(encode_sample(b"v", seq, float(seq), np.full(D, float(seq))))
        if seq % 5 == 4:
            pub.send_multipart(encode_heartbeat(b"v", seq, 0.0))     # stops the compiled call
    pub.send_multipart(encode_heartbeat(b"end", 0, 0.0, end=True))
    seqs, firsts, most = [], [], 0

    def read(source):
        # check the views of one call right after it, before the next call reuses the rows
        nonlocal most
        items = source.recv_runs(1000, copy=False)
        runs = [it for it in items if type(it) is SampleRun]
        most = max(most, len(runs))
        for r in runs:
            seqs.extend(r.seq.tolist())
            firsts.extend(r.values[:, 0].tolist())
        return items

    _drain(fast, 1, read)
    assert seqs == list(range(40)) and firsts == [float(v) for v in range(40)]
    assert most >= 2      # some call returned several runs split by heartbeats


def test_buffers_hold_the_largest_frames():
    src = ZmqSource("tcp://127.0.0.1:1", D, subscribe=False)
    try:
        b = src._alloc(4)
        assert b["frames"].shape[1] == max_frame_bytes(D) + 1
        assert b["value_bytes"].shape == (4, 8 * D)
        assert np.shares_memory(b["values"], b["value_bytes"])
    finally:
        src.close(0)


def _posterior_batch(rng, n, M, t0=0):
    theta = rng.random((n, M))
    theta[0, 0] = np.nan    # non-finite values travel as they are in binary
    return PosteriorBatch(np.arange(t0, t0 + n, dtype=np.int64), theta, rng.normal(size=(n, M)),
                          rng.normal(size=(n, D)), rng.integers(0, 10**12, n), rng.integers(0, 8, n))


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_send_block_sends_what_python_sends(fmt):
    seed = 7
    print("seed", seed)
    rng = np.random.default_rng(seed)
    ctx = zmq.Context()
    sinks = [ZmqSink("tcp://127.0.0.1:*", context=ctx, format=fmt),
             ZmqSink("tcp://127.0.0.1:*", context=ctx, fast=False, format=fmt)]
    assert sinks[0].fast and not sinks[1].fast
    subs = []
    for s in sinks:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVTIMEO, 10_000)       # a lost message fails the test, not hangs it
        sub.connect(s.endpoint)
        sub.subscribe(b"")
        subs.append(sub)
    try:
        for s in sinks:
            assert s.wait_for_subscribers(1, timeout=20)
        n, M = 50, 4
        batch = _posterior_batch(rng, n, M, t0=10**15)
        if fmt == "json":
            batch.rho[5, 1] = np.inf     # JSON writes null for it: the slow encoder's path
        seq = rng.integers(-1, 2**62, n)
        ts = np.concatenate([rng.normal(size=n - 3) * 10.0 ** rng.integers(-300, 300, n - 3),
                             [0.0, -0.0, 1764127792.1234567]])
        text = np.zeros((n, TS_TEXT_BYTES), np.uint8)
        tlen = np.zeros(n, np.int64)
        for i, v in enumerate(ts.tolist()):
            r = b"%r" % v
            text[i, :len(r)] = np.frombuffer(r, np.uint8)
            tlen[i] = len(r)
        for s in sinks:
            assert s.send_block(b"topic/1", seq, text, tlen, batch) == n
            assert s.sent == n and s.dropped == 0
        got = [[sub.recv_multipart() for _ in range(n)] for sub in subs]
        assert got[0] == got[1]
        assert len(got[0][0]) == (3 if fmt == "binary" else 1)
    finally:
        for sub in subs:
            sub.close(0)
        for s in sinks:
            s.close(0)
        ctx.term()


def test_truncated_frames_go_to_python_without_reading_past_the_buffer(pair):
    """Frames longer than the scratch (which MAXMSGSIZE prevents in a ZmqSource) are
    truncated by libzmq; the kernel then leaves the message to Python."""
    from streamfhmm.io.fastwire import STOP_SLOW, recv_samples
    pub, fast, _ = pair
    long_header = b'{"seq":1,"ts":' + b"1" * 60 + b"}"
    pub.send_multipart([b"t", long_header, np.zeros(D).tobytes()])
    pub.send_multipart(encode_heartbeat(b"end", 0, 0.0, end=True))
    assert fast.socket.poll(5000)
    K, cap = 4, 40
    values = np.zeros((K, D))
    frames = np.zeros((4, cap), np.uint8)
    frame_len = np.zeros(4, np.int64)
    status = np.zeros(4, np.int64)
    lib = _libzmq.functions()
    deadline = time.monotonic() + 10
    k = 0
    while status[0] != STOP_SLOW and time.monotonic() < deadline:
        k = recv_samples(lib.recv, lib.getsockopt, lib.errno, fast.socket.underlying, K, D, frames, frame_len,
                         np.zeros((K, 256), np.uint8), np.zeros(K, np.int64), np.zeros(K, np.int64),
                         np.zeros((K, TS_TEXT_BYTES), np.uint8), np.zeros(K, np.int64), values,
                         values.view(np.uint8).reshape(K, 8 * D), np.zeros(K + 1, np.int64), status)
    assert k == 0 and status[0] == STOP_SLOW and status[1] == 3
    assert frame_len[1] == len(long_header) > cap
