"""The helpers for callers who allocate inverse_rope_group_quant's outputs themselves (e.g. once before CUDA-graph
capture): their shapes, and new tensors laid out as the op writes them."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _validation as C
from .outputs import empty_outputs, group_widths, is_int, resolve_dtypes, resolve_layout, shapes


def quant_output_shapes(num_tokens: int, num_heads: int, head_dim: int, num_groups: int,
                        quant_group_size: int = 128, scale_dtype: Optional[torch.dtype] = None, *,
                        scale_layout: Optional[str] = None, quantize: bool = True) -> tuple[tuple, tuple]:
    """The shapes of the op's two outputs, for callers who allocate them (e.g. before CUDA-graph capture).

    ``S, H, head_dim`` are ``o``'s; the other arguments are :func:`inverse_rope_group_quant`'s. Returns
    ``([S, G, Dg], [S, G, Ks])`` with ``Dg = H*head_dim/G`` and ``Ks = Dg/quant_group_size`` (``Ks/4`` int32
    words for packed UE8M0; ``[G, S_pad, Ks_pad]`` for ``"mfma_tile"``; ``(0,)`` without quantization).

    Examples
    --------
    >>> import fusedrope
    >>> fusedrope.quant_output_shapes(8, 16, 512, 2)
    ((8, 2, 4096), (8, 2, 32))
    >>> fusedrope.quant_output_shapes(8, 16, 512, 2, scale_layout="mfma_tile")
    ((8, 2, 4096), (2, 32, 32))
    >>> fusedrope.quant_output_shapes(8, 16, 512, 2, quantize=False)
    ((8, 2, 4096), (0,))
    """
    who = "quant_output_shapes"
    for name, v in (("num_tokens", num_tokens), ("num_heads", num_heads), ("head_dim", head_dim)):
        if not is_int(v) or v < 0:
            C.fail(who, name, "a non-negative int", repr(v), ValueError if is_int(v) else TypeError)
    layout = resolve_layout(False, scale_layout, quantize, who)
    _, scale_dtype = resolve_dtypes(None, None, None, scale_dtype, layout, quantize, None, who)
    dg, ks = group_widths(num_heads * head_dim, num_groups, quant_group_size, scale_dtype, who)
    return shapes(num_tokens, num_groups, dg, ks, scale_dtype, layout, quantize, quant_group_size)


def empty_quant_outputs(o: torch.Tensor, num_groups: int, quant_group_size: int = 128,
                        transpose_scale: bool = False, *, fp8_dtype: Optional[torch.dtype] = None,
                        scale_dtype: Optional[torch.dtype] = None, scale_layout: Optional[str] = None,
                        quantize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate ``(x_fp8, x_scale)`` laid out as the op writes them, e.g. once before CUDA-graph capture.

    The arguments are :func:`inverse_rope_group_quant`'s (``o`` for its shape and device): the outputs are
    uninitialised, with the shapes of :func:`quant_output_shapes` and the strides the op checks; ``x_fp8``
    row-major.

    Examples
    --------
    >>> import torch, fusedrope
    >>> o = torch.zeros(4, 16, 512, dtype=torch.bfloat16)
    >>> x, s = fusedrope.empty_quant_outputs(o, 2, transpose_scale=True)
    >>> x.shape, s.shape, s.stride()
    (torch.Size([4, 2, 4096]), torch.Size([4, 2, 32]), (1, 128, 4))
    """
    who = "empty_quant_outputs"
    C.check_tensor(who, "o", o, 3, "[S, H, head_dim]")
    layout = resolve_layout(transpose_scale, scale_layout, quantize, who)
    fp8_dtype, scale_dtype = resolve_dtypes(None, None, fp8_dtype, scale_dtype, layout, quantize, o.dtype, who)
    S, H, D = o.shape
    group_widths(H * D, num_groups, quant_group_size, scale_dtype, who)
    return empty_outputs(o, num_groups, quant_group_size, layout, fp8_dtype, scale_dtype, quantize)
