"""Qwen3-TTS code-predictor attention with fusedrope in place of HF's RoPE, or of its q/k norms and RoPE.

The block is written the way HF's Qwen3 attention is: q/k/v projections, per-head RMSNorm on q and k
(``q_norm``, ``k_norm``), then rotary embedding on the ``[B, H, S, D]`` views, grouped-query attention,
``o_proj``. The code predictor's attention has 16 query heads, 8 KV heads, head_dim 128 and rope_theta 1e6;
``hidden_size`` is a free parameter here. Ways to use fusedrope in such a model:

* pass ``rope=fused_apply_rotary_pos_emb`` (or assign it over the modeling file's module-level
  ``apply_rotary_pos_emb``): it has HF's signature and returns new tensors, one launch for q and k, fp32 math
  rounded once (more accurate than HF's three roundings);
* ``numerics="eager"`` (or ``fusedrope.integrations.hf.apply_rotary_pos_emb``): HF's rounding, bit for bit;
* ``fusedrope.qwen3_tts_qk_norm_rope``: ``q_norm``, ``k_norm`` and the RoPE in one launch (``forward(...,
  fused_backend=...)`` below); for a transformers or qwen-tts model, ``fusedrope.integrations.hf.patch_qk_norm_rope``
  does that without editing the modeling code;
* or call ``fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True)`` to rotate the views in place.

q and k reach the op as strided views (``q_norm(...).transpose(1, 2)``): no ``.contiguous()`` copy is needed.

Run: ``python examples/qwen3_tts_attention.py`` (CPU works: Triton then runs in its interpreter).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU: Triton kernels only run in the interpreter

import fusedrope  # noqa: E402
from fusedrope.testing import assert_tts_rope_close  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, ROPE_THETA = 16, 8, 128, 1e6
BF16_UNIT_ROUNDOFF = 2.0**-8


# -- HF's originals (transformers' Qwen3 modeling code), kept for the comparison -----------------------------
def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


# -- the replacement --------------------------------------------------------------------------------------
def fused_apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, *, backend="auto"):
    """HF's ``apply_rotary_pos_emb`` signature on ``fusedrope.qwen3_tts_rope``: q ``[B, Hq, S, D]``, k
    ``[B, Hkv, S, D]``, cos/sin ``[B or 1, S, D]``. One launch for both; fp32 math rounded once."""
    if unsqueeze_dim != 1:
        raise ValueError("fused_apply_rotary_pos_emb: unsqueeze_dim must be 1 ([B, H, S, D] q/k), "
                         f"got {unsqueeze_dim}")
    return fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)


# -- the attention block ----------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin ``[B, S, D]`` from ``emb = cat(freqs, freqs)`` in fp32, cast to the activations' dtype (HF)."""

    def __init__(self, head_dim=HEAD_DIM, theta=ROPE_THETA):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim),
                             persistent=False)

    def forward(self, x, position_ids):
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class CodePredictorAttention(nn.Module):
    def __init__(self, hidden_size, num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
                 rope=apply_rotary_pos_emb):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm, self.k_norm = RMSNorm(head_dim), RMSNorm(head_dim)
        self.rope = rope

    def project(self, hidden_states):
        """q, k, v as ``[B, H, S, D]`` views, before RoPE (what ``apply_rotary_pos_emb`` receives)."""
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_norm(self.q_proj(hidden_states).view(shape)).transpose(1, 2)
        k = self.k_norm(self.k_proj(hidden_states).view(shape)).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        return q, k, v

    def forward(self, hidden_states, position_embeddings, fused_backend=None):
        cos, sin = position_embeddings
        if fused_backend is None:
            q, k, v = self.project(hidden_states)
            q, k = self.rope(q, k, cos, sin)
        else:  # q_norm, k_norm and the RoPE in one launch, on the projections' [B, H, S, D] views
            shape = (*hidden_states.shape[:-1], -1, self.head_dim)
            q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
            k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
            v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
            q, k = fusedrope.qwen3_tts_qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, cos, sin,
                                                    self.q_norm.eps, backend=fused_backend)
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(self.num_heads // self.num_kv_heads, 1),
                                             v.repeat_interleave(self.num_heads // self.num_kv_heads, 1),
                                             is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(*hidden_states.shape[:-1], -1))


# -- the check --------------------------------------------------------------------------------------------
def hf_rounding_bound(x, cos, sin):
    """HF's bf16 formula rounds both products and the sum, fusedrope rounds once: per element they differ by
    at most ``3 u (|x cos| + |rotate_half(x) sin|)``, u = 2^-8 the bf16 unit roundoff."""
    c, s = cos.float().unsqueeze(1), sin.float().unsqueeze(1)
    return 3 * BF16_UNIT_ROUNDOFF * ((x.float() * c).abs() + (rotate_half(x.float()) * s).abs())


@torch.no_grad()
def check(batch=2, seq_len=16, hidden_size=256, backend="auto", seed=0, dtype=torch.bfloat16, device=None):
    """Run the block with HF's RoPE and with fusedrope's; return the differences (asserting the contract)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    hf = CodePredictorAttention(hidden_size).to(device, dtype)
    for norm in (hf.q_norm, hf.k_norm):  # trained norms are not the identity
        norm.weight.normal_(1.0, 0.2)
    fused = CodePredictorAttention(hidden_size, rope=lambda q, k, c, s: fused_apply_rotary_pos_emb(
        q, k, c, s, backend=backend)).to(device, dtype)
    fused.load_state_dict(hf.state_dict())
    x = torch.randn(batch, seq_len, hidden_size, device=device, dtype=dtype)
    start = torch.randint(0, 2048, (batch, 1), device=device)  # each sequence decodes at its own position
    cos, sin = RotaryEmbedding().to(device)(x, start + torch.arange(seq_len, device=device))

    q, k, _ = hf.project(x)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    q_fr, k_fr = fused_apply_rotary_pos_emb(q, k, cos, sin, backend=backend)
    # the op's contract against the float64 oracle: bf16/fp16 the exact result rounded once (<= 1 ulp, rare ties
    # aside); fp32 within two roundings of the terms' magnitude
    assert_tts_rope_close(q_fr, k_fr, q, k, cos, sin)
    for got, want, t in ((q_fr, q_hf, q), (k_fr, k_hf, k)):
        assert bool(((got.float() - want.float()).abs() <= hf_rounding_bound(t, cos, sin)).all())

    out_hf, out_fr = hf(x, (cos, sin)), fused(x, (cos, sin))
    rel = float((out_fr.float() - out_hf.float()).norm() / out_hf.float().norm())
    assert rel < 2**-6, f"attention outputs differ by {rel:.2e} (relative Frobenius), expected < 2^-6"

    # HF's own numerics: every element identical (the cuda kernel serves fp32 math only: auto picks another)
    other = "auto" if backend == "cuda" else backend
    q_eager, k_eager = fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager", backend=other)
    assert torch.equal(q_eager, q_hf) and torch.equal(k_eager, k_hf)
    # q_norm, k_norm and the RoPE in one launch: identical but where the variance's summation order differs
    out_norm_rope = hf(x, (cos, sin), fused_backend=other)
    rel_norm_rope = float((out_norm_rope.float() - out_hf.float()).norm() / out_hf.float().norm())
    assert rel_norm_rope < 2**-6, f"fused norm+rope: attention outputs differ by {rel_norm_rope:.2e}"
    return {"rope_max_abs_diff_vs_hf": float(max((q_fr.float() - q_hf.float()).abs().max(),
                                                 (k_fr.float() - k_hf.float()).abs().max())),
            "attention_output_rel_diff": rel, "norm_rope_attention_output_rel_diff": rel_norm_rope,
            "backend": fusedrope.explain("qwen3_tts_rope", q, k, cos, sin, backend=backend).chosen}


def main():
    stats = check()
    print(f"qwen3_tts_rope ({stats['backend']} backend) in a Qwen3-TTS code-predictor attention block:")
    print("  q/k within 1 ulp of the fp64 oracle; within bf16 rounding of HF's apply_rotary_pos_emb "
          f"(max |diff| {stats['rope_max_abs_diff_vs_hf']:.3g})")
    print(f"  attention output vs the HF block: relative difference {stats['attention_output_rel_diff']:.2e}")
    print("  numerics='eager': q/k identical to HF's apply_rotary_pos_emb; q_norm + k_norm + RoPE in one launch: "
          f"attention output relative difference {stats['norm_rope_attention_output_rel_diff']:.2e}")


if __name__ == "__main__":
    main()
