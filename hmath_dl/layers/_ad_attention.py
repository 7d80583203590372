"""Differentiable attention layers (see :mod:`hmath_dl.layers.differentiable`)."""

from __future__ import annotations

import numpy as np

from ..autodiff.core import vjp_of
from ._ad_common import _c, differentiable


# =========================================================================== attention
@differentiable("q", "k", "v")
def scaled_dot_product_attention_ad(q, k, v, mask=None, *, scale=None, is_causal=False,
                                    enable_gqa=False):
    """Differentiable :func:`~hmath_dl.layers.scaled_dot_product_attention` (no bias):
    ``out = softmax(q k^T / sqrt(D)) v``, softmax over the allowed keys.

    With ``P`` the attention weights, ``dv = P^T g``, ``dS = P (g v^T - rowsum(P g v^T))``,
    ``dq = dS k / sqrt(D)``, ``dk = dS^T q / sqrt(D)``.  Masked keys have ``P = 0``; a fully
    masked row is a constant zero and back-propagates exact zeros.

    Parameters
    ----------
    q : ADTensor or array_like, ``[..., N, D]``
        A non-ADTensor argument is a constant; so for ``k`` and ``v``.
    k : ADTensor or array_like, ``[..., M, D]``
    v : ADTensor or array_like, ``[..., M, F]``
        Leading axes must match those of ``q`` and ``k``.
    mask : bool array_like ``[..., N, M]``, optional
        True = allowed; not differentiated; leading axes broadcast.  None allows every key.
    scale, is_causal, enable_gqa : keyword-only
        As for :func:`~hmath_dl.layers.scaled_dot_product_attention` (explicit score scale
        ``(q k^T) * scale``, the causal mask, grouped-query heads).  With ``enable_gqa`` the
        gradient of a key/value head is the sum, over the query heads that share it in
        increasing order, of their contributions.

    Returns
    -------
    ADTensor ``[..., N, F]``
        The output only (the weights are not returned).

    Raises
    ------
    ShapeError, NonFiniteError, NumericOverflow, TypeError, DomainError
        As for :func:`~hmath_dl.layers.scaled_dot_product_attention` (shapes that do not
        fit, a non-boolean mask, an overflowing score); the message starts with
        ``scaled_dot_product_attention_ad:``.
    """
    from .attention import scaled_dot_product_attention
    out, weights = scaled_dot_product_attention(q, k, v, mask, scale=scale, is_causal=is_causal,
                                                enable_gqa=enable_gqa)
    groups = q.shape[-3] // k.shape[-3] if enable_gqa else 1
    return out, (weights, 1, _backward_scale(scale, q.shape[-1]), groups)


def _backward_scale(scale, d):
    """The factor of the score gradient: the explicit scale, else ``1/sqrt(d)``."""
    return float(scale) if scale is not None else 1.0 / np.sqrt(d)


@differentiable("q", "k", "v")
def multihead_attention_ad(heads, q, k, v, mask=None, *, scale=None, is_causal=False):
    """Differentiable :func:`~hmath_dl.layers.multihead_attention` (no projections):
    head ``i`` computes ``softmax(q_i k_i^T / sqrt(D/h)) v_i``.

    Head ``i`` attends with feature columns ``[i D/h, (i+1) D/h)`` of ``q``/``k`` and
    ``[i F/h, (i+1) F/h)`` of ``v``; outputs concatenated in head order.  Gradients as in
    :func:`scaled_dot_product_attention_ad`, per head.

    The forward pass runs the plain layer's attention kernel on the same head-split
    arrays (so the numbers are those of ``multihead_attention``) and keeps the per-head
    weights for the backward pass; any invalid argument is handed to the plain layer,
    which raises its error.

    Parameters
    ----------
    heads : int
        ``h >= 1``, dividing both ``D`` and ``F``.
    q : ADTensor or array_like, ``[..., N, D]``
        A non-ADTensor argument is a constant; so for ``k`` and ``v``.
    k : ADTensor or array_like, ``[..., M, D]``
    v : ADTensor or array_like, ``[..., M, F]``
    mask : bool array_like ``[N, M]`` or ``[..., N, M]``, optional
        True = allowed, shared by all heads; not differentiated.
    scale, is_causal : keyword-only
        As for :func:`~hmath_dl.layers.multihead_attention`.

    Returns
    -------
    ADTensor ``[..., N, F]``

    Raises
    ------
    DomainError
        ``heads < 1``, or ``heads`` does not divide ``D`` or ``F``.
    ShapeError, NonFiniteError, NumericOverflow, TypeError
        As for :func:`~hmath_dl.layers.multihead_attention`; the message starts with
        ``multihead_attention_ad:``.
    """
    from .attention import _multihead
    out, weights = _multihead("multihead_attention", heads, q, k, v, mask, scale, is_causal)
    h = int(heads)
    return out, (weights, h, _backward_scale(scale, q.shape[-1] // h), 1)


@vjp_of(multihead_attention_ad, "attention")
@vjp_of(scaled_dot_product_attention_ad, "attention")
def _vjp_attention(g, node, needs):
    from .._kernels.attention import attention_backward
    q, k, v = node.parents
    weights, h, scale, groups = node.ctx
    kv, vv = k.value, v.value
    if groups > 1:   # grouped-query: every query head gets its key/value head
        kv, vv = np.repeat(kv, groups, axis=-3), np.repeat(vv, groups, axis=-3)
    n, d = q.shape[-2:]
    m, f = vv.shape[-2:]
    # [B, N, h*D] with head j in the feature columns [j*D/h, (j+1)*D/h): the kernel reads
    # and writes every head in place (heads=h), so there are no split or merge copies
    dq, dk, dv = np.empty(q.shape), np.empty(kv.shape), np.empty(vv.shape)
    if dq.size or dk.size:
        attention_backward(_c(q.value).reshape(-1, n, d), _c(kv).reshape(-1, m, d),
                           _c(vv).reshape(-1, m, f), weights.reshape(-1, n, m),
                           _c(g).reshape(-1, n, f), scale, dq.reshape(-1, n, d),
                           dk.reshape(-1, m, d), dv.reshape(-1, m, f), heads=h)
    if groups > 1:
        dk, dv = _sum_groups(dk, groups, k.shape), _sum_groups(dv, groups, v.shape)
    return dq, dk, dv


def _sum_groups(d, groups, shape):
    """``[..., Hk*groups, M, X] -> [..., Hk, M, X]``: the sum over each key/value head's
    query heads, in increasing order (elementwise adds, a fixed order)."""
    parts = d.reshape(shape[:-2] + (groups,) + shape[-2:])
    total = parts[..., 0, :, :].copy()
    for i in range(1, groups):
        total += parts[..., i, :, :]
    return total
