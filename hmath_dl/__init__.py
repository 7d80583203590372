"""hmath_dl — exactly specified deep-learning numerics with Numba kernels.

Modules
-------
errors       the MathError hierarchy
rng          RNG, an immutable Philox key/counter
precision    INT8 quantization, exact int8 GEMM, FP16/BF16 rounding, reduced GEMM, loss scaling
activations  Activation and activate
layers       dropout, normalisation, initialisers, embedding, dense, convolution, pooling,
             attention, positions, KV cache, differentiable layers
autodiff     ADTensor, a reverse-mode tape, check_gradients
optim        SGD with momentum, AdamW

Importing the package compiles nothing; each kernel is compiled (or loaded from the
on-disk cache) on its first call.
"""

from . import _threads

# Make Numba's fork-safe, thread-safe TBB layer loadable before the first parallel launch
# (see hmath_dl._threads).  Nothing is written into os.environ or numba.config.
_threads.preload_tbb()

# Freed arrays of the sizes a training step reuses stay in the heap instead of going back
# to the kernel and faulting in again (see hmath_dl._alloc; HMATH_DL_MALLOC=system: off).
from . import _alloc, config as _config  # noqa: E402

_alloc.tune(_config.MALLOC)
_alloc.enable_pool(_config.MALLOC)

from . import errors, rng
from .errors import (
    CapacityError,
    DomainError,
    IndexOutOfRange,
    MathError,
    NonFiniteError,
    NumericOverflow,
    ShapeError,
)
from .rng import RNG

__version__ = "0.1.0"
