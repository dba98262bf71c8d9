"""The outputs of inverse_rope_group_quant: their dtypes, shapes, scale formats (``scale_format`` "ue8m0",
"fp32") and layouts (``scale_layout`` "row", "col", "mfma_tile", "n32k4"), their allocation, and which caller
buffers the kernels can address."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _validation as C
from .reference import mfma_tile_shape, n32k4_shape

OP = "inverse_rope_group_quant"
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# e8m0 bytes, the same bytes as uint8, the same powers of two as fp32, or DeepGEMM's packed UE8M0 (int32).
SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8, torch.float32, torch.int32)
PACKED_UE8M0 = torch.int32
QUANT_GROUP_SIZES = (32, 64, 128, 256)
SCALE_LAYOUTS = ("row", "col", "mfma_tile", "n32k4")
TILE_LAYOUTS = ("mfma_tile", "n32k4")  # a GEMM's own tiling of e8m0 bytes, padding left as it was
TILE_SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8)
SCALE_FORMATS = ("ue8m0", "fp32")  # power-of-two scales; plain amax / FP8_MAX (TensorRT-LLM's)


def is_int(v) -> bool:
    """An int, or a SymInt under torch.compile; not a bool, float or numpy scalar."""
    return isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool)


def _bad_int(op: str, arg: str, expected: str, v) -> None:
    """ValueError for an int out of range; TypeError, naming its type, for anything else (np.int64 looks like 2)."""
    if is_int(v):
        C.fail(op, arg, expected, repr(v))
    C.fail(op, arg, expected, f"{v!r} of type {type(v).__name__}", TypeError)


def group_widths(row: int, num_groups, quant_group_size, scale_dtype=None, op: str = OP,
                 layout: str = "row") -> tuple[int, int]:
    """``(Dg, Ks)`` for a token row of ``row = H*head_dim`` elements, after checking the group arguments (and
    what ``layout`` needs of them)."""
    if not is_int(num_groups) or num_groups < 1 or row % num_groups:
        _bad_int(op, "num_groups", f"a positive int dividing H*head_dim={row}", num_groups)
    if not is_int(quant_group_size) or quant_group_size not in QUANT_GROUP_SIZES:
        _bad_int(op, "quant_group_size", f"one of {QUANT_GROUP_SIZES}", quant_group_size)
    dg = row // num_groups
    if dg % quant_group_size:
        C.fail(op, "quant_group_size", f"a divisor of the group width Dg=H*head_dim/num_groups={dg}",
               quant_group_size)
    ks = dg // quant_group_size
    if scale_dtype == PACKED_UE8M0 and ks % 4:
        C.fail(op, "scale_dtype", "int32 (packed UE8M0) only when the blocks per group "
               "Dg/quant_group_size are a multiple of 4", f"{dg}/{quant_group_size}={ks}")
    if layout == "n32k4" and (quant_group_size != 32 or ks % 4):
        arg, got = ("quant_group_size", quant_group_size) if quant_group_size != 32 else ("num_groups", num_groups)
        C.fail(op, arg, "quant_group_size=32 and blocks per group Dg/32 a multiple of 4 for scale_layout='n32k4' "
               "(a lane of the WMMA reads the 4 scales of one K=128 step)", f"{got} (Dg={dg}, Ks={ks})")
    return dg, ks


def resolve_layout(transpose_scale, scale_layout, quantize, op: str = OP) -> str:
    """The scale layout a call asks for: ``scale_layout``, else ``"col"`` or ``"row"`` by ``transpose_scale``."""
    C.check_bool(op, "transpose_scale", transpose_scale)
    C.check_bool(op, "quantize", quantize)
    if not quantize and transpose_scale:
        C.fail(op, "transpose_scale", "False with quantize=False (there are no scales)", "True")
    if scale_layout is None:
        return "col" if transpose_scale else "row"
    if not isinstance(scale_layout, str) or scale_layout not in SCALE_LAYOUTS:
        C.fail(op, "scale_layout", f"None or one of {SCALE_LAYOUTS}", repr(scale_layout))
    if transpose_scale and scale_layout != "col":
        C.fail(op, "transpose_scale", f"False with scale_layout={scale_layout!r} (True means scale_layout='col')",
               "True")
    if not quantize:
        C.fail(op, "scale_layout", "None with quantize=False (there are no scales)", repr(scale_layout))
    return scale_layout


def check_format(scale_format, layout: str, quantize: bool, op: str = OP) -> None:
    """``scale_format`` one of :data:`SCALE_FORMATS`; "fp32" only for row- or column-major scales."""
    if not isinstance(scale_format, str) or scale_format not in SCALE_FORMATS:
        C.fail(op, "scale_format", f"one of {SCALE_FORMATS}", repr(scale_format))
    if scale_format == "fp32" and not quantize:
        C.fail(op, "scale_format", "'ue8m0' with quantize=False (there are no scales)", repr(scale_format))
    if scale_format == "fp32" and layout in TILE_LAYOUTS:
        C.fail(op, "scale_format", f"'ue8m0' with scale_layout={layout!r} (its tiles hold e8m0 bytes)",
               repr(scale_format))


def allowed_scale_dtypes(layout: str, scale_format: str = "ue8m0") -> tuple:
    """The scale dtypes a call may ask for; the first is the default."""
    if scale_format == "fp32":
        return (torch.float32,)
    return TILE_SCALE_DTYPES if layout in TILE_LAYOUTS else SCALE_DTYPES


def _resolve_dtype(arg: str, dtype, buffer_arg: str, buffer, default, allowed, op: str) -> torch.dtype:
    """``dtype``, else the buffer's, else ``default``; checked, naming the argument it came from."""
    if dtype is None and isinstance(buffer, torch.Tensor):
        arg, dtype = buffer_arg, buffer.dtype
    dtype = default if dtype is None else dtype
    if dtype not in allowed:
        names = " or ".join(map(C.dtype_name, allowed))
        if arg == buffer_arg:
            C.fail(op, arg, f"dtype {names}", C.dtype_name(dtype), TypeError)
        C.fail(op, arg, names, str(dtype) if isinstance(dtype, torch.dtype) else repr(dtype), TypeError)
    return dtype


def resolve_dtypes(x_fp8, x_scale, fp8_dtype, scale_dtype, layout: str = "row", quantize: bool = True,
                   o_dtype=None, op: str = OP, scale_format: str = "ue8m0") -> tuple:
    """The output's and the scales' dtypes: the arguments, else the buffers', else the defaults. Without
    quantization the output has o's dtype and there are no scales (the dtype arguments must be None)."""
    if not quantize:
        for arg, v in (("fp8_dtype", fp8_dtype), ("scale_dtype", scale_dtype), ("x_scale", x_scale)):
            if v is not None:
                C.fail(op, arg, "None with quantize=False (the output has o's dtype, and there are no scales)",
                       "a tensor" if isinstance(v, torch.Tensor) else str(v))
        return o_dtype, None
    allowed = allowed_scale_dtypes(layout, scale_format)
    return (_resolve_dtype("fp8_dtype", fp8_dtype, "x_fp8", x_fp8, torch.float8_e4m3fn, FP8_DTYPES, op),
            _resolve_dtype("scale_dtype", scale_dtype, "x_scale", x_scale, allowed[0], allowed, op))


def shapes(S, G, dg, ks, scale_dtype, layout: str = "row", quantize: bool = True, quant_group_size: int = 128):
    """``(x shape, x_scale shape)``; the scales are ``(0,)`` without quantization."""
    if not quantize:
        return (S, G, dg), (0,)
    if layout == "mfma_tile":
        return (S, G, dg), mfma_tile_shape(S, G, ks, quant_group_size)
    if layout == "n32k4":
        return (S, G, dg), n32k4_shape(S, G, ks)
    return (S, G, dg), (S, G, ks // 4 if scale_dtype == PACKED_UE8M0 else ks)


def scale_strides(shape: tuple, layout: str, scale_dtype: Optional[torch.dtype] = None) -> tuple:
    """The strides of a new scale tensor of ``shape`` in ``layout``: "col" is storage ``[G, Ks, S]`` seen as
    ``[S, G, Ks]``, S padded to a multiple of 4 for packed UE8M0 (DeepGEMM's TMA-aligned MN-major layout)."""
    if layout in TILE_LAYOUTS:  # contiguous
        return (shape[1] * shape[2], shape[2], 1)
    S, G, Ks = shape
    if layout == "row":
        return (G * Ks, Ks, 1)
    s_pad = -(-S // 4) * 4 if scale_dtype == PACKED_UE8M0 else S
    return (1, Ks * s_pad, s_pad)


def empty_outputs(o, num_groups, quant_group_size, layout, fp8_dtype, scale_dtype, quantize: bool = True) -> tuple:
    """New outputs for arguments already checked: ``x`` row-major ``[S, G, Dg]``, the scales in ``layout``."""
    S, H, D = o.shape
    dg = H * D // num_groups
    x_shape, sc_shape = shapes(S, num_groups, dg, dg // quant_group_size, scale_dtype, layout, quantize,
                               quant_group_size)
    # empty_strided: on the host, cheaper than torch.empty (this is the hot path)
    x = torch.empty_strided(x_shape, (x_shape[1] * x_shape[2], x_shape[2], 1),
                            dtype=fp8_dtype if quantize else o.dtype, device=o.device)
    if not quantize:
        return x, torch.empty(0, dtype=torch.float8_e8m0fnu, device=o.device)
    strides = scale_strides(sc_shape, layout, scale_dtype)
    if layout == "col" and strides[-1] > sc_shape[0]:
        # packed column-major: the whole [G, Ks/4, align(S, 4)] storage, padding tokens included, as DeepGEMM
        # allocates it (empty_strided would end the storage at the last token of the last column)
        x_scale = torch.empty((*sc_shape[1:], strides[-1]), dtype=scale_dtype, device=o.device)
        return x, x_scale.permute(2, 0, 1)[:sc_shape[0]]
    return x, torch.empty_strided(sc_shape, strides, dtype=scale_dtype, device=o.device)


def _same_layout(t: torch.Tensor, strides: tuple) -> bool:
    """The strides that address elements agree: those of size-1 dims and of empty tensors do not."""
    return t.numel() == 0 or all(n <= 1 or s == e for n, s, e in zip(t.shape, t.stride(), strides))


def buffer_scale_strides(x_scale: torch.Tensor, layout: str, scale_dtype: torch.dtype) -> Optional[tuple]:
    """The strides the kernels address a caller's scale buffer with, or None when the op does not write that
    layout: contiguous, or for "col" ``(1, Ks*L, L)`` with any ``L >= S`` (storage ``[G, Ks, L]``: a max-size
    buffer sliced to this call's tokens, TMA-aligned scales). Strides of size-1 dims address nothing."""
    default = scale_strides(tuple(x_scale.shape), layout, scale_dtype)
    st = x_scale.stride()
    if st == default:  # the layout empty_quant_outputs makes: the hot path
        return default
    if layout != "col" or x_scale.numel() == 0:
        return default if _same_layout(x_scale, default) else None
    S, G, Ks = x_scale.shape
    lead = st[2] if Ks > 1 else st[1] if G > 1 else default[2]
    want = (1, Ks * lead, lead)
    return want if lead >= S and _same_layout(x_scale, want) else None


def rows_apart(shape: tuple, strides: tuple) -> bool:
    """An ``[S, G, Dg]`` output whose rows of ``Dg`` are contiguous and share no element, whatever its token and
    group strides (row-major, group-major ``(Dg, S*Dg, 1)``, padded rows): the kernels write it row by row."""
    S, G, dg = shape
    if S * G * dg == 0:
        return True
    if dg > 1 and strides[2] != 1:
        return False
    dims = [(st, n) for st, n in ((strides[0], S), (strides[1], G)) if n > 1]
    if len(dims) == 2 and dims[1][0] < dims[0][0]:  # smaller stride first (no sorted(): SymInt strides compare)
        dims.reverse()
    reach = dg  # elements from a row's start that the dims below this one cover
    for st, n in dims:
        if st < reach:
            return False
        reach = st * (n - 1) + reach
    return True
