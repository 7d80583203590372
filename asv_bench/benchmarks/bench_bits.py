"""Decoding FP16 / BF16 bit patterns (``bits_to_float``) against numpy's float16 and
ml_dtypes' bfloat16 casts (no checks), 1e5 and 1e6 patterns of finite values."""

import ml_dtypes
import numpy as np

from hmath_dl.precision import Precision, bits_to_float, round_to_bits

from .common import normal

SIZES = [100_000, 1_000_000]
PRECISIONS = ["FP16", "BF16"]


class BitsToFloat:
    params = [SIZES, PRECISIONS]
    param_names = ["n", "precision"]

    def setup(self, n, precision):
        self.p = Precision[precision]
        self.bits = round_to_bits(self.p, normal((n,), 5, 100.0))
        self.bits.flags.writeable = False
        self.view = self.bits.view(np.float16 if precision == "FP16" else ml_dtypes.bfloat16)
        bits_to_float(self.p, self.bits)

    def time_bits_to_float(self, n, precision):
        bits_to_float(self.p, self.bits)

    def time_peer_view_astype_float64(self, n, precision):
        # numpy float16 -> float64 (FP16) / ml_dtypes bfloat16 -> float64 (BF16)
        self.view.astype(np.float64)
