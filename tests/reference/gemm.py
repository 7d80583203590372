"""Oracle of the library's float64 matrix product (API: every output one fused
multiply-add chain over k in order, from +0.0).  Exact rational arithmetic for each fma,
plain loops; imports nothing from hmath_dl."""

import math
from fractions import Fraction

import numpy as np


def fma(a, b, c):
    """``a * b + c`` rounded once to float64 (round half to even), from the exact value."""
    a, b, c = float(a), float(b), float(c)
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        # IEEE 754: an exact zero is +0 in round-to-nearest, except that the sum of two
        # zeros of the same sign keeps it (the product's sign is sign(a) xor sign(b))
        prod_zero = a == 0 or b == 0
        prod_neg = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
        if prod_zero and c == 0 and prod_neg and math.copysign(1.0, c) < 0:
            return -0.0
        return 0.0
    return exact.numerator / exact.denominator


def matmul_2d(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    M, K = a.shape
    N = b.shape[1]
    out = np.empty((M, N))
    for m in range(M):
        for n in range(N):
            acc = 0.0
            for k in range(K):
                acc = fma(a[m, k], b[k, n], acc)
            out[m, n] = acc
    return out


def matmul(a, b):
    """numpy.matmul semantics (1-D promotion, broadcast batch axes), chains as above."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    ab = np.broadcast_to(a2, batch + a2.shape[-2:])
    bb = np.broadcast_to(b2, batch + b2.shape[-2:])
    res = np.empty(batch + (a2.shape[-2], b2.shape[-1]))
    for idx in np.ndindex(*batch):
        res[idx] = matmul_2d(ab[idx], bb[idx])
    if a.ndim == 1:
        res = res[..., 0, :]
    if b.ndim == 1:
        res = res[..., 0]
    return res
