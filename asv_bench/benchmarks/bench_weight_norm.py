"""``weight_norm(axis, magnitudes, w)`` (each slice along ``axis`` scaled to norm
``magnitudes[i]``) against numpy and ``torch._weight_norm`` (what
``torch.nn.utils.parametrizations.weight_norm`` computes), float64.

Shapes: a conv weight 256 x 128 x 3 x 3 and a dense weight 1024 x 4096, axis 0.
"""

import numpy as np

from hmath_dl.layers import weight_norm

from .common import TORCH, normal, skip_without_torch, torch_tensor

SHAPES = [(256, 128, 3, 3), (1024, 4096)]


class WeightNorm:
    params = [SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        self.w = normal(shape, 80)
        self.g = 1.0 + np.abs(normal((shape[0],), 81))
        weight_norm(0, self.g, self.w)

    def time_weight_norm(self, shape):
        weight_norm(0, self.g, self.w)

    def time_numpy_weight_norm(self, shape):
        w2 = self.w.reshape(self.w.shape[0], -1)
        (w2 * (self.g / np.sqrt(np.einsum("ij,ij->i", w2, w2)))[:, None]).reshape(self.w.shape)


class TorchWeightNorm:
    params = [SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        skip_without_torch()
        self.w = torch_tensor(normal(shape, 80))
        g = 1.0 + np.abs(normal((shape[0],), 81))
        self.g = torch_tensor(g.reshape((-1,) + (1,) * (len(shape) - 1)))

    def time_torch_weight_norm(self, shape):
        TORCH._weight_norm(self.w, self.g, 0)
