"""Normalisation kernels (layer / instance / group / RMS / batch / weight norm).

Every normalisation here is "statistics over a *group* of elements, then a per-element
map".  A group is ``nseg`` segments of ``seglen`` contiguous elements, the ``j``-th one
starting at ``base + j * segstride`` of the flat input:

* layer / instance / group / RMS norm: group ``r`` is row ``r`` of a 2-D C-contiguous view
  (``nseg = 1``, ``base = r * n``);
* batch norm: group ``c`` is channel ``c`` of ``[N, C, S]`` (``nseg = N``,
  ``base = c * S``, ``segstride = C * S``, ``seglen = S``);
* weight norm: group ``i`` is slice ``i`` of ``[P, A, Q]`` along the middle axis
  (``nseg = P``, ``base = i * Q``, ``segstride = A * Q``, ``seglen = Q``).

Determinism: each group is reduced entirely inside one ``prange`` iteration, in a fixed
order (16 interleaved partial sums per segment, combined in a fixed tree, segments in
order), so results do not depend on the thread count.

Accuracy / overflow: statistics are two-pass (mean, then the mean of squared
deviations).  When a sum or a sum of squares is not finite although every input is,
the group is recomputed on inputs scaled by an exact power of two ``s = 2**-e`` chosen
so that ``max|x| * s < 1``; the normalised output is then
``(x s - mean_s) / sqrt(var_s + eps s**2)``, mathematically identical.  The fast path
uses ``s = 1`` (multiplying by 1.0 is exact).

Status codes (one int8 per group): 0 ok, 1 the group holds a NaN/inf input, 2 a result
is not representable.  The facades turn them into NonFiniteError / NumericOverflow.
"""

import math

import numpy as np
from numba import prange

from ._jit import helper, kernel

OK = 0
NONFINITE_INPUT = 1
OVERFLOW = 2

_HUGE = 1.0e300


@helper
def _seg_sum(x, start, n, s, m):
    """sum_i (x[start+i] * s - m) over one segment, 16 fixed partial sums."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = 0.0
    n16 = n - n % 16
    for i in range(0, n16, 16):
        j = start + i
        a0 += x[j] * s - m
        a1 += x[j + 1] * s - m
        a2 += x[j + 2] * s - m
        a3 += x[j + 3] * s - m
        a4 += x[j + 4] * s - m
        a5 += x[j + 5] * s - m
        a6 += x[j + 6] * s - m
        a7 += x[j + 7] * s - m
        b0 += x[j + 8] * s - m
        b1 += x[j + 9] * s - m
        b2 += x[j + 10] * s - m
        b3 += x[j + 11] * s - m
        b4 += x[j + 12] * s - m
        b5 += x[j + 13] * s - m
        b6 += x[j + 14] * s - m
        b7 += x[j + 15] * s - m
    t = (((a0 + b0) + (a1 + b1)) + ((a2 + b2) + (a3 + b3))) + \
        (((a4 + b4) + (a5 + b5)) + ((a6 + b6) + (a7 + b7)))
    for i in range(n16, n):
        t += x[start + i] * s - m
    return t


@helper
def _seg_sumsq(x, start, n, s, m):
    """sum_i (x[start+i] * s - m)**2 over one segment, 16 fixed partial sums."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = 0.0
    n16 = n - n % 16
    for i in range(0, n16, 16):
        j = start + i
        d0 = x[j] * s - m
        d1 = x[j + 1] * s - m
        d2 = x[j + 2] * s - m
        d3 = x[j + 3] * s - m
        d4 = x[j + 4] * s - m
        d5 = x[j + 5] * s - m
        d6 = x[j + 6] * s - m
        d7 = x[j + 7] * s - m
        e0 = x[j + 8] * s - m
        e1 = x[j + 9] * s - m
        e2 = x[j + 10] * s - m
        e3 = x[j + 11] * s - m
        e4 = x[j + 12] * s - m
        e5 = x[j + 13] * s - m
        e6 = x[j + 14] * s - m
        e7 = x[j + 15] * s - m
        a0 += d0 * d0
        a1 += d1 * d1
        a2 += d2 * d2
        a3 += d3 * d3
        a4 += d4 * d4
        a5 += d5 * d5
        a6 += d6 * d6
        a7 += d7 * d7
        b0 += e0 * e0
        b1 += e1 * e1
        b2 += e2 * e2
        b3 += e3 * e3
        b4 += e4 * e4
        b5 += e5 * e5
        b6 += e6 * e6
        b7 += e7 * e7
    t = (((a0 + b0) + (a1 + b1)) + ((a2 + b2) + (a3 + b3))) + \
        (((a4 + b4) + (a5 + b5)) + ((a6 + b6) + (a7 + b7)))
    for i in range(n16, n):
        d = x[start + i] * s - m
        t += d * d
    return t


@helper
def _group_sum(x, base, nseg, seglen, segstride, s, m):
    t = 0.0
    for j in range(nseg):
        t += _seg_sum(x, base + j * segstride, seglen, s, m)
    return t


@helper
def _group_sumsq(x, base, nseg, seglen, segstride, s, m):
    t = 0.0
    for j in range(nseg):
        t += _seg_sumsq(x, base + j * segstride, seglen, s, m)
    return t


@helper
def _group_all_finite(x, base, nseg, seglen, segstride):
    for j in range(nseg):
        st = base + j * segstride
        for i in range(seglen):
            v = x[st + i]
            if not (v - v == 0.0):
                return False
    return True


@helper
def _group_scale(x, base, nseg, seglen, segstride):
    """Power of two ``2**-e`` with ``max|x| * 2**-e`` in ``[0.5, 1)`` (1.0 for all zeros)."""
    mx = 0.0
    for j in range(nseg):
        st = base + j * segstride
        for i in range(seglen):
            v = abs(x[st + i])
            if v > mx:
                mx = v
    if mx == 0.0:
        return 1.0
    f, e = math.frexp(mx)
    if e < -1020:
        e = -1020  # 2**1020 is representable; max|x| * s >= 2**-54, squares stay normal
    return math.ldexp(1.0, -e)


@helper
def _group_stats(x, base, nseg, seglen, segstride, center):
    """(scale s, mean of x*s (0 when not centering), mean of (x*s - mean)**2, status)."""
    count = nseg * seglen
    s = 1.0
    m = 0.0
    if center:
        t = _group_sum(x, base, nseg, seglen, segstride, 1.0, 0.0)
        if not (t - t == 0.0):
            if not _group_all_finite(x, base, nseg, seglen, segstride):
                return 1.0, 0.0, 0.0, NONFINITE_INPUT
            s = _group_scale(x, base, nseg, seglen, segstride)
            t = _group_sum(x, base, nseg, seglen, segstride, s, 0.0)
        m = t / count
    q = _group_sumsq(x, base, nseg, seglen, segstride, s, m)
    if not (q - q == 0.0):
        if s != 1.0:
            return s, m, 0.0, OVERFLOW  # cannot happen: |x s - m| < 2
        if not _group_all_finite(x, base, nseg, seglen, segstride):
            return 1.0, 0.0, 0.0, NONFINITE_INPUT
        s = _group_scale(x, base, nseg, seglen, segstride)
        if center:
            m = _group_sum(x, base, nseg, seglen, segstride, s, 0.0) / count
        q = _group_sumsq(x, base, nseg, seglen, segstride, s, m)
    return s, m, q / count, OK


@helper
def _inv_std(v, eps, s):
    """1 / sqrt(v + eps * s * s), overflow-safe; 0 when the denominator is 0 (then every
    deviation is exactly 0)."""
    e = eps * s * s
    t = v + e
    if t == 0.0:
        return 0.0
    if t > 1.0e307:
        return 0.5 / math.sqrt(0.25 * v + 0.25 * e)
    return 1.0 / math.sqrt(t)


@kernel
def normalize_rows(x, rows, n, eps, center, out, status):
    """Row-wise normalisation of the C-contiguous ``[rows, n]`` array ``x`` (flat).

    ``center=True``: ``out = (x - mean) / sqrt(var + eps)`` (population variance) —
    layer, instance and group norm.  ``center=False``: ``out = x / sqrt(mean(x*x) + eps)``
    — RMS norm.  ``status[r]`` receives the row's status code.
    """
    for r in prange(rows):
        st = r * n
        s, m, v, code = _group_stats(x, st, 1, n, n, center)
        status[r] = code
        if code != OK:
            continue
        inv = _inv_std(v, eps, s)
        if s == 1.0:
            for i in range(n):
                out[st + i] = (x[st + i] - m) * inv
        else:
            for i in range(n):
                out[st + i] = (x[st + i] * s - m) * inv


@kernel
def batch_norm_train(x, N, C, S, eps, gamma, beta, out, mean, var, status):
    """Batch norm with batch statistics on the flat ``[N, C, S]`` array ``x``.

    ``out = gamma[c] * (x - mean_c) / sqrt(var_c + eps) + beta[c]``; ``mean[c]`` and
    ``var[c]`` receive the batch mean and population variance (unscaled; ``var`` may be
    inf when it is not representable even though ``out`` is).
    """
    count = N * S
    for c in prange(C):
        base = c * S
        s, m, v, code = _group_stats(x, base, N, S, C * S, True)
        status[c] = code
        if code != OK:
            continue
        mean[c] = m / s
        var[c] = (v / s) / s
        a = gamma[c] * _inv_std(v, eps, s)
        b = beta[c]
        for j in range(N):
            st = base + j * C * S
            for i in range(S):
                out[st + i] = (x[st + i] * s - m) * a + b
        # |x s - m| * inv <= sqrt(count): the output is finite unless gamma/beta are huge
        if abs(gamma[c]) * math.sqrt(count) * 1.001 + abs(b) > _HUGE:
            if not _group_all_finite(out, base, N, S, C * S):
                status[c] = OVERFLOW


@kernel
def batch_norm_apply(x, N, C, S, scale, shift, center, out, status):
    """``out = (x - center[c]) * scale[c] + shift[c]`` on the flat ``[N, C, S]`` ``x``
    (batch norm inference); ``status[c]`` is 1 when the channel's outputs are not all
    finite (the facade tells a non-finite input from an overflow)."""
    for c in prange(C):
        base = c * S
        a = scale[c]
        b = shift[c]
        m = center[c]
        bad = 0.0
        for j in range(N):
            st = base + j * C * S
            a0 = a1 = a2 = a3 = 0.0
            S4 = S - S % 4
            for i in range(0, S4, 4):
                y0 = (x[st + i] - m) * a + b
                y1 = (x[st + i + 1] - m) * a + b
                y2 = (x[st + i + 2] - m) * a + b
                y3 = (x[st + i + 3] - m) * a + b
                out[st + i] = y0
                out[st + i + 1] = y1
                out[st + i + 2] = y2
                out[st + i + 3] = y3
                a0 += y0 * 0.0
                a1 += y1 * 0.0
                a2 += y2 * 0.0
                a3 += y3 * 0.0
            for i in range(S4, S):
                y = (x[st + i] - m) * a + b
                out[st + i] = y
                a0 += y * 0.0
            bad += (a0 + a1) + (a2 + a3)
        status[c] = OK if bad == 0.0 else OVERFLOW


@kernel
def weight_norm_kernel(w, P, A, Q, magnitudes, out, status):
    """``out[p, i, q] = w[p, i, q] * magnitudes[i] / ||w[:, i, :]||`` on the flat
    ``[P, A, Q]`` array ``w``; the norm is computed with power-of-two scaling (no
    overflow or underflow in the squares).  status: 0 ok, 1 non-finite input,
    2 overflow, 3 zero slice."""
    for i in prange(A):
        base = i * Q
        if not _group_all_finite(w, base, P, Q, A * Q):
            status[i] = NONFINITE_INPUT
            continue
        s = _group_scale(w, base, P, Q, A * Q)
        q = _group_sumsq(w, base, P, Q, A * Q, s, 0.0)
        if q == 0.0:
            status[i] = 3
            continue
        # ||w|| = sqrt(q) / s ; out = w * mag / ||w|| = (w * s) * (mag / sqrt(q))
        f = magnitudes[i] / math.sqrt(q)
        status[i] = OK
        for j in range(P):
            st = base + j * A * Q
            for k in range(Q):
                out[st + k] = (w[st + k] * s) * f
        if not _group_all_finite(out, base, P, Q, A * Q):
            status[i] = OVERFLOW
