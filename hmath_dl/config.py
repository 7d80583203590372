"""Every environment variable hmath_dl reads, read once, here; and the table of its
thresholds (below).

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
``HMATH_DL_SERIAL_WORK``       32768        calls touching fewer elements run a kernel's
                                            serial twin (0: always parallel); the default
                                            is 131072 with ``HMATH_DL_POOL=0``
``HMATH_DL_MAX_ALLOC_BYTES``   17179869184  largest output/workspace one call may allocate;
                                            larger requests raise ``ShapeError``
``HMATH_DL_QUIET``             (empty)      non-empty and not ``0``: no first-run notice on
                                            stderr when kernels take more than ~2 s to
                                            compile (:mod:`hmath_dl.precompile` compiles
                                            them ahead of time), and no notice that a
                                            ``NUMBA_CPU_NAME`` given alone keeps the
                                            host's wider features (e.g. ``haswell``
                                            on an AVX-512 host)
``HMATH_DL_MALLOC``            (empty)      ``system``: leave glibc's ``malloc`` thresholds
                                            alone and allocate large outputs as numpy does
                                            (by default ``import hmath_dl`` keeps freed
                                            arrays under 32 MiB in the heap for reuse, and
                                            larger outputs' blocks in a pool of up to 256
                                            MiB: ``hmath_dl/_alloc.py``)
``HMATH_DL_POOL``              (empty)      ``0``: parallel span kernels run as a ``prange``
                                            on Numba's threading layer instead of on the
                                            package's spinning worker pool
                                            (``hmath_dl/_kernels/_pool.py``); same bits
=============================  ===========  =================================================

Numba's own variables (``NUMBA_NUM_THREADS``, ``NUMBA_THREADING_LAYER``,
``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``, ``NUMBA_CACHE_DIR``) keep their meaning; the
machine policy (``hmath_dl._kernels._cpu``) follows Numba's target.

.. rubric:: Thresholds

The sizes at which a call changes schedule (serial or parallel) or path, or a parallel
launch is cut into tasks.  Every one changes speed only, never bits: every path and every
schedule sums the same terms in the same order.  Each stays in the module that uses it
(``module`` below, under ``hmath_dl``); ``thresholds()`` reads the values in force
(``python -m hmath_dl.info --config`` prints them), and ``tests/test_config.py`` holds
this table to the code.  Work is counted in elements unless the row says multiply-adds.

=============================  =====  ======================  ================================
name                           value  module                  decides
=============================  =====  ======================  ================================
*serial or parallel*
``SERIAL_WORK``                2**15  config                  ``Kernel.sized`` /
                                                              ``SpanKernel.run``: a call
                                                              with less work (times the
                                                              kernel's ``scale``) runs the
                                                              serial path
                                                              (``HMATH_DL_SERIAL_WORK``; the
                                                              default is listed: 2**17
                                                              with ``HMATH_DL_POOL=0``)
``_EXP_PER_ELEMENT``           8      _kernels.libm           libm's array kernels and the
                                                              softmax rows count each
                                                              element as this much work
                                                              (parallel from
                                                              ``SERIAL_WORK / 8`` elements)
``_FMA_PER_ELEMENT``           16     _kernels.conv           the convolution kernels'
                                                              ``scale``: serial below
                                                              ``SERIAL_WORK * 16``
                                                              multiply-adds
``_SERIAL_FMAS``               2**21  _kernels.gemm_f64       float GEMM (and its packing):
                                                              serial below this many
                                                              multiply-adds
``_SERIAL_GEMM_WORK``          2**24  precision.half          ``reduced_gemm``, portable
                                                              path: serial up to this many
                                                              multiply-adds
``_SERIAL_TILED_WORK``         2**21  precision.half          ``reduced_gemm``, tiled path:
                                                              serial up to this many
                                                              multiply-adds
``SERIAL_QUANTIZE_ELEMENTS``   2**17  precision.quantization  quantize / dequantize: one
                                                              Numba thread up to this many
                                                              elements
``SERIAL_GEMM_WORK``           2**24  precision.quantization  ``int8_gemm``: one Numba thread
                                                              up to this many multiply-adds
*path*
``_FUSE_WINDOW``               2**17  _kernels.conv_plan      forward path ``rows_fused``
                                                              copies its own input windows
                                                              up to this many float64
                                                              elements, else ``rows`` on a
                                                              padded copy / the stride-phase
                                                              split
``SMALL_PLANE``                64     _kernels.conv_gemm      forward path ``gemm`` for output
                                                              planes up to this many
                                                              positions ...
``DEEP_TERMS``                 256    _kernels.conv_gemm      ... whose outputs have at least
                                                              this many terms
``STRIDED_TERMS``              512    _kernels.conv_gemm      with 512-bit tiles, strided
                                                              kernels with at least this many
                                                              terms per output take ``gemm``
``MIDPLANE``                   256    _kernels.conv_gemm      output planes up to this many
                                                              positions (512-bit tiles: rows
                                                              not whole vectors) ...
``MIDPLANE_TERMS``             1024   _kernels.conv_gemm      ... with at least this many terms
                                                              per output take ``gemm``
``_MAX_POSITIONS``             49     _kernels.conv_batch     forward path ``batch`` (one GEMM
                                                              over the batch, batch index
                                                              innermost) for output planes up
                                                              to this many positions ...
``_MIN_TERMS``                 256    _kernels.conv_batch     ... whose outputs have at least
                                                              this many terms ...
``_MIN_COLUMNS``               64     _kernels.conv_batch     ... and P*N at least this many
                                                              columns (the input gradient too)
``_GRAD_MAX_POSITIONS``        64     _kernels.conv_batch     the input gradient takes the
                                                              batch path for planes up to
                                                              this many positions
``SKINNY_MAX``                 16     precision.quantization  int8 GEMM path ``skinny`` when
                                                              M or N is at most this
*tasks of a parallel launch*
``_TASKS_PER_THREAD``          2      _kernels.gemm_f64       a parallel float GEMM is cut
                                                              into at least this many tasks
                                                              per thread
``MIN_TASKS``                  8      _kernels.gemm_reduced   portable reduced GEMM: rows are
                                                              split when there are fewer
                                                              column panels than this ...
``MIN_GROUP``                  16     _kernels.gemm_reduced   ... keeping at least this many
                                                              6-row blocks per task
``_TASKS``                     8      _kernels.gemm_reduced   tiled reduced GEMM: panels are
                                                              halved until there are this
                                                              many tasks
``PLANES_PER_TASK``            16     _kernels.pool_fast      regular pooling: (n, c) planes
                                                              per task
``_TILES_PER_TASK``            8      _kernels.quant          int8 GEMM ``vnni``: output
                                                              tiles per task
``_WD_TILES_PER_TASK``         8      _kernels.quant          int8 GEMM ``pmaddwd``: output
                                                              tiles per task
``_SK_TASKS``                  8      _kernels.quant          int8 GEMM ``skinny``: about
                                                              this many k ranges (tasks)
``_ROW_POSITIONS``             192    _kernels.conv_plan      row kernel: output positions
                                                              per iteration (about; fewer
                                                              while there are less than 4
                                                              iterations per thread)
*other*
``_WS_MAX``                    2**23  _kernels.gemm_f64       GEMM packing workspaces up to
                                                              this many float64 elements
                                                              (64 MiB) are kept per thread
                                                              and reused
``NOTICE_AFTER``               2.0    _kernels._jit           seconds of compilation after
                                                              which the first-run notice is
                                                              printed
=============================  =====  ======================  ================================

A few plan tests compare with tile shapes rather than a named size (the convolution paths'
channels per group, ``_kernels.conv_plan.forward_path``; ``_kernels.gemm_f64.gemm`` packing
serially when ``M*K + K*N < 2**16``); they are not listed.
"""

from __future__ import annotations

import os

__all__ = ["KERNELS", "INT8_KERNEL", "CACHE_ENABLED", "SERIAL_WORK",
           "MAX_ALLOC_BYTES", "QUIET", "MALLOC", "POOL", "VARIABLES", "describe", "THRESHOLDS",
           "thresholds", "describe_thresholds"]


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
POOL = os.environ.get("HMATH_DL_POOL", "").strip() in ("", "1")
# a launch on the package's pool costs ~2 us, on Numba's TBB layer ~5 (and a thread that
# sleeps there misses its tasks): the serial threshold follows (see the table below)
SERIAL_WORK = _int("HMATH_DL_SERIAL_WORK", 1 << 15 if POOL else 1 << 17)
MAX_ALLOC_BYTES = _int("HMATH_DL_MAX_ALLOC_BYTES", 1 << 34)
QUIET = os.environ.get("HMATH_DL_QUIET", "") not in ("", "0")
MALLOC = os.environ.get("HMATH_DL_MALLOC", "").strip().lower()

#: name -> value in force, for ``python -m hmath_dl.info --config`` and bug reports.
VARIABLES = {
    "HMATH_DL_KERNELS": KERNELS,
    "HMATH_DL_INT8_KERNEL": INT8_KERNEL,
    "HMATH_DL_NO_CACHE": not CACHE_ENABLED,
    "HMATH_DL_SERIAL_WORK": SERIAL_WORK,
    "HMATH_DL_MAX_ALLOC_BYTES": MAX_ALLOC_BYTES,
    "HMATH_DL_QUIET": QUIET,
    "HMATH_DL_MALLOC": MALLOC,
    "HMATH_DL_POOL": POOL,
}


def describe() -> str:
    return ", ".join(f"{k}={v!r}" for k, v in VARIABLES.items())


#: The thresholds of the table above: ``"module.NAME"`` (``module`` under ``hmath_dl``) ->
#: the module that defines it.  Their values are read by :func:`thresholds`, which imports
#: those modules; importing this one imports no kernel.
THRESHOLDS = {f"{module}.{name}": module for module, names in (
    ("config", ("SERIAL_WORK",)),
    ("_kernels.libm", ("_EXP_PER_ELEMENT",)),
    ("_kernels.conv", ("_FMA_PER_ELEMENT",)),
    ("_kernels.conv_plan", ("_FUSE_WINDOW", "_ROW_POSITIONS")),
    ("_kernels.gemm_f64", ("_SERIAL_FMAS", "_TASKS_PER_THREAD", "_WS_MAX")),
    ("precision.half", ("_SERIAL_GEMM_WORK", "_SERIAL_TILED_WORK")),
    ("precision.quantization", ("SERIAL_QUANTIZE_ELEMENTS", "SERIAL_GEMM_WORK", "SKINNY_MAX")),
    ("_kernels.conv_gemm", ("SMALL_PLANE", "DEEP_TERMS", "STRIDED_TERMS", "MIDPLANE",
                            "MIDPLANE_TERMS")),
    ("_kernels.conv_batch", ("_MAX_POSITIONS", "_MIN_TERMS", "_MIN_COLUMNS",
                             "_GRAD_MAX_POSITIONS")),
    ("_kernels.gemm_reduced", ("MIN_TASKS", "MIN_GROUP", "_TASKS")),
    ("_kernels.pool_fast", ("PLANES_PER_TASK",)),
    ("_kernels.quant", ("_TILES_PER_TASK", "_WD_TILES_PER_TASK", "_SK_TASKS")),
    ("_kernels._jit", ("NOTICE_AFTER",)),
) for name in names}


def thresholds() -> dict:
    """``"module.NAME"`` -> value in force, for every threshold of :data:`THRESHOLDS` (the
    table "Thresholds" above); imports the modules that define them."""
    import importlib
    out = {}
    for key, module in THRESHOLDS.items():
        mod = importlib.import_module(f"{__name__.rpartition('.')[0]}.{module}")
        out[key] = getattr(mod, key.rpartition(".")[2])
    return out


def describe_thresholds() -> str:
    """The thresholds in force, one ``module.NAME=value`` list (``info --config``)."""
    return ", ".join(f"{k}={v!r}" for k, v in thresholds().items())
