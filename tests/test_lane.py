"""The serving lane (streamfhmm.io.lane) against the service's general path.

Two services with the same model read the same published traffic over real sockets on
127.0.0.1, one with the lane and one without (``lane=False``: ``recv_runs``, the
engine's ``push_many``/``push``, ``send_block``); every output message must be the same
bytes, and the counters, the sequence bookkeeping, the learner's subchains and the
checkpoint records must agree.
"""
import json
import os
import time

import numpy as np
import pytest
import zmq

import streamfhmm.service as service_module
from streamfhmm import FHMM
from streamfhmm.io import _libzmq
from streamfhmm.io.wire import encode_heartbeat, encode_sample
from streamfhmm.io.zmq import ZmqSink, ZmqSource
from streamfhmm.model import FHMMParams
from streamfhmm.network import RecognitionNet
from streamfhmm.service import StreamService, warm_lane
from streamfhmm.stream.engine import StreamEngine

pytestmark = pytest.mark.skipif(_libzmq.functions() is None,
                                reason="libzmq's functions are not reachable from this pyzmq")

D = 3


@pytest.fixture(autouse=True)
def watchdog():
    import faulthandler
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _model_and_net(seed, mode="smooth"):
    print(f"model/net seed={seed}")
    p = FHMMParams.random(3, D, random_state=seed, noise=0.5, switch=(0.05, 0.3))
    model = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=5, n_hidden=6)
    X, _ = model.sample(500, random_state=seed)
    net = RecognitionNet(3, D, window=5, n_hidden=6,
                         mode="centred" if mode == "smooth" else "causal").init(random_state=seed)
    net.weights = 0.6 * np.random.default_rng(seed).standard_normal(net.n_weights)
    return model, net.fit_scaler(X)


def _traffic(rng, n, topics=(b"s",), ends=True):
    """Frames of n messages, mostly the next canonical sample of a topic, with NaN
    values, gaps, repeats, restarts, heartbeats, end heartbeats (unless not ``ends``),
    JSON samples and malformed messages of several kinds."""
    seqs = dict.fromkeys(topics, 0)
    out = []
    for _ in range(n):
        topic = topics[int(rng.integers(len(topics)))]
        x = rng.normal(size=D)
        u = rng.random()
        if u < 0.90:
            if rng.random() < 0.05:
                x[int(rng.integers(D))] = np.nan
            elif rng.random() < 0.01:
                x[:] = np.nan   # a sample without a value
            r = rng.random()
            if r < 0.01:
                seqs[topic] += int(rng.integers(2, 5))       # a gap
            elif r < 0.015:
                seqs[topic] = max(0, seqs[topic] - 3)        # repeats (stale)
            elif r < 0.017:
                seqs[topic] = 0                              # a restart
            ts = float(np.round(rng.normal() * 1e9, int(rng.integers(0, 7))))
            out.append(encode_sample(topic, seqs[topic], ts, x))
            seqs[topic] += 1
        elif u < 0.92:
            out.append(encode_heartbeat(topic, seqs[topic] - 1, 1.0))
        elif u < 0.925:
            out.append(encode_heartbeat(topic, seqs[topic] - 1, 1.0, end=ends))
        elif u < 0.95:
            out.append(encode_sample(topic, seqs[topic], 2.5, x, format="json"))
            seqs[topic] += 1
        else:
            bad = [[topic, b'{"seq":1,"ts":0}'],
                   [topic, b"not json", x.tobytes()],
                   [topic, b'{"seq":1,"ts":0}', x.tobytes()[:-8]],
                   [topic, b'{"seq":1,"ts":0}', np.array([1.0, np.inf, 0.0]).tobytes()]]
            out.append(bad[int(rng.integers(len(bad)))])
    return out


class _Side:
    """A source, a sink, a service and a consumer of its output."""

    def __init__(self, ctx, port, model, net, lane, batch, ckpt_dir, fmt, mode, engine_kw=None):
        self.source = ZmqSource(f"tcp://127.0.0.1:{port}", D, hwm=0, context=ctx)
        self.sink = ZmqSink("tcp://127.0.0.1:*", format=fmt, hwm=0, context=ctx)
        self.out = ctx.socket(zmq.SUB)
        self.out.setsockopt(zmq.RCVHWM, 0)
        self.out.connect(self.sink.endpoint)
        self.out.subscribe(b"")
        self.fed = {}

        def factory(topic):
            eng = StreamEngine(model, mode=mode, learn=True, net=net, learner_duty=1e-3, random_state=0,
                               **(engine_kw or {}))
            got = self.fed.setdefault(topic, [])
            if eng._learner is not None:   # (a cold start's comes with its model)
                eng._learner.feed = lambda seg, t: got.append((t, seg.copy()))
            return eng

        self.svc = StreamService(self.source, self.sink, factory, heartbeat_interval=0, batch_size=batch,
                                 lane=lane, batch_wait=0, checkpoint_dir=ckpt_dir, checkpoint_every=97,
                                 resume_engine=StreamEngine.resume)
        self.messages = []

    def collect(self):
        while self.out.poll(0):
            self.messages.append(self.out.recv_multipart())

    def close(self):
        self.svc.shutdown()
        self.source.close(0)
        self.sink.close(0)
        self.out.close(0)


@pytest.fixture
def sides(tmp_path):
    made = []

    def make(model, net, batch, fmt="binary", mode="smooth", engine_kw=None):
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        a = _Side(ctx, port, model, net, True, batch, str(tmp_path / "lane"), fmt, mode, engine_kw)
        b = _Side(ctx, port, model, net, False, batch, str(tmp_path / "general"), fmt, mode, engine_kw)
        made.append((ctx, pub, a, b))
        for s in (a, b):
            assert s.sink.wait_for_subscribers(1, timeout=30)
        # handshake: probes on an unrelated topic until both sources have one
        deadline = time.monotonic() + 20
        got = [False, False]
        while not all(got):
            assert time.monotonic() < deadline, "subscribers did not connect"
            pub.send_multipart(encode_heartbeat(b"probe", 0, 0.0))
            for i, s in enumerate((a, b)):
                if s.source.socket.poll(10):
                    s.svc.read()
                    got[i] = True
        return pub, a, b

    yield make
    for ctx, pub, a, b in made:
        a.close()
        b.close()
        pub.close(0)
        ctx.term()


def _counters(side) -> dict:
    """The service's counters but ``checkpoints``: a checkpoint falls after the read batch
    that crosses ``checkpoint_every``, and where reads split the input depends on how far
    the socket's I/O thread has delivered it, so the two sides may write one more or fewer
    (their records are checked against their own output instead)."""
    return {k: v for k, v in side.svc.counters.items() if k != "checkpoints"}


def _run(pub, sides, frames):
    for f in frames:
        pub.send_multipart(f)
    pub.send_multipart(encode_heartbeat(b"zz-end", 0, 0.0, end=True))
    deadline = time.monotonic() + 60
    for s in sides:
        while not (b"zz-end" in s.source.streams and s.source.streams[b"zz-end"].ended):
            assert time.monotonic() < deadline, "the traffic did not arrive"
            if s.source.socket.poll(20):
                s.svc.read()
        while len(s.messages) < s.sink.sent:
            assert time.monotonic() < deadline, "the output did not arrive"
            if s.out.poll(20):
                s.collect()


def _parts(m):
    """(header fields, posterior values) of an output message of either format."""
    if len(m) == 3:
        return m[0], json.loads(m[1]), np.frombuffer(m[2], "<f8")
    obj = json.loads(m[0])
    values = np.array(obj.pop("theta") + obj.pop("rho") + obj.pop("mean"))
    return obj.pop("topic").encode(), obj, values


def _same_output(a, b):
    """Same topics and headers (sequence numbers, positions, time stamps, versions,
    flags) exactly; the same posteriors up to rounding: the general path sends a lone
    sample through ``push``, whose scalar network kernel may differ from the block
    kernel's in the last bit."""
    assert len(a) == len(b)
    exact = 0
    for i, (ma, mb) in enumerate(zip(a, b)):
        ta, ha, va = _parts(ma)
        tb, hb, vb = _parts(mb)
        assert (ta, ha) == (tb, hb), f"output message {i} differs"
        if len(ma) == 3:
            assert ma[1] == mb[1], f"output message {i} differs"
        exact += ma == mb
        np.testing.assert_allclose(va, vb, rtol=1e-12, atol=1e-14, err_msg=f"output message {i}")
    print(f"{exact} of {len(a)} messages bit-identical")


def _records_agree_with_output(records, messages):
    """Every checkpoint record's last sequence number and pending (t, seq, ts) are those
    the output headers give for the same positions (those published: the stream's last
    samples wait for more)."""
    at = {}
    for m in messages:
        h = _parts(m)[1]
        at[h["t"]] = (h["seq"], h["ts"])
    assert len(records) > 2
    for rec in records:
        t_next, pending = rec["t_next"], rec["pending"]
        if t_next - 1 in at:
            assert at[t_next - 1][0] == rec["seq"]
        assert [p[0] for p in pending] == list(range(t_next - len(pending), t_next))
        for t, seq, ts in pending:
            assert at.get(t, (seq, ts)) == (seq, ts), f"pending position {t} of record {rec}"
    assert sum(rec["t_next"] - 1 in at for rec in records) > 2


@pytest.mark.parametrize("seed,batch,fmt,mode", [(1, 1, "binary", "smooth"), (2, 7, "binary", "smooth"),
                                                 (3, 64, "binary", "smooth"), (4, 256, "binary", "smooth"),
                                                 (7, 7, "json", "smooth"), (8, 256, "json", "smooth"),
                                                 (9, 7, "binary", "filter"), (10, 64, "json", "filter")])
def test_lane_publishes_what_the_general_path_publishes(sides, seed, batch, fmt, mode, monkeypatch):
    print("seed", seed, "batch", batch, "format", fmt, "mode", mode)
    records = {}
    write = service_module._atomic_write_text

    def keep(path, text):   # every checkpoint record, without its wall-clock time
        rec = json.loads(text)
        rec.pop("time")
        records.setdefault(os.path.dirname(path), []).append(rec)
        write(path, text)

    monkeypatch.setattr(service_module, "_atomic_write_text", keep)
    model, net = _model_and_net(seed, mode)
    pub, a, b = sides(model, net, batch, fmt, mode)
    _run(pub, (a, b), _traffic(np.random.default_rng(seed), 3000))
    assert a.sink.dropped == b.sink.dropped == 0
    assert len(a.messages) == len(b.messages) > 2000
    _same_output(a.messages, b.messages)
    assert _counters(a) == _counters(b)
    assert a.source.errors == b.source.errors and sum(a.source.errors.values()) > 0
    assert a.source.streams == b.source.streams
    assert a.source.streams[b"s"].gaps > 0 and a.svc.counters["ends"] > 0
    assert a.fed.keys() == b.fed.keys()
    for topic in a.fed:
        assert [t for t, _ in a.fed[topic]] == [t for t, _ in b.fed[topic]]
        for (_, x), (_, y) in zip(a.fed[topic], b.fed[topic]):
            np.testing.assert_array_equal(x, y)
    ea, eb = a.svc.streams[b"s"].engine, b.svc.streams[b"s"].engine
    assert ea._t == eb._t and ea._n_samples == eb._n_samples and ea._n_emitted == eb._n_emitted
    assert ea._n_imputed == eb._n_imputed > 0
    np.testing.assert_array_equal(ea._ring.buf, eb._ring.buf)
    assert a.svc.counters["checkpoints"] > 0
    # checkpoints fall after the block that crosses every 97th sample, and blocks differ
    # between the paths: each record must name its pending samples as the output does
    for side in (a, b):
        _records_agree_with_output(records[side.svc.checkpoint_dir], side.messages)
    # the lane took part (it stops at every message that breaks the stream, and the
    # general path reads the rest of that wake-up: here one message in ten)
    assert a.svc.lane_samples > 0.05 * a.svc.counters["samples"] and b.svc.lane_samples == 0


@pytest.mark.parametrize("batch,fmt", [(1, "binary"), (50, "binary"), (50, "json")])
def test_the_lane_takes_an_unbroken_stream(sides, batch, fmt):
    model, net = _model_and_net(6)
    pub, a, b = sides(model, net, batch, fmt)
    X = np.random.default_rng(6).normal(size=(2000, D))
    _run(pub, (a, b), [encode_sample(b"s", i, 1e9 + i / 8, x) for i, x in enumerate(X)])
    _same_output(a.messages, b.messages)
    assert _counters(a) == _counters(b) and a.svc.counters["samples"] == 2000
    # all but the first read's samples (the stream is opened by the general path)
    assert a.svc.lane_samples >= 2000 - batch and b.svc.lane_samples == 0


@pytest.mark.parametrize("batch", [1, 50])
def test_the_lane_leaves_the_warm_ups_last_posteriors_to_the_general_path(sides, batch):
    """A cold start's warm-up posteriors are all flagged warm-up, the last lag's too
    (they come with the samples after the warm-up): the lane, which flags nothing,
    waits for them."""
    pub, a, b = sides(FHMM(n_chains=2, window=5, n_hidden=6), None, batch,
                      engine_kw={"warmup": 200, "warmup_steps": 5})
    X = np.random.default_rng(12).normal(size=(1000, D))
    print("seed=12")
    _run(pub, (a, b), [encode_sample(b"s", i, 1e9 + i, x) for i, x in enumerate(X)])
    for side in (a, b):
        flagged = [_parts(m)[1]["t"] for m in side.messages if _parts(m)[1].get("flags", 0) & 2]
        assert flagged == list(range(200))
    assert a.svc.lane_samples > 500 and b.svc.lane_samples == 0


def test_a_second_topic_moves_the_service_to_the_general_path(sides):
    """The lane serves one stream; with two live ones, every read goes the general way
    (and the output is still the general path's)."""
    model, net = _model_and_net(5)
    pub, a, b = sides(model, net, 32)
    rng = np.random.default_rng(5)
    _run(pub, (a, b), _traffic(rng, 800, ends=False))
    before = a.svc.lane_samples
    assert before > 0
    _run(pub, (a, b), _traffic(rng, 800, topics=(b"s", b"t"), ends=False))
    assert a.svc.lane_samples == before
    _same_output(a.messages, b.messages)
    assert _counters(a) == _counters(b)


@pytest.mark.parametrize("batch", [1, 32])
def test_the_lane_serves_topics_that_come_and_go(sides, batch):
    """Ended streams stay in the table until a new topic needs their place: once a
    second topic had come, the lane was never taken again, however many ended."""
    model, net = _model_and_net(9)
    pub, a, b = sides(model, net, batch)
    rng = np.random.default_rng(9)
    frames, n = [], 0
    for k in range(5):   # five topics in turn, each ending; the second comes back
        topic = b"t%d" % (k if k < 4 else 1)
        first = 300 if k == 4 else 0
        X = rng.normal(size=(300, D))
        frames += [encode_sample(topic, first + i, 1e9 + n + i, x) for i, x in enumerate(X)]
        frames.append(encode_heartbeat(topic, first + 299, 1.0, end=True))
        n += 300
    frames += _traffic(rng, 600, topics=(b"t2", b"t5"))   # and a mixed stretch
    _run(pub, (a, b), frames)
    _same_output(a.messages, b.messages)
    assert _counters(a) == _counters(b) and a.svc.counters["ends"] >= 5
    assert a.source.streams == b.source.streams
    # each topic's samples but its first read's (it is opened by the general path)
    assert a.svc.lane_samples >= 5 * (300 - batch) and b.svc.lane_samples == 0


def test_warm_lane_runs_the_lane_before_any_service_subscribes(caplog):
    """serve compiles the lane at start-up through a throwaway service on inproc sockets,
    which logs nothing (its stream is not the user's) and leaves the service's logger as it was."""
    import logging
    model, net = _model_and_net(11)
    X = np.random.default_rng(11).normal(size=(40, D))
    caplog.set_level(logging.DEBUG, logger="streamfhmm.service")
    for fmt in ("binary", "json"):
        n = warm_lane(lambda topic: StreamEngine(model, learn=False, net=net), X, fmt, timeout=60)
        assert n == 39, fmt   # all but the sample that opens the stream

    def refuse(topic):
        raise ValueError("no engine for this configuration")
    assert warm_lane(refuse, X, "binary", timeout=60) == 0
    assert [r for r in caplog.records if r.name == "streamfhmm.service"] == []
    assert logging.getLogger("streamfhmm.service").filters == []   # nothing left behind


def test_the_last_sequence_number_does_not_stop_the_service(sides):
    """After a sample numbered 2**63 - 1 (the wire's largest) the lane was handed the
    next number, 2**63, which no int64 holds: the OverflowError ended the service."""
    model, net = _model_and_net(11)
    pub, a, b = sides(model, net, 16)
    X = np.random.default_rng(11).normal(size=(300, D))
    last = 2 ** 63 - 1
    seqs = list(range(100)) + [last - 5, last] + list(range(100))   # then the publisher restarts
    _run(pub, (a, b), [encode_sample(b"s", s, 1e9 + i, x) for i, (s, x) in enumerate(zip(seqs, X))])
    _same_output(a.messages, b.messages)
    assert _counters(a) == _counters(b) and a.svc.counters["samples"] == len(seqs)
    assert a.source.streams[b"s"].restarts == b.source.streams[b"s"].restarts == 1
    assert a.svc.lane_samples > 0


@pytest.mark.parametrize("posterior,warmup,lone", [("exact", None, False), ("recognition", 100_000, False),
                                                   ("recognition", None, True)])
def test_a_stream_the_lane_cannot_take_is_read_in_full_batches(posterior, warmup, lone):
    """Exact posteriors, or a cold start's warm-up: the lane cannot take the stream, and
    the service read its input 8 messages at a time (waiting for the lane to apply
    again), 5-7 times slower; with ended streams beside it since the lane serves
    topics that come and go. Nor a lone stream that ended (``lone``: 3,000 heartbeats
    of other topics follow its end)."""
    model, net = _model_and_net(1)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    src = ZmqSource(f"tcp://127.0.0.1:{port}", D, hwm=0, context=ctx)
    snk = ZmqSink("tcp://127.0.0.1:*", hwm=0, context=ctx)

    def factory(topic):
        if warmup:
            return StreamEngine(FHMM(n_chains=3, window=5, n_hidden=6), learn=True, warmup=warmup,
                                random_state=0)
        if posterior == "exact":
            return StreamEngine(model, learn=False, posterior="exact", random_state=0)
        return StreamEngine(model, learn=False, net=net, random_state=0)
    svc = StreamService(src, snk, factory, heartbeat_interval=0, batch_size=256, batch_wait=0)
    calls = []
    recv_runs = src.recv_runs
    src.recv_runs = lambda *a, **k: calls.append(a) or recv_runs(*a, **k)
    try:
        while True:   # connected
            pub.send_multipart(encode_heartbeat(b"probe", 0, 0.0))
            if src.socket.poll(10):
                svc.read()
                break
        rng = np.random.default_rng(1)
        frames = []
        for topic in (b"a",) if lone else (b"a", b"b"):   # topics that end, then one that goes on
            frames += [encode_sample(topic, i, 1.0 + i, x) for i, x in enumerate(rng.normal(size=(20, D)))]
            frames.append(encode_heartbeat(topic, 19, 1.0, end=True))
        if lone:
            frames += [encode_heartbeat(b"x%d" % (i % 50), i, 1.0) for i in range(3020)]
        else:
            frames += [encode_sample(b"c", i, 1e9 + i, x) for i, x in enumerate(rng.normal(size=(3000, D)))]
        for f in frames:
            pub.send_multipart(f)
        pub.send_multipart(encode_heartbeat(b"zz", 0, 0.0, end=True))
        deadline = time.monotonic() + 60
        while not (b"zz" in src.streams and src.streams[b"zz"].ended):
            assert time.monotonic() < deadline, "the traffic did not arrive"
            if src.socket.poll(20):
                svc.read()
        assert svc.counters["samples"] == (20 if lone else 3040) and svc.lane_samples == 0
        assert len(calls) <= 3100 // 256 + 30, len(calls)   # (8 at a time: about 390)
    finally:
        svc.shutdown()
        src.close(0)
        snk.close(0)
        pub.close(0)
        ctx.term()


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_a_sample_without_a_value_keeps_the_stream_whole(sides, fmt):
    """A sample with every value missing was malformed on the wire: its number then
    counted as a gap, which ended the engine's sequence (the lag flushed, edge flags).
    It is a sample: its posterior is published, flagged imputed, and the stream goes on
    (on the lane too: the compiled receive path decodes it)."""
    model, net = _model_and_net(4)
    pub, a, b = sides(model, net, 32, fmt)
    X = np.random.default_rng(4).normal(size=(300, D))
    X[150] = np.nan
    _run(pub, (a, b), [encode_sample(b"s", i, 1e9 + i, x) for i, x in enumerate(X)])
    _same_output(a.messages, b.messages)
    assert _counters(a) == _counters(b) and a.svc.counters["samples"] == 300
    assert a.source.streams[b"s"].gaps == 0 and sum(a.source.errors.values()) == 0
    heads = {h["seq"]: h for _, h, _ in map(_parts, a.messages)}
    assert sorted(heads) == list(range(298))   # (the last two wait in the smoothing lag)
    assert heads[150]["flags"] & 1 and not any(h["flags"] & 4 for s, h in heads.items() if s > 2)
    assert a.svc.lane_samples > 200
