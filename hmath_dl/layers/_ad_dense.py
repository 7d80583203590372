"""Differentiable dense, embedding and dropout layers (see
:mod:`hmath_dl.layers.differentiable`).

Dropout: either :func:`dropout_ad`, or by hand with the mask the plain layer returns::

    y, mask, rng = dropout(Mode.TRAINING, p, rng, x.value)
    y_ad = x * autodiff.constant(mask)        # same numbers as y; gradient g * mask
"""

from __future__ import annotations

import numpy as np

from .. import _checks
from .._kernels.gemm_f64 import matmul_nd
from .._kernels.reduce import sum_to
from ..autodiff.core import vjp_of
from ._ad_common import _c, differentiable

__all__ = ["dense_ad", "embedding_ad", "dropout_ad", "spatial_dropout_ad"]


# =========================================================================== dense
@differentiable("x", "w", optional="bias")
def dense_ad(x, w, bias):
    """Differentiable :func:`~hmath_dl.layers.dense`: ``y = x @ w.T + bias``.

    Parameters
    ----------
    x : ADTensor ``[B, in]`` (or ``[..., B, in]``, as the plain layer)
        A non-ADTensor argument is a constant (no gradient); so for ``w`` and ``bias``.
    w : ADTensor ``[out, in]``
    bias : ADTensor of length ``out``, or None

    Returns
    -------
    ADTensor ``x.shape[:-1] + (out,)``
        Gradients ``dx = g @ w``, ``dw = g^T x`` (over all leading axes),
        ``dbias = sum of g over all leading axes``.

    Raises
    ------
    ShapeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.dense` (shapes that do not fit, NaN/inf in a
        non-ADTensor argument, a non-finite result); the message starts with ``dense_ad:``.
    TypeError
        ``x`` or ``w`` None, a string or not numeric.
    """
    from .dense import dense
    return dense(x, w, bias), None


@vjp_of(dense_ad)
def _vjp_dense(g, node, needs):
    x, w = node.parents[0], node.parents[1]
    out = w.shape[0]
    g2 = g.reshape(-1, out)
    gx = gw = gb = None
    if needs[0]:
        gx = matmul_nd(g2, w.value).reshape(x.shape)
    if needs[1]:
        gw = matmul_nd(g2.T, x.value.reshape(-1, w.shape[1]))
    if needs[2]:
        gb = sum_to(g2, (False, True))
    return gx, gw, gb


# =========================================================================== embedding
@differentiable("weights")
def embedding_ad(weights, indices):
    """Differentiable :func:`~hmath_dl.layers.embedding`: ``y[i] = weights[indices[i]]``
    (gradient w.r.t. the table).

    ``dweights[v] = sum of g[i] over the positions i (row-major) with indices[i] == v``,
    summed in increasing position order, rows in parallel.

    Parameters
    ----------
    weights : ADTensor or array_like, ``[V, F]``
        A non-ADTensor is a constant.
    indices : int array_like, any shape
        Entries in ``[0, V)``; not differentiated.

    Returns
    -------
    ADTensor ``indices.shape + (F,)``

    Raises
    ------
    IndexOutOfRange
        An index outside ``[0, V)`` (negatives too).
    ShapeError, NonFiniteError, TypeError, DomainError
        As for :func:`~hmath_dl.layers.embedding` (float or bool indices: TypeError); the
        message starts with ``embedding_ad:``.
    """
    from .embedding import embedding
    value = embedding(weights, indices)
    return value, _checks.int_array("embedding_ad", "indices", indices).reshape(-1)


@vjp_of(embedding_ad)
def _vjp_embedding(g, node, needs):
    from .._kernels.backward import embedding_backward
    w = node.parents[0]
    idx = node.ctx
    V, F = w.shape
    dw = np.empty((V, F))
    if dw.size:
        embedding_backward(idx, _c(g).reshape(idx.size, F), V, dw)
    return (dw,)


# =========================================================================== dropout
@differentiable("x")
def dropout_ad(mode, p, rng, x):
    """Differentiable :func:`~hmath_dl.layers.dropout`: ``y = x * mask``, gradient ``g * mask``.

    The mask and the advanced RNG are exactly those the plain layer returns.

    Parameters
    ----------
    mode : Mode
        TRAINING (random mask) or INFERENCE (identity).
    p : float
        Drop probability, ``0 <= p <= 1``.
    rng : RNG
    x : ADTensor or array_like
        Any shape; a non-ADTensor is a constant.

    Returns
    -------
    (ADTensor, ndarray, RNG)
        ``y`` (shape of ``x``); ``mask`` (entries ``0`` or ``1/(1-p)`` in TRAINING, all ones
        in INFERENCE); the advanced RNG (unchanged in INFERENCE).

    Raises
    ------
    DomainError, TypeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.dropout` (``p`` outside ``[0, 1]``, ``mode`` not a
        Mode, ``rng`` not an RNG, ``x / (1 - p)`` overflowing); the message starts with
        ``dropout_ad:``.
    """
    from .dropout import dropout
    y, mask, rng = dropout(mode, p, rng, x)
    return y, mask, mask, rng


@differentiable("x")
def spatial_dropout_ad(mode, p, rng, x):
    """Differentiable :func:`~hmath_dl.layers.spatial_dropout`: ``y = x * mask`` with one
    mask value per ``(n, c)`` shared over the spatial positions; gradient ``g * mask``.

    Parameters
    ----------
    mode : Mode
    p : float
        Drop probability, ``0 <= p <= 1``.
    rng : RNG
    x : ADTensor or array_like, ``[N, C, *spatial]``
        A non-ADTensor is a constant.

    Returns
    -------
    (ADTensor, ndarray, RNG)
        ``y``; the mask (``x``'s full shape, as the plain layer returns it); the advanced
        RNG.  The mask and RNG are exactly the plain layer's.

    Raises
    ------
    DomainError, TypeError, ShapeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.spatial_dropout`; the message starts with
        ``spatial_dropout_ad:``.
    """
    from .dropout import spatial_dropout
    y, mask, rng = spatial_dropout(mode, p, rng, x)
    return y, mask, mask, rng


@vjp_of(spatial_dropout_ad, "dropout")
@vjp_of(dropout_ad)
def _vjp_dropout(g, node, needs):
    """``g * mask`` (the node's ctx is the mask)."""
    return (g * node.ctx,)
