"""HMath.DeepLearning.Layers, one module per family, re-exported flat here."""

from .dense import dense
from .dropout import Mode, dropout, spatial_dropout
from .normalization import (BatchNormState, batch_norm, group_norm, instance_norm, layer_norm,
                            rms_norm, weight_norm)
from .initializers import (Initializer, KaimingNormal, KaimingUniform, Orthogonal,
                           TruncatedNormal, XavierNormal, XavierUniform, initialize_weights)
from .embedding import embedding
