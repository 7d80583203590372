"""Tests for hmath_dl.layers.convolution (ConvOptions, convolution, transposed_convolution,
depthwise_convolution) and the kernel entry points the autodiff rules use."""

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hmath_dl._kernels.conv_plan import conv_nd, conv_transpose_nd, conv_weight_grad_nd
from hmath_dl.errors import DomainError, NonFiniteError, NumericOverflow, ShapeError
from hmath_dl.layers import (ConvOptions, convolution, depthwise_convolution,
                             transposed_convolution)
from tests.helpers import assert_same_across_threads, frozen_copy, noncontiguous, readonly
from tests.reference.conv import conv_reference, conv_transpose_reference

EPS = np.finfo(np.float64).eps


def assert_matches(got, ref, mag, terms):
    """Any summation order of ``terms`` products lies within terms*eps*mag of the exact
    value; the reference itself is such a sum, hence the factor 2."""
    assert got.shape == ref.shape
    assert got.dtype == np.float64 and got.flags.c_contiguous
    bound = 2 * (terms + 1) * EPS * mag + 1e-300
    assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) - bound)


# --------------------------------------------------------------------------- strategies
@st.composite
def conv_cases(draw, transposed=False, depthwise=False):
    rank = draw(st.integers(1, 3))
    groups = 1 if depthwise else draw(st.integers(1, 3))
    cin = groups * draw(st.integers(1, 2 if rank == 3 else 3))
    cog = draw(st.integers(1, 5))          # >= 4 exercises the 4-channel block path
    n = draw(st.integers(1, 2))
    max_k = 2 if rank == 3 else (3 if rank == 2 else 5)
    K = tuple(draw(st.integers(1, max_k)) for _ in range(rank))
    s = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    d = tuple(draw(st.integers(1, 2)) for _ in range(rank))
    p = tuple(draw(st.integers(0, 2)) for _ in range(rank))
    span = tuple(d[a] * (K[a] - 1) + 1 for a in range(rank))
    if transposed:
        S = tuple(draw(st.integers(1, 4)) for _ in range(rank))
        op = tuple(draw(st.integers(0, s[a] - 1)) for a in range(rank))
        O = [(S[a] - 1) * s[a] - 2 * p[a] + span[a] + op[a] for a in range(rank)]
        if min(O) < 1:   # keep the output non-empty: drop the padding
            p = (0,) * rank
    else:
        op = None
        S = tuple(max(1, span[a] - 2 * p[a]) + draw(st.integers(0, 4)) for a in range(rank))
    seed = draw(st.integers(0, 2**32 - 1))
    g = np.random.default_rng(seed)
    x = g.standard_normal((n, cin) + S)
    if depthwise:
        w = g.standard_normal((cin * cog, 1) + K)
        cout = cin * cog
    elif transposed:
        w = g.standard_normal((cin, cog) + K)
        cout = cog * groups
    else:
        w = g.standard_normal((cog * groups, cin // groups) + K)
        cout = cog * groups
    bias = g.standard_normal(cout) if draw(st.booleans()) else None
    return dict(x=x, w=w, bias=bias, s=s, p=p, d=d, groups=groups, op=op)


# --------------------------------------------------------------------------- ConvOptions
def test_conv_options_normalises_and_is_frozen():
    o = ConvOptions([1, 2], (0, 1), np.int64(1))
    assert o.stride == (1, 2) and o.padding == (0, 1) and o.dilation == 1 and o.groups == 1
    assert o == ConvOptions((1, 2), [0, 1], 1, 1)
    assert hash(o) == hash(ConvOptions((1, 2), [0, 1], 1, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.groups = 2


@pytest.mark.parametrize("kwargs, error", [
    (dict(stride=0, padding=0, dilation=1), DomainError),
    (dict(stride=(1, 0), padding=0, dilation=1), DomainError),
    (dict(stride=1, padding=-1, dilation=1), DomainError),
    (dict(stride=1, padding=0, dilation=0), DomainError),
    (dict(stride=1, padding=0, dilation=1, groups=0), DomainError),
    (dict(stride=1.0, padding=0, dilation=1), TypeError),
    (dict(stride=True, padding=0, dilation=1), TypeError),
    (dict(stride=1, padding="1", dilation=1), TypeError),
    (dict(stride=1, padding=0, dilation=(1, 2.5)), TypeError),
    (dict(stride=1, padding=0, dilation=1, groups=1.0), TypeError),
    (dict(stride=1, padding=0, dilation=1, groups=None), TypeError),
])
def test_conv_options_rejects(kwargs, error):
    with pytest.raises(error, match=r"^ConvOptions: "):
        ConvOptions(**kwargs)


# --------------------------------------------------------------------------- against the oracle
@given(conv_cases())
def test_convolution_matches_reference(c):
    opts = ConvOptions(c["s"], c["p"], c["d"], c["groups"])
    got = convolution(opts, c["x"], c["w"], c["bias"])
    ref, mag = conv_reference(c["x"], c["w"], c["bias"], c["s"], c["p"], c["d"], c["groups"])
    assert_matches(got, ref, mag, c["w"][0].size)


@given(conv_cases(transposed=True))
def test_transposed_convolution_matches_reference(c):
    opts = ConvOptions(c["s"], c["p"], c["d"], c["groups"])
    got = transposed_convolution(c["op"], opts, c["x"], c["w"], c["bias"])
    ref, mag = conv_transpose_reference(c["x"], c["w"], c["bias"], c["s"], c["p"], c["d"],
                                        c["op"], c["groups"])
    assert_matches(got, ref, mag, c["w"].shape[0] * c["w"][0, 0].size)


@given(conv_cases(depthwise=True), st.booleans())
def test_depthwise_convolution_matches_reference(c, groups_is_cin):
    cin = c["x"].shape[1]
    opts = ConvOptions(c["s"], c["p"], c["d"], cin if groups_is_cin else 1)
    got = depthwise_convolution(opts, c["x"], c["w"], c["bias"])
    ref, mag = conv_reference(c["x"], c["w"], c["bias"], c["s"], c["p"], c["d"], cin)
    assert_matches(got, ref, mag, c["w"][0].size)


@given(conv_cases())
def test_transposed_convolution_is_the_adjoint(c):
    """<conv(u), v> = <u, convT(v)> with the output padding that restores u's shape."""
    x, w, s, p, d, groups = c["x"], c["w"], c["s"], c["p"], c["d"], c["groups"]
    opts = ConvOptions(s, p, d, groups)
    y = convolution(opts, x, w, None)
    v = np.random.default_rng(0).standard_normal(y.shape)
    S, O, K = x.shape[2:], y.shape[2:], w.shape[2:]
    op = tuple(S[a] - ((O[a] - 1) * s[a] - 2 * p[a] + d[a] * (K[a] - 1) + 1) for a in range(len(S)))
    # conv's weights [Cout, Cin/g, K] are convT's [Cin', Cout'/g, K] with Cin' = Cout
    u = transposed_convolution(op, opts, v, w, None)
    assert u.shape == x.shape
    lhs = float(np.sum(y * v))
    rhs = float(np.sum(x * u))
    scale = float(np.sum(np.abs(y) * np.abs(v)) + np.sum(np.abs(x) * np.abs(u))) + 1.0
    assert abs(lhs - rhs) <= 1e-12 * scale


@given(conv_cases())
def test_weight_gradient_kernel_is_the_adjoint_in_w(c):
    """conv is linear in w: <conv(x, w'), gy> = <w', dW(x, gy)>."""
    x, w, s, p, d, groups = c["x"], c["w"], c["s"], c["p"], c["d"], c["groups"]
    y = conv_nd(x, w, None, s, p, d, groups)
    gy = np.random.default_rng(1).standard_normal(y.shape)
    dw = conv_weight_grad_nd(x, gy, w.shape[2:], s, p, d, groups)
    assert dw.shape == w.shape
    lhs = float(np.sum(y * gy))
    rhs = float(np.sum(w * dw))
    scale = float(np.sum(np.abs(y) * np.abs(gy)) + np.sum(np.abs(w) * np.abs(dw))) + 1.0
    assert abs(lhs - rhs) <= 1e-12 * scale


def test_kernel_entry_points_match_facades():
    g = np.random.default_rng(3)
    x = g.standard_normal((2, 4, 7, 6))
    w = g.standard_normal((6, 2, 3, 2))
    b = g.standard_normal(6)
    opts = ConvOptions((2, 1), (1, 0), (1, 2), 2)
    assert np.array_equal(conv_nd(x, w, b, (2, 1), (1, 0), (1, 2), 2), convolution(opts, x, w, b))
    wt = g.standard_normal((4, 3, 3, 2))
    assert np.array_equal(conv_transpose_nd(x, wt, b, (2, 1), (1, 0), (1, 2), (1, 0), 2),
                          transposed_convolution((1, 0), opts, x, wt, b))


# --------------------------------------------------------------------------- hand-derived cases
def test_hand_derived_1d():
    # x = [1, 2, 3, 4], w = [1, -1], padding 1 -> [-1, -1, -1, -1, 4]
    y = convolution(ConvOptions(1, 1, 1), [[[1, 2, 3, 4]]], [[[1, -1]]], None)
    assert np.array_equal(y, [[[-1.0, -1.0, -1.0, -1.0, 4.0]]])
    # stride 2, dilation 2, bias 10: taps x[o*2], x[o*2+2] -> o=0: 1*1 + 3*(-1) = -2 + 10
    y = convolution(ConvOptions(2, 0, 2), [[[1, 2, 3, 4, 5]]], [[[1, -1]]], [10])
    assert np.array_equal(y, [[[8.0, 8.0]]])
    # transposed, stride 2: x = [1, 2], w = [1, 10] -> full [1, 10, 2, 20], op 1 -> [.., 0]
    y = transposed_convolution(1, ConvOptions(2, 0, 1), [[[1, 2]]], [[[1, 10]]], None)
    assert np.array_equal(y, [[[1.0, 10.0, 2.0, 20.0, 0.0]]])
    # padding crops one element per side
    y = transposed_convolution(0, ConvOptions(2, 1, 1), [[[1, 2]]], [[[1, 10]]], None)
    assert np.array_equal(y, [[[10.0, 2.0]]])


def test_hand_derived_grouped_2d():
    x = np.zeros((1, 2, 2, 2))
    x[0, 0] = 1.0
    x[0, 1] = 2.0
    w = np.ones((2, 1, 2, 2))
    w[1] *= 3.0
    y = convolution(ConvOptions(1, 0, 1, 2), x, w, [0.5, -0.5])
    # group 0 sees channel 0 (sum 4), group 1 channel 1 (sum 8 * 3)
    assert np.array_equal(y, [[[[4.5]], [[23.5]]]])


def test_padding_only_outputs_are_bias():
    x = np.ones((1, 1, 1))
    y = convolution(ConvOptions(1, 3, 1), x, [[[2.0]]], [0.25])
    assert np.array_equal(y, [[[0.25, 0.25, 0.25, 2.25, 0.25, 0.25, 0.25]]])


def test_depthwise_channel_multiplier():
    x = np.arange(6, dtype=np.float64).reshape(1, 2, 3)
    w = np.array([[[1.0]], [[2.0]], [[3.0]], [[4.0]]])  # m = 2
    y = depthwise_convolution(ConvOptions(1, 0, 1), x, w, None)
    assert np.array_equal(y[0], [[0, 1, 2], [0, 2, 4], [9, 12, 15], [12, 16, 20]])


def test_larger_shapes_match_reference_on_both_kernel_paths():
    """Segments longer than one accumulator block, 4-channel blocks, stride 1 and 2."""
    g = np.random.default_rng(11)
    x = g.standard_normal((1, 2, 40, 37))
    w = g.standard_normal((5, 2, 3, 5))
    b = g.standard_normal(5)
    for s in ((1, 1), (1, 2)):
        got = convolution(ConvOptions(s, (1, 2), 1), x, w, b)
        ref, mag = conv_reference(x, w, b, s, (1, 2), (1, 1), 1)
        assert_matches(got, ref, mag, w[0].size)


def test_register_tiled_path_matches_reference_on_larger_shapes():
    """Several 8-channel blocks (the last one padded), many tiles per batch item, groups,
    1-3 spatial axes, dilation: the micro-kernel path against the oracle."""
    g = np.random.default_rng(12)
    cases = [((2, 6, 23, 29), (22, 3, 3, 3), (1, 1), (1, 2), 2),
             ((1, 3, 70), (19, 3, 5), (2,), (1,), 1),
             ((2, 4, 5, 7, 9), (9, 4, 2, 3, 3), (1, 0, 1), (2, 1, 1), 1)]
    for xs, ws, p, d, groups in cases:
        x, w, b = g.standard_normal(xs), g.standard_normal(ws), g.standard_normal(ws[0])
        got = convolution(ConvOptions(1, p, d, groups), x, w, b)
        ref, mag = conv_reference(x, w, b, (1,) * len(p), p, d, groups)
        assert_matches(got, ref, mag, w[0].size)
    x = g.standard_normal((2, 6, 9, 11))
    w = g.standard_normal((6, 10, 4, 3))
    for s, p, d, op in (((2, 2), (1, 0), (1, 1), (1, 0)), ((3, 2), (2, 1), (2, 1), (0, 1))):
        got = transposed_convolution(op, ConvOptions(s, p, d, 2), x, w, None)
        ref, mag = conv_transpose_reference(x, w, None, s, p, d, op, 2)
        assert_matches(got, ref, mag, w.shape[0] * w[0, 0].size)


@given(conv_cases(), conv_cases(transposed=True))
def test_register_tiled_kernel_gives_the_generic_kernels_bits(c, t):
    """The tiled micro-kernels (strided convolutions through the phase split) and the
    generic direct kernel sum the same terms in the same order (one fused multiply-add
    each), so they must agree bit for bit."""
    from hmath_dl._kernels import conv as K, conv_plan as P
    from hmath_dl._kernels import views as V
    x, w, b = c["x"], c["w"], c["bias"]
    p3 = V.pad3(c["p"], 0)
    x5 = V.writeable5(x)
    xp = np.zeros(x5.shape[:2] + tuple(x5.shape[2 + a] + 2 * p3[a] for a in range(3)))
    xp[:, :, p3[0]:p3[0] + x5.shape[2], p3[1]:p3[1] + x5.shape[3], p3[2]:p3[2] + x5.shape[4]] = x5
    tiled = conv_nd(x, w, b, c["s"], c["p"], c["d"], c["groups"])   # strided: phase split
    generic = np.empty_like(tiled)
    K.conv_forward(xp, V.writeable5(w), b if b is not None else np.zeros(1), b is not None,
                   c["groups"], *V.pad3(c["s"], 1), *V.pad3(c["d"], 1), V.out5(generic))
    assert tiled.tobytes() == generic.tobytes()
    x, w, b, groups = t["x"], t["w"], t["bias"], t["groups"]
    O = tuple((x.shape[2 + a] - 1) * t["s"][a] - 2 * t["p"][a] + t["d"][a] * (w.shape[2 + a] - 1)
              + t["op"][a] + 1 for a in range(x.ndim - 2))
    tiled = conv_transpose_nd(x, w, b, t["s"], t["p"], t["d"], t["op"], groups)
    windows = np.empty_like(tiled)
    bb = np.asarray(b, dtype=np.float64) if b is not None else np.zeros(1)
    P._conv_transpose_windows(V.writeable5(x), V.writeable5(w), bb, b is not None,
                              V.pad3(t["s"], 1), V.pad3(t["p"], 0), V.pad3(t["d"], 1),
                              V.pad3(O, 1), groups, windows, V.out5(windows))
    assert tiled.tobytes() == windows.tobytes()


@pytest.mark.parametrize("xs, ws, p, d, groups, with_bias", [
    ((2, 3, 5, 61), (14, 3, 2, 3), (1, 1), (1, 2), 1, True),     # 32 + 24 + 3 per row
    ((1, 4, 47), (12, 2, 4), (0,), (1,), 2, False),               # 32 + 8 + 4
    ((2, 2, 3, 4, 18), (6, 2, 1, 2, 3), (0, 1, 1), (1, 1, 1), 1, True),   # 16 + 2
    # depth padding and dilation: windows of 3 depth slices; 10 channels = 6 + a 4-block
    ((1, 3, 4, 5, 24), (10, 3, 2, 3, 2), (1, 2, 0), (2, 1, 3), 1, True),
    ((2, 4, 40), (20, 2, 3), (2,), (2,), 2, False),              # 1-D, blocks 6 + 4
])
@pytest.mark.parametrize("fuse", [True, False])
def test_row_tiled_kernel_gives_the_generic_kernels_bits(xs, ws, p, d, groups, with_bias, fuse):
    """Long output rows take the row-tiled kernel (stores straight into the output, row
    remainders and the last tiles of the array through the buffered / scalar chains, a
    group's last block of <= 4 channels through the 4-channel micro-kernels), padding
    each run's input window itself -- or, when the window is too large (``fuse`` False),
    reading a padded copy; either way it must agree bit for bit with the generic direct
    kernel."""
    from hmath_dl._kernels import conv as K, conv_plan as P
    from hmath_dl._kernels import views as V
    g = np.random.default_rng(13)
    x, w = g.standard_normal(xs), g.standard_normal(ws)
    b = g.standard_normal(ws[0]) if with_bias else None
    p3, d3 = V.pad3(p, 0), V.pad3(d, 1)
    x5 = V.writeable5(x)
    xp = np.zeros(x5.shape[:2] + tuple(x5.shape[2 + a] + 2 * p3[a] for a in range(3)))
    xp[:, :, p3[0]:p3[0] + x5.shape[2], p3[1]:p3[1] + x5.shape[3], p3[2]:p3[2] + x5.shape[4]] = x5
    with P.forced_path(None if fuse else "rows"):       # "rows": the row kernel on a copy
        tiled = conv_nd(x, w, b, (1,) * len(p), p, d, groups)
    generic = np.empty_like(tiled)
    K.conv_forward(xp, V.writeable5(w), b if b is not None else np.zeros(1), b is not None,
                   groups, 1, 1, 1, *d3, V.out5(generic))
    assert tiled.tobytes() == generic.tobytes()
    ref, mag = conv_reference(x, w, b, (1,) * len(p), p, d, groups)
    assert_matches(tiled, ref, mag, w[0].size)


@pytest.mark.parametrize("xs, ws, s, p, d, groups", [
    ((2, 3, 9, 40), (6, 3, 3, 3), (2, 2), (1, 1), (1, 1), 1),          # every phase used
    ((1, 4, 7, 70), (12, 2, 2, 3), (2, 3), (0, 2), (1, 2), 2),         # dilation 2 along W
    ((2, 3, 8, 35), (7, 3, 1, 1), (2, 2), (0, 0), (1, 1), 1),          # 1x1: one phase
    ((1, 2, 5, 4, 36), (6, 2, 2, 2, 3), (2, 1, 2), (1, 1, 0), (2, 1, 1), 1),   # 3-D
    ((2, 2, 100), (9, 2, 4), (3,), (2,), (2,), 1),                     # 1-D, stride 3
])
@pytest.mark.parametrize("fuse", [True, False])
def test_strided_row_kernel_gives_the_generic_kernels_bits(xs, ws, s, p, d, groups, fuse):
    """Strided convolutions with long output rows take the row kernel, which copies the
    stride phases of its own input windows (or, with ``fuse`` False, reads the phase
    split of :func:`pad_split`); either way the bytes of the generic direct kernel, and
    the oracle's numbers."""
    from hmath_dl._kernels import conv as K, conv_plan as P
    from hmath_dl._kernels import views as V
    g = np.random.default_rng(18)
    x, w, b = g.standard_normal(xs), g.standard_normal(ws), g.standard_normal(ws[0])
    p3 = V.pad3(p, 0)
    x5 = V.writeable5(x)
    xp = np.zeros(x5.shape[:2] + tuple(x5.shape[2 + a] + 2 * p3[a] for a in range(3)))
    xp[:, :, p3[0]:p3[0] + x5.shape[2], p3[1]:p3[1] + x5.shape[3], p3[2]:p3[2] + x5.shape[4]] = x5
    with P.forced_path(None if fuse else "rows"):       # "rows": the row kernel on the split
        got = conv_nd(x, w, b, s, p, d, groups)
    assert got.shape[-1] >= 16
    generic = np.empty_like(got)
    K.conv_forward(xp, V.writeable5(w), b, True, groups, *V.pad3(s, 1), *V.pad3(d, 1),
                   V.out5(generic))
    assert got.tobytes() == generic.tobytes()
    ref, mag = conv_reference(x, w, b, s, p, d, groups)
    assert_matches(got, ref, mag, w[0].size)


BOUNDS_CASES = """
import sys
import numpy as np
from hmath_dl._kernels.conv_plan import conv_nd, conv_transpose_nd
g = np.random.default_rng(14)
outs = [
    # a transposed phase shorter than the others, at the very end of the input
    conv_transpose_nd(g.standard_normal((1, 1, 2)), g.standard_normal((1, 4, 2)), None,
                      (2,), (1,), (1,), (1,), 1),
    conv_transpose_nd(g.standard_normal((2, 3, 3, 5)), g.standard_normal((3, 9, 3, 2)), None,
                      (3, 2), (1, 0), (1, 1), (2, 1), 1),
    conv_transpose_nd(g.standard_normal((2, 3, 3, 9)), g.standard_normal((3, 7, 2, 3)), None,
                      (1, 2), (0, 1), (1, 1), (0, 1), 1),
    # row tiles with remainders, wide tiles, both ending at the last input element
    conv_nd(g.standard_normal((1, 2, 3, 45)), g.standard_normal((7, 2, 2, 3)), None,
            (1, 1), (0, 0), (1, 1), 1),
    conv_nd(g.standard_normal((1, 2, 4, 6)), g.standard_normal((5, 2, 3, 3)), None,
            (1, 1), (0, 0), (1, 1), 1),
    # row tiles padding their own windows (2-D; 3-D with depth padding), 4-channel blocks
    conv_nd(g.standard_normal((2, 3, 4, 21)), g.standard_normal((10, 3, 3, 3)), None,
            (1, 1), (1, 2), (1, 1), 1),
    conv_nd(g.standard_normal((1, 2, 3, 2, 15)), g.standard_normal((12, 1, 2, 2, 2)), None,
            (1, 1, 1), (1, 1, 1), (2, 1, 1), 2),
    # strided: the phase-split input, rows and wide layouts
    conv_nd(g.standard_normal((2, 3, 7, 37)), g.standard_normal((6, 3, 3, 2)), None,
            (2, 1), (1, 0), (1, 2), 1),
    conv_nd(g.standard_normal((1, 2, 5, 9)), g.standard_normal((4, 1, 2, 3)), None,
            (3, 2), (1, 1), (1, 1), 2),
    # row tiles copying the stride phases of their own windows (1x1: one phase; 3-D)
    conv_nd(g.standard_normal((2, 3, 8, 35)), g.standard_normal((7, 3, 1, 1)), None,
            (2, 2), (0, 0), (1, 1), 1),
    conv_nd(g.standard_normal((1, 2, 5, 4, 36)), g.standard_normal((6, 2, 2, 2, 3)), None,
            (2, 1, 2), (1, 1, 0), (2, 1, 1), 1),
]
for o in outs:
    sys.stdout.buffer.write(o.tobytes())
"""


def test_tiled_kernels_stay_in_bounds():
    """With numba's bounds checking on (and the cache off, so that it applies), every
    scalar fallback of the tiled kernels indexes inside its arrays; the results are the
    same bytes as the normal build's."""
    import os
    import subprocess
    import sys
    from tests.helpers import ROOT, run_with_threads
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", HMATH_DL_NO_CACHE="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", BOUNDS_CASES], env=env, capture_output=True,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout == run_with_threads(BOUNDS_CASES, 2)


@pytest.mark.parametrize("col", [0, 20, 33, 41, 42])
def test_row_tiled_kernel_reports_a_single_overflowing_output(col):
    """The row-tiled path checks finiteness as it stores (no second pass): one overflowing
    output anywhere -- in a 32-, 8- or remainder tile -- must still raise."""
    x = np.ones((1, 1, 1, 45))
    x[0, 0, 0, col + 1] = 1e300
    w = np.full((6, 1, 1, 3), 1.0)
    w[:, 0, 0, 1] = 1e10
    with pytest.raises(NumericOverflow, match=r"^convolution: "):
        convolution(ConvOptions(1, 0, 1), x, w, None)
    w[:, 0, 0, 1] = 1.0
    y = convolution(ConvOptions(1, 0, 1), x, w, None)
    assert np.isfinite(y).all() and y.shape == (1, 6, 1, 43)


GENERIC_CASES = """
import numpy as np
from hmath_dl._kernels.conv_plan import conv_nd, conv_transpose_nd
g = np.random.default_rng(15)
x = g.standard_normal((2, 4, 11, 37))
w = g.standard_normal((12, 2, 3, 3))
b = g.standard_normal(12)
wt = g.standard_normal((4, 5, 3, 4))
calls = [lambda: conv_nd(x, w, b, (1, 1), (1, 1), (1, 1), 2),
         lambda: conv_nd(x, w, None, (2, 3), (1, 0), (1, 2), 2),
         lambda: conv_nd(x[:, :, :6, :9], w, b, (1, 1), (0, 2), (2, 1), 2),
         lambda: conv_transpose_nd(x, wt, b[:10], (2, 2), (1, 0), (1, 1), (1, 0), 2)]
"""


def test_generic_kernels_alone_give_the_same_bits(monkeypatch):
    """Without register tiles (``HMATH_DL_KERNELS=portable``, as on a CPU without AVX2)
    the register-tiled kernels are switched off; the generic kernels that replace them
    must give the same bytes for forward (stride 1 and strided) and transposed
    convolutions.  The machine policy is read once per process, so the portable kernels
    run in a fresh interpreter."""
    from tests.helpers import run_with_threads
    ns = {}
    exec(GENERIC_CASES, ns)
    tiled = [f() for f in ns["calls"]]
    monkeypatch.setenv("HMATH_DL_KERNELS", "portable")
    out = run_with_threads(GENERIC_CASES + """
import sys
from hmath_dl._kernels import _cpu
assert not _cpu.machine().tiled
for f in calls:
    sys.stdout.buffer.write(f().tobytes())
""", 2)
    ends = np.cumsum([0] + [t.nbytes for t in tiled])
    assert len(out) == ends[-1]
    for t, a, e in zip(tiled, ends[:-1], ends[1:]):
        assert out[a:e] == t.tobytes()


@pytest.mark.parametrize("path", ["rows", "padded copy", "split", "split, one phase"])
@pytest.mark.parametrize("bad, where", [(np.nan, (0, 0, 0, 0)), (np.inf, (1, 2, 5, 16)),
                                        (-np.inf, (1, 1, 3, 7)), (np.nan, (0, 2, 2, 0)),
                                        (np.nan, (1, 0, 3, 1))])
def test_nonfinite_input_raises_whatever_the_kernel_path(bad, where, path):
    """convolution scans x for NaN/inf after the kernel unless the kernel checked every
    element as it copied it (row tiles padding their windows; the stride-phase split with
    every phase used); a single NaN/inf anywhere must raise NonFiniteError naming x and
    its index -- also where no output reads it (rows 2 and 3 between the two dilated taps
    of "rows"; odd rows and columns of the 1x1 stride-2 "split, one phase")."""
    from hmath_dl._kernels import conv as K, conv_plan as P
    x = np.random.default_rng(17).standard_normal((2, 3, 6, 17))
    x[where] = bad
    w, opts = {"rows": (np.ones((7, 3, 2, 3)), ConvOptions(1, (1, 1), (5, 1))),
               "padded copy": (np.ones((7, 3, 2, 3)), ConvOptions(1, (1, 1), (5, 1))),
               "split": (np.ones((6, 3, 3, 3)), ConvOptions(2, 1, 1)),
               "split, one phase": (np.ones((6, 3, 1, 1)), ConvOptions(2, 0, 1))}[path]
    # "padded copy": the row kernel on a padded copy of x, not on windows it pads itself
    with P.forced_path("rows" if path == "padded copy" else None):
        with pytest.raises(NonFiniteError, match=r"^convolution: x contains .* at index %s" %
                           re.escape(str(where))):
            convolution(opts, x, w, None)
        x[where] = 0.0
        assert np.isfinite(convolution(opts, x, w, None)).all()


@pytest.mark.parametrize("where", [0, 5, 9])
def test_wide_tiled_and_transposed_kernels_report_a_single_overflowing_output(where):
    """The wide-tiled kernel (short ragged rows; every transposed convolution) also counts
    non-finite outputs as it scatters them: one overflowing output must raise."""
    x = np.ones((1, 1, 3, 12))
    x[0, 0, 1, where + 1] = 1e300
    w = np.ones((5, 1, 3, 3))
    w[:, 0, 1, 1] = 1e10
    with pytest.raises(NumericOverflow, match=r"^convolution: "):
        convolution(ConvOptions(1, 0, 1), x, w, None)          # OW = 10: wide layout
    wt = np.ones((1, 5, 3, 3))
    wt[0, :, 2, 2] = 1e10
    with pytest.raises(NumericOverflow, match=r"^transposed_convolution: "):
        transposed_convolution(0, ConvOptions(2, 0, 1), x, wt, None)
    wt[0, :, 2, 2] = 1.0
    assert np.isfinite(transposed_convolution(0, ConvOptions(2, 0, 1), x, wt, None)).all()


@pytest.mark.parametrize("xs, ws, s, p, d, op, groups", [
    ((2, 3, 4, 17), (3, 7, 3, 4), (2, 2), (1, 1), (1, 1), (1, 0), 1),    # rows of 32 + 2
    ((1, 4, 5, 9), (4, 6, 2, 3), (1, 2), (0, 2), (2, 1), (0, 1), 2),     # rows of 16
    ((2, 2, 23), (2, 13, 5), (2,), (2,), (1,), (1,), 1),                 # 1-D, 32 + 14
    ((1, 2, 2, 3, 6), (2, 6, 2, 2, 4), (2, 1, 2), (0, 1, 1), (1, 1, 1), (1, 0, 1), 1),  # 13
    ((1, 4, 2, 5), (4, 70, 1, 3), (1, 2), (0, 1), (1, 1), (0, 1), 2),    # 10; 64 + 8 channels
])
def test_two_phase_row_kernel_gives_the_generic_kernels_bits(xs, ws, s, p, d, op, groups):
    """Stride 2 along W with >= 6 output channels per group can take the row kernel that
    computes both W phases at once (contiguous stores; row remainders one output at a time
    over all channels by the channel-vector kernel, in chunks of 64/32/16/8 channels;
    tiles near the end of the input by the scalar chain); it must give the generic
    kernel's bytes and match the oracle."""
    from hmath_dl._kernels import conv as K, conv_plan as P
    from hmath_dl._kernels import views as V
    g = np.random.default_rng(16)
    x, w = g.standard_normal(xs), g.standard_normal(ws)
    b = g.standard_normal(ws[1] * groups)
    geo = P._transpose_geometry(
        V.pad3(xs[2:], 1), V.pad3(ws[2:], 1), V.pad3(s, 1), V.pad3(p, 0), V.pad3(d, 1),
        V.pad3(tuple((xs[2 + a] - 1) * s[a] - 2 * p[a] + d[a] * (ws[2 + a] - 1) + op[a] + 1
                     for a in range(len(s))), 1), groups, xs[1] // groups, ws[1])
    assert geo[-1] is not None            # the two-phase row kernel applies
    with P.forced_transpose_path("pair"):     # (the plan prefers the wide tiles on AVX2)
        got = conv_transpose_nd(x, w, b, s, p, d, op, groups)
    with P.forced_transpose_path("wide"):
        assert conv_transpose_nd(x, w, b, s, p, d, op, groups).tobytes() == got.tobytes()
    windows = np.empty_like(got)
    O = got.shape[2:]
    P._conv_transpose_windows(V.writeable5(x), V.writeable5(w), b, True, V.pad3(s, 1),
                              V.pad3(p, 0), V.pad3(d, 1), V.pad3(O, 1), groups, windows,
                              V.out5(windows))
    assert got.tobytes() == windows.tobytes()
    ref, mag = conv_transpose_reference(x, w, b, s, p, d, op, groups)
    assert_matches(got, ref, mag, w.shape[0] * w[0, 0].size)


def test_transpose_plan_prefers_the_pair_kernel_by_target_and_can_be_forced(monkeypatch):
    """The plan takes the row-pair kernel wherever it applies with 512-bit tiles, and with
    256-bit tiles only for one-tap phases over at most 64 channels; forcing overrides it
    where the forced kernel applies, and an unknown name is refused."""
    from hmath_dl._kernels import conv_plan as P
    for wide512, k, cig, want in [(True, (1, 4, 4), 64, "pair"), (True, (1, 2, 2), 128, "pair"),
                                  (False, (1, 4, 4), 64, "wide"), (False, (1, 3, 3), 8, "wide"),
                                  (False, (1, 2, 2), 64, "pair"), (False, (1, 2, 2), 65, "wide"),
                                  (False, (1, 1, 2), 32, "pair"), (False, (1, 1, 4), 32, "wide")]:
        monkeypatch.setattr(P, "_WIDE512", wide512)
        P._pair_preferred.cache_clear()
        assert P.transpose_path(True, k, (1, 2, 2), (1, 1, 1), cig) == want, (wide512, k, cig)
        assert P.transpose_path(False, k, (1, 2, 2), (1, 1, 1), cig) == "wide"
        for forced in P.TRANSPOSE_PATHS:
            with P.forced_transpose_path(forced):
                assert P.transpose_path(True, k, (1, 2, 2), (1, 1, 1), cig) == forced
                assert P.transpose_path(False, k, (1, 2, 2), (1, 1, 1), cig) == "wide"
    P._pair_preferred.cache_clear()
    with pytest.raises(ValueError, match="unknown transposed path"):
        with P.forced_transpose_path("rows"):
            pass


# --------------------------------------------------------------------------- input handling
def test_inputs_not_mutated_and_any_array_like_accepted():
    g = np.random.default_rng(5)
    x = g.standard_normal((2, 2, 5, 4))
    w = g.standard_normal((3, 2, 2, 3))
    b = g.standard_normal(3)
    opts = ConvOptions(1, 1, 1)
    before = frozen_copy(x, w, b)
    expected = convolution(opts, x, w, b)
    for a, c in zip((x, w, b), before):
        assert np.array_equal(a, c)
    variants = [
        (readonly(x), readonly(w), readonly(b)),
        (noncontiguous(x), noncontiguous(w), noncontiguous(b)),
        (x.tolist(), w.tolist(), b.tolist()),
        (np.asfortranarray(x), np.asfortranarray(w), b),
    ]
    for xv, wv, bv in variants:
        assert np.array_equal(convolution(opts, xv, wv, bv), expected)
    x32 = x.astype(np.float32)
    assert np.array_equal(convolution(opts, x32, w, b), convolution(opts, x32.astype(np.float64), w, b))
    assert np.array_equal(convolution(ConvOptions(1, 0, 1), [[[1, 2, 3]]], [[[1, 1]]]), [[[3.0, 5.0]]])

    wt = g.standard_normal((2, 3, 2, 2))
    before = frozen_copy(x, wt)
    t = transposed_convolution((0, 0), opts, x, wt, None)
    assert np.array_equal(transposed_convolution((0, 0), opts, readonly(x), noncontiguous(wt), None), t)
    for a, c in zip((x, wt), before):
        assert np.array_equal(a, c)
    wd = g.standard_normal((4, 1, 2, 2))
    dw = depthwise_convolution(opts, x, wd, None)
    assert np.array_equal(depthwise_convolution(opts, noncontiguous(x), readonly(wd), None), dw)


def test_integer_options_broadcast_to_every_axis():
    g = np.random.default_rng(6)
    x = g.standard_normal((1, 2, 6, 5, 4))
    w = g.standard_normal((2, 2, 2, 2, 2))
    assert np.array_equal(convolution(ConvOptions(2, 1, 1), x, w, None),
                          convolution(ConvOptions((2, 2, 2), (1, 1, 1), (1, 1, 1)), x, w, None))


# --------------------------------------------------------------------------- errors
X4 = np.zeros((1, 4, 5, 5))
W3 = np.zeros((2, 3, 3, 3))
W4 = np.zeros((2, 4, 3, 3))
OPT = ConvOptions(1, 0, 1)


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: convolution(None, X4, W4, None), TypeError, "options"),
    (lambda: convolution((1, 0, 1), X4, W4, None), TypeError, "options"),
    (lambda: convolution(OPT, "bad", W4, None), TypeError, "x"),
    (lambda: convolution(OPT, X4 + 1j, W4, None), TypeError, "x"),
    (lambda: convolution(OPT, np.zeros((4, 5)), W4, None), ShapeError, "x"),
    (lambda: convolution(OPT, np.zeros((1, 1, 1, 1, 1, 1)), W4, None), ShapeError, "x"),
    (lambda: convolution(OPT, np.zeros((1, 4, 0, 5)), W4, None), ShapeError, "x"),
    (lambda: convolution(OPT, X4, np.zeros((2, 4, 3)), None), ShapeError, "weights"),
    (lambda: convolution(OPT, X4, np.zeros((0, 4, 3, 3)), None), ShapeError, "weights"),
    (lambda: convolution(OPT, X4, W3, None), ShapeError,
     "weights have 3 input channels per group, input has 4 channels / groups 1"),
    (lambda: convolution(ConvOptions((1, 1, 1), 0, 1), X4, W4, None), ShapeError, "stride"),
    (lambda: convolution(ConvOptions(1, (0,), 1), X4, W4, None), ShapeError, "padding"),
    (lambda: convolution(ConvOptions(1, 0, (1, 1, 1)), X4, W4, None), ShapeError, "dilation"),
    (lambda: convolution(OPT, X4, W4, np.zeros(3)), ShapeError, "bias"),
    (lambda: convolution(OPT, X4, W4, np.zeros((2, 1))), ShapeError, "bias"),
    (lambda: convolution(ConvOptions(1, 0, 1, 3), X4, W4, None), ShapeError, "groups 3"),
    (lambda: convolution(ConvOptions(1, 0, 1, 3), X4, W4, None), DomainError, "groups 3"),
    (lambda: convolution(ConvOptions(1, 0, 1, 4), X4, np.zeros((6, 1, 3, 3)), None), DomainError,
     "groups 4"),
    (lambda: convolution(ConvOptions(1, 0, 1, 4), X4, np.zeros((6, 1, 3, 3)), None), ShapeError,
     "output channel"),
    (lambda: convolution(OPT, X4, np.zeros((2, 4, 6, 3)), None), ShapeError, "output size"),
    (lambda: convolution(OPT, X4, np.zeros((2, 4, 6, 3)), None), DomainError, "output size"),
    (lambda: convolution(ConvOptions(1, 0, 3), X4, W4, None), DomainError, "output size"),
    (lambda: convolution(OPT, np.full((1, 4, 5, 5), np.nan), W4, None), NonFiniteError, "x"),
    (lambda: convolution(OPT, X4, np.full((2, 4, 3, 3), np.inf), None), NonFiniteError, "weights"),
    (lambda: convolution(OPT, X4, W4, [0.0, -np.inf]), NonFiniteError, "bias"),
    (lambda: convolution(OPT, np.full((1, 4, 5, 5), 1e300), np.full((2, 4, 3, 3), 1e300), None),
     NumericOverflow, "overflow"),
])
def test_convolution_errors(call, error, fragment):
    with pytest.raises(error, match=r"^convolution: ") as info:
        call()
    assert fragment in str(info.value)


XT = np.zeros((1, 4, 3, 3))
WT = np.zeros((4, 2, 2, 2))


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: transposed_convolution(0, "opts", XT, WT, None), TypeError, "options"),
    (lambda: transposed_convolution(0.5, OPT, XT, WT, None), TypeError, "output_padding"),
    (lambda: transposed_convolution(None, OPT, XT, WT, None), TypeError, "output_padding"),
    (lambda: transposed_convolution(1, OPT, XT, WT, None), DomainError, "output_padding"),
    (lambda: transposed_convolution((0, 2), ConvOptions(2, 0, 1), XT, WT, None), DomainError,
     "output_padding"),
    (lambda: transposed_convolution(-1, ConvOptions(2, 0, 1), XT, WT, None), DomainError,
     "output_padding"),
    (lambda: transposed_convolution((0, 0, 0), OPT, XT, WT, None), ShapeError, "output_padding"),
    (lambda: transposed_convolution(0, OPT, np.zeros((4, 3)), WT, None), ShapeError, "x"),
    (lambda: transposed_convolution(0, OPT, XT, np.zeros((4, 2, 2)), None), ShapeError, "weights"),
    (lambda: transposed_convolution(0, OPT, XT, np.zeros((3, 2, 2, 2)), None), ShapeError,
     "input channels"),
    (lambda: transposed_convolution(0, ConvOptions(1, 0, 1, 3), XT, np.zeros((4, 1, 2, 2)), None),
     DomainError, "groups 3"),
    (lambda: transposed_convolution(0, OPT, XT, WT, np.zeros(3)), ShapeError, "bias"),
    (lambda: transposed_convolution(0, ConvOptions(1, 2, 1), np.zeros((1, 4, 1, 1)),
                                    np.zeros((4, 2, 1, 1)), None), ShapeError, "output size"),
    (lambda: transposed_convolution(0, ConvOptions(1, 2, 1), np.zeros((1, 4, 1, 1)),
                                    np.zeros((4, 2, 1, 1)), None), DomainError, "output size"),
    (lambda: transposed_convolution(0, OPT, np.full((1, 4, 3, 3), np.nan), WT, None),
     NonFiniteError, "x"),
    (lambda: transposed_convolution(0, OPT, np.full((1, 4, 3, 3), 1e300),
                                    np.full((4, 2, 2, 2), 1e300), None), NumericOverflow, "overflow"),
])
def test_transposed_convolution_errors(call, error, fragment):
    with pytest.raises(error, match=r"^transposed_convolution: ") as info:
        call()
    assert fragment in str(info.value)


WD = np.zeros((8, 1, 3, 3))


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: depthwise_convolution(3, X4, WD, None), TypeError, "options"),
    (lambda: depthwise_convolution(ConvOptions(1, 0, 1, 2), X4, WD, None), DomainError, "groups"),
    (lambda: depthwise_convolution(OPT, X4, np.zeros((8, 2, 3, 3)), None), ShapeError, "1 input channel"),
    (lambda: depthwise_convolution(OPT, X4, np.zeros((6, 1, 3, 3)), None), ShapeError, "multiple"),
    (lambda: depthwise_convolution(OPT, X4, WD, np.zeros(4)), ShapeError, "bias"),
    (lambda: depthwise_convolution(OPT, X4, np.zeros((8, 1, 9, 9)), None), ShapeError, "output size"),
    (lambda: depthwise_convolution(OPT, X4, np.zeros((8, 1, 3)), None), ShapeError, "weights"),
    (lambda: depthwise_convolution(OPT, X4, np.full((8, 1, 3, 3), np.nan), None), NonFiniteError,
     "weights"),
    (lambda: depthwise_convolution(OPT, np.full((1, 4, 5, 5), 1e300), np.full((8, 1, 3, 3), 1e300),
                                   None), NumericOverflow, "overflow"),
])
def test_depthwise_convolution_errors(call, error, fragment):
    with pytest.raises(error, match=r"^depthwise_convolution: ") as info:
        call()
    assert fragment in str(info.value)


def test_depthwise_accepts_groups_equal_to_channels():
    x = np.random.default_rng(2).standard_normal((1, 4, 5, 5))
    w = np.random.default_rng(3).standard_normal((8, 1, 3, 3))
    assert np.array_equal(depthwise_convolution(ConvOptions(1, 1, 1, 4), x, w, None),
                          depthwise_convolution(ConvOptions(1, 1, 1), x, w, None))


# --------------------------------------------------------------------------- torch peer
@given(conv_cases())
def test_convolution_matches_torch(c):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    r = c["x"].ndim - 2
    t = lambda a: None if a is None else torch.from_numpy(np.array(a))  # noqa: E731
    ref = [F.conv1d, F.conv2d, F.conv3d][r - 1](t(c["x"]), t(c["w"]), t(c["bias"]), stride=c["s"],
                                                padding=c["p"], dilation=c["d"],
                                                groups=c["groups"]).numpy()
    got = convolution(ConvOptions(c["s"], c["p"], c["d"], c["groups"]), c["x"], c["w"], c["bias"])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


@given(conv_cases(transposed=True))
def test_transposed_convolution_matches_torch(c):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    r = c["x"].ndim - 2
    # torch additionally requires output_padding < dilation or < stride; ours < stride
    t = lambda a: None if a is None else torch.from_numpy(np.array(a))  # noqa: E731
    ref = [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d][r - 1](
        t(c["x"]), t(c["w"]), t(c["bias"]), stride=c["s"], padding=c["p"],
        output_padding=c["op"], groups=c["groups"], dilation=c["d"]).numpy()
    got = transposed_convolution(c["op"], ConvOptions(c["s"], c["p"], c["d"], c["groups"]),
                                 c["x"], c["w"], c["bias"])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_depthwise_matches_torch():
    torch = pytest.importorskip("torch")
    g = np.random.default_rng(8)
    x = g.standard_normal((2, 3, 9, 8))
    w = g.standard_normal((6, 1, 3, 3))
    b = g.standard_normal(6)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
                                     stride=(1, 2), padding=1, dilation=(2, 1), groups=3).numpy()
    got = depthwise_convolution(ConvOptions((1, 2), 1, (2, 1)), x, w, b)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- determinism
def test_bitwise_identical_for_1_and_2_threads_and_for_serial_twins(monkeypatch):
    """Same bytes with 1 and 2 threads, and from the serial twins that small calls use
    (``HMATH_DL_SERIAL_WORK=0`` forces the parallel kernels); covers the row-tiled,
    wide-tiled, phase-split (strided), transposed and generic (depthwise) paths."""
    from tests.helpers import run_with_threads
    code = """
        import sys
        import numpy as np
        from hmath_dl.layers import ConvOptions, convolution, transposed_convolution, depthwise_convolution
        from hmath_dl._kernels.conv_plan import conv_weight_grad_nd
        g = np.random.default_rng(0)
        x = g.standard_normal((3, 8, 20, 19))
        w = g.standard_normal((12, 4, 3, 3))
        b = g.standard_normal(12)
        out = [convolution(ConvOptions(1, 1, 1, 2), x, w, b),
               convolution(ConvOptions(1, 0, 1, 2), x[:, :, :7, :12], w, b),
               convolution(ConvOptions(2, 1, (1, 2), 2), x, w, b),
               transposed_convolution(1, ConvOptions(2, 1, 1, 2), x, g.standard_normal((8, 5, 3, 3)), None),
               transposed_convolution(1, ConvOptions(2, 1, 1, 2), x, g.standard_normal((8, 7, 3, 4)), b[:7].repeat(2)),
               depthwise_convolution(ConvOptions(1, 1, 1), x, g.standard_normal((16, 1, 3, 3)), None),
               conv_weight_grad_nd(x, g.standard_normal((3, 12, 20, 19)), (3, 3), (1, 1), (1, 1), (1, 1), 2)]
        for o in out:
            sys.stdout.buffer.write(o.tobytes())
    """
    monkeypatch.delenv("HMATH_DL_SERIAL_WORK", raising=False)
    serial = run_with_threads(code, 2)
    monkeypatch.setenv("HMATH_DL_SERIAL_WORK", "0")
    assert len(serial) > 0
    assert serial == run_with_threads(code, 1) == run_with_threads(code, 2)
