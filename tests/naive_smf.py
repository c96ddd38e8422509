"""Slow, obviously-correct references for structured mean field (MATH.md §6).

Loops and brute-force enumeration over every state sequence of tiny problems; the
precision matrix is inverted directly (no whitening). Nothing here imports the module
it checks.
"""
from __future__ import annotations

import itertools

import numpy as np
from scipy.special import logsumexp
from scipy.stats import multivariate_normal


def _log_emission_table(params, X) -> np.ndarray:
    """``log N(y_t; Wᵀŝ, Σ)`` for every t and joint state k (bit m of k is s^m): (T, 2^M)."""
    M = params.n_chains
    table = np.empty((len(X), 1 << M))
    for k in range(1 << M):
        s = np.array([(k >> m) & 1 for m in range(M)], dtype=float)
        mean = s @ params.W[:M] + params.W[M]
        table[:, k] = multivariate_normal.logpdf(X, mean, params.covariance).reshape(len(X))
    return table


def _log_prior_chain(log_start, log_A, seq) -> float:
    """``log p(s^m)`` of one binary sequence under one chain's (π, A)."""
    lp = log_start[seq[0]]
    for t in range(1, len(seq)):
        lp += log_A[seq[t - 1], seq[t]]
    return lp


def chain_posterior(log_start, log_A, g):
    """Enumerate the 2^T sequences of one chain with potentials ``exp(s_t g_t)``.

    Parameters
    ----------
    log_start : (2,) ``log p(s_1 = j)``
    log_A : (2, 2)
    g : (T,)

    Returns
    -------
    theta : (T,) ``q(s_t = 1)``
    xi : (2, 2) ``Σ_{t≥2} q(s_{t-1} = i, s_t = j)``
    log_Z : float
    entropy : float ``-Σ_s q(s) log q(s)``
    """
    T = len(g)
    seqs = np.array(list(itertools.product((0, 1), repeat=T)))
    with np.errstate(divide="ignore"):
        logw = np.array([_log_prior_chain(log_start, log_A, s) + float(s @ g) for s in seqs])
    log_Z = logsumexp(logw)
    q = np.exp(logw - log_Z)
    theta = q @ seqs
    xi = np.zeros((2, 2))
    for s, qs in zip(seqs, q):
        for t in range(1, T):
            xi[s[t - 1], s[t]] += qs
    pos = q > 0
    entropy = -float(np.sum(q[pos] * (logw[pos] - log_Z)))
    return theta, xi, float(log_Z), entropy


def smf_potentials(params, X, theta, m) -> np.ndarray:
    """``g_t^m = w_mᵀ P (y_t - w_0 - Σ_{n≠m} θ_t^n w_n) - ½ w_mᵀ P w_m`` for one chain: (T,)."""
    M = params.n_chains
    P = np.linalg.inv(params.covariance)
    W = params.W
    g = np.empty(len(X))
    for t in range(len(X)):
        other = W[M].copy()
        for n in range(M):
            if n != m:
                other += theta[t, n] * W[n]
        g[t] = W[m] @ P @ (X[t] - other) - 0.5 * W[m] @ P @ W[m]
    return g


def smf_sweeps(params, X, theta_init, n_sweeps):
    """Structured mean field on one sequence: ``n_sweeps`` sweeps, chains in order.

    Returns
    -------
    theta : (T, M)
    potentials : list of M arrays (T,), the ``g^m`` each chain's final q_m was built with
    xi : (M, 2, 2)
    log_Z : (M,)
    entropy : (M,)
    """
    M = params.n_chains
    theta = np.array(theta_init, dtype=float, copy=True)
    log_A = params.log_transmat
    log_start = params.log_startprob
    potentials = [None] * M
    xi = np.zeros((M, 2, 2))
    log_Z = np.zeros(M)
    entropy = np.zeros(M)
    for _ in range(n_sweeps):
        for m in range(M):
            g = smf_potentials(params, X, theta, m)
            th, xi[m], log_Z[m], entropy[m] = chain_posterior(log_start[m], log_A[m], g)
            theta[:, m] = th
            potentials[m] = g
    return theta, potentials, xi, log_Z, entropy


def smf_bound_bruteforce(params, X, potentials) -> float:
    """``E_q log p(y, s) - E_q log q(s)`` by enumerating all joint state sequences, with
    ``q = Π_m q_m`` and ``q_m`` the chain HMM with the model's (π_m, A_m) and potentials
    ``exp(s g^m)``."""
    M = params.n_chains
    T = len(X)
    log_A = params.log_transmat
    log_start = params.log_startprob
    table = _log_emission_table(params, X)
    chain_seqs = np.array(list(itertools.product((0, 1), repeat=T)))
    # per chain: log q_m and log p(s^m) of every one of its 2^T sequences
    log_q, log_prior = [], []
    for m in range(M):
        with np.errstate(divide="ignore"):
            lp = np.array([_log_prior_chain(log_start[m], log_A[m], s) for s in chain_seqs])
        lw = lp + chain_seqs @ potentials[m]
        log_q.append(lw - logsumexp(lw))
        log_prior.append(lp)
    total = 0.0
    for combo in itertools.product(range(len(chain_seqs)), repeat=M):
        lq = sum(log_q[m][combo[m]] for m in range(M))
        if not np.isfinite(lq):
            continue
        k = sum(chain_seqs[combo[m]] << m for m in range(M))  # joint state index per t
        lp = sum(log_prior[m][combo[m]] for m in range(M)) + table[np.arange(T), k].sum()
        total += np.exp(lq) * (lp - lq)
    return float(total)


def log_likelihood_bruteforce(params, X) -> float:
    """``log p(X)`` of one sequence by enumerating all joint state sequences."""
    M = params.n_chains
    T = len(X)
    log_A = params.log_transmat
    log_start = params.log_startprob
    table = _log_emission_table(params, X)
    chain_seqs = np.array(list(itertools.product((0, 1), repeat=T)))
    with np.errstate(divide="ignore"):
        log_prior = [np.array([_log_prior_chain(log_start[m], log_A[m], s) for s in chain_seqs])
                     for m in range(M)]
    terms = []
    for combo in itertools.product(range(len(chain_seqs)), repeat=M):
        k = sum(chain_seqs[combo[m]] << m for m in range(M))
        terms.append(sum(log_prior[m][combo[m]] for m in range(M)) + table[np.arange(T), k].sum())
    return float(logsumexp(terms))


def m_step_lstsq(X, theta):
    """W and Σ maximising ``E_q Σ_t log N(y_t; Wᵀŝ_t, Σ)`` for independent chains.

    The expected squared error ``Σ_t E‖y_t - Wᵀŝ_t‖²`` equals the squared error of an
    augmented regression: one row ``μ_t = [θ_t, 1]`` with target ``y_t`` per time step,
    plus one row ``√(θ_t^m (1-θ_t^m)) e_m`` with target 0 per time step and chain. Solve
    it with ``numpy.linalg.lstsq``; Σ is the residual covariance of the augmented rows
    divided by T.
    """
    T, M = theta.shape
    D = X.shape[1]
    rows = [np.hstack([theta, np.ones((T, 1))])]
    targets = [X]
    for m in range(M):
        r = np.zeros((T, M + 1))
        r[:, m] = np.sqrt(theta[:, m] * (1.0 - theta[:, m]))
        rows.append(r)
        targets.append(np.zeros((T, D)))
    A = np.vstack(rows)
    B = np.vstack(targets)
    W, *_ = np.linalg.lstsq(A, B, rcond=None)
    E = B - A @ W
    return W, E.T @ E / T
