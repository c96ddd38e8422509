"""The paper's validation experiment (Table 1, "Simulated Data").

    python bench/validation.py [--seeds 0 1 2 3 4] [--iterations 20000]

Simulates a 1,000-step, 2-dimensional training sequence and a 1,000-step test sequence
from a 2-chain FHMM, fits it with the proposed method (window 5, 30 tanh hidden units
per chain) and with structured mean-field EM, and prints LL_train and LL_test per step
(exact log-likelihood, forward algorithm) for the proposed method, the true parameters
and SMF-EM, plus the largest W error after aligning chains (permutation and 0/1
relabelling). Targets: proposed LL_test within 0.01 nats/step of the true parameters'
LL_test; W recovered within 0.1 per entry. Each seed draws new training and test
sequences from the same model; the summary gives the mean and worst gap over seeds,
for the proposed method and for SMF-EM.

The paper's simulated model is given in its supplementary material, which this project
does not have: the model below is ours, so its log-likelihood levels (about -1.0 per
step) are not the paper's row (proposed -2.320 / -2.332, SMF-EM -2.315 / -2.338, which
the bench prints for the record). What carries over is the comparison the paper makes:
the proposed method's LL beside SMF-EM's and the true parameters', and W recovered.

SMF-EM learns the start probabilities ``π_m = θ_1^m`` from the one training sequence,
so they end at 0 or 1 (floored at 1e-12): a test sequence whose chain m starts in the
other state costs up to log(1e12) ≈ 27.6 nats, 0.028 nats/step at T = 1,000. The true
parameters and the proposed method start the chains from their stationary
distribution; the row "SMF-EM, π stationary" evaluates SMF-EM's parameters with that
start (same W, Σ, transitions). With it, the SMF-EM fit (for seeds 0 and 1 a maximum of
the exact likelihood: L-BFGS on the exact likelihood from it gains < 1e-7 nats/step)
loses 0.001–0.012 nats/step on test data to the true parameters (seeds 0–4); with its
learnt π, 0.010–0.027.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import header, int_in, table  # noqa: E402

from streamfhmm import FHMM  # noqa: E402
from streamfhmm.evaluation import loglik_per_step, recovery_errors  # noqa: E402

#: the simulated model: two chains with distinct, overlapping contributions
TRUE_W = np.array([[1.0, -1.0], [1.5, 1.0], [0.0, 0.0]])
TRUE_COV = 0.1 * np.eye(2)
TRUE_A = np.array([[[0.95, 0.05], [0.10, 0.90]], [[0.90, 0.10], [0.05, 0.95]]])


def run(seed: int, iterations: int, progress: bool):
    true = FHMM.from_params(W=TRUE_W, covariance=TRUE_COV, transmat=TRUE_A)
    X, _ = true.sample(1000, random_state=seed)
    Xt, _ = true.sample(1000, random_state=seed + 1000)
    rows = [{"method": "true parameters", "LL_train": loglik_per_step(true.params_, X),
             "LL_test": loglik_per_step(true.params_, Xt), "max |ΔW|": 0.0, "fit s": None}]
    t = time.perf_counter()
    svi = FHMM(n_chains=2, window=5, n_hidden=30, share_hidden="chain", random_state=seed)
    svi.fit(X, max_iter=iterations, progress=progress)
    t_svi = time.perf_counter() - t
    t = time.perf_counter()
    smf = FHMM(n_chains=2, random_state=seed).fit(X, method="smf", init="kmeans", max_iter=500,
                                                  tol=1e-9, progress=progress)
    t_smf = time.perf_counter() - t
    smf_stat = smf.params_.replace(startprob=smf.params_.stationary)
    for name, params, dt in (("proposed (SVI)", svi.params_, t_svi), ("SMF-EM", smf.params_, t_smf),
                             ("SMF-EM, π stationary", smf_stat, None)):
        rows.append({"method": name, "LL_train": loglik_per_step(params, X),
                     "LL_test": loglik_per_step(params, Xt),
                     "max |ΔW|": recovery_errors(params, true.params_)["W"], "fit s": dt})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int_in(0), nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--iterations", type=int_in(1), default=20000, help="SVI steps")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)
    header("validation experiment: T=1000, D=2, M=2 (the protocol of the paper's Table 1, simulated "
           "row, on a model of our own)")
    print("# the paper's row, on its own simulated model (not this one): proposed LL_train -2.320, "
          "LL_test -2.332; SMF-EM -2.315, -2.338")
    gaps = {"proposed (SVI)": [], "SMF-EM": [], "SMF-EM, π stationary": []}
    werr = []
    for seed in args.seeds:
        print(f"\nseed {seed}")
        rows = run(seed, args.iterations, args.progress)
        table(rows, ["method", "LL_train", "LL_test", "max |ΔW|", "fit s"])
        for r in rows[1:]:
            gaps[r["method"]].append(rows[0]["LL_test"] - r["LL_test"])
        werr.append(rows[1]["max |ΔW|"])
    print("\nsummary over seeds: LL_test gap to the true parameters (nats/step, positive = worse)")
    for name, g in gaps.items():
        print(f"  {name:20s} mean {np.mean(g):+.4f}  worst {np.max(g):+.4f}  per seed "
              + " ".join(f"{x:+.4f}" for x in g))
    mean_gap = float(np.mean(gaps["proposed (SVI)"]))
    within = sum(g <= 0.01 for g in gaps["proposed (SVI)"])
    smf_within = sum(g <= 0.01 for g in gaps["SMF-EM, π stationary"])
    # (per seed: the mean can pass while seeds miss; SMF-EM's count shows how much of
    # that is the 1,000 samples' noise, which maximum likelihood itself pays)
    print(f"target: proposed LL_test within 0.01 of true: {within}/{len(args.seeds)} seeds "
          f"({'met' if within == len(args.seeds) else 'NOT met in every seed'}; mean {mean_gap:+.4f}); "
          f"SMF-EM with π stationary within 0.01 in {smf_within}/{len(args.seeds)}")
    print(f"target: W within 0.1 per entry (aligned), worst seed: {max(werr):.4f} "
          f"({'met' if max(werr) <= 0.1 else 'NOT met'})")


if __name__ == "__main__":
    main()
