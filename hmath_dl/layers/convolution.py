"""Convolution: direct grouped / strided / dilated cross-correlation on 1-3 spatial axes,
its adjoint (transposed convolution) and depthwise convolution (seed: HMath.DeepLearning.Layers).

Layout ``x [N, C, *spatial]`` with 1-3 spatial axes; symmetric zero padding.  The
kernels live in :mod:`hmath_dl._kernels.conv` (direct summation, no FFT/Winograd, no
BLAS; bitwise identical for any thread count), the plan that picks one for a shape in
``hmath_dl._kernels.conv_plan``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Tuple, Union

import numpy as np

from .. import _checks
from .._kernels.conv_plan import conv_nd, conv_transpose_nd
from ..errors import DomainError, ShapeError

__all__ = ["ConvOptions", "convolution", "transposed_convolution", "depthwise_convolution"]

IntOrTuple = Union[int, Tuple[int, ...]]


class ShapeOrDomainError(ShapeError, DomainError):
    """Raised where a rejection is both about shapes and about a parameter's domain
    (``groups`` not dividing a channel count, an output size below 1): catchable as
    either :class:`~hmath_dl.errors.ShapeError` or :class:`~hmath_dl.errors.DomainError`."""


_PADDING_STRINGS = ("valid", "same")


class PaddingStringError(DomainError, TypeError):
    """A ``padding`` string other than ``"valid"``/``"same"``: outside the option's domain,
    and (for code written before strings were allowed) a wrong type; catchable as
    either :class:`~hmath_dl.errors.DomainError` or :class:`TypeError`."""


def _option_field(name, value, lo):
    """Normalise one ConvOptions field: an int (kept as int, broadcast at call time) or a
    sequence of ints (kept as a tuple), each >= lo; ``padding`` may also be ``"valid"`` or
    ``"same"``."""
    fname = "ConvOptions"
    if name == "padding" and isinstance(value, str):
        if value not in _PADDING_STRINGS:
            raise PaddingStringError(f"{fname}: padding must be an int, a tuple of ints, "
                                     f"'valid' or 'same' (got {value!r})")
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return _checks.integer(fname, name, value, min=lo)
    return _checks.int_tuple(fname, name, value, min=lo)


@dataclass(frozen=True)
class ConvOptions:
    """Per-axis convolution settings (frozen).

    Parameters
    ----------
    stride : int or tuple of int
        Step between output positions per spatial axis, each >= 1.
    padding : int, tuple of int, ``"valid"`` or ``"same"``
        Symmetric zero padding per spatial axis, each >= 0.  ``"valid"`` means 0.
        ``"same"`` (stride 1 on every axis, else ``DomainError`` when used) pads each axis
        by ``total = d(K-1)`` zeros in all, ``total // 2`` before and the rest after
        (PyTorch's split), so the output has the input's size.
    dilation : int or tuple of int
        Spacing between kernel taps per spatial axis, each >= 1.
    groups : int, default 1
        Channel groups (>= 1); must divide the input and output channel counts.

    Notes
    -----
    A single int stands for the same value on every spatial axis and is broadcast to the
    input's rank when the options are used; a tuple must have exactly one entry per
    spatial axis of the input it is used with (``ShapeError`` otherwise).  Lists are
    stored as tuples.  Wrong types raise ``TypeError``, out-of-domain values
    ``DomainError``.
    """

    stride: IntOrTuple
    padding: IntOrTuple
    dilation: IntOrTuple
    groups: int = 1

    def __post_init__(self):
        object.__setattr__(self, "stride", _option_field("stride", self.stride, 1))
        object.__setattr__(self, "padding", _option_field("padding", self.padding, 0))
        object.__setattr__(self, "dilation", _option_field("dilation", self.dilation, 1))
        object.__setattr__(self, "groups", _checks.integer("ConvOptions", "groups", self.groups, min=1))


# --------------------------------------------------------------------------- validation
def _options(fname, options):
    if not isinstance(options, ConvOptions):
        raise TypeError(f"{fname}: options must be a ConvOptions (got {type(options).__name__} {options!r:.80})")
    return options


def _per_axis(fname, options, rank, kernel=None):
    """``(stride, padding, dilation, crop)`` per spatial axis (remembered per options,
    rank and kernel shape: a training loop asks for the same ones every step; errors are
    raised on every call).

    ``padding`` is the symmetric padding the kernels run with.  For ``"same"`` with an odd
    total ``d(K-1)`` PyTorch pads one zero more after than before; that equals symmetric
    padding by the larger amount with the first output position cut off, so ``crop[a]``
    (0 or 1) is the number of leading output positions to drop on axis ``a``."""
    # ConvOptions is frozen and its fields are normalised to ints, tuples and strings, so
    # it is a dictionary key as it is
    return _per_axis_cached(fname, options, rank, None if kernel is None else tuple(kernel))


def _per_axis_uncached(fname, options, rank, kernel=None):
    stride = _checks.int_tuple(fname, "options.stride", options.stride, rank, min=1)
    dilation = _checks.int_tuple(fname, "options.dilation", options.dilation, rank, min=1)
    crop = (0,) * rank
    if options.padding == "valid":
        padding = (0,) * rank
    elif options.padding == "same":
        if any(st != 1 for st in stride):
            raise DomainError(f"{fname}: padding 'same' needs stride 1 on every axis "
                              f"(got stride {stride})")
        if kernel is None:
            raise DomainError(f"{fname}: padding 'same' is not defined here "
                              f"(use 'valid' or explicit padding)")
        total = tuple(dilation[a] * (kernel[a] - 1) for a in range(rank))
        padding = tuple(t - t // 2 for t in total)
        crop = tuple(t - 2 * (t // 2) for t in total)
    else:
        padding = _checks.int_tuple(fname, "options.padding", options.padding, rank, min=0)
    return stride, padding, dilation, crop


_per_axis_cached = functools.lru_cache(maxsize=256)(_per_axis_uncached)


def _crop(out, crop):
    """``out`` without its first ``crop[a]`` positions on spatial axis ``a`` (a new
    C-contiguous array; ``out`` itself when nothing is cropped)."""
    if not any(crop):
        return out
    return np.ascontiguousarray(out[(slice(None), slice(None)) +
                                    tuple(slice(c, None) for c in crop)])


def _inputs(fname, x, weights, finite_x=True):
    """``(x, w, unbatched)``: ``x`` with a batch axis (an unbatched ``[Cin, *S]`` input,
    ``x.ndim == weights.ndim - 1``, gets a leading axis of length 1).  A batch of 0 is
    valid; every other axis must be non-empty."""
    w = _checks.tensor(fname, "weights", weights, min_ndim=3, max_ndim=5, nonempty=True)
    x = _checks.tensor(fname, "x", x, min_ndim=2, max_ndim=5, finite=finite_x)
    unbatched = x.ndim == w.ndim - 1
    if unbatched:
        x = x.reshape((1,) + x.shape)
    if w.ndim != x.ndim:
        raise ShapeError(f"{fname}: weights must have {x.ndim} axes like x (or x one axis fewer, "
                         f"unbatched) (got weights {_checks.shape_str(w.shape)}, "
                         f"x {_checks.shape_str(x.shape[unbatched:])})")
    if 0 in x.shape[1:]:
        raise ShapeError(f"{fname}: x must not have an empty channel or spatial axis "
                         f"(got shape {_checks.shape_str(x.shape[unbatched:])})")
    return x, w, unbatched


def _unbatch(out, unbatched):
    return out[0] if unbatched else out


def _bias(fname, bias, cout):
    if bias is None:
        return None
    return _checks.vector(fname, "bias", bias, cout)


def _require_divisible(fname, what, count, groups):
    if count % groups:
        raise ShapeOrDomainError(f"{fname}: {what} {count} is not divisible by groups {groups}")


def _check_output_size(fname, sizes, formula):
    for a, o in enumerate(sizes):
        if o < 1:
            raise ShapeOrDomainError(
                f"{fname}: output size along spatial axis {a} would be {o} "
                f"({formula(a)}; expected >= 1)")


def _checked(fname, out, finite):
    """``out`` after the finiteness verdict of the kernel: ``finite`` True is trusted;
    False, or None (the kernel path did not check), has ``out`` scanned
    (:func:`hmath_dl._checks.finish`; NumericOverflow when it is not finite)."""
    return _checks.finish(fname, True if finite else None, out=out, overflow=lambda i, code: (
        f"the result overflows float64 (a non-finite value in the output of shape "
        f"{_checks.shape_str(out.shape)})"))


def _forward(fname, x, w, bias, stride, padding, dilation, groups, crop):
    """Shared tail of convolution / depthwise_convolution (shapes already consistent; the
    finiteness of ``x`` not yet checked -- it is checked here, after the kernel, which
    usually verifies it as it copies the input, so that x is read once)."""
    S = x.shape[2:]
    K = w.shape[2:]
    O = tuple((S[a] + 2 * padding[a] - dilation[a] * (K[a] - 1) - 1) // stride[a] + 1
              for a in range(len(S)))
    _check_output_size(fname, O, lambda a: (
        f"floor((input {S[a]} + 2*padding {padding[a]} - dilation {dilation[a]}*(kernel {K[a]} - 1) - 1)"
        f" / stride {stride[a]}) + 1"))
    if any(padding):
        _checks.check_size(fname, x.shape[:2] + tuple(S[a] + 2 * padding[a] for a in range(len(S))))
    out = _checks.alloc(fname, (x.shape[0], w.shape[0]) + O)
    if x.shape[0] == 0:                       # an empty batch: nothing to compute
        return _crop(out, crop)
    _, finite, x_finite = conv_nd(x, w, bias, stride, padding, dilation, groups, out=out,
                                  report_finite=True)
    # x was validated without its finiteness scan: the row kernel checks every input
    # element as it copies it; other paths scan here, whatever the output (an element no
    # output reads is still reported), and before the output's verdict (NonFiniteError
    # before overflow)
    # (a tape value, or any array checked before and read-only since, is not scanned again)
    _checks.finish(fname, True if x_finite or _checks.known_finite(x) else _checks.is_finite(x),
                   inputs=(("x", x),))
    return _crop(_checked(fname, out, finite), crop)


# --------------------------------------------------------------------------- public
def convolution(options, x, weights, bias=None):
    """Direct grouped cross-correlation on 1-3 spatial axes.

    Parameters
    ----------
    options : ConvOptions
        stride ``s``, padding ``p``, dilation ``d`` (one per spatial axis) and ``groups``.
    x : array_like, shape ``(N, Cin, *S)`` or, unbatched, ``(Cin, *S)``
        ``x.ndim == weights.ndim - 1`` means unbatched: the result is then the batched
        result's first item, ``(Cout, *O)``, bit for bit.  ``N == 0`` gives an empty result.
        Input with 1-3 spatial axes.
    weights : array_like, shape ``(Cout, Cin/groups, *K)``
    bias : array_like of length Cout, or None

    Returns
    -------
    ndarray, shape ``(N, Cout, *O)``
        ``y[n, co, o] = bias[co] + sum_{ci' < Cin/groups} sum_k
        w[co, ci', k] * xpad[n, g*Cin/groups + ci', o*s + k*d]`` with ``g = co // (Cout/groups)``,
        ``xpad`` the input with ``p`` zeros on both sides of every spatial axis and
        ``O = floor((S + 2p - d(K-1) - 1)/s) + 1`` per axis (must be >= 1).
        Same numbers as ``torch.nn.functional.conv{1,2,3}d``.

    Raises
    ------
    TypeError
        ``options`` not a ConvOptions; non-numeric arrays.
    ShapeError
        x rank not 3-5, weights rank different from x, option tuples of the wrong length,
        channel counts that do not fit (``weights.shape[1] * groups != Cin``), bias length.
    ShapeOrDomainError (a ShapeError and a DomainError)
        ``groups`` not dividing Cin or Cout; an output size below 1.
    NonFiniteError
        NaN/inf in x, weights or bias.
    NumericOverflow
        A non-finite result.
    """
    fname = "convolution"
    options = _options(fname, options)
    x, w, unbatched = _inputs(fname, x, weights, finite_x=False)
    rank = x.ndim - 2
    stride, padding, dilation, crop = _per_axis(fname, options, rank, w.shape[2:])
    groups = options.groups
    cin, cout = x.shape[1], w.shape[0]
    _require_divisible(fname, "input channel count", cin, groups)
    _require_divisible(fname, "output channel count (weights.shape[0])", cout, groups)
    if w.shape[1] * groups != cin:
        raise ShapeError(f"{fname}: weights have {w.shape[1]} input channels per group, "
                         f"input has {cin} channels / groups {groups}")
    b = _bias(fname, bias, cout)
    return _unbatch(_forward(fname, x, w, b, stride, padding, dilation, groups, crop), unbatched)


def transposed_convolution(output_padding, options, x, weights, bias=None):
    """Transposed convolution: the adjoint (gradient with respect to the input) of
    :func:`convolution`.

    Parameters
    ----------
    output_padding : int or tuple of int
        Extra output positions at the end of each spatial axis, ``0 <= output_padding <
        max(stride, dilation)`` per axis (PyTorch's rule; an int is broadcast to every axis).
    options : ConvOptions
        stride ``s``, padding ``p``, dilation ``d`` and ``groups``.  ``padding="valid"``
        means 0; ``"same"`` is not defined for a transposed convolution (``DomainError``,
        as in PyTorch).
    x : array_like, shape ``(N, Cin, *S)`` or, unbatched, ``(Cin, *S)``
        ``x.ndim == weights.ndim - 1`` means unbatched: the result is then the batched
        result's first item, ``(Cout, *O)``, bit for bit.  ``N == 0`` gives an empty result.
    weights : array_like, shape ``(Cin, Cout/groups, *K)``
    bias : array_like of length Cout, or None

    Returns
    -------
    ndarray, shape ``(N, Cout, *O)``
        ``O = (S-1)s - 2p + d(K-1) + output_padding + 1`` per axis (must be >= 1) and
        ``y[n, co, o] = bias[co] + sum_{ci in group(co)} sum_{k, i : i*s + k*d = o + p}
        w[ci, co', k] * x[n, ci, i]`` with ``co' = co mod (Cout/groups)``.  With no bias,
        ``<convolution(opts, u, w), v> = <u, transposed_convolution(op, opts, v, w)>``.
        Same numbers as ``torch.nn.functional.conv_transpose{1,2,3}d``.

    Raises
    ------
    TypeError, ShapeError, ShapeOrDomainError, NonFiniteError, NumericOverflow
        As for :func:`convolution` (here ``weights.shape[0]`` must equal Cin);
        ``DomainError`` for an output padding outside ``[0, max(stride, dilation))``.
    """
    fname = "transposed_convolution"
    options = _options(fname, options)
    x, w, unbatched = _inputs(fname, x, weights)
    rank = x.ndim - 2
    stride, padding, dilation, _ = _per_axis(fname, options, rank)
    op = _checks.int_tuple(fname, "output_padding", output_padding, rank, min=0)
    for a in range(rank):
        if op[a] >= max(stride[a], dilation[a]):
            raise DomainError(f"{fname}: output_padding must be < max(stride, dilation) on every "
                              f"axis (got output_padding {op[a]}, stride {stride[a]}, dilation "
                              f"{dilation[a]} on spatial axis {a})")
    groups = options.groups
    cin = x.shape[1]
    _require_divisible(fname, "input channel count", cin, groups)
    if w.shape[0] != cin:
        raise ShapeError(f"{fname}: weights have {w.shape[0]} input channels (weights.shape[0]), "
                         f"input has {cin} channels")
    cout = w.shape[1] * groups
    b = _bias(fname, bias, cout)
    S = x.shape[2:]
    K = w.shape[2:]
    O = tuple((S[a] - 1) * stride[a] - 2 * padding[a] + dilation[a] * (K[a] - 1) + op[a] + 1
              for a in range(rank))
    _check_output_size(fname, O, lambda a: (
        f"(input {S[a]} - 1)*stride {stride[a]} - 2*padding {padding[a]} + dilation {dilation[a]}"
        f"*(kernel {K[a]} - 1) + output_padding {op[a]} + 1"))
    # the largest work array of the kernel (the polyphase input windows of the path for
    # fewer than 4 output channels per group): prod(stride) windows of ~O/s + K*d per axis
    nph = 1
    for a in range(rank):
        nph *= stride[a]
    _checks.check_size(fname, (x.shape[0], nph * cin) +
                       tuple(-(-O[a] // stride[a]) + K[a] * dilation[a] for a in range(rank)))
    out = _checks.alloc(fname, (x.shape[0], cout) + O)
    if x.shape[0] == 0:                       # an empty batch: nothing to compute
        return _unbatch(out, unbatched)
    _, finite = conv_transpose_nd(x, w, b, stride, padding, dilation, op, groups, out=out,
                                  report_finite=True)
    return _unbatch(_checked(fname, out, finite), unbatched)


def depthwise_convolution(options, x, weights, bias=None):
    """Depthwise convolution: :func:`convolution` with ``groups = Cin``.

    Parameters
    ----------
    options : ConvOptions
        stride, padding, dilation; ``options.groups`` must be 1 (the default, meaning
        "not set") or Cin, anything else raises ``DomainError``.
    x : array_like, shape ``(N, Cin, *S)`` or, unbatched, ``(Cin, *S)``
        ``x.ndim == weights.ndim - 1`` means unbatched: the result is then the batched
        result's first item, ``(Cout, *O)``, bit for bit.  ``N == 0`` gives an empty result.
    weights : array_like, shape ``(Cin*m, 1, *K)``
        ``m`` output channels per input channel (channel multiplier).
    bias : array_like of length Cin*m, or None

    Returns
    -------
    ndarray, shape ``(N, Cin*m, *O)``
        ``y[n, co, o] = bias[co] + sum_k w[co, 0, k] * xpad[n, co // m, o*s + k*d]``,
        ``O = floor((S + 2p - d(K-1) - 1)/s) + 1`` per axis (must be >= 1).

    Raises
    ------
    TypeError, ShapeError, ShapeOrDomainError, NonFiniteError, NumericOverflow
        As for :func:`convolution`; ``ShapeError`` when ``weights.shape[1] != 1`` or
        ``weights.shape[0]`` is not a multiple of Cin; ``DomainError`` for
        ``options.groups`` not in ``{1, Cin}``.
    """
    fname = "depthwise_convolution"
    options = _options(fname, options)
    x, w, unbatched = _inputs(fname, x, weights, finite_x=False)
    rank = x.ndim - 2
    stride, padding, dilation, crop = _per_axis(fname, options, rank, w.shape[2:])
    cin = x.shape[1]
    if options.groups not in (1, cin):
        raise DomainError(f"{fname}: options.groups must be 1 or the input channel count {cin} "
                          f"(got {options.groups})")
    if w.shape[1] != 1:
        raise ShapeError(f"{fname}: weights must have 1 input channel per group "
                         f"(got weights {_checks.shape_str(w.shape)}, expected [Cin*m, 1, *K])")
    if w.shape[0] % cin:
        raise ShapeError(f"{fname}: weights have {w.shape[0]} output channels, not a multiple of "
                         f"the input's {cin} channels")
    b = _bias(fname, bias, w.shape[0])
    return _unbatch(_forward(fname, x, w, b, stride, padding, dilation, cin, crop), unbatched)
