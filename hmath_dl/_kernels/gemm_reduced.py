"""Reduced-precision GEMM kernel: float32 operands (already rounded to FP16/BF16 values),
float32 products and a float32 accumulator with a fixed k order per output.

For every output ``acc = +0.0f`` and ``acc = fl32(acc + fl32(a[i,k] * b[k,j]))`` for
``k = 0 .. K-1``.  Separate multiply and add: the micro-kernel is written in LLVM IR with
plain ``fmul``/``fadd`` (no fast-math flags, so LLVM may neither contract them into an FMA
nor reorder them).

Exact-FMA fast path: a product of two FP16 values (11 + 11 significant bits) or of two BF16
values (8 + 8 bits) has at most 22 significant bits, so it is EXACT in float32 unless it
overflows or falls below float32's normal range (2**-126).  When every product is exact,
``fma(a, b, acc) = RN(a*b + acc) = RN(fl32(a*b) + acc)`` bit for bit (signed zeros
included), so the fused micro-kernel gives exactly the specified result at twice the
arithmetic throughput.  The facade proves exactness from the operands' magnitude ranges
(always true for FP16) and otherwise runs the separate multiply/add kernel.

Blocking (the k order of every output is unchanged by it): ``b`` is packed into panels of
``NR = 16*NV`` columns (``bp[k, c] = b[k, jb*NR + c]``, zero-padded); ``a`` is read in
place, ``MR`` rows at a time.  The micro-kernel keeps an
``MR x NR`` tile of accumulators in ``MR*NV`` vector registers and runs k from 0
to K-1 inside, so every output sees exactly the sequence of the specification.  Work is
split over (panel, row-block) tiles: results are bitwise identical for any thread count.
"""

import functools

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _cpu
from ._jit import helper, inlined, kernel
from ._simd import _ROW_MAXV, _VW, _make_micro_acc
from .half import _NONE, _as_float64, finish_stats, round_run, run_verdict
from .libm import _wide
from .status import NO_INDEX

# Tile shape from the numba TARGET (never the HMATH_DL_KERNELS override: the on-disk cache
# key covers the target only).  AVX-512: 6 x 4 vectors of 16 float32 (24 zmm accumulators);
# otherwise 6 x 2 vectors of 8 (12 ymm accumulators of AVX2's 16 registers; 16-lane
# vectors there would be split into 48 ymm halves and spill).  The tile shape changes
# which outputs share a micro-kernel call, never an output's sequence of operations.
_WIDE = _cpu.machine().has("avx512f")
MR = 6                # rows per micro-tile
NV = 4 if _WIDE else 2     # vectors per micro-tile row
LANES = 16 if _WIDE else 8
NR = NV * LANES       # columns per micro-tile
MIN_TASKS = 8         # split the rows when there are fewer column panels than this
MIN_GROUP = 16        # but keep at least this many row blocks per task


def _micro_tile_codegen(fused):
    """The micro-kernel intrinsic; ``fused`` selects ``fma(a, b, acc)`` instead of
    ``fadd(acc, fmul(a, b))`` (identical results whenever every product is exact in
    float32: see :func:`gemm_f32_seq`)."""

    def micro_tile(typingctx, ap, a_off, lda, rows, bp, b_off, cp, c_off, k_count, ldc):
        return _micro_signature(ap, bp, cp), _codegen(fused)

    return micro_tile


def _micro_signature(ap, bp, cp):
    return types.void(ap, types.intp, types.intp, types.intp, bp, types.intp, cp, types.intp,
                      types.intp, types.intp)


def _codegen(fused):
    """C[0:MR, 0:NR] (float32, row stride ``ldc``, at ``cp + c_off``) = the sequential-k
    float32 product of the A rows at ``ap + a_off + r*lda`` (r < ``rows``; rows beyond
    repeat the last valid one, their results are ignored by the caller) and the packed B
    panel at ``bp + b_off`` ([K, NR])."""

    def codegen(context, builder, signature, args):
        ap_v, a_off_v, lda_v, rows_v, bp_v, b_off_v, cp_v, c_off_v, k_v, ldc_v = args
        f32 = ir.FloatType()
        vec = ir.VectorType(f32, LANES)
        i64 = ir.IntType(64)
        i32 = ir.IntType(32)
        a_base = context.make_array(signature.args[0])(context, builder, ap_v).data
        b_base = context.make_array(signature.args[4])(context, builder, bp_v).data
        c_base = context.make_array(signature.args[6])(context, builder, cp_v).data
        a_ptr = builder.gep(a_base, [a_off_v])
        last = builder.sub(rows_v, ir.Constant(i64, 1))
        a_rows = []
        for r in range(MR):
            rc = ir.Constant(i64, r)
            rr = builder.select(builder.icmp_signed("<", rc, rows_v), rc, last)
            a_rows.append(builder.gep(a_ptr, [builder.mul(rr, lda_v)]))
        b_ptr = builder.gep(b_base, [b_off_v])
        c_ptr = builder.gep(c_base, [c_off_v])
        zero = ir.Constant(vec, [0.0] * LANES)           # +0.0f
        mask0 = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)
        undef_vec = ir.Constant(vec, ir.Undefined)
        fma_fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]), "llvm.fma.v%df32" % LANES)

        entry = builder.basic_block
        loop = builder.append_basic_block("mk_loop")
        done = builder.append_basic_block("mk_done")
        has_work = builder.icmp_signed(">", k_v, ir.Constant(i64, 0))
        builder.cbranch(has_work, loop, done)

        builder.position_at_end(loop)
        k_phi = builder.phi(i64)
        k_phi.add_incoming(ir.Constant(i64, 0), entry)
        accs = []
        for _ in range(MR * NV):
            p = builder.phi(vec)
            p.add_incoming(zero, entry)
            accs.append(p)
        brow = builder.gep(b_ptr, [builder.mul(k_phi, ir.Constant(i64, NR))])
        bvecs = []
        for v in range(NV):
            q = builder.bitcast(builder.gep(brow, [ir.Constant(i64, v * LANES)]), vec.as_pointer())
            bvecs.append(builder.load(q, align=4))
        new_accs = []
        for r in range(MR):
            s = builder.load(builder.gep(a_rows[r], [k_phi]), align=4)
            bc = builder.shuffle_vector(builder.insert_element(undef_vec, s, ir.Constant(i32, 0)),
                                        undef_vec, mask0)
            for v in range(NV):
                if fused:                                # RN(a * b + acc)
                    new_accs.append(builder.call(fma_fn, [bc, bvecs[v], accs[r * NV + v]]))
                else:
                    prod = builder.fmul(bc, bvecs[v])    # fl32(a * b)
                    new_accs.append(builder.fadd(accs[r * NV + v], prod))   # fl32(acc + p)
        k_next = builder.add(k_phi, ir.Constant(i64, 1))
        k_phi.add_incoming(k_next, loop)
        for p, n in zip(accs, new_accs):
            p.add_incoming(n, loop)
        builder.cbranch(builder.icmp_signed("<", k_next, k_v), loop, done)

        builder.position_at_end(done)
        results = []
        for n in new_accs:
            res = builder.phi(vec)
            res.add_incoming(zero, entry)
            res.add_incoming(n, loop)
            results.append(res)
        for r in range(MR):
            crow = builder.gep(c_ptr, [builder.mul(ir.Constant(i64, r), ldc_v)])
            for v in range(NV):
                q = builder.bitcast(builder.gep(crow, [ir.Constant(i64, v * LANES)]), vec.as_pointer())
                builder.store(results[r * NV + v], q, align=4)
        return context.get_dummy_value()

    return codegen


_micro_tile = intrinsic(_micro_tile_codegen(False))
_micro_tile_fma = intrinsic(_micro_tile_codegen(True))


@helper
def _task(flat_a, b, out, fused, jb, g, group):
    """One task: column panel ``jb`` x row blocks ``[g*group, (g+1)*group)``.  Packs the B
    panel into a private buffer, runs the micro-kernel over the row blocks and converts
    each tile to float64.  Returns the first flat index of a non-finite output it wrote,
    or NO_INDEX (-1)."""
    M, N = out.shape
    K = b.shape[0]
    mb = (M + MR - 1) // MR
    j0 = jb * NR
    width = min(NR, N - j0)
    panel = np.zeros(K * NR, dtype=np.float32)
    for k in range(K):
        for c in range(width):
            panel[k * NR + c] = b[k, j0 + c]
    tile = np.empty(MR * NR, dtype=np.float32)
    nonfinite = np.int64(0)
    for ib in range(g * group, min(mb, (g + 1) * group)):
        i0 = ib * MR
        rows = min(MR, M - i0)
        if fused:
            _micro_tile_fma(flat_a, i0 * K, K, rows, panel, 0, tile, 0, K, NR)
        else:
            _micro_tile(flat_a, i0 * K, K, rows, panel, 0, tile, 0, K, NR)
        for r in range(rows):
            for c in range(width):
                v = np.float64(tile[r * NR + c])
                out[i0 + r, j0 + c] = v
                nonfinite |= np.int64(v * 0.0 != 0.0)   # NaN exactly for NaN/+-inf
    bad = np.int64(NO_INDEX)
    if nonfinite != 0:                              # rare: find the first offending output
        for i in range(g * group * MR, min(M, (g + 1) * group * MR)):
            for j in range(j0, j0 + width):
                if bad < 0 and not np.isfinite(out[i, j]):
                    bad = np.int64(i) * N + j
    return bad


@helper
def _tasks(M, N):
    """(number of row groups, row blocks per group).  Row blocks are split into groups
    only when there are few column panels (each task packs its panel, so fewer groups
    means less repeated packing)."""
    mb = (M + MR - 1) // MR
    nb = (N + NR - 1) // NR
    ng = max(1, min((mb + MIN_GROUP - 1) // MIN_GROUP, (MIN_TASKS + nb - 1) // nb))
    return ng, (mb + ng - 1) // ng


@kernel
def gemm_f32_seq(a, b, out, fused):
    """``out[i, j] = float64(acc)`` as described in the module docstring.  ``a`` [M, K] and
    ``b`` [K, N] are C-contiguous float32 (K >= 1), ``out`` [M, N] float64.  Returns the
    first flat index of a non-finite output (a product or the accumulator reached +-inf),
    or NO_INDEX (-1).

    ``fused``: use ``fma(a, b, acc)``.  ONLY valid (bit-identical to the separate multiply
    and add) when every product ``a[i,k] * b[k,j]`` is exact in float32, i.e. neither
    overflows nor loses bits below 2**-126: then ``RN(a*b + acc) = RN(fl32(a*b) + acc)``
    exactly, including signed zeros.  The caller proves that from the operands' ranges.

    One parallel loop over the tasks of :func:`_task`; every output is written by exactly
    one task with the same k order, so the result does not depend on the thread count."""
    M = a.shape[0]
    N = b.shape[1]
    ng, group = _tasks(M, N)
    ntasks = ((N + NR - 1) // NR) * ng
    flat_a = a.reshape(-1)
    first_bad = np.full(ntasks, NO_INDEX, dtype=np.int64)
    for t in prange(ntasks):
        jb = t // ng
        first_bad[t] = _task(flat_a, b, out, fused, jb, t - jb * ng, group)
    best = np.int64(NO_INDEX)
    for t in range(ntasks):
        if first_bad[t] >= 0 and (best < 0 or first_bad[t] < best):
            best = first_bad[t]
    return best


def gemm_seq(a, b, out, fused, serial=False):
    """:func:`gemm_f32_seq` (``serial``: its serial twin, for products too small to repay
    the start of the thread pool; bitwise the same result) as a Python int."""
    return int(gemm_f32_seq.when_small(serial)(a, b, out, fused))


# --------------------------------------------------------------------------- tiled path
# gemm_f64's loop nest on float32 (BLIS's: column panels x row panels in parallel, K in
# chunks of KC terms, a tile's chunk of packed b in L1 meeting every 6-row block of a's
# rounded rows, read in place), with the continuing micro-kernel of _simd: each output's accumulator is stored as a
# float32 between chunks and reloaded, which is exactly one chain over k = 0 .. K-1.
TCB = 6                          # rows of a per register block
TL = 2 * _VW                     # float32 lanes per vector (16 on AVX-512, 8 on AVX2)
TT = _ROW_MAXV * TL              # widest tile: 64 columns on AVX-512, 16 on AVX2
TKC = 128 if _VW == 8 else 256   # terms per K chunk: a tile's chunk of b is 32 or 16 KiB


@functools.lru_cache(maxsize=None)
def _micro(V, fused, widen=False):
    """The micro-kernel of ``V`` vectors per row (the widest the target has, if fewer)
    reading ``a`` row-major where it lies (``ak = 1``, ``aj = K``): the rounded rows of
    :func:`_pack_task`."""
    if _ROW_MAXV < V:
        return _micro(V // 2, fused, widen)
    return _make_micro_acc(TCB, V, f32=True, fused=fused, widen=widen, astrided=True)


_f1, _s1, _f2, _s2, _f4, _s4 = (_micro(v, f) for v in (1, 2, 4) for f in (True, False))
# the last chunk of a chain, stored widened into the float64 output (see _gemm_task)
_fw1, _sw1, _fw2, _sw2, _fw4, _sw4 = (_micro(v, f, True) for v in (1, 2, 4)
                                      for f in (True, False))


@inlined
def _chunk(fused, V, bpk, bbase, T, apk, ab, lda, nk, c, cb, Np, first, pf):
    """One chunk of a register block's chains (the micro-kernel for ``fused`` and ``V``
    vectors per row), its tile kept in ``c``."""
    if fused:
        if V == 4:
            _f4(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda)
        elif V == 2:
            _f2(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda)
        else:
            _f1(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda)
    elif V == 4:
        _s4(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda)
    elif V == 2:
        _s2(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda)
    else:
        _s1(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda)


@inlined
def _last_chunk(fused, V, bpk, bbase, T, apk, ab, lda, nk, c, cb, Np, first, pf, of, ob,
                N):
    """The last chunk of a register block's chains, its tile widened into the float64
    rows ``of[ob + j*N ...]``; 1 if a value is NaN/inf, else 0."""
    if fused:
        if V == 4:
            return _fw4(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda, of, ob, N)
        if V == 2:
            return _fw2(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda, of, ob, N)
        return _fw1(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda, of, ob, N)
    if V == 4:
        return _sw4(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda, of, ob, N)
    if V == 2:
        return _sw2(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda, of, ob, N)
    return _sw1(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf, 1, lda, of, ob, N)


def tile_width(n):
    """Columns per register tile for ``n`` output columns: 1, 2 or the widest number of
    vectors (narrow products get narrow tiles, so little padding is computed)."""
    for v in (1, 2):
        if n <= v * TL or _ROW_MAXV <= v:
            return v * TL
    return TT


@inlined
def _task_span(M, N, c, Np, T, bpp, tpp, t):
    """Task ``t``'s row blocks ``b0 .. b1-1`` and tiles ``t0 .. t1-1`` (tasks row-group
    major, ``bpp`` blocks x ``tpp`` tiles each) of an ``[M, N]`` product padded to ``c``'s
    ``[Mp, Np]``, and the ends of those inside ``out``: ``(b0, b1, t0, t1, full_b,
    full_t)``."""
    nmb = c.shape[0] // Np // TCB
    ntile = Np // T
    pn = (ntile + tpp - 1) // tpp
    b0 = t // pn * bpp
    b1 = min(nmb, b0 + bpp)
    t0 = t % pn * tpp
    t1 = min(ntile, t0 + tpp)
    # blocks b0 .. full_b-1 lie inside out's rows, tiles t0 .. full_t-1 inside its columns
    return b0, b1, t0, t1, min(b1, M // TCB), min(t1, N // T)


@inlined
def _gemm_task(apk, lda, bpk, c, K, Np, T, bpp, tpp, fused, out, of, t):
    """Task ``t`` of :func:`reduced_product`'s product: ``bpp`` row blocks x ``tpp``
    tiles of the sequential-k float32 product of ``apk`` (``a [Mp, K]``, row-major rows
    ``lda`` apart, read in place) and ``bpk`` (``b [K, Np]`` packed ``[Np/T, K, T]``), K
    chunk after chunk in k order (``fused``: ``fma``, valid only when every product is exact; see
    :func:`gemm_f32_seq`), written to ``out [M, N]`` (float64; ``of`` its flat view):
    blocks inside ``out`` widen their last chunk straight into it; the edge blocks (rows
    past M, columns past N) keep theirs in ``c [Mp, Np]`` (float32, flat workspace) and
    are widened from there.  Returns the first flat index ``i*N + j`` of a non-finite
    output of the task, or NO_INDEX (-1)."""
    M = out.shape[0]
    N = out.shape[1]
    b0, b1, t0, t1, full_b, full_t = _task_span(M, N, c, Np, T, bpp, tpp, t)
    V = T // TL
    bad = np.int64(0)
    for k0 in range(0, K, TKC):
        nk = min(TKC, K - k0)
        first = k0 == 0
        last = k0 + nk == K
        for tile in range(t0, t1):
            bbase = (tile * K + k0) * T
            for blk in range(b0, b1):
                ab = blk * TCB * lda + k0
                cb = blk * TCB * Np + tile * T
                pf = cb + TCB * Np if blk + 1 < b1 else b0 * TCB * Np + (tile + 1) * T
                if last and blk < full_b and tile < full_t:
                    bad |= _last_chunk(fused, V, bpk, bbase, T, apk, ab, lda, nk, c, cb, Np,
                                       first, pf, of, blk * TCB * N + tile * T, N)
                else:
                    _chunk(fused, V, bpk, bbase, T, apk, ab, lda, nk, c, cb, Np, first, pf)
    return _task_edges(c, Np, out, b0, b1, t0, t1, full_b, full_t, T, bad)


@inlined
def _skinny_task(a, b, apk, lda, bpk, c, Np, T, bpp, tpp, kc, fused, fresh, fixed, part,
                 mbits, bias, out, of, t):
    """Task ``t`` of :func:`reduced_skinny`'s product: :func:`_gemm_task`'s loop nest
    (``kc`` terms per chunk) for a skinny product, whose short operand was rounded
    before (``apk`` or ``bpk``) and whose long operand (float64) is rounded here, into
    the task's own buffer, right before it is used, so that it is read once and never
    written back:
    ``fresh`` 1 (few columns: ``a``), each row block's six whole rows in one go (long
    runs: rows read a chunk at a time were streamed at half the speed); ``fresh`` 2 (few
    rows: ``b``), the task's columns of ``kc`` rows at a time.  Each part so rounded runs
    ``fused`` where ``fused`` allows it and :func:`_products_exact` holds for ``fixed``
    (the finished statistics of the operand rounded before) and its own (the exact-FMA
    kernel gives the specified bits wherever its products are exact, so the choice may
    differ from part to part); the statistics fold into ``part[t]`` (raw, for the
    caller's verdict)."""
    M = out.shape[0]
    N = out.shape[1]
    K = a.shape[1]
    b0, b1, t0, t1, full_b, full_t = _task_span(M, N, c, Np, T, bpp, tpp, t)
    V = T // TL
    # the fresh operand's buffers: a block's rows, lda apart (zero past M); b's tiles
    # [kc, T] and the rounded part of a row (zero past N)
    ach = np.zeros(TCB * lda if fresh == 1 else 0, dtype=np.float32)
    bch = np.empty((t1 - t0) * kc * T if fresh == 2 else 0, dtype=np.float32)
    row = np.zeros((t1 - t0) * T if fresh == 2 else 0, dtype=np.float32)
    part[t, 0] = 0
    part[t, 1] = _NONE
    part[t, 2] = 0
    use = fused
    bad = np.int64(0)
    # where each part of the operands lies, chosen once (no branch inside the loops): b's
    # tile ``tile`` at ``(tile - tb) * tstep + k0 * kstep`` of ``bsrc``; a's block ``blk``
    # at ``(blk - bb) * TCB * lda + k0`` of ``asrc`` (fresh 1: the block's own rows, k0
    # from 0: its whole rows are rounded)
    bsrc = bch if fresh == 2 else bpk
    tb = t0 if fresh == 2 else 0
    tstep = kc * T if fresh == 2 else K * T
    kstep = 0 if fresh == 2 else T
    asrc = ach if fresh == 1 else apk
    # fresh 1: one pass per row block (its rows rounded first); otherwise one pass
    for g in range(b1 - b0 if fresh == 1 else 1):
        blo = b0 + g if fresh == 1 else b0
        bhi = blo + 1 if fresh == 1 else b1
        bb = blo if fresh == 1 else 0
        for k0 in range(0, K, kc):
            nk = min(kc, K - k0)
            first = k0 == 0
            last = k0 + nk == K
            if (fresh == 1 and first) or fresh == 2:
                exact = _round_fresh(a, b, fresh, blo, bhi, lda, ach, k0, nk, t0, t1, T, kc,
                                     row, bch, fixed, part, t, mbits, bias)
                use = fused and exact       # (the rounding runs whatever fused is)
            for tile in range(t0, t1):
                bbase = (tile - tb) * tstep + k0 * kstep
                for blk in range(blo, bhi):
                    ab = (blk - bb) * TCB * lda + k0
                    cb = blk * TCB * Np + tile * T
                    pf = cb + TCB * Np if blk + 1 < bhi else blo * TCB * Np + (tile + 1) * T
                    if last and blk < full_b and tile < full_t:
                        bad |= _last_chunk(use, V, bsrc, bbase, T, asrc, ab, lda, nk, c, cb,
                                           Np, first, pf, of, blk * TCB * N + tile * T, N)
                    else:
                        _chunk(use, V, bsrc, bbase, T, asrc, ab, lda, nk, c, cb, Np, first,
                               pf)
    return _task_edges(c, Np, out, b0, b1, t0, t1, full_b, full_t, T, bad)


@helper
def _task_edges(c, Np, out, b0, b1, t0, t1, full_b, full_t, T, bad):
    """The end of a product task (row blocks ``b0 .. b1-1`` x tiles ``t0 .. t1-1``):
    widen its edges -- the rows of a partial last block, then the columns of a partial
    tile, kept in ``c`` -- into ``out``; returns the first flat index ``i*N + j`` of a
    non-finite output of the task (``bad``: whether the widened tiles had one), or
    NO_INDEX (-1)."""
    M = out.shape[0]
    N = out.shape[1]
    i0 = b0 * TCB
    i1 = min(M, b1 * TCB)
    j0 = t0 * T
    j1 = min(N, t1 * T)
    e = max(i0, full_b * TCB)
    bad |= np.int64(_widen(c, Np, out, e, i1, j0, j1) >= 0)
    bad |= np.int64(_widen(c, Np, out, i0, e, max(j0, full_t * T), j1) >= 0)
    if bad != 0:
        for i in range(i0, i1):
            for j in range(j0, j1):
                if not np.isfinite(out[i, j]):
                    return np.int64(i) * N + j
    return np.int64(NO_INDEX)


@helper
def _round_fresh(a, b, fresh, blo, bhi, lda, ach, k0, nk, t0, t1, T, kc, row, bch, fixed,
                 part, t, mbits, bias):
    """The part of a skinny product's long operand that :func:`_gemm_task` uses next,
    rounded into the task's buffer: ``fresh`` 1, the six whole rows of ``a``'s row block
    ``blo`` into ``ach`` (``lda`` apart, zero past M); 2, rows ``k0 .. k0+nk-1`` of
    ``b``'s tiles ``t0 .. t1-1`` into ``bch`` (``[tile, kc, T]``, zero past N).  Folds the
    raw statistics into ``part[t]``; returns whether every product of this part with the
    other operand (finished statistics ``fixed``) is exact (:func:`_products_exact`).
    A compiled helper, called once per part: inlined, its loops doubled the compile time
    of the parallel product."""
    _wide()
    M, K = a.shape
    N = b.shape[1]
    st = np.zeros(3, dtype=np.int64)
    st[1] = _NONE
    if fresh == 1:
        ua = a.view(np.int64)
        for i in range(blo * TCB, min(M, bhi * TCB)):
            round_run(a[i], ua[i], ach, (i - blo * TCB) * lda, K, mbits, bias, st)
        for i in range(max(0, M - blo * TCB) * lda, TCB * lda):
            ach[i] = 0.0                        # the rows past M
    else:
        ub = b.view(np.int64)
        n0 = t0 * T
        for k in range(k0, k0 + nk):
            _round_b_row(b, ub, k, n0, min(N, t1 * T) - n0, row, bch, (k - k0) * T, kc * T,
                         t1 - t0, T, mbits, bias, st)
    part[t, 1] = min(part[t, 1], st[1])
    part[t, 2] = max(part[t, 2], st[2])
    finish_stats(st, mbits, bias)
    return _products_exact(fixed, st)


@helper
def _widen(c, Np, out, i0, i1, j0, j1):
    """``out[i0:i1, j0:j1] = float64(c)`` (flat float32 ``c`` of row length ``Np``);
    returns the first flat index ``i*N + j`` of a non-finite value there, or NO_INDEX (-1)."""
    N = out.shape[1]
    nonfinite = np.int64(0)
    for i in range(i0, i1):
        row = out[i]
        base = i * Np
        for j in range(j0, j1):
            v = np.float64(c[base + j])
            row[j] = v
            nonfinite |= np.int64(v * 0.0 != 0.0)   # NaN exactly for NaN/+-inf
    if nonfinite != 0:
        for i in range(i0, i1):
            for j in range(j0, j1):
                if not np.isfinite(out[i, j]):
                    return np.int64(i) * N + j
    return np.int64(NO_INDEX)


@helper
def _fold_stats(part, stats):
    """Combine per-task rows of :func:`.half.round_run`'s raw statistics (smallest
    input magnitude that rounds to non-zero, largest input magnitude; as float64 bits) into
    ``stats`` (order-free: min, max; :func:`.half.finish_stats` then rounds them)."""
    mn = _NONE
    mxa = np.int64(0)
    for t in range(part.shape[0]):
        mn = min(mn, part[t, 1])
        mxa = max(mxa, part[t, 2])
    stats[0] = 0
    stats[1] = mn
    stats[2] = mxa


@inlined
def _round_b_row(b, ub, k, n0, w, row, dst, dbase, tstride, ntl, T, mbits, bias, st):
    """Row ``k`` of ``b``, columns ``n0 .. n0+w-1``, rounded in one run into ``row``
    (float32; its values past ``w`` stay as they are: zeros, the tiles' padding), then
    copied into ``ntl`` tiles of ``T`` columns: tile ``i`` at ``dst[dbase + i*tstride
    ...]``.  Folds the raw statistics into ``st``."""
    round_run(b[k, n0:], ub[k, n0:], row, 0, w, mbits, bias, st)
    # unsigned offsets: with signed ones Numba tests each index for wrap-around and the
    # copy stays scalar (AVX2, 256 x 256: 11 us; a constant-width loop for the widest
    # tiles, 18 us; a slice per tile, 50 us)
    for tile in range(np.uint64(ntl)):
        base = np.uint64(dbase) + tile * np.uint64(tstride)
        src = tile * np.uint64(T)
        for i in range(np.uint64(T)):
            dst[base + i] = row[src + i]


@helper
def _pack_task(a, apk, lda, b, bpk, T, t, ntask, mbits, bias, part_a, part_b, sides):
    """Task ``t`` of ``ntask`` of :func:`reduced_product`'s rounding: an equal share of
    a's row blocks (``sides & 1``) and of b's rows (``sides & 2``) rounded to the 16-bit
    format ``(mbits, bias)`` (as :func:`.half.round_to_float` rounds: the same values),
    ``a`` into the row-major float32 rows ``apk [Mp, K]`` (flat, rows ``lda`` apart; zero
    rows past M), which the micro-kernels read in place, and ``b`` into the packed float32
    panels ``bpk [ceil(N/T), K, T]`` (flat; zero columns past N) by way of a rounded row:
    each row is read once, front to back, in one long run (the loop vectorises; runs of
    one tile's ``T`` values did not: 0.58 ns per value on AVX2).  The raw statistics of
    :func:`.half.round_run` go to ``part_a[t]`` and ``part_b[t]``."""
    _wide()
    M, K = a.shape
    N = b.shape[1]
    ua = a.view(np.int64)
    ub = b.view(np.int64)
    st = np.zeros(3, dtype=np.int64)
    st[1] = _NONE
    if sides & 1:
        nmb = apk.shape[0] // (lda * TCB)
        i0 = t * nmb // ntask * TCB
        i1 = (t + 1) * nmb // ntask * TCB
        for i in range(i0, min(i1, M)):
            round_run(a[i], ua[i], apk, i * lda, K, mbits, bias, st)
        for i in range(max(i0, M) * lda, i1 * lda):
            apk[i] = 0.0
        part_a[t, 1] = st[1]
        part_a[t, 2] = st[2]
    if sides & 2:
        st[1] = _NONE
        st[2] = 0
        ntile = bpk.shape[0] // (K * T)
        row = np.zeros(ntile * T, dtype=np.float32)     # zero past N: the padding
        for k in range(t * K // ntask, (t + 1) * K // ntask):
            _round_b_row(b, ub, k, 0, N, row, bpk, k * T, K * T, ntile, T, mbits, bias, st)
        part_b[t, 1] = st[1]
        part_b[t, 2] = st[2]


_F32_MIN_NORMAL = 2.0 ** -126
_F32_OVERFLOW = 2.0 ** 128


@inlined
def _products_exact(stats_a, stats_b):
    """Whether every product of an entry of one rounded operand and one of the other is
    exact in float32 (then the fused micro-kernel is bit-identical to the separate
    multiply and add), from the finished statistics of :func:`.half.finish_stats`
    (largest and smallest non-zero rounded magnitudes): an all-zero operand makes every
    product +-0; otherwise the largest product must stay below 2**128 and the smallest
    non-zero one at or above 2**-126 (the products of 16-bit values are exact in float64,
    so these tests are).  The rule of :func:`hmath_dl.precision.half._products_exact`."""
    if stats_a[1] == _NONE or stats_b[1] == _NONE:
        return True
    hi = _as_float64(stats_a[0]) * _as_float64(stats_b[0])
    lo = _as_float64(stats_a[1]) * _as_float64(stats_b[1])
    return hi < _F32_OVERFLOW and lo >= _F32_MIN_NORMAL


#: :func:`reduced_product`'s answer when an operand holds NaN/inf or overflows the format
BAD_OPERAND = np.int64(-2)


@kernel
def reduced_product(a, apk, lda, b, bpk, c, out, T, ntask, Np, bpp, tpp, mbits, bias,
                    allow_fused):
    """The tiled reduced GEMM in one launch (no Python between its two parallel loops,
    so the thread pool's workers are still awake for the second): round and pack both
    float64 operands (``ntask`` tasks of :func:`_pack_task`), then the product ``out =
    float64(a16 @ b16)`` by the module's specification (:func:`_gemm_task` over tasks of
    ``bpp`` row blocks x ``tpp`` tiles; ``out`` C-contiguous), with the
    exact-FMA micro-kernel where ``allow_fused`` and :func:`_products_exact` say so.

    Returns :data:`BAD_OPERAND` when an operand holds NaN/inf or an entry overflows in the
    format (nothing is multiplied: the caller's checked path names the entry), else the
    first flat index of a non-finite output, or NO_INDEX (-1).  Each output's chain runs in
    one task and the statistics fold with max/min, so any thread count gives the same
    bits and verdicts."""
    nmb = apk.shape[0] // (lda * TCB)
    ntile = Np // T
    part_a = np.zeros((ntask, 3), dtype=np.int64)
    part_b = np.zeros((ntask, 3), dtype=np.int64)
    for t in prange(ntask):
        _pack_task(a, apk, lda, b, bpk, T, t, ntask, mbits, bias, part_a, part_b, 3)
    stats_a = np.empty(3, dtype=np.int64)
    stats_b = np.empty(3, dtype=np.int64)
    _fold_stats(part_a, stats_a)
    _fold_stats(part_b, stats_b)
    finish_stats(stats_a, mbits, bias)
    finish_stats(stats_b, mbits, bias)
    if run_verdict(stats_a, bias) != 0 or run_verdict(stats_b, bias) != 0:
        return BAD_OPERAND
    fused = allow_fused and _products_exact(stats_a, stats_b)
    ntasks = ((nmb + bpp - 1) // bpp) * ((ntile + tpp - 1) // tpp)
    first_bad = np.full(ntasks, NO_INDEX, dtype=np.int64)
    out_flat = out.reshape(-1)
    for t in prange(ntasks):
        first_bad[t] = _gemm_task(apk, lda, bpk, c, a.shape[1], Np, T, bpp, tpp, fused, out,
                                  out_flat, t)
    best = np.int64(NO_INDEX)
    for t in range(ntasks):
        if first_bad[t] >= 0 and (best < 0 or first_bad[t] < best):
            best = first_bad[t]
    return best


@kernel
def reduced_skinny(a, apk, lda, b, bpk, c, out, T, ntask, Np, bpp, tpp, kc, mbits, bias,
                   allow_fused, fresh):
    """:func:`reduced_product` for a skinny product (``fresh`` 1: at most ``SKINNY``
    columns; 2: rows): only the short operand (``b``; ``a``) is rounded first (``ntask``
    tasks of :func:`_pack_task`); the tasks of :func:`_skinny_task` round the long one
    as they use it.  The same answers as :func:`reduced_product`: the product, or
    :data:`BAD_OPERAND` (found before the product for the short operand, after it for the
    long one: the product is then discarded), else the first flat index of a non-finite
    output, or NO_INDEX (-1).  Its own kernel: the skinny loop nest compiles only for a
    program that has such a product."""
    nmb = (a.shape[0] + TCB - 1) // TCB
    ntile = Np // T
    part_a = np.zeros((ntask, 3), dtype=np.int64)
    part_b = np.zeros((ntask, 3), dtype=np.int64)
    for t in prange(ntask):
        _pack_task(a, apk, lda, b, bpk, T, t, ntask, mbits, bias, part_a, part_b, 3 - fresh)
    fixed = np.empty(3, dtype=np.int64)
    _fold_stats(part_b if fresh == 1 else part_a, fixed)
    finish_stats(fixed, mbits, bias)
    if run_verdict(fixed, bias) != 0:
        return BAD_OPERAND
    ntasks = ((nmb + bpp - 1) // bpp) * ((ntile + tpp - 1) // tpp)
    first_bad = np.full(ntasks, NO_INDEX, dtype=np.int64)
    part = np.zeros((ntasks, 3), dtype=np.int64)
    out_flat = out.reshape(-1)
    for t in prange(ntasks):
        first_bad[t] = _skinny_task(a, b, apk, lda, bpk, c, Np, T, bpp, tpp, kc, allow_fused,
                                    fresh, fixed, part, mbits, bias, out, out_flat, t)
    stats = np.empty(3, dtype=np.int64)     # the verdict on the long operand
    _fold_stats(part, stats)
    finish_stats(stats, mbits, bias)
    if run_verdict(stats, bias) != 0:
        return BAD_OPERAND
    best = np.int64(NO_INDEX)
    for t in range(ntasks):
        if first_bad[t] >= 0 and (best < 0 or first_bad[t] < best):
            best = first_bad[t]
    return best


_TASKS = 8        # aim for at least this many parallel tasks (2-thread balance)


def _tiles(M, N, threads=1):
    """(Mp, T, Np, bpp, tpp): padded rows, tile width, padded columns and the task shape
    (up to 16 row blocks = 96 rows x 512 columns, halved until there are enough tasks;
    the row groups then made a multiple of ``threads`` in number)."""
    Mp = -(-M // TCB) * TCB
    T = tile_width(N)
    Np = -(-N // T) * T
    nmb = Mp // TCB
    ntile = Np // T
    bpp, tpp = min(16, nmb), max(1, min(ntile, 512 // T))
    while -(-nmb // bpp) * -(-ntile // tpp) < _TASKS and (bpp > 4 or tpp > 1):
        if tpp > 1:
            tpp = -(-tpp // 2)
        else:
            bpp = -(-bpp // 2)
    # equal row groups (43 blocks in groups of 15, 15, 13 rather than 16, 16, 11): the
    # threads take equal runs of tasks, so the slowest one finishes sooner; and as many
    # groups as a multiple of the threads where that makes the slowest thread's run
    # shorter (256^3 on AVX2: 11, 11, 11, 10 x 4 column groups, 218 -> 212 us on 2
    # threads; 1024^3 keeps its 11 groups of 16: 12 of 15 measured 3 % slower)
    groups = -(-nmb // bpp)
    bpp = -(-nmb // groups)
    if threads > 1 and groups % threads:
        more = -(-nmb // (-(-groups // threads) * threads))
        if _slowest_run(nmb, more, ntile, tpp, threads) < _slowest_run(nmb, bpp, ntile, tpp,
                                                                        threads):
            bpp = more
    return Mp, T, Np, bpp, tpp


def _slowest_run(nmb, bpp, ntile, tpp, threads):
    """The most (row block x tile) micro-tiles that one thread computes when the tasks of
    :func:`_gemm_task` (row group major) are dealt out in equal contiguous runs, as a
    ``prange`` schedules them."""
    rows = [min(bpp, nmb - g) for g in range(0, nmb, bpp)]
    cols = [min(tpp, ntile - c) for c in range(0, ntile, tpp)]
    work = [r * c for r in rows for c in cols]
    each, extra = divmod(len(work), threads)
    worst, start = 0, 0
    for i in range(threads):
        n = each + (i < extra)
        worst = max(worst, sum(work[start:start + n]))
        start += n
    return worst


_PLANS = {}       # (M, K, N, threads) -> the launch arguments of reduced_tiled

#: at most this many rows (columns) make a product "skinny": its long operand is
#: rounded by the product's tasks as they go, never written back (batch-1 inference,
#: 1 x 4096 x 4096, 2 threads: AVX2 15.6 -> 9.8 ms, AVX-512 10.5 -> 8.1 ms; 4096 x 4096
#: x 1: 10.2 -> 6.5 and 9.6 -> 6.4 ms; reading the float64 operand alone takes ~4.5 ms)
SKINNY = 16


def _row_stride(K):
    """The distance between the rounded rows of ``a`` (float32): ``K``, one cache line
    more when the rows would be a multiple of 2 KiB apart (the micro-kernel reads six
    rows side by side; at such distances they share L1 sets)."""
    return K + 16 if K % 512 == 0 else K


def _skinny_tasks(nmb, ntile, T, fresh, threads):
    """(bpp, tpp, kc) of a skinny product (see :func:`_gemm_task`): few rows (``fresh``
    2): every row block in each task and one panel of tiles per thread (each task rounds
    its own columns of ``b``, so the wider the better: rows read in runs of 512 columns
    streamed at ~60 % the speed of runs of 2048), ``kc`` rows at a time into a buffer of
    at most 256 KiB (half of L2); few columns (1): every tile and at least ``_TASKS``
    groups of row blocks, each block's chains over the whole K at once."""
    if fresh == 2:
        tpp = -(-ntile // max(1, min(threads, ntile)))
        kc = max(8, min(TKC, (256 * 1024 // 4) // (tpp * T)) // 8 * 8)
        return nmb, tpp, kc
    bpp = max(1, min(nmb, 16))
    while -(-nmb // bpp) < _TASKS and bpp > 1:
        bpp = -(-bpp // 2)
    return -(-nmb // -(-nmb // bpp)), ntile, 1 << 62


def _plan(M, K, N, threads):
    """The launch shape of :func:`reduced_tiled` for an ``[M, K] x [K, N]`` product on
    ``threads`` threads (``threads`` 1: the serial launch), computed once per shape: the
    call's Python stays short (right after a launch the interpreter runs from cold caches,
    several microseconds per function call).  ``(T, Np, bpp, tpp, ntask, lda, fresh,
    a, b, c workspace sizes)``."""
    key = (M, K, N, threads)
    plan = _PLANS.get(key)
    if plan is None:
        Mp, T, Np, bpp, tpp = _tiles(M, N, threads)
        fresh = 2 if M <= SKINNY and M <= N else (1 if N <= SKINNY else 0)
        kc = TKC
        if fresh:
            bpp, tpp, kc = _skinny_tasks(Mp // TCB, Np // T, T, fresh, threads)
        # the rounding: one task per thread, each an equal share of both operands (2
        # threads, 256^3: 54 -> 48 us against one task per row block; 8 or 32 tasks were
        # slower)
        ntask = max(1, min(max(Mp // TCB, K), threads))
        lda = _row_stride(K)
        plan = (T, Np, bpp, tpp, kc, ntask, lda, fresh, Mp * lda if fresh != 1 else 0,
                Np * K if fresh != 2 else 0, Mp * Np)
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def reduced_tiled(a, b, mbits, bias, out, allow_fused, serial=False):
    """The tiled reduced GEMM from float64 operands: ``a [M, K]``, ``b [K, N]``
    (C-contiguous float64, M, N, K >= 1) rounded to the 16-bit format ``(mbits, bias)``
    into float32 rows (``a``) and packed panels (``b``), then ``out [M, N]`` (float64, C-contiguous) =
    the sequential-k float32 product (the module's specification, bit for bit), by
    :func:`reduced_product`; ``allow_fused``: whether the exact-FMA kernel may run where
    it is exact (false: the separate multiply and add everywhere).

    Returns ``None`` when an operand holds NaN/inf or overflows in the format (nothing is
    computed: the caller's checked path names the entry), else the first flat index of a
    non-finite output, or NO_INDEX (-1).  ``serial``: the caller's verdict that the
    product is too small for parallel launches (:meth:`._jit.Kernel.when_small`)."""
    from .gemm_f64 import _workspace
    M, K = a.shape
    launch = reduced_product.when_small(serial)
    threads = numba.get_num_threads() if launch is reduced_product.parallel else 1
    T, Np, bpp, tpp, kc, ntask, lda, fresh, na, nb, nc = _plan(M, K, b.shape[1], threads)
    ws = (_workspace("a32", na, np.float32), lda, b, _workspace("b32", nb, np.float32),
          _workspace("c32", nc, np.float32), out, T, ntask, Np, bpp, tpp)
    if fresh:
        skinny = reduced_skinny if threads > 1 else reduced_skinny.serial
        bad = int(skinny(a, *ws, kc, mbits, bias, bool(allow_fused), fresh))
    else:
        bad = int(launch(a, *ws, mbits, bias, bool(allow_fused)))
    return None if bad == BAD_OPERAND else bad
