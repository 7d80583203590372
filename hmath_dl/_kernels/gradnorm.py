"""Overflow-safe Euclidean norm of a flat float64 array (the gradient-norm kernel).

``amax = max |x|``; with ``amax = f * 2**e`` (``0.5 <= f < 1``) every entry is scaled by
the exact power of two ``2**-e`` (applied as two factors so that neither over- nor
underflows as a constant), squared and summed; the norm is ``sqrt(sum) * 2**e``.

Fixed summation order, independent of the thread count: the array is cut into chunks of
``_CHUNK`` entries; inside a chunk entry ``i`` goes to lane ``i % _LANES``, each lane sums
sequentially, lanes are combined in order; chunk sums are then combined in chunk order.
"""

import math

import numpy as np
from numba import prange

from ._jit import kernel

_CHUNK = 8192
_LANES = 8


@kernel
def euclidean_norm(flat):
    """Norm of the finite 1-D float64 array ``flat`` (``inf`` when it exceeds the largest
    double; the caller raises)."""
    n = flat.shape[0]
    if n == 0:
        return 0.0
    nchunks = (n + _CHUNK - 1) // _CHUNK
    cmax = np.zeros(nchunks, dtype=np.float64)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        m = 0.0
        for i in range(start, stop):
            m = max(m, abs(flat[i]))
        cmax[c] = m
    amax = 0.0
    for c in range(nchunks):
        amax = max(amax, cmax[c])
    if amax == 0.0:
        return 0.0
    _, e = math.frexp(amax)
    half = -e // 2
    s1 = math.ldexp(1.0, half)
    s2 = math.ldexp(1.0, -e - half)
    partial = np.zeros(nchunks, dtype=np.float64)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        lanes = np.zeros(_LANES, dtype=np.float64)
        full = start + ((stop - start) // _LANES) * _LANES
        for i0 in range(start, full, _LANES):
            for l in range(_LANES):
                t = (flat[i0 + l] * s1) * s2
                lanes[l] += t * t
        for i in range(full, stop):
            t = (flat[i] * s1) * s2
            lanes[(i - start) % _LANES] += t * t
        s = 0.0
        for l in range(_LANES):
            s += lanes[l]
        partial[c] = s
    total = 0.0
    for c in range(nchunks):
        total += partial[c]
    return math.ldexp(math.sqrt(total), e)
