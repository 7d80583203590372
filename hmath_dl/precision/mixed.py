"""Mixed-precision training: dynamic loss scaling.

The loss is multiplied by ``loss_scale`` before back-propagation so that small gradients
survive a 16-bit format; the gradients are divided by it again before the update.  An
overflow (a non-finite gradient) means the whole optimizer step must be skipped and the
scale halved; after ``scale_growth_interval`` consecutive finite steps the scale doubles,
up to :data:`MAX_LOSS_SCALE`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import _checks
from .._gradutils import as_gradient_list, restore_structure
from ..errors import DomainError, NonFiniteError, NumericOverflow

__all__ = ["LossScaler", "MAX_LOSS_SCALE", "initial_loss_scaler", "scale_loss",
           "unscale_gradients", "update_loss_scaler"]

MAX_LOSS_SCALE = 2.0 ** 24
"""The largest loss scale: growth is capped here, and larger scales are rejected."""


def _validated(fname, loss_scale, scale_growth_interval, finite_steps):
    scale = _checks.real(fname, "loss_scale", loss_scale, positive=True)
    if scale > MAX_LOSS_SCALE:
        raise DomainError(f"{fname}: loss_scale must be <= MAX_LOSS_SCALE = 2**24 (got {scale!r})")
    interval = _checks.integer(fname, "scale_growth_interval", scale_growth_interval, min=1)
    steps = _checks.integer(fname, "finite_steps", finite_steps, min=0)
    if steps >= interval:
        raise DomainError(f"{fname}: finite_steps must be < scale_growth_interval "
                          f"(got finite_steps {steps}, scale_growth_interval {interval})")
    return scale, interval, steps


@dataclasses.dataclass(frozen=True)
class LossScaler:
    """Dynamic loss-scale state (immutable; operations return new scalers).

    Attributes
    ----------
    loss_scale : float
        Positive, finite, ``<= MAX_LOSS_SCALE``; the loss is multiplied by it.
    scale_growth_interval : int
        Positive: consecutive finite steps before the scale doubles.
    finite_steps : int
        Consecutive finite steps since the last overflow or growth,
        ``0 <= finite_steps < scale_growth_interval``.

    Direct construction validates the fields like :func:`initial_loss_scaler`
    (TypeError for wrong types, DomainError for values out of range).
    """

    loss_scale: float
    scale_growth_interval: int
    finite_steps: int

    def __post_init__(self):
        scale, interval, steps = _validated("LossScaler", self.loss_scale,
                                            self.scale_growth_interval, self.finite_steps)
        object.__setattr__(self, "loss_scale", scale)
        object.__setattr__(self, "scale_growth_interval", interval)
        object.__setattr__(self, "finite_steps", steps)


def _scaler(fname, scaler) -> LossScaler:
    return _checks.instance(fname, "scaler", scaler, LossScaler)


def initial_loss_scaler(scale, growth_interval) -> LossScaler:
    """A fresh loss scaler: ``LossScaler(scale, growth_interval, 0)``.

    Parameters
    ----------
    scale : float
        Positive, finite, ``<= MAX_LOSS_SCALE`` (``2**24``).
    growth_interval : int
        Positive number of consecutive finite steps before the scale doubles.

    Returns
    -------
    LossScaler
        ``loss_scale = scale``, ``scale_growth_interval = growth_interval``,
        ``finite_steps = 0``.

    Raises
    ------
    DomainError
        ``scale`` not positive/finite/``<= 2**24``, or ``growth_interval < 1``.
    TypeError
        ``scale`` not a real number or ``growth_interval`` not an int.
    """
    fname = "initial_loss_scaler"
    scale = _checks.real(fname, "scale", scale, positive=True)
    if scale > MAX_LOSS_SCALE:
        raise DomainError(f"{fname}: scale must be <= MAX_LOSS_SCALE = 2**24 (got {scale!r})")
    interval = _checks.integer(fname, "growth_interval", growth_interval, min=1)
    return LossScaler(scale, interval, 0)


def scale_loss(scaler, loss) -> float:
    """``loss * scaler.loss_scale``, checked.

    Parameters
    ----------
    scaler : LossScaler
    loss : float, finite

    Returns
    -------
    float

    Raises
    ------
    NonFiniteError
        ``loss`` is NaN or +-inf.
    NumericOverflow
        The product overflows to +-inf.
    TypeError
        Wrong argument types.
    """
    fname = "scale_loss"
    scaler = _scaler(fname, scaler)
    loss = _checks.real(fname, "loss", loss, nonfinite_error=NonFiniteError)
    result = loss * scaler.loss_scale
    return _checks.finish(fname, bool(np.isfinite(result)), out=result, overflow=lambda u, c: (
        f"loss {loss!r} * loss_scale {scaler.loss_scale!r} overflows (expected a finite "
        f"scaled loss)"))


def unscale_gradients(scaler, grads):
    """Divide gradients by the loss scale, reporting overflow instead of raising.

    Parameters
    ----------
    scaler : LossScaler
    grads : array_like or list/tuple of array_like
        The scaled gradients (may hold NaN/inf: that is the overflow signal).

    Returns
    -------
    (bool, grads or None)
        ``(True, g / loss_scale)`` when every entry is finite before and after dividing
        (same structure as ``grads``: one array, or a list of arrays); otherwise
        ``(False, None)``: the caller must skip the whole optimizer step (and call
        ``update_loss_scaler(False, scaler)``).

    Raises
    ------
    TypeError
        ``scaler`` is not a LossScaler or a gradient is not numeric.
    """
    fname = "unscale_gradients"
    scaler = _scaler(fname, scaler)
    arrays, was_single = as_gradient_list(fname, grads, finite=False)
    # loss_scale is positive and finite, so g / loss_scale is non-finite exactly when g is
    # non-finite or the division overflows: one check of the quotient covers both
    out = []
    with np.errstate(over="ignore", invalid="ignore"):
        for a in arrays:
            r = np.divide(a, scaler.loss_scale, out=_checks.alloc(fname, a.shape))
            if not _checks.is_finite(r):
                return False, None
            out.append(r)
    return True, restore_structure(out, was_single)


def update_loss_scaler(finite, scaler) -> LossScaler:
    """The loss scaler after one step.

    Parameters
    ----------
    finite : bool
        Whether the step's gradients were finite (the first result of
        :func:`unscale_gradients`).
    scaler : LossScaler

    Returns
    -------
    LossScaler
        Not finite: ``loss_scale / 2``, ``finite_steps = 0``.  Finite:
        ``finite_steps + 1``; when that reaches ``scale_growth_interval`` the scale becomes
        ``min(2 * loss_scale, MAX_LOSS_SCALE)`` and ``finite_steps`` resets to 0.

    Raises
    ------
    NumericOverflow
        Halving would underflow the scale to 0.
    TypeError
        ``finite`` is not a bool or ``scaler`` is not a LossScaler.
    """
    fname = "update_loss_scaler"
    finite = _checks.boolean(fname, "finite", finite)
    scaler = _scaler(fname, scaler)
    interval = scaler.scale_growth_interval
    if not finite:
        halved = scaler.loss_scale / 2.0
        if halved == 0.0:
            raise NumericOverflow(f"{fname}: halving loss_scale {scaler.loss_scale!r} underflows "
                                  f"to 0 (expected a positive scale)")
        return LossScaler(halved, interval, 0)
    steps = scaler.finite_steps + 1
    if steps >= interval:
        return LossScaler(min(scaler.loss_scale * 2.0, MAX_LOSS_SCALE), interval, 0)
    return LossScaler(scaler.loss_scale, interval, steps)
