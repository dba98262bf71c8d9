"""inverse_rope_group_quant on the hand-written CUDA kernel (kernels_cuda/inverse_rope_group_quant.cu).

Serves NVIDIA sm_80+ (hardware packed E4M3 conversion on sm_89+/sm_90; exact software RNE on sm_80/sm_86),
FP8 = float8_e4m3fn, head_dim 512 with rope_dim 64 (DeepSeek-V4), quant groups 32/64/128/256, bf16/fp16 ``o``,
bf16/fp16/fp32 caches, int64/int32 positions, the float8_e8m0fnu, uint8 and float32 scale formats and both
scale layouts. Other shapes, float8_e4m3fnuz (an AMD format) and packed int32 UE8M0 scales go to Triton.
Pointer alignment is decided inside the compiled op (16-byte vector path or a narrow one). The checks both
compiled kernels share and the backend entry are fusedrope/compiled_inverse_rope_quant.py's.

Status: compile- and SASS-checked for sm_90/sm_80 on CPU (tests/test_cuda_quant_kernels.py); the whole kernel
and its launcher run in CPU lockstep emulation, bit-exact against the reference (tests/test_emulated_quant_kernels.py);
GPU runs: gpu/check_inverse_rope_group_quant.py.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import cuda_ext
from .backends import gpu_arch
from ._checks import dtype_name
from .compiled_inverse_rope_quant import CompiledOp, envelope_reason


def supports(facts: tuple) -> Optional[str]:
    """``facts`` = ``(device, o.dtype, head_dim, rope_dim, quant_group_size, cache dtype, positions dtype,
    fp8_dtype, scale_dtype, transpose_scale)`` from ``fusedrope.inverse_rope_quant.validate``."""
    device, fp8_dtype = facts[0], facts[7]
    arch = gpu_arch(device)
    if not arch.startswith("sm_") or int(arch[3:]) < 80:
        return f"cuda kernel needs an NVIDIA GPU of sm_80 or newer, this device is {arch or device}"
    if fp8_dtype != torch.float8_e4m3fn:
        return f"cuda kernel writes float8_e4m3fn, got fp8_dtype={dtype_name(fp8_dtype)} (Triton serves it)"
    return envelope_reason("cuda kernel", facts)


def available(device: torch.device) -> Optional[str]:
    return cuda_ext.available(device)


inverse_rope_group_quant = CompiledOp(cuda_ext, "fusedrope_cuda")


def inverse_rope_group_quant_config(o, positions, cos, sin, x_fp8, x_scale, quant_group_size: int, *,
                                    chunks_per_thread: int = 0, tail_warps: int = 0, block_threads: int = 0,
                                    pdl: int = 0) -> None:
    """The raw CUDA op with a forced launch shape, for tests and tuning: ``chunks_per_thread`` 16-element chunks
    per thread, 1 or 2 (0 = the launcher's automatic choice); ``tail_warps=1`` puts every head's rope-tail
    chunks in warps of their own (with one chunk per thread; not yet timed on a GPU); ``block_threads`` threads
    per block, a multiple of 32 up to 256 (0 = automatic: 256, or fewer whole warps when the grid has fewer
    blocks than the GPU has SMs; not yet timed on a GPU); ``pdl=1`` launches it as a programmatic dependent launch
    (sm_90+: it may start while the stream's previous kernel finishes, and waits for it before reading; not yet
    run on a GPU). No validation beyond the binding's checks."""
    cuda_ext.load()
    torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config(o, positions, cos, sin, x_fp8, x_scale,
                                                                 quant_group_size, chunks_per_thread, tail_warps,
                                                                 block_threads, pdl)
