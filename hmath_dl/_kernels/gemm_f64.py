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
  each tile's chain continuing in ``c`` from chunk to chunk (exactly one chain);
* :func:`gemm_rows` (portable): per output row, ``c_row = fma(a[m, k], b[k, :], c_row)``
  for k in order -- the same chains, vectorised across columns by the compiler.
"""

import threading

import numpy as np
from numba import prange

from ._jit import kernel
from ._simd import _ROW_MAXV, _VW, _fma, _make_interleave, _make_micro_acc, _transpose_block

_CB = 6                     # rows of a per register block
_KC = 128 if _VW == 8 else 256   # terms per K chunk: a tile's chunk of b (KC x T) fits L1
_NC = 64 * _VW              # columns per parallel panel (512 on AVX-512, 256 on AVX2)
_MC = 16 * _CB              # rows per parallel panel (96)

_interleave6 = _make_interleave(_CB)
_T = _ROW_MAXV * _VW         # widest register tile (32 columns on AVX-512, 8 on AVX2)
_mv1 = _make_micro_acc(_CB, 1)
_mv2 = _make_micro_acc(_CB, 2) if _ROW_MAXV >= 2 else _mv1
_mv3 = _make_micro_acc(_CB, 3) if _ROW_MAXV >= 3 else _mv2
_mv4 = _make_micro_acc(_CB, 4) if _ROW_MAXV >= 4 else _mv3


@kernel
def gemm_tiled(apk, bpk, c, K, Np, T):
    """``c [Mp, Np] = a @ b`` by the specification above (``c`` is overwritten: the first
    K chunk starts every chain at +0.0 without reading it).

    ``apk`` is ``a [Mp, K]`` packed as ``[Mp/6, K, 6]`` (zero rows pad ``Mp`` to a multiple
    of 6), ``bpk`` is ``b [K, Np]`` packed as ``[Np/T, K, T]`` (T = the tile width, zero
    columns pad ``Np`` to a multiple of T), so both operands stream contiguously; flat
    C-contiguous float64.  Parallel over (row panel, column panel) pairs; each output's
    chain runs in one iteration, chunk after chunk in k order."""
    Mp = c.shape[0] // Np if Np > 0 else 0
    nmb = Mp // _CB
    bpp = _MC // _CB
    V = T // _VW
    tpp = max(1, _NC // T)
    pm = (nmb + bpp - 1) // bpp
    ntile = Np // T
    pn = (ntile + tpp - 1) // tpp
    for t in prange(pm * pn):
        im = t // pn
        jn = t % pn
        b0 = im * bpp
        b1 = min(nmb, b0 + bpp)
        t0 = jn * tpp
        t1 = min(ntile, t0 + tpp)
        for k0 in range(0, K, _KC):
            nk = min(_KC, K - k0)
            first = k0 == 0          # the chains start here: +0.0, c is not read
            # BLIS's order: one tile's chunk of b (KC x T, in L1) meets every 6-row block of
            # the panel's chunk of a (from L2), then the next tile; each call prefetches the
            # c tile of the next call (the next block's rows, or the next tile's first block)
            for tile in range(t0, t1):
                bbase = (tile * K + k0) * T
                for blk in range(b0, b1):
                    ab = (blk * K + k0) * _CB
                    cb = blk * _CB * Np + tile * T
                    pf = cb + _CB * Np if blk + 1 < b1 else b0 * _CB * Np + (tile + 1) * T
                    if V == 4:
                        _mv4(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf)
                    elif V == 3:
                        _mv3(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf)
                    elif V == 2:
                        _mv2(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf)
                    else:
                        _mv1(bpk, bbase, T, apk, ab, nk, c, cb, Np, first, pf)


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


@kernel
def _pack_b(b, bpk, K, T):
    """``b [K, N]`` -> ``bpk [ceil(N/T), K, T]`` (flat), zero columns past N (a copy: no
    arithmetic).  Parallel over blocks of rows, each row of ``b`` read once, front to back
    (walking a T-column strip down all K rows instead touches a new page per row)."""
    N = b.shape[1]
    ntile = bpk.shape[0] // (K * T) if K > 0 else 0
    nkb = (K + 15) // 16
    for kb in prange(nkb):
        for k in range(kb * 16, min(K, kb * 16 + 16)):
            br = b[k]
            for tile in range(ntile):
                n0 = tile * T
                w = min(T, N - n0)
                base = (tile * K + k) * T
                for i in range(w):
                    bpk[base + i] = br[n0 + i]
                for i in range(w, T):
                    bpk[base + i] = 0.0


@kernel
def _pack_bt(bt, bpk, K, T):
    """``bt [N, K]`` (b transposed) -> ``bpk [ceil(N/T), K, T]`` (flat), zero columns past
    N, without a transposed copy of b first; parallel over tiles.  Full ``VW x VW``
    blocks go through :func:`._simd._transpose_block` (vector loads along ``bt``'s rows,
    vector stores along the panel's); the edges element by element."""
    N = bt.shape[0]
    ntile = bpk.shape[0] // (K * T) if K > 0 else 0
    flat = bt.reshape(-1)
    kfull = K - K % _VW
    for tile in prange(ntile):
        n0 = tile * T
        w = min(T, N - n0)
        wfull = w - w % _VW
        base = tile * K * T
        for k0 in range(0, kfull, _VW):
            for i0 in range(0, wfull, _VW):
                _transpose_block(flat, (n0 + i0) * K + k0, K, bpk, base + k0 * T + i0, T)
            for k in range(k0, k0 + _VW):
                for i in range(wfull, w):
                    bpk[base + k * T + i] = bt[n0 + i, k]
        for k in range(kfull, K):
            for i in range(w):
                bpk[base + k * T + i] = bt[n0 + i, k]
        for k in range(K):
            for i in range(w, T):
                bpk[base + k * T + i] = 0.0


@kernel
def _pack_a(a, apk, K):
    """``a [M, K]`` -> ``apk [ceil(M/6), K, 6]`` (flat), zero rows past M; parallel over
    blocks.  A full block's ``6 x VW`` pieces go through :func:`._simd._make_interleave`
    (vector loads along the rows, contiguous stores); the edges element by element."""
    M = a.shape[0]
    nmb = apk.shape[0] // (K * _CB) if K > 0 else 0
    flat = a.reshape(-1)
    kfull = K - K % _VW
    for blk in prange(nmb):
        m0 = blk * _CB
        k1 = kfull if m0 + _CB <= M else 0
        for k0 in range(0, k1, _VW):
            _interleave6(flat, m0 * K + k0, K, apk, (blk * K + k0) * _CB)
        for k in range(k1, K):
            base = (blk * K + k) * _CB
            for j in range(_CB):
                m = m0 + j
                apk[base + j] = a[m, k] if m < M else 0.0


@kernel
def _pack_at(at, apk, K):
    """``a [M, K]`` given as its transpose ``at [K, M]`` (C-contiguous: the ``x.T`` of a
    weight gradient) -> ``apk [ceil(M/6), K, 6]`` (flat), zero rows past M, without a
    transposed copy first: each term's 6 values are adjacent in a row of ``at``."""
    M = at.shape[1]
    nmb = apk.shape[0] // (K * _CB) if K > 0 else 0
    for blk in prange(nmb):
        m0 = blk * _CB
        w = min(_CB, M - m0)
        for k in range(K):
            base = (blk * K + k) * _CB
            row = at[k]
            for j in range(w):
                apk[base + j] = row[m0 + j]
            for j in range(w, _CB):
                apk[base + j] = 0.0


_WS = threading.local()
_WS_MAX = 1 << 23            # float64 elements (64 MiB) a thread keeps for packed panels


def _workspace(name, n, dtype=np.float64):
    """A buffer of ``n`` elements of ``dtype`` for packing, kept per Python thread and name
    and reused (fresh pages cost a fault each: a 512x1024x1024 product paid ~5 ms of its
    ~14 ms for them); requests above 64 MiB are allocated afresh.  64-byte aligned."""
    dtype = np.dtype(dtype)
    if n * dtype.itemsize > _WS_MAX * 8:
        return _aligned(n, dtype)
    buf = getattr(_WS, name, None)
    if buf is None or buf.dtype != dtype or buf.shape[0] < n:
        buf = _aligned(max(n, 1 << 12), dtype)
        setattr(_WS, name, buf)
    return buf[:n]


def _aligned(n, dtype=np.float64):
    """``numpy.empty(n, dtype)`` starting on a 64-byte boundary (a cache line): numpy's
    allocator gives 16 bytes, and then most 64-byte vector loads of a packed panel
    straddle two cache lines."""
    size = np.dtype(dtype).itemsize
    raw = np.empty(n * size + 64, dtype=np.uint8)
    off = -raw.ctypes.data % 64
    return raw[off:off + n * size].view(dtype)


_SERIAL_FMAS = 1 << 21      # below this many multiply-adds one thread does it (~0.2 ms)


def matmul(a, b, out=None, tiled=None):
    """``a [M, K] @ b [K, N]`` by the specification of this module (plain Python launcher:
    ``a``, ``b`` 2-D float64; returns a new C-contiguous ``[M, N]`` array, or fills
    ``out``).  ``tiled`` forces the path (None: the machine policy decides)."""
    from ._cpu import machine
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    M, K = a.shape
    N = b.shape[1]
    # b given as the transpose of a C-contiguous array (w.T in dense, cols.T in the
    # convolution gradient): pack from that array's rows instead of copying b first
    bt = b.T if (not b.flags.c_contiguous and b.T.flags.c_contiguous) else None
    if bt is None and not b.flags.c_contiguous:
        b = np.ascontiguousarray(b)
    if M == 0 or N == 0 or K == 0:
        if out is None:
            out = np.empty((M, N), dtype=np.float64)
        out[...] = 0.0
        return out
    if tiled is None:
        tiled = machine().tiled and M >= _CB      # fewer rows: packing b costs the product
    small = M * N * K < _SERIAL_FMAS
    # a given as the transpose of a C-contiguous array (x.T in a weight gradient): the
    # tiled path packs from that array's rows instead of copying a first
    at = a.T if (tiled and not a.flags.c_contiguous and a.T.flags.c_contiguous) else None
    if at is None:
        a = np.ascontiguousarray(a)
    if not tiled:
        if bt is not None:
            b = np.ascontiguousarray(b)
        if out is None:
            out = np.empty((M, N), dtype=np.float64)
        k = gemm_rows.serial if small else gemm_rows
        if out.flags.c_contiguous:
            k(a, b, out)
        else:
            tmp = np.empty((M, N))
            k(a, b, tmp)
            out[...] = tmp
        return out
    Mp = -(-M // _CB) * _CB
    T = min(_T, -(-N // _VW) * _VW)        # narrower tiles for narrow products
    Np = -(-N // T) * T
    packs = small or M * K + K * N < (1 << 16)      # copies too small to split
    apk = _workspace("a", (Mp // _CB) * K * _CB)
    if at is not None:
        (_pack_at.serial if packs else _pack_at)(at, apk, K)
    else:
        (_pack_a.serial if packs else _pack_a)(a, apk, K)
    bpk = _workspace("b", (Np // T) * K * T)
    if bt is not None:
        (_pack_bt.serial if packs else _pack_bt)(bt, bpk, K, T)
    else:
        (_pack_b.serial if packs else _pack_b)(b, bpk, K, T)
    direct = out is not None and Mp == M and Np == N and out.flags.c_contiguous
    c = out if direct else np.empty((Mp, Np))       # K > 0: the kernel writes every element
    (gemm_tiled.serial if small else gemm_tiled)(apk, bpk, c.reshape(-1), K, Np, T)
    if direct:
        return out
    if out is None:
        # padding rows only: the first M rows are already a C-contiguous [M, N] array
        return c[:M] if Np == N else np.ascontiguousarray(c[:M, :N])
    out[...] = c[:M, :N]
    return out


def matmul_nd(a, b, out=None):
    """``numpy.matmul(a, b)`` semantics (1-D operands promoted and squeezed, leading batch
    axes broadcast) with every 2-D product by :func:`matmul`: the same bits on every CPU,
    for any thread count.  Returns a new float64 array, or fills ``out``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
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
