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
from ._jit import helper

_ABS64 = np.int64(0x7FFFFFFFFFFFFFFF)
_MANT64 = np.int64((1 << 52) - 1)
_IMPLICIT = np.int64(1 << 52)
_EXP_ALL_ONES = np.int64(0x7FF0000000000000)    # |bits| >= this: inf or NaN


@helper
def _round_one(u, mbits, bias):
    """16-bit pattern (int64, sign in bit 15) of the float64 whose bits are the int64
    ``u``.  Branch-free (selects only) so that the calling loop vectorises.  The magnitude
    (low 15 bits) is >= the inf pattern exactly when the value overflows; it is clamped to
    0x7FFF so that it never reaches the sign bit."""
    sign = (u >> 48) & 0x8000
    a = u & _ABS64
    e64 = a >> 52                                # biased float64 exponent
    shift_n = 52 - mbits
    normal = e64 >= 1024 - bias                  # x >= 2**(1 - bias): normal in the format
    # normal: keep mbits fraction bits of a; a carry out of the fraction bumps the exponent
    # subnormal (or zero): units of 2**(1 - bias - mbits) out of the full significand
    sig = (a & _MANT64) | _IMPLICIT
    sub_shift = min(shift_n + (1024 - bias) - e64, 62)
    src = a if normal else sig
    shift = shift_n if normal else sub_shift
    offset = ((1023 - bias) << mbits) if normal else 0
    t = (src >> shift) - offset
    rem = src & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    up = (rem > half) | ((rem == half) & ((t & 1) == 1))
    t = t + np.int64(up)
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
    u = flat.view(np.int64)
    over = np.int64(0)
    nonfinite = np.int64(0)
    for i in range(n):
        r = _round_one(u[i], mbits, bias)
        over |= np.int64((r & 0x7FFF) >= inf_pattern)
        nonfinite |= np.int64((u[i] & _ABS64) >= _EXP_ALL_ONES)
        out[i] = np.uint16(r)
    if nonfinite != 0:
        return np.int64(-2)
    if over != 0:
        for i in range(n):
            if (_round_one(u[i], mbits, bias) & 0x7FFF) >= inf_pattern:
                return np.int64(i)
    return np.int64(-1)


@helper
def _subnormal_bits(frac, mbits, bias, fbits, fbias):
    """Bits of ``frac * 2**(1 - bias - mbits)`` (0 < frac < 2**mbits) in a wider binary
    format with ``fbits`` fraction bits and bias ``fbias`` in which it is normal."""
    h = 0
    while (frac >> (h + 1)) != 0:
        h += 1
    expo = h + 1 - bias - mbits + fbias
    mant = (frac << (fbits - h)) & ((np.int64(1) << fbits) - 1)
    return (np.int64(expo) << fbits) | mant


@helper
def bits_to_float(bits, out, mbits, bias):
    """Decode the 1-D int64 array ``bits`` (values in [0, 65535]) into ``out``, the int64
    view of the float64 result.  Returns the first flat index holding a NaN/inf pattern,
    or -1 (such entries are written as 0)."""
    n = bits.shape[0]
    exp_mask = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    frac_mask = (np.int64(1) << mbits) - 1
    bad = np.int64(-1)
    for i in range(n):
        b = bits[i]
        sign = ((b >> 15) & 1) << 63
        expo = (b & exp_mask) >> mbits
        frac = b & frac_mask
        if expo == 0:
            if frac == 0:
                out[i] = sign
            else:
                out[i] = sign | _subnormal_bits(frac, mbits, bias, 52, 1023)
        elif (b & exp_mask) == exp_mask:
            if bad < 0:
                bad = np.int64(i)
            out[i] = 0
        else:
            out[i] = sign | ((expo - bias + 1023) << 52) | (frac << (52 - mbits))
    return bad


@helper
def round_to_float32(flat, out, mbits, bias, stats):
    """Round the 1-D float64 array ``flat`` (finite values) to the 16-bit format and write
    the (exactly representable) float32 values into ``out``, the int32 view of a float32
    array.  Returns -2 if some entry is NaN/inf, else the first flat index whose value
    overflows to +-inf, else -1.  ``stats`` (int64[2]) receives the largest magnitude
    pattern (``r & 0x7FFF``) and the smallest non-zero one (0x7FFF if all are zero):
    magnitudes order like their patterns."""
    n = flat.shape[0]
    mag_max = np.int64(0)
    mag_min = np.int64(0x7FFF)
    inf_pattern = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    u = flat.view(np.int64)
    over = np.int64(0)
    nonfinite = np.int64(0)
    if mbits == 7 and bias == 127:            # BF16 is the upper half of float32
        for i in range(n):
            r = _round_one(u[i], mbits, bias)
            over |= np.int64((r & 0x7FFF) >= inf_pattern)
            nonfinite |= np.int64((u[i] & _ABS64) >= _EXP_ALL_ONES)
            mag = r & 0x7FFF
            mag_max = max(mag_max, mag)
            mag_min = min(mag_min, mag if mag != 0 else np.int64(0x7FFF))
            out[i] = np.int32(r << 16)
    else:
        frac_mask = (np.int64(1) << mbits) - 1
        for i in range(n):
            r = _round_one(u[i], mbits, bias)
            over |= np.int64((r & 0x7FFF) >= inf_pattern)
            nonfinite |= np.int64((u[i] & _ABS64) >= _EXP_ALL_ONES)
            mag = r & 0x7FFF
            mag_max = max(mag_max, mag)
            mag_min = min(mag_min, mag if mag != 0 else np.int64(0x7FFF))
            sign = ((r >> 15) & 1) << 31
            expo = (r & 0x7FFF) >> mbits
            frac = r & frac_mask
            if expo == 0:
                if frac == 0:
                    f = sign
                else:
                    f = sign | _subnormal_bits(frac, mbits, bias, 23, 127)
            else:
                f = sign | ((expo - bias + 127) << 23) | (frac << (23 - mbits))
            out[i] = np.int32(f)
    stats[0] = mag_max
    stats[1] = mag_min
    if nonfinite != 0:
        return np.int64(-2)
    if over != 0:
        for i in range(n):
            if (_round_one(u[i], mbits, bias) & 0x7FFF) >= inf_pattern:
                return np.int64(i)
    return np.int64(-1)
