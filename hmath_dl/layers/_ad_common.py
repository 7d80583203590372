"""Helpers shared by the ``*_ad`` modules of :mod:`hmath_dl.layers` (not public)."""

from __future__ import annotations

import contextlib

import numpy as np

from ..autodiff.core import as_adtensor
from ..errors import MathError


@contextlib.contextmanager
def _named(fname):
    """Re-raise errors of a plain layer with ``fname`` in front of the message."""
    try:
        yield
    except MathError as exc:
        raise type(exc)(f"{fname}: {exc}") from None
    except TypeError as exc:
        raise TypeError(f"{fname}: {exc}") from None


def _ad(fname, name, x):
    return as_adtensor(fname, name, x)


def _opt_ad(fname, name, x):
    return None if x is None else as_adtensor(fname, name, x)


def _c(g):
    return np.ascontiguousarray(g, dtype=np.float64)


def _tuple(value, r):
    if isinstance(value, (int, np.integer)):
        return (int(value),) * r
    t = tuple(int(v) for v in value)
    return t if len(t) == r else (t[0],) * r if len(t) == 1 else t
