"""The one list of hmath_dl's public functions, each with a strategy for valid arguments.

``SPECS`` maps ``"module:function"`` to a :class:`Spec`: the parameter names (in contract
order) and a hypothesis strategy that draws a tuple of VALID arguments.  The reliability
tests (tests/test_fuzz.py) derive invalid arguments from these by replacing one argument
with a hostile value, check purity, determinism across thread counts and concurrency.
``tests/test_fuzz.py::test_every_public_function_has_a_spec`` fails when a public function
of the package has no entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Tuple

import numpy as np
from hypothesis import strategies as st

from hmath_dl.rng import RNG


@dataclass(frozen=True)
class Spec:
    module: str
    name: str
    params: Tuple[str, ...]
    valid: Callable  # () -> hypothesis strategy of argument tuples
    allowed: Tuple[type, ...] = ()  # documented extra exceptions (check_gradients: AssertionError)

    @property
    def key(self) -> str:
        return f"{self.module}:{self.name}"

    def function(self):
        return getattr(importlib.import_module(self.module), self.name)


SPECS = {}


def spec(module, params, allowed=()):
    """Register the decorated strategy factory for ``module.<factory name>``."""

    def wrap(factory):
        s = Spec(module, factory.__name__.rstrip("_"), tuple(params), factory, tuple(allowed))
        SPECS[s.key] = s
        return factory

    return wrap


# ----------------------------------------------------------------------------- helpers
def seeds():
    return st.integers(0, 2**32 - 1)


def gen(draw):
    return np.random.default_rng(draw(seeds()))


def small_shape(draw, min_dims=1, max_dims=3, min_side=1, max_side=4):
    nd = draw(st.integers(min_dims, max_dims))
    return tuple(draw(st.integers(min_side, max_side)) for _ in range(nd))


def normal(g, shape, scale=1.0):
    return g.standard_normal(shape) * scale


def enum_of(module, name):
    return st.sampled_from(list(getattr(importlib.import_module(module), name)))


def mod(name):
    return importlib.import_module(name)


P = "hmath_dl.precision"
A = "hmath_dl.activations"
L = "hmath_dl.layers"
D = "hmath_dl.autodiff"


# ----------------------------------------------------------------------------- precision
@st.composite
def _quantized(draw, shape=None, axes=None):
    g = gen(draw)
    prec = mod(P)
    shape = shape or small_shape(draw)
    if axes is None:
        axes = [None] + list(range(-len(shape), len(shape)))
    axis = draw(st.sampled_from(axes))
    mode = draw(st.sampled_from(list(prec.Quantization)))
    return prec.quantize(mode, axis, normal(g, shape, draw(st.sampled_from([1e-3, 1.0, 50.0]))))


@spec(P, ["mode", "axis", "x"])
def quantize():
    @st.composite
    def s(draw):
        g = gen(draw)
        shape = small_shape(draw)
        axis = draw(st.sampled_from([None] + list(range(-len(shape), len(shape)))))
        return (draw(enum_of(P, "Quantization")), axis, normal(g, shape, 3.0))
    return s()


@spec(P, ["q"])
def dequantize():
    return _quantized().map(lambda q: (q,))


@spec(P, ["q"])
def quantized_values():
    return _quantized().map(lambda q: (q,))


@spec(P, ["q"])
def quantization_scales():
    return _quantized().map(lambda q: (q,))


@spec(P, ["q"])
def quantization_zero_points():
    return _quantized().map(lambda q: (q,))


@spec(P, ["a", "b"])
def int8_gemm():
    @st.composite
    def s(draw):
        m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
        a = draw(_quantized(shape=(m, k), axes=[None, 0]))
        b = draw(_quantized(shape=(k, n), axes=[None, 1]))
        return (a, b)
    return s()


@st.composite
def _precision_and_values(draw):
    g = gen(draw)
    return (draw(enum_of(P, "Precision")),
            normal(g, small_shape(draw), draw(st.sampled_from([1e-6, 1.0, 1000.0]))))


@spec(P, ["precision", "x"])
def round_to_bits():
    return _precision_and_values()


@spec(P, ["precision", "x"])
def round_to_precision():
    return _precision_and_values()


@spec(P, ["precision", "bits"])
def bits_to_float():
    @st.composite
    def s(draw):
        g = gen(draw)
        p = draw(enum_of(P, "Precision"))
        top = 0x7C00 if p.name == "FP16" else 0x7F80  # finite magnitudes only
        shape = small_shape(draw)
        mag = g.integers(0, top, size=shape)
        sign = g.integers(0, 2, size=shape) << 15
        return (p, (mag | sign).astype(np.uint16))
    return s()


@spec(P, ["precision", "a", "b"])
def reduced_gemm():
    @st.composite
    def s(draw):
        g = gen(draw)
        m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
        return (draw(enum_of(P, "Precision")), normal(g, (m, k)), normal(g, (k, n)))
    return s()


def _scaler(draw):
    prec = mod(P)
    return prec.initial_loss_scaler(2.0 ** draw(st.integers(-10, 24)), draw(st.integers(1, 5)))


def _grads(draw):
    g = gen(draw)
    if draw(st.booleans()):
        return normal(g, small_shape(draw))
    return [normal(g, small_shape(draw)) for _ in range(draw(st.integers(0, 3)))]


@spec(P, ["scale", "growth_interval"])
def initial_loss_scaler():
    return st.tuples(st.integers(-20, 24).map(lambda e: 2.0 ** e), st.integers(1, 1000))


@spec(P, ["scaler", "loss"])
def scale_loss():
    return st.composite(lambda draw: (_scaler(draw), draw(st.floats(-1e3, 1e3))))()


@spec(P, ["scaler", "grads"])
def unscale_gradients():
    return st.composite(lambda draw: (_scaler(draw), _grads(draw)))()


@spec(P, ["finite", "scaler"])
def update_loss_scaler():
    return st.composite(lambda draw: (draw(st.booleans()), _scaler(draw)))()


@spec(P, ["grads"])
def gradient_norm():
    return st.composite(lambda draw: (_grads(draw),))()


@spec(P, ["max_norm", "grads"])
def clip_gradients():
    return st.composite(lambda draw: (draw(st.floats(1e-3, 10.0)), _grads(draw)))()


# ----------------------------------------------------------------------------- activations
@spec(A, ["activation", "x"])
def activate():
    @st.composite
    def s(draw):
        g = gen(draw)
        return (draw(enum_of(A, "Activation")), normal(g, small_shape(draw), 5.0))
    return s()


# ----------------------------------------------------------------------------- layers
def _nc_spatial(draw, g, min_rank=1, max_rank=3, max_side=5):
    rank = draw(st.integers(min_rank, max_rank))
    n = draw(st.integers(1, 3))
    c = draw(st.integers(1, 4))
    spatial = tuple(draw(st.integers(1, max_side)) for _ in range(rank))
    return normal(g, (n, c) + spatial)


@spec(L, ["mode", "p", "rng", "x"])
def dropout():
    @st.composite
    def s(draw):
        g = gen(draw)
        return (draw(enum_of(L, "Mode")), draw(st.floats(0.0, 1.0)),
                RNG.from_seed(draw(seeds())), normal(g, small_shape(draw)))
    return s()


@spec(L, ["mode", "p", "rng", "x"])
def spatial_dropout():
    @st.composite
    def s(draw):
        g = gen(draw)
        return (draw(enum_of(L, "Mode")), draw(st.floats(0.0, 1.0)),
                RNG.from_seed(draw(seeds())), _nc_spatial(draw, g))
    return s()


@spec(L, ["mode", "momentum", "epsilon", "gamma", "beta", "state", "x"])
def batch_norm():
    @st.composite
    def s(draw):
        g = gen(draw)
        x = _nc_spatial(draw, g, min_rank=0, max_rank=2) if draw(st.booleans()) else \
            _nc_spatial(draw, g, min_rank=1, max_rank=3)
        c = x.shape[1]
        state = mod(L).BatchNormState.initial(c)
        return (draw(enum_of(L, "Mode")), draw(st.floats(0.0, 1.0)),
                draw(st.floats(1e-8, 1.0)), normal(g, c), normal(g, c), state, x)
    return s()


@st.composite
def _axes_eps_x(draw):
    g = gen(draw)
    shape = small_shape(draw)
    return (draw(st.integers(1, len(shape))), draw(st.floats(1e-8, 1.0)), normal(g, shape, 2.0))


@spec(L, ["axes", "epsilon", "x"])
def layer_norm():
    return _axes_eps_x()


@spec(L, ["axes", "epsilon", "x"])
def rms_norm():
    return _axes_eps_x()


@spec(L, ["epsilon", "x"])
def instance_norm():
    @st.composite
    def s(draw):
        return (draw(st.floats(1e-8, 1.0)), _nc_spatial(draw, gen(draw)))
    return s()


@spec(L, ["groups", "epsilon", "x"])
def group_norm():
    @st.composite
    def s(draw):
        x = _nc_spatial(draw, gen(draw))
        c = x.shape[1]
        groups = draw(st.sampled_from([d for d in range(1, c + 1) if c % d == 0]))
        return (groups, draw(st.floats(1e-8, 1.0)), x)
    return s()


@spec(L, ["axis", "magnitudes", "w"])
def weight_norm():
    @st.composite
    def s(draw):
        g = gen(draw)
        shape = small_shape(draw)
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        return (axis, g.uniform(0.1, 2.0, shape[axis]), normal(g, shape) + 0.5)
    return s()


@spec(L, ["init", "fan_in", "fan_out", "shape", "rng"])
def initialize_weights():
    @st.composite
    def s(draw):
        lay = mod(L)
        init = draw(st.sampled_from([
            lay.XavierUniform(), lay.XavierNormal(), lay.KaimingUniform(), lay.KaimingNormal(),
            lay.Orthogonal(1.0), lay.Orthogonal(0.5), lay.TruncatedNormal(0.0, 0.02, 2.0),
        ]))
        shape = small_shape(draw, min_dims=2)
        return (init, draw(st.integers(1, 64)), draw(st.integers(1, 64)), shape,
                RNG.from_seed(draw(seeds())))
    return s()


@spec(L, ["weights", "indices"])
def embedding():
    @st.composite
    def s(draw):
        g = gen(draw)
        v, f = draw(st.integers(1, 6)), draw(st.integers(1, 4))
        return (normal(g, (v, f)), g.integers(0, v, size=small_shape(draw, min_dims=0, max_dims=2)))
    return s()


@spec(L, ["x", "weights", "bias"])
def dense():
    @st.composite
    def s(draw):
        g = gen(draw)
        b, i, o = (draw(st.integers(1, 5)) for _ in range(3))
        return (normal(g, (b, i)), normal(g, (o, i)), normal(g, o) if draw(st.booleans()) else None)
    return s()


def _conv_case(draw, transposed=False, depthwise=False):
    g = gen(draw)
    lay = mod(L)
    rank = draw(st.integers(1, 3))
    groups = 1 if depthwise else draw(st.integers(1, 2))
    cin = groups * draw(st.integers(1, 2))
    cout = groups * draw(st.integers(1, 2))
    n = draw(st.integers(1, 2))
    stride = tuple(draw(st.integers(1, 2)) for _ in range(rank))
    dil = tuple(draw(st.integers(1, 2)) for _ in range(rank))
    ks = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    pad = tuple(draw(st.integers(0, 1)) for _ in range(rank))
    span = tuple(d * (k - 1) + 1 for d, k in zip(dil, ks))
    size = tuple(max(1, sp - 2 * p) + draw(st.integers(0, 2)) for sp, p in zip(span, pad))
    opts = lay.ConvOptions(stride, pad, dil, groups)
    x = normal(g, (n, cin) + size)
    if depthwise:
        m = draw(st.integers(1, 2))
        return opts, x, normal(g, (cin * m, 1) + ks), (normal(g, cin * m) if draw(st.booleans()) else None)
    if transposed:
        w = normal(g, (cin, cout // groups) + ks)
        bias = normal(g, cout) if draw(st.booleans()) else None
        out_pad = tuple(draw(st.integers(0, s_ - 1)) for s_ in stride)
        return out_pad, opts, x, w, bias
    w = normal(g, (cout, cin // groups) + ks)
    return opts, x, w, (normal(g, cout) if draw(st.booleans()) else None)


@spec(L, ["options", "x", "weights", "bias"])
def convolution():
    return st.composite(lambda draw: _conv_case(draw))()


@spec(L, ["output_padding", "options", "x", "weights", "bias"])
def transposed_convolution():
    return st.composite(lambda draw: _conv_case(draw, transposed=True))()


@spec(L, ["options", "x", "weights", "bias"])
def depthwise_convolution():
    return st.composite(lambda draw: _conv_case(draw, depthwise=True))()


@spec(L, ["mode", "window", "stride", "padding", "x"])
def pooling():
    @st.composite
    def s(draw):
        g = gen(draw)
        x = _nc_spatial(draw, g, max_side=6)
        rank = x.ndim - 2
        window = tuple(draw(st.integers(1, min(3, x.shape[2 + i]))) for i in range(rank))
        stride = tuple(draw(st.integers(1, 2)) for _ in range(rank))
        padding = tuple(draw(st.integers(0, w // 2)) for w in window)
        return (draw(enum_of(L, "PoolMode")), window, stride, padding, x)
    return s()


@spec(L, ["mode", "output_size", "x"])
def adaptive_pooling():
    @st.composite
    def s(draw):
        x = _nc_spatial(draw, gen(draw))
        out = tuple(draw(st.integers(1, 6)) for _ in range(x.ndim - 2))
        return (draw(enum_of(L, "PoolMode")), out, x)
    return s()


@spec(L, ["mode", "x"])
def global_pooling():
    return st.composite(lambda draw: (draw(enum_of(L, "PoolMode")), _nc_spatial(draw, gen(draw))))()


def _qkv(draw, heads=1):
    g = gen(draw)
    batch = draw(st.sampled_from([(), (2,), (2, 1)]))
    n, m = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    d, f = heads * draw(st.integers(1, 3)), heads * draw(st.integers(1, 3))
    q, k, v = normal(g, batch + (n, d)), normal(g, batch + (m, d)), normal(g, batch + (m, f))
    mask = g.random((n, m)) < 0.7 if draw(st.booleans()) else None
    return g, q, k, v, mask


@spec(L, ["q", "k", "v", "mask", "bias"])
def scaled_dot_product_attention():
    @st.composite
    def s(draw):
        g, q, k, v, mask = _qkv(draw)
        bias = normal(g, (q.shape[-2], k.shape[-2])) if draw(st.booleans()) else None
        return (q, k, v, mask, bias)
    return s()


@spec(L, ["heads", "q", "k", "v", "mask"])
def multihead_attention():
    @st.composite
    def s(draw):
        h = draw(st.integers(1, 3))
        _, q, k, v, mask = _qkv(draw, heads=h)
        return (h, q, k, v, mask)
    return s()


@spec(L, ["queries", "keys", "offset"])
def causal_mask():
    return st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(0, 4))


@spec(L, ["base", "offset", "x"])
def rotary_embedding():
    @st.composite
    def s(draw):
        g = gen(draw)
        batch = draw(st.sampled_from([(), (2,)]))
        x = normal(g, batch + (draw(st.integers(1, 5)), 2 * draw(st.integers(1, 3))))
        return (draw(st.sampled_from([10000.0, 10.0, 1.5])), draw(st.integers(0, 10)), x)
    return s()


@spec(L, ["positions", "features", "offset"])
def sinusoidal_encoding():
    return st.tuples(st.integers(1, 8), st.integers(1, 8), st.integers(0, 100))


@spec(L, ["slope", "queries", "keys", "offset"])
def alibi_bias():
    return st.tuples(st.floats(1e-3, 2.0), st.integers(1, 6), st.integers(1, 6), st.integers(0, 4))


@spec(L, ["capacity", "key_width", "value_width"])
def empty_cache():
    return st.tuples(st.integers(1, 64), st.integers(1, 4), st.integers(1, 4))


@st.composite
def _cache(draw):
    lay = mod(L)
    g = gen(draw)
    kw, vw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    c = lay.empty_cache(16, kw, vw)
    for _ in range(draw(st.integers(0, 2))):
        n = draw(st.integers(0, 3))
        c = lay.append_cache(c, normal(g, (n, kw)), normal(g, (n, vw)))
    return g, c


@spec(L, ["cache", "keys", "values"])
def append_cache():
    @st.composite
    def s(draw):
        g, c = draw(_cache())
        n = draw(st.integers(0, 3))
        return (c, normal(g, (n, c.key_width)), normal(g, (n, c.value_width)))
    return s()


@spec(L, ["cache"])
def cache_values():
    return _cache().map(lambda gc: (gc[1],))


@spec(L, ["activation", "w1", "b1", "w2", "b2", "x"])
def transformer_feed_forward():
    @st.composite
    def s(draw):
        g = gen(draw)
        b, d, h = (draw(st.integers(1, 4)) for _ in range(3))
        return (draw(enum_of(A, "Activation")), normal(g, (h, d)), normal(g, h),
                normal(g, (d, h)), normal(g, d), normal(g, (b, d)))
    return s()


# ----------------------------------------------------------------------------- autodiff
def V(x):
    return mod(D).variable(x)


@spec(L, ["x", "w", "bias"])
def dense_ad():
    return dense().map(lambda a: (V(a[0]), V(a[1]), None if a[2] is None else V(a[2])))


@spec(L, ["options", "x", "w", "bias"])
def convolution_ad():
    return convolution().map(lambda a: (a[0], V(a[1]), V(a[2]), None if a[3] is None else V(a[3])))


@spec(L, ["axes", "epsilon", "x"])
def layer_norm_ad():
    return _axes_eps_x().map(lambda a: (a[0], a[1], V(a[2])))


@spec(L, ["axes", "epsilon", "x"])
def rms_norm_ad():
    return _axes_eps_x().map(lambda a: (a[0], a[1], V(a[2])))


@spec(L, ["q", "k", "v", "mask"])
def scaled_dot_product_attention_ad():
    return scaled_dot_product_attention().map(lambda a: (V(a[0]), V(a[1]), V(a[2]), a[3]))


@st.composite
def _array(draw, positive=False):
    g = gen(draw)
    x = normal(g, small_shape(draw))
    return np.abs(x) + 0.1 if positive else x


@spec(D, ["x"])
def variable():
    return _array().map(lambda x: (x,))


@spec(D, ["x"])
def constant():
    return _array().map(lambda x: (x,))


@spec(D, ["output", "wrt", "cotangent"])
def gradients():
    @st.composite
    def s(draw):
        ad = mod(D)
        x = V(draw(_array()))
        y = ad.tanh(x) * x
        if draw(st.booleans()):
            return (ad.sum(y), [x], None)
        return (y, [x], gen(draw).standard_normal(y.shape))
    return s()


for _name, _positive in (("exp", False), ("log", True), ("sqrt", True), ("tanh", False)):
    def _factory(positive=_positive):
        return _array(positive=positive).map(lambda x: (V(x),))
    _factory.__name__ = _name
    spec(D, ["x"])(_factory)


@spec(D, ["activation", "x"])
def activate_():
    return activate().map(lambda a: (a[0], V(a[1])))



def _reduce_case(draw):
    x = draw(_array())
    axis = draw(st.sampled_from([None] + list(range(-x.ndim, x.ndim))))
    return (V(x), axis, draw(st.booleans()))


@spec(D, ["x", "axis", "keepdims"])
def sum_():
    return st.composite(_reduce_case)()


@spec(D, ["x", "axis", "keepdims"])
def mean():
    return st.composite(_reduce_case)()


@spec(D, ["x", "shape"])
def reshape():
    return _array().map(lambda x: (V(x), (x.size,) if x.ndim > 1 else (1, x.size)))


@spec(D, ["x", "axes"])
def transpose():
    return _array().map(lambda x: (V(x), tuple(reversed(range(x.ndim)))))


def _softmax_case(draw):
    x = draw(_array())
    return (V(x), draw(st.integers(-x.ndim, x.ndim - 1)))


@spec(D, ["x", "axis"])
def softmax():
    return st.composite(_softmax_case)()


@spec(D, ["x", "axis"])
def log_softmax():
    return st.composite(_softmax_case)()


@spec(D, ["logits", "labels"])
def cross_entropy():
    @st.composite
    def s(draw):
        g = gen(draw)
        b, c = draw(st.integers(1, 5)), draw(st.integers(1, 5))
        return (V(normal(g, (b, c))), g.integers(0, c, size=b))
    return s()


@spec(D, ["prediction", "target"])
def mse():
    @st.composite
    def s(draw):
        x = draw(_array())
        t = gen(draw).standard_normal(x.shape)
        return (V(x), V(t) if draw(st.booleans()) else t)
    return s()


@spec(D, ["grads"])
def gradient_norm_():
    return gradient_norm()


@spec(D, ["max_norm", "grads"])
def clip_gradients_():
    return clip_gradients()



# ----------------------------------------------------------------------------- beyond the seed
@spec(L, ["output_padding", "options", "x", "w", "bias"])
def transposed_convolution_ad():
    return transposed_convolution().map(
        lambda a: (a[0], a[1], V(a[2]), V(a[3]), None if a[4] is None else V(a[4])))


@spec(L, ["mode", "window", "stride", "padding", "x"])
def pooling_ad():
    return pooling().map(lambda a: a[:4] + (V(a[4]),))


@spec(L, ["mode", "momentum", "epsilon", "gamma", "beta", "state", "x"])
def batch_norm_ad():
    return batch_norm().map(lambda a: a[:3] + (V(a[3]), V(a[4]), a[5], V(a[6])))


@spec(L, ["weights", "indices"])
def embedding_ad():
    return embedding().map(lambda a: (V(a[0]), a[1]))


@spec(L, ["mode", "p", "rng", "x"])
def dropout_ad():
    return dropout().map(lambda a: a[:3] + (V(a[3]),))


@spec(L, ["heads", "q", "k", "v", "mask"])
def multihead_attention_ad():
    return multihead_attention().map(lambda a: (a[0], V(a[1]), V(a[2]), V(a[3]), a[4]))


@spec(L, ["groups", "epsilon", "x"])
def group_norm_ad():
    return group_norm().map(lambda a: (a[0], a[1], V(a[2])))


@spec(L, ["epsilon", "x"])
def instance_norm_ad():
    return instance_norm().map(lambda a: (a[0], V(a[1])))


@spec(L, ["axis", "magnitudes", "w"])
def weight_norm_ad():
    return weight_norm().map(lambda a: (a[0], V(a[1]), V(a[2])))


@spec(L, ["options", "x", "w", "bias"])
def depthwise_convolution_ad():
    return depthwise_convolution().map(
        lambda a: (a[0], V(a[1]), V(a[2]), None if a[3] is None else V(a[3])))


@spec(L, ["mode", "output_size", "x"])
def adaptive_pooling_ad():
    return adaptive_pooling().map(lambda a: a[:2] + (V(a[2]),))


@spec(L, ["mode", "x"])
def global_pooling_ad():
    return global_pooling().map(lambda a: (a[0], V(a[1])))


@spec(L, ["mode", "p", "rng", "x"])
def spatial_dropout_ad():
    return spatial_dropout().map(lambda a: a[:3] + (V(a[3]),))


@spec(L, ["base", "offset", "x"])
def rotary_embedding_ad():
    return rotary_embedding().map(lambda a: a[:2] + (V(a[2]),))


@spec(L, ["activation", "w1", "b1", "w2", "b2", "x"])
def transformer_feed_forward_ad():
    return transformer_feed_forward().map(
        lambda a: (a[0], V(a[1]), V(a[2]), V(a[3]), V(a[4]), V(a[5])))


@spec(L, ["window", "stride", "padding", "x"])
def max_pooling_with_indices():
    return pooling().map(lambda a: a[1:])


@spec(L, ["values", "indices", "output_size"])
def max_unpooling():
    def build(a):
        window, stride, padding, x = a[1:]
        values, indices = mod(L).max_pooling_with_indices(window, stride, padding, x)
        return (values, indices, x.shape[2:])
    return pooling().map(build)


@spec(D, ["fn", "inputs"], allowed=(AssertionError,))
def check_gradients():
    fns = [lambda x: mod(D).sum(mod(D).tanh(x) * x), lambda x: mod(D).exp(x) * 2.0]
    return st.composite(lambda draw: (draw(st.sampled_from(fns)),
                                      [normal(gen(draw), small_shape(draw, max_side=3))]))()


O = "hmath_dl.optim"


def _params(draw):
    g = gen(draw)
    return [normal(g, small_shape(draw)) for _ in range(draw(st.integers(1, 3)))]


@spec(O, ["params"])
def sgd_init():
    return st.composite(lambda draw: (_params(draw),))()


@spec(O, ["params"])
def adamw_init():
    return st.composite(lambda draw: (_params(draw),))()


def _step_case(init_name, draw):
    params = _params(draw)
    g = gen(draw)
    grads = [normal(g, p.shape) for p in params]
    state = getattr(mod(O), init_name)(params)
    return (state, params, grads, draw(st.floats(1e-5, 0.1)))


@spec(O, ["state", "params", "grads", "lr"])
def sgd_step():
    return st.composite(lambda draw: _step_case("sgd_init", draw))()


@spec(O, ["state", "params", "grads", "lr"])
def adamw_step():
    return st.composite(lambda draw: _step_case("adamw_init", draw))()


# ----------------------------------------------------------------------------- distributed
DP = "hmath_dl.distributed"


def _dp_sum_loss(params, x, y):
    """Summed cross-entropy of a linear classifier (a picklable, module-level loss_fn)."""
    w, b = params
    return mod(D).cross_entropy(mod(L).dense_ad(mod(D).constant(x), w, b), y) * float(len(y))


def _dp_mse_loss(params, x):
    (w,) = params
    pred = mod(D).constant(x) @ w
    return mod(D).mse(pred, mod(D).constant(np.zeros(pred.shape))) * float(pred.size)


@spec(DP, ["loss_fn", "params", "batch", "shard_size", "client"])
def data_parallel_gradients():
    @st.composite
    def s(draw):
        g = gen(draw)
        b = draw(st.integers(1, 9))
        f, c = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        if draw(st.booleans()):
            params = [normal(g, (c, f)), normal(g, (c,))]
            batch = (normal(g, (b, f)), g.integers(0, c, size=b))
            loss_fn = _dp_sum_loss
        else:
            params = [normal(g, (f, c))]
            batch = (normal(g, (b, f)),)
            loss_fn = _dp_mse_loss
        return (loss_fn, params, batch, draw(st.integers(1, b + 2)), None)
    return s()
