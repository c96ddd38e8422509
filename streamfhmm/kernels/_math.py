"""Elementary functions written so that LLVM can vectorise the loops calling them.

A call to libm (``math.exp``, ``math.tanh``) inside a loop keeps the loop scalar: the
llvmlite wheels ship no vector math library. The functions here use only ``+ - * /``,
fused multiply-adds, comparisons, selects, ``abs`` and ``copysign`` (LLVM intrinsics),
plus one bit cast between float64 and int64, so a loop of them compiles to AVX2 code
(4 lanes) where the processor has it.

``tanh`` (absolute error ≤ 2.3e-16, relative ≤ 5e-16 against the exact value, NaN
propagated, ``tanh(±inf) = ±1``, ``tanh(±0) = ±0``) is what the hidden layers and the ρ
heads of the recognition networks use, ``sigmoid`` the θ heads (MATH.md §3). ``exp`` and
``sin_small`` are the integrands' functions of the bivariate normal quadratures
(:mod:`.bvn`), whose nodes are evaluated as one vectorised loop. Without
``error_model="numpy"`` (the package default, :mod:`._jit`) a division checks for a zero
divisor and the loop stays scalar.
"""
import math

import numpy as np
from llvmlite import ir  # numba's code generator: the IR of the intrinsics below
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._jit import jit

__all__ = ["exp", "sin_small", "tanh", "sigmoid", "tanh_inplace", "tanh_bias_inplace"]


@intrinsic
def _bitcast(typingctx, x, to):
    """The 64-bit scalar ``x`` reinterpreted as type ``to`` (``np.int64`` or
    ``np.float64``): its IEEE-754 bit pattern, no conversion."""
    target = to.instance_type
    sig = target(x, to)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(target))
    return sig, codegen


@intrinsic
def _fmadd(typingctx, a, b, c):
    """``a * b + c``, fused into one FMA instruction where the processor has one (LLVM's
    ``fmuladd``: one rounding instead of two, never a library call; it vectorises)."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        double = ir.DoubleType()
        fn = cgutils.get_or_insert_function(builder.module,
                                            ir.FunctionType(double, [double] * 3),
                                            "llvm.fmuladd.f64")
        return builder.call(fn, args)
    return sig, codegen


# round-to-nearest-integer by adding and subtracting 1.5 * 2**52 (exact for |v| < 2**51);
# the integer then also sits in the low bits of the sum's bit pattern
_ROUND = 6755399441055744.0
_LOG2E = 1.4426950408889634
# ln 2 split for Cody–Waite reduction (fdlibm): n * _LN2_HI is exact for |n| < 2**20
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
# fdlibm's exp: exp(r) = 1 + 2r / (2 - c), c = r - r² P(r²), |r| <= ln2/2, error < 2**-59
_P1 = 1.66666666666666019037e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08
# tanh(x) rounds to 1 for x >= 19.06 (1 - tanh x = 2e^{-2x} < 2**-54): clamp there
_TANH_CLAMP = 19.1
# above it tanh = 1 - q is formed from q = 1 - tanh (tanh(0.55) = 0.50)
_TANH_NEAR_ONE = 0.55
# sigmoid's argument is clamped at ±708 so that 2**n stays a normal number; σ(x < -708) = 0
_SIGMOID_CLAMP = 708.0
# exp's range: below it 0 (exp(-708) = 3.3e-308), above it +inf (2**n must stay finite)
_EXP_LO = -708.0
_EXP_HI = 709.0
# sin's Taylor coefficients (-1)^j / (2j+1)!, j = 1..11 (the remainder at |x| = 1.2 is
# below 1.2^25/25! = 6e-24)
_SIN_C = tuple((-1.0) ** j / math.factorial(2 * j + 1) for j in range(1, 12))


@jit(inline="always")
def _exp_parts(y):
    """``exp(y) = s (d + 2r) / d`` for ``-1022 ln2 < y <= 709``, returned as ``(s, d, r)``.

    ``y = n ln2 + r`` (Cody–Waite, ``|r| ≤ ln2/2``), ``s = 2**n`` built from its bit
    pattern, and fdlibm's ``exp(r) = 1 + 2r / (2 - c)``, ``c = r - r² P(r²)`` (error
    < 2**-59), ``d = 2 - c``. The callers fold the quotient into their own single
    division. Products and sums are fused (:func:`_fmadd`) where the processor has FMA
    and the compiler chooses to, so the last bit may differ between machines and between
    call sites (never the error bounds).
    """
    t = _fmadd(y, _LOG2E, _ROUND)
    n = t - _ROUND
    r = _fmadd(n, -_LN2_LO, _fmadd(n, -_LN2_HI, y))
    r2 = r * r
    r4 = r2 * r2
    # Estrin's scheme: a shorter dependency chain than Horner's
    p = _fmadd(r4, _fmadd(r2, _P4, _P3), _fmadd(r2, _P2, _P1)) + r4 * r4 * _P5
    c = _fmadd(-r2, p, r)
    # 2**n: the low bits of t hold n (two's complement); the shift drops all the rest
    s = _bitcast((_bitcast(t, np.int64) + 1023) << 52, np.float64)
    return s, 2.0 - c, r


@jit(inline="always")
def exp(y):
    """``exp(y)`` from arithmetic only, so that a loop of it vectorises.

    Parameters
    ----------
    y : float

    Returns
    -------
    float
        Relative error ≤ 2.5e-16 for ``-708 ≤ y ≤ 709``; 0 below -708 (the exact value
        is < 3.4e-308 there) and +inf above 709 (an overflow from 709.78, a value above
        8.2e307 between); NaN gives NaN.

    Notes
    -----
    MATH.md §2 (the integrands of Φ2). ``exp(y) = s (d + 2r) / d`` (:func:`_exp_parts`,
    whose reduction holds for ``|y| ≤ 709``) on ``y`` clamped into that range, the
    out-of-range values selected afterwards: no branch.
    """
    u = _EXP_LO if y < _EXP_LO else (_EXP_HI if y > _EXP_HI else y)
    s, d, r = _exp_parts(u)
    v = s * _fmadd(2.0, r, d) / d
    v = 0.0 if y < _EXP_LO else v
    # NaN fails both comparisons, so u and v are NaN
    return math.inf if y > _EXP_HI else v


@jit(inline="always")
def sin_small(x):
    """``sin(x)`` for ``|x| ≤ 1.2`` from arithmetic only (vectorises).

    Parameters
    ----------
    x : float
        ``|x| ≤ 1.2`` (the angles of the Drezner–Wesolowsky integral, ``|asin ρ| <
        1.19`` for ``|ρ| < 0.925``); outside that range the result is not ``sin x``.

    Returns
    -------
    float
        Relative error ≤ 2.5e-16 on ``|x| ≤ 1.2``; odd, ``sin_small(±0) = ±0``.

    Notes
    -----
    MATH.md §2. The Taylor polynomial to degree 23, ``x + x³ P(x²)`` by Horner's rule
    with fused multiply-adds on ``|x|``, the sign from ``copysign``; no range reduction.
    """
    ax = abs(x)
    x2 = ax * ax
    c = _SIN_C
    p = _fmadd(c[10], x2, c[9])
    p = _fmadd(p, x2, c[8])
    p = _fmadd(p, x2, c[7])
    p = _fmadd(p, x2, c[6])
    p = _fmadd(p, x2, c[5])
    p = _fmadd(p, x2, c[4])
    p = _fmadd(p, x2, c[3])
    p = _fmadd(p, x2, c[2])
    p = _fmadd(p, x2, c[1])
    p = _fmadd(p, x2, c[0])
    return math.copysign(_fmadd(ax * x2, p, ax), x)


@jit(inline="always")
def tanh(x):
    """tanh(x) from arithmetic only, so that a loop of it vectorises.

    Parameters
    ----------
    x : float

    Returns
    -------
    float
        Absolute error ≤ 2.3e-16 and relative error ≤ 5e-16 against the exact value;
        ``tanh(±0) = ±0``, ``tanh(±inf) = ±1``, NaN gives NaN.

    Notes
    -----
    MATH.md §3 (the hidden layers). With ``u = min(|x|, 19.1)`` and
    ``e = exp(-2u) = s (d + 2r) / d`` (:func:`_exp_parts`),

    ``tanh u = (1 - e)/(1 + e) = (d (1 - s) - 2rs) / B``, ``B = d (1 + s) + 2rs``,

    which has no cancellation for small u (``s = 1``: the numerator is ``-2r = 4u``); for
    ``u > 0.55`` it is evaluated as ``1 - 2s (d + 2r) / B``. One division, no branch (both
    forms are computed and one is selected), the sign from ``copysign``.
    """
    ax = abs(x)
    # NaN fails the comparison and stays NaN all the way through
    u = _TANH_CLAMP if ax > _TANH_CLAMP else ax
    s, d, r = _exp_parts(-2.0 * u)
    rs2 = 2.0 * r * s
    den = _fmadd(d, 1.0 + s, rs2)
    near_one = u > _TANH_NEAR_ONE
    num = 2.0 * s * _fmadd(2.0, r, d) if near_one else _fmadd(d, 1.0 - s, -rs2)
    q = num / den
    return math.copysign(1.0 - q if near_one else q, x)


@jit(inline="always")
def sigmoid(x):
    """The logistic function ``1 / (1 + exp(-x))`` from arithmetic only (vectorises).

    Parameters
    ----------
    x : float

    Returns
    -------
    float
        Relative error ≤ 5e-16 in both tails for ``|x| ≤ 708``; 0 below -708 and 1
        above 708 (absolute error < 3.4e-308), NaN gives NaN.

    Notes
    -----
    MATH.md §2–3 (the θ heads). With ``e = exp(-|x|) = s (d + 2r) / d``
    (:func:`_exp_parts`): ``σ(-|x|) = s (d + 2r) / (d + s (d + 2r))`` and
    ``σ(|x|) = d / (d + s (d + 2r))``: one division, no branch.
    """
    ax = abs(x)
    u = _SIGMOID_CLAMP if ax > _SIGMOID_CLAMP else ax
    s, d, r = _exp_parts(-u)
    se = s * _fmadd(2.0, r, d)
    # NaN: x >= 0 is false and se is NaN
    num = d if x >= 0.0 else (se if ax <= _SIGMOID_CLAMP else 0.0)
    return num / (d + se)


@jit
def tanh_inplace(a):
    """``a[:] = tanh(a)`` for a 1-D array (vectorised).

    Parameters
    ----------
    a : ndarray, shape (n,)
        Overwritten.

    Notes
    -----
    MATH.md §3; see :func:`tanh`.
    """
    for i in range(a.shape[0]):
        a[i] = tanh(a[i])


@jit
def tanh_bias_inplace(a, bias):
    """``a[i, j] = tanh(a[i, j] + bias[j])`` over a 2-D block (the hidden layer).

    Parameters
    ----------
    a : ndarray, shape (n, H), C-contiguous
        Pre-activations without their bias; overwritten with the activations.
    bias : ndarray, shape (H,)

    Notes
    -----
    MATH.md §3: ``z = tanh(U x + c)`` with ``a = X Uᵀ`` and ``bias = c``; see :func:`tanh`.

    Examples
    --------
    >>> a = np.array([[0.0, 1.0], [-2.0, 0.5]])
    >>> tanh_bias_inplace(a, np.array([0.5, -1.0]))
    >>> bool(np.allclose(a, np.tanh([[0.5, 0.0], [-1.5, -0.5]]), rtol=0, atol=1e-15))
    True
    """
    n, H = a.shape
    for i in range(n):
        row = a[i]
        for j in range(H):
            row[j] = tanh(row[j] + bias[j])
