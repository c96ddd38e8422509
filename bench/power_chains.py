"""Household power: what each chain of a fitted protocol model does.

    python bench/power_chains.py svi.npz [svi_seed1.npz ...]   # models saved by bench/power.py --save-model

For each model (fitted on the protocol's six standardised channels), read on the last
100,000 training rows with its own posterior (recognition networks, or SMF for a model
without them), one line per chain: the fraction of minutes it is on (mean θ), the
fraction with θ between 0.05 and 0.95 (uncertain), its loadings W[m] per channel
(standardised units), the reconstruction variance it carries (Var θ · ‖W[m]‖²), and its
switching probabilities P(0→1), P(1→0); then the bias and, per step, the model's exact
log-likelihood and ELBO on those rows. It tells clean codes (each appliance a chain of
its own, on in few minutes) from entangled ones (chains on half the time with large
loadings of opposite sign whose combinations code the rare appliances).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import header  # noqa: E402

from streamfhmm import FHMM  # noqa: E402
from streamfhmm.power import PAPER_COLUMNS, likelihood_per_step, power_split  # noqa: E402

ROWS = 100_000


def chain_table(model, X) -> list:
    """One dict per chain of ``model`` read on the rows ``X``."""
    method = None if getattr(model, "net_", None) is not None else "smf"
    theta = model.predict_proba(X, method=method)
    W, A = model.W_, model.transmat_
    rows = []
    for m in range(W.shape[0] - 1):
        th = theta[:, m]
        rows.append({"chain": m, "on": th.mean(), "uncertain": ((th > 0.05) & (th < 0.95)).mean(),
                     "carried": th.var() * float(W[m] @ W[m]), "W": W[m], "p01": A[m, 0, 1],
                     "p10": A[m, 1, 0]})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", metavar="MODEL", help="FHMM files saved by bench/power.py --save-model")
    args = ap.parse_args(argv)
    models = []
    for path in args.models:
        try:
            m = FHMM.load(path)
        except (OSError, ValueError) as exc:
            ap.error(f"{path}: {exc}")
        if np.shape(m.W_)[1] != len(PAPER_COLUMNS):
            ap.error(f"{path}: expected a model of the protocol's {len(PAPER_COLUMNS)} channels")
        models.append((path, m))
    header("household power: the chains of fitted protocol models")
    X = power_split().train[-ROWS:]
    short = ["active", "reactive", "voltage", "sub 1", "sub 2", "sub 3"]
    for path, m in models:
        per = likelihood_per_step(m, X)
        elbo = "-" if per["elbo"] is None else f"{per['elbo']:.3f}"
        print(f"\n{path}: σ² {np.mean(np.diag(m.covariance_)):.3f} (mean); exact log-likelihood "
              f"{per['loglik']:.3f}, ELBO {elbo} per step on the last {ROWS:,} training rows")
        print(f"  {'m':>2} {'on':>6} {'unsure':>7} {'carried':>8}  " + " ".join(f"{c:>8}" for c in short)
              + f"  {'P(0→1)':>7} {'P(1→0)':>7}")
        for r in chain_table(m, X):
            print(f"  {r['chain']:>2} {r['on']:6.3f} {r['uncertain']:7.3f} {r['carried']:8.3f}  "
                  + " ".join(f"{v:8.3f}" for v in r["W"]) + f"  {r['p01']:7.4f} {r['p10']:7.4f}")
        print(f"  {'bias':<26}" + " ".join(f"{v:8.3f}" for v in m.W_[-1]))


if __name__ == "__main__":
    main()
