"""Same bits on every target (issue 14): the convolution paths compiled for the host, for
AVX2 (``NUMBA_CPU_NAME=haswell``, where the host can run it), for baseline x86-64
(``NUMBA_CPU_NAME=generic``) and with the portable kernels forced
(``HMATH_DL_KERNELS=portable``) give identical bytes, every path forced in turn.

Each target runs in its own interpreter (numba's target is fixed per process); the
digest covers every forward path on every shape where it applies, transposed
convolutions (row-pair and wide paths) and 1-D/3-D inputs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT

_SCRIPT = textwrap.dedent("""
    import hashlib
    import numpy as np
    from hmath_dl import layers as L
    from hmath_dl._kernels import _cpu, conv_plan as K

    g = np.random.default_rng(0)
    fwd = []
    for (N, C, H, W, Co, k, s, p, d, gr) in [
            (2, 8, 17, 19, 12, 3, 1, 1, 1, 1), (2, 8, 16, 16, 8, 3, 1, 1, 1, 1),
            (1, 4, 9, 33, 6, 3, 2, 1, 1, 1), (2, 16, 12, 12, 16, 1, 2, 0, 1, 1),
            (1, 3, 40, 40, 8, 7, 2, 3, 1, 1), (2, 8, 10, 10, 8, 3, 1, 2, 2, 1),
            (2, 8, 9, 9, 16, 3, 1, 1, 1, 4), (1, 6, 7, 5, 5, 3, 1, 1, 1, 1),
            (2, 12, 6, 6, 12, 3, 1, 1, 1, 3), (1, 8, 5, 70, 10, 3, 1, 1, 1, 1),
            (1, 8, 4, 13, 7, 2, 1, 0, 1, 1), (1, 16, 14, 14, 20, 3, 1, 1, 1, 1),
            (2, 8, 8, 8, 8, 4, 1, 3, 1, 1), (1, 24, 7, 7, 13, 3, 1, 1, 1, 1)]:
        x = g.standard_normal((N, C, H, W))
        w = g.standard_normal((Co, C // gr, k, k))
        b = g.standard_normal(Co)
        fwd.append((L.ConvOptions((s, s), (p, p), (d, d), gr), x, w, b))
    x1 = g.standard_normal((3, 16, 300)); w1 = g.standard_normal((24, 16, 5))
    fwd.append((L.ConvOptions((1,), (2,), (1,), 1), x1, w1, None))
    x3 = g.standard_normal((1, 4, 6, 7, 9)); w3 = g.standard_normal((8, 4, 3, 3, 3))
    fwd.append((L.ConvOptions((1, 1, 1), (1, 1, 1), (1, 1, 1), 1), x3, w3, None))
    tr = []
    for (N, C, Co, H, k, s, p, op, gr) in [(2, 8, 8, 8, 4, 2, 1, 0, 1), (1, 6, 12, 9, 3, 2, 1, 1, 1),
                                           (2, 8, 6, 7, 3, 1, 1, 0, 2), (1, 4, 8, 5, 5, 3, 2, 2, 1),
                                           (1, 12, 12, 11, 4, 2, 1, 0, 1), (1, 8, 16, 4, 4, 2, 1, 0, 1),
                                           # one tap per phase: the row-pair kernel on AVX2 too
                                           (1, 8, 12, 6, 2, 2, 0, 0, 1)]:
        x = g.standard_normal((N, C, H, H + 3)); w = g.standard_normal((C, Co // gr, k, k))
        tr.append(((op, op), L.ConvOptions((s, s), (p, p), (1, 1), gr), x, w, None))
    h = hashlib.sha256()
    for path in (None,) + K.FORWARD_PATHS:
        with K.forced_path(path):
            for args in fwd:
                h.update(np.ascontiguousarray(L.convolution(*args)).tobytes())
    for path in (None,) + K.TRANSPOSE_PATHS:
        with K.forced_transpose_path(path):
            for args in tr:
                h.update(np.ascontiguousarray(L.transposed_convolution(*args)).tobytes())
    print(_cpu.machine().isa, h.hexdigest())
""")


def _host_has(feature):
    import llvmlite.binding as llb
    return bool(llb.get_host_cpu_features().get(feature, False))


def _run(**env_extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "HMATH_DL_KERNELS")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-4000:]
    isa, digest = out.stdout.split()
    return isa, digest


@pytest.mark.slow
def test_every_path_gives_the_same_bits_on_every_target():
    host_isa, host = _run()
    portable_isa, portable = _run(HMATH_DL_KERNELS="portable")
    from hmath_dl._kernels._cpu import target_environment
    generic_isa, generic = _run(**target_environment("generic"))
    assert portable_isa == "portable" and generic_isa == "portable"
    assert host == portable == generic
    if _host_has("avx2") and _host_has("fma"):
        avx2_isa, avx2 = _run(**target_environment("haswell"))
        assert avx2_isa == "avx2"
        assert avx2 == host
    else:
        pytest.skip("host cannot execute AVX2 code: the haswell target was not run "
                    f"(host, portable and generic agree; host kernels: {host_isa})")


def test_machine_policy_follows_numbas_target(monkeypatch):
    """The policy describes what numba compiles for: NUMBA_CPU_FEATURES when set, else the
    host's features (numba keeps them even with a NUMBA_CPU_NAME)."""
    from numba.core import config

    from hmath_dl._kernels import _cpu
    if _cpu._arch() != "x86_64":
        pytest.skip("x86 feature strings")
    for level, isa, lanes, regs in [("haswell", "avx2", 4, 16), ("generic", "portable", 2, 16)]:
        env = _cpu.target_environment(level)
        monkeypatch.setattr(config, "CPU_NAME", env["NUMBA_CPU_NAME"], raising=False)
        monkeypatch.setattr(config, "CPU_FEATURES", env["NUMBA_CPU_FEATURES"], raising=False)
        m = _cpu._read(False)
        assert (m.isa, m.f64_lanes, m.vector_registers) == (isa, lanes, regs), level
        assert not m.avx512_vnni and not m.has("avx512f")
        assert _cpu._read(True).isa == "portable" and _cpu._read(True).tiled is False
    monkeypatch.setattr(config, "CPU_NAME", "some-future-cpu", raising=False)
    monkeypatch.setattr(config, "CPU_FEATURES", None, raising=False)
    assert _cpu._read(False).features == _cpu._host_features()
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx,+avx2,+fma,-avx512f", raising=False)
    assert _cpu._read(False).isa == "avx2"
    monkeypatch.setattr(config, "CPU_FEATURES", "+sse2,-avx2", raising=False)
    assert _cpu._read(False).isa == "portable"
    with pytest.raises(ValueError, match="unknown target level"):
        _cpu.target_environment("pentium")


_GENERIC_ALONE = textwrap.dedent("""
    import hashlib
    import numpy as np
    import hmath_dl.precision as P
    from hmath_dl._kernels import _cpu

    g = np.random.default_rng(3)
    qa = P.quantize(P.Quantization.SYMMETRIC, 0, g.standard_normal((9, 64)))
    qb = P.quantize(P.Quantization.SYMMETRIC, 1, g.standard_normal((64, 5)))
    qc = P.quantize(P.Quantization.SYMMETRIC, 1, g.standard_normal((64, 40)))
    out = [P.int8_gemm(qa, qb), P.int8_gemm(qa, qc),
           P.reduced_gemm(P.Precision.FP16, g.standard_normal((3, 50)),
                          g.standard_normal((50, 7)))]
    m = _cpu.machine()
    print(m.isa, len(m.features),
          hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in out)).hexdigest())
""")


def test_numba_cpu_name_generic_alone_compiles_for_baseline_x86_64():
    """``NUMBA_CPU_NAME=generic`` without ``NUMBA_CPU_FEATURES``: numba compiles for
    baseline x86-64 (its default feature string for that name is empty, not the host's),
    and the policy must say so.  It once read the empty string as "unset", took the host's
    AVX-512 and emitted 512-bit intrinsics that LLVM cannot select for that target: the
    process aborted in the int8 GEMM.  The results are the host's bits."""
    from hmath_dl._kernels import _cpu
    if _cpu._arch() != "x86_64":
        pytest.skip("x86 target names")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "HMATH_DL_KERNELS")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["NUMBA_CPU_NAME"] = "generic"
    out = subprocess.run([sys.executable, "-c", _GENERIC_ALONE], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-4000:]
    isa, nfeat, digest = out.stdout.split()
    assert (isa, nfeat) == ("portable", "0")
    host = {}
    exec(_GENERIC_ALONE.replace("print(", "host['r'] = ("), {"host": host})
    assert host["r"][2] == digest


def test_policy_reads_numbas_empty_feature_string_for_generic(monkeypatch):
    """numba's ``config.CPU_FEATURES`` is ``""`` for ``NUMBA_CPU_NAME=generic`` alone: no
    features at all, which the policy describes as the portable target."""
    from numba.core import config

    from hmath_dl._kernels import _cpu
    monkeypatch.setattr(config, "CPU_NAME", "generic", raising=False)
    monkeypatch.setattr(config, "CPU_FEATURES", "", raising=False)
    m = _cpu._read(False)
    assert m.features == frozenset() and m.isa == "portable" and m.f64_lanes == 2


def test_a_cpu_name_alone_that_keeps_wider_host_features_is_announced():
    """``NUMBA_CPU_NAME=haswell`` alone on an AVX-512 host compiles AVX-512 kernels (numba
    keeps the host's features): the policy says so once on stderr, naming the variables
    that give haswell code; nothing is said when the features are given, the name is not
    a level the package knows, or the host has nothing beyond the level."""
    from hmath_dl._kernels._cpu import Machine, named_target_note

    def m(cpu, source, *feats):
        return Machine(arch="x86_64", cpu=cpu, source=source, features=frozenset(feats),
                       portable=False)

    note = named_target_note(m("haswell", "NUMBA_CPU_NAME", "avx2", "fma", "avx512f"))
    assert "avx512f" in note and "--env haswell" in note and "HMATH_DL_QUIET" in note
    assert named_target_note(m("haswell", "NUMBA_CPU_NAME + NUMBA_CPU_FEATURES",
                               "avx2", "fma", "avx512f")) is None
    assert named_target_note(m("haswell", "NUMBA_CPU_NAME", "avx2", "fma")) is None
    assert named_target_note(m("znver4", "NUMBA_CPU_NAME", "avx2", "fma", "avx512f")) is None
    assert named_target_note(m("znver4", "host", "avx2", "fma", "avx512f")) is None
    assert named_target_note(m("generic", "NUMBA_CPU_NAME")) is None
    if not _host_has("avx512f"):
        pytest.skip("host without AVX-512: NUMBA_CPU_NAME=haswell alone is haswell code here")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "HMATH_DL_QUIET")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["NUMBA_CPU_NAME"] = "haswell"
    code = "import hmath_dl.precision, hmath_dl.layers"
    said = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert said.returncode == 0 and said.stderr.count("NUMBA_CPU_NAME=haswell without") == 1
    quiet = subprocess.run([sys.executable, "-c", code], env=dict(env, HMATH_DL_QUIET="1"),
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and "NUMBA_CPU_NAME" not in quiet.stderr
