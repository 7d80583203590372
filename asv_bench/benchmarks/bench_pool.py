"""Pooling against peers, float64 on both sides.

Issue targets: max pooling x 8x64x56x56, window 3, stride 2, padding 1 (>= 2x torch
float64); average pooling (count_include_pad=False) on the same shape (>= 1x).  Also
adaptive average pooling to 7x7 and global average pooling.  Peers: torch (when
importable) and numpy sliding-window expressions.

Issue 18 (PyTorch-parity options, >= 1x torch float64 on 8x64x56x56): ceil_mode (3x3 s2
p1), dilation 2 MAX (3x3 s1 p1), count_include_pad AVERAGE (3x3 s2 p1), divisor_override,
max pooling with indices and max unpooling (``PoolOptions2d`` / ``TorchPoolOptions2d``),
and the backward pass of ``pooling_ad`` (``PoolBackward2d``).
"""

import numpy as np

from hmath_dl import autodiff as ad
from hmath_dl.layers import (PoolMode, adaptive_pooling, global_pooling, max_pooling_with_indices,
                             max_unpooling, pooling, pooling_ad)

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


class PoolOptions2d:
    params = SIDES
    param_names = ["side"]

    def setup(self, side):
        self.x = np.array(normal((8, 64, side, side), 21))
        self.time_max_ceil_mode(side)
        self.time_avg_ceil_mode(side)
        self.time_max_dilation_2(side)
        self.time_avg_count_include_pad(side)
        self.time_avg_divisor_override(side)
        self.v, self.i = max_pooling_with_indices(3, 2, 1, self.x)
        self.time_max_unpooling(side)

    def time_max_ceil_mode(self, side):
        pooling(PoolMode.MAX, 3, 2, 1, self.x, ceil_mode=True)

    def time_avg_ceil_mode(self, side):
        pooling(PoolMode.AVERAGE, 3, 2, 1, self.x, ceil_mode=True)

    def time_max_dilation_2(self, side):
        pooling(PoolMode.MAX, 3, 1, 1, self.x, dilation=2)

    def time_avg_count_include_pad(self, side):
        pooling(PoolMode.AVERAGE, 3, 2, 1, self.x, count_include_pad=True)

    def time_avg_divisor_override(self, side):
        pooling(PoolMode.AVERAGE, 3, 2, 1, self.x, divisor_override=9)

    def time_max_pooling_with_indices(self, side):
        max_pooling_with_indices(3, 2, 1, self.x)

    def time_max_unpooling(self, side):
        max_unpooling(self.v, self.i, (side, side))


class TorchPoolOptions2d:
    params = SIDES
    param_names = ["side"]

    def setup(self, side):
        skip_without_torch()
        self.x = torch_tensor(normal((8, 64, side, side), 21))
        self.F = TORCH.nn.functional
        self.v, self.i = self.F.max_pool2d(self.x, 3, 2, 1, return_indices=True)
        self.F.max_pool2d(self.x, 3, 1, 1, dilation=2)

    def time_torch_max_ceil_mode(self, side):
        self.F.max_pool2d(self.x, 3, 2, 1, ceil_mode=True)

    def time_torch_avg_ceil_mode(self, side):
        self.F.avg_pool2d(self.x, 3, 2, 1, ceil_mode=True, count_include_pad=False)

    def time_torch_max_dilation_2(self, side):
        self.F.max_pool2d(self.x, 3, 1, 1, dilation=2)

    def time_torch_avg_count_include_pad(self, side):
        self.F.avg_pool2d(self.x, 3, 2, 1, count_include_pad=True)

    def time_torch_avg_divisor_override(self, side):
        self.F.avg_pool2d(self.x, 3, 2, 1, divisor_override=9)

    def time_torch_max_pooling_with_indices(self, side):
        self.F.max_pool2d(self.x, 3, 2, 1, return_indices=True)

    def time_torch_max_unpooling(self, side):
        self.F.max_unpool2d(self.v, self.i, 3, 2, 1, output_size=(side, side))


class PoolBackward2d:
    """Forward + backward of pooling_ad (default options and ceil/dilation/padding ones)."""
    params = (SIDES, ["max", "max_dilation_2", "average", "average_count_include_pad"])
    param_names = ["side", "case"]

    OPTS = {"max": (PoolMode.MAX, {}), "max_dilation_2": (PoolMode.MAX, {"dilation": 2}),
            "average": (PoolMode.AVERAGE, {}),
            "average_count_include_pad": (PoolMode.AVERAGE, {"count_include_pad": True,
                                                              "ceil_mode": True})}

    def setup(self, side, case):
        self.x = ad.variable(np.array(normal((8, 64, side, side), 21)))
        mode, opts = self.OPTS[case]
        stride = 1 if "dilation" in opts else 2
        self.y = pooling_ad(mode, 3, stride, 1, self.x, **opts)
        self.cot = np.ones(self.y.shape)
        self.time_backward(side, case)

    def time_backward(self, side, case):
        ad.gradients(self.y, [self.x], self.cot)
