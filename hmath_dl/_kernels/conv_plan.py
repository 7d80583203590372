"""The convolution plan and its entry points (plain Python; the kernels are in
:mod:`.conv`, :mod:`.conv_gemm`, :mod:`.conv_batch` and :mod:`.conv_wgrad`).

Kernel-level entry points (no validation; the arrays must already be C-contiguous
float64 of rank 3-5 with consistent shapes, the tuples one int per spatial axis; they are
meant for the facades in ``hmath_dl.layers.convolution`` and for the autodiff rules):

* :func:`conv_nd` - forward cross-correlation,
* :func:`conv_transpose_nd` - transposed convolution (= gradient of :func:`conv_nd` with
  respect to its input: ``conv_transpose_nd(gy, w, None, s, p, d, op, g)`` with
  ``op = S - ((O-1)s - 2p + d(K-1) + 1)`` per axis gives ``dL/dx`` of shape ``x.shape``),
* :func:`conv_weight_grad_nd` - gradient of :func:`conv_nd` with respect to its weights.

The plan: :func:`forward_path` decides which forward kernel runs a shape (every path
gives the same bits; the choice is speed only), :func:`forced_path` overrides it for the
tests that hold every path to the same bytes and for A/B benchmarks, and the geometry
helpers (:func:`_window_geometry`, :func:`_forward_geometry`, :func:`_transpose_geometry`)
compute each path's offsets and workspace once per shape.
"""

import contextlib
import functools
import math

import numba
import numpy as np

from . import _cpu, conv_batch, conv_gemm, views
from ._jit import num_threads
from ._plan import forcing
from ._simd import _VW, _WIDE512
from .conv import (_ROW_CB, _cv_weights, _frozen, _geometry, _launch_tiled,
                   _pack_weights, _slack_empty, _tile_cb, _used_residues, _wide_dst,
                   conv_forward, conv_forward_rows, conv_transpose_rows, conv_weight_grad,
                   pad_input, pad_split)


@functools.lru_cache(maxsize=None)
def tiled_kernels_enabled():
    """Whether the register-tiled kernels are used: the machine policy's ``tiled`` (x86
    with FMA and AVX2 or AVX-512, and no ``HMATH_DL_KERNELS=portable``).  Their tiles keep
    24 (AVX-512) or 12 (AVX2) vector accumulators in registers; elsewhere the generic
    kernel (same bits) runs."""
    return _cpu.machine().tiled


_FUSE_WINDOW = 1 << 17    # largest row window (float64 elements) copied per iteration
_ROW_POSITIONS = 192       # output positions per iteration of the row kernel (about)
_ONES3 = np.ones(3, dtype=np.int64)
_ZEROS1 = np.zeros(1, dtype=np.int64)
_ZEROS3 = np.zeros(3, dtype=np.int64)
_NO_OFFS = np.zeros(0, dtype=np.int64)
for _a in (_ONES3, _ZEROS1, _ZEROS3, _NO_OFFS):
    _a.flags.writeable = False


#: Forward paths, fastest first where they apply (see :func:`forward_path`).
FORWARD_PATHS = ("batch", "gemm", "rows_fused", "rows", "wide", "generic")
#: Transposed-convolution paths of the register-tiled kernels (see :func:`transpose_path`).
TRANSPOSE_PATHS = ("pair", "wide")
_forced = {"forward": None, "transpose": None}


@contextlib.contextmanager
def forced_path(name):
    """Within the block, forward convolutions take path ``name`` (one of
    :data:`FORWARD_PATHS`) wherever it applies, and the generic kernel elsewhere; for the
    tests that hold every path to the same bits and for A/B benchmarks.  ``None``
    restores the plan."""
    if name is not None and name not in FORWARD_PATHS:
        raise ValueError(f"unknown forward path {name!r} (expected one of {FORWARD_PATHS})")
    with forcing(_forced, "forward", name):
        yield


@contextlib.contextmanager
def forced_transpose_path(name):
    """Within the block, transposed convolutions take path ``name`` (one of
    :data:`TRANSPOSE_PATHS`) wherever it applies (see :func:`transpose_path`); ``None``
    restores the plan.  For tests and A/B benchmarks: every path gives the same bits."""
    if name is not None and name not in TRANSPOSE_PATHS:
        raise ValueError(f"unknown transposed path {name!r} (expected one of "
                         f"{TRANSPOSE_PATHS})")
    with forcing(_forced, "transpose", name):
        yield


@functools.lru_cache(maxsize=128)
def _pair_preferred(K, s, d, Cig):
    """Whether the row-pair kernel beats the wide tiles on this target (both compute the
    same sums in the same order).  512-bit tiles: always (two vectors per phase).  256-bit
    tiles hold one vector per phase, so each term costs six weight broadcasts for six
    multiply-adds, and the wide tiles (whose stores scatter) are faster wherever a phase has
    more than one tap or there are many channels.  AVX2, 2 threads, pair -> wide: 4x4 s2
    64->64 @16 3.97-4.08 -> 3.63-3.66 ms, 3x3 s2 32->32 @32 4.75-5.05 -> 3.89-4.21, 1-D k4 s2
    64->64 @512 5.03-5.10 -> 4.58-4.67, 2x2 s2 128->64 @16 2.41-2.52 -> 2.10-2.43; but 2x2
    s2 64->32 @32 2.89-3.06 -> 3.47-3.69 and 1-D k2 s2 32->32 @64 0.11 -> 0.15."""
    if _WIDE512:
        return True
    taps = 1
    for a in range(3):
        taps *= max(len(t[0]) for t in _phase_taps(K[a], s[a], d[a]))
    return taps == 1 and Cig <= 64


def transpose_path(pair_applies, K, s, d, Cig):
    """The plan for a tiled transposed convolution: ``"pair"`` (:func:`conv_transpose_rows`,
    stride 2 along W, both W phases in every vector; only where ``pair_applies``) or
    ``"wide"`` (:func:`conv_forward_tiled` over the phases); :func:`forced_transpose_path`
    overrides the choice where the forced path applies."""
    forced = _forced["transpose"]
    if not pair_applies:
        return "wide"
    if forced is not None:
        return forced
    return "pair" if _pair_preferred(K, s, d, Cig) else "wide"


def _applicable_forward(Cog, OW, tiled):
    """Forward paths whose kernels can compute this shape (the window size of
    ``rows_fused`` is checked at launch)."""
    out = []
    if conv_batch.applies(Cog, tiled):
        out.append("batch")
    if conv_gemm.applies(Cog, tiled):
        out.append("gemm")
    if tiled and Cog >= _ROW_CB and OW > 0:
        out += ["rows_fused", "rows"]
    if tiled and Cog >= 4:
        out.append("wide")
    return out + ["generic"]


def forward_path(Cog, Cg, K3, OW, strided_or_padded, tiled=None, padded=True, O=None, N=None,
                 strided=None):
    """The plan: which forward kernel a convolution with ``Cog`` output / ``Cg`` input
    channels per group, kernel extent ``K3``, output rows of ``OW`` positions (zero
    padding when ``padded``) runs (every path gives the same bits; the choice is speed
    only, tuned per tile set):

    * ``batch`` (:func:`.conv_batch.forward`, one GEMM over the whole batch ``N``, batch
      index innermost): small output planes ``O`` where :func:`.conv_batch.usable` says so;
    * ``gemm`` (:func:`.conv_gemm.conv_gemm`, the unfolded input times the weights):
      where :func:`.conv_gemm.preferred` says so for the kernel extents and the output
      extents ``O`` and the terms per output (deep kernels on small output planes; every
      unpadded 1x1 kernel, packed by plain copies; deep strided kernels with 512-bit
      tiles; deep kernels on planes up to 16x16 with 256-bit tiles);
    * ``rows_fused`` (:func:`conv_forward_rows` copying its own padded/strided input
      windows; ``rows`` on a padded copy when the windows are too large): at least 6
      output channels per group and output rows of whole vectors or >= 16 positions;
    * ``wide`` (:func:`conv_forward_tiled`): other shapes with >= 4 channels per group
      (AVX-512), or >= 6 (AVX2: with 4 channels the 12-position tiles cost more in
      scatter than they save);
    * ``generic`` (:func:`conv_forward`): everything else, and every shape without
      register-tiled kernels.
    """
    if tiled is None:
        tiled = tiled_kernels_enabled()
    ok = _applicable_forward(Cog, OW, tiled)
    forced = _forced["forward"]
    if forced is not None:
        return forced if forced in ok else "generic"
    if not tiled:
        return "generic"
    if (O is not None and N is not None
            and conv_batch.usable(Cog, Cg * K3[0] * K3[1] * K3[2], O[0] * O[1] * O[2], N,
                                  tiled)):
        return "batch"
    if strided is None:
        strided = strided_or_padded and not padded
    rows = Cog >= _ROW_CB and (OW >= 16 or (OW > 0 and OW % _VW == 0))
    if "gemm" in ok and O is not None and conv_gemm.preferred(Cg, K3, O, strided, padded,
                                                              _WIDE512, rows):
        return "gemm"
    if rows:
        # the fused windows are a packed copy of what the tiles read: faster even without
        # padding or strides (1x1 256->64 @56: 1.6x on AVX2), unless they do not fit
        return "rows_fused"
    if Cog >= (4 if _WIDE512 else _ROW_CB):
        return "wide"
    return "generic"


def _launch_forward(x5, w5, b, has_bias, groups, s, d, out5, pads):
    """Run the forward convolution of the rank-5 input ``x5`` (zero padding ``pads``,
    strides ``s``, dilations ``d``) into ``out5`` with the kernel :func:`forward_path`
    chooses; all sum the same terms in the same order (same bits).  ``rows_fused`` falls
    back to ``rows`` on a padded copy or the stride phases (:func:`pad_split`) when its
    windows would exceed ``_FUSE_WINDOW`` elements; ``rows`` and ``wide`` run at stride 1
    on a padded copy or on the stride phases.

    Everything decided from the shapes alone (the path, the geometry, the rows per
    iteration) comes from :func:`_forward_plan`, computed once per shape, options, forced
    path and thread count: a training loop calls the same convolutions every step, and
    deciding again cost about as much Python as the rest of the call.

    Returns ``(finite, x_finite)``: whether every output is finite when the kernel checked
    it (the tiled paths), else None; whether every element of ``x5`` is finite when a
    kernel copied them all and checked them, else None."""
    plan = _forward_plan(x5.shape, w5.shape, groups, s, d, pads, _forced["forward"],
                         num_threads())
    path = plan[0]
    if path == "batch":
        return conv_batch.forward(x5, w5, b, has_bias, groups, s, d, pads, out5), None
    if path == "gemm":
        ok, x_ok = conv_gemm.conv_gemm(x5, w5, b, has_bias, groups, s, d, pads, out5)
        return bool(ok), x_ok
    fmas, Cout, Cog = plan[1], plan[2], plan[3]
    bvec = b if has_bias else np.zeros(Cout, dtype=np.float64)
    if path == "rows_fused":
        pads_a, s_a, used, R, KDe, Wr, loffs, offs, maxoff, covers, rpi = plan[4]
        w2 = w5.reshape(Cout, -1)
        ok, x_ok = conv_forward_rows(
            fmas, x5, pads_a, s_a, *used, R, KDe, Wr, loffs,
            _pack_weights(w2, groups, _ROW_CB), _cv_weights(w2, groups, out5.shape[4]), offs,
            maxoff, bvec, has_bias, Cog, rpi, out5)
        return bool(ok), (bool(x_ok) if covers else None)
    if path == "generic":
        conv_forward.sized(fmas)(
            _padded(x5, pads), w5, b, has_bias, groups, s[0], s[1], s[2], d[0], d[1], d[2], out5)
        return None, None
    split, geo, rpi = plan[4]
    x_ok = None
    if split is not None:
        # pad and split into the stride phases that are read, then correlate at stride 1
        used_a, xp_shape, every = split
        xp = _slack_empty((x5.shape[0],) + xp_shape)
        copied = pad_split(x5, pads[0], pads[1], pads[2], s[0], s[1], s[2], *used_a, xp)
        # every residue used: the split copied (and checked) every element of x
        x_ok = bool(copied) if every else None
    else:
        xp = _padded(x5, pads, slack=path == "wide")
    w2 = w5.reshape(Cout, -1)
    if path == "rows":
        # row tiles stored straight into the output
        ok, _ = conv_forward_rows(
            fmas, xp, _ZEROS3, _ONES3, _ZEROS1, _ZEROS1, _ZEROS1, 0, 1, xp.shape[4], _NO_OFFS,
            _pack_weights(w2, groups, _ROW_CB), _cv_weights(w2, groups, out5.shape[4]),
            geo[0], geo[1], bvec, has_bias, Cog, rpi, out5)
        return bool(ok), x_ok
    return _launch_tiled(xp, _pack_weights(w2, groups, _tile_cb(Cog)), Cog, geo, b, has_bias,
                         out5, fmas), x_ok


@functools.lru_cache(maxsize=256)
def _forward_plan(xshape, wshape, groups, s, d, pads, forced, threads):
    """What :func:`_launch_forward` decides from the shapes (rank 5), groups, strides,
    dilations and padding (the forced path and the thread count are part of the key: the
    path and the rows per iteration depend on them): ``(path,)`` for ``batch`` and
    ``gemm``; else ``(path, fmas, Cout, Cog, extra)`` with ``extra`` the fused windows'
    arguments (``rows_fused``), ``(split, geo, rpi)`` (``rows``, ``wide``: the stride
    phases' residues, shape and whether every phase is used, or None at stride 1; the
    geometry; the rows per iteration), or None (``generic``)."""
    Cout, Cg = wshape[:2]
    Cog = Cout // groups
    N = xshape[0]
    OD, OH, OW = (tuple((xshape[2 + a] + 2 * pads[a] - d[a] * (wshape[2 + a] - 1) - 1) // s[a]
                        + 1 for a in range(3)))
    fmas = N * Cout * OD * OH * OW * (Cg * wshape[2] * wshape[3] * wshape[4])
    S, K3 = xshape[2:], wshape[2:]
    strided_or_padded = bool(any(pads) or s != (1, 1, 1))
    path = forward_path(Cog, Cg, K3, OW, strided_or_padded, padded=any(pads), O=(OD, OH, OW),
                        N=N, strided=s != (1, 1, 1))
    if path in ("batch", "gemm"):
        return (path,)
    rpi = _rows_per_iteration(N * groups * OD, OH, OW)
    if path == "rows_fused":
        R, KDe, Wr, used, loffs, offs, maxoff, covers = _window_geometry(
            S, K3, s, d, pads, (OD, OH, OW), groups, Cg, rpi)
        if Cg * len(used[0]) * len(used[1]) * len(used[2]) * KDe * R * Wr <= _FUSE_WINDOW:
            return (path, fmas, Cout, Cog,
                    _frozen(pads, s) + (used, R, KDe, Wr, loffs, offs, maxoff, covers, rpi))
        path = "rows"
    if path == "generic":
        return (path, fmas, Cout, Cog, None)
    split = None
    if s != (1, 1, 1):
        used = _used_residues(K3, s, d)
        P = len(used[0]) * len(used[1]) * len(used[2])
        grid = tuple(-(-(S[a] + 2 * pads[a]) // s[a]) for a in range(3))
        # (writeable int64 arrays, as conv_gemm passes them to pad_split: one compiled
        # type; private to the plan, and the kernel only reads them)
        split = (tuple(np.asarray(u, dtype=np.int64) for u in used), (xshape[1] * P,) + grid,
                 P == s[0] * s[1] * s[2])
        gshape = grid
    else:
        gshape = tuple(S[a] + 2 * pads[a] for a in range(3))
    geo = _forward_geometry(gshape, K3, d, groups, Cg, Cog, (OD, OH, OW), s)
    return (path, fmas, Cout, Cog, (split, geo, rpi))


def _rows_per_iteration(planes, OH, OW):
    """Output rows per iteration of :func:`conv_forward_rows`: about ``_ROW_POSITIONS``
    positions, halved while that leaves fewer than 4 iterations per thread (few large
    images).  Only the schedule depends on it (and thus on the thread count), never the
    bits."""
    rpi = max(1, min(OH, _ROW_POSITIONS // max(OW, 1)))
    need = 4 * numba.get_num_threads()
    while rpi > 1 and planes * -(-OH // rpi) < need:
        rpi = (rpi + 1) // 2
    return rpi


def _padded(x5, pads, slack=False):
    """``x5`` with ``pads`` = (pd, ph, pw) zeros on both sides of its spatial axes (``x5``
    itself when there are none, unless ``slack``); ``slack``: a copy in a
    :func:`_slack_empty` buffer."""
    if not any(pads) and not slack:
        return x5
    shape = x5.shape[:2] + tuple(x5.shape[2 + a] + 2 * pads[a] for a in range(3))
    xp = _slack_empty(shape) if slack else np.empty(shape, dtype=np.float64)
    if xp.size:
        pad_input(x5, pads[0], pads[1], pads[2], xp)
    return xp


def _tap_phases(K3, s, d):
    """``(used, P, k, phase)`` of a kernel with extents ``K3``, strides ``s`` and
    dilations ``d``: the used residues per axis (:func:`_used_residues`), their number of
    stride phases ``P``, the dilated tap offsets ``k[a]`` per axis, and the phase index of
    every tap ``[KD, KH, KW]``: tap ``k`` on axis ``a`` reads the phase of residue
    ``(k*d) mod s`` at offset ``(k*d) div s``."""
    used = _used_residues(K3, s, d)
    nu = [len(u) for u in used]
    k = [np.arange(K3[a]) * d[a] for a in range(3)]
    ix = [np.searchsorted(np.asarray(used[a]), k[a] % s[a]) for a in range(3)]
    phase = (ix[0][:, None, None] * (nu[1] * nu[2]) + ix[1][None, :, None] * nu[2]
             + ix[2][None, None, :])
    return used, nu[0] * nu[1] * nu[2], k, phase


@functools.lru_cache(maxsize=128)
def _window_geometry(S, K3, s, d, pads, O, groups, Cg, rpi):
    """Row windows of :func:`conv_forward_rows` copying its own input (see
    :func:`_fill_window`): ``(R, KDe, Wr, used, loffs, offs, maxoff, covers)`` -- rows per
    window (``rpi`` output rows + the largest row offset of a tap within its stride
    phase), depth slices (likewise), the row length (the width of a stride phase of the
    padded input), the used residues per axis (int64 arrays), the offset of term kk = ci'
    * KT + (kd*KH + kh)*KW + kw in the window ``[Cg, P, KDe, R, Wr]``, placeholder (zero)
    ``[groups, K]`` offsets and ``[groups]`` maxima that only carry the shape, and whether
    the windows copy every element of the input (every residue used, and the last input
    row/slice inside the last window), so that the kernel's finiteness verdict on the
    copied elements covers all of x.  Cached, read-only."""
    used, P, k, phase = _tap_phases(K3, s, d)
    KDe = int((k[0] // s[0]).max()) + 1
    R = rpi + int((k[1] // s[1]).max())
    Wr = -(-(S[2] + 2 * pads[2]) // s[2])
    taps = (((phase * KDe + (k[0] // s[0])[:, None, None]) * R
             + (k[1] // s[1])[None, :, None]) * Wr + (k[2] // s[2])[None, None, :]).reshape(-1)
    loffs = (np.arange(Cg)[:, None] * (P * KDe * R * Wr) + taps[None, :]).reshape(-1)
    # the last phase row (slice) copied is O - 1 + the largest tap offset; it reaches the
    # last real input element when (that)*s + s - 1 >= pad + S - 1 (all residues used)
    covers = (P == s[0] * s[1] * s[2]
              and all((O[a] - 1 + int((k[a] // s[a]).max())) * s[a] + s[a] - 1
                      >= pads[a] + S[a] - 1 for a in (0, 1)))
    return ((R, KDe, Wr, _frozen(*used)) + _frozen(loffs, np.zeros((groups, loffs.size)),
                                                    np.zeros(groups)) + (covers,))


@functools.lru_cache(maxsize=128)
def _forward_geometry(grid, K3, d, groups, Cg, Cog, O, s=(1, 1, 1)):
    """Term offsets and output map of a forward convolution computed at stride 1 on the
    grid ``grid``: the padded input itself (``s`` = 1), or its used stride phases laid out
    by :func:`pad_split` (residues from :func:`_used_residues`).  Cached: a training loop
    repeats the same shapes."""
    Dq, Hq, Wq = grid
    plane = Dq * Hq * Wq
    used, P, k, phase = _tap_phases(K3, s, d)
    # term kk = ci' * KT + (kd*KH + kh)*KW + kw: its offset in the (split) input
    taps = (phase * plane + (k[0] // s[0])[:, None, None] * (Hq * Wq)
            + (k[1] // s[1])[None, :, None] * Wq + (k[2] // s[2])[None, None, :]).reshape(-1)
    chan = np.arange(groups * Cg, dtype=np.int64).reshape(groups, Cg) * (P * plane)
    offs = (chan[:, :, None] + taps[None, None, :]).reshape(groups, -1)
    dst = _wide_dst(O, (0, 0, 0), (1, 1, 1), grid, O)[None, :]
    return _geometry(offs, np.arange(groups, dtype=np.int64) * Cog, dst)


def conv_nd(x, w, bias, stride, padding, dilation, groups, out=None, report_finite=False):
    """Forward convolution on validated arrays (see module docstring).

    ``x [N, Cin, *S]``, ``w [Cout, Cin/groups, *K]``, ``bias`` a float64 vector of length
    Cout or None; ``stride``/``padding``/``dilation`` tuples with one int per spatial axis.
    ``out`` (optional) a preallocated C-contiguous float64 array of the output shape.
    Returns the output.  Non-finite values are not rejected here; with
    ``report_finite=True`` it returns ``(out, finite, x_finite)`` where ``finite`` is
    True/False when the kernel checked every output as it stored it (the tiled paths),
    else None (the caller must scan), and ``x_finite`` True/False when a kernel checked
    every element of ``x`` as it copied it (the row kernel with fused padding; the
    stride-phase split when every phase is used), else None.
    """
    s, p, d, x5shape, w5shape, shape, out5shape = _nd_shapes(x.shape, w.shape, stride, padding,
                                                             dilation)
    # (writeable5: the kernels take writeable inputs, one compiled type)
    x5 = (x if x.flags.writeable else x.copy()).reshape(x5shape)
    w5 = (w if w.flags.writeable else w.copy()).reshape(w5shape)
    if out is None:
        out = np.empty(shape, dtype=np.float64)
    b = np.array(bias, dtype=np.float64) if bias is not None else np.zeros(1, dtype=np.float64)
    finite = x_finite = None
    if out.size:
        finite, x_finite = _launch_forward(x5, w5, b, bias is not None, int(groups), s, d,
                                           out.reshape(out5shape), p)
    return (out, finite, x_finite) if report_finite else out


def _nd_shapes(xshape, wshape, stride, padding, dilation):
    """``(s, p, d, x5shape, w5shape, out_shape, out5shape)`` of :func:`conv_nd`: the
    per-axis tuples padded to 3 axes, the rank-5 views' shapes and the output's shape
    (remembered per arguments when they are hashable: a training loop repeats them)."""
    try:
        return _nd_shapes_cached(xshape, wshape, stride, padding, dilation)
    except TypeError:          # a list among the per-axis arguments
        return _nd_shapes_uncached(xshape, wshape, stride, padding, dilation)


def _nd_shapes_uncached(xshape, wshape, stride, padding, dilation):
    r = len(xshape) - 2
    s = views.pad3(stride, 1)
    p = views.pad3(padding, 0)
    d = views.pad3(dilation, 1)
    x5shape = views._rank5_shape(xshape)
    w5shape = views._rank5_shape(wshape)
    S, K = x5shape[2:], w5shape[2:]
    O = tuple((S[a] + 2 * p[a] - d[a] * (K[a] - 1) - 1) // s[a] + 1 for a in range(3))
    shape = (xshape[0], wshape[0]) + O[3 - r:]
    return s, p, d, x5shape, w5shape, shape, views._rank5_shape(shape)


_nd_shapes_cached = functools.lru_cache(maxsize=256)(_nd_shapes_uncached)


def _phase_taps(K, s, d):
    """For one axis: per output phase r in [0, s), the taps k with (k*d) mod s == r in
    ascending order, the offset m of the first one ((k*d) div s) and the offset step
    between consecutive ones (d / gcd(d, s))."""
    step = d // math.gcd(d, s)
    out = []
    for r in range(s):
        ks = [k for k in range(K) if (k * d) % s == r]
        out.append((ks, (ks[0] * d) // s if ks else 0, step))
    return out


def conv_transpose_nd(x, w, bias, stride, padding, dilation, output_padding, groups, out=None,
                      report_finite=False):
    """Transposed convolution on validated arrays (see module docstring).

    ``x [N, Cin, *S]``, ``w [Cin, Cout/groups, *K]``; output size per axis
    ``(S-1)s - 2p + d(K-1) + output_padding + 1``;
    ``y[n, co, o] = bias[co] + sum_{ci in group(co), k, i: i*s + k*d = o + p} w[ci, co', k] x[n, ci, i]``.

    Computed by polyphase decomposition: the outputs ``o = start_r + s*j`` with
    ``(o + p) mod s = r`` (per axis) only receive the taps ``k`` with ``(k*d) mod s = r``,
    tap number ``t`` of the phase reading ``x[q0_r + j - m_t]`` (``m_t = (k_t d) div s``,
    ``q0_r = (start_r + p) div s``), so every phase is a stride-1 correlation of one shared
    zero-padded copy of ``x`` with the phase's taps in reverse order.  Phases with fewer
    taps than the longest are padded with leading zero weights (exact no-ops); phases that
    receive no tap get the bias alone.  All (phase, group) pairs run in ONE launch of
    :func:`conv_forward_tiled` (or, with fewer than 4 output channels per group, of
    :func:`conv_forward` on per-phase windows), which writes every phase straight into its
    strided output positions.  Each output sums its terms in the fixed order (ci', taps of
    its phase from the last to the first), one fused multiply-add per term; the thread
    count never matters.  ``report_finite``: as for :func:`conv_nd`.
    """
    r = x.ndim - 2
    s = views.pad3(stride, 1)
    p = views.pad3(padding, 0)
    d = views.pad3(dilation, 1)
    op = views.pad3(output_padding, 0)
    x5 = views.writeable5(x)
    w5 = views.writeable5(w)
    groups = int(groups)
    N, Cin = x5.shape[:2]
    Cog = w5.shape[1]
    Cout = Cog * groups
    Cig = Cin // groups
    S = x5.shape[2:]
    K = w5.shape[2:]
    O = tuple((S[a] - 1) * s[a] - 2 * p[a] + d[a] * (K[a] - 1) + op[a] + 1 for a in range(3))
    shape = (N, Cout) + O[3 - r:]
    if out is None:
        out = np.empty(shape, dtype=np.float64)
    if out.size == 0:
        return (out, None) if report_finite else out
    out5 = views.out5(out)
    has_bias = bias is not None
    b = np.asarray(bias, dtype=np.float64) if has_bias else np.zeros(1, dtype=np.float64)
    if Cog < 4 or not tiled_kernels_enabled():
        _conv_transpose_windows(x5, w5, b, has_bias, s, p, d, O, groups, out, out5)
        return (out, None) if report_finite else out
    lo, hi, widx, idle, geo, pair = _transpose_geometry(S, K, s, p, d, O, groups, Cig, Cog)
    for sl in idle:            # no tap reaches these outputs: bias only
        out5[(slice(None), slice(None)) + sl] = b.reshape(-1, 1, 1, 1) if has_bias else 0.0
    if widx is None:
        return (out, None) if report_finite else out
    xpad = _slack_empty((N, Cin) + hi)
    pad_input(x5, lo[0], lo[1], lo[2], xpad)
    fmas = out5.size * Cig * K[0] * K[1] * K[2] // (s[0] * s[1] * s[2])
    wext = np.append(w5.reshape(-1), 0.0)
    if transpose_path(pair is not None, K, s, d, Cig) == "pair":
        # stride 2 along W: whole output rows, both W phases interleaved in every vector
        ph_a, ph_b, row_h, row_o, row_x, wpair, wcv = pair
        offs, maxoff = geo[0], geo[1]
        finite = bool(conv_transpose_rows.sized(fmas)(
            xpad.reshape(-1), xpad.size // N, wext.take(wpair), wext.take(wcv), offs, maxoff,
            ph_a, ph_b, row_h,
            row_o, row_x, b if has_bias else np.zeros(Cout), has_bias, Cog, groups, O[2],
            max(1, min(len(row_h), 192 // O[2])), out5.reshape(N, Cout, -1)))
    else:
        wpk = wext.take(widx)                # one gather packs every phase
        finite = _launch_tiled(xpad, wpk, Cog, geo, b, has_bias, out5, fmas)
    # the idle phases' outputs (bias or 0) are finite: the kernel saw every other one
    return (out, finite) if report_finite else out


def _transpose_widx(active, taps, J, K, groups, Cig, Cog, CB):
    """Packed-weight gather index of a transposed convolution's phases:
    ``wpk[ph, g, blk, ci*Jt + jpos, j] = w.flat[widx[...]]`` (``w [Cin, Cog, *K]``, ``ph``
    over the active phases, CB channels per block); the sentinel ``w.size`` (a zero
    appended to ``w``) fills zero-weight positions and the padding channels of the last
    block.  Reversed position ``jpos`` of axis a holds tap number ``J-1-jpos`` of the
    phase (zero weight when that is past the phase's taps)."""
    nblk = -(-Cog // CB)
    KT = K[0] * K[1] * K[2]
    Jt = J[0] * J[1] * J[2]
    sentinel = groups * Cig * Cog * KT
    widx = np.empty((len(active), groups, nblk, Cig * Jt, CB), dtype=np.int64)
    cbase = ((np.arange(groups)[:, None, None] * Cig + np.arange(Cig)[None, :, None]) * Cog
             + np.arange(nblk * CB)[None, None, :]) * KT           # [g, ci, co'] (co' padded)
    for ph, rr in enumerate(active):
        kk = []
        for a in range(3):
            ks = taps[a][rr[a]][0]
            kk.append(np.array([ks[J[a] - 1 - jp] if J[a] - 1 - jp < len(ks) else -1
                                for jp in range(J[a])], dtype=np.int64))
        kflat = ((kk[0][:, None, None] * K[1] + kk[1][None, :, None]) * K[2]
                 + kk[2][None, None, :]).reshape(-1)
        zero = ((kk[0][:, None, None] < 0) | (kk[1][None, :, None] < 0)
                | (kk[2][None, None, :] < 0)).reshape(-1)
        ix = cbase[:, :, None, :] + kflat[None, None, :, None]       # [g, ci, jpos, co']
        ix[:, :, zero, :] = sentinel
        ix[:, :, :, Cog:] = sentinel
        widx[ph] = ix.reshape(groups, Cig * Jt, nblk, CB).transpose(0, 2, 1, 3)
    return widx


def _pair_rows(active, taps, J, K, s, p, start, count, O, hi, groups, Cig, Cog):
    """For :func:`conv_transpose_rows` (stride 2 along W, at least 6 output channels per
    group, both W phases of every D/H phase active): the D/H phases ``h`` with the
    active-phase indices of their even (``ph_a``) and odd (``ph_b``) output columns, every
    output row's phase, flat offset and input row base, and the lane-interleaved weight
    gather index.  None when the kernel does not apply."""
    if s[2] != 2 or Cog < _ROW_CB:
        return None
    index = {rr: i for i, rr in enumerate(active)}
    r0 = p[2] % 2                       # output column 0 (and every even one) is this phase
    hd = sorted({(rr[0], rr[1]) for rr in active})
    if any((a, b, w) not in index for a, b in hd for w in (0, 1)):
        return None
    ph_a = np.array([index[(a, b, r0)] for a, b in hd], dtype=np.int64)
    ph_b = np.array([index[(a, b, 1 - r0)] for a, b in hd], dtype=np.int64)
    row_h, row_o, row_x = [], [], []
    for h, (rd, rh) in enumerate(hd):
        for jd in range(count[0][rd]):
            od = start[0][rd] + s[0] * jd
            for jh in range(count[1][rh]):
                oh = start[1][rh] + s[1] * jh
                row_h.append(h)
                row_o.append((od * O[1] + oh) * O[2])
                row_x.append((jd * hi[1] + jh) * hi[2])
    w6 = _transpose_widx(active, taps, J, K, groups, Cig, Cog, _ROW_CB)
    wpair = np.stack([w6[ph_a], w6[ph_b]], axis=-2)          # [h, g, blk, K, 2, CB]
    wc = _transpose_widx(active, taps, J, K, groups, Cig, Cog, -(-Cog // _VW) * _VW)
    wcv = np.stack([wc[ph_a], wc[ph_b]], axis=1)             # [h, 2, g, 1, K, WS]
    return _frozen(ph_a, ph_b, np.array(row_h), np.array(row_o), np.array(row_x),
                   wpair.reshape(-1), wcv.reshape(-1))


@functools.lru_cache(maxsize=128)
def _transpose_geometry(S, K, s, p, d, O, groups, Cig, Cog):
    """Everything about a transposed convolution that depends on shapes only (cached):
    the low padding and padded extent of the shared input copy, the gather index that
    packs the weights of every active phase (taps reversed) in one ``take``, the output
    slices of phases that receive no tap, and the :func:`_launch_tiled` geometry (term
    groups ordered (phase, group))."""
    # per axis and phase r: (taps k, first offset m, offset step), first output, count, q0
    taps = [_phase_taps(K[a], s[a], d[a]) for a in range(3)]
    J = tuple(max(len(t[0]) for t in taps[a]) for a in range(3))
    start = [[(rr - p[a]) % s[a] for rr in range(s[a])] for a in range(3)]
    count = [[len(range(start[a][rr], O[a], s[a])) for rr in range(s[a])] for a in range(3)]
    q0 = [[(start[a][rr] + p[a]) // s[a] for rr in range(s[a])] for a in range(3)]
    active, idle = [], []
    for rd in range(s[0]):
        for rh in range(s[1]):
            for rw in range(s[2]):
                rr = (rd, rh, rw)
                if any(count[a][rr[a]] == 0 for a in range(3)):
                    continue
                if all(taps[a][rr[a]][0] for a in range(3)):
                    active.append(rr)
                else:
                    idle.append(tuple(slice(start[a][rr[a]], None, s[a]) for a in range(3)))
    if not active:
        return (0, 0, 0), (0, 0, 0), None, idle, None, None
    # the m offset of every reversed tap position, per axis and phase (zero-weight
    # positions reuse the first tap's offset: any in-range address will do)
    mpos = [[None] * s[a] for a in range(3)]
    for a in range(3):
        for rr in range(s[a]):
            ks, m0, dm = taps[a][rr]
            n = len(ks)
            mpos[a][rr] = [m0 + (J[a] - 1 - jp) * dm if jp >= J[a] - n else m0
                           for jp in range(J[a])]
    # one shared zero-padded x: every read q0 + j - m (j < count) must land inside it
    lo = tuple(max(0, max(m - q0[a][rr[a]] for rr in active for m in mpos[a][rr[a]]))
               for a in range(3))
    hi = tuple(max(S[a] + lo[a], max(lo[a] + q0[a][rr[a]] - min(mpos[a][rr[a]]) + count[a][rr[a]]
                                     for rr in active)) for a in range(3))
    Dp, Hp, Wp = hi
    plane = Dp * Hp * Wp
    Jt = J[0] * J[1] * J[2]
    offs = np.empty((len(active), groups, Cig, Jt), dtype=np.int64)
    chan = np.arange(groups * Cig, dtype=np.int64).reshape(groups, Cig, 1) * plane
    widx = _transpose_widx(active, taps, J, K, groups, Cig, Cog, _tile_cb(Cog))
    dsts = []
    for ph, rr in enumerate(active):
        bo = [lo[a] + q0[a][rr[a]] - np.asarray(mpos[a][rr[a]], dtype=np.int64) for a in range(3)]
        toff = (bo[0][:, None, None] * (Hp * Wp) + bo[1][None, :, None] * Wp
                + bo[2][None, None, :]).reshape(-1)
        offs[ph] = chan + toff[None, None, :]
        cnt = tuple(count[a][rr[a]] for a in range(3))
        st = tuple(start[a][rr[a]] for a in range(3))
        dsts.append(_wide_dst(cnt, st, s, hi, O))
    total = max(len(t) for t in dsts)
    dst = np.full((len(active), total), -1, dtype=np.int64)
    for ph, t in enumerate(dsts):
        dst[ph, :len(t)] = t
    G = len(active) * groups
    ochan = np.tile(np.arange(groups, dtype=np.int64) * Cog, len(active))
    geo = _geometry(offs.reshape(G, Cig * Jt), ochan, np.repeat(dst, groups, axis=0))
    pair = _pair_rows(active, taps, J, K, s, p, start, count, O, hi, groups, Cig, Cog)
    return lo, hi, _frozen(widx.reshape(-1))[0], idle, geo, pair


def _conv_transpose_windows(x5, w5, b, has_bias, s, p, d, O, groups, out, out5):
    """:func:`conv_transpose_nd` for fewer than 4 output channels per group: every phase
    is one group of a grouped stride-1 :func:`conv_forward` over its own zero-extended
    window of ``x`` (numpy copies build the windows and scatter the phases into ``out``);
    the same terms in the same order as the tiled path."""
    N, Cin = x5.shape[:2]
    Cog = w5.shape[1]
    Cout = Cog * groups
    Cig = Cin // groups
    S = x5.shape[2:]
    K = w5.shape[2:]
    taps = [_phase_taps(K[a], s[a], d[a]) for a in range(3)]
    J = [max(len(t[0]) for t in taps[a]) for a in range(3)]          # taps per phase (padded)
    dm = [taps[a][0][2] for a in range(3)]
    start = [[(rr - p[a]) % s[a] for rr in range(s[a])] for a in range(3)]   # first o of phase
    count = [[len(range(start[a][rr], O[a], s[a])) for rr in range(s[a])] for a in range(3)]
    C = [max(count[a]) for a in range(3)]
    L = [C[a] + (J[a] - 1) * dm[a] for a in range(3)]
    nph = s[0] * s[1] * s[2]
    # input channels ph*Cin + ci hold the phase's window of x, weights ph*Cout + co its taps
    xw = np.zeros((N, nph * Cin) + tuple(L), dtype=np.float64)
    wall = np.zeros((nph * Cout, Cig) + tuple(J), dtype=np.float64)
    wg = w5.reshape((groups, Cig, Cog) + K).transpose(0, 2, 1, 3, 4, 5).reshape((Cout, Cig) + K)
    phases = []
    for rd in range(s[0]):
        for rh in range(s[1]):
            for rw in range(s[2]):
                ph = len(phases)
                rr = (rd, rh, rw)
                phases.append(rr)
                tp = [taps[a][rr[a]] for a in range(3)]
                if any(len(t[0]) == 0 for t in tp):
                    continue          # no tap reaches this phase: zero weights, bias only
                kk = [np.asarray(tp[a][0], dtype=np.int64) for a in range(3)]
                jj = [J[a] - 1 - np.arange(len(tp[a][0])) for a in range(3)]
                wall[ph * Cout:(ph + 1) * Cout][np.ix_(np.arange(Cout), np.arange(Cig), jj[0], jj[1], jj[2])] = \
                    wg[np.ix_(np.arange(Cout), np.arange(Cig), kk[0], kk[1], kk[2])]
                # window of x: xw[t] = x[t + so], so = q0 - m_first - (J-1)*dm
                so = [(start[a][rr[a]] + p[a]) // s[a] - tp[a][1] - (J[a] - 1) * dm[a] for a in range(3)]
                lo = [max(0, -so[a]) for a in range(3)]
                hi = [min(L[a], S[a] - so[a]) for a in range(3)]
                if all(hi[a] > lo[a] for a in range(3)):
                    xw[:, ph * Cin:(ph + 1) * Cin, lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]] = \
                        x5[:, :, lo[0] + so[0]:hi[0] + so[0], lo[1] + so[1]:hi[1] + so[1],
                           lo[2] + so[2]:hi[2] + so[2]]
    bb = np.tile(b, nph) if has_bias else b
    part = np.empty((N, nph * Cout) + tuple(C), dtype=np.float64)
    conv_forward.sized(part.size * wall[0].size)(
        xw, wall, bb, has_bias, nph * groups, 1, 1, 1, dm[0], dm[1], dm[2], part)
    for ph, rr in enumerate(phases):
        cnt = [count[a][rr[a]] for a in range(3)]
        if min(cnt) == 0:
            continue
        out5[:, :, start[0][rr[0]]::s[0], start[1][rr[1]]::s[1], start[2][rr[2]]::s[2]] = \
            part[:, ph * Cout:(ph + 1) * Cout, :cnt[0], :cnt[1], :cnt[2]]
    return out


def conv_weight_grad_nd(x, gy, kernel_shape, stride, padding, dilation, groups, out=None):
    """Gradient of ``conv_nd(x, w, ...)`` with respect to ``w`` given the output cotangent
    ``gy`` (validated arrays); ``kernel_shape`` the spatial shape of ``w``.  Returns
    ``[Cout, Cin/groups, *K]``."""
    r = x.ndim - 2
    s = views.pad3(stride, 1)
    p = views.pad3(padding, 0)
    d = views.pad3(dilation, 1)
    x5 = views.writeable5(x)
    N, Cin = x5.shape[:2]
    S = x5.shape[2:]
    K = views.pad3(kernel_shape, 1)
    Cout = gy.shape[1]
    shape = (Cout, Cin // int(groups)) + K[3 - r:]
    if out is None:
        out = np.empty(shape, dtype=np.float64)
    if any(p):
        xp = np.empty((N, Cin) + tuple(S[a] + 2 * p[a] for a in range(3)), dtype=np.float64)
        if xp.size:
            pad_input(x5, p[0], p[1], p[2], xp)
    else:
        xp = x5
    if out.size:
        conv_weight_grad(xp, views.writeable5(gy), int(groups), s[0], s[1], s[2], d[0], d[1], d[2],
                         out.reshape((Cout, Cin // int(groups)) + K))
    return out
