"""Pointwise (1x1, unpadded) convolutions as GEMMs: ``out[n, g] = W_g @ X_ng`` per batch
element ``n`` and group ``g``, with ``W_g [Cout/groups, Cin/groups]`` and ``X_ng`` the
group's input channels at the strided output positions, ``[Cin/groups, OD*OH*OW]``.

The convolution's specification -- ``bias + (fused multiply-add chain over the input
channels ci' in order, from 0.0)`` -- is exactly :mod:`.gemm_f64`'s chain followed by its
bias step, so this path gives the bits of every other convolution path.  What it adds
over the row kernel of :mod:`.conv` for these shapes: the K-blocking of the GEMM (a 1x1
kernel reads each input element once per output channel block, so the row kernel's
window of all input channels does not stay in L1), and tasks over the whole batch (one
GEMM per image leaves two threads with 7 tasks each for a 64 x 3136 output).

:func:`pack_pointwise` packs the strided input of a batch chunk into the GEMM's ``b``
panels (checking every element it reads for NaN/inf); :func:`.gemm_f64.run_tiled` runs
the chains, adds the bias per output channel and counts non-finite outputs.
"""

import numpy as np

from . import gemm_f64 as G
from ._jit import helper, span_kernel
from .gemm_f64 import _finish, _panel

_EXP = np.uint64(0x7FF0000000000000)     # exponent field: all ones only for NaN/inf


@helper
def _pack_panel(x5, i, c0, Cg, sd, sh, sw, OH, OW, p0, p1, T, bl):
    """``b [Cg, P]`` of batch element ``i`` (``b[k, p] = x5[i, c0+k, od*sd, oh*sh,
    ow*sw]``, ``p = (od*OH + oh)*OW + ow``), columns ``p0 .. p1-1`` only, packed as
    :func:`.gemm_f64.gemm_tiled` reads it: ``bl [ceil((p1-p0)/T), Cg, T]``, zero columns
    past ``p1``; returns how many of the packed elements are NaN/inf (an integer test
    of the exponent bits over the packed panel, in cache).  A copy: no arithmetic.  At
    stride 1 a channel's positions are one contiguous run of ``x5``; else they are
    copied output row by output row."""
    step = Cg * T
    ntl = (p1 - p0 + T - 1) // T
    for k in range(Cg):
        if sd == 1 and sh == 1 and sw == 1:
            xf = x5[i, c0 + k].ravel()
            for tl in range(ntl):
                q0 = p0 + tl * T
                w = min(T, p1 - q0)
                base = tl * step + k * T
                for q in range(w):
                    bl[base + q] = xf[q0 + q]
                for q in range(w, T):
                    bl[base + q] = 0.0
            continue
        tb = k * T
        lane = 0
        p = p0
        od = p0 // (OH * OW)
        oh = (p0 // OW) % OH
        ow = p0 % OW
        while p < p1:
            run = min(T - lane, OW - ow, p1 - p)
            xr = x5[i, c0 + k, od * sd, oh * sh]
            for q in range(run):
                bl[tb + lane + q] = xr[(ow + q) * sw]
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
        if lane:
            for q in range(lane, T):
                bl[tb + q] = 0.0
    bits = bl.view(np.uint64)
    cnt = 0
    for q in range(bits.size):
        cnt += (bits[q] & _EXP) == _EXP
    return cnt


def _iterations(N, P, T, tpp):
    """Iterations of :func:`pointwise_gemm`: batch elements x panels of ``tpp`` tiles."""
    return N * -(-(-(-P // T)) // tpp)


@span_kernel(iterations=lambda x5, c0, Cg, sd, sh, sw, OD, OH, OW, apk, M, T, tpp, *rest:
             _iterations(x5.shape[0], OD * OH * OW, T, tpp),
             work=lambda x5, c0, Cg, sd, sh, sw, OD, OH, OW, apk, M, *rest:
             x5.shape[0] * Cg * OD * OH * OW * M // 16)
def pointwise_gemm(x5, c0, Cg, sd, sh, sw, OD, OH, OW, apk, M, T, tpp, c, cstep, bias, mode,
                   bad, xbad, t0, t1):
    """``c_i [M, P] = W @ b_i (+ bias[m])`` for every batch element ``i`` of ``x5`` (``b_i``
    as :func:`_pack_panel` defines it; ``W [M, Cg]`` packed in ``apk`` as for
    :func:`.gemm_f64.gemm_tiled`; output row ``m`` of batch element ``i`` at
    ``c[i*cstep + m*P]``).  A span kernel over (batch element, panel of ``tpp`` tiles of
    ``T`` columns): each iteration packs its panel of ``b_i`` once, into its own buffer
    (which stays in L2), then runs every row block's chains on it
    (:func:`.gemm_f64._panel`, all chunks of one output in one iteration, in k order) and
    the epilogue (:func:`.gemm_f64._finish`); ``bad[t]`` / ``xbad[t]`` = the number of
    non-finite outputs / input elements read by iteration ``t``."""
    P = OD * OH * OW
    ntile = (P + T - 1) // T
    pn = (ntile + tpp - 1) // tpp
    nmb = (M + 5) // 6
    bpp = 16
    edges = M % 6 != 0 or P % T != 0
    for t in range(t0, t1):
        i = t // pn
        tb0 = (t - i * pn) * tpp
        tb1 = min(ntile, tb0 + tpp)
        bl = np.empty((tb1 - tb0) * Cg * T)
        xbad[t] = _pack_panel(x5, i, c0, Cg, sd, sh, sw, OH, OW, tb0 * T, min(P, tb1 * T), T, bl)
        scr = np.empty(((tb1 - tb0) + bpp) * 6 * T if edges else 0)
        nbad = 0
        for b0 in range(0, nmb, bpp):
            b1 = min(nmb, b0 + bpp)
            # bl holds tiles tb0.. only: offset so that tile tb0 starts at bl[0]
            _panel(apk, bl, -tb0 * Cg * T, c, i * cstep, P, M, P, Cg, T, b0, b1, tb0, tb1, scr)
            nbad += _finish(c, i * cstep, P, M, P, T, b0, b1, tb0, tb1, scr, bias, mode)
        bad[t] = nbad


def applies(K3, padded, Cog, tiled):
    """Whether this path computes the convolution: a 1x1(x1) kernel without padding
    (dilation is then irrelevant), at least 6 output channels per group (a whole row
    block of the GEMM), and the register-tiled GEMM on this machine."""
    return bool(tiled) and tuple(K3) == (1, 1, 1) and not padded and Cog >= 6


#: Largest output plane (positions) on which the plan prefers this path at stride 1: on
#: large planes the row kernel streams the input better (1x1 256->64 and 64->256 @56:
#: 20-25 ms vs 25-38 ms here, one AVX-512 core); on small planes and at strides > 1 this
#: path is faster (512->2048 @7: 38 vs 247 ms; 128->512 @28: 29 vs 36; 256->512 stride
#: 2 @56: 46 vs 62).
PREFERRED_PLANE = 1024


def preferred(O, strided):
    """Whether the plan runs an applicable pointwise convolution with output extents
    ``O`` here (see :data:`PREFERRED_PLANE`)."""
    return strided or O[0] * O[1] * O[2] <= PREFERRED_PLANE


def conv_pointwise(x5, w5, bias, has_bias, groups, s, out5):
    """``out5 = conv(x5, w5) (+ bias)`` for a pointwise convolution (see :func:`applies`;
    rank-5 C-contiguous float64 arrays, strides ``s``).  Returns ``(finite, x_finite)``:
    whether every output is finite (always checked), and whether every element of ``x5``
    is (False when an element read is NaN/inf; True at stride 1, where every element is
    read; else None)."""
    N, C = x5.shape[:2]
    Cout, Cg = w5.shape[:2]
    Cog = Cout // groups
    OD, OH, OW = out5.shape[2:]
    P = OD * OH * OW
    T = G.tile_width(P)
    # panels of ~256 columns: an iteration's packed panel (Cg x 256) stays in L2, and a
    # batch of 64 x 3136 outputs makes 13 iterations per image
    tpp = max(1, 256 // T)
    tasks = _iterations(N, P, T, tpp)
    w2 = w5.reshape(Cout, Cg)
    c = out5.reshape(-1)
    out_bad = x_bad = 0
    for g in range(groups):
        apk = G.pack_a(w2[g * Cog:(g + 1) * Cog], Cog * Cg < (1 << 16))
        b = bias[g * Cog:(g + 1) * Cog] if has_bias else np.zeros(1)
        bad = np.zeros(tasks, dtype=np.int64)
        xbad = np.zeros(tasks, dtype=np.int64)
        pointwise_gemm(x5, g * Cg, Cg, s[0], s[1], s[2], OD, OH, OW, apk, Cog, T, tpp,
                       c[g * Cog * P:], Cout * P, b, 1 if has_bias else 0, bad, xbad)
        out_bad += int(bad.sum())
        x_bad += int(xbad.sum())
    if x_bad:
        return out_bad == 0, False
    return out_bad == 0, (True if tuple(s) == (1, 1, 1) else None)
