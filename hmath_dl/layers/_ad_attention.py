"""Differentiable attention layers (see :mod:`hmath_dl.layers.differentiable`)."""

from __future__ import annotations

import numpy as np

from .. import _checks
from ..autodiff.core import make_node, register_vjp
from ..errors import MathError
from ._ad_common import _ad, _c, _named


# =========================================================================== attention
def scaled_dot_product_attention_ad(q, k, v, mask=None):
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
    mask : bool array_like ``[N, M]`` or ``[..., N, M]``, optional
        True = allowed; not differentiated.  None allows every key.

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
    fname = "scaled_dot_product_attention_ad"
    q = _ad(fname, "q", q)
    k = _ad(fname, "k", k)
    v = _ad(fname, "v", v)
    with _named(fname):
        out, weights = scaled_dot_product_attention(q.value, k.value, v.value, mask)
    return make_node("attention", out, (q, k, v), (weights, 1))


def multihead_attention_ad(heads, q, k, v, mask=None):
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
    from .attention import multihead_attention
    fname = "multihead_attention_ad"
    q = _ad(fname, "q", q)
    k = _ad(fname, "k", k)
    v = _ad(fname, "v", v)
    prepared = _mha_prepare(fname, heads, q.value, k.value, v.value, mask)
    if prepared is not None:
        h, qs, ks, vs, mk = prepared
        from .._kernels.attention import attention_forward
        outs = np.empty(qs.shape[:2] + (vs.shape[2],))
        weights = np.empty((qs.shape[0], qs.shape[1], ks.shape[1]))
        status, _ = attention_forward(qs, ks, vs, mk, np.zeros((0, 0, 0)), outs, weights)
        if status == 0:
            return make_node("attention", _merge_heads(outs, h, q.shape[:-1] + (v.shape[-1],)),
                             (q, k, v), (weights, h))
    with _named(fname):  # raises the plain layer's error (or computes the value)
        out = multihead_attention(heads, q.value, k.value, v.value, mask)
    h = int(heads)
    weights = _head_weights(fname, h, q.value, k.value, v.value, mask)
    return make_node("attention", out, (q, k, v), (weights, h))


def _mha_prepare(fname, heads, q, k, v, mask):
    """Head-split inputs for the attention kernel, or None if anything is off (then the
    plain layer validates and raises)."""
    if isinstance(heads, (bool, np.bool_)) or not isinstance(heads, (int, np.integer)):
        return None
    h = int(heads)
    if h < 1 or q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        return None
    lead = q.shape[:-2]
    n, d = q.shape[-2:]
    m, f = v.shape[-2:]
    if k.shape != lead + (m, d) or v.shape[:-2] != lead or d == 0 or d % h or f % h:
        return None
    if q.size == 0 or k.size == 0 or v.size == 0:
        return None
    B = q.size // (n * d)
    if mask is None:
        mk = np.ones((0, 0, 0), dtype=np.bool_)
    else:
        try:
            mk = _checks.bool_array(fname, "mask", mask)
        except (MathError, TypeError):
            return None
        if mk.shape == (n, m):
            mk = mk.reshape(1, n, m)
        elif mk.shape == lead + (n, m):
            mk = mk.reshape(B, n, m)
        else:
            return None
    return h, _split_heads(q, h), _split_heads(k, h), _split_heads(v, h), mk


def _split_heads(a, h):
    """``[..., N, D] -> [B*h, N, D/h]`` (C-contiguous): the plain layer's own helper."""
    from .attention import _split_heads as split
    return split(a, h)


def _merge_heads(a, h, shape):
    """Inverse of :func:`_split_heads` to ``shape``."""
    bh, n, dh = a.shape
    b = bh // h
    return np.ascontiguousarray(a.reshape(b, h, n, dh).transpose(0, 2, 1, 3)).reshape(shape)


def _head_weights(fname, h, q, k, v, mask):
    from .._kernels.attention import attention_forward
    qs, ks, vs = _split_heads(q, h), _split_heads(k, h), _split_heads(v, h)
    B = qs.shape[0] // h
    n, m = q.shape[-2], k.shape[-2]
    if mask is None:
        mk = np.ones((0, 0, 0), dtype=np.bool_)
    else:
        mk = _checks.bool_array(fname, "mask", mask)
        mk = np.ascontiguousarray(np.broadcast_to(mk, q.shape[:-2] + (n, m))).reshape(B, n, m)
    out = np.empty(qs.shape[:2] + (vs.shape[2],))
    weights = np.empty((qs.shape[0], n, m))
    if weights.size:
        attention_forward(qs, ks, vs, mk, np.zeros((0, 0, 0)), out, weights)
    return weights


def _vjp_attention(g, node, needs):
    from .._kernels.backward import attention_backward
    q, k, v = node.parents
    weights, h = node.ctx
    if h == 1:
        n, d = q.shape[-2:]
        m, f = v.shape[-2:]
        qs, ks, vs = (a.value.reshape(-1, *a.shape[-2:]) for a in (q, k, v))
        gs = _c(g).reshape(-1, n, f)
        ps = weights.reshape(-1, n, m)
    else:
        qs, ks, vs = (_split_heads(a.value, h) for a in (q, k, v))
        gs = _split_heads(_c(g), h)
        ps = weights
        d = q.shape[-1] // h
    dq, dk, dv = np.empty(qs.shape), np.empty(ks.shape), np.empty(vs.shape)
    attention_backward(qs, ks, vs, ps, gs, 1.0 / np.sqrt(d), dq, dk, dv)
    if h == 1:
        return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
    return _merge_heads(dq, h, q.shape), _merge_heads(dk, h, k.shape), _merge_heads(dv, h, v.shape)


RULES = {
    "attention": _vjp_attention,
}
register_vjp(RULES)
