"""qwen3_tts_rope: the public function, its input contract, its registry entries and its torch op."""

from __future__ import annotations

import torch
from torch.autograd.graph import increment_version

from . import _checks as C
from .backends import reference_available, triton_available
from .registry import Impl, new_registry
from . import cuda_tts_rope as _cuda  # light: torch.utils.cpp_extension is imported only to build

OP = "qwen3_tts_rope"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
REGISTRY = new_registry(OP)


def check_shapes(q, k, cos, sin, op: str = OP) -> None:
    """The op's shape contract (also what the oracle and its checks demand): ``q [B, Hq, S, D]``,
    ``k [B, Hkv, S, D]``, ``cos`` and ``sin [B or 1, S, D]``, ``D`` even."""
    C.check_tensor(op, "q", q, 4, "[B, Hq, S, D]")
    C.check_tensor(op, "k", k, 4, "[B, Hkv, S, D]")
    C.check_tensor(op, "cos", cos, 3, "[B or 1, S, D]")
    C.check_tensor(op, "sin", sin, 3, "[B or 1, S, D]")
    B, _, S, D = q.shape
    if D < 2 or D % 2:
        C.fail(op, "q", "an even head_dim D >= 2 (last dim)", f"D={D}")
    C.check_shape(op, "k", k, (B, None, S, D), ("B", "Hkv"))
    if cos.shape[0] not in (1, B):
        C.fail(op, "cos", f"shape [{B if B == 1 else f'{B} or 1'}, {S}, {D}]", C.shape_str(cos.shape))
    C.check_shape(op, "cos", cos, (cos.shape[0], S, D))
    C.check_shape(op, "sin", sin, tuple(cos.shape))


def _diagnose(q, k, cos, sin, inplace) -> None:
    """Raise the precise error for inputs that failed the fast test in ``validate``."""
    check_shapes(q, k, cos, sin)
    C.check_dtype(OP, "q", q, DTYPES)
    C.check_same_dtype(OP, "q", q, {"k": k, "cos": cos, "sin": sin})
    C.check_same_device(OP, "q", q, {"k": k, "cos": cos, "sin": sin})
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        C.check_last_dim_contiguous(OP, name, t)
    if inplace:
        C.check_writable_no_overlap(OP, "q", q)
        C.check_writable_no_overlap(OP, "k", k)
    raise AssertionError("validate() rejected inputs that _diagnose() accepts")  # pragma: no cover


def validate(q, k, cos, sin, inplace: bool) -> tuple:
    """Check the inputs; return the selection facts ``(device, dtype, D, inplace)``.

    The hot path is one boolean expression (about 1.5 us on a 2-core CPU); only failing inputs pay for
    ``_diagnose``'s precise message."""
    try:
        qs, ks, cs = q.shape, k.shape, cos.shape
        dt, dev = q.dtype, q.device
        ok = (
            len(qs) == 4 and len(ks) == 4 and len(cs) == 3
            and ks[0] == qs[0] and ks[2] == qs[2] and ks[3] == qs[3]
            and (cs[0] == qs[0] or cs[0] == 1) and cs[1] == qs[2] and cs[2] == qs[3] and sin.shape == cs
            and qs[3] % 2 == 0 and qs[3] >= 2
            and dt in DTYPES and k.dtype is dt and cos.dtype is dt and sin.dtype is dt
            and k.device == dev and cos.device == dev and sin.device == dev
            and q.stride()[3] == 1 and k.stride()[3] == 1 and cos.stride()[2] == 1 and sin.stride()[2] == 1
        )
    except (AttributeError, TypeError, IndexError):
        ok = False
    if not ok:
        _diagnose(q, k, cos, sin, inplace)
    if inplace:
        _check_inplace(q, k, cos, sin)
    return (dev, dt, qs[3], bool(inplace))


def _refuse_inplace_grad(q, k, cos, sin) -> None:
    """In place has no derivative: with grad mode on, no input may require grad."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or cos.requires_grad or sin.requires_grad):
        C.refuse_grad(OP, "inplace=True has", {"q": q, "k": k, "cos": cos, "sin": sin}, "use inplace=False")


def _check_inplace(q, k, cos, sin) -> None:
    """What in-place writes need beyond valid inputs, as torch's own in-place ops demand it."""
    if 0 in q.stride() or 0 in k.stride():
        C.check_writable_no_overlap(OP, "q", q)
        C.check_writable_no_overlap(OP, "k", k)
    C.check_apart(OP, {"k": k, "q": q}, {"cos": cos, "sin": sin}, " for inplace=True")
    _refuse_inplace_grad(q, k, cos, sin)
    C.check_writable_here(OP, {"q": q, "k": k}, " (inplace=True)")


def _check_outputs(q, k, cos, sin, q_out, k_out) -> dict:
    """Caller buffers (either or both): shaped, typed and placed like ``q`` / ``k``, writable, last dim
    contiguous, sharing no element with each other or an input. Returns them by name. One boolean expression
    for buffers that pass (as in ``validate``); the checks one by one only to name what fails."""
    given = {}
    for name, out, src, src_name in (("q_out", q_out, q, "q"), ("k_out", k_out, k, "k")):
        if out is None:
            continue
        try:
            ok = (out.shape == src.shape and out.dtype is src.dtype and out.device == src.device
                  and out.stride()[3] == 1 and 0 not in out.stride() and out is not src)
        except (AttributeError, TypeError, IndexError):
            ok = False
        if not ok:
            _diagnose_output(name, out, src, src_name)
        given[name] = out
    C.check_apart(OP, given, {"q": q, "k": k, "cos": cos, "sin": sin})
    C.check_writable_here(OP, given)
    return given


def _diagnose_output(name, out, src, src_name) -> None:
    C.check_tensor(OP, name, out, 4)
    C.check_shape(OP, name, out, tuple(src.shape))
    C.check_same_dtype(OP, src_name, src, {name: out})
    C.check_same_device(OP, src_name, src, {name: out})
    C.check_last_dim_contiguous(OP, name, out)
    C.check_writable_no_overlap(OP, name, out)
    if out is src:
        C.fail(OP, name, f"a buffer apart from '{src_name}' (inplace=True writes into q and k)",
               f"'{src_name}' itself")


# -- backends -----------------------------------------------------------------------------------------
def _supports_any(facts) -> None:
    return None


REGISTRY.register(Impl("reference", ".reference:qwen3_tts_rope", _supports_any, reference_available))
REGISTRY.register(Impl("triton", ".triton_tts_rope:qwen3_tts_rope", _supports_any, triton_available))
REGISTRY.register(Impl("cuda", ".cuda_tts_rope:qwen3_tts_rope", _cuda.supports, _cuda.available,
                       run_alloc=".cuda_tts_rope:qwen3_tts_rope_new"))


def _new_out(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor shaped and typed like ``t``: ``empty_like`` costs half of ``new_empty(t.shape)``
    on the host (1.4 us against 2.9 us on the 2-core CPU VM), and this is the hot path."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _run(q, k, cos, sin, inplace: bool, backend: str, q_out=None, k_out=None):
    impl = REGISTRY.select(validate(q, k, cos, sin, inplace), backend)
    work = q.numel() or k.numel()
    if q_out is not None or k_out is not None:
        given = _check_outputs(q, k, cos, sin, q_out, k_out)
        q_out = _new_out(q) if q_out is None else q_out
        k_out = _new_out(k) if k_out is None else k_out
        if work:
            impl.fn()(q, k, cos, sin, q_out, k_out)
            increment_version(tuple(given.values()))  # written through raw pointers
        return q_out, k_out
    if inplace:
        if work:
            impl.fn()(q, k, cos, sin, q, k)
            increment_version((q, k))  # written through raw pointers: saved copies of q, k are now stale
        return q, k
    elif work and impl.run_alloc and not (q.requires_grad or k.requires_grad):
        # the backend allocates (in C++: two Python calls fewer); not for inputs that require grad, whose
        # outputs would come back from the compiled op with an autograd placeholder instead of plain tensors
        return impl.fn_alloc()(q, k, cos, sin)
    else:
        q_out, k_out = _new_out(q), _new_out(k)
    if work:
        impl.fn()(q, k, cos, sin, q_out, k_out)
    return q_out, k_out


def qwen3_tts_rope(q, k, cos, sin, *, inplace: bool = False, q_out=None, k_out=None, backend: str = "auto"):
    """NeoX (rotate_half) RoPE on standalone query and key tensors, fused into one launch.

    Computes, per row ``x`` of length ``D`` with ``h = D/2``, in fp32 and rounded once (RNE)::

        out[i]   = x[i]   * cos[i]   - x[i+h] * sin[i]        (i < h)
        out[i+h] = x[i+h] * cos[i+h] + x[i]   * sin[i+h]

    i.e. ``x * cos + rotate_half(x) * sin``. Both halves of ``cos``/``sin`` are read.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, Hq, S, D]``, bf16 / fp16 / fp32. Leading dims may have any strides; last dim stride 1.
    k : torch.Tensor
        ``[B, Hkv, S, D]``, same dtype and device as ``q``; ``Hkv`` is independent of ``Hq``.
    cos, sin : torch.Tensor
        ``[B, S, D]`` or ``[1, S, D]`` (broadcast over the batch), both the same shape, dtype and device.
    inplace : bool, default False
        Write the results into ``q`` and ``k`` through their own strides and return them.
    q_out, k_out : torch.Tensor, optional
        Buffers to write the results into (either or both; the other is allocated), shaped, typed and placed
        like ``q`` / ``k``, any strides with the last one 1, sharing no memory with an input: e.g. ``k_out`` a
        slice of a static KV cache, so rotated keys land there without a copy. Not with ``inplace=True``, and,
        as torch's ``out=``, not with grad mode on and an input or buffer that requires grad.
    backend : str, default "auto"
        ``"auto"``, ``"cuda"``, ``"triton"`` or ``"reference"``. ``auto`` honours ``FUSEDROPE_BACKEND``.

    Returns
    -------
    (q_out, k_out) : tuple of torch.Tensor
        New contiguous tensors shaped like ``q`` and ``k``, or the buffers passed, or ``q`` and ``k``
        themselves when ``inplace``.

    Raises
    ------
    ValueError, TypeError
        Bad shapes, strides, dtypes or devices, or a flag that is not a bool; the message names the argument.
    fusedrope.BackendUnavailableError
        An explicitly requested backend cannot run these inputs.
    RuntimeError
        ``inplace=True`` or buffers with grad mode on and a tensor that requires grad, or writing into an
        inference tensor outside ``torch.inference_mode()``.

    Examples
    --------
    >>> import torch, fusedrope
    >>> q = torch.randn(1, 16, 8, 128, dtype=torch.bfloat16)
    >>> k = torch.randn(1, 8, 8, 128, dtype=torch.bfloat16)
    >>> cos, sin = torch.ones(1, 8, 128, dtype=torch.bfloat16), torch.zeros(1, 8, 128, dtype=torch.bfloat16)
    >>> q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")
    >>> torch.equal(q_out, q)
    True
    """
    if inplace is not False and inplace is not True:
        C.check_bool(OP, "inplace", inplace)
    if q_out is not None or k_out is not None:
        return _into_buffers(q, k, cos, sin, inplace, q_out, k_out, backend)
    if torch.compiler.is_compiling():
        if inplace:
            # eager refuses this in validate; traced, the op's fake validates (storage overlap checks cannot be
            # traced here), so for inputs that are also invalid this error may come before the validation error
            _refuse_inplace_grad(q, k, cos, sin)
            torch.ops.fusedrope.qwen3_tts_rope_(q, k, cos, sin, backend)
            return q, k
        return torch.ops.fusedrope.qwen3_tts_rope(q, k, cos, sin, backend)
    if not inplace and C.needs_grad(q, k, cos, sin):
        # the torch op: its outputs raise on backward (no derivative) instead of silently cutting the graph;
        # the inputs and the backend name are checked first, for the same errors as without grad
        REGISTRY.select(validate(q, k, cos, sin, False), backend)
        return torch.ops.fusedrope.qwen3_tts_rope(q, k, cos, sin, backend)
    return _run(q, k, cos, sin, inplace, backend)


def _into_buffers(q, k, cos, sin, inplace, q_out, k_out, backend):
    """:func:`qwen3_tts_rope` with caller buffers, eager or traced (the ``_out`` torch op). Like torch's own
    ``out=`` arguments, not with autograd: written bytes have no history to keep."""
    _refuse_buffers_in_place(inplace, q_out, k_out)
    _refuse_buffer_grad(q, k, cos, sin, q_out, k_out)
    if torch.compiler.is_compiling():
        validate(q, k, cos, sin, False)  # the errors eager gives, before allocating the missing buffer
        q_out = _new_out(q) if q_out is None else q_out
        k_out = _new_out(k) if k_out is None else k_out
        torch.ops.fusedrope.qwen3_tts_rope_out(q, k, cos, sin, q_out, k_out, backend)
        return q_out, k_out
    return _run(q, k, cos, sin, False, backend, q_out, k_out)


def _refuse_buffer_grad(q, k, cos, sin, q_out, k_out) -> None:
    if C.needs_grad(q, k, cos, sin, q_out, k_out):  # the names only when one is refused: this is the hot path
        C.refuse_grad(OP, "q_out= / k_out= have", dict(q=q, k=k, cos=cos, sin=sin, q_out=q_out, k_out=k_out),
                      "without buffers")


def _refuse_buffers_in_place(inplace, q_out, k_out) -> None:
    if inplace:
        name = "q_out" if q_out is not None else "k_out"
        C.fail(OP, name, "None with inplace=True (which writes into q and k)", "a tensor")


def explain_args(q, k, cos, sin, *, inplace: bool = False, q_out=None, k_out=None, backend: str = "auto"):
    C.check_bool(OP, "inplace", inplace)
    if q_out is not None or k_out is not None:  # explain raises what the call would
        _refuse_buffers_in_place(inplace, q_out, k_out)
        _refuse_buffer_grad(q, k, cos, sin, q_out, k_out)
        facts = validate(q, k, cos, sin, False)
        _check_outputs(q, k, cos, sin, q_out, k_out)
        return facts, backend
    return validate(q, k, cos, sin, inplace), backend


# -- torch ops: opaque to torch.compile, capturable in CUDA graphs -----------------------------------
@torch.library.custom_op("fusedrope::qwen3_tts_rope", mutates_args=())
def _op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    return _run(q, k, cos, sin, False, backend)


@_op.register_fake
def _op_fake(q, k, cos, sin, backend="auto"):
    validate(q, k, cos, sin, False)
    return _new_out(q), _new_out(k)


@torch.library.custom_op("fusedrope::qwen3_tts_rope_", mutates_args=("q", "k"))
def _op_inplace(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                backend: str = "auto") -> None:
    _run(q, k, cos, sin, True, backend)


@_op_inplace.register_fake
def _op_inplace_fake(q, k, cos, sin, backend="auto"):
    validate(q, k, cos, sin, True)


@torch.library.custom_op("fusedrope::qwen3_tts_rope_out", mutates_args=("q_out", "k_out"))
def _op_out(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_out: torch.Tensor,
            k_out: torch.Tensor, backend: str = "auto") -> None:
    for name, t in (("q_out", q_out), ("k_out", k_out)):
        C.check_tensor(OP, name, t)  # the schema says Tensor, but Python passes None through
    _run(q, k, cos, sin, False, backend, q_out, k_out)


@_op_out.register_fake
def _op_out_fake(q, k, cos, sin, q_out, k_out, backend="auto"):
    validate(q, k, cos, sin, False)
    _check_outputs(q, k, cos, sin, q_out, k_out)
