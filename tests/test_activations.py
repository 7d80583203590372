import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from hmath_dl.activations import ACTIVATION_CODES, Activation, activate
from hmath_dl.errors import NonFiniteError
from hmath_dl._kernels.elementwise import activation_derivative, activation_forward
from tests.helpers import assert_same_across_threads, noncontiguous, readonly
from tests.reference import layers_basic as ref

ALL = list(Activation)
# Maximum error allowed against the correctly rounded mpmath value, in units of
# float64 eps relative to max(|ref|, tiny).  Every formula is a handful of correctly
# rounded libm calls; a few ulps is the honest bound.
ULPS = 8


def _condition(name, x):
    """Relative condition number of the float64 evaluation w.r.t. rounding the inner
    argument: GELU's erfc(-x/sqrt 2) amplifies the rounding of x/sqrt 2 by ~x**2 in the
    tail, GELU_TANH's sigmoid(2u) that of u by ~2|u| (u ~ 0.036 x**3); the derivatives
    add one more power of x."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    if name == "GELU":
        return 2 * x * x
    if name == "GELU_TANH":
        return 0.2 * x ** 3 + 2 * x * x
    return 0.0 * x


def _close(got, want, ulps=ULPS, abs_floor=0.0, cond=0.0):
    got = np.asarray(got)
    want = np.asarray(want)
    tol = (ulps + cond) * np.finfo(float).eps * np.abs(want) + abs_floor
    bad = np.abs(got - want) > tol
    assert not bad.any(), (got[bad], want[bad])


def test_codes_are_values():
    assert [a.value for a in ALL] == list(range(10))
    assert all(ACTIVATION_CODES[a] == a.value for a in ALL)
    assert [a.name for a in ALL] == ["IDENTITY", "RELU", "LEAKY_RELU", "GELU", "GELU_TANH",
                                     "SILU", "SIGMOID", "TANH", "SOFTPLUS", "ELU"]


finite = st.floats(-40, 40, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("act", ALL, ids=lambda a: a.name)
@given(x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4), elements=finite))
def test_matches_reference(act, x):
    got = activate(act, x)
    assert got.shape == x.shape and got.dtype == np.float64
    assert got.flags.c_contiguous
    # absolute floor: values below ~1e-300 are where libm exp underflows gradually
    _close(got, ref.activation(act.name, x), abs_floor=1e-300, cond=_condition(act.name, x))


SPECIAL = np.array([-1000.0, -745.0, -40.0, -20.0, -5.0, -1.0, -1e-300, -0.0, 0.0, 1e-300,
                    1e-8, 0.5, 1.0, 5.0, 20.0, 40.0, 709.0, 1000.0, 1e200, -1e200])


@pytest.mark.parametrize("act", ALL, ids=lambda a: a.name)
def test_special_values(act):
    got = activate(act, SPECIAL)
    assert np.isfinite(got).all()
    _close(got, ref.activation(act.name, SPECIAL), abs_floor=1e-300,
           cond=np.minimum(_condition(act.name, SPECIAL), 1e6))


def test_hand_derived_limits():
    assert activate(Activation.SOFTPLUS, [1000.0])[0] == 1000.0
    assert activate(Activation.SOFTPLUS, [-1000.0])[0] == 0.0
    assert activate(Activation.SIGMOID, [-1000.0])[0] == 0.0
    assert activate(Activation.SIGMOID, [1000.0])[0] == 1.0
    assert activate(Activation.SIGMOID, [0.0])[0] == 0.5
    assert activate(Activation.SILU, [1000.0])[0] == 1000.0
    assert activate(Activation.GELU, [1000.0])[0] == 1000.0
    assert activate(Activation.GELU, [-1000.0])[0] == 0.0
    assert activate(Activation.LEAKY_RELU, [-2.0])[0] == -0.02
    assert activate(Activation.RELU, [-3.0, 3.0]).tolist() == [0.0, 3.0]
    assert activate(Activation.ELU, [-1000.0])[0] == -1.0


@pytest.mark.parametrize("act", ALL, ids=lambda a: a.name)
def test_derivative_kernel(act):
    x = np.concatenate([SPECIAL[np.abs(SPECIAL) < 1e10],
                        np.random.default_rng(1).uniform(-8, 8, 50)])
    out = np.empty_like(x)
    assert activation_derivative(act.value, x, out)
    _close(out, ref.activation_derivative(act.name, x), ulps=64, abs_floor=1e-300,
           cond=_condition(act.name, x) * (1 + np.abs(x)))
    big = np.array([1e200, -1e200, 1e12, -1e12])
    out = np.empty_like(big)
    assert activation_derivative(act.value, big, out)
    _close(out, ref.activation_derivative(act.name, big), ulps=64, abs_floor=1e-300)


@pytest.mark.parametrize("act", ALL, ids=lambda a: a.name)
def test_kernels_report_nonfinite_input(act):
    for bad in (np.nan, np.inf, -np.inf):
        x = np.zeros(9000)
        x[5000] = bad
        out = np.empty_like(x)
        assert not activation_forward(act.value, x, out)
        assert not activation_derivative(act.value, x, out)
        x[5000] = 0.0
        assert activation_forward(act.value, x, out)


@pytest.mark.parametrize("act", ALL, ids=lambda a: a.name)
def test_forward_kernel_in_place(act):
    x = np.random.default_rng(2).uniform(-5, 5, 9000)
    want = activate(act, x)
    buf = x.copy()
    assert activation_forward(act.value, buf, buf)
    assert np.array_equal(buf, want)


def test_input_forms_and_no_mutation():
    base = np.random.default_rng(3).standard_normal((3, 4))
    want = activate(Activation.GELU, base)
    x = base.copy()
    activate(Activation.GELU, x)
    assert np.array_equal(x, base)
    assert np.array_equal(activate(Activation.GELU, noncontiguous(base)), want)
    assert np.array_equal(activate(Activation.GELU, readonly(base)), want)
    assert np.array_equal(activate(Activation.GELU, base.tolist()), want)
    assert np.array_equal(activate(Activation.GELU, np.asfortranarray(base)), want)
    assert np.array_equal(activate(Activation.RELU, [1, -2, 3]), [1.0, 0.0, 3.0])
    f32 = base.astype(np.float32)
    assert np.array_equal(activate(Activation.TANH, f32), activate(Activation.TANH, f32.astype(np.float64)))
    assert activate(Activation.RELU, np.zeros((0, 3))).shape == (0, 3)


def test_errors():
    with pytest.raises(NonFiniteError, match="^activate"):
        activate(Activation.RELU, [1.0, np.nan])
    with pytest.raises(NonFiniteError, match="^activate"):
        activate(Activation.SIGMOID, [np.inf])
    for act in ALL:  # RELU(NaN) would silently be 0 without the check
        with pytest.raises(NonFiniteError, match="^activate"):
            activate(act, np.array([0.0, 1.0, -np.inf]))
    with pytest.raises(TypeError, match="^activate"):
        activate("relu", [1.0])
    with pytest.raises(TypeError, match="^activate"):
        activate(3, [1.0])
    with pytest.raises(TypeError, match="^activate"):
        activate(Activation.RELU, ["a"])


def test_deterministic_across_threads():
    assert_same_across_threads("""
        import sys, numpy as np
        from hmath_dl.activations import Activation, activate
        from hmath_dl.layers import dense, embedding
        x = np.random.default_rng(0).standard_normal(50000) * 4
        for a in Activation:
            sys.stdout.buffer.write(activate(a, x).tobytes())
        # dense (BLAS) and embedding (gather) ride along: one subprocess pair for all
        w = x[:4000].reshape(40, 100)
        sys.stdout.buffer.write(dense(x[:3000].reshape(30, 100), w, x[:40]).tobytes())
        sys.stdout.buffer.write(embedding(w, np.arange(39, -1, -1).reshape(8, 5)).tobytes())
    """)


def test_gelu_grid_accuracy():
    # a dense deterministic grid over the whole non-trivial range of GELU and GELU',
    # including the interval ends of the kernel's polynomial pieces (a = |x|/sqrt 2 in
    # [0, 28]; the local form of GELU' on [-1, -0.5]) and the zero of GELU' (-0.75179...),
    # where the two terms of Phi(x) + x phi(x) cancel
    x = np.concatenate([np.linspace(-40.0, 40.0, 1601), np.linspace(-1.05, -0.45, 601),
                        [-1.0, -0.5, np.nextafter(-1.0, -2.0), np.nextafter(-0.5, 0.0),
                         -0.7517915246935645, -0.7517915246935644, -39.59, -39.6, 39.6]])
    _close(activate(Activation.GELU, x), ref.activation("GELU", x), abs_floor=1e-300,
           cond=_condition("GELU", x))
    out = np.empty_like(x)
    assert activation_derivative(Activation.GELU.value, x, out)
    _close(out, ref.activation_derivative("GELU", x), ulps=64, abs_floor=1e-300,
           cond=_condition("GELU", x) * (1 + np.abs(x)))


@pytest.mark.parametrize("schedule", ["serial", "parallel"])
@pytest.mark.parametrize("act", ALL)
def test_fast_and_plain_chunks_give_the_same_bits(act, schedule):
    """A chunk (4096 elements; a serial call: the whole array) with one element beyond
    the fast forms' bound (or a NaN) runs the plain forms; its other elements must come
    out bit for bit as when the whole chunk runs the fast forms -- forward, derivative and
    both in one pass."""
    from hmath_dl._kernels import elementwise as E
    # the parallel kernels split the array into chunks; the serial entries run one span
    # over the whole array
    serial = schedule == "serial"
    fwds = ((E.activation_forward_serial, E.activation_derivative_serial) if serial
            else (E.activation_forward, E.activation_derivative))
    both = E.activation_forward_derivative_serial if serial else E.activation_forward_derivative
    g = np.random.default_rng(17)
    x = np.concatenate([g.standard_normal(6000) * 4, g.uniform(-30, 30, 6288)])
    for big in (700.0, -650.0, 25.0, np.nan):
        y = x.copy()
        y[5000] = big               # chunk 1 (or the whole serial call) takes the plain path
        keep = np.arange(x.size) != 5000
        for fwd in fwds:
            a, b = np.empty_like(x), np.empty_like(x)
            fwd(act.value, x, a)
            fwd(act.value, y, b)
            assert np.array_equal(a[keep].view(np.int64), b[keep].view(np.int64))
        a, da, b, db = (np.empty_like(x) for _ in range(4))
        both(act.value, x, a, da)
        both(act.value, y, b, db)
        assert np.array_equal(a[keep].view(np.int64), b[keep].view(np.int64))
        assert np.array_equal(da[keep].view(np.int64), db[keep].view(np.int64))
