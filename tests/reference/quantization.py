"""Slow, obviously correct oracles for INT8 quantization and the int8 GEMM, written from
API.md §3 with plain Python floats / ints (Python's ``round`` on a float is an exact
round-half-to-even; Python ints never overflow).  Never derived from the kernels."""

import itertools

import numpy as np

TINY = 2.2250738585072014e-308  # smallest positive normal double
INT32_MIN = -(2 ** 31)
INT32_MAX = 2 ** 31 - 1


class Overflow(Exception):
    """The oracle's verdict that the library must raise NumericOverflow."""


def _clip(v, lo, hi):
    return lo if v < lo else hi if v > hi else v


def _is_valid_scale(s):
    return s == s and s != float("inf") and s >= TINY


def slice_params(values, symmetric):
    """(scale, zero point) of one slice (a list of Python floats)."""
    if symmetric:
        amax = max(abs(v) for v in values)
        scale = 1.0 if amax == 0.0 else amax / 127.0
        if not _is_valid_scale(scale):
            raise Overflow(scale)
        return scale, 0
    lo = min(min(values), 0.0)
    hi = max(max(values), 0.0)
    scale = 1.0 if (hi == 0.0 and lo == 0.0) else (hi - lo) / 255.0
    if not _is_valid_scale(scale):
        raise Overflow(scale)
    zp = int(_clip(round(-128.0 - lo / scale), -128, 127))
    return scale, zp


def quantize_value(v, scale, zp, symmetric):
    if symmetric:
        return int(_clip(round(v / scale), -127, 127))
    return int(_clip(round(v / scale) + zp, -128, 127))


def quantize(symmetric, axis, x):
    """Returns (int8 values, float64 scales, int64 zero points) or raises Overflow.
    ``axis`` is None or non-negative."""
    x = np.asarray(x, dtype=np.float64)
    shape = x.shape
    nch = 1 if axis is None else shape[axis]
    slices = [[] for _ in range(nch)]
    for idx in itertools.product(*[range(s) for s in shape]):
        c = 0 if axis is None else idx[axis]
        slices[c].append(float(x[idx]))
    params = [slice_params(s, symmetric) for s in slices]
    q = np.zeros(shape, dtype=np.int8)
    for idx in itertools.product(*[range(s) for s in shape]):
        c = 0 if axis is None else idx[axis]
        scale, zp = params[c]
        q[idx] = quantize_value(float(x[idx]), scale, zp, symmetric)
    scales = np.array([p[0] for p in params], dtype=np.float64)
    zps = np.array([p[1] for p in params], dtype=np.int64)
    return q, scales, zps


def dequantize(values, scales, zps, axis):
    """scale * (q - zp) per element, in Python floats; raises Overflow if not finite."""
    values = np.asarray(values)
    out = np.zeros(values.shape, dtype=np.float64)
    for idx in itertools.product(*[range(s) for s in values.shape]):
        c = 0 if axis is None else idx[axis]
        v = float(scales[c]) * (int(values[idx]) - int(zps[c]))
        if v != v or abs(v) == float("inf"):
            raise Overflow(idx)
        out[idx] = v
    return out


def int8_gemm(qa, sa, za, qb, sb, zb):
    """Exact GEMM.  ``sa``/``za`` have length M or 1, ``sb``/``zb`` length N or 1.

    Returns the float64 result, or raises Overflow with ``("acc", i, j, value)`` for the
    first (row-major) accumulator outside int32, else ``("float", i, j)`` for the first
    non-finite result."""
    qa = [[int(v) for v in row] for row in np.asarray(qa)]
    qb = [[int(v) for v in row] for row in np.asarray(qb)]
    m, k = len(qa), len(qa[0])
    n = len(qb[0])
    pick = lambda arr, i: arr[i] if len(arr) > 1 else arr[0]  # noqa: E731
    accs = [[0] * n for _ in range(m)]
    for i in range(m):
        zai = int(pick(za, i))
        for j in range(n):
            zbj = int(pick(zb, j))
            accs[i][j] = sum((qa[i][t] - zai) * (qb[t][j] - zbj) for t in range(k))
    for i in range(m):
        for j in range(n):
            if not INT32_MIN <= accs[i][j] <= INT32_MAX:
                raise Overflow(("acc", i, j, accs[i][j]))
    out = np.zeros((m, n), dtype=np.float64)
    for i in range(m):
        for j in range(n):
            v = (float(pick(sa, i)) * float(pick(sb, j))) * float(accs[i][j])
            if v != v or abs(v) == float("inf"):
                raise Overflow(("float", i, j))
            out[i, j] = v
    return out
