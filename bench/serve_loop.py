"""CPU cost per message of the serve loop, in one process: the serving lane, the
compiled wire path and the pure pyzmq path, measured in the same run.

    python bench/serve_loop.py [--messages 40000] [--batches 1 10 256] [--repeats 3] [--format binary]

A publisher queues ``--messages`` samples on a real loopback TCP socket; once they are
all queued, a :class:`~streamfhmm.service.StreamService` (learning off) reads them
``batch`` at a time (``StreamService.read``, what one wake-up of ``serve`` does), pushes
them through its engine and publishes the posteriors to a connected subscriber. Printed:
microseconds of CPU per message for each read size, for

* the serving lane (:mod:`streamfhmm.io.lane`: receive, recognition and publication
  in one compiled call per read, for binary and JSON output alike: the lane encodes
  JSON in compiled code, with :mod:`streamfhmm.io.floatrepr`'s numbers),
* the compiled wire path with the lane off (``ZmqSource.recv_runs``, the engine's
  ``push_many``, ``ZmqSink.send_block``: three compiled calls and the Python between),
* the pure pyzmq path (``fast=False``: ``recv_ready`` and ``send_batch``),

and the ratios. Each read size times at least 10,000 messages per path (``--messages``
caps it), ``--repeats`` times with the three paths in alternating order; printed are
the median CPU per message of each path, the ratios of those medians and the range of
the per-repeat lane / compiled ratio. No network peer and no load generator share the
processor: this is the service's own cost, the end-to-end figures are bench/zmq.py's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

# this directory holds bench/zmq.py, named like the pyzmq package: import zmq first
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
import numpy as np  # noqa: E402
import zmq  # noqa: E402

sys.path.append(_HERE)
from _common import header, table  # noqa: E402

from streamfhmm import FHMM  # noqa: E402
from streamfhmm.io.zmq import ZmqSink, ZmqSource  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402
from streamfhmm.service import StreamService  # noqa: E402
from streamfhmm.stream.engine import StreamEngine  # noqa: E402


def _queue(pub, X, lo, hi):
    """Publish rows lo..hi-1 (they queue at the subscribed source)."""
    for i in range(lo, hi):
        pub.send_multipart([b"bench", b'{"seq":%d,"ts":%r}' % (i, time.time()), X[i].tobytes()])
    time.sleep(0.5)   # let the I/O threads move the queue before the timed reads


def measure(model, X, fmt, path, batch, n):
    """CPU µs per message of ``StreamService.read`` on ``path``: "lane", "compiled" or
    "pyzmq"."""
    fast = path != "pyzmq"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sink = ZmqSink("tcp://127.0.0.1:*", format=fmt, hwm=0, context=ctx, fast=fast)
    out = ctx.socket(zmq.SUB)
    out.setsockopt(zmq.RCVHWM, 0)
    out.connect(sink.endpoint)
    out.subscribe(b"")
    source = ZmqSource(f"tcp://127.0.0.1:{port}", X.shape[1], hwm=0, context=ctx, fast=fast)
    svc = StreamService(source, sink, lambda t: StreamEngine(model, learn=False), heartbeat_interval=0,
                        batch_size=batch, lane=path == "lane")
    try:
        assert sink.wait_for_subscribers(1, timeout=30)
        time.sleep(0.2)
        warm = 2000
        _queue(pub, X, 0, warm)                      # compile / load, open the stream
        while svc.counters["samples"] < warm:
            if source.socket.poll(100):
                svc.read()
        _queue(pub, X, warm, warm + n)
        cpu = 0.0
        while svc.counters["samples"] < warm + n:
            if not source.socket.poll(100):          # (not counted: serve blocks there)
                continue
            c0 = time.thread_time()
            svc.read()
            cpu += time.thread_time() - c0
    finally:
        svc.shutdown()
        source.close(0)
        sink.close(0)
        out.close(0)
        pub.close(0)
        ctx.term()
    return cpu / n * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=40_000)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 10, 256], help="messages per read")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed passes per path and read size, in alternating order (medians printed)")
    ap.add_argument("--format", default="binary", choices=["binary", "json"], help="output format")
    args = ap.parse_args(argv)
    header("streamfhmm serve loop in one process: CPU per message, compiled wire path vs pure pyzmq")
    p = FHMMParams.random(3, 4, random_state=0, noise=0.3)
    gen = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, startprob=p.startprob)
    X, _ = gen.sample(args.messages + 5000, random_state=1)
    model = FHMM(n_chains=3, window=5, n_hidden=16, random_state=0)
    model.fit(X[:3000], max_iter=50, progress=False)
    X = np.ascontiguousarray(X[3000:], dtype="<f8")
    print(f"# model: M=3, D=4, window 5, 16 hidden units, smooth mode, learning off; "
          f"{args.messages:,} messages, output {args.format}")
    rows = []
    paths = ["pyzmq", "compiled", "lane"]
    for b in args.batches:
        n = min(args.messages, max(10_000, 400 * b))
        us = {p: [] for p in paths}
        for r in range(args.repeats):
            for path in (paths if r % 2 == 0 else paths[::-1]):   # alternate the order
                us[path].append(measure(model, X, args.format, path, b, n))
        py, c, lane = (float(np.median(us[p])) for p in paths)
        lc = [ci / li for ci, li in zip(us["compiled"], us["lane"])]
        rows.append({"messages per read": b, "messages timed": f"{n:,} x {args.repeats}",
                     "pyzmq path us/msg": py, "compiled path us/msg": c, "compiled / pyzmq": py / c,
                     "lane us/msg": lane, "lane / compiled": c / lane,
                     "lane / compiled range": f"{min(lc):.2f}-{max(lc):.2f}",
                     "lane msg/s per core": 1e6 / lane})
    cols = ["messages per read", "messages timed", "pyzmq path us/msg", "compiled path us/msg",
            "compiled / pyzmq", "lane us/msg", "lane / compiled", "lane / compiled range",
            "lane msg/s per core"]
    print("# x / y: speed-up of x over y (ratio of their median CPU per message, same run); "
          "range: lane / compiled in each repeat")
    table(rows, cols)

if __name__ == "__main__":
    main()
