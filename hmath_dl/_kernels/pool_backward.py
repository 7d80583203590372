"""Backward (vector-Jacobian) kernel of every pooling flavour (windowed with stride,
padding, dilation and ceil mode; adaptive; global), on 3 spatial axes.

A pooling is described as in :mod:`hmath_dl._kernels.pool`: along each axis output ``i``
reads the input positions ``lo[i], lo[i] + st, ... < hi[i]`` (``st`` the dilation, 1 for
adaptive/global bins), and an average divides its sum by ``cn_d[od] * cn_h[oh] * cn_w[ow]``.

Parallel over ``(n, c)`` planes: every ``prange`` iteration owns one plane of ``dx`` and
visits the outputs of that plane in row-major order, so each ``dx`` entry is a sum in a
fixed order and the bits never depend on the thread count.
"""

from numba import prange

from . import pool_fast
from ._jit import kernel


@kernel
def box_pool_backward(x, g, lo_d, hi_d, lo_h, hi_h, lo_w, hi_w, st_d, st_h, st_w,
                      cn_d, cn_h, cn_w, is_max, dx):
    """Pooling backward on 5-D views ``x, dx [N, C, D, H, W]``, ``g [N, C, OD, OH, OW]``.

    MAX: each output's cotangent is added to the FIRST position (row-major window order
    ``d``, then ``h``, then ``w``; strictly greater replaces) holding the window maximum,
    the element :func:`~hmath_dl._kernels.pool_indices.max_pool_indices` names.
    AVERAGE: ``share = g / (cn_d * cn_h * cn_w)`` (integer divisor) is added to every
    position the window reads; a window that reads nothing contributes nothing.
    (:func:`box_pool_backward_unit` is the same computation for unit steps.)"""
    N, C, D, H, W = x.shape
    OD, OH, OW = g.shape[2], g.shape[3], g.shape[4]
    for t in prange(N * C):
        n = t // C
        c = t % C
        xp = x[n, c]
        dp = dx[n, c]
        gp = g[n, c]
        for a in range(D):
            for b in range(H):
                for e in range(W):
                    dp[a, b, e] = 0.0
        for od in range(OD):
            d0, d1 = max(lo_d[od], 0), hi_d[od]   # >= 0: no wraparound code
            for oh in range(OH):
                h0, h1 = max(lo_h[oh], 0), hi_h[oh]
                for ow in range(OW):
                    w0, w1 = max(lo_w[ow], 0), hi_w[ow]
                    if d0 >= d1 or h0 >= h1 or w0 >= w1:
                        continue
                    gv = gp[od, oh, ow]
                    if is_max:
                        bd, bh, bw = d0, h0, w0
                        best = xp[d0, h0, w0]
                        for i in range(d0, d1, st_d):
                            for j in range(h0, h1, st_h):
                                for k in range(w0, w1, st_w):
                                    if xp[i, j, k] > best:
                                        best = xp[i, j, k]
                                        bd, bh, bw = i, j, k
                        dp[bd, bh, bw] += gv
                    else:
                        share = gv / (cn_d[od] * cn_h[oh] * cn_w[ow])
                        for i in range(d0, d1, st_d):
                            for j in range(h0, h1, st_h):
                                for k in range(w0, w1, st_w):
                                    dp[i, j, k] += share


@kernel
def box_pool_backward_unit(x, g, lo_d, hi_d, lo_h, hi_h, lo_w, hi_w, cn_d, cn_h, cn_w,
                           is_max, dx):
    """:func:`box_pool_backward` with every step 1 (contiguous windows; tighter loops)."""
    N, C, D, H, W = x.shape
    OD, OH, OW = g.shape[2], g.shape[3], g.shape[4]
    for t in prange(N * C):
        n = t // C
        c = t % C
        xp = x[n, c]
        dp = dx[n, c]
        gp = g[n, c]
        for a in range(D):
            for b in range(H):
                for e in range(W):
                    dp[a, b, e] = 0.0
        for od in range(OD):
            d0, d1 = max(lo_d[od], 0), hi_d[od]
            for oh in range(OH):
                h0, h1 = max(lo_h[oh], 0), hi_h[oh]
                for ow in range(OW):
                    w0, w1 = max(lo_w[ow], 0), hi_w[ow]
                    if d0 >= d1 or h0 >= h1 or w0 >= w1:
                        continue
                    gv = gp[od, oh, ow]
                    if is_max:
                        bd, bh, bw = d0, h0, w0
                        best = xp[d0, h0, w0]
                        for i in range(d0, d1):
                            for j in range(h0, h1):
                                for k in range(w0, w1):
                                    if xp[i, j, k] > best:
                                        best = xp[i, j, k]
                                        bd, bh, bw = i, j, k
                        dp[bd, bh, bw] += gv
                    else:
                        share = gv / (cn_d[od] * cn_h[oh] * cn_w[ow])
                        for i in range(d0, d1):
                            for j in range(h0, h1):
                                for k in range(w0, w1):
                                    dp[i, j, k] += share


def pool_backward_nd(x5, g5, args, is_max, dx5):
    """Run the backward kernel (``args`` = :func:`~hmath_dl._kernels.pool.boxes3`), the
    unit-step variant when every step is 1, serial twins for small calls
    (:meth:`~._jit.Kernel.sized`)."""
    n = dx5.size
    if pool_fast.backward(x5, g5, args, is_max, dx5):      # regular 2-D windows
        return
    if args[6] == 1 and args[7] == 1 and args[8] == 1:
        fn = box_pool_backward_unit.sized(n)
        fn(x5, g5, *args[:6], *args[9:], bool(is_max), dx5)
    else:
        box_pool_backward.sized(n)(x5, g5, *args, bool(is_max), dx5)
