"""Energy disaggregation of the household power data with a factorial HMM.

    pip install "streamfhmm[data,plot]"
    python examples/power_disaggregation.py [--iters 20000] [--n-jobs 2] [--out-dir power_plots] [--no-progress]

An FHMM (10 chains, window 21, one shared hidden layer of 200 tanh units) is learnt
by SVI from the whole-house channels only — active power, reactive power, voltage —
over the first 10^6 minutes. Its chains never see the sub-meters. The first two weeks
of the test period calibrate a non-negative map from the chain posteriors [θ, 1] to
the three sub-meters (kitchen; laundry room; water heater and air conditioner); the
next four weeks score the estimated sub-meter readings. The baseline regresses each
sub-meter on the aggregate channels (least squares with intercept) over the same
calibration weeks. Two PNGs show one day: observed vs reconstructed aggregate, and
estimated vs true sub-meters.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

from streamfhmm.datasets import load_household_power
from streamfhmm.power import N_TRAIN, disaggregate_report, period_minutes


def _minutes(days: float) -> int:
    """A period of ``days`` in one-minute rows, as the library rounds it (0 for a period
    that is no finite number)."""
    try:
        return period_minutes(days)
    except ValueError:   # inf, nan
        return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20_000, help="SVI steps (default 20,000)")
    ap.add_argument("--learning-rate", type=float, default=3e-3)
    ap.add_argument("--net-warmup", type=int, default=None,
                    help="first SVI steps training the networks only (default a tenth of --iters)")
    ap.add_argument("--n-jobs", type=int, default=1,
                    help="threads computing each SVI step's gradient (default 1; -1 one per processor)")
    ap.add_argument("--train-rows", type=int, default=None,
                    help="fit on the last so many training minutes (default all 10^6)")
    ap.add_argument("--calibration-days", type=float, default=14)
    ap.add_argument("--evaluation-days", type=float, default=28)
    ap.add_argument("--on-threshold", type=float, default=5.0, help="Wh per minute (default 5)")
    ap.add_argument("--out-dir", default="power_plots", help="where the PNGs go")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                    help="the fit's progress bar (default: when stderr is a terminal)")
    args = ap.parse_args(argv)
    for option, value, ok, expected in (
            ("--iters", args.iters, args.iters >= 1, "a positive integer"),
            ("--net-warmup", args.net_warmup, args.net_warmup is None or 0 <= args.net_warmup < args.iters,
             "an integer from 0 to --iters - 1"),
            ("--n-jobs", args.n_jobs, args.n_jobs >= 1 or args.n_jobs == -1, "a positive integer or -1"),
            # (the library's rules: a fit needs 2 rows; the periods are whole minutes, at
            # least one each; the threshold and the learning rate finite and > 0)
            ("--train-rows", args.train_rows, args.train_rows is None or 2 <= args.train_rows <= N_TRAIN,
             f"an integer from 2 to {N_TRAIN:,} (the training minutes)"),
            ("--calibration-days", args.calibration_days, _minutes(args.calibration_days) >= 1,
             "a finite number of days of at least one minute (1/1440)"),
            ("--evaluation-days", args.evaluation_days, _minutes(args.evaluation_days) >= 1,
             "a finite number of days of at least one minute (1/1440)"),
            ("--on-threshold", args.on_threshold, math.isfinite(args.on_threshold) and args.on_threshold > 0,
             "a finite number > 0"),
            ("--learning-rate", args.learning_rate,
             math.isfinite(args.learning_rate) and args.learning_rate > 0, "a finite number > 0"),
            ("--seed", args.seed, args.seed >= 0, "an integer >= 0")):
        if not ok:
            ap.error(f"{option} must be {expected}, got {value}")
    print(f"seed={args.seed}")
    t0 = time.perf_counter()
    data = load_household_power()
    print(f"loaded {len(data):,} minutes ({data.timestamps[0]} .. {data.timestamps[-1]}) "
          f"in {time.perf_counter() - t0:.1f} s")
    # the periods against the data (the library refuses them too, in its own terms)
    n_test = len(data) - N_TRAIN
    if _minutes(args.calibration_days) + _minutes(args.evaluation_days) > n_test:
        ap.error(f"--calibration-days and --evaluation-days must fit in the {n_test:,} test minutes "
                 f"({math.floor(100 * n_test / 1440) / 100:g} days) after the {N_TRAIN:,} training ones, "
                 f"got {args.calibration_days:g} and {args.evaluation_days:g} days")
    print(f"fitting the FHMM by SVI ({args.iters:,} steps) ...", flush=True)
    report = disaggregate_report(
        data, train_rows=args.train_rows, calibration_days=args.calibration_days,
        evaluation_days=args.evaluation_days, on_threshold=args.on_threshold,
        fit_kwargs=dict(max_iter=args.iters, learning_rate=args.learning_rate, n_jobs=args.n_jobs,
                        **({} if args.net_warmup is None else {"net_warmup": args.net_warmup})),
        plot_dir=args.out_dir, random_state=args.seed, progress=args.progress,
        before_plots=lambda r: print(r.format(), flush=True))   # the table even if a plot fails
    for p in report.pngs:
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
