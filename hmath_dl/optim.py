"""Functional optimizers with immutable state: SGD with momentum and AdamW.

Parameters (float64 master weights) and gradients are lists of arrays; a step returns
NEW parameter arrays and a NEW state, and never changes its inputs::

    state = adamw_init(params)
    for batch in data:
        grads = autodiff.gradients(loss(params, batch), variables)
        params, state = adamw_step(state, params, grads, lr=1e-3)

Loss scaling (mixed precision): an overflowing step is skipped AS A WHOLE -- no
parameter and no optimizer moment changes -- and only the scaler moves::

    from hmath_dl.precision import scale_loss, unscale_gradients, update_loss_scaler
    try:
        grads = autodiff.gradients(loss * scaler.loss_scale, variables)
        finite, grads = unscale_gradients(scaler, grads)
    except NumericOverflow:            # the float64 tape itself overflowed
        finite, grads = False, None
    if finite:
        params, state = adamw_step(state, params, grads, lr)
    scaler = update_loss_scaler(finite, scaler)

Every step is elementwise in a Numba kernel (thread-count independent); a non-finite
updated value raises NumericOverflow, non-finite parameters or gradients NonFiniteError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from . import _checks
from .autodiff.core import tensor as _tensor
from .errors import DomainError, NumericOverflow, ShapeError

__all__ = ["SGDState", "sgd_init", "sgd_step", "AdamWState", "adamw_init", "adamw_step"]


def _freeze_fields(obj, cls_name, fields):
    """Store every array field as a tuple of read-only float64 arrays (private copies
    unless already read-only) and check ``steps``."""
    for f in fields:
        arrays = getattr(obj, f)
        if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)):
            raise TypeError(f"{cls_name}: {f} must be a tuple of arrays (got {type(arrays).__name__})")
        out = []
        for i, a in enumerate(arrays):
            arr = _tensor(cls_name, f"{f}[{i}]", a)
            if arr.flags.writeable:
                arr = _checks.owned_readonly(arr)
            out.append(arr)
        object.__setattr__(obj, f, tuple(out))
    object.__setattr__(obj, "steps", _checks.integer(cls_name, "steps", obj.steps, min=0))


@dataclass(frozen=True)
class SGDState:
    """State of :func:`sgd_step`: one momentum buffer per parameter (read-only arrays)
    and the number of steps taken."""

    momentum_buffers: Tuple[np.ndarray, ...]
    steps: int

    def __post_init__(self):
        _freeze_fields(self, "SGDState", ("momentum_buffers",))


@dataclass(frozen=True)
class AdamWState:
    """State of :func:`adamw_step`: first and second moment estimates per parameter
    (read-only arrays) and the number of steps taken (``t`` of the bias corrections)."""

    first_moments: Tuple[np.ndarray, ...]
    second_moments: Tuple[np.ndarray, ...]
    steps: int

    def __post_init__(self):
        _freeze_fields(self, "AdamWState", ("first_moments", "second_moments"))


def _array_list(fname, name, arrays) -> List[np.ndarray]:
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{fname}: {name} must be a list or tuple of arrays "
                        f"(got {type(arrays).__name__})")
    return [_tensor(fname, f"{name}[{i}]", a) for i, a in enumerate(arrays)]


def _matching(fname, params, name, arrays):
    if len(arrays) != len(params):
        raise ShapeError(f"{fname}: {name} has {len(arrays)} entries, params has {len(params)}")
    for i, (p, a) in enumerate(zip(params, arrays)):
        if p.shape != a.shape:
            raise ShapeError(f"{fname}: {name}[{i}] has shape {_checks.shape_str(a.shape)}, "
                             f"params[{i}] has {_checks.shape_str(p.shape)}")


def _state_arrays(fname, state, cls, fields):
    if not isinstance(state, cls):
        raise TypeError(f"{fname}: state must be a {cls.__name__} (got {type(state).__name__})")
    return [list(getattr(state, f)) for f in fields]


def _zeros_like(fname, params):
    return tuple(_checks.readonly(_checks.alloc(fname, p.shape, zero=True)) for p in params)


# --------------------------------------------------------------------------- SGD
def sgd_init(params) -> SGDState:
    """Initial SGD state: momentum buffers ``b = 0`` shaped like ``params``, ``steps = 0``.

    Parameters
    ----------
    params : list or tuple of array_like
        The (float64 master) parameters; each entry is converted to float64.  A bare
        ndarray is not accepted (wrap it in a list).

    Returns
    -------
    SGDState
        One zero, read-only float64 buffer per parameter (same shapes), ``steps = 0``.

    Raises
    ------
    TypeError
        ``params`` is not a list or tuple, or an entry is not numeric.
    NonFiniteError
        An entry holds NaN or ±inf.
    ShapeError
        A buffer is too large to allocate.
    """
    fname = "sgd_init"
    ps = _array_list(fname, "params", params)
    return SGDState(_zeros_like(fname, ps), 0)


def sgd_step(state, params, grads, lr, momentum=0.9, weight_decay=0.0):
    """One step of SGD with momentum (PyTorch's formulation, dampening 0, no Nesterov).

    For every parameter ``p`` with gradient ``g`` and buffer ``b``::

        d  = g + weight_decay * p
        b' = momentum * b + d
        p' = p - lr * b'

    (``momentum = 0`` is plain SGD.)

    Parameters
    ----------
    state : SGDState
    params, grads : list of array_like
        Same length and shapes (also as ``state``'s buffers).
    lr : float, ``>= 0``
    momentum : float in ``[0, 1]``
    weight_decay : float, ``>= 0`` (L2 added to the gradient)

    Returns
    -------
    (list of ndarray, SGDState)
        New parameters and the new state (``steps + 1``).

    Raises
    ------
    TypeError, ShapeError, DomainError, NonFiniteError
        Bad arguments (NaN/inf in params or grads is NonFiniteError).
    NumericOverflow
        An updated value is not finite.
    """
    fname = "sgd_step"
    (bufs,) = _state_arrays(fname, state, SGDState, ("momentum_buffers",))
    ps = _array_list(fname, "params", params)
    gs = _array_list(fname, "grads", grads)
    _matching(fname, ps, "grads", gs)
    _matching(fname, ps, "state.momentum_buffers", bufs)
    lr = _checks.real(fname, "lr", lr, nonnegative=True)
    momentum = _checks.real(fname, "momentum", momentum, lo=0.0, hi=1.0)
    weight_decay = _checks.real(fname, "weight_decay", weight_decay, nonnegative=True)
    from ._kernels.optim import sgd_update

    new_p, new_b = [], []
    for i, (p, g, b) in enumerate(zip(ps, gs, bufs)):
        po = _checks.alloc(fname, p.shape)
        bo = _checks.alloc(fname, p.shape)
        if p.size:
            ok = sgd_update(p.reshape(-1), g.reshape(-1), b.reshape(-1), lr, momentum,
                            weight_decay, po.reshape(-1), bo.reshape(-1))
            _checks.finish(fname, ok, overflow=lambda u, code: (
                f"the update of params[{i}] is not finite"))
        new_p.append(po)
        new_b.append(_checks.readonly(bo))
    return new_p, SGDState(tuple(new_b), state.steps + 1)


# --------------------------------------------------------------------------- AdamW
def adamw_init(params) -> AdamWState:
    """Initial AdamW state: moments ``m = v = 0`` shaped like ``params``, ``steps = 0``.

    Parameters
    ----------
    params : list or tuple of array_like
        The (float64 master) parameters; each entry is converted to float64.  A bare
        ndarray is not accepted (wrap it in a list).

    Returns
    -------
    AdamWState
        Zero, read-only float64 first and second moments per parameter (same shapes),
        ``steps = 0``.

    Raises
    ------
    TypeError
        ``params`` is not a list or tuple, or an entry is not numeric.
    NonFiniteError
        An entry holds NaN or ±inf.
    ShapeError
        A moment array is too large to allocate.
    """
    fname = "adamw_init"
    ps = _array_list(fname, "params", params)
    return AdamWState(_zeros_like(fname, ps), _zeros_like(fname, ps), 0)


def _split(a):
    """Dekker's split of the float ``a`` into ``hi + lo`` with 26-bit halves (exact)."""
    c = 134217729.0 * a              # 2**27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _two_product(a, b):
    """``(p, e)`` with ``p = fl(a * b)`` and ``a * b = p + e`` exactly (Dekker; no fma)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _dd_mul(xh, xl, yh, yl):
    """Double-double product ``(xh + xl) * (yh + yl)``, renormalised."""
    p, e = _two_product(xh, yh)
    e += xh * yl + xl * yh
    hi = p + e
    return hi, e - (hi - p)


def _power(b, t):
    """``b ** t`` for a float ``b`` in ``[0, 1)`` and an int ``t >= 1``, rounded once to
    the nearest float64 (up to cases within about ``t * 2**-100`` of a rounding midpoint):
    square-and-multiply over the bits of ``t`` in double-double arithmetic (error-free
    products by Dekker's algorithm, plain IEEE operations in a fixed order), then one
    rounding.  No libm ``pow``, so the same bits on every CPU; and as accurate as a
    correctly rounded ``pow``, which ``1 - b**t`` needs: for ``beta2 = 0.9999`` at step 3
    that difference cancels 12 bits, so a plain square-and-multiply's few ulps of error
    in ``b**t`` became a relative error of ~1e-13 in the bias correction."""
    rh, rl = 1.0, 0.0
    sh, sl = b, 0.0
    while True:
        if t & 1:
            rh, rl = _dd_mul(rh, rl, sh, sl)
        t >>= 1
        if not t:
            return rh + rl
        sh, sl = _dd_mul(sh, sl, sh, sl)


def adamw_step(state, params, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    """One AdamW step (Loshchilov & Hutter, decoupled weight decay; PyTorch's order).

    With ``t = state.steps + 1``, ``bc1 = 1 - beta1**t``, ``bc2 = 1 - beta2**t``, for every
    parameter ``p``, gradient ``g`` and moments ``m``, ``v``::

        m' = beta1 * m + (1 - beta1) * g
        v' = beta2 * v + (1 - beta2) * g * g
        p' = p * (1 - lr * weight_decay) - (lr / bc1) * m' / (sqrt(v') / sqrt(bc2) + eps)

    Parameters
    ----------
    state : AdamWState
    params, grads : list of array_like (same length and shapes)
    lr : float, ``>= 0``
    beta1, beta2 : float in ``[0, 1)``
    eps : float, ``> 0``
    weight_decay : float, ``>= 0``

    Returns
    -------
    (list of ndarray, AdamWState)

    Raises
    ------
    TypeError, ShapeError, DomainError, NonFiniteError
        Bad arguments.
    NumericOverflow
        An updated value is not finite.
    """
    fname = "adamw_step"
    ms, vs = _state_arrays(fname, state, AdamWState, ("first_moments", "second_moments"))
    ps = _array_list(fname, "params", params)
    gs = _array_list(fname, "grads", grads)
    _matching(fname, ps, "grads", gs)
    _matching(fname, ps, "state.first_moments", ms)
    _matching(fname, ps, "state.second_moments", vs)
    lr = _checks.real(fname, "lr", lr, nonnegative=True)
    beta1 = _checks.real(fname, "beta1", beta1, lo=0.0)
    beta2 = _checks.real(fname, "beta2", beta2, lo=0.0)
    for name, b in (("beta1", beta1), ("beta2", beta2)):
        if not b < 1.0:
            raise DomainError(f"{fname}: {name} must be < 1 (got {b!r})")
    eps = _checks.real(fname, "eps", eps, positive=True)
    weight_decay = _checks.real(fname, "weight_decay", weight_decay, nonnegative=True)
    t = state.steps + 1
    bc1 = 1.0 - _power(beta1, t)
    bc2 = 1.0 - _power(beta2, t)
    if not (bc1 > 0.0 and bc2 > 0.0):
        raise NumericOverflow(f"{fname}: bias correction underflowed to 0 "
                              f"(beta1 {beta1!r}, beta2 {beta2!r}, step {t})")
    sqrt_bc2 = math.sqrt(bc2)
    from ._kernels.optim import adamw_update

    new_p, new_m, new_v = [], [], []
    for i, (p, g, m, v) in enumerate(zip(ps, gs, ms, vs)):
        po = _checks.alloc(fname, p.shape)
        mo = _checks.alloc(fname, p.shape)
        vo = _checks.alloc(fname, p.shape)
        if p.size:
            ok = adamw_update(p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1),
                              lr, beta1, beta2, eps, weight_decay, bc1, sqrt_bc2,
                              po.reshape(-1), mo.reshape(-1), vo.reshape(-1))
            _checks.finish(fname, ok, overflow=lambda u, code: (
                f"the update of params[{i}] is not finite"))
        new_p.append(po)
        new_m.append(_checks.readonly(mo))
        new_v.append(_checks.readonly(vo))
    return new_p, AdamWState(tuple(new_m), tuple(new_v), t)
