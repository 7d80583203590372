"""Transformer feed-forward block: dense -> activation -> dense."""

from __future__ import annotations

from .. import _checks
from ..activations import Activation, activate
from ..errors import MathError, ShapeError
from .dense import dense

__all__ = ["transformer_feed_forward"]


def transformer_feed_forward(activation, w1, b1, w2, b2, x):
    """Position-wise feed-forward block
    ``dense(activate(activation, dense(x, w1, b1)), w2, b2)``, i.e.

    ::

        h = act(x @ w1.T + b1)
        y = h @ w2.T + b2

    Parameters
    ----------
    activation : Activation
    w1 : array_like, shape ``[hidden, in]``
    b1 : array_like of length ``hidden``, or None
    w2 : array_like, shape ``[out, hidden]``
    b2 : array_like of length ``out``, or None
    x : array_like, shape ``[B, in]`` (leading batch axes ``[..., B, in]`` are accepted,
        as by :func:`~hmath_dl.layers.dense`)

    Returns
    -------
    ndarray, shape ``x.shape[:-1] + (out,)``

    Raises
    ------
    TypeError
        ``activation`` is not an :class:`~hmath_dl.activations.Activation`.
    ShapeError
        ranks or sizes that do not chain (``x`` features vs ``w1``, ``w1`` rows vs ``w2``
        columns, bias lengths).
    NonFiniteError
        NaN/inf in any array argument.
    NumericOverflow
        an intermediate or final result is not finite.
    """
    fname = "transformer_feed_forward"
    act, w1a, b1a, w2a, b2a, xa = _arguments(fname, activation, w1, b1, w2, b2, x)
    try:
        h = dense(xa, w1a, b1a)
        h = activate(act, h)
        return dense(h, w2a, b2a)
    except MathError as exc:  # re-label: messages start with the public function name
        raise type(exc)(f"{fname}: {exc}") from None


def _arguments(fname, activation, w1, b1, w2, b2, x):
    """The validated arguments ``(act, w1, b1, w2, b2, x)`` (arrays; biases may be None)."""
    act = _checks.member(fname, "activation", activation, Activation)
    w1a = _checks.tensor(fname, "w1", w1, ndim=2)
    w2a = _checks.tensor(fname, "w2", w2, ndim=2)
    xa = _checks.tensor(fname, "x", x, min_ndim=2)
    hidden, n_in = w1a.shape
    n_out = w2a.shape[0]
    if xa.shape[-1] != n_in:
        raise ShapeError(f"{fname}: x has {xa.shape[-1]} features, w1 expects {n_in} "
                         f"(got x {_checks.shape_str(xa.shape)}, w1 "
                         f"{_checks.shape_str(w1a.shape)})")
    if w2a.shape[1] != hidden:
        raise ShapeError(f"{fname}: w2 must have {hidden} columns, one per row of w1 "
                         f"(got w1 {_checks.shape_str(w1a.shape)}, w2 "
                         f"{_checks.shape_str(w2a.shape)})")
    b1a = None if b1 is None else _checks.vector(fname, "b1", b1, hidden)
    b2a = None if b2 is None else _checks.vector(fname, "b2", b2, n_out)
    _checks.check_size(fname, xa.shape[:-1] + (max(hidden, n_out),))
    return act, w1a, b1a, w2a, b2a, xa
