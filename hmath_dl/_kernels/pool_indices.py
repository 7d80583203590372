"""Max pooling indices, and max unpooling (3 spatial axes; 1-D and 2-D inputs are viewed
with unit leading spatial axes, as in :mod:`hmath_dl._kernels.pool`).

* :func:`first_max_indices` - given each window's maximum (computed by
  :func:`~hmath_dl._kernels.pool.pool_boxes`, so the values are exactly ``pooling``'s),
  the flat index ``d*H*W + h*W + w`` within its ``(n, c)`` plane of the FIRST element in
  row-major window order (``d``, then ``h``, then ``w``, ascending) equal to it: the
  element a scan that replaces its winner only by a strictly greater one picks (PyTorch's
  rule).  Each window scan stops at that element.
* :func:`max_unpool` - zeros, then ``out[p, indices[p, i]] = values[p, i]`` for
  ``i = 0, 1, ...`` in order (a later duplicate overwrites an earlier one).

Both are parallel over ``(n, c)`` planes; nothing is validated here (the facade checks
shapes and index ranges).
"""

from numba import prange

from ._jit import kernel


@kernel
def first_max_indices(x, lo_d, hi_d, lo_h, hi_h, lo_w, hi_w, st_d, st_h, st_w, out, idx):
    """Given the window maxima ``out`` (from :func:`~hmath_dl._kernels.pool.pool_boxes`),
    the flat in-plane index of the first element (row-major window order) equal to its
    window's maximum into ``idx``: the element a strictly-greater row-major scan would
    pick (``+0.0 == -0.0``, so a zero maximum names the first zero of either sign).  Each
    window's scan stops at that element."""
    N, C, D, H, W = x.shape
    OD, OH, OW = out.shape[2], out.shape[3], out.shape[4]
    for t in prange(N * C):
        n = t // C
        c = t % C
        p = x[n, c]
        o = out[n, c]
        ix = idx[n, c]
        for od in range(OD):
            d0, d1 = max(lo_d[od], 0), hi_d[od]   # >= 0: no wraparound code
            for oh in range(OH):
                h0, h1 = max(lo_h[oh], 0), hi_h[oh]
                for ow in range(OW):
                    w0, w1 = max(lo_w[ow], 0), hi_w[ow]
                    best = o[od, oh, ow]
                    found = -1
                    d = d0
                    while d < d1 and found < 0:
                        h = h0
                        while h < h1 and found < 0:
                            w = w0
                            while w < w1:
                                if p[d, h, w] == best:
                                    found = (d * H + h) * W + w
                                    break
                                w += st_w
                            h += st_h
                        d += st_d
                    ix[od, oh, ow] = found


@kernel
def max_unpool(values, indices, out):
    """``out [P, M]`` = zeros with ``out[p, indices[p, i]] = values[p, i]`` for
    ``i = 0 .. L-1`` in increasing order (``values, indices [P, L]``; indices in range)."""
    P, L = values.shape
    M = out.shape[1]
    for p in prange(P):
        o = out[p]
        for j in range(M):
            o[j] = 0.0
        v = values[p]
        ix = indices[p]
        for i in range(L):
            o[ix[i]] = v[i]
