"""Differentiable pooling layers (see :mod:`hmath_dl.layers.differentiable`):
:func:`pooling_ad`, :func:`adaptive_pooling_ad`, :func:`global_pooling_ad`.

Every pooling flavour is a box reduction (:class:`~hmath_dl.layers.pooling.BoxPlan`: per
axis the positions ``lo, lo + d, ... < hi`` each output reads, and the divisor factors),
so one vector-Jacobian rule serves all three: the Numba kernel
:func:`~hmath_dl._kernels.pool_backward.box_pool_backward`, parallel over ``(n, c)``
planes of the gradient, each plane summed in row-major output order (identical bits for
any thread count).
"""

from __future__ import annotations

import numpy as np

from ..autodiff.core import vjp_of
from .._kernels.views import out5, readonly5
from ._ad_common import _c, differentiable

__all__ = ["pooling_ad", "adaptive_pooling_ad", "global_pooling_ad"]


# =========================================================================== pooling
@differentiable("x")
def pooling_ad(mode, window, stride, padding, x, *, dilation=None, ceil_mode=False,
               count_include_pad=False, divisor_override=None):
    """Differentiable :func:`~hmath_dl.layers.pooling`: ``y[n, c, o]`` = max, or sum
    divided by the divisor, of the real positions ``t_j = o s - p + j d`` (``0 <= j < k``,
    ``0 <= t_j < S``) of ``x[n, c]``.

    MAX sends each output's gradient to the first maximal position of its window (row-major
    window order; padding never wins): the element
    :func:`~hmath_dl.layers.max_pooling_with_indices` names.  AVERAGE adds ``g / divisor``
    to each real position of the window (the divisor of the forward pass:
    real count, padded count with ``count_include_pad``, or ``divisor_override``); a window
    without a real element (a constant 0) contributes nothing.

    Parameters
    ----------
    mode : PoolMode
        ``MAX`` or ``AVERAGE``.
    window, stride, padding : int or tuple of int
        One per spatial axis (an int applies to every axis): ``k >= 1``, ``s >= 1``,
        ``p >= 0``; a tuple ``window`` of ``r`` entries with ``x.ndim == r + 1`` means an
        unbatched ``x`` ``[C, *S]``.
    x : ADTensor or array_like, ``[N, C, *S]`` or ``[C, *S]`` (1-3 spatial axes)
        A non-ADTensor is a constant.  ``N == 0`` gives an empty result (and an empty
        gradient).
    dilation, ceil_mode, count_include_pad, divisor_override : keyword-only
        As for :func:`~hmath_dl.layers.pooling`.

    Returns
    -------
    ADTensor ``[N, C, *O]`` (or ``[C, *O]``)
        The plain layer's value bit for bit; ``O = floor((S + 2p - d(k-1) - 1)/s) + 1`` per
        axis (``ceil`` with ``ceil_mode``, see the plain layer).

    Raises
    ------
    TypeError, ShapeError, DomainError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.pooling` (including a window made only of padding:
        DomainError); the message starts with ``pooling_ad:``.
    """
    from .pooling import _pooling
    return _pooling("pooling", mode, window, stride, padding, x, dilation, ceil_mode,
                    count_include_pad, divisor_override)


@differentiable("x")
def adaptive_pooling_ad(mode, output_size, x):
    """Differentiable :func:`~hmath_dl.layers.adaptive_pooling`: bin ``i`` of an axis of
    length ``S`` covers ``[floor(i*S/out), ceil((i+1)*S/out))``; ``y`` is the max or the
    mean of the box of bins.

    MAX sends each output's gradient to the first maximal position of its box (row-major
    order); AVERAGE adds ``g / count`` to each position of the box (``count`` its number
    of elements).  Overlapping bins add up.

    Parameters
    ----------
    mode : PoolMode
    output_size : int or tuple of int
        ``>= 1`` per spatial axis; a tuple of ``r`` entries with ``x.ndim == r + 1`` means an
        unbatched ``x``.
    x : ADTensor or array_like, ``[N, C, *S]`` or ``[C, *S]``
        A non-ADTensor is a constant; ``N == 0`` gives an empty result.

    Returns
    -------
    ADTensor ``[N, C, *output_size]`` (or ``[C, *output_size]``)
        The plain layer's value bit for bit.

    Raises
    ------
    TypeError, ShapeError, DomainError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.adaptive_pooling`; the message starts with
        ``adaptive_pooling_ad:``.
    """
    from .pooling import _adaptive
    return _adaptive("adaptive_pooling", mode, output_size, x)


@differentiable("x")
def global_pooling_ad(mode, x):
    """Differentiable :func:`~hmath_dl.layers.global_pooling`: ``y[n, c]`` = max or mean of
    ``x[n, c]`` over all spatial positions.

    MAX sends the gradient to the first maximal position of the plane (row-major order);
    AVERAGE adds ``g / prod(S)`` to every position.

    Parameters
    ----------
    mode : PoolMode
    x : ADTensor or array_like, ``[N, C, *S]`` (1-3 spatial axes)
        A non-ADTensor is a constant; ``N == 0`` gives an empty result.

    Returns
    -------
    ADTensor ``[N, C]``
        The plain layer's value bit for bit.

    Raises
    ------
    TypeError, ShapeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.global_pooling`; the message starts with
        ``global_pooling_ad:``.
    """
    from .pooling import _global
    return _global("global_pooling", mode, x)


@vjp_of(global_pooling_ad)
@vjp_of(adaptive_pooling_ad)
@vjp_of(pooling_ad)
def _vjp_box_pooling(g, node, needs):
    """``dx`` of any pooling node (its ctx is a BoxPlan)."""
    from .._kernels.pool import boxes3
    from .._kernels.pool_backward import pool_backward_nd
    x = node.parents[0]
    plan = node.ctx
    dx = np.empty(plan.x_shape)
    if dx.size:
        xv = x.value.reshape(plan.x_shape)
        gv = _c(g).reshape(plan.out_shape)
        pool_backward_nd(readonly5(xv), readonly5(gv), boxes3(plan.axes), plan.is_max, out5(dx))
    return (dx.reshape(x.shape),)
