"""Convolutions on small planes as one GEMM over the whole batch, batch index innermost.

On small output planes (the deep layers of a network: 4x4, 7x7) every other path runs
short rows: a row kernel's or ``col2im``'s inner loop has ``OW`` (4 .. 7) iterations, and
a GEMM per batch element has ``P = OD*OH*OW`` columns.  Here the columns of the unfolded
input are ordered ``j = o*N + n`` (output position ``o``, batch element ``n``; "batch
minor"), so that

* the forward convolution is ``Y[co, j] = bias[co] + W_g[co, :] . X[:, j]`` per group:
  one GEMM with ``P*N`` columns, whose every output is the convolution's specified chain
  (fused multiply-adds over the terms ``(ci', kd, kh, kw)`` in that order from +0.0, then
  the bias; see :mod:`.conv_gemm`) -- the order of the columns never enters a chain, so
  the bits are those of every other forward path;
* the input gradient's ``dcols = W_g^T G`` has the same columns, and folding it back
  (:func:`fold`, the adjoint of the unfold) adds whole runs of ``N`` contiguous values:
  for every input element the terms arrive in the tap order ``(kd, kh, kw)`` from +0.0
  (at most one output position per tap reads an element), exactly as in
  :func:`.backward.col2im` -- the same bits again.

The input is first copied, zero-padded and transposed to ``[C, Dp, Hp, Wp, N]``
(:func:`pad_transpose`), so that :func:`pack` copies runs of ``N`` contiguous values
straight into the GEMM's packed ``b`` layout; the result ``[Cout, P*N]`` is transposed
back by :func:`untranspose`.  (The weight gradient keeps the ``(n, o)`` order of its
chains: :mod:`.conv_wgrad`.)
"""

import functools

import numpy as np

from ._jit import span_kernel
from .views import readonly
from .gemm_f64 import _CB, _pack_b, _workspace, a_placed, run_tiled, tile_width

_MAX_POSITIONS = 49      # output planes up to this many positions (7x7) take this path
_MIN_COLUMNS = 64        # ... when P*N gives at least this many GEMM columns
_MIN_TERMS = 256         # ... and each output sums at least this many terms (Cg*K)
_GRAD_MAX_POSITIONS = 64  # the input gradient: planes up to 8x8 (col2im's rows are short)


def applies(cog, tiled):
    """Whether this path can compute a convolution with ``cog`` output channels per group
    (register tiles and one 6-row block of them)."""
    return tiled and cog >= _CB


def usable(cog, terms, P, N, tiled):
    """Whether this path is the plan for the forward convolution with ``cog`` output
    channels per group, ``terms = Cg*K`` terms per output, ``P`` output positions per
    image and a batch of ``N`` (register tiles, one 6-row block of output channels, small
    planes, enough columns, enough terms; measured on one core: 3x3 512->512 @7 batch 8
    1.2x (AVX-512) / 1.4x (AVX2) the per-image GEMM, 128->128 @7 1.3x / 1.5x; 3x3
    16->32 @4x4 batch 64 (144 terms) ties with the wide kernel on AVX-512 and is 0.9x
    on AVX2; 8x8 planes and few terms are faster on the row kernel)."""
    return (applies(cog, tiled) and 0 < P <= _MAX_POSITIONS and P * N >= _MIN_COLUMNS
            and terms >= _MIN_TERMS)


def grad_usable(terms, P, N, tiled):
    """Whether :func:`input_gradient` is the plan for the input gradient (``terms = Cg*K``
    rows of ``W_g^T``: at least one 6-row block; planes up to ``_GRAD_MAX_POSITIONS``
    positions, enough columns)."""
    return (tiled and terms >= _CB and 0 < P <= _GRAD_MAX_POSITIONS
            and P * N >= _MIN_COLUMNS)


@span_kernel(iterations=lambda x5, pd, ph, pw, xt: xt.shape[0],
             work=lambda x5, pd, ph, pw, xt: xt.size)
def pad_transpose(x5, pd, ph, pw, xt, t0, t1):
    """``xt[c, pd + d, ph + h, pw + w, n] = x5[n, c, d, h, w]``, zero elsewhere: the
    zero-padded input, batch index innermost.  A span kernel over channels ``c``."""
    N, _, D, H, W = x5.shape
    Dp, Hp, Wp = xt.shape[1], xt.shape[2], xt.shape[3]
    uN = np.uint64(N)
    for c in range(t0, t1):
        plane = xt[c].reshape(-1)
        for q in range(np.uint64(plane.shape[0])):
            plane[q] = 0.0
        for n in range(N):
            src = x5[n, c]
            un = np.uint64(n)
            for d in range(D):
                for h in range(H):
                    row = src[d, h]
                    base = np.uint64(((d + pd) * Hp + h + ph) * Wp + pw) * uN + un
                    for w in range(np.uint64(W)):
                        plane[base + w * uN] = row[w]
    return None


@functools.lru_cache(maxsize=64)
def _offsets(C, Dp, Hp, Wp, R, geo):
    """``(toff, poff)`` of :func:`pack` (read-only int64) for ``R`` unfolded rows of a
    padded input ``[C, Dp, Hp, Wp]`` per batch element: each row's offset (channel,
    kernel tap times the dilation) and each output position's (times the stride).  Kept
    per geometry: a training step asks for the same ones every time."""
    kd, kh, kw, sd, sh, sw, dd, dh, dw = geo[:9]
    OD, OH, OW = geo[12], geo[13], geo[14]
    KK = kd * kh * kw
    r = np.arange(R, dtype=np.int64)
    kk = r % KK
    toff = ((r // KK * Dp + kk // (kh * kw) * dd) * Hp + (kk // kw) % kh * dh) * Wp \
        + kk % kw * dw
    o = np.arange(OD * OH * OW, dtype=np.int64)
    poff = ((o // (OH * OW) * sd) * Hp + (o // OW) % OH * sh) * Wp + o % OW * sw
    toff.flags.writeable = False
    poff.flags.writeable = False
    return toff, poff


@span_kernel(iterations=lambda xt, toff, poff, N, T, bpk: -(-(poff.shape[0] * N) // T),
             work=lambda xt, toff, poff, N, T, bpk: bpk.shape[0])
def pack(xt, toff, poff, N, T, bpk, t0, t1):
    """``bpk[tile, k, i] = xt.flat[(toff[k] + poff[o]) * N + n]`` for column ``j = tile*T +
    i = o*N + n < P*N``, 0 past the last column: the batch-minor unfolded input packed as
    :func:`.gemm_f64.gemm_tiled` reads ``b`` (``toff`` the offsets of the terms in one
    padded plane stack, ``poff`` those of the output positions, as in
    :func:`_offsets`).  A span kernel over column tiles."""
    xf = xt.reshape(-1)
    K = toff.shape[0]
    J = poff.shape[0] * N
    uN = np.uint64(N)
    uT = np.uint64(T)
    for tile in range(t0, t1):
        out = np.uint64(tile * K) * uT
        j0 = tile * T
        # the tile's first column as (position, batch element): one division per tile,
        # not per term (a division per term and run took most of the pass: 3x3
        # 512->512 @7, batch 8, AVX2: 4608 x 49 tiles)
        o0 = j0 // N
        n0 = j0 - o0 * N
        for k in range(K):
            dst = out + np.uint64(k) * uT
            tk = np.uint64(toff[k])
            i = 0
            o = o0
            n = n0
            while i < T:
                if j0 + i >= J:
                    for q in range(np.uint64(i), uT):
                        bpk[dst + q] = 0.0
                    break
                run = min(T - i, N - n)
                src = (tk + np.uint64(poff[o])) * uN + np.uint64(n)
                di = dst + np.uint64(i)
                for q in range(np.uint64(run)):
                    bpk[di + q] = xf[src + q]
                i += run
                o += 1
                n = 0
    return None


@span_kernel(iterations=lambda yt, out: yt.shape[0], work=lambda yt, out: yt.size)
def untranspose(yt, out, t0, t1):
    """``out[n, c, p] = yt[c, p*N + n]`` (``yt [C, P*N]``, ``out [N, C, P]``): back to the
    batch-major layout.  A span kernel over channels."""
    N, _, P = out.shape
    uN = np.uint64(N)
    for c in range(t0, t1):
        row = yt[c]
        for n in range(N):
            dst = out[n, c]
            un = np.uint64(n)
            for p in range(np.uint64(P)):
                dst[p] = row[p * uN + un]
    return None


@span_kernel(iterations=lambda g, gt: gt.shape[0], work=lambda g, gt: gt.size)
def transpose(g, gt, t0, t1):
    """``gt[c, p*N + n] = g[n, c, p]`` (``g [N, C, P]``, ``gt [C, P*N]``): the output
    gradient batch minor.  A span kernel over channels."""
    N, _, P = g.shape
    uN = np.uint64(N)
    for c in range(t0, t1):
        row = gt[c]
        for n in range(N):
            src = g[n, c]
            un = np.uint64(n)
            for p in range(np.uint64(P)):
                row[p * uN + un] = src[p]
    return None


@span_kernel(iterations=lambda dcols, geo, scratch, dx: dx.shape[1],
             work=lambda dcols, geo, scratch, dx: dcols.size)
def fold(dcols, geo, scratch, dx, t0, t1):
    """``dx[n, c, q] = sum of dcols[(c, k), o*N + n]`` over the taps ``k = (kd, kh, kw)``
    in that order (from +0.0) whose output position ``o`` reads input position ``q``: the
    adjoint of the unfold, as :func:`.backward.col2im` but on whole runs of ``N``.
    ``geo`` = int64 ``[kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw, OD, OH, OW]``,
    ``scratch [C, D*H*W*N]`` the per-channel accumulator (batch minor).  A span kernel
    over channels."""
    N, C, D, H, W = dx.shape
    kd, kh, kw = geo[0], geo[1], geo[2]
    sd, sh, sw = geo[3], geo[4], geo[5]
    dd, dh, dw_ = geo[6], geo[7], geo[8]
    pd, ph, pw = geo[9], geo[10], geo[11]
    OD, OH, OW = geo[12], geo[13], geo[14]
    KK = kd * kh * kw
    uN = np.uint64(N)
    for c in range(t0, t1):
        acc = scratch[c]
        for q in range(np.uint64(acc.shape[0])):
            acc[q] = 0.0
        for i in range(kd):
            for j in range(kh):
                for k in range(kw):
                    row = dcols[c * KK + (i * kh + j) * kw + k]
                    for od in range(OD):
                        a = od * sd - pd + i * dd
                        if a < 0 or a >= D:
                            continue
                        for oh in range(OH):
                            b = oh * sh - ph + j * dh
                            if b < 0 or b >= H:
                                continue
                            for ow in range(OW):
                                e = ow * sw - pw + k * dw_
                                if e < 0 or e >= W:
                                    continue
                                src = np.uint64(((od * OH + oh) * OW + ow) * N)
                                dst = np.uint64(((a * H + b) * W + e) * N)
                                for n in range(uN):
                                    acc[dst + n] += row[src + n]
        for n in range(N):
            plane = dx[n, c].reshape(-1)
            un = np.uint64(n)
            for q in range(np.uint64(plane.shape[0])):
                plane[q] = acc[q * uN + un]
    return None


def forward(x5, w5, bias, has_bias, groups, s, d, pads, out5):
    """The forward convolution on this path (see the module docstring; requires
    :func:`usable`): ``out5 [N, Cout, OD, OH, OW]`` written.  Returns whether every
    output is finite (the GEMM counts them as it stores them)."""
    N, C, D, H, W = x5.shape
    Cout, Cg = w5.shape[0], w5.shape[1]
    cog = Cout // groups
    K3 = w5.shape[2:]
    O = out5.shape[2:]
    P = O[0] * O[1] * O[2]
    J = P * N
    Dp, Hp, Wp = D + 2 * pads[0], H + 2 * pads[1], W + 2 * pads[2]
    xt = np.empty((C, Dp, Hp, Wp, N))
    pad_transpose(x5, pads[0], pads[1], pads[2], xt)
    xt = readonly(xt)
    geo = tuple(K3) + tuple(s) + tuple(d) + tuple(pads) + tuple(O)
    R = Cg * K3[0] * K3[1] * K3[2]
    toff, poff = _offsets(C, Dp, Hp, Wp, R, geo)
    T = tile_width(J)
    w2 = np.ascontiguousarray(w5.reshape(Cout, R))
    yt = np.empty((Cout, J))
    flat = yt.reshape(-1)
    bad = 0
    for gi in range(groups):
        bpk = _workspace("b", -(-J // T) * R * T)
        pack(xt, readonly(toff + gi * Cg * Dp * Hp * Wp) if gi else toff, poff, N, T, bpk)
        rows = slice(gi * cog, (gi + 1) * cog)
        # the weights read where they lie (a_operand: C-contiguous rows; a pass less
        # over them, 1.7 of the 31 ms of a 3x3 512->512 @7, batch 8, AVX2), else packed
        # (serial below 64 Ki weights: a parallel launch costs more than the copy)
        apk, a_where = a_placed(w2[rows], cog * R < (1 << 16))
        bad += run_tiled(apk, bpk, 0, flat[gi * cog * J:], 0, J, cog, J, R, T, 1,
                         bias[rows] if has_bias else None, 0, True, a_where)
    untranspose(yt, out5.reshape(N, Cout, P))
    return bad == 0


def input_gradient(g, w, groups, geo, dx):
    """``dx [N, C, D, H, W]`` (written) of a convolution with weights ``w [Cout, Cg,
    ...]`` from the output gradient ``g [N, Cout, P]`` (C-contiguous), ``geo`` as in
    :func:`fold`: ``dcols = W_g^T G`` per group on the batch-minor columns, then
    :func:`fold`.  The same bits as the im2col path (``matmul(W_g^T, G)`` then
    ``col2im``)."""
    N, Cout, P = g.shape
    C = dx.shape[1]
    cog = Cout // groups
    R = w.size // Cout
    J = P * N
    gt = np.empty((Cout, J))
    transpose(readonly(g), gt)
    w2 = w.reshape(Cout, R)
    dcols = np.empty((groups * R, J))
    T = tile_width(J)
    for gi in range(groups):
        rows = slice(gi * cog, (gi + 1) * cog)
        bpk = _workspace("b", -(-J // T) * cog * T)
        # b = gt's group rows [cog, J], packed as gemm_f64.gemm packs a C-contiguous b
        _pack_b.when_small(cog * J < (1 << 16))(readonly(gt[rows]), bpk, cog, T)
        # W_g^T read along its columns where a_operand allows
        apk, a_where = a_placed(w2[rows].T, R * cog < (1 << 16))
        run_tiled(apk, bpk, 0, dcols[gi * R:(gi + 1) * R].reshape(-1), 0, J, R, J, cog, T, 1,
                  None, 0, False, a_where)
    scratch = np.empty((C, dx[0, 0].size * N))
    fold(readonly(dcols), np.array(geo, dtype=np.int64), scratch, dx)
    return dx
