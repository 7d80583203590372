"""Differentiable layers: ADTensor in, ADTensor out.

One module per family, all re-exported here and flat by :mod:`hmath_dl.layers`:
``_ad_dense`` (dense, embedding, dropout), ``_ad_conv`` (the convolutions), ``_ad_norm``,
``_ad_pool``, ``_ad_attention`` and ``_ad_transformer`` (rotary embedding, feed-forward).

Each ``*_ad`` function computes its forward value with the plain layer of
:mod:`hmath_dl.layers` (so the numbers are bit for bit those of the plain op) and records
one node of the :mod:`hmath_dl.autodiff` tape whose vector-Jacobian rule is a Numba
kernel: parallel over the gradient's own outputs, fixed summation orders, hence bitwise
identical for any thread count.  A layer is declared with ``@differentiable(...)``
(:func:`hmath_dl.layers._ad_common.differentiable`: the argument conversion, the error
prefix and the tape node, written once) over its forward on plain arrays, and its rule
follows it, ``@vjp_of(layer)`` (:func:`hmath_dl.autodiff.core.vjp_of`).  The norms (a
normalisation node plus an affine node) and the feed-forward block (a composite) are
written out.

Arguments that are not ADTensors (plain arrays) are treated as constants.  Errors raised
by the plain layer are re-raised with this function's name in front, e.g.
``dense_ad: dense: x has 3 input features, weights expect 4 ...``.
"""

from ._ad_attention import multihead_attention_ad, scaled_dot_product_attention_ad
from ._ad_conv import convolution_ad, depthwise_convolution_ad, transposed_convolution_ad
from ._ad_dense import dense_ad, dropout_ad, embedding_ad, spatial_dropout_ad
from ._ad_norm import (batch_norm_ad, group_norm_ad, instance_norm_ad, layer_norm_ad,
                       rms_norm_ad, weight_norm_ad)
from ._ad_pool import adaptive_pooling_ad, global_pooling_ad, pooling_ad
from ._ad_transformer import rotary_embedding_ad, transformer_feed_forward_ad

__all__ = ["dense_ad", "embedding_ad", "dropout_ad", "spatial_dropout_ad",
           "convolution_ad", "depthwise_convolution_ad", "transposed_convolution_ad",
           "layer_norm_ad", "rms_norm_ad", "group_norm_ad", "instance_norm_ad",
           "weight_norm_ad", "batch_norm_ad",
           "pooling_ad", "adaptive_pooling_ad", "global_pooling_ad",
           "scaled_dot_product_attention_ad", "multihead_attention_ad",
           "rotary_embedding_ad", "transformer_feed_forward_ad"]
