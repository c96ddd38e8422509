"""The paper's scalability experiments (§4 "Scalability Verification", Figures 2a and 2b).

    python bench/scalability.py --quick            # < 10 minutes on 2 cores
    python bench/scalability.py                    # the full design, about 1 h 35 min
    python bench/scalability.py --parts a --lengths 1000000   # one setting of part (a)

Both learners get the same wall-clock budget per setting and run one after the other,
each in a fresh process (one core each: SVI pins BLAS to one thread, the SMF E-step is
a single-threaded kernel):

* proposed (SVI): ``FHMM(n_chains=M, window=5, n_hidden=30, share_hidden="chain")``
  (the paper's settings), ``fit(X, max_iter=10**9, time_budget=budget)`` so that the
  cosine learning-rate schedule follows the budget;
* SMF-EM: ``FHMM(n_chains=M).fit(X, method="smf", max_iter=10**6, time_budget=budget)``.

Both use ``FHMM.fit``'s default start (a short SMF-EM run on the last 5,000 samples
from a k-means start), which the budget includes: ``time_budget`` starts before the
initialisation. The wall time actually used is measured around the whole ``fit`` call
and printed next to the budget (SMF-EM checks its budget only between EM iterations,
and its first, annealed E-step on the whole sequence is one uninterruptible block).
The kernels are compiled or loaded from the cache by a small warm-up fit in the same
process before the clock starts.

Part (a), Figure 2a: 4 chains, D = 2, training sequences of length 1,000 …
1,000,000 (the first T steps of one simulated sequence), two test sequences of
50,000. Part (b), Figure 2b: training length 15,000, 2 … 10 chains, D = 2, a new
model per M, two test sequences of 15,000 (the paper does not give their length).

Simulated models (like the validation experiment): chain contributions ``w_m`` of
length U(0.75, 1.25), directions spread over a half-turn (D = 2: angle
``φ0 + π(m + u_m)/M``, ``u_m ~ U(-0.2, 0.2)``, random sign; D > 2: uniform on the
sphere), bias ``w_0 ~ N(0, I)``, noise ``Σ = σ² (I + C) / (1 + tr C / D)`` with a small
random ``C`` and ``σ = 0.3`` (``--noise``; under a third of a contribution), switch
probabilities ``a_m, b_m ~ U(0.05, 0.1)``, chains starting from their stationary
distribution. Of ``SIM_TRIES`` such draws (a tenth for M > 8) the one whose 2^M
joint-state means are best separated is kept; the smallest separation is printed in
noise standard deviations (in D = 2 it shrinks fast with M: 4.1 at M = 2, 1.5 at
M = 4, 0.4 at M = 8, 0.1 at M ≥ 9). All seeds derive from ``--seed`` and are printed.

Printed per setting and method: LL_train and LL_test per step (exact log-likelihood,
forward algorithm; the true parameters as a reference), the budget and the wall time
used, the time spent before the learner's main loop ("init s": ``FHMM.fit``'s start
plus, for SVI, the networks' set-up), iterations (SVI steps; SMF-EM EM iterations),
why it stopped, and the peak memory of the fit: growth of the process's peak resident
set (``VmHWM`` after resetting it through ``/proc/self/clear_refs``) over its
resident set before the fit, so it counts every allocation — numpy, Numba and Python
objects — but not the data, which are in memory before. SMF-EM learns ``π_m = θ_1^m``
from the single training sequence (0 or 1, floored at 1e-12); ``LL_test*`` evaluates
the same parameters with ``π`` replaced by the stationary distribution of the learnt
transitions, the convention of SVI and of the true parameters (for those two it equals
LL_test). Part (c) prints the per-sweep cost of the SMF E-step for M = 10, D = 6,
T = 100,000 in time steps per second, against the SVI learner's step at the same M, D.

Budgets. The paper gives each method 2 h per sequence in (a) on a 24-core workstation
and 1,000 s per setting in (b). Neither learner here uses more than one core, so
budgets are scaled by this machine's 2 cores against the paper's 24, keeping the
paper's ratio between (a) and (b): full mode 600 s per method in (a) (= 7,200 s · 2/24)
and 83 s in (b) (= 1,000 s · 2/24). Lengths in (a): 1e3, 3e3, 1e4, 3e4, 1e5, 3e5, 1e6
(14 fits); chains in (b): 2 … 10 (18 fits). Expected run time about 1 h 35 min: SVI
always spends its budget, SMF-EM has converged well before it in every setting measured
(142 s at T = 1e6, ≤ 11 s in (b)); (a) at T = 1e6 took 14 min, all of (b) 14 min; at
most about 2 h 50 min if both learners spent every budget. ``--quick``: (a) T = 1e3,
1e4, 1e5, 1e6 at 20 s per method, (b) M = 2, 4, 6, 8, 10 at 10 s per method (not the
paper's ratio: SVI needs a few seconds to get going), and (c); 6 min 20 s measured at
load average 8–9 on 2 cores. The load average is printed with every fit: on a shared
machine both learners slow down alike only if the load stays the same.

SVI's peak memory at large T is not variational state: it comes from O(T·D)
temporaries of ``FHMM.fit``'s set-up (the networks' input scaler, the k-means start)
and the subchain sampler's per-epoch block list (O(T / subchain_length)).
"""
from __future__ import annotations

import argparse
import gc
import math
import multiprocessing as mp
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import best_time, header, table  # noqa: E402

from streamfhmm import FHMM, exact  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402

#: the paper's budgets (seconds) and core count, and this script's scaled budgets
PAPER_BUDGET_A, PAPER_BUDGET_B, PAPER_CORES = 7200.0, 1000.0, 24
FULL_BUDGET_A, FULL_BUDGET_B = 600.0, 83.0
QUICK_BUDGET_A, QUICK_BUDGET_B = 20.0, 10.0
FULL_LENGTHS = [1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000]
QUICK_LENGTHS = [1_000, 10_000, 100_000, 1_000_000]
FULL_CHAINS = list(range(2, 11))
QUICK_CHAINS = [2, 4, 6, 8, 10]
#: part (a): chains, features, test sequences; part (b): training length, features
A_CHAINS, A_FEATURES, A_TEST = 4, 2, 50_000
B_LENGTH, B_FEATURES = 15_000, 2
#: the proposed method's settings (paper §4)
SVI_KW = dict(window=5, n_hidden=30, share_hidden="chain")
SVI_MAX_ITER, SMF_MAX_ITER = 10**9, 10**6
#: simulation: contribution lengths, noise std, switch probabilities
W_NORM, NOISE_STD, SWITCH = (0.75, 1.25), 0.3, (0.05, 0.1)
#: draws per simulated model (the best separated is kept; a tenth of them for M > 8)
SIM_TRIES = 200
#: LL differences below this (nats/step) count as a tie in the summaries
TIE = 0.002


# ----------------------------------------------------------------------------------------
# simulation
# ----------------------------------------------------------------------------------------
def _draw_params(M: int, D: int, noise: float, rng: np.random.Generator):
    norms = rng.uniform(*W_NORM, size=M)
    if D == 2:
        phi = rng.uniform(0, 2 * np.pi) + np.pi * (np.arange(M) + rng.uniform(-0.2, 0.2, M)) / M
        dirs = np.stack([np.cos(phi), np.sin(phi)], axis=1) * rng.choice([-1.0, 1.0], size=(M, 1))
    else:
        dirs = rng.standard_normal((M, D))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    W = np.vstack([norms[:, None] * dirs, rng.standard_normal(D)])
    B = 0.3 * rng.standard_normal((D, D))
    C = B @ B.T / D
    cov = noise**2 * (np.eye(D) + C) / (1.0 + np.trace(C) / D)
    A = np.empty((M, 2, 2))
    a, b = rng.uniform(*SWITCH, size=M), rng.uniform(*SWITCH, size=M)
    A[:, 0, 1], A[:, 0, 0], A[:, 1, 0], A[:, 1, 1] = a, 1 - a, b, 1 - b
    return W, cov, A


def separation(params: FHMMParams) -> float:
    """Smallest Mahalanobis distance (under Σ) between the means of two joint states."""
    M = params.n_chains
    S = (np.arange(2**M)[:, None] >> np.arange(M)) & 1
    mu = np.linalg.solve(params.L, (S @ params.W[:M]).T).T
    sq = (mu * mu).sum(axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * mu @ mu.T
    np.fill_diagonal(d2, np.inf)
    return float(np.sqrt(max(d2.min(), 0.0)))


def simulate_params(n_chains: int, n_features: int, seed: int, noise: float = NOISE_STD) -> FHMMParams:
    """A random, well-posed FHMM: the best separated of ``SIM_TRIES`` draws (module docstring)."""
    rng = np.random.default_rng(seed)
    best, best_sep = None, -1.0
    for _ in range(SIM_TRIES if n_chains <= 8 else SIM_TRIES // 10):
        p = FHMMParams.from_natural(*_draw_params(n_chains, n_features, noise, rng))
        sep = separation(p)
        if sep > best_sep:
            best, best_sep = p, sep
    return best


# ----------------------------------------------------------------------------------------
# one fit, in a fresh process
# ----------------------------------------------------------------------------------------
def _proc_status() -> dict:
    with open("/proc/self/status") as fh:
        s = fh.read()
    return {k: int(re.search(rf"{k}:\s+(\d+) kB", s).group(1)) for k in ("VmRSS", "VmHWM")}


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _fit_worker(method: str, n_chains: int, X: np.ndarray, budget: float, seed: int) -> dict:
    """Warm the kernels up, then time one budgeted ``FHMM.fit`` and its peak memory."""
    warm = FHMM(n_chains=n_chains, random_state=0, **SVI_KW)
    if method == "svi":
        warm.fit(X[:500], max_iter=20, progress=False)
    else:
        warm.fit(X[:500], method="smf", max_iter=2, progress=False)
    del warm
    gc.collect()
    base = _proc_status()["VmRSS"]
    reset = _reset_peak_rss()
    model = FHMM(n_chains=n_chains, random_state=seed, **SVI_KW)
    t0 = time.perf_counter()
    if method == "svi":
        model.fit(X, max_iter=SVI_MAX_ITER, time_budget=budget, progress=False)
    else:
        model.fit(X, method="smf", max_iter=SMF_MAX_ITER, time_budget=budget, progress=False)
    wall = time.perf_counter() - t0
    peak = _proc_status()["VmHWM"]
    p = model.params_
    hist = model.history_
    out = {"W": p.W, "L": p.L, "alpha": p.alpha, "beta": p.beta, "startprob": p.startprob,
           "wall": wall, "peak_mb": (peak - base) / 1024 if reset else math.nan,
           "learner_s": hist[-1]["time"]}
    if method == "svi":
        out["iterations"] = hist[-1]["iteration"]
        out["stop"] = "budget"
    else:
        out["iterations"] = len(hist) - 1
        out["first_e_step_s"] = hist[0]["time"]
        out["stop"] = ("max_iter" if out["iterations"] >= SMF_MAX_ITER
                       else "budget" if wall >= budget else "converged")
    return out


def run_fit(method: str, n_chains: int, X: np.ndarray, budget: float, seed: int) -> dict:
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(_fit_worker, method, n_chains, X, budget, seed).result()


# ----------------------------------------------------------------------------------------
# one setting
# ----------------------------------------------------------------------------------------
def _display(row: dict) -> dict:
    """Log-likelihoods and their differences with 4 decimals."""
    out = dict(row)
    for k, v in row.items():
        if isinstance(v, float) and (k.startswith(("LL", "ΔLL")) or k.startswith("Δ") or "gap" in k):
            out[k] = f"{v:+.4f}" if k.startswith("Δ") or "gap" in k else f"{v:.4f}"
    return out


def _ll(params: FHMMParams, X, lengths=None) -> float:
    return exact.log_likelihood(params, X, lengths) / X.shape[0]


def run_setting(label: str, true: FHMMParams, X, Xtest, test_lengths, budget: float,
                fit_seed: int) -> list[dict]:
    M = true.n_chains
    ll_true_test = _ll(true, Xtest, test_lengths)
    rows = [{"setting": label, "method": "true parameters", "LL_train": _ll(true, X),
             "LL_test": ll_true_test, "LL_test*": ll_true_test, "Δtest*": 0.0}]
    notes = []
    for method, name in (("svi", "proposed (SVI)"), ("smf", "SMF-EM")):
        load = os.getloadavg()[0]
        r = run_fit(method, M, X, budget, fit_seed)
        p = FHMMParams(W=r["W"], L=r["L"], alpha=r["alpha"], beta=r["beta"], startprob=r["startprob"])
        p_stat = p.replace(startprob=p.stationary)
        ll_test, ll_test_stat = _ll(p, Xtest, test_lengths), _ll(p_stat, Xtest, test_lengths)
        rows.append({"setting": label, "method": name, "budget s": budget, "wall s": r["wall"],
                     "init s": r["wall"] - r["learner_s"], "iterations": r["iterations"],
                     "stop": r["stop"], "LL_train": _ll(p, X), "LL_test": ll_test,
                     "LL_test*": ll_test_stat, "Δtest*": ll_test_stat - ll_true_test,
                     "peak MB": r["peak_mb"], "load": load})
        over = r["wall"] - budget
        if over > max(1.0, 0.02 * budget):
            notes.append(f"{name} used {r['wall']:.1f} s of a {budget:g} s budget "
                         f"(over by {over:.1f} s)")
        if method == "smf" and r["iterations"] == 0:
            notes.append(f"SMF-EM FAILED to complete one EM iteration on the full sequence within "
                         f"the budget (its first E-step ended {r['first_e_step_s']:.1f} s into the "
                         f"EM run, {r['wall']:.1f} s after the start); the parameters shown are "
                         f"its starting point (SMF-EM on the last 5,000 samples)")
    table([_display(r) for r in rows],
          ["setting", "method", "budget s", "wall s", "init s", "iterations", "stop",
           "LL_train", "LL_test", "LL_test*", "Δtest*", "peak MB", "load"])
    for n in notes:
        print(f"  note: {n}")
    print(f"  data: train {X.nbytes / 2**20:.1f} MB, test {Xtest.nbytes / 2**20:.1f} MB", flush=True)
    return rows


# ----------------------------------------------------------------------------------------
# the parts
# ----------------------------------------------------------------------------------------
def part_a(lengths, budget: float, seed: int, noise: float) -> list[dict]:
    print(f"\n## (a) Figure 2a: M = {A_CHAINS} chains, D = {A_FEATURES}, training length "
          f"{lengths[0]:,} … {lengths[-1]:,}, two test sequences of {A_TEST:,}; "
          f"budget {budget:g} s per method and length")
    model_seed, train_seed, test_seed, fit_seed = seed, seed + 1, seed + 2, seed + 3
    print(f"seed={seed}: model seed {model_seed}, training seed {train_seed}, test seed "
          f"{test_seed}, fit seed {fit_seed}")
    true = simulate_params(A_CHAINS, A_FEATURES, model_seed, noise)
    _print_params(true)
    # one sequence of at least FULL_LENGTHS[-1] steps, so a length's data do not depend on
    # which other lengths run (the sampler's draws for a prefix depend on the total length)
    X_all, _ = true.sample(max(*lengths, FULL_LENGTHS[-1]), random_state=train_seed)
    Xtest, _ = true.sample(2 * A_TEST, random_state=test_seed)
    rows = []
    for T in lengths:
        print(f"\nT = {T:,}", flush=True)
        rows += run_setting(f"T={T:,}", true, X_all[:T], Xtest, [A_TEST, A_TEST], budget, fit_seed)
    return rows


def part_b(chains, budget: float, seed: int, n_features: int, noise: float) -> list[dict]:
    print(f"\n## (b) Figure 2b: training length {B_LENGTH:,}, D = {n_features}, M = "
          f"{', '.join(map(str, chains))} chains, two test sequences of {B_LENGTH:,}; "
          f"budget {budget:g} s per method and M")
    rows = []
    for M in chains:
        base = 1000 * (seed + 1) + 10 * M
        model_seed, train_seed, test_seed, fit_seed = base, base + 1, base + 2, base + 3
        print(f"\nM = {M}: model seed {model_seed}, training seed {train_seed}, test seed "
              f"{test_seed}, fit seed {fit_seed}", flush=True)
        true = simulate_params(M, n_features, model_seed, noise)
        print(f"smallest distance between two joint states' means: {separation(true):.2f} noise std")
        X, _ = true.sample(B_LENGTH, random_state=train_seed)
        Xtest, _ = true.sample(2 * B_LENGTH, random_state=test_seed)
        rows += run_setting(f"M={M}", true, X, Xtest, [B_LENGTH, B_LENGTH], budget, fit_seed)
    return rows


def part_c(T: int = 100_000, M: int = 10, D: int = 6, seed: int = 0):
    """Per-sweep cost of the SMF E-step against the SVI learner's step."""
    from threadpoolctl import threadpool_limits

    from streamfhmm.kernels import smf as ksmf
    from streamfhmm.learn.smf import smf_e_step
    from streamfhmm.learn.svi import fit_svi
    from streamfhmm.network import RecognitionNet
    print(f"\n## (c) SMF E-step, one sweep over all chains: M = {M}, D = {D}, T = {T:,} "
          f"(model seed {seed}, data seed {seed + 1})")
    p = simulate_params(M, D, seed)
    X, _ = p.sample(T, random_state=seed + 1)
    smf_e_step(p, X[:100], max_sweeps=1)
    t_pub = best_time(lambda: smf_e_step(p, X, tol=0.0, max_sweeps=1), repeat=3, min_time=0.5)
    ytil, U = ksmf.whiten(X, p.W, p.L)
    bounds = np.array([0, T], dtype=np.int64)
    theta = np.tile(p.stationary, (T, 1))
    xi, log_Z, theta_g, entropy = np.zeros((M, 2, 2)), np.zeros(M), np.zeros(M), np.zeros(M)
    trace = np.empty(1 + M)
    log_A, log_s = p.log_transmat, p.log_startprob

    def kernel():
        ksmf.smf_e_step(ytil, U, log_A, log_s, bounds, theta, 0.0, 1, 0.0, np.full(M, np.nan),
                        xi, log_Z, theta_g, entropy, trace)
    t_ker = best_time(kernel, repeat=3, min_time=0.5)
    # reference in the same process: the SVI learner step at the same M, D
    net = RecognitionNet(M, D, window=SVI_KW["window"], n_hidden=SVI_KW["n_hidden"],
                         share=SVI_KW["share_hidden"]).init(random_state=0)
    net.fit_scaler(X)
    kw = dict(batch_size=10, rng=np.random.default_rng(0), progress=False)
    with threadpool_limits(1, "blas"):
        fit_svi(X, bounds, p, net, max_iter=20, **kw)
        steps = 2000
        t_svi = best_time(lambda: fit_svi(X, bounds, p, net, max_iter=steps, **kw), repeat=3) / steps
    positions = 10 * SVI_KW["window"]
    rows = [{"what": "smf_e_step(max_sweeps=1), incl. whitening", "s per call": t_pub,
             "time steps/s": T / t_pub, "chain-steps/s": T * M / t_pub},
            {"what": "kernels.smf.smf_e_step, 1 sweep", "s per call": t_ker,
             "time steps/s": T / t_ker, "chain-steps/s": T * M / t_ker},
            {"what": "SVI learner step (10 subchains of 5)", "s per call": t_svi,
             "time steps/s": positions / t_svi, "chain-steps/s": positions * M / t_svi}]
    table(rows, ["what", "s per call", "time steps/s", "chain-steps/s"])
    sweep_1e6 = 1e6 / (T / t_ker)
    print(f"one sweep over T = 1,000,000 ≈ {sweep_1e6:.2f} s ≈ {sweep_1e6 / t_svi:,.0f} SVI steps; "
          f"an SMF-EM E-step makes up to 20 sweeps, its first (annealed) one up to 100", flush=True)


def _print_params(p: FHMMParams):
    with np.printoptions(precision=3, suppress=True):
        print(f"true W (rows w_1..w_M, bias last):\n{p.W}")
        print(f"true Σ:\n{p.covariance}")
        print(f"smallest distance between two joint states' means: {separation(p):.2f} noise std")
        print(f"true switch-on a: {p.transmat[:, 0, 1]}, switch-off b: {p.transmat[:, 1, 0]}")


def summary(rows: list[dict], title: str):
    print(f"\n### summary {title}: proposed (SVI) minus SMF-EM, nats/step "
          f"(positive = SVI better; |Δ| < {TIE} counted a tie)")
    out = []
    by = {}
    for r in rows:
        by.setdefault(r["setting"], {})[r["method"]] = r
    for setting, d in by.items():
        s, e = d["proposed (SVI)"], d["SMF-EM"]
        row = {"setting": setting}
        for k in ("LL_train", "LL_test", "LL_test*"):
            diff = s[k] - e[k]
            row[f"Δ{k}"] = diff
            row[f"{k} better"] = "tie" if abs(diff) < TIE else ("SVI" if diff > 0 else "SMF-EM")
        row["SVI gap*"] = s["Δtest*"]
        row["SMF gap*"] = e["Δtest*"]
        row["SMF iters"] = e["iterations"]
        row["SVI MB"], row["SMF MB"] = s["peak MB"], e["peak MB"]
        out.append(row)
    table([_display(r) for r in out], list(out[0]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer settings, smaller budgets")
    ap.add_argument("--parts", nargs="+", choices=["a", "b", "c"], default=["a", "b", "c"])
    ap.add_argument("--lengths", type=int, nargs="+", help="training lengths of part (a)")
    ap.add_argument("--chains", type=int, nargs="+", help="numbers of chains of part (b)")
    ap.add_argument("--budget-a", type=float, help="seconds per method and length in (a)")
    ap.add_argument("--budget-b", type=float, help="seconds per method and M in (b)")
    ap.add_argument("--features-b", type=int, default=B_FEATURES, help="D in part (b)")
    ap.add_argument("--noise", type=float, default=NOISE_STD, help="noise std of the simulated models")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else FULL_LENGTHS)
    chains = args.chains or (QUICK_CHAINS if args.quick else FULL_CHAINS)
    budget_a = args.budget_a or (QUICK_BUDGET_A if args.quick else FULL_BUDGET_A)
    budget_b = args.budget_b or (QUICK_BUDGET_B if args.quick else FULL_BUDGET_B)
    header("scalability: proposed (SVI) vs SMF-EM under equal wall-clock budgets "
           "(paper Figures 2a, 2b)" + (" [--quick]" if args.quick else ""))
    print(f"# mode: {'quick' if args.quick else 'full'}; seed={args.seed}; load average "
          f"(1, 5, 15 min) at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# paper budgets: {PAPER_BUDGET_A:g} s (a), {PAPER_BUDGET_B:g} s (b) on {PAPER_CORES} cores; "
          f"here {budget_a:g} s (a), {budget_b:g} s (b) per method on {os.cpu_count()} cores "
          f"(full mode: paper × 2/24), each fit single-core in its own process")
    print("# budget covers FHMM.fit entirely (initialisation included); 'wall s' is measured "
          "around the fit call; 'peak MB' is the growth of peak RSS during the fit")
    t_start = time.perf_counter()
    if "a" in args.parts:
        rows = part_a(lengths, budget_a, args.seed, args.noise)
        summary(rows, "(a), by training length")
    if "b" in args.parts:
        rows = part_b(chains, budget_b, args.seed, args.features_b, args.noise)
        summary(rows, "(b), by number of chains")
    if "c" in args.parts:
        part_c(seed=args.seed)
    print("\nLL_test*: π replaced by the stationary distribution of the learnt transitions "
          "(differs from LL_test only for SMF-EM); Δtest* = LL_test* - true LL_test")
    print(f"# total wall time {time.perf_counter() - t_start:.0f} s; load average at end: "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
