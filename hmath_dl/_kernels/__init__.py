"""Numba kernels: pure loops over contiguous arrays, one module per family.

Kernels never validate, never raise for data-dependent reasons (they return a status --
the vocabulary is ``status.py`` -- that the facade turns into an error with
``hmath_dl._checks.finish``) and never import facades.  See ``_jit.py`` for the flags.

Two Numba costs that decide whether a short inner loop vectorises, measured on this
package's kernels:

* **Signed indices built from arguments.**  ``a[base + i]`` with ``base`` an argument or
  derived from one (not from a ``range`` counter) makes Numba test every index for a
  negative value to wrap, and that branch keeps LLVM from vectorising the loop.  Build
  such indices as ``np.uint64`` (``ub = np.uint64(base)``, ``for i in range(np.uint64(n))``;
  never mix uint64 with int64 in one expression: Numba types that as float64).  Packing
  a GEMM operand went 50 -> 18 us, a quantize pass 9.6 -> 7.1 ms, the weight-gradient
  unfold 457 -> 336 us.
* **Views in hot loops.**  Every slice or row view updates its array's reference count
  (an atomic operation); span helpers running under the parallel driver receive their
  arrays without an owner (``_jit._unowned``), but a serial call pays it, so index flat
  arrays instead of taking a view per short row.
"""
