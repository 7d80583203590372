"""HMath.DeepLearning.Precision: INT8 quantization with an exact integer GEMM, FP16/BF16
rounding straight from float64, a reduced-precision GEMM with a specified float32
accumulation order, and dynamic loss scaling.
"""
