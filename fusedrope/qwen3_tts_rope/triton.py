"""qwen3_tts_rope in Triton: NeoX (rotate_half) RoPE on standalone Q and K, both in one launch.

One program owns one token (b, s): it loads the token's cos and sin rows once (both halves, which may
differ; with ``TABLE``, the rows at the token's position) and applies them to all Hq query heads and all Hkv
key heads, BLOCK_HQ of Q's and BLOCK_HK of K's at a time (each a power of two covering its heads, so no masked
rows at the seed shapes), all loads of a round before its stores. Each head row is read as two
contiguous halves of D/2 elements, so accesses along D are 16-byte vectors when the strides allow it. Math is
fp32 with one RNE rounding to the output dtype; with ``EAGER``, each product and the sum are rounded to the
dtype, as PyTorch evaluates ``x * cos + rotate_half(x) * sin`` (the launch turns FMA fusion off). ``NORM``
first applies the model's per-head RMSNorm to every row. ``MROPE`` (multimodal RoPE, Qwen3-TTS's talker) reads
each channel's cos/sin from the plane its section gives it (the planes ``c_sp`` / ``s_sp`` apart, or at the
position in that plane's row of ``positions``, ``p_sp`` apart), so the selection costs a vector of plane
offsets, not a gathered copy.
"""

import triton
import triton.language as tl

from .._triton import INTERPRETED, WARP_SIZE, check_aligned, launch_lock, round_to, to_f32


@triton.jit
def _in(x, dtype: tl.constexpr, EXACT: tl.constexpr):
    """fp32 ``x`` rounded to ``dtype`` and back: one rounding of PyTorch's eager arithmetic."""
    return to_f32(round_to(x, dtype, EXACT), EXACT)


@triton.jit
def _load_heads(x_ptr, x_off, h, n_heads, x_sh, d, d_mask, w1, w2, eps, HALF: tl.constexpr, NORM: tl.constexpr,
                EXACT: tl.constexpr):
    m = (h < n_heads)[:, None] & d_mask[None, :]
    src = x_ptr + x_off + h[:, None] * x_sh + d[None, :]
    if NORM:  # masked lanes must add nothing to the sum of squares
        x1 = to_f32(tl.load(src, mask=m, other=0.0), EXACT)
        x2 = to_f32(tl.load(src + HALF, mask=m, other=0.0), EXACT)
    else:
        x1 = to_f32(tl.load(src, mask=m), EXACT)
        x2 = to_f32(tl.load(src + HALF, mask=m), EXACT)
    if NORM:  # the model's RMSNorm: fp32 mean of squares, x * rsqrt rounded to the dtype, times the weight rounded
        var = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps
        # torch.rsqrt: 1/sqrt on the CPU (what the interpreter stands for), the hardware rsqrt on GPUs
        r = (1.0 / tl.sqrt(var) if EXACT else tl.math.rsqrt(var))[:, None]
        dt: tl.constexpr = x_ptr.dtype.element_ty
        x1 = _in(w1 * _in(x1 * r, dt, EXACT), dt, EXACT)
        x2 = _in(w2 * _in(x2 * r, dt, EXACT), dt, EXACT)
    return x1, x2, m


@triton.jit
def _store_rotated(o_ptr, o_off, h, o_sh, x1, x2, m, c1, c2, s1, s2, d, HALF: tl.constexpr, EAGER: tl.constexpr,
                   EXACT: tl.constexpr):
    dt: tl.constexpr = o_ptr.dtype.element_ty
    if EAGER:
        o1 = _in(x1 * c1, dt, EXACT) - _in(x2 * s1, dt, EXACT)
        o2 = _in(x2 * c2, dt, EXACT) + _in(x1 * s2, dt, EXACT)
    else:
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
    dst = o_ptr + o_off + h[:, None] * o_sh + d[None, :]
    tl.store(dst, round_to(o1, dt, EXACT), mask=m)
    tl.store(dst + HALF, round_to(o2, dt, EXACT), mask=m)


@triton.jit
def _planes(d, SEC_T: tl.constexpr, SEC_H: tl.constexpr, HALF: tl.constexpr, MROPE: tl.constexpr):
    """The plane (0 temporal, 1 height, 2 width) channel ``d < HALF`` reads: contiguous sections (MROPE 1) by
    the section ``d`` falls in (the second half repeats the pattern), interleaved ones (MROPE 2) ``d % 3`` within
    the first ``3 * section`` channels of planes 1 and 2, else 0."""
    if MROPE == 1:
        return (d >= SEC_T).to(tl.int64) + (d >= SEC_T + SEC_H).to(tl.int64)
    m = d % 3
    inside = ((m == 1) & (d < 3 * SEC_H)) | ((m == 2) & (d < 3 * (HALF - SEC_T - SEC_H)))
    return tl.where(inside, m, 0).to(tl.int64)


@triton.jit
def _tts_rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, pos_ptr, qw_ptr, kw_ptr,
    S, HQ, HKV, ROUNDS, MAX_POS, eps,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
    c_sb, c_ss, s_sb, s_ss, p_sb, p_ss, c_sp, s_sp, p_sp,
    qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,
    HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    EAGER: tl.constexpr, TABLE: tl.constexpr,
    NORM: tl.constexpr, EXACT: tl.constexpr,
    MROPE: tl.constexpr, SEC_T: tl.constexpr, SEC_H: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S
    s = tok % S
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HALF
    plane = 0
    if MROPE:  # the plane of each channel: its cos/sin (or position) rows are that many plane strides on
        plane = _planes(d, SEC_T, SEC_H, HALF, MROPE)
    if TABLE:  # out-of-range positions are clamped, as inverse_rope_group_quant does
        if MROPE:
            row = tl.load(pos_ptr + plane * p_sp + b * p_sb + s * p_ss, mask=d_mask, other=0).to(tl.int64)
        else:
            row = tl.load(pos_ptr + b * p_sb + s * p_ss).to(tl.int64)
        row = tl.minimum(tl.maximum(row, 0), MAX_POS - 1)
        cp = cos_ptr + row * c_ss + d
        sp = sin_ptr + row * s_ss + d
    else:
        cp = cos_ptr + plane * c_sp + b * c_sb + s * c_ss + d
        sp = sin_ptr + plane * s_sp + b * s_sb + s * s_ss + d
    # the rows as [1, BLOCK_D] tiles, broadcast over the heads (with few warps a row is read an element per
    # thread and reaches the head tiles' layout through a small shared-memory exchange)
    rd, rm = d[None, :], d_mask[None, :]
    c1 = to_f32(tl.load(cp[None, :], mask=rm), EXACT)
    s1 = to_f32(tl.load(sp[None, :], mask=rm), EXACT)
    if MROPE == 2:  # interleaved: the second half repeats the first half's values
        c2, s2 = c1, s1
    else:
        c2 = to_f32(tl.load(cp[None, :] + HALF, mask=rm), EXACT)
        s2 = to_f32(tl.load(sp[None, :] + HALF, mask=rm), EXACT)
    if EAGER and TABLE:  # an fp32 table is rounded to the dtype first, as the model's rotary module returns it
        dt: tl.constexpr = qo_ptr.dtype.element_ty
        c1, c2, s1, s2 = _in(c1, dt, EXACT), _in(c2, dt, EXACT), _in(s1, dt, EXACT), _in(s2, dt, EXACT)
    qw1, qw2, kw1, kw2 = c1, c1, c1, c1  # unused unless NORM
    if NORM:
        qw1 = to_f32(tl.load(qw_ptr + rd, mask=rm), EXACT)
        qw2 = to_f32(tl.load(qw_ptr + HALF + rd, mask=rm), EXACT)
        kw1 = to_f32(tl.load(kw_ptr + rd, mask=rm), EXACT)
        kw2 = to_f32(tl.load(kw_ptr + HALF + rd, mask=rm), EXACT)
    q_off, qo_off = b * q_sb + s * q_ss, b * qo_sb + s * qo_ss
    k_off, ko_off = b * k_sb + s * k_ss, b * ko_sb + s * ko_ss
    # Q's and K's tiles of a round are loaded before either is stored: the stores may alias the loads (inplace),
    # so the compiler keeps program order, and loading K after storing Q would cost a second memory round trip
    # in every program. One round holds every head of every seed shape; past Q's or K's last head the masks are
    # all false.
    for r in range(0, ROUNDS):
        hq = (r * BLOCK_HQ + tl.arange(0, BLOCK_HQ)).to(tl.int64)
        hk = (r * BLOCK_HK + tl.arange(0, BLOCK_HK)).to(tl.int64)
        q1, q2, qm = _load_heads(q_ptr, q_off, hq, HQ, q_sh, d, d_mask, qw1, qw2, eps, HALF, NORM, EXACT)
        k1, k2, km = _load_heads(k_ptr, k_off, hk, HKV, k_sh, d, d_mask, kw1, kw2, eps, HALF, NORM, EXACT)
        _store_rotated(qo_ptr, qo_off, hq, qo_sh, q1, q2, qm, c1, c2, s1, s2, d, HALF, EAGER, EXACT)
        _store_rotated(ko_ptr, ko_off, hk, ko_sh, k1, k2, km, c1, c2, s1, s2, d, HALF, EAGER, EXACT)


def launch_shape(hq: int, hkv: int, head_dim: int, warp_size: int = WARP_SIZE) -> tuple[int, int, int, int]:
    """``(BLOCK_D, BLOCK_HQ, BLOCK_HK, num_warps)``: Q's and K's heads each in the smallest power of two that
    holds them, up to 2K elements per half-tile (32 heads of D=128: every seed shape in one round, no masked
    rows), and warps sized so each thread owns at least 8 elements of the smaller half-tile, a 16-byte vector of
    bf16/fp16."""
    block_d = triton.next_power_of_2(head_dim // 2)
    cap = max(1, 2048 // block_d)
    block_hq = min(triton.next_power_of_2(max(hq, 1)), cap)
    block_hk = min(triton.next_power_of_2(max(hkv, 1)), cap)
    return block_d, block_hq, block_hk, max(1, min(8, min(block_hq, block_hk) * block_d // (8 * warp_size)))


def qwen3_tts_rope(q, k, cos, sin, q_out, k_out, positions=None, eager: bool = False, q_weight=None, k_weight=None,
                   eps: float = 0.0, pdl: bool = False, mrope_section=None, mrope_interleaved: bool = False) -> None:
    # pdl: a launch hint for compiled kernels
    norm = q_weight is not None
    qw, kw = (q_weight, k_weight) if norm else (q, q)  # unread without NORM
    named = {"q": q, "k": k, "cos": cos, "sin": sin, "q_out": q_out, "k_out": k_out, "positions": positions,
             "q_norm_weight": q_weight, "k_norm_weight": k_weight}
    check_aligned("qwen3_tts_rope", {n: t for n, t in named.items() if t is not None})
    B, HQ, S, D = q.shape
    HKV = k.shape[1]
    half = D // 2
    block_d, block_hq, block_hk, num_warps = launch_shape(HQ, HKV, D)
    table = positions is not None
    mrope = 0 if mrope_section is None else 2 if mrope_interleaved else 1
    # the planes: cos/sin [3, B or 1, S, D] or positions [3, B or 1, S], their leading dim (0 without mrope)
    c_sp, s_sp, p_sp = (0, 0, 0) if not mrope else (0, 0, positions.stride(0)) if table else (
        cos.stride(0), sin.stride(0), 0)
    cos_b, sin_b, pos_b = (cos[0], sin[0], positions) if mrope and not table else (
        cos, sin, positions[0] if mrope else positions)  # views without the plane dim
    # cos/sin broadcast over the batch: stride 0 re-reads batch 0; [S] positions likewise.
    c_sb = cos_b.stride(0) if cos_b.shape[0] > 1 and not table else 0
    s_sb = sin_b.stride(0) if sin_b.shape[0] > 1 and not table else 0
    p_sb, p_ss = (0, 0) if not table else (pos_b.stride(0), pos_b.stride(1)) if pos_b.dim() == 2 else (
        0, pos_b.stride(0))
    c_ss, s_ss = cos.stride(-2), sin.stride(-2)
    with launch_lock():
        _tts_rope_kernel[(B * S,)](
            q, k, cos, sin, q_out, k_out, positions if table else q, qw, kw,
            S, HQ, HKV, max(triton.cdiv(HQ, block_hq), triton.cdiv(HKV, block_hk)), cos.shape[0], float(eps),
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            c_sb, c_ss, s_sb, s_ss, p_sb, p_ss, c_sp, s_sp, p_sp,
            q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
            HALF=half, BLOCK_D=block_d, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, EAGER=bool(eager), TABLE=table,
            NORM=norm, EXACT=INTERPRETED, MROPE=mrope, SEC_T=mrope_section[0] if mrope else 0,
            SEC_H=mrope_section[1] if mrope else 0, num_warps=num_warps, enable_fp_fusion=not eager,
        )
