"""The convolution's weight gradient on the swapped-operand path
(``_kernels/conv_wgrad.py``: ``(cols G^T)^T``): bit for bit the ``G cols^T`` path and a
plain-loop oracle of its specification (``dw[co, c', k]`` one fma chain over ``(n, o)``
in order from +0.0, zero padding), for strides, dilations, padding, groups, 1-D/2-D/3-D
and sizes that leave every tile and row-block remainder; and through
``convolution_ad``'s gradients."""

import numpy as np
import pytest

import hmath_dl.layers as L
from hmath_dl import autodiff as ad
from hmath_dl._kernels import conv_wgrad, gemm_f64
from hmath_dl._kernels._cpu import machine
from hmath_dl._kernels._jit import forced_schedule
from hmath_dl._kernels.backward import im2col
from hmath_dl._kernels.views import pad3, readonly5
from tests.reference.gemm import fma

needs_tiles = pytest.mark.skipif(not machine().tiled,
                                 reason="the fused path needs the register-tiled GEMM, "
                                        "which this target's machine policy does not have")

# x shape, w shape, stride, padding, dilation, groups
CASES = [
    ((2, 3, 9, 8), (6, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((3, 4, 11, 10), (7, 4, 3, 2), (2, 1), (0, 1), (1, 2), 1),
    ((2, 4, 12, 9), (12, 2, 3, 3), (2, 2), (1, 2), (1, 1), 2),
    ((2, 5, 17), (13, 5, 5), (3,), (2,), (2,), 1),
    ((1, 2, 5, 6, 7), (6, 2, 2, 3, 2), (1, 2, 1), (1, 0, 1), (2, 1, 1), 1),
    ((4, 16, 4, 4), (32, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 6, 7, 7), (36, 1, 3, 3), (1, 1), (1, 1), (1, 1), 6),  # depthwise, multiplier 6
]


def _setup(xs, ws, s, p, d, groups, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs)
    r = len(xs) - 2
    O = tuple((xs[2 + a] + 2 * p[a] - d[a] * (ws[2 + a] - 1) - 1) // s[a] + 1 for a in range(r))
    g = rng.standard_normal((xs[0], ws[0]) + O)
    K, O3 = pad3(ws[2:], 1), pad3(O, 1)
    geo = K + pad3(s, 1) + pad3(d, 1) + pad3(p, 0) + O3
    P = int(np.prod(O3))
    G = np.ascontiguousarray(np.moveaxis(g.reshape(xs[0], ws[0], P), 1, 0).reshape(ws[0], -1))
    return x, g, G, geo


def _oracle(x, g, ws, s, p, d, groups):
    """Plain loops over the specification, exact fma per term."""
    r = x.ndim - 2
    N, C = x.shape[:2]
    Cout, Cg = ws[0], ws[1]
    cog = Cout // groups
    O = g.shape[2:]
    dw = np.zeros(ws)
    for co in range(Cout):
        gi = co // cog
        for cp in range(Cg):
            c = gi * Cg + cp
            for k in np.ndindex(*ws[2:]):
                acc = 0.0
                for n in range(N):
                    for o in np.ndindex(*O):
                        pos = tuple(o[a] * s[a] - p[a] + k[a] * d[a] for a in range(r))
                        inside = all(0 <= pos[a] < x.shape[2 + a] for a in range(r))
                        v = x[(n, c) + pos] if inside else 0.0
                        acc = fma(g[(n, co) + o], v, acc)
                dw[(co, cp) + k] = acc
    return dw


def _im2col_path(x, G, ws, geo, groups):
    C = x.shape[1]
    KK = geo[0] * geo[1] * geo[2]
    cols = np.empty((C * KK, G.shape[1]))
    im2col(readonly5(x), *geo, cols)
    Cout, Cg = ws[0], ws[1]
    cog = Cout // groups
    dw = np.empty((Cout, Cg * KK))
    for gi in range(groups):
        dw[gi * cog:(gi + 1) * cog] = gemm_f64.matmul(
            G[gi * cog:(gi + 1) * cog], cols[gi * Cg * KK:(gi + 1) * Cg * KK].T)
    return dw.reshape(ws)


@needs_tiles
@pytest.mark.parametrize("xs,ws,s,p,d,groups", CASES)
def test_fused_weight_gradient_is_the_im2col_path_and_the_oracle(xs, ws, s, p, d, groups):
    x, g, G, geo = _setup(xs, ws, s, p, d, groups)
    Cg, KK = ws[1], geo[0] * geo[1] * geo[2]
    assert conv_wgrad.usable(ws[0] // groups, Cg * KK, G.shape[1], True)
    want = _im2col_path(x, G, ws, geo, groups)
    for schedule in ("serial", "parallel"):
        with forced_schedule(schedule):
            dw = np.full((ws[0], Cg * KK), np.nan)
            got = conv_wgrad.weight_gradient(readonly5(x), G, ws[0], Cg, groups, geo, dw)
        assert got.reshape(ws).tobytes() == want.tobytes(), schedule
    if np.prod(ws) * G.shape[1] <= 60000:       # the exact oracle is slow
        assert want.tobytes() == _oracle(x, g, ws, s, p, d, groups).tobytes()


def test_usable_needs_tiles_a_row_block_and_terms():
    assert conv_wgrad.usable(6, 9, 10, True)
    assert not conv_wgrad.usable(6, 9, 10, False)
    assert not conv_wgrad.usable(5, 9, 10, True)
    assert not conv_wgrad.usable(6, 0, 10, True)
    assert not conv_wgrad.usable(6, 9, 0, True)


@pytest.mark.parametrize("xs,ws,s,p,d,groups", CASES[:4])
def test_convolution_ad_weight_gradient_is_the_oracle(xs, ws, s, p, d, groups):
    """Through the autodiff (whatever path the machine policy picks): the specification's
    chains, NaN in no output, the input and the gradient left unchanged."""
    x, g, G, geo = _setup(xs, ws, s, p, d, groups, seed=5)
    w = np.random.default_rng(6).standard_normal(ws)
    x0, g0 = x.copy(), g.copy()
    opts = L.ConvOptions(s, p, d, groups)
    wv = ad.variable(w)
    y = L.convolution_ad(opts, x, wv, None)
    (gw,) = ad.gradients(ad.sum(y * ad.constant(g)), [wv])
    small = np.prod(ws) * g[:, 0].size <= 60000       # the exact oracle is slow
    want = _oracle(x, g, ws, s, p, d, groups) if small else _im2col_path(x, G, ws, geo, groups)
    assert np.asarray(gw).tobytes() == want.tobytes()
    assert np.array_equal(x, x0) and np.array_equal(g, g0)


def _col2im_oracle(cols, xs, geo):
    """The adjoint of im2col by plain loops: every term added to its input cell in the
    order (i, j, k, od, oh, ow), from 0.0; terms reading the padding dropped."""
    kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw, OD, OH, OW = geo
    N, C = xs[:2]
    D, H, W = pad3(xs[2:], 1)
    dx = np.zeros((N, C, D, H, W))
    P = OD * OH * OW
    for n in range(N):
        for c in range(C):
            for i in range(kd):
                for j in range(kh):
                    for k in range(kw):
                        r = c * kd * kh * kw + (i * kh + j) * kw + k
                        for od in range(OD):
                            for oh in range(OH):
                                for ow in range(OW):
                                    a, b, e = od * sd - pd + i * dd, oh * sh - ph + j * dh, \
                                        ow * sw - pw + k * dw
                                    if 0 <= a < D and 0 <= b < H and 0 <= e < W:
                                        dx[n, c, a, b, e] += cols[r, n * P + (od * OH + oh) * OW + ow]
    return dx


@pytest.mark.parametrize("xs,ws,s,p,d,groups", CASES)
def test_col2im_is_the_ordered_adjoint(xs, ws, s, p, d, groups):
    """The input gradient's scatter (``backward.col2im``, summed in a padded scratch
    plane): every cell the oracle's terms in the oracle's order, bit for bit, serial and
    parallel."""
    from hmath_dl._kernels.backward import col2im
    from hmath_dl._kernels.views import out5
    x, g, G, geo = _setup(xs, ws, s, p, d, groups, seed=7)
    C, KK = xs[1], geo[0] * geo[1] * geo[2]
    cols = np.random.default_rng(8).standard_normal((C * KK, G.shape[1]))
    want = _col2im_oracle(cols, xs, geo).reshape(xs)
    for schedule in ("serial", "parallel"):
        with forced_schedule(schedule):
            dx = np.full(xs, np.nan)
            col2im(cols, *geo, out5(dx))
        assert dx.tobytes() == want.tobytes(), schedule
