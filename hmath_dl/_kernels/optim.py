"""Optimizer update kernels (elementwise, one call per parameter array).

All arrays are 1-D C-contiguous float64 of equal length; outputs are separate arrays.
Work is split into fixed chunks over independent elements, so results do not depend on
the thread count.  Each kernel returns True iff every written value is finite.
"""

import math

import numpy as np
from ._jit import helper, span_kernel

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


@span_kernel()
def _sgd_span(p, g, buf, lr, momentum, weight_decay, p_out, buf_out, ok, c0, c1):
    """Chunks ``c0 .. c1-1`` (of ``_CHUNK`` elements) of :func:`sgd_update`; ``ok[c]``
    whether chunk ``c``'s results are finite."""
    n = p.shape[0]
    for c in range(c0, c1):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        ok[c] = _sgd_chunk(p, g, buf, lr, momentum, weight_decay, p_out, buf_out, start, stop)


def sgd_update(p, g, buf, lr, momentum, weight_decay, p_out, buf_out):
    """``d = g + wd p; buf' = momentum buf + d; p' = p - lr buf'``.  Chunks of ``_CHUNK``
    elements in parallel (:func:`_sgd_span`, one chunk: serially)."""
    ok = np.ones((p.shape[0] + _CHUNK - 1) // _CHUNK, dtype=np.bool_)
    _sgd_span.run(ok.shape[0], p.shape[0], p, g, buf, lr, momentum, weight_decay, p_out,
                  buf_out, ok)
    return bool(ok.all())


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


@span_kernel()
def _adamw_span(p, g, m, v, lr, beta1, beta2, eps, weight_decay, bc1, sqrt_bc2, p_out, m_out,
                v_out, ok, c0, c1):
    """Chunks ``c0 .. c1-1`` (of ``_CHUNK`` elements) of :func:`adamw_update`; ``ok[c]``
    whether chunk ``c``'s results are finite."""
    n = p.shape[0]
    for c in range(c0, c1):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        ok[c] = _adamw_chunk(p, g, m, v, lr, beta1, beta2, eps, weight_decay, bc1, sqrt_bc2,
                             p_out, m_out, v_out, start, stop)


def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, bc1, sqrt_bc2,
                 p_out, m_out, v_out):
    """AdamW (decoupled weight decay), torch's operation order::

        m' = b1 m + (1 - b1) g;  v' = b2 v + (1 - b2) g^2
        p' = p (1 - lr wd) - (lr / bc1) * m' / (sqrt(v') / sqrt_bc2 + eps)

    Chunks of ``_CHUNK`` elements in parallel (:func:`_adamw_span`, one chunk:
    serially)."""
    ok = np.ones((p.shape[0] + _CHUNK - 1) // _CHUNK, dtype=np.bool_)
    _adamw_span.run(ok.shape[0], p.shape[0], p, g, m, v, lr, beta1, beta2, eps, weight_decay,
                    bc1, sqrt_bc2, p_out, m_out, v_out, ok)
    return bool(ok.all())
