"""Threading: which of Numba's threading layers runs the ``prange`` kernels, and what
happens after ``fork()``.  (The span kernels run on the package's own worker pool,
:mod:`hmath_dl._kernels._pool`, unless ``HMATH_DL_POOL=0``; it starts its threads again in
a forked child and follows the serial-after-an-unsafe-fork rule below like every kernel.)

The choice (README, "Reliability notes"):

* **TBB first.** hmath_dl depends on the ``tbb`` wheel where PyPI has one.  Numba's own
  default priority is ``tbb, omp, workqueue``, so with TBB loadable Numba picks it without
  being told.  TBB's worker pool is fork-safe (a forked child can launch parallel kernels),
  thread-safe (several Python threads may launch kernels at once), independent of the
  OpenMP runtime that torch or a BLAS loads (so import order does not matter), and its idle
  workers sleep without any environment setting.  A pip-installed ``libtbb.so.12`` lives in
  ``<prefix>/lib``; Numba 0.68 finds it there (also in a fresh venv, tested), but the
  loader's search path depends on how Python and Numba were built, so
  :func:`preload_tbb` also loads it by its path from the ``tbb`` distribution's file
  list, once, before the first parallel launch: Numba's own ``dlopen`` by soname then
  finds it in any layout.
* **Serial after an unsafe fork.** Whatever layer runs (the user may force one with
  ``NUMBA_THREADING_LAYER``, or TBB may be missing), a child forked from a process whose
  layer is *not* fork-safe -- GNU OpenMP aborts a forked child at its first parallel
  launch ("Terminating: fork() called from a process already using GNU OpenMP") -- runs
  every kernel's serial twin instead.  The twin is the same Python function compiled
  without ``parallel``; every kernel sums in a fixed order inside one ``prange``
  iteration, so its bits are the same.

Nothing here writes ``os.environ`` or Numba's configuration.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["preload_tbb", "serial_only", "threading_layer", "FORK_SAFE_LAYERS"]

#: Numba threading layers whose pools survive ``fork()`` in the parent.
FORK_SAFE_LAYERS = frozenset({"tbb", "workqueue"})

#: True in a child forked from a process whose threading layer is not fork-safe: every
#: kernel then runs its serial twin (see :class:`hmath_dl._kernels._jit.Kernel`).
_SERIAL_ONLY = False

_TBB_SONAME = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib", "win32": "tbb12.dll"}
_tbb_handle = None


def serial_only() -> bool:
    """Whether kernels must run serially in this process (a child of an unsafe fork)."""
    return _SERIAL_ONLY


def _numba_layer_started():
    """Numba's threading layer once its pool has started, else None (private Numba state,
    read defensively: a Numba without it just reports None)."""
    parallel = sys.modules.get("numba.np.ufunc.parallel")  # not imported: not started
    if parallel is None or not getattr(parallel, "_is_initialized", False):
        return None
    try:
        import numba
        return numba.threading_layer()
    except (ValueError, AttributeError):  # pragma: no cover
        return None


def threading_layer() -> str:
    """Numba's threading layer in this process: ``'tbb'``, ``'omp'`` or ``'workqueue'``
    once a parallel kernel has run, else ``'not started'``; ``' (serial after fork)'`` is
    appended in a child that runs serial twins."""
    layer = _numba_layer_started() or "not started"
    return layer + (" (serial after fork)" if _SERIAL_ONLY else "")


def _tbb_library_paths():
    """Candidate paths of the TBB runtime library: the files of the installed ``tbb``
    distribution first, then ``<prefix>/lib`` of this interpreter and its base."""
    soname = _TBB_SONAME.get(sys.platform if sys.platform != "linux2" else "linux")
    if soname is None:
        return []
    found = []
    try:
        from importlib import metadata
        files = metadata.files("tbb") or []
        for f in files:
            if f.name == soname:
                found.append(str(f.locate()))
    except Exception:  # noqa: BLE001 - no tbb distribution, or unreadable metadata
        pass
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        sub = "Library/bin" if sys.platform == "win32" else "lib"
        found.append(os.path.join(prefix, sub, soname))
    return [p for i, p in enumerate(found) if p not in found[:i] and os.path.exists(p)]


def preload_tbb() -> bool:
    """Make Numba's TBB layer loadable: load the ``tbb`` wheel's runtime library by path
    (once) unless Numba's pool has already started.  Returns whether a TBB runtime is
    loaded.  Harmless when there is none: Numba then falls back to its next layer."""
    global _tbb_handle
    if _tbb_handle is not None:
        return True
    if _numba_layer_started() is not None:
        return False
    soname = _TBB_SONAME.get(sys.platform)
    mode = getattr(ctypes, "RTLD_GLOBAL", 0)
    if soname is not None:
        try:  # already on the loader's path (conda, system TBB)?
            _tbb_handle = ctypes.CDLL(soname, mode=mode)
            return True
        except OSError:
            pass
    for path in _tbb_library_paths():
        try:
            _tbb_handle = ctypes.CDLL(path, mode=mode)
            return True
        except OSError:
            continue
    return False


def _after_fork_in_child():
    global _SERIAL_ONLY
    layer = _parent_layer
    if layer is not None and layer not in FORK_SAFE_LAYERS:
        _SERIAL_ONLY = True


_parent_layer = None


def _before_fork():
    # Read in the parent, where Numba's state is consistent; the child only flips a flag.
    global _parent_layer
    _parent_layer = _numba_layer_started()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
