"""Embedding lookup."""

from __future__ import annotations

import numpy as np

from .. import _checks
from ..errors import IndexOutOfRange

__all__ = ["embedding"]


def embedding(weights, indices):
    """Gather rows of an embedding table.

    Parameters
    ----------
    weights : array_like, shape ``[V, F]``
        Finite table.
    indices : int array_like, any shape
        Integer entries in ``[0, V)``; float or bool indices raise TypeError.

    Returns
    -------
    ndarray, shape ``indices.shape + (F,)``
        ``out[idx, :] = weights[indices[idx], :]`` (a copy; the caller owns it).

    Notes
    -----
    The whole table is checked for NaN/inf on every call (checked-arithmetic contract),
    which costs one read of ``weights``; the gather itself is ``numpy.take``.

    Raises
    ------
    IndexOutOfRange
        an index outside ``[0, V)`` (negatives too); the message names the first one
        (row-major position and value).
    ShapeError, NonFiniteError, TypeError, DomainError (an unsigned index beyond int64).
    """
    fname = "embedding"
    w = _checks.tensor(fname, "weights", weights, ndim=2)
    idx = _checks.int_array(fname, "indices", indices)
    if idx.ndim == 1 and np.ndim(indices) == 0:  # _checks turns a 0-d input into [1]
        idx = idx.reshape(())
    v, f = w.shape
    out = _checks.alloc(fname, idx.shape + (f,))
    flat = idx.reshape(-1)
    if flat.size == 0:
        return out
    bad = (flat < 0) | (flat >= v)
    if bad.any():
        first = int(np.argmax(bad))
        where = tuple(int(i) for i in np.unravel_index(first, idx.shape))
        raise IndexOutOfRange(f"{fname}: indices{list(where)} = {int(flat[first])} is outside "
                              f"[0, {v}) (the table has {v} rows)")
    # numpy's gather (a vectorised row copy) measured ~5x faster than a numba prange copy
    np.take(w, flat, axis=0, out=out.reshape(flat.size, f))
    return out
