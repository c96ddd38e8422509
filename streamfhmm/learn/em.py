"""Exact EM (Baum–Welch) for binary factorial HMMs with few chains.

The E-step is the exact smoother of :mod:`streamfhmm.kernels.exact` (O(T·M·2^M)),
which also sums the joint posteriors over time so that the M-step gets the exact
``Σ_t E[ŝ_t ŝ_tᵀ]`` (cross-chain moments included, where structured mean-field has
``θ_m θ_n``). The M-step is the closed form of MATH.md §6 with that statistic. Every
iteration increases the log-likelihood ``log p(y | Γ)`` itself (not a bound): this is
maximum likelihood, the reference the approximate learners are measured against while
``2^M`` is small (M ≤ 12 or so; one E-step with the pairwise statistics takes about
200 s at M = 10 over 10^6 samples on one core).

Public entry points
-------------------
* :func:`exact_e_step` — log-likelihood and the expected sufficient statistics.
* :func:`fit_exact_em` — the EM loop with a time budget.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from .. import exact
from .._validation import (check_fit_magnitude, check_lengths, check_observations,
                           check_positive_int, check_random_state)
from ..kernels import exact as _kx
from ..model import FHMMParams, check_params
from .objective import constrain_params, covariance_mode
from .smf import _bounds, _check_nonneg_float, _check_params, _default_floor, _m_step, init_params

__all__ = ["ExactEStep", "exact_e_step", "fit_exact_em", "MAX_EM_CHAINS", "check_em_chains"]

#: the most chains :func:`fit_exact_em` accepts (2^M joint states per time step)
MAX_EM_CHAINS = 14


def check_em_chains(n_chains: int) -> int:
    """``n_chains`` if exact EM can take it (at most :data:`MAX_EM_CHAINS`), else ValueError."""
    if n_chains > MAX_EM_CHAINS:
        raise ValueError(f"exact EM enumerates 2^M joint states; n_chains must be at most "
                         f"{MAX_EM_CHAINS}, got {n_chains}")
    return n_chains


@dataclass(frozen=True, eq=False)
class ExactEStep:
    """The exact posterior statistics of one E-step.

    Attributes
    ----------
    loglik : float
        ``log p(y | Γ)``.
    theta : ndarray, shape (T, M)
        ``p(s_t^m = 1 | y)``.
    xi : ndarray, shape (M, 2, 2)
        Expected transition counts ``Σ_t p(s_{t-1}^m = i, s_t^m = j | y)``.
    gram : ndarray, shape (M+1, M+1)
        ``Σ_t E[ŝ_t ŝ_tᵀ]`` with ``ŝ_t = [s_t; 1]``.
    """

    loglik: float
    theta: np.ndarray
    xi: np.ndarray
    gram: np.ndarray


def _augmented_states(M: int) -> np.ndarray:
    """``ŝ_k = [bits of k; 1]`` for every joint state k, shape (2^M, M+1)."""
    k = np.arange(1 << M)
    S = np.ones((1 << M, M + 1))
    S[:, :M] = (k[:, None] >> np.arange(M)) & 1
    return S


def exact_e_step(params: FHMMParams, X, lengths=None) -> ExactEStep:
    """Exact smoothing and the sufficient statistics of the M-step.

    Parameters
    ----------
    params : FHMMParams
    X : array_like, shape (T, D)
    lengths : array_like of int, optional

    Returns
    -------
    ExactEStep

    Notes
    -----
    MATH.md §7 (smoother) and §6 (statistics): ``gram = Σ_k G_k ŝ_k ŝ_kᵀ`` with
    ``G_k = Σ_t p(s_t = k | y)`` accumulated by the smoother's backward pass.
    """
    check_params(params)
    M = check_em_chains(params.n_chains)
    X = check_observations(X, n_features=params.n_features)
    lengths = check_lengths(lengths, X.shape[0])
    bounds = _bounds(lengths)
    T = X.shape[0]
    theta = np.zeros((T, M))
    xi = np.zeros((T, M, 2, 2))
    gsum = np.zeros(1 << M)
    ll = _kx.forward_backward(X, bounds, params.W, params.L, params.transmat, params.startprob,
                              exact.smooth_block(bounds), True, theta, xi, gsum)
    S = _augmented_states(M)
    gram = S.T @ (gsum[:, None] * S)
    return ExactEStep(float(ll), theta, xi.sum(axis=0), 0.5 * (gram + gram.T))


def fit_exact_em(X, lengths=None, params: FHMMParams | None = None, n_chains: int | None = None,
                 max_iter: int = 100, tol: float = 1e-7, time_budget: float | None = None,
                 random_state=None, progress: bool = True, covariance_type: str = "full"):
    """Fit a factorial HMM by exact EM (maximum likelihood, to a local optimum).

    Parameters
    ----------
    X : array_like, shape (T, D)
    lengths : array_like of int, optional
    params : FHMMParams, optional
        Starting parameters (projected onto ``covariance_type``); default
        :func:`~streamfhmm.learn.smf.init_params`.
    n_chains : int, optional
        Required when ``params`` is None (at most ``MAX_EM_CHAINS``); must match
        ``params`` otherwise.
    max_iter : int
        At most this many M-steps.
    tol : float
        Stop when an M-step raises the log-likelihood by less than ``tol`` nats per
        sample (not relative to its magnitude, as before: a change of the data's units
        shifts it by a constant, which changed when that rule stopped).
    time_budget : float, optional
        Stop once this many seconds have passed (checked between iterations).
    random_state : None, int or numpy Generator
        Seeds the default initialisation.
    progress : bool
        Show a tqdm progress bar.
    covariance_type : {"full", "diag", "spherical"}
        Family of Σ; the M-step is that family's exact constrained maximiser.

    Returns
    -------
    params : FHMMParams
        The parameters after the last M-step.
    history : list of dict
        ``"iteration"``, ``"loglik"`` (of the parameters after that iteration's
        M-step; entry 0: the start) and ``"time"``.

    Notes
    -----
    Baum–Welch on the product space, written per chain: E-step :func:`exact_e_step`,
    M-step MATH.md §6 with the exact ``Σ_t E[ŝŝᵀ]``. The log-likelihood never
    decreases (up to rounding), which the tests check.
    """
    X = check_fit_magnitude(check_observations(X))
    lengths = check_lengths(lengths, X.shape[0])
    starts = _bounds(lengths)[:-1]
    T = X.shape[0]
    max_iter = check_positive_int(max_iter, "max_iter", minimum=0)
    tol = _check_nonneg_float(tol, "tol")
    if time_budget is not None:
        time_budget = _check_nonneg_float(time_budget, "time_budget")
    cov_mode = covariance_mode(covariance_type)
    t0 = time.perf_counter()
    if params is None:
        if n_chains is None:
            raise ValueError("n_chains must be given when params is None")
        check_em_chains(check_positive_int(n_chains, "n_chains"))
        params = init_params(X, n_chains, lengths, random_state=check_random_state(random_state),
                             covariance_type=covariance_type)
    else:
        params = _check_params(params, X.shape[1])
        if n_chains is not None and check_positive_int(n_chains, "n_chains") != params.n_chains:
            raise ValueError(f"n_chains ({n_chains}) does not match params.n_chains "
                             f"({params.n_chains})")
        params = constrain_params(params, covariance_type)
    floor = _default_floor(X)
    est = exact_e_step(params, X, lengths)
    history = [{"iteration": 0, "loglik": est.loglik, "time": time.perf_counter() - t0}]
    # no bar at all without progress: tqdm(disable=True) still starts tqdm's monitor
    # thread, which then stays for the life of the process
    with (tqdm(total=max_iter, desc="exact EM", unit="it") if progress else nullcontext()) as bar:
        for it in range(1, max_iter + 1):
            if time_budget is not None and time.perf_counter() - t0 >= time_budget:
                break
            previous = est
            params = _m_step(params, X, est.theta, est.xi, starts, floor, cov_mode, gram=est.gram)
            est = exact_e_step(params, X, lengths)
            history.append({"iteration": it, "loglik": est.loglik,
                            "time": time.perf_counter() - t0})
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loglik=f"{est.loglik:.6g}")
            if est.loglik - previous.loglik < tol * T:
                break
    return params, history
