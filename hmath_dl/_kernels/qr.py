"""Householder QR in a fixed order (the kernel of the ``Orthogonal`` initialiser).

``orthonormal_factor(at, q)``: ``at`` is ``A^T`` (``[n, m]``, C-contiguous, ``m >= n``; a
scratch copy that is overwritten), ``q`` receives ``Q^T`` (``[n, m]``) of the thin QR
``A = Q R`` with the signs of ``diag(R)`` folded in, i.e. the unique factor whose ``R``
has a positive diagonal (a zero diagonal counts as +1).

Every sum below is :func:`_dot`'s fixed order (eight interleaved partial sums).
Algorithm (the columns of ``A`` are the rows of ``at``, so every loop streams contiguous
memory).  For ``k = 0 .. n-1``: ``x = A[k:, k]``, ``norm = sqrt(sum x_i^2)``, ``alpha = -norm`` if ``x_0 >= 0`` else ``+norm`` (LAPACK's sign choice, so no
cancellation), ``v = x - alpha e_0``, ``vv = sum v_i^2``; every later column ``j > k`` is
reflected, ``A[k:, j] -= (2 (v . A[k:, j]) / vv) v``;
``diag(R)[k] = alpha``.  ``Q`` is accumulated backwards, ``Q = H_0 (H_1 (... H_{n-1}
I[:, :n]))``, with the same reflection formula, then column ``k`` is multiplied by
``sign(diag(R)[k])``.  Columns are independent within a step, so they run in parallel;
every sum has a fixed order, so the result is bitwise the same for any thread count and on
every CPU (no BLAS/LAPACK; ``sqrt`` is correctly rounded).
"""

import numpy as np
from numba import prange

from ._jit import helper, kernel


@helper
def _dot(a, b, lo, hi):
    """``sum_{lo <= i < hi} a[i] b[i]`` in a fixed order: eight interleaved partial sums
    (``i = lo + 8t + r`` into partial ``r``, ``t`` increasing), combined as
    ``((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))``, then the tail in increasing ``i``.
    The order does not depend on the CPU (the compiler may put the partials in one vector
    register, which does not change a bit)."""
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = 0.0
    i = lo
    while i + 8 <= hi:
        p0 += a[i] * b[i]
        p1 += a[i + 1] * b[i + 1]
        p2 += a[i + 2] * b[i + 2]
        p3 += a[i + 3] * b[i + 3]
        p4 += a[i + 4] * b[i + 4]
        p5 += a[i + 5] * b[i + 5]
        p6 += a[i + 6] * b[i + 6]
        p7 += a[i + 7] * b[i + 7]
        i += 8
    s = ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))
    while i < hi:
        s += a[i] * b[i]
        i += 1
    return s


@kernel
def orthonormal_factor(at, q):
    n, m = at.shape
    vs = np.zeros((n, m))
    vvs = np.zeros(n)
    signs = np.ones(n)
    for k in range(n):
        col = at[k]
        norm = np.sqrt(_dot(col, col, k, m))
        alpha = -norm if col[k] >= 0.0 else norm
        v = vs[k]
        for i in range(k, m):
            v[i] = col[i]
        v[k] -= alpha
        vv = _dot(v, v, k, m)
        vvs[k] = vv
        signs[k] = -1.0 if alpha < 0.0 else 1.0
        if vv == 0.0:
            continue
        for j in prange(k + 1, n):
            cj = at[j]
            f = 2.0 * _dot(v, cj, k, m) / vv
            for i in range(k, m):
                cj[i] -= f * v[i]
    for j in range(n):
        row = q[j]
        for i in range(m):
            row[i] = 0.0
        row[j] = 1.0
    for k in range(n - 1, -1, -1):
        vv = vvs[k]
        if vv == 0.0:
            continue
        v = vs[k]
        for j in prange(k, n):
            cj = q[j]
            f = 2.0 * _dot(v, cj, k, m) / vv
            for i in range(k, m):
                cj[i] -= f * v[i]
    for j in prange(n):
        sg = signs[j]
        row = q[j]
        for i in range(m):
            row[i] *= sg
