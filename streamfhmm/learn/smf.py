"""Structured mean-field EM for binary factorial HMMs (MATH.md §6; Ghahramani & Jordan,
"Factorial hidden Markov models", Machine Learning 29, 1997).

The paper's baseline, and a real method for sequences short enough to sweep in full:
the posterior is approximated by independent two-state chains, each an HMM with the
model's transitions and a variational emission potential; the E-step sweeps the
chains with forward–backward until θ settles, the M-step is closed form. Every step
increases the bound

    F(q, Γ) = E_q log p(y, s | Γ) + Σ_m H[q_m]  ≤  log p(y | Γ).

Public entry points
-------------------
* :func:`smf_posterior` — θ and the bound for fixed parameters.
* :func:`smf_e_step`, :func:`smf_m_step` — the two half-steps, for callers that drive
  EM themselves (and for the tests that check each half-step's monotonicity).
* :func:`fit_smf` — the EM loop with a time budget.
* :func:`init_params` — the data-driven starting point :func:`fit_smf` uses.
* :func:`expected_complete_loglik` — ``E_q log p(y, s | Γ)`` for a product of chains.
"""
from __future__ import annotations

import math
import numbers
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from .._validation import (check_fit_magnitude, check_lengths, check_observations,
                           check_positive_int, check_random_state)
from ..kernels import smf as _k
from ..model import PROB_FLOOR, FHMMParams, check_params
from .objective import COVARIANCE_TYPES as COVARIANCE_TYPE_NAMES
from .objective import constrain_params, covariance_mode

__all__ = ["SMFEStep", "smf_posterior", "smf_e_step", "smf_m_step", "fit_smf", "init_params",
           "expected_complete_loglik"]

LOG_2PI = math.log(2.0 * math.pi)
#: the smallest transition probability the kernel's lazily rescaled messages support
LOG_MIN_TRANSITION = math.log(1e-100)
#: eigenvalues of Σ_t E[ŝŝᵀ] below this fraction of the largest leave W unchanged along them
GRAM_RCOND = 1e-12
#: default floor on Σ, as a fraction of each feature's data variance (see :func:`smf_m_step`)
COVARIANCE_FLOOR = 1e-9
#: initial Σ as a fraction of the data covariance (see :func:`init_params`)
INIT_COVARIANCE_FRACTION = 0.5
#: initial switch-on and switch-off probabilities
INIT_SWITCH = 0.1
#: the first E-step of :func:`fit_smf` sweeps at Σ times these factors before the real one
INIT_ANNEAL = (100.0, 30.0, 10.0, 3.0)


@dataclass(frozen=True, eq=False)
class SMFEStep:
    """The result of a structured mean-field E-step.

    Attributes
    ----------
    theta : ndarray, shape (T, M)
        ``q(s_t^m = 1)``.
    xi : ndarray, shape (M, 2, 2)
        ``Σ_{t≥2} q(s_{t-1}^m = i, s_t^m = j)``, summed over sequences.
    entropy : ndarray, shape (M,)
        ``H[q_m]``, the entropy of each chain's variational HMM.
    log_Z : ndarray, shape (M,)
        Log normaliser of each chain's forward pass.
    theta_g : ndarray, shape (M,)
        ``Σ_t θ_t^m g_t^m`` with the potentials ``g^m`` of the final ``q_m``.
    bound : float
        ``F`` at the final ``q``.
    trace : ndarray, shape (n_updates + 1,)
        ``trace[0]``: the bound at the starting distribution; ``trace[k]``: after the
        k-th chain update. Non-decreasing. Unless the E-step started from a previous
        :class:`SMFEStep`, the bound is defined only once every chain has its own
        ``q_m``, and ``trace[0:M]`` are NaN.
    n_sweeps : int
    max_delta : float
        Largest ``|Δθ|`` of the last sweep.
    converged : bool
        ``max_delta < tol``.
    """

    theta: np.ndarray
    xi: np.ndarray
    entropy: np.ndarray
    log_Z: np.ndarray
    theta_g: np.ndarray
    bound: float
    trace: np.ndarray
    n_sweeps: int
    max_delta: float
    converged: bool


# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------
def _bounds(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _check_params(params, n_features=None) -> FHMMParams:
    check_params(params)
    if params.log_transmat.min() < LOG_MIN_TRANSITION:
        raise ValueError("params has a transition probability below 1e-100, which the scaled "
                         "SMF recursions do not support (FHMMParams.from_natural keeps them "
                         "at least 1e-12)")
    if n_features is not None and params.n_features != n_features:
        raise ValueError(f"params has {params.n_features} features but X has {n_features} columns")
    return params


def _check_nonneg_float(value, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    value = float(value)
    if not (value >= 0.0) or math.isinf(value):
        raise ValueError(f"{name} must be a finite non-negative number, got {value}")
    return value


def _check_theta(theta, T: int, M: int, name: str) -> np.ndarray:
    theta = np.array(theta, dtype=np.float64, order="C", copy=True)
    if theta.shape != (T, M):
        raise ValueError(f"{name} must have shape ({T}, {M}), got {theta.shape}")
    if not np.isfinite(theta).all() or (theta < 0).any() or (theta > 1).any():
        raise ValueError(f"{name} must hold probabilities in [0, 1]")
    return theta


def _check_xi(xi, M: int) -> np.ndarray:
    xi = np.asarray(xi, dtype=np.float64)
    if xi.shape != (M, 2, 2):
        raise ValueError(f"xi must have shape ({M}, 2, 2), got {xi.shape}")
    if not np.isfinite(xi).all() or (xi < 0).any():
        raise ValueError("xi must hold finite non-negative expected transition counts")
    return xi


def _xlogy(x, logy):
    """``x · log y`` elementwise with ``0 · log 0 = 0``."""
    with np.errstate(invalid="ignore"):
        return np.where(x == 0.0, 0.0, x * logy)


def _whiten(params: FHMMParams, X: np.ndarray):
    """``ỹ = L⁻¹(y - w_0)`` (T, D), ``ũ = L⁻¹ w_m`` (M, D), and ``-T(D/2 log 2π + Σ log L_dd)``."""
    ytil, U = _k.whiten(X, params.W, params.L)
    const = -X.shape[0] * (0.5 * X.shape[1] * LOG_2PI + float(params.log_diag.sum()))
    return ytil, U, const


def _prior_terms(params: FHMMParams, xi: np.ndarray, theta_start: np.ndarray) -> np.ndarray:
    """``E_{q_m} log p(s^m)`` per chain, shape (M,); ``theta_start`` (n_seq, M)."""
    log_s = params.log_startprob
    start = (_xlogy(1.0 - theta_start, log_s[:, 0]) + _xlogy(theta_start, log_s[:, 1])).sum(axis=0)
    trans = _xlogy(xi, params.log_transmat).sum(axis=(1, 2))
    return start + trans


def _default_floor(X: np.ndarray, relative: float = COVARIANCE_FLOOR) -> np.ndarray:
    """Per-feature floor, shape (D,): ``relative`` times each feature's variance
    (a constant feature's: the mean variance, or 1), so that Σ's floor is in each
    feature's own units: a feature whose variance is 1e-12 of another's is not
    floored far above its own variance (the fit would then ignore it)."""
    var = X.var(axis=0) if X.shape[0] > 1 else np.zeros(X.shape[1])
    mean = float(var.mean())
    base = mean if mean > 0.0 else 1.0
    return relative * np.where(var > 1e-24 * base, var, base)


def _check_floor(floor, D: int) -> np.ndarray:
    """``floor`` as a float64 array of D positive finite variances, else ValueError."""
    f = np.asarray(floor, dtype=np.float64)
    if f.shape != (D,) or not (np.isfinite(f).all() and (f > 0).all()):
        raise ValueError(f"floor must be {D} positive finite variances (one per feature), "
                         f"got {np.asarray(floor)!r:.80}")
    return f


# ----------------------------------------------------------------------------------------
# E-step
# ----------------------------------------------------------------------------------------
#: the most sweeps one E-step may be asked for (its bound trace is allocated up front:
#: one value per chain update)
MAX_SWEEPS = 100_000


def _check_sweeps(max_sweeps) -> int:
    max_sweeps = check_positive_int(max_sweeps, "max_sweeps")
    if max_sweeps > MAX_SWEEPS:
        raise ValueError(f"max_sweeps must be at most {MAX_SWEEPS:,} (the E-step stops earlier "
                         f"once θ settles to its tolerance), got {max_sweeps:,}")
    return max_sweeps


def _e_step(params, X, bounds, theta, tol, max_sweeps, chain_terms) -> SMFEStep:
    """E-step on validated inputs; ``theta`` is overwritten."""
    M = params.n_chains
    ytil, U, const = _whiten(params, X)
    xi = np.zeros((M, 2, 2))
    log_Z = np.zeros(M)
    theta_g = np.zeros(M)
    entropy = np.zeros(M)
    trace = np.full(1 + max_sweeps * M, np.nan)
    terms = np.array(chain_terms, dtype=np.float64)
    n_sweeps, max_delta, n_updates = _k.smf_e_step(
        ytil, U, params.log_transmat, params.log_startprob, bounds, theta, float(tol),
        int(max_sweeps), const, terms, xi, log_Z, theta_g, entropy, trace)
    trace = trace[: n_updates + 1].copy()
    return SMFEStep(theta=theta, xi=xi, entropy=entropy, log_Z=log_Z, theta_g=theta_g,
                    bound=float(trace[-1]), trace=trace, n_sweeps=int(n_sweeps),
                    max_delta=float(max_delta), converged=bool(max_delta < tol))


def smf_e_step(params: FHMMParams, X, lengths=None, theta_init=None, tol: float = 1e-6,
               max_sweeps: int = 100, previous: SMFEStep | None = None) -> SMFEStep:
    """Structured mean-field E-step: sweep the chains until θ settles.

    Parameters
    ----------
    params : FHMMParams
    X : array_like, shape (T, D)
    lengths : array_like of int, optional
        Lengths of the independent sequences in X (hmmlearn convention).
    theta_init : array_like, shape (T, M), optional
        Starting marginals; default each chain's stationary probability
        ``a_m / (a_m + b_m)``. Not allowed together with ``previous``.
    tol : float
        Stop after the first sweep whose largest ``|Δθ|`` is below ``tol``.
    max_sweeps : int
        At most this many sweeps over all chains.
    previous : SMFEStep, optional
        Start from this variational distribution (e.g. the last E-step, before an
        M-step changed ``params``). ``trace[0]`` of the result is then the bound of
        ``previous``'s distribution under ``params``.

    Returns
    -------
    SMFEStep

    Notes
    -----
    MATH.md §6. Chain m's update is an exact maximisation of F over ``q_m`` with the
    other chains fixed, so ``result.trace`` never decreases.

    Examples
    --------
    >>> p = FHMMParams.random(2, 3, random_state=0)
    >>> X, _ = p.sample(50, random_state=1)
    >>> est = smf_e_step(p, X)
    >>> bool(np.all(np.diff(est.trace[p.n_chains:]) >= -1e-9 * abs(est.bound)))
    True
    """
    params = _check_params(params)
    X = check_observations(X, n_features=params.n_features)
    lengths = check_lengths(lengths, X.shape[0])
    bounds = _bounds(lengths)
    T, M = X.shape[0], params.n_chains
    tol = _check_nonneg_float(tol, "tol")
    max_sweeps = _check_sweeps(max_sweeps)
    if previous is not None:
        if not isinstance(previous, SMFEStep):
            raise ValueError(f"previous must be an SMFEStep, got {type(previous).__name__}")
        if theta_init is not None:
            raise ValueError("theta_init and previous cannot both be given")
        theta = _check_theta(previous.theta, T, M, "previous.theta")
        terms = _prior_terms(params, previous.xi, theta[bounds[:-1]]) + previous.entropy
    else:
        if theta_init is None:
            theta = np.tile(params.stationary, (T, 1))
        else:
            theta = _check_theta(theta_init, T, M, "theta_init")
        terms = np.full(M, np.nan)
    return _e_step(params, X, bounds, theta, tol, max_sweeps, terms)


def smf_posterior(params: FHMMParams, X, lengths=None, tol: float = 1e-6, max_sweeps: int = 100,
                  theta_init=None):
    """Structured mean-field posterior marginals and bound for fixed parameters.

    Parameters
    ----------
    params : FHMMParams
    X : array_like, shape (T, D)
    lengths : array_like of int, optional
        Lengths of the independent sequences in X; chains restart from ``π`` at each.
    tol : float
        Convergence tolerance on the largest change of θ over a sweep.
    max_sweeps : int
        At most this many sweeps over all chains.
    theta_init : array_like, shape (T, M), optional
        Starting marginals; default the stationary probabilities.

    Returns
    -------
    theta : ndarray, shape (T, M)
        ``q(s_t^m = 1)``.
    bound : float
        The lower bound ``F ≤ log p(X)``.

    Notes
    -----
    MATH.md §6. For a single chain the bound is the exact log-likelihood and θ the
    exact smoothing marginals.

    Examples
    --------
    >>> p = FHMMParams.random(3, 2, random_state=0)
    >>> X, _ = p.sample(100, random_state=1)
    >>> theta, bound = smf_posterior(p, X)
    >>> theta.shape
    (100, 3)
    """
    est = smf_e_step(params, X, lengths=lengths, theta_init=theta_init, tol=tol,
                     max_sweeps=max_sweeps)
    return est.theta, est.bound


def expected_complete_loglik(params: FHMMParams, X, theta, xi, lengths=None) -> float:
    """``E_q log p(y, s | Γ)`` for a product of independent chains.

    Parameters
    ----------
    params : FHMMParams
    X : array_like, shape (T, D)
    theta : array_like, shape (T, M)
        Marginals ``q(s_t^m = 1)``.
    xi : array_like, shape (M, 2, 2)
        Pairwise marginals summed over ``t ≥ 2`` and sequences.
    lengths : array_like of int, optional

    Returns
    -------
    float

    Notes
    -----
    MATH.md §4 (emission term) and §6: ``F = expected_complete_loglik + Σ_m H[q_m]``.
    """
    params = _check_params(params)
    X = check_observations(X, n_features=params.n_features)
    lengths = check_lengths(lengths, X.shape[0])
    T, M = X.shape[0], params.n_chains
    theta = _check_theta(theta, T, M, "theta")
    xi = _check_xi(xi, M)
    ytil, U, const = _whiten(params, X)
    R = ytil - theta @ U
    var = (theta * (1.0 - theta)).sum(axis=0) @ (U * U).sum(axis=1)
    emission = const - 0.5 * (float((R * R).sum()) + float(var))
    prior = _prior_terms(params, xi, theta[_bounds(lengths)[:-1]])
    return float(emission + prior.sum())


# ----------------------------------------------------------------------------------------
# M-step
# ----------------------------------------------------------------------------------------
def _m_step(params: FHMMParams, X, theta, xi, starts, floor, cov_mode: int = 0,
            gram=None) -> FHMMParams:
    """Closed-form M-step on validated inputs (``cov_mode``: 0 full, 1 diag, 2 spherical).

    ``gram``: ``Σ_t E[ŝ_t ŝ_tᵀ]`` (M+1, M+1) under the posterior, when it is not a
    product of chains (exact EM); default the mean-field one, ``θθᵀ`` off the diagonal.
    """
    T, M = theta.shape
    mu = np.empty((T, M + 1))
    mu[:, :M] = theta
    mu[:, M] = 1.0
    exact_gram = gram is not None
    if not exact_gram:
        v = (theta * (1.0 - theta)).sum(axis=0)
        gram = mu.T @ mu                # Σ_t E[ŝ_t ŝ_tᵀ]
        gram[np.arange(M), np.arange(M)] += v
    cross = mu.T @ X                    # Σ_t E[ŝ_t] y_tᵀ
    # W: the normal equations gram · W = cross. Directions of gram with (numerically)
    # zero weight — a chain never on, or always on (collinear with the bias) — leave
    # F unchanged, so W keeps its previous value along them.
    lam, V = np.linalg.eigh(gram)
    keep = lam > GRAM_RCOND * lam[-1]
    Vk = V[:, keep]
    W = params.W + Vk @ ((Vk.T @ (cross - gram @ params.W)) / lam[keep, None])
    # Σ: the expected residual covariance (1/T) Σ_t E[(y - Wᵀŝ)(y - Wᵀŝ)ᵀ]
    # = (1/T)(Σ_t r_t r_tᵀ + Wᵀ Σ_t Cov[ŝ_t] W), r_t = y_t - Wᵀμ_t, positive semi-definite
    # for any W; its eigenvalues are floored, the constrained maximiser of F over Σ. From
    # the residuals, not as YᵀY - WᵀC - CᵀW + WᵀGW, whose terms grow with the data's offset
    # and cancel (data at 5e6 with noise 0.1 gave a negative variance)
    E = X - mu @ W
    if exact_gram:
        # Cov[ŝ_t] on the chains only: its bias row and column are 0 by definition, while
        # gram and μᵀμ each carry their own rounding there, which the bias row of W
        # (the data's offset) would multiply twice (1e-8 at an offset of 1e4)
        cov = gram[:M, :M] - mu[:, :M].T @ mu[:, :M]
        S = (E.T @ E + W[:M].T @ cov @ W[:M]) / T
    else:   # (mean field: Cov[ŝ_t] is diag(θ(1 - θ)) on the chains)
        S = (E.T @ E + (W[:M].T * v) @ W[:M]) / T
    S = 0.5 * (S + S.T)
    floor = np.broadcast_to(np.asarray(floor, dtype=np.float64), (S.shape[0],))
    if cov_mode == 1:
        # diagonal Σ: each variance maximises its own term -½(log σ² + S_dd/σ²)
        S = np.diag(np.maximum(np.diag(S), floor))
    elif cov_mode == 2:
        # σ² I: the terms add to -½ D (log σ² + tr(S)/(D σ²))
        S = max(float(np.trace(S)) / S.shape[0], float(floor.mean())) * np.eye(S.shape[0])
    else:
        # eigenvalues floored in the units of the per-feature floor f: those of
        # diag(f)^-½ S diag(f)^-½ at 1 (for one f, those of S at f)
        if (floor > 0.0).all():
            r, low = np.sqrt(floor), 1.0
        else:  # a zero floor (covariance_floor=0): clip negative eigenvalues only
            r, low = np.ones(len(floor)), float(floor.max())
        ev, Q = np.linalg.eigh(S / np.outer(r, r))
        if ev[0] < low:
            S = ((Q * np.maximum(ev, low)) @ Q.T) * np.outer(r, r)
            S = 0.5 * (S + S.T)
    # A: expected transition counts; a row with no mass (a state never occupied) keeps
    # its previous value, every probability stays in [PROB_FLOOR, 1 - PROB_FLOOR].
    A_old = params.transmat
    rows = xi.sum(axis=2, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        A = np.where(rows > 0.0, xi / rows, A_old)
    off = np.clip(np.stack([A[:, 0, 1], A[:, 1, 0]], axis=1), PROB_FLOOR, 1.0 - PROB_FLOOR)
    A = np.empty((M, 2, 2))
    A[:, 0, 1], A[:, 1, 0] = off[:, 0], off[:, 1]
    A[:, 0, 0], A[:, 1, 1] = 1.0 - off[:, 0], 1.0 - off[:, 1]
    startprob = np.clip(theta[starts].mean(axis=0), PROB_FLOOR, 1.0 - PROB_FLOOR)
    out = FHMMParams.from_natural(W, S, A, startprob=startprob)
    # exactly on the family (the Cholesky factor of a diagonal Σ is diagonal up to rounding)
    return constrain_params(out, COVARIANCE_TYPE_NAMES[cov_mode])


def smf_m_step(params: FHMMParams, X, theta, xi, lengths=None,
               covariance_floor: float | None = None,
               covariance_type: str = "full") -> FHMMParams:
    """Closed-form M-step of structured mean-field EM.

    Parameters
    ----------
    params : FHMMParams
        The current parameters; only used along directions the data leave
        undetermined (see Notes).
    X : array_like, shape (T, D)
    theta : array_like, shape (T, M)
        ``q(s_t^m = 1)`` from the E-step.
    xi : array_like, shape (M, 2, 2)
        Expected transition counts from the E-step.
    lengths : array_like of int, optional
    covariance_floor : float, optional
        Floor on the eigenvalues of Σ. Default: per feature, ``1e-9`` times its
        variance in X (the eigenvalues of ``diag(f)^-½ Σ diag(f)^-½`` are floored at 1
        for these floors f; a diagonal Σ's variances at f, a spherical one's at the mean
        of f), so that the floor does not depend on the features' units.
    covariance_type : {"full", "diag", "spherical"}
        Family of Σ: with S the full update below, ``"diag"`` keeps ``diag(S_dd)`` and
        ``"spherical"`` takes ``tr(S)/D · I``.

    Returns
    -------
    FHMMParams

    Notes
    -----
    MATH.md §6: ``W = (Σ_t E[ŝŝᵀ])⁻¹ Σ_t E[ŝ] yᵀ``, ``Σ = (1/T) Σ_t (yyᵀ - Wᵀ E[ŝ] yᵀ)``,
    ``A_m(i, j) ∝ Σ_t ξ_t^m(i, j)``, ``π_m`` the mean of ``θ_1^m`` over sequences.
    The constrained Σ updates are the exact maximisers of F over that family: W does
    not depend on Σ (every dimension has the same design), and for a fixed W,
    ``Σ_t E log N(y_t; Wᵀŝ_t, Σ) = -T/2 (log|Σ| + tr(Σ⁻¹ S)) + const``, which over
    diagonal Σ separates into ``-T/2 Σ_d (log σ_d² + S_dd/σ_d²)`` (maximum
    ``σ_d² = S_dd``) and over ``σ² I`` is ``-T D/2 (log σ² + tr(S)/(D σ²))`` (maximum
    ``σ² = tr(S)/D``); the floor clips a variance from below, which is again the
    constrained maximum of these unimodal terms. Numerical guards: along eigen-directions of ``Σ_t E[ŝŝᵀ]`` with eigenvalue below
    ``1e-12`` of the largest (a chain never on, or always on) W keeps its current value;
    the eigenvalues of Σ (the variances, for diag and spherical) are floored at
    ``covariance_floor``; a transition row with no
    expected visits keeps its current value; transition and start probabilities are
    clipped to ``[1e-12, 1 - 1e-12]``.
    """
    params = _check_params(params)
    X = check_observations(X, n_features=params.n_features)
    lengths = check_lengths(lengths, X.shape[0])
    T, M = X.shape[0], params.n_chains
    theta = _check_theta(theta, T, M, "theta")
    xi = _check_xi(xi, M)
    if covariance_floor is None:
        floor = _default_floor(X)
    else:
        floor = _check_nonneg_float(covariance_floor, "covariance_floor")
    return _m_step(params, X, theta, xi, _bounds(lengths)[:-1], floor,
                   covariance_mode(covariance_type))


# ----------------------------------------------------------------------------------------
# initialisation and the EM loop
# ----------------------------------------------------------------------------------------
def _kmeans(Z: np.ndarray, K: int, rng: np.random.Generator, n_iter: int = 50) -> np.ndarray:
    """Lloyd's k-means with k-means++ seeding; returns (K, D) centres."""
    n = Z.shape[0]
    centres = np.empty((K, Z.shape[1]))
    centres[0] = Z[rng.integers(n)]
    d2 = ((Z - centres[0]) ** 2).sum(axis=1)
    for k in range(1, K):
        total = d2.sum()
        idx = rng.choice(n, p=d2 / total) if total > 0 else rng.integers(n)
        centres[k] = Z[idx]
        d2 = np.minimum(d2, ((Z - centres[k]) ** 2).sum(axis=1))
    labels = None
    for _ in range(n_iter):
        dist = ((Z[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2)
        new = dist.argmin(axis=1)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        for k in range(K):
            members = Z[labels == k]
            if len(members):
                centres[k] = members.mean(axis=0)
    return centres


def init_params(X, n_chains: int, lengths=None, random_state=None,
                covariance_type: str = "full") -> FHMMParams:
    """A data-driven starting point for SMF-EM.

    Parameters
    ----------
    X : array_like, shape (T, D)
    n_chains : int
    lengths : array_like of int, optional
        Only validated (the start does not depend on the sequence boundaries).
    random_state : None, int or numpy Generator
    covariance_type : {"full", "diag", "spherical"}
        Family of the starting Σ (projected: its diagonal, or ``tr/D · I``).

    Returns
    -------
    FHMMParams

    Notes
    -----
    Greedy two-means deflation on the standardised data (a random subsample of at most
    5,000 rows): split the data in two clusters (k-means, k-means++ seeding), take the
    step between the centres as ``w_1`` and subtract it from the rows of the "on"
    cluster; split the residual for ``w_2``; and so on. ``w_0`` is the mean of the
    final residual. Each step is oriented so that its standardised coordinates sum to
    a non-negative number (for non-negative data such as power readings an appliance
    switching on adds to the readings). A chain whose split finds no structure gets a
    small step, which EM grows or leaves. This mirrors the model's additive structure,
    which a single (M+1)-means clustering does not: with fewer clusters than the 2^M
    joint states, its centres mix chains. Σ is ``INIT_COVARIANCE_FRACTION`` (½) of the
    data covariance (plus a tiny ridge), both switch probabilities are ``INIT_SWITCH``
    (0.1) and ``π_m = ½``.

    Examples
    --------
    >>> p = FHMMParams.random(2, 3, random_state=0)
    >>> X, _ = p.sample(500, random_state=1)
    >>> init_params(X, 2, random_state=0).W.shape
    (3, 3)
    """
    X = check_observations(X)
    check_lengths(lengths, X.shape[0])
    M = check_positive_int(n_chains, "n_chains")
    mode = covariance_mode(covariance_type)
    rng = check_random_state(random_state)
    T, D = X.shape
    mean = X.mean(axis=0)
    cov = np.atleast_2d(np.cov(X, rowvar=False)) if T > 1 else np.zeros((D, D))
    std = np.sqrt(np.diag(cov))
    scale = float(std.mean()) if std.mean() > 0 else 1.0
    std = np.where(std > 1e-12 * scale, std, scale)
    R = (X if T <= 5000 else X[rng.choice(T, 5000, replace=False)]) - mean
    R = R / std
    Wz = np.zeros((M + 1, D))
    for m in range(M):
        c = _kmeans(R, 2, rng)
        on = ((R - c[1]) ** 2).sum(axis=1) < ((R - c[0]) ** 2).sum(axis=1)
        step = c[1] - c[0]
        if step.sum() < 0:
            step, on = -step, ~on
        if not np.linalg.norm(step) > 1e-8:
            step = 0.25 * rng.standard_normal(D)
        Wz[m] = step
        R = R - on[:, None] * step
    Wz[M] = R.mean(axis=0)
    W = Wz * std
    W[M] += mean
    S = INIT_COVARIANCE_FRACTION * cov
    floor = _default_floor(X)   # (T = 1: every feature gets COVARIANCE_FLOOR)
    # a ridge relative to each feature's variance (not the mean one: in mixed units it
    # would swamp a feature of small variance)
    S = S + np.diag(np.maximum(floor, 1e-6 * np.diag(S)))
    A = np.empty((M, 2, 2))
    A[:, 0, 1] = A[:, 1, 0] = INIT_SWITCH
    A[:, 0, 0] = A[:, 1, 1] = 1.0 - INIT_SWITCH
    params = FHMMParams.from_natural(W, S, A, startprob=np.full(M, 0.5))
    return constrain_params(params, COVARIANCE_TYPE_NAMES[mode])


def fit_smf(X, lengths=None, params: FHMMParams | None = None, n_chains: int | None = None,
            max_iter: int = 100, tol: float = 1e-6, time_budget: float | None = None,
            random_state=None, progress: bool = True, e_tol: float = 1e-6, max_sweeps: int = 20,
            covariance_type: str = "full", floor=None):
    """Fit a factorial HMM by structured mean-field EM.

    Parameters
    ----------
    X : array_like, shape (T, D)
    lengths : array_like of int, optional
        Lengths of the independent sequences in X (hmmlearn convention).
    params : FHMMParams, optional
        Starting parameters; default :func:`init_params` with ``n_chains``.
    n_chains : int, optional
        Required when ``params`` is None; must match ``params`` otherwise.
    max_iter : int
        At most this many EM iterations (M-step followed by E-step).
    tol : float
        Stop when an iteration raises the bound by less than ``tol`` nats per sample.
        (Not relative to the bound's magnitude, as before: a change of the data's units
        shifts the bound by a constant, which changed when that rule stopped.)
    time_budget : float, optional
        Stop once this many seconds have passed (checked between iterations).
    random_state : None, int or numpy Generator
        Seeds the initialisation and the random starting θ.
    progress : bool
        Show a tqdm progress bar.
    e_tol : float
        E-step tolerance on the largest change of θ over a sweep.
    max_sweeps : int
        At most this many sweeps per E-step.
    covariance_type : {"full", "diag", "spherical"}
        Family of Σ. A given ``params`` is first projected onto it
        (:func:`~streamfhmm.learn.objective.constrain_params`: its variances, or their
        mean); every M-step is the family's exact constrained maximiser
        (:func:`smf_m_step`), so the bound still never decreases.
    floor : array_like, shape (D,), optional
        Per-feature floor on Σ's variances (default ``COVARIANCE_FLOOR`` times each
        feature's variance in X). A fit on part of a series (a start) passes the whole
        series' floor: a part where every feature holds still has variances of rounding
        noise, and a floor from them let Σ collapse.

    Returns
    -------
    params : FHMMParams
        The parameters after the last M-step.
    history : list of dict
        One entry per EM iteration with keys ``"iteration"``, ``"bound"`` (F after the
        iteration's E-step, the bound of the returned parameters for the last entry),
        ``"time"`` (seconds since the start) and ``"n_sweeps"``. Entry 0 is the initial
        E-step under the starting parameters.

    Notes
    -----
    MATH.md §6. The initial E-step starts from θ uniform in (0, 1) and is annealed:
    it first sweeps with Σ multiplied by ``INIT_ANNEAL`` = (100, 30, 10, 3), each stage
    starting where the previous one stopped, which avoids most of the poor mean-field
    fixed points a random θ falls into when the noise is small. Each later E-step
    starts from the previous q, so the bound never decreases across iterations.

    Examples
    --------
    >>> p = FHMMParams.random(2, 2, random_state=0)
    >>> X, _ = p.sample(200, random_state=1)
    >>> fitted, history = fit_smf(X, n_chains=2, max_iter=5, random_state=0, progress=False)
    >>> history[-1]["bound"] >= history[0]["bound"]
    True
    """
    X = check_fit_magnitude(check_observations(X))
    lengths = check_lengths(lengths, X.shape[0])
    bounds = _bounds(lengths)
    starts = bounds[:-1]
    T, D = X.shape
    max_iter = check_positive_int(max_iter, "max_iter", minimum=0)
    tol = _check_nonneg_float(tol, "tol")
    e_tol = _check_nonneg_float(e_tol, "e_tol")
    max_sweeps = _check_sweeps(max_sweeps)
    if time_budget is not None:
        time_budget = _check_nonneg_float(time_budget, "time_budget")
    cov_mode = covariance_mode(covariance_type)
    rng = check_random_state(random_state)
    t0 = time.perf_counter()
    if params is None:
        if n_chains is None:
            raise ValueError("n_chains must be given when params is None")
        params = init_params(X, n_chains, random_state=rng, covariance_type=covariance_type)
    else:
        params = _check_params(params, D)
        if n_chains is not None and check_positive_int(n_chains, "n_chains") != params.n_chains:
            raise ValueError(f"n_chains ({n_chains}) does not match params.n_chains "
                             f"({params.n_chains})")
        params = constrain_params(params, covariance_type)
    M = params.n_chains
    floor = _default_floor(X) if floor is None else _check_floor(floor, D)

    theta = rng.uniform(size=(T, M))
    # deterministic annealing of the first E-step: from a random θ, plain coordinate
    # ascent at a small noise level stops at poor fixed points; sweeping first with Σ
    # inflated, then less and less, lets the chains share out the data smoothly
    nan_terms = np.full(M, np.nan)
    for factor in INIT_ANNEAL:
        hot = params.replace(L=params.L * math.sqrt(factor))
        _e_step(hot, X, bounds, theta, e_tol, max_sweeps, nan_terms)
    est = _e_step(params, X, bounds, theta, e_tol, max_sweeps, nan_terms)
    history = [{"iteration": 0, "bound": est.bound, "time": time.perf_counter() - t0,
                "n_sweeps": est.n_sweeps}]
    # no bar at all without progress: tqdm(disable=True) still starts tqdm's monitor
    # thread, which then stays for the life of the process
    with (tqdm(total=max_iter, desc="SMF-EM", unit="it") if progress else nullcontext()) as bar:
        for it in range(1, max_iter + 1):
            if time_budget is not None and time.perf_counter() - t0 >= time_budget:
                break
            previous = est
            params = _m_step(params, X, est.theta, est.xi, starts, floor, cov_mode)
            terms = _prior_terms(params, est.xi, est.theta[starts]) + est.entropy
            est = _e_step(params, X, bounds, est.theta.copy(), e_tol, max_sweeps, terms)
            history.append({"iteration": it, "bound": est.bound,
                            "time": time.perf_counter() - t0, "n_sweeps": est.n_sweeps})
            if bar is not None:
                bar.update(1)
                bar.set_postfix(bound=f"{est.bound:.6g}")
            if est.bound - previous.bound < tol * T:
                break
    return params, history
