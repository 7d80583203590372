"""Differentiable layers: ADTensor in, ADTensor out.

Each ``*_ad`` function computes its forward value with the plain layer of
:mod:`hmath_dl.layers` (so the numbers are bit for bit those of the plain op) and records
one node of the :mod:`hmath_dl.autodiff` tape whose vector-Jacobian rule is a Numba
kernel: parallel over the gradient's own outputs, fixed summation orders, hence bitwise
identical for any thread count.  The rules of this module form its part of the one table
:data:`hmath_dl.autodiff.core.VJP_RULES` (see :data:`RULES` at the end).

Arguments that are not ADTensors (plain arrays) are treated as constants.  Errors raised
by the plain layer are re-raised with this function's name in front, e.g.
``dense_ad: dense: x has 3 input features, weights expect 4 ...``.

Dropout: either :func:`dropout_ad`, or by hand with the mask the plain layer returns::

    y, mask, rng = dropout(Mode.TRAINING, p, rng, x.value)
    y_ad = x * autodiff.constant(mask)        # same numbers as y; gradient g * mask
"""

from __future__ import annotations

import contextlib

import numpy as np

from .. import _checks
from .._kernels.gemm_f64 import matmul_nd
from ..autodiff.core import ADTensor, as_adtensor, make_node, register_vjp
from ..errors import MathError, ShapeError

__all__ = ["dense_ad", "convolution_ad", "transposed_convolution_ad", "layer_norm_ad",
           "rms_norm_ad", "batch_norm_ad", "pooling_ad", "embedding_ad", "dropout_ad",
           "scaled_dot_product_attention_ad", "multihead_attention_ad"]


@contextlib.contextmanager
def _named(fname):
    """Re-raise errors of a plain layer with ``fname`` in front of the message."""
    try:
        yield
    except MathError as exc:
        raise type(exc)(f"{fname}: {exc}") from None
    except TypeError as exc:
        raise TypeError(f"{fname}: {exc}") from None


def _ad(fname, name, x):
    return as_adtensor(fname, name, x)


def _opt_ad(fname, name, x):
    return None if x is None else as_adtensor(fname, name, x)


def _c(g):
    return np.ascontiguousarray(g, dtype=np.float64)


def _ro(a):
    """``a`` typed read-only for a kernel input (an O(1) view, never a copy): every call
    compiles to the same specialisation, and read-only tape values are not copied."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _w5(a):
    """Rank-5 view of a (writeable) kernel output: unit spatial axes after N, C."""
    return a.reshape(a.shape[:2] + (1,) * (5 - a.ndim) + a.shape[2:])


def _ro5(a):
    """Read-only rank-5 view of a kernel input."""
    return _ro(_w5(a))


def _tuple(value, r):
    if isinstance(value, (int, np.integer)):
        return (int(value),) * r
    t = tuple(int(v) for v in value)
    return t if len(t) == r else (t[0],) * r if len(t) == 1 else t


def _parents(*xs):
    return tuple(x for x in xs if x is not None)


# =========================================================================== dense
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
    fname = "dense_ad"
    x = _ad(fname, "x", x)
    w = _ad(fname, "w", w)
    bias = _opt_ad(fname, "bias", bias)
    with _named(fname):
        value = dense(x.value, w.value, None if bias is None else bias.value)
    return make_node("dense", value, _parents(x, w, bias))


def _vjp_dense(g, node, needs):
    x, w = node.parents[0], node.parents[1]
    out = w.shape[0]
    g2 = g.reshape(-1, out)
    gx = gw = gb = None
    if needs[0]:
        gx = matmul_nd(g2, w.value).reshape(x.shape)
    if needs[1]:
        gw = matmul_nd(g2.T, x.value.reshape(-1, w.shape[1]))
    if len(needs) > 2 and needs[2]:
        gb = g2.sum(axis=0)
    return (gx, gw, gb)[:len(needs)]


# =========================================================================== convolution
def _conv_geometry(options, r):
    s = _tuple(options.stride, r)
    p = _tuple(options.padding, r)
    d = _tuple(options.dilation, r)
    return s, p, d, int(getattr(options, "groups", 1))


def convolution_ad(options, x, w, bias):
    """Differentiable :func:`~hmath_dl.layers.convolution` (cross-correlation):
    ``y[n, co, o] = bias[co] + sum_{ci, k} w[co, ci, k] x[n, ci, o s - p + k d]``.

    1-3 spatial axes, groups (``ci`` runs over the group of ``co``), stride ``s``, zero
    padding ``p``, dilation ``d``; the forward numbers are those of the plain layer.

    Gradients: w.r.t. the input, the transposed convolution of ``g`` with ``w``; w.r.t.
    the weights, the correlation ``dw[co, ci, k] = sum_{n, o} g[n, co, o] x[n, ci, o s - p
    + k d]``; w.r.t. the bias, ``g`` summed over batch and spatial axes.

    Parameters
    ----------
    options : ConvOptions
        Stride, padding, dilation (one int per spatial axis) and groups.
    x : ADTensor or array_like, ``[N, Cin, *S]``
        A non-ADTensor argument is a constant (no gradient); so for ``w`` and ``bias``.
    w : ADTensor or array_like, ``[Cout, Cin/groups, *K]``
    bias : ADTensor or array_like of length ``Cout``, or None

    Returns
    -------
    ADTensor ``[N, Cout, *O]``
        ``O = floor((S + 2p - d(K-1) - 1)/s) + 1`` per axis.

    Raises
    ------
    TypeError, ShapeError, DomainError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.convolution` (bad options, shapes or groups, NaN/inf
        in a non-ADTensor argument, a non-finite result); the message starts with
        ``convolution_ad:``.  ``x`` or ``w`` None or a string: TypeError.
    """
    from .convolution import convolution
    fname = "convolution_ad"
    x = _ad(fname, "x", x)
    w = _ad(fname, "w", w)
    bias = _opt_ad(fname, "bias", bias)
    with _named(fname):
        value = convolution(options, x.value, w.value,
                            None if bias is None else bias.value)
    r = x.ndim - 2
    return make_node("convolution", value, _parents(x, w, bias), _conv_geometry(options, r))


def _conv_grads(x, w_shape, w, g, s, p, d, groups, need_x, need_w):
    """Gradients of ``y = conv(x, w)`` (stride ``s``, padding ``p``, dilation ``d``)
    w.r.t. ``x`` and ``w`` given ``g = dL/dy``, by unfolding (im2col):

    ``cols[(c, k), (n, o)] = x_pad[n, c, o s + k d]`` (a Numba copy kernel), then per group
    ``dw = G cols^T`` and ``dcols = W^T G`` (the library's GEMM: each entry one fma chain
    over ``(n, o)`` resp. ``co'`` in order, the same bits on every CPU), and ``dx = col2im(dcols)`` (a Numba kernel parallel over ``(n, c)``
    planes).  ``G [Cout, N*O]`` is ``g`` with channels first.
    """
    from .._kernels.backward import channels_first, col2im, im2col, sized
    from .._kernels.conv import _pad3
    r = x.ndim - 2
    xs = x.shape
    N, C = xs[0], xs[1]
    Cout = w_shape[0]
    Cg, Cog = C // groups, Cout // groups
    K = _pad3(w_shape[2:], 1)
    KK = K[0] * K[1] * K[2]
    O = _pad3(g.shape[2:], 1)
    P = O[0] * O[1] * O[2]
    s3, p3, d3 = _pad3(s, 1), _pad3(p, 0), _pad3(d, 1)
    geo = K + s3 + d3 + p3 + O
    G = np.empty((Cout, N * P))
    if G.size:
        sized(channels_first, G.size)(_ro(_c(g).reshape(N, Cout, P)), G)
    gx = gw = None
    if need_w:
        cols = np.empty((C * KK, N * P))
        if cols.size:
            sized(im2col, cols.size)(_ro5(x), *geo, cols)
        dw = np.empty((Cout, Cg * KK))
        for gi in range(groups):
            rows = slice(gi * Cog, (gi + 1) * Cog)
            dw[rows] = matmul_nd(G[rows], cols[gi * Cg * KK:(gi + 1) * Cg * KK].T)
        gw = dw.reshape(w_shape)
    if need_x:
        w2 = w.reshape(Cout, Cg * KK)
        if groups == 1:
            dcols = matmul_nd(w2.T, G)
        else:
            dcols = np.empty((C * KK, N * P))
            for gi in range(groups):
                rows = slice(gi * Cog, (gi + 1) * Cog)
                dcols[gi * Cg * KK:(gi + 1) * Cg * KK] = matmul_nd(w2[rows].T, G[rows])
        dx = np.empty(xs)
        if dx.size:
            sized(col2im, dcols.size)(_ro(_c(dcols)), *geo, _w5(dx))
        gx = dx
    return gx, gw


def _vjp_convolution(g, node, needs):
    x, w = node.parents[0], node.parents[1]
    s, p, d, groups = node.ctx
    gx, gw = _conv_grads(x.value, w.shape, w.value, g, s, p, d, groups, needs[0], needs[1])
    gb = None
    if len(needs) > 2 and needs[2]:
        gb = g.sum(axis=(0,) + tuple(range(2, g.ndim)))
    return (gx, gw, gb)[:len(needs)]


def transposed_convolution_ad(output_padding, options, x, w, bias):
    """Differentiable :func:`~hmath_dl.layers.transposed_convolution`, the adjoint of
    convolution: ``y[n, co, i s - p + k d] += x[n, ci, i] w[ci, co, k]``, plus ``bias[co]``.

    Gradients: w.r.t. the input, the forward convolution of ``g`` with ``w``; w.r.t. the
    weights, ``dw[ci, co, k] = sum_{n, i} x[n, ci, i] g[n, co, i s - p + k d]``; w.r.t.
    the bias, ``g`` summed over batch and spatial axes.

    Parameters
    ----------
    output_padding : int or tuple of int
        Extra size at the end of each spatial axis, ``0 <= output_padding < stride``.
    options : ConvOptions
        Stride, padding, dilation (one int per spatial axis) and groups.
    x : ADTensor or array_like, ``[N, Cin, *S]``
        A non-ADTensor argument is a constant (no gradient); so for ``w`` and ``bias``.
    w : ADTensor or array_like, ``[Cin, Cout/groups, *K]``
    bias : ADTensor or array_like of length ``Cout``, or None

    Returns
    -------
    ADTensor ``[N, Cout, *O]``
        ``O = (S-1)s - 2p + d(K-1) + output_padding + 1`` per axis.

    Raises
    ------
    TypeError, ShapeError, DomainError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.transposed_convolution`; the message starts with
        ``transposed_convolution_ad:``.  ``x`` or ``w`` None or a string: TypeError.
    """
    from .convolution import transposed_convolution
    fname = "transposed_convolution_ad"
    x = _ad(fname, "x", x)
    w = _ad(fname, "w", w)
    bias = _opt_ad(fname, "bias", bias)
    with _named(fname):
        value = transposed_convolution(output_padding, options, x.value, w.value,
                                       None if bias is None else bias.value)
    r = x.ndim - 2
    return make_node("transposed_convolution", value, _parents(x, w, bias),
                     _conv_geometry(options, r))


def _vjp_transposed_convolution(g, node, needs):
    # y = conv^T(x, w): x plays the role of a convolution's output and y of its input, so
    # dx = conv(g, w) and dw is the weight gradient of conv(g -> x-shaped) with cotangent x.
    from .._kernels.conv import conv_nd
    x, w = node.parents[0], node.parents[1]
    s, p, d, groups = node.ctx
    g = _c(g)
    gx = gw = gb = None
    if needs[0]:
        gx = conv_nd(g, w.value, None, s, p, d, groups)
    if needs[1]:
        _, gw = _conv_grads(g, w.shape, w.value, x.value, s, p, d, groups, False, True)
    if len(needs) > 2 and needs[2]:
        gb = g.sum(axis=(0,) + tuple(range(2, g.ndim)))
    return (gx, gw, gb)[:len(needs)]


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


# =========================================================================== norms
def layer_norm_ad(axes, epsilon, x):
    """Differentiable :func:`~hmath_dl.layers.layer_norm`: ``y = (x - mean) / sqrt(var + epsilon)``
    over the last ``axes`` axes (population variance), per index of the leading axes.

    With ``r = 1/sqrt(var + epsilon)`` per row and ``y`` the output:
    ``dx = r (g - mean(g) - y mean(g y))`` (means over the normalised axes).

    Parameters
    ----------
    axes : int
        ``1 <= axes <= x.ndim``.
    epsilon : float
        Finite, ``> 0``.
    x : ADTensor or array_like
        A non-ADTensor is a constant.

    Returns
    -------
    ADTensor
        Same shape as ``x``.

    Raises
    ------
    DomainError
        ``axes`` or ``epsilon`` out of range.
    TypeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.layer_norm`; the message starts with
        ``layer_norm_ad:``.
    """
    from .normalization import layer_norm
    fname = "layer_norm_ad"
    x = _ad(fname, "x", x)
    with _named(fname):
        value = layer_norm(axes, epsilon, x.value)
    return make_node("layer_norm", value, (x,), (int(axes), float(epsilon), True))


def rms_norm_ad(axes, epsilon, x):
    """Differentiable :func:`~hmath_dl.layers.rms_norm`: ``y = x / sqrt(mean(x^2) + epsilon)``
    over the last ``axes`` axes, per index of the leading axes.

    With ``r = 1/sqrt(mean(x^2) + epsilon)`` and ``y`` the output:
    ``dx = r (g - y mean(g y))``.

    Parameters
    ----------
    axes : int
        ``1 <= axes <= x.ndim``.
    epsilon : float
        Finite, ``> 0``.
    x : ADTensor or array_like
        A non-ADTensor is a constant.

    Returns
    -------
    ADTensor
        Same shape as ``x``.

    Raises
    ------
    DomainError
        ``axes`` or ``epsilon`` out of range.
    TypeError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.rms_norm`; the message starts with ``rms_norm_ad:``.
    """
    from .normalization import rms_norm
    fname = "rms_norm_ad"
    x = _ad(fname, "x", x)
    with _named(fname):
        value = rms_norm(axes, epsilon, x.value)
    return make_node("layer_norm", value, (x,), (int(axes), float(epsilon), False))


def _vjp_layer_norm(g, node, needs):
    from .._kernels.backward import norm_rows_backward, sized
    x = node.parents[0]
    axes, eps, center = node.ctx
    n = 1
    for s_ in x.shape[x.ndim - axes:]:
        n *= s_
    dx = np.empty(x.shape)
    if dx.size:
        rows = x.size // n
        fn = sized(norm_rows_backward, x.size)
        fn(x.value.reshape(-1), node.value.reshape(-1), _c(g).reshape(-1), rows, n, eps, center,
           dx.reshape(-1))
    return (dx,)


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
    fname = "batch_norm_ad"
    x = _ad(fname, "x", x)
    gamma = _ad(fname, "gamma", gamma)
    beta = _ad(fname, "beta", beta)
    with _named(fname):
        value, new_state = batch_norm(mode, momentum, epsilon, gamma.value, beta.value, state,
                                      x.value)
    training = mode is Mode.TRAINING
    ctx = (float(epsilon), training, state.running_mean, state.running_variance)
    return make_node("batch_norm", value, (x, gamma, beta), ctx), new_state


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


# =========================================================================== embedding
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
    fname = "embedding_ad"
    weights = _ad(fname, "weights", weights)
    with _named(fname):
        value = embedding(weights.value, indices)
        idx = _checks.int_array(fname, "indices", indices)
    return make_node("embedding", value, (weights,), idx.reshape(-1))


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
    fname = "dropout_ad"
    x = _ad(fname, "x", x)
    with _named(fname):
        value, mask, new_rng = dropout(mode, p, rng, x.value)
    return make_node("dropout", value, (x,), mask), mask, new_rng


def _vjp_dropout(g, node, needs):
    return (g * node.ctx,)


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


# =========================================================================== the table
RULES = {
    "dense": _vjp_dense,
    "convolution": _vjp_convolution,
    "transposed_convolution": _vjp_transposed_convolution,
    "pooling": _vjp_pooling,
    "layer_norm": _vjp_layer_norm,
    "batch_norm": _vjp_batch_norm,
    "embedding": _vjp_embedding,
    "dropout": _vjp_dropout,
    "attention": _vjp_attention,
}
register_vjp(RULES)
