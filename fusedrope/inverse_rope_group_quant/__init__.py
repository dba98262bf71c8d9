"""inverse_rope_group_quant: DeepSeek-V4's attention output -> inverse RoPE -> FP8 per-group quant with e8m0
scales, the wo_a GEMM input, in one pass. The public function, its validation (shared by every backend), its
backends and its torch ops; :mod:`.buffers` has the helpers for callers who allocate the outputs.

Backends: ``cuda`` (:mod:`.cuda`) and ``hip`` (:mod:`.hip`, opt-in), the hand-written kernels; ``triton``
(:mod:`.triton`); ``reference`` (:mod:`.reference`, plain PyTorch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
from torch.autograd.graph import increment_version

from .. import _validation as C, fast_checks
from .._device import cuda_toolkit_reason, hip_toolkit_reason, triton_available
from ..registry import Backend, getenv, new_registry
from . import reference
from .outputs import (FP8_DTYPES, OP, PACKED_UE8M0, QUANT_GROUP_SIZES, SCALE_FORMATS, SCALE_LAYOUTS, TILE_LAYOUTS,
                      allowed_scale_dtypes, buffer_scale_strides, check_format, empty_outputs, group_widths,
                      resolve_dtypes, resolve_layout, rows_apart, scale_strides, shapes)

__all__ = ["inverse_rope_group_quant", "validate", "REGISTRY", "Facts", "QuantModes", "scale_strides",
           "buffer_scale_strides"]
O_DTYPES = (torch.bfloat16, torch.float16)
CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
POSITION_DTYPES = (torch.int64, torch.int32)
_Tensor = torch.Tensor


class Facts(NamedTuple):
    """What choosing a backend may depend on (``supports(facts)``)."""

    device: torch.device
    o_dtype: torch.dtype
    head_dim: int
    rope_dim: int
    quant_group_size: int
    cache_dtype: torch.dtype
    positions_dtype: torch.dtype
    fp8_dtype: torch.dtype  # the output's dtype: o's without quantization
    scale_dtype: Optional[torch.dtype]  # None without quantization
    scale_layout: str  # "row", "col", "mfma_tile" or "n32k4"
    quantize: bool
    x_contiguous: bool  # the output row-major contiguous (else rows of Dg apart, e.g. group-major)
    pdl: bool  # enable_pdl: a launch hint compiled kernels may take
    scale_pad: bool = False  # a "col" x_scale with token rows past o's (TMA padding), written as zeros
    scale_format: str = "ue8m0"  # "ue8m0" (powers of two) or "fp32" (plain amax / FP8_MAX)


@dataclass(frozen=True)
class QuantModes:
    """What a call asks beyond the defaults, one named field per keyword argument of the public function (the
    positional ones stay arguments). :class:`Facts` derives from it, resolved: the dtypes, and ``scale_layout``
    from ``transpose_scale``."""

    fp8_dtype: Optional[torch.dtype] = None
    scale_dtype: Optional[torch.dtype] = None
    scale_layout: Optional[str] = None
    quantize: bool = True
    enable_pdl: Optional[bool] = None
    scale_format: str = "ue8m0"


PLAIN = QuantModes()


def describe(fp8_dtype=None, scale_dtype=None, scale_layout=None, quantize=True, enable_pdl=None,
             scale_format="ue8m0") -> QuantModes:
    """The one normaliser of a call's keyword arguments: the shared :data:`PLAIN` for the defaults (building a
    frozen dataclass costs about 1.5 us), else their :class:`QuantModes`."""
    if fp8_dtype is None and scale_dtype is None and scale_layout is None and quantize is True and enable_pdl is None \
            and scale_format is PLAIN.scale_format:
        return PLAIN
    return QuantModes(fp8_dtype, scale_dtype, scale_layout, quantize, enable_pdl, scale_format)


def _user_protocol(run, supports):
    """register_backend's backends keep their seven-argument run: they serve row-major x and row / col e8m0
    scales."""
    def user_supports(facts):
        if facts.scale_layout in TILE_LAYOUTS or not facts.quantize or not facts.x_contiguous or facts.scale_pad \
                or facts.scale_format != "ue8m0":
            return "a registered backend writes row-major x_fp8 and row- or column-major ue8m0 scales of o's tokens"
        return supports(facts)
    return (lambda *args, scale_layout="row", pdl=False, scale_format="ue8m0": run(*args)), user_supports


REGISTRY = new_registry(OP, Facts, _user_protocol)


def _load_triton():  # Triton is optional: its kernel module is imported when the backend is first chosen
    from . import triton

    return triton.inverse_rope_group_quant, None


def _cuda():  # the compiled kernels' glue, imported once a GPU is seen
    from . import cuda

    return cuda


def _hip():
    from . import hip

    return hip


REGISTRY.register(Backend("cuda", supports=lambda facts: _cuda().supports(facts), load=lambda: _cuda().load(),
                          available=lambda device: cuda_toolkit_reason(device) or _cuda().available(device)))
REGISTRY.register(Backend("cuda_head", supports=lambda facts: _cuda().head_supports(facts),
                          load=lambda: _cuda().load(kernel=1),
                          available=lambda device: cuda_toolkit_reason(device) or _cuda().available(device),
                          opt_in=lambda facts: _cuda().head_opt_in(facts)))
REGISTRY.register(Backend("hip", supports=lambda facts: _hip().supports(facts), load=lambda: _hip().load(),
                          available=lambda device: hip_toolkit_reason(device) or _hip().available(device),
                          opt_in=lambda facts: "never run on AMD hardware (docs/kernels_hip.md: what decides it)"))
REGISTRY.register(Backend("triton", available=triton_available, load=_load_triton))
REGISTRY.register(Backend("reference", reference.inverse_rope_group_quant))


def _outputs(o, num_groups, quant_group_size, layout, fp8_dtype, scale_dtype, quantize, x_fp8, x_scale) -> tuple:
    """The caller's buffers, with the one(s) left out (None) newly allocated."""
    if x_fp8 is None or (x_scale is None and quantize):
        new_x, new_scale = empty_outputs(o, num_groups, quant_group_size, layout, fp8_dtype, scale_dtype, quantize)
        x_fp8 = new_x if x_fp8 is None else x_fp8
        x_scale = new_scale if x_scale is None else x_scale
    return x_fp8, x_scale


def validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8=None,
             x_scale=None, modes: QuantModes = PLAIN, traced=False) -> tuple:
    """Check every argument; return ``(key, x dtype, scale dtype)``; ``key``, the call's :class:`Facts`, keys
    backend selection.

    The hot path is one boolean expression over the usual call (no output buffers, or buffers laid out as the op
    writes them); anything else, bad input included, takes :func:`_validate_all`, which accepts a superset and
    raises the precise message. ``traced``: Dynamo traces this call (whose tensors have no memory to read)."""
    fp8_dtype, scale_dtype, scale_layout, quantize, enable_pdl, scale_format = (
        modes.fp8_dtype, modes.scale_dtype, modes.scale_layout, modes.quantize, modes.enable_pdl, modes.scale_format)
    try:
        S, H, D = o.shape
        max_pos, half = cos_cache.shape
        dev, row = o.device, H * D
        layout = scale_layout or ("col" if transpose_scale is True else "row")
        ok = (
            type(o) is _Tensor and type(positions) is _Tensor and type(cos_cache) is _Tensor
            and type(sin_cache) is _Tensor
            and type(num_groups) is int and type(quant_group_size) is int and num_groups > 0
            and (transpose_scale is False or (transpose_scale is True and scale_layout is None))
            and (scale_layout is None or (scale_layout in SCALE_LAYOUTS and quantize is True))
            and (quantize is True or (quantize is False and transpose_scale is False))
            and (enable_pdl is None or type(enable_pdl) is bool)
            and (scale_format is PLAIN.scale_format
                 or (type(scale_format) is str and scale_format in SCALE_FORMATS
                     and (scale_format == "ue8m0" or (quantize is True and layout not in TILE_LAYOUTS))))
            and row % num_groups == 0 and quant_group_size in QUANT_GROUP_SIZES
            and (row // num_groups) % quant_group_size == 0
            and o.dtype in O_DTYPES and D % 2 == 0 and o.is_contiguous()
            and positions.dtype in POSITION_DTYPES and positions.dim() == 1 and positions.shape[0] >= S
            and positions.layout is torch.strided  # a sparse tensor has a dtype, a dim and a shape, no strides
            and cos_cache.dtype in CACHE_DTYPES and sin_cache.dtype is cos_cache.dtype
            and sin_cache.shape == cos_cache.shape and cos_cache.stride(1) == 1 and sin_cache.stride(1) == 1
            and max_pos >= 1 and half >= 1 and 2 * half <= D and cos_cache is not sin_cache
            and positions.device == dev and cos_cache.device == dev and sin_cache.device == dev
            and (traced or fast_checks.checks.readable(o, positions, cos_cache, sin_cache, x_fp8, x_scale))
        )
        if ok and quantize:
            allowed = allowed_scale_dtypes(layout, scale_format)
            fp8_t = fp8_dtype or (torch.float8_e4m3fn if x_fp8 is None else x_fp8.dtype)
            scale_t = scale_dtype or (allowed[0] if x_scale is None else x_scale.dtype)
            ks = row // num_groups // quant_group_size
            ok = (not (scale_t is PACKED_UE8M0 and ks % 4) and fp8_t in FP8_DTYPES and scale_t in allowed
                  and (layout != "n32k4" or (quant_group_size == 32 and ks % 4 == 0)))
        elif ok:
            fp8_t, scale_t = o.dtype, None
            ok = fp8_dtype is None and scale_dtype is None and x_scale is None
        x_contiguous = True
        if ok and (x_fp8 is not None or x_scale is not None):
            x_shape, sc_shape = shapes(S, num_groups, row // num_groups, row // num_groups // quant_group_size,
                                       scale_t, layout, quantize, quant_group_size)
            x_contiguous = x_fp8 is not None and x_fp8.is_contiguous()
            ok = (x_fp8 is not None and type(x_fp8) is _Tensor and x_fp8.dtype is fp8_t and x_fp8.shape == x_shape
                  and (x_contiguous or rows_apart(x_shape, x_fp8.stride())) and x_fp8.device == dev
                  and (not quantize or (x_scale is not None and type(x_scale) is _Tensor and x_scale.dtype is scale_t
                                        and (x_scale.shape == sc_shape or (layout == "col" and 0 < S < x_scale.shape[0]
                                                                           and x_scale.shape[1:] == sc_shape[1:]))
                                        and x_scale.device == dev
                                        and buffer_scale_strides(x_scale, layout, scale_t) is not None)))
    except (AttributeError, TypeError, ValueError, IndexError, RuntimeError):
        ok = False
    if not ok:
        return _validate_all(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale,
                             x_fp8, x_scale, modes, traced)
    key = Facts(dev, o.dtype, D, 2 * half, quant_group_size, cos_cache.dtype, positions.dtype, fp8_t, scale_t, layout,
                quantize, x_contiguous, enable_pdl is True,
                layout == "col" and x_scale is not None and 0 < S < len(x_scale), scale_format)
    return key, fp8_t, scale_t


def _validate_all(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8=None,
                  x_scale=None, modes: QuantModes = PLAIN, traced=False) -> tuple:
    """Every check, one at a time, each with its message (:func:`validate`'s slow path)."""
    fp8_dtype, scale_dtype, scale_layout, quantize, enable_pdl, scale_format = (
        modes.fp8_dtype, modes.scale_dtype, modes.scale_layout, modes.quantize, modes.enable_pdl, modes.scale_format)
    C.check_tensor(OP, "o", o, 3, "[S, H, head_dim]")
    layout = resolve_layout(transpose_scale, scale_layout, quantize)
    check_format(scale_format, layout, quantize)
    if enable_pdl is not None:
        C.check_bool(OP, "enable_pdl", enable_pdl)
    C.check_dtype(OP, "o", o, O_DTYPES)
    if not o.is_contiguous():
        C.fail(OP, "o", "a contiguous tensor", f"strides {tuple(o.stride())} for shape {C.shape_str(o.shape)}")
    S, H, D = o.shape
    if D % 2:
        C.fail(OP, "o", "an even head_dim (last dim), so that rope pairs never straddle a head or a quant block",
               f"head_dim={D}")
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
    fp8_dtype, scale_dtype = resolve_dtypes(x_fp8, x_scale, fp8_dtype, scale_dtype, layout, quantize, o.dtype,
                                            scale_format=scale_format)
    dg, ks = group_widths(H * D, num_groups, quant_group_size, scale_dtype, layout=layout)
    x_shape, sc_shape = shapes(S, num_groups, dg, ks, scale_dtype, layout, quantize, quant_group_size)
    if x_fp8 is not None:
        C.check_tensor(OP, "x_fp8", x_fp8)
        C.check_shape(OP, "x_fp8", x_fp8, x_shape)
        _check_buffer_dtype("x_fp8", x_fp8, fp8_dtype, "as fp8_dtype says" if quantize else "o's, as quantize=False")
        if not rows_apart(x_shape, x_fp8.stride()):
            C.fail(OP, "x_fp8", f"rows of Dg={dg} contiguous and apart (row-major, group-major (Dg, S*Dg, 1), or "
                   "padded rows)", f"strides {tuple(x_fp8.stride())}")
        C.check_same_device(OP, "o", o, {"x_fp8": x_fp8})
    if x_scale is not None:
        C.check_tensor(OP, "x_scale", x_scale)
        pad = layout == "col" and x_scale.dim() == 3 and 0 < S < x_scale.shape[0]  # TMA padding rows, zeroed
        C.check_shape(OP, "x_scale", x_scale, sc_shape := (x_scale.shape[0], *sc_shape[1:]) if pad else sc_shape)
        _check_buffer_dtype("x_scale", x_scale, scale_dtype, "as scale_dtype says")
        if buffer_scale_strides(x_scale, layout, scale_dtype) is None:
            want = scale_strides(sc_shape, layout, scale_dtype)
            about = (f"column-major strides (1, {sc_shape[2]}*L, L) with L >= {'S_pad' if pad else 'S'}={sc_shape[0]}"
                     f" (empty_quant_outputs gives {want})" if layout == "col" else f"contiguous strides {want}")
            what = f"transpose_scale={layout == 'col'}" if scale_layout is None else f"scale_layout={layout!r}"
            C.fail(OP, "x_scale", f"{about} for {what}", f"strides {tuple(x_scale.stride())}")
        C.check_same_device(OP, "o", o, {"x_scale": x_scale})
    if not traced:
        C.check_readable(OP, {"o": o, "positions": positions, "cos_cache": cos_cache, "sin_cache": sin_cache,
                              "x_fp8": x_fp8, "x_scale": x_scale})
    key = Facts(o.device, o.dtype, D, 2 * half, quant_group_size, cos_cache.dtype, positions.dtype, fp8_dtype,
                scale_dtype, layout, quantize, x_fp8 is None or x_fp8.is_contiguous(), enable_pdl is True,
                x_scale is not None and pad, scale_format)
    return key, fp8_dtype, scale_dtype


def _refuse_one_cache(cos_cache, sin_cache) -> None:
    """The likeliest mistake: a whole [max_pos, rope_dim] cos||sin cache passed as both, read as a rope_dim twice
    as wide (rotating the wrong dims, silently). Exact, in a few integer operations for rows of one stride (views
    of one cache, shifted rows, the same tensor); :func:`C.shares_memory` else."""
    if C.has_no_data(cos_cache):
        return
    max_pos, half = cos_cache.shape
    size = cos_cache.element_size()
    gap, st, row = sin_cache.data_ptr() - cos_cache.data_ptr(), cos_cache.stride(0) * size, half * size
    if max_pos == 1 or (st == sin_cache.stride(0) * size and st >= row):
        # row j of sin meets row i of cos iff |gap - (i - j) * st| < row, for some |i - j| < max_pos
        k = gap // st if max_pos > 1 else 0
        overlap = any(abs(gap - i * st) < row for i in (k, k + 1) if -max_pos < i < max_pos)
    else:
        overlap = C.shares_memory(cos_cache, sin_cache)
    if overlap:
        C.fail(OP, "sin_cache", "memory apart from 'cos_cache' (a cos||sin cache [max_pos, rope_dim] splits into "
               "cache[:, :rope_dim//2] and cache[:, rope_dim//2:])", "a tensor sharing elements with 'cos_cache'")


def _check_buffer_dtype(name: str, buffer: torch.Tensor, dtype: torch.dtype, why: str) -> None:
    """A buffer of another dtype than resolved (``why``: where that dtype came from)."""
    if buffer.dtype != dtype:
        C.fail(OP, name, f"dtype {C.dtype_name(dtype)} ({why})", C.dtype_name(buffer.dtype), TypeError)


def _check_positions(o, positions, cos_cache) -> None:
    if getenv(C.ENV_CHECK_POSITIONS).lower() not in C.SWITCH_OFF:  # the debug switch
        C.check_positions_on_host(OP, positions[:o.shape[0]], cos_cache.shape[0])


def _check_call(o, positions, cos_cache, sin_cache, x_fp8, x_scale) -> dict:
    """What the call checks beyond :func:`validate` (explain does too): the positions debug switch, and that the
    caller's buffers (None when not given) are writable here and apart from the inputs; returns those buffers."""
    _check_positions(o, positions, cos_cache)
    _refuse_one_cache(cos_cache, sin_cache)
    mine = {n: t for n, t in (("x_fp8", x_fp8), ("x_scale", x_scale)) if t is not None}
    if mine and o.numel():
        C.check_writable_here(OP, mine)
        C.check_apart(OP, mine, {"o": o, "positions": positions, "cos_cache": cos_cache,
                                 "sin_cache": sin_cache})
    return mine


def _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8, x_scale,
         backend, modes: QuantModes = PLAIN):
    key, fp8_dtype, scale_dtype = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                                           transpose_scale, x_fp8, x_scale, modes)
    layout, quantize = key.scale_layout, key.quantize
    impl = REGISTRY.select(key, backend)
    mine = _check_call(o, positions, cos_cache, sin_cache, x_fp8, x_scale)  # the caller's buffers, checked
    x_fp8, x_scale = _outputs(o, num_groups, quant_group_size, layout, fp8_dtype, scale_dtype, quantize, x_fp8,
                              x_scale)
    if o.numel():
        # A caller's scale buffer may carry any stride on a size-1 dim (e.g. Ks == 1); the backends get the
        # view with the strides of buffer_scale_strides, which addresses the same elements.
        scale_out = x_scale if quantize else None
        if "x_scale" in mine:
            want = buffer_scale_strides(x_scale, layout, scale_dtype)
            scale_out = x_scale if x_scale.stride() == want else x_scale.as_strided(x_scale.shape, want)
        impl.run(o, positions, cos_cache, sin_cache, x_fp8, scale_out, quant_group_size, scale_layout=layout,
                 pdl=key.pdl, scale_format=key.scale_format)
        if mine:  # written through raw pointers: tell autograd the caller's buffers changed
            increment_version(tuple(mine.values()))
    if x_scale is None:  # quantize=False into the caller's x
        x_scale = torch.empty(0, dtype=torch.float8_e8m0fnu, device=o.device)
    return x_fp8, x_scale


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size=128,
                             transpose_scale=False, x_fp8=None, x_scale=None, *, fp8_dtype=None,
                             scale_dtype=None, scale_layout=None, quantize=True, enable_pdl=None, scale_format="ue8m0",
                             backend="auto"):
    """Inverse RoPE on the attention output fused with FP8 per-group quant with power-of-two scales.

    Per token ``s`` (fp32 throughout): the last ``rope_dim = 2 * cos_cache.size(1)`` dims of every head are
    rotated back (GPT-J pairs ``(e, d) = (x[2j], x[2j+1])``, ``p = clamp(positions[s], 0, max_pos - 1)``,
    ``e' = e*c + d*n``, ``d' = d*c - e*n`` with ``c, n = cos_cache[p, j], sin_cache[p, j]``); then each block
    of ``quant_group_size`` consecutive elements of a group row gets ``scale = 2^ceil(log2(amax / FP8_MAX))``
    (``amax >= 1e-8``, stored as its e8m0 byte) and ``x_fp8 = fp8_rne(clamp(v / scale, -FP8_MAX, FP8_MAX))``.
    A block holding NaN or Inf gets scale byte 0xFF and NaN fp8 values; no other block is affected.
    ``scale_format="fp32"`` writes plain scales instead (below).

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
        :func:`empty_quant_outputs` to allocate them. ``x_fp8``'s rows of ``Dg`` are contiguous; its token and
        group strides are free, e.g. group-major ``[S, G, Dg]`` over ``[G, S, Dg]`` storage (strides ``(Dg,
        S*Dg, 1)``, what vLLM's fp8 einsum reads). A column-major ``x_scale`` may pad its token dim (strides
        ``(1, Ks*L, L)``, any ``L >= S``: a max-size buffer sliced to this call's tokens), and may have more token
        rows than a non-empty ``o`` (``[S_pad, G, Ks]``, vLLM's padding to a multiple of 4): those get zeros.
    fp8_dtype : torch.dtype, optional
        ``torch.float8_e4m3fn`` (FP8_MAX 448, default; NVIDIA, gfx950) or ``torch.float8_e4m3fnuz`` (240, gfx942).
    scale_dtype : torch.dtype, optional
        ``torch.float8_e8m0fnu`` (default), ``torch.uint8`` (same bytes), ``torch.float32`` (2^k as fp32) or
        ``torch.int32``: DeepGEMM's packed UE8M0, ``[S, G, Ks/4]``, byte ``i`` of ``[s, g, j]`` holding block
        ``4j+i``; with ``transpose_scale=True`` its storage is ``[G, Ks/4, align(S, 4)]`` (TMA-aligned MN-major,
        ``x_scale.permute(1, 0, 2)`` is what DeepGEMM's ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` gives).
    scale_layout : {"row", "col", "mfma_tile", "n32k4"}, optional
        Instead of ``transpose_scale`` (``"col"`` is ``transpose_scale=True``). ``"mfma_tile"``: the e8m0
        ``[G, S_pad, Ks_pad]`` tiles gfx950's scaled MFMA GEMM reads (S padded to 32, Ks to 2 for group 128,
        else 8; scale ``[s, g, k]`` where :func:`fusedrope.reference.mfma_tile_offsets` says). ``"n32k4"``:
        aiter's gfx1250 WMMA layout ``[ceil(S/32), G, Ks*32]``, quant group 32 and ``Ks`` a multiple of 4 (scale
        ``[s, g, k]`` at ``[s//32, g, (k//4)*128 + (s%32)*4 + k%4]``, :func:`fusedrope.reference.n32k4_offsets`).
        The padding bytes of both are left as they were.
    quantize : bool, default True
        False: no quantization; ``x_fp8`` receives the inverse-rotated values in o's dtype (rounded once), and
        the scales returned are an empty tensor.
    enable_pdl : bool, optional
        A programmatic dependent launch of the CUDA kernel (sm_90+), which may start while the stream's previous
        kernel finishes. None (the default) is off (kernels_cuda/README.md says what would turn it on);
        other backends ignore it.
    scale_format : {"ue8m0", "fp32"}, default "ue8m0"
        ``"fp32"``: plain fp32 scales, TensorRT-LLM's: with ``a = max(amax, 1e-12)``, ``scale = a *
        fp32(1/FP8_MAX)`` and ``x_fp8 = fp8_rne(clamp(v * (FP8_MAX / a), -FP8_MAX, FP8_MAX))``, the division
        correctly rounded (TensorRT-LLM's ``__fdividef`` may differ in the last bit). Row or column layout, fp32
        ``x_scale``; padding rows of a column-major buffer get 0.0; a block holding NaN or Inf gets scale NaN.
    backend : str, default "auto"
        ``"auto"``, ``"cuda"``, ``"hip"`` (opt-in: ``auto`` passes over it), ``"triton"``, ``"reference"`` or
        one of yours (:func:`fusedrope.register_backend`). ``auto`` honours ``FUSEDROPE_BACKEND``.

    Returns
    -------
    (x_fp8, x_scale) : tuple of torch.Tensor
        ``[S, G, Dg]`` fp8 and ``[S, G, Dg / quant_group_size]`` scales (``[G, S_pad, Ks_pad]`` for
        ``"mfma_tile"``; empty without quantization).

    Raises
    ------
    ValueError, TypeError
        Bad shapes, strides, dtypes, devices or group arguments, a ``transpose_scale`` that is not a bool, a
        tensor whose memory does not hold its values (a negative view, a ZeroTensor, a ``torch.func`` wrapper),
        and with ``FUSEDROPE_CHECK_POSITIONS=1`` out-of-range positions; the message names the argument.
    fusedrope.BackendUnavailableError
        An explicitly requested backend cannot run these inputs.
    RuntimeError
        Output buffers that are inference tensors, outside ``torch.inference_mode()``; a forward-mode AD dual
        tensor (its tangent would be lost).

    Examples
    --------
    >>> import torch, fusedrope
    >>> o = torch.randn(4, 16, 512, dtype=torch.bfloat16)
    >>> cos = torch.ones(64, 32); sin = torch.zeros(64, 32)
    >>> x, s = fusedrope.inverse_rope_group_quant(o, torch.arange(4), cos, sin, 2, backend="reference")
    >>> x.shape, s.shape, s.dtype
    (torch.Size([4, 2, 4096]), torch.Size([4, 2, 32]), torch.float8_e8m0fnu)
    """
    compiling = torch.compiler.is_compiling()
    if x_fp8 is None and x_scale is None and fp8_dtype is None and scale_dtype is None and scale_layout is None \
            and quantize is True and enable_pdl is None and scale_format is PLAIN.scale_format \
            and not compiling:  # a plain call: compiled checks, if built
        fast = fast_checks.checks.inverse_rope_group_quant(Facts, o, positions, cos_cache, sin_cache, num_groups,
                                                           quant_group_size, transpose_scale)
        if fast is not None:  # valid, work to do, no grad to keep; the caches apart; the outputs new
            key, x_fp8, x_scale = fast
            impl = REGISTRY.select(key, backend)
            _check_positions(o, positions, cos_cache)
            impl.run(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size,
                     scale_layout=key.scale_layout, pdl=False, scale_format="ue8m0")
            return x_fp8, x_scale
    modes = describe(fp8_dtype, scale_dtype, scale_layout, quantize, enable_pdl, scale_format)
    grad = C.needs_grad(o, cos_cache, sin_cache)
    buffers = x_fp8 is not None or x_scale is not None
    if not compiling:
        if grad and buffers:
            with torch.no_grad():  # quantised bytes written into buffers: no autograd history, on any backend
                return _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale,
                            x_fp8, x_scale, backend, modes)
        out = _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
                   x_scale, backend, modes)
        return C.NoDerivative.apply(OP, *out, o, cos_cache, sin_cache) if grad else out
    # Traced: the torch op, into outputs allocated here. The errors and messages eager gives come first, before
    # torch's schema check (which would refuse a non-int group argument with its own message).
    key, fp8_dtype, scale_dtype = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                                           transpose_scale, x_fp8, x_scale, modes, True)
    if grad and not buffers:  # eager's C.NoDerivative, which Dynamo cannot trace: refused when traced
        C.refuse_grad(OP, "torch.compile of this op has", {"o": o, "cos_cache": cos_cache, "sin_cache": sin_cache},
                      "detach the inputs")
    # a new e8m0 scale as its uint8 bytes: inductor has no e8m0 code generation for a tensor an op mutates
    as_e8m0 = x_scale is None and scale_dtype == torch.float8_e8m0fnu
    x_fp8, x_scale = _outputs(o, num_groups, quant_group_size, key.scale_layout, fp8_dtype,
                              torch.uint8 if as_e8m0 else scale_dtype, quantize, x_fp8, x_scale)
    no_scale = x_scale is None  # quantize=False: the schema wants a tensor
    torch.ops.fusedrope.inverse_rope_group_quant_out(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                                                     transpose_scale, x_fp8,
                                                     o.new_empty(0, dtype=torch.uint8) if no_scale else x_scale,
                                                     backend, scale_layout, quantize, enable_pdl, scale_format)
    if no_scale:
        return x_fp8, o.new_empty(0, dtype=torch.float8_e8m0fnu)
    return x_fp8, x_scale.view(torch.float8_e8m0fnu) if as_e8m0 else x_scale


def explain_args(o, positions, cos_cache, sin_cache, num_groups, quant_group_size=128, transpose_scale=False,
                 x_fp8=None, x_scale=None, *, fp8_dtype=None, scale_dtype=None, scale_layout=None, quantize=True,
                 enable_pdl=None, scale_format="ue8m0", backend="auto"):
    key = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
                   x_scale, describe(fp8_dtype, scale_dtype, scale_layout, quantize, enable_pdl, scale_format))[0]
    _check_call(o, positions, cos_cache, sin_cache, x_fp8, x_scale)  # explain raises what the call would
    return key, backend


# -- the torch op: writes into the outputs it is given -----------------------------------------------------------
@torch.library.custom_op("fusedrope::inverse_rope_group_quant_out", mutates_args=("x_fp8", "x_scale"))
def _op_out(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
            num_groups: int, quant_group_size: int, transpose_scale: bool, x_fp8: torch.Tensor,
            x_scale: torch.Tensor, backend: str = "auto", scale_layout: Optional[str] = None, quantize: bool = True,
            enable_pdl: Optional[bool] = None, scale_format: str = "ue8m0") -> None:
    for name, t in (("x_fp8", x_fp8), ("x_scale", x_scale)):
        C.check_tensor(OP, name, t)  # the schema says Tensor, but Python passes None through
    modes = describe(None, None, scale_layout, quantize, enable_pdl, scale_format)  # the dtypes: the buffers'
    _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
         x_scale if quantize is not False else None, backend, modes)


@_op_out.register_fake
def _op_out_fake(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
                 x_scale, backend="auto", scale_layout=None, quantize=True, enable_pdl=None, scale_format="ue8m0"):
    validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
             x_scale if quantize is not False else None,
             describe(None, None, scale_layout, quantize, enable_pdl, scale_format))
