"""Argument normalisation and validation shared by every facade.

One rule, one helper, one message format: ``function: what is wrong (got X, expected Y)``.
Every helper takes the public function's name (``fname``) and the argument's name first.
The helpers never copy more than needed: a C-contiguous float64 input is returned as is
(kernels never write to their inputs), anything else is converted into a new array.
"""

from __future__ import annotations

import operator
import weakref
from typing import Iterable, Optional, Sequence, Tuple

import numpy as np

from . import _alloc
from .errors import DomainError, NonFiniteError, NumericOverflow, ShapeError
from ._kernels.status import NO_INDEX, NONFINITE_INPUT, NONFINITE_SOMEWHERE, OK, OVERFLOW, \
    ZERO_SLICE

# Outputs larger than this many bytes are refused before allocation (ShapeError).
from .config import MAX_ALLOC_BYTES  # noqa: E402  (HMATH_DL_MAX_ALLOC_BYTES)


def shape_str(shape) -> str:
    """``(2, 3)`` -> ``'[2, 3]'`` (the way shapes appear in messages)."""
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _type_name(value) -> str:
    return type(value).__name__


# --------------------------------------------------------------------------- scalars
def integer(fname: str, name: str, value, *, min: Optional[int] = None,
            max: Optional[int] = None) -> int:
    """An int (numpy integers accepted; bool and float rejected with TypeError), checked
    against ``min``/``max`` (inclusive) with DomainError."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fname}: {name} must be an int (got bool {value!r})")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{fname}: {name} must be an int (got {_type_name(value)} {value!r})") from None
    if min is not None and v < min:
        raise DomainError(f"{fname}: {name} must be >= {min} (got {v})")
    if max is not None and v > max:
        raise DomainError(f"{fname}: {name} must be <= {max} (got {v})")
    return int(v)


def real(fname: str, name: str, value, *, positive: bool = False, nonnegative: bool = False,
         lo: Optional[float] = None, hi: Optional[float] = None,
         nonfinite_error=DomainError) -> float:
    """A finite Python float.  Non-finite values raise ``nonfinite_error`` (DomainError for
    parameters, NonFiniteError for data such as a loss); range violations DomainError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fname}: {name} must be a real number (got {_type_name(value)} {value!r})")
    v = float(value)
    if not np.isfinite(v):
        raise nonfinite_error(f"{fname}: {name} must be finite (got {v!r})")
    if positive and not v > 0.0:
        raise DomainError(f"{fname}: {name} must be > 0 (got {v!r})")
    if nonnegative and not v >= 0.0:
        raise DomainError(f"{fname}: {name} must be >= 0 (got {v!r})")
    if lo is not None and v < lo:
        raise DomainError(f"{fname}: {name} must be >= {lo!r} (got {v!r})")
    if hi is not None and v > hi:
        raise DomainError(f"{fname}: {name} must be <= {hi!r} (got {v!r})")
    return v


def boolean(fname: str, name: str, value) -> bool:
    """A bool (Python or numpy)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fname}: {name} must be a bool (got {_type_name(value)} {value!r})")
    return bool(value)


def instance(fname: str, name: str, value, types, what: Optional[str] = None):
    """``value`` must be an instance of ``types`` (a class or a tuple of classes); else
    ``TypeError("fname: name must be <what> (got <type> <repr>)")``, ``what`` defaulting to
    ``"a <ClassName>"`` (or "one of A, B, ...")."""
    if not isinstance(value, types):
        if what is None:
            if isinstance(types, tuple):
                what = "one of " + ", ".join(t.__name__ for t in types)
            else:
                what = f"a {types.__name__}"
        raise TypeError(f"{fname}: {name} must be {what} (got {_type_name(value)} {value!r:.80})")
    return value


def member(fname: str, name: str, value, enum_cls):
    """``value`` must be a member of ``enum_cls`` (TypeError otherwise)."""
    if not isinstance(value, enum_cls):
        members = ", ".join(f"{enum_cls.__name__}.{m.name}" for m in enum_cls)
        raise TypeError(f"{fname}: {name} must be one of {members} (got {value!r})")
    return value


def axis(fname: str, name: str, value, ndim: int) -> int:
    """An axis in ``[-ndim, ndim)``, returned non-negative; DomainError otherwise."""
    a = integer(fname, name, value)
    if not -ndim <= a < ndim:
        raise DomainError(f"{fname}: {name} out of range (got {a}, expected -{ndim} <= {name} < {ndim})")
    return a % ndim


def int_tuple(fname: str, name: str, value, length: Optional[int] = None, *,
              min: Optional[int] = None) -> Tuple[int, ...]:
    """A tuple of ints.  A single int is repeated ``length`` times when ``length`` is
    given; a sequence must have exactly ``length`` entries (ShapeError)."""
    if (type(value) is tuple and (length is None or len(value) == length)
            and all(type(v) is int and (min is None or v >= min) for v in value)):
        return value        # already what the checks below would return (the common case)
    if type(value) is int and length is not None and (min is None or value >= min):
        return (value,) * length
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if length is None:
            items = [value]
        else:
            items = [value] * length
    elif isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{fname}: {name} must be an int or a sequence of ints (got {_type_name(value)} {value!r})")
    else:
        items = list(value)
    if length is not None and len(items) != length:
        raise ShapeError(f"{fname}: {name} must have {length} entries, one per spatial axis (got {len(items)}: {tuple(items)!r})")
    out = tuple(integer(fname, f"{name}[{i}]", v, min=min) for i, v in enumerate(items))
    return out


def shape_tuple(fname: str, name: str, value, *, min_len: int = 0, min: int = 0) -> Tuple[int, ...]:
    """A shape: a sequence of ints (or one int) each ``>= min``."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = (value,)
    out = int_tuple(fname, name, value, min=min)
    if len(out) < min_len:
        raise DomainError(f"{fname}: {name} must have at least {min_len} entries (got {out!r})")
    return out


# --------------------------------------------------------------------------- arrays
def _to_array(fname: str, name: str, x, dtype) -> np.ndarray:
    try:
        raw = np.asarray(x)
    except Exception as exc:  # ragged lists etc.
        raise TypeError(f"{fname}: {name} is not an array-like of numbers ({exc})") from None
    if raw.dtype.kind not in "biuf":
        raise TypeError(f"{fname}: {name} must hold real numbers (got dtype {raw.dtype})")
    return raw


def tensor(fname: str, name: str, x, *, ndim: Optional[int] = None,
           min_ndim: Optional[int] = None, max_ndim: Optional[int] = None,
           nonempty: bool = False, finite: bool = True) -> np.ndarray:
    """``x`` as a C-contiguous float64 ndarray (the input itself when it already is one).

    Checks the rank (ShapeError), emptiness (ShapeError) and, unless ``finite=False``,
    finiteness (NonFiniteError).  The result must be treated as read-only.
    """
    raw = _to_array(fname, name, x, np.float64)
    if ndim is not None and raw.ndim != ndim:
        raise ShapeError(f"{fname}: {name} must have {ndim} axes (got shape {shape_str(raw.shape)})")
    if min_ndim is not None and raw.ndim < min_ndim:
        raise ShapeError(f"{fname}: {name} must have at least {min_ndim} axes (got shape {shape_str(raw.shape)})")
    if max_ndim is not None and raw.ndim > max_ndim:
        raise ShapeError(f"{fname}: {name} must have at most {max_ndim} axes (got shape {shape_str(raw.shape)})")
    if nonempty and raw.size == 0:
        raise ShapeError(f"{fname}: {name} must not be empty (got shape {shape_str(raw.shape)})")
    arr = np.asarray(raw, dtype=np.float64, order="C")  # keeps 0-d inputs 0-d
    if finite and not known_finite(arr):
        require_finite(fname, name, arr)
    return arr


_all_finite = None     # the compiled scan (hmath_dl._kernels.checks), imported at first use


def is_finite(arr: np.ndarray) -> bool:
    """True iff every element of the float64 array is finite.

    A compiled scan of the exponent bits at every size: about 0.2 us for a small array
    (numpy's ``isfinite(arr).all()`` takes 1.3 us and allocates a mask; the autodiff's
    argument checks run it dozens of times per training step), and half numpy's time
    for large ones."""
    global _all_finite
    if arr.dtype != np.float64:
        return bool(np.isfinite(arr).all())
    if _all_finite is None:
        from ._kernels.checks import all_finite
        _all_finite = all_finite
    flat = arr.reshape(-1) if arr.flags.c_contiguous else np.ascontiguousarray(arr).reshape(-1)
    return bool(_all_finite(flat))


# Large read-only arrays known to hold only finite values: the autodiff's tape values
# (every one is checked when it is made, and none is writeable).  A layer called on a tape
# value validates it again (``tensor``); a transformer training step scanned 44 such
# values, ~330 us of its ~24 ms (half a megabyte each, often from outside the caches).
# Keyed by ``id``, holding a weak reference: an entry counts only while it refers to that
# very array and the array is still read-only (an owner that makes it writeable again is
# checked again from then on).  Below ``_KNOWN_FROM`` elements a scan costs less than the
# bookkeeping.
_KNOWN_FINITE = {}
_KNOWN_FROM = 4096
_KNOWN_PURGE = [1024]      # purge dead entries when the registry grows past this


def mark_finite(arr: np.ndarray) -> None:
    """Record that the read-only array ``arr`` holds only finite values (the caller
    checked them); :func:`tensor` then skips its scan for this array while it stays
    read-only.  Small or writeable arrays are not recorded."""
    if arr.size < _KNOWN_FROM or arr.flags.writeable:
        return
    _KNOWN_FINITE[id(arr)] = weakref.ref(arr)
    if len(_KNOWN_FINITE) > _KNOWN_PURGE[0]:
        for key, ref in list(_KNOWN_FINITE.items()):
            if ref() is None:
                _KNOWN_FINITE.pop(key, None)
        _KNOWN_PURGE[0] = max(1024, 2 * len(_KNOWN_FINITE))


def known_finite(arr: np.ndarray) -> bool:
    """Whether ``arr`` is a recorded (:func:`mark_finite`) array that is still read-only,
    and so is every array it is a view of (a tape value that is a view of another one,
    e.g. a reshape, is checked again once its base has been made writeable)."""
    ref = _KNOWN_FINITE.get(id(arr))
    if ref is None or ref() is not arr:
        return False
    a = arr
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return True


def require_finite(fname: str, name: str, arr: np.ndarray) -> None:
    """Raise NonFiniteError naming the first NaN/inf element of ``arr``."""
    if is_finite(arr):
        return
    flat = np.flatnonzero(~np.isfinite(arr))[0]
    index = np.unravel_index(flat, arr.shape)
    value = arr.reshape(-1)[flat]
    where = tuple(int(i) for i in index)
    raise NonFiniteError(
        f"{fname}: {name} contains {float(value)!r} at index {where} (expected finite values)")


def int_array(fname: str, name: str, x) -> np.ndarray:
    """``x`` as a C-contiguous int64 array; its elements must be integers (bool and float
    arrays raise TypeError)."""
    raw = _to_array(fname, name, x, np.int64)
    if raw.dtype.kind == "b" or raw.dtype.kind == "f":
        raise TypeError(f"{fname}: {name} must hold integers (got dtype {raw.dtype})")
    if raw.dtype.kind == "u" and raw.dtype.itemsize == 8 and raw.size and raw.max() > np.iinfo(np.int64).max:
        raise DomainError(f"{fname}: {name} holds a value beyond int64 (got {raw.max()})")
    return np.asarray(raw, dtype=np.int64, order="C")


def bool_array(fname: str, name: str, x) -> np.ndarray:
    """``x`` as a C-contiguous bool array.  Integer arrays must hold only 0 and 1."""
    raw = _to_array(fname, name, x, np.bool_)
    if raw.dtype.kind == "f":
        raise TypeError(f"{fname}: {name} must be a boolean mask (got dtype {raw.dtype})")
    if raw.dtype.kind in "iu" and raw.size and ((raw != 0) & (raw != 1)).any():
        raise DomainError(f"{fname}: {name} must hold only True/False (or 1/0) values")
    return np.asarray(raw, dtype=np.bool_, order="C")


def same_shape(fname: str, name_a: str, a: np.ndarray, name_b: str, b: np.ndarray) -> None:
    if a.shape != b.shape:
        raise ShapeError(f"{fname}: {name_a} and {name_b} must have the same shape "
                         f"(got {shape_str(a.shape)} and {shape_str(b.shape)})")


def vector(fname: str, name: str, x, length: int, *, finite: bool = True) -> np.ndarray:
    """A 1-D float64 array of exactly ``length`` entries."""
    v = tensor(fname, name, x, ndim=1, finite=finite)
    if v.shape[0] != length:
        raise ShapeError(f"{fname}: {name} must have length {length} (got {v.shape[0]})")
    return v


# --------------------------------------------------------------------------- outputs
def check_size(fname: str, shape: Iterable[int], dtype=np.float64) -> Tuple[int, ...]:
    """Refuse (ShapeError) an output whose size would exceed ``MAX_ALLOC_BYTES``
    (``HMATH_DL_MAX_ALLOC_BYTES``, default 16 GiB) before anything is allocated."""
    shape = tuple(int(s) for s in shape)
    count = 1
    for s in shape:
        if s < 0:
            raise ShapeError(f"{fname}: output shape {shape_str(shape)} has a negative extent")
        count *= s
    nbytes = count * np.dtype(dtype).itemsize
    if nbytes > MAX_ALLOC_BYTES:
        raise ShapeError(f"{fname}: output of shape {shape_str(shape)} would need {nbytes} bytes "
                         f"(limit {MAX_ALLOC_BYTES}, set HMATH_DL_MAX_ALLOC_BYTES to raise it)")
    return shape


def alloc(fname: str, shape: Iterable[int], dtype=np.float64, *, zero: bool = False) -> np.ndarray:
    """Allocate an output after :func:`check_size`; allocation failures become ShapeError."""
    shape = check_size(fname, shape, dtype)
    try:
        if not zero:
            out = _alloc.lease(shape, dtype)   # large outputs: the pool (hmath_dl._alloc)
            if out is not None:
                return out
        return np.zeros(shape, dtype=dtype) if zero else np.empty(shape, dtype=dtype)
    except (MemoryError, ValueError) as exc:
        raise ShapeError(f"{fname}: cannot allocate an output of shape {shape_str(shape)} ({exc})") from None


def readonly(arr: np.ndarray) -> np.ndarray:
    """Mark ``arr`` read-only and return it (for arrays kept in immutable objects)."""
    arr.setflags(write=False)
    return arr


def owned_readonly(x: np.ndarray) -> np.ndarray:
    """A private read-only copy of ``x`` (so nobody else can write to it)."""
    return readonly(np.array(x, dtype=x.dtype, order="C", copy=True))


# --------------------------------------------------------------------------- kernel verdicts
def located(index) -> Tuple[int, Optional[int]]:
    """``(code, unit)`` of an index-valued kernel report (see :mod:`._kernels.status`):
    ``NO_INDEX`` -> ``(OK, None)``, ``NONFINITE_SOMEWHERE`` -> ``(NONFINITE_INPUT, None)``,
    a flat index ``i >= 0`` -> ``(OVERFLOW, i)``."""
    i = int(index)
    if i == NO_INDEX:
        return OK, None
    if i == NONFINITE_SOMEWHERE:
        return NONFINITE_INPUT, None
    return OVERFLOW, i


def _first_bad(verdict, out):
    """``(code, unit)`` of the first bad unit of a kernel verdict, or None when all is well."""
    if verdict is None:                                  # the kernel did not check: scan
        return None if is_finite(out) else (OVERFLOW, None)
    if isinstance(verdict, (bool, np.bool_)):
        return None if verdict else (OVERFLOW, None)
    if isinstance(verdict, np.ndarray):                  # one Status code per unit
        if not verdict.any():
            return None
        unit = int(np.flatnonzero(verdict)[0])
        return int(verdict.reshape(-1)[unit]), unit
    if isinstance(verdict, tuple):                       # (code, unit)
        code, unit = verdict
        return None if int(code) == OK else (int(code), None if unit is None else int(unit))
    code = int(verdict)                                  # one Status code
    return None if code == OK else (code, None)


def finish(fname: str, verdict, *, overflow=None, inputs=(), out=None, zero_slice=None,
           nonfinite=None):
    """The one finishing step of a facade after a kernel call: returns ``out`` when the
    kernel's ``verdict`` says all is well, else raises the documented error.

    ``verdict`` (the shapes of :mod:`hmath_dl._kernels.status`): ``None`` (the kernel did not
    check: ``out`` is scanned, a NaN/inf in it is an overflow); a bool (True: all finite);
    one ``Status`` code; an int array of codes, one per unit (row, channel, slice), whose
    first non-OK entry is reported; or a ``(code, unit)`` pair (see :func:`located`).

    On failure, every ``(name, array)`` of ``inputs`` is first scanned in order
    (:func:`require_finite`: NonFiniteError naming the argument and the first bad index --
    a NaN/inf input is reported before an overflow); then a ``NONFINITE_INPUT`` unit that a
    kernel located itself raises ``NonFiniteError(f"{fname}: {nonfinite(unit)}")`` when
    ``nonfinite`` is given (e.g. a NaN/inf bit pattern), a ``ZERO_SLICE`` unit
    ``DomainError(f"{fname}: {zero_slice(unit)}")`` when ``zero_slice`` is given, and any
    other verdict ``NumericOverflow(f"{fname}: {text}")``, ``text`` being ``overflow`` or,
    when that is callable, ``overflow(unit, code)`` (``"result is not finite"`` if None).
    """
    bad = _first_bad(verdict, out)
    if bad is None:
        return out
    for name, arr in inputs:
        require_finite(fname, name, arr)
    code, unit = bad
    if code == NONFINITE_INPUT and nonfinite is not None and unit is not None:
        raise NonFiniteError(f"{fname}: {nonfinite(unit)}")
    if code == ZERO_SLICE and zero_slice is not None:
        raise DomainError(f"{fname}: {zero_slice(unit)}")
    if overflow is None:
        overflow = "result is not finite"
    text = overflow(unit, code) if callable(overflow) else overflow
    raise NumericOverflow(f"{fname}: {text}")
