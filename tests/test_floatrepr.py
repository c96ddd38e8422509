"""put_repr (streamfhmm.io.floatrepr) against Python's repr of a float."""
import sys

import numpy as np
import pytest

from streamfhmm.io.floatrepr import REPR_MAX_BYTES, repr_array


def _reprs(x):
    x = np.ascontiguousarray(x, dtype=np.float64)
    buf = np.zeros(REPR_MAX_BYTES * len(x), np.uint8)
    ends = np.zeros(len(x), np.int64)
    repr_array(x, buf, ends)
    starts = np.concatenate(([0], ends[:-1]))
    return [buf[a:b].tobytes().decode() for a, b in zip(starts.tolist(), ends.tolist())]


def _check(x):
    got = _reprs(x)
    for v, g in zip(np.asarray(x, dtype=np.float64).tolist(), got):
        assert g == repr(v), f"{v!r}: got {g}"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bit_patterns(seed):
    """Every finite double is equally likely to be drawn by its bits: all exponents,
    subnormals included, both signs."""
    print("seed", seed)
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 63, size=200_000, dtype=np.int64)
    bits |= rng.integers(0, 2, size=bits.size).astype(np.int64) << 63
    x = bits.view(np.float64)
    _check(x[np.isfinite(x)])


@pytest.mark.parametrize("seed", [3, 4])
def test_values_the_wire_carries(seed):
    """Marginals in (0, 1), correlations in (-1, 1), reconstructions and time stamps."""
    print("seed", seed)
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.random(50_000), rng.uniform(-1, 1, 50_000), rng.normal(0, 10, 50_000),
                        1.7e9 + rng.random(50_000) * 1e8, np.round(rng.normal(0, 1e6, 20_000), 3),
                        1e-6 + (1 - 2e-6) * rng.random(10_000)])
    _check(x)


def test_boundaries_of_the_notations_and_special_values():
    x = [0.0, -0.0, 1.0, -1.0, 0.1, 0.2, 0.3, 1 / 3, 2 / 3, 0.1 + 0.2, 1e-4, 9.999999999999999e-05,
         1e-5, 0.00012345, 1e15, 9999999999999998.0, 1e16, 1.2345e16, 1e17, 123456789012345678.0,
         5e-324, 1e-323, 2.2250738585072009e-308, 2.2250738585072014e-308, sys.float_info.max,
         sys.float_info.min, sys.float_info.epsilon, 2.0 ** 52, 2.0 ** 53, 2.0 ** 53 + 2, 2.0 ** 63,
         2.0 ** 64, 2.0 ** -1074, 1e22, 1e23, 5e22, 9007199254740993.0, 0.5, 0.25, 0.125, 1e100,
         1e-100, 1.5e300, 1e308, 123.456, 100.0, 1000.0, 12345678901234567.0]
    x += [10.0 ** k for k in range(-20, 25)] + [2.0 ** k for k in range(-1074, 1024, 7)]
    x += [float(np.nextafter(v, np.inf)) for v in x if 0 < v < sys.float_info.max]
    x += [float(np.nextafter(v, 0.0)) for v in x if v > 0]
    _check(x)


def test_longest_repr_fits():
    x = [-2.2250738585072014e-308, -1.2345678901234567e-100, -1.2345678901234567e+100]
    assert max(len(repr(v)) for v in x) <= REPR_MAX_BYTES
    _check(x)
