"""Differentiable convolutions (see :mod:`hmath_dl.layers.differentiable`):
:func:`convolution_ad`, :func:`depthwise_convolution_ad`, :func:`transposed_convolution_ad`.

The gradients come from :func:`_conv_grads` (unfolding, the library's GEMM and
``col2im``; the weight gradient of :mod:`hmath_dl._kernels.conv_wgrad` where
it applies) and, for the input of a transposed convolution, the forward convolution
kernel: fixed summation orders, the same bits for any thread count.
"""

from __future__ import annotations

import functools

import numpy as np

from .._kernels import conv_batch, conv_wgrad
from .._kernels._cpu import machine
from .._kernels.backward import channels_first, col2im, im2col
from .._kernels.gemm_f64 import matmul_nd
from .._kernels.reduce import sum_to
from ..autodiff.core import vjp_of
from .._kernels.views import out5, pad3, readonly, readonly5
from ._ad_common import UNBATCHED, _c, differentiable

__all__ = ["convolution_ad", "depthwise_convolution_ad", "transposed_convolution_ad"]


# =========================================================================== convolution
def _conv_geometry(fname, options, r, kernel, groups=None):
    """``(stride, symmetric padding, dilation, groups, crop)`` as the plain layer runs them
    (options already validated by it; see ``convolution._per_axis`` for ``crop``)."""
    from .convolution import _per_axis
    s, p, d, crop = _per_axis(fname, options, r, kernel)
    return s, p, d, int(options.groups if groups is None else groups), crop


def _uncrop(g, crop):
    """The cotangent of a cropped output (``"same"`` padding with an odd total): ``g``
    placed after ``crop[a]`` zeros on every spatial axis."""
    if not any(crop):
        return g
    full = np.zeros(g.shape[:2] + tuple(n + c for n, c in zip(g.shape[2:], crop)))
    full[(slice(None), slice(None)) + tuple(slice(c, None) for c in crop)] = g
    return full


@differentiable("x", "w", optional="bias")
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
    value = convolution(options, x, w, bias)
    if x.ndim == w.ndim - 1:
        return UNBATCHED
    return value, _conv_geometry("convolution_ad", options, x.ndim - 2, w.shape[2:])


@differentiable("x", "w", optional="bias")
def depthwise_convolution_ad(options, x, w, bias):
    """Differentiable :func:`~hmath_dl.layers.depthwise_convolution`: :func:`convolution_ad`
    with ``groups = Cin`` and ``w [Cin*m, 1, *K]``,
    ``y[n, co, o] = bias[co] + sum_k w[co, 0, k] x[n, co // m, o s - p + k d]``.

    Parameters
    ----------
    options : ConvOptions
        Stride, padding (ints, ``"valid"`` or ``"same"``), dilation; ``options.groups``
        1 or Cin.
    x : ADTensor or array_like, ``[N, Cin, *S]`` or unbatched ``[Cin, *S]``
        A non-ADTensor argument is a constant (no gradient); so for ``w`` and ``bias``.
    w : ADTensor or array_like, ``[Cin*m, 1, *K]``
    bias : ADTensor or array_like of length ``Cin*m``, or None

    Returns
    -------
    ADTensor ``[N, Cin*m, *O]`` (``[Cin*m, *O]`` unbatched)
        Forward numbers those of the plain layer; gradients as for :func:`convolution_ad`.

    Raises
    ------
    TypeError, ShapeError, DomainError, NonFiniteError, NumericOverflow
        As for :func:`~hmath_dl.layers.depthwise_convolution`; the message starts with
        ``depthwise_convolution_ad:``.
    """
    from .convolution import depthwise_convolution
    value = depthwise_convolution(options, x, w, bias)
    if x.ndim == w.ndim - 1:
        return UNBATCHED
    return value, _conv_geometry("depthwise_convolution_ad", options, x.ndim - 2, w.shape[2:],
                                 groups=x.shape[1])


@vjp_of(depthwise_convolution_ad, "convolution")
@vjp_of(convolution_ad)
def _vjp_convolution(g, node, needs):
    x, w = node.parents[0], node.parents[1]
    s, p, d, groups, crop = node.ctx
    g = _uncrop(g, crop)
    gb = np.empty(g.shape[1]) if needs[2] else None
    gx, gw, summed = _conv_grads(x.value, w.shape, w.value, g, s, p, d, groups, needs[0],
                                 needs[1], gb)
    if needs[2] and not summed:
        gb = sum_to(g, (False, True) + (False,) * (g.ndim - 2))
    return gx, gw, gb


def _conv_grads(x, w_shape, w, g, s, p, d, groups, need_x, need_w, gb=None):
    """Gradients of ``y = conv(x, w)`` (stride ``s``, padding ``p``, dilation ``d``)
    w.r.t. ``x`` and ``w`` given ``g = dL/dy``, by unfolding (im2col):

    ``cols[(c, k), (n, o)] = x_pad[n, c, o s + k d]`` (a Numba copy kernel), then per group
    ``dw = G cols^T`` and ``dcols = W^T G`` (the library's GEMM: each entry one fma chain
    over ``(n, o)`` resp. ``co'`` in order, the same bits on every CPU), and ``dx = col2im(dcols)`` (a Numba kernel parallel over ``(n, c)``
    planes).  ``G [Cout, N*O]`` is ``g`` with channels first.  On small planes the input
    gradient runs :func:`hmath_dl._kernels.conv_batch.input_gradient` instead (the same
    bits).  Returns ``(gx, gw, summed)``: with an array ``gb [Cout]`` given, ``summed``
    says whether it now holds the bias gradient (``g`` summed to ``[Cout]``: ``sum_to``'s
    bits), computed while ``G`` was copied; otherwise the caller sums.
    """
    xs = x.shape
    N, C, Cout, Cg, Cog, KK, P, geo, batch_dx, wgrad = _grad_plan(
        xs, tuple(w_shape), g.shape, tuple(s), tuple(p), tuple(d), groups, need_x,
        machine().tiled)
    G = np.empty((Cout, N * P))
    summed = False
    if G.size and (need_w or not batch_dx):
        summed = gb is not None and P > 1
        channels_first.sized(G.size)(readonly(_c(g).reshape(N, Cout, P)), G,
                                     gb if summed else _NO_SUMS)
    gx = gw = None
    if need_w and wgrad:
        dw = np.empty((Cout, Cg * KK))
        gw = conv_wgrad.weight_gradient(readonly5(x), G, Cout, Cg, groups, geo, dw).reshape(
            w_shape)
    elif need_w:
        cols = np.empty((C * KK, N * P))
        if cols.size:
            im2col.sized(cols.size)(readonly5(x), *geo, cols)
        dw = np.empty((Cout, Cg * KK))
        for gi in range(groups):
            rows = slice(gi * Cog, (gi + 1) * Cog)
            dw[rows] = matmul_nd(G[rows], cols[gi * Cg * KK:(gi + 1) * Cg * KK].T)
        gw = dw.reshape(w_shape)
    if batch_dx:
        # small planes: W^T G on batch-minor columns, folded back in runs of N (the same
        # chains and the same order of the fold's additions: the same bits)
        dx = np.empty(xs)
        conv_batch.input_gradient(_c(g).reshape(N, Cout, P), _c(w), groups, geo, out5(dx))
        gx = dx
    elif need_x:
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
            col2im.sized(dcols.size)(readonly(_c(dcols)), *geo, out5(dx))
        gx = dx
    return gx, gw, summed


_NO_SUMS = np.empty(0)


@functools.lru_cache(maxsize=256)
def _grad_plan(xs, w_shape, gshape, s, p, d, groups, need_x, tiled):
    """What :func:`_conv_grads` decides from the shapes alone (remembered: a training loop
    repeats them): ``(N, C, Cout, Cg, Cog, KK, P, geo, batch_dx, wgrad)`` -- ``geo`` the
    kernels' geometry ``K + s + d + p + O`` (3 axes each), ``batch_dx`` whether the input
    gradient runs on the batch-minor layout, ``wgrad`` whether the weight gradient is
    :func:`~hmath_dl._kernels.conv_wgrad.weight_gradient`."""
    N, C = xs[0], xs[1]
    Cout = w_shape[0]
    Cg, Cog = C // groups, Cout // groups
    K = pad3(w_shape[2:], 1)
    KK = K[0] * K[1] * K[2]
    O = pad3(gshape[2:], 1)
    P = O[0] * O[1] * O[2]
    geo = K + pad3(s, 1) + pad3(d, 1) + pad3(p, 0) + O
    batch_dx = need_x and conv_batch.grad_usable(Cg * KK, P, N, tiled)
    wgrad = conv_wgrad.usable(Cog, Cg * KK, N * P, tiled)
    return N, C, Cout, Cg, Cog, KK, P, geo, batch_dx, wgrad


@differentiable("x", "w", optional="bias")
def transposed_convolution_ad(output_padding, options, x, w, bias):
    """Differentiable :func:`~hmath_dl.layers.transposed_convolution`, the adjoint of
    convolution: ``y[n, co, i s - p + k d] += x[n, ci, i] w[ci, co, k]``, plus ``bias[co]``.

    Gradients: w.r.t. the input, the forward convolution of ``g`` with ``w``; w.r.t. the
    weights, ``dw[ci, co, k] = sum_{n, i} x[n, ci, i] g[n, co, i s - p + k d]``; w.r.t.
    the bias, ``g`` summed over batch and spatial axes.

    Parameters
    ----------
    output_padding : int or tuple of int
        Extra size at the end of each spatial axis, ``0 <= output_padding <
        max(stride, dilation)``.
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
    value = transposed_convolution(output_padding, options, x, w, bias)
    if x.ndim == w.ndim - 1:
        return UNBATCHED
    return value, _conv_geometry("transposed_convolution_ad", options, x.ndim - 2, None)


@vjp_of(transposed_convolution_ad)
def _vjp_transposed_convolution(g, node, needs):
    # y = conv^T(x, w): x plays the role of a convolution's output and y of its input, so
    # dx = conv(g, w) and dw is the weight gradient of conv(g -> x-shaped) with cotangent x.
    from .._kernels.conv_plan import conv_nd
    x, w = node.parents[0], node.parents[1]
    s, p, d, groups, _ = node.ctx
    g = _c(g)
    gx = gw = gb = None
    if needs[0]:
        gx = conv_nd(g, w.value, None, s, p, d, groups)
        if gx.shape != x.shape:
            # output_padding >= stride (allowed when < dilation) adds output positions that
            # no input position reaches: the convolution back sees them as extra outputs
            gx = np.ascontiguousarray(gx[tuple(slice(0, n) for n in x.shape)])
    if needs[1]:
        _, gw, _ = _conv_grads(g, w.shape, w.value, x.value, s, p, d, groups, False, True)
    if needs[2]:
        gb = sum_to(g, (False, True) + (False,) * (g.ndim - 2))
    return gx, gw, gb
