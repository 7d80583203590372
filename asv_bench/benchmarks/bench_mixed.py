"""Mixed-precision training utilities: loss scaling, unscaling, the gradient norm and
clipping (``hmath_dl.precision``), against numpy expressions and torch.

The scaler operations are O(1) (they measure call overhead: validation and a frozen
dataclass); ``unscale_gradients`` and ``clip_gradients`` run over four arrays holding
1e4 / 1e6 entries in total.
"""

import numpy as np

from hmath_dl.precision import (clip_gradients, gradient_norm, initial_loss_scaler,
                                scale_loss, unscale_gradients, update_loss_scaler)

from .common import TORCH, normal, skip_without_torch, torch_tensor

ENTRIES = [10_000, 1_000_000]


def _grads(total):
    return [np.array(normal((total // 4,), 50 + i)) for i in range(4)]


class LossScaler:
    def setup(self):
        self.s = initial_loss_scaler(2.0 ** 16, 2000)

    def time_initial_loss_scaler(self):
        initial_loss_scaler(2.0 ** 16, 2000)

    def time_scale_loss(self):
        scale_loss(self.s, 1.2345)

    def time_update_loss_scaler_finite(self):
        update_loss_scaler(True, self.s)

    def time_update_loss_scaler_overflow(self):
        update_loss_scaler(False, self.s)


class Gradients:
    params = [ENTRIES]
    param_names = ["entries"]

    def setup(self, total):
        self.g = _grads(total)
        self.s = initial_loss_scaler(2.0 ** 16, 2000)
        unscale_gradients(self.s, self.g)
        clip_gradients(1.0, self.g)
        gradient_norm(self.g)

    def time_unscale_gradients(self, total):
        unscale_gradients(self.s, self.g)

    def time_clip_gradients(self, total):
        clip_gradients(1.0, self.g)

    def time_numpy_unscale(self, total):
        out = [g / 2.0 ** 16 for g in self.g]
        all(np.isfinite(g).all() for g in self.g) and all(np.isfinite(g).all() for g in out)

    def time_numpy_clip(self, total):
        n = np.sqrt(sum(float(np.dot(g, g)) for g in self.g))
        [g * min(1.0, 1.0 / n) for g in self.g]


class TorchGradients:
    params = [ENTRIES]
    param_names = ["entries"]

    def setup(self, total):
        skip_without_torch()
        self.g = [torch_tensor(a) for a in _grads(total)]
        self.inv = TORCH.tensor(2.0 ** -16, dtype=TORCH.float32)  # GradScaler's types
        self.found = TORCH.tensor(0.0, dtype=TORCH.float32)

    def time_torch_unscale(self, total):
        # what torch.amp.GradScaler.unscale_ runs (on copies: it works in place)
        gs = [g.clone() for g in self.g]
        TORCH._amp_foreach_non_finite_check_and_unscale_(gs, self.found, self.inv)

    def time_torch_clip_grad_norm(self, total):
        TORCH.nn.utils.clip_grad_norm_([g.clone() for g in self.g], 1.0)
