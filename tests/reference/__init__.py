"""Slow, obviously correct oracles written from API.md (never from the kernels).

One module per family; tests import e.g. ``from tests.reference import precision as ref``.
"""
