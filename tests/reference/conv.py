"""Slow, obviously correct oracles for convolution and pooling, written from API.md §5
(plain loops over every output and every term; never derived from the kernels).

The convolution oracles return ``(y, mag)`` where ``mag`` holds, per output, the sum of
the absolute values of its terms (bias included): any summation order is within
``n * eps * mag`` of the exact value, so tests compare with a tolerance relative to
``mag`` instead of an arbitrary one.
"""

import itertools
import math
from fractions import Fraction

import numpy as np


def _positions(shape):
    return itertools.product(*(range(n) for n in shape))


def conv_reference(x, w, bias, stride, padding, dilation, groups):
    """y[n, co, o] = bias[co] + sum_{ci', k} w[co, ci', k] * x[n, g*Cg + ci', o*s - p + k*d]
    (terms whose input position falls in the zero padding are zero)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    N, Cin = x.shape[:2]
    S = x.shape[2:]
    Cout, Cg = w.shape[:2]
    K = w.shape[2:]
    r = len(S)
    O = tuple((S[a] + 2 * padding[a] - dilation[a] * (K[a] - 1) - 1) // stride[a] + 1 for a in range(r))
    Cog = Cout // groups
    y = np.zeros((N, Cout) + O)
    mag = np.zeros((N, Cout) + O)
    for n in range(N):
        for co in range(Cout):
            g = co // Cog
            for o in _positions(O):
                total = 0.0 if bias is None else float(bias[co])
                m = 0.0 if bias is None else abs(float(bias[co]))
                for cl in range(Cg):
                    ci = g * Cg + cl
                    for k in _positions(K):
                        pos = tuple(o[a] * stride[a] - padding[a] + k[a] * dilation[a] for a in range(r))
                        if all(0 <= pos[a] < S[a] for a in range(r)):
                            term = w[(co, cl) + k] * x[(n, ci) + pos]
                            total += term
                            m += abs(term)
                y[(n, co) + o] = total
                mag[(n, co) + o] = m
    return y, mag


def conv_transpose_reference(x, w, bias, stride, padding, dilation, output_padding, groups):
    """y[n, co, o] = bias[co] + sum over ci in group(co), k, i with i*s + k*d = o + p of
    w[ci, co mod Cog, k] * x[n, ci, i];  O = (S-1)s - 2p + d(K-1) + op + 1."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    N, Cin = x.shape[:2]
    S = x.shape[2:]
    Cog = w.shape[1]
    K = w.shape[2:]
    r = len(S)
    Cout = Cog * groups
    Cig = Cin // groups
    O = tuple((S[a] - 1) * stride[a] - 2 * padding[a] + dilation[a] * (K[a] - 1)
              + output_padding[a] + 1 for a in range(r))
    y = np.zeros((N, Cout) + O)
    mag = np.zeros((N, Cout) + O)
    if bias is not None:
        for co in range(Cout):
            y[:, co] = bias[co]
            mag[:, co] = abs(bias[co])
    for n in range(N):
        for ci in range(Cin):
            g = ci // Cig
            for i in _positions(S):
                for k in _positions(K):
                    o = tuple(i[a] * stride[a] + k[a] * dilation[a] - padding[a] for a in range(r))
                    if not all(0 <= o[a] < O[a] for a in range(r)):
                        continue
                    for cl in range(Cog):
                        term = w[(ci, cl) + k] * x[(n, ci) + i]
                        y[(n, g * Cog + cl) + o] += term
                        mag[(n, g * Cog + cl) + o] += abs(term)
    return y, mag


def _reduce(mode_is_max, values):
    if mode_is_max:
        return max(values)
    # exact mean, rounded once
    return float(sum(Fraction(v) for v in values) / len(values))


def pool_reference(is_max, x, window, stride, padding):
    """Output o reduces the input positions [o*s - p, o*s - p + k) that lie inside the
    input (padding excluded); O = floor((S + 2p - k)/s) + 1."""
    x = np.asarray(x, dtype=np.float64)
    N, C = x.shape[:2]
    S = x.shape[2:]
    r = len(S)
    O = tuple((S[a] + 2 * padding[a] - window[a]) // stride[a] + 1 for a in range(r))
    y = np.zeros((N, C) + O)
    for n in range(N):
        for c in range(C):
            for o in _positions(O):
                vals = []
                for k in _positions(window):
                    pos = tuple(o[a] * stride[a] - padding[a] + k[a] for a in range(r))
                    if all(0 <= pos[a] < S[a] for a in range(r)):
                        vals.append(float(x[(n, c) + pos]))
                y[(n, c) + o] = _reduce(is_max, vals)
    return y


def max_pool_argmax_reference(x, window, stride, padding):
    """Flat spatial index (row-major over the input's spatial axes) of the first maximum
    of each window, scanning the window in row-major order."""
    x = np.asarray(x, dtype=np.float64)
    N, C = x.shape[:2]
    S = x.shape[2:]
    r = len(S)
    O = tuple((S[a] + 2 * padding[a] - window[a]) // stride[a] + 1 for a in range(r))
    idx = np.zeros((N, C) + O, dtype=np.int64)
    for n in range(N):
        for c in range(C):
            for o in _positions(O):
                best = None
                for k in _positions(window):
                    pos = tuple(o[a] * stride[a] - padding[a] + k[a] for a in range(r))
                    if all(0 <= pos[a] < S[a] for a in range(r)):
                        v = x[(n, c) + pos]
                        if best is None or v > best[0]:
                            best = (v, int(np.ravel_multi_index(pos, S)))
                idx[(n, c) + o] = best[1]
    return idx


def adaptive_pool_reference(is_max, x, output_size):
    """Bin i of an axis of length S covers [floor(i*S/out), ceil((i+1)*S/out))."""
    x = np.asarray(x, dtype=np.float64)
    N, C = x.shape[:2]
    S = x.shape[2:]
    r = len(S)
    bins = [[(math.floor(Fraction(i * S[a], output_size[a])),
              math.ceil(Fraction((i + 1) * S[a], output_size[a])))
             for i in range(output_size[a])] for a in range(r)]
    y = np.zeros((N, C) + tuple(output_size))
    for n in range(N):
        for c in range(C):
            for o in _positions(output_size):
                ranges = [range(*bins[a][o[a]]) for a in range(r)]
                vals = [float(x[(n, c) + pos]) for pos in itertools.product(*ranges)]
                y[(n, c) + o] = _reduce(is_max, vals)
    return y


def global_pool_reference(is_max, x):
    x = np.asarray(x, dtype=np.float64)
    N, C = x.shape[:2]
    y = np.zeros((N, C))
    for n in range(N):
        for c in range(C):
            y[n, c] = _reduce(is_max, [float(v) for v in x[n, c].reshape(-1)])
    return y
