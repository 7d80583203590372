"""Explicit, immutable random state.

An :class:`RNG` is a Philox key and counter.  Random operations take an ``RNG`` and return
the advanced one; the ``RNG`` they were given is never changed, so handing the same
``RNG`` to the same operation twice gives the same numbers.  The bits come from numpy's
``numpy.random.Philox`` bit generator; nothing in hmath_dl uses a global generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Tuple, TypeVar

import numpy as np

from . import _checks
from .errors import DomainError

__all__ = ["RNG"]

_T = TypeVar("_T")
_KEY_LIMIT = 1 << 128
_COUNTER_LIMIT = 1 << 256


@dataclass(frozen=True)
class RNG:
    """Immutable Philox random state.

    Parameters
    ----------
    key : int
        Philox key, ``0 <= key < 2**128``.
    counter : int
        Philox counter, ``0 <= counter < 2**256``.

    Examples
    --------
    >>> rng = RNG.from_seed(0)
    >>> values, rng2 = rng.draw(lambda g: g.standard_normal(3))
    >>> rng2 != rng
    True
    """

    key: int
    counter: int = 0

    def __post_init__(self):
        key = _checks.integer("RNG", "key", self.key)
        counter = _checks.integer("RNG", "counter", self.counter)
        if not 0 <= key < _KEY_LIMIT:
            raise DomainError(f"RNG: key out of range (got {key}, expected 0 <= key < 2**128)")
        if not 0 <= counter < _COUNTER_LIMIT:
            raise DomainError(
                f"RNG: counter out of range (got {counter}, expected 0 <= counter < 2**256)"
            )
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "counter", counter)

    @classmethod
    def from_seed(cls, seed: int) -> "RNG":
        """Derive a key from ``seed`` through ``numpy.random.SeedSequence``; counter 0.

        ``seed`` must be a non-negative int.
        """
        seed = _checks.integer("RNG.from_seed", "seed", seed)
        if seed < 0:
            raise DomainError(f"RNG.from_seed: seed must be >= 0 (got {seed})")
        words = np.random.SeedSequence(seed).generate_state(2, dtype=np.uint64)
        return cls(key=int(words[0]) | (int(words[1]) << 64), counter=0)

    def generator(self) -> np.random.Generator:
        """A fresh ``numpy.random.Generator`` positioned at this state.

        Drawing from it never changes ``self``; use :meth:`advanced` (or :meth:`draw`) to
        obtain the state after the draws.
        """
        return np.random.Generator(np.random.Philox(key=self.key, counter=self.counter))

    def advanced(self, generator: np.random.Generator) -> "RNG":
        """The ``RNG`` positioned after everything ``generator`` (made by
        :meth:`generator`) has produced.

        Philox increments its counter before every block it generates, so the returned
        state never repeats a block that was already used (a partly used block is skipped).
        """
        state = generator.bit_generator.state["state"]
        counter = 0
        for i, word in enumerate(state["counter"]):
            counter |= int(word) << (64 * i)
        return RNG(key=self.key, counter=counter)

    def draw(self, fn: Callable[[np.random.Generator], _T]) -> Tuple[_T, "RNG"]:
        """Run ``fn`` on a fresh generator; return its result and the advanced ``RNG``."""
        gen = self.generator()
        result = fn(gen)
        return result, self.advanced(gen)
