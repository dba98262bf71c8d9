"""qwen3_tts_rope in plain PyTorch, written to be read: the ``reference`` backend (its float64 oracle is
:func:`fusedrope.reference.qwen3_tts_rope_oracle`)."""

from __future__ import annotations

import torch

from .. import _validation as V

OP = "qwen3_tts_rope"


def check_shapes(q, k, cos, sin, op: str = OP, positions=None, planes: bool = False) -> None:
    """The op's shape contract, which the public function and the oracle both demand: ``q [B, Hq, S, D]``,
    ``k [B, Hkv, S, D]``, ``D`` even; ``cos`` and ``sin [B or 1, S, D]``, or with ``positions`` (``[B, S]`` or
    ``[S]``) tables ``[max_pos, D]``. ``planes`` (multimodal RoPE): cos/sin ``[3, B or 1, S, D]``, or positions
    ``[3, B, S]`` or ``[3, S]``."""
    V.check_tensor(op, "q", q, 4, "[B, Hq, S, D]")
    V.check_tensor(op, "k", k, 4, "[B, Hkv, S, D]")
    B, _, S, D = q.shape
    if D < 2 or D % 2:
        V.fail(op, "q", "an even head_dim D >= 2 (last dim)", f"D={D}")
    V.check_shape(op, "k", k, (B, None, S, D), ("B", "Hkv"))
    lead = (3,) if planes else ()
    if positions is not None:
        V.check_tensor(op, "positions", positions, None)
        if tuple(positions.shape) not in ((*lead, B, S), (*lead, S)):
            p = "3, " if planes else ""
            V.fail(op, "positions", f"shape [{p}{B}, {S}] or [{p}{S}]" + (" (one row per plane)" if planes else ""),
                   V.shape_str(positions.shape))
        V.check_tensor(op, "cos", cos, 2, "[max_pos, D] (a table, with positions=)")
        V.check_tensor(op, "sin", sin, 2, "[max_pos, D] (a table, with positions=)")
        V.check_shape(op, "cos", cos, (max(cos.shape[0], 1), D))  # a table of at least one position
        V.check_shape(op, "sin", sin, tuple(cos.shape))
        return
    want = "[3, B or 1, S, D] (one plane per modality)" if planes else "[B or 1, S, D]"
    V.check_tensor(op, "cos", cos, 3 + planes, want)
    V.check_tensor(op, "sin", sin, 3 + planes, want)
    b = cos.shape[planes]
    if b not in (1, B) or cos.shape[:planes] != lead:
        V.fail(op, "cos", f"shape [{'3, ' if planes else ''}{B if B == 1 else f'{B} or 1'}, {S}, {D}]",
               V.shape_str(cos.shape))
    V.check_shape(op, "cos", cos, (*lead, b, S, D))
    V.check_shape(op, "sin", sin, tuple(cos.shape))


def check_section(section, head_dim: int, op: str = OP) -> None:
    """``mrope_section``: three ints >= 0 summing to ``head_dim / 2``, the channels of each plane."""
    ok = isinstance(section, (list, tuple)) and len(section) == 3 and all(type(n) is int and n >= 0 for n in section)
    if not ok or sum(section) != head_dim // 2:
        V.fail(op, "mrope_section", f"three ints >= 0 (t, h, w) summing to D/2={head_dim // 2}", repr(section))


def multimodal_rows(cos: torch.Tensor, sin: torch.Tensor, section, interleaved: bool) -> tuple:
    """The ``[..., D]`` rows qwen-tts's ``apply_multimodal_rotary_pos_emb`` applies, from planes ``[3, ..., D]``
    (temporal, height, width), written as the model writes them. Contiguous sections: channel block ``i`` of
    ``section * 2`` takes plane ``i % 3``. Interleaved: channel ``j < D/2`` takes plane 1 where ``j % 3 == 1`` and
    ``j < 3h``, plane 2 where ``j % 3 == 2`` and ``j < 3w``, else plane 0, and the second half repeats the first."""
    def rows(x):
        if not interleaved:
            return torch.cat([m[i % 3] for i, m in enumerate(x.split(list(section) * 2, dim=-1))], dim=-1)
        x = x[..., : x.shape[-1] // 2]
        first = x[0].clone()
        for i in (1, 2):
            first[..., i: 3 * section[i]: 3] = x[i, ..., i: 3 * section[i]: 3]
        return torch.cat([first, first], dim=-1)
    return rows(cos), rows(sin)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(-x[..., h:], x[..., :h])`` along the last dim, ``h = D/2`` (the NeoX / Hugging Face helper)."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def neox_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x: [B, H, S, D]`` and ``cos, sin: [B or 1, S, D]``, computed in
    and returned as ``compute_dtype`` (a new ``[B, H, S, D]`` tensor)."""
    x = x.to(compute_dtype)
    cos = cos.to(compute_dtype).unsqueeze(1)  # broadcast over heads
    sin = sin.to(compute_dtype).unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def rows_of(cos, sin, positions, dtype: torch.dtype, planes: bool = False) -> tuple:
    """``cos``/``sin`` tables ``[max_pos, D]`` gathered at ``positions`` (clamped to ``[0, max_pos)``), as
    ``[B or 1, S, D]`` in ``dtype`` (``planes``: positions ``[3, B or 1, S]`` give ``[3, B or 1, S, D]``)."""
    p = positions.long().clamp(0, cos.shape[0] - 1)
    p = p if p.dim() == 2 + planes else p.unsqueeze(-2)
    return cos[p].to(dtype), sin[p].to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3(-TTS)'s RMSNorm over the last dim, as the model computes it: fp32 variance, the normalised value
    rounded to ``x``'s dtype, then times ``weight``."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def qwen3_tts_rope(q, k, cos, sin, q_out, k_out, positions=None, eager: bool = False, q_weight=None, k_weight=None,
                   eps: float = 0.0, pdl: bool = False, mrope_section=None, mrope_interleaved: bool = False) -> None:
    """Reference backend: ``out = x * cos + rotate_half(x) * sin`` (:func:`neox_rope`) for every row ``x`` of
    ``q [B, Hq, S, D]`` and ``k [B, Hkv, S, D]``, written into ``q_out`` / ``k_out`` (which may be q and k)
    through their strides. ``cos``/``sin`` are ``[B or 1, S, D]``, or tables read at ``positions``
    (:func:`rows_of`). fp32 math rounded once (RNE) to the dtype; with ``eager``, the formula in the dtype (each
    product and the sum rounded: Hugging Face's numerics). ``q_weight``/``k_weight``: :func:`rms_norm` first. ``pdl``
    (a launch hint) means nothing here. ``mrope_section``: cos/sin (or positions) hold three planes, from which
    each channel's rows are chosen (:func:`multimodal_rows`).

    Examples
    --------
    >>> import torch
    >>> from fusedrope.reference import qwen3_tts_rope
    >>> from fusedrope.testing import qwen3_tts_cos_sin
    >>> q = torch.randn(1, 4, 8, 64, dtype=torch.bfloat16)
    >>> k = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    >>> cos, sin = qwen3_tts_cos_sin(torch.arange(8)[None], head_dim=64)  # [1, 8, 64] bf16 each
    >>> q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    >>> qwen3_tts_rope(q, k, cos, sin, q_out, k_out)
    >>> q_out.shape, k_out.shape, k_out.dtype
    (torch.Size([1, 4, 8, 64]), torch.Size([1, 2, 8, 64]), torch.bfloat16)
    >>> torch.equal(q_out[:, :, 0], q[:, :, 0])  # position 0: cos 1, sin 0
    True
    """
    dtype = q.dtype if eager else torch.float32
    planes = mrope_section is not None
    if positions is not None:  # eager: the table is rounded to q's dtype first, as the model's rotary module does
        cos, sin = rows_of(cos, sin, positions, q.dtype if eager else cos.dtype, planes)
    if planes:
        cos, sin = multimodal_rows(cos, sin, mrope_section, mrope_interleaved)
    if q_weight is not None:
        q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    q_out.copy_(neox_rope(q, cos, sin, dtype))
    k_out.copy_(neox_rope(k, cos, sin, dtype))
