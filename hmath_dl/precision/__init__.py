"""HMath.DeepLearning.Precision: INT8 quantization with an exact integer GEMM, FP16/BF16
rounding straight from float64, a reduced-precision GEMM with a specified float32
accumulation order, and dynamic loss scaling.
"""

from .half import Precision, bits_to_float, reduced_gemm, round_to_bits, round_to_precision
from .mixed import (
    MAX_LOSS_SCALE,
    LossScaler,
    initial_loss_scaler,
    scale_loss,
    unscale_gradients,
    update_loss_scaler,
)
from .._gradutils import clip_gradients, gradient_norm
from .quantization import (
    Quantization,
    QuantizedTensor,
    dequantize,
    int8_gemm,
    quantization_scales,
    quantization_zero_points,
    quantize,
    quantized_values,
)
