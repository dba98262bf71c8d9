"""qwen3_tts_rope: NeoX RoPE on standalone Q and K in one launch. The public function, its validation (shared by
every backend), its backends and its torch ops; :mod:`.modes` adds ``numerics="eager"``, ``positions=`` and
:func:`qwen3_tts_qk_norm_rope` (the model's q/k RMSNorm first) on the same registry and ops.

Backends: ``cuda`` (:mod:`.cuda`, the hand-written kernel), ``triton`` (:mod:`.triton`), ``reference``
(:mod:`.reference`, plain PyTorch and the float64 oracle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
from torch.autograd.graph import increment_version

from .. import _validation as V, fast_checks
from .._device import cuda_toolkit_reason, triton_available
from ..registry import Backend, getenv, new_registry
from . import reference

OP = "qwen3_tts_rope"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
NUMERICS = ("fp32", "eager")
POSITION_DTYPES = (torch.int64, torch.int32)
_Tensor = torch.Tensor
_empty_like = torch.empty_like
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


class Facts(NamedTuple):
    """What choosing a backend may depend on (``supports(facts)``)."""

    device: torch.device
    dtype: torch.dtype
    head_dim: int
    inplace: bool
    eager: bool = False  # numerics="eager"
    table: bool = False  # positions= given: cos/sin are tables read at them
    norm: bool = False  # qwen3_tts_qk_norm_rope
    pdl: bool = False  # enable_pdl=True: a launch hint compiled kernels may take
    mrope: bool = False  # mrope_section=: cos/sin planes [3, ...], one per modality, chosen per channel


def _user_protocol(run, supports):
    """register_backend's backends keep their six-argument run: fp32 numerics on cos/sin rows, a plain launch."""
    def user_supports(facts):
        if facts.eager or facts.table or facts.norm or facts.pdl or facts.mrope:
            return "a registered backend serves numerics='fp32' on cos/sin rows, without positions=, norm or enable_pdl"
        return supports(facts)
    return run, user_supports


REGISTRY = new_registry(OP, Facts, _user_protocol)


def _load_triton():  # Triton is optional: its kernel module is imported when the backend is first chosen
    from . import triton

    return triton.qwen3_tts_rope, None


def _cuda():  # the compiled kernel's glue, imported once a CUDA device is seen
    from . import cuda

    return cuda


REGISTRY.register(Backend("cuda", supports=lambda facts: _cuda().supports(facts), load=lambda: _cuda().load(),
                          available=lambda device: cuda_toolkit_reason(device) or _cuda().available(device),
                          opt_in=lambda facts: _cuda().opt_in(facts)))
REGISTRY.register(Backend("triton", available=triton_available, load=_load_triton))
REGISTRY.register(Backend("reference", reference.qwen3_tts_rope))


# -- the call description -------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Modes:
    """What a call asks beyond fp32 math on cos/sin rows, one named field per mode (None for a plain call:
    :func:`describe`). :class:`Facts` derives from it; a built-in backend's ``run`` takes :meth:`run_args`."""

    positions: Optional[torch.Tensor] = None  # cos/sin are tables read at these positions
    numerics: str = "fp32"
    q_norm_weight: Optional[torch.Tensor] = None  # qwen3_tts_qk_norm_rope
    k_norm_weight: Optional[torch.Tensor] = None
    eps: float = 0.0
    enable_pdl: Optional[bool] = None
    mrope_section: Optional[tuple] = None  # (t, h, w): the channels of each plane of [3, ...] cos/sin
    mrope_interleaved: bool = False

    def tensors(self) -> dict:
        """The tensors among the modes, by argument name."""
        return {n: t for n, t in (("positions", self.positions), ("q_norm_weight", self.q_norm_weight),
                                  ("k_norm_weight", self.k_norm_weight)) if t is not None}

    def run_args(self) -> tuple:
        """A built-in backend's run arguments after the outputs (the multimodal ones only where given: the
        backends that serve ``Facts.mrope`` take them)."""
        return (self.positions, self.numerics == "eager", self.q_norm_weight, self.k_norm_weight, float(self.eps),
                self.enable_pdl is True) + (
            () if self.mrope_section is None else (tuple(self.mrope_section), self.mrope_interleaved is True))

    def op_args(self) -> tuple:
        """The torch op's arguments after ``backend`` (the compiled checks take the first six)."""
        return (self.positions, self.numerics, self.q_norm_weight, self.k_norm_weight, self.eps, self.enable_pdl,
                self.mrope_section, self.mrope_interleaved)


PLAIN = Modes()


def describe(positions=None, numerics="fp32", q_norm_weight=None, k_norm_weight=None, eps=0.0, enable_pdl=None,
             mrope_section=None, mrope_interleaved=False):
    """The one normaliser of a call's modes: None for a plain call (the hot path), else its :class:`Modes`."""
    if positions is None and numerics == "fp32" and q_norm_weight is None and enable_pdl is None \
            and mrope_section is None and mrope_interleaved is False:
        return None
    return Modes(positions, numerics, q_norm_weight, k_norm_weight, eps, enable_pdl, mrope_section, mrope_interleaved)


# -- validation ----------------------------------------------------------------------------------------------
def validate(q, k, cos, sin, inplace: bool = False, modes: Optional[Modes] = None, traced: bool = False) -> Facts:
    """Check the inputs (and, for ``inplace``, that q and k can be written); return the selection key, the
    call's :class:`Facts`. Valid inputs take the compiled checks where they are built (``tts_facts``, the only
    fast accept path); the others, and every call without a build, :func:`diagnose`, which raises the precise
    error or accepts. ``traced``: Dynamo traces this call, whose tensors have no memory to read."""
    m = modes or PLAIN
    inplace = inplace is True
    mrope = m.mrope_section is not None or m.mrope_interleaved is not False
    key = None if traced or mrope else fast_checks.checks.tts_facts(Facts, q, k, cos, sin, inplace, *m.op_args()[:6])
    if key is None:
        diagnose(q, k, cos, sin, m, traced)  # a valid tensor subclass (FakeTensor, Parameter) passes
        key = Facts(q.device, q.dtype, q.shape[3], inplace, m.numerics == "eager", m.positions is not None,
                    m.q_norm_weight is not None, m.enable_pdl is True, mrope)
    if m.positions is not None and getenv(V.ENV_CHECK_POSITIONS).lower() not in V.SWITCH_OFF:
        V.check_positions_on_host(OP, m.positions, cos.shape[0])
    if inplace:
        _check_inplace(q, k, cos, sin, m.tensors())
    return key


def diagnose(q, k, cos, sin, modes: Modes, traced=False) -> None:
    """The op's one checker: the precise error, naming the argument, for inputs the compiled checks refused (or
    every call's, without a build); valid inputs and valid tensor subclasses pass."""
    positions, numerics, q_weight, k_weight, eps, pdl, section, interleaved = modes.op_args()
    if numerics not in NUMERICS:
        V.fail(OP, "numerics", "'fp32' or 'eager'", repr(numerics))
    if pdl is not None:
        V.check_bool(OP, "enable_pdl", pdl)
    V.check_bool(OP, "mrope_interleaved", interleaved)
    if interleaved and section is None:
        V.fail(OP, "mrope_interleaved", "False without mrope_section", "True")
    reference.check_shapes(q, k, cos, sin, positions=positions, planes=section is not None)
    if section is not None:
        reference.check_section(section, q.shape[3])
    V.check_dtype(OP, "q", q, DTYPES)
    V.check_same_dtype(OP, "q", q, {"k": k} if positions is not None else {"k": k, "cos": cos, "sin": sin})
    named = {"k": k, "cos": cos, "sin": sin}
    if positions is not None:
        V.check_dtype(OP, "cos", cos, (q.dtype, torch.float32))
        V.check_same_dtype(OP, "cos", cos, {"sin": sin})
        V.check_dtype(OP, "positions", positions, POSITION_DTYPES)
        named["positions"] = positions
    if q_weight is not None:
        for name, w in (("q_norm_weight", q_weight), ("k_norm_weight", k_weight)):
            V.check_tensor(OP, name, w, 1, "[D]")
            V.check_shape(OP, name, w, (q.shape[3],))
            V.check_dtype(OP, name, w, (q.dtype,))
            named[name] = w
        number = isinstance(eps, (int, float)) and not isinstance(eps, bool)  # np.float64 is a float
        if not number or not eps >= 0:
            V.fail(OP, "eps", "a float >= 0", repr(eps), ValueError if number else TypeError)
    V.check_same_device(OP, "q", q, named)
    for name, t in (("q", q), *named.items()):
        V.check_last_dim_contiguous(OP, name, t)
    if not traced:
        V.check_readable(OP, {"q": q, **named})


def _check_inplace(q, k, cos, sin, more=None) -> None:
    """What in-place writes need beyond valid inputs (``more``: other inputs by name), as torch's ops demand."""
    if 0 in q.stride() or 0 in k.stride():
        V.check_writable_no_overlap(OP, "q", q)
        V.check_writable_no_overlap(OP, "k", k)
    reads = {"cos": cos, "sin": sin, **(more or {})}
    V.check_apart(OP, {"k": k, "q": q}, reads, " for inplace=True")
    if V.needs_grad(q, k, *reads.values()):
        V.refuse_grad(OP, "inplace=True has", {"q": q, "k": k, **reads}, "use inplace=False")
    V.check_writable_here(OP, {"q": q, "k": k}, " (inplace=True)")


def _check_outputs(q, k, cos, sin, q_out, k_out, modes=None) -> dict:
    """Caller buffers (either or both): shaped, typed and placed like ``q`` / ``k``, writable, last dim
    contiguous, sharing no element with each other or an input. Returns them by name."""
    given = {}
    for name, out, src, src_name in (("q_out", q_out, q, "q"), ("k_out", k_out, k, "k")):
        if out is None:
            continue
        try:  # one expression for buffers that pass (as in validate); the checks one by one to name what fails
            ok = (type(out) is _Tensor and out.shape == src.shape and out.dtype is src.dtype
                  and out.device == src.device and out.stride()[3] == 1 and 0 not in out.stride() and out is not src
                  and fast_checks.checks.readable(out))
        except (AttributeError, TypeError, IndexError, RuntimeError):
            ok = False
        if not ok:
            _diagnose_output(name, out, src, src_name)
        given[name] = out
    V.check_apart(OP, given, {"q": q, "k": k, "cos": cos, "sin": sin, **(modes or PLAIN).tensors()})
    V.check_writable_here(OP, given)
    return given


def _diagnose_output(name, out, src, src_name) -> None:
    V.check_tensor(OP, name, out, 4)
    V.check_shape(OP, name, out, tuple(src.shape))
    V.check_same_dtype(OP, src_name, src, {name: out})
    V.check_same_device(OP, src_name, src, {name: out})
    V.check_last_dim_contiguous(OP, name, out)
    V.check_writable_no_overlap(OP, name, out)
    V.check_readable(OP, {name: out})
    if out is src:
        V.fail(OP, name, f"a buffer apart from '{src_name}' (inplace=True writes into q and k)",
               f"'{src_name}' itself")


def _check_call(q, k, cos, sin, inplace, q_out, k_out, modes=None, traced: bool = False) -> tuple:
    """The checks of a call in place or with buffers that come before choosing a backend (the buffers' own come
    after, :func:`_check_outputs`); returns the selection key (``traced``: as for :func:`validate`)."""
    if inplace is not False and inplace is not True:
        V.check_bool(OP, "inplace", inplace)
    if q_out is None and k_out is None:
        return validate(q, k, cos, sin, inplace, modes, traced)
    if inplace:
        V.fail(OP, "q_out" if q_out is not None else "k_out", "None with inplace=True (which writes into q and k)",
               "a tensor")
    mine = (modes or PLAIN).tensors()
    if V.needs_grad(q, k, cos, sin, q_out, k_out, *mine.values()):  # torch's out= refuses autograd too
        V.refuse_grad(OP, "q_out= / k_out= have", dict(q=q, k=k, cos=cos, sin=sin, q_out=q_out, k_out=k_out, **mine),
                      "without buffers")
    return validate(q, k, cos, sin, False, modes, traced)


# -- the public function ----------------------------------------------------------------------------------------
_CONTIGUOUS = torch.contiguous_format


def _new_out(t: torch.Tensor) -> torch.Tensor:
    return _empty_like(t, memory_format=_CONTIGUOUS)


def _into_new_outputs(impl: Backend, q, k, cos, sin, modes=None, alloc: bool = True):
    """New contiguous outputs written by ``impl``; allocated by its compiled op where it has one and ``alloc`` (in
    C++: two Python calls fewer; not for inputs that require grad, whose outputs would get an autograd
    placeholder). Nothing runs for empty inputs."""
    work = q.numel() or k.numel()
    if alloc and work and impl.run_alloc is not None and modes is None:
        return impl.run_alloc(q, k, cos, sin)
    q_out, k_out = _new_out(q), _new_out(k)
    if work:
        impl.run(q, k, cos, sin, q_out, k_out, *(modes.run_args() if modes else ()))
    return q_out, k_out


def qwen3_tts_rope(q, k, cos, sin, *, numerics: str = "fp32", positions=None, inplace: bool = False, q_out=None,
                   k_out=None, backend: str = "auto", enable_pdl=None, mrope_section=None, mrope_interleaved=False):
    """NeoX (rotate_half) RoPE on standalone query and key tensors, fused into one launch.

    Computes, per row ``x`` of length ``D`` with ``h = D/2``::

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
        ``[B, S, D]`` or ``[1, S, D]`` (broadcast over the batch), both the same shape, dtype and device. With
        ``positions``: tables ``[max_pos, D]`` in q's dtype or fp32, read at each token's position. With
        ``mrope_section``: ``[3, B or 1, S, D]``, one plane per modality, as Qwen3-TTS's talker has them.
    numerics : {"fp32", "eager"}, default "fp32"
        ``"fp32"``: fp32 math, one rounding (RNE) to the dtype. ``"eager"``: bit-identical to PyTorch evaluating
        the formula in q's dtype, as Hugging Face and qwen-tts do (each product rounded, then the sum; no FMA;
        an fp32 table rounded to the dtype first); a NaN gives NaN, its sign and payload not guaranteed.
    positions : torch.Tensor, optional
        ``[B, S]`` or ``[S]`` (``[3, B, S]`` or ``[3, S]`` with ``mrope_section``), int32 / int64. Out-of-range
        positions are clamped to ``[0, max_pos)``; ``FUSEDROPE_CHECK_POSITIONS=1`` raises instead (synchronises).
    inplace : bool, default False
        Write the results into ``q`` and ``k`` through their own strides and return them.
    q_out, k_out : torch.Tensor, optional
        Buffers to write the results into (either or both; the other is allocated), shaped, typed and placed
        like ``q`` / ``k``, any strides with the last one 1, sharing no memory with an input: e.g. ``k_out`` a
        slice of a static KV cache, so rotated keys land there without a copy. Not with ``inplace=True``, and,
        as torch's ``out=``, not with grad mode on and an input or buffer that requires grad.
    backend : str, default "auto"
        ``"auto"``, ``"cuda"``, ``"triton"``, ``"reference"`` or one of yours
        (:func:`fusedrope.register_backend`). ``auto`` honours ``FUSEDROPE_BACKEND``. The cuda kernels of
        ``numerics="eager"``, ``positions`` and the norm run only when named (kernels_cuda/README.md says why).
    enable_pdl : bool, optional
        ``True``: launch the cuda kernel as a programmatic dependent launch (sm_90+; other backends ignore it);
        ``None`` (default) and ``False``: a plain launch.
    mrope_section : sequence of three ints, optional
        Multimodal RoPE (qwen-tts's ``apply_multimodal_rotary_pos_emb``): ``(t, h, w)``, summing to ``D/2``, the
        channels that read each plane of cos/sin. Contiguous: channel ``c`` and ``c + D/2`` read plane 0 for
        ``c < t``, 1 for ``c < t + h``, else 2. The plane is chosen per channel in the kernel; nothing is gathered.
    mrope_interleaved : bool, default False
        Interleaved sections: channel ``j < D/2`` reads plane ``j % 3`` where ``j < 3 * section[j % 3]`` (planes 1
        and 2), else plane 0, and channel ``j + D/2`` the same value as channel ``j``.

    Returns
    -------
    (q_out, k_out) : tuple of torch.Tensor
        New contiguous tensors shaped like ``q`` and ``k``, or the buffers passed, or ``q`` and ``k``
        themselves when ``inplace``.

    Raises
    ------
    ValueError, TypeError
        Bad shapes, strides, dtypes or devices, a flag that is not a bool, or a tensor whose memory does not hold
        its values (a negative view, a ZeroTensor, a ``torch.func`` wrapper); the message names the argument.
    fusedrope.BackendUnavailableError
        An explicitly requested backend cannot run these inputs.
    RuntimeError
        ``inplace=True`` or buffers with grad mode on and a tensor that requires grad, a forward-mode AD dual
        tensor, or writing into an inference tensor outside ``torch.inference_mode()``.

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
    if inplace is False and q_out is None and k_out is None and positions is None and numerics == "fp32" \
            and enable_pdl is None and mrope_section is None and mrope_interleaved is False and not _is_compiling():
        fast = fast_checks.checks.qwen3_tts_rope(Facts, q, k, cos, sin)  # valid, work to do, no grad to keep
        if fast is not None:
            key, q_out, k_out = fast
            REGISTRY.select(key, backend).run(q, k, cos, sin, q_out, k_out)
            return q_out, k_out
        key = validate(q, k, cos, sin)
        if not (q.requires_grad or k.requires_grad or cos.requires_grad or sin.requires_grad) or not _grad_enabled():
            return _into_new_outputs(REGISTRY.select(key, backend), q, k, cos, sin)
    return _call(q, k, cos, sin, describe(positions, numerics, None, None, 0.0, enable_pdl, mrope_section,
                                          mrope_interleaved), inplace, q_out, k_out, backend)


def _call(q, k, cos, sin, modes: Optional[Modes], inplace, q_out, k_out, backend):
    """Both public functions past qwen3_tts_rope's hot path."""
    new = inplace is False and q_out is None and k_out is None
    inputs = {"q": q, "k": k, "cos": cos, "sin": sin, **(modes or PLAIN).tensors()}
    grad = V.needs_grad(*inputs.values())
    if not _is_compiling():
        if not new:
            return _run(q, k, cos, sin, inplace, q_out, k_out, backend, modes)
        out = _into_new_outputs(REGISTRY.select(validate(q, k, cos, sin, False, modes), backend), q, k, cos, sin,
                                modes, not grad)
        return V.NoDerivative.apply(OP, *out, *inputs.values()) if grad else out
    # Traced: the torch op, whose fake validates; storage overlap cannot be traced here, so the cheap checks
    # eager gives first come first.
    if inplace is not False and inplace is not True:
        V.check_bool(OP, "inplace", inplace)
    if inplace and q_out is None and k_out is None:
        V.refuse_grad(OP, "inplace=True has", inputs, "use inplace=False")
        q_out, k_out = q, k
    else:
        _check_call(q, k, cos, sin, inplace, q_out, k_out, modes, True)
        if new and grad:  # eager's V.NoDerivative, which Dynamo cannot trace: refused when traced
            V.refuse_grad(OP, "torch.compile of this op has", inputs, "detach the inputs")
        q_out = _new_out(q) if q_out is None else q_out
        k_out = _new_out(k) if k_out is None else k_out
    # plain calls pass no modes: a float eps in a dynamic graph restarts tracing
    torch.ops.fusedrope.qwen3_tts_rope_out(q, k, cos, sin, q_out, k_out, backend, *(modes.op_args() if modes else ()))
    return q_out, k_out


def _run(q, k, cos, sin, inplace, q_out, k_out, backend, modes=None):
    """In place, or into the caller's buffers (eager; also what the torch op runs)."""
    impl = REGISTRY.select(_check_call(q, k, cos, sin, inplace, q_out, k_out, modes), backend)
    if inplace:
        q_out, k_out = q, k
    else:
        _check_outputs(q, k, cos, sin, q_out, k_out, modes)
    written = (q, k) if inplace else tuple(t for t in (q_out, k_out) if t is not None)
    q_out = _new_out(q) if q_out is None else q_out
    k_out = _new_out(k) if k_out is None else k_out
    if q.numel() or k.numel():
        impl.run(q, k, cos, sin, q_out, k_out, *(modes.run_args() if modes else ()))
        increment_version(written)  # written through raw pointers: saved copies are now stale
    return q_out, k_out


# -- the torch op: opaque to torch.compile, capturable in CUDA graphs ------------------------------------------
# It writes into q_out and k_out, which are q and k themselves for inplace=True (as flashinfer's rope ops do);
# the modes follow ``backend`` as Modes.op_args gives them.
_Opt = Optional[torch.Tensor]


@torch.library.custom_op("fusedrope::qwen3_tts_rope_out", mutates_args=("q_out", "k_out"))
def _op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_out: torch.Tensor,
        k_out: torch.Tensor, backend: str = "auto", positions: _Opt = None, numerics: str = "fp32",
        q_weight: _Opt = None, k_weight: _Opt = None, eps: float = 0.0, pdl: Optional[bool] = None,
        mrope_section: Optional[list[int]] = None, mrope_interleaved: bool = False) -> None:
    for name, t in (("q_out", q_out), ("k_out", k_out)):
        V.check_tensor(OP, name, t)  # the schema says Tensor, but Python passes None through
    modes = describe(positions, numerics, q_weight, k_weight, eps, pdl, mrope_section, mrope_interleaved)
    if q_out is q and k_out is k:
        _run(q, k, cos, sin, True, None, None, backend, modes)
    elif q_out is q or k_out is k:  # one in place: functionalization may hand one output over as its input
        new = _run(q, k, cos, sin, False, None if q_out is q else q_out, None if k_out is k else k_out, backend,
                   modes)
        (q, k)[k_out is k].copy_(new[k_out is k])
    else:
        _run(q, k, cos, sin, False, q_out, k_out, backend, modes)


@_op.register_fake
def _op_fake(q, k, cos, sin, q_out, k_out, backend="auto", positions=None, numerics="fp32", q_weight=None,
             k_weight=None, eps=0.0, pdl=None, mrope_section=None, mrope_interleaved=False):
    modes = describe(positions, numerics, q_weight, k_weight, eps, pdl, mrope_section, mrope_interleaved)
    validate(q, k, cos, sin, False, modes, True)
    _check_outputs(q, k, cos, sin, None if q_out is q else q_out, None if k_out is k else k_out, modes)
