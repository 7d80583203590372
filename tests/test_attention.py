"""Attention, multi-head attention, causal masks, rotary/sinusoidal encodings, ALiBi,
transformer feed-forward (API.md §5 "Attention and positions", "KV cache and feed-forward")."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from hmath_dl.activations import Activation
from hmath_dl.errors import (DomainError, MathError, NonFiniteError, NumericOverflow,
                             ShapeError)
from hmath_dl.layers import (alibi_bias, causal_mask, multihead_attention, rotary_embedding,
                             scaled_dot_product_attention, sinusoidal_encoding,
                             transformer_feed_forward)
from tests.helpers import assert_same_across_threads, frozen_copy, noncontiguous, readonly
from tests.reference import attention as ref

RTOL = 1e-12
ATOL = 1e-12
values = st.floats(-3, 3, allow_nan=False, allow_infinity=False)

SDPA = "scaled_dot_product_attention"


def close(a, b, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def raises(exc, fname, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(fname + ":"), str(info.value)
    return info.value


@st.composite
def attention_case(draw, max_lead=2):
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=max_lead)))
    n = draw(st.integers(1, 5))
    m = draw(st.integers(0, 6))
    d = draw(st.integers(1, 5))
    f = draw(st.integers(0, 4))
    arr = lambda shape: draw(hnp.arrays(np.float64, shape, elements=values))  # noqa: E731
    q, k, v = arr(lead + (n, d)), arr(lead + (m, d)), arr(lead + (m, f))
    mask_kind = draw(st.sampled_from(["none", "2d", "full"]))
    mask = None
    if mask_kind != "none":
        shape = (n, m) if mask_kind == "2d" else lead + (n, m)
        mask = draw(hnp.arrays(np.bool_, shape))
    bias_kind = draw(st.sampled_from(["none", "2d", "full"]))
    bias = None
    if bias_kind != "none":
        bias = arr((n, m) if bias_kind == "2d" else lead + (n, m))
    return q, k, v, mask, bias


# ============================================================== scaled dot-product attention
@given(case=attention_case())
def test_sdpa_reference(case):
    q, k, v, mask, bias = case
    out, weights = scaled_dot_product_attention(q, k, v, mask, bias)
    want_out, want_w = ref.sdpa(q, k, v, mask, bias)
    assert out.shape == want_out.shape and weights.shape == want_w.shape
    for a in (out, weights):
        assert a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable
    close(weights, want_w)
    close(out, want_out)


@given(case=attention_case(max_lead=1))
def test_sdpa_keywords_and_defaults(case):
    q, k, v, mask, bias = case
    a = scaled_dot_product_attention(q=q, k=k, v=v, mask=mask, bias=bias)
    b = scaled_dot_product_attention(q, k, v, mask, bias)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    if mask is None and bias is None:
        c = scaled_dot_product_attention(q, k, v)
        assert all(np.array_equal(x, y) for x, y in zip(a, c))


def test_sdpa_larger_causal_blocks_against_oracle():
    # N not a multiple of the kernel's row block, D not a multiple of its feature unroll
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 11, 7))
    k = rng.standard_normal((2, 13, 7))
    v = rng.standard_normal((2, 13, 6))
    mask = causal_mask(11, 13, 2)
    bias = alibi_bias(0.25, 11, 13, 2)
    out, w = scaled_dot_product_attention(q, k, v, mask, bias)
    want_out, want_w = ref.sdpa(q, k, v, mask, bias)
    close(w, want_w)
    close(out, want_out)
    assert (w[:, ~mask] == 0.0).all()


def test_sdpa_fully_masked_rows_are_exact_zeros():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert np.array_equal(out[1], np.zeros(2)) and np.array_equal(w[1], np.zeros(5))
    assert not np.signbit(out[1]).any() and not np.signbit(w[1]).any()
    close(w[[0, 2]].sum(axis=1), np.ones(2), atol=1e-15)
    # the fully masked row even survives scores that would overflow
    q2 = q.copy()
    q2[1] = 1e200
    k2 = np.full((5, 4), 1e200)
    out2, w2 = scaled_dot_product_attention(q2[1:2], k2, v, mask[1:2])
    assert np.array_equal(out2, np.zeros((1, 2))) and np.array_equal(w2, np.zeros((1, 5)))


def test_sdpa_no_keys_gives_zeros():
    q = np.ones((2, 3, 4))
    out, w = scaled_dot_product_attention(q, np.ones((2, 0, 4)), np.ones((2, 0, 5)))
    assert out.shape == (2, 3, 5) and w.shape == (2, 3, 0)
    assert np.array_equal(out, np.zeros((2, 3, 5)))


def test_sdpa_empty_queries_and_values():
    out, w = scaled_dot_product_attention(np.ones((0, 2)), np.ones((3, 2)), np.ones((3, 4)))
    assert out.shape == (0, 4) and w.shape == (0, 3)
    out, w = scaled_dot_product_attention(np.ones((2, 2)), np.ones((3, 2)), np.ones((3, 0)))
    assert out.shape == (2, 0)
    close(w, np.full((2, 3), 1 / 3), atol=1e-16)


def test_sdpa_mask_allowing_one_key_copies_that_value():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((4, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 5))
    mask = np.zeros((4, 6), dtype=bool)
    for i, j in enumerate([5, 0, 2, 2]):
        mask[i, j] = True
    out, w = scaled_dot_product_attention(q, k, v, mask)
    expected_w = mask.astype(np.float64)
    assert np.array_equal(w, expected_w)  # exp(0) / exp(0) == 1 exactly
    assert np.array_equal(out, v[[5, 0, 2, 2]])


def test_sdpa_uniform_weights_hand_derived():
    # equal scores -> weights exactly 1/M (M a power of two), out = mean of v rows
    q = np.array([[1.0, 2.0]])
    k = np.zeros((4, 2))
    v = np.array([[1.0], [2.0], [3.0], [6.0]])
    out, w = scaled_dot_product_attention(q, k, v)
    assert np.array_equal(w, np.full((1, 4), 0.25))
    assert np.array_equal(out, np.array([[3.0]]))


def test_sdpa_huge_finite_scores_work():
    # scores +-1e300 after scaling: the max subtraction keeps the softmax finite
    q = np.array([[4e150]])           # D = 1, sqrt(D) = 1
    k = np.array([[2.5e149], [-2.5e149], [2.5e149]])
    v = np.array([[1.0, 2.0], [30.0, 40.0], [5.0, 6.0]])
    out, w = scaled_dot_product_attention(q, k, v)
    assert np.array_equal(w, np.array([[0.5, 0.0, 0.5]]))
    assert np.array_equal(out, np.array([[3.0, 4.0]]))
    # large bias values too
    out, w = scaled_dot_product_attention(np.zeros((1, 1)), np.zeros((2, 1)), v[:2],
                                          bias=np.array([[1e300, -1e300]]))
    assert np.array_equal(w, np.array([[1.0, 0.0]]))


def test_sdpa_score_overflow_raises():
    q = np.array([[1e200, 0.0]])
    k = np.array([[1e200, 0.0], [1.0, 1.0]])
    v = np.ones((2, 3))
    err = raises(NumericOverflow, SDPA, scaled_dot_product_attention, q, k, v)
    assert "score" in str(err)
    # score + bias overflowing
    raises(NumericOverflow, SDPA, scaled_dot_product_attention, np.array([[1e154]]),
           np.array([[1e154]]), np.ones((1, 1)), None, np.array([[1.5e308]]))
    # leading axes: the message locates the row
    qb = np.zeros((2, 3, 2))
    qb[1, 2, 0] = 1e200
    kb = np.full((2, 2, 2), 1e200)
    err = raises(NumericOverflow, SDPA, scaled_dot_product_attention, qb, kb, np.ones((2, 2, 1)))
    assert "(1, 2)" in str(err)


def test_sdpa_overflowing_scores_of_masked_keys_are_never_evaluated():
    q = np.array([[1e200, 1.0]])
    k = np.array([[1e200, 0.0], [0.0, 2.0]])
    v = np.array([[7.0], [8.0]])
    out, w = scaled_dot_product_attention(q, k, v, np.array([[False, True]]))
    assert np.array_equal(w, np.array([[0.0, 1.0]])) and np.array_equal(out, np.array([[8.0]]))


def test_sdpa_output_overflow_raises():
    # 11 equal scores: fl(1/11) * 11 > 1 exactly, so sum_j w_j * MAX exceeds the float64 range
    m = 11
    w = 1.0 / m
    assert Fraction(w) * m > 1
    big = np.finfo(np.float64).max
    raises(NumericOverflow, SDPA, scaled_dot_product_attention, np.zeros((1, 1)),
           np.zeros((m, 1)), np.full((m, 1), big))


def test_sdpa_leading_batch_axes_match_slices():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 3, 4, 5))
    k = rng.standard_normal((2, 3, 6, 5))
    v = rng.standard_normal((2, 3, 6, 2))
    mask = rng.random((2, 3, 4, 6)) < 0.7
    bias = rng.standard_normal((4, 6))
    out, w = scaled_dot_product_attention(q, k, v, mask, bias)
    for a in range(2):
        for b in range(3):
            o1, w1 = scaled_dot_product_attention(q[a, b], k[a, b], v[a, b], mask[a, b], bias)
            assert np.array_equal(out[a, b], o1) and np.array_equal(w[a, b], w1)


def test_sdpa_int_mask_and_list_inputs():
    q = [[1, 0], [0, 1]]
    k = [[1, 0], [0, 1], [1, 1]]
    v = [[1.0], [2.0], [3.0]]
    mask = [[1, 0, 1], [0, 1, 1]]
    out, w = scaled_dot_product_attention(q, k, v, mask)
    want_out, want_w = ref.sdpa(q, k, v, np.array(mask, dtype=bool))
    close(out, want_out)
    close(w, want_w)


def test_sdpa_inputs_not_mutated_and_view_inputs():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))
    mask = rng.random((3, 5)) < 0.8
    bias = rng.standard_normal((2, 3, 5))
    saved = frozen_copy(q, k, v, mask, bias)
    base = scaled_dot_product_attention(q, k, v, mask, bias)
    for a, b in zip((q, k, v, mask, bias), saved):
        assert np.array_equal(a, b)
    for conv in (readonly, noncontiguous, lambda a: np.asfortranarray(a), lambda a: a.tolist()):
        got = scaled_dot_product_attention(conv(q), conv(k), conv(v), mask, conv(bias))
        assert all(np.array_equal(x, y) for x, y in zip(got, base))
    ro_mask = mask.copy()
    ro_mask.flags.writeable = False
    got = scaled_dot_product_attention(q, k, v, ro_mask[:, ::1], bias)
    assert all(np.array_equal(x, y) for x, y in zip(got, base))
    # float32 inputs are converted exactly
    q32 = q.astype(np.float32)
    got = scaled_dot_product_attention(q32, k, v, mask, bias)
    want = scaled_dot_product_attention(q32.astype(np.float64), k, v, mask, bias)
    assert all(np.array_equal(x, y) for x, y in zip(got, want))


@pytest.mark.parametrize("args, exc", [
    ((np.ones(3), np.ones((2, 3)), np.ones((2, 1))), ShapeError),                 # q 1-D
    ((np.ones((2, 3)), np.ones(3), np.ones((2, 1))), ShapeError),                 # k 1-D
    ((np.ones((2, 3)), np.ones((2, 3)), np.ones(2)), ShapeError),                 # v 1-D
    ((np.ones((2, 2, 3)), np.ones((3, 2, 3)), np.ones((2, 2, 1))), ShapeError),   # batch k
    ((np.ones((2, 2, 3)), np.ones((2, 2, 3)), np.ones((1, 2, 1))), ShapeError),   # batch v
    ((np.ones((2, 2, 3)), np.ones((2, 3)), np.ones((2, 1))), ShapeError),         # ranks differ
    ((np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 1))), ShapeError),            # D differs
    ((np.ones((2, 3)), np.ones((2, 3)), np.ones((3, 1))), ShapeError),            # M differs
    ((np.ones((2, 0)), np.ones((2, 0)), np.ones((2, 1))), ShapeError),            # D == 0
    ((np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 1)), np.ones((2, 3), bool)), ShapeError),
    # a [1, N, M] mask broadcasts (API.md section 8); a leading 3 against 2 does not
    ((np.ones((2, 2, 3)), np.ones((2, 2, 3)), np.ones((2, 2, 1)), np.ones((3, 2, 2), bool)), ShapeError),
    ((np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 1)), None, np.ones((2, 1))), ShapeError),
    ((np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 1)), np.ones((2, 2))), TypeError),  # float mask
    ((np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 1)), [[0, 2], [1, 1]]), DomainError),
    ((np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 1)), None, [["a", "b"], ["c", "d"]]), TypeError),
    (("abc", np.ones((2, 3)), np.ones((2, 1))), TypeError),
])
def test_sdpa_argument_errors(args, exc):
    raises(exc, SDPA, scaled_dot_product_attention, *args)


@pytest.mark.parametrize("which", range(4))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_sdpa_nonfinite_inputs(which, bad):
    arrays = [np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 2)), np.zeros((2, 4))]
    arrays[which] = arrays[which].copy()
    arrays[which][1, 1] = bad
    q, k, v, bias = arrays
    raises(NonFiniteError, SDPA, scaled_dot_product_attention, q, k, v, None, bias)


def test_sdpa_errors_are_math_errors_not_index_errors():
    for args in [(np.ones((1, 1)), np.ones((0, 1)), np.ones((1, 1)))]:
        with pytest.raises(MathError):
            scaled_dot_product_attention(*args)


def test_sdpa_matches_torch_on_nondegenerate_rows():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 3, 9, 8))
    k = rng.standard_normal((2, 3, 12, 8))
    v = rng.standard_normal((2, 3, 12, 5))
    mask = rng.random((9, 12)) < 0.6
    mask[:, 0] = True  # every row has an allowed key (torch gives NaN otherwise)
    bias = rng.standard_normal((9, 12))
    out, w = scaled_dot_product_attention(q, k, v, mask, bias)
    t = lambda a: torch.from_numpy(np.array(a))  # noqa: E731
    attn = t(bias).masked_fill(~t(mask), float("-inf"))
    want = torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=attn)
    close(out, want.numpy())
    causal = causal_mask(9, 9, 0)
    out, _ = scaled_dot_product_attention(q, q, q, causal)
    want = torch.nn.functional.scaled_dot_product_attention(t(q), t(q), t(q), is_causal=True)
    close(out, want.numpy())


def test_sdpa_deterministic_across_threads():
    assert_same_across_threads("""
        import sys
        import numpy as np
        from hmath_dl.layers import scaled_dot_product_attention, causal_mask, multihead_attention
        rng = np.random.default_rng(7)
        q = rng.standard_normal((3, 37, 16)); k = rng.standard_normal((3, 41, 16))
        v = rng.standard_normal((3, 41, 8))
        m = causal_mask(37, 41, 4)
        out, w = scaled_dot_product_attention(q, k, v, m, rng.standard_normal((37, 41)))
        o2 = multihead_attention(4, q, k, v, m)
        sys.stdout.buffer.write(out.tobytes() + w.tobytes() + o2.tobytes())
    """)


# ==================================================================== multi-head attention
@st.composite
def multihead_case(draw):
    lead = tuple(draw(st.lists(st.integers(1, 2), min_size=0, max_size=1)))
    h = draw(st.integers(1, 3))
    n, m = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    dh, fh = draw(st.integers(1, 3)), draw(st.integers(0, 2))
    arr = lambda shape: draw(hnp.arrays(np.float64, shape, elements=values))  # noqa: E731
    q, k, v = arr(lead + (n, h * dh)), arr(lead + (m, h * dh)), arr(lead + (m, h * fh))
    mask = draw(st.none() | hnp.arrays(np.bool_, (n, m)) | hnp.arrays(np.bool_, lead + (n, m)))
    return h, q, k, v, mask


@given(case=multihead_case())
def test_multihead_reference(case):
    h, q, k, v, mask = case
    got = multihead_attention(h, q, k, v, mask)
    want = ref.multihead(h, q, k, v, mask)
    assert got.shape == want.shape and got.flags.c_contiguous
    close(got, want)


def test_multihead_one_head_is_sdpa_and_keywords():
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    mask = causal_mask(5, 6, 1)
    one = multihead_attention(1, q, k, v, mask)
    assert np.array_equal(one, scaled_dot_product_attention(q, k, v, mask)[0])
    assert np.array_equal(multihead_attention(heads=1, q=q, k=k, v=v, mask=mask), one)


def test_multihead_fully_masked_rows_zero():
    q = np.ones((2, 4))
    mask = np.array([[True, False], [False, False]])
    out = multihead_attention(2, q, np.ones((2, 4)), np.arange(8.0).reshape(2, 4), mask)
    assert np.array_equal(out[1], np.zeros(4))
    assert np.array_equal(out[0], np.arange(4.0))


def test_multihead_overflow_names_head():
    q = np.zeros((3, 4))
    q[2, 2] = 1e200
    k = np.full((2, 4), 1e200)
    err = raises(NumericOverflow, "multihead_attention", multihead_attention, 2, q, k, np.ones((2, 2)))
    assert "head 1" in str(err)


@pytest.mark.parametrize("heads, q, k, v, exc", [
    (0, np.ones((2, 4)), np.ones((2, 4)), np.ones((2, 4)), DomainError),
    (-1, np.ones((2, 4)), np.ones((2, 4)), np.ones((2, 4)), DomainError),
    (3, np.ones((2, 4)), np.ones((2, 4)), np.ones((2, 3)), DomainError),   # D % h
    (2, np.ones((2, 4)), np.ones((2, 4)), np.ones((2, 3)), DomainError),   # F % h
    (2.0, np.ones((2, 4)), np.ones((2, 4)), np.ones((2, 4)), TypeError),
    (True, np.ones((2, 4)), np.ones((2, 4)), np.ones((2, 4)), TypeError),
    (2, np.ones((2, 4)), np.ones((3, 4)), np.ones((2, 4)), ShapeError),
    (2, np.ones((1, 2, 4)), np.ones((2, 2, 4)), np.ones((1, 2, 4)), ShapeError),
    (2, np.full((2, 4), np.nan), np.ones((2, 4)), np.ones((2, 4)), NonFiniteError),
])
def test_multihead_errors(heads, q, k, v, exc):
    raises(exc, "multihead_attention", multihead_attention, heads, q, k, v)


def test_multihead_mask_shape_error():
    raises(ShapeError, "multihead_attention", multihead_attention, 2, np.ones((2, 4)),
           np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 2), bool))


def test_multihead_not_mutating():
    rng = np.random.default_rng(9)
    q, k, v = rng.standard_normal((1, 3, 4)), rng.standard_normal((1, 3, 4)), rng.standard_normal((1, 3, 2))
    saved = frozen_copy(q, k, v)
    base = multihead_attention(2, q, k, v)
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v), saved))
    assert np.array_equal(multihead_attention(2, noncontiguous(q), readonly(k), v.tolist()), base)


# ============================================================================ causal mask
@given(nq=st.integers(0, 7), nk=st.integers(0, 7), off=st.integers(0, 9))
def test_causal_mask_reference(nq, nk, off):
    got = causal_mask(nq, nk, off)
    assert got.dtype == np.bool_ and got.shape == (nq, nk) and got.flags.c_contiguous
    assert np.array_equal(got, ref.causal_mask(nq, nk, off))


def test_causal_mask_hand_derived_and_huge_offset():
    assert np.array_equal(causal_mask(2, 3, 0), [[True, False, False], [True, True, False]])
    assert causal_mask(queries=2, keys=3, offset=10 ** 30).all()


@pytest.mark.parametrize("args, exc", [
    ((-1, 2, 0), DomainError), ((2, -1, 0), DomainError), ((2, 2, -1), DomainError),
    ((2.0, 2, 0), TypeError), ((2, 2, 0.5), TypeError), ((2, None, 0), TypeError),
])
def test_causal_mask_errors(args, exc):
    raises(exc, "causal_mask", causal_mask, *args)


# ======================================================================= rotary embedding
@given(data=st.data(), base=st.sampled_from([10000.0, 2.0, 0.5, 1.0]), off=st.integers(0, 50))
def test_rotary_reference(data, base, off):
    lead = tuple(data.draw(st.lists(st.integers(1, 2), max_size=2)))
    s = data.draw(st.integers(1, 5))
    f = 2 * data.draw(st.integers(0, 4))
    x = data.draw(hnp.arrays(np.float64, lead + (s, f), elements=values))
    got = rotary_embedding(base, off, x)
    assert got.shape == x.shape and got.flags.c_contiguous
    close(got, ref.rotary(base, off, x), rtol=1e-13, atol=1e-13)


def test_rotary_position_zero_is_identity_and_norm_preserved():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 6))
    y = rotary_embedding(10000.0, 0, x)
    assert np.array_equal(y[0], x[0])
    close(np.hypot(y[:, 0::2], y[:, 1::2]), np.hypot(x[:, 0::2], x[:, 1::2]), atol=1e-14)


def test_rotary_scores_depend_on_relative_position_only():
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal(8), rng.standard_normal(8)
    def score(pa, pb):
        ra = rotary_embedding(100.0, pa, a[None, :])[0]
        rb = rotary_embedding(100.0, pb, b[None, :])[0]
        return ra @ rb
    close(score(3, 1), score(10, 8), atol=1e-12)
    close(score(0, 5), score(7, 12), atol=1e-12)


def test_rotary_offset_equals_slicing_and_not_mutating():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 6, 4))
    saved = frozen_copy(x)
    full = rotary_embedding(10000.0, 0, x)
    assert np.array_equal(x, saved[0])
    assert np.array_equal(rotary_embedding(10000.0, 2, x[:, 2:]), full[:, 2:])
    assert np.array_equal(rotary_embedding(base=10000.0, offset=0, x=noncontiguous(x)), full)
    assert np.array_equal(rotary_embedding(10000, 0, readonly(x)), full)


@pytest.mark.parametrize("args, exc", [
    ((10000.0, 0, np.ones((2, 3))), ShapeError),
    ((10000.0, 0, np.ones(4)), ShapeError),
    ((0.0, 0, np.ones((2, 4))), DomainError),
    ((-1.0, 0, np.ones((2, 4))), DomainError),
    ((np.inf, 0, np.ones((2, 4))), DomainError),
    ((np.nan, 0, np.ones((2, 4))), DomainError),
    ((10000.0, -1, np.ones((2, 4))), DomainError),
    ((10000.0, 2 ** 53, np.ones((2, 4))), DomainError),
    ((10000.0, 0.0, np.ones((2, 4))), TypeError),
    (("10", 0, np.ones((2, 4))), TypeError),
    ((10000.0, 0, np.array([[1.0, np.nan]])), NonFiniteError),
])
def test_rotary_errors(args, exc):
    raises(exc, "rotary_embedding", rotary_embedding, *args)


def test_rotary_overflow():
    big = np.finfo(np.float64).max
    raises(NumericOverflow, "rotary_embedding", rotary_embedding, 1.0 + 1e-9, 1,
           np.array([[big, big], [big, big]]))


# ==================================================================== sinusoidal encoding
@given(n=st.integers(0, 6), f=st.integers(0, 9), off=st.integers(0, 1000))
def test_sinusoidal_reference(n, f, off):
    got = sinusoidal_encoding(n, f, off)
    assert got.shape == (n, f) and got.dtype == np.float64 and got.flags.c_contiguous
    close(got, ref.sinusoidal(n, f, off), rtol=0, atol=1e-13)


def test_sinusoidal_hand_derived():
    pe = sinusoidal_encoding(2, 3, 0)   # odd F: the last column is a sine
    assert np.array_equal(pe[0], [0.0, 1.0, 0.0])
    close(pe[1], [math.sin(1.0), math.cos(1.0), math.sin(1.0 / 10000.0 ** (2 / 3))], atol=1e-16)
    assert np.array_equal(sinusoidal_encoding(positions=2, features=3, offset=1)[0], pe[1])


@pytest.mark.parametrize("args, exc", [
    ((-1, 4, 0), DomainError), ((2, -1, 0), DomainError), ((2, 4, -3), DomainError),
    ((2, 4, 2 ** 53), DomainError), ((2.5, 4, 0), TypeError), ((2, "4", 0), TypeError),
])
def test_sinusoidal_errors(args, exc):
    raises(exc, "sinusoidal_encoding", sinusoidal_encoding, *args)


# ============================================================================ ALiBi bias
@given(slope=st.floats(1e-3, 1e3), nq=st.integers(0, 6), nk=st.integers(0, 6),
       off=st.integers(0, 20))
def test_alibi_reference_exact(slope, nq, nk, off):
    got = alibi_bias(slope, nq, nk, off)
    assert got.shape == (nq, nk) and got.flags.c_contiguous
    assert np.array_equal(got, ref.alibi(slope, nq, nk, off))
    assert (got <= 0).all() and not np.signbit(got[got == 0]).any()


def test_alibi_hand_derived():
    assert np.array_equal(alibi_bias(0.5, 2, 3, 1), [[-0.5, 0.0, -0.5], [-1.0, -0.5, 0.0]])
    assert np.array_equal(alibi_bias(slope=2.0, queries=1, keys=2, offset=0), [[0.0, -2.0]])


@pytest.mark.parametrize("args, exc", [
    ((0.0, 2, 2, 0), DomainError), ((-0.5, 2, 2, 0), DomainError),
    ((np.inf, 2, 2, 0), DomainError), ((np.nan, 2, 2, 0), DomainError),
    ((0.5, -1, 2, 0), DomainError), ((0.5, 2, -1, 0), DomainError),
    ((0.5, 2, 2, -1), DomainError), ((0.5, 2, 2, 2 ** 53), DomainError),
    (("0.5", 2, 2, 0), TypeError), ((0.5, 2.0, 2, 0), TypeError),
])
def test_alibi_errors(args, exc):
    raises(exc, "alibi_bias", alibi_bias, *args)


def test_alibi_overflow():
    raises(NumericOverflow, "alibi_bias", alibi_bias, 1e308, 1, 3, 0)


# ================================================================ transformer feed-forward
def _sigmoid(x):
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


ACTS = {Activation.RELU: lambda x: max(x, 0.0), Activation.TANH: math.tanh,
        Activation.IDENTITY: lambda x: x, Activation.SIGMOID: _sigmoid}


@given(data=st.data(), act=st.sampled_from(sorted(ACTS, key=lambda a: a.value)),
       with_bias=st.booleans())
def test_feed_forward_reference(data, act, with_bias):
    b, n_in = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    hidden, n_out = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    arr = lambda shape: data.draw(hnp.arrays(np.float64, shape, elements=values))  # noqa: E731
    w1, w2, x = arr((hidden, n_in)), arr((n_out, hidden)), arr((b, n_in))
    b1 = arr((hidden,)) if with_bias else None
    b2 = arr((n_out,)) if with_bias else None
    got = transformer_feed_forward(act, w1, b1, w2, b2, x)
    assert got.shape == (b, n_out)
    close(got, ref.feed_forward(ACTS[act], w1, b1, w2, b2, x))


def test_feed_forward_keywords_lists_and_not_mutating():
    w1 = [[1.0, -1.0], [2.0, 0.5], [0.0, 1.0]]
    b1 = [0.5, -1.0, 0.0]
    w2 = [[1.0, 1.0, 1.0]]
    b2 = [0.25]
    x = np.array([[1.0, 2.0], [-1.0, 0.0]])
    saved = frozen_copy(x)
    got = transformer_feed_forward(activation=Activation.RELU, w1=w1, b1=b1, w2=w2, b2=b2, x=x)
    # hand-derived: h = relu(x w1^T + b1); y = sum(h) + 0.25
    assert np.array_equal(got, np.array([[0.0 + 2.0 + 2.0 + 0.25], [0.0 + 0.0 + 0.0 + 0.25]]))
    assert np.array_equal(x, saved[0])
    assert np.array_equal(transformer_feed_forward(Activation.RELU, w1, b1, w2, b2,
                                                   noncontiguous(x)), got)


@pytest.mark.parametrize("args, exc", [
    (("relu", np.ones((3, 2)), None, np.ones((1, 3)), None, np.ones((2, 2))), TypeError),
    ((Activation.RELU, np.ones((3, 2)), None, np.ones((1, 3)), None, np.ones((2, 4))), ShapeError),
    ((Activation.RELU, np.ones((3, 2)), None, np.ones((1, 4)), None, np.ones((2, 2))), ShapeError),
    ((Activation.RELU, np.ones((3, 2)), np.ones(2), np.ones((1, 3)), None, np.ones((2, 2))), ShapeError),
    ((Activation.RELU, np.ones((3, 2)), None, np.ones((1, 3)), np.ones(2), np.ones((2, 2))), ShapeError),
    ((Activation.RELU, np.ones(3), None, np.ones((1, 3)), None, np.ones((2, 2))), ShapeError),
    ((Activation.RELU, np.ones((3, 2)), None, np.ones((1, 3)), None, np.ones(2)), ShapeError),
    ((Activation.RELU, np.full((3, 2), np.nan), None, np.ones((1, 3)), None, np.ones((2, 2))), NonFiniteError),
    ((Activation.RELU, np.ones((3, 2)), None, np.ones((1, 3)), [np.inf], np.ones((2, 2))), NonFiniteError),
])
def test_feed_forward_errors(args, exc):
    raises(exc, "transformer_feed_forward", transformer_feed_forward, *args)


def test_feed_forward_overflow_is_labelled():
    big = 1e200
    raises(NumericOverflow, "transformer_feed_forward", transformer_feed_forward,
           Activation.IDENTITY, np.full((1, 1), big), None, np.full((1, 1), big), None,
           np.ones((1, 1)))


def test_kernel_exp_within_one_ulp():
    # the softmax's vectorised exp: <= 1 ulp from the correctly rounded value, incl. the
    # subnormal range, 0, -0 and -inf
    from hmath_dl._kernels.attention import _exp_shifted
    rng = np.random.default_rng(13)
    x = -np.abs(rng.standard_normal(4000)) * np.exp(rng.uniform(-30, 6.7, 4000))
    x = np.concatenate([x, np.linspace(-750.0, -700.0, 501),
                        [0.0, -0.0, -np.inf, -1e-300, -745.13, -745.14, -708.0, -708.0000001]])
    # without arguments in [-746, -708) every element takes the vector loop: -inf and
    # arguments below -746 must give exact zeros there too
    fast = x[(x >= -708.0) | (x < -746.0)]
    for xs in (x, fast):
        for shift in (0.0, 3.5):
            y = np.concatenate([[7.0], xs + shift])     # an offset into the array
            bits = np.empty(y.size, dtype=np.int64)
            _exp_shifted(y, 1, xs.size, shift, bits, bits.view(np.float64))
            assert y[0] == 7.0
            y = y[1:]
            want = np.array([math.exp(t) for t in (xs + shift) - shift])
            ulps = np.abs(y - want) / np.spacing(np.maximum(want, 5e-324))
            assert ulps.max() <= 1.0
            assert np.array_equal(y[xs == -np.inf], [0.0])
            assert np.all(y[xs + shift - shift < -746.0] == 0.0)


def _sdpa_in_specified_order(q, k, v, mask, bias, scale):
    """The kernel's specification (``_kernels/attention.py``) written as plain numpy, one
    row at a time: every score ``((0 + q0 k0) + q1 k1) + ...`` with each product and sum
    rounded (numpy's elementwise ops), scaled, ``+ bias``; the maximum of the allowed
    scores; ``exp(s - m)`` by the kernel's own exp helper (its accuracy is tested
    above); the sum of the allowed ``e`` in increasing key order; ``e / t``; each output the
    sum of ``w_j v_j`` in increasing key order over the allowed keys."""
    from hmath_dl._kernels.attention import _exp_shifted
    B, N, D = q.shape
    M, F = k.shape[1], v.shape[2]
    gkv = B // k.shape[0]
    if scale == 0.0:
        inv = 1.0 / math.sqrt(D) if math.sqrt(D) == 2.0 ** round(math.log2(math.sqrt(D))) else 0.0
    else:
        inv = scale
    out = np.zeros((B, N, F))
    w = np.zeros((B, N, M))
    for b in range(B):
        kb, vb = k[b // gkv], v[b // gkv]
        for i in range(N):
            allowed = np.ones(M, bool) if mask is None else mask[b // (B // mask.shape[0]), i]
            if not allowed.any():
                continue
            s = np.zeros(M)
            for c in range(D):
                s = s + q[b, i, c] * kb[:, c]
            s = s * inv if inv != 0.0 else s / math.sqrt(D)
            if bias is not None:
                s = s + bias[b // (B // bias.shape[0]), i]
            js = np.flatnonzero(allowed)
            e = s[js].copy()
            bits = np.empty(e.size, np.int64)
            _exp_shifted(e, 0, e.size, e.max(), bits, bits.view(np.float64))
            t = 0.0
            for x in e:
                t += x
            w[b, i, js] = e / t
            o = np.zeros(F)
            for j in js:
                o = o + w[b, i, j] * vb[j]
            out[b, i] = o
    return out, w


@pytest.mark.parametrize("B,N,M,D,F,kind,gkv,scale", [
    (2, 5, 7, 3, 5, "random", 1, 0.0),
    (2, 64, 64, 16, 16, "causal", 1, 0.0),      # the character transformer's heads
    (3, 9, 33, 16, 17, "random", 1, 0.0),       # key and feature tails of every tile
    (2, 17, 17, 64, 64, "causal", 1, 0.0),
    (4, 6, 40, 5, 8, "bias", 2, 0.0),           # grouped keys and values, bias, D not 4^k
    (2, 4, 16, 8, 3, "none", 1, 0.3),           # an explicit scale
])
def test_sdpa_kernel_is_the_specified_order_bit_for_bit(B, N, M, D, F, kind, gkv, scale):
    from hmath_dl._kernels.attention import attention_forward
    rng = np.random.default_rng(B * 1000 + N * 10 + D)
    q = rng.standard_normal((B, N, D))
    k = rng.standard_normal((B // gkv, M, D))
    v = rng.standard_normal((B // gkv, M, F))
    mask = bias = None
    if kind == "causal":
        mask = np.tril(np.ones((N, M), bool), M - N)[None]
    elif kind == "random":
        mask = rng.random((B, N, M)) < 0.5
        mask[0, 0] = False                       # a row without keys: zeros
    elif kind == "bias":
        bias = rng.standard_normal((1, N, M))
    out = np.full((B, N, F), np.nan)
    w = np.full((B, N, M), np.nan)
    status = attention_forward(q, k, v, np.ones((0, 0, 0), bool) if mask is None else mask,
                               np.zeros((0, 0, 0)) if bias is None else bias, out, w, gkv,
                               scale)
    assert status == (0, -1)
    want_out, want_w = _sdpa_in_specified_order(q, k, v, mask, bias, scale)
    assert w.tobytes() == want_w.tobytes()
    assert out.tobytes() == want_out.tobytes()


def _backward_in_specified_order(q, k, v, p, go, scale):
    """``attention_backward``'s specification as plain numpy (every product and sum rounded
    separately, sums in the documented order, loops over the summation index)."""
    B, N, D = q.shape
    M, F = v.shape[1:]
    dq, dk, dv = np.zeros((B, N, D)), np.zeros((B, M, D)), np.zeros((B, M, F))
    for b in range(B):
        ds = np.zeros((N, M))
        for i in range(N):
            nz = np.flatnonzero(p[b, i])
            if nz.size == 0:
                continue
            js = np.arange(nz[0], nz[-1] + 1)
            dp = np.zeros(js.size)
            for f in range(F):
                dp = dp + go[b, i, f] * v[b, js, f]
            acc = 0.0
            for t, j in enumerate(js):
                acc += dp[t] * p[b, i, j]
            ds[i, js] = p[b, i, js] * (dp - acc) * scale
        for i in range(N):
            dv[b] = dv[b] + p[b, i][:, None] * go[b, i][None, :]
            dk[b] = dk[b] + ds[i][:, None] * q[b, i][None, :]
        for j in range(M):
            dq[b] = dq[b] + ds[:, j][:, None] * k[b, j][None, :]
    return dq, dk, dv


@pytest.mark.parametrize("B,N,M,D,F,kind", [
    (2, 64, 64, 16, 16, "causal"),     # the character transformer's heads
    (3, 9, 33, 5, 17, "random"),       # tails of every tile and feature block
    (2, 17, 20, 64, 3, "none"),
    (2, 21, 23, 6, 5, "band"),         # neighbouring rows' spans apart: no common part
])
def test_attention_backward_is_the_specified_order_bit_for_bit(B, N, M, D, F, kind):
    from hmath_dl._kernels.attention import attention_backward, attention_forward
    rng = np.random.default_rng(N * M + D)
    q, k = rng.standard_normal((B, N, D)), rng.standard_normal((B, M, D))
    v, go = rng.standard_normal((B, M, F)), rng.standard_normal((B, N, F))
    if kind == "causal":
        mask = np.tril(np.ones((N, M), bool), M - N)[None]
    elif kind == "random":
        mask = rng.random((B, N, M)) < 0.5
        mask[0, 1] = False
    elif kind == "band":    # row i sees keys i-2 .. i (row 4 none, row 9 key 0 too)
        i, j = np.indices((N, M))
        mask = ((j <= i) & (j >= i - 2))[None].copy()
        mask[0, 4] = False
        mask[0, 9, 0] = True
    else:
        mask = np.ones((0, 0, 0), bool)
    out, p = np.empty((B, N, F)), np.empty((B, N, M))
    attention_forward(q, k, v, mask, np.zeros((0, 0, 0)), out, p)
    got = [np.full(a.shape, np.nan) for a in (q, k, v)]
    attention_backward(q, k, v, p, go, 0.3, *got)
    want = _backward_in_specified_order(q, k, v, p, go, 0.3)
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()


def test_head_layout_is_the_split_heads_computation_bit_for_bit():
    """heads=h reads and writes each head's feature columns in place: the same bits as
    the split [B*h, N, D/h] problems with heads=1, forward and backward."""
    from hmath_dl._kernels.attention import attention_backward, attention_forward
    rng = np.random.default_rng(5)
    b, n, m, h, dh, fh = 3, 10, 13, 4, 5, 3
    q, k = rng.standard_normal((b, n, h * dh)), rng.standard_normal((b, m, h * dh))
    v, go = rng.standard_normal((b, m, h * fh)), rng.standard_normal((b, n, h * fh))
    mask = rng.random((b, n, m)) < 0.7
    split = lambda a, w: np.ascontiguousarray(  # noqa: E731
        a.reshape(a.shape[0], a.shape[1], h, w).transpose(0, 2, 1, 3)).reshape(-1, a.shape[1], w)
    out, p = np.empty((b, n, h * fh)), np.empty((b * h, n, m))
    assert attention_forward(q, k, v, mask, np.zeros((0, 0, 0)), out, p, heads=h) == (0, -1)
    out1, p1 = np.empty((b * h, n, fh)), np.empty((b * h, n, m))
    attention_forward(split(q, dh), split(k, dh), split(v, fh), mask, np.zeros((0, 0, 0)),
                      out1, p1)
    assert p.tobytes() == p1.tobytes()
    assert split(out, fh).tobytes() == out1.tobytes()
    grads = [np.empty(a.shape) for a in (q, k, v)]
    attention_backward(q, k, v, p, go, 0.5, *grads, heads=h)
    grads1 = [np.empty((b * h,) + a.shape[1:2] + (w,)) for a, w in ((q, dh), (k, dh), (v, fh))]
    attention_backward(split(q, dh), split(k, dh), split(v, fh), p, split(go, fh), 0.5, *grads1)
    for g, g1, w in zip(grads, grads1, (dh, dh, fh)):
        assert split(g, w).tobytes() == g1.tobytes()
    with pytest.raises(ValueError):
        attention_forward(q, k, v, mask, np.zeros((0, 0, 0)), out, p, gkv=2, heads=h)
