"""Elementwise kernels: activations (forward and derivative) and dropout masks.

Activation codes
----------------
Every activation is identified by a small int, ``hmath_dl.activations.Activation.<M>.value``
(also available as ``hmath_dl.activations.ACTIVATION_CODES[Activation.<M>]``):

====  ==========  =======================================================
code  activation  forward ``f(x)``
====  ==========  =======================================================
0     IDENTITY    ``x``
1     RELU        ``max(x, 0)``
2     LEAKY_RELU  ``x if x > 0 else 0.01 x``
3     GELU        ``0.5 x (1 + erf(x / sqrt 2))`` (evaluated as ``0.5 x erfc(-x/sqrt 2)``)
4     GELU_TANH   ``0.5 x (1 + tanh(u))``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``,
                  evaluated as ``x sigmoid(2u)`` (same value, no cancellation)
5     SILU        ``x sigmoid(x)``
6     SIGMOID     ``1 / (1 + exp(-x))`` (stable two-branch form)
7     TANH        ``tanh(x)``
8     SOFTPLUS    ``max(x, 0) + log1p(exp(-|x|))``
9     ELU         ``x if x > 0 else expm1(x)`` (alpha 1)
====  ==========  =======================================================

Public kernel entries (for reuse, e.g. by autodiff):

* ``activation_forward(code, x_flat, out_flat) -> bool``: ``out_flat[i] = f(x_flat[i])``.
* ``activation_derivative(code, x_flat, out_flat) -> bool``: ``out_flat[i] = f'(x_flat[i])``
  (at the kinks of RELU / LEAKY_RELU / ELU, ``x == 0``, the left derivative is used: 0,
  0.01 and 1 respectively).
* ``activation_forward_derivative(code, x_flat, out_flat, d_flat) -> bool``: both in one
  pass (GELU evaluates erfc once), bitwise equal to the two kernels above.

Both take 1-D C-contiguous float64 arrays of equal length (``out_flat`` may be
``x_flat`` itself for in-place use) and return True iff every INPUT is finite; for
finite inputs every output of every activation and derivative is finite (the formulas
are evaluated in overflow-free forms).  They do not validate anything else: pass a valid
code (an unknown code leaves ``out_flat`` untouched). Work is split over fixed chunks, so results do
not depend on the thread count.

Dropout: ``dropout_train(x_flat, u_flat, p, scale, out_flat)`` (element-wise mask) and
``apply_channel_mask(x_flat, channel_mask, inner, out_flat, mask_flat)`` (spatial).
"""

import math

import numpy as np
from numba import prange

from ._jit import helper, kernel

_CHUNK = 4096

IDENTITY = 0
RELU = 1
LEAKY_RELU = 2
GELU = 3
GELU_TANH = 4
SILU = 5
SIGMOID = 6
TANH = 7
SOFTPLUS = 8
ELU = 9

LEAKY_SLOPE = 0.01
_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_GELU_TANH_C = 0.7978845608028654  # sqrt(2 / pi)
_GELU_TANH_A = 0.044715


@helper
def _chunk_finite(a, start, stop):
    """True iff a[start:stop] is all finite (v * 0 is NaN exactly for NaN/inf v; eight
    independent accumulators keep the check off the critical path)."""
    c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = 0.0
    stop8 = start + (stop - start) // 8 * 8
    for i in range(start, stop8, 8):
        c0 += a[i] * 0.0
        c1 += a[i + 1] * 0.0
        c2 += a[i + 2] * 0.0
        c3 += a[i + 3] * 0.0
        c4 += a[i + 4] * 0.0
        c5 += a[i + 5] * 0.0
        c6 += a[i + 6] * 0.0
        c7 += a[i + 7] * 0.0
    for i in range(stop8, stop):
        c0 += a[i] * 0.0
    return ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)) == 0.0


@helper
def _sigmoid(v):
    if v >= 0.0:
        return 1.0 / (1.0 + math.exp(-v))
    e = math.exp(v)
    return e / (1.0 + e)


@helper
def _forward_chunk(code, x, out, start, stop):
    ok = _chunk_finite(x, start, stop)
    if code == IDENTITY:
        for i in range(start, stop):
            out[i] = x[i]
    elif code == RELU:
        for i in range(start, stop):
            v = x[i]
            out[i] = v if v > 0.0 else 0.0
    elif code == LEAKY_RELU:
        for i in range(start, stop):
            v = x[i]
            out[i] = v if v > 0.0 else LEAKY_SLOPE * v
    elif code == GELU:
        for i in range(start, stop):
            v = x[i]
            out[i] = 0.5 * v * math.erfc(-v * _INV_SQRT2)
    elif code == GELU_TANH:
        for i in range(start, stop):
            v = x[i]
            # 0.5 (1 + tanh(u)) == sigmoid(2u): no cancellation for negative v;
            # v**3 overflowing to +-inf gives sigmoid = 0 or 1, never NaN.
            u = _GELU_TANH_C * (v + _GELU_TANH_A * v * v * v)
            out[i] = v * _sigmoid(2.0 * u)
    elif code == SILU:
        for i in range(start, stop):
            v = x[i]
            out[i] = v * _sigmoid(v)
    elif code == SIGMOID:
        for i in range(start, stop):
            out[i] = _sigmoid(x[i])
    elif code == TANH:
        for i in range(start, stop):
            out[i] = math.tanh(x[i])
    elif code == SOFTPLUS:
        for i in range(start, stop):
            v = x[i]
            out[i] = max(v, 0.0) + math.log1p(math.exp(-abs(v)))
    elif code == ELU:
        for i in range(start, stop):
            v = x[i]
            out[i] = v if v > 0.0 else math.expm1(v)
    return ok


@helper
def _derivative_chunk(code, x, out, start, stop):
    ok = _chunk_finite(x, start, stop)
    if code == IDENTITY:
        for i in range(start, stop):
            out[i] = 1.0
    elif code == RELU:
        for i in range(start, stop):
            out[i] = 1.0 if x[i] > 0.0 else 0.0
    elif code == LEAKY_RELU:
        for i in range(start, stop):
            out[i] = 1.0 if x[i] > 0.0 else LEAKY_SLOPE
    elif code == GELU:
        for i in range(start, stop):
            v = x[i]
            # Phi(v) + v phi(v)
            out[i] = 0.5 * math.erfc(-v * _INV_SQRT2) + v * _INV_SQRT_2PI * math.exp(-0.5 * v * v)
    elif code == GELU_TANH:
        for i in range(start, stop):
            v = x[i]
            if abs(v) >= 1e10:
                # sigmoid(-2|u|) is exactly 0 here: the formula below gives exactly 1 / 0,
                # and this avoids 0 * inf once v**2 overflows.
                out[i] = 1.0 if v > 0.0 else 0.0
            else:
                u = _GELU_TANH_C * (v + _GELU_TANH_A * v * v * v)
                du = _GELU_TANH_C * (1.0 + 3.0 * _GELU_TANH_A * v * v)
                sp = _sigmoid(2.0 * u)
                sm = _sigmoid(-2.0 * u)
                # d/dv [v sigmoid(2u)] = sigmoid(2u) + 2 v sigmoid(2u) sigmoid(-2u) u'
                out[i] = sp + 2.0 * v * (sp * sm) * du
    elif code == SILU:
        for i in range(start, stop):
            v = x[i]
            # sigmoid'(v) = sigmoid(v) sigmoid(-v): no cancellation in 1 - sigmoid(v)
            out[i] = _sigmoid(v) * (1.0 + v * _sigmoid(-v))
    elif code == SIGMOID:
        for i in range(start, stop):
            v = x[i]
            out[i] = _sigmoid(v) * _sigmoid(-v)
    elif code == TANH:
        for i in range(start, stop):
            ch = math.cosh(x[i])  # sech^2, accurate in the tails; 0 once cosh^2 overflows
            out[i] = 1.0 / (ch * ch)
    elif code == SOFTPLUS:
        for i in range(start, stop):
            out[i] = _sigmoid(x[i])
    elif code == ELU:
        for i in range(start, stop):
            v = x[i]
            out[i] = 1.0 if v > 0.0 else math.exp(v)
    return ok


@kernel
def activation_forward(code, x_flat, out_flat):
    """``out_flat[i] = f_code(x_flat[i])``; True iff every input is finite (see module doc)."""
    n = x_flat.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    ok = np.ones(nchunks, dtype=np.bool_)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        ok[c] = _forward_chunk(code, x_flat, out_flat, start, stop)
    for c in range(nchunks):
        if not ok[c]:
            return False
    return True


@kernel
def activation_derivative(code, x_flat, out_flat):
    """``out_flat[i] = f_code'(x_flat[i])``; True iff every input is finite (see module doc)."""
    n = x_flat.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    ok = np.ones(nchunks, dtype=np.bool_)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        ok[c] = _derivative_chunk(code, x_flat, out_flat, start, stop)
    for c in range(nchunks):
        if not ok[c]:
            return False
    return True


@helper
def _gelu_both_chunk(x, out, d, start, stop):
    """GELU value and derivative from ONE erfc per element (the same expressions as
    ``_forward_chunk`` / ``_derivative_chunk``, so the same bits)."""
    ok = _chunk_finite(x, start, stop)
    for i in range(start, stop):
        v = x[i]
        e = math.erfc(-v * _INV_SQRT2)
        out[i] = 0.5 * v * e
        d[i] = 0.5 * e + v * _INV_SQRT_2PI * math.exp(-0.5 * v * v)
    return ok


@kernel
def activation_forward_derivative(code, x_flat, out_flat, d_flat):
    """``out_flat[i] = f_code(x_flat[i])`` and ``d_flat[i] = f_code'(x_flat[i])`` in one
    pass (for autodiff: the backward pass then only multiplies).  Bitwise the results of
    :func:`activation_forward` and :func:`activation_derivative`; True iff every input is
    finite."""
    n = x_flat.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    ok = np.ones(nchunks, dtype=np.bool_)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        if code == GELU:
            ok[c] = _gelu_both_chunk(x_flat, out_flat, d_flat, start, stop)
        else:
            ok[c] = _forward_chunk(code, x_flat, out_flat, start, stop)
            _derivative_chunk(code, x_flat, d_flat, start, stop)
    for c in range(nchunks):
        if not ok[c]:
            return False
    return True


@kernel
def dropout_train(x_flat, u_flat, p, scale, out_flat):
    """Inverted dropout.  ``u_flat`` holds uniform draws in ``[0, 1)`` and is OVERWRITTEN
    with the mask: ``scale`` where ``u >= p`` (element kept), else ``0.0``;
    ``out_flat = x_flat * mask``.  True iff every output is finite."""
    n = x_flat.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    ok = np.ones(nchunks, dtype=np.bool_)
    for c in prange(nchunks):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        for i in range(start, stop):
            m = scale if u_flat[i] >= p else 0.0
            u_flat[i] = m
            out_flat[i] = x_flat[i] * m
        ok[c] = _chunk_finite(out_flat, start, stop)
    for c in range(nchunks):
        if not ok[c]:
            return False
    return True


@kernel
def apply_channel_mask(x_flat, channel_mask, inner, out_flat, mask_flat):
    """Spatial dropout: ``x_flat`` is ``[rows, inner]`` flattened; row ``r`` is multiplied
    by ``channel_mask[r]``; ``mask_flat`` receives the broadcast mask. True iff every
    output is finite."""
    rows = channel_mask.shape[0]
    ok = np.ones(rows, dtype=np.bool_)
    for r in prange(rows):
        m = channel_mask[r]
        base = r * inner
        for j in range(inner):
            out_flat[base + j] = x_flat[base + j] * m
            mask_flat[base + j] = m
        ok[r] = _chunk_finite(out_flat, base, base + inner)
    for r in range(rows):
        if not ok[r]:
            return False
    return True
