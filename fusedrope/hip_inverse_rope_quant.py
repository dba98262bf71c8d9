"""inverse_rope_group_quant on the hand-written HIP kernel (kernels_hip/inverse_rope_group_quant.hip), AMD
only.

Serves gfx942 (MI300, FP8 = float8_e4m3fnuz in hardware) and gfx950 (MI350/MI355, FP8 = OCP float8_e4m3fn in
hardware), head_dim 512 with rope_dim 64 (DeepSeek-V4), quant groups 32/64/128/256, bf16/fp16 ``o``,
bf16/fp16/fp32 caches, int64/int32 positions, the float8_e8m0fnu, uint8 and float32 scale formats and both
scale layouts. Other shapes, the non-native fp8 format of an arch and packed int32 UE8M0 scales go to
Triton (``supports`` says why).
Pointer alignment is decided inside the compiled op. The checks both compiled kernels share and the backend
entry are fusedrope/compiled_inverse_rope_quant.py's.

Status: compiled and ISA-checked on CPU for gfx942 (Debian clang-19) and gfx950 (zig's clang 22)
(tests/test_hip_kernels.py); the whole kernel and its launcher run in CPU lockstep emulation, bit-exact against
the reference, also built as for gfx942 and gfx950 (hardware fp8 path through a model of v_cvt_pk_fp8_f32;
tests/test_emulated_quant_kernels.py); never run on AMD hardware from this repository (docs/kernels_hip.md).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import hip_ext
from .backends import arch_fp8_dtype, gpu_arch
from ._checks import dtype_name
from .compiled_inverse_rope_quant import CompiledOp, envelope_reason


def supports(facts: tuple) -> Optional[str]:
    """``facts`` = ``(device, o.dtype, head_dim, rope_dim, quant_group_size, cache dtype, positions dtype,
    fp8_dtype, scale_dtype, transpose_scale)`` from ``fusedrope.inverse_rope_quant.validate``."""
    device, fp8_dtype = facts[0], facts[7]
    arch = gpu_arch(device)
    if arch not in hip_ext.ARCHS:
        return f"hip kernel runs on {'/'.join(hip_ext.ARCHS)}, this device is {arch or device}"
    native = arch_fp8_dtype(arch)
    if fp8_dtype != native:
        return (f"hip kernel writes {dtype_name(native)} on {arch} (its hardware fp8 format), "
                f"got fp8_dtype={dtype_name(fp8_dtype)} (Triton serves it)")
    return envelope_reason("hip kernel", facts)


def available(device: torch.device) -> Optional[str]:
    return hip_ext.available(device)


inverse_rope_group_quant = CompiledOp(hip_ext, "fusedrope_hip")
