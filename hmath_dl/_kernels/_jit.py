"""The one place that decides how kernels are compiled.

Every kernel in ``hmath_dl._kernels`` is decorated with :func:`kernel` (parallel work) or
:func:`helper` (serial code, also used inside ``prange`` bodies).  Nothing is compiled at
import time: there are no eager signatures, so ``import hmath_dl`` stays fast.

* ``cache=True`` unless the environment variable ``HMATH_DL_NO_CACHE`` is set to a
  non-empty value other than ``0``; if no cache location is writable (a read-only install
  and no writable user cache directory), caching is silently skipped.
* ``nogil=True`` so Python threads can call kernels concurrently.
* ``error_model="numpy"``: a division by zero gives inf/NaN (which the kernels report as a
  status) instead of raising inside compiled code.
* never ``fastmath``: it reorders sums and drops NaN checks.
"""

import os

from numba import njit

__all__ = ["kernel", "helper", "CACHE_ENABLED"]

CACHE_ENABLED = os.environ.get("HMATH_DL_NO_CACHE", "") in ("", "0")


def _jit(fn, parallel):
    options = dict(parallel=parallel, nogil=True, error_model="numpy")
    if CACHE_ENABLED:
        try:
            return njit(cache=True, **options)(fn)
        except RuntimeError:
            # numba raises RuntimeError("cannot cache function ...: no locator available")
            # when neither the package directory nor the user cache directory is writable.
            pass
    return njit(cache=False, **options)(fn)


def kernel(fn):
    """Decorate a parallel kernel (uses ``numba.prange``)."""
    return _jit(fn, parallel=True)


def helper(fn):
    """Decorate a serial kernel or a helper called from other kernels."""
    return _jit(fn, parallel=False)
