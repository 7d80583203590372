"""Slow, obviously correct oracles for activations, dropout, normalisation,
initialisers, embedding and dense — written from API.md, never from the kernels.

Activations are evaluated in 60-digit mpmath and rounded once to float64, so they are
correctly rounded references for any float64 implementation.
"""

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


# ----------------------------------------------------------------------- dropout
def dropout_mask(p, uniforms):
    """API.md + documented draw rule: kept iff u >= p; mask 1/(1-p) or 0 (0 when p == 1)."""
    u = np.asarray(uniforms, dtype=np.float64)
    out = np.empty(u.shape)
    for idx in np.ndindex(u.shape):
        if p == 1.0:
            out[idx] = 0.0
        else:
            out[idx] = 1.0 / (1.0 - p) if u[idx] >= p else 0.0
    return out


# ----------------------------------------------------------------------- normalisation
def _mean(values):
    return math.fsum(values) / len(values)


def _normalize_group(values, eps, center=True):
    """[(x - mean) / sqrt(var + eps)] with population variance (fsum for accuracy)."""
    vals = [float(v) for v in values]
    m = _mean(vals) if center else 0.0
    var = math.fsum((v - m) ** 2 for v in vals) / len(vals)
    d = math.sqrt(var + eps)
    return [(v - m) / d for v in vals]


def layer_norm(axes, eps, x, center=True):
    x = np.asarray(x, dtype=np.float64)
    lead = x.shape[:x.ndim - axes]
    out = np.empty(x.shape)
    for idx in np.ndindex(lead):
        block = x[idx]
        flat = [block[j] for j in np.ndindex(block.shape)]
        normed = _normalize_group(flat, eps, center)
        for k, j in enumerate(np.ndindex(block.shape)):
            out[idx + j] = normed[k]
    return out


def rms_norm(axes, eps, x):
    x = np.asarray(x, dtype=np.float64)
    lead = x.shape[:x.ndim - axes]
    out = np.empty(x.shape)
    for idx in np.ndindex(lead):
        block = x[idx]
        positions = list(np.ndindex(block.shape))
        ms = math.fsum(float(block[j]) ** 2 for j in positions) / len(positions)
        d = math.sqrt(ms + eps)
        for j in positions:
            out[idx + j] = float(block[j]) / d
    return out


def instance_norm(eps, x):
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(x.shape)
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            block = x[n, c]
            positions = list(np.ndindex(block.shape))
            normed = _normalize_group([block[j] for j in positions], eps)
            for k, j in enumerate(positions):
                out[(n, c) + j] = normed[k]
    return out


def group_norm(groups, eps, x):
    x = np.asarray(x, dtype=np.float64)
    C = x.shape[1]
    per = C // groups
    out = np.empty(x.shape)
    spatial = list(np.ndindex(x.shape[2:]))
    for n in range(x.shape[0]):
        for g in range(groups):
            positions = [(n, c) + s for c in range(g * per, (g + 1) * per) for s in spatial]
            normed = _normalize_group([x[p] for p in positions], eps)
            for k, p in enumerate(positions):
                out[p] = normed[k]
    return out


def batch_norm_train(momentum, eps, gamma, beta, running_mean, running_var, x):
    """(y, new_running_mean, new_running_var) from API.md."""
    x = np.asarray(x, dtype=np.float64)
    C = x.shape[1]
    out = np.empty(x.shape)
    new_mean = np.empty(C)
    new_var = np.empty(C)
    for c in range(C):
        positions = [(n, c) + s for n in range(x.shape[0]) for s in np.ndindex(x.shape[2:])]
        vals = [float(x[p]) for p in positions]
        m = _mean(vals)
        pop = math.fsum((v - m) ** 2 for v in vals) / len(vals)
        unbiased = pop * len(vals) / (len(vals) - 1) if len(vals) > 1 else pop
        d = math.sqrt(pop + eps)
        for p, v in zip(positions, vals):
            out[p] = gamma[c] * (v - m) / d + beta[c]
        new_mean[c] = (1 - momentum) * running_mean[c] + momentum * m
        new_var[c] = (1 - momentum) * running_var[c] + momentum * unbiased
    return out, new_mean, new_var


def batch_norm_infer(eps, gamma, beta, running_mean, running_var, x):
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(x.shape)
    for p in np.ndindex(x.shape):
        c = p[1]
        out[p] = gamma[c] * (x[p] - running_mean[c]) / math.sqrt(running_var[c] + eps) + beta[c]
    return out


def weight_norm(axis, magnitudes, w):
    """Exact norms via Fraction-free scaling: norm = sqrt(fsum(v*v)) on values scaled
    by a power of two (math.ldexp) so squares neither overflow nor underflow."""
    w = np.asarray(w, dtype=np.float64)
    axis = axis % w.ndim
    out = np.empty(w.shape)
    for i in range(w.shape[axis]):
        sl = np.take(w, i, axis=axis)
        vals = [float(sl[j]) for j in np.ndindex(sl.shape)]
        big = max(abs(v) for v in vals)
        e = math.frexp(big)[1] if big else 0
        norm = math.ldexp(math.sqrt(math.fsum(math.ldexp(v, -e) ** 2 for v in vals)), e)
        for j in np.ndindex(sl.shape):
            full = j[:axis] + (i,) + j[axis:]
            out[full] = magnitudes[i] * w[full] / norm
    return out


# ----------------------------------------------------------------------- embedding
def embedding(weights, indices):
    weights = np.asarray(weights, dtype=np.float64)
    indices = np.asarray(indices)
    out = np.empty(indices.shape + (weights.shape[1],))
    for idx in np.ndindex(indices.shape):
        out[idx] = weights[int(indices[idx])]
    return out


# ----------------------------------------------------------------------- initialisers
def init_bound_or_std(name, fan_in, fan_out):
    """API.md formulas: ('uniform', a) or ('normal', std)."""
    if name == "XavierUniform":
        return "uniform", math.sqrt(6.0 / (fan_in + fan_out))
    if name == "XavierNormal":
        return "normal", math.sqrt(2.0 / (fan_in + fan_out))
    if name == "KaimingUniform":
        return "uniform", math.sqrt(6.0 / fan_in)
    if name == "KaimingNormal":
        return "normal", math.sqrt(2.0 / fan_in)
    raise ValueError(name)


def truncated_normal_moments(mean, sigma, cutoff):
    """Mean and variance of N(mean, sigma^2) conditioned on |x - mean| <= cutoff sigma."""
    c = mpmath.mpf(cutoff)
    phi = mpmath.npdf(c)
    Z = mpmath.erf(c / mpmath.sqrt(2))
    var = 1 - 2 * c * phi / Z
    return float(mean), float(sigma ** 2 * var)
