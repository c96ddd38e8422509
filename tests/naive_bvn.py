"""Slow, direct references for streamfhmm.kernels.bvn (no import of that module).

* ``bvn_cdf_quad``: Φ2(h, k; ρ) = ∫_{-∞}^{h} φ(x) Φ((k - ρx)/√(1-ρ²)) dx by
  ``scipy.integrate.quad`` at tight tolerance, in float64 (absolute reference).
* ``bvn_cdf_mp``: the same integral in mpmath at 30 significant digits, with the
  interval cut around the mode of the (log-concave) integrand so that sharply peaked
  integrands (tails, |ρ| → 1) are resolved: a reference *relative* to the value.
* ``copula_cells_mp``: the four cells of MATH.md §2, each from ``bvn_cdf_mp``.
"""
import math

import mpmath as mp
import numpy as np
from scipy import integrate, special

DPS = 30


def bvn_cdf_quad(h, k, rho):
    """Φ2(h, k; ρ) by adaptive quadrature in float64 (absolute error ~1e-15)."""
    if rho == 0.0:
        return float(special.ndtr(h) * special.ndtr(k))
    r = math.sqrt((1.0 - rho) * (1.0 + rho))

    def f(x):
        return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * special.ndtr((k - rho * x) / r)

    # the integrand lives within a few units of 0 and has a kink of width r at x = k/ρ
    lo = min(h, -40.0)
    pts = sorted(p for p in {k / rho - r, k / rho, k / rho + r, -1.0, 0.0, 1.0} if lo < p < h)
    edges = [lo] + pts + [h]
    total = 0.0
    for a, b in zip(edges[:-1], edges[1:]):
        val, _ = integrate.quad(f, a, b, epsabs=1e-16, epsrel=1e-13, limit=500)
        total += val
    return total


def _log_integrand_slope(x, h, k, rho, r):
    """d/dx log[φ(x) Φ((k - ρx)/r)]."""
    u = (k - rho * x) / r
    return -x - (rho / r) * mp.npdf(u) / mp.ncdf(u)


def bvn_cdf_mp(h, k, rho, dps=DPS):
    """Φ2(h, k; ρ) to ~``dps`` significant digits (mpmath), for finite h, k, |ρ| < 1.

    The integrand ``φ(x) Φ((k - ρx)/r)`` is log-concave, so it has a single mode
    ``x*`` in (-∞, h]; the integration interval is cut at ``x* ± σ·2^j`` (σ the local
    width from the curvature) or, when the mode is the end point, at ``h - σ·2^j`` (σ
    the decay length there), and at ``k/ρ ± r·2^j``, where the factor Φ switches over a
    width ``r = √(1-ρ²)``; this lets tanh-sinh quadrature resolve any peak or step.
    The integrand is divided by its value at the mode because mpmath's error control
    is absolute.
    """
    with mp.workdps(dps):
        h, k, rho = mp.mpf(h), mp.mpf(k), mp.mpf(rho)
        if rho == 0:
            return mp.ncdf(h) * mp.ncdf(k)
        r = mp.sqrt((1 - rho) * (1 + rho))
        c_pdf = 1 / mp.sqrt(2 * mp.pi)
        c_arg = 1 / (r * mp.sqrt(2))

        def f(x):  # φ(x) Φ((k - ρx)/r)
            return c_pdf * mp.exp(-x * x / 2) * mp.erfc((rho * x - k) * c_arg) / 2

        def slope(x):
            return _log_integrand_slope(x, h, k, rho, r)

        g_end = slope(h)
        if g_end >= 0:
            # increasing up to h: exponential decay away from the end point
            width = 1 / max(g_end, mp.mpf(1) / 8)
            mode = h
        else:
            # interior mode: bisection on the (decreasing) slope
            lo = h - 1
            while slope(lo) < 0:
                lo = h - 2 * (h - lo)
            hi = h
            for _ in range(200):
                mid = (lo + hi) / 2
                if slope(mid) > 0:
                    lo = mid
                else:
                    hi = mid
                if hi - lo < mp.mpf(10) ** (-dps // 2):
                    break
            mode = (lo + hi) / 2
            eps = mp.mpf(10) ** (-dps // 3)
            curv = -(slope(mode + eps) - slope(mode - eps)) / (2 * eps)
            width = 1 / mp.sqrt(max(curv, mp.mpf(10) ** (-6)))
        if mode == h:
            pts = {h - width * mp.mpf(2) ** j for j in range(-4, 8)}
        else:
            pts = {mode}
            for j in range(-1, 6):
                pts.add(mode - width * mp.mpf(2) ** j)
                pts.add(mode + width * mp.mpf(2) ** j)
        # Φ((k - ρx)/r) falls from 1 to 0 (or rises) over a width r around x = k/ρ:
        # a shoulder that the mode does not announce when r is small
        kink = k / rho
        pts.add(kink)
        for j in range(-2, 7):
            pts.add(kink - r * mp.mpf(2) ** j)
            pts.add(kink + r * mp.mpf(2) ** j)
        inner = sorted(p for p in pts if p < h)
        # mpmath's convergence test is absolute: integrate f / f(mode), which is O(1)
        scale = f(mode)
        if scale == 0:
            return mp.mpf(0)
        return scale * mp.quad(lambda x: f(x) / scale, [-mp.inf] + inner + [h])


def norm_ppf_mp(p, dps=DPS):
    """Φ⁻¹(p) in mpmath (p taken as the exact binary value given), 0 < p < 1."""
    extra = int(-math.log10(min(p, 1.0 - p))) + 5  # 2p - 1 must not round to ±1
    with mp.workdps(dps + extra):
        return mp.sqrt(2) * mp.erfinv(2 * mp.mpf(p) - 1)


def copula_cells_mp(theta_prev, theta, rho, dps=DPS):
    """[q00, q01, q10, q11] of MATH.md §2, each from ``bvn_cdf_mp`` (mpf values).

    ``h = Φ⁻¹(1 - θ)`` is computed in mpmath from the exact binary θ.
    """
    with mp.workdps(dps + 10):
        h1 = -norm_ppf_mp(theta_prev, dps + 10)
        h2 = -norm_ppf_mp(theta, dps + 10)
        return [bvn_cdf_mp(h1, h2, rho, dps), bvn_cdf_mp(h1, -h2, -rho, dps),
                bvn_cdf_mp(-h1, h2, -rho, dps), bvn_cdf_mp(-h1, -h2, rho, dps)]


def copula_cells_scipy(theta_prev, theta, rho):
    """The cells from scipy's bivariate normal CDF (absolute accuracy only)."""
    from scipy.stats import multivariate_normal

    h1 = -special.ndtri(theta_prev)
    h2 = -special.ndtri(theta)

    def cdf(a, b, c):
        return multivariate_normal.cdf([a, b], mean=[0.0, 0.0], cov=[[1.0, c], [c, 1.0]],
                                       abseps=1e-15, releps=1e-15)

    return np.array([cdf(h1, h2, rho), cdf(h1, -h2, -rho), cdf(-h1, h2, -rho),
                     cdf(-h1, -h2, rho)])
