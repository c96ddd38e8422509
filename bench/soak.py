"""Memory soak: does resident memory stay flat while samples keep arriving?

    python bench/soak.py [--seconds 120] [--every 5] [--part engine|service|both]
    python bench/soak.py --quick          # 20 s per run, a sample every 2 s

Sensor streams never end, so the engine and the ZeroMQ service must run in bounded
memory. For the paper's power network (M = 10 chains, D = 6, window 21, 200 hidden
units shared by all heads: bench/stream.py's ``make_model``) this runs, each for
``--seconds``:

* engine, in this process: ``StreamEngine(model, learn=False)`` and then
  ``learn=True`` (the learner's kernel compiled or loaded first in a throw-away engine,
  as bench/stream.py does), ``push_many`` in blocks of 1,000 rows without pause, the
  rows drawn from the model (200,000 distinct ones, reused cyclically), the returned
  posteriors dropped at once; every ``--every`` seconds: elapsed time, samples pushed,
  learner steps, the reservoir's segments, Python's tracked objects and this
  process's VmRSS (/proc/self/status);
* service: ``python -m streamfhmm serve --model ... --learn --format binary`` in its
  own process on loopback TCP (ports the system chose), fed by this process through
  the compiled client of bench/zmq.py (bench/_wireclient.py: the wire format of
  streamfhmm.io.wire) as fast as it takes them with at most ``--window`` messages in
  flight, its posteriors drained by a subscriber thread here (compiled, without the
  GIL); every ``--every`` seconds: samples published, posteriors received, the
  service's samples and learner steps (its status lines) and the serve process's VmRSS
  (/proc/<pid>/status). It is stopped with SIGTERM (killed if it does not exit), also
  on an error or Ctrl-C.

With ``--churn N`` the service part's topics come and go: each ends after N samples
(an end heartbeat) and the next samples go to a new topic, while ``serve
--max-streams`` (4 by default) holds at most that many engines: every new topic past
the first ones takes the place of an ended stream, whose engine (and learner thread)
is closed, so the run makes and closes an engine every N samples (without a
checkpoint directory: nothing is kept of a retired stream). The table adds the topics
begun and the streams serve retired (its status lines).

For each run it prints the sampled table and a summary: VmRSS after the warm-up (the
first 25 % of the run) and at the end, the growth, the growth per million samples and
the least-squares slope after the warm-up in MB per hour.
Target: bounded: RSS growth after warm-up <= 2 MB and <= 0.5 MB per million samples.
The machine is shared and noisy: the figures are printed, nothing is asserted.

Measured (2026-11-28, ``python bench/soak.py``: 120 s per run, VmRSS every 5 s; 2-core
machine, load average 1.5 at the start), VmRSS after the warm-up (30 s) -> at the end:

* engine, learn=False: 62.4 million samples (520,000/s); 224.9 -> 224.9 MB, growth
  +0.00 MB, +0.000 MB per million samples, slope +0.2 MB/hour: met;
* engine, learn=True: 56.3 million samples (469,000/s), 12,020 learner steps, 601
  snapshots; 227.3 -> 227.3 MB, +0.02 MB, +0.001 MB per million, +1.2 MB/hour: met
  (its 1.9 MB over the start arrive in the first 5 s, while the learner starts and
  its reservoir fills to its 2,000 segments, full from then on);
* serve --learn (binary): 25.5 million samples (212,000 posteriors/s), 10,420 learner
  steps; 209.7 -> 210.4 MB, +0.66 MB, +0.035 MB per million, +22.8 MB/hour: met.

Python's tracked objects stay at 116,890 (learner off) and 117,000-119,000 (on, no
trend). The service's small creep comes in steps of 0.05-1 MB minutes apart (a 300 s
run: +1.65 MB, +0.035 MB per million, +29 MB/hour; another: +0.29 MB, +6.6 MB/hour). In
a 250 s run with glibc's ``mallinfo2`` read every 20 s inside serve (a wrapper, not
this file) the bytes malloc holds in use went up and down (56.7-60.1 MiB, no trend),
gc objects likewise (119,200-120,900), while the brk heap grew 66.0 -> 67.2 MiB and
VmRSS 199.9 -> 201.0 MiB: the heap's free space grows (6.6 -> 8.9-10.3 MiB), not what
is allocated. tracemalloc snapshots 100 s apart agreed (71.1, 69.9, 70.1 MiB traced).
That points to the allocator's high-water mark, not to a leak of objects (those
checks are not part of this file). A 20-minute run (``--part service --seconds 1200
--every 30``: 268 million samples in 1,200 s, 223,500/s; 109,113 learner steps) read
213.7 MB at 30 s, 214.6 MB at 300 s, 214.8 at 630 s and 215.0 MB from 750 s to the end:
+0.43 MB after the warm-up, +0.002 MB per million samples, +2.3 MB/hour over the last
15 minutes: met, and no growth seen over its last 7.5 minutes at 0.1 MB resolution.
With topics that come and go (``--part service --churn 20000 --seconds 300 --every
10``, same day): 29.8 million samples (99,200 posteriors/s: a new engine and learner
every 20,000 samples) on 1,488 topics, 1,484 streams retired, every posterior
received, gaps 0; VmRSS 181.7 MB at the start, 261.7 MB after the warm-up (80 s) and
263.4 MB at the end, flat from 140 s: +1.69 MB, +0.079 MB per million samples: met.
Again after the last service changes: 37.8 million samples (126,000/s) on 1,892
topics, 1,887 retired, every posterior received, gaps 0; 275.4 -> 277.4 MB, +1.95 MB,
+0.072 MB per million: met, but still rising in steps of 0.1-0.7 MB to the end (+1.1
MB over the last 100 s). Over 20 minutes (``--churn 20000 --seconds 1200 --every 30``):
146.7 million samples (120,000/s) on 7,333 topics, 7,329 retired, every posterior
received, gaps 0; 282.7 MB after the warm-up (300 s) -> 284.6 MB at the end, +1.93 MB,
+0.018 MB per million: met; 284.4 MB at 420 s and 284.4-284.6 MB from then to the end
(+0.2 MB over the last 12.5 minutes): the growth settles. Those churn runs predate
holding the learners of ended streams (StreamEngine._pause_learner) and the lane serving
the one live stream among ended ones: 120 s churn runs read 158,759-159,099 posteriors/s
before those changes and 210,044-211,535 after (alternated, twice each, 28 November).
After them, ``--churn 20000 --seconds 300 --every 10``: 57.1 million samples (190,259
posteriors/s) on 2,854 topics, 2,847 retired, gaps 0; 277.7 MB after the warm-up (80 s)
-> 279.3 MB at the end, +1.61 MB, +0.038 MB per million samples: met.

``--checkpoint`` (with ``--churn``) runs serve with a checkpoint directory in a
temporary directory, and the table adds its size and files; ``--checkpoint-retain S``
adds serve's ``--checkpoint-retain S``. The reference, from the same run: what the
directory would hold without removal (one engine file per topic, at the run's mean
engine-file size). 120 s each (``--churn 20000 --every 10``): the
directory grew to 1,741 MB and 1,206 files (603 topics, 2.9 MB per engine file) without
it, and stayed at 127-187 MB (88-131 files) with ``--checkpoint-retain 10``. 300 s
with ``--checkpoint --checkpoint-retain 10`` (after the learner and lane changes above):
47.2 million samples (157,377 posteriors/s) on 2,361 topics, 2,357 retired, 2,272
checkpoints removed, the directory at 187-269 MB (130-186 files) from 10 s to the end;
288.4 -> 289.6 MB after the warm-up, +1.26 MB, +0.034 MB per million: met.
The target bounds growth, not its slope: over a short run (``--quick``) the slope in
MB/hour mostly reflects single steps of the allocator and says little.
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

# bench/zmq.py is named like the pyzmq package and ``python bench/soak.py`` puts this
# directory first on the path: take it off before importing zmq, and put it at the end
# for _common, stream (make_model) and _wireclient (as bench/zmq.py does)
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
import numpy as np  # noqa: E402
import zmq  # noqa: E402

sys.path.append(_HERE)
from _common import header, table, wait_for_line  # noqa: E402
from stream import D, HIDDEN, WINDOW, make_model  # noqa: E402

import _wireclient  # noqa: E402
from streamfhmm.io import _libzmq  # noqa: E402
from streamfhmm.io.wire import encode_heartbeat  # noqa: E402
from streamfhmm.stream.engine import StreamEngine  # noqa: E402

#: the stated target
TARGET_MB = 2.0
TARGET_MB_PER_MILLION = 0.5
#: the fraction of a run before the summary's first point
WARMUP_FRACTION = 0.25
M_CHAINS = 10
BLOCK = 1000
ROWS = 200_000


def vmrss_mb(pid="self") -> float:
    """VmRSS of a process in MB (10^6 bytes) from /proc/<pid>/status; NaN if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return float("nan")


class Ticker:
    """When to sample: every ``every`` seconds from ``t0`` and once at ``t0 + seconds``."""

    def __init__(self, t0, seconds, every):
        self.next, self.end, self.every = t0 + every, t0 + seconds, every

    def due(self, now) -> tuple:
        """(sample now, the run is over) at time ``now``; after a stall longer than
        ``every``, one sample, not one per missed interval."""
        if now < self.next and now < self.end:
            return False, False
        while self.next <= now:
            self.next += self.every
        return True, now >= self.end


def show(rows, columns):
    """The sampled table, VmRSS to 0.01 MB (the table's default shows no decimals
    beyond 100)."""
    table([{**r, "VmRSS MB": f"{r['VmRSS MB']:.2f}"} for r in rows], columns)


def summarise(label, rows, seconds, sample_key="samples"):
    """Print the summary line of one run: RSS after warm-up to the end, growth, growth per
    million samples, least-squares slope (MB/hour) after the warm-up; met / NOT met."""
    post = [r for r in rows if r["seconds"] >= WARMUP_FRACTION * seconds]
    if len(post) < 2:
        print(f"{label}: too few points after the warm-up to judge")
        return None
    t = np.array([r["seconds"] for r in post])
    rss = np.array([r["VmRSS MB"] for r in post])
    n0, n1 = post[0][sample_key], post[-1][sample_key]
    growth = rss[-1] - rss[0]
    per_m = growth / (n1 - n0) * 1e6 if n1 > n0 else float("nan")
    slope = np.polyfit(t, rss, 1)[0] * 3600 if np.ptp(t) > 0 else float("nan")
    ok = growth <= TARGET_MB and per_m <= TARGET_MB_PER_MILLION
    print(f"{label}: VmRSS {rows[0]['VmRSS MB']:.1f} MB at start, {rss[0]:.1f} MB after warm-up "
          f"({t[0]:.0f} s, {n0:,} samples) -> {rss[-1]:.1f} MB at the end ({t[-1]:.0f} s, {n1:,} samples); "
          f"growth {growth:+.2f} MB, {per_m:+.3f} MB per million samples, slope {slope:+.1f} MB/hour "
          f"(peak {max(r['VmRSS MB'] for r in rows):.1f} MB); target bounded (growth <= {TARGET_MB:g} MB "
          f"and <= {TARGET_MB_PER_MILLION:g} MB per million samples): {'met' if ok else 'NOT met'}")
    return dict(start=rows[0]["VmRSS MB"], warm=rss[0], end=rss[-1], growth=growth, per_m=per_m,
                slope=slope, ok=ok)


# ------------------------------------------------------------------------------- engine
def warm_learner(model, X):
    """Compile (or load) the learner's kernel in a throw-away engine, as bench/stream.py
    does, so that compilation does not count."""
    with StreamEngine(model, learn=True) as warm:
        warm.push_many(X[:3000])
        t0 = time.perf_counter()
        while warm.metrics()["learner_steps"] < 1 and time.perf_counter() - t0 < 600:
            time.sleep(0.05)


def soak_engine(model, X, learn, seconds, every):
    """push_many in blocks of BLOCK rows (X reused cyclically) for ``seconds``; the sampled
    rows."""
    rows = []
    n = X.shape[0] - X.shape[0] % BLOCK
    with StreamEngine(model, learn=learn) as eng:
        eng.push_many(X[:BLOCK])   # the batch kernels loaded before the clock starts
        gc.collect()
        pushed, i = BLOCK, BLOCK

        def record(now):
            m = eng.metrics()
            rows.append({"seconds": now - t0, "samples": pushed, "learner steps": m["learner_steps"],
                         "reservoir": m["reservoir_size"], "dropped": m["dropped_segments"],
                         "py objects": len(gc.get_objects()), "VmRSS MB": vmrss_mb()})
        t0 = time.perf_counter()
        record(t0)
        ticker, over = Ticker(t0, seconds, every), False
        while not over:
            eng.push_many(X[i:i + BLOCK])   # the posteriors dropped at once
            pushed += BLOCK
            i = (i + BLOCK) % n
            now = time.perf_counter()
            sample, over = ticker.due(now)
            if sample:
                record(now)
        metrics = eng.metrics()
    return rows, metrics


# ------------------------------------------------------------------------------ service
_OUTPUT_BOUND = re.compile(r"output bound at (\S+) \(")
_STATUS = re.compile(r"([\d,]+) samples \(.*learner steps (\d+)")
_RETIRED = re.compile(r", retired (\d+),")


class StderrTail(threading.Thread):
    """Reads the service's stderr: keeps its first lines, the last status line and the
    last lines (bounded, so that a long run holds nothing more here: bench/zmq.py's
    reader keeps every line)."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.first = []
        self.last = []
        self.status = None   # (samples, learner steps)
        self.retired = 0

    def run(self):
        for line in self.stream:
            line = line.rstrip("\n")
            if len(self.first) < 20:
                self.first.append(line)
            self.last = (self.last + [line])[-20:]
            m = _STATUS.search(line)
            if m:
                self.status = (int(m.group(1).replace(",", "")), int(m.group(2)))
                r = _RETIRED.search(line)
                self.retired = int(r.group(1)) if r else 0

    def wait_for(self, pattern, proc, timeout=300.0):
        """Group 1 of the first of the service's first lines matching ``pattern``."""
        return wait_for_line(lambda: list(self.first), pattern, proc, self, timeout,
                             tail=lambda: list(self.last))


class Receiver(threading.Thread):
    """Takes the service's posteriors off a SUB socket and counts them (the compiled
    receiver of bench/_wireclient.py, which holds no GIL while it waits)."""

    def __init__(self, ctx, endpoint):
        super().__init__(daemon=True)
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVTIMEO, 200)
        self.sub.connect(endpoint)
        self.sub.subscribe(b"")
        self.lib, self.clock = _libzmq.functions(), _wireclient.clock_function()
        self.buf = np.zeros((4, 1 << 16), np.uint8)
        self.times = np.full(2, np.nan)   # only sequence number 0's arrival: nothing grows
        self.count = 0
        self.stop = threading.Event()
        self._receive(0)                  # compiled (or loaded) before the thread starts

    def _receive(self, k):
        return _wireclient.receive(self.lib.recv, self.lib.getsockopt, self.lib.errno, self.clock,
                                   self.sub.underlying, self.buf, self.times, k)

    def run(self):
        while not self.stop.is_set():
            # a call returns after this many messages (or a timeout): far fewer than the
            # messages in flight, so that the sender sees the count move on
            self.count += self._receive(128)
        self.sub.close(0)


def dir_usage(path) -> tuple:
    """(MB, files) of the regular files in directory ``path`` (not recursive)."""
    total, n = 0, 0
    with os.scandir(path) as it:
        for e in it:
            try:
                if e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
                    n += 1
            except OSError:   # (removed meanwhile)
                pass
    return total / 1e6, n


def engine_file_mb(path) -> float | None:
    """Mean size (MB) of the engine checkpoints (``*.npz``) in directory ``path``, or None."""
    sizes = [e.stat().st_size for e in os.scandir(path) if e.name.endswith(".npz")] \
        if os.path.isdir(path) else []
    return sum(sizes) / len(sizes) / 1e6 if sizes else None


def soak_service(model_path, X, seconds, every, window, status_interval, churn=0, max_streams=4,
                 checkpoint=None, checkpoint_retain=None):
    """Run serve --learn for ``seconds`` fed as fast as it takes (at most ``window`` in
    flight); the sampled rows and the service's last stderr lines. With ``churn`` > 0
    each topic ends after ``churn`` samples (an end heartbeat) and the next one is new,
    the service holding at most ``max_streams`` (it retires the ended ones). With
    ``checkpoint`` (a directory) serve checkpoints there (``--checkpoint``, and
    ``--checkpoint-retain`` if given) and the rows add the directory's size and files."""
    lib = _libzmq.functions()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    pub.bind("tcp://127.0.0.1:*")
    source = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    cmd = [sys.executable, "-m", "streamfhmm", "serve", "--model", model_path, "--sub", source,
           "--pub", "tcp://127.0.0.1:*", "--format", "binary", "--learn", "--wait-subscribers", "1",
           "--heartbeat", "0", "--status-interval", str(status_interval)]
    if churn:
        cmd += ["--max-streams", str(max_streams)]
    if checkpoint is not None:
        cmd += ["--checkpoint", checkpoint]
        if checkpoint_retain is not None:
            cmd += ["--checkpoint-retain", f"{checkpoint_retain:g}"]
    print("# " + " ".join(os.path.basename(c) if c == sys.executable else c for c in cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = StderrTail(proc.stderr)
    err.start()
    rx = None
    rows = []
    exit_status = None
    try:
        rx = Receiver(ctx, err.wait_for(_OUTPUT_BOUND, proc))
        rx.start()
        deadline = time.monotonic() + 300
        while not (pub.poll(20) and pub.recv()[:1] == b"\x01"):   # the service subscribed
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the service did not subscribe: " + "\n".join(err.last))
        topic = np.frombuffer(b"soak", np.uint8)
        head = np.zeros(128, np.uint8)
        text = np.frombuffer(b"%r" % time.time(), np.uint8)
        _wireclient.send_burst(lib.send, pub.underlying, topic, 0, text, X[:0], head)   # compile
        n = X.shape[0]
        seq, i = 0, 0
        topics, tseq = 1, 0   # (with churn: topics begun, and the current one's next number)

        def record(now):
            st = err.status or (None, None)
            rows.append({"seconds": now - t0, "published": seq, "received": rx.count,
                         "serve samples": st[0], "learner steps": st[1], "topics": topics,
                         "retired": err.retired, "VmRSS MB": vmrss_mb(proc.pid)})
            if checkpoint is not None:
                rows[-1]["ckpt MB"], rows[-1]["ckpt files"] = dir_usage(checkpoint)
        t0 = time.perf_counter()
        record(t0)
        ticker, over = Ticker(t0, seconds, every), False
        while not over:
            k = min(rx.count + window - seq, n - i)
            if churn:
                k = min(k, churn - tseq)
            if k > 0:
                text = np.frombuffer(b"%r" % time.time(), np.uint8)
                sent = _wireclient.send_burst(lib.send, pub.underlying, topic, tseq, text, X[i:i + k], head)
                if sent != k:
                    raise zmq.ZMQError(zmq.zmq_errno())
                seq += k
                tseq += k
                i = (i + k) % n
                if churn and tseq == churn:   # this topic ends; the next is a new one
                    pub.send_multipart(encode_heartbeat(topic.tobytes(), tseq - 1, time.time(), end=True))
                    topic = np.frombuffer(b"soak-%d" % topics, np.uint8)
                    topics += 1
                    tseq = 0
            else:
                time.sleep(0.0002)   # no busy loop: the service shares the 2 cores
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited ({proc.returncode}): " + "\n".join(err.last))
            now = time.perf_counter()
            sample, over = ticker.due(now)
            if sample:
                record(now)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            exit_status = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            exit_status = proc.wait()
        err.join(10)
        proc.stderr.close()
        if rx is not None:
            rx.stop.set()
            rx.join(5)
        pub.close(0)
        if rx is None:
            ctx.destroy(0)     # a receiver that failed to start may have left its socket open
        elif not rx.is_alive():
            ctx.term()
    return rows, exit_status, err.last


# --------------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0, help="duration of each run")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples of VmRSS")
    ap.add_argument("--part", choices=["engine", "service", "both"], default="both")
    ap.add_argument("--quick", action="store_true", help="20 s per run, a sample every 2 s")
    ap.add_argument("--rows", type=int, default=ROWS, help="distinct rows sampled from the model")
    ap.add_argument("--window", type=int, default=2000, help="most messages in flight (service)")
    ap.add_argument("--churn", type=int, default=0, metavar="N",
                    help="service: each topic ends after N samples and a new one begins; serve "
                         "holds at most --max-streams (it retires ended streams)")
    ap.add_argument("--max-streams", type=int, default=4, help="serve's --max-streams with --churn")
    ap.add_argument("--checkpoint", action="store_true",
                    help="service: serve --checkpoint in a temporary directory; the table adds its "
                         "size and files")
    ap.add_argument("--checkpoint-retain", type=float, metavar="SECONDS",
                    help="with --checkpoint: serve --checkpoint-retain SECONDS")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.every = 20.0, 2.0
    header(f"memory soak, M={M_CHAINS}, D={D}, window {WINDOW}, {HIDDEN} hidden units (share='all'), "
           f"{args.seconds:g} s per run, VmRSS every {args.every:g} s")
    print(f"# load average {os.getloadavg()[0]:.1f}; target: bounded: RSS growth after warm-up "
          f"(the first {WARMUP_FRACTION:.0%} of a run) <= {TARGET_MB:g} MB and <= "
          f"{TARGET_MB_PER_MILLION:g} MB per million samples")
    if args.checkpoint_retain is not None and not args.checkpoint:
        ap.error("--checkpoint-retain needs --checkpoint")
    if args.checkpoint_retain is not None and not 0 <= args.checkpoint_retain < float("inf"):
        ap.error(f"--checkpoint-retain must be a finite number >= 0, got {args.checkpoint_retain}")
    model, X = make_model(M_CHAINS, args.rows)
    X = np.ascontiguousarray(X, dtype="<f8")
    summaries = {}
    if args.part in ("engine", "both"):
        warm_learner(model, X)
        for learn in (False, True):
            label = f"engine push_many ({BLOCK:,}-row blocks), learn={learn}"
            print()
            print(f"# {label}")
            rows, m = soak_engine(model, X, learn, args.seconds, args.every)
            show(rows, ["seconds", "samples", "learner steps", "reservoir", "dropped", "py objects",
                         "VmRSS MB"])
            rate = rows[-1]["samples"] / rows[-1]["seconds"]
            print(f"# {rate:,.0f} samples/s; learner steps {m['learner_steps']}, "
                  f"snapshot version {m['snapshot_version']}, learner errors {m['learner_error']}")
            summaries[label] = summarise(label, rows, args.seconds)
    if args.part in ("service", "both"):
        label = "serve --learn (binary)" + (f", a new topic every {args.churn:,} samples, "
                                            f"--max-streams {args.max_streams}" if args.churn else "")
        if args.checkpoint:
            label += ", --checkpoint" + (f" --checkpoint-retain {args.checkpoint_retain:g}"
                                         if args.checkpoint_retain is not None else "")
        print()
        print(f"# {label}: as fast as it takes, at most {args.window} messages in flight")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "power.npz")
            model.save(path)
            rows, status, last = soak_service(path, X, args.seconds, args.every, args.window,
                                              status_interval=min(args.every, 1.0),
                                              churn=args.churn, max_streams=args.max_streams,
                                              checkpoint=os.path.join(d, "ckpt") if args.checkpoint else None,
                                              checkpoint_retain=args.checkpoint_retain)
            engine_mb = engine_file_mb(os.path.join(d, "ckpt")) if args.checkpoint else None
        show(rows, ["seconds", "published", "received", "serve samples", "learner steps"]
             + (["topics", "retired"] if args.churn else []) + ["VmRSS MB"]
             + (["ckpt MB", "ckpt files"] if args.checkpoint else []))
        rate = rows[-1]["received"] / rows[-1]["seconds"]
        stopped = [ln for ln in last if "stopped after" in ln]
        print(f"# {rate:,.0f} posteriors/s received; serve exit status {status}")
        if stopped:
            print(f"# {stopped[-1]}")
        if engine_mb and stopped:
            # the same run's reference: what its checkpoints would hold with none removed
            written = re.search(r"checkpoints ([\d,]+)", stopped[-1])
            if written:
                n = int(written.group(1).replace(",", ""))
                print(f"# checkpoint directory at the end: {rows[-1]['ckpt MB']:,.0f} MB; this run wrote "
                      f"{n:,} engine checkpoints ({engine_mb:.2f} MB each on average); without removal "
                      f"it would hold one per topic: {rows[-1]['topics']:,} x {engine_mb:.2f} = "
                      f"{rows[-1]['topics'] * engine_mb:,.0f} MB")
        summaries[label] = summarise(label, rows, args.seconds, sample_key="published")
    print()
    print("# summary")
    for label, s in summaries.items():
        if s is None:
            print(f"#   {label}: not judged")
            continue
        print(f"#   {label:<50} {s['warm']:7.1f} -> {s['end']:7.1f} MB, growth {s['growth']:+6.2f} MB, "
              f"{s['per_m']:+7.3f} MB/M samples, slope {s['slope']:+7.1f} MB/h: "
              f"{'met' if s['ok'] else 'NOT met'}")


if __name__ == "__main__":
    main()
