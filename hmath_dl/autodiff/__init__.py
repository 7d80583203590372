"""A small tensor-level reverse-mode autodiff (``HMath.Autodiff`` for Python).

Build a graph from :func:`variable` / :func:`constant` leaves with the operators
``+ - * / @ ** -`` (numpy broadcasting) and the functions below, then ask
:func:`gradients` for ``d output / d variables``::

    from hmath_dl import autodiff as ad
    w = ad.variable(w0)
    loss = ad.mse(ad.constant(x) @ w, y)
    (gw,) = ad.gradients(loss, [w])

Every forward value is checked (a non-finite result raises NumericOverflow); the
differentiable layers (``dense_ad``, ``convolution_ad`` ...) live in
:mod:`hmath_dl.layers`.  :func:`check_gradients` compares the tape with central finite
differences.  ``gradient_norm`` / ``clip_gradients`` are the overflow-safe utilities shared
with :mod:`hmath_dl.precision` (one implementation, ``hmath_dl._gradutils``).

Dropout in a differentiable graph is a multiplication by the mask the plain layer
returns::

    y, mask, rng = layers.dropout(Mode.TRAINING, p, rng, x.value)
    y_ad = x * ad.constant(mask)        # same numbers as y, gradient g * mask
"""

from .core import ADTensor, constant, gradients, variable
from .ops import (activate, cross_entropy, exp, log, log_softmax, mean, mse, reshape, softmax,
                  sqrt, sum, tanh, transpose)
from .check import check_gradients

from .._gradutils import clip_gradients, gradient_norm  # the one implementation

__all__ = [
    "ADTensor", "variable", "constant", "gradients",
    "exp", "log", "sqrt", "tanh", "activate", "sum", "mean", "reshape", "transpose",
    "softmax", "log_softmax", "cross_entropy", "mse",
    "gradient_norm", "clip_gradients", "check_gradients",
]
