"""Kernels used by argument validation."""

import numpy as np
from numba import prange

from ._jit import kernel

_CHUNK = 4096


@kernel
def all_finite(flat):
    """True iff every element of the 1-D float64 array ``flat`` is finite.

    Branch-free per chunk (``x * 0`` is NaN exactly for NaN/inf ``x``), so it vectorises
    and runs at memory speed; the answer does not depend on the thread count.
    """
    n = flat.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    bad = np.zeros(nchunks, dtype=np.bool_)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        acc = 0.0
        for i in range(start, stop):
            acc += flat[i] * 0.0
        bad[c] = acc != 0.0
    for c in range(nchunks):
        if bad[c]:
            return False
    return True
