"""Input validation for the public API: every check raises a ``ValueError`` that names
the argument and says what was expected."""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "check_observations",
    "check_lengths",
    "check_bounds",
    "check_bool",
    "check_generator",
    "check_W",
    "check_covariance",
    "check_transmat",
    "check_startprob",
    "check_random_state",
    "check_positive_int",
    "check_real",
]


def _describe(x) -> str:
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape} and dtype {x.dtype}"
    return f"{type(x).__name__}"


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    """Return ``value`` as ``int`` if it is an integer ≥ ``minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_real(value, name: str, low: float = 0.0, high: float = math.inf, *,
               low_open: bool = False, high_open: bool = False) -> float:
    """Return ``value`` as ``float`` if it is a finite real number in the interval
    from ``low`` to ``high`` (closed unless ``low_open``/``high_open``)."""
    hi = "inf)" if math.isinf(high) else f"{high:g}{')' if high_open else ']'}"
    want = f"a finite number in {'(' if low_open else '['}{low:g}, {hi}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be {want}, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < low or v > high or (low_open and v == low) or (high_open and v == high):
        raise ValueError(f"{name} must be {want}, got {v!r}")
    return v


def check_bool(value, name: str) -> bool:
    """``value`` as a bool if it is True or False (numpy's included), else ValueError (a
    string such as ``"false"``, or 0.5, would pass a truth test)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_generator(rng, name: str = "rng") -> np.random.Generator:
    """``rng`` if it is a numpy Generator, else ValueError."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"{name} must be a numpy Generator, got {type(rng).__name__}")
    return rng


def unmask(x):
    """``x`` itself, or for a numpy masked array of numbers its data with every masked
    entry NaN (a missing value; ``np.asarray`` would keep the values under the mask and
    use them as observed)."""
    if not isinstance(x, np.ma.MaskedArray):
        return x
    data = np.asarray(x.data)
    mask = np.ma.getmaskarray(x)
    if data.dtype.kind in "biuf" and mask.any():
        data = data.astype(np.float64)
        data[mask] = np.nan
    return data


def _as_float_array(x, name: str, keep_scalar: bool = False) -> np.ndarray:
    """``x`` as a C-contiguous float64 array (ValueError if not numeric and real). A
    scalar becomes shape (1,) (a length-1 parameter may be given as a number), or stays
    0-d with ``keep_scalar`` (where it can only be a mistake, reported as one)."""
    if isinstance(x, (str, bytes)):
        raise ValueError(f"{name} must be numeric, got {_describe(x)}")
    try:
        arr = np.asarray(unmask(x))
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} must be a numeric array, got {_describe(x)}: {exc}") from None
    # (timedelta64 is a numpy integer type, but not a number of the data's units)
    if arr.dtype == object or arr.dtype.kind in "mM" or not (np.issubdtype(arr.dtype, np.number)
                                                             or arr.dtype == bool):
        raise ValueError(f"{name} must be a numeric array, got {_describe(arr)}")
    if np.iscomplexobj(arr):
        raise ValueError(f"{name} must be real-valued, got dtype {arr.dtype}")
    if keep_scalar:
        return np.asarray(arr, dtype=np.float64, order="C")
    return np.ascontiguousarray(arr, dtype=np.float64)


#: the largest magnitude of an observation a fit takes (a batch fit, a stream's warm-up
#: start and its learner's subchains): it squares them (1e150² = 1e300; 1e160 made every
#: start fail with "W must be finite")
MAX_ABS_VALUE = 1e150
#: the least magnitude of a feature's largest value a fit takes: below, its squares (1e-300)
#: and its variance underflow (1e-155 made SVI's first gradient non-finite; 1e-170 gave
#: every method a "fit" with loadings of 1e169 and a log-likelihood of -764 per step)
MIN_ABS_SCALE = 1e-150


def check_fit_magnitude(X: np.ndarray, name: str = "X", row0: int = 0,
                        tiny: bool = False) -> np.ndarray:
    """``X`` (checked by :func:`check_observations`) if every value is within
    ±:data:`MAX_ABS_VALUE` and (``tiny``: ``X`` is a whole series, as a batch fit takes
    it) no column whose values differ has its largest magnitude below
    :data:`MIN_ABS_SCALE`, else a ValueError that names the first one beyond (its row
    counted from ``row0``: ``X`` a block of a larger array): a fit's sufficient
    statistics square the observations, and overflowed to an error about non-finite
    parameters. (Inference with fitted parameters takes such values.)"""
    with np.errstate(invalid="ignore"):
        a = np.abs(X)
        big = a > MAX_ABS_VALUE
    if big.any():
        r, c = np.argwhere(big)[0]
        raise ValueError(f"{name} must hold values within ±{MAX_ABS_VALUE:g} to fit a model (its "
                         f"statistics square them); found {X[r, c]:g} at row {row0 + r}, column {c}: "
                         "rescale the data")
    if tiny and X.size:
        # (only where a whole series is seen: a block, a warm-up or a checkpoint's part of
        # one may be tiny where the series is not; and only a column that varies at that
        # scale: one of zeros and a lone 1e-200 is constant to the fit, as zeros are)
        peak = np.where(np.isnan(a), 0.0, a).max(axis=0)
        low = (peak > 0.0) & (peak < MIN_ABS_SCALE)
        if low.any():
            low &= [len(np.unique(col[~np.isnan(col)])) > 1 and np.count_nonzero(col[~np.isnan(col)]) > 1
                    for col in X.T]
        if low.any():
            c = int(np.flatnonzero(low)[0])
            raise ValueError(f"{name}'s column {c} holds no value larger than {peak[c]:g} in magnitude: "
                             f"a fit needs a feature's largest value at least {MIN_ABS_SCALE:g} (its "
                             "statistics square them, and they underflow); rescale the data")
    return X


def check_observations(X, name: str = "X", n_features: int | None = None,
                       allow_nan: bool = False, min_samples: int = 1,
                       allow_empty_rows: bool = False) -> np.ndarray:
    """Validate an observation matrix.

    Parameters
    ----------
    X : array_like, shape (T, D)
        A numpy masked array's masked entries are NaN (missing).
    n_features : int, optional
        The expected D.
    allow_nan : bool
        NaN marks a missing value when True; infinities are always refused.
    min_samples : int
        The least T accepted.
    allow_empty_rows : bool
        With ``allow_nan``: accept rows with every value missing (samples on the wire,
        which an engine imputes); a fit or an exact smoother needs a value per row.

    Returns
    -------
    X : ndarray of float64, shape (T, D), C-contiguous
    """
    X = _as_float_array(X, name, keep_scalar=True)
    if X.ndim == 1 and n_features == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array of shape (n_samples, n_features), "
                         f"got an array of shape {X.shape}")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"{name} must have {n_features} features (columns), got {X.shape[1]}")
    if X.shape[0] < min_samples:
        raise ValueError(f"{name} must have at least {min_samples} samples (rows), got {X.shape[0]}")
    if X.shape[1] < 1:
        raise ValueError(f"{name} must have at least one feature (column), got 0")
    if np.isinf(X).any():
        r, c = np.argwhere(np.isinf(X))[0]
        raise ValueError(f"{name} must not contain infinities; found {X[r, c]} at row {r}, column {c}")
    if not allow_nan and np.isnan(X).any():
        r, c = np.argwhere(np.isnan(X))[0]
        raise ValueError(f"{name} must not contain NaN here (missing values are not supported by this "
                         f"method); found NaN at row {r}, column {c}")
    if allow_nan and not allow_empty_rows and np.isnan(X).all(axis=1).any():
        r = int(np.flatnonzero(np.isnan(X).all(axis=1))[0])
        raise ValueError(f"{name} has a row with every value missing (row {r}); drop it or "
                         f"interpolate it: at least one observed value per sample is expected")
    return X


def check_lengths(lengths, n_samples: int, min_length: int = 1) -> np.ndarray:
    """Validate hmmlearn-style ``lengths`` and return them as an int64 array.

    ``None`` means one sequence of ``n_samples``.
    """
    if lengths is None:
        lengths = np.array([n_samples], dtype=np.int64)
    else:
        arr = np.asarray(lengths)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"lengths must be a non-empty 1-D sequence of positive integers, "
                             f"got {_describe(arr)}")
        if not np.issubdtype(arr.dtype, np.integer):
            if not (np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr))
                    and np.all(arr == np.round(arr))):
                raise ValueError(f"lengths must hold integers, got dtype {arr.dtype}")
        if (arr < 1).any():
            raise ValueError(f"lengths must all be positive, got {arr.min()}")
        # Range first: a sum in int64 could wrap round to n_samples and let the kernels
        # index past the end of X.
        if (arr > n_samples).any() or arr.size > n_samples:
            raise ValueError(f"lengths must sum to the number of samples in X ({n_samples}), "
                             f"got {arr.size} lengths up to {arr.max()}")
        lengths = arr.astype(np.int64)
        if lengths.sum() != n_samples:
            raise ValueError(f"lengths must sum to the number of samples in X ({n_samples}), "
                             f"got sum(lengths) = {int(lengths.sum())}")
    if (lengths < min_length).any():
        raise ValueError(f"every sequence must have at least {min_length} samples, got a sequence "
                         f"of length {int(lengths.min())}")
    return np.ascontiguousarray(lengths, dtype=np.int64)


def check_bounds(bounds, n_samples: int | None = None, name: str = "bounds") -> np.ndarray:
    """Validate sequence bounds ``[b_0, b_1, …]`` (sequence i is rows ``b_i:b_{i+1}``) and
    return them as a C-contiguous int64 array.

    Expected: a 1-D array of integers, at least two, non-decreasing, inside
    ``[0, n_samples]`` (``[0, 2^63)`` when ``n_samples`` is None) and spanning at least
    one row (``b_0 < b_-1``).
    """
    top = np.iinfo(np.int64).max if n_samples is None else int(n_samples)
    arr = np.asarray(bounds)
    if arr.ndim != 1 or arr.size < 2 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D integer array [b_0, b_1, ...] of at least two "
                         f"sequence bounds, got {_describe(arr)}")
    # range first: the differences of unsigned integers would wrap round
    if (arr < 0).any() or (arr > top).any():
        want = "be non-negative row indices" if n_samples is None else \
            f"lie in [0, {top}] (the rows of the data)"
        raise ValueError(f"{name} must {want}, got values from {arr.min()} to {arr.max()}")
    arr = arr.astype(np.int64)
    if (np.diff(arr) < 0).any():
        i = int(np.flatnonzero(np.diff(arr) < 0)[0])
        raise ValueError(f"{name} must be non-decreasing, got {name}[{i}] = {arr[i]} > "
                         f"{name}[{i + 1}] = {arr[i + 1]}")
    if arr[-1] == arr[0]:
        raise ValueError(f"{name} must span at least one row, got {arr[0]} to {arr[-1]}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_W(W, name: str = "W") -> np.ndarray:
    """W: (M+1, D), finite, M ≥ 1."""
    W = _as_float_array(W, name)
    if W.ndim != 2 or W.shape[0] < 2 or W.shape[1] < 1:
        raise ValueError(f"{name} must be a 2-D array of shape (n_chains + 1, n_features) with "
                         f"n_chains >= 1 (the last row is the bias), got shape {W.shape}")
    if not np.isfinite(W).all():
        raise ValueError(f"{name} must be finite")
    return W


def check_covariance(covariance, n_features: int, name: str = "covariance") -> np.ndarray:
    """A symmetric positive-definite (D, D) matrix; returns its Cholesky factor L."""
    S = _as_float_array(covariance, name, keep_scalar=True)
    if S.shape != (n_features, n_features):
        raise ValueError(f"{name} must have shape ({n_features}, {n_features}), got {S.shape}")
    if not np.isfinite(S).all():
        raise ValueError(f"{name} must be finite")
    # (atol relative to Σ's scale: an absolute one would let a small Σ be far from symmetric)
    if not np.allclose(S, S.T, rtol=1e-10, atol=1e-12 * np.abs(S).max()):
        raise ValueError(f"{name} must be symmetric")
    try:
        L = np.linalg.cholesky(0.5 * (S + S.T))
    except np.linalg.LinAlgError:
        raise ValueError(f"{name} must be positive definite") from None
    if not (np.diag(L) > 0).all():
        raise ValueError(f"{name} must be positive definite")
    return L


def check_transmat(transmat, n_chains: int, name: str = "transmat") -> np.ndarray:
    """(M, 2, 2) row-stochastic matrices, one per chain."""
    A = _as_float_array(transmat, name)
    given = np.asarray(unmask(transmat)).dtype
    # rows of a float32 (float16) matrix sum to 1 only to that type's precision
    atol = max(1e-8, 4.0 * float(np.finfo(given).eps)) if given.kind == "f" else 1e-8
    if A.shape != (n_chains, 2, 2):
        raise ValueError(f"{name} must have shape ({n_chains}, 2, 2), one 2x2 matrix per chain, "
                         f"got {A.shape}")
    if not np.isfinite(A).all() or (A < 0).any() or (A > 1).any():
        raise ValueError(f"{name} entries must be probabilities in [0, 1]")
    if not np.allclose(A.sum(axis=2), 1.0, rtol=0, atol=atol):
        raise ValueError(f"{name} rows must sum to 1 (each transmat[m, i, :] is a distribution)")
    return A


def check_startprob(startprob, n_chains: int, name: str = "startprob") -> np.ndarray:
    """(M,) probabilities P(s_1^m = 1)."""
    p = _as_float_array(startprob, name)
    if p.shape != (n_chains,):
        raise ValueError(f"{name} must have shape ({n_chains},), P(s_1^m = 1) per chain, got {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError(f"{name} entries must be probabilities in [0, 1]")
    return p


def check_random_state(random_state) -> np.random.Generator:
    """None, an int seed, a ``np.random.Generator`` or a ``RandomState``."""
    if random_state is None or isinstance(random_state, (numbers.Integral, np.random.SeedSequence)):
        if isinstance(random_state, (bool, np.bool_)):
            raise ValueError("random_state must be None, an int or a numpy Generator, got a bool")
        if isinstance(random_state, numbers.Integral) and random_state < 0:
            raise ValueError(f"random_state must be None, an int >= 0 (a seed) or a numpy "
                             f"Generator, got {random_state}")
        return np.random.default_rng(random_state)
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**63 - 1, dtype=np.int64))
    raise ValueError(f"random_state must be None, an int or a numpy Generator (or a SeedSequence "
                     f"or RandomState), got {_describe(random_state)}")
