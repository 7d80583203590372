"""KV cache beyond the one-row decode of bench_attention.py: appending blocks of rows
(prefill) and reading the visible rows (``cache_values``), against a preallocated numpy
buffer (mutable, no checks) and ``numpy.concatenate``.

Capacity 4096, widths 64 / 64.
"""

import numpy as np

from hmath_dl.layers import append_cache, cache_values, empty_cache

from .common import normal

ROWS = [1000, 4000]


class AppendBlocks:
    """Fill ``rows`` rows in blocks of 64 (a prefill in chunks)."""

    params = [ROWS]
    param_names = ["rows"]

    def setup(self, rows):
        k, v = normal((rows, 64), 60), normal((rows, 64), 61)
        self.blocks = [(k[i:i + 64], v[i:i + 64]) for i in range(0, rows, 64)]
        self.time_append_blocks_of_64(rows)

    def time_append_blocks_of_64(self, rows):
        c = empty_cache(4096, 64, 64)
        for k, v in self.blocks:
            c = append_cache(c, k, v)

    def time_numpy_preallocated(self, rows):
        kb, vb = np.empty((4096, 64)), np.empty((4096, 64))
        n = 0
        for k, v in self.blocks:
            kb[n:n + len(k)] = k
            vb[n:n + len(v)] = v
            n += len(k)

    def time_numpy_concatenate(self, rows):
        kb, vb = np.empty((0, 64)), np.empty((0, 64))
        for k, v in self.blocks:
            kb, vb = np.concatenate([kb, k]), np.concatenate([vb, v])


class CacheValues:
    params = [ROWS]
    param_names = ["rows"]

    def setup(self, rows):
        self.c = append_cache(empty_cache(4096, 64, 64), normal((rows, 64), 60), normal((rows, 64), 61))
        cache_values(self.c)
        self.kb = np.array(normal((rows, 64), 60))

    def time_cache_values(self, rows):
        cache_values(self.c)

    def time_numpy_readonly_view(self, rows):
        v = self.kb[:rows].view()
        v.flags.writeable = False
