"""inverse_rope_group_quant on the hand-written HIP kernel (kernels_hip/inverse_rope_group_quant.hip), AMD
only.

Serves gfx942 (MI300, FP8 = float8_e4m3fnuz in hardware) and gfx950 (MI350/MI355, FP8 = OCP float8_e4m3fn in
hardware), head_dim 512 with rope_dim 64 (DeepSeek-V4), quant groups 32/64/128/256, bf16/fp16 ``o``,
bf16/fp16/fp32 caches, int64/int32 positions, the float8_e8m0fnu, uint8 and float32 scale formats and both
scale layouts. Other shapes, the non-native fp8 format of an arch and packed int32 UE8M0 scales go to
Triton (``supports`` says why).
Pointer alignment is decided inside the compiled op.

Status: compile-checked on CPU for gfx942 only; never run on AMD hardware from this repository
(docs/kernels_hip.md).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import hip_ext
from .backends import gpu_arch

NATIVE_FP8 = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}
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
    if arch not in NATIVE_FP8:
        return f"hip kernel runs on gfx942/gfx950, this device is {arch or device}"
    if fp8_dtype != NATIVE_FP8[arch]:
        return (f"hip kernel writes {_name(NATIVE_FP8[arch])} on {arch} (its hardware fp8 format), "
                f"got fp8_dtype={_name(fp8_dtype)} (Triton serves it)")
    if head_dim != 512 or rope_dim != 64:
        return f"hip kernel is compiled for head_dim 512 / rope_dim 64, got {head_dim} / {rope_dim}"
    if q not in GROUP_SIZES:
        return f"hip kernel serves quant_group_size in {GROUP_SIZES}, got {q}"
    if o_dtype not in O_DTYPES:
        return f"hip kernel serves bfloat16/float16 o, got {_name(o_dtype)}"
    if scale_dtype not in SCALE_DTYPES:
        return (f"hip kernel writes float8_e8m0fnu / uint8 / float32 scales, got scale_dtype="
                f"{_name(scale_dtype)} (packed UE8M0: Triton serves it)")
    return None


def available(device: torch.device) -> Optional[str]:
    return hip_ext.available(device)


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size) -> None:
    """Backend entry: write ``x_fp8`` / ``x_scale`` in place, one launch on the current stream."""
    global _op
    if _op is None:
        hip_ext.load()
        _op = torch.ops.fusedrope_hip.inverse_rope_group_quant_out.default
    _op(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size)
