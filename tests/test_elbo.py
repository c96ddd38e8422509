"""Tests of streamfhmm.kernels.elbo (MATH.md §2, §4) against enumeration and finite
differences."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import optimize, special, stats

from streamfhmm import exact
from streamfhmm.kernels.elbo import elbo_batch, elbo_subchain, sigma_grad_to_chol
from streamfhmm.model import FHMMParams

from .naive_elbo import (bvn_cdf_naive, bvn_cdf_owens_t, copula_cells_naive, elbo_naive,
                         log_likelihood_naive, log_transitions, posterior_naive)

EPS = 1e-6  # EPS_THETA = EPS_RHO of the variational family


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def random_model(rng, M, D, noise=0.5):
    """W, L, alpha, beta, log_pi with a well-conditioned Σ."""
    W = rng.standard_normal((M + 1, D))
    L = np.tril(0.3 * rng.standard_normal((D, D)), -1)
    L[np.diag_indices(D)] = noise * np.exp(0.3 * rng.standard_normal(D))
    alpha = rng.normal(-1.0, 1.0, size=M)
    beta = rng.normal(-1.0, 1.0, size=M)
    pi1 = rng.uniform(0.1, 0.9, size=M)
    log_pi = np.log(np.stack([1.0 - pi1, pi1], axis=1))
    return W, L, alpha, beta, log_pi


def random_variational(rng, T, M, extreme=False):
    theta = rng.uniform(0.05, 0.95, size=(T, M))
    rho = rng.uniform(-0.95, 0.95, size=(T, M))
    if extreme:
        pick = rng.random((T, M))
        theta[pick < 0.2] = EPS
        theta[pick > 0.8] = 1.0 - EPS
        pick = rng.random((T, M))
        rho[pick < 0.2] = -(1.0 - EPS)
        rho[pick > 0.8] = 1.0 - EPS
    return theta, rho


def random_data(rng, T, W, L, missing=False):
    M = W.shape[0] - 1
    D = W.shape[1]
    S = rng.integers(0, 2, size=(T, M))
    Y = S @ W[:M] + W[M] + rng.standard_normal((T, D)) @ L.T
    if missing:
        mask = rng.random((T, D)) < 0.3
        if T > 2:
            mask[2] = True           # one row with nothing observed
        if T > 4 and D > 1:
            mask[3] = False
            mask[3, 0] = True        # two rows with the same pattern
            mask[4] = mask[3]
        Y[mask] = np.nan
    return Y


def run(Y, theta, rho, first, W, L, alpha, beta, log_pi, P=None):
    """Kernel value and fresh gradient arrays, the Cholesky gradient converted."""
    M, D = W.shape[0] - 1, W.shape[1]
    if P is None:
        P = np.linalg.inv(L @ L.T)
        P = 0.5 * (P + P.T)
    g = dict(theta=np.zeros_like(theta), rho=np.zeros_like(rho), W=np.zeros_like(W),
             Sigma=np.zeros((D, D)), alpha=np.zeros(M), beta=np.zeros(M), logpi=np.zeros((M, 2)))
    v = elbo_subchain(Y, theta, rho, first, W, L, P, log_transitions(alpha, beta), log_pi,
                      g["theta"], g["rho"], g["W"], g["Sigma"], g["alpha"], g["beta"], g["logpi"])
    g["chol"] = np.zeros((D, D))
    sigma_grad_to_chol(g["Sigma"], L, g["chol"])
    return v, g


def to_chol_params(L):
    """Lower off-diagonal entries of L and λ = log diag L, as one (D, D) lower array."""
    out = np.tril(L, -1)
    out[np.diag_indices(L.shape[0])] = np.log(np.diag(L))
    return out


def from_chol_params(C):
    L = np.tril(C, -1)
    L[np.diag_indices(C.shape[0])] = np.exp(np.diag(C))
    return L


def central_fd(f, x, h):
    """Central differences of scalar ``f`` wrt every entry of array ``x`` (restored)."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + h
        fp = f()
        x[idx] = old - h
        fm = f()
        x[idx] = old
        g[idx] = (fp - fm) / (2 * h)
    return g


def rel_err(g, ref):
    return np.max(np.abs(g - ref)) / max(np.max(np.abs(ref)), 1e-8)


# --------------------------------------------------------------------------------------
# the references themselves
# --------------------------------------------------------------------------------------
def test_naive_cells_are_consistent():
    """Quadrature Φ2 agrees with the Owen's-T formula; the cells have the right margins."""
    seed = 11
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    for _ in range(40):
        h, k = rng.normal(0.0, 2.0, size=2)
        rho = rng.uniform(-1.0, 1.0)
        if rng.random() < 0.3:
            rho = np.sign(rho) * (1.0 - 10.0 ** rng.uniform(-7, -2))
        assert abs(bvn_cdf_naive(h, k, rho) - bvn_cdf_owens_t(h, k, rho)) < 1e-14, (h, k, rho)
        tp, tc = rng.uniform(0.01, 0.99, size=2)
        q = copula_cells_naive(tp, tc, rho)
        assert abs(q.sum() - 1.0) < 1e-14
        assert abs(q[2] + q[3] - tp) < 1e-14 and abs(q[1] + q[3] - tc) < 1e-14


# --------------------------------------------------------------------------------------
# value against enumeration over all joint sequences
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("T,M,D,missing", [(1, 2, 2, False), (2, 1, 1, False), (3, 2, 2, False),
                                           (5, 1, 3, False), (4, 2, 2, False), (5, 2, 3, True),
                                           (4, 1, 2, True), (3, 3, 2, True), (2, 4, 2, False)])
def test_matches_enumeration(T, M, D, missing):
    seed = 1000 + 17 * T + 5 * M + D + int(missing)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    W, L, alpha, beta, log_pi = random_model(rng, M, D)
    theta, rho = random_variational(rng, T, M)
    Y = random_data(rng, T, W, L, missing)
    v, _ = run(Y, theta, rho, True, W, L, alpha, beta, log_pi)
    ref = elbo_naive(Y, theta, rho, W, L @ L.T, log_transitions(alpha, beta), log_pi)
    assert abs(v - ref) <= 1e-10 * max(1.0, abs(ref)), (v, ref)


def test_missing_patterns_in_a_row():
    """Consecutive rows whose observed sets repeat, shrink to a prefix, grow back, vanish:
    the per-pattern factorisation of Σ_oo must follow every change."""
    seed = 606
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    T, M, D = 6, 2, 3
    W, L, alpha, beta, log_pi = random_model(rng, M, D)
    theta, rho = random_variational(rng, T, M)
    Y = random_data(rng, T, W, L)
    observed = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0], [0, 1, 1]], bool)
    Y[~observed] = np.nan
    v, g = run(Y, theta, rho, True, W, L, alpha, beta, log_pi)
    ref = elbo_naive(Y, theta, rho, W, L @ L.T, log_transitions(alpha, beta), log_pi)
    assert abs(v - ref) <= 1e-10 * max(1.0, abs(ref)), (v, ref)
    C = to_chol_params(L)
    def f():
        return run(Y, theta, rho, True, W, from_chol_params(C), alpha, beta, log_pi)[0]

    for name, an, x in (("W", g["W"], W), ("chol", g["chol"], C), ("theta", g["theta"], theta)):
        fd = central_fd(f, x, 1e-5)
        fd = np.tril(fd) if name == "chol" else fd
        err = rel_err(an, fd)
        print(f"{name}: rel err {err:.2e}")
        assert err <= 1e-6, (name, err)


def test_telescoping_matches_enumeration():
    seed = 2024
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    T, M, D = 5, 2, 2
    W, L, alpha, beta, log_pi = random_model(rng, M, D)
    theta, rho = random_variational(rng, T, M)
    Y = random_data(rng, T, W, L, missing=True)
    ref = elbo_naive(Y, theta, rho, W, L @ L.T, log_transitions(alpha, beta), log_pi)
    # rows 0..2 (start), then 2..3 and 3..4 each with one context row
    total = run(Y[0:3], theta[0:3], rho[0:3], True, W, L, alpha, beta, log_pi)[0]
    total += run(Y[2:4], theta[2:4], rho[2:4], False, W, L, alpha, beta, log_pi)[0]
    total += run(Y[3:5], theta[3:5], rho[3:5], False, W, L, alpha, beta, log_pi)[0]
    assert abs(total - ref) <= 1e-10 * max(1.0, abs(ref)), (total, ref)


@pytest.mark.parametrize("missing", [False, True])
def test_telescoping_values_and_gradients(missing):
    seed = 77 + int(missing)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    T, M, D = 40, 3, 4
    W, L, alpha, beta, log_pi = random_model(rng, M, D)
    theta, rho = random_variational(rng, T, M)
    Y = random_data(rng, T, W, L, missing)
    v_full, g_full = run(Y, theta, rho, True, W, L, alpha, beta, log_pi)
    cuts = np.sort(rng.choice(np.arange(2, T - 1), size=5, replace=False))
    bounds = [0, *cuts, T]
    total = 0.0
    acc = {k: np.zeros_like(a) for k, a in g_full.items()}
    for i in range(len(bounds) - 1):
        lo = bounds[i] if i == 0 else bounds[i] - 1   # context row
        hi = bounds[i + 1]
        v, g = run(Y[lo:hi], theta[lo:hi], rho[lo:hi], i == 0, W, L, alpha, beta, log_pi)
        total += v
        for k in acc:
            if k in ("theta", "rho"):
                acc[k][lo:hi] += g[k]
            else:
                acc[k] += g[k]
    assert abs(total - v_full) <= 1e-12 * abs(v_full)
    for k in acc:
        np.testing.assert_allclose(acc[k], g_full[k], rtol=1e-11, atol=1e-11, err_msg=k)


def test_batch_equals_subchains_and_accumulates():
    seed = 31337
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    M, D, B = 3, 4, 6
    W, L, alpha, beta, log_pi = random_model(rng, M, D)
    P = np.linalg.inv(L @ L.T)
    log_A = log_transitions(alpha, beta)
    n_pos = rng.integers(1, 9, size=B).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(n_pos)[:-1]]).astype(np.int64)
    flags = rng.random(B) < 0.4
    N = int(n_pos.sum())
    theta, rho = random_variational(rng, N, M)
    Y = random_data(rng, N, W, L, missing=True)

    def zeros(n=N):
        return [np.zeros((n, M)), np.zeros((n, M)), np.zeros_like(W), np.zeros((D, D)),
                np.zeros(M), np.zeros(M), np.zeros((M, 2))]

    gb = zeros()
    vb = elbo_batch(Y, starts, n_pos, flags, theta, rho, W, L, P, log_A, log_pi, *gb)
    gs = zeros()
    vs = 0.0
    for b in range(B):
        sl = slice(starts[b], starts[b] + n_pos[b])
        part = zeros(int(n_pos[b]))
        vs += elbo_subchain(Y[sl], theta[sl], rho[sl], bool(flags[b]), W, L, P, log_A, log_pi,
                            *part)
        gs[0][sl] += part[0]
        gs[1][sl] += part[1]
        for k in range(2, 7):
            gs[k] += part[k]
    assert abs(vb - vs) <= 1e-12 * max(1.0, abs(vs))
    for a, b in zip(gb, gs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # outputs are accumulated: a second call doubles them
    gb2 = [a.copy() for a in gb]
    elbo_batch(Y, starts, n_pos, flags, theta, rho, W, L, P, log_A, log_pi, *gb2)
    for a, b in zip(gb2, gb):
        np.testing.assert_allclose(a, 2 * b, rtol=1e-13, atol=1e-13)


def test_short_subchains():
    seed = 5
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    W, L, alpha, beta, log_pi = random_model(rng, 2, 2)
    theta, rho = random_variational(rng, 1, 2)
    Y = random_data(rng, 1, W, L)
    v, g = run(Y, theta, rho, False, W, L, alpha, beta, log_pi)   # a lone context row
    assert v == 0.0 and all(not np.any(a) for a in g.values())
    v, g = run(Y, theta, rho, True, W, L, alpha, beta, log_pi)
    ref = elbo_naive(Y, theta, rho, W, L @ L.T, log_transitions(alpha, beta), log_pi)
    assert abs(v - ref) <= 1e-12 * max(1, abs(ref))
    assert not np.any(g["rho"])


# --------------------------------------------------------------------------------------
# gradients against central finite differences
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("M", [2, 3])
@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("first", [True, False])
def test_gradients_finite_differences(missing, first, M):
    seed = 4242 + 2 * int(missing) + int(first) + 10 * (M - 2)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    T, D = 7, 3
    W, L, alpha, beta, log_pi = random_model(rng, M, D)
    theta, rho = random_variational(rng, T, M)
    Y = random_data(rng, T, W, L, missing)
    C = to_chol_params(L)
    v0, g = run(Y, theta, rho, first, W, L, alpha, beta, log_pi)

    def f():
        return run(Y, theta, rho, first, W, from_chol_params(C), alpha, beta, log_pi)[0]

    h = 1e-5
    checks = {
        "theta": (g["theta"], central_fd(f, theta, h)),
        "rho": (g["rho"], central_fd(f, rho, h)),
        "W": (g["W"], central_fd(f, W, h)),
        "chol": (g["chol"], np.tril(central_fd(f, C, h))),
        "alpha": (g["alpha"], central_fd(f, alpha, h)),
        "beta": (g["beta"], central_fd(f, beta, h)),
        "logpi": (g["logpi"], central_fd(f, log_pi, h)),
    }
    for name, (an, fd) in checks.items():
        err = rel_err(an, fd)
        print(f"{name}: rel err {err:.2e}")
        assert err <= 1e-6, (name, err, an, fd)
    assert not np.any(g["rho"][0])
    if not first:
        assert not np.any(g["logpi"])


@pytest.mark.parametrize("eps", [1e-7, 1e-8, 1e-9])
def test_missing_values_with_an_ill_conditioned_covariance(eps):
    """A valid L whose Σ = L Lᵀ has eigenvalues ~1 and ~eps² (rows 1 and 2 of L parallel
    up to eps), dimension 0 missing: the formed Σ_oo = [[1, 1], [1, 1 + eps²]] is
    singular in float64 for eps ≤ 1e-8 and its Cholesky gave a NaN bound (and for
    eps = 1e-7 an error of 6e-3 through the formed Σ_oo and its explicit inverse). Against exact
    rational arithmetic from L, and θ-gradients against central differences of it."""
    seed = 83
    print(f"seed={seed} eps={eps}")
    rng = np.random.default_rng(seed)
    T, M, D = 4, 2, 3
    L = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.6, 0.8, eps]])
    W = rng.standard_normal((M + 1, D))
    W[:, 2] = W[:, 1]  # along Σ_oo's well-conditioned direction: a bound of order 1, not 1e16
    alpha, beta = np.array([-1.0, -2.0]), np.array([-1.5, -0.5])
    log_pi = np.log(np.array([[0.7, 0.3], [0.4, 0.6]]))
    theta, rho = random_variational(rng, T, M)
    S = rng.integers(0, 2, size=(T, M))
    Y = S @ W[:M] + W[M] + rng.standard_normal((T, D)) @ L.T
    Y[:, 0] = np.nan       # every row observes dimensions 1 and 2 (one cached pattern) ...
    Y[2] = np.nan          # ... but row 2, which observes nothing
    Linv = np.linalg.inv(L)
    P = Linv.T @ Linv
    log_A = log_transitions(alpha, beta)
    v, g = run(Y, theta, rho, True, W, L, alpha, beta, log_pi, P=P)
    ref = elbo_naive(Y, theta, rho, W, None, log_A, log_pi, L=L)
    print(f"kernel {v!r} exact {ref!r}")
    assert abs(v - ref) <= 1e-6
    assert all(np.isfinite(a).all() for a in g.values())
    # one position (ℓ_1 needs no copula cells): ∂/∂θ against differences of the reference
    y1, th1, rh1 = Y[:1].copy(), theta[:1].copy(), rho[:1].copy()
    v1, g1 = run(y1, th1, rh1, True, W, L, alpha, beta, log_pi, P=P)
    assert v1 == pytest.approx(elbo_naive(y1, th1, rh1, W, None, log_A, log_pi, L=L),
                               rel=0, abs=1e-7)
    fd = central_fd(lambda: elbo_naive(y1, th1, rh1, W, None, log_A, log_pi, L=L), th1, 1e-5)
    assert rel_err(g1["theta"], fd) <= 1e-6, (g1["theta"], fd)


def test_floor_keeps_value_and_gradients_finite():
    """Cells that underflow to 0 are floored: the value is finite and equals the true
    ELBO (0 log 0 = 0), the gradients are finite and match central differences."""
    seed = 99
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    T, M, D = 4, 1, 2
    W, L, alpha, beta, log_pi = random_model(rng, M, D)
    Y = random_data(rng, T, W, L)
    theta = np.array([[EPS], [EPS], [1.0 - EPS], [0.3]])
    rho = np.array([[0.0], [-(1.0 - EPS)], [-(1.0 - EPS)], [1.0 - EPS]])
    # the floor acts: q11(ε, ε, -(1-ε)) ≤ P(z1 + z2 > 2h) = Φ(-2h/√(2(1+ρ))) underflows
    h = stats.norm.isf(EPS)
    assert special.ndtr(-2.0 * h / np.sqrt(2.0 * EPS)) < 1e-300
    log_A = log_transitions(alpha, beta)
    v, g = run(Y, theta, rho, True, W, L, alpha, beta, log_pi)
    assert np.isfinite(v)
    assert all(np.isfinite(a).all() for a in g.values())
    ref = elbo_naive(Y, theta, rho, W, L @ L.T, log_A, log_pi)
    assert abs(v - ref) <= 1e-9 * max(1.0, abs(ref)), (v, ref)
    assert v <= log_likelihood_naive(Y, W, L @ L.T, log_A, log_pi)
    f = lambda: run(Y, theta, rho, True, W, L, alpha, beta, log_pi)[0]  # noqa: E731
    for name, x in (("W", W), ("alpha", alpha), ("beta", beta)):
        err = rel_err(g[name], central_fd(f, x, 1e-5))
        print(f"{name}: rel err {err:.2e}")
        assert err <= 1e-6, (name, err)
    # θ of the last row (0.3, away from its bounds)
    th = theta[3:4, :]
    err = rel_err(g["theta"][3:4], central_fd(f, th, 1e-6))
    assert err <= 1e-6, ("theta", err)


# --------------------------------------------------------------------------------------
# bounds
# --------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), T=st.integers(1, 4), M=st.integers(1, 2),
       D=st.integers(1, 2), extreme=st.booleans(), missing=st.booleans())
def test_elbo_below_loglik_and_matches_enumeration(seed, T, M, D, extreme, missing):
    print(f"seed={seed} T={T} M={M} D={D} extreme={extreme} missing={missing}")
    rng = np.random.default_rng(seed)
    W, L, alpha, beta, log_pi = random_model(rng, M, D, noise=rng.uniform(0.2, 2.0))
    alpha = rng.normal(0.0, 3.0, size=M)
    beta = rng.normal(0.0, 3.0, size=M)
    theta, rho = random_variational(rng, T, M, extreme)
    Y = random_data(rng, T, W, L, missing)
    log_A = log_transitions(alpha, beta)
    v, _ = run(Y, theta, rho, True, W, L, alpha, beta, log_pi)
    ll = log_likelihood_naive(Y, W, L @ L.T, log_A, log_pi)
    assert v <= ll + 1e-10 * max(1.0, abs(ll)), (v, ll)
    ref = elbo_naive(Y, theta, rho, W, L @ L.T, log_A, log_pi)
    assert abs(v - ref) <= 1e-9 * max(1.0, abs(ref)), (v, ref)


def _exact_copula(xi_t, theta_prev, theta_t):
    """ρ with q00(θ_prev, θ_t, ρ) = ξ(0, 0), by root finding on the naive cells."""
    h1, h2 = stats.norm.ppf(1.0 - theta_prev), stats.norm.ppf(1.0 - theta_t)
    f = lambda r: bvn_cdf_naive(h1, h2, r) - xi_t[0, 0]  # noqa: E731
    return optimize.brentq(f, -(1 - EPS), 1 - EPS, xtol=1e-15, rtol=1e-15, maxiter=200)


def test_exact_posterior_gives_loglik():
    """M = 1: the HMM posterior is a Markov chain, which the copula chain represents
    exactly, so the ELBO at (θ, ρ) = exact posterior is the log-likelihood."""
    seed = 8
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    T, M = 7, 1
    W = np.array([[1.0, -0.7], [0.2, 0.1]])
    L = np.array([[1.2, 0.0], [0.3, 1.0]])
    alpha = np.array([-0.6])
    beta = np.array([-0.9])
    log_pi = np.log(np.array([[0.6, 0.4]]))
    log_A = log_transitions(alpha, beta)
    Y = random_data(rng, T, W, L, missing=True)
    ll, theta, xi = posterior_naive(Y, W, L @ L.T, log_A, log_pi)
    assert theta.min() > 0.01 and theta.max() < 0.99
    rho = np.zeros((T, M))
    for t in range(1, T):
        rho[t, 0] = _exact_copula(xi[t, 0], theta[t - 1, 0], theta[t, 0])
    assert np.abs(rho).max() < 0.99
    v, _ = run(Y, theta, rho, True, W, L, alpha, beta, log_pi)
    print(f"elbo={v!r} loglik={ll!r}")
    assert abs(v - ll) <= 1e-6, (v, ll)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), T=st.integers(2, 40), M=st.integers(1, 4),
       D=st.integers(1, 4), extreme=st.booleans())
def test_elbo_below_exact_loglik(seed, T, M, D, extreme):
    """Larger models against the exact forward algorithm (no missing values there)."""
    print(f"seed={seed} T={T} M={M} D={D} extreme={extreme}")
    rng = np.random.default_rng(seed)
    params = FHMMParams.random(M, D, random_state=rng, noise=rng.uniform(0.2, 1.5))
    Y, _ = params.sample(T, random_state=rng)
    theta, rho = random_variational(rng, T, M, extreme)
    v, _ = run(Y, theta, rho, True, params.W, params.L, params.alpha, params.beta,
               params.log_startprob)
    ll = exact.log_likelihood(params, Y)
    assert v <= ll + 1e-10 * abs(ll), (v, ll)


def test_exact_posterior_long_sequence_in_subchains():
    """M = 1, T = 40 with the exact smoother: the ELBO at the exact posterior, summed
    over a batch of subchains, is the log-likelihood."""
    seed = 12
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    T = 40
    params = FHMMParams.from_natural(W=[[1.0, -0.5, 0.3], [0.0, 0.2, -0.1]],
                                     covariance=np.diag([1.5, 1.2, 2.0]),
                                     transmat=[[[0.7, 0.3], [0.25, 0.75]]])
    Y, _ = params.sample(T, random_state=rng)
    ll, theta, xi = exact.smoothed_marginals(params, Y, pairwise=True)
    assert EPS * 100 < theta.min() and theta.max() < 1 - EPS * 100
    rho = np.zeros_like(theta)
    for t in range(1, T):
        rho[t, 0] = _exact_copula(xi[t, 0], theta[t - 1, 0], theta[t, 0])
    assert np.abs(rho).max() < 1 - 1e-3
    # subchains 0..9 (start), 9..19, 19..29, 29..39 with a context row each
    starts = np.array([0, 9, 19, 29], dtype=np.int64)
    n_pos = np.array([10, 11, 11, 11], dtype=np.int64)
    flags = np.array([True, False, False, False])
    M, D = 1, 3
    g = [np.zeros((T, M)), np.zeros((T, M)), np.zeros((M + 1, D)), np.zeros((D, D)),
         np.zeros(M), np.zeros(M), np.zeros((M, 2))]
    P = np.linalg.inv(params.covariance)
    v = elbo_batch(Y, starts, n_pos, flags, theta, rho, params.W, params.L, P,
                   params.log_transmat, params.log_startprob, *g)
    print(f"elbo={v!r} loglik={ll!r}")
    assert abs(v - ll) <= 1e-6, (v, ll)
    # and it is a stationary point in θ and ρ (the bound touches log p(y) there)
    assert np.max(np.abs(g[0])) < 1e-4 and np.max(np.abs(g[1][1:])) < 1e-4


# ---- E10: gradients where copula cells are tiny but above the floor (1e-300 < q < 1e-12)
def _elbo_T2(theta, rho, W, L, log_A, log_pi, Y):
    M, D = theta.shape[1], W.shape[1]
    P = np.linalg.inv(L @ L.T)
    g = [np.zeros_like(theta), np.zeros_like(rho), np.zeros_like(W), np.zeros((D, D)),
         np.zeros(M), np.zeros(M), np.zeros((M, 2))]
    v = elbo_subchain(Y, theta, rho, True, W, L, P, log_A, log_pi, *g)
    return v, g


def test_elbo_value_and_gradients_with_tiny_cells_above_the_floor():
    """θ near its clip and |ρ| near 1 give a pair cell of ~1e-12 with derivatives of
    ~1e-5: the value and ∂/∂θ against the naive ELBO (a floor applied above 1e-300,
    e.g. at 1e-12, moved the value by 6.6e-10 and ∂/∂θ by 3e-4 relative, unseen by the
    tests on θ in [0.05, 0.95])."""
    # θ near EPS_THETA / 1-EPS_THETA and |ρ| near 1: a pair cell of 1e-12 whose
    # derivatives are ~1e-5 (bvn.copula_cells). Against the naive (unfloored) ELBO:
    # the value tightly, ∂/∂θ by central differences with a relative step.
    W = np.array([[0.7], [0.1]])
    L = np.array([[0.8]])
    Y = np.array([[0.3], [-0.2]])
    log_A = log_transitions(np.array([-1.0]), np.array([-1.5]))
    log_pi = np.log(np.array([[0.6, 0.4]]))
    Sigma = L @ L.T
    cases = [((5e-6, 2e-6), 0.999), ((2e-6, 5e-6), 0.999), ((1 - 5e-6, 2e-6), -0.999)]
    for (tp, tc), r in cases:
        theta = np.array([[tp], [tc]])
        rho = np.array([[0.0], [r]])
        v, g = _elbo_T2(theta, rho, W, L, log_A, log_pi, Y)
        ref = elbo_naive(Y, theta, rho, W, Sigma, log_A, log_pi)
        assert abs(v - ref) <= 1e-12 * max(1.0, abs(ref)), (tp, tc, r, v, ref)
        for t in range(2):
            h = 1e-4 * min(theta[t, 0], 1 - theta[t, 0])
            tpl, tmi = theta.copy(), theta.copy()
            tpl[t, 0] += h
            tmi[t, 0] -= h
            fd = (elbo_naive(Y, tpl, rho, W, Sigma, log_A, log_pi)
                  - elbo_naive(Y, tmi, rho, W, Sigma, log_A, log_pi)) / (2 * h)
            print(tp, tc, r, t, g[0][t, 0], fd)
            assert abs(g[0][t, 0] - fd) <= 1e-5 * abs(fd), (tp, tc, r, t, g[0][t, 0], fd)
