"""qwen3_tts_rope in Triton: NeoX (rotate_half) RoPE on standalone Q and K, both in one launch.

One program owns one token (b, s): it loads the token's cos and sin rows once (both halves, which may
differ) and applies them to all Hq query heads and all Hkv key heads, BLOCK_H heads of each at a time, all
loads of a tile before its stores. Each head row is read as two contiguous halves of D/2 elements, so
accesses along D are 16-byte vectors when the strides allow it. Math is fp32 with one RNE rounding to the
output dtype.
"""

import triton
import triton.language as tl

from .._triton import INTERPRETED, WARP_SIZE, launch_lock, round_to, to_f32
from .._validation import check_aligned


@triton.jit
def _load_heads(x_ptr, x_off, h, n_heads, x_sh, d, d_mask, HALF: tl.constexpr, EXACT: tl.constexpr):
    m = (h < n_heads)[:, None] & d_mask[None, :]
    src = x_ptr + x_off + h[:, None] * x_sh + d[None, :]
    return to_f32(tl.load(src, mask=m), EXACT), to_f32(tl.load(src + HALF, mask=m), EXACT), m


@triton.jit
def _store_rotated(o_ptr, o_off, h, o_sh, x1, x2, m, c1, c2, s1, s2, d, HALF: tl.constexpr, EXACT: tl.constexpr):
    o1 = x1 * c1[None, :] - x2 * s1[None, :]
    o2 = x2 * c2[None, :] + x1 * s2[None, :]
    dst = o_ptr + o_off + h[:, None] * o_sh + d[None, :]
    tl.store(dst, round_to(o1, o_ptr.dtype.element_ty, EXACT), mask=m)
    tl.store(dst + HALF, round_to(o2, o_ptr.dtype.element_ty, EXACT), mask=m)


@triton.jit
def _tts_rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    S, HQ, HKV, H_MAX,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
    c_sb, c_ss, s_sb, s_ss,
    qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,
    HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, EXACT: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S
    s = tok % S
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HALF
    cp = cos_ptr + b * c_sb + s * c_ss + d
    sp = sin_ptr + b * s_sb + s * s_ss + d
    c1 = to_f32(tl.load(cp, mask=d_mask), EXACT)
    c2 = to_f32(tl.load(cp + HALF, mask=d_mask), EXACT)
    s1 = to_f32(tl.load(sp, mask=d_mask), EXACT)
    s2 = to_f32(tl.load(sp + HALF, mask=d_mask), EXACT)
    q_off, qo_off = b * q_sb + s * q_ss, b * qo_sb + s * qo_ss
    k_off, ko_off = b * k_sb + s * k_ss, b * ko_sb + s * ko_ss
    # Q's and K's tiles of the same heads are loaded before either is stored: the stores may alias the loads
    # (inplace), so the compiler keeps program order, and loading K after storing Q would cost a second memory
    # round trip in every program. Up to BLOCK_H heads of each (all of them in every seed shape) take one round
    # trip; past H_MAX = max(HQ, HKV) the masks are all false.
    for h0 in range(0, H_MAX, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        q1, q2, qm = _load_heads(q_ptr, q_off, h, HQ, q_sh, d, d_mask, HALF, EXACT)
        k1, k2, km = _load_heads(k_ptr, k_off, h, HKV, k_sh, d, d_mask, HALF, EXACT)
        _store_rotated(qo_ptr, qo_off, h, qo_sh, q1, q2, qm, c1, c2, s1, s2, d, HALF, EXACT)
        _store_rotated(ko_ptr, ko_off, h, ko_sh, k1, k2, km, c1, c2, s1, s2, d, HALF, EXACT)


def launch_shape(hq: int, hkv: int, head_dim: int, warp_size: int = WARP_SIZE) -> tuple[int, int, int]:
    """``(BLOCK_D, BLOCK_H, num_warps)``: up to 2K elements per half-tile, so 32 heads of D=128 (every seed
    shape, wide_heads included) take one pass, and warps sized so each thread owns 8 elements of a half-tile,
    a 16-byte vector of bf16/fp16."""
    block_d = triton.next_power_of_2(head_dim // 2)
    block_h = max(1, min(triton.next_power_of_2(max(hq, hkv, 1)), max(1, 2048 // block_d)))
    return block_d, block_h, max(1, min(8, block_h * block_d // (8 * warp_size)))


def qwen3_tts_rope(q, k, cos, sin, q_out, k_out) -> None:
    check_aligned("qwen3_tts_rope", {"q": q, "k": k, "cos": cos, "sin": sin, "q_out": q_out, "k_out": k_out})
    B, HQ, S, D = q.shape
    HKV = k.shape[1]
    half = D // 2
    block_d, block_h, num_warps = launch_shape(HQ, HKV, D)
    # cos/sin broadcast over the batch: stride 0 re-reads batch 0.
    c_sb = cos.stride(0) if cos.shape[0] > 1 else 0
    s_sb = sin.stride(0) if sin.shape[0] > 1 else 0
    with launch_lock():
        _tts_rope_kernel[(B * S,)](
            q, k, cos, sin, q_out, k_out,
            S, HQ, HKV, max(HQ, HKV),
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            c_sb, cos.stride(1), s_sb, sin.stride(1),
            q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
            HALF=half, BLOCK_D=block_d, BLOCK_H=block_h, EXACT=INTERPRETED, num_warps=num_warps,
        )
