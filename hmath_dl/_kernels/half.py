"""Bit-level FP16/BF16 rounding and decoding kernels.

Formats are described by ``(mbits, bias)``: FP16 = (10, 15), BF16 = (7, 127); both have a
sign bit, ``15 - mbits`` exponent bits and an all-ones exponent for inf/NaN.

Rounding works on ``float64.view(uint64)`` with ONE round-half-to-even straight to the
16-bit format; subnormal results shift the rounding position.  The kernels never raise:
overflow (a finite input rounding to +-inf) and NaN/inf patterns are reported as the
smallest offending flat index (``-1`` when there is none), found per fixed chunk and then
combined in order, so the answer does not depend on the thread count.
"""

import numpy as np
from numba import prange

from ._jit import helper, kernel

_CHUNK = 8192

_MANT64 = np.uint64((1 << 52) - 1)
_ABS64 = np.uint64((1 << 63) - 1)


@helper
def _round_one(u, mbits, bias):
    """16-bit pattern (as int64, sign in bit 15) of the float64 with bits ``u``.
    The magnitude part is >= the inf pattern exactly when the value overflows."""
    sign = np.int64(u >> np.uint64(63)) << 15
    a = u & _ABS64
    e64 = np.int64(a >> np.uint64(52))          # biased float64 exponent
    if e64 == 0:                                 # zero or float64 subnormal: far below
        return sign                              # half the smallest 16-bit subnormal
    sig = np.int64(a & _MANT64) | (np.int64(1) << 52)
    e = e64 - 1023                               # unbiased exponent of x
    emin = 1 - bias                              # smallest normal exponent of the format
    if e >= emin:
        # normal: keep mbits fraction bits; a carry out of the fraction bumps the exponent
        shift = 52 - mbits
        t = ((e + bias) << mbits) + ((sig >> shift) - (np.int64(1) << mbits))
    else:
        # subnormal result: units of 2**(emin - mbits)
        shift = 52 - mbits + (emin - e)
        if shift > 60:
            return sign
        t = sig >> shift
    rem = sig & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    if rem > half or (rem == half and (t & 1) == 1):
        t += 1
    if t > 0x7FFF:                               # far beyond the format: keep the magnitude
        t = 0x7FFF                               # in 15 bits (it is >= inf, i.e. overflow)
    return sign | t


@kernel
def round_to_bits(flat, out, mbits, bias):
    """Round the 1-D float64 array ``flat`` (finite values) into ``out`` (uint16).
    Returns the first flat index whose value overflows to +-inf, or -1."""
    n = flat.shape[0]
    inf_pattern = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    u = flat.view(np.uint64)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    first_bad = np.full(nchunks, -1, dtype=np.int64)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        bad = np.int64(-1)
        for i in range(start, stop):
            r = _round_one(u[i], mbits, bias)
            if (r & 0x7FFF) >= inf_pattern:
                if bad < 0:
                    bad = i
                r = (r & 0x8000) | inf_pattern
            out[i] = np.uint16(r)
        first_bad[c] = bad
    for c in range(nchunks):
        if first_bad[c] >= 0:
            return first_bad[c]
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


@kernel
def bits_to_float(bits, out, mbits, bias):
    """Decode the 1-D int64 array ``bits`` (values in [0, 65535]) into ``out``, the uint64
    view of the float64 result.  Returns the first flat index holding a NaN/inf pattern,
    or -1 (those entries are left 0)."""
    n = bits.shape[0]
    exp_mask = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    frac_mask = (np.int64(1) << mbits) - 1
    nchunks = (n + _CHUNK - 1) // _CHUNK
    first_bad = np.full(nchunks, -1, dtype=np.int64)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        bad = np.int64(-1)
        for i in range(start, stop):
            b = bits[i]
            sign = np.uint64((b >> 15) & 1) << np.uint64(63)
            expo = (b & exp_mask) >> mbits
            frac = b & frac_mask
            if expo == 0:
                if frac == 0:
                    out[i] = sign
                else:
                    out[i] = sign | np.uint64(_subnormal_bits(frac, mbits, bias, 52, 1023))
            elif expo == exp_mask >> mbits:
                if bad < 0:
                    bad = i
                out[i] = np.uint64(0)
            else:
                out[i] = sign | (np.uint64(expo - bias + 1023) << np.uint64(52)) \
                    | (np.uint64(frac) << np.uint64(52 - mbits))
        first_bad[c] = bad
    for c in range(nchunks):
        if first_bad[c] >= 0:
            return first_bad[c]
    return np.int64(-1)


@kernel
def bits_to_float32(bits, out, mbits, bias):
    """Decode the 1-D uint16 array ``bits`` (finite patterns only) into ``out``, the uint32
    view of a float32 array.  Every FP16 and BF16 value is exactly a float32: BF16 is the
    upper half of float32; FP16 subnormals are float32 normals."""
    n = bits.shape[0]
    exp_mask = np.int64(((1 << (15 - mbits)) - 1) << mbits)
    frac_mask = (np.int64(1) << mbits) - 1
    if mbits == 7 and bias == 127:
        for i in prange(n):
            out[i] = np.uint32(bits[i]) << np.uint32(16)
        return
    for i in prange(n):
        b = np.int64(bits[i])
        sign = np.int64((b >> 15) & 1) << 31
        expo = (b & exp_mask) >> mbits
        frac = b & frac_mask
        if expo == 0:
            if frac == 0:
                r = sign
            else:
                r = sign | _subnormal_bits(frac, mbits, bias, 23, 127)
        else:
            r = sign | ((expo - bias + 127) << 23) | (frac << (23 - mbits))
        out[i] = np.uint32(r)
