"""The regular-window pooling kernels (``_kernels/pool_fast.py``) give the general
pooling kernels' bytes -- forward max and average, both backward passes, the NaN/inf
status -- on ties, signed zeros, odd sizes, overlapping and gapped windows, and agree
with the plain-loop reference."""

import numpy as np
import pytest

from hmath_dl._kernels import pool as KP
from hmath_dl._kernels import pool_backward as KB
from hmath_dl._kernels import pool_fast as F
from hmath_dl._kernels._jit import forced_schedule
from tests.reference.conv import pool_reference

SHAPES = [  # N, C, H, W, kh, kw, sh, sw
    (64, 16, 8, 8, 2, 2, 2, 2), (3, 5, 9, 11, 3, 3, 2, 2), (2, 3, 7, 7, 3, 3, 1, 1),
    (4, 4, 6, 9, 2, 2, 3, 3), (1, 2, 5, 13, 2, 4, 1, 3), (2, 17, 4, 4, 4, 4, 4, 4),
    (1, 1, 1, 7, 1, 3, 1, 2), (5, 3, 10, 3, 3, 1, 2, 1)]


def _axes(H, W, kh, kw, sh, sw):
    OH, OW = (H - kh) // sh + 1, (W - kw) // sw + 1
    return [(np.arange(OH) * sh, np.arange(OH) * sh + kh, 1, np.full(OH, kh)),
            (np.arange(OW) * sw, np.arange(OW) * sw + kw, 1, np.full(OW, kw))]


def _data(N, C, H, W, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W))
    x[x < 0.2] = 0.0                               # many ties ...
    x[:, ::2] *= -1.0                              # ... and signed zeros
    x[0, 0, 0, :] = -0.0
    return x


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_max", [True, False])
def test_regular_kernels_match_the_general_ones(shape, is_max):
    N, C, H, W, kh, kw, sh, sw = shape
    x = _data(N, C, H, W, sum(shape))
    axes = _axes(H, W, kh, kw, sh, sw)
    OH, OW = axes[0][0].size, axes[1][0].size
    # (a single window along an axis has no stride to detect: reported as 1)
    assert F.regular_windows(axes, (H, W)) == (kh, kw, sh if OH > 1 else 1,
                                               sw if OW > 1 else 1)
    want = np.empty((N, C, OH, OW))
    with F.forced_path("general"):
        assert KP.pool_box_nd(x, axes, is_max, want) == 0
    for kern in (F.pool2d_regular, F.pool2d_regular.serial):
        got = np.full_like(want, np.nan)
        status = kern(x.reshape(N * C, H, W), kh, kw, sh, sw, is_max, kh * kw,
                      got.reshape(N * C, OH, OW))
        assert status == 0 and got.tobytes() == want.tobytes()
    ref = pool_reference(is_max, x, (kh, kw), (sh, sw), (0, 0))
    if is_max:
        assert np.array_equal(want, ref)
    else:
        np.testing.assert_allclose(want, ref, rtol=1e-14, atol=1e-15)
    g = np.random.default_rng(1).standard_normal(want.shape)
    g[::2, :, ::2] = -0.0
    dx_want = np.empty_like(x)
    with F.forced_path("general"):
        KB.pool_backward_nd(x.reshape(N, C, 1, H, W), g.reshape(N, C, 1, OH, OW),
                            KP.boxes3(axes), is_max, dx_want.reshape(N, C, 1, H, W))
    # the planned path (regular here) through the same entry points
    got = np.full_like(want, np.nan)
    assert KP.pool_box_nd(x, axes, is_max, got) == 0 and got.tobytes() == want.tobytes()
    dx = np.full_like(x, np.nan)
    KB.pool_backward_nd(x.reshape(N, C, 1, H, W), g.reshape(N, C, 1, OH, OW),
                        KP.boxes3(axes), is_max, dx.reshape(N, C, 1, H, W))
    assert dx.tobytes() == dx_want.tobytes()
    for serial in (False, True):
        dx = np.full_like(x, np.nan)
        if is_max:
            k = F.max_pool2d_regular_backward
            (k.serial if serial else k)(x.reshape(N * C, H, W), g.reshape(N * C, OH, OW),
                                        kh, kw, sh, sw, dx.reshape(N * C, H, W))
        else:
            k = F.avg_pool2d_regular_backward
            (k.serial if serial else k)(g.reshape(N * C, OH, OW), kh, kw, sh, sw, kh * kw,
                                        dx.reshape(N * C, H, W))
        assert dx.tobytes() == dx_want.tobytes()


@pytest.mark.parametrize("is_max", [True, False])
def test_regular_kernel_status_counts_bad_planes(is_max):
    x = _data(3, 4, 6, 6, 7)
    out = np.empty((12, 3, 3))
    flat = x.reshape(12, 6, 6)
    assert F.pool2d_regular(flat, 2, 2, 2, 2, is_max, 4, out) == 0
    bad = flat.copy()
    bad[5, 5, 5] = np.nan          # read by no window? (5, 5) is in the last window
    bad[7, 0, 0] = -np.inf
    assert F.pool2d_regular(bad, 2, 2, 2, 2, is_max, 4, out) == 2
    big = flat.copy()
    big[2] = 1e308                 # the average's sum overflows
    assert F.pool2d_regular(big, 2, 2, 2, 2, is_max, 4, out) == (0 if is_max else 1)


def test_regular_windows_detection():
    H, W = 8, 9
    assert F.regular_windows(_axes(H, W, 2, 3, 2, 3), (H, W)) == (2, 3, 2, 3)
    lo, hi, _, cn = _axes(H, W, 2, 2, 2, 2)[1]
    assert F.regular_windows([(lo, hi, 1, cn)], (W,)) == (1, 2, 1, 2)      # 1-D
    padded = (np.maximum(lo - 1, 0), hi - 1, 1, cn)                        # clipped by padding
    assert F.regular_windows([padded, padded], (H, W)) is None
    assert F.regular_windows([(lo, hi, 2, cn)] * 2, (H, W)) is None           # dilation
    assert F.regular_windows([(lo, hi, 1, cn + 1)] * 2, (H, W)) is None       # divisor override
    assert F.regular_windows([(lo, hi, 1, cn)] * 3, (H, W, W)) is None        # 3-D
    assert F.regular_windows([(lo, hi + 0, 1, cn)] * 2, (H, 7)) is None       # beyond the input


@pytest.mark.parametrize("mode", ["MAX", "AVERAGE"])
def test_public_pooling_and_its_gradient_are_the_same_bits_on_both_paths(mode):
    from hmath_dl import autodiff as ad
    from hmath_dl import layers as L
    m = getattr(L.PoolMode, mode)
    x = _data(6, 5, 10, 12, 3)
    for window, stride, padding in (((2, 2), (2, 2), (0, 0)), ((3, 2), (1, 2), (0, 0)),
                                    ((2, 2), (2, 2), (1, 1)), ((3, 3), (2, 2), (0, 0))):
        outs = []
        for path in ("general", None):
            with F.forced_path(path):
                v = ad.variable(x)
                y = L.pooling_ad(m, window, stride, padding, v)
                g = ad.gradients(ad.sum(y * y), [v])[0]
                plain = L.pooling(m, window, stride, padding, x)
                outs.append((np.asarray(y.value).tobytes(), np.asarray(g).tobytes(),
                             plain.tobytes()))
        assert outs[0] == outs[1], (window, stride, padding)
    with pytest.raises(ValueError):
        with F.forced_path("nope"):
            pass


@pytest.mark.parametrize("shape", [(64, 16, 8, 8), (3, 5, 9, 11), (2, 3, 4, 5), (1, 1, 2, 2),
                                   (33, 2, 6, 6)])
def test_written_out_2x2_max_kernel_is_the_general_kernels_bytes(shape):
    """``max_pool2x2`` (the forward 2x2 / stride-2 max, taken by the plan) against the
    general kernel and the plain-loop reference, with ties, signed zeros and odd sizes
    (the last row/column no window covers); serial and parallel; the NaN/inf plane count
    of the general kernel's status."""
    N, C, H, W = shape
    x = _data(N, C, H, W, sum(shape) + 2)
    axes = _axes(H, W, 2, 2, 2, 2)
    OH, OW = H // 2, W // 2
    want = np.empty((N, C, OH, OW))
    with F.forced_path("general"):
        assert KP.pool_box_nd(x, axes, True, want) == 0
    assert np.array_equal(want, pool_reference(True, x, (2, 2), (2, 2), (0, 0)))
    for schedule in ("parallel", "serial"):
        got = np.full_like(want, np.nan)
        with forced_schedule(schedule):
            assert F.max_pool2x2(x.reshape(N * C, H, W), got.reshape(N * C, OH, OW)) == 0
        assert got.tobytes() == want.tobytes()
        bad = x.copy()
        bad[0, 0, H - 1, W - 1] = np.nan            # a cell no window reads when H or W is odd
        bad[N - 1, C - 1, 0, 0] = np.inf
        expect = 1 if N * C == 1 else 2
        with forced_schedule(schedule):
            assert F.max_pool2x2(bad.reshape(N * C, H, W),
                                 got.reshape(N * C, OH, OW)) == expect


@pytest.mark.parametrize("shape", [(64, 16, 8, 8), (3, 5, 9, 11), (2, 3, 4, 5), (1, 1, 2, 2),
                                   (33, 2, 6, 6), (2, 2, 3, 3)])
def test_written_out_2x2_max_backward_is_the_general_kernels_bytes(shape):
    """The 2x2 / stride-2 max backward (selects, taken by the plan) against the general
    backward kernel and the regular one: ties (the first maximum in row-major order gets
    the cotangent), signed zeros in ``x`` and ``g`` (``0.0 + g``), odd sizes (the last
    row/column no window covers is 0.0), NaN/inf/signalling-NaN cotangents, serial and
    parallel, the float64 and the int64 form of the selects."""
    N, C, H, W = shape
    x = _data(N, C, H, W, sum(shape) + 5)
    x[-1, -1, :2, :2] = 0.5                          # a window of four equal values
    axes = _axes(H, W, 2, 2, 2, 2)
    OH, OW = H // 2, W // 2
    g = np.random.default_rng(3).standard_normal((N, C, OH, OW))
    g[::2, :, ::2] = -0.0
    # non-finite cotangents: the selects keep them bit for bit as 0.0 + g (a signalling
    # NaN quieted) where the window's maximum is, and 0.0 elsewhere
    flat = g.reshape(-1)
    special = [np.nan, np.inf, -np.inf, np.array(0x7FF0000000000001).view(np.float64),
               np.array(-0x0007FFFFFFFFFFFF).view(np.float64)]    # sNaN, negative qNaN
    flat[1:1 + len(special)][:flat.size - 1] = special[:max(0, flat.size - 1)]
    args = (x.reshape(N, C, 1, H, W), g.reshape(N, C, 1, OH, OW), KP.boxes3(axes), True)
    want = np.empty_like(x)
    with F.forced_path("general"):
        KB.pool_backward_nd(*args, want.reshape(N, C, 1, H, W))
    regular = np.full_like(x, np.nan)
    F.max_pool2d_regular_backward(x.reshape(N * C, H, W), g.reshape(N * C, OH, OW),
                                  2, 2, 2, 2, regular.reshape(N * C, H, W))
    assert regular.tobytes() == want.tobytes()
    for schedule in ("parallel", "serial"):
        # both forms of the selects (float64, and the int64 views the plan uses on
        # targets without AVX-512) whatever this host's plan is
        for view in (np.float64, np.int64):
            got = np.full_like(x, np.nan)
            with forced_schedule(schedule):
                F._max_pool2x2_backward_span(x.reshape(N * C, H, W),
                                             g.reshape(N * C, OH, OW).view(view),
                                             got.reshape(N * C, H, W).view(view))
            assert got.tobytes() == want.tobytes(), (schedule, view)
        planned = np.full_like(x, np.nan)
        with forced_schedule(schedule):
            KB.pool_backward_nd(*args, planned.reshape(N, C, 1, H, W))
        assert planned.tobytes() == want.tobytes(), schedule
