"""Where the float GEMM's time goes: its register micro-kernel alone against whole
products, on one thread, in GFLOP/s (``track_*``: higher is better).

``track_micro_kernel_in_l1``: the micro-kernel of :mod:`hmath_dl._kernels.gemm_f64`
(6 rows x the widest tile, 128 terms on 8-lane targets / 256 on 4-lane ones) run over 15
row blocks of a packed ``a`` against one tile's chunk of ``b``, everything in L1 -- the
ceiling of the loop itself.  ``track_product``: whole products through
:func:`~hmath_dl._kernels.gemm_f64.matmul` (packing and the epilogue included) on one
thread; ``track_numpy``: numpy's matmul of the same shapes on one BLAS thread, the peer.

2026-12-06, AVX-512 host (Sapphire Rapids class): the micro-kernel 94-101 GFLOP/s, whole
products 73-80 (MKL through torch: 85-87); in a copy of the product's loop nest the
chunks of ``b`` coming from L3 cost ~10 % and the reloads of ``c`` from chunk to chunk
~5 % (prefetching the next tile's chunk in software gave nothing).
"""

import time

import numba
import numpy as np
from numba import njit

from hmath_dl._kernels import gemm_f64 as G

from .common import normal

SHAPES = [(512, 1024, 1024), (1024, 64, 256), (64, 256, 3136)]   # M, K, N


@njit(cache=False)
def _blocks(b, a, c, reps, nk, nblk, T, V):
    for r in range(reps):
        for blk in range(nblk):
            G._tile(V, b, 0, T, a, blk * 6 * nk, nk, c, 0, T, r == 0, 0, 6, 1)


def _one_thread(fn):
    """``fn()`` with one Numba thread (and one BLAS thread when threadpoolctl is there)."""
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover
            return fn()
        with threadpool_limits(1):
            return fn()
    finally:
        numba.set_num_threads(old)


def _best_rate(fn, flops, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return flops / best / 1e9


class GemmCore:
    unit = "GFLOP/s"
    timeout = 300

    def setup(self):
        self.T = G._T
        self.V = G._T // G._VW
        self.nk = G._KC
        self.nblk = 15
        self.b = normal((self.nk * self.T,), 1)
        self.a = normal((self.nblk * 6 * self.nk,), 2)
        self.c = np.zeros(6 * self.T)
        _blocks(self.b, self.a, self.c, 1, self.nk, self.nblk, self.T, self.V)

    def track_micro_kernel_in_l1(self):
        reps = 2000
        flops = 2.0 * reps * self.nblk * 6 * self.T * self.nk
        return _one_thread(lambda: _best_rate(
            lambda: _blocks(self.b, self.a, self.c, reps, self.nk, self.nblk, self.T, self.V),
            flops))


class GemmProducts:
    unit = "GFLOP/s"
    params = [SHAPES]
    param_names = ["M_K_N"]
    timeout = 300

    def setup(self, s):
        self.x, self.y = normal(s[:2], 3), normal(s[1:], 4)
        G.matmul(self.x, self.y)
        self.flops = 2.0 * s[0] * s[1] * s[2]

    def track_product(self, s):
        return _one_thread(lambda: _best_rate(lambda: G.matmul(self.x, self.y), self.flops))

    def track_numpy(self, s):
        return _one_thread(lambda: _best_rate(lambda: self.x @ self.y, self.flops))
