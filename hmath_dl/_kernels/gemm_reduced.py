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

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _cpu
from ._jit import helper, kernel

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
    or -1."""
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
    bad = np.int64(-1)
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
    or -1.

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
    first_bad = np.full(ntasks, -1, dtype=np.int64)
    for t in prange(ntasks):
        jb = t // ng
        first_bad[t] = _task(flat_a, b, out, fused, jb, t - jb * ng, group)
    best = np.int64(-1)
    for t in range(ntasks):
        if first_bad[t] >= 0 and (best < 0 or first_bad[t] < best):
            best = first_bad[t]
    return best


@helper
def gemm_f32_seq_serial(a, b, out, fused):
    """:func:`gemm_f32_seq` without a parallel launch (bitwise the same result), for
    products too small to repay the start of the thread pool."""
    M = a.shape[0]
    N = b.shape[1]
    ng, group = _tasks(M, N)
    ntasks = ((N + NR - 1) // NR) * ng
    flat_a = a.reshape(-1)
    best = np.int64(-1)
    for t in range(ntasks):
        jb = t // ng
        bad = _task(flat_a, b, out, fused, jb, t - jb * ng, group)
        if bad >= 0 and (best < 0 or bad < best):
            best = bad
    return best
