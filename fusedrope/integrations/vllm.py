"""vLLM's DeepSeek-V4 call site, ``fused_inv_rope_fp8_quant`` (``vllm/models/deepseek_v4/common/ops/
fused_inv_rope_fp8_quant.py``), on :func:`fusedrope.inverse_rope_group_quant`: the same signature, and the
outputs vLLM's ``fp8_einsum`` reads without a transform.

    from fusedrope.integrations.vllm import fused_inv_rope_fp8_quant
    o_fp8, o_scale = fused_inv_rope_fp8_quant(o, positions, cos_sin_cache, n_groups, heads_per_group)

The values are fusedrope's contract (docs/inverse_rope_group_quant.md): positions are clamped, and an all-zero
block's scale is 2^ceil(log2(1e-8 / 448)).
"""

from __future__ import annotations

import torch

from .. import _validation as C
from ..inverse_rope_group_quant import inverse_rope_group_quant

WHO = "fused_inv_rope_fp8_quant"


def fused_inv_rope_fp8_quant(o: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, n_groups: int,
                             heads_per_group: int, nope_dim: int = 448, rope_dim: int = 64,
                             quant_group_size: int = 128, tma_aligned_scales: bool = False,
                             quantize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse RoPE on the attention output, then FP8 block quant, as vLLM's DeepSeek-V4 attention calls it.

    Parameters
    ----------
    o : torch.Tensor
        ``[T, H, nope_dim + rope_dim]`` bf16, ``H = n_groups * heads_per_group``.
    positions : torch.Tensor
        ``[T]`` int64 (or int32).
    cos_sin_cache : torch.Tensor
        ``[max_pos, rope_dim]``, cos in the first half of each row, sin in the second.
    n_groups, heads_per_group : int
        ``G`` and the heads of each group: group ``g`` is heads ``g*heads_per_group ...``.
    nope_dim, rope_dim : int, default 448, 64
    quant_group_size : int, default 128
    tma_aligned_scales : bool, default False
        False: fp32 scales (SM90); True: DeepGEMM's packed UE8M0 int32 words (SM100).
    quantize : bool, default True
        False: the inverse-rotated values in o's dtype, and an empty scale tensor.

    Returns
    -------
    (o_fp8, o_scale) : tuple of torch.Tensor
        ``o_fp8`` ``[T, G, D]`` (``D = heads_per_group * head_dim``) float8_e4m3fn over ``[G, T, D]`` storage,
        strides ``(D, T*D, 1)``. ``o_scale`` ``[T, G, K]`` MN-major and TMA-aligned: token stride 1, tokens
        padded to a multiple of 4 in storage ``[G, K, align(T, 4)]``, padding rows zero; ``K = D /
        quant_group_size`` fp32 scales, or ``K/4`` int32 words of four UE8M0 bytes.

    Raises
    ------
    TypeError, ValueError
        A flag (``tma_aligned_scales``, ``quantize``) that is not a bool (the string "False" is truthy),
        ``TypeError``; ``o`` or ``cos_sin_cache`` not shaped as the other arguments say; and
        :func:`fusedrope.inverse_rope_group_quant`'s own errors.

    Examples
    --------
    >>> import torch
    >>> from fusedrope.integrations.vllm import fused_inv_rope_fp8_quant
    >>> from fusedrope.testing import deepseek_rope_cache
    >>> o = torch.randn(3, 4, 512, dtype=torch.bfloat16)
    >>> cos_sin_cache = torch.cat(deepseek_rope_cache(64), dim=1)  # [64, 64]: cos | sin
    >>> x, s = fused_inv_rope_fp8_quant(o, torch.arange(3), cos_sin_cache, 2, 2)
    >>> x.shape, x.stride(), s.shape, s.stride(), s.dtype
    (torch.Size([3, 2, 1024]), (1024, 3072, 1), torch.Size([3, 2, 8]), (1, 32, 4), torch.float32)
    """
    C.check_tensor(WHO, "o", o, 3, "[T, H, nope_dim + rope_dim]")
    C.check_bool(WHO, "tma_aligned_scales", tma_aligned_scales)  # "False" would pack int32 scales, 0 skip quantizing
    C.check_bool(WHO, "quantize", quantize)
    T, H, head_dim = o.shape
    if H != n_groups * heads_per_group:
        C.fail(WHO, "o", f"H = n_groups * heads_per_group = {n_groups * heads_per_group} heads", f"H={H}")
    if head_dim != nope_dim + rope_dim:
        C.fail(WHO, "o", f"head_dim = nope_dim + rope_dim = {nope_dim + rope_dim}", f"head_dim={head_dim}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != rope_dim:
        C.fail(WHO, "cos_sin_cache", f"shape [max_pos, rope_dim={rope_dim}] (cos | sin)",
               C.shape_str(cos_sin_cache.shape))
    cos, sin = cos_sin_cache[:, :rope_dim // 2], cos_sin_cache[:, rope_dim // 2:]
    D = heads_per_group * head_dim
    x = torch.empty((n_groups, T, D), dtype=torch.float8_e4m3fn if quantize else o.dtype,
                    device=o.device).transpose(0, 1)
    if not quantize:
        inverse_rope_group_quant(o, positions, cos, sin, n_groups, quant_group_size, x_fp8=x, quantize=False)
        return x, torch.empty(0, dtype=torch.float32, device=o.device)
    K = D // quant_group_size
    if tma_aligned_scales and K % 4:
        C.fail(WHO, "tma_aligned_scales", f"False when the blocks per group D/quant_group_size={K} are not a multiple "
               "of 4 (packed UE8M0 holds four per int32)", "True")
    inner = K // 4 if tma_aligned_scales else K
    t_pad = -(-T // 4) * 4  # TMA: 16-byte aligned token columns of 4-byte scales
    storage = torch.empty((n_groups, inner, t_pad), dtype=torch.int32 if tma_aligned_scales else torch.float32,
                          device=o.device)
    padded = storage.permute(2, 0, 1)  # [t_pad, G, inner], strides (1, inner * t_pad, t_pad)
    # one launch: the op writes zeros into the rows past T, as vLLM's kernel does
    inverse_rope_group_quant(o, positions, cos, sin, n_groups, quant_group_size, x_fp8=x, x_scale=padded,
                             scale_layout="col")
    return x, padded[:T]
