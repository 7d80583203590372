"""Serial twins of parallel kernels, for work too small to repay a parallel launch.

A parallel region splits its ``prange`` statically over the worker threads and waits for
the slowest; on a shared machine (a core held by another process) that wait is a
scheduler time slice, milliseconds, for a kernel that needs microseconds.  Small calls
therefore run a serial compilation of the SAME function (``prange`` runs as ``range``).
The kernels sum in fixed orders inside each ``prange`` iteration, so the twin gives
bitwise the same results (the determinism tests cover both paths).

``serial_twin(k)`` compiles ``k``'s Python function once more with the serial decorator,
under its own name (``<name>_serial``) so that the two compilations have separate
on-disk cache entries.
"""

__all__ = ["serial_twin", "SERIAL_WORK"]

#: Calls touching fewer elements than this run the serial twin (~0.1 ms of work).  The
#: environment variable ``HMATH_DL_SERIAL_WORK`` (read at import) overrides it; 0 makes
#: every call parallel (the tests compare both paths).
from ..config import SERIAL_WORK  # noqa: E402


def serial_twin(k):
    """The serial compilation of the parallel kernel ``k`` (a :class:`~._jit.Kernel`)."""
    return k.twin
