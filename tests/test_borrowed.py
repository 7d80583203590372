"""``_kernels._simd.borrowed`` / ``alive``: a borrowed view is the same array (data,
shape, strides, dtype) without reference counting; writes through it land in the
original; a local array kept by ``alive`` stays valid for its borrowed views."""

import numpy as np
from numba import njit

from hmath_dl._kernels._simd import alive, borrowed


@njit(cache=False)
def _through_view(a, b):
    va = borrowed(a)
    vb = borrowed(b)
    acc = 0.0
    for i in range(va.shape[0]):
        for j in range(va.shape[1]):
            acc += va[i, j]
            vb[i, j] = va[i, j] * 2.0
    return acc, va.strides[0], va.strides[1]


@njit(cache=False)
def _local_scratch(n):
    s0 = np.empty(n)
    s = borrowed(s0)
    for i in range(n):
        s[i] = i + 0.5
    t = 0.0
    for i in range(n):
        t += s[i]
    alive(s0)
    return t


def test_borrowed_view_reads_and_writes_the_original():
    base = np.arange(60.0).reshape(6, 10)
    a = base[::2, 1::3]                      # non-contiguous: strides kept
    b = np.zeros((6, 10))[::2, 1::3]
    acc, s0, s1 = _through_view(a, b)
    assert acc == a.sum()
    assert (s0, s1) == a.strides
    assert np.array_equal(b, a * 2.0)


def test_local_array_alive_until_its_use():
    n = 1000
    assert _local_scratch(n) == sum(i + 0.5 for i in range(n))
