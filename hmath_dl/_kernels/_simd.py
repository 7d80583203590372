"""The vector-code generator behind the register-tiled kernels: LLVM IR emitters for
fused-multiply-add chains over register tiles, and the tile shapes of the target.

One generator, per-ISA tile shapes (BLIS's model: only the register-block sizes differ):
the shapes below are read from the machine policy (:mod:`._cpu`) -- from numba's TARGET,
never from the ``HMATH_DL_KERNELS`` override, which only switches paths at call time, so
every compiled kernel matches its on-disk cache key.

    AVX-512 (32 zmm, 8 lanes): row tiles 6 ch x 4 vectors, wide 8 x 3 / 4 x 6, pair 6 x 2 x 2
    AVX2    (16 ymm, 4 lanes): row tiles 6 ch x 2 vectors, wide 4 x 3,       pair 6 x 2 x 1

i.e. 24 or 12 accumulators next to the loads and a broadcast.  Every micro-kernel
computes, per output, the same chain of ``llvm.fma`` calls (one rounding per term) in the
same term order as the scalar code, so tiles, targets and thread counts give the same bits.
Only generic LLVM vector operations are emitted (``llvm.fma.v*f64``, loads, stores,
shuffles): no x86-specific intrinsic, so any target gets correct code.

Numba's on-disk cache does not notice edits to this module in the kernels that use its
intrinsics (``conv.py``, ``gemm_f64.py``): after editing it, delete the ``__pycache__``
directory of ``hmath_dl/_kernels`` (a fresh install or clone has none).
"""

import llvmlite.ir as llvm_ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from . import _cpu

# --------------------------------------------------------------------------- helpers
@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` with one rounding (IEEE fusedMultiplyAdd, ``llvm.fma.f64``).

    An explicit, exactly specified operation (not ``fastmath`` contraction, which would
    let the compiler decide): the same bits on every thread, and it vectorises to
    ``vfmadd``.  Only for float64 arguments."""
    if not all(isinstance(t, types.Float) and t.bitwidth == 64 for t in (a, b, c)):
        return None
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        dbl = llvm_ir.DoubleType()
        fnty = llvm_ir.FunctionType(dbl, [dbl, dbl, dbl])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.f64")
        return builder.call(fn, args)

    return sig, codegen


# --------------------------------------------------------------------------- tile shapes
# Everything ISA-specific in the tiled kernels is here, read from the machine policy (the
# TARGET numba compiles for -- never the HMATH_DL_KERNELS override, which only switches
# paths at call time, so every compiled kernel matches its on-disk cache key).  One
# generator of micro-kernels, two tile sets (BLIS-style: only register-block sizes differ):
#   AVX-512 (32 zmm, 8 lanes): row tiles 6 ch x 4 vectors, wide 8 x 3 / 4 x 6, pair 6 x 2 x 2
#   AVX2    (16 ymm, 4 lanes): row tiles 6 ch x 2 vectors, wide 4 x 3,       pair 6 x 2 x 1
# i.e. 24 or 12 accumulators plus the loads and a broadcast.  Every tile computes the same
# chains in the same order, so the bits do not depend on the tile set.
_TARGET = _cpu.machine()
_WIDE512 = _TARGET.has("avx512f")
_VW = 8 if _WIDE512 else 4   # float64 lanes of one vector of the explicit vector code
_ROW_MAXV = 4 if _WIDE512 else 2     # vectors per row tile (x 6 channels)
_PAIR_MAXV = 2 if _WIDE512 else 1    # vectors per phase of the two-phase tile
_WIDE_CB8 = _WIDE512                 # 8-channel wide tiles (else 4 channels only)
_WIDE_V8 = 3                         # vectors per 8-channel wide tile
_WIDE_V4 = 6 if _WIDE512 else 3      # vectors per 4-channel wide tile


@intrinsic
def _vfma(typingctx, rs, ys, i, ws):
    """``r_j[i:i+8] = fma(w[j,T-1], y_{T-1}[i:i+8], ... fma(w[j,0], y_0[i:i+8], r_j[i:i+8]))``
    for the accumulator rows ``rs`` (tuple of R 1-D arrays), the input rows ``ys`` (tuple of
    T 1-D arrays) and the weights ``ws`` (flat tuple of R*T float64, row-major [j, t]).

    Per element this is exactly the scalar chain of :func:`_fma` calls, so vector body and
    scalar tails give the same bits.  The explicit 8-lane vector type makes LLVM use
    512-bit registers where available (its auto-vectoriser stops at 256 bits on this CPU
    family); elsewhere it is split into narrower vectors.  Only contiguous (layout 'C')
    float64 arrays are accepted: the codegen addresses ``data + i`` directly, and the
    caller guarantees ``i + 8 <= len`` for every row."""
    if not (isinstance(rs, types.BaseTuple) and isinstance(ys, types.BaseTuple)
            and isinstance(ws, types.BaseTuple)):
        return None
    for a in tuple(rs) + tuple(ys):
        if not (isinstance(a, types.Array) and a.layout == "C" and a.dtype == types.float64
                and a.ndim == 1):
            return None
    if len(ws) != len(rs) * len(ys) or any(t != types.float64 for t in ws):
        return None
    nr, nt = len(rs), len(ys)

    def codegen(context, builder, signature, args):
        rs_t, ys_t, _, _ = signature.args
        fma = _vfma_fn(builder)
        idx = args[2]

        def vptr(aty, aval):
            a = context.make_array(aty)(context, builder, aval)
            return builder.bitcast(builder.gep(a.data, [idx]), _VTY.as_pointer())

        xs = [builder.load(vptr(ys_t[t], builder.extract_value(args[1], t)), align=8)
              for t in range(nt)]
        for j in range(nr):
            p = vptr(rs_t[j], builder.extract_value(args[0], j))
            acc = builder.load(p, align=8)
            for t in range(nt):
                splat = _splat(builder, builder.extract_value(args[3], j * nt + t))
                acc = builder.call(fma, [splat, xs[t], acc])
            builder.store(acc, p, align=8)
        return context.get_dummy_value()

    return types.void(rs, ys, i, ws), codegen



def _is_c1(a, dt):
    """A 1-D C-contiguous array of dtype ``dt`` (the micro-kernels address data directly)."""
    return isinstance(a, types.Array) and a.layout == "C" and a.ndim == 1 and a.dtype == dt



@intrinsic
def borrowed(typingctx, a):
    """``a`` itself, as an array value without its memory-info pointer (a *borrowed*
    view: the same data, shape and strides).  In a serial compilation every inlined or
    compiled helper that takes an array increments and decrements its reference count on
    each call, atomically (Numba's ``NRT_incref``/``NRT_decref``); on a borrowed array
    those are a null test.  The attention forward, one thread, spent a third of its time
    there (once per 4-row block and per nested helper).  Only for arrays that the caller
    keeps alive for as long as the borrowed view is used (a kernel's arguments, inside
    the kernel); never returned or stored."""
    if not isinstance(a, types.Array):
        return None
    sig = a(a)

    def codegen(context, builder, signature, args):
        src = context.make_array(signature.args[0])(context, builder, args[0])
        dst = context.make_array(signature.return_type)(context, builder)
        dst.meminfo = cgutils.get_null_value(dst.meminfo.type)
        dst.parent = cgutils.get_null_value(dst.parent.type)
        dst.nitems = src.nitems
        dst.itemsize = src.itemsize
        dst.data = src.data
        dst.shape = src.shape
        dst.strides = src.strides
        return dst._getvalue()

    return sig, codegen


@intrinsic
def alive(typingctx, a):
    """No code: a use of the array ``a`` at this point, so that Numba keeps it (and the
    memory under its :func:`borrowed` views) until here -- it releases a local array
    after its last use."""
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, signature, args):
        return context.get_dummy_value()

    return types.void(a), codegen

def _accepts(f64=(), i64=(), ints=(), bools=()):
    """The typing check shared by the micro-kernel intrinsics: 1-D C-contiguous float64
    arrays ``f64``, int64 arrays ``i64``, integer scalars ``ints``, boolean ``bools``."""
    return (all(_is_c1(a, types.float64) for a in f64)
            and all(_is_c1(a, types.int64) for a in i64)
            and all(isinstance(t, types.Integer) for t in ints)
            and all(isinstance(t, types.Boolean) for t in bools))


def _data(context, builder, aty, aval):
    """The data pointer of the numba array value ``aval`` of type ``aty``."""
    return context.make_array(aty)(context, builder, aval).data


_VTY = llvm_ir.VectorType(llvm_ir.DoubleType(), _VW)   # one 512-bit vector of float64
_I64 = llvm_ir.IntType(64)


def _vfma_fn(builder):
    """The ``llvm.fma`` intrinsic on 8-lane float64 vectors (one rounding per lane)."""
    return cgutils.get_or_insert_function(
        builder.module, llvm_ir.FunctionType(_VTY, [_VTY, _VTY, _VTY]), "llvm.fma.v%df64" % _VW)


def _splat(builder, x):
    """The float64 scalar ``x`` broadcast to every lane of a vector."""
    undef = llvm_ir.Constant(_VTY, llvm_ir.Undefined)
    lane0 = llvm_ir.Constant(llvm_ir.IntType(32), 0)
    zmask = llvm_ir.Constant(llvm_ir.VectorType(llvm_ir.IntType(32), _VW), [0] * _VW)
    return builder.shuffle_vector(builder.insert_element(undef, x, lane0), undef, zmask)


def _vptr(builder, p, k):
    """``p + k`` (a float64 pointer, constant element offset ``k``) as a vector pointer."""
    return builder.bitcast(builder.gep(p, [llvm_ir.Constant(_I64, k)]), _VTY.as_pointer())


def _zero_slots(builder, n):
    """``n`` vector accumulators (allocas, promoted to registers), each 0.0."""
    zero = llvm_ir.Constant(_VTY, [0.0] * _VW)
    return [cgutils.alloca_once_value(builder, zero) for _ in range(n)]


def _emit_chain(context, builder, xd, xb, od, wd, wb, nk, CB, V, WS=None):
    """Emit the micro-kernel loop: for kk in 0 .. nk-1, load V 8-lane vectors of x at
    ``xd + xb + od[kk] + 8v``, broadcast the CB weights ``wd[wb + kk*WS + j]`` (``WS``, the
    packing's block height, defaults to CB) and update ``acc[j][v] = fma(w_j, x_v,
    acc[j][v])`` (accumulators start at 0.0).  Returns the CB x V final accumulator
    values.  The accumulators live in allocas that LLVM promotes to registers (24 of them
    fit the 32 vector registers of AVX-512 next to the loads)."""
    fma = _vfma_fn(builder)
    slots = [_zero_slots(builder, V) for _ in range(CB)]
    px0 = builder.gep(xd, [xb])
    pw0 = builder.gep(wd, [wb])
    with cgutils.for_range(builder, nk) as loop:
        kk = loop.index
        px = builder.gep(px0, [builder.load(builder.gep(od, [kk]))])
        xs = [builder.load(_vptr(builder, px, v * _VW), align=8) for v in range(V)]
        pw = builder.gep(pw0, [builder.mul(kk, llvm_ir.Constant(_I64, WS or CB))])
        for j in range(CB):
            sp = _splat(builder, builder.load(builder.gep(pw, [llvm_ir.Constant(_I64, j)])))
            for v in range(V):
                builder.store(builder.call(fma, [sp, xs[v], builder.load(slots[j][v])]),
                              slots[j][v])
    return [[builder.load(slots[j][v]) for v in range(V)] for j in range(CB)]


def _emit_store(context, builder, accs, od, ob, ost, nbv, bd, bb, hb, CB, V):
    """Emit the store epilogue of a micro-kernel: ``od[ob + j*ost + 8v + l] = accs[j][v][l]
    (+ bd[bb + j] when hb)`` for ``j < nbv``; returns an i1 that is true iff every stored
    value is finite (the max of the exponent fields, all ones only for NaN/inf, kept as a
    vector and reduced once)."""
    i64 = _I64
    lane0 = llvm_ir.Constant(llvm_ir.IntType(32), 0)
    hbit = builder.trunc(hb, llvm_ir.IntType(1)) if hb.type != llvm_ir.IntType(1) else hb
    ity = llvm_ir.VectorType(i64, _VW)
    expm = llvm_ir.Constant(ity, [0x7FF0000000000000] * _VW)
    mx = cgutils.alloca_once_value(builder, llvm_ir.Constant(ity, [0] * _VW))
    for j in range(CB):
        jc = llvm_ir.Constant(i64, j)
        with builder.if_then(builder.icmp_signed("<", jc, nbv)):
            row = builder.gep(od, [builder.add(ob, builder.mul(jc, ost))])
            bsp = _splat(builder, builder.load(builder.gep(bd, [builder.add(bb, jc)])))
            m = builder.load(mx)
            for v in range(V):
                val = builder.select(hbit, builder.fadd(accs[j][v], bsp), accs[j][v])
                builder.store(val, _vptr(builder, row, v * _VW), align=8)
                e = builder.and_(builder.bitcast(val, ity), expm)
                m = builder.select(builder.icmp_unsigned(">", e, m), e, m)
            builder.store(m, mx)
    bad = builder.icmp_unsigned("==", builder.load(mx), expm)
    anybad = builder.extract_element(bad, lane0)
    for lane in range(1, _VW):
        anybad = builder.or_(anybad, builder.extract_element(
            bad, llvm_ir.Constant(llvm_ir.IntType(32), lane)))
    return builder.not_(anybad)


def _emit_chain_pair(context, builder, xd, xb, oa, ob_, wd, wb, nk, CB, V):
    """Emit the loop of the two-phase micro-kernel (transposed convolution with stride 2
    along W): two register tiles of CB channels x V vectors of 8, one per W phase, in the
    same loop over the terms kk: phase a reads ``xd + xb + oa[kk] + 8v`` and weights
    ``wd[wb + kk*2CB + j]``, phase b ``xd + xb + ob_[kk] + 8v`` and ``wd[wb + kk*2CB + CB +
    j]`` (one fused multiply-add per term, as everywhere here).  Returns, per channel, the
    2V output vectors of 8 consecutive outputs with the two phases interleaved (even
    outputs from phase a, odd ones from phase b)."""
    VW = _VW
    fma = _vfma_fn(builder)
    slots = [[_zero_slots(builder, V) for _ in range(CB)] for _ in range(2)]
    px0 = builder.gep(xd, [xb])
    pw0 = builder.gep(wd, [wb])
    with cgutils.for_range(builder, nk) as loop:
        kk = loop.index
        pw = builder.gep(pw0, [builder.mul(kk, llvm_ir.Constant(_I64, 2 * CB))])
        for ph, offs in enumerate((oa, ob_)):
            px = builder.gep(px0, [builder.load(builder.gep(offs, [kk]))])
            xs = [builder.load(_vptr(builder, px, v * VW), align=8) for v in range(V)]
            for j in range(CB):
                sp = _splat(builder, builder.load(
                    builder.gep(pw, [llvm_ir.Constant(_I64, ph * CB + j)])))
                for v in range(V):
                    slot = slots[ph][j][v]
                    builder.store(builder.call(fma, [sp, xs[v], builder.load(slot)]), slot)
    i32 = llvm_ir.IntType(32)
    half = VW // 2
    lo_mask = llvm_ir.Constant(llvm_ir.VectorType(i32, VW),
                               [k for i in range(half) for k in (i, VW + i)])
    hi_mask = llvm_ir.Constant(llvm_ir.VectorType(i32, VW),
                               [k for i in range(half, VW) for k in (i, VW + i)])
    outs = []
    for j in range(CB):
        row = []
        for v in range(V):
            a = builder.load(slots[0][j][v])
            b = builder.load(slots[1][j][v])
            row += [builder.shuffle_vector(a, b, lo_mask), builder.shuffle_vector(a, b, hi_mask)]
        outs.append(row)
    return outs


def _make_micro_pair(CB, V):
    """The two-phase micro-kernel (:func:`_emit_chain_pair`) for CB channels x 16V
    consecutive outputs of one row, stored to the output row like
    :func:`_make_micro_store` (returns True iff all are finite).  Arguments ``(xf, xbase,
    offs_a, offs_b, wpk, wbase, K, of, obase, ostride, nb, bias, bbase, has_bias, acc)``
    (``acc`` unused).  The caller guarantees every address is inside its array."""

    @intrinsic
    def micro(typingctx, xf, xbase, oa, ob_, wpk, wbase, K, of, obase, ostride, nb, bias,
              bbase, has_bias, acc):
        if not _accepts(f64=(xf, wpk, of, bias, acc), i64=(oa, ob_),
                        ints=(xbase, wbase, K, obase, ostride, nb, bbase), bools=(has_bias,)):
            return None
        i64t = types.int64
        sig = types.boolean(xf, i64t, oa, ob_, wpk, i64t, i64t, of, i64t, i64t, i64t, bias, i64t,
                            types.boolean, acc)

        def codegen(context, builder, signature, args):
            t = signature.args
            xa, xb, oaa, oba, wa, wb, nk, ofa, obs, ost, nbv, ba, bb, hb, aa = args
            outs = _emit_chain_pair(context, builder, _data(context, builder, t[0], xa), xb,
                                    _data(context, builder, t[2], oaa),
                                    _data(context, builder, t[3], oba),
                                    _data(context, builder, t[4], wa), wb, nk, CB, V)
            return _emit_store(context, builder, outs, _data(context, builder, t[7], ofa),
                               obs, ost, nbv, _data(context, builder, t[11], ba), bb, hb,
                               CB, 2 * V)

        return sig, codegen

    return micro


def _make_micro(CB, V):
    """Build the register-tiled micro-kernel for ``CB`` output channels x ``V`` vectors of
    8 consecutive output positions (``CB * V`` 512-bit accumulators, at most 24 so that
    they stay in registers):

    ``acc[j*8V + i] = fma(w[K-1, j], x[xbase + offs[K-1] + i], ... fma(w[0, j], x[xbase +
    offs[0] + i], 0.0))`` for ``j < CB``, ``i < 8V``, with ``w[kk, j] = wpk[wbase + kk*CB + j]``.

    Per output this is exactly the scalar chain of :func:`_fma` calls over the terms in
    the order kk = 0 .. K-1 (one rounding per term), so tiled and scalar code give the
    same bits.  Emitted directly as an LLVM loop whose accumulators are SSA values (no
    load/store per term); every iteration loads V input vectors and broadcasts CB weights.
    The caller guarantees that every address read is inside ``xf`` and that ``acc`` holds
    at least ``8 * CB * V`` elements.  Only 1-D C-contiguous arrays are accepted."""

    @intrinsic
    def micro(typingctx, xf, xbase, offs, wpk, wbase, K, acc):
        if not _accepts(f64=(xf, wpk, acc), i64=(offs,), ints=(xbase, wbase, K)):
            return None
        sig = types.void(xf, types.int64, offs, wpk, types.int64, types.int64, acc)

        def codegen(context, builder, signature, args):
            xft, _, offt, wpkt, _, _, acct = signature.args
            xa, xb, oa, wa, wb, nk, aa = args
            accs = _emit_chain(context, builder, _data(context, builder, xft, xa), xb,
                               _data(context, builder, offt, oa),
                               _data(context, builder, wpkt, wa), wb, nk, CB, V)
            ad = _data(context, builder, acct, aa)
            for j in range(CB):
                for v in range(V):
                    builder.store(accs[j][v], _vptr(builder, ad, (j * V + v) * _VW), align=8)
            return context.get_dummy_value()

        return sig, codegen

    return micro


def _make_micro_store(CB, V, WS=None):
    """Like :func:`_make_micro` (weights packed in blocks of ``WS`` channels, default CB,
    of which the first CB are computed), but the finished accumulators go straight to the
    output:
    ``of[obase + j*ostride + i] = acc[j, i] (+ bias[bbase + j] when has_bias)`` for
    ``j < nb`` (the real channels of the block), ``i < 8V`` -- one addition after the
    chain, as in the scalar code.  Returns True iff every stored value is finite (so the
    caller needs no second pass over the output).  The caller guarantees that every
    address read or written is inside ``xf`` / ``of``."""

    @intrinsic
    def micro(typingctx, xf, xbase, offs, wpk, wbase, K, of, obase, ostride, nb, bias,
              bbase, has_bias):
        if not _accepts(f64=(xf, wpk, of, bias), i64=(offs,),
                        ints=(xbase, wbase, K, obase, ostride, nb, bbase), bools=(has_bias,)):
            return None
        i64t = types.int64
        sig = types.boolean(xf, i64t, offs, wpk, i64t, i64t, of, i64t, i64t, i64t, bias, i64t,
                            types.boolean)

        def codegen(context, builder, signature, args):
            xft, _, offt, wpkt, _, _, oft, _, _, _, bt, _, _ = signature.args
            xa, xb, oa, wa, wb, nk, ofa, ob, ost, nbv, ba, bb, hb = args
            accs = _emit_chain(context, builder, _data(context, builder, xft, xa), xb,
                               _data(context, builder, offt, oa),
                               _data(context, builder, wpkt, wa), wb, nk, CB, V, WS)
            return _emit_store(context, builder, accs, _data(context, builder, oft, ofa), ob,
                               ost, nbv, _data(context, builder, bt, ba), bb, hb, CB, V)

        return sig, codegen

    return micro


def _make_micro_cv(VC):
    """The channel-vector micro-kernel, for outputs that are too few to fill position
    vectors (row remainders): ONE output position, ``8 * VC`` output channels in ``VC``
    accumulators --

    ``acc[8v + l] = fma(w[K-1, 8v+l], x[xbase + offs[K-1]], ... fma(w[0, 8v+l], x[xbase +
    offs[0]], 0.0))`` with ``w[kk, c] = wcv[wbase + kk*WS + c]``,

    i.e. per output the same chain of fused multiply-adds over the terms kk = 0 .. K-1 as
    every other kernel here (the product is commutative, so the bits are the same), but
    the weights are loaded as vectors over channels (layout ``[.., K, WS]``, WS >= 8 VC)
    and the single input value is broadcast.  Every address read is an element the
    output actually uses, so no bounds slack is needed.  Signature ``(xf, xbase, offs,
    wcv, wbase, WS, K, acc)``."""

    @intrinsic
    def micro(typingctx, xf, xbase, offs, wcv, wbase, WS, K, acc):
        if not _accepts(f64=(xf, wcv, acc), i64=(offs,), ints=(xbase, wbase, WS, K)):
            return None
        i64t = types.int64
        sig = types.void(xf, i64t, offs, wcv, i64t, i64t, i64t, acc)

        def codegen(context, builder, signature, args):
            t = signature.args
            xa, xb, oa, wa, wb, ws, nk, aa = args
            xd = _data(context, builder, t[0], xa)
            od = _data(context, builder, t[2], oa)
            wd = _data(context, builder, t[3], wa)
            ad = _data(context, builder, t[7], aa)
            fma = _vfma_fn(builder)
            slots = _zero_slots(builder, VC)
            px0 = builder.gep(xd, [xb])
            pw0 = builder.gep(wd, [wb])
            with cgutils.for_range(builder, nk) as loop:
                kk = loop.index
                sp = _splat(builder, builder.load(
                    builder.gep(px0, [builder.load(builder.gep(od, [kk]))])))
                pw = builder.gep(pw0, [builder.mul(kk, ws)])
                for v in range(VC):
                    wv = builder.load(_vptr(builder, pw, v * _VW), align=8)
                    builder.store(builder.call(fma, [wv, sp, builder.load(slots[v])]), slots[v])
            for v in range(VC):
                builder.store(builder.load(slots[v]), _vptr(builder, ad, v * _VW), align=8)
            return context.get_dummy_value()

        return sig, codegen

    return micro




def _prefetch(builder, p, write=True, locality=3):
    """A prefetch of the cache line at the pointer ``p`` into every cache level
    (``locality`` 3; 2: into L2 and beyond, ``prefetcht1`` on x86), with write intent
    unless ``write`` is false (``llvm.prefetch``: a hint only; it never faults, changes
    no value, and becomes a no-op on a target without prefetch instructions)."""
    i8p = llvm_ir.IntType(8).as_pointer()
    i32 = llvm_ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, llvm_ir.FunctionType(llvm_ir.VoidType(), [i8p, i32, i32, i32]),
        "llvm.prefetch." + i8p.intrinsic_name)     # .p0i8 (typed pointers) or .p0
    builder.call(fn, [builder.bitcast(p, i8p), llvm_ir.Constant(i32, int(write)),
                      llvm_ir.Constant(i32, locality), llvm_ir.Constant(i32, 1)])


def _make_prefetch(locality):
    def prefetch(typingctx, a, i):
        if not _accepts(f64=(a,), ints=(i,)):
            return None
        sig = types.void(a, types.int64)

        def codegen(context, builder, signature, args):
            _prefetch(builder, builder.gep(_data(context, builder, signature.args[0], args[0]),
                                           [args[1]]), write=False, locality=locality)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(prefetch)


#: ``prefetch_read(a, i)``: prefetch the cache line of ``a[i]`` (a 1-D C-contiguous
#: float64 array; ``i`` need not be inside it: a hint never faults) for reading, into
#: every cache level.  Changes no value.
prefetch_read = _make_prefetch(3)
#: ``prefetch_l2(a, i)``: as :func:`prefetch_read`, into L2 and beyond (not L1).
prefetch_l2 = _make_prefetch(2)


def _make_micro_acc(CB, V, f32=False, fused=True, widen=False, astrided=False,
                    epilogue=False):
    """The continuing micro-kernel of the float GEMMs: a CB x ``L*V`` tile of ``c``
    (rows ``cbase + j*cstride``, j < CB; ``L`` lanes per vector: ``VW`` float64, or
    ``2*VW`` float32 when ``f32``) is loaded into CB*V vector accumulators (or, when
    ``first`` is true, the accumulators start at +0.0 and ``c`` is not read), the chain
    runs over ``nk`` terms --

    ``c[j, i] = fma(a[kk, j], b[bbase + kk*bstride + i], c[j, i])`` for kk = 0 .. nk-1 in
    order, with ``a[kk, j] = apk[abase + kk*CB + j]`` (``fused=False``: the separately
    rounded ``c[j, i] + a[kk, j] * b[...]``, an ``fmul`` then an ``fadd``, which LLVM may
    not contract without fast-math flags) --

    and the tile is stored back.  Starting from ``c = 0`` and continuing chunk after chunk
    is exactly one chain over all the terms (a float in memory is the register value),
    so K-blocking changes no bit.  While the chain runs, the lines of the tile at
    ``cf[pfbase + j*cstride ...]`` (the caller's next tile) are prefetched, so its loads do
    not stall the next call (a hint: the address need not be inside the array).
    Signature ``(bf, bbase, bstride, apk, abase, nk, cf, cbase, cstride, first, pfbase)``
    with float64 (or float32) arrays; the caller guarantees every other address is inside
    its array.

    ``widen`` (float32 only): the chain's last chunk.  The tile is not stored back into
    ``cf`` but widened, exactly, to float64 rows ``of[obase + j*ostride ...]`` (three more
    arguments ``(of, obase, ostride)`` after ``pfbase``, ``of`` a float64 array), and the
    intrinsic returns 1 if a stored value is NaN or +-inf, else 0 (int64).

    ``astrided``: ``a`` is read where it lies, two more arguments
    ``(ak, aj)`` right after ``pfbase`` (before ``widen``'s three) giving ``a[kk, j] = apk[abase + kk*ak + j*aj]`` (a
    packed block is ``ak = CB, aj = 1``; rows of a row-major ``a`` are ``ak = 1,
    aj = lda``; the transpose of a row-major array ``ak = lda, aj = 1``).  The same
    operations in the same order: only the addresses differ.

    ``epilogue`` (float64 only): the chain's last chunk, finished in registers before the
    tile is stored: three more arguments ``(bias, boff, mode)`` after the a strides (a
    float64 array, int64, int64) -- ``mode`` 1 adds ``bias[boff + j]`` to row ``j``, 2
    adds ``bias[boff + i]`` to column ``i`` (one rounding after the chain: ``c + bias``,
    as :func:`.gemm_f64._finish` does), 0 adds nothing -- and the intrinsic returns the
    number of the tile's stored values that are NaN or +-inf (int64)."""
    assert f32 or not widen
    assert not (epilogue and (f32 or widen))
    na = 2 if astrided else 0               # the a strides' arguments, after pfbase
    nbt = types.float32 if f32 else types.float64
    lanes = 2 * _VW if f32 else _VW
    ety = llvm_ir.FloatType() if f32 else llvm_ir.DoubleType()
    vty = llvm_ir.VectorType(ety, lanes)
    per_line = 16 if f32 else 8             # elements per 64-byte cache line
    al = 4 if f32 else 8

    def vptr(builder, p, k):
        return builder.bitcast(builder.gep(p, [llvm_ir.Constant(_I64, k)]), vty.as_pointer())

    def typer(bf, bbase, bstride, apk, abase, nk, cf, cbase, cstride, first, pfbase,
              *wide_args):
        if not (all(_is_c1(x, nbt) for x in (bf, apk, cf))
                and _accepts(ints=(bbase, bstride, abase, nk, cbase, cstride, pfbase),
                             bools=(first,))):
            return None
        i64t = types.int64
        head = (bf, i64t, i64t, apk, i64t, i64t, cf, i64t, i64t, types.boolean, i64t)
        if astrided:
            if not (len(wide_args) >= 2 and _accepts(ints=wide_args[:2])):
                return None
            head = head + (i64t, i64t)
            wide_args = wide_args[2:]
        if epilogue:
            if not (len(wide_args) == 3 and _accepts(f64=wide_args[:1], ints=wide_args[1:])):
                return None
            return i64t(*head, wide_args[0], i64t, i64t)
        if not widen:
            return None if wide_args else types.void(*head)
        if not (len(wide_args) == 3 and _accepts(f64=wide_args[:1], ints=wide_args[1:])):
            return None
        return i64t(*head, wide_args[0], i64t, i64t)

    def intrinsic_body(typingctx, *argtys):
        sig = typer(*argtys)
        if sig is None:
            return None

        def codegen(context, builder, signature, args):
            t = signature.args
            ba, bb, bs, aa, ab, nkv, ca, cb, cs, fst, pfb = args[:11]
            bd = _data(context, builder, t[0], ba)
            ad = _data(context, builder, t[3], aa)
            cd = _data(context, builder, t[6], ca)
            fma = cgutils.get_or_insert_function(
                builder.module, llvm_ir.FunctionType(vty, [vty, vty, vty]),
                "llvm.fma.v%d%s" % (lanes, "f32" if f32 else "f64"))
            undef = llvm_ir.Constant(vty, llvm_ir.Undefined)
            lane0 = llvm_ir.Constant(llvm_ir.IntType(32), 0)
            zmask = llvm_ir.Constant(llvm_ir.VectorType(llvm_ir.IntType(32), lanes), [0] * lanes)
            rows = [builder.gep(cd, [builder.add(cb, builder.mul(llvm_ir.Constant(_I64, j), cs))])
                    for j in range(CB)]
            zero = llvm_ir.Constant(vty, [0.0] * lanes)
            slots = [[cgutils.alloca_once_value(builder, zero) for v in range(V)]
                     for j in range(CB)]
            with builder.if_then(builder.not_(context.cast(builder, fst, t[9], types.boolean))):
                for j in range(CB):
                    for v in range(V):
                        builder.store(builder.load(vptr(builder, rows[j], v * lanes), align=al),
                                      slots[j][v])
            # the next tile's lines: CB rows x (V vectors); one prefetch per 64-byte line
            pf0 = builder.gep(cd, [pfb])
            for j in range(CB):
                prow = builder.gep(pf0, [builder.mul(llvm_ir.Constant(_I64, j), cs)])
                for line in range(0, V * lanes, per_line):
                    _prefetch(builder, builder.gep(prow, [llvm_ir.Constant(_I64, line)]))
            pb0 = builder.gep(bd, [bb])
            pa0 = builder.gep(ad, [ab])
            if astrided:   # one pointer per row of a, advanced by ak per term
                akv = context.cast(builder, args[11], t[11], types.int64)
                ajv = context.cast(builder, args[12], t[12], types.int64)
                arows = [builder.gep(pa0, [builder.mul(llvm_ir.Constant(_I64, j), ajv)])
                         for j in range(CB)]
            with cgutils.for_range(builder, nkv) as loop:
                kk = loop.index
                pb = builder.gep(pb0, [builder.mul(kk, bs)])
                xs = [builder.load(vptr(builder, pb, v * lanes), align=al) for v in range(V)]
                if astrided:
                    ka = builder.mul(kk, akv)
                else:
                    pa = builder.gep(pa0, [builder.mul(kk, llvm_ir.Constant(_I64, CB))])
                for j in range(CB):
                    if astrided:
                        x = builder.load(builder.gep(arows[j], [ka]))
                    else:
                        x = builder.load(builder.gep(pa, [llvm_ir.Constant(_I64, j)]))
                    sp = builder.shuffle_vector(builder.insert_element(undef, x, lane0),
                                                undef, zmask)
                    for v in range(V):
                        acc = builder.load(slots[j][v])
                        if fused:
                            new = builder.call(fma, [sp, xs[v], acc])
                        else:                    # fl(acc + fl(a * b)): no contraction flags
                            new = builder.fadd(acc, builder.fmul(sp, xs[v]))
                        builder.store(new, slots[j][v])
            if epilogue:
                return _finish_tile(context, builder, t, args, 11 + na, slots, rows, CB, V,
                                    vty, lanes)
            if not widen:
                for j in range(CB):
                    for v in range(V):
                        builder.store(builder.load(slots[j][v]),
                                      vptr(builder, rows[j], v * lanes), align=al)
                return context.get_dummy_value()
            # the last chunk: widen (exact) into float64 rows; x - x is NaN exactly for
            # NaN/inf, so one unordered compare per vector flags them
            od = _data(context, builder, t[11 + na], args[11 + na])
            dty = llvm_ir.VectorType(llvm_ir.DoubleType(), lanes)
            zero64 = llvm_ir.Constant(dty, [0.0] * lanes)
            bad = None
            for j in range(CB):
                orow = builder.gep(od, [builder.add(args[12 + na], builder.mul(
                    llvm_ir.Constant(_I64, j), args[13 + na]))])
                for v in range(V):
                    wide_v = builder.fpext(builder.load(slots[j][v]), dty)
                    builder.store(wide_v, builder.bitcast(
                        builder.gep(orow, [llvm_ir.Constant(_I64, v * lanes)]),
                        dty.as_pointer()), align=8)
                    nan = builder.fcmp_unordered("uno", builder.fsub(wide_v, wide_v),
                                                 zero64)
                    bad = nan if bad is None else builder.or_(bad, nan)
            mask = builder.bitcast(bad, llvm_ir.IntType(lanes))
            flag = builder.icmp_unsigned("!=", mask, llvm_ir.Constant(llvm_ir.IntType(lanes), 0))
            return builder.zext(flag, _I64)

        return sig, codegen

    # the three trailing arguments: widen's (of, obase, ostride) or epilogue's (bias,
    # boff, mode)
    if (widen or epilogue) and astrided:
        @intrinsic
        def micro(typingctx, bf, bbase, bstride, apk, abase, nk, cf, cbase, cstride, first,
                  pfbase, ak, aj, x0, x1, x2):
            return intrinsic_body(typingctx, bf, bbase, bstride, apk, abase, nk, cf, cbase,
                                  cstride, first, pfbase, ak, aj, x0, x1, x2)
    elif widen or epilogue:
        @intrinsic
        def micro(typingctx, bf, bbase, bstride, apk, abase, nk, cf, cbase, cstride, first,
                  pfbase, x0, x1, x2):
            return intrinsic_body(typingctx, bf, bbase, bstride, apk, abase, nk, cf, cbase,
                                  cstride, first, pfbase, x0, x1, x2)
    elif astrided:
        @intrinsic
        def micro(typingctx, bf, bbase, bstride, apk, abase, nk, cf, cbase, cstride, first,
                  pfbase, ak, aj):
            return intrinsic_body(typingctx, bf, bbase, bstride, apk, abase, nk, cf, cbase,
                                  cstride, first, pfbase, ak, aj)
    else:
        @intrinsic
        def micro(typingctx, bf, bbase, bstride, apk, abase, nk, cf, cbase, cstride, first,
                  pfbase):
            return intrinsic_body(typingctx, bf, bbase, bstride, apk, abase, nk, cf, cbase,
                                  cstride, first, pfbase)
    return micro


def _finish_tile(context, builder, t, args, ei, slots, rows, CB, V, vty, lanes):
    """:func:`_make_micro_acc`'s ``epilogue``: the bias (``args[ei]``, offset
    ``args[ei+1]``, mode ``args[ei+2]``) added to the CB x V accumulators ``slots``, the
    tile stored to ``rows``, and the count of its non-finite values returned (int64;
    ``x - x`` is NaN exactly for NaN and +-inf)."""
    i32 = llvm_ir.IntType(32)
    bd = _data(context, builder, t[ei], args[ei])
    boff = context.cast(builder, args[ei + 1], t[ei + 1], types.int64)
    mode = context.cast(builder, args[ei + 2], t[ei + 2], types.int64)
    pbias = builder.gep(bd, [boff])
    with builder.if_then(builder.icmp_signed("==", mode, llvm_ir.Constant(_I64, 1))):
        undef = llvm_ir.Constant(vty, llvm_ir.Undefined)
        zmask = llvm_ir.Constant(llvm_ir.VectorType(i32, lanes), [0] * lanes)
        for j in range(CB):       # bias[m] per row: one broadcast per row of the tile
            x = builder.load(builder.gep(pbias, [llvm_ir.Constant(_I64, j)]))
            sp = builder.shuffle_vector(builder.insert_element(undef, x, llvm_ir.Constant(
                i32, 0)), undef, zmask)
            for v in range(V):
                builder.store(builder.fadd(builder.load(slots[j][v]), sp), slots[j][v])
    with builder.if_then(builder.icmp_signed("==", mode, llvm_ir.Constant(_I64, 2))):
        for v in range(V):        # bias[n] per column: one vector per vector of the tile
            bv = builder.load(builder.bitcast(builder.gep(pbias, [llvm_ir.Constant(
                _I64, v * lanes)]), vty.as_pointer()), align=8)
            for j in range(CB):
                builder.store(builder.fadd(builder.load(slots[j][v]), bv), slots[j][v])
    zero = llvm_ir.Constant(vty, [0.0] * lanes)
    mty = llvm_ir.IntType(lanes)
    ctpop = cgutils.get_or_insert_function(builder.module, llvm_ir.FunctionType(i32, [i32]),
                                           "llvm.ctpop.i32")
    count = llvm_ir.Constant(i32, 0)
    for j in range(CB):
        for v in range(V):
            val = builder.load(slots[j][v])
            builder.store(val, builder.bitcast(builder.gep(rows[j], [llvm_ir.Constant(
                _I64, v * lanes)]), vty.as_pointer()), align=8)
            bad = builder.fcmp_unordered("uno", builder.fsub(val, val), zero)
            bits = builder.zext(builder.bitcast(bad, mty), i32)
            count = builder.add(count, builder.call(ctpop, [bits]))
    return builder.zext(count, _I64)


def _rows_side_by_side(builder, ps, ls, R):
    """Load ``R`` rows of ``VW`` float64 (row ``r`` at ``ps + r*ls``) and concatenate them
    into one ``VW * 2**ceil(log2 R)``-lane value, row ``r`` at lanes ``r*VW ...`` (pairwise
    concatenation; an odd row count is padded with undefined lanes that callers never
    select)."""
    i32 = llvm_ir.IntType(32)
    rows = [builder.load(_vptr(builder, builder.gep(ps, [builder.mul(
        llvm_ir.Constant(_I64, r), ls)]), 0), align=8) for r in range(R)]
    width = _VW
    while len(rows) > 1:
        if len(rows) % 2:
            rows.append(llvm_ir.Constant(rows[0].type, llvm_ir.Undefined))
        mask = llvm_ir.Constant(llvm_ir.VectorType(i32, 2 * width), list(range(2 * width)))
        rows = [builder.shuffle_vector(rows[j], rows[j + 1], mask)
                for j in range(0, len(rows), 2)]
        width *= 2
    return rows[0]


def _block_columns(builder, ps, ls):
    """The ``VW`` columns of the ``VW x VW`` float64 block whose row ``r`` starts at
    ``ps + r*ls``, one vector each (column ``c``'s lane ``r`` = row ``r``'s element
    ``c``): ``VW`` vector loads along the rows and shuffles (a transpose; no arithmetic)."""
    i32 = llvm_ir.IntType(32)
    whole = _rows_side_by_side(builder, ps, ls, _VW)
    undef = llvm_ir.Constant(whole.type, llvm_ir.Undefined)
    return [builder.shuffle_vector(whole, undef, llvm_ir.Constant(
        llvm_ir.VectorType(i32, _VW), [r * _VW + c for r in range(_VW)])) for c in range(_VW)]


@intrinsic
def _transpose_block(typingctx, src, s_off, lds, dst, d_off, ldd):
    """``dst[d_off + c*ldd + r] = src[s_off + r*lds + c]`` for ``r, c < VW`` (one
    ``VW x VW`` block of float64 transposed: ``VW`` vector loads, shuffles, ``VW`` vector
    stores; a copy, no arithmetic).  1-D C-contiguous float64 arrays; the caller
    guarantees every address is inside its array."""
    if not (_accepts(f64=(src, dst), ints=(s_off, lds, d_off, ldd))):
        return None
    sig = types.void(src, types.int64, types.int64, dst, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        sa, so, ls, da, do, ld = args
        sd = _data(context, builder, signature.args[0], sa)
        dd = _data(context, builder, signature.args[3], da)
        pd = builder.gep(dd, [do])
        for c, col in enumerate(_block_columns(builder, builder.gep(sd, [so]), ls)):
            builder.store(col, _vptr(builder, builder.gep(pd, [builder.mul(
                llvm_ir.Constant(_I64, c), ld)]), 0), align=8)
        return context.get_dummy_value()

    return sig, codegen


def _make_interleave(R):
    """Intrinsic ``(src, s_off, lds, dst, d_off)``: ``dst[d_off + c*R + r] =
    src[s_off + r*lds + c]`` for ``r < R``, ``c < VW`` -- ``R`` rows of ``VW`` float64
    interleaved column by column into ``R*VW`` contiguous values (the packed-panel order
    of a GEMM's row block): ``R`` vector loads, one shuffle, contiguous stores; a copy, no
    arithmetic.  1-D C-contiguous float64 arrays; the caller guarantees the addresses."""

    @intrinsic
    def interleave(typingctx, src, s_off, lds, dst, d_off):
        if not (_accepts(f64=(src, dst), ints=(s_off, lds, d_off))):
            return None
        sig = types.void(src, types.int64, types.int64, dst, types.int64)

        def codegen(context, builder, signature, args):
            sa, so, ls, da, do = args
            sd = _data(context, builder, signature.args[0], sa)
            dd = _data(context, builder, signature.args[3], da)
            i32 = llvm_ir.IntType(32)
            whole = _rows_side_by_side(builder, builder.gep(sd, [so]), ls, R)
            # lane of (row r, column c) in ``whole``: r * VW + c
            undef = llvm_ir.Constant(whole.type, llvm_ir.Undefined)
            out = builder.shuffle_vector(whole, undef, llvm_ir.Constant(
                llvm_ir.VectorType(i32, R * _VW), [r * _VW + c for c in range(_VW)
                                                   for r in range(R)]))
            pd = builder.bitcast(builder.gep(dd, [do]),
                                 llvm_ir.VectorType(llvm_ir.DoubleType(), R * _VW).as_pointer())
            builder.store(out, pd, align=8)
            return context.get_dummy_value()

        return sig, codegen

    return interleave
