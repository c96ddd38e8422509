"""The public estimator :class:`FHMM`.

Constructor arguments are stored as given (scikit-learn convention); fitted state has
a trailing underscore: ``W_`` (M+1, D), ``covariance_`` (D, D), ``transmat_`` (M, 2, 2),
``startprob_`` (M,).
"""
from __future__ import annotations

import contextlib
import json
import numbers
import os
import sys
import time

import numpy as np

from . import exact
from .io.checkpoint import npz_read_error, npz_target, path_str, read_npz, write_atomically
from ._validation import (check_bool, check_fit_magnitude, check_lengths, check_observations,
                          check_positive_int, check_random_state, check_real)
from .learn.objective import (COVARIANCE_TYPES, check_covariance_matches, check_covariance_type,
                              constrain_params)
from .model import FHMMParams

#: version of the ``.npz`` model format written by :meth:`FHMM.save`
#: (1: no ``covariance_type``, read as ``"full"``; 2: ``covariance_type`` in the hyper-parameters)
FORMAT_VERSION = 2
_FORMAT_TAG = "streamfhmm.FHMM"
_METHODS = ("recognition", "exact", "smf")

__all__ = ["FHMM"]

_SHARE = ("chain", "all")
_HYPERPARAMETERS = ("n_chains", "window", "n_hidden", "share_hidden", "random_state",
                    "covariance_type")


def _stderr_is_terminal() -> bool:
    """Whether stderr is a terminal (progress bars go there; a log file gets none)."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):   # replaced by an object without isatty, or closed
        return False


def _seed_or_none(random_state):
    """An int seed as it is; None for None, Generators and RandomStates (not stored)."""
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, (bool, np.bool_)):
        return int(random_state)
    return None


def _stored_seed(random_state):
    """``random_state`` as a model file stores it: an int seed as it is, a SeedSequence
    (as deterministic as an int) as ``{"entropy", "spawn_key", "pool_size"}``, None for
    None, Generators and RandomStates (their state moves with every draw)."""
    if isinstance(random_state, np.random.SeedSequence):
        entropy = random_state.entropy
        return {"entropy": np.asarray(entropy).tolist() if not isinstance(entropy, int) else entropy,
                "spawn_key": [int(k) for k in random_state.spawn_key],
                "pool_size": int(random_state.pool_size)}
    return _seed_or_none(random_state)


def _seed_from_file(seed, damaged: str):
    """The ``random_state`` a model file stored (:func:`_stored_seed`), or ValueError."""
    if isinstance(seed, dict):
        if set(seed) != {"entropy", "spawn_key", "pool_size"}:
            raise ValueError(f"{damaged}: random_state {seed!r} (expected an integer seed, a "
                             f"SeedSequence's entropy, spawn_key and pool_size, or null)")
        entropy, key, pool = seed["entropy"], seed["spawn_key"], seed["pool_size"]
        ints = entropy if isinstance(entropy, list) else [entropy]
        if (not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                    for v in ints + (key if isinstance(key, list) else [None]) + [pool])
                or not ints):
            raise ValueError(f"{damaged}: random_state {seed!r} (a SeedSequence's entropy, "
                             f"spawn_key and pool_size must be integers >= 0)")
        try:
            return np.random.SeedSequence(entropy, spawn_key=tuple(key), pool_size=pool)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"{damaged}: random_state {seed!r} ({exc})") from None
    if seed is not None and _seed_or_none(seed) is None:
        raise ValueError(f"{damaged}: random_state {seed!r} (expected an integer seed or null)")
    return seed


def _is_history(history) -> bool:
    """Whether ``history`` is a fit history: a list of records (dicts)."""
    return isinstance(history, list) and all(isinstance(h, dict) for h in history)


def _architecture_mismatch(model, params, net) -> str:
    """What in ``model``'s hyper-parameters contradicts its ``params`` and recognition
    ``net`` (which it predicts with); "" if nothing."""
    if model.n_chains != params.n_chains:
        return f"n_chains is {model.n_chains} but the parameters have {params.n_chains} chains"
    if net is None:
        return ""
    for name, mine, theirs in (("window", model.window, net.window),
                               ("n_hidden", model.n_hidden, net.n_hidden),
                               ("share_hidden", model.share_hidden, net.share)):
        if mine != theirs:
            return f"{name} is {mine!r} but its recognition networks have {theirs!r}"
    if net.mode != "centred":
        return f"its recognition networks read {net.mode!r} windows, not centred ones"
    return ""


#: a start is scored on X, or on so many random blocks of X beyond
#: ``_SCORE_BLOCKS * _SCORE_BLOCK`` samples (FHMM.fit's ``n_init``)
_SCORE_BLOCKS, _SCORE_BLOCK = 20, 1000


def _score_blocks(X, rng, bounds=None):
    """Rows on which ``n_init`` starts and ``n_restarts`` runs are compared, with their
    lengths: all of ``X`` (its sequences) up to ``_SCORE_BLOCKS * _SCORE_BLOCK`` rows,
    beyond that ``_SCORE_BLOCKS`` contiguous, non-overlapping blocks of ``_SCORE_BLOCK``
    rows at random positions, each within one sequence (``bounds``: ``[0, ..., T]``,
    default one sequence). When the sequences hold fewer such blocks, blocks and whole
    shorter sequences drawn at random until they hold as many rows (all of ``X`` if
    even these fall short, which needs ``T < 2 * _SCORE_BLOCKS * _SCORE_BLOCK``)."""
    T = len(X)
    bounds = np.array([0, T]) if bounds is None else np.asarray(bounds)
    if T <= _SCORE_BLOCKS * _SCORE_BLOCK:
        return X, np.diff(bounds)
    # distinct slots of a grid of blocks in each sequence, each grid shifted at random
    slots = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        n_slots = (b - a) // _SCORE_BLOCK
        if n_slots:
            shift = int(rng.integers(b - a - n_slots * _SCORE_BLOCK + 1))
            slots.append(a + shift + _SCORE_BLOCK * np.arange(n_slots))
    slots = np.concatenate(slots) if slots else np.empty(0, dtype=np.int64)
    if len(slots) >= _SCORE_BLOCKS:
        first = slots[np.sort(rng.choice(len(slots), _SCORE_BLOCKS, replace=False))]
        return (np.concatenate([X[i:i + _SCORE_BLOCK] for i in first]),
                np.full(_SCORE_BLOCKS, _SCORE_BLOCK))
    # short sequences: the blocks and the sequences shorter than a block, in random
    # order until they hold as many rows as the blocks would
    lengths = np.diff(bounds)
    short = lengths < _SCORE_BLOCK
    pieces = np.concatenate([np.stack([slots, np.full(len(slots), _SCORE_BLOCK)], axis=1),
                             np.stack([bounds[:-1][short], lengths[short]], axis=1)])
    order = rng.permutation(len(pieces))
    enough = np.cumsum(pieces[order, 1]) >= _SCORE_BLOCKS * _SCORE_BLOCK
    if not enough.any():
        return X, lengths
    chosen = pieces[order[:int(np.argmax(enough)) + 1]]
    chosen = chosen[np.argsort(chosen[:, 0])]              # in X's order
    return (np.concatenate([X[a:a + n] for a, n in chosen]), chosen[:, 1].copy())


def _complete_rows(X, bounds=None):
    """``X``'s rows without a missing value, and the bounds of their runs: a sequence
    boundary or a left-out row ends a run (``bounds`` as in :func:`_score_blocks`)."""
    bounds = np.array([0, len(X)]) if bounds is None else np.asarray(bounds)
    finite = ~np.isnan(X).any(axis=1)
    if finite.all():
        return X, bounds
    # a run starts at a kept row whose predecessor was left out or is in another sequence
    starts = np.zeros(len(X), dtype=bool)
    starts[bounds[:-1]] = True
    starts[1:] |= ~finite[:-1]
    starts &= finite
    kept = np.flatnonzero(finite)
    first = np.flatnonzero(starts[kept])          # positions in the kept rows
    return X[finite], np.append(first, len(kept)).astype(np.int64)


def _bounds_within(bounds, lo: int, hi: int) -> np.ndarray:
    """The sequence bounds ``bounds`` cut to the rows ``[lo, hi)``: ``[lo, ..., hi]``
    (not rebased)."""
    return np.unique(np.clip(bounds, lo, hi))


def _start_score(params, X, lengths, rng) -> float:
    """Log-likelihood per sample of ``X`` (independent blocks ``lengths``): exact up to
    12 chains, the SMF bound (one annealed E-step, MATH.md §6) beyond."""
    if params.n_chains <= 12:
        return exact.log_likelihood(params, X, lengths) / len(X)
    from .learn.smf import fit_smf
    _, history = fit_smf(X, lengths, params=params, max_iter=0, random_state=rng,
                         progress=False)
    return history[0]["bound"] / len(X)


#: fitted attributes that model files keep beside the parameters (files written before
#: them load without them)
_SCORE_ATTRIBUTES = ("init_scores_", "restart_scores_")


def _unquoted_name(name: str) -> str:
    """A model's feature name as the CSV reader reads it now: fits before it skipped the
    space after a comma kept the quotes of a header field such as ``a, "b"`` (the name
    ``"b"``), which no header read today matches (the command line and the river
    adapters read saved names through this)."""
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return name


def _model_names(model) -> tuple | None:
    """The names of ``model``'s features in its column order (``feature_names_in_``, as
    ``streamfhmm fit`` saves them, read by :func:`_unquoted_name`), or None for a model
    without them (or no model)."""
    names = getattr(model, "feature_names_in_", None) if model is not None else None
    return None if names is None else tuple(_unquoted_name(str(n)) for n in names)


def _check_feature_names(names, n_features: int) -> np.ndarray:
    """``feature_names_in_`` as a 1-D str array of ``n_features`` names."""
    try:
        a = np.asarray(names)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"feature_names_in_ must be {n_features} strings: {exc}") from None
    if a.shape != (n_features,) or a.dtype.kind != "U":
        shown = np.asarray(a).ravel()[:8].tolist() if a.ndim else a.tolist()
        raise ValueError(f"feature_names_in_ must be {n_features} strings (one name per feature), "
                         f"got dtype {a.dtype} and shape {a.shape}: {shown!r}")
    return a


def _check_scores(value, name: str) -> np.ndarray:
    """A model file's 1-D float array of scores (NaN: a start or run that failed)."""
    try:
        a = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a 1-D float array: {exc}") from None
    if a.ndim != 1 or a.dtype.kind != "f":
        raise ValueError(f"{name} must be a 1-D float array, got dtype {a.dtype} and shape {a.shape}")
    return a.astype(np.float64)


def _best(scores) -> int:
    """Index of the highest of ``scores`` (NaN: not a candidate; the first when none is
    finite)."""
    return int(np.nanargmax(scores)) if np.isfinite(scores).any() else 0


class NotFittedError(ValueError, AttributeError):
    """An :class:`FHMM` used before it has what the call needs (parameters, or
    recognition networks). A ValueError, and an AttributeError as scikit-learn's is, so
    that ``hasattr(FHMM(), "W_")`` is False (it raised) and ``getattr(m, "W_", None)``
    gives None."""


#: the floor of the default start's Σ (SMF-EM on the last rows), relative to each
#: feature's variance over all rows: a start less noisy than that (a still stretch at the
#: end of the series) is one SVI cannot leave within its steps. The household power
#: protocol's start has 3.4e-3 at least, so it does not bind there.
START_FLOOR = 1e-4


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
    covariance_type : {"full", "diag", "spherical"}
        Family of the noise covariance Σ (hmmlearn's name): ``"full"`` any Σ (the
        paper's model); ``"diag"`` a diagonal Σ; ``"spherical"`` ``Σ = σ² I``. Every
        learning path keeps Σ in the family (SMF-EM by the family's exact M-step, SVI
        by learning only the family's parameters: λ_d, or one shared λ). A full Σ lets
        the likelihood treat a poorly explained channel as noise; a diagonal or
        spherical one makes the chains explain every (standardised) channel.

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
                 share_hidden: str = "chain", random_state=None, covariance_type: str = "full"):
        self.n_chains = n_chains
        self.window = window
        self.n_hidden = n_hidden
        self.share_hidden = share_hidden
        self.random_state = random_state
        self.covariance_type = covariance_type

    # -- hyper-parameters (scikit-learn convention) -------------------------------------
    def get_params(self, deep: bool = True) -> dict:
        """The constructor arguments, by name (``deep`` is accepted for scikit-learn)."""
        return {name: getattr(self, name) for name in _HYPERPARAMETERS}

    def set_params(self, **params) -> "FHMM":
        """Set constructor arguments by name; returns ``self``. Validated at the next fit."""
        bad = set(params) - set(_HYPERPARAMETERS)
        if bad:
            raise ValueError(f"invalid hyper-parameters {sorted(bad)}; valid: {list(_HYPERPARAMETERS)}")
        for name, value in params.items():
            setattr(self, name, value)
        return self

    # -- construction --------------------------------------------------------------
    def _check_hyperparameters(self):
        check_positive_int(self.n_chains, "n_chains")
        w = check_positive_int(self.window, "window")
        if w % 2 == 0:
            raise ValueError(f"window must be odd (2h + 1 samples centred on t), got {w}")
        check_positive_int(self.n_hidden, "n_hidden")
        if self.share_hidden not in _SHARE:
            raise ValueError(f"share_hidden must be one of {_SHARE}, got {self.share_hidden!r}")
        check_covariance_type(self.covariance_type)
        if not isinstance(self.random_state, (np.random.Generator, np.random.RandomState)):
            check_random_state(self.random_state)   # (a generator is checked without drawing from it)

    @classmethod
    def from_params(cls, W, covariance, transmat, startprob=None, **kwargs) -> "FHMM":
        """An FHMM with known parameters.

        Parameters
        ----------
        W : array_like, shape (M+1, D)
            Chain contributions; the last row is the bias.
        covariance : array_like, shape (D, D)
            Symmetric positive-definite noise covariance Σ. With
            ``covariance_type="diag"`` (``"spherical"``) it must be diagonal (a multiple
            of the identity), up to a relative ``1e-10``; otherwise ValueError (no
            silent projection: the model would not be the one given).
        transmat : array_like, shape (M, 2, 2)
            Per-chain transition matrices (rows sum to 1).
        startprob : array_like, shape (M,), optional
            ``P(s_1^m = 1)``; default each chain's stationary probability.
        **kwargs
            Constructor arguments (window, n_hidden, covariance_type, ...).
        """
        params = FHMMParams.from_natural(W, covariance, transmat, startprob)
        unknown = sorted(set(kwargs) - set(_HYPERPARAMETERS) | set(kwargs) & {"n_chains"})
        if unknown:
            raise ValueError(f"from_params takes the constructor's arguments except n_chains (the "
                             f"chains are W's rows but the bias), got {', '.join(unknown)}")
        model = cls(n_chains=params.n_chains, **kwargs)
        model._check_hyperparameters()
        ctype = model.covariance_type
        if not check_covariance_matches(params.covariance, ctype):
            what = "diagonal" if ctype == "diag" else "a multiple of the identity (σ² I)"
            raise ValueError(f"covariance_type={ctype!r} needs a covariance that is {what}; this "
                             f"one is not (pass covariance_type='full', or a {ctype} covariance)")
        model._set_params(constrain_params(params, ctype))
        return model

    def _set_params(self, params: FHMMParams, net=None):
        self.params_ = params
        self.n_features_in_ = params.n_features
        self.net_ = net
        # (names given for earlier data need not be this data's: whoever knows them sets
        # them again, as `streamfhmm fit` does from its file's header)
        self.__dict__.pop("feature_names_in_", None)

    # -- learning --------------------------------------------------------------------
    def fit(self, X, lengths=None, method: str = "svi", *, max_iter: int | None = None,
            time_budget: float | None = None, batch_size: int = 10,
            subchain_length: int | None = None, learning_rate: float = 1e-2,
            final_lr_ratio: float = 0.01, decay: float = 0.9, tol: float = 1e-6,
            init: str = "auto", init_samples: int = 5000, n_init: int = 1,
            n_restarts: int = 1, restart_steps: int | None = None,
            net_warmup: int = 0, progress: bool | None = None, client=None,
            n_jobs: int = 1) -> "FHMM":
        """Learn the model (and, for SVI, the recognition networks) from data.

        Parameters
        ----------
        X : array_like, shape (T, D)
            Observations; NaN marks a missing value (``method="svi"`` only).
        lengths : array_like of int, optional
            Lengths of the independent sequences concatenated in X.
        method : {"svi", "smf", "em"}
            ``"svi"``: stochastic variational inference without messages — subchain
            minibatches, hand-derived gradients, RMSprop (paper §3.3, MATH.md §5), its
            steps on W and on L's off-diagonal scaled by each feature's standard
            deviation, so that the fit does not depend on the data's units.
            ``"smf"``: structured mean-field EM (MATH.md §6), exact in spirit but every
            iteration sweeps the whole sequence. ``"em"``: exact EM (maximum likelihood,
            :mod:`streamfhmm.learn.em`), O(T·M·2^M) per iteration: the reference while
            M is small (at most 14 chains).
        max_iter : int, optional
            SVI steps (default 20,000) or EM iterations (default 100).
        time_budget : float, optional
            Wall-clock seconds; learning stops when they are spent (the SVI learning
            rate schedule follows whichever of ``max_iter`` and ``time_budget`` ends first).
        batch_size : int
            Subchains per SVI step.
        subchain_length : int, optional
            Positions per subchain (default: ``window``).
        learning_rate, final_lr_ratio, decay : float
            RMSprop: cosine schedule from ``learning_rate`` to
            ``learning_rate * final_lr_ratio``; ``decay`` is RMSprop's γ.
        tol : float
            SMF-EM (exact EM) stops when an iteration raises the bound (the
            log-likelihood) by less than this many nats per sample: the same iterations
            in any units of the data.
        init : {"auto", "smf", "kmeans", "params"} or sequence of {"smf", "kmeans"}
            Starting parameters: ``"params"`` continues from the current ones, and SVI
            from the current recognition networks too if the model has networks of its
            architecture (their input scaling kept; RMSprop's statistics and the
            learning-rate schedule start afresh, so a continued fit may take
            ``net_warmup`` steps as well);
            ``"kmeans"`` a k-means start (:func:`streamfhmm.learn.smf.init_params`);
            ``"smf"`` a short SMF-EM run on the last ``init_samples`` complete samples
            from that start (X's sequences, and the gaps incomplete rows leave, kept as
            sequence breaks); ``"auto"`` is ``"params"`` for a model that has parameters and
            ``"smf"`` otherwise. ``"kmeans"`` and ``"smf"`` start afresh, so a fitted
            model may refit data with another number of features. A sequence gives each
            run of ``n_restarts`` its own kind of start (one entry per run, e.g.
            ``("smf", "kmeans", "smf")``), so that the runs compared include codes from
            both; ``n_init`` applies to its ``"smf"`` runs.
        n_init : int
            ``init="smf"`` (or ``"auto"`` resolving to it): so many starts, each a fresh
            k-means start followed by the short SMF-EM run on the same ``init_samples``
            samples; the fit continues from the one most likely on X (exact
            log-likelihood, or the SMF bound beyond 12 chains, on X or, beyond 20,000
            samples, on 20 random blocks of 1,000 complete rows, each inside one
            run of complete rows of one sequence (or, where these runs are shorter, as
            many rows in whole runs) and drawn before the starts, so that the first start is then not
            ``n_init=1``'s; with a client, on the first ``init_samples`` rows of the
            chunks, which the starts are fitted on). Not the SMF bound on the slice itself: on the household power
            data a few days reward codes that fit them and not the rest. Each start's
            score (per sample) is left in the fitted attribute ``init_scores_`` (empty
            for one start; with restarts, those of the continued run's starts, empty when
            it started from ``"kmeans"``). Default 1.
        n_restarts, restart_steps : int
            SVI: so many runs (each from its own start, drawn as ``init`` says for it,
            and its own networks) take the first ``restart_steps`` steps (default a sixth of
            ``max_iter``) of the same learning-rate schedule; the run whose recognition
            ELBO is highest on the training data (X, or beyond 20,000 samples 20
            random blocks of 1,000, each inside one sequence) goes on to
            ``max_iter`` steps. The code a run gives the chains is set early, and its
            ELBO then already ranks it much as at the end (docs/household_power.md).
            The first run starts from ``n_restarts=1``'s start and networks (beyond
            20,000 samples its subchains differ: the scoring blocks are drawn first).
            With ``net_warmup >= restart_steps`` the runs are compared with their
            models still at their starts, their networks trained. The runs' ELBOs per
            sample are left in ``restart_scores_`` (empty for one run). Needs
            ``max_iter`` steps (at least 6 without ``restart_steps``), not a
            ``time_budget``; not with a client. Default 1.
        net_warmup : int
            SVI: the first ``net_warmup`` steps train the recognition networks only, the
            model held at its start (its RMSprop statistics are still gathered). Joint
            steps then start from networks that already encode the starting model's
            posterior, instead of moving the model through an untrained one (on the
            household power data, ``bench/power.py``, a tenth of the steps lowers the
            test error and keeps a higher likelihood). Default 0.
        progress : bool, optional
            Show a progress bar (on stderr). Default: when stderr is a terminal (a log
            file or a pipe gets none).
        client : distributed.Client, optional
            Train on a Dask cluster (``method="svi"`` only): each step the driver sends
            the parameters, every worker returns the gradient sum over the subchains it
            samples from the data it holds, and the driver takes the RMSprop step
            (synchronous data-parallel; :mod:`streamfhmm.learn.distributed`). With a
            client, ``X`` may also be a list of arrays or of ``.npy`` files (independent
            sequences) that the workers load themselves.
        n_jobs : int
            SVI without a client: threads computing each step's gradient, each over its
            share of the step's subchains (-1: one per processor; at most
            ``batch_size``). The step is the one-thread step to rounding and a run is
            reproducible for a given ``n_jobs``; different values give runs that differ
            by rounding (which SGD then amplifies). Default 1.

        Returns
        -------
        self
        """
        self._check_hyperparameters()
        progress = _stderr_is_terminal() if progress is None else check_bool(progress, "progress")
        # before any initialisation (an SMF start may take seconds)
        net_warmup = check_positive_int(net_warmup, "net_warmup", minimum=0)
        init_samples = check_positive_int(init_samples, "init_samples")
        n_init = check_positive_int(n_init, "n_init")
        n_restarts = check_positive_int(n_restarts, "n_restarts")
        from .learn.svi import check_init
        init, run_inits = check_init(init, n_restarts, n_init)
        if max_iter is not None:
            max_iter = check_positive_int(max_iter, "max_iter")
        if time_budget is not None:
            time_budget = check_real(time_budget, "time_budget", low_open=True)
        from .learn.svi import check_n_jobs
        check_n_jobs(n_jobs)  # fit_svi resolves -1; the checks below take it as given
        # every method's settings, whichever method runs: a bad value is refused, not
        # silently ignored (fit(method="smf", learning_rate=-5) was accepted)
        from .learn.svi import check_svi_settings
        check_svi_settings(max_iter or 1, batch_size, subchain_length, learning_rate,
                           final_lr_ratio, decay, time_budget)
        check_real(tol, "tol")
        if n_restarts > 1 and (method != "svi" or client is not None):
            raise ValueError(f"n_restarts applies to method='svi' without a client, got "
                             f"method={method!r}{' and a client' if client is not None else ''}")
        from .learn.svi import check_restarts
        n_restarts, restart_steps = check_restarts(n_restarts, restart_steps, max_iter, time_budget)
        if n_jobs != 1 and (method != "svi" or client is not None):
            raise ValueError(f"n_jobs applies to method='svi' without a client (the threads of "
                             f"the local learner), got n_jobs={n_jobs!r} with "
                             f"method={method!r}{' and a client' if client is not None else ''}")
        # the earlier fit's scores come back if this one is refused or fails (they were
        # cleared by a refusal inside the start, and replaced by a failed run's)
        with self._earlier_scores_on_failure():
            if client is not None:
                return self._fit_distributed(X, lengths, method, client, max_iter=max_iter,
                                             time_budget=time_budget, batch_size=batch_size,
                                             subchain_length=subchain_length,
                                             learning_rate=learning_rate, final_lr_ratio=final_lr_ratio,
                                             decay=decay, init=init, init_samples=init_samples,
                                             n_init=n_init, net_warmup=net_warmup, progress=progress)
            if method not in ("svi", "smf", "em"):
                raise ValueError(f"method must be 'svi', 'smf' or 'em', got {method!r}")
            if method != "svi" and net_warmup:
                raise ValueError(f"net_warmup applies to method='svi' only (it has no networks), "
                                 f"got net_warmup={net_warmup!r} with method={method!r}")
            if method == "em":   # (before the start, which takes a while on long data)
                from .learn.em import check_em_chains
                check_em_chains(self.n_chains)
            X = check_fit_magnitude(check_observations(X, allow_nan=(method == "svi")), tiny=True)
            lengths = check_lengths(lengths, X.shape[0])
            self._check_n_features(X.shape[1], init)
            if method == "svi" and X.shape[0] < 2:
                raise ValueError("X must have at least 2 samples for SVI")
            rng = check_random_state(self.random_state)
            bounds = exact.bounds_from_lengths(lengths)
            t0 = time.perf_counter()
            self._clear_scores()
            params = self._initial_params(X, init, init_samples, n_init, rng, time_budget, bounds)
            if method == "em":
                from .learn.em import fit_exact_em
                budget = None if time_budget is None else max(0.0, time_budget - (time.perf_counter() - t0))
                params, history = fit_exact_em(X, lengths, params=params,
                                               max_iter=100 if max_iter is None else max_iter, tol=tol, time_budget=budget, progress=progress,
                                               covariance_type=self.covariance_type)
                self._set_params(params)  # networks trained for earlier parameters would mislead
                self.history_ = history
                self.fit_method_ = "em"
                return self
            if method == "smf":
                from .learn.smf import fit_smf
                budget = None if time_budget is None else max(0.0, time_budget - (time.perf_counter() - t0))
                params, history = fit_smf(X, lengths, params=params,
                                          max_iter=100 if max_iter is None else max_iter, tol=tol,
                                          time_budget=budget, random_state=rng, progress=progress,
                                          covariance_type=self.covariance_type)
                self._set_params(params)  # networks trained for earlier parameters would mislead
                self.history_ = history
                self.fit_method_ = "smf"
                return self
            from .learn.svi import DEFAULT_MAX_ITER, fit_svi
            net = self._continued_net(init, X.shape[1])
            if net is None:
                net = self._new_net(X.shape[1], rng)
                net.fit_scaler(X)
            budget = None if time_budget is None else max(0.0, time_budget - (time.perf_counter() - t0))
            total = DEFAULT_MAX_ITER if max_iter is None else max_iter
            svi = dict(batch_size=batch_size, subchain_length=subchain_length,
                       learning_rate=learning_rate, final_lr_ratio=final_lr_ratio, decay=decay,
                       rng=rng, progress=progress, covariance_type=self.covariance_type,
                       n_jobs=n_jobs)
            if n_restarts == 1:
                state = fit_svi(X, bounds, params, net, max_iter=total, time_budget=budget,
                                net_warmup=net_warmup, **svi)
            else:
                state = self._restarts(X, bounds, params, net, total, restart_steps, net_warmup,
                                       svi, run_inits, (init_samples, n_init))
            self._set_params(state.params, state.net)
            self.history_ = state.history
            self.fit_method_ = "svi"
            return self

    def _new_net(self, n_features, rng):
        """Recognition networks of this model's architecture, initialised from ``rng``
        (their input scaler is the caller's to set)."""
        from .network import RecognitionNet
        net = RecognitionNet(self.n_chains, n_features, window=self.window, n_hidden=self.n_hidden,
                             share=self.share_hidden, mode="centred")
        return net.init(random_state=rng)

    def _continued_net(self, init, n_features):
        """A copy of this model's recognition networks if a fit with ``init`` continues
        from its parameters and they fit its architecture, else None.

        Networks trained for the parameters a fit continues from encode their posterior
        already: new random ones would move the model through an uninformative posterior
        in the first steps. Their input scaling is kept (the weights were trained on it).
        """
        net = getattr(self, "net_", None)
        params = getattr(self, "params_", None)
        if (init not in ("auto", "params") or net is None or params is None
                or (net.n_chains, net.n_features) != (self.n_chains, n_features)
                or _architecture_mismatch(self, params, net)):
            return None
        return net.copy()

    def _restarts(self, X, bounds, params, net, total, restart_steps, net_warmup, svi,
                  run_inits, start):
        """SVI runs, one per entry of ``run_inits`` (the first from ``params`` and ``net``,
        the others each from a start of its kind), for ``restart_steps`` steps of one
        ``total``-step schedule; the one with the highest recognition ELBO on the scoring
        rows goes on."""
        from .learn.objective import Workspace, sequence_elbo
        from .learn.svi import fit_svi
        log_every = max(1, min(total // 100, 500))
        rows, row_lengths = _score_blocks(X, svi["rng"], bounds)
        row_bounds = exact.bounds_from_lengths(row_lengths)
        runs, scores, init_scores = [], [], []
        n_restarts = len(run_inits)
        for k in range(n_restarts):
            if k > 0:
                params = self._initial_params(X, run_inits[k], *start, svi["rng"], bounds=bounds)
                net = self._new_net(X.shape[1], svi["rng"])
                net.fit_scaler(X)
            init_scores.append(self.init_scores_)
            label = f"svi run {k + 1}/{n_restarts}" if svi["progress"] else False
            state = fit_svi(X, bounds, params, net, max_iter=restart_steps, schedule_length=total,
                            net_warmup=net_warmup, log_every=log_every,
                            **dict(svi, progress=label))
            value, _ = sequence_elbo(state.model_vec, state.net.weights, rows, row_bounds,
                                     Workspace(state.packer, state.net))
            runs.append(state)
            scores.append(float(value) / len(rows))
        if not np.isfinite(scores).any():
            raise FloatingPointError(f"every one of the {n_restarts} runs diverged (ELBO per step "
                                     f"{scores}): lower learning_rate")
        best = _best(scores)
        self.restart_scores_ = np.array(scores)
        self.init_scores_ = init_scores[best]
        state = runs[best]
        label = f"svi run {best + 1}/{n_restarts} continued" if svi["progress"] else False
        return fit_svi(X, bounds, state.params, state.net, state=state, max_iter=total - restart_steps,
                       schedule_start=restart_steps, schedule_length=total,
                       net_warmup=max(0, net_warmup - restart_steps), log_every=log_every,
                       **dict(svi, progress=label))

    @contextlib.contextmanager
    def _earlier_scores_on_failure(self):
        """Put the earlier fit's ``init_scores_`` and ``restart_scores_`` back if the block
        raises (a fit refused inside its start, or failed, after :meth:`_clear_scores`)."""
        names = ("init_scores_", "restart_scores_")
        saved = {n: self.__dict__[n] for n in names if n in self.__dict__}
        try:
            yield
        except BaseException:
            for n in names:   # (an unfitted model gets none: it looked fitted after)
                if n in saved:
                    setattr(self, n, saved[n])
                else:
                    self.__dict__.pop(n, None)
            raise

    def _clear_scores(self):
        """Once the arguments passed every check, as the start begins: scores of an earlier
        fit must not describe this one (a fit refused by a check cleared them, and left
        them empty beside the earlier fit's parameters)."""
        self.init_scores_, self.restart_scores_ = np.empty(0), np.empty(0)

    def _fit_distributed(self, X, lengths, method, client, *, max_iter, time_budget, batch_size,
                         subchain_length, learning_rate, final_lr_ratio, decay, init,
                         init_samples, n_init, net_warmup, progress) -> "FHMM":
        from .learn.distributed import (_describe_chunks, check_client, chunk_lengths, chunk_scaler,
                                        fit_svi_distributed, head_rows)
        from .learn.svi import DEFAULT_MAX_ITER
        check_client(client)  # before the initialisation, which takes a while
        if method != "svi":
            raise ValueError(f"a Dask client trains with method='svi' only, got method={method!r}")
        # a list of chunks (.npy paths or 2-D arrays); a nested list of numbers is one (T, D) array
        if isinstance(X, (list, tuple)) and X and all(
                isinstance(c, (str, os.PathLike)) or np.ndim(c) == 2 for c in X):
            if lengths is not None:
                raise ValueError("lengths must be None when X is a list of chunks (each chunk is a sequence)")
            chunks = list(X)
        else:
            X = check_fit_magnitude(check_observations(X, allow_nan=True), tiny=True)
            lengths = check_lengths(lengths, X.shape[0])
            chunks = np.split(X, np.cumsum(lengths)[:-1])
        # checked once (shapes, files' headers, values), then passed on as checked
        chunks = _describe_chunks(chunks)
        lengths = chunk_lengths(chunks)
        rng = check_random_state(self.random_state)
        t0 = time.perf_counter()
        # the scan of every chunk (on the workers for .npy files) before the start: it also
        # refuses a feature too small in every chunk, which the start would otherwise meet
        # as an error about its variance floor
        scaler = chunk_scaler(chunks, client)
        head = head_rows(chunks, init_samples)
        self._check_n_features(head.shape[1], init)
        head_bounds = _bounds_within(exact.bounds_from_lengths(lengths), 0, len(head))
        self._clear_scores()
        params = self._initial_params(head, init, init_samples, n_init, rng, time_budget,
                                      head_bounds)
        net = self._continued_net(init, params.n_features)
        if net is None:
            net = self._new_net(params.n_features, rng)
            net.set_scaler(*scaler)
        budget = None if time_budget is None else max(0.0, time_budget - (time.perf_counter() - t0))
        state = fit_svi_distributed(chunks, params, net, client,
                                    max_iter=DEFAULT_MAX_ITER if max_iter is None else max_iter,
                                    batch_size=batch_size, subchain_length=subchain_length,
                                    learning_rate=learning_rate, final_lr_ratio=final_lr_ratio,
                                    decay=decay, time_budget=budget, random_state=rng,
                                    progress=progress, covariance_type=self.covariance_type,
                                    net_warmup=net_warmup)
        self._set_params(state.params, state.net)
        self.history_ = state.history
        self.fit_method_ = "svi"
        return self

    def _check_n_features(self, n_features: int, init: str) -> None:
        """X's width against the parameters a fit continues from (``init="kmeans"`` and
        ``"smf"`` start afresh: a refit may change the number of features)."""
        params = getattr(self, "params_", None)
        if init in ("auto", "params") and params is not None and params.n_features != n_features:
            raise ValueError(f"X must have {params.n_features} features (columns) like the "
                             f"model's parameters, got {n_features}")

    def _initial_params(self, X, init, init_samples, n_init, rng,
                        time_budget=None, bounds=None) -> FHMMParams:
        """The parameters a fit starts from (``bounds``: X's sequences, default one)."""
        from .learn.smf import _default_floor, fit_smf, init_params
        self.init_scores_ = np.empty(0)
        have = getattr(self, "params_", None)
        if init == "auto":
            init = "params" if have is not None else "smf"
        if init == "params":
            if have is None:
                raise ValueError("init='params' needs a model with parameters (from_params or a previous fit)")
            if have.n_chains != self.n_chains:
                raise ValueError(f"n_chains={self.n_chains} differs from the parameters' {have.n_chains} chains")
            if n_init > 1:
                raise ValueError(f"n_init applies to a fresh start; this model continues from its "
                                 f"parameters (init='auto'), got n_init={n_init}: pass init='smf'")
            # parameters from another covariance_type start from their projection
            return constrain_params(have, self.covariance_type)
        Xc, runs = _complete_rows(X, bounds)
        if len(Xc) < self.n_chains + 2:
            raise ValueError(f"X has too few complete rows ({len(Xc)}) to initialise {self.n_chains} chains")
        if init == "kmeans":
            return init_params(Xc, self.n_chains, random_state=rng,
                               covariance_type=self.covariance_type)
        # short SMF-EM runs (30 iterations) on the last samples (their runs of complete
        # rows as sequences); under a time budget each at most 30 s and together at most a
        # fifth of it. Without one, no clock: a 30 s cap there made the start, and the
        # fit, depend on the machine's speed (a fit with random_state is reproducible)
        first = len(Xc) - min(len(Xc), init_samples)
        sl = Xc[first:]
        sl_lengths = np.diff(_bounds_within(runs, first, len(Xc)))
        budget = None if time_budget is None else min(30.0, 0.2 * time_budget / n_init)
        if n_init > 1:
            rows, row_lengths = _score_blocks(Xc, rng, runs)
        starts, scores = [], []
        floor = _default_floor(Xc, START_FLOOR)
        for _ in range(n_init):
            start = init_params(Xc, self.n_chains, random_state=rng,
                                covariance_type=self.covariance_type)
            # (Σ's floor from all the rows, START_FLOOR of each feature's variance: the last
            # rows may hold still, every variance there rounding noise; a floor from them
            # let the start's Σ collapse, and SVI's steps on log Σ, about the learning rate
            # each, never came back from 1e-36)
            params, _ = fit_smf(sl, sl_lengths, params=start, max_iter=30, tol=1e-5,
                                time_budget=budget, random_state=rng, progress=False,
                                covariance_type=self.covariance_type,
                                floor=floor)
            if n_init == 1:
                return params
            scores.append(_start_score(params, rows, row_lengths, rng))
            starts.append(params)
        self.init_scores_ = np.array(scores)
        return starts[_best(scores)]

    # -- fitted attributes ---------------------------------------------------------
    def _require_params(self) -> FHMMParams:
        params = getattr(self, "params_", None)
        if params is None:
            raise NotFittedError("this FHMM has no parameters yet: call fit(X) or build it with "
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

        Parameters
        ----------
        n_samples : int
        random_state : None, int or numpy Generator, optional
            Default: the model's ``random_state`` (as hmmlearn: a model built with an int
            seed draws the same sequence on every call).

        Returns
        -------
        X : ndarray, shape (n_samples, D)
        S : ndarray of int8, shape (n_samples, M)
            The true chain states.
        """
        rng = check_random_state(self.random_state if random_state is None else random_state)
        return self._require_params().sample(n_samples, rng)

    def score(self, X, lengths=None) -> float:
        """Exact total log-likelihood ``log p(X)`` (forward algorithm, MATH.md §7).

        Parameters
        ----------
        X : array_like, shape (T, D)
        lengths : array_like of int, optional
            Lengths of the sequences concatenated in X.

        Returns
        -------
        float
            ``Σ_sequences log p(y_1..y_T)`` in nats (divide by T for per-step figures).
        """
        params = self._require_params()
        return exact.log_likelihood(params, X, lengths)

    def _default_method(self) -> str:
        if getattr(self, "net_", None) is not None:
            return "recognition"
        return "exact" if self._require_params().n_chains <= 12 else "smf"

    def predict_proba(self, X, lengths=None, method: str | None = None) -> np.ndarray:
        """Posterior marginals ``q(s_t^m = 1)``, shape (T, M).

        Parameters
        ----------
        X : array_like, shape (T, D)
            NaN marks a missing value (``method="recognition"`` only).
        lengths : array_like of int, optional
        method : {"recognition", "exact", "smf"}, optional
            ``"recognition"``: the recognition networks' θ (centred windows, edges
            padded by repeating the edge sample; needs a model fitted by SVI);
            ``"exact"``: exact smoothing marginals over the 2^M joint states;
            ``"smf"``: the structured mean-field posterior. Default: ``"recognition"``
            when the model has networks, else ``"exact"`` for M ≤ 12, else ``"smf"``.

        Returns
        -------
        theta : ndarray of float64, shape (T, M)
            ``q(s_t^m = 1)`` per step and chain.
        """
        params = self._require_params()
        method = self._default_method() if method is None else method
        if method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
        if method == "exact":
            return exact.smoothed_marginals(params, X, lengths)[1]
        if method == "smf":
            from .learn.smf import smf_posterior
            X = check_observations(X, n_features=params.n_features)
            return smf_posterior(params, X, lengths)[0]
        net = self._require_net()
        X = check_observations(X, n_features=params.n_features, allow_nan=True)
        return net.forward(X, lengths)[0]

    def reconstruct(self, X, lengths=None, method: str | None = None) -> np.ndarray:
        """The paper's "smoothed data" ``Wᵀ E[ŝ_t]``, shape (T, D).

        ``E[ŝ_t] = [θ_t, 1]`` with θ from :meth:`predict_proba` (same ``method``).

        Parameters
        ----------
        X : array_like, shape (T, D)
        lengths : array_like of int, optional
        method : {"recognition", "exact", "smf"}, optional
            As :meth:`predict_proba`.

        Returns
        -------
        ndarray of float64, shape (T, D)
            The posterior mean of the emission mean at each step.
        """
        theta = self.predict_proba(X, lengths, method)
        W = self._require_params().W
        return theta @ W[:-1] + W[-1]

    def elbo(self, X, lengths=None) -> float:
        """The evidence lower bound of the recognition networks' copula-chain posterior.

        ``Σ_t ℓ_t`` of MATH.md §4 over every sequence (≤ :meth:`score`). Needs a model
        fitted by SVI.

        Parameters
        ----------
        X : array_like, shape (T, D)
            NaN marks a missing value.
        lengths : array_like of int, optional
            Lengths of the sequences concatenated in X.

        Returns
        -------
        float
            The bound in nats, over all T steps.
        """
        from .learn.objective import ModelPacker, Workspace, sequence_elbo
        params = self._require_params()
        net = self._require_net()
        X = check_observations(X, n_features=params.n_features, allow_nan=True)
        lengths = check_lengths(lengths, X.shape[0])
        packer = ModelPacker(params.n_chains, params.n_features)
        vec = packer.pack(params)
        if not np.allclose(params.startprob, params.stationary, rtol=1e-9, atol=1e-12):
            raise ValueError("elbo() assumes the chains start from their stationary distribution "
                             "(as SVI learns them); this model's startprob differs")
        value, _ = sequence_elbo(vec, net.weights, X, exact.bounds_from_lengths(lengths),
                                 Workspace(packer, net))
        return float(value)

    def _require_net(self):
        net = getattr(self, "net_", None)
        if net is None:
            raise NotFittedError("this FHMM has no recognition networks: fit it with method='svi' "
                                 "(or use method='exact' / 'smf')")
        return net

    # -- persistence -----------------------------------------------------------------
    def save(self, path) -> None:
        """Write the model to a versioned ``.npz`` file (no pickle).

        It holds the hyper-parameters, the parameters, the recognition networks, the
        fit's ``history_``, when the fit left them, ``init_scores_`` and
        ``restart_scores_``, and ``feature_names_in_`` when it is set (D strings naming
        the features: ``streamfhmm fit`` sets it from its data file's header, and
        ``streamfhmm score``, ``predict`` and ``bench`` check a file's columns against
        it; a fit clears it). The file is written to a temporary name and moved into place, so a crash never
        leaves a half-written model behind; when ``path`` is a symbolic link its target is the
        file replaced (the link stays a link, as ``streamfhmm predict --out`` keeps it).

        Parameters
        ----------
        path : str or path-like
            The file; ``.npz`` is appended when missing (as :meth:`load` finds it).

        Raises
        ------
        ValueError
            ``path`` names a directory, or the model cannot be saved (not fitted, bad
            hyper-parameters or ``history_``).
        FileNotFoundError
            ``path``'s directory does not exist.
        """
        params = self._require_params()
        self._check_hyperparameters()            # (what load would refuse, save refuses)
        history = getattr(self, "history_", [])
        if not _is_history(history):
            raise ValueError(f"history_ must be a list of records (dicts), got {type(history).__name__}")
        net = getattr(self, "net_", None)
        # (hyper-parameters changed by set_params after the fit would not describe it)
        mismatch = _architecture_mismatch(self, params, net)
        if not mismatch and not check_covariance_matches(params.covariance, self.covariance_type):
            mismatch = (f"covariance_type is {self.covariance_type!r} but the fitted covariance is "
                        f"not {'diagonal' if self.covariance_type == 'diag' else 'σ² I'}")
        if mismatch:
            raise ValueError(f"cannot save: {mismatch}; refit the model, or set the "
                             "hyper-parameters back")
        arrays = {
            "format": np.array(_FORMAT_TAG), "version": np.array(FORMAT_VERSION),
            "hyper": np.array(json.dumps({"n_chains": int(self.n_chains), "window": int(self.window),
                                          "n_hidden": int(self.n_hidden),
                                          "share_hidden": self.share_hidden,
                                          "covariance_type": self.covariance_type,
                                          "random_state": _stored_seed(self.random_state),
                                          "fit_method": getattr(self, "fit_method_", None)})),
            "W": params.W, "L": params.L, "alpha": params.alpha, "beta": params.beta,
            "startprob": params.startprob,
            "history": np.array(json.dumps(history)),
        }
        names = getattr(self, "feature_names_in_", None)
        if names is not None:
            arrays["feature_names"] = _check_feature_names(names, params.n_features)
        for name in _SCORE_ATTRIBUTES:   # a fit's starts' and runs' scores, if it had them
            scores = getattr(self, name, None)
            if scores is not None:      # (checked as load checks them: no unreadable file)
                arrays[name[:-1]] = _check_scores(scores, name)
        if net is not None:
            arrays.update({f"net.{k}": v for k, v in net.to_arrays().items()})
        # (through a link: os.replace of the temporary file replaced the link itself)
        path = os.path.realpath(npz_target(path))
        write_atomically(path, lambda fh: np.savez(fh, **arrays))   # (a failed write leaves no file)

    @classmethod
    def load(cls, path) -> "FHMM":
        """Read a model written by :meth:`save`; never unpickles anything.

        Files of format version 1 (written before ``covariance_type`` existed) load as
        ``covariance_type="full"``. ``init_scores_``, ``restart_scores_`` and
        ``feature_names_in_`` are set when the file holds them (files written before they were kept do not).

        Parameters
        ----------
        path : str or path-like
            The file (``.npz`` is tried after ``path`` itself, as :meth:`save` names it).

        Returns
        -------
        FHMM

        Raises
        ------
        FileNotFoundError
            No such file.
        ValueError
            Not a streamfhmm model file (foreign, damaged, or of a newer version).
        """
        from .network import RecognitionNet
        path = path_str(path)
        if not os.path.exists(path) and not path.endswith(".npz"):
            path += ".npz"  # as save() names it
        try:
            with open(path, "rb") as fh:
                data = read_npz(fh)   # (no compressed member: no zip bomb)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise ValueError(f"{path} is not a streamfhmm model file (.npz): "
                             f"{npz_read_error(path, exc)}") from None
        if str(data.get("format", "")) != _FORMAT_TAG:
            raise ValueError(f"{path} is not a streamfhmm model file (no '{_FORMAT_TAG}' tag)")
        damaged = f"{path} is a damaged streamfhmm model file"
        try:
            raw = data["version"]
            version = int(raw)
        except (KeyError, ValueError, TypeError, OverflowError) as exc:
            raise ValueError(f"{damaged}: no readable format version ({exc})") from None
        if version != raw or version < 1:   # (int() took 1.9 as 1, and 0 or -7 loaded)
            raise ValueError(f"{damaged}: format version {np.asarray(raw).tolist()!r} (expected an integer from 1)")
        if version > FORMAT_VERSION:
            raise ValueError(f"{path} has model format version {version}; this streamfhmm "
                             f"reads versions up to {FORMAT_VERSION}: upgrade streamfhmm")
        try:
            hyper = json.loads(str(data["hyper"]))
            if not isinstance(hyper, dict):
                raise ValueError(f"hyper-parameters are a {type(hyper).__name__}, not a mapping")
            params = FHMMParams(W=data["W"], L=data["L"], alpha=data["alpha"], beta=data["beta"],
                                startprob=data["startprob"])
            net_arrays = {k[4:]: v for k, v in data.items() if k.startswith("net.")}
            net = RecognitionNet.from_arrays(net_arrays) if net_arrays else None
            history = json.loads(str(data["history"]))
            scores = {name: _check_scores(data[name[:-1]], name[:-1])
                      for name in _SCORE_ATTRIBUTES if name[:-1] in data}
            names = (_check_feature_names(data["feature_names"], params.n_features)
                     if "feature_names" in data else None)
        except (KeyError, ValueError, TypeError, OverflowError, RecursionError) as exc:
            # (RecursionError: JSON nested 100,000 deep)
            raise ValueError(f"{damaged}: {exc}") from None
        if net is not None and (net.n_chains, net.n_features) != (params.n_chains, params.n_features):
            raise ValueError(f"{damaged}: its recognition networks have {net.n_chains} chains and "
                             f"{net.n_features} features, its parameters {params.n_chains} chains "
                             f"and {params.n_features} features (expected the same)")
        fit_method = hyper.pop("fit_method", None)
        if fit_method not in (None, "svi", "smf", "em") or (fit_method == "svi" and net is None):
            raise ValueError(f"{damaged}: fit_method {fit_method!r} (expected 'svi' with recognition "
                             f"networks, 'smf', 'em' or null)")
        hyper.setdefault("covariance_type", "full")
        unknown = sorted(set(hyper) - set(_HYPERPARAMETERS))
        if unknown:
            raise ValueError(f"{damaged}: unknown hyper-parameters {unknown}")
        if hyper.get("n_chains") != params.n_chains:
            raise ValueError(f"{damaged}: n_chains {hyper.get('n_chains')!r} but the parameters "
                             f"have {params.n_chains} chains")
        if hyper["covariance_type"] not in COVARIANCE_TYPES:
            raise ValueError(f"{damaged}: covariance_type {hyper['covariance_type']!r}")
        hyper["random_state"] = _seed_from_file(hyper.get("random_state"), damaged)
        if not _is_history(history):
            raise ValueError(f"{damaged}: its fit history is not a list of records")
        model = cls(**hyper)
        try:
            model._check_hyperparameters()
        except ValueError as exc:
            raise ValueError(f"{damaged}: {exc}") from None
        mismatch = _architecture_mismatch(model, params, net)
        if mismatch:
            raise ValueError(f"{damaged}: {mismatch}")
        model._set_params(params, net)
        model.history_ = history
        for name, value in scores.items():
            setattr(model, name, value)
        if names is not None:
            model.feature_names_in_ = names
        if fit_method:
            model.fit_method_ = fit_method
        return model

    def __repr__(self) -> str:
        return (f"FHMM(n_chains={self.n_chains!r}, window={self.window!r}, n_hidden={self.n_hidden!r}, "
                f"share_hidden={self.share_hidden!r}, random_state={self.random_state!r}, "
                f"covariance_type={self.covariance_type!r})")
