"""Backward (vector-Jacobian) kernels of the differentiable layers.

Every kernel is parallel over the gradient's OWN outputs (a row, a channel, an
``(n, c)`` plane, a vocabulary row) and sums its terms in a fixed
order inside one ``prange`` iteration, so results are bitwise identical for any thread
count; nothing is ever accumulated into a shared array from ``prange``.  All arrays are
C-contiguous float64 (int64 for indices) with consistent shapes; nothing is validated.

The convolution gradients are Layers II's entry points (``_kernels/conv_plan.py``:
``conv_transpose_nd`` for the input, ``conv_weight_grad_nd`` for the weights).
"""

import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._jit import block_count, block_size, helper, inlined, span_kernel
from .reduce import _run_sum
from ._simd import _I64, _VTY, _VW, _accepts, _block_columns, _data, _splat, _vptr


# --------------------------------------------------------------------------- row norms
# ~1.2 ns per element on one thread: parallel from 32k elements; the tasks (rows // VW
# groups of VW rows, then rows % VW single rows) in at most 32 blocks
@span_kernel(iterations=lambda x, y, g, w, rows, *rest: block_count(rows // _VW + rows % _VW,
                                                                  32),
             work=lambda x, *rest: x.shape[0], scale=0.25)
def norm_rows_backward(x, y, g, w, rows, n, eps, center, dx, t0, t1):
    """Layer norm (``center``) / RMS norm backward over ``rows`` rows of length ``n``.

    With ``r = 1 / sqrt(var + eps)`` (``var`` the population variance, or ``mean(x^2)``
    when not centering), ``y`` the normalised forward value ``xhat`` and
    ``gh[j] = g[j] * w[j]`` (rounded; ``w`` of length ``n``, the per-element weight of
    the affine map, all ones without one: ``g * 1.0`` is ``g`` exactly)::

        dx = r * (gh - [center] mean(gh) - y * mean(gh * y))

    Every sum runs over its row in increasing ``j`` from 0.0.  Rows are taken ``VW`` at
    a time (4 on AVX2, 8 on AVX-512), one row per vector lane (:func:`_lane_sums`: each
    ``VW x VW`` block of the rows transposed, so that lane ``i``'s chain is row ``i``'s
    sum in order: the same operations per row, so the same bits, a vector add per
    column instead of ``VW`` scalar ones); the last ``rows % VW`` rows one by one.

    A span kernel over blocks of those tasks (:func:`._jit.block_size`): one compilation
    for serial and parallel calls (as a ``prange`` kernel: 1.9 s, plus 0.8 s for its serial
    twin, fresh cache)."""
    nq = rows // _VW
    ntask = nq + rows % _VW
    per = block_size(ntask, 32)
    sums = np.empty(4 * _VW)
    inv_n = 1.0 / n
    un = np.uint64(n)
    for t in range(t0 * per, min(ntask, t1 * per)):
        if t < nq:
            # VW rows: their sums by _lane_sums, then each row's output as _one_row
            # forms it (written here: an inlined helper's array arguments cost atomic
            # reference-count updates per call)
            base = _VW * t * n
            _lane_sums(x, y, g, w, base, n, inv_n, center, sums)
            for k in range(_VW):
                r = 1.0 / math.sqrt(sums[_VW + k] * inv_n + eps)
                mg = sums[2 * _VW + k] * inv_n if center else 0.0
                mgy = sums[3 * _VW + k] * inv_n
                ub = np.uint64(base + k * n)
                for j in range(un):
                    dx[ub + j] = r * (g[ub + j] * w[j] - mg - y[ub + j] * mgy)
        else:
            _one_row(x, y, g, w, (_VW * nq + t - nq) * n, n, eps, center, dx)


@intrinsic
def _lane_sums(typingctx, x, y, g, w, base, n, inv_n, center, out):
    """The four chains of :func:`_one_row` for the ``VW`` rows of length ``n`` at ``base``
    (row ``i`` at ``base + i*n``), row ``i`` in vector lane ``i``: ``out[0:VW]`` the means
    ``m`` (``sum x * inv_n``, 0.0 when not ``center``), ``out[VW:2VW]`` the sums of
    ``(x - m) * (x - m)``, ``out[2VW:3VW]`` the sums of ``gh = g * w[j]`` and
    ``out[3VW:4VW]`` the sums of ``gh * y``: every sum from 0.0 over ``j`` in increasing
    order, each product rounded, then added (no fused multiply-add) -- exactly
    :func:`_one_row`'s operations.  The ``VW`` rows' values of each column come from a
    transposed ``VW x VW`` block (vector loads along the rows, shuffles); the last
    ``n % VW`` columns element by element.  1-D C-contiguous float64 arrays; the caller
    guarantees the addresses."""
    if not (_accepts(f64=(x, y, g, w, out), ints=(base, n)) and isinstance(inv_n, types.Float)
            and isinstance(center, types.Boolean)):
        return None
    sig = types.void(x, y, g, w, types.int64, types.int64, types.float64, types.boolean, out)
    i32 = llvm_ir.IntType(32)

    def codegen(context, builder, signature, args):
        xa, ya, ga, wa, bv, nv, invv, cv, oa = args
        t = signature.args
        xd, yd, gd, wd, od = (_data(context, builder, t[q], args[q]) for q in (0, 1, 2, 3, 8))
        zero = llvm_ir.Constant(_VTY, [0.0] * _VW)
        undef = llvm_ir.Constant(_VTY, llvm_ir.Undefined)
        nfull = builder.sub(nv, builder.srem(nv, llvm_ir.Constant(_I64, _VW)))
        ptrs = {q: builder.gep(d, [bv]) for q, d in (("x", xd), ("y", yd), ("g", gd))}

        def columns(name, j0):
            """The VW columns j0 .. j0+VW-1 of the rows of ``name``, one vector each."""
            return _block_columns(builder, builder.gep(ptrs[name], [j0]), nv)

        def column(name, j):
            """Column ``j`` of the rows of ``name`` (the tail), element by element."""
            v = undef
            for r in range(_VW):
                p = builder.gep(ptrs[name], [builder.add(j, builder.mul(
                    llvm_ir.Constant(_I64, r), nv))])
                v = builder.insert_element(v, builder.load(p), llvm_ir.Constant(i32, r))
            return v

        def chain(step):
            """``step(j0, False)`` for the full blocks (columns ``j0 .. j0+VW-1``), then
            ``step(j, True)`` for each tail column."""
            with cgutils.for_range_slice(builder, llvm_ir.Constant(_I64, 0), nfull,
                                         llvm_ir.Constant(_I64, _VW)) as (j0, _):
                step(j0, False)
            with cgutils.for_range_slice(builder, nfull, nv, llvm_ir.Constant(_I64, 1)) \
                    as (j, _):
                step(j, True)

        # pass 1: the means (when centering)
        acc_m = cgutils.alloca_once_value(builder, zero)
        with builder.if_then(context.cast(builder, cv, t[7], types.boolean)):
            def add_x(j, tail):
                cols = [column("x", j)] if tail else columns("x", j)
                for c in cols:
                    builder.store(builder.fadd(builder.load(acc_m), c), acc_m)
            chain(add_x)
            builder.store(builder.fmul(builder.load(acc_m), _splat(builder, invv)), acc_m)
        m = builder.load(acc_m)
        # pass 2: the squared deviations
        acc_v = cgutils.alloca_once_value(builder, zero)

        def add_d(j, tail):
            cols = [column("x", j)] if tail else columns("x", j)
            for c in cols:
                d = builder.fsub(c, m)
                builder.store(builder.fadd(builder.load(acc_v), builder.fmul(d, d)), acc_v)
        chain(add_d)
        # pass 3: sum gh and sum gh*y, gh = g * w[j]
        acc_s = cgutils.alloca_once_value(builder, zero)
        acc_q = cgutils.alloca_once_value(builder, zero)

        def add_g(j, tail):
            gs = [column("g", j)] if tail else columns("g", j)
            ys = [column("y", j)] if tail else columns("y", j)
            for c in range(len(gs)):
                wj = builder.load(builder.gep(wd, [builder.add(j, llvm_ir.Constant(_I64, c))]))
                h = builder.fmul(gs[c], _splat(builder, wj))
                builder.store(builder.fadd(builder.load(acc_s), h), acc_s)
                builder.store(builder.fadd(builder.load(acc_q), builder.fmul(h, ys[c])), acc_q)
        chain(add_g)
        for q, v in enumerate((m, builder.load(acc_v), builder.load(acc_s),
                               builder.load(acc_q))):
            builder.store(v, _vptr(builder, od, q * _VW), align=8)
        return context.get_dummy_value()

    return sig, codegen


@inlined
def _one_row(x, y, g, w, base, n, eps, center, dx):
    """One row of :func:`norm_rows_backward` (row offset ``base``)."""
    inv_n = 1.0 / n
    m = 0.0
    if center:
        for j in range(n):
            m += x[base + j]
        m *= inv_n
    v = 0.0
    for j in range(n):
        d = x[base + j] - m
        v += d * d
    v *= inv_n
    r = 1.0 / math.sqrt(v + eps)
    sg = 0.0
    sgy = 0.0
    for j in range(n):
        gh = g[base + j] * w[j]
        sg += gh
        sgy += gh * y[base + j]
    mg = sg * inv_n if center else 0.0
    mgy = sgy * inv_n
    for j in range(n):
        dx[base + j] = r * (g[base + j] * w[j] - mg - y[base + j] * mgy)


# --------------------------------------------------------------------------- batch norm
@span_kernel(iterations=lambda x, g, N, C, *rest: C, work=lambda x, *rest: x.size)
def batch_norm_backward(x, g, N, C, S, eps, gamma, training, run_mean, run_var,
                        dx, dgamma, dbeta, t0, t1):
    """Batch norm backward, parallel over channels; ``x``/``g``/``dx`` are ``[N, C, S]``
    flattened.

    TRAINING (batch statistics, ``m = N S``; ``xh = (x - mean) r``)::

        dbeta = sum g;  dgamma = sum g xh;  dx = gamma r (g - dbeta/m - xh dgamma/m)

    INFERENCE (running statistics, ``r = 1 / (2 sqrt(rv/4 + eps/4))``): ``dx = g gamma r``,
    ``dgamma = sum g (x - rm) r``, ``dbeta = sum g``.  A span kernel over the channels
    ``t0 .. t1-1`` (:class:`~._jit.SpanKernel`; called without them).
    """
    m = N * S
    for c in range(t0, t1):
        if training:
            mu = 0.0
            for n in range(N):
                base = (n * C + c) * S
                for s in range(S):
                    mu += x[base + s]
            mu /= m
            v = 0.0
            for n in range(N):
                base = (n * C + c) * S
                for s in range(S):
                    d = x[base + s] - mu
                    v += d * d
            v /= m
            r = 1.0 / math.sqrt(v + eps)
        else:
            mu = run_mean[c]
            r = 1.0 / (2.0 * math.sqrt(0.25 * run_var[c] + 0.25 * eps))
        sg = 0.0
        sgx = 0.0
        for n in range(N):
            base = (n * C + c) * S
            for s in range(S):
                gv = g[base + s]
                sg += gv
                sgx += gv * ((x[base + s] - mu) * r)
        dbeta[c] = sg
        dgamma[c] = sgx
        k = gamma[c] * r
        if training:
            a = sg / m
            b = sgx / m
            for n in range(N):
                base = (n * C + c) * S
                for s in range(S):
                    dx[base + s] = k * (g[base + s] - a - ((x[base + s] - mu) * r) * b)
        else:
            for n in range(N):
                base = (n * C + c) * S
                for s in range(S):
                    dx[base + s] = k * g[base + s]


# --------------------------------------------------------------------------- embedding
@helper
def _embedding_groups(indices, V):
    """``(start, order)``: the positions ``0 .. L-1`` grouped by their row (a stable
    counting sort): row ``v``'s positions, in increasing order, are
    ``order[start[v]:start[v + 1]]``."""
    L = indices.shape[0]
    start = np.zeros(V + 1, dtype=np.int64)
    for i in range(L):
        start[indices[i] + 1] += 1
    for v in range(V):
        start[v + 1] += start[v]
    fill = start[:V].copy()
    order = np.empty(L, dtype=np.int64)
    for i in range(L):
        v = indices[i]
        order[fill[v]] = i
        fill[v] += 1
    return start, order


@span_kernel(iterations=lambda g, start, order, dw: dw.shape[0],
             work=lambda g, start, order, dw: g.size + dw.size)
def _embedding_rows(g, start, order, dw, v0, v1):
    """Rows ``v0 .. v1-1`` of :func:`embedding_backward` (each row summed on its own)."""
    F = g.shape[1]
    for v in range(v0, v1):
        row = dw[v]
        for f in range(F):
            row[f] = 0.0
        for p in range(start[v], start[v + 1]):
            gi = g[order[p]]
            for f in range(F):
                row[f] += gi[f]


def embedding_backward(indices, g, V, dw):
    """``dw[v] = sum over positions i with indices[i] == v of g[i]`` (``g [L, F]``,
    ``dw [V, F]``), summed in increasing ``i``.

    A serial counting sort groups the positions by row (stable), then the rows are
    processed in parallel (a span kernel over the rows): each row of ``dw`` is summed
    by one task, in increasing position order, so the bits do not depend on the schedule.
    """
    start, order = _embedding_groups(indices, V)
    _embedding_rows(g, start, order, dw)


# --------------------------------------------------------------------------- convolution

_SHORT_ROWS = 9     # output rows shorter than this: im2col gathers through a map


@inlined
def _unfold_row(r, KK, kh, kw):
    """Row ``r`` of an unfolded input, ``(c, i, j, k)``: channel ``c`` and kernel tap
    ``(i, j, k)`` (rows are channel-major, taps in C order; ``KK = kd*kh*kw``)."""
    t = r % KK
    return r // KK, t // (kh * kw), (t // kw) % kh, t % kw


@inlined
def _im2col_gather(x, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw, OD, OH, OW, cols, t0,
                   t1):
    """:func:`im2col`'s rows ``t0 .. t1-1`` for short output rows: per row, the source of
    every output position within one input plane (or -1: padding) is computed once, then
    each image's segment of the row is a gather through that map (the row-wise copy
    paid loop and branch overhead per run of a few elements: 64 x 16 planes of 4 x 4,
    3 x 3 taps, one thread, AVX-512: 179-195 -> 70-76 us; 64 planes of 8 x 8 25 -> 17;
    rows of 14 or 16 were slower gathered, 0.42 -> 0.6 ns per element).  The same values;
    ``x`` and ``cols`` C-contiguous."""
    N, C, D, H, W = x.shape
    KK = kd * kh * kw
    P = OD * OH * OW
    S = D * H * W
    xf = x.ravel()      # a view: only a C-contiguous x comes here
    idx = np.empty(P, dtype=np.int64)
    uP = np.uint64(P)
    for r in range(t0, t1):
        c, i, j, k = _unfold_row(r, KK, kh, kw)
        for od in range(OD):
            di = od * sd - pd + i * dd
            for oh in range(OH):
                hj = oh * sh - ph + j * dh
                for ow in range(OW):
                    wk = ow * sw - pw + k * dw
                    inside = 0 <= di < D and 0 <= hj < H and 0 <= wk < W
                    idx[(od * OH + oh) * OW + ow] = (di * H + hj) * W + wk if inside else -1
        row = cols[r]
        for n in range(N):
            src = np.uint64((n * C + c) * S)
            ub = np.uint64(n * P)
            for p in range(uP):
                v = idx[p]
                e = xf[src + np.uint64(max(v, 0))]
                row[ub + p] = e if v >= 0 else 0.0


@span_kernel(iterations=lambda x, kd, kh, kw, *rest: x.shape[1] * kd * kh * kw,
             work=lambda *args: args[-1].size)
def im2col(x, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw, OD, OH, OW, cols, t0, t1):
    """Unfold ``x [N, C, D, H, W]`` into ``cols [C*kd*kh*kw, N*OD*OH*OW]``: row
    ``(c, i, j, k)``, column ``(n, od, oh, ow)`` holds ``x[n, c, od*sd - pd + i*dd,
    oh*sh - ph + j*dh, ow*sw - pw + k*dw]`` (0 outside ``x``: zero padding).  Parallel
    over rows; every write is a plain copy, contiguous along ``ow`` (output rows shorter
    than ``_SHORT_ROWS``: a gather through a per-row map, :func:`_im2col_gather`).  A span
    kernel over the rows ``t0 .. t1-1``: called as ``im2col(x, ..., cols)``."""
    N, C, D, H, W = x.shape
    KK = kd * kh * kw
    P = OD * OH * OW
    if OW < _SHORT_ROWS and x.flags.c_contiguous and cols.flags.c_contiguous:
        _im2col_gather(x, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw, OD, OH, OW, cols, t0,
                       t1)
        return
    for r in range(t0, t1):
        c, i, j, k = _unfold_row(r, KK, kh, kw)
        row = cols[r]
        # ow*sw + off inside [0, W) exactly for ow0 <= ow < ow1
        off = k * dw - pw
        ow0 = min(OW, max(0, (sw - 1 - off) // sw))
        ow1 = max(ow0, min(OW, (W - off + sw - 1) // sw))
        us = np.uint64(ow0 * sw + off)
        usw = np.uint64(sw)
        for n in range(N):
            for od in range(OD):
                di = od * sd - pd + i * dd
                for oh in range(OH):
                    hj = oh * sh - ph + j * dh
                    base = n * P + (od * OH + oh) * OW
                    if di < 0 or di >= D or hj < 0 or hj >= H:
                        for ow in range(OW):
                            row[base + ow] = 0.0
                        continue
                    xr = x[n, c, di, hj]
                    for ow in range(ow0):
                        row[base + ow] = 0.0
                    # unsigned indices: no negative-index wrap-around in the copy
                    ub = np.uint64(base + ow0)
                    for q in range(np.uint64(ow1 - ow0)):
                        row[ub + q] = xr[us + q * usw]
                    for ow in range(ow1, OW):
                        row[base + ow] = 0.0


@span_kernel(iterations=lambda *args: args[-1].shape[0] * args[-1].shape[1],
             work=lambda cols, *rest: cols.size)
def col2im(cols, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw, OD, OH, OW, dx, t0, t1):
    """Adjoint of :func:`im2col`: ``dx[n, c, p] = sum of cols[(c, k), (n, o)]`` over every
    ``(k, o)`` that reads input position ``p``.  Parallel over ``(n, c)`` planes (each
    iteration owns one plane of ``dx``); within a plane the terms are added in the fixed
    order ``(i, j, k, od, oh, ow)``.  A span kernel over the planes ``t = n*C + c`` in
    ``t0 .. t1-1``: called as ``col2im(cols, ..., dx)``."""
    N, C, D, H, W = dx.shape
    KK = kd * kh * kw
    P = OD * OH * OW
    for t in range(t0, t1):
        n = t // C
        c = t % C
        plane = dx[n, c]
        for a in range(D):
            for b in range(H):
                for e in range(W):
                    plane[a, b, e] = 0.0
        for i in range(kd):
            for j in range(kh):
                for k in range(kw):
                    row = cols[c * KK + (i * kh + j) * kw + k]
                    # the ow with ow*sw + off inside [0, W), in increasing order
                    off = k * dw - pw
                    ow0 = min(OW, max(0, (sw - 1 - off) // sw))
                    ow1 = max(ow0, min(OW, (W - off + sw - 1) // sw))
                    us = np.uint64(ow0 * sw + off)
                    usw = np.uint64(sw)
                    nw = np.uint64(ow1 - ow0)
                    for od in range(OD):
                        di = od * sd - pd + i * dd
                        if di < 0 or di >= D:
                            continue
                        for oh in range(OH):
                            hj = oh * sh - ph + j * dh
                            if hj < 0 or hj >= H:
                                continue
                            pr = plane[di, hj]
                            base = n * P + (od * OH + oh) * OW
                            ub = np.uint64(base + ow0)
                            for q in range(nw):
                                pr[us + q * usw] += row[ub + q]


@span_kernel(iterations=lambda g, out, sums: g.shape[1], work=lambda g, out, sums: out.size)
def channels_first(g, out, sums, c0, c1):
    """``g [N, C, P] -> out [C, N*P]`` (a transposing copy; a span kernel over the
    channels ``c0 .. c1-1``: called as ``channels_first(g, out, sums)``), and, when
    ``sums`` has ``C`` entries (else none), ``sums[c]`` = channel ``c``'s sum in
    :func:`.reduce.sum_to`'s order for ``g`` summed to ``[C]`` (``[R1, K, R2] = [N, C,
    P]``: per ``n`` in order the eight-partial sum of the ``P`` values, from +0.0) --
    the bias gradient of a convolution from the run just copied, while it is in cache,
    instead of a second pass over ``g``.  ``P > 1`` for the sums (``sum_to`` adds single
    values without the run sum)."""
    N, P = g.shape[0], g.shape[2]
    total = sums.shape[0] > 0
    of = out.reshape(-1)
    for c in range(c0, c1):
        acc = 0.0
        for n in range(N):
            for p in range(P):
                out[c, n * P + p] = g[n, c, p]
            if total:
                acc += _run_sum(of, (c * N + n) * P, P)
        if total:
            sums[c] = acc
