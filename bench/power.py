"""Household power: the paper's Table 2 beside ours.

    python bench/power.py            # the whole protocol (about 25 minutes on 2 cores; the SVI fit
                                     # about 12, three runs for its first sixth)
    python bench/power.py --quick    # CI-sized: small slices, few iterations (1-2 minutes)
    python bench/power.py --tune     # the learner settings compared on training data only
    python bench/power.py --quick --covariance-type diag   # our models with a diagonal Σ

Protocol (paper §4.2, :mod:`streamfhmm.power`): six standardised dimensions, the first
10^6 rows train, the rest test; test MSE per dimension of the reconstruction
``Wᵀ E[ŝ_t]`` on the first 300,000 test rows (the project's reference figures were
measured there; the paper scores all test rows, as the third table does). Rows: the paper's SMF-EM and proposed columns, our
SMF-EM trained on the last 5,000 training rows, our SMF-EM on the whole training set
(within ``--smf-budget`` seconds), and our SVI (FHMM(n_chains=10, window=21,
n_hidden=200, share_hidden="all"), ``--iters`` steps of ``--batch-size`` subchains,
the first tenth (``--net-warmup``) training the networks only; ``--n-restarts`` runs
(default 3) from their own starts (``--init``, one kind or one per run; by default
SMF-EM on the last 5,000 training rows for the first and third run, a k-means start on
all of them for the second) compared by their training ELBO after
``--restart-steps`` (default a sixth of the steps), the best continued), each with its
fit's wall time. SMF models are scored with SMF posteriors on the test
rows, the SVI model with its recognition networks. A second table leaves out the
test rows the data file filled by copying the previous day; a third scores all
1,075,259 test rows, the paper's whole test set (not with --quick). ``--covariance-type`` (full, diag,
spherical; default full) sets the noise covariance family of our SMF-EM and SVI models;
the tables name it in our rows. ``--em-rows N`` adds exact EM (maximum likelihood, 10
chains, 2^10 joint states) on the last N training rows within ``--em-budget`` seconds,
scored with exact posteriors: what the model family reaches without approximations.
A fourth table (the third with --quick, which skips the whole test set) gives, per step
on the last ``--bound-rows`` training rows, each model's exact log-likelihood, its
structured mean-field bound and the SVI model's ELBO: the gaps are how far each
posterior is from the exact one. The last table gives, per model and channel, the least
test MSE any posterior could give: the scored rows' distance to the range the model's
reconstruction reaches (:func:`streamfhmm.power.range_floor_mse`).

``--tune`` fits on training rows [0, 800,000) and scores the reconstruction of training
rows [800,000, 1,000,000); the test rows are never touched.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


sys.path.insert(0, os.path.dirname(__file__))
from _common import header  # noqa: E402

from streamfhmm import FHMM  # noqa: E402
from streamfhmm.power import (N_SCORED, PAPER_COLUMNS, PAPER_MODEL,  # noqa: E402
                              check_svi_kwargs, format_mse_rows, mse_per_dimension, power_split, protocol_mse,
                              protocol_table, range_floor_mse, reconstruction_range,
                              svi_settings)

#: --tune: settings compared, each a change from streamfhmm.power.SVI_SETTINGS
TUNE_VARIANTS = {
    "default": {},
    "no net warm-up": dict(net_warmup=0),
    "lr 1e-2": dict(learning_rate=1e-2),
    "lr 1e-3": dict(learning_rate=1e-3),
    "lr 3e-2": dict(learning_rate=3e-2),
    "init k-means": dict(init="kmeans"),
    "init SMF on 50k": dict(init_samples=50_000),
    "subchain 1, 6x steps": dict(subchain_length=1, iter_factor=6),
    "batch 30": dict(batch_size=30),
}
_SVI_OPTIONS = ("learning_rate", "final_lr_ratio", "batch_size", "subchain_length", "init",
                "init_samples", "n_init", "n_restarts", "restart_steps", "net_warmup", "n_jobs")


def print_table(rows, title):
    print(f"\n{title}")
    print("\n".join(format_mse_rows(rows)))


def svi_overrides(args) -> dict:
    """The SVI options given on the command line."""
    kw = {k: getattr(args, k) for k in _SVI_OPTIONS if getattr(args, k, None) is not None}
    if "init" in kw:  # one kind for every run, or one kind per run
        kw["init"] = kw["init"][0] if len(kw["init"]) == 1 else tuple(kw["init"])
    kw["max_iter"] = args.iters
    if args.svi_budget is not None:
        kw["time_budget"] = args.svi_budget
    return kw


def run_protocol(args, split):
    table = protocol_table(split, n_scored=args.n_scored, train_rows=args.train_rows,
                           svi_kwargs=svi_overrides(args), smf_budget=args.smf_budget,
                           smf_full=not args.skip_smf_full, random_state=args.seed,
                           progress=args.progress, log=lambda s: print(s, flush=True),
                           covariance_type=args.covariance_type, n_bound_rows=args.bound_rows,
                           score_all=not args.quick)
    svi = table.rows[-1]
    print(f"covariance_type={args.covariance_type}")
    print(f"SVI: {svi.info['iterations']:,} steps of {svi.info['settings']['batch_size']} subchains, "
          f"{svi.info['ms_per_step']:.2f} ms per step; settings {svi.info['settings']}")
    if svi.info.get("init_scores"):
        print("SMF starts, log-likelihood per step on training rows: "
              + " ".join(f"{v:.3f}" for v in svi.info["init_scores"]))
    if svi.info.get("restart_scores"):
        print(f"runs after {svi.info['restart_steps']:,} steps, ELBO per step on training rows (the best "
              f"continued): " + " ".join(f"{v:.3f}" for v in svi.info["restart_scores"]))
    if args.save_model:
        table.models[svi.name].save(args.save_model)
        print(f"saved the SVI model to {args.save_model}")
    print()
    print(table.format())
    # what no posterior can do better than: each model's reachable range, per channel
    scored = split.test[:table.n_scored]
    floors = {}
    for name, model in table.models.items():
        low, high = reconstruction_range(model)
        floors[name] = range_floor_mse(scored, low, high)
    print(f"\nleast test MSE any posterior could give: the distance to each model's reachable "
          f"range (streamfhmm.power.range_floor_mse), first {table.n_scored:,} test rows")
    print("\n".join(format_mse_rows(list(floors.items()), extra=())))
    record = {"n_scored": table.n_scored, "n_test": table.n_test, "seed": args.seed,
              "range_floor_mse": {k: v.tolist() for k, v in floors.items()},
              "covariance_type": args.covariance_type,
              "rows": [{"name": r.name, "mse": r.mse.tolist(),
                        "mse_excluding_imputed": None if r.mse_excluding_imputed is None
                        else r.mse_excluding_imputed.tolist(),
                        "mse_all_test": None if r.mse_all_test is None else r.mse_all_test.tolist(),
                        "fit_seconds": r.fit_seconds, "info": r.info} for r in table.rows]}
    if args.em_rows:
        record["exact_em"] = run_exact_em(args, split)
    return record


def run_exact_em(args, split):
    """Maximum likelihood (exact EM, M = 10) on the last ``--em-rows`` training rows,
    scored with exact posteriors: what the model family reaches when it is fitted
    without approximations."""
    train = split.train[-args.em_rows:]
    m = FHMM(n_chains=PAPER_MODEL["n_chains"], random_state=args.seed,
             covariance_type=args.covariance_type)
    t0 = time.perf_counter()
    m.fit(train, method="em", init="smf", init_samples=5000, time_budget=args.em_budget,
          tol=1e-7, progress=args.progress)
    seconds = time.perf_counter() - t0
    its = len(m.history_) - 1
    ll = [h["loglik"] / len(train) for h in m.history_]
    mse = protocol_mse(m, split, args.n_scored, method="exact")
    name = f"ours exact EM (last {len(train):,}, {args.covariance_type})"
    print(f"\nexact EM: {its} iterations in {seconds:,.0f} s; log-likelihood per step "
          + " ".join(f"{v:.4f}" for v in ll))
    print_table([(name, mse, seconds)], "maximum likelihood, exact posteriors (test MSE)")
    return {"name": name, "mse": mse.tolist(), "fit_seconds": seconds, "iterations": its,
            "loglik_per_step": ll}


def run_tune(args, split):
    train, valid = split.train[:800_000], split.train[800_000:]
    if args.quick:
        train, valid = train[-50_000:], valid[:20_000]
    names = args.variants or list(TUNE_VARIANTS)
    print(f"fit on training rows [0, 800,000), score training rows [800,000, 1,000,000); "
          f"{args.iters:,} steps per fit (x the variant's factor)")
    rows, record = [], {}
    for name in names:
        over = {**svi_overrides(args), **TUNE_VARIANTS[name]}
        over["max_iter"] *= over.pop("iter_factor", 1)
        kw = svi_settings(**over)
        m = FHMM(**PAPER_MODEL, random_state=args.seed, covariance_type=args.covariance_type)
        t0 = time.perf_counter()
        m.fit(train, method="svi", progress=args.progress, **kw)
        s = time.perf_counter() - t0
        mse = mse_per_dimension(valid, m.reconstruct(valid))
        rows.append((f"{name} ({args.covariance_type})", mse, s))
        record[name] = {"mse": mse.tolist(), "fit_seconds": s, "settings": kw,
                        "iterations": m.history_[-1]["iteration"], "elbo": m.history_[-1]["elbo"]}
        print(f"{name}: fit {s:,.0f} s, validation MSE " + " ".join(f"{v:.3f}" for v in mse)
              + f", mean {mse.mean():.3f}", flush=True)
    print_table(rows, "validation MSE per dimension (held-out training rows)")
    return record


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small slices and few iterations")
    ap.add_argument("--tune", action="store_true", help="compare SVI settings on training data")
    ap.add_argument("--variants", nargs="+", choices=list(TUNE_VARIANTS), help="--tune: these only")
    ap.add_argument("--iters", type=int, help="SVI steps (default 150,000; --quick 1,500; --tune 20,000)")
    ap.add_argument("--svi-budget", type=float, help="SVI wall-time cap in seconds (default none)")
    ap.add_argument("--smf-budget", type=float, help="SMF-EM on the whole training set: seconds "
                    "(default 600; --quick 20)")
    ap.add_argument("--skip-smf-full", action="store_true", help="leave out SMF-EM on all training rows")
    ap.add_argument("--learning-rate", type=float)
    ap.add_argument("--final-lr-ratio", type=float)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--subchain-length", type=int)
    ap.add_argument("--init", nargs="+", choices=("smf", "kmeans"),
                    help="SVI start: one kind, or one per run of --n-restarts "
                         "(e.g. --n-restarts 3 --init smf kmeans smf)")
    ap.add_argument("--init-samples", type=int)
    ap.add_argument("--n-init", type=int, help="SVI: SMF starts, the one most likely on "
                    "the training rows kept (FHMM.fit's n_init; default 1)")
    ap.add_argument("--n-restarts", type=int, help="SVI runs compared by their training ELBO "
                    "after --restart-steps steps, the best continued (FHMM.fit's n_restarts; "
                    "default 3, 1 with --svi-budget)")
    ap.add_argument("--restart-steps", type=int, help="see --n-restarts (default a sixth of --iters)")
    ap.add_argument("--net-warmup", type=int, help="SVI steps training the networks only "
                    "(default a tenth of --iters)")
    ap.add_argument("--n-jobs", type=int, help="SVI: threads computing each step's gradient "
                    "(default 1; -1 one per processor)")
    ap.add_argument("--n-scored", type=int, help=f"test rows scored (default {N_SCORED:,}; --quick 20,000)")
    ap.add_argument("--train-rows", type=int, help="train on the last so many training rows "
                    "(default all; --quick 50,000)")
    ap.add_argument("--em-rows", type=int, help="also fit exact EM (maximum likelihood) on the last "
                    "so many training rows, scored with exact posteriors")
    ap.add_argument("--em-budget", type=float, default=480.0, help="exact EM: seconds (default 480)")
    ap.add_argument("--covariance-type", choices=("full", "diag", "spherical"), default="full",
                    help="noise covariance family of our SMF-EM and SVI models (default full)")
    ap.add_argument("--bound-rows", type=int, help="last training rows on which the exact "
                    "log-likelihood, the SMF bound and the ELBO of each model are printed "
                    "(default 100,000; --quick 5,000; 0 leaves them out)")
    ap.add_argument("--missing", choices=("keep", "zero", "drop"), default="keep",
                    help="the original file's missing rows: as the data file fills them (keep, the "
                         "protocol), read as 0, or dropped (power_split's imputed; not the protocol)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--progress", action="store_true", help="show progress bars")
    ap.add_argument("--save-model", help="save the SVI model (.npz)")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    if args.iters is None:
        args.iters = 1_500 if args.quick else (20_000 if args.tune else 150_000)
    if args.smf_budget is None:
        args.smf_budget = 20.0 if args.quick else 600.0
    if args.n_scored is None:
        args.n_scored = 20_000 if args.quick else N_SCORED
    if args.bound_rows is None:
        args.bound_rows = 5_000 if args.quick else 100_000
    if args.quick and args.train_rows is None:
        args.train_rows = 50_000
    # the SVI settings are checked now, before the data is loaded
    try:
        check_svi_kwargs(svi_settings(**svi_overrides(args)))
    except ValueError as exc:
        ap.error(str(exc))

    from streamfhmm.datasets import load_household_power

    header("household power, the paper's Table 2 protocol" + (" (--quick)" if args.quick else ""))
    print(f"seed={args.seed}")
    t0 = time.perf_counter()
    data = load_household_power()
    split = power_split(data, imputed=args.missing)
    if args.missing != "keep":
        print(f"missing rows: {args.missing} (not the protocol; voltage's training sd {split.std[2]:.2f} V)")
    print(f"loaded {len(data):,} rows in {time.perf_counter() - t0:.1f} s; columns {', '.join(PAPER_COLUMNS)}; "
          f"{split.train.shape[0]:,} train, {split.test.shape[0]:,} test rows")
    record = run_tune(args, split) if args.tune else run_protocol(args, split)
    record["missing"] = args.missing     # a run under another reading is marked as such
    print(f"\ntotal {time.perf_counter() - t0:,.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(record, fh, indent=1)


if __name__ == "__main__":
    main()
