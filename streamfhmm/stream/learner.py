"""The background learner of :class:`~streamfhmm.stream.engine.StreamEngine`
(paper §3.3; MATH.md §5).

A :class:`Learner` holds the model vector, the recognition network weights and the
RMSprop state, and runs SVI steps on minibatches of subchains drawn from a
:class:`~streamfhmm.stream.reservoir.Reservoir` of raw stream segments, through
:func:`~streamfhmm.kernels.online.svi_run` (compiled, without the GIL). A step whose
gradient, ELBO or result is not finite is discarded and counted; nothing non-finite
ever reaches the parameters.

A :class:`LearnerThread` drives it in the background: it takes the segments the
stream hands over (a deque: appending and popping are atomic, so the inference path
takes no lock), runs steps (a few per compiled call, yielding the processor between
calls), and publishes an immutable :class:`Snapshot` that the inference path picks up
by a reference swap. Its ``duty`` bounds the share of one core it
uses: after a round of steps that took τ seconds of its CPU time it waits
``τ (1 - duty) / duty``, so its CPU time over any stretch of learning is at most ``duty``
times the wall time (plus one round).
"""
from __future__ import annotations

import json
import logging
import math
import numbers
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..kernels import exact as _kx
from ..kernels import online as _ko
from ..kernels.svi import batch_scratch
from ..learn.objective import ModelPacker, constrain_params, covariance_mode
from ..model import FHMMParams
from ..network import RecognitionNet
from . import DEFAULT_LEARNER_DUTY
from .reservoir import Reservoir

__all__ = ["ExactTables", "Snapshot", "make_snapshot", "Learner", "LearnerThread", "check_duty",
           "DEFAULT_LEARNER_DUTY"]

_log = logging.getLogger("streamfhmm")

#: yield the processor to another runnable thread (``time.sleep(0)`` where the platform
#: has no ``sched_yield``); releases the GIL
_yield_cpu = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))

#: longest wait of an idle learner thread (seconds): its wait doubles from ``idle_sleep``
#: with each round that found nothing to do (a disabled learner, a reservoir still
#: filling), up to this; work, a job, a new duty or :meth:`LearnerThread.wake` end it
_MAX_IDLE_SLEEP = 0.1

#: longest single wait of the learner thread (seconds): a tiny duty asks for waits beyond
#: what ``Event.wait`` accepts (OverflowError, which stopped the thread); the loop
#: recomputes the rest of a longer wait when this one ends
_MAX_WAIT = 60.0


def check_duty(duty, name: str = "learner_duty") -> float:
    """``duty`` as a float in (0, 1], or ValueError naming ``name``."""
    # a number, not a numeric string or a bool (float() took "0.5", b"1" and numpy's True)
    if isinstance(duty, (bool, np.bool_)) or not isinstance(duty, numbers.Real) \
            or not 0.0 < float(duty) <= 1.0:
        raise ValueError(f"{name} must be a number in (0, 1] (the fraction of one core the "
                         f"learner may use), got {duty!r}")
    return float(duty)


def _frozen(a) -> np.ndarray:
    a = np.array(a, dtype=np.float64, order="C", copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class ExactTables:
    """Per-parameter-set tables of the exact kernels (MATH.md §7)."""

    bias: np.ndarray
    Linv: np.ndarray
    Ut: np.ndarray
    half_c: np.ndarray
    const: float
    A: np.ndarray
    pi: np.ndarray
    W: np.ndarray
    L: np.ndarray

    @classmethod
    def from_params(cls, params: FHMMParams) -> "ExactTables":
        Linv, Ut, half_c, const = _kx.prepare_emission(params.W, params.L)
        pi = np.empty(1 << params.n_chains)
        _kx.joint_startprob(params.startprob, pi)
        return cls(bias=_frozen(params.W[-1]), Linv=_frozen(Linv), Ut=_frozen(Ut),
                   half_c=_frozen(half_c), const=float(const), A=_frozen(params.transmat),
                   pi=_frozen(pi), W=params.W, L=_frozen(params.L))


@dataclass(frozen=True, eq=False)
class Snapshot:
    """An immutable parameter set the inference path reads.

    Attributes
    ----------
    version : int
        0 for the parameters the engine started with, +1 per publication.
    params : FHMMParams
    exact : ExactTables or None
        Tables of the exact kernels (exact mode).
    kernel_weights : ndarray or None
        A copy of the inference network's weights (recognition mode), writeable typed
        for the compiled kernels only, which never write it: Numba compiles a kernel
        once per array type, and a read-only argument is another type, so the
        network's forward pass was compiled twice, for the learner's weights and for
        these (4-15 s of a first run). Everything else reads :attr:`weights`.
    """

    version: int
    params: FHMMParams
    exact: ExactTables | None
    kernel_weights: np.ndarray | None = field(default=None, repr=False)

    @property
    def weights(self) -> np.ndarray | None:
        """The inference network's weights, read-only (a view of ``kernel_weights``)."""
        if self.kernel_weights is None:
            return None
        view = self.kernel_weights.view()
        view.setflags(write=False)
        return view

    @property
    def W(self) -> np.ndarray:
        return self.params.W


def make_snapshot(version: int, params: FHMMParams, weights=None, exact: bool = False) -> Snapshot:
    """A :class:`Snapshot`; ``weights`` is copied, the exact tables computed if ``exact``."""
    kernel = None if weights is None else np.array(weights, dtype=np.float64, order="C", copy=True)
    return Snapshot(version=int(version), params=params,
                    exact=ExactTables.from_params(params) if exact else None, kernel_weights=kernel)


class Learner:
    """SVI on a reservoir of raw segments (no thread; see :class:`LearnerThread`).

    Parameters
    ----------
    params : FHMMParams
        Starting model (its start probabilities are replaced by the stationary ones,
        as in every SVI fit).
    net : RecognitionNet
        Starting network (weights copied; its scaler is used as is).
    reservoir : Reservoir
        ``segment_length`` must be ``subchain_length + net.window``.
    batch_size : int
        Subchains per step.
    subchain_length : int
        Counted positions per subchain (L).
    learning_rate : float
        RMSprop step size η.
    lr_decay_steps : float, optional
        ``η_k = η / √(1 + k / lr_decay_steps)`` (floored at ``min_learning_rate``);
        ``None``: constant η (a stream has no end).
    min_learning_rate : float
    decay, eps : float
        RMSprop's γ and ε.
    freeze_steps : int
        The first so many steps train the network only (the model part is held fixed):
        a new network's first outputs carry no information about the chains, and the
        model's gradient through them would only pull good parameters away.
    exact : bool
        Snapshots carry the exact kernels' tables.
    publish_weights : bool
        Snapshots carry the network weights (the inference path uses the network).
    version : int
        Version of the last published snapshot.
    max_pending : int
        Segments waiting for the learner beyond this are dropped (counted).
    covariance_type : {"full", "diag", "spherical"}
        Family of the noise covariance: the starting Σ is projected onto it and every
        step keeps it (:func:`~streamfhmm.kernels.svi.constrain_model_grad`).
    """

    def __init__(self, params: FHMMParams, net: RecognitionNet, reservoir: Reservoir, *,
                 batch_size: int = 10, subchain_length: int = 10, learning_rate: float = 1e-3,
                 lr_decay_steps=None, min_learning_rate: float = 0.0, decay: float = 0.9,
                 eps: float = 1e-8, freeze_steps: int = 0, exact: bool = False,
                 publish_weights: bool = True, version: int = 0, max_pending: int = 10_000,
                 covariance_type: str = "full"):
        self.packer = ModelPacker(params.n_chains, params.n_features)
        self.net = net.copy()
        self.reservoir = reservoir
        self.batch_size = int(batch_size)
        self.subchain_length = int(subchain_length)
        if reservoir.segment_length != self.subchain_length + self.net.window:
            raise ValueError(f"reservoir segments must hold subchain_length + window = "
                             f"{self.subchain_length + self.net.window} samples, got "
                             f"{reservoir.segment_length}")
        #: the rows of a reservoir segment whose positions the ELBO counts: the
        #: subchain_length after the first, which the network's window centres (or ends)
        #: at row net.offset (kernels.online.svi_run)
        self.counted = slice(self.net.offset + 1, self.net.offset + 1 + self.subchain_length)
        self.learning_rate = float(learning_rate)
        self.lr_decay_steps = None if lr_decay_steps is None else float(lr_decay_steps)
        self.min_learning_rate = float(min_learning_rate)
        self.decay = float(decay)
        self.eps = float(eps)
        self.freeze_remaining = int(freeze_steps)
        self.exact = bool(exact)
        self.publish_weights = bool(publish_weights)
        self.version = int(version)
        self.max_pending = int(max_pending)
        self.cov_mode = covariance_mode(covariance_type)
        self.x = np.concatenate([self.packer.pack(constrain_params(params, covariance_type)),
                                 self.net.weights])
        self.nm = self.packer.size
        self.sq = np.zeros_like(self.x)
        self.steps = 0
        self.discarded = 0
        self.dropped = 0
        self.elbo = math.nan
        self.enabled = True
        self.lock = threading.Lock()
        self.pending = deque()
        #: stream position: while set, :meth:`drain` leaves the segments ending at or
        #: after it pending (a checkpoint's cut, see :meth:`to_arrays`)
        self.fence = None
        self._last_good = self.x.copy()
        self._sq_good = self.sq.copy()     # RMSprop's mean squares at _last_good
        self._alloc()

    def _alloc(self):
        B, L, net = self.batch_size, self.subchain_length, self.net
        M, D = self.packer.n_chains, self.packer.n_features
        n = B * (L + 1)
        (self._rows, self._row_start, self._row_end, self._offsets, self._first, self._Xw,
         self._hidden, self._theta, self._rho, self._g_theta, self._g_rho,
         self._Yb) = batch_scratch(n, B, net.n_inputs, net.n_groups * net.n_hidden, M, D)
        self._grad = np.empty_like(self.x)
        self._x_prev = np.empty_like(self.x)
        self._sq_prev = np.empty_like(self.x)
        self._values = np.empty(0)
        self._lr_const = None

    # -- the stream side (any thread) --------------------------------------------------
    def feed(self, segment: np.ndarray, end: int) -> None:
        """Hand over one raw segment (copied by the caller); never blocks."""
        if len(self.pending) >= self.max_pending:
            self.dropped += 1
            return
        self.pending.append((segment, end))

    # -- the learner side (hold ``lock``) ----------------------------------------------
    def drain(self, before=None) -> int:
        """Offer the pending segments to the reservoir, in stream order; returns how many.

        Parameters
        ----------
        before : int, optional
            Only the segments ending before this stream position (default:
            :attr:`fence` when set, else all).
        """
        pending = self.pending
        n = len(pending)          # feed() may append meanwhile: those wait for the next drain
        if n == 0:
            return 0
        # (the fence is read after n: a segment fed after the fence was set, which ends
        # at or after it, is either beyond the first n or held back by the fence)
        limit = self.fence if before is None else before
        if limit is None:
            items = [pending.popleft() for _ in range(n)]
        else:
            items = []
            while len(items) < n and pending[0][1] < limit:
                items.append(pending.popleft())
            if not items:
                return 0
        # (unchecked: the engine cut every segment from its ring, of the reservoir's shape)
        self.reservoir._offer_many([seg for seg, _ in items], [end for _, end in items])
        return len(items)

    def learning_rates(self, n: int) -> np.ndarray:
        """Step sizes of the next ``n`` steps, shape (n,) (a shared array when constant:
        do not modify)."""
        if self.lr_decay_steps is None:
            key = (n, self.learning_rate, self.min_learning_rate)
            if self._lr_const is None or self._lr_const[0] != key:
                # (kept writable: a read-only array would be another compiled signature)
                self._lr_const = (key, np.full(n, max(self.learning_rate, self.min_learning_rate)))
            return self._lr_const[1]
        k = self.steps + np.arange(n, dtype=np.float64)
        lr = self.learning_rate / np.sqrt(1.0 + k / self.lr_decay_steps)
        return np.maximum(lr, self.min_learning_rate)

    def run_steps(self, n_steps: int, steps_per_call: int | None = None, stop=None) -> int:
        """Take ``n_steps`` SVI steps; returns how many were kept.

        Parameters
        ----------
        n_steps : int
        steps_per_call : int, optional
            Steps per compiled call (None: all in one call). Between two calls the
            thread yields the processor, so that a thread woken on the same core waits
            for at most one call, not for the whole run. The steps taken (minibatches,
            step sizes, results) do not depend on the split.
        stop : callable, optional
            Asked between two calls; when it returns True the remaining steps are not
            taken (the learner thread's halt: closing an engine waits for one call, not
            for a whole round of ``snapshot_interval`` steps). The steps taken are those
            an uninterrupted run takes first, and are counted as such.
        """
        if self.reservoir.size == 0 or n_steps <= 0:
            return 0
        slots = self.reservoir.sample_slots(n_steps, self.batch_size)
        if self._values.shape[0] < n_steps:
            self._values = np.empty(n_steps)
        values = self._values[:n_steps]
        # the first freeze_remaining of these steps hold the model part fixed, the rest
        # do not: a call never straddles that boundary
        n_frozen = min(self.freeze_remaining, n_steps)
        lr = self.learning_rates(n_steps)
        per_call = n_steps if steps_per_call is None else max(1, int(steps_per_call))
        n_ok = 0
        n_done = 0
        for k0 in range(0, n_steps, per_call):
            if k0:
                if stop is not None and stop():
                    break
                _yield_cpu()
            k1 = min(k0 + per_call, n_steps)
            if k0 < n_frozen < k1:
                n_ok += self._svi_run(slots, lr, values, k0, n_frozen, n_ok, True)
                k0 = n_frozen
            n_ok += self._svi_run(slots, lr, values, k0, k1, n_ok, k0 < n_frozen)
            n_done = k1
        n_ok = int(n_ok)
        values = values[:n_done]
        if n_ok:
            ok = values[np.isfinite(values)] if n_ok < n_done else values
            e = self.elbo
            if math.isnan(e) and ok.size:
                e, ok = float(ok[0]), ok[1:]
            if ok.size:  # the running mean e <- 0.98 e + 0.02 v over the kept steps
                w = 0.02 * 0.98 ** np.arange(ok.size - 1, -1, -1.0)
                e = 0.98 ** ok.size * e + float(w @ ok)
            self.elbo = e
        self.steps += n_ok
        self.discarded += n_done - n_ok
        self.freeze_remaining = max(0, self.freeze_remaining - n_done)
        return n_ok

    def _svi_run(self, slots, lr, values, k0, k1, n_ok, freeze) -> int:
        """Steps ``k0 .. k1-1`` of a run in one compiled call; how many were kept."""
        net = self.net
        return _ko.svi_run(self.reservoir.flat, slots[k0:k1], self.reservoir.segment_length,
                           self.subchain_length, net.window, net.offset, net.mean, net.scale,
                           self.x, self.nm, net.layout, self.packer.n_features, self.sq,
                           self.decay, self.eps, lr[k0:k1], self.steps + n_ok, freeze,
                           self._rows, self._row_start, self._row_end, self._offsets,
                           self._first, self._Xw, self._hidden, self._theta, self._rho,
                           self._g_theta, self._g_rho, self._Yb, self._grad, self._x_prev,
                           self._sq_prev, values[k0:k1], self.cov_mode)

    def params(self) -> FHMMParams:
        """The current model parameters."""
        return self.packer.unpack(self.x[:self.nm])

    @property
    def weights(self) -> np.ndarray:
        """View of the current network weights."""
        return self.x[self.nm:]

    def snapshot(self) -> Snapshot | None:
        """A new snapshot of the current state (version + 1), or None if the state does
        not make a valid parameter set — then the state and RMSprop's mean squares return
        to those of the last published one and the round counts as one discarded step
        (``steps`` keeps counting the steps taken)."""
        try:
            params = self.params()
            snap = make_snapshot(self.version + 1, params,
                                 self.weights if self.publish_weights else None, self.exact)
            if snap.exact is not None and not (np.isfinite(snap.exact.half_c).all()
                                               and math.isfinite(snap.exact.const)):
                raise ValueError("non-finite exact tables")
        except (ValueError, FloatingPointError, ZeroDivisionError) as exc:
            _log.warning("learner state rejected (%s): back to snapshot version %d", exc,
                         self.version)
            self.x[:] = self._last_good
            # not zeroed: with the step count kept, RMSprop's bias correction would
            # then make the next steps about 1/√(1-γ) times its first (3.2x at γ = 0.9)
            self.sq[:] = self._sq_good
            self.discarded += 1
            return None
        self.version += 1
        self._last_good[:] = self.x
        self._sq_good[:] = self.sq
        return snap

    # -- checkpoints -------------------------------------------------------------------
    def to_arrays(self, before=None) -> dict:
        """The learner's state as plain arrays (hold ``lock``; pending segments are
        drained into the reservoir first: all of them, or with ``before`` those ending
        before that stream position, the state at a checkpoint's cut)."""
        self.drain(math.inf if before is None else before)
        out = {"x": self.x.copy(), "sq": self.sq.copy(),
               "counters": np.array([self.steps, self.discarded, self.dropped,
                                     self.freeze_remaining, self.version], dtype=np.int64),
               "elbo": np.array(self.elbo)}
        out.update({f"reservoir.{k}": v for k, v in self.reservoir.to_arrays().items()})
        return out

    def load_arrays(self, arrays: dict, max_freeze: int | None = None) -> None:
        """Restore :meth:`to_arrays` output (the reservoir included).

        Parameters
        ----------
        arrays : dict of str to ndarray
            :meth:`to_arrays` output.
        max_freeze : int, optional
            The most steps that may remain frozen (the engine's ``net_burnin``, the
            freeze a learner starts with).

        Raises
        ------
        ValueError
            The state does not fit this learner (sizes, the reservoir's capacity,
            half-life or stride) or is damaged (non-finite values, negative counters or
            mean squares, an infinite ELBO, more frozen steps than ``max_freeze``, reservoir
            values beyond ``MAX_ABS_VALUE``); the learner is then left unchanged.
        """
        x = np.asarray(arrays["x"], dtype=np.float64)
        sq = np.asarray(arrays["sq"], dtype=np.float64)
        if x.shape != self.x.shape or sq.shape != self.x.shape:
            raise ValueError(f"learner state of size {x.shape} does not match the model "
                             f"({self.x.shape})")
        if not (np.isfinite(x).all() and np.isfinite(sq).all()):
            raise ValueError("learner state must be finite")
        if (sq < 0).any():
            # RMSprop's running mean of squared gradients: a negative one made most steps
            # non-finite (discarded) for as long as it stayed negative
            raise ValueError(f"learner state: the RMSprop mean squares (sq) must be >= 0, got "
                             f"a minimum of {float(sq.min()):g}")
        c = np.asarray(arrays["counters"])
        if c.shape != (5,) or c.dtype.kind not in "iu" or (c < 0).any():
            raise ValueError(f"learner counters must be 5 integers >= 0 (steps, discarded, "
                             f"dropped, freeze_remaining, version), got {c!r}")
        if max_freeze is not None and c[3] > max_freeze:
            raise ValueError(f"learner state: {int(c[3])} steps left with the model frozen, "
                             f"more than the {max_freeze} a learner starts with (net_burnin)")
        elbo = float(arrays["elbo"])
        if math.isinf(elbo):
            # (a running mean of the steps' finite ELBOs, NaN before the first: inf stayed
            # in every later mean)
            raise ValueError(f"learner state: elbo must be finite (or NaN before the first "
                             f"step), got {elbo}")
        sub = {k[10:]: v for k, v in arrays.items() if k.startswith("reservoir.")}
        meta = json.loads(str(sub["meta"]))
        if (meta.get("segment_length"), meta.get("n_features")) != (
                self.reservoir.segment_length, self.reservoir.n_features):
            raise ValueError("the checkpoint's reservoir does not match the engine's segments")
        # the learner's reservoir is the configuration's: the same capacity, half-life
        # and stride (a state that says otherwise is refused, not taken)
        res = Reservoir.from_arrays(sub, like=self.reservoir)
        self.x[:] = x
        self.sq[:] = sq
        self._last_good[:] = x
        self._sq_good[:] = sq
        self.steps, self.discarded, self.dropped, self.freeze_remaining, self.version = (
            int(v) for v in c)
        self.elbo = elbo
        self.reservoir = res


class LearnerThread(threading.Thread):
    """Runs a :class:`Learner` in the background, using at most ``duty`` of one core.

    Parameters
    ----------
    learner : Learner
    publish : callable
        ``publish(snapshot)``, called after every ``snapshot_interval`` steps that kept
        at least one step (from this thread).
    snapshot_interval : int
        Steps per round and per snapshot.
    steps_per_call : int
        Steps per compiled call within a round; the thread yields the processor
        between calls (see Notes).
    min_fill : int
        Segments the reservoir must hold before learning starts.
    idle_sleep : float
        Seconds to wait when there is nothing to do; the wait doubles with each idle
        round up to 0.1 s (an idle thread polled 500 times a second: 4 % of a core each)
        and is back to ``idle_sleep`` once there is work.
    duty : float
        Fraction of one core the thread may use, in (0, 1]: after a round (drain,
        ``snapshot_interval`` steps, snapshot) that took τ seconds of
        this thread's CPU time it waits ``τ (1 - duty) / duty`` seconds. 1: back to back.
        Assign :attr:`duty` to change it at run time (it takes effect at once).

    Attributes
    ----------
    cpu_seconds : float
        CPU time this thread spent in rounds that took steps.
    rounds : int
        Such rounds.
    error : BaseException or None
        The exception that stopped the thread.

    Notes
    -----
    Measuring τ in CPU time (``time.thread_time``) bounds the learner's CPU share by
    ``duty`` whatever the load: when the thread is kept from the processor during a
    round, the round's wall time grows, its CPU time does not, and the wait stays what
    the work asks for.

    A round's steps are taken ``steps_per_call`` per compiled call, with a yield of the
    processor between calls. On a machine with few cores the threads of the serving
    path (the inference loop, the ZeroMQ I/O threads, a local publisher or consumer)
    are often woken on the core the learner is computing on; the scheduler lets a
    running thread finish its slice (milliseconds) before it runs a woken one, so one
    long compiled call of a whole round delayed them by up to the round's length.
    Yielding after each short call bounds that delay by one call.
    """

    def __init__(self, learner: Learner, publish, snapshot_interval: int = 20, min_fill: int = 10,
                 idle_sleep: float = 0.002, duty: float = 1.0, steps_per_call: int = 1):
        super().__init__(name="streamfhmm-learner", daemon=True)
        self.learner = learner
        self.publish = publish
        self.snapshot_interval = int(snapshot_interval)
        self.steps_per_call = int(steps_per_call)
        if self.steps_per_call < 1:
            raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call!r}")
        self.min_fill = int(min_fill)
        self.idle_sleep = float(idle_sleep)
        self._duty = check_duty(duty, "duty")
        self.cpu_seconds = 0.0
        self.rounds = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._wake = threading.Event()   # ends a wait early: stop, a job, a new duty
        self._job = None
        # request() and the hand-over are atomic: a request landing between the read and
        # the reset of _job was lost (its checkpoint never written, its fence never lifted)
        self._job_lock = threading.Lock()

    @property
    def duty(self) -> float:
        """Fraction of one core the thread may use, in (0, 1]; assignable."""
        return self._duty

    @duty.setter
    def duty(self, value) -> None:
        self._duty = check_duty(value, "duty")
        self._wake.set()

    def request(self, job) -> None:
        """Run ``job()`` on this thread, holding the learner's lock, before the next
        steps (a newer request replaces one not yet run); a wait is cut short for it."""
        with self._job_lock:
            self._job = job
        self._wake.set()

    def take_job(self):
        """The requested job not yet run, or None; it will not run here (hold the
        learner's lock)."""
        with self._job_lock:
            job, self._job = self._job, None
        return job

    def run(self):
        learner = self.learner
        halt, wake = self._halt, self._wake
        clock, now_s = time.thread_time, time.monotonic
        publish = self.publish
        last_end, last_busy = 0.0, 0.0   # end and CPU time of the last round of steps
        idle = self.idle_sleep
        try:
            while not halt.is_set():
                duty = self._duty
                resume_at = last_end + last_busy * (1.0 - duty) / duty
                may_step = now_s() >= resume_at
                c0 = clock()
                stepped = worked = False
                after = None
                with learner.lock:
                    if learner.pending and learner.drain():
                        # (a stream feeding segments: the wait stays short, or the
                        # pending ones overran max_pending while learning was off)
                        idle = self.idle_sleep
                    job = self.take_job()
                    if job is not None:
                        try:
                            after = job()
                        except Exception:  # a failed job must not stop the learning
                            _log.exception("a job on the streamfhmm learner thread failed")
                        worked = True
                    if (may_step and learner.enabled
                            and learner.reservoir.size >= self.min_fill):
                        if learner.run_steps(self.snapshot_interval, self.steps_per_call, halt.is_set):
                            snap = learner.snapshot()
                            if snap is not None:
                                publish(snap)
                        stepped = worked = True
                if after is not None:
                    try:
                        after()
                    except Exception:
                        _log.exception("a job on the streamfhmm learner thread failed")
                now = now_s()
                if stepped:
                    last_busy = clock() - c0
                    last_end = now
                    self.cpu_seconds += last_busy
                    self.rounds += 1
                    wait = last_busy * (1.0 - duty) / duty
                elif not may_step:
                    wait = resume_at - now
                elif worked:
                    wait = 0.0
                else:
                    wait, idle = idle, min(2.0 * idle, max(_MAX_IDLE_SLEEP, self.idle_sleep))
                if worked:
                    idle = self.idle_sleep
                if wait > 0.0 and wake.wait(min(wait, _MAX_WAIT)):
                    wake.clear()
                    idle = self.idle_sleep
        except BaseException as exc:  # recorded and exposed; inference goes on
            self.error = exc
            _log.exception("the streamfhmm learner stopped")

    def wake(self) -> None:
        """End the thread's wait now (e.g. its learner was just enabled)."""
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread and wait for it (``timeout``), unless called on the thread
        itself: the engine's finalizer runs wherever the garbage collector frees it, this
        thread included, where joining raised RuntimeError."""
        self._halt.set()
        self._wake.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
