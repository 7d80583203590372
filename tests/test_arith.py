"""The parallel element-wise sums and products (hmath_dl._kernels.arith) behind the
autodiff's large ``+`` / ``*``, its gradient sums and the activation vjp: numpy's bits
(IEEE sums and products are correctly rounded), the non-finite count of the same pass,
any schedule; and the autodiff paths that use them against numpy."""

import numpy as np
import pytest

from hmath_dl import autodiff as ad
from hmath_dl._kernels import arith
from hmath_dl._kernels._jit import forced_schedule
from hmath_dl.activations import Activation
from hmath_dl.errors import NumericOverflow

SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 5e-324, -2.2250738585072014e-308, 1e308]


def _operands(n, seed, special=True):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))
    b = rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))
    if special:
        for k, v in enumerate(SPECIAL):
            a[(97 * k + 13) % n] = v
            b[(61 * k + 7) % n] = SPECIAL[-1 - k]
            b[(89 * k + 3) % n] = v
    return a, b


@pytest.mark.parametrize("n", [arith.MIN_SIZE, arith.MIN_SIZE + 1, 100003, 1 << 18])
@pytest.mark.parametrize("schedule", ["serial", "parallel"])
@pytest.mark.parametrize("mul", [False, True])
def test_numpy_bits_and_the_nonfinite_count(n, schedule, mul):
    a, b = _operands(n, n)
    with np.errstate(all="ignore"):
        want = a * b if mul else a + b
    with forced_schedule(schedule):
        got, bad = arith.binary(a, b, mul)
    assert got.tobytes() == want.tobytes()
    assert bad == int(np.count_nonzero(~np.isfinite(want)))
    assert bad > 0


def test_finite_operands_count_zero_and_inputs_are_not_written():
    a, b = _operands(70001, 3, special=False)
    a.flags.writeable = False
    keep = b.copy()
    got, bad = arith.binary(a, b, False)
    assert bad == 0 and got.tobytes() == (a + b).tobytes()
    assert b.tobytes() == keep.tobytes()
    assert got.flags.c_contiguous and got.flags.writeable


def test_applies_only_to_large_contiguous_float64_operands_of_one_shape():
    a = np.ones((256, 256))
    assert arith.applies(a, a.copy())
    assert not arith.applies(a[:100], a[:100])                 # below MIN_SIZE
    assert not arith.applies(a, a[:, :1])                       # broadcast
    assert not arith.applies(a.T, a)                            # not C-contiguous
    assert not arith.applies(a.astype(np.float32), a)


def test_autodiff_large_sum_and_product_match_numpy_and_their_gradients():
    rng = np.random.default_rng(5)
    xv, yv = rng.standard_normal((300, 200)), rng.standard_normal((300, 200))
    x, y = ad.variable(xv), ad.variable(yv)
    assert (x + y).value.tobytes() == (xv + yv).tobytes()
    assert (x * y).value.tobytes() == (xv * yv).tobytes()
    # x reaches the loss along two paths, with cotangents exactly c1 and c2 (1 * c): the
    # tape sums them (in either order: addition is commutative, bit for bit)
    c1 = ad.constant(rng.standard_normal((300, 200)))
    c2 = ad.constant(rng.standard_normal((300, 200)))
    loss = ad.sum(x * c1) + ad.sum(x * c2)
    (gx,) = ad.gradients(loss, [x])
    assert gx.tobytes() == (c1.value + c2.value).tobytes()


def test_autodiff_large_sum_overflow_raises_numeric_overflow():
    big = np.full((256, 256), 1e308)
    x = ad.variable(big)
    with pytest.raises(NumericOverflow, match="a sum overflowed"):
        x + x
    with pytest.raises(NumericOverflow, match="a product overflowed"):
        x * x


def test_activation_vjp_is_g_times_the_derivative():
    rng = np.random.default_rng(9)
    xv = rng.standard_normal((256, 300))
    gv = rng.standard_normal((256, 300))
    from hmath_dl._kernels.elementwise import activation_derivative
    for act in (Activation.GELU, Activation.RELU):
        d = np.empty(xv.size)
        assert activation_derivative(act.value, xv.reshape(-1), d)
        x = ad.variable(xv)
        (gx,) = ad.gradients(ad.activate(act, x), [x], gv)
        assert gx.tobytes() == (gv * d.reshape(xv.shape)).tobytes()


def test_add_and_multiply_fall_back_to_numpy_where_binary_does_not_apply():
    a, b = _operands(arith.MIN_SIZE + 5, 11)
    small, col = a[:100].copy(), a[:100].reshape(100, 1)
    with np.errstate(all="ignore"):
        for x, y in ((a, b), (small, b[:100]), (small.reshape(1, 100), col)):
            assert arith.add(x, y).tobytes() == (x + y).tobytes()
            assert arith.multiply(x, y).tobytes() == (x * y).tobytes()
