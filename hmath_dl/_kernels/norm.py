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

Layer / RMS / group / instance norm run :func:`normalize_rows_affine`: the statistics,
``xhat``, then ``(xhat * w) + b`` in the same pass (two roundings); without an affine
map ``w`` is all ones and there is no ``b`` (``xhat * 1.0`` is ``xhat`` exactly).

Determinism: each group is reduced entirely inside one ``prange`` iteration, in a fixed
order (fast path: ``lanes`` interleaved partial sums per chunk, added in order;
scaled path: serial; chunks and segments in order), so results do not depend on the thread count.

Accuracy / overflow: statistics are two-pass (mean, then the mean of squared
deviations) over cache-resident chunks of at most 2048 elements, merged in order with
Chan's update, so memory is read once for the statistics and once for the output.  When a sum or a sum of squares is not finite although every input is,
the group is recomputed on inputs scaled by an exact power of two ``s = 2**-e`` chosen
so that ``max|x| * s < 1``; the normalised output is then
``(x s - mean_s) / sqrt(var_s + eps s**2)``, mathematically identical.  The fast path
uses ``s = 1`` (multiplying by 1.0 is exact).

Status codes (one int8 per group, :mod:`.status`): OK, NONFINITE_INPUT (the group holds a
NaN/inf input), OVERFLOW (a result is not representable) and, for weight norm, ZERO_SLICE
(the slice is all zeros).  The facades turn them into NonFiniteError / NumericOverflow /
DomainError with :func:`hmath_dl._checks.finish`.
"""

import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._jit import block_count, block_size, helper, inlined, kernel, span_kernel
from ._simd import _VW, _data, _is_c1
from .checks import span_finite
from .status import NONFINITE_INPUT, OK, OVERFLOW, ZERO_SLICE

_HUGE = 1.0e300
_CHUNK = 2048  # elements per cache-resident chunk of the one-pass statistics
LANES = 32  # partial sums per reduction; pass it as the ``lanes`` kernel argument
# the row norms do ~2 ns of work per element on one thread (statistics and output, short
# rows): parallel from a quarter of the package's element threshold
_ROW_SCALE = 0.25


@intrinsic
def _lane_blocks(typingctx, row, start, nb, m, sq, acc, aoff):
    """The lane sums of :func:`_sum` (``sq`` False) or :func:`_sumsq` about ``m`` (``sq``
    True) over the first ``nb`` blocks of ``LANES`` elements of ``row[start:]``, into
    ``acc[aoff .. aoff+LANES-1]`` (offsets rather than slices: a slice costs an atomic
    reference count increment and decrement).  Lane ``k``: ``0.0 + e_k + e_(k+LANES) +
    ...`` in order (for ``sq`` each term ``(e - m) * (e - m)`` rounded, then added: no
    fused multiply-add), kept in vector registers for the whole loop (the lane loop
    written in Numba reloads and stores its array of sums for every block).  The same operations in the same order as
    the loops of :func:`_sum` and :func:`_sumsq`: the same bits."""
    if not (_is_c1(row, types.float64) and _is_c1(acc, types.float64)
            and isinstance(nb, types.Integer) and isinstance(m, types.Float)
            and isinstance(start, types.Integer) and isinstance(aoff, types.Integer)
            and isinstance(sq, types.Boolean)):
        return None
    literal = sq.literal_value if isinstance(sq, types.BooleanLiteral) else None
    sig = types.void(row, types.int64, types.int64, types.float64, types.boolean, acc,
                     types.int64)
    nv = LANES // _VW
    vty = llvm_ir.VectorType(llvm_ir.DoubleType(), _VW)
    i64 = llvm_ir.IntType(64)

    def codegen(context, builder, signature, args):
        rowv, stv, nbv, mv, sqv, accv, aov = args
        src = builder.gep(_data(context, builder, signature.args[0], rowv), [stv])
        dst = builder.gep(_data(context, builder, signature.args[5], accv), [aov])
        zero = llvm_ir.Constant(vty, [0.0] * _VW)
        slots = [cgutils.alloca_once_value(builder, zero) for _ in range(nv)]
        mvec = cgutils.alloca_once_value(builder, zero)
        undef = llvm_ir.Constant(vty, llvm_ir.Undefined)
        zmask = llvm_ir.Constant(llvm_ir.VectorType(llvm_ir.IntType(32), _VW), [0] * _VW)
        builder.store(builder.shuffle_vector(builder.insert_element(
            undef, mv, llvm_ir.Constant(llvm_ir.IntType(32), 0)), undef, zmask), mvec)

        def blocks(square):
            mm = builder.load(mvec)
            with cgutils.for_range(builder, nbv) as loop:
                base = builder.gep(src, [builder.mul(loop.index, llvm_ir.Constant(i64, LANES))])
                for v in range(nv):
                    p = builder.bitcast(builder.gep(base, [llvm_ir.Constant(i64, v * _VW)]),
                                        vty.as_pointer())
                    e = builder.load(p, align=8)
                    if square:
                        d = builder.fsub(e, mm)
                        e = builder.fmul(d, d)
                    builder.store(builder.fadd(builder.load(slots[v]), e), slots[v])

        if literal is not None:          # the usual case: the caller's constant
            blocks(literal)
        else:
            flag = sqv if sqv.type == llvm_ir.IntType(1) else builder.trunc(
                sqv, llvm_ir.IntType(1))
            with builder.if_else(flag) as (then, other):
                with then:
                    blocks(True)
                with other:
                    blocks(False)
        for v in range(nv):
            p = builder.bitcast(builder.gep(dst, [llvm_ir.Constant(i64, v * _VW)]),
                                vty.as_pointer())
            builder.store(builder.load(slots[v]), p, align=8)
        return context.get_dummy_value()

    return sig, codegen


@inlined
def _lanes_of(acc):
    """``LANES``, the only lane count the statistics use (:func:`_lane_blocks` keeps
    exactly that many sums in registers); ``acc`` must hold that many."""
    if acc.shape[0] != LANES:
        raise ValueError("norm statistics: the lane sums need LANES (32) slots")
    return LANES


@inlined
def _sum(row, acc):
    """sum(row): ``L = LANES`` interleaved partial sums from +0.0 (lane ``k`` takes
    elements ``k, k+L, ...``; kept in registers by :func:`_lane_blocks`, their values
    left in ``acc``), lanes added in order, then the tail.  The order is fixed, hence
    deterministic."""
    lanes = _lanes_of(acc)
    n = row.shape[0]
    nb = n // lanes
    _lane_blocks(row, 0, nb, 0.0, False, acc, 0)
    t = 0.0
    for k in range(lanes):
        t += acc[k]
    for i in range(nb * lanes, n):
        t += row[i]
    return t


@inlined
def _sumsq(row, m, acc):
    """sum((row - m)**2), same order as :func:`_sum`."""
    lanes = _lanes_of(acc)
    n = row.shape[0]
    nb = n // lanes
    _lane_blocks(row, 0, nb, m, True, acc, 0)
    t = 0.0
    for k in range(lanes):
        t += acc[k]
    for i in range(nb * lanes, n):
        d = row[i] - m
        t += d * d
    return t


@helper
def _sum_scaled(row, s):
    """sum(row * s) (slow path; serial order)."""
    t = 0.0
    for i in range(row.shape[0]):
        t += row[i] * s
    return t


@helper
def _sumsq_scaled(row, s, m):
    """sum((row * s - m)**2) (slow path; serial order)."""
    t = 0.0
    for i in range(row.shape[0]):
        d = row[i] * s - m
        t += d * d
    return t


@helper
def _group_sum(x, base, nseg, seglen, segstride, s, acc):
    t = 0.0
    for j in range(nseg):
        st = base + j * segstride
        if s == 1.0:
            t += _sum(x[st:st + seglen], acc)
        else:
            t += _sum_scaled(x[st:st + seglen], s)
    return t


@helper
def _group_sumsq(x, base, nseg, seglen, segstride, s, m, acc):
    t = 0.0
    for j in range(nseg):
        st = base + j * segstride
        if s == 1.0:
            t += _sumsq(x[st:st + seglen], m, acc)
        else:
            t += _sumsq_scaled(x[st:st + seglen], s, m)
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
    """Power of two ``2**-e`` with ``max|x| * 2**-e`` in ``[0.5, 1)`` (1.0 for all zeros;
    at most ``2**1020`` for subnormal-only groups)."""
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


@inlined
def _group_moments(x, base, nseg, seglen, segstride, acc):
    """(mean, sum of squared deviations) of a group, reading it from memory once.

    The group is cut into chunks of at most ``_CHUNK`` elements (cache-resident); each
    chunk gets an exact two-pass mean and sum of squared deviations, and the chunks are
    merged in order with Chan's pairwise update
    ``M2 = M2_a + M2_b + delta**2 * n_a * n_b / n``.  A group of one chunk is plain
    two-pass: ``mean = sum / n``, ``M2 = sum((x - mean)**2)``.
    """
    na = 0.0
    mean = 0.0
    m2 = 0.0
    for j in range(nseg):
        st = base + j * segstride
        seg = x[st:st + seglen]
        nch = (seglen + _CHUNK - 1) // _CHUNK
        for k in range(nch):
            lo = k * _CHUNK
            hi = min(seglen, lo + _CHUNK)
            chunk = seg[lo:hi]
            nb = float(hi - lo)
            mb = _sum(chunk, acc) / nb
            qb = _sumsq(chunk, mb, acc)
            n = na + nb
            delta = mb - mean
            mean = mean + delta * (nb / n)
            m2 = m2 + qb + delta * delta * (na * nb / n)
            na = n
    return mean, m2


@helper
def _group_stats(x, base, nseg, seglen, segstride, center, acc):
    """(scale s, mean of x*s (0 when not centering), mean of (x*s - mean)**2, status)."""
    count = nseg * seglen
    s = 1.0
    m = 0.0
    if center:
        m, q = _group_moments(x, base, nseg, seglen, segstride, acc)
        if not (m - m == 0.0):
            if not _group_all_finite(x, base, nseg, seglen, segstride):
                return 1.0, 0.0, 0.0, NONFINITE_INPUT
            s = _group_scale(x, base, nseg, seglen, segstride)
            m = _group_sum(x, base, nseg, seglen, segstride, s, acc) / count
            q = _group_sumsq(x, base, nseg, seglen, segstride, s, m, acc)
    else:
        q = _group_sumsq(x, base, nseg, seglen, segstride, s, m, acc)
    if not (q - q == 0.0):
        if s != 1.0:
            return s, m, 0.0, OVERFLOW  # cannot happen: |x s - m| < 2
        if not _group_all_finite(x, base, nseg, seglen, segstride):
            return 1.0, 0.0, 0.0, NONFINITE_INPUT
        s = _group_scale(x, base, nseg, seglen, segstride)
        if s == 1.0:
            return s, m, 0.0, OVERFLOW  # cannot happen: max|x| >= 1e154 here
        if center:
            m = _group_sum(x, base, nseg, seglen, segstride, s, acc) / count
        q = _group_sumsq(x, base, nseg, seglen, segstride, s, m, acc)
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


@inlined
def _four_lanes(x, b, n, m, sq, acc):
    """The lane sums of :func:`_sum` (``sq`` False) or :func:`_sumsq` about ``m[j]``
    (``sq`` True) of the four rows of length ``n`` at ``b[0..3]``, into ``acc`` (row
    ``j`` in ``acc[j*lanes:(j+1)*lanes]``)."""
    if acc.shape[0] != 4 * LANES:
        raise ValueError("norm statistics: the lane sums need 4*LANES slots")
    lanes = LANES
    nb = n // lanes
    for j in range(4):      # each row's lane sums in registers (:func:`_lane_blocks`)
        _lane_blocks(x, b[j], nb, m[j], sq, acc, j * lanes)


@inlined
def _four_totals(acc):
    """The four rows' lane sums of ``acc`` added in order, the four chains side by side."""
    lanes = np.uint64(acc.shape[0] // 4)
    t0 = t1 = t2 = t3 = 0.0
    for k in range(lanes):
        t0 += acc[k]
        t1 += acc[lanes + k]
        t2 += acc[2 * lanes + k]
        t3 += acc[3 * lanes + k]
    return t0, t1, t2, t3


@helper
def _four_stats(x, base, n, center, acc):
    """``(means, variances, ok)`` of the four rows of length ``n <= _CHUNK`` starting at
    ``base``: :func:`_group_stats`'s unscaled path with every operation of its own (one
    chunk: ``_group_moments``'s update from zero; RMS: ``0.0 +`` the sum of squares
    about 0.0), so the same bits, the four rows' chains side by side (:func:`_sum` and
    :func:`_sumsq`: lane sums, lanes in order, then the tail).  ``ok[j]`` False: row
    ``j``'s sums are not finite (the caller runs :func:`_group_stats` for it).

    RMS goes through the centred formulas with mean 0.0: ``0.0 + (0.0 - 0.0) * w`` is
    ``0.0`` and ``(0.0 + q) + 0.0`` is ``0.0 + q`` for the finite ``q >= 0`` kept."""
    b = (base, base + n, base + 2 * n, base + 3 * n)
    lanes = acc.shape[0] // 4
    t0 = lanes * (n // lanes)                  # the tail: elements t0 .. n-1 of each row
    mbs = (0.0, 0.0, 0.0, 0.0)
    nb = float(n)
    if center:
        _four_lanes(x, b, n, mbs, False, acc)
        s0, s1, s2, s3 = _four_totals(acc)
        for i in range(t0, n):
            s0 += x[b[0] + i]
            s1 += x[b[1] + i]
            s2 += x[b[2] + i]
            s3 += x[b[3] + i]
        mbs = (s0 / nb, s1 / nb, s2 / nb, s3 / nb)
    _four_lanes(x, b, n, mbs, True, acc)
    q0, q1, q2, q3 = _four_totals(acc)
    for i in range(t0, n):
        d0 = x[b[0] + i] - mbs[0]
        d1 = x[b[1] + i] - mbs[1]
        d2 = x[b[2] + i] - mbs[2]
        d3 = x[b[3] + i] - mbs[3]
        q0 += d0 * d0
        q1 += d1 * d1
        q2 += d2 * d2
        q3 += d3 * d3
    qs = (q0, q1, q2, q3)
    w = nb / (0.0 + nb)
    z = (0.0 * nb) / (0.0 + nb)
    ms = (0.0 + (mbs[0] - 0.0) * w, 0.0 + (mbs[1] - 0.0) * w,
          0.0 + (mbs[2] - 0.0) * w, 0.0 + (mbs[3] - 0.0) * w)
    q = (0.0 + qs[0] + (mbs[0] - 0.0) * (mbs[0] - 0.0) * z,
         0.0 + qs[1] + (mbs[1] - 0.0) * (mbs[1] - 0.0) * z,
         0.0 + qs[2] + (mbs[2] - 0.0) * (mbs[2] - 0.0) * z,
         0.0 + qs[3] + (mbs[3] - 0.0) * (mbs[3] - 0.0) * z)
    ok = (ms[0] - ms[0] == 0.0 and q[0] - q[0] == 0.0,
          ms[1] - ms[1] == 0.0 and q[1] - q[1] == 0.0,
          ms[2] - ms[2] == 0.0 and q[2] - q[2] == 0.0,
          ms[3] - ms[3] == 0.0 and q[3] - q[3] == 0.0)
    vs = (q[0] / nb, q[1] / nb, q[2] / nb, q[3] / nb)
    return ms, vs, ok


# blocks of whole groups of four rows, at most 32 blocks (each block is one span call: 256
# blocks of 4 rows cost ~12 us more than 32 of 32 on two threads, 1024 rows of 64)
@span_kernel(iterations=lambda x, rows, *rest: block_count((rows + 3) // 4, 32),
             work=lambda x, *rest: x.shape[0], scale=_ROW_SCALE)
def normalize_rows_affine(x, rows, n, eps, center, lanes, w, b, has_b, per_elem, G, cpg, S,
                          check, out, status, xh, t0, t1):
    """Row-wise normalisation of the C-contiguous ``[rows, n]`` array ``x`` (flat),
    followed by an affine map, fused: ``out = (xhat * w) + b`` (two roundings: the
    product, then the sum; never a fused multiply-add; without ``has_b`` only the
    product; ``w`` all ones for no affine map: ``xhat * 1.0`` is exact).

    ``center=True``: ``xhat = (x - mean) / sqrt(var + eps)`` (population variance) --
    layer, instance and group norm.  ``center=False``: ``xhat = x / sqrt(mean(x*x) +
    eps)`` -- RMS norm.  ``status[r]`` receives the row's status code.

    ``per_elem`` (layer / RMS norm): ``w``, ``b`` have length ``n``; element ``j`` of
    every row uses ``w[j]``, ``b[j]``.  Otherwise (group / instance norm) the rows are
    ``[N * G, cpg * S]`` of an ``[N, C = G * cpg, S]`` array and element ``j`` of row
    ``r`` uses channel ``(r % G) * cpg + j // S`` (``G = C, cpg = 1`` for instance norm).
    ``check``: verify that every output is finite (status OVERFLOW otherwise); the
    facade sets it when ``max|w| * sqrt(n) + max|b|`` could exceed the float64 range
    (``|xhat| <= sqrt(n)``).  ``xh`` (flat, ``per_elem`` only): when not empty it
    receives ``xhat`` itself, bitwise the output without an affine map (the autodiff's
    record for the gradients), from the same pass; empty: not written.

    Every element is ``xhat = (x * s - mean) * r`` with the row's scale ``s`` (1.0 unless
    its sums overflowed, and ``x * 1.0`` is ``x`` exactly), ``r = 1 / sqrt(var + eps
    s**2)``.  Rows of at most ``_CHUNK`` elements go four at a time through
    :func:`_four_stats` (each row's statistics by the same operations as
    :func:`_group_stats`, so the same bits, the four rows' chains side by side; a compiled
    helper, one call per four rows); a row whose sums are not finite, and the last
    ``per % 4`` rows of a block, take :func:`_group_stats` itself.

    A span kernel over blocks of rows (four-row groups, :func:`._jit.block_size`): one
    compilation serves the serial and the parallel calls (as a ``prange`` kernel it
    compiled for 3.9 s plus 1.3 s for its serial twin; now ~1.2 s).  The row's output is written here, not in an
    inlined helper: the helper's array arguments cost an atomic reference-count increment
    and decrement each, per row (~100 ns a row; 1024 rows of 64 took 139 us on one
    thread, now 53).
    """
    per = 4 * block_size((rows + 3) // 4, 32)   # rows per block
    none = (False, False, False, False)
    zero = (0.0, 0.0, 0.0, 0.0)
    acc = np.empty(4 * lanes)
    un = np.uint64(n)
    for blk in range(t0, t1):
        r = blk * per
        r1 = min(rows, (blk + 1) * per)
        while r < r1:
            nr = min(4, r1 - r)
            ms, vs, ok = zero, zero, none
            if nr == 4 and n <= _CHUNK:
                ms, vs, ok = _four_stats(x, r * n, n, center, acc)
            for j in range(nr):
                row = r + j
                if ok[j]:
                    sc, m, v, code = 1.0, ms[j], vs[j], OK
                else:
                    # np.int64(1): a literal 1 would compile _group_stats (and its
                    # helpers) once more than batch_norm_train's call does
                    sc, m, v, code = _group_stats(x, row * n, np.int64(1), n, n, center,
                                                  acc[:lanes])
                status[row] = code
                if code != OK:
                    continue
                inv = _inv_std(v, eps, sc)
                st = row * n
                # flat unsigned offsets: no slices (each costs a reference count update)
                # and no negative-index test
                if per_elem:
                    u0 = np.uint64(st)
                    if xh.shape[0] != 0:
                        # xhat in a loop of its own, recomputed (the same operations) for
                        # the output: with both stores in one loop the compiler kept it
                        # scalar (1024 rows of 64, two threads, AVX-512: 53-63 -> 43-46 us)
                        for i in range(un):
                            xh[u0 + i] = (x[u0 + i] * sc - m) * inv
                    if has_b:
                        for i in range(un):
                            out[u0 + i] = ((x[u0 + i] * sc - m) * inv) * w[i] + b[i]
                    else:
                        for i in range(un):
                            out[u0 + i] = ((x[u0 + i] * sc - m) * inv) * w[i]
                else:
                    c0 = (row % G) * cpg
                    uS = np.uint64(S)
                    for k in range(cpg):
                        wc = w[c0 + k]
                        u0 = np.uint64(st + k * S)
                        if has_b:
                            bc = b[c0 + k]
                            for i in range(uS):
                                out[u0 + i] = ((x[u0 + i] * sc - m) * inv) * wc + bc
                        else:
                            for i in range(uS):
                                out[u0 + i] = ((x[u0 + i] * sc - m) * inv) * wc
                # np.int64(st), not a literal: a literal would compile span_finite once more
                if check and not span_finite(out, np.int64(st), st + n):
                    status[row] = OVERFLOW
            r += nr


@span_kernel(iterations=lambda x, N, C, *rest: C, work=lambda x, *rest: x.size)
def batch_norm_train(x, N, C, S, eps, gamma, beta, lanes, out, mean, var, status, t0, t1):
    """Batch norm with batch statistics on the flat ``[N, C, S]`` array ``x``.

    ``out = gamma[c] * (x - mean_c) / sqrt(var_c + eps) + beta[c]``; ``mean[c]`` and
    ``var[c]`` receive the batch mean and population variance (unscaled; ``var`` may be
    inf when it is not representable even though ``out`` is).  A span kernel over the
    channels ``t0 .. t1-1`` (:class:`~._jit.SpanKernel`; called without them).
    """
    count = N * S
    for c in range(t0, t1):
        base = c * S
        acc = np.empty(lanes)
        s, m, v, code = _group_stats(x, base, N, S, C * S, np.bool_(True), acc)  # not a literal
        status[c] = code
        if code != OK:
            continue
        mean[c] = m / s
        var[c] = (v / s) / s
        a = gamma[c] * _inv_std(v, eps, s)
        b = beta[c]
        for j in range(N):
            st = base + j * C * S
            seg = x[st:st + S]
            oseg = out[st:st + S]
            if s == 1.0:
                for i in range(S):
                    oseg[i] = (seg[i] - m) * a + b
            else:
                for i in range(S):
                    oseg[i] = (seg[i] * s - m) * a + b
        # |x s - m| * inv <= sqrt(count): the output is finite unless gamma/beta are huge
        if abs(gamma[c]) * math.sqrt(count) * 1.001 + abs(b) > _HUGE:
            if not _group_all_finite(out, base, N, S, C * S):
                status[c] = OVERFLOW


@span_kernel(iterations=lambda x, N, C, *rest: C, work=lambda x, *rest: x.size)
def batch_norm_apply(x, N, C, S, scale, shift, center, out, status, t0, t1):
    """``out = (x - center[c]) * scale[c] + shift[c]`` on the flat ``[N, C, S]`` ``x``
    (batch norm inference); ``status[c]`` is OVERFLOW when the channel's outputs are
    not all finite (the facade then tells a non-finite input from an overflow).  A span
    kernel over the channels ``t0 .. t1-1`` (:class:`~._jit.SpanKernel`; called without
    them)."""
    for c in range(t0, t1):
        base = c * S
        a = scale[c]
        b = shift[c]
        m = center[c]
        ok = True
        for j in range(N):
            st = base + j * C * S
            seg = x[st:st + S]
            oseg = out[st:st + S]
            for i in range(S):
                oseg[i] = (seg[i] - m) * a + b
            ok = ok and span_finite(oseg, np.int64(0), S)  # the segment is still in L1
        status[c] = OK if ok else OVERFLOW


@helper
def _maxabs(row, acc):
    """max |row| with ``len(acc)`` lanes (vectorisable; max is exact in any order)."""
    lanes = acc.shape[0]
    n = row.shape[0]
    nb = n // lanes
    for k in range(lanes):
        acc[k] = 0.0
    for b in range(nb):
        blk = row[b * lanes:(b + 1) * lanes]
        for k in range(lanes):
            v = abs(blk[k])
            acc[k] = v if v > acc[k] else acc[k]
    mx = 0.0
    for k in range(lanes):
        mx = max(mx, acc[k])
    for i in range(nb * lanes, n):
        mx = max(mx, abs(row[i]))
    return mx


@helper
def _sumsq_scaled_lanes(row, s, acc):
    """sum((row * s)**2) with ``len(acc)`` lanes, lanes added in order, then the tail."""
    lanes = acc.shape[0]
    n = row.shape[0]
    nb = n // lanes
    for k in range(lanes):
        acc[k] = 0.0
    for b in range(nb):
        blk = row[b * lanes:(b + 1) * lanes]
        for k in range(lanes):
            d = blk[k] * s
            acc[k] += d * d
    t = 0.0
    for k in range(lanes):
        t += acc[k]
    for i in range(nb * lanes, n):
        d = row[i] * s
        t += d * d
    return t


@kernel
def weight_norm_kernel(w, P, A, Q, magnitudes, lanes, out, status):
    """``out[p, i, q] = w[p, i, q] * magnitudes[i] / ||w[:, i, :]||`` on the flat
    ``[P, A, Q]`` array ``w``.  The norm uses an exact
    power-of-two scaling ``s`` with ``max|w_i| * s`` in ``[0.5, 1)``, so the squares
    neither overflow nor underflow: ``||w_i|| = sqrt(sum((w s)**2)) / s``.  status:
    OK, NONFINITE_INPUT (a NaN/inf in the slice), OVERFLOW, ZERO_SLICE (all zeros)."""
    for i in prange(A):
        base = i * Q
        acc = np.empty(lanes)
        mx = 0.0
        for j in range(P):
            st = base + j * A * Q
            mx = max(mx, _maxabs(w[st:st + Q], acc))
        if mx == 0.0:  # all zeros, or NaNs that the max ignored
            ok = _group_all_finite(w, base, P, Q, A * Q)
            status[i] = ZERO_SLICE if ok else NONFINITE_INPUT
            continue
        if not (mx - mx == 0.0):
            status[i] = NONFINITE_INPUT
            continue
        f0, e = math.frexp(mx)
        if e < -1020:
            e = -1020
        s = math.ldexp(1.0, -e)
        q = 0.0
        for j in range(P):
            st = base + j * A * Q
            q += _sumsq_scaled_lanes(w[st:st + Q], s, acc)
        if not (q - q == 0.0):  # a NaN (|w s| < 1 cannot overflow)
            status[i] = NONFINITE_INPUT
            continue
        # out = w * mag / ||w|| = (w * s) * (mag / sqrt(q)); sqrt(q) >= 0.5 (or >= 2**-54
        # for subnormal-only slices), |w s| < 1
        f = magnitudes[i] / math.sqrt(q)
        status[i] = OK
        for j in range(P):
            st = base + j * A * Q
            seg = w[st:st + Q]
            oseg = out[st:st + Q]
            for k in range(Q):
                oseg[k] = (seg[k] * s) * f
        if not abs(f) < 1.0e307:
            if not _group_all_finite(out, base, P, Q, A * Q):
                status[i] = OVERFLOW


# serial twins (the same functions compiled without threads) for small calls: see
# Kernel.sized in _jit.py (the names are kept for the tests that run both paths)
normalize_rows_affine_serial = normalize_rows_affine.when_small(True)
