"""Embedding gather kernel."""

from numba import prange

from ._jit import kernel


@kernel
def embedding_gather(weights, indices, out):
    """``out[i, :] = weights[indices[i], :]`` for the ``[V, F]`` table ``weights``, the 1-D
    int64 ``indices`` and the ``[len(indices), F]`` output.

    Returns -1 when every index lies in ``[0, V)``; otherwise the position of the first
    bad index (nothing is written then).
    """
    v = weights.shape[0]
    f = weights.shape[1]
    n = indices.shape[0]
    for i in range(n):
        k = indices[i]
        if k < 0 or k >= v:
            return i
    for i in prange(n):
        k = indices[i]
        for j in range(f):
            out[i, j] = weights[k, j]
    return -1
