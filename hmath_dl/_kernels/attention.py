"""Attention and rotary-embedding kernels (no validation; see ``hmath_dl.layers.attention``).

Entry points
------------
``attention_forward(q, k, v, mask, bias, out, weights, gkv=1, scale=0.0) -> (status, row)``
    Scaled dot-product attention over a flat batch.  This is the entry point that
    ``hmath_dl.layers.attention`` and the autodiff layer build on.

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
    every allowed key ``j`` (the dot product summed in increasing ``d`` from 0.0; masked
    keys are never scored, so an overflow there does not matter), ``m = max_j s_j``,
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

``rotary_forward(x, base, offset, out) -> status``
    ``x [R, S, F]`` (F even) -> ``out``; row ``s`` is position ``offset + s``; pair
    ``(2i, 2i+1)`` rotates by ``(offset + s) * base ** (-(2i) / F)`` (the power as
    ``exp(-((2i)/F) log(base))``, sin/cos and exp/log the library's own, ``libm.py``: the
    same bits on every CPU).  Returns the index of the first non-finite output element
    (flat), or ``NO_INDEX`` (-1).
"""

import numpy as np
from numba import prange

from ._jit import helper, kernel
from .libm import cos_inline, exp_inline, log_inline, sin_inline
from .status import NO_INDEX, OK, OVERFLOW, SCORE_OVERFLOW
from .views import readonly

# Query rows handled together: their scores are computed in one sweep over the keys so that
# every key column is loaded once per block instead of once per row.
_QB = 4


@helper
def _row_range(mrow):
    """(first allowed key, last allowed key, number of allowed keys) of a mask row;
    (len, -1, 0) when nothing is allowed."""
    m_keys = mrow.shape[0]
    lo = m_keys
    for j in range(m_keys):
        if mrow[j]:
            lo = j
            break
    if lo == m_keys:
        return m_keys, -1, 0
    hi = lo
    for j in range(m_keys - 1, lo, -1):
        if mrow[j]:
            hi = j
            break
    part = mrow[lo:hi + 1]
    cnt = 0
    for j in range(hi + 1 - lo):
        cnt += np.int64(part[j])
    return lo, hi, cnt


@helper
def _exp_shifted(x, shift, bits):
    """x[j] <- exp(x[j] - shift) in place, for x[j] <= shift (``x[j]`` may be -inf);
    ``bits`` is int64 scratch at least as long as ``x``.

    Vectorisable: Cody-Waite reduction ``t = k ln2 + r`` (|r| <= ln2/2, k = round(t/ln2)),
    degree-13 Taylor polynomial of ``exp(r)`` in Horner form, times ``2**k`` assembled from
    its bits.  Plain IEEE operations in a fixed order (no FMA contraction), so the result is
    the same bits on every machine; error at most 1 ulp against the correctly rounded
    value.  ``t < -708`` (where ``2**k`` would be subnormal) takes the libm path."""
    n = x.shape[0]
    under = 0
    for j in range(n):
        t0 = x[j] - shift
        low = t0 < -708.0
        under += low
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
        x[j] = t0 if low else p
        bits[j] = (np.int64(kf) + 1023) << 52
    scale = bits[:n].view(np.float64)
    if under == 0:
        for j in range(n):
            x[j] = x[j] * scale[j]
    else:
        for j in range(n):
            t = x[j]
            if t < -746.0:
                x[j] = 0.0
            elif t < -708.0:
                x[j] = exp_inline(t)     # the library's own (libm.py): subnormal results
            else:
                x[j] = t * scale[j]
    return under


@helper
def _scores_block(q, kt, s, b, bk, i0, nr, blo, n):
    """s[r, :n] = q[b, i0 + r] . kt[bk, :, blo + j] for the _QB (= 4) rows of a block.

    Each score is summed over the features in increasing order, starting from 0.0; four
    features are folded per pass (``((s + a) + b) + ...`` keeps that order exactly).  Rows
    r >= nr repeat the last real row (their scores are ignored).  Inner loops run over 1-D
    views from index 0 so that LLVM vectorises them."""
    d = q.shape[2]
    r0 = i0
    r1 = i0 + min(1, nr - 1)
    r2 = i0 + min(2, nr - 1)
    r3 = i0 + min(3, nr - 1)
    s0 = s[0, :n]
    s1 = s[1, :n]
    s2 = s[2, :n]
    s3 = s[3, :n]
    for j in range(n):
        s0[j] = 0.0
        s1[j] = 0.0
        s2[j] = 0.0
        s3[j] = 0.0
    c = 0
    while c + 4 <= d:
        ka = kt[bk, c, blo:blo + n]
        kb = kt[bk, c + 1, blo:blo + n]
        kc = kt[bk, c + 2, blo:blo + n]
        kd = kt[bk, c + 3, blo:blo + n]
        q0a = q[b, r0, c]
        q0b = q[b, r0, c + 1]
        q0c = q[b, r0, c + 2]
        q0d = q[b, r0, c + 3]
        q1a = q[b, r1, c]
        q1b = q[b, r1, c + 1]
        q1c = q[b, r1, c + 2]
        q1d = q[b, r1, c + 3]
        q2a = q[b, r2, c]
        q2b = q[b, r2, c + 1]
        q2c = q[b, r2, c + 2]
        q2d = q[b, r2, c + 3]
        q3a = q[b, r3, c]
        q3b = q[b, r3, c + 1]
        q3c = q[b, r3, c + 2]
        q3d = q[b, r3, c + 3]
        for j in range(n):
            xa = ka[j]
            xb = kb[j]
            xc = kc[j]
            xd = kd[j]
            s0[j] = (((s0[j] + q0a * xa) + q0b * xb) + q0c * xc) + q0d * xd
            s1[j] = (((s1[j] + q1a * xa) + q1b * xb) + q1c * xc) + q1d * xd
            s2[j] = (((s2[j] + q2a * xa) + q2b * xb) + q2c * xc) + q2d * xd
            s3[j] = (((s3[j] + q3a * xa) + q3b * xb) + q3c * xc) + q3d * xd
        c += 4
    while c < d:
        ka = kt[bk, c, blo:blo + n]
        q0a = q[b, r0, c]
        q1a = q[b, r1, c]
        q2a = q[b, r2, c]
        q3a = q[b, r3, c]
        for j in range(n):
            xa = ka[j]
            s0[j] += q0a * xa
            s1[j] += q1a * xa
            s2[j] += q2a * xa
            s3[j] += q3a * xa
        c += 1


@helper
def _values_block(v, b, blo, n, w0, w1, w2, w3, o0, o1, o2, o3):
    """o_r[:] = sum_j w_r[j] * v[b, blo + j, :] for the 4 rows of a block, j increasing,
    starting from 0.0 (four keys folded per pass, same order)."""
    f = v.shape[2]
    for c in range(f):
        o0[c] = 0.0
        o1[c] = 0.0
        o2[c] = 0.0
        o3[c] = 0.0
    j = 0
    while j + 4 <= n:
        va = v[b, blo + j]
        vb = v[b, blo + j + 1]
        vc = v[b, blo + j + 2]
        vd = v[b, blo + j + 3]
        w0a = w0[j]
        w0b = w0[j + 1]
        w0c = w0[j + 2]
        w0d = w0[j + 3]
        w1a = w1[j]
        w1b = w1[j + 1]
        w1c = w1[j + 2]
        w1d = w1[j + 3]
        w2a = w2[j]
        w2b = w2[j + 1]
        w2c = w2[j + 2]
        w2d = w2[j + 3]
        w3a = w3[j]
        w3b = w3[j + 1]
        w3c = w3[j + 2]
        w3d = w3[j + 3]
        for c in range(f):
            xa = va[c]
            xb = vb[c]
            xc = vc[c]
            xd = vd[c]
            o0[c] = (((o0[c] + w0a * xa) + w0b * xb) + w0c * xc) + w0d * xd
            o1[c] = (((o1[c] + w1a * xa) + w1b * xb) + w1c * xc) + w1d * xd
            o2[c] = (((o2[c] + w2a * xa) + w2b * xb) + w2c * xc) + w2d * xd
            o3[c] = (((o3[c] + w3a * xa) + w3b * xb) + w3c * xc) + w3d * xd
        j += 4
    while j < n:
        va = v[b, blo + j]
        w0a = w0[j]
        w1a = w1[j]
        w2a = w2[j]
        w3a = w3[j]
        for c in range(f):
            xa = va[c]
            o0[c] += w0a * xa
            o1[c] += w1a * xa
            o2[c] += w2a * xa
            o3[c] += w3a * xa
        j += 1


@helper
def _softmax_row(sr, mr, br, dense, has_bias, sqrt_d, inv_d, wr, bits):
    """Scores of one row's keys lo..hi -> normalised weights.

    ``sr`` holds ``q . k_j`` for the keys lo..hi (overwritten), ``mr``/``br`` are the mask and
    bias over the same keys (``br`` ignored unless ``has_bias``; ``mr`` ignored when
    ``dense``, i.e. every key in the range is allowed), ``wr`` receives the weights (exact 0
    for masked keys), ``bits`` is int64 scratch.  ``inv_d`` is ``1/sqrt_d`` when that is
    exact (sqrt_d a power of two: then ``x * inv_d == x / sqrt_d`` bitwise) or the
    caller's explicit scale (scores ``x * scale``), else 0.
    Returns False when an allowed score is not finite."""
    n = sr.shape[0]
    if inv_d != 0.0:
        if has_bias:
            for j in range(n):
                sr[j] = sr[j] * inv_d + br[j]
        else:
            for j in range(n):
                sr[j] = sr[j] * inv_d
    else:
        if has_bias:
            for j in range(n):
                sr[j] = sr[j] / sqrt_d + br[j]
        else:
            for j in range(n):
                sr[j] = sr[j] / sqrt_d
    mx = -np.inf
    if dense:
        acc = 0.0
        for j in range(n):
            acc += sr[j] * 0.0
        if acc != 0.0:
            return False
        for j in range(n):
            if sr[j] > mx:
                mx = sr[j]
    else:
        for j in range(n):
            if mr[j]:
                x = sr[j]
                if not (x - x == 0.0):
                    return False
                if x > mx:
                    mx = x
        for j in range(n):
            sr[j] = sr[j] if mr[j] else -np.inf
    _exp_shifted(sr, mx, bits)
    total = 0.0
    for j in range(n):
        total += sr[j]
    for j in range(n):
        wr[j] = sr[j] / total
    return True


@helper
def _zero(a):
    for j in range(a.shape[0]):
        a[j] = 0.0


@helper
def _attend_block(q, kt, v, mask, bias, out, weights, b, bk, i0, nr, mb, bb, s, bits, lo, hi,
                  dense, live, zw, scratch, status, scale):
    """Rows i0 .. i0+nr-1 of batch b, keys/values of batch bk (see the module docstring)."""
    m_keys = kt.shape[2]
    f = v.shape[2]
    n_q = q.shape[1]
    has_mask = mask.shape[0] > 0
    has_bias = bias.shape[0] > 0
    d = q.shape[2]
    sqrt_d = np.sqrt(np.float64(d))
    # sqrt(D) is a power of two iff D is a power of four
    inv_d = 1.0 / sqrt_d if (d & (d - 1)) == 0 and (d & 0x5555555555555555) != 0 else 0.0
    if scale != 0.0:
        inv_d = scale
    blo = m_keys
    bhi = -1
    for r in range(nr):
        if has_mask:
            a, z, cnt = _row_range(mask[mb, i0 + r])
        else:
            a = 0
            z = m_keys - 1
            cnt = m_keys
        lo[r] = a
        hi[r] = z
        dense[r] = cnt == z - a + 1
        live[r] = cnt > 0
        if cnt > 0:
            blo = min(blo, a)
            bhi = max(bhi, z)
    for r in range(nr):
        _zero(out[b, i0 + r])
    if bhi < blo:
        for r in range(nr):
            _zero(weights[b, i0 + r])
        return
    n = bhi + 1 - blo
    _scores_block(q, kt, s, b, bk, i0, nr, blo, n)
    for r in range(nr):
        i = i0 + r
        wr = weights[b, i]
        if not live[r]:
            _zero(wr)
            continue
        a = lo[r]
        z = hi[r]
        sr = s[r, a - blo:z + 1 - blo]
        mr = mask[mb, i, a:z + 1] if has_mask else mask.reshape(-1)[0:0]
        br = bias[bb, i, a:z + 1] if has_bias else bias.reshape(-1)[0:0]
        _zero(wr[:a])
        _zero(wr[z + 1:])
        if not _softmax_row(sr, mr, br, dense[r], has_bias, sqrt_d, inv_d, wr[a:z + 1], bits):
            status[b * n_q + i] = SCORE_OVERFLOW
            live[r] = False
            _zero(wr)
    # out = weights @ v over the keys blo..bhi, increasing j (weights of masked keys are
    # exact zeros, so they add nothing); rows that are not live write to scratch
    zw = zw[:n]
    w0 = weights[b, i0, blo:bhi + 1] if live[0] else zw
    o0 = out[b, i0] if live[0] else scratch[0]
    w1 = weights[b, i0 + 1, blo:bhi + 1] if nr > 1 and live[1] else zw
    o1 = out[b, i0 + 1] if nr > 1 and live[1] else scratch[1]
    w2 = weights[b, i0 + 2, blo:bhi + 1] if nr > 2 and live[2] else zw
    o2 = out[b, i0 + 2] if nr > 2 and live[2] else scratch[2]
    w3 = weights[b, i0 + 3, blo:bhi + 1] if nr > 3 and live[3] else zw
    o3 = out[b, i0 + 3] if nr > 3 and live[3] else scratch[3]
    _values_block(v, bk, blo, n, w0, w1, w2, w3, o0, o1, o2, o3)
    for r in range(nr):
        i = i0 + r
        if live[r]:
            orow = out[b, i]
            acc = 0.0
            for c in range(f):
                acc += orow[c] * 0.0
            if acc != 0.0:
                status[b * n_q + i] = OVERFLOW


@kernel
def _attention_forward(q, k, v, mask, bias, out, weights, gkv, scale):
    """See the module docstring."""
    nb, n_q, d = q.shape
    nbk = k.shape[0]
    m_keys = k.shape[1]
    nbm = mask.shape[0]
    nbb = bias.shape[0]
    gm = nb // nbm if nbm > 0 else 1
    gb = nb // nbb if nbb > 0 else 1

    # keys transposed to [B, D, M] so that the score loop streams contiguous keys
    kt = np.empty((nbk, d, m_keys), dtype=np.float64)
    for t in prange(nbk * d):
        b = t // d
        c = t - b * d
        kr = kt[b, c]
        for j in range(m_keys):
            kr[j] = k[b, j, c]

    nblk = (n_q + _QB - 1) // _QB
    status = np.zeros(nb * n_q, dtype=np.int8)
    # blocks are processed in a fixed number of contiguous chunks (scratch allocated once
    # per chunk); no result depends on the chunking or on the thread count
    total = nb * nblk
    nchunk = min(total, 256)
    for ch in prange(nchunk):
        t0 = ch * total // nchunk
        t1 = (ch + 1) * total // nchunk
        s = np.empty((_QB, m_keys), dtype=np.float64)
        bits = np.empty(m_keys, dtype=np.int64)
        lo = np.empty(_QB, dtype=np.int64)
        hi = np.empty(_QB, dtype=np.int64)
        dense = np.empty(_QB, dtype=np.bool_)
        live = np.empty(_QB, dtype=np.bool_)
        zw = np.zeros(m_keys, dtype=np.float64)
        scratch = np.empty((_QB, v.shape[2]), dtype=np.float64)
        for t in range(t0, t1):
            b = t // nblk
            i0 = (t - b * nblk) * _QB
            nr = min(n_q - i0, _QB)
            _attend_block(q, kt, v, mask, bias, out, weights, b, b // gkv, i0, nr, b // gm,
                          b // gb, s, bits, lo, hi, dense, live, zw, scratch, status, scale)
    for r in range(nb * n_q):
        if status[r] != OK:
            return np.int64(status[r]), np.int64(r)
    return np.int64(OK), np.int64(NO_INDEX)


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


def attention_forward(q, k, v, mask, bias, out, weights, gkv=1, scale=0.0):
    """Scaled dot-product attention; see the module docstring (inputs are only read)."""
    # inputs typed read-only: one compiled specialisation whether or not the caller's
    # arrays are read-only (e.g. views from ``cache_values``)
    return _attention_forward(readonly(q), readonly(k), readonly(v), readonly(mask),
                              readonly(bias), out, weights, np.int64(gkv), float(scale))


def rotary_forward(x, base, offset, out):
    """Rotary embedding; see the module docstring (``x`` is only read)."""
    return _rotary_forward(readonly(x), float(base), np.int64(offset), out)
