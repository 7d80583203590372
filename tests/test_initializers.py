import dataclasses
import math

import numpy as np
import pytest

from hmath_dl.errors import DomainError, NumericOverflow
from hmath_dl.layers import (KaimingNormal, KaimingUniform, Orthogonal, TruncatedNormal,
                             XavierNormal, XavierUniform, initialize_weights)
from hmath_dl.rng import RNG
from tests.reference import layers_basic as ref

N = 100_000
SIMPLE = [XavierUniform(), XavierNormal(), KaimingUniform(), KaimingNormal()]
ALL = SIMPLE + [Orthogonal(), Orthogonal(0.5), TruncatedNormal(1.0, 2.0, 1.5)]


@pytest.mark.parametrize("init", SIMPLE, ids=lambda i: type(i).__name__)
def test_simple_statistics(init):
    fan_in, fan_out = 30, 70
    w, rng = initialize_weights(init, fan_in, fan_out, (N // 100, 100), RNG.from_seed(11))
    assert w.shape == (N // 100, 100) and w.dtype == np.float64 and w.flags.c_contiguous
    kind, param = ref.init_bound_or_std(type(init).__name__, fan_in, fan_out)
    if kind == "uniform":
        assert w.min() >= -param and w.max() <= param
        var = param ** 2 / 3
        # moments within 5 sigma: sd(mean) = sqrt(var/N), sd(var estimate) = sqrt((m4 - var^2)/N)
        m4 = param ** 4 / 5
        assert w.min() < -0.99 * param and w.max() > 0.99 * param
    else:
        var = param ** 2
        m4 = 3 * param ** 4
    assert abs(w.mean()) < 5 * math.sqrt(var / N)
    assert abs((w * w).mean() - var) < 5 * math.sqrt((m4 - var ** 2) / N)
    assert rng != RNG.from_seed(11)


def test_truncated_normal_statistics():
    for mean, sigma, cutoff in ((1.0, 2.0, 1.5), (-3.0, 0.5, 3.0), (0.0, 1.0, 0.05), (2.0, 1e-3, 2.0)):
        w, _ = initialize_weights(TruncatedNormal(mean, sigma, cutoff), 4, 4, (N,), RNG.from_seed(5))
        assert np.abs(w - mean).max() <= cutoff * sigma * (1 + 1e-12)
        m, var = ref.truncated_normal_moments(mean, sigma, cutoff)
        c = cutoff * sigma
        # 4th central moment bounded by c^2 var (values within c of the mean)
        assert abs(w.mean() - m) < 5 * math.sqrt(var / N)
        assert abs(((w - mean) ** 2).mean() - var) < 5 * math.sqrt(c * c * var / N)
        # the conditioning is real: a good share sits near the bound for wide-ish cutoffs
        assert np.abs(w - mean).max() > 0.9 * c


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 3, 4), (6, 2, 1)])
def test_orthogonal(shape):
    gain = 1.7
    w, _ = initialize_weights(Orthogonal(gain), 2, 3, shape, RNG.from_seed(2))
    assert w.shape == shape
    m = w.reshape(shape[0], -1) / gain
    if m.shape[0] <= m.shape[1]:
        np.testing.assert_allclose(m @ m.T, np.eye(m.shape[0]), atol=1e-10, rtol=0)
    else:
        np.testing.assert_allclose(m.T @ m, np.eye(m.shape[1]), atol=1e-10, rtol=0)


def test_orthogonal_sign_convention():
    # Q from the QR of the same standard normal matrix, columns flipped by sign(diag(R))
    rng = RNG.from_seed(8)
    w, _ = initialize_weights(Orthogonal(), 1, 1, (6, 3), rng)
    a = rng.generator().standard_normal((6, 3))
    q, r = np.linalg.qr(a)
    np.testing.assert_allclose(w, q * np.sign(np.diag(r)), atol=1e-14, rtol=0)
    # and the wide case is the transpose of the tall one drawn as (cols, rows)
    w2, _ = initialize_weights(Orthogonal(), 1, 1, (3, 6), rng)
    np.testing.assert_allclose(w2, w.T, atol=1e-14, rtol=0)


@pytest.mark.parametrize("init", ALL, ids=repr)
def test_rng_purity(init):
    rng = RNG.from_seed(3)
    a, r1 = initialize_weights(init, 3, 5, (4, 6), rng)
    b, r2 = initialize_weights(init, 3, 5, (4, 6), rng)
    assert np.array_equal(a, b) and r1 == r2
    assert a.flags.c_contiguous and a.flags.writeable and a.dtype == np.float64
    c, r3 = initialize_weights(init, 3, 5, (4, 6), r1)
    assert not np.array_equal(a, c) and r3 != r1
    assert rng == RNG.from_seed(3)


def test_draw_rules():
    rng = RNG.from_seed(4)
    w, r = initialize_weights(XavierUniform(), 2, 4, (3, 2), rng)
    g = rng.generator()
    a = math.sqrt(6 / 6)
    assert np.array_equal(w, g.uniform(-a, a, (3, 2)))
    assert r == rng.advanced(g)
    w, _ = initialize_weights(KaimingNormal(), 8, 1, (5,), rng)
    assert np.array_equal(w, math.sqrt(2 / 8) * rng.generator().standard_normal((5,)))


def test_shapes():
    w, _ = initialize_weights(XavierNormal(), 1, 1, (), RNG.from_seed(0))
    assert w.shape == ()
    w, _ = initialize_weights(XavierNormal(), 1, 1, (0, 3), RNG.from_seed(0))
    assert w.shape == (0, 3)
    w, _ = initialize_weights(KaimingUniform(), 1, 1, 4, RNG.from_seed(0))
    assert w.shape == (4,)
    w, _ = initialize_weights(TruncatedNormal(0, 1, 2), 1, 1, [2, 2], RNG.from_seed(0))
    assert w.shape == (2, 2)


def test_frozen_and_equal():
    assert TruncatedNormal(0, 1, 2) == TruncatedNormal(0.0, 1.0, 2.0)
    assert Orthogonal() == Orthogonal(1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Orthogonal().gain = 2.0


def test_initializer_validation():
    for args in ((0, 0, 1), (0, -1, 1), (0, 1, 0), (0, 1, -2), (np.nan, 1, 1), (0, np.inf, 1),
                 (0, 1, np.nan)):
        with pytest.raises(DomainError, match="^TruncatedNormal"):
            TruncatedNormal(*args)
    with pytest.raises(DomainError, match="^Orthogonal"):
        Orthogonal(np.inf)
    with pytest.raises(TypeError, match="^Orthogonal"):
        Orthogonal("1")


def test_errors():
    rng = RNG.from_seed(0)
    f = initialize_weights
    for fans in ((0, 3), (3, 0), (-1, 3)):
        for init in ALL:
            with pytest.raises(DomainError, match="^initialize_weights"):
                f(init, *fans, (2, 2), rng)
    with pytest.raises(TypeError, match="^initialize_weights"):
        f(XavierUniform(), 2.0, 3, (2, 2), rng)
    with pytest.raises(TypeError, match="^initialize_weights"):
        f(XavierUniform, 2, 3, (2, 2), rng)
    with pytest.raises(TypeError, match="^initialize_weights"):
        f("xavier", 2, 3, (2, 2), rng)
    with pytest.raises(TypeError, match="^initialize_weights"):
        f(XavierUniform(), 2, 3, (2, 2), 7)
    with pytest.raises(DomainError, match="^initialize_weights"):
        f(XavierUniform(), 2, 3, (2, -1), rng)
    with pytest.raises(TypeError, match="^initialize_weights"):
        f(XavierUniform(), 2, 3, (2.0, 2), rng)
    for shape in ((5,), (), (0, 3), (3, 0), (2, 0, 4)):
        with pytest.raises(DomainError, match="^initialize_weights"):
            f(Orthogonal(), 2, 3, shape, rng)
    with pytest.raises(NumericOverflow, match="^initialize_weights"):
        f(TruncatedNormal(1.7e308, 1e307, 2.0), 1, 1, (100,), rng)
    from hmath_dl.errors import ShapeError
    with pytest.raises(ShapeError, match="^initialize_weights"):
        f(XavierUniform(), 2, 3, (1 << 40, 1 << 40), rng)


# fans(shape, layout): a hand-written table (fan_in, fan_out), one row per layout
FAN_TABLE = [
    ((5, 3), None, (3, 5)),                      # dense [out, in]
    ((5, 3), "OI", (3, 5)),
    ((3, 5), "IO", (3, 5)),
    ((1, 1), None, (1, 1)),
    ((8, 4, 3), None, (12, 24)),                 # conv1d [Cout, Cin/groups, K]
    ((8, 4, 3), "OIW", (12, 24)),
    ((16, 3, 3, 3), "OIHW", (27, 144)),          # conv2d
    ((16, 3, 3, 5), None, (45, 240)),
    ((32, 4, 2, 3, 3), "OIDHW", (72, 576)),      # conv3d
    ((12, 1, 3, 3), None, (9, 108)),             # depthwise [Cin*m, 1, *K]
    ((4, 6, 3), "IOW", (12, 18)),                # transposed conv1d [Cin, Cout/groups, K]
    ((4, 6, 3, 3), "IOHW", (36, 54)),            # transposed conv2d
    ((4, 6, 2, 3, 3), "IODHW", (72, 108)),
    ((3, 3, 4, 16), "HWIO", (36, 144)),          # JAX / TensorFlow kernel
    ((2, 16, 3, 4), "KOHI", (24, 96)),           # any letters other than O and I: kernel axes
]


@pytest.mark.parametrize("shape, layout, want", FAN_TABLE)
def test_fans_table(shape, layout, want):
    from hmath_dl.layers.initializers import fans
    got = fans(shape, layout)
    assert got == want and all(type(v) is int for v in got)
    assert fans(list(shape), layout) == want and fans(np.array(shape), layout) == want


def test_fans_feed_initialize_weights_and_errors():
    from hmath_dl.errors import ShapeError
    from hmath_dl.layers.initializers import fans
    shape = (16, 3, 3, 3)
    a, _ = initialize_weights(KaimingUniform(), *fans(shape), shape, RNG.from_seed(4))
    b, _ = initialize_weights(KaimingUniform(), 27, 144, shape, RNG.from_seed(4))
    assert a.tobytes() == b.tobytes()
    for shape in ((5,), (), (0, 3), (3, -1)):
        with pytest.raises(DomainError, match="^fans: shape"):
            fans(shape)
    for layout in ("OO", "II", "OH", "HW", "OIO"):
        with pytest.raises((DomainError, ShapeError), match="^fans: layout"):
            fans((2, 3), layout)
    with pytest.raises(ShapeError, match=r"^fans: layout 'OIHW' names 4 axes, shape \(2, 3\) "):
        fans((2, 3), "OIHW")
    with pytest.raises(DomainError, match="^fans: layout must name one output axis 'O' and "):
        fans((2, 3), "OH")
    with pytest.raises(TypeError, match="^fans: layout must be a str"):
        fans((2, 3), 3)
    with pytest.raises(TypeError, match="^fans: shape"):
        fans((2.0, 3))
