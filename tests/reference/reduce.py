"""The documented order of the library's fixed-order sums (``hmath_dl._kernels.reduce``),
in plain Python floats: an oracle that must match bit for bit."""

import numpy as np


def _partial8(values):
    p = [0.0] * 8
    i = 0
    while i + 8 <= len(values):
        for r in range(8):
            p[r] += values[i + r]
        i += 8
    s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
    for v in values[i:]:
        s += v
    return s


def sum_to_oracle(x, keep):
    """The documented order of ``hmath_dl._kernels.reduce.sum_to``."""
    idx = [i for i, k in enumerate(keep) if k]
    contiguous = not idx or idx == list(range(idx[0], idx[-1] + 1))
    if contiguous:
        lo = idx[0] if idx else x.ndim
        hi = idx[-1] + 1 if idx else x.ndim
        x3 = x.reshape(int(np.prod(x.shape[:lo])), -1, int(np.prod(x.shape[hi:])))
    else:
        x3 = np.moveaxis(x, idx, list(range(len(idx)))).reshape(1, -1, int(np.prod(
            [s for s, k in zip(x.shape, keep) if not k])))
    out = []
    for k in range(x3.shape[1]):
        acc = 0.0
        for a in range(x3.shape[0]):
            acc += float(x3[a, k, 0]) if x3.shape[2] == 1 else _partial8([float(v) for v in x3[a, k]])
        out.append(acc)
    return np.array(out).reshape([s for s, k in zip(x.shape, keep) if k])
