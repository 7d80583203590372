"""Differentiable layers: one forward + reverse pass of a single layer, against torch
autograd (float64).

Each ``time_forward_backward`` builds the tape from fresh variables, runs the layer and
asks for the gradients of every differentiable argument under a fixed random cotangent
(``gradients(y, wrt, cotangent)``); the torch peer does the same with
``torch.autograd.grad(y, inputs, cotangent)``.  ``setup`` runs one pass first, so JIT
compilation is never measured.  (The whole-network training steps are in
bench_autodiff.py.)
"""

import numpy as np

from hmath_dl import autodiff as ad
from hmath_dl.layers import (BatchNormState, ConvOptions, Mode, PoolMode, batch_norm_ad,
                             convolution_ad, dense_ad, dropout_ad, embedding_ad,
                             layer_norm_ad, multihead_attention_ad, pooling_ad, rms_norm_ad,
                             scaled_dot_product_attention_ad, transposed_convolution_ad)
from hmath_dl.rng import RNG

from .common import TORCH, normal, skip_without_torch, torch_tensor

EPS = 1e-5


class _Ours:
    """Subclasses define ``params`` and ``make(size) -> (arrays, fn)`` where
    ``fn(*variables)`` returns the output ADTensor; the cotangent is drawn to its shape."""

    timeout = 300

    def setup(self, size):
        self.arrays, self.fn = self.make(size)
        self.cot = None
        vs = [ad.variable(a) for a in self.arrays]
        self.cot = np.array(normal(tuple(self.fn(*vs).shape), 99))
        self.time_forward_backward(size)  # compile / load every kernel

    def time_forward_backward(self, size):
        vs = [ad.variable(a) for a in self.arrays]
        ad.gradients(self.fn(*vs), vs, self.cot)


class _Torch:
    timeout = 300

    def setup(self, size):
        skip_without_torch()
        arrays, self.fn = self.make(size)
        self.tensors = [torch_tensor(a) for a in arrays]
        self.cot = torch_tensor(normal(tuple(self.fn(*self.tensors).shape), 99))
        self.time_torch_forward_backward(size)

    def time_torch_forward_backward(self, size):
        ts = [t.detach().requires_grad_(True) for t in self.tensors]
        TORCH.autograd.grad(self.fn(*ts), ts, self.cot)


# ----------------------------------------------------------------------------- dense
DENSE = [(128, 512), (512, 1024)]  # (batch, features): x [B, F], w [F, F], bias [F]


def _dense_arrays(bf):
    b, f = bf
    return [normal((b, f), 1), normal((f, f), 2, 1 / np.sqrt(f)), normal((f,), 3)]


class DenseAD(_Ours):
    params = [DENSE]
    param_names = ["batch_features"]

    def make(self, bf):
        return _dense_arrays(bf), dense_ad


class TorchDenseAD(_Torch):
    params = [DENSE]
    param_names = ["batch_features"]

    def make(self, bf):
        return _dense_arrays(bf), TORCH.nn.functional.linear


# ----------------------------------------------------------------------------- conv2d
CONV_SIDES = [16, 32]  # x [8, 32, S, S], w [64, 32, 3, 3], padding 1


def _conv_arrays(side):
    return [normal((8, 32, side, side), 4), normal((64, 32, 3, 3), 5, 1 / 17), normal((64,), 6)]


class ConvolutionAD(_Ours):
    params = [CONV_SIDES]
    param_names = ["side"]

    def make(self, side):
        opts = ConvOptions(1, 1, 1)
        return _conv_arrays(side), lambda x, w, b: convolution_ad(opts, x, w, b)


class TorchConvolutionAD(_Torch):
    params = [CONV_SIDES]
    param_names = ["side"]

    def make(self, side):
        return _conv_arrays(side), lambda x, w, b: TORCH.nn.functional.conv2d(x, w, b, padding=1)


# ----------------------------------------------------------------------------- transposed conv2d
TCONV_SIDES = [8, 16]  # x [8, 64, S, S], w [64, 64, 4, 4], stride 2


def _tconv_arrays(side):
    return [normal((8, 64, side, side), 7), normal((64, 64, 4, 4), 8, 1 / 32), normal((64,), 9)]


class TransposedConvolutionAD(_Ours):
    params = [TCONV_SIDES]
    param_names = ["side"]

    def make(self, side):
        opts = ConvOptions(2, 0, 1)
        return _tconv_arrays(side), lambda x, w, b: transposed_convolution_ad(0, opts, x, w, b)


class TorchTransposedConvolutionAD(_Torch):
    params = [TCONV_SIDES]
    param_names = ["side"]

    def make(self, side):
        return _tconv_arrays(side), lambda x, w, b: TORCH.nn.functional.conv_transpose2d(x, w, b, stride=2)


# ----------------------------------------------------------------------------- pooling
POOL = [[28, 56], ["MAX", "AVERAGE"]]  # x [8, 64, S, S], window 3, stride 2, padding 1


class PoolingAD(_Ours):
    params = POOL
    param_names = ["side", "mode"]

    def setup(self, side, mode):
        self.mode = PoolMode[mode]
        super().setup(side)

    def make(self, side):
        return [normal((8, 64, side, side), 10)], lambda x: pooling_ad(self.mode, 3, 2, 1, x)

    def time_forward_backward(self, side, mode=None):
        super().time_forward_backward(side)


class TorchPoolingAD(_Torch):
    params = POOL
    param_names = ["side", "mode"]

    def setup(self, side, mode):
        skip_without_torch()
        F = TORCH.nn.functional
        self.pool = (lambda x: F.max_pool2d(x, 3, 2, 1)) if mode == "MAX" else \
            (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False))
        super().setup(side)

    def make(self, side):
        return [normal((8, 64, side, side), 10)], self.pool

    def time_torch_forward_backward(self, side, mode=None):
        super().time_torch_forward_backward(side)


# ----------------------------------------------------------------------------- batch norm
BN_SIDES = [28, 56]  # x [16, 64, S, S], TRAINING, affine


def _bn_arrays(side):
    return [normal((16, 64, side, side), 11), 1.0 + normal((64,), 12, 0.1), normal((64,), 13, 0.1)]


class BatchNormAD(_Ours):
    params = [BN_SIDES]
    param_names = ["side"]

    def make(self, side):
        state = BatchNormState.initial(64)
        return _bn_arrays(side), lambda x, g, b: batch_norm_ad(Mode.TRAINING, 0.1, EPS, g, b, state, x)[0]


class TorchBatchNormAD(_Torch):
    params = [BN_SIDES]
    param_names = ["side"]

    def make(self, side):
        f64 = TORCH.float64
        rm, rv = TORCH.zeros(64, dtype=f64), TORCH.ones(64, dtype=f64)
        return _bn_arrays(side), lambda x, g, b: TORCH.nn.functional.batch_norm(
            x, rm, rv, g, b, training=True, momentum=0.1, eps=EPS)


# ----------------------------------------------------------------------------- layer / rms norm
ROWS = [(16, 128, 768), (16, 512, 768)]  # over the last axis, no affine


class LayerNormAD(_Ours):
    params = [ROWS]
    param_names = ["shape"]

    def make(self, shape):
        return [normal(shape, 14)], lambda x: layer_norm_ad(1, EPS, x)


class TorchLayerNormAD(_Torch):
    params = [ROWS]
    param_names = ["shape"]

    def make(self, shape):
        return [normal(shape, 14)], lambda x: TORCH.nn.functional.layer_norm(x, (shape[-1],), eps=EPS)


class RMSNormAD(_Ours):
    params = [ROWS]
    param_names = ["shape"]

    def make(self, shape):
        return [normal(shape, 15)], lambda x: rms_norm_ad(1, EPS, x)


class TorchRMSNormAD(_Torch):
    params = [ROWS]
    param_names = ["shape"]

    def make(self, shape):
        return [normal(shape, 15)], lambda x: TORCH.nn.functional.rms_norm(x, (shape[-1],), eps=EPS)


# ----------------------------------------------------------------------------- attention
SEQ = [128, 512]  # SDPA q = k = v [8, N, 64] causal; multi-head [N, 512], 8 heads, causal


def _qkv(n, shape):
    return [normal(shape, 16), normal(shape, 17), normal(shape, 18)]


class ScaledDotProductAttentionAD(_Ours):
    params = [SEQ]
    param_names = ["n"]

    def make(self, n):
        mask = np.tril(np.ones((n, n), dtype=bool))
        return _qkv(n, (8, n, 64)), lambda q, k, v: scaled_dot_product_attention_ad(q, k, v, mask)


class TorchScaledDotProductAttentionAD(_Torch):
    params = [SEQ]
    param_names = ["n"]

    def make(self, n):
        f = TORCH.nn.functional.scaled_dot_product_attention
        return _qkv(n, (8, n, 64)), lambda q, k, v: f(q, k, v, is_causal=True)


class MultiheadAttentionAD(_Ours):
    params = [SEQ]
    param_names = ["n"]

    def make(self, n):
        mask = np.tril(np.ones((n, n), dtype=bool))
        return _qkv(n, (n, 512)), lambda q, k, v: multihead_attention_ad(8, q, k, v, mask)


class TorchMultiheadAttentionAD(_Torch):
    params = [SEQ]
    param_names = ["n"]

    def make(self, n):
        f = TORCH.nn.functional.scaled_dot_product_attention

        def mha(q, k, v):  # head split / merge included, as in ours
            h = [t.reshape(n, 8, 64).transpose(0, 1) for t in (q, k, v)]
            return f(*h, is_causal=True).transpose(0, 1).reshape(n, 512)
        return _qkv(n, (n, 512)), mha


# ----------------------------------------------------------------------------- embedding
EMB = [(1000, 64), (50000, 512)]  # (vocabulary, features); indices [32, 128]


def _indices(v):
    return np.random.default_rng(19).integers(0, v, (32, 128))


class EmbeddingAD(_Ours):
    params = [EMB]
    param_names = ["vocab_features"]

    def make(self, vf):
        idx = _indices(vf[0])
        return [normal(vf, 20)], lambda w: embedding_ad(w, idx)


class TorchEmbeddingAD(_Torch):
    params = [EMB]
    param_names = ["vocab_features"]

    def make(self, vf):
        idx = TORCH.from_numpy(_indices(vf[0]))
        return [normal(vf, 20)], lambda w: TORCH.nn.functional.embedding(idx, w)


# ----------------------------------------------------------------------------- dropout
DROP = [(256, 1024), (1024, 4096)]  # TRAINING, p = 0.1


class DropoutAD(_Ours):
    params = [DROP]
    param_names = ["shape"]

    def make(self, shape):
        rng = RNG.from_seed(0)
        return [normal(shape, 21)], lambda x: dropout_ad(Mode.TRAINING, 0.1, rng, x)[0]


class TorchDropoutAD(_Torch):
    params = [DROP]
    param_names = ["shape"]

    def make(self, shape):
        return [normal(shape, 21)], lambda x: TORCH.nn.functional.dropout(x, 0.1, True)
