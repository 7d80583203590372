"""The worker pool of the span kernels: spinning worker threads, fork-safe.

A parallel span launch (:meth:`._jit.SpanKernel.run`) hands its tasks -- iterations
``t = 0 .. n-1``, a run of them ``tramp(p, t0, t1)`` (:func:`._jit._stash`) -- to this
pool instead of a ``prange`` on Numba's threading layer.  The calling thread publishes
the launch, takes tasks itself and waits until every task is done;
``numba.get_num_threads() - 1`` workers take the others.  Which thread runs a task never
changes its bits (every span kernel's tasks are independent, each sums in its own fixed
order).

Why a pool of its own.  Between two kernels of a training step the calling thread runs
a few dozen microseconds of Python; Numba's TBB layer lets its workers go idle in that
gap, and each launch then pays for waking them and for TBB's task machinery (the
OpenMP layer spins and ran the transformer step 7-12 % faster, but a process that used
GNU OpenMP cannot fork).  Here each worker is a Python thread that runs a compiled,
GIL-free loop: it polls the launch word for about :data:`SPIN_SECONDS` after its last
task (``pause`` between its first :data:`PAUSE_POLLS` polls on x86, then ``sched_yield``,
so that another runnable thread on its core -- a worker of Numba's layer running a
``prange`` kernel -- takes over at once), then sleeps on an event until a launch wakes
it.  Nothing is inherited across ``fork()``: a child starts its own threads at its first
parallel launch, so forked workers run parallel kernels.  Measured in alternating
processes (2-core VM): the transformer training step 3-9 % faster than on TBB, the
small-CNN step 3-7 % (AVX-512); a bare launch of a few tasks 2.2 against 5.3 us.

The protocol (one control block of int64 words, each hot word on a cache line of its
own; atomics with sequentially consistent ordering; see :func:`_run`, :func:`_claim`
and :func:`_worker`):

* ``TICKET`` = ``generation << 32`` of the current launch (low half ``SENTINEL`` while
  the launcher writes its description: ``P``, ``N``, ``TRAMP``, ``RAISED``, ``PART``,
  one range word per thread, ``DONE = 0``).
* Thread ``r`` of ``PART`` owns the tasks ``r*N//PART .. (r+1)*N//PART - 1`` (a static
  split, as ``prange`` makes it: a thread keeps its operands in its own caches); range
  word ``r`` = ``generation << 32 | next task``.  A run of tasks ``i .. i + c - 1`` is
  claimed by a compare-and-swap of ``(g, i)`` to ``(g, i + c)``, ``c`` a quarter of what
  is left below the range's end (at least 1), and run by one call of the span helper:
  tiny tasks (a 6 x 6 plane) pay the call's setup once per run, not once per task, and
  the last quarter of a range is still there to share; a thread takes its own range
  first, then what is left of the others'.  The launcher starts the next launch only
  once ``DONE == N``, so a claim of launch ``g`` can only succeed while ``g`` is current
  -- a thread that read the description of ``g`` and then claimed a task of ``g`` read a
  consistent description, and a thread that lags behind claims nothing.
* ``BUSY``: one launch at a time.  A launch from a second Python thread while the pool is
  busy runs its tasks in its own thread (same bits).
* A run ``t0 .. t1-1`` that raises is noted as ``RAISED[t0] = t1``; the launcher runs the
  first such run again afterwards, in its own thread, and its exception propagates (as
  the serial path would raise it).
"""

from __future__ import annotations

import atexit
import os
import threading
import time

import numpy as np
from llvmlite import ir
from numba.core import cgutils
from numba.core import types as nbtypes
from numba.extending import intrinsic

from . import _cpu
from ._jit import _call3, _try3
from ._jit import _jit as _jit_serial

__all__ = ["run", "enabled", "SPIN_SECONDS", "pool_threads"]

# control block layout (int64 words; hot words on cache lines of their own)
_TICKET, _P, _N, _TRAMP, _RAISED, _PART = 0, 8, 9, 10, 11, 12
_DONE, _BUSY, _STOP, _SLEEP = 16, 24, 32, 40
_RANGES = 48          # the next task of thread r's range: word _RANGES + 8 r (r <= workers)
# and worker w's last launch seen: word _RANGES + 8 (workers + 1) + w (_Pool.wgen)
_SENTINEL = 0xFFFFFFFF
_LOW = 0xFFFFFFFF

#: How long an idle worker polls for the next launch before it sleeps (seconds).
SPIN_SECONDS = 0.002
#: Polls with ``pause`` before the worker yields its core between polls.
PAUSE_POLLS = 200

_X86 = _cpu.machine().arch == "x86_64"     # pause and the cycle counter: x86 only


def _ptr(builder, base, k):
    i64 = ir.IntType(64)
    addr = builder.add(base, builder.mul(k, ir.Constant(i64, 8)))
    return builder.inttoptr(addr, i64.as_pointer())


@intrinsic
def _load(typingctx, base, k):
    """``ctrl[k]`` (an atomic load) of the int64 block at address ``base``."""
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_ptr(builder, *args), "seq_cst", 8)
    return nbtypes.int64(nbtypes.int64, nbtypes.int64), codegen


@intrinsic
def _store(typingctx, base, k, v):
    """``ctrl[k] = v`` (an atomic store, then a full fence)."""
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _ptr(builder, args[0], args[1]), "seq_cst", 8)
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return nbtypes.none(nbtypes.int64, nbtypes.int64, nbtypes.int64), codegen


@intrinsic
def _add(typingctx, base, k, v):
    """Atomically ``ctrl[k] += v``; returns the old value."""
    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _ptr(builder, args[0], args[1]), args[2], "seq_cst")
    return nbtypes.int64(nbtypes.int64, nbtypes.int64, nbtypes.int64), codegen


@intrinsic
def _cas(typingctx, base, k, expect, new):
    """Atomically replace ``ctrl[k]`` by ``new`` if it equals ``expect``; returns 1 if it
    did, else 0."""
    def codegen(context, builder, sig, args):
        res = builder.cmpxchg(_ptr(builder, args[0], args[1]), args[2], args[3],
                              "seq_cst", "seq_cst")
        return builder.zext(builder.extract_value(res, 1), ir.IntType(64))
    return nbtypes.int64(nbtypes.int64, nbtypes.int64, nbtypes.int64, nbtypes.int64), codegen


def _emit_pause(builder):
    """The x86 ``pause`` hint (nothing on other targets)."""
    if _X86:
        fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause",
                                              fnty=ir.FunctionType(ir.VoidType(), []))
        builder.call(fn, [])


@intrinsic
def _pause(typingctx):
    """The x86 ``pause`` hint in a polling loop (nothing on other targets)."""
    def codegen(context, builder, sig, args):
        _emit_pause(builder)
        return context.get_dummy_value()
    return nbtypes.none(), codegen


_HAS_YIELD = os.name == "posix"


@intrinsic
def _yield(typingctx):
    """``sched_yield()`` on POSIX (another runnable thread on this core -- e.g. a worker of
    Numba's threading layer running a ``prange`` kernel -- takes over); else ``pause``."""
    def codegen(context, builder, sig, args):
        if _HAS_YIELD:
            fn = builder.module.globals.get("sched_yield")
            if fn is None:
                fn = ir.Function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                 name="sched_yield")
            builder.call(fn, [])
        else:
            _emit_pause(builder)
        return context.get_dummy_value()
    return nbtypes.none(), codegen


_CLOCK = getattr(time, "CLOCK_MONOTONIC", None) if _HAS_YIELD else None


@intrinsic
def _now(typingctx):
    """Nanoseconds of the monotonic clock (``clock_gettime``, POSIX with a 64-bit
    ``timespec``), else 0."""
    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        if _CLOCK is None:
            return ir.Constant(i64, 0)
        ts_t = ir.LiteralStructType([i64, i64])
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32), ts_t.as_pointer()])
        fn = builder.module.globals.get("clock_gettime")
        if fn is None:
            fn = ir.Function(builder.module, fnty, name="clock_gettime")
        ts = cgutils.alloca_once(builder, ts_t)
        builder.call(fn, [ir.Constant(ir.IntType(32), int(_CLOCK)), ts])
        zero = ir.Constant(ir.IntType(32), 0)
        sec = builder.load(builder.gep(ts, [zero, zero]))
        nsec = builder.load(builder.gep(ts, [zero, ir.Constant(ir.IntType(32), 1)]))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)
    return nbtypes.int64(), codegen


def _jit(fn):
    """The package's serial compilation (:func:`._jit._jit`: cached, ``nogil``)."""
    return _jit_serial(fn, parallel=False)


def _claim(base, g, p, n, tramp, raised, part, me):
    """Run tasks of launch ``g`` until none is left (or ``g`` is over): first those of
    this thread's own range (``me``-th of ``part`` near-equal runs of ``0 .. n-1``, in
    order: the same tasks a static ``prange`` split gives it, so a thread keeps its
    operands in its own caches), then whatever is left of the others' ranges; each claim
    takes a quarter of what is left of a range (at least one task) and runs it in one
    call.  Measured (2 threads, AVX-512): 1,024 tasks of a 4 x 4 plane padded to 6 x 6
    32 -> 10 us per launch (one call per task before), of 16 x 16 planes 95 -> 72 us."""
    done = 0
    for step in range(part):
        r = me + step
        if r >= part:
            r -= part
        end = (r + 1) * n // part
        w = _RANGES + r * 8
        while True:
            t = _load(base, w)
            if (t >> 32) != g:
                break
            i = t & _LOW
            if i >= end:
                break
            c = (end - i) >> 2          # a quarter of what is left of the range
            if c < 1:
                c = 1
            if _cas(base, w, t, t + c):
                if _try3(tramp, p, i, i + c):
                    _store(raised, i, i + c)
                done += c
    if done:
        _add(base, _DONE, done)


_claim = _jit(_claim)


def _worker(base, wid, wgen, spin_ns, spin_polls, pause_polls):
    """A worker's compiled loop: run the tasks of every new launch it may join
    (``wid + 1 < PART``), poll in between (``pause`` for the first ``pause_polls`` polls,
    then yielding the core); return 1 after ``spin_ns`` nanoseconds of the monotonic
    clock without a launch it took part in (where there is no clock: ``spin_polls``
    polls) -- the Python side then sleeps --, 0 when the pool stops.  ``wgen`` is the word
    where it keeps the last launch it has seen (across sleeps).  The budget is time, not
    polls: on a loaded machine a yield can last a whole time slice."""
    last = _load(base, wgen)
    polls = 0
    start = _now()
    while True:
        if _load(base, _STOP) != 0:
            return 0
        t = _load(base, _TICKET)
        g = t >> 32
        if g != last and (t & _LOW) != _SENTINEL:
            last = g
            _store(base, wgen, g)
            if wid + 1 < _load(base, _PART):
                _claim(base, g, _load(base, _P), _load(base, _N), _load(base, _TRAMP),
                       _load(base, _RAISED), _load(base, _PART), wid + 1)
                polls = 0
                start = _now()
            continue
        if polls < pause_polls:
            _pause()
        else:
            _yield()
        polls += 1
        if spin_ns > 0:
            if (polls & 31) == 0 and _now() - start > spin_ns:
                return 1
        elif polls >= spin_polls:
            return 1


_worker = _jit(_worker)


def _polls(k, pause_polls):
    """``k`` polls as the worker's loop makes them (for the spin budget's calibration)."""
    dummy = np.zeros(1, dtype=np.int64)
    base = np.int64(dummy.ctypes.data)
    s = 0
    for i in range(k):
        s += _load(base, 0)
        if i < pause_polls:
            _pause()
        else:
            _yield()
    return s


_polls = _jit(_polls)


def _spin_polls():
    """The number of polls a worker makes in about :data:`SPIN_SECONDS` on this machine
    (``pause`` takes 10 to 150 cycles depending on the micro-architecture; a yield is a
    system call)."""
    import time
    _polls(2, 1)
    t = time.perf_counter()
    _polls(PAUSE_POLLS, PAUSE_POLLS)
    t_pause = time.perf_counter() - t
    t = time.perf_counter()
    _polls(2000, 0)
    per_yield = max(time.perf_counter() - t, 1e-9) / 2000
    return PAUSE_POLLS + max(100, int((SPIN_SECONDS - t_pause) / per_yield))


def _run(base, p, n, tramp, part):
    """Run the tasks ``0 .. n-1`` (runs ``tramp(p, t0, t1)``) on the calling thread and the
    pool's first ``part - 1`` workers; the first task that raised is run again here and
    its exception propagates."""
    raised = np.zeros(n, dtype=np.int64)
    if _cas(base, _BUSY, 0, 1) == 0:
        _call3(tramp, p, 0, n)      # another thread's launch holds the pool
        return
    g = ((_load(base, _TICKET) >> 32) + 1) & _LOW
    _store(base, _TICKET, (g << 32) | _SENTINEL)
    _store(base, _P, p)
    _store(base, _N, n)
    _store(base, _TRAMP, tramp)
    _store(base, _RAISED, np.int64(raised.ctypes.data))
    _store(base, _PART, part)
    for r in range(part):
        _store(base, _RANGES + r * 8, (g << 32) | (r * n // part))
    _store(base, _DONE, 0)
    _store(base, _TICKET, g << 32)
    _claim(base, g, p, n, tramp, np.int64(raised.ctypes.data), part, 0)
    while _load(base, _DONE) < n:
        _pause()
    _store(base, _BUSY, 0)
    for t in range(n):
        if raised[t] != 0:
            _call3(tramp, p, t, raised[t])
            raise RuntimeError("a span kernel raised in a worker thread, not when run again")


_run = _jit(_run)


class _Pool:
    """The process's pool: its control block and worker threads (started on first use,
    again in a forked child)."""

    def __init__(self, workers):
        self.pid = os.getpid()
        # (64-byte aligned: each hot word on a cache line of its own)
        self.wgen = _RANGES + 8 * (workers + 1)
        raw = np.zeros(self.wgen + workers + 8, dtype=np.int64)
        off = (-raw.ctypes.data % 64) // 8
        self.ctrl = raw[off:off + self.wgen + workers]
        self.base = self.ctrl.ctypes.data
        self.size = workers + 1          # threads taking part at most
        self.events = [threading.Event() for _ in range(workers)]
        self.threads = []
        # the spin budget: time where there is a clock, else a calibrated poll count
        polls = _spin_polls() if workers and _CLOCK is None else 0
        for wid in range(workers):
            th = threading.Thread(target=self._serve, args=(wid, polls), daemon=True,
                                  name=f"hmath_dl-pool-{wid}")
            th.start()
            self.threads.append(th)

    def _serve(self, wid, polls):
        ev = self.events[wid]
        while True:
            spin_ns = int(SPIN_SECONDS * 1e9) if _CLOCK is not None else 0
            if _worker(self.base, wid, self.wgen + wid, spin_ns, polls, PAUSE_POLLS) == 0:
                return
            self.ctrl[_SLEEP] += 1       # (under the GIL, as the launcher's read)
            ev.wait()
            ev.clear()
            self.ctrl[_SLEEP] -= 1
            if self.ctrl[_STOP]:
                return

    def wake(self):
        for ev in self.events:
            ev.set()

    def stop(self):
        self.ctrl[_STOP] = 1
        self.wake()
        for th in self.threads:
            th.join(timeout=1.0)


_POOL = []
_LOCK = threading.Lock()


def pool_threads():
    """The number of worker threads (beside the launching thread): Numba's configured
    thread count minus one."""
    from numba.core import config as nconfig
    return max(int(nconfig.NUMBA_NUM_THREADS) - 1, 0)


def _pool():
    with _LOCK:
        if not _POOL:
            _POOL.append(_Pool(pool_threads()))
    return _POOL[0]


def _forget_in_child():
    """After ``fork()`` in the child: the parent's workers do not exist here (and its
    control block may be mid-launch); the next parallel launch starts a new pool."""
    global _LOCK
    _POOL.clear()
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def enabled():
    """Whether span kernels run on this pool (``HMATH_DL_POOL`` is not ``0``)."""
    from .. import config
    return config.POOL


def run(launch, args, n, span, part):
    """Launch through ``launch`` (:func:`._jit._launch_pool`) with the pool's control
    block, waking sleeping workers first."""
    pool = _POOL[0] if _POOL else _pool()
    if pool.ctrl[_SLEEP]:
        pool.wake()
    launch(args, n, span, pool.base, min(part, pool.size))


@atexit.register
def _stop_at_exit():
    if _POOL and _POOL[0].pid == os.getpid():
        _POOL[0].stop()
