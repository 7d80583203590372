"""Row gather with the finiteness check fused in (the kernel of ``layers.embedding``)."""

import numpy as np

from ._jit import block_count, block_size, span_kernel

_EXP = np.uint64(0x7FF0000000000000)


@span_kernel(iterations=lambda table_bits, rows, *rest: block_count(rows.shape[0], 64),
             work=lambda table_bits, rows, out_bits, row_ok: out_bits.size)
def gather_rows(table_bits, rows, out_bits, row_ok, t0, t1):
    """``out_bits[r] = table_bits[rows[r]]`` for every r (rows already checked to lie in
    range), and ``row_ok[r] = 1`` iff that row is finite.

    Works on the float64 bit patterns (uint64 views): a copy of bits is exact, and a value
    is NaN/inf exactly when its exponent field is all ones, so the check is an integer
    maximum over the row -- which the compiler may reorder and vectorise, unlike a
    floating-point test.  A span kernel over blocks of output rows (serial for small
    calls, e.g. one token; one compilation for both); the result does not depend on the
    thread count (each row is written by one thread, no reduction across rows)."""
    n = rows.shape[0]
    per = block_size(n, 64)                     # rows per block (at most 64 blocks)
    f = np.uint64(table_bits.shape[1])
    for r in range(t0 * per, min(n, t1 * per)):
        src = rows[r]
        m = np.uint64(0)
        for j in range(f):
            b = table_bits[src, j]
            out_bits[r, j] = b
            m = max(m, b & _EXP)
        row_ok[r] = 0 if m == _EXP else 1
