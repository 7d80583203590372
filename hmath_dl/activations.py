"""Elementwise activations (``Activation`` and ``activate``).

Each :class:`Activation` member's ``.value`` is the int code used by the kernels in
``hmath_dl._kernels.elementwise`` (``activation_forward(code, x_flat, out_flat)`` and
``activation_derivative(code, x_flat, out_flat)``); ``ACTIVATION_CODES`` maps members to
the same ints.  Reuse those kernels (e.g. from autodiff) as::

    from hmath_dl.activations import Activation, ACTIVATION_CODES
    from hmath_dl._kernels.elementwise import activation_derivative
    ok = activation_derivative(Activation.GELU.value, x_flat, out_flat)  # f'(x)
"""

from __future__ import annotations

import enum

import numpy as np

from . import _checks
from .errors import NumericOverflow

__all__ = ["Activation", "activate", "ACTIVATION_CODES"]


class Activation(enum.Enum):
    """Elementwise activation functions; ``.value`` is the kernel code.

    ========== =====================================================================
    IDENTITY   ``x``
    RELU       ``max(x, 0)``
    LEAKY_RELU ``x`` for ``x > 0``, else ``0.01 x``
    GELU       exact: ``0.5 x (1 + erf(x / sqrt(2)))``
    GELU_TANH  ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
    SILU       ``x * sigmoid(x)``
    SIGMOID    ``1 / (1 + exp(-x))``
    TANH       ``tanh(x)``
    SOFTPLUS   ``log(1 + exp(x))``, evaluated as ``max(x, 0) + log1p(exp(-|x|))``
    ELU        ``x`` for ``x > 0``, else ``exp(x) - 1`` (alpha 1)
    ========== =====================================================================
    """

    IDENTITY = 0
    RELU = 1
    LEAKY_RELU = 2
    GELU = 3
    GELU_TANH = 4
    SILU = 5
    SIGMOID = 6
    TANH = 7
    SOFTPLUS = 8
    ELU = 9


#: Activation -> int code understood by the elementwise kernels (== member.value).
ACTIVATION_CODES = {a: a.value for a in Activation}


def activate(activation, x):
    """Apply an activation elementwise (checked).

    Parameters
    ----------
    activation : Activation
        Which function; formulas in :class:`Activation`.  All are evaluated in
        numerically stable forms: ``sigmoid(x) = 1/(1+exp(-x))`` for ``x >= 0`` and
        ``exp(x)/(1+exp(x))`` otherwise; ``softplus(x) = max(x,0) + log1p(exp(-|x|))``;
        ``GELU(x) = 0.5 x erfc(-x/sqrt(2))`` (equal to ``0.5 x (1+erf(x/sqrt(2)))``,
        without cancellation for negative x); ``GELU_TANH(x) = x sigmoid(2u)`` (equal to
        ``0.5 x (1 + tanh(u))``); ``ELU`` uses ``expm1``.  So ``x = +-1000``
        gives the exact finite limits (e.g. ``softplus(1000) = 1000``, ``sigmoid(-1000) = 0``).
    x : array_like
        Any shape.

    Returns
    -------
    ndarray
        ``f(x)``, float64, same shape as ``x``.

    Raises
    ------
    TypeError
        ``activation`` not an :class:`Activation`, or ``x`` not numeric.
    NonFiniteError
        ``x`` contains NaN or inf.
    NumericOverflow
        a result is not finite (cannot happen for finite inputs with these functions;
        kept as the checked-arithmetic guarantee).
    """
    fname = "activate"
    act = _checks.member(fname, "activation", activation, Activation)
    arr = _checks.tensor(fname, "x", x, finite=False)  # the kernel checks finiteness
    if arr.ndim == 1 and np.ndim(x) == 0:  # _checks.tensor turns a 0-d input into [1]
        arr = arr.reshape(())
    out = _checks.alloc(fname, arr.shape)
    if arr.size == 0:
        return out
    from ._kernels.elementwise import sized_forward

    ok = sized_forward(arr.size)(act.value, arr.reshape(-1), out.reshape(-1))
    if not ok:
        _checks.require_finite(fname, "x", arr)
        raise NumericOverflow(f"{fname}: {act.name} produced a non-finite result")
    return out
