"""Differentiable pooling layers (see :mod:`hmath_dl.layers.differentiable`)."""

from __future__ import annotations

import numpy as np

from ..autodiff.core import make_node, register_vjp
from ._ad_common import _ad, _c, _named, _ro5, _tuple, _w5


# =========================================================================== pooling
def pooling_ad(mode, window, stride, padding, x):
    """Differentiable :func:`~hmath_dl.layers.pooling`: ``y[n, c, o]`` = max or mean of the
    non-padded ``x[n, c, o s - p + k]``, ``0 <= k < window``.

    MAX sends each output's gradient to the first maximal position of its window (window
    order; padding never wins); AVERAGE spreads it evenly over the window's non-padded
    positions.

    Parameters
    ----------
    mode : PoolMode
        ``MAX`` or ``AVERAGE``.
    window, stride, padding : int or tuple of int
        One per spatial axis (an int applies to every axis): ``k >= 1``, ``s >= 1``,
        ``p >= 0``.
    x : ADTensor or array_like, ``[N, C, *S]`` (1-3 spatial axes)
        A non-ADTensor is a constant.

    Returns
    -------
    ADTensor ``[N, C, *O]``
        ``O = floor((S + 2p - k)/s) + 1`` per axis.

    Raises
    ------
    TypeError, ShapeError, DomainError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.pooling` (including a window made only of padding:
        DomainError); the message starts with ``pooling_ad:``.
    """
    from .pooling import PoolMode, pooling
    fname = "pooling_ad"
    x = _ad(fname, "x", x)
    with _named(fname):
        value = pooling(mode, window, stride, padding, x.value)
    r = x.ndim - 2
    is_max = mode is PoolMode.MAX
    return make_node("pooling", value, (x,),
                     (is_max, _tuple(window, r), _tuple(stride, r), _tuple(padding, r)))


def _vjp_pooling(g, node, needs):
    from .._kernels.backward import pool_backward, sized
    from .._kernels.conv import _pad3
    x = node.parents[0]
    is_max, k, s, p = node.ctx
    k, s, p = _pad3(k, 1), _pad3(s, 1), _pad3(p, 0)
    dx = np.empty(x.shape)
    if dx.size:
        fn = sized(pool_backward, x.size)
        fn(_ro5(x.value), _ro5(_c(g)), is_max, k[0], k[1], k[2], s[0], s[1], s[2],
           p[0], p[1], p[2], _w5(dx))
    return (dx,)


RULES = {
    "pooling": _vjp_pooling,
}
register_vjp(RULES)
