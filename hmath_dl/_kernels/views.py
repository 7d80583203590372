"""Array views for kernel arguments (plain Python, shared by the whole package).

The spatial kernels (convolution, pooling, their backward passes) are compiled once, for
rank-5 arrays ``(N, C, D, H, W)``; 1-D and 2-D inputs ``(N, C, W)`` / ``(N, C, H, W)`` are
passed as rank 5 with unit axes inserted after ``N, C``.  Numba compiles one specialisation
per array type, writeable and read-only arrays being different types, so each kernel takes
each argument with one fixed writeability:

- :func:`out5` -- a kernel output (writeable) as rank 5;
- :func:`readonly5` -- an input as rank 5, typed read-only (an O(1) view, never a copy);
  the pooling kernels and the im2col/col2im backward kernels take their inputs this way;
- :func:`writeable5` -- an input as rank 5, writeable (a read-only array is copied first);
  the direct convolution kernels take their inputs this way;
- :func:`readonly` -- any array typed read-only (an O(1) view);
- :func:`pad3` -- a per-axis tuple (stride, padding, sizes...) padded in front to 3 axes.
"""

from __future__ import annotations

__all__ = ["out5", "pad3", "readonly", "readonly5", "writeable5"]


def _rank5_shape(shape):
    """``shape`` of rank 3-5 with unit spatial axes inserted after ``N, C``."""
    return shape[:2] + (1,) * (5 - len(shape)) + shape[2:]


def out5(a):
    """Rank-5 view of an output array (never copied; writes go to ``a``)."""
    return a.reshape(_rank5_shape(a.shape))


def readonly(a):
    """``a`` typed read-only (an O(1) view when ``a`` is writeable; ``a`` itself when it is
    read-only already).  Kernel inputs passed this way have a single compiled specialisation,
    and read-only inputs (e.g. autodiff tape values) are never copied.  The caller's array
    keeps its own flags."""
    if a.flags.writeable:
        a = a.view()
        a.setflags(write=False)     # (300 ns; ``a.flags.writeable = False`` takes 480)
    return a


def readonly5(a):
    """Read-only rank-5 view of a kernel input (unit spatial axes after ``N, C``; never a
    copy)."""
    return readonly(out5(a))


def writeable5(a):
    """View a rank 3-5 array as rank 5 by inserting unit spatial axes after ``N, C``,
    writeable.

    A read-only array is copied first: numba compiles a separate specialisation for
    read-only arrays, and one compiled variant per kernel keeps first calls fast."""
    if not a.flags.writeable:
        a = a.copy()
    return out5(a)


def pad3(t, fill):
    """``t`` as a tuple of Python ints padded in front with ``fill`` to length 3 (a longer
    ``t`` is returned whole)."""
    t = tuple(int(v) for v in t)
    return (fill,) * (3 - len(t)) + t
