"""Slow, obviously-correct references that the fast kernels are checked against.

Written for clarity: loops, scipy, brute-force enumeration over every joint state
sequence. Nothing here imports the module it checks.

This module holds the references of the exact-inference kernels
(``streamfhmm/kernels/exact.py``); the references of the other kernels sit beside it,
one file per kernel module, so that each stays short:

==============================  ============================================
kernel module                   slow reference
==============================  ============================================
``kernels/exact.py``            this file (enumeration, product-space HMM)
``kernels/bvn.py``              ``naive_bvn.py`` (quadrature, mpmath)
``kernels/elbo.py``             ``naive_elbo.py`` (q(s) enumerated over 2^{MT})
``kernels/recognition.py``      ``naive_recognition.py`` (loops)
``kernels/smf.py``              ``naive_smf.py`` (loops, enumeration)
``kernels/online.py``           ``naive_stream.py`` (dense product space)
``kernels/_math.py``            numpy, scipy and mpmath (in ``test_math.py``)
==============================  ============================================
"""
from __future__ import annotations

import itertools

import numpy as np
from scipy.stats import multivariate_normal


# --------------------------------------------------------------------------------------
# exact inference (MATH.md §7) by enumeration
# --------------------------------------------------------------------------------------
def joint_states(M: int) -> np.ndarray:
    """All joint states as rows of bits, state k has bit m = s^m: shape (2^M, M)."""
    return np.array([[(k >> m) & 1 for m in range(M)] for k in range(1 << M)], dtype=float)


def log_joint(params, X, S) -> float:
    """log p(y, s) for one sequence and one state sequence S (T, M)."""
    M = params.n_chains
    A = params.transmat
    pi = params.startprob
    lp = 0.0
    for m in range(M):
        lp += np.log(pi[m] if S[0, m] else 1 - pi[m])
    for t in range(1, len(X)):
        for m in range(M):
            lp += np.log(A[m, int(S[t - 1, m]), int(S[t, m])])
    Sigma = params.covariance
    for t in range(len(X)):
        mean = S[t] @ params.W[:M] + params.W[M]
        lp += multivariate_normal.logpdf(X[t], mean, Sigma)
    return lp


def brute_force_posterior(params, X):
    """Enumerate all (2^M)^T state sequences of one sequence.

    Returns
    -------
    loglik : float
    theta : (T, M) smoothing marginals
    xi : (T, M, 2, 2) pairwise posteriors (zero at t = 0)
    filt : (T, M) filtering marginals
    """
    T, M = len(X), params.n_chains
    states = joint_states(M)
    seqs = list(itertools.product(range(1 << M), repeat=T))
    logs = np.array([log_joint(params, X, states[list(seq)]) for seq in seqs])
    ll = np.logaddexp.reduce(logs)
    w = np.exp(logs - ll)
    theta = np.zeros((T, M))
    xi = np.zeros((T, M, 2, 2))
    for seq, wi in zip(seqs, w):
        S = states[list(seq)]
        theta += wi * S
        for t in range(1, T):
            for m in range(M):
                xi[t, m, int(S[t - 1, m]), int(S[t, m])] += wi
    filt = np.zeros((T, M))
    for t in range(T):
        # p(s_t | y_1..t): marginalise the enumeration of the prefix
        pre = list(itertools.product(range(1 << M), repeat=t + 1))
        lp = np.array([log_joint(params, X[: t + 1], states[list(s)]) for s in pre])
        wp = np.exp(lp - np.logaddexp.reduce(lp))
        for s, wi in zip(pre, wp):
            filt[t] += wi * states[s[-1]]
    return ll, theta, xi, filt


def product_space_hmm(params):
    """The FHMM as a plain HMM over 2^M states: (startprob, transmat, means, covariance)."""
    M = params.n_chains
    states = joint_states(M)
    A = params.transmat
    K = 1 << M
    start = np.array([np.prod([params.startprob[m] if s[m] else 1 - params.startprob[m]
                               for m in range(M)]) for s in states])
    trans = np.ones((K, K))
    for i in range(K):
        for j in range(K):
            for m in range(M):
                trans[i, j] *= A[m, int(states[i, m]), int(states[j, m])]
    means = states @ params.W[:M] + params.W[M]
    return start, trans, means, params.covariance


def forward_loglik_loops(params, X) -> float:
    """Textbook forward algorithm in log space on the product space (O(4^M) per step)."""
    start, trans, means, cov = product_space_hmm(params)
    K = len(start)
    with np.errstate(divide="ignore"):
        log_start, log_trans = np.log(start), np.log(trans)
    log_alpha = None
    for t in range(len(X)):
        le = np.array([multivariate_normal.logpdf(X[t], means[k], cov) for k in range(K)])
        if t == 0:
            log_alpha = log_start + le
        else:
            log_alpha = np.array([np.logaddexp.reduce(log_alpha + log_trans[:, k]) for k in range(K)]) + le
    return float(np.logaddexp.reduce(log_alpha))
