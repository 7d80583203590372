"""Row gather with the finiteness check fused in (the kernel of ``layers.embedding``)."""

import numpy as np

from numba import prange

from ._jit import kernel

_EXP = np.uint64(0x7FF0000000000000)


@kernel
def gather_rows(table_bits, rows, out_bits, row_ok):
    """``out_bits[r] = table_bits[rows[r]]`` for every r (rows already checked to lie in
    range), and ``row_ok[r] = 1`` iff that row is finite.

    Works on the float64 bit patterns (uint64 views): a copy of bits is exact, and a value
    is NaN/inf exactly when its exponent field is all ones, so the check is an integer
    maximum over the row -- which the compiler may reorder and vectorise, unlike a
    floating-point test.  Parallel over output rows; the result does not depend on the
    thread count (each row is written by one thread, no reduction across rows)."""
    n = rows.shape[0]
    f = np.uint64(table_bits.shape[1])
    for r in prange(n):
        src = rows[r]
        m = np.uint64(0)
        for j in range(f):
            b = table_bits[src, j]
            out_bits[r, j] = b
            m = max(m, b & _EXP)
        row_ok[r] = 0 if m == _EXP else 1
