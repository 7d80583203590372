"""numpy's own OpenBLAS, found and pinned to one thread for a block of work.

The library's numeric results no longer pass through BLAS (matrix products use
``hmath_dl._kernels.gemm_f64``).  What remains is :func:`one_thread`: user code inside
``hmath_dl.distributed``'s ``loss_fn`` may call numpy's ``@``, and OpenBLAS 0.3.31 gives
other bits for some shapes on 2 threads than on 1 (e.g. ``[32, 464] @ [464, 144]``), while
Dask starts its workers with ``OPENBLAS_NUM_THREADS=1``; every shard therefore runs with
numpy's OpenBLAS on one thread.  The switch is OpenBLAS's thread-local
``openblas_set_num_threads_local`` (OpenBLAS >= 0.3.27): it changes nothing for other
Python threads and is restored afterwards; where it is unavailable it is a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

import numpy as np

__all__ = ["one_thread"]

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
