"""Finiteness checks: the scan used by argument validation and the one run-check helper
that kernels call on their outputs."""

import numpy as np

from numba import prange

from ._jit import helper, kernel

_CHUNK = 4096


_EXP = np.uint64(0x7FF0000000000000)


@helper
def first_outside(idx, hi):
    """The first position ``i`` with ``idx[i]`` outside ``[0, hi)`` (an int64 array), or
    -1: one compiled pass (numpy's form, a mask of both tests and ``flatnonzero``, took
    three array operations on every call of a loss)."""
    for i in range(idx.shape[0]):
        v = idx[i]
        if v < 0 or v >= hi:
            return i
    return -1


@helper
def all_finite(flat):
    """True iff every element of the 1-D float64 array ``flat`` is finite.

    A float64 is NaN or infinite exactly when its 11 exponent bits are all ones, so each
    chunk takes the maximum of the masked exponent fields of the bit patterns: an
    integer reduction, which (unlike a floating-point sum) the compiler may reorder and
    therefore vectorises -- memory speed (about 30 GB/s here).  It stops at the first bad
    chunk.  Serial on purpose: a parallel launch costs more than the scan for all but huge
    arrays, and the answer cannot depend on the thread count.
    """
    bits = flat.view(np.uint64)
    n = bits.shape[0]
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        m = np.uint64(0)
        # unsigned indices: numba then emits no negative-index wrap-around (2.6x faster)
        base = np.uint64(start)
        for i in range(np.uint64(stop - start)):
            m = max(m, bits[base + i] & _EXP)
        if m == _EXP:
            return False
    return True


@helper
def span_finite(a, start, stop):
    """True iff ``a[start:stop]`` is all finite: the one check kernels run on a run of
    their own outputs while it is still in cache (``v * 0`` is NaN exactly for NaN/inf
    ``v``; eight independent accumulators keep the check off the critical path).  Unlike
    :func:`all_finite` it never stops early, so its cost does not depend on the data."""
    c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = 0.0
    stop8 = start + (stop - start) // 8 * 8
    for i in range(start, stop8, 8):
        c0 += a[i] * 0.0
        c1 += a[i + 1] * 0.0
        c2 += a[i + 2] * 0.0
        c3 += a[i + 3] * 0.0
        c4 += a[i + 4] * 0.0
        c5 += a[i + 5] * 0.0
        c6 += a[i + 6] * 0.0
        c7 += a[i + 7] * 0.0
    for i in range(stop8, stop):
        c0 += a[i] * 0.0
    return ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)) == 0.0


@kernel
def thread_probe(out):
    """Write each index into ``out`` from a ``prange``: the smallest parallel kernel, run
    by ``python -m hmath_dl.info`` (and the fork tests) to start Numba's threading layer."""
    for i in prange(out.shape[0]):
        out[i] = i
