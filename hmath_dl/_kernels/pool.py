"""Pooling kernels on 3 spatial axes (1-D and 2-D inputs are viewed with unit leading
spatial axes).

Every pooling flavour (windowed with stride, padding, dilation and ceil mode; adaptive;
global) is described the same way: per spatial axis, output index ``i`` reads the input
positions ``lo[i], lo[i] + st, ... < hi[i]`` (``st`` the dilation, 1 for adaptive bins;
already clipped to the input, so padding never takes part) and contributes the integer
factor ``cn[i]`` to an average's divisor.  The window of output ``(od, oh, ow)`` is the
product of its three per-axis position sets; its divisor is
``cn_d[od] * cn_h[oh] * cn_w[ow]`` (the facade puts the real count, the padded count of
``count_include_pad`` or ``divisor_override`` there).  An empty range (``lo >= hi``) is
allowed for averages only (a window of pure padding whose value is a well-defined 0).

* :func:`pool_boxes` - max or average (sum / divisor), computed separably: along D,
  then H, then W.  For max this is exactly the box maximum; for the average the sum is
  formed in the fixed order (d, then h, then w) and divided once by the divisor.
* :func:`global_pool` - the whole-plane case of :func:`pool_boxes` (same numbers), with
  no per-plane allocations.
* :func:`max_pool_argmax` - box maximum together with the flat index ``d*H*W + h*W + w``
  (within the input's spatial volume of that (n, c)) of its winner: the FIRST maximum in
  window order (d, then h, then w, ascending), for contiguous boxes.  (Dilated windows and
  the public ``max_pooling_with_indices``: :mod:`._kernels.pool_indices`; backward passes:
  :mod:`._kernels.pool_backward`.)

Parallel over (n, c) planes; each plane is reduced in a fixed order, so the bits never
depend on the thread count.
"""

import numpy as np
from numba import prange

from . import pool_fast
from ._jit import helper, kernel, span_kernel
from .views import out5, readonly, readonly5


@helper
def _reduce_rows(src, lo, hi, step, is_max, dst):
    """dst[r, i] = reduce(src[r, lo[i]:hi[i]:step]) for every row r (2-D arrays); an empty
    range (``lo[i] >= hi[i]``, only for sums) gives 0."""
    R = src.shape[0]
    O = dst.shape[1]
    general = step != 1
    for i in range(O):
        if lo[i] >= hi[i]:
            general = True
    if not general:     # contiguous, nonempty ranges: the tightest loops
        for r in range(R):
            s = src[r]
            d = dst[r]
            for i in range(O):
                a = lo[i]
                b = hi[i]
                v = s[a]
                if is_max:
                    for k in range(a + 1, b):
                        u = s[k]
                        if u > v:
                            v = u
                else:
                    for k in range(a + 1, b):
                        v += s[k]
                d[i] = v
        return
    for r in range(R):
        s = src[r]
        d = dst[r]
        for i in range(O):
            a = lo[i]
            b = hi[i]
            if a >= b:
                d[i] = 0.0
                continue
            v = s[a]
            if is_max:
                for k in range(a + step, b, step):
                    u = s[k]
                    if u > v:
                        v = u
            else:
                for k in range(a + step, b, step):
                    v += s[k]
            d[i] = v


@helper
def _reduce_cols(src, lo, hi, step, is_max, dst):
    """dst[b, i, :] = reduce(src[b, lo[i]:hi[i]:step, :]) along axis 1 (3-D arrays),
    vectorised along the contiguous last axis; an empty range gives zeros."""
    B = src.shape[0]
    O = dst.shape[1]
    L = dst.shape[2]
    for bb in range(B):
        for i in range(O):
            d = dst[bb, i]
            if lo[i] >= hi[i]:
                for k in range(L):
                    d[k] = 0.0
                continue
            first = src[bb, lo[i]]
            for k in range(L):
                d[k] = first[k]
            for r in range(lo[i] + step, hi[i], step):
                s = src[bb, r]
                if is_max:
                    for k in range(L):
                        u = s[k]
                        if u > d[k]:
                            d[k] = u
                else:
                    for k in range(L):
                        d[k] += s[k]


def _pool_chunks(x):
    """Chunks of (n, c) planes of :func:`pool_boxes` (a fixed number: the scratch is
    allocated once per chunk)."""
    return min(x.shape[0] * x.shape[1], 256)


@span_kernel()
def _pool_span(x, lo_d, hi_d, lo_h, hi_h, lo_w, hi_w, st_d, st_h, st_w, cn_d, cn_h, cn_w,
               is_max, out, bads, ch0, ch1):
    """The work of :func:`pool_boxes` on the chunks ``ch0 .. ch1-1`` of its (n, c) planes
    (:func:`_pool_chunks` contiguous chunks of the flat plane index ``t = n*C + c``),
    with one scratch allocation: ``bads[ch]`` = how many planes of chunk ``ch`` have a
    NaN/inf input or a non-finite output."""
    C, D, H, W = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    OD, OH, OW = out.shape[2], out.shape[3], out.shape[4]
    P = x.shape[0] * C
    nch = min(P, 256)
    buf1 = np.empty((OD, H, W))
    t2 = np.empty((OD, OH, W))
    for ch in range(ch0, ch1):
        bad = 0
        for t in range(ch * P // nch, (ch + 1) * P // nch):
            n = t // C
            c = t % C
            plane = x[n, c]
            o = out[n, c]
            # D, then H (both vectorised along contiguous rows), then W on the smallest array
            if D == 1 and OD == 1 and lo_d[0] < hi_d[0]:   # the only D window is [0, 1)
                t1_ = plane
            else:
                t1_ = buf1
                _reduce_cols(plane.reshape((1, D, H * W)), lo_d, hi_d, st_d, is_max,
                             t1_.reshape((1, OD, H * W)))
            _reduce_cols(t1_, lo_h, hi_h, st_h, is_max, t2)
            _reduce_rows(t2.reshape((OD * OH, W)), lo_w, hi_w, st_w, is_max,
                         o.reshape((OD * OH, OW)))
            if not is_max:
                for od in range(OD):
                    cd = cn_d[od]
                    for oh in range(OH):
                        cnt = cd * cn_h[oh]
                        row = o[od, oh]
                        for ow in range(OW):
                            row[ow] = row[ow] / (cnt * cn_w[ow])
            # x * 0 is NaN exactly for NaN/inf x: one pass over the cached plane, counting
            # in an integer (an integer sum vectorises; a float sum is one serial chain)
            nbad = 0
            flat = plane.reshape(D * H * W)
            for i in range(D * H * W):
                nbad += flat[i] * 0.0 != 0.0
            if not is_max:
                of = o.reshape(OD * OH * OW)
                for i in range(OD * OH * OW):
                    nbad += of[i] * 0.0 != 0.0
            if nbad != 0:
                bad += 1
        bads[ch] = bad


def pool_boxes(x, lo_d, hi_d, lo_h, hi_h, lo_w, hi_w, st_d, st_h, st_w, cn_d, cn_h, cn_w,
               is_max, out):
    """Max or average of every window box of ``x [N, C, D, H, W]`` into
    ``out [N, C, OD, OH, OW]`` (see module docstring).  Along each axis output ``i`` reads
    the positions ``lo[i], lo[i] + st, ... < hi[i]`` (``st`` the dilation); the average
    divides the box sum by the integer ``cn_d[od] * cn_h[oh] * cn_w[ow]``.

    Returns a status: the number of (n, c) planes whose input holds a NaN/inf or whose
    output is not finite (0 when all is well); the caller turns it into an error.  (The
    input check rides on the plane being hot in cache, so the facade need not scan x
    beforehand.)  Plain Python around the span helper :func:`_pool_span`, parallel over
    a fixed number of contiguous chunks of planes; calls on fewer than ``SERIAL_WORK``
    input elements run it serially (:meth:`~._jit.SpanKernel.run`)."""
    bads = np.zeros(_pool_chunks(x), dtype=np.int64)
    _pool_span.run(bads.shape[0], x.size, x, lo_d, hi_d, lo_h, hi_h, lo_w, hi_w, st_d, st_h,
                   st_w, cn_d, cn_h, cn_w, is_max, out, bads)
    return int(bads.sum())


@kernel(work=lambda x, is_max, out: x.size)
def global_pool(x, is_max, out):
    """Global max or average of every plane of ``x [P, D, H, W]`` into ``out [P]``: the
    same numbers as :func:`pool_boxes` with whole-axis boxes (reduce along D, then H,
    both elementwise over contiguous rows, then along W; the average divides the sum
    once by ``D*H*W``), without its per-plane scratch allocations.  Planes are processed
    in a fixed number of contiguous chunks (one scratch buffer each).  Returns the number
    of planes with a NaN/inf input (or, for the average, a non-finite result)."""
    P, D, H, W = x.shape
    nch = min(P, 256)
    bad = np.zeros(nch, dtype=np.int64)
    count = D * H * W
    for ch in prange(nch):
        p0 = ch * P // nch
        p1 = (ch + 1) * P // nch
        t1 = np.empty((H, W))
        t2 = np.empty(W)
        nb = 0
        for pl in range(p0, p1):
            plane = x[pl]
            # x * 0 is NaN exactly for NaN/inf x: counted (an integer sum vectorises) in
            # the loops that read x anyway
            n_nonfinite = 0
            if D == 1:
                src = plane[0]
            else:
                first = plane[0]
                for h in range(H):
                    for w in range(W):
                        t1[h, w] = first[h, w]
                        n_nonfinite += first[h, w] * 0.0 != 0.0
                for d in range(1, D):
                    nxt = plane[d]
                    for h in range(H):
                        a = t1[h]
                        b = nxt[h]
                        if is_max:
                            for w in range(W):
                                n_nonfinite += b[w] * 0.0 != 0.0
                                if b[w] > a[w]:
                                    a[w] = b[w]
                        else:
                            for w in range(W):
                                n_nonfinite += b[w] * 0.0 != 0.0
                                a[w] += b[w]
                src = t1
            chk = D == 1  # the D == 1 rows are x itself: check them here
            r0 = src[0]
            for w in range(W):
                t2[w] = r0[w]
                if chk:
                    n_nonfinite += r0[w] * 0.0 != 0.0
            for h in range(1, H):
                b = src[h]
                if is_max:
                    for w in range(W):
                        if chk:
                            n_nonfinite += b[w] * 0.0 != 0.0
                        if b[w] > t2[w]:
                            t2[w] = b[w]
                else:
                    for w in range(W):
                        if chk:
                            n_nonfinite += b[w] * 0.0 != 0.0
                        t2[w] += b[w]
            v = t2[0]
            if is_max:
                for w in range(1, W):
                    if t2[w] > v:
                        v = t2[w]
            else:
                for w in range(1, W):
                    v += t2[w]
                v = v / count
            out[pl] = v
            if n_nonfinite != 0 or v * 0.0 != 0.0:
                nb += 1
        bad[ch] = nb
    total = 0
    for ch in range(nch):
        total += bad[ch]
    return total


@kernel
def max_pool_argmax(x, lo_d, hi_d, lo_h, hi_h, lo_w, hi_w, out, idx):
    """Box maximum into ``out [N, C, OD, OH, OW]`` and the flat spatial index of the first
    maximum in window order into ``idx`` (int64, same shape): see module docstring."""
    N, C, D, H, W = x.shape
    OD, OH, OW = out.shape[2], out.shape[3], out.shape[4]
    for t in prange(N * C):
        n = t // C
        c = t % C
        p = x[n, c]
        for od in range(OD):
            for oh in range(OH):
                for ow in range(OW):
                    bd = lo_d[od]
                    bh = lo_h[oh]
                    bw = lo_w[ow]
                    best = p[bd, bh, bw]
                    for d in range(lo_d[od], hi_d[od]):
                        for h in range(lo_h[oh], hi_h[oh]):
                            for w in range(lo_w[ow], hi_w[ow]):
                                v = p[d, h, w]
                                if v > best:
                                    best = v
                                    bd = d
                                    bh = h
                                    bw = w
                    out[n, c, od, oh, ow] = best
                    idx[n, c, od, oh, ow] = (bd * H + bh) * W + bw


# --------------------------------------------------------------------------- entry points
def _bounds3(bounds):
    """Per-axis (lo, hi) int64 arrays, padded to 3 axes with the unit box [0, 1)."""
    one = (np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64))
    full = [one] * (3 - len(bounds)) + [
        (np.ascontiguousarray(lo, dtype=np.int64), np.ascontiguousarray(hi, dtype=np.int64))
        for lo, hi in bounds]
    return [a for pair in full for a in pair]


_UNIT_LO = readonly(np.zeros(1, dtype=np.int64))
_UNIT_HI = readonly(np.ones(1, dtype=np.int64))


def boxes3(axes):
    """Kernel arguments of :func:`pool_boxes` from per-axis ``(lo, hi, step, count)``
    (int64 arrays; ``count`` the per-axis divisor factor), padded in front to 3 axes with
    the unit box ``[0, 1)`` (step 1, count 1): ``lo_d, hi_d, lo_h, hi_h, lo_w, hi_w, st_d,
    st_h, st_w, cn_d, cn_h, cn_w``.  Arrays are passed read-only (one compiled
    specialisation)."""
    full = [(_UNIT_LO, _UNIT_HI, 1, _UNIT_HI)] * (3 - len(axes)) + list(axes)
    out = []
    for f in full:
        out.append(_ro64(f[0]))
        out.append(_ro64(f[1]))
    for f in full:
        out.append(int(f[2]))
    for f in full:
        out.append(_ro64(f[3]))
    return out


def _ro64(a):
    if not (isinstance(a, np.ndarray) and a.dtype == np.int64 and a.flags.c_contiguous):
        a = np.ascontiguousarray(a, dtype=np.int64)
    return readonly(a)


def pool_nd(x, bounds, is_max, out):
    """Validated entry point: ``x [N, C, *S]`` (C-contiguous float64), ``bounds`` one
    ``(lo, hi)`` pair of int64 arrays per spatial axis (nonempty, clipped ranges), ``out``
    preallocated ``[N, C, *O]``.  Fills ``out``; returns the kernel status (the number of
    (n, c) planes with a non-finite input or output value; 0 when all is finite)."""
    return pool_box_nd(x, [(lo, hi, 1, np.asarray(hi) - np.asarray(lo)) for lo, hi in bounds],
                       is_max, out)


def pool_box_nd(x, axes, is_max, out):
    """Like :func:`pool_nd` with per-axis ``(lo, hi, step, count)``: output ``i`` of an axis
    reads ``lo[i], lo[i] + step, ... < hi[i]`` (an empty range only for sums: 0) and the
    average divides by the product of the axes' ``count`` entries."""
    if out.size:
        status = pool_fast.forward(x, axes, is_max, out)     # regular 2-D windows
        if status is not None:
            return status
        return int(pool_boxes(readonly5(x), *boxes3(axes), bool(is_max), out5(out)))
    return 0


def max_pool_argmax_nd(x, bounds, out, idx):
    """Like :func:`pool_nd` for max, also filling ``idx`` (int64, shape of ``out``) with the
    flat spatial index of each window's first maximum (window order d, h, w)."""
    if out.size:
        max_pool_argmax(readonly5(x), *_bounds3(bounds), out5(out), out5(idx))
    return out, idx


def window_bounds(size, window, stride, padding, count):
    """(lo, hi) of ``count`` windows along an axis of length ``size``: window ``i`` covers
    ``[i*stride - padding, i*stride - padding + window)`` clipped to ``[0, size)``."""
    start = np.arange(count, dtype=np.int64) * stride - padding
    lo = np.maximum(start, 0)
    hi = np.minimum(start + window, size)
    return lo, hi


def adaptive_bounds(size, count):
    """(lo, hi) of adaptive bin ``i``: ``[floor(i*size/count), ceil((i+1)*size/count))``."""
    i = np.arange(count, dtype=np.int64)
    lo = (i * size) // count
    hi = -((-(i + 1) * size) // count)
    return lo, hi
