"""FP16 / BF16: rounding straight from float64 with one round-half-to-even, exact
decoding, and a reduced-precision GEMM with a specified float32 accumulation order.

Formats (sign / exponent / fraction bits, exponent bias, largest finite value):

* FP16 (IEEE binary16): 1 / 5 / 10, bias 15, max 65504 = (2 - 2**-10) * 2**15,
  smallest subnormal 2**-24.
* BF16 (bfloat16): 1 / 8 / 7, bias 127, max (2 - 2**-7) * 2**127 ~ 3.3895e38,
  smallest subnormal 2**-133.

Unlike PyTorch and ml_dtypes (which round float64 -> float32 -> 16-bit, a double rounding),
the 16-bit pattern is computed directly from the float64 bits, so e.g.
``round_to_precision(BF16, nextafter(1.00390625, 2)) == 1.0078125``.
"""

from __future__ import annotations

import contextlib
import enum

import numpy as np

from .. import _checks
from .._kernels import half as _khalf
from .._kernels import gemm_reduced as _kgemm
from .._kernels._cpu import machine as _machine
from .._kernels._jit import runs_serial
from .._kernels._plan import forcing
from .._kernels.status import NO_INDEX, NONFINITE_INPUT, OK
from ..errors import DomainError, ShapeError

__all__ = ["Precision", "round_to_bits", "bits_to_float", "round_to_precision", "reduced_gemm"]


class Precision(enum.Enum):
    """A 16-bit floating-point storage format: ``FP16`` (IEEE binary16) or ``BF16``
    (bfloat16)."""

    FP16 = "FP16"
    BF16 = "BF16"


# (fraction bits, exponent bias, largest finite value)
_FORMAT = {
    Precision.FP16: (10, 15, 65504.0),
    Precision.BF16: (7, 127, float.fromhex("0x1.fep127")),
}


def _where(shape, flat_index):
    return tuple(int(i) for i in np.unravel_index(int(flat_index), shape))


def _round(fname: str, name: str, precision: Precision, arr: np.ndarray) -> np.ndarray:
    """uint16 patterns of the C-contiguous float64 array ``arr`` (same shape).  The kernel
    also detects NaN/inf (NonFiniteError, reported before any overflow)."""
    mbits, bias, fmax = _FORMAT[precision]
    out = _checks.alloc(fname, arr.shape, np.uint16)
    if arr.size == 0:
        return out
    bad = int(_whole(_khalf.round_bits_chunks, arr.size)(arr.reshape(-1), out.reshape(-1),
                                                         mbits, bias))
    return _finish_rounding(fname, name, precision, arr, bad, out)


def _whole(kernel, n):
    """``kernel`` (a chunk-parallel whole-array kernel of :mod:`.._kernels.half`) or its
    serial twin for ``n`` entries (same values either way): :meth:`Kernel.sized`, the one
    serial/parallel policy (below ``SERIAL_WORK`` entries, or as ``forced_schedule``
    says)."""
    return kernel.sized(n)


def _overflow(name, precision, arr, bad):
    fmax = _FORMAT[precision][2]
    value = float(arr.reshape(-1)[bad])
    return (f"{name} has {value!r} at index {_where(arr.shape, bad)}, which rounds to "
            f"{'-' if value < 0 else '+'}inf in {precision.name} (expected |value| to round to "
            f"at most {fmax!r})")


def _finish_rounding(fname, name, precision, arr, bad, out=None, inputs=None):
    """``out`` after a rounding kernel's index report ``bad`` (:mod:`.._kernels.status`):
    NONFINITE_SOMEWHERE has ``arr`` (or every array of ``inputs``, in order) scanned
    (NonFiniteError naming the entry), an index >= 0 is the first entry that rounds to
    +-inf (NumericOverflow)."""
    return _checks.finish(fname, _checks.located(bad), out=out,
                          inputs=((name, arr),) if inputs is None else inputs,
                          overflow=lambda i, code: _overflow(name, precision, arr, i))


def _decode(fname: str, name: str, precision: Precision, bits: np.ndarray) -> np.ndarray:
    """float64 values of the C-contiguous int64 or uint16 patterns ``bits`` (values in
    [0, 65535])."""
    mbits, bias, _ = _FORMAT[precision]
    out = _checks.alloc(fname, bits.shape, np.float64)
    if bits.size == 0:
        return out
    flat, oflat = bits.reshape(-1), out.reshape(-1)
    m = _machine()
    if mbits == 7 and not m.portable:   # BF16: a shift and an exact widening
        bad = int(_whole(_khalf.convert_bf16_chunks, bits.size)(flat, oflat))
    elif mbits == 10 and m.f16c:        # FP16: the hardware's exact conversion
        bad = int(_whole(_khalf.convert_fp16_chunks, bits.size)(flat, oflat))
    else:   # the table of every pattern's value (HMATH_DL_KERNELS=portable, or no F16C)
        bad = int(_whole(_khalf.decode_chunks, bits.size)(flat, oflat,
                                                          _decode_table(precision), mbits))
    # the kernel locates the first NaN/inf pattern itself: a NONFINITE_INPUT at that index
    return _checks.finish(fname, (OK, None) if bad == NO_INDEX else (NONFINITE_INPUT, bad),
                          out=out, nonfinite=lambda i: _bad_pattern(name, precision, bits, i))


_TABLES = {}


def _decode_table(precision):
    """Every pattern's value in ``precision`` (:func:`.._kernels.half.decode_table`), built
    on first use (1 ms; 512 KiB per format) and kept."""
    table = _TABLES.get(precision)
    if table is None:
        mbits, bias, _ = _FORMAT[precision]
        table = _TABLES[precision] = _khalf.decode_table(mbits, bias)
    return table


def _bad_pattern(name, precision, bits, bad):
    pattern = int(bits.reshape(-1)[bad])
    kind = "inf" if pattern & ((1 << _FORMAT[precision][0]) - 1) == 0 else "NaN"
    return (f"{name} holds the {precision.name} {kind} pattern 0x{pattern:04x} at index "
            f"{_where(bits.shape, bad)} (expected finite patterns)")


def round_to_bits(precision, x) -> np.ndarray:
    """Round ``x`` to the 16-bit format ``precision`` and return the bit patterns.

    Parameters
    ----------
    precision : Precision
    x : array_like of finite reals

    Returns
    -------
    numpy.ndarray of uint16, shape of ``x``
        ``rne16(x)``: the pattern of the representable value nearest to ``x``, ties to the
        even pattern, computed directly from the float64 bits with one rounding.  Values
        below half the smallest subnormal give +-0 (the sign is kept, -0.0 stays -0.0).
        ``.view(numpy.float16)`` (FP16) or ``.view(ml_dtypes.bfloat16)`` (BF16) reinterpret
        the result.

    Raises
    ------
    NonFiniteError
        ``x`` holds NaN or +-inf.
    NumericOverflow
        A finite entry rounds to +-inf (``|x| >=`` the midpoint between the largest finite value
        and the next power of two); the message names the first such index.
    TypeError
        ``precision`` is not a Precision, or ``x`` is not numeric.
    """
    fname = "round_to_bits"
    precision = _checks.member(fname, "precision", precision, Precision)
    arr = _checks.tensor(fname, "x", x, finite=False)     # finiteness checked by the kernel
    return _round(fname, "x", precision, arr)


def bits_to_float(precision, bits) -> np.ndarray:
    """Decode 16-bit patterns of the format ``precision`` exactly to float64.

    Parameters
    ----------
    precision : Precision
    bits : array_like of integers in [0, 65535]

    Returns
    -------
    numpy.ndarray of float64, shape of ``bits``
        ``(-1)**s * 2**(e - bias) * (1 + f / 2**m)`` for exponent field ``e > 0``, and
        ``(-1)**s * 2**(1 - bias) * (f / 2**m)`` for ``e == 0`` (subnormals, +-0), where
        ``m`` = 10 (FP16) or 7 (BF16).

    Raises
    ------
    TypeError
        ``bits`` holds floats or bools, or ``precision`` is not a Precision.
    DomainError
        A value lies outside [0, 65535].
    NonFiniteError
        A pattern encodes NaN or +-inf (all-ones exponent field).
    """
    fname = "bits_to_float"
    precision = _checks.member(fname, "precision", precision, Precision)
    if isinstance(bits, np.ndarray) and bits.dtype == np.uint16:
        # round_to_bits' own output type: every value is a 16-bit pattern, no widening
        return _decode(fname, "bits", precision, np.ascontiguousarray(bits))
    arr = _checks.int_array(fname, "bits", bits)
    if arr.shape == (1,) and np.ndim(bits) == 0:     # keep 0-d inputs 0-d
        arr = arr.reshape(())
    if arr.size:
        outside = (arr < 0) | (arr > 0xFFFF)
        if outside.any():
            flat = int(np.flatnonzero(outside.reshape(-1))[0])
            raise DomainError(
                f"{fname}: bits holds {int(arr.reshape(-1)[flat])} at index "
                f"{_where(arr.shape, flat)} (expected 16-bit patterns in [0, 65535])")
    return _decode(fname, "bits", precision, arr)


def round_to_precision(precision, x) -> np.ndarray:
    """Round ``x`` to the nearest value of the 16-bit format ``precision``, as float64.

    ``round_to_precision(p, x) == bits_to_float(p, round_to_bits(p, x))``: one
    round-half-to-even straight from float64 (no float32 detour), subnormals exact,
    -0.0 kept.

    Parameters
    ----------
    precision : Precision
    x : array_like of finite reals

    Returns
    -------
    numpy.ndarray of float64, shape of ``x``

    Raises
    ------
    NonFiniteError
        ``x`` holds NaN or +-inf.
    NumericOverflow
        A finite entry rounds to +-inf.
    TypeError
        ``precision`` is not a Precision, or ``x`` is not numeric.
    """
    fname = "round_to_precision"
    precision = _checks.member(fname, "precision", precision, Precision)
    arr = _checks.tensor(fname, "x", x, finite=False)     # finiteness checked by the kernel
    mbits, bias, _ = _FORMAT[precision]
    out = _checks.alloc(fname, arr.shape, np.float64)
    if arr.size == 0:
        return out
    status = int(_whole(_khalf.round_values_chunks, arr.size)(arr.reshape(-1), out.reshape(-1),
                                                              mbits, bias))
    return _finish_rounding(fname, "x", precision, arr, status, out)


def _round_float32(fname: str, precision: Precision, arr: np.ndarray):
    """(float32 copy of ``arr`` rounded to ``precision``, kernel status, magnitude range):
    every 16-bit value is a float32; status NONFINITE_SOMEWHERE = NaN/inf present, >= 0
    first overflow, NO_INDEX fine (:mod:`.._kernels.status`); the range is (largest |value|,
    smallest non-zero |value| or None)."""
    mbits, bias, _ = _FORMAT[precision]
    out = _checks.alloc(fname, arr.shape, np.float32)
    if arr.size == 0:
        return out, NO_INDEX, (0.0, None)
    stats = np.zeros(2, dtype=np.int64)
    status = int(_khalf.round_to_float(arr.reshape(-1), out.reshape(-1), mbits, bias, stats))
    if status != NO_INDEX:
        return out, status, None
    return out, status, _magnitude_range(precision, stats)


def _magnitude_range(precision, stats):
    """(largest |value|, smallest non-zero |value| or None) from the magnitude patterns
    ``stats`` (largest, smallest non-zero or 0x7FFF when every value is zero)."""
    hi, lo = (float(v) for v in _decode_magnitudes(precision, stats))
    return hi, None if int(stats[1]) == 0x7FFF else lo


def _decode_magnitudes(precision, patterns):
    """Decode magnitude patterns (the all-zero marker 0x7FFF decodes as 0, ignored)."""
    mbits, bias, _ = _FORMAT[precision]
    pats = np.ascontiguousarray(patterns, dtype=np.int64)
    out = np.empty(pats.shape, dtype=np.float64)
    _khalf.bits_to_float(pats, out, mbits, bias)
    return out


# Every product of two 16-bit values has at most 22 significant bits, so it is exact in
# float32 when its magnitude lies in [2**-126, 2**128) (or it is 0).  Then
# fma(a, b, acc) == fl32(acc + fl32(a * b)) bit for bit, and the fused kernel is used.
_F32_MIN_NORMAL = 2.0 ** -126
_F32_OVERFLOW = 2.0 ** 128
#: The reduced-GEMM arithmetics (speed only: the same bits): ``fused`` (the exact-FMA
#: kernel wherever every product is provably exact, else ``separate``) and ``separate``
#: (always the separate float32 multiply and add).
ARITHMETICS = ("fused", "separate")
_forced_arith = {"arithmetic": None}
# multiply-adds up to which reduced_gemm runs its serial kernels (same bits as the parallel
# ones): the portable path, and the tiled path (whose tasks are cheaper to start)
_SERIAL_GEMM_WORK = 1 << 24
_SERIAL_TILED_WORK = 1 << 21


@contextlib.contextmanager
def forced_arithmetic(name):
    """Within the block, :func:`reduced_gemm` uses the arithmetic ``name`` (one of
    :data:`ARITHMETICS`; ``None`` or ``"fused"`` restore the plan), for the tests that
    hold the exact-FMA kernel to the separate multiply/add one bit for bit.  Any other
    name raises ``ValueError``."""
    if name is not None and name not in ARITHMETICS:
        raise ValueError(f"reduced GEMM arithmetic {name!r} is not one of {ARITHMETICS}")
    with forcing(_forced_arith, "arithmetic", name):
        yield


def _products_exact(range_a, range_b) -> bool:
    """Whether the exact-FMA kernel may run: every product of the rounded operands with
    magnitude ranges ``(largest, smallest non-zero or None)`` is exact in float32 (the
    tiled path applies the same rule in its kernel: ``_kernels.gemm_reduced``)."""
    if _forced_arith["arithmetic"] == "separate":
        return False
    (hi_a, lo_a), (hi_b, lo_b) = range_a, range_b
    if lo_a is None or lo_b is None:          # an all-zero operand: every product is +-0
        return True
    # all magnitudes are 16-bit values: these float64 products are exact
    return hi_a * hi_b < _F32_OVERFLOW and lo_a * lo_b >= _F32_MIN_NORMAL


#: The reduced-GEMM paths (speed only: every path gives the same bits).
GEMM_PATHS = ("tiled", "portable")
_forced = {"gemm": None}


def gemm_paths():
    """The reduced-GEMM paths this process can run: ``tiled`` (register tiles on packed
    float32 panels, where the machine policy has tiles) and ``portable`` (always)."""
    return GEMM_PATHS if _machine().tiled else ("portable",)


@contextlib.contextmanager
def forced_gemm_path(name):
    """Within the block, :func:`reduced_gemm` takes path ``name`` (one of
    :data:`GEMM_PATHS`; ``None`` restores the plan), for the tests that hold every path
    to the same bits and for A/B benchmarks.  A path this machine cannot run raises
    ``ValueError``."""
    if name is not None and name not in gemm_paths():
        raise ValueError(f"reduced GEMM path {name!r} does not run here (available: "
                         f"{gemm_paths()})")
    with forcing(_forced, "gemm", name):
        yield


def gemm_path():
    """The path :func:`reduced_gemm` takes: the forced one, else ``tiled`` where the
    machine policy has tiles, else ``portable``."""
    return _forced["gemm"] or gemm_paths()[0]


def reduced_gemm(precision, a, b) -> np.ndarray:
    """Matrix product with operands rounded to ``precision`` and float32 accumulation in a
    specified order.

    Parameters
    ----------
    precision : Precision
    a : array_like, shape [M, K], finite
    b : array_like, shape [K, N], finite

    Returns
    -------
    numpy.ndarray of float64, shape [M, N]
        With ``a16 = round_to_precision(precision, a)`` and ``b16`` likewise, every output
        is ``float64(acc)`` where ``acc = +0.0f`` and, for ``k = 0, 1, ..., K-1`` in this
        order, ``acc = fl32(acc + fl32(a16[i, k] * b16[k, j]))`` (float32 round-half-to-even,
        separate multiply and add, never a fused multiply-add).  For ``K == 0`` every
        output is ``+0.0``.  The result is bit-exactly specified: identical on every
        machine and for every thread count.  (Every product of two 16-bit values has at
        most 22 significant bits; when all of them provably lie in float32's normal range,
        the kernel uses ``fma(a, b, acc)``, which is then bit-identical to the separate
        multiply and add; otherwise it multiplies and adds separately.)

    Raises
    ------
    ShapeError
        ``a`` or ``b`` is not 2-D, or ``a.shape[1] != b.shape[0]``.
    NonFiniteError
        ``a`` or ``b`` holds NaN or +-inf.
    NumericOverflow
        An entry of ``a`` or ``b`` rounds to +-inf in ``precision``, or a product or an
        accumulator reaches +-inf in float32.
    TypeError
        ``precision`` is not a Precision, or an operand is not numeric.
    """
    fname = "reduced_gemm"
    precision = _checks.member(fname, "precision", precision, Precision)
    a = _checks.tensor(fname, "a", a, ndim=2, finite=False)   # finiteness checked while rounding
    b = _checks.tensor(fname, "b", b, ndim=2, finite=False)
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"{fname}: a is {_checks.shape_str(a.shape)} and b is "
                         f"{_checks.shape_str(b.shape)} (expected a [M, K] and b [K, N] with "
                         f"the same K)")
    m, k = a.shape
    n = b.shape[1]
    out = _checks.alloc(fname, (m, n), np.float64)
    if m and n and k and gemm_path() == "tiled":
        # register-tiled path: the operands are rounded straight into packed float32
        # panels (the same values), then one product (the same bits as below)
        mbits, bias, _ = _FORMAT[precision]
        bad = _kgemm.reduced_tiled(
            a, b, mbits, bias, out, _forced_arith["arithmetic"] != "separate",
            serial=runs_serial(m * n * k <= _SERIAL_TILED_WORK))
        if bad == NO_INDEX:     # every output finite: the common case, no more Python
            return out
        if bad is not None:     # None: NaN/inf or an overflowing entry, named below
            return _finish(fname, precision, out, bad)
    a32, status_a, range_a = _round_float32(fname, precision, a)
    b32, status_b, range_b = _round_float32(fname, precision, b)
    operands = (("a", a), ("b", b))  # a NaN/inf in either is reported before any overflow
    _finish_rounding(fname, "a", precision, a, status_a, inputs=operands)
    _finish_rounding(fname, "b", precision, b, status_b, inputs=operands)
    if out.size == 0:
        return out
    if k == 0:
        out[...] = 0.0
        return out
    fused = _products_exact(range_a, range_b)
    # a parallel launch would cost more than it saves (unless forced_schedule says otherwise)
    bad = _kgemm.gemm_seq(a32, b32, out, fused,
                          serial=runs_serial(m * n * k <= _SERIAL_GEMM_WORK))
    return _finish(fname, precision, out, bad)


def _finish(fname, precision, out, bad):
    """``out``, unless the kernel reported the first non-finite output ``bad`` >= 0."""
    return _checks.finish(fname, _checks.located(bad), out=out,
                          overflow=lambda k, code: _accumulator_overflow(precision, out, k))


def _accumulator_overflow(precision, out, bad):
    i, j = _where(out.shape, bad)
    return (f"output [{i}, {j}] overflows float32 (a product or the float32 "
            f"accumulator reached {out[i, j]!r}; expected finite float32 sums of "
            f"{precision.name} products)")
