"""Vectorisable elementary functions (kernels/_math.py) against numpy, math and scipy:
absolute and relative error on a dense grid and at random points, the special values,
and that the loops really compile to packed (SIMD) code."""
import math
import platform
import re

import numba

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.special import expit

from streamfhmm.kernels import _math
from streamfhmm.kernels._jit import jit
from streamfhmm.kernels.bvn import EPS_RHO, EPS_THETA, clip_rho, clip_theta

SPECIAL = np.array([0.0, -0.0, 5e-324, -5e-324, 1e-300, -1e-300, 1e-17, 1e-8, -1e-8,
                    0.55, np.nextafter(0.55, 1.0), 0.625, 1.0, 19.06, 19.1, 19.2, -19.2,
                    354.0, 708.0, 709.0, 1e300, -1e300, np.inf, -np.inf])


@jit
def _tanh_each(x, out):
    for i in range(x.shape[0]):
        out[i] = _math.tanh(x[i])


@jit
def _sigmoid_each(x, out):
    for i in range(x.shape[0]):
        out[i] = _math.sigmoid(x[i])


@jit
def _heads_each(x, theta, rho):
    for i in range(x.shape[0]):
        theta[i] = clip_theta(x[i])
        rho[i] = clip_rho(x[i])


@jit
def _exp_each(x, out):
    for i in range(x.shape[0]):
        out[i] = _math.exp(x[i])


@jit
def _sin_small_each(x, out):
    for i in range(x.shape[0]):
        out[i] = _math.sin_small(x[i])


@jit
def _tanh_scalar(x):
    return _math.tanh(x)


def _points(seed):
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    n = 200_000
    return np.concatenate([
        np.linspace(-25.0, 25.0, 400_001),
        rng.normal(size=n) * 4.0,
        rng.choice([-1.0, 1.0], n) * np.exp(rng.uniform(-745.0, 6.5, n)),  # all scales
        SPECIAL,
    ])


def _check_tanh(x, got):
    ref = np.tanh(x)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    err = np.abs(got[finite] - ref[finite])
    assert err.max() <= 1e-15, f"max abs error {err.max():.3e} at x={x[finite][np.argmax(err)]!r}"
    big = np.abs(ref[finite]) > 1e-300
    rel = err[big] / np.abs(ref[finite][big])
    assert rel.max() <= 1e-15, f"max rel error {rel.max():.3e}"
    # odd, with the sign of zero kept
    np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(x[finite]))


def test_tanh_dense_grid_and_special_values():
    x = _points(seed=11)
    got = np.empty_like(x)
    _tanh_each(x, got)
    _check_tanh(x, got)
    inplace = x.copy()
    _math.tanh_inplace(inplace)
    # (the last bit may differ: a multiply-add is fused or not depending on the code around)
    np.testing.assert_allclose(inplace, got, rtol=1e-15, atol=0)
    assert got[x == np.inf].tolist() == [1.0] and got[x == -np.inf].tolist() == [-1.0]
    assert math.copysign(1.0, _tanh_scalar(-0.0)) == -1.0
    assert _tanh_scalar(5e-324) == 5e-324
    assert math.isnan(_tanh_scalar(math.nan))


def test_tanh_nan_propagates_in_vector_loop():
    x = np.array([0.3, np.nan, -2.0, np.nan, 25.0, -np.nan, 1e-5, np.inf])
    got = x.copy()
    _math.tanh_inplace(got)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    np.testing.assert_allclose(got[~np.isnan(x)], np.tanh(x[~np.isnan(x)]), rtol=0, atol=1e-15)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_tanh_matches_math_tanh(x):
    got = _tanh_scalar(x)
    if math.isnan(x):
        assert math.isnan(got)
        return
    ref = math.tanh(x)
    assert abs(got - ref) <= 1e-15
    assert abs(got - ref) <= 1e-15 * abs(ref) or ref == 0.0 and got == 0.0
    assert math.copysign(1.0, got) == math.copysign(1.0, x)


@pytest.mark.parametrize("n, H", [(0, 5), (1, 1), (7, 200), (33, 13)])
def test_tanh_bias_inplace(n, H):
    seed = 100 * n + H
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, H)) * 6.0
    bias = rng.normal(size=H) * 2.0
    ref = np.tanh(a + bias)
    _math.tanh_bias_inplace(a, bias)
    np.testing.assert_allclose(a, ref, rtol=0, atol=1e-15)


def test_sigmoid_relative_accuracy():
    x = _points(seed=12)
    got = np.empty_like(x)
    _sigmoid_each(x, got)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    inside = np.abs(x) <= 708.0
    ref = expit(x[inside])
    rel = np.abs(got[inside] - ref) / ref
    assert rel.max() <= 1e-15, f"max rel error {rel.max():.3e} at x={x[inside][np.argmax(rel)]!r}"
    outside = ~inside & ~np.isnan(x)
    np.testing.assert_allclose(got[outside], expit(x[outside]), rtol=0, atol=3.4e-308)
    assert got[x == np.inf].tolist() == [1.0] and got[x == -np.inf].tolist() == [0.0]


def test_exp_relative_accuracy_and_range():
    """exp against numpy on a dense grid and at random points of its range (relative
    error ≤ 2.5e-16), against mpmath at some of them, 0 below -708, +inf above 709."""
    seed = 14
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.linspace(-720.0, 712.0, 1_000_001), rng.uniform(-708.0, 709.0, 200_000),
                        rng.normal(size=100_000), SPECIAL, -SPECIAL, [-708.0, 709.0, np.nan]])
    got = np.empty_like(x)
    _exp_each(x, got)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    inside = (x >= -708.0) & (x <= 709.0)
    ref = np.exp(x[inside])
    rel = np.abs(got[inside] - ref) / ref
    assert rel.max() <= 2.5e-16, f"max rel error {rel.max():.3e} at x={x[inside][np.argmax(rel)]!r}"
    assert np.all(got[x < -708.0] == 0.0) and np.all(got[x > 709.0] == np.inf)
    mpmath = pytest.importorskip("mpmath")
    for i in rng.choice(np.flatnonzero(inside), 300):
        exact = mpmath.exp(mpmath.mpf(float(x[i])))
        assert abs(mpmath.mpf(float(got[i])) - exact) <= 2.5e-16 * exact, x[i]


def test_sin_small_relative_accuracy():
    """sin_small against mpmath (30 digits) on |x| ≤ 1.2: relative error ≤ 2.5e-16, odd,
    with the sign of zero kept."""
    mpmath = pytest.importorskip("mpmath")
    seed = 15
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.linspace(-1.2, 1.2, 4001), rng.uniform(-1.2, 1.2, 4000),
                        np.exp(rng.uniform(-700.0, 0.18, 2000)), [1e-300, 5e-324]])
    got = np.empty_like(x)
    _sin_small_each(x, got)
    with mpmath.workdps(30):
        for v, g in zip(x, got):
            if v == 0.0:
                continue
            exact = mpmath.sin(mpmath.mpf(float(v)))
            assert abs(mpmath.mpf(float(g)) - exact) <= 2.5e-16 * abs(exact), (v, g)
    neg = np.empty_like(x)
    _sin_small_each(-x, neg)
    np.testing.assert_array_equal(neg, -got)
    zeros = np.array([0.0, -0.0])
    out = np.empty(2)
    _sin_small_each(zeros, out)
    assert out.tolist() == [0.0, 0.0] and np.signbit(out).tolist() == [False, True]


def test_heads_match_clipping():
    """The heads (bvn.clip_theta / clip_rho on the _math functions, compiled in a loop as
    the recognition kernels call them) agree with the formulas on scipy's σ and numpy's
    tanh and keep their properties (θ(a) = 1 - θ(-a) for a > 0, ε ≤ θ ≤ 1 - ε, ρ odd,
    |ρ| < 1)."""
    seed = 13
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.linspace(-60.0, 60.0, 24_001), rng.normal(size=20_000) * 10.0,
                        SPECIAL[np.isfinite(SPECIAL)]])
    theta, rho = np.empty_like(x), np.empty_like(x)
    _heads_each(x, theta, rho)
    theta_ref = EPS_THETA + (1.0 - 2.0 * EPS_THETA) * expit(x)
    rho_ref = (1.0 - EPS_RHO) * np.tanh(x)
    np.testing.assert_allclose(theta, theta_ref, rtol=1e-15, atol=0)
    np.testing.assert_allclose(rho, rho_ref, rtol=0, atol=1e-15)
    theta_neg, rho_neg = np.empty_like(x), np.empty_like(x)
    _heads_each(-x, theta_neg, rho_neg)
    # θ(a) = 1 - θ(-a) exactly for a > 0 (the same float operations)
    pos, neg = x > 0, x < 0
    np.testing.assert_array_equal(theta[pos], 1.0 - theta_neg[pos])
    np.testing.assert_array_equal(theta_neg[neg], 1.0 - theta[neg])
    np.testing.assert_array_equal(rho_neg, -rho)
    assert theta.min() >= EPS_THETA and theta.max() <= 1.0 - EPS_THETA
    assert np.abs(rho).max() < 1.0


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="checks x86 packed instructions")
def test_loops_are_vectorised():
    """A loop of tanh, sigmoid or exp compiles to packed divisions (SSE2 or wider): no libm
    call, no scalar-only path (a division with error_model="python" would prevent it)."""

    def tanh_loop(a):
        for i in range(a.shape[0]):
            a[i] = _math.tanh(a[i])

    def sigmoid_loop(a):
        for i in range(a.shape[0]):
            a[i] = _math.sigmoid(a[i])

    def exp_loop(a):
        for i in range(a.shape[0]):
            a[i] = _math.exp(a[i])

    for fn in (tanh_loop, sigmoid_loop, exp_loop):
        # compiled afresh (asm of cached code cannot be inspected)
        kernel = numba.njit(fn, nogil=True, error_model="numpy", cache=False)
        a = np.linspace(-3.0, 3.0, 11)
        kernel(a)
        asm = kernel.inspect_asm(kernel.signatures[0])
        assert "divpd" in asm, f"{fn.__name__} did not vectorise"

    def sin_loop(a):
        for i in range(a.shape[0]):
            a[i] = _math.sin_small(a[i])

    kernel = numba.njit(sin_loop, nogil=True, error_model="numpy", cache=False)
    a = np.linspace(-1.0, 1.0, 11)
    kernel(a)
    asm = kernel.inspect_asm(kernel.signatures[0])
    # packed double multiplies (mulpd) or fused multiply-adds (vfmadd...pd): a scalar
    # ...sd loop beside any packed move (vmovapd) passed the check as it was written
    assert re.search(r"\b(v?mulpd|vfn?m(add|sub)\w*pd)\b", asm), "sin_small did not vectorise"
