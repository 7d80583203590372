"""Convolutions as GEMMs over the whole batch: ``out[n, g] = W_g @ X_ng`` per batch
element ``n`` and group ``g``, with ``W_g [Cout/groups, Cg*KD*KH*KW]`` the group's
weights and ``X_ng`` its unfolded input (im2col), row ``(ci', kd, kh, kw)``, column
``p = (od*OH + oh)*OW + ow``::

    X_ng[(ci', kd, kh, kw), p] = x[n, g*Cg + ci', od*sd - pd + kd*dd,
                                   oh*sh - ph + kh*dh, ow*sw - pw + kw*dw]

(0 in the zero padding).  The convolution's specification -- ``bias + (fused
multiply-add chain over the terms (ci', kd, kh, kw) in that order, from 0.0)`` -- is
exactly :mod:`.gemm_f64`'s chain over the rows of ``X_ng`` followed by its bias step, so
this path gives the bits of every other convolution path.

The unfolded input is never materialised: every task of :func:`conv_gemm_tasks` (one
batch element, one panel of ~256 output positions) unfolds its own panel
(:func:`_pack_panel`, straight into the GEMM's packed layout, in L2), runs the
register-tiled chains of every row block on it (:func:`.gemm_f64._panel`) and the
epilogue (:func:`.gemm_f64._finish`: bias per output channel, count of non-finite
outputs).  What this adds over the row kernel of :mod:`.conv` on the shapes the plan
gives it: the GEMM's K-blocking (a 1x1 kernel, or many input channels, make the row
kernel's window of all input channels too large for L1) and tasks over the whole batch.
"""

import numpy as np

from . import gemm_f64 as G
from ._jit import helper, inlined, span_kernel
from ._simd import prefetch_read
from .gemm_f64 import _CB, _MC, _finish, _panel

_EXP = np.uint64(0x7FF0000000000000)     # exponent field: all ones only for NaN/inf
_PANEL = 256                               # output positions per task (at most)
_AHEAD = 4                                  # rows of lookahead of the pointwise pack
_PANEL_ELEMS = 3 << 16                     # a task's unfolded panel: <= 1.5 MiB (in L2)
# A unit-stride 1x1 convolution reads each image's channel planes in place (no panel copy,
# :func:`_planes_in_place`) only when they are at most this many elements (512 KiB): larger
# planes come from memory, and the micro-kernel's loads of rows a plane apart then stall
# where the panel copy streams them (Intel Xeon, two threads, 256->64 @56 batch 8 -- 3136
# positions x 256 channels per image: AVX-512 in place 8.6-9.0 ms, copied 7.3-7.4; AVX2
# 15.4-15.5 against 11.8-12.1; 128->128 @28 1.87-1.90 against 1.65-1.66 (AVX-512); but
# 256->64 @16, 64 K elements per image: 0.55 against 0.64, and 16->32 @8 batch 64 0.077
# against 0.087).  (A Zen 4 VM measured the 56x56 case 7 % faster in place.)
_IN_PLACE_MAX = 1 << 16
_NO_TAB = np.zeros((0, 5), dtype=np.int64)  # conv_gemm_tasks: unfold from x itself
_NO_TAB.flags.writeable = False


@inlined
def _advance(run, p, lane, tb, od, oh, ow, T, step, OH, OW):
    """The panel walk of the unfolding packs after a run of ``run`` positions: the next
    position ``p`` (and its ``od, oh, ow``), its lane in the tile and the tile's row
    offset ``tb`` (a tile holds ``T`` positions; the next tile starts ``step`` later)."""
    p += run
    lane += run
    ow += run
    if ow == OW:
        ow = 0
        oh += 1
        if oh == OH:
            oh = 0
            od += 1
    if lane == T:
        lane = 0
        tb += step
    return p, lane, tb, od, oh, ow


@helper
def _pack_panel(x5, i, c0, Cg, geo, p0, p1, T, bl):
    """The columns ``p0 .. p1-1`` of ``X_ig`` (module docstring; ``geo`` = int64
    ``[sd, sh, sw, dd, dh, dw, pd, ph, pw, KD, KH, KW, OD, OH, OW]``, the group's input
    channels from ``c0``) packed as :func:`.gemm_f64.gemm_tiled` reads ``b``:
    ``bl [ceil((p1-p0)/T), K, T]``, zero columns past ``p1``.  Returns how many packed
    elements are NaN/inf (an integer test of the exponent bits over the packed panel, in
    cache).  A copy: no arithmetic.  Each row is copied output row by output row; at
    stride 1 without padding a 1x1 kernel's row is one contiguous run of ``x5``."""
    sd, sh, sw = geo[0], geo[1], geo[2]
    dd, dh, dw = geo[3], geo[4], geo[5]
    pd, ph, pw = geo[6], geo[7], geo[8]
    KD, KH, KW = geo[9], geo[10], geo[11]
    OH, OW = geo[13], geo[14]
    D, H, W = x5.shape[2], x5.shape[3], x5.shape[4]
    KK = KD * KH * KW
    K = Cg * KK
    step = K * T
    ntl = (p1 - p0 + T - 1) // T
    flat = (KK == 1 and sd == 1 and sh == 1 and sw == 1 and pd == 0 and ph == 0 and pw == 0)
    for k in range(K):
        ci = k // KK
        r = k - ci * KK
        kd = r // (KH * KW)
        kh = (r // KW) % KH
        kw = r % KW
        if flat:
            # plain copies of contiguous runs (unsigned indices: no wrap-around tests)
            xf = x5[i, c0 + ci].ravel()
            for tl in range(ntl):
                q0 = np.uint64(p0 + tl * T)
                w = np.uint64(min(T, p1 - p0 - tl * T))
                base = np.uint64(tl * step + k * T)
                for q in range(w):
                    bl[base + q] = xf[q0 + q]
                for q in range(w, np.uint64(T)):
                    bl[base + q] = 0.0
            continue
        off = kw * dw - pw
        tb = k * T
        p, lane, od, oh, ow = p0, 0, p0 // (OH * OW), (p0 // OW) % OH, p0 % OW
        while p < p1:
            run = min(T - lane, OW - ow, p1 - p)
            di = od * sd - pd + kd * dd
            hi = oh * sh - ph + kh * dh
            dst = tb + lane
            if di < 0 or di >= D or hi < 0 or hi >= H:
                for q in range(run):
                    bl[dst + q] = 0.0
            else:
                xr = x5[i, c0 + ci, di, hi]
                # (ow + q)*sw + off inside [0, W) exactly for qa <= q < qb
                qa = min(run, max(0, (-off - ow * sw + sw - 1) // sw))
                qb = max(qa, min(run, (W - off - ow * sw + sw - 1) // sw))
                for q in range(qa):
                    bl[dst + q] = 0.0
                src = ow * sw + off
                for q in range(qa, qb):
                    bl[dst + q] = xr[src + q * sw]
                for q in range(qb, run):
                    bl[dst + q] = 0.0
            p, lane, tb, od, oh, ow = _advance(run, p, lane, tb, od, oh, ow, T, step, OH, OW)
        if lane:
            for q in range(lane, T):
                bl[tb + q] = 0.0
    bits = bl.view(np.uint64)
    cnt = 0
    for q in range(bits.size):
        cnt += (bits[q] & _EXP) == _EXP
    return cnt


@helper
def _pack_split(xq, i, c0, Cg, tab, geo, p0, p1, T, bl):
    """:func:`_pack_panel`'s panel (the same values in the same layout) read from the
    zero-padded stride phases ``xq`` of the input (:func:`.conv.pad_split`:
    ``xq[n, c*Pph + f]`` the phase ``f`` of channel ``c``, ``Pph = tab[0, 4]``): tap
    ``r = (kd, kh, kw)`` reads phase ``tab[r, 0]`` at offsets ``tab[r, 1:4]``, so every
    output row's run of positions is one contiguous run of a phase row -- a plain copy,
    no bounds tests (the padding is in the phases).  No finiteness count (the split
    counted what it copied)."""
    OH, OW = geo[13], geo[14]
    KK = tab.shape[0]
    Pph = tab[0, 4]
    Hq, Wq = xq.shape[3], xq.shape[4]
    K = Cg * KK
    step = K * T
    xf = xq.reshape(-1)
    plane = xq.shape[2] * Hq * Wq
    for k in range(K):
        ci = k // KK
        r = k - ci * KK
        pb = ((i * xq.shape[1] + (c0 + ci) * Pph + tab[r, 0]) * plane
              + (tab[r, 1] * Hq + tab[r, 2]) * Wq + tab[r, 3])
        tb = k * T
        p, lane, od, oh, ow = p0, 0, p0 // (OH * OW), (p0 // OW) % OH, p0 % OW
        while p < p1:
            run = min(T - lane, OW - ow, p1 - p)
            src = np.uint64(pb + (od * Hq + oh) * Wq + ow)
            dst = np.uint64(tb + lane)
            for q in range(np.uint64(run)):
                bl[dst + q] = xf[src + q]
            p, lane, tb, od, oh, ow = _advance(run, p, lane, tb, od, oh, ow, T, step, OH, OW)
        if lane:
            for q in range(lane, T):
                bl[tb + q] = 0.0
    return 0


def _split_table(K3, s, d):
    """``tab [KD*KH*KW, 5]`` of :func:`_pack_split` for kernel extents ``K3``, strides
    ``s`` and dilations ``d`` (phases as :func:`.conv.pad_split` orders the used
    residues) and the used residues."""
    from .conv import _used_residues
    used = _used_residues(K3, s, d)
    nh, nw = len(used[1]), len(used[2])
    rows = []
    for kd in range(K3[0]):
        for kh in range(K3[1]):
            for kw in range(K3[2]):
                t = (kd * d[0], kh * d[1], kw * d[2])
                f = ((used[0].index(t[0] % s[0]) * nh + used[1].index(t[1] % s[1])) * nw
                     + used[2].index(t[2] % s[2]))
                rows.append((f, t[0] // s[0], t[1] // s[1], t[2] // s[2],
                             len(used[0]) * nh * nw))
    tab = np.array(rows, dtype=np.int64)
    tab.flags.writeable = False
    return tab, used


@inlined
def _all_rows(apk, bl, tb0, tb1, c, cc, M, P, K, T, scr, bias, mode):
    """Every row block's chains on a task's packed panel ``bl`` (the tiles ``tb0 ..
    tb1-1`` of a product with ``P`` columns, output row ``m`` at ``c[cc + m*P]``), in
    groups of the GEMM's row panels, each followed by its epilogue; returns the number of
    non-finite outputs."""
    nmb = (M + _CB - 1) // _CB
    bpp = _MC // _CB
    nbad = 0
    for b0 in range(0, nmb, bpp):
        b1 = min(nmb, b0 + bpp)
        # bl holds tiles tb0.. only: offset so that tile tb0 starts at bl[0]
        # (packed: no chunk buffer); interior tiles finished in registers, then the edges
        nbad += _panel(apk, K * _CB, _CB, 1, apk[:0], bl, -tb0 * K * T, T, K * T, c, cc, P,
                       M, P, K, T, b0, b1, tb0, tb1, scr, scr[:0], bias, mode)
        nbad += _finish(c, cc, P, M, P, T, b0, b1, tb0, tb1, scr, bias, mode)
    return nbad


def _iterations(N, P, T, tpp):
    """Tasks of :func:`conv_gemm_tasks`: batch elements x panels of ``tpp`` tiles."""
    return N * -(-(-(-P // T)) // tpp)


@span_kernel(iterations=lambda x5, c0, Cg, geo, tab, apk, M, T, tpp, *rest:
             _iterations(x5.shape[0], geo[12] * geo[13] * geo[14], T, tpp),
             work=lambda x5, c0, Cg, geo, tab, apk, M, *rest:
             x5.shape[0] * Cg * int(geo[9] * geo[10] * geo[11] * geo[12] * geo[13] * geo[14])
             * M // 16)
def conv_gemm_tasks(x5, c0, Cg, geo, tab, apk, M, T, tpp, c, cstep, bias, mode, bad, xbad,
                    t0, t1):
    """``c_i [M, P] = W @ X_i (+ bias[m])`` for every batch element ``i`` of ``x5``
    (``X_i`` as :func:`_pack_panel` defines it; ``W [M, K]`` packed in ``apk`` as for
    :func:`.gemm_f64.gemm_tiled`; output row ``m`` of batch element ``i`` at
    ``c[i*cstep + m*P]``).  A span kernel over (batch element, panel of ``tpp`` tiles of
    ``T`` columns): each task unfolds its panel once, into its own buffer, then runs every
    row block's chains on it (all chunks of an output in one task, in k order) and the
    epilogue; ``bad[t]`` / ``xbad[t]`` = the number of non-finite outputs / packed input
    elements of task ``t``.  With a table ``tab`` (not empty) ``x5`` is the input's
    zero-padded stride phases and :func:`_pack_split` unfolds the panels instead."""
    P = geo[12] * geo[13] * geo[14]
    K = Cg * geo[9] * geo[10] * geo[11]
    ntile = (P + T - 1) // T
    pn = (ntile + tpp - 1) // tpp
    bpp = _MC // _CB                     # row blocks per panel, as in gemm_tiled
    edges = M % _CB != 0 or P % T != 0
    for t in range(t0, t1):
        i = t // pn
        tb0 = (t - i * pn) * tpp
        tb1 = min(ntile, tb0 + tpp)
        bl = np.empty((tb1 - tb0) * K * T)
        if tab.shape[0]:
            xbad[t] = _pack_split(x5, i, c0, Cg, tab, geo, tb0 * T, min(P, tb1 * T), T, bl)
        else:
            xbad[t] = _pack_panel(x5, i, c0, Cg, geo, tb0 * T, min(P, tb1 * T), T, bl)
        scr = np.empty(((tb1 - tb0) + bpp) * _CB * T if edges else 0)
        bad[t] = _all_rows(apk, bl, tb0, tb1, c, i * cstep, M, P, K, T, scr, bias, mode)


# --------------------------------------------------------------------------- pointwise
# An unpadded 1x1 kernel needs no unfolding: ``X_ng`` is the group's channel planes of the
# input themselves (at stride 1; at larger strides the subsampled planes), a C-contiguous
# ``[Cg, P]`` block of each batch element, so a task's panel is packed by plain copies
# of contiguous runs of T positions.  (Reading the b tiles in place instead, at the
# plane's row stride, was slower: 1x1 256->64 @56, AVX-512, 10.6-11.6 vs 8.5-9.0 ms; the
# rows of a tile's k chunk then share few L1 sets.)
@span_kernel(iterations=lambda xf, xoff, xstep, K, P, apk, M, T, tpp, *rest:
             (xf.shape[0] // xstep) * -(-(-(-P // T)) // tpp),
             work=lambda xf, xoff, xstep, K, P, apk, M, *rest:
             (xf.shape[0] // xstep) * K * P * M // 16)
def pointwise_tasks(xf, xoff, xstep, K, P, apk, M, T, tpp, c, cstep, bias, mode, bad, t0, t1):
    """``c_i [M, P] = W @ X_i (+ bias[m])`` for every batch element ``i``, ``X_i [K, P]``
    at ``xf[xoff + i*xstep + k*P + p]`` (``W`` packed in ``apk`` as for
    :func:`.gemm_f64.gemm_tiled`; output row ``m`` of batch element ``i`` at
    ``c[i*cstep + m*P]``).  Tasks: (batch element, panel of ``tpp`` tiles of ``T``
    columns); each packs its panel (zero columns past P), runs every row block's chains
    on it (all chunks of an output in one task, in k order), then the epilogue;
    ``bad[t]`` = the non-finite outputs of task ``t``."""
    ntile = (P + T - 1) // T
    pn = (ntile + tpp - 1) // tpp
    bpp = _MC // _CB
    uT = np.uint64(T)
    uK = np.uint64(K)
    for t in range(t0, t1):
        i = t // pn
        tb0 = (t - i * pn) * tpp
        tb1 = min(ntile, tb0 + tpp)
        base = xoff + i * xstep
        bl = np.empty((tb1 - tb0) * K * T)
        width = min(P, tb1 * T) - tb0 * T
        for k in range(uK):
            src = np.uint64(base + tb0 * T) + k * np.uint64(P)
            if k + np.uint64(_AHEAD) < uK:
                # the run _AHEAD rows on: each row is a new stream a plane away, which the
                # hardware prefetchers meet cold (256->64 @56, batch 8, x from memory:
                # AVX-512 6.1-7.2 -> 5.4-5.9 ms, AVX2 12.2-13.7 -> 10.6-11.5 ms; now as
                # fast as with x in L3)
                nxt = src + np.uint64(_AHEAD * P)
                for q in range(0, width, 8):
                    prefetch_read(xf, nxt + np.uint64(q))
                prefetch_read(xf, nxt + np.uint64(width - 1))
            for tl in range(np.uint64(tb1 - tb0)):
                dst = (tl * uK + k) * uT
                s0 = src + tl * uT
                w = min(uT, np.uint64(P - tb0 * T) - tl * uT)
                for q in range(w):
                    bl[dst + q] = xf[s0 + q]
                for q in range(w, uT):
                    bl[dst + q] = 0.0
        scr = np.empty(((tb1 - tb0) + bpp) * _CB * T if M % _CB or P % T else 0)
        bad[t] = _all_rows(apk, bl, tb0, tb1, c, i * cstep, M, P, K, T, scr, bias, mode)


@span_kernel(iterations=lambda xf, plane, geo, out, bad: bad.shape[0],
             work=lambda xf, plane, geo, out, bad: xf.shape[0])
def subsample_planes(xf, plane, geo, out, bad, t0, t1):
    """For the planes ``q = t0 .. t1-1`` of ``xf`` (``plane`` elements each, ``[D, H,
    W]``; ``geo`` = int64 ``[sd, sh, sw, H, W, OD, OH, OW]``): ``out[q, od, oh, ow] =
    x[q, od*sd, oh*sh, ow*sw]`` (flat, C order; a copy), and ``bad[q]`` = how many
    elements of the whole input plane are NaN/inf (every element, read or not)."""
    sd, sh, sw = geo[0], geo[1], geo[2]
    H, W = geo[3], geo[4]
    OD, OH, OW = geo[5], geo[6], geo[7]
    op = OD * OH * OW
    for q in range(t0, t1):
        src = xf[q * plane:(q + 1) * plane]
        cnt = 0
        for e in range(plane):
            v = src[e]
            cnt += (v - v) != 0.0
        bad[q] = cnt
        o = q * op
        for od in range(OD):
            for oh in range(OH):
                base = (od * sd * H + oh * sh) * W
                for ow in range(OW):
                    out[o + ow] = src[base + ow * sw]
                o += OW


def _pointwise(x5, w5, bias, has_bias, groups, s, out5):
    """An unpadded 1x1 convolution by :func:`pointwise_tasks`; ``None`` when ``x5`` is
    not C-contiguous (the unfolding path then runs), else ``(finite, x_finite)`` as
    :func:`conv_gemm`."""
    N, Cin = x5.shape[:2]
    O = out5.shape[2:]
    P = O[0] * O[1] * O[2]
    T = G.tile_width(P)
    if not x5.flags.c_contiguous:
        return None
    x_ok = None
    if tuple(s) != (1, 1, 1):
        D, H, W = x5.shape[2:]
        xs = G._workspace("pointwise", N * Cin * P)
        bad = np.zeros(N * Cin, dtype=np.int64)
        subsample_planes(x5.reshape(-1), D * H * W,
                         np.array(tuple(s) + (H, W) + tuple(O), dtype=np.int64), xs, bad)
        x_ok = not bad.any()
        xf = xs
    else:
        xf = x5.reshape(-1)
    Cout, Cg = w5.shape[:2]
    Cog = Cout // groups
    w2 = w5.reshape(Cout, Cg)
    if (x_ok is None and Cg * P <= _IN_PLACE_MAX
            and G.b_in_place(xf[:Cg * P].reshape(Cg, P), Cog, P, Cg)):
        out_bad = _planes_in_place(xf, w2, bias, has_bias, groups, N, P, out5)
    else:
        tpp = max(1, _PANEL // T)
        ntile = -(-P // T)
        tpp = -(-ntile // -(-ntile // tpp))      # equal panels
        tasks = N * -(-ntile // tpp)
        c = out5.reshape(-1)
        out_bad = 0
        for g in range(groups):
            apk = G.pack_a(w2[g * Cog:(g + 1) * Cog], Cog * Cg < (1 << 16))
            b = bias[g * Cog:(g + 1) * Cog] if has_bias else np.zeros(1)
            bad = np.zeros(tasks, dtype=np.int64)
            pointwise_tasks(xf, g * Cg * P, Cin * P, Cg, P, apk, Cog, T, tpp, c[g * Cog * P:],
                            Cout * P, b, 1 if has_bias else 0, bad)
            out_bad += int(bad.sum())
    if x_ok is None:
        # every element was read: a NaN/inf input makes its column's outputs non-finite
        x_ok = True if out_bad == 0 else None
    return out_bad == 0, x_ok


def _planes_in_place(xf, w2, bias, has_bias, groups, N, P, out5):
    """:func:`_pointwise`'s products at a unit stride where the float GEMM reads each
    image's channel planes where they lie (:func:`.gemm_f64.b_in_place`: few output
    channels per group; planes of at most ``_IN_PLACE_MAX`` elements per image) instead
    of copying them into panels: per image and group one
    product ``w [Cog, Cg] @ x [Cg, P]`` plus the bias per row, each output the same chain
    (one fused multiply-add per input channel, in order, then the bias), so the same bits.
    All images of a group run in one launch (the GEMM's batch of products), so the tasks
    balance across images.  Returns the number of non-finite outputs.  Zen 4, two
    threads, 1x1 256->64 @56 batch 8: 10.3 against 11.0-11.2 ms on 512-bit tiles, the
    same on 256-bit ones; one launch instead of one per image (Intel Xeon, five / three
    alternating process pairs): AVX-512 10.0-10.95 -> 9.7-10.2 ms, AVX2 16.5-19.3 ->
    14.0-16.9 ms."""
    Cog = w2.shape[0] // groups
    Cg = w2.shape[1]
    Cout = Cog * groups
    T = G.tile_width(P)
    c = out5.reshape(-1)
    out_bad = 0
    for g in range(groups):
        wg = np.ascontiguousarray(w2[g * Cog:(g + 1) * Cog])
        bg = bias[g * Cog:(g + 1) * Cog] if has_bias else None
        # every image in one launch (the GEMM's batch: b_i the image's planes, c_i its
        # output channels; one set of tasks, balanced across the images, instead of one
        # launch and one wait per image)
        out_bad += G.run_tiled(None, xf[g * Cg * P:], Cg * groups * P, c[g * Cog * P:],
                               Cout * P, P, Cog, P, Cg, T, N, bg, 0, True,
                               G.a_operand(wg), P)
    return out_bad


def applies(Cog, tiled):
    """Whether this path can compute a convolution: at least one whole row block of the
    GEMM (6 output channels) per group and the register-tiled GEMM on this machine."""
    return bool(tiled) and Cog >= _CB


#: Output planes of at most this many positions run here when each output has at least
#: :data:`DEEP_TERMS` terms (every ISA; on 7x7 planes, two threads, AVX-512 / AVX2 ms:
#: 3x3 512->512 75 / 84 here vs 99 / 92 on the wide-tile kernel, 1x1 512->2048 18 / 30 vs
#: 25 / 39; but 3x3 16->32 @8, batch 64: 4.7 vs 1.5 on the row kernel).
SMALL_PLANE = 64
DEEP_TERMS = 256
#: Unpadded 1x1 kernels run here on every ISA, strided or not (:func:`pointwise_tasks`;
#: two threads, 2026-12-03, AVX-512 / AVX2 ms: 1x1 256->64 @56 batch 8 8.5-10 / 13.9-14.7
#: vs 11.1-12.6 / 14.3-18.2 on the fused-window row kernel; stride 2 256->512 @56 17 /
#: 22.7-23 vs 26-29 / 25-27, and vs 19 on AVX-512's unfolding GEMM).
#: Strided kernels with at least this many terms per output run here with 512-bit tiles
#: (unfolded from the stride phases; 3x3 s2 64->128 @56: 8.9 vs 9.8-11.4 ms on the row
#: kernel; with AVX2 12.9 vs 11.9, so not there; 3x3 s2 32->64 @32, 288 terms: 1.1 vs 0.8).
STRIDED_TERMS = 512
#: With 256-bit tiles, output planes up to this many positions run here when each output
#: has at least :data:`MIDPLANE_TERMS` terms (3x3 256->256 @14: 21.1 vs 23.6-25.2 ms on
#: the wide-tile kernel); with 512-bit tiles only where the row kernel would not take
#: them (rows of whole vectors or of 16 and more): the wide-tile kernel they would get measured
#: a tie on a Zen 5 (3x3 256->256 @14: 17.2 vs 16.6 ms) but slower on a Zen 4, whose
#: AVX-512 runs on 256-bit units (2026-12-05, two threads, gemm vs wide: 256->256 @14
#: 20.1-20.3 vs 21.8-22.3 ms, 256->128 @12 8.4-8.6 vs 10.3-10.5, 512->512 @14 batch 4
#: 51.8-52.5 vs 52.6-54.3; @16 the row kernel stays ahead: 256->256 23.5 vs 24.6-25.7).
MIDPLANE = 256
MIDPLANE_TERMS = 1024


def preferred(Cg, K3, O, strided, padded, wide512, rows=False):
    """Whether the plan runs an applicable convolution with ``Cg`` input channels per
    group, kernel extents ``K3`` and output extents ``O`` here (``strided``: a stride
    above 1; ``wide512``: 512-bit register tiles; ``rows``: the plan's row kernel would
    take it otherwise): see :data:`SMALL_PLANE`, :data:`STRIDED_TERMS`, :data:`MIDPLANE`
    (with 512-bit tiles only where ``rows`` is false); and every unpadded 1x1 kernel."""
    P = O[0] * O[1] * O[2]
    terms = Cg * K3[0] * K3[1] * K3[2]
    if P <= SMALL_PLANE and terms >= DEEP_TERMS:
        return True
    if tuple(K3) == (1, 1, 1) and not padded:
        return True
    midplane = P <= MIDPLANE and terms >= MIDPLANE_TERMS
    if wide512:
        return (bool(strided) and terms >= STRIDED_TERMS) or (midplane and not rows)
    return midplane


def conv_gemm(x5, w5, bias, has_bias, groups, s, d, pads, out5):
    """``out5 = conv(x5, w5) (+ bias)`` (rank-5 C-contiguous float64 arrays; strides
    ``s``, dilations ``d``, zero padding ``pads``; at least 6 output channels per group).
    Returns ``(finite, x_finite)``: whether every output is finite (always checked), and
    whether every element of ``x5`` is: False when an element read is NaN/inf; True for
    an unpadded unstrided 1x1 kernel (every element is read); else None."""
    K3 = w5.shape[2:]
    if tuple(K3) == (1, 1, 1) and not any(pads):
        done = _pointwise(x5, w5, bias, has_bias, groups, s, out5)
        if done is not None:
            return done
    N = x5.shape[0]
    Cout, Cg = w5.shape[:2]
    Cog = Cout // groups
    O = out5.shape[2:]
    P = O[0] * O[1] * O[2]
    K = Cg * K3[0] * K3[1] * K3[2]
    T = G.tile_width(P)
    # tiles per task: ~256 positions, fewer for deep kernels so the panel stays in L2
    tpp = max(1, min(_PANEL, _PANEL_ELEMS // K) // T)
    ntile = -(-P // T)
    tpp = -(-ntile // -(-ntile // tpp))      # equal panels (25 tiles: 7+6+6+6, not 8+8+8+1)
    tasks = _iterations(N, P, T, tpp)
    geo = np.array(tuple(s) + tuple(d) + tuple(pads) + tuple(K3) + tuple(O), dtype=np.int64)
    x_split = None
    if tuple(s) != (1, 1, 1) or any(pads):
        # unfold from the zero-padded stride phases: contiguous runs, no bounds tests
        from .conv import pad_split
        tab, used = _split_table(K3, s, d)
        S = x5.shape[2:]
        grid = tuple(-(-(S[a] + 2 * pads[a]) // s[a]) for a in range(3))
        xq = np.empty((N, x5.shape[1] * int(tab[0, 4])) + grid)
        copied = pad_split(x5, pads[0], pads[1], pads[2], s[0], s[1], s[2],
                           *(np.asarray(u, dtype=np.int64) for u in used), xq)
        # every residue used: the split copied (and checked) every element of x
        x_split = bool(copied) if int(tab[0, 4]) == s[0] * s[1] * s[2] else None
        if x_split is False:
            return None, False
        src = xq
    else:
        tab = _NO_TAB
        src = x5
    w2 = w5.reshape(Cout, K)
    c = out5.reshape(-1)
    out_bad = x_bad = 0
    for g in range(groups):
        apk = G.pack_a(w2[g * Cog:(g + 1) * Cog], Cog * K < (1 << 16))
        b = bias[g * Cog:(g + 1) * Cog] if has_bias else np.zeros(1)
        bad = np.zeros(tasks, dtype=np.int64)
        xbad = np.zeros(tasks, dtype=np.int64)
        conv_gemm_tasks(src, g * Cg, Cg, geo, tab, apk, Cog, T, tpp, c[g * Cog * P:],
                        Cout * P, b, 1 if has_bias else 0, bad, xbad)
        out_bad += int(bad.sum())
        x_bad += int(xbad.sum())
    if x_split is not None or tab is not _NO_TAB:
        return out_bad == 0, x_split
    if x_bad:
        return out_bad == 0, False
    every = tuple(K3) == (1, 1, 1) and tuple(s) == (1, 1, 1) and not any(pads)
    return out_bad == 0, (True if every else None)
