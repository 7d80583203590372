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
    from .._kernels.backward import attention_backward
    q, k, v = node.parents
    weights, h, scale, groups = node.ctx
    kv, vv = k.value, v.value
    if groups > 1:   # grouped-query: every query head gets its key/value head
        kv, vv = np.repeat(kv, groups, axis=-3), np.repeat(vv, groups, axis=-3)
    if h == 1:
        n = q.shape[-2]
        m, f = vv.shape[-2:]
        qs = q.value.reshape(-1, *q.shape[-2:])
        ks, vs = kv.reshape(-1, *kv.shape[-2:]), vv.reshape(-1, m, f)
        gs = _c(g).reshape(-1, n, f)
        ps = weights.reshape(-1, n, m)
    else:
        qs, ks, vs = _split_heads(q.value, h), _split_heads(kv, h), _split_heads(vv, h)
        gs = _split_heads(_c(g), h)
        ps = weights
    dq, dk, dv = np.empty(qs.shape), np.empty(ks.shape), np.empty(vs.shape)
    if dq.size or dk.size:
        attention_backward(qs, ks, vs, ps, gs, scale, dq, dk, dv)
    if h == 1:
        dq, dk, dv = dq.reshape(q.shape), dk.reshape(kv.shape), dv.reshape(vv.shape)
    else:
        dq, dk, dv = (_merge_heads(dq, h, q.shape), _merge_heads(dk, h, kv.shape),
                      _merge_heads(dv, h, vv.shape))
    if groups > 1:
        dk, dv = _sum_groups(dk, groups, k.shape), _sum_groups(dv, groups, v.shape)
    return dq, dk, dv


def _split_heads(a, h):
    """``[..., N, D] -> [B*h, N, D/h]`` (C-contiguous): the plain layer's own helper."""
    from .attention import _split_heads as split
    return split(a, h)


def _merge_heads(a, h, shape):
    """Inverse of :func:`_split_heads` to ``shape``."""
    bh, n, dh = a.shape
    b = bh // h
    return np.ascontiguousarray(a.reshape(b, h, n, dh).transpose(0, 2, 1, 3)).reshape(shape)


def _sum_groups(d, groups, shape):
    """``[..., Hk*groups, M, X] -> [..., Hk, M, X]``: the sum over each key/value head's
    query heads, in increasing order (elementwise adds, a fixed order)."""
    parts = d.reshape(shape[:-2] + (groups,) + shape[-2:])
    total = parts[..., 0, :, :].copy()
    for i in range(1, groups):
        total += parts[..., i, :, :]
    return total
