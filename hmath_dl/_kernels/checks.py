"""Kernels used by argument validation."""

from ._jit import helper

_CHUNK = 4096


@helper
def all_finite(flat):
    """True iff every element of the 1-D float64 array ``flat`` is finite.

    Branch-free inside each chunk (``x * 0`` is NaN exactly for NaN/inf ``x``), so the
    loop vectorises and runs at memory speed; it stops at the first bad chunk.  Serial on
    purpose: a parallel launch costs more than the scan for all but huge arrays, and
    the answer cannot depend on the thread count.
    """
    n = flat.shape[0]
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        acc = 0.0
        for i in range(start, stop):
            acc += flat[i] * 0.0
        if acc != 0.0:
            return False
    return True
