"""ZmqSource, ZmqSink and replay over real sockets on 127.0.0.1 (in one process)."""
import logging
import re
import threading
import time

import numpy as np
import pytest
import zmq

from streamfhmm.io.wire import (Heartbeat, PosteriorMessage, Sample, decode_input, decode_output,
                                encode_heartbeat, encode_sample, max_frame_bytes)
from streamfhmm.io.zmq import (CurveConfig, RateLimitedLog, StreamSeq, ZmqSink, ZmqSource, replay)
from streamfhmm.stream.posterior import Posterior

SEED = 7
ANY = "tcp://127.0.0.1:*"


_OPEN = []


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    while _OPEN:
        _OPEN.pop().close(0)
    c.destroy(linger=0)


def _pub(ctx):
    s = ctx.socket(zmq.XPUB)
    _OPEN.append(s)
    s.setsockopt(zmq.LINGER, 0)
    s.bind(ANY)
    return s, s.getsockopt(zmq.LAST_ENDPOINT).decode()


def _wait_sub(pub, timeout_ms=5000):
    """The XPUB handshake: the SUB's subscription has reached the publisher."""
    assert pub.poll(timeout_ms), "no subscription arrived"
    return pub.recv()


def _recv_all(source, n, timeout=10.0):
    out = []
    while len(out) < n:
        item = source.recv(timeout=timeout)
        assert item is not None, f"timed out after {len(out)} of {n} messages"
        out.append(item)
    return out


def test_source_receives_and_checks_sequence(ctx):
    pub, ep = _pub(ctx)
    src = ZmqSource(ep, 2, context=ctx, linger_ms=0)
    assert _wait_sub(pub) == b"\x01"
    for seq in [0, 1, 2, 5, 6, 4, 7, 0, 1]:           # gap 3..4, stale 4, restart at 0
        pub.send_multipart(encode_sample(b"a", seq, float(seq), [seq, -seq]))
    pub.send_multipart(encode_sample(b"b", 10, 0.0, [1.0, 2.0]))   # a second stream
    items = _recv_all(src, 9)
    assert [i.seq for i in items] == [0, 1, 2, 5, 6, 7, 0, 1, 10]
    assert all(type(i) is Sample for i in items)
    np.testing.assert_array_equal(items[3].values, [5.0, -5.0])
    a = src.streams[b"a"]
    assert (a.gaps, a.gap_samples, a.stale, a.restarts, a.samples) == (1, 2, 1, 1, 8)
    assert src.streams[b"b"].gap_samples == 0       # first message of a stream: no gap
    src.close(0)


def _feed_seqs(src, topic, seqs):
    """Feed samples with these sequence numbers (no socket); the numbers accepted."""
    out = []
    for seq in seqs:
        item = src.feed(encode_sample(topic, int(seq), float(seq), [float(seq)]))
        if item is not None:
            out.append(item.seq)
    return out


def test_a_publisher_restarting_elsewhere_than_0_is_followed(ctx):
    """Only a restart at 0 was recognised: a publisher restarting at 1 lost every later
    sample as stale, and so did a stream after one message with a corrupt, far-ahead
    number. ``resync_after`` numbers in order behind the last one are a restart; fewer
    (a resent window, duplicates) stay stale; runs count like single samples."""
    src = ZmqSource("tcp://127.0.0.1:0", 1, context=ctx, linger_ms=0, bind=True, resync_after=8)
    assert _feed_seqs(src, b"a", range(50)) == list(range(50))
    got = _feed_seqs(src, b"a", range(1, 30))           # restarted at 1
    assert got == list(range(8, 30))                     # 1..7 stale, 8 resynchronises
    a = src.streams[b"a"]
    assert (a.stale, a.restarts, a.last_seq, a.samples) == (7, 1, 29, 72)
    assert _feed_seqs(src, b"b", [0, 1, 2, 10**15]) == [0, 1, 2, 10**15]   # corrupt number
    assert _feed_seqs(src, b"b", range(3, 20)) == list(range(10, 20))
    assert src.streams[b"b"].restarts == 1
    assert _feed_seqs(src, b"c", range(20)) == list(range(20))
    assert _feed_seqs(src, b"c", list(range(13, 20)) + [20]) == [20]     # 7 resent: stale
    assert _feed_seqs(src, b"c", [5, 6, 7, 9, 10, 11, 12, 13, 14]) == []  # not in order
    c = src.streams[b"c"]
    assert (c.stale, c.restarts) == (16, 0)
    st = src.streams.setdefault(b"d", StreamSeq())       # runs, as recv_runs passes them
    assert src._accept(b"d", st, 0, 100) == 0
    assert src._accept(b"d", st, 40, 5) == 5             # 5 behind, stale
    assert src._accept(b"d", st, 45, 6) == 2             # the 8th behind is 47: restart
    assert (st.last_seq, st.restarts, st.stale, st.samples) == (50, 1, 7, 104)
    never = ZmqSource("tcp://127.0.0.1:0", 1, context=ctx, linger_ms=0, bind=True, resync_after=0)
    _feed_seqs(never, b"a", range(50))
    assert _feed_seqs(never, b"a", range(1, 200)) == list(range(50, 200))
    for bad in (-1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="resync_after must be an integer >= 0"):
            ZmqSource("tcp://127.0.0.1:0", 1, context=ctx, bind=True, resync_after=bad)
    for s in (src, never):
        s.close(0)


@pytest.mark.parametrize("seed", range(40))
def test_sequence_checks_do_not_depend_on_how_reads_split_runs(ctx, seed):
    """A run of consecutive numbers that starts behind the last one and goes on past it
    (a publisher restarted at 1, its numbers read in one batch) was stale up to the last
    number and then taken as the old sequence going on: resync_after never applied,
    unlike when the same numbers came in short reads."""
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    seqs, q = [], 0
    for _ in range(60):   # stretches in order, with restarts, resends, gaps, ends of numbers
        q = int(rng.choice([0, 1, max(0, q - int(rng.integers(1, 30))), q + int(rng.integers(1, 4))]))
        k = int(rng.integers(1, 40))
        seqs += list(range(q, q + k))
        q += k
    results = []
    for split in ("one", "runs", "random"):
        src = ZmqSource("tcp://127.0.0.1:0", 1, context=ctx, linger_ms=0, bind=True, resync_after=8)
        st = src.streams.setdefault(b"a", StreamSeq())
        runs, i = [], 0
        while i < len(seqs):   # consecutive numbers, cut as the split says
            j = i + 1
            while j < len(seqs) and seqs[j] == seqs[j - 1] + 1 and (
                    split == "runs" or (split == "random" and rng.random() < 0.8)):
                j += 1
            runs.append((seqs[i], j - i))
            i = j
        taken = []
        for first, n in runs:
            skip = src._accept(b"a", st, first, n)
            taken += range(first + skip, first + n)
        results.append((taken, st.last_seq, st.samples, st.stale, st.restarts, st.gaps, st.gap_samples))
        src.close(0)
    assert results[1] == results[0] and results[2] == results[0]


def test_heartbeat_reveals_tail_gap_and_end(ctx):
    pub, ep = _pub(ctx)
    src = ZmqSource(ep, 1, context=ctx, linger_ms=0)
    _wait_sub(pub)
    pub.send_multipart(encode_sample(b"s", 0, 0.0, [1.0]))
    pub.send_multipart(encode_heartbeat(b"s", 3, 1.0, end=True))    # 1..3 were lost
    pub.send_multipart(encode_sample(b"s", 4, 2.0, [1.0]))          # no second gap
    items = _recv_all(src, 3)
    assert type(items[1]) is Heartbeat and items[1].end
    st = src.streams[b"s"]
    assert (st.gaps, st.gap_samples, st.heartbeats, st.samples) == (1, 3, 1, 2)
    src.close(0)


def test_set_last_seq_counts_the_gap_after_a_restart(ctx):
    pub, ep = _pub(ctx)
    src = ZmqSource(ep, 1, context=ctx, linger_ms=0)
    src.set_last_seq(b"s", 99)
    _wait_sub(pub)
    pub.send_multipart(encode_sample(b"s", 120, 0.0, [1.0]))
    _recv_all(src, 1)
    assert src.streams[b"s"].gap_samples == 20
    src.close(0)


def test_malformed_counted_logged_once_and_skipped(ctx, caplog):
    pub, ep = _pub(ctx)
    src = ZmqSource(ep, 3, context=ctx, linger_ms=0, log_interval=60.0)
    _wait_sub(pub)
    bad = [
        [b"t", b'{"seq":0,"ts":0}'],                                    # frames
        [b"\xff", b'{"seq":0,"ts":0}', np.zeros(3).tobytes()],          # topic
        [b"t", b"{nope", np.zeros(3).tobytes()],                        # json
        [b"t", b'{"seq":"0","ts":0}', np.zeros(3).tobytes()],           # fields
        [b"t", b'{"seq":0,"ts":0}', np.zeros(2).tobytes()],             # size
        [b"t", b'{"seq":0,"ts":0}', np.array([0, np.inf, 0]).tobytes()],  # nonfinite
    ]
    with caplog.at_level(logging.WARNING, logger="streamfhmm.io.zmq"):
        for _ in range(3):
            for frames in bad:
                pub.send_multipart(frames)
        pub.send_multipart(encode_sample(b"t", 0, 0.0, [1.0, 2.0, 3.0]))
        item = src.recv(timeout=10.0)
    assert type(item) is Sample and item.seq == 0
    assert src.errors == {"frames": 3, "topic": 3, "json": 3, "fields": 3, "size": 3, "nonfinite": 3}
    assert src.n_malformed == 18
    kinds = [r.getMessage().split("(")[1].split(")")[0] for r in caplog.records]
    assert sorted(kinds) == sorted(["frames", "topic", "json", "fields", "size", "nonfinite"])
    src.close(0)


def test_oversize_frame_never_reaches_the_decoder(ctx):
    """libzmq drops the connection of a peer that sends a frame past MAXMSGSIZE."""
    pub, ep = _pub(ctx)
    src = ZmqSource(ep, 2, context=ctx, linger_ms=0)
    _wait_sub(pub)
    big = b"x" * (max_frame_bytes(2) + 1)
    pub.send_multipart([b"t", b'{"seq":0,"ts":0}', big])
    # the SUB reconnects by itself: keep publishing valid samples until one arrives
    seq = 1
    item = None
    for _ in range(200):
        pub.send_multipart(encode_sample(b"t", seq, 0.0, [1.0, 2.0]))
        seq += 1
        item = src.recv(timeout=0.05)
        if item is not None:
            break
    assert type(item) is Sample and item.seq >= 1
    assert src.n_malformed == 0 and src.disconnects == 1 and src.reconnects == 1
    src.close(0)


def test_oversize_frame_to_a_bound_source_is_counted(ctx):
    """Bound, the source had no monitor: libzmq dropped the publisher's connection (the
    publisher reconnects by itself) and nothing counted it."""
    src = ZmqSource("tcp://127.0.0.1:0", 2, context=ctx, linger_ms=0, bind=True)
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(src.endpoint)
    try:
        item = None
        for seq in range(200):   # until the subscription has reached the publisher
            pub.send_multipart(encode_sample(b"t", seq, 0.0, [1.0, 2.0]))
            item = src.recv(timeout=0.05)
            if item is not None:
                break
        assert type(item) is Sample
        pub.send_multipart([b"t", b'{"seq":0,"ts":0}', b"x" * (max_frame_bytes(2) + 1)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:   # the drop is seen, the publisher is back
            seq += 1
            pub.send_multipart(encode_sample(b"t", seq, 0.0, [1.0, 2.0]))
            src.maintain()
            if src.recv(timeout=0.05) is not None and src.disconnects:
                break
        assert src.n_malformed == 0 and src.disconnects == 1 and src.reconnects == 0
    finally:
        pub.close(0)
        src.close(0)


def test_sink_handshake_and_posterior(ctx):
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    assert sink.endpoint.startswith("tcp://127.0.0.1:") and not sink.endpoint.endswith("*")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVTIMEO, 10_000)          # a lost message fails the test, not hangs it
    sub.connect(sink.endpoint)
    sub.subscribe(b"house")
    assert sink.wait_for_subscribers(1, timeout=5.0, first_frame=b"house/1")
    assert not sink.wait_for_subscribers(1, timeout=0.05, first_frame=b"garden")
    p = Posterior(t=3, theta=np.array([0.25, 0.5]), rho=np.array([0.0, 0.1]), mean=np.array([1.0]),
                  version=4, flags=2)
    sink.send(b"house/1", 17, 2.5, p)
    sink.send(b"garden", 1, 0.0, p)                  # not subscribed: filtered
    sink.send_heartbeat(b"house/1", 17, t=4)
    m = decode_output(sub.recv_multipart())
    assert type(m) is PosteriorMessage and (m.seq, m.t, m.version, m.flags) == (17, 3, 4, 2)
    np.testing.assert_array_equal(m.theta, [0.25, 0.5])
    hb = decode_output(sub.recv_multipart())
    assert type(hb) is Heartbeat and hb.seq == 17 and hb.t == 4
    assert sink.sent == 3
    sink.close(0)
    sub.close(0)


def test_sink_counts_the_subscribers_connected_as_they_come_and_go(ctx):
    """A consumer that leaves while another with the same subscription stays is no longer
    counted (it was, for ever: ``subscriptions`` grew with every consumer that came)."""
    import time
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)

    def settles_at(n, timeout=10.0):
        deadline = time.monotonic() + timeout
        while sink.n_subscribers() != n:
            if time.monotonic() > deadline:
                return False
            if sink.socket.poll(20):
                sink.poll_subscriptions()
        return True
    stay = ctx.socket(zmq.SUB)
    stay.setsockopt(zmq.LINGER, 0)
    stay.connect(sink.endpoint)
    stay.subscribe(b"")
    assert settles_at(1)
    for _ in range(3):
        c = ctx.socket(zmq.SUB)
        c.setsockopt(zmq.LINGER, 0)
        c.connect(sink.endpoint)
        c.subscribe(b"")
        assert settles_at(2)
        c.close(0)
        assert settles_at(1), f"{sink.n_subscribers()} subscriptions counted, 1 consumer connected"
    stay.close(0)
    assert settles_at(0)
    sink.close(0)


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_replay_waits_for_subscriber_and_loses_nothing(ctx, fmt):
    print(f"seed={SEED}")
    X = np.random.default_rng(SEED).standard_normal((5000, 3))
    X[10, 1] = X[20] = np.nan          # missing values, and a sample without any (sent too)
    ready = threading.Event()
    endpoint = {}
    result = {}

    def announce(ep):
        endpoint["ep"] = ep
        ready.set()

    def run():
        result.update(replay(X, ANY, rate=None, topic="dev", format=fmt, context=ctx, wait_timeout=10.0,
                             announce=announce, start_seq=100))

    th = threading.Thread(target=run)
    th.start()
    assert ready.wait(10.0)
    # the subscriber connects after the publisher is up: no message may be lost anyway
    src = ZmqSource(endpoint["ep"], 3, topics=["dev"], context=ctx, linger_ms=0)
    items = _recv_all(src, len(X) + 1)
    th.join(10.0)
    samples = [i for i in items if type(i) is Sample]
    assert [s.seq for s in samples] == list(range(100, 100 + len(X)))
    np.testing.assert_array_equal(np.array([s.values for s in samples]), X)
    assert type(items[-1]) is Heartbeat and items[-1].end and items[-1].seq == 100 + len(X) - 1
    assert result["sent"] == len(X) and result["last_seq"] == 100 + len(X) - 1
    assert src.n_malformed == 0 and src.streams[b"dev"].gap_samples == 0
    src.close(0)


def test_source_checks_the_decoded_topic_against_its_topics(ctx):
    """ZeroMQ's subscription matches a one-frame JSON message's bytes: with topics=["a"],
    {"topic":"a1","topic":"b1",...} (the last key wins) was served as topic b1, another
    shard's stream. The decoded topic is checked too (counted as a "topic" error)."""
    src = ZmqSource("inproc://topics-checked", 3, topics=["a", "c"], bind=True, context=ctx,
                    subscribe=False, linger_ms=0)
    everything = ZmqSource("inproc://topics-all", 3, bind=True, context=ctx, subscribe=False,
                           linger_ms=0)
    dup = b'{"topic":"a1","topic":"b1","seq":0,"ts":0,"values":[1,2,3]}'
    assert src.feed([dup]) is None
    assert src.errors["topic"] == 1 and src.n_malformed == 1 and b"b1" not in src.streams
    for frames in ([b'{"topic":"a1","seq":0,"ts":0,"values":[1,2,3]}'],
                   encode_sample(b"c7", 0, 0.0, np.ones(3))):
        item = src.feed(frames)
        assert type(item) is Sample and item.topic in (b"a1", b"c7")
    assert src.errors["topic"] == 1
    assert everything.feed([dup]).topic == b"b1"    # no topics: every topic is served
    src.close(0)
    everything.close(0)


@pytest.mark.parametrize("fast", [False, True])
def test_topics_check_on_both_receive_paths(ctx, fast):
    """A binary message whose topic frame reads like the JSON form's prefix
    ('{"topic":"a1') matches the subscription to '{"topic":"a' that topics=["a"] makes;
    the compiled receive path served it as its own stream (the Python path refused it)."""
    pub, ep = _pub(ctx)
    src = ZmqSource(ep, 2, topics=["a"], context=ctx, linger_ms=0, fast=fast)
    for _ in src.prefixes:                       # one subscription message per prefix
        _wait_sub(pub)
    for seq in range(5):
        pub.send_multipart(encode_sample(b'{"topic":"a1', seq, 0.0, [1.0, 2.0]))
        pub.send_multipart(encode_sample(b"a2", seq, 0.0, [1.0, 2.0]))
    got = []
    deadline = time.monotonic() + 10
    while sum(len(i.seq) if hasattr(i.seq, "__len__") else 1 for i in got) < 5 \
            and time.monotonic() < deadline:
        got += src.recv_runs(100)
        time.sleep(0.01)
    time.sleep(0.1)
    got += src.recv_runs(100)
    assert {i.topic for i in got} == {b"a2"}
    assert src.errors["topic"] == 5 and list(src.streams) == [b"a2"]
    src.close(0)


def _ipv6_loopback() -> bool:
    import socket
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_ipv6_endpoints_bind_and_connect(ctx):
    """tcp://[::1]:* passed the command line's endpoint check but no socket turned IPv6
    on: binding or connecting it failed with "No such device"."""
    src = ZmqSource("tcp://[::1]:*", 3, bind=True, context=ctx, linger_ms=0)
    assert src.endpoint.startswith("tcp://[::1]:")
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.IPV6, 1)
    pub.connect(src.endpoint)
    deadline = time.monotonic() + 10
    items = []
    while not items and time.monotonic() < deadline:   # (a PUB drops until connected)
        pub.send_multipart(encode_sample(b"s", 0, 0.0, np.arange(3.0)))
        time.sleep(0.05)
        items = src.recv_ready(10)
    assert items and items[0].values.tolist() == [0.0, 1.0, 2.0]
    sink = ZmqSink("tcp://[::1]:*", context=ctx, linger_ms=0)
    assert sink.endpoint.startswith("tcp://[::1]:")
    pub.close(0)
    src.close(0)
    sink.close(0)


def _small_buffered_subscriber(ctx, endpoint):
    """A SUB socket with a high-water mark of 10 and a small kernel buffer: a publisher
    reaches its high-water mark soon after this stops reading."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 10)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint)
    sub.subscribe(b"")
    return sub


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_replay_blocks_for_a_stalled_subscriber_and_loses_nothing(ctx, fmt):
    """nodrop (the default) in both formats: a consumer that stalls for 3 s with a high-
    water mark of 10 gets every message and the end of the stream (the JSON path gave
    up on a message after the 1 s send timeout, dropped it and counted it as sent)."""
    print(f"seed={SEED}")
    n, D = 2000, 500           # large messages: the socket buffers fill within the stall
    X = np.random.default_rng(SEED).standard_normal((n, D))
    res, ep = {}, {}
    ready = threading.Event()
    th = threading.Thread(target=lambda: res.update(replay(
        X, ANY, format=fmt, hwm=10, context=ctx, wait_timeout=10.0,
        announce=lambda e: (ep.setdefault("e", e), ready.set()))))
    th.start()
    assert ready.wait(10.0)
    sub = _small_buffered_subscriber(ctx, ep["e"])
    assert sub.poll(10_000)
    time.sleep(3.0)                       # the consumer stalls
    seqs, end = [], False
    while not end and sub.poll(10_000):
        m = decode_input(sub.recv_multipart(), D)
        if type(m) is Sample:
            seqs.append(m.seq)
        else:
            end = m.end
    th.join(10.0)
    assert seqs == list(range(n)) and end
    assert res["sent"] == n and res["dropped"] == 0
    sub.close(0)


def test_replay_time_budget_holds_while_blocked(ctx):
    """A subscriber that never reads: the time budget still ends a nodrop replay, and
    ``sent`` counts only the messages sent."""
    X = np.zeros((20_000, 500))       # 80 MB of messages: far more than the buffers hold
    res, ep = {}, {}
    ready = threading.Event()
    th = threading.Thread(target=lambda: res.update(replay(
        X, ANY, format="json", hwm=10, context=ctx, wait_timeout=10.0, time_budget=2.0, end=False,
        announce=lambda e: (ep.setdefault("e", e), ready.set()))))
    th.start()
    assert ready.wait(10.0)
    sub = _small_buffered_subscriber(ctx, ep["e"])
    th.join(30.0)
    assert not th.is_alive()
    assert 0 < res["sent"] < len(X) and res["dropped"] == 0 and res["seconds"] < 6.0, res
    sub.close(0)


@pytest.mark.parametrize("linger_ms", [60_000, -1])   # (-1: ZeroMQ's linger for ever)
def test_replay_asked_to_stop_with_a_stalled_subscriber_ends_promptly(ctx, caplog, linger_ms):
    """Ctrl-C while a subscriber has stopped reading: the queue gets a short linger, not
    the minute of linger_ms (replay ended 62 s after the signal), and the warning about
    the end-of-stream heartbeat says why it was not sent (it claimed a 10 s wait)."""
    X = np.zeros((20_000, 500))
    res, ep, stop = {}, {}, threading.Event()
    ready = threading.Event()
    th = threading.Thread(daemon=True, target=lambda: res.update(replay(
        X, ANY, format="binary", hwm=10, wait_timeout=10.0, linger_ms=linger_ms,
        should_stop=stop.is_set, announce=lambda e: (ep.setdefault("e", e), ready.set()))))
    th.start()   # (its own context, terminated at the end: where the linger is waited)
    assert ready.wait(10.0)
    sub = _small_buffered_subscriber(ctx, ep["e"])
    assert sub.poll(10_000)
    time.sleep(1.0)                       # the buffers fill; replay waits on the subscriber
    t0 = time.monotonic()
    stop.set()
    th.join(30.0)
    sub.close(0)
    assert not th.is_alive() and time.monotonic() - t0 < 20.0
    assert 0 < res["sent"] < len(X)
    assert "was at its high-water mark when asked to stop" in caplog.text, caplog.text


def test_replay_paces_at_the_rate(ctx):
    X = np.zeros((600, 1))
    res = {}
    ready = threading.Event()
    ep = {}

    def announce(e):
        ep["e"] = e
        ready.set()

    th = threading.Thread(target=lambda: res.update(
        replay(X, ANY, rate=2000.0, context=ctx, wait_timeout=10.0, announce=announce)))
    th.start()
    assert ready.wait(10.0)
    src = ZmqSource(ep["e"], 1, context=ctx, linger_ms=0)
    _recv_all(src, len(X) + 1)
    th.join(10.0)
    # 600 messages at 2000/s: the pacer sends message i no earlier than i / 2000 s after
    # its start, so the achieved rate is at most 600 / 0.2995 = 2003/s on any machine (an
    # unpaced replay sends tens of thousands per second; 10x too fast, 20,000/s). Load
    # only delays and the pacer catches up in bursts, so a loaded 2-core machine lowers the
    # rate only by the stalls it adds: 400/s leaves 1.2 s of stalls on a 0.3 s run and
    # still catches a pacer 10x too slow (200/s).
    print(f"replay rate {res['rate']:,.0f} messages/s (asked 2,000)")
    assert 400 <= res["rate"] <= 2100, res
    src.close(0)


def test_replay_timeout_without_subscriber(ctx):
    with pytest.raises(TimeoutError, match="no subscriber"):
        replay(np.zeros((3, 1)), ANY, context=ctx, wait_timeout=0.05)


def test_replay_refuses_bad_arguments(ctx):
    with pytest.raises(ValueError, match="2-D"):
        replay(np.zeros(3), ANY, context=ctx)
    with pytest.raises(ValueError, match="rate"):
        replay(np.zeros((3, 1)), ANY, rate=-1.0, context=ctx)
    # the rows' sequence numbers must stay below 2**63, as the wire carries them (binary
    # wrote 2**63, which every decoder refuses, and counted it as sent)
    for start_seq in (-1, 2**63 - 2, 1.0, True):
        with pytest.raises(ValueError, match=re.escape("start_seq must be an integer in [0, 2**63 - 3]")):
            replay(np.zeros((3, 1)), ANY, start_seq=start_seq, context=ctx)


def test_replay_refuses_what_the_wire_cannot_carry_before_sending(ctx):
    """An infinity or text in X is refused at once with a ValueError naming X (binary sent
    such rows, which every receiver dropped as malformed behind a sequence gap; JSON
    failed half-way with json's own error). A row with every value missing is a sample."""
    sub = ctx.socket(zmq.SUB)
    _OPEN.append(sub)
    sub.setsockopt(zmq.LINGER, 0)
    for X, message in (([[1.0, 2.0], [np.inf, 0.0]], "X must not contain infinities; found inf at row 1, column 0"),
                       ([["a", "b"]], "X must be a numeric array")):
        for fmt in ("binary", "json"):
            with pytest.raises(ValueError, match=message):
                replay(X, ANY, context=ctx, format=fmt, wait_subscribers=0)
    # missing values travel (NaN in binary, null in JSON), a whole row of them too
    sink_ep = "tcp://127.0.0.1:*"
    src = ZmqSource(sink_ep, 2, bind=True, context=ctx)
    res = {}
    th = threading.Thread(target=lambda: res.update(replay([[1.0, np.nan], [2.0, 3.0], [np.nan, np.nan]],
                                                           src.endpoint, bind=False, context=ctx,
                                                           wait_timeout=10)))
    th.start()
    got = _recv_all(src, 3)
    th.join(10)
    assert res["sent"] == 3 and np.isnan(got[0].values[1]) and got[1].values.tolist() == [2.0, 3.0]
    assert np.isnan(got[2].values).all() and src.n_malformed == 0
    src.close(0)


def test_closed_source_and_sink_raise_runtime_error(ctx):
    """After close(): RuntimeError naming the class (pyzmq's ZMQError ENOTSOCK or ENOTSUP
    before; the compiled paths would hand libzmq a freed socket)."""
    src = ZmqSource(ANY, 1, bind=True, context=ctx)
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    src.close(0)
    sink.close(0)
    p = Posterior(t=0, theta=np.array([0.5]), rho=np.array([0.0]), mean=np.array([1.0]), version=0, flags=0)
    for call in (lambda: src.recv(timeout=0.1), lambda: src.recv_ready(), lambda: src.recv_runs(),
                 lambda: src.subscribe()):
        with pytest.raises(RuntimeError, match="this ZmqSource is closed"):
            call()
    for call in (lambda: sink.send(b"a", 0, 1.0, p), lambda: sink.send_frames([b"a"]),
                 lambda: sink.wait_for_subscribers(1, timeout=0.1), lambda: sink.poll_subscriptions()):
        with pytest.raises(RuntimeError, match="this ZmqSink is closed"):
            call()


def test_sink_takes_a_str_topic(ctx):
    """send and send_batch take the topic as str too (as replay and ZmqSource do): pyzmq's
    'unicode not allowed' TypeError before, and JSON failed on topic.decode."""
    for fmt in ("binary", "json"):
        sink = ZmqSink(ANY, context=ctx, linger_ms=0, format=fmt)
        sub = ctx.socket(zmq.SUB)
        _OPEN.append(sub)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVTIMEO, 10_000)      # a lost message fails the test, not hangs it
        sub.connect(sink.endpoint)
        sub.subscribe(b"caf\xc3\xa9" if fmt == "binary" else b"")
        assert sink.wait_for_subscribers(1, timeout=5.0)
        p = Posterior(t=2, theta=np.array([0.25]), rho=np.array([0.0]), mean=np.array([1.0]), version=1, flags=0)
        sink.send("café", 5, 1.5, p)
        m = decode_output(sub.recv_multipart())
        assert (m.topic, m.seq, m.t) == (b"caf\xc3\xa9", 5, 2), m
        sink.close(0)


def test_a_source_that_connects_at_once_knows_it(ctx):
    """The connection monitor was attached after ``connect``: a loopback connection made
    in between went unseen (about 4 % of sources), so the source took itself for never
    connected and warned every CONNECT_WARN_SECONDS for ever."""
    pub, ep = _pub(ctx)
    missed = []
    for i in range(100):
        src = ZmqSource(ep, 1, context=ctx, linger_ms=0)
        deadline = time.monotonic() + 10.0
        while not src.connected and time.monotonic() < deadline:
            src.maintain()
            time.sleep(0.001)
        if not src.connected:
            missed.append(i)
        src.close(0)
    assert missed == [], f"sources {missed} of 100 never saw their connection"


def test_a_connecting_source_that_never_connects_says_so(ctx, caplog, monkeypatch):
    """A mistyped host or port, or a publisher not started, left a connecting source
    waiting in silence (ZeroMQ retries): after CONNECT_WARN_SECONDS it warns, naming the
    endpoint; one that connected does not."""
    import socket
    import streamfhmm.io.zmq as zmq_io
    monkeypatch.setattr(zmq_io, "CONNECT_WARN_SECONDS", 60.0)
    pub, ep = _pub(ctx)                             # (first: it cannot take the port below)
    with socket.socket() as probe:                  # (a ZeroMQ socket closes in the background)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]               # a port nothing listens on
    lost = ZmqSource(f"tcp://127.0.0.1:{port}", 1, context=ctx, linger_ms=0)
    ok = ZmqSource(ep, 1, context=ctx, linger_ms=0)
    _wait_sub(pub)
    deadline = time.monotonic() + 10.0              # (the monitor's event can come later)
    while not ok.connected and time.monotonic() < deadline:
        ok.maintain()
        time.sleep(0.01)
    assert ok.connected
    monkeypatch.setattr(zmq_io, "CONNECT_WARN_SECONDS", 0.2)
    time.sleep(0.3)
    caplog.clear()
    with caplog.at_level("WARNING", logger="streamfhmm.io.zmq"):
        lost.maintain()
        ok.maintain()
    warned = [r.getMessage() for r in caplog.records if "has not connected" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"input tcp://127.0.0.1:{port} has not connected after")
    assert not lost.connected and ok.connected
    # checked at every tick, it is a state, not events: the next warning does not count
    # the checks between as "more" (it said "and 99 more since the last report")
    for _ in range(5):
        lost.maintain()
    lost._log.interval = 0.0
    caplog.clear()
    with caplog.at_level("WARNING", logger="streamfhmm.io.zmq"):
        lost.maintain()
    warned = [r.getMessage() for r in caplog.records if "has not connected" in r.getMessage()]
    assert len(warned) == 1 and "more since the last report" not in warned[0], warned
    lost.close(0)
    ok.close(0)


def test_bind_failure_is_a_clear_error(ctx):
    sink = ZmqSink(ANY, context=ctx, linger_ms=0)
    with pytest.raises(OSError, match="cannot bind " + sink.endpoint):
        ZmqSink(sink.endpoint, context=ctx, linger_ms=0)
    sink.close(0)


def test_rate_limited_log(caplog):
    log = logging.getLogger("streamfhmm.test_rate")
    rl = RateLimitedLog(log, interval=3600.0)
    with caplog.at_level(logging.WARNING, logger="streamfhmm.test_rate"):
        assert rl("a", "first %d", 1)
        assert not rl("a", "second %d", 2)
        assert not rl("a", "third %d", 3)
        assert rl("b", "other")
    assert [r.getMessage() for r in caplog.records] == ["first 1", "other"]
    rl.interval = 0.0
    with caplog.at_level(logging.WARNING, logger="streamfhmm.test_rate"):
        assert rl("a", "fourth")
    assert caplog.records[-1].getMessage() == "fourth (and 2 more since the last report)"
    rl.interval = 3600.0     # count=False: a state checked again and again, not counted
    assert not rl("a", "fifth", count=False) and not rl("a", "sixth", count=False)
    rl.interval = 0.0
    with caplog.at_level(logging.WARNING, logger="streamfhmm.test_rate"):
        assert rl("a", "seventh", count=False)
    assert caplog.records[-1].getMessage() == "seventh"


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_curve_encrypted_replay(ctx, tmp_path):
    import zmq.auth
    pub_file, secret_file = zmq.auth.create_certificates(str(tmp_path), "server")
    X = np.arange(20.0).reshape(10, 2)
    ready = threading.Event()
    ep = {}
    res = {}

    def announce(e):
        ep["e"] = e
        ready.set()

    th = threading.Thread(target=lambda: res.update(replay(
        X, ANY, context=ctx, wait_timeout=10.0, announce=announce,
        curve=CurveConfig(secret_file=secret_file))))
    th.start()
    assert ready.wait(10.0)
    with pytest.raises(ValueError, match="--curve-public"):
        ZmqSource(ep["e"], 2, context=ctx, curve=CurveConfig())
    src = ZmqSource(ep["e"], 2, context=ctx, linger_ms=0, curve=CurveConfig(server_public_file=pub_file))
    items = _recv_all(src, 11)
    th.join(10.0)
    np.testing.assert_array_equal(np.array([i.values for i in items[:10]]), X)
    src.close(0)


def test_source_tracks_a_bounded_number_of_topics(ctx):
    pub, ep = _pub(ctx)
    src = ZmqSource(ep, 1, context=ctx, linger_ms=0, max_streams=2)
    _wait_sub(pub)
    for topic in [b"a", b"b", b"c", b"a", b"d"]:
        pub.send_multipart(encode_sample(topic, 0 if topic != b"a" or not src.streams else 1, 0.0, [1.0]))
    pub.send_multipart(encode_heartbeat(b"e", 5, 0.0))
    pub.send_multipart(encode_sample(b"b", 1, 0.0, [1.0]))
    items = _recv_all(src, 4)
    assert [i.topic for i in items] == [b"a", b"b", b"a", b"b"]
    assert sorted(src.streams) == [b"a", b"b"] and src.untracked == 3
    src.close(0)


def test_released_bookkeeping_is_kept_until_a_new_topic_needs_its_place(ctx):
    """``release`` (the service's call for a topic it retires or has no room for) lets
    the source give up the topic's bookkeeping for a new topic, the longest released
    first; until then the topic's numbers are checked as before. ``hold`` takes it back."""
    pub, ep = _pub(ctx)
    src = ZmqSource(ep, 1, context=ctx, linger_ms=0, max_streams=2)
    _wait_sub(pub)

    def send(*msgs):
        for topic, seq in msgs:
            pub.send_multipart(encode_sample(topic, seq, 0.0, [1.0]))
    send((b"a", 0), (b"a", 3), (b"a", 1), (b"b", 0))     # a: a gap of 2, 1 stale
    assert len(_recv_all(src, 3)) == 3
    src.release(b"a")
    send((b"a", 2), (b"a", 4))                            # still checked: 2 stale, 4 follows 3
    assert [(i.topic, i.seq) for i in _recv_all(src, 1)] == [(b"a", 4)]
    send((b"c", 0))                                       # full: a's place given up
    assert [(i.topic, i.seq) for i in _recv_all(src, 1)] == [(b"c", 0)]
    assert sorted(src.streams) == [b"b", b"c"] and src.evicted == 1
    t = src.evicted_totals
    assert (t.gaps, t.gap_samples, t.stale) == (1, 2, 2)
    src.release(b"b")
    src.hold(b"b")
    send((b"d", 0), (b"b", 1))                            # nothing released: d untracked
    assert [(i.topic, i.seq) for i in _recv_all(src, 1)] == [(b"b", 1)]
    src.release(b"c")
    send((b"a", 9))                                       # c's place: a anew, no gap
    assert [(i.topic, i.seq) for i in _recv_all(src, 1)] == [(b"a", 9)]
    assert src.untracked == 1 and src.evicted == 2
    assert sum(s.gaps for s in src.streams.values()) + src.evicted_totals.gaps == 1
    src.close(0)


@pytest.mark.parametrize("fast", [False, True])
def test_heartbeats_never_take_the_room_of_samples(ctx, fast):
    """Heartbeats of topics that sent no sample (idle publishers, junk) fill the table
    only until a sample of a new topic needs the room; a resumed stream keeps its place."""
    pub, ep = _pub(ctx)
    src = ZmqSource(ep, 1, context=ctx, linger_ms=0, max_streams=2, fast=fast)
    if fast and not src.fast:
        pytest.skip("the compiled receive path needs a reachable libzmq")
    src.set_last_seq(b"r", 99)                       # a stream resumed from a checkpoint
    _wait_sub(pub)
    msgs = [encode_heartbeat(b"idle", 3, 0.0), encode_heartbeat(b"idle", 5, 0.0),  # 4, 5 lost
            encode_heartbeat(b"junk", 0, 0.0)]       # the table is full: never evicts
    msgs += [encode_sample(b"new", s, 0.0, [1.0]) for s in range(4)]    # takes idle's place
    msgs += [encode_heartbeat(b"idle", 6, 0.0),      # full again: untracked
             encode_sample(b"r", 120, 0.0, [1.0]),   # 100..119 lost since the checkpoint
             encode_sample(b"x", 0, 0.0, [1.0]),     # full, nothing to give up: untracked
             encode_sample(b"r", 121, 0.0, [1.0])]
    for frames in msgs:
        pub.send_multipart(frames)
    got = []
    for _ in range(200):
        if src.socket.poll(50):
            for it in src.recv_runs(100):
                seqs = it.seq.tolist() if hasattr(it.seq, "tolist") else [it.seq]
                got += [(type(it) is Heartbeat, it.topic, s) for s in seqs]
        if (False, b"r", 121) in got:
            break
    assert got == [(True, b"idle", 3), (True, b"idle", 5)] + [(False, b"new", s) for s in range(4)] + [
        (False, b"r", 120), (False, b"r", 121)]
    assert sorted(src.streams) == [b"new", b"r"]
    assert src.streams[b"new"].samples == 4 and src.streams[b"new"].gaps == 0
    r = src.streams[b"r"]
    assert (r.samples, r.gaps, r.gap_samples) == (2, 1, 20)
    assert src.untracked == 3 and src.evicted == 1
    gone = src.evicted_totals                        # the gap idle's heartbeats revealed is kept
    assert (gone.gaps, gone.gap_samples, gone.heartbeats) == (1, 2, 2)
    src.close(0)


@pytest.mark.parametrize("fast", [True, False])
def test_send_block_repeats_the_time_stamp_texts_with_or_without_the_compiled_path(ctx, fast):
    """Without the compiled send path (fast=False, or a platform without it) a block's
    time stamps were turned into floats and written as repr, while a posterior
    published alone repeats the input's text: one stream's output mixed the two."""
    from streamfhmm.io.wire import TS_TEXT_BYTES
    from streamfhmm.stream.engine import PosteriorBatch
    sink = ZmqSink(ANY, context=ctx, linger_ms=0, fast=fast)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    sub.connect(sink.endpoint)
    sub.subscribe(b"")
    assert sink.wait_for_subscribers(1, timeout=5.0)
    texts = [b"1700000001", b"1e3", b"2.50"]
    ts_text = np.zeros((3, TS_TEXT_BYTES), np.uint8)
    for i, t in enumerate(texts):
        ts_text[i, :len(t)] = np.frombuffer(t, np.uint8)
    p = Posterior(t=3, theta=np.array([0.25]), rho=np.array([0.0]), mean=np.array([1.0]),
                  version=4, flags=0)
    batch = PosteriorBatch.from_posteriors([p.__class__(t=3 + i, theta=p.theta, rho=p.rho, mean=p.mean,
                                                        version=4, flags=0) for i in range(3)])
    assert sink.send_block(b"s", np.array([5, 6, 7]), ts_text, np.array([len(t) for t in texts]),
                           batch) == 3
    heads = [sub.recv_multipart()[1] for _ in texts]
    assert [re.search(rb'"ts":([^,]*),', h).group(1) for h in heads] == texts
    sink.close(0)
    sub.close(0)
