"""``python -m hmath_dl.info``: one line for bug reports.

Prints the version, Numba's threading layer (after starting it with one tiny parallel
kernel), the machine policy the kernels follow and where compiled kernels are cached::

    hmath_dl 0.1.0 | numba 0.68.1 | threading tbb, 2 threads | kernels avx512 (...) | cache ...

``--config`` adds a second line with every ``HMATH_DL_*`` variable in force and a third
with every threshold (:mod:`hmath_dl.config`, "Thresholds").  ``--env haswell`` (or
``generic``) prints, instead, the ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` assignments
that make numba compile AVX2 (or baseline x86-64) code on this host -- ``NUMBA_CPU_NAME``
alone keeps the host's features::

    env $(python -m hmath_dl.info --env haswell) python my_benchmark.py
"""

from __future__ import annotations

import sys

__all__ = ["info_line", "main"]


def _cache_dir() -> str:
    from . import config
    from ._kernels import checks
    if not config.CACHE_ENABLED:
        return "off (HMATH_DL_NO_CACHE)"
    disp = checks.thread_probe.parallel
    cache = getattr(disp, "_cache", None)
    path = getattr(cache, "_cache_path", None)
    return path or "off (no writable location)"


def info_line() -> str:
    """The one-line description (starts Numba's threading layer if it has not started)."""
    import numba
    import numpy as np

    from . import __version__, _alloc, _threads
    from ._kernels import _cpu, _pool, checks

    checks.thread_probe(np.empty(4 * max(1, numba.get_num_threads()), dtype=np.int64))
    pool = "hmath_dl pool + " if _pool.enabled() else ""
    return (f"hmath_dl {__version__} | numba {numba.__version__} | threading {pool}"
            f"{_threads.threading_layer()}, {numba.get_num_threads()} threads | kernels "
            f"{_cpu.describe()} | cache {_cache_dir()} | malloc {_alloc.STATE}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--env" in argv[:-1]:
        return env_main(argv[argv.index("--env") + 1])
    print(info_line())
    if "--config" in argv:
        from . import config
        print(config.describe())
        print(config.describe_thresholds())
    return 0


def env_main(name) -> int:
    """``--env haswell|generic``: shell assignments that compile for that level."""
    from ._kernels._cpu import target_environment
    for k, v in target_environment(name).items():
        print(f"{k}={v}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
