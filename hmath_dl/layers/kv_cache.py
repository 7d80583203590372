"""An immutable key/value cache for incremental attention decoding.

Design
------
Every :class:`KVCache` value is immutable: it remembers its own ``length`` and a reference
to the storage arrays that hold its rows.  Versions share storage:

* A storage (``_Store``) owns two growing row buffers (keys, values) and records how many
  rows are *claimed* (written by some version).  Buffers grow geometrically (doubling, at
  least 16 rows, never beyond ``capacity``), so a huge capacity costs nothing up front.
* Appending to the version that ends exactly at the claimed end of its storage (the usual
  decoding step) writes the new rows in place behind it, under the storage's lock, and
  claims them: O(rows appended) work, amortised O(1) per row including growth.
* Appending to any other version (a *branch*: an older version that something else has
  already been appended to) copies that version's rows into a fresh storage first.
* Growth allocates new buffers and copies the claimed rows; versions created before keep
  the old buffers.  Rows that a version can see are therefore never written again, which
  is what makes every version valid and unchanged forever, whatever is appended to it or
  to its branches, from any thread.

:func:`cache_values` returns views of the version's rows that are read-only for good
(their base is a read-only buffer, so ``flags.writeable`` cannot be switched back on).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from .. import _checks
from ..errors import CapacityError, ShapeError

__all__ = ["KVCache", "empty_cache", "append_cache", "cache_values"]

_MIN_ROWS = 16


def _frozen_view(buf: np.ndarray) -> np.ndarray:
    """A view of ``buf`` whose WRITEABLE flag can never be set again."""
    ro = np.frombuffer(memoryview(buf).toreadonly(), dtype=buf.dtype)
    return ro.reshape(buf.shape)


class _Store:
    """Shared, growing storage of a family of cache versions (internal, mutable)."""

    __slots__ = ("lock", "keys", "values", "keys_ro", "values_ro", "claimed")

    def __init__(self, keys: np.ndarray, values: np.ndarray, claimed: int):
        self.lock = threading.Lock()
        self.claimed = claimed
        self._set(keys, values)

    def _set(self, keys: np.ndarray, values: np.ndarray) -> None:
        self.keys = keys
        self.values = values
        self.keys_ro = _frozen_view(keys)
        self.values_ro = _frozen_view(values)


def _rows_for(fname: str, needed: int, current: int, capacity: int) -> int:
    return min(capacity, max(needed, 2 * current, _MIN_ROWS))


def _new_buffers(fname: str, rows: int, kw: int, vw: int):
    return (_checks.alloc(fname, (rows, kw)), _checks.alloc(fname, (rows, vw)))


@dataclass(frozen=True, eq=False, repr=False)
class KVCache:
    """Opaque immutable key/value cache; build with :func:`empty_cache`, extend with
    :func:`append_cache`, read with :func:`cache_values`.

    Properties ``length`` (rows held), ``capacity`` (maximum rows), ``key_width`` and
    ``value_width``.  Two caches are equal (``==``) when they have the same capacity,
    widths and length and hold the same keys and values.
    """

    _capacity: int
    _key_width: int
    _value_width: int
    _length: int
    _store: _Store = field(compare=False)
    _keys_ro: np.ndarray = field(compare=False)    # the read-only buffers this version sees
    _values_ro: np.ndarray = field(compare=False)

    @property
    def length(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def key_width(self) -> int:
        return self._key_width

    @property
    def value_width(self) -> int:
        return self._value_width

    def __repr__(self) -> str:
        return (f"KVCache(length={self._length}, capacity={self._capacity}, "
                f"key_width={self._key_width}, value_width={self._value_width})")

    def __eq__(self, other) -> bool:
        if not isinstance(other, KVCache):
            return NotImplemented
        if (self._capacity, self._key_width, self._value_width, self._length) != (
                other._capacity, other._key_width, other._value_width, other._length):
            return False
        n = self._length
        return bool(np.array_equal(self._keys_ro[:n], other._keys_ro[:n])
                    and np.array_equal(self._values_ro[:n], other._values_ro[:n]))

    def __hash__(self) -> int:
        return hash((self._capacity, self._key_width, self._value_width, self._length))

    # immutable: copies are the value itself; pickling stores the visible rows only
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        n = self._length
        return (_rebuild, (self._capacity, self._key_width, self._value_width,
                           np.array(self._keys_ro[:n]), np.array(self._values_ro[:n])))


def _rebuild(capacity, key_width, value_width, keys, values) -> KVCache:
    cache = empty_cache(capacity, key_width, value_width)
    return append_cache(cache, keys, values) if keys.shape[0] else cache


def empty_cache(capacity, key_width, value_width) -> KVCache:
    """An empty cache that can hold up to ``capacity`` rows of keys ``[key_width]`` and
    values ``[value_width]``.

    Parameters
    ----------
    capacity, key_width, value_width : int, each ``>= 1``

    Returns
    -------
    KVCache
        ``length == 0``.  Nothing is allocated until rows are appended (storage then grows
        geometrically up to ``capacity``).

    Raises
    ------
    DomainError
        an argument ``< 1``.  TypeError: a non-integer argument.
    """
    fname = "empty_cache"
    cap = _checks.integer(fname, "capacity", capacity, min=1)
    kw = _checks.integer(fname, "key_width", key_width, min=1)
    vw = _checks.integer(fname, "value_width", value_width, min=1)
    keys = np.empty((0, kw), dtype=np.float64)
    values = np.empty((0, vw), dtype=np.float64)
    store = _Store(keys, values, 0)
    return KVCache(cap, kw, vw, 0, store, store.keys_ro, store.values_ro)


def append_cache(cache, keys, values) -> KVCache:
    """A new cache holding the rows of ``cache`` followed by ``keys``/``values``.

    ``cache`` itself is unchanged and stays usable (appending to it again creates an
    independent branch).  Appending ``L`` rows costs O(L * width) amortised: decoding one
    token at a time is linear overall.

    Parameters
    ----------
    cache : KVCache
    keys : array_like, shape ``[L, key_width]``
    values : array_like, shape ``[L, value_width]`` (the same ``L``; ``L == 0`` returns
        ``cache`` itself)

    Returns
    -------
    KVCache
        ``length == cache.length + L``.

    Raises
    ------
    TypeError
        ``cache`` is not a KVCache.
    ShapeError
        ``keys``/``values`` not 2-D, different row counts, or wrong widths.
    NonFiniteError
        NaN/inf in ``keys`` or ``values``.
    CapacityError
        ``cache.length + L > cache.capacity`` (the cache never truncates).
    """
    fname = "append_cache"
    if not isinstance(cache, KVCache):
        raise TypeError(f"{fname}: cache must be a KVCache (got {type(cache).__name__})")
    k = _checks.tensor(fname, "keys", keys, ndim=2)
    v = _checks.tensor(fname, "values", values, ndim=2)
    if k.shape[0] != v.shape[0]:
        raise ShapeError(f"{fname}: keys and values must have the same number of rows "
                         f"(got keys {_checks.shape_str(k.shape)}, values "
                         f"{_checks.shape_str(v.shape)})")
    if k.shape[1] != cache.key_width:
        raise ShapeError(f"{fname}: keys must have key_width {cache.key_width} columns "
                         f"(got keys {_checks.shape_str(k.shape)})")
    if v.shape[1] != cache.value_width:
        raise ShapeError(f"{fname}: values must have value_width {cache.value_width} columns "
                         f"(got values {_checks.shape_str(v.shape)})")
    n_new = k.shape[0]
    length = cache.length
    needed = length + n_new
    if needed > cache.capacity:
        raise CapacityError(f"{fname}: appending {n_new} rows to a cache holding {length} "
                            f"would exceed its capacity (got {needed} rows, expected <= "
                            f"{cache.capacity})")
    if n_new == 0:
        return cache
    store = cache._store
    with store.lock:
        at_tip = store.claimed == length and store.keys_ro is cache._keys_ro
        if at_tip:
            if needed > store.keys.shape[0]:
                rows = _rows_for(fname, needed, store.keys.shape[0], cache.capacity)
                nk, nv = _new_buffers(fname, rows, cache.key_width, cache.value_width)
                nk[:length] = store.keys[:length]
                nv[:length] = store.values[:length]
                store._set(nk, nv)
            store.keys[length:needed] = k
            store.values[length:needed] = v
            store.claimed = needed
            return KVCache(cache.capacity, cache.key_width, cache.value_width, needed, store,
                           store.keys_ro, store.values_ro)
    # a branch: copy this version's rows into a fresh storage
    rows = _rows_for(fname, needed, length, cache.capacity)
    nk, nv = _new_buffers(fname, rows, cache.key_width, cache.value_width)
    nk[:length] = cache._keys_ro[:length]
    nv[:length] = cache._values_ro[:length]
    nk[length:needed] = k
    nv[length:needed] = v
    fresh = _Store(nk, nv, needed)
    return KVCache(cache.capacity, cache.key_width, cache.value_width, needed, fresh,
                   fresh.keys_ro, fresh.values_ro)


def cache_values(cache):
    """The keys and values held by ``cache``, in insertion order.

    Parameters
    ----------
    cache : KVCache

    Returns
    -------
    keys : ndarray, shape ``[length, key_width]``
    values : ndarray, shape ``[length, value_width]``
        Read-only views (no copy); they never change, whatever is appended later.

    Raises
    ------
    TypeError
        ``cache`` is not a KVCache.
    """
    fname = "cache_values"
    if not isinstance(cache, KVCache):
        raise TypeError(f"{fname}: cache must be a KVCache (got {type(cache).__name__})")
    n = cache.length
    return cache._keys_ro[:n], cache._values_ro[:n]
