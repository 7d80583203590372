"""The one status vocabulary of the kernels.

Kernels never raise for data-dependent reasons: they report what went wrong and the facade
turns the report into the documented error with :func:`hmath_dl._checks.finish`.  A report
is one of

* a :class:`Status` code -- returned, or written once per unit (row, channel, slice, query
  row) into an int8 status array;
* a flat *index* of the first bad element, with the two sentinels :data:`NO_INDEX`
  (nothing bad) and :data:`NONFINITE_SOMEWHERE` (a NaN/inf input somewhere; the facade
  scans the input to name it) -- for kernels that locate the first overflowing element;
* a bool (True: every value finite) or a count of bad units (0: all is well) -- the
  pooling kernels; the facade reads them as ``OK`` / not ``OK``.

Numba reads module-level ints of other modules as compile-time constants, so ``@njit``
code uses the plain ints below (``OK``, ``NONFINITE_INPUT``, ...), which are the enum's
values; Python code may use either.  Numba's on-disk cache does not notice a change of
this module: clear ``hmath_dl/_kernels/__pycache__`` after editing a value.
"""

from enum import IntEnum

__all__ = ["Status", "OK", "NONFINITE_INPUT", "OVERFLOW", "ZERO_SLICE", "SCORE_OVERFLOW",
           "INT_OVERFLOW", "NO_INDEX", "NONFINITE_SOMEWHERE"]


class Status(IntEnum):
    """What a kernel found in one unit of work (a row, channel, slice or query row)."""

    #: every input finite and every result representable
    OK = 0
    #: the unit holds a NaN/inf input (the facade raises NonFiniteError naming it)
    NONFINITE_INPUT = 1
    #: every input finite, but a result (or an intermediate the result depends on) is not
    #: representable in float64 (NumericOverflow)
    OVERFLOW = 2
    #: the unit is all zeros where a non-zero one is needed (weight norm: the norm is 0;
    #: DomainError in the forward pass)
    ZERO_SLICE = 3
    #: attention: an allowed score ``q . k * scale + bias`` of the query row is not finite
    #: (NumericOverflow naming the score rather than the output)
    SCORE_OVERFLOW = 4
    #: an integer accumulator leaves its range (int8 GEMM: the exact sum does not fit the
    #: signed 32-bit accumulator; NumericOverflow)
    INT_OVERFLOW = 5


# plain ints for @njit code (and for comparisons in facades)
OK = int(Status.OK)
NONFINITE_INPUT = int(Status.NONFINITE_INPUT)
OVERFLOW = int(Status.OVERFLOW)
ZERO_SLICE = int(Status.ZERO_SLICE)
SCORE_OVERFLOW = int(Status.SCORE_OVERFLOW)
INT_OVERFLOW = int(Status.INT_OVERFLOW)

#: index-valued reports: no element is bad
NO_INDEX = -1
#: index-valued reports: some input is NaN/inf (reported before any overflow)
NONFINITE_SOMEWHERE = -2
