"""Softmax, log-softmax and their backward passes over the rows of a ``[R, C]`` array.

Per row, in a fixed order (the same bits on every CPU and for any thread count; rows run in
parallel): ``m = max_j x_j`` (exact, order-free), ``z_j = x_j - m``, ``e_j = exp(z_j)`` (the
library's own exp, :mod:`hmath_dl._kernels.libm`, within 1 ulp), ``s`` = the sum of the
``e_j`` as eight interleaved partial sums (``j = 8t + r`` into partial ``r``), combined
``((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))``, then the tail in increasing ``j``.

* ``softmax_rows(x, out, False)``: ``out_j = e_j / s``;
  ``softmax_rows(x, out, True)``:  ``out_j = z_j - log(s)`` (own log).
* ``softmax_backward_rows(y, g, out, False)``: ``out_j = y_j (g_j - t)``, ``t = sum_j g_j y_j``;
  ``softmax_backward_rows(y, g, out, True)``: ``out_j = g_j - exp(y_j) t``, ``t = sum_j g_j``
  (``y`` the forward output; the sums in the order above).
"""

import numpy as np

from ._jit import helper, span_kernel
from .libm import _wide, exp_inline, log_inline
from .reduce import _row_sum as _sum8   # the eight-partial fixed order


@helper
def _row_max(a):
    """max_j a_j of a non-empty 1-D array, as eight interleaved partial maxima (the
    maximum is exact, so the order does not change it; only which of two equal zeros of
    opposite sign is kept, which no result below depends on: it matters only through
    ``z_j - log(s)`` with ``s = 1``, i.e. a single maximal element)."""
    n = a.shape[0]
    if n < 8:
        m = a[0]
        for j in range(1, n):
            m = max(m, a[j])
        return m
    m0 = a[0]
    m1 = a[1]
    m2 = a[2]
    m3 = a[3]
    m4 = a[4]
    m5 = a[5]
    m6 = a[6]
    m7 = a[7]
    i = 8
    while i + 8 <= n:
        m0 = max(m0, a[i])
        m1 = max(m1, a[i + 1])
        m2 = max(m2, a[i + 2])
        m3 = max(m3, a[i + 3])
        m4 = max(m4, a[i + 4])
        m5 = max(m5, a[i + 5])
        m6 = max(m6, a[i + 6])
        m7 = max(m7, a[i + 7])
        i += 8
    m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    while i < n:
        m = max(m, a[i])
        i += 1
    return m


@span_kernel(iterations=lambda x, out, log: x.shape[0], work=lambda x, out, log: x.size)
def softmax_rows(x, out, log, r0, r1):
    """Rows ``r0 .. r1-1`` of the softmax (or log-softmax) of ``x`` into ``out`` (module
    docstring); a span kernel, called as ``softmax_rows(x, out, log)``."""
    c = x.shape[1]
    for r in range(r0, r1):
        _wide()
        xr = x[r]
        o = out[r]
        m = _row_max(xr)
        for j in range(c):
            o[j] = exp_inline(xr[j] - m)
        s = _sum8(o)
        if log:
            ls = log_inline(s)
            for j in range(c):
                o[j] = (xr[j] - m) - ls
        else:
            for j in range(c):
                o[j] = o[j] / s


@span_kernel(iterations=lambda y, g, out, log: y.shape[0], work=lambda y, g, out, log: y.size)
def softmax_backward_rows(y, g, out, log, r0, r1):
    """Rows ``r0 .. r1-1`` of the softmax backward (module docstring); a span kernel,
    called as ``softmax_backward_rows(y, g, out, log)``."""
    c = y.shape[1]
    for r in range(r0, r1):
        _wide()
        yr = y[r]
        gr = g[r]
        o = out[r]
        if log:
            t = _sum8(gr)
            for j in range(c):
                o[j] = gr[j] - exp_inline(yr[j]) * t
        else:
            for j in range(c):
                o[j] = gr[j] * yr[j]
            t = _sum8(o)
            for j in range(c):
                o[j] = yr[j] * (gr[j] - t)


def _rows(a, axis):
    """``a`` with ``axis`` last, as a C-contiguous ``[R, C]`` array, and the moved shape."""
    moved = np.moveaxis(a, axis, -1)
    shape = moved.shape
    return np.ascontiguousarray(moved, dtype=np.float64).reshape(-1, shape[-1]), shape


def _back(rows, shape, axis):
    return np.ascontiguousarray(np.moveaxis(rows.reshape(shape), -1, axis))


def softmax(x, axis, log):
    """``softmax`` (``log`` False) or ``log_softmax`` of ``x`` along ``axis`` (non-empty)."""
    xr, shape = _rows(x, axis)
    out = np.empty(xr.shape)
    softmax_rows(xr, out, log)
    return _back(out, shape, axis)


def softmax_backward(y, g, axis, log):
    """The vector-Jacobian product of :func:`softmax` given its output ``y``."""
    yr, shape = _rows(y, axis)
    gr, _ = _rows(g, axis)
    out = np.empty(yr.shape)
    softmax_backward_rows(yr, gr, out, log)
    return _back(out, shape, axis)


def apply(array_kernel, x):
    """``out = f(x)`` elementwise with one of libm's array kernels (a new array)."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty(x.shape)
    if x.size:
        array_kernel(x.reshape(-1), out.reshape(-1))
    return out
