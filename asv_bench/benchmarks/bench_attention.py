"""Attention and the KV cache, with peer baselines.

* ``scaled_dot_product_attention`` with a causal mask, q = k = v of shape ``[B, N, 64]``
  (B = 8; the issue's target shape is 8 x 512 x 64), against torch float64
  ``scaled_dot_product_attention(is_causal=True)`` (which returns no weights) and the
  numpy expression of the same formula (which does).  Ours checks every input and also
  returns the weights.
* ``multihead_attention`` (8 heads) on ``[N, 512]`` against torch on the head-split layout.
* KV cache: appending ``n`` single rows one at a time (decoding); the 4000-row time should
  stay within ~4x the 1000-row time (linear), ``peakmem`` stays proportional to the rows.
"""

import numpy as np

from hmath_dl.layers import (append_cache, causal_mask, empty_cache, multihead_attention,
                             scaled_dot_product_attention)

from .common import TORCH, normal, skip_without_torch, torch_tensor

SEQ = [128, 512]
B = 8
D = 64


def _numpy_sdpa(q, k, v, mask):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    w = e / e.sum(axis=-1, keepdims=True)
    return w @ v, w


class CausalAttention:
    params = SEQ
    param_names = ["n"]

    def setup(self, n):
        self.x = normal((B, n, D), 11)
        self.mask = causal_mask(n, n, 0)
        scaled_dot_product_attention(self.x, self.x, self.x, self.mask)  # compile / load

    def time_sdpa_causal(self, n):
        scaled_dot_product_attention(self.x, self.x, self.x, self.mask)

    def time_sdpa_no_mask(self, n):
        scaled_dot_product_attention(self.x, self.x, self.x)

    def peakmem_sdpa_causal(self, n):
        scaled_dot_product_attention(self.x, self.x, self.x, self.mask)


class NumpyCausalAttention:
    params = SEQ
    param_names = ["n"]

    def setup(self, n):
        self.x = np.array(normal((B, n, D), 11))
        self.mask = np.tril(np.ones((n, n), dtype=bool))

    def time_numpy_sdpa_causal(self, n):
        _numpy_sdpa(self.x, self.x, self.x, self.mask)

    def peakmem_numpy_sdpa_causal(self, n):
        _numpy_sdpa(self.x, self.x, self.x, self.mask)


class TorchCausalAttention:
    params = SEQ
    param_names = ["n"]

    def setup(self, n):
        skip_without_torch()
        self.x = torch_tensor(normal((B, n, D), 11))
        self.f = TORCH.nn.functional.scaled_dot_product_attention
        self.f(self.x, self.x, self.x, is_causal=True)

    def time_torch_sdpa_causal(self, n):
        self.f(self.x, self.x, self.x, is_causal=True)

    def time_torch_sdpa_no_mask(self, n):
        self.f(self.x, self.x, self.x)


class GroupedQueryAttention:
    """Issue 18: ``enable_gqa`` with 8 query heads sharing 2 key/value heads, causal, against
    torch's ``enable_gqa`` (neither copies k/v; ours maps query head h to kv head h // 4)."""
    params = SEQ
    param_names = ["n"]

    def setup(self, n):
        self.q = normal((1, 8, n, 64), 14)
        self.kv = normal((1, 2, n, 64), 15)
        scaled_dot_product_attention(self.q, self.kv, self.kv, is_causal=True, enable_gqa=True)

    def time_sdpa_gqa_causal(self, n):
        scaled_dot_product_attention(self.q, self.kv, self.kv, is_causal=True, enable_gqa=True)


class TorchGroupedQueryAttention:
    params = SEQ
    param_names = ["n"]

    def setup(self, n):
        skip_without_torch()
        self.q = torch_tensor(normal((1, 8, n, 64), 14))
        self.kv = torch_tensor(normal((1, 2, n, 64), 15))
        self.f = TORCH.nn.functional.scaled_dot_product_attention
        self.f(self.q, self.kv, self.kv, is_causal=True, enable_gqa=True)

    def time_torch_sdpa_gqa_causal(self, n):
        self.f(self.q, self.kv, self.kv, is_causal=True, enable_gqa=True)


class MultiHead:
    params = SEQ
    param_names = ["n"]

    def setup(self, n):
        self.x = normal((n, 512), 12)
        self.mask = causal_mask(n, n, 0)
        multihead_attention(8, self.x, self.x, self.x, self.mask)

    def time_multihead_causal(self, n):
        multihead_attention(8, self.x, self.x, self.x, self.mask)


class TorchMultiHead:
    params = SEQ
    param_names = ["n"]

    def setup(self, n):
        skip_without_torch()
        x = torch_tensor(normal((n, 512), 12))
        self.x = x.reshape(n, 8, 64).transpose(0, 1)
        self.f = TORCH.nn.functional.scaled_dot_product_attention
        self.f(self.x, self.x, self.x, is_causal=True)

    def time_torch_multihead_causal(self, n):
        # includes the head split/merge, as ours does
        x = self.x
        self.f(x, x, x, is_causal=True).transpose(0, 1).reshape(x.shape[1], 512)


class KVCacheDecode:
    params = [1000, 4000]
    param_names = ["rows"]

    def setup(self, rows):
        rng = np.random.default_rng(13)
        self.k = [rng.standard_normal((1, 64)) for _ in range(rows)]
        self.v = [rng.standard_normal((1, 64)) for _ in range(rows)]
        self._decode(rows)  # warm-up

    def _decode(self, rows):
        c = empty_cache(rows, 64, 64)
        for k, v in zip(self.k, self.v):
            c = append_cache(c, k, v)
        return c

    def time_append_one_row_at_a_time(self, rows):
        self._decode(rows)

    def peakmem_append_one_row_at_a_time(self, rows):
        self._decode(rows)


class NumpyConcatenateDecode:
    """The naive immutable alternative: a full copy per appended row (quadratic)."""
    params = [1000, 4000]
    param_names = ["rows"]

    def setup(self, rows):
        rng = np.random.default_rng(13)
        self.k = [rng.standard_normal((1, 64)) for _ in range(rows)]

    def time_numpy_concatenate(self, rows):
        c = np.empty((0, 64))
        for k in self.k:
            c = np.concatenate([c, k])
