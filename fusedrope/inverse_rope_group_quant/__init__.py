"""inverse_rope_group_quant: DeepSeek-V4's attention output -> inverse RoPE -> FP8 per-group quant with e8m0
scales, the wo_a GEMM input, in one pass. The public function, its validation (shared by every backend), output
allocation, its backends and its torch ops.

Backends: ``cuda`` (:mod:`.cuda`) and ``hip`` (:mod:`.hip`, opt-in), the hand-written kernels; ``triton``
(:mod:`.triton`); ``reference`` (:mod:`.reference`, plain PyTorch).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch.autograd.graph import increment_version

from .. import _validation as C
from .._device import cuda_toolkit_reason, hip_toolkit_reason, triton_available
from ..registry import Backend, getenv, new_registry
from . import reference

OP = "inverse_rope_group_quant"
O_DTYPES = (torch.bfloat16, torch.float16)
CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
POSITION_DTYPES = (torch.int64, torch.int32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# e8m0 bytes, the same bytes as uint8, the same powers of two as fp32, or DeepGEMM's packed UE8M0 (int32).
SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8, torch.float32, torch.int32)
PACKED_UE8M0 = torch.int32
QUANT_GROUP_SIZES = (32, 64, 128, 256)
ENV_CHECK_POSITIONS = "FUSEDROPE_CHECK_POSITIONS"
SWITCH_OFF = ("", "0", "false", "no", "off")  # FUSEDROPE_CHECK_POSITIONS values that leave the check off
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
    fp8_dtype: torch.dtype
    scale_dtype: torch.dtype
    transpose_scale: bool


REGISTRY = new_registry(OP, Facts)


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
REGISTRY.register(Backend("hip", supports=lambda facts: _hip().supports(facts), load=lambda: _hip().load(),
                          available=lambda device: hip_toolkit_reason(device) or _hip().available(device),
                          opt_in="never run on AMD hardware"))
REGISTRY.register(Backend("triton", available=triton_available, load=_load_triton))
REGISTRY.register(Backend("reference", reference.inverse_rope_group_quant))


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
    who = "quant_output_shapes"
    for name, v in (("num_tokens", num_tokens), ("num_heads", num_heads), ("head_dim", head_dim)):
        if not _is_int(v) or v < 0:
            C.fail(who, name, "a non-negative int", repr(v), _exc(v))
    _, scale_dtype = _resolve_dtypes(None, None, None, scale_dtype, who)
    dg, ks = _group_widths(num_heads * head_dim, num_groups, quant_group_size, scale_dtype, who)
    return _shapes(num_tokens, num_groups, dg, ks, scale_dtype)


def _shapes(S, G, dg, ks, scale_dtype) -> tuple[tuple, tuple]:
    return (S, G, dg), (S, G, ks // 4 if scale_dtype == PACKED_UE8M0 else ks)


def _is_int(v) -> bool:
    """An int, or a SymInt under torch.compile; not a bool, float or numpy scalar."""
    return isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool)


def _got(v) -> str:
    """``v`` for a message; its type too where that is why it was refused (``np.int64(2)`` looks like an int)."""
    return repr(v) if _is_int(v) else f"{v!r} of type {type(v).__name__}"


def _exc(v) -> type[Exception]:
    """ValueError for an int out of range, TypeError for anything that is not an int."""
    return ValueError if _is_int(v) else TypeError


def _group_widths(row: int, num_groups, quant_group_size, scale_dtype=None, op: str = OP) -> tuple[int, int]:
    """``(Dg, Ks)`` for a token row of ``row = H*head_dim`` elements, after checking the group arguments."""
    if not _is_int(num_groups) or num_groups < 1 or row % num_groups:
        C.fail(op, "num_groups", f"a positive int dividing H*head_dim={row}", _got(num_groups), _exc(num_groups))
    if not _is_int(quant_group_size) or quant_group_size not in QUANT_GROUP_SIZES:
        C.fail(op, "quant_group_size", f"one of {QUANT_GROUP_SIZES}", _got(quant_group_size),
               _exc(quant_group_size))
    dg = row // num_groups
    if dg % quant_group_size:
        C.fail(op, "quant_group_size", f"a divisor of the group width Dg=H*head_dim/num_groups={dg}",
               quant_group_size)
    ks = dg // quant_group_size
    if scale_dtype == PACKED_UE8M0 and ks % 4:
        C.fail(op, "scale_dtype", "int32 (packed UE8M0) only when the blocks per group "
               "Dg/quant_group_size are a multiple of 4", f"{dg}/{quant_group_size}={ks}")
    return dg, ks


def _show(v) -> str:
    return str(v) if isinstance(v, torch.dtype) else repr(v)


def _resolve_dtype(arg: str, dtype, buffer_arg: str, buffer, default, allowed, op: str = OP) -> torch.dtype:
    """``dtype``, else the buffer's, else ``default``; checked, naming the argument it came from."""
    if dtype is None and isinstance(buffer, torch.Tensor):
        arg, dtype = buffer_arg, buffer.dtype
    dtype = default if dtype is None else dtype
    if dtype not in allowed:
        names = " or ".join(map(C.dtype_name, allowed))
        if arg == buffer_arg:
            C.fail(op, arg, f"dtype {names}", C.dtype_name(dtype), TypeError)
        C.fail(op, arg, names, _show(dtype), TypeError)
    return dtype


def _resolve_dtypes(x_fp8, x_scale, fp8_dtype, scale_dtype, op: str = OP) -> tuple:
    """The fp8 and scale dtypes: the arguments, else the buffers', else the defaults."""
    return (_resolve_dtype("fp8_dtype", fp8_dtype, "x_fp8", x_fp8, torch.float8_e4m3fn, FP8_DTYPES, op),
            _resolve_dtype("scale_dtype", scale_dtype, "x_scale", x_scale, torch.float8_e8m0fnu, SCALE_DTYPES, op))


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
    who = "empty_quant_outputs"
    C.check_tensor(who, "o", o, 3, "[S, H, head_dim]")
    C.check_bool(who, "transpose_scale", transpose_scale)
    fp8_dtype, scale_dtype = _resolve_dtypes(None, None, fp8_dtype, scale_dtype, who)
    S, H, D = o.shape
    _group_widths(H * D, num_groups, quant_group_size, scale_dtype, who)
    return _empty_outputs(o, num_groups, quant_group_size, transpose_scale, fp8_dtype, scale_dtype)


def _empty_outputs(o, num_groups, quant_group_size, transpose_scale, fp8_dtype, scale_dtype) -> tuple:
    """:func:`empty_quant_outputs` for arguments already checked."""
    S, H, D = o.shape
    dg = H * D // num_groups
    fp_shape, sc_shape = _shapes(S, num_groups, dg, dg // quant_group_size, scale_dtype)
    # empty_strided: on the host, 1.5 us against torch.empty's 2.2 (2-core CPU VM); this is the hot path
    x_fp8 = torch.empty_strided(fp_shape, (fp_shape[1] * fp_shape[2], fp_shape[2], 1), dtype=fp8_dtype,
                                device=o.device)
    strides = scale_strides(sc_shape, transpose_scale, scale_dtype)
    if transpose_scale and strides[-1] > sc_shape[0]:
        # packed column-major: the whole [G, Ks/4, align(S, 4)] storage, padding tokens included, as DeepGEMM
        # allocates it (empty_strided would end the storage at the last token of the last column)
        x_scale = torch.empty((*sc_shape[1:], strides[-1]), dtype=scale_dtype, device=o.device)
        return x_fp8, x_scale.permute(2, 0, 1)[:sc_shape[0]]
    return x_fp8, torch.empty_strided(sc_shape, strides, dtype=scale_dtype, device=o.device)


def _outputs(o, num_groups, quant_group_size, transpose_scale, fp8_dtype, scale_dtype, x_fp8, x_scale) -> tuple:
    """The caller's buffers, with the one(s) left out (None) newly allocated."""
    if x_fp8 is None or x_scale is None:
        new_fp8, new_scale = _empty_outputs(o, num_groups, quant_group_size, transpose_scale, fp8_dtype,
                                            scale_dtype)
        x_fp8 = new_fp8 if x_fp8 is None else x_fp8
        x_scale = new_scale if x_scale is None else x_scale
    return x_fp8, x_scale


def _same_layout(t: torch.Tensor, strides: tuple) -> bool:
    """The strides that address elements agree: those of size-1 dims and of empty tensors do not."""
    return t.numel() == 0 or all(n <= 1 or s == e for n, s, e in zip(t.shape, t.stride(), strides))


def buffer_scale_strides(x_scale: torch.Tensor, transpose_scale: bool, scale_dtype: torch.dtype) -> Optional[tuple]:
    """The strides the kernels address a caller's ``[S, G, Ks]`` scale buffer with, or None when its layout is
    not one the op writes: row-major contiguous, or column-major ``(1, Ks*L, L)`` for any ``L >= S``, i.e.
    storage ``[G, Ks, L]`` with the token dim padded to ``L`` (a max-size buffer sliced to this call's tokens,
    or TMA-aligned fp32 scales). Strides of size-1 dims address nothing and may be anything."""
    S, G, Ks = x_scale.shape
    default = scale_strides((S, G, Ks), transpose_scale, scale_dtype)
    st = x_scale.stride()
    if st == default:  # the layout empty_quant_outputs makes: the hot path
        return default
    if not transpose_scale or x_scale.numel() == 0:
        return default if _same_layout(x_scale, default) else None
    lead = st[2] if Ks > 1 else st[1] if G > 1 else default[2]
    want = (1, Ks * lead, lead)
    return want if lead >= S and _same_layout(x_scale, want) else None


def validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale,
             x_fp8, x_scale, fp8_dtype, scale_dtype) -> tuple:
    """Check every argument; return ``(facts, fp8_dtype, scale_dtype)``. ``facts`` keys backend selection.

    The hot path is one boolean expression over the usual call (no output buffers, or buffers laid out exactly
    as :func:`empty_quant_outputs` makes them); anything else, bad input included, takes :func:`_validate_all`,
    which accepts a superset and raises the precise message."""
    try:
        S, H, D = o.shape
        max_pos, half = cos_cache.shape
        dev, row = o.device, H * D
        ok = (
            type(o) is _Tensor and type(positions) is _Tensor and type(cos_cache) is _Tensor
            and type(sin_cache) is _Tensor
            and type(num_groups) is int and type(quant_group_size) is int and num_groups > 0
            and (transpose_scale is True or transpose_scale is False)
            and row % num_groups == 0 and quant_group_size in QUANT_GROUP_SIZES
            and (row // num_groups) % quant_group_size == 0
            and o.dtype in O_DTYPES and D % 2 == 0 and o.is_contiguous()
            and positions.dtype in POSITION_DTYPES and positions.dim() == 1 and positions.shape[0] >= S
            and positions.layout is torch.strided  # a sparse tensor has a dtype, a dim and a shape, no strides
            and cos_cache.dtype in CACHE_DTYPES and sin_cache.dtype is cos_cache.dtype
            and sin_cache.shape == cos_cache.shape and cos_cache.stride(1) == 1 and sin_cache.stride(1) == 1
            and max_pos >= 1 and half >= 1 and 2 * half <= D
            and positions.device == dev and cos_cache.device == dev and sin_cache.device == dev
            and (fp8_dtype is None or fp8_dtype in FP8_DTYPES)
            and (scale_dtype is None or scale_dtype in SCALE_DTYPES)
        )
        if ok:
            fp8_t = fp8_dtype or (torch.float8_e4m3fn if x_fp8 is None else x_fp8.dtype)
            scale_t = scale_dtype or (torch.float8_e8m0fnu if x_scale is None else x_scale.dtype)
            dg = row // num_groups
            ks = dg // quant_group_size
            ok = not (scale_t is PACKED_UE8M0 and ks % 4) and scale_t in SCALE_DTYPES and fp8_t in FP8_DTYPES
            if ok and (x_fp8 is not None or x_scale is not None):
                fp_shape, sc_shape = _shapes(S, num_groups, dg, ks, scale_t)
                ok = (x_fp8 is not None and x_scale is not None
                      and x_fp8.dtype is fp8_t and x_fp8.shape == fp_shape and x_fp8.is_contiguous()
                      and x_scale.dtype is scale_t and x_scale.shape == sc_shape
                      and buffer_scale_strides(x_scale, bool(transpose_scale), scale_t) is not None
                      and x_fp8.device == dev and x_scale.device == dev)
    except (AttributeError, TypeError, ValueError, IndexError, RuntimeError):
        ok = False
    if not ok:
        return _validate_all(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale,
                             x_fp8, x_scale, fp8_dtype, scale_dtype)
    facts = (dev, o.dtype, D, 2 * half, quant_group_size, cos_cache.dtype, positions.dtype,
             fp8_t, scale_t, bool(transpose_scale))
    return facts, fp8_t, scale_t


def _validate_all(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale,
                  x_fp8, x_scale, fp8_dtype, scale_dtype) -> tuple:
    """Every check, one at a time, each with its message (:func:`validate`'s slow path)."""
    C.check_tensor(OP, "o", o, 3, "[S, H, head_dim]")
    C.check_bool(OP, "transpose_scale", transpose_scale)
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
    fp8_dtype, scale_dtype = _resolve_dtypes(x_fp8, x_scale, fp8_dtype, scale_dtype)
    dg, ks = _group_widths(H * D, num_groups, quant_group_size, scale_dtype)
    fp_shape, sc_shape = _shapes(S, num_groups, dg, ks, scale_dtype)
    if x_fp8 is not None:
        C.check_tensor(OP, "x_fp8", x_fp8)
        C.check_shape(OP, "x_fp8", x_fp8, fp_shape)
        _check_buffer_dtype("x_fp8", x_fp8, fp8_dtype, "fp8_dtype")
        if not x_fp8.is_contiguous():
            C.fail(OP, "x_fp8", "a contiguous tensor", f"strides {tuple(x_fp8.stride())}")
        C.check_same_device(OP, "o", o, {"x_fp8": x_fp8})
    if x_scale is not None:
        C.check_tensor(OP, "x_scale", x_scale)
        C.check_shape(OP, "x_scale", x_scale, sc_shape)
        _check_buffer_dtype("x_scale", x_scale, scale_dtype, "scale_dtype")
        if buffer_scale_strides(x_scale, bool(transpose_scale), scale_dtype) is None:
            want = scale_strides(sc_shape, bool(transpose_scale), scale_dtype)
            if transpose_scale:
                ks = "Ks/4" if scale_dtype == PACKED_UE8M0 else "Ks"
                layout = (f"column-major strides (1, {sc_shape[2]}*L, L) with L >= S={S} (storage [G, {ks}, L]; "
                          f"empty_quant_outputs gives {want})")
            else:
                layout = f"row-major contiguous strides {want}"
            C.fail(OP, "x_scale", f"{layout} for transpose_scale={bool(transpose_scale)}",
                   f"strides {tuple(x_scale.stride())}")
        C.check_same_device(OP, "o", o, {"x_scale": x_scale})
    facts = (o.device, o.dtype, D, 2 * half, quant_group_size, cos_cache.dtype, positions.dtype,
             fp8_dtype, scale_dtype, bool(transpose_scale))
    return facts, fp8_dtype, scale_dtype


def _check_buffer_dtype(name: str, buffer: torch.Tensor, dtype: torch.dtype, arg: str) -> None:
    """A buffer of another dtype than resolved: it came from the argument ``arg``, or it would be the buffer's."""
    if buffer.dtype != dtype:
        C.fail(OP, name, f"dtype {C.dtype_name(dtype)} (as {arg} says)", C.dtype_name(buffer.dtype), TypeError)


def check_positions_on_host(positions: torch.Tensor, num_tokens: int, max_pos: int) -> None:
    """Debug switch (``FUSEDROPE_CHECK_POSITIONS=1``): raise on out-of-range positions instead of clamping.
    Synchronises with the device, so it is off by default. Meta and fake tensors have no values to check."""
    if C.has_no_data(positions):
        return
    p = positions[:num_tokens]
    bad = ((p < 0) | (p >= max_pos)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        C.fail(OP, "positions", f"values in [0, max_pos={max_pos})",
               f"positions[{i}]={int(p[i])} ({bad.numel()} out of range)")


def _check_call(o, positions, cos_cache, sin_cache, x_fp8, x_scale) -> dict:
    """What the call checks beyond :func:`validate` (explain does too): the positions debug switch, and that the
    caller's buffers (None when not given) are writable here and apart from the inputs; returns those buffers."""
    if getenv(ENV_CHECK_POSITIONS).lower() not in SWITCH_OFF:
        check_positions_on_host(positions, o.shape[0], cos_cache.shape[0])
    mine = {n: t for n, t in (("x_fp8", x_fp8), ("x_scale", x_scale)) if t is not None}
    if mine and o.numel():
        C.check_writable_here(OP, mine)
        C.check_apart(OP, mine, {"o": o, "positions": positions, "cos_cache": cos_cache,
                                 "sin_cache": sin_cache})
    return mine


def _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8, x_scale,
         fp8_dtype, scale_dtype, backend):
    facts, fp8_dtype, scale_dtype = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                                             transpose_scale, x_fp8, x_scale, fp8_dtype, scale_dtype)
    impl = REGISTRY.select(facts, backend)
    mine = _check_call(o, positions, cos_cache, sin_cache, x_fp8, x_scale)  # the caller's buffers, checked
    x_fp8, x_scale = _outputs(o, num_groups, quant_group_size, transpose_scale, fp8_dtype, scale_dtype, x_fp8,
                              x_scale)
    if o.numel():
        # A caller's scale buffer may carry any stride on a size-1 dim (e.g. Ks == 1); the backends get the
        # view with the strides of buffer_scale_strides, which addresses the same elements.
        scale_out = x_scale
        if "x_scale" in mine:
            want = buffer_scale_strides(x_scale, bool(transpose_scale), scale_dtype)
            scale_out = x_scale if x_scale.stride() == want else x_scale.as_strided(x_scale.shape, want)
        impl.run(o, positions, cos_cache, sin_cache, x_fp8, scale_out, quant_group_size)
        if mine:  # written through raw pointers: tell autograd the caller's buffers changed
            increment_version(tuple(mine.values()))
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
        :func:`empty_quant_outputs` to allocate them. A column-major ``x_scale`` may pad its token dim (strides
        ``(1, Ks*L, L)``, any ``L >= S``: a max-size buffer sliced to this call's tokens).
    fp8_dtype : torch.dtype, optional
        ``torch.float8_e4m3fn`` (FP8_MAX 448, default; NVIDIA, gfx950) or ``torch.float8_e4m3fnuz`` (240, gfx942).
    scale_dtype : torch.dtype, optional
        ``torch.float8_e8m0fnu`` (default), ``torch.uint8`` (same bytes), ``torch.float32`` (2^k as fp32) or
        ``torch.int32``: DeepGEMM's packed UE8M0, ``[S, G, Ks/4]``, byte ``i`` of ``[s, g, j]`` holding block
        ``4j+i``; with ``transpose_scale=True`` its storage is ``[G, Ks/4, align(S, 4)]`` (TMA-aligned MN-major,
        ``x_scale.permute(1, 0, 2)`` is what DeepGEMM's ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` gives).
    backend : str, default "auto"
        ``"auto"``, ``"cuda"``, ``"hip"`` (opt-in: ``auto`` passes over it), ``"triton"``, ``"reference"`` or
        one of yours (:func:`fusedrope.register_backend`). ``auto`` honours ``FUSEDROPE_BACKEND``.

    Returns
    -------
    (x_fp8, x_scale) : tuple of torch.Tensor
        ``[S, G, Dg]`` fp8 and ``[S, G, Dg / quant_group_size]`` scales.

    Raises
    ------
    ValueError, TypeError
        Bad shapes, strides, dtypes, devices or group arguments, a ``transpose_scale`` that is not a bool, and
        with ``FUSEDROPE_CHECK_POSITIONS=1`` out-of-range positions; the message names the argument.
    fusedrope.BackendUnavailableError
        An explicitly requested backend cannot run these inputs.
    RuntimeError
        Output buffers that are inference tensors, outside ``torch.inference_mode()``.

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
    grad = not compiling and C.needs_grad(o, cos_cache, sin_cache)
    if compiling or grad:
        # The errors and messages eager gives (traced, before torch's schema check, which would refuse a
        # non-int group argument with its own message).
        _, checked_fp8, checked_scale = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                                                 transpose_scale, x_fp8, x_scale, fp8_dtype, scale_dtype)
        if grad and (x_fp8 is not None or x_scale is not None):
            with torch.no_grad():  # quantised bytes written into buffers: no autograd history, on any backend
                return _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale,
                            x_fp8, x_scale, fp8_dtype, scale_dtype, backend)
        # Traced, or inputs that require grad: the torch op, whose outputs raise on backward (no derivative)
        # instead of silently cutting the graph.
        if x_fp8 is not None or x_scale is not None:
            as_e8m0 = False
            if x_fp8 is None or x_scale is None or fp8_dtype is not None or scale_dtype is not None:
                # the _out op reads the buffers' dtypes (checked against the arguments above): allocate the
                # buffer the caller left out, as eager does; an e8m0 one as its uint8 bytes, since inductor has
                # no e8m0 code generation for a tensor an op mutates
                fp8_dtype, scale_dtype = checked_fp8, checked_scale
                as_e8m0 = x_scale is None and scale_dtype == torch.float8_e8m0fnu
                x_fp8, x_scale = _outputs(o, num_groups, quant_group_size, transpose_scale, fp8_dtype,
                                          torch.uint8 if as_e8m0 else scale_dtype, x_fp8, x_scale)
            torch.ops.fusedrope.inverse_rope_group_quant_out(o, positions, cos_cache, sin_cache, num_groups,
                                                             quant_group_size, transpose_scale, x_fp8, x_scale,
                                                             backend)
            return x_fp8, x_scale.view(torch.float8_e8m0fnu) if as_e8m0 else x_scale
        return torch.ops.fusedrope.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups,
                                                            quant_group_size, transpose_scale, fp8_dtype,
                                                            scale_dtype, backend)
    return _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
                x_scale, fp8_dtype, scale_dtype, backend)


def explain_args(o, positions, cos_cache, sin_cache, num_groups, quant_group_size=128, transpose_scale=False,
                 x_fp8=None, x_scale=None, *, fp8_dtype=None, scale_dtype=None, backend="auto"):
    facts = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
                     x_scale, fp8_dtype, scale_dtype)[0]
    _check_call(o, positions, cos_cache, sin_cache, x_fp8, x_scale)  # explain raises what the call would
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
    return _empty_outputs(o, num_groups, quant_group_size, transpose_scale, fp8_dtype, scale_dtype)


@torch.library.custom_op("fusedrope::inverse_rope_group_quant_out", mutates_args=("x_fp8", "x_scale"))
def _op_out(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
            num_groups: int, quant_group_size: int, transpose_scale: bool, x_fp8: torch.Tensor,
            x_scale: torch.Tensor, backend: str = "auto") -> None:
    for name, t in (("x_fp8", x_fp8), ("x_scale", x_scale)):
        C.check_tensor(OP, name, t)  # the schema says Tensor, but Python passes None through
    _run(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8, x_scale,
         None, None, backend)


@_op_out.register_fake
def _op_out_fake(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8,
                 x_scale, backend="auto"):
    validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale, x_fp8, x_scale,
             None, None)
