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

A parallel kernel is a :class:`Kernel` (the ``parallel=True`` compilation plus its serial
twin: the same Python function compiled without ``parallel``, built on first use) or a
:class:`SpanKernel` (one serial helper run over all iterations, or under the generic
``prange`` driver: see "Less to compile").  In a child forked from a process whose
threading layer is not fork-safe (see :mod:`hmath_dl._threads`) every call runs the
serial path, so forked workers never touch the parent's thread pool.  Both paths sum in
the same fixed order, so they give the same bits.

Serial or parallel: the one policy
----------------------------------
A parallel region splits its ``prange`` statically over the worker threads and waits for
the slowest; on a shared machine that wait is a scheduler time slice (milliseconds) for
a call that needs microseconds.  So calls with little work run the serial path:
:meth:`Kernel.sized` ``(work)`` is the one place that chooses, with the threshold
``SERIAL_WORK * scale`` work units (``HMATH_DL_SERIAL_WORK``, :mod:`hmath_dl.config`;
``0`` makes every call parallel; :meth:`SpanKernel.run` applies the same rule).  A kernel
declared with ``work=f`` chooses by itself on every call (``f(*args)`` its work); the
others are parallel when called directly, and callers with their own work measure use
``k.sized(work)(*args)``.  Launchers that compare their own size threshold ask
:func:`runs_serial` ``(small)``.

:func:`forced_schedule` ``("serial" | "parallel")`` overrides the work-size choice within a
block (every :class:`Kernel` and :class:`SpanKernel` launch, and :func:`runs_serial`), for
the tests that hold both paths to the same bits and for A/B benchmarks; a child of an
unsafe fork stays serial.

Less to compile
---------------
Numba finalises every compiled function with the LLVM IR of everything it calls linked
in, re-optimised and compiled to machine code again, and a ``parallel=True`` function is
several such libraries (the ``prange`` body, two gufunc wrappers, the function): a large
kernel body was compiled three to four times for its parallel compilation and once more
for its twin.  A :class:`SpanKernel` is written as a serial helper over a span of
iterations; its parallel path is the one generic driver :func:`_drive` (compiled once for
the whole package: its arguments are three integers) -- or, by default, the package's
worker pool (:mod:`._pool`) -- which calls the helper through its address, so the helper
is compiled once for both paths, and a call with little work compiles nothing else.  Per
argument-tuple type only :func:`_launch` (:func:`_launch_pool`) is compiled, a serial
function of a few dozen instructions.

Numba's ``parallel`` option is restricted to explicit ``prange`` loops
(:func:`_parallel_option`): its automatic conversions (array expressions, ``np.zeros`` and
friends, comprehensions) would each add a parallel region, i.e. one more gufunc to compile,
for what are small allocations of per-task flags.
"""

import contextlib
import hashlib
import os
import re
import sys
import threading
import time
import types

import numpy as np
from numba import njit, prange
from numba import typeof as nbtypeof
from numba.core import types as nbtypes
from numba.extending import intrinsic

from .. import _threads
from ._plan import forcing

__all__ = ["kernel", "helper", "Kernel", "span_kernel", "SpanKernel", "CACHE_ENABLED",
           "compile_watch", "SCHEDULES", "forced_schedule", "runs_serial"]

from ..config import CACHE_ENABLED  # noqa: E402  (HMATH_DL_NO_CACHE)
from ..config import QUIET  # noqa: E402  (HMATH_DL_QUIET)
from ..config import SERIAL_WORK  # noqa: E402  (HMATH_DL_SERIAL_WORK)


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


# --------------------------------------------------------------------------- schedule
#: The schedules :func:`forced_schedule` accepts (speed only: both give the same bits).
SCHEDULES = ("serial", "parallel")
_forced = {"schedule": None}


@contextlib.contextmanager
def forced_schedule(name):
    """Within the block every kernel launch takes the schedule ``name``: ``"serial"`` (the
    serial path whatever the work) or ``"parallel"`` (the parallel compilation whatever the
    work; a span kernel of one iteration still runs it directly); ``None`` restores the
    work-size policy.  Process-wide (not per thread), like the ``forced_*_path`` context
    managers.  A child of an unsafe fork runs serially regardless.  Explicit ``k.serial``
    calls are not affected.  Any other name raises ``ValueError``."""
    if name is not None and name not in SCHEDULES:
        raise ValueError(f"schedule {name!r} is not one of {SCHEDULES}")
    with forcing(_forced, "schedule", name):
        yield


def runs_serial(small):
    """Whether a launch runs serially, ``small`` being the launcher's own size test: the
    forced schedule (:func:`forced_schedule`) if any, else ``small``."""
    forced = _forced["schedule"]
    return small if forced is None else forced == "serial"


def _parallel_option(parallel):
    """Numba's ``parallel`` option: only the explicit ``prange`` loops (and their
    reductions) run in parallel.  Numba's other conversions (array expressions, numpy
    allocations such as ``np.zeros``, comprehensions, fusion) are off: each would be one
    more parallel region to compile (a gufunc of its own) for loops that are either
    small or already inside a ``prange`` body."""
    if not parallel:
        return False
    return dict(prange=True, reduction=True, comprehension=False, inplace_binop=False,
                setitem=False, numpy=False, stencil=False, fusion=False)


def _jit(fn, parallel):
    options = dict(parallel=_parallel_option(parallel), nogil=True, error_model="numpy")
    if CACHE_ENABLED:
        try:
            return njit(cache=True, **options)(fn)
        except RuntimeError:
            # numba raises RuntimeError("cannot cache function ...: no locator available")
            # when neither the package directory nor the user cache directory is writable.
            pass
    return njit(cache=False, **options)(fn)


class Kernel:
    """A parallel kernel and its serial path.

    Calling it runs the ``parallel=True`` compilation, except in a child of an unsafe
    fork, where it runs :attr:`serial`, and, when the kernel was declared with a ``work``
    measure, for calls with less than :attr:`limit` work units (:meth:`sized`); within
    :func:`forced_schedule` it runs the forced path.  ``py_func`` is the Python function."""

    __slots__ = ("parallel", "py_func", "_serial", "work", "limit",
                 "__name__", "__qualname__", "__wrapped__", "__dict__")

    def __init__(self, fn, work=None, scale=1):
        self.py_func = fn
        self.parallel = _jit(fn, parallel=True)
        self._serial = None
        self.work = work
        #: Calls with fewer work units than this run the serial path.
        self.limit = SERIAL_WORK * scale
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self.__module__ = fn.__module__
        self.__wrapped__ = fn

    @property
    def twin(self):
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

    @property
    def serial(self):
        """The serial path: the serial twin (:attr:`twin`).  Same arguments, same
        results, same bits."""
        return self.twin

    def sized(self, work):
        """The callable to run for a call of ``work`` units: the serial path below
        :attr:`limit` (or always, in a child of an unsafe fork), else the parallel
        compilation; within :func:`forced_schedule`, the forced one.  The one
        serial/parallel policy of the package."""
        if _threads._SERIAL_ONLY or runs_serial(work < self.limit):
            return self.serial
        return self.parallel

    def when_small(self, small):
        """:meth:`sized` for a caller that sized the launch by its own test: the serial
        path when ``small`` is true, else the parallel compilation (the forced schedule
        and an unsafe fork's child still decide first)."""
        return self.sized(0 if small else self.limit)

    def __call__(self, *args):
        if _threads._SERIAL_ONLY:
            return self.serial(*args)
        forced = _forced["schedule"]
        if forced is not None:
            return (self.serial if forced == "serial" else self.parallel)(*args)
        if self.work is not None and self.work(*args) < self.limit:
            return self.serial(*args)
        return self.parallel(*args)

    def __repr__(self):
        return f"<hmath_dl kernel {self.__module__}.{self.__name__}>"


def kernel(fn=None, *, work=None, scale=1):
    """Decorate a parallel kernel (uses ``numba.prange``): returns a :class:`Kernel`.

    ``@kernel`` or ``@kernel(work=..., scale=...)``: ``work(*args)`` is the call's work
    (e.g. elements touched), compared with ``SERIAL_WORK * scale`` on every call (see
    :meth:`Kernel.sized`); ``scale`` alone sets the threshold of :meth:`Kernel.sized`."""
    if fn is None:
        return lambda f: Kernel(f, work=work, scale=scale)
    return Kernel(fn, work=work, scale=scale)


def helper(fn):
    """Decorate a serial kernel or a helper called from other kernels."""
    return _jit(fn, parallel=False)


def inlined(fn):
    """Decorate a helper that is inlined into every caller at the Numba-IR level
    (``inline='always'``).  For helpers called in a kernel's inner loops: a compiled
    helper that is called (LLVM does not inline numba's compiled helpers) increments and
    decrements the reference count of every array argument on each call, an atomic
    operation each (about 20 cycles), which dominates a helper doing a few hundred
    operations.  Inlined, there is no call; the reference counting of its array arguments
    is usually pruned, but not always: in a complex caller (branches, nested inlined
    helpers) each call may still count every array argument up and down (the row norms'
    forward paid ~100 ns a row; ``perf`` shows two hot addresses in Numba's
    ``NRT_incref``/``NRT_decref``).  Then write the code out in the loop, or pass
    :func:`._simd.borrowed` views."""
    return njit(inline="always", nogil=True, error_model="numpy")(fn)


@inlined
def block_size(n, most):
    """Items per block when ``n`` items are cut into at most ``most`` blocks of equal size
    (the last one shorter): for a span kernel whose iterations are blocks of items
    (each iteration is one span call, so fewer, larger ones cost less), called inside the
    span to find its items ``t * block_size .. (t + 1) * block_size - 1``."""
    return max(1, (n + most - 1) // most)


def block_count(n, most):
    """The number of blocks of :func:`block_size` (a span kernel's ``iterations``)."""
    per = block_size.py_func(n, most)
    return (n + per - 1) // per


# --------------------------------------------------------------------------- spans
# A parallel kernel written as a serial "span" helper -- ``span(*args, t0, t1)`` does
# the iterations ``t0 .. t1-1`` of a loop whose iterations are independent -- run in
# parallel by ONE generic ``prange`` driver, :func:`_drive`, compiled once (its three
# arguments are integers).  Numba finalises every entry point with the IR of everything
# it calls linked in, re-optimised and compiled to machine code again, and a parallel
# function is several such entry points (its thread-pool body and two wrappers): a large
# kernel body linked into a parfor is compiled three to four times.  Here nothing is
# linked: the span helper is compiled once (for the serial path and the parallel one
# alike) and called through the address of its native entry point.  What depends on
# the argument types is a small serial function, :func:`_launch` (compiled per
# argument-tuple type, a few dozen instructions): it stores the arguments in its frame
# and defines a trampoline that unpacks them for the span helper; the driver's
# workers call the trampoline.  Same machine code on both paths, so the same bits.

def _excinfo_ptr_t():
    from numba.core import callconv
    ptr = getattr(callconv, "excinfo_ptr_t", None)
    if ptr is None:   # pragma: no cover - older spelling
        from llvmlite import ir
        ptr = ir.PointerType(callconv.excinfo_t)
    return ptr


def _unowned(context, builder, ty, val):
    """``val`` (of Numba type ``ty``) with the memory-manager pointer of every array in it
    (through nested tuples) set to null: views that own no reference.  Each ``prange``
    worker would otherwise increment and decrement the reference count of the same
    array's memory info on every view it takes (a slice, a row): atomic operations on one
    cache line shared by all threads, which ran a span of small tiles at half speed on two
    threads.  Numba's own ``prange`` bodies get their arrays the same way (no owner)."""
    from numba.core import cgutils
    if isinstance(ty, nbtypes.Array):
        ary = context.make_array(ty)(context, builder, value=val)
        ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
        return ary._getvalue()
    if isinstance(ty, nbtypes.BaseTuple):
        for k, sub in enumerate(ty.types):
            item = builder.extract_value(val, k)
            val = builder.insert_value(val, _unowned(context, builder, sub, item), k)
    return val


def _status(context, builder, code, excinfo):
    """Numba's status of a call that returned ``code`` (its exception info at ``excinfo``)."""
    try:
        return context.call_conv._get_return_status(builder, code, builder.load(excinfo))
    except TypeError:   # pragma: no cover - a numba whose status takes no excinfo
        return context.call_conv._get_return_status(builder, code)


def _span_call(context, builder, addr, argtys, vals, retptr, excinfo):
    """Emit a call of the compiled function at the integer ``addr`` (Numba's calling
    convention, returning None) with ``vals`` of Numba types ``argtys``; returns the
    status code (the callee's exception, if any, is left at ``excinfo``)."""
    fnty = context.call_conv.get_function_type(nbtypes.none, argtys)
    fnptr = builder.inttoptr(addr, fnty.as_pointer())
    packed = list(context.get_arg_packer(argtys).as_arguments(builder, vals))
    return builder.call(fnptr, [retptr, excinfo] + packed)


_I64x3 = [nbtypes.int64] * 3


def _call3_intrinsic(propagate):
    def call3(typingctx, addr, a, b, c):
        if not all(isinstance(x, nbtypes.Integer) for x in (addr, a, b, c)):
            return None

        def codegen(context, builder, signature, llargs):
            from numba.core import cgutils
            vals = [context.cast(builder, v, ty, nbtypes.int64)
                    for v, ty in zip(llargs, signature.args)]
            retty = context.data_model_manager[nbtypes.none].get_return_type()
            retptr = cgutils.alloca_once(builder, retty)
            builder.store(cgutils.get_null_value(retty), retptr)
            excinfo = cgutils.alloca_once(builder, _excinfo_ptr_t(), name="excinfo")
            code = _span_call(context, builder, vals[0], _I64x3, vals[1:], retptr, excinfo)
            status = _status(context, builder, code, excinfo)
            if not propagate:
                return builder.zext(status.is_error, context.get_value_type(nbtypes.int64))
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            return context.get_dummy_value()

        return (nbtypes.none if propagate else nbtypes.int64)(addr, a, b, c), codegen

    return intrinsic(call3)


#: ``_call3(addr, a, b, c)``: ``f(a, b, c)`` for the compiled function ``f`` at the integer
#: address ``addr`` (Numba's calling convention, three int64 arguments, returning None),
#: its exception propagated to the caller.
_call3 = _call3_intrinsic(True)
#: ``_try3(addr, a, b, c)``: the same call, returning 1 if ``f`` raised (the exception is
#: dropped), else 0.
_try3 = _call3_intrinsic(False)


@intrinsic
def _stash(typingctx, args, span):
    """``(p, tramp)``: ``p`` the address of a record ``{span, args}`` in this frame (the
    arrays in ``args`` without owners, :func:`_unowned`), ``tramp`` the address of a
    function of this module, ``tramp(p, t0, t1)`` (Numba's calling convention) =
    ``span(*args, t0, t1)`` for the compiled span helper at the address ``span`` (its
    argument types exactly ``args``' element types then two int64)."""
    if not (isinstance(args, nbtypes.BaseTuple) and isinstance(span, nbtypes.Integer)):
        return None
    retty = nbtypes.UniTuple(nbtypes.int64, 2)

    def codegen(context, builder, signature, llargs):
        from llvmlite import ir
        from numba.core import cgutils
        tup, span_v = llargs
        i64 = ir.IntType(64)
        tup = _unowned(context, builder, args, tup)
        record_t = ir.LiteralStructType([i64, tup.type])
        slot = cgutils.alloca_once(builder, record_t)
        builder.store(context.cast(builder, span_v, span, nbtypes.int64),
                      builder.gep(slot, [ir.Constant(ir.IntType(32), 0)] * 2))
        builder.store(tup, builder.gep(slot, [ir.Constant(ir.IntType(32), 0),
                                              ir.Constant(ir.IntType(32), 1)]))
        fnty = context.call_conv.get_function_type(nbtypes.none, _I64x3)
        tramp = cgutils.get_or_insert_function(builder.module, fnty, "hmath_dl_span_tramp")
        if tramp.is_declaration:
            tramp.linkage = "internal"
            tb = ir.IRBuilder(tramp.append_basic_block("entry"))
            retptr, excinfo = tramp.args[0], tramp.args[1]
            p_v, t_v, t1_v = context.call_conv.get_arguments(tramp)
            record = tb.load(tb.inttoptr(p_v, record_t.as_pointer()))
            targs = tb.extract_value(record, 1)
            vals = [tb.extract_value(targs, k) for k in range(len(args.types))]
            vals += [t_v, t1_v]
            code = _span_call(context, tb, tb.extract_value(record, 0),
                              list(args.types) + [nbtypes.int64, nbtypes.int64],
                              vals, retptr, excinfo)
            tb.ret(code)
        p = builder.ptrtoint(slot, i64)
        return context.make_tuple(builder, retty, [p, builder.ptrtoint(tramp, i64)])

    return retty(args, span), codegen


def _drive(p, n, tramp):
    """``tramp(p, t, t + 1)`` for every ``t`` in ``prange(n)``: the one parallel driver of
    every span kernel (one compilation: its arguments are three integers).

    An exception raised in a worker thread cannot leave a ``prange`` body cleanly
    (Numba would set it in the calling thread and return as if nothing happened, which
    Python reports as a ``SystemError``), so the workers only note which iterations
    raised; afterwards the first of them runs again here, outside the parallel region,
    and its exception propagates to the caller as it would from the serial path."""
    raised = np.zeros(n, dtype=np.int8)
    for t in prange(n):
        raised[t] = _try3(tramp, p, t, t + 1)
    for t in range(n):
        if raised[t] != 0:
            _call3(tramp, p, t, t + 1)
            raise RuntimeError("a span kernel raised in a worker thread, not when run again")


_drive = _jit(_drive, parallel=True)


def _launch(args, n, span, drive):
    """``span(*args, t, t + 1)`` for every ``t`` in ``prange(n)``, through the driver
    (whose native entry point is at ``drive``); compiled per argument-tuple type."""
    p, tramp = _stash(args, span)
    _call3(drive, p, n, tramp)


_launch = _jit(_launch, parallel=False)


def _launch_pool(args, n, span, base, part):
    """As :func:`_launch`, on the worker pool (:mod:`._pool`) whose control block is at
    ``base``, with ``part`` threads taking part."""
    p, tramp = _stash(args, span)
    _pool._run(base, p, n, tramp, part)


_launch_pool = _jit(_launch_pool, parallel=False)
_DRIVE = []   # the address of _drive's native entry point, once compiled


def _drive_address():
    if not _DRIVE:
        sig = (nbtypes.int64,) * 3
        _drive.compile(sig)
        cres = _drive.overloads[sig]
        _DRIVE.append(cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name))
    return _DRIVE[0]

try:
    from numba._dispatcher import compute_fingerprint as _compute_fingerprint
except ImportError:  # pragma: no cover - a numba without it: typeof every call
    _compute_fingerprint = None


def _fingerprint(args):
    """Numba's type fingerprint of ``args`` (what its dispatchers key on), or None."""
    if _compute_fingerprint is None:
        return None
    try:
        return _compute_fingerprint(args)
    except (TypeError, ValueError, NotImplementedError):
        return None


class SpanKernel:
    """A parallel kernel made of a serial span helper (``span(*args, t0, t1)``: the
    independent iterations ``t0 .. t1-1``) and the generic driver :func:`_drive`.

    :meth:`run` ``(n, work, *args)`` runs the ``n`` iterations: the span helper over all
    of them in one call for little ``work`` (below ``SERIAL_WORK * scale``, or always in
    a child of an unsafe fork: the policy of :meth:`Kernel.sized`), else in parallel on
    the worker pool (:mod:`._pool`; with ``HMATH_DL_POOL=0`` a ``prange`` on Numba's
    threading layer), each task calling the helper through its address.  A small call compiles only the
    helper; a large one adds the tiny driver.  Called as ``k(*args)`` (or
    ``k.sized(work)(*args)``) it is used like a :class:`Kernel`: ``iterations(*args)``
    gives ``n`` and ``work(*args)`` the work (without ``work``: parallel)."""

    def __init__(self, span, iterations=None, work=None, scale=1):
        self.span = span
        self.iterations = iterations
        self.work = work
        #: Calls with fewer work units than this run the span helper serially.
        self.limit = SERIAL_WORK * scale
        self._addr = {}
        self.__name__ = span.py_func.__name__
        self.__doc__ = span.py_func.__doc__
        self.__module__ = span.py_func.__module__

    def address(self, args):
        """The native entry point of the span helper for the argument tuple ``args``
        (compiled for those types first if needed).  Looked up by Numba's C-level type
        fingerprint of ``args`` (under a microsecond; ``numba.typeof`` of a tuple of
        arrays takes hundreds)."""
        key = _fingerprint(args)
        addr = self._addr.get(key) if key is not None else None
        if addr is None:
            argtys = nbtypeof(args).types
            addr = self._addr.get(argtys)
            if addr is None:
                sig = tuple(argtys) + (nbtypes.int64, nbtypes.int64)
                self.span.compile(sig)
                cres = self.span.overloads[sig]
                if cres.signature.return_type != nbtypes.none:
                    raise TypeError(f"{self.__name__}: a span helper returns None")
                addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
                self._addr[argtys] = addr
            if key is not None:
                self._addr[key] = addr
        return addr

    def run(self, n, work, *args):
        """Run iterations ``0 .. n-1`` of the span helper on ``args`` (serially for less
        than ``limit`` work units, or as :func:`forced_schedule` says)."""
        if n <= 0:
            return
        if _threads._SERIAL_ONLY or runs_serial(work < self.limit) or n == 1:
            self.span(*args, 0, n)
        elif _POOL_ON:
            _pool.run(_launch_pool, args, n, self.address(args), num_threads())
        else:
            _launch(args, n, self.address(args), _drive_address())

    def sized(self, work):
        """A callable running ``k(*args)`` with the given ``work`` (see :meth:`run`)."""
        return lambda *args: self.run(self.iterations(*args), work, *args)

    def when_small(self, small):
        """:meth:`sized` for a caller that sized the launch by its own test: serial when
        ``small`` is true (the forced schedule and an unsafe fork's child decide first)."""
        return self.sized(0 if small else self.limit)

    def __call__(self, *args):
        work = self.work(*args) if self.work is not None else self.limit
        self.run(self.iterations(*args), work, *args)

    def __repr__(self):
        return f"<hmath_dl span kernel {self.__module__}.{self.__name__}>"


def span_kernel(iterations=None, work=None, scale=1):
    """Decorate a serial span helper ``span(*args, t0, t1)`` (the independent
    iterations ``t0 .. t1-1``, returning None): returns a :class:`SpanKernel`;
    ``iterations(*args)`` the number of iterations, ``work(*args)`` a call's work in
    units of ``SERIAL_WORK * scale``."""
    return lambda fn: SpanKernel(_jit(fn, parallel=False), iterations, work, scale)


def num_threads():
    """``numba.get_num_threads()`` in a fraction of its time once Numba's threading layer
    has started (it then reads the calling thread's setting directly; the public function
    takes a lock and checks the layer on every call, ~0.55 us, and the GEMM and every
    pool launch ask).  Falls back to the public function before the layer starts and on
    a Numba without these internals."""
    if _NT:
        return _NT[0]()
    n = _get_num_threads()           # starts the layer if needed
    raw = getattr(_nparallel, "_get_num_threads", None)
    if raw is not None and getattr(_nparallel, "_is_initialized", False) and raw() == n:
        _NT.append(raw)
    return n


_NT = []          # Numba's raw per-thread reader, once the layer has started
from numba.np.ufunc import parallel as _nparallel  # noqa: E402
from numba import get_num_threads as _get_num_threads  # noqa: E402
from ..config import POOL as _POOL_ON  # noqa: E402
from . import _pool  # noqa: E402  (it imports _call3 / _try3 from here)
