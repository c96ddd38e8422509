"""Stochastic variational learning without messages (paper §3.3; MATH.md §5).

Each step samples a minibatch of subchains (:mod:`.sampler`), computes the per-position
mean of the ELBO gradient with respect to the model parameters and the recognition
network weights together (:mod:`.objective`), and takes an RMSprop ascent step. The
learning rate follows a cosine schedule from ``learning_rate`` down to
``learning_rate * final_lr_ratio`` over the run (the run's length is ``max_iter`` steps
or ``time_budget`` seconds, whichever ends first), so the last steps average out the
minibatch noise.

With ``covariance_type="diag"`` or ``"spherical"`` the starting Σ is projected onto the
family (:func:`~streamfhmm.learn.objective.constrain_params`) and every step keeps it
there exactly (:func:`~streamfhmm.kernels.svi.constrain_model_grad`).
"""
from __future__ import annotations

import math
import numbers
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .._blas import BlasHold
from .._validation import (check_bounds, check_fit_magnitude, check_generator, check_observations,
                           check_positive_int, check_real)
from ..kernels import svi as _ks
from ..model import FHMMParams, check_params
from ..network import RecognitionNet, check_net
from .objective import ModelPacker, check_covariance_type, constrain_params, covariance_mode
from .sampler import SubchainSampler

__all__ = ["DEFAULT_MAX_ITER", "RMSprop", "SVIState", "apply_gradient_sum", "check_n_jobs",
           "check_init", "check_restarts", "check_svi_settings", "fit_svi", "start_state"]

#: SVI steps of ``FHMM.fit`` when ``max_iter`` is None
DEFAULT_MAX_ITER = 20_000


def check_svi_settings(max_iter, batch_size, subchain_length, learning_rate, final_lr_ratio,
                       decay, time_budget) -> tuple:
    """Validate an SVI run's settings (see :meth:`streamfhmm.FHMM.fit`) and return them.

    ``max_iter``, ``batch_size`` ≥ 1 and ``subchain_length`` (None or ≥ 1) as ints;
    ``learning_rate > 0``, ``final_lr_ratio`` in [0, 1], ``decay`` (RMSprop's γ) in
    [0, 1) and ``time_budget`` (None or ≥ 0 seconds) as floats.
    """
    return (check_positive_int(max_iter, "max_iter"),
            check_positive_int(batch_size, "batch_size"),
            None if subchain_length is None else check_positive_int(subchain_length, "subchain_length"),
            check_real(learning_rate, "learning_rate", low_open=True),
            check_real(final_lr_ratio, "final_lr_ratio", 0.0, 1.0),
            check_real(decay, "decay", 0.0, 1.0, high_open=True),
            None if time_budget is None else check_real(time_budget, "time_budget"))


def check_restarts(n_restarts, restart_steps, max_iter, time_budget) -> tuple:
    """``FHMM.fit``'s ``n_restarts`` (an int ≥ 1) and ``restart_steps``, resolved (None:
    a sixth of ``max_iter``, itself None for the default 20,000) and checked to lie in
    [1, max_iter) when there are restarts, which need ``max_iter`` steps, not a
    ``time_budget``."""
    n_restarts = check_positive_int(n_restarts, "n_restarts")
    if restart_steps is not None:
        restart_steps = check_positive_int(restart_steps, "restart_steps")
    if n_restarts == 1:
        if restart_steps is not None:
            raise ValueError(f"restart_steps applies with n_restarts > 1 (the steps after which "
                             f"runs are compared), got restart_steps={restart_steps} with one run")
        return n_restarts, None
    if time_budget is not None:
        raise ValueError("n_restarts needs a schedule of max_iter steps, not a time_budget: "
                         "the runs are compared after the same steps")
    total = DEFAULT_MAX_ITER if max_iter is None else max_iter
    if restart_steps is None:
        if total < 6:
            raise ValueError(f"max_iter={total} is too few steps for n_restarts: the runs are "
                             f"compared after a sixth of them (at least 6 steps)")
        return n_restarts, total // 6
    if restart_steps >= total:
        raise ValueError(f"restart_steps must be an integer in [1, max_iter) = [1, {total:,}), "
                         f"got {restart_steps:,}")
    return n_restarts, restart_steps


_INITS = ("auto", "smf", "kmeans", "params")
#: start kinds a run of ``n_restarts`` may be given (``FHMM.fit(init=(...))``)
_RUN_INITS = ("smf", "kmeans")


def check_init(init, n_restarts: int, n_init: int = 1) -> tuple:
    """``FHMM.fit``'s ``init``: one of :data:`_INITS`, or a sequence of
    :data:`_RUN_INITS` with one entry per run of ``n_restarts`` (an int ≥ 1, checked by
    the caller); ``n_init`` > 1 needs an ``"smf"`` or ``"auto"`` start among them.
    Returns the first run's start kind and the tuple of every run's (``n_restarts``
    copies of a single kind)."""
    if isinstance(init, str):
        kinds = (init,) * n_restarts
        if init not in _INITS:
            raise ValueError(f"init must be one of {', '.join(map(repr, _INITS))}, or one of "
                             f"{', '.join(map(repr, _RUN_INITS))} per run of n_restarts, got {init!r}")
    else:
        kinds = _run_inits(init, n_restarts)
    if n_init > 1 and "smf" not in kinds and "auto" not in kinds:
        raise ValueError(f"n_init applies to init='smf' or 'auto' (SMF starts kept by their "
                         f"likelihood), got n_init={n_init} with init={init!r}")
    return kinds[0], kinds


def _run_inits(init, n_restarts: int) -> tuple:
    """A sequence ``init`` of start kinds, one per run (:func:`check_init`)."""
    try:
        kinds = tuple(init)
    except TypeError:
        raise ValueError(f"init must be a str or a sequence of start kinds (one per run of "
                         f"n_restarts), got {type(init).__name__}") from None
    if len(kinds) != n_restarts or not all(isinstance(k, str) and k in _RUN_INITS for k in kinds):
        raise ValueError(f"init as a sequence gives each of the n_restarts={n_restarts} runs its "
                         f"start: {n_restarts} of {', '.join(map(repr, _RUN_INITS))}, got {init!r}")
    return kinds


def check_n_jobs(n_jobs) -> int:
    """The number of threads of a local SVI fit: an int ≥ 1, or -1 for one per processor
    this process may run on (its CPU affinity where the system has one, else
    ``os.cpu_count()``)."""
    if (isinstance(n_jobs, numbers.Integral) and not isinstance(n_jobs, (bool, np.bool_))
            and n_jobs == -1):
        if hasattr(os, "sched_getaffinity"):
            return max(1, len(os.sched_getaffinity(0)))
        return os.cpu_count() or 1
    return check_positive_int(n_jobs, "n_jobs (or -1 for every processor)")


def apply_gradient_sum(x, grad, value, counted, opt, lr, n_model, model_lr_scale, units,
                       project=None):
    """The RMSprop step of a learner whose batch was summed in parts (threads, Dask
    workers): ``∇ = grad / counted`` (``grad`` is divided in place), mapped by
    ``project(∇)`` in place when given (the Dask workers' sums are not yet on the
    covariance family), then :func:`~streamfhmm.kernels.svi.rmsprop_update`, as the
    one-call step (:func:`~streamfhmm.kernels.svi.svi_step`) does. Returns the
    per-position ELBO ``value / counted``, or NaN when it or the gradient is not finite
    (then ``x`` and ``opt`` are unchanged)."""
    grad /= counted
    if project is not None:
        project(grad)
    if not (math.isfinite(value) and _ks.rmsprop_update(x, grad, opt.sq, opt.decay, opt.eps, lr,
                                                       opt.steps, n_model, model_lr_scale, units)):
        return math.nan
    return value / counted


class _ThreadedStep:
    """One SVI step with the batch's gradient computed by ``n_jobs`` threads.

    The step's ``B`` subchains are dealt out in ``n_jobs`` consecutive groups (sizes
    differing by at most one); each thread runs the compiled
    :func:`~streamfhmm.kernels.svi.batch_gradient` (which holds no GIL) on its group
    with its own scratch and gradient vector, the calling thread taking the first group.
    The sums are added in group order and applied by :func:`apply_gradient_sum`: the
    one-thread step to rounding, and the same run for the same ``n_jobs`` whatever the
    threads' timing.
    """

    def __init__(self, n_jobs, sampler, net, M, D, size, n_model, cov_mode):
        B = sampler.batch_size
        sizes = [B // n_jobs + (1 if j < B % n_jobs else 0) for j in range(n_jobs)]
        self.groups = []
        first = 0
        for n_blocks in sizes:
            scratch = _ks.batch_scratch(n_blocks * (sampler.subchain_length + 1), n_blocks,
                                        net.n_inputs, net.n_groups * net.n_hidden, M, D)
            self.groups.append((first, n_blocks, scratch, np.empty(size)))
            first += n_blocks
        self.sampler, self.net, self.M, self.D = sampler, net, M, D
        self.n_model, self.cov_mode = n_model, cov_mode
        self.units = np.empty(n_model)
        _ks.model_units(M, D, net.scale, self.units)
        self.pool = ThreadPoolExecutor(max_workers=n_jobs - 1, thread_name_prefix="svi")

    def _gradient(self, group, x):
        _, _, sc, grad = group
        net = self.net
        return _ks.batch_gradient(self.X, sc.rows, sc.row_start, sc.row_end, sc.offsets,
                                  sc.first, net.window, net.offset, net.mean, net.scale, x,
                                  self.n_model, net.layout, self.M, self.D, sc.Xw, sc.hidden,
                                  sc.theta, sc.rho, sc.g_theta, sc.g_rho, sc.Yb, grad,
                                  self.cov_mode)

    def __call__(self, X, x, grad, opt, lr, model_lr_scale):
        s = self.sampler
        s.ensure(s.batch_size)
        for first, n_blocks, sc, _ in self.groups:
            _ks.fill_batch(s.q_start, s.q_stop, s.q_lo, s.q_hi, s.cursor + first, n_blocks,
                           sc.rows, sc.row_start, sc.row_end, sc.offsets, sc.first)
        s.advance(s.batch_size)
        self.X = X
        futures = [self.pool.submit(self._gradient, g, x) for g in self.groups[1:]]
        value, counted = self._gradient(self.groups[0], x)
        grad[:] = self.groups[0][3]
        for g, f in zip(self.groups[1:], futures):
            v, c = f.result()
            value += v
            counted += c
            grad += g[3]
        return apply_gradient_sum(x, grad, value, counted, opt, lr, self.n_model,
                                  model_lr_scale, self.units)

    def close(self):
        self.pool.shutdown(wait=True)


class RMSprop:
    """RMSprop ascent over one flat parameter vector (MATH.md §5).

    ``g² ← γ g² + (1-γ) ∇²``, ``x ← x + η ∇ / (√g² + ε)``.

    Parameters
    ----------
    size : int
        Length of the parameter vector.
    decay : float in [0, 1)
        γ.
    eps : float > 0
        ε.
    """

    def __init__(self, size: int, decay: float = 0.9, eps: float = 1e-8):
        size = check_positive_int(size, "size")
        self.decay = check_real(decay, "decay", 0.0, 1.0, high_open=True)
        self.eps = check_real(eps, "eps", low_open=True)
        self.sq = np.zeros(size)
        self.steps = 0

    def step(self, x: np.ndarray, grad: np.ndarray, lr: float):
        """Update ``x`` in place with the compiled rule the learners use
        (:func:`streamfhmm.kernels.svi.rmsprop_update`, bias-corrected ``g²``).

        ``x`` must be a writable float64 array and ``grad`` an array, both of shape
        ``(size,)``; ``lr`` a finite number ≥ 0. Otherwise ValueError, ``x`` unchanged.
        """
        n = self.sq.shape[0]
        if not (isinstance(x, np.ndarray) and x.dtype == np.float64 and x.shape == (n,)
                and x.flags.writeable):
            raise ValueError(f"x must be a writable float64 array of shape ({n},) (updated in "
                             f"place), got {x.shape if isinstance(x, np.ndarray) else type(x).__name__}"
                             f"{' of dtype ' + str(x.dtype) if isinstance(x, np.ndarray) else ''}")
        grad = np.asarray(grad)
        if grad.shape != (n,) or not (np.issubdtype(grad.dtype, np.floating)
                                      or np.issubdtype(grad.dtype, np.integer)):
            raise ValueError(f"grad must be a real array of shape ({n},), got shape {grad.shape} "
                             f"and dtype {grad.dtype}")
        lr = check_real(lr, "lr")
        if not _ks.rmsprop_update(x, grad.astype(np.float64, copy=False), self.sq, self.decay,
                                  self.eps, lr, self.steps):
            raise FloatingPointError("non-finite gradient: parameters left unchanged")
        self.steps += 1


def cosine_lr(lr: float, final_ratio: float, progress: float) -> float:
    """Cosine decay from ``lr`` (progress 0) to ``lr * final_ratio`` (progress 1)."""
    p = min(max(progress, 0.0), 1.0)
    return lr * (final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * p)))


@dataclass
class SVIState:
    """Everything a learner needs to continue: parameters, network, optimiser state."""

    packer: ModelPacker
    model_vec: np.ndarray
    net: RecognitionNet
    opt: RMSprop
    iteration: int = 0
    history: list = field(default_factory=list)
    covariance_type: str = "full"
    #: seconds the earlier calls spent, and their running ELBO average: a continued run
    #: (the best of several restarts) logs on from them (its "time" went back to 0 and
    #: its average started over)
    seconds: float = 0.0
    running: float | None = None

    @property
    def params(self) -> FHMMParams:
        return self.packer.unpack(self.model_vec)

    def state_vector(self) -> np.ndarray:
        """Model vector and network weights, concatenated (the optimiser's view)."""
        return np.concatenate([self.model_vec, self.net.weights])


def start_state(state, params, net, decay: float, covariance_type) -> SVIState:
    """The state a learner continues from: ``state``, checked to be an
    :class:`SVIState`, or when it is None a new one from ``params``, a copy of ``net``
    (checked to be their networks) and a fresh :class:`RMSprop` of ``decay``.
    ``covariance_type`` (None: ``"full"``) is the new state's family; a continued
    state's is left to the caller (after its other checks)."""
    if state is not None:
        if not isinstance(state, SVIState):
            raise ValueError(f"state must be an SVIState, got {type(state).__name__}")
        return state
    check_params(params)
    check_net(net, params.n_chains, params.n_features, "params'")
    ctype = check_covariance_type("full" if covariance_type is None else covariance_type)
    packer = ModelPacker(params.n_chains, params.n_features)
    return SVIState(packer=packer, model_vec=packer.pack(constrain_params(params, ctype)),
                    net=net.copy(), opt=RMSprop(packer.size + net.n_weights, decay=decay),
                    covariance_type=ctype)


def advance_bar(bar, i: int) -> None:
    """Count step ``i`` (1-based, of this call) on the progress bar ``bar`` (None: no bar).

    The bar's clock restarts after the first step, which may have compiled the kernels
    (a first fit after installing: about a minute): counted from the start, tqdm showed
    a minute per step and an ETA of days for most of a fit.
    """
    if bar is None:
        return
    if i == 1:
        bar.reset()
    bar.update(1)


def count_step(state: SVIState, value: float) -> None:
    """A step of a learner loop taken: the iteration and the running ELBO average (both
    carried over from the state's earlier calls)."""
    state.iteration += 1
    state.running = value if state.running is None else 0.98 * state.running + 0.02 * value


def log_step(state: SVIState, entry: dict, x: np.ndarray, bar, callback) -> None:
    """Record one logged step of a learner loop: append ``entry`` to the history, show
    its ELBO on the progress bar, and hand ``callback`` the state with the model vector
    and network weights taken from the learner's vector ``x``."""
    state.history.append(entry)
    if bar is not None:
        bar.set_postfix(elbo=f"{entry['elbo']:.4f}")
    if callback is not None:
        store(state, x)
        callback(state)


def store(state: SVIState, x: np.ndarray) -> None:
    """Write the learner's vector ``x`` (model vector, then network weights) into
    ``state``."""
    nm = state.packer.size
    state.model_vec, state.net.weights = x[:nm].copy(), x[nm:]


def fit_svi(X, bounds, params: FHMMParams, net: RecognitionNet, *, max_iter: int = 10_000,
            batch_size: int = 10, subchain_length: int | None = None,
            learning_rate: float = 1e-2, final_lr_ratio: float = 0.01, decay: float = 0.9,
            time_budget: float | None = None, rng: np.random.Generator,
            progress: bool | str = True, log_every: int | None = None, state: SVIState | None = None,
            callback=None, covariance_type: str | None = None, net_warmup: int = 0,
            n_jobs: int = 1, schedule_start: int = 0,
            schedule_length: int | None = None) -> SVIState:
    """Run SVI from ``params`` and ``net`` (or continue ``state``).

    Parameters
    ----------
    X : array_like, shape (T, D)
        Observations (NaN = missing; no infinities, no row without an observed value).
    bounds : array_like of int, shape (n_sequences + 1,)
        Sequence i is ``X[bounds[i]:bounds[i+1]]``: non-decreasing, inside ``[0, T]``.
    params : FHMMParams
        Starting model (ignored when ``state`` is given).
    net : RecognitionNet
        Starting networks for ``params``' chains and features, scaler set (ignored when
        ``state`` is given).
    max_iter, batch_size, subchain_length, learning_rate, final_lr_ratio, decay, time_budget
        See :meth:`streamfhmm.FHMM.fit`.
    rng : numpy.random.Generator
    progress : bool or str
        Show a progress bar (a str: labelled so; default label "svi").
    log_every : int, optional
        Append to ``history`` every so many steps (default: 100 entries per run).
    callback : callable, optional
        ``callback(state)`` after each logged step.
    covariance_type : {"full", "diag", "spherical"}, optional
        Family of the noise covariance Σ (default: ``state``'s, else ``"full"``). The
        start is projected onto it (diag: ``L = diag(√Σ_dd)``; spherical:
        ``L = √(tr Σ / D) I``) and every step keeps it.
    net_warmup : int
        The first ``net_warmup`` steps of this call train the networks only, the model held
        where it starts (see :meth:`streamfhmm.FHMM.fit`).
    n_jobs : int
        Threads computing each step's gradient (-1: one per processor; at most
        ``batch_size``), see :meth:`streamfhmm.FHMM.fit`. 1 (the default) runs the
        whole step as one compiled call.
    schedule_start, schedule_length : int
        This call's steps are steps ``schedule_start + 1 …`` of a cosine schedule
        ``schedule_length`` steps long (default: this call's ``max_iter`` steps from 0):
        a run split into calls, e.g. restarts continued by the best
        (:meth:`streamfhmm.FHMM.fit`'s ``n_restarts``), follows one schedule.

    Returns
    -------
    SVIState
    """
    net_warmup = check_positive_int(net_warmup, "net_warmup", minimum=0)
    n_jobs = check_n_jobs(n_jobs)
    check_generator(rng)
    (max_iter, batch_size, subchain_length, learning_rate, final_lr_ratio, decay,
     time_budget) = check_svi_settings(max_iter, batch_size, subchain_length, learning_rate,
                                       final_lr_ratio, decay, time_budget)
    schedule_start = check_positive_int(schedule_start, "schedule_start", minimum=0)
    schedule_length = (schedule_start + max_iter if schedule_length is None
                       else check_positive_int(schedule_length, "schedule_length"))
    if schedule_start + max_iter > schedule_length:
        raise ValueError(f"schedule_start + max_iter must be at most schedule_length, got "
                         f"{schedule_start:,} + {max_iter:,} > {schedule_length:,}")
    if log_every is not None:   # (as the distributed learner checks it)
        log_every = check_positive_int(log_every, "log_every")
    continued = state is not None
    state = start_state(state, params, net, decay, covariance_type)
    X = check_fit_magnitude(check_observations(X, n_features=state.packer.n_features, allow_nan=True))
    bounds = check_bounds(bounds, X.shape[0])
    if continued and covariance_type is not None:
        state.covariance_type = check_covariance_type(covariance_type)
    packer, net = state.packer, state.net
    cov_mode = covariance_mode(state.covariance_type)
    # on the family, with the spherical λ_d's RMSprop accumulators equal
    _ks.constrain_model(state.model_vec, state.opt.sq, packer.n_chains, packer.n_features, cov_mode)
    L = net.window if subchain_length is None else subchain_length
    sampler = SubchainSampler(bounds, L, batch_size, rng)
    B = sampler.batch_size
    n_max = sampler.max_rows
    M, D = packer.n_chains, packer.n_features
    n_jobs = min(n_jobs, B)
    if n_jobs == 1:  # the threads have their own
        (rows, row_start, row_end, offsets, first, Xw, hidden, theta, rho, g_theta, g_rho,
         Yb) = _ks.batch_scratch(n_max, B, net.n_inputs, net.n_groups * net.n_hidden, M, D)
    x = state.state_vector()
    nm = packer.size
    grad = np.empty_like(x)
    log_every = log_every or max(1, min(max_iter // 100, 500))
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=max_iter, desc=progress if isinstance(progress, str) else "svi",
                   unit="it", leave=False, mininterval=0.5)
    t0 = time.perf_counter()
    opt = state.opt
    # one BLAS thread: the step's products are small, and on a busy machine
    # multithreaded BLAS waits for its threads far longer than it computes
    # (a hold, as the streaming engines take: the limit is the process's, and an engine
    # opened during the fit and closed after it must find it as it was)
    limiter = BlasHold(1)
    threaded = None
    try:
        if n_jobs > 1:
            threaded = _ThreadedStep(n_jobs, sampler, net, M, D, x.size, nm, cov_mode)
        for i in range(1, max_iter + 1):
            elapsed = time.perf_counter() - t0
            frac = (schedule_start + i) / schedule_length
            if time_budget:
                frac = max(frac, elapsed / time_budget)
            lr = cosine_lr(learning_rate, final_lr_ratio, frac)
            held = 0.0 if i <= net_warmup else 1.0
            if threaded is not None:
                value = threaded(X, x, grad, opt, lr, held)
            else:
                sampler.ensure(B)
                _ks.fill_batch(sampler.q_start, sampler.q_stop, sampler.q_lo, sampler.q_hi,
                               sampler.cursor, B, rows, row_start, row_end, offsets, first)
                sampler.advance(B)
                value = _ks.svi_step(X, rows, row_start, row_end, offsets, first, net.window,
                                     net.offset, net.mean, net.scale, x, nm, net.layout, M, D,
                                     opt.sq, opt.decay, opt.eps, lr, opt.steps, Xw, hidden, theta,
                                     rho, g_theta, g_rho, Yb, grad, cov_mode, held)
            if not np.isfinite(value):
                raise FloatingPointError(f"non-finite ELBO gradient at iteration {state.iteration + 1}; "
                                         f"parameters left at the previous step")
            opt.steps += 1
            count_step(state, value)
            out_of_time = time_budget is not None and elapsed >= time_budget
            if i % log_every == 0 or i == max_iter or out_of_time:
                log_step(state, {"iteration": state.iteration, "elbo": state.running, "lr": lr,
                                 "time": state.seconds + elapsed}, x, bar, callback)
            advance_bar(bar, i)
            if out_of_time:
                break
    finally:
        # the steps taken so far, also when a step fails (iteration and the RMSprop
        # statistics already count them: the state stays consistent and can continue);
        # not a vector a diverging step overflowed (the error says so; writing it would
        # raise here and hide that error); the threads first (they only read x)
        if threaded is not None:
            threaded.close()
        state.seconds += time.perf_counter() - t0
        if np.isfinite(x).all():
            store(state, x)
        limiter.release()
        if bar is not None:
            bar.close()
    return state
