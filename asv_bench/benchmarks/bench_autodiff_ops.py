"""The autodiff tape's elementary operations, one forward + reverse pass each, against
torch autograd (float64); the shared gradient utilities against numpy / torch; and
``check_gradients`` against ``torch.autograd.gradcheck``.

Each ``time_*`` builds the tape from fresh leaves (``variable``; ``constant`` for the
non-differentiated operand), evaluates one operation (reduced with ``sum`` when the
operation is not already a scalar loss) and asks for the gradients.  Sizes: 128 x 512 and
512 x 2048 float64.
"""

import numpy as np

from hmath_dl import autodiff as ad
from hmath_dl.activations import Activation

from .common import TORCH, normal, skip_without_torch, torch_tensor

SHAPES = [(128, 512), (512, 2048)]

# operation name -> ours(x ADTensor, c constant ADTensor) -> ADTensor
OURS = {
    "exp": lambda x, c: ad.exp(x),
    "log": lambda x, c: ad.log(x),          # x is made positive below
    "sqrt": lambda x, c: ad.sqrt(x),
    "tanh": lambda x, c: ad.tanh(x),
    "activate_gelu": lambda x, c: ad.activate(Activation.GELU, x),
    "sum_axis0": lambda x, c: ad.sum(x, axis=0),
    "mean": lambda x, c: ad.mean(x, axis=1),
    "reshape": lambda x, c: ad.reshape(x, (-1,)),
    "transpose": lambda x, c: ad.transpose(x),
    "softmax": lambda x, c: ad.softmax(x, axis=-1),
    "log_softmax": lambda x, c: ad.log_softmax(x, axis=-1),
    "mul_add_constant": lambda x, c: x * c + c,
    "mse": lambda x, c: ad.mse(x, c),
}
OPS = list(OURS)


def _positive(op, a):
    return np.abs(a) + 0.5 if op in ("log", "sqrt") else a


class Ops:
    params = [SHAPES, OPS]
    param_names = ["shape", "op"]
    timeout = 300

    def setup(self, shape, op):
        self.x = _positive(op, normal(shape, 1))
        self.c = normal(shape, 2)
        self.f = OURS[op]
        self.time_forward_backward(shape, op)

    def time_forward_backward(self, shape, op):
        x = ad.variable(self.x)
        y = self.f(x, ad.constant(self.c))
        if y.ndim:
            y = ad.sum(y)
        ad.gradients(y, [x])


class TorchOps:
    params = [SHAPES, OPS]
    param_names = ["shape", "op"]
    timeout = 300

    def setup(self, shape, op):
        skip_without_torch()
        T, F = TORCH, TORCH.nn.functional
        self.f = {
            "exp": lambda x, c: T.exp(x), "log": lambda x, c: T.log(x),
            "sqrt": lambda x, c: T.sqrt(x), "tanh": lambda x, c: T.tanh(x),
            "activate_gelu": lambda x, c: F.gelu(x), "sum_axis0": lambda x, c: x.sum(0),
            "mean": lambda x, c: x.mean(1), "reshape": lambda x, c: x.reshape(-1),
            "transpose": lambda x, c: x.T, "softmax": lambda x, c: T.softmax(x, -1),
            "log_softmax": lambda x, c: T.log_softmax(x, -1),
            "mul_add_constant": lambda x, c: x * c + c, "mse": lambda x, c: F.mse_loss(x, c),
        }[op]
        self.x = torch_tensor(_positive(op, normal(shape, 1)))
        self.c = torch_tensor(normal(shape, 2))
        self.time_torch_forward_backward(shape, op)

    def time_torch_forward_backward(self, shape, op):
        x = self.x.detach().requires_grad_(True)
        y = self.f(x, self.c)
        if y.ndim:
            y = y.sum()
        TORCH.autograd.grad(y, [x])


# ----------------------------------------------------------------------------- loss
class CrossEntropy:
    params = [[(256, 10), (4096, 1000)]]
    param_names = ["batch_classes"]

    def setup(self, bc):
        self.z = normal(bc, 3)
        self.y = np.random.default_rng(3).integers(0, bc[1], bc[0])
        self.time_cross_entropy(bc)
        if TORCH is not None:
            self.tz, self.ty = torch_tensor(self.z), TORCH.from_numpy(self.y)

    def time_cross_entropy(self, bc):
        z = ad.variable(self.z)
        ad.gradients(ad.cross_entropy(z, self.y), [z])

    def time_torch_cross_entropy(self, bc):
        skip_without_torch()
        z = self.tz.detach().requires_grad_(True)
        TORCH.autograd.grad(TORCH.nn.functional.cross_entropy(z, self.ty), [z])


# ----------------------------------------------------------------------------- utilities
GRADS = [10_000, 1_000_000]  # total entries, in four arrays


def _grads(total):
    return [np.array(normal((total // 4,), 30 + i)) for i in range(4)]


class GradientUtilities:
    params = [GRADS]
    param_names = ["entries"]

    def setup(self, total):
        self.g = _grads(total)
        ad.gradient_norm(self.g)
        ad.clip_gradients(1.0, self.g)

    def time_gradient_norm(self, total):
        ad.gradient_norm(self.g)

    def time_clip_gradients(self, total):
        ad.clip_gradients(1.0, self.g)

    def time_numpy_norm_and_clip(self, total):
        n = np.sqrt(sum(float(np.dot(x, x)) for x in self.g))
        [x * (1.0 / n) for x in self.g]


class TorchGradientUtilities:
    params = [GRADS]
    param_names = ["entries"]

    def setup(self, total):
        skip_without_torch()
        self.g = [torch_tensor(a) for a in _grads(total)]

    def time_torch_clip_grad_norm(self, total):
        # in place on fresh copies, so every repeat clips the same values
        TORCH.nn.utils.clip_grad_norm_([g.clone() for g in self.g], 1.0)


# ----------------------------------------------------------------------------- gradcheck
CHECK = [4, 8]  # x [n, n], w [n, n]: loss = sum(tanh(x @ w) * x)


def _check_fn(x, w):
    return ad.sum(ad.tanh(x @ w) * x)


class CheckGradients:
    params = [CHECK]
    param_names = ["n"]

    def setup(self, n):
        self.inputs = [normal((n, n), 40), normal((n, n), 41)]
        ad.check_gradients(_check_fn, self.inputs)

    def time_check_gradients(self, n):
        ad.check_gradients(_check_fn, self.inputs)


class TorchGradcheck:
    params = [CHECK]
    param_names = ["n"]

    def setup(self, n):
        skip_without_torch()
        self.inputs = [torch_tensor(normal((n, n), 40)).requires_grad_(True),
                       torch_tensor(normal((n, n), 41)).requires_grad_(True)]

    def time_torch_gradcheck(self, n):
        TORCH.autograd.gradcheck(lambda x, w: (TORCH.tanh(x @ w) * x).sum(), self.inputs,
                                 eps=1e-6, atol=1e-7, rtol=1e-5)
