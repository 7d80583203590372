"""Differentiable rotary embedding and feed-forward block (see
:mod:`hmath_dl.layers.differentiable`)."""

from __future__ import annotations

import numpy as np

from ..autodiff.core import vjp_of
from ._ad_common import _ad, _c, _named, _opt_ad, differentiable


@differentiable("x")
def rotary_embedding_ad(base, offset, x):
    """Differentiable :func:`~hmath_dl.layers.rotary_embedding`: pair ``(2i, 2i+1)`` of row
    ``r`` rotates by ``a = (offset + r) * base**(-2i/F)``:
    ``y = (x0 cos a - x1 sin a, x0 sin a + x1 cos a)``.

    The gradient is the inverse rotation of the cotangent,
    ``dx = (g0 cos a + g1 sin a, -g0 sin a + g1 cos a)``, computed with the same kernel as
    the forward pass: ``dx = c(rotate(c(g)))`` where ``c`` negates the odd features (an
    exact operation), so forward and backward use the very same angles.

    Parameters
    ----------
    base : float
        ``> 0``.
    offset : int
        ``>= 0``, the position of the first row.
    x : ADTensor or array_like, ``[..., S, F]``, F even
        A non-ADTensor is a constant.

    Returns
    -------
    ADTensor, shape of ``x``
        Forward numbers those of the plain layer.

    Raises
    ------
    TypeError, ShapeError, DomainError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.rotary_embedding`; the message starts with
        ``rotary_embedding_ad:``.
    """
    from .attention import rotary_embedding
    return rotary_embedding(base, offset, x), (float(base), int(offset))


@vjp_of(rotary_embedding_ad)
def _vjp_rotary_embedding(g, node, needs):
    from .attention import rotary_embedding
    base, offset = node.ctx
    g = _c(g)
    if g.size == 0:
        return (np.zeros(g.shape),)
    return (_conj(rotary_embedding(base, offset, _conj(g))),)


def _conj(a):
    """``a`` with its odd features negated (a new array)."""
    out = np.array(a, dtype=np.float64, order="C", copy=True)
    out[..., 1::2] *= -1.0
    return out


def transformer_feed_forward_ad(activation, w1, b1, w2, b2, x):
    """Differentiable :func:`~hmath_dl.layers.transformer_feed_forward`:
    ``y = dense(activate(act, dense(x, w1, b1)), w2, b2)``.

    Built from :func:`~hmath_dl.layers.dense_ad` and :func:`hmath_dl.autodiff.activate`
    (the same kernels as the plain block, so the same forward numbers); gradients for
    every ADTensor argument.

    Parameters
    ----------
    activation : Activation
    w1 : ADTensor or array_like ``[hidden, in]``
    b1 : ADTensor or array_like of length ``hidden``, or None
    w2 : ADTensor or array_like ``[out, hidden]``
    b2 : ADTensor or array_like of length ``out``, or None
    x : ADTensor or array_like ``[..., B, in]``
        Non-ADTensor arguments are constants.

    Returns
    -------
    ADTensor ``x.shape[:-1] + (out,)``

    Raises
    ------
    TypeError, ShapeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.transformer_feed_forward`; the message starts
        with ``transformer_feed_forward_ad:``.
    """
    from ..autodiff.ops import activate
    from ._ad_dense import dense_ad
    from .feed_forward import _arguments
    fname = "transformer_feed_forward_ad"
    w1, w2, x = _ad(fname, "w1", w1), _ad(fname, "w2", w2), _ad(fname, "x", x)
    b1, b2 = _opt_ad(fname, "b1", b1), _opt_ad(fname, "b2", b2)
    with _named(fname):
        act = _arguments("transformer_feed_forward", activation, w1.value,
                         None if b1 is None else b1.value, w2.value,
                         None if b2 is None else b2.value, x.value)[0]
        return dense_ad(activate(act, dense_ad(x, w1, b1)), w2, b2)
