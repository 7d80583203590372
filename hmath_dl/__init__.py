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

import os as _os

# Numba's OpenMP threading layer spins idle workers by default; on a busy machine (or with
# BLAS threads beside it) that makes every parallel launch cost milliseconds.  Sleeping
# workers cost microseconds per launch instead.  Only a default: the user's setting wins,
# and it matters only if set before the OpenMP runtime is loaded (our first parallel call).
def _openmp_already_loaded():
    """True when an OpenMP runtime (GNU libgomp) is already mapped into this process --
    e.g. torch was imported first.  Numba's OpenMP pool then shares that runtime (same
    soname), whose wait policy was fixed when it loaded.  Linux only (/proc/self/maps)."""
    try:
        with open("/proc/self/maps") as fh:
            return any("libgomp" in line for line in fh)
    except OSError:
        return False


if "OMP_WAIT_POLICY" not in _os.environ and _openmp_already_loaded():
    import warnings as _warnings
    _warnings.warn(
        "hmath_dl: an OpenMP runtime was loaded before hmath_dl (e.g. torch was imported "
        "first) and OMP_WAIT_POLICY is unset, so Numba's worker threads will busy-wait "
        "between kernels; on machines with few cores this can slow small kernels "
        "several-fold (a small CNN training step: 6 -> 16 ms on 2 cores). Import hmath_dl "
        "first, or set OMP_WAIT_POLICY=PASSIVE in the environment before starting Python.",
        RuntimeWarning, stacklevel=2)
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from . import errors, rng  # noqa: E402
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
