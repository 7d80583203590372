"""Results that are specified bit for bit by a documented order (API.md section 0, "Same
bits on every CPU"): the oracles below follow the documented algorithm in plain Python
floats (IEEE binary64, no fused operations), so the library must match them exactly, on
every CPU."""

import math

import numpy as np
import pytest

from hmath_dl import RNG
from hmath_dl.layers import Orthogonal, initialize_weights


def _dot(a, b, lo, hi):
    """The documented order of ``hmath_dl._kernels.qr``: eight interleaved partial sums,
    combined pairwise, then the tail."""
    p = [0.0] * 8
    i = lo
    while i + 8 <= hi:
        for r in range(8):
            p[r] += a[i + r] * b[i + r]
        i += 8
    s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
    while i < hi:
        s += a[i] * b[i]
        i += 1
    return s


def householder_q(a):
    """Thin Q (signs of diag(R) folded in) of ``a [m, n]``, m >= n, as documented."""
    m, n = a.shape
    cols = [[float(a[i, j]) for i in range(m)] for j in range(n)]
    vs, vvs, signs = [], [], []
    for k in range(n):
        col = cols[k]
        norm = math.sqrt(_dot(col, col, k, m))
        alpha = -norm if col[k] >= 0.0 else norm
        v = [0.0] * k + col[k:]
        v[k] -= alpha
        vv = _dot(v, v, k, m)
        vs.append(v)
        vvs.append(vv)
        signs.append(-1.0 if alpha < 0.0 else 1.0)
        if vv == 0.0:
            continue
        for j in range(k + 1, n):
            f = 2.0 * _dot(v, cols[j], k, m) / vv
            for i in range(k, m):
                cols[j][i] -= f * v[i]
    q = [[1.0 if i == j else 0.0 for i in range(m)] for j in range(n)]
    for k in range(n - 1, -1, -1):
        if vvs[k] == 0.0:
            continue
        for j in range(k, n):
            f = 2.0 * _dot(vs[k], q[j], k, m) / vvs[k]
            for i in range(k, m):
                q[j][i] -= f * vs[k][i]
    return np.array([[q[j][i] * signs[j] for i in range(m)] for j in range(n)]).T


@pytest.mark.parametrize("shape,gain", [((7, 3), 1.0), ((3, 7), 2.0), ((20, 20), 1.0),
                                        ((4, 2, 3, 3), 0.5), ((1, 5), 1.0), ((19, 1), 1.0)])
def test_orthogonal_is_the_documented_householder_qr_bit_for_bit(shape, gain):
    w, _ = initialize_weights(Orthogonal(gain), 3, 3, shape, RNG(11))
    rows, cols = shape[0], int(np.prod(shape[1:]))
    a = RNG(11).generator().standard_normal((rows, cols) if rows >= cols else (cols, rows))
    q = householder_q(a)
    want = gain * (q if rows >= cols else q.T)
    assert np.array_equal(w.reshape(rows, cols), want)
    # and it is the QR factor LAPACK gives (up to rounding), rows/columns orthonormal
    qn, rn = np.linalg.qr(a)
    d = np.where(np.diag(rn) == 0, 1.0, np.sign(np.diag(rn)))
    ref = gain * (qn * d if rows >= cols else (qn * d).T)
    np.testing.assert_allclose(w.reshape(rows, cols), ref, rtol=0, atol=1e-13)


def test_orthogonal_same_bits_for_any_thread_count():
    from .helpers import assert_same_across_threads
    assert_same_across_threads("""
        import sys
        from hmath_dl import RNG
        from hmath_dl.layers import Orthogonal, initialize_weights
        w, _ = initialize_weights(Orthogonal(1.0), 1, 1, (96, 80), RNG(5))
        sys.stdout.buffer.write(w.tobytes())
    """)


from .reference.reduce import sum_to_oracle  # noqa: E402


@pytest.mark.parametrize("shape,keep", [((5, 7), (False, True)), ((3, 4, 19), (False, True, False)),
                                        ((6, 2, 3), (True, False, True)), ((2, 3, 17), (True, True, False)),
                                        ((4, 9), (False, False)),
                                        # several column chunks; the second one is
                                        # large enough to run in parallel
                                        ((70, 130), (False, True)), ((1024, 200), (False, True)),
                                        # whole register blocks only (a bias gradient)
                                        ((1024, 64), (False, True))])
def test_fixed_order_sums_follow_the_documented_order(shape, keep):
    from hmath_dl._kernels.reduce import sum_to
    x = np.random.default_rng(3).standard_normal(shape) * 10.0 ** np.arange(shape[-1])
    assert np.array_equal(sum_to(x, keep), sum_to_oracle(x, keep))


def test_bias_and_broadcast_gradients_use_the_fixed_order():
    from hmath_dl import autodiff as ad
    from hmath_dl.layers import dense_ad
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((37, 5)), rng.standard_normal((3, 5)), rng.standard_normal(3)
    bv = ad.variable(b)
    cot = rng.standard_normal((37, 3)) * 1e3
    (gb,) = ad.gradients(dense_ad(x, w, bv), [bv], cot)
    assert np.array_equal(gb, sum_to_oracle(cot, (False, True)))
    c = ad.variable(rng.standard_normal((1, 3)))
    (gc,) = ad.gradients(ad.constant(rng.standard_normal((37, 3))) + c, [c], cot)
    assert np.array_equal(gc, sum_to_oracle(cot, (False, True)).reshape(1, 3))


def test_adtensor_power_is_the_documented_square_and_multiply():
    """numpy's ``power`` depends on numpy's build (1.26's AVX-512 loop does not return x
    for x ** 1); ``ADTensor ** p`` does not."""
    from hmath_dl import autodiff as ad
    x = np.random.default_rng(5).standard_normal(1000) * 3
    v = ad.variable(x)
    assert np.array_equal((v ** 1).value, x)
    assert np.array_equal((v ** 2).value, x * x)
    assert np.array_equal((v ** 3).value, x * (x * x))
    assert np.array_equal((v ** 5).value, x * ((x * x) * (x * x)))
    assert np.array_equal((v ** -2).value, 1.0 / (x * x))
    assert np.array_equal((v ** 0).value, np.ones(1000))
    a = np.abs(x) + 0.5
    assert np.array_equal((ad.variable(a) ** 0.5).value, np.sqrt(a))
    np.testing.assert_allclose((ad.variable(a) ** 1.7).value, a ** 1.7, rtol=4e-15)
    (g,) = ad.gradients(ad.sum(v ** 3), [v])
    assert np.array_equal(g, 3.0 * (x * x))
