"""Every int8 GEMM path (vnni, pmaddwd, skinny, portable) gives the portable path's bytes,
refuses exactly the int32 overflows of the contract, and the AVX2 compilation (a
``NUMBA_CPU_NAME=haswell`` child) gives the host's bytes."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hmath_dl.errors import NumericOverflow
from hmath_dl.precision import Quantization, QuantizedTensor, int8_gemm, quantize
from hmath_dl.precision import quantization as qmod

SYM = Quantization.SYMMETRIC
ASYM = Quantization.ASYMMETRIC
PATHS = qmod.gemm_paths()

def _gemm(path, a, b):
    with qmod.forced_gemm_path(path):
        return int8_gemm(a, b)


def test_plan_and_switch():
    assert PATHS[-1] == "portable"
    assert qmod.gemm_path(1024, 1024, 1024) in PATHS
    with pytest.raises(ValueError):
        with qmod.forced_gemm_path("nope"):
            pass
    for p in PATHS:
        with qmod.forced_gemm_path(p):
            assert qmod.gemm_path(5, 5, 5) == p
    if "skinny" in PATHS:
        assert qmod.gemm_path(1, 4096, 4096) == "skinny"
        assert qmod.gemm_path(4096, 4096, 3) == "skinny"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("n", [1, 3, 17])
def test_paths_bit_equal_small(path, m, n):
    rng = np.random.default_rng(m * 100 + n)
    for k in (1, 2, 7, 33, 131):
        for modes in ((SYM, 0, ASYM, 1), (ASYM, None, ASYM, None), (ASYM, 0, SYM, 1)):
            a = quantize(modes[0], modes[1], rng.standard_normal((m, k)) + 0.4)
            b = quantize(modes[2], modes[3], rng.standard_normal((k, n)) - 0.3)
            assert _gemm(path, a, b).tobytes() == _gemm("portable", a, b).tobytes()


@pytest.mark.parametrize("path", PATHS)
def test_paths_bit_equal_ragged(path):
    # K not a multiple of any tile, chunk or pair; M, N not multiples of any tile
    rng = np.random.default_rng(7)
    for (m, k, n) in ((19, 1001, 67), (5, 4099, 131), (130, 515, 18), (97, 64, 200)):
        a = quantize(ASYM, 0, rng.standard_normal((m, k)) * 3 + 1)
        b = quantize(ASYM, 1, rng.standard_normal((k, n)) - 0.5)
        assert _gemm(path, a, b).tobytes() == _gemm("portable", a, b).tobytes()


def _boundary(total, k, m=3, n=17):
    """Asymmetric operands (per row / per column, zero points -128) whose only non-zero
    terms sit in acc[m-1, n-1], in its last ``t`` terms: ``t - 2`` terms of 255 * 255
    and two more chosen so that the exact accumulator is ``total`` (the first ``k - t``
    terms are 0)."""
    t = total // (255 * 255)
    rest = total - (t - 2) * 255 * 255
    while rest > 255 * 255 + 255:
        t += 1
        rest -= 255 * 255
    y1 = min(255, rest // 255)
    x2 = rest - 255 * y1
    assert 0 <= x2 <= 255 and k >= t
    va = np.full((m, k), -128, dtype=np.int8)
    vb = np.full((k, n), -128, dtype=np.int8)
    va[-1, k - t:] = 127
    vb[k - t:, -1] = 127
    va[-1, -2], vb[-2, -1] = 127, y1 - 128
    va[-1, -1], vb[-1, -1] = x2 - 128, 1 - 128
    za = np.full(m, -128, dtype=np.int64)
    zb = np.full(n, -128, dtype=np.int64)
    a = QuantizedTensor(ASYM, 0, va, np.ones(m), za)
    b = QuantizedTensor(ASYM, 1, vb, np.ones(n), zb)
    return a, b


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k", [33027, 65541])     # one int32 chunk; several
@pytest.mark.parametrize("shape", [(3, 17), (1, 3), (17, 1)])
def test_int32_boundary_every_path(path, k, shape):
    m, n = shape
    top = 2 ** 31 - 1
    a, b = _boundary(top, k, m, n)
    out = _gemm(path, a, b)
    assert out[m - 1, n - 1] == float(top) and np.count_nonzero(out) == 1
    a, b = _boundary(top + 1, k, m, n)
    with pytest.raises(NumericOverflow, match=r"int8_gemm: the exact integer accumulator "
                       rf"at \(i, j\) = \({m - 1}, {n - 1}\) is {top + 1}"):
        _gemm(path, a, b)


def test_int32_boundary_long_k_symmetric():
    # K > 65536 terms of 127 * 127: the int64 combination of several int32 chunks
    k = 133145
    vals = np.full(k, 127, dtype=np.int8)
    vals[-1] = 59
    vb = vals.copy()
    vb[-1] = 69                         # 133144 * 16129 + 59 * 69 = 2**31 - 1
    a = QuantizedTensor(SYM, None, vals.reshape(1, k).copy(), np.ones(1), np.zeros(1, np.int64))
    b = QuantizedTensor(SYM, None, vb.reshape(k, 1).copy(), np.ones(1), np.zeros(1, np.int64))
    b2 = np.tile(vb.reshape(k, 1), (1, 20))
    b2 = QuantizedTensor(SYM, None, b2, np.ones(1), np.zeros(1, np.int64))
    a2 = QuantizedTensor(SYM, None, np.tile(vals.reshape(1, k), (7, 1)), np.ones(1),
                         np.zeros(1, np.int64))
    for p in PATHS:
        assert _gemm(p, a, b)[0, 0] == 2 ** 31 - 1
        assert np.all(_gemm(p, a2, b2) == 2 ** 31 - 1)
    vb[-1] = 70                          # + 59: 2**31 + 58
    b = QuantizedTensor(SYM, None, vb.reshape(k, 1).copy(), np.ones(1), np.zeros(1, np.int64))
    for p in PATHS:
        with pytest.raises(NumericOverflow):
            _gemm(p, a, b)


_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from hmath_dl.precision import quantize, Quantization as Q, int8_gemm
    from hmath_dl.precision import quantization as qm
    from hmath_dl._kernels import _cpu
    import os
    want = {"haswell": "avx2", "generic": "portable"}.get(os.environ.get("EXPECT_LEVEL"))
    assert want is None or _cpu.machine().isa == want, _cpu.describe()
    rng = np.random.default_rng(3)
    for (m, k, n) in ((1, 1001, 300), (3, 77, 17), (17, 130, 3), (40, 515, 70)):
        a = quantize(Q.ASYMMETRIC, 0, rng.standard_normal((m, k)) + 0.2)
        b = quantize(Q.ASYMMETRIC, 1, rng.standard_normal((k, n)) - 0.1)
        with qm.forced_gemm_path("portable"):
            want = int8_gemm(a, b).tobytes()
        for p in qm.gemm_paths():
            with qm.forced_gemm_path(p):
                assert int8_gemm(a, b).tobytes() == want, (p, m, k, n)
        sys.stdout.buffer.write(want)
""")


def _host_bytes():
    rng = np.random.default_rng(3)
    out = b""
    for (m, k, n) in ((1, 1001, 300), (3, 77, 17), (17, 130, 3), (40, 515, 70)):
        a = quantize(ASYM, 0, rng.standard_normal((m, k)) + 0.2)
        b = quantize(ASYM, 1, rng.standard_normal((k, n)) - 0.1)
        want = _gemm("portable", a, b).tobytes()
        out += want                  # the child checks each of its paths against it
    return out


@pytest.mark.parametrize("level", [None, "haswell", "generic"],
                         ids=["name-only", "haswell", "generic"])
def test_avx2_child_matches_host(level):
    """Compiled for the host's features under the name haswell, for AVX2 (haswell's
    features: 16 ymm registers) and for baseline x86-64: the host's bytes."""
    from hmath_dl._kernels import _cpu
    if level != "generic" and not _cpu._host_features() >= {"avx2", "fma"}:
        pytest.skip("the host cannot run AVX2 code")
    env = dict(os.environ)
    for k in ("HMATH_DL_KERNELS", "HMATH_DL_INT8_KERNEL", "NUMBA_CPU_FEATURES"):
        env.pop(k, None)
    if level is None:
        env["NUMBA_CPU_NAME"] = "haswell"       # numba keeps the host's features
    else:
        env.update(_cpu.target_environment(level), EXPECT_LEVEL=level)
    res = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         timeout=600)
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    assert res.stdout == _host_bytes()
