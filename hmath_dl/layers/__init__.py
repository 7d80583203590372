"""HMath.DeepLearning.Layers, one module per family, re-exported flat here."""

from .dense import dense
from .dropout import Mode, dropout, spatial_dropout
from .normalization import (BatchNormState, batch_norm, group_norm, instance_norm, layer_norm,
                            rms_norm, weight_norm)
from .initializers import (Initializer, KaimingNormal, KaimingUniform, Orthogonal,
                           TruncatedNormal, XavierNormal, XavierUniform, initialize_weights)
from .embedding import embedding
from .differentiable import (batch_norm_ad, convolution_ad, dense_ad, dropout_ad, embedding_ad,
                             layer_norm_ad, multihead_attention_ad, pooling_ad, rms_norm_ad,
                             scaled_dot_product_attention_ad, transposed_convolution_ad)
from .attention import (alibi_bias, causal_mask, multihead_attention, rotary_embedding,
                        scaled_dot_product_attention, sinusoidal_encoding)
from .kv_cache import KVCache, append_cache, cache_values, empty_cache
from .feed_forward import transformer_feed_forward
from .convolution import ConvOptions, convolution, depthwise_convolution, transposed_convolution
# pooling family (plain and _ad)
from .pooling import PoolMode, adaptive_pooling, global_pooling, max_pooling_with_indices, max_unpooling, pooling  # noqa: E501
from ._ad_pool import adaptive_pooling_ad, global_pooling_ad, pooling_ad
from ._ad_norm import group_norm_ad, instance_norm_ad, weight_norm_ad
# attention/position/feed-forward _ad twins
from ._ad_transformer import rotary_embedding_ad, transformer_feed_forward_ad
# convolution/dropout _ad twins
from .differentiable import depthwise_convolution_ad, spatial_dropout_ad
