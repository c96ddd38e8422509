"""river adapters: a factorial HMM as a river transformer and a river anomaly detector.

* :class:`FHMMTransformer` (a :class:`river.base.Transformer`): each sample becomes the
  filtered posterior of every hidden chain, ``{"chain_0": θ_t^0, "chain_1": θ_t^1, …}``.
* :class:`FHMMAnomalyScorer` (a :class:`river.base.AnomalyDetector`): each sample is
  scored by its negative predictive log-density ``-log p(x_t | x_1..x_{t-1})``.

Both run a :class:`~streamfhmm.stream.engine.StreamEngine` in filter mode (the
posterior of the newest sample at once). An unfitted model is initialised from a
warm-up of the first ``warmup`` samples; with ``learn=True`` the engine's background
learner then keeps learning from a reservoir of the stream.

The stream contract
-------------------
``learn_one(x)`` is the only call that advances the stream: ``x`` is pushed to the
engine exactly once, becomes the newest sample of the window (or of the forward
message) and is offered to the learner. ``transform_one(x)`` and ``score_one(x)`` change
nothing: they evaluate ``x`` as the *next* sample of the stream — what it would get if
it were learnt now. Called with the very dict last passed to ``learn_one`` (the same
object, values unchanged) they return that sample's committed result instead. So both
river idioms push each sample once:

* prequential: ``s = m.score_one(x); m.learn_one(x)`` (evaluate, then commit);
* pipelines: ``Pipeline.learn_one`` calls ``learn_one(x)`` then ``transform_one(x)``
  on a step that has steps after it (commit, then read).

The committed result is recognised by the dict object only. A transformer that is the
*last* step of a pipeline is only learnt by ``Pipeline.learn_one``; a later
``pipe.transform_one(x)`` hands it the dict the steps before it build anew (e.g. the
output of a ``StandardScaler``), an equal but different object: it returns the preview
of x taken as the next sample, as if x came twice in a row, not the result committed
for x. There, read in the prequential order, ``pipe.transform_one(x)`` then
``pipe.learn_one(x)``: each sample is then read once, as the next sample.

``learn_one`` advances the stream whether or not the parameters are learning: with
``learn=False`` the model is fitted on the warm-up and then held fixed (the
:attr:`~FHMMTransformer.learning` switch pauses and resumes the learner at run time).
Before the warm-up is complete ``transform_one`` returns ``{}`` and ``score_one``
returns ``0.0``. A fitted model with ``posterior="exact"`` has no warm-up: when the
feature order is known (``features``, or the model's feature names), the first sample
is evaluated before any ``learn_one`` too (from the model's start probabilities).

Features
--------
The feature order is fixed at the first ``learn_one``: the ``features`` argument; else,
for a model that names its features (``feature_names_in_``, as ``streamfhmm fit``
saves them), the model's order; else the first dict's keys sorted (so the order in
which a dict lists its keys never matters). With a model that names its features,
``features`` must be those names in the model's order, and a first dict none of whose
keys is one of them is refused (ValueError: the columns would not reach the model's
inputs). A missing key, or ``None``, is a missing value (NaN: marginalised in the
emission density, imputed in the recognition window); a key outside the fixed set is
ignored, with one :class:`UnknownFeatureWarning` per instance and a count afterwards
(``metrics()["unknown_key_samples"]``). Values must be real numbers; an infinity is an
error.

Threads and pickling
--------------------
The engine's learner runs in a daemon thread from the end of the warm-up (for a fitted
model with ``posterior="exact"``, from the first ``learn_one``). ``learn=False`` still
needs the learner to fit the warm-up (the parameters, or a new recognition network):
the thread is started all the same and stays paused until the
:attr:`~FHMMTransformer.learning` switch resumes it. Only a fitted model with
``posterior="exact"`` and ``learn=False``, which needs no fit, runs without a learner
thread. :meth:`~FHMMTransformer.close` stops the thread, and so does garbage collection
of the adapter.

Pickling never touches the thread: the state is the engine's checkpoint (model
parameters, network weights and scaler, optimiser state, reservoir, window and
forward-message contents, counters) plus the adapter's feature order and counters;
unpickling rebuilds the engine and restarts the learner thread if it was learning.
Two pickles of an idle adapter are byte-identical. The engine's settings go with it: an
unpickled copy of an adapter whose ``engine_params`` set ``checkpoint_path`` writes its
checkpoints to that same file, as the original does (a
:meth:`~FHMMTransformer.clone` with ``include_attributes=True`` writes none).
"""
from __future__ import annotations

import collections.abc
import copy
import inspect
import math
import numbers
import os
import pickle
import tempfile
import warnings

import numpy as np
from scipy.linalg import solve_triangular

try:
    from river import base as _river_base
except ImportError:  # pragma: no cover - exercised only without the extra
    raise ImportError("streamfhmm.adapters.river needs river: pip install 'streamfhmm[river]'") \
        from None

from .._validation import check_bool, check_positive_int
from ..estimator import FHMM, _model_names
from ..exact import MAX_EXACT_CHAINS
from ..io.checkpoint import load_checkpoint, save_checkpoint
from ..kernels import exact as _kx
from ..kernels import online as _ko
from ..kernels import recognition as _rk
from ..model import FHMMParams, sigmoid
from ..stream.engine import _RUNTIME_OVERRIDES, StreamEngine
from ..stream.learner import ExactTables

__all__ = ["FHMMTransformer", "FHMMAnomalyScorer", "UnknownFeatureWarning",
           "predicted_on_probability", "mixture_logpdf", "gaussian_logpdf",
           "EXACT_SCORER_MAX_CHAINS", "MIXTURE_MAX_CHAINS"]

#: ``FHMMAnomalyScorer(posterior="auto")`` filters exactly up to this many chains
EXACT_SCORER_MAX_CHAINS = 12
#: ``predictive="auto"``: the 2^M-component mixture up to this many chains, else the
#: moment-matched Gaussian
MIXTURE_MAX_CHAINS = 10

LOG_2PI = math.log(2.0 * math.pi)

#: StreamEngine arguments the adapters set themselves
_RESERVED = ("model", "mode", "learn", "posterior", "n_features", "warmup", "warmup_steps",
             "warmup_time", "reservoir_size", "batch_size", "learning_rate", "random_state")


def _engine_arguments() -> frozenset:
    """The keyword arguments ``engine_params`` may give the StreamEngine."""
    names = inspect.signature(StreamEngine.__init__).parameters
    return frozenset(names) - {"self", *_RESERVED}


#: adapter parameters a copy with the state (``clone(new_params, include_attributes=True)``)
#: may change: the scorer's predictive density (read at each score), and what
#: StreamEngine.resume applies to the copied engine (the learner's step size, a new seed)
_CLONE_FREE = ("predictive", "learning_rate", "seed")
#: engine_params' settings a copy's engine never writes checkpoints with
_CHECKPOINT_SETTINGS = ("checkpoint_path", "checkpoint_every", "checkpoint_seconds")
#: engine_params keys such a copy may change: resume's run-time overrides but the
#: checkpoint settings (never applied to a copy) and learn_samples (a limit counted over
#: the stream, which a resumed engine without a learner ignored)
_CLONE_FREE_ENGINE = tuple(k for k in _RUNTIME_OVERRIDES
                           if k not in _RESERVED and k != "learn_samples"
                           and k not in _CHECKPOINT_SETTINGS)


def _same_param(a, b) -> bool:
    """Whether two parameter values are the same: equal numbers and strings, sequences
    and dicts of the same values, other objects (a model, a network) identical or
    pickled to the same bytes (river's clone deep-copies every parameter)."""
    if a is b:
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_param(u, v) for u, v in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_param(a[k], b[k]) for k in a)
    plain = (numbers.Number, str, bytes, type(None))
    if isinstance(a, plain) or isinstance(b, plain):
        try:
            return bool(a == b)
        except Exception:   # (an array against a number)
            return False
    try:
        return pickle.dumps(a) == pickle.dumps(b)
    except Exception:
        return False


class UnknownFeatureWarning(UserWarning):
    """A sample holds keys outside the feature set fixed at the first ``learn_one``."""


# --------------------------------------------------------------------------------------
# the predictive density from per-chain marginals
# --------------------------------------------------------------------------------------
def _check_params_arg(params) -> FHMMParams:
    """``params`` must be the model's parameters (an estimator has no n_features, alpha,
    ...: AttributeError from deep inside)."""
    if not isinstance(params, FHMMParams):
        hint = " (e.g. model.params_)" if not isinstance(params, FHMM) else (
            ": pass model.params_ of a fitted FHMM, not the estimator")
        raise ValueError(f"params must be FHMMParams{hint}, got {type(params).__name__}")
    return params


def _as_floats(v, name) -> np.ndarray:
    try:
        return np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):   # strings, dicts, ragged lists: numpy's message
        raise ValueError(f"{name} must be an array of real numbers, got "   # named nothing
                         f"{type(v).__name__} {v!r:.60}") from None


def _check_tables(tables, params: FHMMParams):
    """``tables`` must be :func:`kernels.exact.prepare_emission`'s ``(Linv, Ut, half_c,
    const)`` for ``params``' shapes (the compiled kernel indexes them unchecked)."""
    M, D = params.n_chains, params.n_features
    want = "kernels.exact.prepare_emission(params.W, params.L): (Linv, Ut, half_c, const)"
    if not isinstance(tables, tuple) or len(tables) != 4:
        raise ValueError(f"tables must be {want}, got {type(tables).__name__} {tables!r:.60}")
    Linv, Ut, half_c, const = tables
    for name, a, shape in (("Linv", Linv, (D, D)), ("Ut", Ut, (M, D)),
                           ("half_c", half_c, (1 << M,))):
        if not (isinstance(a, np.ndarray) and a.dtype == np.float64 and a.shape == shape):
            got = (f"{a.dtype} array of shape {a.shape}" if isinstance(a, np.ndarray)
                   else type(a).__name__)
            raise ValueError(f"tables must be {want}; its {name} must be a float64 array of "
                             f"shape {shape} for this model, got {got}")
    if isinstance(const, (bool, np.bool_)) or not isinstance(const, numbers.Real):
        raise ValueError(f"tables must be {want}; its const must be a real number, got "
                         f"{type(const).__name__}")


def _check_probabilities(p, name, M) -> np.ndarray:
    p = _as_floats(p, name)
    if p.shape != (M,):
        raise ValueError(f"{name} must have shape ({M},): one probability per chain, got shape "
                         f"{p.shape}")
    if not ((p >= 0.0) & (p <= 1.0)).all():  # NaN too
        raise ValueError(f"{name} must lie in [0, 1], got {p}")
    return p


def _check_density_args(y, on_prob, params: FHMMParams):
    """``y`` (D,) finite or NaN and ``on_prob`` (M,) in [0, 1], as float64 arrays. (The
    emission kernels index y by the model's D without bounds checks.)"""
    y = np.ascontiguousarray(_as_floats(y, "y"))
    D = params.n_features
    if y.shape != (D,):
        raise ValueError(f"y must have shape ({D},): one value per feature of the model, got "
                         f"shape {y.shape}")
    if np.isinf(y).any():
        raise ValueError("y must be finite (NaN for a missing value), got an infinity")
    return y, _check_probabilities(on_prob, "on_prob", params.n_chains)


def predicted_on_probability(theta, params: FHMMParams) -> np.ndarray:
    """One-step prediction of each chain's on-probability.

    Parameters
    ----------
    theta : array_like, shape (M,) or None
        Filtered ``q(s_{t-1}^m = 1)``; ``None`` at the start of a sequence.
    params : FHMMParams
        The model's parameters (``model.params_``).

    Returns
    -------
    ndarray, shape (M,)
        ``π_t^m = θ_{t-1}^m (1 - b_m) + (1 - θ_{t-1}^m) a_m`` (``params.startprob`` when
        ``theta`` is None), with ``a = P(0→1)``, ``b = P(1→0)``.

    Notes
    -----
    MATH.md §1 (the chain transitions). Strictly inside (0, 1) since a, b are.
    """
    _check_params_arg(params)
    if theta is None:
        return np.array(params.startprob, dtype=np.float64)
    theta = _check_probabilities(theta, "theta", params.n_chains)
    a, b = sigmoid(params.alpha), sigmoid(params.beta)
    return theta * (1.0 - b) + (1.0 - theta) * a


def _log_weights(on_prob) -> np.ndarray:
    """``log Π_m π_m^{s_m} (1-π_m)^{1-s_m}`` for every joint state (bit m of k is s^m);
    -inf for the states a probability of 0 or 1 rules out."""
    lw = np.zeros(1)
    for p in on_prob:
        lw = np.concatenate([lw + (math.log1p(-p) if p < 1.0 else -math.inf),
                             lw + (math.log(p) if p > 0.0 else -math.inf)])
    return lw


def _logsumexp(v) -> float:
    mx = float(v.max())
    if not math.isfinite(mx):
        return mx
    return mx + math.log(float(np.exp(v - mx).sum()))


def mixture_logpdf(y, on_prob, params: FHMMParams, tables=None) -> float:
    """Log-density of ``y`` under the mixture over the 2^M joint states.

    Parameters
    ----------
    y : ndarray, shape (D,)
        NaN marks a missing value (marginalised; nothing observed gives 0).
    on_prob : ndarray, shape (M,)
        Independent on-probabilities ``π_m`` of the chains (the mixture weights are
        ``Π_m π_m^{s_m} (1-π_m)^{1-s_m}``).
    params : FHMMParams
        The model's parameters (``model.params_``).
    tables : tuple, optional
        ``kernels.exact.prepare_emission(params.W, params.L)``, when cached.

    Returns
    -------
    float
        ``log Σ_s w(s) N(y; Wᵀŝ, Σ)``; ``-inf`` when it is below the float range (a
        sample so far from the model that ``½‖L⁻¹(y - μ)‖²`` overflows, as the exact
        filter has it: :func:`~streamfhmm.kernels.exact.leave_out_overflow`).

    Raises
    ------
    ValueError
        ``y`` is not of shape (D,) or holds an infinity; ``on_prob`` is not of shape (M,)
        or leaves [0, 1]; ``params`` is not an :class:`~streamfhmm.model.FHMMParams`;
        ``tables`` is not the 4-tuple of ``prepare_emission`` for this model's shapes.

    Notes
    -----
    MATH.md §7 (the whitened emission, state by state); O(2^M (M + D)).
    """
    _check_params_arg(params)
    if tables is not None:
        _check_tables(tables, params)
    return _mixture_logpdf(y, on_prob, params, tables)


def _mixture_logpdf(y, on_prob, params: FHMMParams, tables) -> float:
    """:func:`mixture_logpdf` for ``params`` and ``tables`` known good (the scorer's own,
    per sample)."""
    M = params.n_chains
    if M > MAX_EXACT_CHAINS:
        raise ValueError(f"the mixture has 2^M components; M={M} > {MAX_EXACT_CHAINS}")
    y, on_prob = _check_density_args(y, on_prob, params)
    missing = np.isnan(y)
    if missing.all():
        return 0.0
    le = np.empty(1 << M)
    if missing.any():
        mx = _ko.log_emission_missing(y, params.W, params.L, le)
    else:
        if tables is None:
            tables = _kx.prepare_emission(params.W, params.L)
        Linv, Ut, half_c, const = tables
        mx = _kx.log_emission(y, params.W[-1], Linv, Ut, half_c, const, np.empty(y.shape[0]),
                              le)
    # a finite y whose log densities overflow (-inf, or NaN from inf - inf): below the
    # float range, -inf as the exact filter's log p(y_t | y_<t) (it was NaN: the
    # recognition scorer's score of the most anomalous samples, never flagged)
    if not _kx.leave_out_overflow(le, mx)[1]:
        return -math.inf
    return _logsumexp(_log_weights(on_prob) + le)


def gaussian_logpdf(y, on_prob, params: FHMMParams) -> float:
    """Log-density of ``y`` under the Gaussian with the mixture's mean and covariance.

    Parameters
    ----------
    y : ndarray, shape (D,)
        NaN marks a missing value (marginalised; nothing observed gives 0).
    on_prob : ndarray, shape (M,)
        Independent on-probabilities ``π_m``.
    params : FHMMParams
        The model's parameters (``model.params_``).

    Returns
    -------
    float
        ``log N(y; μ, C)`` with ``μ = w_0 + Σ_m π_m w_m`` and
        ``C = Σ + Σ_m π_m (1-π_m) w_m w_mᵀ`` (moment matching of :func:`mixture_logpdf`);
        ``-inf`` when it is below the float range (``½‖C^{-½}(y - μ)‖²`` overflows).

    Raises
    ------
    ValueError
        As :func:`mixture_logpdf`.

    Notes
    -----
    MATH.md §1 (the emission); O((D + M) D²). ``C = B Bᵀ`` with ``B = [L, W_cᵀ
    diag(√(π(1-π)))]`` (D, D + M), and ``C_oo = Rᵀ R`` from the QR factorisation of
    ``B_oᵀ`` (the observed rows of B): C is never formed, so the density is finite
    whenever L is a valid factor. (The Cholesky of a formed C failed for a valid L with
    ``cond(Σ) ~ 1e16``: ``1 + ε²`` rounds to 1.)
    """
    return _gaussian_logpdf(y, on_prob, _check_params_arg(params))


def _gaussian_logpdf(y, on_prob, params: FHMMParams) -> float:
    """:func:`gaussian_logpdf` for ``params`` known good (the scorer's own, per sample)."""
    y, p = _check_density_args(y, on_prob, params)
    Wc = params.W[:-1]
    mu = params.W[-1] + p @ Wc
    obs = ~np.isnan(y)
    n = int(obs.sum())
    if n == 0:
        return 0.0
    B = np.hstack([params.L, Wc.T * np.sqrt(p * (1.0 - p))])
    R = np.linalg.qr(B[obs].T, mode="r")   # B_oᵀ = Q R: C_oo = Rᵀ R (R's diagonal of any sign)
    with np.errstate(over="ignore", invalid="ignore"):   # (a y far beyond the model's scale)
        z = solve_triangular(R, y[obs] - mu[obs], trans="T", lower=False, check_finite=False)
        zz = float(z @ z)
    if not math.isfinite(zz):   # overflowed (inf, or NaN from inf - inf): below the range
        return -math.inf
    return float(-0.5 * (n * LOG_2PI + zz) - np.log(np.abs(np.diag(R))).sum())


def _chain_marginals(alpha, M) -> np.ndarray:
    """``θ_m = Σ_{k: bit m set} α_k``, shape (M,)."""
    out = np.empty(M)
    for m in range(M):
        out[m] = alpha.reshape(-1, 2, 1 << m)[:, 1, :].sum()
    return out


def _sorted_keys(keys) -> tuple:
    keys = list(keys)
    try:
        return tuple(sorted(keys))
    except TypeError:  # keys of mixed types
        return tuple(sorted(keys, key=lambda k: (type(k).__qualname__, repr(k))))


def _as_value(key, value) -> float:
    kind = type(value)
    if kind is float or kind is int or (value is not None
                                        and isinstance(value, (numbers.Real, np.bool_))):
        try:
            v = float(value)
        except OverflowError:  # an int or Fraction beyond the float range
            raise ValueError(f"feature {key!r} is {value!s:.40}: a value must be finite (use "
                             f"NaN, None or leave the key out for a missing value)") from None
    elif value is None:
        return math.nan
    else:
        raise ValueError(f"feature {key!r} has a value of type {kind.__name__}; the FHMM "
                         f"adapters take real numbers (None or NaN for a missing value)")
    if v - v != 0.0 and v == v:  # ±inf (NaN is a missing value)
        raise ValueError(f"feature {key!r} is {v}: a value must be finite (use NaN, None or "
                         f"leave the key out for a missing value)")
    return v


def _exact_score(logc, v) -> float:
    """``-log p(x_t | x_<t)`` from the exact filter's ``logc``; 0.0 for a sample with
    nothing observed (its density is 1: the filter's sum of the prediction rounds to
    1 ± 2e-16, and the score was ±2.2e-16)."""
    return 0.0 if np.isnan(v).all() else -float(logc)


def _check_model_features(model, features):
    """ValueError unless a fitted ``model`` has one feature per key of ``features`` and,
    when the model names its features, ``features`` are those names in its order."""
    names = _model_names(model)
    if names is not None and tuple(features) != names:
        raise ValueError(f"features {list(features)} contradict the model's feature names "
                         f"{list(names)} (its feature_names_in_, in its column order): pass "
                         f"features=None (the model's order) or those names in that order")
    params = getattr(model, "params_", None)
    if params is not None and params.n_features != len(features):
        raise ValueError(f"the model has {params.n_features} features, the stream "
                         f"{len(features)}: {list(features)}")


def _check_sample(x, owner, method):
    """``x`` must be a dict (a mapping of feature name → value), as river passes."""
    if not isinstance(x, collections.abc.Mapping) and not (
            callable(getattr(x, "items", None)) and callable(getattr(x, "keys", None))):
        raise ValueError(f"{type(owner).__name__}.{method} takes a dict of feature name → "
                         f"value (river's sample), got {type(x).__name__}")


# --------------------------------------------------------------------------------------
# the shared machinery
# --------------------------------------------------------------------------------------
class _StreamAdapter:
    """Feature handling, the engine's life cycle, the committed state, previews and
    pickling, shared by the two river estimators."""

    # -- construction -------------------------------------------------------------------
    def _check_params(self):
        if isinstance(self.n_chains, FHMM):   # FHMMTransformer(model): the first argument
            raise ValueError("n_chains must be an integer, got an FHMM: pass a fitted model as "
                             "model=... (the first positional argument is n_chains)")
        if self.model is not None:
            if not isinstance(self.model, FHMM):
                raise ValueError(f"model must be an FHMM or None, got {type(self.model).__name__}")
            self.model._check_hyperparameters()
        else:
            FHMM(n_chains=self.n_chains, window=self.window, n_hidden=self.n_hidden,
                 share_hidden=self.share_hidden)._check_hyperparameters()
        check_positive_int(self.warmup, "warmup", minimum=2)
        check_positive_int(self.warmup_steps, "warmup_steps", minimum=0)
        check_positive_int(self.reservoir_size, "reservoir_size")
        check_positive_int(self.batch_size, "batch_size")
        for name in ("warmup_time", "learning_rate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (
                    math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        if not isinstance(self.learn, (bool, np.bool_)):
            raise ValueError(f"learn must be True or False, got {self.learn!r}")
        if self.seed is not None and (isinstance(self.seed, (bool, np.bool_))
                                      or not isinstance(self.seed, numbers.Integral)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if self.features is not None:
            if not isinstance(self.features, collections.abc.Sequence):  # an iterator
                # would be used up by this check, leaving no features for learn_one
                raise ValueError(f"features must be a non-empty sequence of distinct keys "
                                 f"(a list or tuple), got {type(self.features).__name__}")
            feats = tuple(self.features) if not isinstance(self.features, (str, bytes)) else ()
            try:
                distinct = len(set(feats))
            except TypeError:  # an unhashable key
                raise ValueError(f"features must be hashable keys (the dicts' keys), got "
                                 f"{self.features!r}") from None
            if not feats or distinct != len(feats):
                raise ValueError(f"features must be a non-empty sequence of distinct keys, got "
                                 f"{self.features!r}")
            if self.model is not None:
                _check_model_features(self.model, feats)
        if self.engine_params is not None:
            if not isinstance(self.engine_params, dict):
                raise ValueError(f"engine_params must be a dict or None, got "
                                 f"{type(self.engine_params).__name__}")
            bad = sorted(set(self.engine_params) & set(_RESERVED))
            if bad:
                raise ValueError(f"engine_params must not set {bad}: they are the adapter's own "
                                 f"arguments (or fixed by it)")
            allowed = _engine_arguments()
            unknown = [k for k in self.engine_params if k not in allowed]
            if unknown:
                raise ValueError(f"engine_params has unknown StreamEngine arguments {unknown}; "
                                 f"expected some of {sorted(allowed)}")
        M = self._structure()[0]
        if self._resolved_posterior() == "exact" and M > MAX_EXACT_CHAINS:
            raise ValueError(f"posterior='exact' is limited to n_chains <= {MAX_EXACT_CHAINS}, "
                             f"got {M}")
        self._init_state()

    def _structure(self):
        m = self.model if self.model is not None else self
        return m.n_chains, m.window, m.n_hidden, m.share_hidden

    def _init_state(self):
        self._features = None
        self._index = None
        self._D = 0
        self._keys_out = tuple(f"chain_{m}" for m in range(self._structure()[0]))
        self._closed = False
        self._saved = None
        self._learning = bool(self.learn)
        self._n_learned = 0
        self._n_unknown = 0
        self._n_missing = 0
        self._warned = False
        self._ready = False
        self._last_x = None
        self._last_theta = None
        self._prev_theta = None
        self._last_logc = math.nan
        self._alpha = None
        self._win = None
        self._init_transient()

    #: the state pickling drops and rebuilds: the engine, the dict last learnt (not its
    #: id: ids are reused), scratch and caches, the engine's metrics once closed, the
    #: error that kept close() from saving the final state
    _TRANSIENT = ("_engine", "_last_obj", "_net_cache", "_table_cache", "_state_cache",
                  "_exact_work", "_final_metrics", "_save_error")

    def _init_transient(self):
        """Set :attr:`_TRANSIENT` to None."""
        for k in self._TRANSIENT:
            setattr(self, k, None)

    # -- public helpers -------------------------------------------------------------------
    @property
    def engine(self) -> StreamEngine | None:
        """The :class:`~streamfhmm.stream.engine.StreamEngine` (None before the first
        ``learn_one`` and after :meth:`close`)."""
        return self._engine

    @property
    def features_(self) -> tuple | None:
        """The fixed feature order (None before the first ``learn_one``)."""
        return self._features

    @property
    def ready(self) -> bool:
        """Whether the model is initialised (the warm-up is complete)."""
        return self._ready

    @property
    def learning(self) -> bool:
        """Whether the background learner takes steps; assignable at run time (pauses and
        resumes it) with True or False. ``learn=False`` starts with it off; a fitted model
        with ``posterior="exact"`` and ``learn=False`` has no learner once the first sample
        is learnt, and switching it on then raises ValueError. A closed adapter refuses
        the switch (RuntimeError): its final state, which pickling keeps, is fixed."""
        if self._engine is not None:
            return self._engine.learning
        return self._learning  # (once closed: the engine's last)

    @learning.setter
    def learning(self, value: bool):
        self._check_open()
        value = check_bool(value, "learning")
        if self._engine is not None:
            self._engine.learning = value
        self._learning = value
        self._state_cache = None

    def metrics(self) -> dict:
        """The engine's :meth:`~streamfhmm.stream.engine.StreamEngine.metrics` and the
        adapter's counters: ``learned`` samples, ``unknown_key_samples`` (learnt samples
        with a key outside the feature set), ``missing_value_samples`` (learnt samples with
        a missing feature), ``imputed_starts`` (1 when the warm-up held too few complete
        samples and the parameters started from mean-imputed ones: the engine's
        ``imputed_start``), ``ready``. A closed adapter reports the engine's final
        metrics."""
        if self._engine is not None:
            out = dict(self._engine.metrics())
        else:
            out = dict(self._final_metrics or {})
        out.update(learned=self._n_learned, unknown_key_samples=self._n_unknown,
                   missing_value_samples=self._n_missing,
                   imputed_starts=int(out.get("imputed_start", False)), ready=self._ready)
        return out

    def close(self) -> None:
        """Stop the learner thread and end the stream; idempotent.

        The adapter keeps its final state, so it can still be pickled (an unpickled copy
        is open again), and reports what the engine last had (:attr:`learning`,
        :meth:`metrics`); ``learn_one``, ``transform_one``, ``score_one`` and setting
        :attr:`learning` raise afterwards.

        Raises
        ------
        RuntimeError
            The final state could not be saved (the engine's checkpoint failed, e.g. no
            space left for its temporary file). The adapter is closed all the same (the
            learner thread stopped, :meth:`metrics` the engine's last), but it cannot be
            pickled or cloned with its attributes: that raises RuntimeError too. The
            error that stopped the save is the cause (``__cause__``).
        """
        if self._closed:
            return
        engine = self._engine
        error = None
        if engine is not None:
            try:
                self._learning = engine.learning
                self._saved = self._engine_state()
            except BaseException as exc:   # closed all the same (it was left half open:
                error = exc                # no engine, not closed, raw errors from every call)
            self._save_error = error
            self._engine = None
            self._state_cache = None
            self._closed = True
            engine.close()   # (does not raise: a failed last checkpoint goes to its metrics)
            self._final_metrics = engine.metrics()
        self._closed = True
        if error is not None:
            if not isinstance(error, Exception):   # (KeyboardInterrupt, ...)
                raise error
            raise RuntimeError(f"{type(self).__name__} closed, but its final state could not be "
                               f"saved ({type(error).__name__}: {error}): it cannot be pickled "
                               f"or cloned with its attributes") from error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self):
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed")

    # -- river hooks ----------------------------------------------------------------------
    @classmethod
    def _unit_test_params(cls):
        small = dict(n_chains=2, window=3, n_hidden=4, warmup=100, warmup_steps=20,
                     reservoir_size=50, batch_size=4, seed=42)
        yield dict(small, learn=False)
        yield dict(small, learn=True, engine_params={"snapshot_interval": 5, "net_burnin": 10})

    def _unit_test_skips(self) -> set:
        if self.learn:  # outputs depend on when the learner thread publishes a snapshot
            return {"check_shuffle_features_no_impact", "check_seeding_is_idempotent"}
        return set()

    # -- features -------------------------------------------------------------------------
    def _known_features(self) -> tuple | None:
        """The feature order known before any sample: the ``features`` argument, else the
        model's feature names (None when neither is there)."""
        if self.features is not None:
            return tuple(self.features)
        return _model_names(self.model)

    def _fix_features(self, x):
        feats = self._known_features()
        if feats is None:
            if not x:
                raise ValueError(f"{type(self).__name__}.learn_one got an empty dict: the first "
                                 f"sample fixes the feature set (or pass features=...)")
            feats = _sorted_keys(x.keys())
        elif self.features is None and x and not any(k in feats for k in x.keys()):
            # (every value would be missing, and every key unknown)
            shown = _sorted_keys(x.keys())
            raise ValueError(f"{type(self).__name__}.learn_one: the first sample's keys "
                             f"{list(shown[:8])}{' ...' if len(shown) > 8 else ''} name none of "
                             f"the model's features {list(feats)} (its feature_names_in_); "
                             f"name the dict's keys as the model does")
        self._features = feats
        self._index = {k: j for j, k in enumerate(feats)}
        self._D = len(feats)

    def _vector(self, x, idx=None):
        """x as a (D,) vector in the fixed order (``idx``: feature → column, default the
        fixed one); returns (vector, number of unknown keys)."""
        if idx is None:
            idx = self._index
        v = np.full(len(idx), np.nan)
        unknown = 0
        for k, value in x.items():
            j = idx.get(k)
            if j is None:
                unknown += 1
            else:
                v[j] = _as_value(k, value)
        if unknown and not self._warned:
            self._warned = True
            names = [k for k in x if k not in idx]
            shown = ", ".join(repr(k) for k in names[:5]) + (", ..." if len(names) > 5 else "")
            warnings.warn(f"{type(self).__name__}: ignoring key(s) {shown} outside the "
                          f"{len(idx)} features fixed at the first learn_one; further samples "
                          f"with unknown keys are counted in metrics()['unknown_key_samples'] "
                          f"without a warning", UnknownFeatureWarning, stacklevel=3)
        return v, unknown

    def _is_last(self, x, v) -> bool:
        return (x is self._last_obj and self._last_obj is not None
                and np.array_equal(v, self._last_x, equal_nan=True))

    # -- the engine -----------------------------------------------------------------------
    def _resolved_posterior(self) -> str:
        return self.posterior

    @property
    def _exact(self) -> bool:
        return self._resolved_posterior() == "exact"

    def _make_engine(self, model) -> StreamEngine:
        params = getattr(model, "params_", None)
        posterior = self._resolved_posterior()
        # the engine needs its learner to initialise an unfitted model or a new network;
        # learn=False then only switches learning off after the warm-up
        engine_learn = (bool(self.learn) or self._learning
                        or not (params is not None and posterior == "exact"))
        kwargs = dict(blas_threads=None)
        kwargs.update(self.engine_params or {})
        kwargs.update(mode="filter", learn=engine_learn, posterior=posterior, n_features=self._D,
                      warmup=self.warmup, warmup_steps=self.warmup_steps,
                      warmup_time=float(self.warmup_time), reservoir_size=self.reservoir_size,
                      batch_size=self.batch_size, learning_rate=float(self.learning_rate),
                      random_state=self.seed)
        engine = StreamEngine(model, **kwargs)
        if engine_learn:
            engine.learning = self._learning
        return engine

    def _start_engine(self):
        model = self.model
        if model is None:
            model = FHMM(n_chains=self.n_chains, window=self.window, n_hidden=self.n_hidden,
                         share_hidden=self.share_hidden, random_state=self.seed)
        _check_model_features(model, self._features)
        self._engine = self._make_engine(model)

    def _commit(self, v):
        """Push one sample to the engine and update the committed state."""
        engine = self._engine
        # a ValueError leaves the engine as it was (on a finite sample of the right
        # length only the warm-up's initialisation fails: a feature never observed),
        # and nothing here has changed yet
        posts = engine.push(v)
        if self._win is None:  # the engine's ring starts filled with the first sample
            self._win = np.repeat(v[None, :], engine.window, axis=0)
        else:
            self._win[:-1] = self._win[1:]
            self._win[-1] = v
        self._last_x = v
        if not self._ready:
            if engine.snapshot is None:
                return
            self._ready = True
            self._prev_theta = np.array(posts[-2].theta) if len(posts) > 1 else None
        else:
            self._prev_theta = self._last_theta
        if self._exact:
            self._copy_message()
        self._last_theta = np.array(posts[-1].theta)

    # -- exact filtering (the adapter's copy of the forward message) -----------------------
    def _copy_message(self):
        """Take the engine's forward message and ``log p(x_t | x_<t)`` of the sample it
        just took (at the end of the warm-up: of the last warm-up sample, the engine
        having filtered the whole warm-up), computed with the parameters that push used.
        (A message stepped here with the snapshot read after the push differed from the
        engine's whenever the learner published in between.)"""
        if self._alpha is None:
            self._alpha = np.empty(1 << self._structure()[0])
        self._last_logc = self._engine.filtered(out=self._alpha)

    def _work(self):
        if self._exact_work is None:
            K = 1 << self._structure()[0]
            D = self._D or len(self._known_features())  # (the first sample's preview)
            self._exact_work = (np.empty(K), np.empty(K), np.empty(K), np.empty(D))
        return self._exact_work

    def _exact_preview(self, v):
        """(log p(v | past), the filtered message if v were the next sample), with the
        current parameters (the fitted model's before the first ``learn_one``)."""
        if self._engine is not None:
            ex = self._engine.snapshot.exact
        else:
            ex = ExactTables.from_params(self.model.params_)
        tmp, le, work, ytil = self._work()
        first = self._alpha is None
        prev = tmp if first else self._alpha   # (unread at the first step)
        logc = _ko.filter_step(v, first, prev, tmp, le, work, ex.bias, ex.Linv, ex.Ut,
                               ex.half_c, ex.const, ex.A, ex.pi, ex.W, ex.L, ytil)
        return logc, tmp

    def _first_preview(self, x):
        """Before the first ``learn_one``: x as a vector when it can be evaluated as the
        first sample (a fitted model with exact filtering has no warm-up, and given
        ``features`` or the model's feature names fix the order), else None."""
        feats = self._known_features()
        if (self._engine is not None or feats is None or not self._exact
                or getattr(self.model, "params_", None) is None):
            return None
        _check_model_features(self.model, feats)
        return self._vector(x, {k: j for j, k in enumerate(feats)})[0]

    # -- the recognition window -----------------------------------------------------------
    def _recognition_preview(self, v) -> np.ndarray:
        cache = self._net_cache
        if cache is None:
            net = self._engine.net  # layout and scaler are fixed once the network exists
            W, D = net.window, self._D
            cache = (net.layout, net.mean.copy(), net.scale.copy(), np.empty(net.scratch_size),
                     np.empty((W, D)), np.empty(net.n_chains), np.empty(net.n_chains))
            self._net_cache = cache
        layout, mean, scale, scratch, buf, theta, rho = cache
        buf[:-1] = self._win[1:]
        buf[-1] = v
        _rk.forward_one(buf.reshape(-1), 0, self._engine.snapshot.kernel_weights, layout, mean, scale,
                        scratch, theta, rho)
        return theta.copy()

    def _preview_theta(self, v) -> np.ndarray:
        if self._exact:
            _, alpha = self._exact_preview(v)
            return _chain_marginals(alpha, self._structure()[0])
        return self._recognition_preview(v)

    # -- learn_one ------------------------------------------------------------------------
    def learn_one(self, x) -> None:
        """Commit ``x`` as the next sample of the stream (see the module docstring).

        Parameters
        ----------
        x : dict
            Feature name → real number (None or NaN: missing).
        """
        self._check_open()
        _check_sample(x, self, "learn_one")
        self._state_cache = None
        if self._engine is None:  # the first sample fixes the features and starts the engine
            self._fix_features(x)
            try:
                v, unknown = self._vector(x)
                self._start_engine()
                self._commit(v)
            except BaseException:  # refused: the next sample starts afresh
                if self._engine is not None:
                    self._engine.close()
                self._engine = None
                self._features = self._index = None
                self._D = 0
                raise
        else:
            v, unknown = self._vector(x)
            self._commit(v)
        self._n_learned += 1
        self._n_unknown += unknown > 0
        self._n_missing += bool(np.isnan(v).any())
        self._last_obj = x

    # -- pickling -------------------------------------------------------------------------
    def clone(self, new_params=None, include_attributes=False):
        """A fresh estimator with the same parameters (river's :meth:`~river.base.Base.clone`).

        Parameters
        ----------
        new_params : dict, optional
            Parameters to change. With ``include_attributes`` and a state that has an
            engine (the adapter has learnt a sample), only those the copied engine can
            take: ``predictive``, ``learning_rate`` (the copy's learner steps with it),
            ``seed`` (the copy's reservoir and minibatches are drawn from it, afresh) and,
            in ``engine_params``, StreamEngine's run-time settings (``learner_duty``,
            ``lr_decay_steps``, ``min_learning_rate``, ``snapshot_interval``,
            ``latency_window``, ``blas_threads``; the checkpoint settings, which a copy
            never applies, see below). Any other change (the model or its structure, the
            posterior, the features, ``learn``, the warm-up, reservoir and batch settings,
            the engine's other settings) contradicts the copied state and raises
            ValueError naming it; switch the copy's learner with :attr:`learning`, or
            clone without the attributes for a fresh estimator. Values equal to the
            current ones are no change. A copy of an adapter yet to learn its first
            sample takes any parameters (it starts its engine from them).
        include_attributes : bool
            Also copy the state (the feature order, the counters, the engine), as a pickle
            round trip does: the copy has its own engine (and learner thread, if learning)
            and its own copy of the adapter's state. river's attribute-by-attribute
            ``copy.deepcopy`` cannot copy the engine's thread and locks
            (``river.compose.TransformerUnion`` clones its transformers so). Unlike a
            pickled copy, the copy's engine writes no checkpoints (``checkpoint_path``,
            ``checkpoint_every`` and ``checkpoint_seconds`` of ``engine_params`` are not
            applied to it), so that it never overwrites the original's file; a copy of an
            adapter yet to learn its first sample has no engine yet, and starts one as
            ``engine_params`` say.

        Returns
        -------
        FHMMTransformer or FHMMAnomalyScorer

        Raises
        ------
        ValueError
            A new parameter is invalid, or (``include_attributes``) contradicts the
            copied engine (see ``new_params``); nothing is copied or started.
        RuntimeError
            (``include_attributes``) The adapter's final state could not be saved when
            it was closed.
        """
        unknown = sorted(set(new_params or {}) - set(self._get_params()), key=str)
        if unknown:   # (a TypeError from the constructor)
            raise ValueError(f"new_params has unknown parameters {unknown}; expected some of "
                             f"{sorted(self._get_params())}")
        fresh = super().clone(new_params)
        if include_attributes:
            overrides = dict.fromkeys(_CHECKPOINT_SETTINGS)
            if self._engine is not None or self._saved is not None:   # (checked first)
                overrides.update(self._clone_overrides(fresh, new_params or {}))
            state = self.__getstate__()
            for name in fresh._get_params():  # the clone's own parameters stay
                state.pop(name, None)
            engine_state = state.pop("_engine_state")  # (restored into a new engine)
            if engine_state is None:   # nothing learnt: what the parameters decide is its own
                state.pop("_keys_out", None)
                if not _same_param(self.learn, fresh.learn):
                    state.pop("_learning", None)
            state = copy.deepcopy(state)  # the window, forward message, ... are the copy's own
            state["_engine_state"] = engine_state
            fresh._restore(state, **overrides)
        return fresh

    def _clone_overrides(self, fresh, new_params) -> dict:
        """The :meth:`StreamEngine.resume` overrides that give the copy of this adapter's
        engine ``fresh``'s parameters (``new_params`` changed); ValueError naming those
        the copied engine cannot take (they were silently ignored, or failed later: a new
        ``n_chains`` or ``features`` kept the old engine while reporting the new values,
        a new ``posterior`` raised AttributeError at the first transform)."""
        overrides, refused = {}, []
        for name, value in new_params.items():
            if _same_param(getattr(self, name, None), value):
                continue
            if name == "learning_rate":
                overrides["learning_rate"] = float(fresh.learning_rate)
            elif name == "seed":   # (None: fresh entropy; resume's None keeps the state's)
                overrides["random_state"] = (fresh.seed if fresh.seed is not None
                                             else np.random.default_rng())
            elif name in _CLONE_FREE:
                pass
            elif name == "engine_params":
                old, new = self.engine_params or {}, fresh.engine_params or {}
                defaults = inspect.signature(StreamEngine.__init__).parameters
                for k in sorted(set(old) | set(new), key=str):
                    if k in old and k in new and _same_param(old[k], new[k]):
                        continue
                    if k in _CLONE_FREE_ENGINE:
                        overrides[k] = new[k] if k in new else (
                            None if k == "blas_threads" else defaults[k].default)
                    elif k not in _CHECKPOINT_SETTINGS:
                        refused.append(f"engine_params[{k!r}]")
            elif name in ("n_chains", "window", "n_hidden", "share_hidden"):
                # (ignored when a model is given: a change of the model's structure only)
                if fresh._structure() != self._structure():
                    refused.append(name)
            elif name == "posterior":   # ("auto" and what it resolves to are the same)
                if fresh._resolved_posterior() != self._resolved_posterior():
                    refused.append(name)
            elif name == "features":   # (the order fixed from the first dict is no change)
                if value is None or not _same_param(tuple(value), self._features):
                    refused.append(name)
            else:   # model, learn, warmup*, reservoir_size, batch_size
                refused.append(name)
        if refused:
            hint = (" (switch the copy's learner with its `learning` property instead)"
                    if "learn" in refused else "")
            raise ValueError(
                f"{type(self).__name__}.clone(new_params, include_attributes=True) cannot "
                f"change {', '.join(refused)}: the copied state (its engine) was built with "
                f"the current value{hint}; clone without include_attributes for a fresh "
                f"estimator with them. It may change {', '.join(_CLONE_FREE)} and "
                f"engine_params' {', '.join(_CLONE_FREE_ENGINE)}")
        return overrides

    def _state_key(self):
        m = self._engine.metrics()
        return (self._n_learned, m["learner_steps"], m["discarded_steps"], m["dropped_segments"],
                m["snapshot_version"], m["learning"])

    def _engine_state(self):
        """The engine's checkpoint as (meta, arrays); cached while nothing changes, so that
        pickling an idle adapter twice gives the same bytes."""
        engine = self._engine
        if engine is None:
            return self._saved
        cached = self._state_cache
        key = self._state_key()
        if cached is not None and cached[0] == key:
            return cached[1]
        for _ in range(3):  # until no learner run completed during the checkpoint
            with tempfile.TemporaryDirectory(prefix="streamfhmm-") as tmp:
                # (the adapter's copy, not a checkpoint of the stream: the engine's count,
                # metrics()["checkpoints"], and the one the copy carries stay as they were)
                path = engine._checkpoint(os.path.join(tmp, "engine.npz"), counted=False)
                meta, arrays = load_checkpoint(path)
            after = self._state_key()
            if after == key:
                break
            key = after
        state = (meta, arrays)
        self._state_cache = (key, state)
        return state

    def __getstate__(self):
        error = getattr(self, "_save_error", None)
        if error is not None:   # (its copy would be ready, without parameters or engine)
            raise RuntimeError(f"this {type(self).__name__} cannot be copied: its final state "
                               f"could not be saved when it was closed "
                               f"({type(error).__name__}: {error})")
        state = self.__dict__.copy()
        for k in (*self._TRANSIENT, "_saved"):
            state.pop(k, None)
        state["_engine_state"] = self._engine_state()
        return state

    def __setstate__(self, state):
        self._restore(state)

    def _restore(self, state, **overrides):
        """Unpickle ``state``; ``overrides`` go to :meth:`StreamEngine.resume`."""
        engine_state = state.pop("_engine_state")
        self.__dict__.update(state)
        self._init_transient()
        self._saved = None
        self._closed = False
        if engine_state is not None:
            meta, arrays = engine_state
            with tempfile.TemporaryDirectory(prefix="streamfhmm-") as tmp:
                path = save_checkpoint(os.path.join(tmp, "engine.npz"), arrays, meta)
                # (the checkpoint keeps the engine's random state: a warm-up still to
                # fit draws from where the original had got to, seeded or not)
                self._engine = StreamEngine.resume(path, **overrides)


# --------------------------------------------------------------------------------------
# the estimators
# --------------------------------------------------------------------------------------
class FHMMTransformer(_StreamAdapter, _river_base.Transformer):
    """The filtered posterior of a factorial HMM's chains, as a river transformer.

    ``learn_one(x)`` commits x to the stream (and the learner); ``transform_one(x)``
    returns ``{"chain_0": θ_t^0, …, "chain_{M-1}": θ_t^{M-1}}``, the posterior
    probability that each chain is on at the time of x (filter mode: from x and the
    samples before it). See the module docstring for the stream contract, the features
    and pickling. Beyond river's interface: :meth:`close` (stops the learner thread; also
    a context manager), :attr:`learning` (pause/resume the learner), :meth:`metrics`,
    :attr:`engine`, :attr:`features_`, :attr:`ready`.

    Parameters
    ----------
    n_chains, window, n_hidden, share_hidden
        The model's structure (:class:`~streamfhmm.FHMM`); ignored when ``model`` is given.
    model : FHMM, optional
        A model to start from, never modified. Fitted: the parameters need no warm-up;
        with ``posterior="recognition"`` a new causal network is still trained on the
        warm-up (the model parameters train too once the engine's ``net_burnin`` steps
        are done). With ``posterior="exact"`` and ``learn=False`` there is no warm-up and
        no learner thread at all.
    posterior : {"recognition", "exact"}
        ``"recognition"``: the causal recognition network on the last ``window`` samples
        (MATH.md §3); ``"exact"``: exact filtering ``p(s_t^m = 1 | x_1..x_t)`` over the 2^M
        joint states (MATH.md §7; M ≤ 20).
    learn : bool
        Keep learning online after the warm-up (the engine's background learner thread);
        ``False`` fits the warm-up and then holds the parameters fixed (the learner
        thread is still started, paused, unless the model is fitted and
        ``posterior="exact"``: see the module docstring).
    warmup : int
        Samples buffered before an unfitted model is initialised.
    warmup_steps : int
        SVI steps on the warm-up.
    warmup_time : float
        Seconds the warm-up fit may take at most.
    reservoir_size : int
        Subchain segments the learner keeps.
    batch_size : int
        Subchains per SVI step.
    learning_rate : float
        RMSprop step size of the online learner.
    features : sequence, optional
        The feature order; default the model's feature names (``feature_names_in_``)
        when it has them, else the first learnt dict's keys, sorted. With a model that
        names its features, only those names in the model's order are accepted
        (ValueError otherwise).
    engine_params : dict, optional
        Further :class:`~streamfhmm.stream.engine.StreamEngine` arguments
        (``snapshot_interval``, ``net_burnin``, ``recency_half_life``, ``blas_threads``,
        ...).
    seed : int, optional
        Seeds the initialisation, the reservoir and the minibatches. With ``learn=False``
        the outputs are then reproducible; with ``learn=True`` they also depend on when
        the learner thread publishes new parameters.

    Examples
    --------
    >>> from river import preprocessing
    >>> from streamfhmm import FHMM
    >>> from streamfhmm.adapters.river import FHMMTransformer
    >>> A = [[[0.95, 0.05], [0.1, 0.9]]] * 2
    >>> truth = FHMM.from_params(W=[[2.0, 0.0], [0.0, 2.0], [0.5, 0.5]],
    ...                          covariance=[[0.1, 0.0], [0.0, 0.1]], transmat=A)
    >>> X, _ = truth.sample(300, random_state=0)
    >>> model = preprocessing.StandardScaler() | FHMMTransformer(
    ...     n_chains=2, window=3, n_hidden=8, warmup=100, warmup_steps=50, learn=False, seed=0)
    >>> for row in X:
    ...     model.learn_one({"a": row[0], "b": row[1]})
    >>> sorted(model.transform_one({"a": 2.5, "b": 0.5}))
    ['chain_0', 'chain_1']
    >>> model["FHMMTransformer"].close()
    """

    _POSTERIORS = ("recognition", "exact")

    def __init__(self, n_chains: int = 4, window: int = 5, n_hidden: int = 30,
                 share_hidden: str = "chain", model: FHMM | None = None,
                 posterior: str = "recognition", learn: bool = True, warmup: int = 2000,
                 warmup_steps: int = 2000, warmup_time: float = 30.0,
                 reservoir_size: int = 2000, batch_size: int = 10, learning_rate: float = 1e-3,
                 features: tuple | None = None, engine_params: dict | None = None,
                 seed: int | None = None):
        self.n_chains = n_chains
        self.window = window
        self.n_hidden = n_hidden
        self.share_hidden = share_hidden
        self.model = model
        self.posterior = posterior
        self.learn = learn
        self.warmup = warmup
        self.warmup_steps = warmup_steps
        self.warmup_time = warmup_time
        self.reservoir_size = reservoir_size
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.features = features
        self.engine_params = engine_params
        self.seed = seed
        if posterior not in self._POSTERIORS:
            raise ValueError(f"posterior must be one of {self._POSTERIORS}, got {posterior!r}")
        self._check_params()

    def transform_one(self, x) -> dict:
        """The posterior of every chain for ``x``.

        Parameters
        ----------
        x : dict

        Returns
        -------
        dict
            ``{"chain_m": θ^m}`` for m = 0 … M-1, floats in [0, 1]: of x taken as the next
            sample (nothing is committed), or of the sample just learnt when ``x`` is the
            dict last passed to ``learn_one``. ``{}`` before the model is initialised
            (a fitted model with ``posterior="exact"`` and a known feature order: x as the
            first sample).
        """
        self._check_open()
        _check_sample(x, self, "transform_one")
        if not self._ready:
            v = self._first_preview(x)
            if v is None:
                return {}
            return dict(zip(self._keys_out, self._preview_theta(v).tolist()))
        v, _ = self._vector(x)
        theta = self._last_theta if self._is_last(x, v) else self._preview_theta(v)
        return dict(zip(self._keys_out, theta.tolist()))


class FHMMAnomalyScorer(_StreamAdapter, _river_base.AnomalyDetector):
    """Anomaly scores from a factorial HMM's one-step predictive density, for river.

    ``score_one(x)`` is the negative predictive log-density (nats) of x taken as the
    next sample of the stream, given the samples learnt so far and the current
    parameters; high means anomalous:

    .. math:: \\mathrm{score}(x_t) = -\\log \\hat p(x_t \\mid x_1, \\dots, x_{t-1}).

    * ``posterior="exact"`` (the default up to ``EXACT_SCORER_MAX_CHAINS = 12``
      chains): the normaliser of the exact forward recursion,
      ``p(x_t | x_<t) = Σ_{s_t} N(x_t; Wᵀŝ_t, Σ) Σ_{s_{t-1}} A(s_{t-1}, s_t)
      p(s_{t-1} | x_<t)`` — exact under the current parameters (MATH.md §7;
      O(M 2^M) per sample).
    * ``posterior="recognition"``: the causal recognition network gives per-chain
      filtered marginals θ_{t-1} only. Each chain's on-probability is predicted with
      the model's transitions, ``π_t^m = θ_{t-1}^m (1 - b_m) + (1 - θ_{t-1}^m) a_m``, the
      chains are treated as independent, and ``p̂(x_t) = Σ_s Π_m π_m^{s_m}
      (1-π_m)^{1-s_m} N(x_t; Wᵀŝ, Σ)`` — the 2^M-component mixture
      (:func:`mixture_logpdf`) up to ``MIXTURE_MAX_CHAINS = 10`` chains, else the
      Gaussian with the same mean and covariance (:func:`gaussian_logpdf`).

    Missing values are marginalised (a sample with nothing observed scores 0). Before
    the model is initialised (the warm-up) the score is 0; a fitted model with exact
    filtering has no warm-up (with a known feature order, the first sample is scored
    before it is learnt too). The stream contract, the features and pickling are as for
    :class:`FHMMTransformer` (module docstring).

    Parameters
    ----------
    n_chains, window, n_hidden, share_hidden, model, learn, warmup, warmup_steps,
    warmup_time, reservoir_size, batch_size, learning_rate, features, engine_params, seed
        As for :class:`FHMMTransformer`.
    posterior : {"auto", "exact", "recognition"}
        ``"auto"``: exact up to 12 chains, else recognition.
    predictive : {"auto", "mixture", "gaussian"}
        The predictive density in recognition mode (``"auto"``: the mixture up to 10
        chains).

    Examples
    --------
    >>> from streamfhmm import FHMM
    >>> from streamfhmm.adapters.river import FHMMAnomalyScorer
    >>> A = [[[0.95, 0.05], [0.1, 0.9]]] * 2
    >>> truth = FHMM.from_params(W=[[2.0, 0.0], [0.0, 2.0], [0.5, 0.5]],
    ...                          covariance=[[0.1, 0.0], [0.0, 0.1]], transmat=A)
    >>> X, _ = truth.sample(300, random_state=0)
    >>> scorer = FHMMAnomalyScorer(n_chains=2, window=3, n_hidden=8, warmup=200,
    ...                            warmup_steps=50, learn=False, seed=0)
    >>> for row in X:
    ...     scorer.learn_one({"a": row[0], "b": row[1]})
    >>> bool(scorer.score_one({"a": 0.5, "b": 4.0}) > scorer.score_one({"a": 0.5, "b": 0.5}))
    True
    >>> scorer.close()
    """

    _POSTERIORS = ("auto", "exact", "recognition")
    _PREDICTIVES = ("auto", "mixture", "gaussian")

    def __init__(self, n_chains: int = 4, window: int = 5, n_hidden: int = 30,
                 share_hidden: str = "chain", model: FHMM | None = None,
                 posterior: str = "auto", predictive: str = "auto", learn: bool = True,
                 warmup: int = 2000, warmup_steps: int = 2000, warmup_time: float = 30.0,
                 reservoir_size: int = 2000, batch_size: int = 10, learning_rate: float = 1e-3,
                 features: tuple | None = None, engine_params: dict | None = None,
                 seed: int | None = None):
        self.n_chains = n_chains
        self.window = window
        self.n_hidden = n_hidden
        self.share_hidden = share_hidden
        self.model = model
        self.posterior = posterior
        self.predictive = predictive
        self.learn = learn
        self.warmup = warmup
        self.warmup_steps = warmup_steps
        self.warmup_time = warmup_time
        self.reservoir_size = reservoir_size
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.features = features
        self.engine_params = engine_params
        self.seed = seed
        if posterior not in self._POSTERIORS:
            raise ValueError(f"posterior must be one of {self._POSTERIORS}, got {posterior!r}")
        if predictive not in self._PREDICTIVES:
            raise ValueError(f"predictive must be one of {self._PREDICTIVES}, got {predictive!r}")
        self._check_params()
        if self._predictive() == "mixture" and self._structure()[0] > MAX_EXACT_CHAINS:
            raise ValueError(f"predictive='mixture' has 2^M components: n_chains <= "
                             f"{MAX_EXACT_CHAINS}")

    def _resolved_posterior(self) -> str:
        if self.posterior == "auto":
            return "exact" if self._structure()[0] <= EXACT_SCORER_MAX_CHAINS else "recognition"
        return self.posterior

    def _predictive(self) -> str:
        if self.predictive == "auto":
            return "mixture" if self._structure()[0] <= MIXTURE_MAX_CHAINS else "gaussian"
        return self.predictive

    def _predictive_logpdf(self, v, theta_prev) -> float:
        snap = self._engine.snapshot
        cache = self._table_cache
        if cache is None or cache[0] is not snap:  # per-parameter-set tables
            params = snap.params
            tables = (_kx.prepare_emission(params.W, params.L)
                      if self._predictive() == "mixture" else None)
            cache = (snap, sigmoid(params.alpha), sigmoid(params.beta), tables)
            self._table_cache = cache
        snap, a, b, tables = cache
        if theta_prev is None:
            pi = np.array(snap.params.startprob)
        else:
            pi = theta_prev * (1.0 - b) + (1.0 - theta_prev) * a  # predicted_on_probability
        if self._predictive() == "gaussian":
            return _gaussian_logpdf(v, pi, snap.params)
        return _mixture_logpdf(v, pi, snap.params, tables)

    def score_one(self, x) -> float:
        """The anomaly score of ``x`` (see the class docstring).

        Parameters
        ----------
        x : dict

        Returns
        -------
        float
            ``-log p̂(x | x_1..x_{t-1})`` for x taken as the next sample (nothing is
            committed); for the dict last passed to ``learn_one``, the score of that
            sample given the samples before it. 0.0 before the model is initialised (a
            fitted model with exact filtering and a known feature order: x as the first
            sample).
        """
        self._check_open()
        _check_sample(x, self, "score_one")
        if not self._ready:
            v = self._first_preview(x)
            return 0.0 if v is None else _exact_score(self._exact_preview(v)[0], v)
        v, _ = self._vector(x)
        if self._is_last(x, v):
            if self._exact:
                return _exact_score(self._last_logc, v)
            return -self._predictive_logpdf(v, self._prev_theta)
        if self._exact:
            return _exact_score(self._exact_preview(v)[0], v)
        return -self._predictive_logpdf(v, self._last_theta)
