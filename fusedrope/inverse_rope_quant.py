"""inverse_rope_group_quant: the public function, its input contract, output allocation, registry entries
and torch ops (DeepSeek-V4 attention output -> wo_a FP8 GEMM input)."""

from __future__ import annotations

import os
from typing import Optional

import torch

from . import _checks as C
from .backends import reference_available, triton_available
from .registry import Impl, registry
from . import cuda_inverse_rope_quant as _cuda  # light: cpp_extension is imported only to build
from . import hip_inverse_rope_quant as _hip

OP = "inverse_rope_group_quant"
REGISTRY = registry(OP)
O_DTYPES = (torch.bfloat16, torch.float16)
CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
POSITION_DTYPES = (torch.int64, torch.int32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# e8m0 bytes, the same bytes as uint8, the same powers of two as fp32, or DeepGEMM's packed UE8M0 (int32).
SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8, torch.float32, torch.int32)
PACKED_UE8M0 = torch.int32
QUANT_GROUP_SIZES = (32, 64, 128, 256)
ENV_CHECK_POSITIONS = "FUSEDROPE_CHECK_POSITIONS"


def quant_output_shapes(num_tokens: int, num_heads: int, head_dim: int, num_groups: int,
                        quant_group_size: int = 128, scale_dtype: Optional[torch.dtype] = None) -> tuple[tuple, tuple]:
    """The shapes of the op's two outputs, for callers who allocate them (e.g. before CUDA-graph capture).

    Parameters
    ----------
    num_tokens, num_heads, head_dim : int
        ``S, H, head_dim`` of ``o``.
    num_groups : int
        ``G``; ``Dg = H * head_dim / G``.
    quant_group_size : int, default 128
        ``Ks = Dg / quant_group_size`` scales per group.
    scale_dtype : torch.dtype, optional
        ``torch.int32`` (packed UE8M0) packs four scales per element: the last dim is then ``Ks/4``.

    Returns
    -------
    (x_fp8 shape, x_scale shape) : tuple of tuple
        ``([S, G, Dg], [S, G, Ks])``.

    Examples
    --------
    >>> import fusedrope
    >>> fusedrope.quant_output_shapes(8, 16, 512, 2)
    ((8, 2, 4096), (8, 2, 32))
    """
    dg = num_heads * head_dim // num_groups
    ks = dg // quant_group_size
    return (num_tokens, num_groups, dg), (num_tokens, num_groups, ks // 4 if scale_dtype == PACKED_UE8M0 else ks)


def scale_strides(shape: tuple, transpose_scale: bool, scale_dtype: Optional[torch.dtype] = None) -> tuple:
    """Row-major ``[S, G, Ks]``, or column-major: storage ``[G, Ks, S]`` seen as ``[S, G, Ks]``.

    Packed UE8M0 column-major pads S to a multiple of 4 (16 bytes), the TMA-aligned MN-major layout DeepGEMM's
    ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` produces; padding rows are never written."""
    S, G, Ks = shape
    if not transpose_scale:
        return (G * Ks, Ks, 1)
    s_pad = -(-S // 4) * 4 if scale_dtype == PACKED_UE8M0 else S
    return (1, Ks * s_pad, s_pad)


def empty_quant_outputs(o: torch.Tensor, num_groups: int, quant_group_size: int = 128,
                        transpose_scale: bool = False, *, fp8_dtype: Optional[torch.dtype] = None,
                        scale_dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate ``(x_fp8, x_scale)`` laid out as the op writes them, e.g. once before CUDA-graph capture.

    Parameters
    ----------
    o : torch.Tensor
        The ``[S, H, head_dim]`` input the buffers are for (its shape and device are used).
    num_groups : int
    quant_group_size : int, default 128
    transpose_scale : bool, default False
        True: the column-major scale layout (storage ``[G, Ks, S]``, seen as ``[S, G, Ks]``).
    fp8_dtype : torch.dtype, optional
        Default ``torch.float8_e4m3fn``.
    scale_dtype : torch.dtype, optional
        ``torch.float8_e8m0fnu`` (default), ``torch.uint8`` (the same bytes), ``torch.float32`` (the same
        powers of two as fp32, what SM90 DeepGEMM-style GEMMs read) or ``torch.int32`` (DeepGEMM's packed
        UE8M0: byte ``i`` of element ``[s, g, j]`` is the scale of block ``4j+i``).

    Returns
    -------
    (x_fp8, x_scale) : tuple of torch.Tensor
        Uninitialised, with the shapes of :func:`quant_output_shapes` and the strides the op checks.

    Examples
    --------
    >>> import torch, fusedrope
    >>> o = torch.zeros(4, 16, 512, dtype=torch.bfloat16)
    >>> x, s = fusedrope.empty_quant_outputs(o, 2, transpose_scale=True)
    >>> x.shape, s.shape, s.stride()
    (torch.Size([4, 2, 4096]), torch.Size([4, 2, 32]), (1, 128, 4))
    """
    S, H, D = o.shape
    scale_dtype = scale_dtype or torch.float8_e8m0fnu
    fp_shape, sc_shape = quant_output_shapes(S, H, D, num_groups, quant_group_size, scale_dtype)
    x_fp8 = torch.empty(fp_shape, dtype=fp8_dtype or torch.float8_e4m3fn, device=o.device)
    x_scale = torch.empty_strided(sc_shape, scale_strides(sc_shape, transpose_scale, scale_dtype),
                                  dtype=scale_dtype, device=o.device)
    return x_fp8, x_scale


def _same_layout(t: torch.Tensor, strides: tuple) -> bool:
    return all(n <= 1 or s == e for n, s, e in zip(t.shape, t.stride(), strides))


def validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale,
             x_fp8, x_scale, fp8_dtype, scale_dtype) -> tuple:
    """Check every argument; return ``(facts, fp8_dtype, scale_dtype)``. ``facts`` keys backend selection."""
    C.check_tensor(OP, "o", o, 3, "[S, H, head_dim]")
    C.check_dtype(OP, "o", o, O_DTYPES)
    if not o.is_contiguous():
        C.fail(OP, "o", "a contiguous tensor", f"strides {tuple(o.stride())} for shape {C.shape_str(o.shape)}")
    S, H, D = o.shape
    C.check_tensor(OP, "positions", positions, 1, "[>= S]")
    C.check_dtype(OP, "positions", positions, POSITION_DTYPES)
    if positions.shape[0] < S:
        C.fail(OP, "positions", f"at least S={S} elements", positions.shape[0])
    C.check_tensor(OP, "cos_cache", cos_cache, 2, "[max_pos, rope_dim/2]")
    C.check_tensor(OP, "sin_cache", sin_cache, 2, "[max_pos, rope_dim/2]")
    C.check_dtype(OP, "cos_cache", cos_cache, CACHE_DTYPES)
    C.check_same_dtype(OP, "cos_cache", cos_cache, {"sin_cache": sin_cache})
    C.check_shape(OP, "sin_cache", sin_cache, tuple(cos_cache.shape))
    C.check_last_dim_contiguous(OP, "cos_cache", cos_cache)
    C.check_last_dim_contiguous(OP, "sin_cache", sin_cache)
    max_pos, half = cos_cache.shape
    if max_pos < 1 or half < 1 or 2 * half > D:
        C.fail(OP, "cos_cache", f"shape [max_pos >= 1, rope_dim/2] with 1 <= rope_dim <= head_dim={D}",
               C.shape_str(cos_cache.shape))
    C.check_same_device(OP, "o", o, {"positions": positions, "cos_cache": cos_cache, "sin_cache": sin_cache})
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1 or (H * D) % num_groups:
        C.fail(OP, "num_groups", f"a positive int dividing H*head_dim={H * D}", repr(num_groups))
    if quant_group_size not in QUANT_GROUP_SIZES:
        C.fail(OP, "quant_group_size", f"one of {QUANT_GROUP_SIZES}", repr(quant_group_size))
    dg = H * D // num_groups
    if dg % quant_group_size:
        C.fail(OP, "quant_group_size", f"a divisor of the group width Dg=H*head_dim/num_groups={dg}",
               quant_group_size)

    if fp8_dtype is None:
        fp8_dtype = x_fp8.dtype if isinstance(x_fp8, torch.Tensor) else torch.float8_e4m3fn
    if fp8_dtype not in FP8_DTYPES:
        C.fail(OP, "fp8_dtype", " or ".join(map(C.dtype_name, FP8_DTYPES)), fp8_dtype, TypeError)
    if scale_dtype is None:
        scale_dtype = x_scale.dtype if isinstance(x_scale, torch.Tensor) else torch.float8_e8m0fnu
    if scale_dtype not in SCALE_DTYPES:
        C.fail(OP, "scale_dtype", " or ".join(map(C.dtype_name, SCALE_DTYPES)), scale_dtype, TypeError)
    if scale_dtype == PACKED_UE8M0 and (dg // quant_group_size) % 4:
        C.fail(OP, "scale_dtype", "int32 (packed UE8M0) only when the blocks per group "
               "Dg/quant_group_size are a multiple of 4", f"{dg}/{quant_group_size}={dg // quant_group_size}",
               ValueError)
    fp_shape, sc_shape = quant_output_shapes(S, H, D, num_groups, quant_group_size, scale_dtype)
    if x_fp8 is not None:
        C.check_tensor(OP, "x_fp8", x_fp8)
        C.check_shape(OP, "x_fp8", x_fp8, fp_shape)
        C.check_dtype(OP, "x_fp8", x_fp8, (fp8_dtype,))
        if not x_fp8.is_contiguous():
            C.fail(OP, "x_fp8", "a contiguous tensor", f"strides {tuple(x_fp8.stride())}")
        C.check_same_device(OP, "o", o, {"x_fp8": x_fp8})
    if x_scale is not None:
        C.check_tensor(OP, "x_scale", x_scale)
        C.check_shape(OP, "x_scale", x_scale, sc_shape)
        C.check_dtype(OP, "x_scale", x_scale, (scale_dtype,))
        want = scale_strides(sc_shape, bool(transpose_scale), scale_dtype)
        if not _same_layout(x_scale, want):
            layout = "column-major ([G, Ks, S] storage)" if transpose_scale else "row-major contiguous"
            C.fail(OP, "x_scale", f"{layout} strides {want} for transpose_scale={bool(transpose_scale)}",
                   f"strides {tuple(x_scale.stride())}")
        C.check_same_device(OP, "o", o, {"x_scale": x_scale})
    facts = (o.device, o.dtype, D, 2 * half, quant_group_size, cos_cache.dtype, positions.dtype,
             fp8_dtype, scale_dtype, bool(transpose_scale))
    return facts, fp8_dtype, scale_dtype


def check_positions_on_host(positions: torch.Tensor, num_tokens: int, max_pos: int) -> None:
    """Debug switch (``FUSEDROPE_CHECK_POSITIONS=1``): raise on out-of-range positions instead of clamping.
    Synchronises with the device, so it is off by default."""
    p = positions[:num_tokens]
    bad = ((p < 0) | (p >= max_pos)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        C.fail(OP, "positions", f"values in [0, max_pos={max_pos})",
               f"positions[{i}]={int(p[i])} ({bad.numel()} out of range)")


# -- backends -----------------------------------------------------------------------------------------
def _supports_any(facts) -> None:
    return None


REGISTRY.register(Impl("reference", ".reference:inverse_rope_group_quant", _supports_any, reference_available))
REGISTRY.register(Impl("triton", ".triton_inverse_rope_quant:inverse_rope_group_quant", _supports_any,
                       triton_available))
REGISTRY.register(Impl("hip", ".hip_inverse_rope_quant:inverse_rope_group_quant", _hip.supports, _hip.available))
REGISTRY.register(Impl("cuda", ".cuda_inverse_rope_quant:inverse_rope_group_quant", _cuda.supports,
                       _cuda.available))


def _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8, x_scale,
         fp8_dtype, scale_dtype, backend):
    facts, fp8_dtype, scale_dtype = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                                             transpose_scale, x_fp8, x_scale, fp8_dtype, scale_dtype)
    impl = REGISTRY.select(facts, backend)
    if x_fp8 is None or x_scale is None:
        new_fp8, new_scale = empty_quant_outputs(o, num_groups, quant_group_size, transpose_scale,
                                                 fp8_dtype=fp8_dtype, scale_dtype=scale_dtype)
        x_fp8 = new_fp8 if x_fp8 is None else x_fp8
        x_scale = new_scale if x_scale is None else x_scale
    if os.environ.get(ENV_CHECK_POSITIONS, "0") not in ("", "0"):
        check_positions_on_host(positions, o.shape[0], cos_cache.shape[0])
    if o.numel():
        impl.fn()(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size)
    return x_fp8, x_scale


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size=128,
                             transpose_scale=False, x_fp8=None, x_scale=None, *, fp8_dtype=None,
                             scale_dtype=None, backend="auto"):
    """Inverse RoPE on the attention output fused with FP8 per-group quant with power-of-two scales.

    Per token ``s`` (fp32 throughout): the last ``rope_dim = 2 * cos_cache.size(1)`` dims of every head are
    rotated back (GPT-J pairs ``(e, d) = (x[2j], x[2j+1])``, ``p = clamp(positions[s], 0, max_pos - 1)``,
    ``e' = e*c + d*n``, ``d' = d*c - e*n`` with ``c, n = cos_cache[p, j], sin_cache[p, j]``); then each block
    of ``quant_group_size`` consecutive elements of a group row gets ``scale = 2^ceil(log2(amax / FP8_MAX))``
    (``amax >= 1e-8``, stored as its e8m0 byte) and ``x_fp8 = fp8_rne(clamp(v / scale, -FP8_MAX, FP8_MAX))``.
    A block holding NaN or Inf gets scale byte 0xFF and NaN fp8 values; no other block is affected.

    Parameters
    ----------
    o : torch.Tensor
        ``[S, H, head_dim]`` bf16 or fp16, contiguous (DeepSeek-V4: head_dim 512).
    positions : torch.Tensor
        int64 or int32, 1-D, at least ``S`` elements, on ``o``'s device. Out-of-range values are clamped on
        the device; set ``FUSEDROPE_CHECK_POSITIONS=1`` to raise instead (synchronises).
    cos_cache, sin_cache : torch.Tensor
        ``[max_pos, rope_dim/2]``, bf16 / fp16 / fp32, same shape and dtype; rows may be strided.
    num_groups : int
        ``G``; group ``g`` is ``o[s].reshape(G, Dg)[g]`` with ``Dg = H * head_dim / G``.
    quant_group_size : int, default 128
        32, 64, 128 or 256; must divide ``Dg``.
    transpose_scale : bool, default False
        False: ``x_scale`` row-major ``[S, G, Ks]``. True: column-major, storage ``[G, Ks, S]``, returned as
        the ``[S, G, Ks]`` view with strides ``(1, Ks*S, S)``.
    x_fp8, x_scale : torch.Tensor, optional
        Output buffers (e.g. for CUDA-graph capture), checked and written in place; see
        :func:`empty_quant_outputs` to allocate them.
    fp8_dtype : torch.dtype, optional
        ``torch.float8_e4m3fn`` (FP8_MAX 448, default; NVIDIA, gfx950) or ``torch.float8_e4m3fnuz`` (240, gfx942).
    scale_dtype : torch.dtype, optional
        ``torch.float8_e8m0fnu`` (default), ``torch.uint8`` (same bytes), ``torch.float32`` (2^k as fp32) or
        ``torch.int32``: DeepGEMM's packed UE8M0, ``[S, G, Ks/4]``, byte ``i`` of ``[s, g, j]`` holding block
        ``4j+i``; with ``transpose_scale=True`` its storage is ``[G, Ks/4, align(S, 4)]`` (TMA-aligned MN-major,
        ``x_scale.permute(1, 0, 2)`` is what DeepGEMM's ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` gives).
    backend : str, default "auto"
        ``"auto"``, ``"hip"``, ``"cuda"``, ``"triton"`` or ``"reference"``.

    Returns
    -------
    (x_fp8, x_scale) : tuple of torch.Tensor
        ``[S, G, Dg]`` fp8 and ``[S, G, Dg / quant_group_size]`` scales.

    Examples
    --------
    >>> import torch, fusedrope
    >>> o = torch.randn(4, 16, 512, dtype=torch.bfloat16)
    >>> cos = torch.ones(64, 32); sin = torch.zeros(64, 32)
    >>> x, s = fusedrope.inverse_rope_group_quant(o, torch.arange(4), cos, sin, 2, backend="reference")
    >>> x.shape, s.shape, s.dtype
    (torch.Size([4, 2, 4096]), torch.Size([4, 2, 32]), torch.float8_e8m0fnu)
    """
    if torch.compiler.is_compiling():
        if x_fp8 is not None and x_scale is not None:
            torch.ops.fusedrope.inverse_rope_group_quant_out(o, positions, cos_cache, sin_cache, num_groups,
                                                             quant_group_size, transpose_scale, x_fp8, x_scale,
                                                             backend)
            return x_fp8, x_scale
        if x_fp8 is not None or x_scale is not None:
            raise ValueError(f"{OP}: under torch.compile pass both x_fp8 and x_scale, or neither")
        return torch.ops.fusedrope.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups,
                                                            quant_group_size, transpose_scale, fp8_dtype,
                                                            scale_dtype, backend)
    return _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
                x_scale, fp8_dtype, scale_dtype, backend)


def explain_args(o, positions, cos_cache, sin_cache, num_groups, quant_group_size=128, transpose_scale=False,
                 x_fp8=None, x_scale=None, *, fp8_dtype=None, scale_dtype=None, backend="auto"):
    facts = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
                     x_scale, fp8_dtype, scale_dtype)[0]
    return facts, backend


# -- torch ops ------------------------------------------------------------------------------------------
@torch.library.custom_op("fusedrope::inverse_rope_group_quant", mutates_args=())
def _op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
        num_groups: int, quant_group_size: int = 128, transpose_scale: bool = False,
        fp8_dtype: Optional[torch.dtype] = None, scale_dtype: Optional[torch.dtype] = None,
        backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    return _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, None, None,
                fp8_dtype, scale_dtype, backend)


@_op.register_fake
def _op_fake(o, positions, cos_cache, sin_cache, num_groups, quant_group_size=128, transpose_scale=False,
             fp8_dtype=None, scale_dtype=None, backend="auto"):
    _, fp8_dtype, scale_dtype = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                                         transpose_scale, None, None, fp8_dtype, scale_dtype)
    # The same strides as the real op (column-major scale included), or compiled callers read garbage.
    return empty_quant_outputs(o, num_groups, quant_group_size, transpose_scale, fp8_dtype=fp8_dtype,
                               scale_dtype=scale_dtype)


@torch.library.custom_op("fusedrope::inverse_rope_group_quant_out", mutates_args=("x_fp8", "x_scale"))
def _op_out(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
            num_groups: int, quant_group_size: int, transpose_scale: bool, x_fp8: torch.Tensor,
            x_scale: torch.Tensor, backend: str = "auto") -> None:
    _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8, x_scale,
         None, None, backend)


@_op_out.register_fake
def _op_out_fake(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
                 x_scale, backend="auto"):
    validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8, x_scale,
             None, None)
