"""Element-wise sums and products of float64 arrays in parallel blocks, with the count
of non-finite results in the same pass: the autodiff's ``+`` and ``*`` of equal shapes,
its gradient sums, and the activation vjp's ``g * f'(x)``.

IEEE 754 addition and multiplication are correctly rounded, so every element is the
bits numpy's ``add`` / ``multiply`` give, on every CPU and for any thread count (each
element is written by one block; the count is an integer sum).  numpy runs them on one
thread and the autodiff then scanned each sum again for NaN/inf; here a call of at
least :data:`MIN_SIZE` elements runs in parallel blocks (serially below ``SERIAL_WORK /
2`` elements) and the scan is the count of the same pass.
"""

import numpy as np

from ._jit import block_count, block_size, span_kernel
from .views import readonly

#: Arrays with fewer elements stay with numpy (a launch and a compilation do not pay).
MIN_SIZE = 1 << 15
_BLOCKS = 64          # at most this many blocks (span iterations) per call


@span_kernel(iterations=lambda a, b, out, mul, bad: bad.shape[0],
             work=lambda a, b, out, mul, bad: out.shape[0], scale=0.5)
def _blocks(a, b, out, mul, bad, t0, t1):
    """``out = a * b`` (``mul``) or ``a + b`` over the blocks ``t0 .. t1-1`` of the flat
    arrays (:func:`._jit.block_size` of ``_BLOCKS``), ``bad[t]`` = the non-finite
    results of block ``t`` (``x - x`` is NaN exactly for NaN and +-inf)."""
    n = out.shape[0]
    per = block_size(n, _BLOCKS)
    for t in range(t0, t1):
        lo = np.uint64(t * per)
        hi = np.uint64(min(n, (t + 1) * per))
        cnt = 0
        # unsigned indices: no negative-index wrap-around test, so the loops vectorise
        if mul:
            for i in range(lo, hi):
                v = a[i] * b[i]
                out[i] = v
                cnt += (v - v) != 0.0
        else:
            for i in range(lo, hi):
                v = a[i] + b[i]
                out[i] = v
                cnt += (v - v) != 0.0
        bad[t] = cnt


def applies(a, b):
    """Whether :func:`binary` takes ``a`` and ``b``: float64 C-contiguous arrays of the
    same shape with at least :data:`MIN_SIZE` elements."""
    return (a.shape == b.shape and a.size >= MIN_SIZE and a.dtype == np.float64
            and b.dtype == np.float64 and a.flags.c_contiguous and b.flags.c_contiguous)


def binary(a, b, mul):
    """``(out, nonfinite)``: a new array ``a * b`` (``mul``) or ``a + b`` -- numpy's bits --
    and the number of its NaN/inf elements.  ``a``, ``b`` as :func:`applies` requires."""
    out = np.empty(a.shape)
    n = out.size
    bad = np.zeros(block_count(n, _BLOCKS), dtype=np.int64)
    _blocks(readonly(a.reshape(-1)), readonly(b.reshape(-1)), out.reshape(-1), bool(mul), bad)
    return out, int(bad.sum())


def add(a, b):
    """``a + b``: by :func:`binary` when it :func:`applies`, else numpy's (same bits)."""
    return binary(a, b, False)[0] if applies(a, b) else a + b


def multiply(a, b):
    """``a * b``: by :func:`binary` when it :func:`applies`, else numpy's (same bits)."""
    return binary(a, b, True)[0] if applies(a, b) else a * b
