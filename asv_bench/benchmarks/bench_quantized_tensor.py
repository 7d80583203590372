"""Dequantization and the QuantizedTensor accessors, with numpy peers.

``dequantize`` (``scale * (q - zp)`` per slice, checked finite) of 256 x 256 and
1024 x 1024 tensors quantized per row / per tensor against the same numpy expression on
the int8 values (no checks); the three accessors (``quantized_values``,
``quantization_scales``, ``quantization_zero_points``: read-only views, O(1)).
"""

import numpy as np

from hmath_dl.precision import (Quantization, dequantize, quantization_scales,
                                quantization_zero_points, quantize, quantized_values)

from .common import normal

SIZES = [256, 1024]
AXES = ["per_tensor", "per_row"]
MODES = ["SYMMETRIC", "ASYMMETRIC"]


def _q(n, axis, mode):
    return quantize(Quantization[mode], None if axis == "per_tensor" else 0, normal((n, n), 3))


class Dequantize:
    params = [SIZES, AXES, MODES]
    param_names = ["n", "axis", "mode"]

    def setup(self, n, axis, mode):
        self.q = _q(n, axis, mode)
        dequantize(self.q)
        self.values = np.array(quantized_values(self.q))
        self.scales = np.array(quantization_scales(self.q))
        self.zps = np.array(quantization_zero_points(self.q))
        if axis == "per_row":
            self.scales, self.zps = self.scales[:, None], self.zps[:, None]

    def time_dequantize(self, n, axis, mode):
        dequantize(self.q)

    def time_numpy_dequantize(self, n, axis, mode):
        self.scales * (self.values.astype(np.int64) - self.zps)


class Accessors:
    params = [SIZES]
    param_names = ["n"]

    def setup(self, n):
        self.q = _q(n, "per_row", "ASYMMETRIC")

    def time_quantized_values(self, n):
        quantized_values(self.q)

    def time_quantization_scales(self, n):
        quantization_scales(self.q)

    def time_quantization_zero_points(self, n):
        quantization_zero_points(self.q)
