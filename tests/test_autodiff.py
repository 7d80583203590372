"""hmath_dl.autodiff: the tape, the primitive rules, check_gradients."""

import numpy as np

from tests.reference import gemm as reference_gemm
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from hmath_dl import autodiff as ad
from hmath_dl.activations import Activation, activate as plain_activate
from hmath_dl.autodiff.core import make_node, register_vjp
from hmath_dl.errors import (DomainError, IndexOutOfRange, MathError, NonFiniteError,
                             NumericOverflow, ShapeError)
from tests.helpers import noncontiguous, readonly
from tests.reference import autodiff as ref

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)
seeds = st.integers(0, 2**32 - 1)
from tests.reference.reduce import sum_to_oracle


def rnd(seed, shape, lo=None):
    g = np.random.default_rng(seed)
    x = g.standard_normal(shape)
    if lo is not None:
        x = np.abs(x) + lo
    return x


def raises(exc, fname, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(fname), str(info.value)
    return info.value


# ----------------------------------------------------------------------------- leaves
def test_variable_and_constant_copy_and_freeze():
    src = np.arange(6.0).reshape(2, 3)
    v = ad.variable(src)
    c = ad.constant(src)
    src[0, 0] = 100.0
    assert v.value[0, 0] == 0.0 and c.value[0, 0] == 0.0
    assert not v.value.flags.writeable and not c.value.flags.writeable
    assert v.shape == (2, 3) and v.ndim == 2 and v.value.dtype == np.float64
    assert ad.variable(2.5).shape == () and ad.constant([1, 2]).value.dtype == np.float64


@pytest.mark.parametrize("maker", [readonly, noncontiguous, lambda a: a.tolist(),
                                   lambda a: a.astype(np.float32)])
def test_leaf_input_kinds(maker):
    a = np.arange(6.0).reshape(2, 3)
    v = ad.variable(maker(a))
    assert np.array_equal(v.value, a) and v.value.flags.c_contiguous


def test_leaf_errors():
    raises(NonFiniteError, "variable", ad.variable, [1.0, np.nan])
    raises(NonFiniteError, "constant", ad.constant, [np.inf])
    raises(TypeError, "variable", ad.variable, "abc")
    raises(TypeError, "constant", ad.constant, [1 + 2j])


# ----------------------------------------------------------------------------- gradients
def test_scalar_output_and_list_return():
    x = ad.variable([1.0, 2.0, 3.0])
    y = ad.sum(x * x)
    g = ad.gradients(y, x)
    assert isinstance(g, list) and len(g) == 1
    assert np.array_equal(g[0], [2.0, 4.0, 6.0])
    g2 = ad.gradients(y, (x, x))
    assert np.array_equal(g2[0], g2[1]) and g2[0] is not g2[1]
    g2[0][0] = 7.0  # caller owns the result
    assert g2[1][0] == 2.0


def test_shared_subexpressions_accumulate():
    x = ad.variable([0.5, -1.5])
    a = x * x          # used twice
    y = ad.sum(a * a + a + x)  # x^4 + x^2 + x
    (g,) = ad.gradients(y, [x])
    xv = np.array([0.5, -1.5])
    assert np.array_equal(g, 4 * xv**3 + 2 * xv + 1)


def test_independent_variable_gets_zeros():
    x = ad.variable([1.0, 2.0])
    z = ad.variable(np.ones((2, 3)))
    gx, gz = ad.gradients(ad.sum(x), [x, z])
    assert np.array_equal(gx, [1.0, 1.0]) and np.array_equal(gz, np.zeros((2, 3)))
    # an output built from constants only
    gz2 = ad.gradients(ad.sum(ad.constant([1.0]) * 2), [z])
    assert np.array_equal(gz2[0], np.zeros((2, 3)))


def test_size_one_outputs_are_scalars():
    x = ad.variable([[2.0]])
    (g,) = ad.gradients(x * x, x)
    assert g.shape == (1, 1) and g[0, 0] == 4.0


@given(seed=seeds, shape=shapes)
def test_cotangent_for_nonscalar_output(seed, shape):
    x = rnd(seed, shape)
    cot = rnd(seed + 1, shape)
    v = ad.variable(x)
    (g,) = ad.gradients(ad.tanh(v) * v, [v], cot)
    expect = ref.numeric_gradient(lambda a: np.tanh(a) * a, [x], cot)[0]
    np.testing.assert_allclose(g, expect, rtol=1e-6, atol=1e-8)


def test_gradients_errors():
    x = ad.variable([1.0, 2.0])
    y = x * 3.0
    raises(ShapeError, "gradients", ad.gradients, y, [x])
    raises(ShapeError, "gradients", ad.gradients, y, [x], np.ones(3))
    raises(ShapeError, "gradients", ad.gradients, ad.sum(y), [x], np.ones(2))
    raises(NonFiniteError, "gradients", ad.gradients, y, [x], [1.0, np.nan])
    raises(DomainError, "gradients", ad.gradients, ad.sum(y), [ad.constant([1.0, 2.0])])
    raises(DomainError, "gradients", ad.gradients, ad.sum(y), [y])
    raises(TypeError, "gradients", ad.gradients, ad.sum(y), [np.ones(2)])
    raises(TypeError, "gradients", ad.gradients, ad.sum(y), np.ones(2))
    raises(TypeError, "gradients", ad.gradients, np.ones(1), [x])


def test_gradient_overflow_is_reported():
    x = ad.variable([0.0, 1.0])
    raises(NumericOverflow, "gradients", ad.gradients, ad.sum(ad.sqrt(x)), [x])
    big = ad.variable([1e200])
    raises(NumericOverflow, "gradients", ad.gradients, big * 1e100, [big], [1e300])


def test_long_chain_has_no_recursion_limit():
    x = ad.variable([1.0, 2.0])
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    (g,) = ad.gradients(ad.sum(y), [x])
    expect = 1.0
    for _ in range(10_000):
        expect *= 1.0001
    np.testing.assert_allclose(g, [expect, expect], rtol=1e-12)


def test_long_chain_of_adds_is_exact():
    x = ad.variable(np.ones(3))
    y = x
    for _ in range(10_000):
        y = y + x
    (g,) = ad.gradients(ad.sum(y), [x])
    assert np.array_equal(g, np.full(3, 10_001.0))


# ----------------------------------------------------------------------------- arithmetic
bshapes = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@given(seed=seeds, bs=bshapes)
def test_binary_ops_broadcast(op, seed, bs):
    sa, sb = bs.input_shapes
    a = rnd(seed, sa)
    b = rnd(seed + 1, sb, lo=0.5) if op == "div" else rnd(seed + 1, sb)
    f = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y,
         "mul": lambda x, y: x * y, "div": lambda x, y: x / y}[op]
    out = f(ad.variable(a), ad.variable(b))
    assert out.shape == bs.result_shape
    assert np.array_equal(out.value, f(a, b))
    ad.check_gradients(f, [a, b])
    cot = rnd(seed + 2, bs.result_shape)
    va, vb = ad.variable(a), ad.variable(b)
    ga, gb = ad.gradients(f(va, vb), [va, vb], cot)
    ea, eb = ref.numeric_gradient(f, [a, b], cot)
    assert ga.shape == sa and gb.shape == sb
    np.testing.assert_allclose(ga, ea, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gb, eb, rtol=1e-6, atol=1e-7)


def test_operators_with_plain_operands():
    x = ad.variable([1.0, 2.0])
    for y, expect in [(x + 1, [2, 3]), (1 + x, [2, 3]), (np.ones(2) + x, [2, 3]),
                      (x - [1, 1], [0, 1]), ([3, 3] - x, [2, 1]), (2 * x, [2, 4]),
                      (x / 2, [0.5, 1]), (2 / x, [2, 1]), (-x, [-1, -2]), (+x, [1, 2]),
                      (x ** 2, [1, 4]), (np.eye(2) @ x, [1, 2]), (x @ np.eye(2), [1, 2])]:
        assert isinstance(y, ad.ADTensor)
        assert np.array_equal(y.value, expect)
    (g,) = ad.gradients(ad.sum(2 / x + np.ones(2) * x), [x])
    assert np.array_equal(g, [-2 + 1, -0.5 + 1])


def test_power_rule():
    ad.check_gradients(lambda x: x ** 3, [np.array([0.3, -1.2, 2.0])])
    ad.check_gradients(lambda x: x ** 0.5, [np.array([0.3, 1.2, 2.0])])
    ad.check_gradients(lambda x: x ** -2, [np.array([0.3, -1.2, 2.0])])
    x = ad.variable([0.0, 2.0])
    (g,) = ad.gradients(ad.sum(x ** 0), [x])
    assert np.array_equal(g, [0.0, 0.0])


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)),
                                   ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 1))])
def test_matmul(sa, sb):
    a, b = rnd(1, sa), rnd(2, sb)
    out = ad.variable(a) @ ad.variable(b)
    # one fma chain per output in k order (the library's own GEMM): an independent oracle
    assert out.value.tobytes() == reference_gemm.matmul(a, b).tobytes()
    assert np.allclose(out.value, a @ b, rtol=1e-13, atol=1e-13)
    ad.check_gradients(lambda x, y: x @ y, [a, b])


def test_arithmetic_errors():
    x = ad.variable([1.0, 2.0])
    raises(ShapeError, "ADTensor.__add__", lambda: x + np.ones(3))
    raises(ShapeError, "ADTensor.__mul__", lambda: x * np.ones((2, 3)))
    raises(NumericOverflow, "ADTensor.__truediv__", lambda: x / 0.0)
    raises(NumericOverflow, "ADTensor.__truediv__", lambda: 0.0 / (x - x))
    raises(NumericOverflow, "ADTensor.__mul__", lambda: x * 1e308 * 10.0)
    raises(NumericOverflow, "ADTensor.__add__", lambda: (ad.variable([1.0]) * 1e308) + 1e308)
    raises(NumericOverflow, "ADTensor.__pow__", lambda: (x - 3.0) ** 0.5)
    raises(TypeError, "ADTensor.__pow__", lambda: x ** x)
    raises(TypeError, "ADTensor.__pow__", lambda: x ** "a")
    raises(ShapeError, "ADTensor.__matmul__", lambda: x @ np.ones(3))
    raises(ShapeError, "ADTensor.__matmul__", lambda: x @ ad.constant(1.0))
    raises(ShapeError, "ADTensor.__matmul__",
           lambda: ad.constant(np.ones((2, 2, 3))) @ np.ones((3, 3, 1)))
    raises(NonFiniteError, "ADTensor.__add__", lambda: x + np.nan)
    raises(TypeError, "ADTensor.__add__", lambda: x + "s")


# ----------------------------------------------------------------------------- elementwise
@pytest.mark.parametrize("name,lo", [("exp", None), ("log", 0.2), ("sqrt", 0.2), ("tanh", None)])
@given(seed=seeds, shape=shapes)
def test_unary(name, lo, seed, shape):
    x = rnd(seed, shape, lo=lo)
    fn = getattr(ad, name)
    y = fn(ad.variable(x))
    if name == "sqrt":      # correctly rounded: numpy's bits exactly
        assert np.array_equal(y.value, np.sqrt(x))
    else:
        # the library's own exp/log/tanh (hmath_dl._kernels.libm, <= 1 ulp of the exact
        # value, proven against mpmath in tests/test_libm.py): within 2 ulps of numpy's
        np.testing.assert_allclose(y.value, getattr(np, name)(x), rtol=4.5e-16, atol=1e-300)
        from hmath_dl._kernels import libm
        assert np.array_equal(y.value, np.vectorize(getattr(libm, name))(x))
    ad.check_gradients(fn, [x])


def test_unary_errors():
    raises(NumericOverflow, "exp", ad.exp, ad.variable([800.0]))
    raises(NumericOverflow, "log", ad.log, ad.variable([0.0]))
    raises(NumericOverflow, "log", ad.log, ad.variable([-1.0]))
    raises(NumericOverflow, "sqrt", ad.sqrt, ad.variable([-1.0]))
    raises(NonFiniteError, "tanh", ad.tanh, [np.inf])
    raises(TypeError, "exp", ad.exp, None)


@pytest.mark.parametrize("act", list(Activation))
@settings(max_examples=10)
@given(seed=seeds, shape=shapes)
def test_activate(act, seed, shape):
    x = rnd(seed, shape)
    x = np.where(np.abs(x) < 1e-3, 0.5, x)  # away from kinks
    y = ad.activate(act, ad.variable(x))
    assert np.array_equal(y.value, plain_activate(act, x))
    ad.check_gradients(lambda v: ad.activate(act, v), [x])


def test_activate_errors():
    raises(TypeError, "activate", ad.activate, "relu", ad.variable([1.0]))
    raises(NonFiniteError, "activate", ad.activate, Activation.RELU, [np.nan])


# ----------------------------------------------------------------------------- reductions
@given(seed=seeds, shape=shapes, data=st.data())
def test_sum_and_mean(seed, shape, data):
    x = rnd(seed, shape)
    nd = len(shape)
    axis = data.draw(st.one_of(st.none(), st.integers(-nd, nd - 1),
                               st.lists(st.integers(0, nd - 1), unique=True).map(tuple)))
    keep = data.draw(st.booleans())
    s = ad.sum(ad.variable(x), axis, keep)
    m = ad.mean(ad.variable(x), axis=axis, keepdims=keep)
    # the documented fixed order bit for bit (not numpy's pairwise order), numpy's value
    # up to rounding
    axes = tuple(range(nd)) if axis is None else tuple(
        a % nd for a in (axis if isinstance(axis, tuple) else (axis,)))
    want = sum_to_oracle(x, [i not in axes for i in range(nd)])
    np.testing.assert_array_equal(s.value.reshape(want.shape), want)
    np.testing.assert_allclose(s.value, np.sum(x, axis=axis, keepdims=keep), rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(m.value, np.mean(x, axis=axis, keepdims=keep), rtol=1e-15, atol=1e-15)
    ad.check_gradients(lambda v: ad.sum(v, axis, keep), [x])
    ad.check_gradients(lambda v: ad.mean(v, axis, keep), [x])


def test_reduction_errors():
    x = ad.variable(np.ones((2, 3)))
    raises(DomainError, "sum", ad.sum, x, 2)
    raises(DomainError, "mean", ad.mean, x, -3)
    raises(DomainError, "sum", ad.sum, x, (0, 0))
    raises(TypeError, "sum", ad.sum, x, 0.5)
    raises(TypeError, "mean", ad.mean, x, 0, "yes")
    raises(NumericOverflow, "mean", ad.mean, ad.variable(np.ones((0, 3))), 0)
    raises(NumericOverflow, "sum", ad.sum, ad.variable([1e308, 1e308]))


# ----------------------------------------------------------------------------- shapes
def test_reshape_transpose():
    x = rnd(3, (2, 3, 4))
    assert np.array_equal(ad.reshape(ad.variable(x), (4, -1)).value, x.reshape(4, -1))
    assert np.array_equal(ad.transpose(ad.variable(x)).value, x.T)
    assert np.array_equal(ad.transpose(ad.variable(x), (1, -1, 0)).value, x.transpose(1, 2, 0))
    ad.check_gradients(lambda v: ad.reshape(v, (6, 4)) * np.arange(24.0).reshape(6, 4), [x])
    ad.check_gradients(lambda v: ad.transpose(v, (2, 0, 1)) * rnd(4, (4, 2, 3)), [x])
    raises(ShapeError, "reshape", ad.reshape, ad.variable(x), (5, 5))
    raises(DomainError, "reshape", ad.reshape, ad.variable(x), (-2, 12))
    raises(TypeError, "reshape", ad.reshape, ad.variable(x), "ab")
    raises(DomainError, "transpose", ad.transpose, ad.variable(x), (0, 1))
    raises(DomainError, "transpose", ad.transpose, ad.variable(x), (0, 1, 1))
    raises(DomainError, "transpose", ad.transpose, ad.variable(x), (0, 1, 3))


# ----------------------------------------------------------------------------- softmax, losses
@given(seed=seeds, shape=shapes, data=st.data())
def test_softmax_family(seed, shape, data):
    x = rnd(seed, shape) * 3
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    s = ad.softmax(ad.variable(x), axis)
    ls = ad.log_softmax(ad.variable(x), axis=axis)
    moved = np.moveaxis(x, axis, -1)
    np.testing.assert_allclose(s.value, np.moveaxis(ref.softmax_rows(moved), -1, axis),
                               rtol=1e-14, atol=1e-16)
    np.testing.assert_allclose(ls.value, np.moveaxis(ref.log_softmax_rows(moved), -1, axis),
                               rtol=1e-13, atol=1e-14)
    ad.check_gradients(lambda v: ad.softmax(v, axis), [x])
    ad.check_gradients(lambda v: ad.log_softmax(v, axis), [x])


def test_softmax_extremes_and_errors():
    y = ad.softmax(ad.variable([1000.0, 0.0]))
    assert np.array_equal(y.value, [1.0, 0.0])
    raises(ShapeError, "softmax", ad.softmax, ad.variable(1.0))
    raises(DomainError, "log_softmax", ad.log_softmax, ad.variable([1.0]), 1)


@given(seed=seeds, b=st.integers(1, 5), c=st.integers(1, 5))
def test_cross_entropy(seed, b, c):
    x = rnd(seed, (b, c)) * 2
    labels = np.random.default_rng(seed).integers(0, c, size=b)
    ce = ad.cross_entropy(ad.variable(x), labels)
    assert ce.shape == ()
    np.testing.assert_allclose(ce.value, ref.cross_entropy(x, labels), rtol=1e-13, atol=1e-15)
    ad.check_gradients(lambda v: ad.cross_entropy(v, labels), [x])
    ad.check_gradients(lambda v: ad.cross_entropy(v, labels.tolist()), [x])


def test_cross_entropy_sums_the_picked_log_probabilities_in_batch_order():
    """The loss is ``-(sum over b, increasing, from +0.0, of log_softmax(x)[b, y[b]]) / B``
    bit for bit: the picked values (taken from the library's own ``log_softmax``, whose
    bits its own tests hold) summed here one addition at a time."""
    g = np.random.default_rng(11)
    for b, c in ((1, 3), (7, 5), (300, 64)):
        x = g.standard_normal((b, c)) * 40
        labels = g.integers(0, c, size=b)
        lsm = ad.log_softmax(ad.variable(x), 1).value
        s = 0.0
        for i in range(b):
            s = s + float(lsm[i, labels[i]])
        want = np.float64(-s / b)
        got = ad.cross_entropy(ad.variable(x), labels).value
        assert np.asarray(got).tobytes() == want.tobytes()
        # a reordered (reversed) sum gives other bits for large B: the test can tell
        if b == 300:
            r = 0.0
            for i in reversed(range(b)):
                r = r + float(lsm[i, labels[i]])
            assert np.float64(-r / b).tobytes() != want.tobytes() or r == s


def test_cross_entropy_errors():
    x = ad.variable(np.zeros((2, 3)))
    err = raises(IndexOutOfRange, "cross_entropy", ad.cross_entropy, x, [0, 3])
    assert isinstance(err, IndexError)
    raises(IndexOutOfRange, "cross_entropy", ad.cross_entropy, x, [-1, 0])
    raises(ShapeError, "cross_entropy", ad.cross_entropy, x, [0, 1, 2])
    raises(ShapeError, "cross_entropy", ad.cross_entropy, ad.variable(np.zeros(3)), [0])
    raises(ShapeError, "cross_entropy", ad.cross_entropy, ad.variable(np.zeros((0, 3))), np.zeros(0, int))
    raises(TypeError, "cross_entropy", ad.cross_entropy, x, [0.0, 1.0])


@given(seed=seeds, shape=shapes, as_variable=st.booleans())
def test_mse(seed, shape, as_variable):
    p, t = rnd(seed, shape), rnd(seed + 1, shape)
    target = ad.variable(t) if as_variable else t
    m = ad.mse(ad.variable(p), target)
    np.testing.assert_allclose(m.value, ref.mse(p, t), rtol=1e-14)
    ad.check_gradients(lambda a, b: ad.mse(a, b), [p, t])
    ad.check_gradients(lambda a: ad.mse(a, t), [p])


def test_mse_errors():
    raises(ShapeError, "mse", ad.mse, ad.variable(np.ones(3)), np.ones(4))
    raises(ShapeError, "mse", ad.mse, ad.variable(np.ones(0)), np.ones(0))
    raises(NonFiniteError, "mse", ad.mse, ad.variable(np.ones(2)), [1.0, np.inf])


# ----------------------------------------------------------------------------- a small model
def test_two_layer_network_against_reference():
    x, w1, w2 = rnd(1, (5, 3)), rnd(2, (3, 4)), rnd(3, (4, 2))
    labels = np.array([0, 1, 1, 0, 1])

    def model(w1, w2):
        h = ad.tanh(ad.constant(x) @ w1)
        return ad.cross_entropy(h @ w2, labels)

    def plain(w1, w2):
        return np.array(ref.cross_entropy(np.tanh(x @ w1) @ w2, labels))

    v1, v2 = ad.variable(w1), ad.variable(w2)
    g1, g2 = ad.gradients(model(v1, v2), [v1, v2])
    e1, e2 = ref.numeric_gradient(plain, [w1, w2], np.array(1.0))
    np.testing.assert_allclose(g1, e1, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(g2, e2, rtol=1e-6, atol=1e-9)


def test_inputs_never_mutated():
    a = rnd(5, (3, 4))
    b = rnd(6, (4,))
    cot = rnd(7, (3,))
    before = [a.copy(), b.copy(), cot.copy()]
    va, vb = ad.variable(a), ad.variable(b)
    y = ad.softmax(va @ vb + b[:3], 0)
    ad.gradients(y, [va, vb], cot)
    for x, x0 in zip([a, b, cot], before):
        assert np.array_equal(x, x0)


# ----------------------------------------------------------------------------- check_gradients
def test_check_gradients_detects_a_wrong_rule():
    register_vjp({"test_wrong_square": lambda g, node, needs: (3.0 * g * node.parents[0].value,)})

    def wrong_square(x):
        return make_node("test_wrong_square", x.value * x.value, (x,))

    with pytest.raises(AssertionError, match="check_gradients: gradient of input 0"):
        ad.check_gradients(wrong_square, [np.array([1.0, 2.0])])
    # and accepts the correct rule, returning the largest error
    err = ad.check_gradients(lambda x: x * x, [np.array([1.0, 2.0])])
    assert 0.0 <= err < 1e-7


def test_check_gradients_errors():
    raises(TypeError, "check_gradients", ad.check_gradients, 3, [np.ones(2)])
    raises(TypeError, "check_gradients", ad.check_gradients, lambda x: x, np.ones(2))
    raises(TypeError, "check_gradients", ad.check_gradients, lambda x: 1.0, [np.ones(2)])
    raises(DomainError, "check_gradients", ad.check_gradients, lambda x: x, [np.ones(2)], eps=0.0)
    raises(NonFiniteError, "check_gradients", ad.check_gradients, lambda x: x, [[np.nan]])


def test_errors_are_math_errors_or_type_errors():
    assert issubclass(NumericOverflow, MathError)


def test_gradient_utilities_are_shared():
    gu = pytest.importorskip("hmath_dl._gradutils")
    assert ad.gradient_norm is gu.gradient_norm
    assert ad.clip_gradients is gu.clip_gradients
    import hmath_dl.precision as prec
    assert getattr(prec, "gradient_norm", gu.gradient_norm) is gu.gradient_norm


def test_tape_values_are_not_scanned_again_while_read_only(monkeypatch):
    """Large tape values are recorded as checked (``_checks.mark_finite``): a layer given
    one skips its finiteness scan -- but only while the array is still read-only, and
    only for that very array (a copy, a view or a small array is scanned as before).  An
    owner that makes a tape value writeable and puts a NaN in it gets NonFiniteError."""
    from hmath_dl import _checks
    scans = []
    real = _checks.require_finite
    monkeypatch.setattr(_checks, "require_finite",
                        lambda f, n, a: (scans.append(a.size), real(f, n, a)))
    x = ad.variable(np.random.default_rng(0).standard_normal((64, 128)))
    y = ad.activate(Activation.RELU, x) * 2.0          # tape values of 8192 elements
    assert _checks.known_finite(x.value) and _checks.known_finite(y.value)
    scans.clear()
    assert _checks.tensor("f", "y", y.value) is y.value and scans == []
    view = y.value[:10]
    _checks.tensor("f", "y", view)
    _checks.tensor("f", "y", np.array(y.value))
    assert scans == [view.size, y.value.size]
    small = ad.variable(np.ones(10))
    assert not _checks.known_finite(small.value)
    # a tape value that is a view of another (a reshape) is checked again once its base
    # has been made writeable
    z = ad.activate(Activation.RELU, x)
    flat = ad.reshape(z, (-1,))
    if flat.value.base is not None:
        assert _checks.known_finite(flat.value)
        base = flat.value.base
        while base.base is not None and isinstance(base.base, np.ndarray):
            base = base.base
        base.setflags(write=True)
        assert not _checks.known_finite(flat.value)
    # an owner that makes the value writeable again is checked again
    owned = ad.variable(np.ones((64, 128))).value
    scans.clear()
    owned.setflags(write=True)
    owned[3, 4] = np.nan
    assert not _checks.known_finite(owned)
    with pytest.raises(NonFiniteError):
        _checks.tensor("f", "x", owned)
    assert scans == [owned.size]
