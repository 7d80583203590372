"""FP16/BF16 rounding and decoding, and the reduced GEMM (hmath_dl.precision.half)."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from hmath_dl._kernels._jit import forced_schedule
from hmath_dl.errors import DomainError, MathError, NonFiniteError, NumericOverflow, ShapeError
from hmath_dl.precision import (
    Precision,
    bits_to_float,
    reduced_gemm,
    round_to_bits,
    round_to_precision,
)
from tests.helpers import assert_same_across_threads, frozen_copy, noncontiguous, readonly
from tests.reference import half as ref

FP16, BF16 = Precision.FP16, Precision.BF16
VIEW = {FP16: np.float16, BF16: ml_dtypes.bfloat16}


def raises(exc, fname, fn, *args):
    with pytest.raises(exc) as info:
        fn(*args)
    assert str(info.value).startswith(fname + ":"), str(info.value)
    return str(info.value)


def same_bits(x, y):
    """Bitwise equality of float64 arrays (distinguishes -0.0 from +0.0)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    return x.shape == y.shape and np.array_equal(x.view(np.uint64), y.view(np.uint64))


# ------------------------------------------------------------------------- decoding
def test_fp16_every_pattern_decodes_like_numpy():
    pats = np.arange(65536, dtype=np.int64)
    f16 = pats.astype(np.uint16).view(np.float16)
    finite = np.isfinite(f16)
    got = bits_to_float(FP16, pats[finite])
    assert got.dtype == np.float64 and got.flags.c_contiguous
    assert same_bits(got, f16[finite].astype(np.float64))
    assert (~finite).sum() == 2 * 1024


def test_bf16_every_pattern_decodes_like_ml_dtypes_and_reference():
    pats = np.arange(65536, dtype=np.int64)
    bf = pats.astype(np.uint16).view(ml_dtypes.bfloat16)
    exp_all_ones = (pats & 0x7F80) == 0x7F80
    got = bits_to_float(BF16, pats[~exp_all_ones])
    assert same_bits(got, bf[~exp_all_ones].astype(np.float64))
    # exact rational decoding of every subnormal and a stride of the rest
    sample = np.r_[np.arange(0, 128), np.arange(0x8000, 0x8080), np.arange(0, 0x7F80, 97),
                   np.arange(0x8000, 0xFF80, 89)]
    expect = [ref.decode_float("BF16", int(p)) for p in sample]
    assert same_bits(bits_to_float(BF16, sample), expect)


@pytest.mark.parametrize("p,patterns", [
    (FP16, [0x7C00, 0xFC00, 0x7C01, 0x7E00, 0x7FFF, 0xFFFF, 0xFE00]),
    (BF16, [0x7F80, 0xFF80, 0x7F81, 0x7FC0, 0x7FFF, 0xFFFF, 0xFFC0]),
])
def test_nan_and_inf_patterns_rejected(p, patterns):
    for pat in patterns:
        raises(NonFiniteError, "bits_to_float", bits_to_float, p, [0, pat])
    msg = raises(NonFiniteError, "bits_to_float", bits_to_float, p,
                 np.array([[1, 2], [patterns[0], patterns[2]]]))
    assert "(1, 0)" in msg


def test_every_nonfinite_pattern_rejected():
    for p, mbits in ((FP16, 10), (BF16, 7)):
        expo = ((1 << (15 - mbits)) - 1) << mbits
        frac = np.arange(1 << mbits)
        for pat in np.r_[expo | frac, 0x8000 | expo | frac]:
            with pytest.raises(NonFiniteError):
                bits_to_float(p, [int(pat)])


def test_bits_to_float_argument_errors():
    raises(TypeError, "bits_to_float", bits_to_float, FP16, [1.0, 2.0])
    raises(TypeError, "bits_to_float", bits_to_float, FP16, np.array([1, 2], np.float32))
    raises(TypeError, "bits_to_float", bits_to_float, FP16, [True, False])
    raises(TypeError, "bits_to_float", bits_to_float, FP16, ["a"])
    raises(TypeError, "bits_to_float", bits_to_float, "FP16", [1])
    raises(TypeError, "bits_to_float", bits_to_float, None, [1])
    msg = raises(DomainError, "bits_to_float", bits_to_float, FP16, [0, 65536])
    assert "65536" in msg
    raises(DomainError, "bits_to_float", bits_to_float, BF16, [-1])
    raises(DomainError, "bits_to_float", bits_to_float, BF16, np.array([2**63], dtype=np.uint64))


def test_bits_to_float_input_kinds():
    pats = np.array([[0x3C00, 0x8000], [0x0001, 0x7BFF]], dtype=np.uint16)
    expect = pats.view(np.float16).astype(np.float64)
    for form in (pats, pats.astype(np.int32), pats.tolist(), pats.T.copy().T,
                 np.asfortranarray(pats.astype(np.int64))):
        before = np.array(form, copy=True)
        got = bits_to_float(FP16, form)
        assert same_bits(got, expect) and got.flags.c_contiguous
        assert np.array_equal(np.asarray(form), before)
    ro = pats.copy()
    ro.flags.writeable = False
    assert same_bits(bits_to_float(FP16, ro), expect)
    assert same_bits(bits_to_float(FP16, np.zeros((3, 2), np.uint16)[::2]), np.zeros((2, 2)))
    assert bits_to_float(FP16, np.zeros((0, 3), np.int64)).shape == (0, 3)
    scalar = bits_to_float(BF16, 0x3F80)
    assert scalar.shape == () and scalar == 1.0


# ------------------------------------------------------------------------- rounding
def _neighbours(fmt):
    """All finite non-negative values v[k] (pattern k) of the format, their midpoints and
    the doubles one ulp on either side of each midpoint, with the expected patterns."""
    v = ref.representable(fmt)
    k = np.arange(v.size - 1, dtype=np.int64)
    mid = (v[:-1] + v[1:]) / 2                   # exact: <= 12 significant bits
    assert np.all((mid > v[:-1]) & (mid < v[1:]))
    even = np.where(k % 2 == 0, k, k + 1)
    below = np.nextafter(mid, -np.inf)
    above = np.nextafter(mid, np.inf)
    xs = np.r_[v, mid, below, above]
    expect = np.r_[np.arange(v.size), even, k, k + 1].astype(np.uint16)
    return xs, expect


@pytest.mark.parametrize("p,fmt", [(FP16, "FP16"), (BF16, "BF16")])
def test_every_midpoint_and_its_neighbours(p, fmt):
    xs, expect = _neighbours(fmt)
    got = round_to_bits(p, xs)
    assert got.dtype == np.uint16 and got.shape == xs.shape
    assert np.array_equal(got, expect)
    # the same with the sign bit set
    assert np.array_equal(round_to_bits(p, -xs), expect | np.uint16(0x8000))
    # round_to_precision is the decoded pattern
    assert same_bits(round_to_precision(p, xs), bits_to_float(p, expect))
    if p is FP16:      # numpy's float64 -> float16 cast rounds once, correctly
        assert np.array_equal(xs.astype(np.float16).view(np.uint16), expect)


@pytest.mark.parametrize("p,fmt", [(FP16, "FP16"), (BF16, "BF16")])
def test_overflow_threshold(p, fmt):
    top = ref.max_finite(fmt)
    m, bias = ref.FORMATS[fmt]
    nxt = 2.0 ** ((1 << (15 - m)) - 1 - bias)          # the next power of two
    threshold = (top + nxt) / 2
    max_pat = (((1 << (15 - m)) - 1) << m) - 1
    assert round_to_bits(p, np.nextafter(threshold, 0)) == max_pat
    assert round_to_bits(p, -np.nextafter(threshold, 0)) == 0x8000 | max_pat
    assert round_to_precision(p, top) == top
    for bad in (threshold, -threshold, nxt, 1e300, -1.7976931348623157e308):
        msg = raises(NumericOverflow, "round_to_bits", round_to_bits, p, [0.0, 1.0, bad])
        assert "(2,)" in msg
        raises(NumericOverflow, "round_to_precision", round_to_precision, p, [[bad]])
    with pytest.raises(ref.Overflow):
        ref.round_bits(fmt, threshold)
    assert ref.round_bits(fmt, np.nextafter(threshold, 0)) == max_pat


@pytest.mark.parametrize("p,fmt", [(FP16, "FP16"), (BF16, "BF16")])
def test_subnormals_zero_and_tiny(p, fmt):
    m, bias = ref.FORMATS[fmt]
    tiny = 2.0 ** (1 - bias - m)                          # smallest subnormal
    cases = [(0.0, 0x0000), (-0.0, 0x8000), (tiny, 0x0001), (-tiny, 0x8001), (tiny / 2, 0x0000),
             (-tiny / 2, 0x8000), (np.nextafter(tiny / 2, 1), 0x0001), (1.5 * tiny, 0x0002),
             (2.5 * tiny, 0x0002), (5e-324, 0x0000), (-5e-324, 0x8000),
             (2.2250738585072014e-308, 0), (-1e-300, 0x8000), ((2 ** m - 1) * tiny, (1 << m) - 1),
             ((2 ** m - 0.5) * tiny, 1 << m)]               # rounds up into the first normal
    xs = np.array([c[0] for c in cases])
    expect = np.array([c[1] for c in cases], dtype=np.uint16)
    assert np.array_equal(round_to_bits(p, xs), expect)
    assert np.array_equal(ref.round_bits_array(fmt, xs), expect)
    back = round_to_precision(p, [-0.0, -tiny / 2, -1e-300])
    assert np.all(back == 0.0) and np.all(np.signbit(back))
    assert not np.signbit(round_to_precision(p, 0.0))


def test_bf16_single_rounding_not_double():
    x = np.nextafter(1.00390625, 2.0)
    assert round_to_precision(BF16, x) == 1.0078125
    assert round_to_bits(BF16, [x])[0] == 0x3F81
    assert ref.round_bits("BF16", x) == 0x3F81
    # rounding through float32 first (what PyTorch, and ml_dtypes before 0.7, do) gets
    # this wrong -- documents why we do not use it; ml_dtypes 0.7 rounds float64 once
    assert float(np.array([x]).astype(np.float32).astype(ml_dtypes.bfloat16)[0]) == 1.0
    assert round_to_precision(BF16, -x) == -1.0078125
    assert round_to_precision(BF16, 1.00390625) == 1.0           # exact tie -> even


def test_fp16_matches_numpy_on_many_random_values():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(200_000) * np.exp2(rng.uniform(-30, 15.9, 200_000))
    x = x[np.abs(x) < 65519.0]                   # 65520 is the overflow threshold
    got = round_to_bits(FP16, x)
    assert np.array_equal(got, x.astype(np.float16).view(np.uint16))
    assert np.array_equal(got.view(np.float16), x.astype(np.float16))


def test_bf16_matches_ml_dtypes_on_float32_inputs():
    # from float32 inputs ml_dtypes rounds once, so it is a valid oracle there
    rng = np.random.default_rng(8)
    x32 = (rng.standard_normal(200_000) * np.exp2(rng.uniform(-140, 127, 200_000))).astype(np.float32)
    x32 = x32[np.isfinite(x32) & (np.abs(x32) < 3.38e38)]
    got = round_to_bits(BF16, x32)
    assert np.array_equal(got, x32.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert same_bits(got.view(ml_dtypes.bfloat16).astype(np.float64),
                     round_to_precision(BF16, x32))


finite_doubles = st.floats(allow_nan=False, allow_infinity=False, width=64)


@given(st.sampled_from([FP16, BF16]),
       hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                  elements=st.one_of(
                      st.floats(-65504.0, 65504.0, allow_subnormal=True),
                      st.floats(-1e-5, 1e-5),
                      st.builds(lambda m, e: math.ldexp(m, e), st.floats(-1, 1), st.integers(-150, 120)))))
def test_rounding_matches_fraction_oracle(p, x):
    fmt = p.name
    try:
        expect = ref.round_bits_array(fmt, x)
    except ref.Overflow:
        with pytest.raises(NumericOverflow):
            round_to_bits(p, x)
        return
    got = round_to_bits(p, x)
    assert got.shape == x.shape and got.dtype == np.uint16
    assert np.array_equal(got, expect)
    assert same_bits(round_to_precision(p, x),
                     np.array([ref.decode_float(fmt, int(b)) for b in expect.reshape(-1)]).reshape(x.shape))


@given(st.sampled_from([FP16, BF16]), st.lists(finite_doubles, min_size=1, max_size=6))
def test_any_double_either_rounds_like_oracle_or_overflows(p, xs):
    fmt = p.name
    try:
        expect = ref.round_bits_array(fmt, xs)
    except ref.Overflow:
        raises(NumericOverflow, "round_to_bits", round_to_bits, p, xs)
        return
    assert np.array_equal(round_to_bits(p, xs), expect)


def test_rounding_errors():
    for fn, fname in ((round_to_bits, "round_to_bits"), (round_to_precision, "round_to_precision")):
        msg = raises(NonFiniteError, fname, fn, FP16, [1.0, np.nan])
        assert "(1,)" in msg
        raises(NonFiniteError, fname, fn, BF16, [[np.inf]])
        raises(NonFiniteError, fname, fn, BF16, -np.inf)
        raises(TypeError, fname, fn, "BF16", [1.0])
        raises(TypeError, fname, fn, 1, [1.0])
        raises(TypeError, fname, fn, FP16, ["x"])
        raises(TypeError, fname, fn, FP16, [[1.0], [1.0, 2.0]])
        raises(TypeError, fname, fn, FP16, np.array([1 + 2j]))
        raises(NumericOverflow, fname, fn, FP16, [70000])
        raises(NumericOverflow, fname, fn, BF16, np.array([1e39]))


def test_rounding_input_kinds_and_no_mutation():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4)) * 100
    expect = x.astype(np.float16).view(np.uint16)
    (keep,) = frozen_copy(x)
    for form in (x, readonly(x), noncontiguous(x), np.asfortranarray(x), x.tolist()):
        got = round_to_bits(FP16, form)
        assert np.array_equal(got, expect) and got.flags.c_contiguous and got.flags.writeable
        vals = round_to_precision(FP16, form)
        assert same_bits(vals, expect.view(np.float16).astype(np.float64))
    assert np.array_equal(x, keep)
    x32 = x.astype(np.float32)
    assert np.array_equal(round_to_bits(BF16, x32), x32.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.array_equal(round_to_bits(FP16, np.array([3, -70000 // 2], dtype=np.int64)),
                          np.array([3, -35000], dtype=np.float64).astype(np.float16).view(np.uint16))
    s = round_to_bits(FP16, 1.0)
    assert s.shape == () and s == 0x3C00
    assert round_to_bits(BF16, np.zeros((2, 0))).shape == (2, 0)
    assert round_to_precision(BF16, []).shape == (0,)


# ---------------------------------------------------------------------- reduced GEMM
def _oracle_gemm(p, a, b):
    a16 = np.array([ref.decode_float(p.name, int(q)) for q in ref.round_bits_array(p.name, a).reshape(-1)]).reshape(a.shape)
    b16 = np.array([ref.decode_float(p.name, int(q)) for q in ref.round_bits_array(p.name, b).reshape(-1)]).reshape(b.shape)
    return ref.reduced_gemm_f32(a16.reshape(a.shape), b16.reshape(b.shape))


@st.composite
def gemm_case(draw):
    m, k, n = draw(st.integers(0, 7)), draw(st.integers(0, 40)), draw(st.integers(0, 9))
    seed = draw(st.integers(0, 2**32 - 1))
    p = draw(st.sampled_from([FP16, BF16]))
    # binary-exponent ranges: FP16 up to its subnormals; BF16 down to float32-subnormal products
    ranges = [(0, 0), (-4, 4), (-12, 12)] + ([(-20, 20), (-80, -60)] if p is BF16 else [])
    lo, hi = draw(st.sampled_from(ranges))
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)) * np.exp2(rng.uniform(lo, hi, (m, k)))
    b = rng.standard_normal((k, n)) * np.exp2(rng.uniform(lo, hi, (k, n)))
    return p, a, b


@given(gemm_case())
def test_reduced_gemm_bit_exact_vs_oracle(case):
    p, a, b = case
    expect, overflow = _oracle_gemm(p, a, b)
    assert not overflow
    got = reduced_gemm(p, a, b)
    assert got.shape == (a.shape[0], b.shape[1]) and got.dtype == np.float64
    assert same_bits(got, expect)


@pytest.mark.parametrize("p", [FP16, BF16])
def test_reduced_gemm_larger_shapes_exercise_blocking(p):
    rng = np.random.default_rng(11)
    for m, k, n in ((13, 300, 70), (9, 1, 300), (66, 257, 5), (1, 1000, 1), (130, 64, 300)):
        a = rng.standard_normal((m, k))
        b = rng.standard_normal((k, n))
        if p is FP16:
            a16 = a.astype(np.float16).astype(np.float64)
            b16 = b.astype(np.float16).astype(np.float64)
        else:       # float32-representable inputs: ml_dtypes rounds them once, correctly
            a = a.astype(np.float32).astype(np.float64)
            b = b.astype(np.float32).astype(np.float64)
            a16 = a.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
            b16 = b.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
        expect, _ = ref.reduced_gemm_f32(a16, b16)
        assert same_bits(reduced_gemm(p, a, b), expect)


def test_reduced_gemm_no_fused_multiply_add():
    # acc = -2**-149 after k=0; p1 = fl32((1+2**-7)**2 * 2**-150) = 2**-149 (rounded up),
    # so acc + p1 = +0.0.  A fused a*b + acc would give -0.49 * 2**-149 -> -0.0.
    c = (1 + 2.0 ** -7) * 2.0 ** -75
    a = np.array([[-(2.0 ** -75), c]])
    b = np.array([[2.0 ** -74], [c]])
    got = reduced_gemm(BF16, a, b)
    assert got[0, 0] == 0.0 and not np.signbit(got[0, 0])
    expect, _ = ref.reduced_gemm_f32(a, b)
    assert same_bits(got, expect)


@pytest.mark.parametrize("p", [FP16, BF16])
def test_fused_and_separate_kernels_agree_bitwise(p):
    # the exact-FMA fast path must be invisible: same bits as the separate multiply/add
    import hmath_dl.precision.half as half_mod
    rng = np.random.default_rng(21)
    a = rng.standard_normal((20, 333)) * np.exp2(rng.uniform(-12, 12, (20, 333)))
    b = rng.standard_normal((333, 75)) * np.exp2(rng.uniform(-12, 12, (333, 75)))
    fused = reduced_gemm(p, a, b)
    with half_mod.forced_arithmetic("separate"):
        separate = reduced_gemm(p, a, b)
    assert same_bits(fused, separate)
    ranges = ((2.0, 0.5), (3.0, 0.25))      # products provably exact in float32
    assert half_mod._products_exact(*ranges)
    with half_mod.forced_arithmetic("separate"):
        assert not half_mod._products_exact(*ranges)
    with pytest.raises(ValueError):
        with half_mod.forced_arithmetic("fast"):
            pass
    expect, _ = _oracle_gemm(p, a[:4], b)
    assert same_bits(fused[:4], expect)


@pytest.mark.parametrize("p", [FP16, BF16])
def test_parallel_and_serial_kernels_agree_and_match_oracle(p):
    import hmath_dl.precision.half as half_mod
    rng = np.random.default_rng(22)
    a = rng.standard_normal((130, 520)).astype(np.float32).astype(np.float64)
    b = rng.standard_normal((520, 300)).astype(np.float32).astype(np.float64)
    assert 130 * 520 * 300 > half_mod._SERIAL_GEMM_WORK          # the parallel kernel
    parallel = reduced_gemm(p, a, b)
    dt = np.float16 if p is FP16 else ml_dtypes.bfloat16
    a16 = a.astype(np.float32).astype(dt).astype(np.float64)  # single rounding from float32
    b16 = b.astype(np.float32).astype(dt).astype(np.float64)
    assert same_bits(parallel, ref.reduced_gemm_f32(a16, b16)[0])
    with forced_schedule("serial"):
        assert same_bits(reduced_gemm(p, a, b), parallel)


def test_exact_fma_guard_catches_product_overflow_hidden_by_cancellation():
    # k=0: acc = -2**127; k=1: p = fl32(2**100 * 2**28) = +inf, so acc = inf: overflow.
    # A fused a*b + acc would give the finite 2**127 and hide it.
    a = np.array([[1.0, 2.0 ** 100]])
    b = np.array([[-(2.0 ** 127)], [2.0 ** 28]])
    _, overflow = ref.reduced_gemm_f32(a, b)
    assert overflow
    raises(NumericOverflow, "reduced_gemm", reduced_gemm, BF16, a, b)


def test_nonfinite_reported_before_overflow():
    raises(NonFiniteError, "reduced_gemm", reduced_gemm, FP16, [[1e6]], [[np.nan]])
    raises(NonFiniteError, "round_to_bits", round_to_bits, FP16, [1e6, np.inf])


def test_reduced_gemm_order_is_k_ascending():
    # 2**24 + 1 + 1 in float32 ascending gives 2**24 (each +1 is a tie to even);
    # the reverse order would give 2**24 + 2.
    a = np.array([[1.0, 1.0, 1.0]])
    b = np.array([[2.0 ** 24], [1.0], [1.0]])
    assert reduced_gemm(BF16, a, b)[0, 0] == 2.0 ** 24
    b_rev = b[::-1]
    assert reduced_gemm(BF16, a, b_rev)[0, 0] == 2.0 ** 24 + 2


def test_reduced_gemm_edge_shapes():
    for p in (FP16, BF16):
        z = reduced_gemm(p, np.zeros((3, 0)), np.zeros((0, 4)))
        assert z.shape == (3, 4) and np.all(z == 0.0) and not np.any(np.signbit(z))
        assert reduced_gemm(p, np.zeros((0, 5)), np.ones((5, 2))).shape == (0, 2)
        assert reduced_gemm(p, np.ones((2, 5)), np.ones((5, 0))).shape == (2, 0)
        # -0.0 products summed onto +0.0 stay +0.0
        assert not np.signbit(reduced_gemm(p, [[-0.0]], [[1.0]])[0, 0])


def test_reduced_gemm_errors():
    f = "reduced_gemm"
    raises(ShapeError, f, reduced_gemm, FP16, np.ones(3), np.ones((3, 1)))
    raises(ShapeError, f, reduced_gemm, FP16, np.ones((2, 3)), np.ones((3, 1, 1)))
    msg = raises(ShapeError, f, reduced_gemm, BF16, np.ones((2, 3)), np.ones((4, 1)))
    assert "[2, 3]" in msg and "[4, 1]" in msg
    raises(NonFiniteError, f, reduced_gemm, FP16, [[np.nan]], [[1.0]])
    raises(NonFiniteError, f, reduced_gemm, FP16, [[1.0]], [[np.inf]])
    raises(TypeError, f, reduced_gemm, "FP16", [[1.0]], [[1.0]])
    raises(TypeError, f, reduced_gemm, FP16, [["a"]], [[1.0]])
    msg = raises(NumericOverflow, f, reduced_gemm, FP16, [[1.0, 70000.0]], [[1.0], [1.0]])
    assert " a " in msg and "(0, 1)" in msg
    msg = raises(NumericOverflow, f, reduced_gemm, FP16, [[1.0]], [[-1e6]])
    assert " b " in msg
    # a BF16 product beyond float32's range
    raises(NumericOverflow, f, reduced_gemm, BF16, [[1.0, 0.0], [1e20, 1.0]], [[1e20, 1.0], [1.0, 1.0]])
    # an accumulator reaching inf (each product finite)
    raises(NumericOverflow, f, reduced_gemm, BF16, [[3e38, 3e38]], [[1.0], [1.0]])
    # inf + (-inf) = NaN is also reported
    raises(NumericOverflow, f, reduced_gemm, BF16, [[1e30, 1e30]], [[1e30], [-1e30]])


def test_reduced_gemm_input_kinds_and_no_mutation():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 5))
    b = rng.standard_normal((5, 7))
    keep = frozen_copy(a, b)
    expect = reduced_gemm(FP16, a, b)
    a16 = a.astype(np.float16).astype(np.float64)
    b16 = b.astype(np.float16).astype(np.float64)
    assert same_bits(expect, ref.reduced_gemm_f32(a16, b16)[0])
    for fa, fb in ((readonly(a), readonly(b)), (noncontiguous(a), noncontiguous(b)),
                   (a.tolist(), b.tolist()), (np.asfortranarray(a), b.T.copy().T)):
        got = reduced_gemm(FP16, fa, fb)
        assert same_bits(got, expect) and got.flags.c_contiguous and got.flags.writeable
    assert np.array_equal(a, keep[0]) and np.array_equal(b, keep[1])
    ints = reduced_gemm(BF16, [[1, 2]], [[3], [4]])
    assert ints.dtype == np.float64 and ints[0, 0] == 11.0


def test_errors_are_math_errors_or_type_errors():
    for bad in ([[np.nan]], [[1e300]]):
        with pytest.raises(MathError):
            reduced_gemm(BF16, bad, [[1.0]])


def test_determinism_across_thread_counts():
    assert_same_across_threads("""
        import sys
        import numpy as np
        from hmath_dl.precision import Precision, reduced_gemm, round_to_bits, round_to_precision, bits_to_float
        rng = np.random.default_rng(0)
        x = rng.standard_normal(50_000) * 1000
        a = rng.standard_normal((260, 300)); b = rng.standard_normal((300, 260))  # parallel kernel
        out = [round_to_bits(Precision.FP16, x).tobytes(), round_to_precision(Precision.BF16, x).tobytes(),
               bits_to_float(Precision.BF16, np.arange(0, 65536, 3) & 0x7F7F).tobytes(),
               reduced_gemm(Precision.BF16, a, b).tobytes(), reduced_gemm(Precision.FP16, a, b).tobytes()]
        try:
            round_to_bits(Precision.FP16, np.r_[x, 1e6, x, 1e7])
        except Exception as e:
            out.append(str(e).encode())
        sys.stdout.buffer.write(b"|".join(out))
    """)


# ---------------------------------------------------------------------- reduced GEMM paths
from hmath_dl.precision import half as _half_mod   # noqa: E402

_RPATHS = _half_mod.gemm_paths()


def _reduced(path, p, a, b):
    with _half_mod.forced_gemm_path(path):
        return reduced_gemm(p, a, b)


@pytest.mark.parametrize("path", _RPATHS)
@pytest.mark.parametrize("p", [FP16, BF16])
def test_reduced_gemm_paths_bit_equal(path, p):
    # M, N, K not multiples of any tile, K chunk or task; narrow and wide tiles; both the
    # fused (exact products) and the separate multiply/add kernels; serial and parallel;
    # K = 1024, whose rounded rows of a are stored one cache line further apart; skinny
    # products (at most 16 rows or columns), whose tasks round the long operand
    rng = np.random.default_rng(31)
    shapes = ((1, 1, 1), (7, 300, 70), (6, 129, 16), (13, 257, 17), (66, 1, 130),
              (1, 1000, 1), (130, 64, 300), (97, 515, 33), (200, 260, 129), (13, 1024, 40),
              (1, 700, 1100), (16, 300, 1025), (300, 800, 5), (500, 129, 16), (17, 650, 3))
    for m, k, n in shapes:
        for scale in (0.0, 12.0, 60.0):   # 60: products below 2**-126, separate kernel
            a = rng.standard_normal((m, k)) * np.exp2(rng.uniform(-scale, scale, (m, k)))
            b = rng.standard_normal((k, n)) * np.exp2(rng.uniform(-scale, scale, (k, n)))
            if p is FP16:
                a, b = np.clip(a, -6e4, 6e4), np.clip(b, -6e4, 6e4)
            try:
                want = _reduced("portable", p, a, b)
            except NumericOverflow:
                with pytest.raises(NumericOverflow):
                    _reduced(path, p, a, b)
                continue
            assert same_bits(_reduced(path, p, a, b), want), (m, k, n, scale)
    a = rng.standard_normal((130, 520))
    b = rng.standard_normal((520, 300))
    want = _reduced("portable", p, a, b)
    with forced_schedule("serial"):                                  # serial kernels
        assert same_bits(_reduced(path, p, a, b), want)
    with forced_schedule("parallel"):                                # parallel kernels
        for m, k, n in shapes[:5]:
            a = rng.standard_normal((m, k))
            b = rng.standard_normal((k, n))
            assert same_bits(_reduced(path, p, a, b), _reduced("portable", p, a, b))


def _path_errors(err, path, p, a, b):
    """The messages of the ``err`` that the portable path and ``path`` raise."""
    msgs = []
    for p_ in ("portable", path):
        with pytest.raises(err) as info:
            _reduced(p_, p, a, b)
        msgs.append(str(info.value))
    return msgs


@pytest.mark.parametrize("path", _RPATHS)
def test_reduced_gemm_paths_same_errors(path):
    rng = np.random.default_rng(32)
    a = rng.standard_normal((9, 40))
    b = rng.standard_normal((40, 11))
    for bad_a, bad_b, err in (((3, 5, np.nan), None, NonFiniteError),
                              (None, (7, 2, np.inf), NonFiniteError),
                              # a NaN whose payload is all ones (integer rounding wraps)
                              ((0, 0, np.array([2 ** 63 - 1]).view(np.float64)[0]),
                               None, NonFiniteError),
                              (None, (39, 10, -np.array([2 ** 63 - 1]).view(np.float64)[0]),
                               NonFiniteError),
                              ((8, 39, 1e6), None, NumericOverflow),     # FP16 overflow
                              (None, (0, 10, -7e4), NumericOverflow)):
        x, y = a.copy(), b.copy()
        if bad_a:
            x[bad_a[:2]] = bad_a[2]
        if bad_b:
            y[bad_b[:2]] = bad_b[2]
        msgs = _path_errors(err, path, FP16, x, y)
        assert msgs[0] == msgs[1]
    # an output overflow (products and accumulator in float32) names the same output
    x = np.full((4, 3), 2.0 ** 100)
    y = np.full((3, 5), 2.0 ** 27)
    msgs = _path_errors(NumericOverflow, path, BF16, x, y)
    assert msgs[0] == msgs[1] and "[0, 0]" in msgs[0]


def _inexact_band(rng, m, k, n, band):
    """BF16 operands whose rows ``band`` of a hold two terms only, the last two (k - 2
    and k - 1; test_reduced_gemm_no_fused_multiply_add's): ``-2**-75 * 2**-74 =
    -2**-149``, then ``c * c`` with ``c = (1 + 2**-7) 2**-75``, which rounds up to
    ``+2**-149`` in float32, so each output of those rows is ``+0.0``; a fused
    multiply-add would give ``-0.0`` (last, so that no later zero product resets the
    sign).  Every other product is exact in float32 (normal values, or a normal value
    times ``2**-74`` or ``c``).  Both operands hold float32 values (ml_dtypes rounds
    float32 once, correctly)."""
    c = (1 + 2.0 ** -7) * 2.0 ** -75
    a = rng.standard_normal((m, k))
    a[band] = 0.0
    a[band, k - 2] = -(2.0 ** -75)
    a[band, k - 1] = c
    b = rng.standard_normal((k, n))
    b[k - 2] = 2.0 ** -74
    b[k - 1] = c
    return a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)


def _band_checked(path, a, b, rows):
    """``path``'s BF16 product of :func:`_inexact_band`'s operands, held to the portable
    kernel, to the forced separate arithmetic and, on ``rows``, to the oracle."""
    got = _reduced(path, BF16, a, b)
    assert same_bits(got, _reduced("portable", BF16, a, b))
    with _half_mod.forced_arithmetic("separate"):
        assert same_bits(_reduced(path, BF16, a, b), got)
    a16 = a.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    b16 = b.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    assert same_bits(got[rows], ref.reduced_gemm_f32(a16[rows], b16)[0])
    band = np.flatnonzero(a[:, -2] == -(2.0 ** -75))
    assert not np.signbit(got[band]).any() and not got[band].any()     # +0.0 throughout
    return got


@pytest.mark.parametrize("path", _RPATHS)
def test_reduced_gemm_exact_fma_only_where_products_are_exact(path):
    # BF16: rows 50..59 of a hold two terms only, the last two, whose products are
    # inexact in float32 and sum to +0.0 (a fused multiply-add would give -0.0: see
    # _inexact_band); every other (rows, K chunk) pair has exact products, so a kernel
    # that proves exactness per task or per K chunk may use the fused kernel there.  K spans several chunks and the rows several tasks.  The
    # result must be the specified one everywhere (against the portable kernel, the
    # forced separate arithmetic and the oracle on the band's rows), for any thread count.
    rng = np.random.default_rng(33)
    a, b = _inexact_band(rng, 100, 700, 90, slice(50, 60))
    got = _band_checked(path, a, b, slice(48, 53))
    import numba
    threads = numba.get_num_threads()
    try:                            # one thread: other tasks, the same bits
        numba.set_num_threads(1)
        with forced_schedule("parallel"):
            assert same_bits(_reduced(path, BF16, a, b), got)
    finally:
        numba.set_num_threads(threads)


@pytest.mark.parametrize("path", _RPATHS)
def test_reduced_gemm_late_bad_entry_of_a(path):
    # a NaN, an infinity or an overflowing entry of a in a late K chunk of a late row
    # block: every path names it as the portable path does
    rng = np.random.default_rng(34)
    a = rng.standard_normal((90, 700))
    b = rng.standard_normal((700, 40))
    for value, err in ((np.nan, NonFiniteError), (-np.inf, NonFiniteError),
                       (1e6, NumericOverflow)):
        x = a.copy()
        x[87, 650] = value
        msgs = _path_errors(err, path, FP16, x, b)
        assert msgs[0] == msgs[1] and "(87, 650)" in msgs[0]


@pytest.mark.parametrize("path", _RPATHS)
def test_reduced_gemm_skinny_late_bad_entry_and_exact_fma_per_part(path):
    # skinny products (few rows: the tasks round b, K chunk by K chunk; few columns: they
    # round a, row block by row block): a bad entry late in the long operand is named as
    # the portable path names it; a band whose products are inexact in float32 (so a
    # fused multiply-add would change the bits of the outputs that sum them) must take
    # the separate multiply-add there, whatever the rest may take
    rng = np.random.default_rng(35)
    for m, k, n, where in ((3, 700, 400, "b"), (300, 700, 5, "a")):
        a = rng.standard_normal((m, k))
        b = rng.standard_normal((k, n))
        for value, err in ((np.nan, NonFiniteError), (1e6, NumericOverflow)):
            x, y = a.copy(), b.copy()
            if where == "a":
                x[m - 3, 650] = value
                spot = "(%d, 650)" % (m - 3)
            else:
                y[650, n - 3] = value
                spot = "(650, %d)" % (n - 3)
            msgs = _path_errors(err, path, FP16, x, y)
            assert msgs[0] == msgs[1] and spot in msgs[0]
    for m, k, n, band in ((5, 900, 700, slice(2, 3)), (700, 900, 7, slice(348, 362))):
        a, b = _inexact_band(rng, m, k, n, band)
        _band_checked(path, a, b, band)


def test_reduced_gemm_forced_path_errors():
    with pytest.raises(ValueError):
        with _half_mod.forced_gemm_path("nope"):
            pass
    assert _half_mod.gemm_path() == _RPATHS[0]


# ---------------------------------------------------------------------- whole-array kernels
def test_every_pattern_decodes_the_same_from_uint16_and_in_parallel():
    # uint16 input (round_to_bits' output) skips the widening; a tiled array of every
    # pattern (> the serial threshold) runs the chunk-parallel kernel
    for p, mbits in ((FP16, 10), (BF16, 7)):
        pats = np.arange(65536, dtype=np.int64)
        finite = (pats & (((1 << (15 - mbits)) - 1) << mbits)) != (((1 << (15 - mbits)) - 1) << mbits)
        one = bits_to_float(p, pats[finite])
        for form in (pats[finite].astype(np.uint16), np.tile(pats[finite], 3),
                     np.tile(pats[finite].astype(np.uint16), 3)):
            got = bits_to_float(p, form)
            assert same_bits(got.reshape(-1)[:one.size], one)
            assert same_bits(got, np.tile(one, form.size // one.size))
        for form in (np.tile(pats, 3), np.tile(pats, 3).astype(np.uint16)):
            bad = int(np.flatnonzero(~np.tile(finite, 3))[0])
            msg = raises(NonFiniteError, "bits_to_float", bits_to_float, p, form)
            assert f"({bad},)" in msg


@pytest.mark.parametrize("schedule", ["serial", "parallel"])
def test_decode_paths_agree_on_every_pattern(monkeypatch, schedule):
    # bits_to_float converts BF16 by a shift and FP16 by the hardware conversion where the
    # machine policy has it (F16C); under HMATH_DL_KERNELS=portable both run the lookup
    # table (the exact decode of every pattern, checked against numpy, ml_dtypes and
    # Fraction above): the same bytes and the same first NaN/inf index, for uint16 and
    # int64 input, with a special pattern late in a later chunk
    from hmath_dl import config as hconfig
    from hmath_dl._kernels._cpu import machine
    pats = np.tile(np.arange(65536, dtype=np.int64), 2)
    for p, mbits in ((FP16, 10), (BF16, 7)):
        expo = ((1 << (15 - mbits)) - 1) << mbits
        finite = pats[(pats & expo) != expo]
        late = finite.copy()
        late[-5] = expo | 3
        results = {}
        for kernels in ("", "portable"):
            monkeypatch.setattr(hconfig, "KERNELS", kernels)
            assert machine().portable is bool(kernels)
            with forced_schedule(schedule):
                got = [bits_to_float(p, form).tobytes() for form in (finite, finite.astype(np.uint16))]
                msgs = [raises(NonFiniteError, "bits_to_float", bits_to_float, p, form)
                        for form in (late, late.astype(np.uint16))]
            assert got[0] == got[1]
            assert all(f"({late.size - 5},)" in m for m in msgs)
            results[kernels] = (got[0], msgs)
        assert results[""] == results["portable"]


def _spread(n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * np.exp2(rng.uniform(-30, 14, n))


@pytest.mark.parametrize("p", [FP16, BF16])
def test_whole_array_rounding_parallel_equals_serial(p):
    x = _spread(300_000, 41)
    x[::7] = -x[::7]
    x[5] = -0.0
    bits = round_to_bits(p, x)
    vals = round_to_precision(p, x)
    for i0 in (0, 70_000, 299_000):          # slices below the serial threshold
        part = x[i0:i0 + 1000]
        assert np.array_equal(round_to_bits(p, part), bits[i0:i0 + 1000])
        assert same_bits(round_to_precision(p, part), vals[i0:i0 + 1000])
    assert same_bits(bits_to_float(p, bits), vals)
    assert np.signbit(vals[5]) and bits[5] == 0x8000
    # the first offending index is named, also deep inside a parallel chunk
    y = x.copy()
    y[250_001] = 1e39 if p is BF16 else 7e4
    y[260_000] = -1e300
    for f in (round_to_bits, round_to_precision):
        msg = raises(NumericOverflow, f.__name__, f, p, y)
        assert "(250001,)" in msg
    y[270_000] = np.nan                       # NaN/inf is reported before any overflow
    for f in (round_to_bits, round_to_precision):
        msg = raises(NonFiniteError, f.__name__, f, p, y)
        assert "270000" in msg
