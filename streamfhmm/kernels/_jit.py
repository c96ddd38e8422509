"""The one Numba configuration shared by every kernel.

All kernels are compiled with ``cache=True`` (a daemon does not compile on its first
sample), ``nogil=True`` (the learner thread and the inference path run in parallel)
and without ``fastmath``: the bivariate normal CDF and the log-domain recursions rely
on IEEE semantics (infinities, exact cancellation order).
"""
import numba

JIT_OPTIONS = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")


def jit(*args, **kwargs):
    """``numba.njit`` with the package-wide options; ``kwargs`` override them."""
    options = dict(JIT_OPTIONS)
    options.update(kwargs)
    if args and callable(args[0]) and len(args) == 1:
        return numba.njit(**options)(args[0])
    return numba.njit(*args, **options)
