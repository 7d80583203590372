"""Helpers shared by the ``*_ad`` modules of :mod:`hmath_dl.layers` (not public).

:func:`differentiable` declares a differentiable layer: the function below it is the
layer's forward on plain arrays, the decorator does the wiring every layer shares.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

from ..autodiff.core import as_adtensor, make_node
from ..errors import MathError

#: What a forward returns for an unbatched input (see :func:`differentiable`).
UNBATCHED = object()


class _named:
    """``with _named(fname):`` re-raises errors of a plain layer with ``fname`` in front
    of the message (a class: entering and leaving cost ~0.3 us, a generator-based
    context manager ~1.5 us, on every layer call)."""

    __slots__ = ("fname",)

    def __init__(self, fname):
        self.fname = fname

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, MathError):
            raise type(exc)(f"{self.fname}: {exc}") from None
        if isinstance(exc, TypeError):
            raise TypeError(f"{self.fname}: {exc}") from None
        return False


def _ad(fname, name, x):
    return as_adtensor(fname, name, x)


def _opt_ad(fname, name, x):
    return None if x is None else as_adtensor(fname, name, x)


def differentiable(*tensors, optional=()):
    """Declare a differentiable layer (as ``jax.custom_vjp`` / ``torch.autograd.Function``
    do): the function below is its forward on plain arrays; its rule follows it, declared
    with ``@vjp_of(layer)`` (:func:`~hmath_dl.autodiff.core.vjp_of`).

    ``tensors`` name the ADTensor parameters (converted in this order; the node's
    parents), ``optional`` (a name or a tuple) those that may be None, after them.  A call

    1. converts each with ``as_adtensor`` (a non-ADTensor is a constant; errors name the
       layer: ``dense_ad: x must be an ADTensor ...``);
    2. runs the forward with their values (None for an absent one) in their place,
       prefixing its errors with the layer's name (``dense_ad: dense: ...``);
    3. records ``make_node(layer, value, parents, ctx)`` from the forward's ``(value,
       ctx)``.  A forward returning ``(value, ctx, *more)`` (a dropout mask and RNG, a
       batch-norm state) makes the layer return ``(node, *more)``; one returning
       :data:`UNBATCHED` (the plain layer took an input without its batch axis) runs the
       layer again on the first tensor with a leading axis of length 1 and drops it from
       the result (autodiff reshapes, so gradients flow back).

    The layer keeps the forward's name, signature and docstring.
    """
    optional = (optional,) if isinstance(optional, str) else tuple(optional)

    def declare(forward):
        fname = forward.__name__
        sig = inspect.signature(forward)
        params = sig.parameters.values()
        positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        defaults = tuple(p.default for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        required = sum(d is inspect.Parameter.empty for d in defaults)
        keyword = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
        fast = (len(positional) + len(keyword) == len(sig.parameters)
                and all(d is not inspect.Parameter.empty for d in keyword.values()))
        slots = [(name, positional.index(name) if name in positional else None,
                  name in optional) for name in tensors + optional]

        @functools.wraps(forward)
        def layer(*args, **kwargs):
            if (fast and required <= len(args) <= len(positional)
                    and kwargs.keys() <= keyword.keys()):
                args += defaults[len(args):]
            else:
                args, kwargs = _bind(sig, forward, args, kwargs)
            parents = [(_opt_ad if opt else _ad)(
                fname, name, args[pos] if pos is not None else kwargs.get(name, keyword[name]))
                for name, pos, opt in slots]
            vargs, vkwargs = _put(args, kwargs, slots,
                                  [None if t is None else t.value for t in parents])
            with _named(fname):
                out = forward(*vargs, **vkwargs)
                if out is UNBATCHED:
                    from ..autodiff.ops import reshape
                    first = parents[0]
                    targs, tkwargs = _put(args, kwargs, slots,
                                          [reshape(first, (1,) + first.shape)] + parents[1:])
                    out = layer(*targs, **tkwargs)
                    return reshape(out, out.shape[1:])
            node = make_node(layer, out[0], parents, out[1])
            return node if len(out) == 2 else (node,) + tuple(out[2:])

        return layer

    return declare


def _bind(sig, forward, args, kwargs):
    """``(args, kwargs)`` with every parameter present (defaults filled in); a call that
    does not fit the signature raises Python's own TypeError."""
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        forward(*args, **kwargs)   # raises the interpreter's message for this call
        raise
    bound.apply_defaults()
    return bound.args, bound.kwargs


def _put(args, kwargs, slots, items):
    """Copies of ``args`` and ``kwargs`` with ``items`` in the slots of the tensors."""
    args, kwargs = list(args), dict(kwargs)
    for (name, pos, _), item in zip(slots, items):
        if pos is None:
            kwargs[name] = item
        else:
            args[pos] = item
    return args, kwargs


def _c(g):
    return np.ascontiguousarray(g, dtype=np.float64)

