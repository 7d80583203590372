"""Bit-level FP16/BF16 rounding and decoding kernels.

Formats are described by ``(mbits, bias)``: FP16 = (10, 15), BF16 = (7, 127); both have a
sign bit, ``15 - mbits`` exponent bits and an all-ones exponent for inf/NaN.

Rounding works on ``float64.view(uint64)`` with ONE round-half-to-even straight to the
16-bit format; subnormal results shift the rounding position.  The kernels never raise:
overflow (a finite input rounding to +-inf) and NaN/inf patterns are reported as the
smallest offending flat index (``-1`` when there is none).  The kernels are serial (they
vectorise and are memory-bound), so nothing depends on the thread count.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._jit import helper

_ABS64 = np.int64(0x7FFFFFFFFFFFFFFF)
_EXP_ALL_ONES = np.int64(0x7FF0000000000000)    # |bits| >= this: inf or NaN


@intrinsic
def _as_float64(typingctx, bits):
    """Reinterpret the int64 ``bits`` as a float64 (a register bitcast)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

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
def _round_one(x, u, mbits, bias, magic, inv_unit, top):
    """16-bit pattern (int64, sign in bit 15) of the float64 ``x`` whose bits are the int64
    ``u``.  Branch-free (selects only) so that the calling loop vectorises.  The magnitude
    (low 15 bits) is >= the inf pattern exactly when the value overflows; it is clamped to
    0x7FFF so that it never reaches the sign bit.

    * Normal results (|x| >= 2**emin, emin = 1 - bias): round-half-to-even of the float64
      bits at fraction bit ``mbits`` (add ``half - 1 + lsb``, shift); a carry out of the
      fraction bumps the exponent, and re-biasing gives the 16-bit pattern.
    * Subnormal results: ``(|x| + magic) - magic`` with ``magic = 2**(emin - mbits + 52)``,
      whose ulp is the subnormal unit ``2**(emin - mbits)``: the float64 addition rounds
      |x| once, half to even, to a multiple of the unit (``top = 2**emin`` bounds |x|
      first, so the count stays in range); the count of units (``y * inv_unit``, exact)
      is the pattern.
    """
    sign = (u >> 48) & 0x8000
    a = u & _ABS64
    shift = 52 - mbits
    lsb = (a >> shift) & 1
    t_normal = ((a + ((np.int64(1) << (shift - 1)) - 1) + lsb) >> shift) \
        - ((1023 - bias) << mbits)
    y = (min(abs(x), top) + magic) - magic
    t_sub = np.int64(y * inv_unit)                    # exact: y is a multiple of the unit
    t = t_normal if (a >> 52) >= 1024 - bias else t_sub
    t = min(t, 0x7FFF)
    return sign | t


@helper
def round_to_bits(flat, out, mbits, bias):
    """Round the 1-D float64 array ``flat`` (finite values) into ``out`` (uint16).
    Returns -2 if some entry is NaN/inf, else the first flat index whose value overflows
    to +-inf, else -1.

    Serial on purpose: the loop vectorises and is memory-bound (about 1-2 ns per entry);
    a parallel launch costs more than it saves on the 2-core target."""
    n = flat.shape[0]
    inf_pattern = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    magic, inv_unit, top = _rounding_constants(mbits, bias)
    u = flat.view(np.int64)
    over = np.int64(0)
    nonfinite = np.int64(0)
    for i in range(n):
        r = _round_one(flat[i], u[i], mbits, bias, magic, inv_unit, top)
        over |= np.int64((r & 0x7FFF) >= inf_pattern)
        nonfinite |= np.int64((u[i] & _ABS64) >= _EXP_ALL_ONES)
        out[i] = np.uint16(r)
    if nonfinite != 0:
        return np.int64(-2)
    if over != 0:
        for i in range(n):
            if (_round_one(flat[i], u[i], mbits, bias, magic, inv_unit, top) & 0x7FFF) >= inf_pattern:
                return np.int64(i)
    return np.int64(-1)


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
    return np.int64(-1)


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
    magic, inv_unit, top = _rounding_constants(mbits, bias)
    u = flat.view(np.int64)
    over = np.int64(0)
    nonfinite = np.int64(0)
    mag_max = np.int64(0)
    mag_min = np.int64(0x7FFF)
    for i in range(n):
        r = _round_one(flat[i], u[i], mbits, bias, magic, inv_unit, top)
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
        return np.int64(-2)
    if over != 0:
        for i in range(n):
            if (_round_one(flat[i], u[i], mbits, bias, magic, inv_unit, top) & 0x7FFF) >= inf_pattern:
                return np.int64(i)
    return np.int64(-1)
