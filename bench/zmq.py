"""End-to-end ZeroMQ service benchmark: throughput and publish-to-posterior latency.

    python bench/zmq.py [--messages 50000] [--rates 20000 2000] [--latency-seconds 2]

Starts ``python -m streamfhmm serve`` as a separate process on loopback TCP, for each
output format (binary, JSON) and with learning off and on. This process publishes
samples to it (multipart binary input) and subscribes to its posteriors:

* throughput: as many messages as the service takes (at most ``--window`` in flight),
  messages/s from the first publish to the last posterior received;
* latency: messages paced at each of ``--rates``; for the posterior of sample s, the time from
  publishing the sample that completes its window (s + h in smooth mode, h = window // 2)
  to receiving the posterior: p50 and p99.

Reference measured in the same run: a ZeroMQ relay that runs entirely in libzmq
(``zmq.proxy`` between an XSUB and an XPUB socket, in its own process; the same
endpoints, messages and client, no decoding, no inference, no Python per message), so
"/ relay" is the service's throughput as a fraction of what the transport alone carries
through one extra hop, and the latency columns compare likewise. Targets: >= 20,000
messages/s with learning on, p99 <= 2 ms.

A one-stream service reads through its serving lane (one compiled call per read:
receive, recognition, publication), for binary and JSON output alike (the lane encodes
JSON in compiled code too: streamfhmm/io/lane.py); the row ``--no-lane`` is the same
service on its general path, measured in the same run.

The learning-on rows run the service with its default learner duty (the fraction of one
core the background learner may use; ``--learner-duty`` here overrides it) and show the
learner's steps/s during the throughput phase and over the whole run, read from the
service's status lines, so that the trade-off between learning and serving is visible.
The throughput phase is shorter than two status intervals, so its steps/s is taken
between the last status line before the phase (the phase starts just after one) and the
first one after it: a span up to one status interval (0.25 s) longer than the phase,
that tail in the first latency phase; both durations are printed.
"""
from __future__ import annotations

import argparse
import os
import signal
import re
import subprocess
import sys
import tempfile
import threading
import time

# this file is named like the pyzmq package: take its directory off the front of the
# path before importing zmq, and put it at the end for _common
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
import numpy as np  # noqa: E402
import zmq  # noqa: E402

sys.path.append(_HERE)
from _common import header, table, wait_for_line  # noqa: E402

import _wireclient  # noqa: E402
from streamfhmm import FHMM  # noqa: E402
from streamfhmm.io import _libzmq  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402

TARGET_RATE = 20_000
TARGET_P99_MS = 2.0

_RELAY = """
import sys, zmq
ctx = zmq.Context()
xsub = ctx.socket(zmq.XSUB); xsub.setsockopt(zmq.RCVHWM, 100000); xsub.connect(sys.argv[1])
xpub = ctx.socket(zmq.XPUB); xpub.setsockopt(zmq.SNDHWM, 100000); xpub.bind(sys.argv[2])
print("relay output bound at", xpub.getsockopt_string(zmq.LAST_ENDPOINT), "(", file=sys.stderr, flush=True)
# libzmq forwards messages (all frames) downstream and subscriptions upstream, without
# the GIL and without a Python call per message
zmq.proxy(xsub, xpub)
"""


#: what serve and the relay print once their output is bound (to a port the system chose:
#: a port picked here, closed and handed on, could be taken meanwhile)
_OUTPUT_BOUND = re.compile(r"output bound at (\S+) \(")


_RECEIVER = """
import sys, time, zmq
import numpy as np
from multiprocessing import resource_tracker, shared_memory
endpoint, shm_name, n, frames, here, compiled = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                                 int(sys.argv[4]), sys.argv[5], sys.argv[6] == "1")
shm = shared_memory.SharedMemory(name=shm_name)
try:   # the creating process owns the segment (Python < 3.13 would also track it here)
    resource_tracker.unregister(shm._name, "shared_memory")
except Exception:
    pass
times = np.ndarray((n + 1,), dtype=np.float64, buffer=shm.buf)   # times[n]: messages received
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB); sub.setsockopt(zmq.RCVHWM, 0); sub.setsockopt(zmq.LINGER, 0)
sub.setsockopt(zmq.RCVTIMEO, 200)
sub.connect(endpoint); sub.subscribe(b"")
if compiled:
    sys.path.append(here)            # after pyzmq: bench/zmq.py must not shadow it
    import _wireclient as wc
    from streamfhmm.io import _libzmq
    lib, clock = _libzmq.functions(), wc.clock_function()
    buf = np.zeros((4, 1 << 16), np.uint8)
    wc.receive(lib.recv, lib.getsockopt, lib.errno, clock, sub.underlying, buf, times, 0)   # compile
    print("ready", flush=True)
    while True:
        wc.receive(lib.recv, lib.getsockopt, lib.errno, clock, sub.underlying, buf, times, 1 << 30)
print("ready", flush=True)
pc, NB = time.perf_counter, zmq.NOBLOCK
recv = sub.recv
count = 0
while True:
    try:
        h = recv()                   # blocks: the first frame wakes this process up
    except zmq.Again:
        continue
    if frames == 3:
        h = recv(NB)
        p = recv(NB)
        if not p:
            continue                 # a heartbeat
    t = pc()
    i = h.find(b'"seq":')
    if i < 0 or b'"heartbeat"' in h[:64]:
        continue
    i += 6
    j = i
    while h[j:j + 1].isdigit():
        j += 1
    s = int(h[i:j])
    if s == -1 or s >= n:
        continue
    if times[s] != times[s]:       # first copy only
        times[s] = t
        count += 1
        times[n] = count
"""


class Client:
    """This side: an XPUB publishing samples from this process; the posteriors are
    received by a separate process (blocking on its socket, so that a message is
    time-stamped when it arrives, not when a paced sender gets round to it), which
    writes arrival times into shared memory (``time.perf_counter`` is the system-wide
    monotonic clock)."""

    def __init__(self, D, n_total, frames, compiled=True):
        from multiprocessing import shared_memory
        self.compiled = compiled and _wireclient.available()
        self.frames = frames
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)   # the service's input
        self.n_total = n_total
        self.shm = shared_memory.SharedMemory(create=True, size=8 * (n_total + 1))
        self.times = np.ndarray((n_total + 1,), dtype=np.float64, buffer=self.shm.buf)
        self.times[:n_total] = np.nan
        self.times[n_total] = 0
        self.receiver = None
        self.D = D
        self.seq = 0
        self.t_sent = np.full(n_total, np.nan)
        self._topic = np.frombuffer(b"bench", np.uint8)
        self._header = np.zeros(128, np.uint8)
        self.X = None          # the rows (float64, C-contiguous) for send_many

    def subscribe(self, endpoint):
        """Start the receiving process on the service's output ``endpoint``."""
        self.receiver = subprocess.Popen(
            [sys.executable, "-c", _RECEIVER, endpoint, self.shm.name, str(self.n_total),
             str(self.frames), _HERE, "1" if self.compiled else "0"], stdout=subprocess.PIPE, text=True)
        self.receiver.stdout.readline()   # "ready": its SUB is connecting

    @property
    def received(self) -> int:
        return int(self.times[self.n_total])

    def handshake(self, timeout=120.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pub.poll(20) and self.pub.recv()[:1] == b"\x01":
                return
        raise TimeoutError("the service did not subscribe")

    def send_many(self, rows, i, j):
        """Publish rows[i:j] (the compiled path; the time stamp is read once for the burst)."""
        if not self.compiled:
            for k in range(i, j):
                self.send(rows[k])
            return
        lib = _libzmq.functions()
        text = np.frombuffer(b"%r" % time.time(), np.uint8)
        self.t_sent[self.seq:self.seq + j - i] = time.perf_counter()
        sent = _wireclient.send_burst(lib.send, self.pub.underlying, self._topic, self.seq, text,
                                      self.X[i:j], self._header)
        if sent != j - i:
            raise zmq.ZMQError(zmq.zmq_errno())
        self.seq += j - i

    def send(self, x):
        s = self.seq
        self.pub.send(b"bench", zmq.SNDMORE)
        self.pub.send(b'{"seq":%d,"ts":%r}' % (s, time.time()), zmq.SNDMORE)
        self.t_sent[s] = time.perf_counter()
        self.pub.send(x)
        self.seq += 1

    def end(self):
        self.pub.send_multipart([b"bench", b'{"heartbeat":true,"seq":%d,"ts":0,"end":true}' % (self.seq - 1), b""])

    def close(self):
        if self.receiver is not None:
            self.receiver.kill()
            self.receiver.wait()
        self.pub.close(0)
        self.ctx.term()
        del self.times
        self.shm.close()
        self.shm.unlink()


def run_phase(cl, rows, rate, window, lag, timeout=120.0):
    """Publish rows (paced at ``rate``, or flow-controlled with ``window`` in flight);
    returns (messages/s, latencies in seconds, lost)."""
    first = cl.seq
    got0 = cl.received
    n = len(rows)
    if rate and cl.compiled:   # compile (or load) the paced sender before the clock starts
        lib = _libzmq.functions()
        _wireclient.paced_send(lib.send, _wireclient.clock_function(), _wireclient.sleep_function(),
                               cl.pub.underlying, cl._topic, cl.seq, cl.X[:0], 0.0, 1.0, cl.t_sent[:0],
                               cl._header)
    t0 = time.perf_counter()
    i = 0
    deadline = time.monotonic() + timeout
    period = 1.0 / rate if rate else 0.0
    if period and cl.compiled:
        # paced in compiled code: the sender wakes up for each due message without an
        # interpreter round trip (a lighter load generator on the cores the service uses)
        lib = _libzmq.functions()
        sent = _wireclient.paced_send(lib.send, _wireclient.clock_function(), _wireclient.sleep_function(),
                                      cl.pub.underlying, cl._topic, cl.seq, cl.X[:n], t0, period,
                                      cl.t_sent[cl.seq:cl.seq + n], cl._header)
        cl.seq += sent
        i = sent
    while i < n:
        if time.monotonic() > deadline:
            break
        now = time.perf_counter()
        if period:
            due = min(n, int((now - t0) / period) + 1)
        else:
            due = min(n, cl.received - got0 + window)
        if due > i:
            cl.send_many(rows, i, due)
            i = due
        if i < n:
            # sleep until the next message is due (no busy loop: on two cores it would take
            # the processor from the service)
            wait = (t0 + i * period - time.perf_counter()) if period else 0.0002
            if wait > 0:
                time.sleep(wait)
    cl.end()   # flushes the smoothing lag
    while cl.received - got0 < n and time.monotonic() < deadline:
        time.sleep(0.002)
    arrived = cl.times[first:first + n]
    ok = np.isfinite(arrived)
    elapsed = np.nanmax(arrived) - t0 if ok.any() else float("nan")
    # the posterior of s is due once s + lag is published (the last lag come from the flush)
    k = np.arange(first, first + n - lag)
    lat = cl.times[k] - cl.t_sent[k + lag]
    lat = lat[np.isfinite(lat)]
    lost = int(n - ok.sum())
    return ok.sum() / elapsed, lat, lost


#: seconds between the service's status lines (they carry its learner step count)
STATUS_INTERVAL = 0.25
_STEPS = re.compile(r"learner steps (\d+)")
_DUTY = re.compile(r"learner duty ([0-9.e+-]+)")


def serve(model_path, source, fmt, learn, duty=None, extra=()):
    args = [sys.executable, "-m", "streamfhmm", "serve", "--model", model_path,
            "--sub", source, "--pub", "tcp://127.0.0.1:*",
            "--format", fmt, "--wait-subscribers", "1", "--status-interval", str(STATUS_INTERVAL),
            "--heartbeat", "0", *extra]
    if learn:
        args.append("--learn")
        if duty is not None:
            args += ["--learner-duty", str(duty)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class StderrLines(threading.Thread):
    """Reads a process's stderr, keeping each line with the time it arrived."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.lines = []

    def run(self):
        for line in self.stream:
            self.lines.append((time.perf_counter(), line.rstrip("\n")))

    def wait_for(self, pattern, proc, timeout=120.0):
        """Group 1 of the first line matching ``pattern`` (within ``timeout`` s, while
        ``proc`` runs)."""
        return wait_for_line(lambda: [ln for _, ln in list(self.lines)], pattern, proc, self, timeout)

    def _points(self):
        return [(t, int(m.group(1))) for t, ln in self.lines if (m := _STEPS.search(ln))]

    def steps_per_second(self, t0=None, t1=None):
        """Learner steps/s between t0 and t1, from the status lines' step counts."""
        pts = [(t, k) for t, k in self._points() if (t0 is None or t >= t0) and (t1 is None or t <= t1)]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return None
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])

    def steps_per_second_around(self, t0, t1):
        """Learner steps/s from the last status line at or before t0 to the first at or
        after t1 (for a phase shorter than two status intervals); (rate, span in s)."""
        pts = self._points()
        before = [p for p in pts if p[0] <= t0]
        after = [p for p in pts if p[0] >= t1]
        if not before or not after or after[0][0] <= before[-1][0]:
            return None, None
        (ta, ka), (tb, kb) = before[-1], after[0]
        return (kb - ka) / (tb - ta), tb - ta


def measure(cmd_factory, X, args, lag, label):
    """One configuration: ``cmd_factory(source)`` starts the process that reads this
    client's samples from ``source`` and binds its output to a port it prints."""
    n_total = args.warmup + args.messages + sum(int(r * args.latency_seconds) for r in args.rates)
    cl = Client(X.shape[1], n_total, frames=1 if "json" in label else 3, compiled=not args.python_client)
    cl.X = X
    proc = cmd_factory(cl.endpoint)
    err = StderrLines(proc.stderr)
    err.start()
    try:
        cl.subscribe(err.wait_for(_OUTPUT_BOUND, proc))
        cl.handshake()
        rows = [x.tobytes() for x in X]
        run_phase(cl, rows[:args.warmup], rate=None, window=args.window, lag=lag)     # warm up
        if "--learn" in label:
            # start the throughput phase just after a status line, so that the span of
            # steps/s (tp) begins with the phase (see steps_per_second_around)
            n0 = len(err._points())
            deadline = time.perf_counter() + 4 * STATUS_INTERVAL
            while len(err._points()) == n0 and time.perf_counter() < deadline:
                time.sleep(0.001)
        t_tp = time.perf_counter()
        tp, _, lost = run_phase(cl, rows[:args.messages], rate=None, window=args.window, lag=lag)
        t_tp = (t_tp, time.perf_counter())
        lats = []
        for rate in args.rates:
            k = int(rate * args.latency_seconds)
            _, lat, lost_k = run_phase(cl, rows[:k], rate=rate, window=args.window, lag=lag)
            lats.append(lat)
            lost += lost_k
        t_end = time.perf_counter()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err.join(10)
        cl.close()
    text = [ln for _, ln in err.lines]
    summary = [ln for ln in text if "stopped after" in ln]
    gaps = "?"
    if summary:
        gaps = summary[-1].split("gaps ")[1].split(" ")[0]
    duty = [m.group(1) for ln in text if (m := _DUTY.search(ln))]
    row = {"configuration": label, "messages/s": tp, "lost": lost, "gaps": gaps,
           "duty": duty[0] if duty else "-"}
    if "--learn" in label:
        row["steps/s (tp)"], row["_tp_span"] = err.steps_per_second_around(*t_tp)
        row["_tp_len"] = t_tp[1] - t_tp[0]
        row["steps/s (all)"] = err.steps_per_second(t_tp[0], t_end)
    for rate, lat in zip(args.rates, lats):
        row[f"p50 us @{rate:g}/s"] = float(np.percentile(lat, 50) * 1e6) if lat.size else None
        row[f"p99 us @{rate:g}/s"] = float(np.percentile(lat, 99) * 1e6) if lat.size else None
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000, help="messages of the throughput phase")
    ap.add_argument("--rates", type=float, nargs="+", default=[TARGET_RATE, 2000],
                    help="messages/s of the latency phases (the first is checked against the target)")
    ap.add_argument("--latency-seconds", type=float, default=2.0, help="duration of each latency phase")
    ap.add_argument("--window", type=int, default=2000, help="most messages in flight (throughput phase)")
    ap.add_argument("--warmup", type=int, default=3000)
    ap.add_argument("--chains", type=int, default=3)
    ap.add_argument("--features", type=int, default=4)
    ap.add_argument("--window-size", type=int, default=5, help="recognition window (odd)")
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--formats", nargs="+", default=["binary", "json"])
    ap.add_argument("--learner-duty", type=float, default=None,
                    help="learner duty of the learning-on rows (default: the service's default)")
    ap.add_argument("--no-learn-off", action="store_true", help="skip the learning-off rows")
    ap.add_argument("--lane-only", action="store_true",
                    help="skip the row of the general path (serve --no-lane) beside the serving lane")
    ap.add_argument("--python-client", action="store_true",
                    help="send and receive with pyzmq calls per frame instead of the compiled client")
    ap.add_argument("--serve-args", default="", metavar="ARGS",
                    help="more arguments for streamfhmm serve, e.g. \"--batch-wait 0\"")
    args = ap.parse_args(argv)

    header("streamfhmm serve over loopback TCP: end-to-end throughput and latency")
    p = FHMMParams.random(args.chains, args.features, random_state=0, noise=0.3)
    gen = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, startprob=p.startprob)
    n = max(args.messages, int(max(args.rates) * args.latency_seconds), args.warmup)
    X, _ = gen.sample(n + 3000, random_state=1)
    model = FHMM(n_chains=args.chains, window=args.window_size, n_hidden=args.hidden, random_state=0)
    model.fit(X[:3000], max_iter=300, progress=False)
    X = np.ascontiguousarray(X[3000:], dtype="<f8")
    lag = args.window_size // 2
    print(f"# model: M={args.chains} chains, D={args.features}, window {args.window_size}, "
          f"{args.hidden} hidden units; smooth mode (lag {lag}); input multipart binary; "
          f"latency phases at {', '.join(f'{r:,.0f}' for r in args.rates)} messages/s, "
          f"{args.latency_seconds:g} s each")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.npz")
        model.save(path)
        rows.append(measure(lambda source: subprocess.Popen(
            [sys.executable, "-c", _RELAY, source, "tcp://127.0.0.1:*"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            X, args, 0, "reference: zmq.proxy relay"))
        rows[-1]["gaps"] = "-"
        configs = [(fmt, learn, ()) for fmt in args.formats
                   for learn in ((True,) if args.no_learn_off else (False, True))]
        if "binary" in args.formats and not args.lane_only:
            # the general path beside the serving lane, same run (the lane serves JSON output
            # too; one --no-lane row, with binary output, keeps the run short)
            configs.insert(configs.index(("binary", True, ())) + 1, ("binary", True, ("--no-lane",)))
        for fmt, learn, extra in configs:
            label = " ".join([f"serve --format {fmt}"] + (["--learn"] if learn else []) + list(extra))
            rows.append(measure(lambda source: serve(path, source, fmt, learn, args.learner_duty,
                                                      args.serve_args.split() + list(extra)),
                                X, args, lag, label))
    ref = rows[0]["messages/s"]
    for r in rows:
        r["/ relay"] = r["messages/s"] / ref
    lat_cols = [c for rate in args.rates for c in (f"p50 us @{rate:g}/s", f"p99 us @{rate:g}/s")]
    table(rows, ["configuration", "messages/s", "/ relay", *lat_cols, "lost", "gaps", "duty",
                 "steps/s (tp)", "steps/s (all)"])
    print("# duty: the learner's share of one core, as the service reports it "
          f"({'set by --learner-duty' if args.learner_duty is not None else 'its default'}); "
          "steps/s: learner SVI steps per second during the throughput phase (tp) and from "
          "its start to the end of the latency phases (all)")
    spans = [f"{r['_tp_len']:.2f} s phase in {r['_tp_span']:.2f} s" for r in rows if r.get("_tp_span")]
    if spans:
        print("# steps/s (tp) spans the last status line before the throughput phase to the first "
              f"after it (status every {STATUS_INTERVAL:g} s): {'; '.join(spans)}")
    print("# reference: zmq.proxy (XSUB -> XPUB) in its own process: the transport through one "
          "extra hop, no Python per message")
    print()
    key = f"p99 us @{args.rates[0]:g}/s"
    print(f"# targets: >= {TARGET_RATE:,} messages/s with learning on; p99 <= {TARGET_P99_MS:g} ms "
          f"(at {args.rates[0]:,.0f} messages/s)")
    for r in rows[1:]:
        if "--learn" not in r["configuration"]:
            continue
        ok_rate = r["messages/s"] >= TARGET_RATE
        p99 = r[key]
        ok_p99 = p99 is not None and p99 <= TARGET_P99_MS * 1000
        print(f"#   {r['configuration']:<30} throughput {r['messages/s']:>10,.0f}/s "
              f"{'met' if ok_rate else 'NOT met'};  p99 {p99 / 1000 if p99 else float('nan'):.2f} ms "
              f"{'met' if ok_p99 else 'NOT met'}")


if __name__ == "__main__":
    main()
