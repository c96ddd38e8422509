"""Normal and bivariate normal kernels, and the cells of the bivariate Gaussian copula.

Scalar Numba functions (callable from other kernels) for φ, Φ, Φ⁻¹, the standard
bivariate normal CDF ``Φ2(h, k; ρ) = P(X < h, Y < k)`` and density ``φ2``, the four
cells of the copula of MATH.md §2 with their derivatives, and the clipping maps of the
recognition-network heads (MATH.md §2–§3). Loop wrappers over arrays are provided for
tests and benchmarks.

Accuracy
--------
``bvn_cdf`` is accurate to a few units of 1e-16 absolute over the whole plane and
``|ρ| < 1``. Relative to the value (measured against 20-digit quadrature, see
tests/test_bvn.py) it is accurate to about 3e-13 for ``|h|, |k| ≤ 8`` except in one
region: the lower orthant of two negatively correlated variables with small ``|ρ|``,
just short of where the third formula below takes over (``D < 3``). There the first
formula cancels (``Φ(h)Φ(k)`` minus almost as much) and the relative error is the
cancellation factor times ~1e-16: up to ~2e-11 for the copula cells (``|h| ≤ 4.75``
for ``θ ∈ [1e-6, 1-1e-6]``; 1.2e-11 measured at ``h = k = -4.753``, ``ρ = -0.2495``),
~1e-9 at ``|h| = |k| = 8`` and ~1e-8 at ``|h| = |k| = 10``. Three integrals are used:

* ``|ρ| < 0.925`` — Drezner–Wesolowsky / Genz (2004):
  ``Φ2 = Φ(h)Φ(k) + (1/2π)∫_0^{asin ρ} exp(-(h²+k²-2hk sinθ)/(2cos²θ)) dθ`` by
  Gauss–Legendre. Genz takes 6/12/20 points by ``|ρ|``; here the number of points
  (6, 12, 20 or 32) grows with ``ρ²(1 + (h²+k²)/2)/(1-ρ²)`` so that the quadrature
  error stays near 1e-16 *relative to* ``Φ(h)Φ(k)`` in the tails as well.
* ``|ρ| ≥ 0.925`` — Genz's expansion: ``Φ2(h,k;ρ) = Φ(min(h,k)) - I₊(-h,-k,ρ)`` for
  ``ρ > 0`` (and the reflected form for ``ρ < 0``) with
  ``I₊(h,k,r) = ∫_r^1 φ2(h,k;t) dt
  = (1/2π)∫_0^{√(1-r²)} exp(-(h-k)²/(2x²) - hk/(1+√(1-x²)))/√(1-x²) dx``,
  integrated as a closed form for the first three Taylor terms of the smooth factor
  plus 20-point Gauss–Legendre for the remainder (32 points for ``|hk| > 50``).
* The same ``I₊`` written as a Laplace-type integral, ``I₊ = φ2(h,k;r)·(1-r²)²/((h-k)²r)
  ·∫_0^∞ e^{-t} F(t) dt``, by 32-point Gauss–Laguerre, where it converges (the
  singularity of ``F`` at ``t = -D``, ``D = (h-k)²r²/(2(1-r²))``, is far from 0,
  ``D ≥ 3``, and ``F`` grows slowly, ``F'(0) ≲ 1/4``). It serves the large-``|h-k|``
  part of the ``|ρ| ≥ 0.925`` branch and, for ``ρ < 0`` and ``h + k < 0``, gives
  ``Φ2(h, k; ρ) = I₊(-h, k, -ρ)`` directly: that is the small probability of two
  anticorrelated variables both being low, which the first formula can only obtain as
  a difference of nearly equal numbers (``Φ(h)Φ(k)`` minus almost as much) and so
  would lose all its relative precision.

Speed: each quadrature evaluates its nodes in a loop of arithmetic, ``sqrt`` and
selects only (:func:`._math.exp`, :func:`._math.sin_small`; a libm call would keep the
loop scalar), which LLVM vectorises, and sums them in four interleaved partial sums. The
copula cells take ``Φ(-h) = θ`` and ``Φ(h) = 1 - θ`` from the marginals beside Genz's
expansion, and ``Φ(±h)`` from one ``erfc`` each beside the angle integral, and
:func:`copula_cells_h` takes the thresholds, so that the ELBO computes each row's
``h = Φ⁻¹(1-θ)`` once. Together these make the cells about twice as fast on the power
protocol's posteriors (1.2–1.3 µs to 0.6–0.8 µs per cell).

Conventions
-----------
No argument checking happens in the kernels. ``h``, ``k`` may be ±inf; NaN propagates;
``|ρ| > 1`` gives NaN and ``ρ = ±1`` the degenerate limits. The copula kernels assume
``0 < θ < 1`` and ``|ρ| < 1``: callers clip with ``clip_theta`` / ``clip_rho``.
"""
import math

import numpy as np

from ._jit import jit
from ._math import exp as _exp
from ._math import sigmoid as _fast_sigmoid
from ._math import sin_small as _sin_small
from ._math import tanh as _fast_tanh

__all__ = [
    "EPS_THETA",
    "EPS_RHO",
    "norm_pdf",
    "norm_cdf",
    "norm_ppf",
    "bvn_pdf",
    "bvn_cdf",
    "copula_cells",
    "copula_cells_h",
    "copula_cells_value",
    "clip_theta",
    "clip_theta_deriv",
    "clip_rho",
    "clip_rho_deriv",
    "bvn_cdf_array",
    "norm_ppf_array",
    "copula_cells_array",
    "copula_cells_value_array",
]

#: θ = EPS_THETA + (1 - 2 EPS_THETA) σ(a) keeps every marginal inside [1e-6, 1 - 1e-6]
EPS_THETA = 1e-6
#: ρ = (1 - EPS_RHO) tanh(b) keeps every correlation inside [-1 + 1e-6, 1 - 1e-6]
EPS_RHO = 1e-6

_SQRT1_2 = 0.70710678118654752440  # 1/√2
_SQRT_2PI = 2.50662827463100050242  # √(2π)
_INV_SQRT_2PI = 0.39894228040143267794  # 1/√(2π)
_TWO_PI = 6.28318530717958647693

#: |h| beyond which a limit is treated as infinite: Φ(-40) ≈ 4e-350 underflows to 0
_BIG = 40.0
#: |ρ| from which Genz's expansion around ρ = ±1 replaces the angle integral
_RHO_GENZ = 0.925
#: Gauss–Laguerre is used for I₊ when the singularity distance D is at least this ...
_LAGUERRE_MIN_D = 3.0
#: ... and the integrand's initial growth rate κ at most this
_LAGUERRE_MAX_KAPPA = 0.25


def _half_legendre(n):
    x, w = np.polynomial.legendre.leggauss(n)
    keep = x > 0
    return np.ascontiguousarray(x[keep]), np.ascontiguousarray(w[keep])


# Positive halves of the n-point Gauss–Legendre rules on [-1, 1] (the rules are symmetric).
_GL6_X, _GL6_W = _half_legendre(6)
_GL12_X, _GL12_W = _half_legendre(12)
_GL20_X, _GL20_W = _half_legendre(20)
_GL32_X, _GL32_W = _half_legendre(32)
# 32-point Gauss–Laguerre rule for ∫_0^∞ e^{-t} f(t) dt.
_LAG_T, _LAG_W = (np.ascontiguousarray(v) for v in np.polynomial.laguerre.laggauss(32))

# Wichura (1988), algorithm AS 241 (PPND16): rational approximations of Φ⁻¹.
_PPF_A = (3.387132872796366608, 133.14166789178437745, 1971.5909503065514427,
          13731.693765509461125, 45921.953931549871457, 67265.770927008700853,
          33430.575583588128105, 2509.0809287301226727)
_PPF_B = (1.0, 42.313330701600911252, 687.1870074920579083, 5394.1960214247511077,
          21213.794301586595867, 39307.89580009271061, 28729.085735721942674,
          5226.495278852545925)
_PPF_C = (1.42343711074968357734, 4.6303378461565452959, 5.7694972214606914055,
          3.64784832476320460504, 1.27045825245236838258, 0.24178072517745061177,
          0.0227238449892691845833, 7.7454501427834140764e-4)
_PPF_D = (1.0, 2.05319162663775882187, 1.6763848301838038494, 0.68976733498510000455,
          0.14810397642748007459, 0.0151986665636164571966, 5.475938084995344946e-4,
          1.05075007164441684324e-9)
_PPF_E = (6.6579046435011037772, 5.4637849111641143699, 1.7848265399172913358,
          0.29656057182850489123, 0.026532189526576123093, 0.0012426609473880784386,
          2.71155556874348757815e-5, 2.01033439929228813265e-7)
_PPF_F = (1.0, 0.59983220655588793769, 0.13692988092273580531, 0.0148753612908506148525,
          7.868691311456132591e-4, 1.8463183175100546818e-5, 1.4215117583164458887e-7,
          2.04426310338993978564e-15)


# ---------------------------------------------------------------------------------------
# Univariate normal
# ---------------------------------------------------------------------------------------

@jit
def norm_pdf(x):
    """Standard normal density φ(x).

    Parameters
    ----------
    x : float

    Returns
    -------
    float

    Notes
    -----
    MATH.md §2 (φ).

    Examples
    --------
    >>> round(norm_pdf(0.0), 12)
    0.398942280401
    """
    return _INV_SQRT_2PI * math.exp(-0.5 * x * x)


@jit
def norm_cdf(x):
    """Standard normal CDF Φ(x), accurate relative to its value in both tails.

    Parameters
    ----------
    x : float
        Any real; ±inf give 0 and 1.

    Returns
    -------
    float

    Notes
    -----
    ``Φ(x) = erfc(-x/√2)/2``: ``erfc`` keeps relative precision for large positive
    arguments, so the left tail ``Φ(x)``, ``x → -∞``, is relatively accurate; for the
    right tail use ``1 - Φ(x) = Φ(-x)``. MATH.md §2.

    Examples
    --------
    >>> norm_cdf(0.0)
    0.5
    >>> f"{norm_cdf(-10.0):.6e}"
    '7.619853e-24'
    """
    return 0.5 * math.erfc(-x * _SQRT1_2)


@jit
def _poly7(c, x):
    return ((((((c[7] * x + c[6]) * x + c[5]) * x + c[4]) * x + c[3]) * x + c[2]) * x
            + c[1]) * x + c[0]


@jit
def _ppf_lower(p):
    """Φ⁻¹(p) for 0 < p ≤ 1/2 (result ≤ 0)."""
    q = p - 0.5
    if -q <= 0.425:
        r = 0.180625 - q * q
        x = q * _poly7(_PPF_A, r) / _poly7(_PPF_B, r)
    else:
        r = math.sqrt(-math.log(p))
        if r <= 5.0:
            r -= 1.6
            x = -_poly7(_PPF_C, r) / _poly7(_PPF_D, r)
        else:
            r -= 5.0
            x = -_poly7(_PPF_E, r) / _poly7(_PPF_F, r)
    # One Halley step on Φ(x) = p; Φ is relatively accurate here (x ≤ 0), so this
    # removes the rounding of the rational approximation.
    if p > 1e-300:
        e = norm_cdf(x) - p
        u = e * _SQRT_2PI * math.exp(0.5 * x * x)
        x = x - u / (1.0 + 0.5 * x * u)
    return x


@jit
def norm_ppf(p):
    """Standard normal quantile Φ⁻¹(p), accurate to ~1e-16 relative over (0, 1).

    Parameters
    ----------
    p : float
        Probability; 0 and 1 give ∓inf, values outside [0, 1] and NaN give NaN.

    Returns
    -------
    float

    Notes
    -----
    Wichura's AS 241 (PPND16) rational approximations and one Halley step on
    ``Φ(x) = p``. For ``p > 1/2`` it returns ``-Φ⁻¹(1-p)``: ``1 - p`` is exact there, so
    the upper tail is as accurate as the lower one and, for ``p ≥ 1/2``,
    ``norm_ppf(p) == -norm_ppf(1 - p)`` exactly.
    MATH.md §2 (``h = Φ⁻¹(1-θ)`` is computed as ``-norm_ppf(θ)``).

    Examples
    --------
    >>> round(norm_ppf(0.975), 12)
    1.95996398454
    """
    if not (p >= 0.0 and p <= 1.0):
        return np.nan
    if p == 0.0:
        return -np.inf
    if p == 1.0:
        return np.inf
    if p <= 0.5:
        return _ppf_lower(p)
    return -_ppf_lower(1.0 - p)


# ---------------------------------------------------------------------------------------
# Bivariate normal
# ---------------------------------------------------------------------------------------

@jit
def bvn_pdf(h, k, rho):
    """Standard bivariate normal density φ2(h, k; ρ).

    Parameters
    ----------
    h, k : float
    rho : float
        Correlation, ``|ρ| < 1``.

    Returns
    -------
    float

    Notes
    -----
    ``exp(-(h² - 2ρhk + k²)/(2(1-ρ²))) / (2π√(1-ρ²))`` with the quadratic form written
    as ``(h∓k)² ± 2(1∓ρ)hk`` and ``1-ρ² = (1-ρ)(1+ρ)``, which keeps its precision for
    ``|ρ| → 1``. MATH.md §2 (``∂Φ2/∂ρ = φ2``).

    Examples
    --------
    >>> round(bvn_pdf(0.0, 0.0, 0.0), 12)
    0.159154943092
    """
    if math.isinf(h) or math.isinf(k):
        return 0.0
    one_m = 1.0 - rho
    one_p = 1.0 + rho
    if rho >= 0.0:
        quad = (h - k) * (h - k) + 2.0 * one_m * h * k
    else:
        quad = (h + k) * (h + k) - 2.0 * one_p * h * k
    a2 = one_m * one_p
    return math.exp(-0.5 * quad / a2) / (_TWO_PI * math.sqrt(a2))


@jit
def _interval_prob(lo, hi):
    """P(lo < Z < hi) for a standard normal Z, without cancellation; 0 if hi ≤ lo
    (:func:`_interval_from` on the four tails)."""
    return _interval_from(lo, hi, norm_cdf(lo), norm_cdf(hi), norm_cdf(-lo), norm_cdf(-hi))


@jit
def _dw_points(rho, hs):
    """Gauss–Legendre order for the angle integral (6, 12, 20 or 32)."""
    r2 = rho * rho
    d = r2 * (1.0 + hs) / ((1.0 - rho) * (1.0 + rho))
    if d < 0.06:
        return 6
    if d < 2.5:
        return 12
    if d < 12.0:
        return 20
    return 32


@jit
def _sum_terms(terms):
    """Σ terms in four interleaved partial sums (a fixed order, shorter dependency chains)."""
    n = terms.shape[0]
    a0 = 0.0
    a1 = 0.0
    a2 = 0.0
    a3 = 0.0
    m = n - n % 4
    for i in range(0, m, 4):
        a0 += terms[i]
        a1 += terms[i + 1]
        a2 += terms[i + 2]
        a3 += terms[i + 3]
    for i in range(m, n):
        a0 += terms[i]
    return (a0 + a1) + (a2 + a3)


@jit
def _dw_sum(hs, hk, half_asr, x, w):
    """The Gauss–Legendre sum of the angle integral over its 2·len(x) nodes.

    The nodes are evaluated by loops of arithmetic only (:func:`._math.sin_small`,
    :func:`._math.exp`), which LLVM vectorises; the exponent is ≤ 0.
    """
    n = x.shape[0]
    terms = np.empty(2 * n)
    _dw_terms(hs, hk, half_asr, x, w, 1.0, terms[:n])
    _dw_terms(hs, hk, half_asr, x, w, -1.0, terms[n:])
    return _sum_terms(terms)


@jit
def _dw_terms(hs, hk, half_asr, x, w, sign, out):
    """``out[i]`` = the angle integrand at node ``half_asr (1 + sign x_i)``, weighted."""
    for i in range(x.shape[0]):
        sn = _sin_small(half_asr * (1.0 + sign * x[i]))
        out[i] = w[i] * _exp((sn * hk - hs) / ((1.0 - sn) * (1.0 + sn)))


@jit
def _dw_integral(h, k, rho):
    """(1/2π)∫_0^{asin ρ} exp(-(h²+k²-2hk sinθ)/(2cos²θ)) dθ = Φ2(h,k;ρ) - Φ(h)Φ(k).

    Even in (h, k) jointly and odd in (k, ρ) jointly: the four copula cells share it.
    """
    hs = 0.5 * (h * h + k * k)
    hk = h * k
    asr = math.asin(rho)
    half_asr = 0.5 * asr
    n = _dw_points(rho, hs)
    if n == 6:
        total = _dw_sum(hs, hk, half_asr, _GL6_X, _GL6_W)
    elif n == 12:
        total = _dw_sum(hs, hk, half_asr, _GL12_X, _GL12_W)
    elif n == 20:
        total = _dw_sum(hs, hk, half_asr, _GL20_X, _GL20_W)
    else:
        total = _dw_sum(hs, hk, half_asr, _GL32_X, _GL32_W)
    return total * asr / (4.0 * math.pi)


@jit
def _mills(z):
    """Mills ratio Φ(-z)/φ(z) for z ≥ 0 (continued fraction for large z)."""
    if z < 8.0:
        return _SQRT_2PI * norm_cdf(-z) * math.exp(0.5 * z * z)
    # Laplace's continued fraction z/(z² + 1/(1 + 2/(z² + 3/(1 + ...)))) in the
    # form 1/(z + 1/(z + 2/(z + 3/(z + ...)))), evaluated backwards.
    tail = 0.0
    for j in range(60, 0, -1):
        tail = j / (z + tail)
    return 1.0 / (z + tail)


@jit
def _laguerre_ok(h, k, r):
    """Whether I₊(h, k, r) can be done by Gauss–Laguerre (see the module notes)."""
    if r <= 0.0:
        return False
    s2 = (h - k) * (h - k)
    a2 = (1.0 - r) * (1.0 + r)
    if s2 * r * r < 2.0 * _LAGUERRE_MIN_D * a2:
        return False
    kappa = h * k * a2 * a2 / (s2 * r * (1.0 + r) * (1.0 + r))
    return kappa <= _LAGUERRE_MAX_KAPPA


@jit
def _iplus_laguerre(h, k, r):
    """I₊(h, k, r) = ∫_r^1 φ2(h, k; t) dt by 32-point Gauss–Laguerre, 0 < r < 1.

    With ``a² = 1-r²``, ``z² = (h-k)²/a²`` and ``x = a(1 + 2t/z²)^{-1/2}`` in the
    x-integral of the module notes, ``I₊ = φ2(h,k;r) a⁴/((h-k)² r) ∫_0^∞ e^{-t} F(t) dt``
    with ``F(t) = y³ (r/ρ_y) exp(hk (1/(1+r) - 1/(1+ρ_y)))``, ``y² = 1/(1+2t/z²)``,
    ``ρ_y = √(1 - a²y²)``; ``F(0) = 1``.
    """
    a2 = (1.0 - r) * (1.0 + r)
    s2 = (h - k) * (h - k)
    hk = h * k
    z2 = s2 / a2
    quad = s2 + 2.0 * (1.0 - r) * hk  # = h² - 2rhk + k²
    n = _LAG_T.shape[0]
    terms = np.empty(n)
    for i in range(n):  # vectorised (arithmetic, sqrt and ._math.exp only)
        u = 2.0 * _LAG_T[i] / z2
        y2 = 1.0 / (1.0 + u)
        ry = math.sqrt((r * r + u) * y2)
        expo = hk * a2 * u * y2 / ((ry + r) * (1.0 + r) * (1.0 + ry))
        terms[i] = _LAG_W[i] * y2 * math.sqrt(y2) * (r / ry) * _exp(expo)
    total = _sum_terms(terms)
    return math.exp(-0.5 * quad / a2) * a2 * math.sqrt(a2) / (_TWO_PI * s2 * r) * total


@jit
def _series_remainder(s2, hk, c, d, half_a, x, w):
    """Σ_i w_i e^{-(s²/x_i² + hk)/2} (smooth factor - its Taylor part) over [0, a]."""
    n = x.shape[0]
    terms = np.empty(2 * n)
    _series_terms(s2, hk, c, d, half_a, x, w, -1.0, terms[:n])
    _series_terms(s2, hk, c, d, half_a, x, w, 1.0, terms[n:])
    return _sum_terms(terms)


@jit
def _series_terms(s2, hk, c, d, half_a, x, w, sign, out):
    """``out[i]`` = the remainder's integrand at node ``half_a (1 + sign x_i)``, weighted
    (a vectorised loop: arithmetic, sqrt, selects and :func:`._math.exp` only)."""
    for i in range(x.shape[0]):
        xi = half_a * (1.0 + sign * x[i])
        xs = xi * xi
        e_i = -0.5 * (s2 / xs + hk)
        rs = math.sqrt((1.0 - xi) * (1.0 + xi))
        ep = _exp(-hk * xs / (2.0 * (1.0 + rs) * (1.0 + rs))) / rs
        sp = 1.0 + c * xs * (1.0 + d * xs)
        t = w[i] * _exp(e_i) * (ep - sp)
        # exp(e_i) < 3.4e-308 below -708: the term is left out (ep may overflow there)
        out[i] = t if e_i >= -708.0 else 0.0


@jit
def _iplus_series(h, k, r):
    """I₊(h, k, r) for r ≥ 0.925 by Genz's expansion (analytic part + GL remainder).

    The smooth factor ``exp(-hk/(1+√(1-x²)))/√(1-x²) = e^{-hk/2}(1 + c x² + c d x⁴ + …)``
    with ``c = (4-hk)/8``, ``d = (12-hk)/16``; ``∫_0^a x^{2j} exp(-s²/(2x²)) dx`` follow
    from ``J_0 = a E - s√(2π)Φ(-s/a)`` and ``J_n = (a^{n+1} E - s² J_{n-2})/(n+1)``,
    ``E = exp(-s²/(2a²))``; the exponentials are merged so nothing overflows. The
    remainder takes Genz's 20 Gauss–Legendre points, or 32 for ``|hk| > 50`` where the
    Taylor part is a poorer fit (deep tails).
    """
    a2 = (1.0 - r) * (1.0 + r)
    a = math.sqrt(a2)
    s2 = (h - k) * (h - k)
    s = math.sqrt(s2)
    hk = h * k
    c = (4.0 - hk) / 8.0
    d = (12.0 - hk) / 16.0
    expo = -0.5 * (s2 / a2 + hk)  # ≤ 0 for a ≤ 1
    total = 0.0
    if expo > -745.0:
        j0 = a - s * _mills(s / a)
        j2 = (a2 * a - s2 * j0) / 3.0
        j4 = (a2 * a2 * a - s2 * j2) / 5.0
        total = math.exp(expo) * (j0 + c * j2 + c * d * j4)
    half_a = 0.5 * a
    if abs(hk) > 50.0:
        rem = _series_remainder(s2, hk, c, d, half_a, _GL32_X, _GL32_W)
    else:
        rem = _series_remainder(s2, hk, c, d, half_a, _GL20_X, _GL20_W)
    return (total + half_a * rem) / _TWO_PI


@jit
def _iplus(h, k, r):
    """I₊(h, k, r) = ∫_r^1 φ2(h, k; t) dt ≥ 0 for 0.925 ≤ r < 1."""
    if _laguerre_ok(h, k, r):
        return _iplus_laguerre(h, k, r)
    return max(_iplus_series(h, k, r), 0.0)


@jit
def _clamp01(x):
    if x < 0.0:
        return 0.0
    if x > 1.0:
        return 1.0
    return x


@jit
def bvn_cdf(h, k, rho):
    """Standard bivariate normal CDF Φ2(h, k; ρ) = P(X < h, Y < k).

    Parameters
    ----------
    h, k : float
        Upper limits; ±inf allowed.
    rho : float
        Correlation, ``-1 < ρ < 1`` (``ρ = ±1`` give the degenerate limits, ``|ρ| > 1``
        NaN).

    Returns
    -------
    float
        In [0, 1]; absolute error of a few 1e-16, relative error ~3e-13 or better for
        ``|h|, |k| ≤ 8`` outside the anticorrelated lower orthant with small ``|ρ|``,
        where it reaches ~1e-9 at ``|h| = |k| = 8`` and ~1e-8 at 10 (module notes).

    Notes
    -----
    MATH.md §2; Genz (2004) with the refinements described in the module docstring.
    ``ρ = 0`` returns ``Φ(h)Φ(k)`` exactly.

    Examples
    --------
    >>> round(bvn_cdf(0.0, 0.0, 0.5), 15)  # 1/4 + asin(ρ)/(2π)
    0.333333333333333
    """
    if math.isnan(h) or math.isnan(k) or math.isnan(rho):
        return np.nan
    if not (rho >= -1.0 and rho <= 1.0):
        return np.nan
    if h <= -_BIG or k <= -_BIG:
        return 0.0
    if h >= _BIG:
        return norm_cdf(k)
    if k >= _BIG:
        return norm_cdf(h)
    if rho == 0.0:
        return norm_cdf(h) * norm_cdf(k)
    if rho == 1.0:
        return norm_cdf(min(h, k))
    if rho == -1.0:
        return _interval_prob(-k, h)
    if abs(rho) < _RHO_GENZ:
        if rho < 0.0 and h + k < 0.0 and _laguerre_ok(-h, k, -rho):
            # both low while anticorrelated: Φ2 = ∫_{-1}^{ρ} φ2 dt, no cancellation
            return _clamp01(_iplus_laguerre(-h, k, -rho))
        return _clamp01(norm_cdf(h) * norm_cdf(k) + _dw_integral(h, k, rho))
    if rho > 0.0:
        return _clamp01(norm_cdf(min(h, k)) - _iplus(-h, -k, rho))
    return _clamp01(_interval_prob(-k, h) + _iplus(-h, k, -rho))


# ---------------------------------------------------------------------------------------
# Copula cells
# ---------------------------------------------------------------------------------------

@jit
def _cdf_pair(x):
    """``(Φ(x), Φ(-x))`` from one ``erfc``: the smaller from its tail, the larger (≥ 1/2)
    as 1 minus it, both with full relative precision."""
    if x >= 0.0:
        lo = norm_cdf(-x)
        return 1.0 - lo, lo
    lo = norm_cdf(x)
    return lo, 1.0 - lo


@jit
def _interval_from(lo, hi, cdf_lo, cdf_hi, sf_lo, sf_hi):
    """P(lo < Z < hi) as :func:`_interval_prob`, from the given ``Φ(lo)``, ``Φ(hi)``,
    ``Φ(-lo)``, ``Φ(-hi)``; 0 if hi ≤ lo."""
    if hi <= lo:
        return 0.0
    if hi <= 0.0:
        return cdf_hi - cdf_lo
    if lo >= 0.0:
        return sf_lo - sf_hi
    return 1.0 - cdf_lo - sf_hi


@jit
def _cells_from_thresholds(h1, h2, t1, t2, rho, q):
    """q = [q00, q01, q10, q11] of MATH.md §2 from thresholds h1 = h_{t-1}, h2 = h_t and
    the marginals t1 = θ_{t-1} = Φ(-h1), t2 = θ_t = Φ(-h2).

    Each cell is the Φ2 of its own arguments (same branches as ``bvn_cdf``); the
    integral term is shared between cells where it is the same number. Beside Genz's
    expansion (``|ρ| ≥ 0.925``) the univariate probabilities are the marginals
    themselves, ``Φ(-h) = θ`` and ``Φ(h) = 1 - θ`` (each with full relative precision:
    ``1 - θ`` is exact for ``θ ≥ 1/2`` and within half an ulp of a number ≥ 1/2
    otherwise). Beside the angle integral ``I(h1, h2)`` (``|ρ| < 0.925``) they are
    ``Φ(±h)`` at the same rounded thresholds as ``I`` (:func:`_cdf_pair`, one ``erfc``
    each): where ``θ1θ2`` and ``I`` nearly cancel, the rounding of ``h`` then moves
    both alike and cancels too (with θ itself the cells near the Gauss–Laguerre switch
    lost about half a digit: 3.1e-11 against 1.8e-11 relative).
    """
    p1 = 1.0 - t1     # Φ(h1)
    m1 = t1           # Φ(-h1)
    p2 = 1.0 - t2
    m2 = t2
    if rho == 0.0:
        q[0] = p1 * p2
        q[1] = p1 * m2
        q[2] = m1 * p2
        q[3] = m1 * m2
        return
    if abs(rho) < _RHO_GENZ:
        # Φ(±h) at the thresholds I is evaluated at (see above)
        p1, m1 = _cdf_pair(h1)
        p2, m2 = _cdf_pair(h2)
        # q00, q11 carry +I and q01, q10 carry -I (I odd in (k, ρ), even in (h, k)).
        integral = _dw_integral(h1, h2, rho)
        q[0] = p1 * p2 + integral
        q[1] = p1 * m2 - integral
        q[2] = m1 * p2 - integral
        q[3] = m1 * m2 + integral
        # The cell of two anticorrelated low values, directly (see bvn_cdf).
        if rho > 0.0:
            if h1 != h2 and _laguerre_ok(h1, h2, rho):
                tail = _iplus_laguerre(h1, h2, rho)
                if h1 < h2:
                    q[1] = tail   # Φ2(h1, -h2; -ρ), h1 - h2 < 0
                else:
                    q[2] = tail   # Φ2(-h1, h2; -ρ), h2 - h1 < 0
        else:
            if h1 + h2 != 0.0 and _laguerre_ok(-h1, h2, -rho):
                tail = _iplus_laguerre(-h1, h2, -rho)
                if h1 + h2 < 0.0:
                    q[0] = tail   # Φ2(h1, h2; ρ)
                else:
                    q[3] = tail   # Φ2(-h1, -h2; ρ)
    elif rho > 0.0:
        j = _iplus(h1, h2, rho)
        q[0] = min(p1, p2) - j    # Φ(min(h1, h2))
        q[1] = _interval_from(h2, h1, p2, p1, m2, m1) + j
        q[2] = _interval_from(h1, h2, p1, p2, m1, m2) + j
        q[3] = min(m1, m2) - j    # Φ(-max(h1, h2))
    else:
        j = _iplus(h1, -h2, -rho)
        q[0] = _interval_from(-h2, h1, m2, p1, p2, m1) + j
        q[1] = min(p1, m2) - j    # Φ(min(h1, -h2))
        q[2] = min(m1, p2) - j    # Φ(min(-h1, h2))
        q[3] = _interval_from(h2, -h1, p2, m1, m2, p1) + j
    for i in range(4):
        q[i] = _clamp01(q[i])


@jit
def copula_cells_value(theta_prev, theta, rho, q):
    """The four cells of the bivariate Gaussian copula, without derivatives.

    Parameters
    ----------
    theta_prev : float
        ``θ_{t-1} = q(s_{t-1} = 1)``, assumed already in (0, 1) (see ``clip_theta``).
    theta : float
        ``θ_t = q(s_t = 1)``, assumed in (0, 1).
    rho : float
        Copula correlation ``ρ_t``, assumed ``|ρ| < 1`` (see ``clip_rho``).
    q : ndarray, shape (4,), float64
        Output ``[q00, q01, q10, q11]``, ``q_ij = q(s_{t-1} = i, s_t = j)``.

    Notes
    -----
    MATH.md §2: with ``h = Φ⁻¹(1-θ)`` (computed as ``-norm_ppf(θ)``),
    ``q00 = Φ2(h1, h2; ρ)``, ``q01 = Φ2(h1, -h2; -ρ)``, ``q10 = Φ2(-h1, h2; -ρ)``,
    ``q11 = Φ2(-h1, -h2; ρ)``, each evaluated directly, never as a difference of cells,
    so small cells keep their relative precision. The cells are in [0, 1] and satisfy
    ``q10 + q11 = θ_{t-1}``, ``q01 + q11 = θ_t`` to ~1e-16.

    Examples
    --------
    >>> q = np.empty(4)
    >>> copula_cells_value(0.5, 0.5, 0.0, q)
    >>> q.tolist()
    [0.25, 0.25, 0.25, 0.25]
    """
    h1 = -norm_ppf(theta_prev)
    h2 = -norm_ppf(theta)
    _cells_from_thresholds(h1, h2, theta_prev, theta, rho, q)


@jit
def _phi_pair(h1, h2, rho, r):
    """(h2 - ρ h1)/r, written to keep its precision when h1 ≈ ±h2 and |ρ| → 1."""
    if rho >= 0.0:
        return ((h2 - h1) + (1.0 - rho) * h1) / r
    return ((h2 + h1) - (1.0 + rho) * h1) / r


@jit
def copula_cells(theta_prev, theta, rho, q, dq):
    """The four copula cells and their derivatives with respect to θ_{t-1}, θ_t and ρ.

    Parameters
    ----------
    theta_prev : float
        ``θ_{t-1}``, assumed already in (0, 1) (see ``clip_theta``).
    theta : float
        ``θ_t``, assumed in (0, 1).
    rho : float
        ``ρ_t``, assumed ``|ρ| < 1`` (see ``clip_rho``).
    q : ndarray, shape (4,), float64
        Output ``[q00, q01, q10, q11]`` (first index ``s_{t-1}``, second ``s_t``).
    dq : ndarray, shape (4, 3), float64
        Output ``dq[i, 0] = ∂q_i/∂θ_{t-1}``, ``dq[i, 1] = ∂q_i/∂θ_t``,
        ``dq[i, 2] = ∂q_i/∂ρ``.

    Notes
    -----
    MATH.md §2. With ``r = √(1-ρ²)``, ``A = (h2 - ρh1)/r``, ``B = (h1 - ρh2)/r``:
    ``∂q00 = (-Φ(A), -Φ(B), φ2)``, ``∂q01 = (-Φ(-A), Φ(B), -φ2)``,
    ``∂q10 = (Φ(A), -Φ(-B), -φ2)``, ``∂q11 = (Φ(-A), Φ(-B), φ2)``, with
    ``φ2 = φ2(h1, h2; ρ)``; each keeps its relative precision (the smaller of
    ``Φ(±A)`` from its tail, the larger, ≥ 1/2, as 1 minus it), and they satisfy the margin identities' derivatives exactly in exact
    arithmetic. These are derivatives of the unclipped cells: chain with
    ``clip_theta_deriv`` / ``clip_rho_deriv``.

    Examples
    --------
    >>> q, dq = np.empty(4), np.empty((4, 3))
    >>> copula_cells(0.5, 0.5, 0.0, q, dq)
    >>> dq[0].round(6).tolist()  # -Φ(0), -Φ(0), φ2(0, 0; 0)
    [-0.5, -0.5, 0.159155]
    """
    copula_cells_h(theta_prev, theta, -norm_ppf(theta_prev), -norm_ppf(theta), rho, q, dq)


@jit
def copula_cells_h(theta_prev, theta, h_prev, h, rho, q, dq):
    """:func:`copula_cells` given the thresholds as well (the ELBO computes each row's
    ``h = -norm_ppf(θ)`` once for the two cells it enters).

    Parameters
    ----------
    theta_prev, theta, rho, q, dq
        As in :func:`copula_cells`.
    h_prev, h : float
        ``Φ⁻¹(1 - θ_{t-1})`` and ``Φ⁻¹(1 - θ_t)``, i.e. ``-norm_ppf(theta_prev)`` and
        ``-norm_ppf(theta)``.

    Notes
    -----
    MATH.md §2; see :func:`copula_cells`.
    """
    h1 = h_prev
    h2 = h
    _cells_from_thresholds(h1, h2, theta_prev, theta, rho, q)
    r = math.sqrt((1.0 - rho) * (1.0 + rho))
    a = _phi_pair(h1, h2, rho, r)
    b = _phi_pair(h2, h1, rho, r)
    pa, ma = _cdf_pair(a)
    pb, mb = _cdf_pair(b)
    dens = bvn_pdf(h1, h2, rho)
    dq[0, 0] = -pa
    dq[0, 1] = -pb
    dq[0, 2] = dens
    dq[1, 0] = -ma
    dq[1, 1] = pb
    dq[1, 2] = -dens
    dq[2, 0] = pa
    dq[2, 1] = -mb
    dq[2, 2] = -dens
    dq[3, 0] = ma
    dq[3, 1] = mb
    dq[3, 2] = dens


# ---------------------------------------------------------------------------------------
# Clipping of the recognition-network heads
# ---------------------------------------------------------------------------------------

@jit
def _sigmoid(a):
    if a >= 0.0:
        return 1.0 / (1.0 + math.exp(-a))
    e = math.exp(a)
    return e / (1.0 + e)


@jit(inline="always")
def clip_theta(a):
    """θ = ε + (1 - 2ε) σ(a), ε = ``EPS_THETA``: a logit mapped into [ε, 1 - ε].

    Parameters
    ----------
    a : float
        Unconstrained head output.

    Returns
    -------
    float

    Notes
    -----
    MATH.md §2 (clipping) and §3 (θ head). For ``a ≥ 0`` it is evaluated as
    ``1 - (ε + (1 - 2ε) σ(-a))``, so that ``clip_theta(-a) = 1 - clip_theta(a)`` and the
    result never rounds above ``1 - ε``. σ and tanh come from :mod:`._math` (arithmetic
    only, relative error ≤ 5e-16), so that the recognition networks' head loops, which
    call these, vectorise.

    Examples
    --------
    >>> clip_theta(0.0)
    0.5
    """
    v = EPS_THETA + (1.0 - 2.0 * EPS_THETA) * _fast_sigmoid(-abs(a))
    return 1.0 - v if a >= 0.0 else v


@jit
def clip_theta_deriv(a):
    """dθ/da = (1 - 2ε) σ(a)(1 - σ(a)) for ``clip_theta``.

    Parameters
    ----------
    a : float

    Returns
    -------
    float

    Notes
    -----
    MATH.md §3. ``σ(a)(1-σ(a)) = σ(|a|)σ(-|a|)`` keeps relative precision for large
    ``|a|``.

    Examples
    --------
    >>> round(clip_theta_deriv(0.0), 9)
    0.2499995
    """
    x = abs(a)
    return (1.0 - 2.0 * EPS_THETA) * _sigmoid(x) * _sigmoid(-x)


@jit(inline="always")
def clip_rho(b):
    """ρ = (1 - ε_ρ) tanh(b), ε_ρ = ``EPS_RHO``: a real mapped into (-1, 1).

    Parameters
    ----------
    b : float
        Unconstrained head output.

    Returns
    -------
    float

    Notes
    -----
    MATH.md §2 (clipping) and §3 (ρ head).

    Examples
    --------
    >>> clip_rho(0.0)
    0.0
    """
    return (1.0 - EPS_RHO) * _fast_tanh(b)


@jit
def clip_rho_deriv(b):
    """dρ/db = (1 - ε_ρ)(1 - tanh²b) for ``clip_rho``.

    Parameters
    ----------
    b : float

    Returns
    -------
    float

    Notes
    -----
    MATH.md §3. Evaluated as ``1/cosh²b``, which keeps relative precision for large
    ``|b|``.

    Examples
    --------
    >>> clip_rho_deriv(0.0)
    0.999999
    """
    x = abs(b)
    if x > 354.0:
        return 0.0
    c = math.cosh(x)
    return (1.0 - EPS_RHO) / (c * c)


# ---------------------------------------------------------------------------------------
# Loops over arrays (tests, benchmarks)
# ---------------------------------------------------------------------------------------

@jit
def bvn_cdf_array(h, k, rho, out):
    """``out[i] = bvn_cdf(h[i], k[i], rho[i])``.

    Parameters
    ----------
    h, k, rho : ndarray, shape (n,), float64
    out : ndarray, shape (n,), float64
        Output.

    Notes
    -----
    MATH.md §2.
    """
    for i in range(h.shape[0]):
        out[i] = bvn_cdf(h[i], k[i], rho[i])


@jit
def norm_ppf_array(p, out):
    """``out[i] = norm_ppf(p[i])``.

    Parameters
    ----------
    p : ndarray, shape (n,), float64
    out : ndarray, shape (n,), float64
        Output.

    Notes
    -----
    MATH.md §2.
    """
    for i in range(p.shape[0]):
        out[i] = norm_ppf(p[i])


@jit
def copula_cells_array(theta_prev, theta, rho, q, dq):
    """``copula_cells`` over arrays.

    Parameters
    ----------
    theta_prev, theta, rho : ndarray, shape (n,), float64
        Already clipped (see ``copula_cells``).
    q : ndarray, shape (n, 4), float64
        Output cells ``[q00, q01, q10, q11]``.
    dq : ndarray, shape (n, 4, 3), float64
        Output derivatives with respect to ``(θ_{t-1}, θ_t, ρ)``.

    Notes
    -----
    MATH.md §2.
    """
    for i in range(theta.shape[0]):
        copula_cells(theta_prev[i], theta[i], rho[i], q[i], dq[i])


@jit
def copula_cells_value_array(theta_prev, theta, rho, q):
    """``copula_cells_value`` over arrays.

    Parameters
    ----------
    theta_prev, theta, rho : ndarray, shape (n,), float64
        Already clipped (see ``copula_cells``).
    q : ndarray, shape (n, 4), float64
        Output cells ``[q00, q01, q10, q11]``.

    Notes
    -----
    MATH.md §2.
    """
    for i in range(theta.shape[0]):
        copula_cells_value(theta_prev[i], theta[i], rho[i], q[i])
