"""numpy ``matmul`` with small products run on one BLAS thread (of the calling thread only).

Why: numpy's OpenBLAS splits even a 0.1 ms product over its worker threads, which then
spin (``sched_yield``) between calls.  Beside Numba's own worker threads, or on a
machine where another process holds a core, the calling thread regularly waits for a
worker that is not scheduled: a 0.2 ms product then takes ~30 ms (measured on a 2-core
VM, Linux 6.18).  The layers' and the tape's products are small, so :func:`matmul` runs
them single-threaded; large products keep every BLAS thread.

Not always the same bits: OpenBLAS 0.3.31 gives other bits for some shapes on 2 threads
than on 1 (e.g. ``[32, 464] @ [464, 144]``), so results through this module depend on
OpenBLAS's thread count (``OPENBLAS_NUM_THREADS``), though not on Numba's.  Removing BLAS
from numeric results altogether is the library's plan (the own fixed-order GEMM);
:func:`one_thread` pins a block of work to one BLAS thread meanwhile (the data-parallel
shards use it so that every Dask worker computes the same bits).

The switch is OpenBLAS's thread-local ``openblas_set_num_threads_local`` (OpenBLAS >=
0.3.27): it changes nothing for other Python threads and is restored after the call.
Where it is unavailable (another BLAS, another platform) :func:`matmul` is plain
``numpy.matmul``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

import numpy as np

__all__ = ["matmul", "one_thread", "SMALL_WORK"]

#: Products with fewer multiply-adds than this (per matrix of a stack) run on one thread
#: (2**25 multiply-adds: ~1 ms single-threaded on the reference VM).  The environment
#: variable ``HMATH_DL_BLAS_SMALL_WORK`` (read at import) overrides it; 0 disables the switch.
from .config import BLAS_SMALL_WORK as SMALL_WORK  # noqa: E402

_state = {"loaded": False, "set_local": None}
_lock = threading.Lock()
# the thread-local switch under its names in OpenBLAS builds (numpy >= 2 wheels ship
# scipy-openblas with a prefixed, 64-bit-integer interface)
_SYMBOLS = ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local64_",
            "scipy_openblas_set_num_threads_local")


def _find_openblas():
    """Path of the OpenBLAS library that numpy itself uses (Linux: /proc/self/maps), or
    None.  Other copies may be loaded too (scipy and scikit-learn wheels bring their own):
    numpy's is the one inside numpy's installation (``numpy.libs`` beside the package for
    a wheel, or the package directory); a single OpenBLAS (conda, a system build) is taken
    as numpy's."""
    try:
        with open("/proc/self/maps") as fh:
            paths = sorted({line.rsplit(None, 1)[-1] for line in fh
                            if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return None
    paths = [p for p in paths if os.path.isabs(p) and os.path.isfile(p)]
    np_dir = os.path.dirname(os.path.abspath(np.__file__))
    roots = (np_dir + os.sep, os.path.join(os.path.dirname(np_dir), "numpy.libs") + os.sep)
    own = [p for p in paths if p.startswith(roots)]
    if len(own) == 1:
        return own[0]
    if not own and len(paths) == 1:
        return paths[0]
    return None


def _set_local():
    """numpy's OpenBLAS ``openblas_set_num_threads_local`` (ctypes), or None."""
    with _lock:
        if not _state["loaded"]:
            _state["loaded"] = True
            path = _find_openblas()
            try:
                lib = ctypes.CDLL(path) if path is not None else None
            except OSError:
                lib = None
            for name in _SYMBOLS if lib is not None else ():
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.restype = ctypes.c_int
                    fn.argtypes = [ctypes.c_int]
                    _state["set_local"] = fn
                    break
    return _state["set_local"]


@contextlib.contextmanager
def one_thread():
    """numpy's OpenBLAS on one thread for the calling thread (nothing elsewhere) within
    the block; a no-op where the switch is unavailable."""
    fn = _set_local()
    if fn is None:
        yield
        return
    prev = fn(1)
    try:
        yield
    finally:
        fn(prev)


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
