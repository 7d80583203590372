"""Convolution kernels: direct summation on 3 spatial axes (1-D and 2-D inputs are viewed
with unit leading spatial axes), grouped, strided, dilated; and its adjoint (transposed
convolution) and the weight gradient.

Layout: ``x [N, Cin, D, H, W]``, forward weights ``[Cout, Cin/groups, KD, KH, KW]``,
transposed weights ``[Cin, Cout/groups, KD, KH, KW]``; every array C-contiguous float64.

Kernel-level entry points (plain Python, no validation; the arrays must already be
C-contiguous float64 of rank 3-5 with consistent shapes, the tuples one int per spatial
axis; they are meant for the facades in ``hmath_dl.layers.convolution`` and for the
autodiff rules):

* :func:`conv_nd` - forward cross-correlation,
* :func:`conv_transpose_nd` - transposed convolution (= gradient of :func:`conv_nd` with
  respect to its input: ``conv_transpose_nd(gy, w, None, s, p, d, op, g)`` with
  ``op = S - ((O-1)s - 2p + d(K-1) + 1)`` per axis gives ``dL/dx`` of shape ``x.shape``),
* :func:`conv_weight_grad_nd` - gradient of :func:`conv_nd` with respect to its weights
  (a plain scalar kernel, parallel over (co, ci'); correct but not tuned).

Every kernel shares one specification -- ``out = bias + (fused multiply-add chain over
the terms (ci', kd, kh, kw) in that order, from 0.0)`` -- and therefore the bits; tests
hold each path to the generic kernel's bytes.  With AVX-512 (:func:`tiled_kernels_enabled`)
and at least 4 output channels per group, register-tiled micro-kernels written directly
in LLVM IR do the work (:func:`_emit_chain`: up to 24 512-bit accumulators, vector loads
of x, broadcast weights; about 80 GFLOP/s per core here, near the FMA throughput):

* :func:`conv_forward_rows` (forward, >= 6 output channels per group, output rows of
  whole vectors or >= 16 wide): 6 channels x up to 32 positions of one output row,
  stored straight into the output; every iteration copies the input window it reads
  (padding and stride phases applied as it copies, NaN/inf noted); row remainders of
  fewer than 8 positions through the channel-vector kernel (:func:`_make_micro_cv`: one
  position, all channels);
* :func:`conv_transpose_rows` (transposed, stride 2 along W): both W phases of an output
  row in one micro-kernel, interleaved on store; remainders through the channel-vector
  kernel;
* :func:`conv_forward_tiled` (short ragged rows; the other transposed convolutions):
  8 channels x 24 positions (or 4 x 48) in the "wide" layout of a padded (or
  stride-phase split, :func:`pad_split`) input, scattered on store;
* :func:`.conv_gemm.conv_gemm` (deep kernels on small output planes; with AVX-512 also
  unpadded 1x1 kernels, strided or on planes of <= 1024 positions): the float GEMM of :mod:`.gemm_f64` on the unfolded input, its tasks spanning
  the batch, each unfolding its own panel;
* :func:`conv_forward` (fewer than 4 output channels per group, depthwise, no AVX-512):
  4-channel blocks with an explicit 8-lane vector FMA (:func:`_vfma`) over accumulator
  rows in memory.

Read-only inputs are copied once (one compiled specialisation per kernel).  The
arithmetic uses explicit fused multiply-adds (``llvm.fma``): one rounding per term, the
same bits on every thread and in vector and scalar code.

Determinism: every ``prange`` iteration owns a disjoint block of outputs and sums its
terms in the fixed order above, so the bits never depend on the thread count.  No BLAS
is used.
"""

import contextlib
import functools
import math

import numpy as np
import numba
from numba import prange

from . import _cpu, conv_batch, conv_gemm, views
from ._jit import helper, kernel, span_kernel
from ._plan import forcing

#: A convolution's work is its multiply-add count, about 16 of them per element of a
#: memory-bound kernel's work: the serial threshold of the convolution kernels is
#: ``SERIAL_WORK * 16`` multiply-adds (~0.2 ms on one core; padding/splitting copies
#: count elements).
_FMA_PER_ELEMENT = 16

_CB = 4      # output channels computed together (one x load feeds _CB accumulators)
_SEG = 1024   # output positions per accumulator segment (_CB x _SEG accumulators: 32 KiB)


from ._simd import (  # noqa: E402  (the generator and the tile shapes)
    _fma,
    _WIDE512,
    _VW,
    _ROW_MAXV,
    _PAIR_MAXV,
    _WIDE_CB8,
    _WIDE_V8,
    _WIDE_V4,
    _vfma,
    _make_micro_pair,
    _make_micro,
    _make_micro_store,
    _make_micro_cv,
)


@helper
def _chunk4(acc, ln, xr, xb, toff, t0, T, w0, w1, w2, w3):
    """For four channels j (weight rows ``w_j``) and the ``T`` (1..9) taps ``t0 .. t0+T-1``
    at x offsets ``toff``: ``acc[j, i] = fma(w_j[t0+T-1], xr[xb + toff[t0+T-1] + i], ...
    fma(w_j[t0], xr[xb + toff[t0] + i], acc[j, i]))`` for ``i < ln``.

    8 lanes at a time through :func:`_vfma` (all 4*T weights held in registers, each
    accumulator loaded and stored once per chunk), then a scalar tail computing the same
    expression.  One branch per T because the tuples need a static length (the branches
    are generated text, kept as plain source so that numba can cache them)."""
    rs = (acc[0], acc[1], acc[2], acc[3])
    nv = ln - ln % _VW
    if T == 1:
        ys1 = (xr[xb + toff[t0]:],)
        ws1 = (w0[t0],
               w1[t0],
               w2[t0],
               w3[t0],)
        for i in range(0, nv, _VW):
            _vfma(rs, ys1, i, ws1)
    elif T == 2:
        ys2 = (xr[xb + toff[t0]:], xr[xb + toff[t0 + 1]:],)
        ws2 = (w0[t0], w0[t0 + 1],
               w1[t0], w1[t0 + 1],
               w2[t0], w2[t0 + 1],
               w3[t0], w3[t0 + 1],)
        for i in range(0, nv, _VW):
            _vfma(rs, ys2, i, ws2)
    elif T == 3:
        ys3 = (xr[xb + toff[t0]:], xr[xb + toff[t0 + 1]:], xr[xb + toff[t0 + 2]:],)
        ws3 = (w0[t0], w0[t0 + 1], w0[t0 + 2],
               w1[t0], w1[t0 + 1], w1[t0 + 2],
               w2[t0], w2[t0 + 1], w2[t0 + 2],
               w3[t0], w3[t0 + 1], w3[t0 + 2],)
        for i in range(0, nv, _VW):
            _vfma(rs, ys3, i, ws3)
    elif T == 4:
        ys4 = (xr[xb + toff[t0]:], xr[xb + toff[t0 + 1]:], xr[xb + toff[t0 + 2]:],
               xr[xb + toff[t0 + 3]:],)
        ws4 = (w0[t0], w0[t0 + 1], w0[t0 + 2], w0[t0 + 3],
               w1[t0], w1[t0 + 1], w1[t0 + 2], w1[t0 + 3],
               w2[t0], w2[t0 + 1], w2[t0 + 2], w2[t0 + 3],
               w3[t0], w3[t0 + 1], w3[t0 + 2], w3[t0 + 3],)
        for i in range(0, nv, _VW):
            _vfma(rs, ys4, i, ws4)
    elif T == 5:
        ys5 = (xr[xb + toff[t0]:], xr[xb + toff[t0 + 1]:], xr[xb + toff[t0 + 2]:],
               xr[xb + toff[t0 + 3]:], xr[xb + toff[t0 + 4]:],)
        ws5 = (w0[t0], w0[t0 + 1], w0[t0 + 2], w0[t0 + 3], w0[t0 + 4],
               w1[t0], w1[t0 + 1], w1[t0 + 2], w1[t0 + 3], w1[t0 + 4],
               w2[t0], w2[t0 + 1], w2[t0 + 2], w2[t0 + 3], w2[t0 + 4],
               w3[t0], w3[t0 + 1], w3[t0 + 2], w3[t0 + 3], w3[t0 + 4],)
        for i in range(0, nv, _VW):
            _vfma(rs, ys5, i, ws5)
    elif T == 6:
        ys6 = (xr[xb + toff[t0]:], xr[xb + toff[t0 + 1]:], xr[xb + toff[t0 + 2]:],
               xr[xb + toff[t0 + 3]:], xr[xb + toff[t0 + 4]:], xr[xb + toff[t0 + 5]:],)
        ws6 = (w0[t0], w0[t0 + 1], w0[t0 + 2], w0[t0 + 3], w0[t0 + 4], w0[t0 + 5],
               w1[t0], w1[t0 + 1], w1[t0 + 2], w1[t0 + 3], w1[t0 + 4], w1[t0 + 5],
               w2[t0], w2[t0 + 1], w2[t0 + 2], w2[t0 + 3], w2[t0 + 4], w2[t0 + 5],
               w3[t0], w3[t0 + 1], w3[t0 + 2], w3[t0 + 3], w3[t0 + 4], w3[t0 + 5],)
        for i in range(0, nv, _VW):
            _vfma(rs, ys6, i, ws6)
    elif T == 7:
        ys7 = (xr[xb + toff[t0]:], xr[xb + toff[t0 + 1]:], xr[xb + toff[t0 + 2]:],
               xr[xb + toff[t0 + 3]:], xr[xb + toff[t0 + 4]:], xr[xb + toff[t0 + 5]:],
               xr[xb + toff[t0 + 6]:],)
        ws7 = (w0[t0], w0[t0 + 1], w0[t0 + 2], w0[t0 + 3], w0[t0 + 4], w0[t0 + 5], w0[t0 + 6],
               w1[t0], w1[t0 + 1], w1[t0 + 2], w1[t0 + 3], w1[t0 + 4], w1[t0 + 5], w1[t0 + 6],
               w2[t0], w2[t0 + 1], w2[t0 + 2], w2[t0 + 3], w2[t0 + 4], w2[t0 + 5], w2[t0 + 6],
               w3[t0], w3[t0 + 1], w3[t0 + 2], w3[t0 + 3], w3[t0 + 4], w3[t0 + 5], w3[t0 + 6],)
        for i in range(0, nv, _VW):
            _vfma(rs, ys7, i, ws7)
    elif T == 8:
        ys8 = (xr[xb + toff[t0]:], xr[xb + toff[t0 + 1]:], xr[xb + toff[t0 + 2]:],
               xr[xb + toff[t0 + 3]:], xr[xb + toff[t0 + 4]:], xr[xb + toff[t0 + 5]:],
               xr[xb + toff[t0 + 6]:], xr[xb + toff[t0 + 7]:],)
        ws8 = (w0[t0], w0[t0 + 1], w0[t0 + 2], w0[t0 + 3], w0[t0 + 4], w0[t0 + 5], w0[t0 + 6], w0[t0 + 7],
               w1[t0], w1[t0 + 1], w1[t0 + 2], w1[t0 + 3], w1[t0 + 4], w1[t0 + 5], w1[t0 + 6], w1[t0 + 7],
               w2[t0], w2[t0 + 1], w2[t0 + 2], w2[t0 + 3], w2[t0 + 4], w2[t0 + 5], w2[t0 + 6], w2[t0 + 7],
               w3[t0], w3[t0 + 1], w3[t0 + 2], w3[t0 + 3], w3[t0 + 4], w3[t0 + 5], w3[t0 + 6], w3[t0 + 7],)
        for i in range(0, nv, _VW):
            _vfma(rs, ys8, i, ws8)
    elif T == 9:
        ys9 = (xr[xb + toff[t0]:], xr[xb + toff[t0 + 1]:], xr[xb + toff[t0 + 2]:],
               xr[xb + toff[t0 + 3]:], xr[xb + toff[t0 + 4]:], xr[xb + toff[t0 + 5]:],
               xr[xb + toff[t0 + 6]:], xr[xb + toff[t0 + 7]:], xr[xb + toff[t0 + 8]:],)
        ws9 = (w0[t0], w0[t0 + 1], w0[t0 + 2], w0[t0 + 3], w0[t0 + 4], w0[t0 + 5], w0[t0 + 6], w0[t0 + 7], w0[t0 + 8],
               w1[t0], w1[t0 + 1], w1[t0 + 2], w1[t0 + 3], w1[t0 + 4], w1[t0 + 5], w1[t0 + 6], w1[t0 + 7], w1[t0 + 8],
               w2[t0], w2[t0 + 1], w2[t0 + 2], w2[t0 + 3], w2[t0 + 4], w2[t0 + 5], w2[t0 + 6], w2[t0 + 7], w2[t0 + 8],
               w3[t0], w3[t0 + 1], w3[t0 + 2], w3[t0 + 3], w3[t0 + 4], w3[t0 + 5], w3[t0 + 6], w3[t0 + 7], w3[t0 + 8],)
        for i in range(0, nv, _VW):
            _vfma(rs, ys9, i, ws9)
    ws_rows = (w0, w1, w2, w3)
    for i in range(nv, ln):
        for j in range(4):
            wr = ws_rows[j]
            a = acc[j, i]
            for t in range(t0, t0 + T):
                a = _fma(wr[t], xr[xb + toff[t] + i], a)
            acc[j, i] = a


@helper
def _taps_1(acc, j, ln, xr, xb, sw, dw, wv, taps):
    """acc[j, i] += sum_t wv[t] * xr[xb + t*dw + i*sw] for one channel."""
    r = acc[j]
    y0 = xr[xb:]
    if sw == 1:
        if taps == 3:
            a, b, c = wv[0], wv[1], wv[2]
            y1 = xr[xb + dw:]
            y2 = xr[xb + 2 * dw:]
            for i in range(ln):
                r[i] = _fma(c, y2[i], _fma(b, y1[i], _fma(a, y0[i], r[i])))
        elif taps == 2:
            a, b = wv[0], wv[1]
            y1 = xr[xb + dw:]
            for i in range(ln):
                r[i] = _fma(b, y1[i], _fma(a, y0[i], r[i]))
        else:
            a = wv[0]
            for i in range(ln):
                r[i] = _fma(a, y0[i], r[i])
    else:
        z0 = y0[::sw]
        if taps == 3:
            a, b, c = wv[0], wv[1], wv[2]
            z1 = xr[xb + dw::sw]
            z2 = xr[xb + 2 * dw::sw]
            for i in range(ln):
                r[i] = _fma(c, z2[i], _fma(b, z1[i], _fma(a, z0[i], r[i])))
        elif taps == 2:
            a, b = wv[0], wv[1]
            z1 = xr[xb + dw::sw]
            for i in range(ln):
                r[i] = _fma(b, z1[i], _fma(a, z0[i], r[i]))
        else:
            a = wv[0]
            for i in range(ln):
                r[i] = _fma(a, z0[i], r[i])


_micro_cv8 = _make_micro_cv(8)      # 64 channels
_micro_cv4 = _make_micro_cv(4)
_micro_cv2 = _make_micro_cv(2)
_micro_cv1 = _make_micro_cv(1)


@helper
def _cv_chain(xf, xbase, offs, wcv, wbase, WS, K, nc, acc):
    """``acc[c]`` for the first ``nc`` channels (``nc <= WS``, WS a multiple of 8) of one
    output position through :func:`_make_micro_cv`, 64, 32, 16 or 8 channels at a time."""
    c = 0
    while c < nc:
        left = (nc - c + _VW - 1) // _VW
        a = acc[c:]
        if left >= 8:
            _micro_cv8(xf, xbase, offs, wcv, wbase + c, WS, K, a)
            c += 8 * _VW
        elif left >= 4:
            _micro_cv4(xf, xbase, offs, wcv, wbase + c, WS, K, a)
            c += 4 * _VW
        elif left >= 2:
            _micro_cv2(xf, xbase, offs, wcv, wbase + c, WS, K, a)
            c += 2 * _VW
        else:
            _micro_cv1(xf, xbase, offs, wcv, wbase + c, WS, K, a)
            c += _VW


_micro_wide8 = _make_micro(8, _WIDE_V8)   # 8 output channels x 24 positions (AVX-512)
_micro_wide4 = _make_micro(4, _WIDE_V4)   # 4 output channels x 48 (AVX-512) / 12 (AVX2)
_WIDE_VL8 = _WIDE_V8 * _VW                # positions per wide tile, 8 channels
_WIDE_VL4 = _WIDE_V4 * _VW                # positions per wide tile, 4 channels
_TILES_PER_ITER = 8                # tiles per prange iteration


_micro_6x4_store = _make_micro_store(6, 4)   # 6 output channels x 32 positions of one row
_micro_6x3_store = _make_micro_store(6, 3)
_micro_6x2_store = _make_micro_store(6, 2)
_micro_6x1_store = _make_micro_store(6, 1)
_micro_4x4_store = _make_micro_store(4, 4, 6)   # a group's last block of <= 4 channels
_micro_4x3_store = _make_micro_store(4, 3, 6)
_micro_4x2_store = _make_micro_store(4, 2, 6)
_micro_4x1_store = _make_micro_store(4, 1, 6)
_ROW_CB = 6
_ROW_SLACK = 4 * _VW                         # zeros after a row window (vector over-reads)


_EXP_BITS = np.uint64(0x7FF0000000000000)   # exponent field: all ones only for NaN/inf


@helper
def _fill_window(xb, shape, n, c0, Cg, od, oh0, nr, pads, strides, ud, uh, uw, KDe, R, Wr, bb):
    """Copy the input window that one run of output rows reads into the buffer ``bb``
    (bit patterns, uint64 views).  The window holds, for the ``Cg`` channels from ``c0``
    and every used stride phase ``f`` = (a*len(uh) + b)*len(uw) + e (residues ``ud[a]``,
    ``uh[b]``, ``uw[e]``; ``P`` phases), ``KDe`` depth slices from ``od`` and ``nr`` rows
    from ``oh0`` of that phase of the zero-padded input:

    ``bb[(((c*P + f)*KDe + dz)*R + r)*Wr + q] = xpad[n, c0 + c, (od+dz)*sd + ud[a],
    (oh0+r)*sh + uh[b], q*sw + uw[e]]`` for ``q < Wr``

    (``xb`` flat input of ``shape`` (N, Cin, D, H, W), ``xpad`` it with ``pads`` zeros on
    both sides, zero past its extent); stride 1 with residues 0 is the plain padded
    window.  The last ``_ROW_SLACK`` elements are zeroed; rows ``nr .. R-1`` are left
    untouched (never read).  Returns True iff every copied input element is finite (the
    largest masked exponent field; an integer reduction, so it vectorises)."""
    Cin, D, H, W = shape[1], shape[2], shape[3], shape[4]
    pd, ph, pw = pads[0], pads[1], pads[2]
    sd, sh, sw = strides[0], strides[1], strides[2]
    nh, nw = uh.shape[0], uw.shape[0]
    P = ud.shape[0] * nh * nw
    m = np.uint64(0)
    for c in range(Cg):
        for f in range(P):
            rd = ud[f // (nh * nw)]
            rh = uh[(f // nw) % nh]
            rw = uw[f % nw]
            # q*sw + rw - pw inside [0, W) exactly for q0 <= q < q1
            q0 = min(Wr, max(0, (pw - rw + sw - 1) // sw))
            q1 = max(q0, min(Wr, (W + pw - rw + sw - 1) // sw))
            base = rw - pw
            for dz in range(KDe):
                di = (od + dz) * sd + rd - pd
                for r in range(nr):
                    hi = (oh0 + r) * sh + rh - ph
                    dst = (((c * P + f) * KDe + dz) * R + r) * Wr
                    if 0 <= di < D and 0 <= hi < H:
                        for q in range(q0):
                            bb[dst + q] = 0
                        # unsigned indices: no negative-index wrap-around in the hot loop
                        # (2.7x faster); both are >= 0 here
                        us = np.uint64((((n * Cin + c0 + c) * D + di) * H + hi) * W + base
                                       + q0 * sw)
                        ut = np.uint64(dst + q0)
                        if sw == 1:
                            for q in range(np.uint64(q1 - q0)):
                                v = xb[us + q]
                                bb[ut + q] = v
                                m = max(m, v & _EXP_BITS)
                        else:
                            usw = np.uint64(sw)
                            for q in range(np.uint64(q1 - q0)):
                                v = xb[us + q * usw]
                                bb[ut + q] = v
                                m = max(m, v & _EXP_BITS)
                        for q in range(q1, Wr):
                            bb[dst + q] = 0
                    else:
                        for q in range(Wr):
                            bb[dst + q] = 0
    for j in range(bb.shape[0] - _ROW_SLACK, bb.shape[0]):
        bb[j] = 0
    return m != _EXP_BITS


@span_kernel(scale=_FMA_PER_ELEMENT)
def _rows_span(x, pads, strides, ud, uh, uw, R, KDe, Wr, loffs, wpk, wcv, offs, maxoff, bias,
               has_bias, Cog, rows_per_it, out, finite, xin, t0, t1):
    """Iterations ``t0 .. t1-1`` of :func:`conv_forward_rows` (its arguments, then the
    per-iteration verdict arrays ``finite``/``xin``, written at ``t``, then the span):
    the whole computation, serial (a :class:`~._jit.SpanKernel`: the parallel path runs
    the iterations under ``prange``, one call each)."""
    Cin = x.shape[1]
    Dp, Hp, Wp = x.shape[2], x.shape[3], x.shape[4]
    Cout, OD, OH, OW = out.shape[1], out.shape[2], out.shape[3], out.shape[4]
    G, K = offs.shape
    Cg = Cin // G
    CB = _ROW_CB
    nblk = (Cog + CB - 1) // CB
    WS = wcv.shape[0] // (G * K) if G * K > 0 else 0
    fused = R > 0
    xf = x.reshape(-1)
    of = out.reshape(-1)
    xstride = Cin * Dp * Hp * Wp
    oplane = OD * OH * OW
    nih = (OH + rows_per_it - 1) // rows_per_it
    lmax = 0
    for kk in range(loffs.shape[0]):
        lmax = max(lmax, loffs[kk])
    P = ud.shape[0] * uh.shape[0] * uw.shape[0]
    bufsize = Cg * P * KDe * R * Wr + _ROW_SLACK if fused else 0
    xbits = xf.view(np.uint64)
    for t in range(t0, t1):
        ih = t % nih
        r = t // nih
        od = r % OD
        r = r // OD
        g = r % G
        n = r // G
        oh0 = ih * rows_per_it
        oh1 = min(OH, oh0 + rows_per_it)
        buf = np.empty(bufsize)
        if fused:
            xin[t] = _fill_window(xbits, x.shape, n, g * Cg, Cg, od, oh0,
                                  oh1 - oh0 + R - rows_per_it, pads, strides, ud, uh, uw,
                                  KDe, R, Wr, buf.view(np.uint64))
            src = buf
            og = loffs
            mo = lmax
        else:
            src = xf
            og = offs[g]
            mo = maxoff[g]
        ok = True
        acc = np.empty(max(CB * _VW, WS))
        # block by block, then row by row: one block's packed weights stay cached while
        # the run's rows stream past them (deep channels: all blocks' weights would not
        # fit in L2)
        for b in range(nblk):
            wbase = ((g * nblk + b) * K) * CB
            nb = min(CB, Cog - b * CB)
            co0 = g * Cog + b * CB
            for oh in range(oh0, oh1):
                if fused:
                    xrow = (oh - oh0) * Wr
                else:
                    xrow = n * xstride + (od * Hp + oh) * Wp
                orow = od * OH * OW + oh * OW
                c = 0
                while c < OW:
                    cw = min(_ROW_MAXV * _VW, OW - c)
                    V = cw // _VW
                    if V == 0:
                        cw = OW - c
                    xbase = xrow + c
                    if V == 0 and WS > 0:
                        # fewer than 8 positions left: one at a time, all channels of the
                        # group (with the first block)
                        if b == 0:
                            obase = (n * Cout + g * Cog) * oplane + orow + c
                            for i in range(cw):
                                _cv_chain(src, xbase + i, og, wcv, g * K * WS, WS, K, Cog, acc)
                                for j in range(Cog):
                                    v = acc[j] + bias[g * Cog + j] if has_bias else acc[j]
                                    of[obase + j * oplane + i] = v
                                    ok &= np.isfinite(v)
                        c += cw
                        continue
                    safe = xbase + mo + max(V, 1) * _VW <= src.shape[0]
                    obase = (n * Cout + co0) * oplane + orow + c
                    if safe and V > 0 and nb <= 4:
                        if V == 4:
                            ok &= _micro_4x4_store(src, xbase, og, wpk, wbase, K, of, obase,
                                                   oplane, nb, bias, co0, has_bias)
                        elif V == 3:
                            ok &= _micro_4x3_store(src, xbase, og, wpk, wbase, K, of, obase,
                                                   oplane, nb, bias, co0, has_bias)
                        elif V == 2:
                            ok &= _micro_4x2_store(src, xbase, og, wpk, wbase, K, of, obase,
                                                   oplane, nb, bias, co0, has_bias)
                        else:
                            ok &= _micro_4x1_store(src, xbase, og, wpk, wbase, K, of, obase,
                                                   oplane, nb, bias, co0, has_bias)
                    elif safe and V == 4:
                        ok &= _micro_6x4_store(src, xbase, og, wpk, wbase, K, of, obase, oplane,
                                               nb, bias, co0, has_bias)
                    elif safe and V == 3:
                        ok &= _micro_6x3_store(src, xbase, og, wpk, wbase, K, of, obase, oplane,
                                               nb, bias, co0, has_bias)
                    elif safe and V == 2:
                        ok &= _micro_6x2_store(src, xbase, og, wpk, wbase, K, of, obase, oplane,
                                               nb, bias, co0, has_bias)
                    elif safe and V == 1:
                        ok &= _micro_6x1_store(src, xbase, og, wpk, wbase, K, of, obase, oplane,
                                               nb, bias, co0, has_bias)
                    else:
                        # vector loads would run past the input: the scalar chain
                        ln = cw if V == 0 else V * _VW
                        for j in range(nb):
                            for i in range(ln):
                                a = 0.0
                                for kk in range(K):
                                    a = _fma(wpk[wbase + kk * CB + j], src[xbase + og[kk] + i], a)
                                v = a + bias[co0 + j] if has_bias else a
                                of[obase + j * oplane + i] = v
                                ok &= np.isfinite(v)
                    c += cw if V == 0 else V * _VW
        finite[t] = ok





def conv_forward_rows(fmas, x, pads, strides, ud, uh, uw, R, KDe, Wr, loffs, wpk, wcv, offs,
                      maxoff, bias, has_bias, Cog, rows_per_it, out):
    """Grouped cross-correlation computed at stride 1 (on the input or on its stride
    phases), output row by output row: the same sums as
    :func:`conv_forward_tiled` (terms kk = ci' * KT + tap in order, one fused multiply-add
    each from 0.0, then the bias), but every tile is up to 32 positions of ONE output row,
    so the micro-kernel (:func:`_make_micro_store`, 6 channels -- or 4 for a group's last
    block of at most 4 -- x 8/16/24/32 positions) stores its accumulators straight into
    ``out``: no "wide" positions past OW are computed and nothing is scattered.  Row
    remainders of fewer than 8 positions go through the channel-vector micro-kernel
    (:func:`_make_micro_cv`, one position, all channels of the group) with ``wcv [G, K,
    WS]`` (WS = Cog rounded up to 8; empty when OW is a multiple of 8); tiles whose
    vector loads would run past the input (and remainders without ``wcv``) take the
    scalar chain.

    Two input modes, the same bits:

    * ``R == 0``: ``x [N, Cin', Dp, Hp, Wp]`` is the zero-padded input or its stride
      phases laid out by :func:`pad_split` (``pads`` zeros, ``strides`` ones, the
      residues and ``Wr`` unused) and ``offs [G, K]`` the term offsets in it (channel base
      of the group included);
    * ``R > 0`` (fused windows): ``x [N, Cin, D, H, W]`` is the unpadded input, ``pads``
      its padding, ``strides`` the strides and ``ud``/``uh``/``uw`` the stride residues
      that are read; every iteration copies the window its rows read (``Cin/G`` channels
      x the used phases x ``KDe`` depth slices x ``R`` rows of ``Wr`` elements,
      :func:`_fill_window`) into a private buffer, where term kk sits at ``loffs[kk]``
      (see :func:`_window_geometry`).

    ``wpk`` weights packed ``[G, nblk, K, 6]``, ``maxoff [G]`` the largest of ``offs[g]``,
    ``bias`` of length Cout (zeros when ``has_bias`` is False), ``out [N, Cout, OD, OH,
    OW]``.  Parallel over (batch item, group, output depth, run of ``rows_per_it`` output
    rows).  Returns ``(outputs finite, inputs finite)``: the first checked as the outputs
    are stored; the second, with fused windows, over the copied input elements (all of
    them when :func:`_window_geometry` says the windows cover the input), else True.

    Plain Python around the span helper :func:`_rows_span`: ``fmas`` (the call's
    multiply-add count) chooses the serial or the parallel path
    (:meth:`~._jit.SpanKernel.run`)."""
    OD, OH = out.shape[2], out.shape[3]
    n = x.shape[0] * offs.shape[0] * OD * ((OH + rows_per_it - 1) // rows_per_it)
    finite = np.ones(n, dtype=np.bool_)
    xin = np.ones(n, dtype=np.bool_)
    _rows_span.run(n, fmas, x, pads, strides, ud, uh, uw, R, KDe, Wr, loffs, wpk, wcv, offs,
                   maxoff, bias, has_bias, Cog, rows_per_it, out, finite, xin)
    return finite.all(), xin.all()


_pair_6x2 = _make_micro_pair(6, 2)   # 6 channels x 32 outputs, both W phases
_pair_6x1 = _make_micro_pair(6, 1)   # 6 channels x 16 outputs
_PAIR_VL = 2 * _VW                          # outputs per vector pair of the two phases


@kernel(scale=_FMA_PER_ELEMENT)
def conv_transpose_rows(xf, xstride, wpk, wcv, offs, maxoff, ph_a, ph_b, row_h, row_o, row_x,
                        bias, has_bias, Cog, groups, OW, rows_per_it, out):
    """Transposed convolution with stride 2 along W, output row by output row, both W
    phases interleaved in every vector (:func:`_make_micro_pair`), so whole rows of the
    output are stored with contiguous vector stores (the wide-tiled path scatters each
    phase to every other element).  The same sums in the same order as
    :func:`conv_forward_tiled` on the phase decomposition -- the same bits.

    Output row ``r`` (``out[n, co].flat[row_o[r] : row_o[r] + OW]``) belongs to the D/H
    phase ``h = row_h[r]``; its even outputs (relative to the padding parity) come from
    term group ``ph_a[h] * groups + g`` and the odd ones from ``ph_b[h] * groups + g``
    (rows of ``offs``/``maxoff``), output ``ow`` reading ``xf[n*xstride + row_x[r] +
    ow // 2 + offs[group, kk]]``.  ``wpk [H, groups, nblk, K, 6, 8]`` interleaves the two
    phases' packed weights lane by lane.  Row remainders of fewer than 16 outputs go
    through the channel-vector micro-kernel (:func:`_make_micro_cv`, every channel of the
    group per output) with ``wcv [H, 2, groups, K, WS]`` (WS = Cog rounded up to 8;
    phase a then b).  ``bias`` has length Cout (zeros when unused).  Returns True iff
    every output is finite.  Parallel over (batch item, group, run of ``rows_per_it``
    rows)."""
    N, Cout = out.shape[0], out.shape[1]
    oplane = out.shape[2]
    of = out.reshape(-1)
    K = offs.shape[1]
    CB = _ROW_CB
    nblk = (Cog + CB - 1) // CB
    WS = wcv.shape[0] // (ph_a.shape[0] * 2 * groups * max(K, 1))
    R = row_h.shape[0]
    nit = (R + rows_per_it - 1) // rows_per_it
    finite = np.ones(N * groups * nit, dtype=np.bool_)
    for t in prange(N * groups * nit):
        it = t % nit
        r_ = t // nit
        g = r_ % groups
        n = r_ // groups
        ok = True
        acc = np.empty(max(CB * _PAIR_VL, WS))
        for r in range(it * rows_per_it, min(R, (it + 1) * rows_per_it)):
            h = row_h[r]
            ga = ph_a[h] * groups + g
            gb = ph_b[h] * groups + g
            oa = offs[ga]
            ob = offs[gb]
            mo = max(maxoff[ga], maxoff[gb])
            xrow = n * xstride + row_x[r]
            c = 0
            while c < OW:
                V = min(_PAIR_MAXV, (OW - c) // _PAIR_VL)
                ln = V * _PAIR_VL if V > 0 else OW - c
                xbase = xrow + c // 2
                if V == 0:
                    # fewer than 16 outputs left: one output at a time, all channels
                    obase = (n * Cout + g * Cog) * oplane + row_o[r] + c
                    for i in range(ln):
                        ph = i % 2
                        _cv_chain(xf, xbase + i // 2, oa if ph == 0 else ob, wcv,
                                  ((h * 2 + ph) * groups + g) * K * WS, WS, K, Cog, acc)
                        for j in range(Cog):
                            v = acc[j] + bias[g * Cog + j] if has_bias else acc[j]
                            of[obase + j * oplane + i] = v
                            ok &= np.isfinite(v)
                    c += ln
                    continue
                safe = xbase + mo + _VW * V <= xf.shape[0]
                for b in range(nblk):
                    wbase = (((h * groups + g) * nblk + b) * K) * 2 * CB
                    co0 = g * Cog + b * CB
                    nb = min(CB, Cog - b * CB)
                    obase = (n * Cout + co0) * oplane + row_o[r] + c
                    if safe and V == 2:
                        ok &= _pair_6x2(xf, xbase, oa, ob, wpk, wbase, K, of, obase, oplane, nb,
                                        bias, co0, has_bias, acc)
                    elif safe:
                        ok &= _pair_6x1(xf, xbase, oa, ob, wpk, wbase, K, of, obase, oplane, nb,
                                        bias, co0, has_bias, acc)
                    else:
                        for j in range(nb):
                            for i in range(ln):
                                oo = oa if i % 2 == 0 else ob
                                a = 0.0
                                for kk in range(K):
                                    a = _fma(wpk[wbase + kk * 2 * CB + (i % 2) * CB + j],
                                             xf[xbase + i // 2 + oo[kk]], a)
                                v = a + bias[co0 + j] if has_bias else a
                                of[obase + j * oplane + i] = v
                                ok &= np.isfinite(v)
                c += ln
        finite[t] = ok
    return finite.all()


@span_kernel(scale=_FMA_PER_ELEMENT)
def _tiled_span(xf, xstride, wpk, offs, maxoff, CB, bias, has_bias, Cog, ochan, dst, out, bad,
                t0, t1):
    """Iterations ``t0 .. t1-1`` of :func:`conv_forward_tiled` (its arguments, then
    ``bad``, the number of non-finite outputs of each iteration, written at ``t``)."""
    G, K = offs.shape
    total = dst.shape[1]
    nrow = dst.shape[0]
    nblk = (Cog + CB - 1) // CB
    VL = _WIDE_VL8 if CB == 8 else _WIDE_VL4
    ntiles = (total + VL - 1) // VL
    nit = (ntiles + _TILES_PER_ITER - 1) // _TILES_PER_ITER
    for t in range(t0, t1):
        it = t % nit
        n = t // nit
        acc = np.empty(CB * VL)
        nbad = 0
        # block by block, then tile by tile: one block's packed weights stay cached while
        # the iteration's tiles stream past them (deep channels: all blocks' weights would
        # not fit in L2)
        for b in range(nblk):
            for tile in range(it * _TILES_PER_ITER, min(ntiles, (it + 1) * _TILES_PER_ITER)):
                p0 = tile * VL
                ln = min(VL, total - p0)
                xbase = n * xstride + p0
                for g in range(G):
                    nbad += _tile_group(xf, xbase, offs[g], dst[g % nrow], maxoff[g], wpk, g,
                                        nblk, b, K, CB, VL, p0, ln, bias, has_bias, Cog,
                                        ochan[g], acc, out[n])
        bad[t] = nbad


def conv_forward_tiled(fmas, xf, xstride, wpk, offs, maxoff, CB, bias, has_bias, Cog, ochan,
                       dst, out):
    """Stride-1 cross-correlation through the register-tiled micro-kernel, in "wide"
    layout: for every batch item ``n`` and term group ``g`` (a channel group of a grouped
    convolution, or a phase of a transposed one):

    ``out[n, ochan[g] + c, dst[g, q]] = bias[ochan[g] + c] + sum_kk wpk[g, c // CB, kk, c % CB]
    * xf[n * xstride + q + offs[g, kk]]``

    for every wide position ``q`` with ``dst[g, q] >= 0`` (``dst`` may have a single row
    shared by every ``g``), ``c < Cog``.  The sum is one fused multiply-add per term, in
    the order kk = 0 .. K-1, starting from 0.0 (then the bias is added), so the bits never
    depend on the tiling or the thread count.  ``xf`` is the flat zero-padded input,
    ``wpk`` the weights packed as ``[G, nblk, K, CB]`` (zero rows pad the last block),
    ``maxoff[g] = max(offs[g])``, ``out`` a ``[N, Cout, plane]`` view.

    Returns the number of non-finite outputs.

    Parallel over (batch item, run of tiles); every tile runs all term groups in turn, so
    the phases of a transposed convolution, which interleave in the output, fill each
    output cache line while it is hot.  A tile whose vector loads would run past the end
    of ``xf`` is computed by the equivalent scalar chain.  Plain Python around the span
    helper :func:`_tiled_span`; ``fmas`` (the multiply-add count) chooses the serial
    path or the parallel one (:meth:`~._jit.SpanKernel.run`)."""
    VL = _WIDE_VL8 if CB == 8 else _WIDE_VL4
    nit = ((dst.shape[1] + VL - 1) // VL + _TILES_PER_ITER - 1) // _TILES_PER_ITER
    bad = np.zeros(out.shape[0] * nit, dtype=np.int64)
    n = bad.shape[0]
    _tiled_span.run(n, fmas, xf, xstride, wpk, offs, maxoff, CB, bias, has_bias, Cog, ochan,
                    dst, out, bad)
    return int(bad.sum())


@helper
def _tile_group(xf, xbase, og, dg, maxoff, wpk, g, nblk, b, K, CB, VL, p0, ln, bias, has_bias,
                Cog, ochan, acc, outn):
    """One tile (positions ``p0 .. p0+ln-1``) of one term group for block ``b`` of CB
    output channels: micro-kernel (or the scalar chain near the end of ``xf``), then the
    bias and the scatter to ``outn[co, dg[q]]``.  Returns the number of non-finite
    outputs written (``v * 0`` is NaN exactly for NaN/inf ``v``; counted in an integer)."""
    nbad = 0
    safe = xbase + maxoff + VL <= xf.shape[0]
    wbase = ((g * nblk + b) * K) * CB
    if safe:
        if CB == 8:
            _micro_wide8(xf, xbase, og, wpk, wbase, K, acc)
        else:
            _micro_wide4(xf, xbase, og, wpk, wbase, K, acc)
    else:
        # only positions that land in the output: a dropped position of a short phase
        # could read past the end of xf
        for j in range(CB):
            for i in range(ln):
                a = 0.0
                if dg[p0 + i] >= 0:
                    for kk in range(K):
                        a = _fma(wpk[wbase + kk * CB + j], xf[xbase + og[kk] + i], a)
                acc[j * VL + i] = a
    nb = min(CB, Cog - b * CB)
    for j in range(nb):
        co = ochan + b * CB + j
        orow = outn[co]
        src = acc[j * VL:]
        bv = bias[co] if has_bias else 0.0
        for i in range(ln):
            q = dg[p0 + i]
            if q >= 0:
                v = src[i] + bv if has_bias else src[i]
                orow[q] = v
                nbad += v * 0.0 != 0.0
    return nbad


def _pack_weights(w, G, CB):
    """``w [G*Cog, K]`` (rows = output channels, columns = terms in summation order) ->
    flat ``[G, nblk, K, CB]`` with zero rows padding each group's last block."""
    Cog = w.shape[0] // G
    K = w.shape[1]
    nblk = -(-Cog // CB)
    wp = np.zeros((G, nblk * CB, K), dtype=np.float64)
    wp[:, :Cog] = w.reshape(G, Cog, K)
    return np.ascontiguousarray(wp.reshape(G, nblk, CB, K).transpose(0, 1, 3, 2)).reshape(-1)


def _cv_weights(w, G, OW):
    """``w [G*Cog, K]`` -> flat ``[G, K, WS]`` (channels last, zero-padded to WS = Cog
    rounded up to 8) for the channel-vector kernel of :func:`conv_forward_rows` -- or an
    empty array when rows of ``OW`` positions leave no remainder for it."""
    if OW % _VW == 0:
        return np.zeros(0, dtype=np.float64)
    Cog = w.shape[0] // G
    wc = np.zeros((G, w.shape[1], -(-Cog // _VW) * _VW), dtype=np.float64)
    wc[:, :, :Cog] = w.reshape(G, Cog, -1).transpose(0, 2, 1)
    return wc.reshape(-1)


def _wide_dst(counts, starts, steps, grid, oshape):
    """Map every wide position ``q = (jd*Hp + jh)*Wp + jw`` on a padded grid ``grid =
    (Dp, Hp, Wp)`` to the flat index of output ``(starts + steps*j)`` in an output plane of
    shape ``oshape`` when ``j < counts`` on every axis, else -1."""
    Hp, Wp = grid[1], grid[2]
    total = (counts[0] - 1) * Hp * Wp + (counts[1] - 1) * Wp + counts[2]
    q = np.arange(total, dtype=np.int64)
    jd, rem = np.divmod(q, Hp * Wp)
    jh, jw = np.divmod(rem, Wp)
    od = starts[0] + steps[0] * jd
    oh = starts[1] + steps[1] * jh
    ow = starts[2] + steps[2] * jw
    return np.where((jh < counts[1]) & (jw < counts[2]),
                    (od * oshape[1] + oh) * oshape[2] + ow, -1)


def _frozen(*arrays):
    """Read-only int64 C-contiguous copies (cached geometry is shared between calls)."""
    out = []
    for a in arrays:
        a = np.ascontiguousarray(a, dtype=np.int64)
        a.flags.writeable = False
        out.append(a)
    return tuple(out)


def _geometry(offs, ochan, dst):
    """``(offs, maxoff, ochan, dst)`` for :func:`_launch_tiled`, read-only."""
    maxoff = offs.max(axis=1) if offs.shape[1] else np.zeros(offs.shape[0], dtype=np.int64)
    return _frozen(offs, maxoff, ochan, dst)


def _tile_cb(Cog):
    """Output channels per block of :func:`conv_forward_tiled`: 8 (AVX-512, Cog > 4) or
    4."""
    return 8 if _WIDE_CB8 and Cog > 4 else 4


def _slack_empty(shape):
    """``numpy.empty(shape)`` (float64, C-contiguous) inside a flat buffer that continues
    with one more batch element's worth of zeros plus 256 (the "slack"): the tiled kernel
    reads its vectors through the buffer (:func:`_flat`), so the tiles of the last batch
    element, whose vectors run past the array, take the micro-kernel instead of the
    scalar chain (the values read there never reach an output)."""
    size = math.prod(shape)
    slack = (size // shape[0] if shape[0] else 0) + 256
    buf = np.empty(size + slack, dtype=np.float64)
    buf[size:] = 0.0
    return buf[:size].reshape(shape)


def _flat(xp):
    """The flat buffer behind ``xp``: its :func:`_slack_empty` buffer with the slack when
    it has one, else ``xp`` flattened."""
    base = xp.base
    if (isinstance(base, np.ndarray) and base.ndim == 1 and base.dtype == np.float64
            and base.size > xp.size and xp.flags.c_contiguous
            and base.ctypes.data == xp.ctypes.data):
        return base
    return xp.reshape(-1)


def _launch_tiled(xp, wpk, Cog, geo, bias, has_bias, out5, fmas):
    """Launch :func:`conv_forward_tiled` with the packed weights ``wpk`` ([G, nblk, K, CB],
    CB = :func:`_tile_cb`) and the geometry ``geo = (offs [G, K], maxoff [G], ochan [G],
    dst [rows, total])``.  Returns whether every output is finite."""
    offs, maxoff, ochan, dst = geo
    N = xp.shape[0]
    xstride = xp.size // N if N else 0
    out3 = out5.reshape(out5.shape[:2] + (-1,))
    return 0 == conv_forward_tiled(
        fmas, _flat(xp), xstride, wpk, offs, maxoff, _tile_cb(Cog), bias, has_bias, Cog, ochan,
        dst, out3)


@span_kernel(iterations=lambda x, pd, ph, pw, out: x.shape[0] * x.shape[1],
             work=lambda x, pd, ph, pw, out: out.size)
def pad_input(x, pd, ph, pw, out, t0, t1):
    """out[n, c] = x[n, c] placed at offset (pd, ph, pw) in zeros (out preallocated, at
    least as large as x plus the offsets on every axis); every element written once.
    A span kernel over the (n, c) planes (``t = n*C + c``, ``t0 .. t1-1``): called as
    ``pad_input(x, pd, ph, pw, out)``."""
    N, C, D, H, W = x.shape
    Dp, Hp, Wp = out.shape[2], out.shape[3], out.shape[4]
    for t in range(t0, t1):
        n = t // C
        c = t % C
        for d in range(Dp):
            for h in range(Hp):
                row = out[n, c, d, h]
                if d < pd or d >= pd + D or h < ph or h >= ph + H:
                    for w in range(Wp):
                        row[w] = 0.0
                else:
                    src = x[n, c, d - pd, h - ph]
                    for w in range(pw):
                        row[w] = 0.0
                    # unsigned indices: no negative-index wrap-around (2x faster)
                    upw = np.uint64(pw)
                    for w in range(np.uint64(W)):
                        row[upw + w] = src[w]
                    for w in range(pw + W, Wp):
                        row[w] = 0.0


@kernel(work=lambda x, pd, ph, pw, sd, sh, sw, ud, uh, uw, out: out.size)
def pad_split(x, pd, ph, pw, sd, sh, sw, ud, uh, uw, out):
    """Zero-pad ``x [N, C, D, H, W]`` by (pd, ph, pw) on both sides and split every axis
    into the stride phases that are used (residues ``ud``/``uh``/``uw``, int64 arrays):
    ``out[n, c*P + (a*len(uh) + b)*len(uw) + e, qd, qh, qw] = xpad[n, c, qd*sd + ud[a],
    qh*sh + uh[b], qw*sw + uw[e]]`` (zero where that is padding or past the padded extent),
    ``P = len(ud)*len(uh)*len(uw)``.  A strided correlation on ``xpad`` is then a stride-1
    one on the phases: ``xpad[o*s + k*d] = phase_{(k*d) mod s}[o + (k*d) div s]``.
    Every element of ``out`` is written once; parallel over output planes.  Returns True
    iff every element of ``x`` that was copied is finite (with every residue used, that
    is all of ``x``)."""
    N, C, D, H, W = x.shape
    nh, nw = uh.shape[0], uw.shape[0]
    P = ud.shape[0] * nh * nw
    Dq, Hq, Wq = out.shape[2], out.shape[3], out.shape[4]
    xf = x.reshape(-1)
    xb = xf.view(np.uint64)
    finite = np.ones(N * C * P, dtype=np.bool_)
    for t in prange(N * C * P):
        f = t % P
        r = t // P
        c = r % C
        n = r // C
        rd = ud[f // (nh * nw)]
        rh = uh[(f // nw) % nh]
        rw = uw[f % nw]
        for qd in range(Dq):
            i = qd * sd + rd - pd
            for qh in range(Hq):
                j = qh * sh + rh - ph
                row = out[n, c * P + f, qd, qh]
                if i < 0 or i >= D or j < 0 or j >= H:
                    for qw in range(Wq):
                        row[qw] = 0.0
                else:
                    sb = (((n * C + c) * D + i) * H + j) * W
                    # qw*sw + rw - pw inside [0, W) exactly for q0 <= qw < q1
                    q0 = min(Wq, max(0, (pw - rw + sw - 1) // sw))
                    q1 = max(q0, min(Wq, (W + pw - rw + sw - 1) // sw))
                    for qw in range(q0):
                        row[qw] = 0.0
                    # unsigned indices (all >= 0 here): no negative-index wrap-around
                    us = np.uint64(sb + q0 * sw + rw - pw)
                    uq = np.uint64(q0)
                    usw = np.uint64(sw)
                    m = np.uint64(0)
                    for q in range(np.uint64(q1 - q0)):
                        row[uq + q] = xf[us + q * usw]
                        m = max(m, xb[us + q * usw] & _EXP_BITS)
                    finite[t] &= m != _EXP_BITS
                    for qw in range(q1, Wq):
                        row[qw] = 0.0
    return finite.all()


def _used_residues(K, s, d):
    """Per axis, the sorted residues ``(k*d) mod s`` that some tap k reads (the phases
    :func:`pad_split` must materialise)."""
    return tuple(tuple(sorted({(k * d[a]) % s[a] for k in range(K[a])})) for a in range(3))


@kernel(scale=_FMA_PER_ELEMENT)
def conv_forward(xp, w, bias, has_bias, groups, sd, sh, sw, dd, dh, dw, out):
    """Direct grouped cross-correlation of the zero-padded input ``xp [N, Cin, Dp, Hp, Wp]``
    with ``w [Cout, Cin/groups, KD, KH, KW]`` into ``out [N, Cout, OD, OH, OW]``:

    ``out[n, co, o] = bias[co] + sum_{ci in group(co), k} w[co, ci', k] * xp[n, ci, o*s + k*d]``

    The sum runs over (ci', kd, kh, kw) in that order, one fused multiply-add per term.
    When every stride is 1 the output positions are walked on the padded grid (rows of
    width Wp, planes of Hp*Wp: the "wide" layout; positions past OW/OH are computed and
    dropped), so the innermost loop is long, contiguous and vectorised; otherwise one
    output row (OW positions, stride ``sw`` in x) is one segment.
    """
    N, Cin, Dp, Hp, Wp = xp.shape
    Cout, Cg, KD, KH, KW = w.shape
    OD, OH, OW = out.shape[2], out.shape[3], out.shape[4]
    HWp = Hp * Wp
    xf = xp.reshape((N, Cin, Dp * HWp))
    Cog = Cout // groups
    nblk = (Cog + _CB - 1) // _CB
    KT = KD * KH * KW
    w3 = w.reshape((Cout, Cg, KT))
    toff = np.empty(KT, dtype=np.int64)     # x offset of every tap, taps in (kd, kh, kw) order
    for kd in range(KD):
        for kh in range(KH):
            for kw in range(KW):
                toff[(kd * KH + kh) * KW + kw] = kd * dd * HWp + kh * dh * Wp + kw * dw
    fast = sd == 1 and sh == 1 and sw == 1
    if fast:
        total = (OD - 1) * HWp + (OH - 1) * Wp + OW
        nseg = (total + _SEG - 1) // _SEG
        seglen = (total + nseg - 1) // nseg
        seglen = ((seglen + _VW - 1) // _VW) * _VW     # vector tails only in the last segment
        nseg = (total + seglen - 1) // seglen
    else:
        total = OW
        seglen = OW
        nseg = OD * OH
    niter = N * groups * nblk * nseg
    for t in prange(niter):
        seg = t % nseg
        r = t // nseg
        b = r % nblk
        r = r // nblk
        g = r % groups
        n = r // groups
        co0 = g * Cog + b * _CB
        nb = min(_CB, Cog - b * _CB)
        if fast:
            p0 = seg * seglen
            ln = min(seglen, total - p0)
            xb0 = p0
        else:
            od = seg // OH
            oh = seg % OH
            p0 = 0
            ln = OW
            xb0 = od * sd * HWp + oh * sh * Wp
        acc = np.zeros((_CB, seglen))
        for cl in range(Cg):
            xr = xf[n, g * Cg + cl]
            if nb == _CB and sw == 1:
                t0 = 0
                while t0 < KT:
                    T = min(9, KT - t0)
                    _chunk4(acc, ln, xr, xb0, toff, t0, T, w3[co0, cl], w3[co0 + 1, cl],
                            w3[co0 + 2, cl], w3[co0 + 3, cl])
                    t0 += T
            else:
                for kd in range(KD):
                    for kh in range(KH):
                        kw = 0
                        while kw < KW:
                            taps = min(3, KW - kw)
                            xb = xb0 + kd * dd * HWp + kh * dh * Wp + kw * dw
                            for j in range(nb):
                                _taps_1(acc, j, ln, xr, xb, sw, dw,
                                        w[co0 + j, cl, kd, kh, kw:kw + taps], taps)
                            kw += taps
        for j in range(nb):
            co = co0 + j
            bv = bias[co] if has_bias else 0.0
            a = acc[j]
            if fast:
                # walk the segment one padded row (Wp positions) at a time
                p = p0
                end = p0 + ln
                while p < end:
                    od = p // HWp
                    rem = p - od * HWp
                    oh = rem // Wp
                    ow = rem - oh * Wp
                    run = min(end - p, Wp - ow)
                    if oh < OH and ow < OW:
                        dst = out[n, co, od, oh, ow:]
                        src = a[p - p0:]
                        lim = min(run, OW - ow)
                        if has_bias:
                            for i in range(lim):
                                dst[i] = src[i] + bv
                        else:
                            for i in range(lim):
                                dst[i] = src[i]
                    p += run
            else:
                od = seg // OH
                oh = seg % OH
                dst = out[n, co, od, oh]
                if has_bias:
                    for i in range(ln):
                        dst[i] = a[i] + bv
                else:
                    for i in range(ln):
                        dst[i] = a[i]


@kernel
def conv_weight_grad(xp, gy, groups, sd, sh, sw, dd, dh, dw, out):
    """Gradient of :func:`conv_forward` with respect to its weights:

    ``out[co, ci', k] = sum_{n, o} gy[n, co, o] * xp[n, ci, o*s + k*d]``

    with ``xp`` the zero-padded input, ``gy [N, Cout, OD, OH, OW]`` and ``out [Cout,
    Cin/groups, KD, KH, KW]``.  Parallel over (co, ci'); each sum runs in the fixed order
    (n, od, oh, ow).
    """
    N, Cin = xp.shape[0], xp.shape[1]
    Cout, OD, OH, OW = gy.shape[1], gy.shape[2], gy.shape[3], gy.shape[4]
    Cg, KD, KH, KW = out.shape[1], out.shape[2], out.shape[3], out.shape[4]
    Cog = Cout // groups
    for t in prange(Cout * Cg):
        co = t // Cg
        cl = t % Cg
        ci = (co // Cog) * Cg + cl
        for kd in range(KD):
            for kh in range(KH):
                for kw in range(KW):
                    s = 0.0
                    for n in range(N):
                        for od in range(OD):
                            for oh in range(OH):
                                xrow = xp[n, ci, od * sd + kd * dd, oh * sh + kh * dh]
                                grow = gy[n, co, od, oh]
                                base = kw * dw
                                for ow in range(OW):
                                    s = _fma(grow[ow], xrow[base + ow * sw], s)
                    out[co, cl, kd, kh, kw] = s


# --------------------------------------------------------------------------- entry points
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
_forced = {"forward": None}


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
    if "gemm" in ok and O is not None and conv_gemm.preferred(Cg, K3, O, strided, padded,
                                                              _WIDE512):
        return "gemm"
    if Cog >= _ROW_CB and (OW >= 16 or (OW > 0 and OW % _VW == 0)):
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

    Returns ``(finite, x_finite)``: whether every output is finite when the kernel checked
    it (the tiled paths), else None; whether every element of ``x5`` is finite when a
    kernel copied them all and checked them, else None."""
    Cout, Cg = w5.shape[:2]
    Cog = Cout // groups
    fmas = out5.size * (w5.size // Cout)
    S, K3 = x5.shape[2:], w5.shape[2:]
    OD, OH, OW = out5.shape[2:]
    strided_or_padded = bool(any(pads) or s != (1, 1, 1))
    path = forward_path(Cog, Cg, K3, OW, strided_or_padded, padded=any(pads), O=(OD, OH, OW),
                        N=out5.shape[0], strided=s != (1, 1, 1))
    if path == "batch":
        return conv_batch.forward(x5, w5, b, has_bias, groups, s, d, pads, out5), None
    if path == "gemm":
        ok, x_ok = conv_gemm.conv_gemm(x5, w5, b, has_bias, groups, s, d, pads, out5)
        return bool(ok), x_ok
    rpi = _rows_per_iteration(out5.shape[0] * groups * OD, OH, OW)
    bvec = b if has_bias else np.zeros(Cout, dtype=np.float64)
    if path == "rows_fused":
        R, KDe, Wr, used, loffs, offs, maxoff, covers = _window_geometry(
            S, K3, s, d, pads, out5.shape[2:], groups, Cg, rpi)
        if Cg * len(used[0]) * len(used[1]) * len(used[2]) * KDe * R * Wr <= _FUSE_WINDOW:
            ok, x_ok = conv_forward_rows(
                fmas, x5, np.array(pads, dtype=np.int64), np.array(s, dtype=np.int64), *used, R, KDe,
                Wr, loffs, _pack_weights(w5.reshape(Cout, -1), groups, _ROW_CB),
                _cv_weights(w5.reshape(Cout, -1), groups, OW), offs, maxoff, bvec, has_bias,
                Cog, rpi, out5)
            return bool(ok), (bool(x_ok) if covers else None)
        path = "rows"
    if path == "generic":
        conv_forward.sized(fmas)(
            _padded(x5, pads), w5, b, has_bias, groups, s[0], s[1], s[2], d[0], d[1], d[2], out5)
        return None, None
    x_ok = None
    if s != (1, 1, 1):
        # pad and split into the stride phases that are read, then correlate at stride 1
        used = _used_residues(K3, s, d)
        P = len(used[0]) * len(used[1]) * len(used[2])
        grid = tuple(-(-(S[a] + 2 * pads[a]) // s[a]) for a in range(3))
        xp = _slack_empty((x5.shape[0], x5.shape[1] * P) + grid)
        copied = pad_split(
            x5, pads[0], pads[1], pads[2], s[0], s[1], s[2],
            *(np.asarray(u, dtype=np.int64) for u in used), xp)
        # every residue used: the split copied (and checked) every element of x
        x_ok = bool(copied) if P == s[0] * s[1] * s[2] else None
    else:
        xp = _padded(x5, pads, slack=path == "wide")
    geo = _forward_geometry(xp.shape[2:], K3, d, groups, Cg, Cog, out5.shape[2:], s)
    if path == "rows":
        # row tiles stored straight into the output
        ok, _ = conv_forward_rows(
            fmas, xp, _ZEROS3, _ONES3, _ZEROS1, _ZEROS1, _ZEROS1, 0, 1, xp.shape[4], _NO_OFFS,
            _pack_weights(w5.reshape(Cout, -1), groups, _ROW_CB),
            _cv_weights(w5.reshape(Cout, -1), groups, OW), geo[0], geo[1], bvec, has_bias, Cog,
            rpi, out5)
        return bool(ok), x_ok
    return _launch_tiled(xp, _pack_weights(w5.reshape(Cout, -1), groups, _tile_cb(Cog)), Cog,
                         geo, b, has_bias, out5, fmas), x_ok


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
    used = _used_residues(K3, s, d)
    nu = [len(u) for u in used]
    P = nu[0] * nu[1] * nu[2]
    k = [np.arange(K3[a]) * d[a] for a in range(3)]
    ix = [np.searchsorted(np.asarray(used[a]), k[a] % s[a]) for a in range(3)]
    phase = (ix[0][:, None, None] * (nu[1] * nu[2]) + ix[1][None, :, None] * nu[2]
             + ix[2][None, None, :])
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
    used = _used_residues(K3, s, d)
    nu = [len(u) for u in used]
    P = nu[0] * nu[1] * nu[2]
    # tap k on axis a reads the phase of residue (k*d) mod s at offset (k*d) div s
    k = [np.arange(K3[a]) * d[a] for a in range(3)]
    ix = [np.searchsorted(np.asarray(used[a]), k[a] % s[a]) for a in range(3)]
    phase = (ix[0][:, None, None] * (nu[1] * nu[2]) + ix[1][None, :, None] * nu[2]
             + ix[2][None, None, :])
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
    r = x.ndim - 2
    s = views.pad3(stride, 1)
    p = views.pad3(padding, 0)
    d = views.pad3(dilation, 1)
    x5 = views.writeable5(x)
    w5 = views.writeable5(w)
    N, Cin = x5.shape[:2]
    S = x5.shape[2:]
    K = w5.shape[2:]
    O = tuple((S[a] + 2 * p[a] - d[a] * (K[a] - 1) - 1) // s[a] + 1 for a in range(3))
    shape = (N, w.shape[0]) + O[3 - r:]
    if out is None:
        out = np.empty(shape, dtype=np.float64)
    b = np.array(bias, dtype=np.float64) if bias is not None else np.zeros(1, dtype=np.float64)
    finite = x_finite = None
    if out.size:
        finite, x_finite = _launch_forward(x5, w5, b, bias is not None, int(groups), s, d,
                                           views.out5(out), p)
    return (out, finite, x_finite) if report_finite else out


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
    if pair is not None:
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
