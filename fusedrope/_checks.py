"""Shared input validation: every op reports bad input the same way.

Messages always name the op, the argument, what was expected and what was given, e.g.
``qwen3_tts_rope: argument 'k' expected shape [2, Hkv, 16, 128], got [2, 8, 17, 128]``.
The ops run a cheap all-good test first and only come here to build the message.
"""

from __future__ import annotations

import torch


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
    if ndim is not None and t.dim() != ndim:
        fail(op, name, f"a {ndim}-D tensor {layout}".rstrip(), f"{t.dim()}-D shape {shape_str(t.shape)}")


def check_dtype(op: str, name: str, t: torch.Tensor, allowed) -> None:
    if t.dtype not in allowed:
        names = " or ".join(dtype_name(d) for d in allowed)
        fail(op, name, f"dtype {names}", dtype_name(t.dtype), TypeError)


def check_same_dtype(op: str, ref_name: str, ref: torch.Tensor, named: dict) -> None:
    for name, t in named.items():
        if t.dtype != ref.dtype:
            fail(op, name, f"dtype {dtype_name(ref.dtype)} (same as '{ref_name}')", dtype_name(t.dtype), TypeError)


def check_same_device(op: str, ref_name: str, ref: torch.Tensor, named: dict) -> None:
    for name, t in named.items():
        if t.device != ref.device:
            fail(op, name, f"a tensor on {ref.device} (same device as '{ref_name}')", f"a tensor on {t.device}")


def check_last_dim_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(op, name, "a contiguous last dimension (stride 1)", f"strides {tuple(t.stride())}")


def check_shape(op: str, name: str, t: torch.Tensor, expected: tuple, names: tuple = ()) -> None:
    """`expected` holds ints or None (any size); `names` labels the free dims in the message."""
    if len(t.shape) == len(expected) and all(e is None or e == s for e, s in zip(expected, t.shape)):
        return
    shown = [names[i] if e is None and i < len(names) else str(e) for i, e in enumerate(expected)]
    fail(op, name, f"shape [{', '.join(shown)}]", shape_str(t.shape))


def needs_grad(*tensors) -> bool:
    """Grad mode is on and an argument requires grad (non-tensors are left to validation)."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if getattr(t, "requires_grad", False):
            return True
    return False


def has_no_data(t: torch.Tensor) -> bool:
    """A meta or fake tensor (tracing, torch.compile): no values to read, and a data_ptr() that means nothing."""
    return t.is_meta or isinstance(t, torch._subclasses.FakeTensor)


def check_writable_no_overlap(op: str, name: str, t: torch.Tensor) -> None:
    """An output written in place must not have two indices on one element (stride 0 on a real dim)."""
    for size, stride in zip(t.shape, t.stride()):
        if size > 1 and stride == 0:
            fail(op, name, "a writable tensor without broadcast (stride-0) dimensions", f"strides {tuple(t.stride())}")
