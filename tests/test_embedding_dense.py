import numpy as np
import pytest
from hypothesis import given, strategies as st

from hmath_dl.errors import NonFiniteError, NumericOverflow, ShapeError
from hmath_dl.layers.dense import dense
from tests.helpers import frozen_copy, noncontiguous, readonly
from tests.reference import layers_basic as ref


# ----------------------------------------------------------------------------- dense
@given(b=st.integers(1, 5), i=st.integers(1, 6), o=st.integers(1, 5),
       with_bias=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_dense_matches_reference(b, i, o, with_bias, seed):
    g = np.random.default_rng(seed)
    x = g.standard_normal((b, i))
    w = g.standard_normal((o, i))
    bias = g.standard_normal(o) if with_bias else None
    got = dense(x, w, bias)
    assert got.shape == (b, o) and got.dtype == np.float64 and got.flags.c_contiguous
    np.testing.assert_allclose(got, ref.dense(x, w, bias), rtol=1e-13, atol=1e-13)


def test_dense_hand_case():
    got = dense([[1, 2]], [[1, 0], [0, 1], [1, 1]], [1, 2, 3])
    assert got.tolist() == [[2.0, 4.0, 6.0]]
    assert dense([[1, 2]], [[1, 0]], None).tolist() == [[1.0]]


def test_dense_leading_axes():
    g = np.random.default_rng(5)
    x = g.standard_normal((2, 3, 4))
    w = g.standard_normal((5, 4))
    bias = g.standard_normal(5)
    got = dense(x, w, bias)
    assert got.shape == (2, 3, 5)
    np.testing.assert_allclose(got, ref.dense(x, w, bias), rtol=1e-13, atol=1e-13)


def test_dense_huge_finite_values():
    # the output sum overflows but every value is representable: no error
    got = dense([[1e308], [1e308]], [[1.0], [1.0]], None)
    assert got.tolist() == [[1e308, 1e308], [1e308, 1e308]]


def test_dense_empty():
    assert dense(np.zeros((0, 3)), np.ones((2, 3)), [1, 2]).shape == (0, 2)
    assert dense(np.zeros((2, 0)), np.ones((3, 0)), [1, 2, 3]).tolist() == [[1, 2, 3]] * 2


def test_dense_input_forms_and_no_mutation():
    g = np.random.default_rng(6)
    x, w, bias = g.standard_normal((4, 3)), g.standard_normal((2, 3)), g.standard_normal(2)
    want = dense(x, w, bias)
    copies = frozen_copy(x, w, bias)
    dense(x, w, bias)
    for a, c in zip((x, w, bias), copies):
        assert np.array_equal(a, c)
    np.testing.assert_array_equal(dense(noncontiguous(x), noncontiguous(w), noncontiguous(bias)), want)
    np.testing.assert_array_equal(dense(readonly(x), readonly(w), readonly(bias)), want)
    np.testing.assert_array_equal(dense(x.tolist(), w.tolist(), bias.tolist()), want)


def test_dense_errors():
    with pytest.raises(ShapeError, match="^dense"):
        dense([1.0, 2.0], [[1.0, 2.0]], None)
    with pytest.raises(ShapeError, match="^dense"):
        dense([[1.0, 2.0]], [1.0, 2.0], None)
    with pytest.raises(ShapeError, match="^dense"):
        dense([[1.0, 2.0]], [[1.0, 2.0, 3.0]], None)
    with pytest.raises(ShapeError, match="^dense"):
        dense([[1.0, 2.0]], [[1.0, 2.0]], [1.0, 2.0])
    with pytest.raises(ShapeError, match="^dense"):
        dense([[1.0, 2.0]], [[1.0, 2.0]], [[1.0]])
    with pytest.raises(NonFiniteError, match="^dense"):
        dense([[np.nan, 2.0]], [[1.0, 2.0]], None)
    with pytest.raises(NonFiniteError, match="^dense"):
        dense([[1.0, 2.0]], [[1.0, np.inf]], None)
    with pytest.raises(NonFiniteError, match="^dense"):
        dense([[1.0, 2.0]], [[1.0, 2.0]], [np.nan])
    with pytest.raises(NumericOverflow, match="^dense"):
        dense([[1e200, 1e200]], [[1e200, 1.0]], None)
    with pytest.raises(NumericOverflow, match="^dense"):
        dense([[1e308]], [[1.0]], [1e308])
    with pytest.raises(TypeError, match="^dense"):
        dense([["a"]], [[1.0]], None)


# ----------------------------------------------------------------------------- embedding
from hmath_dl.errors import IndexOutOfRange  # noqa: E402
from hmath_dl.layers import embedding  # noqa: E402


@given(v=st.integers(1, 6), f=st.integers(0, 4),
       shape=st.lists(st.integers(0, 4), min_size=0, max_size=3), seed=st.integers(0, 2**32 - 1))
def test_embedding_reference(v, f, shape, seed):
    g = np.random.default_rng(seed)
    w = g.standard_normal((v, f))
    idx = g.integers(0, v, size=tuple(shape))
    got = embedding(w, idx)
    assert got.shape == tuple(shape) + (f,) and got.dtype == np.float64 and got.flags.c_contiguous
    assert np.array_equal(got, ref.embedding(w, idx))


def test_embedding_index_types():
    w = np.arange(6.0).reshape(3, 2)
    for idx in ([2, 0], np.array([2, 0], dtype=np.int8), np.array([2, 0], dtype=np.uint16),
                (2, 0), np.array([[2, 0]])[0]):
        assert embedding(w, idx).tolist() == [[4.0, 5.0], [0.0, 1.0]]
    assert embedding(w, 1).tolist() == [2.0, 3.0]  # 0-d index -> shape (F,)
    assert embedding(w, np.zeros((2, 0), dtype=int)).shape == (2, 0, 2)


def test_embedding_input_forms_and_no_mutation():
    g = np.random.default_rng(8)
    w = g.standard_normal((5, 3))
    idx = np.array([[4, 1], [0, 0]])
    want = embedding(w, idx)
    copies = frozen_copy(w, idx)
    embedding(w, idx)
    assert np.array_equal(w, copies[0]) and np.array_equal(idx, copies[1])
    assert np.array_equal(embedding(noncontiguous(w), idx[:, ::-1][:, ::-1]), want)
    assert np.array_equal(embedding(readonly(w), idx), want)
    assert np.array_equal(embedding(w.tolist(), idx.tolist()), want)
    out = embedding(w, idx)
    out[0, 0, 0] = 99.0  # the result is a copy the caller owns
    assert w[4, 0] == copies[0][4, 0]


def test_embedding_errors():
    w = np.arange(6.0).reshape(3, 2)
    for idx, pos, val in (([0, 3], "[1]", "3"), ([[0, 1], [-1, 5]], "[1, 0]", "-1"), (7, "[]", "7")):
        with pytest.raises(IndexOutOfRange, match="^embedding") as info:
            embedding(w, idx)
        assert isinstance(info.value, IndexError)
        assert pos in str(info.value) and val in str(info.value)
    with pytest.raises(IndexOutOfRange, match="^embedding"):
        embedding(np.zeros((0, 2)), [0])
    with pytest.raises(TypeError, match="^embedding"):
        embedding(w, [0.0, 1.0])
    with pytest.raises(TypeError, match="^embedding"):
        embedding(w, [True, False])
    with pytest.raises(ShapeError, match="^embedding"):
        embedding([1.0, 2.0], [0])
    with pytest.raises(NonFiniteError, match="^embedding"):
        embedding([[1.0, np.nan]], [0])


@pytest.mark.parametrize("schedule", ["serial", "parallel"])
def test_embedding_large_gather_both_schedules(schedule):
    """A gather large enough for the parallel path (blocks of rows): the table's rows
    bit for bit (signed zeros included) in both schedules, from a writeable and a
    read-only table, and a NaN in a gathered row named at its first position."""
    from hmath_dl._kernels._jit import forced_schedule
    rng = np.random.default_rng(5)
    w = rng.standard_normal((50, 64))
    w[3, 7] = -0.0
    idx = rng.integers(0, 50, size=(37, 101))
    idx[0, 0] = 3
    want = w[idx]
    with forced_schedule(schedule):
        for table in (w, readonly(w.copy())):
            got = embedding(table, idx)
            assert got.tobytes() == want.tobytes()
        bad = w.copy()
        bad[11, 5] = np.nan
        idx2 = idx.copy()
        idx2[20, 30] = 11
        idx2[: 20] = np.where(idx2[:20] == 11, 12, idx2[:20])
        idx2[20, :30] = np.where(idx2[20, :30] == 11, 12, idx2[20, :30])
        with pytest.raises(NonFiniteError, match=r"\[20, 30\]"):
            embedding(bad, idx2)
