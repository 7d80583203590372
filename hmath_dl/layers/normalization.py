"""Normalisation layers: batch, layer, instance, group, RMS and weight normalisation.

Statistics are two-pass (mean, then the sum of squared deviations about it) over
cache-resident chunks of at most 2048 elements, and the chunks of a row/channel are merged
in order with Chan's update ``M2 = M2_a + M2_b + delta**2 n_a n_b / n`` (a row of at most
2048 elements is plain two-pass).  Everything for one row/channel runs in a fixed order
inside one parallel iteration, so results are bitwise identical for any
``NUMBA_NUM_THREADS``.  Inputs are never pre-scanned for NaN/inf: the kernels notice
a non-finite row sum and the facade then reports the offending element.  Rows whose sums
overflow although every input is finite (``|x|`` near ``1e308``) are recomputed with an
exact power-of-two scaling, so they give the mathematically defined (finite) result.

Affine options (``weight``/``bias`` of layer, RMS, group and instance norm): the same
kernel pass computes ``xhat`` bitwise as without them and then ``(xhat * weight) + bias``
with two roundings (never a fused multiply-add), so the affine result equals numpy's
``xhat * weight + bias`` bit for bit; without them the original kernel runs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _checks
from ..errors import DomainError, ShapeError
from .dropout import Mode

__all__ = ["BatchNormState", "batch_norm", "layer_norm", "instance_norm", "group_norm",
           "rms_norm", "weight_norm"]


# --------------------------------------------------------------------------- helpers
def _epsilon(fname, epsilon):
    return _checks.real(fname, "epsilon", epsilon, positive=True)


def _raise_status(fname, status, xa, what="x", unit="row"):
    """The kernels' per-unit status codes (:mod:`.._kernels.status`) through the one
    finishing step: a NaN/inf in ``xa`` is reported before anything else, then the first
    bad unit (ZERO_SLICE: DomainError, anything else: NumericOverflow)."""
    if not status.any():            # the usual case, without building the messages
        return
    _checks.finish(
        fname, status, inputs=((what, xa),),
        zero_slice=lambda i: (f"{unit} {i} of {what} is all zeros (its norm is 0; "
                              f"expected a non-zero slice)"),
        overflow=lambda i, code: (f"result is not finite for {unit} {i} "
                                  f"(intermediate values exceed the float64 range)"))


def _rows(fname, xa, rows, n, eps, center):
    """Normalise ``[rows, n]`` without an affine map (:func:`_rows_affine` with neither)."""
    return _rows_affine(fname, xa, rows, n, eps, center, None, None, True, 1, n, 1)


def _affine_param(fname, name, value, shape, what):
    """``weight`` / ``bias``: None, or a finite float64 array of exactly ``shape``."""
    if value is None:
        return None
    a = _checks.tensor(fname, name, value, finite=False)
    if a.shape != tuple(shape):
        raise ShapeError(f"{fname}: {name} has the wrong shape (got {_checks.shape_str(a.shape)}, "
                         f"expected {_checks.shape_str(shape)}: {what}; no broadcasting)")
    _checks.require_finite(fname, name, a)
    return a


_NO_XHAT = np.empty(0)     # normalize_rows_affine's xhat output when xhat is not kept


def _rows_affine(fname, xa, rows, n, eps, center, w, b, per_elem, groups, cpg, s, xh=None):
    """Normalise ``[rows, n]`` and apply ``(xhat * w) + b`` in the same kernel pass
    (``xh``, an array of ``xa``'s size, ``per_elem`` only: receives ``xhat`` too).

    ``per_elem``: ``w``/``b`` of length ``n`` (layer / RMS norm); otherwise per channel of
    ``[N, groups * cpg, s]`` (group / instance norm).  ``w`` None means no product (the
    kernel multiplies by ones: ``xhat * 1.0`` is ``xhat`` exactly, signs too), ``b`` None
    no sum: one kernel for every normalisation over rows.  The arrays go to the kernel
    as read-only views (one compiled specialisation whatever the caller's flags)."""
    from .._kernels.norm import LANES, normalize_rows_affine
    from .._kernels.views import readonly

    out = _checks.alloc(fname, xa.shape)
    if out.size == 0:
        return out
    length = n if per_elem else groups * cpg
    wk = np.ones(length) if w is None else w.reshape(-1)
    has_b = b is not None
    bk = b.reshape(-1) if has_b else np.zeros(length)
    # |xhat| <= sqrt(n): outputs can only leave the float64 range when this bound is huge
    check = False
    if w is not None or has_b:
        wmax = float(np.abs(wk).max()) if wk.size else 0.0   # max: exact, order-free
        bmax = float(np.abs(bk).max()) if has_b and bk.size else 0.0
        check = wmax * (n ** 0.5) * 1.001 + bmax > 1.0e300
    status = np.zeros(rows, dtype=np.int8)
    normalize_rows_affine.sized(xa.size)(readonly(xa.reshape(-1)), rows, n, eps, center,
                                         LANES, readonly(wk), readonly(bk), has_b, per_elem,
                                         groups, cpg, s, check, out.reshape(-1), status,
                                         _NO_XHAT if xh is None else xh.reshape(-1))
    _raise_status(fname, status, xa)
    return out


def _prod(shape):
    p = 1
    for s in shape:
        p *= int(s)
    return p


# --------------------------------------------------------------------------- batch norm
@dataclass(frozen=True, eq=False)
class BatchNormState:
    """Running statistics of a batch-norm layer (immutable).

    Attributes
    ----------
    running_mean : ndarray, shape ``(C,)``, read-only
    running_variance : ndarray, shape ``(C,)``, read-only, every entry ``>= 0``
    batches_seen : int
        Number of training batches folded in (``>= 0``).

    The constructor copies the arrays (any array-like), checks equal lengths
    (``ShapeError``), finiteness (``NonFiniteError``), non-negative variances and
    ``batches_seen >= 0`` (``DomainError``).  Equality compares the values.
    """

    running_mean: np.ndarray
    running_variance: np.ndarray
    batches_seen: int = 0

    def __post_init__(self):
        fname = "BatchNormState"
        mean = _checks.tensor(fname, "running_mean", self.running_mean, ndim=1)
        var = _checks.tensor(fname, "running_variance", self.running_variance, ndim=1)
        if mean.shape != var.shape:
            raise ShapeError(f"{fname}: running_mean and running_variance must have the same "
                             f"length (got {mean.shape[0]} and {var.shape[0]})")
        if var.size and var.min() < 0.0:
            i = int(np.argmin(var))
            raise DomainError(f"{fname}: running_variance must be >= 0 (got {var[i]!r} at "
                              f"index {i})")
        seen = _checks.integer(fname, "batches_seen", self.batches_seen, min=0)
        object.__setattr__(self, "running_mean", _checks.owned_readonly(mean))
        object.__setattr__(self, "running_variance", _checks.owned_readonly(var))
        object.__setattr__(self, "batches_seen", seen)

    @classmethod
    def initial(cls, channels) -> "BatchNormState":
        """Zero means, unit variances, no batches seen; ``channels >= 1`` (DomainError)."""
        c = _checks.integer("BatchNormState.initial", "channels", channels, min=1)
        return cls(np.zeros(c), np.ones(c), 0)

    @property
    def channels(self) -> int:
        return int(self.running_mean.shape[0])

    def __eq__(self, other):
        if not isinstance(other, BatchNormState):
            return NotImplemented
        return (self.batches_seen == other.batches_seen
                and np.array_equal(self.running_mean, other.running_mean)
                and np.array_equal(self.running_variance, other.running_variance))

    def __hash__(self):
        return hash((self.batches_seen, self.running_mean.tobytes(),
                     self.running_variance.tobytes()))


def batch_norm(mode, momentum, epsilon, gamma, beta, state, x):
    """Batch normalisation over the batch and spatial axes, per channel.

    Parameters
    ----------
    mode : Mode
    momentum : float
        In ``[0, 1]``: weight of the new batch in the running statistics.
    epsilon : float
        Finite, ``> 0``.
    gamma, beta : array_like, length C
        Per-channel scale and shift.
    state : BatchNormState
        Running statistics with C channels.
    x : array_like, shape ``[N, C]`` or ``[N, C, *spatial]``

    Returns
    -------
    (y, state)
        ``y = gamma * (x - mean) / sqrt(var + epsilon) + beta`` per channel.
        TRAINING: ``mean``/``var`` are the batch mean and **population** variance over
        ``N`` and the spatial axes (``m = N * prod(spatial)`` values, ``m >= 1``); the
        returned state has ``running = (1 - momentum) * running + momentum * stat`` with
        the **unbiased** variance ``var * m / (m - 1)`` (population variance when
        ``m == 1``) and ``batches_seen + 1``.
        INFERENCE: ``mean``/``var`` are the running statistics; ``state`` is returned
        unchanged (the same object).

    Raises
    ------
    TypeError
        ``mode`` not a Mode, ``state`` not a BatchNormState, non-numeric arguments.
    DomainError
        ``momentum`` outside ``[0, 1]``; ``epsilon`` not finite or ``<= 0``.
    ShapeError
        ``x`` with fewer than 2 axes; ``gamma``/``beta``/state not of length C; an empty
        ``x`` in TRAINING (no statistics).
    NonFiniteError
        NaN/inf in ``x``, ``gamma`` or ``beta``.
    NumericOverflow
        a result or an updated running statistic is not finite.
    """
    fname = "batch_norm"
    mode = _checks.member(fname, "mode", mode, Mode)
    momentum = _checks.real(fname, "momentum", momentum, lo=0.0, hi=1.0)
    eps = _epsilon(fname, epsilon)
    if not isinstance(state, BatchNormState):
        raise TypeError(f"{fname}: state must be a BatchNormState (got {type(state).__name__})")
    xa = _checks.tensor(fname, "x", x, min_ndim=2, finite=False)
    n, c = xa.shape[0], xa.shape[1]
    g = _checks.vector(fname, "gamma", gamma, c)
    b = _checks.vector(fname, "beta", beta, c)
    if state.channels != c:
        raise ShapeError(f"{fname}: state has {state.channels} channels, x has {c} "
                         f"(x shape {_checks.shape_str(xa.shape)})")
    s = _prod(xa.shape[2:])
    out = _checks.alloc(fname, xa.shape)
    status = np.zeros(c, dtype=np.int8)
    if mode is Mode.INFERENCE:
        if out.size == 0:
            return out, state
        from .._kernels.norm import batch_norm_apply

        rv = state.running_variance
        # 2 sqrt(v/4 + eps/4) == sqrt(v + eps) exactly in the normal range, never overflows
        scale = g / (2.0 * np.sqrt(0.25 * rv + 0.25 * eps))
        batch_norm_apply(xa.reshape(-1), n, c, s, scale, b, state.running_mean,
                         out.reshape(-1), status)
        _raise_status(fname, status, xa, unit="channel")   # scans x first on a bad status
        return out, state

    m = n * s
    if m == 0 or c == 0:
        raise ShapeError(f"{fname}: TRAINING needs at least one value per channel "
                         f"(got x shape {_checks.shape_str(xa.shape)})")
    from .._kernels.norm import LANES, batch_norm_train

    mean = np.zeros(c)
    var = np.zeros(c)
    batch_norm_train(xa.reshape(-1), n, c, s, eps, g, b, LANES, out.reshape(-1), mean, var,
                     status)
    _raise_status(fname, status, xa, unit="channel")
    unbiased = var * (m / (m - 1)) if m > 1 else var
    with np.errstate(over="ignore", invalid="ignore"):
        if momentum == 0.0:  # the batch has no weight (even a non-representable variance)
            new_mean, new_var = state.running_mean, state.running_variance
        else:
            new_mean = (1.0 - momentum) * state.running_mean + momentum * mean
            new_var = (1.0 - momentum) * state.running_variance + momentum * unbiased
    _checks.finish(fname, bool(np.isfinite(new_mean).all() and np.isfinite(new_var).all()),
                   overflow="the updated running statistics are not finite "
                            "(batch variance exceeds the float64 range)")
    return out, BatchNormState(new_mean, new_var, state.batches_seen + 1)


# --------------------------------------------------------------------------- row norms
def _axes(fname, axes, ndim):
    a = _checks.integer(fname, "axes", axes)
    if not 1 <= a <= ndim:
        raise DomainError(f"{fname}: axes must be between 1 and x.ndim = {ndim} (got {a})")
    return a


def _trailing(fname, axes, epsilon, x, center, weight=None, bias=None, keep=False):
    """layer_norm (``center``) / rms_norm over the last ``axes`` axes of ``x``;
    ``keep`` (with a weight or a bias): ``(y, xhat)``, both from one kernel pass, ``xhat``
    bitwise the result without the affine map."""
    eps = _epsilon(fname, epsilon)
    xa = _checks.tensor(fname, "x", x, finite=False)
    k = _axes(fname, axes, xa.ndim)
    tail = xa.shape[xa.ndim - k:]
    n = _prod(tail)
    rows = _prod(xa.shape[:xa.ndim - k])
    if weight is None and bias is None:
        return _rows(fname, xa, rows, n, eps, center)
    what = f"x.shape[-{k}:], the normalised trailing axes of x"
    w = _affine_param(fname, "weight", weight, tail, what)
    b = _affine_param(fname, "bias", bias, tail, what)
    if keep:
        xh = np.empty(xa.shape)
        return _rows_affine(fname, xa, rows, n, eps, center, w, b, True, 1, n, 1, xh), xh
    return _rows_affine(fname, xa, rows, n, eps, center, w, b, True, 1, n, 1)


def layer_norm(axes, epsilon, x, *, weight=None, bias=None):
    """Layer normalisation over the last ``axes`` axes, with an optional affine map.

    ``xhat = (x - mean) / sqrt(var + epsilon)`` where ``mean`` and the population variance
    ``var`` are taken over the last ``axes`` axes, separately for every index of the
    leading axes (evaluated as ``(x - mean) * r``, ``r = 1 / sqrt(var + epsilon)``).

    With ``weight`` and/or ``bias`` the result is ``y = (xhat * weight) + bias`` where
    ``xhat`` is bitwise the result without them: the product is rounded, then the sum is
    rounded (two roundings, never a fused multiply-add); a missing ``weight`` means no
    product, a missing ``bias`` no sum.  So ``y`` equals numpy's ``xhat * weight + bias``
    bit for bit.

    Parameters
    ----------
    axes : int
        ``1 <= axes <= x.ndim`` (DomainError).
    epsilon : float
        Finite, ``> 0`` (DomainError).
    x : array_like
        The leading axes (``x.shape[:-axes]``) are the batch: an empty batch gives an
        empty result.  Empty normalised axes give an empty result too (no statistic is
        computed; the output has no elements).
    weight, bias : array_like, optional, keyword-only
        Exactly of shape ``x.shape[-axes:]`` (no broadcasting; ShapeError otherwise),
        finite (NonFiniteError).  Default None: no affine part (today's numbers).

    Returns
    -------
    ndarray, same shape as ``x``.

    Raises
    ------
    DomainError, ShapeError, NonFiniteError (NaN/inf in ``x``, ``weight`` or ``bias``),
    NumericOverflow (``xhat * weight + bias`` beyond the float64 range), TypeError.
    """
    return _trailing("layer_norm", axes, epsilon, x, True, weight, bias)


def rms_norm(axes, epsilon, x, *, weight=None):
    """RMS normalisation over the last ``axes`` axes, with an optional scale:
    ``y = (x / sqrt(mean(x*x) + epsilon)) * weight``.

    ``mean(x*x)`` is taken over the last ``axes`` axes for every index of the leading
    axes (the normalised value is evaluated as ``x * r``, ``r = 1 / sqrt(mean(x*x) +
    epsilon)``).  Overflow-safe: when ``x*x`` would overflow (``|x| > 1e154``) the row is
    computed with an exact power-of-two rescaling, so the (finite) result is returned.
    With ``weight`` the normalised value (bitwise the result without it) is multiplied by
    ``weight`` with one rounding: ``y`` equals numpy's ``rms_norm(axes, eps, x) * weight``.

    Parameters
    ----------
    axes : int
        ``1 <= axes <= x.ndim`` (DomainError).
    epsilon : float
        Finite, ``> 0`` (DomainError).
    x : array_like
        The leading axes are the batch: an empty batch gives an empty result.
    weight : array_like, optional, keyword-only
        Exactly of shape ``x.shape[-axes:]`` (ShapeError otherwise), finite
        (NonFiniteError).  Default None: no scale.

    Returns
    -------
    ndarray, same shape as ``x``.

    Raises
    ------
    DomainError, ShapeError, NonFiniteError (NaN/inf in ``x`` or ``weight``),
    NumericOverflow, TypeError.
    """
    return _trailing("rms_norm", axes, epsilon, x, False, weight, None)


def instance_norm(epsilon, x, *, weight=None, bias=None):
    """Instance normalisation with an optional per-channel affine map:
    ``xhat = (x - mean) / sqrt(var + epsilon)`` with mean and population variance over the
    spatial axes, separately for every ``(n, c)``; ``y = (xhat * weight[c]) + bias[c]``.

    ``xhat`` is evaluated as ``(x - mean) * r``, ``r = 1 / sqrt(var + epsilon)``.  With
    ``weight`` and/or ``bias``, ``xhat`` is bitwise the result without them; the product
    is rounded, then the sum (two roundings, never a fused multiply-add); a missing
    ``weight`` means no product, a missing ``bias`` no sum.

    Parameters
    ----------
    epsilon : float
        Finite, ``> 0`` (DomainError).
    x : array_like, shape ``[N, C, *spatial]``
        At least one spatial axis (ShapeError otherwise).  ``N == 0`` (or ``C == 0``)
        gives an empty result; empty spatial axes give an empty result too (no statistic
        is computed).
    weight, bias : array_like, optional, keyword-only
        Exactly of shape ``(C,)`` (ShapeError otherwise), finite (NonFiniteError).

    Returns
    -------
    ndarray, same shape as ``x``.

    Raises
    ------
    ShapeError, DomainError, NonFiniteError (NaN/inf in ``x``, ``weight`` or ``bias``),
    NumericOverflow, TypeError.
    """
    fname = "instance_norm"
    eps = _epsilon(fname, epsilon)
    xa = _checks.tensor(fname, "x", x, min_ndim=3, finite=False)
    c = xa.shape[1]
    w = _affine_param(fname, "weight", weight, (c,), "(C,), one per channel of x")
    b = _affine_param(fname, "bias", bias, (c,), "(C,), one per channel of x")
    rows = xa.shape[0] * c
    s = _prod(xa.shape[2:])
    return _rows_affine(fname, xa, rows, s, eps, True, w, b, False, c, 1, s)


def group_norm(groups, epsilon, x, *, weight=None, bias=None):
    """Group normalisation with an optional per-channel affine map: channels are split
    into ``groups`` consecutive groups of ``C / groups``;
    ``xhat = (x - mean) / sqrt(var + epsilon)`` with mean and population variance over a
    group's channels and all spatial positions, separately per ``n``;
    ``y = (xhat * weight[c]) + bias[c]``.

    ``xhat`` is evaluated as ``(x - mean) * r``, ``r = 1 / sqrt(var + epsilon)``.  With
    ``weight`` and/or ``bias``, ``xhat`` is bitwise the result without them; the product
    is rounded, then the sum (two roundings, never a fused multiply-add); a missing
    ``weight`` means no product, a missing ``bias`` no sum.

    Parameters
    ----------
    groups : int
        ``>= 1`` and dividing C (DomainError).
    epsilon : float
        Finite, ``> 0`` (DomainError).
    x : array_like, shape ``[N, C, *spatial]``
        At least 2 axes (``[N, C]`` is allowed: no spatial axis).  ``N == 0`` gives an
        empty result.
    weight, bias : array_like, optional, keyword-only
        Exactly of shape ``(C,)`` (ShapeError otherwise), finite (NonFiniteError); applied
        per channel (not per group).

    Returns
    -------
    ndarray, same shape as ``x``.

    Raises
    ------
    ShapeError, DomainError, NonFiniteError (NaN/inf in ``x``, ``weight`` or ``bias``),
    NumericOverflow, TypeError.
    """
    fname = "group_norm"
    g = _checks.integer(fname, "groups", groups, min=1)
    eps = _epsilon(fname, epsilon)
    xa = _checks.tensor(fname, "x", x, min_ndim=2, finite=False)
    c = xa.shape[1]
    if c % g != 0:
        raise DomainError(f"{fname}: groups must divide the channel count (got groups {g}, "
                          f"C = {c})")
    w = _affine_param(fname, "weight", weight, (c,), "(C,), one per channel of x")
    b = _affine_param(fname, "bias", bias, (c,), "(C,), one per channel of x")
    rows = xa.shape[0] * g
    s = _prod(xa.shape[2:])
    return _rows_affine(fname, xa, rows, (c // g) * s, eps, True, w, b, False, g, c // g, s)


# --------------------------------------------------------------------------- weight norm
def weight_norm(axis, magnitudes, w):
    """Weight normalisation: for every index ``i`` along ``axis``,
    ``y[..., i, ...] = magnitudes[i] * w[..., i, ...] / ||w[..., i, ...]||`` (Euclidean
    norm of the whole slice, all other axes).

    The norm is computed with an exact power-of-two rescaling of the slice, so entries
    like ``1e200`` or ``1e-200`` neither overflow nor underflow in the squares.

    Parameters
    ----------
    axis : int
        In ``[-w.ndim, w.ndim)`` (DomainError).
    magnitudes : array_like, length ``w.shape[axis]`` (ShapeError), finite
    w : array_like, at least 1 axis, finite

    Returns
    -------
    ndarray, same shape as ``w``.

    Raises
    ------
    DomainError
        bad ``axis``; a slice that is all zeros (its direction is undefined).
    ShapeError, NonFiniteError, NumericOverflow, TypeError.
    """
    fname = "weight_norm"
    wa = _checks.tensor(fname, "w", w, min_ndim=1, finite=False)  # the kernel checks
    ax = _checks.axis(fname, "axis", axis, wa.ndim)
    a = wa.shape[ax]
    mags = _checks.vector(fname, "magnitudes", magnitudes, a)
    out = _checks.alloc(fname, wa.shape)
    if out.size == 0:
        return out
    from .._kernels.norm import LANES, weight_norm_kernel

    p = _prod(wa.shape[:ax])
    q = _prod(wa.shape[ax + 1:])
    status = np.zeros(a, dtype=np.int8)
    weight_norm_kernel(wa.reshape(-1), p, a, q, mags, LANES, out.reshape(-1), status)
    _raise_status(fname, status, wa, what="w", unit="slice")
    return out
