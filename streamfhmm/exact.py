"""Exact inference for factorial HMMs: the validated Python layer over
:mod:`streamfhmm.kernels.exact` (MATH.md §7).

Exact inference costs O(M·2^M) per time step and O(2^M) memory per message; it is the
reference every approximation is measured against, and the right tool while 2^M is
small. ``MAX_EXACT_CHAINS`` bounds M so that one message stays at 8 MB. The filter
keeps one message; the smoother keeps a checkpoint every ``b`` steps and the ``b``
messages of one block, ``b = min(SMOOTH_BLOCK, ⌈√T⌉)`` for a longest sequence of T
steps (:func:`smooth_block`): about ``(T/b + b) · 2^M · 8`` bytes, e.g. 35 messages
(280 MB) for 300 steps at M = 20, about 4,200 messages (34 MB) for 10^6 steps at M = 10.
"""
from __future__ import annotations

import numpy as np

from ._validation import check_bool, check_lengths, check_observations
from .kernels import exact as _k
from .model import FHMMParams, check_params

__all__ = ["MAX_EXACT_CHAINS", "log_likelihood", "filtered_marginals", "smoothed_marginals",
           "bounds_from_lengths"]

#: the largest number of chains exact inference accepts (2^20 joint states, ~8 MB a message)
MAX_EXACT_CHAINS = 20
#: the smoother's largest forward-message checkpoint interval (:func:`smooth_block`)
SMOOTH_BLOCK = 256


def smooth_block(bounds) -> int:
    """The smoother's checkpoint interval for sequences ``bounds`` (int64, (S+1,)):
    ``⌈√T⌉`` for the longest sequence's T, at most :data:`SMOOTH_BLOCK`, which keeps
    the ``T/b`` checkpoints plus the ``b`` messages of a block near their least."""
    longest = int(np.diff(bounds).max()) if len(bounds) > 1 else 1
    return int(min(SMOOTH_BLOCK, max(1, np.ceil(np.sqrt(longest)))))


def bounds_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """``[0, l_0, l_0 + l_1, …]`` as int64: sequence i is ``X[b[i]:b[i+1]]``."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _prepare(params: FHMMParams, X, lengths):
    check_params(params)
    M = params.n_chains
    if M > MAX_EXACT_CHAINS:
        raise ValueError(f"exact inference is limited to n_chains <= {MAX_EXACT_CHAINS} "
                         f"(2^M joint states per step); this model has {M} chains: its "
                         f"posteriors come from FHMM.predict_proba(method='recognition' or "
                         f"'smf'), and its log-likelihood is bounded by FHMM.elbo or the "
                         f"structured mean-field bound (learn.smf.smf_posterior)")
    X = check_observations(X, n_features=params.n_features)
    lengths = check_lengths(lengths, X.shape[0])
    return X, bounds_from_lengths(lengths)


def log_likelihood(params: FHMMParams, X, lengths=None) -> float:
    """Exact ``log p(X)`` summed over the sequences.

    Parameters
    ----------
    params : FHMMParams
    X : array_like, shape (T, D)
    lengths : array_like of int, optional
        Lengths of the sequences in X (hmmlearn convention); default one sequence.

    Returns
    -------
    float
    """
    X, bounds = _prepare(params, X, lengths)
    dummy = np.empty((1, params.n_chains))
    return float(_k.forward_filter(X, bounds, params.W, params.L, params.transmat,
                                   params.startprob, False, dummy))


def filtered_marginals(params: FHMMParams, X, lengths=None):
    """Exact filtering marginals ``p(s_t^m = 1 | y_1..y_t)``.

    Returns
    -------
    loglik : float
    theta : ndarray, shape (T, M)
    """
    X, bounds = _prepare(params, X, lengths)
    theta = np.zeros((X.shape[0], params.n_chains))
    ll = _k.forward_filter(X, bounds, params.W, params.L, params.transmat, params.startprob,
                           True, theta)
    return float(ll), theta


def smoothed_marginals(params: FHMMParams, X, lengths=None, pairwise: bool = False):
    """Exact smoothing marginals, and per-chain pairwise posteriors on request.

    Returns
    -------
    loglik : float
    theta : ndarray, shape (T, M)
        ``p(s_t^m = 1 | y)``.
    xi : ndarray, shape (T, M, 2, 2), only if ``pairwise``
        ``p(s_{t-1}^m = i, s_t^m = j | y)``; zero at the first step of each sequence.
    """
    pairwise = check_bool(pairwise, "pairwise")
    X, bounds = _prepare(params, X, lengths)
    T, M = X.shape[0], params.n_chains
    theta = np.zeros((T, M))
    xi = np.zeros((T, M, 2, 2)) if pairwise else np.zeros((1, M, 2, 2))
    ll = _k.forward_backward(X, bounds, params.W, params.L, params.transmat, params.startprob,
                             smooth_block(bounds), bool(pairwise), theta, xi, np.zeros(0))
    if pairwise:
        return float(ll), theta, xi
    return float(ll), theta
