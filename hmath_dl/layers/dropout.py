"""Training/inference mode and (spatial) inverted dropout."""

from __future__ import annotations

import enum

import numpy as np

from .. import _checks
from ..rng import RNG

__all__ = ["Mode", "dropout", "spatial_dropout"]


class Mode(enum.Enum):
    """Whether a layer runs in training mode (random masks, batch statistics) or in
    inference mode (deterministic, running statistics, consumes no random numbers)."""

    TRAINING = "training"
    INFERENCE = "inference"


def _rng(fname, rng):
    return _checks.instance(fname, "rng", rng, RNG, "an RNG")


def _common(fname, mode, p, rng, x, min_ndim):
    mode = _checks.member(fname, "mode", mode, Mode)
    p = _checks.real(fname, "p", p, lo=0.0, hi=1.0)
    rng = _rng(fname, rng)
    # TRAINING: a NaN/inf in x always leaves a NaN/inf in x * mask (inf * 0 = NaN), so the
    # kernel's output check finds it; INFERENCE scans x here.
    xa = _checks.tensor(fname, "x", x, min_ndim=min_ndim, finite=mode is Mode.INFERENCE)
    if xa.ndim == 1 and np.ndim(x) == 0:  # _checks.tensor turns a 0-d input into [1]
        xa = xa.reshape(())
    return mode, p, rng, xa


def _scale(p):
    # keep probability 1 - p; p == 1 drops everything (mask all 0, never 1/0)
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)


def _overflowed(p):
    return f"x * mask is not finite (x / (1 - p) overflowed, p = {p!r})"


def dropout(mode, p, rng, x):
    """Inverted dropout.

    Parameters
    ----------
    mode : Mode
    p : float
        Drop probability, ``0 <= p <= 1``.
    rng : RNG
    x : array_like
        Any shape, finite.

    Returns
    -------
    (y, mask, rng)
        TRAINING: ``u = rng.generator().random(x.shape)`` (float64 uniforms in ``[0, 1)``,
        row-major); element kept iff ``u >= p``; ``mask = 1/(1-p)`` where kept, else ``0``
        (all ``0`` when ``p == 1``); ``y = x * mask``; the advanced RNG is returned (one
        uniform is drawn per element, also when ``p == 0``).
        INFERENCE: ``y`` a copy of ``x``, ``mask`` all ones, ``rng`` returned unchanged.

    Raises
    ------
    DomainError
        ``p`` outside ``[0, 1]`` or not finite.
    TypeError
        ``mode`` not a Mode, ``rng`` not an RNG, ``p`` not a real number.
    NonFiniteError
        NaN/inf in ``x``.
    NumericOverflow
        ``x / (1 - p)`` overflows.
    """
    fname = "dropout"
    mode, p, rng, xa = _common(fname, mode, p, rng, x, None)
    if mode is Mode.INFERENCE:
        y = _checks.alloc(fname, xa.shape)
        y[...] = xa
        mask = _checks.alloc(fname, xa.shape)
        mask.fill(1.0)
        return y, mask, rng
    _checks.check_size(fname, xa.shape)
    gen = rng.generator()
    u = np.asarray(gen.random(xa.shape), dtype=np.float64)  # 0-d: numpy returns a float
    y = _checks.alloc(fname, xa.shape)
    if xa.size:
        from .._kernels.elementwise import dropout_train

        ok = dropout_train(xa.reshape(-1), u.reshape(-1), p, _scale(p), y.reshape(-1))
        _checks.finish(fname, ok, inputs=(("x", xa),), overflow=lambda i, code: _overflowed(p))
    return y, u, rng.advanced(gen)


def spatial_dropout(mode, p, rng, x):
    """Spatial (channel-wise) inverted dropout.

    Parameters
    ----------
    mode : Mode
    p : float
        Drop probability, ``0 <= p <= 1``.
    rng : RNG
    x : array_like, shape ``[N, C, *spatial]``
        At least 2 axes (with no spatial axis it drops single elements per ``(n, c)``),
        finite.

    Returns
    -------
    (y, mask, rng)
        TRAINING: ``u = rng.generator().random((N, C))``; channel ``(n, c)`` kept iff
        ``u[n, c] >= p``; ``mask[n, c, ...] = 1/(1-p)`` where kept, else ``0`` (all ``0``
        when ``p == 1``), shared over all spatial positions (``mask`` has ``x``'s shape);
        ``y = x * mask``; the advanced RNG is returned (``N*C`` uniforms drawn, also when
        ``p == 0``).  INFERENCE: ``y`` a copy of ``x``, ``mask`` all ones, ``rng`` unchanged.

    Raises
    ------
    ShapeError
        ``x`` has fewer than 2 axes.
    DomainError, TypeError, NonFiniteError, NumericOverflow
        as for :func:`dropout`.
    """
    fname = "spatial_dropout"
    mode, p, rng, xa = _common(fname, mode, p, rng, x, 2)
    if mode is Mode.INFERENCE:
        y = _checks.alloc(fname, xa.shape)
        y[...] = xa
        mask = _checks.alloc(fname, xa.shape)
        mask.fill(1.0)
        return y, mask, rng
    _checks.check_size(fname, xa.shape)
    n, c = xa.shape[0], xa.shape[1]
    gen = rng.generator()
    u = gen.random((n, c))
    keep = np.where(u >= p, _scale(p), 0.0).reshape(-1)
    y = _checks.alloc(fname, xa.shape)
    mask = _checks.alloc(fname, xa.shape)
    if xa.size:
        from .._kernels.elementwise import apply_channel_mask

        inner = xa.size // (n * c)
        ok = apply_channel_mask(xa.reshape(-1), keep, inner, y.reshape(-1), mask.reshape(-1))
        _checks.finish(fname, ok, inputs=(("x", xa),), overflow=lambda i, code: _overflowed(p))
    return y, mask, rng.advanced(gen)
