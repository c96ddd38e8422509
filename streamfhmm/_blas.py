"""BLAS thread control for the learner and the streaming engine.

The kernels' matrix products are small; on a busy 2-core machine multithreaded BLAS
spends far longer waking its threads than computing. Numba's ``np.dot`` calls scipy's
BLAS, which threadpoolctl can only limit once it is loaded, so it is loaded first.
"""
from __future__ import annotations

import threading
import weakref

import scipy.linalg.cython_blas  # noqa: F401  (load scipy's BLAS before limiting it)
from threadpoolctl import threadpool_limits

__all__ = ["limit_blas_threads", "BlasHold"]

_lock = threading.Lock()
_holds: list = []        # the thread counts of the holds now open
_original = None         # the limiter that restores the limits found by the first hold


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
        self._open = True
        with _lock:
            if not _holds:
                _original = threadpool_limits(limits=self.n, user_api="blas")
            _holds.append(self.n)
            threadpool_limits(limits=min(_holds), user_api="blas")
        self._finalizer = None if owner is None else weakref.finalize(owner, self.release)

    def release(self) -> None:
        """Give the hold up (idempotent)."""
        global _original
        with _lock:
            if not self._open:
                return
            self._open = False
            _holds.remove(self.n)
            if _holds:
                threadpool_limits(limits=min(_holds), user_api="blas")
            elif _original is not None:
                _original.restore_original_limits()
                _original = None
        if self._finalizer is not None:
            self._finalizer.detach()


def limit_blas_threads(n: int = 1):
    """Limit every loaded BLAS to ``n`` threads; returns the limiter
    (``.restore_original_limits()`` undoes it; also usable as a context manager)."""
    return threadpool_limits(limits=n, user_api="blas")
