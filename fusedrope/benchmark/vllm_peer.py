"""vLLM's own DeepSeek-V4 Triton kernel (``fused_inv_rope_fp8_quant``), as a benchmark peer of op 2, read at run time
from vLLM's wheel or from that one source file taken out of it (``bash gpu/run.sh --fetch-wheels`` puts it in the
git-ignored ``.whl/``; it is never committed). vLLM's module imports the rest of vLLM, so the kernel function
alone is jitted as vLLM declares it, and launched as ``_fused_inv_rope_fp8_quant_kernel_impl`` launches it on
sm_90: fp32 column-major TMA-aligned scales, a program per (token row, up to 4 heads of a group), 4 warps for a
grid under 2048 programs and 1 above, a programmatic dependent launch.
"""

from __future__ import annotations

import ast
import math
import os
import tempfile
import textwrap
import zipfile
from pathlib import Path

import torch

SOURCE = "vllm/models/deepseek_v4/common/ops/fused_inv_rope_fp8_quant.py"
ENV = "FUSEDROPE_VLLM_SOURCE"  # the wheel or the .py file; else .whl/ beside the repository


def find_source() -> Path | None:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    whl = Path(__file__).resolve().parents[2] / ".whl"
    found = sorted(whl.glob("fused_inv_rope_fp8_quant.py")) + sorted(whl.glob("vllm-*.whl"))
    return found[0] if found else None


def load_kernel(path: Path):
    """The jitted kernel from vLLM's wheel or its source file at ``path``."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            src = z.read(SOURCE).decode()
    else:
        src = path.read_text()
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FusedInvRopeFP8QuantKernel")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "kernel")
    code = textwrap.dedent(ast.get_source_segment(src, fn))
    code = code[code.index("def kernel"):]
    out = Path(tempfile.gettempdir()) / f"fusedrope-vllm-kernel-{os.getuid()}.py"
    out.write_text("import triton\nimport triton.language as tl\n\n"
                   '@triton.jit(do_not_specialize=["num_tokens", "scale_stride_k"])\n' + code)
    ns = {"__file__": str(out)}
    exec(compile(out.read_text(), str(out), "exec"), ns)  # Triton reads the source back from the file
    return ns["kernel"]


def outputs(o: torch.Tensor, n_groups: int, quant_group_size: int = 128):
    """vLLM's buffers: ``out_buf [G, T, D]`` fp8 and ``scale_buf`` fp32 ``[G, T, K]`` over ``[G, K, T_pad]``."""
    T, H, head_dim = o.shape
    d = H // n_groups * head_dim
    k = d // quant_group_size
    t_pad = -(-T // 4) * 4
    out_buf = torch.empty(n_groups, T, d, dtype=torch.float8_e4m3fn, device=o.device)
    scale_buf = torch.empty(n_groups * k * t_pad, dtype=torch.float32, device=o.device).as_strided(
        (n_groups, T, k), (k * t_pad, 1, t_pad))
    return out_buf, scale_buf


def launch(kernel, o, positions, cos_sin_cache, out_buf, scale_buf, n_groups: int, quant_group_size: int = 128,
           rope_dim: int = 64) -> None:
    """One launch of vLLM's kernel into its buffers (:func:`outputs`), as vLLM makes it on sm_90."""
    T, H, head_dim = o.shape
    hpg = H // n_groups
    block_h = math.gcd(hpg, 4)
    t_pad = scale_buf.stride(2)
    grid = (t_pad, n_groups * hpg // block_h)
    kernel[grid](o, positions, cos_sin_cache, out_buf, scale_buf, T, heads_per_group=hpg,
                 o_stride_token=o.stride(0), o_stride_head=o.stride(1), cache_stride_pos=cos_sin_cache.stride(0),
                 out_stride_group=out_buf.stride(0), out_stride_token=out_buf.stride(1),
                 scale_stride_group=scale_buf.stride(0), scale_stride_k=scale_buf.stride(2), fp8_max=448.0,
                 eps=1e-10, QUANT_GROUP_SIZE=quant_group_size, CHUNKS_PER_HEAD=head_dim // quant_group_size,
                 NOPE_DIM=head_dim - rope_dim, HALF_ROPE=rope_dim // 2, QUANTIZE=True, TMA_ALIGNED_SCALES=False,
                 BLOCK_H=block_h, launch_pdl=True, num_stages=1, num_warps=4 if grid[0] * grid[1] < 2048 else 1)
