"""Gradient utilities shared by ``hmath_dl.precision``, ``hmath_dl.autodiff`` and
``hmath_dl.optim``: the "grads" argument convention, the overflow-safe gradient norm and
norm clipping.  This module is the one implementation; the public modules re-export it.

**grads** is either one array-like (results come back as one ndarray of its shape) or a
list/tuple of array-likes (results come back as a list of ndarrays of the same shapes;
a list of numbers is a list of 0-d gradients).
"""

from __future__ import annotations

import math
from typing import List, Tuple

import numpy as np

from . import _checks
from ._kernels import gradnorm as _kgradnorm

__all__ = ["as_gradient_list", "gradient_norm", "clip_gradients"]


def as_gradient_list(fname: str, grads, *, finite: bool = True) -> Tuple[List[np.ndarray], bool]:
    """Normalise a ``grads`` argument.

    Returns ``(arrays, was_single)``: ``arrays`` a list of C-contiguous float64 arrays
    (possibly the caller's own arrays: treat them as read-only), ``was_single`` True when
    ``grads`` was one array-like rather than a list/tuple.  Non-numeric entries raise
    TypeError; with ``finite=True`` a NaN/inf raises NonFiniteError naming ``grads[i]``.
    """
    if isinstance(grads, (list, tuple)):
        return [_checks.tensor(fname, f"grads[{i}]", g, finite=finite)
                for i, g in enumerate(grads)], False
    return [_checks.tensor(fname, "grads", grads, finite=finite)], True


def restore_structure(arrays: List[np.ndarray], was_single: bool):
    """Inverse of :func:`as_gradient_list` for results: one array or a list."""
    return arrays[0] if was_single else list(arrays)


_NONFINITE_BITS = 0x7FF0000000000000


def _norm(fname: str, arrays: List[np.ndarray]) -> float:
    """Norm of already-normalised arrays (NaN/inf detected here: NonFiniteError)."""
    flats = [a.reshape(-1) for a in arrays if a.size]
    if not flats:
        return 0.0
    top = max(int(_kgradnorm.max_abs_bits(f)) for f in flats)
    # a NaN/inf entry: the first one, gradient by gradient, is named (NonFiniteError)
    _checks.finish(fname, top < _NONFINITE_BITS, inputs=(
        ("grads" if len(arrays) == 1 else f"grads[{j}]", a) for j, a in enumerate(arrays)))
    if top == 0:
        return 0.0
    amax = float(np.int64(top).view(np.float64))
    _, e = math.frexp(amax)
    half = -e // 2
    s1 = math.ldexp(1.0, half)
    s2 = math.ldexp(1.0, -e - half)
    total = 0.0
    for f in flats:                                  # fixed order: array by array
        total += float(_kgradnorm.scaled_sum_squares(f, s1, s2))
    root = math.sqrt(total)
    try:
        norm = math.ldexp(root, e)
    except OverflowError:
        norm = math.inf
    return _checks.finish(fname, math.isfinite(norm), out=norm, overflow=lambda u, code: (
        f"the Euclidean norm of grads exceeds the largest double "
        f"(largest |entry| {amax!r}; expected a norm <= 1.7976931348623157e+308)"))


def gradient_norm(grads) -> float:
    """Euclidean norm over every entry of every gradient array.

    ``sqrt(sum_i g_i**2)``, computed as ``2**e * sqrt(sum_i (g_i * 2**-e)**2)`` with
    ``2**e`` the power of two just above ``max |g_i|`` (scaling as LAPACK's ``dnrm2``), so
    entries like ``1e200`` do not overflow in the squares.  The summation order is fixed
    (per array, 8 interleaved lanes combined pairwise; arrays in order), hence bitwise
    identical for any thread count.

    Parameters
    ----------
    grads : array_like or list/tuple of array_like

    Returns
    -------
    float
        ``0.0`` for empty gradients.

    Raises
    ------
    NonFiniteError
        An entry is NaN or +-inf.
    NumericOverflow
        The true norm exceeds the largest double.
    TypeError
        An entry is not numeric.
    """
    fname = "gradient_norm"
    arrays, _ = as_gradient_list(fname, grads, finite=False)     # finiteness checked by _norm
    return _norm(fname, arrays)


def clip_gradients(max_norm, grads):
    """Scale gradients down so that their Euclidean norm is at most ``max_norm``.

    With ``norm = gradient_norm(grads)``: if ``norm > max_norm`` every entry becomes
    ``g * (max_norm / norm)``; otherwise the gradients are returned as new arrays with the
    same values.

    Parameters
    ----------
    max_norm : float, positive and finite
    grads : array_like or list/tuple of array_like

    Returns
    -------
    numpy.ndarray or list of numpy.ndarray
        Same structure and shapes as ``grads`` (one array for one array-like, a list for a
        list/tuple), new C-contiguous float64 arrays.

    Raises
    ------
    DomainError
        ``max_norm`` is not positive and finite.
    NonFiniteError
        A gradient entry is NaN or +-inf.
    NumericOverflow
        The norm exceeds the largest double.
    TypeError
        ``max_norm`` or an entry is not numeric.
    """
    fname = "clip_gradients"
    max_norm = _checks.real(fname, "max_norm", max_norm, positive=True)
    arrays, was_single = as_gradient_list(fname, grads, finite=False)   # checked by _norm
    norm = _norm(fname, arrays)
    if norm > max_norm:
        factor = max_norm / norm
        out = [np.multiply(a, factor, out=_checks.alloc(fname, a.shape)) for a in arrays]
    else:
        out = [np.array(a, dtype=np.float64, order="C", copy=True) for a in arrays]
    return restore_structure(out, was_single)
