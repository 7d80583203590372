"""Position encodings and masks: rotary embedding, sinusoidal encoding, ALiBi bias and
the causal mask, against the numpy expressions of the same formulas (no checks).

Sequence lengths 512 and 2048; rotary on ``x [8, S, 64]`` (8 heads of width 64),
sinusoidal with 512 features, ALiBi / causal mask ``[S, S]``.
"""

import numpy as np

from hmath_dl.layers import alibi_bias, causal_mask, rotary_embedding, sinusoidal_encoding

from .common import normal

SEQ = [512, 2048]


def numpy_rotary(base, offset, x):
    s, f = x.shape[-2:]
    pos = np.arange(offset, offset + s, dtype=np.float64)[:, None]
    ang = pos * base ** (-np.arange(0, f, 2) / f)
    c, sn = np.cos(ang), np.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * sn
    out[..., 1::2] = x0 * sn + x1 * c
    return out


def numpy_sinusoidal(positions, features, offset):
    pos = np.arange(offset, offset + positions, dtype=np.float64)[:, None]
    i2 = np.arange(0, features, 2)
    ang = pos / 10000.0 ** (i2 / features)
    pe = np.empty((positions, features))
    pe[:, 0::2] = np.sin(ang)
    pe[:, 1::2] = np.cos(ang[:, : features // 2])
    return pe


class Positions:
    params = [SEQ]
    param_names = ["n"]

    def setup(self, n):
        self.x = normal((8, n, 64), 31)
        rotary_embedding(10000.0, 0, self.x[:, :1])
        sinusoidal_encoding(2, 512, 0)
        alibi_bias(0.5, 2, 2, 0)
        causal_mask(2, 2, 0)

    def time_rotary_embedding(self, n):
        rotary_embedding(10000.0, 0, self.x)

    def time_numpy_rotary(self, n):
        numpy_rotary(10000.0, 0, self.x)

    def time_sinusoidal_encoding(self, n):
        sinusoidal_encoding(n, 512, 0)

    def time_numpy_sinusoidal(self, n):
        numpy_sinusoidal(n, 512, 0)

    def time_alibi_bias(self, n):
        alibi_bias(0.5, n, n, 0)

    def time_numpy_alibi(self, n):
        i = np.arange(n)
        -0.5 * np.abs(i[:, None] - i[None, :]).astype(np.float64)

    def time_causal_mask(self, n):
        causal_mask(n, n, 0)

    def time_numpy_tril(self, n):
        np.tril(np.ones((n, n), dtype=bool))
