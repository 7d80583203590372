"""The library's own transcendental functions: same bits on every CPU.

No floating-point result here comes from libm or numpy's SIMD loops.  Every function is
built from correctly rounded IEEE operations only (``+ - * /``), integer/bit manipulation
(``float64 <-> int64`` bit casts, shifts, masks), comparisons and selects, evaluated in a
fixed order.  No fused multiply-add is ever formed (numba does not contract ``a*b+c`` and
``fastmath`` is never used), so AVX-512, AVX2, baseline x86-64 and aarch64 give the same
bits.  The code is branch-light (range reduction by integer tricks, special cases by
selects) so that LLVM vectorises the loops of the array kernels; the vectorised paths
use no table gathers (only the scalar Payne-Hanek path of sin/cos reads a table).  Conversions between float and int64 go through bit casts
(``bits(t + 1.5*2**52) - bits(1.5*2**52)``), which vectorise on AVX2 too.

Scalar functions (float64 -> float64)
-------------------------------------
Each ``f`` exists twice: ``f_inline`` (``njit(inline="always")``: inlined at the Numba-IR
level into the caller, so a caller's loop vectorises; use these inside other kernels'
loops) and ``f`` (``@helper``: the same code as a standalone compiled function; LLVM does
not inline a function this large into a loop, and a call stops vectorisation).

Error bounds are in ulps of the exact value (ulp of the exact value's binade; 2**-1074 in
the subnormal range).  "Measured" is the maximum over the points of ``tests/test_libm.py``
(about 1.1 million: uniform and log-uniform magnitudes of both signs, subnormals, values
near 0, the overflow/underflow edges, both sides of every approximation and selection
boundary, hard sin/cos reductions) and a further 3.7 million points of the same kinds,
against 64-bit long double (cross-checked with 60-digit mpmath) or mpmath (erf).

``exp(x)``  Cody-Waite ``x = k ln2 + r`` (``|r| <= ln2/2``, ``ln2`` in a 32-bit and a 53-bit
    part, ``r`` a double-double), ``e^r = (1 + r) + (r^2 E(r) + r_lo)`` (``1 + r`` exact by
    Fast2Sum, E a degree-11 Chebyshev fit of ``(e^r - 1 - r)/r^2``, error below
    4.1e-19 after the factor ``r^2``, Estrin), times
    ``2^k1 2^k2`` (two normal factors built from exponent bits; one rounding).  Bound
    1 ulp; measured 0.57 for normal results, 0.78 subnormal ulps for results below
    2**-1022 (a 53-bit value rounded once more to the subnormal grid).  Overflow gives
    ``inf`` exactly for ``x > 709.782712893384`` (exactly where the exact value rounds
    above DBL_MAX); ``exp(x) = 0`` exactly for ``x <= -745.1332191019412`` (where the
    exact value rounds to 0).  ``exp(+-0) = 1``, ``exp(-inf) = 0``, ``exp(inf) = inf``.
``expm1(x)``  same reduction with a more accurate core: ``e^r - 1 = r + r^2/2 + r^3 F(r)``
    (``r^2/2`` exact by Dekker's product, F degree 11, Estrin) as a double-double ``u``; then
    ``(2^k - 1) + 2^k u`` summed as a double-double (``2^k - 1`` exact as a TwoSum pair, so
    no cancellation error for ``k = +-1``).  Bound 1 ulp (measured 0.62).  ``|x| < 2**-54``
    returns ``x`` (so +-0 and subnormals exact); ``x <= -38`` gives ``-1``; for ``k > 512``
    (``x > 355``) the result is ``exp(x)`` (``-1`` is far below half an ulp); overflow
    as ``exp``.
``log(x)``  ``x = 2^k m``, ``m`` in ``[sqrt(2)/2, sqrt(2))`` from the exponent bits (subnormals
    scaled by 2**54 first), ``f = m - 1``, ``s = f/(2+f)``, fdlibm's degree-14 polynomial
    ``R(s)``: ``log = k ln2_hi - ((hfsq - (s (hfsq + R) + k ln2_lo)) - f)``.  Bound 1 ulp
    (measured 0.79).  ``log(1) = 0``, ``log(+-0) = -inf``, ``log(x < 0) = NaN``,
    ``log(inf) = inf``.
``log1p(x)``  fdlibm's: for ``x`` in ``[sqrt(2)/2 - 1, sqrt(2) - 1)`` the kernel above on
    ``f = x`` itself; elsewhere ``u = 1 + x`` with its exact rounding error ``c`` (TwoSum),
    ``log(u)`` reduced as above plus the correction ``c/u``.  Bound 1 ulp (measured
    0.78).  ``|x| < 2**-54`` returns ``x``; ``log1p(-1) = -inf``, ``x < -1`` gives NaN,
    ``log1p(inf) = inf``.
``tanh(x)``  ``t = expm1(-2|x|)`` as a double-double (expm1's core), then ``-t / (t + 2)``
    by a double-double division (one division, the residual from Dekker's exact
    product), sign restored.  Bound 1 ulp (measured 0.53).  ``|x| < 2**-28`` returns
    ``x`` (so +-0, subnormals exact); ``|x| >= 19.07`` gives exactly +-1;
    ``tanh(+-inf) = +-1``.
``sigmoid(x)``  ``e = exp(-|x|)`` as a double-double (exp's core), ``1/(1+e)`` (``x >= 0``)
    or ``e/(1+e)`` (``x < 0``) by a double-double division: no overflow, no cancellation.
    Bound 1 ulp (measured 0.74, near the bottom of the normal range; 0.56 elsewhere).
    For ``x < -708.39`` (subnormal results) it equals ``exp(x)`` bit for bit, so
    ``sigmoid(x) = 0`` for ``x <= -745.1332191019412`` (``sigmoid(-800) = 0``);
    ``sigmoid(x) = 1`` for ``x >= 36.74``; ``sigmoid(+-0) = 0.5``, ``sigmoid(-inf) = 0``,
    ``sigmoid(inf) = 1``.
``softplus(x)``  ``max(x, 0) + log1p(e)``, ``e = exp(-|x|)`` as a double-double and
    ``log1p(e)`` as a double-double (log1p's kernel with ``hfsq`` exact by Dekker and the
    large terms summed by TwoSum), so the final ``x + L`` is one rounding.  No linear
    cut-off: for large ``x`` the exact result rounds to ``x`` and that is what this gives.
    Bound 1 ulp (measured 0.74).  ``softplus(-inf) = 0``, ``softplus(inf) = inf``; for
    ``x < -708`` it is ``exp(x)`` bit for bit (``log1p(e) = e`` to all digits there).
``erf(x)``  ``|x| <= 1.125``: ``x + x w(x^2)``, ``w = erf(x)/x - 1`` a degree-15 polynomial
    in ``x^2`` (Chebyshev fit of mpmath on [0, 1.5625], |error| 1.3e-17); ``x^2``, the last
    Horner step and ``x w`` in double-double (their roundings would cost up to 0.6 ulp
    near |x| = 1).  ``1.125 < |x| < 6``: ``1 - erfc(|x|)`` with ``erfc(a) = exp(-a^2) t
    g(t)``, ``t = 1/(a+1)``, ``g`` a degree-18 polynomial in ``t`` (Chebyshev fit on
    ``a`` in [1, 6], relative error 1.1e-16, scaled by ``erfc/erf <= 0.13``), ``exp(-a^2)``
    from ``a^2`` split exactly (Veltkamp) and exp's core.  Bound 1 ulp (measured 0.82,
    near |x| = 1.15).  ``erf(+-0) = +-0``, ``|x| >= 5.93`` gives exactly +-1,
    ``erf(+-inf) = +-1``; ``|x| < 2**-500``: ``(2/sqrt(pi)) x`` (subnormal results
    within 1 subnormal ulp).
``sin(x)``, ``cos(x)``  Cody-Waite reduction ``x = n pi/2 + y`` with ``pi/2`` in four pieces
    (33+33+33+53 bits, fdlibm's), every product exact for ``|n| < 2**20``, the
    subtractions compensated (``y`` a double-double), then fdlibm's ``__kernel_sin`` /
    ``__kernel_cos`` (degree 13/14 polynomials), both evaluated and selected by
    ``n mod 4``.  This vectorised reduction covers ``|x| <= 1647099`` (just under
    ``2**20 pi/2``: every angle ``pos * freq`` with ``pos <= 10**6`` and ``|freq| <= 1.6``).
    Beyond it, for every finite ``x``, the reduction is Payne-Hanek (the 53-bit mantissa
    times a 240-bit window of the bits of 2/pi, exactly, in 24-bit integer limbs; scalar:
    the array kernels handle such elements in a second pass over the chunks that have
    any).  Bound 1 ulp everywhere (measured 0.79 for sin, 0.75 for cos; the hard cases
    near multiples of pi/2 and ``6381956970095103 * 2**797`` included).
    ``sin(+-0) = +-0``, ``|x| < 2**-27``: ``sin(x) = x``, ``cos(x) = 1``;
    ``sin/cos(+-inf) = NaN``.

Every function maps NaN to NaN (the input NaN itself).

Array kernels (span kernels over fixed chunks of 4096 elements)
--------------------------------------------------------------------------
``exp_array(x, out)``, ``expm1_array``, ``log_array``, ``log1p_array``, ``tanh_array``,
``erf_array``, ``sigmoid_array``, ``softplus_array``, ``sin_array``, ``cos_array``: ``x``
and ``out`` 1-D C-contiguous float64 of equal length (``out`` may be ``x``):
``out[i] = f(x[i])``.  No validation, no return value.  Elementwise, so the result does
not depend on the thread count (or on the chunking).
"""

import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba.core import types
from numba.extending import intrinsic

from ._cpu import machine
from ._jit import helper, inlined as _inl, span_kernel

__all__ = ["exp", "expm1", "log", "log1p", "tanh", "erf", "sigmoid", "softplus",
           "sin", "cos", "exp_array", "expm1_array", "log_array", "log1p_array",
           "tanh_array", "erf_array", "sigmoid_array", "softplus_array", "sin_array",
           "cos_array", "exp_inline", "expm1_inline", "log_inline", "log1p_inline",
           "tanh_inline", "erf_inline", "sigmoid_inline", "softplus_inline", "sin_inline",
           "cos_inline", "expm1_fast_inline", "tanh_fast_inline", "sigmoid_fast_inline",
           "softplus_fast_inline", "SIGMOID_FAST_BOUND", "SOFTPLUS_FAST_BOUND"]

_CHUNK = 4096


# --------------------------------------------------------------------------- bit casts
@intrinsic
def _bits(typingctx, x):
    """The IEEE bits of a float64 as an int64 (an LLVM bitcast)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _float(typingctx, k):
    """The float64 whose IEEE bits are the int64 ``k`` (an LLVM bitcast)."""
    if k != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.DoubleType())
    return types.float64(types.int64), codegen


# --------------------------------------------------------------------------- vector width
def _wide_width():
    m = machine()
    return 0 if m.portable or m.arch != "x86_64" else m.vector_bits


_WIDE_BITS = _wide_width()


@intrinsic
def _wide(typingctx):
    """Marks the LLVM function it is called in (a ``prange`` body or a loop kernel) with
    ``"prefer-vector-width"="512"`` when the target has 512-bit vectors (the machine policy,
    :mod:`._cpu`): LLVM's x86 back end otherwise vectorises with 256-bit registers on
    AVX-512 CPUs.  Only the vector width of the loops changes (the same IEEE operations
    lane by lane): the same bits.  A no-op elsewhere (and if llvmlite ever refuses it)."""
    def codegen(context, builder, signature, args):
        if _WIDE_BITS > 256:
            attrs = builder.function.attributes
            try:   # a string attribute: llvmlite's AttributeSet only knows keyword ones
                set.add(attrs, '"prefer-vector-width"="%d"' % _WIDE_BITS)
            except TypeError:  # pragma: no cover
                pass
        return context.get_dummy_value()
    return types.none(), codegen


# --------------------------------------------------------------------------- constants
_NAN = math.nan
_INF = math.inf
_ROUND = 6755399441055744.0          # 1.5 * 2**52: (t + _ROUND) - _ROUND rounds t to an integer
_ROUND_BITS = 0x4338000000000000     # bits of _ROUND; bits(t + _ROUND) - _ROUND_BITS = that integer
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # 32 significant bits: k * _LN2_HI exact for |k| < 2**21
_LN2_LO = 1.90821492927058770002e-10
_SPLIT = 134217729.0                  # 2**27 + 1 (Veltkamp)
_TWO54 = 18014398509481984.0
_TINY_NORMAL = 2.2250738585072014e-308

# (expm1(r) - r - r^2/2) / r^3 = sum 1/(n+3)! r^n, n = 0..11 (truncation < 2**-60 relative)
_F0 = 0.16666666666666666
_F1 = 0.041666666666666664
_F2 = 0.008333333333333333
_F3 = 0.001388888888888889
_F4 = 0.0001984126984126984
_F5 = 2.48015873015873e-05
_F6 = 2.7557319223985893e-06
_F7 = 2.755731922398589e-07
_F8 = 2.505210838544172e-08
_F9 = 2.08767569878681e-09
_F10 = 1.6059043836821613e-10
_F11 = 1.1470745597729725e-11
# (e^r - 1 - r)/r^2 on |r| <= ln2/2: degree-11 Chebyshev fit (mpmath), |r^2 error| < 4.1e-19
_EM0 = 0.5
_EM1 = 0.16666666666666666
_EM2 = 0.04166666666666668
_EM3 = 0.008333333333333333
_EM4 = 0.0013888888888879082
_EM5 = 0.00019841269841263304
_EM6 = 2.480158733642132e-05
_EM7 = 2.755731924720479e-06
_EM8 = 2.755726330147475e-07
_EM9 = 2.5052071109214447e-08
_EM10 = 2.0918129454967065e-09
_EM11 = 1.6086622436215554e-10


# --------------------------------------------------------------------------- error-free transformations
@_inl
def _two_prod(a, b):
    """(p, e) with p = fl(a b) and a b = p + e exactly (Dekker; no FMA).  |a|, |b| < 2**996."""
    p = a * b
    t = a * _SPLIT
    ah = t - (t - a)
    al = a - ah
    t = b * _SPLIT
    bh = t - (t - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


@_inl
def _dd_div(ah, al, bh, bl):
    """(ah + al) / (bh + bl) rounded once more (double-double numerator/denominator,
    |al| <= ulp(ah), |bl| <= ulp(bh)): one division, the residual from Dekker's exact
    product, error a small fraction of an ulp before the final addition."""
    inv = 1.0 / bh
    q1 = ah * inv
    p, pe = _two_prod(q1, bh)
    r = (((ah - p) - pe) + al) - q1 * bl
    return q1 + r * inv


# --------------------------------------------------------------------------- exp core
# The two polynomials of the exp cores, by Estrin's scheme: pairs c_i + c_{i+1} r, then
# combined with r^2, r^4 and r^8.  The fixed order of these operations is part of the
# specification (it decides the bits).  Horner's rule, used before, gives the same bounds
# but is one chain of 24 dependent operations (~72 cycles of latency per vector on
# current x86 cores, and the out-of-order window holds only a few such chains: the
# activations ran latency-bound at ~1.3 instructions per cycle); Estrin's chain is 8
# operations deep.  The rounding errors of either are a few ulps of the polynomial,
# scaled by r^2 or r^3 (<= 0.12) in the result.
@_inl
def _estrin11(r, r2, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11):
    """sum c<i> r^i, i = 0..11, by Estrin's scheme (r2 = r * r)."""
    p0 = c0 + c1 * r
    p1 = c2 + c3 * r
    p2 = c4 + c5 * r
    p3 = c6 + c7 * r
    p4 = c8 + c9 * r
    p5 = c10 + c11 * r
    r4 = r2 * r2
    q0 = p0 + p1 * r2
    q1 = p2 + p3 * r2
    q2 = p4 + p5 * r2
    return (q0 + q1 * r4) + q2 * (r4 * r4)


@_inl
def _em_poly(r, r2):
    """E(r) = sum _EM<i> r^i, i = 0..11 (r2 = r * r)."""
    return _estrin11(r, r2, _EM0, _EM1, _EM2, _EM3, _EM4, _EM5, _EM6, _EM7, _EM8, _EM9,
                     _EM10, _EM11)


@_inl
def _f_poly(r):
    """F(r) = sum _F<i> r^i, i = 0..11."""
    return _estrin11(r, r * r, _F0, _F1, _F2, _F3, _F4, _F5, _F6, _F7, _F8, _F9, _F10,
                     _F11)


@_inl
def _exp_core(xh, xl):
    """exp(xh + xl) = 2^k (1 + uh + ul) for |xh| <= 746, |xl| <= ulp(xh):
    returns (k, uh, ul) with |uh + ul| <= 0.42, |ul| <= ulp(uh) (about)."""
    t = xh * _LOG2E + _ROUND
    kf = t - _ROUND
    k = _bits(t) - _ROUND_BITS
    rh = xh - kf * _LN2_HI                  # exact
    c = kf * _LN2_LO - xl
    r = rh - c
    rl = (rh - r) - c
    # expm1(r + rl) = r + r^2/2 + r^3 F(r) + rl (1 + r)
    h = 0.5 * r
    hh, he = _two_prod(r, h)                # r^2/2 exactly
    f = _f_poly(r)
    tail = (he + (r * hh) * (2.0 * f)) + rl * (1.0 + r)
    uh = r + hh                             # |hh| <= |r|/2: Fast2Sum
    ul = ((r - uh) + hh) + tail
    vh = uh + ul                            # renormalise (|ul| < |uh|)
    return k, vh, (uh - vh) + ul


@_inl
def _exp_fast(x, xl):
    """exp(x + xl) = 2^k (ph + pl) for |x| <= 746, |xl| <= ulp(x): returns (k, ph, pl),
    ph = exp(r) rounded once at the end, pl its tail (a double-double good to ~2**-56),
    ``(1 + r) + (r^2 E(r) + rl)`` with ``1 + r`` exact by Fast2Sum and E a degree-11 fit
    of (e^r - 1 - r)/r^2 (no double-double product: about 0.55 ulp)."""
    t = x * _LOG2E + _ROUND
    kf = t - _ROUND
    k = _bits(t) - _ROUND_BITS
    rh = x - kf * _LN2_HI                   # exact
    c = kf * _LN2_LO - xl
    r = rh - c
    rl = (rh - r) - c
    r2 = r * r
    e = _em_poly(r, r2)
    s = 1.0 + r                             # Fast2Sum: 1 + r = s + se exactly
    se = (1.0 - s) + r
    t = se + (r2 * e + rl)
    ph = s + t
    return k, ph, (s - ph) + t


@_inl
def _pow2(k):
    """2.0**k for -1022 <= k <= 1023 from the exponent bits."""
    return _float((k + 1023) << 52)


@_inl
def exp_inline(x):
    """e**x within 1 ulp (see the module docstring for the edges)."""
    xc = x if x < 710.0 else 710.0           # NaN -> 710 (fixed at the end)
    xc = xc if xc > -746.0 else -746.0
    k, p, _ = _exp_fast(xc, 0.0)
    k1 = k >> 1
    res = (p * _pow2(k1)) * _pow2(k - k1)
    return res if x == x else x


@_inl
def _expm1_parts(k, uh, ul):
    """2^k (1 + uh + ul) - 1 = hi + lo for k <= 512 (from ``_exp_core``)."""
    s = _pow2(k)
    # T = 2^k - 1 exactly as th + tl (TwoSum)
    th = s - 1.0
    bv = th - s
    tl = (s - (th - bv)) + (-1.0 - bv)
    v = s * uh
    # TwoSum(th, v)
    sh = th + v
    bv = sh - th
    se = (th - (sh - bv)) + (v - bv)
    return sh, se + (tl + s * ul)


@_inl
def _expm1_dd(x):
    """expm1(x) = hi + lo for -40 <= x <= 355 (k <= 512)."""
    k, uh, ul = _exp_core(x, 0.0)
    return _expm1_parts(k, uh, ul)


@_inl
def expm1_inline(x):
    """e**x - 1 within 1 ulp."""
    xc = x if x < 710.0 else 710.0
    xc = xc if xc > -40.0 else -40.0
    k, uh, ul = _exp_core(xc, 0.0)
    hi, lo = _expm1_parts(k if k < 512 else 512, uh, ul)
    small = hi + lo
    # x > 355 (k > 512): e^x - 1 rounds like e^x
    p = 1.0 + uh
    p = p + (((1.0 - p) + uh) + ul)
    k1 = k >> 1
    big = (p * _pow2(k1)) * _pow2(k - k1)
    res = big if k > 512 else small
    res = x if abs(x) < 5.551115123125783e-17 else res
    return res if x == x else x


# --------------------------------------------------------------------------- log
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01


@_inl
def _log_reduce(x):
    """x > 0 normal -> (dk, f) with x = 2^k (1 + f), 1 + f in [sqrt(2)/2, sqrt(2))."""
    ix = _bits(x) + 0x00095F6200000000
    k = (ix >> 52) - 1023
    ix = (ix & 0x000FFFFFFFFFFFFF) + 0x3FE6A09E00000000
    f = _float(ix) - 1.0
    dk = _float(k + _ROUND_BITS) - _ROUND
    return dk, f


@_inl
def _log_r(f):
    """(hfsq, s (hfsq + R(s))) of fdlibm's log1p(f) kernel."""
    hfsq = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    return hfsq, s * (hfsq + (t2 + t1))


@_inl
def log_inline(x):
    """Natural logarithm within 1 ulp."""
    sub = x < _TINY_NORMAL
    xs = x * _TWO54 if sub else x
    dk, f = _log_reduce(xs)
    dk = dk - 54.0 if sub else dk
    hfsq, sr = _log_r(f)
    res = dk * _LN2_HI - ((hfsq - (sr + dk * _LN2_LO)) - f)
    res = -_INF if x == 0.0 else res
    res = _NAN if x < 0.0 else res
    return res if x < _INF else x          # inf -> inf, NaN -> NaN


@_inl
def log1p_inline(x):
    """log(1 + x) within 1 ulp."""
    u = 1.0 + x
    bv = u - 1.0
    c = (1.0 - (u - bv)) + (x - bv)        # 1 + x = u + c exactly
    uc = u if u > _TINY_NORMAL else 1.0
    dk, f = _log_reduce(uc)
    cu = c / uc
    # fdlibm: for 1 + x in [sqrt(2)/2, sqrt(2)) take f = x itself (no rounding at all)
    k0 = (x >= -0.2928932188134524) and (x < 0.41421356237309503)
    f = x if k0 else f
    dk = 0.0 if k0 else dk
    cu = 0.0 if k0 else cu
    hfsq, sr = _log_r(f)
    res = dk * _LN2_HI - ((hfsq - (sr + (dk * _LN2_LO + cu))) - f)
    res = x if abs(x) < 5.551115123125783e-17 else res
    res = -_INF if x == -1.0 else res
    res = _NAN if x < -1.0 else res
    return res if x < _INF else x


# --------------------------------------------------------------------------- tanh, sigmoid, softplus
@_inl
def tanh_inline(x):
    """Hyperbolic tangent within 1 ulp."""
    a = abs(x)
    ac = a if a < 20.0 else 20.0            # NaN -> 20
    th, tl = _expm1_dd(-2.0 * ac)           # t = expm1(-2a) in (-1, 0]
    dh = 2.0 + th                           # Fast2Sum: |th| < 2
    dl = ((2.0 - dh) + th) + tl
    r = _dd_div(-th, -tl, dh, dl)
    res = r if x > 0.0 else -r
    res = x if a < 3.725290298461914e-09 else res
    return res if x == x else x


@_inl
def _exp_neg_dd(a):
    """exp(-a) for 0 <= a <= 746 as (hi, lo): hi rounded once (to a subnormal below
    2**-1022), lo its double-double tail (0-ish for subnormal hi)."""
    k, ph, pl = _exp_fast(-a, 0.0)
    k1 = k >> 1
    s1 = _pow2(k1)
    s2 = _pow2(k - k1)
    return (ph * s1) * s2, (pl * s1) * s2


@_inl
def sigmoid_inline(x):
    """1 / (1 + e**-x) within 1 ulp, stable for both signs."""
    a = abs(x)
    ac = a if a < 746.0 else 746.0
    eh, el = _exp_neg_dd(ac)
    dh = 1.0 + eh                           # Fast2Sum: eh <= 1
    dl = ((1.0 - dh) + eh) + el
    nh = 1.0 if x >= 0.0 else eh
    nl = 0.0 if x >= 0.0 else el
    res = _dd_div(nh, nl, dh, dl)
    return res if x == x else x


@_inl
def _log1p_dd(eh, el):
    """log(1 + eh + el) for 0 <= eh <= 1 as (hi, lo), hi + lo accurate to ~2**-60 relative."""
    u = 1.0 + eh
    c = ((1.0 - u) + eh) + el               # Fast2Sum error plus el
    dk, f = _log_reduce(u)
    k0 = eh < 0.41421356237309503            # 1 + e in [1, sqrt 2): f = e exactly, c = el
    f = eh if k0 else f
    dk = 0.0 if k0 else dk
    c = el if k0 else c
    f2h, f2l = _two_prod(f, f)
    hfh = 0.5 * f2h                         # hfsq = hfh + hfl exactly
    hfl = 0.5 * f2l
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    sr = s * (hfh + (t2 + t1))
    # log = dk ln2_hi + f - hfsq + sr + dk ln2_lo + c/u
    a = dk * _LN2_HI                        # exact
    b = f - hfh                             # Fast2Sum: |hfh| <= |f| / 4.7
    be = (f - b) - hfh
    hi = a + b
    bv = hi - a
    lo = (a - (hi - bv)) + (b - bv)
    lo = lo + (be + ((sr - hfl) + (dk * _LN2_LO + c / u)))
    return hi, lo


@_inl
def softplus_inline(x):
    """log(1 + e**x) within 1 ulp, stable for both signs, no linear cut-off."""
    a = abs(x)
    ac = a if a < 746.0 else 746.0
    eh, el = _exp_neg_dd(ac)
    lh, ll = _log1p_dd(eh, el)
    xp = x if x > 0.0 else 0.0
    sh = xp + lh
    bv = sh - xp
    se = (xp - (sh - bv)) + (lh - bv)
    res = sh + (se + ll)
    res = eh if x < -708.0 else res        # subnormal e^x: log1p(e) = e to all digits
    res = 0.0 if x == -_INF else res
    return res if x < _INF else x


# --------------------------------------------------------------------------- FMA variants
# On a target with FMA (the machine policy, :mod:`._cpu`) the error of a product is one
# fused operation: ``e = fma(a, b, -p)`` is exactly ``a b - p`` whenever that is
# representable, i.e. unless ``a b`` is within 2**106 of the underflow threshold -- and
# then Dekker's ``_two_prod`` gives exactly the same ``e`` (it is exact under the same
# condition).  So the ``*_fast_inline`` functions below give bit for bit the results of
# the plain ones wherever their stated domain holds (tests/test_libm.py compares them on
# every test point), with about 15 fewer operations per product.  ``llvm.fma`` is a
# generic LLVM operation; on a target without FMA (baseline x86-64) it would become a
# libm call, so there the ``*_fast_inline`` names are the plain functions.
_FMA = machine().fma and not machine().portable


@intrinsic
def _fma(typingctx, a, b, c):
    """a b + c rounded once (``llvm.fma.f64``)."""
    if not (a == types.float64 and b == types.float64 and c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(args[0], args[1], args[2])
    return types.float64(types.float64, types.float64, types.float64), codegen


@_inl
def _two_prod_f(a, b):
    """``_two_prod`` by one FMA: the same (p, e) unless the exponents of a and b sum
    below -970 (where Dekker's partial products may underflow)."""
    p = a * b
    return p, _fma(a, b, -p)


@_inl
def _dd_div_f(ah, al, bh, bl):
    """``_dd_div`` with ``_two_prod_f`` (the same bits for |ah / bh| >= 2**-866)."""
    inv = 1.0 / bh
    q1 = ah * inv
    p, pe = _two_prod_f(q1, bh)
    r = (((ah - p) - pe) + al) - q1 * bl
    return q1 + r * inv


@_inl
def _exp_core_f(xh, xl):
    """``_exp_core`` with ``_two_prod_f`` for r^2/2: the same bits for every argument
    whose reduced r is 0 or |r| >= 2**-485 (every double in [-746, 746] but those
    within about 1e-17 of 0, where the callers select x itself)."""
    t = xh * _LOG2E + _ROUND
    kf = t - _ROUND
    k = _bits(t) - _ROUND_BITS
    rh = xh - kf * _LN2_HI                  # exact
    c = kf * _LN2_LO - xl
    r = rh - c
    rl = (rh - r) - c
    h = 0.5 * r
    hh, he = _two_prod_f(r, h)              # r^2/2 exactly
    f = _f_poly(r)
    tail = (he + (r * hh) * (2.0 * f)) + rl * (1.0 + r)
    uh = r + hh
    ul = ((r - uh) + hh) + tail
    vh = uh + ul
    return k, vh, (uh - vh) + ul


@_inl
def _expm1_fast(x):
    """``expm1_inline`` by ``_exp_core_f``: the same bits for every x."""
    xc = x if x < 710.0 else 710.0
    xc = xc if xc > -40.0 else -40.0
    k, uh, ul = _exp_core_f(xc, 0.0)
    hi, lo = _expm1_parts(k if k < 512 else 512, uh, ul)
    small = hi + lo
    p = 1.0 + uh
    p = p + (((1.0 - p) + uh) + ul)
    k1 = k >> 1
    big = (p * _pow2(k1)) * _pow2(k - k1)
    res = big if k > 512 else small
    res = x if abs(x) < 5.551115123125783e-17 else res
    return res if x == x else x


@_inl
def _tanh_fast(x):
    """``tanh_inline`` by ``_exp_core_f`` and ``_dd_div_f``: the same bits for every x
    (the quotient is at least 3.7e-9 wherever it is not replaced by x)."""
    a = abs(x)
    ac = a if a < 20.0 else 20.0
    k, uh, ul = _exp_core_f(-2.0 * ac, 0.0)
    th, tl = _expm1_parts(k, uh, ul)
    dh = 2.0 + th
    dl = ((2.0 - dh) + th) + tl
    r = _dd_div_f(-th, -tl, dh, dl)
    res = r if x > 0.0 else -r
    res = x if a < 3.725290298461914e-09 else res
    return res if x == x else x


#: |x| up to which ``sigmoid_fast_inline`` / ``softplus_fast_inline`` give the plain bits
SIGMOID_FAST_BOUND = 600.0
SOFTPLUS_FAST_BOUND = 300.0


@_inl
def _exp_neg_dd_f(a):
    """``_exp_neg_dd`` for 0 <= a <= 700: 2^k is normal, so one product by it rounds
    exactly as the two products by 2^k1 and 2^k2 (the first of them is exact)."""
    k, ph, pl = _exp_fast(-a, 0.0)
    s = _pow2(k)
    return ph * s, pl * s


@_inl
def _sigmoid_fast(x):
    """``sigmoid_inline`` for |x| <= SIGMOID_FAST_BOUND (the same bits there)."""
    a = abs(x)
    eh, el = _exp_neg_dd_f(a)
    dh = 1.0 + eh
    dl = ((1.0 - dh) + eh) + el
    nh = 1.0 if x >= 0.0 else eh
    nl = 0.0 if x >= 0.0 else el
    return _dd_div_f(nh, nl, dh, dl)


@_inl
def _log1p_dd_f(eh, el):
    """``_log1p_dd`` with ``_two_prod_f`` (the same bits for eh >= 2**-433 or eh = 0)."""
    u = 1.0 + eh
    c = ((1.0 - u) + eh) + el
    dk, f = _log_reduce(u)
    k0 = eh < 0.41421356237309503
    f = eh if k0 else f
    dk = 0.0 if k0 else dk
    c = el if k0 else c
    f2h, f2l = _two_prod_f(f, f)
    hfh = 0.5 * f2h
    hfl = 0.5 * f2l
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    sr = s * (hfh + (t2 + t1))
    a = dk * _LN2_HI
    b = f - hfh
    be = (f - b) - hfh
    hi = a + b
    bv = hi - a
    lo = (a - (hi - bv)) + (b - bv)
    lo = lo + (be + ((sr - hfl) + (dk * _LN2_LO + c / u)))
    return hi, lo


@_inl
def _softplus_fast(x):
    """``softplus_inline`` for |x| <= SOFTPLUS_FAST_BOUND (the same bits there)."""
    a = abs(x)
    eh, el = _exp_neg_dd_f(a)
    lh, ll = _log1p_dd_f(eh, el)
    xp = x if x > 0.0 else 0.0
    sh = xp + lh
    bv = sh - xp
    se = (xp - (sh - bv)) + (lh - bv)
    return sh + (se + ll)


if _FMA:
    expm1_fast_inline = _expm1_fast
    tanh_fast_inline = _tanh_fast
    sigmoid_fast_inline = _sigmoid_fast
    softplus_fast_inline = _softplus_fast
else:   # the plain functions (the same bits; no FMA on this target)
    expm1_fast_inline = expm1_inline
    tanh_fast_inline = tanh_inline
    sigmoid_fast_inline = sigmoid_inline
    softplus_fast_inline = softplus_inline


# --------------------------------------------------------------------------- erf
# w(z) = erf(sqrt z)/sqrt z - 1 on z in [0, 1.5625] (degree 15, |error| < 1.3e-17)
_W = (0.1283791670955126, -0.37612638903183754, 0.11283791670955125,
      -0.026866170645131065, 0.00522397762544008, -0.000854832702330651,
      0.00012055332975294446, -1.492565015624643e-05, 1.6462109868483866e-06,
      -1.6365771733560044e-07, 1.4806321260478288e-08, -1.2282883578607278e-09,
      9.373461822294808e-11, -6.485100889205401e-12, 3.7505811555945966e-13,
      -1.3481562530009571e-14)
# g(t) = erfc(a) e^(a^2) (a + 1), t = 1/(a + 1), a in [1, 6]; in y = (t - 9/28) * 5.6
_G = (0.7591891298174532, 0.10547128506102846, -0.007366971877198329, -0.002659525458108354,
      0.0005139646872272778, 4.973610649975539e-05, -3.579367333687377e-05,
      4.70638031027154e-06, 1.146516789486318e-06, -6.332888213631413e-07,
      1.0183284758996574e-07, 1.687449693641365e-08, -1.389892375117321e-08,
      3.5098814823044775e-09, -7.031135294261285e-11, -3.2693290475660556e-10,
      1.3079537065266042e-10, -4.431537761871092e-12, -7.651399834890213e-12)
_G_MID = 0.32142857142857145
_G_SCALE = 5.6
(_W0, _W1, _W2, _W3, _W4, _W5, _W6, _W7, _W8, _W9, _W10, _W11, _W12, _W13, _W14,
 _W15) = _W
(_G0, _G1, _G2, _G3, _G4, _G5, _G6, _G7, _G8, _G9, _G10, _G11, _G12, _G13, _G14, _G15,
 _G16, _G17, _G18) = _G


@_inl
def erf_inline(x):
    """Error function within 1 ulp."""
    # |x| <= 1.125: x + x w(z), the last Horner step, z = x^2 and x w as double-doubles
    xs = x if abs(x) <= 1.125 else 1.125    # NaN -> 1.125 (fixed at the end)
    zh, zl = _two_prod(xs, xs)
    q = _W15
    q = q * zh + _W14
    q = q * zh + _W13
    q = q * zh + _W12
    q = q * zh + _W11
    q = q * zh + _W10
    q = q * zh + _W9
    q = q * zh + _W8
    q = q * zh + _W7
    q = q * zh + _W6
    q = q * zh + _W5
    q = q * zh + _W4
    q = q * zh + _W3
    q = q * zh + _W2
    zq = zh * q
    th = _W1 + zq                           # Fast2Sum: |zq| <= 0.14 < |_W1|
    tl = (_W1 - th) + zq
    ph, pe = _two_prod(zh, th)
    pe = pe + (zh * tl + zl * (_W1 + (2.0 * _W2) * zh))   # + w'(z) zl
    wh = _W0 + ph                           # TwoSum
    bv = wh - _W0
    wl = ((_W0 - (wh - bv)) + (ph - bv)) + pe
    bh, be = _two_prod(xs, wh)
    be = be + xs * wl
    sm = xs + bh                            # Fast2Sum: |bh| <= 0.27 |x|
    small = sm + (((xs - sm) + bh) + be)
    # 1.125 < |x| < 6: 1 - erfc
    a = abs(x)
    a = a if a < 6.0 else 6.0               # NaN -> 6
    a = a if a > 1.0 else 1.0
    t = 1.0 / (a + 1.0)
    y = (t - _G_MID) * _G_SCALE
    g = _G18
    g = g * y + _G17
    g = g * y + _G16
    g = g * y + _G15
    g = g * y + _G14
    g = g * y + _G13
    g = g * y + _G12
    g = g * y + _G11
    g = g * y + _G10
    g = g * y + _G9
    g = g * y + _G8
    g = g * y + _G7
    g = g * y + _G6
    g = g * y + _G5
    g = g * y + _G4
    g = g * y + _G3
    g = g * y + _G2
    g = g * y + _G1
    g = g * y + _G0
    s = a * _SPLIT
    ah = s - (s - a)
    al = a - ah
    k, p, _ = _exp_fast(-(ah * ah), -(al * (a + ah)))   # exp(-a^2), -a^2 split exactly
    erfc = (p * _pow2(k)) * (t * g)
    big = 1.0 - erfc
    big = big if x > 0.0 else -big
    res = small if abs(x) <= 1.125 else big
    # |x| < 2**-500: erf(x) = (2/sqrt pi) x to 2**-1000 relative; scaled so that the product
    # is formed on a normal number (subnormal x: rounded once more, to the subnormal grid)
    tiny = ((x * 4.149515568880993e+180) * 1.1283791670955126) * 2.409919865102884e-181
    res = tiny if abs(x) < 3.054936363499605e-151 else res
    res = x if x == 0.0 else res            # keeps the sign of zero
    return res if x == x else x


# --------------------------------------------------------------------------- sin, cos
_INVPIO2 = 6.36619772367581382433e-01
_PIO2_1 = 1.57079632673412561417e+00    # first 33 bits of pi/2
_PIO2_2 = 6.07710050630396597660e-11    # next 33 bits
_PIO2_3 = 2.02226624871116645580e-21    # next 33 bits
_PIO2_3T = 8.47842766036889956997e-32   # pi/2 - (_PIO2_1 + _PIO2_2 + _PIO2_3)
_SINCOS_LIMIT = 1647099.0               # < 2**20 pi/2: |n| < 2**20, fn * _PIO2_i exact

_S1 = -1.66666666666666324348e-01
_S2 = 8.33333333332248946124e-03
_S3 = -1.98412698298579493134e-04
_S4 = 2.75573137070700676789e-06
_S5 = -2.50507602534068634195e-08
_S6 = 1.58969099521155010221e-10
_C1 = 4.16666666666666019037e-02
_C2 = -1.38888888888741095749e-03
_C3 = 2.48015872894767294178e-05
_C4 = -2.75573143513906633035e-07
_C5 = 2.08757232129817482790e-09
_C6 = -1.13596475577881948265e-11


@_inl
def _rem_pio2_medium(x):
    """|x| <= _SINCOS_LIMIT -> (n, y0, y1): x = n pi/2 + y0 + y1, |y0| <= pi/4 (about),
    y1 the double-double tail.  Every product is exact; the subtractions are compensated."""
    t = x * _INVPIO2 + _ROUND
    fn = t - _ROUND
    n = _bits(t) - _ROUND_BITS
    r1 = x - fn * _PIO2_1                   # exact
    a2 = fn * _PIO2_2                       # exact
    r2 = r1 - a2
    e2 = (r1 - r2) - a2
    a3 = fn * _PIO2_3                       # exact
    r3 = r2 - a3
    e3 = (r2 - r3) - a3
    tail = (e2 + e3) - fn * _PIO2_3T
    y0 = r3 + tail
    y1 = (r3 - y0) + tail
    return n, y0, y1


@_inl
def _ksin(x, y):
    z = x * x
    w = z * z
    r = _S2 + z * (_S3 + z * _S4) + z * w * (_S5 + z * _S6)
    v = z * x
    return x - ((z * (0.5 * y - v * r) - y) - v * _S1)


@_inl
def _kcos(x, y):
    z = x * x
    w = z * z
    r = z * (_C1 + z * (_C2 + z * _C3)) + w * w * (_C4 + z * (_C5 + z * _C6))
    hz = 0.5 * z
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + (z * r - x * y))


# 2/pi in 24-bit chunks: 2/pi = sum _IPIO2[i] 2**(-24 (i + 1)) (mpmath, 1536 bits)
_IPIO2 = np.array([
    0xA2F983, 0x6E4E44, 0x1529FC, 0x2757D1, 0xF534DD, 0xC0DB62, 0x95993C, 0x439041,
    0xFE5163, 0xABDEBB, 0xC561B7, 0x246E3A, 0x424DD2, 0xE00649, 0x2EEA09, 0xD1921C,
    0xFE1DEB, 0x1CB129, 0xA73EE8, 0x8235F5, 0x2EBB44, 0x84E99C, 0x7026B4, 0x5F7E41,
    0x3991D6, 0x398353, 0x39F49C, 0x845F8B, 0xBDF928, 0x3B1FF8, 0x97FFDE, 0x05980F,
    0xEF2F11, 0x8B5A0A, 0x6D1F6D, 0x367ECF, 0x27CB09, 0xB74F46, 0x3F669E, 0x5FEA2D,
    0x7527BA, 0xC7EBE5, 0xF17B3D, 0x0739F7, 0x8A5292, 0xEA6BFB, 0x5FB11F, 0x8D5D08,
    0x560330, 0x46FC7B, 0x6BABF0, 0xCFBC20, 0x9AF436, 0x1DA9E3, 0x91615E, 0xE61B08,
    0x659985, 0x5F14A0, 0x68408D, 0xFFD880, 0x4D7327, 0x310606, 0x1556CA, 0x73A8C9,

], dtype=np.int64)
_PH_CHUNKS = 10
_PIO2_H = 1.5707963267948966
_PIO2_L = 6.123233995736766e-17


@helper
def _rem_pio2_large(x):
    """Payne-Hanek for finite |x| >= 2**20: (n, y0, y1) with x = n pi/2 + y0 + y1,
    |y0 + y1| <= pi/4, y1 the double-double tail.

    x = m 2**e (m < 2**53 an integer, e >= -32).  Chunks j of 2/pi with weight
    ``m 2**(e - 24 (j + 1)) >= 4`` add multiples of 4 to x 2/pi: skipped (the first kept
    chunk is j0).  N = m * (the next ten chunks) is computed exactly in 24-bit limbs
    (int64 arithmetic); the dropped tail is below 2**-162 (in units of pi/2), far below
    the smallest reduced argument of any double (about 2**-61).  With the binary point
    at bit B of N: n = the bits above it (mod 4), rounded to nearest; the signed
    fraction (as an exact integer, two's complement when negative) becomes a
    double-double and is multiplied by pi/2 (double-double)."""
    ix = _bits(x) & 0x7FFFFFFFFFFFFFFF
    e = (ix >> 52) - 1075
    m = (ix & 0x000FFFFFFFFFFFFF) | 0x0010000000000000
    j0 = (e - 2) // 24
    j0 = j0 if j0 > 0 else 0
    sh = e - 24 * j0                        # in [-32, 25]
    ml = (m & 0xFFFFFF, (m >> 24) & 0xFFFFFF, m >> 48)
    nl = 14
    acc = np.zeros(nl, dtype=np.int64)      # N = sum acc[p] 2**(24 p)
    for i in range(_PH_CHUNKS):
        c = _IPIO2[j0 + i]
        base = _PH_CHUNKS - 1 - i
        acc[base] += ml[0] * c
        acc[base + 1] += ml[1] * c
        acc[base + 2] += ml[2] * c
    carry = np.int64(0)
    for p in range(nl):
        v = acc[p] + carry
        acc[p] = v & 0xFFFFFF
        carry = v >> 24
    # x 2/pi = N 2**(sh - 240): the bit of weight 2**0 is bit B of N
    b = 24 * _PH_CHUNKS - sh
    n = np.int64(0)
    for q in range(3):                      # bits B - 1 (the half), B, B + 1
        bit = b - 1 + q
        v = (acc[bit // 24] >> (bit % 24)) & 1
        n += v << q
    half = n & 1
    n = ((n >> 1) + half) & 3               # round to nearest
    # fraction bits (below B) as limbs; negated (2**B - F) when rounding up
    borrow = np.int64(0)
    fh = 0.0
    fl = 0.0
    for p in range(nl):
        lo_bit = 24 * p
        if lo_bit >= b:
            break
        v = acc[p]
        if lo_bit + 24 > b:
            v = v & ((np.int64(1) << (b - lo_bit)) - 1)
        if half != 0:
            v = -v - borrow
            borrow = np.int64(1) if v < 0 else np.int64(0)
            v = v & 0xFFFFFF
            if lo_bit + 24 > b:
                v = v & ((np.int64(1) << (b - lo_bit)) - 1)
        part = np.float64(v) * _pow2(lo_bit - b)
        s = fh + part
        bv = s - fh
        fl += (fh - (s - bv)) + (part - bv)
        fh = s
    f = fh + fl
    flo = (fh - f) + fl
    if half != 0:
        f = -f
        flo = -flo
    ph, pe = _two_prod(f, _PIO2_H)
    pe = pe + (f * _PIO2_L + flo * _PIO2_H)
    y0 = ph + pe
    y1 = (ph - y0) + pe
    if x < 0.0:
        return -n, -y0, -y1
    return n, y0, y1


@_inl
def _sincos_eval(x, n, y0, y1, want_cos):
    s = _ksin(y0, y1)
    c = _kcos(y0, y1)
    q = (n + (1 if want_cos else 0)) & 3
    res = s if (q & 1) == 0 else c
    res = -res if (q & 2) != 0 else res
    return res


@_inl
def _sin_medium(x):
    a = abs(x)
    xc = x if a <= _SINCOS_LIMIT else 0.0    # NaN/inf/huge -> 0 (fixed by the caller)
    n, y0, y1 = _rem_pio2_medium(xc)
    res = _sincos_eval(xc, n, y0, y1, False)
    res = x if a < 7.450580596923828e-09 else res
    return res


@_inl
def _cos_medium(x):
    a = abs(x)
    xc = x if a <= _SINCOS_LIMIT else 0.0
    n, y0, y1 = _rem_pio2_medium(xc)
    res = _sincos_eval(xc, n, y0, y1, True)
    return res


@helper
def _sincos_large(x, want_cos):
    """sin or cos for finite |x| > _SINCOS_LIMIT (Payne-Hanek); NaN for inf/NaN."""
    if not (abs(x) < _INF):
        return x - x
    n, y0, y1 = _rem_pio2_large(x)
    return _sincos_eval(x, n, y0, y1, want_cos)


@_inl
def sin_inline(x):
    """Sine within 1 ulp for every finite x (Payne-Hanek beyond |x| > 1647099)."""
    if abs(x) <= _SINCOS_LIMIT:
        return _sin_medium(x)
    return _sincos_large(x, False)


@_inl
def cos_inline(x):
    """Cosine within 1 ulp for every finite x (Payne-Hanek beyond |x| > 1647099)."""
    if abs(x) <= _SINCOS_LIMIT:
        return _cos_medium(x)
    return _sincos_large(x, True)


# --------------------------------------------------------------------------- scalar entries
@helper
def exp(x):
    """``exp_inline(x)`` as a standalone compiled helper."""
    return exp_inline(x)


@helper
def expm1(x):
    """``expm1_inline(x)`` as a standalone compiled helper."""
    return expm1_inline(x)


@helper
def log(x):
    """``log_inline(x)`` as a standalone compiled helper."""
    return log_inline(x)


@helper
def log1p(x):
    """``log1p_inline(x)`` as a standalone compiled helper."""
    return log1p_inline(x)


@helper
def tanh(x):
    """``tanh_inline(x)`` as a standalone compiled helper."""
    return tanh_inline(x)


@helper
def erf(x):
    """``erf_inline(x)`` as a standalone compiled helper."""
    return erf_inline(x)


@helper
def sigmoid(x):
    """``sigmoid_inline(x)`` as a standalone compiled helper."""
    return sigmoid_inline(x)


@helper
def softplus(x):
    """``softplus_inline(x)`` as a standalone compiled helper."""
    return softplus_inline(x)


@helper
def sin(x):
    """``sin_inline(x)`` as a standalone compiled helper."""
    return sin_inline(x)


@helper
def cos(x):
    """``cos_inline(x)`` as a standalone compiled helper."""
    return cos_inline(x)


# --------------------------------------------------------------------------- array kernels
def _chunks(x, out):
    """The iterations of an array kernel: chunks of ``_CHUNK`` elements."""
    return (x.shape[0] + _CHUNK - 1) // _CHUNK


# An exponential, logarithm, sine, ... costs about as much as eight simple element
# operations (~1.4 ns per element with 512-bit vectors, ~2.4 ns with 256-bit): the array
# kernels and the softmax rows count each element as that much work, so they run in
# parallel from SERIAL_WORK / 8 elements (a 1024 x 64 log-softmax took ~150 us on one
# thread, against ~15 us for a parallel launch).
_EXP_PER_ELEMENT = 8


def _size(x, out):
    """The work of an array kernel: its elements times ``_EXP_PER_ELEMENT`` (small
    arrays run serially)."""
    return x.shape[0] * _EXP_PER_ELEMENT


@span_kernel(iterations=_chunks, work=_size)
def exp_array(x, out, c0, c1):
    """out[i] = exp(x[i])."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        for i in range(hi - lo):
            os[i] = exp_inline(xs[i])


@span_kernel(iterations=_chunks, work=_size)
def expm1_array(x, out, c0, c1):
    """out[i] = expm1(x[i])."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        for i in range(hi - lo):
            os[i] = expm1_inline(xs[i])


@span_kernel(iterations=_chunks, work=_size)
def log_array(x, out, c0, c1):
    """out[i] = log(x[i])."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        for i in range(hi - lo):
            os[i] = log_inline(xs[i])


@span_kernel(iterations=_chunks, work=_size)
def log1p_array(x, out, c0, c1):
    """out[i] = log1p(x[i])."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        for i in range(hi - lo):
            os[i] = log1p_inline(xs[i])


@span_kernel(iterations=_chunks, work=_size)
def tanh_array(x, out, c0, c1):
    """out[i] = tanh(x[i])."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        for i in range(hi - lo):
            os[i] = tanh_inline(xs[i])


@span_kernel(iterations=_chunks, work=_size)
def erf_array(x, out, c0, c1):
    """out[i] = erf(x[i])."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        for i in range(hi - lo):
            os[i] = erf_inline(xs[i])


@span_kernel(iterations=_chunks, work=_size)
def sigmoid_array(x, out, c0, c1):
    """out[i] = sigmoid(x[i])."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        for i in range(hi - lo):
            os[i] = sigmoid_inline(xs[i])


@span_kernel(iterations=_chunks, work=_size)
def softplus_array(x, out, c0, c1):
    """out[i] = softplus(x[i])."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        for i in range(hi - lo):
            os[i] = softplus_inline(xs[i])


@span_kernel(iterations=_chunks, work=_size)
def sin_array(x, out, c0, c1):
    """out[i] = sin(x[i]): a vectorised pass for |x| <= 1647099 (larger and non-finite
    elements keep their input value), then, only in chunks that have any, a scalar
    Payne-Hanek pass over them (so ``out`` may be ``x``)."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        big = 0
        for i in range(hi - lo):
            v = xs[i]
            inr = abs(v) <= _SINCOS_LIMIT
            big += not inr
            r = _sin_medium(v)
            os[i] = r if inr else v
        if big > 0:
            for i in range(hi - lo):
                v = os[i]
                if not (abs(v) <= 1.0):
                    os[i] = _sincos_large(v, False)



@span_kernel(iterations=_chunks, work=_size)
def cos_array(x, out, c0, c1):
    """out[i] = cos(x[i]): a vectorised pass for |x| <= 1647099 (larger and non-finite
    elements keep their input value), then, only in chunks that have any, a scalar
    Payne-Hanek pass over them (so ``out`` may be ``x``)."""
    n = x.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x[lo:hi]
        os = out[lo:hi]
        big = 0
        for i in range(hi - lo):
            v = xs[i]
            inr = abs(v) <= _SINCOS_LIMIT
            big += not inr
            r = _cos_medium(v)
            os[i] = r if inr else v
        if big > 0:
            for i in range(hi - lo):
                v = os[i]
                if not (abs(v) <= 1.0):
                    os[i] = _sincos_large(v, True)
