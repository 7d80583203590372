"""Training steps (forward + backward) on the autodiff tape, with torch float64 peers.

* ``TrainCNN``: conv 1->16 k3 p1, ReLU, max-pool 2, conv 16->32 k3 p1, ReLU, max-pool 2,
  dense 128->10, cross-entropy; a batch of 8x8 images.
* ``TrainTransformer``: 2-layer char transformer (d=64, 4 heads, ff 256, GELU, pre-norm
  layer norm with affine, learned positions, causal mask), vocabulary 64, sequence 64.
* ``TrainMLP``: a 2-layer MLP step with a hand-written numpy backward as the numpy peer
  (numpy has no autodiff; this bounds the tape's overhead).

Each ``time_*`` runs one step: build the graph, compute the loss and all parameter
gradients.  ``setup`` runs a step first so compilation is never measured.
"""

import numpy as np

from hmath_dl import autodiff as ad
from hmath_dl import layers as L
from hmath_dl.activations import Activation

from .common import TORCH, normal, skip_without_torch

# ----------------------------------------------------------------------------- CNN
CONV = L.ConvOptions(1, 1, 1, 1)


def cnn_params(seed=0):
    return [normal((16, 1, 3, 3), seed, 1 / 3), normal((16,), seed + 1, 0.1),
            normal((32, 16, 3, 3), seed + 2, 1 / 12), normal((32,), seed + 3, 0.1),
            normal((10, 128), seed + 4, 1 / 11), normal((10,), seed + 5, 0.1)]


def cnn_data(batch, seed=10):
    x = normal((batch, 1, 8, 8), seed)
    y = np.random.default_rng(seed).integers(0, 10, size=batch)
    return x, y


def cnn_step(params, x, y):
    """Loss and gradients of the small CNN (hmath_dl)."""
    vs = [ad.variable(p) for p in params]
    w1, b1, w2, b2, w3, b3 = vs
    h = ad.activate(Activation.RELU, L.convolution_ad(CONV, x, w1, b1))
    h = L.pooling_ad(L.PoolMode.MAX, 2, 2, 0, h)
    h = ad.activate(Activation.RELU, L.convolution_ad(CONV, h, w2, b2))
    h = L.pooling_ad(L.PoolMode.MAX, 2, 2, 0, h)
    logits = L.dense_ad(ad.reshape(h, (h.shape[0], -1)), w3, b3)
    loss = ad.cross_entropy(logits, y)
    return loss, ad.gradients(loss, vs)


def torch_cnn_step(params, x, y):
    F = TORCH.nn.functional
    ps = [p.detach().requires_grad_(True) for p in params]
    w1, b1, w2, b2, w3, b3 = ps
    h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, w2, b2, padding=1)), 2)
    loss = F.cross_entropy(F.linear(h.reshape(h.shape[0], -1), w3, b3), y)
    return loss, TORCH.autograd.grad(loss, ps)


# ----------------------------------------------------------------------------- transformer
VOCAB, D, HEADS, FF, SEQ, LAYERS = 64, 64, 4, 256, 64, 2


def transformer_params(seed=0):
    s = 1 / np.sqrt(D)
    ps = [normal((VOCAB, D), seed, 1.0), normal((SEQ, D), seed + 1, 0.1)]
    for i in range(LAYERS):
        b = seed + 10 * (i + 1)
        ps += [np.ones(D), np.zeros(D),
               normal((D, D), b, s), np.zeros(D), normal((D, D), b + 1, s), np.zeros(D),
               normal((D, D), b + 2, s), np.zeros(D), normal((D, D), b + 3, s), np.zeros(D),
               np.ones(D), np.zeros(D),
               normal((FF, D), b + 4, s), np.zeros(FF), normal((D, FF), b + 5, 1 / np.sqrt(FF)),
               np.zeros(D)]
    ps += [np.ones(D), np.zeros(D), normal((VOCAB, D), seed + 99, s), np.zeros(VOCAB)]
    return ps


def transformer_data(batch, seed=20):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(batch, SEQ))
    targets = rng.integers(0, VOCAB, size=(batch, SEQ))
    return tokens, targets


CAUSAL = np.tril(np.ones((SEQ, SEQ), dtype=bool))


def transformer_step(params, tokens, targets):
    """Loss and gradients of the 2-layer char transformer (hmath_dl)."""
    vs = [ad.variable(p) for p in params]
    it = iter(vs)
    emb, pos = next(it), next(it)
    x = L.embedding_ad(emb, tokens) + pos
    for _ in range(LAYERS):
        g1, c1, wq, bq, wk, bk, wv, bv, wo, bo, g2, c2, w1, b1, w2, b2 = (next(it) for _ in range(16))
        h = L.layer_norm_ad(1, 1e-5, x, weight=g1, bias=c1)
        a = L.multihead_attention_ad(HEADS, L.dense_ad(h, wq, bq), L.dense_ad(h, wk, bk),
                                     L.dense_ad(h, wv, bv), CAUSAL)
        x = x + L.dense_ad(a, wo, bo)
        h = L.layer_norm_ad(1, 1e-5, x, weight=g2, bias=c2)
        x = x + L.dense_ad(ad.activate(Activation.GELU, L.dense_ad(h, w1, b1)), w2, b2)
    gf, cf, wout, bout = (next(it) for _ in range(4))
    h = L.layer_norm_ad(1, 1e-5, x, weight=gf, bias=cf)
    logits = L.dense_ad(h, wout, bout)
    loss = ad.cross_entropy(ad.reshape(logits, (-1, VOCAB)), targets.reshape(-1))
    return loss, ad.gradients(loss, vs)


def torch_transformer_step(params, tokens, targets, mask):
    F = TORCH.nn.functional
    ps = [p.detach().requires_grad_(True) for p in params]
    it = iter(ps)
    emb, pos = next(it), next(it)
    x = F.embedding(tokens, emb) + pos
    B = tokens.shape[0]

    def heads(t):
        return t.view(B, SEQ, HEADS, D // HEADS).transpose(1, 2)

    for _ in range(LAYERS):
        g1, c1, wq, bq, wk, bk, wv, bv, wo, bo, g2, c2, w1, b1, w2, b2 = (next(it) for _ in range(16))
        h = F.layer_norm(x, (D,), g1, c1, 1e-5)
        a = F.scaled_dot_product_attention(heads(F.linear(h, wq, bq)), heads(F.linear(h, wk, bk)),
                                           heads(F.linear(h, wv, bv)), attn_mask=mask)
        x = x + F.linear(a.transpose(1, 2).reshape(B, SEQ, D), wo, bo)
        h = F.layer_norm(x, (D,), g2, c2, 1e-5)
        x = x + F.linear(F.gelu(F.linear(h, w1, b1)), w2, b2)
    gf, cf, wout, bout = (next(it) for _ in range(4))
    logits = F.linear(F.layer_norm(x, (D,), gf, cf, 1e-5), wout, bout)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    return loss, TORCH.autograd.grad(loss, ps)


# ----------------------------------------------------------------------------- MLP
def mlp_params(n_in, hidden, n_out, seed=0):
    return [normal((hidden, n_in), seed, 1 / np.sqrt(n_in)), np.zeros(hidden),
            normal((n_out, hidden), seed + 1, 1 / np.sqrt(hidden)), np.zeros(n_out)]


def mlp_step(params, x, y):
    vs = [ad.variable(p) for p in params]
    w1, b1, w2, b2 = vs
    h = ad.tanh(L.dense_ad(x, w1, b1))
    loss = ad.cross_entropy(L.dense_ad(h, w2, b2), y)
    return loss, ad.gradients(loss, vs)


def numpy_mlp_step(params, x, y):
    """Hand-written forward and backward in numpy (the numpy peer)."""
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1.T + b1)
    z = h @ w2.T + b2
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=1, keepdims=True)
    n = x.shape[0]
    loss = -np.log(p[np.arange(n), y]).mean()
    dz = p
    dz[np.arange(n), y] -= 1.0
    dz /= n
    gw2, gb2 = dz.T @ h, dz.sum(0)
    dh = (dz @ w2) * (1.0 - h * h)
    return loss, [dh.T @ x, dh.sum(0), gw2, gb2]


# ----------------------------------------------------------------------------- asv
class TrainCNN:
    params = [16, 64]
    param_names = ["batch"]

    def setup(self, batch):
        self.p = cnn_params()
        self.x, self.y = cnn_data(batch)
        cnn_step(self.p, self.x, self.y)

    def time_hmath_dl(self, batch):
        cnn_step(self.p, self.x, self.y)


class TrainCNNTorch:
    params = [16, 64]
    param_names = ["batch"]

    def setup(self, batch):
        skip_without_torch()
        x, y = cnn_data(batch)
        self.p = [TORCH.from_numpy(np.array(a)) for a in cnn_params()]
        self.x, self.y = TORCH.from_numpy(np.array(x)), TORCH.from_numpy(y)
        torch_cnn_step(self.p, self.x, self.y)

    def time_torch_float64(self, batch):
        torch_cnn_step(self.p, self.x, self.y)


class TrainTransformer:
    params = [4, 16]
    param_names = ["batch"]
    timeout = 300

    def setup(self, batch):
        self.p = transformer_params()
        self.t, self.y = transformer_data(batch)
        transformer_step(self.p, self.t, self.y)

    def time_hmath_dl(self, batch):
        transformer_step(self.p, self.t, self.y)


class TrainTransformerTorch:
    params = [4, 16]
    param_names = ["batch"]

    def setup(self, batch):
        skip_without_torch()
        t, y = transformer_data(batch)
        self.p = [TORCH.from_numpy(np.array(a, dtype=np.float64)) for a in transformer_params()]
        self.t, self.y = TORCH.from_numpy(t), TORCH.from_numpy(y)
        self.mask = TORCH.from_numpy(CAUSAL.copy())
        torch_transformer_step(self.p, self.t, self.y, self.mask)

    def time_torch_float64(self, batch):
        torch_transformer_step(self.p, self.t, self.y, self.mask)


class TrainMLP:
    params = [64, 512]
    param_names = ["batch"]

    def setup(self, batch):
        self.p = mlp_params(64, 128, 10)
        self.x = normal((batch, 64), 3)
        self.y = np.random.default_rng(3).integers(0, 10, size=batch)
        mlp_step(self.p, self.x, self.y)
        numpy_mlp_step(self.p, self.x, self.y)

    def time_hmath_dl(self, batch):
        mlp_step(self.p, self.x, self.y)

    def time_numpy_manual_backward(self, batch):
        numpy_mlp_step(self.p, self.x, self.y)


class OptimizerStep:
    params = [10_000, 1_000_000]
    param_names = ["size"]

    def setup(self, size):
        from hmath_dl import optim
        self.optim = optim
        self.p = [np.array(normal((size,), 1))]
        self.g = [np.array(normal((size,), 2))]
        self.state = optim.adamw_init(self.p)
        optim.adamw_step(self.state, self.p, self.g, 1e-3)

    def time_adamw(self, size):
        self.optim.adamw_step(self.state, self.p, self.g, 1e-3)

    def time_numpy_adamw(self, size):
        p, g = self.p[0], self.g[0]
        m = 0.1 * g
        v = 0.001 * g * g
        p * (1 - 1e-5) - 1e-2 * m / (np.sqrt(v) / np.sqrt(1e-3) + 1e-8)
