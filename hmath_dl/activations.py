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
from .errors import DomainError

__all__ = ["Activation", "activate", "ACTIVATION_CODES"]


class Activation(enum.Enum):
    """Elementwise activation functions; ``.value`` is the kernel code.

    ========== =====================================================================
    IDENTITY   ``x``
    RELU       ``max(x, 0)``
    LEAKY_RELU ``x`` for ``x > 0``, else ``negative_slope x`` (default 0.01)
    GELU       exact: ``0.5 x (1 + erf(x / sqrt(2)))``
    GELU_TANH  ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
    SILU       ``x * sigmoid(x)``
    SIGMOID    ``1 / (1 + exp(-x))``
    TANH       ``tanh(x)``
    SOFTPLUS   ``log(1 + exp(beta x)) / beta`` (default beta 1), evaluated as
               ``max(x, 0) + log1p(exp(-|beta x|)) / beta``
    ELU        ``x`` for ``x > 0``, else ``alpha (exp(x) - 1)`` (default alpha 1)
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


#: keyword option -> (the activation that takes it, its default)
_PARAMETERS = {"negative_slope": ("LEAKY_RELU", 0.01), "alpha": ("ELU", 1.0),
              "beta": ("SOFTPLUS", 1.0)}


def _parameter(fname, act, negative_slope, alpha, beta):
    """The one parameter that ``act`` is given (a float), or None when none is given.

    A parameter given (not None) for an activation that does not take it, a non-finite
    value, or ``beta <= 0`` raises DomainError; a non-number raises TypeError."""
    given = {"negative_slope": negative_slope, "alpha": alpha, "beta": beta}
    p = None
    for name, value in given.items():
        if value is None:
            continue
        owner, _ = _PARAMETERS[name]
        if act.name != owner:
            raise DomainError(f"{fname}: {name} applies only to Activation.{owner} "
                              f"(got {name}={value!r} with Activation.{act.name})")
        p = _checks.real(fname, name, value, positive=(name == "beta"))
    return p


def activate(activation, x, *, negative_slope=None, alpha=None, beta=None):
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
    negative_slope : float, optional, keyword-only
        LEAKY_RELU only (finite; default 0.01): ``f(x) = x`` for ``x > 0``, else
        ``negative_slope * x`` (one rounding).
    alpha : float, optional, keyword-only
        ELU only (finite; default 1.0): ``f(x) = x`` for ``x > 0``, else
        ``alpha * expm1(x)`` (``expm1`` rounded, then one multiplication).
    beta : float, optional, keyword-only
        SOFTPLUS only (finite, ``> 0``; default 1.0):
        ``f(x) = log1p(exp(beta x)) / beta``, evaluated as
        ``max(x, 0) + log1p(exp(-|beta x|)) / beta`` (mathematically equal, no overflow,
        no cancellation, and no linear cut-off: unlike PyTorch's ``threshold=20`` the
        formula is used for every ``x``).

        With the defaults (a parameter omitted, or given with its default value) the
        results are bitwise those of the unparameterised function.

    Returns
    -------
    ndarray
        ``f(x)``, float64, same shape as ``x``.

    Raises
    ------
    TypeError
        ``activation`` not an :class:`Activation`, ``x`` or a parameter not numeric.
    DomainError
        A parameter given (not None) for an activation that does not take it
        (``negative_slope`` with anything but LEAKY_RELU, ``alpha`` with anything but
        ELU, ``beta`` with anything but SOFTPLUS); a NaN/inf parameter; ``beta <= 0``.
    NonFiniteError
        ``x`` contains NaN or inf.
    NumericOverflow
        a result is not finite (e.g. ``negative_slope * x`` beyond the float64 range, or
        ``log(2) / beta`` for a subnormal ``beta``; never for the default parameters).
    """
    fname = "activate"
    act = _checks.member(fname, "activation", activation, Activation)
    p = (None if negative_slope is None and alpha is None and beta is None
         else _parameter(fname, act, negative_slope, alpha, beta))
    arr = _checks.tensor(fname, "x", x, finite=False)  # the kernel checks finiteness
    if arr.ndim == 1 and np.ndim(x) == 0:  # _checks.tensor turns a 0-d input into [1]
        arr = arr.reshape(())
    out = _checks.alloc(fname, arr.shape)
    if arr.size == 0:
        return out
    if p is not None:
        from ._kernels.elementwise import sized_forward_param

        status = sized_forward_param(arr.size)(act.value, p, arr.reshape(-1), out.reshape(-1))
        return _checks.finish(fname, status, out=out, inputs=(("x", arr),),
                              overflow=lambda i, code: (
                                  f"{act.name} with parameter {p!r} produced a non-finite "
                                  f"result (beyond the float64 range)"))
    from ._kernels.elementwise import sized_forward

    ok = sized_forward(arr.size)(act.value, arr.reshape(-1), out.reshape(-1))
    return _checks.finish(fname, ok, out=out, inputs=(("x", arr),),
                          overflow=lambda i, code: f"{act.name} produced a non-finite result")
