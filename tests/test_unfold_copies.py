"""The convolutions' copying kernels, :func:`hmath_dl._kernels.backward.im2col` (the
unfolded input of the weight gradient) and :func:`hmath_dl._kernels.conv.pad_input` (the
zero-padded input), against numpy oracles written from their specifications: every
element copied exactly (NaN, infinities and signed zeros included), +0.0 wherever the
source is padding.  im2col has a row-wise copy and, for output rows shorter than
``_SHORT_ROWS``, a gather through a per-row map; the cases cover both sides of that
threshold, strides, dilations, padding, 1-D/2-D/3-D, serial and parallel schedules, and
non-contiguous inputs (which always take the row-wise copy)."""

import numpy as np
import pytest

from hmath_dl._kernels import backward
from hmath_dl._kernels._jit import forced_schedule
from hmath_dl._kernels.backward import im2col
from hmath_dl._kernels.conv import pad_input

SCHEDULES = ["serial", "parallel"]


def _special(x, rng):
    """``x`` with NaN, +-inf and -0.0 planted at random positions (a copy)."""
    x = x.copy()
    flat = x.reshape(-1)
    for v in (np.nan, np.inf, -np.inf, -0.0):
        flat[rng.integers(0, flat.size, size=max(1, flat.size // 50))] = v
    return x


def _im2col_oracle(x, K, s, d, p, O):
    """``cols[(c, i, j, k), (n, od, oh, ow)] = xpad[n, c, od*sd + i*dd, oh*sh + j*dh,
    ow*sw + k*dw]`` with ``xpad`` the input zero-padded by ``p`` (numpy slicing)."""
    N, C = x.shape[:2]
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple((q, q) for q in p))
    rows = []
    for c in range(C):
        for i in range(K[0]):
            for j in range(K[1]):
                for k in range(K[2]):
                    sl = xp[:, c,
                            i * d[0]:i * d[0] + (O[0] - 1) * s[0] + 1:s[0],
                            j * d[1]:j * d[1] + (O[1] - 1) * s[1] + 1:s[1],
                            k * d[2]:k * d[2] + (O[2] - 1) * s[2] + 1:s[2]]
                    rows.append(sl.reshape(-1))
    return np.array(rows).reshape(C * K[0] * K[1] * K[2], -1)


# x [N, C, D, H, W], kernel extents, strides, dilations, padding
UNFOLD = [
    ((64, 16, 1, 4, 4), (1, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1)),     # the small CNN's
    ((5, 1, 1, 8, 8), (1, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1)),       # OW = 8: gathered
    ((3, 2, 1, 9, 9), (1, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1)),       # OW = 9: row copy
    ((2, 3, 1, 11, 10), (1, 3, 2), (1, 2, 1), (1, 1, 2), (0, 0, 1)),
    ((2, 3, 1, 7, 13), (1, 2, 3), (1, 2, 3), (1, 2, 1), (0, 2, 2)),      # OW = 5, strided
    ((3, 2, 1, 1, 17), (1, 1, 5), (1, 1, 3), (1, 1, 2), (0, 0, 2)),      # 1-D, OW = 5
    ((2, 2, 5, 6, 7), (2, 3, 2), (1, 2, 1), (2, 1, 1), (1, 0, 1)),       # 3-D
    ((2, 2, 1, 3, 3), (1, 5, 5), (1, 1, 1), (1, 1, 1), (0, 3, 3)),       # taps past the plane
]


def _out_extent(S, K, s, d, p):
    return tuple((S[a] + 2 * p[a] - d[a] * (K[a] - 1) - 1) // s[a] + 1 for a in range(3))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("xs,K,s,d,p", UNFOLD)
def test_im2col_copies_exactly(xs, K, s, d, p, schedule):
    rng = np.random.default_rng(1)
    x = _special(rng.standard_normal(xs), rng)
    O = _out_extent(xs[2:], K, s, d, p)
    want = _im2col_oracle(x, K, s, d, p, O)
    xr = x.copy()
    xr.setflags(write=False)
    cols = np.full(want.shape, 7.0)
    with forced_schedule(schedule):
        im2col(xr, *K, *s, *d, *p, *O, cols)
    assert cols.tobytes() == want.tobytes()
    assert np.array_equal(xr, x, equal_nan=True)          # input untouched


def test_im2col_threshold_covers_both_paths():
    """The cases above reach both copies: output rows shorter than the threshold and not."""
    widths = {_out_extent(xs[2:], K, s, d, p)[2] for xs, K, s, d, p in UNFOLD}
    assert min(widths) < backward._SHORT_ROWS <= max(widths)


def test_im2col_non_contiguous_input():
    rng = np.random.default_rng(2)
    base = _special(rng.standard_normal((4, 3, 1, 6, 12)), rng)
    x = base[..., ::2]                      # W = 6, strided: the row-wise copy
    assert not x.flags.c_contiguous
    K, s, d, p = (1, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1)
    O = _out_extent(x.shape[2:], K, s, d, p)
    want = _im2col_oracle(x, K, s, d, p, O)
    cols = np.empty(want.shape)
    im2col(x, *K, *s, *d, *p, *O, cols)
    assert cols.tobytes() == want.tobytes()


# x shape, offsets (pd, ph, pw), extra zeros past x + 2 * offsets per axis
PAD = [
    ((64, 16, 1, 4, 4), (0, 1, 1), (0, 0, 0)),      # the small CNN's
    ((3, 2, 1, 5, 5), (0, 1, 2), (0, 0, 0)),
    ((3, 2, 1, 5, 4), (0, 1, 2), (0, 0, 0)),
    ((2, 3, 3, 4, 5), (1, 0, 1), (1, 2, 1)),        # 3-D, out larger than needed
    ((2, 3, 1, 1, 3), (0, 0, 2), (0, 0, 0)),        # 1-D
    ((2, 2, 2, 3, 20), (1, 2, 3), (0, 1, 0)),       # long rows
]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("xs,off,extra", PAD)
def test_pad_input_copies_exactly(xs, off, extra, schedule):
    rng = np.random.default_rng(3)
    x = _special(rng.standard_normal(xs), rng)
    want = np.pad(x, ((0, 0), (0, 0)) + tuple((o, o + e) for o, e in zip(off, extra)))
    out = np.full(want.shape, 7.0)
    xr = x.copy()
    xr.setflags(write=False)
    with forced_schedule(schedule):
        pad_input(xr, *off, out)
    assert out.tobytes() == want.tobytes()


def test_pad_input_non_contiguous_input():
    rng = np.random.default_rng(4)
    x = _special(rng.standard_normal((3, 2, 1, 4, 8)), rng)[..., ::2]
    assert not x.flags.c_contiguous
    want = np.pad(x, ((0, 0), (0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.empty(want.shape)
    pad_input(x, 0, 1, 1, out)
    assert out.tobytes() == want.tobytes()
