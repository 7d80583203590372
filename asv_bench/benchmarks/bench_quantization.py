"""INT8 quantization and the exact int8 GEMM, with peer baselines.

``int8_gemm`` (a quantized per row, b per column; the time includes every check, the
operand packing and the scaling) against numpy float64 / float32 ``a @ b`` and torch
float64 matmul of the same shape; ``quantize`` of a 1024 x 1024 tensor against the numpy
expression of the same formula.
"""

import numpy as np

from hmath_dl.precision import Quantization, int8_gemm, quantize

from .common import TORCH, normal, skip_without_torch, torch_tensor

SIZES = [256, 1024]


class Int8Gemm:
    params = SIZES
    param_names = ["n"]

    def setup(self, n):
        self.qa = quantize(Quantization.SYMMETRIC, 0, normal((n, n), 1))
        self.qb = quantize(Quantization.SYMMETRIC, 1, normal((n, n), 2))
        int8_gemm(self.qa, self.qb)  # compile / load the kernels

    def time_int8_gemm(self, n):
        int8_gemm(self.qa, self.qb)


class Int8GemmAsymmetric:
    params = SIZES
    param_names = ["n"]

    def setup(self, n):
        self.qa = quantize(Quantization.ASYMMETRIC, 0, normal((n, n), 1))
        self.qb = quantize(Quantization.ASYMMETRIC, 1, normal((n, n), 2))
        int8_gemm(self.qa, self.qb)

    def time_int8_gemm_asymmetric(self, n):
        int8_gemm(self.qa, self.qb)


class NumpyMatmulFloat64:
    params = SIZES
    param_names = ["n"]

    def setup(self, n):
        self.a = np.array(normal((n, n), 1))
        self.b = np.array(normal((n, n), 2))

    def time_numpy_matmul_float64(self, n):
        self.a @ self.b


class NumpyMatmulFloat32:
    params = SIZES
    param_names = ["n"]

    def setup(self, n):
        self.a = normal((n, n), 1).astype(np.float32)
        self.b = normal((n, n), 2).astype(np.float32)

    def time_numpy_matmul_float32(self, n):
        self.a @ self.b


class TorchMatmulFloat64:
    params = SIZES
    param_names = ["n"]

    def setup(self, n):
        skip_without_torch()
        self.a = torch_tensor(normal((n, n), 1))
        self.b = torch_tensor(normal((n, n), 2))

    def time_torch_matmul_float64(self, n):
        TORCH.matmul(self.a, self.b)


class Quantize:
    params = [[None, 0, 1], ["SYMMETRIC", "ASYMMETRIC"]]
    param_names = ["axis", "mode"]

    def setup(self, axis, mode):
        self.x = normal((1024, 1024), 3)
        self.mode = Quantization[mode]
        quantize(self.mode, axis, self.x)

    def time_quantize(self, axis, mode):
        quantize(self.mode, axis, self.x)


class NumpyQuantizeSymmetric:
    """The symmetric per-row formula written with numpy (no checks)."""

    def setup(self):
        self.x = normal((1024, 1024), 3)

    def time_numpy_quantize_symmetric_rows(self):
        x = self.x
        amax = np.abs(x).max(axis=1, keepdims=True)
        scale = np.where(amax == 0, 1.0, amax / 127.0)
        np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
