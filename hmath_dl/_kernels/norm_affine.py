"""Backward kernels of the affine normalisation options and of weight normalisation.

Every kernel is parallel over the gradient's OWN outputs (blocks of columns, channels,
slices) and sums in a fixed order inside one ``prange`` iteration, so results are
bitwise identical for any thread count (and for the serial twins).  All arrays are
C-contiguous float64 with consistent shapes; nothing is validated.

* :func:`affine_grads_elem` -- layer / RMS norm ``y = xhat * w + b`` with ``w``, ``b`` of
  the row length: ``dw[j] = sum_r g[r, j] xhat[r, j]``, ``db[j] = sum_r g[r, j]``, rows
  ``r`` in increasing order (one serial sum per ``j``).
* :func:`affine_grads_channel` -- group / instance norm with per-channel ``w``, ``b`` on
  ``[N, C, S]``: ``dw[c] = sum_{n, s} g xhat``, ``db[c] = sum_{n, s} g``.  Per ``n`` the
  segment of ``S`` values is summed with ``lanes`` interleaved partial sums (lane ``k``
  takes ``s = k, k + L, ...``), the lanes added in order, then the tail; the segment sums
  are added in increasing ``n``.
* :func:`weight_norm_backward` -- ``y_i = m_i w_i / ||w_i||`` per slice ``i``.
"""

import math

import numpy as np
from numba import prange

from ._jit import helper, kernel, span_kernel
from .status import OK, OVERFLOW, ZERO_SLICE

_COLS = 256  # columns per parallel block of affine_grads_elem


@span_kernel(iterations=lambda g, xh, rows, n, dw, db: (n + _COLS - 1) // _COLS,
             work=lambda g, *rest: g.shape[0])
def affine_grads_elem(g, xh, rows, n, dw, db, t0, t1):
    """``dw[j] = sum_r g[r, j] * xh[r, j]``, ``db[j] = sum_r g[r, j]`` for the flat
    ``[rows, n]`` arrays ``g`` and ``xh`` (rows in increasing order).  A span kernel over
    blocks of ``_COLS`` columns; each block accumulates in its own scratch arrays
    (contiguous, vectorised across columns; every column's sum stays serial in ``r``).
    One compilation for serial and parallel calls (it was a ``prange`` kernel with a
    serial twin).  Flat unsigned offsets, no row views."""
    un = np.uint64(n)
    for blk in range(t0, t1):
        j0 = blk * _COLS
        w = min(n, j0 + _COLS) - j0
        aw = np.zeros(w)
        ab = np.zeros(w)
        uw = np.uint64(w)
        for r in range(np.uint64(rows)):
            st = r * un + np.uint64(j0)
            for j in range(uw):
                gv = g[st + j]
                aw[j] += gv * xh[st + j]
                ab[j] += gv
        for j in range(w):
            dw[j0 + j] = aw[j]
            db[j0 + j] = ab[j]


@helper
def _seg_sums(g, xh, st, S, aw, ab):
    """(sum g[st:st+S] * xh[st:st+S], sum g[st:st+S]) with ``len(aw)`` interleaved lanes,
    lanes added in order, then the tail."""
    lanes = aw.shape[0]
    nb = S // lanes
    ul = np.uint64(lanes)
    for k in range(ul):
        aw[k] = 0.0
        ab[k] = 0.0
    for blk in range(np.uint64(nb)):
        base = st + blk * ul
        for k in range(ul):
            gv = g[base + k]
            aw[k] += gv * xh[base + k]
            ab[k] += gv
    tw = 0.0
    tb = 0.0
    for k in range(lanes):
        tw += aw[k]
        tb += ab[k]
    for i in range(st + nb * lanes, st + S):
        gv = g[i]
        tw += gv * xh[i]
        tb += gv
    return tw, tb


@kernel
def affine_grads_channel(g, xh, N, C, S, lanes, dw, db):
    """``dw[c] = sum_{n,s} g[n,c,s] xh[n,c,s]``, ``db[c] = sum_{n,s} g[n,c,s]`` on flat
    ``[N, C, S]`` arrays (order: see the module docstring)."""
    for c in prange(C):
        aw = np.empty(lanes)
        ab = np.empty(lanes)
        tw = 0.0
        tb = 0.0
        for j in range(N):
            a, b = _seg_sums(g, xh, (j * C + c) * S, S, aw, ab)
            tw += a
            tb += b
        dw[c] = tw
        db[c] = tb


@kernel
def weight_norm_backward(w, g, P, A, Q, magnitudes, dw, dmag, status):
    """Weight-norm backward on the flat ``[P, A, Q]`` arrays ``w``, ``g``, ``dw``.

    For slice ``i`` (all ``p``, ``q`` at middle index ``i``), with the exact power-of-two
    scaling ``s`` of the forward (``max|w_i| s`` in ``[0.5, 1)``), ``q = sum (w s)^2``,
    ``rq = 1 / sqrt(q)`` (so ``||w_i|| = sqrt(q) / s`` and ``u = (w s) rq = w / ||w_i||``)::

        dmag[i] = (sum g (w s)) rq              (= sum g u)
        dw      = (m_i rq s) (g - u dmag[i])     (= m_i / ||w_i|| (g - u (u . g)))

    Sums run over ``p`` increasing, then ``q`` increasing.  ``status[i]``
    (:mod:`.status`): OK, OVERFLOW (a gradient is not finite: beyond the float64 range),
    ZERO_SLICE (the slice is all zeros).
    """
    for i in prange(A):
        base = i * Q
        mx = 0.0
        for j in range(P):
            st = base + j * A * Q
            for k in range(Q):
                v = abs(w[st + k])
                if v > mx:
                    mx = v
        if mx == 0.0:
            status[i] = ZERO_SLICE
            continue
        f0, e = math.frexp(mx)
        if e < -1020:
            e = -1020
        s = math.ldexp(1.0, -e)
        q = 0.0
        gw = 0.0
        for j in range(P):
            st = base + j * A * Q
            for k in range(Q):
                ws = w[st + k] * s
                q += ws * ws
                gw += g[st + k] * ws
        rq = 1.0 / math.sqrt(q)
        dm = gw * rq
        dmag[i] = dm
        f = (magnitudes[i] * rq) * s
        ok = dm - dm == 0.0 and f - f == 0.0
        for j in range(P):
            st = base + j * A * Q
            for k in range(Q):
                u = (w[st + k] * s) * rq
                d = f * (g[st + k] - u * dm)
                dw[st + k] = d
                ok = ok and d - d == 0.0
        status[i] = OK if ok else OVERFLOW


# serial twins (same functions compiled without threads) for small calls: see
# Kernel.sized in _jit.py (the names are kept for the tests that run both paths)
affine_grads_elem_serial = affine_grads_elem.when_small(True)
affine_grads_channel_serial = affine_grads_channel.twin
weight_norm_backward_serial = weight_norm_backward.twin
