"""Shared test utilities (not oracles: those live in tests/reference/)."""

import os
import subprocess
import sys
import textwrap

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_with_threads(code: str, threads: int) -> bytes:
    """Run ``code`` in a fresh interpreter with ``NUMBA_NUM_THREADS=threads``; return its
    stdout bytes.  ``code`` should write result bytes to ``sys.stdout.buffer``."""
    env = dict(os.environ)
    env["NUMBA_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, check=False, timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"subprocess failed:\n{out.stderr.decode()}")
    return out.stdout


def assert_same_across_threads(code: str) -> None:
    """The bytes ``code`` prints are identical with 1 and 2 numba threads."""
    one = run_with_threads(code, 1)
    two = run_with_threads(code, 2)
    assert len(one) > 0
    assert one == two


def frozen_copy(*arrays):
    """Copies to compare against after a call (inputs must never be mutated)."""
    return [np.array(a, copy=True) for a in arrays]


def noncontiguous(a):
    """A non-contiguous view holding the same values as ``a``."""
    a = np.asarray(a, dtype=np.float64)
    big = np.zeros(a.shape + (2,), dtype=np.float64)
    big[..., 0] = a
    return big[..., 0]


def readonly(a):
    a = np.array(a, dtype=np.float64, copy=True)
    a.flags.writeable = False
    return a
