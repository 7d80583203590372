#!/usr/bin/env python3
"""Where a training step's time goes: every compiled kernel launch inside the step, timed.

    python asv_bench/step_profile.py cnn              # the small CNN step of ratios.py
    python asv_bench/step_profile.py transformer -b 16
    python asv_bench/step_profile.py transformer --shapes   # a line per kernel and shape
    env $(python -m hmath_dl.info --env haswell) python asv_bench/step_profile.py cnn

Runs the step of ``benchmarks/bench_autodiff.py`` a few times (compilation excluded),
then ``-n`` more times with every kernel launch timed -- :class:`SpanKernel.run
<hmath_dl._kernels._jit.SpanKernel>` (the pool's and the serial schedule) and
:class:`Kernel.__call__ <hmath_dl._kernels._jit.Kernel>` (the ``prange`` kernels), the
outermost launch only -- and prints the step's median, the kernels' share and one line
per kernel (launches per step, time per step, time per launch).  What is not kernel time
is the Python between the kernels (checks, plans, the tape).  The timing wrappers cost
about a microsecond per launch, so the step's median here reads a little above the
unwrapped one (``ratios.py``).  The kernels' times are measured inside the step, with the
caches as the step leaves them, which is what a hot loop over one kernel does not show.
"""

import argparse
import gc
import os
import sys
import time
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _key(name, args, shapes, run):
    """The line a launch is counted under: the kernel's name, and with ``shapes`` the
    shapes of its first array arguments -- for the float GEMM its ``(M, N, K)`` and where
    each operand is read (``a``: ``rows`` or ``cols`` in place, ``packed``; ``b``: in
    place or packed), from :func:`hmath_dl._kernels.gemm_f64.gemm_tiled`'s arguments."""
    if not shapes:
        return name
    if run:
        args = args[2:]          # SpanKernel.run(n, work, *kernel arguments)
    if name == "gemm_tiled" and len(args) > 15:
        ak, aj, bk, M, N, K, T = args[2], args[3], args[7], args[12], args[13], args[14], \
            args[15]
        a = "a rows" if ak == 1 else ("a packed" if (ak, aj) == (6, 1) else "a cols")
        b = "b packed" if bk == T else "b in place"
        return f"{name} {M}x{N}x{K} {a}, {b}"
    dims = [tuple(x.shape) for x in args if hasattr(x, "shape") and x.ndim][:2]
    return f"{name} {' '.join(str(d) for d in dims)}"


def _wrap(cls, name, totals, state, shapes=False):
    original = getattr(cls, name)

    def timed(self, *args, **kwargs):
        if not state["on"] or state["depth"]:
            return original(self, *args, **kwargs)
        state["depth"] += 1
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            state["depth"] -= 1
            entry = totals[_key(getattr(self, "__name__", repr(self)), args, shapes,
                                name == "run")]
            entry[0] += 1
            entry[1] += dt

    setattr(cls, name, timed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("cnn", "transformer"))
    ap.add_argument("-b", "--batch", type=int, default=None,
                    help="batch size (default: the one ratios.py uses: 64 / 16)")
    ap.add_argument("-n", "--steps", type=int, default=30, help="timed steps (default 30)")
    ap.add_argument("--shapes", action="store_true",
                    help="one line per kernel and argument shapes (the GEMM: M x N x K and "
                         "where its operands are read)")
    args = ap.parse_args(argv)

    from hmath_dl._kernels import _jit
    from benchmarks import bench_autodiff as B

    totals = defaultdict(lambda: [0, 0.0])
    state = {"on": False, "depth": 0}
    _wrap(_jit.SpanKernel, "run", totals, state, args.shapes)
    _wrap(_jit.Kernel, "__call__", totals, state, args.shapes)

    if args.step == "cnn":
        params = B.cnn_params()
        x, y = B.cnn_data(args.batch or 64)
        step = lambda: B.cnn_step(params, x, y)          # noqa: E731
    else:
        params = B.transformer_params()
        tokens, targets = B.transformer_data(args.batch or 16)
        step = lambda: B.transformer_step(params, tokens, targets)   # noqa: E731
    for _ in range(5):
        step()
    gc.disable()
    times = []
    state["on"] = True
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    state["on"] = False
    gc.enable()
    n = args.steps
    kernels = sum(v[1] for v in totals.values()) / n
    median = float(np.median(times))
    print(f"{args.step} step: median {median * 1e3:.3f} ms; kernels {kernels * 1e3:.3f} ms "
          f"per step ({100 * kernels / median:.0f} %)")
    for name, (calls, total) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:<48} {calls / n:5.1f} launches  {total / n * 1e6:8.1f} us/step  "
              f"{total / calls * 1e6:7.1f} us/launch")


if __name__ == "__main__":
    main()
