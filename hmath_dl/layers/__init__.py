"""HMath.DeepLearning.Layers, one module per family, re-exported flat here."""
