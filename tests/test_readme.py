"""README's Python snippets run as written (in order, one namespace)."""

import os
import re

from tests.helpers import ROOT


def test_readme_snippets_run():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 4
    namespace = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
