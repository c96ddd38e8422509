"""Kernel speed at the paper's power configuration (M = 10, D = 6, window 21,
200 shared hidden units).

    python bench/kernels.py [--latency-samples 20000]

Prints, measured in one run:
* streaming single-window inference latency (``forward_one`` called from Python on a
  ring buffer), median and p99 in µs;
* batch inference throughput (windows/s) of ``build_windows`` + ``forward_batch``;
* both as a fraction of the machine's measured float64 peak (a large one-thread
  matrix product timed in the same run);
* ELBO-gradient throughput (positions/s, and µs per batch of 10 subchains of 100
  positions) of ``elbo_batch`` alone (this replaced the timed unit test
  ``tests/test_elbo.py::test_throughput_report``, same configuration); for the whole
  learner step see bench/learn.py. Its reference, in the same run, is the batch
  inference above: the "× batch forward" column is the ELBO + gradient's time per
  position over ``build_windows`` + ``forward_batch``'s time per window. The learner
  step needs both for every position (one window forward, then the ELBO and its
  gradient), so the ratio says how the objective's cost compares with the network's.
  It is not given as a fraction of peak: ``elbo_batch`` is scalar loops over chains
  with logarithms (no matrix products), for which a flop count would be a
  guess.
Targets: batch inference ≥ 25 % of peak; single-window median latency ≤ 20 µs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import best_time, header, matmul_peak_flops, table  # noqa: E402

from streamfhmm.kernels import elbo as ke  # noqa: E402
from streamfhmm.kernels import recognition as kr  # noqa: E402
from streamfhmm.learn.objective import _log_stationary, _log_transmat  # noqa: E402
from streamfhmm._blas import limit_blas_threads  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402
from streamfhmm.network import RecognitionNet  # noqa: E402

M, D, WINDOW, HIDDEN = 10, 6, 21, 200


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency-samples", type=int, default=20_000,
                    help="forward_one calls timed one by one for the latency percentiles")
    args = ap.parse_args(argv)
    header("kernels at the power configuration: M=10, D=6, window 21, 200 shared hidden units")
    limiter = limit_blas_threads(1)
    peak = matmul_peak_flops()
    print(f"# machine peak (1-thread float64 matrix product): {peak / 1e9:.1f} GFLOP/s")
    params = FHMMParams.random(M, D, random_state=0)
    X, _ = params.sample(50_000, random_state=1)
    net = RecognitionNet(M, D, window=WINDOW, n_hidden=HIDDEN, share="all").init(random_state=0)
    net.fit_scaler(X)
    K = net.n_inputs
    flops_window = 2 * K * HIDDEN + 2 * HIDDEN * 2 * M

    # -- streaming: one window at a time from a double-written ring --------------------
    ring = np.zeros((2 * WINDOW, D))
    flat = ring.reshape(-1)
    scratch = np.empty(net.scratch_size)
    th, rh = np.empty(M), np.empty(M)
    w, lay, mu, sc = net.weights, net.layout, net.mean, net.scale
    kr.forward_one(flat, 0, w, lay, mu, sc, scratch, th, rh)
    n = args.latency_samples
    lat = np.empty(n)
    pc = time.perf_counter_ns
    for i in range(n):
        j = i % WINDOW
        ring[j] = ring[j + WINDOW] = X[i]
        t0 = pc()
        kr.forward_one(flat, (j + 1) * D, w, lay, mu, sc, scratch, th, rh)
        lat[i] = pc() - t0
    lat /= 1e3
    p50, p99 = np.percentile(lat, [50, 99])

    # -- batch inference ----------------------------------------------------------------
    nb = 4096
    pos = np.arange(100, 100 + nb, dtype=np.int64)
    lo = np.zeros(nb, dtype=np.int64)
    hi = np.full(nb, len(X), dtype=np.int64)
    Xw = np.empty((nb, K))
    hidden = np.empty((nb, HIDDEN))
    tb, rb = np.empty((nb, M)), np.empty((nb, M))

    def batch():
        kr.build_windows(X, lo, hi, pos, WINDOW, net.offset, mu, sc, Xw)
        kr.forward_batch(Xw, w, lay, tb, rb, hidden)

    batch()
    t_batch = best_time(batch, repeat=5, min_time=0.3)
    bw = nb / t_batch

    # -- ELBO and its gradient ------------------------------------------------------------
    B, L = 10, 100
    rows = B * (L + 1)
    Y = X[:rows].copy()
    theta = np.random.default_rng(0).uniform(0.05, 0.95, (rows, M))
    rho = np.random.default_rng(1).uniform(-0.9, 0.9, (rows, M))
    starts = np.arange(B, dtype=np.int64) * (L + 1)
    n_pos = np.full(B, L + 1, dtype=np.int64)
    flags = np.zeros(B, dtype=np.bool_)
    P = np.linalg.inv(params.covariance)
    log_A, log_pi = _log_transmat(params.alpha, params.beta), _log_stationary(params.alpha, params.beta)
    outs = [np.zeros((rows, M)), np.zeros((rows, M)), np.zeros((M + 1, D)), np.zeros((D, D)),
            np.zeros(M), np.zeros(M), np.zeros((M, 2))]

    def grad():
        ke.elbo_batch(Y, starts, n_pos, flags, theta, rho, params.W, params.L, P, log_A, log_pi, *outs)

    grad()
    t_grad = best_time(grad, repeat=3, min_time=0.3)
    limiter.restore_original_limits()

    table([
        {"measure": "forward_one latency p50 (µs)", "value": p50,
         "% of peak": 100 * flops_window / (p50 * 1e-6) / peak, "target": "<= 20 µs",
         "met": "yes" if p50 <= 20 else "NO"},
        {"measure": "forward_one latency p99 (µs)", "value": p99, "% of peak": None, "target": None, "met": None},
        {"measure": "batch inference (windows/s)", "value": bw,
         "% of peak": 100 * flops_window * bw / peak, "target": ">= 25 % of peak",
         "met": "yes" if flops_window * bw / peak >= 0.25 else "NO"},
        {"measure": "ELBO + gradient (positions/s)", "value": B * L / t_grad, "% of peak": None,
         "× batch forward": (t_grad / (B * L)) / (t_batch / nb), "target": None, "met": None},
        {"measure": f"ELBO + gradient (µs per batch of {B} x {L})", "value": t_grad * 1e6,
         "% of peak": None, "target": None, "met": None},
    ], ["measure", "value", "% of peak", "× batch forward", "target", "met"])
    print(f"# × batch forward: ELBO + gradient time per position / batch inference time per window "
          f"({t_batch / nb * 1e6:.2f} µs), same run")


if __name__ == "__main__":
    main()
