"""The weight gradient of a convolution on the register-tiled GEMM, without im2col.

``dw[co, (c', k)] = sum over (n, o) of G[co, (n, o)] * cols[(c', k), (n, o)]`` per group,
``cols`` the unfolded input (:func:`.backward.im2col`): each output one fused
multiply-add chain over ``(n, o)`` in order from +0.0, exactly what
:func:`.gemm_f64.matmul` computes for ``G @ cols.T`` -- so the same bits as the im2col
path on every target.  Here ``cols.T`` is never materialised: :func:`unfold_packed`
writes the unfolded input straight into the packed layout in which
:func:`.gemm_f64.gemm_tiled` reads its ``b`` operand (``[ceil(R/T), N*P, T]``), one
(tile, batch element) piece per task, and ``G``'s rows are packed as its ``a``.  That
skips writing ``cols`` (``C*K x N*P``) and reading it again, transposed, to pack it.
"""

import functools

import numpy as np

from ._jit import span_kernel
from .views import readonly
from .gemm_f64 import _CB, _workspace, pack_a, run_tiled, tile_width


@span_kernel(iterations=lambda xp, toff, poff, T, bpk: -(-toff.shape[0] // T) * xp.shape[0],
             work=lambda xp, toff, poff, T, bpk: bpk.shape[0])
def unfold_packed(xp, toff, poff, T, bpk, t0, t1):
    """``bpk[tile, n*P + o, i] = xp[n].flat[poff[o] + toff[r]]`` for ``r = tile*T + i <
    R`` and 0 for ``r >= R``: the unfolded input's transpose packed as
    :func:`.gemm_f64.gemm_tiled`'s ``b``.  ``xp [N, ...]`` is the zero-padded input
    (C-contiguous), ``toff [R]`` each unfolded row's offset in one padded batch element
    (channel and kernel tap times the dilation), ``poff [P]`` each output position's
    (times the stride).  A span kernel over (tile, batch element) pieces, each a
    contiguous run of ``bpk``: per position one contiguous row of ``T`` values gathered
    from the batch element's padded input (in cache for the planes this path is for)."""
    N = xp.shape[0]
    plane = xp.size // N if N > 0 else 0
    xf = xp.reshape(-1)
    R = toff.shape[0]
    uP = np.uint64(poff.shape[0])
    uT = np.uint64(T)
    # unsigned indices: Numba drops its negative-index test (which keeps a loop scalar)
    for t in range(t0, t1):
        tile = t // N
        n = t - tile * N
        r0 = np.uint64(tile * T)
        w = np.uint64(min(T, R - tile * T))
        base = np.uint64((tile * N + n) * T) * uP
        nb = np.uint64(n * plane)
        for o in range(uP):
            dst = base + o * uT
            src = nb + np.uint64(poff[o])
            for i in range(w):
                bpk[dst + i] = xf[src + np.uint64(toff[r0 + i])]
            for i in range(w, uT):
                bpk[dst + i] = 0.0


def usable(cog, terms, positions, tiled):
    """Whether :func:`weight_gradient` takes the fused path: the machine has register
    tiles (``tiled``), at least one 6-row block of output channels per group (the GEMM
    packs fewer rows as the portable path, see :func:`.gemm_f64.gemm`) and a non-empty
    sum (``positions = N*P > 0``, ``terms = Cg*K > 0``)."""
    return tiled and cog >= _CB and terms > 0 and positions > 0


@functools.lru_cache(maxsize=64)
def _offsets(C, Dp, Hp, Wp, R, geo):
    """``(toff, poff)`` of :func:`unfold_packed` (read-only int64) for ``R`` unfolded rows
    of a padded input ``[C, Dp, Hp, Wp]`` per batch element: each row's offset (channel,
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


def weight_gradient(x5, G, cout, cg, groups, geo, dw):
    """``dw [Cout, Cg*K]`` (C-contiguous, written) ``= G[group rows] @ cols[group]^T`` per
    group, ``x5 [N, C, D, H, W]`` the input, ``G [Cout, N*P]`` the output gradient with
    channels first (C-contiguous), ``geo`` the convolution's geometry ``(kd, kh, kw, sd,
    sh, sw, dd, dh, dw, pd, ph, pw, OD, OH, OW)``.  The input is zero-padded first (a
    copy), so the unfold reads every tap without a bounds test.  Requires
    :func:`usable`."""
    pd, ph, pw = geo[9], geo[10], geo[11]
    R = cg * geo[0] * geo[1] * geo[2]
    cog = cout // groups
    K = G.shape[1]
    T = tile_width(R)
    N, C, D, H, W = x5.shape
    Dp, Hp, Wp = D + 2 * pd, H + 2 * ph, W + 2 * pw
    if pd or ph or pw:
        xp = np.zeros((N, C, Dp, Hp, Wp))
        xp[:, :, pd:pd + D, ph:ph + H, pw:pw + W] = x5
    else:
        xp = np.ascontiguousarray(x5)
    xp = readonly(xp)            # one compiled specialisation, padded or not
    toff, poff = _offsets(C, Dp, Hp, Wp, R, geo)
    flat = dw.reshape(-1)
    for gi in range(groups):
        bpk = _workspace("b", -(-R // T) * K * T)
        # (read-only like the cached offsets: one compiled specialisation)
        unfold_packed(xp, readonly(toff + gi * cg * Dp * Hp * Wp) if gi else toff, poff, T,
                      bpk)
        apk = pack_a(G[gi * cog:(gi + 1) * cog], cog * R * K < (1 << 21))
        run_tiled(apk, bpk, 0, flat[gi * cog * R:], 0, R, cog, R, K, T, 1, None, 0, False)
    return dw
