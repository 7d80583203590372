"""INT8 quantization and the exact int8 GEMM (API.md §3 "INT8 quantization")."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from hmath_dl.errors import DomainError, NonFiniteError, NumericOverflow, ShapeError
from hmath_dl.precision import (
    Quantization,
    QuantizedTensor,
    dequantize,
    int8_gemm,
    quantization_scales,
    quantization_zero_points,
    quantize,
    quantized_values,
)
from hmath_dl.precision import quantization as qmod
from tests import helpers
from tests.reference import quantization as ref

SYM = Quantization.SYMMETRIC
ASYM = Quantization.ASYMMETRIC
TINY = ref.TINY

# Both GEMM kernels are exercised: the VNNI one only where the CPU has it.
# Every GEMM path this machine runs is exercised (tests/test_gemm_paths.py holds them to
# the portable path's bytes); the fixture forces one through the facade's switch.
KERNELS = [pytest.param(p, id=p) for p in qmod.gemm_paths()]


@pytest.fixture(params=KERNELS)
def kernel(request):
    with qmod.forced_gemm_path(request.param):
        yield request.param


def _raises(exc, fname, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(fname + ":"), str(info.value)
    return info.value


def _check_against_oracle(mode, axis, x):
    x = np.asarray(x, dtype=np.float64)
    norm_axis = None if axis is None else axis % x.ndim
    try:
        want = ref.quantize(mode is SYM, norm_axis, x)
    except ref.Overflow:
        _raises(NumericOverflow, "quantize", quantize, mode, axis, x)
        return None
    q = quantize(mode, axis, x)
    values, scales, zps = want
    got_v = quantized_values(q)
    assert got_v.dtype == np.int8 and got_v.shape == x.shape
    np.testing.assert_array_equal(got_v, values)
    got_s = quantization_scales(q)
    assert got_s.dtype == np.float64
    assert got_s.tobytes() == scales.tobytes()
    got_z = quantization_zero_points(q)
    assert got_z.dtype == np.int64
    np.testing.assert_array_equal(got_z, zps)
    assert q.shape == x.shape and q.axis == norm_axis and q.mode is mode
    return q


# --------------------------------------------------------------------------- quantize
_floats = st.one_of(
    st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 0.5, -2.5, 1.5, 127.0, -127.0, 1e-300]),
)


@st.composite
def _tensor_and_axis(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=5))
    x = draw(hnp.arrays(np.float64, shape, elements=_floats))
    if x.ndim == 0:
        axis = None
    else:
        axis = draw(st.one_of(st.none(), st.integers(-x.ndim, x.ndim - 1)))
    return x, axis


@given(xa=_tensor_and_axis(), mode=st.sampled_from([SYM, ASYM]))
def test_quantize_matches_oracle(xa, mode):
    x, axis = xa
    q = _check_against_oracle(mode, axis, x)
    if q is not None:
        want = ref.dequantize(quantized_values(q), quantization_scales(q),
                              quantization_zero_points(q), q.axis)
        got = dequantize(q)
        assert got.dtype == np.float64 and got.flags.c_contiguous
        assert got.tobytes() == want.tobytes()


@settings(max_examples=15)
@given(seed=st.integers(0, 2 ** 32 - 1), mode=st.sampled_from([SYM, ASYM]))
def test_quantize_large_random_every_axis(seed, mode):
    # sizes beyond one parallel chunk, so channel bookkeeping across chunks is exercised
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 41, 97)) * rng.uniform(0.1, 10.0) + rng.uniform(-1, 1)
    for axis in (None, 0, 1, 2, -1):
        norm = None if axis is None else axis % 3
        values, scales, zps = _vectorised_reference(mode, norm, x)
        q = quantize(mode, axis, x)
        np.testing.assert_array_equal(quantized_values(q), values)
        assert quantization_scales(q).tobytes() == scales.tobytes()
        np.testing.assert_array_equal(quantization_zero_points(q), zps)


def _vectorised_reference(mode, axis, x):
    """numpy transcription of the formulas (checked against the loop oracle below)."""
    if axis is None:
        red = tuple(range(x.ndim))
    else:
        red = tuple(d for d in range(x.ndim) if d != axis)
    if mode is SYM:
        amax = np.abs(x).max(axis=red, keepdims=True)
        scale = np.where(amax == 0, 1.0, amax / 127.0)
        q = np.clip(np.rint(x / scale), -127, 127)
        zp = np.zeros_like(scale)
    else:
        lo = np.minimum(x.min(axis=red, keepdims=True), 0.0)
        hi = np.maximum(x.max(axis=red, keepdims=True), 0.0)
        scale = np.where((hi == 0) & (lo == 0), 1.0, (hi - lo) / 255.0)
        zp = np.clip(np.rint(-128.0 - lo / scale), -128, 127)
        q = np.clip(np.rint(x / scale) + zp, -128, 127)
    return q.astype(np.int8), scale.reshape(-1), zp.reshape(-1).astype(np.int64)


def test_vectorised_reference_agrees_with_loop_oracle():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 5))
    x[1] = 0.0
    for mode in (SYM, ASYM):
        for axis in (None, 0, 1, 2):
            a = _vectorised_reference(mode, axis, x)
            b = ref.quantize(mode is SYM, axis, x)
            for u, v in zip(a, b):
                assert u.tobytes() == v.tobytes()


def test_symmetric_ties_round_half_to_even():
    # amax = 127 -> scale exactly 1.0, so q = rne(x)
    x = [127.0, 2.5, 3.5, -2.5, 0.5, -0.5, 1.5, 126.5, -127.0]
    q = quantize(SYM, None, x)
    assert quantization_scales(q).tolist() == [1.0]
    assert quantization_zero_points(q).tolist() == [0]
    assert quantized_values(q).tolist() == [127, 2, 4, -2, 0, 0, 2, 126, -127]


def test_asymmetric_ties_and_zero_point():
    # lo = 0, hi = 255 -> scale 1.0, zp = rne(-128 - 0) = -128, q = rne(x) - 128
    x = [0.0, 2.5, 3.5, 255.0, 0.5, 254.5]
    q = quantize(ASYM, None, x)
    assert quantization_scales(q).tolist() == [1.0]
    assert quantization_zero_points(q).tolist() == [-128]
    assert quantized_values(q).tolist() == [-128, -126, -124, 127, -128, 126]
    # lo = -1, hi = 3: scale = 4/255, zp = rne(-128 + 63.75) = -64;
    # q(-1) = rne(-63.75) - 64 = -128, q(3) = rne(191.25) - 64 = 127, q(0) = -64
    q = quantize(ASYM, None, [-1.0, 3.0, 0.0])
    assert quantization_scales(q).tolist() == [4.0 / 255.0]
    assert quantization_zero_points(q).tolist() == [-64]
    assert quantized_values(q).tolist() == [-128, 127, -64]
    # only negative values: hi = 0, lo = -255 -> scale 1, zp = rne(-128 + 255) = 127
    q = quantize(ASYM, None, [-255.0, -1.0])
    assert quantization_zero_points(q).tolist() == [127]
    assert quantized_values(q).tolist() == [-128, 126]


def test_all_zero_slices():
    x = np.array([[0.0, 0.0, -0.0], [1.0, -2.0, 0.5]])
    qs = quantize(SYM, 0, x)
    assert quantization_scales(qs)[0] == 1.0
    assert quantized_values(qs)[0].tolist() == [0, 0, 0]
    qa = quantize(ASYM, 0, x)
    assert quantization_scales(qa)[0] == 1.0
    assert quantization_zero_points(qa)[0] == -128
    assert quantized_values(qa)[0].tolist() == [-128, -128, -128]
    for q in (qs, qa):
        d = dequantize(q)
        assert d[0].tolist() == [0.0, 0.0, 0.0]
    for mode in (SYM, ASYM):
        q = quantize(mode, None, np.zeros((2, 3)))
        assert quantization_scales(q).tolist() == [1.0]
        np.testing.assert_array_equal(dequantize(q), np.zeros((2, 3)))


def test_scalar_input_per_tensor():
    q = quantize(SYM, None, 3.0)
    assert q.shape == () and quantized_values(q).shape == ()
    assert int(quantized_values(q)) == 127
    assert dequantize(q).shape == ()
    assert float(dequantize(q)) == (3.0 / 127.0) * 127
    _raises(DomainError, "quantize", quantize, SYM, 0, 3.0)


def test_negative_axis_equals_positive_axis():
    x = np.random.default_rng(2).standard_normal((3, 4, 5))
    for mode in (SYM, ASYM):
        for axis in range(-3, 3):
            assert quantize(mode, axis, x) == quantize(mode, axis % 3, x)
            assert quantize(mode, axis, x).axis == axis % 3


def test_scale_boundary_smallest_normal():
    # symmetric: scale = amax / 127 must be >= the smallest normal double
    for amax in (TINY * 127, np.nextafter(TINY * 127, 0.0), TINY * 200, TINY, 5e-324):
        _check_against_oracle(SYM, None, [amax, 0.0])
        _check_against_oracle(ASYM, None, [amax, 0.0])
    _raises(NumericOverflow, "quantize", quantize, SYM, None, [1e-310])
    _raises(NumericOverflow, "quantize", quantize, ASYM, None, [1e-306])
    err = _raises(NumericOverflow, "quantize", quantize, SYM, 0, [[1.0], [1e-307], [2.0]])
    assert "slice 1" in str(err)


def test_scale_overflow_non_finite():
    err = _raises(NumericOverflow, "quantize", quantize, ASYM, None, [-1e308, 1e308])
    assert "inf" in str(err)
    # symmetric never overflows: amax / 127 is finite
    q = quantize(SYM, None, [-1.7e308, 1.7e308])
    assert quantized_values(q).tolist() == [-127, 127]


def test_quantize_errors():
    x = np.ones((2, 3))
    _raises(TypeError, "quantize", quantize, "SYMMETRIC", None, x)
    _raises(TypeError, "quantize", quantize, None, None, x)
    _raises(TypeError, "quantize", quantize, SYM, 1.0, x)
    _raises(TypeError, "quantize", quantize, SYM, True, x)
    _raises(TypeError, "quantize", quantize, SYM, "0", x)
    _raises(DomainError, "quantize", quantize, SYM, 2, x)
    _raises(DomainError, "quantize", quantize, SYM, -3, x)
    _raises(ShapeError, "quantize", quantize, SYM, None, [])
    _raises(ShapeError, "quantize", quantize, ASYM, 0, np.zeros((0, 3)))
    _raises(NonFiniteError, "quantize", quantize, SYM, None, [1.0, np.nan])
    _raises(NonFiniteError, "quantize", quantize, ASYM, 0, [[1.0, np.inf]])
    _raises(NonFiniteError, "quantize", quantize, SYM, None, [-np.inf])
    _raises(TypeError, "quantize", quantize, SYM, None, ["a", "b"])
    _raises(TypeError, "quantize", quantize, SYM, None, [1.0 + 2.0j])


def test_quantize_input_forms_and_no_mutation():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6))
    before = helpers.frozen_copy(x)
    for mode in (SYM, ASYM):
        for axis in (None, 0, 1):
            base = quantize(mode, axis, x)
            assert quantize(mode, axis, x.tolist()) == base
            assert quantize(mode, axis, helpers.noncontiguous(x)) == base
            assert quantize(mode, axis, helpers.readonly(x)) == base
            assert quantize(mode, axis, np.asfortranarray(x)) == base
    np.testing.assert_array_equal(x, before[0])
    # integer and float32 inputs are converted
    q = quantize(SYM, None, np.array([[1, -2], [3, 127]], dtype=np.int32))
    assert quantized_values(q).tolist() == [[1, -2], [3, 127]]
    x32 = rng.standard_normal(7).astype(np.float32)
    assert quantize(ASYM, None, x32) == quantize(ASYM, None, x32.astype(np.float64))


# --------------------------------------------------------------------------- QuantizedTensor
def test_quantized_tensor_properties_and_readonly_state():
    x = np.random.default_rng(4).standard_normal((3, 5))
    q = quantize(ASYM, -1, x)
    assert q.shape == (3, 5) and isinstance(q.shape, tuple)
    assert q.axis == 1 and q.mode is ASYM
    for arr in (quantized_values(q), quantization_scales(q), quantization_zero_points(q)):
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[...] = 0
    assert quantization_scales(q).shape == (5,)
    assert quantization_zero_points(q).shape == (5,)
    assert quantization_scales(quantize(SYM, None, x)).shape == (1,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.axis = 0
    with pytest.raises(AttributeError):
        q.shape = (5, 3)


def test_quantized_tensor_equality_hash_repr():
    x = np.random.default_rng(6).standard_normal((40, 50))
    a = quantize(SYM, 0, x)
    b = quantize(SYM, 0, x.copy())
    assert a == b and hash(a) == hash(b)
    assert a != quantize(SYM, 1, x)
    assert a != quantize(ASYM, 0, x)
    assert a != quantize(SYM, 0, x * 2.0 + 1.0)
    assert a != quantize(SYM, 0, x[:39])
    assert (a == "not a tensor") is False
    assert len({a, b}) == 1
    r = repr(a)
    assert r.startswith("QuantizedTensor(") and "SYMMETRIC" in r and "(40, 50)" in r
    assert len(r) < 300


def test_quantized_tensor_pickle_and_copy_keep_invariants():
    import copy
    import pickle
    q = quantize(ASYM, 0, np.random.default_rng(13).standard_normal((4, 3)))
    for r in (pickle.loads(pickle.dumps(q)), copy.deepcopy(q), copy.copy(q)):
        assert r == q
        for arr in (quantized_values(r), quantization_scales(r), quantization_zero_points(r)):
            assert not arr.flags.writeable


def test_quantized_tensor_constructor_rejects_invalid_state():
    ok = (np.zeros((2, 2), np.int8), np.ones(1), np.zeros(1, np.int64))
    q = QuantizedTensor(SYM, None, *ok)
    assert q == quantize(SYM, None, np.zeros((2, 2)))
    assert not quantized_values(q).flags.writeable
    ok[0][0, 0] = 5  # the tensor holds its own copy
    assert int(quantized_values(q)[0, 0]) == 0
    bad = [
        (TypeError, ("SYM", None) + ok),
        (TypeError, (SYM, None, np.zeros((2, 2), np.int16)) + ok[1:]),
        (DomainError, (SYM, 2) + ok),
        (DomainError, (SYM, True) + ok),
        (ShapeError, (SYM, 0) + ok),
        (ShapeError, (SYM, None, ok[0], np.ones(1, np.float32), ok[2])),
        (ShapeError, (SYM, None, ok[0], ok[1], np.zeros(1, np.int32))),
        (DomainError, (SYM, None, ok[0], np.zeros(1), ok[2])),
        (DomainError, (SYM, None, ok[0], np.full(1, np.inf), ok[2])),
        (DomainError, (SYM, None, ok[0], ok[1], np.ones(1, np.int64))),
        (DomainError, (SYM, None, np.full((2, 2), -128, np.int8)) + ok[1:]),
        (DomainError, (ASYM, None, ok[0], ok[1], np.full(1, 200, np.int64))),
        (ShapeError, (SYM, None, np.zeros((0,), np.int8)) + ok[1:]),
    ]
    for exc, args in bad:
        _raises(exc, "QuantizedTensor", QuantizedTensor, *args)


def test_accessor_and_dequantize_type_errors():
    for fn, fname in ((quantized_values, "quantized_values"),
                      (quantization_scales, "quantization_scales"),
                      (quantization_zero_points, "quantization_zero_points"),
                      (dequantize, "dequantize")):
        _raises(TypeError, fname, fn, np.zeros((2, 2)))
        _raises(TypeError, fname, fn, None)


def test_dequantize_overflow():
    q = QuantizedTensor(SYM, 0, np.array([[1, 2], [127, -127]], np.int8),
                        np.array([1.0, 1.7e308]), np.zeros(2, np.int64))
    err = _raises(NumericOverflow, "dequantize", dequantize, q)
    assert "(1, 0)" in str(err)


def test_dequantize_does_not_touch_tensor():
    x = np.random.default_rng(8).standard_normal((5, 4))
    q = quantize(ASYM, 1, x)
    copy = helpers.frozen_copy(quantized_values(q), quantization_scales(q),
                               quantization_zero_points(q))
    d1 = dequantize(q)
    d1[...] = 7.0  # the caller owns the output
    d2 = dequantize(q)
    assert not np.shares_memory(d1, d2)
    np.testing.assert_array_equal(quantized_values(q), copy[0])
    np.testing.assert_array_equal(quantization_scales(q), copy[1])
    np.testing.assert_array_equal(quantization_zero_points(q), copy[2])
    assert np.max(np.abs(d2 - x)) <= np.max(quantization_scales(q))


# --------------------------------------------------------------------------- int8_gemm
def _gemm_oracle(a, b):
    return ref.int8_gemm(quantized_values(a), quantization_scales(a),
                         quantization_zero_points(a), quantized_values(b),
                         quantization_scales(b), quantization_zero_points(b))


@pytest.mark.parametrize("use_vnni", [p.values[0] for p in KERNELS])
@given(m=st.integers(1, 11), k=st.integers(1, 40), n=st.integers(1, 37),
       mode_a=st.sampled_from([SYM, ASYM]), mode_b=st.sampled_from([SYM, ASYM]),
       axis_a=st.sampled_from([None, 0]), axis_b=st.sampled_from([None, 1, -1]),
       seed=st.integers(0, 2 ** 32 - 1))
def test_int8_gemm_matches_oracle(use_vnni, m, k, n, mode_a, mode_b, axis_a, axis_b, seed):
    rng = np.random.default_rng(seed)
    xa = rng.standard_normal((m, k)) * rng.uniform(0.01, 100) + rng.uniform(-2, 2)
    xb = rng.standard_normal((k, n)) + rng.uniform(-2, 2)
    if rng.uniform() < 0.3:
        xa[rng.integers(0, m)] = 0.0
    a = quantize(mode_a, axis_a, xa)
    b = quantize(mode_b, axis_b, xb)
    with qmod.forced_gemm_path(use_vnni):
        got = int8_gemm(a, b)
    want = _gemm_oracle(a, b)
    assert got.dtype == np.float64 and got.shape == (m, n) and got.flags.c_contiguous
    assert got.tobytes() == want.tobytes()


def test_int8_gemm_kernels_agree_on_larger_shapes(kernel):
    rng = np.random.default_rng(11)
    for (m, k, n) in ((33, 130, 65), (8, 4, 32), (9, 5, 33), (70, 257, 3)):
        xa = rng.standard_normal((m, k))
        xb = rng.standard_normal((k, n)) + 0.3
        a = quantize(ASYM, 0, xa)
        b = quantize(ASYM, 1, xb)
        qa = quantized_values(a).astype(np.int64) - quantization_zero_points(a)[:, None]
        qb = quantized_values(b).astype(np.int64) - quantization_zero_points(b)[None, :]
        acc = qa @ qb  # int64 numpy oracle (exact at these sizes)
        want = (quantization_scales(a)[:, None] * quantization_scales(b)[None, :]) * acc
        assert int8_gemm(a, b).tobytes() == want.tobytes()


def _exact_operands(a_tail, b_tail, fill, count, shape_m=2, shape_n=3):
    """Symmetric per-tensor operands whose scales are exactly 1.0 (amax = 127), so the
    quantized values equal the given integers: row m-1 of a is ``[fill]*count + a_tail``,
    column n-1 of b is ``[fill]*count + b_tail`` and every other entry is 0."""
    k = count + len(a_tail)
    xa = np.zeros((shape_m, k))
    xa[-1] = [fill] * count + list(a_tail)
    xb = np.zeros((k, shape_n))
    xb[:, -1] = [fill] * count + list(b_tail)
    return xa, xb


@pytest.mark.parametrize("sign", [1, -1])
def test_int8_gemm_int32_boundary_symmetric(kernel, sign):
    # 133144 * 127 * 127 + 127 * 32 + 7 * 1 = 2**31 - 1; K = 133146 > 65536 (several
    # int32 chunks in the VNNI kernel)
    count = 133144
    assert count * 127 * 127 + 127 * 32 + 7 == 2 ** 31 - 1
    xa, xb = _exact_operands([127, 7], [32, 1], 127, count)
    xb *= sign
    a = quantize(SYM, None, xa)
    b = quantize(SYM, None, xb)
    assert quantization_scales(a).tolist() == [1.0] == quantization_scales(b).tolist()
    out = int8_gemm(a, b)
    expected = np.zeros((2, 3))
    expected[1, 2] = sign * (2 ** 31 - 1)
    np.testing.assert_array_equal(out, expected)
    # one more unit: +2**31 overflows; -2**31 is still representable
    xa, xb = _exact_operands([127, 7, 1], [32, 1, 1], 127, count)
    xb *= sign
    a = quantize(SYM, None, xa)
    b = quantize(SYM, None, xb)
    if sign > 0:
        err = _raises(NumericOverflow, "int8_gemm", int8_gemm, a, b)
        assert "(1, 2)" in str(err) and str(2 ** 31) in str(err)
    else:
        out = int8_gemm(a, b)
        assert out[1, 2] == -(2.0 ** 31)
        # and one more unit below -2**31 overflows
        xa, xb = _exact_operands([127, 7, 1, 1], [32, 1, 1, 1], 127, count)
        xb *= -1
        err = _raises(NumericOverflow, "int8_gemm", int8_gemm,
                      quantize(SYM, None, xa), quantize(SYM, None, xb))
        assert "(1, 2)" in str(err) and str(-(2 ** 31) - 1) in str(err)


def test_int8_gemm_int32_boundary_with_zero_points(kernel):
    # ASYMMETRIC with integer values 0..255 (containing 255): scale 1, zp -128, so
    # q - zp = x; with values -255..0: scale 1, zp 127, again q - zp = x.
    count = 33025
    assert count * 255 * 255 + 255 * 129 + 127 == 2 ** 31 - 1

    def run(a_tail, b_tail, b_sign):
        xa, xb = _exact_operands(a_tail, b_tail, 255, count, shape_m=3, shape_n=2)
        xb = xb * b_sign
        xa[0, 0] = 255.0  # other rows/cols keep the per-row / per-column scales at 1
        xb[0, 0] = 255.0 * b_sign
        a = quantize(ASYM, 0, xa)
        b = quantize(ASYM, 1, xb)
        assert set(quantization_scales(a).tolist()) == {1.0}
        assert set(quantization_scales(b).tolist()) == {1.0}
        return a, b

    a, b = run([255, 127], [129, 1], 1)
    out = int8_gemm(a, b)
    assert out[2, 1] == 2.0 ** 31 - 1
    assert out.tobytes() == _gemm_oracle(a, b).tobytes()
    a, b = run([255, 127, 1], [129, 1, 1], 1)
    err = _raises(NumericOverflow, "int8_gemm", int8_gemm, a, b)
    assert "(2, 1)" in str(err) and str(2 ** 31) in str(err)
    a, b = run([255, 127, 1], [129, 1, 1], -1)
    assert int8_gemm(a, b)[2, 1] == -(2.0 ** 31)
    a, b = run([255, 127, 1, 1], [129, 1, 1, 1], -1)
    err = _raises(NumericOverflow, "int8_gemm", int8_gemm, a, b)
    assert "(2, 1)" in str(err) and str(-(2 ** 31) - 1) in str(err)


def test_int8_gemm_reports_first_overflow_row_major(kernel):
    xa = np.full((3, 140000), 127.0)
    xa[0] = 0.0
    xb = np.full((140000, 40), 127.0)
    xb[:, :35] = 0.0
    err = _raises(NumericOverflow, "int8_gemm", int8_gemm,
                  quantize(SYM, 0, xa), quantize(SYM, 1, xb))
    assert "(1, 35)" in str(err) and str(140000 * 127 * 127) in str(err)


def test_int8_gemm_large_k_partial_sums_would_wrap(kernel):
    # a: 255 everywhere (ASYM, q - zp = 255); b: 67000 x 127 then 3000 x -128 (ASYM with
    # lo = -128, hi = 127: scale 1, zp 0).  A single int32 running sum passes 2**31 after
    # 66313 terms, but the exact total is in range.
    k = 70000
    xa = np.full((2, k), 255.0)
    xb = np.concatenate([np.full(67000, 127.0), np.full(3000, -128.0)])[:, None]
    a = quantize(ASYM, None, xa)
    b = quantize(ASYM, 1, xb)
    assert quantization_zero_points(b).tolist() == [0]
    total = 255 * (67000 * 127 - 3000 * 128)
    assert 67000 * 255 * 127 > 2 ** 31 - 1 >= total
    out = int8_gemm(a, b)
    np.testing.assert_array_equal(out, np.full((2, 1), float(total)))


def test_int8_gemm_non_finite_result(kernel):
    a = quantize(SYM, None, [[1e300, 0.0]])
    b = quantize(SYM, 1, [[1e300, 1.0], [0.0, 1.0]])
    err = _raises(NumericOverflow, "int8_gemm", int8_gemm, a, b)
    assert "(0, 0)" in str(err) and "not finite" in str(err)


def test_int8_gemm_rejects_axes_shapes_types():
    x = np.random.default_rng(9).standard_normal((3, 4))
    y = np.random.default_rng(10).standard_normal((4, 5))
    a, b = quantize(SYM, 0, x), quantize(SYM, 1, y)
    _raises(DomainError, "int8_gemm", int8_gemm, quantize(SYM, 1, x), b)
    _raises(DomainError, "int8_gemm", int8_gemm, quantize(ASYM, -1, x), b)
    _raises(DomainError, "int8_gemm", int8_gemm, a, quantize(SYM, 0, y))
    _raises(DomainError, "int8_gemm", int8_gemm, a, quantize(ASYM, -2, y))
    _raises(ShapeError, "int8_gemm", int8_gemm, quantize(SYM, None, x[0]), b)
    _raises(ShapeError, "int8_gemm", int8_gemm, a, quantize(SYM, None, y[0]))
    _raises(ShapeError, "int8_gemm", int8_gemm, quantize(SYM, None, np.ones((3, 4, 5))), b)
    _raises(ShapeError, "int8_gemm", int8_gemm, quantize(SYM, None, 1.0), b)
    _raises(ShapeError, "int8_gemm", int8_gemm, a, quantize(SYM, 1, y[:3]))
    _raises(ShapeError, "int8_gemm", int8_gemm, quantize(SYM, None, y), quantize(SYM, None, x))
    _raises(TypeError, "int8_gemm", int8_gemm, x, b)
    _raises(TypeError, "int8_gemm", int8_gemm, a, y)


def test_int8_gemm_does_not_mutate_operands(kernel):
    rng = np.random.default_rng(12)
    a = quantize(ASYM, 0, rng.standard_normal((9, 13)))
    b = quantize(SYM, None, rng.standard_normal((13, 35)))
    copies = helpers.frozen_copy(*(f(t) for t in (a, b) for f in
                                   (quantized_values, quantization_scales,
                                    quantization_zero_points)))
    a_copy, b_copy = dataclasses.replace(a), dataclasses.replace(b)
    out1 = int8_gemm(a, b)
    out2 = int8_gemm(a, b)
    assert out1.tobytes() == out2.tobytes() and not np.shares_memory(out1, out2)
    now = [f(t) for t in (a, b) for f in
           (quantized_values, quantization_scales, quantization_zero_points)]
    for u, v in zip(copies, now):
        np.testing.assert_array_equal(u, v)
    assert a == a_copy and b == b_copy


def test_seed_003_per_output_channel_linear_parity(kernel):
    # Seed 003: W [64, 32] ~ N(0, 0.05) quantized per output channel (row), x [4, 32]
    # ~ N(0, 1) quantized per tensor; mean |y_q - y_f| / mean |y_f| < 5 %.
    rng = np.random.default_rng(2026)
    w = rng.normal(0.0, 0.05, (64, 32))
    x = rng.normal(0.0, 1.0, (4, 32))
    qw = quantize(SYM, 1, w.T)  # [in, out], one scale per output channel
    assert quantization_scales(qw).tobytes() == quantization_scales(quantize(SYM, 0, w)).tobytes()
    np.testing.assert_array_equal(quantized_values(qw), quantized_values(quantize(SYM, 0, w)).T)
    qx = quantize(SYM, None, x)
    y_q = int8_gemm(qx, qw)
    y_f = x @ w.T
    err = np.mean(np.abs(y_q - y_f)) / np.mean(np.abs(y_f))
    assert err < 0.05, err
    assert y_q.tobytes() == _gemm_oracle(qx, qw).tobytes()


def test_deterministic_across_thread_counts():
    helpers.assert_same_across_threads("""
        import sys
        import numpy as np
        from hmath_dl.precision import Quantization, quantize, dequantize, int8_gemm
        from hmath_dl.precision import quantized_values
        from hmath_dl.precision import quantization as qmod
        rng = np.random.default_rng(7)
        # above the serial thresholds, so the parallel kernels really run on 2 threads
        assert 1100 * 1000 * 40 > qmod.SERIAL_GEMM_WORK
        assert 1100 * 1000 > qmod.SERIAL_QUANTIZE_ELEMENTS
        x = rng.standard_normal((1100, 1000)) * 3.0 + 0.5
        y = rng.standard_normal((1000, 40))
        a = quantize(Quantization.ASYMMETRIC, 0, x)
        b = quantize(Quantization.SYMMETRIC, 1, y)
        t = quantize(Quantization.ASYMMETRIC, None, x)
        c = quantize(Quantization.SYMMETRIC, 1, x)
        small = int8_gemm(quantize(Quantization.SYMMETRIC, None, x[:9, :20]),
                          quantize(Quantization.ASYMMETRIC, 1, y[:20, :33]))
        for arr in (quantized_values(a), quantized_values(t), quantized_values(c),
                    dequantize(a), dequantize(c), int8_gemm(a, b), small):
            sys.stdout.buffer.write(np.ascontiguousarray(arr).tobytes())
    """)


def test_kernel_selection_overrides(monkeypatch):
    from hmath_dl import config as hconfig
    from hmath_dl._kernels import _cpu
    monkeypatch.setattr(hconfig, "INT8_KERNEL", "portable")
    assert qmod._want_vnni() is False
    monkeypatch.setattr(hconfig, "INT8_KERNEL", "")
    monkeypatch.setattr(hconfig, "KERNELS", "portable")
    assert qmod._want_vnni() is False
    monkeypatch.setattr(hconfig, "KERNELS", "")
    from numba.core import config
    env = _cpu.target_environment("generic")
    monkeypatch.setattr(config, "CPU_NAME", env["NUMBA_CPU_NAME"], raising=False)
    monkeypatch.setattr(config, "CPU_FEATURES", env["NUMBA_CPU_FEATURES"], raising=False)
    assert _cpu._read(False).avx512_vnni is False
    assert _cpu._read(False).tiled is False


@pytest.mark.parametrize("schedule", ["serial", "parallel"])
@pytest.mark.parametrize("axis", [None, 0, 1, 2])
def test_quantize_finds_every_non_finite_entry(axis, schedule):
    # quantize counts NaN/inf in the same pass that finds each slice's range: an entry in
    # the head, the middle or the 4-wide loop's remainder of a slice, along every layout
    # (per tensor, channels outermost, channels adjacent in memory), is reported by name
    from hmath_dl._kernels._jit import forced_schedule
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 7, 131))
    for where, bad in (((0, 0, 0), np.nan), ((2, 3, 130), np.inf), ((4, 6, 129), -np.inf),
                       ((3, 0, 64), np.nan)):
        y = x.copy()
        y[where] = bad
        with forced_schedule(schedule):
            for mode in (SYM, ASYM):
                msg = _raises(NonFiniteError, "quantize", quantize, mode, axis, y)
                assert str(where) in str(msg)
    # a NaN is reported before an invalid axis, and before a slice's invalid scale
    y = x.copy()
    y[1, 1, 1] = np.nan
    _raises(NonFiniteError, "quantize", quantize, SYM, 3, y)
    z = np.zeros((3, 4))
    z[0, 0] = 1e-310                           # slice 0's scale would be subnormal
    z[2, 3] = np.nan
    _raises(NonFiniteError, "quantize", quantize, SYM, 0, z)


def test_quantize_result_satisfies_the_constructors_invariants():
    # quantize builds its result without re-running the constructor's checks: the same
    # tensor through the public constructor must be accepted and compare equal
    rng = np.random.default_rng(12)
    x = rng.standard_normal((64, 33)) * np.exp2(rng.integers(-30, 30, (64, 1)))
    for mode in (SYM, ASYM):
        for axis in (None, 0, 1):
            q = quantize(mode, axis, x)
            again = QuantizedTensor(q.mode, q.axis, quantized_values(q),
                                    quantization_scales(q), quantization_zero_points(q))
            assert again == q and hash(again) == hash(q)
            for arr in (q._values, q._scales, q._zero_points):
                assert not arr.flags.writeable and arr.flags.c_contiguous and arr.base is None
