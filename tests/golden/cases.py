"""Golden cases: every public function on fixed inputs, plus two short training runs.

Each case is a function returning a list of arrays; :func:`digest` hashes them (dtype,
shape and bytes).  ``tests/golden/digests.json`` holds the digests; ``tests/test_golden.py``
recomputes them on whatever CPU / numba target it runs on.  A digest that changes is a
behaviour change and must be explained in the commit that updates the file
(``python -m tests.golden.update``).

Inputs come from numpy's Philox stream with fixed keys (the library's one documented
source of bits that is not its own arithmetic), so they are the same everywhere.
"""

import hashlib

import numpy as np

from hmath_dl import RNG, optim
from hmath_dl import autodiff as ad
from hmath_dl import layers as L
from hmath_dl import precision as P
from hmath_dl.activations import Activation, activate

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def normal(shape, key, scale=1.0):
    return scale * np.random.Generator(np.random.Philox(key=key)).standard_normal(shape)


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _grads(fn, *values):
    vs = [ad.variable(v) for v in values]
    return ad.gradients(fn(*vs), vs)


# =========================================================================== precision
@case
def precision_quantization():
    x = normal((7, 33), 1, 3.0)
    out = []
    for mode in P.Quantization:
        for axis in (None, 0, 1):
            try:
                q = P.quantize(mode, axis, x)
            except Exception:           # a mode/axis pair the contract rejects
                continue
            out += [P.quantized_values(q), P.quantization_scales(q),
                    P.quantization_zero_points(q), P.dequantize(q)]
    qa = P.quantize(P.Quantization.SYMMETRIC, 0, normal((9, 64), 2))
    qb = P.quantize(P.Quantization.SYMMETRIC, 1, normal((64, 5), 3))
    out.append(P.int8_gemm(qa, qb))
    return out


@case
def precision_half():
    x = normal((300,), 4, 1e3)
    out = []
    for prec in P.Precision:
        out += [P.round_to_bits(prec, x), P.round_to_precision(prec, x),
                P.bits_to_float(prec, P.round_to_bits(prec, x)),
                P.reduced_gemm(prec, normal((13, 40), 5), normal((40, 11), 6))]
    return out


@case
def precision_mixed():
    s = P.initial_loss_scaler(1024.0, 3)
    grads = [normal((4, 5), 7), normal((6,), 8)]
    out = [np.asarray(P.scale_loss(s, 2.5))]
    ok, unscaled = P.unscale_gradients(s, grads)
    out += [np.asarray(ok)] + list(unscaled)
    for finite in (True, True, True, False, True):
        s = P.update_loss_scaler(finite, s)
        out.append(np.asarray([float(s.loss_scale), float(s.finite_steps)]))
    out.append(np.asarray(P.gradient_norm(grads)))
    out += list(P.clip_gradients(0.5, grads))
    return out


# =========================================================================== activations
@case
def activations_all():
    x = np.concatenate([normal((2000,), 9, 4.0), [0.0, -0.0, 1e-310, -1e-310, 700.0, -745.0]])
    out = [activate(a, x) for a in Activation]
    out += [activate(Activation.LEAKY_RELU, x, negative_slope=0.2),
            activate(Activation.ELU, x, alpha=0.5),
            activate(Activation.SOFTPLUS, x, beta=3.0)]
    return out


# =========================================================================== layers
@case
def layers_dropout_norms():
    x = normal((4, 6, 5, 3), 10)
    out = list(L.dropout(L.Mode.TRAINING, 0.3, RNG(1), x)[:2])
    out += list(L.spatial_dropout(L.Mode.TRAINING, 0.3, RNG(2), x)[:2])
    y, st = L.batch_norm(L.Mode.TRAINING, 0.1, 1e-5, normal((6,), 11), normal((6,), 12),
                         L.BatchNormState.initial(6), x)
    out += [y, st.running_mean, st.running_variance]
    out += [L.layer_norm(2, 1e-5, x), L.rms_norm(1, 1e-6, x), L.instance_norm(1e-5, x),
            L.group_norm(3, 1e-5, x),
            L.layer_norm(2, 1e-5, x, weight=normal((5, 3), 13), bias=normal((5, 3), 14)),
            L.rms_norm(1, 1e-6, x, weight=normal((3,), 15)),
            L.group_norm(2, 1e-5, x, weight=normal((6,), 16), bias=normal((6,), 17)),
            L.instance_norm(1e-5, x, weight=normal((6,), 18), bias=normal((6,), 19)),
            L.weight_norm(0, np.abs(normal((6,), 20)), normal((6, 4, 3), 21))]
    return out


@case
def layers_initializers():
    out = []
    for init in (L.XavierUniform(), L.XavierNormal(), L.KaimingUniform(), L.KaimingNormal(),
                 L.Orthogonal(1.3), L.TruncatedNormal(0.1, 0.5, 1.5),
                 L.TruncatedNormal(0.0, 1.0, 3.0)):
        out.append(L.initialize_weights(init, 12, 9, (9, 4, 3), RNG(3))[0])
    return out


@case
def layers_dense_embedding():
    x, w, b = normal((17, 31), 22), normal((13, 31), 23), normal((13,), 24)
    table = normal((50, 8), 25)
    idx = np.random.Generator(np.random.Philox(key=26)).integers(0, 50, (4, 6))
    return [L.dense(x, w, b), L.dense(normal((2, 3, 31), 27), w, None), L.embedding(table, idx)]


@case
def layers_convolution():
    out = []
    x2 = normal((2, 4, 11, 9), 28)
    for opts, w in ((L.ConvOptions(1, 1, 1), normal((6, 4, 3, 3), 29)),
                    (L.ConvOptions(2, (1, 2), (1, 2), 2), normal((6, 2, 3, 2), 30)),
                    (L.ConvOptions(1, "same", 2), normal((5, 4, 4, 3), 31)),
                    (L.ConvOptions(2, 0, 1), normal((8, 4, 1, 1), 32))):
        out.append(L.convolution(opts, x2, w, normal((w.shape[0],), 33)))
    out.append(L.convolution(L.ConvOptions(1, 2, 1), normal((2, 3, 40), 34), normal((4, 3, 5), 35), None))
    out.append(L.convolution(L.ConvOptions(1, 1, 1), normal((1, 2, 5, 6, 4), 36),
                             normal((3, 2, 3, 3, 3), 37), None))
    out.append(L.transposed_convolution(1, L.ConvOptions(2, 1, 1), x2, normal((4, 3, 4, 4), 38),
                                        normal((3,), 39)))
    out.append(L.depthwise_convolution(L.ConvOptions(1, 1, 1), x2, normal((8, 1, 3, 3), 40), None))
    return out


@case
def layers_pooling():
    x = normal((2, 3, 13, 11), 41)
    out = []
    for mode in L.PoolMode:
        out += [L.pooling(mode, 3, 2, 1, x), L.adaptive_pooling(mode, (4, 5), x),
                L.global_pooling(mode, x),
                L.pooling(mode, (3, 2), 2, 1, x, ceil_mode=True)]
    out += [L.pooling(L.PoolMode.AVERAGE, 3, 2, 1, x, count_include_pad=True),
            L.pooling(L.PoolMode.AVERAGE, 3, 2, 1, x, divisor_override=7),
            L.pooling(L.PoolMode.MAX, 3, 1, 1, x, dilation=2)]
    vals, idx = L.max_pooling_with_indices(3, 2, 1, x)
    out += [vals, idx, L.max_unpooling(vals, idx, (13, 11))]
    return out


@case
def layers_attention_positions():
    q, k, v = normal((2, 4, 6, 8), 42), normal((2, 2, 7, 8), 43), normal((2, 2, 7, 3), 44)
    out = list(L.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True))
    qq, kk, vv = normal((3, 5, 8), 45), normal((3, 7, 8), 46), normal((3, 7, 4), 47)
    out += list(L.scaled_dot_product_attention(qq, kk, vv, L.causal_mask(5, 7, 2),
                                               L.alibi_bias(0.5, 5, 7, 2)))
    out += list(L.scaled_dot_product_attention(qq, kk, vv, scale=0.3))
    out += [L.multihead_attention(2, qq, kk, vv), L.multihead_attention(4, qq, kk, vv, is_causal=True),
            L.causal_mask(4, 6, 1).astype(np.uint8), L.rotary_embedding(10000.0, 5, qq),
            L.sinusoidal_encoding(9, 7, 3), L.alibi_bias(0.25, 4, 6, 1)]
    return out


@case
def layers_kv_cache_feed_forward():
    c = L.empty_cache(10, 4, 3)
    c = L.append_cache(c, normal((3, 4), 48), normal((3, 3), 49))
    c = L.append_cache(c, normal((2, 4), 50), normal((2, 3), 51))
    keys, values = L.cache_values(c)
    ff = L.transformer_feed_forward(Activation.GELU, normal((16, 8), 52), normal((16,), 53),
                                    normal((5, 16), 54), normal((5,), 55), normal((3, 8), 56))
    return [keys, values, ff]


@case
def pytorch_issue_orthogonal_dense():
    """pytorch/pytorch 155423/155552: an orthogonally initialised Linear(100, 100) ->
    Linear(100, 1) gives different bits with and without AVX-512 in torch; here the same
    bits on every target."""
    w1, rng = L.initialize_weights(L.Orthogonal(1.0), 100, 100, (100, 100), RNG(12))
    w2, rng = L.initialize_weights(L.Orthogonal(1.0), 100, 1, (1, 100), rng)
    x = normal((64, 100), 90)
    return [w1, w2, L.dense(L.dense(x, w1, np.zeros(100)), w2, np.zeros(1))]


# =========================================================================== _ad twins
@case
def ad_layers_gradients():
    x, w, b = normal((3, 7), 57), normal((4, 7), 58), normal((4,), 59)
    out = _grads(lambda x, w, b: ad.sum(L.dense_ad(x, w, b) ** 2), x, w, b)
    xc, wc = normal((2, 4, 8, 7), 60), normal((6, 2, 3, 3), 61)
    opts = L.ConvOptions(1, "same", 1, 2)
    out += _grads(lambda x, w: ad.sum(L.convolution_ad(opts, x, w, None) ** 2), xc, wc)
    out += _grads(lambda x, w: ad.sum(L.transposed_convolution_ad(1, L.ConvOptions(2, 1, 1), x, w, None) ** 2),
                  xc, normal((4, 3, 3, 3), 62))
    out += _grads(lambda x, w: ad.sum(L.depthwise_convolution_ad(L.ConvOptions(1, 1, 1), x, w, None) ** 2),
                  xc, normal((8, 1, 3, 3), 63))
    out += _grads(lambda x: ad.sum(L.pooling_ad(L.PoolMode.MAX, 3, 2, 1, x) ** 2), xc)
    out += _grads(lambda x: ad.sum(L.adaptive_pooling_ad(L.PoolMode.AVERAGE, (3, 2), x) ** 2), xc)
    out += _grads(lambda x: ad.sum(L.global_pooling_ad(L.PoolMode.MAX, x) ** 2), xc)
    out += _grads(lambda x, g: ad.sum(L.layer_norm_ad(2, 1e-5, x, weight=g) ** 3), xc, normal((8, 7), 64))
    out += _grads(lambda x: ad.sum(L.rms_norm_ad(1, 1e-6, x) ** 3), xc)
    out += _grads(lambda x: ad.sum(L.group_norm_ad(2, 1e-5, x) ** 3), xc)
    out += _grads(lambda x: ad.sum(L.instance_norm_ad(1e-5, x) ** 3), xc)
    out += _grads(lambda m, w: ad.sum(L.weight_norm_ad(0, m, w) ** 3), np.abs(normal((4,), 65)) + 0.5,
                  normal((4, 3), 66))
    st = L.BatchNormState.initial(4)
    out += _grads(lambda x, g, b: ad.sum(L.batch_norm_ad(L.Mode.TRAINING, 0.1, 1e-5, g, b, st, x)[0] ** 3),
                  xc, normal((4,), 67), normal((4,), 68))
    out += _grads(lambda t: ad.sum(L.embedding_ad(t, [[1, 2], [2, 0]]) ** 2), normal((3, 5), 69))
    out += _grads(lambda x: ad.sum(L.dropout_ad(L.Mode.TRAINING, 0.2, RNG(4), x)[0] ** 2), xc)
    out += _grads(lambda x: ad.sum(L.spatial_dropout_ad(L.Mode.TRAINING, 0.2, RNG(5), x)[0] ** 2), xc)
    q, k, v = normal((2, 4, 5, 6), 70), normal((2, 2, 6, 6), 71), normal((2, 2, 6, 3), 72)
    out += _grads(lambda q, k, v: ad.sum(L.scaled_dot_product_attention_ad(
        q, k, v, is_causal=True, enable_gqa=True) ** 2), q, k, v)
    qq, kk, vv = normal((3, 5, 8), 73), normal((3, 6, 8), 74), normal((3, 6, 4), 75)
    out += _grads(lambda q, k, v: ad.sum(L.multihead_attention_ad(2, q, k, v, scale=0.4) ** 2), qq, kk, vv)
    out += _grads(lambda x: ad.sum(L.rotary_embedding_ad(100.0, 3, x) ** 3), qq)
    out += _grads(lambda w1, x: ad.sum(L.transformer_feed_forward_ad(
        Activation.SILU, w1, None, normal((3, 9), 76), None, x) ** 2), normal((9, 8), 77), qq)
    return out


@case
def autodiff_ops():
    x, y = normal((5, 6), 78), normal((5, 6), 79)
    labels = np.array([0, 5, 2, 3, 1])
    out = _grads(lambda a, b: ad.sum(ad.exp(a * 0.3) + ad.log(b * b + 1.0) + ad.sqrt(b * b + 2.0)
                                     + ad.tanh(a) / (b * b + 1.0)), x, y)
    out += _grads(lambda a: ad.sum(ad.activate(Activation.GELU_TANH, a) ** 2), x)
    out += _grads(lambda a: ad.sum(ad.mean(ad.softmax(a, axis=0) ** 2, axis=1, keepdims=True) * 3.0), x)
    out += _grads(lambda a: ad.sum(ad.log_softmax(ad.transpose(a), axis=-1)), x)
    out += _grads(lambda a: ad.cross_entropy(a, labels), x)
    out += _grads(lambda a, b: ad.mse(ad.reshape(a, (30,)), ad.reshape(b, (30,))), x, y)
    out += _grads(lambda a, b: ad.sum((a @ ad.transpose(b)) ** 2), x, y)
    return out


# =========================================================================== training
@case
def training_small_cnn():
    """20 AdamW steps of conv-bn-relu-pool x2 + dense on a fixed synthetic batch."""
    rng = RNG(7)
    shapes = {"c1": (8, 1, 3, 3), "c2": (16, 8, 3, 3), "fc": (4, 16 * 2 * 2)}
    params = {}
    for name, shp in shapes.items():
        fan_in = int(np.prod(shp[1:]))
        params[name], rng = L.initialize_weights(L.KaimingNormal(), fan_in, shp[0], shp, rng)
    params["g1"], params["b1"] = np.ones(8), np.zeros(8)
    params["g2"], params["b2"] = np.ones(16), np.zeros(16)
    params["fcb"] = np.zeros(4)
    names = sorted(params)
    x = normal((16, 1, 8, 8), 80)
    labels = np.arange(16) % 4
    state = optim.adamw_init([params[n] for n in names])
    conv = L.ConvOptions(1, "same", 1)
    bn1, bn2 = L.BatchNormState.initial(8), L.BatchNormState.initial(16)
    for _ in range(20):
        p = {n: ad.variable(params[n]) for n in names}
        h, bn1 = L.batch_norm_ad(L.Mode.TRAINING, 0.1, 1e-5, p["g1"], p["b1"], bn1,
                                 L.convolution_ad(conv, x, p["c1"], None))
        h = L.pooling_ad(L.PoolMode.MAX, 2, 2, 0, ad.activate(Activation.RELU, h))
        h, bn2 = L.batch_norm_ad(L.Mode.TRAINING, 0.1, 1e-5, p["g2"], p["b2"], bn2,
                                 L.convolution_ad(conv, h, p["c2"], None))
        h = L.pooling_ad(L.PoolMode.AVERAGE, 2, 2, 0, ad.activate(Activation.RELU, h))
        logits = L.dense_ad(ad.reshape(h, (16, 64)), p["fc"], p["fcb"])
        loss = ad.cross_entropy(logits, labels)
        grads = ad.gradients(loss, [p[n] for n in names])
        new, state = optim.adamw_step(state, [params[n] for n in names], grads, lr=1e-2,
                                      weight_decay=0.01)
        params = dict(zip(names, new))
    return [params[n] for n in names] + [bn1.running_mean, bn2.running_variance]


@case
def training_char_transformer():
    """20 AdamW steps of the example's grouped-query transformer (d 16, 4 query heads,
    2 kv heads, 1 layer) on a fixed synthetic token stream."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "char_transformer.py")
    spec = importlib.util.spec_from_file_location("_golden_char_transformer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    vocab, d, heads, kv_heads, layers = 11, 16, 4, 2, 1
    params, rng = mod.init_params(vocab, d, layers, RNG(9), heads, kv_heads)
    names = sorted(params)
    state = optim.adamw_init([params[n] for n in names])
    stream = np.random.Generator(np.random.Philox(key=81)).integers(0, vocab, 2000)
    for step in range(20):
        starts = (np.arange(4) * 97 + step * 13) % (len(stream) - 17)
        xb = np.stack([stream[s:s + 16] for s in starts])
        yb = np.stack([stream[s + 1:s + 17] for s in starts])
        variables = {n: ad.variable(params[n]) for n in names}
        loss = mod.loss_ad(variables, xb, yb, heads, layers)
        grads = P.clip_gradients(1.0, ad.gradients(loss, [variables[n] for n in names]))
        new, state = optim.adamw_step(state, [params[n] for n in names], grads, lr=3e-3,
                                      weight_decay=0.01)
        params = dict(zip(names, new))
    return [params[n] for n in names]
