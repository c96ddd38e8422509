"""Python's ``repr`` of a float, in compiled code: the JSON numbers of the serving lane.

``json.dumps`` writes a float as ``float.__repr__`` does: the shortest decimal string
that reads back as the same double (the closest one when several are as short), in
fixed notation when its decimal point position ``decpt`` satisfies
``-4 < decpt <= 16``, else in scientific notation with a two-digit-minimum exponent.
CPython finds the digits with David Gay's ``dtoa``, about 1.8 µs for a float of 17
significant digits — most of the cost of a JSON posterior message. :func:`put_repr`
finds the same digits with Ulf Adams' Ryu algorithm (PLDI 2018; written here from the
paper): the interval of decimals that round to the double is scaled by a 128-bit
approximation of a power of 5 (tables of exact integers, made at import from Python's
big integers) and digits are removed while the interval's bounds still differ, with
exact trailing-zero tracking for the rare cases where the removed digits decide the
rounding. tests/test_floatrepr.py compares it with ``repr`` on random bit patterns
and on the boundary cases of every notation.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..kernels._jit import jit
from ..kernels._math import _bitcast

__all__ = ["put_repr", "repr_array", "REPR_MAX_BYTES"]

#: the longest repr of a float: "-2.2250738585072014e-308" is 24 characters
REPR_MAX_BYTES = 24

_POW5_INV_BITCOUNT = 125
_POW5_BITCOUNT = 125
_M64 = (1 << 64) - 1


def _tables():
    """(inv, split): for i in 0..341, ⌊2^(|5^i| - 1 + 125) / 5^i⌋ + 1, and for i in
    0..325, 5^i scaled to 125 bits; as (low, high) 64-bit halves."""
    inv = np.zeros((342, 2), np.uint64)
    for i in range(342):
        p = 5 ** i
        v = (1 << (p.bit_length() - 1 + _POW5_INV_BITCOUNT)) // p + 1
        inv[i] = (v & _M64, v >> 64)
    split = np.zeros((326, 2), np.uint64)
    for i in range(326):
        p = 5 ** i
        shift = p.bit_length() - _POW5_BITCOUNT
        v = p >> shift if shift >= 0 else p << -shift
        split[i] = (v & _M64, v >> 64)
    return inv, split


_POW5_INV_SPLIT, _POW5_SPLIT = _tables()
_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U2 = np.uint64(2)
_U4 = np.uint64(4)
_U5 = np.uint64(5)
_U10 = np.uint64(10)
_U64 = np.uint64(64)
_MANTISSA_MASK = np.uint64((1 << 52) - 1)
_HIDDEN_BIT = np.uint64(1 << 52)


@intrinsic
def _mulhi(typingctx, a, b):
    """The high 64 bits of the 128-bit product of two uint64."""
    sig = types.uint64(types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        i128 = ir.IntType(128)
        p = builder.mul(builder.zext(args[0], i128), builder.zext(args[1], i128))
        return builder.trunc(builder.lshr(p, ir.Constant(i128, 64)), ir.IntType(64))
    return sig, codegen


@jit(inline="always")
def _mul_shift(m, lo, hi, j):
    """⌊m · (hi·2^64 + lo) / 2^j⌋ for 64 < j < 128 (m below 2^55)."""
    high1 = _mulhi(m, hi)
    low1 = m * hi
    high0 = _mulhi(m, lo)
    s = high0 + low1
    if s < high0:
        high1 += _U1
    d = np.uint64(j - 64)
    return (high1 << (_U64 - d)) | (s >> d)


@jit(inline="always")
def _pow5_factor(v):
    n = 0
    while v % _U5 == _U0:
        v //= _U5
        n += 1
    return n


@jit(inline="always")
def _pow5bits(e):
    """⌈log2 5^e⌉ (the bit length of 5^e) for 0 ≤ e ≤ 3528."""
    return ((e * 1217359) >> 19) + 1


@jit(inline="always")
def _drop_digit(vr, vp, vm, last, vr_trailing_zeros):
    """Remove the last digit of vr, vp and vm; ``last`` becomes vr's, and
    ``vr_trailing_zeros`` whether every digit removed before it was 0."""
    return (vr // _U10, vp // _U10, vm // _U10, int(vr % _U10),
            vr_trailing_zeros and last == 0)


@jit
def shortest(bits):
    """The shortest decimal that reads back as the positive finite double of IEEE bit
    pattern ``bits`` (int64, sign cleared, not zero), the closest to it among those:
    ``(digits, exponent)``, the value being ``digits · 10**exponent``."""
    ieee_m = np.uint64(bits) & _MANTISSA_MASK
    ieee_e = (bits >> 52) & 0x7FF
    if ieee_e == 0:
        e2 = 1 - 1023 - 52 - 2
        m2 = ieee_m
    else:
        e2 = ieee_e - 1023 - 52 - 2
        m2 = _HIDDEN_BIT | ieee_m
    accept_bounds = (m2 & _U1) == _U0          # round-half-even reading: ties included
    mv = _U4 * m2
    mm_shift = _U1 if (ieee_m != _U0 or ieee_e <= 1) else _U0
    vm_trailing_zeros = False
    vr_trailing_zeros = False
    if e2 >= 0:
        q = ((e2 * 78913) >> 18) - (1 if e2 > 3 else 0)        # log10 2^e2, less one
        e10 = q
        k = _POW5_INV_BITCOUNT + _pow5bits(q) - 1
        i = -e2 + q + k
        lo, hi = _POW5_INV_SPLIT[q, 0], _POW5_INV_SPLIT[q, 1]
        vr = _mul_shift(mv, lo, hi, i)
        vp = _mul_shift(mv + _U2, lo, hi, i)
        vm = _mul_shift(mv - _U1 - mm_shift, lo, hi, i)
        if q <= 21:
            if mv % _U5 == _U0:
                vr_trailing_zeros = _pow5_factor(mv) >= q
            elif accept_bounds:
                vm_trailing_zeros = _pow5_factor(mv - _U1 - mm_shift) >= q
            elif _pow5_factor(mv + _U2) >= q:
                vp -= _U1
    else:
        q = ((-e2 * 732923) >> 20) - (1 if -e2 > 1 else 0)     # log10 5^-e2, less one
        e10 = q + e2
        i = -e2 - q
        k = _pow5bits(i) - _POW5_BITCOUNT
        j = q - k
        lo, hi = _POW5_SPLIT[i, 0], _POW5_SPLIT[i, 1]
        vr = _mul_shift(mv, lo, hi, j)
        vp = _mul_shift(mv + _U2, lo, hi, j)
        vm = _mul_shift(mv - _U1 - mm_shift, lo, hi, j)
        if q <= 1:
            vr_trailing_zeros = True
            if accept_bounds:
                vm_trailing_zeros = mm_shift == _U1
            else:
                vp -= _U1
        elif q < 63:
            vr_trailing_zeros = (mv & ((_U1 << np.uint64(q)) - _U1)) == _U0
    # remove digits while the interval still holds a shorter decimal; the trailing-zero
    # flags (false but in ~1 % of doubles) track whether the bounds and the removed
    # digits are exact, which decides the bounds' inclusion and the tie to even
    removed = 0
    last = 0
    while vp // _U10 > vm // _U10:
        vm_trailing_zeros = vm_trailing_zeros and vm % _U10 == _U0
        vr, vp, vm, last, vr_trailing_zeros = _drop_digit(vr, vp, vm, last, vr_trailing_zeros)
        removed += 1
    if vm_trailing_zeros:                                       # an exact lower bound may
        while vm % _U10 == _U0:                                 # lose more zeros
            vr, vp, vm, last, vr_trailing_zeros = _drop_digit(vr, vp, vm, last, vr_trailing_zeros)
            removed += 1
    if vr_trailing_zeros and last == 5 and vr % _U2 == _U0:
        last = 4                                                # exactly half: to even
    up = (vr == vm and (not accept_bounds or not vm_trailing_zeros)) or last >= 5
    out = vr + (_U1 if up else _U0)
    exp = e10 + removed
    while out % _U10 == _U0:
        out //= _U10
        exp += 1
    return out, exp


@jit
def _put_digits(buf, p, v, n):
    """The n decimal digits of v at ``buf[p:p+n]``."""
    for i in range(n - 1, -1, -1):
        buf[p + i] = 48 + int(v % _U10)
        v //= _U10
    return p + n


@jit
def put_repr(buf, p, x):
    """Write ``repr(x).encode()`` of a finite float at ``buf[p:]`` (at most
    REPR_MAX_BYTES bytes); returns the end."""
    bits = _bitcast(x, np.int64)
    if bits < 0:
        buf[p] = 45                                             # -
        p += 1
        bits &= 0x7FFFFFFFFFFFFFFF
    if bits == 0:
        buf[p] = 48
        buf[p + 1] = 46
        buf[p + 2] = 48
        return p + 3
    digits, exp = shortest(bits)
    n = 1
    t = digits
    while t >= _U10:
        t //= _U10
        n += 1
    decpt = n + exp
    if decpt <= -4 or decpt > 16:                              # d.ddde±XX
        p = _put_digits(buf, p, digits // np.uint64(10 ** (n - 1)) if n > 1 else digits, 1)
        if n > 1:
            buf[p] = 46
            p = _put_digits(buf, p + 1, digits % np.uint64(10 ** (n - 1)), n - 1)
        buf[p] = 101
        e = decpt - 1
        buf[p + 1] = 45 if e < 0 else 43
        p += 2
        e = -e if e < 0 else e
        ne = 2 if e < 100 else 3
        return _put_digits(buf, p, np.uint64(e), ne)
    if decpt <= 0:                                              # 0.000ddd
        buf[p] = 48
        buf[p + 1] = 46
        p += 2
        for _ in range(-decpt):
            buf[p] = 48
            p += 1
        return _put_digits(buf, p, digits, n)
    if decpt >= n:                                              # ddd000.0
        p = _put_digits(buf, p, digits, n)
        for _ in range(decpt - n):
            buf[p] = 48
            p += 1
        buf[p] = 46
        buf[p + 1] = 48
        return p + 2
    scale = np.uint64(10 ** (n - decpt))                        # ddd.ddd
    p = _put_digits(buf, p, digits // scale, decpt)
    buf[p] = 46
    return _put_digits(buf, p + 1, digits % scale, n - decpt)


@jit
def repr_array(x, buf, ends):
    """``repr`` of each finite ``x[i]``, concatenated in ``buf`` (uint8, at least
    ``REPR_MAX_BYTES * len(x)``), string i ending at ``ends[i]`` (for tests and
    benchmarks)."""
    p = 0
    for i in range(x.shape[0]):
        p = put_repr(buf, p, x[i])
        ends[i] = p
    return p
