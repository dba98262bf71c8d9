"""The README's quick start and the docstring examples run as written (the docs pages' ``python`` blocks:
tests/test_examples.py)."""

import doctest
import importlib
import re
from pathlib import Path

import pytest

import fusedrope  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("page", ["README.md"])  # docs/*.md: tests/test_examples.py
def test_python_blocks_run(page):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, page, "exec"), {})


MODULES = ["fusedrope.backends", "fusedrope.reference", "fusedrope.qwen3_tts_rope", "fusedrope.qwen3_tts_rope.modes",
           "fusedrope.qwen3_tts_rope.reference", "fusedrope.inverse_rope_group_quant",
           "fusedrope.inverse_rope_group_quant.reference", "fusedrope.integrations.vllm",
           "fusedrope.integrations.aiter", "fusedrope.integrations.hf", "fusedrope.testing",
           "fusedrope.benchmark", "fusedrope.benchmark.timing", "fusedrope.benchmark.report"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert tried > 0 and failures == 0


def test_status_page_is_the_registry_s_table():
    """docs/status.md holds the opt-in table the registry gives now (regenerate: python -m fusedrope status)."""
    from fusedrope.backends import status_table

    assert status_table() in (ROOT / "docs" / "status.md").read_text()
