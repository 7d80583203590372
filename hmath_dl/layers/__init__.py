"""HMath.DeepLearning.Layers, one module per family, re-exported flat here."""

from .dense import dense
from .dropout import Mode, dropout, spatial_dropout
from .normalization import (BatchNormState, batch_norm, group_norm, instance_norm, layer_norm,
                            rms_norm, weight_norm)
from .initializers import (Initializer, KaimingNormal, KaimingUniform, Orthogonal,
                           TruncatedNormal, XavierNormal, XavierUniform, initialize_weights)
from .embedding import embedding
# the _ad twins of every layer (one module per family, re-exported by .differentiable)
from .differentiable import (adaptive_pooling_ad, batch_norm_ad, convolution_ad, dense_ad,
                             depthwise_convolution_ad, dropout_ad, embedding_ad,
                             global_pooling_ad, group_norm_ad, instance_norm_ad, layer_norm_ad,
                             multihead_attention_ad, pooling_ad, rms_norm_ad,
                             rotary_embedding_ad, scaled_dot_product_attention_ad,
                             spatial_dropout_ad, transformer_feed_forward_ad,
                             transposed_convolution_ad, weight_norm_ad)
from .attention import (alibi_bias, causal_mask, multihead_attention, rotary_embedding,
                        scaled_dot_product_attention, sinusoidal_encoding)
from .kv_cache import KVCache, append_cache, cache_values, empty_cache
from .feed_forward import transformer_feed_forward
from .convolution import ConvOptions, convolution, depthwise_convolution, transposed_convolution
from .pooling import PoolMode, adaptive_pooling, global_pooling, max_pooling_with_indices, max_unpooling, pooling  # noqa: E501
