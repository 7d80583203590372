"""PyTorch-parity options of convolution, attention, embedding and the new ``_ad`` twins
(API.md sections 0 "Empty batches", 5 "embedding", 8).

Oracles: plain Python loops written from the contract (``tests/reference`` and the small
ones below), and torch where it is importable.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hmath_dl import autodiff as ad
from hmath_dl.activations import Activation
from hmath_dl.autodiff.check import check_gradients
from hmath_dl.errors import DomainError, NonFiniteError, ShapeError, IndexOutOfRange
from hmath_dl.layers import (ConvOptions, Mode, append_cache, batch_norm, batch_norm_ad,
                             BatchNormState, cache_values, convolution, convolution_ad, dense,
                             dense_ad, depthwise_convolution, depthwise_convolution_ad,
                             dropout, dropout_ad, embedding, embedding_ad, empty_cache,
                             multihead_attention, multihead_attention_ad, rotary_embedding,
                             rotary_embedding_ad, scaled_dot_product_attention,
                             scaled_dot_product_attention_ad, spatial_dropout,
                             spatial_dropout_ad, transformer_feed_forward,
                             transformer_feed_forward_ad, transposed_convolution,
                             transposed_convolution_ad)
from hmath_dl.rng import RNG

from .reference.attention import sdpa as sdpa_reference
from .reference.conv import conv_reference, conv_transpose_reference

SETTINGS = settings(max_examples=25, deadline=None)


def _torch():
    return pytest.importorskip("torch")


# =========================================================================== oracles
def same_conv_reference(x, w, bias, dilation, groups):
    """Stride-1 convolution with PyTorch's 'same' split: per axis ``total = d(K-1)``,
    ``left = total // 2`` zeros before, the rest after; output size = input size.
    ``y[n, co, o] = bias + sum w[co, ci', k] x[n, ci, o - left + k d]``."""
    N, cin = x.shape[:2]
    S, K = x.shape[2:], w.shape[2:]
    r = len(S)
    left = [dilation[a] * (K[a] - 1) // 2 for a in range(r)]
    cout, cg = w.shape[:2]
    cog = cout // groups
    y = np.zeros((N, cout) + S)
    for n, co in itertools.product(range(N), range(cout)):
        g = co // cog
        for o in itertools.product(*(range(s) for s in S)):
            t = 0.0 if bias is None else float(bias[co])
            for cl in range(cg):
                for k in itertools.product(*(range(s) for s in K)):
                    pos = tuple(o[a] - left[a] + k[a] * dilation[a] for a in range(r))
                    if all(0 <= pos[a] < S[a] for a in range(r)):
                        t += w[(co, cl) + k] * x[(n, g * cg + cl) + pos]
            y[(n, co) + o] = t
    return y


def attention_oracle(q, k, v, mask, scale):
    """``softmax((q k^T) * scale)`` over allowed keys, times v (numpy float64, one batch
    index at a time; a row with no allowed key is zeros)."""
    lead = q.shape[:-2]
    n, m, f = q.shape[-2], k.shape[-2], v.shape[-1]
    out = np.zeros(lead + (n, f))
    wts = np.zeros(lead + (n, m))
    for li in itertools.product(*(range(s) for s in lead)):
        s = (q[li] @ k[li].T) * scale
        mk = np.ones((n, m), bool) if mask is None else mask[li]
        for i in range(n):
            allowed = np.flatnonzero(mk[i])
            if allowed.size == 0:
                continue
            e = np.exp(s[i, allowed] - s[i, allowed].max())
            wts[li + (i,)][allowed] = e / e.sum()
        out[li] = wts[li] @ v[li]
    return out, wts


# =========================================================================== convolution
@SETTINGS
@given(rank=st.integers(1, 2), kernel=st.integers(1, 4), dil=st.integers(1, 3),
       size=st.integers(1, 6), groups=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 16))
def test_same_padding_matches_oracle(rank, kernel, dil, size, groups, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 2 * groups) + (size,) * rank)
    w = rng.standard_normal((2 * groups, 2) + (kernel,) * rank)
    b = rng.standard_normal(2 * groups)
    opts = ConvOptions(1, "same", dil, groups)
    y = convolution(opts, x, w, b)
    assert y.shape == x.shape[:1] + (2 * groups,) + x.shape[2:]
    np.testing.assert_allclose(y, same_conv_reference(x, w, b, (dil,) * rank, groups),
                               rtol=1e-12, atol=1e-12)
    # unbatched: the batched result's first item, bit for bit
    assert np.array_equal(convolution(opts, x[0], w, b), y[0])
    # "valid" is padding 0
    if size >= dil * (kernel - 1) + 1:
        assert np.array_equal(convolution(ConvOptions(1, "valid", dil, groups), x, w, b),
                              convolution(ConvOptions(1, 0, dil, groups), x, w, b))


def test_same_padding_matches_torch():
    torch = _torch()
    F = torch.nn.functional
    rng = np.random.default_rng(1)
    for shape, k, d in [((2, 3, 9), (4,), 1), ((2, 3, 7, 6), (3, 2), (2, 1)),
                        ((1, 2, 5, 4, 6), (2, 3, 2), 1)]:
        x = rng.standard_normal(shape)
        w = rng.standard_normal((4, shape[1]) + k)
        fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(shape)]
        want = fn(torch.tensor(x), torch.tensor(w), padding="same", dilation=d).numpy()
        got = convolution(ConvOptions(1, "same", d), x, w, None)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_same_padding_errors():
    x, w = np.ones((1, 1, 5)), np.ones((1, 1, 3))
    with pytest.raises(DomainError, match="^convolution: padding 'same' needs stride 1"):
        convolution(ConvOptions(2, "same", 1), x, w, None)
    with pytest.raises(DomainError, match="^ConvOptions: padding"):
        ConvOptions(1, "full", 1)
    with pytest.raises(DomainError, match="^transposed_convolution: padding 'same'"):
        transposed_convolution(0, ConvOptions(1, "same", 1), x, w, None)
    with pytest.raises(DomainError, match="^convolution_ad: convolution: padding 'same'"):
        convolution_ad(ConvOptions((1, 2), "same", 1), np.ones((1, 1, 4, 4)),
                       np.ones((1, 1, 2, 2)), None)


@SETTINGS
@given(stride=st.integers(1, 3), dil=st.integers(1, 3), kernel=st.integers(1, 3),
       pad=st.integers(0, 2), size=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_output_padding_below_max_stride_dilation(stride, dil, kernel, pad, size, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 2, size))
    w = rng.standard_normal((2, 3, kernel))
    opts = ConvOptions(stride, pad, dil)
    limit = max(stride, dil)
    for op in range(limit):
        osz = (size - 1) * stride - 2 * pad + dil * (kernel - 1) + op + 1
        if osz < 1:
            continue
        y = transposed_convolution(op, opts, x, w, None)
        want = conv_transpose_reference(x, w, None, (stride,), (pad,), (dil,), (op,), 1)
        want = want[0] if isinstance(want, tuple) else want
        np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
        assert np.array_equal(transposed_convolution(op, opts, x[0], w, None), y[0])
    with pytest.raises(DomainError, match="max\\(stride, dilation\\)"):
        transposed_convolution(limit, opts, x, w, None)


def test_output_padding_matches_torch_when_dilation_exceeds_stride():
    torch = _torch()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 5, 4))
    w = rng.standard_normal((3, 2, 3, 2))
    got = transposed_convolution((2, 1), ConvOptions(1, 1, (3, 2)), x, w, None)
    want = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), padding=1,
                                                output_padding=(2, 1), dilation=(3, 2)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_unbatched_convolutions_equal_first_item():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 6, 5))
    w = rng.standard_normal((6, 2, 3, 3))
    opts = ConvOptions(2, 1, 1, 2)
    assert np.array_equal(convolution(opts, x[0], w, None), convolution(opts, x, w, None)[0])
    wt = rng.standard_normal((4, 3, 2, 2))
    assert np.array_equal(transposed_convolution(1, ConvOptions(2, 0, 1), x[0], wt, None),
                          transposed_convolution(1, ConvOptions(2, 0, 1), x, wt, None)[0])
    wd = rng.standard_normal((8, 1, 3, 3))
    assert np.array_equal(depthwise_convolution(ConvOptions(1, "same", 1), x[0], wd, None),
                          depthwise_convolution(ConvOptions(1, "same", 1), x, wd, None)[0])
    with pytest.raises(ShapeError, match="^convolution: weights must have"):
        convolution(opts, x[0, 0], w, None)


# =========================================================================== conv _ad twins
def test_conv_ad_same_unbatched_and_depthwise_gradients():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 7))
    w = rng.standard_normal((4, 2, 4))     # even kernel: asymmetric 'same' split
    b = rng.standard_normal(4)
    same = ConvOptions(1, "same", 1, 2)
    assert check_gradients(lambda x, w, b: ad.sum(convolution_ad(same, x, w, b) ** 2),
                           [x, w, b]) < 1e-6
    assert check_gradients(lambda x, w, b: ad.sum(convolution_ad(same, x, w, b) ** 2),
                           [x[0], w, b]) < 1e-6
    wd = rng.standard_normal((8, 1, 3))
    bd = rng.standard_normal(8)
    for opts in (ConvOptions(2, 1, 1), ConvOptions(1, "same", 2)):
        assert check_gradients(
            lambda x, w, b: ad.sum(depthwise_convolution_ad(opts, x, w, b) ** 2),
            [x, wd, bd]) < 1e-6
        assert np.array_equal(depthwise_convolution_ad(opts, x, wd, bd).value,
                              depthwise_convolution(opts, x, wd, bd))
    wt = rng.standard_normal((4, 2, 3))
    tr = ConvOptions(1, 0, 3)                # output_padding 2 >= stride, < dilation
    assert check_gradients(lambda x, w: ad.sum(transposed_convolution_ad(2, tr, x, w, None) ** 2),
                           [x, wt]) < 1e-6
    assert check_gradients(lambda x, w: ad.sum(transposed_convolution_ad(2, tr, x, w, None) ** 2),
                           [x[1], wt]) < 1e-6
    y = convolution_ad(same, ad.variable(x[0]), w, b)
    assert y.shape == (4, 7)
    assert np.array_equal(y.value, convolution(same, x[0], w, b))
    with pytest.raises(DomainError, match="^depthwise_convolution_ad: depthwise_convolution:"):
        depthwise_convolution_ad(ConvOptions(1, 0, 1, 3), x, wd, None)


# =========================================================================== empty batches
def test_empty_batches_plain_layers():
    z = np.zeros
    w2 = np.ones((3, 2, 3))
    assert convolution(ConvOptions(1, 1, 1), z((0, 2, 5)), w2, np.ones(3)).shape == (0, 3, 5)
    assert convolution(ConvOptions(1, "same", 1), z((0, 2, 5)), w2, None).shape == (0, 3, 5)
    assert transposed_convolution(0, ConvOptions(1, 0, 1), z((0, 3, 5)), w2,
                                  None).shape == (0, 2, 7)
    assert depthwise_convolution(ConvOptions(1, 0, 1), z((0, 2, 5)), np.ones((4, 1, 2)),
                                 None).shape == (0, 4, 4)
    assert dense(z((0, 3)), np.ones((2, 3)), np.ones(2)).shape == (0, 2)
    assert embedding(np.ones((4, 3)), np.zeros((0, 2), dtype=int)).shape == (0, 2, 3)
    rng = RNG(5)
    y, mask, rng2 = dropout(Mode.TRAINING, 0.5, rng, z((0, 4)))
    assert y.shape == mask.shape == (0, 4)
    y, mask, _ = spatial_dropout(Mode.TRAINING, 0.5, rng, z((0, 3, 4)))
    assert y.shape == mask.shape == (0, 3, 4)
    cache = append_cache(empty_cache(3, 2, 1), z((0, 2)), z((0, 1)))
    assert cache.length == 0 and cache_values(cache)[0].shape == (0, 2)
    out, wts = scaled_dot_product_attention(z((0, 2, 3, 4)), z((0, 2, 5, 4)), z((0, 2, 5, 6)))
    assert out.shape == (0, 2, 3, 6) and wts.shape == (0, 2, 3, 5)
    out, wts = scaled_dot_product_attention(z((1, 4, 3, 4)), z((1, 2, 5, 4)), z((1, 2, 5, 6)),
                                            enable_gqa=True)
    assert out.shape == (1, 4, 3, 6) and wts.shape == (1, 4, 3, 5)
    out, wts = scaled_dot_product_attention(z((0, 4, 3, 4)), z((0, 2, 5, 4)), z((0, 2, 5, 6)),
                                            enable_gqa=True)
    assert out.shape == (0, 4, 3, 6) and wts.shape == (0, 4, 3, 5)
    assert multihead_attention(2, z((0, 3, 4)), z((0, 5, 4)), z((0, 5, 2))).shape == (0, 3, 2)
    assert rotary_embedding(100.0, 0, z((0, 3, 4))).shape == (0, 3, 4)
    assert transformer_feed_forward(Activation.RELU, np.ones((2, 3)), None, np.ones((1, 2)),
                                    None, z((0, 3))).shape == (0, 1)
    y, st_ = batch_norm(Mode.INFERENCE, 0.1, 1e-5, np.ones(2), np.zeros(2),
                        BatchNormState.initial(2), z((0, 2, 3)))
    assert y.shape == (0, 2, 3)
    with pytest.raises(ShapeError, match="^batch_norm"):
        batch_norm(Mode.TRAINING, 0.1, 1e-5, np.ones(2), np.zeros(2),
                   BatchNormState.initial(2), z((0, 2, 3)))
    with pytest.raises(ShapeError, match="^convolution: x must not have an empty channel"):
        convolution(ConvOptions(1, 0, 1), z((1, 2, 0)), w2, None)


def test_empty_batches_ad_layers():
    z = np.zeros
    x = ad.variable(z((0, 2, 5)))
    w = ad.variable(np.ones((3, 2, 3)))
    b = ad.variable(np.ones(3))
    y = convolution_ad(ConvOptions(1, "same", 1), x, w, b)
    gx, gw, gb = ad.gradients(ad.sum(y), [x, w, b])
    assert y.shape == (0, 3, 5) and gx.shape == (0, 2, 5)
    assert np.array_equal(gw, z((3, 2, 3))) and np.array_equal(gb, z(3))
    wd = ad.variable(np.ones((4, 1, 2)))
    y = depthwise_convolution_ad(ConvOptions(1, 0, 1), x, wd, None)
    assert y.shape == (0, 4, 4)
    assert np.array_equal(ad.gradients(ad.sum(y), [wd])[0], z((4, 1, 2)))
    wt = ad.variable(np.ones((2, 3, 3)))
    y = transposed_convolution_ad(0, ConvOptions(1, 0, 1), x, wt, None)
    assert y.shape == (0, 3, 7)
    assert np.array_equal(ad.gradients(ad.sum(y), [wt])[0], z((2, 3, 3)))
    xd = ad.variable(z((0, 3)))
    wdn = ad.variable(np.ones((2, 3)))
    y = dense_ad(xd, wdn, None)
    assert y.shape == (0, 2) and np.array_equal(ad.gradients(ad.sum(y), [wdn])[0], z((2, 3)))
    tab = ad.variable(np.ones((4, 3)))
    y = embedding_ad(tab, np.zeros((0,), dtype=int))
    assert y.shape == (0, 3) and np.array_equal(ad.gradients(ad.sum(y), [tab])[0], z((4, 3)))
    y, mask, _ = spatial_dropout_ad(Mode.TRAINING, 0.3, RNG(1), x)
    assert y.shape == (0, 2, 5)
    y, mask, _ = dropout_ad(Mode.TRAINING, 0.3, RNG(1), x)
    assert y.shape == (0, 2, 5)
    q = ad.variable(z((0, 2, 3, 4)))
    kv = ad.variable(z((0, 1, 5, 4)))
    y = scaled_dot_product_attention_ad(q, kv, kv, enable_gqa=True)
    assert y.shape == (0, 2, 3, 4)
    gq, gk = ad.gradients(ad.sum(y), [q, kv])
    assert gq.shape == (0, 2, 3, 4) and gk.shape == (0, 1, 5, 4)
    y = multihead_attention_ad(2, z((0, 3, 4)), z((0, 5, 4)), ad.variable(z((0, 5, 2))))
    assert y.shape == (0, 3, 2)
    r = ad.variable(z((0, 3, 4)))
    y = rotary_embedding_ad(10.0, 2, r)
    assert y.shape == (0, 3, 4) and ad.gradients(ad.sum(y), [r])[0].shape == (0, 3, 4)
    w1 = ad.variable(np.ones((2, 3)))
    y = transformer_feed_forward_ad(Activation.GELU, w1, None, np.ones((1, 2)), None, z((0, 3)))
    assert y.shape == (0, 1) and np.array_equal(ad.gradients(ad.sum(y), [w1])[0], z((2, 3)))
    y, _ = batch_norm_ad(Mode.INFERENCE, 0.1, 1e-5, np.ones(2), np.zeros(2),
                         BatchNormState.initial(2), ad.variable(z((0, 2, 3))))
    assert y.shape == (0, 2, 3)


# =========================================================================== embedding
def test_embedding_checks_only_gathered_rows():
    w = np.arange(12.0).reshape(4, 3)
    w[2, 1] = np.nan
    w[3, 0] = np.inf
    idx = np.array([[0, 1], [1, 0]])
    assert np.array_equal(embedding(w, idx), np.take(w, idx, axis=0))
    with pytest.raises(NonFiniteError, match=r"^embedding: weights\[2, 1\] = nan .*indices\[1, 0\]"):
        embedding(w, [[0, 1], [2, 1]])
    with pytest.raises(NonFiniteError, match=r"^embedding: weights\[3, 0\] = inf"):
        embedding(w, [3])
    with pytest.raises(IndexOutOfRange, match="^embedding"):
        embedding(w, [4])
    tab = ad.variable(w[:2])
    y = embedding_ad(tab, [1, 1, 0])
    g = ad.gradients(ad.sum(y), [tab])[0]
    assert np.array_equal(g, np.array([[1.0] * 3, [2.0] * 3]))


@SETTINGS
@given(v=st.integers(1, 40), f=st.integers(1, 9), shape=st.lists(st.integers(0, 5), max_size=3),
       seed=st.integers(0, 2 ** 16))
def test_embedding_equals_take(v, f, shape, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((v, f))
    idx = rng.integers(0, v, size=tuple(shape))
    got = embedding(w, idx)
    assert got.shape == tuple(shape) + (f,) and got.flags.c_contiguous
    assert np.array_equal(got, np.take(w, idx, axis=0))


# =========================================================================== attention
@SETTINGS
@given(hk=st.integers(1, 3), g=st.integers(1, 3), n=st.integers(1, 5), m=st.integers(0, 5),
       d=st.integers(1, 5), f=st.integers(1, 4), scale=st.one_of(st.none(), st.floats(-2, 2)),
       causal=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gqa_scale_causal_match_oracle(hk, g, n, m, d, f, scale, causal, seed):
    if scale is not None and scale == 0.0:
        scale = None
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, hk * g, n, d))
    k = rng.standard_normal((2, hk, m, d))
    v = rng.standard_normal((2, hk, m, f))
    out, wts = scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal,
                                            enable_gqa=True)
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    mask = None
    if causal:
        mask = np.broadcast_to(np.arange(m)[None, :] <= np.arange(n)[:, None], q.shape[:2] + (n, m))
    sc = 1.0 / np.sqrt(d) if scale is None else scale
    want_o, want_w = attention_oracle(q, kk, vv, mask, sc)
    np.testing.assert_allclose(out, want_o, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(wts, want_w, rtol=1e-10, atol=1e-12)
    if g == 1 and scale is None and not causal:
        # without the options: the plain call, bit for bit
        o2, w2 = scaled_dot_product_attention(q, k, v)
        assert np.array_equal(o2, out) and np.array_equal(w2, wts)


def test_default_scale_keeps_the_seed_formula():
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((3, 4, 3)), rng.standard_normal((3, 5, 3)), rng.standard_normal((3, 5, 2))
    out, wts = scaled_dot_product_attention(q, k, v)
    want_o, want_w = sdpa_reference(q, k, v)
    np.testing.assert_allclose(out, want_o, rtol=1e-13, atol=1e-15)
    o2, _ = scaled_dot_product_attention(q, k, v, scale=None, is_causal=False, enable_gqa=False)
    assert np.array_equal(out, o2)


def test_mask_and_bias_broadcast_over_leading_axes():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 3, 4, 5))
    k = rng.standard_normal((2, 3, 6, 5))
    v = rng.standard_normal((2, 3, 6, 2))
    for mshape in [(4, 6), (1, 4, 6), (3, 4, 6), (2, 1, 4, 6), (1, 1, 4, 6), (2, 3, 4, 6)]:
        mask = rng.random(mshape) > 0.3
        bias = rng.standard_normal(mshape)
        full_m = np.broadcast_to(mask, (2, 3, 4, 6))
        full_b = np.ascontiguousarray(np.broadcast_to(bias, (2, 3, 4, 6)))
        out, wts = scaled_dot_product_attention(q, k, v, mask, bias)
        o2, w2 = scaled_dot_product_attention(q, k, v, np.ascontiguousarray(full_m), full_b)
        assert np.array_equal(out, o2) and np.array_equal(wts, w2), mshape
        h = multihead_attention(1, q, k, v, mask)
        assert np.array_equal(h, multihead_attention(1, q, k, v, np.ascontiguousarray(full_m)))
    for bad in [(2, 4, 6), (3, 1, 1, 4, 6), (4, 5)]:
        with pytest.raises(ShapeError, match="^scaled_dot_product_attention: mask"):
            scaled_dot_product_attention(q, k, v, np.ones(bad, bool))


def test_attention_matches_torch_options():
    torch = _torch()
    F = torch.nn.functional
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 6, 5, 8))
    k = rng.standard_normal((2, 2, 7, 8))
    v = rng.standard_normal((2, 2, 7, 3))
    t = [torch.tensor(a) for a in (q, k, v)]
    out, _ = scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    want = F.scaled_dot_product_attention(*t, is_causal=True, scale=0.3, enable_gqa=True).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13)
    mask = rng.random((1, 5, 7)) > 0.2
    mask[..., 0] = True          # torch gives NaN for fully masked rows
    out, _ = scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
    want = F.scaled_dot_product_attention(*t, attn_mask=torch.tensor(mask), enable_gqa=True).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13)


def test_attention_option_errors():
    q = k = v = np.ones((2, 4, 3, 2))
    with pytest.raises(DomainError, match="^scaled_dot_product_attention: is_causal=True and an explicit mask"):
        scaled_dot_product_attention(q, k, v, np.ones((3, 3), bool), is_causal=True)
    with pytest.raises(DomainError, match="^multihead_attention: is_causal=True and an explicit mask"):
        multihead_attention(2, q, k, v, np.ones((3, 3), bool), is_causal=True)
    for bad in (0.0, np.nan, np.inf):
        with pytest.raises(DomainError, match="^scaled_dot_product_attention: scale"):
            scaled_dot_product_attention(q, k, v, scale=bad)
        with pytest.raises(DomainError, match="^multihead_attention: scale"):
            multihead_attention(2, q, k, v, scale=bad)
    with pytest.raises(ShapeError, match="^scaled_dot_product_attention: with enable_gqa"):
        scaled_dot_product_attention(np.ones((2, 4, 3, 2)), np.ones((2, 3, 3, 2)),
                                     np.ones((2, 3, 3, 2)), enable_gqa=True)
    with pytest.raises(ShapeError, match="^scaled_dot_product_attention: with enable_gqa"):
        scaled_dot_product_attention(np.ones((2, 4, 3, 2)), np.ones((2, 2, 3, 2)),
                                     np.ones((2, 1, 3, 2)), enable_gqa=True)
    with pytest.raises(ShapeError, match="^scaled_dot_product_attention: q, k and v"):
        scaled_dot_product_attention(np.ones((4, 3, 2)), np.ones((2, 3, 2)), np.ones((2, 3, 2)))
    with pytest.raises(ShapeError, match="^scaled_dot_product_attention_ad: scaled_dot_product"):
        scaled_dot_product_attention_ad(np.ones((4, 3, 2)), np.ones((3, 3, 2)),
                                        np.ones((3, 3, 2)), enable_gqa=True)


def test_multihead_scale_and_causal_match_per_head_sdpa():
    rng = np.random.default_rng(9)
    q, k, v = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 7, 6)), rng.standard_normal((2, 7, 4))
    out = multihead_attention(2, q, k, v, scale=0.7, is_causal=True)
    for h in range(2):
        o, _ = scaled_dot_product_attention(q[..., 3 * h:3 * h + 3], k[..., 3 * h:3 * h + 3],
                                            v[..., 2 * h:2 * h + 2], scale=0.7, is_causal=True)
        assert np.array_equal(out[..., 2 * h:2 * h + 2], o)


# =========================================================================== attention _ad
def test_attention_ad_options_gradients_and_forward_bits():
    rng = np.random.default_rng(10)
    q = rng.standard_normal((2, 4, 3, 5))
    k = rng.standard_normal((2, 2, 4, 5))
    v = rng.standard_normal((2, 2, 4, 3))
    mask = rng.random((1, 3, 4)) > 0.3
    for kw in (dict(enable_gqa=True, scale=-0.6), dict(enable_gqa=True, is_causal=True),
               dict(enable_gqa=True, mask=mask)):
        assert check_gradients(
            lambda q, k, v: ad.sum(scaled_dot_product_attention_ad(q, k, v, **kw) ** 2),
            [q, k, v]) < 1e-6
        assert np.array_equal(scaled_dot_product_attention_ad(q, k, v, **kw).value,
                              scaled_dot_product_attention(q, k, v, **kw)[0])
    q2, k2, v2 = rng.standard_normal((3, 4, 6)), rng.standard_normal((3, 5, 6)), rng.standard_normal((3, 5, 4))
    for kw in (dict(scale=0.4), dict(is_causal=True), dict(mask=rng.random((1, 4, 5)) > 0.4)):
        assert check_gradients(lambda q, k, v: ad.sum(multihead_attention_ad(2, q, k, v, **kw) ** 2),
                               [q2, k2, v2]) < 1e-6
        assert np.array_equal(multihead_attention_ad(2, q2, k2, v2, **kw).value,
                              multihead_attention(2, q2, k2, v2, **kw))


def test_attention_ad_gqa_gradient_equals_expanded_heads():
    """The gradient of a shared key/value head is the sum of the gradients of its query
    heads' copies (the expanded model, an independent path through the code)."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((4, 3, 2))
    k = rng.standard_normal((2, 5, 2))
    v = rng.standard_normal((2, 5, 3))
    cot = rng.standard_normal((4, 3, 3))
    kv, vv = ad.variable(k), ad.variable(v)
    y = scaled_dot_product_attention_ad(q, kv, vv, enable_gqa=True)
    gk, gv = ad.gradients(y, [kv, vv], cot)
    ke, ve = ad.variable(np.repeat(k, 2, axis=0)), ad.variable(np.repeat(v, 2, axis=0))
    ye = scaled_dot_product_attention_ad(q, ke, ve)
    assert np.array_equal(ye.value, y.value)
    gke, gve = ad.gradients(ye, [ke, ve], cot)
    assert np.array_equal(gk, gke[0::2] + gke[1::2])
    assert np.array_equal(gv, gve[0::2] + gve[1::2])


# =========================================================================== other twins
def test_rotary_and_feed_forward_ad():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 5, 6))
    assert check_gradients(lambda x: ad.sum(rotary_embedding_ad(1000.0, 3, x) ** 3), [x]) < 1e-6
    assert np.array_equal(rotary_embedding_ad(1000.0, 3, x).value, rotary_embedding(1000.0, 3, x))
    with pytest.raises(ShapeError, match="^rotary_embedding_ad: rotary_embedding"):
        rotary_embedding_ad(10.0, 0, np.ones((3, 5)))
    w1, b1 = rng.standard_normal((7, 6)), rng.standard_normal(7)
    w2, b2 = rng.standard_normal((3, 7)), rng.standard_normal(3)
    for act in (Activation.GELU, Activation.SILU, Activation.TANH):
        assert check_gradients(
            lambda w1, b1, w2, b2, x: ad.sum(transformer_feed_forward_ad(act, w1, b1, w2, b2, x) ** 2),
            [w1, b1, w2, b2, x]) < 1e-6
        assert np.array_equal(transformer_feed_forward_ad(act, w1, b1, w2, b2, x).value,
                              transformer_feed_forward(act, w1, b1, w2, b2, x))
    with pytest.raises(ShapeError, match="^transformer_feed_forward_ad: transformer_feed_forward"):
        transformer_feed_forward_ad(Activation.GELU, w1, b1, w2, b2, x[..., :5])
    with pytest.raises(TypeError, match="^transformer_feed_forward_ad"):
        transformer_feed_forward_ad("gelu", w1, b1, w2, b2, x)


def test_spatial_dropout_ad_mask_rng_and_gradient():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 4, 5))
    xv = ad.variable(x)
    y, mask, r2 = spatial_dropout_ad(Mode.TRAINING, 0.4, RNG(3), xv)
    y0, mask0, r0 = spatial_dropout(Mode.TRAINING, 0.4, RNG(3), x)
    assert np.array_equal(y.value, y0) and np.array_equal(mask, mask0) and r2 == r0
    cot = rng.standard_normal(x.shape)
    assert np.array_equal(ad.gradients(y, [xv], cot)[0], cot * mask0)
    with pytest.raises(ShapeError, match="^spatial_dropout_ad: spatial_dropout"):
        spatial_dropout_ad(Mode.TRAINING, 0.4, RNG(3), np.ones(3))
