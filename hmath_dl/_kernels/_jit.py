"""The one place that decides how kernels are compiled.

Every kernel in ``hmath_dl._kernels`` is decorated with :func:`kernel` (parallel work) or
:func:`helper` (serial code, also used inside ``prange`` bodies).  Nothing is compiled at
import time: there are no eager signatures, so ``import hmath_dl`` stays fast.

* ``cache=True`` unless the environment variable ``HMATH_DL_NO_CACHE`` is set to a
  non-empty value other than ``0``; if no cache location is writable (a read-only install
  and no writable user cache directory), caching is silently skipped.
* ``nogil=True`` so Python threads can call kernels concurrently.
* ``error_model="numpy"``: a division by zero gives inf/NaN (which the kernels report as a
  status) instead of raising inside compiled code.
* never ``fastmath``: it reorders sums and drops NaN checks.

A parallel kernel is a :class:`Kernel`: the ``parallel=True`` compilation plus its serial
twin (the same Python function compiled without ``parallel``, built on first use).  In a
child forked from a process whose threading layer is not fork-safe (see
:mod:`hmath_dl._threads`) every call runs the twin, so forked workers never touch the
parent's thread pool.  Both compilations sum in the same fixed order, so they give the
same bits.
"""

import hashlib
import os
import re
import sys
import threading
import time
import types

from numba import njit

from .. import _threads

__all__ = ["kernel", "helper", "Kernel", "CACHE_ENABLED", "compile_watch"]

from ..config import CACHE_ENABLED  # noqa: E402  (HMATH_DL_NO_CACHE)
from ..config import QUIET  # noqa: E402  (HMATH_DL_QUIET)


# --------------------------------------------------------------------------- cache key
# Numba re-validates a cached kernel against its own source file only.  Our kernels also
# bake in constants and IR emitters from other modules (the tile shapes of _simd.py, the
# machine policy of _cpu.py, helpers of sibling kernel files): an edit there would leave
# stale machine code in the cache (e.g. a tile width that no longer matches the facade's
# buffers).  So a kernel's cache stamp also covers the contents of every module of this
# package that its file imports, transitively (``from .x import``, ``from . import x``),
# and of config.py.  An edit to one kernel file recompiles that file and the files that
# import it, not the whole package.
_PKG = os.path.dirname(os.path.abspath(__file__))
_CONFIG = os.path.join(os.path.dirname(_PKG), "config.py")
_STAMPS = {}
_IMPORT = re.compile(r"^[ \t]*from[ \t]+\.(\w*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)


def _local_imports(path):
    """Sibling modules that the kernel file ``path`` imports."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    names = set()
    for module, imported in _IMPORT.findall(text):
        if module:
            names.add(module)
        else:   # from . import a, b
            names.update(n.split()[0] for n in imported.strip("()").split(",") if n.split())
    return {os.path.join(_PKG, n + ".py") for n in names
            if os.path.exists(os.path.join(_PKG, n + ".py"))}


def _deps_stamp(py_file):
    """Hash of ``py_file``, every sibling module it imports transitively, and config.py."""
    key = os.path.abspath(py_file)
    if key not in _STAMPS:
        seen, todo = set(), [key]
        while todo:
            f = todo.pop()
            if f not in seen:
                seen.add(f)
                todo.extend(_local_imports(f) - seen)
        h = hashlib.sha256()
        for f in sorted(seen) + [_CONFIG]:
            with open(f, "rb") as fh:
                h.update(os.path.basename(f).encode() + b"\0" + fh.read())
        _STAMPS[key] = h.hexdigest()
    return _STAMPS[key]


def _install_cache_locators():
    """Put, in front of numba's cache locators, subclasses of its source-file locators that
    apply to hmath_dl's kernel files only and add :func:`_deps_stamp` to the source stamp.
    Other packages' functions are unaffected (the subclasses decline them)."""
    try:
        from numba.core import caching
        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl   # 0.59: private
        bases = list(impl._locator_classes)
    except (ImportError, AttributeError):  # pragma: no cover - a numba without them
        return
    if getattr(impl, "_hmath_dl_locators", False):
        return
    ours = []
    for base in bases:
        if "IPython" in base.__name__ or "Zip" in base.__name__:
            continue

        def from_function(cls, py_func, py_file, _base=base):
            if not os.path.abspath(py_file).startswith(_PKG + os.sep):
                return None
            return _base.from_function.__func__(cls, py_func, py_file)

        def get_source_stamp(self, _base=base):
            return (_base.get_source_stamp(self), _deps_stamp(self._py_file))

        ours.append(type("HmathDL" + base.__name__.lstrip("_"), (base,), {
            "from_function": classmethod(from_function),
            "get_source_stamp": get_source_stamp}))
    impl._locator_classes = ours + bases
    impl._hmath_dl_locators = True


_install_cache_locators()


# --------------------------------------------------------------------------- first-run notice
# A fresh install (or a fresh cache directory) compiles every kernel on its first call:
# seconds each, a minute or more for a training script, during which nothing is printed.
# Once the kernels of this package have spent NOTICE_AFTER seconds compiling (not loading
# from the on-disk cache) in this process, one line goes to stderr, unless HMATH_DL_QUIET.
# It rides on numba's event API: numba announces "numba:compile" only after a cache load
# failed (Dispatcher.compile: overloads, then the cache, then the event), so cache hits are
# never counted, and nothing is added to the call path of a compiled kernel.
NOTICE_AFTER = 2.0
NOTICE = ("hmath_dl: compiling kernels for this CPU (first use only; cached afterwards; "
          "'python -m hmath_dl.precompile --all' does it ahead of time) ..."
          if CACHE_ENABLED else
          "hmath_dl: compiling kernels for this CPU (HMATH_DL_NO_CACHE is set: not cached) ...")
_PACKAGE = __name__.split(".")[0] + "."


def _ours(event):
    disp = (event.data or {}).get("dispatcher") if isinstance(event.data, dict) else None
    module = getattr(getattr(disp, "py_func", None), "__module__", "") or ""
    return module.startswith(_PACKAGE), disp


class _CompileWatch:
    """Times the compilations of this package's kernels in this process.

    :attr:`total` is the wall time of the outermost compilations (a kernel compiles the
    helpers it calls inside its own compilation), :attr:`seconds` maps each dispatcher's
    ``module.name`` to the time spent compiling it, excluding the helpers it compiled."""

    def __init__(self, quiet):
        self.quiet = quiet
        self.total = 0.0
        self.seconds = {}
        self.notified = False
        self._stack = []
        self._timer = None
        self._lock = threading.Lock()

    def on_start(self, event):
        ours, _ = _ours(event)
        if not ours:
            return
        self._stack.append([time.perf_counter(), 0.0])
        if len(self._stack) == 1 and not (self.quiet or self.notified):
            remaining = NOTICE_AFTER - self.total
            if remaining <= 0.0:
                self.notify()
            else:   # numba holds its compiler lock, not the GIL, while LLVM works
                self._timer = threading.Timer(remaining, self.notify)
                self._timer.daemon = True
                self._timer.start()

    def on_end(self, event):
        ours, disp = _ours(event)
        if not ours or not self._stack:
            return
        start, nested = self._stack.pop()
        took = time.perf_counter() - start
        name = f"{disp.py_func.__module__}.{disp.py_func.__name__}"
        self.seconds[name] = self.seconds.get(name, 0.0) + took - nested
        if self._stack:
            self._stack[-1][1] += took
            return
        self.total += took
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.total > NOTICE_AFTER and not (self.quiet or self.notified):
            self.notify()

    def notify(self):
        """Print :data:`NOTICE` once per process (from numba's thread or a timer's)."""
        with self._lock:
            if self.notified:
                return
            self.notified = True
        tqdm = sys.modules.get("tqdm")
        try:
            if tqdm is not None and hasattr(tqdm, "tqdm"):
                tqdm.tqdm.write(NOTICE, file=sys.stderr)   # keeps open progress bars intact
            else:
                print(NOTICE, file=sys.stderr, flush=True)
        except Exception:   # pragma: no cover - a closed stderr must not break a kernel
            pass

    def _after_fork(self):
        self._stack = []
        self._timer = None
        self._lock = threading.Lock()


def _install_compile_watch():
    watch = _CompileWatch(QUIET)
    try:
        from numba.core import event
        listener = type("HmathDLCompileListener", (event.Listener,), {
            "on_start": lambda self, e: watch.on_start(e),
            "on_end": lambda self, e: watch.on_end(e)})()
        event.register("numba:compile", listener)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - no event API
        pass
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=watch._after_fork)
    return watch


#: The process's compile timer (:class:`_CompileWatch`): ``compile_watch.total`` seconds.
compile_watch = _install_compile_watch()


def _jit(fn, parallel):
    options = dict(parallel=parallel, nogil=True, error_model="numpy")
    if CACHE_ENABLED:
        try:
            return njit(cache=True, **options)(fn)
        except RuntimeError:
            # numba raises RuntimeError("cannot cache function ...: no locator available")
            # when neither the package directory nor the user cache directory is writable.
            pass
    return njit(cache=False, **options)(fn)


class Kernel:
    """A parallel kernel and its serial twin.

    Calling it runs the ``parallel=True`` compilation, except in a child of an unsafe
    fork, where it runs :attr:`serial`.  ``py_func`` is the Python function."""

    __slots__ = ("parallel", "py_func", "_serial", "__name__", "__qualname__",
                 "__wrapped__", "__dict__")

    def __init__(self, fn):
        self.py_func = fn
        self.parallel = _jit(fn, parallel=True)
        self._serial = None
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self.__module__ = fn.__module__
        self.__wrapped__ = fn

    @property
    def serial(self):
        """The serial compilation of the same function, under the name ``<name>_serial``
        (its own on-disk cache entry), built on first use."""
        if self._serial is None:
            f = self.py_func
            name = f.__name__ + "_serial"
            g = types.FunctionType(f.__code__, f.__globals__, name, f.__defaults__,
                                   f.__closure__)
            g.__qualname__ = name
            g.__doc__ = f.__doc__
            g.__module__ = f.__module__
            self._serial = _jit(g, parallel=False)
        return self._serial

    def __call__(self, *args):
        if _threads._SERIAL_ONLY:
            return self.serial(*args)
        return self.parallel(*args)

    def __repr__(self):
        return f"<hmath_dl kernel {self.__module__}.{self.__name__}>"


def kernel(fn):
    """Decorate a parallel kernel (uses ``numba.prange``): returns a :class:`Kernel`."""
    return Kernel(fn)


def helper(fn):
    """Decorate a serial kernel or a helper called from other kernels."""
    return _jit(fn, parallel=False)
