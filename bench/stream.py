"""Streaming engine throughput and latency.

    python bench/stream.py [--samples 30000] [--quick]

For M = 10 chains, D = 6, window 21, 200 hidden units shared by all heads (the paper's
power-disaggregation network) it prints, in one run:

* push latency p50 / p99 (µs) and sustained samples/s one push at a time, with the
  learner off and on, and the learner's steps/s while inference runs;
* push_many samples/s (batch kernels);
* the same for exact inference at M = 10 (filtering and fixed-lag smoothing);
* per-sample cost against M (4 … 32 chains) for the recognition path and exact mode,
  showing where each is the right choice;

each beside a reference measured in the same run: for one-at-a-time pushes the bare
window kernel (``forward_one``), for push_many the bare batch kernels on the same rows
in the same blocks (``build_windows`` + ``forward_batch``), for exact mode the batch
exact forward pass (``exact.log_likelihood``), so the engine's overhead reads as a
ratio; and the learner's steps/s while inference runs as a fraction of its steps/s
with inference idle. BLAS is limited to one thread.
Targets: ≥ 20,000 samples/s one push at a time with learning
on and p99 ≤ 100 µs; push_many ≥ 300,000 samples/s.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (the BLAS the kernels call: load it before limiting)
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(__file__))
from _common import best_time, header, int_in, table  # noqa: E402

from streamfhmm import FHMM, exact  # noqa: E402
from streamfhmm.kernels import recognition as rk  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402
from streamfhmm.network import RecognitionNet  # noqa: E402
from streamfhmm.stream.engine import StreamEngine  # noqa: E402
from streamfhmm.stream.learner import DEFAULT_LEARNER_DUTY  # noqa: E402

D, WINDOW, HIDDEN = 6, 21, 200


def make_model(M, n, seed=0):
    params = FHMMParams.random(M, D, random_state=seed, noise=0.5)
    X, _ = params.sample(n, random_state=seed + 1)
    model = FHMM.from_params(W=params.W, covariance=params.covariance, transmat=params.transmat,
                             window=WINDOW, n_hidden=HIDDEN, share_hidden="all")
    net = RecognitionNet(M, D, window=WINDOW, n_hidden=HIDDEN, share="all").init(random_state=seed)
    model.net_ = net.fit_scaler(X)
    return model, X


CPU = {}


def push_loop(eng, X, key=None):
    """Push X one sample at a time; returns samples/s (wall clock). The pushing thread's
    CPU time per sample goes to ``CPU[key]`` (a figure a busy machine does not distort)."""
    push = eng.push
    c0 = time.thread_time()
    t0 = time.perf_counter()
    for x in X:
        push(x)
    dt = time.perf_counter() - t0
    if key is not None:
        CPU[key] = len(X) / (time.thread_time() - c0)
    return len(X) / dt


def bare_forward_one(net, X):
    """µs per call of the window kernel alone, reading a ring the same way."""
    ring = np.concatenate([X[:64], X[:64]])
    flat = ring.reshape(-1)
    th, rh, sc = np.empty(net.n_chains), np.empty(net.n_chains), np.empty(net.scratch_size)
    args = (net.weights, net.layout, net.mean, net.scale, sc, th, rh)

    def run():
        for i in range(1000):
            rk.forward_one(flat, (i % 40) * D, *args)
    return best_time(run, repeat=3, min_time=0.2) / 1000 * 1e6


def bare_batch(net, X, chunk=10_000):
    """Samples/s of the batch kernels alone (``build_windows`` + ``forward_batch``) on
    the rows X in blocks of ``chunk``: push_many's reference."""
    T, M = len(X), net.n_chains
    lo, hi = np.zeros(T, np.int64), np.full(T, T, np.int64)
    pos = np.arange(T, dtype=np.int64)
    Xw = np.empty((chunk, net.n_inputs))
    hidden = np.empty((chunk, net.n_groups * net.n_hidden))
    th, rh = np.empty((chunk, M)), np.empty((chunk, M))

    def run():
        for s in range(0, T, chunk):
            e = min(s + chunk, T)
            rk.build_windows(X, lo[s:e], hi[s:e], pos[s:e], net.window, net.offset, net.mean,
                             net.scale, Xw[:e - s])
            rk.forward_batch(Xw[:e - s], net.weights, net.layout, th[:e - s], rh[:e - s], hidden[:e - s])
    run()
    return T / best_time(run, repeat=2, min_time=0.5)


def measure_push(model, X, n, key=None, **kw):
    with StreamEngine(model, latency_window=n, **kw) as eng:
        eng.push_many(X[:3000])
        push_loop(eng, X[3000:4000])  # warm
        rate = push_loop(eng, X[4000:4000 + n], key)
        m = eng.metrics()
    return rate, m["push_p50_us"], m["push_p99_us"]


#: seconds over which the learner's steps/s are measured
MIN_SECONDS = 3.0


def measure_push_learning(model, X, n, min_seconds=MIN_SECONDS, **kw):
    """Push rate and latency with the learner on; then the learner's steps/s while
    one-at-a-time pushes go on for at least ``min_seconds`` (the learner works in rounds
    of ``snapshot_interval`` steps and then waits by its duty: one pass of n pushes, a
    fraction of a second, can fall between two rounds) and with inference idle."""
    # the learner's kernel compiled (or loaded from the cache) first, in an engine of its
    # own: a first round that compiles takes tens of seconds, and the learner then waits
    # by its duty (up to a minute), so that on an empty Numba cache the measured engine
    # took 0 steps while measured and the "learner on" figures were the learner-off ones
    with StreamEngine(model, learn=True, **kw) as warm:
        warm.push_many(X[:3000])
        t0 = time.perf_counter()
        while warm.metrics()["learner_steps"] < 1 and time.perf_counter() - t0 < 600:
            time.sleep(0.05)
    with StreamEngine(model, learn=True, latency_window=n, **kw) as eng:
        eng.push_many(X[:20_000])
        t0 = time.perf_counter()
        while eng.metrics()["learner_steps"] < 20 and time.perf_counter() - t0 < 60:
            time.sleep(0.01)
        push_loop(eng, X[20_000:21_000])
        rate = push_loop(eng, X[21_000:21_000 + n], "on")
        m = eng.metrics()
        s0, v0, t0 = eng.learner_steps, eng.version, time.perf_counter()
        while time.perf_counter() - t0 < min_seconds:
            push_loop(eng, X[21_000:21_000 + n])
        dt = time.perf_counter() - t0
        busy, n_snap = (eng.learner_steps - s0) / dt, eng.version - v0
        # the learner alone, inference idle (busy / idle is printed)
        s1, t1 = eng.learner_steps, time.perf_counter()
        time.sleep(min_seconds)
        idle = (eng.learner_steps - s1) / (time.perf_counter() - t1)
    return rate, m["push_p50_us"], m["push_p99_us"], busy, idle, n_snap


def measure_push_many(model, X, chunk=10_000, **kw):
    with StreamEngine(model, **kw) as eng:
        eng.push_many(X[:chunk])

        def run():
            for s in range(0, len(X), chunk):
                eng.push_many(X[s:s + chunk])
        return len(X) / best_time(run, repeat=2, min_time=0.5)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int_in(1), default=30_000, help="pushes per measurement")
    ap.add_argument("--quick", action="store_true", help="fewer samples, smaller table")
    args = ap.parse_args(argv)
    n = 5000 if args.quick else args.samples
    limiter = threadpool_limits(limits=1, user_api="blas")
    header(f"streaming engine, M=10, D={D}, window {WINDOW}, {HIDDEN} hidden units (share='all'), "
           f"BLAS 1 thread")
    model, X = make_model(10, max(60_000, n + 25_000))
    kernel_us = bare_forward_one(model.net_, X)
    print(f"# load average {os.getloadavg()[0]:.1f} (other processes share the cores: "
          f"wall-clock rates fall with it, 'samples/CPU-s' does not)")
    print(f"reference: bare forward_one kernel {kernel_us:.1f} µs/window "
          f"({1e6 / kernel_us:,.0f} windows/s)")
    rows = []
    r, p50, p99 = measure_push(model, X, n, "off", mode="smooth", learn=False)
    rows.append({"path": "recognition push, learner off", "samples/s": r,
                 "samples/CPU-s": CPU["off"], "p50 µs": p50,
                 "p99 µs": p99, "× kernel time": 1e6 / r / kernel_us})
    r_on, p50_on, p99_on, steps, idle, nsnap = measure_push_learning(model, X, n, mode="smooth",
                                                                     snapshot_interval=20)
    rows.append({"path": "recognition push, learner on", "samples/s": r_on,
                 "samples/CPU-s": CPU["on"], "p50 µs": p50_on,
                 "p99 µs": p99_on, "× kernel time": 1e6 / r_on / kernel_us})
    pm = measure_push_many(model, X[:50_000], mode="smooth", learn=False)
    batch_rate = bare_batch(model.net_, X[:50_000])
    rows.append({"path": "recognition push_many (10k blocks)", "samples/s": pm,
                 "× batch kernel time": batch_rate / pm})
    Mx = 10
    ll_rate = 20_000 / best_time(lambda: exact.log_likelihood(model.params_, X[:20_000]),
                                 repeat=2, min_time=0.3)
    for mode in ("filter", "smooth"):
        r, p50, p99 = measure_push(model, X, n, mode, mode=mode, learn=False, posterior="exact")
        rows.append({"path": f"exact {mode} push (M={Mx})", "samples/s": r,
                     "samples/CPU-s": CPU[mode], "p50 µs": p50,
                     "p99 µs": p99, "× batch exact forward": ll_rate / r})
        pme = measure_push_many(model, X[:30_000], mode=mode, learn=False, posterior="exact")
        rows.append({"path": f"exact {mode} push_many (M={Mx})", "samples/s": pme,
                     "× batch exact forward": ll_rate / pme})
    print(f"reference: batch kernels (build_windows + forward_batch) on the same 50,000 rows in "
          f"10k blocks {batch_rate:,.0f} samples/s")
    print(f"reference: batch exact forward (exact.log_likelihood) {ll_rate:,.0f} steps/s at M=10")
    table(rows, ["path", "samples/s", "samples/CPU-s", "p50 µs", "p99 µs", "× kernel time",
                 "× batch kernel time", "× batch exact forward"])
    print(f"learner (duty {DEFAULT_LEARNER_DUTY:g}) while one-at-a-time inference runs: "
          f"{steps:,.1f} steps/s ({nsnap} snapshots in {MIN_SECONDS:g} s); learner alone: {idle:,.1f} steps/s "
          f"(batch 10 subchains of {WINDOW} positions); busy / idle = "
          f"{steps / idle if idle > 0 else float('nan'):.2f}")

    print()
    print("# per-sample cost against the number of chains (µs per sample, one push at a time;")
    print("# push_many in brackets); exact smoothing lag = 10")
    rows = []
    chains = [4, 8, 12] if args.quick else [4, 8, 12, 16, 24, 32]
    for M in chains:
        mdl, Xm = make_model(M, 12_000, seed=M)
        k = 2000 if args.quick else 5000
        row, costs = {"M": M}, {}
        r, _, _ = measure_push(mdl, Xm, k, mode="smooth", learn=False)
        rb = measure_push_many(mdl, Xm[:10_000], chunk=5000, mode="smooth", learn=False)
        costs["recognition"] = 1e6 / r
        row["recognition"] = f"{1e6 / r:.1f} [{1e6 / rb:.2f}]"
        for mode in ("filter", "smooth"):
            row[f"exact {mode}"] = "-"
            if M <= (16 if mode == "filter" else 12):
                kk = k if M <= 12 else 300
                r, _, _ = measure_push(mdl, Xm, kk, mode=mode, learn=False, posterior="exact")
                costs[f"exact {mode}"] = 1e6 / r
                row[f"exact {mode}"] = f"{1e6 / r:.1f}"
        row["cheapest"] = min(costs, key=costs.get)
        rows.append(row)
        print(f"  M={M} done", file=sys.stderr, flush=True)
    table(rows, ["M", "recognition", "exact filter", "exact smooth", "cheapest"])
    print("# exact mode is exact and needs no network or training; it costs O(M 2^M) per sample")
    print("# (times the lag for smoothing), the recognition path O(window·D·hidden) whatever M.")

    print()
    learned = steps > 0   # (else the "learner on" row measured the learner off)
    checks = [("push one at a time, learner on: >= 20,000 samples/s", r_on, learned and r_on >= 20_000),
              ("push latency p99, learner on: <= 100 µs", p99_on, learned and p99_on <= 100),
              ("push_many: >= 300,000 samples/s", pm, pm >= 300_000)]
    for text, value, ok in checks:
        valid = learned or "learner on" not in text
        print(f"target {text}: {value:,.1f} "
              f"({('met' if ok else 'NOT met') if valid else 'not measured: the learner took no step'})")
    limiter.restore_original_limits()


if __name__ == "__main__":
    main()
