"""Slow, obviously correct oracles for activations, dropout, normalisation,
initialisers, embedding and dense — written from API.md, never from the kernels.

Activations are evaluated in 60-digit mpmath and rounded once to float64, so they are
correctly rounded references for any float64 implementation.
"""

import itertools
import math

import mpmath
import numpy as np

mpmath.mp.dps = 60

# ----------------------------------------------------------------------- activations
def _mp_sigmoid(v):
    return 1 / (1 + mpmath.exp(-v))


def _mp_activation(name, x):
    v = mpmath.mpf(float(x))
    if name == "IDENTITY":
        r = v
    elif name == "RELU":
        r = v if v > 0 else mpmath.mpf(0)
    elif name == "LEAKY_RELU":
        r = v if v > 0 else mpmath.mpf("0.01") * v
    elif name in ("GELU", "GELU_TANH"):
        r = _mp_activation_t(name, v)
    elif name == "SILU":
        r = v * _mp_sigmoid(v)
    elif name == "SIGMOID":
        r = _mp_sigmoid(v)
    elif name == "TANH":
        r = mpmath.tanh(v)
    elif name == "SOFTPLUS":
        r = mpmath.log(1 + mpmath.exp(v))
    elif name == "ELU":
        r = v if v > 0 else mpmath.expm1(v)  # exp(v) - 1 without cancellation
    else:
        raise ValueError(name)
    return r


def _mp_derivative(name, x):
    v = mpmath.mpf(float(x))
    if name == "IDENTITY":
        return mpmath.mpf(1)
    if name == "RELU":
        return mpmath.mpf(1) if v > 0 else mpmath.mpf(0)
    if name == "LEAKY_RELU":
        return mpmath.mpf(1) if v > 0 else mpmath.mpf("0.01")
    if name == "ELU":
        return mpmath.mpf(1) if v > 0 else mpmath.exp(v)
    # textbook derivatives, with 1 - sigmoid(v) written as 1 / (1 + exp(v)) and
    # 1 - tanh(u)**2 as 1 / cosh(u)**2 (exact identities, no cancellation)
    if name == "GELU":
        z = -v / mpmath.sqrt(2)
        e = mpmath.mpf(0) if z > 1000 else mpmath.mpf(2) if z < -1000 else mpmath.erfc(z)
        return e / 2 + v * mpmath.exp(-v * v / 2) / mpmath.sqrt(2 * mpmath.pi)
    if name == "GELU_TANH":
        c = mpmath.sqrt(2 / mpmath.pi)
        a = mpmath.mpf("0.044715")
        u = c * (v + a * v ** 3)
        return (1 / (1 + mpmath.exp(-2 * u))
                + v / 2 / mpmath.cosh(u) ** 2 * c * (1 + 3 * a * v * v))
    if name == "SILU":
        return _mp_sigmoid(v) * (1 + v / (1 + mpmath.exp(v)))
    if name == "SIGMOID":
        return _mp_sigmoid(v) / (1 + mpmath.exp(v))
    if name == "TANH":
        return 1 / mpmath.cosh(v) ** 2
    if name == "SOFTPLUS":
        return _mp_sigmoid(v)
    raise ValueError(name)


def _mp_activation_t(name, v):
    # 1 + erf(z) == erfc(-z) and 1 + tanh(u) == 2 / (1 + exp(-2u)) are exact identities;
    # they spare mpmath the catastrophic cancellation of 1 + (-1 + 1e-200) in the tails.
    if name == "GELU":
        z = -v / mpmath.sqrt(2)
        # mpmath's erfc cannot take |z| ~ 1e199; beyond |z| = 1000 it is 0 or 2 to far
        # more than float64 precision (erfc(1000) < 1e-434000).
        e = mpmath.mpf(0) if z > 1000 else mpmath.mpf(2) if z < -1000 else mpmath.erfc(z)
        return v / 2 * e
    if name == "GELU_TANH":
        u = mpmath.sqrt(2 / mpmath.pi) * (v + mpmath.mpf("0.044715") * v ** 3)
        return v / 2 * (2 / (1 + mpmath.exp(-2 * u)))
    if name == "SILU":
        return v * _mp_sigmoid(v)
    if name == "SIGMOID":
        return _mp_sigmoid(v)
    if name == "TANH":
        return mpmath.tanh(v)
    if name == "SOFTPLUS":
        return mpmath.log(1 + mpmath.exp(v))
    raise ValueError(name)


def activation(name, x):
    """f(x) elementwise, correctly rounded."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(x.shape)
    for idx in np.ndindex(x.shape):
        out[idx] = float(_mp_activation(name, x[idx]))
    return out


def activation_derivative(name, x):
    """f'(x) elementwise (left derivative at kinks), correctly rounded."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(x.shape)
    for idx in np.ndindex(x.shape):
        out[idx] = float(_mp_derivative(name, x[idx]))
    return out


# ----------------------------------------------------------------------- dense
def dense(x, w, bias):
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    out_f, in_f = w.shape
    lead = x.shape[:-1]
    out = np.zeros(lead + (out_f,))
    for idx in np.ndindex(lead):
        for o in range(out_f):
            s = math.fsum(float(x[idx + (i,)]) * float(w[o, i]) for i in range(in_f))
            out[idx + (o,)] = s + (0.0 if bias is None else float(bias[o]))
    return out
