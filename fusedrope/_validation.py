"""Shared input validation: every op reports bad input the same way, naming the op, the argument, what was
expected and what was given (``qwen3_tts_rope: argument 'k' expected shape [2, Hkv, 16, 128], got [2, 8, 17,
128]``), and checks in-place writes and caller buffers for overlap, writability and autograd."""

from __future__ import annotations

import functools

import torch
from torch._C._functorch import is_functorch_wrapped_tensor, maybe_current_level
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.autograd import forward_ad as _fad


class BackendUnavailableError(RuntimeError):
    """An explicitly requested backend cannot run these inputs on this machine."""


def fail(op: str, arg: str, expected: str, got, exc: type[Exception] = ValueError):
    raise exc(f"{op}: argument '{arg}' expected {expected}, got {got}")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def shape_str(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def check_tensor(op: str, name: str, t, ndim: int | None = None, layout: str = "") -> None:
    if not isinstance(t, torch.Tensor):
        fail(op, name, "a torch.Tensor", type(t).__name__, TypeError)
    if t.layout != torch.strided or t.is_nested:
        fail(op, name, "a dense (strided) tensor", "a nested tensor" if t.is_nested else f"layout {t.layout}",
             TypeError)
    if ndim is not None and t.dim() != ndim:
        fail(op, name, f"a {ndim}-D tensor {layout}".rstrip(), f"{t.dim()}-D shape {shape_str(t.shape)}")


def type_name(v) -> str:
    """``v``'s type as its reader knows it: ``str``, ``numpy.bool`` (whose ``np.False_`` is no bool)."""
    t = type(v)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def check_bool(op: str, name: str, v) -> None:
    """A flag must be a bool: a truthy string such as "False" must not flip a layout or write in place."""
    if v is not True and v is not False:
        fail(op, name, "a bool", f"{type_name(v)} {v!r}", TypeError)


def unreadable(t) -> tuple:
    """``(expected, got, exception)`` for :func:`fail` when a kernel reading ``t`` through its data pointer would get
    wrong values or drop a derivative, else (): the rule of both check paths (``readable`` in csrc/fast_checks.cpp)."""
    memory = "a tensor whose memory holds its values (the kernels read it through its data pointer)"
    if t.is_neg():
        return memory, "a negative view (torch._neg_view, .imag of a conjugate); pass .resolve_neg()", TypeError
    if t.is_conj():
        return memory, "a conjugate view (.conj()); pass .resolve_conj()", TypeError
    if (t._is_zerotensor() or is_functorch_wrapped_tensor(t) or torch._is_functional_tensor(t)
            or isinstance(t, FunctionalTensor)):
        return memory, ("a tensor without storage (a ZeroTensor, a torch.func vmap / grad / jvp wrapper, a "
                        "functional tensor); call the op on plain tensors, outside the transform"), TypeError
    if _fad._current_level >= 0 and _fad.unpack_dual(t).tangent is not None:
        return ("a tensor without a forward-mode AD tangent (the op has no derivative formula)",
                "a dual tensor, whose tangent the op would drop", RuntimeError)
    return ()


def readable(*tensors) -> bool:
    """No tensor of ``tensors`` (None passes) is :func:`unreadable` (the compiled checks': one C call). Outside the
    forward-AD levels and torch.func transforms where dual and wrapped tensors live, only the negative and
    ZeroTensor bits are read (callers check for a real dtype first, which has no conjugate bit)."""
    if _fad._current_level >= 0 or maybe_current_level() is not None:
        return not any(t is not None and unreadable(t) for t in tensors)
    for t in tensors:
        if t is not None and (t.is_neg() or t._is_zerotensor()):
            return False
    return True


def check_readable(op: str, named: dict) -> None:
    """:func:`unreadable`'s error for the first tensor of ``named`` (name -> tensor or None) it refuses."""
    for name, t in named.items():
        if t is not None and (why := unreadable(t)):
            fail(op, name, *why)


def check_dtype(op: str, name: str, t: torch.Tensor, allowed) -> None:
    if t.dtype not in allowed:
        names = " or ".join(dtype_name(d) for d in allowed)
        fail(op, name, f"dtype {names}", dtype_name(t.dtype), TypeError)


def _odd_one_out(ref_name: str, ref, named: dict, key) -> tuple:
    """``(name, value, agreed, agreeing names)`` of the argument to blame when ``key`` differs: the first of
    ``named`` that differs from ``ref``, or ``ref`` itself when all of ``named`` (two or more) agree without it."""
    values = {key(t) for t in named.values()}
    if len(named) >= 2 and len(values) == 1 and key(ref) not in values:
        return ref_name, key(ref), values.pop(), "', '".join(named)
    for name, t in named.items():
        if key(t) != key(ref):
            return name, key(t), key(ref), ref_name
    return None


def check_same_dtype(op: str, ref_name: str, ref: torch.Tensor, named: dict) -> None:
    odd = _odd_one_out(ref_name, ref, named, lambda t: t.dtype)
    if odd:
        name, got, want, like = odd
        fail(op, name, f"dtype {dtype_name(want)} (same as '{like}')", dtype_name(got), TypeError)


def check_same_device(op: str, ref_name: str, ref: torch.Tensor, named: dict) -> None:
    odd = _odd_one_out(ref_name, ref, named, lambda t: t.device)
    if odd:
        name, got, want, like = odd
        fail(op, name, f"a tensor on {want} (same device as '{like}')", f"a tensor on {got}")


def check_last_dim_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(op, name, "a contiguous last dimension (stride 1)", f"strides {tuple(t.stride())}")


def check_shape(op: str, name: str, t: torch.Tensor, expected: tuple, names: tuple = ()) -> None:
    """`expected` holds ints or None (any size); `names` labels the free dims in the message."""
    if len(t.shape) == len(expected) and all(e is None or e == s for e, s in zip(expected, t.shape)):
        return
    shown = [names[i] if e is None and i < len(names) else str(e) for i, e in enumerate(expected)]
    fail(op, name, f"shape [{', '.join(shown)}]", shape_str(t.shape))


def refuse_grad(op: str, what: str, tensors: dict, instead: str) -> None:
    """``what`` has no derivative: with grad mode on, no tensor in ``tensors`` (name -> tensor) may require
    grad. RuntimeError naming the first that does, as torch's own in-place and ``out=`` ops refuse."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if getattr(t, "requires_grad", False):
            raise RuntimeError(f"{op}: {what} no autograd formula, and argument '{name}' requires grad; call it "
                               f"under torch.no_grad() or torch.inference_mode(), or {instead}")


class NoDerivative(torch.autograd.Function):
    """``apply(op, out_a, out_b, *inputs)``: the new outputs of inputs that require grad, whose backward raises
    (no backend has a derivative) instead of the graph being cut silently. Eager only: Dynamo cannot trace a
    backward that raises, so a traced call refuses grad instead (:func:`refuse_grad`)."""

    @staticmethod
    def forward(ctx, op, out_a, out_b, *inputs):
        ctx.op = op
        return out_a, out_b

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"{ctx.op} has no autograd formula: call it under torch.no_grad() or "
                           "torch.inference_mode(), or on detached inputs")


def needs_grad(*tensors) -> bool:
    """Grad mode is on and an argument requires grad (non-tensors are left to validation)."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if getattr(t, "requires_grad", False):
            return True
    return False


def check_writable_here(op: str, named: dict, why: str = "") -> None:
    """Outside ``torch.inference_mode()`` torch refuses writes into inference tensors; so do the ops."""
    if torch.is_inference_mode_enabled():
        return
    for name, t in named.items():
        if t.is_inference():
            raise RuntimeError(f"{op}: argument '{name}'{why} expected a tensor writable outside "
                               "torch.inference_mode(), got an inference tensor (torch does not allow that either)")


def has_no_data(t: torch.Tensor) -> bool:
    """A meta or fake tensor (tracing, torch.compile): no values to read, and a data_ptr() that means nothing."""
    return t.is_meta or (type(t) is not torch.Tensor and isinstance(t, torch._subclasses.FakeTensor))


def check_writable_no_overlap(op: str, name: str, t: torch.Tensor) -> None:
    """An output written in place must not have two indices on one element (stride 0 on a real dim)."""
    for size, stride in zip(t.shape, t.stride()):
        if size > 1 and stride == 0:
            fail(op, name, "a writable tensor without broadcast (stride-0) dimensions", f"strides {tuple(t.stride())}")


def _strides_down(shape, strides) -> tuple:
    """``(stride, size)`` of the dims that address more than one element, largest stride first."""
    return tuple(sorted(((st, n) for n, st in zip(shape, strides) if n > 1 and st), reverse=True))


def _has_byte(dims: tuple, size: int, nbytes_to_last: int, x: int) -> bool:
    """Byte ``x`` (from the tensor's first byte) belongs to one of its elements. Exact for every layout whose
    strides nest (each larger than the reach of the smaller ones: any slice of a dense tensor, e.g.), where
    taking the largest index first is the only choice; elsewhere it may say False, never wrongly True."""
    if x < 0 or x > nbytes_to_last + size - 1:
        return False
    slot = x // size
    for st, n in dims:
        slot -= min(slot // st, n - 1) * st
    return slot == 0


@functools.lru_cache(maxsize=1024)
def _layouts_share(a_shape, a_strides, a_size, b_shape, b_strides, b_size, delta) -> bool:
    """:func:`shares_memory` on layouts, ``b`` starting ``delta`` bytes after ``a`` (cached: an engine calls
    with the same few layouts every step)."""
    if 0 in a_shape or 0 in b_shape:
        return False
    a_dims, b_dims = _strides_down(a_shape, a_strides), _strides_down(b_shape, b_strides)
    a_last = sum((n - 1) * st for st, n in a_dims) * a_size  # bytes from the first element to the last one
    b_last = sum((n - 1) * st for st, n in b_dims) * b_size
    if delta > a_last + a_size - 1 or -delta > b_last + b_size - 1:
        return False  # byte ranges apart
    # Each one's first and last byte, looked for in the other.
    return (delta == 0 or _has_byte(a_dims, a_size, a_last, delta)
            or _has_byte(a_dims, a_size, a_last, delta + b_last + b_size - 1)
            or _has_byte(b_dims, b_size, b_last, -delta)
            or _has_byte(b_dims, b_size, b_last, a_last + a_size - 1 - delta))


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` certainly have an element in common; False when they do not, and in the cases
    this cheap test cannot tell (then the caller's to avoid, as with torch's own in-place ops).

    Certain: both start at one address, or the first or last byte of one lies in an element of the other:
    every overlap of two dense tensors, and of slices of one buffer along the same dims (a head slice inside
    or straddling another). Interleaved views that share nothing, e.g. the q and k heads of one fused qkv
    projection, are told apart exactly. Missed: overlaps of views whose ends both fall in the other's gaps,
    e.g. ``x[0:22:3]`` and ``x[16:25:2]`` (they share ``x[18]``)."""
    if has_no_data(a) or has_no_data(b):
        return False
    return _share(a, b)


def _share(a: torch.Tensor, b: torch.Tensor) -> bool:
    return _layouts_share(a.shape, a.stride(), a.element_size(), b.shape, b.stride(), b.element_size(),
                          b.data_ptr() - a.data_ptr())


def _storage_bytes(t: torch.Tensor) -> tuple[int, int]:
    """The address range of the memory ``t``'s storage holds."""
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def check_apart(op: str, writes: dict, reads: dict, why: str = "") -> None:
    """Each tensor in ``writes`` (name -> tensor the op writes) shares no element with a later one or with any
    in ``reads``, as far as :func:`shares_memory` can tell. Memory is compared by address, not by storage
    object: two storages may wrap one buffer (numpy, DLPack, ``from_blob``). Storages whose byte ranges are
    apart are apart; only tensors over common bytes are compared element by element."""
    tensors = (*writes.values(), *reads.values())
    if has_no_data(tensors[0]):
        return
    spans = [_storage_bytes(t) for t in tensors]
    for i, name in enumerate(writes):
        t, (lo, hi) = tensors[i], spans[i]
        for j in range(i + 1, len(tensors)):
            if spans[j][0] < hi and lo < spans[j][1] and (tensors[j] is t or _share(t, tensors[j])):
                other = [*writes, *reads][j]
                fail(op, name, f"memory apart from '{other}'{why}", f"a tensor sharing elements with '{other}'")


ENV_CHECK_POSITIONS = "FUSEDROPE_CHECK_POSITIONS"
SWITCH_OFF = ("", "0", "false", "no", "off")  # FUSEDROPE_CHECK_POSITIONS values that leave the check off


def check_positions_on_host(op: str, positions: torch.Tensor, max_pos: int) -> None:
    """``FUSEDROPE_CHECK_POSITIONS=1``: raise on out-of-range positions instead of clamping (synchronises)."""
    if has_no_data(positions):
        return
    p = positions.reshape(-1)
    bad = ((p < 0) | (p >= max_pos)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        at = f"positions[{i}]" if positions.dim() == 1 else f"positions.flatten()[{i}]"
        fail(op, "positions", f"values in [0, max_pos={max_pos})", f"{at}={int(p[i])} ({bad.numel()} out of range)")

