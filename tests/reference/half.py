"""Slow, obviously correct oracles for FP16/BF16 rounding and decoding, the reduced GEMM,
the loss scaler and the gradient norm — written from API.md, never from the kernels.

Rounding and decoding use exact rational arithmetic (``fractions.Fraction``).
"""

from fractions import Fraction
import math

import numpy as np

# name -> (fraction bits m, exponent bias)
FORMATS = {"FP16": (10, 15), "BF16": (7, 127)}


class Overflow(Exception):
    """The value rounds to +-inf in the 16-bit format."""


def decode(fmt, pattern):
    """Exact value (Fraction) of a 16-bit pattern, or None for inf/NaN patterns.
    Returns (value, negative) so that -0 is distinguishable."""
    m, bias = FORMATS[fmt]
    ebits = 15 - m
    sign = (pattern >> 15) & 1
    e = (pattern >> m) & ((1 << ebits) - 1)
    f = pattern & ((1 << m) - 1)
    if e == (1 << ebits) - 1:
        return None
    if e == 0:
        v = Fraction(f, 1 << m) * Fraction(2) ** (1 - bias)
    else:
        v = (1 + Fraction(f, 1 << m)) * Fraction(2) ** (e - bias)
    return (-v if sign else v), bool(sign)


def decode_float(fmt, pattern):
    """float64 value of a finite pattern (exact: every 16-bit value is a double)."""
    v, neg = decode(fmt, pattern)
    out = float(v)
    assert Fraction(out) == v
    return -0.0 if (neg and out == 0) else out


def _round_half_even(q: Fraction) -> int:
    """Nearest integer to the non-negative rational q, ties to even."""
    fl = q.numerator // q.denominator
    rem = q - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
        return fl + 1
    return fl


def round_bits(fmt, x):
    """16-bit pattern of the finite float ``x`` rounded once, half to even (Fraction
    arithmetic straight from the exact value of x).  Raises Overflow."""
    m, bias = FORMATS[fmt]
    ebits = 15 - m
    emax = (1 << ebits) - 2 - bias          # largest normal exponent
    emin = 1 - bias
    x = float(x)
    assert math.isfinite(x)
    sign = 1 if math.copysign(1.0, x) < 0 else 0
    a = abs(Fraction(x))
    if a == 0:
        return sign << 15
    # exponent of a: 2**e <= a < 2**(e+1)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    assert Fraction(2) ** e <= a < Fraction(2) ** (e + 1)
    e = max(e, emin)
    quantum = Fraction(2) ** (e - m)
    n = _round_half_even(a / quantum)
    if n == 1 << (m + 1):                   # carry into the next binade
        n >>= 1
        e += 1
    if e > emax:
        raise Overflow(x)
    if n < (1 << m):                        # subnormal (only possible at e == emin) or zero
        assert e == emin
        return (sign << 15) | n
    return (sign << 15) | ((e + bias) << m) | (n - (1 << m))


def round_bits_array(fmt, x):
    """``round_bits`` over an array (uint16 result of x's shape)."""
    x = np.asarray(x, dtype=np.float64)
    return np.array([round_bits(fmt, v) for v in x.reshape(-1)],
                    dtype=np.uint16).reshape(x.shape)


def representable(fmt):
    """All finite non-negative values of the format, ascending, as float64 (exact)."""
    m, bias = FORMATS[fmt]
    top = ((1 << (15 - m)) - 1) << m        # first inf pattern
    return np.array([decode_float(fmt, p) for p in range(top)], dtype=np.float64)


def max_finite(fmt):
    m, bias = FORMATS[fmt]
    return float((2 - Fraction(1, 1 << m)) * Fraction(2) ** ((1 << (15 - m)) - 2 - bias))


def reduced_gemm_f32(a16, b16):
    """The specified reduced GEMM on operands already rounded to 16-bit values (float64
    arrays): float32 products, float32 accumulation for k = 0..K-1 in order, vectorised over
    (i, j).  Returns (float64 result, overflowed)."""
    a32 = np.asarray(a16, dtype=np.float32)
    b32 = np.asarray(b16, dtype=np.float32)
    assert np.array_equal(a32.astype(np.float64), a16) and np.array_equal(b32.astype(np.float64), b16)
    m, k = a32.shape
    n = b32.shape[1]
    acc = np.zeros((m, n), dtype=np.float32)
    overflow = False
    with np.errstate(over="ignore", invalid="ignore"):
        for kk in range(k):
            p = np.multiply(a32[:, kk:kk + 1], b32[kk:kk + 1, :], dtype=np.float32)
            overflow |= not np.isfinite(p).all()
            acc = np.add(acc, p, dtype=np.float32)
            overflow |= not np.isfinite(acc).all()
    return acc.astype(np.float64), overflow


def euclidean_norm(arrays):
    """sqrt(sum of squares) over every entry, from the exact rational sum of squares,
    rounded to the nearest double (None when it exceeds the largest double)."""
    s = Fraction(0)
    for a in arrays:
        for v in np.asarray(a, dtype=np.float64).reshape(-1):
            s += Fraction(float(v)) ** 2
    if s == 0:
        return 0.0
    # sqrt(s) to ~120 significant bits with integers, then one rounding to float64
    shift = 240 - (s.numerator.bit_length() - s.denominator.bit_length())
    shift += shift % 2
    scaled = (s.numerator << shift) // s.denominator if shift >= 0 else \
        s.numerator // (s.denominator << -shift)
    root = Fraction(math.isqrt(scaled)) / Fraction(2) ** (shift // 2)
    try:
        return float(root)
    except OverflowError:
        return None


class ReferenceScaler:
    """The loss-scaler state machine of API.md, as plain Python."""

    MAX = 2.0 ** 24

    def __init__(self, scale, interval, steps=0):
        self.scale, self.interval, self.steps = scale, interval, steps

    def update(self, finite):
        if not finite:
            if self.scale / 2 == 0:
                raise Overflow(self.scale)
            return ReferenceScaler(self.scale / 2, self.interval, 0)
        steps = self.steps + 1
        if steps == self.interval:
            return ReferenceScaler(min(self.scale * 2, self.MAX), self.interval, 0)
        return ReferenceScaler(self.scale, self.interval, steps)
