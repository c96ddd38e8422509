"""Tests of streamfhmm.kernels.bvn: φ, Φ, Φ⁻¹, Φ2, φ2, the copula cells (MATH.md §2)
and the clipping maps (MATH.md §2–§3).

References: scipy.special / scipy.stats (absolute), and tests/naive_bvn.py (scipy
quadrature for absolute accuracy, mpmath quadrature at 20+ digits for accuracy
relative to the value).
"""
import math
import platform

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special
from scipy.stats import multivariate_normal

from streamfhmm.kernels import bvn
from . import naive_bvn as naive

EPS_THETA = bvn.EPS_THETA
EPS_RHO = bvn.EPS_RHO


def _rng(seed):
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def _random_rho(rng, n, max_abs=0.9999):
    """Half uniform on (-max_abs, max_abs), half within 10^-4..10^-0.5 of ±1 (clipped)."""
    uniform = rng.uniform(-max_abs, max_abs, n)
    near = rng.choice([-1.0, 1.0], n) * (1.0 - 10.0 ** rng.uniform(-4.0, -0.5, n))
    rho = np.where(rng.uniform(size=n) < 0.5, uniform, near)
    return np.clip(rho, -max_abs, max_abs)


def _random_theta(rng, n, low=EPS_THETA):
    """Marginals spread log-uniformly towards both ends of (low, 1 - low)."""
    tail = 10.0 ** rng.uniform(math.log10(low), math.log10(0.5), n)
    return np.where(rng.uniform(size=n) < 0.5, tail, 1.0 - tail)


def _scipy_bvn(h, k, rho):
    return multivariate_normal.cdf([h, k], mean=[0.0, 0.0], cov=[[1.0, rho], [rho, 1.0]],
                                   abseps=1e-15, releps=1e-15)


def _cells(theta_prev, theta, rho):
    q = np.empty(4)
    bvn.copula_cells_value(theta_prev, theta, rho, q)
    return q


def _cells_and_derivatives(theta_prev, theta, rho):
    q = np.empty(4)
    dq = np.empty((4, 3))
    bvn.copula_cells(theta_prev, theta, rho, q, dq)
    return q, dq


# ---------------------------------------------------------------------------------------
# Univariate
# ---------------------------------------------------------------------------------------

def test_norm_cdf_matches_ndtr():
    rng = _rng(101)
    x = np.concatenate([rng.uniform(-37.0, 37.0, 20000), rng.normal(size=5000),
                        [0.0, -1e-300, 1e-300, -8.0, 8.0]])
    ours = np.array([bvn.norm_cdf(v) for v in x])
    ref = special.ndtr(x)
    keep = ref > 1e-300
    rel = np.abs(ours - ref)[keep] / ref[keep]
    # both evaluate erfc at a rounded x/√2: relative error grows like x²·eps
    bound = 8e-16 * (1.0 + x[keep] ** 2)
    print(f"norm_cdf vs ndtr: max rel err {rel.max():.2e}, max (rel err / bound) "
          f"{(rel / bound).max():.2f}")
    assert np.all(rel <= bound)
    assert bvn.norm_cdf(0.0) == 0.5
    assert bvn.norm_cdf(-np.inf) == 0.0 and bvn.norm_cdf(np.inf) == 1.0
    assert math.isnan(bvn.norm_cdf(np.nan))


def test_norm_pdf_matches_scipy():
    from scipy.stats import norm

    x = np.linspace(-38.0, 38.0, 2001)
    ours = np.array([bvn.norm_pdf(v) for v in x])
    ref = norm.pdf(x)
    keep = ref > 1e-300
    # exp of a rounded x²/2: relative error grows like x²·eps
    np.testing.assert_array_less(np.abs(ours - ref)[keep] / ref[keep],
                                 4e-16 * (1.0 + x[keep] ** 2))


def test_norm_ppf_matches_ndtri():
    rng = _rng(102)
    p = np.concatenate([10.0 ** rng.uniform(-300.0, math.log10(0.5), 20000),
                        rng.uniform(0.0, 1.0, 20000),
                        1.0 - 10.0 ** rng.uniform(-16.0, math.log10(0.5), 20000),
                        [0.5, 0.075, 0.925, 0.075 - 1e-17, 1e-300, 0.5 - 1e-17]])
    p = p[(p > 0.0) & (p < 1.0)]
    ours = np.empty_like(p)
    bvn.norm_ppf_array(p, ours)
    ref = special.ndtri(p)
    keep = ref != 0.0
    rel = np.abs(ours - ref)[keep] / np.abs(ref[keep])
    print(f"norm_ppf vs ndtri: max rel err {rel.max():.2e} over {p.size} points")
    assert rel.max() <= 2e-15
    assert bvn.norm_ppf(0.5) == 0.0


def test_norm_ppf_against_mpmath_and_roundtrip():
    rng = _rng(103)
    p = np.concatenate([10.0 ** rng.uniform(-300.0, -1.0, 25), rng.uniform(0.01, 0.99, 15),
                        1.0 - 10.0 ** rng.uniform(-16.0, -1.0, 25)])
    ours = np.array([bvn.norm_ppf(v) for v in p])
    ref = np.array([float(naive.norm_ppf_mp(v, 25)) for v in p])
    rel = np.abs(ours - ref) / np.abs(ref)
    print(f"norm_ppf vs mpmath: max rel err {rel.max():.2e}")
    assert rel.max() <= 1e-15
    # Φ(Φ⁻¹(p)) = p in the lower half, where both are relatively accurate (a relative
    # error δ in x = Φ⁻¹(p) becomes x²δ in Φ(x))
    low = p[p <= 0.5]
    x = np.array([bvn.norm_ppf(v) for v in low])
    back = np.array([bvn.norm_cdf(v) for v in x])
    assert np.all(np.abs(back - low) <= 4e-16 * (1.0 + x * x) * low)


def test_norm_ppf_special_values_and_symmetry():
    assert bvn.norm_ppf(0.0) == -np.inf and bvn.norm_ppf(1.0) == np.inf
    for bad in (-0.1, 1.1, np.nan):
        assert math.isnan(bvn.norm_ppf(bad))
    rng = _rng(104)
    p = rng.uniform(0.5, 1.0, 2000)
    # for p ≥ 1/2, 1 - p is exact and the upper half is computed from it
    assert all(bvn.norm_ppf(v) == -bvn.norm_ppf(1.0 - v) for v in p)


# ---------------------------------------------------------------------------------------
# Bivariate CDF
# ---------------------------------------------------------------------------------------

def test_bvn_cdf_matches_scipy_10000_points():
    rng = _rng(201)
    n = 10000
    wide = rng.uniform(-10.0, 10.0, (n, 2))
    bulk = rng.normal(size=(n, 2)) * 2.0
    hk = np.where((rng.uniform(size=n) < 0.5)[:, None], wide, bulk)
    h, k = hk[:, 0].copy(), hk[:, 1].copy()
    rho = _random_rho(rng, n)
    ours = np.empty(n)
    bvn.bvn_cdf_array(h, k, rho, ours)
    ref = np.array([_scipy_bvn(a, b, c) for a, b, c in zip(h, k, rho)])
    err = np.abs(ours - ref)
    i = int(err.argmax())
    print(f"bvn_cdf vs scipy: max abs err {err.max():.2e} over {n} points "
          f"(at h={h[i]:.4f}, k={k[i]:.4f}, rho={rho[i]:.6f}); "
          f"|h|,|k| <= {np.abs(hk).max():.2f}, |rho| <= {np.abs(rho).max()}")
    assert err.max() <= 1e-13


def test_scipy_reference_agrees_with_quadrature():
    """scipy's 2-D CDF (Genz's algorithm) checked against adaptive 1-D quadrature."""
    rng = _rng(202)
    n = 300
    h = rng.uniform(-10.0, 10.0, n)
    k = rng.uniform(-10.0, 10.0, n)
    rho = _random_rho(rng, n)
    ref_scipy = np.array([_scipy_bvn(a, b, c) for a, b, c in zip(h, k, rho)])
    ref_quad = np.array([naive.bvn_cdf_quad(a, b, c) for a, b, c in zip(h, k, rho)])
    ours = np.empty(n)
    bvn.bvn_cdf_array(h, k, rho, ours)
    print(f"scipy vs quad: max abs diff {np.abs(ref_scipy - ref_quad).max():.2e}; "
          f"bvn_cdf vs quad: {np.abs(ours - ref_quad).max():.2e}")
    assert np.abs(ref_scipy - ref_quad).max() <= 1e-14
    assert np.abs(ours - ref_quad).max() <= 1e-14


# Points chosen to visit every branch of bvn_cdf in the tails, where accuracy relative to
# the value is the hard part: (h, k, rho).
HARD_POINTS = [
    (-4.75, -4.75, -0.9),       # two anticorrelated lows: Gauss–Laguerre, ~1e-102
    (-4.75, -4.75, -0.3),       # same, near the branch boundary
    (-4.75, -4.75, -0.2),       # angle integral, below the boundary
    (-4.75, -1.0, -0.9),
    (-4.75, 1.0, -0.9),
    (-9.0, -9.0, 0.74),         # deep lower tail, positive correlation
    (-4.75, -4.75, 0.29),
    (-4.75, 0.0, 0.924),
    (-4.75, -4.75, 0.93),       # Genz expansion
    (-4.75, -4.74, 0.999999),
    (-3.0, -3.0, 0.99999),
    (-4.75, -2.0, 0.999),       # Genz branch, Gauss–Laguerre remainder
    (4.309, 2.7124, 0.99999882),
    (-2.3592, 3.7714, -0.99999818),
    (-1.0, 1.2, -0.95),
    (-0.5, 0.4, -0.999),
    (-8.0, 7.5, -0.999),
    (0.3, -0.2, 0.5),
    (2.0, -1.0, -0.6),
    (9.5, 9.0, -0.99),
]


def test_bvn_cdf_relative_accuracy_against_mpmath():
    rng = _rng(203)
    points = list(HARD_POINTS)
    for _ in range(20):
        h, k = rng.uniform(-8.0, 8.0, 2)
        points.append((h, k, float(_random_rho(rng, 1)[0])))
    worst = 0.0
    for h, k, rho in points:
        ref = float(naive.bvn_cdf_mp(h, k, rho, dps=20))
        val = bvn.bvn_cdf(h, k, rho)
        assert val > 0.0, (h, k, rho, ref)
        rel = abs(val - ref) / ref
        worst = max(worst, rel)
        assert rel <= 5e-13, (h, k, rho, val, ref, rel)
    print(f"bvn_cdf vs mpmath: max rel err {worst:.2e} over {len(points)} points")


def test_bvn_cdf_special_cases():
    rng = _rng(204)
    for _ in range(200):
        h, k = rng.normal(size=2) * 3
        # ρ = 0: the product, exactly
        assert bvn.bvn_cdf(h, k, 0.0) == bvn.norm_cdf(h) * bvn.norm_cdf(k)
        # infinite limits
        assert bvn.bvn_cdf(h, np.inf, 0.7) == bvn.norm_cdf(h)
        assert bvn.bvn_cdf(np.inf, k, -0.7) == bvn.norm_cdf(k)
        assert bvn.bvn_cdf(-np.inf, k, 0.3) == 0.0
        assert bvn.bvn_cdf(h, -np.inf, -0.3) == 0.0
        # degenerate correlations
        assert bvn.bvn_cdf(h, k, 1.0) == bvn.norm_cdf(min(h, k))
        assert abs(bvn.bvn_cdf(h, k, -1.0) - max(0.0, special.ndtr(h) - special.ndtr(-k))) < 1e-15
    assert bvn.bvn_cdf(np.inf, np.inf, 0.5) == 1.0
    assert bvn.bvn_cdf(-np.inf, np.inf, 0.5) == 0.0
    for bad in [(np.nan, 0.0, 0.1), (0.0, np.nan, 0.1), (0.0, 0.0, np.nan), (0.0, 0.0, 1.5)]:
        assert math.isnan(bvn.bvn_cdf(*bad))
    # Φ2(0, 0; ρ) = 1/4 + asin(ρ)/(2π) across all three branches
    for rho in np.concatenate([np.linspace(-0.9999, 0.9999, 401), [-1 + 1e-9, 1 - 1e-9]]):
        exact = 0.25 + math.asin(rho) / (2.0 * math.pi)
        assert abs(bvn.bvn_cdf(0.0, 0.0, rho) - exact) <= 4e-16


def test_bvn_cdf_identities():
    rng = _rng(205)
    n = 5000
    h = rng.uniform(-9.0, 9.0, n)
    k = rng.uniform(-9.0, 9.0, n)
    rho = _random_rho(rng, n)
    for a, b, c in zip(h, k, rho):
        v = bvn.bvn_cdf(a, b, c)
        assert 0.0 <= v <= min(bvn.norm_cdf(a), bvn.norm_cdf(b)) * (1 + 1e-13)
        # P(X<h) = P(X<h, Y<k) + P(X<h, Y>k) = Φ2(h,k;ρ) + Φ2(h,-k;-ρ)
        assert abs(v + bvn.bvn_cdf(a, -b, -c) - bvn.norm_cdf(a)) <= 5e-16
        # Φ2(h,k;ρ) - Φ2(-h,-k;ρ) = Φ(h) + Φ(k) - 1
        assert abs(v - bvn.bvn_cdf(-a, -b, c) - (bvn.norm_cdf(a) - bvn.norm_cdf(-b))) <= 5e-16


def test_bvn_pdf_matches_formula_and_cdf_derivative():
    import mpmath as mp

    rng = _rng(206)
    for _ in range(300):
        h, k = rng.normal(size=2) * 3
        rho = float(_random_rho(rng, 1, max_abs=0.999)[0])
        val = bvn.bvn_pdf(h, k, rho)
        with mp.workdps(30):
            a, b, c = mp.mpf(h), mp.mpf(k), mp.mpf(rho)
            expo = (a * a - 2 * c * a * b + b * b) / (2 * (1 - c * c))
            ref = float(mp.exp(-expo) / (2 * mp.pi * mp.sqrt(1 - c * c)))
        # exp of a rounded exponent: relative error ~ eps·(1 + exponent)
        assert abs(val - ref) <= 1e-15 * (1.0 + float(expo)) * ref
        ref_scipy = multivariate_normal.pdf([h, k], mean=[0.0, 0.0],
                                            cov=[[1.0, rho], [rho, 1.0]])
        assert abs(val - ref_scipy) <= 1e-8 * ref_scipy
        # ∂Φ2/∂ρ = φ2, up to the rounding noise of the difference quotient
        step = 1e-4 * (1.0 - abs(rho))
        fd = (bvn.bvn_cdf(h, k, rho + step) - bvn.bvn_cdf(h, k, rho - step)) / (2 * step)
        assert abs(fd - val) <= 1e-6 * val + 1e-15 / step
    assert bvn.bvn_pdf(np.inf, 0.0, 0.5) == 0.0


@settings(max_examples=300, deadline=None)
@given(h=st.floats(-12.0, 12.0), k=st.floats(-12.0, 12.0),
       rho=st.floats(-0.999999, 0.999999))
def test_bvn_cdf_symmetric_property(h, k, rho):
    a = bvn.bvn_cdf(h, k, rho)
    b = bvn.bvn_cdf(k, h, rho)
    assert abs(a - b) <= 2e-16 + 2e-15 * a


def test_bvn_cdf_array_equals_scalar():
    rng = _rng(207)
    h, k = rng.normal(size=(2, 100)) * 3
    rho = _random_rho(rng, 100)
    out = np.empty(100)
    bvn.bvn_cdf_array(h, k, rho, out)
    assert np.array_equal(out, [bvn.bvn_cdf(a, b, c) for a, b, c in zip(h, k, rho)])


# ---------------------------------------------------------------------------------------
# Copula cells
# ---------------------------------------------------------------------------------------

def test_copula_cells_equal_bvn_cdf_of_their_arguments():
    rng = _rng(301)
    n = 3000
    tp, t = _random_theta(rng, n), _random_theta(rng, n)
    rho = np.clip(_random_rho(rng, n), -1 + EPS_RHO, 1 - EPS_RHO)
    for a, b, c in zip(tp, t, rho):
        q = _cells(a, b, c)
        h1, h2 = -bvn.norm_ppf(a), -bvn.norm_ppf(b)
        direct = [bvn.bvn_cdf(h1, h2, c), bvn.bvn_cdf(h1, -h2, -c),
                  bvn.bvn_cdf(-h1, h2, -c), bvn.bvn_cdf(-h1, -h2, c)]
        for qi, di in zip(q, direct):
            assert abs(qi - di) <= 2e-16 + 1e-15 * di


def test_copula_cells_match_scipy():
    rng = _rng(302)
    n = 500
    tp, t = _random_theta(rng, n), _random_theta(rng, n)
    rho = np.clip(_random_rho(rng, n), -1 + EPS_RHO, 1 - EPS_RHO)
    worst = 0.0
    for a, b, c in zip(tp, t, rho):
        err = np.abs(_cells(a, b, c) - naive.copula_cells_scipy(a, b, c)).max()
        worst = max(worst, err)
    print(f"copula cells vs scipy: max abs err {worst:.2e}")
    assert worst <= 1e-13


# (θ_{t-1}, θ_t, ρ) where some cell is tiny
HARD_CELLS = [
    (1e-6, 1e-6, 0.0), (1e-6, 1e-6, 0.5), (1e-6, 1e-6, -0.5), (1e-6, 1e-6, -0.9),
    (1e-6, 1e-6, 1 - 1e-6), (1e-6, 1e-6, -1 + 1e-6), (1e-6, 1 - 1e-6, 0.3),
    (1 - 1e-6, 1 - 1e-6, -0.95), (1e-6, 0.3, -0.999), (0.5, 0.5, 1 - 1e-6),
    (1e-4, 2e-4, 0.9999), (0.2, 1e-5, -0.25), (0.999, 0.9, -0.8),
]


def test_copula_cells_relative_accuracy_against_mpmath():
    """Small cells are positive and accurate relative to their size."""
    worst = 0.0
    for a, b, c in HARD_CELLS:
        q = _cells(a, b, c)
        ref = [float(v) for v in naive.copula_cells_mp(a, b, c, dps=20)]
        for qi, ri in zip(q, ref):
            if ri > 1e-300:
                assert qi > 0.0, (a, b, c, q, ref)
                rel = abs(qi - ri) / ri
                worst = max(worst, rel)
                assert rel <= 1e-12, (a, b, c, q, ref)
            else:
                assert qi <= 1e-300
    print(f"copula cells vs mpmath: max rel err {worst:.2e}")


def test_copula_cells_relative_accuracy_near_laguerre_boundary():
    """The documented worst case of the cells (module notes of bvn.py): two
    anticorrelated lows at the clipping bound θ = 1e-6 with |ρ| just below the switch to
    Gauss–Laguerre, where the angle integral cancels against Φ(h)Φ(k) (~1e-11
    relative, not the 3e-13 of the rest of the plane)."""
    worst = 0.0
    # the last two: the cells' own marginals (θ) with an angle integral at the rounded
    # h = -Φ⁻¹(θ) reached 3.1e-11 and 2.5e-11 there (the rounding of h did not cancel)
    for a, b, c, cell in [(1 - 1e-6, 1 - 1e-6, -0.2495, 0), (1e-6, 1e-6, -0.245, 3),
                          (1 - 1e-6, 1e-6, 0.24, 1),
                          (1.0880015309238703e-06, 2.050015274508446e-06, -0.2531990590435634, 3),
                          (1.000001e-06, 2e-06, -0.2495, 3)]:
        q = _cells(a, b, c)
        ref = float(naive.copula_cells_mp(a, b, c, dps=20)[cell])
        rel = abs(q[cell] - ref) / ref
        worst = max(worst, rel)
        assert rel <= 2e-11, (a, b, c, cell, q[cell], ref, rel)
    print(f"cells near the Gauss–Laguerre boundary: max rel err {worst:.2e}")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="checks x86 packed instructions")
def test_quadrature_node_loops_are_vectorised():
    """The integrands of Φ2's three quadratures (angle integral, Genz's remainder,
    Gauss–Laguerre) compile to packed divisions: their nodes are evaluated four at a
    time, with no libm call (``math.exp``/``math.sin`` in them would keep them scalar)."""
    cases = [
        (bvn._dw_terms, (22.0, 21.0, 0.3, bvn._GL32_X, bvn._GL32_W, 1.0, np.empty(16))),
        (bvn._series_terms, (1.0, 2.0, 0.1, 0.2, 0.1, bvn._GL20_X, bvn._GL20_W, 1.0,
                             np.empty(10))),
        (bvn._iplus_laguerre, (1.0, -2.0, 0.95)),
    ]
    for fn, args in cases:
        # compiled afresh (asm of cached code cannot be inspected)
        kernel = numba.njit(fn.py_func, nogil=True, error_model="numpy", cache=False)
        expected = fn(*args)
        assert kernel(*args) == expected
        asm = kernel.inspect_asm(kernel.signatures[0])
        assert "divpd" in asm, f"{fn.py_func.__name__} did not vectorise"


def test_copula_cells_margins_sum_and_sign():
    rng = _rng(303)
    n = 20000
    tp, t = _random_theta(rng, n), _random_theta(rng, n)
    rho = np.clip(_random_rho(rng, n, max_abs=1.0), -1 + EPS_RHO, 1 - EPS_RHO)
    q = np.empty((n, 4))
    bvn.copula_cells_value_array(tp, t, rho, q)
    assert np.all(q >= 0.0)
    np.testing.assert_allclose(q[:, 2] + q[:, 3], tp, rtol=0, atol=1e-15)
    np.testing.assert_allclose(q[:, 1] + q[:, 3], t, rtol=0, atol=1e-15)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=0, atol=2e-15)
    # a cell is 0 only where the true value underflows: every cell is at least
    # φ2(h1, h2; ρ)·(1-ρ²)²/((h1 ± h2)²|ρ|)·O(1), so φ2 must be below ~1e-300 there
    zero = (q == 0.0).any(axis=1)
    for a, b, c in zip(tp[zero], t[zero], rho[zero]):
        assert bvn.bvn_pdf(-bvn.norm_ppf(a), -bvn.norm_ppf(b), c) < 1e-280
    print(f"{zero.sum()} of {n} draws have an underflowed cell")
    # and within |ρ| ≤ 0.9, θ ∈ [1e-6, 1-1e-6] none does
    moderate = np.abs(rho) <= 0.9
    assert np.all(q[moderate] > 0.0)


def test_copula_cells_value_equals_copula_cells():
    rng = _rng(304)
    n = 500
    tp, t = _random_theta(rng, n), _random_theta(rng, n)
    rho = np.clip(_random_rho(rng, n), -1 + EPS_RHO, 1 - EPS_RHO)
    q1 = np.empty((n, 4))
    q2 = np.empty((n, 4))
    dq = np.empty((n, 4, 3))
    bvn.copula_cells_value_array(tp, t, rho, q1)
    bvn.copula_cells_array(tp, t, rho, q2, dq)
    assert np.array_equal(q1, q2)
    for i in range(0, n, 50):
        q, d = _cells_and_derivatives(tp[i], t[i], rho[i])
        assert np.array_equal(q, q2[i]) and np.array_equal(d, dq[i])


def test_copula_cells_derivative_identities():
    rng = _rng(305)
    for _ in range(2000):
        a, b = _random_theta(rng, 2)
        c = float(np.clip(_random_rho(rng, 1, max_abs=1.0)[0], -1 + EPS_RHO, 1 - EPS_RHO))
        _, d = _cells_and_derivatives(a, b, c)
        np.testing.assert_allclose(d.sum(axis=0), 0.0, atol=1e-15)
        np.testing.assert_allclose(d[2] + d[3], [1.0, 0.0, 0.0], atol=1e-15)
        np.testing.assert_allclose(d[1] + d[3], [0.0, 1.0, 0.0], atol=1e-15)


# Cells with the same derivative up to sign, from the margin identities: for θ_{t-1},
# q00 + q10 = 1 - θ_t and q01 + q11 = θ_t; for θ_t, q00 + q01 = 1 - θ_{t-1} and
# q10 + q11 = θ_{t-1}; for ρ all four (∂q00 = -∂q01 = -∂q10 = ∂q11 = φ2).
_SIGN = [1.0, -1.0, -1.0, 1.0]
_FD_EQUIVALENT = {
    0: [[(0, 1.0), (2, -1.0)], [(1, 1.0), (3, -1.0)], [(2, 1.0), (0, -1.0)], [(3, 1.0), (1, -1.0)]],
    1: [[(0, 1.0), (1, -1.0)], [(1, 1.0), (0, -1.0)], [(2, 1.0), (3, -1.0)], [(3, 1.0), (2, -1.0)]],
    2: [[(m, _SIGN[i] * _SIGN[m]) for m in range(4)] for i in range(4)],
}


def test_copula_cells_derivatives_match_finite_differences():
    """Every entry of dq against a central difference, to 1e-6 relative.

    A central difference of a cell q_i has a rounding noise of about
    (relative error of q_i)·q_i/step; a derivative that is tiny next to its cell
    (e.g. 1e-14 for a cell of 1e-2) is below that noise. The margin identities give
    cells with the same derivative up to sign, one of them small, hence relatively
    accurate: the difference is taken of the smallest of them.
    """
    rng = _rng(306)
    n = 400
    tp = _random_theta(rng, n, low=1e-4)
    t = _random_theta(rng, n, low=1e-4)
    rho = _random_rho(rng, n, max_abs=0.999)
    worst = 0.0
    checked = 0
    skipped = 0

    def central(x, j, step):
        plus, minus = list(x), list(x)
        plus[j] += step
        minus[j] -= step
        return (_cells(*plus) - _cells(*minus)) / (2 * step)

    for x in zip(tp, t, rho):
        q, d = _cells_and_derivatives(*x)
        a, b, c = x
        steps = (1e-4 * min(a, 1 - a), 1e-4 * min(b, 1 - b), 1e-4 * (1 - abs(c)))
        for j, step in enumerate(steps):
            # Richardson extrapolation of two central differences: error O(step⁴)
            fd = (4 * central(x, j, step / 2) - central(x, j, step)) / 3
            for i in range(4):
                m, sign = min(_FD_EQUIVALENT[j][i], key=lambda option: q[option[0]])
                fd_ij, cell = sign * fd[m], q[m]
                if abs(d[i, j]) < 1e-250:  # derivative of an underflowed cell
                    assert abs(fd_ij) < 1e-200
                    continue
                if 1e-13 * cell / step > 1e-7 * abs(d[i, j]):
                    skipped += 1  # below the rounding noise of any difference quotient
                    continue
                rel = abs(fd_ij - d[i, j]) / abs(d[i, j])
                worst = max(worst, rel)
                checked += 1
                assert rel <= 1e-6, (a, b, c, i, j, fd_ij, d[i, j])
    print(f"copula derivatives vs central differences: max rel err {worst:.2e} "
          f"over {checked} entries ({skipped} unresolvable by differences)")
    assert skipped <= 0.01 * checked


@settings(max_examples=300, deadline=None)
@given(theta_prev=st.floats(EPS_THETA, 1 - EPS_THETA),
       theta=st.floats(EPS_THETA, 1 - EPS_THETA),
       rho=st.floats(-1 + EPS_RHO, 1 - EPS_RHO))
def test_copula_margins_property(theta_prev, theta, rho):
    q = _cells(theta_prev, theta, rho)
    assert np.all(q >= 0.0) and np.all(q <= 1.0)
    assert abs(q[2] + q[3] - theta_prev) <= 1e-15
    assert abs(q[1] + q[3] - theta) <= 1e-15
    assert abs(q[0] + q[1] - (1 - theta_prev)) <= 2e-15
    assert abs(q[0] + q[2] - (1 - theta)) <= 2e-15
    # swapping the two time steps transposes the table
    qt = _cells(theta, theta_prev, rho)
    np.testing.assert_allclose(qt[[0, 2, 1, 3]], q, rtol=1e-14, atol=1e-300)


# ---------------------------------------------------------------------------------------
# Clipping
# ---------------------------------------------------------------------------------------

def test_clip_theta_and_rho_ranges_and_derivatives():
    for a in np.concatenate([np.linspace(-50, 50, 1001), [-1e308, 1e308, -800.0, 800.0]]):
        theta = bvn.clip_theta(a)
        assert EPS_THETA <= theta <= 1 - EPS_THETA
        sig = special.expit(a)
        assert abs(theta - (EPS_THETA + (1 - 2 * EPS_THETA) * sig)) <= 3e-16
        deriv = bvn.clip_theta_deriv(a)
        ref = (1 - 2 * EPS_THETA) * special.expit(a) * special.expit(-a)
        assert deriv >= 0.0
        assert abs(deriv - ref) <= 1e-15 * ref
        if abs(a) < 30:
            step = 1e-4
            fd = (bvn.clip_theta(a + step) - bvn.clip_theta(a - step)) / (2 * step)
            assert abs(fd - deriv) <= 1e-7 * deriv + 1e-11
    for b in np.concatenate([np.linspace(-20, 20, 801), [-1e308, 1e308, -400.0, 400.0]]):
        rho = bvn.clip_rho(b)
        assert -1 + EPS_RHO <= rho <= 1 - EPS_RHO
        assert abs(rho - (1 - EPS_RHO) * math.tanh(b)) <= 3e-16
        deriv = bvn.clip_rho_deriv(b)
        ref = (1 - EPS_RHO) / math.cosh(b) ** 2 if abs(b) < 350 else 0.0
        assert deriv >= 0.0
        assert abs(deriv - ref) <= 1e-15 * ref + 1e-300
        if abs(b) < 10:
            step = 1e-4
            fd = (bvn.clip_rho(b + step) - bvn.clip_rho(b - step)) / (2 * step)
            assert abs(fd - deriv) <= 1e-7 * deriv + 1e-11
    assert bvn.clip_theta(0.0) == 0.5 and bvn.clip_rho(0.0) == 0.0


# ---- B02: clip_rho_deriv between |b| = 20 and its underflow cut-off
def test_clip_rho_deriv_keeps_relative_precision_up_to_its_cutoff():
    """dρ/db between |b| = 20 and the cut-off where it underflows (the grid stopped at 20)."""
    import math
    from streamfhmm.kernels import bvn
    for b in (20.5, 25.0, 60.0, 100.0, 200.0, 300.0, 350.0):
        for s in (1.0, -1.0):
            ref = (1 - bvn.EPS_RHO) / math.cosh(b) ** 2
            d = bvn.clip_rho_deriv(s * b)
            assert ref > 0 and abs(d - ref) <= 1e-14 * ref, (b, d, ref)


# ---- B07/B08: the θ-derivatives of the cells keep their relative precision as |ρ| → 1
def test_copula_cells_h_theta_derivatives_against_mpmath_near_unit_rho():
    """∂q/∂θ = ∓Φ(±A), ∓Φ(±B) keep their relative precision as |ρ| → 1 (the thresholds
    are given as doubles, so h's own rounding is out of the comparison): r = √(1-ρ²)
    instead of √((1-ρ)(1+ρ)) lost 5e-9, the ρ ≥ 0 form of (h2 - ρh1)/r for ρ < 0 2e-11."""
    import mpmath as mp
    from scipy import special
    from streamfhmm.kernels import bvn
    mp.mp.dps = 50
    q, dq = np.empty(4), np.empty((4, 3))
    worst = 0.0
    for rho in (-(1 - 1e-6), -(1 - 1e-5), -(1 - 1e-4), 1 - 1e-6, 1 - 1e-5):
        r = np.sqrt((1 - rho) * (1 + rho))
        for h1 in (4.75, 3.0, -4.0):
            for A in (-30.0, -10.0, -3.0, 0.5, 3.0, 10.0, 30.0):
                h2 = A * r + rho * h1            # a double: the reference uses it as given
                tp, tc = special.ndtr(-h1), special.ndtr(-h2)
                if not (bvn.EPS_THETA <= tp <= 1 - bvn.EPS_THETA
                        and bvn.EPS_THETA <= tc <= 1 - bvn.EPS_THETA):
                    continue
                bvn.copula_cells_h(tp, tc, h1, h2, rho, q, dq)
                R = mp.sqrt((1 - mp.mpf(rho)) * (1 + mp.mpf(rho)))
                a = (mp.mpf(h2) - mp.mpf(rho) * h1) / R
                b = (mp.mpf(h1) - mp.mpf(rho) * h2) / R
                ref = {(0, 0): -mp.ncdf(a), (1, 0): -mp.ncdf(-a),
                       (0, 1): -mp.ncdf(b), (2, 1): -mp.ncdf(-b)}
                for (i, j), v in ref.items():
                    v = float(v)
                    if abs(v) < 1e-290:
                        continue
                    rel = abs(dq[i, j] - v) / abs(v)
                    worst = max(worst, rel)
                    assert rel <= 1e-12, (rho, h1, A, i, j, dq[i, j], v)
    print(f"worst {worst:.2e}")
