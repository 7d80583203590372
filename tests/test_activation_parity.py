"""Activation parameters (API.md section 8): ``negative_slope`` (LEAKY_RELU), ``alpha``
(ELU), ``beta`` (SOFTPLUS) in ``activations.activate`` and ``autodiff.activate``.

Oracles are the contract's formulas evaluated with the ``math`` module in plain loops;
torch is a second opinion where it is importable.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hmath_dl import autodiff as ad
from hmath_dl.activations import Activation, activate
from hmath_dl.errors import DomainError, NonFiniteError, NumericOverflow

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not importable")
SET = settings(max_examples=40, deadline=None)
A = Activation
PARAM = {A.LEAKY_RELU: "negative_slope", A.ELU: "alpha", A.SOFTPLUS: "beta"}
DEFAULT = {A.LEAKY_RELU: 0.01, A.ELU: 1.0, A.SOFTPLUS: 1.0}


# ----------------------------------------------------------------------------- oracles
def _softplus(v, beta):
    """log1p(exp(beta v)) / beta without overflow: for t = beta v > 0,
    log1p(exp(t)) = t + log1p(exp(-t))."""
    t = beta * v
    if t > 0:
        return v + math.log1p(math.exp(-t)) / beta
    return math.log1p(math.exp(t)) / beta


def _sigmoid(t):
    if t >= 0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


def ref_forward(act, p, x):
    out = []
    for v in np.asarray(x, dtype=float).ravel().tolist():
        if act is A.LEAKY_RELU:
            out.append(v if v > 0 else p * v)
        elif act is A.ELU:
            out.append(v if v > 0 else p * math.expm1(v))
        else:
            out.append(_softplus(v, p))
    return np.array(out).reshape(np.shape(x))


def ref_derivative(act, p, x):
    out = []
    for v in np.asarray(x, dtype=float).ravel().tolist():
        if act is A.LEAKY_RELU:
            out.append(1.0 if v > 0 else p)
        elif act is A.ELU:
            out.append(1.0 if v > 0 else p * math.exp(v))
        else:
            out.append(_sigmoid(p * v))
    return np.array(out).reshape(np.shape(x))


def close(got, want, rtol=4e-15, atol=1e-300):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


params = {A.LEAKY_RELU: st.floats(-5.0, 5.0), A.ELU: st.floats(-5.0, 5.0),
          A.SOFTPLUS: st.floats(0.05, 50.0)}
acts = st.sampled_from([A.LEAKY_RELU, A.ELU, A.SOFTPLUS])
xs = st.lists(st.floats(-50.0, 50.0), min_size=1, max_size=40)


# ----------------------------------------------------------------------------- forward
@SET
@given(act=acts, data=st.data(), x=xs)
def test_forward_matches_oracle(act, data, x):
    p = data.draw(params[act])
    y = activate(act, x, **{PARAM[act]: p})
    close(y, ref_forward(act, p, x), rtol=1e-14)


def test_defaults_bitwise_equal_to_unparameterised():
    x = np.concatenate([np.linspace(-800, 800, 4001), [0.0, -0.0, 5e-324, -5e-324, 1e-300,
                                                      -1e-300, 1e300, -1e300, 708.0, -745.0]])
    for act in PARAM:
        plain = activate(act, x)
        given_ = activate(act, x, **{PARAM[act]: DEFAULT[act]})
        assert plain.tobytes() == given_.tobytes(), act
        # autodiff: forward and gradients too
        v = ad.variable(x)
        y = ad.activate(act, v, **{PARAM[act]: DEFAULT[act]})
        assert y.value.tobytes() == plain.tobytes()
        v2 = ad.variable(x)
        (g1,) = ad.gradients(ad.sum(y), [v])
        (g2,) = ad.gradients(ad.sum(ad.activate(act, v2)), [v2])
        assert g1.tobytes() == g2.tobytes(), act


def test_softplus_has_no_linear_cutoff_and_exact_limits():
    # PyTorch's default threshold=20 returns x itself above 20/beta; the contract does not
    y = activate(A.SOFTPLUS, [30.0, 25.0], beta=1.0)
    assert y[0] == 30.0 + math.log1p(math.exp(-30.0)) and y[0] > 30.0
    y = activate(A.SOFTPLUS, [30.0])
    assert y[0] > 30.0
    y = activate(A.SOFTPLUS, [3.0], beta=10.0)      # beta * x = 30 > threshold 20
    assert y[0] > 3.0
    close(y, [3.0 + math.log1p(math.exp(-30.0)) / 10.0])
    # beta x overflowing: exact limits, no NaN
    y = activate(A.SOFTPLUS, [1e300, -1e300, 1.0, -1.0], beta=1e300)
    assert np.array_equal(y, [1e300, 0.0, 1.0, 0.0])
    y = activate(A.SOFTPLUS, [1e308, -1e308], beta=1e10)
    assert np.array_equal(y, [1e308, 0.0])
    # tiny beta: softplus -> log(2)/beta + x/2
    close(activate(A.SOFTPLUS, [0.0, 1.0], beta=1e-200), [math.log(2) * 1e200, math.log(2) * 1e200])


def test_leaky_and_elu_special_values():
    assert np.array_equal(activate(A.LEAKY_RELU, [-2.0, 0.0, 3.0], negative_slope=0.2),
                          [-0.4, 0.0, 3.0])
    y = activate(A.LEAKY_RELU, [-2.0, 3.0], negative_slope=-1.5)     # any finite slope
    assert np.array_equal(y, [3.0, 3.0])
    assert np.array_equal(activate(A.LEAKY_RELU, [-2.0, 3.0], negative_slope=0.0), [0.0, 3.0])
    y = activate(A.ELU, [-1000.0, -1.0, 0.0, 2.0], alpha=2.5)
    close(y, [-2.5, 2.5 * math.expm1(-1.0), 0.0, 2.0])
    y = activate(A.ELU, [-1.0], alpha=-0.5)
    close(y, [-0.5 * math.expm1(-1.0)])
    # 0-d input stays 0-d; empty stays empty
    assert activate(A.ELU, -1.0, alpha=2.0).shape == ()
    assert activate(A.SOFTPLUS, np.zeros((0, 3)), beta=2.0).shape == (0, 3)
    assert ad.activate(A.SOFTPLUS, ad.variable(np.zeros((0, 3))), beta=2.0).shape == (0, 3)


def test_large_inputs_parallel_path_and_serial_twin():
    from hmath_dl._kernels import elementwise as E
    x = np.random.default_rng(0).standard_normal(300_001) * 20
    for act, p in ((A.LEAKY_RELU, 0.3), (A.ELU, 1.7), (A.SOFTPLUS, 2.5)):
        y = activate(act, x, **{PARAM[act]: p})
        out_s, out_p = np.empty_like(x), np.empty_like(x)
        assert E.activation_forward_param_serial(act.value, p, x, out_s) == 0
        assert E.activation_forward_param(act.value, p, x, out_p) == 0
        assert out_s.tobytes() == out_p.tobytes() == y.tobytes()
        d_s, d_p = np.empty_like(x), np.empty_like(x)
        E.activation_derivative_param_serial(act.value, p, x, d_s)
        E.activation_derivative_param(act.value, p, x, d_p)
        assert d_s.tobytes() == d_p.tobytes()
        o2, d2 = np.empty_like(x), np.empty_like(x)
        assert E.activation_forward_derivative_param(act.value, p, x, o2, d2) == 0
        assert o2.tobytes() == y.tobytes() and d2.tobytes() == d_p.tobytes()
        idx = np.random.default_rng(1).integers(0, x.size, 300)
        close(y[idx], ref_forward(act, p, x[idx]), rtol=1e-14)
        close(d_p[idx], ref_derivative(act, p, x[idx]), rtol=1e-14)


# ----------------------------------------------------------------------------- torch
@needs_torch
def test_against_torch():
    x = np.random.default_rng(2).standard_normal(500) * 6
    t = torch.tensor(x, dtype=torch.float64)
    for s in (0.01, 0.2, -0.7, 3.0):
        close(activate(A.LEAKY_RELU, x, negative_slope=s), F.leaky_relu(t, s).numpy(), rtol=0)
    for a in (1.0, 0.5, 2.0, -1.0):
        close(activate(A.ELU, x, alpha=a), F.elu(t, a).numpy(), rtol=1e-15)
    for b in (0.3, 1.0, 2.0, 7.5):
        close(activate(A.SOFTPLUS, x, beta=b), F.softplus(t, beta=b, threshold=1e30).numpy(),
              rtol=1e-14)
    # gradients
    for act, p, tf in ((A.LEAKY_RELU, 0.2, lambda z: F.leaky_relu(z, 0.2)),
                       (A.ELU, 1.5, lambda z: F.elu(z, 1.5)),
                       (A.SOFTPLUS, 2.0, lambda z: F.softplus(z, 2.0, threshold=1e30))):
        v = ad.variable(x)
        cot = np.random.default_rng(3).standard_normal(x.shape)
        (g,) = ad.gradients(ad.activate(act, v, **{PARAM[act]: p}), [v], cot)
        tt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        tf(tt).backward(torch.tensor(cot))
        close(g, tt.grad.numpy(), rtol=1e-14, atol=1e-300)


# ----------------------------------------------------------------------------- autodiff
@SET
@given(act=acts, data=st.data(), x=st.lists(st.floats(-8.0, 8.0).filter(lambda v: abs(v) > 1e-3),
                                            min_size=1, max_size=8))
def test_autodiff_gradients(act, data, x):
    p = data.draw(params[act])
    kw = {PARAM[act]: p}
    y = ad.activate(act, ad.variable(x), **kw)
    assert y.value.tobytes() == activate(act, x, **kw).tobytes()
    ad.check_gradients(lambda v: ad.activate(act, v, **kw), [np.array(x)], rtol=1e-5, atol=1e-7)
    v = ad.variable(x)
    (g,) = ad.gradients(ad.sum(ad.activate(act, v, **kw)), [v])
    close(g, ref_derivative(act, p, x), rtol=1e-14)


def test_autodiff_kinks_and_recomputed_derivative():
    v = ad.variable([0.0, -1.0, 2.0])
    (g,) = ad.gradients(ad.sum(ad.activate(A.LEAKY_RELU, v, negative_slope=0.3)), [v])
    assert np.array_equal(g, [0.3, 0.3, 1.0])          # left derivative at 0
    (g,) = ad.gradients(ad.sum(ad.activate(A.ELU, v, alpha=2.0)), [v])
    close(g, [2.0, 2.0 * math.exp(-1.0), 1.0])
    # derivative recomputed in the backward pass (node recorded without f'): same params
    from hmath_dl.autodiff.core import make_node
    from hmath_dl.autodiff.ops import _vjp_activate
    x = np.array([-2.0, 0.5, 3.0])
    node = make_node(ad.activate, activate(A.SOFTPLUS, x, beta=3.0), (ad.variable(x),),
                     (A.SOFTPLUS.value, None, 3.0))
    (gd,) = _vjp_activate(np.ones(3), node, (True,))
    close(gd, ref_derivative(A.SOFTPLUS, 3.0, x))


# ----------------------------------------------------------------------------- errors
def _raises(exc, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith("activate:"), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("fn", [activate, ad.activate])
def test_parameter_errors(fn):
    x = [1.0, -2.0]
    for act in Activation:
        for name in ("negative_slope", "alpha", "beta"):
            if PARAM.get(act) == name:
                continue
            msg = _raises(DomainError, fn, act, x, **{name: 0.5})
            assert name in msg and act.name in msg
            _raises(DomainError, fn, act, x, **{name: DEFAULT.get(act, 1.0)})
    for act, name in PARAM.items():
        for bad in (np.nan, np.inf, -np.inf):
            _raises(DomainError, fn, act, x, **{name: bad})
        with pytest.raises(TypeError):
            fn(act, x, **{name: "0.1"})
        with pytest.raises(TypeError):
            fn(act, x, **{name: True})
    for bad in (0.0, -0.0, -1.0, -1e-300):
        _raises(DomainError, fn, A.SOFTPLUS, x, beta=bad)
    with pytest.raises(TypeError):
        fn(A.LEAKY_RELU, x, 0.2)              # keyword-only
    # the parameter is checked even for an empty x
    _raises(DomainError, fn, A.RELU, np.zeros(0), alpha=1.0)


def test_nonfinite_inputs_and_overflow():
    for act, name in PARAM.items():
        for bad in (np.nan, np.inf):
            _raises(NonFiniteError, activate, act, [1.0, bad], **{name: 0.5})
            _raises(NonFiniteError, ad.activate, act, [1.0, bad], **{name: 0.5})
    _raises(NumericOverflow, activate, A.LEAKY_RELU, [-1e300], negative_slope=1e10)
    _raises(NumericOverflow, ad.activate, A.LEAKY_RELU, ad.variable([-1e300]), negative_slope=1e10)
    _raises(NumericOverflow, activate, A.SOFTPLUS, [1.0], beta=1e-320)
    _raises(NumericOverflow, activate, A.SOFTPLUS, [1.5e308], beta=3e-309)  # x + 1.6e308
    assert activate(A.SOFTPLUS, [1.7e308], beta=0.001)[0] == 1.7e308
    # ELU cannot overflow: |alpha expm1(x)| <= |alpha|
    assert np.isfinite(activate(A.ELU, [-1e300], alpha=1.7e308)).all()


def test_inputs_not_mutated():
    x = np.array([-1.0, 0.5, 2.0])
    xc = x.copy()
    for act, name in PARAM.items():
        activate(act, x, **{name: 0.7})
        ad.activate(act, ad.variable(x), **{name: 0.7})
    assert np.array_equal(x, xc)
