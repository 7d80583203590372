"""Weight initialisers (``initialize_weights``) against numpy Generator draws and
``torch.nn.init`` (float64), for a 256 x 256 and a 1024 x 1024 weight matrix.

Ours draws from a Philox generator built from the explicit ``RNG`` (the draw itself is
numpy's); the numpy peer uses a ready Philox ``Generator``; torch fills a preallocated
tensor in place (its default generator).
"""

import math

import numpy as np

from hmath_dl.layers import (KaimingNormal, KaimingUniform, Orthogonal, TruncatedNormal,
                             XavierNormal, XavierUniform, initialize_weights)
from hmath_dl.rng import RNG

from .common import TORCH, skip_without_torch

SIZES = [256, 1024]
INITS = ["XavierUniform", "XavierNormal", "KaimingUniform", "KaimingNormal", "Orthogonal",
         "TruncatedNormal"]


def _init(name):
    return {"XavierUniform": XavierUniform(), "XavierNormal": XavierNormal(),
            "KaimingUniform": KaimingUniform(), "KaimingNormal": KaimingNormal(),
            "Orthogonal": Orthogonal(1.0), "TruncatedNormal": TruncatedNormal(0.0, 0.02, 2.0)}[name]


def _numpy_init(name, g, n):
    if name == "XavierUniform":
        a = math.sqrt(6 / (2 * n))
        return g.uniform(-a, a, (n, n))
    if name == "XavierNormal":
        return math.sqrt(2 / (2 * n)) * g.standard_normal((n, n))
    if name == "KaimingUniform":
        b = math.sqrt(6 / n)
        return g.uniform(-b, b, (n, n))
    if name == "KaimingNormal":
        return math.sqrt(2 / n) * g.standard_normal((n, n))
    if name == "Orthogonal":
        q, r = np.linalg.qr(g.standard_normal((n, n)))
        return q * np.where(np.diag(r) < 0, -1.0, 1.0)
    z = g.standard_normal(n * n)  # rejection: redraw the few outside +-2 sigma
    bad = np.abs(z) > 2.0
    while bad.any():
        z[bad] = g.standard_normal(int(bad.sum()))
        bad = np.abs(z) > 2.0
    return 0.02 * z.reshape(n, n)


class InitializeWeights:
    params = [SIZES, INITS]
    param_names = ["n", "init"]

    def setup(self, n, name):
        self.init = _init(name)
        self.rng = RNG.from_seed(0)
        initialize_weights(self.init, n, n, (n, n), self.rng)

    def time_initialize_weights(self, n, name):
        initialize_weights(self.init, n, n, (n, n), self.rng)


class NumpyInitializeWeights:
    params = [SIZES, INITS]
    param_names = ["n", "init"]

    def setup(self, n, name):
        self.g = np.random.Generator(np.random.Philox(0))

    def time_numpy_init(self, n, name):
        _numpy_init(name, self.g, n)


class TorchInitializeWeights:
    params = [SIZES, INITS]
    param_names = ["n", "init"]

    def setup(self, n, name):
        skip_without_torch()
        init = TORCH.nn.init
        self.w = TORCH.empty((n, n), dtype=TORCH.float64)
        self.fn = {"XavierUniform": init.xavier_uniform_, "XavierNormal": init.xavier_normal_,
                   "KaimingUniform": init.kaiming_uniform_,
                   "KaimingNormal": init.kaiming_normal_, "Orthogonal": init.orthogonal_,
                   "TruncatedNormal": lambda w: init.trunc_normal_(w, 0.0, 0.02, -0.04, 0.04)}[name]

    def time_torch_init(self, n, name):
        self.fn(self.w)
