"""The serve loop: in-process with a stand-in engine, and end to end with real processes.

End-to-end tests run ``python -m streamfhmm serve`` / ``replay`` as subprocesses on
127.0.0.1 with free ports. They synchronise through handshakes (XPUB subscription
notifications, ``--wait-subscribers``, output messages), never through sleeps, and
every wait has a timeout.
"""
import collections
import faulthandler
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque

import numpy as np
import pytest
import zmq

from streamfhmm.io.wire import (Heartbeat, PosteriorMessage, decode_output, encode_heartbeat,
                                encode_sample)
from streamfhmm.io.zmq import ZmqSink, ZmqSource
from streamfhmm.service import (_RECORD_TAG, _RECORD_VERSION, CheckpointError, StreamService, _stream_stem,
                                read_stream_record)
from streamfhmm.stream.posterior import FLAG_EDGE, Posterior

from .test_engine import _full_learner_round

SEED = 1234
ANY = "tcp://127.0.0.1:*"


@pytest.fixture(autouse=True)
def watchdog():
    """A per-test timeout: dump every thread's stack and exit if a test hangs."""
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# ==========================================================================================
# a stand-in engine: a lag-h "smoother" whose posterior of t carries sample t's values
# ==========================================================================================
class FakeEngine:
    """``push(x)`` emits the posterior of ``t - lag`` with ``mean = x_{t-lag}`` and
    ``theta = x_{t-lag}[:M]``; a negative first value is refused (ValueError)."""

    def __init__(self, M=2, lag=2, t=0, buf=(), flushes=0):
        self.M, self.lag, self.t = M, lag, t
        self.buf = deque(buf)
        self.flushes = flushes
        self.closed = False

    @property
    def n_samples(self):
        return self.t

    def _post(self, t, x, flags=0):
        return Posterior(t, x[:self.M].copy(), np.zeros(self.M), x.copy(), 1, flags)

    def push(self, x):
        x = np.asarray(x, dtype=np.float64)
        if x[0] < 0:
            raise ValueError("negative first value refused")
        self.buf.append((self.t, x.copy()))
        self.t += 1
        if len(self.buf) > self.lag:
            t, y = self.buf.popleft()
            return [self._post(t, y)]
        return []

    def flush(self):
        self.flushes += 1
        out = [self._post(t, y, FLAG_EDGE) for t, y in self.buf]
        self.buf.clear()
        return out

    def checkpoint(self, path):
        ts = np.array([t for t, _ in self.buf], dtype=np.int64)
        ys = np.array([y for _, y in self.buf]) if self.buf else np.zeros((0, 0))
        np.savez(path, t=self.t, lag=self.lag, M=self.M, ts=ts, ys=ys, flushes=self.flushes)
        return path

    @classmethod
    def resume(cls, path):
        with np.load(path, allow_pickle=False) as f:
            return cls(M=int(f["M"]), lag=int(f["lag"]), t=int(f["t"]),
                       buf=list(zip(f["ts"].tolist(), list(f["ys"]))), flushes=int(f["flushes"]))

    def metrics(self):
        return {"samples": self.t, "learner_steps": 0, "phase": "running"}

    def close(self):
        self.closed = True


class _Batch:
    def __init__(self, posts, M, D):
        n = len(posts)
        self.t = np.array([p.t for p in posts], dtype=np.int64)
        self.theta = np.array([p.theta for p in posts]).reshape(n, M)
        self.rho = np.zeros((n, M))
        self.mean = np.array([p.mean for p in posts]).reshape(n, D)
        self.version = np.ones(n, np.int64)
        self.flags = np.array([p.flags for p in posts], dtype=np.int64)

    def __len__(self):
        return self.t.shape[0]

    def __iter__(self):   # as PosteriorBatch: its posteriors one by one
        for k in range(len(self)):
            yield Posterior(int(self.t[k]), self.theta[k], self.rho[k], self.mean[k],
                            int(self.version[k]), int(self.flags[k]))


class BlockFakeEngine(FakeEngine):
    """With a ``push_many`` (block path) returning a batch of arrays."""

    blocks = 0

    def push_many(self, X):
        if (X[:, 0] < 0).any():
            raise ValueError("negative first value refused; nothing was processed")
        BlockFakeEngine.blocks += 1
        return _Batch([p for x in X for p in self.push(x)], self.M, X.shape[1])


def _handshake(pub, sub=None, timeout=30.0):
    """Wait for a subscription on the XPUB ``pub``.

    A SUB that reconnects (to a restarted service) resends its subscriptions only when
    its owner touches it: poll the consumer's ``sub`` meanwhile.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sub is not None:
            sub.poll(0)
        if pub.poll(20) and pub.recv()[:1] == b"\x01":
            return
    raise AssertionError("the service never subscribed")


class Harness:
    """A service in a thread between a test publisher (XPUB) and a test subscriber."""

    def __init__(self, tmp_path=None, engine=FakeEngine, D=3, checkpoint_every=None, start=True,
                 source_kw=None, run_kw=None, **kw):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)   # report every subscription, repeated or not
        self.pub.bind(ANY)
        self.pub_ep = self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.engine = engine
        self.D = D
        self.tmp_path = tmp_path
        self.checkpoint_every = checkpoint_every
        self.kw = kw
        self.source_kw = source_kw or {}
        self.run_kw = run_kw or {}
        self.sub = None
        if start:
            self.start()

    def start(self):
        self.source = ZmqSource(self.pub_ep, self.D, context=self.ctx, subscribe=False, linger_ms=0,
                                **self.source_kw)
        self.sink = ZmqSink(ANY, context=self.ctx, linger_ms=0)
        if self.sub is not None:   # a restart: follow the service to its new port
            self.sub.disconnect(self.sink_ep)
            self.sub.connect(self.sink.endpoint)
        self.sink_ep = self.sink.endpoint
        kw = dict(heartbeat_interval=0, log_interval=0.0)
        kw.update(self.kw)
        ckpt = None if self.tmp_path is None else str(self.tmp_path / "ckpt")
        self.service = StreamService(self.source, self.sink, lambda topic: self.engine(),
                                     resume_engine=self.engine.resume, checkpoint_dir=ckpt,
                                     checkpoint_every=self.checkpoint_every, wait_subscribers=1, **kw)
        if self.sub is None:
            self.sub = self.ctx.socket(zmq.SUB)
            self.sub.setsockopt(zmq.LINGER, 0)
            self.sub.setsockopt(zmq.RCVHWM, 0)
            self.sub.connect(self.sink_ep)
            self.sub.subscribe(b"")
        self.run_error = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        # handshake: the service subscribes to the input once our subscriber is there
        _handshake(self.pub, self.sub)

    def _run(self):
        try:
            self.service.run(**self.run_kw)
        except BaseException as exc:   # (kept for the test; the thread ends)
            self.run_error = exc
            raise

    def send(self, frames):
        self.pub.send_multipart(frames)

    def sample(self, topic, seq, values):
        self.send(encode_sample(topic, seq, float(seq), values))

    def recv(self, n, timeout=10.0, heartbeats=False):
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            assert left > 0 and self.sub.poll(int(left * 1000)), f"got {len(out)} of {n} messages"
            m = decode_output(self.sub.recv_multipart())
            if heartbeats or type(m) is PosteriorMessage:
                out.append(m)
        return out

    def stop(self):
        self.service.request_stop()
        self.thread.join(20)
        assert not self.thread.is_alive()
        self.source.close(0)
        self.sink.close(0)
        return self.service.metrics()

    def close(self):
        if self.thread.is_alive():
            self.service.request_stop()
            self.thread.join(20)
        for s in (self.pub, self.sub, self.source.socket, self.sink.socket):
            if s is not None and not s.closed:
                s.close(0)
        self.source.close(0)
        self.ctx.term()


@pytest.fixture
def harness():
    made = []

    def make(*args, **kw):
        h = Harness(*args, **kw)
        made.append(h)
        return h
    yield make
    for h in made:
        h.close()
    

def _values(topic_index, seq, D=3):
    return np.array([topic_index * 1000.0 + seq, -seq, 0.5 * seq][:D])


@pytest.mark.parametrize("engine", [FakeEngine, BlockFakeEngine])
def test_every_sample_gets_its_posterior_in_order(engine, harness):
    BlockFakeEngine.blocks = 0
    h = harness(engine=engine, batch_threshold=4)
    N = 300
    for seq in range(N):
        for k, topic in enumerate((b"a", b"b")):
            h.sample(topic, seq, _values(k, seq))
    h.send(encode_heartbeat(b"a", N - 1, 0.0, end=True))
    h.send(encode_heartbeat(b"b", N - 1, 0.0, end=True))
    got = h.recv(2 * N)
    m = h.stop()
    for k, topic in enumerate((b"a", b"b")):
        mine = [g for g in got if g.topic == topic]
        assert [g.seq for g in mine] == list(range(N))
        assert [g.t for g in mine] == list(range(N))
        assert [g.ts for g in mine] == [float(s) for s in range(N)]
        np.testing.assert_array_equal(np.array([g.mean for g in mine]),
                                      np.array([_values(k, s) for s in range(N)]))
        assert [g.flags for g in mine][-2:] == [FLAG_EDGE, FLAG_EDGE]   # flushed at the end
    assert m["samples"] == 2 * N and m["posteriors"] == 2 * N and m["streams"] == 2
    assert m["gaps"] == 0 and m["malformed_total"] == 0 and m["ends"] == 2
    assert m["engines"]["a"]["samples"] == N


@pytest.mark.parametrize("engine", [FakeEngine, BlockFakeEngine])
def test_a_publisher_restarting_at_another_number_is_served_again(engine, harness):
    """A publisher that restarts at 1 (not 0): every later sample was skipped as stale.
    After ``resync_after`` numbers in order behind the last one the stream goes on, as
    a new sequence (the discontinuity flushes the lag)."""
    h = harness(engine=engine, batch_threshold=4, source_kw={"resync_after": 8})
    for seq in range(30):
        h.sample(b"s", seq, _values(0, seq))
    h.recv(28)
    for seq in range(1, 41):
        h.sample(b"s", seq, _values(0, seq))
    h.send(encode_heartbeat(b"s", 40, 0.0, end=True))
    got = h.recv(2 + 33)
    m = h.stop()
    assert [g.seq for g in got] == [28, 29] + list(range(8, 41))
    np.testing.assert_array_equal(np.array([g.mean for g in got[2:]]),
                                  np.array([_values(0, s) for s in range(8, 41)]))
    assert (m["stale"], m["restarts"], m["gaps"]) == (7, 1, 0)


def test_block_path_is_taken_for_runs(harness):
    BlockFakeEngine.blocks = 0
    h = harness(engine=BlockFakeEngine, batch_threshold=4)
    # the service is blocked in nothing: queue a long run before it reads, by sending fast
    N = 2000
    for seq in range(N):
        h.sample(b"s", seq, _values(0, seq))
    h.send(encode_heartbeat(b"s", N - 1, 0.0, end=True))
    got = h.recv(N)
    h.stop()
    assert [g.seq for g in got] == list(range(N))
    np.testing.assert_array_equal(np.array([g.mean for g in got]), np.array([_values(0, s) for s in range(N)]))
    assert BlockFakeEngine.blocks >= 1


def test_malformed_gaps_and_refusals_are_counted_and_skipped(harness):
    h = harness()
    bad = [[b"s", b'{"seq":0,"ts":0}'],
           [b"\xff\xfe", b'{"seq":1,"ts":0}', np.zeros(3).tobytes()],
           [b"s", b"not json", np.zeros(3).tobytes()],
           [b"s", b'{"seq":"x","ts":0}', np.zeros(3).tobytes()],
           [b"s", b'{"seq":1,"ts":0}', np.zeros(4).tobytes()],
           [b"s", b'{"seq":1,"ts":0}', np.array([1, np.inf, 2]).tobytes()]]
    sent = []
    seq = 0
    for rep in range(5):
        for frames in bad:
            h.send(frames)
            h.sample(b"s", seq, _values(0, seq))
            sent.append(seq)
            seq += 1
    h.sample(b"s", seq, [-1.0, 0.0, 0.0])     # refused by the engine
    seq += 1
    seq += 3                                   # a gap of 3
    for _ in range(5):
        h.sample(b"s", seq, _values(0, seq))
        sent.append(seq)
        seq += 1
    h.sample(b"s", 2, _values(0, 2))           # stale
    h.send(encode_heartbeat(b"s", seq - 1, 0.0, end=True))
    got = h.recv(len(sent))
    m = h.stop()
    assert [g.seq for g in got] == sent
    np.testing.assert_array_equal(np.array([g.mean for g in got]), np.array([_values(0, s) for s in sent]))
    assert m["malformed"] == {"frames": 5, "topic": 5, "json": 5, "fields": 5, "size": 5, "nonfinite": 5}
    assert m["engine_rejected"] == 1
    # the refused sample's sequence number was received: the gap is 3
    assert (m["gaps"], m["gap_samples"], m["stale"]) == (1, 3, 1)
    # the gap ends the sequence: the two posteriors in the lag before it are edge-flagged
    i = sent.index(seq - 5)
    assert [g.flags for g in got[i - 2:i]] == [FLAG_EDGE, FLAG_EDGE]


class SteppingEngine(FakeEngine):
    """Reports 7 learner steps per sample pushed."""

    def metrics(self):
        return {"samples": self.t, "learner_steps": 7 * self.t, "phase": "running"}


def test_status_line_reports_learner_steps_and_their_rate(harness):
    h = harness(engine=SteppingEngine)
    for s in range(30):
        h.sample(b"a", s, _values(1, s))
    for s in range(10):
        h.sample(b"b", s, _values(2, s))
    h.recv(28 + 8)
    svc = h.service
    t0 = svc._last_status[0]
    line = svc.status_line(now=t0 + 4.0)
    assert "40 samples (10/s)" in line and "learner steps 280 (70/s)" in line, line
    svc._last_status = (t0 + 4.0, 40, 280)              # as the status loop records it
    for s in range(30, 40):
        h.sample(b"a", s, _values(1, s))
    h.recv(10)
    line = svc.status_line(now=t0 + 6.0)
    assert "learner steps 350 (35/s)" in line, line


class ResumedSteppingEngine(SteppingEngine):
    """As SteppingEngine, from a checkpoint that held 500 learner steps."""

    def metrics(self):
        return {"samples": self.t, "learner_steps": 500 + 7 * self.t, "phase": "running"}


def test_status_line_rate_leaves_out_a_resumed_checkpoints_steps(harness):
    """The total counts a resumed engine's earlier steps; the rate only this run's
    (it divided the checkpoint's steps by this run's first interval)."""
    h = harness(engine=ResumedSteppingEngine)
    for s in range(10):
        h.sample(b"a", s, _values(1, s))
    h.recv(8)
    svc = h.service
    t0 = svc._last_status[0]
    line = svc.status_line(now=t0 + 2.0)
    assert "learner steps 570 (35/s)" in line, line


def test_status_line_rate_after_serve_resumes_a_checkpoint(tmp_path, harness):
    """serve's resume path (a checkpoint directory): the resumed engine's 175 earlier
    steps count in the total, not in this run's rate (which read 4,132/s with no learning)."""
    h = harness(tmp_path, engine=SteppingEngine, checkpoint_every=10)
    for s in range(25):
        h.sample(b"a", s, _values(1, s))
    h.recv(23)
    h.stop()
    h.recv(2)                                      # the lag, flushed by the stop
    h.start()                                      # resumes stream a at t = 25: 175 steps
    svc = h.service
    t0 = svc._last_status[0]
    assert "learner steps 175 (0/s)" in svc.status_line(now=t0 + 2.0)
    for s in range(25, 35):
        h.sample(b"a", s, _values(1, s))
    h.recv(8)
    line = svc.status_line(now=t0 + 2.0)
    assert "learner steps 245 (35/s)" in line, line


def test_status_line_learner_steps_count_retired_and_returning_engines_once(tmp_path, harness):
    """A retired engine's steps stay in the total; when its topic comes back its
    checkpoint's steps are not counted again, nor taken for this run's."""
    h = harness(tmp_path, engine=SteppingEngine, max_streams=1)
    svc = h.service
    t0 = svc._last_status[0]
    got = _a_ends_then_b_retires_it(h, 3)          # a: 21 steps, retired; b: 7
    assert "learner steps 28 (14/s)" in svc.status_line(now=t0 + 2.0)
    got += _end_and_a_comes_back(h, b"b", 0)       # b retired, a resumed: 21 + 14 more
    line = svc.status_line(now=t0 + 2.0)
    assert len(got) == 6 and "learner steps 42 (21/s)" in line, line
    h.stop()
    h.start()                                      # both ended: neither resumed at the start
    svc = h.service
    t0 = svc._last_status[0]
    h.sample(b"b", 1, _values(1, 1))               # b resumed from the first run's 7 steps
    h.send(encode_heartbeat(b"b", 1, 0.0, end=True))
    h.recv(1)
    line = svc.status_line(now=t0 + 7.0)
    assert "learner steps 14 (1/s)" in line, line   # its checkpoint's 7 and this run's 7
    h.stop()


def _wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class WarmupFakeEngine(FakeEngine):
    """A FakeEngine with a warm-up: it emits nothing until WARMUP samples are buffered
    (or a flush ends the warm-up early); ``start_at`` records how many the model was
    started from."""

    WARMUP = 8

    def __init__(self, start_at=-1, **kw):
        super().__init__(**kw)
        self.start_at = start_at

    @property
    def warming_up(self):
        return self.start_at < 0

    def _start(self):
        self.start_at = self.t
        n = max(0, len(self.buf) - self.lag)
        return [self._post(*self.buf.popleft()) for _ in range(n)]

    def push(self, x):
        if not self.warming_up:
            return super().push(x)
        x = np.asarray(x, dtype=np.float64)
        if x[0] < 0:
            raise ValueError("negative first value refused")
        self.buf.append((self.t, x.copy()))
        self.t += 1
        return self._start() if self.t >= self.WARMUP else []

    def flush(self):
        out = self._start() if self.warming_up else []
        return out + super().flush()

    def checkpoint(self, path):
        super().checkpoint(path)
        with np.load(path) as f:
            arrays = dict(f)
        np.savez(path, start_at=self.start_at, **arrays)
        return path

    @classmethod
    def resume(cls, path):
        eng = super().resume(path)
        with np.load(path) as f:
            eng.start_at = int(f["start_at"])
        return eng


@pytest.mark.parametrize("break_kind", ["gap", "refused"])
def test_a_gap_during_the_warm_up_does_not_end_it(break_kind, harness):
    """A lost or refused sample during a warm-up must not flush the engine: that started
    the model from the samples buffered so far (here 3 of 8)."""
    h = harness(engine=WarmupFakeEngine)
    seqs = [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]          # seq 3 lost, or refused
    sent = list(range(11)) if break_kind == "refused" else seqs
    for seq in sent:
        v = _values(0, seq)
        if seq == 3:
            v[0] = -1.0                               # the engine refuses it
        h.sample(b"s", seq, v)
        if seq == 2:                                  # the rest in later reads
            _wait_for(lambda: h.service.metrics()["samples"] == 3)
        if seq == 3:
            _wait_for(lambda: h.service.metrics()["engine_rejected"] == 1)
    got = h.recv(len(seqs) - 2)                       # all but the lag
    eng = h.service.streams[b"s"].engine
    assert eng.start_at == WarmupFakeEngine.WARMUP
    assert [g.seq for g in got] == seqs[:-2]
    m = h.service.metrics()
    assert (m["gaps"], m["engine_rejected"]) == ((1, 0) if break_kind == "gap" else (0, 1))


@pytest.mark.parametrize("then", ["goes on", "stop, checkpoints", "stop, no checkpoints", "retired"])
def test_an_end_during_the_warm_up_does_not_end_it(then, tmp_path, harness):
    """An end heartbeat during a warm-up flushed the engine, as a gap once did: the model
    started from the samples buffered so far (3 of 8), for good. The warm-up now waits:
    for the stream to go on, for the checkpoint at shutdown or retirement that keeps it,
    and without a checkpoint directory the shutdown or the retirement is its samples'
    last chance (the model starts from them, their posteriors come out)."""
    checkpoints = then != "stop, no checkpoints"
    h = harness(tmp_path if checkpoints else None, engine=WarmupFakeEngine,
                **({"max_streams": 1} if then == "retired" else {}))
    for seq in range(3):
        h.sample(b"s", seq, _values(0, seq))
    h.send(encode_heartbeat(b"s", 2, 0.0, end=True))
    _wait_for(lambda: h.service.metrics()["ends"] == 1)
    eng = h.service.streams[b"s"].engine
    assert eng.warming_up and not h.sub.poll(200)       # nothing was emitted
    if then == "goes on":
        for seq in range(3, 10):
            h.sample(b"s", seq, _values(0, seq))
        got = h.recv(8)                                 # all but the lag (2)
        assert eng.start_at == WarmupFakeEngine.WARMUP
        assert [g.seq for g in got] == list(range(len(got)))
        h.stop()
        return
    if then == "retired":     # another topic takes its place: retired with its warm-up kept
        h.sample(b"t", 0, _values(1, 0))
        _wait_for(lambda: b"s" not in h.service.streams)
        assert eng.warming_up and not h.sub.poll(200)
        h.stop()
        rec = read_stream_record(str(tmp_path / "ckpt" / "stream-73.json"))
        assert rec["t_next"] == 3 and [p[1] for p in rec["pending"]] == [0, 1, 2]
        return
    h.stop()
    if checkpoints:
        assert eng.warming_up and not h.sub.poll(200)
        rec = read_stream_record(str(tmp_path / "ckpt" / "stream-73.json"))
        assert rec["t_next"] == 3 and [p[1] for p in rec["pending"]] == [0, 1, 2]
    else:
        assert eng.start_at == 3
        assert [g.seq for g in h.recv(3)] == [0, 1, 2]


class SlowFakeEngine(FakeEngine):
    def push(self, x):
        time.sleep(2e-4)
        return super().push(x)


def test_max_samples_does_not_read_the_queued_input():
    """run(max_samples=N) stops after the read that reaches N: the shutdown no longer
    drains what is still queued (serve --max-samples 1000 served all 20,000 sent)."""
    h = Harness(engine=SlowFakeEngine, batch_size=64, run_kw={"max_samples": 1000})
    try:
        for seq in range(6000):
            h.sample(b"s", seq, _values(0, seq))
        h.thread.join(30)
        assert not h.thread.is_alive()
        m = h.service.metrics()
        assert 1000 <= m["samples"] < 1000 + 64, m["samples"]
        got = h.recv(m["samples"])    # every sample read got its posterior (the lag flushed)
        assert [g.seq for g in got] == list(range(m["samples"]))
    finally:
        h.close()


def test_a_heartbeat_below_two_milliseconds_does_not_spin(harness):
    """The poll's timeout was int(heartbeat / 2 * 1000) ms: 0 below a 2 ms heartbeat, an
    idle loop taking a whole core."""
    h = harness(heartbeat_interval=0.0015)
    t0, c0 = time.monotonic(), time.thread_time()
    cpu0 = time.process_time()
    time.sleep(1.0)
    used = (time.process_time() - cpu0) - (time.thread_time() - c0)
    print(f"service CPU over {time.monotonic() - t0:.2f} s idle: {used:.3f} s")
    assert used < 0.5
    h.stop()


class UnwritableWarmupFakeEngine(WarmupFakeEngine):
    def checkpoint(self, path):
        raise OSError(28, "No space left on device")


class UnwritableFakeEngine(FakeEngine):
    def checkpoint(self, path):
        raise OSError(13, "Permission denied")


def test_a_failed_shutdown_checkpoint_is_always_reported(tmp_path, harness, caplog):
    """The checkpoint at shutdown that fails is logged even within the rate limit of an
    earlier failure (it was dropped: the last words were a clean 'stopped after' line,
    and a restart went back to an older checkpoint), names its stream for serve's exit
    status, and the status line counts the failures."""
    h = harness(tmp_path, engine=UnwritableFakeEngine, checkpoint_every=3, log_interval=60.0)
    for seq in range(4):
        h.sample(b"s", seq, _values(0, seq))
    _wait_for(lambda: h.service.metrics()["checkpoint_failures"] == 1)   # the periodic one
    with caplog.at_level("WARNING", logger="streamfhmm.service"):
        m = h.stop()
    assert m["checkpoint_failures"] == 2 and h.service.final_checkpoint_failures == ["s"]
    final = [r.getMessage() for r in caplog.records if "shutdown checkpoint" in r.getMessage()]
    assert final == ["the shutdown checkpoint of stream 's' failed: [Errno 13] Permission denied; a "
                     "restart resumes it from its last checkpoint written"]
    assert "checkpoints 0 (2 failed), lost on resume" in h.service.status_line()


@pytest.mark.parametrize("checkpoints", ["written", "none", "failing"])
def test_shutdown_leaves_a_warm_up_to_its_checkpoint(checkpoints, tmp_path, harness):
    """With a checkpoint directory, stopping during a warm-up keeps the buffer for the
    next start (the warm-up goes on); without one, or when writing it fails, stopping is
    the samples' last chance: the model starts from them and their posteriors come out."""
    h = harness(None if checkpoints == "none" else tmp_path,
                engine=UnwritableWarmupFakeEngine if checkpoints == "failing" else WarmupFakeEngine)
    for seq in range(5):
        h.sample(b"s", seq, _values(0, seq))
    _wait_for(lambda: h.service.metrics()["samples"] == 5)
    m = h.stop()
    if checkpoints != "written":
        assert m["checkpoint_failures"] == (checkpoints == "failing")
        assert h.service.streams[b"s"].engine.start_at == 5
        assert [g.seq for g in h.recv(5)] == list(range(5))
        return
    assert not h.sub.poll(300)                        # nothing was emitted
    rec = read_stream_record(str(tmp_path / "ckpt" / "stream-73.json"))
    assert rec["t_next"] == 5 and [p[1] for p in rec["pending"]] == list(range(5))
    h.start()
    eng = h.service.streams[b"s"].engine
    assert eng.warming_up and eng.t == 5
    for seq in range(5, 10):
        h.sample(b"s", seq, _values(0, seq))
    h.send(encode_heartbeat(b"s", 9, 0.0, end=True))
    got = h.recv(10)
    h.stop()
    assert eng.start_at == WarmupFakeEngine.WARMUP
    assert [g.seq for g in got] == list(range(10))
    np.testing.assert_array_equal(np.array([g.mean for g in got]), np.array([_values(0, s) for s in range(10)]))


def test_a_long_warm_ups_stream_record_reads_back(tmp_path):
    """A warm-up keeps every sample pending: 600,000 of them make a record above 16 MiB,
    which the reader cut at 16 MiB and then refused as damaged."""
    stem = _stream_stem(b"s")
    (tmp_path / f"{stem}.1.npz").write_bytes(b"")
    n = 600_000
    pending = ",".join(f"[{t},{t},1700000000.{t:06d}]" for t in range(n))
    text = (f'{{"format": "{_RECORD_TAG}", "version": {_RECORD_VERSION}, "topic": "73", "seq": {n - 1}, '
            f'"t_next": {n}, "generation": 1, "file": "{stem}.1.npz", "time": 0.0, "pending": [{pending}]}}')
    assert len(text) > 1 << 24
    path = tmp_path / f"{stem}.json"
    path.write_text(text)
    rec = read_stream_record(str(path))
    assert len(rec["pending"]) == n and rec["pending"][-1][:2] == (n - 1, n - 1)
    assert rec["pending_text"][-1] == b"1700000000.%06d" % (n - 1)


class RepeatingFakeEngine(FakeEngine):
    """With a block path that emits the previous block's last posterior again before
    this block's (an at-least-once host engine); its flush repeats its last one too."""

    last = None
    repeats = 0

    def push_many(self, X):
        posts = [p for x in X for p in self.push(x)]
        if self.last is not None:
            posts.insert(0, self.last)
            self.repeats += 1
        if posts:
            self.last = posts[-1]
        return _Batch(posts, self.M, X.shape[1])

    def flush(self):
        out = super().flush()
        self.repeats += bool(out)
        return out + out[-1:]


def test_posteriors_of_positions_not_pending_are_counted_not_raised(harness):
    """A host engine that emits a position again: that posterior has no pending sample,
    hence no sequence number (seq -1 reached the encoder, whose ValueError ended the
    service's run). It is skipped and counted as ``unmatched``; every sample still gets
    its posterior once."""
    h = harness(engine=RepeatingFakeEngine, batch_threshold=2)
    for chunk in (range(0, 6), range(6, 12)):
        for seq in chunk:
            h.sample(b"s", seq, _values(0, seq))
        time.sleep(0.2)
    h.send(encode_heartbeat(b"s", 11, 0.0, end=True))
    got = h.recv(12)
    m = h.stop()
    assert h.run_error is None                 # (the ValueError ended run)
    assert [g.seq for g in got] == list(range(12))
    repeats = h.service.streams[b"s"].engine.repeats
    assert repeats >= 1 and m["unmatched"] == repeats and m["posteriors"] == 12


def test_max_streams(harness):
    h = harness(max_streams=2)
    for k, topic in enumerate([b"a", b"b", b"c", b"c", b"a"]):
        h.sample(topic, 0 if topic != b"a" or k == 0 else 1, _values(0, 0))
    h.send(encode_heartbeat(b"a", 1, 0.0, end=True))
    got = h.recv(2)
    m = h.stop()
    assert sorted(g.topic for g in got) == [b"a", b"a"]
    assert m["streams"] == 2 and m["streams_full"] == 2


def _posts(got, topic):
    return [(g.seq, g.t) for g in got if g.topic == topic]


def test_a_new_topic_takes_the_place_of_an_ended_stream_which_resumes_when_it_comes_back(
        tmp_path, harness):
    """With max_streams held, a new topic took nothing (every later topic was skipped for
    the service's life): now an ended stream is checkpointed as retired and closed, and
    resumes from that checkpoint when its topic comes back. A stream that has not ended
    keeps its place."""
    h = harness(tmp_path, max_streams=2)
    for seq in range(5):
        h.sample(b"a", seq, _values(0, seq))
    h.send(encode_heartbeat(b"a", 4, 0.0, end=True))
    for seq in range(3):
        h.sample(b"b", seq, _values(1, seq))
    for seq in range(3):
        h.sample(b"c", seq, _values(2, seq))       # a retired
    _wait_for(lambda: h.service.counters["retired"] == 1)
    rec = read_stream_record(str(tmp_path / "ckpt" / "stream-61.json"))
    assert rec["ended"] and (rec["seq"], rec["t_next"], rec["pending"]) == (4, 5, [])
    assert sorted(h.service.streams) == [b"b", b"c"]
    for seq in range(5, 8):
        h.sample(b"a", seq, _values(0, seq))       # no room: b and c have not ended
    h.send(encode_heartbeat(b"b", 2, 0.0, end=True))
    for seq in range(8, 11):
        h.sample(b"a", seq, _values(0, seq))       # b retired; a resumes at t = 5
    h.send(encode_heartbeat(b"a", 10, 0.0, end=True))
    got = h.recv(5 + 3 + 1 + 3)
    m = h.stop()
    got += h.recv(2)                               # c's lag, flushed by the stop
    assert _posts(got, b"a") == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (8, 5), (9, 6), (10, 7)]
    assert _posts(got, b"b") == [(0, 0), (1, 1), (2, 2)]
    assert _posts(got, b"c") == [(0, 0), (1, 1), (2, 2)]
    assert (m["retired"], m["streams_full"], m["lost_on_resume"], m["streams"]) == (2, 3, 3, 2)
    assert ", retired 2, learner steps" in h.service.status_line()
    assert m["gap_samples"] == 0     # (the source followed a's numbers: 5..7 came, skipped)
    recs = {t: read_stream_record(str(tmp_path / "ckpt" / f"stream-{t}.json"))
            for t in ("61", "62", "63")}
    # (a ended: its record at the stop is a retired one too, resumed when it comes back)
    assert [recs[t]["ended"] for t in ("61", "62", "63")] == [True, True, False]
    assert recs["61"]["t_next"] == 8 and recs["62"]["t_next"] == 3


def _end_and_a_comes_back(h, topic, last_seq):
    """End ``topic`` (at ``last_seq``), then samples 3 and 4 of topic a and its end; the
    posteriors of a's two."""
    h.send(encode_heartbeat(topic, last_seq, 0.0, end=True))
    for seq in range(3, 5):
        h.sample(b"a", seq, _values(0, seq))
    h.send(encode_heartbeat(b"a", 4, 0.0, end=True))
    return h.recv(2)


def test_a_retired_stream_is_resumed_when_its_topic_comes_back_not_at_the_start(tmp_path, harness):
    """A restart resumes the streams served at the stop, keeps a retired stream's files
    (not taken for leftovers of an interrupted checkpoint) and resumes it when it returns."""
    h = harness(tmp_path, max_streams=1)
    for seq in range(3):
        h.sample(b"a", seq, _values(0, seq))
    h.send(encode_heartbeat(b"a", 2, 0.0, end=True))
    for seq in range(2):
        h.sample(b"b", seq, _values(1, seq))       # a retired
    got = h.recv(3)
    h.stop()
    got += h.recv(2)
    d = tmp_path / "ckpt"
    files = sorted(os.listdir(d))
    assert len(files) == 4 and read_stream_record(str(d / "stream-61.json"))["ended"]
    h.start()
    assert sorted(h.service.streams) == [b"b"] and sorted(os.listdir(d)) == files
    got += _end_and_a_comes_back(h, b"b", 1)         # b retired, a resumed at t = 3
    m = h.stop()
    assert _posts(got, b"a") == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]
    assert _posts(got, b"b") == [(0, 0), (1, 1)]
    assert (m["retired"], m["streams_full"], m["lost_on_resume"]) == (1, 0, 0)


def test_without_a_checkpoint_directory_a_retired_topic_starts_a_new_engine(harness):
    h = harness(max_streams=1)
    for topic, seqs in ((b"a", range(3)), (b"b", range(3)), (b"a", range(3, 6))):
        for seq in seqs:
            h.sample(topic, seq, _values(0, seq))
        h.send(encode_heartbeat(topic, seqs[-1], 0.0, end=True))
    got = h.recv(9)
    m = h.stop()
    assert _posts(got, b"a") == [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1), (5, 2)]
    assert (m["retired"], m["streams_full"], m["gap_samples"]) == (2, 0, 0)


@pytest.mark.parametrize("retire_idle", [None, 0.0, 3600.0])
def test_retire_idle_lets_a_new_topic_take_the_place_of_an_idle_stream(harness, retire_idle):
    """A publisher that stopped without its end heartbeat held its place for ever; with
    ``retire_idle`` a stream idle that long makes room, its smoothing lag published
    first (edge-padded, as at an end)."""
    h = harness(max_streams=1, retire_idle=retire_idle)
    for seq in range(3):
        h.sample(b"a", seq, _values(0, seq))
    got = h.recv(1)
    for seq in range(3):
        h.sample(b"b", seq, _values(1, seq))
    h.send(encode_heartbeat(b"b", 2, 0.0, end=True))
    if retire_idle == 0.0:
        got += h.recv(2 + 3)
        m = h.stop()
        assert [(g.seq, g.t, g.flags & FLAG_EDGE) for g in got if g.topic == b"a"] == \
            [(0, 0, 0), (1, 1, FLAG_EDGE), (2, 2, FLAG_EDGE)]
        assert _posts(got, b"b") == [(0, 0), (1, 1), (2, 2)]
        assert (m["retired"], m["streams_full"]) == (1, 0)
    else:   # never, or not idle for long enough
        _wait_for(lambda: h.service.counters["streams_full"] == 3)
        m = h.stop()
        assert (m["retired"], m["streams_full"]) == (0, 3)
        assert sorted(h.service.streams) == [b"a"]


def test_the_source_gives_up_the_topics_the_service_retires(tmp_path, harness):
    """The source's table (here room for 2 topics) holds only the topics served: without
    ``forget`` the third topic found it full of the two before and was never served."""
    h = harness(tmp_path, max_streams=1, source_kw={"max_streams": 2})
    got = []
    for topic in (b"a", b"b", b"c", b"d"):      # (one at a time: a read's new topics need room)
        for seq in range(3):
            h.sample(topic, seq, _values(0, seq))
        h.send(encode_heartbeat(topic, 2, 0.0, end=True))
        got += h.recv(3)
    m = h.stop()
    assert sorted({g.topic for g in got}) == [b"a", b"b", b"c", b"d"]
    assert (m["retired"], m["streams_full"]) == (3, 0)


def _a_ends_then_b_retires_it(h, n):
    """Samples 0..n-1 of topic a and its end, then sample 0 of topic b (a single-stream
    service retires a) and its end; the n + 1 posteriors."""
    for seq in range(n):
        h.sample(b"a", seq, _values(0, seq))
    h.send(encode_heartbeat(b"a", n - 1, 0.0, end=True))
    h.sample(b"b", 0, _values(1, 0))
    h.send(encode_heartbeat(b"b", 0, 0.0, end=True))
    return h.recv(n + 1)


def test_a_retired_topic_coming_back_is_sequence_checked_from_its_checkpoint(tmp_path, harness):
    """Its numbers continue the checkpoint's: repeats are skipped as stale (they were
    pushed again and their posteriors published twice) and a gap is counted."""
    h = harness(tmp_path, max_streams=1)
    got = _a_ends_then_b_retires_it(h, 5)
    for seq in (3, 4, 5, 8):                      # 3, 4 repeats; 6, 7 lost
        h.sample(b"a", seq, _values(0, seq))      # b retired, a resumed at t = 5
    h.send(encode_heartbeat(b"a", 8, 0.0, end=True))
    got += h.recv(2)
    m = h.stop()
    assert _posts(got, b"a") == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (8, 6)]
    assert (m["stale"], m["gaps"], m["gap_samples"], m["lost_on_resume"]) == (2, 1, 2, 0)
    assert (m["retired"], m["streams_full"]) == (2, 0)


def test_streams_that_ended_do_not_take_the_room_after_a_restart(tmp_path, harness):
    """At the stop an ended stream is checkpointed as retired: the next start leaves it
    to its topic's return (resumed with ``ended`` lost, the ended streams filled the
    table for the next service's life)."""
    h = harness(tmp_path, max_streams=2)
    for topic in (b"a", b"b"):
        for seq in range(3):
            h.sample(topic, seq, _values(0, seq))
        h.send(encode_heartbeat(topic, 2, 0.0, end=True))
    got = h.recv(6)
    h.stop()
    h.start()
    assert h.service.streams == {}
    for topic, seqs in ((b"c", range(3)), (b"d", range(3)), (b"a", range(3, 6))):
        for seq in seqs:
            h.sample(topic, seq, _values(0, seq))
        h.send(encode_heartbeat(topic, seqs[-1], 0.0, end=True))
    got += h.recv(9)
    m = h.stop()
    assert _posts(got, b"a") == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]
    assert sorted({g.topic for g in got}) == [b"a", b"b", b"c", b"d"]
    assert (m["retired"], m["streams_full"], m["lost_on_resume"]) == (1, 0, 0)


def test_a_restart_with_fewer_max_streams_resumes_the_latest_and_the_rest_on_return(
        tmp_path, harness):
    """All the streams of the directory were resumed at the start, whatever max_streams:
    the most recently checkpointed are; the others wait for their topics."""
    h = harness(tmp_path, max_streams=3)
    for topic in (b"a", b"b", b"c"):
        for seq in range(3):
            h.sample(topic, seq, _values(0, seq))
        _wait_for(lambda: topic in h.service.streams)
        time.sleep(0.01)      # (checkpointed at the stop in this order, a distinct time each)
    h.stop()
    got = h.recv(9)
    h.kw["max_streams"] = 1
    h.start()
    assert sorted(h.service.streams) == [b"c"]
    assert len(os.listdir(tmp_path / "ckpt")) == 6          # (nothing taken for a leftover)
    got += _end_and_a_comes_back(h, b"c", 2)                 # c retired, a resumed at t = 3
    m = h.stop()
    assert _posts(got, b"a") == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]
    assert (m["retired"], m["streams"]) == (1, 1)


def test_a_retired_stream_that_cannot_be_resumed_is_set_aside_and_starts_anew(tmp_path, harness,
                                                                             caplog):
    """Its topic was refused for ever (every message read the record again and failed)."""
    h = harness(tmp_path, max_streams=1)
    got = _a_ends_then_b_retires_it(h, 3)
    d = tmp_path / "ckpt"
    rec = read_stream_record(str(d / "stream-61.json"))
    with open(rec["file"], "wb") as fh:
        fh.write(b"not an engine")
    with caplog.at_level("WARNING", logger="streamfhmm.service"):
        for seq in range(3, 6):
            h.sample(b"a", seq, _values(0, seq))  # b retired; a cannot resume: a new engine
        h.send(encode_heartbeat(b"a", 5, 0.0, end=True))
        got += h.recv(3)
        m = h.stop()
    assert _posts(got, b"a")[3:] == [(3, 0), (4, 1), (5, 2)]
    assert (m["resume_failures"], m["retired"], m["engine_rejected"]) == (1, 2, 0)
    assert (d / "stream-61.json.unusable").exists()
    assert any("cannot be resumed" in r.getMessage() for r in caplog.records)


def test_a_retirement_whose_checkpoint_fails_keeps_the_stream_and_waits_to_try_again(
        tmp_path, harness):
    """It was tried again for every message of a new topic (the whole engine written each
    time)."""
    h = harness(tmp_path, engine=UnwritableFakeEngine, max_streams=1)
    for seq in range(3):
        h.sample(b"a", seq, _values(0, seq))
    h.send(encode_heartbeat(b"a", 2, 0.0, end=True))
    for topic in (b"b", b"c", b"d"):
        h.sample(topic, 0, _values(1, 0))
    _wait_for(lambda: h.service.counters["streams_full"] == 3)
    assert sorted(h.service.streams) == [b"a"]
    assert h.service.counters["checkpoint_failures"] == 2   # (at a's end, and b's one try)
    h.stop()


def _direct_service(tmp_path, engine=FakeEngine, **kw):
    """A service driven by hand: ``feed(*frames)`` decodes messages through its source
    (sequence checks included) and hands them to ``process`` as one read."""
    ctx = zmq.Context()
    src = ZmqSource(ANY, 3, bind=True, context=ctx, linger_ms=0)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    svc = StreamService(src, sink, lambda t: engine(), resume_engine=engine.resume,
                        checkpoint_dir=str(tmp_path / "ckpt"), heartbeat_interval=0, **kw)

    def feed(*frames):
        svc.process([i for i in (src.feed(f) for f in frames) if i is not None])

    def close():
        svc.shutdown()
        src.close(0)
        sink.close(0)
        ctx.term()
    return svc, feed, close


def _s(topic, seq):
    return encode_sample(topic, seq, 0.0, _values(0, seq))


def _end(topic, seq):
    return encode_heartbeat(topic, seq, 0.0, end=True)


def test_a_topic_retired_and_skipped_in_one_read_keeps_its_numbers_checked(tmp_path):
    """The source decodes a whole read before the service handles it: a topic retired,
    then skipped for lack of room, in one read had its bookkeeping dropped while the
    source had already taken later numbers, and its repeats were pushed again."""
    svc, feed, close = _direct_service(tmp_path, max_streams=1)
    try:
        feed(*[_s(b"e", q) for q in range(5)], _end(b"e", 4))
        feed(_s(b"n", 0), _s(b"e", 5))          # e retired for n; e's 5 finds no room
        feed(_end(b"n", 0))
        feed(_s(b"e", 5), _s(b"e", 6), _s(b"e", 9))   # 5 again: stale; 7, 8 lost
        st = svc.streams[b"e"]
        m = svc.metrics(engines=False)
        assert (st.t_next, st.last_seq) == (7, 9)     # 6 and 9 pushed, at positions 5 and 6
        assert (m["stale"], m["streams_full"], m["retired"]) == (1, 1, 2)
    finally:
        close()


def test_an_ended_stream_is_checkpointed_as_ended_at_once(tmp_path):
    """Only the stop wrote it so: after a crash, ended streams were resumed as live and
    held the table again."""
    svc, feed, close = _direct_service(tmp_path)
    try:
        feed(*[_s(b"a", q) for q in range(3)], _end(b"a", 2))
        rec = read_stream_record(str(tmp_path / "ckpt" / "stream-61.json"))
        assert rec["ended"] and (rec["seq"], rec["t_next"], rec["pending"]) == (2, 3, [])
    finally:
        close()


def test_a_failed_retirement_ends_the_attempt(tmp_path):
    """A checkpoint that fails (the directory's, most likely) was tried for every
    candidate, each flushed first, on every new topic's message."""
    svc, feed, close = _direct_service(tmp_path, engine=UnwritableFakeEngine, max_streams=2)
    try:
        for topic in (b"a", b"b"):
            feed(*[_s(topic, q) for q in range(3)], _end(topic, 2))
        assert svc.counters["checkpoint_failures"] == 2   # (their ends)
        feed(_s(b"c", 0))
        assert svc.counters["checkpoint_failures"] == 3 and svc.counters["streams_full"] == 1
        feed(_s(b"d", 0))                                 # the other one
        feed(_s(b"e", 0))                                 # both wait 10 s
        assert svc.counters["checkpoint_failures"] == 4 and svc.counters["streams_full"] == 3
    finally:
        close()


class WideFakeEngine(FakeEngine):
    n_features = 7


def test_a_checkpoint_of_another_width_is_refused_not_set_aside(tmp_path):
    """A service started with the wrong model set such a checkpoint aside for good (and
    its new stream could write over its engine file)."""
    d = tmp_path / "ckpt"
    svc, feed, close = _direct_service(tmp_path)
    feed(*[_s(b"a", q) for q in range(3)], _end(b"a", 2))
    close()
    files = sorted(os.listdir(d))
    svc, feed, close = _direct_service(tmp_path, engine=WideFakeEngine)
    try:
        feed(_s(b"a", 3))
        assert svc.counters["engine_rejected"] == 1 and svc.counters["resume_failures"] == 0
        assert sorted(os.listdir(d)) == files and b"a" not in svc.streams
    finally:
        close()


def test_a_damaged_ended_record_does_not_stop_the_start_and_is_set_aside(tmp_path):
    d = tmp_path / "ckpt"
    svc, feed, close = _direct_service(tmp_path)
    feed(*[_s(b"a", q) for q in range(3)], _end(b"a", 2))
    close()
    rec = read_stream_record(str(d / "stream-61.json"))
    os.remove(rec["file"])                              # a's engine file lost
    FakeEngine().checkpoint(str(d / "stream-62.1.npz"))
    (d / "stream-62.json").write_text(json.dumps(       # b's: a version this one cannot read
        {"format": _RECORD_TAG, "version": 3, "ended": True}))
    svc, feed, close = _direct_service(tmp_path)
    try:
        assert svc.streams == {}
        assert (d / "stream-62.1.npz").exists()        # (not taken for a leftover)
        feed(*[_s(b"a", q) for q in range(3, 5)])       # a starts anew at position 0
        assert svc.streams[b"a"].t_next == 2 and svc.counters["resume_failures"] == 1
        assert (d / "stream-61.json.unusable").exists()
    finally:
        close()
    # a record nested too deep to parse is a CheckpointError (RecursionError escaped)
    (tmp_path / "deep.json").write_text("[" * 100_000)
    with pytest.raises(CheckpointError, match="not a streamfhmm stream checkpoint record"):
        read_stream_record(str(tmp_path / "deep.json"))


def test_a_topic_back_in_the_read_that_evicts_its_numbers_is_followed_again(tmp_path):
    """The source took e's sample, then gave up e's numbers for a new topic later in the
    same read: the service served e with no sequence check (a repeat pushed again)."""
    svc, feed, close = _direct_service(tmp_path, max_streams=1)
    svc.source.max_streams = 2
    try:
        feed(*[_s(b"e", q) for q in range(5)], _end(b"e", 4))
        feed(_s(b"n", 0), _end(b"n", 0))          # e retired for n (released)
        feed(_s(b"e", 5), _s(b"m", 0))            # e back; m evicts e's bookkeeping
        assert b"e" in svc.source.streams         # (followed again from e's 5)
        feed(_s(b"e", 5), _s(b"e", 6), _s(b"e", 9))
        st = svc.streams[b"e"]
        m = svc.metrics(engines=False)
        assert (st.t_next, m["stale"], m["gap_samples"]) == (8, 1, 2)   # 5, 6, 9 once each
    finally:
        close()


def test_after_a_restart_a_late_repeat_of_an_ended_topic_is_stale(tmp_path):
    """An ended stream is not resumed at the start, but the source follows its numbers
    from its checkpoint: a late repeat was taken for a new topic's first sample and
    published a second time."""
    svc, feed, close = _direct_service(tmp_path)
    feed(*[_s(b"a", q) for q in range(5)], _end(b"a", 4))
    close()
    svc, feed, close = _direct_service(tmp_path)
    try:
        assert svc.streams == {}
        feed(_s(b"a", 3), _s(b"a", 5))
        m = svc.metrics(engines=False)
        assert (svc.streams[b"a"].t_next, m["stale"], m["samples"]) == (6, 1, 1)
    finally:
        close()


def test_a_failed_retirement_leaves_a_kept_warm_up_as_it_was(tmp_path):
    """It was left marked ended: its end heartbeat was then ignored, and with a failing
    shutdown checkpoint its samples never got a posterior."""
    svc, feed, close = _direct_service(tmp_path, engine=UnwritableWarmupFakeEngine, max_streams=1,
                                       retire_idle=0.0)
    feed(*[_s(b"w", q) for q in range(4)])        # still warming up
    feed(_s(b"n", 0))                             # w's retirement fails
    assert not svc.streams[b"w"].ended and svc.counters["streams_full"] == 1
    close()
    assert svc.counters["samples"] == 4 and svc.counters["posteriors"] == 4


def _stream_files(d, stem):
    return sorted(f for f in os.listdir(d) if f.startswith(stem + "."))


def test_checkpoint_retain_removes_a_retired_streams_checkpoint_and_its_topic_starts_anew(tmp_path):
    """Without it, every topic ever retired kept a record and an engine file (0.3-0.7 MB
    for the household model) for good: a daemon whose topics come and go filled its disk,
    and read every record at each start."""
    d = tmp_path / "ckpt"
    svc, feed, close = _direct_service(tmp_path, max_streams=1, checkpoint_retain=3600.0)
    try:
        feed(*[_s(b"a", q) for q in range(5)], _end(b"a", 4))
        feed(_s(b"b", 0))                                   # a retired for b
        assert _stream_files(d, "stream-61") == ["stream-61.2.npz", "stream-61.json"]
        svc._housekeeping(time.monotonic())                 # written just now: kept
        assert _stream_files(d, "stream-61") and svc.counters["checkpoints_removed"] == 0
        svc.checkpoint_retain = 0.0                         # (its time has come)
        svc._housekeeping(time.monotonic())
        assert _stream_files(d, "stream-61") == [] and svc.counters["checkpoints_removed"] == 1
        feed(_end(b"b", 0), _s(b"a", 5))                    # a comes back: a new stream at 0
        assert svc.streams[b"a"].t_next == 1 and svc.counters["lost_on_resume"] == 0
        svc._housekeeping(time.monotonic())                 # b retired for a, removed at once
        assert _stream_files(d, "stream-62") == [] and svc.counters["checkpoints_removed"] == 2
        assert _stream_files(d, "stream-61") == []          # (a served: nothing written yet)
        feed(_s(b"a", 3), _s(b"a", 6))                      # a's numbers still followed
        assert svc.streams[b"a"].t_next == 2 and svc.metrics(engines=False)["stale"] == 1
        svc.checkpoint_retain = 3600.0
        feed(_end(b"a", 6))
        feed(_s(b"c", 0))                                   # a retired for c
        feed(_end(b"c", 0))
        feed(_s(b"a", 7))                                   # c for a, which resumes
        assert svc.streams[b"a"].t_next == 3
        svc.checkpoint_retain = 0.0
        svc._housekeeping(time.monotonic())                 # c's removed; a's, served, kept
        assert _stream_files(d, "stream-63") == [] and svc.counters["checkpoints_removed"] == 3
        assert "stream-61.json" in _stream_files(d, "stream-61")
    finally:
        close()
    assert not read_stream_record(str(d / "stream-61.json"))["ended"]   # (a, live at the stop)


def test_checkpoint_retain_inf_keeps_no_note_per_retired_topic(tmp_path):
    """inf (never remove) kept a note per retired topic in memory for ever."""
    d = tmp_path / "ckpt"
    svc, feed, close = _direct_service(tmp_path, max_streams=1, checkpoint_retain=float("inf"))
    try:
        assert svc.checkpoint_retain is None
        for topic in (b"a", b"b", b"c"):
            feed(*[_s(topic, q) for q in range(3)], _end(topic, 2))
        assert svc.counters["retired"] == 2 and svc._retained == {}
        svc._housekeeping(time.monotonic() + 1e9)
        assert _stream_files(d, "stream-61") and _stream_files(d, "stream-62")
    finally:
        close()


def test_checkpoint_retain_at_the_start_removes_old_ended_streams_never_live_ones(tmp_path):
    d = tmp_path / "ckpt"
    svc, feed, close = _direct_service(tmp_path)
    feed(*[_s(b"a", q) for q in range(3)], _end(b"a", 2))  # a ended
    feed(*[_s(b"b", q) for q in range(3)])                 # b live at the stop
    close()
    FakeEngine().checkpoint(str(d / "stream-63.1.npz"))    # c's: a version this one cannot read
    (d / "stream-63.json").write_text(json.dumps({"format": _RECORD_TAG, "version": 3, "ended": True}))
    (d / "stream-64.json.unusable").write_text("{}")      # set aside by an earlier run
    old = time.time() - 7200
    for name in os.listdir(d):                             # all written two hours ago
        os.utime(d / name, (old, old))
    (d / "stream-65.json.unusable").write_text("{}")      # and one just now
    for name in ("stream-61.json", "stream-62.json"):
        rec = json.loads((d / name).read_text())
        rec["time"] = old
        (d / name).write_text(json.dumps(rec))
    svc, feed, close = _direct_service(tmp_path, checkpoint_retain=3600.0)
    try:
        assert sorted(svc.streams) == [b"b"]               # b resumed, however old
        assert sorted(os.listdir(d)) == ["stream-62.1.npz", "stream-62.json", "stream-65.json.unusable"]
        assert svc.counters["checkpoints_removed"] == 2
        feed(_s(b"a", 3))                                  # a starts anew at position 0
        assert svc.streams[b"a"].t_next == 1 and svc.counters["resume_failures"] == 0
    finally:
        close()
    # kept when younger than checkpoint_retain
    svc, feed, close = _direct_service(tmp_path)
    feed(_end(b"a", 3))
    close()
    svc, feed, close = _direct_service(tmp_path, checkpoint_retain=3600.0)
    try:
        assert sorted(svc.streams) == [b"b"] and svc.counters["checkpoints_removed"] == 0
        assert read_stream_record(str(d / "stream-61.json"))["ended"]
    finally:
        close()


def _age_records(d, seconds):
    """Make every record and file in ``d`` read as written ``seconds`` ago."""
    old = time.time() - seconds
    for name in os.listdir(d):
        if name.endswith(".json"):
            rec = json.loads((d / name).read_text())
            rec["time"] = old
            (d / name).write_text(json.dumps(rec))
        os.utime(d / name, (old, old))


def test_an_ended_stream_that_goes_on_is_not_removed_after_a_crash(tmp_path):
    """Its record said "ended" until its next checkpoint (10,000 samples later, by
    default): a crash meanwhile, and a start checkpoint_retain later removed the
    checkpoint of a live stream."""
    import shutil
    svc, feed, close = _direct_service(tmp_path)
    try:
        feed(*[_s(b"a", q) for q in range(5)], _end(b"a", 4))
        assert read_stream_record(str(tmp_path / "ckpt" / "stream-61.json"))["ended"]
        texts = [encode_sample(b"a", q, float(f"{q}.50"), _values(0, q)) for q in (5, 6)]
        feed(*texts)                                        # a goes on
        rec = read_stream_record(str(tmp_path / "ckpt" / "stream-61.json"))
        assert not rec["ended"] and (rec["seq"], rec["t_next"], rec["generation"]) == (4, 5, 1)
        shutil.copytree(tmp_path / "ckpt", tmp_path / "crash" / "ckpt")   # the state at a crash
    finally:
        close()
    _age_records(tmp_path / "crash" / "ckpt", 7200)
    svc, feed, close = _direct_service(tmp_path / "crash", checkpoint_retain=3600.0)
    try:
        assert svc.streams[b"a"].t_next == 5 and svc.counters["checkpoints_removed"] == 0
        feed(_s(b"a", 5))
        assert svc.streams[b"a"].t_next == 6 and svc.metrics(engines=False)["stale"] == 0
    finally:
        close()
    # a warm-up retired (its samples pending in the record), back: the record is written
    # again as it was but for the flag (so its pending samples' time stamps keep the
    # number texts they arrived as)
    d = tmp_path / "warm" / "ckpt"
    svc, feed, close = _direct_service(tmp_path / "warm", engine=WarmupFakeEngine, max_streams=1,
                                       retire_idle=0.0)
    try:
        feed(*[encode_sample(b"w", q, 1e9 + q / 8, _values(0, q)) for q in range(3)])
        feed(_s(b"n", 0))                                   # w retired, its warm-up kept
        raw = (d / "stream-77.json").read_bytes()
        assert b'"ended": true' in raw and len(read_stream_record(str(d / "stream-77.json"))["pending"]) == 3
        feed(_end(b"n", 0))
        feed(_s(b"w", 3))                                   # w back, and it goes on
        assert (d / "stream-77.json").read_bytes() == raw.replace(b'"ended": true', b'"ended": false')
    finally:
        close()


def test_a_checkpoint_set_aside_is_kept_checkpoint_retain_from_then(tmp_path):
    """os.replace keeps a file's time: a checkpoint written long ago and set aside just
    now was removed at the next start."""
    d = tmp_path / "ckpt"
    svc, feed, close = _direct_service(tmp_path)
    feed(*[_s(b"a", q) for q in range(3)], _end(b"a", 2))
    close()
    os.remove(read_stream_record(str(d / "stream-61.json"))["file"])   # a's engine file lost
    _age_records(d, 7200)
    svc, feed, close = _direct_service(tmp_path)
    try:
        feed(_s(b"a", 3))                                  # set aside now
        assert svc.counters["resume_failures"] == 1
    finally:
        close()
    svc, feed, close = _direct_service(tmp_path, checkpoint_retain=3600.0)
    try:
        assert "stream-61.json.unusable" in os.listdir(d)
    finally:
        close()


class PausingFakeEngine(FakeEngine):
    paused = None

    def _pause_learner(self, paused):
        self.paused = paused


def test_the_learner_of_an_ended_stream_is_held_until_it_goes_on(tmp_path):
    """Ended streams stay in the table until a new topic needs their place, their
    learners stepping on: with topics that come and go, three of serve's four learners
    (--max-streams 4) worked for streams that had ended."""
    svc, feed, close = _direct_service(tmp_path, engine=PausingFakeEngine)
    feed(*[_s(b"a", q) for q in range(3)])
    eng = svc.streams[b"a"].engine
    assert eng.paused is None
    feed(_end(b"a", 2))
    assert eng.paused is True
    feed(_s(b"a", 3))                                 # it goes on
    assert eng.paused is False
    feed(_end(b"a", 3))
    close()
    svc, feed, close = _direct_service(tmp_path, engine=PausingFakeEngine)
    try:
        feed(_s(b"a", 4))                             # back from its checkpoint as ended
        assert svc.streams[b"a"].engine.paused is False
        feed(_end(b"a", 4), _s(b"b", 0))
        assert svc.streams[b"a"].engine.paused is True and svc.streams[b"b"].engine.paused is None
    finally:
        close()

    class Unwritable(PausingFakeEngine, UnwritableFakeEngine):
        pass
    svc, feed, close = _direct_service(tmp_path / "failing", engine=Unwritable, max_streams=1,
                                       retire_idle=0.0)
    try:
        feed(*[_s(b"a", q) for q in range(3)])
        feed(_s(b"b", 0))                             # a's retirement fails: a stays, ended
        a = svc.streams[b"a"]
        assert a.ended and a.engine.paused is True and b"b" not in svc.streams
    finally:
        close()


class CountingPauseEngine(PausingFakeEngine):
    learning = True

    def __init__(self):
        super().__init__()
        self.calls = []

    def _pause_learner(self, paused):
        self.calls.append(paused)
        self.paused = paused


def test_the_learner_of_an_idle_stream_is_held_until_its_next_sample(tmp_path):
    """A stream that went quiet without its end heartbeat kept its learner stepping
    (learner_duty of a core) on a reservoir that no longer changed, until retire_idle
    retired it, or for ever: it is held after learn_idle seconds without a sample."""
    svc, feed, close = _direct_service(tmp_path, engine=CountingPauseEngine)
    try:
        feed(*[_s(b"a", q) for q in range(3)])
        feed(*[_s(b"b", q) for q in range(3)], _end(b"b", 2))
        a, b = svc.streams[b"a"].engine, svc.streams[b"b"].engine
        assert svc.learn_idle == 60.0 and a.calls == [] and b.calls == [True]
        t0 = time.monotonic()
        svc._housekeeping(t0 + 59.0)
        assert a.calls == [] and svc.metrics(engines=False)["learners_held"] == 1
        svc._housekeeping(t0 + 61.0)
        assert a.calls == [True] and b.calls == [True]        # (b held once, at its end)
        assert svc.metrics(engines=False)["learners_held"] == 2
        assert ", learners held 2, subscriptions" in svc.status_line()
        svc._housekeeping(t0 + 120.0)
        assert a.calls == [True]
        feed(_s(b"a", 3))                                     # a goes on
        assert a.calls == [True, False] and svc.metrics(engines=False)["learners_held"] == 1
        svc._housekeeping(time.monotonic() + 30.0)
        assert a.calls == [True, False]
    finally:
        close()
    svc, feed, close = _direct_service(tmp_path / "never", engine=CountingPauseEngine,
                                       learn_idle=None)
    try:
        feed(*[_s(b"a", q) for q in range(3)])
        svc._housekeeping(time.monotonic() + 1e6)
        assert svc.streams[b"a"].engine.calls == []
        assert svc.metrics(engines=False)["learners_held"] == 0
    finally:
        close()
    ctx = zmq.Context()
    src, sink = ZmqSource(ANY, 3, bind=True, context=ctx), ZmqSink(ANY, context=ctx)
    try:
        for bad in (0, 0.0, -1.0, "60", True, float("nan")):
            with pytest.raises(ValueError, match="learn_idle must be a number of seconds"):
                StreamService(src, sink, lambda t: FakeEngine(), learn_idle=bad)
    finally:
        src.close(0)
        sink.close(0)
        ctx.term()


def test_an_idle_engine_takes_no_learner_step_until_its_next_sample(tmp_path):
    """The same with a real StreamEngine learning: held, it takes no step (its
    ``learning`` still True); its next sample lets it go on."""
    Engine, X = _real_engine_class(78, learn=True, warmup_steps=0, reservoir_size=50,
                                   snapshot_interval=5, learner_duty=1.0)
    svc, feed, close = _direct_service(tmp_path, engine=Engine, learn_idle=5.0)
    try:
        feed(*[encode_sample(b"a", q, 0.0, X[q]) for q in range(300)])
        eng = svc.streams[b"a"].engine
        _wait_for(lambda: eng.metrics()["learner_steps"] >= 20, 60)
        svc._housekeeping(time.monotonic() + 6.0)
        _full_learner_round(eng)                              # (a round in flight ends)
        n = eng.metrics()["learner_steps"]
        _full_learner_round(eng)
        assert eng.metrics()["learner_steps"] == n and eng.learning
        feed(*[encode_sample(b"a", q, 0.0, X[q]) for q in range(300, 310)])
        _wait_for(lambda: eng.metrics()["learner_steps"] > n, 60)
    finally:
        close()


def _real_engine_class(seed, **kw):
    """A StreamEngine class over a small fitted model (3 features, as the sources of
    these tests), and samples of it."""
    from streamfhmm import FHMM
    from streamfhmm.model import FHMMParams
    from streamfhmm.stream.engine import StreamEngine
    print(f"seed={seed}")
    params = FHMMParams.random(2, 3, random_state=seed)
    model = FHMM.from_params(W=params.W, covariance=params.covariance, transmat=params.transmat,
                             window=3, n_hidden=4)
    X, _ = model.sample(400, random_state=seed)

    class Engine(StreamEngine):
        def __init__(self):
            super().__init__(model, mode="filter", posterior="exact", random_state=seed, **kw)
    return Engine, X


def test_a_retired_stream_unchanged_since_its_end_is_not_checkpointed_again(tmp_path):
    """An ended stream was checkpointed at its end and again at its retirement (and at
    the shutdown), though nothing had changed: under churn that doubled the checkpoint
    traffic (2.9 MB per topic for bench/soak.py's model). The end checkpoint stands
    when the engine is as it was; a change since (here its learner_duty) is written."""
    Engine, X = _real_engine_class(79, learn=False)
    d = tmp_path / "ckpt"
    svc, feed, close = _direct_service(tmp_path, engine=Engine, max_streams=1)
    try:
        feed(*[encode_sample(b"a", q, 0.0, X[q]) for q in range(50)], _end(b"a", 49))
        assert svc.counters["checkpoints"] == 1
        assert svc.metrics(engines=False)["learners_held"] == 0   # (no learner to hold)
        end_file = read_stream_record(str(d / "stream-61.json"))["file"]
        feed(encode_sample(b"b", 0, 0.0, X[0]))             # a retired for b: not written again
        assert svc.counters["retired"] == 1 and svc.counters["checkpoints"] == 1
        rec = read_stream_record(str(d / "stream-61.json"))
        assert rec["ended"] and rec["file"] == end_file and (rec["seq"], rec["t_next"]) == (49, 50)
        feed(_end(b"b", 0))
        svc.streams[b"b"].engine.learner_duty = 0.5         # b changes after its end
        feed(encode_sample(b"a", 50, 0.0, X[50]))           # b retired (written), a resumes
        assert svc.counters["checkpoints"] == 3 and svc.streams[b"a"].t_next == 51
        feed(_end(b"a", 50))
        n = svc.counters["checkpoints"]
    finally:
        close()
    assert svc.counters["checkpoints"] == n                 # (a, unchanged, not at shutdown)
    rec = read_stream_record(str(d / "stream-61.json"))
    assert rec["ended"] and (rec["seq"], rec["t_next"]) == (50, 51)


def test_an_end_checkpoint_kept_is_dated_again_and_needs_its_files(tmp_path):
    """Keeping an ended stream's end checkpoint at its retirement skipped what the
    write did besides: a checkpoint directory removed since was not made again (the
    stream's state lost), and the record kept its end time, so that a start with
    checkpoint_retain removed the checkpoint of a stream served until the stop. The
    engine file is written afresh when the files are gone, the record always."""
    import shutil
    Engine, X = _real_engine_class(82, learn=False)
    d = tmp_path / "ckpt"
    svc, feed, close = _direct_service(tmp_path, engine=Engine, max_streams=1)
    try:
        feed(*[encode_sample(b"a", q, 0.0, X[q]) for q in range(50)], _end(b"a", 49))
        shutil.rmtree(d)
        feed(encode_sample(b"b", 0, 0.0, X[0]))             # a retired: written afresh
        assert svc.counters["checkpoints"] == 2 and _stream_files(d, "stream-61")
        feed(_end(b"b", 0), encode_sample(b"a", 50, 0.0, X[50]))
        assert svc.streams[b"a"].t_next == 51               # (resumed)
    finally:
        close()
    d = tmp_path / "stop" / "ckpt"
    svc, feed, close = _direct_service(tmp_path / "stop", engine=Engine)
    feed(*[encode_sample(b"a", q, 0.0, X[q]) for q in range(50)], _end(b"a", 49))
    _age_records(d, 7200)                                   # ended two hours ago ...
    close()                                                 # ... and served until now
    svc, feed, close = _direct_service(tmp_path / "stop", engine=Engine, checkpoint_retain=3600.0)
    try:
        assert svc.counters["checkpoints_removed"] == 0
        feed(encode_sample(b"a", 50, 0.0, X[50]))
        assert svc.streams[b"a"].t_next == 51
    finally:
        close()


def test_a_learner_step_after_the_end_checkpoint_is_written_at_retirement(tmp_path):
    """A learner round that completes after the end checkpoint changes the engine: its
    retirement writes it, and the topic coming back resumes with those steps."""
    Engine, X = _real_engine_class(80, learn=True, warmup_steps=0, reservoir_size=50,
                                   snapshot_interval=5, learner_duty=1.0)
    svc, feed, close = _direct_service(tmp_path, engine=Engine, max_streams=1)
    try:
        feed(*[encode_sample(b"a", q, 0.0, X[q]) for q in range(300)], _end(b"a", 299))
        eng = svc.streams[b"a"].engine
        n = svc.counters["checkpoints"]
        steps = eng.metrics()["learner_steps"]
        eng._pause_learner(False)                           # (as a round still in flight)
        _wait_for(lambda: eng.metrics()["learner_steps"] > steps, 60)
        eng._pause_learner(True)
        _full_learner_round(eng)
        steps = eng.metrics()["learner_steps"]
        feed(encode_sample(b"b", 0, 0.0, X[0]))             # a retired: written again
        assert svc.counters["checkpoints"] == n + 1
        rec = read_stream_record(str(tmp_path / "ckpt" / "stream-61.json"))
        from streamfhmm.io.checkpoint import load_checkpoint
        _, arrays = load_checkpoint(str(tmp_path / "ckpt" / rec["file"]))
        assert arrays["learner.counters"][0] == steps             # (the steps after the end)
        feed(_end(b"b", 0), encode_sample(b"a", 300, 0.0, X[300]))
        assert svc.streams[b"a"].engine.metrics()["learner_steps"] >= steps > 0
    finally:
        close()


def test_a_topic_of_another_width_is_loaded_once_and_costs_no_stream_its_place(tmp_path):
    svc, feed, close = _direct_service(tmp_path)
    feed(*[_s(b"w", q) for q in range(3)], _end(b"w", 2))
    close()
    loads = []

    class Counted(WideFakeEngine):
        @classmethod
        def resume(cls, path):
            loads.append(path)
            return super().resume(path)
    svc, feed, close = _direct_service(tmp_path, engine=Counted, max_streams=2)
    try:
        for topic in (b"a", b"b"):
            feed(*[_s(topic, q) for q in range(3)], _end(topic, 2))
        for q in range(3, 8):
            feed(_s(b"w", q))
        assert sorted(svc.streams) == [b"a", b"b"] and svc.counters["retired"] == 0
        assert len(loads) == 1 and svc.counters["engine_rejected"] == 5
    finally:
        close()


def _capture(svc, published):
    """Record (topic, seq, mean[0]) of every posterior ``svc`` publishes, instead of
    sending it."""
    def send(topic, seq, ts, p):
        published.append((bytes(topic), int(seq), float(p.mean[0])))

    def send_block(topic, seq, text, tlen, batch):
        for q, m in zip(np.asarray(seq).tolist(), np.asarray(batch.mean)[:, 0].tolist()):
            published.append((bytes(topic), int(q), float(m)))
    svc.sink.send, svc.sink.send_block = send, send_block


@pytest.mark.parametrize("seed", range(60))
def test_topics_that_come_and_go_are_served_once_each(tmp_path, seed):
    """Random reads of a few topics (samples in order, gaps, late repeats, ends) into
    services of 1-3 streams, each stopped and the next started on the same directory:
    every sample pushed has one posterior, published once, of that sample."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    engine = rng.choice([FakeEngine, BlockFakeEngine])
    kw = dict(max_streams=rng.choice([1, 2, 3]), batch_threshold=2)
    if rng.random() < 0.5:
        kw["retire_idle"] = 0.0
    if rng.random() < 0.5:
        kw["checkpoint_every"] = rng.choice([1, 3, 7])
    topics = [bytes([97 + i]) for i in range(rng.choice([2, 3, 5]))]
    nxt = dict.fromkeys(topics, 0)
    published, pushed = [], 0
    for _ in range(rng.choice([1, 2, 3])):
        svc, feed, close = _direct_service(tmp_path, engine=engine, **kw)
        _capture(svc, published)
        for _ in range(rng.randint(5, 60)):
            frames = []
            for _ in range(rng.randint(1, 6)):
                t, x = rng.choice(topics), rng.random()
                if x < 0.75:                      # the next number, or after a gap
                    nxt[t] += 0 if x < 0.65 else rng.randint(1, 5)
                    frames.append(_s(t, nxt[t]))
                    nxt[t] += 1
                elif x < 0.85 and nxt[t] > 1:     # a late repeat
                    frames.append(_s(t, rng.randint(1, nxt[t] - 1)))
                elif x < 0.97:
                    frames.append(_end(t, max(nxt[t] - 1, 0)))
            feed(*frames)
        close()
        pushed += svc.counters["samples"]
    counts = collections.Counter((t, q) for t, q, _ in published)
    assert [k for k, v in counts.items() if v > 1] == []
    assert all(m == q for _, q, m in published)       # (FakeEngine: mean[0] is the sample's)
    assert len(published) == pushed


def test_heartbeats_of_idle_topics_never_take_the_room_of_samples(tmp_path, harness):
    """Source and service bounded alike (as ``serve --max-streams``): heartbeats of a
    topic that sends no sample do not keep a new stream out, the resumed stream's
    checkpointed sequence number stays, and no gap count is lost."""
    h = harness(tmp_path, max_streams=2, source_kw={"max_streams": 2})
    for seq in range(5):
        h.sample(b"s", seq, _values(0, seq))
    _wait_for(lambda: h.service.counters["samples"] == 5)
    h.stop()                                      # checkpoints s at sequence number 4
    h.recv(5)
    h.start()                                     # resumes s: the source knows its 4
    h.send(encode_heartbeat(b"idle", 3, 0.0))     # an idle publisher: its table place ...
    h.send(encode_heartbeat(b"idle", 5, 0.0))     # (... and the gap 4, 5 it reveals)
    for seq in range(3):
        h.sample(b"new", seq, _values(1, seq))    # ... goes to a new stream's samples
    for seq in range(7, 10):
        h.sample(b"s", seq, _values(0, seq))      # 5, 6 lost since the checkpoint
    h.send(encode_heartbeat(b"new", 2, 0.0, end=True))
    h.send(encode_heartbeat(b"s", 9, 0.0, end=True))
    got = h.recv(6)
    m = h.stop()
    assert sorted((g.topic, g.seq) for g in got) == [(b"new", 0), (b"new", 1), (b"new", 2),
                                                     (b"s", 7), (b"s", 8), (b"s", 9)]
    assert [g.t for g in got if g.topic == b"s"] == [5, 6, 7]
    assert m["streams"] == 2 and m["streams_full"] == 0 and m["lost_on_resume"] == 2
    assert (m["gaps"], m["gap_samples"]) == (2, 4)    # idle's, kept after its eviction, and s's


def test_heartbeats_when_idle(harness):
    h = harness(heartbeat_interval=0.05)
    svc = h.recv(1, heartbeats=True)[0]
    assert type(svc) is Heartbeat and svc.topic == b"" and svc.streams == 0
    h.sample(b"s", 0, _values(0, 0))
    hb = None
    while hb is None:
        m = h.recv(1, heartbeats=True)[0]
        if type(m) is Heartbeat and m.topic == b"s":
            hb = m
    assert hb.seq == 0 and hb.t == 1
    h.stop()


def test_checkpoint_resume_and_lost_samples(tmp_path, caplog, harness):
    h = harness(tmp_path, checkpoint_every=10)
    for seq in range(25):
        h.sample(b"s", seq, _values(0, seq))
    got = h.recv(23)                           # 23 out; 23, 24 in the lag
    m = h.service.metrics()
    assert m["checkpoints"] == 2               # after 10 and 20 samples
    rec = read_stream_record(str(tmp_path / "ckpt" / "stream-73.json"))
    assert rec["seq"] == 19 and rec["t_next"] == 20 and [p[1] for p in rec["pending"]] == [18, 19]
    # stop without the end of the stream: shutdown flushes and checkpoints again
    m = h.stop()
    assert m["checkpoints"] == 3
    rec = read_stream_record(str(tmp_path / "ckpt" / "stream-73.json"))
    assert rec["seq"] == 24 and rec["t_next"] == 25 and rec["pending"] == []
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["stream-73.3.npz", "stream-73.json"]
    got += h.recv(2)
    assert [g.seq for g in got] == list(range(25))
    # restart: resumes the stream; samples 25..29 never arrive
    with caplog.at_level("WARNING", logger="streamfhmm.service"):
        h.start()
        assert h.service.streams[b"s"].t_next == 25
        for seq in range(30, 40):
            h.sample(b"s", seq, _values(0, seq))
        h.send(encode_heartbeat(b"s", 39, 0.0, end=True))
        got = h.recv(10)
        m = h.stop()
    assert [g.seq for g in got] == list(range(30, 40))
    assert [g.t for g in got] == list(range(25, 35))
    assert m["lost_on_resume"] == 5 and m["gap_samples"] == 5
    msgs = [r.getMessage() for r in caplog.records]
    assert any("resumed from checkpoint stream-73.3.npz: last sequence number 24" in x for x in msgs)
    assert any("5 sample(s) lost since the checkpoint" in x for x in msgs)


def test_resume_removes_what_an_interrupted_checkpoint_left(tmp_path, harness):
    """Engine files no record names (a crash between a new engine file and its record,
    an old generation not yet removed, a first file without a record) and temporary
    files older than an hour are removed when a service starts on the directory; a
    recent temporary file (another writer's) and files of other names stay."""
    h = harness(tmp_path, checkpoint_every=10)
    for seq in range(12):
        h.sample(b"s", seq, _values(0, seq))
    h.recv(10)
    h.stop()
    d = tmp_path / "ckpt"
    assert sorted(os.listdir(d)) == ["stream-73.2.npz", "stream-73.json"]
    leftovers = ["stream-73.1.npz", "stream-73.3.npz", "stream-74.1.npz",
                 ".stream-73.3.npz.tmp-123-456", ".stream-73.json.tmp-123-457"]
    kept = ["notes.txt", "stream-73.npz", ".stream-73.4.npz.tmp-123-458"]
    for name in leftovers + kept:
        (d / name).write_bytes(b"x")
    old = time.time() - 7200
    for name in leftovers[3:]:
        os.utime(d / name, (old, old))
    h.start()
    assert sorted(os.listdir(d)) == sorted(["stream-73.2.npz", "stream-73.json"] + kept)
    assert h.service.streams[b"s"].t_next == 12
    h.stop()


def test_resume_after_a_crash_restores_the_smoothing_lag(tmp_path, harness):
    """A checkpoint taken mid-stream holds the (t, seq, ts) of samples inside the lag."""
    h = harness(tmp_path, checkpoint_every=10)
    for seq in range(12):
        h.sample(b"s", seq, _values(0, seq))
    h.recv(10)
    # simulate a crash: drop the service without its shutdown; restore the records as of seq 9
    h.service._closed = True
    h.stop()
    h.start()
    st = h.service.streams[b"s"]
    assert st.t_next == 10 and st.last_seq == 9 and [p[1] for p in st.pending] == [8, 9]
    for seq in range(10, 15):
        h.sample(b"s", seq, _values(0, seq))
    h.send(encode_heartbeat(b"s", 14, 0.0, end=True))
    got = h.recv(7)
    h.stop()
    assert [g.seq for g in got] == list(range(8, 15))     # 8 and 9 again: at-least-once
    np.testing.assert_array_equal(np.array([g.mean for g in got]), np.array([_values(0, s) for s in range(8, 15)]))


def test_resume_publishes_pending_time_stamps_as_they_arrived(tmp_path):
    """The posteriors of samples pending at a checkpoint repeat, after a resume, the
    time-stamp texts those samples arrived with, as a service that never stopped does."""
    from streamfhmm.io.wire import TS_TEXT_BYTES, SampleRun

    def text(s):   # JSON numbers that repr of their float would write otherwise
        return [b"%d" % (1700000000000 + s), b"1700000%03d.50" % s, b"1700000000.12345678%02d" % s,
                b"%dE+3" % (s + 1)][s % 4]

    def run(seqs):   # what the compiled receive path hands over
        k = len(seqs)
        txt, tlen = np.zeros((k, TS_TEXT_BYTES), np.uint8), np.zeros(k, np.int64)
        for i, s in enumerate(seqs):
            txt[i, :len(text(s))] = np.frombuffer(text(s), np.uint8)
            tlen[i] = len(text(s))
        return SampleRun(b"s", np.array(seqs, np.int64), txt, tlen, np.array([_values(0, s) for s in seqs]))

    ctx = zmq.Context()
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(sink.endpoint)
    sub.subscribe(b"")
    assert sink.wait_for_subscribers(1, timeout=10.0)
    sources = []

    def service():
        sources.append(ZmqSource(ANY, 3, bind=True, context=ctx, subscribe=False, linger_ms=0))
        return StreamService(sources[-1], sink, lambda topic: BlockFakeEngine(lag=4),
                             resume_engine=BlockFakeEngine.resume, checkpoint_dir=str(tmp_path / "ckpt"),
                             checkpoint_every=10, heartbeat_interval=0, batch_threshold=2)
    try:
        service().process([run(range(12))])        # checkpointed after 12: 8..11 in the lag
        rec = read_stream_record(str(tmp_path / "ckpt" / "stream-73.json"))
        assert rec["pending_text"] == [text(s) for s in range(8, 12)]
        assert [p[2] for p in rec["pending"]] == [float(text(s)) for s in range(8, 12)]
        service().process([run(range(12, 17))])    # a crash, then a resume from that checkpoint
        got = []
        while len(got) < 13 and sub.poll(10_000):
            got.append(sub.recv_multipart()[1])
        heads = [(json.loads(h)["seq"], re.search(rb'"ts":([^,]*),', h).group(1)) for h in got]
        assert heads == [(s, text(s)) for s in range(13)]
    finally:
        for src in sources:
            src.close(0)
        sink.close(0)
        sub.close(0)
        ctx.term()


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_a_posterior_published_alone_repeats_its_time_stamp_text(tmp_path, fmt):
    """A read that yields one posterior of a stream (several streams in turn) published
    it through the Python encoder with repr of its time stamp's float (1700000041 came
    back as 1700000041.0, 1e3 as 1000.0), where a block repeats the text: a consumer
    joining output to input by that text missed some."""
    svc, feed, close = _direct_service(tmp_path)
    if fmt == "json":
        svc.sink.format = "json"
    sub = svc.sink.socket.context.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(svc.sink.endpoint)
        sub.subscribe(b"")
        assert svc.sink.wait_for_subscribers(1, timeout=10.0)
        texts = [b"1700000041", b"1e3", b"2.50", b"-0", b"12345678901234567890"]
        for q, text in enumerate(texts):
            for topic in (b"a", b"b"):       # one sample of each topic per read
                feed([topic, b'{"seq":%d,"ts":%s}' % (q, text), _values(0, q).tobytes()])
        feed(_end(b"a", len(texts) - 1), _end(b"b", len(texts) - 1))   # (the lag, flushed)
        got = []
        while len(got) < 2 * len(texts) and sub.poll(10_000):
            got.append(sub.recv_multipart())
        heads = [m[1] if fmt == "binary" else m[0] for m in got]
        found = {(m[0] if fmt == "binary" else json.loads(h)["topic"].encode(), json.loads(h)["seq"]):
                 re.search(rb'"ts":([^,]*),', h).group(1) for m, h in zip(got, heads)}
        assert found == {(topic, q): t for q, t in enumerate(texts) for topic in (b"a", b"b")}
        assert sorted(float(json.loads(h)["ts"]) for h in heads) == sorted(float(t) for t in texts for _ in (0, 1))
    finally:
        sub.close(0)
        close()


def test_bad_checkpoint_directory_is_a_clear_error(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "stream-73.json").write_text("{not json")
    ctx = zmq.Context()
    src = ZmqSource(ANY, 3, bind=True, context=ctx, linger_ms=0)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    with pytest.raises(CheckpointError, match="is not a streamfhmm stream checkpoint record"):
        StreamService(src, sink, lambda t: FakeEngine(), resume_engine=FakeEngine.resume,
                      checkpoint_dir=str(d))
    (d / "stream-73.json").write_text(json.dumps({
        "format": "streamfhmm.service-stream", "version": 1, "topic": "73", "seq": 3, "t_next": 4,
        "pending": [], "generation": 1, "file": "stream-73.1.npz", "time": 0.0}))
    with pytest.raises(CheckpointError, match="which is missing"):
        StreamService(src, sink, lambda t: FakeEngine(), resume_engine=FakeEngine.resume,
                      checkpoint_dir=str(d))
    FakeEngine(t=7).checkpoint(str(d / "stream-73.1.npz"))
    with pytest.raises(CheckpointError, match="holds 7 samples but its record says 4"):
        StreamService(src, sink, lambda t: FakeEngine(), resume_engine=FakeEngine.resume,
                      checkpoint_dir=str(d))
    # a topic the service could not publish under (not UTF-8) and a time stamp no float
    # holds: clear errors at start-up, not a crash at the first heartbeat
    for bad, message in (({"topic": "ff"}, "topic is not UTF-8"),
                         ({"pending": [[3, 3, int("9" * 400)]]}, "OverflowError")):
        (d / "stream-73.json").write_text(json.dumps({
            "format": "streamfhmm.service-stream", "version": 1, "topic": "73", "seq": 3,
            "t_next": 4, "pending": [], "generation": 1, "file": "stream-73.1.npz", "time": 0.0,
            **bad}))
        with pytest.raises(CheckpointError, match=f"damaged stream checkpoint record: .*{message}"):
            read_stream_record(str(d / "stream-73.json"))
    src.close(0)
    sink.close(0)
    ctx.term()


def _record(d, **change):
    """Write a consistent record and engine file of topic b"s" (7 samples) into d, with
    ``change`` applied to the record; returns the record's path."""
    FakeEngine(t=7).checkpoint(str(d / "stream-73.1.npz"))
    rec = {"format": "streamfhmm.service-stream", "version": 1, "topic": "73", "seq": 6, "t_next": 7,
           "pending": [], "generation": 1, "file": "stream-73.1.npz", "time": 0.0}
    rec.update(change)
    path = d / change.pop("name", "stream-73.json")
    path.write_text(json.dumps({k: v for k, v in rec.items() if k != "name"}))
    return path


def test_tampered_records_are_clear_errors_not_crashes(tmp_path):
    """Integers past int64 (an OverflowError out of the constructor before) and a record
    under another stream's name (two streams resumed from one engine file, one of them
    never closed, and the next start refused) are CheckpointErrors naming the file."""
    d = tmp_path / "ckpt"
    d.mkdir()
    for change, message in (({"pending": [[6, 2 ** 70, 1.0]]}, r"seq must be an integer in \[0, 2\*\*63\)"),
                            ({"seq": 2 ** 63}, r"seq must be an integer in \[-1, 2\*\*63\)"),
                            ({"seq": 1e300}, "seq must be an integer"),
                            ({"t_next": -1}, "t_next must be an integer"),
                            ({"generation": True}, "generation must be an integer"),
                            ({"name": "stream-74.json"}, "is named stream-73.json"),
                            ({"file": "stream-74.1.npz"}, "names the engine file stream-73.1.npz"),
                            ({"ended": 1}, "'ended' must be true or false"),
                            ({"time": float("nan")}, "time must be a finite number, got nan"),
                            ({"version": 3}, "has record version 3; this streamfhmm reads versions 1 to 2")):
        for f in d.iterdir():
            f.unlink()
        if "file" in change:
            FakeEngine(t=7).checkpoint(str(d / change["file"]))
        path = _record(d, **change)
        with pytest.raises(CheckpointError, match=f"{re.escape(str(path))} .*{message}"):
            read_stream_record(str(path))
    # the service refuses to start on such a record and leaves no engine open
    for f in d.iterdir():
        f.unlink()
    _record(d)
    _record(d, name="stream-74.json")   # a stray copy of stream-73.json
    opened = []

    def resume(path):
        opened.append(FakeEngine.resume(path))
        return opened[-1]
    ctx = zmq.Context()
    src = ZmqSource(ANY, 3, bind=True, context=ctx, linger_ms=0)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    with pytest.raises(CheckpointError, match="stream-74.json is a damaged stream checkpoint record"):
        StreamService(src, sink, lambda t: FakeEngine(), resume_engine=resume, checkpoint_dir=str(d))
    assert all(e.closed for e in opened)   # (the records are read before any engine is opened)
    src.close(0)
    sink.close(0)
    ctx.term()


def test_an_unusable_checkpoint_directory_is_a_checkpoint_error(tmp_path):
    """(serve printed the bare OSError: '[Errno 17] File exists: ...')"""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ctx = zmq.Context()
    src = ZmqSource(ANY, 3, bind=True, context=ctx, linger_ms=0)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    for path, reason in ((blocker, "it is a file, not a directory"),
                         (blocker / "sub", "Not a directory")):
        with pytest.raises(CheckpointError, match=f"cannot use {re.escape(str(path))} as the checkpoint "
                                                  f"directory: {reason}"):
            StreamService(src, sink, lambda t: FakeEngine(), resume_engine=FakeEngine.resume,
                          checkpoint_dir=str(path))
    src.close(0)
    sink.close(0)
    ctx.term()


def test_resuming_an_engine_of_another_width_or_a_failing_resume_is_a_checkpoint_error(tmp_path):
    """A service restarted with a model of another width on the same directory started,
    and its engine refused every sample of the stream for ever; a resume that raised
    anything but OSError/ValueError/KeyError (an AttributeError from a damaged file) ended
    start-up with a traceback."""
    d = tmp_path / "ckpt"
    d.mkdir()
    _record(d)

    class Wide(FakeEngine):
        n_features = 4

    opened = []

    def wide(path):
        opened.append(Wide.resume(path))
        return opened[-1]

    def broken(path):
        raise AttributeError("'NoneType' object has no attribute 'W'")

    ctx = zmq.Context()
    src = ZmqSource(ANY, 3, bind=True, context=ctx, linger_ms=0)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    for resume, message in ((wide, "stream-73.1.npz is an engine of 4 features per sample, this "
                                   "service reads 3"),
                            (broken, "cannot resume stream b's' from .*stream-73.1.npz: 'NoneType' "
                                     "object has no attribute 'W'")):
        with pytest.raises(CheckpointError, match=message):
            StreamService(src, sink, lambda t: FakeEngine(), resume_engine=resume, checkpoint_dir=str(d))
    assert len(opened) == 1 and opened[0].closed
    Wide.n_features = 3      # the same width resumes
    svc = StreamService(src, sink, lambda t: FakeEngine(), resume_engine=wide, checkpoint_dir=str(d))
    assert svc.streams[b"s"].t_next == 7
    svc.shutdown()
    src.close(0)
    sink.close(0)
    ctx.term()


def test_checkpoint_directory_deleted_while_running_is_made_again(tmp_path, harness):
    import shutil
    h = harness(tmp_path, checkpoint_every=5)
    for seq in range(10):
        h.sample(b"s", seq, _values(0, seq))
    h.recv(8)
    # the checkpoint after the 10th sample finished -- its record written and the older
    # generation's file removed (removing the directory while either happens raced with
    # the service) -- the service idle: then the directory goes
    record = tmp_path / "ckpt" / "stream-73.json"

    def finished() -> bool:
        try:
            seq = read_stream_record(str(record))["seq"]
        except (FileNotFoundError, CheckpointError):
            # (read between the service's steps: a record naming the engine file of the
            # generation it is removing just then)
            return False
        return seq == 9 and sorted(p.name for p in record.parent.glob("*")) == ["stream-73.2.npz",
                                                                                  "stream-73.json"]
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        if finished():
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"no finished checkpoint after the 10th sample in 60 s: "
                             f"{sorted(p.name for p in record.parent.glob('*'))}")
    shutil.rmtree(tmp_path / "ckpt")
    for seq in range(10, 20):
        h.sample(b"s", seq, _values(0, seq))
    h.recv(10)
    h.stop()
    rec = read_stream_record(str(tmp_path / "ckpt" / "stream-73.json"))
    assert rec["seq"] == 19 and rec["t_next"] == 20


class SlowEngine(BlockFakeEngine):
    """About 50 µs a sample: slower than a publisher that never pauses."""

    def push(self, x):
        t = time.perf_counter()
        while time.perf_counter() - t < 50e-6:
            pass
        return super().push(x)


def test_stop_returns_while_a_publisher_floods():
    """A publisher that sends faster than the service handles and never pauses kept the
    shutdown's drain reading for ever: the drain is bounded by ``drain_timeout``."""
    ctx = zmq.Context()
    src = ZmqSource(ANY, 3, bind=True, context=ctx, linger_ms=0, hwm=1000)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    svc = StreamService(src, sink, lambda t: SlowEngine(), heartbeat_interval=0, drain_timeout=0.2)
    stop = threading.Event()

    def flood():
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 1000)   # (past it the PUB drops: bounded memory)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(src.endpoint)
        x, seq, t_end = np.zeros(3), 0, time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < t_end:
            pub.send_multipart(encode_sample(b"s", seq, 1.0, x))
            seq += 1
        pub.close(0)
    publisher = threading.Thread(target=flood)
    publisher.start()
    server = threading.Thread(target=svc.run)
    server.start()
    try:
        deadline = time.monotonic() + 60
        while svc.counters["samples"] < 2000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.counters["samples"] >= 2000
        svc.request_stop()
        server.join(20)
        assert not server.is_alive(), "run() did not return while the publisher kept sending"
    finally:
        stop.set()
        publisher.join(30)
        server.join(30)
        src.close(0)
        sink.close(0)
        ctx.term()


def test_skipped_samples_of_a_new_topic_are_counted_one_by_one():
    """``streams_full`` counts samples (it counted runs of samples)."""
    from streamfhmm.io.wire import SampleRun
    ctx = zmq.Context()
    src = ZmqSource(ANY, 3, bind=True, context=ctx, linger_ms=0)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    svc = StreamService(src, sink, lambda t: FakeEngine(), heartbeat_interval=0, max_streams=1)
    text = np.zeros((6, 32), np.uint8)
    text[:, 0] = ord("1")
    for topic in (b"a", b"b"):
        svc.process([SampleRun(topic, np.arange(6), text, np.ones(6, np.int64), np.ones((6, 3)))])
    assert svc.counters["samples"] == 6 and svc.counters["streams_full"] == 6
    svc.shutdown()
    src.close(0)
    sink.close(0)
    ctx.term()


def test_metrics_server(harness):
    pytest.importorskip("prometheus_client")
    import urllib.request
    from streamfhmm.service import start_metrics_server
    h = harness()
    for seq in range(5):
        h.sample(b"s", seq, _values(0, seq))
    h.send([b"s", b"{"])
    h.send(encode_heartbeat(b"s", 4, 0.0, end=True))
    h.recv(5)
    _wait_for(lambda: h.service.counters["ends"] >= 1, 30)
    server = start_metrics_server(h.service, 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    server.close()
    h.stop()
    assert "streamfhmm_samples_total 5.0" in text
    assert 'streamfhmm_malformed_total{kind="frames"} 1.0' in text
    assert 'streamfhmm_engine_samples{topic="s"} 5.0' in text
    assert "streamfhmm_learners_held 0.0" in text      # (s ended, but has no learner)
    for bad in (-1, 65536, "9100", 1.5):
        with pytest.raises(ValueError, match=r"port must be an integer in \[0, 65535\]"):
            start_metrics_server(h.service, bad)


def test_service_argument_checks():
    ctx = zmq.Context()
    src = ZmqSource(ANY, 3, bind=True, context=ctx, linger_ms=0)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    with pytest.raises(ValueError, match="needs a checkpoint directory"):
        StreamService(src, sink, FakeEngine, checkpoint_every=10)
    with pytest.raises(ValueError, match="checkpoint_every must be >= 1"):
        StreamService(src, sink, FakeEngine, checkpoint_dir="x", checkpoint_every=0)
    # batch_size 0 read nothing, ever: the loop spun with the input queued
    for kw, message in ((dict(batch_size=0), "batch_size must be >= 1 messages per read .*got 0"),
                        (dict(batch_size=2.5), "batch_size must be >= 1"),
                        (dict(max_streams=float("nan")), "max_streams must be >= 1"),
                        (dict(wait_subscribers=-1), "wait_subscribers must be >= 0"),
                        (dict(heartbeat_interval=float("nan")), "heartbeat_interval must be a number of seconds"),
                        (dict(status_interval=-1), "status_interval must be a number of seconds"),
                        (dict(log_interval="10"), "log_interval must be a number of seconds"),
                        (dict(drain_timeout=-0.5), "drain_timeout must be a number of seconds"),
                        (dict(retire_idle=float("nan")), "retire_idle must be a number of seconds"),
                        (dict(checkpoint_retain=-1.0), "checkpoint_retain must be a number of seconds"),
                        (dict(checkpoint_retain=60.0), "checkpoint_retain needs a checkpoint directory"),
                        (dict(checkpoint_dir="x"), "a checkpoint directory needs resume_engine")):
        with pytest.raises(ValueError, match=message):
            StreamService(src, sink, FakeEngine, **kw)
    svc = StreamService(src, sink, FakeEngine)
    with pytest.raises(ValueError, match="time_budget must be a number of seconds >= 0, got nan"):
        svc.run(time_budget=float("nan"))   # (it served for ever)
    with pytest.raises(ValueError, match="max_samples must be >= 0"):
        svc.run(max_samples=-1)
    src.close(0)
    sink.close(0)
    ctx.term()


# ==========================================================================================
# end to end: real processes
# ==========================================================================================
#: what serve and replay print once they are bound (a port the system chose: a port
#: picked by the test, closed and handed on, could be taken meanwhile)
_OUTPUT_BOUND = re.compile(r"output bound at (\S+) \(")
_REPLAY_BOUND = re.compile(r" values on (tcp://[^\s,]+)")


def _started(proc, pattern, timeout=180.0):
    """Read ``proc``'s stderr up to the line matching ``pattern`` (within ``timeout`` s,
    else kill it and fail); the match's group 1. The lines read stay in ``proc.head``
    (:func:`_stop` and :func:`_drain` prepend them)."""
    proc.head = ""
    lines = queue.Queue()

    def read():   # (a thread: readline alone has no deadline)
        for line in iter(proc.stderr.readline, ""):
            lines.put(line)
            if pattern.search(line):
                return            # the rest is communicate()'s
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"not bound within {timeout:g} s: {proc.head[-2000:]}") from None
        if line is None:
            proc.wait(timeout=60)
            raise AssertionError(f"exited with status {proc.returncode} before it was bound: "
                                 f"{proc.head[-2000:]}")
        proc.head += line
        m = pattern.search(line)
        if m:
            return m.group(1)


def _cli(*args, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "streamfhmm", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A small fitted model and a simulated recording."""
    pytest.importorskip("streamfhmm.stream.engine")
    from streamfhmm import FHMM
    from streamfhmm.model import FHMMParams
    print(f"seed={SEED}")
    d = tmp_path_factory.mktemp("e2e")
    p = FHMMParams.random(3, 4, random_state=SEED, noise=0.3)
    gen = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, startprob=p.startprob)
    X, _ = gen.sample(100_000, random_state=SEED + 1)
    model = FHMM(n_chains=3, window=5, n_hidden=16, random_state=SEED).fit(X[:3000], max_iter=300,
                                                                            progress=False)
    model.save(str(d / "model.npz"))
    np.save(d / "data.npy", X)
    return {"dir": d, "model": str(d / "model.npz"), "data": str(d / "data.npy"), "X": X}


class Consumer:
    """Subscribes to the service's output; keeps (seq, t, flags) of every posterior."""

    def __init__(self, endpoint=None):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.endpoints = set()
        if endpoint is not None:
            self.connect(endpoint)
        self.sub.subscribe(b"")
        self.seqs, self.ts, self.values = [], [], []

    def connect(self, endpoint):
        """Also read from ``endpoint`` (a restarted service's new port), once."""
        if endpoint not in self.endpoints:
            self.sub.connect(endpoint)
            self.endpoints.add(endpoint)

    def until(self, pred, timeout, proc=None):
        deadline = time.monotonic() + timeout
        while not pred():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out with {len(self.seqs)} posteriors (last "
                                     f"{self.seqs[-1:]}); service: {_drain(proc)}")
            if self.sub.poll(int(min(left, 1.0) * 1000)):
                for _ in range(10_000):
                    try:
                        frames = self.sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if frames[2]:
                        h = json.loads(frames[1])
                        self.seqs.append(h["seq"])
                        self.ts.append(h["t"])
                        self.values.append(frames[2])

    def close(self):
        self.sub.close(0)
        self.ctx.term()


def _drain(proc):
    if proc is None or proc.poll() is None:
        return "(running)"
    return (getattr(proc, "head", "") + proc.stderr.read())[-2000:]


def _teardown(procs, *closables):
    """Kill what is still running of ``procs`` (None allowed), then close ``closables``."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.communicate()
    for c in closables:
        c.close()


def _stop(proc, sig=signal.SIGTERM, timeout=60):
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, getattr(proc, "head", "") + err


def _serve(fitted, sub, con, *extra):
    """``serve`` reading ``sub``, its output bound at a port of the system's choice, to
    which ``con`` connects once it is bound."""
    proc = _cli("serve", "--model", fitted["model"], "--sub", sub, "--pub", "tcp://127.0.0.1:*",
                "--wait-subscribers", "1", "--status-interval", "0", *extra)
    try:
        con.connect(_started(proc, _OUTPUT_BOUND))
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        raise
    return proc


class Publisher:
    """The test's own sensor: an XPUB that waits for the service's subscription."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.endpoint = f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}"

    def wait_subscriber(self, consumer=None, timeout=60):
        _handshake(self.pub, None if consumer is None else consumer.sub, timeout)

    def send(self, X, seqs, topic=b"s"):
        for x, s in zip(X, seqs):
            self.pub.send_multipart(encode_sample(topic, s, time.time(), x))

    def close(self):
        self.pub.close(0)
        self.ctx.term()


def test_e2e_replay_100k_every_posterior_in_order(fitted):
    con = Consumer()
    replay = _cli("replay", fitted["data"], "--pub", "tcp://127.0.0.1:*", "--rate", "25000",
                  "--topic", "house", "--wait-timeout", "120")
    serve = None
    try:
        serve = _serve(fitted, _started(replay, _REPLAY_BOUND), con)
        n = len(fitted["X"])
        con.until(lambda: len(con.seqs) >= n, timeout=180, proc=serve)
        _, rerr = replay.communicate(timeout=60)
        assert replay.returncode == 0, rerr
        code, err = _stop(serve)
    finally:
        _teardown((serve, replay), con)
    assert code == 0, err
    # the replay reports its rate; how fast is a benchmark's question, not this test's
    # (bench/zmq.py: the service's messages/s against a same-run ZeroMQ relay, target
    # >= 20,000/s with learning on), so it is printed, not asserted
    rate = float(re.search(r"in [0-9.]+ s: ([0-9,]+) messages/s", rerr).group(1).replace(",", ""))
    print(f"replay rate {rate:,.0f} messages/s")
    assert con.seqs == list(range(n))              # every sequence number, in order, once
    assert con.ts == list(range(n))
    line = [x for x in err.splitlines() if "stopped after" in x][-1]
    assert f"{n:,} samples" in line and "gaps 0 (0 samples)" in line and "malformed 0" in line, line
    # the posteriors are the model's: the service's mean of sample 50000 is Wᵀ[θ, 1] of a θ in [0, 1]
    v = np.frombuffer(con.values[50_000], dtype="<f8")
    assert v.shape == (3 + 3 + 4,) and np.all((v[:3] >= 0) & (v[:3] <= 1))


def test_e2e_malformed_messages_are_counted_and_the_stream_goes_on(fitted):
    pub = Publisher()
    con = Consumer()
    serve = _serve(fitted, pub.endpoint, con)
    X = fitted["X"][:400]
    bad = [[b"s", b'{"seq":0,"ts":0}'],                                   # frames
           [b"\xff", b'{"seq":0,"ts":0}', X[0].tobytes()],                 # topic
           [b"s", b"{nope", X[0].tobytes()],                               # json
           [b"s", b'{"seq":null,"ts":0}', X[0].tobytes()],                 # fields
           [b"s", b'{"seq":0,"ts":0}', X[0][:3].tobytes()],                # size
           [b"s", b'{"seq":0,"ts":0}', np.array([1.0, np.inf, 0, 0]).tobytes()],  # nonfinite
           [b'{"seq":0,"ts":0,"values":[1,2]}'],                           # size (JSON)
           [b"s", b'{"seq":0,"ts":0}', b"\0" * 10_000_000]]                # past MAXMSGSIZE
    try:
        pub.wait_subscriber(con)
        for i in range(0, 300, 50):
            pub.send(X[i:i + 50], range(i, i + 50))
            for frames in bad[:-1]:
                pub.pub.send_multipart(frames)
        con.until(lambda: len(con.seqs) >= 298, timeout=60, proc=serve)
        # an oversize frame makes libzmq drop the connection; the service reconnects
        pub.pub.send_multipart(bad[-1])
        pub.wait_subscriber(con)
        pub.send(X[300:400], range(300, 400))
        pub.pub.send_multipart(encode_heartbeat(b"s", 399, 0.0, end=True))
        con.until(lambda: len(con.seqs) >= 400, timeout=60, proc=serve)
        code, err = _stop(serve)
    finally:
        _teardown((serve,), pub, con)
    assert code == 0, err
    assert con.seqs == list(range(400))
    line = [x for x in err.splitlines() if "stopped after" in x][-1]
    assert ("malformed 42 (frames 6, topic 6, json 6, fields 6, size 12, nonfinite 6)" in line), line
    # the oversize frame never reaches the service: libzmq drops its connection, which is
    # counted (it was not: its messages were only a gap)
    assert "input disconnects 1," in line, line
    assert "gaps 0" in line
    # each kind was logged once (rate limited), not 6 times
    assert err.count("skipped a malformed message (json)") == 1, err


def test_e2e_max_streams_1_serves_topics_that_come_and_go(fitted, tmp_path):
    """``serve --max-streams 1``: each topic ends before the next one starts; each takes
    the place of the last, and the first resumes where it ended. (serve's source has
    room for the topics of one read past --max-streams, and releases the topics the
    service retires.)"""
    pub = Publisher()
    con = Consumer()
    serve = _serve(fitted, pub.endpoint, con, "--max-streams", "1",
                   "--checkpoint", str(tmp_path / "ckpt"), "--verbose")
    X = fitted["X"][:80]
    try:
        pub.wait_subscriber(con)
        for k, (topic, a) in enumerate(((b"a", 0), (b"b", 0), (b"c", 0), (b"a", 20))):
            pub.send(X[20 * k:20 * k + 20], range(a, a + 20), topic=topic)
            pub.pub.send_multipart(encode_heartbeat(topic, a + 19, 0.0, end=True))
            con.until(lambda: len(con.seqs) >= 20 * (k + 1), timeout=60, proc=serve)
        code, err = _stop(serve)
    finally:
        _teardown((serve,), pub, con)
    assert code == 0, err
    assert con.seqs == [*range(20)] * 3 + [*range(20, 40)]
    assert con.ts == [*range(20)] * 3 + [*range(20, 40)]   # a resumed at its position 20
    line = [x for x in err.splitlines() if "stopped after" in x][-1]
    assert "80 samples" in line and "gaps 0" in line, line
    assert "retired stream 'a' to make room" in err and "stream 'a' resumed from checkpoint" in err, err


def _wait_for_output(con, seq, proc, timeout=60):
    con.until(lambda: bool(con.seqs) and con.seqs[-1] >= seq, timeout=timeout, proc=proc)


def test_e2e_sigterm_checkpoints_and_restart_resumes(fitted, tmp_path):
    from streamfhmm.stream.engine import StreamEngine
    ck = str(tmp_path / "ck")
    X = fitted["X"][:4000]
    pub = Publisher()
    con = Consumer()
    args = ("--checkpoint", ck, "--checkpoint-every", "1000", "--learn")
    serve = _serve(fitted, pub.endpoint, con, *args, "--learner-duty", "0.5", "--learn-samples", "2000")
    serve2 = None
    try:
        pub.wait_subscriber(con)
        pub.send(X[:2500], range(2500))
        _wait_for_output(con, 2497, serve)          # all 2500 pushed (lag 2)
        code, err = _stop(serve)                    # mid-stream: no end-of-stream marker
        assert code == 0, err
        con.until(lambda: len(con.seqs) >= 2500, timeout=30)
        assert con.seqs == list(range(2500))        # the drain flushed the lag
        rec = read_stream_record(os.path.join(ck, "stream-73.json"))
        assert rec["seq"] == 2499 and rec["t_next"] == 2500
        eng = StreamEngine.resume(rec["file"])      # a valid engine checkpoint
        assert eng.n_samples == 2500
        assert eng.learner_duty == 0.5              # --learner-duty is in the checkpoint
        assert not eng.learning                     # --learn-samples 2000: it stopped learning
        eng.close()
        assert ("learning on (learner duty 0.5 per stream), for each stream's first 2,000 "
                "samples") in err, err
        serve2 = _serve(fitted, pub.endpoint, con, *args)
        pub.wait_subscriber(con)
        pub.send(X[2500:4000], range(2500, 4000))
        pub.pub.send_multipart(encode_heartbeat(b"s", 3999, 0.0, end=True))
        _wait_for_output(con, 3999, serve2)
        code2, err2 = _stop(serve2)
    finally:
        _teardown((serve, serve2), pub, con)
    assert code2 == 0, err2
    assert con.seqs == list(range(4000)) and con.ts == list(range(4000))
    assert "resumed from checkpoint" in err2 and "last sequence number 2499" in err2, err2
    assert "0 sample(s) lost since the checkpoint" in err2, err2
    assert "resumed streams keep their checkpoint's" in err2, err2


def test_e2e_sigkill_loses_only_samples_since_the_checkpoint(fitted, tmp_path):
    ck = str(tmp_path / "ck")
    X = fitted["X"][:3000]
    pub = Publisher()
    con = Consumer()
    args = ("--checkpoint", ck, "--checkpoint-every", "1000")
    serve = _serve(fitted, pub.endpoint, con, *args)
    serve2 = None
    try:
        pub.wait_subscriber(con)
        pub.send(X[:2500], range(2500))
        _wait_for_output(con, 2497, serve)
        serve.kill()
        serve.communicate(timeout=30)
        rec = read_stream_record(os.path.join(ck, "stream-73.json"))
        c = rec["seq"]
        # lost: the samples after the checkpoint -- fewer than checkpoint-every, plus the
        # read batch (at most 256) at whose end the next checkpoint was due, if the kill
        # came between its posteriors' publication and its checkpoint
        assert 2499 - c <= 1000 + 256, c
        serve2 = _serve(fitted, pub.endpoint, con, *args)
        pub.wait_subscriber(con)
        n_before = len(con.seqs)
        pub.send(X[2500:3000], range(2500, 3000))
        pub.pub.send_multipart(encode_heartbeat(b"s", 2999, 0.0, end=True))
        _wait_for_output(con, 2999, serve2)
        code2, err2 = _stop(serve2)
    finally:
        _teardown((serve, serve2), pub, con)
    assert code2 == 0, err2
    lost = 2500 - c - 1
    assert f"the checkpoint ended at {c}: {lost} sample(s) lost since the checkpoint" in err2, err2
    after = con.seqs[n_before:]
    # the lag pending at the checkpoint is published again (at-least-once), then 2500..2999
    assert after == [s for s, _, _ in rec["pending"]] + list(range(2500, 3000)), after[:5]


def test_pending_fifo_matches_a_deque():
    """The service's array FIFO of (t, seq, ts) against a deque of tuples."""
    from collections import deque

    from streamfhmm.io.wire import SampleRun
    from streamfhmm.service import _Pending
    seed = 11
    print("seed", seed)
    rng = np.random.default_rng(seed)
    fifo, ref = _Pending(capacity=4), deque()
    t = 0
    for _ in range(400):
        u = rng.random()
        if u < 0.3:
            ts = float(rng.normal() * 10.0 ** int(rng.integers(-5, 12)))
            s = int(rng.integers(0, 1000))
            fifo.append(t, s, ts)
            ref.append((t, s, ts))
            t += 1
        elif u < 0.55:
            k = int(rng.integers(1, 40))
            seq = np.arange(k, dtype=np.int64) + int(rng.integers(0, 10**6))
            tss = rng.normal(size=k) * 1e9
            text = np.zeros((k, 32), np.uint8)
            tlen = np.zeros(k, np.int64)
            for i, v in enumerate(tss.tolist()):
                b = b"%r" % v
                text[i, :len(b)] = np.frombuffer(b, np.uint8)
                tlen[i] = len(b)
            fifo.append_run(t, SampleRun(b"x", seq, text, tlen, np.zeros((k, 1))))
            ref.extend((t + i, int(seq[i]), tss[i]) for i in range(k))
            t += k
        elif u < 0.75 and ref:
            q = ref[0][0] + int(rng.integers(0, 3))
            while ref and ref[0][0] < q:
                ref.popleft()
            want = ref.popleft()[1:] if ref and ref[0][0] == q else (-1, 0.0)
            assert fifo.pop(q) == want
        elif ref:
            q = ref[0][0] + int(rng.integers(0, 3))
            k = int(rng.integers(1, 20))
            seq, text, tlen = fifo.take(q, k)
            while ref and ref[0][0] < q:
                ref.popleft()
            for i in range(k):
                if ref and ref[0][0] == q + i:
                    _, s, ts = ref.popleft()
                    assert (int(seq[i]), float(text[i, :tlen[i]].tobytes())) == (s, ts)
                else:
                    assert int(seq[i]) == -1
        assert [(a, int(b), c) for a, b, c in fifo] == [(a, int(b), c) for a, b, c in ref]
        assert len(fifo) == len(ref)
    assert fifo.seq.shape[0] > 4          # it grew
    fifo.append(t, 0, 0.0)
    with pytest.raises(ValueError, match="consecutive"):
        fifo.append(t + 5, 0, 0.0)


@pytest.mark.parametrize("bad", [-1e-6, 2.0, float("nan")])
def test_batch_wait_is_validated(bad):
    with pytest.raises(ValueError, match="batch_wait"):
        StreamService(None, None, lambda topic: None, batch_wait=bad)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def _five_an_end_and_five_more(h) -> list:
    """Samples 0-4, an end-of-stream heartbeat, samples 5-9; the 5 posteriors of the first."""
    for seq in range(5):
        h.sample(b"s", seq, _values(0, seq))
    h.send(encode_heartbeat(b"s", 4, 0.0, end=True))
    got = h.recv(5)
    for seq in range(5, 10):
        h.sample(b"s", seq, _values(0, seq))
    return got


def test_a_restart_at_0_flushes_the_lag_with_edge_flags():
    """A publisher restarting at 0 (a backwards discontinuity) ends the
    engine's sequence: the samples in the smoothing lag are flushed, flagged FLAG_EDGE,
    before the new sequence starts (mutant: only a forward gap, `seq0 > last + 1`, flushes)."""
    seed = 31
    print(f"seed={seed}")
    h = Harness(engine=FakeEngine, batch_threshold=4)
    try:
        for seq in range(10):
            h.sample(b"s", seq, _values(0, seq))
        got = h.recv(8)                       # 8, 9 wait in the lag (2)
        for seq in range(5):                  # the publisher restarts at 0
            h.sample(b"s", seq, _values(0, 100 + seq))
        got += h.recv(2 + 3)
        m = h.stop()
        assert [g.seq for g in got] == list(range(10)) + [0, 1, 2]
        assert [g.flags for g in got[8:10]] == [FLAG_EDGE, FLAG_EDGE]   # the old sequence's end
        assert [g.flags for g in got[10:]] == [0, 0, 0]
        assert m["restarts"] == 1
        assert h.service.streams[b"s"].engine.flushes == 2            # restart, shutdown
    finally:
        h.close()


def test_restart_at_the_checkpoints_own_number_loses_nothing(tmp_path):
    """After a resume from a checkpoint whose last sequence number is
    0, a publisher restarting at 0 is a restart, not "-1 samples lost" (mutant `seq >= c`
    counts lost_on_resume -1)."""
    seed = 37
    print(f"seed={seed}")
    h = Harness(tmp_path, engine=FakeEngine)
    try:
        h.sample(b"s", 0, _values(0, 0))
        _wait_for(lambda: h.service.counters["samples"] == 1)
        h.stop()                              # checkpoint: last sequence number 0
        h.recv(1)                             # (the lag, flushed by the stop)
        h.start()
        assert h.service.streams[b"s"].resumed_seq == 0
        for seq in range(3):                  # the publisher restarted at 0
            h.sample(b"s", seq, _values(0, seq))
        h.send(encode_heartbeat(b"s", 2, 0.0, end=True))
        got = h.recv(3)
        m = h.stop()
        assert [g.seq for g in got] == [0, 1, 2]
        assert m["lost_on_resume"] == 0
        assert h.service.streams[b"s"].lost_on_resume == 0
    finally:
        h.close()


def test_a_repeated_end_counts_once():
    """A repeated end-of-stream heartbeat for a stream already ended
    is ignored: one end counted, one flush (mutant drops the `st.ended` guard)."""
    seed = 41
    print(f"seed={seed}")
    h = Harness(engine=FakeEngine)
    try:
        for seq in range(5):
            h.sample(b"s", seq, _values(0, seq))
        for _ in range(3):
            h.send(encode_heartbeat(b"s", 4, 0.0, end=True))
        h.recv(5)
        _wait_for(lambda: h.service.counters["heartbeats_in"] == 3)
        eng = h.service.streams[b"s"].engine
        m = h.stop()
        assert m["ends"] == 1
        assert eng.flushes == 1                  # (shutdown does not flush an ended stream)
    finally:
        h.close()


def test_end_then_more_samples_then_end_again():
    """Samples after an end-of-stream heartbeat open the stream again
    (`ended` cleared): a second end flushes their lag, and so would the shutdown (mutant
    leaves `ended` set: the last posteriors are never published)."""
    seed = 43
    print(f"seed={seed}")
    h = Harness(engine=FakeEngine)
    try:
        got = _five_an_end_and_five_more(h)
        h.send(encode_heartbeat(b"s", 9, 0.0, end=True))
        got += h.recv(5, timeout=5.0)
        m = h.stop()
        assert [g.seq for g in got] == list(range(10))
        assert [g.flags for g in got[8:]] == [FLAG_EDGE, FLAG_EDGE]
        assert m["ends"] == 2 and m["posteriors"] == 10
    finally:
        h.close()


def test_shutdown_flushes_samples_that_came_after_an_end():
    seed = 43
    print(f"seed={seed}")
    h = Harness(engine=FakeEngine)
    try:
        got = _five_an_end_and_five_more(h)
        got += h.recv(3)                       # 8, 9 in the lag
        h.service.request_stop()
        got += h.recv(2, timeout=5.0)          # the shutdown flushes them
        h.stop()
        assert [g.seq for g in got] == list(range(10))
    finally:
        h.close()


def test_status_line_reports_stale_not_restarts():
    """The status line's "stale N" is the stale count (mutant prints
    the restarts count there)."""
    seed = 47
    print(f"seed={seed}")
    h = Harness(engine=FakeEngine)
    try:
        for seq in (0, 1, 2, 3, 4, 2, 3):     # two duplicates: stale 2, restarts 0
            h.sample(b"s", seq, _values(0, seq))
        h.send(encode_heartbeat(b"s", 4, 0.0, end=True))
        h.recv(5)
        _wait_for(lambda: h.service.counters["ends"] == 1)
        m = h.service.metrics()
        assert (m["stale"], m["restarts"]) == (2, 0)
        line = h.service.status_line()
        assert "stale 2," in line, line
    finally:
        h.close()


def test_pending_position_equal_to_t_next_is_refused(tmp_path):
    """A checkpoint record whose last pending position is t_next itself
    (not before it) is damaged (mutant: `>` lets it through)."""
    seed = 53
    print(f"seed={seed}")
    d = tmp_path / "ckpt"
    d.mkdir()
    ok = _record(d, pending=[[6, 6, 1.0]])           # position 6 < t_next 7: fine
    assert read_stream_record(str(ok))["pending"] == [(6, 6, 1.0)]
    for f in d.iterdir():
        f.unlink()
    bad = _record(d, pending=[[6, 5, 1.0], [7, 6, 2.0]])   # position 7 == t_next 7
    with pytest.raises(CheckpointError, match="consecutive positions before t_next"):
        read_stream_record(str(bad))


def test_shutdown_drains_what_is_queued():
    """Shutdown reads the input still queued (within drain_timeout)
    before flushing and publishing (mutant: the drain deadline is already past)."""
    seed = 59
    print(f"seed={seed}")
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(ANY)
    source = ZmqSource(pub.getsockopt(zmq.LAST_ENDPOINT).decode(), 3, context=ctx, subscribe=False,
                       linger_ms=0)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    try:
        svc = StreamService(source, sink, lambda topic: FakeEngine(), heartbeat_interval=0,
                            log_interval=0.0, drain_timeout=5.0)
        source.subscribe()
        _handshake(pub)
        for seq in range(20):
            pub.send_multipart(encode_sample(b"s", seq, float(seq), _values(0, seq)))
        assert source.socket.poll(5000)         # queued at the service's input, never read
        time.sleep(0.2)                         # (the rest of them arrive)
        svc.shutdown()
        m = svc.metrics()
        assert m["samples"] >= 1 and m["samples"] == m["posteriors"]
    finally:
        source.close(0)
        sink.close(0)
        pub.close(0)
        ctx.term()
