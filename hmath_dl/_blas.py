"""numpy ``matmul`` with small products run on one BLAS thread (of the calling thread only).

Why: numpy's OpenBLAS splits even a 0.1 ms product over its worker threads, which then
spin (``sched_yield``) between calls.  Beside Numba's own worker threads, or on a
machine where another process holds a core, the calling thread regularly waits for a
worker that is not scheduled: a 0.2 ms product then takes ~30 ms (measured on a 2-core
VM, Linux 6.18).  The layers' and the tape's products are small, so :func:`matmul` runs
them single-threaded; large products keep every BLAS thread.

Same bits either way: OpenBLAS divides a GEMM over threads by blocks of the OUTPUT (each
entry is one dot product summed in the same order), never along the inner dimension.

The switch is OpenBLAS's thread-local ``openblas_set_num_threads_local`` (OpenBLAS >=
0.3.27): it changes nothing for other Python threads and is restored after the call.
Where it is unavailable (another BLAS, another platform) :func:`matmul` is plain
``numpy.matmul``.
"""

from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["matmul", "SMALL_WORK"]

#: Products with fewer multiply-adds than this (per matrix of a stack) run on one thread
#: (2**25 multiply-adds: ~1 ms single-threaded on the reference VM).  The environment
#: variable ``HMATH_DL_BLAS_SMALL_WORK`` (read at import) overrides it; 0 disables the switch.
from .config import BLAS_SMALL_WORK as SMALL_WORK  # noqa: E402

_state = {"loaded": False, "set_local": None}


def _find_openblas():
    """Path of the OpenBLAS library numpy has loaded (Linux: /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.rsplit(None, 1)[-1]
                if "openblas" in path.lower() and ".so" in path:
                    return path
    except OSError:
        pass
    return None


def _set_local():
    if not _state["loaded"]:
        _state["loaded"] = True
        try:
            path = _find_openblas()
            if path is not None:
                fn = ctypes.CDLL(path).openblas_set_num_threads_local
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_int]
                _state["set_local"] = fn
        except (OSError, AttributeError):
            _state["set_local"] = None
    return _state["set_local"]


def _work(a, b):
    m = a.shape[-2] if a.ndim >= 2 else 1
    k = a.shape[-1]
    n = b.shape[-1] if b.ndim >= 2 else 1
    return m * n * k


def matmul(a, b, out=None):
    """``numpy.matmul(a, b, out=out)``; single-threaded BLAS when the product is small."""
    fn = _set_local()
    if fn is None or _work(a, b) >= SMALL_WORK:
        return np.matmul(a, b, out=out)
    prev = fn(1)
    try:
        return np.matmul(a, b, out=out)
    finally:
        fn(prev)
