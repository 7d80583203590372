"""The library's own float64 GEMM: one fused-multiply-add chain per output, in a fixed
order, on every CPU.

Specification (every path below computes exactly this)::

    c[m, n] = fma(a[m, K-1], b[K-1, n], ... fma(a[m, 1], b[1, n], fma(a[m, 0], b[0, n], 0.0)))

i.e. the terms ``k = 0 .. K-1`` in order, one rounding per term, from ``+0.0``.  No BLAS:
the bits depend neither on the thread count nor on the instruction set nor on a BLAS
build.

* :func:`gemm_tiled` (register-tiled, when the machine policy has tiles): BLIS's loop
  nest -- column panels and row panels in parallel, then K in chunks of ``KC`` terms,
  then 6-row blocks of the packed ``a``, then tiles of ``VW*V`` columns
  (:func:`._simd._make_micro_acc`: 6 x 4 zmm accumulators on AVX-512, 6 x 2 ymm on AVX2),
  each tile's chain continuing in ``c`` from chunk to chunk (exactly one chain); a batch
  of products sharing ``a`` (the pointwise convolution) in one launch; outputs written
  in place (the padding rows/columns of the edge tiles live in a per-task scratch), then
  an epilogue while the task's outputs are in cache: ``+ bias`` per row or per column
  and a count of non-finite outputs (:func:`gemm`);
* :func:`gemm_rows` (portable): per output row, ``c_row = fma(a[m, k], b[k, :], c_row)``
  for k in order -- the same chains, vectorised across columns by the compiler.
"""

import functools
import threading

import numpy as np
from numba import prange

from .. import _alloc
from ..config import POOL
from ._cpu import machine
from ._jit import helper, inlined, kernel, num_threads, runs_serial, span_kernel
from ._simd import (_ROW_MAXV, _VW, _fma, _make_interleave, _make_micro_acc, _transpose_block,
                    prefetch_l2)
from .views import readonly

_CB = 6                     # rows of a per register block
_KC = 128 if _VW == 8 else 256   # terms per K chunk: a tile's chunk of b (KC x T) fits L1
_NC = 64 * _VW              # columns per parallel panel (512 on AVX-512, 256 on AVX2)
_MC = 16 * _CB              # rows per parallel panel (96)

_interleave6 = _make_interleave(_CB)
_T = _ROW_MAXV * _VW         # widest register tile (32 columns on AVX-512, 8 on AVX2)
_mv1 = _make_micro_acc(_CB, 1, astrided=True)
_mv2 = _make_micro_acc(_CB, 2, astrided=True) if _ROW_MAXV >= 2 else _mv1
_mv3 = _make_micro_acc(_CB, 3, astrided=True) if _ROW_MAXV >= 3 else _mv2
_mv4 = _make_micro_acc(_CB, 4, astrided=True) if _ROW_MAXV >= 4 else _mv3
# the widest tile, finishing the chain's last chunk in registers (bias, non-finite count;
# the narrower tiles of narrow products are finished by _finish: one variant compiled)
_me = _make_micro_acc(_CB, _ROW_MAXV, astrided=True, epilogue=True)


# A parallel product is cut into at least this many tasks per thread.  Each cut shortens
# the reuse of the operands a task streams over all of K: a weight gradient (64 x 1024 ->
# 256 outputs, two threads) cut into 8 tasks re-read each chunk of b for 1 of its 2 row
# panels' worth of blocks.  4 -> 2, AVX-512 / AVX2 (haswell target), two threads:
# 256x64.(1024) 72 -> 81 / 43 -> 46 GFLOP/s, 64x256.(1024) 67 -> 83 / 41 -> 53; products
# already cut into 8+ tasks by their panels unchanged (1024x64x256, 512x1024x1024, ...).
_TASKS_PER_THREAD = 2
_PACK_ROWS = 64              # rows of an operand per packing task (64 x 256 float64: 128 KiB)


@functools.lru_cache(maxsize=512)
def _tasks(M, N, T, nb=1, threads=1):
    """``(pm, pn, tasks)``: the row panels (of 6-row blocks) and column panels (of tiles
    of ``T`` columns) of each of ``nb`` products of ``M`` rows and ``N`` columns, and the
    number of tasks ``nb*pm*pn``.  Panels of about ``_MC`` rows and ``_NC`` columns, cut
    smaller (the side whose cut adds less operand traffic, see below) until there are
    ``_TASKS_PER_THREAD`` tasks per thread or a task is one register tile (a small
    product on several threads otherwise ran as one or two tasks), and, with fewer than
    8 tasks per thread, until the count is a multiple of the threads (11 equal tasks on 2
    threads left one idle for a twelfth of the time).  :func:`gemm_tiled` cuts the blocks and tiles into ``pm`` and ``pn``
    near-equal runs.  The panels only decide which task computes an output, never its
    chain: the same bits for any cut."""
    nmb = -(-M // _CB)
    ntile = -(-N // T)
    pm = -(-nmb // min(nmb, _MC // _CB))
    pn = -(-ntile // min(ntile, max(1, _NC // T)))
    want = _TASKS_PER_THREAD * threads if threads > 1 else 1
    # Every task streams its rows of a and its columns of b over all of K, so the
    # operands are read pn * |a| + pm * |b| times in all (|a| = M*K, |b| = K*N): cut the
    # side whose extra pass costs less -- doubling pm adds pm*|b|, doubling pn adds pn*|a|
    # (i.e. cut the panel with more elements), one more row panel adds |b|, one more
    # column panel |a|.  (Counting blocks against tiles instead cut the rows of a
    # convolution's weight gradient, 32 x 144 x 4096: each of its 4 row panels then read
    # the 5 MB unfolded input again, 533 us against 375 cut by columns, two threads.)
    while nb * pm * pn < want and (pm < nmb or pn < ntile):
        if pm < nmb and (M * pn >= N * pm or pn == ntile):
            pm = min(nmb, 2 * pm)
        else:
            pn = min(ntile, 2 * pn)
    while (threads > 1 and (nb * pm * pn) % threads and nb * pm * pn < 8 * threads
           and (pm < nmb or pn < ntile)):
        if pm < nmb and (M >= N or pn == ntile):
            pm += 1
        else:
            pn += 1
    return pm, pn, nb * pm * pn


_LINES_PER_SET = 8     # L1 lines per set a chunk of b read in place may take (of 12 ways)
_KC_IN_PLACE = 64      # the K chunk of a b read in place (when its rows allow it)


@inlined
def _set_groups(bk):
    """The L1 set groups that the rows of a ``b`` read in place (rows ``bk`` float64
    apart) fall into: rows a multiple of 64 bytes apart fall into ``64 / gcd(bk/8, 64)``
    groups of sets (64 sets of 64-byte lines), each group holding one line of every row
    of its group; 64 (no conflict) for any other row stride."""
    if bk % 8 != 0:
        return 64
    low = (bk // 8) & -(bk // 8)        # gcd(bk/8, 64) is its lowest set bit, at most 64
    return 1 if low == 0 or low >= 64 else 64 // low


@inlined
def _tile(vt, b, bbase, bk, asrc, ab, nk, dst, cb, cs, first, pf, sk, sj):
    """One micro-kernel call on a tile of ``vt`` vectors (the column-edge tile runs only
    the vectors that hold real columns)."""
    if vt == 4:
        _mv4(b, bbase, bk, asrc, ab, nk, dst, cb, cs, first, pf, sk, sj)
    elif vt == 3:
        _mv3(b, bbase, bk, asrc, ab, nk, dst, cb, cs, first, pf, sk, sj)
    elif vt == 2:
        _mv2(b, bbase, bk, asrc, ab, nk, dst, cb, cs, first, pf, sk, sj)
    else:
        _mv1(b, bbase, bk, asrc, ab, nk, dst, cb, cs, first, pf, sk, sj)


@inlined
def _grid_index(r, n0, n1, second_major):
    """``(i0, i1)`` of task ``r`` on an ``n0 x n1`` grid numbered row-major (``i1`` the
    faster), or column-major (``i0`` the faster) when ``second_major``."""
    if second_major:
        i1 = r // n0
        return r - i1 * n0, i1
    i0 = r // n1
    return i0, r - i0 * n1


@inlined
def _fused(T, mode):
    """Whether :func:`_panel` finishes its interior tiles in registers: the widest tiles
    (``T == _T``) of a product with a bias or a count (``mode != 3``)."""
    return T == _T and mode != 3


@helper
def _panel(apk, astep, ak, aj, aedge, bpk, bb, bk, btile, c, cc, ldc, M, N, K, T, b0, b1, t0,
           t1, scr, bl, bias, mode):
    """The register-tiled chains of one task: output rows of the 6-row blocks
    ``b0 .. b1-1`` times the columns of the tiles ``t0 .. t1-1`` of the product whose
    ``b`` panels start at ``bpk[bb]`` and whose output row ``m`` starts at ``c[cc + m*ldc]``.

    ``a[blk*6 + j, k] = apk[blk*astep + k*ak + j*aj]``: packed (``astep = 6K, ak = 6,
    aj = 1``) or read where it lies (:func:`a_operand`); a non-empty ``aedge`` holds the
    row-edge block packed (``[K, 6]``, zero rows past ``M``), which a direct ``a`` does
    not have.

    BLIS's order: K in chunks of ``_KC`` terms; per chunk one tile's chunk of b (KC x T,
    in L1) meets every 6-row block of the task's chunk of a (from L2), then the next tile;
    each call prefetches the c tile of the next call.  A ``b`` read where it lies (rows
    ``bk`` apart, ``bk != T``): a chunk's rows are a row of ``b`` apart, so they fall
    into :func:`_set_groups` groups of L1 sets.  Where ``_KC_IN_PLACE`` (64) rows take
    at most ``_LINES_PER_SET`` lines of a set (rows of 512 bytes: 8 groups, 8 lines), the
    chunks are that long and read in place; rows of 1 KiB and more crowd into 4 groups
    or fewer (4 KiB rows: a tile's 64 lines all in the same 4 sets), and every 6-row
    block re-read them from L2 -- then each tile's chunk (``_KC`` rows, only the vectors
    the tile uses) is first copied into ``bl`` (the task's own buffer, 64-byte aligned),
    a sequential read by the thread that uses it.  AVX-512, two threads, A/B in
    alternating processes: 1024x64x256 (the transformer's feed-forward) 91-94 -> 108-114
    GFLOP/s, 96x64x512 63-66 -> 72-98, 32x144x1024 56-67 -> 65-68; rows of 512 bytes as
    before; AVX2 unchanged within the noise.  Blocks with padding rows (past ``M``) and the
    tile with padding columns (past ``N``) keep their chains in ``scr`` (rows of T, the
    row-edge block's tiles first, then the column-edge tile's blocks) instead of ``c``, so
    that only real outputs are ever written to ``c``: :func:`_finish` copies them out.
    The first chunk starts every chain at +0.0.  With tiles of the widest width
    (:func:`_fused`), the last chunk of an interior tile adds the bias (``mode`` 1:
    ``bias[m]``, 2: ``bias[n]``) and counts the non-finite outputs before the tile
    leaves the registers (:func:`._simd._make_micro_acc`'s ``epilogue``); :func:`_finish`
    does that for the other outputs.  (Done afterwards in a pass over the task's
    outputs, the epilogue took 14 % of a 1024 x 64 x 64 product with a bias, two
    threads, AVX-512: 81.8 -> 74.6 us; 71.2 without bias and count.)  Returns the count
    of the outputs finished here."""
    nmb = (M + _CB - 1) // _CB
    ntile = (N + T - 1) // T
    redge = nmb - 1 if M % _CB else -1
    cedge = ntile - 1 if N % T else -1
    ce0 = (t1 - t0) * _CB * T
    V = T // _VW
    VE = (N - cedge * T + _VW - 1) // _VW   # vectors of the column-edge tile with real columns
    # b packed, or read in place in chunks of _KC_IN_PLACE rows when they fit their L1
    # sets, or (rows that crowd into a few sets: the caller gave a non-empty bl) each
    # tile's chunk copied to bl first
    local = bl.size > 0
    kc = _KC_IN_PLACE if bk != T and not local else _KC
    lo = 0
    if local:
        lo = (-bl.ctypes.data % 64) // 8    # 64-byte aligned start in bl
    count = 0
    # a packed b: the next tile's chunk (the next chunk's first tile after the last) is
    # prefetched into L2 while this tile's blocks run, a share of its lines per block
    ahead = bk == T
    nblk = b1 - b0
    for k0 in range(0, K, kc):
        nk = min(kc, K - k0)
        first = k0 == 0
        last = k0 + nk == K and _fused(T, mode)
        for tile in range(t0, t1):
            vt = VE if tile == cedge else V
            bbase = bb + tile * btile + k0 * bk
            if ahead:
                nxt = (bbase + btile if tile + 1 < t1
                       else bb + t0 * btile + (k0 + kc) * bk if k0 + kc < K else -1)
                nl = (min(kc, K - k0 - kc) if tile + 1 == t1 else nk) * T // 8
                per = (nl + nblk - 1) // nblk
            if local:
                # unsigned indices: no negative-index test, so the copy vectorises
                w = np.uint64(vt * _VW)
                for kk in range(nk):
                    s0 = np.uint64(bbase + kk * bk)
                    d0 = np.uint64(lo + kk * T)
                    for i in range(w):
                        bl[d0 + i] = bpk[s0 + i]
            for blk in range(b0, b1):
                if ahead and nxt >= 0:
                    for q in range((blk - b0) * per, min(nl, (blk - b0 + 1) * per)):
                        prefetch_l2(bpk, nxt + q * 8)
                if blk == redge and aedge.size:
                    asrc = aedge
                    ab = k0 * _CB
                    sk = _CB
                    sj = 1
                else:
                    asrc = apk
                    ab = blk * astep + k0 * ak
                    sk = ak
                    sj = aj
                edge = tile == cedge or blk == redge
                if edge:
                    # an edge tile: its chains live in scr (rows of T)
                    dst = scr
                    cb = (ce0 + (blk - b0) * _CB * T if tile == cedge
                          else (tile - t0) * _CB * T)
                    cs = T
                    pf = cb
                else:
                    dst = c
                    cb = cc + blk * _CB * ldc + tile * T
                    cs = ldc
                    pf = (cb + _CB * ldc if blk + 1 < b1
                          else cc + b0 * _CB * ldc + (tile + 1) * T)
                if last and not edge:       # (then vt == V == _ROW_MAXV)
                    boff = blk * _CB if mode == 1 else tile * T
                    if local:
                        count += _me(bl, lo, T, asrc, ab, nk, dst, cb, cs, first, pf, sk, sj,
                                     bias, boff, mode)
                    else:
                        count += _me(bpk, bbase, bk, asrc, ab, nk, dst, cb, cs, first, pf, sk,
                                     sj, bias, boff, mode)
                elif local:
                    _tile(vt, bl, lo, T, asrc, ab, nk, dst, cb, cs, first, pf, sk, sj)
                else:
                    _tile(vt, bpk, bbase, bk, asrc, ab, nk, dst, cb, cs, first, pf, sk, sj)
    return count


@helper
def _finish(c, cc, ldc, M, N, T, b0, b1, t0, t1, scr, bias, mode):
    """The epilogue of one task of :func:`_panel` (its outputs still in cache): the
    chains kept in ``scr`` copied to their outputs, then ``+ bias[m]`` (``mode`` 1) or
    ``+ bias[n]`` (``mode`` 2) -- one rounding after the chain, as ``c + bias`` --, and
    the number of those outputs that are not finite returned (``mode`` 3: no bias, no
    count; 0 returned) -- for every output of the task, or, when :func:`_panel` finished
    the interior tiles in registers (:func:`_fused`), for the edge tiles' only.  Only
    the rows that hold such outputs are visited -- the row-edge block's, and every row
    only when the task has the column-edge tile or an unfused bias -- with flat indices
    into ``c`` (visiting every row through a slice each, a 64 x 64 x 64 product with a
    bias spent ~2 of its ~11.5 us here)."""
    nmb = (M + _CB - 1) // _CB
    ntile = (N + T - 1) // T
    redge = nmb - 1 if M % _CB else -1
    cedge = ntile - 1 if N % T else -1
    ce0 = (t1 - t0) * _CB * T
    n0 = t0 * T
    n1 = min(N, t1 * T)
    ncut = cedge * T if t0 <= cedge < t1 else n1
    fused = _fused(T, mode)
    m0 = b0 * _CB
    m1 = min(M, b1 * _CB)
    if ncut == n1 and (fused or mode == 3):
        # no column-edge tile here and no bias for the interior rows: only the row-edge
        # block has anything to finish
        m0 = max(m0, redge * _CB) if b0 <= redge < b1 else m1
    bad = 0
    for m in range(m0, m1):
        blk = m // _CB
        j = m - blk * _CB
        r0 = cc + m * ldc                 # c[r0 + n] is output (m, n)
        if blk == redge:
            # whole tiles (ncut is a tile boundary), without a division per element
            for tile in range(t0, ncut // T):
                s0 = ((tile - t0) * _CB + j) * T
                d0 = r0 + tile * T
                for q in range(T):
                    c[d0 + q] = scr[s0 + q]
        e0 = ce0 + ((blk - b0) * _CB + j) * T - ncut
        for n in range(ncut, n1):
            c[r0 + n] = scr[e0 + n]
        # the outputs that came from scr: the whole row part in the row-edge block, else
        # the column-edge tile's; one pass: bias (one rounding after the chain), then the
        # finiteness test
        q0 = n0 if blk == redge or not fused else ncut
        if mode == 1:
            bm = bias[m]
            for n in range(q0, n1):
                v = c[r0 + n] + bm
                c[r0 + n] = v
                bad += (v - v) != 0.0
        elif mode == 2:
            for n in range(q0, n1):
                v = c[r0 + n] + bias[n]
                c[r0 + n] = v
                bad += (v - v) != 0.0
        elif mode == 0:
            for n in range(q0, n1):
                v = c[r0 + n]
                bad += (v - v) != 0.0
    return bad


@span_kernel()
def gemm_tiled(apk, astep, ak, aj, aedge, bpk, bstep, bk, btile, c, cstep, ldc, M, N, K, T, pm,
               pn, cmaj, bias, mode, bad, t0, t1):
    """For every batch ``i``: ``c_i [M, N] = a @ b_i`` by the specification above, then
    ``+ bias`` (``mode`` 0: none, 1: ``bias[m]`` per row, 2: ``bias[n]`` per column, 3:
    none and no count), into
    ``c[i*cstep + m*ldc + n]`` (only those elements are written: no padding in ``c``);
    ``bad[task]`` = the number of non-finite outputs of each task.  K > 0.

    ``apk`` is ``a [M, K]`` packed as ``[ceil(M/6), K, 6]`` (zero rows past ``M``;
    ``astep, ak, aj = 6K, 6, 1``), or ``a`` where it lies (:func:`a_operand`),
    ``bpk`` holds each ``b_i [K, N]`` at ``i*bstep``, packed as ``[ceil(N/T), K, T]`` (T
    the tile width, zero columns past ``N``), so both operands stream contiguously.  A
    span kernel over the tasks (batch, one of ``pm`` near-equal runs of the 6-row blocks,
    one of ``pn`` near-equal runs of the tiles: :func:`_tasks`), numbered row panel
    first, or column panel first when ``cmaj`` (:func:`_column_major`); each output's
    chain runs in one task, chunk after chunk in k order."""
    nmb = (M + _CB - 1) // _CB
    ntile = (N + T - 1) // T
    redge = nmb - 1 if M % _CB else -1
    cedge = ntile - 1 if N % T else -1
    for t in range(t0, t1):
        i = t // (pm * pn)
        r = t - i * (pm * pn)
        rm, rn = _grid_index(r, pm, pn, cmaj)
        b0 = rm * nmb // pm
        b1 = (rm + 1) * nmb // pm
        tb0 = rn * ntile // pn
        tb1 = (rn + 1) * ntile // pn
        edges = b0 <= redge < b1 or tb0 <= cedge < tb1
        scr = np.empty(((tb1 - tb0) + (b1 - b0)) * _CB * T if edges else 0)
        # the chunk buffer of a b read in place whose rows crowd into few L1 sets
        copies = bk != T and _KC_IN_PLACE > _LINES_PER_SET * _set_groups(bk)
        bl = np.empty(_KC * T + 8 if copies else 0)
        cnt = _panel(apk, astep, ak, aj, aedge, bpk, i * bstep, bk, btile, c, i * cstep, ldc,
                     M, N, K, T, b0, b1, tb0, tb1, scr, bl, bias, mode)
        if edges or (mode != 3 and not _fused(T, mode)):
            cnt += _finish(c, i * cstep, ldc, M, N, T, b0, b1, tb0, tb1, scr, bias, mode)
        bad[t] = cnt


@kernel
def gemm_rows(a, b, c):
    """``c [M, N] = a [M, K] @ b [K, N]`` by the specification above (portable: the chain
    of each output advances one term per pass over its row); ``c`` is overwritten."""
    M, K = a.shape
    N = b.shape[1]
    for m in prange(M):
        row = c[m]
        for n in range(N):
            row[n] = 0.0
        for k in range(K):
            am = a[m, k]
            br = b[k]
            for n in range(N):
                row[n] = _fma(am, br[n], row[n])


@inlined
def _strip(bf, N, bpk, K, T, tile, k0, k1):
    """Rows ``k0 .. k1-1`` of tile ``tile`` of :func:`_pack_b`: ``bpk[tile, k, i] =
    b[k, tile*T + i]`` (0 past N).  Unsigned indices: Numba then drops its negative-index
    wrap-around test, which kept the copy scalar (1024 x 64: 50 -> 18 us on one core)."""
    n0 = tile * T
    w = np.uint64(max(0, min(T, N - n0)))
    uT = np.uint64(T)
    for k in range(k0, k1):
        base = np.uint64((tile * K + k) * T)
        src = np.uint64(k * N + n0)
        for i in range(w):
            bpk[base + i] = bf[src + i]
        for i in range(w, uT):
            bpk[base + i] = 0.0


def _pack_b_tasks(b, bpk, K, T):
    """:func:`_pack_b`'s iterations: (chunk of rows, tile) pairs."""
    return -(-K // _PACK_ROWS) * (bpk.shape[0] // (K * T)) if K > 0 else 0


@span_kernel(iterations=_pack_b_tasks)
def _pack_b(b, bpk, K, T, t0, t1):
    """``b [K, N]`` -> ``bpk [ceil(N/T), K, T]`` (flat), zero columns past N (a copy: no
    arithmetic).  Parallel over (chunk of ``_PACK_ROWS`` rows of ``b``, tile) pairs, each
    chunk (in L2) read once and written tile by tile (:func:`_strip`): walking each tile
    down all K rows instead strides the whole of ``b`` once per tile (1024 x 256: 177 ->
    136 us, one core)."""
    N = b.shape[1]
    ntile = bpk.shape[0] // (K * T) if K > 0 else 0
    bf = b.reshape(-1)
    # (chunk, tile) pairs, chunk-major: a thread's contiguous share of them walks a chunk's
    # tiles in turn, and a short b (K <= _PACK_ROWS) still splits across threads
    for t in range(t0, t1):
        ch = t // ntile
        k0 = ch * _PACK_ROWS
        _strip(bf, N, bpk, K, T, t - ch * ntile, k0, min(K, k0 + _PACK_ROWS))


def _pack_bt_tasks(bt, bpk, K, T, tmaj):
    """:func:`_pack_bt`'s iterations: (chunk of rows, tile) pairs."""
    return -(-K // _PACK_ROWS) * (bpk.shape[0] // (K * T)) if K > 0 else 0


@span_kernel(iterations=_pack_bt_tasks)
def _pack_bt(bt, bpk, K, T, tmaj, t0, t1):
    """``bt [N, K]`` (b transposed) -> ``bpk [ceil(N/T), K, T]`` (flat), zero columns past
    N, without a transposed copy of b first.  Parallel over (chunk of ``_PACK_ROWS``
    terms, tile) pairs, chunk-major as in :func:`_pack_b` (parallel over tiles alone, the
    narrow ``G^T`` of a convolution's weight gradient -- one tile of 16 or 32 columns and
    1,024-4,096 terms -- was one task on one thread).  ``tmaj``: tile-major instead
    (the tasks of a tile in a row), so that each thread's contiguous share packs whole
    column panels -- those its share of a :func:`_column_major` product reads.  Full
    ``VW x VW`` blocks go through :func:`._simd._transpose_block` (vector loads along
    ``bt``'s rows, vector stores along the panel's); the edges element by element."""
    N = bt.shape[0]
    ntile = bpk.shape[0] // (K * T) if K > 0 else 0
    flat = bt.reshape(-1)
    kfull = K - K % _VW
    nch = -(-K // _PACK_ROWS)
    for t in range(t0, t1):
        ch, tile = _grid_index(t, nch, ntile, tmaj)
        c0 = ch * _PACK_ROWS                  # a multiple of _VW
        c1 = min(K, c0 + _PACK_ROWS)
        n0 = tile * T
        w = min(T, N - n0)
        wfull = w - w % _VW
        base = tile * K * T
        for k0 in range(c0, min(c1, kfull), _VW):
            for i0 in range(0, wfull, _VW):
                _transpose_block(flat, (n0 + i0) * K + k0, K, bpk, base + k0 * T + i0, T)
            for k in range(k0, k0 + _VW):
                for i in range(wfull, w):
                    bpk[base + k * T + i] = bt[n0 + i, k]
        for k in range(max(c0, kfull), c1):
            for i in range(w):
                bpk[base + k * T + i] = bt[n0 + i, k]
        for k in range(c0, c1):
            for i in range(w, T):
                bpk[base + k * T + i] = 0.0


@span_kernel(iterations=lambda a, apk, K: apk.shape[0] // (K * _CB) if K > 0 else 0)
def _pack_a(a, apk, K, t0, t1):
    """``a [M, K]`` -> ``apk [ceil(M/6), K, 6]`` (flat), zero rows past M; parallel over
    blocks.  A full block's ``6 x VW`` pieces go through :func:`._simd._make_interleave`
    (vector loads along the rows, contiguous stores); the edges element by element."""
    M = a.shape[0]
    nmb = apk.shape[0] // (K * _CB) if K > 0 else 0
    flat = a.reshape(-1)
    kfull = K - K % _VW
    for blk in range(t0, t1):
        m0 = blk * _CB
        k1 = kfull if m0 + _CB <= M else 0
        for k0 in range(0, k1, _VW):
            _interleave6(flat, m0 * K + k0, K, apk, (blk * K + k0) * _CB)
        for k in range(k1, K):
            base = (blk * K + k) * _CB
            for j in range(_CB):
                m = m0 + j
                apk[base + j] = a[m, k] if m < M else 0.0


def _pack_at_tasks(at, apk, K):
    """:func:`_pack_at`'s iterations: (chunk of rows, block) pairs."""
    return -(-K // _PACK_ROWS) * (apk.shape[0] // (K * _CB)) if K > 0 else 0


@span_kernel(iterations=_pack_at_tasks)
def _pack_at(at, apk, K, t0, t1):
    """``a [M, K]`` given as its transpose ``at [K, M]`` (C-contiguous: the ``x.T`` of a
    weight gradient) -> ``apk [ceil(M/6), K, 6]`` (flat), zero rows past M, without a
    transposed copy first: each term's 6 values are adjacent in a row of ``at``.

    Parallel over (chunk of ``_PACK_ROWS`` rows of ``at``, block) pairs: a chunk (in L2)
    is read once and written block by block.  Walking each block down all K rows instead
    strides the whole of ``at`` once per block, from L3 once ``at`` outgrows L2 (1024 x
    256: 240 -> 148 us on one core).  Unsigned indices (no negative-index test in the
    copies)."""
    M = at.shape[1]
    nmb = apk.shape[0] // (K * _CB) if K > 0 else 0
    flat = at.reshape(-1)
    uM = np.uint64(M)
    ucb = np.uint64(_CB)
    # (chunk, block) pairs, chunk-major (as in _pack_b)
    for t in range(t0, t1):
        ch = t // nmb
        blk = t - ch * nmb
        k0 = np.uint64(ch * _PACK_ROWS)
        k1 = np.uint64(min(K, ch * _PACK_ROWS + _PACK_ROWS))
        m0 = np.uint64(blk * _CB)
        w = np.uint64(min(_CB, M - blk * _CB))
        row0 = np.uint64(blk * K)
        for k in range(k0, k1):
            base = (row0 + k) * ucb
            src = k * uM + m0
            for j in range(w):
                apk[base + j] = flat[src + j]
            for j in range(w, ucb):
                apk[base + j] = 0.0


_WS = threading.local()
_WS_MAX = 1 << 23            # float64 elements (64 MiB) a thread keeps for packed panels


def _workspace(name, n, dtype=np.float64):
    """A buffer of ``n`` elements of ``dtype`` for packing, kept per Python thread and name
    and reused (fresh pages cost a fault each: a 512x1024x1024 product paid ~5 ms of its
    ~14 ms for them); requests above 64 MiB are not kept here but taken from the output
    pool of :mod:`hmath_dl._alloc`, which keeps a block once it is free again (up to its
    limit), so a call that repeats gets the same pages back (the weight gradient of a 3x3
    64->64 convolution on 8 x 56 x 56 planes unfolds 115 MB: afresh, its page faults and
    zero-fill took ~17 of the call's 44 ms, Intel Xeon, two threads).  64-byte
    aligned."""
    views = _WS.__dict__.setdefault("views", {})
    last = views.get(name)          # the view handed out last time: reused as it is when
    if last is not None and last.shape[0] == n and last.dtype == dtype:   # n is the same
        return last
    dtype = np.dtype(dtype)
    if n * dtype.itemsize > _WS_MAX * 8:
        return _aligned(n, dtype, pooled=True)
    buf = getattr(_WS, name, None)
    if buf is None or buf.dtype != dtype or buf.shape[0] < n:
        buf = _aligned(max(n, 1 << 12), dtype)
        setattr(_WS, name, buf)
    views[name] = view = buf[:n]
    return view


def _aligned(n, dtype=np.float64, pooled=False):
    """``numpy.empty(n, dtype)`` starting on a 64-byte boundary (a cache line): numpy's
    allocator gives 16 bytes, and then most 64-byte vector loads of a packed panel
    straddle two cache lines.  ``pooled``: the bytes come from :func:`.._alloc.lease`
    when the pool takes a request of that size."""
    size = np.dtype(dtype).itemsize
    raw = _alloc.lease((n * size + 64,), np.uint8) if pooled else None
    if raw is None:
        raw = np.empty(n * size + 64, dtype=np.uint8)
    off = -raw.ctypes.data % 64
    return raw[off:off + n * size].view(dtype)


_SERIAL_FMAS = 1 << 21      # below this many multiply-adds one thread does it (~0.2 ms)
_NO_BIAS = np.zeros(1)
_NO_BIAS.flags.writeable = False


def tile_width(N):
    """The register tile width (columns) of a product with ``N`` columns: the widest
    tile, narrower for narrow products (whole vectors)."""
    return min(_T, -(-N // _VW) * _VW)


def pack_a(a, packs=False):
    """``a [M, K]`` (C-contiguous, or the transpose of a C-contiguous array) packed for
    :func:`gemm_tiled` into a reused workspace; ``packs`` True: serially."""
    M, K = a.shape
    apk = _workspace("a", -(-M // _CB) * K * _CB)
    at = a.T if (not a.flags.c_contiguous and a.T.flags.c_contiguous) else None
    # sources typed read-only (views): one compiled specialisation for a user's writable
    # operands and the autodiff's read-only tape values
    if at is not None:
        _pack_at.when_small(packs)(readonly(at), apk, K)
    else:
        _pack_a.when_small(packs)(readonly(np.ascontiguousarray(a)), apk, K)
    return apk


def a_operand(a):
    """``a [M, K]`` (M >= 6, K > 0) for :func:`gemm_tiled` to read where it lies:
    ``(flat, astep, ak, aj, aedge)``, or None when it is to be packed (:func:`pack_a`).

    A C-contiguous ``a`` is read along its rows (``ak = 1, aj = K``), the transpose of a
    C-contiguous array (``x.T`` in a weight gradient) along its columns (``ak = M,
    aj = 1``); the last block's ``M % 6`` rows are packed into ``aedge``.  Packing a cost
    a pass over it from wherever the previous operation left it (in the transformer
    step, ~40 us per 1024 x 64 operand, a fifth of the product); read in place, the
    micro-kernel's loads stream it instead.  Kept packed: a transposed ``a`` whose
    columns are a multiple of 4 KiB apart (each term's six values then sit in the same
    L1 set as the previous term's), and any other layout.  Row-major rows 4 KiB apart
    are read in place too: measured A/B in one process, 512 x 1024 x 1024 took 11.4-11.9
    against 11.8-12.4 ms packed (AVX-512; AVX2 the same within 1 %)."""
    M, K = a.shape
    if a.flags.c_contiguous:
        flat, astep, ak, aj = a.reshape(-1), _CB * K, 1, K
    elif a.T.flags.c_contiguous and M % 512:
        flat, astep, ak, aj = a.T.reshape(-1), _CB, M, 1
    else:
        return None
    e = M % _CB
    aedge = _workspace("ae", K * _CB if e else 0)
    if e:
        _edge_rows(readonly(flat), ak, aj, M - e, e, aedge)   # one compile for any a
    return readonly(flat), astep, ak, aj, readonly(aedge)


def a_placed(a, packs=False):
    """``(apk, a_where)`` for :func:`run_tiled`: ``a`` read where it lies
    (:func:`a_operand`; ``apk`` None) or, where that declines, packed by :func:`pack_a`
    (``a_where`` None; ``packs`` True: serially)."""
    a_where = a_operand(a)
    return (pack_a(a, packs) if a_where is None else None), a_where


@helper
def _edge_rows(flat, ak, aj, m0, e, aedge):
    """Rows ``m0 .. m0+e-1`` (``e < 6``) of ``a[i, k] = flat[i*aj + k*ak]`` packed into
    ``aedge [K, 6]`` (flat; zero columns past ``e``): :func:`a_operand`'s last block.  One
    compiled copy for both layouts (two numpy assignments per product, with their
    strided copy, took ~10 us in the transformer step's small products)."""
    K = aedge.shape[0] // _CB
    for k in range(K):
        for j in range(_CB):
            aedge[k * _CB + j] = flat[(m0 + j) * aj + k * ak] if j < e else 0.0


def _column_major(M, N, K, T, nb, threads, small):
    """Whether :func:`gemm` numbers its tasks column panel first (:func:`run_tiled`'s
    ``cmaj``): a parallel product cut both ways whose ``b`` is the larger operand and is
    packed by :func:`_pack_bt` (tile-major then).  Each thread's contiguous share of
    the tasks then reads its own column panels of ``b`` (packed by that thread:
    :func:`_pack_bt`'s ``tmaj``) and all of ``a``, instead of half of ``a`` and all of
    ``b``, half of it packed by the other core.  Intel Xeon, two threads, ``dense``
    512 x 1024 x 1024 (``w^T`` packed): AVX-512 8.2-8.7 -> 7.5-8.0 ms, AVX2 13.0-14.5 ->
    11.8-13.0 ms (alternating processes); 256 x 1024 x 4096 18-20.5 -> 14.6-16.7 ms
    (AVX-512).  Only which thread computes which outputs changes, never a chain.  (Not
    for other callers: with a ``b`` packed row-chunk-major the order gained nothing, and
    each thread's share of ``c`` is then columns instead of rows -- the small CNN's input
    gradient, 144 x 1024 x 32, made the AVX2 step ~2 % slower.)"""
    if small:
        return False
    pm, pn, _ = _tasks(M, N, T, nb, threads)
    return pm > 1 and pn > 1 and K * N > M * K


def run_tiled(apk, bpk, bstep, c, cstep, ldc, M, N, K, T, nb=1, bias=None, bias_axis=0,
              count=True, a_where=None, b_rows=0, cmaj=False):
    """Launch :func:`gemm_tiled` over every task (serially below ``_SERIAL_FMAS``
    multiply-adds): ``nb`` products of the packed ``a`` (or, given ``a_where`` from
    :func:`a_operand`, ``a`` where it lies; ``apk`` is then ignored) with the packed
    ``b_i`` into the flat ``c``, plus ``bias`` along output axis ``bias_axis`` (0: one
    value per row, 1: per column).  ``cmaj``: the tasks numbered column panel first
    (:func:`_column_major`; for a ``b`` packed tile-major to match).  Returns the
    number of non-finite outputs (0 without ``count`` and ``bias``: not counted).
    K > 0."""
    mode = (0 if count else 3) if bias is None else 1 + int(bias_axis)
    small = runs_serial(nb * M * N * K < _SERIAL_FMAS)
    pm, pn, tasks = _tasks(M, N, T, nb, 1 if small else num_threads())
    bad = np.zeros(tasks, dtype=np.int64)
    if a_where is None:     # read-only views: one compiled type for both forms of a
        a_where = (readonly(apk), K * _CB, _CB, 1, readonly(apk[:0]))
    # b packed (k rows T apart, tiles K*T apart) or, given b_rows, read where it lies
    # (row-major, rows b_rows apart, tiles T apart)
    bk, btile = (b_rows, T) if b_rows else (T, K * T)
    gemm_tiled.run(tasks, 0 if small else gemm_tiled.limit, *a_where, readonly(bpk), bstep,
                   bk, btile, c, cstep, ldc, M, N, K, T, pm, pn, int(cmaj and not small),
                   _NO_BIAS if bias is None else bias, mode, bad)
    return 0 if mode == 3 else _total(bad)


@helper
def _total(bad):
    """The sum of the int64 array ``bad`` (numpy's ``sum`` method costs about 1 us warm,
    several right after a launch; this call a quarter of that)."""
    s = 0
    for v in bad:
        s += v
    return s


#: read a suitable b where it lies (:func:`b_in_place`); False: always pack (tests)
B_IN_PLACE = True


def b_in_place(b, M, N, K):
    """Whether :func:`gemm` reads ``b [K, N]`` where it lies instead of packing it: a
    row-major ``b`` whose rows are whole vectors (no load reads past a row's end), when
    few 6-row blocks of ``a`` reuse its panels: ``M <= 192`` on 8-lane targets (or a
    ``b`` of at most 64 Ki elements), ``M <= 64`` on narrower ones.

    Packing b costs a pass over it -- and, on several threads, each core's packed half
    then travels to the other (the transformer step's weight gradients, 64 x 1024 x 64:
    148 -> 111 us on AVX-512, 150 -> 124 us on AVX2) -- and pays for itself only when
    many blocks reuse the packed panels, which stay in L1 (in place, the rows of a tile's
    chunk are a row of b apart and share L1 sets).  Measured A/B in one process, in
    place / packed: AVX-512 8 x 4096 x 4096 2.7x, 64 x 1024 x 1024 1.96x, 256 x 1024 x
    1024 1.27x, 1024 x 64 x 64 1.07-1.9x, 2048 x 256 x 256 1.04x, but 1024 x 1024 x 1024
    0.93x.  With ``b`` coming from memory (six different b in turn, Intel Xeon, two
    threads) 256 x 1024 x 1024 was 0.85x in place (4.9-5.0 against 4.2 ms packed; 1.0x
    with the same b every call), 256 x 256 x 4096 0.85x, 192 x 1024 x 1024 1.0x (1.15x
    with a hot b), 64 x 1024 x 1024 1.1x: hence 192, not 256.  AVX2 (4 lanes, one
    64-byte line of b per term) 8 x 4096 x 4096 2.7x, 64 x 1024 x 1024 1.34x, 64 x 1024
    x 256 1.05x, but 2048 x 256 x 256 0.75x and 1024 x 64 x 256 0.86x.  The same
    operations in the same order either way: only the addresses of b differ."""
    if not (B_IN_PLACE and b.flags.c_contiguous and N % _VW == 0):
        return False
    if _VW >= 8:
        return M <= 192 or K * N <= 1 << 16
    return M <= 64


def matmul(a, b, out=None, tiled=None):
    """``a [M, K] @ b [K, N]`` by the specification of this module (plain Python launcher:
    ``a``, ``b`` 2-D float64; returns a new C-contiguous ``[M, N]`` array, or fills
    ``out``).  ``tiled`` forces the path (None: the machine policy decides)."""
    return gemm(a, b, out=out, tiled=tiled, count=False)[0]


def gemm(a, b, bias=None, bias_axis=1, out=None, tiled=None, count=True):
    """``(c, nonfinite)``: ``c = a [M, K] @ b [K, N]`` by the specification of this
    module, then ``+ bias`` (a float64 vector along output axis ``bias_axis``: 1 adds
    ``bias[n]`` to column n, 0 ``bias[m]`` to row m; one rounding after the chain), and
    the number of non-finite elements of ``c`` (counted as it is written; without
    ``count`` and ``bias``: not counted, 0).  ``c`` is a new C-contiguous array or
    ``out``; ``tiled`` forces the path (None: the machine policy decides)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    M, K = a.shape
    N = b.shape[1]
    fresh = out is None             # (then it overlaps neither operand)
    if fresh:
        out = np.empty((M, N), dtype=np.float64)
    if M == 0 or N == 0:
        return out, 0
    if tiled is None:
        tiled = machine().tiled and M >= _CB      # fewer rows: packing b costs the product
    if K == 0 or not tiled:
        if K == 0:
            out[...] = 0.0
        else:
            if not b.flags.c_contiguous:
                b = np.ascontiguousarray(b)
            a = np.ascontiguousarray(a)
            k = gemm_rows.when_small(M * N * K < _SERIAL_FMAS)
            if out.flags.c_contiguous:
                k(a, b, out)
            else:
                tmp = np.empty((M, N))
                k(a, b, tmp)
                out[...] = tmp
        if bias is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                out += bias if bias_axis == 1 else bias[:, None]
        if not count and bias is None:
            return out, 0
        with np.errstate(over="ignore", invalid="ignore"):
            return out, int(out.size - np.count_nonzero(np.isfinite(out)))
    T = tile_width(N)
    # each packing copy runs serially when its operand is small (or the product is): a
    # parallel launch costs more than copying 32 Ki elements (64 Ki on Numba's TBB
    # layer).  (Sized by both operands together, the 64 x 64 weights of the
    # transformer's dense layers were packed by a parallel launch because their a had 64
    # Ki elements: ~30 us in the step each, 13 per step, against ~8 serially.)
    small = M * N * K < _SERIAL_FMAS
    few = 1 << 15 if POOL else 1 << 16
    packs_a = small or M * K < few
    packs = small or K * N < few
    # a read in place must not be the output (c is written while a is read)
    apk, a_where = ((pack_a(a, packs_a), None) if not fresh and np.may_share_memory(out, a)
                    else a_placed(a, packs_a))
    b_rows = 0
    cm = False
    # like a, a b read in place must not be the output
    if b_in_place(b, M, N, K) and (fresh or not np.may_share_memory(out, b)):
        bpk, b_rows = b.reshape(-1), N
    else:
        bpk = _workspace("b", -(-N // T) * K * T)
        # b given as the transpose of a C-contiguous array (w.T in dense, cols.T in the
        # convolution gradient): pack from that array's rows instead of copying b first
        if not b.flags.c_contiguous and b.T.flags.c_contiguous:
            serial = runs_serial(small)
            cm = _column_major(M, N, K, T, 1, 1 if serial else num_threads(), serial)
            _pack_bt.when_small(packs)(readonly(b.T), bpk, K, T, cm)
        else:
            _pack_b.when_small(packs)(readonly(np.ascontiguousarray(b)), bpk, K, T)
    c = out if out.flags.c_contiguous else np.empty((M, N))
    bad = run_tiled(apk, bpk, 0, c.reshape(-1), 0, N, M, N, K, T, 1, bias,
                    0 if bias_axis == 0 else 1, count, a_where, b_rows, cm)
    if c is not out:
        out[...] = c
    return out, bad


def matmul_nd(a, b, out=None):
    """``numpy.matmul(a, b)`` semantics (1-D operands promoted and squeezed, leading batch
    axes broadcast) with every 2-D product by :func:`matmul`: the same bits on every CPU,
    for any thread count.  Returns a new float64 array, or fills ``out``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    # (two 2-D operands, the usual case, skip numpy's Python-level broadcast walk)
    batch = (() if a2.ndim == 2 and b2.ndim == 2
             else np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    M, K = a2.shape[-2:]
    N = b2.shape[-1]
    if batch and b2.ndim == 2:
        # one GEMM over every row of the stack (each output's chain is the same)
        res = matmul(np.ascontiguousarray(a2).reshape(-1, K), b2).reshape(batch + (M, N))
    elif batch:
        res = np.empty(batch + (M, N), dtype=np.float64)
        ab = np.broadcast_to(a2, batch + (M, K))
        bb = np.broadcast_to(b2, batch + (K, N))
        for idx in np.ndindex(*batch):
            matmul(ab[idx], bb[idx], out=res[idx])
    else:
        res = matmul(a2, b2)
    if a.ndim == 1:
        res = res[..., 0, :]
    if b.ndim == 1:
        res = res[..., 0]
    if out is None:
        return np.ascontiguousarray(res)
    out[...] = res
    return out
