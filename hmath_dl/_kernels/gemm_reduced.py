"""Reduced-precision GEMM kernel: float32 operands (already rounded to FP16/BF16 values),
float32 products and a float32 accumulator with a fixed k order per output.

For every output ``acc = +0.0f`` and ``acc = fl32(acc + fl32(a[i,k] * b[k,j]))`` for
``k = 0 .. K-1``.  Separate multiply and add (numba never contracts them into an FMA
without fastmath, which is never used).  Work is split over blocks of output rows; the k
order of every output is the same whatever the blocking, so results are bitwise identical
for any thread count.
"""

import numpy as np
from numba import prange

from ._jit import helper, kernel

MB = 4      # rows per block
NB = 256    # columns per accumulator tile


@helper
def _tile(a, b, out, i0, i1, j0, j1, acc):
    K = a.shape[1]
    mb = i1 - i0
    nb = j1 - j0
    for ii in range(mb):
        for jj in range(nb):
            acc[ii, jj] = np.float32(0.0)
    for k in range(K):
        for ii in range(mb):
            av = a[i0 + ii, k]
            for jj in range(nb):
                p = av * b[k, j0 + jj]
                acc[ii, jj] = acc[ii, jj] + p
    for ii in range(mb):
        for jj in range(nb):
            out[i0 + ii, j0 + jj] = np.float64(acc[ii, jj])


@kernel
def gemm_f32_seq(a, b, out):
    """``out[i, j] = float64(acc)`` as described in the module docstring.  ``a`` [M, K] and
    ``b`` [K, N] are C-contiguous float32, ``out`` [M, N] float64.  Returns the first flat
    index of a non-finite output (a product or the accumulator reached +-inf), or -1."""
    M = a.shape[0]
    N = b.shape[1]
    nblocks = (M + MB - 1) // MB
    first_bad = np.full(max(nblocks, 1), -1, dtype=np.int64)
    for blk in prange(nblocks):
        acc = np.empty((MB, NB), dtype=np.float32)
        i0 = blk * MB
        i1 = min(M, i0 + MB)
        for j0 in range(0, N, NB):
            j1 = min(N, j0 + NB)
            _tile(a, b, out, i0, i1, j0, j1, acc)
        bad = np.int64(-1)
        for i in range(i0, i1):
            for j in range(N):
                if bad < 0 and not np.isfinite(out[i, j]):
                    bad = np.int64(i) * N + j
        first_bad[blk] = bad
    for blk in range(nblocks):
        if first_bad[blk] >= 0:
            return first_bad[blk]
    return np.int64(-1)
