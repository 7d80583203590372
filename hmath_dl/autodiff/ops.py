"""Primitive differentiable operations and their vector-Jacobian products.

Every primitive does three things: validate (errors name the public function), compute
the forward value (checked: a non-finite result raises NumericOverflow) and record a node
with :func:`~hmath_dl.autodiff.core.make_node`, the primitive itself as the op.  Its
derivative rule ``_vjp_*`` follows it directly, declared with
``@vjp_of(primitive)`` (:func:`hmath_dl.autodiff.core.vjp_of`).  A rule has the
signature ``vjp(g, node, needs) -> tuple`` (exactly one gradient or None per parent);
``node.value`` is the forward output, ``node.parents`` the inputs, ``node.ctx`` what the
forward pass saved.
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import _checks
from .._kernels import arith, libm
from .._kernels import softmax as _sm
from .._kernels.elementwise import (sized_derivative, sized_derivative_param,
                                     sized_forward_derivative,
                                     sized_forward_derivative_param)
from .._kernels.gemm_f64 import matmul_nd
from .._kernels.checks import first_outside
from .._kernels.reduce import picked_sum, sum_to
from .._kernels.views import readonly
from .._kernels.status import OK
from ..errors import DomainError, IndexOutOfRange, NumericOverflow, ShapeError
from .core import ADTensor, as_adtensor, make_node, unbroadcast, vjp_of

__all__ = ["exp", "log", "sqrt", "tanh", "activate", "sum", "mean", "reshape", "transpose",
           "softmax", "log_softmax", "cross_entropy", "mse"]

_shape = _checks.shape_str


def _checked(fname: str, value: np.ndarray, what: str) -> np.ndarray:
    """``value`` after scanning it (:func:`hmath_dl._checks.finish` with no kernel verdict)."""
    return _checks.finish(fname, None, out=value,
                          overflow=lambda i, code: f"result is not finite ({what})")


def _ad(fname, name, x):
    return as_adtensor(fname, name, x)


# =========================================================================== arithmetic
def _broadcast(fname, a, b):
    if a.shape == b.shape:          # the usual case, without numpy's Python-level walk
        return a.shape
    try:
        return np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ShapeError(f"{fname}: operand shapes {_shape(a.shape)} and {_shape(b.shape)} "
                         f"do not broadcast") from None


def _binary(op, fname, a, b, fn, what):
    a = _ad(fname, "left operand", a)
    b = _ad(fname, "right operand", b)
    _broadcast(fname, a, b)
    if (fn is np.add or fn is np.multiply) and arith.applies(a.value, b.value):
        # large operands of one shape: parallel blocks, the finiteness count in the same
        # pass (numpy's bits: IEEE sums and products are correctly rounded)
        value, bad = arith.binary(a.value, b.value, fn is np.multiply)
        counted = bad == 0
    else:
        with np.errstate(all="ignore"):
            value = np.asarray(fn(a.value, b.value), dtype=np.float64)
        counted = False
    return make_node(op, value if counted else _checked(fname, value, what), (a, b))


def _add(a, b):
    return _binary(_add, "ADTensor.__add__", a, b, np.add, "a sum overflowed")


@vjp_of(_add)
def _vjp_add(g, node, needs):
    a, b = node.parents
    return (unbroadcast(g, a.shape) if needs[0] else None,
            unbroadcast(g, b.shape) if needs[1] else None)


def _sub(a, b):
    return _binary(_sub, "ADTensor.__sub__", a, b, np.subtract, "a difference overflowed")


@vjp_of(_sub, "subtract")
def _vjp_subtract(g, node, needs):
    a, b = node.parents
    return (unbroadcast(g, a.shape) if needs[0] else None,
            unbroadcast(-g, b.shape) if needs[1] else None)


def _mul(a, b):
    return _binary(_mul, "ADTensor.__mul__", a, b, np.multiply, "a product overflowed")


@vjp_of(_mul, "multiply")
def _vjp_multiply(g, node, needs):
    a, b = node.parents
    return (unbroadcast(g * b.value, a.shape) if needs[0] else None,
            unbroadcast(g * a.value, b.shape) if needs[1] else None)


def _div(a, b):
    return _binary(_div, "ADTensor.__truediv__", a, b, np.divide,
                   "division by zero or overflow")


@vjp_of(_div, "divide")
def _vjp_divide(g, node, needs):
    a, b = node.parents
    ga = g / b.value
    return (unbroadcast(ga, a.shape) if needs[0] else None,
            unbroadcast(-ga * node.value, b.shape) if needs[1] else None)


def _neg(a):
    return make_node(_neg, -a.value, (a,))


@vjp_of(_neg, "negative")
def _vjp_negative(g, node, needs):
    return (-g,)


_INT_POWER_LIMIT = 2.0 ** 31


def _power(x, p):
    """``x ** p`` elementwise in an order that is the same on every CPU (numpy's ``power``
    is not: numpy 1.26's AVX-512 loop does not even return ``x`` for ``p = 1``).

    * integral ``p`` with ``|p| < 2**31``: square-and-multiply over the bits of ``|p|`` from
      the lowest (``x ** 1 = x``, ``x ** 2 = x * x``, ``x ** 3 = x * (x * x)``; correctly
      rounded products in a fixed sequence), then ``1 / r`` for a negative ``p``;
      ``x ** 0 = 1``;
    * ``p = 0.5``: ``sqrt(x)`` (correctly rounded);
    * any other ``p``: ``exp(p * log(x))`` with the library's own exp and log
      (:mod:`hmath_dl._kernels.libm`); a negative ``x`` gives NaN (reported by the caller).
    """
    with np.errstate(all="ignore"):
        if p == int(p) and abs(p) < _INT_POWER_LIMIT:
            n = int(abs(p))
            result = np.ones(x.shape)
            square = np.array(x, dtype=np.float64, copy=True)
            first = True
            while n:
                if n & 1:
                    result = square.copy() if first else result * square
                    first = False
                n >>= 1
                if n:
                    square = square * square
            return 1.0 / result if p < 0 else result
        if p == 0.5:
            return np.sqrt(x)
        logs = _sm.apply(libm.log_array, x)
        return _sm.apply(libm.exp_array, p * logs)


def _pow(a, p):
    fname = "ADTensor.__pow__"
    if isinstance(p, ADTensor) or isinstance(p, (bool, np.bool_)) or \
            not isinstance(p, (numbers.Real, np.integer, np.floating)):
        raise TypeError(f"{fname}: the exponent must be a real scalar (got {type(p).__name__})")
    p = _checks.real(fname, "exponent", p)
    value = _power(a.value, p)
    return make_node(_pow, _checked(fname, np.asarray(value, dtype=np.float64),
                                       "x ** p overflowed or is undefined (0 ** negative, "
                                       "negative ** fraction)"), (a,), p)


@vjp_of(_pow, "power")
def _vjp_power(g, node, needs):
    (a,), p = node.parents, node.ctx
    if p == 0.0:
        return (np.zeros(a.shape),)
    with np.errstate(all="ignore"):
        return (g * p * _power(a.value, p - 1.0),)


def _swap(m):
    return np.swapaxes(m, -1, -2)


def _matmul(a, b):
    fname = "ADTensor.__matmul__"
    a = _ad(fname, "left operand", a)
    b = _ad(fname, "right operand", b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"{fname}: operands must have at least 1 axis "
                         f"(got {_shape(a.shape)} @ {_shape(b.shape)})")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise ShapeError(f"{fname}: inner sizes differ (got {_shape(a.shape)} @ {_shape(b.shape)})")
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ShapeError(f"{fname}: batch axes do not broadcast "
                         f"(got {_shape(a.shape)} @ {_shape(b.shape)})") from None
    with np.errstate(all="ignore"):
        value = matmul_nd(a.value, b.value)
    return make_node(_matmul, _checked(fname, value, "a dot product overflowed"), (a, b))


@vjp_of(_matmul)
def _vjp_matmul(g, node, needs):
    a, b = node.parents
    av = a.value if a.ndim >= 2 else a.value[None, :]
    bv = b.value if b.ndim >= 2 else b.value[:, None]
    g2 = g.reshape(np.broadcast_shapes(av.shape[:-2], bv.shape[:-2]) + (av.shape[-2], bv.shape[-1]))
    ga = gb = None
    if needs[0]:
        ga = unbroadcast(matmul_nd(g2, _swap(bv)), av.shape).reshape(a.shape)
    if needs[1]:
        gb = unbroadcast(matmul_nd(_swap(av), g2), bv.shape).reshape(b.shape)
    return ga, gb


ADTensor.__add__ = lambda self, other: _add(self, other)
ADTensor.__radd__ = lambda self, other: _add(other, self)
ADTensor.__sub__ = lambda self, other: _sub(self, other)
ADTensor.__rsub__ = lambda self, other: _sub(other, self)
ADTensor.__mul__ = lambda self, other: _mul(self, other)
ADTensor.__rmul__ = lambda self, other: _mul(other, self)
ADTensor.__truediv__ = lambda self, other: _div(self, other)
ADTensor.__rtruediv__ = lambda self, other: _div(other, self)
ADTensor.__matmul__ = lambda self, other: _matmul(self, other)
ADTensor.__rmatmul__ = lambda self, other: _matmul(other, self)
ADTensor.__neg__ = lambda self: _neg(self)
ADTensor.__pos__ = lambda self: self
ADTensor.__pow__ = lambda self, p: _pow(self, p)


# =========================================================================== elementwise
def _unary(op, fname, x, fn, what):
    x = _ad(fname, "x", x)
    with np.errstate(all="ignore"):
        value = np.asarray(fn(x.value), dtype=np.float64)
    return make_node(op, _checked(fname, value, what), (x,))


def _own(array_kernel):
    """The library's own elementwise function (``hmath_dl._kernels.libm``, within 1 ulp,
    the same bits on every CPU) as a numpy-like callable."""
    return lambda v: _sm.apply(array_kernel, v)


def exp(x):
    """Elementwise ``y = exp(x)``; ``d/dx = exp(x)``.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).

    Returns
    -------
    ADTensor
        Same shape as ``x``.

    Raises
    ------
    NumericOverflow
        ``exp(x)`` overflows (``x > ~709.78``).
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    TypeError
        ``x`` is None, a string or not numeric.
    """
    return _unary(exp, "exp", x, _own(libm.exp_array), "exp overflowed")


@vjp_of(exp)
def _vjp_exp(g, node, needs):
    return (g * node.value,)


def log(x):
    """Elementwise natural logarithm ``y = log(x)``; ``d/dx = 1/x``.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).
        Every entry must be ``> 0``.

    Returns
    -------
    ADTensor
        Same shape as ``x``.

    Raises
    ------
    NumericOverflow
        Some ``x <= 0`` (``log(0) = -inf``, ``log(-1) = NaN``).
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    TypeError
        ``x`` is None, a string or not numeric.
    """
    return _unary(log, "log", x, _own(libm.log_array), "log of a value <= 0")


@vjp_of(log)
def _vjp_log(g, node, needs):
    return (g / node.parents[0].value,)


def sqrt(x):
    """Elementwise ``y = sqrt(x)``; ``d/dx = 1 / (2 sqrt(x))``.

    At ``x = 0`` the value is 0 and the gradient is infinite, so :func:`gradients` raises
    NumericOverflow if it is used.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).
        Every entry must be ``>= 0``.

    Returns
    -------
    ADTensor
        Same shape as ``x``.

    Raises
    ------
    NumericOverflow
        Some ``x < 0``.
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    TypeError
        ``x`` is None, a string or not numeric.
    """
    return _unary(sqrt, "sqrt", x, np.sqrt, "sqrt of a negative value")


@vjp_of(sqrt)
def _vjp_sqrt(g, node, needs):
    with np.errstate(all="ignore"):
        return (g / (2.0 * node.value),)


def tanh(x):
    """Elementwise ``y = tanh(x)``; ``d/dx = 1 - tanh(x)**2``.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).

    Returns
    -------
    ADTensor
        Same shape as ``x``, entries in ``[-1, 1]``.

    Raises
    ------
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    TypeError
        ``x`` is None, a string or not numeric.
    """
    return _unary(tanh, "tanh", x, _own(libm.tanh_array), "tanh")


@vjp_of(tanh)
def _vjp_tanh(g, node, needs):
    y = node.value
    return (g * (1.0 - y * y),)


def activate(activation, x, *, negative_slope=None, alpha=None, beta=None):
    """Differentiable :func:`hmath_dl.activations.activate`: ``y = f(x)``, ``dx = g * f'(x)``.

    The forward value is exactly ``hmath_dl.activations.activate(activation, x.value,
    negative_slope=..., alpha=..., beta=...)``; ``f'`` comes from the activations kernel
    with the same parameter (at the kinks ``x = 0`` of RELU / LEAKY_RELU / ELU the left
    derivative: 0, ``negative_slope`` and ``alpha``).  With a parameter:
    LEAKY_RELU ``f' = 1`` for ``x > 0`` else ``negative_slope``; ELU ``f' = 1`` for
    ``x > 0`` else ``alpha * exp(x)``; SOFTPLUS ``f' = sigmoid(beta * x)``.

    Parameters
    ----------
    activation : Activation
        The function ``f``.
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).
    negative_slope, alpha, beta : float, optional, keyword-only
        As for :func:`hmath_dl.activations.activate` (LEAKY_RELU / ELU / SOFTPLUS only;
        finite; ``beta > 0``; defaults 0.01, 1.0, 1.0).

    Returns
    -------
    ADTensor
        Same shape as ``x``.

    Raises
    ------
    TypeError
        ``activation`` is not an :class:`~hmath_dl.activations.Activation`; ``x`` is None,
        a string or not numeric; a parameter is not a number.
    DomainError
        A parameter given for an activation that does not take it, NaN/inf, or
        ``beta <= 0``.
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    NumericOverflow
        A result is not finite (the plain activation's checked-arithmetic guarantee).
    """
    from ..activations import Activation, _parameter, activate as plain_activate
    fname = "activate"
    act = _checks.member(fname, "activation", activation, Activation)
    p = (None if negative_slope is None and alpha is None and beta is None
         else _parameter(fname, act, negative_slope, alpha, beta))
    opts = {} if p is None else {
        {"LEAKY_RELU": "negative_slope", "ELU": "alpha", "SOFTPLUS": "beta"}[act.name]: p}
    x = _ad(fname, "x", x)
    if not x.needs_grad or x.size == 0:
        return make_node(activate, plain_activate(act, x.value, **opts), (x,),
                         (act.value, None, p))
    # x.value is a finite float64 C-contiguous tape value: one fused pass computes f and
    # f' (the bits of plain_activate and of activation_derivative); f' is kept for the vjp
    value = np.empty(x.shape)
    d = np.empty(x.shape)
    if p is None:
        ok = sized_forward_derivative(x.size)(act.value, x.value.reshape(-1),
                                              value.reshape(-1), d.reshape(-1))
    else:
        ok = sized_forward_derivative_param(x.size)(act.value, p, x.value.reshape(-1),
                                                    value.reshape(-1), d.reshape(-1)) == OK
    if not ok:  # let the plain layer raise its error
        return make_node(activate, plain_activate(act, x.value, **opts), (x,),
                         (act.value, None, p))
    return make_node(activate, value, (x,), (act.value, d, p))


@vjp_of(activate)
def _vjp_activate(g, node, needs):
    code, d = node.ctx[0], node.ctx[1]
    p = node.ctx[2] if len(node.ctx) > 2 else None
    if d is None:
        x = node.parents[0].value
        d = np.empty(x.shape)
        if x.size:
            if p is None:
                sized_derivative(x.size)(code, x.reshape(-1), d.reshape(-1))
            else:
                sized_derivative_param(x.size)(code, p, x.reshape(-1), d.reshape(-1))
    return (arith.multiply(g, d),)


# =========================================================================== reductions
def _axes(fname, axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = tuple(_checks.axis(fname, "axis", a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise DomainError(f"{fname}: axis has repeated entries (got {tuple(axis)!r})")
        return axes
    return (_checks.axis(fname, "axis", axis, ndim),)


def _keep_shape(shape, axes):
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _fixed_sum(v, axes, keepdims):
    """``numpy.sum(v, axes, keepdims=keepdims)`` in the fixed order of
    ``hmath_dl._kernels.reduce.sum_to`` (no numpy reduction)."""
    out = sum_to(v, [i not in axes for i in range(v.ndim)])
    if keepdims:
        out = out.reshape(_keep_shape(v.shape, axes))
    return out


def sum(x, axis=None, keepdims=False):
    """``y = numpy.sum(x, axis, keepdims=keepdims)``; the gradient broadcasts ``g`` back.

    The sum runs in a fixed order (``hmath_dl._kernels.reduce.sum_to``: the same bits on
    every CPU), not numpy's pairwise order, so the last bit can differ from ``numpy.sum``.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).
    axis : None, int or tuple of int, optional
        None (the default) reduces all axes; otherwise axes in ``[-ndim, ndim)``, no repeats.
    keepdims : bool, optional
        Keep the reduced axes with length 1 (default False).

    Returns
    -------
    ADTensor
        The shape ``numpy.sum`` gives (0-d for ``axis=None`` without ``keepdims``).

    Raises
    ------
    DomainError
        An axis outside ``[-ndim, ndim)``, or repeated axes.
    TypeError
        ``axis`` entries not ints, ``keepdims`` not a bool; ``x`` None, a string or not
        numeric.
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    NumericOverflow
        The sum overflows.
    """
    fname = "sum"
    x = _ad(fname, "x", x)
    axes = _axes(fname, axis, x.ndim)
    keepdims = _checks.boolean(fname, "keepdims", keepdims)
    value = _fixed_sum(x.value, axes, keepdims)
    value = _checked(fname, value, "the sum overflowed")
    return make_node(sum, value, (x,), axes)


@vjp_of(sum)
def _vjp_sum(g, node, needs):
    x = node.parents[0]
    axes = node.ctx
    return (np.broadcast_to(g.reshape(_keep_shape(x.shape, axes)), x.shape),)


def mean(x, axis=None, keepdims=False):
    """``y = sum(x, axis, keepdims) / n`` (``numpy.mean``), ``n`` the number of reduced elements.

    The gradient is ``g / n`` broadcast back.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).
    axis : None, int or tuple of int, optional
        As for :func:`sum`: None (all axes) or axes in ``[-ndim, ndim)``, no repeats.
    keepdims : bool, optional
        Keep the reduced axes with length 1 (default False).

    Returns
    -------
    ADTensor
        The shape ``numpy.mean`` gives (0-d for ``axis=None`` without ``keepdims``).

    Raises
    ------
    NumericOverflow
        A mean over zero elements (an empty axis), which is undefined; or the sum overflows.
    DomainError
        An axis outside ``[-ndim, ndim)``, or repeated axes.
    TypeError
        ``axis`` entries not ints, ``keepdims`` not a bool; ``x`` None, a string or not
        numeric.
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    """
    fname = "mean"
    x = _ad(fname, "x", x)
    axes = _axes(fname, axis, x.ndim)
    keepdims = _checks.boolean(fname, "keepdims", keepdims)
    count = 1
    for a in axes:
        count *= x.shape[a]
    if count == 0:
        raise NumericOverflow(f"{fname}: mean over zero elements is undefined "
                              f"(x has shape {_shape(x.shape)}, axis {axis!r})")
    with np.errstate(all="ignore"):
        value = _fixed_sum(x.value, axes, keepdims) / count
    value = _checked(fname, np.asarray(value, dtype=np.float64), "the sum overflowed")
    return make_node(mean, value, (x,), (axes, count))


@vjp_of(mean)
def _vjp_mean(g, node, needs):
    x = node.parents[0]
    axes, count = node.ctx
    return (np.broadcast_to(g.reshape(_keep_shape(x.shape, axes)) / count, x.shape),)


# =========================================================================== shapes
def reshape(x, shape):
    """``y = numpy.reshape(x, shape)``; the gradient is ``g`` reshaped back to ``x.shape``.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).
    shape : int or sequence of int
        The new shape; entries ``>= -1``, one of them may be -1 (inferred).

    Returns
    -------
    ADTensor
        Shape ``shape``, values of ``x`` in row-major order.

    Raises
    ------
    ShapeError
        The sizes differ (or more than one -1).
    DomainError
        An entry below -1.
    TypeError
        ``shape`` not an int or a sequence of ints; ``x`` None, a string or not numeric.
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    """
    fname = "reshape"
    x = _ad(fname, "x", x)
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    shape = _checks.int_tuple(fname, "shape", shape, min=-1)
    try:
        value = x.value.reshape(shape)
    except ValueError:
        raise ShapeError(f"{fname}: cannot reshape {_shape(x.shape)} into {shape!r}") from None
    return make_node(reshape, value, (x,))


@vjp_of(reshape)
def _vjp_reshape(g, node, needs):
    return (np.reshape(g, node.parents[0].shape),)


def transpose(x, axes=None):
    """``y = numpy.transpose(x, axes)``; the gradient is ``g`` transposed back.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).
    axes : sequence of int, optional
        None (the default) reverses the axes; otherwise a permutation of ``range(ndim)``
        (negative entries allowed).

    Returns
    -------
    ADTensor
        ``y.shape[i] == x.shape[axes[i]]``.

    Raises
    ------
    DomainError
        ``axes`` has the wrong length, an entry out of range, or is not a permutation.
    TypeError
        ``axes`` not a sequence of ints; ``x`` None, a string or not numeric.
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    """
    fname = "transpose"
    x = _ad(fname, "x", x)
    if axes is None:
        perm = tuple(range(x.ndim))[::-1]
    else:
        raw = _checks.int_tuple(fname, "axes", axes)
        if len(raw) != x.ndim:
            raise DomainError(f"{fname}: axes must have {x.ndim} entries (got {raw!r})")
        perm = tuple(_checks.axis(fname, "axes", a, x.ndim) for a in raw)
        if sorted(perm) != list(range(x.ndim)):
            raise DomainError(f"{fname}: axes must be a permutation of 0..{x.ndim - 1} (got {raw!r})")
    value = np.asarray(np.transpose(x.value, perm), order="C")
    return make_node(transpose, value, (x,), perm)


@vjp_of(transpose)
def _vjp_transpose(g, node, needs):
    return (np.transpose(g, np.argsort(node.ctx)),)


# =========================================================================== softmax family
def _log_softmax_values(v, axis):
    return _sm.softmax(v, axis, True)


def softmax(x, axis=-1):
    """``y = exp(x - max) / sum(exp(x - max))`` along ``axis``.

    Gradient: ``y * (g - sum(g * y, axis))``.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).
        At least 1 axis.
    axis : int, optional
        In ``[-ndim, ndim)``; default -1.

    Returns
    -------
    ADTensor
        Same shape as ``x``; each slice along ``axis`` sums to 1 (an empty ``x`` gives an
        empty result).

    Raises
    ------
    ShapeError
        ``x`` is 0-d.
    DomainError
        ``axis`` outside ``[-ndim, ndim)``.
    TypeError
        ``axis`` not an int; ``x`` None, a string or not numeric.
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    NumericOverflow
        A result is not finite (checked arithmetic).
    """
    fname = "softmax"
    x = _ad(fname, "x", x)
    if x.ndim == 0:
        raise ShapeError(f"{fname}: x must have at least 1 axis (got a 0-d tensor)")
    ax = _checks.axis(fname, "axis", axis, x.ndim)
    if x.size == 0:
        return make_node(softmax, np.zeros(x.shape), (x,), ax)
    value = _sm.softmax(x.value, ax, False)
    return make_node(softmax, _checked(fname, value, "softmax"), (x,), ax)


@vjp_of(softmax)
def _vjp_softmax(g, node, needs):
    return (_sm.softmax_backward(node.value, g, node.ctx, False),)


def log_softmax(x, axis=-1):
    """``y = (x - max) - log(sum(exp(x - max)))`` along ``axis``.

    Gradient: ``g - exp(y) * sum(g, axis)``.

    Parameters
    ----------
    x : ADTensor or array_like
        A non-ADTensor is converted to a :func:`constant` (no gradient).
        At least 1 axis.
    axis : int, optional
        In ``[-ndim, ndim)``; default -1.

    Returns
    -------
    ADTensor
        Same shape as ``x`` (an empty ``x`` gives an empty result).

    Raises
    ------
    ShapeError
        ``x`` is 0-d.
    DomainError
        ``axis`` outside ``[-ndim, ndim)``.
    TypeError
        ``axis`` not an int; ``x`` None, a string or not numeric.
    NonFiniteError
        A non-ADTensor ``x`` holds NaN or ±inf.
    NumericOverflow
        A result is not finite (checked arithmetic).
    """
    fname = "log_softmax"
    x = _ad(fname, "x", x)
    if x.ndim == 0:
        raise ShapeError(f"{fname}: x must have at least 1 axis (got a 0-d tensor)")
    ax = _checks.axis(fname, "axis", axis, x.ndim)
    if x.size == 0:
        return make_node(log_softmax, np.zeros(x.shape), (x,), ax)
    value = _log_softmax_values(x.value, ax)
    return make_node(log_softmax, _checked(fname, value, "log_softmax"), (x,), ax)


@vjp_of(log_softmax)
def _vjp_log_softmax(g, node, needs):
    return (_sm.softmax_backward(node.value, g, node.ctx, True),)


# =========================================================================== losses
def cross_entropy(logits, labels):
    """Mean softmax cross-entropy ``-(1/B) sum_b log_softmax(logits)[b, labels[b]]``.

    Parameters
    ----------
    logits : ADTensor (or array-like), shape ``[B, C]``, ``B >= 1``
    labels : int array-like, shape ``[B]``, entries in ``[0, C)``

    Returns
    -------
    ADTensor
        0-d.  Gradient w.r.t. logits: ``g * (softmax(logits) - onehot(labels)) / B``.

    Raises
    ------
    ShapeError
        logits not 2-D, empty batch, or labels not of shape ``[B]``.
    IndexOutOfRange
        a label outside ``[0, C)``.
    TypeError
        labels not integers.
    """
    fname = "cross_entropy"
    logits = _ad(fname, "logits", logits)
    if logits.ndim != 2:
        raise ShapeError(f"{fname}: logits must have 2 axes [B, C] (got shape {_shape(logits.shape)})")
    lab = _checks.int_array(fname, "labels", labels)
    b, c = logits.shape
    if lab.shape != (b,):
        raise ShapeError(f"{fname}: labels must have shape [{b}] (got {_shape(lab.shape)})")
    if b == 0:
        raise ShapeError(f"{fname}: the batch is empty (logits shape {_shape(logits.shape)})")
    lab = readonly(lab)
    i = first_outside(lab, c)
    if i >= 0:
        raise IndexOutOfRange(f"{fname}: labels[{i}] = {int(lab[i])} is outside [0, {c})")
    lsm = _log_softmax_values(logits.value, 1)
    # sum of lsm[b, lab[b]] in increasing b (sum_to's order for a vector), then / b
    value = np.asarray(-picked_sum(lsm, lab) / b, dtype=np.float64)
    return make_node(cross_entropy, _checked(fname, value, "cross entropy"), (logits,),
                     (lsm, lab))


@vjp_of(cross_entropy)
def _vjp_cross_entropy(g, node, needs):
    lsm, lab = node.ctx
    b = lsm.shape[0]
    d = _sm.apply(libm.exp_array, lsm)
    d[np.arange(b), lab] -= 1.0
    return (d * (g / b),)


def mse(prediction, target):
    """Mean squared error ``y = mean((prediction - target)**2)`` over all elements.

    Gradients: ``2 g (prediction - target) / n`` for ``prediction`` and its negative for
    ``target`` (``n`` the number of elements).

    Parameters
    ----------
    prediction : ADTensor or array_like
        Non-empty.  A non-ADTensor is a :func:`constant`.
    target : ADTensor or array_like
        Same shape as ``prediction``; an array-like is a constant.

    Returns
    -------
    ADTensor
        0-d.

    Raises
    ------
    ShapeError
        The shapes differ, or ``prediction`` is empty.
    NumericOverflow
        The squared error overflows.
    NonFiniteError
        A non-ADTensor argument holds NaN or ±inf.
    TypeError
        An argument is None, a string or not numeric.
    """
    fname = "mse"
    p = _ad(fname, "prediction", prediction)
    t = _ad(fname, "target", target)
    if p.shape != t.shape:
        raise ShapeError(f"{fname}: prediction and target shapes differ "
                         f"(got {_shape(p.shape)} and {_shape(t.shape)})")
    if p.size == 0:
        raise ShapeError(f"{fname}: prediction is empty (shape {_shape(p.shape)})")
    with np.errstate(all="ignore"):
        d = p.value - t.value
        # the eight-partial fixed order of _kernels.reduce over the flattened squares
        value = np.asarray(sum_to((d * d).reshape(1, -1), (True, False))[0] / d.size,
                           dtype=np.float64)
    return make_node(mse, _checked(fname, value, "the squared error overflowed"), (p, t), d)


@vjp_of(mse)
def _vjp_mse(g, node, needs):
    d = node.ctx
    gp = d * (2.0 * g / d.size)
    return (gp if needs[0] else None, -gp if needs[1] else None)
