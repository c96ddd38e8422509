"""Learning speed of the SVI learner at the paper's power configuration.

    python bench/learn.py [--steps 3000]
    python bench/learn.py --model svi.npz    # the breakdown on a fitted household model too

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

Then where a one-thread step's time goes at that length, each part timed on its own
over the same batches: the windows and the recognition networks' forward pass, the ELBO
and its gradient in θ, ρ and the model (the copula cells and the emission terms), the
networks' backward pass, and RMSprop. The copula cells cost most where θ sits near its
clip (a chain surely on or off: more quadrature nodes), as in a fitted model's
posteriors, so ``--model`` (an FHMM saved by ``bench/power.py --save-model``, fitted on
the household data's standardised channels) adds the breakdown on its networks and the
protocol's training rows. A last line times the whole one-thread step in ``fit_svi``
with the parameters held (a learning rate of 1e-12) and moving (the default rate), each
300 steps, alternately twice: the breakdown's parts are timed on fixed parameters, the
table's rows on fits whose posteriors sharpen as they learn, where the cells cost more.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import header, matmul_peak_flops, table  # noqa: E402

from streamfhmm.kernels import recognition as _kr  # noqa: E402
from streamfhmm.kernels import svi as _ks  # noqa: E402
from streamfhmm.learn.objective import covariance_mode  # noqa: E402
from streamfhmm.learn.sampler import SubchainSampler  # noqa: E402
from streamfhmm.learn.svi import fit_svi, start_state  # noqa: E402
from streamfhmm._blas import limit_blas_threads  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402
from streamfhmm.network import RecognitionNet  # noqa: E402
from streamfhmm.power import PAPER_MODEL, SVI_SETTINGS  # noqa: E402

M, D, WINDOW, HIDDEN, B = 10, 6, 21, 200, 10
PAPER_STEPS = 150_000
#: the protocol run's subchain length (None in SVI_SETTINGS means: the window)
PROTOCOL_LENGTH = SVI_SETTINGS["subchain_length"] or PAPER_MODEL["window"]


def breakdown(X, params, net, covariance_type, steps, seed=0) -> dict:
    """Milliseconds per one-thread step at the protocol's subchain length, by part."""
    state = start_state(None, params, net, 0.9, covariance_type)
    net, nm = state.net, state.packer.size
    x = state.state_vector()
    sampler = SubchainSampler(np.array([0, len(X)]), PROTOCOL_LENGTH, B, np.random.default_rng(seed))
    sc = _ks.batch_scratch(sampler.max_rows, B, net.n_inputs, net.n_groups * net.n_hidden, M, X.shape[1])
    grad, sq = np.empty_like(x), np.zeros_like(x)
    mode = covariance_mode(covariance_type)
    batches = []
    for _ in range(steps):
        sampler.ensure(B)
        _ks.fill_batch(sampler.q_start, sampler.q_stop, sampler.q_lo, sampler.q_hi, sampler.cursor, B,
                       sc.rows, sc.row_start, sc.row_end, sc.offsets, sc.first)
        sampler.advance(B)
        batches.append((sc.rows.copy(), sc.row_start.copy(), sc.row_end.copy(), sc.offsets.copy(),
                        sc.first.copy()))

    def load(b):
        for dst, src in zip((sc.rows, sc.row_start, sc.row_end, sc.offsets, sc.first), b):
            dst[:] = src
        return int(sc.offsets[B])

    def gradient():
        _ks.batch_gradient(X, sc.rows, sc.row_start, sc.row_end, sc.offsets, sc.first, net.window,
                           net.offset, net.mean, net.scale, x, nm, net.layout, M, X.shape[1], sc.Xw,
                           sc.hidden, sc.theta, sc.rho, sc.g_theta, sc.g_rho, sc.Yb, grad, mode)

    def forward(n):
        _kr.build_windows(X, sc.row_start[:n], sc.row_end[:n], sc.rows[:n], net.window, net.offset,
                          net.mean, net.scale, sc.Xw[:n])
        _kr.forward_batch(sc.Xw[:n], x[nm:], net.layout, sc.theta[:n], sc.rho[:n], sc.hidden[:n])

    def backward(n):
        _kr.backward_batch(sc.Xw[:n], sc.hidden[:n], sc.theta[:n], sc.rho[:n], sc.g_theta[:n],
                           sc.g_rho[:n], x[nm:], net.layout, grad[nm:])

    x_rms = x.copy()

    def rmsprop():   # on a copy of the parameters (η = 0): the timed batches all see the same ones
        _ks.rmsprop_update(x_rms, grad, sq, 0.9, 1e-8, 0.0, 1, nm)

    load(batches[0])
    gradient(), forward(int(sc.offsets[B])), backward(int(sc.offsets[B])), rmsprop()  # compile
    out = {}
    for name, part in (("whole gradient", lambda n: gradient()), ("windows + forward", forward),
                       ("backward", backward), ("RMSprop", lambda n: rmsprop())):
        total = 0.0
        for b in batches:
            n = load(b)
            if name == "backward":
                gradient()        # its inputs: this batch's hidden units and ∂/∂θ, ∂/∂ρ
            t = time.perf_counter()
            part(n)
            total += time.perf_counter() - t
        out[name] = 1e3 * total / len(batches)
    out["ELBO (cells, emission) and model gradient"] = (
        out["whole gradient"] - out["windows + forward"] - out["backward"])
    out["step"] = out.pop("whole gradient") + out["RMSprop"]
    return out


def held_and_moving(X, bounds, params, net, steps=300) -> tuple:
    """Milliseconds per one-thread ``fit_svi`` step at the protocol's subchain length with
    the parameters held (learning rate 1e-12) and moving (the default rate), the two
    timed alternately twice and the faster of each kept: the breakdown above times its
    parts on fixed parameters, the table's rows on a fit whose posteriors sharpen."""
    best = {}
    for lr in (1e-12, None, 1e-12, None):
        kw = dict(subchain_length=PROTOCOL_LENGTH, batch_size=B, rng=np.random.default_rng(0),
                  progress=False, n_jobs=1, **({} if lr is None else {"learning_rate": lr}))
        fit_svi(X, bounds, params, net, max_iter=20, **kw)
        t = time.perf_counter()
        fit_svi(X, bounds, params, net, max_iter=steps, **kw)
        ms = 1e3 * (time.perf_counter() - t) / steps
        best[lr] = min(best.get(lr, ms), ms)
    return best[1e-12], best[None]


def print_breakdown(label, parts):
    step = parts["step"]
    print(f"\none-thread step at subchain length {PROTOCOL_LENGTH}, {label}: {step:.2f} ms")
    for name in ("windows + forward", "ELBO (cells, emission) and model gradient", "backward", "RMSprop"):
        print(f"  {name:<44}{parts[name]:7.3f} ms  {100 * parts[name] / step:5.1f} %")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000, help="steps timed per subchain length")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1, 5, 21],
                    help=f"subchain lengths to time (the protocol's, {PROTOCOL_LENGTH}, is always added)")
    ap.add_argument("--n-jobs", type=int, nargs="+", default=[1, 2],
                    help="thread counts to time (fit_svi's n_jobs; default 1 and 2)")
    ap.add_argument("--model", metavar="PATH",
                    help="an FHMM saved by bench/power.py --save-model: the step's breakdown on it too")
    ap.add_argument("--breakdown-steps", type=int, default=500, help="batches the breakdown times")
    args = ap.parse_args(argv)
    if args.breakdown_steps < 1 or args.steps < 1:
        ap.error("--steps and --breakdown-steps must be >= 1")
    fitted = None
    if args.model:
        from streamfhmm import FHMM
        try:
            fitted = FHMM.load(args.model)
        except (OSError, ValueError) as exc:
            ap.error(f"--model: {exc}")
        if getattr(fitted, "net_", None) is None or fitted.net_.n_features != D \
                or fitted.net_.window != WINDOW or np.shape(fitted.W_)[0] != M + 1:
            ap.error(f"--model: expected an SVI model of the protocol ({M} chains, {D} features, window "
                     f"{WINDOW}), as bench/power.py --save-model writes")
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
    with limit_blas_threads(1):
        print_breakdown("fresh networks, simulated data", breakdown(X, params, net, "full", args.breakdown_steps))
        held, moving = held_and_moving(X, bounds, params, net)
        print(f"  the whole one-thread step in fit_svi at this length: {held:.2f} ms with the parameters "
              f"held (learning rate 1e-12), {moving:.2f} ms as they move (the default rate; the copula "
              f"cells cost more as the posteriors sharpen)")
        if fitted is not None:
            from streamfhmm.power import power_split
            train = np.ascontiguousarray(power_split().train)
            print_breakdown(f"{args.model}, the household training rows",
                            breakdown(train, fitted.params_, fitted.net_, fitted.covariance_type,
                                      args.breakdown_steps))


if __name__ == "__main__":
    main()
