"""Embedding lookup."""

from __future__ import annotations

import numpy as np

from .. import _checks
from .._kernels.gather import gather_rows
from .._kernels.views import readonly
from .._kernels.status import NONFINITE_INPUT, OK
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
    Only the gathered rows are checked for NaN/inf (a value in a row that is not gathered
    cannot reach the output): the check is fused into the gather kernel
    (``hmath_dl._kernels.gather.gather_rows``), which copies bit patterns and tests
    their exponent fields in the same pass, in parallel over output rows.  An empty
    ``indices`` gives an empty result of shape ``indices.shape + (F,)``.

    Raises
    ------
    IndexOutOfRange
        an index outside ``[0, V)`` (negatives too); the message names the first one
        (row-major position and value).
    ShapeError, NonFiniteError, TypeError, DomainError (an unsigned index beyond int64).
    """
    fname = "embedding"
    w = _checks.tensor(fname, "weights", weights, ndim=2, finite=False)
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
    ok = np.empty(flat.size, dtype=np.uint8)
    # the table read-only whatever the caller's flags: one compiled type
    gather_rows(readonly(w.view(np.uint64)), flat, out.reshape(flat.size, f).view(np.uint64),
                ok)
    # ok[i] == 0: the row gathered for position i holds a NaN/inf (the first one is named)
    verdict = (OK, None) if ok.all() else (NONFINITE_INPUT, int(np.argmin(ok)))
    return _checks.finish(fname, verdict, out=out,
                          nonfinite=lambda first: _gathered_nonfinite(w, flat, idx.shape, first))


def _gathered_nonfinite(w, flat, shape, first):
    where = tuple(int(i) for i in np.unravel_index(first, shape))
    row = int(flat[first])
    col = int(np.argmin(np.isfinite(w[row])))
    return (f"weights[{row}, {col}] = {float(w[row, col])!r} is not finite "
            f"(gathered by indices{list(where)})")
