"""The README's quick start and the docstring examples run as written."""

import doctest
import re
from pathlib import Path

import pytest

import fusedrope
from fusedrope import bench_report, bench_timing, benchmark

ROOT = Path(__file__).resolve().parent.parent


def test_readme_quick_start_runs():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


@pytest.mark.parametrize("module", [fusedrope, fusedrope.tts_rope, fusedrope.inverse_rope_quant, fusedrope.testing,
                                    fusedrope.reference, benchmark, bench_timing, bench_report],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert tried > 0 and failures == 0
