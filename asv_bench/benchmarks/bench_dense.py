"""dense (x @ w.T + b) and embedding against numpy and torch float64.

Target (issue 3): dense on x [512, 1024], w [1024, 1024] within 1.2x of numpy
``x @ w.T + b``; issue 14: at least 0.9x torch ``linear``.  Ours is the library's own
float64 GEMM (one fused multiply-add chain per output, no BLAS), the bias and the
finiteness count in its epilogue; :mod:`.bench_gemm_core` separates its micro-kernel's
rate from the whole product's.
"""

import numpy as np

from hmath_dl.layers import dense, embedding

from .common import TORCH, normal, skip_without_torch, torch_tensor

SIZES = [(128, 512), (512, 1024)]  # (batch, features): x [B, F], w [F, F]


class Dense:
    params = [SIZES]
    param_names = ["batch_features"]

    def setup(self, bf):
        b, f = bf
        self.x, self.w, self.b = normal((b, f), 5), normal((f, f), 6), normal((f,), 7)
        dense(self.x[:1], self.w, self.b)

    def time_dense(self, bf):
        dense(self.x, self.w, self.b)


class NumpyDense:
    params = [SIZES]
    param_names = ["batch_features"]

    def setup(self, bf):
        b, f = bf
        self.x, self.w, self.b = normal((b, f), 5), normal((f, f), 6), normal((f,), 7)

    def time_dense(self, bf):
        self.x @ self.w.T + self.b


class TorchDense:
    params = [SIZES]
    param_names = ["batch_features"]

    def setup(self, bf):
        skip_without_torch()
        b, f = bf
        self.x, self.w, self.b = (torch_tensor(normal((b, f), 5)), torch_tensor(normal((f, f), 6)),
                                  torch_tensor(normal((f,), 7)))

    def time_dense(self, bf):
        TORCH.nn.functional.linear(self.x, self.w, self.b)


class Embedding:
    params = [[(1000, 64), (50000, 512)]]
    param_names = ["vocab_features"]

    def setup(self, vf):
        v, f = vf
        self.w = normal((v, f), 8)
        self.idx = np.random.default_rng(9).integers(0, v, (32, 128))
        embedding(self.w, self.idx[:1])

    def time_embedding(self, vf):
        embedding(self.w, self.idx)

    def time_numpy_take(self, vf):
        np.take(self.w, self.idx, axis=0)


class EmbeddingLargeTable:
    """Issue 18: a 50000 x 512 table, 4096 rows gathered; goal >= 0.8x numpy.take with the
    checks included (only the gathered rows are checked, fused into the gather)."""

    def setup(self):
        self.w = normal((50000, 512), 10)
        self.idx = np.random.default_rng(11).integers(0, 50000, 4096)
        embedding(self.w, self.idx[:1])

    def time_embedding(self):
        embedding(self.w, self.idx)

    def time_numpy_take(self):
        np.take(self.w, self.idx, axis=0)



# The autodiff's ``@`` on constants (the library's own float64 GEMM; a row-major b is read
# where it lies when few row blocks reuse it) on the transformer step's weight-gradient
# shape, a batch-8 product through a large layer and a square one, against numpy's BLAS
# and torch.
MATMUL_SHAPES = [(64, 1024, 64), (8, 4096, 4096), (1024, 64, 256), (1024, 1024, 1024)]


class Matmul:
    params = [MATMUL_SHAPES]
    param_names = ["m_k_n"]

    def setup(self, mkn):
        from hmath_dl import autodiff as ad
        m, k, n = mkn
        self.a, self.b = ad.constant(normal((m, k), 8)), ad.constant(normal((k, n), 9))
        self.a @ self.b

    def time_matmul(self, mkn):
        self.a @ self.b


class NumpyMatmul:
    params = [MATMUL_SHAPES]
    param_names = ["m_k_n"]

    def setup(self, mkn):
        m, k, n = mkn
        self.a, self.b = normal((m, k), 8), normal((k, n), 9)

    def time_matmul(self, mkn):
        self.a @ self.b


class TorchMatmul:
    params = [MATMUL_SHAPES]
    param_names = ["m_k_n"]

    def setup(self, mkn):
        skip_without_torch()
        m, k, n = mkn
        self.a, self.b = torch_tensor(normal((m, k), 8)), torch_tensor(normal((k, n), 9))

    def time_matmul(self, mkn):
        TORCH.matmul(self.a, self.b)
