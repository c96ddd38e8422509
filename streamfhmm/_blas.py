"""BLAS thread control for the learner and the streaming engine.

The kernels' matrix products are small; on a busy 2-core machine multithreaded BLAS
spends far longer waking its threads than computing. Numba's ``np.dot`` calls scipy's
BLAS, which threadpoolctl can only limit once it is loaded, so it is loaded first.
"""
from __future__ import annotations

import scipy.linalg.cython_blas  # noqa: F401  (load scipy's BLAS before limiting it)
from threadpoolctl import threadpool_limits

__all__ = ["limit_blas_threads"]


def limit_blas_threads(n: int = 1):
    """Limit every loaded BLAS to ``n`` threads; returns the limiter
    (``.restore_original_limits()`` undoes it; also usable as a context manager)."""
    return threadpool_limits(limits=n, user_api="blas")
