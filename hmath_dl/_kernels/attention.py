"""Attention and rotary-embedding kernels (no validation; see ``hmath_dl.layers.attention``).

Entry points
------------
``attention_forward(q, k, v, mask, bias, out, weights, gkv=1, scale=0.0, heads=1)
-> (status, row)``
    Scaled dot-product attention over a flat batch.  This is the entry point that
    ``hmath_dl.layers.attention`` and the autodiff layer build on.  ``heads > 1``: the
    head layout of :func:`attention_forward` (q/k/v/out ``[B/heads, N, heads*D]``, each
    head in its own feature columns); the shapes below are then per head.

    * ``q [B, N, D]``, ``k [B/gkv, M, D]``, ``v [B/gkv, M, F]``: C-contiguous float64,
      finite, ``D >= 1``; query batch ``b`` attends with key/value batch ``b // gkv``
      (grouped-query attention when ``gkv > 1``).
    * ``scale``: 0.0 means ``/ sqrt(D)`` (the default scores below); any other value
      replaces the division by ``* scale``.
    * ``mask``: C-contiguous bool ``[Bm, N, M]`` (True = allowed).  ``Bm == 0`` means
      "no mask" (pass ``np.ones((0, 0, 0), np.bool_)``); otherwise ``Bm`` divides ``B``
      and batch ``b`` uses mask ``b // (B // Bm)`` (so ``Bm == 1`` broadcasts, ``Bm == B``
      is one mask per batch, and ``Bm == B / h`` shares a mask between ``h`` consecutive
      batches, e.g. heads).
    * ``bias``: C-contiguous finite float64 ``[Bb, N, M]``, same convention
      (``Bb == 0``: no bias, pass ``np.zeros((0, 0, 0))``).
    * ``out [B, N, F]`` and ``weights [B, N, M]``: C-contiguous float64, written
      completely (their previous contents do not matter).

    Per row ``(b, i)``: ``s_j = (sum_d q[b,i,d] * k[b,j,d]) / sqrt(D) + bias[., i, j]`` for
    every allowed key ``j`` (the dot product summed in increasing ``d`` from 0.0; a masked
    key's score may be computed as part of a register tile but is never used, so an
    overflow there does not matter), ``m = max_j s_j``,
    ``e_j = exp(s_j - m)`` (a vectorised polynomial exp, at most 1 ulp, see
    ``_exp_shifted``), ``t = sum_j e_j`` (increasing ``j``), ``weights[b,i,j] = e_j / t``
    (exact 0 for masked keys), ``out[b,i,f] = sum_j weights[b,i,j] * v[b,j,f]`` in increasing
    ``j`` from 0.0 (over a key range that covers the allowed keys; masked keys add their
    exact-zero weight times a finite value).  A row without an allowed key is exact zeros
    in both outputs.

    Returns ``(status, row)`` (:mod:`.status`): ``(OK, -1)`` on success,
    ``(SCORE_OVERFLOW, r)`` when an allowed score of flat row ``r = b * N + i`` is not
    finite (``q . k`` or ``+ bias`` overflowed), ``(OVERFLOW, r)`` when an output of row
    ``r`` is not finite; ``r`` is the first such row.  The result is bitwise
    independent of the number of threads (rows are independent; every sum has a fixed order).

``attention_backward(q, k, v, p, go, scale, dq, dk, dv, heads=1)``
    Its gradient (see the function), in the same layouts.

The products (scores, outputs, and the backward's four) run on the float GEMMs'
micro-kernel (``_simd._make_micro_acc`` with separately rounded products: each output is
the specified chain), four rows at a time; both kernels are span kernels
(:class:`._jit.SpanKernel`: one serial compilation, run in parallel by the generic driver).

``rotary_forward(x, base, offset, out) -> status``
    ``x [R, S, F]`` (F even) -> ``out``; row ``s`` is position ``offset + s``; pair
    ``(2i, 2i+1)`` rotates by ``(offset + s) * base ** (-(2i) / F)`` (the power as
    ``exp(-((2i)/F) log(base))``, sin/cos and exp/log the library's own, ``libm.py``: the
    same bits on every CPU).  Returns the index of the first non-finite output element
    (flat), or ``NO_INDEX`` (-1).
"""

import numpy as np
from numba import prange

from ._jit import helper, inlined, kernel, span_kernel
from ._simd import _VW, _make_micro_acc, alive, borrowed
from .libm import _wide, cos_inline, exp_inline, log_inline, sin_inline
from .status import NO_INDEX, OK, OVERFLOW, SCORE_OVERFLOW
from .views import readonly

# Query rows handled together: their scores (and outputs) are register tiles of the float
# GEMMs' micro-kernel (``_simd._make_micro_acc`` with separately rounded products): _QB rows
# x _KV vectors of keys (features, for the outputs), every key column loaded once per block.
# The products read their ``a`` operand (weight rows; in the backward go, ds, p) where it
# lies, through two strides (only a block of fewer than _QB rows is copied); the forward's
# query rows are copied per block (a few dozen values: one micro-kernel site less).
_QB = 4
_KV = 2
_KT = _VW * _KV
_mstrided = _make_micro_acc(_QB, _KV, fused=False, astrided=True)


@inlined
def _row_range(mf, off, m_keys):
    """(first allowed key, last allowed key, number of allowed keys) of the mask row
    ``mf[off:off + m_keys]``; (m_keys, -1, 0) when nothing is allowed."""
    lo = m_keys
    for j in range(m_keys):
        if mf[off + j]:
            lo = j
            break
    if lo == m_keys:
        return m_keys, -1, 0
    hi = lo
    for j in range(m_keys - 1, lo, -1):
        if mf[off + j]:
            hi = j
            break
    cnt = 0
    u0 = np.uint64(off + lo)
    for j in range(np.uint64(hi + 1 - lo)):
        cnt += np.int64(mf[u0 + j])
    return lo, hi, cnt


@inlined
def _exp_shifted(x, off, n, shift, bits, bitsf):
    """x[off + j] <- exp(x[off + j] - shift) in place for j < n, for x <= shift (``x`` may
    be -inf); ``bits`` is int64 scratch of at least ``n`` elements and ``bitsf`` the same
    memory viewed as float64.

    Vectorisable: Cody-Waite reduction ``t = k ln2 + r`` (|r| <= ln2/2, k = round(t/ln2)),
    degree-13 Taylor polynomial of ``exp(r)`` in Horner form, times ``2**k`` assembled from
    its bits.  Plain IEEE operations in a fixed order (no FMA contraction), so the result is
    the same bits on every machine; error at most 1 ulp against the correctly rounded
    value.  ``t < -746`` (-inf included: masked keys) gives exact 0 in the vector loop;
    ``-746 <= t < -708`` (where ``2**k`` would be subnormal) takes the libm path."""
    under = 0
    un = np.uint64(n)
    uo = np.uint64(off)
    for j in range(un):
        t0 = x[uo + j] - shift
        tiny = t0 < -746.0
        low = t0 < -708.0
        under += low and not tiny
        t = -708.0 if low else t0
        kf = (t * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0
        r = (t - kf * 6.93147180369123816490e-01) - kf * 1.90821492927058770002e-10
        p = 1.6059043836821613e-10
        p = p * r + 2.08767569878681e-09
        p = p * r + 2.505210838544172e-08
        p = p * r + 2.755731922398589e-07
        p = p * r + 2.7557319223985893e-06
        p = p * r + 2.48015873015873e-05
        p = p * r + 0.0001984126984126984
        p = p * r + 0.001388888888888889
        p = p * r + 0.008333333333333333
        p = p * r + 0.041666666666666664
        p = p * r + 0.16666666666666666
        p = p * r + 0.5
        p = p * r + 1.0
        p = p * r + 1.0
        x[uo + j] = 0.0 if tiny else (t0 if low else p)
        bits[j] = (np.int64(kf) + 1023) << 52
    if under == 0:
        for j in range(un):
            x[uo + j] = x[uo + j] * bitsf[j]
    else:
        for j in range(un):
            t = x[uo + j]
            if t < -746.0:
                x[uo + j] = 0.0
            elif t < -708.0:
                x[uo + j] = exp_inline(t)     # the library's own (libm.py): subnormal results
            else:
                x[uo + j] = t * bitsf[j]
    return under


@inlined
def _scores_tiles(ktf, mp, qp, qpo, qk, qr, s, kbase, d, blo, bhi):
    """s[r*mp + j] = q_r . k_j for the _QB rows ``q_r[c] = qp[qpo + c*qk + r*qr]`` and
    every key j of the score tiles (``_KT`` keys each, aligned to ``_KT``) covering
    ``blo .. bhi``: each score one chain over the features in increasing order, starting
    from 0.0, every term ``fl(s + fl(q*k))`` (the micro-kernel of the float GEMMs with
    separately rounded products).  ``ktf`` holds the keys transposed and zero-padded to
    ``mp`` columns (``ktf[kbase + c*mp + j] = k[., j, c]``); scores of keys outside
    ``blo .. bhi`` are computed too and ignored."""
    j0 = (blo // _KT) * _KT
    while j0 <= bhi:
        _mstrided(ktf, kbase + j0, mp, qp, qpo, d, s, j0, mp, True, j0, qk, qr)
        j0 += _KT


@inlined
def _values_tiles(vf, vbase, fp, wp, wpo, wk, wr, n, op, opo):
    """op[opo + r*fp + c] = sum_j wp[wpo + j*wk + r*wr] * v_j[c] for the _QB rows, j < n increasing,
    starting from 0.0, every term ``fl(o + fl(w*v))``; ``v_j[c] = vf[vbase + j*fp + c]``
    (``fp`` a multiple of ``_KT``)."""
    f0 = 0
    while f0 < fp:
        _mstrided(vf, vbase + f0, fp, wp, wpo, n, op, opo + f0, fp, True, opo + f0, wk, wr)
        f0 += _KT


@inlined
def _zero(a, off, n):
    """a[off:off + n] = 0.0"""
    uo = np.uint64(off)
    for j in range(np.uint64(n)):
        a[uo + j] = 0.0


@inlined
def _scale_scores(s, so, n, biasf, bo, has_bias, inv_d, sqrt_d):
    """s[so + j] <- s[so + j] * inv_d (+ bias), or / sqrt_d when ``inv_d`` is 0, j < n."""
    us, ub, un = np.uint64(so), np.uint64(bo), np.uint64(n)
    if inv_d != 0.0:
        if has_bias:
            for j in range(un):
                s[us + j] = s[us + j] * inv_d + biasf[ub + j]
        else:
            for j in range(un):
                s[us + j] = s[us + j] * inv_d
    else:
        if has_bias:
            for j in range(un):
                s[us + j] = s[us + j] / sqrt_d + biasf[ub + j]
        else:
            for j in range(un):
                s[us + j] = s[us + j] / sqrt_d


@inlined
def _softmax_block(s, mp, blo, n, nr, span, flags, mf, mo, biasf, bo, has_bias, inv_d,
                   sqrt_d, wf, wo, m_keys, bits, bitsf, status, srow):
    """Scores of the block's rows (``s[r*mp + blo + j]``, j < n) -> normalised weights in
    the rows ``wf[wo + r*m_keys ...]`` (exact 0 outside each row's allowed keys); ``mo``,
    ``bo``: offsets of row 0's mask and bias rows (``mf``, ``biasf`` flat, rows of
    ``m_keys``).  Rows whose allowed scores are not all finite are marked
    ``SCORE_OVERFLOW`` at ``status[srow + r]`` and lose ``live``.  ``inv_d``: ``1/sqrt_d``
    when that is exact (sqrt_d a power of two, so ``x * inv_d == x / sqrt_d`` bitwise) or
    the caller's explicit scale, else 0.

    Per row the operations are those of the specification: score scaled (``+ bias``),
    ``m`` the maximum of the allowed scores, ``e = exp(s - m)`` (:func:`_exp_shifted`),
    ``t`` the sum of ``e`` over the allowed keys in increasing order from 0.0, ``e / t``.
    Keys of the block span that a row does not allow are set to -inf, so their ``e`` is
    exact 0 and adds nothing to ``t`` (``t`` is never -0.0).  The four rows' maxima and
    sums run as four interleaved chains."""
    for r in range(nr):
        if not flags[_QB + r]:
            continue
        base = r * mp + blo
        _scale_scores(s, base, n, biasf, bo + r * m_keys + blo, has_bias, inv_d, sqrt_d)
        a = span[r] - blo
        z = span[_QB + r] - blo
        ok = True
        if flags[r]:
            # a count, not a float chain: the check vectorises
            bad = 0
            ua = np.uint64(base + a)
            for j in range(np.uint64(z + 1 - a)):
                x = s[ua + j]
                bad += not (x - x == 0.0)
            ok = bad == 0
        else:
            mrow = mo + r * m_keys + blo
            for j in range(a, z + 1):
                if mf[mrow + j]:
                    x = s[base + j]
                    if not (x - x == 0.0):
                        ok = False
                else:
                    s[base + j] = -np.inf
        if not ok:
            status[srow + r] = SCORE_OVERFLOW
            flags[_QB + r] = False
            _zero(wf, wo + r * m_keys, m_keys)
            continue
        for j in range(a):
            s[base + j] = -np.inf
        for j in range(z + 1, n):
            s[base + j] = -np.inf
    # maxima: four chains side by side (rows that are not live give ignored values)
    u0 = np.uint64(blo)
    u1 = np.uint64(mp + blo)
    u2 = np.uint64(2 * mp + blo)
    u3 = np.uint64(3 * mp + blo)
    un = np.uint64(n)
    m0 = -np.inf
    m1 = -np.inf
    m2 = -np.inf
    m3 = -np.inf
    for j in range(un):
        x0 = s[u0 + j]
        x1 = s[u1 + j]
        x2 = s[u2 + j]
        x3 = s[u3 + j]
        m0 = x0 if x0 > m0 else m0
        m1 = x1 if x1 > m1 else m1
        m2 = x2 if x2 > m2 else m2
        m3 = x3 if x3 > m3 else m3
    for r in range(nr):
        if flags[_QB + r]:
            m = m0 if r == 0 else (m1 if r == 1 else (m2 if r == 2 else m3))
            _exp_shifted(s, r * mp + blo, n, m, bits, bitsf)
    t0 = 0.0
    t1 = 0.0
    t2 = 0.0
    t3 = 0.0
    for j in range(un):
        t0 += s[u0 + j]
        t1 += s[u1 + j]
        t2 += s[u2 + j]
        t3 += s[u3 + j]
    for r in range(nr):
        if flags[_QB + r]:
            t = t0 if r == 0 else (t1 if r == 1 else (t2 if r == 2 else t3))
            wrow = wo + r * m_keys
            _zero(wf, wrow, blo)
            us = np.uint64(r * mp + blo)
            uw = np.uint64(wrow + blo)
            for j in range(un):
                wf[uw + j] = s[us + j] / t
            _zero(wf, wrow + blo + n, m_keys - blo - n)


@inlined
def _problem_base(b, n, heads, width):
    """(offset of row 0, row stride) of problem ``b`` in an array ``[B/heads, n,
    heads*width]`` holding problem ``b``'s rows at the feature columns of head
    ``b % heads`` (``heads == 1``: plain ``[B, n, width]``)."""
    return (b // heads) * n * heads * width + (b % heads) * width, heads * width


@inlined
def _attend_block(qf, ktf, mp, vf, fp, mf, ranges, biasf, outf, wf, n_q, d, m_keys, f, heads,
                  b, bk, i0, nr, mb, bb, s, bits, bitsf, span, flags, status, scale):
    """Rows i0 .. i0+nr-1 of batch b, keys/values of batch bk (see the module docstring).

    Flat C-order arrays: ``qf`` / ``outf`` in the head layout of :func:`_problem_base`
    (``[B/heads, N, heads*D]``, ``F`` for ``outf``), ``mf`` / ``biasf`` / ``wf`` ``[., N,
    M]``; ``ktf``/``vf``: the keys transposed and the values, zero-padded to ``mp`` keys and
    ``fp`` features (multiples of ``_KT``); scratch ``s``: the scores ``[_QB, mp]``, then
    the packed queries ``[D, _QB]``, the packed weights ``[M, _QB]`` and the outputs
    ``[_QB, fp]``."""
    has_mask = mf.shape[0] > 0
    has_bias = biasf.shape[0] > 0
    sqrt_d = np.sqrt(np.float64(d))
    # sqrt(D) is a power of two iff D is a power of four
    inv_d = 1.0 / sqrt_d if (d & (d - 1)) == 0 and (d & 0x5555555555555555) != 0 else 0.0
    if scale != 0.0:
        inv_d = scale
    mo = (mb * n_q + i0) * m_keys
    bo = (bb * n_q + i0) * m_keys
    wo = (b * n_q + i0) * m_keys
    qb, qs = _problem_base(b, n_q, heads, d)
    ob, os_ = _problem_base(b, n_q, heads, f)
    qpo = _QB * mp                  # the scratch's parts
    wpo = qpo + d * _QB
    opo = wpo + m_keys * _QB
    blo = m_keys
    bhi = -1
    for r in range(nr):
        if has_mask:
            mrow = mb * n_q + i0 + r
            a = ranges[3 * mrow]
            z = ranges[3 * mrow + 1]
            cnt = ranges[3 * mrow + 2]
        else:
            a = 0
            z = m_keys - 1
            cnt = m_keys
        span[r] = a
        span[_QB + r] = z
        flags[r] = cnt == z - a + 1
        flags[_QB + r] = cnt > 0
        if cnt > 0:
            blo = min(blo, a)
            bhi = max(bhi, z)
    for r in range(nr):
        _zero(outf, ob + (i0 + r) * os_, f)
    if bhi < blo:
        _zero(wf, wo, nr * m_keys)
        return
    n = bhi + 1 - blo
    # the block's query rows copied, feature-major (in a last block of fewer than _QB
    # rows, rows past nr repeat the last real row, so no read passes the end of q): one
    # micro-kernel site for every block (each inlined site is compiled on its own; read
    # in place, full blocks took a second one: 0.8 s more to compile, no faster)
    for r in range(_QB):
        qo = qb + (i0 + min(r, nr - 1)) * qs
        for c in range(d):
            s[qpo + c * _QB + r] = qf[qo + c]
    _scores_tiles(ktf, mp, s, qpo, _QB, 1, s, bk * d * mp, d, blo, bhi)
    for r in range(nr):
        if not flags[_QB + r]:
            _zero(wf, wo + r * m_keys, m_keys)
    _softmax_block(s, mp, blo, n, nr, span, flags, mf, mo, biasf, bo, has_bias, inv_d,
                   sqrt_d, wf, wo, m_keys, bits, bitsf, status,
                   b * n_q + i0)
    # out = weights @ v over the keys blo..bhi, increasing j (weights of masked keys are
    # exact zeros, so they add nothing); the weight rows are read where they lie (a row
    # that is not live holds zeros by now), from one call site; a last block of fewer
    # than _QB rows is copied with zero rows past nr, and rows that are not live have
    # their sums dropped
    wsrc, wso, wk, wr = wf, wo + blo, 1, m_keys
    if nr != _QB:
        un = np.uint64(n)
        uwp = np.uint64(wpo)
        for r in range(_QB):
            ur = np.uint64(r)
            if r < nr:
                uw = np.uint64(wo + r * m_keys + blo)
                for j in range(un):
                    s[uwp + j * np.uint64(_QB) + ur] = wf[uw + j]
            else:
                for j in range(un):
                    s[uwp + j * np.uint64(_QB) + ur] = 0.0
        wsrc, wso, wk, wr = s, wpo, _QB, 1
    _values_tiles(vf, (bk * m_keys + blo) * fp, fp, wsrc, wso, wk, wr, n, s, opo)
    uf = np.uint64(f)
    for r in range(nr):
        if flags[_QB + r]:
            uo = np.uint64(ob + (i0 + r) * os_)
            up = np.uint64(opo + r * fp)
            bad = 0
            for c in range(uf):
                x = s[up + c]
                outf[uo + c] = x
                bad += not (x - x == 0.0)
            if bad != 0:
                status[b * n_q + i0 + r] = OVERFLOW


@span_kernel(iterations=lambda k, v, ktf, vf, m_keys, d, f, heads, mp, fp:
             ktf.shape[0] // max(1, d * mp),
             work=lambda k, v, ktf, vf, *rest: ktf.shape[0] + vf.shape[0])
def _operands(k, v, ktf, vf, m_keys, d, f, heads, mp, fp, t0, t1):
    """Problems ``t0 .. t1-1`` of the forward's per-call operands (a copy: no arithmetic):
    keys transposed to ``ktf [B, D, mp]`` and values to ``vf [B, M, fp]``, zero-padded to
    whole tiles, from the head layout of :func:`_problem_base`.  Each key row is read once
    along its features (the transposed writes stay in the problem's few KiB of ``ktf``);
    unsigned offsets, so the copies carry no negative-index test."""
    kflat = k.reshape(-1)
    vflat = v.reshape(-1)
    ud, uf, ump, ufp = np.uint64(d), np.uint64(f), np.uint64(mp), np.uint64(fp)
    um = np.uint64(m_keys)
    for b in range(t0, t1):
        kb, ks = _problem_base(b, m_keys, heads, d)
        kt0 = np.uint64(b) * ud * ump
        for j in range(um):
            o = np.uint64(kb) + j * np.uint64(ks)
            for c in range(ud):
                ktf[kt0 + c * ump + j] = kflat[o + c]
        for c in range(ud):
            for j in range(um, ump):
                ktf[kt0 + c * ump + j] = 0.0
        vb, vs = _problem_base(b, m_keys, heads, f)
        for j in range(um):
            o = np.uint64(vb) + j * np.uint64(vs)
            base = (np.uint64(b) * um + j) * ufp
            for c in range(uf):
                vf[base + c] = vflat[o + c]
            for c in range(uf, ufp):
                vf[base + c] = 0.0


@helper
def _mask_ranges(mask, m_keys):
    """(first allowed key, last allowed key, allowed keys) of every mask row."""
    rows = mask.shape[0] * mask.shape[1]
    ranges = np.empty(3 * rows, dtype=np.int64)
    mf = mask.reshape(-1)
    for t in range(rows):
        a, z, cnt = _row_range(mf, t * m_keys, m_keys)
        ranges[3 * t] = a
        ranges[3 * t + 1] = z
        ranges[3 * t + 2] = cnt
    return ranges


@span_kernel()
def _attend_chunks(qf, ktf, mp, vf, fp, mf, ranges, biasf, outf, wf, nb, n_q, d, m_keys, f,
                   heads, gkv, gm, gb, status, scale, nchunk, t0, t1):
    """Chunks ``t0 .. t1-1`` of the ``nchunk`` contiguous chunks of query blocks (``_QB``
    rows of one problem each; scratch allocated once per chunk).  Blocks are independent
    and every sum has a fixed order, so no result depends on the chunking or on the
    thread count."""
    _wide()
    nblk = (n_q + _QB - 1) // _QB
    total = nb * nblk
    s0 = np.empty(_QB * (mp + d + m_keys + fp), dtype=np.float64)
    bits0 = np.empty(m_keys, dtype=np.int64)
    span0 = np.empty(2 * _QB, dtype=np.int64)      # first, last allowed key per row
    flags0 = np.empty(2 * _QB, dtype=np.bool_)     # dense, live per row
    # borrowed views (no reference counting) of every array the per-block helpers take:
    # as plain arrays each helper call counted each of them up and down, atomically
    s, bits, span, flags = borrowed(s0), borrowed(bits0), borrowed(span0), borrowed(flags0)
    bitsf = bits.view(np.float64)
    qb_, ktb, vb = borrowed(qf), borrowed(ktf), borrowed(vf)
    mb_, rb = borrowed(mf), borrowed(ranges)
    bb_, ob, wb, sb = borrowed(biasf), borrowed(outf), borrowed(wf), borrowed(status)
    for ch in range(t0, t1):
        for t in range(ch * total // nchunk, (ch + 1) * total // nchunk):
            b = t // nblk
            i0 = (t - b * nblk) * _QB
            nr = min(n_q - i0, _QB)
            _attend_block(qb_, ktb, mp, vb, fp, mb_, rb, bb_, ob, wb, n_q, d, m_keys, f,
                          heads, b, b // gkv, i0, nr, b // gm, b // gb, s, bits, bitsf, span,
                          flags, sb, scale)
    alive(s0)
    alive(bits0)
    alive(span0)
    alive(flags0)


def _attention_forward(q, k, v, mask, bias, out, weights, gkv, scale, heads):
    """See the module docstring: the operands prepared once (:func:`_operands`,
    :func:`_mask_ranges`), then the query blocks in parallel chunks
    (:func:`_attend_chunks`)."""
    nb, n_q, m_keys = weights.shape
    d = q.shape[2] // heads
    f = v.shape[2] // heads
    nbm, nbb = mask.shape[0], bias.shape[0]
    mp = (m_keys + _KT - 1) // _KT * _KT
    fp = (f + _KT - 1) // _KT * _KT
    nbk = nb // gkv
    ktf = np.empty(nbk * d * mp)
    vf = np.empty(nbk * m_keys * fp)
    _operands(k, v, ktf, vf, np.int64(m_keys), np.int64(d), np.int64(f), np.int64(heads),
              np.int64(mp), np.int64(fp))
    ranges = _mask_ranges(mask, np.int64(m_keys))
    status = np.zeros(nb * n_q, dtype=np.int8)
    nchunk = min(nb * ((n_q + _QB - 1) // _QB), 256)
    _attend_chunks.run(nchunk, nb * n_q * (m_keys + 1), q.reshape(-1), ktf, np.int64(mp), vf,
                       np.int64(fp), mask.reshape(-1), ranges, bias.reshape(-1),
                       out.reshape(-1), weights.reshape(-1), np.int64(nb), np.int64(n_q),
                       np.int64(d), np.int64(m_keys), np.int64(f), np.int64(heads),
                       np.int64(gkv), np.int64(nb // nbm if nbm > 0 else 1),
                       np.int64(nb // nbb if nbb > 0 else 1), status, float(scale),
                       np.int64(nchunk))
    bad = np.flatnonzero(status)
    if bad.size:
        r = int(bad[0])
        return int(status[r]), r
    return int(OK), int(NO_INDEX)


@helper
def _frequency(base, i, f):
    """``base ** (-2i/F)`` as ``exp(-((2i)/F) * log(base))`` with the library's own exp and
    log (:mod:`hmath_dl._kernels.libm`; no libm ``pow``): within about 10 ulps of the exact
    power for ``base <= 1e4`` (the rounding of the exponent, at most ``ulp(log(base))``
    absolute, is what exp amplifies)."""
    return exp_inline(-(np.float64(2 * i) / np.float64(f)) * log_inline(base))


@kernel
def _rotary_forward(x, base, offset, out):
    """See the module docstring."""
    nr, n_s, f = x.shape
    half = f // 2
    cos_t = np.empty((n_s, half), dtype=np.float64)
    sin_t = np.empty((n_s, half), dtype=np.float64)
    for s in prange(n_s):
        pos = np.float64(offset + s)
        for i in range(half):
            angle = pos * _frequency(base, i, f)
            cos_t[s, i] = cos_inline(angle)
            sin_t[s, i] = sin_inline(angle)
    bad = np.zeros(nr * n_s, dtype=np.bool_)
    for t in prange(nr * n_s):
        r = t // n_s
        s = t - r * n_s
        acc = 0.0
        for i in range(half):
            x0 = x[r, s, 2 * i]
            x1 = x[r, s, 2 * i + 1]
            c = cos_t[s, i]
            sn = sin_t[s, i]
            y0 = x0 * c - x1 * sn
            y1 = x0 * sn + x1 * c
            out[r, s, 2 * i] = y0
            out[r, s, 2 * i + 1] = y1
            acc += y0 * 0.0 + y1 * 0.0
        bad[t] = acc != 0.0
    for t in range(nr * n_s):
        if bad[t]:
            r = t // n_s
            s = t - r * n_s
            for c in range(f):
                if not np.isfinite(out[r, s, c]):
                    return np.int64(t * f + c)
    return np.int64(NO_INDEX)


def attention_forward(q, k, v, mask, bias, out, weights, gkv=1, scale=0.0, heads=1):
    """Scaled dot-product attention; see the module docstring (inputs are only read).

    ``heads > 1`` (then ``gkv == 1``): ``q``, ``k``, ``v`` and ``out`` are ``[B/heads, N,
    heads*D]`` (``M``, ``F`` as usual) and problem ``b`` is head ``b % heads`` of batch
    ``b // heads``, i.e. the feature columns ``[h*D, (h+1)*D)``: multi-head attention
    without split or merge copies; ``weights`` is ``[B, N, M]`` as always."""
    if heads != 1 and gkv != 1:
        raise ValueError("attention_forward: heads > 1 needs gkv == 1")
    # inputs typed read-only: one compiled specialisation whether or not the caller's
    # arrays are read-only (e.g. views from ``cache_values``)
    return _attention_forward(readonly(q), readonly(k), readonly(v), readonly(mask),
                              readonly(bias), out, weights, int(gkv), float(scale), int(heads))


def rotary_forward(x, base, offset, out):
    """Rotary embedding; see the module docstring (``x`` is only read)."""
    return _rotary_forward(readonly(x), float(base), np.int64(offset), out)


# --------------------------------------------------------------------------- backward
@inlined
def _union_span(lo, hi, a, n):
    """(min lo[t], max hi[t]) over the t in ``a .. a+n-1`` whose span is not empty
    (``hi[t] >= 0``); ``(0, -1)`` (no terms) when all are."""
    ulo = np.int64(1) << 62
    uhi = -1
    for t in range(a, a + n):
        if hi[t] >= 0:
            ulo = min(ulo, lo[t])
            uhi = max(uhi, hi[t])
    return (ulo, uhi) if uhi >= 0 else (0, -1)


@inlined
def _rows_spanning(rlo, rhi, n, jl, jh):
    """``(first, last)`` of the rows ``i < n`` whose span ``[rlo[i], rhi[i]]`` meets the
    keys ``jl .. jh`` (``(0, -1)`` when none does; an empty span is ``rlo > rhi``)."""
    first = 0
    while first < n and (rlo[first] > jh or rhi[first] < jl):
        first += 1
    if first == n:
        return 0, -1
    last = n - 1
    while rlo[last] > jh or rhi[last] < jl:
        last -= 1
    return first, last


@inlined
def _padded_rows(src, o0, rs, rows, width, wp, nrows):
    """``[nrows, wp]`` copy of a ``[rows, width]`` operand (row ``i`` at ``src[o0 + i*rs]``),
    zeros past ``width`` and past ``rows``: the micro-kernel's ``b`` rows, whole vectors."""
    out = np.zeros(nrows * wp)
    uw, uwp, urs = np.uint64(width), np.uint64(wp), np.uint64(rs)
    for i in range(np.uint64(rows)):
        o = np.uint64(o0) + i * urs
        d = i * uwp
        for c in range(uw):
            out[d + c] = src[o + c]
    return out


@inlined
def _store_rows(acc, wp, r0, nr, width, out, o0, rs):
    """Rows ``r0 .. r0+nr-1`` (at ``out[o0 + i*rs]``) <- the first ``width`` values of the
    rows of ``acc [., wp]``."""
    uw, uwp, urs = np.uint64(width), np.uint64(wp), np.uint64(rs)
    for r in range(np.uint64(nr)):
        o = np.uint64(o0 + r0 * rs) + r * urs
        a = r * uwp
        for c in range(uw):
            out[o + c] = acc[a + c]


@inlined
def _chain(acc, ds, e, pf, p, lo, hi):
    """``acc`` plus the terms ``ds[e + j] * pf[p + j]``, ``j = lo .. hi`` in order."""
    ue, up = np.uint64(e), np.uint64(p)
    for j in range(np.uint64(lo), np.uint64(hi + 1)):
        acc += ds[ue + j] * pf[up + j]
    return acc


@inlined
def _rowsums4(ds, pf, rw):
    """``rowsum(dp * p)`` of four rows of the backward: row ``r``'s sum is one chain over
    its own span, ``j`` increasing from 0.0 -- ``ds[e + j] * pf[p + j]`` for ``j = lo ..
    hi`` with ``(e, p, lo, hi) = rw[r], rw[4 + r], rw[8 + r], rw[12 + r]``; a row with
    ``hi < lo`` sums to 0.0 (its ``e, p`` must still be a valid row's).  The four chains
    are interleaved over the part ``[L, H]`` that every summed row covers (no test per
    term); each row's terms before ``L`` are added first and those after ``H`` last, so
    every chain keeps its order."""
    L = 0
    H = np.int64(1) << 62
    n = 0
    for r in range(4):
        if rw[12 + r] >= rw[8 + r]:
            L = max(L, rw[8 + r])
            H = min(H, rw[12 + r])
            n += 1
    if n == 0 or L > H:   # no row, or no common part: one chain per row
        return (_chain(0.0, ds, rw[0], pf, rw[4], rw[8], rw[12]),
                _chain(0.0, ds, rw[1], pf, rw[5], rw[9], rw[13]),
                _chain(0.0, ds, rw[2], pf, rw[6], rw[10], rw[14]),
                _chain(0.0, ds, rw[3], pf, rw[7], rw[11], rw[15]))
    u0 = rw[12] >= rw[8]
    u1 = rw[13] >= rw[9]
    u2 = rw[14] >= rw[10]
    u3 = rw[15] >= rw[11]
    a0 = _chain(0.0, ds, rw[0], pf, rw[4], rw[8], L - 1) if u0 else 0.0
    a1 = _chain(0.0, ds, rw[1], pf, rw[5], rw[9], L - 1) if u1 else 0.0
    a2 = _chain(0.0, ds, rw[2], pf, rw[6], rw[10], L - 1) if u2 else 0.0
    a3 = _chain(0.0, ds, rw[3], pf, rw[7], rw[11], L - 1) if u3 else 0.0
    e0, e1, e2, e3 = np.uint64(rw[0]), np.uint64(rw[1]), np.uint64(rw[2]), np.uint64(rw[3])
    p0, p1, p2, p3 = np.uint64(rw[4]), np.uint64(rw[5]), np.uint64(rw[6]), np.uint64(rw[7])
    for j in range(np.uint64(L), np.uint64(H + 1)):
        a0 += ds[e0 + j] * pf[p0 + j]
        a1 += ds[e1 + j] * pf[p1 + j]
        a2 += ds[e2 + j] * pf[p2 + j]
        a3 += ds[e3 + j] * pf[p3 + j]
    return (_chain(a0, ds, rw[0], pf, rw[4], H + 1, rw[12]) if u0 else 0.0,
            _chain(a1, ds, rw[1], pf, rw[5], H + 1, rw[13]) if u1 else 0.0,
            _chain(a2, ds, rw[2], pf, rw[6], H + 1, rw[14]) if u2 else 0.0,
            _chain(a3, ds, rw[3], pf, rw[7], H + 1, rw[15]) if u3 else 0.0)


@span_kernel()
def _backward_problems(q, k, v, p, go, scale, dq, dk, dv, heads, t0, t1):
    """Problems ``t0 .. t1-1`` of :func:`attention_backward` (each independent, every sum
    in a fixed order: the bits do not depend on the thread count)."""
    _wide()
    B, N, M = p.shape
    D = q.shape[2] // heads
    F = v.shape[2] // heads
    mp = (M + _KT - 1) // _KT * _KT
    n4 = (N + 3) // 4 * 4
    dp = (D + _KT - 1) // _KT * _KT
    fp = (F + _KT - 1) // _KT * _KT
    qf, kf, vf, gf = q.reshape(-1), k.reshape(-1), v.reshape(-1), go.reshape(-1)
    pf = p.reshape(-1)
    dqf, dkf, dvf = dq.reshape(-1), dk.reshape(-1), dv.reshape(-1)
    for b in range(t0, t1):
        po = b * N * M
        qo, qs = _problem_base(b, N, heads, D)
        ko, ks = _problem_base(b, M, heads, D)
        vo, vs = _problem_base(b, M, heads, F)
        go_, gs = _problem_base(b, N, heads, F)
        # the b operands: v transposed [F, mp]; q, k and go padded to whole vectors
        vt = np.zeros(F * mp)
        ump = np.uint64(mp)
        for j in range(np.uint64(M)):
            o = np.uint64(vo) + j * np.uint64(vs)
            for f in range(np.uint64(F)):
                vt[f * ump + j] = vf[o + f]
        qpad = _padded_rows(qf, qo, qs, N, D, dp, N)
        kpad = _padded_rows(kf, ko, ks, M, D, dp, M)
        gpad = _padded_rows(gf, go_, gs, N, F, fp, n4)
        # the span [lo, hi] of non-zero weights of each row
        rlo = np.full(n4, mp, dtype=np.int64)
        rhi = np.full(n4, -1, dtype=np.int64)
        for i in range(N):
            base = po + i * M
            lo = 0
            while lo < M and pf[base + lo] == 0.0:
                lo += 1
            if lo == M:
                continue
            hi = M - 1
            while pf[base + hi] == 0.0:
                hi -= 1
            rlo[i] = lo
            rhi[i] = hi
        # dp[i, j] = sum_f go[i, f] v[j, f] (f increasing from 0.0), four rows at a time,
        # then ds = p * (dp - sum_j dp p) * scale on each row's span, exact 0 elsewhere
        ds = np.empty(n4 * mp)
        ap = np.empty(N * 4 if M % 4 else 0)   # the dv products' last key block, copied
        rw = np.empty(16, dtype=np.int64)
        for i0 in range(0, N, 4):
            nr = min(4, N - i0)
            blo, bhi = _union_span(rlo, rhi, i0, nr)
            if bhi >= 0:
                # a[f, r] = go[i0 + r, f] (gpad's rows past N are zeros)
                j0 = (blo // _KT) * _KT
                while j0 <= bhi:
                    _mstrided(vt, j0, mp, gpad, i0 * fp, F, ds, i0 * mp + j0, mp, True, j0,
                              1, fp)
                    j0 += _KT
            # the four rows' sums of dp * p, each over its own span (outside it the term
            # would be an exact +0.0, which leaves a sum that starts at +0.0 unchanged);
            # a row past N or without weights reads row i0 and sums nothing
            for r in range(4):
                used = r < nr and rhi[i0 + r] >= 0
                rr = r if used else 0
                rw[r] = (i0 + rr) * mp
                rw[4 + r] = po + (i0 + rr) * M
                rw[8 + r] = rlo[i0 + r] if used else 0
                rw[12 + r] = rhi[i0 + r] if used else -1
            a0, a1, a2, a3 = _rowsums4(ds, pf, rw)
            for r in range(nr):
                i = i0 + r
                base = np.uint64(i * mp)
                pb = np.uint64(po + i * M)
                lo = rlo[i]
                hi = rhi[i]
                if hi < 0:
                    for j in range(np.uint64(mp)):
                        ds[base + j] = 0.0
                    continue
                acc = a0 if r == 0 else (a1 if r == 1 else (a2 if r == 2 else a3))
                for j in range(np.uint64(lo)):
                    ds[base + j] = 0.0
                for j in range(np.uint64(lo), np.uint64(hi + 1)):
                    ds[base + j] = pf[pb + j] * (ds[base + j] - acc) * scale
                for j in range(np.uint64(hi + 1), np.uint64(mp)):
                    ds[base + j] = 0.0
        for j in range(np.uint64(N * mp), np.uint64(n4 * mp)):
            ds[j] = 0.0
        # dk[j, :] = sum_i ds[i, j] q[i, :] and dv[j, :] = sum_i p[i, j] go[i, :], i
        # increasing over the rows that weight the block's four keys (zero terms elsewhere)
        acc4 = np.empty(4 * max(dp, fp))
        for j0 in range(0, M, 4):
            nj = min(4, M - j0)
            ilo, ihi = _rows_spanning(rlo, rhi, N, j0, j0 + nj - 1)
            nk = ihi + 1 - ilo
            # a[t, r] = ds[ilo + t, j0 + r] (ds has mp >= j0 + 4 columns)
            for c0 in range(0, dp, _KT):
                _mstrided(qpad, ilo * dp + c0, dp, ds, ilo * mp + j0, nk, acc4, c0, dp,
                          True, c0, mp, 1)
            _store_rows(acc4, dp, j0, nj, D, dkf, ko, ks)
            # a[t, r] = p[ilo + t, j0 + r]; a last block of fewer than four keys is copied
            # (zeros past the keys), so no read passes the end of p
            if nj == 4:
                for c0 in range(0, fp, _KT):
                    _mstrided(gpad, ilo * fp + c0, fp, pf, po + ilo * M + j0, nk, acc4, c0,
                              fp, True, c0, M, 1)
            else:
                unj = np.uint64(nj)
                for t in range(np.uint64(max(nk, 0))):
                    o = np.uint64(po + ilo * M + j0) + t * np.uint64(M)
                    for r in range(np.uint64(4)):
                        ap[t * np.uint64(4) + r] = pf[o + r] if r < unj else 0.0
                for c0 in range(0, fp, _KT):
                    _mstrided(gpad, ilo * fp + c0, fp, ap, 0, nk, acc4, c0, fp, True, c0,
                              4, 1)
            _store_rows(acc4, fp, j0, nj, F, dvf, vo, vs)
        # dq[i, :] = sum_j ds[i, j] k[j, :], j increasing over the keys that the block's four
        # rows weight
        for i0 in range(0, N, 4):
            nr = min(4, N - i0)
            jlo, jhi = _union_span(rlo, rhi, i0, nr)
            nk = jhi + 1 - jlo
            # a[t, r] = ds[i0 + r, jlo + t] (ds has n4 rows)
            for c0 in range(0, dp, _KT):
                _mstrided(kpad, jlo * dp + c0, dp, ds, i0 * mp + jlo, nk, acc4, c0, dp,
                          True, c0, 1, mp)
            _store_rows(acc4, dp, i0, nr, D, dqf, qo, qs)


def attention_backward(q, k, v, p, go, scale, dq, dk, dv, heads=1):
    """Scaled dot-product attention backward for ``B`` independent problems.

    ``p [B, N, M]`` the forward weights (0 for masked keys and fully masked rows),
    ``scale = 1/sqrt(D)`` (or the forward's explicit scale); ``q``, ``go`` (the output
    cotangent) and ``dq`` are ``[B/heads, N, heads*D]`` (``F`` for ``go``), ``k``, ``dk``
    ``[B/heads, M, heads*D]``, ``v``, ``dv`` ``[B/heads, M, heads*F]``: problem ``b`` is
    head ``b % heads`` of batch ``b // heads``, i.e. its rows are the feature columns
    ``[h*D, (h+1)*D)`` (``heads == 1``: plain ``[B, N, D]``), so multi-head attention needs
    no split or merge copies.  C-contiguous float64; ``q, k, v, p, go`` are only read::

        dv = p^T go;  dp = go v^T;  ds = p * (dp - rowsum(dp * p)) * scale;
        dq = ds k;  dk = ds^T q

    Fixed summation orders (every product and sum rounded separately, as in the forward):
    ``dp[i, j]`` over ``f`` increasing from 0.0, ``rowsum`` over the row's keys increasing,
    ``dq[i, :]`` over keys ``j`` increasing, ``dk[j, :]`` and ``dv[j, :]`` over queries
    ``i`` increasing.  ``ds`` is exact 0 where ``p`` is (outside each row's span of
    non-zero weights), so the products visit only the spans' tiles: a zero term adds
    exactly nothing to a sum that starts at +0.0.  The products run on the float GEMMs'
    micro-kernel (register tiles of 4 x ``_KT``).  Parallel over ``B``: the bits do not
    depend on the thread count."""
    B, N, M = p.shape
    _backward_problems.run(B, B * N * M * 4, readonly(q), readonly(k), readonly(v),
                           readonly(p), readonly(go), float(scale), dq, dk, dv,
                           np.int64(heads))
