"""The foundation: errors, RNG, argument checks, import behaviour."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from hmath_dl import _checks
from hmath_dl.errors import (
    CapacityError, DomainError, IndexOutOfRange, MathError, NonFiniteError,
    NumericOverflow, ShapeError,
)
from hmath_dl.rng import RNG
from tests.helpers import ROOT


# ------------------------------------------------------------------ errors
def test_error_hierarchy_matches_contract():
    assert issubclass(ShapeError, MathError) and issubclass(ShapeError, ValueError)
    assert issubclass(DomainError, MathError) and issubclass(DomainError, ValueError)
    assert issubclass(NonFiniteError, MathError) and issubclass(NonFiniteError, ValueError)
    assert issubclass(NumericOverflow, MathError) and issubclass(NumericOverflow, ArithmeticError)
    assert issubclass(IndexOutOfRange, MathError) and issubclass(IndexOutOfRange, IndexError)
    assert issubclass(CapacityError, MathError)
    assert not issubclass(CapacityError, (ValueError, IndexError))
    # IndexOutOfRange is the only IndexError
    for cls in (ShapeError, DomainError, NonFiniteError, NumericOverflow, CapacityError):
        assert not issubclass(cls, IndexError)


# ------------------------------------------------------------------ RNG
def test_rng_from_seed_matches_seedsequence_and_is_frozen():
    rng = RNG.from_seed(42)
    words = np.random.SeedSequence(42).generate_state(2, dtype=np.uint64)
    assert rng.key == int(words[0]) + (int(words[1]) << 64)
    assert rng.counter == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        rng.key = 1


def test_rng_stream_is_numpy_philox():
    rng = RNG(key=12345, counter=7)
    got = rng.generator().standard_normal(5)
    want = np.random.Generator(np.random.Philox(key=12345, counter=7)).standard_normal(5)
    assert np.array_equal(got, want)


def test_rng_draw_is_pure_and_advances():
    rng = RNG.from_seed(3)
    a, r1 = rng.draw(lambda g: g.random(10))
    b, r2 = rng.draw(lambda g: g.random(10))
    assert np.array_equal(a, b) and r1 == r2 and r1 != rng
    c, r3 = r1.draw(lambda g: g.random(10))
    assert not np.array_equal(a, c)
    # the advanced state never replays values already produced
    everything = rng.generator().random(10_000)
    assert not np.isin(c, everything[:10]).any()
    assert r3.counter > r1.counter


def test_rng_validation():
    with pytest.raises(DomainError, match="^RNG"):
        RNG(key=-1)
    with pytest.raises(DomainError, match="^RNG"):
        RNG(key=1 << 128)
    with pytest.raises(DomainError, match="^RNG"):
        RNG(key=0, counter=1 << 256)
    with pytest.raises(TypeError, match="^RNG"):
        RNG(key=1.5)
    with pytest.raises(TypeError, match="^RNG"):
        RNG(key=True)
    with pytest.raises(DomainError, match="^RNG.from_seed"):
        RNG.from_seed(-3)
    with pytest.raises(TypeError, match="^RNG.from_seed"):
        RNG.from_seed("7")
    assert RNG(key=np.uint64(5), counter=np.int8(2)) == RNG(key=5, counter=2)


def test_rng_counter_near_limit_wraps_like_philox():
    rng = RNG(key=9, counter=(1 << 256) - 1)
    values, nxt = rng.draw(lambda g: g.random(8))
    assert 0 <= nxt.counter < (1 << 256)


# ------------------------------------------------------------------ _checks
def test_tensor_conversion_and_views():
    x = np.arange(6.0).reshape(2, 3)
    assert _checks.tensor("f", "x", x) is x  # no copy when already fine
    xt = _checks.tensor("f", "x", x.T)
    assert xt.flags.c_contiguous and np.array_equal(xt, x.T)
    assert _checks.tensor("f", "x", [[1, 2], [3, 4]]).dtype == np.float64
    assert np.array_equal(_checks.tensor("f", "x", np.float32([1.5])), [1.5])


@pytest.mark.parametrize("bad, err", [
    ([1.0, np.nan], NonFiniteError),
    ([np.inf], NonFiniteError),
    (np.zeros((2, 2)), ShapeError),      # wrong rank for ndim=1
    (["a", "b"], TypeError),
    ([1 + 2j], TypeError),
    ([[1.0], [1.0, 2.0]], TypeError),    # ragged
])
def test_tensor_rejections(bad, err):
    with pytest.raises(err, match="^fn: x"):
        _checks.tensor("fn", "x", bad, ndim=1)


def test_nonfinite_detection_large_array_uses_kernel_and_names_index():
    x = np.zeros(200_000)
    assert _checks.is_finite(x)
    x[123_456] = -np.inf
    assert not _checks.is_finite(x)
    with pytest.raises(NonFiniteError, match=r"index \(123456,\)"):
        _checks.require_finite("fn", "x", x)
    y = np.full(100_000, 1e308)
    assert _checks.is_finite(y)  # large finite values are not mistaken for inf


def test_all_finite_kernel_against_numpy_on_every_kind_of_non_finite_pattern():
    """The exponent-field scan agrees with np.isfinite for NaN (quiet, signalling,
    negative, any payload) and +-inf at chunk boundaries and elsewhere, and never flags
    the largest finite numbers, subnormals or signed zeros."""
    from hmath_dl._kernels.checks import _CHUNK, all_finite
    g = np.random.default_rng(3)
    base = g.standard_normal(3 * _CHUNK + 17)
    base[:4] = [np.finfo(np.float64).max, -np.finfo(np.float64).max, 5e-324, -0.0]
    assert all_finite(base)
    specials = np.array([0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
                         0xFFF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF,
                         0xFFF4000000000000], dtype=np.uint64).view(np.float64)
    for pos in (0, 1, _CHUNK - 1, _CHUNK, 2 * _CHUNK + 5, base.size - 1):
        for v in specials:
            a = base.copy()
            a[pos] = v
            assert all_finite(a) == bool(np.isfinite(a).all()) == False  # noqa: E712
    assert all_finite(np.zeros(0))


def test_scalar_checks():
    assert _checks.integer("f", "n", np.int32(4), min=1) == 4
    with pytest.raises(TypeError):
        _checks.integer("f", "n", 2.0)
    with pytest.raises(TypeError):
        _checks.integer("f", "n", True)
    with pytest.raises(DomainError, match="^f: n must be >= 1"):
        _checks.integer("f", "n", 0, min=1)
    assert _checks.real("f", "p", 1) == 1.0
    with pytest.raises(DomainError):
        _checks.real("f", "p", float("nan"))
    with pytest.raises(NonFiniteError):
        _checks.real("f", "loss", float("inf"), nonfinite_error=NonFiniteError)
    with pytest.raises(DomainError):
        _checks.real("f", "eps", 0.0, positive=True)
    with pytest.raises(TypeError):
        _checks.real("f", "eps", "1")
    assert _checks.axis("f", "axis", -1, 3) == 2
    with pytest.raises(DomainError):
        _checks.axis("f", "axis", 3, 3)
    assert _checks.int_tuple("f", "stride", 2, 3) == (2, 2, 2)
    with pytest.raises(ShapeError):
        _checks.int_tuple("f", "stride", (1, 2), 3)
    with pytest.raises(TypeError):
        _checks.int_tuple("f", "stride", "12", 2)


def test_int_and_bool_arrays():
    assert _checks.int_array("f", "i", [1, 2]).dtype == np.int64
    with pytest.raises(TypeError):
        _checks.int_array("f", "i", [1.0, 2.0])
    with pytest.raises(TypeError):
        _checks.int_array("f", "i", [True])
    assert _checks.bool_array("f", "m", [1, 0]).dtype == np.bool_
    with pytest.raises(DomainError):
        _checks.bool_array("f", "m", [2, 0])
    with pytest.raises(TypeError):
        _checks.bool_array("f", "m", [0.5])


def test_alloc_guard_refuses_absurd_outputs_before_allocating():
    with pytest.raises(ShapeError, match="^conv: output of shape"):
        _checks.alloc("conv", (1 << 20, 1 << 20, 1 << 10))
    out = _checks.alloc("f", (2, 3), zero=True)
    assert out.shape == (2, 3) and not out.any()


# ------------------------------------------------------------------ import
def test_import_compiles_nothing_and_is_quick():
    code = (
        "import sys, time; t=time.perf_counter(); import hmath_dl; "
        "import hmath_dl.precision, hmath_dl.layers, hmath_dl.activations; "
        "from numba.core.registry import CPUDispatcher; import gc; "
        "n = sum(len(o.overloads) for o in gc.get_objects() if isinstance(o, CPUDispatcher)); "
        "print(n)"
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


def test_an_openmp_runtime_loaded_first_changes_nothing():
    """With libgomp already loaded (as `import torch` does) the import says nothing and
    the kernels run on the same threading layer as without it (issue 13: import order
    does not matter; the old advice to set OMP_WAIT_POLICY is gone)."""
    import ctypes.util
    if ctypes.util.find_library("gomp") is None:
        pytest.skip("no libgomp on this system")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",
                                                             "NUMBA_THREADING_LAYER")}
    env["PYTHONPATH"] = ROOT
    probe = ("; import warnings; warnings.simplefilter('error'); import numpy as np; "
             "import hmath_dl; from hmath_dl import _threads, layers as L; "
             "L.layer_norm(1, 1e-5, np.ones((256, 2048))); print(_threads.threading_layer())")

    def run(code):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "Warning" not in out.stderr, out.stderr
        return out.stdout

    gomp_first = "import ctypes, ctypes.util; ctypes.CDLL(ctypes.util.find_library('gomp'))"
    assert run(gomp_first + probe) == run("import sys" + probe)
