"""hmath_dl.config: the table of thresholds in its docstring matches the code, and lists
every threshold-like module constant of the package (so the table cannot go stale)."""

import ast
import os
import re
import subprocess
import sys

import pytest

from hmath_dl import config
from tests.helpers import ROOT

PKG = os.path.join(ROOT, "hmath_dl")
# module-level names that look like thresholds (serial/parallel sizes, work units, task
# counts, path limits of the convolution plan)
LOOKS_LIKE = re.compile(r"SERIAL|WORK|THRESHOLD|PER_TASK|TASKS|PER_THREAD|_PLANE$|_TERMS$"
                        r"|_WINDOW$")
# matches of LOOKS_LIKE that are not thresholds
NOT_THRESHOLDS = {
    "_threads._SERIAL_ONLY",        # state: this process is a child of an unsafe fork
    "config.THRESHOLDS",            # the table itself
}


def _table():
    """(name, value, module) of every row of the docstring's "Thresholds" table."""
    doc = config.__doc__
    text = doc[doc.index(".. rubric:: Thresholds"):]
    border = re.compile(r"^=+(  +=+)+$")
    lines = text.splitlines()
    edges = [i for i, line in enumerate(lines) if border.match(line)]
    assert len(edges) == 3, "the table has a header and a closing border"
    rows = []
    for line in lines[edges[1] + 1:edges[2]]:
        m = re.match(r"^``(\w+)``\s+(\S+)\s+([\w.]+)\s", line)
        if m:
            rows.append(m.groups())
        else:   # a continuation line or a group title
            assert line.startswith(" ") or re.match(r"^\*[\w ]+\*$", line), line
    return rows


def _value(text):
    m = re.fullmatch(r"(\d+)\*\*(\d+)", text)
    return int(m.group(1)) ** int(m.group(2)) if m else ast.literal_eval(text)


def test_every_listed_threshold_exists_with_the_listed_value():
    rows = _table()
    keys = [f"{module}.{name}" for name, _, module in rows]
    assert len(set(keys)) == len(keys)
    assert keys and set(keys) == set(config.THRESHOLDS)
    values = config.thresholds()
    for (name, listed, module), key in zip(rows, keys):
        if key == "config.SERIAL_WORK" and (os.environ.get("HMATH_DL_SERIAL_WORK", "").strip()
                                            or not config.POOL):
            continue    # the table lists the default (with the pool)
        got = values[key]
        assert got == _value(listed) and type(got) is type(_value(listed)), (key, got, listed)


def _module_constants():
    """``module.NAME`` of every module-level assignment in hmath_dl whose name looks like
    a threshold (module relative to hmath_dl, as in the table)."""
    out = set()
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, PKG)[:-3].replace(os.sep, ".")
            module = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            for node in tree.body:
                targets = (node.targets if isinstance(node, ast.Assign) else
                           [node.target] if isinstance(node, ast.AnnAssign) else [])
                for t in targets:
                    if isinstance(t, ast.Name) and LOOKS_LIKE.search(t.id):
                        out.add(f"{module}.{t.id}")
    return out


def test_every_threshold_constant_of_the_package_is_listed():
    found = _module_constants()
    assert "_kernels.gemm_f64._SERIAL_FMAS" in found and "config.SERIAL_WORK" in found
    unlisted = sorted(found - set(config.THRESHOLDS) - NOT_THRESHOLDS)
    assert not unlisted, f"thresholds missing from hmath_dl.config's table: {unlisted}"
    assert NOT_THRESHOLDS <= found      # the exceptions still exist


def test_config_imports_no_kernel_module():
    """config.py is imported by the kernel compiler (_jit) and read by every other module:
    it imports nothing of the package at import time (thresholds() imports lazily)."""
    with open(os.path.join(PKG, "config.py"), encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    imported = [n for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                for n in ([a.name for a in node.names] if isinstance(node, ast.Import)
                          else [node.module or ""])]
    assert set(imported) <= {"os", "__future__"}, imported


@pytest.mark.parametrize("flag", ["--config"])
def test_info_config_prints_the_variables_and_the_thresholds(flag):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "hmath_dl.info", flag], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    lines = out.strip().splitlines()
    assert lines[1] == config.describe()
    assert lines[2] == config.describe_thresholds()
    assert "_kernels.gemm_f64._SERIAL_FMAS=2097152" in lines[2]


_REFAULT = r"""
import resource, sys
import numpy as np
import hmath_dl, hmath_dl._alloc as alloc
def batch():
    arrays = [np.ones(1 << 18) for _ in range(20)]      # 20 x 2 MiB, every page touched
    return arrays
a = batch()
del a
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = batch()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(alloc.STATE, f1 - f0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc policy: Linux")
@pytest.mark.parametrize("setting", ["", "system"])
def test_freed_arrays_are_reused_without_page_faults(setting):
    """import hmath_dl keeps freed arrays under 32 MiB in the heap (hmath_dl._alloc): 40 MiB
    of arrays allocated again after a free fault in (almost) no pages; HMATH_DL_MALLOC=system
    leaves glibc alone."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HMATH_DL_MALLOC=setting)
    out = subprocess.run([sys.executable, "-c", _REFAULT], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    state, faults = out.split()
    if setting == "system":
        assert state == "system"
        return
    if state == "not glibc":
        pytest.skip("not glibc: the C library's allocator is left alone")
    assert state == "tuned"
    assert int(faults) < 2000, faults        # 40 MiB is 10240 pages


_POOL = r"""
import resource, sys
import numpy as np
import hmath_dl, hmath_dl._alloc as alloc
from hmath_dl.activations import Activation, activate
x = np.random.default_rng(0).standard_normal((1024, 6144))    # 48 MiB, above glibc's bound
want = activate(Activation.RELU, x)                             # the pool's first block
ptr = want.ctypes.data
keep = want.copy()
del want
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
again = activate(Activation.RELU, x)
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
same = again.ctypes.data == ptr
view = again[::3]                      # a view keeps the block: the next output is new
del again
other = activate(Activation.RELU, x)
print(f1 - f0, int(same), int(other.ctypes.data != ptr),
      int(np.array_equal(keep, other) and np.array_equal(keep[::3], view)),
      int(alloc.leased_whole(other)), int(not other.flags.owndata))
"""


@pytest.mark.parametrize("setting", ["", "system"])
def test_large_outputs_reuse_freed_pool_blocks(setting):
    """Outputs of 32 MiB or more come from hmath_dl._alloc's pool: the next output of the
    same size gets a freed block back (its pages already in memory: no page faults), never
    one that a view still uses, and the values are the same; HMATH_DL_MALLOC=system turns
    the pool off."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HMATH_DL_MALLOC=setting)
    out = subprocess.run([sys.executable, "-c", _POOL], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    faults, same, other, equal, leased, not_owned = (int(v) for v in out.split())
    assert equal
    if setting == "system":
        assert not leased and not not_owned
        return
    assert same and other and leased and not_owned
    assert faults < 1000, faults              # 48 MiB is 12288 pages
