"""The README's quick start and the docstring examples run as written."""

import doctest
import importlib
import re
from pathlib import Path

import pytest

import fusedrope  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def test_readme_quick_start_runs():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


MODULES = ["fusedrope", "fusedrope.registry", "fusedrope.qwen3_tts_rope", "fusedrope.qwen3_tts_rope.reference",
           "fusedrope.inverse_rope_group_quant", "fusedrope.inverse_rope_group_quant.reference", "fusedrope.testing",
           "fusedrope.benchmark", "fusedrope.benchmark.timing", "fusedrope.benchmark.report"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert tried > 0 and failures == 0
