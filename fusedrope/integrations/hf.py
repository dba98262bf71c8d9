"""fusedrope for Hugging Face-style modeling code: transformers' Qwen3 and the qwen-tts package's Qwen3-TTS.

* :func:`apply_rotary_pos_emb`: the modeling files' function of that name, bit-identical, in one launch.
* :func:`patch_qk_norm_rope`: one call that makes a model's attention blocks run ``q_norm``, ``k_norm`` and the
  RoPE as :func:`fusedrope.qwen3_tts_qk_norm_rope` (one launch); ``.remove()`` undoes it.

Both keep the model's numerics (``numerics="eager"``): bit-identical, but for NaN, where a NaN in gives NaN out
with its sign and payload not guaranteed (the ``triton`` backend may write the canonical NaN). Where fusedrope
cannot serve a call (other shapes or mixed dtypes; autograd, forward-mode AD's dual tensors included: the fused
ops have no derivative; negative views, torch.func transforms), the model's own code runs instead.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import threading
import types
from dataclasses import dataclass, field

import torch

from .. import qwen3_tts_rope
from .._validation import BackendUnavailableError
from ..qwen3_tts_rope import REGISTRY as qwen3_tts_rope_registry, Modes, validate
from ..qwen3_tts_rope.modes import qwen3_tts_qk_norm_rope

__all__ = ["apply_rotary_pos_emb", "patch_qk_norm_rope", "Patch", "QWEN3_NORMS"]


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _eager(q, k, cos, sin, unsqueeze_dim):
    """The modeling files' own formula."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


_EAGER = Modes(numerics="eager")


def _servable(q, k, cos, sin, heads: int, modes: Modes = _EAGER, backend=None) -> bool:
    """Whether fusedrope gives the formula's result for these arguments (heads at dim ``heads``, 1 or 2): the op's
    own checks accept them with ``modes`` (``numerics="eager"``, and the norm's weights), no autograd needs
    their graph, and ``backend`` (when given) runs them."""
    try:
        if _autograd(q, k, cos, sin, *modes.tensors().values()):
            return False
        if heads == 2:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        key = validate(q, k, cos, sin, False, modes, torch.compiler.is_compiling())
    except (AttributeError, TypeError, ValueError, IndexError, RuntimeError):
        return False
    if backend is not None:  # a backend named that cannot run them: the block's own code (a bad name raises)
        try:
            qwen3_tts_rope_registry.select(key, backend)
        except BackendUnavailableError:
            return False
    return True


def _unsqueeze_dim(args: tuple, kwargs: dict) -> int:
    """``unsqueeze_dim`` from the arguments after ``sin``, in either signature: transformers 5's ``(...,
    unsqueeze_dim=1)`` or 4.x's and qwen-tts's ``(..., position_ids=None, unsqueeze_dim=1)``."""
    if "unsqueeze_dim" in kwargs:
        return kwargs["unsqueeze_dim"]
    if len(args) >= 2:
        return args[1]
    return args[0] if args and isinstance(args[0], int) else 1


def _autograd(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, *, backend: str = "auto"):
    """Hugging Face's ``apply_rotary_pos_emb`` (Qwen3, Qwen3-TTS, Llama family), bit-identical, one launch.

    ``q * cos + rotate_half(q) * sin`` (and the same for ``k``) evaluated as PyTorch evaluates it in the
    tensors' dtype: :func:`fusedrope.qwen3_tts_rope` with ``numerics="eager"``. Bit-identical but for NaN: a
    NaN in gives NaN out, its sign and payload not guaranteed (the ``triton`` backend may write the canonical NaN).

    Parameters
    ----------
    q, k : torch.Tensor
        ``[B, H, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, H, D]`` (``unsqueeze_dim=2``); any strides with the
        last one 1, e.g. the transposed projection.
    cos, sin : torch.Tensor
        ``[B or 1, S, D]``, q's dtype, as the model's rotary embedding returns them.
    position_ids : ignored
        transformers 4.x's and qwen-tts's signature, where it is unused too; an int here is transformers 5's
        positional ``unsqueeze_dim``.
    unsqueeze_dim : int, default 1
        The dim of q/k that holds the heads, as in Hugging Face.
    backend : str, default "auto"
        As for :func:`fusedrope.qwen3_tts_rope`.

    Returns
    -------
    (q_embed, k_embed) : tuple of torch.Tensor
        Contiguous, shaped like ``q`` and ``k``. Calls fusedrope cannot serve (other dtypes, mixed dtypes or
        devices, cos/sin not ``[B or 1, S, D]`` or without a contiguous last dim, autograd or forward-mode AD's
        dual tensors, negative views, torch.func transforms) get the formula in PyTorch, i.e. Hugging Face's
        result.

    Examples
    --------
    >>> import torch
    >>> from fusedrope.integrations.hf import apply_rotary_pos_emb
    >>> q, k = torch.randn(1, 4, 8, 64, dtype=torch.bfloat16), torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    >>> cos, sin = torch.randn(1, 8, 64, dtype=torch.bfloat16), torch.randn(1, 8, 64, dtype=torch.bfloat16)
    >>> q_embed, k_embed = apply_rotary_pos_emb(q, k, cos, sin, backend="reference")
    >>> torch.equal(q_embed, q * cos[:, None] + torch.cat((-q[..., 32:], q[..., :32]), -1) * sin[:, None])
    True
    """
    if isinstance(position_ids, int) and not isinstance(position_ids, bool):
        unsqueeze_dim = position_ids
    heads = unsqueeze_dim % 4 if isinstance(unsqueeze_dim, int) and -4 <= unsqueeze_dim < 4 else None
    if heads not in (1, 2) or not _servable(q, k, cos, sin, heads):
        return _eager(q, k, cos, sin, unsqueeze_dim)
    if heads == 1:
        return qwen3_tts_rope(q, k, cos, sin, numerics="eager", backend=backend)
    q_out, k_out = torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(
        k, memory_format=torch.contiguous_format)  # [B, S, H, D], as the formula returns them
    qwen3_tts_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin, numerics="eager", q_out=q_out.transpose(1, 2),
                   k_out=k_out.transpose(1, 2), backend=backend)
    return q_out, k_out


# -- patching a model ----------------------------------------------------------------------------------------
# The norms whose formula qwen3_tts_qk_norm_rope is: w * (x * rsqrt(mean(x**2) + eps)).to(dtype), per head.
QWEN3_NORMS = ("Qwen3RMSNorm", "Qwen3TTSRMSNorm")
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("fusedrope_hf_call", default=None)
_LOCK = threading.Lock()
_MODULE_PATCHES: dict = {}  # (modeling module name, rope function name) -> [its own function, how many blocks use it]
# The modeling files' RoPE functions a patched block's forward may call: the plain one, and qwen-tts's talker's.
_ROPES = ("apply_rotary_pos_emb", "apply_multimodal_rotary_pos_emb")
_SAVED = "_fusedrope_saved_forward"  # on a patched module: its own instance forward (None: its class's)
_MARK = "_fusedrope_patch"  # on a patched attention block: its _Mark


@dataclass(eq=False)
class _Call:
    """One run of a patched block's forward (per thread and task, through the context variable): which of its
    norms passed their input through for the RoPE to apply."""

    attn: torch.nn.Module
    deferred: set = field(default_factory=set)


def _eps(norm) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _modeling_module(m: torch.nn.Module):
    """``(module, name)``: the module that defines ``m``'s forward and the RoPE function of :data:`_ROPES` that
    the forward calls from it (``apply_multimodal_rotary_pos_emb`` for qwen-tts's talker blocks); else None."""
    forward = inspect.unwrap(type(m).forward)  # transformers wraps forwards (kernel hooks, kwarg deprecations)
    module = sys.modules.get(getattr(forward, "__module__", None) or type(m).__module__)
    names = getattr(getattr(forward, "__code__", None), "co_names", ())
    name = next((n for n in _ROPES if n in names and callable(getattr(module, n, None))), None)
    return None if name is None else (module, name)


def _patchable(m: torch.nn.Module):
    """:func:`_modeling_module`'s ``(module, name)`` for an attention block fusedrope can patch: ``q_norm`` and
    ``k_norm`` Qwen3 RMSNorms (:data:`QWEN3_NORMS`) over the head dim, and a forward that calls its module's RoPE
    function; else None."""
    norms = [getattr(m, n, None) for n in ("q_norm", "k_norm")]
    if not all(type(n).__name__ in QWEN3_NORMS and isinstance(getattr(n, "weight", None), torch.Tensor)
               and n.weight.dim() == 1 for n in norms) or norms[0].weight.shape != norms[1].weight.shape:
        return None
    return _modeling_module(m)


def _is_ours(m: torch.nn.Module) -> bool:
    return _SAVED in m.__dict__


class _Mark:
    """A patched block's backend and modeling module, whose RoPE function stays patched while a block
    holds a mark. A deep copy of the block (``copy.deepcopy(model)``) is patched as well, and holds a mark of its
    own: it runs fused after the original's patch is removed, until ``Patch.of(copy).remove()``."""

    def __init__(self, found: tuple, backend: str):  # under _LOCK; found: _modeling_module's (module, name)
        module, self.name = found
        self.module, self.backend = module.__name__, backend
        entry = _MODULE_PATCHES.setdefault((self.module, self.name), [getattr(module, self.name), 0])
        entry[1] += 1
        setattr(module, self.name, (_fused_mrope if self.name == _ROPES[1] else _fused_rope)(entry[0]))

    def __deepcopy__(self, memo) -> "_Mark":
        with _LOCK:
            return _Mark((sys.modules[self.module], self.name), self.backend)

    def release(self) -> None:  # under _LOCK
        entry = _MODULE_PATCHES[(self.module, self.name)]
        entry[1] -= 1
        if entry[1] == 0:
            setattr(sys.modules[self.module], self.name, entry[0])
            del _MODULE_PATCHES[(self.module, self.name)]


class Patch:
    """What :func:`patch_qk_norm_rope` changed; ``remove()`` (or leaving a ``with`` block) restores it.
    ``Patch.of(model)`` is the patch of a model's blocks, e.g. of a deep copy made while patched."""

    def __init__(self, blocks: list):
        self.blocks = blocks

    @classmethod
    def of(cls, model: torch.nn.Module) -> "Patch":
        """The patched blocks of ``model`` (none: removing it does nothing)."""
        return cls([m for m in model.modules() if _MARK in m.__dict__])

    def remove(self) -> None:
        with _LOCK:
            for attn in self.blocks:
                mark = attn.__dict__.pop(_MARK, None)
                if mark is None:  # removed already (by another Patch of the same blocks)
                    continue
                for m in (attn, attn.q_norm, attn.k_norm):
                    saved = m.__dict__.pop(_SAVED, None)
                    m.__dict__.pop("forward", None)
                    if saved is not None:  # an instance forward of its own (a hook's): back in place
                        m.__dict__["forward"] = saved
                mark.release()
            self.blocks = []

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def patch_qk_norm_rope(model: torch.nn.Module, *, backend: str = "auto") -> Patch:
    """Make every attention block of ``model`` run its ``q_norm``, ``k_norm`` and RoPE as one
    :func:`fusedrope.qwen3_tts_qk_norm_rope` launch, with the model's numerics.

    Serves blocks written as transformers' ``Qwen3Attention`` and qwen-tts's ``Qwen3TTSAttention`` and
    ``Qwen3TTSTalkerAttention`` are: ``q_norm`` and ``k_norm`` Qwen3 RMSNorms over the head dim
    (:data:`QWEN3_NORMS`) applied to the projections, then the modeling file's ``apply_rotary_pos_emb`` or, in
    qwen-tts's talker, ``apply_multimodal_rotary_pos_emb``: a whole Qwen3-TTS model takes one call. The talker's
    cos/sin ``[3, B, S, D]`` planes go to the launch as they are, with its ``mrope_section``: the kernel reads
    each channel from its plane, with no gathered copy. Inside a patched block's forward, the norms
    pass their input through and that function applies them, fused with the RoPE; everywhere else both behave as
    before. Where fusedrope cannot serve a call (other shapes, mixed dtypes or devices, autograd) and under
    ``torch.compile`` the block's own modules run. The numerics are the model's (NaN: NaN out, its sign and
    payload not guaranteed). A deep copy of the model made while patched is patched too, until
    ``Patch.of(copy).remove()``.

    Parameters
    ----------
    model : torch.nn.Module
        A model or any part of it; its blocks are found by their ``q_norm`` / ``k_norm`` children.
    backend : str, default "auto"
        As for :func:`fusedrope.qwen3_tts_qk_norm_rope`.

    Returns
    -------
    Patch
        ``.blocks`` lists the patched modules; ``.remove()`` undoes the patch, as does leaving ``with``.

    Raises
    ------
    ValueError
        ``model`` has no such block, or one of them is patched already.

    Examples
    --------
    >>> from transformers import Qwen3Config
    >>> from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention
    >>> from fusedrope.integrations.hf import patch_qk_norm_rope
    >>> attn = Qwen3Attention(Qwen3Config(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
    ...                                   head_dim=64), layer_idx=0)
    >>> with patch_qk_norm_rope(attn) as patch:
    ...     len(patch.blocks)
    1
    """
    with _LOCK:
        blocks = [(m, mod) for m in model.modules() if (mod := _patchable(m)) is not None]
        if not blocks:
            raise ValueError(f"patch_qk_norm_rope: argument 'model' expected a module with attention blocks whose "
                             f"q_norm and k_norm are {' or '.join(QWEN3_NORMS)}, got a {type(model).__name__} "
                             f"without any")
        if any(_is_ours(attn) for attn, _ in blocks):
            raise ValueError("patch_qk_norm_rope: argument 'model' expected blocks not patched yet, got one that "
                             "is (remove the earlier patch first: Patch.of(model).remove())")
        for attn, module in blocks:
            attn.__dict__[_MARK] = _Mark(module, backend)
            for m, forward in ((attn, _attention_forward), (attn.q_norm, _norm_forward),
                               (attn.k_norm, _norm_forward)):
                m.__dict__[_SAVED] = m.__dict__.get("forward")
                m.__dict__["forward"] = types.MethodType(forward, m)  # a deep copy rebinds it to the copy
    return Patch([attn for attn, _ in blocks])


def _own(m, *args, **kwargs):
    """``m``'s forward as it was before the patch."""
    saved = m.__dict__.get(_SAVED)
    return saved(*args, **kwargs) if saved is not None else type(m).forward(m, *args, **kwargs)


def _attention_forward(self, *args, **kwargs):
    if torch.compiler.is_compiling():  # traced: the block's own code (the context variable is not traceable)
        return _own(self, *args, **kwargs)
    call = _Call(self)
    token = _ACTIVE.set(call)
    try:
        out = _own(self, *args, **kwargs)
    finally:
        _ACTIVE.reset(token)
    if call.deferred:  # a norm passed its input through and no RoPE applied it: this forward's result is wrong
        raise RuntimeError(f"patch_qk_norm_rope: {type(self).__name__}.forward applied {sorted(call.deferred)} "
                           f"norm(s) without calling {self.__dict__[_MARK].name}; remove the patch for this model "
                           f"(fusedrope.integrations.hf.Patch.of(model).remove())")
    return out


def _norm_forward(self, x):
    call = None if torch.compiler.is_compiling() else _ACTIVE.get()
    if call is not None:
        which = "q" if call.attn.q_norm is self else "k" if call.attn.k_norm is self else None
        if which is not None and which not in call.deferred:
            call.deferred.add(which)
            return x
    return _own(self, x)


def _norm_rope(call, q, k, cos, sin, unsqueeze_dim, mrope_section=None, mrope_interleaved=False):
    """The deferred norms and the RoPE of a patched block as one launch, or None where fusedrope cannot serve it
    (``mrope_section``: the talker's multimodal RoPE on cos/sin planes ``[3, B, S, D]``)."""
    call.deferred = set()
    attn = call.attn
    qw, kw, eps = attn.q_norm.weight, attn.k_norm.weight, _eps(attn.q_norm)
    modes = Modes(None, "eager", qw, kw, eps, None, mrope_section, mrope_interleaved)
    backend = attn.__dict__[_MARK].backend
    if cos is not None and unsqueeze_dim == 1 and eps == _eps(attn.k_norm) and _servable(q, k, cos, sin, 1, modes,
                                                                                        backend):
        return qwen3_tts_qk_norm_rope(q, k, qw, kw, cos, sin, eps, backend=backend, mrope_section=mrope_section,
                                      mrope_interleaved=mrope_interleaved)
    return None


def _fused_rope(original):
    def fused_apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        call = None if torch.compiler.is_compiling() else _ACTIVE.get()
        if call is None or call.deferred != {"q", "k"}:
            return original(q, k, cos, sin, *args, **kwargs)
        out = _norm_rope(call, q, k, cos, sin, _unsqueeze_dim(args, kwargs))
        # else the block's own norms (over the last dim, which the transpose left in place), then its own RoPE
        return out or original(_own(call.attn.q_norm, q), _own(call.attn.k_norm, k), cos, sin, *args, **kwargs)
    return fused_apply_rotary_pos_emb


def _fused_mrope(original):
    def fused_apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, mrope_interleaved=False,
                                              unsqueeze_dim=1):
        call = None if torch.compiler.is_compiling() else _ACTIVE.get()
        if call is None or call.deferred != {"q", "k"}:
            return original(q, k, cos, sin, mrope_section, mrope_interleaved, unsqueeze_dim)
        out = _norm_rope(call, q, k, cos, sin, unsqueeze_dim, mrope_section, mrope_interleaved)
        return out or original(_own(call.attn.q_norm, q), _own(call.attn.k_norm, k), cos, sin, mrope_section,
                               mrope_interleaved, unsqueeze_dim)
    return fused_apply_multimodal_rotary_pos_emb
