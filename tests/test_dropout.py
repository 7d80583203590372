import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from hmath_dl.errors import DomainError, NonFiniteError, NumericOverflow, ShapeError
from hmath_dl.layers import Mode, dropout, spatial_dropout
from hmath_dl.rng import RNG
from tests.helpers import assert_same_across_threads, noncontiguous, readonly
from tests.reference import layers_basic as ref

FUNCS = [dropout, spatial_dropout]
finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


@given(x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=4, max_side=5), elements=finite),
       p=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]) | st.floats(0, 1), seed=st.integers(0, 2**64))
def test_dropout_reference(x, p, seed):
    rng = RNG.from_seed(seed)
    y, mask, rng2 = dropout(Mode.TRAINING, p, rng, x)
    gen = rng.generator()
    u = np.asarray(gen.random(x.shape))
    want_mask = ref.dropout_mask(p, u)
    assert mask.shape == x.shape and y.shape == x.shape
    assert np.array_equal(mask, want_mask)
    assert np.array_equal(y, x * want_mask)
    assert rng2 == rng.advanced(gen)


@given(x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=5, max_side=4), elements=finite),
       p=st.floats(0, 1), seed=st.integers(0, 2**64))
def test_spatial_dropout_reference(x, p, seed):
    rng = RNG.from_seed(seed)
    y, mask, rng2 = spatial_dropout(Mode.TRAINING, p, rng, x)
    gen = rng.generator()
    u = gen.random(x.shape[:2])
    per = ref.dropout_mask(p, u)
    want = np.empty(x.shape)
    for idx in np.ndindex(x.shape):
        want[idx] = per[idx[0], idx[1]]
    assert np.array_equal(mask, want)
    assert np.array_equal(y, x * want)
    assert rng2 == rng.advanced(gen)


def test_mask_values_and_rate():
    x = np.ones((200, 100))
    y, mask, _ = dropout(Mode.TRAINING, 0.25, RNG.from_seed(1), x)
    assert set(np.unique(mask).tolist()) == {0.0, 1.0 / 0.75}
    frac = (mask == 0).mean()
    # binomial: 20000 draws, sd = sqrt(.25*.75/20000) = 0.0031; 5 sigma
    assert abs(frac - 0.25) < 5 * 0.0031
    _, mask, _ = dropout(Mode.TRAINING, 1.0, RNG.from_seed(1), x)
    assert not mask.any()
    _, mask, r = dropout(Mode.TRAINING, 0.0, RNG.from_seed(1), x)
    assert (mask == 1.0).all()
    assert r != RNG.from_seed(1)  # p == 0 still consumes draws (documented)


@pytest.mark.parametrize("fn", FUNCS)
def test_inference(fn):
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    rng = RNG.from_seed(3)
    y, mask, r = fn(Mode.INFERENCE, 0.7, rng, x)
    assert np.array_equal(y, x) and y is not x
    assert (mask == 1.0).all() and mask.shape == x.shape
    assert r == rng


@pytest.mark.parametrize("fn", FUNCS)
def test_rng_purity(fn):
    x = np.random.default_rng(0).standard_normal((4, 5, 6))
    rng = RNG.from_seed(9)
    a = fn(Mode.TRAINING, 0.5, rng, x)
    b = fn(Mode.TRAINING, 0.5, rng, x)
    assert np.array_equal(a[1], b[1]) and a[2] == b[2]
    c = fn(Mode.TRAINING, 0.5, a[2], x)
    assert not np.array_equal(a[1], c[1])
    assert rng == RNG.from_seed(9)


@pytest.mark.parametrize("fn", FUNCS)
def test_input_forms_and_no_mutation(fn):
    base = np.random.default_rng(1).standard_normal((3, 4, 5))
    rng = RNG.from_seed(2)
    want = fn(Mode.TRAINING, 0.3, rng, base)
    x = base.copy()
    fn(Mode.TRAINING, 0.3, rng, x)
    assert np.array_equal(x, base)
    for form in (noncontiguous(base), readonly(base), base.tolist(), base.astype(np.float32).astype(np.float64)):
        got = fn(Mode.TRAINING, 0.3, rng, form)
        assert np.array_equal(got[1], want[1])
        assert np.array_equal(got[0], np.asarray(form, dtype=np.float64) * want[1])


def test_spatial_mask_shared():
    x = np.ones((3, 4, 5, 6))
    _, mask, _ = spatial_dropout(Mode.TRAINING, 0.5, RNG.from_seed(4), x)
    assert (mask == mask[:, :, :1, :1]).all()


@pytest.mark.parametrize("fn", FUNCS)
def test_errors(fn):
    name = fn.__name__
    rng = RNG.from_seed(0)
    x = np.ones((2, 3, 4))
    for p in (-0.1, 1.5, np.nan, np.inf):
        with pytest.raises(DomainError, match="^" + name):
            fn(Mode.TRAINING, p, rng, x)
    with pytest.raises(DomainError, match="^" + name):
        fn(Mode.INFERENCE, 2.0, rng, x)
    with pytest.raises(NonFiniteError, match="^" + name):
        fn(Mode.TRAINING, 0.5, rng, np.full((2, 3, 4), np.nan))
    with pytest.raises(NonFiniteError, match="^" + name):
        fn(Mode.INFERENCE, 0.5, rng, [[[np.inf]]])
    with pytest.raises(NumericOverflow, match="^" + name):
        fn(Mode.TRAINING, 0.5, rng, np.full((2, 3, 4), 1e308))  # 2e308 overflows
    with pytest.raises(TypeError, match="^" + name):
        fn("training", 0.5, rng, x)
    with pytest.raises(TypeError, match="^" + name):
        fn(Mode.TRAINING, 0.5, 42, x)
    with pytest.raises(TypeError, match="^" + name):
        fn(Mode.TRAINING, "0.5", rng, x)


def test_spatial_rank():
    with pytest.raises(ShapeError, match="^spatial_dropout"):
        spatial_dropout(Mode.TRAINING, 0.5, RNG.from_seed(0), [1.0, 2.0])


def test_deterministic_across_threads():
    assert_same_across_threads("""
        import sys, numpy as np
        from hmath_dl.layers import Mode, dropout, spatial_dropout
        from hmath_dl.rng import RNG
        x = np.random.default_rng(0).standard_normal((8, 16, 700))
        for fn in (dropout, spatial_dropout):
            y, m, r = fn(Mode.TRAINING, 0.3, RNG.from_seed(5), x)
            sys.stdout.buffer.write(y.tobytes() + m.tobytes() + str(r).encode())
    """)
