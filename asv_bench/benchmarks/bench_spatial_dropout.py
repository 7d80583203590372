"""Spatial (channel) dropout in TRAINING mode, against numpy and torch's
``dropout2d`` (float64); x ``[8, 64, S, S]`` for S = 28 and 56, p = 0.1."""

import numpy as np

from hmath_dl.layers import Mode, spatial_dropout
from hmath_dl.rng import RNG

from .common import TORCH, normal, skip_without_torch, torch_tensor

SIDES = [28, 56]


class SpatialDropout:
    params = [SIDES]
    param_names = ["side"]

    def setup(self, side):
        self.x = normal((8, 64, side, side), 90)
        self.rng = RNG.from_seed(0)
        spatial_dropout(Mode.TRAINING, 0.1, self.rng, self.x)

    def time_spatial_dropout(self, side):
        spatial_dropout(Mode.TRAINING, 0.1, self.rng, self.x)

    def time_spatial_dropout_inference(self, side):
        spatial_dropout(Mode.INFERENCE, 0.1, self.rng, self.x)

    def time_numpy_spatial_dropout(self, side):
        g = np.random.Generator(np.random.Philox(0))
        keep = (g.random(self.x.shape[:2]) >= 0.1) / 0.9
        mask = np.broadcast_to(keep[:, :, None, None], self.x.shape).copy()
        self.x * mask


class TorchSpatialDropout:
    params = [SIDES]
    param_names = ["side"]

    def setup(self, side):
        skip_without_torch()
        self.x = torch_tensor(normal((8, 64, side, side), 90))

    def time_torch_dropout2d(self, side):
        TORCH.nn.functional.dropout2d(self.x, 0.1, True)
