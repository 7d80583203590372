"""``python -m hmath_dl.precompile`` and the first-run notice (hmath_dl/_kernels/_jit.py).

Each test runs fresh interpreters on a temporary, empty ``NUMBA_CACHE_DIR`` (a cold
cache) and uses one small entry of the precompile table (``precision.round_to_precision``:
a few seconds of compiling) to stay quick.
"""

import os
import subprocess
import sys
import textwrap

from tests.helpers import ROOT

NOTICE = "hmath_dl: compiling kernels for this CPU"
ENTRY = "precision.round_to_precision"

# Runs the entry in-process and prints how much was compiled.  The notice threshold is
# lowered from ~2 s because this entry may compile in less than that on a fast machine;
# the rule (once per process, only for real compiles, never for cache loads) is the same.
PROBE = textwrap.dedent(f"""
    import hmath_dl._kernels._jit as jit
    jit.NOTICE_AFTER = 0.05
    from hmath_dl.precompile import run, select
    seconds, failures = run(select([{ENTRY!r}]), progress=False)
    assert not failures, failures
    print("compiled", len(jit.compile_watch.seconds), round(jit.compile_watch.total, 3))
""")


def _run(args, cache, **env):
    full = dict(os.environ, NUMBA_CACHE_DIR=str(cache),
                PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full.pop("HMATH_DL_QUIET", None)
    full.pop("HMATH_DL_NO_CACHE", None)
    full.update(env)
    return subprocess.run([sys.executable, *args], env=full, capture_output=True, text=True,
                          timeout=600, check=False)


def _compiled(out):
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("compiled ")][-1]
    return int(line.split()[1])


def test_precompile_fills_the_cache(tmp_path):
    cache = tmp_path / "cache"
    out = _run(["-m", "hmath_dl.precompile", ENTRY], cache)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "hmath_dl precompile: 1/1 entries (precision) in" in out.stdout, out.stdout
    assert "hmath_dl precompile" in out.stderr          # the progress bar (or lines)
    assert NOTICE not in out.stderr                     # the bar says it: no notice
    assert any(cache.rglob("*.nbi")), "nothing was written to the cache"
    # a later process loads everything from the cache: nothing compiles, no notice
    warm = _run(["-c", PROBE], cache)
    assert warm.returncode == 0, warm.stderr
    assert _compiled(warm) == 0, warm.stdout
    assert NOTICE not in warm.stderr


def test_precompile_command_line(tmp_path):
    listed = _run(["-m", "hmath_dl.precompile", "--list"], tmp_path)
    assert listed.returncode == 0 and ENTRY in listed.stdout.split()
    for module in ("precision", "activations", "layers", "autodiff", "optim"):
        assert any(k.startswith(module + ".") for k in listed.stdout.split()), module
    bad = _run(["-m", "hmath_dl.precompile", "no_such_module"], tmp_path)
    assert bad.returncode == 2 and "unknown module or entry: no_such_module" in bad.stderr


def test_notice_once_on_a_cold_cache_and_never_when_quiet_or_warm(tmp_path):
    cold = _run(["-c", PROBE], tmp_path / "a")
    assert cold.returncode == 0, cold.stderr
    assert _compiled(cold) > 0
    assert cold.stderr.count(NOTICE) == 1, cold.stderr
    warm = _run(["-c", PROBE], tmp_path / "a")
    assert warm.returncode == 0 and _compiled(warm) == 0
    assert NOTICE not in warm.stderr, warm.stderr
    quiet = _run(["-c", PROBE], tmp_path / "b", HMATH_DL_QUIET="1")
    assert quiet.returncode == 0 and _compiled(quiet) > 0
    assert NOTICE not in quiet.stderr, quiet.stderr
