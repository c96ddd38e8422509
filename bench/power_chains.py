"""Household power: what each chain of a fitted protocol model does.

    python bench/power_chains.py svi.npz [svi_seed1.npz ...]   # models saved by bench/power.py --save-model
    python bench/power_chains.py --starts 0 1 2                 # the SVI fit's first starts

For each model (fitted on the protocol's six standardised channels), read on the last
100,000 training rows with its own posterior (recognition networks, or SMF for a model
without them), one line per chain: the fraction of minutes it is on (mean θ), the
fraction with θ between 0.05 and 0.95 (uncertain), its loadings W[m] per channel
(standardised units), the reconstruction variance it carries (Var θ · ‖W[m]‖²), and its
switching probabilities P(0→1), P(1→0); then the bias and, per step, the model's exact
log-likelihood and ELBO on those rows, and for a fitted model its running training ELBO
over steps 20,000-25,000 and over its last 10,000 steps. Then per channel the range its
reconstruction ``Wᵀ E[ŝ_t]`` can reach (:func:`streamfhmm.power.reconstruction_range`),
the share of those training rows and of the protocol's scored test rows above and below it, the
least MSE any posterior could give there (:func:`streamfhmm.power.range_floor_mse`), the
model's MSE on those training rows and on the test rows (the protocol's), and its mean
residual on the test rows; with ``--posteriors`` also those MSEs read by the model's
exact posterior (2^10 joint states) and by its SMF posterior, which shows how much of the
error is the networks' and how much the model's. It tells clean codes (each appliance a chain of
its own, on in few minutes) from entangled ones (chains on half the time with large
loadings of opposite sign whose combinations code the rare appliances).

``--starts SEED ...`` prints the same for the parameters the first of the protocol SVI
fit's runs starts from at those seeds (``FHMM(**PAPER_MODEL, random_state=SEED)``,
``init="smf"``: SMF-EM on the last 5,000 training rows from a k-means start on all of
them; one step that trains the networks only, the model held), read with SMF posteriors.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import header  # noqa: E402

from streamfhmm import FHMM  # noqa: E402
from streamfhmm.power import (N_SCORED, PAPER_COLUMNS, PAPER_MODEL, PAPER_SHORT_NAMES,  # noqa: E402
                              likelihood_per_step, mse_per_dimension, power_split, range_floor_mse,
                              reconstruction_range, svi_settings)

ROWS = 100_000


def chain_table(model, X, method=None) -> list:
    """One dict per chain of ``model`` read on the rows ``X`` (``method``: its posterior;
    default the recognition networks, or SMF for a model without them)."""
    if method is None and getattr(model, "net_", None) is None:
        method = "smf"
    theta = model.predict_proba(X, method=method)
    W, A = model.W_, model.transmat_
    rows = []
    for m in range(W.shape[0] - 1):
        th = theta[:, m]
        rows.append({"chain": m, "on": th.mean(), "uncertain": ((th > 0.05) & (th < 0.95)).mean(),
                     "carried": th.var() * float(W[m] @ W[m]), "W": W[m], "p01": A[m, 0, 1],
                     "p10": A[m, 1, 0]})
    return rows


def running_elbo(history, spans=((20_000, 25_000),), last=10_000) -> dict:
    """Mean of an SVI fit's logged running ELBO over each span of steps that the fit
    reached, and over its last ``last`` steps: how early a run's rank among runs is set
    (``FHMM.fit``'s ``n_restarts`` compares runs after a sixth of their steps)."""
    it = np.array([h["iteration"] for h in history if "elbo" in h])
    value = np.array([h["elbo"] for h in history if "elbo" in h])
    if not len(it):
        return {}
    end = int(it[-1])
    out = {}
    for a, b in (*spans, (max(0, end - last), end)):
        sel = (it > a) & (it <= b)
        if b <= end and sel.any():
            out[(a, b)] = float(value[sel].mean())
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", metavar="MODEL", help="FHMM files saved by bench/power.py --save-model")
    ap.add_argument("--starts", type=int, nargs="+", default=[], metavar="SEED",
                    help="also the protocol SVI fit's starting parameters at these seeds")
    ap.add_argument("--posteriors", action="store_true",
                    help="also the MSEs read with the model's exact posterior and its SMF "
                         "posterior (about 50 s per model)")
    args = ap.parse_args(argv)
    if not args.models and not args.starts:
        ap.error("give MODEL files, --starts SEED ..., or both")
    models = []
    for path in args.models:
        try:
            m = FHMM.load(path)
        except (OSError, ValueError) as exc:
            ap.error(f"{path}: {exc}")
        if np.shape(m.W_)[1] != len(PAPER_COLUMNS):
            ap.error(f"{path}: expected a model of the protocol's {len(PAPER_COLUMNS)} channels")
        models.append((path, m, None))
    header("household power: the chains of fitted protocol models")
    split = power_split()
    train = split.train
    X = train[-ROWS:]
    scored = split.test[:N_SCORED]
    for seed in args.starts:
        m = FHMM(**PAPER_MODEL, random_state=seed, covariance_type="spherical")
        # one run, one networks-only step: the model held at the first run's start
        kw = svi_settings(max_iter=1, net_warmup=1, n_restarts=1)
        m.fit(train, progress=False, **kw)
        models.append((f"the SVI start at seed {seed} ({kw['init']} on {kw['init_samples']:,} rows)", m, "smf"))
    for path, m, method in models:
        per = likelihood_per_step(m, X)
        elbo = "-" if per["elbo"] is None or method == "smf" else f"{per['elbo']:.3f}"
        print(f"\n{path}: σ² {np.mean(np.diag(m.covariance_)):.3f} (mean); exact log-likelihood "
              f"{per['loglik']:.3f}, ELBO {elbo} per step on the last {ROWS:,} training rows")
        for name, what in (("init_scores_", "its starts' log-likelihood"),
                           ("restart_scores_", "its runs' ELBO")):
            scores = getattr(m, name, None)
            if scores is not None and len(scores):
                print(f"  {what} per step when compared (the fit kept the highest): "
                      + " ".join(f"{v:.3f}" for v in scores))
        fit_elbo = running_elbo(m.history_) if method is None else None
        if fit_elbo:
            print("  the fit's running ELBO per step (its history): " + "; ".join(
                f"steps {a:,}-{b:,}: {v:.3f}" for (a, b), v in fit_elbo.items()))
        print(f"  {'m':>2} {'on':>6} {'unsure':>7} {'carried':>8}  " + " ".join(f"{c:>8}" for c in PAPER_SHORT_NAMES)
              + f"  {'P(0→1)':>7} {'P(1→0)':>7}")
        for r in chain_table(m, X, method):
            print(f"  {r['chain']:>2} {r['on']:6.3f} {r['uncertain']:7.3f} {r['carried']:8.3f}  "
                  + " ".join(f"{v:8.3f}" for v in r["W"]) + f"  {r['p01']:7.4f} {r['p10']:7.4f}")
        print(f"  {'bias':<26}" + " ".join(f"{v:8.3f}" for v in m.W_[-1]))
        # what no posterior can reconstruct: values outside the range Wᵀs reaches
        low, high = reconstruction_range(m)
        print(f"  {'reaches from':<26}" + " ".join(f"{v:8.3f}" for v in low))
        print(f"  {'reaches to':<26}" + " ".join(f"{v:8.3f}" for v in high))
        print(f"  (train rows: the last {ROWS:,} training rows; test rows: the first {N_SCORED:,} "
              f"test rows, scored as the protocol does)")
        for what, rows in (("train rows", X), ("test rows", scored)):
            print(f"  {'above, ' + what:<26}" + " ".join(f"{v:8.3f}" for v in (rows > high).mean(axis=0)))
            print(f"  {'below, ' + what:<26}" + " ".join(f"{v:8.3f}" for v in (rows < low).mean(axis=0)))
            print(f"  {'MSE floor, ' + what:<26}"
                  + " ".join(f"{v:8.4f}" for v in range_floor_mse(rows, low, high)))
        print(f"  {'MSE, train rows':<26}"
              + " ".join(f"{v:8.4f}" for v in mse_per_dimension(X, m.reconstruct(X, method=method))))
        # the scored rows reconstructed once, for the MSE and the mean residual (the
        # protocol's split has no missing values: protocol_mse's figures, to the digit)
        R = m.reconstruct(scored, method=method)
        print(f"  {'MSE, test rows':<26}"
              + " ".join(f"{v:8.4f}" for v in mse_per_dimension(scored, R)))
        print(f"  {'mean residual, test rows':<26}"
              + " ".join(f"{v:8.4f}" for v in np.nanmean(R - scored, axis=0)))
        if args.posteriors:
            # the same parameters read by other posteriors: what better inference could give
            for other in ("exact", "smf"):
                if other == method:
                    continue
                for what, rows in (("train rows", X), ("test rows", scored)):
                    mse = mse_per_dimension(rows, m.reconstruct(rows, method=other))
                    print(f"  {'MSE, ' + what + ', ' + other:<26}" + " ".join(f"{v:8.4f}" for v in mse))


if __name__ == "__main__":
    main()
