"""The documentation site builds warning-free (broken cross-references are errors) and its
code blocks pass as doctests: README's "Documentation" command, in a temporary directory.

Skipped when Sphinx or numpydoc is not installed (``pip install -e ".[docs]"``).  Both
builds share one doctree directory, so the doctest build reads nothing again; together
they take about 30 s on a quiet 2-core machine with warm kernel caches (each build is
bounded by a subprocess timeout).
"""

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytest.importorskip("sphinx")
pytest.importorskip("numpydoc")

DOCS = os.path.join(ROOT, "docs")


def _sphinx(builder, out, doctrees):
    env = dict(os.environ, HMATH_DL_QUIET="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder,
         "-d", str(doctrees), DOCS, str(out)],
        env=env, capture_output=True, text=True, timeout=240, check=False)


def _conf():
    spec = importlib.util.spec_from_file_location("hmath_dl_docs_conf",
                                                  os.path.join(DOCS, "conf.py"))
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


def test_docs_build_without_warnings_and_doctests_pass(tmp_path):
    doctrees = tmp_path / "doctrees"
    html = _sphinx("html", tmp_path / "html", doctrees)
    assert html.returncode == 0, html.stdout + html.stderr
    assert "WARNING" not in html.stderr and "ERROR" not in html.stderr, html.stderr

    # every public name of the contract's modules has its own page
    conf = _conf()
    missing = [f"hmath_dl.{m}.{n}" for m in conf.PUBLIC_MODULES
               for n in conf.public_names(f"hmath_dl.{m}")
               if not (tmp_path / "html" / "api" / "generated" /
                       f"hmath_dl.{m}.{n}.html").exists()]
    assert not missing, missing
    for page in ("getting_started", "first_run", "guarantees", "speed", "reliability",
                 "examples/train_digits_cnn", "examples/char_transformer",
                 "examples/train_data_parallel", "examples/int8_inference"):
        assert (tmp_path / "html" / f"{page}.html").exists(), page

    doctest = _sphinx("doctest", tmp_path / "doctest", doctrees)
    assert doctest.returncode == 0, doctest.stdout + doctest.stderr
    summary = (tmp_path / "doctest" / "output.txt").read_text()
    assert " 0 failures in tests" in summary and "tests" in summary, summary
