"""Same bits on every CPU: the outputs of every public function on fixed inputs, and the
final weights of two short training runs, hash to the committed digests
(``tests/golden/digests.json``), whatever the instruction set numba compiles for.  CI runs
this file again under ``NUMBA_CPU_NAME=generic`` and (where the host has AVX2) the
haswell target; see ``.ci/run``."""

import json
import os

import pytest

from .golden.cases import CASES, digest

with open(os.path.join(os.path.dirname(__file__), "golden", "digests.json")) as fh:
    DIGESTS = json.load(fh)


def test_every_case_has_a_digest():
    assert sorted(DIGESTS) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_digest(name):
    assert digest(CASES[name]()) == DIGESTS[name], (
        f"{name}: the outputs changed bit for bit; if deliberate, rerun "
        f"'python -m tests.golden.update {name}' and explain the change in the commit")
