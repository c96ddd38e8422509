"""Learning speed of the SVI learner at the paper's power configuration.

    python bench/learn.py [--steps 3000]

M = 10 chains, D = 6, window 21, one shared hidden layer of 200 tanh units, 10
subchains per step. Prints, measured in the same run, positions per second of the full
learner step (windows, recognition forward, ELBO and its gradient, backward, RMSprop)
for several subchain lengths and thread counts (``fit_svi(n_jobs=...)``: each step's
gradient computed by that many threads), the FLOP rate of the step's network products
as a fraction of the machine's measured one-thread matrix-product peak, the speed-up of
the threads over one thread, and the projected wall time of the paper's run (150,000
steps of 10 subchains), the fastest of the thread counts. Target: the paper's run ≤ 2 minutes on this
2-core machine, checked at the protocol's subchain length: ``SVI_SETTINGS`` in
streamfhmm/power.py has ``subchain_length=None``, i.e. subchains as long as the window
(21), so that length is always timed, whatever ``--lengths`` says.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import header, matmul_peak_flops, table  # noqa: E402

from streamfhmm.learn.svi import fit_svi  # noqa: E402
from streamfhmm._blas import limit_blas_threads  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402
from streamfhmm.network import RecognitionNet  # noqa: E402
from streamfhmm.power import PAPER_MODEL, SVI_SETTINGS  # noqa: E402

M, D, WINDOW, HIDDEN, B = 10, 6, 21, 200, 10
PAPER_STEPS = 150_000
#: the protocol run's subchain length (None in SVI_SETTINGS means: the window)
PROTOCOL_LENGTH = SVI_SETTINGS["subchain_length"] or PAPER_MODEL["window"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000, help="steps timed per subchain length")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1, 5, 21],
                    help=f"subchain lengths to time (the protocol's, {PROTOCOL_LENGTH}, is always added)")
    ap.add_argument("--n-jobs", type=int, nargs="+", default=[1, 2],
                    help="thread counts to time (fit_svi's n_jobs; default 1 and 2)")
    args = ap.parse_args(argv)
    lengths = sorted(set(args.lengths) | {PROTOCOL_LENGTH})
    header("SVI learner step: M=10, D=6, window 21, 200 shared hidden units, 10 subchains/step")
    with limit_blas_threads(1):
        peak = matmul_peak_flops()
    print(f"# machine peak (1-thread float64 matrix product): {peak / 1e9:.1f} GFLOP/s")
    params = FHMMParams.random(M, D, random_state=0)
    X, _ = params.sample(100_000, random_state=1)
    net = RecognitionNet(M, D, window=WINDOW, n_hidden=HIDDEN, share="all").init(random_state=0)
    net.fit_scaler(X)
    bounds = np.array([0, len(X)])
    K = WINDOW * D
    rows = []
    for L in lengths:
        for n_jobs in args.n_jobs:
            kw = dict(subchain_length=L, batch_size=B, rng=np.random.default_rng(0),
                      progress=False, n_jobs=n_jobs)
            fit_svi(X, bounds, params, net, max_iter=20, **kw)  # compile / load cache
            steps = max(200, args.steps // max(1, L // 2))
            t = time.perf_counter()
            fit_svi(X, bounds, params, net, max_iter=steps, **kw)
            dt = (time.perf_counter() - t) / steps
            windows = B * (L + 1)
            flops = windows * (2 * K * HIDDEN + 2 * HIDDEN * 2 * M) * 3  # forward + 2x backward
            rows.append({"subchain length": L, "n_jobs": n_jobs, "ms/step": dt * 1e3,
                         "positions/s": B * L / dt, "windows/s": windows / dt,
                         "network GFLOP/s": flops / dt / 1e9,
                         "% of 1-thread peak": 100 * flops / dt / peak,
                         "150k steps (s)": PAPER_STEPS * dt})
    table(rows, list(rows[0]))
    for L in lengths:
        base = next(r for r in rows if r["subchain length"] == L)
        for r in rows:
            if r["subchain length"] == L and r is not base:
                print(f"subchain length {L}: n_jobs={r['n_jobs']} is {base['ms/step'] / r['ms/step']:.2f}x "
                      f"n_jobs={base['n_jobs']} (same run)")
    proto = min((r for r in rows if r["subchain length"] == PROTOCOL_LENGTH),
                key=lambda r: r["150k steps (s)"])
    wall = proto["150k steps (s)"]
    print(f"target: the paper's run (150,000 steps of {B} subchains of length {PROTOCOL_LENGTH} = the window, "
          f"as in streamfhmm.power.SVI_SETTINGS) in <= 120 s: projected {wall:.0f} s with n_jobs={proto['n_jobs']} "
          f"({'met' if wall <= 120 else f'NOT met, {wall / 120:.1f}x over'})")


if __name__ == "__main__":
    main()
