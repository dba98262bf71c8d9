"""What the compiled backends of inverse_rope_group_quant (fusedrope/cuda_inverse_rope_quant.py and
fusedrope/hip_inverse_rope_quant.py) share: the envelope both hand-written kernels are compiled for (head_dim
512 with rope_dim 64, quant groups 32/64/128/256, bf16/fp16 ``o``, the float8_e8m0fnu / uint8 / float32 scale
formats) and the backend entry that loads the vendor's extension on first use and calls its op. Each vendor
module keeps its own device and fp8-format checks.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._checks import dtype_name

O_DTYPES = (torch.bfloat16, torch.float16)
GROUP_SIZES = (32, 64, 128, 256)
SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8, torch.float32)  # not DeepGEMM's packed int32 UE8M0


def envelope_reason(kernel: str, facts: tuple) -> Optional[str]:
    """Why the compiled ``kernel`` ("cuda kernel", "hip kernel") does not serve ``facts`` whatever the device,
    or None. ``facts`` as for the backends' ``supports``."""
    _device, o_dtype, head_dim, rope_dim, q, _cache, _pos, _fp8, scale_dtype, _t = facts
    if head_dim != 512 or rope_dim != 64:
        return f"{kernel} is compiled for head_dim 512 / rope_dim 64, got {head_dim} / {rope_dim}"
    if q not in GROUP_SIZES:
        return f"{kernel} serves quant_group_size in {GROUP_SIZES}, got {q}"
    if o_dtype not in O_DTYPES:
        return f"{kernel} serves bfloat16/float16 o, got {dtype_name(o_dtype)}"
    if scale_dtype not in SCALE_DTYPES:
        return (f"{kernel} writes float8_e8m0fnu / uint8 / float32 scales, got scale_dtype="
                f"{dtype_name(scale_dtype)} (packed UE8M0: Triton serves it)")
    return None


class CompiledOp:
    """The backend entry: ``ext.load()`` once, then ``torch.ops.<namespace>.inverse_rope_group_quant_out``
    writes ``x_fp8`` / ``x_scale`` in place, one launch on the current stream (a few, token ranges in turn,
    past what one launch can index)."""

    max_chunks = 2**31 - 1  # the kernels number 16-element chunks of o with 32-bit ints (S*H*head_dim/16)

    def __init__(self, ext, namespace: str) -> None:
        self.ext = ext  # the vendor's extension module (fusedrope.cuda_ext / fusedrope.hip_ext)
        self.namespace = namespace
        self._op = None

    def __call__(self, o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size) -> None:
        if self._op is None:
            self.ext.load()
            self._op = getattr(torch.ops, self.namespace).inverse_rope_group_quant_out.default
        S, H, D = o.shape
        step = max(self.max_chunks // max(H * D // 16, 1), 1)  # a token past the limit: the binding says so
        if S <= step:
            self._op(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size)
            return
        # Token slices keep every layout the kernels take: o, x_fp8 and row-major scales stay contiguous, and a
        # column-major scale slice keeps stride(1) == Ks * stride(2).
        for i in range(0, S, step):
            j = min(i + step, S)
            self._op(o[i:j], positions[i:j], cos_cache, sin_cache, x_fp8[i:j], x_scale[i:j], quant_group_size)
