"""Household power: what ten binary chains can express, and what maximum likelihood picks.

    python bench/power_codes.py                    # uniform and one re-weighted code (about 6 minutes)
    python bench/power_codes.py --weights 1,1,1,1,1,1 1,1,4,1,1,1
    python bench/power_codes.py --weights 1,1,1,1,1,1 --em-rows 200000   # then maximum likelihood
    python bench/power_codes.py --weights 1,1,1,1,1,1 --svi-steps 150000  # or the protocol's SVI

An FHMM's reconstruction is ``Wᵀ E[s_t] + b``: with hard states one of 2^10 additive
codes, with soft marginals a point of their convex hull. This bench fits additive
10-bit codes to the protocol's standardised training rows directly (no recognition
networks, no SVI): alternating exact assignment over the 1,024 codes and least squares
for ``W, b`` (a hard EM), started from the SMF initialisation the package uses, on a
random sample of training rows, after scaling channel ``d`` by ``√w_d`` (``--weights``:
minimising ``Σ_d w_d (x_d − ĉ_d)²``). For each weighting it prints, on the protocol's
first 300,000 test rows (standardised units):

* the test MSE of the nearest code (hard);
* the test MSE of per-minute soft assignments ``p(code | x_t) ∝ exp(−‖x_t − c‖²_w / 2τ)``
  (uniform prior over codes, no transitions) at temperatures τ = 0.5, 1, 2, 4, 8 × the
  training residual variance;
* the FHMM the code defines (diagonal Σ = residual variance per channel; per-chain
  transitions counted on the last 200,000 training rows): its exact log-likelihood per
  step on the last 100,000 training rows (2^10 joint states), and its test MSE with
  exact smoothing posteriors;
* with ``--em-rows N``: that FHMM refined by exact EM (maximum likelihood) on the last
  N training rows within ``--em-budget`` seconds, the same two figures;
* with ``--svi-steps N``: that FHMM (Σ made ``--svi-covariance``: spherical takes the mean
  residual variance) as the start of the protocol's SVI fit (``FHMM(**PAPER_MODEL)``,
  ``svi_settings(max_iter=N)``, ``init="params"``) on all training rows: the test MSE read
  by its recognition networks (the protocol's score) and by its exact posterior, and its
  exact log-likelihood and ELBO per step; about 9 minutes for 150,000 steps.

The paper's proposed row is printed beside each line with how many channels are below it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import header  # noqa: E402

from streamfhmm import FHMM  # noqa: E402
from streamfhmm.learn.em import _augmented_states  # noqa: E402
from streamfhmm.learn.smf import init_params  # noqa: E402
from streamfhmm.power import (N_SCORED, PAPER_MODEL, PAPER_TABLE2, likelihood_per_step,  # noqa: E402
                              power_split, svi_settings)

PAPER = np.array(PAPER_TABLE2["paper proposed"])
M = 10
STATES = _augmented_states(M)            # (1024, M+1): [bits of k; 1], the codes are STATES @ W
CODES = STATES[:, :M]
DEFAULT_WEIGHTS = ["1,1,1,1,1,1", "1,2,8,0.5,0.5,0.5"]
TEMPERATURES = (0.5, 1.0, 2.0, 4.0, 8.0)


def nearest(X, C, chunk=50_000):
    """Index of the nearest row of ``C`` for each row of ``X``."""
    cn = (C ** 2).sum(1)
    out = np.empty(len(X), dtype=np.int64)
    for i in range(0, len(X), chunk):
        out[i:i + chunk] = (cn[None, :] - 2.0 * X[i:i + chunk] @ C.T).argmin(1)
    return out


def soft_states(X, C, tau, chunk=50_000):
    """``E[s_t]`` under ``p(code | x_t) ∝ exp(−‖x_t − c‖² / 2τ)``, shape (T, M)."""
    cn = (C ** 2).sum(1)
    out = np.empty((len(X), M))
    for i in range(0, len(X), chunk):
        L = (2.0 * X[i:i + chunk] @ C.T - cn[None, :]) / (2.0 * tau)
        L -= L.max(1, keepdims=True)
        P = np.exp(L)
        P /= P.sum(1, keepdims=True)
        out[i:i + chunk] = P @ CODES
    return out


def fit_code(Z, iters, seed):
    """Hard EM of an additive code on the (weighted) rows ``Z``: ``W`` shape (M+1, D)."""
    W = np.asarray(init_params(Z, M, random_state=seed, covariance_type="spherical").W)
    for _ in range(iters):
        W = np.linalg.lstsq(STATES[nearest(Z, STATES @ W)], Z, rcond=None)[0]
    return W


def code_fhmm(W, sw, block):
    """The FHMM of code ``W`` (standardised units) fitted with channel scales ``sw``: states
    of ``block`` by the fit's metric, then diagonal Σ and transitions from them."""
    S = CODES[nearest(block * sw, (STATES @ W) * sw)]
    var = (block - S @ W[:M] - W[M]).var(0)
    A = np.empty((M, 2, 2))
    for m in range(M):
        prev, nxt = S[:-1, m], S[1:, m]
        for i in (0, 1):
            p1 = (((prev == i) & (nxt == 1)).sum() + 1.0) / ((prev == i).sum() + 2.0)
            A[m, i] = (1.0 - p1, p1)
    return FHMM.from_params(W=W, covariance=np.diag(var), transmat=A, covariance_type="diag"), var


def svi_from_code(code, var, split, test, ll_rows, args):
    """The protocol's SVI fit started from the FHMM ``code`` (its W and transitions; Σ
    of ``args.svi_covariance`` from the residual variances ``var``), scored."""
    ctype = args.svi_covariance
    cov = np.eye(len(var)) * var.mean() if ctype == "spherical" else np.diag(var)
    arch = {k: v for k, v in PAPER_MODEL.items() if k != "n_chains"}
    model = FHMM.from_params(W=code.W_, covariance=cov, transmat=code.transmat_, **arch,
                             random_state=args.seed, covariance_type=ctype)
    start = likelihood_per_step(model, ll_rows)["loglik"]
    kw = svi_settings(max_iter=args.svi_steps)
    if args.learning_rate is not None:
        kw["learning_rate"] = args.learning_rate
    for key in ("init", "init_samples", "n_restarts"):  # one run from this code, not SMF-EM
        kw.pop(key)
    t0 = time.perf_counter()
    model.fit(split.train, method="svi", init="params", n_jobs=args.n_jobs, progress=False, **kw)
    seconds = time.perf_counter() - t0
    print(f"  SVI from its FHMM ({ctype} Σ, learning rate {kw['learning_rate']:g}, exact log-likelihood {start:.3f} per step at the "
          f"start): {args.svi_steps:,} steps in {seconds:.0f} s")
    print(line("  read by its recognition networks", ((model.reconstruct(test) - test) ** 2).mean(0)))
    print(line("  read by its exact posterior",
               ((model.reconstruct(test, method="exact") - test) ** 2).mean(0)))
    per = likelihood_per_step(model, ll_rows)
    print(f"    exact log-likelihood {per['loglik']:.3f}, ELBO {per['elbo']:.3f} per step on the "
          f"last 100,000 training rows")


def line(label, mse, count=True):
    return (f"  {label:<38}" + " ".join(f"{v:6.3f}" for v in mse)
            + (f"   below the paper in {int((mse < PAPER).sum())} of 6" if count else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", nargs="+", default=DEFAULT_WEIGHTS, metavar="W1,...,W6",
                    help="channel weights of the fit, one comma-separated list per code "
                         f"(default {' '.join(DEFAULT_WEIGHTS)})")
    ap.add_argument("--rows", type=int, default=200_000, help="random training rows the codes are fitted on")
    ap.add_argument("--iters", type=int, default=30, help="hard-EM iterations (default 30)")
    ap.add_argument("--em-rows", type=int, default=0,
                    help="refine each code's FHMM by exact EM on the last so many training rows (default: no)")
    ap.add_argument("--em-budget", type=float, default=240.0, help="exact EM: seconds (default 240)")
    ap.add_argument("--svi-steps", type=int, default=0,
                    help="start the protocol's SVI fit from each code's FHMM, so many steps (default: no)")
    ap.add_argument("--svi-covariance", choices=("spherical", "diag"), default="spherical",
                    help="covariance family of that SVI fit (default spherical, as the docs/household_power.md row)")
    ap.add_argument("--learning-rate", type=float, default=None,
                    help="learning rate of that SVI fit (default the protocol's, SVI_SETTINGS)")
    ap.add_argument("--n-jobs", type=int, default=1, help="threads of that SVI fit (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.svi_steps < 0 or args.em_rows < 0:
        ap.error("--svi-steps and --em-rows must be >= 0")
    if args.learning_rate is not None and not (np.isfinite(args.learning_rate) and args.learning_rate > 0):
        ap.error(f"--learning-rate must be a positive number, got {args.learning_rate}")
    weights = []
    for spec in args.weights:
        w = np.array([float(v) for v in spec.split(",")])
        if w.shape != (6,) or not (np.isfinite(w).all() and (w > 0).all()):
            ap.error(f"--weights: expected 6 positive numbers separated by commas, got {spec!r}")
        weights.append(w)

    from streamfhmm.datasets import load_household_power
    header("household power: additive 10-bit codes and the paper's Table 2")
    print(f"seed={args.seed}")
    split = power_split(load_household_power())
    rng = np.random.default_rng(args.seed)
    sample = split.train[rng.choice(len(split.train), args.rows, replace=False)]
    block, ll_rows, test = split.train[-200_000:], split.train[-100_000:], split.test[:N_SCORED]
    print(f"codes fitted on {args.rows:,} random training rows, {args.iters} hard-EM iterations; "
          f"test MSE on the first {N_SCORED:,} test rows (standardised)")
    print(line("paper, proposed", PAPER, count=False))
    for w in weights:
        t0 = time.perf_counter()
        sw = np.sqrt(w)
        Wz = fit_code(sample * sw, args.iters, args.seed)
        W = Wz / sw                                   # standardised units
        Cz, C = STATES @ Wz, STATES @ W
        res = ((sample * sw - Cz[nearest(sample * sw, Cz)]) ** 2).mean()
        print(f"\nweights {w.tolist()} (fit {time.perf_counter() - t0:.0f} s; weighted residual "
              f"variance per channel {res:.3f})")
        print(line("nearest code", ((C[nearest(test * sw, Cz)] - test) ** 2).mean(0)))
        for k in TEMPERATURES:
            R = soft_states(test * sw, Cz, k * res) @ W[:M] + W[M]
            print(line(f"soft, per minute, τ = {k:g} × residual", ((R - test) ** 2).mean(0)))
        model, var = code_fhmm(W, sw, block)
        print(line("its FHMM, exact posterior", ((model.reconstruct(test, method="exact") - test) ** 2).mean(0)))
        print(f"  its FHMM: diagonal Σ {np.round(var, 3).tolist()}; exact log-likelihood "
              f"{model.score(ll_rows) / len(ll_rows):.3f} per step on the last 100,000 training rows")
        if args.svi_steps > 0:
            svi_from_code(model, var, split, test, ll_rows, args)
        if args.em_rows > 0:
            t0 = time.perf_counter()
            model.fit(split.train[-args.em_rows:], method="em", init="params", tol=1e-7,
                      time_budget=args.em_budget, progress=False)
            print(line("its FHMM after exact EM, exact post.",
                       ((model.reconstruct(test, method="exact") - test) ** 2).mean(0)))
            print(f"  exact EM on the last {args.em_rows:,} training rows: {len(model.history_) - 1} "
                  f"iterations, {time.perf_counter() - t0:.0f} s; exact log-likelihood "
                  f"{model.score(ll_rows) / len(ll_rows):.3f} per step on the last 100,000 training rows")


if __name__ == "__main__":
    main()
