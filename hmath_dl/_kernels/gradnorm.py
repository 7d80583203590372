"""Overflow-safe Euclidean norm pieces (the gradient-norm kernels).

The facade combines them: ``amax = max |x|`` over every array (:func:`max_abs_bits`, on
the bit patterns: non-negative doubles order like their bits, and NaN/inf show up as
``>= 0x7FF0000000000000``); with ``amax = f * 2**e`` (``0.5 <= f < 1``) every entry is
scaled by the exact power of two ``2**-e`` (applied as two factors ``s1 * s2`` so that
neither constant over- or underflows), squared and summed (:func:`scaled_sum_squares`); the
norm is ``sqrt(sum) * 2**e``.

Fixed summation order: entry ``i`` of an array goes to lane ``i % 8``; each lane sums
sequentially; lanes are combined as ``((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))``.
Serial kernels (memory-bound; they vectorise), so nothing depends on the thread count.
"""

import numpy as np

from ._jit import helper

_ABS64 = np.int64(0x7FFFFFFFFFFFFFFF)


@helper
def max_abs_bits(flat):
    """``max(bits(|x|))`` over the 1-D float64 array ``flat`` (0 when empty)."""
    u = flat.view(np.int64)
    m = np.int64(0)
    for i in range(u.shape[0]):
        m = max(m, u[i] & _ABS64)
    return m


@helper
def scaled_sum_squares(flat, s1, s2):
    """``sum((x * s1 * s2)**2)`` over the 1-D float64 array ``flat`` in the fixed 8-lane
    order of the module docstring."""
    n = flat.shape[0]
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0.0
    full = n - n % 8
    for i in range(0, full, 8):
        t0 = (flat[i] * s1) * s2
        t1 = (flat[i + 1] * s1) * s2
        t2 = (flat[i + 2] * s1) * s2
        t3 = (flat[i + 3] * s1) * s2
        t4 = (flat[i + 4] * s1) * s2
        t5 = (flat[i + 5] * s1) * s2
        t6 = (flat[i + 6] * s1) * s2
        t7 = (flat[i + 7] * s1) * s2
        l0 += t0 * t0
        l1 += t1 * t1
        l2 += t2 * t2
        l3 += t3 * t3
        l4 += t4 * t4
        l5 += t5 * t5
        l6 += t6 * t6
        l7 += t7 * t7
    rest = n - full
    if rest > 0:
        t = (flat[full] * s1) * s2
        l0 += t * t
    if rest > 1:
        t = (flat[full + 1] * s1) * s2
        l1 += t * t
    if rest > 2:
        t = (flat[full + 2] * s1) * s2
        l2 += t * t
    if rest > 3:
        t = (flat[full + 3] * s1) * s2
        l3 += t * t
    if rest > 4:
        t = (flat[full + 4] * s1) * s2
        l4 += t * t
    if rest > 5:
        t = (flat[full + 5] * s1) * s2
        l5 += t * t
    if rest > 6:
        t = (flat[full + 6] * s1) * s2
        l6 += t * t
    return ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
