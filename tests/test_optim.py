"""hmath_dl.optim: SGD with momentum and AdamW against hand-written numpy formulas."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from hmath_dl import optim
from hmath_dl.errors import DomainError, NonFiniteError, NumericOverflow, ShapeError
from tests.helpers import assert_same_across_threads, noncontiguous, readonly

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def raises(exc, fname, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(fname), str(info.value)


def sgd_reference(p, g, buf, lr, momentum, wd):
    out_p, out_b = [], []
    for pi, gi, bi in zip(p, g, buf):
        pf, gf, bf = pi.reshape(-1), gi.reshape(-1), bi.reshape(-1)
        np_, nb = np.empty(pf.size), np.empty(pf.size)
        for j in range(pf.size):
            d = gf[j] + wd * pf[j]
            nb[j] = momentum * bf[j] + d
            np_[j] = pf[j] - lr * nb[j]
        out_p.append(np_.reshape(pi.shape))
        out_b.append(nb.reshape(pi.shape))
    return out_p, out_b


def adamw_reference(p, g, m, v, t, lr, b1, b2, eps, wd):
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    outs = ([], [], [])
    for pi, gi, mi, vi in zip(p, g, m, v):
        pf, gf, mf, vf = (a.reshape(-1) for a in (pi, gi, mi, vi))
        np_, nm, nv = np.empty(pf.size), np.empty(pf.size), np.empty(pf.size)
        for j in range(pf.size):
            nm[j] = b1 * mf[j] + (1 - b1) * gf[j]
            nv[j] = b2 * vf[j] + (1 - b2) * (gf[j] * gf[j])
            np_[j] = pf[j] * (1 - lr * wd) - (lr / bc1) * (nm[j] / (math.sqrt(nv[j]) / math.sqrt(bc2) + eps))
        for o, a in zip(outs, (np_, nm, nv)):
            o.append(a.reshape(pi.shape))
    return outs


@given(seed=st.integers(0, 2**32 - 1), shape_list=st.lists(shapes, min_size=1, max_size=3),
       lr=st.floats(0, 1), momentum=st.floats(0, 1), wd=st.floats(0, 0.1), steps=st.integers(1, 3))
def test_sgd_matches_formula(seed, shape_list, lr, momentum, wd, steps):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s) for s in shape_list]
    state = optim.sgd_init(params)
    ref_p = [p.copy() for p in params]
    ref_b = [np.zeros(s) for s in shape_list]
    for _ in range(steps):
        grads = [rng.standard_normal(s) for s in shape_list]
        params, state = optim.sgd_step(state, params, grads, lr, momentum, weight_decay=wd)
        ref_p, ref_b = sgd_reference(ref_p, grads, ref_b, lr, momentum, wd)
        for a, b in zip(params, ref_p):
            assert a.shape == b.shape and np.array_equal(a, b)
        for a, b in zip(state.momentum_buffers, ref_b):
            assert np.array_equal(a, b)
    assert state.steps == steps


@given(seed=st.integers(0, 2**32 - 1), shape_list=st.lists(shapes, min_size=1, max_size=3),
       lr=st.floats(0, 0.5), b1=st.floats(0, 0.99), b2=st.floats(0, 0.9999),
       eps=st.floats(1e-10, 1e-3), wd=st.floats(0, 0.1), steps=st.integers(1, 3))
def test_adamw_matches_formula(seed, shape_list, lr, b1, b2, eps, wd, steps):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s) for s in shape_list]
    state = optim.adamw_init(params)
    rp, rm, rv = [p.copy() for p in params], [np.zeros(s) for s in shape_list], [np.zeros(s) for s in shape_list]
    for t in range(1, steps + 1):
        grads = [rng.standard_normal(s) for s in shape_list]
        params, state = optim.adamw_step(state, params, grads, lr, b1, b2, eps, wd)
        rp, rm, rv = adamw_reference(rp, grads, rm, rv, t, lr, b1, b2, eps, wd)
        for got, want in zip((params, state.first_moments, state.second_moments), (rp, rm, rv)):
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-15, atol=1e-15)
    assert state.steps == steps


def test_adamw_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    p0 = [rng.standard_normal((3, 4)), rng.standard_normal(5)]
    tp = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in p0]
    opt = torch.optim.AdamW(tp, lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    params, state = p0, optim.adamw_init(p0)
    for _ in range(4):
        grads = [rng.standard_normal(p.shape) for p in p0]
        for t, g in zip(tp, grads):
            t.grad = torch.tensor(g)
        opt.step()
        params, state = optim.adamw_step(state, params, grads, 0.01, 0.9, 0.99, 1e-8, 0.05)
    for a, t in zip(params, tp):
        np.testing.assert_allclose(a, t.detach().numpy(), rtol=1e-14, atol=1e-15)


def test_sgd_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    p0 = [rng.standard_normal((3, 4))]
    tp = [torch.tensor(p0[0], requires_grad=True)]
    opt = torch.optim.SGD(tp, lr=0.1, momentum=0.8, weight_decay=0.01)
    params, state = p0, optim.sgd_init(p0)
    for _ in range(4):
        g = rng.standard_normal((3, 4))
        tp[0].grad = torch.tensor(g)
        opt.step()
        params, state = optim.sgd_step(state, params, [g], 0.1, 0.8, 0.01)
    np.testing.assert_allclose(params[0], tp[0].detach().numpy(), rtol=1e-14, atol=1e-15)


def test_states_are_immutable_and_inputs_untouched():
    params = [np.ones((2, 2)), np.arange(3.0)]
    grads = [np.full((2, 2), 0.5), np.ones(3)]
    before = [a.copy() for a in params + grads]
    for init, step in ((optim.sgd_init, optim.sgd_step), (optim.adamw_init, optim.adamw_step)):
        s0 = init(params)
        p1, s1 = step(s0, params, grads, 0.1)
        p2, s2 = step(s0, params, grads, 0.1)
        for a, b in zip(p1, p2):
            assert np.array_equal(a, b)  # s0 reusable
        assert s0.steps == 0 and s1.steps == 1
        for f in dataclasses.fields(s1):
            val = getattr(s1, f.name)
            if isinstance(val, tuple):
                for arr in val:
                    assert not arr.flags.writeable
        with pytest.raises(dataclasses.FrozenInstanceError):
            s1.steps = 5
        for new, old in zip(p1, params):
            assert new is not old and new.flags.writeable
    for a, b in zip(params + grads, before):
        assert np.array_equal(a, b)


def test_state_constructor_freezes_arrays():
    buf = np.zeros(3)
    s = optim.SGDState((buf,), 0)
    assert not s.momentum_buffers[0].flags.writeable and buf.flags.writeable
    raises(TypeError, "SGDState", optim.SGDState, buf, 0)
    raises(DomainError, "AdamWState", optim.AdamWState, (buf,), (buf,), -1)


@pytest.mark.parametrize("maker", [readonly, noncontiguous, lambda a: a.tolist()])
def test_input_kinds(maker):
    p = np.arange(6.0).reshape(2, 3)
    g = np.ones((2, 3))
    p1, _ = optim.adamw_step(optim.adamw_init([p]), [maker(p)], [maker(g)], 0.1)
    p2, _ = optim.adamw_step(optim.adamw_init([p]), [p], [g], 0.1)
    assert np.array_equal(p1[0], p2[0])


def test_errors():
    p = [np.ones(3)]
    s = optim.sgd_init(p)
    a = optim.adamw_init(p)
    raises(TypeError, "sgd_init", optim.sgd_init, np.ones(3))
    raises(NonFiniteError, "adamw_init", optim.adamw_init, [[np.nan]])
    raises(TypeError, "sgd_step", optim.sgd_step, a, p, p, 0.1)
    raises(ShapeError, "sgd_step", optim.sgd_step, s, p, [np.ones(4)], 0.1)
    raises(ShapeError, "sgd_step", optim.sgd_step, s, p, [np.ones(3), np.ones(3)], 0.1)
    raises(ShapeError, "sgd_step", optim.sgd_step, s, [np.ones(4)], [np.ones(4)], 0.1)
    raises(NonFiniteError, "sgd_step", optim.sgd_step, s, p, [[1.0, np.inf, 0.0]], 0.1)
    raises(DomainError, "sgd_step", optim.sgd_step, s, p, p, -0.1)
    raises(DomainError, "sgd_step", optim.sgd_step, s, p, p, 0.1, momentum=1.5)
    raises(DomainError, "sgd_step", optim.sgd_step, s, p, p, 0.1, weight_decay=-1.0)
    raises(TypeError, "sgd_step", optim.sgd_step, s, p, p, "0.1")
    raises(DomainError, "adamw_step", optim.adamw_step, a, p, p, 0.1, beta1=1.0)
    raises(DomainError, "adamw_step", optim.adamw_step, a, p, p, 0.1, beta2=-0.1)
    raises(DomainError, "adamw_step", optim.adamw_step, a, p, p, 0.1, eps=0.0)
    raises(DomainError, "adamw_step", optim.adamw_step, a, p, p, float("nan"))
    raises(ShapeError, "adamw_step", optim.adamw_step, a, [np.ones((3, 1))], [np.ones((3, 1))], 0.1)
    raises(NumericOverflow, "sgd_step", optim.sgd_step, s, [np.full(3, 1e308)], [np.full(3, 1e308)], 1e10)
    raises(NumericOverflow, "adamw_step", optim.adamw_step, a, [np.full(3, 1e308)], [np.ones(3)], 1e10)


def test_loss_scaler_skip_pattern():
    prec = pytest.importorskip("hmath_dl.precision")
    if not hasattr(prec, "unscale_gradients"):
        pytest.skip("loss scaling not available yet")
    params = [np.ones(3)]
    state = optim.adamw_init(params)
    scaler = prec.initial_loss_scaler(1024.0, 2)
    for grads in ([np.array([1.0, np.inf, 0.0])], [np.array([1.0, 2.0, 3.0])]):
        finite, g = prec.unscale_gradients(scaler, grads)
        if finite:
            params, state = optim.adamw_step(state, params, g, 0.1)
        scaler = prec.update_loss_scaler(finite, scaler)
    assert state.steps == 1 and scaler.loss_scale == 512.0


def test_deterministic_across_threads():
    assert_same_across_threads("""
        import sys, numpy as np
        from hmath_dl import optim
        rng = np.random.default_rng(0)
        p = [rng.standard_normal(20000), rng.standard_normal((30, 7))]
        g = [rng.standard_normal(20000), rng.standard_normal((30, 7))]
        q, s = optim.adamw_step(optim.adamw_init(p), p, g, 0.01)
        r, t = optim.sgd_step(optim.sgd_init(p), p, g, 0.01)
        for a in q + r + list(s.second_moments) + list(t.momentum_buffers):
            sys.stdout.buffer.write(a.tobytes())
    """)


def test_adamw_bias_correction_power_is_correctly_rounded():
    # 1 - beta**t cancels (beta2 = 0.9999 at step 3 loses 12 bits), so beta**t must be
    # the correctly rounded power, as the formula's reference computes it
    from fractions import Fraction
    from hmath_dl.optim import _power
    rng = np.random.default_rng(5)
    betas = [0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 0.9999, 0.99999] + list(rng.uniform(0.3, 1, 60))
    for b in betas:
        for t in (1, 2, 3, 4, 5, 7, 10, 31, 100, 1000):
            assert _power(float(b), t) == float(Fraction(float(b)) ** t), (b, t)
