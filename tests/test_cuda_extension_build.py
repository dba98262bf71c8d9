"""The CUDA extension, both kernels and both torch bindings, built, linked and loaded for real on a CPU machine
against a CUDA build of torch (2.11.0+cu130 on Python 3.12, the stack of the GPU machines we test on) with nvcc,
through ``fusedrope.cuda_ext.build()`` as ``python -m fusedrope build`` does, and the compiled checks that come
with it. This catches what the syntax-only binding checks cannot: link errors, nvcc / torch header mismatches,
the op schemas. Running a kernel still needs a GPU (gpu/).

``FUSEDROPE_CUDA_TORCH_PYTHON`` names that environment's python (`bash .ci/run` makes it, about 5 GB, where the
disk has room); without it this test skips and says so.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = "FUSEDROPE_CUDA_TORCH_PYTHON"

SCRIPT = r"""
import json, torch
from fusedrope import cuda_ext, fast_checks
from fusedrope.qwen3_tts_rope import Facts
path = cuda_ext.build(verbose=False)
q = torch.randn(1, 2, 3, 8, dtype=torch.bfloat16); c = torch.randn(1, 3, 8, dtype=torch.bfloat16)
key, q_out, k_out = fast_checks.checks.qwen3_tts_rope(Facts, q, q[:, :1], c, c)  # the checks came with the build
names = ("qwen3_tts_rope", "qwen3_tts_rope_out", "inverse_rope_group_quant_out")
ops = {n: str(getattr(torch.ops.fusedrope_cuda, n).default._schema) for n in names}
fields = {f: str(v) for f, v in key._asdict().items()}
print(json.dumps({"path": path, "torch": torch.__version__, "cuda": torch.version.cuda, "ops": ops,
                  "checks": [str(fast_checks.library_path()), type(key).__name__, fields, list(k_out.shape)]}))
"""


def test_cuda_extension_builds_links_and_registers_its_ops(tmp_path):
    python = os.environ.get(ENV)
    if not python:
        pytest.skip(f"set {ENV} to a Python with a CUDA build of torch (2.11.0+cu130) to build the extension "
                    "here; `bash .ci/run` makes one where the disk has room")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TORCH_CUDA_ARCH_LIST="9.0", TORCH_EXTENSIONS_DIR=str(tmp_path),
               MAX_JOBS=env.get("MAX_JOBS", "2"))
    proc = subprocess.run([python, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["torch"].startswith("2.11.0") and out["cuda"] == "13.0", out
    assert Path(out["path"]).is_file() and str(tmp_path) in out["path"], out  # really built here, not a cache hit
    checks, key_type, key, k_shape = out["checks"]  # the compiled checks, built with the kernels against torch 2.11
    assert Path(checks).is_file() and str(tmp_path) in checks, out
    assert key_type == "Facts" and k_shape == [1, 1, 3, 8], out
    assert key == {"device": "cpu", "dtype": "torch.bfloat16", "head_dim": "8", "inplace": "False", "eager": "False",
                   "table": "False", "norm": "False", "pdl": "False", "mrope": "False"}, out
    ops = out["ops"]
    assert ops["qwen3_tts_rope"].endswith("(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)")
    modes = "Tensor? positions=None, bool eager=False, Tensor? q_weight=None, Tensor? k_weight=None, float eps=0."
    assert f"Tensor(a!) q_out, Tensor(b!) k_out, {modes}, bool pdl=False) -> ()" in ops["qwen3_tts_rope_out"]
    assert ("int quant_group_size, int scale_layout=0, int pdl=0, int kernel=0) -> ()"
            in ops["inverse_rope_group_quant_out"])
