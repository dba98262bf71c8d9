"""inverse_rope_group_quant on the hand-written CUDA kernels (kernels_cuda/inverse_rope_group_quant.cu), and what
they share with the HIP ones (:mod:`.hip`): the envelope both are compiled for and the call into the extension.

Serves NVIDIA sm_80+ (hardware packed E4M3 conversion on sm_89+, exact software RNE on sm_80/sm_86), FP8 =
float8_e4m3fn, head_dim 512 with rope_dim 64 (DeepSeek-V4), quant groups 32/64/128/256, bf16/fp16 ``o``,
bf16/fp16/fp32 caches, int64/int32 positions, the float8_e8m0fnu, uint8 and float32 scale formats and every
layout: the generic kernel writes a row-major x_fp8 with row- or column-major scales; the tiled kernel writes
group-major or padded x_fp8, mfma_tile scales and zeroed padding rows, and is opt-in (:func:`opt_in`). Other
shapes, float8_e4m3fnuz (an AMD format), packed int32 UE8M0 scales and quantize=False go to Triton. Pointer
alignment is decided inside the compiled op (16-byte vector path or a narrow one).
"""

from __future__ import annotations

from typing import Optional

import torch

from .._device import gpu_arch, sm_number
from .._validation import dtype_name

O_DTYPES = (torch.bfloat16, torch.float16)
GROUP_SIZES = (32, 64, 128, 256)
SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8, torch.float32)  # not DeepGEMM's packed int32 UE8M0


def envelope_reason(kernel: str, facts) -> Optional[str]:
    """Why the compiled ``kernel`` ("cuda kernel", "hip kernel") does not serve ``facts`` whatever the device or
    the layout."""
    if not facts.quantize:
        return f"{kernel} quantizes: quantize=False is served by Triton and the reference"
    if facts.head_dim != 512 or facts.rope_dim != 64:
        return f"{kernel} is compiled for head_dim 512 / rope_dim 64, got {facts.head_dim} / {facts.rope_dim}"
    if facts.quant_group_size not in GROUP_SIZES:
        return f"{kernel} serves quant_group_size in {GROUP_SIZES}, got {facts.quant_group_size}"
    if facts.o_dtype not in O_DTYPES:
        return f"{kernel} serves bfloat16/float16 o, got {dtype_name(facts.o_dtype)}"
    if facts.scale_dtype not in SCALE_DTYPES:
        return (f"{kernel} writes float8_e8m0fnu / uint8 / float32 scales, got scale_dtype="
                f"{dtype_name(facts.scale_dtype)} (packed UE8M0: Triton serves it)")
    return None


def tiled_layout(facts) -> Optional[str]:
    """The layout of ``facts`` that only the tiled kernel writes, or None."""
    if facts.scale_layout == "mfma_tile":
        return "scale_layout='mfma_tile'"
    if not facts.x_contiguous:
        return "a group-major or padded x_fp8"
    return "padding rows of x_scale" if facts.scale_pad else None


def supports(facts) -> Optional[str]:
    arch = gpu_arch(facts.device)
    if sm_number(arch) < 80:
        return f"cuda kernel needs an NVIDIA GPU of sm_80 or newer, this device is {arch or facts.device}"
    reason = envelope_reason("cuda kernel", facts)
    if reason is None and facts.fp8_dtype != torch.float8_e4m3fn:
        return f"cuda kernel writes float8_e4m3fn, got fp8_dtype={dtype_name(facts.fp8_dtype)} (Triton serves it)"
    if reason is None and facts.pdl and sm_number(arch) < 90:
        return f"cuda kernel launches with enable_pdl=True on sm_90 or newer, this device is {arch}"
    return reason


def opt_in(facts) -> Optional[str]:
    """Why ``auto`` passes over the CUDA backend for these facts: the tiled kernel has not run on a GPU
    (kernels_cuda/README.md)."""
    layout = tiled_layout(facts)
    return layout and f"{layout} takes the tiled cuda kernel, not yet confirmed on a GPU"


def available(device: torch.device) -> Optional[str]:
    """Asked for CUDA devices (the registry asks ``cuda_toolkit_reason`` first): builds or loads the extension."""
    from .. import cuda_ext

    return cuda_ext.available(device)


class CompiledOp:
    """``op.inverse_rope_group_quant_out`` of a vendor's extension: writes ``x_fp8`` / ``x_scale`` in place, one
    launch on the current stream (a few, token ranges in turn, past what the generic kernel can index)."""

    max_chunks = 2**31 - 1  # the generic kernels number o's 16-element chunks with 32-bit ints (S*H*head_dim/16)

    def __init__(self, op, pdl_op=None) -> None:
        self.op = op
        self.pdl_op = pdl_op  # the same launch as a programmatic dependent launch, where the vendor has one

    def __call__(self, o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size, *,
                 scale_layout: str = "row", pdl: bool = False) -> None:
        op = self.pdl_op if pdl and self.pdl_op is not None else self.op
        mfma = int(scale_layout == "mfma_tile")
        S, H, D = o.shape
        step = max(self.max_chunks // max(H * D // 16, 1), 1)  # a token past the limit: the launcher says so
        if S <= step or mfma or x_scale.shape[0] > S or not x_fp8.is_contiguous():  # the tiled kernel: 64-bit
            op(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size, mfma)
            return
        # Token slices keep the generic kernel's layouts: o, x_fp8 and row-major scales stay contiguous, and a
        # column-major scale slice keeps stride(1) == Ks * stride(2).
        for i in range(0, S, step):
            j = min(i + step, S)
            op(o[i:j], positions[i:j], cos_cache, sin_cache, x_fp8[i:j], x_scale[i:j], quant_group_size, 0)


def load() -> tuple:
    """The backend's ``(run, None)``, once the extension is loaded."""
    from .. import cuda_ext

    cuda_ext.load()
    ops = torch.ops.fusedrope_cuda

    def pdl_launch(o, positions, cos, sin, x_fp8, x_scale, quant_group_size, scale_layout):
        ops.inverse_rope_group_quant_out_config(o, positions, cos, sin, x_fp8, x_scale, quant_group_size, pdl=1,
                                                scale_layout=scale_layout)
    return CompiledOp(ops.inverse_rope_group_quant_out.default, pdl_launch), None


def inverse_rope_group_quant_config(o, positions, cos, sin, x_fp8, x_scale, quant_group_size: int, *,
                                    tail_warps: int = 0, fast_layout: int = 0, block_threads: int = 0,
                                    pdl: int = 0, tiled: int = 0, scale_layout: str = "row") -> None:
    """The raw CUDA op with the launch experiments of kernels_cuda/README.md switched on, for tests and the
    benchmarks that decide them: ``tail_warps=1`` (every head's rope-tail chunks in warps of their own),
    ``fast_layout=1`` (the kernels for the common 16-byte-aligned layout, where the layout allows),
    ``block_threads`` threads per block (a multiple of 32 up to 256; 0 = 256), ``pdl=1`` (a programmatic
    dependent launch, sm_90+), ``tiled=1`` (the tiled kernel for a layout the generic one writes too). No
    validation beyond the binding's checks."""
    from .. import cuda_ext

    cuda_ext.load()
    torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config(o, positions, cos, sin, x_fp8, x_scale,
                                                                 quant_group_size, tail_warps, fast_layout,
                                                                 block_threads, pdl, tiled,
                                                                 int(scale_layout == "mfma_tile"))
