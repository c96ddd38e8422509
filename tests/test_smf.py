"""Structured mean-field E-step, M-step and EM (MATH.md §6) against brute force, exact
inference and least squares."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfhmm import exact
from streamfhmm.learn.smf import (COVARIANCE_FLOOR, MAX_SWEEPS, SMFEStep, expected_complete_loglik, fit_smf,
                                  init_params, smf_e_step, smf_m_step, smf_posterior)
from streamfhmm.kernels import smf as _ksmf
from streamfhmm.model import FHMMParams

from . import naive_smf as naive
from .naive import forward_loglik_loops


def _model(M, D, seed, **kw):
    print(f"seed={seed} M={M} D={D}")
    return FHMMParams.random(M, D, random_state=seed, **kw)


def _assert_nondecreasing(values, scale, rel=1e-9):
    values = np.asarray(values)
    assert np.isfinite(values).all()
    drops = np.diff(values)
    assert drops.min() >= -rel * abs(scale), f"bound decreased by {-drops.min():.3e}"


# ----------------------------------------------------------------------------------------
# E-step against brute force
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("M,D,T,sweeps,seed", [(1, 2, 6, 1, 0), (2, 2, 5, 1, 1), (2, 3, 5, 3, 2),
                                               (3, 2, 4, 2, 3)])
def test_e_step_matches_bruteforce_sweeps(M, D, T, sweeps, seed):
    p = _model(M, D, seed, noise=0.6)
    X, _ = p.sample(T, random_state=seed + 100)
    theta0 = np.random.default_rng(seed).uniform(size=(T, M))
    est = smf_e_step(p, X, theta_init=theta0, tol=0.0, max_sweeps=sweeps)
    ref_theta, potentials, ref_xi, ref_log_Z, ref_entropy = naive.smf_sweeps(p, X, theta0, sweeps)
    assert est.n_sweeps == sweeps
    np.testing.assert_allclose(est.theta, ref_theta, rtol=0, atol=1e-10)
    np.testing.assert_allclose(est.xi, ref_xi, rtol=0, atol=1e-10)
    np.testing.assert_allclose(est.log_Z, ref_log_Z, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(est.entropy, ref_entropy, rtol=1e-9, atol=1e-10)
    # the bound identity F = E_q log p - E_q log q, by enumerating every joint sequence
    F_ref = naive.smf_bound_bruteforce(p, X, potentials)
    assert est.bound == pytest.approx(F_ref, rel=1e-10)
    # and F ≤ log p(X)
    ll = naive.log_likelihood_bruteforce(p, X)
    assert ll == pytest.approx(exact.log_likelihood(p, X), rel=1e-10)
    assert est.bound <= ll + 1e-10 * abs(ll)


@pytest.mark.parametrize("M,D,seed", [(2, 3, 10), (4, 2, 11), (5, 6, 12)])
def test_bound_is_expected_complete_loglik_plus_entropy(M, D, seed):
    p = _model(M, D, seed)
    lengths = np.array([120, 1, 79])
    X, _ = p.sample(int(lengths.sum()), random_state=seed)
    est = smf_e_step(p, X, lengths=lengths)
    ecll = expected_complete_loglik(p, X, est.theta, est.xi, lengths=lengths)
    assert est.bound == pytest.approx(ecll + est.entropy.sum(), rel=1e-11)
    # the identity holds for any parameters: E_q log p under other params + H[q] is the
    # bound of the same q there, which is what the next E-step's trace[0] reports
    other = _model(M, D, seed + 1)
    nxt = smf_e_step(other, X, lengths=lengths, previous=est, max_sweeps=1)
    F_other = (expected_complete_loglik(other, X, est.theta, est.xi, lengths=lengths)
               + est.entropy.sum())
    assert nxt.trace[0] == pytest.approx(F_other, rel=1e-11)


# ----------------------------------------------------------------------------------------
# monotonicity
# ----------------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), M=st.integers(1, 6), D=st.integers(1, 5),
       noise=st.sampled_from([0.05, 0.3, 1.0]))
def test_e_step_never_decreases(seed, M, D, noise):
    print(f"seed={seed} M={M} D={D} noise={noise}")
    p = FHMMParams.random(M, D, random_state=seed, noise=noise)
    rng = np.random.default_rng(seed)
    X, _ = p.sample(200, random_state=rng)
    X = X + rng.standard_normal(X.shape) * rng.uniform(0, 1)  # also data the model does not fit
    est = smf_e_step(p, X, theta_init=rng.uniform(size=(200, M)), tol=0.0, max_sweeps=6)
    # every chain has a q_m after the first sweep; from there every update is an ascent step
    _assert_nondecreasing(est.trace[M:], est.bound)


@pytest.mark.parametrize("M,D,noise,seed", [(2, 2, 0.3, 20), (3, 4, 0.1, 21), (5, 3, 1.0, 22)])
def test_em_never_decreases(M, D, noise, seed):
    """Every chain update and every M-step, with random starting parameters."""
    truth = _model(M, D, seed, noise=noise)
    lengths = np.array([150, 90])
    X, _ = truth.sample(int(lengths.sum()), random_state=seed)
    params = _model(M, D, seed + 1000, noise=1.0)
    rng = np.random.default_rng(seed)
    est = smf_e_step(params, X, lengths=lengths, theta_init=rng.uniform(size=(len(X), M)),
                     tol=0.0, max_sweeps=3)
    path = list(est.trace[M:])
    for _ in range(8):
        new = smf_m_step(params, X, est.theta, est.xi, lengths=lengths)
        nxt = smf_e_step(new, X, lengths=lengths, previous=est, tol=0.0, max_sweeps=2)
        # trace[0] is F(q_old, Γ_new): the M-step's gain, then the chain updates'
        F_new = (expected_complete_loglik(new, X, est.theta, est.xi, lengths=lengths)
                 + est.entropy.sum())
        assert nxt.trace[0] == pytest.approx(F_new, rel=1e-11)
        path.extend(nxt.trace)
        params, est = new, nxt
    _assert_nondecreasing(path, path[-1])
    assert path[-1] > path[0]
    assert path[-1] <= exact.log_likelihood(params, X, lengths=lengths)


def test_fit_history_never_decreases():
    seed = 30
    truth = _model(3, 2, seed, noise=0.2)
    X, _ = truth.sample(400, random_state=seed)
    params, history = fit_smf(X, n_chains=3, max_iter=25, tol=0.0, random_state=seed,
                              progress=False)
    bounds = [h["bound"] for h in history]
    assert [h["iteration"] for h in history] == list(range(len(history)))
    assert 5 < len(history) <= 26
    if len(history) < 26:  # stopped because the bound no longer increased at all
        assert bounds[-1] - bounds[-2] < 1e-12 * abs(bounds[-2])
    _assert_nondecreasing(bounds, bounds[-1])
    assert bounds[-1] > bounds[0]
    assert bounds[-1] <= exact.log_likelihood(params, X)


# ----------------------------------------------------------------------------------------
# bound against exact inference
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("M,D,noise,seed", [(2, 2, 0.3, 40), (4, 3, 0.5, 41), (6, 4, 0.2, 42),
                                            (8, 6, 1.0, 43)])
def test_bound_below_exact_loglik(M, D, noise, seed):
    p = _model(M, D, seed, noise=noise)
    lengths = np.array([300, 200])
    X, _ = p.sample(500, random_state=seed)
    theta, bound = smf_posterior(p, X, lengths=lengths)
    ll = exact.log_likelihood(p, X, lengths=lengths)
    print(f"bound={bound:.6f} loglik={ll:.6f}")
    assert np.isfinite(bound)
    assert bound <= ll
    assert ((theta >= 0) & (theta <= 1)).all()
    # and the same for random (poor) parameters
    q = _model(M, D, seed + 1, noise=0.3)
    _, bound_q = smf_posterior(q, X, lengths=lengths)
    assert bound_q <= exact.log_likelihood(q, X, lengths=lengths)


@pytest.mark.parametrize("scale,noise", [(1e4, 1e-3), (1e3, 1e-5)])
def test_entropy_and_bound_at_a_high_signal_to_noise_ratio(scale, noise):
    """log Z_m and Σ_t θ g each grow as T‖L⁻¹w_m‖² (1e14 here): formed as their
    difference, the entropy left [0, T log 2] (-1.5 and +564) and the bound passed the
    log-likelihood by up to 649 nats on 200 samples. The posterior is then nearly
    certain: entropy ≈ 0 and the bound ≈ log p(y) of a textbook log-space forward pass."""
    seed = 1
    print(f"seed={seed}")
    p = FHMMParams.random(3, 2, random_state=seed, scale=scale, noise=noise)
    X, S = p.sample(200, random_state=seed + 1)
    est = smf_e_step(p, X, theta_init=S.astype(float), tol=1e-10, max_sweeps=20)
    ll = forward_loglik_loops(p, X)
    print(f"entropy={est.entropy} bound - loglik={est.bound - ll:.3g}")
    assert (est.entropy >= -1e-9).all() and (est.entropy <= 1e-6).all()
    assert est.bound <= ll + 1e-9 * abs(ll)
    assert est.bound == pytest.approx(ll, abs=1e-5)


@pytest.mark.parametrize("D,noise,seed", [(1, 0.3, 50), (3, 1.0, 51), (2, 0.02, 52)])
def test_single_chain_is_exact(D, noise, seed):
    p = _model(1, D, seed, noise=noise)
    lengths = np.array([200, 37, 63])
    X, _ = p.sample(300, random_state=seed)
    est = smf_e_step(p, X, lengths=lengths, max_sweeps=1)
    ll, theta, xi = exact.smoothed_marginals(p, X, lengths=lengths, pairwise=True)
    assert est.bound == pytest.approx(ll, rel=1e-10)
    np.testing.assert_allclose(est.theta, theta, rtol=0, atol=1e-10)
    np.testing.assert_allclose(est.xi, xi.sum(axis=0), rtol=1e-9, atol=1e-9)


def test_deterministic_start_state():
    """π exactly 0 or 1 with potentials strong enough to underflow the other state."""
    seed = 60
    p = _model(2, 2, seed, noise=0.01)
    p = p.replace(startprob=np.array([0.0, 1.0]))
    X, S = p.sample(50, random_state=seed)
    theta, bound = smf_posterior(p, X)
    assert np.isfinite(theta).all() and np.isfinite(bound)
    assert theta[0, 0] == 0.0 and theta[0, 1] == 1.0
    assert bound <= exact.log_likelihood(p, X) + 1e-9
    # at this noise level the posterior is the true state sequence
    np.testing.assert_allclose(theta, S, atol=1e-6)
    p1 = _model(1, 2, seed, noise=0.01).replace(startprob=np.array([0.0]))
    X1, _ = p1.sample(40, random_state=seed)
    X1[0] += p1.W[0]  # data insisting on the impossible state at t = 1
    theta1, bound1 = smf_posterior(p1, X1)
    ll1, ex1 = exact.smoothed_marginals(p1, X1)
    assert theta1[0, 0] == 0.0
    assert bound1 == pytest.approx(ll1, rel=1e-10)
    np.testing.assert_allclose(theta1, ex1, atol=1e-10)


@pytest.mark.parametrize("a,b,noise", [(1e-90, 1e-12, 0.01), (1e-12, 1e-99, 0.05),
                                       (0.5, 0.5, 0.001)])
def test_extreme_parameters_single_chain(a, b, noise):
    """Near-deterministic transitions and data that contradict them, with potentials of
    several thousand nats: the rescaled recursions still agree with exact inference."""
    seed = 65
    print(f"seed={seed} a={a} b={b} noise={noise}")
    rng = np.random.default_rng(seed)
    W = np.array([[1.0, -1.0], [0.3, 0.2]])
    A = np.array([[[1 - a, a], [b, 1 - b]]])
    p = FHMMParams.from_natural(W, noise**2 * np.eye(2), A, startprob=[0.3])
    S = (np.arange(400) // 37) % 2  # switches far more often than the prior allows
    X = S[:, None] * W[0] + W[1] + noise * rng.standard_normal((400, 2))
    lengths = [150, 250]
    est = smf_e_step(p, X, lengths=lengths, max_sweeps=1)
    ll, theta = exact.smoothed_marginals(p, X, lengths=lengths)
    assert np.isfinite(est.theta).all()
    assert est.bound == pytest.approx(ll, rel=1e-10)
    np.testing.assert_allclose(est.theta, theta, rtol=0, atol=1e-9)


@pytest.mark.parametrize("pi0,gain", [(0.0, 712.0), (0.0, 730.0), (1e-310, 730.0),
                                      (1e-320, 740.0)])
def test_start_mass_zero_or_subnormal_and_potential_in_the_subnormal_range(pi0, gain):
    """π_0 = 0 or subnormal, and data favouring chain 0 on at t = 1 by 708 < g < 745 nats:
    the other state's factor exp(-g) is subnormal, not 0, so the forward step's mass was a
    subnormal number and its rescaling 1/sm overflowed (NaN everywhere). Against the
    brute-force sweeps and bound."""
    seed = 67
    print(f"seed={seed} pi0={pi0} gain={gain}")
    rng = np.random.default_rng(seed)
    # w_0 ⟂ w_1 in the metric P = Σ⁻¹: chain 0's potential does not depend on θ^1
    W = np.array([[1.0, 0.0], [0.0, 0.7], [0.2, -0.1]])
    p = FHMMParams(W=W, L=0.1 * np.eye(2), alpha=np.array([-1.0, -2.0]),
                   beta=np.array([-2.0, -1.5]), startprob=np.array([pi0, 0.4]))
    X, _ = p.sample(4, random_state=seed)
    X[0, 0] = W[2, 0] + (gain + 50.0) / 100.0  # g_1^0 = 100 (y - w_0) - 50 = gain
    theta0 = rng.uniform(size=(4, 2))
    est = smf_e_step(p, X, theta_init=theta0, tol=0.0, max_sweeps=2)
    ref_theta, potentials, ref_xi, ref_log_Z, ref_entropy = naive.smf_sweeps(p, X, theta0, 2)
    assert potentials[0][0] == pytest.approx(gain, abs=1e-9)
    np.testing.assert_allclose(est.theta, ref_theta, rtol=0, atol=1e-10)
    np.testing.assert_allclose(est.xi, ref_xi, rtol=0, atol=1e-10)
    np.testing.assert_allclose(est.log_Z, ref_log_Z, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(est.entropy, ref_entropy, rtol=1e-9, atol=1e-10)
    assert est.bound == pytest.approx(naive.smf_bound_bruteforce(p, X, potentials), rel=1e-10)
    ll = naive.log_likelihood_bruteforce(p, X)
    assert est.bound <= ll + 1e-10 * abs(ll)


@pytest.mark.parametrize("alpha,beta,pi1,g", [
    (-40.0, -800.0, 1e-320, [658.0, 718.7, -702.0, -743.4, 661.3, 698.1]),
    (-800.0, -800.0, 0.5, [-728.5, 695.2, 748.0, -677.5, 688.5, 657.1]),
    (-40.0, -800.0, 0.5, [678.9, 703.0, 701.2, 755.2, -683.3, -683.7]),
    (1.5, -800.0, 0.0, [-654.0, -715.4, 714.4, -674.6, -720.2, -735.3]),
    (-800.0, -800.0, 0.5, [711.5, -684.3, -712.6, -742.1]),
])
def test_kernel_transition_probability_exactly_zero(alpha, beta, pi1, g):
    """The kernel (below the Python layer's 1e-100 limit) with logits past ±745, where
    σ(∓α) is exactly 0.0 in float64, and potentials of 650-760 nats: the subnormal
    exp(-|g|) window, excluded states with huge potentials, backward messages that grew
    or whose pair normaliser was subnormal gave NaN/inf. One chain (SMF is then exact),
    against enumeration of its 2^T paths under the same float64 transition matrix."""
    print(f"alpha={alpha} beta={beta} pi1={pi1} g={g}")
    g = np.array(g)
    T = g.shape[0]
    log_A = np.array([[[-np.logaddexp(0.0, alpha), -np.logaddexp(0.0, -alpha)],
                       [-np.logaddexp(0.0, -beta), -np.logaddexp(0.0, beta)]]])
    with np.errstate(divide="ignore"):
        log_start = np.log(np.array([[1.0 - pi1, pi1]]))
        log_A_float = np.log(np.exp(log_A[0]))  # the zeros the recursions multiply by
    assert (log_A_float == -np.inf).any()
    # whitened unit chain row, θ = ½: the potential g_t = ũᵀ(ỹ_t - θ_t ũ) + (θ_t - ½)‖ũ‖² = g
    ytil = (g + 0.5)[:, None]
    theta = np.full((T, 1), 0.5)
    xi, log_Z, theta_g, entropy = np.zeros((1, 2, 2)), np.zeros(1), np.zeros(1), np.zeros(1)
    trace = np.zeros(2)
    _ksmf.smf_e_step(ytil, np.ones((1, 1)), log_A, log_start, np.array([0, T]), theta, 0.0, 1,
                     0.0, np.full(1, np.nan), xi, log_Z, theta_g, entropy, trace)
    with np.errstate(divide="ignore"):
        ref_theta, ref_xi, ref_log_Z, ref_entropy = naive.chain_posterior(log_start[0],
                                                                          log_A_float, g)
    np.testing.assert_allclose(theta[:, 0], ref_theta, rtol=0, atol=1e-10)
    np.testing.assert_allclose(xi[0], ref_xi, rtol=0, atol=1e-10)
    # a factor exp(-|g|) in the subnormal range (|g| > 708.4) keeps only some of its digits
    assert log_Z[0] == pytest.approx(ref_log_Z, rel=1e-10)
    assert theta_g[0] == pytest.approx(float(ref_theta @ g), rel=1e-12, abs=1e-9)


# ----------------------------------------------------------------------------------------
# multiple sequences
# ----------------------------------------------------------------------------------------
def test_sequences_are_independent():
    seed = 70
    p = _model(3, 2, seed)
    parts = [p.sample(n, random_state=seed + i)[0] for i, n in enumerate((80, 1, 45, 120))]
    rng = np.random.default_rng(seed)
    inits = [rng.uniform(size=(len(x), 3)) for x in parts]
    X = np.vstack(parts)
    lengths = [len(x) for x in parts]
    theta, bound = smf_posterior(p, X, lengths=lengths, tol=0.0, max_sweeps=7,
                                 theta_init=np.vstack(inits))
    sep = [smf_posterior(p, x, tol=0.0, max_sweeps=7, theta_init=t0) for x, t0 in zip(parts, inits)]
    assert bound == pytest.approx(sum(b for _, b in sep), rel=1e-12)
    np.testing.assert_allclose(theta, np.vstack([t for t, _ in sep]), rtol=0, atol=1e-12)
    # without lengths the concatenation is one sequence: a different (smaller) answer
    _, joined = smf_posterior(p, X, tol=0.0, max_sweeps=7, theta_init=np.vstack(inits))
    assert joined != pytest.approx(bound, rel=1e-6)


# ----------------------------------------------------------------------------------------
# M-step
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("M,D,seed", [(1, 1, 80), (3, 4, 81), (6, 2, 82)])
def test_m_step_is_least_squares(M, D, seed):
    p = _model(M, D, seed)
    rng = np.random.default_rng(seed)
    lengths = np.array([40, 25, 35])
    X = rng.standard_normal((100, D)) @ rng.standard_normal((D, D)) + 3.0
    theta = rng.uniform(size=(100, M))
    xi = rng.uniform(0.1, 5.0, size=(M, 2, 2))
    new = smf_m_step(p, X, theta, xi, lengths=lengths)
    W_ref, S_ref = naive.m_step_lstsq(X, theta)
    np.testing.assert_allclose(new.W, W_ref, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(new.covariance, S_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(new.transmat, xi / xi.sum(axis=2, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(new.startprob, theta[[0, 40, 65]].mean(axis=0), rtol=1e-12)


def test_m_step_guards():
    """A chain never on keeps its W row and transition row; Σ stays positive definite."""
    seed = 90
    p = _model(3, 2, seed)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((60, 2))
    theta = rng.uniform(size=(60, 3))
    theta[:, 1] = 0.0
    xi = rng.uniform(0.1, 5.0, size=(3, 2, 2))
    xi[1, 1, :] = 0.0
    new = smf_m_step(p, X, theta, xi)
    np.testing.assert_allclose(new.W[1], p.W[1], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(new.transmat[1, 1], p.transmat[1, 1], rtol=1e-12)
    # the other rows are the least-squares solution without the dead chain
    W_ref, _ = naive.m_step_lstsq(X, theta[:, [0, 2]])
    np.testing.assert_allclose(new.W[[0, 2, 3]], W_ref, rtol=1e-9, atol=1e-10)
    # Σ floored when the data are fitted exactly
    theta2 = np.round(rng.uniform(size=(60, 1)))
    X2 = theta2 @ np.array([[1.0, -2.0]]) + 0.5
    new2 = smf_m_step(_model(1, 2, seed), X2, theta2, np.ones((1, 2, 2)), covariance_floor=1e-6)
    np.testing.assert_allclose(np.linalg.eigvalsh(new2.covariance), 1e-6, rtol=1e-6)
    np.testing.assert_allclose(new2.W, [[1.0, -2.0], [0.5, 0.5]], atol=1e-12)


# ----------------------------------------------------------------------------------------
# fitting
# ----------------------------------------------------------------------------------------
def test_fit_recovers_easy_model():
    seed = 100
    truth = _model(2, 3, seed, noise=0.15, switch=(0.05, 0.1))
    X, _ = truth.sample(1500, random_state=seed)
    params, history = fit_smf(X, n_chains=2, max_iter=100, random_state=seed, progress=False)
    ll_fit = exact.log_likelihood(params, X)
    ll_true = exact.log_likelihood(truth, X)
    print(f"loglik fit={ll_fit:.3f} true={ll_true:.3f} iterations={len(history) - 1}")
    assert ll_fit >= ll_true - 1e-3 * len(X)
    # the chains' steps, up to order and the on/off relabelling s -> 1-s (which negates w_m)
    err = min(np.abs(np.abs(params.W[list(order)]) - np.abs(truth.W[:2])).max()
              for order in ((0, 1), (1, 0)))
    assert err < 0.05
    assert set(history[0]) >= {"iteration", "bound", "time"}


def test_fit_stopping_rules():
    seed = 110
    truth = _model(2, 2, seed)
    X, _ = truth.sample(300, random_state=seed)
    params, history = fit_smf(X, n_chains=2, max_iter=3, tol=0.0, random_state=seed, progress=False)
    assert len(history) == 4
    _, history0 = fit_smf(X, n_chains=2, time_budget=0.0, random_state=seed, progress=False)
    assert len(history0) == 1
    times = [h["time"] for h in history]
    assert times == sorted(times)
    # the same seed gives the same fit
    params2, history2 = fit_smf(X, n_chains=2, max_iter=3, tol=0.0, random_state=seed,
                                progress=False)
    np.testing.assert_array_equal(params.W, params2.W)
    assert [h["bound"] for h in history] == [h["bound"] for h in history2]
    # a starting model is used as given, and convergence stops early
    params3, history3 = fit_smf(X, params=truth, max_iter=500, tol=1e-4, random_state=seed,
                                progress=False)
    assert len(history3) < 500
    assert history3[-1]["bound"] - history3[-2]["bound"] < 1e-4 * len(X)   # (nats per sample)
    assert history3[-2]["bound"] - history3[-3]["bound"] >= 1e-4 * len(X)
    with pytest.raises(ValueError, match=r"floor must be 2 positive finite variances"):
        fit_smf(X, n_chains=2, floor=[1e-9, 0.0], progress=False)
    # a floor given holds Σ up: X's own (1e-9 of each variance) does not bind here
    floored, _ = fit_smf(X, params=truth, max_iter=3, floor=[0.5, 0.5], progress=False)
    assert np.linalg.eigvalsh(floored.covariance).min() >= 0.5 * (1 - 1e-9)


def test_init_params_shapes_and_scale():
    seed = 120
    truth = _model(3, 4, seed, noise=0.1)
    X, _ = truth.sample(800, random_state=seed)
    p = init_params(X, 3, random_state=seed)
    assert p.W.shape == (4, 4)
    np.testing.assert_allclose(p.covariance, 0.5 * np.cov(X, rowvar=False), rtol=1e-4)
    np.testing.assert_allclose(p.transmat[:, 0, 1], 0.1)
    assert np.isfinite(p.W).all()
    # each step is oriented so that its standardised coordinates sum to >= 0 (the
    # docstring's rule), and the data's mean is a mean the chains can reach
    assert ((p.W[:3] / X.std(axis=0)).sum(axis=1) >= 0).all()
    lo = p.W[3] + np.minimum(p.W[:3], 0).sum(axis=0)
    hi = p.W[3] + np.maximum(p.W[:3], 0).sum(axis=0)
    assert (lo < X.mean(axis=0)).all() and (X.mean(axis=0) < hi).all()
    # constant data and a single row do not break it
    assert np.isfinite(init_params(np.ones((10, 2)), 2, random_state=0).W).all()
    assert np.isfinite(init_params(np.ones((1, 2)), 1, random_state=0).W).all()


# ----------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------
def test_validation_names_the_argument():
    p = _model(2, 3, 130)
    X, _ = p.sample(20, random_state=0)
    with pytest.raises(ValueError, match="X must have 3 features"):
        smf_posterior(p, X[:, :2])
    with pytest.raises(ValueError, match="params"):
        smf_posterior("model", X)
    with pytest.raises(ValueError, match="lengths"):
        smf_posterior(p, X, lengths=[10, 5])
    with pytest.raises(ValueError, match="theta_init"):
        smf_posterior(p, X, theta_init=np.full((20, 2), 1.5))
    with pytest.raises(ValueError, match="theta_init"):
        smf_posterior(p, X, theta_init=np.full((20, 3), 0.5))
    with pytest.raises(ValueError, match="tol"):
        smf_posterior(p, X, tol=-1.0)
    with pytest.raises(ValueError, match="max_sweeps"):
        smf_posterior(p, X, max_sweeps=0)
    # its bound trace is allocated up front: MemoryError before
    with pytest.raises(ValueError, match="max_sweeps must be at most 100,000"):
        smf_posterior(p, X, max_sweeps=10**15)
    with pytest.raises(ValueError, match="max_sweeps must be at most"):
        fit_smf(X, n_chains=2, max_sweeps=10**15, progress=False)
    # a fit's statistics square the data: "W must be finite" after overflow warnings before
    with pytest.raises(ValueError, match=r"X must hold values within .* row 3, column 1"):
        fit_smf(np.where(np.arange(20)[:, None] * [0, 1, 0] == 3, 1e200, X), n_chains=2,
                progress=False)
    with pytest.raises(ValueError, match="X must not contain NaN"):
        smf_posterior(p, np.where(X > 0, np.nan, X))
    with pytest.raises(ValueError, match="n_chains"):
        fit_smf(X)
    with pytest.raises(ValueError, match="n_chains"):
        fit_smf(X, params=p, n_chains=3)
    with pytest.raises(ValueError, match="time_budget"):
        fit_smf(X, n_chains=2, time_budget=-1, progress=False)
    with pytest.raises(ValueError, match="xi"):
        smf_m_step(p, X, np.full((20, 2), 0.5), np.ones((2, 2)))
    with pytest.raises(ValueError, match="previous"):
        smf_e_step(p, X, previous=object())
    with pytest.raises(ValueError, match="transition probability"):
        smf_posterior(p.replace(alpha=np.array([-300.0, 0.0])), X)
    assert isinstance(smf_e_step(p, X), SMFEStep)


# ----------------------------------------------------------------------------------------
# covariance families ("diag", "spherical")
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
@pytest.mark.parametrize("M,D,seed", [(2, 3, 140), (3, 1, 141), (4, 5, 142)])
def test_constrained_m_step_is_the_closed_form(covariance_type, M, D, seed):
    from . import naive_covariance as naive_cov
    p = _model(M, D, seed)
    print(f"covariance_type={covariance_type}")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((120, D)) @ rng.standard_normal((D, D)) + 1.0
    theta = rng.uniform(size=(120, M))
    xi = rng.uniform(0.1, 5.0, size=(M, 2, 2))
    new = smf_m_step(p, X, theta, xi, covariance_type=covariance_type)
    full = smf_m_step(p, X, theta, xi)
    # W does not depend on the family
    np.testing.assert_allclose(new.W, full.W, rtol=1e-12, atol=1e-13)
    S_ref = naive_cov.smf_sigma_m_step(X, theta, new.W, covariance_type)
    np.testing.assert_allclose(new.covariance, S_ref, rtol=1e-9, atol=1e-12)
    if covariance_type != "full":
        L = new.L
        assert (L[~np.eye(D, dtype=bool)] == 0.0).all()
        if covariance_type == "spherical":
            assert (np.diag(L) == L[0, 0]).all()


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_constrained_m_step_maximises_over_the_family(covariance_type):
    """No other member of the family (random perturbations of the M-step's Σ) has a
    larger expected complete log-likelihood."""
    seed = 150
    p = _model(3, 3, seed, noise=0.5)
    X, _ = p.sample(300, random_state=seed)
    est = smf_e_step(p, X)
    new = smf_m_step(p, X, est.theta, est.xi, covariance_type=covariance_type)
    best = expected_complete_loglik(new, X, est.theta, est.xi)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        if covariance_type == "diag":
            factor = np.exp(0.05 * rng.standard_normal(3))
        else:
            factor = np.full(3, np.exp(0.05 * rng.standard_normal()))
        other = new.replace(L=new.L * np.sqrt(factor)[:, None])
        assert expected_complete_loglik(other, X, est.theta, est.xi) < best


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
@pytest.mark.parametrize("M,D,noise,seed", [(2, 3, 0.3, 160), (4, 4, 1.0, 161)])
def test_constrained_em_never_decreases(covariance_type, M, D, noise, seed):
    """Every chain update and every constrained M-step, from a full random start."""
    truth = _model(M, D, seed, noise=noise)
    print(f"covariance_type={covariance_type}")
    lengths = np.array([150, 90])
    X, _ = truth.sample(int(lengths.sum()), random_state=seed)
    rng = np.random.default_rng(seed)
    params = smf_m_step(_model(M, D, seed + 1000, noise=1.0), X, rng.uniform(size=(len(X), M)),
                        rng.uniform(0.1, 5.0, size=(M, 2, 2)), lengths=lengths,
                        covariance_type=covariance_type)
    est = smf_e_step(params, X, lengths=lengths, theta_init=rng.uniform(size=(len(X), M)),
                     tol=0.0, max_sweeps=3)
    path = list(est.trace[M:])
    for _ in range(8):
        new = smf_m_step(params, X, est.theta, est.xi, lengths=lengths,
                         covariance_type=covariance_type)
        nxt = smf_e_step(new, X, lengths=lengths, previous=est, tol=0.0, max_sweeps=2)
        path.extend(nxt.trace)
        params, est = new, nxt
    _assert_nondecreasing(path, path[-1])
    assert path[-1] > path[0]
    assert path[-1] <= exact.log_likelihood(params, X, lengths=lengths)
    # and fit_smf's history, which projects a full start first
    fitted, history = fit_smf(X, lengths=lengths, params=truth, max_iter=10, tol=0.0,
                              random_state=seed, progress=False, covariance_type=covariance_type)
    bounds = [h["bound"] for h in history]
    _assert_nondecreasing(bounds, bounds[-1])
    off = fitted.L[~np.eye(D, dtype=bool)]
    assert (off == 0.0).all()
    if covariance_type == "spherical":
        assert (np.diag(fitted.L) == fitted.L[0, 0]).all()


def test_init_params_covariance_type():
    seed = 170
    truth = _model(2, 3, seed, noise=0.3)
    X, _ = truth.sample(500, random_state=seed)
    full = init_params(X, 2, random_state=seed)
    diag = init_params(X, 2, random_state=seed, covariance_type="diag")
    sph = init_params(X, 2, random_state=seed, covariance_type="spherical")
    np.testing.assert_array_equal(diag.W, full.W)
    np.testing.assert_allclose(diag.covariance, np.diag(np.diag(full.covariance)), rtol=1e-12)
    np.testing.assert_allclose(sph.covariance, np.trace(full.covariance) / 3 * np.eye(3),
                               rtol=1e-12)
    assert (sph.L == sph.L[0, 0] * np.eye(3)).all()
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        init_params(X, 2, covariance_type="tied")
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        fit_smf(X, n_chains=2, covariance_type="Diag", progress=False)


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_fit_does_not_depend_on_the_features_units(covariance_type):
    """Features in very different units (variances 1e-6 and 1e6 of the data's): the
    fit is the rescaled fit of the data. The floor on Σ (and the start's ridge) was
    1e-9 (1e-6) times the *mean* variance, 5e-4, which floored the small feature's
    noise variance (1e-7) at 2.8e-4: log-likelihood -4.33 per step against -1.01."""
    seed = 11
    W = np.array([[1.0, -1.0], [1.5, 1.0], [0.0, 0.0]])
    A = np.array([[0.05, 0.10], [0.10, 0.05]])  # switch-on, switch-off per chain
    p = FHMMParams(W=W, L=np.sqrt(0.1) * np.eye(2), alpha=np.log(A[:, 0] / (1 - A[:, 0])),
                   beta=np.log(A[:, 1] / (1 - A[:, 1])), startprob=np.full(2, 0.5))
    X, _ = p.sample(1000, random_state=seed)
    print(f"seed={seed}")
    # (units whose product is not 1: those shift the bound by T·Σ log u, and the stopping
    # rule, relative to the bound's magnitude, stopped after 11 iterations at one unit,
    # 8 at 1000: the tests' units 1e-3, 1e3 cancelled)
    unit = np.array([1e-3, 1e5])
    ref, h_ref = fit_smf(X, n_chains=2, max_iter=50, random_state=seed, progress=False,
                         covariance_type=covariance_type)
    got, h_got = fit_smf(X * unit + 7 * unit, n_chains=2, max_iter=50, random_state=seed,
                         progress=False, covariance_type=covariance_type)
    assert len(h_got) == len(h_ref) < 51
    got = got.replace(W=np.vstack([got.W[:-1], got.W[-1] - 7 * unit]))
    np.testing.assert_allclose(got.W / unit, ref.W, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got.covariance / np.outer(unit, unit), ref.covariance, rtol=1e-6)
    np.testing.assert_allclose(got.transmat, ref.transmat, rtol=1e-6, atol=1e-10)
    assert np.diag(ref.covariance) == pytest.approx([0.1, 0.1], rel=0.2)
    ll = exact.log_likelihood(got, X * unit) + len(X) * np.log(unit).sum()
    assert ll == pytest.approx(exact.log_likelihood(ref, X), rel=1e-8)
    start = init_params(X * unit, 2, random_state=seed, covariance_type=covariance_type)
    np.testing.assert_allclose(start.covariance / np.outer(unit, unit),
                               init_params(X, 2, random_state=seed,
                                           covariance_type=covariance_type).covariance, rtol=1e-9)


def test_default_floor_is_per_feature():
    """The default floor binds in each feature's units: exactly fitted data in units
    1e-4 and 1e4 get Σ with diag(f)^-½ Σ diag(f)^-½ ⪰ I, f = 1e-9 · var(X_d); a
    scalar covariance_floor floors the eigenvalues of Σ themselves."""
    seed = 91
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    theta = np.round(rng.uniform(size=(60, 1)))
    X = (theta @ np.array([[1.0, -2.0]]) + 0.5) * [1e-4, 1e4]
    p = _model(1, 2, seed)
    new = smf_m_step(p, X, theta, np.ones((1, 2, 2)))
    f = 1e-9 * X.var(axis=0)
    np.testing.assert_allclose(np.linalg.eigvalsh(new.covariance / np.sqrt(np.outer(f, f))), 1.0,
                               rtol=1e-6)
    diag = smf_m_step(p, X, theta, np.ones((1, 2, 2)), covariance_type="diag")
    np.testing.assert_allclose(np.diag(diag.covariance), f, rtol=1e-9)
    sph = smf_m_step(p, X, theta, np.ones((1, 2, 2)), covariance_type="spherical")
    np.testing.assert_allclose(np.diag(sph.covariance), f.mean(), rtol=1e-9)
    noisy = X + rng.standard_normal(X.shape) * [1e-5, 1e3]
    zero = smf_m_step(p, noisy, theta, np.ones((1, 2, 2)), covariance_floor=0.0)
    default = smf_m_step(p, noisy, theta, np.ones((1, 2, 2)))
    np.testing.assert_allclose(zero.covariance, default.covariance, rtol=1e-12)
    scalar = smf_m_step(p, X, theta, np.ones((1, 2, 2)), covariance_floor=1e-3)
    np.testing.assert_allclose(np.linalg.eigvalsh(scalar.covariance), 1e-3, rtol=1e-6)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def test_infinite_tol_refused():
    """SMF's non-negative float checks refuse infinity."""
    seed = 0
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed).sample(100, random_state=1)
    with pytest.raises(ValueError, match="tol must be a finite non-negative number"):
        fit_smf(X, n_chains=2, max_iter=2, tol=np.inf, progress=False)


def test_max_sweeps_at_the_limit():
    """``max_sweeps`` may be MAX_SWEEPS itself."""
    seed = 0
    print(f"seed={seed}")
    p = FHMMParams.random(1, 2, random_state=seed)
    X, _ = p.sample(20, random_state=1)
    est = smf_e_step(p, X, max_sweeps=MAX_SWEEPS)
    assert est.converged


def _small_e_step(seed=0):
    """A 2-chain model, 50 of its samples and their SMF E-step."""
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed)
    X, _ = p.sample(50, random_state=1)
    return p, X, smf_e_step(p, X)


def test_negative_xi_refused():
    """``smf_m_step`` refuses negative expected transition counts."""
    p, X, est = _small_e_step()
    xi = est.xi.copy()
    xi[0, 0, 1] = -1.0
    with pytest.raises(ValueError, match="xi"):
        smf_m_step(p, X, est.theta, xi)


def test_near_constant_feature_gets_the_mean_floor():
    """A feature whose variance is below 1e-24 of the mean variance is floored as a
    constant feature (COVARIANCE_FLOOR times the mean variance), not at its own variance."""
    seed = 0
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.standard_normal(200), 1.0 + 1e-14 * rng.standard_normal(200)])
    q, _ = fit_smf(X, n_chains=1, max_iter=3, random_state=seed, progress=False,
                   covariance_type="diag")
    floor = COVARIANCE_FLOOR * X.var(axis=0).mean()
    assert q.covariance[1, 1] >= floor * (1 - 1e-6)


def test_both_refused():
    """``smf_e_step`` refuses theta_init together with previous."""
    p, X, est = _small_e_step()
    with pytest.raises(ValueError, match="cannot both be given"):
        smf_e_step(p, X, theta_init=est.theta, previous=est)


def test_not_converged_after_one_sweep_with_zero_tol():
    """SMFEStep.converged is False when the sweeps ran out before θ settled."""
    seed = 0
    print(f"seed={seed}")
    p = FHMMParams.random(3, 2, random_state=seed)
    X, _ = p.sample(100, random_state=1)
    est = smf_e_step(p, X, tol=0.0, max_sweeps=1)
    assert est.max_delta > 0
    assert not est.converged


def test_steps_are_oriented():
    """``init_params`` orients each chain's step so its standardised coordinates sum >= 0."""
    for seed in range(5):
        print(f"seed={seed}")
        X, _ = FHMMParams.random(3, 3, random_state=seed).sample(400, random_state=seed + 1)
        std = X.std(axis=0, ddof=1)
        W = init_params(X, 3, random_state=seed).W
        assert ((W[:-1] / std).sum(axis=1) >= -1e-12).all()


@pytest.mark.parametrize("progress", [False, True])
def test_no_progress_bar_without_progress(tqdm_calls, progress):
    """fit(progress=False) builds no tqdm at all: ``tqdm(disable=True)`` still starts
    tqdm's monitor thread, which then runs for the life of the process. With progress
    the bar is built (and the fit is the same)."""
    import streamfhmm.learn.smf as smf_module

    built = tqdm_calls(smf_module)
    seed = 7
    print(f"seed={seed}")
    X, _ = _model(2, 2, seed).sample(300, random_state=seed)
    params, history = fit_smf(X, n_chains=2, max_iter=3, random_state=seed, progress=progress)
    assert len(built) == int(progress)
    ref, ref_history = fit_smf(X, n_chains=2, max_iter=3, random_state=seed, progress=not progress)
    np.testing.assert_array_equal(params.W, ref.W)
    assert [h["bound"] for h in history] == [h["bound"] for h in ref_history]
