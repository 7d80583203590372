"""The batch-minor convolution path for small planes (``_kernels/conv_batch.py``): the
forward convolution is bit for bit every other forward path and a plain-loop oracle of
its specification (bias + one fma chain over (ci', kd, kh, kw) from +0.0), and the input
gradient is bit for bit the im2col path (``W_g^T G`` then ``col2im``) and a plain-loop
oracle (per input cell: the taps in order, each one fma chain over the output channels
from +0.0, added from +0.0); for strides, dilations, padding, groups, 1-D/2-D/3-D, batch
sizes that leave ragged column tiles, serial and parallel; and the plan's choice."""

import numpy as np
import pytest

import hmath_dl.layers as L
from hmath_dl import autodiff as ad
from hmath_dl.errors import NonFiniteError, NumericOverflow
from hmath_dl._kernels import conv_batch, conv_plan as K
from hmath_dl._kernels._cpu import machine
from hmath_dl._kernels._jit import forced_schedule
from hmath_dl._kernels.backward import col2im
from hmath_dl._kernels.gemm_f64 import matmul
from hmath_dl._kernels.views import out5, pad3, readonly
from tests.reference.gemm import fma

needs_tiles = pytest.mark.skipif(not machine().tiled,
                                 reason="the batch path runs the register-tiled GEMM, "
                                        "which this target's machine policy does not have")

# x shape, w shape, stride, padding, dilation, groups
CASES = [
    ((64, 16, 4, 4), (32, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1),   # the small CNN's conv2
    ((3, 4, 7, 6), (6, 4, 3, 2), (2, 1), (1, 0), (1, 2), 1),
    ((5, 6, 5, 5), (12, 3, 2, 2), (2, 2), (0, 1), (1, 1), 2),
    ((7, 3, 9), (7, 3, 3), (2,), (1,), (2,), 1),
    ((2, 2, 4, 5, 3), (6, 2, 2, 3, 2), (1, 2, 1), (1, 0, 1), (2, 1, 1), 1),
    ((9, 2, 6, 6), (12, 1, 3, 3), (1, 1), (1, 1), (1, 1), 2),
    ((1, 8, 3, 3), (13, 8, 1, 1), (1, 1), (0, 0), (1, 1), 1),     # one image, 1x1
]


def _setup(xs, ws, s, p, d, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs)
    w = rng.standard_normal(ws)
    b = rng.standard_normal(ws[0])
    r = len(xs) - 2
    O = tuple((xs[2 + a] + 2 * p[a] - d[a] * (ws[2 + a] - 1) - 1) // s[a] + 1 for a in range(r))
    g = rng.standard_normal((xs[0], ws[0]) + O)
    geo = pad3(ws[2:], 1) + pad3(s, 1) + pad3(d, 1) + pad3(p, 0) + pad3(O, 1)
    return x, w, b, g, geo


def _inside(x, c, n, pos):
    r = len(pos)
    if all(0 <= pos[a] < x.shape[2 + a] for a in range(r)):
        return x[(n, c) + pos]
    return 0.0


def _forward_oracle(x, w, b, s, p, d, groups):
    """Plain loops over the specification, exact fma per term, then the bias."""
    r = x.ndim - 2
    N = x.shape[0]
    Cout, Cg = w.shape[:2]
    cog = Cout // groups
    O = tuple((x.shape[2 + a] + 2 * p[a] - d[a] * (w.shape[2 + a] - 1) - 1) // s[a] + 1
              for a in range(r))
    y = np.empty((N, Cout) + O)
    for n in range(N):
        for co in range(Cout):
            gi = co // cog
            for o in np.ndindex(*O):
                acc = 0.0
                for cp in range(Cg):
                    for k in np.ndindex(*w.shape[2:]):
                        pos = tuple(o[a] * s[a] - p[a] + k[a] * d[a] for a in range(r))
                        acc = fma(w[(co, cp) + k], _inside(x, gi * Cg + cp, n, pos), acc)
                y[(n, co) + o] = acc + (b[co] if b is not None else 0.0)
    return y


def _input_gradient_oracle(xs, w, g, s, p, d, groups):
    """Per input cell: for each tap in order the output position that reads it (if any),
    that term one exact-fma chain over the group's output channels from +0.0, the terms
    added from +0.0."""
    r = len(xs) - 2
    N, C = xs[:2]
    Cout, Cg = w.shape[:2]
    cog = Cout // groups
    O = g.shape[2:]
    dx = np.empty(xs)
    for n in range(N):
        for c in range(C):
            gi, cp = divmod(c, Cg)
            for q in np.ndindex(*xs[2:]):
                total = 0.0
                for k in np.ndindex(*w.shape[2:]):
                    o = []
                    for a in range(r):
                        t = q[a] + p[a] - k[a] * d[a]
                        if t % s[a] or not 0 <= t // s[a] < O[a]:
                            break
                        o.append(t // s[a])
                    else:
                        acc = 0.0
                        for co in range(gi * cog, (gi + 1) * cog):
                            acc = fma(w[(co, cp) + k], g[(n, co) + tuple(o)], acc)
                        total += acc
                dx[(n, c) + q] = total
    return dx


def _im2col_path(g, w, groups, geo, xs):
    N, Cout = g.shape[:2]
    P = int(np.prod(g.shape[2:]))
    Cg = w.shape[1]
    KK = geo[0] * geo[1] * geo[2]
    cog = Cout // groups
    G = np.ascontiguousarray(np.moveaxis(g.reshape(N, Cout, P), 1, 0).reshape(Cout, -1))
    w2 = w.reshape(Cout, Cg * KK)
    dcols = np.empty((groups * Cg * KK, N * P))
    for gi in range(groups):
        rows = slice(gi * cog, (gi + 1) * cog)
        dcols[gi * Cg * KK:(gi + 1) * Cg * KK] = matmul(w2[rows].T, G[rows])
    dx = np.empty(xs)
    col2im(readonly(dcols), *geo, out5(dx))
    return dx


def _small(xs, ws):
    return np.prod(xs) * np.prod(ws[1:]) * ws[0] <= 400000     # the exact oracles are slow


@needs_tiles
@pytest.mark.parametrize("xs,ws,s,p,d,groups", CASES)
def test_batch_forward_is_every_path_and_the_oracle(xs, ws, s, p, d, groups):
    x, w, b, _, _ = _setup(xs, ws, s, p, d)
    opts = L.ConvOptions(s, p, d, groups)
    for bias in (b, None):
        with K.forced_path("generic"):
            want = L.convolution(opts, x, w, bias)
        for schedule in ("serial", "parallel"):
            with forced_schedule(schedule), K.forced_path("batch"):
                got = L.convolution(opts, x, w, bias)
            assert got.tobytes() == want.tobytes(), (schedule, bias is None)
        if _small(xs, ws):
            assert want.tobytes() == _forward_oracle(x, w, bias, s, p, d, groups).tobytes()


@needs_tiles
@pytest.mark.parametrize("xs,ws,s,p,d,groups", CASES)
def test_batch_input_gradient_is_the_im2col_path_and_the_oracle(xs, ws, s, p, d, groups):
    x, w, _, g, geo = _setup(xs, ws, s, p, d, seed=3)
    N, Cout = g.shape[:2]
    g3 = np.ascontiguousarray(g.reshape(N, Cout, -1))
    want = _im2col_path(g, w, groups, geo, xs)
    for schedule in ("serial", "parallel"):
        with forced_schedule(schedule):
            dx = np.full(xs, np.nan)
            conv_batch.input_gradient(g3, w, groups, geo, out5(dx))
        assert dx.tobytes() == want.tobytes(), schedule
    if _small(xs, ws):
        assert want.tobytes() == _input_gradient_oracle(xs, w, g, s, p, d, groups).tobytes()


@needs_tiles
def test_the_plan_takes_the_batch_path_on_small_planes_with_enough_columns():
    fp = K.forward_path
    assert fp(64, 64, (1, 3, 3), 4, True, O=(1, 4, 4), N=64) == "batch"
    assert fp(512, 512, (1, 3, 3), 7, True, O=(1, 7, 7), N=8) == "batch"
    assert fp(64, 64, (1, 3, 3), 4, True, O=(1, 4, 4), N=2) != "batch"     # 32 columns
    assert fp(64, 64, (1, 3, 3), 28, True, O=(1, 28, 28), N=64) != "batch"  # large plane
    assert fp(64, 64, (1, 3, 3), 8, True, O=(1, 8, 8), N=64) != "batch"     # 8x8 plane
    assert fp(32, 16, (1, 3, 3), 4, True, O=(1, 4, 4), N=64) != "batch"     # 144 terms
    assert fp(5, 64, (1, 3, 3), 4, True, O=(1, 4, 4), N=64) != "batch"      # < 6 channels
    assert fp(64, 64, (1, 3, 3), 4, True, O=(1, 4, 4)) != "batch"           # batch unknown
    assert conv_batch.usable(6, 256, 49, 2, True)
    assert not conv_batch.usable(6, 256, 49, 2, False)
    assert conv_batch.grad_usable(6, 64, 1, True) and not conv_batch.grad_usable(5, 64, 1, True)


@needs_tiles
def test_batch_path_errors_and_inputs_untouched():
    x, w, b, _, _ = _setup((16, 8, 4, 4), (12, 8, 3, 3), (1, 1), (1, 1), (1, 1))
    opts = L.ConvOptions((1, 1), (1, 1), (1, 1), 1)
    keep = [a.copy() for a in (x, w, b)]
    with K.forced_path("batch"):
        y = L.convolution(opts, readonly(x), readonly(w), readonly(b))
        assert y.flags.c_contiguous and y.shape == (16, 12, 4, 4)
        xn = x.copy()
        xn[3, 2, 1, 0] = np.nan
        with pytest.raises(NonFiniteError, match=r"convolution: x contains nan at index \(3, 2, 1, 0\)"):
            L.convolution(opts, xn, w, b)
        with pytest.raises(NumericOverflow, match="convolution: the result overflows"):
            L.convolution(opts, x * 1e300, w * 1e10, b)
    for a, k in zip((x, w, b), keep):
        assert a.tobytes() == k.tobytes()


@needs_tiles
def test_convolution_ad_input_gradient_through_the_batch_path():
    """The autodiff's input gradient (which takes the batch path for this shape, the
    small CNN's second convolution) is the im2col path's bits, and the forward value
    every path's."""
    xs, ws = (64, 16, 4, 4), (32, 16, 3, 3)
    x, w, b, g, geo = _setup(xs, ws, (1, 1), (1, 1), (1, 1), seed=9)
    opts = L.ConvOptions((1, 1), (1, 1), (1, 1), 1)
    xv, wv = ad.variable(x), ad.variable(w)
    y = L.convolution_ad(opts, xv, wv, b)
    with K.forced_path("generic"):
        assert np.asarray(y.value).tobytes() == L.convolution(opts, x, w, b).tobytes()
    (gx,) = ad.gradients(ad.sum(y * ad.constant(g)), [xv])
    assert np.asarray(gx).tobytes() == _im2col_path(g, w, 1, geo, xs).tobytes()
