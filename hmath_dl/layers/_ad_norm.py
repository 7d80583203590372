"""Differentiable normalisation layers (see :mod:`hmath_dl.layers.differentiable`)."""

from __future__ import annotations

import numpy as np

from ..autodiff.core import _frozen, make_node, vjp_of
from .. import _checks
from .._kernels.views import readonly
from ._ad_common import _ad, _c, _named, _opt_ad, differentiable


# =========================================================================== norms
def _affine_node(xh, y, weight, bias, layout, bshape):
    """Record ``y = (xhat * weight[c]) + bias[c]`` (group / instance norm) on the tape.

    ``xh`` is the ADTensor of the normalised value, ``y`` the plain layer's affine result
    (so the forward numbers are the plain layer's by construction); ``weight``/``bias``
    ADTensors of shape ``(C,)`` or None, broadcast against ``x`` as ``bshape``
    (``(C, 1, ..., 1)``); ``layout = (N, C, S)``."""
    if weight is None and bias is None:
        return xh
    return make_node(_affine_node, y, (xh, weight, bias), (layout, bshape))


@vjp_of(_affine_node, "norm_affine")
def _vjp_norm_affine(g, node, needs):
    """``dxhat = g * weight[c]``; ``dweight = sum g xhat``, ``dbias = sum g`` over ``N``
    and the spatial positions, by :func:`.._kernels.norm_affine.affine_grads_channel`."""
    from .._kernels.norm import LANES
    from .._kernels.norm_affine import affine_grads_channel
    layout, bshape = node.ctx
    xh, w, b = node.parents
    g = _c(g)
    gx = dw = db = None
    if needs[0]:
        gx = g if w is None else g * w.value.reshape(bshape)
    if needs[1] or needs[2]:
        N, C, S = layout
        dw = np.zeros(C)
        db = np.zeros(C)
        if g.size:
            affine_grads_channel.sized(g.size)(g.reshape(-1), _c(xh.value).reshape(-1), N, C,
                                               S, LANES, dw, db)
        dw = None if w is None else dw.reshape(w.shape)
        db = None if b is None else db.reshape(b.shape)
    return gx, dw, db


def _normalized(fname, op, plain, x, weight, bias, ctx_of, pair=None, channels=None):
    """The norms' common path.  ``x``, ``weight``, ``bias`` are converted in that order;
    ``plain(x)`` and ``plain(x, weight, bias)`` are the plain layer without and with its
    affine map (errors prefixed with ``fname``); ``ctx_of(x value)`` is the ctx ``(n,
    epsilon, centered)`` of the normalisation's node.

    Without a weight or a bias: one node ``xhat`` (op ``op``, parent ``x``).

    Layer / RMS norm (``pair(x, weight, bias)``: the plain layer's result and its
    ``xhat`` from one kernel pass): one node of op ``op`` records both maps (parents
    ``x``, ``weight``, ``bias``; ``xhat`` appended to its ctx), and one backward kernel
    gives ``dx`` (:func:`_vjp_norm_rows`).

    Group / instance norm (``channels(x value) = (layout, bshape)``, per-channel
    parameters): the node ``xhat`` and the affine node after it (:func:`_affine_node`)."""
    x = _ad(fname, "x", x)
    weight, bias = _opt_ad(fname, "weight", weight), _opt_ad(fname, "bias", bias)
    affine = weight is not None or bias is not None
    if affine and pair is not None:
        with _named(fname):
            y, xhat = pair(x.value, *(None if t is None else t.value for t in (weight, bias)))
        return make_node(op, y, (x, weight, bias), ctx_of(x.value) + (_frozen(xhat),))
    with _named(fname):
        value = plain(x.value)
    node = make_node(op, value, (x,), ctx_of(x.value))
    if not affine:
        return node
    layout, bshape = channels(x.value)
    y = None
    # the plain layer's affine result is ``(xhat * weight) + bias`` with xhat bitwise
    # ``value`` (two roundings, never a fused multiply-add): numpy's broadcast product and
    # sum over ``value`` give those bits without normalising x a second time; the plain
    # layer runs only when a parameter's shape is wrong or a result is not finite, to
    # raise its own error
    if all(t is None or t.shape == (layout[1],) for t in (weight, bias)):
        with np.errstate(over="ignore", invalid="ignore"):   # checked just below
            y = value if weight is None else value * weight.value.reshape(bshape)
            if bias is not None:
                y = y + bias.value.reshape(bshape)
        if not _checks.is_finite(y):
            y = None
    if y is None:
        with _named(fname):     # raises its error (or, if it does not, is the result)
            y = plain(x.value, *(None if t is None else t.value for t in (weight, bias)))
    return _affine_node(node, y, weight, bias, layout, bshape)


def _rows(x, axes, epsilon, center):
    """Layer / RMS norm: the ctx of rows over the last ``axes`` axes."""
    return (_size(x.shape[x.ndim - int(axes):]), float(epsilon), center)


def _channel_rows(x, epsilon, groups=None):
    """Group / instance norm (``groups`` None): the ctx of rows of ``C / groups``
    channels (one) and all spatial positions."""
    c, S = x.shape[1], _size(x.shape[2:])
    return ((c // int(groups) if groups is not None else 1) * S, float(epsilon), True)


def _channels(x):
    """Group / instance norm: the affine layout ``((N, C, S), bshape)``, parameters per
    channel."""
    N, c, S = x.shape[0], x.shape[1], _size(x.shape[2:])
    return (N, c, S), (c,) + (1,) * (x.ndim - 2)


def layer_norm_ad(axes, epsilon, x, *, weight=None, bias=None):
    """Differentiable :func:`~hmath_dl.layers.layer_norm`:
    ``y = (xhat * weight) + bias``, ``xhat = (x - mean) / sqrt(var + epsilon)`` over the
    last ``axes`` axes (population variance), per index of the leading axes.

    With ``r = 1/sqrt(var + epsilon)`` per row and ``gh = g * weight`` (``g`` without a
    weight): ``dx = r (gh - mean(gh) - xhat mean(gh xhat))`` (means over the normalised
    axes); ``dweight = sum g xhat`` and ``dbias = sum g`` over the leading axes (rows in
    increasing order).

    Parameters
    ----------
    axes : int
        ``1 <= axes <= x.ndim``.
    epsilon : float
        Finite, ``> 0``.
    x : ADTensor or array_like
        A non-ADTensor is a constant.  An empty batch (leading axes) gives an empty result
        (and zero ``weight``/``bias`` gradients).
    weight, bias : ADTensor or array_like, optional, keyword-only
        Exactly of shape ``x.shape[-axes:]``; a non-ADTensor is a constant.

    Returns
    -------
    ADTensor
        Same shape as ``x``; its value is bitwise
        ``layer_norm(axes, epsilon, x, weight=weight, bias=bias)``.

    Raises
    ------
    DomainError
        ``axes`` or ``epsilon`` out of range.
    ShapeError, TypeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.layer_norm`; the message starts with
        ``layer_norm_ad:``.
    """
    from .normalization import _trailing, layer_norm
    return _normalized("layer_norm_ad", layer_norm_ad,
                       lambda x, w=None, b=None: layer_norm(axes, epsilon, x, weight=w, bias=b),
                       x, weight, bias, lambda x: _rows(x, axes, epsilon, True),
                       lambda x, w, b: _trailing("layer_norm", axes, epsilon, x, True, w, b,
                                                 keep=True))


def rms_norm_ad(axes, epsilon, x, *, weight=None):
    """Differentiable :func:`~hmath_dl.layers.rms_norm`:
    ``y = xhat * weight``, ``xhat = x / sqrt(mean(x^2) + epsilon)`` over the last ``axes``
    axes, per index of the leading axes.

    With ``r = 1/sqrt(mean(x^2) + epsilon)`` and ``gh = g * weight`` (``g`` without a
    weight): ``dx = r (gh - xhat mean(gh xhat))``; ``dweight = sum g xhat`` over the
    leading axes.

    Parameters
    ----------
    axes : int
        ``1 <= axes <= x.ndim``.
    epsilon : float
        Finite, ``> 0``.
    x : ADTensor or array_like
        A non-ADTensor is a constant.  An empty batch gives an empty result.
    weight : ADTensor or array_like, optional, keyword-only
        Exactly of shape ``x.shape[-axes:]``; a non-ADTensor is a constant.

    Returns
    -------
    ADTensor
        Same shape as ``x``; its value is bitwise ``rms_norm(axes, epsilon, x, weight=weight)``.

    Raises
    ------
    DomainError
        ``axes`` or ``epsilon`` out of range.
    ShapeError, TypeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.rms_norm`; the message starts with ``rms_norm_ad:``.
    """
    from .normalization import _trailing, rms_norm
    return _normalized("rms_norm_ad", rms_norm_ad,
                       lambda x, w=None, b=None: rms_norm(axes, epsilon, x, weight=w),
                       x, weight, None, lambda x: _rows(x, axes, epsilon, False),
                       lambda x, w, b: _trailing("rms_norm", axes, epsilon, x, False, w, b,
                                                 keep=True))


def _size(shape):
    n = 1
    for s_ in shape:
        n *= int(s_)
    return n


def group_norm_ad(groups, epsilon, x, *, weight=None, bias=None):
    """Differentiable :func:`~hmath_dl.layers.group_norm`:
    ``y = (xhat * weight[c]) + bias[c]``, ``xhat = (x - mean) / sqrt(var + epsilon)`` with
    mean and population variance over each group's ``C / groups`` channels and all
    spatial positions, per ``n``.

    The groups are the rows ``[N * groups, (C / groups) * prod(spatial)]`` of ``x``; with
    ``r = 1/sqrt(var + epsilon)`` per row and ``gh = g * weight[c]``:
    ``dx = r (gh - mean(gh) - xhat mean(gh xhat))`` (means over the row);
    ``dweight[c] = sum g xhat`` and ``dbias[c] = sum g`` over ``N`` and the spatial axes.

    Parameters
    ----------
    groups : int
        ``>= 1``, dividing C.
    epsilon : float
        Finite, ``> 0``.
    x : ADTensor or array_like, ``[N, C, *spatial]`` (``[N, C]`` allowed)
        A non-ADTensor is a constant.  ``N == 0`` gives an empty result.
    weight, bias : ADTensor or array_like of shape ``(C,)``, optional, keyword-only
        A non-ADTensor is a constant.

    Returns
    -------
    ADTensor
        Same shape as ``x``; its value is bitwise
        ``group_norm(groups, epsilon, x, weight=weight, bias=bias)``.

    Raises
    ------
    DomainError, ShapeError, TypeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.group_norm`; the message starts with
        ``group_norm_ad:``.
    """
    from .normalization import group_norm
    return _normalized("group_norm_ad", group_norm_ad,
                       lambda x, w=None, b=None: group_norm(groups, epsilon, x, weight=w, bias=b),
                       x, weight, bias, lambda x: _channel_rows(x, epsilon, groups),
                       channels=_channels)


def instance_norm_ad(epsilon, x, *, weight=None, bias=None):
    """Differentiable :func:`~hmath_dl.layers.instance_norm`:
    ``y = (xhat * weight[c]) + bias[c]``, ``xhat = (x - mean) / sqrt(var + epsilon)`` with
    mean and population variance over the spatial axes, per ``(n, c)``.

    The planes are the rows ``[N * C, prod(spatial)]``; with ``r = 1/sqrt(var + epsilon)``
    and ``gh = g * weight[c]``: ``dx = r (gh - mean(gh) - xhat mean(gh xhat))``;
    ``dweight[c] = sum g xhat``, ``dbias[c] = sum g`` over ``N`` and the spatial axes.

    Parameters
    ----------
    epsilon : float
        Finite, ``> 0``.
    x : ADTensor or array_like, ``[N, C, *spatial]`` (at least one spatial axis)
        A non-ADTensor is a constant.  ``N == 0`` gives an empty result.
    weight, bias : ADTensor or array_like of shape ``(C,)``, optional, keyword-only
        A non-ADTensor is a constant.

    Returns
    -------
    ADTensor
        Same shape as ``x``; its value is bitwise
        ``instance_norm(epsilon, x, weight=weight, bias=bias)``.

    Raises
    ------
    DomainError, ShapeError, TypeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.instance_norm`; the message starts with
        ``instance_norm_ad:``.
    """
    from .normalization import instance_norm
    return _normalized("instance_norm_ad", instance_norm_ad,
                       lambda x, w=None, b=None: instance_norm(epsilon, x, weight=w, bias=b),
                       x, weight, bias, lambda x: _channel_rows(x, epsilon),
                       channels=_channels)


@vjp_of(instance_norm_ad, "norm_rows")
@vjp_of(group_norm_ad, "norm_rows")
@vjp_of(rms_norm_ad, "layer_norm")
@vjp_of(layer_norm_ad)
def _vjp_norm_rows(g, node, needs):
    """``dx`` of a normalisation over rows of length ``n`` (the ctx ``(n, epsilon,
    centered)``): layer norm, RMS norm (not centered), group and instance norm; for a
    layer / RMS norm node with its affine map (parents ``x``, ``weight``, ``bias``; ctx
    ``(n, epsilon, centered, xhat)``) also ``dweight`` and ``dbias``: ``dx`` with
    ``gh = g * weight`` formed inside the kernel (the same roundings as forming it
    first), the parameters' sums by :func:`.._kernels.norm_affine.affine_grads_elem`."""
    from .._kernels.backward import norm_rows_backward
    x = node.parents[0]
    n, eps, center = node.ctx[:3]
    g = _c(g)
    if len(node.parents) == 1:
        xhat, w = node.value, None
    else:
        xhat, w = node.ctx[3], node.parents[1]
    dx = dw = db = None
    if needs[0]:
        dx = np.empty(x.shape)
        if dx.size:
            wk = readonly(np.ones(n) if w is None else w.value.reshape(-1))
            fn = norm_rows_backward.sized(x.size)
            fn(x.value.reshape(-1), xhat.reshape(-1), g.reshape(-1), wk, x.size // n, n, eps,
               center, dx.reshape(-1))
    if len(node.parents) == 1:
        return (dx,)
    from .._kernels.norm_affine import affine_grads_elem
    b = node.parents[2]
    if needs[1] or needs[2]:
        dw, db = np.zeros(n), np.zeros(n)
        if g.size:
            affine_grads_elem.sized(g.size)(g.reshape(-1), xhat.reshape(-1), g.size // n, n,
                                            dw, db)
    dw = None if w is None or not needs[1] else dw.reshape(w.shape)
    db = None if b is None or not needs[2] else db.reshape(b.shape)
    return dx, dw, db


@differentiable("magnitudes", "w")
def weight_norm_ad(axis, magnitudes, w):
    """Differentiable :func:`~hmath_dl.layers.weight_norm`:
    ``y[i] = magnitudes[i] * w[i] / ||w[i]||`` for every slice ``i`` along ``axis``.

    With ``u = w[i] / ||w[i]||``: ``dmagnitudes[i] = sum(g[i] u)`` and
    ``dw[i] = magnitudes[i] / ||w[i]|| * (g[i] - u sum(g[i] u))`` (sums over the slice;
    the norm with the forward's exact power-of-two scaling, so no overflow in the squares).

    Parameters
    ----------
    axis : int
        In ``[-w.ndim, w.ndim)``.
    magnitudes : ADTensor or array_like, length ``w.shape[axis]``
        A non-ADTensor is a constant.
    w : ADTensor or array_like, at least 1 axis
        A non-ADTensor is a constant.

    Returns
    -------
    ADTensor
        Same shape as ``w``; its value is bitwise ``weight_norm(axis, magnitudes, w)``.

    Raises
    ------
    DomainError, ShapeError, TypeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.weight_norm` (an all-zero slice: DomainError); the
        message starts with ``weight_norm_ad:``.  A gradient beyond the float64 range
        raises NumericOverflow when gradients are computed.
    """
    from .normalization import weight_norm
    return weight_norm(axis, magnitudes, w), (int(axis) % w.ndim,)


@vjp_of(weight_norm_ad)
def _vjp_weight_norm(g, node, needs):
    from .._kernels.norm_affine import weight_norm_backward
    mags, w = node.parents
    (ax,) = node.ctx
    a = w.shape[ax]
    dw = np.zeros(w.shape)
    dm = np.zeros(a)
    if w.size:
        p = _size(w.shape[:ax])
        q = _size(w.shape[ax + 1:])
        status = np.zeros(a, dtype=np.int8)
        weight_norm_backward.sized(w.size)(_c(w.value).reshape(-1), _c(g).reshape(-1), p, a,
                                           q, _c(mags.value), dw.reshape(-1), dm, status)
        _checks.finish("weight_norm_ad", status,
                       overflow=lambda i, code: (f"gradient is not finite for slice {i} "
                                                 f"(beyond the float64 range)"))
    return (dm, dw)


@differentiable("x", "gamma", "beta")
def batch_norm_ad(mode, momentum, epsilon, gamma, beta, state, x):
    """Differentiable :func:`~hmath_dl.layers.batch_norm`:
    ``y = gamma * (x - mean) / sqrt(var + epsilon) + beta`` per channel.

    TRAINING (batch statistics, ``m = N * prod(spatial)`` values per channel,
    ``xh = (x - mean) r``, ``r = 1/sqrt(var + epsilon)``): ``dbeta = sum g``,
    ``dgamma = sum g xh``, ``dx = gamma r (g - dbeta/m - xh dgamma/m)``.
    INFERENCE (running statistics are constants): ``dx = gamma r g``.

    Parameters
    ----------
    mode : Mode
        TRAINING (batch statistics, state updated) or INFERENCE (running statistics).
    momentum : float
        In ``[0, 1]``; weight of the batch statistic in the running update.
    epsilon : float
        Finite, ``> 0``.
    gamma, beta : ADTensor or array_like of length ``C``
        Scale and shift; a non-ADTensor is a constant.
    state : BatchNormState
        Running mean and variance (length ``C``).
    x : ADTensor or array_like, ``[N, C]`` or ``[N, C, *spatial]``

    Returns
    -------
    (ADTensor, BatchNormState)
        ``y`` (same shape as ``x``) and the plain layer's new state (unchanged in INFERENCE).

    Raises
    ------
    TypeError, DomainError, ShapeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.batch_norm`; the message starts with
        ``batch_norm_ad:``.  ``gamma``, ``beta`` or ``x`` None or a string: TypeError.
    """
    from .dropout import Mode
    from .normalization import batch_norm
    value, new_state = batch_norm(mode, momentum, epsilon, gamma, beta, state, x)
    ctx = (float(epsilon), mode is Mode.TRAINING, state.running_mean, state.running_variance)
    return value, ctx, new_state


@vjp_of(batch_norm_ad)
def _vjp_batch_norm(g, node, needs):
    from .._kernels.backward import batch_norm_backward
    x, gamma, _ = node.parents
    eps, training, rm, rv = node.ctx
    N, C = x.shape[0], x.shape[1]
    S = x.size // (N * C) if N * C else 0
    dx = np.empty(x.shape)
    dgamma = np.zeros(C)
    dbeta = np.zeros(C)
    if x.size:
        batch_norm_backward(x.value.reshape(-1), _c(g).reshape(-1), N, C, S, eps, gamma.value,
                            training, _c(rm), _c(rv), dx.reshape(-1), dgamma, dbeta)
    return (dx, dgamma, dbeta)
