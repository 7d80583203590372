"""PyTorch-parity pooling (API.md section 8 "Pooling", "Unbatched inputs", section 0
"Empty batches"): dilation, ceil_mode, count_include_pad, divisor_override,
max_pooling_with_indices, max_unpooling, unbatched inputs, empty batches, and the _ad
twins pooling_ad / adaptive_pooling_ad / global_pooling_ad.

The oracles below are plain loops over output positions written from API.md's formulas,
independent of the kernels (no bounds arrays, no separable passes)."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hmath_dl import autodiff as ad
from hmath_dl.errors import (DomainError, IndexOutOfRange, MathError, NonFiniteError,
                             NumericOverflow, ShapeError)
from hmath_dl.layers import (PoolMode, adaptive_pooling, adaptive_pooling_ad, global_pooling,
                             global_pooling_ad, max_pooling_with_indices, max_unpooling,
                             pooling, pooling_ad)

MAX, AVG = PoolMode.MAX, PoolMode.AVERAGE
EPS = np.finfo(np.float64).eps
SETTINGS = settings(max_examples=60, deadline=None)


# =========================================================================== oracles
class AllPadding(Exception):
    """The oracle met a window with no real element that has no defined value."""


def out_size(S, k, s, p, d, ceil_mode):
    """API.md: floor((S + 2p - d(k-1) - 1)/s) + 1; ceil_mode: ceil, then minus one if the
    last window would start at or beyond S + p."""
    num = S + 2 * p - d * (k - 1) - 1
    if ceil_mode:
        o = math.ceil(num / s) + 1 if num >= 0 else -((-num) // s) + 1
        if (o - 1) * s >= S + p:
            o -= 1
        return o
    return num // s + 1


def pool_oracle(mode, x, k, s, p, d, ceil_mode=False, cip=False, div=None):
    """``(values, indices, exact_sums, abs_sums, divisors)`` by plain loops.  MAX: the first
    strictly-greater element in row-major window order (value and flat in-plane index)."""
    N, C = x.shape[:2]
    S = x.shape[2:]
    r = len(S)
    O = tuple(out_size(S[a], k[a], s[a], p[a], d[a], ceil_mode) for a in range(r))
    assert all(o >= 1 for o in O)
    vals = np.zeros((N, C) + O)
    idx = np.zeros((N, C) + O, dtype=np.int64)
    absum = np.zeros((N, C) + O)
    for n, c in itertools.product(range(N), range(C)):
        plane = x[n, c]
        for o in itertools.product(*[range(v) for v in O]):
            real, padded = [], 0
            for j in itertools.product(*[range(v) for v in k]):
                t = tuple(o[a] * s[a] - p[a] + j[a] * d[a] for a in range(r))
                if all(0 <= t[a] < S[a] for a in range(r)):
                    real.append(t)
                if all(-p[a] <= t[a] < S[a] + p[a] for a in range(r)):
                    padded += 1
            if mode is MAX:
                if not real:
                    raise AllPadding
                best = real[0]
                for t in real[1:]:
                    if plane[t] > plane[best]:
                        best = t
                vals[(n, c) + o] = plane[best]
                idx[(n, c) + o] = np.ravel_multi_index(best, S)
            else:
                if div is not None:
                    divisor = div
                elif cip:
                    divisor = padded
                else:
                    divisor = len(real)
                if divisor == 0:
                    raise AllPadding
                terms = [plane[t] for t in real]
                vals[(n, c) + o] = math.fsum(terms) / divisor
                absum[(n, c) + o] = (math.fsum(abs(v) for v in terms) + 1.0) / divisor
    return vals, idx, absum


def assert_pool_close(got, mode, ref, absum):
    assert got.dtype == np.float64 and got.flags.c_contiguous and got.shape == ref.shape
    if mode is MAX:
        assert np.array_equal(got, ref)
    else:
        # a sum of <= 27 terms in any order: error <= 27 eps sum|terms| (+ 1 ulp division)
        assert np.all(np.abs(got - ref) <= 30 * EPS * absum)


def unpool_oracle(values, indices, output_size):
    N, C = values.shape[:2]
    M = int(np.prod(output_size))
    out = np.zeros((N, C, M))
    for n, c in itertools.product(range(N), range(C)):
        for v, i in zip(values[n, c].reshape(-1), indices[n, c].reshape(-1)):
            out[n, c, i] = v
    return out.reshape((N, C) + tuple(output_size))


def adaptive_oracle(mode, x, out):
    S = x.shape[2:]
    r = len(S)
    y = np.zeros(x.shape[:2] + tuple(out))
    for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for o in itertools.product(*[range(v) for v in out]):
            box = tuple(slice((o[a] * S[a]) // out[a], -((-(o[a] + 1) * S[a]) // out[a]))
                        for a in range(r))
            w = x[n, c][box].reshape(-1)
            y[(n, c) + o] = w.max() if mode is MAX else math.fsum(w) / w.size
    return y


# =========================================================================== strategies
@st.composite
def window_cases(draw, mode=None, ties=False, torch_ok=False):
    """Random geometry for rank 1-3 with every option; padding may exceed k/2 unless
    ``torch_ok``."""
    rank = draw(st.integers(1, 3))
    mode = draw(st.sampled_from([MAX, AVG])) if mode is None else mode
    k = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    s = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    dil = mode is MAX or not torch_ok
    d = tuple(draw(st.integers(1, 3)) if dil else 1 for _ in range(rank))
    p = tuple(draw(st.integers(0, k[a] // 2 if torch_ok else k[a] * d[a])) for a in range(rank))
    top = 6 if rank < 3 else 4
    S = tuple(draw(st.integers(1, top)) for _ in range(rank))
    ceil_mode = draw(st.booleans())
    cip = mode is AVG and draw(st.booleans())
    div = draw(st.sampled_from([None, None, 1, 2, 7])) if mode is AVG else None
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) + S
    if ties:
        x = g.choice(np.array([-1.0, -0.0, 0.0, 1.0, 2.0]), size=shape)
    else:
        x = g.standard_normal(shape)
    return mode, k, s, p, d, ceil_mode, cip, div, x


def geometry_ok(k, s, p, d, ceil_mode, S):
    return all(out_size(S[a], k[a], s[a], p[a], d[a], ceil_mode) >= 1 for a in range(len(S)))


def kw(d, ceil_mode, cip, div):
    return dict(dilation=d, ceil_mode=ceil_mode, count_include_pad=cip, divisor_override=div)


# =========================================================================== vs the oracle
@SETTINGS
@given(window_cases())
def test_pooling_options_match_oracle(case):
    mode, k, s, p, d, ceil_mode, cip, div, x = case
    if not geometry_ok(k, s, p, d, ceil_mode, x.shape[2:]):
        with pytest.raises(ShapeError, match=r"^pooling: output size"):
            pooling(mode, k, s, p, x, **kw(d, ceil_mode, cip, div))
        return
    try:
        ref, _, absum = pool_oracle(mode, x, k, s, p, d, ceil_mode, cip, div)
    except AllPadding:
        with pytest.raises(DomainError, match=r"^pooling: window .* covers only padding"):
            pooling(mode, k, s, p, x, **kw(d, ceil_mode, cip, div))
        return
    got = pooling(mode, k, s, p, x, **kw(d, ceil_mode, cip, div))
    assert_pool_close(got, mode, ref, absum)


@SETTINGS
@given(window_cases(mode=MAX, ties=True))
def test_max_pooling_with_indices_matches_oracle(case):
    _, k, s, p, d, ceil_mode, _, _, x = case
    S = x.shape[2:]
    if not geometry_ok(k, s, p, d, ceil_mode, S):
        return
    try:
        ref, ref_idx, _ = pool_oracle(MAX, x, k, s, p, d, ceil_mode)
    except AllPadding:
        with pytest.raises(DomainError, match=r"^max_pooling_with_indices: .*only padding"):
            max_pooling_with_indices(k, s, p, x, dilation=d, ceil_mode=ceil_mode)
        return
    values, indices = max_pooling_with_indices(k, s, p, x, dilation=d, ceil_mode=ceil_mode)
    assert indices.dtype == np.int64 and indices.shape == values.shape
    assert np.array_equal(indices, ref_idx)          # first maximum, row-major
    assert np.array_equal(values, ref)
    # values are pooling(MAX)'s bit for bit (the sign of a zero included)
    plain = pooling(MAX, k, s, p, x, dilation=d, ceil_mode=ceil_mode)
    assert values.tobytes() == plain.tobytes()
    # and the element the index names holds that value
    planes = x.reshape(x.shape[:2] + (-1,))
    picked = np.take_along_axis(planes, indices.reshape(indices.shape[:2] + (-1,)), axis=2)
    assert np.array_equal(picked.reshape(values.shape), values)


@SETTINGS
@given(window_cases(mode=MAX, ties=True), st.integers(0, 3))
def test_max_unpooling_matches_oracle(case, extra):
    _, k, s, p, d, ceil_mode, _, _, x = case
    S = x.shape[2:]
    if not geometry_ok(k, s, p, d, ceil_mode, S):
        return
    try:
        values, indices = max_pooling_with_indices(k, s, p, x, dilation=d, ceil_mode=ceil_mode)
    except DomainError:
        return
    size = tuple(v + extra for v in S)   # a bigger plane is fine as long as indices fit
    size = size[:-1] + (S[-1],) if extra else size
    M = int(np.prod(size))
    ind = np.array(indices) % M
    got = max_unpooling(values, ind, size)
    assert got.shape == x.shape[:2] + size and got.dtype == np.float64
    assert got.tobytes() == unpool_oracle(values, ind, size).tobytes()


# =========================================================================== hand-derived cases
X5 = [[[1.0, 2.0, 3.0, 4.0, 5.0]]]


def test_ceil_mode_partial_last_window_1d():
    # S=5 k=2 s=2 p=0: floor gives 2 windows, ceil 3; the third window [4, 6) reads 4 only
    assert np.array_equal(pooling(MAX, 2, 2, 0, X5), [[[2.0, 4.0]]])
    assert np.array_equal(pooling(MAX, 2, 2, 0, X5, ceil_mode=True), [[[2.0, 4.0, 5.0]]])
    assert np.array_equal(pooling(AVG, 2, 2, 0, X5, ceil_mode=True), [[[1.5, 3.5, 5.0]]])
    # position 5 lies past the padded extent [0, 5): not counted even with count_include_pad
    assert np.array_equal(pooling(AVG, 2, 2, 0, X5, ceil_mode=True, count_include_pad=True),
                          [[[1.5, 3.5, 5.0]]])


def test_ceil_mode_window_reaching_into_padding():
    # S=5 k=3 s=2 p=1 ceil: windows start at -1, 1, 3; the last reads 3, 4 and pad 5
    assert np.array_equal(pooling(AVG, 3, 2, 1, X5, ceil_mode=True), [[[1.5, 3.0, 4.5]]])
    assert np.array_equal(pooling(AVG, 3, 2, 1, X5, ceil_mode=True, count_include_pad=True),
                          [[[1.0, 3.0, 3.0]]])
    assert np.array_equal(pooling(AVG, 3, 2, 1, X5, ceil_mode=True, divisor_override=2),
                          [[[1.5, 4.5, 4.5]]])


def test_ceil_mode_drops_a_window_that_would_start_in_the_padding():
    # S=3 k=2 s=2 p=1: ceil((3+2-1-1)/2)+1 = 3, but window 2 would start at 3 >= S (it
    # would read only padding), (3-1)*2 >= S + p, so it is dropped: 2 outputs.
    x = [[[1.0, 2.0, 3.0]]]
    assert np.array_equal(pooling(MAX, 2, 2, 1, x, ceil_mode=True), [[[1.0, 3.0]]])
    assert np.array_equal(pooling(AVG, 2, 2, 1, x, ceil_mode=True, count_include_pad=True),
                          [[[0.5, 2.5]]])
    assert out_size(3, 2, 2, 1, 1, True) == 2
    # not dropped when it starts inside: S=4 -> window 2 starts at 3 < 4
    assert pooling(MAX, 2, 2, 1, [[[1.0, 2.0, 3.0, 4.0]]], ceil_mode=True).shape == (1, 1, 3)


def test_dilation_1d():
    x = [[[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]]
    # k=3 d=2: window o reads o, o+2, o+4 -> 3 outputs
    assert np.array_equal(pooling(MAX, 3, 1, 0, x, dilation=2), [[[4.0, 5.0, 6.0]]])
    assert np.array_equal(pooling(AVG, 3, 1, 0, x, dilation=2), [[[2.0, 3.0, 4.0]]])
    # padding 1, stride 3: floor((7 + 2 - 4 - 1)/3) + 1 = 2 windows, reading {-1 (pad), 1, 3}
    # and {2, 4, 6}; with ceil_mode a third would start at 5 and read 5 and pad 7, 9 (past)
    assert np.array_equal(pooling(AVG, 3, 3, 1, x, dilation=2), [[[2.0, 4.0]]])
    assert np.array_equal(pooling(AVG, 3, 3, 1, x, dilation=2, ceil_mode=True), [[[2.0, 4.0, 5.0]]])
    assert np.array_equal(pooling(AVG, 3, 3, 1, x, dilation=2, ceil_mode=True,
                                  count_include_pad=True), [[[4 / 3, 4.0, 2.5]]])
    v, i = max_pooling_with_indices(3, 3, 1, x, dilation=2, ceil_mode=True)
    assert np.array_equal(i, [[[3, 6, 5]]]) and np.array_equal(v, [[[3.0, 6.0, 5.0]]])


def test_dilated_window_without_a_real_element():
    # S=1 k=2 d=2 p=1: the only window reads positions -1 and 1, neither in [0, 1)
    x = [[[7.0]]]
    for mode in (MAX, AVG):
        with pytest.raises(DomainError, match=r"^pooling: window 0 along spatial axis 0 covers only padding"):
            pooling(mode, 2, 1, 1, x, dilation=2)
    assert np.array_equal(pooling(AVG, 2, 1, 1, x, dilation=2, count_include_pad=True), [[[0.0]]])
    assert np.array_equal(pooling(AVG, 2, 1, 1, x, dilation=2, divisor_override=3), [[[0.0]]])


def test_all_padding_windows_are_zero_with_count_include_pad_or_divisor():
    x = [[[3.0, 6.0, 9.0]]]
    # k=1 p=1: windows at -1 .. 3; the first and last read only padding
    with pytest.raises(DomainError, match="only padding"):
        pooling(AVG, 1, 1, 1, x)
    with pytest.raises(DomainError, match="only padding"):
        pooling(MAX, 1, 1, 1, x)
    assert np.array_equal(pooling(AVG, 1, 1, 1, x, count_include_pad=True),
                          [[[0.0, 3.0, 6.0, 9.0, 0.0]]])
    assert np.array_equal(pooling(AVG, 1, 1, 1, x, divisor_override=3),
                          [[[0.0, 1.0, 2.0, 3.0, 0.0]]])
    # 2-D: a window whose row is all padding is 0 even though its columns are real
    y = pooling(AVG, (1, 2), 1, (1, 0), np.ones((1, 1, 2, 3)), count_include_pad=True)
    assert np.array_equal(y[0, 0, 0], [0.0, 0.0]) and np.array_equal(y[0, 0, 1], [1.0, 1.0])


def test_count_include_pad_2d_and_divisor_precedence():
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    y = pooling(AVG, 3, 2, 1, x, count_include_pad=True)
    # window (0, 0): rows -1..1, cols -1..1: real 0, 1, 4, 5; divisor 9
    assert y[0, 0, 0, 0] == 10.0 / 9.0
    assert pooling(AVG, 3, 2, 1, x)[0, 0, 0, 0] == 10.0 / 4.0
    z = pooling(AVG, 3, 2, 1, x, count_include_pad=True, divisor_override=5)
    assert z[0, 0, 0, 0] == 10.0 / 5.0


def test_explicit_defaults_are_the_seed_behaviour():
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 8))
    for mode in (MAX, AVG):
        base = pooling(mode, 3, 2, 1, x)
        for opts in (dict(dilation=1), dict(dilation=(1, 1)), dict(ceil_mode=False),
                     dict(dilation=None, ceil_mode=False)):
            assert pooling(mode, 3, 2, 1, x, **opts).tobytes() == base.tobytes()
        if mode is AVG:
            assert pooling(mode, 3, 2, 1, x, count_include_pad=False).tobytes() == base.tobytes()
    # with no padding, count_include_pad changes nothing; ceil_mode changes nothing when exact
    assert (pooling(AVG, 3, 3, 0, x[:, :, :9, :6], count_include_pad=True).tobytes()
            == pooling(AVG, 3, 3, 0, x[:, :, :9, :6]).tobytes())
    assert (pooling(MAX, 3, 3, 0, x[:, :, :9, :6], ceil_mode=True).tobytes()
            == pooling(MAX, 3, 3, 0, x[:, :, :9, :6]).tobytes())


def test_indices_ties_and_signed_zeros():
    # ties go to the first maximum in row-major window order
    x = np.array([[[[1.0, 3.0], [3.0, 0.0]]]])
    v, i = max_pooling_with_indices(2, 1, 0, x)
    assert i.tolist() == [[[[1]]]] and v.tolist() == [[[[3.0]]]]
    # a zero maximum with both signs: the index names the first zero (row-major); the value
    # is bitwise pooling(MAX)'s
    for a, b in ((0.0, -0.0), (-0.0, 0.0)):
        x = np.array([[[[a, -1.0], [b, -2.0]]]])
        v, i = max_pooling_with_indices(2, 1, 0, x)
        assert i.tolist() == [[[[0]]]]
        assert v.tobytes() == pooling(MAX, 2, 1, 0, x).tobytes()


def test_max_unpooling_hand_cases():
    values = [[[5.0, 7.0, 9.0]]]
    assert np.array_equal(max_unpooling(values, [[[0, 3, 4]]], 6), [[[5.0, 0, 0, 7.0, 9.0, 0]]])
    # duplicates: the later one in row-major order wins
    assert np.array_equal(max_unpooling(values, [[[2, 2, 1]]], (4,)), [[[0, 9.0, 7.0, 0]]])
    assert np.array_equal(max_unpooling(values, [[[2, 1, 2]]], (4,)), [[[0, 7.0, 9.0, 0]]])
    # 2-D: indices are flat within each plane
    vals = np.array([[[[1.0, 2.0]], [[3.0, 4.0]]]])
    idx = np.array([[[[0, 5]], [[5, 1]]]])
    got = max_unpooling(vals, idx, (2, 3))
    assert np.array_equal(got, [[[[1, 0, 0], [0, 0, 2]], [[0, 4, 0], [0, 0, 3]]]])
    # empty values plane: all zeros
    assert np.array_equal(max_unpooling(np.zeros((1, 2, 0)), np.zeros((1, 2, 0), dtype=int), 3),
                          np.zeros((1, 2, 3)))
    # pooling then unpooling keeps each window's winner (the torch round trip)
    x = np.random.default_rng(3).standard_normal((2, 3, 6, 6))
    v, i = max_pooling_with_indices(2, 2, 0, x)
    u = max_unpooling(v, i, (6, 6))
    assert np.array_equal(pooling(MAX, 2, 2, 0, u), v)
    assert np.count_nonzero(u) == v.size


# =========================================================================== unbatched, empty
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_unbatched_equals_batched_first_item(rank):
    g = np.random.default_rng(rank)
    S = (7, 6, 5)[:rank]
    x = g.standard_normal((3,) + S)
    xb = x[None]
    k, s, p, d = (3,) * rank, (2,) * rank, (1,) * rank, (2, 1, 1)[:rank]
    for mode in (MAX, AVG):
        for opts in (dict(), dict(ceil_mode=True), dict(dilation=d)):
            if mode is AVG:
                opts = dict(opts, count_include_pad=True)
            got = pooling(mode, k, s, p, x, **opts)
            assert got.shape == (3,) + got.shape[1:] and got.flags.c_contiguous
            assert got.tobytes() == pooling(mode, k, s, p, xb, **opts)[0].tobytes()
            gad = pooling_ad(mode, k, s, p, ad.variable(x), **opts)
            assert gad.value.tobytes() == got.tobytes()
        out = (2, 3, 4)[:rank]
        a = adaptive_pooling(mode, out, x)
        assert a.tobytes() == adaptive_pooling(mode, out, xb)[0].tobytes()
        assert adaptive_pooling_ad(mode, out, x).value.tobytes() == a.tobytes()
    v, i = max_pooling_with_indices(k, s, p, x, dilation=d)
    vb, ib = max_pooling_with_indices(k, s, p, xb, dilation=d)
    assert v.tobytes() == vb[0].tobytes() and i.tobytes() == ib[0].tobytes()
    u = max_unpooling(v, i, S)
    assert u.shape == (3,) + S and u.tobytes() == max_unpooling(vb, ib, S)[0].tobytes()
    # an int window always means batched: the same x is then [N=3, C=S0, *S1:]
    if rank == 2:
        assert pooling(MAX, 1, 1, 0, x).shape == x.shape


def test_unbatched_gradients_match_batched():
    x = np.random.default_rng(5).standard_normal((2, 5, 6))
    cot = np.random.default_rng(6).standard_normal((2, 3, 4))
    for mode in (MAX, AVG):
        v = ad.variable(x)
        vb = ad.variable(x[None])
        (g,) = ad.gradients(pooling_ad(mode, (3, 3), 2, 1, v, ceil_mode=True), [v], cot)
        (gb,) = ad.gradients(pooling_ad(mode, (3, 3), 2, 1, vb, ceil_mode=True), [vb], cot[None])
        assert g.shape == x.shape and g.tobytes() == gb[0].tobytes()


EMPTY_CASES = [
    (lambda x: pooling(MAX, 3, 2, 1, x), (2, 4, 4)),
    (lambda x: pooling(AVG, 3, 2, 1, x, ceil_mode=True, count_include_pad=True), (2, 4, 5)),
    (lambda x: pooling(MAX, 2, 1, 1, x, dilation=2), (2, 7, 8)),
    (lambda x: pooling(AVG, 2, 2, 0, x, divisor_override=3), (2, 3, 4)),
    (lambda x: max_pooling_with_indices(3, 2, 1, x)[0], (2, 4, 4)),
    (lambda x: max_pooling_with_indices(3, 2, 1, x)[1], (2, 4, 4)),
    (lambda x: adaptive_pooling(AVG, (2, 5), x), (2, 2, 5)),
    (lambda x: adaptive_pooling(MAX, 3, x), (2, 3, 3)),
    (lambda x: global_pooling(AVG, x), (2,)),
    (lambda x: global_pooling(MAX, x), (2,)),
]


@pytest.mark.parametrize("fn, tail", EMPTY_CASES)
@pytest.mark.parametrize("N, C", [(0, 2), (3, 0), (0, 0)])
def test_empty_batch_and_channels_give_empty_results(fn, tail, N, C):
    x = np.zeros((N, C, 7, 8))
    got = fn(x)
    assert got.shape == (N, C) + tail[1:]      # tail[0] stands for C
    assert got.size == 0 and got.flags.c_contiguous


def test_empty_batch_checks_parameters_like_a_full_one():
    x = np.zeros((0, 2, 4, 4))
    with pytest.raises(DomainError, match="only padding"):
        pooling(MAX, 2, 2, 2, x)
    with pytest.raises(ShapeError, match="output size"):
        pooling(MAX, 5, 1, 0, x)
    with pytest.raises(DomainError, match="count_include_pad"):
        pooling(MAX, 2, 2, 0, x, count_include_pad=True)
    with pytest.raises(ShapeError, match="bytes"):
        pooling(MAX, 1, 1, 10**12, x)


def test_empty_unpooling_and_ad_twins():
    assert max_unpooling(np.zeros((0, 3, 2)), np.zeros((0, 3, 2), dtype=np.int64), 5).shape == (0, 3, 5)
    assert max_unpooling(np.zeros((2, 0, 2)), np.zeros((2, 0, 2), dtype=np.int64), (5,)).shape == (2, 0, 5)
    x = np.zeros((0, 2, 6, 5))
    for mode in (MAX, AVG):
        for fn in (lambda v: pooling_ad(mode, 3, 2, 1, v, ceil_mode=True),
                   lambda v: pooling_ad(mode, 2, 1, 0, v, dilation=2),
                   lambda v: adaptive_pooling_ad(mode, (2, 3), v),
                   lambda v: global_pooling_ad(mode, v)):
            v = ad.variable(x)
            y = fn(v)
            assert y.size == 0 and y.shape[:2] == (0, 2)
            (g,) = ad.gradients(y, [v], np.zeros(y.shape))
            assert g.shape == x.shape


def test_empty_spatial_axis_is_a_shape_error():
    for call in (lambda: pooling(MAX, 1, 1, 0, np.zeros((1, 1, 0, 3))),
                 lambda: pooling(AVG, 1, 1, 1, np.zeros((1, 1, 0)), count_include_pad=True),
                 lambda: pooling(MAX, (1,), 1, 0, np.zeros((2, 0))),
                 lambda: max_pooling_with_indices(1, 1, 0, np.zeros((0, 1, 0))),
                 lambda: adaptive_pooling(AVG, 2, np.zeros((1, 1, 3, 0))),
                 lambda: global_pooling(MAX, np.zeros((0, 1, 0)))):
        with pytest.raises(ShapeError, match="empty spatial axis"):
            call()


# =========================================================================== errors
X = np.zeros((1, 2, 4, 4))


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: pooling(MAX, 2, 2, 0, X, count_include_pad=True), DomainError, "count_include_pad"),
    (lambda: pooling(MAX, 2, 2, 0, X, divisor_override=2), DomainError, "divisor_override"),
    (lambda: pooling(AVG, 2, 2, 0, X, divisor_override=0), DomainError, "divisor_override"),
    (lambda: pooling(AVG, 2, 2, 0, X, divisor_override=-3), DomainError, "divisor_override"),
    (lambda: pooling(AVG, 2, 2, 0, X, divisor_override=2**63), DomainError, "divisor_override"),
    (lambda: pooling(AVG, 2, 2, 0, X, divisor_override=2.0), TypeError, "divisor_override"),
    (lambda: pooling(AVG, 2, 2, 0, X, divisor_override=True), TypeError, "divisor_override"),
    (lambda: pooling(MAX, 2, 2, 0, X, dilation=0), DomainError, "dilation"),
    (lambda: pooling(MAX, 2, 2, 0, X, dilation=(1, -1)), DomainError, "dilation"),
    (lambda: pooling(MAX, 2, 2, 0, X, dilation=(1, 1, 1)), ShapeError, "dilation"),
    (lambda: pooling(MAX, 2, 2, 0, X, dilation=1.5), TypeError, "dilation"),
    (lambda: pooling(MAX, 2, 2, 0, X, ceil_mode=1), TypeError, "ceil_mode"),
    (lambda: pooling(AVG, 2, 2, 0, X, count_include_pad="yes"), TypeError, "count_include_pad"),
    (lambda: pooling(MAX, 3, 1, 0, X, dilation=2), ShapeError, "output size"),
    (lambda: pooling(MAX, 3, 1, 0, X, dilation=2, ceil_mode=True), DomainError, "output size"),
    (lambda: pooling(MAX, 1, 1, 1, X, ceil_mode=True), DomainError, "only padding"),
    (lambda: pooling(AVG, 2, 1, 2, X, dilation=5), DomainError, "window 1 along spatial axis 0 covers only padding"),
    (lambda: pooling(MAX, (2, 2), 2, 0, np.zeros((4,))), ShapeError, "x"),
    (lambda: pooling(MAX, (2, 2), 2, 0, np.zeros((1, 1, 1, 4, 4))), ShapeError, "x"),
    (lambda: pooling(MAX, (2, 2, 2, 2), 2, 0, np.zeros((1,) * 6)), ShapeError, "window"),
    (lambda: pooling(MAX, (), 2, 0, X), ShapeError, "window"),
    (lambda: pooling(MAX, (2, 2.0), 2, 0, X), TypeError, "window"),
    (lambda: pooling(MAX, 2, 2, 0, np.zeros((3, 4))), ShapeError, "x"),
    (lambda: pooling(MAX, (2,), (2, 2), 0, np.zeros((3, 4))), ShapeError, "stride"),
    (lambda: pooling(AVG, (2,), 1, 0, np.full((1, 3), np.inf)), NonFiniteError, "x"),
    (lambda: pooling(AVG, 2, 1, 0, np.full((1, 1, 3), 1e308), divisor_override=1), NumericOverflow,
     "overflow"),
    (lambda: pooling(AVG, 2, 1, 0, np.full((1, 1, 3), 1e308), count_include_pad=True),
     NumericOverflow, "overflow"),
])
def test_pooling_option_errors(call, error, fragment):
    with pytest.raises(error, match=r"^pooling: ") as info:
        call()
    assert fragment in str(info.value)


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: max_pooling_with_indices(0, 1, 0, X), DomainError, "window"),
    (lambda: max_pooling_with_indices(2, 0, 0, X), DomainError, "stride"),
    (lambda: max_pooling_with_indices(2, 1, -1, X), DomainError, "padding"),
    (lambda: max_pooling_with_indices(2, 1, 0, X, dilation=0), DomainError, "dilation"),
    (lambda: max_pooling_with_indices(2, 1, 0, X, ceil_mode=None), TypeError, "ceil_mode"),
    (lambda: max_pooling_with_indices(2, 2, 2, X), DomainError, "only padding"),
    (lambda: max_pooling_with_indices(5, 1, 0, X), ShapeError, "output size"),
    (lambda: max_pooling_with_indices(2, 1, 0, np.zeros((2, 4))), ShapeError, "x"),
    (lambda: max_pooling_with_indices(2, 1, 0, "x"), TypeError, "x"),
    (lambda: max_pooling_with_indices(2, 1, 0, np.full((1, 1, 3), np.nan)), NonFiniteError, "x"),
    (lambda: max_pooling_with_indices(1, 3, 0, np.array([[[0.0, 1.0, 2.0, np.inf]]])),
     NonFiniteError, "x"),
    (lambda: max_pooling_with_indices(1, 1, 10**12, X), ShapeError, "bytes"),
])
def test_max_pooling_with_indices_errors(call, error, fragment):
    with pytest.raises(error, match=r"^max_pooling_with_indices: ") as info:
        call()
    assert fragment in str(info.value)


V3 = np.ones((1, 2, 3))
I3 = np.zeros((1, 2, 3), dtype=np.int64)


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: max_unpooling(V3, I3 + 5, 5), IndexOutOfRange, "indices[0, 0, 0] = 5"),
    (lambda: max_unpooling(V3, I3 - 1, 5), IndexOutOfRange, "outside"),
    (lambda: max_unpooling(V3, np.array([[[0, 1, 2], [0, 9, 0]]]), 4), IndexOutOfRange,
     "indices[0, 1, 1] = 9"),
    (lambda: max_unpooling(V3, I3[..., :2], 5), ShapeError, "same shape"),
    (lambda: max_unpooling(V3, I3.astype(float), 5), TypeError, "indices"),
    (lambda: max_unpooling(V3, I3.astype(bool), 5), TypeError, "indices"),
    (lambda: max_unpooling(V3, I3, 0), DomainError, "output_size"),
    (lambda: max_unpooling(V3, I3, (4, 0)), DomainError, "output_size"),
    (lambda: max_unpooling(V3, I3, (4, 4, 4)), ShapeError, "values"),
    (lambda: max_unpooling(V3, I3, 2.5), TypeError, "output_size"),
    (lambda: max_unpooling(np.ones((2, 3)), np.zeros((2, 3), dtype=int), 4), ShapeError, "values"),
    (lambda: max_unpooling(V3 * np.nan, I3, 4), NonFiniteError, "values"),
    (lambda: max_unpooling("v", I3, 4), TypeError, "values"),
    (lambda: max_unpooling(V3, I3, 10**12), ShapeError, "bytes"),
])
def test_max_unpooling_errors(call, error, fragment):
    with pytest.raises(error, match=r"^max_unpooling: ") as info:
        call()
    assert fragment in str(info.value)
    if error is IndexOutOfRange:
        assert isinstance(info.value, IndexError) and isinstance(info.value, MathError)


def test_max_unpooling_unbatched_tuple_rule():
    # a 2-entry output_size with 3-D values: unbatched [C, *O]
    u = max_unpooling(np.ones((2, 1, 2)), np.array([[[0, 3]], [[1, 2]]]), (2, 2))
    assert u.shape == (2, 2, 2)
    assert np.array_equal(u, [[[1, 0], [0, 1]], [[0, 1], [1, 0]]])


@pytest.mark.parametrize("call, error, prefix", [
    (lambda: pooling_ad(MAX, 2, 2, 0, X, count_include_pad=True), DomainError, "pooling_ad: pooling:"),
    (lambda: pooling_ad(AVG, 2, 2, 0, X, divisor_override=0), DomainError, "pooling_ad: pooling:"),
    (lambda: pooling_ad(MAX, 2, 2, 0, X, dilation=0), DomainError, "pooling_ad: pooling:"),
    (lambda: pooling_ad(MAX, 1, 1, 1, X, ceil_mode=True), DomainError, "pooling_ad: pooling:"),
    (lambda: pooling_ad(MAX, 2, 2, 0, None), TypeError, "pooling_ad:"),
    (lambda: pooling_ad(MAX, 2, 2, 0, X, ceil_mode="no"), TypeError, "pooling_ad: pooling:"),
    (lambda: adaptive_pooling_ad("max", 2, X), TypeError, "adaptive_pooling_ad: adaptive_pooling:"),
    (lambda: adaptive_pooling_ad(MAX, 0, X), DomainError, "adaptive_pooling_ad: adaptive_pooling:"),
    (lambda: adaptive_pooling_ad(MAX, 2, np.zeros((2, 2))), ShapeError, "adaptive_pooling_ad:"),
    (lambda: adaptive_pooling_ad(MAX, 2, np.full((1, 1, 2), np.nan)), NonFiniteError, "adaptive_pooling_ad:"),
    (lambda: global_pooling_ad(None, X), TypeError, "global_pooling_ad: global_pooling:"),
    (lambda: global_pooling_ad(AVG, np.zeros((1, 2))), ShapeError, "global_pooling_ad:"),
    (lambda: global_pooling_ad(AVG, np.full((1, 1, 2), 1e308)), NumericOverflow, "global_pooling_ad:"),
    (lambda: global_pooling_ad(AVG, "x"), TypeError, "global_pooling_ad:"),
])
def test_ad_twin_errors(call, error, prefix):
    with pytest.raises(error) as info:
        call()
    assert str(info.value).startswith(prefix), str(info.value)


def test_inputs_not_mutated_and_array_likes_accepted():
    g = np.random.default_rng(8)
    x = g.standard_normal((2, 3, 7, 6))
    keep = x.copy()
    ro = x.copy()
    ro.flags.writeable = False
    for mode in (MAX, AVG):
        opts = dict(ceil_mode=True, dilation=(2, 1))
        ref = pooling(mode, 3, 2, 1, x, **opts)
        for v in (ro, np.asfortranarray(x), x.tolist(), x[:, :, ::-1][:, :, ::-1]):
            assert pooling(mode, 3, 2, 1, v, **opts).tobytes() == ref.tobytes()
    v, i = max_pooling_with_indices(3, 2, 1, ro, ceil_mode=True)
    vr, ir = v.copy(), i.copy()
    vro, iro = v.copy(), i.copy()
    vro.flags.writeable = False
    iro.flags.writeable = False
    u = max_unpooling(vro, iro.astype(np.int32), (7, 6))
    assert np.array_equal(v, vr) and np.array_equal(i, ir)
    assert u.tobytes() == max_unpooling(v.tolist(), i.tolist(), [7, 6]).tobytes()
    assert np.array_equal(x, keep)


# =========================================================================== torch peer
@SETTINGS
@given(window_cases(torch_ok=True))
def test_pooling_options_match_torch(case):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    mode, k, s, p, d, ceil_mode, cip, div, x = case
    r = x.ndim - 2
    S = x.shape[2:]
    if not geometry_ok(k, s, p, d, ceil_mode, S):
        return
    t = torch.from_numpy(x.copy())
    if mode is MAX:
        fn = [F.max_pool1d, F.max_pool2d, F.max_pool3d][r - 1]
        ref, ref_i = fn(t, k, s, p, d, ceil_mode=ceil_mode, return_indices=True)
        try:
            got, got_i = max_pooling_with_indices(k, s, p, x, dilation=d, ceil_mode=ceil_mode)
        except DomainError:
            # a dilated window with no real element: torch returns -inf, the contract raises
            assert np.isneginf(ref.numpy()).any()
            return
        assert not np.isneginf(ref.numpy()).any()
        assert np.array_equal(got, ref.numpy())
        assert np.array_equal(got_i, ref_i.numpy())
        assert pooling(MAX, k, s, p, x, dilation=d, ceil_mode=ceil_mode).tobytes() == got.tobytes()
        # and back: torch's max_unpool with our indices
        if all(d_ == 1 for d_ in d):
            un = [F.max_unpool1d, F.max_unpool2d, F.max_unpool3d][r - 1]
            tu = un(ref, ref_i, k, s, p, output_size=S).numpy()
            assert np.array_equal(max_unpooling(got, got_i, S), tu)
    else:
        if r == 3 and any(S[a] < k[a] for a in range(r)):
            return  # PyTorch's avg_pool3d rejects a window larger than the unpadded input
        fn = [F.avg_pool1d, F.avg_pool2d, F.avg_pool3d][r - 1]
        extra = {} if div is None or r == 1 else dict(divisor_override=div)
        if div is not None and r == 1:
            return  # avg_pool1d has no divisor_override
        ref = fn(t, k, s, p, ceil_mode=ceil_mode, count_include_pad=cip, **extra).numpy()
        try:
            got = pooling(AVG, k, s, p, x, ceil_mode=ceil_mode, count_include_pad=cip,
                          divisor_override=div)
        except DomainError:
            # torch averages a window of pure padding to 0 by dividing by its count; the
            # contract makes that an error (no real element, no padded divisor)
            assert not cip and div is None
            return
        bound = 2 * 30 * EPS * np.abs(x).max() * max(1.0, 27.0 / (div or 1))
        assert np.all(np.abs(got - ref) <= bound)


@SETTINGS
@given(window_cases(mode=MAX, ties=True, torch_ok=True))
def test_max_pooling_ties_match_torch_indices(case):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    _, k, s, p, d, ceil_mode, _, _, x = case
    r = x.ndim - 2
    if not _grad_case_ok(MAX, k, s, p, d, ceil_mode, False, None, x.shape[2:]):
        return
    fn = [F.max_pool1d, F.max_pool2d, F.max_pool3d][r - 1]
    ref, ref_i = fn(torch.from_numpy(x.copy()), k, s, p, d, ceil_mode=ceil_mode, return_indices=True)
    got, got_i = max_pooling_with_indices(k, s, p, x, dilation=d, ceil_mode=ceil_mode)
    assert np.array_equal(got_i, ref_i.numpy())     # the same first maximum as torch
    assert np.array_equal(got, ref.numpy())


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(0, 2**32 - 1), st.data())
def test_adaptive_and_global_match_torch_and_oracle(r, seed, data):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    S = tuple(data.draw(st.integers(1, 6 if r < 3 else 4)) for _ in range(r))
    out = tuple(data.draw(st.integers(1, 7 if r < 3 else 4)) for _ in range(r))
    x = np.random.default_rng(seed).standard_normal((2, 2) + S)
    t = torch.from_numpy(x.copy())
    for mode in (MAX, AVG):
        fn = ([F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d] if mode is MAX
              else [F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d])[r - 1]
        got = adaptive_pooling(mode, out, x)
        for ref, sides in ((fn(t, out).numpy(), 2), (adaptive_oracle(mode, x, out), 1)):
            if mode is MAX:
                assert np.array_equal(got, ref)
            else:
                assert np.all(np.abs(got - ref) <= sides * 30 * EPS * np.abs(x).max())
        gp = global_pooling(mode, x)
        ref = t.amax(dim=tuple(range(2, 2 + r))) if mode is MAX else t.mean(dim=tuple(range(2, 2 + r)))
        assert np.allclose(gp, ref.numpy(), rtol=0, atol=1e-14)


# =========================================================================== gradients
def _grad_case_ok(mode, k, s, p, d, ceil_mode, cip, div, S):
    if not geometry_ok(k, s, p, d, ceil_mode, S):
        return False
    try:
        pool_oracle(mode, np.zeros((1, 1) + S), k, s, p, d, ceil_mode, cip, div)
    except AllPadding:
        return False
    return True


@settings(max_examples=25, deadline=None)
@given(window_cases())
def test_pooling_ad_gradients_with_options(case):
    mode, k, s, p, d, ceil_mode, cip, div, x = case
    if not _grad_case_ok(mode, k, s, p, d, ceil_mode, cip, div, x.shape[2:]):
        return
    opts = kw(d, ceil_mode, cip, div)
    y = pooling_ad(mode, k, s, p, ad.variable(x), **opts)
    assert y.value.tobytes() == pooling(mode, k, s, p, x, **opts).tobytes()
    ad.check_gradients(lambda v: pooling_ad(mode, k, s, p, v, **opts), [x])


@settings(max_examples=25, deadline=None)
@given(window_cases(mode=MAX, ties=True))
def test_pooling_ad_max_gradient_goes_to_the_indexed_element(case):
    _, k, s, p, d, ceil_mode, _, _, x = case
    if not _grad_case_ok(MAX, k, s, p, d, ceil_mode, False, None, x.shape[2:]):
        return
    v = ad.variable(x)
    y = pooling_ad(MAX, k, s, p, v, dilation=d, ceil_mode=ceil_mode)
    cot = np.random.default_rng(0).standard_normal(y.shape)
    (g,) = ad.gradients(y, [v], cot)
    _, idx = max_pooling_with_indices(k, s, p, x, dilation=d, ceil_mode=ceil_mode)
    want = np.zeros(x.shape[:2] + (int(np.prod(x.shape[2:])),))
    for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for gv, i in zip(cot[n, c].reshape(-1), idx[n, c].reshape(-1)):
            want[n, c, i] += gv          # row-major output order, as documented
    assert g.tobytes() == want.reshape(x.shape).tobytes()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.sampled_from([MAX, AVG]), st.integers(0, 2**32 - 1), st.data())
def test_adaptive_and_global_pooling_ad_gradients(r, mode, seed, data):
    S = tuple(data.draw(st.integers(1, 5 if r < 3 else 3)) for _ in range(r))
    out = tuple(data.draw(st.integers(1, 6 if r < 3 else 3)) for _ in range(r))
    x = np.random.default_rng(seed).standard_normal((data.draw(st.integers(1, 2)), 2) + S)
    y = adaptive_pooling_ad(mode, out, ad.variable(x))
    assert y.value.tobytes() == adaptive_pooling(mode, out, x).tobytes()
    ad.check_gradients(lambda v: adaptive_pooling_ad(mode, out, v), [x])
    z = global_pooling_ad(mode, ad.variable(x))
    assert z.value.tobytes() == global_pooling(mode, x).tobytes()
    ad.check_gradients(lambda v: global_pooling_ad(mode, v), [x])


def test_hand_gradients():
    x = ad.variable(np.array([[[1.0, 3.0, 3.0, 0.0, 2.0]]]))
    # count_include_pad: every window position (padding included) counts, k=3 p=1 s=2
    y = pooling_ad(AVG, 3, 2, 1, x, count_include_pad=True)        # 3 outputs, divisor 3
    (g,) = ad.gradients(y, [x], np.ones(y.shape))
    assert np.allclose(g, [[[1 / 3, 2 / 3, 1 / 3, 2 / 3, 1 / 3]]], rtol=0, atol=1e-16)
    y = pooling_ad(AVG, 2, 2, 0, x, divisor_override=4, ceil_mode=True)
    (g,) = ad.gradients(y, [x], np.ones(y.shape))
    assert np.array_equal(g, [[[0.25] * 5]])
    # dilation 2 MAX: windows {0, 2}, {1, 3}, {2, 4}; ties go to the first maximum
    y = pooling_ad(MAX, 2, 1, 0, x, dilation=2)
    (g,) = ad.gradients(y, [x], np.ones(y.shape))
    assert np.array_equal(g, [[[0.0, 1.0, 2.0, 0.0, 0.0]]])
    # all-padding windows (count_include_pad) are constant 0: no gradient from them
    y = pooling_ad(AVG, 1, 1, 1, x, count_include_pad=True)
    (g,) = ad.gradients(y, [x], (np.arange(7.0) + 1).reshape(1, 1, 7))
    assert np.array_equal(g, [[[2.0, 3.0, 4.0, 5.0, 6.0]]])
    # global: MAX to the first maximum, AVERAGE spread evenly
    (g,) = ad.gradients(global_pooling_ad(MAX, x), [x], np.ones((1, 1)))
    assert np.array_equal(g, [[[0, 1.0, 0, 0, 0]]])
    (g,) = ad.gradients(global_pooling_ad(AVG, x), [x], np.ones((1, 1)))
    assert np.array_equal(g, [[[0.2] * 5]])


def test_pooling_ad_grads_same_bits_for_1_and_2_threads():
    numba = pytest.importorskip("numba")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 numba threads")
    x = np.random.default_rng(11).standard_normal((4, 8, 61, 67))   # above SERIAL_WORK
    cases = [lambda v: pooling_ad(MAX, 3, 2, 1, v, ceil_mode=True, dilation=(1, 2)),
             lambda v: pooling_ad(AVG, 3, 2, 1, v, ceil_mode=True, count_include_pad=True),
             lambda v: pooling_ad(AVG, (2, 3), 1, 0, v, divisor_override=5),
             lambda v: adaptive_pooling_ad(AVG, (5, 7), v),
             lambda v: adaptive_pooling_ad(MAX, (5, 7), v),
             lambda v: global_pooling_ad(MAX, v)]
    before = numba.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            numba.set_num_threads(threads)
            out = []
            for fn in cases:
                v = ad.variable(x)
                y = fn(v)
                cot = np.random.default_rng(12).standard_normal(y.shape)
                out.append(y.value.tobytes() + ad.gradients(y, [v], cot)[0].tobytes())
            v, i = max_pooling_with_indices(3, 2, 1, x, dilation=2)
            out.append(v.tobytes() + i.tobytes() + max_unpooling(v, i, (61, 67)).tobytes())
            results.append(out)
        assert results[0] == results[1]
    finally:
        numba.set_num_threads(before)
