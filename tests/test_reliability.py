"""Hostile conditions (issue 8): threads, read-only installs, concurrent first calls,
the cache switch, and resource guards."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hmath_dl.errors import ShapeError
from tests.helpers import ROOT

PACKAGE = os.path.join(ROOT, "hmath_dl")


# ------------------------------------------------------------------ concurrency
def _calls():
    """A mix of kernels (parallel and serial) on inputs large enough to use the threads."""
    from hmath_dl import layers as L
    from hmath_dl import precision as P
    from hmath_dl.activations import Activation, activate

    g = np.random.default_rng(5)
    x4 = g.standard_normal((4, 8, 16, 16))
    w = g.standard_normal((8, 8, 3, 3))
    seq = g.standard_normal((2, 32, 16))
    a, b = g.standard_normal((48, 40)), g.standard_normal((40, 24))
    qa = P.quantize(P.Quantization.SYMMETRIC, 0, a)
    qb = P.quantize(P.Quantization.ASYMMETRIC, 1, b)
    opts = L.ConvOptions((1, 1), (1, 1), (1, 1), 1)
    return [
        lambda: L.convolution(opts, x4, w, None),
        lambda: L.layer_norm(1, 1e-5, x4),
        lambda: L.group_norm(4, 1e-5, x4),
        lambda: L.pooling(L.PoolMode.MAX, (3, 3), (2, 2), (1, 1), x4),
        lambda: L.scaled_dot_product_attention(seq, seq, seq, L.causal_mask(32, 32, 0), None)[0],
        lambda: P.int8_gemm(qa, qb),
        lambda: P.reduced_gemm(P.Precision.BF16, a, b),
        lambda: P.round_to_bits(P.Precision.FP16, a),
        lambda: activate(Activation.GELU, x4),
        lambda: L.dense(a, b.T, None),
    ]


def test_four_threads_match_serial_results():
    calls = _calls()
    expected = [np.asarray(c()).tobytes() for c in calls]

    def worker(t):
        got = []
        for i in range(50):
            k = (i + t) % len(calls)
            got.append((k, np.asarray(calls[k]()).tobytes()))
        return got

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(worker, range(4)))
    for got in results:
        for k, data in got:
            assert data == expected[k], f"call {k} differs under concurrency"


# ------------------------------------------------------------------ JIT cache
_PROBE = textwrap.dedent("""
    import numpy as np, sys
    import hmath_dl, os
    assert os.path.dirname(os.path.dirname(hmath_dl.__file__)) == os.getcwd(), hmath_dl.__file__
    from hmath_dl import _checks
    from hmath_dl.precision import Precision, round_to_bits
    x = np.linspace(-3, 3, 100_001)
    assert _checks.is_finite(x)
    sys.stdout.write(round_to_bits(Precision.BF16, x).tobytes().hex()[:64])
""")


def _fresh_copy(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "hmath_dl",
                    ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    return site


def _env(site, **extra):
    env = dict(os.environ)
    env.pop("NUMBA_CACHE_DIR", None)
    env["PYTHONPATH"] = str(site)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _can_mount_readonly(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    cmd = f"mount --bind -o ro {probe} {probe} && ! touch {probe}/x 2>/dev/null"
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _run_readonly(site, ro_dirs, env):
    mounts = " && ".join(f"mount --bind -o ro {d} {d}" for d in ro_dirs)
    script = f"{mounts} && exec {sys.executable} -c \"$PROBE\""
    env = dict(env, PROBE=_PROBE)
    return subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, cwd=site,
                          capture_output=True, text=True, timeout=600)


def test_readonly_install_uses_user_cache_or_none(tmp_path):
    if not _can_mount_readonly(tmp_path):
        pytest.skip("cannot create a read-only bind mount here (needs unshare -m)")
    site = _fresh_copy(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    # 1. read-only package, writable user cache: numba caches in the user directory
    out = _run_readonly(site, [site], _env(site, XDG_CACHE_HOME=cache, HOME=tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert not list(site.rglob("*.nbi"))
    # 2. nothing writable at all: kernels still compile and run (uncached)
    out2 = _run_readonly(site, [site, cache], _env(site, XDG_CACHE_HOME=cache, HOME=cache))
    assert out2.returncode == 0, out2.stderr[-3000:]
    assert out2.stdout == out.stdout


def test_three_processes_compile_and_cache_at_once(tmp_path):
    site = _fresh_copy(tmp_path)
    env = _env(site)
    procs = [subprocess.Popen([sys.executable, "-c", _PROBE], env=env, cwd=site, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, stderr[-3000:]
    assert len({stdout for stdout, _ in outs}) == 1
    assert list(site.rglob("*.nbi")), "no cache index was written"
    # a fourth process loads from the cache and agrees
    again = subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=site, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and again.stdout == outs[0][0]


def test_cache_can_be_switched_off(tmp_path):
    site = _fresh_copy(tmp_path)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=_env(site, HMATH_DL_NO_CACHE=1),
                         cwd=site, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not list(site.rglob("*.nbi"))


# ------------------------------------------------------------------ resource guards
@pytest.mark.parametrize("call", [
    lambda L, P: L.sinusoidal_encoding(10**7, 10**7, 0),
    lambda L, P: L.causal_mask(10**9, 10**9, 0),
    lambda L, P: L.alibi_bias(1.0, 10**9, 10**9, 0),
    lambda L, P: L.pooling(L.PoolMode.MAX, (1,), (1,), (10**12,), np.ones((1, 1, 1))),
    lambda L, P: L.transposed_convolution((0,), L.ConvOptions((10**12,), (0,), (1,), 1),
                                          np.ones((1, 1, 3)), np.ones((1, 1, 1)), None),
    lambda L, P: L.adaptive_pooling(L.PoolMode.AVERAGE, (10**12,), np.ones((1, 1, 2))),
])
def test_absurd_outputs_are_refused_before_allocation(call):
    from hmath_dl import layers as L
    from hmath_dl import precision as P

    with pytest.raises(ShapeError):
        call(L, P)


def _raising_span(x, out, scale, stop, t0, t1):
    for t in range(t0, t1):
        if t == stop:
            raise ValueError("iteration reached the stop")
        out[t] = x[t, 1] * scale + t


@pytest.mark.parametrize("schedule", ["serial", "parallel"])
def test_span_kernel_runs_and_raises_on_both_paths(schedule):
    """The generic span driver: both schedules compute every iteration from the same
    (non-contiguous, read-only) arguments, and an exception raised in one iteration
    reaches the caller as itself -- on the parallel path it is raised in a worker thread,
    which a ``prange`` body cannot pass on (it used to surface as a SystemError)."""
    from numba import njit

    from hmath_dl._kernels._jit import SpanKernel, forced_schedule
    k = SpanKernel(njit(_raising_span), iterations=lambda x, out, scale, stop: out.shape[0])
    x = np.arange(80.0).reshape(40, 2)[::2]
    x.setflags(write=False)
    out = np.zeros(20)
    with forced_schedule(schedule):
        k(x, out, 0.5, -1)
    np.testing.assert_array_equal(out, x[:, 1] * 0.5 + np.arange(20))
    with forced_schedule(schedule), pytest.raises(ValueError, match="reached the stop"):
        k(x, out, 0.5, 13)
