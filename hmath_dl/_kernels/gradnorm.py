"""Overflow-safe Euclidean norm pieces (the gradient-norm kernels).

The facade combines them: ``amax = max |x|`` over every array (:func:`max_abs_bits`, on
the bit patterns: non-negative doubles order like their bits, and NaN/inf show up as
``>= 0x7FF0000000000000``); with ``amax = f * 2**e`` (``0.5 <= f < 1``) every entry is
scaled by the exact power of two ``2**-e`` (applied as two factors ``s1 * s2`` so that
neither constant over- or underflows), squared and summed (:func:`scaled_sum_squares`); the
norm is ``sqrt(sum) * 2**e``.

Fixed summation order: entry ``i`` of an array goes to lane ``i % 8``; each lane sums
sequentially; lanes are combined as ``((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))``.
Serial kernels (memory-bound; they vectorise), so nothing depends on the thread count.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._jit import helper

_ABS64 = np.int64(0x7FFFFFFFFFFFFFFF)


@helper
def max_abs_bits(flat):
    """``max(bits(|x|))`` over the 1-D float64 array ``flat`` (0 when empty)."""
    u = flat.view(np.int64)
    m = np.int64(0)
    for i in range(u.shape[0]):
        m = max(m, u[i] & _ABS64)
    return m


@intrinsic
def _lanes_sum_squares(typingctx, flat, full, s1, s2, lanes):
    """``lanes[l] = sum over i < full, i % 8 == l, in order, of ((flat[i] * s1) * s2)**2``
    with one <8 x double> accumulator (plain fmul/fadd: no reassociation, no FMA)."""
    sig = types.void(flat, types.intp, types.float64, types.float64, lanes)

    def codegen(context, builder, signature, args):
        flat_v, full_v, s1_v, s2_v, lanes_v = args
        f64 = ir.DoubleType()
        vec = ir.VectorType(f64, 8)
        i64 = ir.IntType(64)
        i32 = ir.IntType(32)
        src = context.make_array(signature.args[0])(context, builder, flat_v).data
        dst = context.make_array(signature.args[4])(context, builder, lanes_v).data
        undef = ir.Constant(vec, ir.Undefined)
        mask0 = ir.Constant(ir.VectorType(i32, 8), [0] * 8)

        def splat(x):
            return builder.shuffle_vector(builder.insert_element(undef, x, ir.Constant(i32, 0)),
                                          undef, mask0)

        v1, v2 = splat(s1_v), splat(s2_v)
        zero = ir.Constant(vec, [0.0] * 8)
        entry = builder.basic_block
        loop = builder.append_basic_block("ss_loop")
        done = builder.append_basic_block("ss_done")
        builder.cbranch(builder.icmp_signed(">", full_v, ir.Constant(i64, 0)), loop, done)
        builder.position_at_end(loop)
        i_phi = builder.phi(i64)
        acc = builder.phi(vec)
        i_phi.add_incoming(ir.Constant(i64, 0), entry)
        acc.add_incoming(zero, entry)
        ptr = builder.bitcast(builder.gep(src, [i_phi]), vec.as_pointer())
        x = builder.load(ptr, align=8)
        t = builder.fmul(builder.fmul(x, v1), v2)
        new_acc = builder.fadd(acc, builder.fmul(t, t))
        i_next = builder.add(i_phi, ir.Constant(i64, 8))
        i_phi.add_incoming(i_next, loop)
        acc.add_incoming(new_acc, loop)
        builder.cbranch(builder.icmp_signed("<", i_next, full_v), loop, done)
        builder.position_at_end(done)
        result = builder.phi(vec)
        result.add_incoming(zero, entry)
        result.add_incoming(new_acc, loop)
        builder.store(result, builder.bitcast(dst, vec.as_pointer()), align=8)
        return context.get_dummy_value()

    return sig, codegen


@helper
def scaled_sum_squares(flat, s1, s2):
    """``sum((x * s1 * s2)**2)`` over the 1-D C-contiguous float64 array ``flat`` in the
    fixed 8-lane order of the module docstring."""
    n = flat.shape[0]
    full = n - n % 8
    lanes = np.zeros(8, dtype=np.float64)
    _lanes_sum_squares(flat, full, s1, s2, lanes)
    for i in range(full, n):
        t = (flat[i] * s1) * s2
        lanes[i - full] += t * t
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + \
        ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
