"""The public estimator :class:`FHMM`.

Constructor arguments are stored as given (scikit-learn convention); fitted state has
a trailing underscore: ``W_`` (M+1, D), ``covariance_`` (D, D), ``transmat_`` (M, 2, 2),
``startprob_`` (M,).
"""
from __future__ import annotations

import numpy as np

from . import exact
from ._validation import check_observations, check_positive_int, check_random_state
from .model import FHMMParams

__all__ = ["FHMM"]

_SHARE = ("chain", "all")


class FHMM:
    """Factorial hidden Markov model with binary chains and Gaussian noise.

    ``y_t ~ N(Wᵀ ŝ_t, Σ)`` with ``ŝ_t = [s_t^1 … s_t^M, 1]`` and M independent two-state
    Markov chains (MATH.md §1).

    Parameters
    ----------
    n_chains : int
        Number of hidden binary chains M.
    window : int
        Odd width ``2h + 1`` of the recognition networks' input window.
    n_hidden : int
        Hidden tanh units per recognition network (per chain when
        ``share_hidden="chain"``, in total when ``share_hidden="all"``).
    share_hidden : {"chain", "all"}
        ``"chain"``: one hidden layer per chain, shared by its θ and ρ heads (the
        paper's simulated experiments); ``"all"``: one hidden layer shared by all
        2M heads (the paper's household power experiment).
    random_state : int, numpy Generator or None
        Seed for initialisation and subchain sampling.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfhmm import FHMM
    >>> A = np.array([[[0.95, 0.05], [0.1, 0.9]]] * 2)
    >>> m = FHMM.from_params(W=[[1.0, 0.0], [0.0, 2.0], [0.5, 0.5]], covariance=0.1 * np.eye(2),
    ...                      transmat=A, startprob=[0.5, 0.5])
    >>> X, S = m.sample(100, random_state=0)
    >>> X.shape, S.shape, m.predict_proba(X).shape
    ((100, 2), (100, 2), (100, 2))
    """

    def __init__(self, n_chains: int = 4, window: int = 5, n_hidden: int = 30,
                 share_hidden: str = "chain", random_state=None):
        self.n_chains = n_chains
        self.window = window
        self.n_hidden = n_hidden
        self.share_hidden = share_hidden
        self.random_state = random_state

    # -- construction --------------------------------------------------------------
    def _check_hyperparameters(self):
        check_positive_int(self.n_chains, "n_chains")
        w = check_positive_int(self.window, "window")
        if w % 2 == 0:
            raise ValueError(f"window must be odd (2h + 1 samples centred on t), got {w}")
        check_positive_int(self.n_hidden, "n_hidden")
        if self.share_hidden not in _SHARE:
            raise ValueError(f"share_hidden must be one of {_SHARE}, got {self.share_hidden!r}")

    @classmethod
    def from_params(cls, W, covariance, transmat, startprob=None, **kwargs) -> "FHMM":
        """An FHMM with known parameters.

        Parameters
        ----------
        W : array_like, shape (M+1, D)
            Chain contributions; the last row is the bias.
        covariance : array_like, shape (D, D)
            Symmetric positive-definite noise covariance Σ.
        transmat : array_like, shape (M, 2, 2)
            Per-chain transition matrices (rows sum to 1).
        startprob : array_like, shape (M,), optional
            ``P(s_1^m = 1)``; default each chain's stationary probability.
        **kwargs
            Constructor arguments (window, n_hidden, ...).
        """
        params = FHMMParams.from_natural(W, covariance, transmat, startprob)
        model = cls(n_chains=params.n_chains, **kwargs)
        model._check_hyperparameters()
        model._set_params(params)
        return model

    def _set_params(self, params: FHMMParams):
        self.params_ = params
        self.n_features_in_ = params.n_features

    # -- fitted attributes ---------------------------------------------------------
    def _require_params(self) -> FHMMParams:
        params = getattr(self, "params_", None)
        if params is None:
            raise ValueError("this FHMM has no parameters yet: call fit(X) or build it with "
                             "FHMM.from_params(...)")
        return params

    @property
    def W_(self) -> np.ndarray:
        """Chain contributions and bias (last row), shape (M+1, D)."""
        return self._require_params().W.copy()

    @property
    def covariance_(self) -> np.ndarray:
        """Noise covariance Σ, shape (D, D)."""
        return self._require_params().covariance

    @property
    def transmat_(self) -> np.ndarray:
        """Per-chain transition matrices, shape (M, 2, 2)."""
        return self._require_params().transmat

    @property
    def startprob_(self) -> np.ndarray:
        """``P(s_1^m = 1)``, shape (M,)."""
        return self._require_params().startprob.copy()

    # -- inference -------------------------------------------------------------------
    def sample(self, n_samples: int, random_state=None):
        """Draw a sequence from the model.

        Returns
        -------
        X : ndarray, shape (n_samples, D)
        S : ndarray of int8, shape (n_samples, M)
            The true chain states.
        """
        return self._require_params().sample(n_samples, check_random_state(random_state))

    def score(self, X, lengths=None) -> float:
        """Exact total log-likelihood ``log p(X)`` (forward algorithm, MATH.md §7).

        Parameters
        ----------
        X : array_like, shape (T, D)
        lengths : array_like of int, optional
            Lengths of the sequences concatenated in X.
        """
        params = self._require_params()
        return exact.log_likelihood(params, X, lengths)

    def predict_proba(self, X, lengths=None, method: str = "exact") -> np.ndarray:
        """Posterior marginals ``q(s_t^m = 1)``, shape (T, M).

        Parameters
        ----------
        X : array_like, shape (T, D)
        lengths : array_like of int, optional
        method : {"exact"}
            ``"exact"``: exact smoothing marginals over the 2^M joint states.
        """
        params = self._require_params()
        if method == "exact":
            return exact.smoothed_marginals(params, X, lengths)[1]
        raise ValueError(f"method must be one of ('exact',), got {method!r}")

    def __repr__(self) -> str:
        return (f"FHMM(n_chains={self.n_chains!r}, window={self.window!r}, n_hidden={self.n_hidden!r}, "
                f"share_hidden={self.share_hidden!r}, random_state={self.random_state!r})")
