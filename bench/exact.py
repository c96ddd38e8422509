"""Exact log-likelihood throughput against hmmlearn on the product state space.

    python bench/exact.py [--steps 20000]

Prints time steps per second of ``streamfhmm.exact.log_likelihood`` for M = 4, 8, 10,
12 chains (D = 6) and of hmmlearn's ``GaussianHMM(covariance_type="tied").score`` on
the equivalent 2^M-state HMM, measured in the same run, with their ratio. hmmlearn is
timed up to M = 10 by default (O(4^M) per step: about 390 steps at M = 10, a few seconds).
The whole run is on one core: BLAS is limited to one thread (threadpoolctl, via
``streamfhmm._blas.limit_blas_threads``) for both sides, since multithreaded OpenBLAS on
this shared 2-core machine made hmmlearn's time swing several-fold between runs.
Targets: ≥ 100× hmmlearn at M = 8; ≥ 50,000 steps/s at M = 10.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import best_time, header, int_in, table  # noqa: E402

from streamfhmm import exact  # noqa: E402
from streamfhmm._blas import limit_blas_threads  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402


def hmmlearn_model(params):
    from hmmlearn.hmm import GaussianHMM
    M = params.n_chains
    K = 1 << M
    bits = (np.arange(K)[:, None] >> np.arange(M)[None, :]) & 1
    A = params.transmat
    trans = np.ones((K, K))
    for m in range(M):
        trans *= A[m][bits[:, m][:, None], bits[:, m][None, :]]
    start = np.prod(np.where(bits == 1, params.startprob, 1 - params.startprob), axis=1)
    h = GaussianHMM(n_components=K, covariance_type="tied", init_params="", params="")
    h.startprob_, h.transmat_ = start, trans
    h.means_ = bits @ params.W[:M] + params.W[M]
    h.covars_ = params.covariance
    return h


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int_in(1), default=20000, help="time steps per measurement")
    ap.add_argument("--chains", type=int_in(1, 20), nargs="+", default=[4, 8, 10, 12])
    ap.add_argument("--hmmlearn-max-chains", type=int_in(0, 20), default=10,
                    help="largest M for which hmmlearn (O(4^M) per step) is timed")
    args = ap.parse_args(argv)
    header("exact log-likelihood throughput (D = 6), one core (BLAS limited to 1 thread)")
    with limit_blas_threads(1):
        run(args)


def run(args):
    rows = []
    for M in args.chains:
        params = FHMMParams.random(M, 6, random_state=M)
        X, _ = params.sample(args.steps, random_state=1)
        exact.log_likelihood(params, X[:10])  # compile / load cache
        ours = args.steps / best_time(lambda: exact.log_likelihood(params, X), repeat=3, min_time=0.2)
        row = {"M": M, "states": 1 << M, "streamfhmm steps/s": ours}
        if M <= args.hmmlearn_max_chains:
            try:
                h = hmmlearn_model(params)
                n = min(args.steps, max(200, 400_000 >> M))  # hmmlearn is O(4^M) per step
                Xh = X[:n]
                ll_ref = h.score(Xh)
                ll = exact.log_likelihood(params, Xh)
                ref = n / best_time(lambda: h.score(Xh), repeat=2, min_time=0.2)
                row.update({"hmmlearn steps/s": ref, "speed-up": ours / ref,
                            "|Δ loglik| rel": abs(ll - ll_ref) / abs(ll_ref)})
            except ImportError:
                row["hmmlearn steps/s"] = "not installed"
        rows.append(row)
    table(rows, ["M", "states", "streamfhmm steps/s", "hmmlearn steps/s", "speed-up", "|Δ loglik| rel"])
    by_m = {r["M"]: r for r in rows}
    if 8 in by_m and isinstance(by_m[8].get("speed-up"), float):
        print(f"target M=8: speed-up >= 100x hmmlearn: {by_m[8]['speed-up']:.0f}x "
              f"({'met' if by_m[8]['speed-up'] >= 100 else 'NOT met'})")
    if 10 in by_m:
        v = by_m[10]["streamfhmm steps/s"]
        print(f"target M=10: >= 50,000 steps/s: {v:,.0f} ({'met' if v >= 50_000 else 'NOT met'})")


if __name__ == "__main__":
    main()
