"""ZeroMQ source, sink and replay publisher (wire format: :mod:`streamfhmm.io.wire`).

:class:`ZmqSource` receives, validates and sequence-checks sensor samples from a SUB
socket; :class:`ZmqSink` publishes posteriors (and heartbeats) from an XPUB socket;
:func:`replay` publishes a recorded array at a given rate, after a handshake with its
subscribers. Both classes expose their ``socket`` so a host program can put them in
its own ``zmq.Poller`` loop; neither installs signal handlers or configures logging.

Every socket sets explicit high-water marks (``hwm``, messages) and ``LINGER``
(``linger_ms``). ZeroMQ's PUB contract applies: a message published while no
subscriber is connected, or past a subscriber's high-water mark, is dropped — the
sequence numbers make such losses visible (counted as gaps). :func:`replay` is the
exception: it waits for its subscribers and, by default, blocks instead of dropping.

Example: run the engine in a host program's own loop

.. code-block:: python

    from streamfhmm import FHMM
    from streamfhmm.io.wire import Sample
    from streamfhmm.io.zmq import ZmqSource, ZmqSink
    from streamfhmm.stream.engine import StreamEngine

    model = FHMM.load("model.npz")
    engine = StreamEngine(model, learn=False)    # smooth mode: posteriors lag window // 2
    source = ZmqSource("tcp://127.0.0.1:5555", n_features=model.n_features_in_)
    sink = ZmqSink("tcp://127.0.0.1:5556")
    pending = {}                           # stream position -> (seq, ts)
    t = 0
    while True:
        item = source.recv(timeout=1.0)    # a Sample, a Heartbeat or None
        if isinstance(item, Sample):
            pending[t] = (item.seq, item.ts)
            t += 1
            for post in engine.push(item.values):
                seq, ts = pending.pop(post.t)
                sink.send(item.topic, seq, ts, post)

Malformed messages never raise out of :meth:`ZmqSource.recv`: they are counted in
``source.errors`` (by kind, see :data:`streamfhmm.io.wire.ERROR_KINDS`), logged once
per kind and interval, and skipped.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import zmq

from .._validation import check_observations
from . import _libzmq
from .fastwire import STOP_ERROR, STOP_SLOW, json_message_bytes, recv_samples, send_posteriors
from .wire import (ERROR_KINDS, SEQ_LIMIT, TS_TEXT_BYTES, Heartbeat, Sample, SampleRun, WireError, decode_input,
                   _topic_bytes, encode_heartbeat, topic_name, TsText,
                   encode_posterior, encode_posterior_batch, encode_sample, encode_service_heartbeat,
                   max_frame_bytes, subscription_prefixes)

__all__ = ["ZmqSource", "ZmqSink", "StreamSeq", "RateLimitedLog", "CurveConfig", "replay",
           "DEFAULT_HWM", "DEFAULT_LINGER_MS"]

logger = logging.getLogger(__name__)

_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)

#: default high-water mark, messages per socket and peer
DEFAULT_HWM = 100_000
#: seconds after which a connecting ZmqSource that has never connected says so (a
#: mistyped host or port, a publisher not started: ZeroMQ retries in silence)
CONNECT_WARN_SECONDS = 10.0
#: default LINGER: how long closing a socket waits to deliver queued messages
DEFAULT_LINGER_MS = 2000


class RateLimitedLog:
    """Log a message at most once per ``interval`` seconds per kind, counting the rest.

    The first event of a kind is logged at once; later ones within ``interval`` are
    counted and reported with the next logged one. A call with ``count=False`` reports a
    state checked again and again (a connection still not made), not an event: the calls
    within ``interval`` are not counted.
    """

    def __init__(self, log: logging.Logger, interval: float = 10.0, level: int = logging.WARNING):
        self.log = log
        self.interval = float(interval)
        self.level = level
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, kind: str, msg: str, *args, count: bool = True) -> bool:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            if count:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return False
        self._last[kind] = now
        n = self._suppressed.pop(kind, 0)
        if n:
            msg = msg + f" (and {n} more since the last report)"
        self.log.log(self.level, msg, *args)
        return True


@dataclass
class CurveConfig:
    """ZeroMQ CURVE security (authentication and encryption).

    A socket that binds is a CURVE server with ``secret_file`` (a certificate written
    by ``zmq.auth.create_certificates``, holding both keys); a socket that connects is
    a CURVE client of the server whose public certificate is ``server_public_file``
    (with its own keys from ``secret_file`` when given, else an ephemeral pair).
    """

    secret_file: str | None = None
    server_public_file: str | None = None

    def apply(self, socket: zmq.Socket, bind: bool):
        import zmq.auth
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq was built without CURVE support")
        if bind:
            if not self.secret_file:
                raise ValueError("a CURVE socket that binds needs a secret certificate (--curve-secret)")
            public, secret = zmq.auth.load_certificate(self.secret_file)
            if secret is None:
                raise ValueError(f"{self.secret_file} holds no secret key")
            socket.curve_secretkey = secret
            socket.curve_publickey = public
            socket.curve_server = True
        else:
            if not self.server_public_file:
                raise ValueError("a CURVE socket that connects needs the server's public "
                                 "certificate (--curve-public)")
            server_public, _ = zmq.auth.load_certificate(self.server_public_file)
            if self.secret_file:
                public, secret = zmq.auth.load_certificate(self.secret_file)
                if secret is None:
                    raise ValueError(f"{self.secret_file} holds no secret key")
            else:
                public, secret = zmq.curve_keypair()
            socket.curve_secretkey = secret
            socket.curve_publickey = public
            socket.curve_serverkey = server_public


def _attach(socket: zmq.Socket, endpoint: str, bind: bool):
    try:
        if endpoint.startswith("tcp://["):
            # an IPv6 address (tcp://[::1]:5555): libzmq takes it only on a socket with
            # IPv6 on (else "No such device"); set for this endpoint alone, so that a
            # wildcard bind elsewhere stays on IPv4
            socket.setsockopt(zmq.IPV6, 1)
        if bind:
            socket.bind(endpoint)
        else:
            socket.connect(endpoint)
    except zmq.ZMQError as exc:
        socket.close(0)
        raise OSError(f"cannot {'bind' if bind else 'connect'} {endpoint}: {exc}") from None


def _socket(context, kind, endpoint, bind, hwm, linger_ms, curve, opts=None,
            attach: bool = True) -> zmq.Socket:
    if int(hwm) < 0 or int(linger_ms) < -1:
        raise ValueError(f"hwm must be >= 0 and linger_ms >= -1, got {hwm}, {linger_ms}")
    s = context.socket(kind)
    try:
        s.setsockopt(zmq.LINGER, int(linger_ms))
        s.setsockopt(zmq.SNDHWM, int(hwm))
        s.setsockopt(zmq.RCVHWM, int(hwm))
        for k, v in (opts or {}).items():
            s.setsockopt(k, v)
        if curve is not None:
            curve.apply(s, bind)
    except Exception:
        s.close(0)
        raise
    if attach:
        _attach(s, endpoint, bind)
    return s


def _bound_endpoint(socket: zmq.Socket, endpoint: str, bind: bool) -> str:
    # binding "tcp://127.0.0.1:*" picks a free port: report the one chosen
    if bind:
        last = socket.getsockopt(zmq.LAST_ENDPOINT)
        if last:
            return last.decode()
    return endpoint


@dataclass
class StreamSeq:
    """Sequence-number bookkeeping of one input stream."""

    last_seq: int = -1
    samples: int = 0
    gaps: int = 0          # gap events
    gap_samples: int = 0   # sequence numbers never received
    stale: int = 0         # repeated or out-of-order sequence numbers, skipped
    restarts: int = 0      # the publisher restarted (at 0, or found by resync_after)
    heartbeats: int = 0
    ended: bool = False
    behind: int = 0        # consecutive numbers received in order behind last_seq, so far
    behind_next: int = -1  # the number that would continue them


class ZmqSource:
    """Receive, validate and sequence-check samples from a ZeroMQ SUB socket.

    Parameters
    ----------
    endpoint : str
        E.g. ``"tcp://127.0.0.1:5555"``.
    n_features : int
        Values per sample D; every other payload size is refused.
    topics : sequence of bytes or str, optional
        Subscription prefixes (default: every topic).
    bind : bool
        Bind the endpoint (sensors connect) instead of connecting to a publisher.
    hwm : int
        Receive high-water mark, messages.
    linger_ms : int
    context : zmq.Context, optional
    subscribe : bool
        Subscribe now; pass False to call :meth:`subscribe` later (e.g. once the
        consumers of the output are connected).
    curve : CurveConfig, optional
    log_interval : float
        Seconds between two log lines of the same kind of problem.
    max_streams : int
        Topics tracked at most; messages of further topics are counted (``untracked``)
        and skipped, so that the bookkeeping stays bounded whatever arrives. A heartbeat
        never takes the room of samples: the bookkeeping that heartbeats made for a topic
        that has sent no sample yet is given up, oldest first, when a sample of a new
        topic finds the table full (counted in ``evicted``, its gaps kept in
        ``evicted_totals``; a later message of that topic starts afresh, with no gap
        before it), and a heartbeat of a new topic never gives up anything. The
        bookkeeping of a topic that sent a sample, or whose last sequence number was
        declared by :meth:`set_last_seq` (a resumed stream), is given up only once the
        host has released it (:meth:`release`, which
        :class:`~streamfhmm.service.StreamService` calls for the topics it retires or has
        no room for), after the heartbeat-only ones.
    fast : bool
        Let :meth:`recv_runs` use the compiled receive path
        (:mod:`streamfhmm.io.fastwire`) where libzmq is reachable; False forces the
        pure pyzmq path.
    resync_after : int
        A sequence number at or before the last one seen is stale (a duplicate or a
        late message: counted and skipped), unless it is 0 (a publisher restarting at
        0). When ``resync_after`` consecutive numbers arrive in order behind the last
        one, the publisher is taken to have restarted there (at another number than 0,
        or after one message with a corrupt, far-ahead number, which otherwise made
        every later sample of its stream stale): the last of them and those after it
        are accepted, and a restart is counted. 0 never resynchronises.

    Attributes
    ----------
    socket : zmq.Socket
    endpoint : str
        The endpoint (with the port chosen, when bound to ``:*``).
    errors : dict
        Malformed messages counted by kind (:data:`~streamfhmm.io.wire.ERROR_KINDS`).
    streams : dict of bytes to StreamSeq
    untracked, evicted, disconnects, reconnects : int
        ``disconnects``: input connections that ended, as :meth:`maintain` saw them
        (libzmq drops the connection of a frame past the size bound before it is read:
        its messages are otherwise only a sequence gap).
    evicted_totals : StreamSeq
        The gaps and heartbeats counted in the bookkeeping given up (see ``max_streams``).
    """

    def __init__(self, endpoint: str, n_features: int, *, topics=None, bind: bool = False,
                 hwm: int = DEFAULT_HWM, linger_ms: int = DEFAULT_LINGER_MS, context=None,
                 subscribe: bool = True, curve: CurveConfig | None = None, log_interval: float = 10.0,
                 max_streams: int = 100_000, fast: bool = True, resync_after: int = 64):
        if int(n_features) < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        if isinstance(resync_after, bool) or not isinstance(resync_after, (int, np.integer)) \
                or resync_after < 0:
            raise ValueError(f"resync_after must be an integer >= 0 (0: never), got {resync_after!r}")
        self.resync_after = int(resync_after)
        if int(max_streams) < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.n_features = int(n_features)
        self.max_streams = int(max_streams)
        self.untracked = 0
        self.evicted = 0
        # topics whose bookkeeping the host released (release()), oldest first
        self._released: dict[bytes, None] = {}
        self.evicted_totals = StreamSeq()
        # topics whose bookkeeping only heartbeats made (no sample yet), oldest first
        self._heartbeat_only: dict[bytes, None] = {}
        self.endpoint = endpoint
        self.context = context or zmq.Context.instance()
        prefixes = []
        wanted = []
        for tp in (topics or [b""]):
            subs = subscription_prefixes(tp)
            wanted.append(subs[0])   # (the topic prefix itself; b"" for every topic)
            for p in subs:
                if p not in prefixes:
                    prefixes.append(p)
        self.prefixes = prefixes
        # the decoded topic is checked too: ZeroMQ matches a one-frame JSON message's
        # bytes, and {"topic":"a1","topic":"b1"} (the last key wins) passed a subscription
        # to "a" as topic b1 (another shard's stream)
        self._topic_prefixes = None if b"" in wanted else tuple(wanted)
        # a frame larger than any valid one is refused by libzmq before it is allocated
        self.socket = _socket(self.context, zmq.SUB, endpoint, bind, hwm, linger_ms, curve,
                              {zmq.MAXMSGSIZE: max_frame_bytes(self.n_features)}, attach=False)
        # the monitor first: on loopback the connection can be made before a monitor
        # attached after it would see the event, and the source took itself for never
        # connected (a false warning every CONNECT_WARN_SECONDS, for ever)
        try:
            self._monitor = self.socket.get_monitor_socket(
                zmq.EVENT_DISCONNECTED if bind else
                zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CONNECTED
                | zmq.EVENT_CONNECT_DELAYED)
        except BaseException:
            self.socket.close(0)
            raise
        try:
            _attach(self.socket, endpoint, bind)   # (closes the socket if it fails)
        except BaseException:
            self._monitor.close(0)
            raise
        self.endpoint = _bound_endpoint(self.socket, endpoint, bind)
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.streams: dict[bytes, StreamSeq] = {}
        self.disconnects = 0
        self._log = RateLimitedLog(logger, log_interval)
        self._subscribed = False
        self._lib = _libzmq.functions() if fast else None
        self._bufs = None
        # libzmq drops a connection that carried an oversize frame and does not retry it:
        # watch for disconnections and reconnect (see maintain()); a bound socket's peer
        # reconnects by itself, and its disconnections are only counted
        self.reconnects = 0
        self._dropped_at = None
        self._bind = bool(bind)
        #: whether a connecting source has ever connected (a bound one: always True)
        self.connected = self._bind
        self._started_at = time.monotonic()
        if subscribe:
            self.subscribe()

    def subscribe(self):
        """Subscribe to the topic prefixes (idempotent)."""
        _check_open(self)
        if not self._subscribed:
            for p in self.prefixes:
                self.socket.setsockopt(zmq.SUBSCRIBE, p)
            self._subscribed = True

    @property
    def n_malformed(self) -> int:
        return sum(self.errors.values())

    def set_last_seq(self, topic: bytes, seq: int):
        """Declare ``seq`` the last sequence number seen on ``topic`` (after a restart).

        This bookkeeping is given up only after :meth:`release` (see ``max_streams``).
        """
        st = self.streams.get(topic)
        if st is None:
            if len(self.streams) >= self.max_streams:
                self._evict()
            st = self.streams[topic] = StreamSeq()
        self._heartbeat_only.pop(topic, None)
        self._released.pop(topic, None)
        st.last_seq = int(seq)

    def feed(self, frames) -> Sample | Heartbeat | None:
        """Decode, validate and sequence-check one received message.

        Returns the :class:`~streamfhmm.io.wire.Sample` or
        :class:`~streamfhmm.io.wire.Heartbeat`, or None when the message was malformed
        or stale (counted and skipped).
        """
        try:
            item = decode_input(frames, self.n_features)
        except WireError as exc:
            self.errors[exc.kind] += 1
            self._log(exc.kind, "skipped a malformed message (%s): %s", exc.kind, exc)
            return None
        topic = item.topic
        if self._outside_topics(topic, 1):
            return None
        heartbeat = type(item) is Heartbeat
        st = self._stream(topic, 1, not heartbeat)
        if st is None:
            return None
        seq = item.seq
        last = st.last_seq
        if heartbeat:
            st.heartbeats += 1
            if seq > last and last >= 0:
                self._gap(topic, st, last, seq + 1)
            if seq > last:
                st.last_seq = seq
            st.ended = item.end
            return item
        if self._accept(topic, st, seq, 1):
            return None
        return item

    def _outside_topics(self, topic: bytes, n: int) -> bool:
        """Whether ``topic`` begins with none of this source's topics (its ``n`` messages
        are then counted as "topic" errors): a subscription matches bytes, so a one-frame
        JSON message with a repeated "topic" key, or a topic frame that reads like the
        JSON form's prefix (``{"topic":"a1``), passed one to "a" as another topic."""
        if self._topic_prefixes is None or topic.startswith(self._topic_prefixes):
            return False
        self.errors["topic"] += n
        self._log("topic", "skipped a message of topic %r: it begins with none of the "
                  "subscribed prefixes", topic_name(topic[:40]))
        return True

    def _stream(self, topic: bytes, n: int, samples: bool = True) -> StreamSeq | None:
        """The bookkeeping of ``topic`` (new if there is room), or None: its n messages
        are then counted as untracked. ``samples``: the messages are samples (else a
        heartbeat), which may take the room of a topic only heartbeats were seen of."""
        st = self.streams.get(topic)
        if st is None:
            if len(self.streams) >= self.max_streams and not (samples and self._evict()):
                self.untracked += n
                self._log("streams", "skipped a message of a new topic %r: already %d topics "
                          "(max_streams)", topic_name(topic[:40]), len(self.streams))
                return None
            st = self.streams[topic] = StreamSeq()
            if not samples:
                self._heartbeat_only[topic] = None
        elif samples and self._heartbeat_only:
            self._heartbeat_only.pop(topic, None)
        return st

    def release(self, topic: bytes):
        """Let the bookkeeping of ``topic`` be given up when a sample of a new topic needs
        its place (after the topics only heartbeats were seen of, the longest released
        first); until then it is kept and used as before. For a host that stops serving
        a topic (:class:`~streamfhmm.service.StreamService` retires a stream, or has no
        room for one), so that the table stays bounded. :meth:`hold` takes it back."""
        if topic in self.streams and topic not in self._heartbeat_only:
            self._released.pop(topic, None)
            self._released[topic] = None

    def hold(self, topic: bytes):
        """Keep the bookkeeping of ``topic`` again (a host serving it again)."""
        self._released.pop(topic, None)

    def _evict(self) -> bool:
        """Give up the bookkeeping of the oldest topic only heartbeats were seen of, else
        of the topic released longest ago (its gaps, stale samples, restarts and
        heartbeats go to ``evicted_totals``; a later message of it starts afresh, with no
        gap before it); False if there is neither."""
        pool = self._heartbeat_only or self._released
        if not pool:
            return False
        topic = next(iter(pool))
        del pool[topic]
        st = self.streams.pop(topic)
        gone = self.evicted_totals
        gone.gaps += st.gaps
        gone.gap_samples += st.gap_samples
        gone.stale += st.stale
        gone.restarts += st.restarts
        gone.heartbeats += st.heartbeats
        self.evicted += 1
        self._log("evict", "gave up the bookkeeping of topic %r (%s) for a new topic: already "
                  "%d topics (max_streams)", topic_name(topic[:40]),
                  "heartbeats only, no sample" if pool is self._heartbeat_only else "released",
                  len(self.streams) + 1)
        return True

    def _accept(self, topic: bytes, st: StreamSeq, seq: int, n: int) -> int:
        """Sequence-check n samples with consecutive numbers from ``seq``: count a gap
        before them, a restart (at 0, or found by ``resync_after``), or the first ones
        already seen (stale, skipped); update the stream. Returns how many leading
        samples are skipped."""
        last = st.last_seq
        skip = 0
        # the numbers already received in order behind the last one, that this run continues
        behind = st.behind if seq == st.behind_next else 0
        if seq == last + 1 or last < 0:
            pass
        elif seq > last:
            self._gap(topic, st, last, seq)
        elif seq == 0:
            st.restarts += 1
            self._log("restart", "stream %r restarted at sequence number 0 (after %d)",
                      topic_name(topic), last)
        elif self.resync_after and behind + min(n, last - seq + 1) >= self.resync_after:
            # the resync_after-th number in order behind the last one: accepted, with those
            # after it in this run, after a discontinuity (the ones before it were stale);
            # also when the run goes on past the last one (one read took the restarted
            # publisher's numbers that far: read one by one, they resynchronise as here)
            skip = self.resync_after - behind - 1
            st.stale += skip
            st.restarts += 1
            self._log("restart", "stream %r restarted at sequence number %d: %d numbers in "
                      "order behind the last one, %d (resync_after)", topic_name(topic), seq + skip,
                      self.resync_after, last)
        else:
            whole = seq + n - 1 <= last
            skip = min(n, last - seq + 1)
            st.stale += skip
            self._log("stale", "stream %r: skipped sequence number %d, not after %d",
                      topic_name(topic), seq, last)
            if whole:
                st.behind = behind + n
                st.behind_next = seq + n
                return skip
        st.behind, st.behind_next = 0, -1
        st.last_seq = seq + n - 1
        st.samples += n - skip
        st.ended = False
        return skip

    def _gap(self, topic, st, last, seq):
        st.gaps += 1
        st.gap_samples += seq - last - 1
        self._log("gap", "stream %r: sequence numbers %d..%d missing (%d samples)",
                  topic_name(topic), last + 1, seq - 1, seq - last - 1)

    def maintain(self) -> int:
        """Count ended input connections and reconnect one libzmq dropped for good; call
        it now and then (cheap).

        A connecting SUB whose publisher sent a frame past the size bound is
        disconnected by libzmq and, unlike after an ordinary disconnection, not retried:
        when a disconnection is not followed by a retry within half a second, this
        reconnects. A bound SUB's peers reconnect by themselves; their disconnections (a
        publisher leaving, or dropped for an oversize frame) are counted. Returns the
        number of disconnections seen.
        """
        mon = self._monitor
        if mon is None:
            return 0
        n = 0
        while mon.poll(0):
            try:
                frames = mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = int.from_bytes(frames[0][:2], "little")
            if event == zmq.EVENT_DISCONNECTED:
                n += 1
                self._dropped_at = time.monotonic()
            else:   # a retry or a connection: libzmq is on it
                self._dropped_at = None
                if event == zmq.EVENT_CONNECTED:
                    self.connected = True
        if not self.connected and time.monotonic() - self._started_at > CONNECT_WARN_SECONDS:
            self._log("connect", "input %s has not connected after %.0f s: is the publisher up, "
                      "and are its host and port right? (ZeroMQ keeps retrying)", self.endpoint,
                      time.monotonic() - self._started_at, count=False)   # (checked every tick)
        self.disconnects += n
        if self._bind:
            self._dropped_at = None
        elif self._dropped_at is not None and time.monotonic() - self._dropped_at > 0.5:
            self._dropped_at = None
            self.reconnects += 1
            self._log("disconnect", "input connection to %s dropped and not retried (a frame over %d "
                      "bytes?): reconnecting", self.endpoint, max_frame_bytes(self.n_features))
            try:
                self.socket.disconnect(self.endpoint)
            except zmq.ZMQError:
                pass
            self.socket.connect(self.endpoint)
        return n

    def recv(self, timeout: float | None = None) -> Sample | Heartbeat | None:
        """The next valid message, waiting up to ``timeout`` seconds (None: forever).

        Returns None on timeout. Malformed messages are counted and skipped.
        """
        _check_open(self)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 100
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                wait = min(wait, int(math.ceil(left * 1000)))
            if not self.socket.poll(wait, zmq.POLLIN):
                self.maintain()
                continue
            item = self.feed(self.socket.recv_multipart())
            if item is not None:
                return item

    def recv_ready(self, max_messages: int = 1000) -> list:
        """Every valid message already queued (up to ``max_messages``), without waiting."""
        _check_open(self)
        out = []
        recv = self.socket.recv
        feed = self.feed
        for _ in range(max_messages):
            # frame by frame: Frame.more is much cheaper than getsockopt(RCVMORE)
            try:
                fr = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                break
            frames = [fr.bytes]
            while fr.more:
                fr = recv(_NOBLOCK, copy=False)
                frames.append(fr.bytes)
            item = feed(frames)
            if item is not None:
                out.append(item)
        return out

    @property
    def fast(self) -> bool:
        """Whether :meth:`recv_runs` uses the compiled receive path."""
        return self._lib is not None

    def recv_runs(self, max_messages: int = 1000, copy: bool = True) -> list:
        """Like :meth:`recv_ready`, with samples grouped into runs.

        Consecutive samples of one topic with consecutive sequence numbers come as one
        :class:`~streamfhmm.io.wire.SampleRun`; heartbeats, and samples that the compiled
        path leaves to the Python decoder, as :class:`~streamfhmm.io.wire.Heartbeat` and
        :class:`~streamfhmm.io.wire.Sample`. Validation, counting and sequence checks are
        those of :meth:`feed`. Without the compiled path every sample is a ``Sample``.

        With ``copy=False`` the runs' arrays are views of this source's buffers, valid
        until the next call (for a consumer that uses them at once).
        """
        _check_open(self)
        lib = self._lib
        if lib is None:
            return self.recv_ready(max_messages)
        b = self.buffers(max_messages)
        out = []
        left = int(max_messages)
        sock = self.socket.underlying
        status = b["status"]
        used = 0   # rows of the buffers filled by earlier calls (their runs may be views)
        while left > 0:
            u = used
            k = recv_samples(lib.recv, lib.getsockopt, lib.errno, sock, left, self.n_features,
                             b["frames"], b["frame_len"], b["topic"][u:], b["topic_len"][u:], b["seq"][u:],
                             b["ts_text"][u:], b["ts_len"][u:], b["values"][u:], b["value_bytes"][u:],
                             b["run_start"], status)
            why, n_frames, err, n_runs = status.tolist()
            if k:
                starts = b["run_start"][:n_runs + 1].tolist()
                for r in range(n_runs):
                    run = self._feed_run(b, u + starts[r], u + starts[r + 1], copy)
                    if run is not None:
                        out.append(run)
                left -= k
                used += k
            if why == STOP_SLOW:
                left -= 1
                item = self.feed_scratch(n_frames)
                if item is not None:
                    out.append(item)
            elif why == STOP_ERROR:
                raise zmq.ZMQError(err)
            else:
                break
        return out

    def buffers(self, max_messages: int) -> dict:
        """The compiled receive path's arrays, for reads of up to ``max_messages``
        (``frames``, ``frame_len``: one message's frames; per message ``topic``,
        ``topic_len``, ``seq``, ``ts_text``, ``ts_len``, ``values``, ``value_bytes``;
        ``run_start``, ``status``)."""
        b = self._bufs
        if b is None or b["seq"].shape[0] < max_messages:
            b = self._bufs = self._alloc(max(int(max_messages), 1))
        return b

    def feed_scratch(self, n_frames: int):
        """:meth:`feed` for the message of ``n_frames`` frames a compiled receive left in
        the scratch frames of :meth:`buffers` (it stopped there for the Python decoder)."""
        b = self._bufs
        lens = b["frame_len"].tolist()
        frames = [b["frames"][i, :lens[i]].tobytes() for i in range(min(n_frames, 3))]
        frames += [b""] * (n_frames - len(frames))   # only their number matters then
        return self.feed(frames)

    def _alloc(self, K: int) -> dict:
        D = self.n_features
        values = np.zeros((K, D))
        return {"frames": np.zeros((4, max_frame_bytes(D) + 1), np.uint8),
                "frame_len": np.zeros(4, np.int64),
                "topic": np.zeros((K, 256), np.uint8), "topic_len": np.zeros(K, np.int64),
                "seq": np.zeros(K, np.int64), "ts_text": np.zeros((K, TS_TEXT_BYTES), np.uint8),
                "ts_len": np.zeros(K, np.int64), "values": values,
                "value_bytes": values.view(np.uint8).reshape(K, 8 * D),
                "run_start": np.zeros(K + 1, np.int64), "status": np.zeros(4, np.int64)}

    def _feed_run(self, b: dict, a: int, e: int, copy: bool = True) -> SampleRun | None:
        """:meth:`feed` for the samples ``a .. e-1`` of the buffers (one topic, consecutive
        sequence numbers); returns the run of those accepted, or None."""
        topic = b["topic"][a, :b["topic_len"][a]].tobytes()
        n = e - a
        if self._outside_topics(topic, n):
            return None
        st = self._stream(topic, n)
        if st is None:
            return None
        skip = self._accept(topic, st, int(b["seq"][a]), n)
        if skip == n:
            return None
        a += skip
        if not copy:
            return SampleRun(topic, b["seq"][a:e], b["ts_text"][a:e], b["ts_len"][a:e], b["values"][a:e])
        values = b["values"][a:e].copy()
        values.flags.writeable = False
        return SampleRun(topic, b["seq"][a:e].copy(), b["ts_text"][a:e].copy(), b["ts_len"][a:e].copy(),
                         values)

    def __iter__(self):
        """Samples forever (heartbeats are consumed silently)."""
        while True:
            item = self.recv()
            if type(item) is Sample:
                yield item

    def close(self, linger_ms: int | None = None):
        if self._monitor is not None:
            try:
                self.socket.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close(0)
            self._monitor = None
        self.socket.close(linger_ms)


class ZmqSink:
    """Publish posteriors and heartbeats from a ZeroMQ XPUB socket.

    An XPUB is a PUB that also reports its subscribers' subscriptions, which lets a
    publisher wait for them (:meth:`wait_for_subscribers`) instead of sleeping.

    Parameters
    ----------
    endpoint : str
    bind : bool
        Bind (default; consumers connect) or connect (to a forwarder).
    format : {"binary", "json"}
    hwm : int
        Send high-water mark per subscriber, messages; past it messages are dropped.
    linger_ms : int
    context : zmq.Context, optional
    curve : CurveConfig, optional
    nodrop : bool
        Block (up to ``send_timeout_ms``) instead of dropping when a subscriber is at
        its high-water mark.
    send_timeout_ms : int
        With ``nodrop``: how long a send may block before the message is dropped.
    fast : bool
        Let :meth:`send_block` use the compiled send path where libzmq is reachable
        (the messages of a batch, binary or JSON, formatted and sent in one call); False
        forces the pure pyzmq path.
    """

    def __init__(self, endpoint: str, *, bind: bool = True, format: str = "binary",
                 hwm: int = DEFAULT_HWM, linger_ms: int = DEFAULT_LINGER_MS, context=None,
                 curve: CurveConfig | None = None, nodrop: bool = False, send_timeout_ms: int = 1000,
                 fast: bool = True):
        if format not in ("binary", "json"):
            raise ValueError(f"format must be 'binary' or 'json', got {format!r}")
        self.format = format
        self.endpoint = endpoint
        self.context = context or zmq.Context.instance()
        # every subscription and every unsubscription, a departing subscriber's included
        # (XPUB_VERBOSE alone reports the latter only when a prefix loses its last
        # subscriber: with consumers coming and going, ``subscriptions`` grew without end)
        opts = {getattr(zmq, "XPUB_VERBOSER", zmq.XPUB_VERBOSE): 1}
        if nodrop:
            opts[zmq.XPUB_NODROP] = 1
            opts[zmq.SNDTIMEO] = int(send_timeout_ms)
        self.socket = _socket(self.context, zmq.XPUB, endpoint, bind, hwm, linger_ms, curve, opts)
        self.endpoint = _bound_endpoint(self.socket, endpoint, bind)
        self.subscriptions: list[bytes] = []
        self.sent = 0
        self.dropped = 0
        self._lib = _libzmq.functions() if fast else None
        # the compiled send's scratch: header text, one payload, [errno, dropped]
        self._header = np.zeros(256 + TS_TEXT_BYTES, np.uint8)
        self._payload = np.zeros(0)
        self._json_prefix = {}                 # topic -> the JSON message's beginning
        self._no_prefix = np.zeros(0, np.uint8)
        self._status = np.zeros(2, np.int64)

    def send_frames(self, frames) -> bool:
        """Send one message; False if it was dropped (``nodrop`` send timed out)."""
        _check_open(self)
        send = self.socket.send
        last = len(frames) - 1
        try:
            send(frames[0], _SNDMORE if last else 0)
        except zmq.Again:
            self.dropped += 1
            return False
        for i in range(1, last + 1):
            while True:  # the rest of a message whose first frame was accepted
                try:
                    send(frames[i], _SNDMORE if i < last else 0)
                    break
                except zmq.Again:
                    continue
        self.sent += 1
        return True

    def send(self, topic, seq: int, ts: float, posterior) -> bool:
        """Publish one posterior about input sample (``seq``, ``ts``) of ``topic`` (bytes or
        str)."""
        return self.send_frames(encode_posterior(topic, seq, ts, posterior, self.format))

    def send_batch(self, topic, seqs, tss, batch) -> int:
        """Publish several posteriors of one stream (arrays, see
        :func:`~streamfhmm.io.wire.encode_posterior_batch`); returns how many were sent."""
        n = 0
        for frames in encode_posterior_batch(topic, seqs, tss, batch, self.format):
            n += self.send_frames(frames)
        return n

    @property
    def fast(self) -> bool:
        """Whether :meth:`send_block` uses the compiled send path."""
        return self._lib is not None

    def send_block(self, topic, seq, ts_text, ts_len, batch) -> int:
        """Publish several posteriors of one stream, time stamps given as text.

        Parameters
        ----------
        topic : bytes or str
        seq : ndarray of int64, shape (n,)
            Input sequence numbers.
        ts_text : ndarray of uint8, shape (n, TS_TEXT_BYTES); ts_len : ndarray of int64, shape (n,)
            The input time stamps' JSON number texts (see
            :class:`~streamfhmm.io.wire.SampleRun`).
        batch : PosteriorBatch
            With arrays ``t``, ``theta``, ``rho``, ``mean``, ``version``, ``flags``.

        Returns
        -------
        int
            How many were sent (the rest were dropped, see ``nodrop``).
        """
        _check_open(self)
        topic = _topic_bytes(topic)
        lib = self._lib
        if lib is None:
            # (their texts kept: the compiled path repeats them, and so does a posterior
            # published alone)
            tss = [TsText.from_row(r, m) for r, m in zip(ts_text, ts_len.tolist())]
            return self.send_batch(topic, seq.tolist(), tss, batch)
        M, D = batch.theta.shape[1], batch.mean.shape[1]
        header, payload, prefix = self.send_scratch(topic, M, D)
        i8, f8 = np.int64, np.float64
        sent = send_posteriors(lib.send, lib.errno, self.socket.underlying,
                               np.frombuffer(topic, np.uint8), np.ascontiguousarray(seq, i8),
                               np.ascontiguousarray(batch.t, i8), ts_text, np.ascontiguousarray(ts_len, i8),
                               np.ascontiguousarray(batch.version, i8), np.ascontiguousarray(batch.flags, i8),
                               np.ascontiguousarray(batch.theta, f8), np.ascontiguousarray(batch.rho, f8),
                               np.ascontiguousarray(batch.mean, f8), header, payload, self._status, prefix)
        return self._count(sent)

    def send_scratch(self, topic: bytes, n_chains: int, n_features: int):
        """``(header, payload, json_prefix)`` for a compiled send of posteriors of
        ``topic`` (:func:`~streamfhmm.io.fastwire.send_posteriors`): scratch arrays of
        the right sizes, and the JSON message's beginning (empty for binary output)."""
        prefix = self._no_prefix
        if self.format == "json":
            prefix = self._json_prefix.get(topic)
            if prefix is None:
                if len(self._json_prefix) >= 4096:
                    self._json_prefix.clear()
                text = b'{"topic":%s,"seq":' % json.dumps(topic.decode("utf-8")).encode()
                prefix = self._json_prefix[topic] = np.frombuffer(text, np.uint8)
            need = json_message_bytes(prefix.shape[0], n_chains, n_features)
            if self._header.shape[0] < need:
                self._header = np.zeros(need, np.uint8)
        return self._header, self.payload_scratch(n_chains, n_features), prefix

    def payload_scratch(self, n_chains: int, n_features: int) -> np.ndarray:
        """The compiled send's payload scratch, float64 of shape (2 M + D,)."""
        size = 2 * n_chains + n_features
        if self._payload.shape[0] != size:
            self._payload = np.zeros(size)
        return self._payload

    def _count(self, sent: int) -> int:
        """Account for a compiled send (``self._status`` = [errno, dropped])."""
        err, dropped = self._status.tolist()
        self.sent += sent
        self.dropped += dropped
        if err:
            raise zmq.ZMQError(err)
        return sent

    def send_heartbeat(self, topic: bytes, seq: int, t: int | None = None, end: bool = False) -> bool:
        """A one-way heartbeat of stream ``topic``: last sequence number ``seq`` published."""
        return self.send_frames(encode_heartbeat(topic, seq, time.time(), end=end, format=self.format, t=t))

    def send_service_heartbeat(self, n_streams: int) -> bool:
        """The service's heartbeat on the empty topic."""
        return self.send_frames(encode_service_heartbeat(n_streams, time.time(), self.format))

    def poll_subscriptions(self) -> int:
        """Read the pending (un)subscription notifications; returns how many arrived."""
        _check_open(self)
        n = 0
        while True:
            try:
                msg = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return n
            n += 1
            if msg[:1] == b"\x01":
                self.subscriptions.append(msg[1:])
            elif msg[:1] == b"\x00" and msg[1:] in self.subscriptions:
                self.subscriptions.remove(msg[1:])

    def n_subscribers(self, first_frame: bytes | None = None) -> int:
        """Subscriptions of the subscribers connected (those matching ``first_frame``,
        when given), as of the last :meth:`poll_subscriptions`."""
        if first_frame is None:
            return len(self.subscriptions)
        return sum(1 for p in self.subscriptions if first_frame.startswith(p))

    def wait_for_subscribers(self, n: int = 1, timeout: float | None = None,
                             first_frame: bytes | None = None, should_stop=None) -> bool:
        """Wait until ``n`` subscriptions (matching ``first_frame``) have arrived.

        Returns False on timeout or when ``should_stop()`` becomes true.
        """
        _check_open(self)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.n_subscribers(first_frame) < n:
            if should_stop is not None and should_stop():
                return False
            wait = 100
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wait = max(1, min(wait, int(left * 1000)))
            if self.socket.poll(wait, zmq.POLLIN):
                self.poll_subscriptions()
        return True

    def close(self, linger_ms: int | None = None):
        self.socket.close(linger_ms)


#: seconds :func:`replay` tries to send its end-of-stream heartbeat on a blocked socket
_END_TIMEOUT = 10.0
#: milliseconds :func:`replay` lets the queue drain once asked to stop (else linger_ms)
_STOP_LINGER_MS = 2000


def _check_open(io) -> None:
    """RuntimeError once ``io`` (a ZmqSource or ZmqSink) is closed (its socket's calls
    raised pyzmq's ZMQError ENOTSOCK or ENOTSUP; the compiled paths passed libzmq a null
    socket handle, which it refuses with ENOTSOCK)."""
    if io.socket.closed:
        raise RuntimeError(f"this {type(io).__name__} is closed")


def _send_until(send, frames, give_up) -> bool:
    """Send one message with ``send`` (a socket's), retrying while a ``nodrop`` socket's
    send times out (``zmq.Again``: a subscriber at its high-water mark) until
    ``give_up()`` is true; whether it was sent. (Once the first frame is taken, ZeroMQ
    takes the rest of the message.)"""
    last = len(frames) - 1
    while True:
        try:
            send(frames[0], _SNDMORE if last else 0)
            break
        except zmq.Again:
            if give_up():
                return False
    for k in range(1, last + 1):
        send(frames[k], _SNDMORE if k < last else 0)
    return True


def replay(X, endpoint: str, *, rate: float | None = None, topic=b"", format: str = "binary",
           bind: bool = True, wait_subscribers: int = 1, wait_timeout: float | None = None,
           start_seq: int = 0, hwm: int = DEFAULT_HWM, linger_ms: int = 60_000,
           heartbeat_interval: float = 1.0, end: bool = True, nodrop: bool = True,
           time_budget: float | None = None, progress: bool = False, context=None,
           curve: CurveConfig | None = None, should_stop=None, announce=None) -> dict:
    """Publish the rows of X as samples with sequence numbers and time stamps.

    Parameters
    ----------
    X : array_like, shape (T, D)
        NaN marks a missing value (a row may have none: it is sent all the same).
    endpoint : str
    rate : float, optional
        Messages per second (None or 0: as fast as possible).
    topic : bytes or str
    format : {"binary", "json"}
        Multipart ``[topic, header, payload]`` or one JSON frame.
    bind : bool
        Bind the endpoint (default) or connect to it.
    wait_subscribers : int
        Publish nothing until this many subscriptions matching ``topic`` have arrived
        (the XPUB handshake that avoids ZeroMQ's slow-joiner loss; 0 to not wait).
    wait_timeout : float, optional
        Seconds to wait for them; ``TimeoutError`` after.
    start_seq : int
        Sequence number of the first row.
    hwm, linger_ms : int
        High-water mark; how long closing waits for queued messages to be delivered.
    heartbeat_interval : float
        Heartbeat when nothing was sent for this long (slow rates).
    end : bool
        Finish with an end-of-stream heartbeat.
    nodrop : bool
        Block rather than drop when a subscriber falls behind its high-water mark (in
        both formats; the end-of-stream heartbeat waits for at most 10 s).
    time_budget : float, optional
        Stop after this many seconds (also while blocked by a subscriber).
    progress : bool
        Show a progress bar.
    should_stop : callable, optional
        Polled between messages; stop when it returns True.
    announce : callable, optional
        ``announce(endpoint)`` once the socket is bound or connected (with the port
        chosen when ``endpoint`` ends in ``:*``), before waiting for subscribers.

    Returns
    -------
    dict
        ``sent``, ``seconds`` (from the first message to the last), ``rate``
        (messages/s achieved), ``last_seq``, ``dropped``.

    Notes
    -----
    ``ts`` is the wall-clock time of sending (``time.time()``).

    With ``bind=False`` (connecting to a subscriber that binds, as ``serve --bind`` or
    ``ZmqSource(bind=True)``), libzmq passes the subscriber's subscription to the new
    connection only once the subscriber's owner calls into its socket (a receive or a
    poll), as a service's loop does. A :class:`ZmqSource` read only after ``replay``
    returns, in the same thread, never is, and the wait for subscribers lasts until
    ``wait_timeout``: call ``replay`` from another thread or process.
    """
    # (what the wire carries: an infinity reached every receiver as a malformed message
    # and a sequence gap, and JSON failed mid-way; a row with every value missing is a
    # sample, which the engine imputes)
    X = check_observations(X, allow_nan=True, min_samples=0, allow_empty_rows=True)
    if rate is not None and (not rate >= 0 or not math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number of messages per second, got {rate}")
    if isinstance(start_seq, (bool, np.bool_)) or not isinstance(start_seq, (int, np.integer)) \
            or not 0 <= start_seq <= SEQ_LIMIT - max(len(X), 1):
        raise ValueError(f"start_seq must be an integer in [0, 2**63 - {max(len(X), 1)}] (the {len(X):,} "
                         f"rows' sequence numbers must stay below 2**63), got {start_seq!r}")
    start_seq = int(start_seq)
    own = context is None   # a private context, terminated at the end: that is what
    context = context or zmq.Context()   # makes LINGER deliver the queued messages
    try:
        sink = ZmqSink(endpoint, bind=bind, format=format, hwm=hwm, linger_ms=linger_ms,
                       context=context, curve=curve, nodrop=nodrop)
    except BaseException:
        if own:
            context.term()
        raise
    bar = None

    def asked_to_stop() -> bool:
        return should_stop is not None and bool(should_stop())

    try:
        if announce is not None:
            announce(sink.endpoint)
        first = encode_sample(topic, start_seq, 0.0, X[0] if len(X) else np.zeros(X.shape[1]), format)[0]
        if wait_subscribers > 0:
            if not sink.wait_for_subscribers(wait_subscribers, wait_timeout, first, should_stop):
                if asked_to_stop():
                    return {"sent": 0, "seconds": 0.0, "rate": 0.0, "last_seq": start_seq - 1, "dropped": 0}
                raise TimeoutError(f"no subscriber for topic {topic!r} on {sink.endpoint} after "
                                   f"{wait_timeout:g} s")
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(X), unit="msg", desc="replay", mininterval=0.5)
        n = len(X)
        binary = format == "binary"
        tb = first if binary else None    # the topic frame
        rows = X.astype("<f8").tobytes()
        row_bytes = 8 * X.shape[1]
        send = sink.socket.send
        period = 1.0 / rate if rate else 0.0
        t0 = time.perf_counter()
        last_send = t0
        deadline = None if time_budget is None else t0 + time_budget
        i = 0
        seq = start_seq
        shown = 0

        def stopping() -> bool:   # polled while a nodrop send waits for a subscriber
            return asked_to_stop() or (deadline is not None and time.perf_counter() >= deadline)

        while i < n:
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                break
            if asked_to_stop():
                break
            due = n if not period else min(n, int((now - t0) / period) + 1)
            if due <= i:
                if now - last_send >= heartbeat_interval:
                    sink.send_frames(encode_heartbeat(topic, seq - 1, time.time(), format=format))
                    last_send = now
                time.sleep(min(t0 + i * period - now, 0.05))
                continue
            stop_at = min(due, i + 1000)
            if binary:
                while i < stop_at:
                    hdr = b'{"seq":%d,"ts":%r}' % (seq, time.time())
                    while True:
                        try:
                            send(tb, _SNDMORE)
                            break
                        except zmq.Again:  # nodrop: a subscriber is at its high-water mark
                            if stopping():
                                stop_at = i
                                break
                    if stop_at == i:
                        break
                    send(hdr, _SNDMORE)
                    send(rows[i * row_bytes:(i + 1) * row_bytes])
                    i += 1
                    seq += 1
            else:
                while i < stop_at:
                    if not _send_until(send, encode_sample(topic, seq, time.time(), X[i], format), stopping):
                        stop_at = i
                        break
                    i += 1
                    seq += 1
            last_send = time.perf_counter()
            if bar is not None and i - shown >= 1000:
                bar.update(i - shown)
                shown = i
        seconds = time.perf_counter() - t0
        if end:   # (a nodrop socket blocked by a subscriber: try for at most END_TIMEOUT s)
            give_up = time.perf_counter() + _END_TIMEOUT
            if not _send_until(send, encode_heartbeat(topic, seq - 1, time.time(), end=True, format=format),
                               lambda: asked_to_stop() or time.perf_counter() > give_up):
                logger.warning("the end-of-stream heartbeat was not sent: a subscriber %s",
                               "was at its high-water mark when asked to stop" if asked_to_stop() else
                               f"stayed at its high-water mark for {_END_TIMEOUT:g} s")
        if bar is not None:
            bar.update(i - shown)
        return {"sent": i, "seconds": seconds, "rate": i / seconds if seconds > 0 else math.inf,
                "last_seq": seq - 1, "dropped": sink.dropped}
    finally:
        if bar is not None:
            bar.close()
        # asked to stop: the queue gets at most _STOP_LINGER_MS to be delivered (a
        # subscriber that stopped reading held the stop for the whole linger, a minute)
        sink.close((_STOP_LINGER_MS if linger_ms < 0 else min(linger_ms, _STOP_LINGER_MS))
                   if asked_to_stop() else None)   # (linger_ms -1: ZeroMQ's for ever)
        if own:
            context.term()   # blocks until the queue is delivered or the linger has passed

