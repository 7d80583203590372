"""Backward (vector-Jacobian) kernels of the differentiable layers.

Every kernel is parallel over the gradient's OWN outputs (a row, a channel, an
``(n, c)`` plane, a vocabulary row) and sums its terms in a fixed
order inside one ``prange`` iteration, so results are bitwise identical for any thread
count; nothing is ever accumulated into a shared array from ``prange``.  All arrays are
C-contiguous float64 (int64 for indices) with consistent shapes; nothing is validated.

The convolution gradients are Layers II's entry points (``_kernels/conv_plan.py``:
``conv_transpose_nd`` for the input, ``conv_weight_grad_nd`` for the weights).
"""

import math

import numpy as np
from numba import prange

from ._jit import inlined, kernel, span_kernel


# --------------------------------------------------------------------------- row norms
@kernel(scale=0.25)   # ~1.2 ns per element on one thread: parallel from 32k elements
def norm_rows_backward(x, y, g, w, rows, n, eps, center, dx):
    """Layer norm (``center``) / RMS norm backward over ``rows`` rows of length ``n``.

    With ``r = 1 / sqrt(var + eps)`` (``var`` the population variance, or ``mean(x^2)``
    when not centering), ``y`` the normalised forward value ``xhat`` and
    ``gh[j] = g[j] * w[j]`` (rounded; ``w`` of length ``n``, the per-element weight of
    the affine map, all ones without one: ``g * 1.0`` is ``g`` exactly)::

        dx = r * (gh - [center] mean(gh) - y * mean(gh * y))

    Every sum runs over its row in increasing ``j`` from 0.0.  Rows are taken four at a
    time with their chains interleaved (:func:`_four_rows`: the same operations per row,
    so the same bits, without waiting on one add's latency per element); the last
    ``rows % 4`` rows one by one."""
    nq = rows // 4
    for t in prange(nq + rows % 4):
        if t < nq:
            _four_rows(x, y, g, w, 4 * t * n, n, eps, center, dx)
        else:
            _one_row(x, y, g, w, (4 * nq + t - nq) * n, n, eps, center, dx)


@inlined
def _one_row(x, y, g, w, base, n, eps, center, dx):
    """One row of :func:`norm_rows_backward` (row offset ``base``)."""
    inv_n = 1.0 / n
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
        gh = g[base + j] * w[j]
        sg += gh
        sgy += gh * y[base + j]
    mg = sg * inv_n if center else 0.0
    mgy = sgy * inv_n
    for j in range(n):
        dx[base + j] = r * (g[base + j] * w[j] - mg - y[base + j] * mgy)


@inlined
def _four_rows(x, y, g, w, base, n, eps, center, dx):
    """Rows ``base``, ``base + n``, ``base + 2n``, ``base + 3n`` of
    :func:`norm_rows_backward`: each row's operations of :func:`_one_row`, the four rows'
    sums side by side in one loop."""
    inv_n = 1.0 / n
    b0, b1, b2, b3 = base, base + n, base + 2 * n, base + 3 * n
    m0 = m1 = m2 = m3 = 0.0
    if center:
        for j in range(n):
            m0 += x[b0 + j]
            m1 += x[b1 + j]
            m2 += x[b2 + j]
            m3 += x[b3 + j]
        m0 *= inv_n
        m1 *= inv_n
        m2 *= inv_n
        m3 *= inv_n
    v0 = v1 = v2 = v3 = 0.0
    for j in range(n):
        d0 = x[b0 + j] - m0
        d1 = x[b1 + j] - m1
        d2 = x[b2 + j] - m2
        d3 = x[b3 + j] - m3
        v0 += d0 * d0
        v1 += d1 * d1
        v2 += d2 * d2
        v3 += d3 * d3
    s0 = s1 = s2 = s3 = 0.0
    q0 = q1 = q2 = q3 = 0.0
    for j in range(n):
        wj = w[j]
        h0 = g[b0 + j] * wj
        h1 = g[b1 + j] * wj
        h2 = g[b2 + j] * wj
        h3 = g[b3 + j] * wj
        s0 += h0
        q0 += h0 * y[b0 + j]
        s1 += h1
        q1 += h1 * y[b1 + j]
        s2 += h2
        q2 += h2 * y[b2 + j]
        s3 += h3
        q3 += h3 * y[b3 + j]
    for k in range(4):
        bk = b0 if k == 0 else (b1 if k == 1 else (b2 if k == 2 else b3))
        vk = v0 if k == 0 else (v1 if k == 1 else (v2 if k == 2 else v3))
        sk = s0 if k == 0 else (s1 if k == 1 else (s2 if k == 2 else s3))
        qk = q0 if k == 0 else (q1 if k == 1 else (q2 if k == 2 else q3))
        r = 1.0 / math.sqrt(vk * inv_n + eps)
        mg = sk * inv_n if center else 0.0
        mgy = qk * inv_n
        ub = np.uint64(bk)
        for j in range(np.uint64(n)):
            dx[ub + j] = r * (g[ub + j] * w[j] - mg - y[ub + j] * mgy)


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
