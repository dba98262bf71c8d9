"""The integration examples in examples/ and the ```python blocks of docs/*.md run and hold their own checks
(small sizes; on CPU the Triton kernels run in the interpreter). ```py blocks in the docs need a GPU: not
run."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from conftest import DEVICE, backends_here

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("backend", backends_here("qwen3_tts_rope"))
def test_qwen3_tts_attention_example(backend):
    stats = load("qwen3_tts_attention").check(batch=2, seq_len=8, hidden_size=128, backend=backend,
                                              device=str(DEVICE))
    assert stats["backend"] == backend and stats["attention_output_rel_diff"] < 2**-6


def test_qwen3_tts_attention_example_in_float32():
    stats = load("qwen3_tts_attention").check(batch=1, seq_len=4, hidden_size=128, backend="reference",
                                              dtype=torch.float32, device="cpu")
    assert stats["attention_output_rel_diff"] < 2**-6


@pytest.mark.parametrize("backend", backends_here("inverse_rope_group_quant"))
def test_deepseek_v4_wo_a_example(backend):
    r = load("deepseek_v4_wo_a").check(num_tokens=2, backend=backend, device=str(DEVICE))
    assert r["backend"] == backend and r["row-major"] == r["column-major"] < 2**-4


@pytest.mark.slow  # both examples whole again, for their printout
def test_examples_main_print(capsys):
    load("qwen3_tts_attention").main()
    load("deepseek_v4_wo_a").main()
    out = capsys.readouterr().out
    assert "within 1 ulp of the fp64 oracle" in out and "column-major scales" in out


@pytest.mark.parametrize("page", [p for p in DOCS if "```python" in p.read_text()], ids=lambda p: p.name)
def test_docs_python_blocks_run(page):
    for code in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
        exec(compile(code, str(page), "exec"), {})
