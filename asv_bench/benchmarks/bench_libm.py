"""The library's own transcendentals (``hmath_dl._kernels.libm`` array kernels) against
numpy's ufuncs and torch float64, 16M elements (the issue's size) and 1M."""

import math

import numpy as np

from hmath_dl._kernels import libm

from .common import TORCH, skip_without_torch, torch_tensor

SIZES = [1 << 20, 1 << 24]
FUNCS = ["exp", "expm1", "log", "log1p", "tanh", "erf", "sigmoid", "softplus", "sin", "cos"]


def _input(name, n):
    g = np.random.default_rng(0)
    if name in ("log",):
        return g.uniform(1e-3, 1e3, n)
    if name == "log1p":
        return g.uniform(-0.9, 10.0, n)
    if name in ("sin", "cos"):
        return g.uniform(-1e3, 1e3, n)
    return g.standard_normal(n) * 3.0


class Libm:
    params = (SIZES, FUNCS)
    param_names = ["n", "function"]

    def setup(self, n, name):
        self.x = _input(name, n)
        self.out = np.empty_like(self.x)
        self.k = getattr(libm, name + "_array")
        self.k(self.x[:8], self.out[:8])

    def time_kernel(self, n, name):
        self.k(self.x, self.out)


_NUMPY = {"exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p,
          "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
          "sigmoid": lambda x, out: np.divide(1.0, 1.0 + np.exp(-x), out=out),
          "softplus": lambda x, out: np.add(np.maximum(x, 0.0),
                                            np.log1p(np.exp(-np.abs(x))), out=out)}


class NumpyLibm:
    params = (SIZES, [f for f in FUNCS if f != "erf"])
    param_names = ["n", "function"]

    def setup(self, n, name):
        self.x = _input(name, n)
        self.out = np.empty_like(self.x)
        self.f = _NUMPY[name]

    def time_numpy(self, n, name):
        with np.errstate(over="ignore"):
            self.f(self.x, out=self.out)


class TorchLibm:
    params = (SIZES, FUNCS)
    param_names = ["n", "function"]

    def setup(self, n, name):
        skip_without_torch()
        self.t = torch_tensor(_input(name, n))
        self.o = TORCH.empty_like(self.t)
        f = TORCH.nn.functional
        if name == "softplus":    # no linear cut-off, like libm.softplus
            self.fn = lambda t: f.softplus(t, threshold=math.inf)
        elif name == "sigmoid":
            self.fn = lambda t: TORCH.sigmoid(t, out=self.o)
        else:
            g = getattr(TORCH, name)
            self.fn = lambda t: g(t, out=self.o)

    def time_torch(self, n, name):
        self.fn(self.t)
