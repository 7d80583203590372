"""Pooling: windowed, adaptive and global max/average pooling on 1-3 spatial axes
(seed: HMath.DeepLearning.Layers).

Layout ``x [N, C, *spatial]``.  Every flavour reduces, per output position, a box of
input positions given by per-axis ``[lo, hi)`` ranges; padding is never part of a box
(padded positions never win a max and are not counted by an average).  Kernels:
:mod:`hmath_dl._kernels.pool`.
"""

from __future__ import annotations

import enum

import numpy as np

from .. import _checks
from .._kernels.pool import adaptive_bounds, pool_nd, readonly, sized_global_pool, window_bounds
from ..errors import DomainError, NumericOverflow
from .convolution import ShapeOrDomainError

__all__ = ["PoolMode", "pooling", "adaptive_pooling", "global_pooling"]


class PoolMode(enum.Enum):
    """Pooling reduction: ``MAX`` (largest element) or ``AVERAGE`` (arithmetic mean of
    the non-padding elements)."""

    MAX = "max"
    AVERAGE = "average"


def _input(fname, mode, x):
    mode = _checks.member(fname, "mode", mode, PoolMode)
    # finiteness is checked by the kernel (status), on the data it reads anyway
    x = _checks.tensor(fname, "x", x, min_ndim=3, max_ndim=5, nonempty=True, finite=False)
    return mode, x


def _run(fname, mode, x, out_spatial, bounds_of):
    out = _checks.alloc(fname, x.shape[:2] + tuple(out_spatial))
    bounds = [bounds_of(a) for a in range(x.ndim - 2)]
    if pool_nd(x, bounds, mode is PoolMode.MAX, out):
        _checks.require_finite(fname, "x", x)     # raises NonFiniteError naming the element
        raise NumericOverflow(f"{fname}: a window sum overflows float64 "
                              f"(non-finite value in the output of shape {_checks.shape_str(out.shape)})")
    return out


def pooling(mode, window, stride, padding, x):
    """Windowed max or average pooling.

    Parameters
    ----------
    mode : PoolMode
    window, stride, padding : int or tuple of int
        One per spatial axis (an int is broadcast to every axis): window ``k >= 1``,
        stride ``s >= 1``, symmetric padding ``p >= 0``.
    x : array_like, shape (N, C, *S), 1-3 spatial axes

    Returns
    -------
    ndarray, shape (N, C, *O)
        ``O = floor((S + 2p - k)/s) + 1`` per axis (must be >= 1).  Output ``o`` reduces the
        input positions ``[o*s - p, o*s - p + k) ∩ [0, S)`` on every axis: MAX gives their
        maximum, AVERAGE their sum divided by their number (padding is excluded from the
        count, i.e. ``count_include_pad=False``).

    Raises
    ------
    TypeError
        ``mode`` not a PoolMode, non-integer window/stride/padding, non-numeric x.
    ShapeError
        x rank not 3-5, empty x, tuples of the wrong length.
    DomainError
        window < 1, stride < 1, padding < 0, or a window made only of padding.
    ShapeOrDomainError (a ShapeError and a DomainError)
        An output size below 1.
    NonFiniteError
        NaN/inf in x.
    NumericOverflow
        An average whose sum overflows.
    """
    fname = "pooling"
    mode, x = _input(fname, mode, x)
    rank = x.ndim - 2
    k = _checks.int_tuple(fname, "window", window, rank, min=1)
    s = _checks.int_tuple(fname, "stride", stride, rank, min=1)
    p = _checks.int_tuple(fname, "padding", padding, rank, min=0)
    S = x.shape[2:]
    O = tuple((S[a] + 2 * p[a] - k[a]) // s[a] + 1 for a in range(rank))
    for a in range(rank):
        if O[a] < 1:
            raise ShapeOrDomainError(
                f"{fname}: output size along spatial axis {a} would be {O[a]} (floor((input {S[a]} "
                f"+ 2*padding {p[a]} - window {k[a]}) / stride {s[a]}) + 1; expected >= 1)")
    _checks.check_size(fname, x.shape[:2] + O)
    for a in range(rank):
        # window o covers [o*s - p, o*s - p + k); it holds no input position iff it ends
        # at or before 0 or starts at or after S.  The first window is the one most to the
        # left, the last the one most to the right.
        last = (O[a] - 1) * s[a] - p[a]
        if k[a] - p[a] <= 0 or last >= S[a]:
            o = 0 if k[a] - p[a] <= 0 else O[a] - 1
            raise DomainError(
                f"{fname}: window {o} along spatial axis {a} covers only padding "
                f"(positions [{o * s[a] - p[a]}, {o * s[a] - p[a] + k[a]}) of an input of size {S[a]}; "
                f"got window {k[a]}, stride {s[a]}, padding {p[a]})")
    return _run(fname, mode, x, O, lambda a: window_bounds(S[a], k[a], s[a], p[a], O[a]))


def adaptive_pooling(mode, output_size, x):
    """Adaptive max or average pooling to a given output size.

    Parameters
    ----------
    mode : PoolMode
    output_size : int or tuple of int
        ``out >= 1`` per spatial axis (an int is broadcast); ``out > S`` is allowed.
    x : array_like, shape (N, C, *S), 1-3 spatial axes

    Returns
    -------
    ndarray, shape (N, C, *output_size)
        Bin ``i`` of an axis of length ``S`` covers ``[floor(i*S/out), ceil((i+1)*S/out))``
        (bins overlap when ``S`` is not a multiple of ``out``, as in PyTorch); MAX gives the
        maximum of the box of bins, AVERAGE its mean.

    Raises
    ------
    TypeError, ShapeError, NonFiniteError, NumericOverflow
        As for :func:`pooling`; ``DomainError`` for an output size < 1.
    """
    fname = "adaptive_pooling"
    mode, x = _input(fname, mode, x)
    rank = x.ndim - 2
    O = _checks.int_tuple(fname, "output_size", output_size, rank, min=1)
    S = x.shape[2:]
    return _run(fname, mode, x, O, lambda a: adaptive_bounds(S[a], O[a]))


def global_pooling(mode, x):
    """Global max or average pooling over all spatial axes.

    Parameters
    ----------
    mode : PoolMode
    x : array_like, shape (N, C, *S), 1-3 spatial axes

    Returns
    -------
    ndarray, shape (N, C)
        ``y[n, c] = max_s x[n, c, s]`` (MAX) or ``sum_s x[n, c, s] / prod(S)`` (AVERAGE).

    Raises
    ------
    TypeError, ShapeError, NonFiniteError, NumericOverflow
        As for :func:`pooling`.
    """
    fname = "global_pooling"
    mode, x = _input(fname, mode, x)
    S = (1,) * (5 - x.ndim) + x.shape[2:]
    out = _checks.alloc(fname, x.shape[:2])
    if sized_global_pool(x.size)(readonly(x.reshape((-1,) + S)), mode is PoolMode.MAX,
                                 out.reshape(-1)):
        _checks.require_finite(fname, "x", x)     # raises NonFiniteError naming the element
        raise NumericOverflow(f"{fname}: a window sum overflows float64 "
                              f"(non-finite value in the output of shape {_checks.shape_str(out.shape)})")
    return out
