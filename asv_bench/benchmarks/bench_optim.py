"""Functional optimizers (SGD with momentum, AdamW; immutable state, new parameter
arrays) against the numpy expressions of the same update and ``torch.optim`` (float64,
in place, ``foreach`` implementation).

Parameters: four arrays holding 1e4 / 1e6 entries in total.  The AdamW step at the
single-array sizes of bench_autodiff.OptimizerStep is also there.
"""

import numpy as np

from hmath_dl.optim import adamw_init, adamw_step, sgd_init, sgd_step

from .common import TORCH, normal, skip_without_torch, torch_tensor

ENTRIES = [10_000, 1_000_000]
LR = 1e-3


def _params(total):
    return ([np.array(normal((total // 4,), 100 + i)) for i in range(4)],
            [np.array(normal((total // 4,), 110 + i)) for i in range(4)])


class Optimizers:
    params = [ENTRIES]
    param_names = ["entries"]

    def setup(self, total):
        self.p, self.g = _params(total)
        self.sgd = sgd_step(sgd_init(self.p), self.p, self.g, LR)[1]  # non-zero momentum
        self.adam = adamw_step(adamw_init(self.p), self.p, self.g, LR)[1]
        self.buf = [0.1 * g for g in self.g]
        self.m = [0.1 * g for g in self.g]
        self.v = [0.001 * g * g for g in self.g]

    def time_sgd_init(self, total):
        sgd_init(self.p)

    def time_adamw_init(self, total):
        adamw_init(self.p)

    def time_sgd_step(self, total):
        sgd_step(self.sgd, self.p, self.g, LR)

    def time_adamw_step(self, total):
        adamw_step(self.adam, self.p, self.g, LR)

    def time_numpy_sgd(self, total):
        for p, g, b in zip(self.p, self.g, self.buf):
            b2 = 0.9 * b + g
            p - LR * b2

    def time_numpy_adamw(self, total):
        bc1, bc2 = 1 - 0.9 ** 2, 1 - 0.999 ** 2
        for p, g, m, v in zip(self.p, self.g, self.m, self.v):
            m2 = 0.9 * m + 0.1 * g
            v2 = 0.999 * v + 0.001 * g * g
            p * (1 - LR * 0.01) - (LR / bc1) * m2 / (np.sqrt(v2) / np.sqrt(bc2) + 1e-8)


class TorchOptimizers:
    params = [ENTRIES]
    param_names = ["entries"]

    def setup(self, total):
        skip_without_torch()
        p, g = _params(total)
        self.p = [torch_tensor(a) for a in p]
        for t, gg in zip(self.p, g):
            t.grad = torch_tensor(gg)
        self.sgd = TORCH.optim.SGD(self.p, lr=LR, momentum=0.9, foreach=True)
        self.adam = TORCH.optim.AdamW(self.p, lr=LR, weight_decay=0.01, foreach=True)
        self.sgd.step()
        self.adam.step()

    def time_torch_sgd_step(self, total):
        self.sgd.step()

    def time_torch_adamw_step(self, total):
        self.adam.step()
