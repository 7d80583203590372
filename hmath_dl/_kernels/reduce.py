"""Fixed-order sums over axes (gradients of broadcasts and biases, autodiff ``sum``).

``sum_to(x, keep)``: ``x`` summed over every axis whose ``keep`` flag is False, the kept
axes in their order (the result has the kept axes' shape).  The order of every sum is
fixed by the shapes alone, so the result is the same on every CPU and for any thread
count (no numpy reduction: numpy's pairwise/SIMD summation order depends on its build):

* the array is viewed as ``[R1, K, R2]`` when the kept axes are one contiguous block
  (``R1`` = the product of the summed axes before it, ``R2`` after it); otherwise it is
  first copied into ``[1, K, R]`` with the kept axes first (``numpy.moveaxis``, a copy,
  no arithmetic);
* ``out[k] = (((0 + s(0, k)) + s(1, k)) + ...) + s(R1 - 1, k)``, ``r1`` increasing, where
  ``s(r1, k)`` is ``x[r1, k, 0]`` when ``R2 == 1`` and otherwise the sum over ``r2`` of
  ``x[r1, k, r2]`` as eight interleaved partial sums (``r2 = 8t + j`` into partial ``j``,
  ``t`` increasing), combined ``((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))``, then
  the tail in increasing ``r2``.
"""

import math

import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._jit import helper, inlined, span_kernel
from ._simd import _VW, _accepts, _data, _vptr, _zero_slots
from .libm import _wide
from .views import readonly


@helper
def _row_sum(a):
    """The eight-partial fixed-order sum of the 1-D array ``a`` (see the module docstring)."""
    return _run_sum(a, 0, a.shape[0])


@inlined
def _run_sum(a, start, n):
    """The eight-partial fixed-order sum of ``a[start:start + n]`` (``a`` flat; see the
    module docstring).  Unsigned offsets into the flat array: no view per row (a view
    costs a reference-count update) and no negative-index test.  Inlined into its two
    callers: compiled on its own it was one more function per caller's array type
    (read-only or not) to compile."""
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = 0.0
    i = np.uint64(start)
    end = i + np.uint64(n)
    eight = np.uint64(8)
    while i + eight <= end:
        p0 += a[i]
        p1 += a[i + np.uint64(1)]
        p2 += a[i + np.uint64(2)]
        p3 += a[i + np.uint64(3)]
        p4 += a[i + np.uint64(4)]
        p5 += a[i + np.uint64(5)]
        p6 += a[i + np.uint64(6)]
        p7 += a[i + np.uint64(7)]
        i += eight
    s = ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))
    while i < end:
        s += a[i]
        i += np.uint64(1)
    return s


_CHUNK = 64


_BLOCK = 32     # columns summed in registers at a time (4 vectors of 8, or 8 of 4)


@intrinsic
def _block_sums(typingctx, xf, r1, kk, lo, out):
    """``out[lo + j] = ((0.0 + x[0, lo + j]) + x[1, lo + j]) + ...`` over the ``r1`` rows of
    ``x [r1, kk]`` (flat ``xf``), for the ``_BLOCK`` columns ``j < _BLOCK``: one vector
    accumulator per ``VW`` columns, rows in increasing order (in a Numba loop the sums ran
    through ``out`` in memory, which might alias ``x`` for all the compiler knew).  1-D
    C-contiguous float64 arrays; the caller guarantees the addresses."""
    if not _accepts(f64=(xf, out), ints=(r1, kk, lo)):
        return None
    sig = types.void(xf, types.int64, types.int64, types.int64, out)
    nvec = _BLOCK // _VW

    def codegen(context, builder, signature, args):
        t = signature.args
        xd = _data(context, builder, t[0], args[0])
        od = _data(context, builder, t[4], args[4])
        rows, step, lov = args[1], args[2], args[3]
        accs = _zero_slots(builder, nvec)
        base = builder.gep(xd, [lov])
        with cgutils.for_range(builder, rows) as loop:
            p = builder.gep(base, [builder.mul(loop.index, step)])
            for v in range(nvec):
                x = builder.load(_vptr(builder, p, v * _VW), align=8)
                builder.store(builder.fadd(builder.load(accs[v]), x), accs[v])
        po = builder.gep(od, [lov])
        for v in range(nvec):
            builder.store(builder.load(accs[v]), _vptr(builder, po, v * _VW), align=8)
    return sig, codegen


@span_kernel(iterations=lambda x, out: (x.shape[1] + _CHUNK - 1) // _CHUNK,
             work=lambda x, out: x.size)
def _sum_columns(x, out, c0, c1):
    """``out[k] = sum_{r1} x[r1, k, 0]`` for ``x [R1, K, 1]`` (module docstring order),
    for the chunks ``c0 .. c1-1`` of ``_CHUNK`` consecutive ``k`` (a span kernel; a bias
    gradient of 64 columns is one chunk, 256 columns four): ``_BLOCK`` columns at a time
    in registers (:func:`_block_sums`), the last ``K % _BLOCK`` through ``out``.  Flat unsigned
    offsets: no view per row (each a reference-count update), no negative-index test,
    512-bit loops where the target has them."""
    _wide()
    r1, kk = x.shape[0], x.shape[1]
    xf = x.reshape(-1)
    ukk = np.uint64(kk)
    for c in range(c0, c1):
        c_lo = c * _CHUNK
        c_hi = min(kk, c_lo + _CHUNK)
        lo = c_lo
        while lo + _BLOCK <= c_hi:
            _block_sums(xf, r1, kk, lo, out)
            lo += _BLOCK
        ulo = np.uint64(lo)
        n = np.uint64(c_hi - lo)
        for j in range(n):
            out[ulo + j] = 0.0
        for a in range(np.uint64(r1)):
            base = a * ukk + ulo
            for j in range(n):
                out[ulo + j] += xf[base + j]


@span_kernel(iterations=lambda x, out: x.shape[1], work=lambda x, out: x.size)
def _sum_rows(x, out, k0, k1):
    """``out[k] = sum_{r1} s(r1, k)`` for ``x [R1, K, R2]`` (module docstring order),
    for ``k`` in ``k0 .. k1-1`` (a span kernel)."""
    r1, kk, r2 = x.shape
    xf = x.reshape(-1)
    for k in range(k0, k1):
        acc = 0.0
        for a in range(r1):
            acc += _run_sum(xf, (a * kk + k) * r2, r2)
        out[k] = acc


def _sum3(x, out):
    """``out[k] = sum_{r1} s(r1, k)`` for ``x [R1, K, R2]`` (module docstring order):
    :func:`_sum_columns` when ``R2 == 1``, else :func:`_sum_rows`."""
    if x.shape[2] == 1:
        _sum_columns(x, out)
    else:
        _sum_rows(x, out)


@helper
def picked_sum(m, idx):
    """``sum_i m[i, idx[i]]`` (``m [B, C]`` float64, ``idx`` int64 in ``[0, C)``), summed
    in increasing ``i`` from +0.0: the bits of ``sum_to(m[arange(B), idx], (False,))``
    (a 1-D sum to a scalar runs the rows in order, one addition each) without the
    gathered copy."""
    s = 0.0
    for i in range(m.shape[0]):
        s += m[i, idx[i]]
    return s


def sum_to(x, keep):
    """``x`` (float64) summed over the axes whose flag in ``keep`` is False; returns a new
    C-contiguous array of the kept axes' shape (see the module docstring for the order)."""
    x = np.asarray(x, dtype=np.float64)
    keep = tuple(bool(k) for k in keep)
    kept_shape = tuple(s for s, k in zip(x.shape, keep) if k)
    idx = [i for i, k in enumerate(keep) if k]
    out = np.empty(kept_shape)
    kk = out.size
    if kk == 0:
        return out
    if x.size == 0:
        out[...] = 0.0
        return out
    if not idx or idx == list(range(idx[0], idx[-1] + 1)):
        lo = idx[0] if idx else x.ndim
        hi = idx[-1] + 1 if idx else x.ndim
        r1 = math.prod(x.shape[:lo])
        r2 = math.prod(x.shape[hi:])
        x3 = np.ascontiguousarray(x).reshape(r1, kk, r2)
    else:
        moved = np.moveaxis(x, idx, list(range(len(idx))))
        x3 = np.ascontiguousarray(moved).reshape(1, kk, -1)
    _sum3(readonly(x3), out.reshape(-1))
    return out
