"""The one switch behind every ``forced_*_path`` context manager (convolution paths,
int8 GEMM paths): set a key of a module's plan state for the duration of a block."""

import contextlib

__all__ = ["forcing"]


@contextlib.contextmanager
def forcing(state, key, name):
    """Within the block ``state[key] = name``; the previous value is restored after it,
    also on an exception."""
    old = state[key]
    state[key] = name
    try:
        yield
    finally:
        state[key] = old
