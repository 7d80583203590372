"""The weight gradient of a convolution on the register-tiled GEMM, operands swapped.

``dw[co, (c', k)] = sum over (n, o) of G[co, (n, o)] * cols[(c', k), (n, o)]`` per group,
``cols`` the unfolded input (:func:`.backward.im2col`): each output one fused
multiply-add chain over ``(n, o)`` in order from +0.0.  A fused multiply-add is
commutative in its two factors (``fma(x, y, z)`` is ``x*y + z`` rounded once), so the
transposed product ``dw^T = cols G^T`` -- ``a = cols`` (rows ``(c', k)``), ``b = G^T`` --
runs the same chains term for term: the same bits as ``G cols^T`` on every target and for
any thread count.

Why this way round: ``cols`` is what :func:`.backward.im2col` writes (rows contiguous
along the output positions, one plain copy per input row) and the GEMM reads it where it
lies as its ``a``; only ``G^T`` (``Cout`` columns, small) is packed.  The other way round,
``cols^T`` had to be packed as ``b`` -- a gather per element (``unfold_packed``, until
2026-12-06) -- and the product's tasks were cut over ``Cout x C*K`` outputs of a few
6-row blocks.  Measured in one process, current -> swapped, two threads, Intel Xeon
(AVX-512): 3x3 16->32 @4x4 batch 64 (the small CNN's second layer) 344 -> 305 us, 3x3
1->16 @8x8 batch 64 161 -> 150 us, 3x3 64->64 @56 batch 8 32.7 -> 28.6 ms, 3x3 s2 64->128
@56 13.3 -> 9.5 ms, 1x1 256->64 @56 14.9 -> 13.0 ms, 3x3 512->512 @7 17.2 -> 16.0 ms, the
7x7 stem 20.0 -> 17.3 ms, 1x1 s2 256->512 @56 equal; the haswell target (AVX2) 360 -> 328
us, 173 -> 153 us, 43.4 -> 37.3 ms.
"""

from .backward import im2col
from .gemm_f64 import _CB, _workspace, matmul


def usable(cog, terms, positions, tiled):
    """Whether :func:`weight_gradient` is the plan: the machine has register tiles
    (``tiled``), at least one 6-row block of output channels per group (``G^T`` is packed
    in tiles of whole vectors of columns: with fewer channels, e.g. depthwise, most of a
    tile would be padding, and the caller's ``G @ cols^T`` runs them on the portable
    rows) and a non-empty sum (``positions = N*P > 0``, ``terms = Cg*K > 0``)."""
    return tiled and cog >= _CB and terms > 0 and positions > 0


def weight_gradient(x5, G, cout, cg, groups, geo, dw):
    """``dw [Cout, Cg*K]`` (C-contiguous, written) ``= G[group rows] @ cols[group]^T`` per
    group, computed as ``(cols[group] @ G[group rows]^T)^T`` (see the module docstring),
    ``x5 [N, C, D, H, W]`` the input, ``G [Cout, N*P]`` the output gradient with channels
    first (C-contiguous), ``geo`` the convolution's geometry ``(kd, kh, kw, sd, sh, sw,
    dd, dh, dw, pd, ph, pw, OD, OH, OW)``.  ``cols`` lives in a reused workspace (the
    output pool above 64 MiB).  Requires :func:`usable`."""
    R = cg * geo[0] * geo[1] * geo[2]
    cog = cout // groups
    K = G.shape[1]
    C = x5.shape[1]
    cols = _workspace("wg_cols", C * geo[0] * geo[1] * geo[2] * K).reshape(-1, K)
    im2col.sized(cols.size)(x5, *geo, cols)
    for gi in range(groups):
        dwt = matmul(cols[gi * R:(gi + 1) * R], G[gi * cog:(gi + 1) * cog].T)
        dw[gi * cog:(gi + 1) * cog] = dwt.T
    return dw
