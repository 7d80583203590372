"""Pooling on regular 2-D windows: the common case of a CNN (``k x k`` windows at stride
``s``, no padding, no dilation, every window inside the input), with the numbers of the
general kernels (:mod:`._kernels.pool`, :mod:`._kernels.pool_backward`) bit for bit.

The general kernels describe every window by per-output index arrays and reduce plane
by plane through scratch arrays; on small planes (8 x 8 feature maps) that bookkeeping
costs more than the arithmetic.  Here a window is ``rows oh*sh .. oh*sh + kh - 1`` by
``columns ow*sw .. ow*sw + kw - 1`` and many planes go in one task.  The order of every
operation is the general kernels' own:

* forward max / sum (:func:`pool2d_regular`): for each window column ``w`` the column's
  reduction over the window rows (``v = x[h0, w]``, then ``v = max``/``v + x[h, w]`` for
  ``h = h0+1 ..``; a max replaces only when strictly greater), then the reduction of
  those column values over ``w`` in order (the same rule); an average divides that sum
  once by its integer divisor;
* backward max (:func:`max_pool2d_regular_backward`): ``dx`` starts at 0.0 and every
  output, in row-major order, adds its cotangent to the FIRST position of its window in
  row-major order (``h``, then ``w``) holding the window maximum (strictly greater
  replaces);
* backward average (:func:`avg_pool2d_regular_backward`): every output, in row-major
  order, adds ``g / divisor`` to each position of its window (row-major).

The forward kernel also counts the planes whose input holds a NaN/inf (``x * 0 != 0``)
or, for an average, whose output is not finite: the status of the general kernel (the
facade raises from it).  Parallel over blocks of planes (every plane is owned by one
task, so the bits do not depend on the thread count); small calls run the serial twin.
"""

import contextlib

import numpy as np
from numba import prange, types
from numba.extending import overload

from ._jit import inlined, kernel, span_kernel
from ._cpu import machine
from ._plan import forcing
from .views import readonly

#: Planes (n, c) per parallel task.
PLANES_PER_TASK = 16
#: The pooling paths (speed only: the same bits): ``regular`` where it applies, else
#: ``general`` (the kernels of :mod:`._kernels.pool` / :mod:`._kernels.pool_backward`).
PATHS = ("regular", "general")
_forced = {"path": None}


@contextlib.contextmanager
def forced_path(name):
    """Within the block, pooling takes path ``name`` (``general``: never the regular
    kernels; ``regular`` or ``None``: the plan), for the tests that hold both paths to the
    same bits."""
    if name is not None and name not in PATHS:
        raise ValueError(f"unknown pooling path {name!r} (expected one of {PATHS})")
    with forcing(_forced, "path", name):
        yield


_REGULAR_MEMO = {}
_REGULAR_MEMO_MAX = 256


def regular_windows(axes, spatial):
    """:func:`_regular_windows`, remembered for the same per-axis arrays (the layers'
    cached, read-only window plans: the same objects call after call).  The memo holds
    the arrays it was computed from and checks them by identity, so an id can never be
    reused for another array while its entry exists."""
    key = (tuple(spatial),) + tuple((id(lo), id(hi), int(st), id(cn))
                                    for lo, hi, st, cn in axes)
    hit = _REGULAR_MEMO.get(key)
    if hit is not None and all(a[0] is b[0] and a[1] is b[1] and a[3] is b[3]
                               for a, b in zip(hit[0], axes)):
        return hit[1]
    reg = _regular_windows(axes, spatial)
    if all(isinstance(a[0], np.ndarray) and not a[0].flags.writeable and
           isinstance(a[1], np.ndarray) and not a[1].flags.writeable and
           isinstance(a[3], np.ndarray) and not a[3].flags.writeable for a in axes):
        if len(_REGULAR_MEMO) >= _REGULAR_MEMO_MAX:
            _REGULAR_MEMO.clear()
        _REGULAR_MEMO[key] = (tuple(axes), reg)
    return reg


def _regular_windows(axes, spatial):
    """``(kh, kw, sh, sw)`` when the per-axis boxes ``axes`` (``(lo, hi, step, count)``
    per spatial axis, as :func:`._kernels.pool.boxes3` takes them) of an input with
    spatial shape ``spatial`` are regular 2-D windows -- 1 or 2 spatial axes, step 1,
    output ``i`` reading ``[i*s, i*s + k)`` inside the input, every divisor factor equal
    to ``k`` -- else ``None``."""
    if len(axes) not in (1, 2) or len(spatial) != len(axes):
        return None
    out = []
    for (lo, hi, step, count), size in zip(axes, spatial):
        lo = np.asarray(lo)
        hi = np.asarray(hi)
        count = np.asarray(count)
        if int(step) != 1 or lo.size == 0 or lo[0] != 0:
            return None
        k = int(hi[0] - lo[0])
        s = int(lo[1] - lo[0]) if lo.size > 1 else 1
        if k < 1 or s < 1:
            return None
        want = np.arange(lo.size, dtype=np.int64) * s
        if (not np.array_equal(lo, want) or not np.array_equal(hi, want + k)
                or int(hi[-1]) > size or not np.all(count == k)):
            return None
        out.append((k, s))
    if len(out) == 1:
        out.insert(0, (1, 1))
    (kh, sh), (kw, sw) = out
    return kh, kw, sh, sw


def forward(x, axes, is_max, out):
    """The regular-window forward for :func:`._kernels.pool.pool_box_nd`: the status of
    :func:`pool2d_regular`, or ``None`` when the windows are not regular (the caller runs
    the general kernel).  ``x [N, C, *S]`` and ``out [N, C, *O]`` C-contiguous."""
    if _forced["path"] == "general":
        return None
    reg = regular_windows(axes, x.shape[2:])
    if reg is None or not (x.flags.c_contiguous and out.flags.c_contiguous):
        return None
    kh, kw, sh, sw = reg
    P = x.shape[0] * x.shape[1]
    H, W = (1,) + x.shape[2:] if x.ndim == 3 else x.shape[2:]
    OH, OW = (1,) + out.shape[2:] if out.ndim == 3 else out.shape[2:]
    x3 = readonly(x.reshape(P, H, W))   # one compiled specialisation: inputs read-only
    if is_max and (kh, kw, sh, sw) == (2, 2, 2, 2):
        return max_pool2x2(x3, out.reshape(P, OH, OW))
    return int(pool2d_regular.sized(x.size)(x3, kh, kw, sh, sw, bool(is_max), kh * kw,
                                            out.reshape(P, OH, OW)))


def backward(x5, g5, args, is_max, dx5):
    """The regular-window backward for :func:`._kernels.pool_backward.pool_backward_nd`
    (``args`` = :func:`._kernels.pool.boxes3`, rank-5 ``x5, g5, dx5``): True when it ran,
    False when the windows are not regular (the caller runs the general kernel)."""
    if _forced["path"] == "general":
        return False
    lo_d, hi_d, lo_h, hi_h, lo_w, hi_w, st_d, st_h, st_w, cn_d, cn_h, cn_w = args
    if x5.shape[2] != 1 or lo_d.size != 1 or lo_d[0] != 0 or hi_d[0] != 1 or cn_d[0] != 1:
        return False
    reg = regular_windows([(lo_h, hi_h, st_h, cn_h), (lo_w, hi_w, st_w, cn_w)], x5.shape[3:])
    if reg is None or not (x5.flags.c_contiguous and g5.flags.c_contiguous
                           and dx5.flags.c_contiguous):
        return False
    kh, kw, sh, sw = reg
    P = x5.shape[0] * x5.shape[1]
    H, W = x5.shape[3:]
    OH, OW = g5.shape[3:]
    g3 = g5.reshape(P, OH, OW)
    dx3 = dx5.reshape(P, H, W)
    if is_max and (kh, kw, sh, sw) == (2, 2, 2, 2):
        if INT_SELECTS:
            g3, dx3 = g3.view(np.int64), dx3.view(np.int64)
        _max_pool2x2_backward_span(x5.reshape(P, H, W), g3, dx3)
    elif is_max:
        x3 = x5.reshape(P, H, W)
        max_pool2d_regular_backward.sized(dx5.size)(x3, g3, kh, kw, sh, sw, dx3)
    else:
        avg_pool2d_regular_backward.sized(dx5.size)(g3, kh, kw, sh, sw, kh * kw, dx3)
    return True


@inlined
def _plane_forward(xf, p, H, W, outf, OH, OW, kh, kw, sh, sw, is_max, div, col):
    """Plane ``p``: ``out[p] [OH, OW]`` from ``x[p] [H, W]`` (``xf``, ``outf`` the flat
    arrays; see the module docstring; ``col`` a scratch row of length W); returns 1 if
    the plane's input holds a NaN/inf or (average) its output is not finite.  Per output
    row: the window rows reduced column by column into ``col`` (a loop along the
    contiguous row: it vectorises), then each window's columns of ``col`` reduced in
    order.  Every index is unsigned (``u``): Numba then drops its negative-index test,
    which kept these short loops scalar (and costs more than the arithmetic of a small
    plane); no row views (a view costs a reference-count update)."""
    one = np.uint64(1)
    uW = np.uint64(W)
    ukh, ukw, ush, usw = np.uint64(kh), np.uint64(kw), np.uint64(sh), np.uint64(sw)
    xb = np.uint64(p) * np.uint64(H) * uW
    ob = np.uint64(p) * np.uint64(OH) * np.uint64(OW)
    nbad = 0
    for oh in range(np.uint64(OH)):
        h0 = oh * ush
        r0 = xb + h0 * uW
        for w in range(uW):
            col[w] = xf[r0 + w]
        for h in range(h0 + one, h0 + ukh):
            r = xb + h * uW
            if is_max:
                for w in range(uW):
                    u = xf[r + w]
                    col[w] = u if u > col[w] else col[w]
            else:
                for w in range(uW):
                    col[w] += xf[r + w]
        orow = ob + oh * np.uint64(OW)
        for ow in range(np.uint64(OW)):
            w0 = ow * usw
            v = col[w0]
            for w in range(w0 + one, w0 + ukw):
                c = col[w]
                if is_max:
                    v = c if c > v else v
                else:
                    v += c
            outf[orow + ow] = v if is_max else v / div
    for q in range(np.uint64(H) * uW):
        nbad += xf[xb + q] * 0.0 != 0.0
    if not is_max:
        for q in range(np.uint64(OH) * np.uint64(OW)):
            nbad += outf[ob + q] * 0.0 != 0.0
    return 1 if nbad != 0 else 0


@kernel
def pool2d_regular(x, kh, kw, sh, sw, is_max, div, out):
    """Max (``is_max``) or average (sum / ``div``, an integer divisor) over regular
    windows of ``x [P, H, W]`` into ``out [P, OH, OW]`` (C-contiguous float64, P the
    (n, c) planes); returns the number of bad planes (see :func:`_plane_forward`)."""
    P, H, W = x.shape
    OH, OW = out.shape[1], out.shape[2]
    xf = x.reshape(-1)
    outf = out.reshape(-1)
    ntask = (P + PLANES_PER_TASK - 1) // PLANES_PER_TASK
    bad = np.zeros(ntask, dtype=np.int64)
    for t in prange(ntask):
        nb = 0
        col = np.empty(W)
        for p in range(t * PLANES_PER_TASK, min(P, (t + 1) * PLANES_PER_TASK)):
            nb += _plane_forward(xf, p, H, W, outf, OH, OW, kh, kw, sh, sw, is_max, div, col)
        bad[t] = nb
    total = 0
    for t in range(ntask):
        total += bad[t]
    return total


@inlined
def _plane_max_backward(xf, gf, p, H, W, OH, OW, kh, kw, sh, sw, dxf):
    """Plane ``p`` of :func:`max_pool2d_regular_backward` (flat arrays, unsigned indices
    as in :func:`_plane_forward`)."""
    uW = np.uint64(W)
    ukh, ukw, ush, usw = np.uint64(kh), np.uint64(kw), np.uint64(sh), np.uint64(sw)
    xb = np.uint64(p) * np.uint64(H) * uW
    gb = np.uint64(p) * np.uint64(OH) * np.uint64(OW)
    for q in range(np.uint64(H) * uW):
        dxf[xb + q] = 0.0
    for oh in range(np.uint64(OH)):
        h0 = oh * ush
        for ow in range(np.uint64(OW)):
            w0 = ow * usw
            best_at = xb + h0 * uW + w0
            best = xf[best_at]
            for h in range(h0, h0 + ukh):
                r = xb + h * uW
                for w in range(w0, w0 + ukw):
                    u = xf[r + w]
                    if u > best:
                        best = u
                        best_at = r + w
            dxf[best_at] += gf[gb + oh * np.uint64(OW) + ow]


@kernel
def max_pool2d_regular_backward(x, g, kh, kw, sh, sw, dx):
    """``dx [P, H, W]`` of max pooling over regular windows: see the module docstring."""
    P, H, W = x.shape
    OH, OW = g.shape[1], g.shape[2]
    xf = x.reshape(-1)
    gf = g.reshape(-1)
    dxf = dx.reshape(-1)
    ntask = (P + PLANES_PER_TASK - 1) // PLANES_PER_TASK
    for t in prange(ntask):
        for p in range(t * PLANES_PER_TASK, min(P, (t + 1) * PLANES_PER_TASK)):
            _plane_max_backward(xf, gf, p, H, W, OH, OW, kh, kw, sh, sw, dxf)


@kernel
def avg_pool2d_regular_backward(g, kh, kw, sh, sw, div, dx):
    """``dx [P, H, W]`` of average pooling over regular windows (divisor ``div``): see
    the module docstring."""
    P, H, W = dx.shape
    OH, OW = g.shape[1], g.shape[2]
    ntask = (P + PLANES_PER_TASK - 1) // PLANES_PER_TASK
    for t in prange(ntask):
        for p in range(t * PLANES_PER_TASK, min(P, (t + 1) * PLANES_PER_TASK)):
            for h in range(H):
                for w in range(W):
                    dx[p, h, w] = 0.0
            for oh in range(OH):
                h0 = oh * sh
                for ow in range(OW):
                    w0 = ow * sw
                    share = g[p, oh, ow] / div
                    for h in range(h0, h0 + kh):
                        for w in range(w0, w0 + kw):
                            dx[p, h, w] += share


# --------------------------------------------------------------------------- 2 x 2, stride 2
# The forward max pooling of nearly every CNN, written out: per output the four window
# values ``a b / c d`` (row-major) and the same comparisons as the loops of
# :func:`_plane_forward` -- ``t = c if c > a else a``, ``u = d if d > b else b`` (each
# window column over its rows), then ``u if u > t else t`` (the columns in order) -- so
# the same bits, without the scratch column and the one-iteration inner loops that cost
# more than the comparisons on small planes.  The backward is written out too
# (:func:`_max_pool2x2_backward_span`), with the scan's replacements as boolean masks: an
# integer "which position" carried through selects was compiled into data-dependent
# branches (random data: 156 us against 52 on sorted data, 1024 planes of 8 x 8, one
# thread); as masks, and with even planes walked as one run of row pairs, 36-37 us on
# both, against 80-91 us for the general regular kernel (2048 planes of 4 x 4: 21 against
# 54-60; odd 9 x 11 planes: 21 against 32-33).


@inlined
def _window2x2(xf, r0, r1, w):
    """The window ``a b / c d`` at column ``w`` of the rows starting at ``r0``, ``r1``
    (flat, unsigned offsets)."""
    one = np.uint64(1)
    return xf[r0 + w], xf[r0 + w + one], xf[r1 + w], xf[r1 + w + one]


@span_kernel(iterations=lambda x, out, bad: bad.shape[0], work=lambda x, out, bad: x.size)
def _max_pool2x2_span(x, out, bad, t0, t1):
    """Tasks ``t0 .. t1-1`` (``PLANES_PER_TASK`` planes each) of :func:`max_pool2x2`;
    ``bad[t]`` = the number of task ``t``'s planes whose input holds a NaN/inf."""
    P, H, W = x.shape
    OH, OW = out.shape[1], out.shape[2]
    xf = x.reshape(-1)
    outf = out.reshape(-1)
    uW, uOW = np.uint64(W), np.uint64(OW)
    two = np.uint64(2)
    for t in range(t0, t1):
        nb = 0
        for p in range(t * PLANES_PER_TASK, min(P, (t + 1) * PLANES_PER_TASK)):
            xb = np.uint64(p) * np.uint64(H) * uW
            ob = np.uint64(p) * np.uint64(OH) * uOW
            for oh in range(np.uint64(OH)):
                r0 = xb + two * oh * uW
                r1 = r0 + uW
                o = ob + oh * uOW
                for ow in range(uOW):
                    a, b, c, d = _window2x2(xf, r0, r1, two * ow)
                    tc = c if c > a else a
                    ud = d if d > b else b
                    outf[o + ow] = ud if ud > tc else tc
            cnt = 0
            for q in range(np.uint64(H) * uW):
                cnt += xf[xb + q] * 0.0 != 0.0
            nb += 1 if cnt != 0 else 0
        bad[t] = nb


def max_pool2x2(x, out):
    """:func:`pool2d_regular` for max pooling over 2 x 2 windows at stride 2 (see the
    note above) of ``x [P, H, W]`` into ``out [P, H//2, W//2]``; returns the number of
    planes whose input holds a NaN/inf.  A span kernel (:func:`._jit.span_kernel`: one
    compiled body for the serial and the parallel schedule; the work size chooses)."""
    bad = np.zeros(-(-x.shape[0] // PLANES_PER_TASK), dtype=np.int64)
    _max_pool2x2_span(x, out, bad)
    return int(bad.sum())


_NEG_ZERO = np.int64(-0x8000000000000000)   # the bits of -0.0
_ABS = np.int64(0x7FFFFFFFFFFFFFFF)
_INF = np.int64(0x7FF0000000000000)         # |bits| > this: a NaN
_QUIET = np.int64(0x0008000000000000)       # a NaN's quiet bit

#: The 2 x 2 max-pool backward selects on the int64 views of its float64 cotangents
#: (conditional moves) except on AVX-512, whose mask registers make the float64 selects
#: branch-free already (there the integer form measured 75 against 34 us).
INT_SELECTS = not machine().avx512


def _plus_zero(v):
    """``0.0 + v`` for a float64; for the int64 bits of a float64, the bits of that sum
    (-0.0 becomes +0.0, a signalling NaN is quieted: what the addition does)."""


@overload(_plus_zero)
def _plus_zero_impl(v):
    if isinstance(v, types.Integer):
        def bits(v):
            v = v if v != _NEG_ZERO else np.int64(0)
            return v | (_QUIET if (v & _ABS) > _INF else np.int64(0))
        return bits
    return lambda v: 0.0 + v


def _zero_like(v):
    """+0.0, or its bits (0) for an int64 ``v``."""


@overload(_zero_like)
def _zero_like_impl(v):
    if isinstance(v, types.Integer):
        return lambda v: np.int64(0)
    return lambda v: 0.0


@inlined
def _backward_window_row(xf, gf, dxf, r0, r1, o, uOW):
    """The ``uOW`` windows of rows ``r0``, ``r1`` (flat offsets) with cotangents at
    ``gf[o ..]``: see :func:`_max_pool2x2_backward_span` (unsigned offsets).  ``gf`` and
    ``dxf`` are float64, or (:data:`INT_SELECTS`) the int64 views of float64 arrays:
    "``v`` if kept else +0.0" is then an integer select, where a float64 select is
    compiled into a branch on targets without AVX-512's mask registers (random data, so
    mispredicted: haswell target, one thread, 1024 planes of 8 x 8, 150 -> 71 us)."""
    one = np.uint64(1)
    two = np.uint64(2)
    for ow in range(uOW):
        w = two * ow
        a, b, c, d = _window2x2(xf, r0, r1, w)
        v = _plus_zero(gf[o + ow])
        zero = _zero_like(v)
        # the scan's replacements as masks (no data-dependent branch)
        gb_ = b > a
        mab = b if gb_ else a
        gc = c > mab
        mabc = c if gc else mab
        gd = d > mabc
        keep_c = gc & ~gd
        keep_b = gb_ & ~gc & ~gd
        keep_a = ~gb_ & ~gc & ~gd
        dxf[r0 + w] = v if keep_a else zero
        dxf[r0 + w + one] = v if keep_b else zero
        dxf[r1 + w] = v if keep_c else zero
        dxf[r1 + w + one] = v if gd else zero


@span_kernel(iterations=lambda x, g, dx: -(-x.shape[0] // PLANES_PER_TASK),
             work=lambda x, g, dx: x.size)
def _max_pool2x2_backward_span(x, g, dx, t0, t1):
    """:func:`max_pool2d_regular_backward` for 2 x 2 windows at stride 2 (tasks ``t0 ..
    t1-1`` of ``PLANES_PER_TASK`` planes): the windows do not overlap, so each position
    of a window gets ``0.0 + g`` if it is the window's first maximum in row-major order
    (``a b / c d``: ``a``, then ``b``, ``c``, ``d`` replacing only when strictly
    greater: the general kernel's scan) and 0.0 otherwise -- the general kernel's sums
    (``dx`` from 0.0, one addition), written with selects instead of branches (``g``
    and ``dx`` float64 or their int64 views: :func:`_backward_window_row`).  With
    random data the scan's branches were mispredicted about half the time (64 x 16 x 8 x
    8: 102 us against torch's 30 with saved indices).  A last row or column that no
    window covers (odd H or W) is 0.0.  With even H and W the planes have no such edges
    and the task's planes are one run of row pairs (per-plane loop overhead dominated
    4 x 4 planes)."""
    P, H, W = x.shape
    OH, OW = g.shape[1], g.shape[2]
    xf = x.reshape(-1)
    gf = g.reshape(-1)
    dxf = dx.reshape(-1)
    uW, uOW = np.uint64(W), np.uint64(OW)
    two = np.uint64(2)
    p0 = t0 * PLANES_PER_TASK
    p1 = min(P, t1 * PLANES_PER_TASK)
    if H % 2 == 0 and W % 2 == 0:
        for q in range(np.uint64(p0 * OH), np.uint64(p1 * OH)):
            r0 = two * q * uW
            _backward_window_row(xf, gf, dxf, r0, r0 + uW, q * uOW, uOW)
        return
    for p in range(p0, p1):
        xb = np.uint64(p) * np.uint64(H) * uW
        gb = np.uint64(p) * np.uint64(OH) * uOW
        for oh in range(np.uint64(OH)):
            r0 = xb + two * oh * uW
            r1 = r0 + uW
            _backward_window_row(xf, gf, dxf, r0, r1, gb + oh * uOW, uOW)
            for q in range(two * uOW, uW):          # odd W: the last column
                dxf[r0 + q] = 0.0
                dxf[r1 + q] = 0.0
        for h in range(two * np.uint64(OH), np.uint64(H)):   # odd H: the last row
            for q in range(uW):
                dxf[xb + h * uW + q] = 0.0
