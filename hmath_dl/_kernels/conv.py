"""Convolution kernels: direct summation on 3 spatial axes (1-D and 2-D inputs are viewed
with unit leading spatial axes), grouped, strided, dilated; and its adjoint (transposed
convolution) and the weight gradient.

Layout: ``x [N, Cin, D, H, W]``, forward weights ``[Cout, Cin/groups, KD, KH, KW]``,
transposed weights ``[Cin, Cout/groups, KD, KH, KW]``; every array C-contiguous float64.

The plan (which path runs a shape, forced paths for tests) and the plain-Python entry
points (:func:`~.conv_plan.conv_nd`, :func:`~.conv_plan.conv_transpose_nd`,
:func:`~.conv_plan.conv_weight_grad_nd`) are in :mod:`.conv_plan`; the IR emitters of
the register tiles in :mod:`._simd`; this module holds the kernels.

Every kernel shares one specification -- ``out = bias + (fused multiply-add chain over
the terms (ci', kd, kh, kw) in that order, from 0.0)`` -- and therefore the bits; tests
hold each path to the generic kernel's bytes.  With AVX-512 (:func:`.conv_plan.tiled_kernels_enabled`)
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

import math

import numpy as np
from numba import prange

from ._jit import helper, kernel, span_kernel

#: A convolution's work is its multiply-add count, about 16 of them per element of a
#: memory-bound kernel's work: the serial threshold of the convolution kernels is
#: ``SERIAL_WORK * 16`` multiply-adds (~0.2 ms on one core; padding/splitting copies
#: count elements).
_FMA_PER_ELEMENT = 16

_CB = 4      # output channels computed together (one x load feeds _CB accumulators)
_SEG = 1024   # output positions per accumulator segment (_CB x _SEG accumulators: 32 KiB)


from ._simd import (  # noqa: E402  (the generator and the tile shapes)
    _fma,
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
             work=lambda x, pd, ph, pw, out: out.size, scale=4)
def pad_input(x, pd, ph, pw, out, t0, t1):
    """out[n, c] = x[n, c] placed at offset (pd, ph, pw) in zeros (out preallocated, at
    least as large as x plus the offsets on every axis); every element written once.
    A span kernel over the (n, c) planes (``t = n*C + c``, ``t0 .. t1-1``): called as
    ``pad_input(x, pd, ph, pw, out)``; serial below ``4 * SERIAL_WORK`` output elements
    (chosen when the pool called the span once per plane: 64 x 16 planes of 6 x 6 took
    25 us on two threads, 12 serially; with the pool's runs of tasks a parallel launch
    of them takes ~10 us, no faster than one thread, so the threshold stays)."""
    N, C, D, H, W = x.shape
    Dp, Hp, Wp = out.shape[2], out.shape[3], out.shape[4]
    if x.flags.c_contiguous and out.flags.c_contiguous:
        # flat indices, the plane zeroed first, then its rows copied in (a row slice per
        # padded row cost more than the copying on small planes: 64 x 16 planes of 4 x 4
        # padded to 6 x 6, one thread, 28.7 -> 10.2 us, AVX-512)
        xf = x.ravel()
        of = out.ravel()
        S = np.uint64(D * H * W)
        Sp = np.uint64(Dp * Hp * Wp)
        uW = np.uint64(W)
        for t in range(np.uint64(t0), np.uint64(t1)):
            ob = t * Sp
            for q in range(Sp):
                of[ob + q] = 0.0
            src = t * S
            for d in range(D):
                for h in range(H):
                    dst = ob + np.uint64(((d + pd) * Hp + h + ph) * Wp + pw)
                    for w in range(uW):
                        of[dst + w] = xf[src + w]
                    src += uW
        return
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
    of = out.reshape(-1)
    finite = np.ones(N * C * P, dtype=np.bool_)
    uWq = np.uint64(Wq)
    for t in prange(N * C * P):
        f = t % P
        r = t // P
        c = r % C
        n = r // C
        rd = ud[f // (nh * nw)]
        rh = uh[(f // nw) % nh]
        rw = uw[f % nw]
        # qw*sw + rw - pw inside [0, W) exactly for q0 <= qw < q1 (the same for every row
        # of the phase: computed once per task, not per row -- two divisions per row of
        # 29 took half of a 3x3 s2 64->128 @56 split, AVX-512)
        q0 = min(Wq, max(0, (pw - rw + sw - 1) // sw))
        q1 = max(q0, min(Wq, (W + pw - rw + sw - 1) // sw))
        uq0 = np.uint64(q0)
        uq1 = np.uint64(q1)
        un = np.uint64(q1 - q0)
        usw = np.uint64(sw)
        m = np.uint64(0)
        # flat indices, unsigned (all >= 0): no negative-index wrap-around, no row views
        ob = np.uint64(((n * C * P + c * P + f) * Dq) * Hq) * uWq
        for qd in range(Dq):
            i = qd * sd + rd - pd
            for qh in range(Hq):
                j = qh * sh + rh - ph
                if i < 0 or i >= D or j < 0 or j >= H:
                    for qw in range(uWq):
                        of[ob + qw] = 0.0
                else:
                    for qw in range(uq0):
                        of[ob + qw] = 0.0
                    us = np.uint64((((n * C + c) * D + i) * H + j) * W + q0 * sw + rw - pw)
                    d0 = ob + uq0
                    if sw == 2:             # the usual stride, a literal step: vectorised
                        for q in range(un):
                            of[d0 + q] = xf[us + q * np.uint64(2)]
                            m = max(m, xb[us + q * np.uint64(2)] & _EXP_BITS)
                    else:
                        for q in range(un):
                            of[d0 + q] = xf[us + q * usw]
                            m = max(m, xb[us + q * usw] & _EXP_BITS)
                    for qw in range(uq1, uWq):
                        of[ob + qw] = 0.0
                ob += uWq
        finite[t] = m != _EXP_BITS
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
