"""Every environment variable hmath_dl reads, read once, here.

hmath_dl never writes ``os.environ``.  Each variable is read when this module is first
imported (at ``import hmath_dl``); set it in the environment before starting Python.

=============================  ===========  =================================================
variable                       default      effect
=============================  ===========  =================================================
``HMATH_DL_KERNELS``           (empty)      ``portable``: the portable kernels on every path
                                            (no register-tiled or VNNI micro-kernels); same
                                            bits, for tests and bug reports
``HMATH_DL_INT8_KERNEL``       (empty)      ``portable``: the portable int8 GEMM only (older
                                            spelling, kept)
``HMATH_DL_NO_CACHE``          (empty)      non-empty and not ``0``: compile without Numba's
                                            on-disk cache
``HMATH_DL_SERIAL_WORK``       131072       calls touching fewer elements run a kernel's
                                            serial twin (0: always parallel)
``HMATH_DL_MAX_ALLOC_BYTES``   17179869184  largest output/workspace one call may allocate;
                                            larger requests raise ``ShapeError``
``HMATH_DL_QUIET``             (empty)      non-empty and not ``0``: no first-run notice on
                                            stderr when kernels take more than ~2 s to
                                            compile (:mod:`hmath_dl.precompile` compiles
                                            them ahead of time)
=============================  ===========  =================================================

Numba's own variables (``NUMBA_NUM_THREADS``, ``NUMBA_THREADING_LAYER``,
``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``, ``NUMBA_CACHE_DIR``) keep their meaning; the
machine policy (``hmath_dl._kernels._cpu``) follows Numba's target.
"""

from __future__ import annotations

import os

__all__ = ["KERNELS", "INT8_KERNEL", "CACHE_ENABLED", "SERIAL_WORK",
           "MAX_ALLOC_BYTES", "QUIET", "VARIABLES", "describe"]


def _int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    try:
        return int(text) if text.strip() else default
    except ValueError:
        raise ValueError(f"hmath_dl: environment variable {name} must be an integer "
                         f"(got {text!r})") from None


KERNELS = os.environ.get("HMATH_DL_KERNELS", "").strip().lower()
INT8_KERNEL = os.environ.get("HMATH_DL_INT8_KERNEL", "").strip().lower()
CACHE_ENABLED = os.environ.get("HMATH_DL_NO_CACHE", "") in ("", "0")
SERIAL_WORK = _int("HMATH_DL_SERIAL_WORK", 1 << 17)
MAX_ALLOC_BYTES = _int("HMATH_DL_MAX_ALLOC_BYTES", 1 << 34)
QUIET = os.environ.get("HMATH_DL_QUIET", "") not in ("", "0")

#: name -> value in force, for ``python -m hmath_dl.info --config`` and bug reports.
VARIABLES = {
    "HMATH_DL_KERNELS": KERNELS,
    "HMATH_DL_INT8_KERNEL": INT8_KERNEL,
    "HMATH_DL_NO_CACHE": not CACHE_ENABLED,
    "HMATH_DL_SERIAL_WORK": SERIAL_WORK,
    "HMATH_DL_MAX_ALLOC_BYTES": MAX_ALLOC_BYTES,
    "HMATH_DL_QUIET": QUIET,
}


def describe() -> str:
    return ", ".join(f"{k}={v!r}" for k, v in VARIABLES.items())
