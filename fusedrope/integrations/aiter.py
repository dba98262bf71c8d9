"""aiter's current call, ``aiter.ops.inverse_rope_group_quant`` and ``scale_shape`` (what SGLang and vLLM's ROCm
path call before a batched a8w8 GEMM with MX scales), on :func:`fusedrope.inverse_rope_group_quant`: the same
signatures, the device's own fp8 format (float8_e4m3fnuz on gfx942, float8_e4m3fn elsewhere).

    from fusedrope.integrations.aiter import inverse_rope_group_quant, scale_shape
    x_fp8, x_scale = inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups,
                                              scale_layout="mfma_tile")

``scale_layout`` "row", "mfma_tile" (gfx950's scaled MFMA tiles) or "n32k4" (gfx1250's WMMA scaleB layout, quant
group 32); the padding bytes of the tiled layouts are left as they were, as aiter leaves them undefined.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import _validation as C
from .._device import native_fp8_dtype
from ..inverse_rope_group_quant import inverse_rope_group_quant as _op
from ..inverse_rope_group_quant.reference import mfma_tile_shape, n32k4_shape

LAYOUTS = ("row", "mfma_tile", "n32k4")


def _check_layout(who: str, scale_layout) -> None:
    if not isinstance(scale_layout, str) or scale_layout not in LAYOUTS:
        C.fail(who, "scale_layout", f"one of {LAYOUTS}", repr(scale_layout))


def scale_shape(s: int, num_groups: int, scale_groups: int, scale_layout: str = "row",
                quant_group_size: int = 128) -> tuple[int, ...]:
    """The shape of the ``x_scale`` buffer ``scale_layout`` wants, for ``s`` tokens and ``scale_groups`` blocks
    per group: ``(s, G, Ks)`` row-major, ``(G, S_pad, Ks_pad)`` for ``"mfma_tile"`` (tokens padded to 32,
    blocks to 2 for quant group 128, else 8), or ``(ceil(s/32), G, Ks*32)`` for ``"n32k4"``.

    Examples
    --------
    >>> from fusedrope.integrations.aiter import scale_shape
    >>> scale_shape(33, 2, 32), scale_shape(33, 2, 32, "mfma_tile"), scale_shape(33, 2, 5, "mfma_tile", 64)
    ((33, 2, 32), (2, 64, 32), (2, 64, 8))
    >>> scale_shape(33, 2, 16, "n32k4", 32)
    (2, 2, 512)
    """
    _check_layout("scale_shape", scale_layout)
    if scale_layout == "mfma_tile":
        return mfma_tile_shape(s, num_groups, scale_groups, quant_group_size)
    if scale_layout == "n32k4":
        return n32k4_shape(s, num_groups, scale_groups)
    return (s, num_groups, scale_groups)


def inverse_rope_group_quant(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                             sin_cache: torch.Tensor, num_groups: int, quant_group_size: int = 128,
                             scale_layout: str = "row", x_fp8: Optional[torch.Tensor] = None,
                             x_scale: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """aiter's ``inverse_rope_group_quant``: ``o [S, H, head_dim]`` -> ``x_fp8 [S, G, Dg]`` in the device's fp8
    format and e8m0 scales in ``scale_layout`` (:func:`scale_shape`); ``x_fp8`` / ``x_scale`` are written in
    place when given (e.g. for graph capture). See :func:`fusedrope.inverse_rope_group_quant` for the math.

    Examples
    --------
    >>> import torch
    >>> from fusedrope.integrations.aiter import inverse_rope_group_quant
    >>> from fusedrope.testing import deepseek_rope_cache
    >>> o = torch.randn(3, 4, 512, dtype=torch.bfloat16)
    >>> cos, sin = deepseek_rope_cache(64)
    >>> x, s = inverse_rope_group_quant(o, torch.arange(3), cos, sin, 2, scale_layout="mfma_tile")
    >>> x.shape, s.shape, s.dtype
    (torch.Size([3, 2, 1024]), torch.Size([2, 32, 8]), torch.float8_e8m0fnu)
    """
    _check_layout("inverse_rope_group_quant", scale_layout)
    fp8 = None if x_fp8 is not None else native_fp8_dtype(o.device) if isinstance(o, torch.Tensor) else None
    return _op(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, x_fp8=x_fp8, x_scale=x_scale,
               fp8_dtype=fp8, scale_layout=scale_layout)
