"""Reference implementations: plain PyTorch, any device, written to be read. They are the ``reference``
backend and the oracles the tests and other kernel authors compare against.

``*_oracle`` functions compute in float64 and return float64, for ulp-distance checks.
"""

from __future__ import annotations

import torch


# --------------------------------------------------------------------------------------------------------
# qwen3_tts_rope: NeoX rotate_half RoPE on standalone Q and K
# --------------------------------------------------------------------------------------------------------
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def neox_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x: [B, H, S, D]`` and ``cos, sin: [B or 1, S, D]``."""
    x = x.to(compute_dtype)
    cos = cos.to(compute_dtype).unsqueeze(1)  # broadcast over heads
    sin = sin.to(compute_dtype).unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def qwen3_tts_rope(q, k, cos, sin, q_out, k_out) -> None:
    """Reference backend: fp32 math, one round-to-nearest-even to the output dtype (``copy_``)."""
    q_out.copy_(neox_rope(q, cos, sin, torch.float32))
    k_out.copy_(neox_rope(k, cos, sin, torch.float32))


def qwen3_tts_rope_oracle(q, k, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact result in float64 (products of bf16/fp16 values are exact there)."""
    return neox_rope(q, cos, sin, torch.float64), neox_rope(k, cos, sin, torch.float64)
