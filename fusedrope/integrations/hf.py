"""fusedrope for Hugging Face-style modeling code: transformers' Qwen3 and the qwen-tts package's Qwen3-TTS.

* :func:`apply_rotary_pos_emb`: the modeling files' function of that name, bit-identical, in one launch.
* :func:`patch_qk_norm_rope`: one call that makes a model's attention blocks run ``q_norm``, ``k_norm`` and the
  RoPE as :func:`fusedrope.qwen3_tts_qk_norm_rope` (one launch); ``.remove()`` undoes it.

Both keep the model's numerics (``numerics="eager"``). Where fusedrope cannot serve a call (other shapes or mixed
dtypes, or autograd: the fused ops have no backward), the model's own code runs instead.
"""

from __future__ import annotations

import contextvars
import sys
from dataclasses import dataclass, field

import torch

from .. import qwen3_tts_rope
from ..qwen3_tts_rope.modes import qwen3_tts_qk_norm_rope

__all__ = ["apply_rotary_pos_emb", "patch_qk_norm_rope", "Patch"]


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _eager(q, k, cos, sin, unsqueeze_dim):
    """The modeling files' own formula."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _heads_dim(q, k, cos, unsqueeze_dim):
    """Where the heads are in q/k (1: ``[B, H, S, D]``, 2: ``[B, S, H, D]``) when fusedrope can serve the call."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(cos, torch.Tensor)):
        return None
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or not isinstance(unsqueeze_dim, int):
        return None
    heads = unsqueeze_dim % 4 if -4 <= unsqueeze_dim < 4 else None
    return heads if heads in (1, 2) else None


def _autograd(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, *, backend: str = "auto"):
    """Hugging Face's ``apply_rotary_pos_emb`` (Qwen3, Qwen3-TTS, Llama family), bit-identical, one launch.

    ``q * cos + rotate_half(q) * sin`` (and the same for ``k``) evaluated as PyTorch evaluates it in the
    tensors' dtype: :func:`fusedrope.qwen3_tts_rope` with ``numerics="eager"``.

    Parameters
    ----------
    q, k : torch.Tensor
        ``[B, H, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, H, D]`` (``unsqueeze_dim=2``); any strides with the
        last one 1, e.g. the transposed projection.
    cos, sin : torch.Tensor
        ``[B or 1, S, D]``, q's dtype, as the model's rotary embedding returns them.
    position_ids : ignored
        Kept for the older signature (transformers 4.x, qwen-tts), where it is unused too.
    unsqueeze_dim : int, default 1
        The dim of q/k that holds the heads, as in Hugging Face.
    backend : str, default "auto"
        As for :func:`fusedrope.qwen3_tts_rope`.

    Returns
    -------
    (q_embed, k_embed) : tuple of torch.Tensor
        Shaped like ``q`` and ``k``. Calls fusedrope cannot serve (other shapes, mixed dtypes, autograd) get the
        formula in PyTorch, i.e. exactly Hugging Face's result.

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
    heads = _heads_dim(q, k, cos, unsqueeze_dim)
    dtypes = {getattr(t, "dtype", None) for t in (q, k, cos, sin)}
    if heads is None or len(dtypes) != 1 or _autograd(q, k, cos, sin):
        return _eager(q, k, cos, sin, unsqueeze_dim)
    if heads == 2:
        q_out, k_out = qwen3_tts_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin, numerics="eager",
                                      backend=backend)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return qwen3_tts_rope(q, k, cos, sin, numerics="eager", backend=backend)


# -- patching a model ----------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Block:
    """One patched attention block while its forward runs: which norms it deferred to the RoPE."""

    attn: torch.nn.Module
    backend: str
    deferred: set = field(default_factory=set)


_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("fusedrope_hf_block", default=None)
_MODULE_PATCHES: dict = {}  # modeling module name -> [its own apply_rotary_pos_emb, how many patches use it]


def _eps(norm) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _patchable(m: torch.nn.Module):
    """The modeling module of an attention block fusedrope can patch (q_norm and k_norm with a weight, and a
    module-level apply_rotary_pos_emb), else None."""
    norms = [getattr(m, n, None) for n in ("q_norm", "k_norm")]
    if not all(isinstance(getattr(n, "weight", None), torch.Tensor) for n in norms):
        return None
    module = sys.modules.get(type(m).__module__)
    return module if callable(getattr(module, "apply_rotary_pos_emb", None)) else None


class Patch:
    """What :func:`patch_qk_norm_rope` changed; ``remove()`` (or leaving a ``with`` block) restores it."""

    def __init__(self, blocks: list, modules: list):
        self.blocks, self._modules = blocks, modules

    def remove(self) -> None:
        for attn in self.blocks:
            for m in (attn, attn.q_norm, attn.k_norm):
                m.__dict__.pop("forward", None)
        for name in self._modules:
            entry = _MODULE_PATCHES[name]
            entry[1] -= 1
            if entry[1] == 0:
                sys.modules[name].apply_rotary_pos_emb = entry[0]
                del _MODULE_PATCHES[name]
        self.blocks, self._modules = [], []

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def patch_qk_norm_rope(model: torch.nn.Module, *, backend: str = "auto") -> Patch:
    """Make every attention block of ``model`` run its ``q_norm``, ``k_norm`` and RoPE as one
    :func:`fusedrope.qwen3_tts_qk_norm_rope` launch, with the model's numerics.

    Serves blocks written as transformers' ``Qwen3Attention`` and qwen-tts's ``Qwen3TTSAttention`` are: ``q_norm``
    and ``k_norm`` modules (an RMSNorm with ``weight`` and ``variance_epsilon``) applied to the projections, then
    the modeling file's ``apply_rotary_pos_emb``. Inside a patched block's forward, the norms pass their input
    through and that function applies them, fused with the RoPE; everywhere else both behave as before. Where
    fusedrope cannot serve a call (mixed dtypes, autograd) the block's own modules run.

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
    blocks = [(m, mod) for m in model.modules() if (mod := _patchable(m)) is not None]
    if not blocks:
        raise ValueError(f"patch_qk_norm_rope: argument 'model' expected a module with attention blocks that have "
                         f"q_norm and k_norm, got a {type(model).__name__} without any")
    if any("forward" in attn.__dict__ for attn, _ in blocks):
        raise ValueError("patch_qk_norm_rope: argument 'model' expected blocks not patched yet, got one whose "
                         "forward is already replaced (remove the earlier Patch first)")
    for attn, module in blocks:
        block = _Block(attn, backend)
        attn.forward = _block_forward(block, type(attn).forward.__get__(attn))
        for which in ("q", "k"):
            norm = getattr(attn, f"{which}_norm")
            norm.forward = _deferred_norm(block, which, type(norm).forward.__get__(norm))
        entry = _MODULE_PATCHES.setdefault(module.__name__, [module.apply_rotary_pos_emb, 0])
        entry[1] += 1
        module.apply_rotary_pos_emb = _fused_rope(entry[0])
    return Patch([attn for attn, _ in blocks], [module.__name__ for _, module in blocks])


def _block_forward(block: _Block, forward):
    def patched_forward(*args, **kwargs):
        token = _ACTIVE.set(block)
        try:
            out = forward(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)
            deferred, block.deferred = block.deferred, set()
        if deferred:  # a norm passed its input through and no RoPE applied it: this forward's result is wrong
            raise RuntimeError(f"patch_qk_norm_rope: {type(block.attn).__name__}.forward applied {sorted(deferred)} "
                               f"norm(s) without calling apply_rotary_pos_emb; remove the patch for this model")
        return out
    return patched_forward


def _deferred_norm(block: _Block, which: str, forward):
    def norm_forward(x):
        if _ACTIVE.get() is block and which not in block.deferred:
            block.deferred.add(which)
            return x
        return forward(x)
    return norm_forward


def _fused_rope(original):
    def fused_apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        block = _ACTIVE.get()
        if block is None or block.deferred != {"q", "k"}:
            return original(q, k, cos, sin, *args, **kwargs)
        block.deferred = set()
        attn = block.attn
        qw, kw = attn.q_norm.weight, attn.k_norm.weight
        unsqueeze = kwargs.get("unsqueeze_dim", args[1] if len(args) > 1 else 1)
        same = len({t.dtype for t in (q, k, cos, sin, qw, kw)}) == 1
        eps = _eps(attn.q_norm)
        if (_heads_dim(q, k, cos, unsqueeze) == 1 and same and eps == _eps(attn.k_norm)
                and not _autograd(q, k, cos, sin, qw, kw)):
            return qwen3_tts_qk_norm_rope(q, k, qw, kw, cos, sin, eps, backend=block.backend)
        return _unfused(attn, original, q, k, cos, sin, args, kwargs)
    return fused_apply_rotary_pos_emb


def _unfused(attn, original, q, k, cos, sin, args, kwargs):
    """The block's own norms (over the last dim, which the transpose left in place), then its own RoPE."""
    q = type(attn.q_norm).forward(attn.q_norm, q)
    k = type(attn.k_norm).forward(attn.k_norm, k)
    return original(q, k, cos, sin, *args, **kwargs)
