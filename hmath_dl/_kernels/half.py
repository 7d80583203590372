"""Bit-level FP16/BF16 rounding and decoding kernels.

Formats are described by ``(mbits, bias)``: FP16 = (10, 15), BF16 = (7, 127); both have a
sign bit, ``15 - mbits`` exponent bits and an all-ones exponent for inf/NaN.

Rounding works on ``float64.view(uint64)`` with ONE round-half-to-even straight to the
16-bit format; subnormal results shift the rounding position.  The kernels never raise:
overflow (a finite input rounding to +-inf) and NaN/inf patterns are reported as the
smallest offending flat index (``-1`` when there is none).  Every entry is independent,
so nothing depends on the thread count; the memory-bound whole-array kernels
(:func:`round_bits_chunks`, :func:`round_values_chunks`, :func:`decode_chunks`,
:func:`convert_bf16_chunks`, :func:`convert_fp16_chunks`) split large arrays into chunks
over the threads (a small call runs the serial twin).  Decoding converts where that is
exact and the target can (BF16 everywhere, FP16 with F16C: the machine policy decides)
and looks every pattern up in a table elsewhere: the same values either way.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from numba import prange

from ._jit import helper, inlined, kernel
from .libm import _wide
from .status import NO_INDEX, NONFINITE_SOMEWHERE

_ABS64 = np.int64(0x7FFFFFFFFFFFFFFF)
_EXP_ALL_ONES = np.int64(0x7FF0000000000000)    # |bits| >= this: inf or NaN


@intrinsic
def _as_float64(typingctx, bits):
    """Reinterpret the int64 ``bits`` as a float64 (a register bitcast)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@intrinsic
def _as_int64(typingctx, x):
    """The IEEE bits of the float64 ``x`` as an int64 (a register bitcast)."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@helper
def _rounding_constants(mbits, bias):
    """(magic, inv_unit, top) for :func:`_round_one`: 2**(emin - mbits + 52),
    2**(mbits - emin) and 2**emin with emin = 1 - bias (exact powers of two)."""
    emin = 1 - bias
    magic = _as_float64(np.int64(emin - mbits + 52 + 1023) << 52)
    inv_unit = _as_float64(np.int64(mbits - emin + 1023) << 52)
    top = _as_float64(np.int64(emin + 1023) << 52)
    return magic, inv_unit, top


@helper
def _round_one(x, u, mbits, bias, magic, top):
    """16-bit pattern (int64, sign in bit 15) of the float64 ``x`` whose bits are the int64
    ``u``.  Branch-free (selects only) so that the calling loop vectorises.  The magnitude
    (low 15 bits) is >= the inf pattern exactly when the value overflows; it is clamped to
    0x7FFF so that it never reaches the sign bit.

    * Normal results (|x| >= 2**emin, emin = 1 - bias): round-half-to-even of the float64
      bits at fraction bit ``mbits`` (add ``half - 1 + lsb``, shift); a carry out of the
      fraction bumps the exponent, and re-biasing gives the 16-bit pattern.
    * Subnormal results: ``|x| + magic`` with ``magic = 2**(emin - mbits + 52)``, whose
      ulp is the subnormal unit ``2**(emin - mbits)``: the float64 addition rounds |x|
      once, half to even, to a multiple of the unit (``top = 2**emin`` bounds |x| first,
      so the sum stays below ``2 * magic``), and the sum's bits minus magic's bits are
      the count of units, i.e. the pattern (integer arithmetic only: the count is never
      converted from a float, which AVX2 cannot do in vectors).
    """
    sign = (u >> 48) & 0x8000
    a = u & _ABS64
    shift = 52 - mbits
    lsb = (a >> shift) & 1
    t_normal = ((a + ((np.int64(1) << (shift - 1)) - 1) + lsb) >> shift) \
        - ((1023 - bias) << mbits)
    t_sub = _as_int64(min(abs(x), top) + magic) - _as_int64(magic)
    t = t_normal if (a >> 52) >= 1024 - bias else t_sub
    t = min(t, 0x7FFF)
    return sign | t


@helper
def round_to_bits(flat, out, mbits, bias):
    """Round the 1-D float64 array ``flat`` (finite values) into ``out`` (uint16).
    Returns NONFINITE_SOMEWHERE (-2) if some entry is NaN/inf, else the first flat index
    whose value overflows to +-inf, else NO_INDEX (-1) (:mod:`.status`).

    Serial on purpose: the loop vectorises and is memory-bound (about 1-2 ns per entry);
    a parallel launch costs more than it saves on the 2-core target."""
    n = flat.shape[0]
    inf_pattern = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    magic, _, top = _rounding_constants(mbits, bias)
    u = flat.view(np.int64)
    over = np.int64(0)
    nonfinite = np.int64(0)
    for i in range(n):
        r = _round_one(flat[i], u[i], mbits, bias, magic, top)
        over |= np.int64((r & 0x7FFF) >= inf_pattern)
        nonfinite |= np.int64((u[i] & _ABS64) >= _EXP_ALL_ONES)
        out[i] = np.uint16(r)
    if nonfinite != 0:
        return np.int64(NONFINITE_SOMEWHERE)
    if over != 0:
        for i in range(n):
            if (_round_one(flat[i], u[i], mbits, bias, magic, top) & 0x7FFF) >= inf_pattern:
                return np.int64(i)
    return np.int64(NO_INDEX)


@helper
def _decode_one(r, mbits, bias, sub_scale):
    """float64 value of the finite 16-bit pattern ``r`` (int64); ``sub_scale`` is
    ``2.0**(1 - bias - mbits)``, the value of the smallest subnormal.  Branch-free."""
    negative = ((r >> 15) & 1) == 1
    expo = (r & 0x7FFF) >> mbits
    frac = r & ((np.int64(1) << mbits) - 1)
    normal_bits = ((expo - bias + 1023) << 52) | (frac << (52 - mbits))
    magnitude = _as_float64(normal_bits) if expo != 0 else np.float64(frac) * sub_scale
    return -magnitude if negative else magnitude


@helper
def bits_to_float(bits, out, mbits, bias):
    """Decode the 1-D int64 array ``bits`` (values in [0, 65535]) into the float64 array
    ``out``.  Returns the first flat index holding a NaN/inf pattern, or -1 (such entries
    are written as 0)."""
    n = bits.shape[0]
    exp_mask = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    sub_scale = _as_float64(np.int64(1023 + 1 - bias - mbits) << 52)
    bad = np.int64(0)
    for i in range(n):
        b = bits[i]
        special = (b & exp_mask) == exp_mask
        bad |= np.int64(special)
        out[i] = 0.0 if special else _decode_one(b, mbits, bias, sub_scale)
    if bad != 0:
        for i in range(n):
            if (bits[i] & exp_mask) == exp_mask:
                return np.int64(i)
    return np.int64(NO_INDEX)


@helper
def round_to_float(flat, out, mbits, bias, stats):
    """Round the 1-D float64 array ``flat`` to the 16-bit format and write the values into
    ``out`` (float64, or float32: every 16-bit value is exactly a float32).  Returns -2 if
    some entry is NaN/inf, else the first flat index whose value overflows to +-inf, else
    -1.  ``stats`` (int64[2]) receives the largest magnitude pattern (``r & 0x7FFF``) and
    the smallest non-zero one (0x7FFF if all are zero): magnitudes order like patterns."""
    n = flat.shape[0]
    inf_pattern = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    sub_scale = _as_float64(np.int64(1023 + 1 - bias - mbits) << 52)
    magic, _, top = _rounding_constants(mbits, bias)
    u = flat.view(np.int64)
    over = np.int64(0)
    nonfinite = np.int64(0)
    mag_max = np.int64(0)
    mag_min = np.int64(0x7FFF)
    for i in range(n):
        r = _round_one(flat[i], u[i], mbits, bias, magic, top)
        mag = r & 0x7FFF
        over |= np.int64(mag >= inf_pattern)
        nonfinite |= np.int64((u[i] & _ABS64) >= _EXP_ALL_ONES)
        mag_max = max(mag_max, mag)
        mag_min = min(mag_min, mag if mag != 0 else np.int64(0x7FFF))
        r = min(r, (r & 0x8000) | (inf_pattern - 1))      # keep overflowed entries finite
        out[i] = _decode_one(r, mbits, bias, sub_scale)
    stats[0] = mag_max
    stats[1] = mag_min
    if nonfinite != 0:
        return np.int64(NONFINITE_SOMEWHERE)
    if over != 0:
        for i in range(n):
            if (_round_one(flat[i], u[i], mbits, bias, magic, top) & 0x7FFF) >= inf_pattern:
                return np.int64(i)
    return np.int64(NO_INDEX)


# --------------------------------------------------------------------------- whole arrays
# The value-level rounding (the same values as _round_one, without the 16-bit pattern),
# chunked for threads.  A chunk's verdicts are integers folded with max/or, so any split
# gives the same answer; the first offending index is found by a serial rescan (rare).
CHUNK = 1 << 15
_NONE = np.int64(0x7FFFFFFFFFFFFFFF)     # "no non-zero magnitude" (above every float64)


_SIGN64 = np.int64(-0x8000000000000000)   # the float64 sign bit


@inlined
def round_run(x, u, dst, d0, n, mbits, bias, st):
    """Round ``x[0:n]`` (float64, bits ``u``) to the format ``(mbits, bias)`` and write the
    values into ``dst[d0:d0+n]`` (float64 or float32: every 16-bit value is both); fold
    into ``st`` (int64[3]) the raw statistics that :func:`finish_stats` turns into the
    rounded ones: ``st[1]`` the smallest input magnitude (float64 bits: for non-negative
    floats the bits order like the values) among the entries that round to non-zero
    (:data:`_NONE` if none), ``st[2]`` the largest input magnitude (bits); ``st[0]`` is
    not touched.  Rounding is monotone, so the rounded extremes are the extremes' roundings.

    The value is one float64 addition that rounds half to even at the format's last
    place: for ``|x|`` with exponent e (``2**e`` is ``|x|``'s bits with the fraction
    cleared), ``c = max(2**e, 2**emin) * 2**(52 - mbits)`` (emin = 1 - bias) has an ulp of
    ``2**(e - mbits)`` -- the format's ulp at ``|x|``, or its subnormal unit below
    ``2**emin`` -- and ``|x| < 2c``, so ``(|x| + c) - c`` is ``|x|`` rounded once to the
    format (the subtraction is exact); the sign is put back by its bit.  The same value
    as :func:`_round_one`'s pattern decodes to.  Branch-free with integer reductions only,
    so the loop vectorises.  Entries that are NaN/inf or round to +-inf get meaningless
    values: :func:`run_verdict` reports them."""
    top = _as_float64(np.int64(1024 - bias) << 52)          # 2**emin
    scale = _as_float64(np.int64(1075 - mbits) << 52)       # 2**(52 - mbits)
    half_unit = np.int64(1023 - bias - mbits) << 52         # bits of 2**(emin - mbits - 1)
    mn = st[1]
    mxa = st[2]
    # unsigned indices: with a signed ``d0 + i`` Numba tests every index for a negative
    # value to wrap, which kept this loop scalar
    ud0 = np.uint64(d0)
    for i in range(np.uint64(n)):
        ui = u[i]
        a = ui & _ABS64
        c = max(_as_float64(a & _EXP_ALL_ONES), top) * scale
        s = (_as_float64(a) + c) - c
        dst[ud0 + i] = _as_float64(_as_int64(s) | (ui & _SIGN64))
        mxa = max(mxa, a)
        # exactly half the subnormal unit rounds to 0 (even); anything above it does not
        mn = min(mn, a if a > half_unit else _NONE)
    st[1] = mn
    st[2] = mxa


@helper
def _rounded_magnitude(a, mbits, bias):
    """float64 bits of the magnitude with bits ``a`` (finite, below the overflow
    threshold) rounded to the format: :func:`round_run`'s arithmetic on one value."""
    top = _as_float64(np.int64(1024 - bias) << 52)
    scale = _as_float64(np.int64(1075 - mbits) << 52)
    c = max(_as_float64(a & _EXP_ALL_ONES), top) * scale
    return _as_int64((_as_float64(a) + c) - c)


@helper
def finish_stats(st, mbits, bias):
    """Turn :func:`round_run`'s folded raw statistics into the rounded ones, in place:
    ``st[0]`` the largest rounded magnitude, ``st[1]`` the smallest non-zero one (float64
    bits; :data:`_NONE` if none), ``st[2]`` (the largest input magnitude) unchanged.  A
    largest input at or above the overflow threshold ``2**(bias+1) - 2**(bias-mbits-1)``
    (the largest finite value plus half its ulp, which rounds up: that value's last bit
    is odd) gives ``st[0] = 2**(bias+1)``, which :func:`run_verdict` reports."""
    over = (np.int64(bias + 1024) << 52) - (np.int64(1) << (51 - mbits))
    if st[2] >= over:
        st[0] = np.int64(bias + 1 + 1023) << 52
    else:
        st[0] = _rounded_magnitude(st[2], mbits, bias)
    if st[1] != _NONE:
        st[1] = _rounded_magnitude(st[1], mbits, bias)


@helper
def run_verdict(st, bias):
    """For the finished ``st`` of :func:`round_run` (:func:`finish_stats`): -2 if an entry
    is NaN/inf (its magnitude bits reach +inf's), else 1 if one rounds to +-inf (a rounded
    magnitude at or above 2**(bias + 1): the format's largest finite value is below it),
    else 0."""
    if st[2] >= _EXP_ALL_ONES:
        return np.int64(NONFINITE_SOMEWHERE)
    return np.int64(st[0] >= (np.int64(bias + 1 + 1023) << 52))


@helper
def _first_overflow(flat, mbits, bias):
    """The first flat index whose finite value rounds to +-inf (-1 if none)."""
    inf_pattern = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    magic, _, top = _rounding_constants(mbits, bias)
    u = flat.view(np.int64)
    for i in range(flat.shape[0]):
        if (_round_one(flat[i], u[i], mbits, bias, magic, top) & 0x7FFF) >= inf_pattern:
            return np.int64(i)
    return np.int64(NO_INDEX)


@kernel
def round_values_chunks(flat, out, mbits, bias):
    """:func:`round_to_float`'s values (``out`` float64 or float32) and status (-2 NaN/inf
    present, else the first index that overflows, else -1), chunk-parallel; overflowing
    entries get meaningless values (the caller raises)."""
    n = flat.shape[0]
    u = flat.view(np.int64)
    nch = (n + CHUNK - 1) // CHUNK
    verdict = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        _wide()
        st = np.zeros(3, dtype=np.int64)
        st[1] = _NONE
        i0 = c * CHUNK
        m = min(CHUNK, n - i0)
        round_run(flat[i0:], u[i0:], out, i0, m, mbits, bias, st)
        finish_stats(st, mbits, bias)
        verdict[c] = run_verdict(st, bias)
    worst = np.int64(0)
    for c in range(nch):
        if verdict[c] == NONFINITE_SOMEWHERE:
            return np.int64(NONFINITE_SOMEWHERE)
        worst = max(worst, verdict[c])
    return _first_overflow(flat, mbits, bias) if worst > 0 else np.int64(NO_INDEX)


@helper
def _bits_run(x, u, out, mbits, bias):
    """:func:`round_to_bits`'s loop over one chunk (slices starting at 0, so the loop
    vectorises): returns 2 * (NaN/inf present) + (some entry overflows).

    One integer max per entry finds both: a NaN/inf input's magnitude bits round past
    every finite pattern, so its clamped magnitude is 0x7FFF, at least the inf pattern;
    the chunk is rescanned for NaN/inf only when the max reaches it (rare)."""
    _wide()
    inf_pattern = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    magic, _, top = _rounding_constants(mbits, bias)
    most = np.int64(0)
    n = np.uint64(x.shape[0])
    for i in range(n):
        r = _round_one(x[i], u[i], mbits, bias, magic, top)
        most = max(most, r & 0x7FFF)
        out[i] = np.uint16(r)
    if most < inf_pattern:
        return np.int64(0)
    nonfinite = np.int64(0)
    for i in range(n):
        nonfinite |= np.int64((u[i] & _ABS64) >= _EXP_ALL_ONES)
    return 2 * nonfinite + 1


@kernel
def round_bits_chunks(flat, out, mbits, bias):
    """:func:`round_to_bits` (uint16 patterns into ``out``, the same status), chunk-
    parallel."""
    n = flat.shape[0]
    u = flat.view(np.int64)
    nch = (n + CHUNK - 1) // CHUNK
    flags = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        i0 = c * CHUNK
        i1 = min(n, i0 + CHUNK)
        flags[c] = _bits_run(flat[i0:i1], u[i0:i1], out[i0:i1], mbits, bias)
    worst = np.int64(0)
    for c in range(nch):
        worst |= flags[c]
    if worst >= 2:
        return np.int64(NONFINITE_SOMEWHERE)
    return _first_overflow(flat, mbits, bias) if worst == 1 else np.int64(NO_INDEX)


@helper
def _decode_run(bits, out, mbits, bias):
    """Decode the patterns ``bits`` into ``out`` (the arithmetic behind
    :func:`decode_table`): returns 1 if a NaN/inf pattern is present (its entry is
    written as 0), else 0."""
    exp_mask = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    fmask = np.int64((1 << mbits) - 1)
    implicit = _as_float64(np.int64(1 - bias + 1023) << 52)       # 2**emin
    bad = np.int64(0)
    _wide()
    for i in range(np.uint64(bits.shape[0])):
        b = np.int64(bits[i])
        special = (b & exp_mask) == exp_mask
        bad |= np.int64(special)
        expo = (b & 0x7FFF) >> mbits
        v = _as_float64(((max(expo, 1) - bias + 1023) << 52) | ((b & fmask) << (52 - mbits)))
        mag = v - implicit if expo == 0 else v
        val = -mag if (b & 0x8000) != 0 else mag
        out[i] = 0.0 if special else val
    return bad


@helper
def _lookup_run(bits, out, table):
    """``out[i] = table[bits[i]]`` over one chunk (slices starting at 0); returns the
    number of NaN entries written (the table holds NaN exactly for the NaN/inf
    patterns)."""
    nan = np.int64(0)
    for i in range(np.uint64(bits.shape[0])):
        v = table[np.uint64(bits[i])]
        nan += np.int64(v != v)
        out[i] = v
    return nan


@kernel
def decode_chunks(bits, out, table, mbits):
    """:func:`bits_to_float` (``bits`` uint16 or int64 patterns in [0, 65535]) by lookup,
    chunk-parallel: ``table`` (float64[65536], :func:`decode_table`) holds every
    pattern's value, NaN for the NaN/inf patterns.  Returns the first flat index holding
    a NaN/inf pattern (its entry is written as NaN), or NO_INDEX (-1).

    A lookup per entry runs at the same speed on every target (on AVX2 a 64-bit-lane
    decode took 1.7x as long: 68 against 40 us for 2**17 entries on one core), and it
    is exactly the decode: the table is its output for all 65536 patterns.  Where the
    target converts in hardware, :func:`convert_bf16_chunks` / :func:`convert_fp16_chunks`
    give the same values faster."""
    n = bits.shape[0]
    nch = (n + CHUNK - 1) // CHUNK
    flags = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        i0 = c * CHUNK
        i1 = min(n, i0 + CHUNK)
        flags[c] = _lookup_run(bits[i0:i1], out[i0:i1], table)
    return _first_special(bits, flags, mbits)


@helper
def _first_special(bits, flags, mbits):
    """The first flat index of a NaN/inf pattern (exponent field all ones) in the chunks
    whose ``flags`` are non-zero, or NO_INDEX."""
    exp_mask = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    n = bits.shape[0]
    for c in range(flags.shape[0]):
        if flags[c] != 0:
            for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
                if (np.int64(bits[i]) & exp_mask) == exp_mask:
                    return np.int64(i)
    return np.int64(NO_INDEX)


# --------------------------------------------------------------------------- conversions
# A BF16 pattern is the top half of the float32 of the same value, and float32 -> float64
# is exact (subnormals included: nothing here sets DAZ/FTZ), so ``pattern << 16`` read as
# a float32 and widened is the value -- plain integer and float LLVM operations, valid on
# every target.  An FP16 pattern widened by ``fpext half`` is exact too; on x86 that is
# F16C's vcvtph2ps (the machine policy says whether the target has it; elsewhere LLVM
# would call a runtime helper that Numba does not link, so the lookup runs).  Both give
# the decode's values bit for bit (every value is exact; -0.0 stays -0.0); NaN/inf
# patterns are counted from their exponent field, and their entries (whatever the
# conversion wrote) are reported by the facade.
def _int_to(builder, v, width):
    t = ir.IntType(width)
    if v.type.width < width:
        return builder.zext(v, t)
    return builder.trunc(v, t) if v.type.width > width else v


@intrinsic
def _bf16_value(typingctx, b):
    """The float64 value of the BF16 pattern ``b`` (an integer in [0, 65535])."""
    if not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        w = builder.shl(_int_to(builder, args[0], 32), ir.Constant(ir.IntType(32), 16))
        return builder.fpext(builder.bitcast(w, ir.FloatType()), ir.DoubleType())
    return types.float64(b), codegen


@intrinsic
def _fp16_value(typingctx, b):
    """The float64 value of the FP16 pattern ``b`` (an integer in [0, 65535]); only where
    the target converts half precision in hardware (:attr:`._cpu.Machine.f16c`)."""
    if not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        h = builder.bitcast(_int_to(builder, args[0], 16), ir.HalfType())
        return builder.fpext(h, ir.DoubleType())
    return types.float64(b), codegen


@helper
def _bf16_run(bits, out):
    """``out[i]`` = the BF16 pattern ``bits[i]``'s value; returns the number of NaN/inf
    patterns (exponent field 0x7F80)."""
    bad = np.int64(0)
    _wide()
    for i in range(np.uint64(bits.shape[0])):
        b = bits[i]
        bad += np.int64((np.int64(b) & 0x7F80) == 0x7F80)
        out[i] = _bf16_value(b)
    return bad


@helper
def _fp16_run(bits, out):
    """``out[i]`` = the FP16 pattern ``bits[i]``'s value; returns the number of NaN/inf
    patterns (exponent field 0x7C00)."""
    bad = np.int64(0)
    _wide()
    for i in range(np.uint64(bits.shape[0])):
        b = bits[i]
        bad += np.int64((np.int64(b) & 0x7C00) == 0x7C00)
        out[i] = _fp16_value(b)
    return bad


@kernel
def convert_bf16_chunks(bits, out):
    """:func:`decode_chunks` for BF16 (``mbits`` 7) by conversion, without a table: the
    same values, the same report (first NaN/inf index or NO_INDEX)."""
    n = bits.shape[0]
    nch = (n + CHUNK - 1) // CHUNK
    flags = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        i0 = c * CHUNK
        i1 = min(n, i0 + CHUNK)
        flags[c] = _bf16_run(bits[i0:i1], out[i0:i1])
    return _first_special(bits, flags, np.int64(7))   # not a literal: one compile


@kernel
def convert_fp16_chunks(bits, out):
    """:func:`decode_chunks` for FP16 (``mbits`` 10) by hardware conversion
    (:attr:`._cpu.Machine.f16c` targets only): the same values, the same report."""
    n = bits.shape[0]
    nch = (n + CHUNK - 1) // CHUNK
    flags = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        i0 = c * CHUNK
        i1 = min(n, i0 + CHUNK)
        flags[c] = _fp16_run(bits[i0:i1], out[i0:i1])
    return _first_special(bits, flags, np.int64(10))   # not a literal: one compile


def decode_table(mbits, bias):
    """The value of every 16-bit pattern of the format ``(mbits, bias)`` (float64[65536],
    read-only), NaN for the NaN/inf patterns: :func:`_decode_run`'s branch-free decode
    (the exponent field taken as at least 1 and, for a subnormal/zero pattern, ``2**emin``
    subtracted again -- ``2**emin * (1 + f/2**m) - 2**emin`` is exact (Sterbenz), ``+0``
    for ``f = 0``, the sign set after: -0.0 stays -0.0) run once on all patterns."""
    patterns = np.arange(1 << 16, dtype=np.uint16)
    table = np.empty(1 << 16, dtype=np.float64)
    _decode_run(patterns, table, mbits, bias)
    exp_mask = ((1 << (15 - mbits)) - 1) << mbits
    table[(patterns & exp_mask) == exp_mask] = np.nan
    table.flags.writeable = False
    return table
