"""Household power: the protocol's model streamed through the engine over the test years.

    python bench/power_stream.py --model svi.npz    # a model saved by bench/power.py --save-model
    python bench/power_stream.py --quick            # CI-sized: a small model fitted here

Table 2 freezes the model at the end of the training rows (:mod:`streamfhmm.power`). A
streaming engine need not: its background learner can go on learning from the test
years as they arrive (the test years' voltage sits 0.66 training standard deviations
higher). This bench streams the first ``--rows`` test rows through
:class:`~streamfhmm.StreamEngine` (smooth mode, the model's recognition networks), one
day (1,440 rows) per ``push_many``, and scores the emitted posteriors' means
(``Wᵀ E[ŝ_t]`` of the snapshot in force) as the protocol does:

* ``protocol_mse`` — the batch reference, in the same run;
* the engine with learning off — must equal the reference (the same networks, read
  through the streaming path);
* the engine learning with a uniform reservoir, and with a recency-weighted one
  (``--half-life`` samples), paced at ``--steps-per-sample`` learner steps per sample
  streamed (after each day it waits until the learner has taken them: a stream that
  arrives no faster than the learner keeps up with; in real time one minute per sample
  leaves far more).

Rows are test MSE per dimension on those rows, the wall time and the learner's steps.

The learner offers its reservoir one segment per ``subchain_length`` (= window, 21)
samples. The engine's default reservoir (2,000 segments) fills only after some 42,000
rows, and until it is full both schemes keep every segment offered, so the two learning
rows can only differ once it is. ``--quick`` (20,000 rows) therefore streams with a
reservoir that fills within the first quarter of the rows (``--reservoir-size``: by
default ``rows / (5 · 21)``, 190 segments) and a half-life of a quarter of the rows
(5,000 samples; ``--half-life`` overrides it), so that recency weighting has something
to weigh within the stream; the output says where each learning run's reservoir filled.
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import header  # noqa: E402

from streamfhmm import FHMM, StreamEngine  # noqa: E402
from streamfhmm.power import (N_SCORED, PAPER_MODEL, format_mse_rows,  # noqa: E402
                              mse_per_dimension, power_split, protocol_mse, svi_settings)

DAY = 1440
#: the engine's default reservoir (segments)
DEFAULT_RESERVOIR = inspect.signature(StreamEngine).parameters["reservoir_size"].default


def stream_test_rows(model, X, *, learn, steps_per_sample=0.0, half_life=None,
                     learning_rate=1e-3, seed=0, reservoir_size=None, timeout=600.0):
    """Stream X through a StreamEngine one day per push_many; returns the
    reconstruction (n, D), the learner's steps, the wall time and the row count after
    which the reservoir was first seen full (None: never)."""
    t0 = time.perf_counter()
    parts = []
    full_at = None
    extra = {} if reservoir_size is None else {"reservoir_size": reservoir_size}
    with StreamEngine(model, mode="smooth", learn=learn, recency_half_life=half_life,
                      learning_rate=learning_rate, learner_duty=1.0, random_state=seed, **extra) as eng:
        capacity = reservoir_size or DEFAULT_RESERVOIR
        for k in range(0, len(X), DAY):
            parts.append(eng.push_many(X[k:k + DAY]).mean.copy())
            target = int(steps_per_sample * min(k + DAY, len(X)))
            while (learn and eng.learner_steps < target and eng.learner_error is None
                   and time.perf_counter() - t0 < timeout):
                time.sleep(0.002)
            if learn and full_at is None and eng.metrics()["reservoir_size"] >= capacity:
                full_at = min(k + DAY, len(X))
        parts.extend(p.mean[None] for p in eng.flush())
        steps = eng.learner_steps
        if eng.learner_error is not None:
            raise RuntimeError(f"the learner stopped: {eng.learner_error!r}")
    R = np.concatenate(parts)
    if R.shape != X.shape:
        raise RuntimeError(f"the engine emitted {R.shape[0]} posteriors for {X.shape[0]} rows")
    return R, steps, time.perf_counter() - t0, full_at


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a fitted FHMM for the six standardised channels (.npz; "
                                    "bench/power.py --save-model)")
    ap.add_argument("--quick", action="store_true",
                    help="fit a small model here (1,500 SVI steps on the last 50,000 training "
                         "rows) and stream 20,000 test rows")
    ap.add_argument("--rows", type=int, help=f"test rows streamed (default {N_SCORED:,})")
    ap.add_argument("--steps-per-sample", type=float, default=0.1,
                    help="learner steps per sample streamed (default 0.1)")
    ap.add_argument("--half-life", type=float, default=None,
                    help="recency-weighted reservoir's half-life in samples (default 30 days; "
                         "--quick: a quarter of the rows)")
    ap.add_argument("--reservoir-size", type=int, default=None,
                    help="the learner's reservoir, in segments of 21 samples (default: the "
                         "engine's, 2,000; --quick: rows / (5 * 21), so that it fills within "
                         "the first quarter of the rows)")
    ap.add_argument("--learning-rate", type=float, default=1e-3, help="the online learner's (default 1e-3)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if (args.model is None) == (not args.quick):
        ap.error("give --model PATH or --quick")
    n_rows = args.rows or (20_000 if args.quick else N_SCORED)
    header("household power: the protocol's model streamed over the test years")
    split = power_split()
    if args.quick:
        model = FHMM(**PAPER_MODEL, covariance_type="spherical", random_state=args.seed)
        model.fit(split.train[-50_000:], method="svi", progress=False,
                  **svi_settings(max_iter=1_500, init_samples=5_000, n_restarts=1))
        source = "fitted here: 1,500 SVI steps (one run) on the last 50,000 training rows (spherical)"
    else:
        model = FHMM.load(args.model)
        source = args.model
    X = split.test[:n_rows]
    stride = model.window
    reservoir = args.reservoir_size or (max(1, n_rows // (5 * stride)) if args.quick else None)
    half_life = args.half_life or (n_rows / 4 if args.quick else 30 * DAY)
    print(f"model: {source}; first {n_rows:,} test rows, {args.steps_per_sample:g} learner steps "
          f"per sample, learning rate {args.learning_rate:g}, seed {args.seed}")
    print(f"reservoir: {reservoir or DEFAULT_RESERVOIR:,} segments (one offered per {stride} samples: "
          f"full after about {(reservoir or DEFAULT_RESERVOIR) * stride:,} rows{', set small by --quick so that it fills' if args.quick and not args.reservoir_size else ''}); "
          f"half-life {half_life:,.0f} samples")
    rows = []
    t0 = time.perf_counter()
    ref = protocol_mse(model, split, n_rows)
    rows.append(("reference: protocol_mse (batch)", ref, time.perf_counter() - t0, None))
    R, steps, s, _ = stream_test_rows(model, X, learn=False)
    off = mse_per_dimension(X, R)
    rows.append(("engine, learning off", off, s, steps))
    for name, half in (("engine learning, uniform reservoir", None),
                       (f"engine learning, half-life {half_life:,.0f}", half_life)):
        R, steps, s, full_at = stream_test_rows(model, X, learn=True, steps_per_sample=args.steps_per_sample,
                                                half_life=half, learning_rate=args.learning_rate,
                                                seed=args.seed, reservoir_size=reservoir)
        rows.append((name, mse_per_dimension(X, R), s, steps))
        filled = (f"reservoir full after {full_at:,} of {n_rows:,} rows" if full_at is not None
                  else f"reservoir NOT full after {n_rows:,} rows: this row equals the uniform one by construction")
        print(f"{name}: {s:.0f} s; {filled}", flush=True)
    print()
    print("\n".join(format_mse_rows(rows, extra=("wall s", "steps"))))
    diff = float(np.max(np.abs(off - ref)))
    print(f"\nengine (learning off) against the batch reference: max |ΔMSE| {diff:.2e} "
          f"({'equal' if diff < 1e-9 else 'DIFFERENT'})")


if __name__ == "__main__":
    main()
