"""INT8 quantization (symmetric / asymmetric, per tensor or per channel) and an int8 GEMM
whose integer accumulation is exact and which refuses signed-32-bit accumulator overflow.

Every rounding is round-half-to-even (``numpy.rint`` semantics).  The formulas (API.md §3):

* SYMMETRIC: ``amax = max|x|`` over the slice, ``scale = amax / 127`` (``1.0`` for an
  all-zero slice), zero point ``0``, ``q = clip(rne(x / scale), -127, 127)``.
* ASYMMETRIC: ``lo = min(min x, 0)``, ``hi = max(max x, 0)``, ``scale = (hi - lo) / 255``
  (``1.0`` when ``hi == lo == 0``), ``zp = clip(rne(-128 - lo / scale), -128, 127)``,
  ``q = clip(rne(x / scale) + zp, -128, 127)``.
"""

from __future__ import annotations

import contextlib
import enum
import math
from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np

from .. import _checks
from .._kernels import quant as _kq
from .._kernels._jit import Kernel
from .._kernels.gemm_f64 import _workspace
from .._kernels._plan import forcing
from .._kernels.status import NO_INDEX, NONFINITE_SOMEWHERE
from ..errors import DomainError, ShapeError

__all__ = ["Quantization", "QuantizedTensor", "quantize", "dequantize", "quantized_values",
           "quantization_scales", "quantization_zero_points", "int8_gemm"]

_TINY = 2.2250738585072014e-308  # smallest positive normal double

# Work sizes up to which the kernels run on one thread: a parallel launch costs
# milliseconds on a loaded 2-core machine, more than the whole job below these sizes.
# The results are the same bits either way (the kernels do not depend on the thread count).
SERIAL_QUANTIZE_ELEMENTS = 1 << 17         # elements (2 threads, median: 1024 x 1024 quantize
                                           # 1165 -> 617 us, dequantize 374 -> 243; even at 2**16)
SERIAL_GEMM_WORK = 1 << 24          # multiply-adds M * K * N
_INT32_MIN = -(2 ** 31)
_INT32_MAX = 2 ** 31 - 1


class Quantization(enum.Enum):
    """INT8 quantization policy: ``SYMMETRIC`` (values in ``[-127, 127]``, zero point 0)
    or ``ASYMMETRIC`` (values in ``[-128, 127]`` with an integer zero point)."""

    SYMMETRIC = "SYMMETRIC"
    ASYMMETRIC = "ASYMMETRIC"


@dataclass(frozen=True, eq=False, repr=False)
class QuantizedTensor:
    """An opaque INT8 tensor: int8 values, one float64 scale and one int64 zero point per
    slice along ``axis`` (or a single pair when ``axis`` is None).

    Construct it only through :func:`quantize`; read it through :func:`quantized_values`,
    :func:`quantization_scales`, :func:`quantization_zero_points` and :func:`dequantize`.
    The constructor checks the invariants (dtypes, lengths, ranges) and stores read-only
    private copies, so a QuantizedTensor can never hold an inconsistent state.

    Attributes
    ----------
    shape : tuple of int
        Shape of the quantized tensor.
    axis : int or None
        The (non-negative) quantization axis, or None for per-tensor quantization.
    mode : Quantization
        The quantization policy.

    Equality compares mode, axis, shape and every value, scale and zero point; equal
    tensors hash equally.
    """

    mode: Quantization
    axis: Optional[int]
    _values: np.ndarray = field(repr=False)
    _scales: np.ndarray = field(repr=False)
    _zero_points: np.ndarray = field(repr=False)

    def __post_init__(self):
        fname = "QuantizedTensor"
        if not isinstance(self.mode, Quantization):
            raise TypeError(f"{fname}: mode must be a Quantization (got {self.mode!r})")
        values = self._values
        if not isinstance(values, np.ndarray) or values.dtype != np.int8:
            raise TypeError(f"{fname}: values must be an int8 ndarray")
        ndim = values.ndim
        if self.axis is None:
            count = 1
        else:
            if isinstance(self.axis, bool) or not isinstance(self.axis, int) \
                    or not 0 <= self.axis < ndim:
                raise DomainError(f"{fname}: axis must be None or an int in [0, {ndim}) "
                                  f"(got {self.axis!r})")
            count = values.shape[self.axis]
        if values.size == 0:
            raise ShapeError(f"{fname}: values must not be empty")
        scales = self._scales
        zps = self._zero_points
        if not isinstance(scales, np.ndarray) or scales.dtype != np.float64 \
                or scales.shape != (count,):
            raise ShapeError(f"{fname}: scales must be a float64 array of length {count}")
        if not isinstance(zps, np.ndarray) or zps.dtype != np.int64 or zps.shape != (count,):
            raise ShapeError(f"{fname}: zero points must be an int64 array of length {count}")
        if not (np.all(np.isfinite(scales)) and np.all(scales >= _TINY)):
            raise DomainError(f"{fname}: scales must be finite and >= {_TINY!r}")
        if self.mode is Quantization.SYMMETRIC:
            if np.any(zps != 0):
                raise DomainError(f"{fname}: symmetric zero points must be 0")
            if np.any(values == -128):
                raise DomainError(f"{fname}: symmetric values must lie in [-127, 127]")
        elif np.any(zps < -128) or np.any(zps > 127):
            raise DomainError(f"{fname}: zero points must lie in [-128, 127]")
        for name, arr in (("_values", values), ("_scales", scales), ("_zero_points", zps)):
            if arr.flags.writeable or not arr.flags.c_contiguous or arr.base is not None:
                arr = _checks.owned_readonly(arr)
                object.__setattr__(self, name, arr)

    @classmethod
    def _built(cls, mode, axis, values, scales, zero_points):
        """The tensor :func:`quantize` just computed, without the constructor's checks:
        its invariants hold by construction (the kernels clip every value to the mode's
        range and zero points to [-128, 127], and the facade has checked every scale),
        and the arrays are fresh, C-contiguous and read-only.  (Scanning the values for
        -128 again cost 60 us of a 0.5 ms per-row quantize of 1024 x 1024.)"""
        self = object.__new__(cls)
        for name, value in (("mode", mode), ("axis", axis), ("_values", values),
                            ("_scales", scales), ("_zero_points", zero_points)):
            object.__setattr__(self, name, value)
        return self

    def __reduce__(self):
        # pickle / copy go through the constructor, so restored arrays are read-only too
        return (QuantizedTensor, (self.mode, self.axis, self._values, self._scales,
                                  self._zero_points))

    @property
    def shape(self) -> Tuple[int, ...]:
        """Shape of the quantized tensor (a tuple of ints)."""
        return tuple(int(s) for s in self._values.shape)

    def __eq__(self, other):
        if not isinstance(other, QuantizedTensor):
            return NotImplemented
        return (self.mode is other.mode and self.axis == other.axis
                and self._values.shape == other._values.shape
                and np.array_equal(self._values, other._values)
                and np.array_equal(self._scales.view(np.uint64), other._scales.view(np.uint64))
                and np.array_equal(self._zero_points, other._zero_points))

    def __hash__(self):
        return hash((self.mode, self.axis, self._values.shape, self._values.tobytes(),
                     self._scales.tobytes(), self._zero_points.tobytes()))

    def __repr__(self):
        def head(arr, limit=4):
            items = ", ".join(repr(v) for v in arr[:limit].tolist())
            return "[" + items + (", ...]" if arr.size > limit else "]")
        return (f"QuantizedTensor(mode={self.mode.name}, axis={self.axis}, "
                f"shape={self.shape}, scales={head(self._scales)}, "
                f"zero_points={head(self._zero_points)})")


class _Launch:
    """The kernels of one call, each on its serial path when the call is ``small`` (the
    caller's own size test): ``_Launch(small).name`` is ``_kq.name`` through
    :meth:`~hmath_dl._kernels._jit.Kernel.when_small`, so the package's one serial/parallel
    policy (and :func:`~hmath_dl._kernels._jit.forced_schedule`) decides; helpers pass
    through unchanged."""

    __slots__ = ("small",)

    def __init__(self, small):
        self.small = bool(small)

    def __getattr__(self, name):
        k = getattr(_kq, name)
        return k.when_small(self.small) if isinstance(k, Kernel) else k


def _layout(shape, axis):
    """(outer, channels, inner) view of a C-contiguous tensor for ``axis``."""
    # math.prod of Python ints (numpy's prod of a tuple costs microseconds per call)
    if axis is None:
        return 1, 1, math.prod(int(s) for s in shape)
    outer = math.prod(int(s) for s in shape[:axis])
    inner = math.prod(int(s) for s in shape[axis + 1:])
    return outer, int(shape[axis]), inner


def _qtensor(fname, name, q):
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"{fname}: {name} must be a QuantizedTensor (got {type(q).__name__})")
    return q


def quantize(mode, axis, x) -> QuantizedTensor:
    """Quantize a finite, non-empty tensor to INT8, per tensor or per slice along ``axis``.

    Parameters
    ----------
    mode : Quantization
        ``SYMMETRIC`` or ``ASYMMETRIC``.
    axis : int or None
        None for one scale for the whole tensor; otherwise an int in ``[-ndim, ndim)``:
        one scale (and zero point) per index along that axis ("per channel").
    x : array_like
        Finite, non-empty real values (any shape; a 0-d input allows only ``axis=None``).

    Returns
    -------
    QuantizedTensor

    Notes
    -----
    ``rne`` is round-half-to-even; over each slice:

    * SYMMETRIC: ``amax = max|x|``, ``scale = amax / 127`` (``1.0`` for an all-zero
      slice), ``zp = 0``, ``q = clip(rne(x / scale), -127, 127)``.
    * ASYMMETRIC: ``lo = min(min(x), 0)``, ``hi = max(max(x), 0)``,
      ``scale = (hi - lo) / 255`` (``1.0`` if ``hi == lo == 0``),
      ``zp = clip(rne(-128 - lo / scale), -128, 127)``,
      ``q = clip(rne(x / scale) + zp, -128, 127)``.

    ``x / scale`` is a true division (not a multiplication by ``1 / scale``).

    Raises
    ------
    TypeError
        ``mode`` not a Quantization, ``axis`` not None or an int, ``x`` not numeric.
    ShapeError
        ``x`` is empty.
    NonFiniteError
        ``x`` holds NaN or ±inf.
    DomainError
        ``axis`` outside ``[-ndim, ndim)``.
    NumericOverflow
        A scale is 0, subnormal (``< 2.2250738585072014e-308``) or not finite.
    """
    fname = "quantize"
    _checks.member(fname, "mode", mode, Quantization)
    if axis is not None:
        _checks.integer(fname, "axis", axis)
    arr = _checks.tensor(fname, "x", x, nonempty=True, finite=False)  # finiteness: below
    try:
        ax = None if axis is None else _checks.axis(fname, "axis", axis, arr.ndim)
    except DomainError:
        _checks.require_finite(fname, "x", arr)     # a NaN/inf is reported first
        raise
    outer, nch, inner = _layout(arr.shape, ax)
    flat = arr.reshape(-1)
    symmetric = mode is Quantization.SYMMETRIC
    scales = _checks.alloc(fname, (nch,), np.float64)
    zps = _checks.alloc(fname, (nch,), np.int64)
    kern = _Launch(flat.size <= SERIAL_QUANTIZE_ELEMENTS)
    if ax is None:
        bad = int(kern.quant_params_tensor(flat, symmetric, scales, zps))
    else:
        bad = int(kern.quant_params_axis(flat, outer, nch, inner, symmetric, scales, zps))
    if bad == NONFINITE_SOMEWHERE:      # the parameter pass counts NaN/inf as it reads x
        _checks.require_finite(fname, "x", arr)
    _checks.finish(fname, _checks.located(bad), overflow=lambda i, code: (
        f"the scale of {'the tensor' if ax is None else f'slice {i} along axis {ax}'} is "
        f"{float(scales[i])!r} (expected a finite scale >= {_TINY!r}; the values are too "
        f"small or their range too large to quantize)"))
    values = _checks.alloc(fname, arr.shape, np.int8)
    kern.quantize_apply(flat, nch, inner, symmetric, scales, zps, values.reshape(-1))
    return QuantizedTensor._built(mode, ax, _checks.readonly(values), _checks.readonly(scales),
                                  _checks.readonly(zps))


def dequantize(q) -> np.ndarray:
    """Decode a QuantizedTensor: ``scale * (q - zp)`` per slice.

    ``q - zp`` is exact (an integer in [-255, 255]), then multiplied by the slice's float64
    scale.

    Parameters
    ----------
    q : QuantizedTensor

    Returns
    -------
    ndarray of float64, shape ``q.shape``

    Raises
    ------
    TypeError
        ``q`` is not a QuantizedTensor.
    NumericOverflow
        A decoded value is not finite.
    """
    fname = "dequantize"
    _qtensor(fname, "q", q)
    values = q._values
    _, nch, inner = _layout(values.shape, q.axis)
    out = _checks.alloc(fname, values.shape, np.float64)
    kern = _Launch(values.size <= SERIAL_QUANTIZE_ELEMENTS)
    bad = int(kern.dequantize_apply(values.reshape(-1), nch, inner, q._scales,
                                  q._zero_points, out.reshape(-1)))
    return _checks.finish(fname, _checks.located(bad), out=out, overflow=lambda f, code: (
        f"the decoded value at index {tuple(int(i) for i in np.unravel_index(f, values.shape))} "
        f"is not finite (got {float(out.reshape(-1)[f])!r})"))


def quantized_values(q) -> np.ndarray:
    """The int8 values ``v`` of ``q``, with ``x ≈ scale * (v - zero_point)`` per slice.

    Symmetric values lie in ``[-127, 127]``, asymmetric ones in ``[-128, 127]``.

    Parameters
    ----------
    q : QuantizedTensor
        A result of :func:`quantize`.

    Returns
    -------
    ndarray of int8, shape ``q.shape``
        Row-major (C-contiguous) and read-only: the array stored in ``q`` itself, not a copy.

    Raises
    ------
    TypeError
        ``q`` is not a QuantizedTensor.
    """
    return _qtensor("quantized_values", "q", q)._values


def quantization_scales(q) -> np.ndarray:
    """The float64 scales of ``q``: ``amax / 127`` (SYMMETRIC) or ``(hi - lo) / 255`` (ASYMMETRIC).

    One scale per slice along ``q.axis``, or a single one (length 1) for per-tensor
    quantization; ``1.0`` for an all-zero slice.  Every scale is positive, finite and normal
    (``>= 2.2250738585072014e-308``).

    Parameters
    ----------
    q : QuantizedTensor
        A result of :func:`quantize`.

    Returns
    -------
    ndarray of float64, shape ``(q.shape[q.axis],)`` or ``(1,)`` when ``q.axis`` is None
        Read-only: the array stored in ``q`` itself, not a copy.

    Raises
    ------
    TypeError
        ``q`` is not a QuantizedTensor.
    """
    return _qtensor("quantization_scales", "q", q)._scales


def quantization_zero_points(q) -> np.ndarray:
    """The int64 zero points of ``q``: ``0`` (SYMMETRIC) or ``clip(rne(-128 - lo / scale), -128, 127)``.

    Same length as the scales (one per slice along ``q.axis``, or 1); all 0 for SYMMETRIC,
    in ``[-128, 127]`` for ASYMMETRIC.

    Parameters
    ----------
    q : QuantizedTensor
        A result of :func:`quantize`.

    Returns
    -------
    ndarray of int64, same shape as :func:`quantization_scales` ``(q)``
        Read-only: the array stored in ``q`` itself, not a copy.

    Raises
    ------
    TypeError
        ``q`` is not a QuantizedTensor.
    """
    return _qtensor("quantization_zero_points", "q", q)._zero_points


# --------------------------------------------------------------------------- int8 GEMM
#: The int8 GEMM paths (every one exact and bit-identical to the others; see
#: :func:`gemm_path`).
GEMM_PATHS = ("vnni", "pmaddwd", "skinny", "portable")
#: Largest M (or N) that takes the skinny path.
SKINNY_MAX = 16
_forced = {"gemm": None}


def _want_vnni() -> bool:
    """Use the AVX-512 VNNI kernel?  When the machine policy says numba's target has
    AVX-512 VNNI (and neither ``HMATH_DL_KERNELS`` nor ``HMATH_DL_INT8_KERNEL`` is
    ``portable``)."""
    from .. import config
    from .._kernels._cpu import machine
    if config.INT8_KERNEL == "portable":
        return False
    return machine().avx512_vnni


def _want_pmaddwd() -> bool:
    """Use the int16-pair (``vpmaddwd``) kernels?  When the machine policy's micro-kernel
    family is AVX2 or AVX-512 (the target has AVX2) and no override asks for the portable
    kernel."""
    from .. import config
    from .._kernels._cpu import machine
    if config.INT8_KERNEL == "portable":
        return False
    return machine().avx2


def gemm_paths():
    """The int8 GEMM paths this process can run (``portable`` always)."""
    out = []
    if _want_vnni():
        out.append("vnni")
    if _want_pmaddwd():
        out += ["pmaddwd", "skinny"]
    return tuple(out + ["portable"])


@contextlib.contextmanager
def forced_gemm_path(name):
    """Within the block, :func:`int8_gemm` takes path ``name`` (one of
    :data:`GEMM_PATHS`; ``None`` restores the plan), for the tests that hold every path
    to the same bits and for A/B benchmarks.  A path this machine cannot run raises
    ``ValueError``."""
    if name is not None and name not in GEMM_PATHS:
        raise ValueError(f"unknown int8 GEMM path {name!r} (expected one of {GEMM_PATHS})")
    if name is not None and name not in gemm_paths():
        raise ValueError(f"int8 GEMM path {name!r} does not run here (available: "
                         f"{gemm_paths()})")
    with forcing(_forced, "gemm", name):
        yield


def gemm_path(m, k, n):
    """The plan: which kernel ``int8_gemm`` runs for ``[m, k] x [k, n]`` (the choice is
    speed only, every path gives the same bits):

    * ``skinny`` (AVX2 / AVX-512): ``m`` or ``n`` at most :data:`SKINNY_MAX` (batch-1
      inference): the large operand is read in place, no packing pass;
    * ``vnni`` (AVX-512 VNNI): ``vpdpbusd`` register tiles on packed operands;
    * ``pmaddwd`` (AVX2, AVX-512 without VNNI): int16-pair register tiles;
    * ``portable``: plain dot-product loops, everywhere else.
    """
    forced = _forced["gemm"]
    if forced is not None:
        return forced
    avail = gemm_paths()
    if "skinny" in avail and min(m, n) <= SKINNY_MAX:
        return "skinny"
    return avail[0]


def _per_channel(values, count):
    """A new writable length-``count`` vector from a length-1 or length-``count`` one
    (always a fresh writable array, so each kernel compiles for one array type only)."""
    if values.shape[0] == count:
        return np.array(values, copy=True)
    return np.full(count, values[0], dtype=values.dtype)


def int8_gemm(a, b) -> np.ndarray:
    """Multiply two INT8 matrices with exact integer accumulation, then apply the scales.

    Parameters
    ----------
    a : QuantizedTensor
        ``[M, K]``, quantized per tensor (``axis=None``) or per row (``axis=0``).
    b : QuantizedTensor
        ``[K, N]``, quantized per tensor (``axis=None``) or per column (``axis=1``).

    Returns
    -------
    ndarray of float64, shape ``[M, N]``

    Notes
    -----
    ``acc[i, j] = sum_k (qa[i, k] - za[i]) * (qb[k, j] - zb[j])`` is computed exactly (in
    integers, for any K); the result is ``(sa[i] * sb[j]) * acc[i, j]`` in float64, where
    a per-tensor operand uses its single scale/zero point for every row/column.  The
    result is bitwise identical for any number of threads.

    For a linear layer ``y = x @ W.T`` with ``W`` of shape ``[out, in]`` quantized per
    output channel, quantize ``W.T`` per column::

        qx = quantize(Quantization.SYMMETRIC, None, x)      # [batch, in], per tensor
        qw = quantize(Quantization.SYMMETRIC, 1, W.T)       # [in, out], one scale per output
        y = int8_gemm(qx, qw)                               # ~ x @ W.T

    (``quantize(mode, 1, W.T)`` has exactly the scales of ``quantize(mode, 0, W)``.)

    Raises
    ------
    TypeError
        ``a`` or ``b`` is not a QuantizedTensor.
    ShapeError
        An operand is not 2-D, or ``a.shape[1] != b.shape[0]``.
    DomainError
        ``a.axis`` not in ``{None, 0}`` or ``b.axis`` not in ``{None, 1}``.
    NumericOverflow
        Some ``acc[i, j]`` lies outside ``[-2**31, 2**31 - 1]`` (a signed 32-bit
        accumulator would overflow), or a result is not finite.
    """
    fname = "int8_gemm"
    _qtensor(fname, "a", a)
    _qtensor(fname, "b", b)
    if len(a.shape) != 2:
        raise ShapeError(f"{fname}: a must have 2 axes (got shape {_checks.shape_str(a.shape)})")
    if len(b.shape) != 2:
        raise ShapeError(f"{fname}: b must have 2 axes (got shape {_checks.shape_str(b.shape)})")
    if a.axis not in (None, 0):
        raise DomainError(f"{fname}: a must be quantized per tensor or per row (got axis "
                          f"{a.axis}, expected None or 0)")
    if b.axis not in (None, 1):
        raise DomainError(f"{fname}: b must be quantized per tensor or per column (got axis "
                          f"{b.axis}, expected None or 1)")
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        raise ShapeError(f"{fname}: a has {k} columns but b has {k2} rows (got shapes "
                         f"{_checks.shape_str(a.shape)} and {_checks.shape_str(b.shape)})")
    qa = a._values
    qb = b._values
    sa = _per_channel(a._scales, m)
    za = _per_channel(a._zero_points, m)
    sb = _per_channel(b._scales, n)
    zb = _per_channel(b._zero_points, n)
    out = _checks.alloc(fname, (m, n), np.float64)
    ra = np.empty(m, dtype=np.int64)
    cb = np.empty(n, dtype=np.int64)
    path = gemm_path(m, k, n)
    # the skinny path is memory-bound: its work is the bytes of the large operand
    work = 16 * k * max(m, n) if path == "skinny" else m * k * n
    kern = _Launch(work <= SERIAL_GEMM_WORK)
    if path == "vnni":
        first_acc, first_fin = _gemm_vnni(kern, fname, qa, qb, m, k, n, ra, cb, za, zb, sa, sb,
                                          out)
    elif path == "pmaddwd":
        first_acc, first_fin = _gemm_pmaddwd(kern, fname, qa, qb, m, k, n, ra, cb, za, zb, sa,
                                             sb, out)
    elif path == "skinny":
        first_acc, first_fin = _gemm_skinny(kern, fname, qa, qb, m, k, n, za, zb, sa, sb, out)
    else:
        kern.row_sums(qa, ra)
        kern.col_sums(qb, cb)
        qbt = _checks.alloc(fname, (n, k), np.int8)
        kern.transpose_i8(qb, qbt)
        bad_acc = np.empty(m, dtype=np.int64)
        bad_fin = np.empty(m, dtype=np.int64)
        kern.gemm_portable(qa, qbt, ra, cb, za, zb, sa, sb, out, bad_acc, bad_fin)
        first_acc = _first_flat(bad_acc, n)
        first_fin = _first_flat(bad_fin, n)
    # an accumulator leaving int32 is reported before a non-finite result
    _checks.finish(fname, _checks.located(first_acc),
                   overflow=lambda f, code: _accumulator_overflow(qa, qb, za, zb, n, f))
    return _checks.finish(fname, _checks.located(first_fin), out=out,
                          overflow=lambda f, code: _result_overflow(out, sa, sb, n, f))


def _result_overflow(out, sa, sb, n, first):
    i, j = divmod(first, n)
    return (f"the result at (i, j) = ({i}, {j}) is not finite (got "
            f"{float(out[i, j])!r} = ({float(sa[i])!r} * {float(sb[j])!r}) * acc)")


def _accumulator_overflow(qa, qb, za, zb, n, first):
    i, j = divmod(first, n)
    exact = int(np.dot(qa[i].astype(np.int64) - int(za[i]),
                       qb[:, j].astype(np.int64) - int(zb[j])))
    return (f"the exact integer accumulator at (i, j) = ({i}, {j}) is {exact}, "
            f"outside the signed 32-bit range (expected {_INT32_MIN} <= acc <= {_INT32_MAX})")


def _task_first(bad):
    """The smallest flat index over per-task minima (``_NO_INDEX``: none), or -1."""
    first = int(bad.min()) if bad.size else int(_kq._NO_INDEX)
    return NO_INDEX if first >= int(_kq._NO_INDEX) else first


def _packed(fname, name, size, dtype):
    """A packing buffer of ``size`` elements (every element is written by the pack
    kernels): the calling thread's reused workspace (fresh pages cost a fault each: the
    two 2 MiB panels of a 1024^3 product paid ~0.4 ms), after the size check of
    :func:`_checks.alloc`."""
    _checks.check_size(fname, (size,), dtype)
    return _workspace(name, size, dtype)


def _gemm_vnni(kern, fname, qa, qb, m, k, n, ra, cb, za, zb, sa, sb, out):
    mr, nr = _kq._MR, _kq._NR
    mp = -(-m // mr) * mr
    np_ = -(-n // nr) * nr
    kp = -(-k // 4) * 4
    ap = _packed(fname, "q8a", mp * kp, np.uint8)
    bp = _packed(fname, "q8b", np_ * kp, np.int8)
    kern.pack_a_u8(qa, mp, kp, ap, ra)
    kern.pack_b_vnni(qb, np_, kp, bp.view(np.uint32), cb)
    ntiles = (mp // mr) * (np_ // nr)
    ntask = -(-ntiles // _kq._TILES_PER_TASK)
    bad_acc = np.empty(ntask, dtype=np.int64)
    bad_fin = np.empty(ntask, dtype=np.int64)
    kern.gemm_vnni(ap, bp, m, n, k, mp, np_, kp, ra, cb, za, zb, sa, sb, out, bad_acc, bad_fin)
    return _task_first(bad_acc), _task_first(bad_fin)


def _gemm_pmaddwd(kern, fname, qa, qb, m, k, n, ra, cb, za, zb, sa, sb, out):
    mr, nr = _kq._WD_MR, _kq._WD_NR
    mp = -(-m // mr) * mr
    np_ = -(-n // nr) * nr
    kq = -(-k // 2)
    ap = _packed(fname, "q8a", mp * kq * 2, np.int16)
    bp = _packed(fname, "q8b", np_ * kq * 2, np.int16)
    kern.pack_a_wd(qa, mp, kq, ap, ra)
    if 2 * kq != k or np_ != n:
        qbpad = _checks.alloc(fname, (2 * kq, np_), np.int8)
        qbpad[...] = 0
        qbpad[:k, :n] = qb
    else:
        qbpad = np.zeros((0, np_), dtype=np.int8)
    kern.pack_b_wd(qb, qbpad, np_, kq, bp, cb)
    ntiles = (mp // mr) * (np_ // nr)
    ntask = -(-ntiles // _kq._WD_TILES_PER_TASK)
    bad_acc = np.empty(ntask, dtype=np.int64)
    bad_fin = np.empty(ntask, dtype=np.int64)
    kern.gemm_wd(ap, bp, m, n, k, mp, np_, kq, ra, cb, za, zb, sa, sb, out, bad_acc, bad_fin)
    return _task_first(bad_acc), _task_first(bad_fin)


def _skinny_sums(kern, fname, rows, wide, ones):
    """``(S, sums)``: ``S[r, j] = sum_k rows[r, k] * wide[k, j]`` exactly (int64, plus a
    last row of column sums of ``wide`` when ``ones``) and the row sums of ``rows``."""
    r, k = rows.shape
    w = wide.shape[1]
    nrows = r + (1 if ones else 0)
    ap = _checks.alloc(fname, (nrows, k // 2), np.int32)
    alast = np.empty(nrows, dtype=np.int64)
    sums = np.empty(r, dtype=np.int64)
    kern.pack_a_pairs(rows, ones, ap, alast, sums)
    tw = _kq._SK_TW
    tail = w % tw
    if tail:
        btail = _checks.alloc(fname, (k, tw), np.int8)
        btail[:, tail:] = 0
        btail[:, :tail] = wide[:, w - tail:]
    else:
        btail = np.zeros((0, tw), dtype=np.int8)
    s64 = _checks.alloc(fname, (nrows, w), np.int64)
    kern.gemm_skinny(ap, alast, wide, btail, k, s64)
    return s64, sums


def _gemm_skinny(kern, fname, qa, qb, m, k, n, za, zb, sa, sb, out):
    if m <= n or m <= SKINNY_MAX:
        # rows of A against B in place; the ones row gives B's column sums (needed only
        # when some za != 0)
        ones = bool(np.any(za != 0))
        s64, ra = _skinny_sums(kern, fname, qa, qb, ones)
        cb = s64[m].copy() if ones else np.zeros(n, dtype=np.int64)
        s = s64[:m] if ones else s64
    else:
        # few columns: S^T = B^T A^T, with A^T (one transposing pass over A) as the wide
        # operand; the ones row gives A's row sums (needed only when some zb != 0)
        ones = bool(np.any(zb != 0))
        qbt = np.ascontiguousarray(qb.T)
        qat = _checks.alloc(fname, (k, m), np.int8)
        kern.transpose_i8(qa, qat)
        s64, cb = _skinny_sums(kern, fname, qbt, qat, ones)
        ra = s64[n].copy() if ones else np.zeros(m, dtype=np.int64)
        s = np.ascontiguousarray(s64[:n].T)
    s = np.ascontiguousarray(s)
    bad_acc = np.empty(m, dtype=np.int64)
    bad_fin = np.empty(m, dtype=np.int64)
    kern.finish_s(s, m, k, ra, cb, za, zb, sa, sb, out, bad_acc, bad_fin)
    return _first_flat(bad_acc, n), _first_flat(bad_fin, n)


def _first_flat(bad_cols, n):
    """Smallest ``i * n + j`` over rows ``i`` whose first bad column ``j`` is ``>= 0``."""
    rows = np.flatnonzero(bad_cols >= 0)
    if rows.size == 0:
        return NO_INDEX
    i = int(rows[0])
    return i * n + int(bad_cols[i])
