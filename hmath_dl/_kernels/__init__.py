"""Numba kernels: pure loops over contiguous arrays, one module per family.

Kernels never validate, never raise for data-dependent reasons (they return a status --
the vocabulary is ``status.py`` -- that the facade turns into an error with
``hmath_dl._checks.finish``) and never import facades.  See ``_jit.py`` for the flags.
"""
