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


# --------------------------------------------------------------------------------------------------------
# inverse_rope_group_quant: DeepSeek-V4 attention output -> inverse RoPE -> FP8 per-group quant, e8m0 scales
# --------------------------------------------------------------------------------------------------------
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}
AMAX_FLOOR = 1e-8  # an all-zero block gets scale byte 92
E8M0_NAN = 0xFF  # the scale byte of a block that holds NaN or +-Inf


def clamp_positions(positions: torch.Tensor, num_tokens: int, max_pos: int) -> torch.Tensor:
    return positions[:num_tokens].long().clamp(0, max_pos - 1)


def inverse_rope_tail(o: torch.Tensor, positions, cos_cache, sin_cache) -> torch.Tensor:
    """fp32 copy of ``o [S, H, head_dim]`` whose last ``rope_dim`` dims of every head are rotated back:
    pair j = (e, d) = (x[2j], x[2j+1]) of the tail, ``e' = e*c + d*n``, ``d' = d*c - e*n`` (GPT-J layout,
    multiplication by the complex conjugate of ``c + i*n``)."""
    S, _, head_dim = o.shape
    rope_dim = 2 * cos_cache.shape[1]
    p = clamp_positions(positions, S, cos_cache.shape[0])
    c = cos_cache[p].float()[:, None, :]  # [S, 1, rope_dim/2], shared by all heads of a token
    n = sin_cache[p].float()[:, None, :]
    x = o.float().clone()
    tail = x[..., head_dim - rope_dim:]
    e, d = tail[..., 0::2].clone(), tail[..., 1::2].clone()
    tail[..., 0::2] = e * c + d * n
    tail[..., 1::2] = d * c - e * n
    return x


def e8m0_scale_bytes(amax: torch.Tensor, fp8_max: float) -> torch.Tensor:
    """The e8m0 byte of ``scale = 2^ceil(log2(amax / fp8_max))``, read off fp32 bits (exact at powers of two):
    the biased exponent of ``t = amax * fp32(1/fp8_max)``, plus one when t's mantissa is non-zero."""
    t = amax.float().clamp_min(AMAX_FLOOR) * torch.tensor(1.0 / fp8_max, dtype=torch.float32)
    bits = t.view(torch.int32)
    byte = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).int()
    return torch.where(torch.isfinite(amax), byte, E8M0_NAN).to(torch.uint8)


def e8m0_to_float(byte: torch.Tensor) -> torch.Tensor:
    """2^(byte - 127) as fp32 (NaN for 0xFF)."""
    return torch.where(byte == E8M0_NAN, float("nan"), torch.exp2(byte.float() - 127.0))


def group_quant_e8m0(x: torch.Tensor, num_groups: int, group_size: int, fp8_dtype: torch.dtype):
    """Per-block FP8 quant of ``x [S, ...]`` viewed as ``[S, G, Dg]``: returns ``(fp8 [S, G, Dg], byte
    [S, G, Dg/group_size])``. A block with NaN or Inf gets byte 0xFF and NaN in all its fp8 values."""
    fp8_max = FP8_MAX[fp8_dtype]
    S = x.shape[0]
    blocks = x.float().reshape(S, num_groups, -1, group_size)
    amax = blocks.abs().amax(dim=-1, keepdim=True)  # NaN propagates
    byte = e8m0_scale_bytes(amax, fp8_max)
    q = (blocks / e8m0_to_float(byte)).clamp(-fp8_max, fp8_max)  # exact: dividing by a power of two
    q = torch.where(byte == E8M0_NAN, float("nan"), q)
    return q.to(fp8_dtype).reshape(S, num_groups, -1), byte.reshape(S, num_groups, -1)


def pack_ue8m0(byte: torch.Tensor) -> torch.Tensor:
    """``[..., Ks]`` bytes -> ``[..., Ks/4]`` int32, byte ``i`` of word ``j`` = ``byte[4j+i]`` (DeepGEMM's UE8M0
    packing: word = b0 | b1 << 8 | b2 << 16 | b3 << 24; the view relies on little-endian memory, as on every
    GPU and x86 / Arm host)."""
    return byte.reshape(*byte.shape[:-1], -1, 4).contiguous().view(torch.int32).squeeze(-1)


def store_scale(byte: torch.Tensor, x_scale: torch.Tensor) -> None:
    """Write scale bytes into ``x_scale`` through its strides, in its format (e8m0, raw uint8, fp32 or packed
    int32)."""
    if x_scale.dtype == torch.float32:
        x_scale.copy_(e8m0_to_float(byte))
    elif x_scale.dtype == torch.int32:
        x_scale.copy_(pack_ue8m0(byte))
    else:
        x_scale.view(torch.uint8).copy_(byte)


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size) -> None:
    """Reference backend: inverse RoPE of each head's tail, then per-block e8m0 FP8 quant, fp32 throughout."""
    x = inverse_rope_tail(o, positions, cos_cache, sin_cache)
    q, byte = group_quant_e8m0(x, x_fp8.shape[1], quant_group_size, x_fp8.dtype)
    x_fp8.copy_(q)
    store_scale(byte, x_scale)


def inverse_rope_oracle(o, positions, cos_cache, sin_cache) -> torch.Tensor:
    """Independent float64 formulation of step 1, as DeepSeek-V4 writes it: view the tail as complex
    numbers ``x[2j] + i*x[2j+1]`` and multiply by ``conj(cos + i*sin)``. Returns ``[S, H, head_dim]`` fp64."""
    S, _, head_dim = o.shape
    rope_dim = 2 * cos_cache.shape[1]
    p = clamp_positions(positions, S, cos_cache.shape[0])
    freqs = torch.complex(cos_cache[p].double(), sin_cache[p].double())[:, None, :]
    x = o.double().clone()
    tail = torch.view_as_complex(x[..., head_dim - rope_dim:].reshape(*x.shape[:-1], -1, 2).contiguous())
    x[..., head_dim - rope_dim:] = torch.view_as_real(tail * freqs.conj()).flatten(-2)
    return x
