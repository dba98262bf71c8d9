"""qwen3_tts_rope on the hand-written CUDA kernel (kernels_cuda/qwen3_tts_rope.cu).

Serves bf16 and fp16 with head_dim 64, 128 or 256. The kernel itself picks 16-byte vector accesses when every
pointer and leading stride allows them, and a narrower path otherwise (alignment is a run-time fact, so it is
decided inside the compiled op, not here).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import cuda_ext
from ._checks import dtype_name

DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128, 256)

_op = None
_op_new = None


def supports(facts: tuple) -> Optional[str]:
    """``facts`` = ``(device, dtype, D, inplace)`` from ``fusedrope.tts_rope.validate``."""
    _, dtype, d, _ = facts
    if dtype in DTYPES and d in HEAD_DIMS:
        return None
    return f"cuda kernel serves bfloat16/float16 with D in {HEAD_DIMS}, got {dtype_name(dtype)} D={d}"


def available(device: torch.device) -> Optional[str]:
    return cuda_ext.available(device)


def qwen3_tts_rope(q, k, cos, sin, q_out, k_out) -> None:
    """Rotate ``q``/``k`` into ``q_out``/``k_out`` (which may be ``q``/``k`` themselves) in one launch."""
    global _op
    if _op is None:
        cuda_ext.load()
        _op = torch.ops.fusedrope_cuda.qwen3_tts_rope_out.default
    _op(q, k, cos, sin, q_out, k_out)


def qwen3_tts_rope_new(q, k, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q``/``k`` into new contiguous tensors, allocated by the compiled op (one Python -> C++ call)."""
    global _op_new
    if _op_new is None:
        cuda_ext.load()
        _op_new = torch.ops.fusedrope_cuda.qwen3_tts_rope.default
    return _op_new(q, k, cos, sin)


def qwen3_tts_rope_config(q, k, cos, sin, q_out, k_out, *, vec: int = 0, warps_per_token: int = 0,
                          tokens_per_cta: int = 0, max_blocks: int = 0) -> None:
    """Like :func:`qwen3_tts_rope` with a forced launch shape (0 = automatic), for tests and tuning.

    ``vec`` 8/2/1 forces the 16-byte / 4-byte / scalar path (it may not be wider than the layout allows);
    ``warps_per_token`` and ``tokens_per_cta`` shape the blocks; ``max_blocks`` caps the grid.
    """
    cuda_ext.load()
    torch.ops.fusedrope_cuda.qwen3_tts_rope_out_config(q, k, cos, sin, q_out, k_out, vec, warps_per_token,
                                                       tokens_per_cta, max_blocks)
