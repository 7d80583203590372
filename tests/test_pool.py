"""The span kernels' worker pool (``hmath_dl/_kernels/_pool.py``): every task runs once,
results equal the serial schedule's bytes, a task's exception reaches the caller, idle
workers sleep and come back, a second launching thread and a forked child are served,
and ``HMATH_DL_POOL=0`` (Numba's threading layer) gives the same bytes."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

from hmath_dl._kernels import _jit, _pool
from hmath_dl._kernels.gemm_f64 import gemm
from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(not _pool.enabled(), reason="HMATH_DL_POOL=0 in this run")

FORK_OK = hasattr(os, "fork") and sys.platform != "darwin"


@_jit.span_kernel(iterations=lambda out, fail: out.shape[0])
def _mark(out, fail, t0, t1):
    """``out[t] += t + 1`` for the tasks ``t0 .. t1-1``; raises ValueError at ``fail``."""
    for t in range(t0, t1):
        if t == fail:
            raise ValueError("task failed on purpose")
        out[t] += t + 1


def _parallel(n, fail=-1):
    out = np.zeros(n, dtype=np.int64)
    with _jit.forced_schedule("parallel"):
        _mark(out, fail)
    return out


@pytest.mark.parametrize("n", [2, 3, 7, 64, 1000])
def test_every_task_runs_exactly_once(n):
    assert _parallel(n).tolist() == list(range(1, n + 1))


@pytest.mark.parametrize("where", ["first", "inside", "last"])
def test_an_exception_in_a_task_reaches_the_caller(where):
    """A task that raises -- in the launching thread's own range (the first task) or in a
    worker's (the last; ``inside``: within a run of tasks a thread claimed at once, not
    its first) -- is run again in the caller, whose exception propagates; the pool
    serves the next launch."""
    n = 64
    with pytest.raises(ValueError, match="on purpose"):
        _parallel(n, {"first": 0, "inside": n // 2 + 5, "last": n - 1}[where])
    assert _parallel(n).tolist() == list(range(1, n + 1))


@_jit.span_kernel(iterations=lambda first: first.shape[0])
def _runs(first, t0, t1):
    """``first[t] = t0`` for the tasks ``t0 .. t1-1`` of one call."""
    for t in range(t0, t1):
        first[t] = t0


def test_threads_claim_runs_of_tasks():
    """Each claim takes a run of consecutive tasks (a quarter of what is left of a range)
    and runs it in one call of the span helper: 1,000 tiny tasks take a few dozen calls,
    each a run of consecutive tasks, together covering every task once."""
    n = 1000
    first = np.full(n, -1, dtype=np.int64)
    with _jit.forced_schedule("parallel"):
        _runs(first)
    starts = np.flatnonzero(first == np.arange(n))
    assert starts[0] == 0 and (first >= 0).all()
    for a, b in zip(starts, list(starts[1:]) + [n]):
        assert (first[a:b] == a).all()          # a run: every task points to its start
    assert len(starts) <= 100, len(starts)      # one call per task would make 1,000


def test_a_product_has_the_serial_bytes():
    g = np.random.default_rng(1)
    a, b = g.standard_normal((301, 257)), g.standard_normal((257, 190))
    with _jit.forced_schedule("serial"):
        want = gemm(a, b)[0]
    with _jit.forced_schedule("parallel"):
        got = gemm(a, b)[0]
    assert got.tobytes() == want.tobytes()


def test_idle_workers_sleep_and_take_part_again():
    """After :data:`SPIN_SECONDS` without a launch the workers sleep; the next launch wakes
    them and every task still runs once."""
    _parallel(64)
    pool = _pool._POOL[0]
    if not pool.threads:
        pytest.skip("a single thread: the pool has no workers")
    deadline = time.time() + 5
    while pool.ctrl[_pool._SLEEP] < len(pool.threads) and time.time() < deadline:
        time.sleep(0.01)
    assert pool.ctrl[_pool._SLEEP] == len(pool.threads)
    for _ in range(20):
        assert _parallel(64).tolist() == list(range(1, 65))
    deadline = time.time() + 5
    while pool.ctrl[_pool._SLEEP] != 0 and time.time() < deadline:
        _parallel(8)
    assert pool.ctrl[_pool._SLEEP] == 0          # woken, and spinning again
    assert all(th.is_alive() for th in pool.threads)


def test_a_launch_while_the_pool_is_busy_runs_in_its_own_thread():
    _parallel(4)
    pool = _pool._POOL[0]
    assert pool.ctrl[_pool._BUSY] == 0
    pool.ctrl[_pool._BUSY] = 1                  # as if another thread's launch held it
    try:
        assert _parallel(64).tolist() == list(range(1, 65))
    finally:
        pool.ctrl[_pool._BUSY] = 0


def test_concurrent_launches_from_python_threads():
    g = np.random.default_rng(2)
    a, b = g.standard_normal((200, 300)), g.standard_normal((300, 170))
    with _jit.forced_schedule("serial"):
        want = gemm(a, b)[0].tobytes()
    got, errors = [], []

    def run():
        try:
            for _ in range(20):
                got.append(gemm(a, b)[0].tobytes())
                out = np.zeros(33, dtype=np.int64)
                _mark(out, -1)
                got.append(out.tolist() == list(range(1, 34)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    with _jit.forced_schedule("parallel"):     # (process-wide: set once, around them all)
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
    assert not errors
    assert len(got) == 4 * 40
    assert all(v is True or v == want for v in got)


def test_one_thread_takes_every_task():
    import numba
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        assert _parallel(50).tolist() == list(range(1, 51))
    finally:
        numba.set_num_threads(old)


@pytest.mark.skipif(not FORK_OK, reason="fork() needs Linux")
def test_a_forked_child_starts_its_own_pool():
    """The parent's workers do not exist in a forked child: its first parallel launch
    starts a pool of its own (with its own threads), and the results match."""
    parent = _parallel(64).tolist()
    assert _pool._POOL[0].pid == os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                             # pragma: no cover - child
        try:
            os.close(r)
            ok = _parallel(64).tolist() == parent
            pool = _pool._POOL[0]
            ok = ok and pool.pid == os.getpid() and all(t.is_alive() for t in pool.threads)
            os.write(w, b"ok" if ok else b"bad")
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 10) == b"ok"


def test_numba_threading_layer_gives_the_same_bytes():
    """``HMATH_DL_POOL=0`` runs the span kernels as a ``prange`` on Numba's layer."""
    import subprocess
    code = ("import sys, numpy as np\n"
            "from hmath_dl._kernels import _jit, _pool\n"
            "from hmath_dl._kernels.gemm_f64 import gemm\n"
            "g = np.random.default_rng(3)\n"
            "a, b = g.standard_normal((250, 400)), g.standard_normal((400, 130))\n"
            "with _jit.forced_schedule('parallel'):\n"
            "    c = gemm(a, b)[0]\n"
            "sys.stdout.write(str(_pool.enabled()) + ' ' + str(bool(_pool._POOL)) + ' ')\n"
            "sys.stdout.flush()\n"
            "sys.stdout.buffer.write(c.tobytes())\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HMATH_DL_POOL="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         timeout=600, check=True).stdout
    g = np.random.default_rng(3)
    a, b = g.standard_normal((250, 400)), g.standard_normal((400, 130))
    with _jit.forced_schedule("serial"):
        want = gemm(a, b)[0]
    assert out[:12] == b"False False "
    assert out[12:] == want.tobytes()


def test_channels_first_on_the_pool_is_the_transpose():
    """``channels_first`` (a span kernel since this pool): ``g [N, C, P] -> [C, N*P]``,
    equal to numpy's transpose in either schedule, and the channel sums it can compute
    on the way equal to ``sum_to``'s."""
    from hmath_dl._kernels.backward import channels_first
    from hmath_dl._kernels.views import readonly
    from hmath_dl._kernels.reduce import sum_to
    g = np.random.default_rng(4).standard_normal((5, 7, 33))
    g[1, 2, 3] = -0.0
    want = np.ascontiguousarray(g.transpose(1, 0, 2)).reshape(7, -1)
    want_sums = sum_to(g, (False, True, False))
    for schedule in ("serial", "parallel"):
        out = np.empty((7, 5 * 33))
        with _jit.forced_schedule(schedule):
            channels_first(readonly(g), out, np.empty(0))
        assert out.tobytes() == want.tobytes()
        # with the channel sums (a convolution's bias gradient): sum_to's bits
        out = np.empty((7, 5 * 33))
        sums = np.full(7, np.nan)
        with _jit.forced_schedule(schedule):
            channels_first(readonly(g), out, sums)
        assert out.tobytes() == want.tobytes()
        assert sums.tobytes() == want_sums.tobytes()
