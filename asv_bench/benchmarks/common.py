"""Seeded, cached inputs and optional peers shared by the benchmark files.

Peers: numpy is always measured; torch only when importable (``TORCH`` is None
otherwise), in float64 and on the same number of threads as numba uses.
"""

import functools
import os

import numpy as np

try:  # optional peer
    import torch as TORCH

    TORCH.set_num_threads(int(os.environ.get("NUMBA_NUM_THREADS", os.cpu_count() or 1)))
except Exception:  # pragma: no cover - torch absent
    TORCH = None


@functools.lru_cache(maxsize=None)
def normal(shape, seed=0, scale=1.0):
    """A read-only standard normal array (cached: benchmarks share inputs)."""
    a = np.random.default_rng(seed).standard_normal(shape) * scale
    a.flags.writeable = False
    return a


def torch_tensor(a):
    """float64 torch tensor sharing nothing with ``a`` (None when torch is absent)."""
    if TORCH is None:
        return None
    return TORCH.from_numpy(np.array(a, dtype=np.float64, copy=True))


def skip_without_torch():
    if TORCH is None:
        raise NotImplementedError("torch not importable")  # asv: skipped benchmark
