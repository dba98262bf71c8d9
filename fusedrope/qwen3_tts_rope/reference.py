"""qwen3_tts_rope in plain PyTorch, written to be read: the ``reference`` backend (its float64 oracle is
:func:`fusedrope.reference.qwen3_tts_rope_oracle`)."""

from __future__ import annotations

import torch

from .. import _validation as V

OP = "qwen3_tts_rope"


def check_shapes(q, k, cos, sin, op: str = OP) -> None:
    """The op's shape contract, which the public function and the oracle both demand: ``q [B, Hq, S, D]``,
    ``k [B, Hkv, S, D]``, ``cos`` and ``sin [B or 1, S, D]``, ``D`` even."""
    V.check_tensor(op, "q", q, 4, "[B, Hq, S, D]")
    V.check_tensor(op, "k", k, 4, "[B, Hkv, S, D]")
    V.check_tensor(op, "cos", cos, 3, "[B or 1, S, D]")
    V.check_tensor(op, "sin", sin, 3, "[B or 1, S, D]")
    B, _, S, D = q.shape
    if D < 2 or D % 2:
        V.fail(op, "q", "an even head_dim D >= 2 (last dim)", f"D={D}")
    V.check_shape(op, "k", k, (B, None, S, D), ("B", "Hkv"))
    if cos.shape[0] not in (1, B):
        V.fail(op, "cos", f"shape [{B if B == 1 else f'{B} or 1'}, {S}, {D}]", V.shape_str(cos.shape))
    V.check_shape(op, "cos", cos, (cos.shape[0], S, D))
    V.check_shape(op, "sin", sin, tuple(cos.shape))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(-x[..., h:], x[..., :h])`` along the last dim, ``h = D/2`` (the NeoX / Hugging Face helper)."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def neox_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x: [B, H, S, D]`` and ``cos, sin: [B or 1, S, D]``, computed in
    and returned as ``compute_dtype`` (a new ``[B, H, S, D]`` tensor)."""
    x = x.to(compute_dtype)
    cos = cos.to(compute_dtype).unsqueeze(1)  # broadcast over heads
    sin = sin.to(compute_dtype).unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def qwen3_tts_rope(q, k, cos, sin, q_out, k_out) -> None:
    """Reference backend: fp32 math, one round-to-nearest-even to the output dtype (``copy_``).

    ``out = x * cos + rotate_half(x) * sin`` for every row ``x`` of ``q`` and ``k`` (see :func:`neox_rope`).

    Parameters
    ----------
    q : torch.Tensor
        ``[B, Hq, S, D]``, bf16 / fp16 / fp32, ``D`` even; any strides.
    k : torch.Tensor
        ``[B, Hkv, S, D]``, same dtype and device as ``q``.
    cos, sin : torch.Tensor
        ``[B or 1, S, D]`` (batch 1 broadcasts), same dtype and device. Both halves are read.
    q_out, k_out : torch.Tensor
        Shaped like ``q`` and ``k``, written in place through their own strides (may be ``q`` and ``k``).

    Returns
    -------
    None

    Examples
    --------
    >>> import torch
    >>> from fusedrope.reference import qwen3_tts_rope
    >>> from fusedrope.testing import qwen3_tts_cos_sin
    >>> q = torch.randn(1, 4, 8, 64, dtype=torch.bfloat16)
    >>> k = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    >>> cos, sin = qwen3_tts_cos_sin(torch.arange(8)[None], head_dim=64)  # [1, 8, 64] bf16 each
    >>> q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    >>> qwen3_tts_rope(q, k, cos, sin, q_out, k_out)
    >>> q_out.shape, k_out.shape, k_out.dtype
    (torch.Size([1, 4, 8, 64]), torch.Size([1, 2, 8, 64]), torch.bfloat16)
    >>> torch.equal(q_out[:, :, 0], q[:, :, 0])  # position 0: cos 1, sin 0
    True
    """
    q_out.copy_(neox_rope(q, cos, sin, torch.float32))
    k_out.copy_(neox_rope(k, cos, sin, torch.float32))
