"""Slow, obviously-correct references for the streaming engine's kernels.

Dense matrices over the 2^M joint states, scipy densities, one full forward–backward
pass per time step. Nothing here imports streamfhmm.stream or
streamfhmm.kernels.online.
"""
from __future__ import annotations

import numpy as np
from scipy.stats import multivariate_normal


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


def smooth_dense(W, Sigma, transmat, startprob, X) -> np.ndarray:
    """Exact smoothing marginals p(s_t^m = 1 | y_0..y_{T-1}) by dense forward–backward."""
    T_ = dense_transition(transmat)
    M = W.shape[0] - 1
    S = joint_states(M)
    n = len(X)
    alpha = np.zeros((n, 1 << M))
    a = dense_start(startprob)
    for t in range(n):
        if t:
            a = alpha[t - 1] @ T_
        a = a * emission(W, Sigma, X[t])
        alpha[t] = a / a.sum()
    beta = np.ones(1 << M)
    out = np.zeros((n, M))
    for t in range(n - 1, -1, -1):
        post = alpha[t] * beta
        out[t] = (post / post.sum()) @ S
        b = T_ @ (emission(W, Sigma, X[t]) * beta)
        beta = b / b.sum()
    return out


def fixed_lag_dense(W, Sigma, transmat, startprob, X, lag) -> np.ndarray:
    """Row i: p(s_i | y_0..y_{i+lag}) (for the last ``lag`` rows: given the whole X).

    One full dense smoother per time step — O(T²) — for short sequences only.
    """
    n = len(X)
    out = np.zeros((n, W.shape[0] - 1))
    for i in range(n):
        end = min(n, i + lag + 1)
        out[i] = smooth_dense(W, Sigma, transmat, startprob, X[:end])[i]
    return out


def filtered_dense(W, Sigma, transmat, startprob, X) -> np.ndarray:
    """p(s_t | y_0..y_t)."""
    return fixed_lag_dense(W, Sigma, transmat, startprob, X, 0)


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
