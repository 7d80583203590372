"""FP16/BF16 rounding, the reduced GEMM and the gradient norm, with peer baselines.

``reduced_gemm`` (the time includes every check and the rounding of both operands) against
numpy float32 ``a @ b`` and torch bfloat16 / float16 matmul of the same shape;
``round_to_bits`` / ``round_to_precision`` of 1e6 values against numpy's float16 cast and
ml_dtypes' bfloat16 cast (both without any check); ``gradient_norm`` against
``numpy.linalg.norm``.
"""

import ml_dtypes
import numpy as np

from hmath_dl.precision import Precision, gradient_norm, reduced_gemm, round_to_bits, round_to_precision

from .common import TORCH, normal, skip_without_torch

GEMM_SIZES = [256, 1024]
PRECISIONS = ["FP16", "BF16"]
N_ROUND = 1_000_000


class ReducedGemm:
    params = [GEMM_SIZES, PRECISIONS]
    param_names = ["n", "precision"]
    timeout = 300

    def setup(self, n, precision):
        self.p = Precision[precision]
        self.a = normal((n, n), 1)
        self.b = normal((n, n), 2)
        reduced_gemm(self.p, self.a, self.b)  # compile / load the kernels

    def time_reduced_gemm(self, n, precision):
        reduced_gemm(self.p, self.a, self.b)


class ReducedGemmSeparateMulAdd:
    """The kernel without the exact-FMA fast path (taken when BF16 products could leave
    float32's normal range), on ordinary data."""

    params = [GEMM_SIZES]
    param_names = ["n"]
    timeout = 300

    def setup(self, n):
        import hmath_dl.precision.half as half_mod
        self.a = normal((n, n), 1)
        self.b = normal((n, n), 2)
        self.forced = half_mod.forced_arithmetic("separate")
        self.forced.__enter__()
        reduced_gemm(Precision.BF16, self.a, self.b)

    def teardown(self, n):
        self.forced.__exit__(None, None, None)

    def time_reduced_gemm_separate(self, n):
        reduced_gemm(Precision.BF16, self.a, self.b)


class ReducedGemmSkinny:
    """Skinny products (batch-1 inference: one row; one output column), whose tasks
    round the long operand as they go, against numpy float32 ``a @ b`` on copies made
    beforehand (:class:`NumpyMatmulFloat32Skinny`)."""

    params = [["(1, 4096, 4096)", "(4096, 4096, 1)", "(16, 4096, 1024)"]]
    param_names = ["m_k_n"]
    timeout = 300

    def setup(self, m_k_n):
        m, k, n = eval(m_k_n)
        self.a = normal((m, k), 1)
        self.b = normal((k, n), 2)
        reduced_gemm(Precision.FP16, self.a, self.b)

    def time_reduced_gemm_skinny(self, m_k_n):
        reduced_gemm(Precision.FP16, self.a, self.b)


class NumpyMatmulFloat32Skinny:
    params = ReducedGemmSkinny.params
    param_names = ReducedGemmSkinny.param_names

    def setup(self, m_k_n):
        m, k, n = eval(m_k_n)
        self.a = normal((m, k), 1).astype(np.float32)
        self.b = normal((k, n), 2).astype(np.float32)

    def time_numpy_matmul_float32(self, m_k_n):
        self.a @ self.b


class NumpyMatmulFloat32:
    params = [GEMM_SIZES]
    param_names = ["n"]

    def setup(self, n):
        self.a = normal((n, n), 1).astype(np.float32)
        self.b = normal((n, n), 2).astype(np.float32)

    def time_numpy_matmul_float32(self, n):
        self.a @ self.b


class TorchMatmulHalf:
    params = [GEMM_SIZES, PRECISIONS]
    param_names = ["n", "precision"]
    timeout = 300

    def setup(self, n, precision):
        skip_without_torch()
        dtype = TORCH.bfloat16 if precision == "BF16" else TORCH.float16
        self.a = TORCH.from_numpy(np.array(normal((n, n), 1))).to(dtype)
        self.b = TORCH.from_numpy(np.array(normal((n, n), 2))).to(dtype)
        TORCH.matmul(self.a, self.b)

    def time_torch_matmul_half(self, n, precision):
        TORCH.matmul(self.a, self.b)


class Rounding:
    params = [PRECISIONS]
    param_names = ["precision"]

    def setup(self, precision):
        self.p = Precision[precision]
        self.x = normal((N_ROUND,), 3)
        round_to_bits(self.p, self.x)
        round_to_precision(self.p, self.x)

    def time_round_to_bits(self, precision):
        round_to_bits(self.p, self.x)

    def time_round_to_precision(self, precision):
        round_to_precision(self.p, self.x)


class RoundingPeers:
    def setup(self):
        self.x = normal((N_ROUND,), 3)

    def time_numpy_astype_float16(self):
        self.x.astype(np.float16)

    def time_ml_dtypes_astype_bfloat16(self):
        self.x.astype(ml_dtypes.bfloat16)

    def time_ml_dtypes_roundtrip_bfloat16(self):
        self.x.astype(ml_dtypes.bfloat16).astype(np.float64)


class GradientNorm:
    def setup(self):
        self.g = [normal((1000, 1000), 4), normal((1000,), 5)]
        gradient_norm(self.g)

    def time_gradient_norm(self):
        gradient_norm(self.g)

    def time_numpy_norm(self):
        np.sqrt(sum(float(np.linalg.norm(x)) ** 2 for x in self.g))
