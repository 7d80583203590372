"""Tests for hmath_dl.layers.pooling (PoolMode, pooling, adaptive_pooling, global_pooling)
and the max-pooling argmax kernel entry point."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hmath_dl._kernels.pool import max_pool_argmax_nd, window_bounds
from hmath_dl.errors import DomainError, NonFiniteError, NumericOverflow, ShapeError
from hmath_dl.layers import PoolMode, adaptive_pooling, global_pooling, pooling
from tests.helpers import assert_same_across_threads, frozen_copy, noncontiguous, readonly
from tests.reference.conv import (adaptive_pool_reference, global_pool_reference,
                                  max_pool_argmax_reference, pool_reference)

MODES = st.sampled_from([PoolMode.MAX, PoolMode.AVERAGE])


def check(got, ref, x, mode, sides=1):
    """MAX is exact.  An average of <= 27 terms summed in float and divided once is within
    28 eps * max|x| of the exact mean (``sides=2`` when the peer is also inexact)."""
    assert got.shape == ref.shape and got.dtype == np.float64 and got.flags.c_contiguous
    if mode is PoolMode.MAX:
        assert np.array_equal(got, ref)
    else:
        bound = sides * 28 * np.finfo(np.float64).eps * np.abs(x).max()
        assert np.all(np.abs(got - ref) <= bound)


@st.composite
def pool_cases(draw, ties=False):
    rank = draw(st.integers(1, 3))
    k = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    s = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    # padding may exceed PyTorch's k/2 limit as long as no window is only padding
    p = tuple(draw(st.integers(0, k[a] - 1)) for a in range(rank))
    S = tuple(draw(st.integers(1, 5 if rank < 3 else 4)) for _ in range(rank))
    S = tuple(max(S[a], k[a] - 2 * p[a]) for a in range(rank))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3))) + S
    x = g.integers(-3, 4, size=shape).astype(np.float64) if ties else g.standard_normal(shape)
    return draw(MODES), k, s, p, x


def _all_padding(k, s, p, S):
    O = [(S[a] + 2 * p[a] - k[a]) // s[a] + 1 for a in range(len(S))]
    return any(k[a] - p[a] <= 0 or (O[a] - 1) * s[a] - p[a] >= S[a] for a in range(len(S)))


# --------------------------------------------------------------------------- against the oracle
@given(pool_cases())
def test_pooling_matches_reference(case):
    mode, k, s, p, x = case
    if _all_padding(k, s, p, x.shape[2:]):
        with pytest.raises(DomainError, match=r"^pooling: .*only padding"):
            pooling(mode, k, s, p, x)
        return
    check(pooling(mode, k, s, p, x), pool_reference(mode is PoolMode.MAX, x, k, s, p), x, mode)


@given(pool_cases(ties=True))
def test_argmax_kernel_picks_first_maximum_in_window_order(case):
    _, k, s, p, x = case
    S = x.shape[2:]
    if _all_padding(k, s, p, S):
        return
    O = tuple((S[a] + 2 * p[a] - k[a]) // s[a] + 1 for a in range(len(S)))
    bounds = [window_bounds(S[a], k[a], s[a], p[a], O[a]) for a in range(len(S))]
    out = np.empty(x.shape[:2] + O)
    idx = np.empty(out.shape, dtype=np.int64)
    max_pool_argmax_nd(x, bounds, out, idx)
    assert idx.dtype == np.int64
    assert np.array_equal(out, pool_reference(True, x, k, s, p))
    assert np.array_equal(idx, max_pool_argmax_reference(x, k, s, p))


@st.composite
def adaptive_cases(draw):
    rank = draw(st.integers(1, 3))
    S = tuple(draw(st.integers(1, 6 if rank < 3 else 4)) for _ in range(rank))
    out = tuple(draw(st.integers(1, 7 if rank < 3 else 4)) for _ in range(rank))  # may exceed S
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = g.standard_normal((draw(st.integers(1, 2)), draw(st.integers(1, 3))) + S)
    return draw(MODES), out, x


@given(adaptive_cases())
def test_adaptive_pooling_matches_reference(case):
    mode, out, x = case
    check(adaptive_pooling(mode, out, x), adaptive_pool_reference(mode is PoolMode.MAX, x, out), x, mode)


@given(adaptive_cases())
def test_global_pooling_matches_reference(case):
    mode, _, x = case
    got = global_pooling(mode, x)
    assert got.shape == x.shape[:2]
    check(got, global_pool_reference(mode is PoolMode.MAX, x), x, mode)


# --------------------------------------------------------------------------- hand-derived cases
def test_hand_derived_1d():
    x = [[[1.0, 5.0, 2.0, 4.0, 3.0]]]
    assert np.array_equal(pooling(PoolMode.MAX, 2, 2, 1, x), [[[1.0, 5.0, 4.0]]])
    # windows [-1,1) [1,3) [3,5): averages 1, 3.5, 3.5 (padding not counted)
    assert np.array_equal(pooling(PoolMode.AVERAGE, 2, 2, 1, x), [[[1.0, 3.5, 3.5]]])
    # padding larger than PyTorch allows (2 > 3 // 2) but no window is all padding
    assert np.array_equal(pooling(PoolMode.MAX, 3, 3, 2, x), [[[1.0, 5.0, 3.0]]])
    # adaptive: S=5, out=3 -> bins [0,2) [1,4) [3,5)
    assert np.array_equal(adaptive_pooling(PoolMode.MAX, 3, x), [[[5.0, 5.0, 4.0]]])
    assert np.array_equal(adaptive_pooling(PoolMode.AVERAGE, (3,), x), [[[3.0, 11 / 3, 3.5]]])
    # out > S: S=2, out=3 -> bins [0,1) [0,2) [1,2)
    assert np.array_equal(adaptive_pooling(PoolMode.AVERAGE, 3, [[[2.0, 4.0]]]), [[[2.0, 3.0, 4.0]]])
    assert np.array_equal(global_pooling(PoolMode.AVERAGE, x), [[3.0]])
    assert np.array_equal(global_pooling(PoolMode.MAX, x), [[5.0]])


def test_negative_values_never_lose_to_padding():
    x = -np.ones((1, 1, 2, 2)) - np.arange(4).reshape(1, 1, 2, 2)
    assert np.array_equal(pooling(PoolMode.MAX, 2, 1, 1, x), [[[[-1, -1, -2], [-1, -1, -2], [-3, -3, -4]]]])


def test_global_pooling_equals_full_window_pooling():
    x = np.random.default_rng(4).standard_normal((2, 3, 4, 5, 6))
    for mode in PoolMode:
        assert np.array_equal(global_pooling(mode, x),
                              pooling(mode, (4, 5, 6), 1, 0, x).reshape(2, 3))


def test_large_plane_matches_reference():
    x = np.random.default_rng(9).standard_normal((2, 2, 23, 30))
    for mode in PoolMode:
        check(pooling(mode, (3, 3), (2, 2), (1, 1), x), pool_reference(mode is PoolMode.MAX, x, (3, 3), (2, 2), (1, 1)), x, mode)


# --------------------------------------------------------------------------- input handling
def test_inputs_not_mutated_and_any_array_like_accepted():
    x = np.random.default_rng(5).standard_normal((2, 3, 6, 5))
    before = frozen_copy(x)
    for mode in PoolMode:
        expected = pooling(mode, [3, 2], (2, 1), 1, x)
        assert np.array_equal(x, before[0])
        for v in (readonly(x), noncontiguous(x), x.tolist(), np.asfortranarray(x)):
            assert np.array_equal(pooling(mode, (3, 2), [2, 1], (1, 1), v), expected)
        a = adaptive_pooling(mode, (4, 7), x)
        assert np.array_equal(adaptive_pooling(mode, [4, 7], noncontiguous(x)), a)
        gp = global_pooling(mode, x)
        assert np.array_equal(global_pooling(mode, readonly(x)), gp)
        assert np.array_equal(x, before[0])
    ints = [[[3, 1, 2]]]
    assert np.array_equal(pooling(PoolMode.MAX, 2, 1, 0, ints), [[[3.0, 2.0]]])


# --------------------------------------------------------------------------- errors
X = np.zeros((1, 2, 4, 4))


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: pooling("max", 2, 2, 0, X), TypeError, "mode"),
    (lambda: pooling(None, 2, 2, 0, X), TypeError, "mode"),
    (lambda: pooling(PoolMode.MAX, 2.0, 2, 0, X), TypeError, "window"),
    (lambda: pooling(PoolMode.MAX, 2, None, 0, X), TypeError, "stride"),
    (lambda: pooling(PoolMode.MAX, 2, 2, (0, True), X), TypeError, "padding"),
    (lambda: pooling(PoolMode.MAX, 2, 2, 0, "bad"), TypeError, "x"),
    (lambda: pooling(PoolMode.MAX, 2, 2, 0, np.zeros((2, 4))), ShapeError, "x"),
    (lambda: pooling(PoolMode.MAX, 2, 2, 0, np.zeros((1,) * 6)), ShapeError, "x"),
    (lambda: pooling(PoolMode.MAX, 2, 2, 0, np.zeros((1, 2, 0, 3))), ShapeError, "x"),
    # a 3-entry window needs x with 4 (unbatched) or 5 axes (API.md section 8)
    (lambda: pooling(PoolMode.MAX, (2, 2, 2), 2, 0, np.zeros((1, 2, 4))), ShapeError, "window"),
    (lambda: pooling(PoolMode.MAX, 2, (1,), 0, X), ShapeError, "stride"),
    (lambda: pooling(PoolMode.MAX, 2, 2, (0, 0, 0), X), ShapeError, "padding"),
    (lambda: pooling(PoolMode.MAX, 0, 2, 0, X), DomainError, "window"),
    (lambda: pooling(PoolMode.MAX, 2, 0, 0, X), DomainError, "stride"),
    (lambda: pooling(PoolMode.MAX, 2, (1, -1), 0, X), DomainError, "stride"),
    (lambda: pooling(PoolMode.MAX, 2, 2, -1, X), DomainError, "padding"),
    (lambda: pooling(PoolMode.MAX, 5, 1, 0, X), ShapeError, "output size"),
    (lambda: pooling(PoolMode.AVERAGE, (1, 5), 1, 0, X), DomainError, "output size"),
    (lambda: pooling(PoolMode.MAX, 2, 2, 2, X), DomainError, "only padding"),
    (lambda: pooling(PoolMode.AVERAGE, 1, 1, (0, 1), X), DomainError, "only padding"),
    (lambda: pooling(PoolMode.AVERAGE, 2, 3, 2, np.zeros((1, 1, 5))), DomainError, "only padding"),
    (lambda: pooling(PoolMode.MAX, 2, 2, 0, np.full((1, 2, 4, 4), np.nan)), NonFiniteError, "x"),
    (lambda: pooling(PoolMode.AVERAGE, 2, 1, 0, np.full((1, 1, 3), 1e308)), NumericOverflow, "overflow"),
    (lambda: pooling(PoolMode.MAX, 1, 1, 10**12, X), ShapeError, "bytes"),
])
def test_pooling_errors(call, error, fragment):
    with pytest.raises(error, match=r"^pooling: ") as info:
        call()
    assert fragment in str(info.value)


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: adaptive_pooling(1, 2, X), TypeError, "mode"),
    (lambda: adaptive_pooling(PoolMode.MAX, 2.5, X), TypeError, "output_size"),
    (lambda: adaptive_pooling(PoolMode.MAX, (2, 2, 2), np.zeros((1, 2, 4))), ShapeError, "output_size"),
    (lambda: adaptive_pooling(PoolMode.MAX, (2, 0), X), DomainError, "output_size"),
    (lambda: adaptive_pooling(PoolMode.MAX, -1, X), DomainError, "output_size"),
    (lambda: adaptive_pooling(PoolMode.MAX, 2, np.zeros(3)), ShapeError, "x"),
    (lambda: adaptive_pooling(PoolMode.MAX, 2, np.full((1, 1, 3), -np.inf)), NonFiniteError, "x"),
    (lambda: adaptive_pooling(PoolMode.AVERAGE, 1, np.full((1, 1, 2), 1e308)), NumericOverflow,
     "overflow"),
    (lambda: adaptive_pooling(PoolMode.MAX, 10**12, X), ShapeError, "bytes"),
])
def test_adaptive_pooling_errors(call, error, fragment):
    with pytest.raises(error, match=r"^adaptive_pooling: ") as info:
        call()
    assert fragment in str(info.value)


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: global_pooling("average", X), TypeError, "mode"),
    (lambda: global_pooling(PoolMode.MAX, [[1.0, 2.0]]), ShapeError, "x"),
    (lambda: global_pooling(PoolMode.MAX, np.zeros((1, 1, 0))), ShapeError, "x"),
    (lambda: global_pooling(PoolMode.MAX, np.array([[[np.nan]]])), NonFiniteError, "x"),
    (lambda: global_pooling(PoolMode.AVERAGE, np.full((1, 1, 2, 2), 1e308)), NumericOverflow,
     "overflow"),
])
def test_global_pooling_errors(call, error, fragment):
    with pytest.raises(error, match=r"^global_pooling: ") as info:
        call()
    assert fragment in str(info.value)


# --------------------------------------------------------------------------- torch peer
@given(pool_cases())
def test_pooling_matches_torch(case):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    mode, k, s, p, x = case
    r = x.ndim - 2
    if any(p[a] > k[a] // 2 for a in range(r)):
        return  # beyond PyTorch's padding limit (covered by the reference test)
    if any(x.shape[2 + a] < k[a] for a in range(r)):
        return  # PyTorch rejects a window larger than the unpadded input (3-D average pooling)
    t = torch.from_numpy(x.copy())
    if mode is PoolMode.MAX:
        ref = [F.max_pool1d, F.max_pool2d, F.max_pool3d][r - 1](t, k, s, p).numpy()
    else:
        ref = [F.avg_pool1d, F.avg_pool2d, F.avg_pool3d][r - 1](t, k, s, p, count_include_pad=False).numpy()
    check(pooling(mode, k, s, p, x), ref, x, mode, sides=2)


@given(adaptive_cases())
def test_adaptive_pooling_matches_torch(case):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    mode, out, x = case
    r = x.ndim - 2
    t = torch.from_numpy(x.copy())
    fn = ([F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d] if mode is PoolMode.MAX
          else [F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d])[r - 1]
    check(adaptive_pooling(mode, out, x), fn(t, out).numpy(), x, mode, sides=2)


# --------------------------------------------------------------------------- determinism
def test_bitwise_identical_for_1_and_2_threads():
    assert_same_across_threads("""
        import sys
        import numpy as np
        from hmath_dl.layers import PoolMode, pooling, adaptive_pooling, global_pooling
        x = np.random.default_rng(0).standard_normal((3, 8, 21, 19))
        for mode in PoolMode:
            for o in (pooling(mode, 3, 2, 1, x), adaptive_pooling(mode, (5, 7), x), global_pooling(mode, x)):
                sys.stdout.buffer.write(o.tobytes())
    """)


def test_adaptive_output_larger_than_a_unit_axis():
    """Regression: a unit leading axis with more than one output bin (bins [0, 1) repeated)."""
    x = np.random.default_rng(12).standard_normal((2, 3, 1, 4, 1))
    for mode in PoolMode:
        check(adaptive_pooling(mode, (2, 3, 3), x),
              adaptive_pool_reference(mode is PoolMode.MAX, x, (2, 3, 3)), x, mode)
    x2 = x.reshape(2, 3, 1, 4)
    for mode in PoolMode:
        check(adaptive_pooling(mode, (3, 2), x2), adaptive_pool_reference(mode is PoolMode.MAX, x2, (3, 2)), x2, mode)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_global_pooling_reports_any_nonfinite_input(shape):
    # every position of every plane is checked (MAX would otherwise skip -inf and NaN)
    rng = np.random.default_rng(11)
    for bad in (np.nan, np.inf, -np.inf):
        for _ in range(6):
            x = rng.standard_normal(shape)
            x[tuple(int(rng.integers(0, s)) for s in shape)] = bad
            for mode in PoolMode:
                with pytest.raises(NonFiniteError, match=r"^global_pooling: "):
                    global_pooling(mode, x)
    with pytest.raises(NumericOverflow, match=r"^global_pooling: "):
        global_pooling(PoolMode.AVERAGE, np.full(shape, 1e308))
    assert np.array_equal(global_pooling(PoolMode.MAX, np.full(shape, 1e308)),
                          np.full(shape[:2], 1e308))
