"""Loss scaling, gradient norm and clipping (hmath_dl.precision.mixed, hmath_dl._gradutils)."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

import hmath_dl.precision as prec
from hmath_dl import _gradutils
from hmath_dl.errors import DomainError, NonFiniteError, NumericOverflow
from hmath_dl.precision import (
    MAX_LOSS_SCALE,
    LossScaler,
    clip_gradients,
    gradient_norm,
    initial_loss_scaler,
    scale_loss,
    unscale_gradients,
    update_loss_scaler,
)
from tests.helpers import assert_same_across_threads, frozen_copy, noncontiguous, readonly
from tests.reference import half as ref

EPS = 2.0 ** -53


def raises(exc, fname, fn, *args):
    with pytest.raises(exc) as info:
        fn(*args)
    assert str(info.value).startswith(fname + ":"), str(info.value)
    return str(info.value)


# ------------------------------------------------------------------------- LossScaler
def test_max_loss_scale_and_initial():
    assert MAX_LOSS_SCALE == 2.0 ** 24
    s = initial_loss_scaler(1024.0, 3)
    assert s == LossScaler(1024.0, 3, 0)
    assert (s.loss_scale, s.scale_growth_interval, s.finite_steps) == (1024.0, 3, 0)
    assert isinstance(initial_loss_scaler(8, 1).loss_scale, float)
    assert initial_loss_scaler(MAX_LOSS_SCALE, 1).loss_scale == MAX_LOSS_SCALE
    assert initial_loss_scaler(5e-324, 2).loss_scale == 5e-324
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.loss_scale = 2.0


def test_initial_loss_scaler_errors():
    f = "initial_loss_scaler"
    for bad in (0.0, -1.0, MAX_LOSS_SCALE * 2, np.nextafter(MAX_LOSS_SCALE, np.inf), math.inf, math.nan):
        raises(DomainError, f, initial_loss_scaler, bad, 1)
    for bad in (0, -3):
        raises(DomainError, f, initial_loss_scaler, 1.0, bad)
    raises(TypeError, f, initial_loss_scaler, "1", 1)
    raises(TypeError, f, initial_loss_scaler, None, 1)
    raises(TypeError, f, initial_loss_scaler, 1.0, 2.0)
    raises(TypeError, f, initial_loss_scaler, 1.0, True)


def test_direct_construction_is_validated():
    f = "LossScaler"
    raises(DomainError, f, LossScaler, 0.0, 1, 0)
    raises(DomainError, f, LossScaler, math.inf, 1, 0)
    raises(DomainError, f, LossScaler, 2.0 ** 25, 1, 0)
    raises(DomainError, f, LossScaler, 1.0, 0, 0)
    raises(DomainError, f, LossScaler, 1.0, 3, 3)
    raises(DomainError, f, LossScaler, 1.0, 3, -1)
    raises(TypeError, f, LossScaler, "a", 1, 0)
    raises(TypeError, f, LossScaler, 1.0, 1.5, 0)
    raises(TypeError, f, LossScaler, 1.0, 2, 0.0)
    assert LossScaler(2, 4, 3).loss_scale == 2.0


def test_update_state_machine_by_hand():
    s = initial_loss_scaler(4.0, 3)
    s = update_loss_scaler(True, s)
    assert s == LossScaler(4.0, 3, 1)
    s = update_loss_scaler(True, s)
    assert s == LossScaler(4.0, 3, 2)
    s = update_loss_scaler(True, s)                  # growth after exactly 3 finite steps
    assert s == LossScaler(8.0, 3, 0)
    s = update_loss_scaler(True, update_loss_scaler(True, s))
    assert s == LossScaler(8.0, 3, 2)
    s = update_loss_scaler(False, s)                 # overflow: halve and reset
    assert s == LossScaler(4.0, 3, 0)
    capped = update_loss_scaler(True, LossScaler(MAX_LOSS_SCALE * 0.75, 1, 0))
    assert capped == LossScaler(MAX_LOSS_SCALE, 1, 0)
    assert update_loss_scaler(True, capped) == LossScaler(MAX_LOSS_SCALE, 1, 0)
    assert update_loss_scaler(np.bool_(False), capped).loss_scale == MAX_LOSS_SCALE / 2


def test_update_errors():
    f = "update_loss_scaler"
    s = initial_loss_scaler(1.0, 2)
    for bad in (1, 0, 1.0, None, "True"):
        raises(TypeError, f, update_loss_scaler, bad, s)
    raises(TypeError, f, update_loss_scaler, True, (1.0, 2, 0))
    msg = raises(NumericOverflow, f, update_loss_scaler, False, LossScaler(5e-324, 2, 1))
    assert "5e-324" in msg
    # a subnormal scale whose half still rounds to a positive value is fine
    assert update_loss_scaler(False, LossScaler(3 * 5e-324, 2, 1)).loss_scale == 2 * 5e-324


@given(st.sampled_from([2.0 ** -1070, 1e-3, 1.0, 65536.0, MAX_LOSS_SCALE]),
       st.integers(1, 4), st.lists(st.booleans(), max_size=40))
def test_state_machine_matches_reference(scale, interval, steps):
    s = initial_loss_scaler(scale, interval)
    r = ref.ReferenceScaler(scale, interval)
    for finite in steps:
        try:
            r = r.update(finite)
        except ref.Overflow:
            with pytest.raises(NumericOverflow):
                update_loss_scaler(finite, s)
            return
        before = s
        fields = dataclasses.astuple(before)
        s = update_loss_scaler(finite, s)
        assert dataclasses.astuple(before) == fields and s is not before
        assert (s.loss_scale, s.scale_growth_interval, s.finite_steps) == (r.scale, r.interval, r.steps)


def test_scale_loss():
    s = initial_loss_scaler(1024.0, 2)
    assert scale_loss(s, 0.5) == 512.0
    assert scale_loss(s, -3) == -3072.0
    assert isinstance(scale_loss(s, np.float32(0.25)), float)
    f = "scale_loss"
    raises(NonFiniteError, f, scale_loss, s, math.nan)
    raises(NonFiniteError, f, scale_loss, s, -math.inf)
    raises(NumericOverflow, f, scale_loss, s, 1e306)
    raises(TypeError, f, scale_loss, s, "1")
    raises(TypeError, f, scale_loss, s, [1.0])
    raises(TypeError, f, scale_loss, 1024.0, 1.0)


# ------------------------------------------------------------------ unscale_gradients
def test_unscale_structure_and_values():
    s = initial_loss_scaler(3.0, 2)
    rng = np.random.default_rng(1)
    g1, g2 = rng.standard_normal((3, 4)), rng.standard_normal(5)
    keep = frozen_copy(g1, g2)
    ok, out = unscale_gradients(s, g1)
    assert ok is True and isinstance(out, np.ndarray) and out.shape == (3, 4)
    expect1 = np.array([v / 3.0 for v in g1.reshape(-1)]).reshape(3, 4)
    assert np.array_equal(out, expect1) and out.flags.c_contiguous and out is not g1
    ok, out = unscale_gradients(s, [g1, g2])
    assert ok is True and isinstance(out, list) and len(out) == 2
    assert np.array_equal(out[0], expect1)
    assert np.array_equal(out[1], np.array([v / 3.0 for v in g2]))
    ok, out = unscale_gradients(s, (readonly(g1), noncontiguous(g2), g2.tolist(), 6.0))
    assert ok and isinstance(out, list) and [o.shape for o in out] == [(3, 4), (5,), (5,), ()]
    assert np.array_equal(out[1], out[2]) and out[3] == 2.0
    assert np.array_equal(g1, keep[0]) and np.array_equal(g2, keep[1])
    assert unscale_gradients(s, []) == (True, [])
    ok, out = unscale_gradients(s, np.zeros((0, 2)))
    assert ok and out.shape == (0, 2)


def test_unscale_overflow_signal_never_raises():
    s = initial_loss_scaler(8.0, 2)
    for bad in ([np.ones(3), np.array([1.0, np.inf])], np.array([[np.nan]]), (1.0, -np.inf),
                [np.full(100_000, 1.0), np.r_[np.zeros(70_000), np.nan]]):
        before = frozen_copy(*bad) if isinstance(bad, (list, tuple)) else frozen_copy(bad)
        assert unscale_gradients(s, bad) == (False, None)
        after = bad if isinstance(bad, (list, tuple)) else [bad]
        for x, y in zip(after, before):
            np.testing.assert_array_equal(x, y)
    # finite before dividing but not after (scale < 1)
    small = initial_loss_scaler(0.25, 2)
    assert unscale_gradients(small, [np.array([1e308])]) == (False, None)
    assert unscale_gradients(small, np.array([1e300]))[0] is True


def test_unscale_type_errors():
    s = initial_loss_scaler(2.0, 2)
    f = "unscale_gradients"
    raises(TypeError, f, unscale_gradients, s, ["a"])
    raises(TypeError, f, unscale_gradients, s, [np.ones(2), "x"])
    raises(TypeError, f, unscale_gradients, s, None)
    raises(TypeError, f, unscale_gradients, 2.0, np.ones(2))


# --------------------------------------------------------------------- gradient_norm
def _rtol(n):
    # n rounded squares + (n - 1) rounded additions, halved by sqrt, + sqrt + oracle rounding
    return (n + 4) * EPS


# A norm in the subnormal range is rounded to a fixed absolute grid (2**-1074) twice: by
# the final scaling ``sqrt(sum) * 2**e`` and by the oracle; each rounding adds at most half
# a step that no relative bound covers.
_SUBNORMAL_STEP = 2.0 ** -1074


def _norm_tol(n, expect):
    return _rtol(n) * expect + (_SUBNORMAL_STEP if expect < np.finfo(np.float64).tiny else 0.0)


@st.composite
def grad_lists(draw):
    count = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lo, hi = draw(st.sampled_from([(0, 0), (-30, 30), (-1070, -1000), (900, 1015)]))
    out = []
    for _ in range(count):
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        out.append(rng.standard_normal(shape) * np.exp2(rng.uniform(lo, hi, shape)))
    return out


@given(grad_lists())
# a subnormal norm one grid step from the correctly rounded one (found by hypothesis)
@example([np.float64(1.7734175598958e-310), np.float64(2.2362919741e-313)])
def test_gradient_norm_matches_exact_oracle(grads):
    n = sum(g.size for g in grads)
    expect = ref.euclidean_norm(grads)
    if expect is None:
        raises(NumericOverflow, "gradient_norm", gradient_norm, grads)
        return
    got = gradient_norm(grads)
    assert isinstance(got, float)
    assert abs(got - expect) <= _norm_tol(n, expect)
    assert gradient_norm(tuple(grads)) == got
    if len(grads) == 1:
        assert gradient_norm(grads[0]) == got


def test_gradient_norm_exact_cases():
    assert gradient_norm([3.0, 4.0]) == 5.0
    assert gradient_norm(np.array([[3.0], [-4.0]])) == 5.0
    assert gradient_norm([np.full(3, 1e200), [[1e200]]]) == 2e200
    assert gradient_norm([1e300, 1e300]) == math.hypot(1e300, 1e300)
    assert gradient_norm(np.full(4, 1e-200)) == 2e-200
    assert gradient_norm(5e-324) == 5e-324
    assert gradient_norm([3 * 5e-324, 4 * 5e-324]) == 5 * 5e-324
    assert gradient_norm(1.7976931348623157e308) == 1.7976931348623157e308
    assert gradient_norm([]) == 0.0
    assert gradient_norm(np.zeros((0, 3))) == 0.0
    assert gradient_norm([np.zeros(0), np.zeros((2, 0))]) == 0.0
    assert gradient_norm(np.zeros(10)) == 0.0
    assert gradient_norm([-0.0]) == 0.0


def test_gradient_norm_large_inputs_against_oracle():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(30_000) * 1e200          # several chunks, squares overflow naively
    expect = ref.euclidean_norm([x])
    assert abs(gradient_norm(x) - expect) <= _rtol(x.size) * expect
    assert abs(gradient_norm([x[:100], x[100:].reshape(-1, 10)]) - expect) <= _rtol(x.size) * expect


def test_gradient_norm_errors():
    f = "gradient_norm"
    msg = raises(NumericOverflow, f, gradient_norm, [1.7976931348623157e308, 1.0e308])
    raises(NumericOverflow, f, gradient_norm, np.full(4, 1e308))
    msg = raises(NonFiniteError, f, gradient_norm, [np.ones(2), np.array([0.0, np.nan])])
    assert "grads[1]" in msg
    raises(NonFiniteError, f, gradient_norm, np.array([np.inf]))
    raises(TypeError, f, gradient_norm, ["a"])
    raises(TypeError, f, gradient_norm, None)
    raises(TypeError, f, gradient_norm, [[1.0, 2.0], [[1.0], [1.0, 2.0]]])


def test_gradient_norm_input_kinds():
    rng = np.random.default_rng(4)
    g = rng.standard_normal((6, 7))
    keep = frozen_copy(g)
    expect = gradient_norm(g)
    for form in (readonly(g), noncontiguous(g), g.tolist(), np.asfortranarray(g), [g], (g,)):
        assert gradient_norm(form) == expect
    assert np.array_equal(g, keep[0])
    assert gradient_norm(g.astype(np.float32)) == gradient_norm(g.astype(np.float32).astype(np.float64))
    assert gradient_norm([1, 2, 2]) == 3.0


# -------------------------------------------------------------------- clip_gradients
def test_clip_gradients_values_and_structure():
    g = [np.array([3.0, 0.0]), np.array([[4.0]])]
    keep = frozen_copy(*g)
    out = clip_gradients(1.0, g)
    assert isinstance(out, list) and [o.shape for o in out] == [(2,), (1, 1)]
    factor = 1.0 / 5.0
    assert np.array_equal(out[0], np.array([3.0 * factor, 0.0]))
    assert np.array_equal(out[1], np.array([[4.0 * factor]]))
    assert np.array_equal(g[0], keep[0]) and np.array_equal(g[1], keep[1])
    # below the threshold: same values, new arrays
    same = clip_gradients(5.0, g)
    assert all(np.array_equal(a, b) and a is not b for a, b in zip(same, g))
    single = clip_gradients(10.0, g[0])
    assert isinstance(single, np.ndarray) and np.array_equal(single, g[0]) and single is not g[0]
    assert clip_gradients(2.5, (3.0, 4.0))[1].shape == ()
    assert clip_gradients(1.0, []) == []
    huge = clip_gradients(1.0, np.full(4, 1e200))
    assert np.array_equal(huge, np.full(4, 1e200 * (1.0 / 2e200)))


@given(grad_lists(), st.floats(1e-300, 1e300))
def test_clip_gradients_matches_definition(grads, max_norm):
    expect_norm = ref.euclidean_norm(grads)
    if expect_norm is None:
        raises(NumericOverflow, "clip_gradients", clip_gradients, max_norm, grads)
        return
    norm = gradient_norm(grads)
    out = clip_gradients(max_norm, grads)
    assert len(out) == len(grads)
    for o, g in zip(out, grads):
        assert o.shape == g.shape and o.dtype == np.float64
        if norm > max_norm:
            expect = np.array([v * (max_norm / norm) for v in g.reshape(-1)]).reshape(g.shape)
        else:
            expect = g
        assert np.array_equal(o, expect)
    if norm > max_norm and norm > 0 and max_norm / norm >= np.finfo(np.float64).tiny:
        # the contract multiplies by the factor max_norm / norm; only a normal factor
        # carries full relative precision (a subnormal one, e.g. 6e-8 / 2e303, is itself
        # rounded to fewer bits, so the clipped norm may exceed max_norm by more)
        assert gradient_norm(out) <= max_norm * (1 + _rtol(sum(g.size for g in grads)) + 2 * EPS)


def test_clip_gradients_errors():
    f = "clip_gradients"
    for bad in (0.0, -1.0, math.inf, math.nan):
        raises(DomainError, f, clip_gradients, bad, [1.0])
    raises(TypeError, f, clip_gradients, "1", [1.0])
    raises(TypeError, f, clip_gradients, None, [1.0])
    raises(NonFiniteError, f, clip_gradients, 1.0, [np.nan])
    raises(NumericOverflow, f, clip_gradients, 1.0, [1.7976931348623157e308, 1.7976931348623157e308])
    raises(TypeError, f, clip_gradients, 1.0, [object()])


def test_shared_implementation_and_helper():
    assert prec.gradient_norm is _gradutils.gradient_norm
    assert prec.clip_gradients is _gradutils.clip_gradients
    arrays, single = _gradutils.as_gradient_list("f", [[1, 2], 3.0])
    assert not single and [a.shape for a in arrays] == [(2,), ()]
    assert all(a.dtype == np.float64 and a.flags.c_contiguous for a in arrays)
    arrays, single = _gradutils.as_gradient_list("f", np.ones((2, 2), np.float32))
    assert single and arrays[0].dtype == np.float64
    with pytest.raises(NonFiniteError):
        _gradutils.as_gradient_list("f", [np.nan])
    assert _gradutils.as_gradient_list("f", [np.nan], finite=False)[0][0].shape == ()


def test_gradient_norm_determinism_across_threads():
    assert_same_across_threads("""
        import sys
        import numpy as np
        from hmath_dl.precision import gradient_norm, clip_gradients
        rng = np.random.default_rng(0)
        g = [rng.standard_normal(100_003) * 1e150, rng.standard_normal((70, 999))]
        out = [np.float64(gradient_norm(g)).tobytes()]
        out += [c.tobytes() for c in clip_gradients(1.0, g)]
        sys.stdout.buffer.write(b"|".join(out))
    """)
