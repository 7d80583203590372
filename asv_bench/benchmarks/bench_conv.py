"""Convolution (direct summation kernels) against peers, float64 on both sides.

Issue targets (ratios measured side by side; see the report):
* conv2d x 8x32x32x32, w 64x32x3x3, padding 1 (target >= 1.5x torch float64);
* conv1d x 16x64x1024, w 64x64x5; transposed conv2d x 8x64x16x16, w 64x64x4x4, stride 2;
  depthwise conv2d x 8x64x56x56, w 64x1x3x3, padding 1 (targets >= 1x torch).
Peers: torch.nn.functional (when importable) and a numpy im2col + BLAS expression.
Inputs are writable C-contiguous float64 copies (read-only inputs cost one extra copy).
"""

import numpy as np

from hmath_dl.layers import (ConvOptions, convolution, depthwise_convolution,
                             transposed_convolution)

from .common import TORCH, normal, skip_without_torch, torch_tensor


def _w(shape, seed):
    return np.array(normal(shape, seed))


# ------------------------------------------------------------------ numpy baselines
def numpy_conv(x, w, padding):
    """im2col (sliding_window_view) + tensordot (BLAS), stride 1, groups 1."""
    r = x.ndim - 2
    pad = [(0, 0), (0, 0)] + [(padding, padding)] * r
    xp = np.pad(x, pad)
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=tuple(range(2, 2 + r)))
    y = np.tensordot(win, w, axes=([1] + list(range(2 + r, 2 + 2 * r)), list(range(1, 2 + r))))
    return np.moveaxis(y, -1, 1)


def numpy_conv_transpose2d(x, w, stride):
    """tensordot (BLAS) into columns, then col2im with one strided add per tap."""
    N, _, H, W = x.shape
    _, Cout, KH, KW = w.shape
    cols = np.tensordot(x, w, axes=([1], [0]))            # N, H, W, Cout, KH, KW
    out = np.zeros((N, Cout, (H - 1) * stride + KH, (W - 1) * stride + KW))
    for kh in range(KH):
        for kw in range(KW):
            out[:, :, kh:kh + (H - 1) * stride + 1:stride, kw:kw + (W - 1) * stride + 1:stride] += \
                np.moveaxis(cols[:, :, :, :, kh, kw], 3, 1)
    return out


def numpy_depthwise2d(x, w, padding):
    xp = np.pad(x, [(0, 0), (0, 0), (padding, padding), (padding, padding)])
    KH, KW = w.shape[2:]
    OH, OW = xp.shape[2] - KH + 1, xp.shape[3] - KW + 1
    out = np.zeros((x.shape[0], w.shape[0], OH, OW))
    for kh in range(KH):
        for kw in range(KW):
            out += xp[:, :, kh:kh + OH, kw:kw + OW] * w[None, :, 0, kh, kw, None, None]
    return out


# ------------------------------------------------------------------ conv2d
class Conv2d:
    params = [16, 32]
    param_names = ["side"]

    def setup(self, side):
        self.x = _w((8, 32, side, side), 1)
        self.w = _w((64, 32, 3, 3), 2)
        self.opts = ConvOptions(1, 1, 1)
        convolution(self.opts, self.x, self.w, None)

    def time_convolution(self, side):
        convolution(self.opts, self.x, self.w, None)

    def time_numpy_im2col(self, side):
        numpy_conv(self.x, self.w, 1)


class TorchConv2d:
    params = [16, 32]
    param_names = ["side"]

    def setup(self, side):
        skip_without_torch()
        self.x = torch_tensor(normal((8, 32, side, side), 1))
        self.w = torch_tensor(normal((64, 32, 3, 3), 2))
        TORCH.nn.functional.conv2d(self.x, self.w, padding=1)

    def time_torch_conv2d(self, side):
        TORCH.nn.functional.conv2d(self.x, self.w, padding=1)


# ------------------------------------------------------------------ conv1d
class Conv1d:
    params = [256, 1024]
    param_names = ["length"]

    def setup(self, length):
        self.x = _w((16, 64, length), 3)
        self.w = _w((64, 64, 5), 4)
        self.opts = ConvOptions(1, 0, 1)
        convolution(self.opts, self.x, self.w, None)

    def time_convolution(self, length):
        convolution(self.opts, self.x, self.w, None)

    def time_numpy_im2col(self, length):
        numpy_conv(self.x, self.w, 0)


class TorchConv1d:
    params = [256, 1024]
    param_names = ["length"]

    def setup(self, length):
        skip_without_torch()
        self.x = torch_tensor(normal((16, 64, length), 3))
        self.w = torch_tensor(normal((64, 64, 5), 4))
        TORCH.nn.functional.conv1d(self.x, self.w)

    def time_torch_conv1d(self, length):
        TORCH.nn.functional.conv1d(self.x, self.w)


# ------------------------------------------------------------------ transposed conv2d
class TransposedConv2d:
    params = [8, 16]
    param_names = ["side"]

    def setup(self, side):
        self.x = _w((8, 64, side, side), 5)
        self.w = _w((64, 64, 4, 4), 6)
        self.opts = ConvOptions(2, 0, 1)
        transposed_convolution(0, self.opts, self.x, self.w, None)

    def time_transposed_convolution(self, side):
        transposed_convolution(0, self.opts, self.x, self.w, None)

    def time_numpy_col2im(self, side):
        numpy_conv_transpose2d(self.x, self.w, 2)


class TorchTransposedConv2d:
    params = [8, 16]
    param_names = ["side"]

    def setup(self, side):
        skip_without_torch()
        self.x = torch_tensor(normal((8, 64, side, side), 5))
        self.w = torch_tensor(normal((64, 64, 4, 4), 6))
        TORCH.nn.functional.conv_transpose2d(self.x, self.w, stride=2)

    def time_torch_conv_transpose2d(self, side):
        TORCH.nn.functional.conv_transpose2d(self.x, self.w, stride=2)


# ------------------------------------------------------------------ depthwise conv2d
class DepthwiseConv2d:
    params = [28, 56]
    param_names = ["side"]

    def setup(self, side):
        self.x = _w((8, 64, side, side), 7)
        self.w = _w((64, 1, 3, 3), 8)
        self.opts = ConvOptions(1, 1, 1)
        depthwise_convolution(self.opts, self.x, self.w, None)

    def time_depthwise_convolution(self, side):
        depthwise_convolution(self.opts, self.x, self.w, None)

    def time_numpy_shifted_sum(self, side):
        numpy_depthwise2d(self.x, self.w, 1)


class TorchDepthwiseConv2d:
    params = [28, 56]
    param_names = ["side"]

    def setup(self, side):
        skip_without_torch()
        self.x = torch_tensor(normal((8, 64, side, side), 7))
        self.w = torch_tensor(normal((64, 1, 3, 3), 8))
        TORCH.nn.functional.conv2d(self.x, self.w, padding=1, groups=64)

    def time_torch_depthwise_conv2d(self, side):
        TORCH.nn.functional.conv2d(self.x, self.w, padding=1, groups=64)


# ------------------------------------------------------------------ strided conv2d
class StridedConv2d:
    """Downsampling convolutions (computed on the stride phases of the padded input):
    3x3 stride 2 pad 1, and 1x1 stride 2 (a ResNet shortcut)."""
    params = ["3x3", "1x1"]
    param_names = ["kernel"]

    def setup(self, kernel):
        k = 3 if kernel == "3x3" else 1
        self.x = _w((8, 32, 32, 32), 9)
        self.w = _w((64, 32, k, k), 10)
        self.opts = ConvOptions(2, k // 2, 1)
        convolution(self.opts, self.x, self.w, None)

    def time_convolution(self, kernel):
        convolution(self.opts, self.x, self.w, None)


class TorchStridedConv2d:
    params = ["3x3", "1x1"]
    param_names = ["kernel"]

    def setup(self, kernel):
        skip_without_torch()
        k = 3 if kernel == "3x3" else 1
        self.x = torch_tensor(normal((8, 32, 32, 32), 9))
        self.w = torch_tensor(normal((64, 32, k, k), 10))
        self.pad = k // 2
        TORCH.nn.functional.conv2d(self.x, self.w, stride=2, padding=self.pad)

    def time_torch_conv2d(self, kernel):
        TORCH.nn.functional.conv2d(self.x, self.w, stride=2, padding=self.pad)
