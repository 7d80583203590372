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

from ._jit import inlined, span_kernel
from .libm import _EXP_PER_ELEMENT, _wide, exp_inline, log_inline
from .reduce import _run_sum   # the eight-partial fixed order


@inlined
def _run_max(a, start, n):
    """max of ``a[start:start + n]`` (``a`` flat, ``n >= 1``) as eight interleaved partial
    maxima (the maximum is exact, so the order does not change it; only which of two
    equal zeros of opposite sign is kept, which no result below depends on: it matters
    only through ``z_j - log(s)`` with ``s = 1``, i.e. a single maximal element).
    Unsigned offsets into the flat array, as :func:`.reduce._run_sum`: no view per row (a
    view costs an atomic reference-count update) and no negative-index test."""
    i0 = np.uint64(start)
    un = np.uint64(n)
    one = np.uint64(1)
    if n < 8:
        m = a[i0]
        for j in range(one, un):
            m = max(m, a[i0 + j])
        return m
    m0 = a[i0]
    m1 = a[i0 + one]
    m2 = a[i0 + np.uint64(2)]
    m3 = a[i0 + np.uint64(3)]
    m4 = a[i0 + np.uint64(4)]
    m5 = a[i0 + np.uint64(5)]
    m6 = a[i0 + np.uint64(6)]
    m7 = a[i0 + np.uint64(7)]
    eight = np.uint64(8)
    i = i0 + eight
    end = i0 + un
    while i + eight <= end:
        m0 = max(m0, a[i])
        m1 = max(m1, a[i + one])
        m2 = max(m2, a[i + np.uint64(2)])
        m3 = max(m3, a[i + np.uint64(3)])
        m4 = max(m4, a[i + np.uint64(4)])
        m5 = max(m5, a[i + np.uint64(5)])
        m6 = max(m6, a[i + np.uint64(6)])
        m7 = max(m7, a[i + np.uint64(7)])
        i += eight
    m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    while i < end:
        m = max(m, a[i])
        i += one
    return m


@span_kernel(iterations=lambda x, out, log: x.shape[0],
             work=lambda x, out, log: x.size * _EXP_PER_ELEMENT)
def softmax_rows(x, out, log, r0, r1):
    """Rows ``r0 .. r1-1`` of the softmax (or log-softmax) of ``x`` into ``out`` (module
    docstring; both C-contiguous); a span kernel, called as ``softmax_rows(x, out, log)``.
    Each row by offsets into the flat arrays (1024 rows of 64: a view per row and two
    called helpers cost as much as the row's 64 exponentials)."""
    c = x.shape[1]
    xf = x.reshape(-1)
    of = out.reshape(-1)
    uc = np.uint64(c)
    for r in range(r0, r1):
        _wide()
        b = np.uint64(r) * uc
        m = _run_max(xf, b, c)
        for j in range(uc):
            of[b + j] = exp_inline(xf[b + j] - m)
        s = _run_sum(of, b, c)
        if log:
            ls = log_inline(s)
            for j in range(uc):
                of[b + j] = (xf[b + j] - m) - ls
        else:
            for j in range(uc):
                of[b + j] = of[b + j] / s


@span_kernel(iterations=lambda y, g, out, log: y.shape[0],
             work=lambda y, g, out, log: y.size * (_EXP_PER_ELEMENT if log else 1))
def softmax_backward_rows(y, g, out, log, r0, r1):
    """Rows ``r0 .. r1-1`` of the softmax backward (module docstring; C-contiguous
    arrays, rows by offsets as in :func:`softmax_rows`); a span kernel, called as
    ``softmax_backward_rows(y, g, out, log)``."""
    c = y.shape[1]
    yf = y.reshape(-1)
    gf = g.reshape(-1)
    of = out.reshape(-1)
    uc = np.uint64(c)
    for r in range(r0, r1):
        _wide()
        b = np.uint64(r) * uc
        if log:
            t = _run_sum(gf, b, c)
            for j in range(uc):
                of[b + j] = gf[b + j] - exp_inline(yf[b + j]) * t
        else:
            for j in range(uc):
                of[b + j] = gf[b + j] * yf[b + j]
            t = _run_sum(of, b, c)
            for j in range(uc):
                of[b + j] = yf[b + j] * (gf[b + j] - t)


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
