"""INT8 quantization kernels and the exact int8 GEMM.

No validation happens here (the facade in ``hmath_dl.precision.quantization`` does it);
kernels report data-dependent failures through return values / status arrays.

Layout used by the quantization kernels: a C-contiguous tensor is viewed as
``(outer, C, inner)`` where ``C`` is the extent of the quantization axis (per-tensor
quantization is ``outer = 1, C = 1, inner = size``).  Element ``f`` of the flat array
belongs to channel ``(f // inner) % C``.

The int8 GEMM computes ``S[i, j] = sum_k qa[i, k] * qb[k, j]`` exactly (integers only),
then ``acc = S - zb[j] * RA[i] - za[i] * CB[j] + K * za[i] * zb[j]`` in int64, where
``RA``/``CB`` are the row sums of ``qa`` / column sums of ``qb``; this equals
``sum_k (qa[i,k] - za[i]) * (qb[k,j] - zb[j])`` exactly.  Two interchangeable kernels
compute ``S``:

* ``gemm_vnni``: AVX-512 VNNI (``vpdpbusd``: 64 u8 x s8 products per instruction) through
  an LLVM intrinsic.  ``qa + 128`` (0..255) is the unsigned operand, so the kernel gets
  ``sum (qa+128) qb = S + 128 * CB``.  Every term is at most ``255 * 128 = 32640`` in
  magnitude, so a signed 32-bit accumulator over at most 65536 terms (``_VNNI_KCHUNK_Q``)
  cannot wrap; chunks are combined in int64.  Only used when the host CPU has the needed
  features (the facade decides).
* ``gemm_portable``: plain loops over ``qa`` rows and ``qb`` columns (``qb`` transposed
  to ``[N, K]``), exact int32 dot products for ``K <= 65536``, int64 beyond; used on
  CPUs without AVX-512 VNNI.

Both are exact and, all arithmetic being integer until the final per-element scaling,
give bitwise identical results for any thread count.
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _cpu
from ._jit import helper, kernel
from .libm import _wide
from .status import INT_OVERFLOW, NO_INDEX, NONFINITE_SOMEWHERE, OK, OVERFLOW

_CHUNK = 8192                 # flat elements per parallel chunk (quantize / dequantize)
_INT32_MIN = -(2 ** 31)
_INT32_MAX = 2 ** 31 - 1
_TINY = 2.2250738585072014e-308   # smallest normal double
_NO_INDEX = np.int64(2 ** 62)

# VNNI micro-kernel geometry: tiles of _MR rows x 32 columns, K in quads of 4.
_MR = 8
_NR = 32
_VNNI_KCHUNK_Q = 16384        # 65536 terms: 65536 * 32640 < 2**31
_PORTABLE_KCHUNK = 65536      # 65536 * 2**14 = 2**30 < 2**31


# --------------------------------------------------------------------------- quantize
@helper
def _scale_zp(lo, hi, symmetric):
    """Scale and zero point of one slice from its min ``lo`` and max ``hi``.

    Returns ``(scale, zp, ok)``; ``ok`` is False when the scale is 0, subnormal or
    non-finite."""
    if symmetric:
        amax = max(abs(lo), abs(hi))
        if amax == 0.0:
            return 1.0, np.int64(0), True
        scale = amax / 127.0
        ok = scale >= _TINY and np.isfinite(scale)
        return scale, np.int64(0), ok
    lo0 = min(lo, 0.0)
    hi0 = max(hi, 0.0)
    if hi0 == 0.0 and lo0 == 0.0:
        scale = 1.0
    else:
        scale = (hi0 - lo0) / 255.0
    if not (scale >= _TINY and np.isfinite(scale)):
        return scale, np.int64(0), False
    z = np.rint(-128.0 - lo0 / scale)
    if z < -128.0:
        z = -128.0
    elif z > 127.0:
        z = 127.0
    return scale, np.int64(z), True


@helper
def _minmax_run(x, f0, f1, lo, hi):
    """``(min(lo, x[f0:f1]), max(hi, x[f0:f1]), nonfinite)`` with four independent
    accumulators (min/max are exact, so the grouping cannot change the result);
    ``nonfinite`` counts the NaN/inf entries (quantize's finiteness check, in the same
    pass over ``x``)."""
    _wide()
    l0 = lo
    l1 = lo
    l2 = lo
    l3 = lo
    h0 = hi
    h1 = hi
    h2 = hi
    h3 = hi
    nf = np.int64(0)
    # unsigned indices throughout (this module): with a signed start Numba tests every
    # index for a negative value to wrap, which keeps the loops scalar
    one = np.uint64(1)
    uf0 = np.uint64(f0)
    uf4 = np.uint64(f0 + ((f1 - f0) // 4) * 4)
    for f in range(uf0, uf4, np.uint64(4)):
        v0 = x[f]
        v1 = x[f + one]
        v2 = x[f + np.uint64(2)]
        v3 = x[f + np.uint64(3)]
        l0 = min(l0, v0)
        l1 = min(l1, v1)
        l2 = min(l2, v2)
        l3 = min(l3, v3)
        h0 = max(h0, v0)
        h1 = max(h1, v1)
        h2 = max(h2, v2)
        h3 = max(h3, v3)
        nf += np.int64((v0 - v0) != 0.0) + np.int64((v1 - v1) != 0.0) \
            + np.int64((v2 - v2) != 0.0) + np.int64((v3 - v3) != 0.0)
    for f in range(uf4, np.uint64(f1)):
        v = x[f]
        l0 = min(l0, v)
        h0 = max(h0, v)
        nf += np.int64((v - v) != 0.0)
    return min(min(l0, l1), min(l2, l3)), max(max(h0, h1), max(h2, h3)), nf


_CH_BLOCK = 128               # channels per parallel task when inner == 1


@kernel
def quant_params_axis(x, outer, nch, inner, symmetric, scales, zps):
    """Per-channel scales/zero points for ``x`` viewed as ``(outer, nch, inner)``.

    Returns NONFINITE_SOMEWHERE (-2) if ``x`` holds NaN/inf, else the first channel whose
    scale is invalid, else NO_INDEX (-1)."""
    bad = np.full(nch, NO_INDEX, dtype=np.int64)
    nonfinite = np.zeros(nch, dtype=np.int64)
    if inner == 1:
        # channels are adjacent in memory: sweep rows, keeping per-channel running min/max
        nblk = (nch + _CH_BLOCK - 1) // _CH_BLOCK
        for blk in prange(nblk):
            c0 = blk * _CH_BLOCK
            c1 = min(nch, c0 + _CH_BLOCK)
            lo = np.full(c1 - c0, np.inf)
            hi = np.full(c1 - c0, -np.inf)
            nf = np.int64(0)
            for o in range(outer):
                base = o * nch
                for c in range(c0, c1):
                    v = x[base + c]
                    if v < lo[c - c0]:
                        lo[c - c0] = v
                    if v > hi[c - c0]:
                        hi[c - c0] = v
                    nf += np.int64((v - v) != 0.0)
            nonfinite[blk] = nf
            for c in range(c0, c1):
                s, z, ok = _scale_zp(lo[c - c0], hi[c - c0], symmetric)
                scales[c] = s
                zps[c] = z
                if not ok:
                    bad[c] = c
    else:
        for c in prange(nch):
            lo = np.inf
            hi = -np.inf
            nf = np.int64(0)
            for o in range(outer):
                base = (o * nch + c) * inner
                lo, hi, k = _minmax_run(x, base, base + inner, lo, hi)
                nf += k
            nonfinite[c] = nf
            s, z, ok = _scale_zp(lo, hi, symmetric)
            scales[c] = s
            zps[c] = z
            if not ok:
                bad[c] = c
    for c in range(nch):
        if nonfinite[c] != 0:
            return NONFINITE_SOMEWHERE
    for c in range(nch):
        if bad[c] >= 0:
            return c
    return NO_INDEX


@kernel
def quant_params_tensor(x, symmetric, scales, zps):
    """Per-tensor scale/zero point (into ``scales[0]``, ``zps[0]``); returns
    NONFINITE_SOMEWHERE (-2) if ``x`` holds NaN/inf, else 0 when the scale is invalid,
    else NO_INDEX (-1).  Min/max are exact, so the chunked reduction is
    order-independent."""
    n = x.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    los = np.empty(nchunks, dtype=np.float64)
    his = np.empty(nchunks, dtype=np.float64)
    nfs = np.empty(nchunks, dtype=np.int64)
    for c in prange(nchunks):
        lo, hi, k = _minmax_run(x, c * _CHUNK, min(n, (c + 1) * _CHUNK), np.inf, -np.inf)
        los[c] = lo
        his[c] = hi
        nfs[c] = k
    lo = np.inf
    hi = -np.inf
    for c in range(nchunks):
        if nfs[c] != 0:
            return NONFINITE_SOMEWHERE
        lo = min(lo, los[c])
        hi = max(hi, his[c])
    s, z, ok = _scale_zp(lo, hi, symmetric)
    scales[0] = s
    zps[0] = z
    return NO_INDEX if ok else 0


@helper
def _quant_run(x, out, f0, f1, s, z, qlo):
    """``out[f] = clip(rne(x[f] / s) + z, qlo, 127)`` for ``f0 <= f < f1`` (one scale)."""
    for f in range(np.uint64(f0), np.uint64(f1)):
        v = np.rint(x[f] / s) + z
        if v < qlo:
            v = qlo
        if v > 127.0:
            v = 127.0
        out[f] = np.int8(v)


@helper
def _quant_run_channels(x, out, f0, f1, c0, scales, zps, qlo):
    """Like ``_quant_run`` when consecutive elements are consecutive channels
    (``inner == 1``): element ``f`` uses channel ``c0 + f - f0``."""
    uc = np.uint64(c0) - np.uint64(f0)        # (mod 2**64: c = f + c0 - f0 >= 0)
    for f in range(np.uint64(f0), np.uint64(f1)):
        c = f + uc
        v = np.rint(x[f] / scales[c]) + np.float64(zps[c])
        if v < qlo:
            v = qlo
        if v > 127.0:
            v = 127.0
        out[f] = np.int8(v)


@kernel
def quantize_apply(x, nch, inner, symmetric, scales, zps, out):
    """``out[f] = clip(rne(x[f] / scale) + zp, lo, 127)`` with the channel's scale and zero
    point (``zp = 0``, ``lo = -127`` for symmetric; adding ``0.0`` changes no result).

    Work is split in flat chunks; inside a chunk, runs of elements sharing a channel (or,
    for ``inner == 1``, runs of consecutive channels) go through branch-free loops."""
    n = x.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    qlo = -127.0 if symmetric else -128.0
    for ch in prange(nchunks):
        start = ch * _CHUNK
        stop = min(n, start + _CHUNK)
        f = start
        if inner == 1:
            while f < stop:
                c = f % nch
                e = min(stop, f + (nch - c))
                _quant_run_channels(x, out, f, e, c, scales, zps, qlo)
                f = e
        else:
            while f < stop:
                row = f // inner
                c = row % nch
                e = min(stop, (row + 1) * inner)
                _quant_run(x, out, f, e, scales[c], np.float64(zps[c]), qlo)
                f = e


@helper
def _dequant_run(q, out, f0, f1, c0, step, scales, zf):
    """``out[f] = scale * (q[f] - zp)`` for ``f0 <= f < f1``, channel ``c0 + step*(f-f0)``
    (``step`` 0: one channel; 1: consecutive channels; ``zf``: the zero points as
    float64).  Returns True if some result is not finite.  ``q - zp`` lies in
    [-255, 255], so its float64 difference is the exact integer: the same value as the
    integer difference, and int8 -> float64 conversions vectorise on every x86 target
    (AVX2 has no vector int64 -> float64 conversion: an integer difference that LLVM
    widens to int64 ran one element at a time there).  The one-channel case reads its
    scale once, so both loops vectorise."""
    _wide()
    nonfinite = np.int64(0)
    if step == 0:
        s = scales[c0]
        z = zf[c0]
        for f in range(np.uint64(f0), np.uint64(f1)):
            v = s * (np.float64(q[f]) - z)
            out[f] = v
            nonfinite += np.int64((v - v) != 0.0)
        return nonfinite != 0
    uc = np.uint64(c0) - np.uint64(f0)        # (mod 2**64: c = f + c0 - f0 >= 0)
    for f in range(np.uint64(f0), np.uint64(f1)):
        c = f + uc
        v = scales[c] * (np.float64(q[f]) - zf[c])
        out[f] = v
        nonfinite += np.int64((v - v) != 0.0)
    return nonfinite != 0


@kernel
def dequantize_apply(q, nch, inner, scales, zps, out):
    """``out[f] = scale * (q[f] - zp)`` (q - zp exact, in float64); returns the first flat index
    whose result is not finite, or NO_INDEX (-1)."""
    n = q.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    bad = np.zeros(nchunks, dtype=np.bool_)
    zf = np.empty(nch, dtype=np.float64)
    for c in range(nch):
        zf[c] = np.float64(zps[c])
    for ch in prange(nchunks):
        start = ch * _CHUNK
        stop = min(n, start + _CHUNK)
        f = start
        flag = False
        if inner == 1:
            while f < stop:
                c = f % nch
                e = min(stop, f + (nch - c))
                flag |= _dequant_run(q, out, f, e, c, 1, scales, zf)
                f = e
        else:
            while f < stop:
                row = f // inner
                e = min(stop, (row + 1) * inner)
                flag |= _dequant_run(q, out, f, e, row % nch, 0, scales, zf)
                f = e
        bad[ch] = flag
    for ch in range(nchunks):
        if bad[ch]:
            for f in range(ch * _CHUNK, min(n, (ch + 1) * _CHUNK)):
                if not np.isfinite(out[f]):
                    return f
    return NO_INDEX


# --------------------------------------------------------------------------- GEMM: shared
@helper
def _finish(i, j, s, kk, ra, cb, za, zb, sa, sb, out):
    """Turn the exact ``S[i, j]`` into the output; a Status: OK, INT_OVERFLOW (the int32
    accumulator would overflow) or OVERFLOW (the result is not finite)."""
    acc = s - zb[j] * ra[i] - za[i] * cb[j] + kk * za[i] * zb[j]
    if acc < _INT32_MIN or acc > _INT32_MAX:
        out[i, j] = 0.0
        return INT_OVERFLOW
    v = (sa[i] * sb[j]) * np.float64(acc)
    out[i, j] = v
    if not np.isfinite(v):
        return OVERFLOW
    return OK


@kernel
def row_sums(qa, ra):
    """``ra[i] = sum_k qa[i, k]`` (int64) for a C-contiguous int8 ``[M, K]``."""
    m, k = qa.shape
    for i in prange(m):
        s = np.int64(0)
        for t in range(k):
            s += np.int64(qa[i, t])
        ra[i] = s


@kernel
def col_sums(qb, cb):
    """``cb[j] = sum_k qb[k, j]`` (int64) for a C-contiguous int8 ``[K, N]``."""
    k, n = qb.shape
    nblk = (n + 255) // 256
    for blk in prange(nblk):
        j0 = blk * 256
        j1 = min(n, j0 + 256)
        for j in range(j0, j1):
            cb[j] = 0
        for t in range(k):
            for j in range(j0, j1):
                cb[j] += np.int64(qb[t, j])


# --------------------------------------------------------------------------- GEMM: portable
@kernel
def gemm_portable(qa, qbt, ra, cb, za, zb, sa, sb, out, bad_acc, bad_fin):
    """Exact int8 GEMM with plain loops; ``qbt`` is ``qb`` transposed (``[N, K]``).

    The dot products are exact: for ``K <= _PORTABLE_KCHUNK`` every partial sum is at
    most ``K * 2**14 <= 2**30`` in magnitude, so the int32 truncation (which lets LLVM
    vectorise the loop in 32-bit lanes) loses nothing; longer K accumulate in int64.
    ``bad_acc[i]`` / ``bad_fin[i]``: first column of row ``i`` whose accumulator leaves
    int32 / whose result is not finite (or NO_INDEX, -1)."""
    m, kk = qa.shape
    n = qbt.shape[0]
    for i in prange(m):
        ba = NO_INDEX
        bf = NO_INDEX
        row = np.empty(n, dtype=np.int32)
        if kk <= _PORTABLE_KCHUNK:
            for j in range(n):
                p = np.int32(0)
                for t in range(kk):
                    p += np.int32(qa[i, t]) * np.int32(qbt[j, t])
                row[j] = p  # exact: |p| <= 65536 * 2**14 = 2**30
        for j in range(n):
            if kk <= _PORTABLE_KCHUNK:
                s = np.int64(row[j])
            else:
                s = np.int64(0)
                for t in range(kk):
                    s += np.int64(qa[i, t]) * np.int64(qbt[j, t])
            st = _finish(i, j, s, np.int64(kk), ra, cb, za, zb, sa, sb, out)
            if st == INT_OVERFLOW and ba < 0:
                ba = j
            elif st == OVERFLOW and bf < 0:
                bf = j
        bad_acc[i] = ba
        bad_fin[i] = bf


@kernel
def transpose_i8(qb, qbt):
    k, n = qb.shape
    for j in prange(n):
        for t in range(k):
            qbt[j, t] = qb[t, j]


# --------------------------------------------------------------------------- GEMM: VNNI
@intrinsic
def _vnni_tile(typingctx, ap, a_off, lda, bp, b_off, kq, c):
    """LLVM micro-kernel: ``c[r*32 + l] = sum_{k < 4*kq} ap[a_off + r*lda + k] *
    bp-panel(k, l)`` for ``r < 8``, ``l < 32`` (u8 x s8 -> i32, ``vpdpbusd``).

    ``ap``: uint8 rows (``qa + 128``) with row stride ``lda``; ``bp``: the packed panel
    ``[kq][2][16][4]`` int8 starting at ``b_off``; ``c``: int32 with at least 256 entries.
    ``kq >= 1``.
    """
    sig = types.void(ap, a_off, lda, bp, b_off, kq, c)

    def codegen(context, builder, signature, args):
        ap_, a_off_, lda_, bp_, b_off_, kq_, c_ = args
        i8 = ir.IntType(8)
        i32 = ir.IntType(32)
        i64 = ir.IntType(64)
        v16 = ir.VectorType(i32, 16)
        aary = context.make_array(signature.args[0])(context, builder, ap_)
        bary = context.make_array(signature.args[3])(context, builder, bp_)
        cary = context.make_array(signature.args[6])(context, builder, c_)
        abase = builder.gep(builder.bitcast(aary.data, i8.as_pointer()), [a_off_])
        bbase = builder.gep(builder.bitcast(bary.data, i8.as_pointer()), [b_off_])
        cbase = builder.bitcast(cary.data, i32.as_pointer())
        fnty = ir.FunctionType(v16, [v16, v16, v16])
        fn = cgutils.get_or_insert_function(builder.module, fnty,
                                            "llvm.x86.avx512.vpdpbusd.512")
        pre = builder.block
        loop = builder.append_basic_block("vnni.loop")
        done = builder.append_basic_block("vnni.done")
        builder.branch(loop)
        builder.position_at_end(loop)
        k = builder.phi(i64)
        k.add_incoming(ir.Constant(i64, 0), pre)
        zero = ir.Constant(v16, None)
        accs = []
        for _r in range(_MR):
            row = []
            for _h in range(2):
                p = builder.phi(v16)
                p.add_incoming(zero, pre)
                row.append(p)
            accs.append(row)
        boff = builder.mul(k, ir.Constant(i64, 128))
        b0p = builder.bitcast(builder.gep(bbase, [boff]), v16.as_pointer())
        b1p = builder.bitcast(builder.gep(bbase, [builder.add(boff, ir.Constant(i64, 64))]),
                              v16.as_pointer())
        b0 = builder.load(b0p, align=1)
        b1 = builder.load(b1p, align=1)
        k4 = builder.mul(k, ir.Constant(i64, 4))
        undef = ir.Constant(v16, ir.Undefined)
        splat = ir.Constant(v16, [0] * 16)
        new = []
        for r in range(_MR):
            off = builder.add(builder.mul(lda_, ir.Constant(i64, r)), k4)
            a32p = builder.bitcast(builder.gep(abase, [off]), i32.as_pointer())
            av = builder.load(a32p, align=1)
            vec = builder.insert_element(undef, av, ir.Constant(i32, 0))
            bc = builder.shuffle_vector(vec, undef, splat)
            n0 = builder.call(fn, [accs[r][0], bc, b0])
            n1 = builder.call(fn, [accs[r][1], bc, b1])
            new.append((n0, n1))
        knext = builder.add(k, ir.Constant(i64, 1))
        more = builder.icmp_signed("<", knext, kq_)
        cur = builder.block
        k.add_incoming(knext, cur)
        for r in range(_MR):
            accs[r][0].add_incoming(new[r][0], cur)
            accs[r][1].add_incoming(new[r][1], cur)
        builder.cbranch(more, loop, done)
        builder.position_at_end(done)
        for r in range(_MR):
            for h in range(2):
                cp = builder.bitcast(
                    builder.gep(cbase, [ir.Constant(i64, r * _NR + h * 16)]), v16.as_pointer())
                builder.store(new[r][h], cp, align=1)
        return context.get_dummy_value()

    return sig, codegen


@kernel
def pack_a_u8(qa, mp, kp, ap, ra):
    """``ap`` (flat ``[mp, kp]`` uint8) = ``qa + 128``, zero padded; ``ra[i]`` = the row
    sums of ``qa`` (int64)."""
    m, kk = qa.shape
    for i in prange(mp):
        base = i * kp
        if i < m:
            s = np.int64(0)
            for t in range(kk):
                v = qa[i, t]
                ap[base + t] = np.uint8(np.int32(v) + 128)
                s += np.int64(v)
            for t in range(kk, kp):
                ap[base + t] = 0
            ra[i] = s
        else:
            for t in range(kp):
                ap[base + t] = 0


@kernel
def pack_b_vnni(qb, np_, kp, bp32, cb):
    """Pack ``qb`` for the VNNI micro-kernel.  ``bp32`` is the uint32 view of the flat int8
    buffer ``bp[np_/32][kp/4][2][16][4]`` with ``bp[p, q, h, l, t] =
    qb[4q + t, 32p + 16h + l]`` (zero padded): word ``(p*kq + q)*32 + col`` holds the four
    bytes ``qb[4q:4q+4, 32p + col]`` (little-endian).  ``cb[j]`` = the column sums of
    ``qb`` (exact int64)."""
    kk, n = qb.shape
    npanel = np_ // _NR
    kq = kp // 4
    for p in prange(npanel):
        j0 = p * _NR
        ncol = min(_NR, n - j0)
        csum = np.zeros(_NR, dtype=np.int64)
        for q in range(kq):
            base = (p * kq + q) * _NR
            k0 = 4 * q
            if ncol == _NR and k0 + 4 <= kk:
                r0 = qb[k0, j0:j0 + _NR]
                r1 = qb[k0 + 1, j0:j0 + _NR]
                r2 = qb[k0 + 2, j0:j0 + _NR]
                r3 = qb[k0 + 3, j0:j0 + _NR]
                for col in range(_NR):
                    a0 = np.int32(r0[col])
                    a1 = np.int32(r1[col])
                    a2 = np.int32(r2[col])
                    a3 = np.int32(r3[col])
                    bp32[base + col] = np.uint32((a0 & 255) | ((a1 & 255) << 8)
                                                 | ((a2 & 255) << 16) | ((a3 & 255) << 24))
                    csum[col] += a0 + a1 + a2 + a3
            else:
                for col in range(_NR):
                    w = np.uint32(0)
                    for t in range(4):
                        if k0 + t < kk and col < ncol:
                            v = np.int32(qb[k0 + t, j0 + col])
                            w = w | np.uint32((v & 255) << (8 * t))
                            csum[col] += v
                    bp32[base + col] = w
        for col in range(ncol):
            cb[j0 + col] = csum[col]


_TILES_PER_TASK = 8            # output tiles per parallel task (amortises scratch)


@kernel
def gemm_vnni(ap, bp, m, n, kk, mp, np_, kp, ra, cb, za, zb, sa, sb, out, bad_acc, bad_fin):
    """Exact int8 GEMM on packed operands (see ``pack_a_u8`` / ``pack_b_vnni``).

    Output tiles of ``8 x 32``; one parallel task = ``_TILES_PER_TASK`` consecutive tiles
    (column panel major, so a task reuses its B panel from L1).  The micro-kernel yields
    ``T = sum_k (qa+128) qb`` per output; then
    ``acc = T - cb[j] * (128 + za[i]) - zb[j] * (ra[i] - K * za[i])``, which equals
    ``sum_k (qa - za)(qb - zb)``.

    For ``K <= 65536`` (one int32 chunk) the epilogue runs in float64, which is exact
    there: ``|T| < 2**31``, ``|cb[j] * (128 + za[i])| <= K * 128 * 256 <= 2**31`` and
    ``|zb[j] * (ra[i] - K * za[i])| <= 128 * K * 256 <= 2**31``, so every intermediate is
    an integer far below ``2**53`` (the float value is the exact integer ``acc``, and the
    result ``(sa[i] * sb[j]) * acc`` is the same float64 product as with an int64
    epilogue).  Longer K accumulate the chunks and correct in int64.

    ``bad_acc[task]`` / ``bad_fin[task]``: smallest flat output index ``i * n + j`` of the
    task whose accumulator leaves int32 / whose result is not finite (``_NO_INDEX`` if
    none)."""
    nrg = mp // _MR
    npanel = np_ // _NR
    kq = kp // 4
    kk64 = np.int64(kk)
    ntiles = nrg * npanel
    ntask = (ntiles + _TILES_PER_TASK - 1) // _TILES_PER_TASK
    single = kq <= _VNNI_KCHUNK_Q
    cbf = np.empty(np_, dtype=np.float64)
    zbf = np.empty(np_, dtype=np.float64)
    sbp = np.empty(np_, dtype=np.float64)
    for j in range(np_):
        if j < n:
            cbf[j] = np.float64(cb[j])
            zbf[j] = np.float64(zb[j])
            sbp[j] = sb[j]
        else:
            cbf[j] = 0.0
            zbf[j] = 0.0
            sbp[j] = 0.0
    for task in prange(ntask):
        tmp = np.empty(_MR * _NR, dtype=np.int32)
        acc = np.empty(_MR * _NR, dtype=np.int64)
        row = np.empty(_NR, dtype=np.float64)
        ba = _NO_INDEX
        bf = _NO_INDEX
        for tile in range(task * _TILES_PER_TASK, min(ntiles, (task + 1) * _TILES_PER_TASK)):
            p = tile // nrg
            rg = tile % nrg
            j0 = p * _NR
            ncol = min(_NR, n - j0)
            if single:
                _vnni_tile(ap, rg * _MR * kp, kp, bp, p * kq * 128, kq, tmp)
            else:
                for e in range(_MR * _NR):
                    acc[e] = 0
                for q0 in range(0, kq, _VNNI_KCHUNK_Q):
                    nq = min(kq - q0, _VNNI_KCHUNK_Q)
                    _vnni_tile(ap, rg * _MR * kp + 4 * q0, kp, bp, (p * kq + q0) * 128, nq, tmp)
                    for e in range(_MR * _NR):
                        acc[e] += np.int64(tmp[e])
            for r in range(_MR):
                i = rg * _MR + r
                if i >= m:
                    break
                u = 128 + za[i]
                v = ra[i] - kk64 * za[i]
                si = sa[i]
                flag = False
                if single:
                    uf = np.float64(u)
                    vf = np.float64(v)
                    # fixed trip count (padded columns compute harmless zeros)
                    for col in range(_NR):
                        a = np.float64(tmp[r * _NR + col]) - cbf[j0 + col] * uf \
                            - zbf[j0 + col] * vf
                        o = (si * sbp[j0 + col]) * a
                        row[col] = o
                        flag |= (a < -2147483648.0) | (a > 2147483647.0) | ((o - o) != 0.0)
                    for col in range(ncol):
                        out[i, j0 + col] = row[col]
                else:
                    for col in range(ncol):
                        j = j0 + col
                        a = acc[r * _NR + col] - cb[j] * u - zb[j] * v
                        o = (si * sb[j]) * np.float64(a)
                        out[i, j] = o
                        flag |= (a < _INT32_MIN) | (a > _INT32_MAX) | ((o - o) != 0.0)
                if flag:
                    for col in range(ncol):
                        j = j0 + col
                        if single:
                            a = np.int64(tmp[r * _NR + col]) - cb[j] * u - zb[j] * v
                        else:
                            a = acc[r * _NR + col] - cb[j] * u - zb[j] * v
                        if a < _INT32_MIN or a > _INT32_MAX:
                            ba = min(ba, i * n + j)
                            out[i, j] = 0.0
                        elif not np.isfinite(out[i, j]):
                            bf = min(bf, i * n + j)
        bad_acc[task] = ba
        bad_fin[task] = bf


# --------------------------------------------------------------------------- GEMM: int16 pairs
# Register-tiled int8 GEMM for AVX2 (and AVX-512 without VNNI): the int8 operands are
# widened to int16 and multiplied in pairs of consecutive k by ``vpmaddwd``
# (``llvm.x86.avx2.pmadd.wd``: 16 x i16 times 16 x i16 -> 8 x i32, each lane
# ``a[2l] * b[2l] + a[2l+1] * b[2l+1]``; ``llvm.x86.avx512.pmaddw.d.512`` with AVX-512BW).
# ``vpmaddwd`` never saturates: it wraps only when all four inputs of a lane are -32768,
# and ours lie in [-128, 127].  No ``vpmaddubsw`` (it saturates to int16).
#
# Exactness.  Both operands are the raw signed values ``qa, qb`` in [-128, 127], so every
# product has ``|qa * qb| <= 128 * 128 = 2**14`` and a lane after ``q`` pairs holds at most
# ``2 * q * 2**14`` in magnitude.  A chunk of at most ``_WD_KCHUNK_Q = 32768`` pairs
# (65536 terms) keeps every partial sum within ``65536 * 2**14 = 2**30 < 2**31``: the
# int32 lanes never wrap.  Chunks are combined in int64; then ``_finish``'s formula
# ``acc = S - zb[j] * RA[i] - za[i] * CB[j] + K * za[i] * zb[j]`` (exact integers) gives
# the same accumulator, the same refusal of int32 overflow and the same float64 result as
# every other path.
#
# Everything here that shapes compiled code depends on the numba TARGET only (never on
# HMATH_DL_KERNELS, which the facade applies at call time): the on-disk cache key covers
# the target.  Without AVX2 the emitters write the same arithmetic in generic IR (the
# facade does not choose these paths there, but they still compute the same integers).
_TARGET = _cpu.machine()
_WD_AVX2 = _TARGET.has("avx2")
_WD_512 = _TARGET.has("avx512f", "avx512bw")
_WL = 16 if _WD_512 else 8            # int32 lanes of one pmaddwd result
_WD_MR = 6                            # rows per register tile
_WD_NV = 4 if _WD_512 else 2          # vectors per tile row: 6 x 4 zmm / 6 x 2 ymm accumulators
_WD_NR = _WD_NV * _WL                 # columns per register tile (64 / 16)
_WD_KCHUNK_Q = 32768                  # k pairs per int32 chunk: 65536 * 2**14 = 2**30 < 2**31
_SK_NV = 4                            # skinny path: vectors per tile row
_SK_TW = _SK_NV * _WL                 # skinny tile width (64 / 32 columns)
_SK_RG = 4 if _WD_512 else 3          # skinny path: rows per register tile (16 zmm / 12 ymm)
_SK_KB = 8                            # skinny path: k pairs (row pairs of B) per tile sweep
_SK_TASKS = 8                         # skinny path: k ranges (parallel tasks), about
_I16V = ir.VectorType(ir.IntType(16), 2 * _WL)
_I32V = ir.VectorType(ir.IntType(32), _WL)
_I8V = ir.VectorType(ir.IntType(8), _WL)


def _pmaddwd(builder, x, y):
    """``vpmaddwd``: lane ``l`` = ``x[2l] * y[2l] + x[2l+1] * y[2l+1]`` (int16 -> int32)."""
    if _WD_AVX2:
        name = "llvm.x86.avx512.pmaddw.d.512" if _WD_512 else "llvm.x86.avx2.pmadd.wd"
        fn = cgutils.get_or_insert_function(builder.module,
                                            ir.FunctionType(_I32V, [_I16V, _I16V]), name)
        return builder.call(fn, [x, y])
    w = ir.VectorType(ir.IntType(32), 2 * _WL)
    p = builder.mul(builder.sext(x, w), builder.sext(y, w))
    undef = ir.Constant(w, ir.Undefined)
    ev = builder.shuffle_vector(p, undef, ir.Constant(_I32V, [2 * l for l in range(_WL)]))
    od = builder.shuffle_vector(p, undef, ir.Constant(_I32V, [2 * l + 1 for l in range(_WL)]))
    return builder.add(ev, od)


def _splat_pair(builder, word):
    """The i32 ``word`` (two int16: low = even k, high = odd k) in every lane, as int16s."""
    undef = ir.Constant(_I32V, ir.Undefined)
    v = builder.insert_element(undef, word, ir.Constant(ir.IntType(32), 0))
    v = builder.shuffle_vector(v, undef, ir.Constant(_I32V, [0] * _WL))
    return builder.bitcast(v, _I16V)


def _interleave_rows(builder, p0, p1, nv):
    """From ``nv * _WL`` int8 of row k (``p0``) and of row k+1 (``p1``): ``nv`` int16
    vectors, vector ``v`` = ``[b(k, vW), b(k+1, vW), b(k, vW+1), b(k+1, vW+1), ...]``."""
    wide = ir.VectorType(ir.IntType(8), nv * _WL)
    r0 = builder.load(builder.bitcast(p0, wide.as_pointer()), align=1)
    r1 = builder.load(builder.bitcast(p1, wide.as_pointer()), align=1)
    out = []
    for v in range(nv):
        mask = []
        for l in range(_WL):
            mask += [v * _WL + l, nv * _WL + v * _WL + l]
        pair = builder.shuffle_vector(r0, r1, ir.Constant(
            ir.VectorType(ir.IntType(32), 2 * _WL), mask))
        out.append(builder.sext(pair, _I16V))
    return out


@intrinsic
def _wd_tile(typingctx, ap, a_off, bp, b_off, nq, c):
    """LLVM micro-kernel: ``c[r * _WD_NR + l] = sum_{q < nq} (ap-panel(q, r) . bp-panel(q,
    l))`` for ``r < _WD_MR``, ``l < _WD_NR`` (int16 pairs -> int32 lanes, ``vpmaddwd``).

    ``ap``: packed int16 A, at ``a_off`` the row block ``[nq][_WD_MR][2]``; ``bp``: packed
    int16 B, at ``b_off`` the panel ``[nq][_WD_NR][2]``; ``c``: int32, >= _WD_MR * _WD_NR
    entries (overwritten).  ``nq >= 1`` and ``nq <= _WD_KCHUNK_Q`` (no lane can wrap)."""
    sig = types.void(ap, a_off, bp, b_off, nq, c)

    def codegen(context, builder, signature, args):
        ap_, a_off_, bp_, b_off_, nq_, c_ = args
        i16 = ir.IntType(16)
        i32 = ir.IntType(32)
        i64 = ir.IntType(64)
        aary = context.make_array(signature.args[0])(context, builder, ap_)
        bary = context.make_array(signature.args[2])(context, builder, bp_)
        cary = context.make_array(signature.args[5])(context, builder, c_)
        abase = builder.gep(builder.bitcast(aary.data, i16.as_pointer()), [a_off_])
        bbase = builder.gep(builder.bitcast(bary.data, i16.as_pointer()), [b_off_])
        cbase = builder.bitcast(cary.data, i32.as_pointer())
        pre = builder.block
        loop = builder.append_basic_block("wd.loop")
        done = builder.append_basic_block("wd.done")
        builder.branch(loop)
        builder.position_at_end(loop)
        q = builder.phi(i64)
        q.add_incoming(ir.Constant(i64, 0), pre)
        zero = ir.Constant(_I32V, None)
        accs = []
        for _ in range(_WD_MR * _WD_NV):
            p = builder.phi(_I32V)
            p.add_incoming(zero, pre)
            accs.append(p)
        boff = builder.mul(q, ir.Constant(i64, 2 * _WD_NR))
        bvs = []
        for v in range(_WD_NV):
            ptr = builder.gep(bbase, [builder.add(boff, ir.Constant(i64, v * 2 * _WL))])
            bvs.append(builder.load(builder.bitcast(ptr, _I16V.as_pointer()), align=2))
        aw = builder.bitcast(builder.gep(abase, [builder.mul(q, ir.Constant(i64, 2 * _WD_MR))]),
                             i32.as_pointer())
        new = []
        for r in range(_WD_MR):
            word = builder.load(builder.gep(aw, [ir.Constant(i64, r)]), align=2)
            av = _splat_pair(builder, word)
            for v in range(_WD_NV):
                new.append(builder.add(accs[r * _WD_NV + v], _pmaddwd(builder, av, bvs[v])))
        qn = builder.add(q, ir.Constant(i64, 1))
        cur = builder.block
        q.add_incoming(qn, cur)
        for p, nv_ in zip(accs, new):
            p.add_incoming(nv_, cur)
        builder.cbranch(builder.icmp_signed("<", qn, nq_), loop, done)
        builder.position_at_end(done)
        for r in range(_WD_MR):
            for v in range(_WD_NV):
                ptr = builder.gep(cbase, [ir.Constant(i64, r * _WD_NR + v * _WL)])
                builder.store(new[r * _WD_NV + v], builder.bitcast(ptr, _I32V.as_pointer()),
                              align=4)
        return context.get_dummy_value()

    return sig, codegen


@kernel
def pack_a_wd(qa, mp, kq, ap, ra):
    """``ap`` (flat int16 ``[mp / _WD_MR][kq][_WD_MR][2]``) with ``ap[((rb*kq + q)*MR + r)*2
    + t] = qa[rb*MR + r, 2q + t]`` (zero padded), written as int32 words of two int16;
    ``ra[i]`` = the row sums of ``qa``."""
    m, kk = qa.shape
    nrb = mp // _WD_MR
    kh = kk // 2
    aw = ap.view(np.int32)
    for rb in prange(nrb):
        base = rb * kq * _WD_MR
        for r in range(_WD_MR):
            i = rb * _WD_MR + r
            if i < m:
                s = np.int64(0)
                for t in range(kk):
                    s += np.int64(qa[i, t])
                ra[i] = s
                for q in range(kh):
                    lo = np.int32(qa[i, 2 * q])
                    hi = np.int32(qa[i, 2 * q + 1])
                    aw[base + q * _WD_MR + r] = (lo & 0xFFFF) | (hi << 16)
                for q in range(kh, kq):
                    aw[base + q * _WD_MR + r] = np.int32(qa[i, kk - 1]) & 0xFFFF
            else:
                for q in range(kq):
                    aw[base + q * _WD_MR + r] = 0


def _make_interleave_store(nv):
    """Intrinsic ``(src, s_off, lds, dst, d_off)``: ``dst[d_off + 2l + t] =
    int16(src[s_off + t * lds + l])`` for ``t < 2``, ``l < nv * _WL`` (two int8 rows ->
    ``nv`` interleaved int16 pair vectors)."""

    @intrinsic
    def store(typingctx, src, s_off, lds, dst, d_off):
        sig = types.void(src, s_off, lds, dst, d_off)

        def codegen(context, builder, signature, args):
            src_, s_off_, lds_, dst_, d_off_ = args
            i8 = ir.IntType(8)
            i16 = ir.IntType(16)
            sary = context.make_array(signature.args[0])(context, builder, src_)
            dary = context.make_array(signature.args[3])(context, builder, dst_)
            p0 = builder.gep(builder.bitcast(sary.data, i8.as_pointer()), [s_off_])
            p1 = builder.gep(p0, [lds_])
            vs = _interleave_rows(builder, p0, p1, nv)
            dbase = builder.gep(builder.bitcast(dary.data, i16.as_pointer()), [d_off_])
            for v, x in enumerate(vs):
                ptr = builder.gep(dbase, [ir.Constant(ir.IntType(64), v * 2 * _WL)])
                builder.store(x, builder.bitcast(ptr, _I16V.as_pointer()), align=2)
            return context.get_dummy_value()

        return sig, codegen

    return store


_interleave_panel = _make_interleave_store(_WD_NV)


@kernel
def pack_b_wd(qb, qbpad, np_, kq, bp, cb):
    """Pack ``qb`` for :func:`_wd_tile`: ``bp`` (flat int16 ``[np_ / _WD_NR][kq][_WD_NR][2]``)
    with ``bp[((p*kq + q)*NR + c)*2 + t] = qb[2q + t, p*NR + c]``, zero padded.  ``qbpad``
    is ``qb`` copied into ``[2 * kq, np_]`` zero-padded rows/columns (or an empty array
    when ``qb`` needs no padding: ``K`` even and ``N`` a multiple of ``_WD_NR``).
    ``cb[j]`` = the column sums of ``qb`` (int64)."""
    kk, n = qb.shape
    npanel = np_ // _WD_NR
    padded = qbpad.shape[0] > 0
    src = qbpad.reshape(-1) if padded else qb.reshape(-1)
    lds = np_ if padded else n
    for p in prange(npanel):
        j0 = p * _WD_NR
        for q in range(kq):
            _interleave_panel(src, 2 * q * lds + j0, lds, bp, ((p * kq + q) * _WD_NR) * 2)
        csum = np.zeros(_WD_NR, dtype=np.int64)
        for t in range(kk):            # padded columns (when padded) hold zeros
            for c in range(_WD_NR):
                csum[c] += np.int64(src[t * lds + j0 + c])
        for c in range(min(_WD_NR, n - j0)):
            cb[j0 + c] = csum[c]


_WD_TILES_PER_TASK = 8


@kernel
def gemm_wd(ap, bp, m, n, kk, mp, np_, kq, ra, cb, za, zb, sa, sb, out, bad_acc, bad_fin):
    """Exact int8 GEMM on int16-pair packed operands (:func:`pack_a_wd`, :func:`pack_b_wd`).

    Output tiles of ``_WD_MR x _WD_NR``; one parallel task = ``_WD_TILES_PER_TASK``
    consecutive tiles (column panel major, so a task reuses its B panel).  The micro-kernel
    yields ``S = sum_k qa qb`` exactly (chunks of at most ``_WD_KCHUNK_Q`` pairs in int32,
    combined in int64); ``acc = S - zb[j] * ra[i] - za[i] * (cb[j] - K * zb[j])``.

    For ``K <= 65536`` (one chunk) the epilogue runs in float64, which is exact there:
    ``|S| <= K * 2**14 <= 2**30``, ``|zb[j] * ra[i]| <= 128 * 128 * K <= 2**30``,
    ``|za[i] * (cb[j] - K * zb[j])| <= 128 * 256 * K <= 2**31``: every product and
    partial sum is an integer below ``2**53``, so the float value is the exact integer
    ``acc`` and ``(sa[i] * sb[j]) * acc`` the same float64 product as in ``_finish``.
    Longer K run the int64 epilogue.

    ``bad_acc[task]`` / ``bad_fin[task]``: smallest flat output index ``i * n + j`` of the
    task whose accumulator leaves int32 / whose result is not finite (``_NO_INDEX`` if
    none)."""
    nrg = mp // _WD_MR
    npanel = np_ // _WD_NR
    kk64 = np.int64(kk)
    ntiles = nrg * npanel
    ntask = (ntiles + _WD_TILES_PER_TASK - 1) // _WD_TILES_PER_TASK
    single = kq <= _WD_KCHUNK_Q
    cbkf = np.zeros(np_, dtype=np.float64)
    zbf = np.zeros(np_, dtype=np.float64)
    sbp = np.zeros(np_, dtype=np.float64)
    for j in range(n):
        cbkf[j] = np.float64(cb[j] - kk64 * zb[j])
        zbf[j] = np.float64(zb[j])
        sbp[j] = sb[j]
    for task in prange(ntask):
        tmp = np.empty(_WD_MR * _WD_NR, dtype=np.int32)
        acc = np.empty(_WD_MR * _WD_NR, dtype=np.int64)
        row = np.empty(_WD_NR, dtype=np.float64)
        ba = _NO_INDEX
        bf = _NO_INDEX
        for tile in range(task * _WD_TILES_PER_TASK,
                          min(ntiles, (task + 1) * _WD_TILES_PER_TASK)):
            p = tile // nrg
            rg = tile % nrg
            j0 = p * _WD_NR
            ncol = min(_WD_NR, n - j0)
            if single:
                _wd_tile(ap, rg * kq * _WD_MR * 2, bp, p * kq * _WD_NR * 2, kq, tmp)
            else:
                for e in range(_WD_MR * _WD_NR):
                    acc[e] = 0
                for q0 in range(0, kq, _WD_KCHUNK_Q):
                    nq = min(kq - q0, _WD_KCHUNK_Q)
                    _wd_tile(ap, (rg * kq + q0) * _WD_MR * 2, bp, (p * kq + q0) * _WD_NR * 2,
                             nq, tmp)
                    for e in range(_WD_MR * _WD_NR):
                        acc[e] += np.int64(tmp[e])
            for r in range(_WD_MR):
                i = rg * _WD_MR + r
                if i >= m:
                    break
                si = sa[i]
                flag = False
                if single:
                    raf = np.float64(ra[i])
                    zaf = np.float64(za[i])
                    for col in range(_WD_NR):
                        a = np.float64(tmp[r * _WD_NR + col]) - zbf[j0 + col] * raf \
                            - zaf * cbkf[j0 + col]
                        o = (si * sbp[j0 + col]) * a
                        row[col] = o
                        flag |= (a < -2147483648.0) | (a > 2147483647.0) | ((o - o) != 0.0)
                    for col in range(ncol):
                        out[i, j0 + col] = row[col]
                else:
                    for col in range(ncol):
                        j = j0 + col
                        a = acc[r * _WD_NR + col] - zb[j] * ra[i] - za[i] * cb[j] \
                            + kk64 * za[i] * zb[j]
                        o = (si * sb[j]) * np.float64(a)
                        out[i, j] = o
                        flag |= (a < _INT32_MIN) | (a > _INT32_MAX) | ((o - o) != 0.0)
                if flag:
                    for col in range(ncol):
                        j = j0 + col
                        if single:
                            s = np.int64(tmp[r * _WD_NR + col])
                        else:
                            s = acc[r * _WD_NR + col]
                        a = s - zb[j] * ra[i] - za[i] * cb[j] + kk64 * za[i] * zb[j]
                        if a < _INT32_MIN or a > _INT32_MAX:
                            ba = min(ba, i * n + j)
                            out[i, j] = 0.0
                        elif not np.isfinite(out[i, j]):
                            bf = min(bf, i * n + j)
        bad_acc[task] = ba
        bad_fin[task] = bf


# --------------------------------------------------------------------------- GEMM: skinny
# Few rows (M <= 16: batch-1 inference): B is read in place (no packing pass over the
# large operand), two rows of B at a time interleaved into int16 pairs in registers, and
# ``R`` rows of A (pairs of consecutive k, packed in int32 words) multiply them through
# ``vpmaddwd``.  A row of ones appended to A yields the column sums of B in the same pass.
# Exactness as above: per int32 lane at most 2 products of magnitude <= 2**14 per pair,
# flushed to int64 every ``_WD_KCHUNK_Q`` pairs (<= 2**30 in magnitude).


def _make_skinny(R):
    """Intrinsic ``(ap, a_off, lda, bsrc, b_off, ldb, nq, acc, c_off, ldc)``: for
    ``r < R``, ``l < _SK_TW``: ``acc[c_off + r*ldc + l] += sum_{q < nq} sum_{t < 2}
    lo/hi16(ap[a_off + r*lda + q]) * bsrc[b_off + (2q + t)*ldb + l]`` (int32; the caller
    bounds nq so that no lane wraps).  ``ap``: int32 words of two int16 (low = even k)."""

    @intrinsic
    def skinny(typingctx, ap, a_off, lda, bsrc, b_off, ldb, nq, acc, c_off, ldc):
        sig = types.void(ap, a_off, lda, bsrc, b_off, ldb, nq, acc, c_off, ldc)

        def codegen(context, builder, signature, args):
            ap_, a_off_, lda_, bs_, b_off_, ldb_, nq_, acc_, c_off_, ldc_ = args
            i8 = ir.IntType(8)
            i32 = ir.IntType(32)
            i64 = ir.IntType(64)
            aary = context.make_array(signature.args[0])(context, builder, ap_)
            bary = context.make_array(signature.args[3])(context, builder, bs_)
            cary = context.make_array(signature.args[7])(context, builder, acc_)
            abase = builder.gep(builder.bitcast(aary.data, i32.as_pointer()), [a_off_])
            arows = [builder.gep(abase, [builder.mul(lda_, ir.Constant(i64, r))])
                     for r in range(R)]
            bbase = builder.gep(builder.bitcast(bary.data, i8.as_pointer()), [b_off_])
            ldb2 = builder.mul(ldb_, ir.Constant(i64, 2))
            pre = builder.block
            loop = builder.append_basic_block("sk.loop")
            done = builder.append_basic_block("sk.done")
            builder.cbranch(builder.icmp_signed(">", nq_, ir.Constant(i64, 0)), loop, done)
            builder.position_at_end(loop)
            q = builder.phi(i64)
            q.add_incoming(ir.Constant(i64, 0), pre)
            zero = ir.Constant(_I32V, None)
            accs = []
            for _ in range(R * _SK_NV):
                p = builder.phi(_I32V)
                p.add_incoming(zero, pre)
                accs.append(p)
            p0 = builder.gep(bbase, [builder.mul(q, ldb2)])
            p1 = builder.gep(p0, [ldb_])
            bvs = _interleave_rows(builder, p0, p1, _SK_NV)
            new = []
            for r in range(R):
                word = builder.load(builder.gep(arows[r], [q]), align=4)
                av = _splat_pair(builder, word)
                for v in range(_SK_NV):
                    new.append(builder.add(accs[r * _SK_NV + v], _pmaddwd(builder, av, bvs[v])))
            qn = builder.add(q, ir.Constant(i64, 1))
            cur = builder.block
            q.add_incoming(qn, cur)
            for p, x in zip(accs, new):
                p.add_incoming(x, cur)
            builder.cbranch(builder.icmp_signed("<", qn, nq_), loop, done)
            builder.position_at_end(done)
            res = []
            for x in new:                       # every phi first, then the stores
                ph = builder.phi(_I32V)
                ph.add_incoming(zero, pre)
                ph.add_incoming(x, cur)
                res.append(ph)
            cbase = builder.gep(builder.bitcast(cary.data, i32.as_pointer()), [c_off_])
            for r in range(R):
                crow = builder.gep(cbase, [builder.mul(ldc_, ir.Constant(i64, r))])
                for v in range(_SK_NV):
                    ptr = builder.bitcast(builder.gep(crow, [ir.Constant(i64, v * _WL)]),
                                          _I32V.as_pointer())
                    builder.store(builder.add(builder.load(ptr, align=4), res[r * _SK_NV + v]),
                                  ptr, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return skinny


_skinny1 = _make_skinny(1)
_skinny2 = _make_skinny(2)
_skinny3 = _make_skinny(3)
_skinny4 = _make_skinny(4)


@helper
def _skinny_call(rg, ap, a_off, lda, bsrc, b_off, ldb, nq, acc, c_off, ldc):
    if rg >= 4:
        _skinny4(ap, a_off, lda, bsrc, b_off, ldb, nq, acc, c_off, ldc)
    elif rg == 3:
        _skinny3(ap, a_off, lda, bsrc, b_off, ldb, nq, acc, c_off, ldc)
    elif rg == 2:
        _skinny2(ap, a_off, lda, bsrc, b_off, ldb, nq, acc, c_off, ldc)
    else:
        _skinny1(ap, a_off, lda, bsrc, b_off, ldb, nq, acc, c_off, ldc)


@helper
def pack_a_pairs(qa, ones, ap, alast, ra):
    """``ap`` (int32 ``[rows, K // 2]``): word ``(i, q)`` holds ``qa[i, 2q]`` (low int16)
    and ``qa[i, 2q + 1]`` (high); ``alast[i] = qa[i, K-1]`` (used when K is odd);
    ``ra[i]`` = row sums.  With ``ones`` an extra row ``M`` of ones (its products are the
    column sums of B)."""
    m, kk = qa.shape
    kq = kk // 2
    for i in range(m):
        s = np.int64(0)
        for q in range(kq):
            lo = np.int32(qa[i, 2 * q])
            hi = np.int32(qa[i, 2 * q + 1])
            ap[i, q] = (lo & 0xFFFF) | (hi << 16)
            s += np.int64(lo + hi)
        if kk % 2 == 1:
            alast[i] = np.int64(qa[i, kk - 1])
            s += alast[i]
        else:
            alast[i] = 0
        ra[i] = s
    if ones:
        for q in range(kq):
            ap[m, q] = np.int32(0x00010001)
        alast[m] = 1


@kernel
def gemm_skinny(ap, alast, qb, btail, kk, s64):
    """``s64[i, j] = sum_k A[i, k] * qb[k, j]`` exactly (int64) for the ``rows`` rows of A
    packed in pairs in ``ap`` (:func:`pack_a_pairs`; ``alast`` = their last column when K
    is odd).  ``btail`` holds the last ``N % _SK_TW`` columns of ``qb`` zero padded to
    ``[K, _SK_TW]`` (or is empty).

    Parallel over ranges of k (integer sums: any split gives the same exact sums): every
    task streams whole rows of B in order (``_SK_KB`` pairs of rows at a time, each
    column tile of them through the register tile of :func:`_make_skinny`) into its own
    int32 partial sums over all columns -- at most ``_WD_KCHUNK_Q`` pairs per task, so no
    lane wraps -- and the partials are added in int64 afterwards."""
    rows = ap.shape[0]
    kq = kk // 2
    n = qb.shape[1]
    nfull = n // _SK_TW
    ntiles = nfull + (1 if n % _SK_TW != 0 else 0)
    wpad = ntiles * _SK_TW
    per = min(_WD_KCHUNK_Q, max(_SK_KB, (kq + _SK_TASKS - 1) // _SK_TASKS))
    per = (per + _SK_KB - 1) // _SK_KB * _SK_KB
    if per > _WD_KCHUNK_Q:
        per = _WD_KCHUNK_Q
    ntask = max(1, (kq + per - 1) // per)
    apf = ap.reshape(-1)
    qbf = qb.reshape(-1)
    btf = btail.reshape(-1)
    part = np.zeros((ntask, rows * wpad), dtype=np.int32)
    for task in prange(ntask):
        q0 = task * per
        q1 = min(kq, q0 + per)
        acc = part[task]
        for kb in range(q0, q1, _SK_KB):
            nq = min(q1 - kb, _SK_KB)
            for g0 in range(0, rows, _SK_RG):
                rg = min(_SK_RG, rows - g0)
                for t in range(ntiles):
                    coff = g0 * wpad + t * _SK_TW
                    if t < nfull:
                        _skinny_call(rg, apf, g0 * kq + kb, kq, qbf, 2 * kb * n + t * _SK_TW,
                                     n, nq, acc, coff, wpad)
                    else:
                        _skinny_call(rg, apf, g0 * kq + kb, kq, btf, 2 * kb * _SK_TW,
                                     _SK_TW, nq, acc, coff, wpad)
    nblk = (n + 255) // 256
    for blk in prange(nblk):
        j0 = blk * 256
        j1 = min(n, j0 + 256)
        for i in range(rows):
            for j in range(j0, j1):
                s64[i, j] = 0
            for task in range(ntask):
                for j in range(j0, j1):
                    s64[i, j] += np.int64(part[task, i * wpad + j])
            if kk % 2 == 1:
                a = alast[i]
                for j in range(j0, j1):
                    s64[i, j] += a * np.int64(qb[kk - 1, j])


@kernel
def finish_s(s64, m, kk, ra, cb, za, zb, sa, sb, out, bad_acc, bad_fin):
    """``out[i, j]`` from the exact ``S = s64[i, j]`` through :func:`_finish` (the portable
    path's epilogue); ``bad_acc[i]`` / ``bad_fin[i]`` as in :func:`gemm_portable`."""
    n = out.shape[1]
    for i in prange(m):
        ba = NO_INDEX
        bf = NO_INDEX
        for j in range(n):
            st = _finish(i, j, s64[i, j], np.int64(kk), ra, cb, za, zb, sa, sb, out)
            if st == INT_OVERFLOW and ba < 0:
                ba = j
            elif st == OVERFLOW and bf < 0:
                bf = j
        bad_acc[i] = ba
        bad_fin[i] = bf
