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
process keeps up to about 64 MiB of freed heap memory, and arrays of 32 MiB and more are
still mapped and unmapped.  ``HMATH_DL_MALLOC=system`` (:mod:`hmath_dl.config`) leaves
the C library's settings alone.  No result depends on it: only where memory comes from.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["tune", "STATE"]

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
