"""Normalisation layers against torch.nn.functional (float64) and numpy formulas.

Targets (issue 3, ratios measured in one run): layer_norm and rms_norm on
16 x 512 x 768 (last axis) >= 2x torch; batch_norm TRAINING and group_norm(8) on
16 x 64 x 56 x 56 >= 1.5x torch.  The ``Numpy*`` classes time the same formulas written
as numpy expressions (always available); the ``Torch*`` classes raise NotImplementedError
in ``setup`` (asv: skipped) when torch is not importable.
"""

import numpy as np

from hmath_dl.layers import BatchNormState, Mode, batch_norm, group_norm, instance_norm, layer_norm, rms_norm

from .common import TORCH, normal, skip_without_torch, torch_tensor

EPS = 1e-5
ROW_SHAPES = [(16, 64, 64), (16, 128, 768), (16, 512, 768)]   # the first: short rows (1024 x 64)
IMAGE_SHAPES = [(16, 64, 28, 28), (16, 64, 56, 56)]


class RowNorms:
    params = [ROW_SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        self.x = normal(shape, 1)
        layer_norm(1, EPS, self.x[:1])
        rms_norm(1, EPS, self.x[:1])

    def time_layer_norm(self, shape):
        layer_norm(1, EPS, self.x)

    def time_rms_norm(self, shape):
        rms_norm(1, EPS, self.x)


class NumpyRowNorms:
    params = [ROW_SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        self.x = normal(shape, 1)

    def time_layer_norm(self, shape):
        m = self.x.mean(axis=-1, keepdims=True)
        d = self.x - m
        (d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + EPS))

    def time_rms_norm(self, shape):
        self.x / np.sqrt((self.x * self.x).mean(axis=-1, keepdims=True) + EPS)


class TorchRowNorms:
    params = [ROW_SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        skip_without_torch()
        self.t = torch_tensor(normal(shape, 1))
        self.f = TORCH.nn.functional

    def time_layer_norm(self, shape):
        self.f.layer_norm(self.t, (self.t.shape[-1],), eps=EPS)

    def time_rms_norm(self, shape):
        self.f.rms_norm(self.t, (self.t.shape[-1],), eps=EPS)


class ImageNorms:
    params = [IMAGE_SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        self.x = normal(shape, 2)
        c = shape[1]
        self.gamma, self.beta = np.ones(c), np.zeros(c)
        self.state = BatchNormState.initial(c)
        self.time_batch_norm_training(shape)
        self.time_batch_norm_inference(shape)
        group_norm(8, EPS, self.x[:1])
        instance_norm(EPS, self.x[:1])

    def time_batch_norm_training(self, shape):
        batch_norm(Mode.TRAINING, 0.1, EPS, self.gamma, self.beta, self.state, self.x)

    def time_batch_norm_inference(self, shape):
        batch_norm(Mode.INFERENCE, 0.1, EPS, self.gamma, self.beta, self.state, self.x)

    def time_group_norm_8(self, shape):
        group_norm(8, EPS, self.x)

    def time_instance_norm(self, shape):
        instance_norm(EPS, self.x)


class NumpyImageNorms:
    params = [IMAGE_SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        self.x = normal(shape, 2)

    def time_batch_norm_training(self, shape):
        m = self.x.mean(axis=(0, 2, 3), keepdims=True)
        d = self.x - m
        (d / np.sqrt((d * d).mean(axis=(0, 2, 3), keepdims=True) + EPS))

    def time_group_norm_8(self, shape):
        n, c = self.x.shape[:2]
        g = self.x.reshape(n, 8, -1)
        m = g.mean(axis=-1, keepdims=True)
        d = g - m
        (d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + EPS)).reshape(self.x.shape)


class TorchImageNorms:
    params = [IMAGE_SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        skip_without_torch()
        self.t = torch_tensor(normal(shape, 2))
        c = shape[1]
        f64 = TORCH.float64
        self.gamma, self.beta = TORCH.ones(c, dtype=f64), TORCH.zeros(c, dtype=f64)
        self.rm, self.rv = TORCH.zeros(c, dtype=f64), TORCH.ones(c, dtype=f64)
        self.f = TORCH.nn.functional

    def time_batch_norm_training(self, shape):
        self.f.batch_norm(self.t, self.rm, self.rv, self.gamma, self.beta, training=True,
                          momentum=0.1, eps=EPS)

    def time_batch_norm_inference(self, shape):
        self.f.batch_norm(self.t, self.rm, self.rv, self.gamma, self.beta, training=False,
                          momentum=0.1, eps=EPS)

    def time_group_norm_8(self, shape):
        self.f.group_norm(self.t, 8, eps=EPS)

    def time_instance_norm(self, shape):
        self.f.instance_norm(self.t, eps=EPS)


class AffineNorms:
    """The affine options (API.md section 8): one fused kernel pass, against the default
    path (``RowNorms`` / ``ImageNorms``) and torch's affine float64 norms."""

    params = [[(16, 512, 768)], [False, True]]
    param_names = ["shape", "torch"]

    def setup(self, shape, use_torch):
        self.x = normal(shape, 1)
        d = shape[-1]
        self.w, self.b = normal((d,), 2), normal((d,), 3)
        self.xi = normal((16, 64, 56, 56), 4)
        self.wc, self.bc = normal((64,), 5), normal((64,), 6)
        if use_torch:
            skip_without_torch()
            self.f = TORCH.nn.functional
            self.t, self.tw, self.tb = (torch_tensor(a) for a in (self.x, self.w, self.b))
            self.ti, self.twc, self.tbc = (torch_tensor(a) for a in (self.xi, self.wc, self.bc))
        for name in dir(self):   # warm-up (compilation) outside the timed calls
            if name.startswith("time_"):
                getattr(self, name)(shape, use_torch)

    def time_layer_norm_affine(self, shape, use_torch):
        if use_torch:
            self.f.layer_norm(self.t, (self.t.shape[-1],), self.tw, self.tb, eps=EPS)
        else:
            layer_norm(1, EPS, self.x, weight=self.w, bias=self.b)

    def time_rms_norm_weight(self, shape, use_torch):
        if use_torch:
            self.f.rms_norm(self.t, (self.t.shape[-1],), self.tw, eps=EPS)
        else:
            rms_norm(1, EPS, self.x, weight=self.w)

    def time_group_norm_8_affine(self, shape, use_torch):
        if use_torch:
            self.f.group_norm(self.ti, 8, self.twc, self.tbc, eps=EPS)
        else:
            group_norm(8, EPS, self.xi, weight=self.wc, bias=self.bc)

    def time_instance_norm_affine(self, shape, use_torch):
        if use_torch:
            self.f.instance_norm(self.ti, weight=self.twc, bias=self.tbc, eps=EPS)
        else:
            instance_norm(EPS, self.xi, weight=self.wc, bias=self.bc)
