"""The factorial HMM's parameters (MATH.md §1) and sampling from them.

``FHMMParams`` is an immutable value: the learner builds a new one for each snapshot and
the inference path swaps a reference to it.

Conventions used by every kernel
--------------------------------
* ``W`` (M+1, D): row ``m < M`` is chain m's contribution, row ``M`` the bias ``w_0``.
* ``L`` (D, D): lower-triangular Cholesky factor of Σ with a positive diagonal; the
  learner works with ``log_diag = log diag(L)``.
* ``alpha``, ``beta`` (M,): logits of ``a_m = P(s_t=1 | s_{t-1}=0)`` and
  ``b_m = P(s_t=0 | s_{t-1}=1)``, so ``A_m = [[1-a, a], [b, 1-b]]``.
* ``startprob`` (M,): ``π_m = P(s_1^m = 1)``.
* Joint state index ``k`` of the exact kernels: bit ``m`` of ``k`` is ``s^m``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import (check_covariance, check_random_state, check_real, check_startprob,
                          check_transmat, check_W, check_positive_int, _as_float_array)

__all__ = ["FHMMParams", "check_params", "logit", "sigmoid"]

#: transition probabilities are kept inside [PROB_FLOOR, 1 - PROB_FLOOR] so logits stay finite
PROB_FLOOR = 1e-12


def check_params(params, name: str = "params") -> "FHMMParams":
    """``params`` if it is an :class:`FHMMParams`, else ValueError."""
    if not isinstance(params, FHMMParams):
        raise ValueError(f"{name} must be an FHMMParams, got {type(params).__name__}")
    return params


def sigmoid(x):
    """Numerically stable logistic function."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    e = np.exp(x[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def logit(p):
    """Inverse of :func:`sigmoid`, with ``p`` clipped to ``[PROB_FLOOR, 1 - PROB_FLOOR]``."""
    p = np.clip(np.asarray(p, dtype=np.float64), PROB_FLOOR, 1.0 - PROB_FLOOR)
    return np.log(p) - np.log1p(-p)


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64, order="C", copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class FHMMParams:
    """Parameters of a Gaussian factorial HMM with binary chains.

    Parameters
    ----------
    W : ndarray, shape (M+1, D)
        Chain contributions, bias last.
    L : ndarray, shape (D, D)
        Lower-triangular Cholesky factor of the noise covariance, positive diagonal.
    alpha, beta : ndarray, shape (M,)
        Logits of the switch-on and switch-off probabilities.
    startprob : ndarray, shape (M,)
        ``P(s_1^m = 1)``.

    Notes
    -----
    ``p(y, s) = Π_m p(s_1^m) Π_t N(y_t; Wᵀŝ_t, LLᵀ) Π_{t≥2} Π_m A_m(s_{t-1}^m, s_t^m)``
    (MATH.md §1).
    """

    W: np.ndarray
    L: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    startprob: np.ndarray

    def __post_init__(self):
        W = check_W(self.W)
        M, D = W.shape[0] - 1, W.shape[1]
        L = _as_float_array(self.L, "L")
        if L.shape != (D, D):
            raise ValueError(f"L must have shape ({D}, {D}), got {L.shape}")
        # (the upper triangle relative to L's scale: an absolute tolerance would drop the
        # upper entries of a small L unnoticed)
        if not np.isfinite(L).all() or not (np.diag(L) > 0).all() \
                or (np.abs(np.triu(L, 1)) > 1e-12 * np.abs(L).max()).any():
            raise ValueError("L must be finite and lower triangular with a positive diagonal")
        alpha = _as_float_array(self.alpha, "alpha")
        beta = _as_float_array(self.beta, "beta")
        for name, v in (("alpha", alpha), ("beta", beta)):
            if v.shape != (M,) or not np.isfinite(v).all():
                raise ValueError(f"{name} must be a finite array of shape ({M},), got shape {v.shape}")
        start = check_startprob(self.startprob, M)
        object.__setattr__(self, "W", _frozen(W))
        object.__setattr__(self, "L", _frozen(np.tril(L)))
        object.__setattr__(self, "alpha", _frozen(alpha))
        object.__setattr__(self, "beta", _frozen(beta))
        object.__setattr__(self, "startprob", _frozen(start))

    def __reduce__(self):
        # through the constructor: a pickled or deep-copied instance is validated and
        # its arrays read-only again (the default copies them writeable)
        return (FHMMParams, (self.W, self.L, self.alpha, self.beta, self.startprob))

    # -- construction ------------------------------------------------------------
    @classmethod
    def from_natural(cls, W, covariance, transmat, startprob=None) -> "FHMMParams":
        """Build from hmmlearn-style parameters.

        ``startprob=None`` uses each chain's stationary probability ``a / (a + b)``.
        Transition probabilities of exactly 0 or 1 are moved to ``1e-12`` from the bound.

        Parameters
        ----------
        W : array_like, shape (M + 1, D)
            Emission weights, one row per chain, the bias last.
        covariance : array_like, shape (D, D)
            Noise covariance Σ (symmetric positive definite).
        transmat : array_like, shape (M, 2, 2)
            Per-chain transition matrices (rows sum to 1).
        startprob : array_like, shape (M,), optional
            ``p(s_1^m = 1)``.

        Returns
        -------
        FHMMParams
        """
        W = check_W(W)
        M, D = W.shape[0] - 1, W.shape[1]
        L = check_covariance(covariance, D)
        try:
            shape = np.shape(transmat)
        except ValueError:      # (ragged: check_transmat says what is wrong)
            shape = ()
        n_given = shape[0] if len(shape) == 3 and shape[1:] == (2, 2) else None
        if n_given == M + 1:   # (a slip as likely as a matrix too many: W without its bias row)
            raise ValueError(f"transmat must have shape ({M}, 2, 2), one 2x2 matrix per chain, got "
                             f"{shape}: W's {M + 1} rows are {M} chain{'s' if M != 1 else ''} and the "
                             f"bias row (the last); for {n_given} chains W needs {n_given + 1} rows")
        A = check_transmat(transmat, M)
        alpha = logit(A[:, 0, 1])
        beta = logit(A[:, 1, 0])
        if startprob is None:
            a, b = sigmoid(alpha), sigmoid(beta)
            startprob = a / (a + b)
        startprob = check_startprob(startprob, M)
        return cls(W=W, L=L, alpha=alpha, beta=beta, startprob=startprob)

    @classmethod
    def random(cls, n_chains: int, n_features: int, random_state=None, scale: float = 1.0,
               noise: float = 0.3, switch: tuple[float, float] = (0.02, 0.2)) -> "FHMMParams":
        """Random parameters for tests and simulations.

        ``W`` entries are ``N(0, scale²)`` (``scale`` ≥ 0), the noise covariance is ``noise²``
        times a random correlation-like matrix (``noise`` > 0), switch probabilities are
        uniform in ``switch`` (a pair ``low ≤ high`` in [0, 1]).

        Parameters
        ----------
        n_chains, n_features : int
            M and D.
        random_state : None, int or numpy Generator, optional
        scale, noise : float
        switch : (float, float)

        Returns
        -------
        FHMMParams
        """
        M = check_positive_int(n_chains, "n_chains")
        D = check_positive_int(n_features, "n_features")
        # (within ±1e150, as the data a fit takes: noise² overflowed to a raw OverflowError
        # beyond, and underflowed to "covariance must be positive definite" below 1e-150)
        scale = check_real(scale, "scale", 0.0, 1e150)
        noise = check_real(noise, "noise", 1e-150, 1e150)
        if not (isinstance(switch, (tuple, list)) and len(switch) == 2):
            raise ValueError(f"switch must be a pair (low, high) of probabilities, got {switch!r}")
        lo = check_real(switch[0], "switch[0]", 0.0, 1.0)
        hi = check_real(switch[1], "switch[1]", lo, 1.0)
        rng = check_random_state(random_state)
        W = scale * rng.standard_normal((M + 1, D))
        B = rng.standard_normal((D, D)) * 0.3
        S = noise**2 * (np.eye(D) + B @ B.T / D)
        A = np.empty((M, 2, 2))
        a = rng.uniform(lo, hi, size=M)
        b = rng.uniform(lo, hi, size=M)
        A[:, 0, 1], A[:, 0, 0] = a, 1 - a
        A[:, 1, 0], A[:, 1, 1] = b, 1 - b
        return cls.from_natural(W, S, A, startprob=rng.uniform(0.2, 0.8, size=M))

    def replace(self, **changes) -> "FHMMParams":
        """A copy with some fields replaced (``W``, ``L``, ``alpha``, ``beta``, ``startprob``)."""
        fields = dict(W=self.W, L=self.L, alpha=self.alpha, beta=self.beta, startprob=self.startprob)
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(f"replace takes the fields {list(fields)}, got {unknown}")
        fields.update(changes)
        return FHMMParams(**fields)

    # -- derived quantities --------------------------------------------------------
    @property
    def n_chains(self) -> int:
        return self.W.shape[0] - 1

    @property
    def n_features(self) -> int:
        return self.W.shape[1]

    @property
    def covariance(self) -> np.ndarray:
        """Σ = L Lᵀ, shape (D, D)."""
        return self.L @ self.L.T

    @property
    def log_diag(self) -> np.ndarray:
        """λ = log diag(L), shape (D,)."""
        return np.log(np.diag(self.L))

    @property
    def transmat(self) -> np.ndarray:
        """Per-chain transition matrices, shape (M, 2, 2), rows sum to 1.

        ``1 - σ(α) = σ(-α)``: from the logits, so a staying probability near 1 keeps its
        small complement (``1.0 - σ(40)`` is exactly 0, ``σ(-40)`` is 4e-18)."""
        A = np.empty((self.n_chains, 2, 2))
        A[:, 0, 0], A[:, 0, 1] = sigmoid(-self.alpha), sigmoid(self.alpha)
        A[:, 1, 0], A[:, 1, 1] = sigmoid(self.beta), sigmoid(-self.beta)
        return A

    @property
    def log_transmat(self) -> np.ndarray:
        """``log A_m(i, j)``, shape (M, 2, 2), computed from the logits without cancellation."""
        la0, la1 = -np.logaddexp(0.0, self.alpha), -np.logaddexp(0.0, -self.alpha)  # log(1-a), log a
        lb0, lb1 = -np.logaddexp(0.0, -self.beta), -np.logaddexp(0.0, self.beta)    # log b, log(1-b)
        out = np.empty((self.n_chains, 2, 2))
        out[:, 0, 0], out[:, 0, 1], out[:, 1, 0], out[:, 1, 1] = la0, la1, lb0, lb1
        return out

    @property
    def log_startprob(self) -> np.ndarray:
        """``log p(s_1^m = j)``, shape (M, 2); column 1 is ``log π_m``."""
        with np.errstate(divide="ignore"):
            return np.stack([np.log1p(-self.startprob), np.log(self.startprob)], axis=1)

    @property
    def stationary(self) -> np.ndarray:
        """Stationary ``P(s^m = 1) = a / (a + b)``, shape (M,).

        Evaluated as ``σ(log a - log b)`` from :attr:`log_transmat` (no cancellation):
        ``a`` and ``b`` both underflow to 0.0 for logits below -745 (``0 / 0``), while the
        ratio stays well defined (``σ(-10)`` for ``α = -800``, ``β = -790``)."""
        lt = self.log_transmat
        return sigmoid(lt[:, 0, 1] - lt[:, 1, 0])

    # -- sampling -------------------------------------------------------------------
    def sample(self, n_samples: int, random_state=None) -> tuple[np.ndarray, np.ndarray]:
        """Draw one sequence.

        Returns
        -------
        X : ndarray, shape (n_samples, D)
        S : ndarray of int8, shape (n_samples, M)
        """
        T = check_positive_int(n_samples, "n_samples")
        rng = check_random_state(random_state)
        M = self.n_chains
        a, b = sigmoid(self.alpha), sigmoid(self.beta)
        u = rng.random((T, M))
        S = np.empty((T, M), dtype=np.int8)
        S[0] = u[0] < self.startprob
        for t in range(1, T):
            prev = S[t - 1].astype(bool)
            S[t] = np.where(prev, u[t] >= b, u[t] < a)
        mean = S @ self.W[:M] + self.W[M]
        X = mean + rng.standard_normal((T, self.n_features)) @ self.L.T
        return X, S
