"""Pooling: windowed, adaptive and global max/average pooling on 1-3 spatial axes, max
pooling with indices and max unpooling (seed: HMath.DeepLearning.Layers, plus the
PyTorch-parity options of API.md section 8).

Layout ``x [N, C, *spatial]``; :func:`pooling`, :func:`max_pooling_with_indices` and
:func:`adaptive_pooling` also take an unbatched ``x [C, *spatial]`` (see below).  Every
flavour reduces, per output position, a box of input positions given per axis by the
positions ``lo, lo + d, ... < hi`` (``d`` the dilation; 1 for adaptive and global bins);
padding is never read (padded positions never win a max; whether they count in an
average's divisor is the ``count_include_pad`` option).  Kernels:
:mod:`hmath_dl._kernels.pool`, :mod:`hmath_dl._kernels.pool_indices`.

Batched or unbatched
--------------------
The rank of the spatial part comes from the per-axis argument (``window`` for pooling,
``output_size`` for adaptive pooling and unpooling):

* an **int** (broadcast to every axis) means ``x`` is batched, ``[N, C, *S]`` with 1-3
  spatial axes, exactly as before the unbatched form existed;
* a **sequence of r ints** means ``x`` is ``[N, C, *S]`` when ``x.ndim == r + 2`` and
  unbatched ``[C, *S]`` when ``x.ndim == r + 1``; the unbatched result is bitwise the
  batched result of ``x[None]`` without its leading axis.

Empty axes
----------
``N == 0`` (and also ``C == 0``) gives the empty result of the documented shape, after
every parameter has been checked against the spatial shape exactly as for a non-empty
batch.  A spatial axis of length 0 raises ``ShapeError`` (a window over nothing has no
max or mean).
"""

from __future__ import annotations

import collections
import enum
import functools

import numpy as np

from .. import _checks
from .._kernels.pool import adaptive_bounds, global_pool, pool_box_nd
from .._kernels.views import out5, readonly, readonly5
from ..errors import DomainError, IndexOutOfRange, ShapeError
from .convolution import ShapeOrDomainError

__all__ = ["PoolMode", "pooling", "max_pooling_with_indices", "max_unpooling",
           "adaptive_pooling", "global_pooling"]

_INT64_MAX = 2**63 - 1


class PoolMode(enum.Enum):
    """Pooling reduction: ``MAX`` (largest element) or ``AVERAGE`` (window sum divided by
    the window's divisor; by default the number of non-padding elements)."""

    MAX = "max"
    AVERAGE = "average"


#: What the backward pass needs to know about a pooling call (see ``_ad_pool``):
#: ``is_max``; ``unbatched``; ``x_shape`` / ``out_shape`` of the batched call; ``axes``,
#: one ``(lo, hi, step, count)`` per spatial axis (int64 arrays, ``step`` an int).
BoxPlan = collections.namedtuple("BoxPlan", "is_max unbatched x_shape out_shape axes")


# --------------------------------------------------------------------------- shared checks
def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _batched(fname, name, spec, x, *, xname="x"):
    """``(x viewed as [N, C, *S], unbatched)`` following the module's rank rule (an int
    ``spec``: batched; a sequence of ``r``: ``r + 2`` axes batched, ``r + 1`` unbatched)."""
    if _is_int(spec):
        if not 3 <= x.ndim <= 5:
            raise ShapeError(
                f"{fname}: {xname} must have 3 to 5 axes [N, C, *spatial] when {name} is an int "
                f"(got shape {_checks.shape_str(x.shape)}; pass {name} as a tuple, one entry per "
                f"spatial axis, for an unbatched [C, *spatial] input)")
        return x, False
    r = len(_checks.int_tuple(fname, name, spec))     # TypeError for non-int entries
    if not 1 <= r <= 3:
        raise ShapeError(f"{fname}: {name} must have 1 to 3 entries, one per spatial axis "
                         f"(got {r}: {tuple(spec)!r})")
    if x.ndim == r + 2:
        return x, False
    if x.ndim == r + 1:
        return x.reshape((1,) + x.shape), True
    raise ShapeError(
        f"{fname}: {xname} of shape {_checks.shape_str(x.shape)} does not fit {name} with {r} "
        f"entries (expected {r + 2} axes [N, C, *spatial] or {r + 1} axes [C, *spatial])")


def _nonempty_spatial(fname, x, unbatched, xname="x"):
    S = x.shape[2:]
    if any(s == 0 for s in S):
        shown = x.shape[1:] if unbatched else x.shape
        raise ShapeError(f"{fname}: {xname} has an empty spatial axis (got shape "
                         f"{_checks.shape_str(shown)}; expected every spatial size >= 1)")


def _input(fname, mode, x, name=None, spec=None):
    """Mode, ``x`` as a float64 array (finiteness is checked by the kernels, on the data
    they read anyway), batched view and flag."""
    mode = _checks.member(fname, "mode", mode, PoolMode)
    x = _checks.tensor(fname, "x", x, finite=False)
    if name is None:
        if not 3 <= x.ndim <= 5:
            raise ShapeError(f"{fname}: x must have 3 to 5 axes [N, C, *spatial] "
                             f"(got shape {_checks.shape_str(x.shape)})")
        xb, unbatched = x, False
    else:
        xb, unbatched = _batched(fname, name, spec, x)
    _nonempty_spatial(fname, xb, unbatched)
    return mode, xb, unbatched


def _finish_count(fname, bad, x, out):
    """The pooling kernels' report (the number of bad (n, c) planes, 0 when all is well)
    through the one finishing step: a NaN/inf in ``x`` is named first (NonFiniteError),
    else NumericOverflow."""
    _checks.finish(fname, bad == 0, inputs=(("x", x),), overflow=lambda i, code: (
        f"a window sum overflows float64 (non-finite value in the output of shape "
        f"{_checks.shape_str(out.shape)})"))


def _run(fname, is_max, x, out_spatial, axes, unbatched=False):
    out = _checks.alloc(fname, x.shape[:2] + tuple(out_spatial))
    bad = pool_box_nd(x, axes, is_max, out)
    # (an unbatched input is named as the caller gave it)
    _finish_count(fname, bad, x[0] if unbatched else x, out[0] if unbatched else out)
    return out


def _finish(out, unbatched):
    return out[0] if unbatched else out


# --------------------------------------------------------------------------- windowed pooling
def _window_axis(S, k, s, p, d, O):
    """Per-axis window description: ``(lo, hi, real, padded)`` int64 arrays over the
    ``O`` outputs.  Window ``o`` reads ``t_j = o*s - p + j*d``, ``0 <= j < k``; ``real`` is
    the number of ``t_j`` in ``[0, S)``, which are ``lo, lo + d, ... < hi``; ``padded`` the
    number of ``t_j`` in ``[-p, S + p)``."""
    start = np.arange(O, dtype=np.int64) * s - p
    if d == 1:     # the common case, in few array operations (calls on small inputs)
        end = start + k
        lo = np.maximum(start, 0)
        hi = np.minimum(end, S)
        real = np.maximum(hi - lo, 0)
        return lo, hi, real, np.minimum(end, S + p) - start
    j0 = np.maximum((-start + d - 1) // d, 0)
    j1 = np.minimum((S - 1 - start) // d, k - 1)
    real = np.maximum(j1 - j0 + 1, 0)
    lo = np.where(real > 0, start + j0 * d, 0)
    hi = np.where(real > 0, start + j1 * d + 1, 0)
    padded = np.minimum((S + p - 1 - start) // d, k - 1) + 1
    return lo, hi, real, padded


def _frozen(a):
    a = np.ascontiguousarray(a, dtype=np.int64)
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=1024)
def _axis_plan(S, k, s, p, d, O, count_include_pad):
    """Cached, read-only ``(lo, hi, count, first_empty)`` of one axis (``count`` the real
    or, with ``count_include_pad``, the padded count; ``first_empty`` the first window
    without a real element, or -1).  Plans repeat from call to call (a network's layers),
    so the per-call cost of a small pooling stays that of the kernel."""
    lo, hi, real, padded = _window_axis(S, k, s, p, d, O)
    empty = np.flatnonzero(real == 0)
    return (_frozen(lo), _frozen(hi), _frozen(padded if count_include_pad else real),
            int(empty[0]) if empty.size else -1)


@functools.lru_cache(maxsize=256)
def _constant(n, value):
    """A cached read-only int64 array of ``n`` copies of ``value``."""
    return _frozen(np.full(n, value, dtype=np.int64))


@functools.lru_cache(maxsize=1024)
def _adaptive_axis(S, O):
    lo, hi = adaptive_bounds(S, O)
    return _frozen(lo), _frozen(hi), _frozen(hi - lo)


def _window_plan(fname, mode, window, stride, padding, x, dilation, ceil_mode,
                 count_include_pad, divisor_override):
    """Check the window parameters against ``x [N, C, *S]``; return ``(O, axes)``.
    Remembered per arguments and input shape when they are hashable (a network calls the
    same poolings every step; a call that raises is not remembered, so it raises again)."""
    key = (fname, mode, window, stride, padding, x.shape, dilation, ceil_mode,
           count_include_pad, divisor_override)
    try:
        hit = _PLANS.get(key)
    except TypeError:        # a list among the arguments
        return _window_plan_uncached(*key)
    if hit is None:
        hit = _window_plan_uncached(*key)
        if len(_PLANS) >= 1024:
            _PLANS.clear()
        _PLANS[key] = hit
    return hit


_PLANS = {}


def _window_plan_uncached(fname, mode, window, stride, padding, shape, dilation, ceil_mode,
                          count_include_pad, divisor_override):
    rank = len(shape) - 2
    k = _checks.int_tuple(fname, "window", window, rank, min=1)
    s = _checks.int_tuple(fname, "stride", stride, rank, min=1)
    p = _checks.int_tuple(fname, "padding", padding, rank, min=0)
    d = (1,) * rank if dilation is None else _checks.int_tuple(fname, "dilation", dilation,
                                                                rank, min=1)
    ceil_mode = _checks.boolean(fname, "ceil_mode", ceil_mode)
    count_include_pad = _checks.boolean(fname, "count_include_pad", count_include_pad)
    if divisor_override is not None:
        divisor_override = _checks.integer(fname, "divisor_override", divisor_override,
                                           min=1, max=_INT64_MAX)
    is_max = mode is PoolMode.MAX
    if is_max and count_include_pad:
        raise DomainError(f"{fname}: count_include_pad=True applies to AVERAGE pooling only "
                          f"(got mode MAX)")
    if is_max and divisor_override is not None:
        raise DomainError(f"{fname}: divisor_override applies to AVERAGE pooling only "
                          f"(got mode MAX, divisor_override {divisor_override})")
    S = shape[2:]
    O = []
    for a in range(rank):
        num = S[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1
        if ceil_mode:
            o = (num + s[a] - 1) // s[a] + 1
            if o >= 1 and (o - 1) * s[a] >= S[a] + p[a]:
                o -= 1      # the last window would start in the right padding or beyond
        else:
            o = num // s[a] + 1
        if o < 1:
            rule = "ceil" if ceil_mode else "floor"
            raise ShapeOrDomainError(
                f"{fname}: output size along spatial axis {a} would be {o} ({rule}((input {S[a]} "
                f"+ 2*padding {p[a]} - dilation {d[a]}*(window {k[a]} - 1) - 1) / stride {s[a]}) + 1; "
                f"expected >= 1)")
        O.append(o)
    O = tuple(O)
    _checks.check_size(fname, shape[:2] + O)
    _checks.check_size(fname, O)      # the per-axis bound arrays, even for an empty batch
    lets_empty = not is_max and (count_include_pad or divisor_override is not None)
    axes = []
    for a in range(rank):
        lo, hi, count, first_empty = _axis_plan(S[a], k[a], s[a], p[a], d[a], O[a],
                                                count_include_pad)
        if not lets_empty and first_empty >= 0:
            o = first_empty
            t0 = o * s[a] - p[a]
            where = (f"positions [{t0}, {t0 + k[a]})" if d[a] == 1 else
                     f"positions {t0} + j*{d[a]}, 0 <= j < {k[a]},")
            shown = ", ".join(f"{n} {v[a]}" for n, v in
                              (("window", k), ("stride", s), ("padding", p), ("dilation", d)))
            raise DomainError(
                f"{fname}: window {o} along spatial axis {a} covers only padding ({where} of an "
                f"input of size {S[a]}; got {shown}{', ceil_mode' if ceil_mode else ''})")
        if divisor_override is not None:
            count = _constant(O[a], divisor_override if a == 0 else 1)
        axes.append((lo, hi, d[a], count))
    return O, tuple(axes)


def _pooling(fname, mode, window, stride, padding, x, dilation=None, ceil_mode=False,
             count_include_pad=False, divisor_override=None):
    """:func:`pooling` returning ``(result, BoxPlan)``."""
    mode, x, unbatched = _input(fname, mode, x, "window", window)
    O, axes = _window_plan(fname, mode, window, stride, padding, x, dilation,
                           ceil_mode, count_include_pad, divisor_override)
    is_max = mode is PoolMode.MAX
    out = _run(fname, is_max, x, O, axes, unbatched)
    return _finish(out, unbatched), BoxPlan(is_max, unbatched, x.shape, out.shape, axes)


def pooling(mode, window, stride, padding, x, *, dilation=None, ceil_mode=False,
            count_include_pad=False, divisor_override=None):
    """Windowed max or average pooling (PyTorch's ``max_pool{1,2,3}d`` /
    ``avg_pool{1,2,3}d``).

    Parameters
    ----------
    mode : PoolMode
    window, stride, padding : int or tuple of int
        One per spatial axis (an int is broadcast to every axis): window ``k >= 1``,
        stride ``s >= 1``, symmetric padding ``p >= 0`` (any size; PyTorch's ``p <= k/2``
        is not required, only that no window is made of padding alone, see Raises).
        An int ``window`` means ``x`` is batched; a tuple of ``r`` entries with
        ``x.ndim == r + 1`` means ``x`` is unbatched ``[C, *S]`` (module docstring).
    x : array_like, shape ``(N, C, *S)`` or ``(C, *S)``, 1-3 spatial axes
        ``N == 0`` gives an empty result.
    dilation : int or tuple of int, optional, keyword-only
        ``d >= 1`` per axis (default 1): window element ``j`` of an axis reads position
        ``o*s - p + j*d``.
    ceil_mode : bool, keyword-only
        Use ``ceil`` instead of ``floor`` in the output size, then (as in PyTorch) drop the
        last window if it would start at or beyond ``S + p``.
    count_include_pad : bool, keyword-only
        AVERAGE only.  True: the divisor is the number of window positions inside the
        padded extent ``[-p, S + p)`` (padding zeros included, positions past the padded
        extent, possible with ``ceil_mode``, not counted).  False (default): the number of
        real elements.
    divisor_override : int, optional, keyword-only
        AVERAGE only: ``1 <= divisor_override < 2**63``; every window sum is divided by
        ``float64(divisor_override)`` (takes precedence over ``count_include_pad``).

    Returns
    -------
    ndarray, shape ``(N, C, *O)`` (or ``(C, *O)`` for an unbatched x)
        Per axis ``O = floor((S + 2p - d(k-1) - 1)/s) + 1`` (``ceil`` with ``ceil_mode``,
        then reduced by one if ``(O-1)*s >= S + p``); it must be >= 1.  Output ``o`` reads
        the real positions ``t_j = o*s - p + j*d`` (``0 <= j < k``, ``0 <= t_j < S``) on
        every axis: MAX gives their maximum; AVERAGE their sum divided by the product over
        the axes of the per-axis divisor (the number of real positions, or of positions in
        ``[-p, S + p)`` with ``count_include_pad``; ``divisor_override`` replaces the whole
        product).  The sum is formed separably, along the first spatial axis, then the
        second, then the third (each in increasing position), and divided once.

    Raises
    ------
    TypeError
        ``mode`` not a PoolMode, non-integer window/stride/padding/dilation/divisor,
        non-bool ceil_mode/count_include_pad, non-numeric x.
    ShapeError
        x rank not fitting the window (3-5 axes for an int window), an empty spatial axis,
        tuples of the wrong length, an output too large to allocate.
    DomainError
        window < 1, stride < 1, padding < 0, dilation < 1, divisor_override < 1;
        ``count_include_pad=True`` or a ``divisor_override`` with MAX; a window with no
        real element (only padding), unless AVERAGE with ``count_include_pad=True`` or a
        ``divisor_override`` makes its value a well-defined 0.
    ShapeOrDomainError (a ShapeError and a DomainError)
        An output size below 1.
    NonFiniteError
        NaN/inf in x.
    NumericOverflow
        An average whose sum overflows.
    """
    out, _ = _pooling("pooling", mode, window, stride, padding, x, dilation, ceil_mode,
                      count_include_pad, divisor_override)
    return out


def max_pooling_with_indices(window, stride, padding, x, *, dilation=None, ceil_mode=False):
    """Max pooling that also returns where each maximum came from (PyTorch's
    ``max_pool{1,2,3}d(..., return_indices=True)``).

    Parameters
    ----------
    window, stride, padding, x, dilation, ceil_mode
        As for :func:`pooling` (MAX mode; the same batched/unbatched rule).

    Returns
    -------
    values : ndarray, shape ``(N, C, *O)`` (or ``(C, *O)``)
        Bitwise ``pooling(PoolMode.MAX, window, stride, padding, x, dilation=...,
        ceil_mode=...)``.
    indices : int64 ndarray, same shape
        ``indices[n, c, *o]`` is the flat row-major index ``(t_0*S_1 + t_1)*S_2 + t_2``
        (for three spatial axes; likewise for one or two) within the ``(n, c)`` input
        plane of the element that won: the FIRST maximum in row-major window order (an
        element replaces the current winner only if strictly greater, as in PyTorch).
        ``x[n, c].flat[indices[n, c, *o]] == values[n, c, *o]``; when that maximum is a
        zero and the window holds both ``+0.0`` and ``-0.0`` the two may differ in the sign
        of the zero (``values`` keeps :func:`pooling`'s).

    Raises
    ------
    TypeError, ShapeError, DomainError, ShapeOrDomainError, NonFiniteError
        As for :func:`pooling` (MAX).
    """
    from .._kernels.pool import boxes3
    from .._kernels.pool_indices import first_max_indices
    fname = "max_pooling_with_indices"
    _, xb, unbatched = _input(fname, PoolMode.MAX, x, "window", window)
    O, axes = _window_plan(fname, PoolMode.MAX, window, stride, padding, xb, dilation,
                           ceil_mode, False, None)
    out = _run(fname, True, xb, O, axes, unbatched)        # the values: exactly pooling(MAX)'s
    idx = _checks.alloc(fname, out.shape, np.int64)
    if out.size:
        first_max_indices.sized(xb.size)(readonly5(xb), *boxes3(axes)[:9], readonly5(out),
                                          out5(idx))
    return _finish(out, unbatched), _finish(idx, unbatched)


def max_unpooling(values, indices, output_size):
    """Partial inverse of max pooling (PyTorch's ``max_unpool{1,2,3}d``): scatter each
    value to the input position its index names.

    Parameters
    ----------
    values : array_like, shape ``(N, C, *O)`` or ``(C, *O)``, 1-3 spatial axes
        Finite.
    indices : int array_like, the shape of ``values``
        Flat row-major indices within one ``(n, c)`` plane of the result (as
        :func:`max_pooling_with_indices` returns them), ``0 <= index < prod(output_size)``.
    output_size : int or tuple of int
        The result's spatial shape, ``>= 1`` per axis.  An int is broadcast and means
        ``values`` is batched; a tuple of ``r`` entries with ``values.ndim == r + 1`` means
        unbatched (module docstring).

    Returns
    -------
    ndarray, shape ``(N, C, *output_size)`` (or ``(C, *output_size)``)
        Zeros, except ``y[n, c].flat[indices[n, c, i]] = values[n, c, i]`` for every
        position ``i`` of the plane, applied in row-major order of ``values``: when two
        entries name the same element, the later one wins.

    Raises
    ------
    TypeError
        Non-numeric values, non-integer (float, bool) indices or output_size.
    ShapeError
        ``values`` and ``indices`` of different shapes, a rank not fitting output_size,
        an output too large to allocate.
    DomainError
        An output_size entry below 1.
    IndexOutOfRange
        An index outside ``[0, prod(output_size))`` (negatives too).
    NonFiniteError
        NaN/inf in values.
    """
    from .._kernels.pool_indices import max_unpool
    fname = "max_unpooling"
    values = _checks.tensor(fname, "values", values)
    indices = _checks.int_array(fname, "indices", indices)
    if values.shape != indices.shape:
        raise ShapeError(f"{fname}: values and indices must have the same shape (got values "
                         f"{_checks.shape_str(values.shape)}, indices "
                         f"{_checks.shape_str(indices.shape)})")
    vb, unbatched = _batched(fname, "output_size", output_size, values, xname="values")
    rank = vb.ndim - 2
    size = _checks.int_tuple(fname, "output_size", output_size, rank, min=1)
    M = 1
    for s in size:
        M *= s
    shape = vb.shape[:2] + size
    _checks.check_size(fname, shape)
    if indices.size:
        bad = (indices < 0) | (indices >= M)
        if bad.any():
            flat = int(np.flatnonzero(bad)[0])
            where = tuple(int(i) for i in np.unravel_index(flat, indices.shape))
            raise IndexOutOfRange(
                f"{fname}: indices{list(where)} = {int(indices.reshape(-1)[flat])} is outside "
                f"the output plane (output_size {size} has {M} elements; expected "
                f"0 <= index < {M})")
    out = _checks.alloc(fname, shape)
    P = shape[0] * shape[1]
    if out.size:
        L = vb.size // P
        max_unpool.sized(out.size)(readonly(vb.reshape(P, L)),
                                    readonly(indices.reshape(P, L)), out.reshape(P, M))
    return _finish(out, unbatched)


# --------------------------------------------------------------------------- adaptive, global
def _adaptive(fname, mode, output_size, x):
    """:func:`adaptive_pooling` returning ``(result, BoxPlan)``."""
    mode, x, unbatched = _input(fname, mode, x, "output_size", output_size)
    rank = x.ndim - 2
    O = _checks.int_tuple(fname, "output_size", output_size, rank, min=1)
    _checks.check_size(fname, x.shape[:2] + O)
    _checks.check_size(fname, O)
    S = x.shape[2:]
    axes = []
    for a in range(rank):
        lo, hi, count = _adaptive_axis(S[a], O[a])
        axes.append((lo, hi, 1, count))
    is_max = mode is PoolMode.MAX
    out = _run(fname, is_max, x, O, axes, unbatched)
    return _finish(out, unbatched), BoxPlan(is_max, unbatched, x.shape, out.shape, axes)


def adaptive_pooling(mode, output_size, x):
    """Adaptive max or average pooling to a given output size.

    Parameters
    ----------
    mode : PoolMode
    output_size : int or tuple of int
        ``out >= 1`` per spatial axis (an int is broadcast); ``out > S`` is allowed.  An
        int means ``x`` is batched; a tuple of ``r`` entries with ``x.ndim == r + 1``
        means ``x`` is unbatched ``[C, *S]`` (module docstring).
    x : array_like, shape ``(N, C, *S)`` or ``(C, *S)``, 1-3 spatial axes
        ``N == 0`` gives an empty result.

    Returns
    -------
    ndarray, shape ``(N, C, *output_size)`` (or ``(C, *output_size)``)
        Bin ``i`` of an axis of length ``S`` covers ``[floor(i*S/out), ceil((i+1)*S/out))``
        (bins overlap when ``S`` is not a multiple of ``out``, as in PyTorch); MAX gives the
        maximum of the box of bins, AVERAGE its sum (separably, first spatial axis first)
        divided once by the number of elements in the box.

    Raises
    ------
    TypeError, ShapeError, NonFiniteError, NumericOverflow
        As for :func:`pooling`; ``DomainError`` for an output size < 1.
    """
    out, _ = _adaptive("adaptive_pooling", mode, output_size, x)
    return out


def _global(fname, mode, x, plan=True):
    """:func:`global_pooling` returning ``(result, BoxPlan or None)``."""
    mode, x, _ = _input(fname, mode, x)
    S = x.shape[2:]
    out = _checks.alloc(fname, x.shape[:2])
    if out.size:
        S5 = (1,) * (5 - x.ndim) + S
        _finish_count(fname, global_pool(readonly(x.reshape((-1,) + S5)),
                                         mode is PoolMode.MAX, out.reshape(-1)), x, out)
    if not plan:
        return out, None
    axes = [(_constant(1, 0), _constant(1, n), 1, _constant(1, n)) for n in S]
    return out, BoxPlan(mode is PoolMode.MAX, False, x.shape, x.shape[:2] + (1,) * len(S), axes)


def global_pooling(mode, x):
    """Global max or average pooling over all spatial axes.

    Parameters
    ----------
    mode : PoolMode
    x : array_like, shape ``(N, C, *S)``, 1-3 spatial axes (always batched)
        ``N == 0`` gives an empty result.

    Returns
    -------
    ndarray, shape (N, C)
        ``y[n, c] = max_s x[n, c, s]`` (MAX) or ``sum_s x[n, c, s] / prod(S)`` (AVERAGE,
        summed separably, first spatial axis first, divided once).

    Raises
    ------
    TypeError, ShapeError, NonFiniteError, NumericOverflow
        As for :func:`pooling`.
    """
    out, _ = _global("global_pooling", mode, x, plan=False)
    return out

