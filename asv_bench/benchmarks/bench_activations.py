"""Activations and dropout against torch.nn.functional (float64) and numpy formulas."""

import math

import numpy as np

from hmath_dl.activations import Activation, activate
from hmath_dl.layers import Mode, dropout
from hmath_dl.rng import RNG

from .common import TORCH, normal, skip_without_torch, torch_tensor

SHAPES = [(256, 1024), (1024, 4096)]
ACTS = ["RELU", "GELU", "GELU_TANH", "SILU", "SIGMOID", "TANH", "SOFTPLUS", "ELU"]
# issue 17's size (16M elements): ours and torch only
BIG = [(4096, 4096)]


class Activations:
    params = (SHAPES, ACTS)
    param_names = ["shape", "activation"]

    def setup(self, shape, name):
        self.x = normal(shape, 3)
        self.act = Activation[name]
        activate(self.act, self.x[:1])

    def time_activate(self, shape, name):
        activate(self.act, self.x)


def _numpy_act(name, x):
    if name == "RELU":
        return np.maximum(x, 0.0)
    if name == "GELU":
        from scipy.special import erf
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if name == "GELU_TANH":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "SILU":
        return x / (1.0 + np.exp(-x))
    if name == "SOFTPLUS":
        return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))
    if name == "ELU":
        return np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))
    if name == "SIGMOID":
        return 1.0 / (1.0 + np.exp(-x))
    return np.tanh(x)


class NumpyActivations:
    params = (SHAPES, ACTS)
    param_names = ["shape", "activation"]

    def setup(self, shape, name):
        self.x = normal(shape, 3)
        if name == "GELU":
            try:
                import scipy.special  # noqa: F401
            except ImportError:
                raise NotImplementedError("scipy not importable")

    def time_activate(self, shape, name):
        with np.errstate(over="ignore"):
            _numpy_act(name, self.x)


class TorchActivations:
    params = (SHAPES, ACTS)
    param_names = ["shape", "activation"]

    def setup(self, shape, name):
        skip_without_torch()
        self.t = torch_tensor(normal(shape, 3))
        f = TORCH.nn.functional
        self.fn = _torch_fn(name)

    def time_activate(self, shape, name):
        self.fn(self.t)


def _torch_fn(name):
    f = TORCH.nn.functional
    # softplus without torch's linear cut-off (threshold=20), as ours
    return {"RELU": f.relu, "GELU": f.gelu,
            "GELU_TANH": lambda t: f.gelu(t, approximate="tanh"), "SILU": f.silu,
            "SIGMOID": TORCH.sigmoid, "TANH": TORCH.tanh,
            "SOFTPLUS": lambda t: f.softplus(t, threshold=1e30), "ELU": f.elu}[name]


class BigActivations:
    """16M float64 elements (issue 17's goal: every activation >= 1.5x torch), ours and
    torch float64 in the same suite."""
    params = (BIG, ACTS, ["ours", "torch"])
    param_names = ["shape", "activation", "impl"]
    timeout = 300

    def setup(self, shape, name, impl):
        if impl == "torch":
            skip_without_torch()
            self.t = torch_tensor(normal(shape, 3))
            self.fn = _torch_fn(name)
        else:
            self.x = normal(shape, 3)
            self.act = Activation[name]
            activate(self.act, self.x[:1])

    def time_activate(self, shape, name, impl):
        if impl == "torch":
            self.fn(self.t)
        else:
            activate(self.act, self.x)


class ActivationDerivative:
    """The derivative and the fused forward+derivative kernels (autodiff's path)."""
    params = ([(1024, 4096)], ACTS, ["derivative", "forward_derivative"])
    param_names = ["shape", "activation", "kernel"]

    def setup(self, shape, name, kern):
        from hmath_dl._kernels import elementwise as E
        self.x = normal(shape, 3).reshape(-1)
        self.out = np.empty_like(self.x)
        self.d = np.empty_like(self.x)
        self.code = Activation[name].value
        self.E = E
        self.time_kernel(shape, name, kern)

    def time_kernel(self, shape, name, kern):
        if kern == "derivative":
            self.E.activation_derivative(self.code, self.x, self.d)
        else:
            self.E.activation_forward_derivative(self.code, self.x, self.out, self.d)


class Dropout:
    params = [SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        self.x = normal(shape, 4)
        self.rng = RNG.from_seed(0)
        dropout(Mode.TRAINING, 0.1, self.rng, self.x[:1])

    def time_dropout_training(self, shape):
        dropout(Mode.TRAINING, 0.1, self.rng, self.x)


class NumpyDropout:
    params = [SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        self.x = normal(shape, 4)

    def time_dropout_training(self, shape):
        g = np.random.Generator(np.random.Philox(0))
        mask = (g.random(self.x.shape) >= 0.1) / 0.9
        self.x * mask


class TorchDropout:
    params = [SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        skip_without_torch()
        self.t = torch_tensor(normal(shape, 4))

    def time_dropout_training(self, shape):
        TORCH.nn.functional.dropout(self.t, 0.1, True)


# parameterised activations (API.md section 8): default path vs a given parameter vs torch
PARAMETERISED = [("LEAKY_RELU", "negative_slope", 0.2), ("ELU", "alpha", 1.5),
                 ("SOFTPLUS", "beta", 2.0)]


class ParameterisedActivations:
    params = ([(256, 1024)], [p[0] for p in PARAMETERISED], ["default", "given", "torch"])
    param_names = ["shape", "activation", "variant"]

    def setup(self, shape, name, variant):
        self.x = normal(shape, 3)
        self.act = Activation[name]
        key, value = next((k, v) for n, k, v in PARAMETERISED if n == name)
        self.kw = {} if variant == "default" else {key: value}
        if variant == "torch":
            skip_without_torch()
            f = TORCH.nn.functional
            self.t = torch_tensor(self.x)
            # softplus with an (effectively) infinite threshold: no linear cut-off, as ours
            self.fn = {"LEAKY_RELU": lambda t: f.leaky_relu(t, value),
                       "ELU": lambda t: f.elu(t, value),
                       "SOFTPLUS": lambda t: f.softplus(t, value, threshold=1e30)}[name]
        self.time_activate(shape, name, variant)   # warm-up (compilation) outside the timing

    def time_activate(self, shape, name, variant):
        if variant == "torch":
            self.fn(self.t)
        else:
            activate(self.act, self.x, **self.kw)
