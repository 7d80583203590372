import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from hmath_dl.errors import DomainError, NonFiniteError, NumericOverflow, ShapeError
from hmath_dl.layers import (BatchNormState, Mode, batch_norm, group_norm, instance_norm,
                             layer_norm, rms_norm, weight_norm)
from tests.helpers import assert_same_across_threads, frozen_copy, noncontiguous, readonly
from tests.reference import layers_basic as ref

RTOL = 1e-12
ATOL = 1e-12
values = st.floats(-100, 100, allow_nan=False, allow_infinity=False)
epsilons = st.sampled_from([1e-5, 1e-3, 0.5])


def arrays(min_dims, max_dims, max_side=4, min_side=1):
    return hnp.arrays(np.float64, hnp.array_shapes(min_dims=min_dims, max_dims=max_dims,
                                                   min_side=min_side, max_side=max_side),
                      elements=values)


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def close_rows(got, want, x2d, eps, center=True):
    """Compare row-normalised outputs with the tolerance the problem's conditioning
    dictates: rounding the mean (|mean| * n * 2**-52 at worst) is magnified by
    1/sqrt(var + eps), so near-constant rows legitimately differ by more than 1e-12."""
    x2d = np.asarray(x2d, dtype=np.float64)
    n = x2d.shape[1]
    var = x2d.var(axis=1) if center else (x2d * x2d).mean(axis=1)
    scale = n * np.abs(x2d).max(axis=1) * np.finfo(float).eps / np.sqrt(var + eps)
    tol = RTOL * np.abs(want).reshape(x2d.shape) + ATOL + 4 * scale[:, None]
    err = np.abs(got - want).reshape(x2d.shape)
    assert (err <= tol).all(), (err.max(), got, want)


# --------------------------------------------------------------------------- reference
@given(x=arrays(1, 4), data=st.data(), eps=epsilons)
def test_layer_norm_reference(x, data, eps):
    axes = data.draw(st.integers(1, x.ndim))
    got = layer_norm(axes, eps, x)
    assert got.shape == x.shape and got.dtype == np.float64 and got.flags.c_contiguous
    n = int(np.prod(x.shape[x.ndim - axes:]))
    close_rows(got, ref.layer_norm(axes, eps, x), x.reshape(-1, n), eps)


@given(x=arrays(1, 4), data=st.data(), eps=epsilons)
def test_rms_norm_reference(x, data, eps):
    axes = data.draw(st.integers(1, x.ndim))
    n = int(np.prod(x.shape[x.ndim - axes:]))
    close_rows(rms_norm(axes, eps, x), ref.rms_norm(axes, eps, x), x.reshape(-1, n), eps, False)


@given(x=arrays(3, 5), eps=epsilons)
def test_instance_norm_reference(x, eps):
    close_rows(instance_norm(eps, x), ref.instance_norm(eps, x),
               x.reshape(x.shape[0] * x.shape[1], -1), eps)


@given(n=st.integers(1, 3), groups=st.integers(1, 4), per=st.integers(1, 3),
       spatial=st.lists(st.integers(1, 4), min_size=0, max_size=3), eps=epsilons,
       seed=st.integers(0, 2**32 - 1))
def test_group_norm_reference(n, groups, per, spatial, eps, seed):
    x = np.random.default_rng(seed).standard_normal((n, groups * per) + tuple(spatial)) * 7 + 3
    close(group_norm(groups, eps, x), ref.group_norm(groups, eps, x))


@given(x=arrays(2, 4), eps=epsilons, momentum=st.floats(0, 1), seed=st.integers(0, 2**32 - 1))
def test_batch_norm_train_reference(x, eps, momentum, seed):
    c = x.shape[1]
    g = np.random.default_rng(seed)
    gamma, beta = g.standard_normal(c), g.standard_normal(c)
    state = BatchNormState(g.standard_normal(c), g.uniform(0.1, 3, c), 4)
    y, new = batch_norm(Mode.TRAINING, momentum, eps, gamma, beta, state, x)
    want_y, want_mean, want_var = ref.batch_norm_train(
        momentum, eps, gamma, beta, state.running_mean, state.running_variance, x)
    xc = np.moveaxis(x, 1, 0).reshape(c, -1)
    close_rows(np.moveaxis((y - beta.reshape((1, c) + (1,) * (x.ndim - 2))) /
                           gamma.reshape((1, c) + (1,) * (x.ndim - 2)), 1, 0).reshape(c, -1),
               np.moveaxis((want_y - beta.reshape((1, c) + (1,) * (x.ndim - 2))) /
                           gamma.reshape((1, c) + (1,) * (x.ndim - 2)), 1, 0).reshape(c, -1),
               xc, eps)
    close(new.running_mean, want_mean)
    np.testing.assert_allclose(new.running_variance, want_var, rtol=RTOL, atol=1e-9)
    assert new.batches_seen == 5


@given(x=arrays(2, 4), eps=epsilons, seed=st.integers(0, 2**32 - 1))
def test_batch_norm_inference_reference(x, eps, seed):
    c = x.shape[1]
    g = np.random.default_rng(seed)
    gamma, beta = g.standard_normal(c), g.standard_normal(c)
    state = BatchNormState(g.standard_normal(c), g.uniform(0, 3, c), 7)
    y, new = batch_norm(Mode.INFERENCE, 0.3, eps, gamma, beta, state, x)
    assert new is state
    close(y, ref.batch_norm_infer(eps, gamma, beta, state.running_mean, state.running_variance, x))


@given(w=arrays(1, 4), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_weight_norm_reference(w, data, seed):
    axis = data.draw(st.integers(-w.ndim, w.ndim - 1))
    w = w + 0.5  # hypothesis likes all-zero slices; those are tested separately
    if (np.abs(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)).sum(axis=1) == 0).any():
        return
    mags = np.random.default_rng(seed).standard_normal(w.shape[axis])
    close(weight_norm(axis, mags, w), ref.weight_norm(axis, mags, w))


def test_large_rows_match_reference():
    # rows longer than the 16-way unrolling, odd tails, several rows per thread
    x = np.random.default_rng(3).standard_normal((5, 3, 37)) * 1e3 + 1e4
    close(layer_norm(2, 1e-5, x), ref.layer_norm(2, 1e-5, x))
    close(rms_norm(1, 1e-5, x), ref.rms_norm(1, 1e-5, x))
    close(group_norm(3, 1e-5, x), ref.group_norm(3, 1e-5, x))


# --------------------------------------------------------------------------- hand cases
def test_hand_derived():
    # mean 2, population variance 2/3 -> (x - 2) / sqrt(2/3)
    s = math.sqrt(2.0 / 3.0)
    got = layer_norm(1, 1e-300, [1.0, 2.0, 3.0])
    close(got, [-1 / s, 0.0, 1 / s])
    close(rms_norm(1, 1e-300, [3.0, 4.0]), [3 / math.sqrt(12.5), 4 / math.sqrt(12.5)])
    assert layer_norm(1, 1e-5, [5.0, 5.0]).tolist() == [0.0, 0.0]
    close(weight_norm(0, [2.0, -1.0], [[3.0, 4.0], [0.0, 5.0]]), [[1.2, 1.6], [0.0, -1.0]])


def test_extreme_magnitudes_scaled():
    # sums/squares overflow but the normalised values are representable
    close(layer_norm(1, 1e-5, [1e308, -1e308, 0.0]), [math.sqrt(1.5), -math.sqrt(1.5), 0.0])
    close(layer_norm(1, 1e-5, [1.5e308, 1.5e308, 1.5e308]), [0.0, 0.0, 0.0])
    close(rms_norm(1, 1e-5, [1e200, -1e200]), [1.0, -1.0])
    close(group_norm(1, 1e-5, [[1e308, -1e308]]), [[1.0, -1.0]])
    close(weight_norm(0, [1.0, 1.0], [[1e300, 1e300], [3e-320, 4e-320]]),
          [[2 ** -0.5, 2 ** -0.5], [0.6, 0.8]])
    x = np.array([[1e308, -1e308], [1.0, 3.0]]).T  # [N=2, C=2]
    y, st_ = batch_norm(Mode.TRAINING, 0.0, 1e-300, [1.0, 1.0], [0.0, 0.0],
                        BatchNormState.initial(2), x)
    close(y, [[1.0, -1.0], [-1.0, 1.0]])


def test_batch_norm_single_value_uses_population_variance():
    x = np.array([[2.0, -1.0]])  # N=1, C=2: one value per channel
    y, st_ = batch_norm(Mode.TRAINING, 1.0, 1e-5, [1, 1], [0, 0], BatchNormState.initial(2), x)
    assert y.tolist() == [[0.0, 0.0]]
    assert st_.running_mean.tolist() == [2.0, -1.0]
    assert st_.running_variance.tolist() == [0.0, 0.0]


def test_batch_norm_unbiased_running_variance():
    x = np.array([[1.0], [3.0]])  # population var 1, unbiased 2
    _, st_ = batch_norm(Mode.TRAINING, 0.5, 1e-5, [1], [0], BatchNormState.initial(1), x)
    assert st_.running_mean.tolist() == [1.0]  # 0.5 * 0 + 0.5 * 2
    assert st_.running_variance.tolist() == [1.5]  # 0.5 * 1 + 0.5 * 2
    assert st_.batches_seen == 1


def test_empty_inputs():
    assert layer_norm(1, 1e-5, np.zeros((0, 4))).shape == (0, 4)
    assert layer_norm(2, 1e-5, np.zeros((3, 0))).shape == (3, 0)
    assert group_norm(2, 1e-5, np.zeros((0, 4, 2))).shape == (0, 4, 2)
    y, s = batch_norm(Mode.INFERENCE, 0.1, 1e-5, [1.0], [0.0], BatchNormState.initial(1), np.zeros((0, 1)))
    assert y.shape == (0, 1)


# --------------------------------------------------------------------------- state
def test_state_frozen_and_readonly():
    s = BatchNormState.initial(3)
    assert s.running_mean.tolist() == [0.0] * 3 and s.running_variance.tolist() == [1.0] * 3
    assert s.batches_seen == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batches_seen = 2
    with pytest.raises(ValueError):
        s.running_mean[0] = 1.0
    assert not s.running_variance.flags.writeable
    src = np.array([1.0, 2.0])
    s2 = BatchNormState(src, [1.0, 1.0], 0)
    src[0] = 9.0
    assert s2.running_mean[0] == 1.0  # copied
    assert s2 == BatchNormState([1.0, 2.0], np.ones(2), 0)
    assert s2 != BatchNormState([1.0, 2.0], np.ones(2), 1)
    assert hash(s2) == hash(BatchNormState([1.0, 2.0], np.ones(2), 0))


def test_state_validation():
    with pytest.raises(ShapeError, match="^BatchNormState"):
        BatchNormState([0.0, 0.0], [1.0], 0)
    with pytest.raises(NonFiniteError, match="^BatchNormState"):
        BatchNormState([np.nan], [1.0], 0)
    with pytest.raises(DomainError, match="^BatchNormState"):
        BatchNormState([0.0], [-1.0], 0)
    with pytest.raises(DomainError, match="^BatchNormState"):
        BatchNormState([0.0], [1.0], -1)
    with pytest.raises(TypeError, match="^BatchNormState"):
        BatchNormState([0.0], [1.0], 1.5)
    with pytest.raises(DomainError, match="^BatchNormState.initial"):
        BatchNormState.initial(0)


# --------------------------------------------------------------------------- inputs
def test_input_forms_and_no_mutation():
    base = np.random.default_rng(7).standard_normal((2, 4, 3, 3))
    calls = [
        lambda x: layer_norm(2, 1e-5, x),
        lambda x: rms_norm(3, 1e-5, x),
        lambda x: instance_norm(1e-5, x),
        lambda x: group_norm(2, 1e-5, x),
        lambda x: batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(4), np.zeros(4),
                             BatchNormState.initial(4), x)[0],
        lambda x: batch_norm(Mode.INFERENCE, 0.1, 1e-5, np.ones(4), np.zeros(4),
                             BatchNormState.initial(4), x)[0],
        lambda x: weight_norm(1, np.arange(1.0, 5.0), x),
    ]
    for call in calls:
        want = call(base)
        x = base.copy()
        call(x)
        assert np.array_equal(x, base)
        for form in (noncontiguous(base), readonly(base), base.tolist(), np.asfortranarray(base)):
            assert np.array_equal(call(form), want)
    gamma, beta = np.ones(4), np.zeros(4)
    copies = frozen_copy(gamma, beta)
    batch_norm(Mode.TRAINING, 0.1, 1e-5, gamma, beta, BatchNormState.initial(4), base)
    assert np.array_equal(gamma, copies[0]) and np.array_equal(beta, copies[1])


# --------------------------------------------------------------------------- errors
X4 = np.ones((2, 4, 3))


@pytest.mark.parametrize("name,call", [
    ("layer_norm", lambda x: layer_norm(1, 1e-5, x)),
    ("rms_norm", lambda x: rms_norm(1, 1e-5, x)),
    ("instance_norm", lambda x: instance_norm(1e-5, x)),
    ("group_norm", lambda x: group_norm(2, 1e-5, x)),
    ("batch_norm", lambda x: batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(4), np.zeros(4),
                                        BatchNormState.initial(4), x)),
    ("batch_norm", lambda x: batch_norm(Mode.INFERENCE, 0.1, 1e-5, np.ones(4), np.zeros(4),
                                        BatchNormState.initial(4), x)),
    ("weight_norm", lambda x: weight_norm(1, np.ones(4), x)),
])
def test_nonfinite_input(name, call):
    for bad in (np.nan, np.inf, -np.inf):
        x = X4.copy()
        x[1, 2, 1] = bad
        with pytest.raises(NonFiniteError, match="^" + name) as info:
            call(x)
        assert "(1, 2, 1)" in str(info.value)
    x = X4.copy()
    x[0, 0, 0], x[0, 0, 1] = np.inf, -np.inf
    with pytest.raises(NonFiniteError, match="^" + name):
        call(x)


@pytest.mark.parametrize("name,call", [
    ("layer_norm", lambda eps: layer_norm(1, eps, X4)),
    ("rms_norm", lambda eps: rms_norm(1, eps, X4)),
    ("instance_norm", lambda eps: instance_norm(eps, X4)),
    ("group_norm", lambda eps: group_norm(2, eps, X4)),
    ("batch_norm", lambda eps: batch_norm(Mode.TRAINING, 0.1, eps, np.ones(4), np.zeros(4),
                                          BatchNormState.initial(4), X4)),
])
def test_bad_epsilon(name, call):
    for eps in (0.0, -1e-5, np.nan, np.inf):
        with pytest.raises(DomainError, match="^" + name):
            call(eps)
    with pytest.raises(TypeError, match="^" + name):
        call("1e-5")


def test_axes_errors():
    for fn in (layer_norm, rms_norm):
        name = fn.__name__
        for axes in (0, 4, -1):
            with pytest.raises(DomainError, match="^" + name):
                fn(axes, 1e-5, X4)
        with pytest.raises(DomainError, match="^" + name):
            fn(1, 1e-5, 3.0)  # 0-d: no axis to normalise
        with pytest.raises(TypeError, match="^" + name):
            fn(1.0, 1e-5, X4)


def test_group_errors():
    for groups in (0, -2, 3, 5):
        with pytest.raises(DomainError, match="^group_norm"):
            group_norm(groups, 1e-5, X4)
    with pytest.raises(ShapeError, match="^group_norm"):
        group_norm(1, 1e-5, [1.0, 2.0])
    with pytest.raises(TypeError, match="^group_norm"):
        group_norm(2.0, 1e-5, X4)


def test_instance_rank():
    with pytest.raises(ShapeError, match="^instance_norm"):
        instance_norm(1e-5, np.ones((2, 3)))


def test_batch_norm_errors():
    s4 = BatchNormState.initial(4)
    for mom in (-0.1, 1.1, np.nan):
        with pytest.raises(DomainError, match="^batch_norm"):
            batch_norm(Mode.TRAINING, mom, 1e-5, np.ones(4), np.zeros(4), s4, X4)
    with pytest.raises(ShapeError, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(3), np.zeros(4), s4, X4)
    with pytest.raises(ShapeError, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(4), np.zeros(5), s4, X4)
    with pytest.raises(ShapeError, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(4), np.zeros(4), BatchNormState.initial(3), X4)
    with pytest.raises(ShapeError, match="^batch_norm"):
        batch_norm(Mode.INFERENCE, 0.1, 1e-5, np.ones(4), np.zeros(4), s4, np.ones(4))
    with pytest.raises(ShapeError, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(4), np.zeros(4), s4, np.ones((0, 4)))
    with pytest.raises(NonFiniteError, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.1, 1e-5, [1, 1, np.nan, 1], np.zeros(4), s4, X4)
    with pytest.raises(NonFiniteError, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(4), [0, np.inf, 0, 0], s4, X4)
    with pytest.raises(TypeError, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(4), np.zeros(4), "state", X4)
    with pytest.raises(TypeError, match="^batch_norm"):
        batch_norm("train", 0.1, 1e-5, np.ones(4), np.zeros(4), s4, X4)
    # overflow in the affine part / in the running variance
    big = np.array([[1.0], [-1.0]])
    with pytest.raises(NumericOverflow, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.1, 1e-5, [1e308], [1e308], BatchNormState.initial(1), big)
    with pytest.raises(NumericOverflow, match="^batch_norm"):
        batch_norm(Mode.INFERENCE, 0.1, 1e-5, [1e300], [0.0],
                   BatchNormState([0.0], [0.0], 1), np.array([[1e300], [0.0]]))
    with pytest.raises(NumericOverflow, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.5, 1e-5, [1.0], [0.0], BatchNormState.initial(1),
                   np.array([[1e308], [-1e308]]))


def test_weight_norm_errors():
    with pytest.raises(DomainError, match="^weight_norm") as info:
        weight_norm(0, [1.0, 1.0], [[1.0, 2.0], [0.0, 0.0]])
    assert "1" in str(info.value)
    for axis in (2, -3):
        with pytest.raises(DomainError, match="^weight_norm"):
            weight_norm(axis, [1.0, 1.0], [[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ShapeError, match="^weight_norm"):
        weight_norm(0, [1.0, 1.0, 1.0], [[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ShapeError, match="^weight_norm"):
        weight_norm(0, [1.0], 5.0)
    with pytest.raises(NonFiniteError, match="^weight_norm"):
        weight_norm(0, [np.nan, 1.0], [[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(NonFiniteError, match="^weight_norm"):
        weight_norm(0, [1.0, 1.0], [[1.0, np.inf], [3.0, 4.0]])
    with pytest.raises(NumericOverflow, match="^weight_norm"):
        weight_norm(0, [1e308], [[1.0, 1e-300]])
    with pytest.raises(TypeError, match="^weight_norm"):
        weight_norm(0.0, [1.0], [[1.0]])


# --------------------------------------------------------------------------- determinism
def test_deterministic_across_threads():
    assert_same_across_threads("""
        import sys, numpy as np
        from hmath_dl.layers import (BatchNormState, Mode, batch_norm, group_norm,
                                     instance_norm, layer_norm, rms_norm, weight_norm)
        x = np.random.default_rng(0).standard_normal((6, 8, 5, 37)) * 3 + 1
        outs = [layer_norm(2, 1e-5, x), rms_norm(1, 1e-5, x), instance_norm(1e-5, x),
                group_norm(4, 1e-5, x), weight_norm(1, np.ones(8), x)]
        y, s = batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(8), np.zeros(8),
                          BatchNormState.initial(8), x)
        outs += [y, s.running_mean, s.running_variance]
        y, _ = batch_norm(Mode.INFERENCE, 0.1, 1e-5, np.ones(8), np.zeros(8), s, x)
        outs.append(y)
        for o in outs:
            sys.stdout.buffer.write(o.tobytes())
    """)


def test_weight_norm_nonfinite_slices():
    # NaN-only slice (a max ignores NaN: must not look like a zero slice), NaN among
    # values, inf; every case names the element
    for w, where in (([[np.nan, np.nan], [1.0, 2.0]], "(0, 0)"),
                     ([[1.0, 2.0], [3.0, np.nan]], "(1, 1)"),
                     ([[1.0, -np.inf], [3.0, 4.0]], "(0, 1)"),
                     ([[0.0, 0.0], [np.nan, 0.0]], "(1, 0)")):
        with pytest.raises(NonFiniteError, match="^weight_norm") as info:
            weight_norm(0, [1.0, 1.0], w)
        assert where in str(info.value)


# --------------------------------------------------------------------------- specified order
def _lane_sum(values, lanes=32):
    """The documented order of a row sum (plain Python): ``lanes`` interleaved partial
    sums from 0.0, added in order, then the tail in order."""
    n = len(values)
    nb = n // lanes
    acc = [0.0] * lanes
    for b in range(nb):
        for k in range(lanes):
            acc[k] += values[b * lanes + k]
    t = 0.0
    for k in range(lanes):
        t += acc[k]
    for i in range(nb * lanes, n):
        t += values[i]
    return t


def _row_norm_oracle(row, eps, center):
    """A row of at most 2048 finite elements whose sums stay finite, by the documented
    operations: two-pass mean and sum of squares in the lane order, merged from zero by
    Chan's update (a single chunk), then ``(x - mean) * (1 / sqrt(var + eps))``."""
    row = [float(v) for v in row]
    n = float(len(row))
    if center:
        mb = _lane_sum(row) / n
        qb = _lane_sum([(v - mb) * (v - mb) for v in row])
        mean = 0.0 + (mb - 0.0) * (n / (0.0 + n))
        q = (0.0 + qb) + (mb - 0.0) * (mb - 0.0) * ((0.0 * n) / (0.0 + n))
    else:
        mean = 0.0
        q = 0.0 + _lane_sum([v * v for v in row])
    inv = 1.0 / math.sqrt(q / n + eps)
    return np.array([(v - mean) * inv for v in row])


@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 64, 100, 2048])
@pytest.mark.parametrize("center", [True, False])
def test_rows_follow_the_documented_order_whatever_their_neighbours(n, center):
    """Rows are normalised four at a time with interleaved chains: each row's bits are
    still those of the documented order, and a row that needs the rescaled path (its
    squares overflow) changes nothing for the rows beside it."""
    rng = np.random.default_rng(n)
    rows = 11
    x = rng.standard_normal((rows, n)) * 10.0 ** rng.integers(-8, 8, size=(rows, 1))
    x[5] *= 1e160          # overflows x*x: the rescaled path, inside a group of four
    w = rng.standard_normal(n)
    b = rng.standard_normal(n)
    if center:
        calls = [(lambda v: layer_norm(1, 1e-5, v), lambda y: y),
                 (lambda v: layer_norm(1, 1e-5, v, weight=w, bias=b), lambda y: y * w + b)]
    else:
        calls = [(lambda v: rms_norm(1, 1e-5, v), lambda y: y),
                 (lambda v: rms_norm(1, 1e-5, v, weight=w), lambda y: y * w)]
    for fn, affine in calls:
        for xs in (x, np.tile(x, (40, 1)), np.tile(x, (100, 1))):   # blocks of 4 and 8 rows
            got = fn(xs)
            for r in range(xs.shape[0]):
                if r % rows == 5:
                    alone = fn(xs[r:r + 1])
                    assert np.array_equal(got[r].view(np.int64), alone[0].view(np.int64))
                else:
                    want = affine(_row_norm_oracle(xs[r], 1e-5, center))
                    assert np.array_equal(got[r].view(np.int64), want.view(np.int64)), r


def _norm_rows_backward_loops(x, y, g, w, rows, n, eps, center):
    """Plain-loop oracle of the row-norm backward (layer norm / RMS norm): per row, every
    sum from 0.0 in increasing j; ``gh = g * w`` rounded; ``dx = r (gh - mean(gh) [if
    centered] - y mean(gh y))``, ``r = 1 / sqrt(var + eps)``."""
    dx = np.empty(rows * n)
    for row in range(rows):
        b = row * n
        m = 0.0
        if center:
            for j in range(n):
                m += float(x[b + j])
            m *= 1.0 / n
        v = 0.0
        for j in range(n):
            d = float(x[b + j]) - m
            v += d * d
        r = 1.0 / math.sqrt(v * (1.0 / n) + eps)
        s = q = 0.0
        for j in range(n):
            h = float(g[b + j]) * float(w[j])
            s += h
            q += h * float(y[b + j])
        mg = s * (1.0 / n) if center else 0.0
        mgy = q * (1.0 / n)
        for j in range(n):
            dx[b + j] = r * (float(g[b + j]) * float(w[j]) - mg - float(y[b + j]) * mgy)
    return dx


@pytest.mark.parametrize("rows,n", [(1024, 64), (13, 7), (9, 5), (17, 33), (8, 1), (5, 64),
                                    (16, 3), (24, 8), (3, 100), (1029, 9), (300, 5)])
@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("schedule", ["serial", "parallel"])
def test_norm_rows_backward_matches_loops(rows, n, center, schedule):
    """The row-norm backward kernel (rows a vector's width at a time, one row per lane,
    the rest one by one) gives the plain loops' bits: whole and partial groups of rows,
    rows shorter than a vector, a column tail, with and without centering; serially and
    in parallel (blocks of several groups when there are more than 32 tasks)."""
    from hmath_dl._kernels._jit import forced_schedule
    from hmath_dl._kernels.backward import norm_rows_backward
    rng = np.random.default_rng(rows * 100 + n)
    x, y, g = (rng.standard_normal(rows * n) * 3.0 for _ in range(3))
    w = readonly(rng.standard_normal(n))
    dx = np.empty(rows * n)
    with forced_schedule(schedule):
        norm_rows_backward(x, y, g, w, rows, n, 1e-5, center, dx)
    assert dx.tobytes() == _norm_rows_backward_loops(x, y, g, w, rows, n, 1e-5,
                                                     center).tobytes()


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 127, 129, 515, 1030])
@pytest.mark.parametrize("per_elem", [True, False])
def test_row_norm_forward_parallel_is_serial(rows, per_elem):
    """The row norms' forward kernel (a span kernel over blocks of rows, four rows'
    statistics at a time) writes the same bytes -- outputs, xhat, statuses -- run
    serially and in parallel, for row counts that leave partial blocks and partial
    groups of four; layer norm's per-element affine map and group norm's per channel."""
    from hmath_dl._kernels._jit import forced_schedule
    from hmath_dl._kernels.norm import LANES, normalize_rows_affine
    rng = np.random.default_rng(rows)
    n = 24
    x = readonly(rng.standard_normal(rows * n) * 5.0)
    if per_elem:
        w, b, G, cpg, S = rng.standard_normal(n), rng.standard_normal(n), 1, 1, 1
    else:
        w, b, G, cpg, S = rng.standard_normal(6), rng.standard_normal(6), 3, 2, n // 2
    res = []
    for schedule in ("serial", "parallel"):
        out, st = np.full(rows * n, 7.0), np.zeros(rows, dtype=np.int8)
        xh = np.full(rows * n, 7.0) if per_elem else np.empty(0)
        with forced_schedule(schedule):
            normalize_rows_affine(x, rows, n, 1e-5, True, LANES, readonly(w), readonly(b), True,
                                  per_elem, G, cpg, S, False, out, st, xh)
        res.append(out.tobytes() + xh.tobytes() + st.tobytes())
        assert not (out == 7.0).any()
    assert res[0] == res[1]
