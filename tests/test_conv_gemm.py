"""The GEMM convolution path (the unfolded input times the weights, tasks over the whole
batch, ``_kernels/conv_gemm.py``): the generic kernel's bytes on every shape remainder,
kernel size, padding, stride, dilation and group count, the oracle's numbers, the errors
of the facade, and the plan that picks it."""

import re

import numpy as np
import pytest

from hmath_dl._kernels import _cpu
from hmath_dl._kernels import conv_plan as K
from hmath_dl._kernels import gemm_f64 as G
from hmath_dl.errors import NonFiniteError, NumericOverflow
from hmath_dl.layers import ConvOptions, convolution
from tests.helpers import assert_same_across_threads, noncontiguous, readonly
from tests.reference.conv import conv_reference

EPS = np.finfo(np.float64).eps

needs_tiles = pytest.mark.skipif(
    not _cpu.machine().tiled,
    reason="the GEMM path runs the register-tiled GEMM, which this target "
           f"({_cpu.machine().isa}) does not have; the generic kernel computes these shapes")


def _case(xs, cout, s, groups, seed, bias=True, k=1, p=0, d=1):
    g = np.random.default_rng(seed)
    r = len(xs) - 2
    x = g.standard_normal(xs)
    w = g.standard_normal((cout, xs[1] // groups) + (k,) * r)
    b = g.standard_normal(cout) if bias else None
    s = (s,) * r if isinstance(s, int) else s
    return ConvOptions(s, (p,) * r, (d,) * r, groups), x, w, b


# shapes chosen for the remainders: output channels per group a multiple of 6 or not (a
# padded row block), output planes a multiple of the tile width or not, several panels per
# image, strides 1-3 (and mixed), groups, 1-D/2-D/3-D, a batch of 1 and of 5; 1x1 kernels
# and larger ones with padding (rows and columns partly or wholly in it) and dilation
SHAPES = [  # x shape, Cout, stride, groups, kernel, padding, dilation
    ((2, 16, 12, 12), 16, 1, 1, 1, 0, 1),
    ((2, 16, 12, 12), 16, 2, 1, 1, 0, 1),
    ((3, 24, 7, 9), 13, 1, 1, 1, 0, 1),
    ((2, 10, 9, 9), 30, 3, 1, 1, 0, 1),
    ((1, 12, 5, 5), 18, 1, 2, 1, 0, 1),
    ((5, 9, 20, 21), 6, 1, 1, 1, 0, 1),
    ((2, 33, 17, 40), 70, 1, 1, 1, 0, 1),
    ((1, 7, 1, 1), 6, 1, 1, 1, 0, 1),
    ((3, 16, 50), 8, 2, 1, 1, 0, 1),
    ((2, 8, 5, 6, 7), 12, (1, 2, 1), 1, 1, 0, 1),
    ((1, 300, 3, 3), 7, 1, 1, 1, 0, 1),
    ((2, 20, 14, 14), 26, 1, 1, 3, 1, 1),
    ((2, 8, 13, 11), 12, 2, 1, 3, 1, 1),
    ((1, 6, 9, 10), 12, 1, 2, 3, 2, 2),
    ((2, 3, 23, 23), 8, 2, 1, 7, 3, 1),
    ((1, 5, 4, 4), 6, 1, 1, 4, 3, 1),
    ((2, 4, 40), 9, 1, 1, 5, 2, 1),
    ((1, 4, 5, 6, 7), 6, 1, 1, 3, 1, 1),
    ((1, 64, 6, 6), 70, 1, 1, 3, 1, 1),
    # 1x1 (channel planes packed by plain copies): panels of several tiles, a partial
    # last tile, 14 row blocks
    ((2, 20, 37, 29), 80, 1, 1, 1, 0, 1),
    ((2, 20, 74, 58), 80, 2, 1, 1, 0, 1),
    ((1, 130, 9, 71), 8, 1, 2, 1, 0, 1),
    # 1x1 at unit stride whose channel planes the float GEMM reads in place (rows of whole
    # vectors, few output channels), with groups
    ((2, 24, 8, 8), 18, 1, 2, 1, 0, 1),
    # unfolded from the stride phases: a residue never read (k 2, s 3), mixed strides
    ((2, 9, 17, 16), 12, 3, 1, 2, 1, 1),
    ((1, 6, 15, 14), 7, (2, 3), 1, 3, 2, 2),
    ((2, 4, 6, 7, 8), 6, (2, 1, 2), 1, 3, 1, 1),
]


@needs_tiles
@pytest.mark.parametrize("xs,cout,s,groups,k,p,d", SHAPES)
def test_gemm_path_gives_the_generic_kernels_bits(xs, cout, s, groups, k, p, d):
    opts, x, w, b = _case(xs, cout, s, groups, seed=sum(xs) + cout, k=k, p=p, d=d)
    for bias in (b, None):
        with K.forced_path("generic"):
            want = convolution(opts, x, w, bias)
        with K.forced_path("gemm"):
            got = convolution(opts, x, w, bias)
        assert got.tobytes() == want.tobytes()
        ref, mag = conv_reference(x, w, bias, opts.stride, opts.padding, opts.dilation, groups)
        assert np.all(np.abs(got - ref) <= 2 * (w[0].size + 1) * EPS * mag + 1e-300)


@needs_tiles
def test_the_plan_takes_the_gemm_path_where_it_is_faster():
    """Deep kernels on small output planes and every unpadded 1x1 kernel (strided or
    not, any plane: its panels are plain copies of the input) go to the GEMM on every ISA; padded 1x1
    kernels, shallow kernels on small planes and fewer than 6 channels per group stay on
    the other kernels."""
    fp = K.forward_path
    assert fp(64, 512, (1, 1, 1), 7, False, padded=False, O=(1, 7, 7)) == "gemm"
    assert fp(64, 32, (3, 3, 1), 7, True, padded=True, O=(1, 7, 7)) == "gemm"
    assert fp(32, 16, (3, 3, 1), 8, False, padded=True, O=(1, 8, 8)) != "gemm"
    assert fp(64, 32, (1, 1, 1), 28, True, padded=False, O=(1, 28, 28)) == "gemm"
    assert fp(64, 32, (1, 1, 1), 28, False, padded=False, O=(1, 28, 28)) == "gemm"
    assert fp(64, 32, (1, 1, 1), 56, False, padded=False, O=(1, 56, 56)) == "gemm"
    assert fp(64, 32, (1, 1, 1), 58, True, padded=True, O=(1, 58, 58)) != "gemm"
    assert fp(64, 32, (3, 3, 1), 28, True, padded=True, O=(1, 28, 28)) != "gemm"
    assert fp(5, 512, (1, 1, 1), 7, False, padded=False, O=(1, 7, 7)) != "gemm"
    # deep strided kernels with 512-bit tiles; deep kernels on mid-sized planes (with
    # 512-bit tiles only where the output rows are not whole vectors)
    wide = K._WIDE512
    assert (fp(128, 64, (3, 3, 1), 28, True, padded=True, O=(1, 28, 28), strided=True)
            == "gemm") == wide
    assert fp(64, 32, (3, 3, 1), 16, True, padded=True, O=(1, 16, 16), strided=True) != "gemm"
    assert fp(256, 256, (3, 3, 1), 14, True, padded=True, O=(1, 14, 14), strided=False) == "gemm"
    assert fp(128, 256, (3, 3, 1), 12, True, padded=True, O=(1, 12, 12), strided=False) == "gemm"
    assert (fp(256, 256, (3, 3, 1), 16, True, padded=True, O=(1, 16, 16), strided=False)
            == "gemm") == (not wide)
    assert fp(256, 64, (3, 3, 1), 14, True, padded=True, O=(1, 14, 14), strided=False) != "gemm"


@needs_tiles
def test_inputs_readonly_noncontiguous_and_not_mutated():
    opts, x, w, b = _case((2, 24, 10, 11), 14, 2, 1, seed=3)
    keep = [a.copy() for a in (x, w, b)]
    with K.forced_path("gemm"):
        want = convolution(opts, x, w, b)
        for xv, wv, bv in [(readonly(x), readonly(w), readonly(b)),
                           (noncontiguous(x), noncontiguous(w), noncontiguous(b))]:
            assert convolution(opts, xv, wv, bv).tobytes() == want.tobytes()
    for a, k in zip((x, w, b), keep):
        assert a.tobytes() == k.tobytes()


@needs_tiles
@pytest.mark.parametrize("s,k,p", [(1, 1, 0), (2, 1, 0), (2, 3, 1), (3, 2, 0)])
@pytest.mark.parametrize("where", [(1, 3, 4, 6), (1, 3, 5, 5), (0, 0, 11, 11)])
def test_a_nan_in_x_is_reported_read_or_not(s, k, p, where):
    """At stride 2 with a 1x1 kernel (and at stride 3 with a 2x2 one) some elements are
    never read by any output: they are still reported, with their index."""
    opts, x, w, b = _case((2, 16, 12, 12), 12, s, 1, seed=4, k=k, p=p)
    x[where] = np.nan
    with K.forced_path("gemm"):
        with pytest.raises(NonFiniteError, match=r"convolution: x contains nan at index "
                           + re.escape(str(where))):
            convolution(opts, x, w, b)


@needs_tiles
def test_an_overflowing_result_is_numeric_overflow():
    opts, x, w, b = _case((2, 16, 12, 12), 12, 1, 1, seed=5)
    with K.forced_path("gemm"):
        with pytest.raises(NumericOverflow, match="convolution: the result overflows"):
            convolution(opts, x * 1e300, w * 1e10, b)
        # large finite inputs, and channel 3's bias the largest float64: its outputs
        # leave the range
        b2 = np.where(np.arange(12) == 3, np.finfo(np.float64).max, 0.0)
        with pytest.raises(NumericOverflow):
            convolution(opts, np.abs(x) + 1.0, np.abs(w) * 1e306 + 1e305, b2)


def test_same_bits_for_any_thread_count():
    assert_same_across_threads("""
        import sys
        import numpy as np
        from hmath_dl.layers import ConvOptions, convolution
        g = np.random.default_rng(7)
        x = g.standard_normal((4, 40, 30, 30)); w = g.standard_normal((50, 40, 1, 1))
        for s in (1, 2):
            y = convolution(ConvOptions((s, s), (0, 0), (1, 1), 1), x, w, g.standard_normal(50))
            sys.stdout.buffer.write(y.tobytes())
    """)


def test_gemm_bias_and_nonfinite_count():
    """The GEMM's fused epilogue: ``c + bias`` along either axis is the chain then one
    addition (numpy's), and the count is the number of non-finite outputs, on every shape
    remainder, tiled and portable."""
    g = np.random.default_rng(9)
    for M, Kd, N in [(6, 5, 8), (7, 40, 33), (13, 130, 300), (97, 7, 64), (200, 3, 70)]:
        a, bm = g.standard_normal((M, Kd)), g.standard_normal((Kd, N))
        chain = G.matmul(a, bm, tiled=False)
        for axis, bias in [(1, g.standard_normal(N)), (0, g.standard_normal(M))]:
            want = chain + (bias if axis == 1 else bias[:, None])
            for tiled in (True, False):
                got, bad = G.gemm(a, bm, bias=bias, bias_axis=axis, tiled=tiled)
                assert got.tobytes() == want.tobytes() and bad == 0
        a[M // 2, Kd // 2] = np.inf
        for tiled in (True, False):
            got, bad = G.gemm(a, bm, tiled=tiled)
            assert bad == int(np.count_nonzero(~np.isfinite(got))) > 0

