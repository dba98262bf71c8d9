"""The reference implementations of both ops, in plain PyTorch, under one name: the ``reference`` backends (each
op's lives in its package: ``fusedrope.qwen3_tts_rope.reference``, ``fusedrope.inverse_rope_group_quant.reference``)
and the float64 oracles tests and other kernel authors compare against, which live here: no call needs them."""

from __future__ import annotations

import torch

from .inverse_rope_group_quant.reference import (AMAX_FLOOR, E8M0_NAN, FP8_MAX, FP32_AMAX_FLOOR, clamp_positions,
                                                 e8m0_scale_bytes, e8m0_to_float, group_quant_e8m0, group_quant_fp32,
                                                 inverse_rope_group_quant, inverse_rope_tail, mfma_tile_offsets,
                                                 mfma_tile_shape, n32k4_offsets, n32k4_shape, pack_ue8m0, store_scale)
from .qwen3_tts_rope.reference import check_shapes, neox_rope, qwen3_tts_rope, rms_norm, rotate_half, rows_of

__all__ = [
    "rotate_half", "neox_rope", "rms_norm", "rows_of", "qwen3_tts_rope", "qwen3_tts_rope_oracle",
    "FP8_MAX", "AMAX_FLOOR", "FP32_AMAX_FLOOR", "E8M0_NAN", "clamp_positions", "inverse_rope_tail",
    "e8m0_scale_bytes", "e8m0_to_float", "group_quant_e8m0", "group_quant_fp32", "pack_ue8m0", "mfma_tile_shape",
    "mfma_tile_offsets", "n32k4_shape", "n32k4_offsets", "store_scale",
    "inverse_rope_group_quant", "inverse_rope_oracle",
]


def qwen3_tts_rope_oracle(q, k, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact result in float64 (products of bf16/fp16 values are exact there).

    ``x * cos + rotate_half(x) * sin`` for ``q`` and ``k``, for ulp-distance checks of a kernel's output.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, Hq, S, D]``, any floating dtype, ``D`` even; any strides.
    k : torch.Tensor
        ``[B, Hkv, S, D]``.
    cos, sin : torch.Tensor
        ``[B or 1, S, D]`` (batch 1 broadcasts).

    Returns
    -------
    (q_ref, k_ref) : tuple of torch.Tensor
        float64, ``[B, Hq, S, D]`` and ``[B, Hkv, S, D]``, contiguous.

    Raises
    ------
    ValueError, TypeError
        Shapes outside the op's contract, named as the op names them (no silent broadcasting).

    Examples
    --------
    >>> import fusedrope
    >>> from fusedrope.reference import qwen3_tts_rope_oracle
    >>> from fusedrope.testing import TtsCase, make_tts_inputs, assert_ulp_close
    >>> q, k, cos, sin = make_tts_inputs(TtsCase("tiny", 2, 4, 4, 2, 64))  # bf16, q/k strided
    >>> q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    >>> q_ref.shape, k_ref.shape, q_ref.dtype
    (torch.Size([2, 4, 4, 64]), torch.Size([2, 2, 4, 64]), torch.float64)
    >>> q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin)
    >>> assert_ulp_close(q_out, q_ref, max_ulp=1); assert_ulp_close(k_out, k_ref, max_ulp=1)
    """
    check_shapes(q, k, cos, sin, "qwen3_tts_rope_oracle")  # no silent broadcast of, e.g., a 2-D [S, D] cos
    return neox_rope(q, cos, sin, torch.float64), neox_rope(k, cos, sin, torch.float64)


def inverse_rope_oracle(o, positions, cos_cache, sin_cache) -> torch.Tensor:
    """Independent float64 formulation of step 1, as DeepSeek-V4 writes it: view the tail as complex
    numbers ``x[2j] + i*x[2j+1]`` and multiply by ``conj(cos + i*sin)``. Returns ``[S, H, head_dim]`` fp64.

    Parameters
    ----------
    o : torch.Tensor
        ``[S, H, head_dim]``, any floating dtype.
    positions : torch.Tensor
        int64 or int32, 1-D, at least ``S`` elements; the first ``S`` are used, clamped to ``[0, max_pos)``.
    cos_cache, sin_cache : torch.Tensor
        ``[max_pos, rope_dim/2]``, any floating dtype; ``rope_dim = 2 * cos_cache.shape[1] <= head_dim``.

    Returns
    -------
    torch.Tensor
        float64 ``[S, H, head_dim]``: ``o`` with the last ``rope_dim`` dims of every head rotated back; the
        other ``head_dim - rope_dim`` dims are ``o``'s values.

    Examples
    --------
    >>> import torch
    >>> from fusedrope.reference import inverse_rope_oracle, inverse_rope_tail
    >>> from fusedrope.testing import deepseek_rope_cache
    >>> o = torch.randn(4, 2, 128, dtype=torch.bfloat16)
    >>> cos_cache, sin_cache = deepseek_rope_cache(64)  # rope_dim 64
    >>> positions = torch.tensor([0, 5, 63, 99])  # 99 is clamped to 63
    >>> ref = inverse_rope_oracle(o, positions, cos_cache, sin_cache)
    >>> ref.shape, ref.dtype
    (torch.Size([4, 2, 128]), torch.float64)
    >>> torch.equal(ref[..., :64], o[..., :64].double()), torch.equal(ref[0], o[0].double())  # position 0: identity
    (True, True)
    >>> torch.allclose(inverse_rope_tail(o, positions, cos_cache, sin_cache).double(), ref, rtol=0, atol=1e-5)
    True
    """
    S, _, head_dim = o.shape
    rope_dim = 2 * cos_cache.shape[1]
    p = clamp_positions(positions, S, cos_cache.shape[0])
    freqs = torch.complex(cos_cache[p].double(), sin_cache[p].double())[:, None, :]
    x = o.double().clone()
    tail = torch.view_as_complex(x[..., head_dim - rope_dim:].reshape(*x.shape[:-1], -1, 2).contiguous())
    x[..., head_dim - rope_dim:] = torch.view_as_real(tail * freqs.conj()).flatten(-2)
    return x
