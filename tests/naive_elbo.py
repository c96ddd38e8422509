"""Slow, obviously-correct references for ``streamfhmm.kernels.elbo`` (MATH.md §2, §4).

Everything here enumerates: the copula cells come from 1-D adaptive quadrature of
``Φ2(h, k; ρ) = ∫_{-∞}^{h} φ(x) Φ((k - ρx)/√(1-ρ²)) dx``, and the ELBO, the exact
log-likelihood and the exact posterior from a sum over all ``2^{M·T}`` joint state
sequences, so only tiny ``T`` and ``M`` are usable (``M·T ≤ 12`` or so).

Conventions as in ``streamfhmm.model``: ``W`` (M+1, D) with the bias last, ``Sigma``
(D, D), ``log_A`` (M, 2, 2), ``log_pi`` (M, 2) with ``log_pi[m, j] = log p(s_1^m = j)``,
``NaN`` in ``Y`` marks a missing value.
"""
import math
from fractions import Fraction

import numpy as np
from scipy import integrate, special, stats

__all__ = [
    "bvn_cdf_naive",
    "bvn_cdf_owens_t",
    "copula_cells_naive",
    "log_gauss_observed",
    "log_gauss_observed_exact",
    "log_gauss_fraction",
    "all_state_sequences",
    "elbo_naive",
    "log_likelihood_naive",
    "posterior_naive",
    "log_transitions",
]


def bvn_cdf_naive(h, k, rho):
    """``Φ2(h, k; ρ)`` by adaptive quadrature of ``∫_{-∞}^{h} φ(x) Φ((k-ρx)/r) dx``."""
    h, k, rho = float(h), float(k), float(rho)
    r = math.sqrt((1.0 - rho) * (1.0 + rho))

    inv_sqrt_2pi = 1.0 / math.sqrt(2.0 * math.pi)

    def f(x):
        return inv_sqrt_2pi * math.exp(-0.5 * x * x) * special.ndtr((k - rho * x) / r)

    if h <= -40.0:
        return 0.0
    lo = -40.0
    # break points: where φ has its mass, and around the step of Φ((k-ρx)/r) at
    # x = k/ρ (width r/|ρ|, sharp when |ρ| → 1) so every piece is smooth
    cand = [-10.0, -5.0, 0.0, 5.0, 10.0]
    if rho != 0.0:
        step, width = k / rho, r / abs(rho)
        cand += [step + s * width for s in (-40.0, -10.0, -4.0, -1.0, 0.0, 1.0, 4.0, 10.0, 40.0)]
    pts = sorted({p for p in cand if lo < p < h})
    edges = [lo] + pts + [h]
    total = 0.0
    for a, b in zip(edges[:-1], edges[1:]):
        val, _ = integrate.quad(f, a, b, epsabs=1e-16, epsrel=1e-13, limit=200)
        total += val
    return total


def bvn_cdf_owens_t(h, k, rho):
    """``Φ2(h, k; ρ)`` through Owen's T function (an independent second reference).

    ``Φ2 = ½Φ(h) + ½Φ(k) - T(h, a_h) - T(k, a_k) - β`` with
    ``a_h = (k - ρh)/(h r)``, ``a_k = (h - ρk)/(k r)`` and ``β = ½`` when
    ``hk < 0`` or (``hk = 0`` and ``h + k < 0``), else 0; requires ``h, k ≠ 0``.
    """
    r = math.sqrt((1.0 - rho) * (1.0 + rho))
    ah = (k - rho * h) / (h * r)
    ak = (h - rho * k) / (k * r)
    beta = 0.5 if h * k < 0 else 0.0
    return (0.5 * special.ndtr(h) + 0.5 * special.ndtr(k)
            - special.owens_t(h, ah) - special.owens_t(k, ak) - beta)


def copula_cells_naive(theta_prev, theta, rho):
    """The four cells ``[q00, q01, q10, q11]`` of the pair copula (MATH.md §2).

    First index ``s_{t-1}``, second ``s_t``; each cell is its own ``Φ2``.
    """
    h1 = stats.norm.ppf(1.0 - theta_prev)
    h2 = stats.norm.ppf(1.0 - theta)
    return np.array([
        bvn_cdf_naive(h1, h2, rho),
        bvn_cdf_naive(h1, -h2, -rho),
        bvn_cdf_naive(-h1, h2, -rho),
        bvn_cdf_naive(-h1, -h2, rho),
    ])


def log_transitions(alpha, beta):
    """``log A_m(i, j)`` (M, 2, 2) from the logits, as ``FHMMParams.log_transmat``."""
    alpha = np.asarray(alpha, dtype=float)
    beta = np.asarray(beta, dtype=float)
    out = np.empty((alpha.shape[0], 2, 2))
    out[:, 0, 0] = -np.logaddexp(0.0, alpha)
    out[:, 0, 1] = -np.logaddexp(0.0, -alpha)
    out[:, 1, 0] = -np.logaddexp(0.0, -beta)
    out[:, 1, 1] = -np.logaddexp(0.0, beta)
    return out


def log_gauss_observed(y, mean, Sigma):
    """``log N(y_o; mean_o, Σ_oo)`` over the observed (non-NaN) entries; 0 if none."""
    obs = ~np.isnan(y)
    if not obs.any():
        return 0.0
    cov = Sigma[np.ix_(obs, obs)]
    return float(stats.multivariate_normal.logpdf(y[obs], mean=mean[obs], cov=cov))


def log_gauss_observed_exact(y, s, W, L):
    """``log N(y_o; (Wᵀŝ)_o, Σ_oo)`` for ``Σ = L Lᵀ`` in exact rational arithmetic.

    ``Σ_oo``, the mean and the residual are formed exactly from the float64 entries of
    ``y``, ``W`` and ``L`` (as fractions), the linear system and the determinant solved
    by exact Gaussian elimination: only the final logarithm and conversion round. The
    reference for a Σ too ill-conditioned for ``log_gauss_observed`` (for which a formed
    ``Σ_oo`` is singular in float64). ``s`` is the binary state (M,); 0 if nothing is
    observed.
    """
    y = np.asarray(y, dtype=float)
    M, D = W.shape[0] - 1, W.shape[1]
    obs = [d for d in range(D) if not math.isnan(y[d])]
    n = len(obs)
    if n == 0:
        return 0.0
    Lf = [[Fraction(float(L[i, j])) for j in range(D)] for i in range(D)]
    S = [[sum(Lf[i][k] * Lf[j][k] for k in range(D)) for j in obs] for i in obs]
    r = []
    for d in obs:
        mean = Fraction(float(W[M, d])) + sum(Fraction(float(W[m, d])) for m in range(M) if s[m])
        r.append(Fraction(float(y[d])) - mean)
    return log_gauss_fraction(r, S)


def log_gauss_fraction(r, S):
    """``log N(r; 0, S)`` for a residual ``r`` (n,) and a positive definite ``S`` (n, n)
    given as ``Fraction`` entries: exact Gaussian elimination, only the final
    logarithm and conversion round."""
    n = len(r)
    # Gaussian elimination on [S | r]: S is positive definite, so no pivoting is needed
    A = [list(row) + [r[i]] for i, row in enumerate(S)]
    det = Fraction(1)
    for j in range(n):
        det *= A[j][j]
        for i in range(j + 1, n):
            f = A[i][j] / A[j][j]
            for k in range(j, n + 1):
                A[i][k] -= f * A[j][k]
    x = [Fraction(0)] * n
    for i in range(n - 1, -1, -1):
        x[i] = (A[i][n] - sum(A[i][k] * x[k] for k in range(i + 1, n))) / A[i][i]
    quad = sum(ri * xi for ri, xi in zip(r, x))
    assert det > 0
    log_det = math.log(det.numerator) - math.log(det.denominator)
    return -0.5 * n * math.log(2.0 * math.pi) - 0.5 * log_det - 0.5 * float(quad)


def all_state_sequences(T, M):
    """Every joint sequence as an int array (2^{MT}, T, M) of 0/1."""
    n = M * T
    codes = np.arange(2**n)
    bits = (codes[:, None] >> np.arange(n)[None, :]) & 1
    return bits.reshape(-1, T, M)


def _log_joint_terms(Y, W, Sigma, log_A, log_pi, L=None):
    """``log p(y, s)`` for every joint sequence, shape (2^{MT},); with ``L`` the
    emissions are :func:`log_gauss_observed_exact` (``Sigma`` is then unused)."""
    T = Y.shape[0]
    M = W.shape[0] - 1
    S = all_state_sequences(T, M)
    # emission per (t, joint state at t)
    K = 2**M
    kbits = (np.arange(K)[:, None] >> np.arange(M)[None, :]) & 1
    le = np.empty((T, K))
    for t in range(T):
        for k in range(K):
            if L is not None:
                le[t, k] = log_gauss_observed_exact(Y[t], kbits[k], W, L)
                continue
            mean = kbits[k] @ W[:M] + W[M]
            le[t, k] = log_gauss_observed(Y[t], mean, Sigma)
    kidx = (S << np.arange(M)[None, None, :]).sum(axis=2)  # (N, T)
    out = le[np.arange(T)[None, :], kidx].sum(axis=1)
    for m in range(M):
        out = out + log_pi[m, S[:, 0, m]]
        for t in range(1, T):
            out = out + log_A[m, S[:, t - 1, m], S[:, t, m]]
    return S, out


def _log_q_sequences(S, theta, rho):
    """``log q(s)`` of the copula chain for every joint sequence (MATH.md §2)."""
    N, T, M = S.shape
    logq = np.zeros(N)
    for m in range(M):
        s = S[:, :, m]
        marg1 = np.where(s[:, 0] == 1, theta[0, m], 1.0 - theta[0, m])
        if T == 1:
            logq += np.log(marg1)
            continue
        for t in range(1, T):
            # quadrature can leave a cell that is really 0 at ±1e-17: clamp, log 0 = -inf
            cells = np.maximum(copula_cells_naive(theta[t - 1, m], theta[t, m], rho[t, m]), 0.0)
            with np.errstate(divide="ignore"):
                logq += np.log(cells[2 * s[:, t - 1] + s[:, t]])
            if t < T - 1:  # interior node
                logq -= np.log(np.where(s[:, t] == 1, theta[t, m], 1.0 - theta[t, m]))
    return logq


def elbo_naive(Y, theta, rho, W, Sigma, log_A, log_pi, L=None):
    """``E_q[log p(y, s)] - E_q[log q(s)]`` by enumeration of all joint sequences.

    Parameters
    ----------
    Y : (T, D), NaN = missing; theta, rho : (T, M) (``rho[0]`` unused);
    W : (M+1, D); Sigma : (D, D); log_A : (M, 2, 2); log_pi : (M, 2).
    L : (D, D), optional
        Cholesky factor of Σ: the emissions are then computed from it in exact
        arithmetic (:func:`log_gauss_observed_exact`) and ``Sigma`` is not used.
    """
    Y = np.asarray(Y, dtype=float)
    S, logp = _log_joint_terms(Y, W, Sigma, log_A, log_pi, L=L)
    logq = _log_q_sequences(S, np.asarray(theta, float), np.asarray(rho, float))
    q = np.exp(logq)
    assert abs(q.sum() - 1.0) < 1e-11, q.sum()
    keep = q > 0.0  # sequences of probability 0 contribute 0 (0 log 0 = 0)
    return float(np.sum(q[keep] * (logp[keep] - logq[keep])))


def log_likelihood_naive(Y, W, Sigma, log_A, log_pi):
    """``log p(y)`` by enumeration of all joint sequences."""
    _, logp = _log_joint_terms(np.asarray(Y, dtype=float), W, Sigma, log_A, log_pi)
    return float(special.logsumexp(logp))


def posterior_naive(Y, W, Sigma, log_A, log_pi):
    """Exact posterior marginals by enumeration.

    Returns
    -------
    loglik : float
    theta : (T, M), ``p(s_t^m = 1 | y)``
    xi : (T, M, 2, 2), ``p(s_{t-1}^m = i, s_t^m = j | y)`` (zero at t = 0)
    """
    S, logp = _log_joint_terms(np.asarray(Y, dtype=float), W, Sigma, log_A, log_pi)
    loglik = special.logsumexp(logp)
    w = np.exp(logp - loglik)
    N, T, M = S.shape
    theta = np.einsum("n,ntm->tm", w, S.astype(float))
    xi = np.zeros((T, M, 2, 2))
    for t in range(1, T):
        for m in range(M):
            for i in range(2):
                for j in range(2):
                    xi[t, m, i, j] = w[(S[:, t - 1, m] == i) & (S[:, t, m] == j)].sum()
    return float(loglik), theta, xi
