"""HMath.DeepLearning.Layers, one module per family, re-exported flat here."""

from .dense import dense
