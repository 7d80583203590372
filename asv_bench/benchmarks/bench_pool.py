"""Pooling against peers, float64 on both sides.

Issue targets: max pooling x 8x64x56x56, window 3, stride 2, padding 1 (>= 2x torch
float64); average pooling (count_include_pad=False) on the same shape (>= 1x).  Also
adaptive average pooling to 7x7 and global average pooling.  Peers: torch (when
importable) and numpy sliding-window expressions.
"""

import numpy as np

from hmath_dl.layers import PoolMode, adaptive_pooling, global_pooling, pooling

from .common import TORCH, normal, skip_without_torch, torch_tensor

SIDES = [28, 56]


def numpy_max_pool2d(x, k, s, p):
    xp = np.pad(x, [(0, 0), (0, 0), (p, p), (p, p)], constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s]
    return win.max(axis=(-2, -1))


def numpy_avg_pool2d(x, k, s, p):
    xp = np.pad(x, [(0, 0), (0, 0), (p, p), (p, p)])
    ones = np.pad(np.ones(x.shape[2:]), [(p, p), (p, p)])
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s]
    cnt = np.lib.stride_tricks.sliding_window_view(ones, (k, k))[::s, ::s]
    return win.sum(axis=(-2, -1)) / cnt.sum(axis=(-2, -1))


class Pool2d:
    params = SIDES
    param_names = ["side"]

    def setup(self, side):
        self.x = np.array(normal((8, 64, side, side), 21))
        for mode in PoolMode:
            pooling(mode, 3, 2, 1, self.x)
        adaptive_pooling(PoolMode.AVERAGE, 7, self.x)
        global_pooling(PoolMode.AVERAGE, self.x)

    def time_max_pooling(self, side):
        pooling(PoolMode.MAX, 3, 2, 1, self.x)

    def time_average_pooling(self, side):
        pooling(PoolMode.AVERAGE, 3, 2, 1, self.x)

    def time_adaptive_average_7(self, side):
        adaptive_pooling(PoolMode.AVERAGE, 7, self.x)

    def time_global_average(self, side):
        global_pooling(PoolMode.AVERAGE, self.x)

    def time_numpy_max_pool(self, side):
        numpy_max_pool2d(self.x, 3, 2, 1)

    def time_numpy_avg_pool(self, side):
        numpy_avg_pool2d(self.x, 3, 2, 1)


class TorchPool2d:
    params = SIDES
    param_names = ["side"]

    def setup(self, side):
        skip_without_torch()
        self.x = torch_tensor(normal((8, 64, side, side), 21))
        self.F = TORCH.nn.functional
        self.F.max_pool2d(self.x, 3, 2, 1)

    def time_torch_max_pool2d(self, side):
        self.F.max_pool2d(self.x, 3, 2, 1)

    def time_torch_avg_pool2d(self, side):
        self.F.avg_pool2d(self.x, 3, 2, 1, count_include_pad=False)

    def time_torch_adaptive_avg_7(self, side):
        self.F.adaptive_avg_pool2d(self.x, 7)

    def time_torch_global_avg(self, side):
        self.x.mean(dim=(2, 3))
