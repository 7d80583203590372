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
