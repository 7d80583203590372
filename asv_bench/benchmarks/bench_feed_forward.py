"""The transformer feed-forward block ``dense(activate(act, dense(x, w1, b1)), w2, b2)``
against the numpy expression and torch float64 (linear, gelu / relu, linear).

x ``[N, 512]``, w1 ``[2048, 512]``, w2 ``[512, 2048]`` for N = 128 and 512.
"""

import math

import numpy as np

from hmath_dl.activations import Activation
from hmath_dl.layers import transformer_feed_forward

from .common import TORCH, normal, skip_without_torch, torch_tensor

ROWS = [128, 512]
ACTS = ["RELU", "GELU"]
D, FF = 512, 2048


def _arrays(n):
    return [normal((FF, D), 70, 1 / math.sqrt(D)), normal((FF,), 71, 0.1),
            normal((D, FF), 72, 1 / math.sqrt(FF)), normal((D,), 73, 0.1), normal((n, D), 74)]


class FeedForward:
    params = [ROWS, ACTS]
    param_names = ["n", "activation"]

    def setup(self, n, act):
        self.act = Activation[act]
        self.a = _arrays(n)
        transformer_feed_forward(self.act, *self.a)

    def time_transformer_feed_forward(self, n, act):
        transformer_feed_forward(self.act, *self.a)

    def time_numpy_feed_forward(self, n, act):
        w1, b1, w2, b2, x = self.a
        h = x @ w1.T + b1
        if act == "RELU":
            h = np.maximum(h, 0.0)
        else:
            from scipy.special import erf
            h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
        h @ w2.T + b2


class TorchFeedForward:
    params = [ROWS, ACTS]
    param_names = ["n", "activation"]

    def setup(self, n, act):
        skip_without_torch()
        self.a = [torch_tensor(a) for a in _arrays(n)]
        F = TORCH.nn.functional
        self.f = F.relu if act == "RELU" else F.gelu

    def time_torch_feed_forward(self, n, act):
        F = TORCH.nn.functional
        w1, b1, w2, b2, x = self.a
        F.linear(self.f(F.linear(x, w1, b1)), w2, b2)
