"""BLAS thread control for the learner and the streaming engine.

The kernels' matrix products are small; on a busy 2-core machine multithreaded BLAS
spends far longer waking its threads than computing. Numba's ``np.dot`` calls scipy's
BLAS, which threadpoolctl can only limit once it is loaded, so it is loaded first.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque

import scipy.linalg.cython_blas  # noqa: F401  (load scipy's BLAS before limiting it)
from threadpoolctl import threadpool_limits

__all__ = ["limit_blas_threads", "BlasHold"]

_lock = threading.Lock()
_holds: list = []        # the open holds
_original = None         # the limiter that restores the limits found by the first hold
#: holds whose owner was garbage collected while the lock was taken (by the collector
#: running inside a hold's own threadpoolctl call): released at the next hold or release
_orphans: deque = deque()


def _apply() -> None:
    """(``_lock`` held) Release the orphaned holds, then set the limit the open holds
    ask for, or restore the original limits when none is left."""
    global _original
    while _orphans:
        hold = _orphans.popleft()
        if hold in _holds:
            _holds.remove(hold)
    if _holds:
        threadpool_limits(limits=min(h.n for h in _holds), user_api="blas")
    elif _original is not None:
        _original.restore_original_limits()
        _original = None


def _collected(hold) -> None:
    """A hold's owner was garbage collected without releasing it: release it now if the
    lock is free, else leave it to the next hold or release (waiting here could wait on
    this very thread: the collector may run inside a hold's threadpoolctl call)."""
    _orphans.append(hold)
    if _lock.acquire(blocking=False):
        try:
            _apply()
        finally:
            _lock.release()


class BlasHold:
    """A process-wide BLAS thread limit held by an object (a streaming engine) until
    :meth:`release` or until ``owner`` is garbage collected.

    The limit is the smallest of the open holds'; the limits found when the first hold
    opened come back when the last one is released. (Each engine used to restore the
    limits it had found itself: with two open, closing the first lifted the second's
    limit, and closing the second then left the process limited.)
    """

    def __init__(self, n: int, owner=None):
        global _original
        self.n = int(n)
        with _lock:
            if not _holds and not _orphans:   # (this call sets the limit, too)
                _original = threadpool_limits(limits=self.n, user_api="blas")
                _holds.append(self)
            else:
                _holds.append(self)
                _apply()
        self._finalizer = None if owner is None else weakref.finalize(owner, _collected, self)

    def release(self) -> None:
        """Give the hold up (idempotent)."""
        if self._finalizer is not None:
            self._finalizer.detach()
        with _lock:
            if self in _holds:
                _holds.remove(self)
                _apply()


def limit_blas_threads(n: int = 1):
    """Limit every loaded BLAS to ``n`` threads; returns the limiter
    (``.restore_original_limits()`` undoes it; also usable as a context manager)."""
    return threadpool_limits(limits=n, user_api="blas")
