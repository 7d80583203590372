"""Sphinx configuration of the hmath_dl documentation.

Build (warnings are errors, broken cross-references included) and run the code blocks::

    python -m pip install -e ".[docs]"
    python -m sphinx -W --keep-going -b html -d docs/_build/doctrees docs docs/_build/html
    python -m sphinx -W --keep-going -b doctest -d docs/_build/doctrees docs docs/_build/doctest

Nothing here needs the network: intersphinx is off, and the few references to types of
other projects (``enum.Enum``) that autodoc produces are
listed in ``nitpick_ignore`` below.  Every other unresolved reference is an error.
"""

import importlib
import inspect
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)     # document the checkout, not an installed copy

import hmath_dl  # noqa: E402

project = "hmath_dl"
author = "hmath_dl developers"
copyright = "2026, hmath_dl developers"
release = version = hmath_dl.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "numpydoc",
]

exclude_patterns = ["_build", ".gitignore", "_generated"]
root_doc = "index"
html_theme = "alabaster"
html_title = f"hmath_dl {release}"
# mathjax_path is Sphinx's default (a CDN): a page without network access shows the TeX
# source of a formula instead of rendering it; nothing else depends on the network.

# --------------------------------------------------------------------------- autodoc
templates_path = ["_templates"]     # autosummary/class.rst: one autoclass, members inline
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"          # the numpydoc sections state every type
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
numpydoc_show_class_members = False  # autodoc lists members; no duplicate tables
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()

# --------------------------------------------------------------------------- references
nitpicky = True
# Types of other projects that appear in generated signatures and class bases (intersphinx
# is off so that the build needs no network; Python's builtins resolve by themselves):
nitpick_ignore = [
    ("py:class", "enum.Enum"),
]

# --------------------------------------------------------------------------- doctest
doctest_global_setup = """
import numpy as np
from hmath_dl import RNG
"""
doctest_test_doctest_blocks = "default"

# --------------------------------------------------------------------------- README parts
# The guarantees, speed tables, reliability notes and examples table live in README.md
# (one source); they are converted to reST into _generated/ at every build.  The converter
# knows the Markdown that README uses: pipe tables, "- " bullets, fenced code, `code`,
# **bold**, *italic* and [text](target) links.
_GENERATED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_generated")


def _inline(text):
    def link(m):
        label, target = m.group(1), m.group(2)
        if re.match(r"https?://", target):
            return f"`{label.strip('`')} <{target}>`__"
        return label if label.startswith("`") else f"``{label}``"   # a path in the repo
    text = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", link, text)
    text = re.sub(r"\*\*`([^`]+)`\*\*", r"`\1`", text)      # reST cannot nest: bold code -> code
    return re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", text)


def md_to_rst(md):
    """reST for the Markdown subset README.md uses."""
    out, lines, i, para = [], md.strip("\n").splitlines(), 0, []

    def flush():
        if para:    # inline markup may span the lines of a paragraph or bullet
            out.extend(_inline("\n".join(para)).split("\n"))
            para.clear()

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            flush()
            lang = line[3:].strip() or "text"
            out += [f".. code-block:: {lang}", ""]
            i += 1
            while not lines[i].startswith("```"):
                out.append(("   " + lines[i]).rstrip())
                i += 1
            out.append("")
        elif line.startswith("|"):
            flush()
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            out += [".. list-table::", "   :header-rows: 1", ""]
            for row in rows:
                for k, cell in enumerate(row):
                    out.append(("   * - " if k == 0 else "     - ") + (_inline(cell) or "\\"))
            out.append("")
            continue
        elif line.startswith("---"):
            flush()
        elif not line.strip():
            flush()
            out.append("")
        else:
            if line.startswith("- "):
                flush()
            para.append(line)
        i += 1
    flush()
    return "\n".join(out) + "\n"


def readme_section(start, end):
    """The Markdown of README.md from the line ``start`` (excluded) to ``end``."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    a = text.index(start) + len(start)
    return text[a:text.index(end, a)]


def _write_readme_parts():
    parts = {
        "commands": ("On a fresh machine (Python ≥ 3.10, from the repository root):",
                     "\n---"),
        "guarantees": ("What it promises, and the test that holds it to it:",
                       "## A short tour"),
        "examples": ("## Examples\n", "Each takes `--smoke`"),
        "speed": ("## Speed\n", "## Reliability notes"),
        "reliability": ("## Reliability notes\n", "## Layout"),
        "first_run": ("## First run and precompiling\n", "\n## "),
        "docs": ("## Documentation\n", "\n## "),
    }
    os.makedirs(_GENERATED, exist_ok=True)
    for name, (start, end) in parts.items():
        rst = md_to_rst(readme_section(start, end))
        path = os.path.join(_GENERATED, name + ".rst.inc")
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if rst != old:      # unchanged files keep their time stamp: no needless rebuilds
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(rst)


_write_readme_parts()

# --------------------------------------------------------------------------- checks
#: The modules of the public contract, documented under api/.
PUBLIC_MODULES = ["errors", "rng", "precision", "activations", "layers", "autodiff",
                  "optim", "distributed"]


def public_names(module_name):
    """``__all__``, or else every name not starting with ``_`` that the package defines
    (modules and names imported from other packages excluded)."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    out = []
    for name in dir(module):
        obj = getattr(module, name)
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        owner = getattr(obj, "__module__", None)
        if owner is None or owner.startswith("hmath_dl"):
            out.append(name)
    return out


def documented_names(path):
    """The names listed in the autosummary blocks of one api/*.rst page."""
    names, inside = [], False
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith(".. autosummary::"):
                inside = True
                continue
            if inside:
                if line.strip() == "" or line.lstrip().startswith(":"):
                    continue
                if not line.startswith("   "):
                    inside = False
                    continue
                names.append(line.strip().split(".")[-1])
    return names


def _check_every_public_name(app):
    """Warn (an error under -W) for a public name without a page, or a page for a name
    that is not public."""
    from sphinx.util import logging
    log = logging.getLogger("hmath_dl.docs")
    here = os.path.dirname(os.path.abspath(__file__))
    for short in PUBLIC_MODULES:
        page = os.path.join(here, "api", f"{short}.rst")
        if not os.path.exists(page):
            log.warning(f"docs/api/{short}.rst is missing")
            continue
        want = set(public_names(f"hmath_dl.{short}"))
        have = set(documented_names(page))
        for name in sorted(want - have):
            log.warning(f"hmath_dl.{short}.{name} is public but not in docs/api/{short}.rst")
        for name in sorted(have - want):
            log.warning(f"docs/api/{short}.rst lists {name}, not a public name of "
                        f"hmath_dl.{short}")


def setup(app):
    app.connect("builder-inited", _check_every_public_name)
    return {"parallel_read_safe": True}
