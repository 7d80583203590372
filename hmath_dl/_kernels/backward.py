"""Backward (vector-Jacobian) kernels of the differentiable layers.

Every kernel is parallel over the gradient's OWN outputs (a row, a channel, an
``(n, c)`` plane, a vocabulary row, an attention problem) and sums its terms in a fixed
order inside one ``prange`` iteration, so results are bitwise identical for any thread
count; nothing is ever accumulated into a shared array from ``prange``.  All arrays are
C-contiguous float64 (int64 for indices) with consistent shapes; nothing is validated.

The convolution gradients are Layers II's kernels (``_kernels/conv.py``:
``conv_transpose_nd`` for the input, ``conv_weight_grad_nd`` for the weights).
"""

import math

import numpy as np
from numba import prange

from ._jit import kernel, span_kernel


# --------------------------------------------------------------------------- row norms
@kernel
def norm_rows_backward(x, y, g, rows, n, eps, center, dx):
    """Layer norm (``center``) / RMS norm backward over ``rows`` rows of length ``n``.

    With ``r = 1 / sqrt(var + eps)`` (``var`` the population variance, or ``mean(x^2)``
    when not centering) and ``y`` the forward output::

        dx = r * (g - [center] mean(g) - y * mean(g * y))
    """
    inv_n = 1.0 / n
    for i in prange(rows):
        base = i * n
        m = 0.0
        if center:
            for j in range(n):
                m += x[base + j]
            m *= inv_n
        v = 0.0
        for j in range(n):
            d = x[base + j] - m
            v += d * d
        v *= inv_n
        r = 1.0 / math.sqrt(v + eps)
        sg = 0.0
        sgy = 0.0
        for j in range(n):
            sg += g[base + j]
            sgy += g[base + j] * y[base + j]
        mg = sg * inv_n if center else 0.0
        mgy = sgy * inv_n
        for j in range(n):
            dx[base + j] = r * (g[base + j] - mg - y[base + j] * mgy)


# --------------------------------------------------------------------------- batch norm
@span_kernel(iterations=lambda x, g, N, C, *rest: C, work=lambda x, *rest: x.size)
def batch_norm_backward(x, g, N, C, S, eps, gamma, training, run_mean, run_var,
                        dx, dgamma, dbeta, t0, t1):
    """Batch norm backward, parallel over channels; ``x``/``g``/``dx`` are ``[N, C, S]``
    flattened.

    TRAINING (batch statistics, ``m = N S``; ``xh = (x - mean) r``)::

        dbeta = sum g;  dgamma = sum g xh;  dx = gamma r (g - dbeta/m - xh dgamma/m)

    INFERENCE (running statistics, ``r = 1 / (2 sqrt(rv/4 + eps/4))``): ``dx = g gamma r``,
    ``dgamma = sum g (x - rm) r``, ``dbeta = sum g``.  A span kernel over the channels
    ``t0 .. t1-1`` (:class:`~._jit.SpanKernel`; called without them).
    """
    m = N * S
    for c in range(t0, t1):
        if training:
            mu = 0.0
            for n in range(N):
                base = (n * C + c) * S
                for s in range(S):
                    mu += x[base + s]
            mu /= m
            v = 0.0
            for n in range(N):
                base = (n * C + c) * S
                for s in range(S):
                    d = x[base + s] - mu
                    v += d * d
            v /= m
            r = 1.0 / math.sqrt(v + eps)
        else:
            mu = run_mean[c]
            r = 1.0 / (2.0 * math.sqrt(0.25 * run_var[c] + 0.25 * eps))
        sg = 0.0
        sgx = 0.0
        for n in range(N):
            base = (n * C + c) * S
            for s in range(S):
                gv = g[base + s]
                sg += gv
                sgx += gv * ((x[base + s] - mu) * r)
        dbeta[c] = sg
        dgamma[c] = sgx
        k = gamma[c] * r
        if training:
            a = sg / m
            b = sgx / m
            for n in range(N):
                base = (n * C + c) * S
                for s in range(S):
                    dx[base + s] = k * (g[base + s] - a - ((x[base + s] - mu) * r) * b)
        else:
            for n in range(N):
                base = (n * C + c) * S
                for s in range(S):
                    dx[base + s] = k * g[base + s]


# --------------------------------------------------------------------------- embedding
@kernel
def embedding_backward(indices, g, V, dw):
    """``dw[v] = sum over positions i with indices[i] == v of g[i]`` (``g [L, F]``,
    ``dw [V, F]``), summed in increasing ``i``.

    A serial counting sort groups the positions by row (stable), then the rows are
    processed in parallel: every ``prange`` iteration owns one row of ``dw``.
    """
    L = indices.shape[0]
    F = g.shape[1]
    start = np.zeros(V + 1, dtype=np.int64)
    for i in range(L):
        start[indices[i] + 1] += 1
    for v in range(V):
        start[v + 1] += start[v]
    fill = start[:V].copy()
    order = np.empty(L, dtype=np.int64)
    for i in range(L):
        v = indices[i]
        order[fill[v]] = i
        fill[v] += 1
    for v in prange(V):
        row = dw[v]
        for f in range(F):
            row[f] = 0.0
        for p in range(start[v], start[v + 1]):
            gi = g[order[p]]
            for f in range(F):
                row[f] += gi[f]


# --------------------------------------------------------------------------- attention
@kernel
def attention_backward(q, k, v, p, go, scale, dq, dk, dv):
    """Scaled dot-product attention backward for ``B`` independent problems.

    ``q [B, N, D]``, ``k [B, M, D]``, ``v [B, M, F]``, ``p [B, N, M]`` the forward
    weights (0 for masked keys and fully masked rows), ``go [B, N, F]`` the output
    cotangent, ``scale = 1/sqrt(D)``::

        dv = p^T go;  dp = go v^T;  ds = p * (dp - rowsum(dp * p));
        dq = scale ds k;  dk = scale ds^T q

    Parallel over ``B``; inside, fixed summation orders: ``dp[i, j]`` over ``f``
    increasing, ``dq[i, :]`` over keys ``j`` increasing, ``dk[j, :]`` and ``dv[j, :]``
    over queries ``i`` increasing.  Every product loop runs over a contiguous row
    (accumulators kept transposed, ``[D, N]`` / ``[D, M]`` / ``[F, M]``) so it
    vectorises; only the span of non-zero weights of each row (column, for ``dq``) is
    visited -- a zero term adds exactly nothing to a sum that starts at ``+0.0``, so the
    spans do not change any bit.  Loops index the flat arrays with unsigned offsets (no
    array views, which cost a reference-count update each, and no negative-index test,
    which blocks vectorisation).  Rows with ``p == 0`` give exact zeros.  The arrays are
    C-contiguous.
    """
    B, N, D = q.shape
    M = k.shape[1]
    F = v.shape[2]
    uM, uN = np.uint64(M), np.uint64(N)
    qf, kf, vf, pf, gf = q.reshape(-1), k.reshape(-1), v.reshape(-1), p.reshape(-1), go.reshape(-1)
    dqf, dkf, dvf = dq.reshape(-1), dk.reshape(-1), dv.reshape(-1)
    for b in prange(B):
        # flat arrays and unsigned offsets throughout: no array views in the loops (each
        # view costs a reference-count update) and no negative-index tests
        ub = np.uint64(b)
        qo, ko, vo = ub * uN * np.uint64(D), ub * uM * np.uint64(D), ub * uM * np.uint64(F)
        po, go_ = ub * uN * uM, ub * uN * np.uint64(F)
        vt = np.empty(F * M)
        for j in range(uM):
            for f in range(np.uint64(F)):
                vt[f * uM + j] = vf[vo + j * np.uint64(F) + f]
        ds = np.zeros(N * M)
        rlo = np.zeros(N, dtype=np.int64)
        rhi = np.full(N, -1, dtype=np.int64)
        clo = np.full(M, N, dtype=np.int64)
        chi = np.full(M, -1, dtype=np.int64)
        for i in range(N):
            pi = po + np.uint64(i) * uM
            # keys with p == 0 (masked, or a fully masked row) get ds == 0: only the span
            # [lo, hi] of non-zero weights is computed
            lo = 0
            while lo < M and pf[pi + np.uint64(lo)] == 0.0:
                lo += 1
            if lo == M:
                continue
            hi = M - 1
            while pf[pi + np.uint64(hi)] == 0.0:
                hi -= 1
            rlo[i] = lo
            rhi[i] = hi
            for j in range(lo, hi + 1):
                if clo[j] > i:
                    clo[j] = i
                chi[j] = i
            gi = go_ + np.uint64(i * F)
            n = np.uint64(hi + 1 - lo)
            dsi = np.uint64(i) * uM + np.uint64(lo)
            ps = pi + np.uint64(lo)
            # dp[i, j] = sum_f go[i, f] v[j, f], accumulated over f in increasing order
            for f in range(np.uint64(F)):
                c = gf[gi + f]
                vr = f * uM + np.uint64(lo)
                for t in range(n):
                    ds[dsi + t] += c * vt[vr + t]
            acc = 0.0
            for t in range(n):
                acc += ds[dsi + t] * pf[ps + t]
            for t in range(n):
                ds[dsi + t] = pf[ps + t] * (ds[dsi + t] - acc) * scale
        # dk^T[e, j] = sum_i ds[i, j] q[i, e];  dv^T[f, j] = sum_i p[i, j] go[i, f]
        dkt = np.zeros(D * M)
        dvt = np.zeros(F * M)
        for i in range(N):
            lo = np.uint64(rlo[i])
            n = np.uint64(rhi[i] + 1 - rlo[i])
            dsi = np.uint64(i) * uM + lo
            ps = po + np.uint64(i) * uM + lo
            for e in range(np.uint64(D)):
                c = qf[qo + np.uint64(i * D) + e]
                row = e * uM + lo
                for t in range(n):
                    dkt[row + t] += ds[dsi + t] * c
            for f in range(np.uint64(F)):
                c = gf[go_ + np.uint64(i * F) + f]
                row = f * uM + lo
                for t in range(n):
                    dvt[row + t] += pf[ps + t] * c
        # dq^T[e, i] = sum_j ds[i, j] k[j, e] (ds transposed so that i is contiguous)
        dst = np.empty(M * N)
        for i in range(uN):
            for j in range(uM):
                dst[j * uN + i] = ds[i * uM + j]
        dqt = np.zeros(D * N)
        for j in range(M):
            if chi[j] < clo[j]:
                continue
            lo = np.uint64(clo[j])
            n = np.uint64(chi[j] + 1 - clo[j])
            dsj = np.uint64(j) * uN + lo
            for e in range(np.uint64(D)):
                c = kf[ko + np.uint64(j * D) + e]
                row = e * uN + lo
                for t in range(n):
                    dqt[row + t] += dst[dsj + t] * c
        for i in range(uN):
            for e in range(np.uint64(D)):
                dqf[qo + i * np.uint64(D) + e] = dqt[e * uN + i]
        for j in range(uM):
            for e in range(np.uint64(D)):
                dkf[ko + j * np.uint64(D) + e] = dkt[e * uM + j]
            for f in range(np.uint64(F)):
                dvf[vo + j * np.uint64(F) + f] = dvt[f * uM + j]


# --------------------------------------------------------------------------- convolution
@span_kernel(iterations=lambda x, kd, kh, kw, *rest: x.shape[1] * kd * kh * kw,
             work=lambda *args: args[-1].size)
def im2col(x, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw, OD, OH, OW, cols, t0, t1):
    """Unfold ``x [N, C, D, H, W]`` into ``cols [C*kd*kh*kw, N*OD*OH*OW]``: row
    ``(c, i, j, k)``, column ``(n, od, oh, ow)`` holds ``x[n, c, od*sd - pd + i*dd,
    oh*sh - ph + j*dh, ow*sw - pw + k*dw]`` (0 outside ``x``: zero padding).  Parallel
    over rows; every write is a plain copy, contiguous along ``ow``.  A span kernel over
    the rows ``t0 .. t1-1``: called as ``im2col(x, ..., cols)``."""
    N, C, D, H, W = x.shape
    KK = kd * kh * kw
    P = OD * OH * OW
    for r in range(t0, t1):
        c = r // KK
        t = r % KK
        i = t // (kh * kw)
        j = (t // kw) % kh
        k = t % kw
        row = cols[r]
        # ow*sw + off inside [0, W) exactly for ow0 <= ow < ow1
        off = k * dw - pw
        ow0 = min(OW, max(0, (sw - 1 - off) // sw))
        ow1 = max(ow0, min(OW, (W - off + sw - 1) // sw))
        us = np.uint64(ow0 * sw + off)
        usw = np.uint64(sw)
        for n in range(N):
            for od in range(OD):
                di = od * sd - pd + i * dd
                for oh in range(OH):
                    hj = oh * sh - ph + j * dh
                    base = n * P + (od * OH + oh) * OW
                    if di < 0 or di >= D or hj < 0 or hj >= H:
                        for ow in range(OW):
                            row[base + ow] = 0.0
                        continue
                    xr = x[n, c, di, hj]
                    for ow in range(ow0):
                        row[base + ow] = 0.0
                    # unsigned indices: no negative-index wrap-around in the copy
                    ub = np.uint64(base + ow0)
                    for q in range(np.uint64(ow1 - ow0)):
                        row[ub + q] = xr[us + q * usw]
                    for ow in range(ow1, OW):
                        row[base + ow] = 0.0


@span_kernel(iterations=lambda *args: args[-1].shape[0] * args[-1].shape[1],
             work=lambda cols, *rest: cols.size)
def col2im(cols, kd, kh, kw, sd, sh, sw, dd, dh, dw, pd, ph, pw, OD, OH, OW, dx, t0, t1):
    """Adjoint of :func:`im2col`: ``dx[n, c, p] = sum of cols[(c, k), (n, o)]`` over every
    ``(k, o)`` that reads input position ``p``.  Parallel over ``(n, c)`` planes (each
    iteration owns one plane of ``dx``); within a plane the terms are added in the fixed
    order ``(i, j, k, od, oh, ow)``.  A span kernel over the planes ``t = n*C + c`` in
    ``t0 .. t1-1``: called as ``col2im(cols, ..., dx)``."""
    N, C, D, H, W = dx.shape
    KK = kd * kh * kw
    P = OD * OH * OW
    for t in range(t0, t1):
        n = t // C
        c = t % C
        plane = dx[n, c]
        for a in range(D):
            for b in range(H):
                for e in range(W):
                    plane[a, b, e] = 0.0
        for i in range(kd):
            for j in range(kh):
                for k in range(kw):
                    row = cols[c * KK + (i * kh + j) * kw + k]
                    # the ow with ow*sw + off inside [0, W), in increasing order
                    off = k * dw - pw
                    ow0 = min(OW, max(0, (sw - 1 - off) // sw))
                    ow1 = max(ow0, min(OW, (W - off + sw - 1) // sw))
                    us = np.uint64(ow0 * sw + off)
                    usw = np.uint64(sw)
                    nw = np.uint64(ow1 - ow0)
                    for od in range(OD):
                        di = od * sd - pd + i * dd
                        if di < 0 or di >= D:
                            continue
                        for oh in range(OH):
                            hj = oh * sh - ph + j * dh
                            if hj < 0 or hj >= H:
                                continue
                            pr = plane[di, hj]
                            base = n * P + (od * OH + oh) * OW
                            ub = np.uint64(base + ow0)
                            for q in range(nw):
                                pr[us + q * usw] += row[ub + q]


@kernel
def channels_first(g, out):
    """``g [N, C, P] -> out [C, N*P]`` (a transposing copy, parallel over channels)."""
    N, C, P = g.shape
    for c in prange(C):
        for n in range(N):
            for p in range(P):
                out[c, n * P + p] = g[n, c, p]
