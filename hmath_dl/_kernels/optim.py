"""Optimizer update kernels (elementwise, one call per parameter array).

All arrays are 1-D C-contiguous float64 of equal length; outputs are separate arrays.
Work is split into fixed chunks over independent elements, so results do not depend on
the thread count.  Each kernel returns True iff every written value is finite.
"""

import math

import numpy as np
from numba import prange

from ._jit import helper, kernel

_CHUNK = 4096


@helper
def _sgd_chunk(p, g, buf, lr, momentum, weight_decay, p_out, buf_out, start, stop):
    acc = 0.0
    for i in range(start, stop):
        d = g[i] + weight_decay * p[i]
        b = momentum * buf[i] + d
        buf_out[i] = b
        q = p[i] - lr * b
        p_out[i] = q
        acc += (q + b) * 0.0
    return acc == 0.0


@kernel
def sgd_update(p, g, buf, lr, momentum, weight_decay, p_out, buf_out):
    """``d = g + wd p; buf' = momentum buf + d; p' = p - lr buf'``."""
    n = p.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    ok = np.ones(nchunks, dtype=np.bool_)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        ok[c] = _sgd_chunk(p, g, buf, lr, momentum, weight_decay, p_out, buf_out, start, stop)
    for c in range(nchunks):
        if not ok[c]:
            return False
    return True


@helper
def _adamw_chunk(p, g, m, v, lr, beta1, beta2, eps, weight_decay, bc1, sqrt_bc2,
                 p_out, m_out, v_out, start, stop):
    acc = 0.0
    step = lr / bc1
    decay = 1.0 - lr * weight_decay
    for i in range(start, stop):
        gi = g[i]
        mi = beta1 * m[i] + (1.0 - beta1) * gi
        vi = beta2 * v[i] + (1.0 - beta2) * (gi * gi)
        m_out[i] = mi
        v_out[i] = vi
        denom = math.sqrt(vi) / sqrt_bc2 + eps
        q = p[i] * decay - step * (mi / denom)
        p_out[i] = q
        acc += (q + mi + vi) * 0.0
    return acc == 0.0


@kernel
def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, bc1, sqrt_bc2,
                 p_out, m_out, v_out):
    """AdamW (decoupled weight decay), torch's operation order::

        m' = b1 m + (1 - b1) g;  v' = b2 v + (1 - b2) g^2
        p' = p (1 - lr wd) - (lr / bc1) * m' / (sqrt(v') / sqrt_bc2 + eps)
    """
    n = p.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    ok = np.ones(nchunks, dtype=np.bool_)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        ok[c] = _adamw_chunk(p, g, m, v, lr, beta1, beta2, eps, weight_decay, bc1, sqrt_bc2,
                             p_out, m_out, v_out, start, stop)
    for c in range(nchunks):
        if not ok[c]:
            return False
    return True
