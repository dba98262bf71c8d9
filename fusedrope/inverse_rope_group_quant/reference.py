"""inverse_rope_group_quant in plain PyTorch, written to be read: the ``reference`` backend and its steps (each
usable alone). The independent float64 formulation of the rotation is
:func:`fusedrope.reference.inverse_rope_oracle`."""

from __future__ import annotations

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}
AMAX_FLOOR = 1e-8  # an all-zero block gets scale byte 92 (e4m3fn) or 93 (e4m3fnuz)
FP32_AMAX_FLOOR = 1e-12  # scale_format="fp32" (TensorRT-LLM's): an all-zero block gets scale 1e-12 / FP8_MAX
E8M0_NAN = 0xFF  # the scale byte of a block that holds NaN or +-Inf


def clamp_positions(positions: torch.Tensor, num_tokens: int, max_pos: int) -> torch.Tensor:
    """``positions[:num_tokens]`` as int64, clamped to ``[0, max_pos - 1]`` (as every backend treats them)."""
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
    the biased exponent of ``t = amax * fp32(1/fp8_max)``, plus one when t's mantissa is non-zero.

    ``amax`` is first raised to ``AMAX_FLOOR`` (1e-8), so an all-zero block gets byte 92 (fp8_max 448) or 93
    (240); a NaN or +-Inf ``amax`` gets ``E8M0_NAN`` (0xFF).

    Parameters
    ----------
    amax : torch.Tensor
        Block maxima ``max|v| >= 0``, any shape, any floating dtype (computed in fp32).
    fp8_max : float
        The largest finite value of the fp8 type: ``FP8_MAX[fp8_dtype]``, 448.0 (e4m3fn) or 240.0 (e4m3fnuz).

    Returns
    -------
    torch.Tensor
        uint8, ``amax``'s shape: ``scale = 2^(byte - 127)``.

    Examples
    --------
    >>> import torch
    >>> from fusedrope.reference import e8m0_scale_bytes
    >>> e8m0_scale_bytes(torch.tensor([448.0, 449.0, 1.0, 0.0, float("nan")]), 448.0)
    tensor([127, 128, 119,  92, 255], dtype=torch.uint8)
    """
    t = amax.float().clamp_min(AMAX_FLOOR) * torch.tensor(1.0 / fp8_max, dtype=torch.float32, device=amax.device)
    bits = t.view(torch.int32)
    byte = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).int()
    return torch.where(torch.isfinite(amax), byte, E8M0_NAN).to(torch.uint8)


def e8m0_to_float(byte: torch.Tensor) -> torch.Tensor:
    """``2^(byte - 127)`` as fp32, ``byte``'s shape (NaN for 0xFF): the scales of uint8 e8m0 bytes."""
    return torch.where(byte == E8M0_NAN, float("nan"), torch.exp2(byte.float() - 127.0))


def group_quant_e8m0(x: torch.Tensor, num_groups: int, group_size: int, fp8_dtype: torch.dtype):
    """Per-block FP8 quant of ``x [S, ...]`` viewed as ``[S, G, Dg]``: returns ``(fp8 [S, G, Dg], byte
    [S, G, Dg/group_size])``. A block with NaN or Inf gets byte 0xFF and NaN in all its fp8 values.

    Each block of ``group_size`` consecutive elements of a group row gets ``byte = e8m0_scale_bytes(amax,
    FP8_MAX[fp8_dtype])`` and ``fp8 = fp8_rne(clamp(v / 2^(byte - 127), -FP8_MAX, FP8_MAX))``, in fp32.

    Parameters
    ----------
    x : torch.Tensor
        ``[S, ...]``, any floating dtype; each token's ``numel / S`` elements are split into ``num_groups``
        rows of ``Dg``. The inverse-RoPE step gives ``[S, H, head_dim]`` fp32 (:func:`inverse_rope_tail`).
    num_groups : int
        ``G``; must divide the elements per token.
    group_size : int
        Elements per scale block; must divide ``Dg``.
    fp8_dtype : torch.dtype
        ``torch.float8_e4m3fn`` (FP8_MAX 448) or ``torch.float8_e4m3fnuz`` (240).

    Returns
    -------
    (fp8, byte) : tuple of torch.Tensor
        ``[S, G, Dg]`` in ``fp8_dtype`` and ``[S, G, Dg/group_size]`` uint8 e8m0 bytes, contiguous.

    Examples
    --------
    >>> import torch
    >>> from fusedrope.reference import group_quant_e8m0
    >>> x = torch.zeros(2, 256)
    >>> x[0, :128] = 448.0; x[0, 128] = 1.0  # token 1 stays all zero
    >>> fp8, byte = group_quant_e8m0(x, 1, 128, torch.float8_e4m3fn)
    >>> fp8.shape, fp8.dtype, byte.shape
    (torch.Size([2, 1, 256]), torch.float8_e4m3fn, torch.Size([2, 1, 2]))
    >>> byte.flatten().tolist(), fp8[0, 0, 0].item(), fp8[0, 0, 128].item()
    ([127, 119, 92, 92], 448.0, 256.0)
    """
    fp8_max = FP8_MAX[fp8_dtype]
    S = x.shape[0]
    blocks = x.float().reshape(S, num_groups, -1, group_size)
    amax = blocks.abs().amax(dim=-1, keepdim=True)  # NaN propagates
    byte = e8m0_scale_bytes(amax, fp8_max)
    q = (blocks / e8m0_to_float(byte)).clamp(-fp8_max, fp8_max)  # exact: dividing by a power of two
    q = torch.where(byte == E8M0_NAN, float("nan"), q)
    return q.to(fp8_dtype).reshape(S, num_groups, -1), byte.reshape(S, num_groups, -1)


def group_quant_fp32(x: torch.Tensor, num_groups: int, group_size: int, fp8_dtype: torch.dtype):
    """:func:`group_quant_e8m0` with plain fp32 scales (``scale_format="fp32"``, TensorRT-LLM's): returns
    ``(fp8 [S, G, Dg], scale [S, G, Dg/group_size] fp32)``.

    With ``a = max(amax, 1e-12)``: ``scale = a * fp32(1/FP8_MAX)`` and ``fp8 = fp8_rne(clamp(v * (FP8_MAX / a),
    -FP8_MAX, FP8_MAX))``, each step one fp32 rounding (the division correctly rounded). A block holding NaN
    or Inf gets scale NaN and NaN fp8 values.

    Examples
    --------
    >>> import torch
    >>> from fusedrope.reference import group_quant_fp32
    >>> x = torch.zeros(1, 256)
    >>> x[0, :128] = 896.0; x[0, 128] = 1.0
    >>> fp8, scale = group_quant_fp32(x, 1, 128, torch.float8_e4m3fn)
    >>> scale.flatten().tolist() == [2.0, torch.tensor(1 / 448).item()], fp8[0, 0, 128].item()
    (True, 448.0)
    """
    fp8_max = FP8_MAX[fp8_dtype]
    S = x.shape[0]
    blocks = x.float().reshape(S, num_groups, -1, group_size)
    amax = blocks.abs().amax(dim=-1, keepdim=True)  # NaN propagates
    a = amax.clamp_min(FP32_AMAX_FLOOR)
    scale = a * torch.tensor(1.0 / fp8_max, dtype=torch.float32, device=x.device)
    # a tensor numerator: torch's scalar / tensor multiplies by a reciprocal, one more rounding
    q = (blocks * (torch.full_like(a, fp8_max) / a)).clamp(-fp8_max, fp8_max)
    bad = ~torch.isfinite(amax)
    q, scale = torch.where(bad, float("nan"), q), torch.where(bad, float("nan"), scale)
    return q.to(fp8_dtype).reshape(S, num_groups, -1), scale.reshape(S, num_groups, -1)


def pack_ue8m0(byte: torch.Tensor) -> torch.Tensor:
    """``[..., Ks]`` bytes -> ``[..., Ks/4]`` int32, byte ``i`` of word ``j`` = ``byte[4j+i]`` (DeepGEMM's UE8M0
    packing: word = b0 | b1 << 8 | b2 << 16 | b3 << 24; the view relies on little-endian memory, as on every
    GPU and x86 / Arm host).

    Parameters
    ----------
    byte : torch.Tensor
        uint8 e8m0 bytes ``[..., Ks]``, ``Ks`` a multiple of 4; any strides.

    Returns
    -------
    torch.Tensor
        int32 ``[..., Ks/4]`` (a view of ``byte``'s memory when ``byte`` is contiguous).

    Examples
    --------
    >>> import torch
    >>> from fusedrope.reference import pack_ue8m0
    >>> words = pack_ue8m0(torch.tensor([[127, 0, 0, 0, 1, 2, 3, 4]], dtype=torch.uint8))
    >>> words, hex(int(words[0, 1]))
    (tensor([[     127, 67305985]], dtype=torch.int32), '0x4030201')
    """
    return byte.reshape(*byte.shape[:-1], -1, 4).contiguous().view(torch.int32).squeeze(-1)


def mfma_tile_shape(num_tokens: int, num_groups: int, blocks: int, quant_group_size: int) -> tuple[int, int, int]:
    """``[G, S_pad, Ks_pad]`` of the ``"mfma_tile"`` scale layout (what gfx950's scaled MFMA GEMM reads): tokens
    padded to 32, blocks per group to 2 (quant group 128) or 8 (other groups)."""
    k_align = 2 if quant_group_size == 128 else 8
    return num_groups, -(-num_tokens // 32) * 32, -(-blocks // k_align) * k_align


def mfma_tile_offsets(num_tokens: int, num_groups: int, blocks: int, quant_group_size: int,
                      device=None) -> torch.Tensor:
    """The flat offset, in the contiguous ``"mfma_tile"`` buffer ``[G, S_pad, Ks_pad]``, of each scale ``[s, g, k]``:
    int64 ``[S, G, Ks]``. Scale ``[s, g, k]`` sits at index ``(g, s // 32, k // 2, s % 16, k % 2, (s // 16) % 2)``
    of the buffer seen as ``[G, S_pad/32, Ks_pad/2, 16, 2, 2]`` (quant group 128), else at ``(g, s // 32, k // 8,
    k % 4, s % 16, (k // 4) % 2, (s // 16) % 2)`` of ``[G, S_pad/32, Ks_pad/8, 4, 16, 2, 2]``; padding bytes are
    not part of the layout."""
    _, s_pad, k_pad = mfma_tile_shape(num_tokens, num_groups, blocks, quant_group_size)
    s = torch.arange(num_tokens, device=device)[:, None, None]
    g = torch.arange(num_groups, device=device)[None, :, None]
    k = torch.arange(blocks, device=device)[None, None, :]
    if quant_group_size == 128:  # [G, S_pad/32, Ks_pad/2, 16, 2, 2]: (r, e, c) -> 4r + 2e + c
        inner = 4 * (s % 16) + 2 * (k % 2) + (s // 16) % 2
        return ((g * (s_pad // 32) + s // 32) * (k_pad // 2) + k // 2) * 64 + inner
    # [G, S_pad/32, Ks_pad/8, 4, 16, 2, 2]: (e, r, f, c) -> 64e + 4r + 2f + c
    inner = 64 * (k % 4) + 4 * (s % 16) + 2 * ((k // 4) % 2) + (s // 16) % 2
    return ((g * (s_pad // 32) + s // 32) * (k_pad // 8) + k // 8) * 256 + inner


def n32k4_shape(num_tokens: int, num_groups: int, blocks: int) -> tuple[int, int, int]:
    """``[ceil(S/32), G, Ks*32]`` of the ``"n32k4"`` scale layout (aiter's gfx1250 WMMA scaleB layout)."""
    return -(-num_tokens // 32), num_groups, blocks * 32


def n32k4_offsets(num_tokens: int, num_groups: int, blocks: int, device=None) -> torch.Tensor:
    """The flat offset, in the contiguous ``"n32k4"`` buffer ``[ceil(S/32), G, Ks*32]``, of each scale
    ``[s, g, k]``: int64 ``[S, G, Ks]``. Scale ``[s, g, k]`` sits at ``[s // 32, g, (k // 4)*128 + (s % 32)*4 + k %
    4]``: each 32-token super-row holds, per K=128 step (4 blocks of 32), one 4-byte word per token. Bytes of
    tokens past S are not part of the layout."""
    s = torch.arange(num_tokens, device=device)[:, None, None]
    g = torch.arange(num_groups, device=device)[None, :, None]
    k = torch.arange(blocks, device=device)[None, None, :]
    return ((s // 32) * num_groups + g) * (blocks * 32) + (k // 4) * 128 + (s % 32) * 4 + k % 4


def store_scale(byte: torch.Tensor, x_scale: torch.Tensor, scale_layout: str = "row",
                quant_group_size: int = 128) -> None:
    """Write scale bytes ``byte [S, G, Ks]`` (uint8) into ``x_scale`` in its format and layout: e8m0 or raw uint8
    ``[S, G, Ks]`` (the bytes), fp32 ``[S, G, Ks]`` (:func:`e8m0_to_float`) or packed int32 ``[S, G, Ks/4]``
    (:func:`pack_ue8m0`), through its strides ("row", "col"); or, for ``"mfma_tile"`` and ``"n32k4"``, the e8m0 /
    uint8 bytes at their offsets in the contiguous buffer (:func:`mfma_tile_offsets`, :func:`n32k4_offsets`).
    ``byte`` fp32 instead: plain scales (``scale_format="fp32"``), copied through the strides."""
    if scale_layout in ("mfma_tile", "n32k4"):
        S, G, Ks = byte.shape
        flat = x_scale.view(torch.uint8).view(-1)
        at = (mfma_tile_offsets(S, G, Ks, quant_group_size, byte.device) if scale_layout == "mfma_tile"
              else n32k4_offsets(S, G, Ks, byte.device))
        flat[at] = byte
        return
    if byte.dtype == torch.float32:
        x_scale.copy_(byte)
        return
    if x_scale.dtype == torch.float32:
        x_scale.copy_(e8m0_to_float(byte))
    elif x_scale.dtype == torch.int32:
        x_scale.copy_(pack_ue8m0(byte))
    else:
        x_scale.view(torch.uint8).copy_(byte)


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size, *,
                             scale_layout: str = "row", pdl: bool = False, scale_format: str = "ue8m0") -> None:
    """Reference backend: inverse RoPE of each head's tail, then per-block FP8 quant, fp32 throughout.

    The arguments are the backends' (:func:`fusedrope.register_backend`): the inputs as
    :func:`fusedrope.inverse_rope_group_quant` takes them, and its outputs allocated (``x_scale`` None with
    ``quantize=False``; ``pdl``, a launch hint, means nothing here). Step 1 is :func:`inverse_rope_tail`, step
    2 :func:`group_quant_e8m0` (or :func:`group_quant_fp32` for ``scale_format="fp32"``) with ``G =
    x_fp8.shape[1]`` and ``FP8_MAX[x_fp8.dtype]``; the results are written through the outputs' strides
    (:func:`store_scale`). Without ``x_scale``, step 1's result is rounded once to ``x_fp8``'s dtype (o's).

    Examples
    --------
    >>> import torch, fusedrope
    >>> from fusedrope.reference import inverse_rope_group_quant
    >>> from fusedrope.testing import deepseek_rope_cache
    >>> o = torch.randn(4, 2, 128, dtype=torch.bfloat16)
    >>> cos_cache, sin_cache = deepseek_rope_cache(64)  # [64, 32] fp32 each
    >>> x_fp8, x_scale = fusedrope.empty_quant_outputs(o, 2, 64)
    >>> inverse_rope_group_quant(o, torch.arange(4), cos_cache, sin_cache, x_fp8, x_scale, 64)
    >>> x_fp8.shape, x_fp8.dtype, x_scale.shape, x_scale.dtype
    (torch.Size([4, 2, 128]), torch.float8_e4m3fn, torch.Size([4, 2, 2]), torch.float8_e8m0fnu)
    """
    x = inverse_rope_tail(o, positions, cos_cache, sin_cache)
    if x_scale is None:
        x_fp8.copy_(x.reshape(x_fp8.shape))
        return
    quant = group_quant_fp32 if scale_format == "fp32" else group_quant_e8m0
    q, byte = quant(x, x_fp8.shape[1], quant_group_size, x_fp8.dtype)
    x_fp8.copy_(q)
    if scale_layout == "col" and x_scale.shape[0] > x_fp8.shape[0]:  # token rows past o's: zeros
        x_scale[x_fp8.shape[0]:].zero_()
    store_scale(byte, x_scale[:x_fp8.shape[0]] if scale_layout == "col" else x_scale, scale_layout, quant_group_size)
