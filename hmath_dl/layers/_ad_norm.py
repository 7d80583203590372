"""Differentiable normalisation layers (see :mod:`hmath_dl.layers.differentiable`)."""

from __future__ import annotations

import numpy as np

from ..autodiff.core import make_node, register_vjp
from ._ad_common import _ad, _c, _named


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


RULES = {
    "layer_norm": _vjp_layer_norm,
    "batch_norm": _vjp_batch_norm,
}
register_vjp(RULES)
