"""A non-editable install carries every source a later JIT build needs."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out)], check=True, cwd=out)
    (whl,) = out.glob("fusedrope-*.whl")
    return whl


def test_wheel_holds_python_and_kernel_sources(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"fusedrope/{p.relative_to(ROOT / 'fusedrope')}" for p in (ROOT / "fusedrope").rglob("*.py")}
    want |= {f"fusedrope/csrc/{p.name}" for p in (ROOT / "fusedrope" / "csrc").glob("*.cpp")}  # the compiled checks
    for folder in ("kernels_cuda", "kernels_hip"):
        for p in (ROOT / folder).iterdir():
            if p.suffix in (".cu", ".cuh", ".cpp", ".h", ".hip", ".md"):
                want.add(f"fusedrope/{folder}/{p.name}")
    assert want - names == set(), f"missing from the wheel: {sorted(want - names)}"


def test_installed_wheel_imports_and_finds_its_kernels(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True)
    code = (
        "import fusedrope, pathlib, importlib.util as u;"
        "p = pathlib.Path(fusedrope.__file__).parent;"
        "assert str(p).startswith(%r), p;"
        "spec = u.find_spec('fusedrope.kernels_cuda');"
        "d = pathlib.Path(list(spec.submodule_search_locations)[0]);"
        "assert str(d).startswith(%r), d;"
        "print(sorted(x.name for x in d.iterdir() if x.suffix in ('.cu', '.cpp')));"
        "import torch; q = torch.randn(1, 2, 3, 8); c = torch.randn(1, 3, 8);"
        "fusedrope.qwen3_tts_rope(q, q[:, :1], c, c, backend='reference');"
        "o = torch.randn(2, 2, 128, dtype=torch.bfloat16); cs = torch.ones(4, 32);"
        "fusedrope.inverse_rope_group_quant(o, torch.arange(2), cs, cs.clone(), 2, backend='reference')"
    ) % (str(target), str(target))
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert ".cu'" in out.stdout


def test_wheel_leaves_triton_to_torch(wheel):
    """A hard `triton` requirement would make pip install PyPI's triton over a ROCm torch's pytorch-triton-rocm
    (the same module): only the `triton` extra asks for it."""
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    requires = [ln.split(":", 1)[1].strip() for ln in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
                if ln.startswith("Requires-Dist:")]
    hard = [r for r in requires if "extra ==" not in r]
    assert hard and all(r.startswith("torch") for r in hard), hard
    assert any(r.startswith("triton") and 'extra == "triton"' in r for r in requires), requires
    # a CPU torch with the extra runs Triton's interpreter, which imports numpy
    assert any(r.startswith("numpy") and 'extra == "triton"' in r for r in requires), requires
