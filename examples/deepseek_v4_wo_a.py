"""DeepSeek-V4 attention output -> wo_a FP8 input with ``fusedrope.inverse_rope_group_quant``.

After attention, DeepSeek-V4 rotates the rope tail of every head back (``apply_rotary_emb(o[..., -64:],
freqs_cis, inverse=True)``, i.e. multiplication by the complex conjugate) and feeds ``o`` to wo_a, an FP8 GEMM
applied per head group. The unfused path writes the rotated ``o`` back in bf16 and quantises it in a second
kernel; the fused op reads ``o`` once and writes the GEMM's inputs: ``x_fp8 [S, G, Dg]`` (e4m3 in the format
the GPU's FP8 GEMMs read: ``float8_e4m3fnuz`` on MI300 (gfx942), ``float8_e4m3fn`` elsewhere) and ``x_scale
[S, G, Dg / 128]`` (power-of-two e8m0 scales), row-major or column-major (``transpose_scale=True``, what a
preshuffled-B blockscale GEMM reads).

``wo_a_fp8_gemm`` below is a stand-in for that GEMM (dequantise, then a grouped matmul in fp32); it reads the
scales through their strides, so both layouts work unchanged. ``check`` compares it with the unfused bf16
path, and writes once more into this step's slices of persistent max-size buffers, as an engine that captures
CUDA graphs per batch size would.

Run: ``python examples/deepseek_v4_wo_a.py`` (CPU works: Triton then runs in its interpreter).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU: Triton kernels only run in the interpreter

import fusedrope  # noqa: E402
from fusedrope._device import native_fp8_dtype  # noqa: E402
from fusedrope.testing import deepseek_rope_cache  # noqa: E402

HEAD_DIM, ROPE_DIM, QUANT_GROUP = 512, 64, 128
FP8_UNIT_ROUNDOFF = 2.0**-4  # e4m3: 3 mantissa bits
GEMM_REL_TOL = 2.0**-4  # stated tolerance of the FP8 path against the bf16 path (relative Frobenius norm)


def inverse_rope_bf16(o, positions, cos_cache, sin_cache):
    """The unfused path's first kernel, as DeepSeek writes it: the tail as complex numbers times
    ``conj(cos + i sin)``, rounded back to o's dtype (bf16)."""
    S, H, D = o.shape
    freqs = torch.complex(cos_cache[positions[:S]].float(), sin_cache[positions[:S]].float())[:, None, :]
    out = o.clone()
    tail = torch.view_as_complex(o[..., D - ROPE_DIM:].float().reshape(S, H, -1, 2).contiguous())
    out[..., D - ROPE_DIM:] = torch.view_as_real(tail * freqs.conj()).flatten(-2).to(o.dtype)
    return out


def wo_a_bf16(o_rotated, weight):
    """wo_a on the bf16 activations: per group g, ``o[s, g] @ weight[g].T``. ``weight``: ``[G, rank, Dg]``."""
    S, G = o_rotated.shape[0], weight.shape[0]
    return torch.einsum("sgd,grd->sgr", o_rotated.reshape(S, G, -1).float(), weight.float())


def dequantize(x_fp8, x_scale):
    """``x_fp8 * scale`` per block of 128, fp32. ``x_scale`` is read through its strides (either layout)."""
    S, G, Dg = x_fp8.shape
    scale = x_scale.float()  # e8m0 -> 2^k exactly
    return (x_fp8.float().view(S, G, -1, QUANT_GROUP) * scale[..., None]).view(S, G, Dg)


def wo_a_fp8_gemm(x_fp8, x_scale, weight):
    """Stand-in for the FP8 blockscale GEMM that consumes the op's outputs."""
    return torch.einsum("sgd,grd->sgr", dequantize(x_fp8, x_scale), weight.float())


@torch.no_grad()
def check(num_tokens=4, num_heads=16, num_groups=2, rank=64, backend="auto", seed=0, device=None):
    """Fused op -> FP8 GEMM stand-in against the unfused bf16 path, both scale layouts; returns the errors."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    fp8 = native_fp8_dtype(torch.device(device))
    subnormal_half_step = torch.finfo(fp8).smallest_normal / 16  # subnormals: 3 bits below the smallest normal
    g = torch.Generator().manual_seed(seed)
    S, H, G = num_tokens, num_heads, num_groups
    o = torch.randn(S, H, HEAD_DIM, generator=g).to(torch.bfloat16).to(device)  # the attention output
    positions = torch.randint(0, 4096, (S,), generator=g).to(device)
    # cos/sin: strided views of one [max_pos, rope_dim] cache, as engines keep it
    cos_cache, sin_cache = deepseek_rope_cache(4096, ROPE_DIM, device=device)
    weight = (torch.randn(G, rank, H * HEAD_DIM // G, generator=g) * 0.02).to(torch.bfloat16).to(device)

    rotated = inverse_rope_bf16(o, positions, cos_cache, sin_cache)
    y_ref = wo_a_bf16(rotated, weight)
    results, first = {}, None
    for transpose_scale in (False, True):
        # Preallocated outputs, as a CUDA-graph capture needs them; quant_output_shapes gives the same shapes.
        x_fp8, x_scale = fusedrope.empty_quant_outputs(o, G, QUANT_GROUP, transpose_scale, fp8_dtype=fp8)
        assert (tuple(x_fp8.shape), tuple(x_scale.shape)) == fusedrope.quant_output_shapes(S, H, HEAD_DIM, G)
        fusedrope.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, G, QUANT_GROUP,
                                           transpose_scale, x_fp8, x_scale, backend=backend)
        # Every element within half an fp8 step of the bf16 activations (scales: powers of two >= amax/FP8_MAX).
        v = rotated.reshape(S, G, -1).float()
        scale = x_scale.float().repeat_interleave(QUANT_GROUP, dim=-1)
        half_step = torch.maximum(FP8_UNIT_ROUNDOFF * v.abs(), subnormal_half_step * scale)
        bound = half_step + 2.0**-8 * v.abs()
        assert bool(((dequantize(x_fp8, x_scale) - v).abs() <= bound).all())  # (+ bf16 rounding of `rotated`)
        y = wo_a_fp8_gemm(x_fp8, x_scale, weight)
        rel = float((y - y_ref).norm() / y_ref.norm())
        assert rel < GEMM_REL_TOL, f"FP8 wo_a differs from the bf16 path by {rel:.3e}, expected < 2^-4"
        if first is None:
            first = (x_fp8, x_scale)
        else:  # the two layouts hold the same bytes, only laid out differently
            assert torch.equal(x_fp8.view(torch.uint8), first[0].view(torch.uint8))
            assert torch.equal(x_scale.view(torch.uint8), first[1].view(torch.uint8))
            assert x_scale.stride() == (1, x_scale.shape[2] * S, S)
        results["column-major" if transpose_scale else "row-major"] = rel
    # An engine keeps one max-size pair of buffers (e.g. to capture a CUDA graph per batch size) and slices this
    # step's tokens; a column-major slice keeps the max-size token stride, which the op accepts.
    x_max, s_max = fusedrope.empty_quant_outputs(o.new_empty(4 * S, H, HEAD_DIM), G, QUANT_GROUP, True, fp8_dtype=fp8)
    x_fp8, x_scale = fusedrope.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, G, QUANT_GROUP, True,
                                                        x_max[:S], s_max[:S], backend=backend)
    assert x_scale.stride() == (1, x_scale.shape[2] * 4 * S, 4 * S)
    assert torch.equal(x_fp8.view(torch.uint8), first[0].view(torch.uint8))
    assert torch.equal(x_scale.view(torch.uint8), first[1].view(torch.uint8))
    results["backend"] = fusedrope.explain("inverse_rope_group_quant", o, positions, cos_cache, sin_cache, G,
                                           fp8_dtype=fp8, backend=backend).chosen
    return results


def main():
    r = check()
    print(f"inverse_rope_group_quant ({r['backend']} backend) -> FP8 wo_a stand-in vs the unfused bf16 path:")
    for layout in ("row-major", "column-major"):
        print(f"  {layout} scales: relative difference {r[layout]:.3e} (tolerance {GEMM_REL_TOL})")


if __name__ == "__main__":
    main()
