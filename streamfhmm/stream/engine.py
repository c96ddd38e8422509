"""The streaming engine: one sample in, the posteriors that became available out.

Data flow::

    push(x) ──▶ RingBuffer ──▶ window kernel (recognition) or exact forward step ──▶ Posterior
                    │
                    └──▶ segments ──▶ Reservoir ──▶ LearnerThread (SVI) ──▶ Snapshot (reference swap)

Positions and windows
---------------------
Samples get stream positions ``t = 0, 1, …``. With ``window = 2h + 1``:

* ``mode="smooth"``: when sample ``t`` arrives the posterior of ``τ = t - h`` is emitted
  (centred window ``y_{τ-h..τ+h}``, or exact fixed-lag smoothing ``p(s_τ | y_≤t)``);
* ``mode="filter"``: the posterior of ``τ = t`` is emitted at once (causal window
  ``y_{t-2h..t}``, or exact filtering ``p(s_t | y_≤t)``).

A sequence's first sample pads the windows that reach before it (the batch path's edge
padding, :meth:`RecognitionNet.forward`); :meth:`StreamEngine.flush` ends a sequence and
emits its last ``h`` smoothing posteriors from windows padded with its last sample
(exact mode: the exact smoothing marginals of those steps). A later ``push`` starts a
new sequence.

Flags (:mod:`streamfhmm.stream.posterior`): ``FLAG_EDGE`` when the window reached past a
sequence edge (exact mode: a posterior emitted by :meth:`flush`, with less than h steps
of look-ahead); ``FLAG_IMPUTED`` when one of the ``window`` samples ending at the newest
sample the posterior uses had a missing value; ``FLAG_WARMUP`` for the posteriors of the
cold-start warm-up, emitted once the model is initialised.
"""
from __future__ import annotations

import math
import os
import threading
import time
import weakref
from typing import NamedTuple

import numpy as np

from .. import exact as _exact
from .._validation import (MAX_ABS_VALUE, check_bool, check_fit_magnitude, check_positive_int,
                           check_random_state, check_real,
                           unmask)
from .._blas import BlasHold
from ..kernels import online as _ko
from ..kernels import recognition as _rk
from ..kernels.svi import model_vec_size as _model_vec_size
from ..model import FHMMParams
from ..network import RecognitionNet, check_net
from .learner import (DEFAULT_LEARNER_DUTY, Learner, LearnerThread, Snapshot, check_duty,
                      make_snapshot)
from .posterior import FLAG_EDGE, FLAG_IMPUTED, FLAG_WARMUP, Posterior
from .reservoir import Reservoir, generator_from_json, generator_to_json
from .ring import RingBuffer

__all__ = ["StreamEngine", "PosteriorBatch", "model_network"]

_MODES = ("smooth", "filter")
_POSTERIORS = ("recognition", "exact")
#: rows of the preallocated output blocks the Posterior arrays are views into
_BLOCK_ROWS = 4096
#: samples per chunk of the batch path
_CHUNK = 4096
_NO_NAN = -(1 << 62)
#: constructor arguments a checkpoint stores and :meth:`StreamEngine.resume` may override
_RUNTIME_OVERRIDES = ("learn", "learner_duty", "learn_samples", "learning_rate",
                      "lr_decay_steps", "min_learning_rate", "snapshot_interval",
                      "checkpoint_path", "checkpoint_every", "checkpoint_seconds",
                      "latency_window", "blas_threads", "random_state")


class PosteriorBatch:
    """The posteriors of one :meth:`StreamEngine.push_many` call, as arrays.

    Behaves as a sequence of :class:`Posterior` (``len``, indexing, iteration build
    them on demand) and exposes the arrays for vectorised use.

    Attributes
    ----------
    t : ndarray of int64, shape (n,)
    theta, rho : ndarray, shape (n, M)
    mean : ndarray, shape (n, D)
    version : ndarray of int64, shape (n,)
    flags : ndarray of int64, shape (n,)
    """

    __slots__ = ("t", "theta", "rho", "mean", "version", "flags")

    def __init__(self, t, theta, rho, mean, version, flags):
        self.t, self.theta, self.rho, self.mean = t, theta, rho, mean
        self.version, self.flags = version, flags

    @classmethod
    def empty(cls, M: int, D: int) -> "PosteriorBatch":
        return cls(np.empty(0, np.int64), np.empty((0, M)), np.empty((0, M)), np.empty((0, D)),
                   np.empty(0, np.int64), np.empty(0, np.int64))

    @classmethod
    def from_posteriors(cls, posts) -> "PosteriorBatch":
        """The batch of a sequence of :class:`Posterior` (non-empty)."""
        return cls(np.array([p.t for p in posts], np.int64), np.array([p.theta for p in posts]),
                   np.array([p.rho for p in posts]), np.array([p.mean for p in posts]),
                   np.array([p.version for p in posts], np.int64),
                   np.array([p.flags for p in posts], np.int64))

    @classmethod
    def concat(cls, parts) -> "PosteriorBatch":
        parts = list(parts)
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, k) for p in parts]) for k in cls.__slots__))

    def __len__(self) -> int:
        return self.t.shape[0]

    def __getitem__(self, i) -> Posterior:
        if isinstance(i, slice):
            return PosteriorBatch(*(getattr(self, k)[i] for k in self.__slots__))
        return Posterior(int(self.t[i]), self.theta[i], self.rho[i], self.mean[i],
                         int(self.version[i]), int(self.flags[i]))

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        span = f"t={self.t[0]}..{self.t[-1]}" if len(self) else "empty"
        return f"PosteriorBatch({len(self)} posteriors, {span})"


class LaneState(NamedTuple):
    """The arguments of :func:`~streamfhmm.kernels.online.recognition_block` that are
    engine state (see there), in :func:`streamfhmm.io.lane.serve_lane`'s order."""

    ring: np.ndarray
    capacity: int
    t: int
    seq_start: int
    window: int
    lag: int
    hist: int
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    layout: np.ndarray
    W: np.ndarray
    version: int
    Z: np.ndarray
    cs: np.ndarray
    zs: np.ndarray
    xw: np.ndarray
    hidden: np.ndarray
    info: np.ndarray


class _Builder:
    """Collects the rows of a PosteriorBatch."""

    def __init__(self, n, M, D):
        self.t = np.empty(n, np.int64)
        self.theta = np.empty((n, M))
        self.rho = np.empty((n, M))
        self.mean = np.empty((n, D))
        self.version = np.empty(n, np.int64)
        self.flags = np.empty(n, np.int64)
        self.n = 0

    def grow(self, extra):
        need = self.n + extra
        if need <= self.t.shape[0]:
            return
        size = max(need, 2 * self.t.shape[0])
        for k in ("t", "theta", "rho", "mean", "version", "flags"):
            old = getattr(self, k)
            new = np.empty((size,) + old.shape[1:], old.dtype)
            new[:self.n] = old[:self.n]
            setattr(self, k, new)

    def add(self, t, theta, rho, mean, version, flags):
        k = len(t)
        self.grow(k)
        s = slice(self.n, self.n + k)
        self.t[s], self.theta[s], self.rho[s], self.mean[s] = t, theta, rho, mean
        self.version[s], self.flags[s] = version, flags
        self.n += k

    def reserve(self, k):
        """Views ``(t, theta, rho, mean, version, flags)`` of the next k rows, to be
        written in place and then kept by :meth:`commit`."""
        self.grow(k)
        s = slice(self.n, self.n + k)
        return (self.t[s], self.theta[s], self.rho[s], self.mean[s], self.version[s],
                self.flags[s])

    def commit(self, k):
        self.n += k

    def finish(self) -> PosteriorBatch:
        n = self.n
        return PosteriorBatch(self.t[:n], self.theta[:n], self.rho[:n], self.mean[:n],
                              self.version[:n], self.flags[:n])


def _net_mode(mode: str) -> str:
    """The recognition network a posterior ``mode`` reads: a centred window for
    ``"smooth"`` (the posterior of t - h once sample t is in), a causal one for
    ``"filter"``."""
    return "centred" if mode == "smooth" else "causal"


def model_network(model, mode: str, posterior: str):
    """The recognition network a :class:`StreamEngine` given no ``net`` takes from a
    fitted ``model``: its centred network, for ``mode="smooth"`` with
    ``posterior="recognition"``; else None (with ``posterior="recognition"`` the engine
    then creates one and trains it on the stream's warm-up)."""
    net = getattr(model, "net_", None)
    if posterior == "recognition" and mode == "smooth" and net is not None and net.mode == "centred":
        return net
    return None


def _publish_to(engine_ref):
    def publish(snap):
        engine = engine_ref()
        if engine is not None:
            engine._snapshot = snap
    return publish


#: the index of the checkpoint count in a checkpoint's "state" array
_STATE_CHECKPOINTS = 8


def _snapshot_arrays(snap: Snapshot) -> dict:
    p = snap.params
    out = {"params.W": p.W, "params.L": p.L, "params.alpha": p.alpha, "params.beta": p.beta,
           "params.startprob": p.startprob, "snapshot.version": np.array(snap.version, np.int64)}
    if snap.weights is not None:
        out["snapshot.weights"] = snap.weights
    return out


def _has_value(x, status) -> int:
    """1 if sample ``x`` (its :func:`check_sample` ``status``) holds at least one value."""
    return int(status != _ko.STATUS_MISSING or not np.isnan(x).all())


def _n_valued(Y) -> int:
    """The rows of ``Y`` (n, D) holding at least one value."""
    return int((~np.isnan(Y).all(axis=1)).sum())


def _informative(seg, counted: slice) -> bool:
    """Whether subchain ``seg`` (S, D) holds a value at a position its ELBO counts
    (rows ``counted``; the others are the first position's context and the networks'
    window). One without tells nothing of the model: its ELBO has no emission term
    and is at most 0, reached by the prior, so in the reservoir it would only spend
    steps teaching the networks to answer the prior whatever the values around, and
    raise the running ELBO (a sensor's outage would look like a good fit)."""
    return not np.isnan(seg[counted]).all()


def _moment_scaler(params: FHMMParams):
    """Mean and standard deviation of y under the stationary model (a scaler that needs
    no data)."""
    p = params.stationary
    W = params.W[:-1]
    mean = params.W[-1] + p @ W
    var = np.diag(params.covariance) + (p * (1 - p)) @ (W ** 2)
    return mean, np.sqrt(np.maximum(var, 1e-300))



#: the largest latency_window (its ring holds one int64 per push: 80 MB)
MAX_LATENCY_WINDOW = 10_000_000
#: the largest reservoir_size (segments of subchain_length + window samples of D values
#: each, allocated when the learner starts: 10**12 was a MemoryError)
MAX_RESERVOIR_SIZE = 1_000_000
#: the largest subchain_length (the ring, the reservoir's segments and every SVI step
#: grow with it: 10**9 was a MemoryError)
MAX_SUBCHAIN_LENGTH = 10_000
#: how far from 1 the filtered messages of an exact-mode checkpoint may sum (the filter
#: normalises each to rounding, flushing states below ~1e-300 to zero)
_ALPHA_SUM_TOL = 1e-6
#: rows the warm-up buffer starts with (it doubles as samples arrive: a warmup of 10**13
#: allocated every row up front, and each push raised MemoryError)
_WARMUP_ROWS0 = 4096


def _check_learn_samples_learn(learn_samples, learn) -> None:
    """ValueError for a ``learn_samples`` limit given to an engine without a learner."""
    if learn_samples is not None and not learn:
        raise ValueError("learn_samples needs learn=True: an engine without a learner has "
                         "nothing to stop")


def _check_path(path, name: str = "checkpoint_path"):
    """``path`` as str (None stays None) if it is a str, bytes or path-like, else
    ValueError (any object was taken through str(): checkpoint_path=5 wrote ./5.npz)."""
    from ..io.checkpoint import path_str
    return None if path is None else path_str(path, name)


def _check_new_path(path, name: str = "checkpoint_path"):
    """:func:`_check_path`, and ValueError unless a checkpoint can go there: ``path``
    names a directory, or the directory it would go in does not exist (an engine built
    so failed every periodic checkpoint and its last one at close, which only
    ``metrics()["checkpoint_error"]`` reported). For a path given now (to the
    constructor, or to :meth:`StreamEngine.resume`), not for the one a resumed
    checkpoint recorded: that may name a directory of another machine, or one removed
    since."""
    from ..io.checkpoint import npz_target
    path = _check_path(path, name)
    if path is None:
        return None
    try:
        npz_target(path, name)
    except FileNotFoundError:
        target = path if path.endswith(".npz") else path + ".npz"
        raise ValueError(f"{name} {path!r} cannot be written: its directory "
                         f"{os.path.dirname(os.path.abspath(target))!r} does not exist "
                         f"(create it first)") from None
    return path


def _npz_file(path: str) -> str:
    """The absolute name of the file a checkpoint to ``path`` writes (``.npz`` appended
    unless it ends so), from the name alone: nothing is checked."""
    return os.path.abspath(path if path.endswith(".npz") else path + ".npz")


def _same_file(path, own: str) -> bool:
    """Whether a checkpoint to ``path`` writes the engine's own ``checkpoint_path``
    file ``own``.

    Only ``path``, the file about to be written, is checked
    (:func:`~streamfhmm.io.checkpoint.npz_target`); ``own`` is compared by name. (Both
    were checked: once the directory of the configured path was gone, every checkpoint
    to any other file failed with FileNotFoundError, e.g. the temporary copies through
    which a river adapter pickles, clones and closes.)"""
    from ..io.checkpoint import npz_target
    return os.path.abspath(npz_target(path)) == _npz_file(own)


def _save_newest(guard, path, position: int, arrays: dict, meta: dict):
    """``save_checkpoint`` to the engine's own checkpoint file under ``guard`` =
    (lock, [the stream position of the newest checkpoint in it]), unless a later
    position is already there; the path written, or None when skipped."""
    from ..io.checkpoint import save_checkpoint
    lock, newest = guard
    with lock:
        if newest[0] > position:
            return None
        out = save_checkpoint(path, arrays, meta)
        newest[0] = position
        return out


class StreamEngine:
    """Online posterior inference for a factorial HMM, with an optional background learner.

    Parameters
    ----------
    model : FHMM
        The model. A fitted one (``params_``) starts at once, unless the engine needs
        a network it lacks (``mode="filter"`` with recognition posteriors: :meth:`FHMM.fit`
        trains a centred network only; see ``net``); an unfitted one is initialised
        from a warm-up of the stream's first ``warmup`` samples (k-means start and a
        short structured mean-field fit, then a short SVI run). The engine never
        modifies ``model``: read the current parameters from :attr:`params`.
    mode : {"smooth", "filter"}
        ``"smooth"``: the posterior of ``t - h`` when sample t arrives (``h =
        window // 2``); ``"filter"``: the posterior of t at once.
    learn : bool
        Run the background learner (SVI on a reservoir of recent subchains).
    posterior : {"recognition", "exact"}
        ``"recognition"``: the recognition network (centred for smoothing, causal for
        filtering); ``"exact"``: exact filtering / fixed-lag smoothing over the 2^M
        joint states (M ≤ 20; O(M 2^M) per sample, times h for smoothing).
    net : RecognitionNet, optional
        The inference network (its mode must match: ``"centred"`` for smoothing,
        ``"causal"`` for filtering; its ``n_features`` the stream's D). Default:
        ``model.net_`` in smooth mode. Without a suitable network in recognition mode
        the engine creates one, trains it on the warm-up and then online, which needs
        ``learn=True``. With ``posterior="exact"``: the learner's starting network.
    n_features : int, optional
        D, for an unfitted model (default: the length of the first sample); with a
        fitted one it must be the model's.
    warmup : int
        Samples with a value (not every value missing) buffered before an unfitted
        model (or a new network) is initialised, and at least ``max(n_chains + 2, 4)``
        (one, for a fitted model); samples without a value are buffered too (they get
        their posteriors at the start) but do not count. The warm-up posteriors are
        emitted, flagged ``FLAG_WARMUP``, by the call that completes the warm-up, but
        in smooth mode the last ``h``, which wait for ``h`` later samples (or a flush),
        flagged too.
        The buffer grows with the samples (it is not allocated for ``warmup`` rows up
        front).
    warmup_steps : int
        SVI steps on the warm-up buffer before streaming starts.
    warmup_time : float
        Time limit of each warm-up fit: the structured mean-field start at most
        ``warmup_time / 2`` seconds, then the SVI steps at most ``warmup_time`` (up to
        1.5 × ``warmup_time`` in all).
    reservoir_size : int
        Segments the learner keeps (at least ``batch_size`` when it learns: it takes
        its first step once the reservoir holds that many; at most
        ``MAX_RESERVOIR_SIZE``, 10^6).
    recency_half_life : float, optional
        Recency-weighted reservoir: a stored segment's survival halves every so many
        samples (the learner follows drift). ``None``: uniform reservoir (Algorithm R).
    batch_size : int
        Subchains per SVI step.
    subchain_length : int, optional
        Counted positions per subchain (default: ``window``; at most
        ``MAX_SUBCHAIN_LENGTH``, 10^4).
    learning_rate : float
        RMSprop step size of the online learner.
    lr_decay_steps : float, optional
        ``η_k = η / √(1 + k / lr_decay_steps)``; ``None`` keeps η constant.
    min_learning_rate : float
        Floor of the decaying learning rate.
    decay : float
        RMSprop's γ.
    snapshot_interval : int
        Learner steps between parameter snapshots.
    learner_duty : float
        Fraction of one core the background learner may use, in (0, 1] (default 0.25):
        after a round of ``snapshot_interval`` steps that took τ seconds of CPU time
        it waits ``τ (1 - duty) / duty``. 1 runs the steps back to back, taking a
        whole core from the inference path and the host. Steps/s scale with it (see
        ``metrics()["learner_steps"]``); assignable at run time (:attr:`learner_duty`)
        and kept in checkpoints.
    net_burnin : int
        Steps that train a new network alone before the model parameters move too.
    learn_samples : int, optional
        Learn from the first so many samples only (warm-up included), then hold the
        model fixed: :attr:`learning` turns off by itself once the engine has accepted
        them (at the end of the block that reaches the count; the learner finishes its
        current round of ``snapshot_interval`` steps). For a map calibrated on the
        posteriors, e.g. from chains to sub-meters, which stays valid only while the
        chains keep their meaning. ``None`` (default): learn as long as the engine runs.
        A cold start's warm-up fit (start parameters, new networks' scalers, the
        reservoir and its SVI steps) sees only the warm-up samples before the limit,
        unless those cannot start the model (too few with a value): then the whole
        warm-up.
    checkpoint_path : str or path-like, optional
        Where periodic checkpoints (and a final one at :meth:`close`) go; ``.npz`` is
        appended when missing. It must name a file in an existing directory
        (ValueError otherwise).
    checkpoint_every : int, optional
        Write a checkpoint every so many samples (warm-up included; checked after
        each push, and once per ``push_many`` block during the warm-up).
    checkpoint_seconds : float, optional
        Write a checkpoint every so many seconds (checked at each push). A periodic
        checkpoint that fails does not fail the push: see
        ``metrics()["checkpoint_error"]``.
    latency_window : int
        Pushes over which the latency percentiles are computed (at most
        ``MAX_LATENCY_WINDOW``, 10^7).
    blas_threads : int, optional
        Limit BLAS to so many threads while the engine is open (the learner and the
        inference path each use one core); ``None`` leaves BLAS alone.
    random_state : None, int or numpy Generator
        Seeds initialisation, the reservoir and minibatch sampling (default:
        ``model.random_state``).

    Notes
    -----
    Threads: the stream's calls (:meth:`push`, :meth:`push_many`, :meth:`flush`,
    :meth:`checkpoint`, :meth:`close`) must come from one thread at a time, as a
    stream's samples do; they take no lock, so a :meth:`checkpoint` taken from another
    thread during a push can capture a state half-way through it (it resumes to other
    posteriors). :meth:`metrics`, :attr:`params`, :attr:`version` and :attr:`learning`
    may be read from any thread; the background learner synchronises with the stream
    itself.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfhmm import FHMM
    >>> A = np.array([[[0.95, 0.05], [0.1, 0.9]]] * 2)
    >>> m = FHMM.from_params(W=[[1.0, 0.0], [0.0, 2.0], [0.5, 0.5]], covariance=0.1 * np.eye(2),
    ...                      transmat=A, window=5)
    >>> X, _ = m.sample(20, random_state=0)
    >>> with StreamEngine(m, mode="filter", learn=False, posterior="exact") as eng:
    ...     posts = [p for x in X for p in eng.push(x)]
    >>> len(posts), posts[0].theta.shape
    (20, (2,))
    """

    def __init__(self, model, mode: str = "smooth", learn: bool = True,
                 posterior: str = "recognition", *, net: RecognitionNet | None = None,
                 n_features: int | None = None, warmup: int = 2000, warmup_steps: int = 2000,
                 warmup_time: float = 30.0, reservoir_size: int = 2000,
                 recency_half_life: float | None = None, batch_size: int = 10,
                 subchain_length: int | None = None, learning_rate: float = 1e-3,
                 lr_decay_steps: float | None = None, min_learning_rate: float = 0.0,
                 decay: float = 0.9, snapshot_interval: int = 20,
                 learner_duty: float = DEFAULT_LEARNER_DUTY, net_burnin: int = 1000,
                 learn_samples: int | None = None,
                 checkpoint_path=None, checkpoint_every: int | None = None,
                 checkpoint_seconds: float | None = None, latency_window: int = 10_000,
                 blas_threads: int | None = 1, random_state=None):
        self._closed = True  # until fully built (close() is then a no-op)
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if posterior not in _POSTERIORS:
            raise ValueError(f"posterior must be one of {_POSTERIORS}, got {posterior!r}")
        for name in ("n_chains", "window", "n_hidden", "share_hidden"):
            if not hasattr(model, name):
                raise ValueError(f"model must be an FHMM, got {type(model).__name__}")
        model._check_hyperparameters()
        _check_learn_samples_learn(learn_samples, learn)
        cfg = dict(mode=mode, learn=check_bool(learn, "learn"), posterior=posterior, n_features=n_features,
                   warmup=warmup, warmup_steps=warmup_steps, warmup_time=warmup_time,
                   reservoir_size=reservoir_size, recency_half_life=recency_half_life,
                   batch_size=batch_size, subchain_length=subchain_length,
                   learning_rate=learning_rate, lr_decay_steps=lr_decay_steps,
                   min_learning_rate=min_learning_rate, decay=decay,
                   snapshot_interval=snapshot_interval, learner_duty=learner_duty,
                   net_burnin=net_burnin, learn_samples=learn_samples,
                   checkpoint_path=_check_new_path(checkpoint_path),
                   checkpoint_every=checkpoint_every, checkpoint_seconds=checkpoint_seconds,
                   latency_window=latency_window, blas_threads=blas_threads,
                   n_chains=model.n_chains, window=model.window, n_hidden=model.n_hidden,
                   share_hidden=model.share_hidden,
                   covariance_type=getattr(model, "covariance_type", "full"))
        cfg = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in cfg.items()}
        self._set_config(cfg, random_state if random_state is not None else model.random_state)
        self.model = model
        params = getattr(model, "params_", None)
        M = self._M
        if params is not None and params.n_chains != M:
            raise ValueError(f"model.params_ has {params.n_chains} chains, model.n_chains is {M}")
        if posterior == "exact" and M > _exact.MAX_EXACT_CHAINS:
            raise ValueError(f"posterior='exact' is limited to n_chains <= {_exact.MAX_EXACT_CHAINS} "
                             f"(2^M joint states per step); this model has {M} chains: use "
                             f"posterior='recognition'")
        want = _net_mode(mode)
        if net is not None:
            check_net(net)
            if posterior == "recognition" and net.mode != want:
                raise ValueError(f"mode={mode!r} needs a {want!r} recognition network, got a "
                                 f"{net.mode!r} one")
        else:
            net = model_network(model, mode, posterior)
        model_net = net if net is not None else getattr(model, "net_", None)
        if model_net is not None:
            if model_net.n_chains != M:
                raise ValueError(f"the recognition network has {model_net.n_chains} chains, the "
                                 f"model {M}")
            if params is not None and model_net.n_features != params.n_features:
                raise ValueError(f"the recognition network has {model_net.n_features} features, "
                                 f"the model {params.n_features}")
        self._new_net = posterior == "recognition" and net is None
        self._check_new_net_learns(fitted=params is not None)
        # the network inference uses (recognition) and the one the learner trains
        self._net = net.copy() if (net is not None and posterior == "recognition") else None
        self._learner_net = (self._net if posterior == "recognition"
                             else (model_net.copy() if model_net is not None else None))
        self._window = self._net.window if self._net is not None else model.window
        self._params0 = params
        if n_features is not None:
            n_features = check_positive_int(n_features, "n_features")
            if params is not None and n_features != params.n_features:
                raise ValueError(f"n_features is {n_features}, but the model has {params.n_features} "
                                 "features (leave n_features out for a fitted model)")
        D = params.n_features if params is not None else n_features
        self._D = D
        self._init_counters()
        if D is not None:
            self._check_net_features(D, f"n_features is {D}")
        self._learner = None
        self._thread = None
        self._snapshot = None
        self._limiter = None
        self._closed = False
        if blas_threads is not None:
            self._limiter = BlasHold(check_positive_int(blas_threads, "blas_threads"), owner=self)
        try:
            if params is None or self._new_net:
                self._phase = "warmup"
                if D is not None:
                    self._configure(D)
            else:
                self._phase = "running"
                self._configure(D)
                self._start_ready(params)
        except BaseException:
            self.close()
            raise
        self._ready = True

    # ------------------------------------------------------------------ configuration
    def _set_config(self, cfg, random_state, new: bool = True):
        """Check and take ``cfg``. ``new``: an engine being built (not resumed), whose
        reservoir_size and subchain_length are bounded; a checkpoint's were allocated
        already, and a stream written with larger ones must still resume."""
        if cfg["mode"] not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {cfg['mode']!r}")
        if cfg["posterior"] not in _POSTERIORS:
            raise ValueError(f"posterior must be one of {_POSTERIORS}, got {cfg['posterior']!r}")
        self._cfg = dict(cfg)
        self._mode, self._posterior = cfg["mode"], cfg["posterior"]   # (read on every push)
        self._learn = self._cfg["learn"] = check_bool(cfg["learn"], "learn")
        self._exact_mode = cfg["posterior"] == "exact"
        self._M = check_positive_int(cfg["n_chains"], "n_chains")
        self._warmup = check_positive_int(cfg["warmup"], "warmup", minimum=2)
        self._warmup_steps = check_positive_int(cfg["warmup_steps"], "warmup_steps", minimum=0)
        # every numeric setting is checked here, before anything is built: a bad one
        # used to raise TypeError, be accepted silently (lr_decay_steps=0: NaN step
        # sizes, a frozen model) or fail only when the warm-up ended (recency_half_life)
        self._warmup_time = check_real(cfg["warmup_time"], "warmup_time (seconds)")
        capacity = check_positive_int(cfg["reservoir_size"], "reservoir_size")
        if new and capacity > MAX_RESERVOIR_SIZE:
            raise ValueError(f"reservoir_size must be at most {MAX_RESERVOIR_SIZE:,} segments, "
                             f"got {capacity:,}")
        if cfg["recency_half_life"] is not None:
            check_real(cfg["recency_half_life"], "recency_half_life (samples, or None)",
                       low_open=True)
        batch = check_positive_int(cfg["batch_size"], "batch_size")
        if self._learn and capacity < batch:
            # (the learner thread waits for batch_size segments: it never took a step)
            raise ValueError(f"reservoir_size must be >= batch_size (the learner takes its "
                             f"first step once the reservoir holds batch_size segments), got "
                             f"reservoir_size={capacity} < batch_size={batch}")
        if cfg["subchain_length"] is not None:
            length = check_positive_int(cfg["subchain_length"], "subchain_length")
            if new and length > MAX_SUBCHAIN_LENGTH:
                raise ValueError(f"subchain_length must be at most {MAX_SUBCHAIN_LENGTH:,} "
                                 f"positions, got {length:,}")
        check_positive_int(cfg["snapshot_interval"], "snapshot_interval")
        self._cfg["learner_duty"] = check_duty(cfg["learner_duty"])
        check_positive_int(cfg["net_burnin"], "net_burnin", minimum=0)
        limit = cfg.get("learn_samples")
        if limit is not None:
            limit = check_positive_int(limit, "learn_samples")
        self._cfg["learn_samples"] = limit
        self._learn_stop = limit if self._learn else None
        check_real(cfg["learning_rate"], "learning_rate", low_open=True)
        if cfg["lr_decay_steps"] is not None:
            check_real(cfg["lr_decay_steps"], "lr_decay_steps (learner steps, or None)",
                       low_open=True)
        check_real(cfg["min_learning_rate"], "min_learning_rate")
        check_real(cfg["decay"], "decay", 0.0, 1.0, high_open=True)
        lat_n = check_positive_int(cfg["latency_window"], "latency_window")
        if lat_n > MAX_LATENCY_WINDOW:   # (one int64 per push: 10**13 was a MemoryError)
            raise ValueError(f"latency_window must be at most {MAX_LATENCY_WINDOW:,} pushes, got {lat_n:,}")
        self._lat = np.zeros(lat_n, np.int64)
        self._ckpt_path = cfg["checkpoint_path"]
        every = cfg["checkpoint_every"]
        secs = cfg["checkpoint_seconds"]
        if every is not None:
            check_positive_int(every, "checkpoint_every")
        if secs is not None:
            check_real(secs, "checkpoint_seconds", low_open=True)
        if (every is not None or secs is not None) and self._ckpt_path is None:
            raise ValueError("checkpoint_every / checkpoint_seconds need checkpoint_path")
        self._rng = check_random_state(random_state)

    def _check_new_net_learns(self, fitted: bool):
        """ValueError when the engine is to create its recognition network (no suitable
        one given) and has no learner to train it (``learn=False``): its posteriors
        would come from a randomly initialised network. ``fitted``: the model has
        parameters."""
        if not self._new_net or self._learn:
            return
        if not fitted:
            raise ValueError("an unfitted FHMM in recognition mode needs learn=True: the engine "
                             "creates its recognition network and trains it online (or use "
                             "posterior='exact')")
        mode, want = self.mode, _net_mode(self.mode)
        raise ValueError(f"mode={mode!r} with posterior='recognition' needs a {want} recognition "
                         f"network (RecognitionNet(mode={want!r})) and this model has none: "
                         f"pass net=..., use learn=True so that the engine creates one and "
                         f"trains it online, or use posterior='exact'")

    def _init_counters(self):
        self._ready = False
        self._learning_wanted = True
        self._learner_paused = False
        # the learner is handed the stream's subchains (off once learn_samples turned
        # learning off for good: until the host turns it on again)
        self._feeding = True
        # the posteriors of positions before it are of warm-up samples (FLAG_WARMUP)
        self._warm_end = 0
        self._t = 0
        self._seq_open = False
        self._seq_start = 0
        self._last_nan = _NO_NAN
        self._n_samples = 0
        self._n_emitted = 0
        self._n_imputed = 0
        self._imputed_start = False
        self._n_rejected = 0
        self._n_checkpoints = 0
        self._lat_n = 0
        self._loglik = 0.0
        self._loglik_n = 0
        self._wn = 0            # warm-up samples so far
        self._wn_valued = 0     # those holding at least one value (rows of _wbuf)
        self._ckpt_error = None
        self._next_ckpt_t = None
        self._next_ckpt_ns = None
        # writes to checkpoint_path, explicit or from the learner thread, one at a time;
        # the stream position of the newest one: an older cut written late on the
        # learner thread must not replace a newer explicit checkpoint
        self._ckpt_guard = (threading.Lock(), [-1])

    @property
    def mode(self) -> str:
        """``"smooth"`` or ``"filter"`` (read-only: the network, the lag and the
        filter state depend on it)."""
        return self._mode

    @property
    def posterior(self) -> str:
        """``"recognition"`` or ``"exact"`` (read-only)."""
        return self._posterior

    @property
    def _lag(self) -> int:
        return self._window // 2 if self._mode == "smooth" else 0

    def _configure(self, D: int):
        """Allocate everything that depends on D (once D is known); ``self._D`` is set
        last, so that a failure leaves the engine without a D."""
        D = check_positive_int(D, "n_features")
        M, W = self._M, self._window
        cfg = self._cfg
        self._L = int(cfg["subchain_length"] or self.model_window)
        lw = self._learner_net.window if self._learner_net is not None else W
        self._S = self._L + lw
        self._hist = max(W, self._S) - 1
        self._C = max(self._S, W + W // 2, 64) + 1
        self._ring = RingBuffer(self._C, D)
        self._Z = np.empty((self._hist + _CHUNK, D))
        self._cs = np.empty(self._hist + _CHUNK + 1, np.int64)
        self._info = np.zeros(2, np.int64)
        self._new_blocks(D)
        self._zeros_M = np.zeros(M)
        self._zeros_M.setflags(write=False)
        if self._exact_mode:
            K = 1 << M
            R = self._lag + 1
            self._alpha_ring = np.zeros((R, K))
            self._le_ring = np.zeros((R, K))
            self._logc_ring = np.zeros(R)
            self._work = np.empty(K)
            self._beta = np.empty(K)
            self._g = np.empty(K)
            self._ytil = np.empty(D)
            self._ch_theta = np.empty((_CHUNK, M))
            self._ch_mean = np.empty((_CHUNK, D))
            self._ch_tau = np.empty(_CHUNK, np.int64)
        if self._phase == "warmup":
            self._warmup_buffers(D)
        self._D = D
        self._schedule_checkpoints(reset=True)

    def _check_net_features(self, D: int, source: str, caller: str = "", n: int = 1):
        """Refuse (:meth:`_reject`, ``n`` samples) a stream of D values per sample when
        the given network (``net``: the inference network, or in exact mode the
        learner's) reads another D; ``source`` says where D comes from. A cold engine
        took one: its warm-up replay then failed inside the kernels at every push, and
        in exact mode the learner trained a network of one D on samples of another."""
        net = self._net if self._net is not None else self._learner_net
        if net is not None and net.n_features != D:
            self._reject(f"{caller}the network (net) reads samples of D={net.n_features} "
                         f"values, {source}: pass a network of n_features={D}, or samples "
                         f"of {net.n_features} values", n)

    def _warmup_buffers(self, D: int, rows=None, at=None):
        """The warm-up buffer: ``_wbuf`` holds the warm-up's samples with a value (``rows``,
        n × D) and ``_wat`` their positions in it (``at``); the others, all NaN, are
        only counted (``_wn``), and put back for the start (:meth:`_warmup_samples`)."""
        n = 0 if rows is None else len(rows)
        self._wbuf = np.empty((max(min(self._warmup, _WARMUP_ROWS0), n + 1), D))
        self._wat = np.empty(self._wbuf.shape[0], np.int64)
        if n:
            self._wbuf[:n] = rows
            self._wat[:n] = at
        self._wn_valued = n

    def _warmup_samples(self) -> np.ndarray:
        """The warm-up's samples (``_wn`` × D): those with a value at their positions,
        NaN elsewhere."""
        Y = np.full((self._wn, self._D), np.nan)
        k = self._wn_valued
        Y[self._wat[:k]] = self._wbuf[:k]
        return Y

    @property
    def model_window(self) -> int:
        return int(self._cfg["window"])

    def _new_blocks(self, D=None):
        M, D = self._M, (self._D if D is None else D)
        self._tb = np.empty((_BLOCK_ROWS, M))
        self._rb = np.empty((_BLOCK_ROWS, M))
        self._mb = np.empty((_BLOCK_ROWS, D))
        self._bi = 0

    def _net_buffers(self):
        net = self._net
        self._layout = net.layout
        self._nmean = net.mean
        self._nscale = net.scale
        self._scratch = np.empty(net.scratch_size)
        self._Xw = np.empty((_CHUNK, net.n_inputs))
        self._Zs = np.empty((_CHUNK + net.window, self._D))
        self._hidden = np.empty((_CHUNK, net.n_groups * net.n_hidden))

    def _make_learner(self, params: FHMMParams, net: RecognitionNet, freeze_steps: int,
                      version: int = 0) -> Learner:
        cfg = self._cfg
        res = Reservoir(cfg["reservoir_size"], self._S, self._D,
                        half_life=cfg["recency_half_life"], stride=self._L, random_state=self._rng)
        return Learner(params, net, res, batch_size=cfg["batch_size"], subchain_length=self._L,
                       learning_rate=cfg["learning_rate"], lr_decay_steps=cfg["lr_decay_steps"],
                       min_learning_rate=cfg["min_learning_rate"], decay=cfg["decay"],
                       freeze_steps=freeze_steps, exact=self._exact_mode,
                       publish_weights=not self._exact_mode, version=version,
                       covariance_type=cfg.get("covariance_type", "full"))

    def _start_ready(self, params: FHMMParams):
        """Start with a model that has what the mode needs."""
        if self._net is not None:
            self._net_buffers()
        weights = self._net.weights if self._net is not None else None
        self._snapshot = make_snapshot(0, params, weights, self._exact_mode)
        if self._learn:
            self._fresh_learner(params)
            self._start_thread()
        self._ready = True

    def _fresh_learner(self, params: FHMMParams):
        """A learner with an empty reservoir, starting from ``params`` and the current
        network (a new one, with a scaler from the model's moments, in exact mode)."""
        new = self._learner_net is None
        if new:
            # exact mode: the learner's network has the model's window, like the inference
            # window, so the segment length is unchanged
            self._learner_net = RecognitionNet(self._M, self._D, window=self.model_window,
                                               n_hidden=self._cfg["n_hidden"],
                                               share=self._cfg["share_hidden"], mode="centred")
            self._learner_net.init(random_state=self._rng)
            self._learner_net.set_scaler(*_moment_scaler(params))
        # its snapshots continue the current one's versions (a checkpoint resumed with a
        # learner it did not have: its first snapshot was version 1 again, and the
        # versions of the posteriors went back)
        version = self._snapshot.version if self._snapshot is not None else 0
        self._learner = self._make_learner(params, self._learner_net,
                                           self._cfg["net_burnin"] if new else 0, version)
        if self._learner_net is self._net and self._snapshot is not None \
                and self._snapshot.weights is not None:
            self._learner.x[self._learner.nm:] = self._snapshot.weights
            self._learner._last_good[:] = self._learner.x

    def _start_thread(self):
        self._enable_learner()   # (no thread yet: nothing to wake)
        self._thread = LearnerThread(self._learner, _publish_to(weakref.ref(self)),
                                     snapshot_interval=self._cfg["snapshot_interval"],
                                     min_fill=self._cfg["batch_size"],
                                     duty=self._cfg["learner_duty"])
        self._finalizer = weakref.finalize(self, LearnerThread.stop, self._thread)
        self._thread.start()

    # ------------------------------------------------------------------ cold start
    def _initialise(self):
        """Initialise from the warm-up buffer; returns the warm-up posteriors."""
        Y = self._warmup_samples()
        M, D, rng = self._M, self._D, self._rng
        # learn_samples counts from the stream's start, warm-up included: what is learnt
        # here (the start fit, new networks' scalers, the reservoir and its SVI steps)
        # sees only the warm-up samples before that limit, unless those cannot start the
        # model (then the whole warm-up: the rows are past, no later sample could cure
        # it); the replay below sees them all
        n_fit = len(Y)
        if self._learn_stop is not None:
            n_fit = max(0, min(n_fit, self._learn_stop - self._t))
            if _n_valued(Y[:n_fit]) < self._warmup_needs():
                n_fit = len(Y)
        params, Y_obs, imputed = self._start_params(Y[:n_fit])
        self._imputed_start = imputed
        if self.posterior == "recognition" and self._net is None:
            want = _net_mode(self.mode)
            self._net = RecognitionNet(M, D, window=self.model_window, n_hidden=self._cfg["n_hidden"],
                                       share=self._cfg["share_hidden"], mode=want)
            self._net.init(random_state=rng)
            self._net.fit_scaler(Y_obs)
            self._learner_net = self._net
            self._window = self._net.window
        if self._net is not None:
            self._net_buffers()
        new_learner_net = False
        if self._learn and self._learner_net is None:
            self._learner_net = RecognitionNet(M, D, window=self.model_window,
                                               n_hidden=self._cfg["n_hidden"],
                                               share=self._cfg["share_hidden"], mode="centred")
            self._learner_net.init(random_state=rng)
            self._learner_net.fit_scaler(Y_obs)
            new_learner_net = True
        snap = None
        n_imputed = self._n_imputed
        if self._learn:
            fresh = self._new_net or new_learner_net
            learner = self._make_learner(params, self._learner_net,
                                         self._cfg["net_burnin"] if fresh else 0)
            S, L = self._S, self._L
            counted = learner.counted
            for end in range(S - 1, n_fit, L):
                if _informative(Y[end - S + 1:end + 1], counted):
                    learner.reservoir.offer(Y[end - S + 1:end + 1].copy(), self._seq_start + end)
            t0 = time.perf_counter()
            chunk = self._cfg["snapshot_interval"]
            while (learner.steps + learner.discarded < self._warmup_steps
                   and time.perf_counter() - t0 < self._warmup_time and learner.reservoir.size):
                learner.run_steps(min(chunk, self._warmup_steps - learner.steps - learner.discarded))
            snap = learner.snapshot()
            self._learner = learner
        if snap is None:  # no learner, or its state was rejected (then x is the start)
            learner = self._learner
            weights = None
            if self._net is not None:
                weights = (learner.weights if learner is not None and self._learner_net is self._net
                           else self._net.weights)
            snap = make_snapshot(learner.version if learner else 0,
                                 learner.params() if learner else params, weights,
                                 self._exact_mode)
        self._snapshot = snap
        self._phase = "running"
        self._wbuf = self._wat = None
        self._wn = 0
        self._wn_valued = 0
        # replay the warm-up through the batch path (its segments are in the reservoir)
        n_before = self._n_samples
        try:
            batch = self._process(Y, FLAG_WARMUP, feed=False)
        finally:
            self._n_samples = n_before  # already counted while buffering
            self._n_imputed = n_imputed
            self._ready = True
            if self._learn_stop is not None:
                self._check_learn_samples()
        # (the replay emitted all but the last lag's: those come later, flagged too)
        self._warm_end = self._t
        # a periodic checkpoint due by now (the replay writes none, see _process) is
        # written here, with the counters restored, before the learner starts
        self._periodic_checkpoint_due()
        if self._learner is not None:
            self._start_thread()
        return batch

    def _start_params(self, Y):
        """The starting parameters from warm-up rows ``Y``; returns them, the rows with a
        value (the scalers' input) and whether the start was mean-imputed. ValueError
        when ``Y`` cannot start the model."""
        from ..learn.smf import fit_smf, init_params
        M, rng = self._M, self._rng
        Y_obs = Y[~np.isnan(Y).all(axis=1)]
        if len(Y_obs) == 0:
            raise ValueError("the warm-up holds no observed value: cannot initialise")
        params = self._params0
        if params is not None:
            return params, Y_obs, False
        need = self._warmup_needs()
        complete = Y[~np.isnan(Y).any(axis=1)]
        ctype = self._cfg.get("covariance_type", "full")
        if len(complete) >= need:
            params = init_params(complete, M, random_state=rng, covariance_type=ctype)
            params, _ = fit_smf(complete[-5000:], params=params, max_iter=30, tol=1e-5,
                                time_budget=0.5 * self._warmup_time, random_state=rng,
                                progress=False, covariance_type=ctype)
            return params, Y_obs, False
        if len(Y_obs) < need:
            raise ValueError(f"the warm-up holds {len(Y_obs)} samples with a value ({len(complete)} "
                             f"complete); initialising {M} chains needs at least {need}")
        # too few complete samples (a sensor missing for much of the warm-up): start from
        # the samples with a value, each missing value replaced by its feature's mean (0
        # for a feature not seen yet, as its scaler takes it). Only a start: the SVI that
        # follows (warm-up and online) marginalises the missing values; no SMF on the
        # made-up values.
        observed = ~np.isnan(Y_obs)
        mean = np.where(observed, Y_obs, 0.0).sum(axis=0) / np.maximum(observed.sum(axis=0), 1)
        params = init_params(np.where(observed, Y_obs, mean), M, random_state=rng,
                             covariance_type=ctype)
        return params, Y_obs, True

    def _all_or_nothing(self, fn, n_rows):
        """``fn()``; if it raises ValueError, the engine is put back as it was before
        (buffered warm-up rows, D, counters, attributes, the random state) but for the
        ``rejected`` count, which grows by the ``n_rows()`` samples refused (unless the
        error was counted where it was raised), and the error propagates. A learner
        thread ``fn`` started is stopped (it ran on, and each retry started another).

        For the calls that may end the warm-up: ``_initialise`` can refuse the warm-up
        (too few samples with a value) after rows were buffered, and a caller that retries
        the same rows (the service does, one by one) must not buffer them twice."""
        saved = dict(self.__dict__)
        rng_state = self._rng.bit_generator.state
        try:
            return fn()
        except ValueError:
            if self._thread is not saved["_thread"]:
                self._finalizer()   # (stops it)
            counted = self._n_rejected - saved["_n_rejected"]
            self.__dict__.clear()
            self.__dict__.update(saved)
            self._rng.bit_generator.state = rng_state
            self._n_rejected += counted if counted else n_rows()
            raise

    def _warmup_checkpoint_due(self):
        """The periodic checkpoint during the warm-up (position: the last buffered sample)."""
        if self._next_ckpt_t is not None and (self._t + self._wn - 1 >= self._next_ckpt_t
                                              or time.perf_counter_ns() >= self._next_ckpt_ns):
            self._periodic_checkpoint()

    def _check_learn_samples(self):
        """Turn learning off for good once ``learn_samples`` samples were accepted, and
        stop handing the learner subchains (it took no step on them, but copying them
        into its reservoir made a stopped engine's push_many ten times dearer than
        learn=False's, and every checkpoint differ)."""
        if self._n_samples >= self._learn_stop:
            self._learn_stop = None
            self.learning = False
            self._feeding = False

    def _push_warmup(self, x, status):
        # a sample without a value (all NaN) is only counted: a warm-up that lacks
        # samples with a value (dead sensors) goes on, and kept every one (1M: 50 MB,
        # written whole into each warm-up checkpoint)
        if _has_value(x, status):
            k = self._wn_valued
            if k == self._wbuf.shape[0]:
                self._wbuf = np.concatenate([self._wbuf, np.empty_like(self._wbuf)])
                self._wat = np.concatenate([self._wat, np.empty_like(self._wat)])
            self._wbuf[k] = x
            self._wat[k] = self._wn
            self._wn_valued = k + 1
        self._wn += 1
        self._n_samples += 1
        if status == _ko.STATUS_MISSING:
            self._n_imputed += 1
        if self._warmup_can_start():   # (its warmup samples with a value: _wn >= warmup)
            return list(self._initialise())
        return []

    def _warmup_needs(self) -> int:
        """Samples with a value a start needs: one for given parameters (the scalers),
        ``max(n_chains + 2, 4)`` to fit them."""
        return 1 if self._params0 is not None else max(self._M + 2, 4)

    def _warmup_target(self) -> int:
        """Samples with a value that end the warm-up: ``warmup``, and at least what a
        start needs (:meth:`_warmup_needs`)."""
        return max(self._warmup, self._warmup_needs())

    def _warmup_can_start(self) -> bool:
        """Whether the buffered warm-up holds ``warmup`` samples with a value (and what a
        start needs); if not, it goes on until it does: a stream whose sensors are dead
        at first (samples without a value, counted and given posteriors at the start)
        was started from the few valued samples after them, its model fitted on as few
        as 5 (refusing such samples instead left the warm-up where it was for good).
        O(1): the buffered samples with a value are counted as they arrive."""
        return self._wn_valued >= self._warmup_target()

    # ------------------------------------------------------------------ input checks
    def _reject(self, msg, n=1):
        self._n_rejected += n
        raise ValueError(msg)

    def _as_sample(self, x):
        D = self._D
        if not (type(x) is np.ndarray and x.dtype == np.float64 and x.ndim == 1):
            if isinstance(x, (str, bytes)) or x is None:
                self._reject(f"push expects one sample of D={D} numbers, got {type(x).__name__}")
            try:
                raw = np.asarray(unmask(x))
            except Exception as exc:
                self._reject(f"push expects one sample of D={D} numbers, got {type(x).__name__}: {exc}")
            if raw.dtype.kind not in "biuf":
                self._reject(f"push expects one sample of D={D} numbers, got an array of dtype "
                             f"{raw.dtype}")
            x = raw.astype(np.float64)
        if D is None:
            # the first sample fixes D: only once it passed every check (a rejected sample
            # changes nothing, D included)
            if x.ndim != 1 or x.shape[0] < 1:
                self._reject(f"push expects one sample (a 1-D array of D >= 1 numbers), got an "
                             f"array of shape {x.shape}")
            self._check_net_features(x.shape[0], f"the first sample holds {x.shape[0]}", "push: ")
            if _ko.check_sample(np.ascontiguousarray(x)) == _ko.STATUS_INFINITE:
                self._reject_inf(x)
            if self._phase == "warmup" and (np.abs(x) > MAX_ABS_VALUE).any():
                self._reject(self._huge_warmup_message(x, "index "))
            self._configure(x.shape[0])
            D = self._D
        elif x.shape != (D,):
            self._reject(f"push expects one sample of D={D} numbers (a 1-D array of length {D}), "
                         f"got an array of shape {x.shape}")
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        return x

    def _check_block(self, X):
        D = self._D
        if isinstance(X, (str, bytes)) or X is None:
            self._reject(f"push_many expects an array of shape (n, D={D}), got {type(X).__name__}")
        try:
            raw = np.asarray(unmask(X))
        except Exception as exc:
            self._reject(f"push_many expects an array of shape (n, D={D}), got {type(X).__name__}: {exc}")
        if raw.dtype.kind not in "biuf":
            self._reject(f"push_many expects a numeric array of shape (n, D={D}), got dtype {raw.dtype}")
        if raw.ndim != 2 or (D is not None and raw.shape[1] != D):
            n = raw.shape[0] if raw.ndim >= 1 else 1
            self._reject(f"push_many expects an array of shape (n, D={D}), got shape {raw.shape}", n)
        if raw.shape[1] == 0:
            self._reject(f"push_many expects an array of shape (n, D) with D >= 1 values per "
                         f"sample, got shape {raw.shape}", raw.shape[0])
        X = np.ascontiguousarray(raw, dtype=np.float64)
        inf = np.isinf(X)
        if inf.any():
            r, c = np.argwhere(inf)[0]
            self._reject(f"push_many: X must not contain infinities (use NaN for a missing value); "
                         f"found {X[r, c]} at row {r}, column {c}; nothing was processed", X.shape[0])
        if D is None and X.shape[0]:
            self._check_net_features(X.shape[1], f"the first block's rows hold {X.shape[1]}",
                                     "push_many: ", X.shape[0])
            self._configure(X.shape[1])
        return X

    def _check_open(self):
        if self._closed:
            raise RuntimeError("this StreamEngine is closed")

    # ------------------------------------------------------------------ the hot path
    def push(self, x) -> list:
        """Add one sample; return the posteriors that became available.

        Parameters
        ----------
        x : array_like, shape (D,)
            One sample; NaN (or a masked entry of a numpy masked array) marks a missing
            value (imputed in the window, marginalised by the learner and the exact
            kernels; the posterior is flagged ``FLAG_IMPUTED``).

        Returns
        -------
        list of Posterior
            ``[]`` or one posterior (smooth mode: of position ``t - h``; filter mode: of
            t); all warm-up posteriors at the end of the warm-up.

        Raises
        ------
        ValueError
            ``x`` is not D numbers, or holds an infinity, or the start fitted when it
            completes the warm-up fails, or (during the warm-up) a value exceeds 1e150 in
            magnitude (the start fit would overflow). Nothing is changed (the ``rejected``
            count grows): the sample may be pushed again. (A warm-up with too few samples
            holding a value is not an error: it goes on, see ``warmup``.)
        """
        t_ns = time.perf_counter_ns()
        if self._closed:
            self._check_open()
        x = self._as_sample(x)
        if self._phase == "warmup":
            status = _ko.check_sample(x)
            if status == _ko.STATUS_INFINITE:
                self._reject_inf(x)
            if (np.abs(x) > MAX_ABS_VALUE).any():
                self._reject(self._huge_warmup_message(x, "index "))
            # this sample ends the warm-up: all or nothing
            if self._wn_valued + _has_value(x, status) >= self._warmup_target():
                return self._all_or_nothing(lambda: self._push_warmup(x, status), lambda: 1)
            posts = self._push_warmup(x, status)
            self._warmup_checkpoint_due()
            return posts
        t = self._t
        if not self._seq_open:
            if _ko.check_sample(x) == _ko.STATUS_INFINITE:
                self._reject_inf(x)
            self._open_sequence(x)
        snap = self._snapshot
        i = self._bi
        if i == _BLOCK_ROWS:
            self._new_blocks()
            i = 0
        lag = self._lag
        emit = t - lag >= self._seq_start
        C = self._C
        W = self._window
        if self._exact_mode:
            ex = snap.exact
            status = _ko.exact_push(x, self._ring.buf, t % C, C, t, t == self._seq_start, lag,
                                    self._alpha_ring, self._le_ring, self._logc_ring, self._work,
                                    self._beta, self._g, self._ytil, ex.bias, ex.Linv, ex.Ut,
                                    ex.half_c, ex.const, ex.A, ex.pi, ex.W, ex.L, emit,
                                    self._tb, self._mb, i)
            if status != _ko.STATUS_INFINITE and _has_value(x, status):
                self._loglik += self._logc_ring[t % (lag + 1)]
                self._loglik_n += 1
        else:
            status = _ko.recognition_push(x, self._ring.buf, t % C, C, emit, (t - W + 1) % C,
                                          snap.kernel_weights, self._layout, self._nmean, self._nscale,
                                          self._scratch, snap.params.W, self._tb, self._rb,
                                          self._mb, i)
        if status == _ko.STATUS_INFINITE:
            self._reject_inf(x)
        self._t = t + 1
        self._n_samples += 1
        if status == _ko.STATUS_MISSING:
            self._n_imputed += 1
            self._last_nan = t
        out = []
        if emit:
            a = t - W + 1
            flags = FLAG_WARMUP if t - lag < self._warm_end else 0
            if a < self._seq_start and not self._exact_mode:
                flags |= FLAG_EDGE
            if self._last_nan >= a:
                flags |= FLAG_IMPUTED
            out.append(Posterior(t - lag, self._tb[i],
                                 self._zeros_M if self._exact_mode else self._rb[i],
                                 self._mb[i], snap.version, flags))
            self._bi = i + 1
            self._n_emitted += 1
        learner = self._learner
        if learner is not None:
            n_in = t - self._seq_start + 1 - self._S
            if n_in >= 0 and n_in % self._L == 0 and self._feeding:
                self._feed(self._ring.last(t, self._S), t)
            if self._learn_stop is not None:
                self._check_learn_samples()
        if self._next_ckpt_t is not None and (t >= self._next_ckpt_t
                                              or t_ns >= self._next_ckpt_ns):
            self._periodic_checkpoint()
        self._lat[self._lat_n % self._lat.shape[0]] = time.perf_counter_ns() - t_ns
        self._lat_n += 1
        return out

    def _huge_warmup_message(self, x, where: str, caller: str = "push") -> str:
        d = int(np.flatnonzero(np.abs(x) > MAX_ABS_VALUE)[0])
        return (f"{caller}: a warm-up sample's values must be at most {MAX_ABS_VALUE:g} in "
                f"magnitude (the start fit squares them: a larger one overflows, and no model "
                f"could start from the warm-up that holds it); found {float(x[d]):g} at {where}{d}")

    def _reject_inf(self, x):
        d = int(np.flatnonzero(np.isinf(x))[0])
        self._reject(f"push: a sample must not contain infinities (use NaN for a missing value); "
                     f"found {x[d]} at index {d} of the D={x.shape[0]} values")

    def _open_sequence(self, x0):
        self._ring.fill(x0)
        self._seq_start = self._t
        self._seq_open = True
        self._last_nan = _NO_NAN

    def push_many(self, X) -> PosteriorBatch:
        """Add a block of samples through the batch kernels.

        Parameters
        ----------
        X : array_like, shape (n, D)
            Samples in stream order; NaN (or a masked entry of a numpy masked array)
            marks a missing value.

        Returns
        -------
        PosteriorBatch
            The posteriors that became available, in order (a sequence of
            :class:`Posterior`, with the arrays exposed). The posteriors of pushing the
            rows one at a time with the same parameter snapshot: the same positions,
            flags, versions and learner subchains, bit for bit in exact mode, and θ, ρ
            and means equal to rounding (≤ 1e-15) in recognition mode.

        Raises
        ------
        ValueError
            X is not (n, D) numbers (D >= 1) or holds an infinity, or the start fitted
            when it completes the warm-up fails, or a row the warm-up would buffer holds
            a value beyond 1e150 in magnitude. Nothing is processed (the
            ``rejected`` count grows by the block's rows).
        """
        self._check_open()
        if self._phase == "warmup":
            rows = [0]

            def warmup_block():
                Xw = self._check_block(X)
                rows[0] = Xw.shape[0]
                return self._push_many_warmup(Xw)
            return self._all_or_nothing(warmup_block, lambda: rows[0])
        return self._push_many_running(self._check_block(X), [])

    def _push_many_warmup(self, X):
        parts = []
        k = 0
        huge = (np.abs(X) > MAX_ABS_VALUE).any(axis=1)
        while self._phase == "warmup" and k < X.shape[0]:
            if huge[k]:
                raise ValueError(self._huge_warmup_message(X[k], f"row {k}, column ", "push_many") +
                                 "; nothing was processed")
            posts = self._push_warmup(X[k], _ko.check_sample(X[k]))
            k += 1
            if posts:
                parts.append(self._last_init_batch)
        if self._phase == "warmup":
            self._warmup_checkpoint_due()
        return self._push_many_running(X[k:], parts)

    def _push_many_running(self, X, parts):
        if X.shape[0]:
            parts.append(self._process(X, 0, feed=True))
        if not parts:
            return PosteriorBatch.empty(self._M, self._D if self._D is not None else 0)
        return PosteriorBatch.concat(parts)

    def _process(self, X, extra_flags, feed):
        """The batch path over X (n, D), no infinities; returns a PosteriorBatch.

        ``feed``: new samples (the learner gets their subchains, ``learn_samples`` and
        the periodic checkpoints are checked after each chunk); False for the warm-up's
        replay, whose samples were counted while buffered: a checkpoint written inside
        it recorded them twice, or a position inside the warm-up (:meth:`_initialise`
        checks for one once its counters are restored)."""
        n = X.shape[0]
        out = _Builder(n, self._M, self._D)
        pos = 0
        while pos < n:
            if not self._seq_open:
                self._open_sequence(X[pos])
            m = min(_CHUNK, n - pos)
            self._process_chunk(X[pos:pos + m], out, extra_flags, feed)
            pos += m
            if feed:
                if self._learn_stop is not None:
                    self._check_learn_samples()
                self._periodic_checkpoint_due()
        batch = out.finish()
        if extra_flags & FLAG_WARMUP:
            self._last_init_batch = batch
        elif len(batch) and batch.t[0] < self._warm_end:   # (the warm-up's last lag)
            batch.flags[:self._warm_end - batch.t[0]] |= FLAG_WARMUP   # (t consecutive)
        return batch

    def _periodic_checkpoint_due(self):
        if self._next_ckpt_t is not None and (self._t - 1 >= self._next_ckpt_t
                                              or time.perf_counter_ns() >= self._next_ckpt_ns):
            self._periodic_checkpoint()

    def _process_chunk(self, Xc, out, extra_flags, feed):
        if self._exact_mode:
            self._exact_chunk(Xc, out, extra_flags)
        else:
            m = Xc.shape[0]
            t = self._t
            snap = self._snapshot
            tau, theta, rho, mean, version, flags = out.reserve(m)
            info = self._info
            ne = _ko.recognition_block(Xc, self._ring.buf, self._ring.capacity, t, self._seq_start,
                                       self._window, self._lag, self._hist, self._nmean, self._nscale,
                                       snap.kernel_weights, self._layout, snap.params.W, snap.version,
                                       extra_flags, self._Z, self._cs, self._Zs, self._Xw, self._hidden,
                                       tau, theta, rho, mean, version, flags, info)
            out.commit(ne)
            self._recognised(t, m, ne)
        learner = self._learner
        if feed and learner is not None and self._feeding:
            self._feed_learner(Xc, self._t - Xc.shape[0])

    def _recognised(self, t, m, ne):
        """Account for m samples at positions t … that the recognition block kernel
        handled (ne posteriors emitted, its ``info`` in ``self._info``)."""
        n_nan, last_nan = self._info.tolist()
        if n_nan:
            self._last_nan = t + last_nan
            self._n_imputed += n_nan
        self._t = t + m
        self._n_samples += m
        self._n_emitted += ne

    # -- the serving lane (streamfhmm.io.lane) -----------------------------------------
    def _lane_ready(self) -> bool:
        """Whether :meth:`_lane_state` can give a state once a sequence is open: not
        closed, past the warm-up, recognition posteriors (what a few more samples cannot
        change; the service reads the rest of its input the general way otherwise)."""
        return (not self._closed and self._phase == "running" and not self._exact_mode
                and not self._warm_pending())

    def _warm_pending(self) -> bool:
        """Whether posteriors of warm-up samples are still to come (the smoothing lag's
        after the warm-up: flagged ``FLAG_WARMUP`` here, not on the serving lane)."""
        return self._warm_end > max(self._t - self._lag, self._seq_start)

    def _lane_state(self) -> "LaneState | None":
        """The block kernel's state for a compiled caller that runs it on samples it
        received itself (:func:`streamfhmm.io.lane.serve_lane`, in this order); None
        when a block cannot go straight to that kernel (closed, warming up, exact
        posteriors, no open sequence). At most ``_CHUNK`` samples."""
        if (self._closed or self._phase != "running" or self._exact_mode or not self._seq_open
                or self._warm_pending()):
            return None
        snap = self._snapshot
        return LaneState(self._ring.buf, self._ring.capacity, self._t, self._seq_start, self._window,
                         self._lag, self._hist, self._nmean, self._nscale, snap.kernel_weights, self._layout,
                         snap.params.W, snap.version, self._Z, self._cs, self._Zs, self._Xw,
                         self._hidden, self._info)

    def _lane_commit(self, Xc, t, ne):
        """After the lane ran the block kernel on ``Xc`` at position ``t`` (the ``t`` of
        :meth:`_lane_state`) and emitted ne posteriors: what :meth:`push_many` does after
        that kernel (counters, the learner's subchains, a periodic checkpoint)."""
        self._recognised(t, Xc.shape[0], ne)
        if self._learner is not None and self._feeding:
            self._feed_learner(Xc, t)
        if self._learn_stop is not None:
            self._check_learn_samples()
        self._periodic_checkpoint_due()

    def _feed_learner(self, Xc, t):
        """Hand the learner the subchains (S samples) ending in the block at t … t+m-1:
        one every L samples of the sequence (MATH.md §6), through :meth:`_feed`."""
        S, L = self._S, self._L
        m = Xc.shape[0]
        base = t - self._seq_start + 1 - S          # samples past S at the block's first row
        j = max(0, -base)
        j += (-(base + j)) % L
        end = m
        if self._learn_stop is not None:
            # as push: the subchains ending before the sample that reaches learn_samples
            # (the block's rows are counted already: row j is sample n_samples - m + j)
            end = min(m, self._learn_stop - (self._n_samples - m))
        if j >= end:
            return
        Hn = self._hist
        Z = self._Z   # rows Hn … Hn+m-1 hold the block, the Hn before it its history
        for j in range(j, end, L):
            self._feed(Z[Hn + j - S + 1:Hn + j + 1], t + j)

    def _feed(self, seg, t):
        """Hand the learner a copy of subchain ``seg`` (S samples) ending at ``t``, unless
        it holds a value beyond 1e150 in magnitude (its gradient overflows, and in the
        reservoir it would spoil every minibatch that drew it for a long time) or no
        value where its ELBO counts (see :func:`_informative`)."""
        learner = self._learner
        if _informative(seg, learner.counted) and not (np.abs(seg) > MAX_ABS_VALUE).any():
            learner.feed(seg.copy(), t)

    def _exact_chunk(self, Xc, out, extra_flags):
        m = Xc.shape[0]
        t = self._t
        s0 = self._seq_start
        W, lag, Hn = self._window, self._lag, self._hist
        Z = self._Z[:Hn + m]
        Z[:Hn] = self._ring.last(t - 1, Hn)
        Z[Hn:] = Xc
        nanrow = np.isnan(Z).any(axis=1)
        cs = np.zeros(Hn + m + 1, np.int64)
        np.cumsum(nanrow, out=cs[1:])
        snap = self._snapshot
        ex = snap.exact
        ne, ll = _ko.exact_run(Xc, t, s0, lag, self._alpha_ring, self._le_ring,
                               self._logc_ring, self._work, self._beta, self._g, self._ytil,
                               ex.bias, ex.Linv, ex.Ut, ex.half_c, ex.const, ex.A, ex.pi, ex.W,
                               ex.L, self._ch_theta, self._ch_mean, self._ch_tau)
        self._loglik += ll
        self._loglik_n += _n_valued(Xc)   # an empty sample's log p(y_t | y_<t) is 0
        tau = self._ch_tau[:ne]
        k = tau + lag - t
        theta, mean, rho = self._ch_theta[:ne], self._ch_mean[:ne], np.zeros((ne, self._M))
        flags = np.full(ne, extra_flags, np.int64)
        if ne:
            a_rows = Hn + k - W + 1
            flags[cs[a_rows + W] - cs[a_rows] > 0] |= FLAG_IMPUTED
            out.add(tau, theta, rho, mean, snap.version, flags)
        self._ring.write_block(t, Xc)
        new_nan = np.flatnonzero(nanrow[Hn:])
        if new_nan.size:
            self._last_nan = t + int(new_nan[-1])
            self._n_imputed += int(new_nan.size)
        self._t = t + m
        self._n_samples += m
        self._n_emitted += ne

    def flush(self) -> list:
        """End the current sequence: emit the posteriors still pending.

        In smooth mode these are the last ``h`` positions, from windows padded by
        repeating the last sample (exact mode: the exact smoothing marginals
        ``p(s_τ | y_1..y_T)``), flagged ``FLAG_EDGE``, and ``FLAG_IMPUTED`` when a sample
        they use had a missing value (recognition: the window's samples up to the last;
        exact mode: the last ``window`` samples, which every one of them is smoothed on);
        in filter mode nothing is pending.
        The next :meth:`push` starts a new sequence. During the warm-up, the model is
        first initialised from the samples buffered so far.

        Returns
        -------
        list of Posterior
        """
        self._check_open()
        posts = []
        if self._phase == "warmup":
            if self._wn == 0:
                return []
            posts = self._all_or_nothing(lambda: list(self._initialise()), lambda: 0)
        if not self._seq_open:
            return posts
        t_last = self._t - 1
        lag = self._lag
        if lag > 0:
            tau0 = max(self._seq_start, self._t - lag)
            n = t_last - tau0 + 1
            snap = self._snapshot
            theta = np.empty((n, self._M))
            mean = np.empty((n, self._D))
            flags = np.full(n, FLAG_EDGE, np.int64)
            flags[:max(0, self._warm_end - tau0)] |= FLAG_WARMUP
            if self._exact_mode:
                ex = snap.exact
                _ko.exact_tail(t_last, tau0, self._alpha_ring, self._le_ring, ex.A, self._beta,
                               self._g, ex.W, theta, mean)
                rho = np.zeros((n, self._M))
            else:
                rho = np.empty((n, self._M))
                h = lag
                ring = self._ring
                last = ring.last(t_last, 1)[0].copy()
                ring.write_block(self._t, np.repeat(last[None, :], h, axis=0))
                D = self._D
                for k in range(n):
                    tau = tau0 + k
                    _rk.forward_one(ring.flat, ring.first_row(tau + h, self._window) * D,
                                    snap.kernel_weights, self._layout, self._nmean, self._nscale,
                                    self._scratch, theta[k], rho[k])
                    _ko.reconstruct(theta[k], snap.params.W, mean[k])
            if self._exact_mode:
                # each is smoothed on the samples up to t_last: flagged, as the posterior
                # pushed with t_last, when a NaN lies in the `window` samples ending there
                # (the window ending at tau + lag missed one that smoothing of tau used)
                if self._last_nan >= t_last - self._window + 1:
                    flags |= FLAG_IMPUTED
            else:
                # the window of tau reads tau - lag .. t_last (then t_last again, as padding):
                # flagged when it holds a NaN, as the recognition kernels flag
                flags[self._last_nan >= np.arange(tau0, t_last + 1) - lag] |= FLAG_IMPUTED
            batch = PosteriorBatch(np.arange(tau0, t_last + 1, dtype=np.int64), theta, rho, mean,
                                   np.full(n, snap.version, np.int64), flags)
            posts.extend(batch)
            self._n_emitted += n
        self._seq_open = False
        return posts

    # ------------------------------------------------------------------ state
    @property
    def params(self) -> FHMMParams | None:
        """The parameters of the current snapshot (None during the warm-up)."""
        snap = self._snapshot
        return None if snap is None else snap.params

    @property
    def net(self) -> RecognitionNet | None:
        """A copy of the inference network with the current snapshot's weights."""
        if self._net is None or self._snapshot is None:
            return None
        net = self._net.copy()
        if self._snapshot.weights is not None:
            net.weights = self._snapshot.weights
        return net

    @property
    def snapshot(self) -> Snapshot | None:
        """The current parameter snapshot."""
        return self._snapshot

    @property
    def version(self) -> int:
        """Version of the current snapshot (-1 during the warm-up)."""
        snap = self._snapshot
        return -1 if snap is None else snap.version

    @property
    def warming_up(self) -> bool:
        """Whether the engine is still buffering its warm-up (a cold engine before its
        model, a filter-mode engine before its causal network): nothing has been emitted
        yet, and :meth:`flush` would end the warm-up early, from the samples buffered so
        far."""
        return self._phase == "warmup"

    @property
    def lag(self) -> int:
        """Samples between a posterior's position and the newest sample it uses."""
        return self._lag

    def filtered(self, out=None):
        """Exact mode: the forward message ``p(s_t | x_1..x_t)`` over the 2^M joint states
        and ``log p(x_t | x_<t)`` of the newest sample t, as the push that took it
        computed them (with that push's parameter snapshot).

        Parameters
        ----------
        out : ndarray, shape (2^M,), optional
            Receives the message; then only ``logc`` is returned (no allocation per
            sample for a caller that reads it after every push).

        Returns
        -------
        alpha : ndarray, shape (2^M,)
            A copy (unless ``out`` is given).
        logc : float

        Raises
        ------
        ValueError
            Not an exact-mode engine, or no sample filtered yet (a warm-up still
            buffering).
        """
        if not self._exact_mode:
            raise ValueError("filtered() needs an exact-mode engine (posterior='exact')")
        if self._phase == "warmup" or self._t == 0:
            raise ValueError("filtered(): no sample has been filtered yet")
        slot = (self._t - 1) % self._alpha_ring.shape[0]   # (the rings' slot t % (lag + 1))
        if out is not None:
            K = self._alpha_ring.shape[1]
            if not (isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == (K,)
                    and out.flags.writeable):
                raise ValueError(f"out must be a writable float64 array of shape ({K},), got "
                                 f"{type(out).__name__}"
                                 + (f" of shape {out.shape} and dtype {out.dtype}"
                                    if isinstance(out, np.ndarray) else ""))
            np.copyto(out, self._alpha_ring[slot])
            return float(self._logc_ring[slot])
        return self._alpha_ring[slot].copy(), float(self._logc_ring[slot])

    @property
    def window(self) -> int:
        return self._window

    @property
    def n_features(self) -> int | None:
        """D, the values per sample (None until a cold engine's first sample fixes it)."""
        return self._D

    @property
    def n_samples(self) -> int:
        """Samples accepted so far (the next sample's stream position)."""
        return self._t + self._wn if self._phase == "warmup" else self._t

    @property
    def learning(self) -> bool:
        """Whether learning is on (the learner takes steps, unless a service holds it
        while its stream has ended: :meth:`_pause_learner`); assignable at run time."""
        return self._learn and self._learning_wanted

    @learning.setter
    def learning(self, value: bool):
        value = check_bool(value, "learning")
        if value and not self._learn:
            raise ValueError("this engine was built with learn=False: it has no learner")
        self._learning_wanted = value
        if value:
            self._feeding = True
        self._enable_learner()

    def _enable_learner(self):
        if self._learner is not None:
            value = self._learning_wanted and not self._learner_paused
            self._learner.enabled = value
            if value and self._thread is not None:
                self._thread.wake()   # (an idle thread waits up to 0.1 s)

    def _pause_learner(self, paused: bool):
        """Hold the background learner (``paused``) or let it go on, without changing
        :attr:`learning` or what a checkpoint writes: a service holds the learners of
        streams that ended (no new samples: the steps they would take on their reservoir
        cost the streams still running their CPU) until a sample comes again."""
        self._learner_paused = bool(paused)
        self._enable_learner()

    @property
    def learner_duty(self) -> float:
        """Fraction of one core the background learner may use, in (0, 1]; assignable at
        run time (takes effect at once, and is written into checkpoints)."""
        return self._cfg["learner_duty"]

    @learner_duty.setter
    def learner_duty(self, value):
        duty = check_duty(value)
        self._cfg["learner_duty"] = duty
        thread = self._thread
        if thread is not None:
            thread.duty = duty

    @property
    def learner_error(self):
        """The exception that stopped the learner thread, if any."""
        return None if self._thread is None else self._thread.error

    @property
    def learner_steps(self) -> int:
        """SVI steps the learner kept so far (``metrics()["learner_steps"]``, without
        the rest of :meth:`metrics`)."""
        return self._learner.steps if self._learner is not None else 0

    def metrics(self) -> dict:
        """Counters and running estimates the host can read.

        Returns
        -------
        dict
            ``samples`` accepted, ``emitted`` posteriors, ``imputed`` samples (with a
            missing value), ``imputed_start`` (a cold start whose warm-up held too few
            complete samples started from mean-imputed ones), ``rejected`` samples, ``learner_steps`` kept,
            ``discarded_steps`` (non-finite), ``dropped_segments`` (learner overrun),
            ``reservoir_size``, ``snapshot_version``, ``elbo`` (running per-position ELBO
            of the learner's minibatches), ``loglik_per_sample`` (exact mode: mean
            ``log p(y_t | y_<t)`` over the samples holding a value; an empty sample's is
            0 and would make an outage look like a good fit), ``push_p50_us`` / ``push_p99_us`` / ``push_max_us``
            (over the last ``latency_window`` pushes), ``checkpoints`` written,
            ``learning``, ``learner_duty``, ``learner_cpu_s`` (CPU seconds the learner
            thread spent taking steps: its rate is at most ``learner_duty``), ``phase``,
            ``learner_error``, ``checkpoint_error`` (the last periodic or final
            checkpoint that failed, if any; it stays after later ones succeed: compare
            ``checkpoints``).
        """
        n = min(self._lat_n, self._lat.shape[0])
        if n:
            lat = self._lat[:n] / 1e3
            p50, p99 = (float(v) for v in np.percentile(lat, [50, 99]))
            pmax = float(lat.max())
        else:
            p50 = p99 = pmax = math.nan
        lr = self._learner
        err = self.learner_error
        return {
            "samples": self.n_samples,
            "emitted": self._n_emitted,
            "imputed": self._n_imputed,
            "imputed_start": self._imputed_start,
            "rejected": self._n_rejected,
            "learner_steps": lr.steps if lr else 0,
            "discarded_steps": lr.discarded if lr else 0,
            "dropped_segments": lr.dropped if lr else 0,
            "reservoir_size": lr.reservoir.size if lr else 0,
            "snapshot_version": self.version,
            "elbo": lr.elbo if lr else math.nan,
            "loglik_per_sample": self._loglik / self._loglik_n if self._loglik_n else math.nan,
            "push_p50_us": p50,
            "push_p99_us": p99,
            "push_max_us": pmax,
            "checkpoints": self._n_checkpoints,
            "learning": self.learning,
            "learner_duty": self.learner_duty,
            "learner_cpu_s": self._thread.cpu_seconds if self._thread is not None else 0.0,
            "phase": self._phase,
            "learner_error": None if err is None else repr(err),
            "checkpoint_error": None if self._ckpt_error is None else repr(self._ckpt_error),
        }

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the learner thread (writing a last checkpoint when ``checkpoint_path`` is
        set); idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        thread = self._thread
        if thread is not None:
            thread.stop()
        if self._ckpt_path is not None and self._D is not None and getattr(self, "_ready", False):
            try:
                self._checkpoint(self._ckpt_path)
            except Exception as exc:  # reported through metrics; close must not fail
                self._ckpt_error = exc
        if self._limiter is not None:
            self._limiter.release()
            self._limiter = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce_ex__(self, protocol):
        # (pickle, copy.copy and copy.deepcopy all come here; without it they failed
        # on a lock with "cannot pickle '_thread.lock' object")
        raise TypeError("a StreamEngine cannot be pickled or copied (it holds its learner "
                        "thread, locks and BLAS hold): save its state with "
                        "engine.checkpoint(path) and continue it with StreamEngine.resume(path); "
                        "the river adapters pickle that way")

    def __repr__(self) -> str:
        return (f"StreamEngine(mode={self.mode!r}, posterior={self.posterior!r}, "
                f"learn={self._learn}, n_chains={self._M}, window={self._window}, "
                f"samples={self.n_samples}, version={self.version})")

    # ------------------------------------------------------------------ checkpoints
    def _schedule_checkpoints(self, reset=False):
        every = self._cfg["checkpoint_every"]
        secs = self._cfg["checkpoint_seconds"]
        if every is None and secs is None:
            self._next_ckpt_t = None
            return
        big = 1 << 62
        base = self._t + self._wn
        self._next_ckpt_t = base + every - 1 if every is not None else big
        self._next_ckpt_ns = (time.perf_counter_ns() + int(float(secs) * 1e9)
                              if secs is not None else big)

    def _engine_arrays(self, counted: bool = True) -> tuple[dict, dict]:
        """Copies of the inference-side state, and the JSON description (the checkpoint
        count includes this one if it is ``counted``)."""
        arrays = {"ring.buf": self._ring.buf.copy(),
                  "state": np.array([self._t, self._seq_open, self._seq_start, self._last_nan,
                                     self._n_samples, self._n_emitted, self._n_imputed,
                                     self._n_rejected, self._n_checkpoints + int(counted),
                                     self._wn, self._lat_n],  # (_STATE_CHECKPOINTS: the count)
                                    dtype=np.int64),
                  "loglik": np.array([self._loglik, self._loglik_n], dtype=np.float64)}
        snap = self._snapshot
        if snap is not None:
            arrays.update(_snapshot_arrays(snap))
        elif self._params0 is not None:
            p = self._params0
            arrays.update({"params0.W": p.W, "params0.L": p.L, "params0.alpha": p.alpha,
                           "params0.beta": p.beta, "params0.startprob": p.startprob})
        if self._net is not None:
            arrays.update({f"net.{k}": v for k, v in self._net.to_arrays().items()})
        if self._learner_net is not None and self._learner_net is not self._net:
            arrays.update({f"lnet.{k}": v for k, v in self._learner_net.to_arrays().items()})
        if self._exact_mode and self._D is not None:
            arrays.update({"exact.alpha": self._alpha_ring.copy(), "exact.le": self._le_ring.copy(),
                           "exact.logc": self._logc_ring.copy()})
        if self._phase == "warmup" and self._wbuf is not None:
            # (the samples with a value and their positions; the count is state[9])
            k = self._wn_valued
            arrays["warmup.rows"] = self._wbuf[:k].copy()
            arrays["warmup.at"] = self._wat[:k].copy()
        meta = {"config": self._cfg, "phase": self._phase, "n_features": self._D,
                "new_net": self._new_net, "window": self._window,
                "shared_net": self._learner_net is self._net and self._net is not None,
                "learner": self._learner is not None, "learning": bool(self._learning_wanted),
                "imputed_start": self._imputed_start,
                "warm_end": self._warm_end, "feeding": self._feeding,
                # (the warm-up's start, networks and reservoir draw from it: a seeded
                # engine resumed mid-warm-up starts as the uninterrupted one)
                "rng": generator_to_json(self._rng),
                "S": getattr(self, "_S", None),
                "L": getattr(self, "_L", None), "C": getattr(self, "_C", None)}
        return arrays, meta

    def checkpoint(self, path=None) -> str:
        """Write the engine's whole state to ``path`` atomically.

        Parameters, network weights, optimiser state, scaler, reservoir, ring contents,
        exact-filter messages, counters and stream position; :meth:`resume` continues
        from it. The file is written to a temporary name in the same directory, fsync'ed
        and moved into place with ``os.replace``.

        Parameters
        ----------
        path : str or path-like, optional
            Default ``checkpoint_path``; ``.npz`` is appended when missing.

        Returns
        -------
        str
            The path written.
        """
        self._check_open()
        return self._checkpoint(_check_path(path, "path"))

    def _checkpoint(self, path=None, counted: bool = True) -> str:
        """:meth:`checkpoint`; not ``counted``: a copy of the state for the host's own use
        (a river adapter's pickle), which neither counts as a checkpoint written nor
        moves the count the file carries."""
        path = path if path is not None else self._ckpt_path
        if path is None:
            raise ValueError("checkpoint() needs a path (or the engine's checkpoint_path)")
        if self._D is None:
            raise ValueError("nothing to checkpoint yet: the engine has not seen a sample")
        self._run_pending_checkpoint()
        if self._learner is not None:
            with self._learner.lock:  # the snapshot and the learner state that made it
                arrays, meta = self._engine_arrays(counted)
                arrays.update({f"learner.{k}": v for k, v in self._learner.to_arrays().items()})
        else:
            arrays, meta = self._engine_arrays(counted)
        if self._ckpt_path is not None and _same_file(path, self._ckpt_path):
            # (the one file a late periodic write can target: positions are kept for it
            # alone, not for every path written, e.g. a river adapter's temporary copies)
            out = _save_newest(self._ckpt_guard, path, self._t, arrays, meta)
        else:
            from ..io.checkpoint import save_checkpoint
            out = save_checkpoint(path, arrays, meta)
        if counted:
            self._n_checkpoints += 1
        return out

    def _run_pending_checkpoint(self):
        """Complete a periodic checkpoint still waiting for the learner thread, here
        (before a checkpoint of a later position, which drains every pending segment
        into the reservoir: that one's learner state would no longer be the one at the
        waiting checkpoint's position)."""
        thread = self._thread
        if thread is None or self._learner is None:
            return
        with self._learner.lock:
            job = thread.take_job()
            after = job() if job is not None else None
        if after is not None:
            after()

    def _periodic_checkpoint(self):
        """Write a checkpoint now (never raises: a failure is kept in ``_ckpt_error``,
        ``metrics()["checkpoint_error"]``).

        With a running learner thread the engine state is captured here and the
        learner's on its thread (holding its lock, between rounds), which writes the
        file. For a consistent cut the learner state must be that at the captured
        position ``t``: the learner's ``fence`` keeps the segments fed from ``t`` on
        waiting (not in the reservoir) until the job has captured it."""
        self._schedule_checkpoints()
        path = self._ckpt_path
        thread = self._thread
        threaded = thread is not None and thread.is_alive()
        try:
            if not threaded:
                self._run_pending_checkpoint()
            arrays, meta = self._engine_arrays()
        except Exception as exc:
            self._ckpt_error = exc
            return
        if threaded:
            learner = self._learner
            engine_ref = weakref.ref(self)
            guard = self._ckpt_guard
            cut = self._t   # segments ending before it are the engine's past
            learner.fence = cut

            def job():  # runs holding the learner's lock (on its thread, or see above)
                try:
                    arrays.update({f"learner.{k}": v
                                   for k, v in learner.to_arrays(before=cut).items()})
                    engine = engine_ref()
                    if engine is not None:  # the snapshot that goes with the learner state
                        arrays.update(_snapshot_arrays(engine._snapshot))
                except Exception as exc:
                    engine = engine_ref()
                    if engine is not None:
                        engine._ckpt_error = exc
                    return None
                finally:
                    if learner.fence == cut:
                        learner.fence = None

                def write():
                    engine = engine_ref()
                    try:
                        if engine is not None:
                            # the count as of this write, this one included: the capture's
                            # count missed a write the thread had not yet made then
                            arrays["state"][_STATE_CHECKPOINTS] = engine._n_checkpoints + 1
                        if _save_newest(guard, path, cut, arrays, meta) is not None and engine is not None:
                            engine._n_checkpoints += 1
                    except Exception as exc:
                        if engine is not None:
                            engine._ckpt_error = exc
                return write

            thread.request(job)
            return
        # the same failures as on the learner thread are kept, not raised: a checkpoint
        # that falls due inside push (or the warm-up's replay) must not fail the push
        try:
            if self._learner is not None:
                with self._learner.lock:
                    arrays.update({f"learner.{k}": v for k, v in self._learner.to_arrays().items()})
            _save_newest(self._ckpt_guard, path, self._t, arrays, meta)
            self._n_checkpoints += 1
        except Exception as exc:
            self._ckpt_error = exc

    @classmethod
    def resume(cls, path, **overrides) -> "StreamEngine":
        """An engine continuing from a checkpoint written by :meth:`checkpoint`.

        Parameters
        ----------
        path : str, bytes or path-like
            The checkpoint (``.npz`` may be left out, as :meth:`checkpoint` appends it).
        **overrides
            Run-time arguments to change: ``learn`` (whether a learner runs; a pause the
            checkpoint recorded, :attr:`learning` False, stays until the host sets
            ``learning = True``), ``learner_duty``, ``learn_samples``
            (counted from the stream's start, like :attr:`n_samples`: an explicit
            ``learn_samples`` the checkpoint's position has already reached turns
            learning off at once, or, for a warm-up checkpoint, at the warm-up's end,
            whose start fit sees only the samples before the limit; the checkpoint's own
            limit, once passed, is not applied again, so learning stays as the
            checkpoint recorded it, e.g. switched back on by the host), ``learning_rate``,
            ``lr_decay_steps``, ``min_learning_rate``, ``snapshot_interval``,
            ``checkpoint_path``, ``checkpoint_every``, ``checkpoint_seconds``,
            ``latency_window``, ``blas_threads``, ``random_state``.

        Raises
        ------
        ValueError
            ``path`` is not a file name, the file is not a valid checkpoint, an override
            is unknown or invalid (as in the constructor: ``learn_samples`` needs
            ``learn=True``), or an explicit
            ``checkpoint_path`` names a directory or a file in a directory that does not
            exist (the path the checkpoint recorded is taken as it is: a failed periodic
            checkpoint is reported in ``metrics()["checkpoint_error"]``).
        FileNotFoundError
            ``path`` does not exist.
        """
        from ..io.checkpoint import load_checkpoint, path_str
        bad = set(overrides) - set(_RUNTIME_OVERRIDES)
        if bad:
            raise ValueError(f"resume() cannot override {sorted(bad)}; allowed: {_RUNTIME_OVERRIDES}")
        # (as checkpoint(): bytes are a file name too; a number or None is a ValueError)
        path = path_str(path)
        meta, arrays = load_checkpoint(path)
        try:
            return cls._from_state(meta, arrays, overrides)
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{path} is a damaged streamfhmm checkpoint: missing or malformed "
                             f"{exc}") from None
        except ValueError as exc:   # (named by the file: 477 fuzzed checkpoints were not)
            if path in str(exc):
                raise
            raise ValueError(f"{path}: {exc}") from None
        except Exception as exc:   # (an infinite counter, a field of another type, ...)
            raise ValueError(f"{path} is a damaged streamfhmm checkpoint: {type(exc).__name__}: "
                             f"{exc}") from None

    def _check_windows(self, meta):
        """ValueError unless the checkpoint's phase, mode, posterior, window and network
        agree (a checkpoint of another configuration, or a damaged one: a centred network
        run in filter mode gave wrong posteriors, a window other than the network's read
        windows of another length, a recognition engine without a network failed at every
        sample)."""
        if self._phase not in ("warmup", "running"):
            raise ValueError(f"the checkpoint's phase must be 'warmup' or 'running', got "
                             f"{self._phase!r}")
        net = self._net
        if self.posterior == "recognition":
            want = _net_mode(self.mode)
            if net is None and self._phase == "running":
                raise ValueError("this recognition-posterior checkpoint has no recognition "
                                 "network (net.*)")
            if net is not None and net.mode != want:
                raise ValueError(f"the checkpoint's mode={self.mode!r} needs a {want!r} "
                                 f"recognition network, its network is {net.mode!r}")
        elif net is not None:
            raise ValueError("an exact-posterior checkpoint has no inference network (net.*), "
                             "this one has")
        window = net.window if net is not None else self.model_window
        if self._window != window:
            raise ValueError(f"the checkpoint's window is {self._window}, its "
                             f"{'network' if net is not None else 'model'}'s {window}")

    @staticmethod
    def _warmup_from(arrays, D, wn):
        """``(wn, rows, at)``: the number of warm-up samples, those with a value and their
        positions, from a checkpoint's arrays and its count ``wn`` (one written before
        the samples with a value were kept alone has ``warmup.buf``, every sample);
        ValueError unless they agree with D and the count."""
        if "warmup.buf" in arrays and "warmup.at" not in arrays:
            buf = np.asarray(arrays["warmup.buf"], dtype=np.float64)
            if buf.ndim != 2 or buf.shape[1] != D:
                raise ValueError(f"warmup.buf has shape {buf.shape}, expected (n, {D})")
            check_fit_magnitude(buf, "warmup.buf")   # (what push lets in: see below)
            at = np.flatnonzero(~np.isnan(buf).all(axis=1))
            return len(buf), buf[at], at
        rows = np.asarray(arrays["warmup.rows"], dtype=np.float64)
        at = np.asarray(arrays["warmup.at"])
        n = len(rows) if rows.ndim == 2 else -1
        if rows.ndim != 2 or rows.shape[1] != D or at.shape != (n,) or at.dtype.kind not in "iu":
            raise ValueError(f"warmup.rows and warmup.at have shapes {rows.shape} and {at.shape}, "
                             f"expected (n, {D}) and (n,) integers")
        # what push lets into a warm-up (an inf or 1e200 resumed, then every block
        # ending the warm-up was refused, blaming the caller's clean data)
        check_fit_magnitude(rows, "warmup.rows")
        if n and (at[0] < 0 or at[-1] >= wn or (np.diff(at) <= 0).any()
                  or np.isnan(rows).all(axis=1).any()):
            raise ValueError(f"warmup.at must hold the increasing positions (0 to {wn - 1}) "
                             f"of the warm-up's samples with a value, warmup.rows those "
                             f"samples (each with a value)")
        return wn, rows, at.astype(np.int64)

    @classmethod
    def _from_state(cls, meta, arrays, overrides):
        from ..estimator import FHMM
        cfg = dict(meta["config"])
        cfg.setdefault("learner_duty", DEFAULT_LEARNER_DUTY)  # checkpoints from before it existed
        random_state = overrides.pop("random_state", None)
        # numpy scalars as Python ones, as the constructor stores them (an np.int64
        # checkpoint_every was taken, then every later checkpoint failed: the
        # configuration is written as JSON)
        cfg.update({k: (_check_new_path(v) if k == "checkpoint_path"
                        else v.item() if isinstance(v, np.generic) else v)
                    for k, v in overrides.items()})
        # (as the constructor; the checkpoint's own limit, kept by resume(learn=False), is
        # inert until learning is resumed)
        _check_learn_samples_learn(overrides.get("learn_samples"), check_bool(cfg["learn"], "learn"))
        model = FHMM(n_chains=cfg["n_chains"], window=cfg["window"], n_hidden=cfg["n_hidden"],
                     share_hidden=cfg["share_hidden"],
                     covariance_type=cfg.get("covariance_type", "full"))
        # the model's hyperparameters, as the constructor checks them (a warm-up checkpoint
        # with n_hidden=-1 or covariance_type='bogus' was taken, and its warm-up could
        # never end; n_chains=1.5 became another model)
        model._check_hyperparameters()
        self = cls.__new__(cls)
        self._closed = True
        self._set_config(cfg, random_state, new=False)
        if random_state is None and meta.get("rng") is not None:   # (older files have none)
            self._rng = generator_from_json(meta["rng"])

        def params_from(prefix):
            return FHMMParams(W=arrays[f"{prefix}.W"], L=arrays[f"{prefix}.L"],
                              alpha=arrays[f"{prefix}.alpha"], beta=arrays[f"{prefix}.beta"],
                              startprob=arrays[f"{prefix}.startprob"])

        def net_from(prefix):
            sub = {k[len(prefix) + 1:]: v for k, v in arrays.items() if k.startswith(prefix + ".")}
            return RecognitionNet.from_arrays(sub) if sub else None

        self._net = net_from("net")
        lnet = net_from("lnet")
        if meta["shared_net"] and self._net is None:
            raise ValueError("the checkpoint says the learner shares the inference network, "
                             "and it has none (net.*)")
        self._learner_net = self._net if meta["shared_net"] else lnet
        self._new_net = bool(meta["new_net"])
        self._window = int(meta["window"])
        self.model = model
        self._init_counters()
        self._learning_wanted = bool(meta.get("learning", True))
        self._imputed_start = bool(meta.get("imputed_start", False))
        warm_end = meta.get("warm_end", 0)   # (absent before it was written: 0)
        if type(warm_end) is not int or warm_end < 0 or (meta["phase"] == "warmup" and warm_end):
            raise ValueError(f"warm_end must be a stream position (an integer >= 0; 0 in a "
                             f"warm-up), got {warm_end!r}")
        self._warm_end = warm_end   # (checked against the position below)
        feeding = meta.get("feeding", True)
        if type(feeding) is not bool:
            raise ValueError(f"feeding must be true or false, got {feeding!r}")
        self._feeding = feeding
        self._learner = None
        self._thread = None
        self._snapshot = None
        self._limiter = None
        self._phase = meta["phase"]
        D = meta["n_features"]
        self._D = D
        params = params_from("params") if "params.W" in arrays else None
        self._params0 = params_from("params0") if "params0.W" in arrays else params
        if D is None and (self._params0 is not None or self._phase != "warmup"):
            # (only a cold engine before its first sample leaves D open)
            raise ValueError(f"n_features is null, but the checkpoint is in phase "
                             f"{self._phase!r}{' with parameters' if self._params0 is not None else ''}")
        if self._phase == "warmup":   # (as the constructor: resume(learn=False) was taken)
            self._check_new_net_learns(fitted=self._params0 is not None)
        if self._params0 is not None:
            model._set_params(self._params0, self._net if (self._net is not None
                                                           and self._net.mode == "centred") else None)
        self._closed = False
        try:
            if D is None:
                return self
            if cfg["blas_threads"] is not None:
                self._limiter = BlasHold(check_positive_int(cfg["blas_threads"], "blas_threads"), owner=self)
            # every array agrees with n_features and n_chains (else a resumed engine
            # refused every sample, or ran on a ring of another width), checked before
            # anything of their size is allocated (exact mode: 2^M joint states)
            M = self._M
            if self._exact_mode and not 1 <= M <= _exact.MAX_EXACT_CHAINS:
                raise ValueError(f"an exact-posterior checkpoint must have 1 to "
                                 f"{_exact.MAX_EXACT_CHAINS} chains, its configuration says {M}")
            for what, p in (("params", params), ("params0", self._params0)):
                if p is not None and (p.n_features, p.n_chains) != (D, M):
                    raise ValueError(f"{what} have {p.n_chains} chains and {p.n_features} "
                                     f"features, the engine {M} and {D}")
            for what, net in (("net", self._net), ("lnet", lnet)):
                if net is not None and (net.n_features, net.n_chains) != (D, M):
                    raise ValueError(f"{what} has {net.n_chains} chains and {net.n_features} "
                                     f"features, the engine {M} and {D}")
            self._check_windows(meta)
            self._configure(int(D))
            # the sizes the kernels index the ring and the history buffers with are those
            # of the configuration (a checkpoint that says otherwise, e.g. a history longer
            # than the ring, made the block kernel read outside the ring)
            saved = (meta["L"], meta["S"], meta["C"])
            if meta["S"] is not None and saved != (self._L, self._S, self._C):
                raise ValueError(f"the checkpoint's subchain length, segment length and ring "
                                 f"capacity (L, S, C) = {saved} do not match its configuration, "
                                 f"which gives {(self._L, self._S, self._C)}")
            ring = np.asarray(arrays["ring.buf"])
            if ring.ndim != 2 or ring.shape[1] != D:
                raise ValueError(f"ring.buf has shape {ring.shape}, expected (capacity, {D})")
            if ring.dtype.kind not in "biuf" or np.isinf(ring).any():
                raise ValueError(f"ring.buf must hold real numbers without infinities (the "
                                 f"samples pushed; NaN for a missing value), got dtype "
                                 f"{ring.dtype}{' with infinities' if ring.dtype.kind in 'biuf' else ''}")
            self._ring = RingBuffer.from_arrays(ring)
            if self._ring.capacity != self._C:
                raise ValueError("ring capacity does not match the configuration")
            st = [int(v) for v in arrays["state"]]
            if len(st) != 11:
                raise ValueError(f"state holds {len(st)} counters, expected 11")
            (self._t, seq_open, self._seq_start, self._last_nan, self._n_samples,
             self._n_emitted, self._n_imputed, self._n_rejected, self._n_checkpoints, wn,
             self._lat_n) = st
            if not 0 <= self._seq_start <= self._t or min(st[4:9]) < 0 or wn < 0:
                raise ValueError(f"state counters out of range: {st}")
            self._lat_n = 0
            self._seq_open = bool(seq_open)
            if self._warm_end > self._t:
                raise ValueError(f"warm_end {self._warm_end} lies after the stream position "
                                 f"{self._t} (the warm-up ended before it)")
            if (self._learn_stop is not None and self._n_samples >= self._learn_stop
                    and self._phase != "warmup"):
                # a limit that has passed: the checkpoint's own is not applied again (the
                # engine turned learning off when it passed; a host that switched it back
                # on keeps it), an explicit override switches learning off now. Not in a
                # warm-up: its samples are only buffered, the limit cuts the start's fit
                # and turns learning off at the warm-up's end (_initialise), as it would
                # have without the checkpoint (dropped, learning went on for ever)
                self._learn_stop = None
                if "feeding" not in meta:   # (written before it was recorded)
                    self._feeding = self._learning_wanted
                if overrides.get("learn_samples") is not None:
                    self._learning_wanted = self._feeding = False
            self._loglik, ln = (float(v) for v in arrays["loglik"])
            self._loglik_n = int(ln)
            if self._exact_mode:
                for name, attr in (("exact.alpha", "_alpha_ring"), ("exact.le", "_le_ring"),
                                   ("exact.logc", "_logc_ring")):
                    a = np.asarray(arrays[name], dtype=np.float64)
                    if a.shape != getattr(self, attr).shape:
                        raise ValueError(f"{name} has shape {a.shape}, expected "
                                         f"{getattr(self, attr).shape}")
                    # the filter state is finite (log p(y_t | y_<t) may be -inf, see
                    # filter_step): a NaN in a message stays in every later posterior
                    bad = (np.isnan(a).any() if name == "exact.logc" else
                           not np.isfinite(a).all() or (name == "exact.alpha" and (a < 0).any()))
                    if bad:
                        raise ValueError(f"{name} holds non-finite or negative values: a "
                                         f"damaged checkpoint (the exact filter state must be "
                                         f"finite, its messages non-negative)")
                    getattr(self, attr)[...] = a
                # the filtered messages the next pushes read, p(s_r | y_1..y_r) for the
                # open sequence's last lag + 1 steps r, are probability vectors (all zeros
                # or unnormalised ones passed, then every later posterior was NaN); the
                # other slots (steps before the sequence, or never written) are not read
                R = self._alpha_ring.shape[0]
                if self._seq_open and self._t > self._seq_start:
                    steps = np.arange(max(self._seq_start, self._t - R), self._t)
                    sums = self._alpha_ring[steps % R].sum(axis=1)
                    off = np.abs(sums - 1.0) > _ALPHA_SUM_TOL
                    if off.any():
                        r = int(steps[np.argmax(off)])
                        raise ValueError(f"exact.alpha must hold probability vectors (sums of 1 "
                                         f"within {_ALPHA_SUM_TOL:g}) in the slots of the open "
                                         f"sequence's steps {int(steps[0])} to {int(steps[-1])}; "
                                         f"the slot of step {r} sums to "
                                         f"{float(sums[np.argmax(off)])!r}: a damaged checkpoint")
            if self._phase == "warmup":
                self._wn, rows, at = self._warmup_from(arrays, D, wn)
                self._warmup_buffers(D, rows, at)
                self._schedule_checkpoints(reset=True)
                self._ready = True
                return self
            if self._net is not None:
                self._net_buffers()
            weights = arrays.get("snapshot.weights")
            if weights is not None and (self._net is None
                                        or np.shape(weights) != (self._net.n_weights,)):
                raise ValueError(f"snapshot.weights has shape {np.shape(weights)}, expected "
                                 f"({self._net.n_weights if self._net is not None else 0},) for "
                                 f"the recognition network")
            if weights is not None and (np.asarray(weights).dtype.kind not in "iuf"
                                        or not np.isfinite(weights).all()):
                raise ValueError("snapshot.weights must be finite real numbers (a NaN weight "
                                 "made every posterior NaN)")
            if not self._exact_mode and weights is None:
                raise ValueError("a recognition-posterior checkpoint needs snapshot.weights, "
                                 "the inference network's weights")
            self._snapshot = make_snapshot(int(arrays["snapshot.version"]), params, weights,
                                           self._exact_mode)
            if self._learn and meta["learner"]:
                self._learner = self._make_learner(params, self._learner_net, 0)
                self._learner.load_arrays({k[8:]: v for k, v in arrays.items()
                                           if k.startswith("learner.")},
                                          max_freeze=check_positive_int(
                                              cfg["net_burnin"], "net_burnin", minimum=0))
                if random_state is not None:
                    self._learner.reservoir.rng = self._rng
                else:   # one generator, as before the checkpoint (the reservoir's is the newer)
                    self._rng = self._learner.reservoir.rng
            elif self._learn:
                if self.posterior == "recognition" and self._net is None:
                    raise ValueError("this checkpoint has no recognition network")
                self._fresh_learner(params)
            elif meta["learner"] and self._learner_net is not None and self._learner_net is not self._net:
                # learn=False in exact mode: the learner's state is left, but not the
                # weights it trained its own network to (lnet.* holds the network it
                # started from): a checkpoint of this engine resumed with learning again
                # went on from untrained weights, without the burn-in that protects the
                # model from them
                x = np.asarray(arrays.get("learner.x", np.empty(0)))
                nm = _model_vec_size(self._M, self._D)
                want = nm + self._learner_net.n_weights
                if x.shape != (want,) or x.dtype.kind != "f" or not np.isfinite(x).all():
                    raise ValueError(f"learner.x must hold {want} finite numbers (the model's "
                                     f"{nm} and its network's {self._learner_net.n_weights}), "
                                     f"got shape {x.shape} of {x.dtype}")
                self._learner_net.weights = x[nm:].copy()
            if self._learner is not None:
                self._start_thread()
            self._ready = True
            self._schedule_checkpoints(reset=True)
        except BaseException:
            self.close()
            raise
        return self
