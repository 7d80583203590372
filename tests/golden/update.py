"""Recompute tests/golden/digests.json:  python -m tests.golden.update [case ...]

Run it only for a deliberate behaviour change, and say in the commit which digests
changed and why."""

import json
import os
import sys

from .cases import CASES, digest

PATH = os.path.join(os.path.dirname(__file__), "digests.json")


def main(argv):
    names = argv or sorted(CASES)
    table = {}
    if os.path.exists(PATH):
        with open(PATH) as fh:
            table = json.load(fh)
    for name in names:
        table[name] = digest(CASES[name]())
        print(f"{name}: {table[name]}")
    with open(PATH, "w") as fh:
        json.dump(dict(sorted(table.items())), fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
