"""The C allocator's policy for the arrays hmath_dl allocates.

A training step allocates and frees the same few array sizes over and over: layer outputs,
gradients and kernel workspaces of 0.1-30 MB.  glibc's ``malloc`` serves a request above its
*mmap threshold* (128 KiB at start, raised adaptively) with a fresh ``mmap`` and returns it to
the kernel on ``free``, and it returns free memory at the top of the heap once that exceeds
its *trim threshold*.  Either way the next step's array of the same size is new memory
again: every one of its pages faults on first touch (zero-filled by the kernel).  Measured on
the 2-layer transformer step of ``asv_bench`` (one thread, 2026-12-02): 45-48 ms with
glibc's defaults, 36-37 ms with the thresholds below; page faults were a fifth of the step.

So at ``import hmath_dl`` (Linux with glibc only) :func:`tune` pins

* ``M_MMAP_THRESHOLD`` at 32 MiB (glibc's own upper bound for its adaptive threshold):
  requests below it come from the heap and are reused after ``free``;
* ``M_TRIM_THRESHOLD`` at 64 MiB: up to that much free memory at the top of the heap is
  kept for the next request instead of being returned at once.

This is process-wide (it is the C library's setting, like a caching allocator's): the
process keeps up to about 64 MiB of freed heap memory.

glibc will not keep larger blocks (it refuses a threshold above 32 MiB): an output of 32
MiB or more is a fresh mapping on every call, and the kernel zero-fills each of its pages
as the kernel first writes it.  For a 16M-element activation (128 MiB) that was ~9 ms of a
~33 ms call on two threads (AVX2).  So the outputs hmath_dl allocates at that size come
from a small pool of its own (:func:`lease`): a freed output's block is kept, up to
:data:`POOL_KEEP` bytes in all, and the next output of exactly that size gets it back
(its pages already in memory).  The array's ``base`` is a :class:`Lease`, which returns
the block when the last array using it goes (views included); such an array does not own
its data (``flags.owndata`` is False), like any view.  ``HMATH_DL_MALLOC=system``
(:mod:`hmath_dl.config`) leaves the C library's settings alone and turns the pool off.
No result depends on either: only where memory comes from.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading

import numpy as np

__all__ = ["tune", "STATE", "lease", "leased_whole", "Lease", "POOL_FROM", "POOL_KEEP"]

_OPT_TRIM = -1             # glibc <malloc.h>: M_TRIM_THRESHOLD
_OPT_MMAP = -3             # M_MMAP_THRESHOLD
#: Requests below this many bytes come from the heap (M_MMAP_THRESHOLD).
HEAP_BELOW = 32 << 20
#: Free memory kept at the top of the heap (M_TRIM_THRESHOLD).
KEEP_FREE = 64 << 20

#: What :func:`tune` did: "tuned", "system" (HMATH_DL_MALLOC=system), "not glibc",
#: "refused" (mallopt returned 0), or "not yet".
STATE = "not yet"


def tune(setting: str) -> str:
    """Apply the allocator policy above unless ``setting`` is ``"system"``; returns (and
    records in :data:`STATE`) what was done.  Idempotent."""
    global STATE
    if setting == "system":
        STATE = "system"
        return STATE
    if not sys.platform.startswith("linux"):
        STATE = "not glibc"
        return STATE
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version          # glibc only (musl has no such thresholds)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        STATE = "not glibc"
        return STATE
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(_OPT_MMAP, HEAP_BELOW) == 1
    ok = mallopt(_OPT_TRIM, KEEP_FREE) == 1 and ok
    STATE = "tuned" if ok else "refused"
    return STATE


# --------------------------------------------------------------------------- the pool
#: Outputs of at least this many bytes come from the pool (glibc maps them afresh).
POOL_FROM = HEAP_BELOW
#: At most this many bytes of freed blocks are kept for reuse.
POOL_KEEP = 256 << 20

_free = {}                      # block size in bytes -> [uint8 blocks], last freed last
_lock = threading.RLock()       # an RLock: a Lease may die (and give back) inside take
_enabled = False


class Lease:
    """The ``base`` of an array whose memory is a pool block: numpy keeps it alive as
    long as the array or any view of it lives; when it goes, the block goes back to the
    pool (or, beyond :data:`POOL_KEEP`, to the C library)."""

    __slots__ = ("block", "ptr", "nbytes", "__array_interface__", "__weakref__")

    def __init__(self, block, shape, dtype):
        self.block = block
        self.ptr = block.ctypes.data
        self.nbytes = block.nbytes
        self.__array_interface__ = {"shape": tuple(shape), "typestr": dtype.str,
                                    "data": (self.ptr, False), "version": 3}

    def __del__(self):
        try:
            _give(self.block)
        except Exception:     # pragma: no cover - interpreter shutdown
            pass


def _kept_bytes():
    """Bytes in the kept blocks (summed afresh: a Lease dying inside :func:`lease`, from
    the garbage collector, must not leave a stale running count)."""
    return sum(b.nbytes for blocks in _free.values() for b in blocks)


def _give(block):
    with _lock:
        if _kept_bytes() + block.nbytes <= POOL_KEEP:
            _free.setdefault(block.nbytes, []).append(block)


def lease(shape, dtype):
    """A new uninitialised C-contiguous array ``shape`` of ``dtype`` from the pool when
    the pool is on and it is at least :data:`POOL_FROM` bytes (a kept block of exactly
    its size if there is one, else a new one), else None (allocate as usual)."""
    if not _enabled:
        return None
    dtype = np.dtype(dtype)
    # math.prod of Python ints: numpy's prod of a tuple costs ~4 us, paid by every output
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < POOL_FROM:
        return None
    block = None
    with _lock:
        blocks = _free.get(nbytes)
        if blocks:
            block = blocks.pop()
    if block is None:
        block = np.empty(nbytes, dtype=np.uint8)
    return np.asarray(Lease(block, shape, dtype))


def leased_whole(arr):
    """Whether ``arr`` is itself an array :func:`lease` returned (a view of it has that
    array, not the :class:`Lease`, as its base): as fresh as an array that owns its
    data."""
    base = arr.base
    return (isinstance(base, Lease) and arr.ctypes.data == base.ptr
            and arr.nbytes == base.nbytes)


def enable_pool(setting: str) -> bool:
    """Turn the pool on unless ``setting`` is ``"system"``; returns whether it is on."""
    global _enabled
    _enabled = setting != "system"
    return _enabled


def _after_fork():
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
