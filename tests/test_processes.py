"""Inside real engines (issue 13): forked and spawned workers after the parent used the
kernels, several Python threads, no change to the process environment, import order.

Each scenario runs in a fresh interpreter (the threading layer is chosen once per
process), computes a mix of parallel kernels in the parent, then in workers, and compares
the bytes.  A hang would be a failure (every wait has a timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT

FORK_OK = hasattr(os, "fork") and sys.platform != "darwin"

_MIX = "from tests._process_mix import mix, work\n"

_POOL = _MIX + textwrap.dedent("""
    import multiprocessing as mp, sys, os
    if __name__ == "__main__":
        from hmath_dl import _threads
        parent = mix()                       # the parent uses the parallel kernels first
        layer = _threads.threading_layer()
        ctx = mp.get_context(sys.argv[1])
        with ctx.Pool(2) as pool:
            got = pool.map_async(work, range(4)).get(timeout=600)
        assert all(g[0] == parent for g in got), (parent, got)
        assert len({g[2] for g in got}) >= 1 and all(g[2] != os.getpid() for g in got)
        print(layer, sorted({g[1] for g in got}))
""")


def _run(script, *args, env_extra=None, timeout=900):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("NUMBA_THREADING_LAYER", None)
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "Terminating" not in out.stderr, out.stderr[-2000:]
    return out.stdout.strip()


@pytest.mark.skipif(not FORK_OK, reason="fork() start method needs Linux")
def test_fork_pool_after_parent_use_default_layer():
    """The default layer (TBB when installed) survives fork: children launch parallel
    kernels themselves and get the parent's bits."""
    from importlib import metadata
    layer, serial = _run(_POOL, "fork").split(" ", 1)
    try:
        metadata.distribution("tbb")
    except metadata.PackageNotFoundError:
        pytest.skip("the tbb wheel is not installed here (no wheel for this platform)")
    assert layer == "tbb"
    assert serial == "[False]"


@pytest.mark.skipif(not FORK_OK, reason="fork() start method needs Linux")
@pytest.mark.parametrize("layer", ["omp", "workqueue"])
def test_fork_pool_after_parent_use_other_layers(layer):
    """With a layer forced by the user: GNU OpenMP would abort a forked child at its first
    parallel launch, so the child runs the serial twins (same bits); workqueue forks fine."""
    try:
        got = _run(_POOL, "fork", env_extra={"NUMBA_THREADING_LAYER": layer})
    except AssertionError as e:  # the layer itself is not available in this numba build
        if "No threading layer could be loaded" in str(e) or "not available" in str(e):
            pytest.skip(f"numba's {layer} layer is not available here")
        raise
    got_layer, serial = got.split(" ", 1)
    assert got_layer == layer
    assert serial == ("[True]" if layer == "omp" else "[False]")


def test_spawn_pool_after_parent_use():
    got_layer, serial = _run(_POOL, "spawn").split(" ", 1)
    assert serial == "[False]"


@pytest.mark.skipif(not FORK_OK, reason="fork() start method needs Linux")
def test_forked_grandchild_of_an_unsafe_parent_stays_serial():
    script = _MIX + textwrap.dedent("""
        import os
        from hmath_dl import _threads
        parent = mix()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                     # child: fork again
            os.close(r)
            pid2 = os.fork()
            if pid2 == 0:
                d, s, _ = work(0)
                os.write(w, f"{d} {s}".encode()); os._exit(0)
            _, st = os.waitpid(pid2, 0)
            os._exit(os.waitstatus_to_exitcode(st))
        os.close(w)
        _, st = os.waitpid(pid, 0)
        msg = os.read(r, 1000).decode()
        assert os.waitstatus_to_exitcode(st) == 0
        d, s = msg.split()
        assert d == parent, (d, parent)
        print(s)
    """)
    assert _run(script, env_extra={"NUMBA_THREADING_LAYER": "omp"}) == "True"


def test_dataloader_workers_after_parent_use():
    pytest.importorskip("torch", reason="torch is not installed")
    script = _MIX + textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, Dataset

        class D(Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                return mix()

        if __name__ == "__main__":
            parent = mix()
            got = [d for batch in DataLoader(D(), batch_size=2, num_workers=2, timeout=600)
                   for d in batch]
            assert got == [parent] * 4, (got, parent)
            print("ok")
    """)
    assert _run(script) == "ok"


def test_eight_python_threads_match_one():
    script = _MIX + textwrap.dedent("""
        from concurrent.futures import ThreadPoolExecutor
        ref = mix()
        with ThreadPoolExecutor(max_workers=8) as pool:
            got = list(pool.map(lambda i: mix(), range(16)))
        assert got == [ref] * 16
        print("ok")
    """)
    assert _run(script) == "ok"


def test_import_and_use_leave_the_environment_unchanged():
    script = textwrap.dedent("""
        import os
        before = dict(os.environ)
        import numpy as np
        import hmath_dl
        from hmath_dl import layers as L, precision as P
        L.layer_norm(1, 1e-5, np.random.default_rng(0).standard_normal((64, 4096)))
        P.round_to_bits(P.Precision.BF16, np.ones(1 << 18))
        assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
        print("ok")
    """)
    assert _run(script) == "ok"


def test_torch_imported_first_gives_no_warning_and_the_same_layer():
    pytest.importorskip("torch", reason="torch is not installed")
    script = textwrap.dedent("""
        import warnings
        warnings.simplefilter("error")
        import torch
        import numpy as np
        import hmath_dl
        from hmath_dl import _threads, layers as L
        L.layer_norm(1, 1e-5, np.random.default_rng(0).standard_normal((64, 4096)))
        print(_threads.threading_layer())
    """)
    first = _run(script)
    second = _run(script.replace("import torch\n", "").replace(
        "print(", "import torch\nprint("))
    assert first == second


def test_info_prints_one_line():
    out = subprocess.run([sys.executable, "-m", "hmath_dl.info"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep
                                  + os.environ.get("PYTHONPATH", "")))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    line = lines[0]
    import hmath_dl
    assert line.startswith(f"hmath_dl {hmath_dl.__version__} |")
    assert "| threading " in line and "not started" not in line
    assert "| kernels " in line and "| cache " in line
