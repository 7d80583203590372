"""Slow, obviously correct oracles for attention, positions, the KV cache and the
feed-forward block — written from API.md §5, never from the kernels.

Attention is evaluated in 50-digit mpmath and rounded once at the end, so it is a
reference for any float64 implementation.  Positional formulas are evaluated exactly as
API.md writes them, in Python floats.
"""

import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np

_DPS = 50


def _lead_indices(lead):
    return itertools.product(*[range(s) for s in lead])


def _pick(a, lead_index, n, m):
    """mask/bias given as [N, M] or [..., N, M] -> the [N, M] slice for lead_index."""
    a = np.asarray(a)
    if a.shape == (n, m):
        return a
    return a[lead_index]


def sdpa(q, k, v, mask=None, bias=None):
    """(out, weights) of scaled dot-product attention; fully masked rows are zeros."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    lead = q.shape[:-2]
    n, d = q.shape[-2:]
    m, f = v.shape[-2:]
    out = np.zeros(lead + (n, f))
    weights = np.zeros(lead + (n, m))
    with mpmath.workdps(_DPS):
        root_d = mpmath.sqrt(d)
        for li in _lead_indices(lead):
            mk = None if mask is None else _pick(mask, li, n, m)
            bs = None if bias is None else _pick(bias, li, n, m)
            for i in range(n):
                allowed = [j for j in range(m) if mk is None or bool(mk[i, j])]
                if not allowed:
                    continue
                scores = {}
                for j in allowed:
                    s = mpmath.mpf(0)
                    for c in range(d):
                        s += mpmath.mpf(float(q[li + (i, c)])) * mpmath.mpf(float(k[li + (j, c)]))
                    s = s / root_d
                    if bs is not None:
                        s += mpmath.mpf(float(bs[i, j]))
                    scores[j] = s
                mx = max(scores.values())
                e = {j: mpmath.exp(scores[j] - mx) for j in allowed}
                total = mpmath.fsum(e.values())
                for j in allowed:
                    weights[li + (i, j)] = float(e[j] / total)
                for c in range(f):
                    acc = mpmath.fsum(e[j] / total * mpmath.mpf(float(v[li + (j, c)]))
                                      for j in allowed)
                    out[li + (i, c)] = float(acc)
    return out, weights


def multihead(heads, q, k, v, mask=None):
    """Head i attends with columns [i*D/h, (i+1)*D/h) of q, k and [i*F/h, (i+1)*F/h) of v."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    d = q.shape[-1] // heads
    f = v.shape[-1] // heads
    parts = []
    for i in range(heads):
        o, _ = sdpa(q[..., i * d:(i + 1) * d], k[..., i * d:(i + 1) * d],
                    v[..., i * f:(i + 1) * f], mask)
        parts.append(o)
    return np.concatenate(parts, axis=-1)


def causal_mask(queries, keys, offset):
    out = np.zeros((queries, keys), dtype=bool)
    for i in range(queries):
        for j in range(keys):
            out[i, j] = j <= i + offset
    return out


def rotary(base, offset, x):
    x = np.asarray(x, dtype=np.float64)
    s, f = x.shape[-2:]
    out = np.zeros(x.shape)
    for li in _lead_indices(x.shape[:-2]):
        for r in range(s):
            pos = float(offset + r)
            for i in range(f // 2):
                angle = pos * base ** (-(2 * i) / f)
                x0 = float(x[li + (r, 2 * i)])
                x1 = float(x[li + (r, 2 * i + 1)])
                out[li + (r, 2 * i)] = x0 * math.cos(angle) - x1 * math.sin(angle)
                out[li + (r, 2 * i + 1)] = x0 * math.sin(angle) + x1 * math.cos(angle)
    return out


def sinusoidal(positions, features, offset):
    out = np.zeros((positions, features))
    for p in range(positions):
        pos = float(offset + p)
        for c in range(features):
            i = c // 2
            angle = pos / 10000.0 ** (2 * i / features)
            out[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return out


def alibi(slope, queries, keys, offset):
    """Exact: -slope * |(i + offset) - j| rounded once (a product of a float and an int)."""
    out = np.zeros((queries, keys))
    for i in range(queries):
        for j in range(keys):
            out[i, j] = float(-Fraction(slope) * abs((i + offset) - j))
    return out


class ListCache:
    """The KV cache as a plain list of rows (what every cache value must hold)."""

    def __init__(self, capacity, kw, vw, keys=(), values=()):
        self.capacity, self.kw, self.vw = capacity, kw, vw
        self.keys = [list(r) for r in keys]
        self.values = [list(r) for r in values]

    def append(self, keys, values):
        assert len(self.keys) + len(keys) <= self.capacity
        return ListCache(self.capacity, self.kw, self.vw,
                         self.keys + [list(r) for r in keys],
                         self.values + [list(r) for r in values])

    def arrays(self):
        return (np.array(self.keys, dtype=np.float64).reshape(len(self.keys), self.kw),
                np.array(self.values, dtype=np.float64).reshape(len(self.values), self.vw))


def feed_forward(act_fn, w1, b1, w2, b2, x):
    """dense(act(dense(x, w1, b1)), w2, b2) with plain loops; act_fn a scalar function."""
    x = np.asarray(x, dtype=np.float64)
    w1 = np.asarray(w1, dtype=np.float64)
    w2 = np.asarray(w2, dtype=np.float64)
    rows = x.reshape(-1, x.shape[-1])
    out = np.zeros((rows.shape[0], w2.shape[0]))
    for r in range(rows.shape[0]):
        h = []
        for o in range(w1.shape[0]):
            s = math.fsum(rows[r, i] * w1[o, i] for i in range(w1.shape[1]))
            s += 0.0 if b1 is None else b1[o]
            h.append(act_fn(s))
        for o in range(w2.shape[0]):
            s = math.fsum(h[i] * w2[o, i] for i in range(w2.shape[1]))
            out[r, o] = s + (0.0 if b2 is None else b2[o])
    return out.reshape(x.shape[:-1] + (w2.shape[0],))
