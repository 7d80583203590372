#!/usr/bin/env python3
"""List the public functions of hmath_dl that no asv benchmark file references.

Public functions: every function in ``__all__`` (or, without one, every public name that
is a function) of hmath_dl.precision, .activations, .layers, .autodiff, .optim and
.distributed.

A function counts as referenced by ``asv_bench/benchmarks/bench_*.py`` when the file
(found with ``ast``, so comments, docstrings and strings do not count)

* imports it by name from its module (``from hmath_dl.layers import dense``) and uses
  that name, or
* reads it as an attribute of a name bound to its module (``import hmath_dl.autodiff as
  ad`` / ``from hmath_dl import layers as L`` ... ``ad.exp``, ``L.dense_ad``; also
  ``self.optim.adamw_step`` after ``self.optim = optim``: an attribute chain whose last
  link is named like a module alias counts).

Names shared by two modules (``activate``, ``gradient_norm``, ``clip_gradients``) are
resolved per module, so the autodiff ``activate`` is not covered by a benchmark of the
plain one.  Run from anywhere:  ``python asv_bench/check_coverage.py``  (exit 1 when something
is missing).
"""

import pathlib
import sys

# Import hmath_dl from this checkout (the repository root), whatever the working directory.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import ast  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402

MODULES = ["hmath_dl.precision", "hmath_dl.activations", "hmath_dl.layers",
           "hmath_dl.autodiff", "hmath_dl.optim", "hmath_dl.distributed"]
BENCH_DIR = _HERE / "benchmarks"


def public_functions():
    out = {}
    for name in MODULES:
        mod = importlib.import_module(name)
        names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
        out[name] = sorted(n for n in names if inspect.isfunction(getattr(mod, n, None)))
    return out


def _resolve_module(node_module, level):
    if level:  # relative imports inside the bench package never reach hmath_dl
        return None
    return node_module


def references(path):
    """Set of (module, function) pairs that ``path`` references."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {}    # local name -> module   (import hmath_dl.x as y; from hmath_dl import x)
    imported = {}   # local name -> (module, function)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES:
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:  # import hmath_dl.layers -> hmath_dl.layers.dense
                        aliases[a.name] = a.name
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve_module(node.module, node.level)
            if mod is None:
                continue
            for a in node.names:
                full = f"{mod}.{a.name}"
                local = a.asname or a.name
                if full in MODULES:
                    aliases[local] = full
                elif mod in MODULES:
                    imported[local] = (mod, a.name)
    used_names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    refs = {imported[n] for n in used_names if n in imported}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name):
            key = base.id
        elif isinstance(base, ast.Attribute):  # self.optim.x, hmath_dl.layers.x
            key = base.attr
            full = ast.unparse(base)
            if full in MODULES:
                refs.add((full, node.attr))
                continue
        else:
            continue
        if key in aliases:
            refs.add((aliases[key], node.attr))
    return refs


def main():
    funcs = public_functions()
    refs = set()
    files = sorted(BENCH_DIR.glob("bench_*.py"))
    for f in files:
        refs |= references(f)
    missing = [f"{m}.{n}" for m, names in funcs.items() for n in names if (m, n) not in refs]
    total = sum(len(v) for v in funcs.values())
    for name in missing:
        print("not benchmarked:", name)
    print(f"{total - len(missing)}/{total} public functions referenced in {len(files)} bench files")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
