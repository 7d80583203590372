"""Differentiable layers (hmath_dl.layers.*_ad): forward bit for bit equal to the plain
layers, gradients equal to central finite differences, errors named, determinism."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hmath_dl import autodiff as ad
from hmath_dl import layers as L
from hmath_dl.errors import (DomainError, IndexOutOfRange, NonFiniteError, NumericOverflow,
                             ShapeError)
from hmath_dl.rng import RNG
from tests.helpers import assert_same_across_threads
from tests.reference import autodiff as ref

seeds = st.integers(0, 2**32 - 1)
small = st.integers(1, 4)


def rnd(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape)


def raises(exc, fname, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(fname), str(info.value)


def V(x):
    return ad.variable(x)


def grads_vs_reference(fn_ad, fn_plain, inputs, seed=0, rtol=1e-6, atol=1e-7):
    """Tape gradients of fn_ad vs plain-loop central differences of fn_plain."""
    vs = [V(x) for x in inputs]
    out = fn_ad(*vs)
    cot = rnd(seed + 99, out.shape)
    got = ad.gradients(out, vs, cot)
    want = ref.numeric_gradient(fn_plain, inputs, cot)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- dense
@given(seed=seeds, b=small, i=small, o=small, has_bias=st.booleans(), lead=st.booleans())
def test_dense_ad(seed, b, i, o, has_bias, lead):
    x = rnd(seed, (2, b, i) if lead else (b, i))
    w = rnd(seed + 1, (o, i))
    bias = rnd(seed + 2, o) if has_bias else None
    y = L.dense_ad(V(x), V(w), None if bias is None else V(bias))
    assert np.array_equal(y.value, L.dense(x, w, bias))
    if has_bias:
        ad.check_gradients(L.dense_ad, [x, w, bias])
        grads_vs_reference(L.dense_ad, L.dense, [x, w, bias], seed)
    else:
        ad.check_gradients(lambda a, c: L.dense_ad(a, c, None), [x, w])


def test_dense_ad_constants_and_errors():
    x, w = rnd(1, (3, 2)), rnd(2, (4, 2))
    vw = V(w)
    (gw,) = ad.gradients(ad.sum(L.dense_ad(x, vw, np.ones(4))), [vw])
    np.testing.assert_allclose(gw, np.tile(x.sum(0), (4, 1)), rtol=1e-15)
    raises(ShapeError, "dense_ad", L.dense_ad, V(x), V(rnd(3, (4, 3))), None)
    raises(ShapeError, "dense_ad", L.dense_ad, V(x), vw, V(np.ones(3)))
    raises(NonFiniteError, "dense_ad", L.dense_ad, [[np.nan, 1.0]], vw, None)
    raises(TypeError, "dense_ad", L.dense_ad, "x", vw, None)


# ----------------------------------------------------------------------------- norms
@settings(max_examples=25)
@given(seed=seeds, shape=st.lists(st.integers(1, 3), min_size=1, max_size=3), data=st.data(),
       eps=st.sampled_from([1e-5, 1e-3, 0.5]))
def test_layer_and_rms_norm_ad(seed, shape, data, eps):
    x = rnd(seed, tuple(shape)) * 2 + 0.3
    axes = data.draw(st.integers(1, len(shape)))
    ln = L.layer_norm_ad(axes, eps, V(x))
    rn = L.rms_norm_ad(axes, eps, V(x))
    assert np.array_equal(ln.value, L.layer_norm(axes, eps, x))
    assert np.array_equal(rn.value, L.rms_norm(axes, eps, x))
    ad.check_gradients(lambda v: L.layer_norm_ad(axes, eps, v), [x])
    ad.check_gradients(lambda v: L.rms_norm_ad(axes, eps, v), [x])


def test_norm_reference_gradients():
    x = rnd(5, (3, 4))
    grads_vs_reference(lambda v: L.layer_norm_ad(1, 1e-3, v), lambda a: L.layer_norm(1, 1e-3, a), [x])
    grads_vs_reference(lambda v: L.rms_norm_ad(2, 1e-3, v), lambda a: L.rms_norm(2, 1e-3, a), [x])


def test_norm_errors():
    raises(DomainError, "layer_norm_ad", L.layer_norm_ad, 3, 1e-5, V(np.ones((2, 2))))
    raises(DomainError, "rms_norm_ad", L.rms_norm_ad, 1, 0.0, V(np.ones((2, 2))))
    raises(TypeError, "layer_norm_ad", L.layer_norm_ad, 1.5, 1e-5, V(np.ones((2, 2))))


@settings(max_examples=25)
@given(seed=seeds, n=st.integers(1, 3), c=st.integers(1, 3),
       spatial=st.lists(st.integers(1, 2), max_size=2), training=st.booleans())
def test_batch_norm_ad(seed, n, c, spatial, training):
    mode = L.Mode.TRAINING if training else L.Mode.INFERENCE
    shape = (n, c) + tuple(spatial)
    x = rnd(seed, shape) * 1.5 + 0.2
    gamma, beta = rnd(seed + 1, c), rnd(seed + 2, c)
    state = L.BatchNormState(rnd(seed + 3, c), np.abs(rnd(seed + 4, c)) + 0.5, 3)
    y, s1 = L.batch_norm_ad(mode, 0.1, 1e-3, V(gamma), V(beta), state, V(x))
    y0, s0 = L.batch_norm(mode, 0.1, 1e-3, gamma, beta, state, x)
    assert np.array_equal(y.value, y0)
    assert np.array_equal(s1.running_mean, s0.running_mean)
    assert np.array_equal(s1.running_variance, s0.running_variance)
    assert s1.batches_seen == s0.batches_seen
    if training and n * int(np.prod(spatial)) == 1:
        return  # y == beta exactly: the x-gradient is 0 but x - mean cancels numerically
    ad.check_gradients(lambda v, g, b: L.batch_norm_ad(mode, 0.1, 1e-3, g, b, state, v)[0],
                       [x, gamma, beta])


def test_batch_norm_errors():
    st0 = L.BatchNormState.initial(3)
    raises(ShapeError, "batch_norm_ad", L.batch_norm_ad, L.Mode.TRAINING, 0.1, 1e-5,
           V(np.ones(2)), V(np.zeros(2)), st0, V(np.ones((2, 3))))
    raises(TypeError, "batch_norm_ad", L.batch_norm_ad, "train", 0.1, 1e-5,
           V(np.ones(3)), V(np.zeros(3)), st0, V(np.ones((2, 3))))


# ----------------------------------------------------------------------------- embedding, dropout
@given(seed=seeds, v=small, f=small, ishape=st.lists(st.integers(0, 4), min_size=1, max_size=2))
def test_embedding_ad(seed, v, f, ishape):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((v, f))
    idx = rng.integers(0, v, size=tuple(ishape))
    wv = V(w)
    y = L.embedding_ad(wv, idx)
    assert np.array_equal(y.value, L.embedding(w, idx))
    cot = rng.standard_normal(y.shape)
    (gw,) = ad.gradients(y, [wv], cot)
    expect = np.zeros((v, f))
    flat_cot = cot.reshape(-1, f)
    for pos, row in enumerate(idx.reshape(-1)):  # increasing position order
        expect[row] += flat_cot[pos]
    assert np.array_equal(gw, expect)


def test_embedding_errors():
    raises(IndexOutOfRange, "embedding_ad", L.embedding_ad, V(np.ones((3, 2))), [0, 3])
    raises(TypeError, "embedding_ad", L.embedding_ad, V(np.ones((3, 2))), [0.5])


def test_dropout_ad():
    x = rnd(3, (4, 5))
    for mode in L.Mode:
        y, mask, rng = L.dropout_ad(mode, 0.3, RNG.from_seed(7), V(x))
        y0, mask0, rng0 = L.dropout(mode, 0.3, RNG.from_seed(7), x)
        assert np.array_equal(y.value, y0) and np.array_equal(mask, mask0) and rng == rng0
        xv = V(x)
        out, mask, _ = L.dropout_ad(mode, 0.3, RNG.from_seed(7), xv)
        cot = rnd(4, x.shape)
        (g,) = ad.gradients(out, [xv], cot)
        assert np.array_equal(g, cot * mask)
        # the documented by-hand pattern gives the same numbers
        y1, m1, _ = L.dropout(mode, 0.3, RNG.from_seed(7), xv.value)
        assert np.array_equal((xv * ad.constant(m1)).value, y0)
    raises(DomainError, "dropout_ad", L.dropout_ad, L.Mode.TRAINING, 1.5, RNG.from_seed(1), V(x))


# ----------------------------------------------------------------------------- attention
def _attention_case(draw, heads=1):
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    lead = tuple(draw(st.lists(st.integers(1, 2), max_size=2 if heads == 1 else 1)))
    n, m = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    d, f = heads * draw(st.integers(1, 2)), heads * draw(st.integers(1, 2))
    q = rng.standard_normal(lead + (n, d))
    k = rng.standard_normal(lead + (m, d))
    v = rng.standard_normal(lead + (m, f))
    kind = draw(st.sampled_from(["none", "shared", "full"]))
    mask = None
    if kind == "shared":
        mask = rng.random((n, m)) < 0.6
    elif kind == "full":
        mask = rng.random(lead + (n, m)) < 0.6
    return q, k, v, mask


@given(data=st.data())
def test_sdpa_ad(data):
    from hmath_dl.layers.attention import scaled_dot_product_attention
    q, k, v, mask = _attention_case(data.draw)
    out = L.scaled_dot_product_attention_ad(V(q), V(k), V(v), mask)
    assert np.array_equal(out.value, scaled_dot_product_attention(q, k, v, mask)[0])
    ad.check_gradients(lambda a, b, c: L.scaled_dot_product_attention_ad(a, b, c, mask),
                       [q, k, v])


@settings(max_examples=20)
@given(data=st.data(), heads=st.integers(1, 3))
def test_multihead_attention_ad(data, heads):
    from hmath_dl.layers.attention import multihead_attention
    q, k, v, mask = _attention_case(data.draw, heads)
    out = L.multihead_attention_ad(heads, V(q), V(k), V(v), mask)
    assert np.array_equal(out.value, multihead_attention(heads, q, k, v, mask))
    ad.check_gradients(lambda a, b, c: L.multihead_attention_ad(heads, a, b, c, mask), [q, k, v])


def test_attention_reference_gradients():
    from hmath_dl.layers.attention import scaled_dot_product_attention
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    mask = rng.random((3, 5)) < 0.7
    grads_vs_reference(lambda a, b, c: L.scaled_dot_product_attention_ad(a, b, c, mask),
                       lambda a, b, c: scaled_dot_product_attention(a, b, c, mask)[0], [q, k, v])


def test_fully_masked_rows_give_exact_zero_gradients():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    qv, kv, vv = V(q), V(k), V(v)
    for out in (L.scaled_dot_product_attention_ad(qv, kv, vv, mask),
                L.multihead_attention_ad(1, qv, kv, vv, mask)):
        assert np.array_equal(out.value[:, 1], np.zeros((2, 3)))
        cot = np.zeros(out.shape)
        cot[:, 1] = 1.0  # only the fully masked row
        gq, gk, gv = ad.gradients(out, [qv, kv, vv], cot)
        assert not gq.any() and not gk.any() and not gv.any()
        gq, _, _ = ad.gradients(out, [qv, kv, vv], rng.standard_normal(out.shape))
        assert np.array_equal(gq[:, 1], np.zeros((2, 4)))
    # every row masked: a constant zero graph
    out = L.scaled_dot_product_attention_ad(qv, kv, vv, np.zeros((3, 5), bool))
    gs = ad.gradients(out, [qv, kv, vv], np.ones(out.shape))
    assert all(not g.any() for g in gs)


def test_attention_errors():
    q = V(np.ones((3, 4)))
    raises(ShapeError, "scaled_dot_product_attention_ad", L.scaled_dot_product_attention_ad,
           q, V(np.ones((5, 3))), V(np.ones((5, 2))))
    raises(ShapeError, "scaled_dot_product_attention_ad", L.scaled_dot_product_attention_ad,
           q, q, q, np.ones((2, 2), bool))
    raises(DomainError, "multihead_attention_ad", L.multihead_attention_ad, 3, q, q, q)
    raises(DomainError, "multihead_attention_ad", L.multihead_attention_ad, 0, q, q, q)
    raises(TypeError, "multihead_attention_ad", L.multihead_attention_ad, 1.5, q, q, q)
    raises(ShapeError, "multihead_attention_ad", L.multihead_attention_ad, 2, q, q, q,
           np.ones((2, 2), bool))
    raises(ShapeError, "multihead_attention_ad", L.multihead_attention_ad, 2, q,
           V(np.ones((3, 2))), q)
    big = V(np.full((3, 4), 1e200))
    raises(NumericOverflow, "multihead_attention_ad", L.multihead_attention_ad, 2, big, big, q)
    raises(NumericOverflow, "scaled_dot_product_attention_ad", L.scaled_dot_product_attention_ad,
           big, big, q)


# ----------------------------------------------------------------------------- convolution
@st.composite
def conv_cases(draw, transposed=False):
    rng = np.random.default_rng(draw(seeds))
    r = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 2))
    n = draw(st.integers(1, 2))
    cin, cout = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    k = tuple(draw(st.integers(1, 3 if r < 3 else 2)) for _ in range(r))
    s = tuple(draw(st.integers(1, 2)) for _ in range(r))
    d = tuple(draw(st.integers(1, 2)) for _ in range(r))
    p = tuple(draw(st.integers(0, 1)) for _ in range(r))
    options = L.ConvOptions(s, p, d, groups)
    if transposed:
        size = tuple(draw(st.integers(1, 3)) for _ in range(r))
        op = tuple(draw(st.integers(0, s[a] - 1)) for a in range(r))
        out = [(size[a] - 1) * s[a] - 2 * p[a] + d[a] * (k[a] - 1) + op[a] + 1 for a in range(r)]
        if min(out) < 1:
            p = (0,) * r
            options = L.ConvOptions(s, p, d, groups)
        x = rng.standard_normal((n, cin) + size)
        w = rng.standard_normal((cin, cout // groups) + k)
    else:
        size = tuple(d[a] * (k[a] - 1) + 1 + draw(st.integers(0, 3 if r < 3 else 2)) for a in range(r))
        x = rng.standard_normal((n, cin) + size)
        w = rng.standard_normal((cout, cin // groups) + k)
        op = None
    bias = rng.standard_normal(cout) if draw(st.booleans()) else None
    return options, op, x, w, bias


@settings(max_examples=25)
@given(case=conv_cases())
def test_convolution_ad(case):
    options, _, x, w, bias = case
    y = L.convolution_ad(options, V(x), V(w), None if bias is None else V(bias))
    assert np.array_equal(y.value, L.convolution(options, x, w, bias))
    if bias is None:
        ad.check_gradients(lambda a, b: L.convolution_ad(options, a, b, None), [x, w])
    else:
        ad.check_gradients(lambda a, b, c: L.convolution_ad(options, a, b, c), [x, w, bias])


@settings(max_examples=25)
@given(case=conv_cases(transposed=True))
def test_transposed_convolution_ad(case):
    options, op, x, w, bias = case
    y = L.transposed_convolution_ad(op, options, V(x), V(w), None if bias is None else V(bias))
    assert np.array_equal(y.value, L.transposed_convolution(op, options, x, w, bias))
    if bias is None:
        ad.check_gradients(lambda a, b: L.transposed_convolution_ad(op, options, a, b, None), [x, w])
    else:
        ad.check_gradients(lambda a, b, c: L.transposed_convolution_ad(op, options, a, b, c),
                           [x, w, bias])


def test_convolution_reference_gradients():
    rng = np.random.default_rng(8)
    options = L.ConvOptions((2, 1), (1, 0), (1, 2), 2)
    x, w, b = rng.standard_normal((2, 4, 5, 6)), rng.standard_normal((2, 2, 2, 2)), rng.standard_normal(2)
    grads_vs_reference(lambda a, c, e: L.convolution_ad(options, a, c, e),
                       lambda a, c, e: L.convolution(options, a, c, e), [x, w, b])


def test_convolution_gradients_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x, w, b = rng.standard_normal((3, 4, 7, 6)), rng.standard_normal((6, 2, 3, 2)), rng.standard_normal(6)
    options = L.ConvOptions((2, 1), (1, 1), (1, 2), 2)
    cot = rng.standard_normal(L.convolution(options, x, w, b).shape)
    xv, wv, bv = V(x), V(w), V(b)
    got = ad.gradients(L.convolution_ad(options, xv, wv, bv), [xv, wv, bv], cot)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2)
    ty.backward(torch.tensor(cot))
    for g, t in zip(got, (tx, tw, tb)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_convolution_errors():
    o = L.ConvOptions(1, 0, 1, 1)
    x, w = V(np.ones((1, 2, 4, 4))), V(np.ones((3, 2, 2, 2)))
    raises(ShapeError, "convolution_ad", L.convolution_ad, o, x, V(np.ones((3, 3, 2, 2))), None)
    raises(ShapeError, "convolution_ad", L.convolution_ad, o, x, w, V(np.ones(2)))
    raises(TypeError, "convolution_ad", L.convolution_ad, (1, 0, 1), x, w, None)
    raises(DomainError, "transposed_convolution_ad", L.transposed_convolution_ad, (1, 1), o,
           x, V(np.ones((2, 3, 2, 2))), None)


def test_conv_backward_deterministic_across_threads():
    assert_same_across_threads("""
        import sys, numpy as np
        from hmath_dl import autodiff as ad, layers as L
        rng = np.random.default_rng(0)
        x = ad.variable(rng.standard_normal((4, 6, 9, 9)))
        w = ad.variable(rng.standard_normal((8, 3, 3, 3)))
        b = ad.variable(rng.standard_normal(8))
        o = L.ConvOptions(1, 1, 1, 2)
        y = L.convolution_ad(o, x, w, b)
        y = L.pooling_ad(L.PoolMode.MAX, 2, 2, 0, y)
        y = L.transposed_convolution_ad(1, L.ConvOptions(2, 1, 1, 1), y, w, None)
        for g in ad.gradients(y, [x, w, b], rng.standard_normal(y.shape)):
            sys.stdout.buffer.write(g.tobytes())
    """)


# ----------------------------------------------------------------------------- pooling
@settings(max_examples=25)
@given(seed=seeds, r=st.integers(1, 3), mode=st.sampled_from(["MAX", "AVERAGE"]), data=st.data())
def test_pooling_ad(seed, r, mode, data):
    mode = L.PoolMode[mode]
    k = tuple(data.draw(st.integers(1, 3)) for _ in range(r))
    s = tuple(data.draw(st.integers(1, 2)) for _ in range(r))
    p = tuple(data.draw(st.integers(0, (k[a] - 1) // 2 + 0)) for a in range(r))
    size = tuple(k[a] + data.draw(st.integers(0, 2 if r < 3 else 1)) for a in range(r))
    x = rnd(seed, (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))) + size)
    y = L.pooling_ad(mode, k, s, p, V(x))
    assert np.array_equal(y.value, L.pooling(mode, k, s, p, x))
    ad.check_gradients(lambda v: L.pooling_ad(mode, k, s, p, v), [x])


def test_max_pool_ties_go_to_the_first_maximum():
    x = V(np.array([[[1.0, 3.0, 3.0, 0.0]]]))
    y = L.pooling_ad(L.PoolMode.MAX, 4, 1, 0, x)
    (g,) = ad.gradients(y, [x], np.ones(y.shape))
    assert np.array_equal(g, [[[0.0, 1.0, 0.0, 0.0]]])
    y = L.pooling_ad(L.PoolMode.AVERAGE, 2, 1, 1, x)  # padding excluded from the count
    (g,) = ad.gradients(y, [x], np.ones(y.shape))
    assert np.array_equal(g, [[[1.5, 1.0, 1.0, 1.5]]])


def test_pooling_errors():
    x = V(np.ones((1, 1, 4)))
    raises(TypeError, "pooling_ad", L.pooling_ad, "max", 2, 2, 0, x)
    raises(DomainError, "pooling_ad", L.pooling_ad, L.PoolMode.MAX, 0, 1, 0, x)


def test_serial_twins_match_parallel_kernels(monkeypatch):
    # small calls run serial compilations of the parallel kernels (Kernel.twin, _jit.py);
    # HMATH_DL_SERIAL_WORK=0 forces the parallel ones: both paths, 1 and 2 threads, give
    # the same bytes for a step that uses every kernel with a twin
    code = """
        import sys
        import numpy as np
        from hmath_dl import autodiff as ad, layers as L
        from hmath_dl.activations import Activation
        rng = np.random.default_rng(3)
        x = rng.standard_normal((3, 2, 6, 6))
        w1, b1 = ad.variable(rng.standard_normal((4, 2, 3, 3))), ad.variable(rng.standard_normal(4))
        w2 = ad.variable(rng.standard_normal((5, 64)))
        t = ad.variable(rng.standard_normal((2, 5, 8)))
        h = ad.activate(Activation.RELU, L.convolution_ad(L.ConvOptions(1, 1, 1, 1), x, w1, b1))
        h = L.pooling_ad(L.PoolMode.MAX, 2, 2, 0, h)
        h = L.pooling_ad(L.PoolMode.AVERAGE, 2, 1, 1, h)
        z = L.dense_ad(ad.reshape(h, (3, -1)), w2, None)
        u = ad.activate(Activation.GELU, L.layer_norm_ad(1, 1e-5, t))
        loss = ad.cross_entropy(z, [0, 1, 4]) + ad.sum(u * u)
        gs = ad.gradients(loss, [w1, b1, w2, t])
        out = [loss.value] + gs + [L.global_pooling(L.PoolMode.AVERAGE, x),
                                   L.layer_norm(1, 1e-5, t.value)]
        sys.stdout.buffer.write(b"".join(np.ascontiguousarray(a).tobytes() for a in out))
    """
    from tests.helpers import run_with_threads
    monkeypatch.delenv("HMATH_DL_SERIAL_WORK", raising=False)
    serial = run_with_threads(code, 2)
    monkeypatch.setenv("HMATH_DL_SERIAL_WORK", "0")
    parallel_one = run_with_threads(code, 1)
    parallel_two = run_with_threads(code, 2)
    assert len(serial) > 0
    assert serial == parallel_one == parallel_two
