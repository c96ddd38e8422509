"""Evaluation helpers: per-step log-likelihood, posterior error, parameter recovery.

A factorial HMM is identified only up to a permutation of its chains and, per chain,
the 0/1 relabelling ``s ↦ 1 - s`` (which maps ``w_m ↦ -w_m``, ``w_0 ↦ w_0 + w_m`` and
swaps the switch-on and switch-off probabilities). :func:`align_params` finds the
permutation and relabelling that best match a reference before comparing.
"""
from __future__ import annotations


import numpy as np
from scipy.optimize import linear_sum_assignment

from . import exact
from ._validation import _as_float_array, check_observations
from .model import FHMMParams, check_params

__all__ = ["loglik_per_step", "posterior_mae", "align_params", "recovery_errors"]


def loglik_per_step(params: FHMMParams, X, lengths=None) -> float:
    """Exact log-likelihood divided by the number of time steps."""
    check_params(params)
    X = check_observations(X, n_features=params.n_features)
    return exact.log_likelihood(params, X, lengths) / X.shape[0]


def posterior_mae(theta, reference) -> float:
    """Mean absolute difference between two (T, M) posterior-marginal arrays.

    Both must be 2-D, of the same shape with at least one entry, and hold
    probabilities in [0, 1] (no NaN); otherwise ValueError.
    """
    theta = _as_float_array(theta, "theta")
    reference = _as_float_array(reference, "reference")
    if theta.shape != reference.shape:
        raise ValueError(f"theta and reference must have the same shape, got {theta.shape} and "
                         f"{reference.shape}")
    if theta.ndim != 2 or theta.size == 0:
        raise ValueError(f"theta and reference must be non-empty arrays of shape (T, M), got "
                         f"shape {theta.shape}")
    for name, a in (("theta", theta), ("reference", reference)):
        if not ((a >= 0.0) & (a <= 1.0)).all():   # (NaN fails both)
            raise ValueError(f"{name} must hold probabilities in [0, 1], got "
                             f"{float(a[~((a >= 0.0) & (a <= 1.0))][0])!r}")
    return float(np.mean(np.abs(theta - reference)))


def relabel(params: FHMMParams, perm, flip) -> FHMMParams:
    """Chains reordered by ``perm`` (new chain i is old chain ``perm[i]``), and chain i's
    states swapped where ``flip[i]``.

    ``perm`` must be a permutation of ``0 … M-1`` and ``flip`` M booleans; otherwise
    ValueError.
    """
    check_params(params)
    M = params.n_chains
    perm = np.asarray(perm)
    if perm.shape != (M,) or not np.issubdtype(perm.dtype, np.integer) \
            or not np.array_equal(np.sort(perm), np.arange(M)):
        raise ValueError(f"perm must be a permutation of 0..{M - 1} (one entry per chain), "
                         f"got {perm.tolist()!r}")
    flip = np.asarray(flip)
    if flip.shape != (M,) or flip.dtype != bool:
        raise ValueError(f"flip must be {M} booleans (one per chain), got {flip.tolist()!r}")
    W = params.W[list(perm) + [M]].copy()
    alpha, beta = params.alpha[perm].copy(), params.beta[perm].copy()
    start = params.startprob[perm].copy()
    for i in np.flatnonzero(flip):
        W[M] += W[i]
        W[i] = -W[i]
        alpha[i], beta[i] = beta[i], alpha[i]
        start[i] = 1.0 - start[i]
    return FHMMParams(W=W, L=params.L, alpha=alpha, beta=beta, startprob=start)


def align_params(estimate: FHMMParams, reference: FHMMParams):
    """Relabel ``estimate``'s chains to best match ``reference``.

    The cost of matching estimated chain j to reference chain i with relabelling f is
    ``‖±w_j - w_i‖²`` (ties between equal or opposite rows broken by the switch
    probabilities); the permutation minimising the total cost is found exactly
    (Hungarian algorithm on the per-pair best relabelling).

    Returns
    -------
    aligned : FHMMParams
    perm : ndarray of int, shape (M,)
    flip : ndarray of bool, shape (M,)
    """
    check_params(estimate, "estimate")
    check_params(reference, "reference")
    if estimate.n_chains != reference.n_chains or estimate.n_features != reference.n_features:
        raise ValueError("estimate and reference must have the same n_chains and n_features")
    M = estimate.n_chains
    We, Wr = estimate.W[:M], reference.W[:M]
    cost_keep = ((Wr[:, None, :] - We[None, :, :]) ** 2).sum(-1)
    cost_flip = ((Wr[:, None, :] + We[None, :, :]) ** 2).sum(-1)
    # ties (equal or opposite w rows) are broken by the switch probabilities (a flip
    # swaps them): a tiny term, so it decides only between matchings of equal w cost
    Ae, Ar = estimate.transmat, reference.transmat      # a = A(0, 1), b = A(1, 0)
    ae, be = Ae[:, 0, 1], Ae[:, 1, 0]
    ar, br = Ar[:, 0, 1, None], Ar[:, 1, 0, None]
    # (per pair, at the scale of its own rows: one scale for all, set by the largest cost,
    # let a chain of weight 1e5 make the term outweigh real differences of order 1
    # between two small chains)
    tie = 1e-9 * (1.0 + (Wr ** 2).sum(-1)[:, None] + (We ** 2).sum(-1)[None, :])
    cost_keep = cost_keep + tie * ((ar - ae) ** 2 + (br - be) ** 2)
    cost_flip = cost_flip + tie * ((ar - be) ** 2 + (br - ae) ** 2)
    cost = np.minimum(cost_keep, cost_flip)
    rows, cols = linear_sum_assignment(cost)
    perm = cols[np.argsort(rows)]
    flip = np.array([cost_flip[i, perm[i]] < cost_keep[i, perm[i]] for i in range(M)])
    return relabel(estimate, perm, flip), perm, flip


def recovery_errors(estimate: FHMMParams, reference: FHMMParams) -> dict:
    """Largest absolute errors of the aligned estimate against the reference.

    Returns
    -------
    dict with ``W`` (max |ΔW| entry), ``covariance``, ``transmat``, ``perm``, ``flip``.
    """
    aligned, perm, flip = align_params(estimate, reference)
    return {
        "W": float(np.max(np.abs(aligned.W - reference.W))),
        "covariance": float(np.max(np.abs(aligned.covariance - reference.covariance))),
        "transmat": float(np.max(np.abs(aligned.transmat - reference.transmat))),
        "perm": perm.tolist(),
        "flip": flip.tolist(),
    }
