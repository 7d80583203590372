"""Slow, obviously correct oracles for the autodiff tests (written from API.md §6).

``numeric_gradient`` is a plain-loop central difference, independent of
``hmath_dl.autodiff.check_gradients``; the forward references use Python's ``math`` on
one element at a time.
"""

import itertools
import math

import numpy as np


def numeric_gradient(f, xs, cot, eps=1e-6):
    """Central differences of ``sum(cot * f(*xs))`` w.r.t. every entry of every ``xs[i]``.

    ``f`` maps float64 numpy arrays to a numpy array."""
    xs = [np.array(x, dtype=np.float64, copy=True) for x in xs]
    out = []
    for x in xs:
        g = np.zeros(x.shape)
        for idx in itertools.product(*[range(s) for s in x.shape]):
            old = x[idx]
            x[idx] = old + eps
            plus = float(np.sum(cot * f(*xs)))
            x[idx] = old - eps
            minus = float(np.sum(cot * f(*xs)))
            x[idx] = old
            g[idx] = (plus - minus) / (2 * eps)
        out.append(g)
    return out


def softmax_rows(x):
    """Softmax over the last axis, one row at a time with math.exp."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros(x.shape)
    for idx in itertools.product(*[range(s) for s in x.shape[:-1]]):
        row = x[idx]
        m = max(row)
        e = [math.exp(v - m) for v in row]
        s = math.fsum(e)
        out[idx] = [v / s for v in e]
    return out


def log_softmax_rows(x):
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros(x.shape)
    for idx in itertools.product(*[range(s) for s in x.shape[:-1]]):
        row = x[idx]
        m = max(row)
        lse = m + math.log(math.fsum(math.exp(v - m) for v in row))
        out[idx] = [v - lse for v in row]
    return out


def cross_entropy(logits, labels):
    logits = np.asarray(logits, dtype=np.float64)
    total = []
    for b, lab in enumerate(labels):
        row = logits[b]
        m = max(row)
        lse = m + math.log(math.fsum(math.exp(v - m) for v in row))
        total.append(lse - row[lab])
    return math.fsum(total) / len(total)


def mse(p, t):
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    t = np.asarray(t, dtype=np.float64).reshape(-1)
    return math.fsum((a - b) ** 2 for a, b in zip(p, t)) / p.size
