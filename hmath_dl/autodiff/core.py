"""The reverse-mode tape: :class:`ADTensor`, :func:`variable`, :func:`constant`,
:func:`gradients`, the one table of vector-Jacobian rules and :func:`unbroadcast`.

Design (after HIPS/autograd ``core.py`` and micrograd ``engine.py``)
--------------------------------------------------------------------
* Every :class:`ADTensor` holds its ``value`` (a read-only float64 array) and, if some
  variable reaches it, its ``parents`` and a record ``(op, ctx)``.  ``op`` is the
  primitive that made the node (the public function, or the private forward it stands
  for); its rule is declared once, directly after the primitive, with
  ``@vjp_of(primitive)``, and the backward pass looks it up by that object.  ``ctx`` is
  whatever the rule needs from the forward pass.  Nodes that no variable reaches keep no
  parents: they are constants and cost nothing in the backward pass.
* :func:`gradients` sorts the graph topologically with an explicit stack (no recursion,
  so a 10,000-op chain is fine), walks it from the output back to the leaves, keeps the
  pending cotangent of every node in a dict and pops it once the node is processed.
  Cotangents arriving over several paths are added (never in place).
* A rule ``vjp(g, node, needs)`` receives the cotangent ``g`` of ``node`` (an array of
  ``node.shape``), the node, and ``needs``, a tuple of bools telling which parents want a
  gradient; it returns exactly one entry per parent, always: an array of the parent's
  shape, or None.  An optional input that was not given (a bias of None) is a parent
  ``None``: it never needs a gradient and its entry is None, so a primitive's rule
  always returns the same number of entries.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Dict, List, Mapping, Tuple

import numpy as np

from .. import _alloc, _checks
from .._kernels import arith as _arith
from ..errors import DomainError, ShapeError

__all__ = ["ADTensor", "variable", "constant", "gradients", "unbroadcast", "VJP_RULES",
           "vjp_of", "register_vjp", "as_adtensor", "make_node"]

#: The one table of vector-Jacobian rules: primitive -> ``(op name, vjp(g, node, needs))``.
_RULES: Dict[object, Tuple[str, Callable]] = {}
_BY_NAME: Dict[str, Callable] = {}
#: The same rules by op name (a read-only view; declare rules with :func:`vjp_of`).
VJP_RULES: Mapping[str, Callable] = MappingProxyType(_BY_NAME)


def _register(fname: str, primitive, name: str, rule: Callable) -> Callable:
    known = _RULES.get(primitive)
    if (known is not None and known[1] is not rule) or _BY_NAME.get(name, rule) is not rule:
        raise RuntimeError(f"{fname}: rule {name!r} defined twice")
    _RULES[primitive] = (name, rule)
    _BY_NAME[name] = rule
    return rule


def vjp_of(primitive, name=None):
    """Decorator declaring ``rule`` (the function below it) the vjp of ``primitive``.

    ``primitive`` is what the forward passes to :func:`make_node` as its op: the public
    function, or the private forward it stands for.  ``name`` is the op's readable name
    in messages and reprs, by default ``primitive.__name__`` without a leading ``_`` and a
    trailing ``_ad``.  Stack the decorator to give one rule to several primitives.
    """
    name = _default_name(primitive) if name is None else name
    return lambda rule: _register("vjp_of", primitive, name, rule)


def _default_name(primitive) -> str:
    if isinstance(primitive, str):
        return primitive
    name = primitive.__name__.lstrip("_")
    return name[:-3] if name.endswith("_ad") else name


def register_vjp(rules: Dict[object, Callable]) -> None:
    """:func:`vjp_of` for a dict ``primitive -> vjp`` (kept for callers of the old table)."""
    for primitive, fn in rules.items():
        _register("register_vjp", primitive, _default_name(primitive), fn)


def _op_name(node) -> str:
    """The readable name of the primitive that made ``node`` (None for a leaf)."""
    return None if node.op is None else _RULES[node.op][0]


class ADTensor:
    """A node of the reverse-mode tape: a float64 value plus how it was computed.

    Create leaves with :func:`variable` (gradients can be asked for it) or
    :func:`constant`; everything else comes out of the operations of
    :mod:`hmath_dl.autodiff` and :mod:`hmath_dl.layers` (``*_ad``).

    Attributes
    ----------
    value : ndarray
        The forward value, float64, C-contiguous, read-only.
    shape, ndim, size : tuple, int, int
        Those of ``value``.

    Notes
    -----
    Operators ``+ - * / @`` follow numpy broadcasting / matmul rules; the other operand
    may be an ADTensor, a number or an array-like (it becomes a :func:`constant`).
    Unary ``-`` and ``x ** p`` with a real scalar ``p`` are supported.  Every result is
    checked: a non-finite value raises :class:`~hmath_dl.errors.NumericOverflow`.
    ``ADTensor(x)`` is the same as ``constant(x)``.
    """

    __slots__ = ("value", "parents", "op", "ctx", "is_variable", "needs_grad", "__weakref__")
    __array_ufunc__ = None  # make numpy defer to our reflected operators

    def __init__(self, x):
        arr = tensor("constant", "x", x)
        self._setup(_frozen_copy(arr), (), None, None, False, False)

    def _setup(self, value, parents, op, ctx, is_variable, needs_grad):
        # every tape value is checked finite when it is made and is read-only: layers
        # given it need not scan it again (hmath_dl._checks.known_finite)
        _checks.mark_finite(value)
        self.value = value
        self.parents = parents
        self.op = op
        self.ctx = ctx
        self.is_variable = is_variable
        self.needs_grad = needs_grad

    # ----------------------------------------------------------------- properties
    @property
    def shape(self):
        return self.value.shape

    @property
    def ndim(self):
        return self.value.ndim

    @property
    def size(self):
        return self.value.size

    def __repr__(self):
        kind = "variable" if self.is_variable else (_op_name(self) or "constant")
        return f"ADTensor({kind}, shape={self.value.shape})"

    def __len__(self):
        if self.value.ndim == 0:
            raise TypeError("len() of a 0-d ADTensor")
        return self.value.shape[0]

    # ----------------------------------------------------------------- operators
    # (implemented in ops.py; bound there to keep all primitives in one place)


def tensor(fname: str, name: str, x) -> np.ndarray:
    """``_checks.tensor`` (float64, C-contiguous, finite; 0-d inputs stay 0-d)."""
    return _checks.tensor(fname, name, x)


def _frozen_copy(arr: np.ndarray) -> np.ndarray:
    return _checks.owned_readonly(arr)


def _frozen(arr: np.ndarray) -> np.ndarray:
    """``arr`` (a fresh result nobody else holds) as read-only, C-contiguous float64."""
    if arr.dtype != np.float64 or not arr.flags.c_contiguous:
        arr = np.asarray(arr, dtype=np.float64, order="C")
    if arr.flags.writeable:
        if arr.base is not None and not arr.flags.owndata and not _alloc.leased_whole(arr):
            arr = arr.copy()        # (a pool block's array is as fresh as an owned one)
        arr.setflags(write=False)
    return arr


def make_node(op, value: np.ndarray, parents, ctx=None) -> ADTensor:
    """Record one primitive: ``value`` (fresh, owned) computed from ``parents`` by ``op``.

    ``op`` is the primitive whose rule :func:`vjp_of` declared; ``parents`` has one entry
    per input, None for an optional input not given.  If no variable reaches a parent the
    result is a constant and keeps none.  ``value`` must already be checked finite by the
    caller.
    """
    node = ADTensor.__new__(ADTensor)
    needs = any(p is not None and p.needs_grad for p in parents)
    if needs:
        if op not in _RULES:
            raise RuntimeError(f"make_node: no vjp rule for {op!r}")
        node._setup(_frozen(value), tuple(parents), op, ctx, False, True)
    else:
        node._setup(_frozen(value), (), None, None, False, False)
    return node


def _leaf(fname: str, x, is_variable: bool) -> ADTensor:
    if isinstance(x, ADTensor):
        value = x.value  # already private and read-only
    else:
        value = _frozen_copy(tensor(fname, "x", x))
    node = ADTensor.__new__(ADTensor)
    node._setup(value, (), None, None, is_variable, is_variable)
    return node


def variable(x) -> ADTensor:
    """A leaf of the tape that :func:`gradients` can differentiate with respect to.

    Parameters
    ----------
    x : array_like or ADTensor
        Converted to float64 and copied (later changes to ``x`` do not affect the node).
        An ADTensor gives a new, independent leaf holding its value (detach).

    Returns
    -------
    ADTensor
        ``value`` equals ``x``.

    Raises
    ------
    NonFiniteError
        ``x`` holds NaN or ±inf.
    TypeError
        ``x`` is not numeric.
    """
    return _leaf("variable", x, True)


def constant(x) -> ADTensor:
    """A leaf that carries no gradient (``d constant / d anything = 0``).

    Same conversion rules as :func:`variable`; ``constant(adtensor)`` stops the gradient
    flowing through ``adtensor``.

    Parameters
    ----------
    x : array_like or ADTensor
        Converted to float64 and copied (later changes to ``x`` do not affect the node).
        An ADTensor gives a new leaf holding its (read-only) value, cut off from its graph.

    Returns
    -------
    ADTensor
        ``value`` equals ``x``; :func:`gradients` cannot be taken with respect to it.

    Raises
    ------
    NonFiniteError
        ``x`` holds NaN or ±inf.
    TypeError
        ``x`` is not numeric.
    """
    return _leaf("constant", x, False)


def as_adtensor(fname: str, name: str, x) -> ADTensor:
    """``x`` itself if it is an ADTensor, else ``constant(x)`` (errors name ``fname``)."""
    if isinstance(x, ADTensor):
        return x
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{fname}: {name} must be an ADTensor or an array-like of numbers "
                        f"(got {type(x).__name__})")
    value = tensor(fname, name, x)
    node = ADTensor.__new__(ADTensor)
    node._setup(_frozen_copy(value), (), None, None, False, False)
    return node


def unbroadcast(g: np.ndarray, shape) -> np.ndarray:
    """Sum ``g`` (a gradient of a broadcast result) back to an operand of ``shape``.

    Leading axes that broadcasting added, and every axis where the operand had extent 1,
    are summed away in one fixed-order reduction (``hmath_dl._kernels.reduce.sum_to``;
    no numpy reduction, so the same bits on every CPU).
    """
    shape = tuple(shape)
    if g.shape == shape:
        return g
    from .._kernels.reduce import sum_to
    extra = g.ndim - len(shape)
    keep = [False] * extra + [not (s == 1 and g.shape[extra + i] != 1)
                              for i, s in enumerate(shape)]
    return sum_to(g, keep).reshape(shape)


def _topological_order(output: ADTensor) -> List[ADTensor]:
    """Nodes that need a gradient, each after all of its parents (iterative DFS)."""
    order: List[ADTensor] = []
    visited = set()
    stack = [(output, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for p in node.parents:
            if p is not None and p.needs_grad and id(p) not in visited:
                stack.append((p, False))
    return order


def _backward(order, pending, results):
    """Walk ``order`` from the output back; leaves' cotangents go to ``results``."""
    for node in reversed(order):
        g = pending.pop(id(node), None)
        if g is None:
            continue
        if node.is_variable:
            results[id(node)] = g
            continue
        parents = node.parents
        needs = tuple(p is not None and p.needs_grad for p in parents)
        name, rule = _RULES[node.op]
        pgs = rule(g, node, needs)
        if len(pgs) != len(parents):
            raise RuntimeError(f"gradients: the vjp rule of {name!r} returned {len(pgs)} "
                               f"gradients for {len(parents)} parents")
        for p, need, pg in zip(parents, needs, pgs):
            if not need or pg is None:
                continue
            key = id(p)
            prev = pending.get(key)
            pending[key] = pg if prev is None else _arith.add(prev, pg)


def gradients(output, wrt, cotangent=None) -> List[np.ndarray]:
    """Reverse-mode gradients of ``output`` with respect to the variables ``wrt``.

    Computes ``d <cotangent, output> / d w`` for every ``w`` in ``wrt``, i.e. the
    vector-Jacobian product ``J_w(output)^T cotangent``, summed over every path from
    ``w`` to ``output``.

    Parameters
    ----------
    output : ADTensor
        The value to differentiate.  Without a cotangent it must hold exactly one element
        (a 0-d, ``[1]``, ``[1, 1]`` ... tensor); the cotangent is then ``1``.
    wrt : ADTensor or list/tuple of ADTensor
        Leaves created by :func:`variable`.  A variable that ``output`` does not depend on
        gets a zero gradient; a variable listed twice gets its gradient twice.
    cotangent : array_like, optional
        Same shape as ``output`` (finite).

    Returns
    -------
    list of ndarray
        Always a list (also for a single ``wrt``), one new float64 array of each
        variable's shape.

    Raises
    ------
    TypeError
        ``output`` or an entry of ``wrt`` is not an ADTensor.
    DomainError
        An entry of ``wrt`` is not a variable (a constant or an intermediate result).
    ShapeError
        ``output`` has more than one element and no cotangent is given, or the cotangent's
        shape differs from ``output``'s.
    NonFiniteError
        The cotangent holds NaN/inf.
    NumericOverflow
        A gradient entry is not finite (for loss scaling: catch it and treat the step as
        an overflow, see :mod:`hmath_dl.optim`).
    """
    fname = "gradients"
    if not isinstance(output, ADTensor):
        raise TypeError(f"{fname}: output must be an ADTensor (got {type(output).__name__})")
    single = isinstance(wrt, ADTensor)
    if single:
        wrt_list = [wrt]
    elif isinstance(wrt, (list, tuple)):
        wrt_list = list(wrt)
    else:
        raise TypeError(f"{fname}: wrt must be an ADTensor or a list of ADTensors "
                        f"(got {type(wrt).__name__})")
    for i, w in enumerate(wrt_list):
        if not isinstance(w, ADTensor):
            raise TypeError(f"{fname}: wrt[{i}] must be an ADTensor (got {type(w).__name__})")
        if not w.is_variable:
            what = "a constant" if w.op is None else f"an intermediate result ({_op_name(w)})"
            raise DomainError(f"{fname}: wrt[{i}] is {what}, not a variable "
                              f"(create it with autodiff.variable)")
    if cotangent is None:
        if output.size != 1:
            raise ShapeError(f"{fname}: output has shape {_checks.shape_str(output.shape)}; "
                             f"a non-scalar output needs a cotangent of that shape")
        cot = np.ones(output.shape, dtype=np.float64)
    else:
        cot = tensor(fname, "cotangent", cotangent)
        if cot.shape != output.shape:
            raise ShapeError(f"{fname}: cotangent shape {_checks.shape_str(cot.shape)} differs "
                             f"from output shape {_checks.shape_str(output.shape)}")

    results: Dict[int, np.ndarray] = {}
    if output.needs_grad:
        order = _topological_order(output)
        pending: Dict[int, np.ndarray] = {id(output): cot}
        with np.errstate(all="ignore"):  # overflow is reported below, per gradient
            _backward(order, pending, results)

    out = []

    for i, w in enumerate(wrt_list):
        g = results.get(id(w))
        if g is None:
            out.append(np.zeros(w.shape, dtype=np.float64))
            continue
        if g.shape != w.shape:
            g = np.broadcast_to(g, w.shape)
        g = np.array(g, dtype=np.float64, order="C", copy=True)
        out.append(_checks.finish(fname, None, out=g, overflow=lambda u, code: (
            f"the gradient for wrt[{i}] is not finite (a backward product overflowed)")))
    return out
