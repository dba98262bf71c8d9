"""inverse_rope_group_quant on the hand-written CUDA kernel (kernels_cuda/inverse_rope_group_quant.cu).

Serves NVIDIA sm_80+ (hardware packed E4M3 conversion on sm_89+/sm_90; exact software RNE on sm_80/sm_86),
FP8 = float8_e4m3fn, head_dim 512 with rope_dim 64 (DeepSeek-V4), quant groups 32/64/128/256, bf16/fp16 ``o``,
bf16/fp16/fp32 caches, int64/int32 positions, the float8_e8m0fnu, uint8 and float32 scale formats and both
scale layouts. Other shapes, float8_e4m3fnuz (an AMD format) and packed int32 UE8M0 scales go to Triton.
Pointer alignment is decided inside the compiled op (16-byte vector path or a narrow one).

Status: compile- and SASS-checked for sm_90/sm_80 on CPU and its math emulated on CPU bit-exactly
(tests/test_cuda_quant_kernels.py); GPU runs: gpu/check_inverse_rope_group_quant.py.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import cuda_ext
from .backends import gpu_arch

O_DTYPES = (torch.bfloat16, torch.float16)
GROUP_SIZES = (32, 64, 128, 256)
SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8, torch.float32)  # not DeepGEMM's packed int32 UE8M0

_op = None


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def supports(facts: tuple) -> Optional[str]:
    """``facts`` = ``(device, o.dtype, head_dim, rope_dim, quant_group_size, cache dtype, positions dtype,
    fp8_dtype, scale_dtype, transpose_scale)`` from ``fusedrope.inverse_rope_quant.validate``."""
    device, o_dtype, head_dim, rope_dim, q, _cache, _pos, fp8_dtype, scale_dtype, _t = facts
    arch = gpu_arch(device)
    if not arch.startswith("sm_") or int(arch[3:]) < 80:
        return f"cuda kernel needs an NVIDIA GPU of sm_80 or newer, this device is {arch or device}"
    if fp8_dtype != torch.float8_e4m3fn:
        return f"cuda kernel writes float8_e4m3fn, got fp8_dtype={_name(fp8_dtype)} (Triton serves it)"
    if head_dim != 512 or rope_dim != 64:
        return f"cuda kernel is compiled for head_dim 512 / rope_dim 64, got {head_dim} / {rope_dim}"
    if q not in GROUP_SIZES:
        return f"cuda kernel serves quant_group_size in {GROUP_SIZES}, got {q}"
    if o_dtype not in O_DTYPES:
        return f"cuda kernel serves bfloat16/float16 o, got {_name(o_dtype)}"
    if scale_dtype not in SCALE_DTYPES:
        return (f"cuda kernel writes float8_e8m0fnu / uint8 / float32 scales, got scale_dtype="
                f"{_name(scale_dtype)} (packed UE8M0: Triton serves it)")
    return None


def available(device: torch.device) -> Optional[str]:
    return cuda_ext.available(device)


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size) -> None:
    """Backend entry: write ``x_fp8`` / ``x_scale`` in place, one launch on the current stream."""
    global _op
    if _op is None:
        cuda_ext.load()
        _op = torch.ops.fusedrope_cuda.inverse_rope_group_quant_out.default
    _op(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size)
