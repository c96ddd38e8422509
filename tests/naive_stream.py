"""Slow, obviously-correct references for the streaming engine's kernels.

Dense matrices over the 2^M joint states, scipy densities, one full forward–backward
pass per time step. Nothing here imports streamfhmm.stream or
streamfhmm.kernels.online. With ``L`` (the Cholesky factor of Σ) the emissions are
computed in exact rational arithmetic (:func:`log_emission_exact`), for a Σ too
ill-conditioned for scipy.
"""
from __future__ import annotations

import numpy as np
from scipy.stats import multivariate_normal

from .naive_elbo import log_gauss_observed_exact


def joint_states(M: int) -> np.ndarray:
    """Rows of bits, state k has bit m = s^m: shape (2^M, M)."""
    return np.array([[(k >> m) & 1 for m in range(M)] for k in range(1 << M)], dtype=float)


def dense_transition(transmat: np.ndarray) -> np.ndarray:
    """The (2^M, 2^M) transition matrix of independent chains."""
    M = transmat.shape[0]
    S = joint_states(M).astype(int)
    K = 1 << M
    T = np.ones((K, K))
    for i in range(K):
        for j in range(K):
            for m in range(M):
                T[i, j] *= transmat[m, S[i, m], S[j, m]]
    return T


def dense_start(startprob: np.ndarray) -> np.ndarray:
    S = joint_states(len(startprob))
    return np.prod(np.where(S == 1, startprob, 1 - startprob), axis=1)


def emission(W: np.ndarray, Sigma: np.ndarray, y: np.ndarray) -> np.ndarray:
    """p(y | s) for every joint state; NaN dimensions are marginalised (1 if all missing)."""
    M = W.shape[0] - 1
    S = joint_states(M)
    means = S @ W[:M] + W[M]
    obs = ~np.isnan(y)
    if not obs.any():
        return np.ones(len(S))
    return np.array([multivariate_normal(mu[obs], Sigma[np.ix_(obs, obs)]).pdf(y[obs])
                     for mu in means])


def log_emission_exact(W, L, y) -> np.ndarray:
    """log p(y_o | s) for every joint state, ``Σ = L Lᵀ``, in exact rational arithmetic
    (:func:`naive_elbo.log_gauss_observed_exact`: ``Σ_oo`` is formed and solved as
    fractions, so it stays right when a float64 ``Σ_oo`` is singular); 0 when nothing
    is observed."""
    S = joint_states(W.shape[0] - 1).astype(int)
    return np.array([log_gauss_observed_exact(y, s, W, L) for s in S])


def _emissions(W, Sigma, X, L=None):
    """Per step: the emission densities up to a factor, and the log of that factor
    (``p(y_t | s) = e[t][s] · exp(c[t])``); scipy densities, or exact ones with ``L``."""
    if L is None:
        return [emission(W, Sigma, y) for y in X], np.zeros(len(X))
    le = [log_emission_exact(W, L, y) for y in X]
    c = np.array([v.max() for v in le])
    return [np.exp(v - ct) for v, ct in zip(le, c)], c


def smooth_dense(W, Sigma, transmat, startprob, X, L=None) -> np.ndarray:
    """Exact smoothing marginals p(s_t^m = 1 | y_0..y_{T-1}) by dense forward–backward
    (with ``L``, emissions from :func:`log_emission_exact`; ``Sigma`` is then unused)."""
    T_ = dense_transition(transmat)
    M = W.shape[0] - 1
    S = joint_states(M)
    n = len(X)
    e, _ = _emissions(W, Sigma, X, L)
    alpha = np.zeros((n, 1 << M))
    a = dense_start(startprob)
    for t in range(n):
        if t:
            a = alpha[t - 1] @ T_
        a = a * e[t]
        alpha[t] = a / a.sum()
    beta = np.ones(1 << M)
    out = np.zeros((n, M))
    for t in range(n - 1, -1, -1):
        post = alpha[t] * beta
        out[t] = (post / post.sum()) @ S
        b = T_ @ (e[t] * beta)
        beta = b / b.sum()
    return out


def fixed_lag_dense(W, Sigma, transmat, startprob, X, lag, L=None) -> np.ndarray:
    """Row i: p(s_i | y_0..y_{i+lag}) (for the last ``lag`` rows: given the whole X).

    One full dense smoother per time step — O(T²) — for short sequences only.
    """
    n = len(X)
    out = np.zeros((n, W.shape[0] - 1))
    for i in range(n):
        end = min(n, i + lag + 1)
        out[i] = smooth_dense(W, Sigma, transmat, startprob, X[:end], L=L)[i]
    return out


def filtered_dense(W, Sigma, transmat, startprob, X, L=None) -> np.ndarray:
    """p(s_t | y_0..y_t)."""
    return fixed_lag_dense(W, Sigma, transmat, startprob, X, 0, L=L)


def loglik_dense(W, Sigma, transmat, startprob, X, L=None) -> float:
    """log p(y_0..y_{T-1}) by a dense forward pass (with ``L``: exact emissions)."""
    T_ = dense_transition(transmat)
    e, c = _emissions(W, Sigma, X, L)
    a = dense_start(startprob)
    total = 0.0
    for t in range(len(X)):
        if t:
            a = a @ T_
        a = a * e[t]
        z = a.sum()
        total += np.log(z) + c[t]
        a = a / z
    return float(total)


def log_emission_dense(W, Sigma, y) -> np.ndarray:
    """log p(y_o | s) for every joint state (0 when nothing is observed)."""
    M = W.shape[0] - 1
    S = joint_states(M)
    means = S @ W[:M] + W[M]
    obs = ~np.isnan(y)
    if not obs.any():
        return np.zeros(len(S))
    return np.array([multivariate_normal(mu[obs], Sigma[np.ix_(obs, obs)]).logpdf(y[obs])
                     for mu in means])


def windows(Y: np.ndarray, window: int, off: int) -> np.ndarray:
    """Raw edge-padded windows of one sequence: row t is y[t-off .. t-off+window-1],
    indices clamped into [0, T-1], shape (T, window, D)."""
    T = len(Y)
    out = np.empty((T, window, Y.shape[1]))
    for t in range(T):
        for k in range(window):
            out[t, k] = Y[min(max(t - off + k, 0), T - 1)]
    return out


class RingReference:
    """A ring buffer as a Python list of the last ``capacity`` samples."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.items = {}

    def write(self, t, x):
        self.items[t] = np.array(x, dtype=float)
        for old in [k for k in self.items if k <= t - self.capacity]:
            del self.items[old]

    def last(self, t, w):
        return np.array([self.items[k] for k in range(t - w + 1, t + 1)])
