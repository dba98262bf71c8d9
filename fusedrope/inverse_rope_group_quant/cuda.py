"""inverse_rope_group_quant on the hand-written CUDA kernels (kernels_cuda/inverse_rope_group_quant.cu), and what
they share with the HIP ones (:mod:`.hip`): the envelope both are compiled for and the call into the extension.

Serves NVIDIA sm_80+ (hardware packed E4M3 conversion on sm_89+, exact software RNE on sm_80/sm_86), FP8 =
float8_e4m3fn, head_dim 512 with rope_dim 64 (DeepSeek-V4), quant groups 32/64/128/256, bf16/fp16 ``o``,
bf16/fp16/fp32 caches, int64/int32 positions, the float8_e8m0fnu, uint8 and float32 scale formats. Two kernels:

* ``cuda``: the generic kernel (a lane per 16-element chunk, the layout read per call), row-major x_fp8 with row-
  or column-major scales, any alignment.
* ``cuda_head``: the head kernel (a warp per (token, head), every lane rotating one rope pair), also group-major
  or padded x_fp8 and zeroed padding rows of column-major scales; bf16 ``o``, int64 positions, bf16 or fp32
  caches. Opt-in (:func:`head_opt_in`, docs/status.md); where a call's alignment is outside it, the
  launcher takes the generic kernel for the layouts that one writes.

float8_e4m3fnuz (an AMD format), mfma_tile scales (gfx950's), packed int32 UE8M0 scales and quantize=False go to
Triton.
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
    if facts.scale_format != "ue8m0":
        return f"{kernel} writes power-of-two scales, got scale_format={facts.scale_format!r} (Triton serves it)"
    if facts.scale_layout == "n32k4":
        return f"{kernel} writes no n32k4 scales (Triton serves them)"
    return None


def head_layout(facts) -> Optional[str]:
    """The layout of ``facts`` that only the head kernel writes, or None."""
    if not facts.x_contiguous:
        return "a group-major or padded x_fp8"
    return "padding rows of x_scale" if facts.scale_pad else None


def _common(facts, arch: Optional[str] = None) -> Optional[str]:
    arch = arch or gpu_arch(facts.device)
    if sm_number(arch) < 80:
        return f"cuda kernel needs an NVIDIA GPU of sm_80 or newer, this device is {arch or facts.device}"
    reason = envelope_reason("cuda kernel", facts)
    if reason is None and facts.fp8_dtype != torch.float8_e4m3fn:
        return f"cuda kernel writes float8_e4m3fn, got fp8_dtype={dtype_name(facts.fp8_dtype)} (Triton serves it)"
    if reason is None and facts.scale_layout == "mfma_tile":
        return "cuda kernel writes row- or column-major scales, got scale_layout='mfma_tile' (Triton serves it)"
    if reason is None and facts.pdl and sm_number(arch) < 90:
        return f"cuda kernel launches with enable_pdl=True on sm_90 or newer, this device is {arch}"
    return reason


def supports(facts, arch: Optional[str] = None) -> Optional[str]:
    """The generic kernel (backend ``cuda``) on facts.device (or a GPU of ``arch``, e.g. "sm_90")."""
    reason = _common(facts, arch)
    layout = reason is None and head_layout(facts)
    return reason or (layout and f"{layout} is written by the head kernel only: backend='cuda_head'")


def head_supports(facts, arch: Optional[str] = None) -> Optional[str]:
    """The head kernel (backend ``cuda_head``), as :func:`supports`."""
    reason = _common(facts, arch)
    if reason is None and facts.o_dtype != torch.bfloat16:
        return f"cuda_head kernel reads bfloat16 o, got {dtype_name(facts.o_dtype)}"
    if reason is None and facts.positions_dtype != torch.int64:
        return f"cuda_head kernel reads int64 positions, got {dtype_name(facts.positions_dtype)}"
    if reason is None and facts.cache_dtype not in (torch.float32, torch.bfloat16):
        return f"cuda_head kernel reads float32 or bfloat16 caches, got {dtype_name(facts.cache_dtype)}"
    return reason


def head_opt_in(facts) -> Optional[str]:
    """Why ``auto`` passes over ``cuda_head`` (docs/status.md)."""
    return "the head kernel has not run on a GPU (kernels_cuda/README.md: what decides it)"


def available(device: torch.device) -> Optional[str]:
    """Asked for CUDA devices (the registry asks ``cuda_toolkit_reason`` first): builds or loads the extension."""
    from .. import cuda_ext

    return cuda_ext.available(device)


class CompiledOp:
    """``op.inverse_rope_group_quant_out`` of a vendor's extension, taking ``kernel`` (0 generic, 1 head): writes
    ``x_fp8`` / ``x_scale`` in place, one launch on the current stream (a few, token ranges in turn, where the
    generic kernel cannot index the whole call)."""

    max_chunks = 2**31 - 1  # the generic kernel numbers o's 16-element chunks with 32-bit ints (S*H*head_dim/16)

    def __init__(self, op, kernel: int = 0) -> None:
        self.op = op
        self.kernel = kernel

    def __call__(self, o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size, *,
                 scale_layout: str = "row", pdl: bool = False, scale_format: str = "ue8m0") -> None:
        mfma = int(scale_layout == "mfma_tile")  # scale_format: "ue8m0", the only one supports() lets through
        S, H, D = o.shape
        step = max(self.max_chunks // max(H * D // 16, 1), 1)  # a token past the limit: the launcher says so
        if S <= step or self.kernel or mfma or x_scale.shape[0] > S or not x_fp8.is_contiguous():
            self.op(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size, mfma, int(pdl), self.kernel)
            return
        # Token slices keep the generic kernel's layouts: o, x_fp8 and row-major scales stay contiguous, and a
        # column-major scale slice keeps stride(1) == Ks * stride(2).
        for i in range(0, S, step):
            j = min(i + step, S)
            self.op(o[i:j], positions[i:j], cos_cache, sin_cache, x_fp8[i:j], x_scale[i:j], quant_group_size, 0,
                    int(pdl), 0)


def load(kernel: int = 0) -> tuple:
    """The backend's ``(run, None)`` for ``kernel`` (0: ``cuda``, 1: ``cuda_head``), once the extension is loaded."""
    from .. import cuda_ext

    cuda_ext.load()
    return CompiledOp(torch.ops.fusedrope_cuda.inverse_rope_group_quant_out.default, kernel), None
