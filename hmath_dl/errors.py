"""The error hierarchy of hmath_dl.

Every rejected call raises a subclass of :class:`MathError`.  Each subclass also derives
from the builtin exception a Python user would reach for, so ``except ValueError`` keeps
working.  Messages follow one pattern: ``function: what is wrong (got X, expected Y)``.
"""

__all__ = [
    "MathError",
    "ShapeError",
    "DomainError",
    "NonFiniteError",
    "NumericOverflow",
    "IndexOutOfRange",
    "CapacityError",
]


class MathError(Exception):
    """Base class of every error raised by hmath_dl."""


class ShapeError(MathError, ValueError):
    """Ranks or shapes that do not fit together (or an output too large to allocate)."""


class DomainError(MathError, ValueError):
    """A parameter outside its domain (``p=1.5``, ``groups=0``, ``axis=7`` ...)."""


class NonFiniteError(MathError, ValueError):
    """A NaN or an infinity in an input.

    Raised when input data (an array-like such as ``x``, weights, gradients, a cotangent,
    or a loss value) holds NaN or ±inf.  A non-finite *result* of finite inputs is
    :class:`NumericOverflow` instead, and a non-finite scalar hyper-parameter
    (``epsilon``, ``lr`` ...) is a :class:`DomainError`.  Also a ``ValueError``.
    """


class NumericOverflow(MathError, ArithmeticError):
    """A result that is not representable: float overflow, int32 accumulator overflow,
    16-bit overflow, or a result that would be NaN."""


class IndexOutOfRange(MathError, IndexError):
    """An index outside its table (embedding lookups, class labels)."""


class CapacityError(MathError):
    """An append past the capacity of a :class:`~hmath_dl.layers.KVCache`."""
