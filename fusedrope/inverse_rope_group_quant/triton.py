"""inverse_rope_group_quant in Triton, plus the unfused two-kernel baseline the benchmarks compare against.

Fused kernel: one program owns a [BLOCK_T tokens, BLOCK_N columns] tile of the flattened ``o[s]`` rows
(BLOCK_N a multiple of the quant group size, so it owns whole quant blocks), 64 elements per thread. It loads
the tile once, rotates the rope pairs of every head's tail in registers (pairs split with ``tl.split``), reduces
each block's amax, derives the e8m0 byte from the fp32 bits of ``amax / FP8_MAX``, scales by the exact power of
two (NaN for a block holding NaN or Inf), converts to fp8 and stores fp8 and scales. Nothing goes back to memory
in between. Programs that hold padding rows of a column-major ``x_scale`` only store their zeros.

The rotation has two forms. When ``rope_dim`` is a power of two dividing ``head_dim`` (DeepSeek-V4: 64 of
512), the tile is seen as ``[BLOCK_T, segments of rope_dim columns, rope_dim/2 pairs, 2]``: a head's tail is
its last segment, and one contiguous cos row and sin row per token broadcast over the segments (through a small
shared-memory exchange), so the rotation stays in the registers the tile was loaded into. Otherwise each pair
gathers its cos/sin by column, which the compiler lays out differently from the tile: about twice the
instructions and a shared-memory round trip of the whole tile each way. What each form issues per byte is
measured by ``bench/static/budget.py`` (docs/benchmarks.md).

The scale address of block ``kb`` (= g*Ks + k) of token ``s`` is ``s*stride_s + kb*stride_k`` in the
"row" and "col" layouts: row-major ``(Ks*G, 1)``, column-major ``(1, S)``. In the "mfma_tile" layout (the
``[G, S_pad, Ks_pad]`` bytes gfx950's scaled MFMA GEMM reads, :func:`.reference.mfma_tile_offsets`) the kernel
computes each real block's byte offset (a constexpr switch on the k alignment, 2 for quant group 128, else 8)
and leaves the padding bytes alone; likewise in aiter's "n32k4" layout (:func:`.reference.n32k4_offsets`). With
``scale_format="fp32"`` (``PLAIN``) the scales are ``a * (1/FP8_MAX)`` of the floored amax and the values are
multiplied by ``FP8_MAX / a``, an IEEE division (``div_rn``: Triton's ``/`` is approximate on NVIDIA).

The output ``x [S, G, Dg]`` needs only contiguous rows of ``Dg``: element ``col`` of token ``s`` (``g = col //
Dg``) is at ``s*stride_s + g*stride_g + col % Dg``, so vLLM's group-major ``[G, S, Dg]`` storage and row-padded
buffers are written in place. Where no tile straddles two groups (G = 1, or ``Dg`` a multiple of the tile width:
DeepSeek-V4's shapes) the grid's third axis is the group, so ``g`` is one scalar per program and the store is the
contiguous layout's 16-byte store (Triton specialises strides divisible by 16: row-major, group-major and padded
x compile to one kernel). Otherwise each column's group is the tile's first group plus the boundaries it lies
past (``CROSSINGS`` unrolled compares, no division); Dg (a constexpr) is a multiple of 16, so Triton still sees
16-column runs and stores them 16 bytes at a time. Without ``x_scale`` (quantize=False) ``x`` has o's dtype and
gets the rotated values rounded once to it (RNE), with no quant.
"""

import functools
import math

import torch
import triton
import triton.language as tl

from .._device import arch_fp8_dtype, gpu_arch, sm_number
from .._triton import INTERPRETED, WARP_SIZE, check_aligned, f32_to_fp8_bits, launch_lock, round_to, to_f32
from .reference import FP8_MAX, mfma_tile_shape

_FP8_TL = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e4m3fnuz: tl.float8e4b8}


@triton.jit
def _cos_sin(cos_ptr, sin_ptr, p, cos_stride, sin_stride, j, mask, EXACT: tl.constexpr):
    """fp32 cos and sin of pair ``j`` at each token's position ``p``: ``[tokens, len(j)]``; (1, 0) where
    ``mask`` is off."""
    c = to_f32(tl.load(cos_ptr + p[:, None] * cos_stride + j[None, :], mask=mask, other=1.0), EXACT)
    n = to_f32(tl.load(sin_ptr + p[:, None] * sin_stride + j[None, :], mask=mask, other=0.0), EXACT)
    return c, n


@triton.jit
def _inverse_rotation(e, d, c, n):
    """GPT-J pairs ``(e, d)`` rotated back: multiplied by the conjugate of ``c + i*n``."""
    return e * c + d * n, d * c - e * n


@triton.jit
def _rotate_back(x, t_mask, p, cos_ptr, sin_ptr, cos_stride, sin_stride, col0, ROW,
                 HEAD_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                 EXACT: tl.constexpr):
    """Inverse GPT-J rotation of the rope pairs in a [BLOCK_T, BLOCK_N] fp32 tile starting at column col0."""
    e, d = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_N // 2, 2)))
    pair_col = col0 + 2 * tl.arange(0, BLOCK_N // 2)
    off = pair_col % HEAD_DIM
    is_rope = (off >= HEAD_DIM - ROPE_DIM) & (pair_col < ROW)
    j = (off - (HEAD_DIM - ROPE_DIM)) // 2
    c, n = _cos_sin(cos_ptr, sin_ptr, p, cos_stride, sin_stride, j, t_mask[:, None] & is_rope[None, :], EXACT)
    e2, d2 = _inverse_rotation(e, d, c, n)
    # where, not c=1/n=0: keeps -0.0 and Inf exact
    return tl.reshape(tl.join(tl.where(is_rope[None, :], e2, e), tl.where(is_rope[None, :], d2, d)),
                      (BLOCK_T, BLOCK_N))


@triton.jit
def _rotate_back_tails(x, t_mask, p, cos_ptr, sin_ptr, cos_stride, sin_stride, col0,
                       HEAD_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
                       BLOCK_N: tl.constexpr, EXACT: tl.constexpr):
    """:func:`_rotate_back` for a power-of-two ``ROPE_DIM`` dividing ``HEAD_DIM`` and ``BLOCK_N``: the tile as
    segments of ``ROPE_DIM`` columns, of which every head's last is its tail."""
    HALF: tl.constexpr = ROPE_DIM // 2
    SEGS: tl.constexpr = BLOCK_N // ROPE_DIM
    e, d = tl.split(tl.reshape(x, (BLOCK_T, SEGS, HALF, 2)))
    is_rope = ((col0 + ROPE_DIM * tl.arange(0, SEGS)) % HEAD_DIM == HEAD_DIM - ROPE_DIM)[None, :, None]
    c, n = _cos_sin(cos_ptr, sin_ptr, p, cos_stride, sin_stride, tl.arange(0, HALF), t_mask[:, None], EXACT)
    e2, d2 = _inverse_rotation(e, d, c[:, None, :], n[:, None, :])
    # where, not c=1/n=0: keeps -0.0 and Inf exact
    return tl.reshape(tl.join(tl.where(is_rope, e2, e), tl.where(is_rope, d2, d)), (BLOCK_T, BLOCK_N))


@triton.jit
def _store_x_tile(xq_ptr, v, t, t_mask, g, c0, DG: tl.constexpr, x_stride_s, x_stride_g, BLOCK_N: tl.constexpr):
    """Store the [tokens, BLOCK_N] tile ``v`` (columns ``c0 ..`` of group ``g``, one scalar: the tile lies in one
    group) into ``x [S, G, Dg]`` with strides ``(x_stride_s, x_stride_g, 1)``; columns past the group masked."""
    col = tl.arange(0, BLOCK_N)
    ptr = xq_ptr + g.to(tl.int64) * x_stride_g + c0 + t[:, None] * x_stride_s + col[None, :]  # > 2^31 apart
    tl.store(ptr, v, mask=t_mask[:, None] & (c0 + col < DG)[None, :])


@triton.jit
def _store_x_straddling(xq_ptr, v, t, t_mask, col0, ROW, DG: tl.constexpr, x_stride_s, x_stride_g,
                        BLOCK_N: tl.constexpr, CROSSINGS: tl.constexpr):
    """Store the [tokens, BLOCK_N] tile ``v`` (row columns ``col0 ..``) into ``x [S, G, Dg]`` when it may straddle
    up to ``CROSSINGS`` group boundaries: the group of each column is the tile's first group plus the boundaries
    it lies past (compares, not divisions; they change only at multiples of 16 columns, which Triton sees from Dg's
    divisibility, so each thread's 16-column run stays one contiguous store)."""
    c0 = col0.to(tl.int32)
    g0 = c0 // DG
    local = (c0 - g0 * DG) + tl.arange(0, BLOCK_N)  # the column in group g0, running past its end
    past = tl.zeros([BLOCK_N], dtype=tl.int32)
    for j in tl.static_range(1, CROSSINGS + 1):
        past += (local >= j * DG).to(tl.int32)
    off = (g0 + past).to(tl.int64) * x_stride_g + (local - past * DG)
    ptr = xq_ptr + t[:, None] * x_stride_s + off[None, :]
    tl.store(ptr, v, mask=t_mask[:, None] & (c0 + tl.arange(0, BLOCK_N) < ROW)[None, :])


@triton.jit
def _mfma_tile_offsets(t, kb, KS: tl.constexpr, tile_stride, group_stride, MFMA_K: tl.constexpr):
    """Byte offsets [len(t), len(kb)] of blocks ``kb`` (= g*Ks + k) of tokens ``t`` in the "mfma_tile" buffer
    ``[G, S_pad, Ks_pad]``: ``tile_stride`` = 32*Ks_pad (one 32-token tile row), ``group_stride`` = S_pad*Ks_pad.
    MFMA_K 2: index (g, s//32, k//2, s%16, k%2, (s//16)%2) of [G, S_pad/32, Ks_pad/2, 16, 2, 2]; 8: index
    (g, s//32, k//8, k%4, s%16, (k//4)%2, (s//16)%2) of [G, S_pad/32, Ks_pad/8, 4, 16, 2, 2]."""
    g = kb // KS
    k = kb - g * KS
    if MFMA_K == 2:
        kk = (k // 2) * 64 + 2 * (k % 2)
    else:
        kk = (k // 8) * 256 + 64 * (k % 4) + 2 * ((k // 4) % 2)
    ss = (t // 32) * tile_stride + 4 * (t % 16) + (t // 16) % 2
    return ss[:, None] + (g.to(tl.int64) * group_stride + kk)[None, :]


@triton.jit
def _quant_tile(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, xq_ptr, xs_ptr,
    S, S_SC, ROW, NBLK, max_pos, pos_stride, cos_stride, sin_stride, x_stride_s, x_stride_g, sc_stride_s, sc_stride_k,
    HEAD_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, GS: tl.constexpr, DG: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, ONE_GROUP: tl.constexpr, CROSSINGS: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_TYPE: tl.constexpr, FNUZ: tl.constexpr, SCALE_FP32: tl.constexpr,
    PACKED: tl.constexpr, MFMA_K: tl.constexpr, N32K4: tl.constexpr, PLAIN: tl.constexpr, QUANT: tl.constexpr,
    ROPE: tl.constexpr, TAIL_SEGMENTS: tl.constexpr, EXACT: tl.constexpr,
):
    """One program's tile of :func:`_group_quant_kernel`."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    g = tl.program_id(2)  # 0 unless ONE_GROUP
    c0 = tl.program_id(1).to(tl.int64) * BLOCK_N
    col0 = g.to(tl.int64) * DG + c0
    col = col0 + tl.arange(0, BLOCK_N)
    t_mask = t < S
    m = t_mask[:, None] & (col < ROW)[None, :]
    x = to_f32(tl.load(o_ptr + t[:, None] * ROW + col[None, :], mask=m, other=0.0), EXACT)
    if ROPE:
        p = tl.load(pos_ptr + t * pos_stride, mask=t_mask, other=0).to(tl.int64)
        p = tl.minimum(tl.maximum(p, 0), max_pos - 1)  # clamp: memory-safe, no host sync
        if TAIL_SEGMENTS:
            x = _rotate_back_tails(x, t_mask, p, cos_ptr, sin_ptr, cos_stride, sin_stride, col0,
                                   HEAD_DIM, ROPE_DIM, BLOCK_T, BLOCK_N, EXACT)
        else:
            x = _rotate_back(x, t_mask, p, cos_ptr, sin_ptr, cos_stride, sin_stride, col0, ROW,
                             HEAD_DIM, ROPE_DIM, BLOCK_T, BLOCK_N, EXACT)
    if not QUANT:
        v = round_to(x, xq_ptr.dtype.element_ty, EXACT)
        if ONE_GROUP:
            _store_x_tile(xq_ptr, v, t, t_mask, g, c0, DG, x_stride_s, x_stride_g, BLOCK_N)
        else:
            _store_x_straddling(xq_ptr, v, t, t_mask, col0, ROW, DG, x_stride_s, x_stride_g, BLOCK_N, CROSSINGS)
    else:  # not an early return above: Triton would still compile the fp8 code (sm_80 has no e4m3 conversion)
        NB: tl.constexpr = BLOCK_N // GS
        xb = tl.reshape(x, (BLOCK_T, NB, GS))
        # |x| as int32 bits orders like |x| for finite values, with Inf above them and NaN above Inf: one integer
        # max gives a block's amax and whether it holds a non-finite value (a float max would drop NaN).
        amax_bits = tl.max(xb.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)
        bad = amax_bits >= 0x7F800000
        if PLAIN:  # scale_format="fp32": a * fp32(1/FP8_MAX), values times FP8_MAX / a (IEEE division), clamped
            a = tl.maximum(amax_bits.to(tl.float32, bitcast=True), 1e-12)
            plain_scale = tl.where(bad, float("nan"), a * (1.0 / FP8_MAX))
            inv_scale = tl.math.div_rn(tl.full(a.shape, FP8_MAX, tl.float32), a)
            q = tl.minimum(tl.maximum(xb * inv_scale[:, :, None], -FP8_MAX), FP8_MAX)
            q = tl.reshape(tl.where(bad[:, :, None], float("nan"), q), (BLOCK_T, BLOCK_N))
        else:
            amax = tl.maximum(amax_bits.to(tl.float32, bitcast=True), 1e-8)
            bits = (amax * (1.0 / FP8_MAX)).to(tl.uint32, bitcast=True)
            byte = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.uint32)
            byte = tl.where(bad, 255, byte)
            # 2^(127 - byte), exact, and NaN for a block holding NaN or Inf: each of its values converts to fp8
            # NaN. No clamp: |v| * 2^(127 - byte) <= amax / scale <= FP8_MAX up to the rounding of amax / FP8_MAX
            # (a relative 2^-24), which the conversion's round to nearest brings back to FP8_MAX.
            inv_scale = tl.where(bad, float("nan"),
                                 ((254 - tl.minimum(byte, 254)) << 23).to(tl.float32, bitcast=True))
            q = tl.reshape(xb * inv_scale[:, :, None], (BLOCK_T, BLOCK_N))
        if EXACT:
            code = f32_to_fp8_bits(q, FNUZ)
        else:
            code = q.to(FP8_TYPE).to(tl.uint8, bitcast=True)
        if ONE_GROUP:
            _store_x_tile(xq_ptr, code, t, t_mask, g, c0, DG, x_stride_s, x_stride_g, BLOCK_N)
        else:
            _store_x_straddling(xq_ptr, code, t, t_mask, col0, ROW, DG, x_stride_s, x_stride_g, BLOCK_N, CROSSINGS)

        kb0 = col0 // GS  # the tile's first block in the row (g*Ks + k)
        if PACKED:  # DeepGEMM UE8M0: four consecutive block bytes in one int32 word, block 4j+i in byte i
            shift = (tl.arange(0, 4) * 8).to(tl.uint32)
            word = tl.sum(tl.reshape(byte, (BLOCK_T, NB // 4, 4)) << shift[None, None, :], axis=2)  # disjoint bits
            word = tl.where(t_mask[:, None], word, 0)
            kw = kb0 // 4 + tl.arange(0, NB // 4)
            sm = (t < S_SC)[:, None] & (kw < NBLK // 4)[None, :]
            tl.store(xs_ptr + t[:, None] * sc_stride_s + kw[None, :] * sc_stride_k, word.to(tl.int32, bitcast=True),
                     mask=sm)
        else:
            kb = kb0 + tl.arange(0, NB)
            sm = (t < S_SC)[:, None] & (kb < NBLK)[None, :]
            if PLAIN:
                scale = plain_scale
            elif SCALE_FP32:
                scale = tl.where(bad, float("nan"), (tl.minimum(byte, 254) << 23).to(tl.float32, bitcast=True))
            else:
                scale = byte.to(tl.uint8)
            scale = tl.where(t_mask[:, None], scale, 0)
            if N32K4:  # [s // 32, g, (k // 4)*128 + (s % 32)*4 + k % 4], Ks % 4 == 0: kb % 4 is k % 4
                off = (t // 32)[:, None] * (32 * NBLK) + 4 * (t % 32)[:, None] + (32 * (kb - kb % 4) + kb % 4)[None, :]
            elif MFMA_K == 0:
                off = t[:, None] * sc_stride_s + kb[None, :] * sc_stride_k
            else:  # only the real (s, g, k) bytes: the padding is not part of the layout
                off = _mfma_tile_offsets(t, kb.to(tl.int32), DG // GS, sc_stride_s, sc_stride_k, MFMA_K)
            tl.store(xs_ptr + off, scale, mask=sm)


@triton.jit
def _group_quant_kernel(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, xq_ptr, xs_ptr,
    S, S_SC, ROW, NBLK, max_pos, pos_stride, cos_stride, sin_stride, x_stride_s, x_stride_g, sc_stride_s, sc_stride_k,
    HEAD_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, GS: tl.constexpr, DG: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, ONE_GROUP: tl.constexpr, CROSSINGS: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_TYPE: tl.constexpr, FNUZ: tl.constexpr, SCALE_FP32: tl.constexpr,
    PACKED: tl.constexpr, MFMA_K: tl.constexpr, N32K4: tl.constexpr, PLAIN: tl.constexpr, QUANT: tl.constexpr,
    ROPE: tl.constexpr, TAIL_SEGMENTS: tl.constexpr, EXACT: tl.constexpr,
):
    """See the module docstring. Grid ``(token tiles, column tiles, G)`` when ``ONE_GROUP`` (no tile straddles two
    groups: program_id(1) tiles a group, program_id(2) is the group, so no division finds it), else ``(token
    tiles, column tiles of the row, 1)``. ``QUANT`` False: ``x`` has o's dtype and gets the rotated tile, nothing
    else. ``MFMA_K`` 0: scales through ``(sc_stride_s, sc_stride_k)``; 2 or 8: the "mfma_tile" layout, with
    ``sc_stride_s``, ``sc_stride_k`` the strides of a 32-token tile row and of a group (:func:`_mfma_tile_offsets`).
    ``S_SC`` >= S: the scales' token rows; those past S (a "col" buffer's TMA padding) get zeros."""
    if QUANT and MFMA_K == 0 and not N32K4 and not PACKED:
        if tl.program_id(0) * BLOCK_T < S:
            _quant_tile(o_ptr, pos_ptr, cos_ptr, sin_ptr, xq_ptr, xs_ptr, S, S_SC, ROW, NBLK, max_pos, pos_stride,
                        cos_stride, sin_stride, x_stride_s, x_stride_g, sc_stride_s, sc_stride_k, HEAD_DIM, ROPE_DIM,
                        GS, DG, BLOCK_T, BLOCK_N, ONE_GROUP, CROSSINGS, FP8_MAX, FP8_TYPE, FNUZ, SCALE_FP32, PACKED,
                        MFMA_K, N32K4, PLAIN, QUANT, ROPE, TAIL_SEGMENTS, EXACT)
        else:  # a program of padding rows only: their zero scales, nothing else (after the main path in the code)
            t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
            kb = (tl.program_id(2).to(tl.int64) * DG + tl.program_id(1).to(tl.int64) * BLOCK_N) // GS + tl.arange(
                0, BLOCK_N // GS)
            zero = tl.zeros([BLOCK_T, BLOCK_N // GS], dtype=xs_ptr.dtype.element_ty)
            tl.store(xs_ptr + t[:, None] * sc_stride_s + kb[None, :] * sc_stride_k, zero,
                     mask=(t < S_SC)[:, None] & (kb < NBLK)[None, :])
    else:
        _quant_tile(o_ptr, pos_ptr, cos_ptr, sin_ptr, xq_ptr, xs_ptr, S, S_SC, ROW, NBLK, max_pos, pos_stride,
                    cos_stride, sin_stride, x_stride_s, x_stride_g, sc_stride_s, sc_stride_k, HEAD_DIM, ROPE_DIM, GS,
                    DG, BLOCK_T, BLOCK_N, ONE_GROUP, CROSSINGS, FP8_MAX, FP8_TYPE, FNUZ, SCALE_FP32, PACKED,
                    MFMA_K, N32K4, PLAIN, QUANT, ROPE, TAIL_SEGMENTS, EXACT)


@triton.jit
def _rope_tail_inplace_kernel(o_ptr, pos_ptr, cos_ptr, sin_ptr, S, H, max_pos, pos_stride, cos_stride,
                              sin_stride, HEAD_DIM: tl.constexpr, HALF: tl.constexpr, HALF_P2: tl.constexpr,
                              BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, EXACT: tl.constexpr):
    """Baseline step 1: rotate the tails of ``o`` back in place, rounded to o's dtype (a bf16 round trip).
    A program owns the tails of [BLOCK_T tokens, BLOCK_H heads] and nothing else, as the seed's in-place rope on
    the tail view does: threads only for the ``rope_dim`` columns that move."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    k = tl.arange(0, 2 * HALF_P2)
    t_mask = t < S
    m = t_mask[:, None, None] & (h < H)[None, :, None] & (k < 2 * HALF)[None, None, :]
    ptr = (o_ptr + t[:, None, None] * (H * HEAD_DIM) + h[None, :, None] * HEAD_DIM + (HEAD_DIM - 2 * HALF)
           + k[None, None, :])
    x = to_f32(tl.load(ptr, mask=m, other=0.0), EXACT)
    p = tl.load(pos_ptr + t * pos_stride, mask=t_mask, other=0).to(tl.int64)
    p = tl.minimum(tl.maximum(p, 0), max_pos - 1)
    j = tl.arange(0, HALF_P2)
    c, n = _cos_sin(cos_ptr, sin_ptr, p, cos_stride, sin_stride, j, t_mask[:, None] & (j < HALF)[None, :], EXACT)
    e, d = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_H, HALF_P2, 2)))
    e2, d2 = _inverse_rotation(e, d, c[:, None, :], n[:, None, :])
    x = tl.reshape(tl.join(e2, d2), (BLOCK_T, BLOCK_H, 2 * HALF_P2))
    tl.store(ptr, round_to(x, o_ptr.dtype.element_ty, EXACT), mask=m)


def _tiles(S: int, row: int, group_size: int, packed: bool = False) -> tuple[int, int]:
    """Tile [BLOCK_T, BLOCK_N]: whole quant blocks (four, to pack UE8M0 words); up to 4K elements (several
    tokens when rows are short), but down to 512 when that gives a small launch (S = 1) ~128 programs."""
    per_program = min(4096, max(512, triton.next_power_of_2(S * row // 128 + 1) // 2))
    block_n = max(group_size * (4 if packed else 1), min(triton.next_power_of_2(row), per_program, 2048))
    block_t = max(1, min(triton.next_power_of_2(S), per_program // block_n))
    return block_t, block_n


def crossings(dg: int, block_n: int) -> int:
    """The most group boundaries a tile of ``block_n`` columns (starting at a multiple of ``block_n``) crosses: the
    fused kernel's unrolled compares where tiles straddle groups. A tile starts ``r`` columns into a group, ``r``
    a multiple of gcd(block_n, Dg), so at most ``Dg - gcd`` in; its last column is ``block_n - 1`` further."""
    return (dg - math.gcd(block_n, dg) + block_n - 1) // dg


def tail_segments(head_dim: int, rope_dim: int, block_n: int) -> bool:
    """Whether the fused kernel rotates by segments (:func:`_rotate_back_tails`): ``rope_dim`` a power of two
    dividing ``head_dim`` and the tile width ``block_n``."""
    return rope_dim > 0 and rope_dim & (rope_dim - 1) == 0 and head_dim % rope_dim == 0 and block_n % rope_dim == 0


def num_warps_for(tile_elems: int, warp_size: int = WARP_SIZE, per_thread: int = 16) -> int:
    """Warps so each thread holds ``per_thread`` elements of the tile (16: two 16-byte bf16 vectors)."""
    return max(1, min(8, tile_elems // (per_thread * warp_size)))


# The fused kernel's elements per thread: 64 (eight 16-byte bf16 vectors) amortize each warp's index, position
# and scale work over four times the bytes of 16 (bench/static/budget.py counts it: 155 against 230
# warp-instructions per KB at S = 8192 on sm_90).
QUANT_PER_THREAD = 64


def integer_fp8_rounding(fp8_dtype: torch.dtype, arch: str) -> bool:
    """The quant kernel's EXACT for ``arch``: integer-bit fp8 rounding under the interpreter (its conversions
    are wrong), and where Triton has no conversion to ``fp8_dtype`` for ``arch``: e4m3fn before sm_89 (A100:
    "fp8e4nv not supported in this architecture"), and fnuz on every GPU whose hardware format it is not
    (Triton 3.6 asserts compiling fp32 -> fnuz for gfx950, ElementwiseOpToLLVM.cpp Fp32_to_Fp8E4M3FNUZ_HW;
    NVIDIA Triton has no fnuz)."""
    fnuz = torch.float8_e4m3fnuz
    if INTERPRETED:
        return True
    if fp8_dtype == fnuz:
        return arch_fp8_dtype(arch) != fnuz
    return 0 < sm_number(arch) < 89


@functools.lru_cache(maxsize=None)
def _fp8_in_software(device: torch.device, fp8_dtype: torch.dtype) -> bool:
    return integer_fp8_rounding(fp8_dtype, gpu_arch(device))  # once per device and format: not per call


def _launch_quant(o, positions, cos_cache, sin_cache, x, x_scale, group_size, rope: bool, scale_layout: str = "row",
                  scale_format: str = "ue8m0"):
    """For arguments the public op has checked (an mfma_tile or n32k4 x_scale is a contiguous e8m0 / uint8
    buffer)."""
    S, H, D = o.shape
    row = H * D
    G, dg = x.shape[1], x.shape[2]
    quant = x_scale is not None
    mfma = quant and scale_layout == "mfma_tile"
    n32k4 = quant and scale_layout == "n32k4"
    packed = quant and x_scale.dtype == torch.int32
    scale_fp32 = quant and x_scale.dtype == torch.float32
    block_t, block_n = _tiles(S, row, group_size, packed)
    fp8 = x.dtype if quant else torch.float8_e4m3fn  # without quant the fp8 constexprs are unused
    exact = INTERPRETED or (quant and _fp8_in_software(x.device, fp8))
    if not quant:
        xs, sc_s, sc_k, mfma_k = x, 0, 0, 0  # an unused pointer slot
    elif mfma:
        _, s_pad, k_pad = mfma_tile_shape(S, G, dg // group_size, group_size)
        xs, sc_s, sc_k, mfma_k = x_scale.view(torch.uint8), 32 * k_pad, s_pad * k_pad, 2 if group_size == 128 else 8
    elif n32k4:
        xs, sc_s, sc_k, mfma_k = x_scale.view(torch.uint8), 0, 0, 0
    else:
        xs = x_scale if scale_fp32 or packed else x_scale.view(torch.uint8)
        sc_s, sc_k, mfma_k = x_scale.stride(0), x_scale.stride(2), 0
    s_sc = x_scale.shape[0] if quant and scale_layout == "col" else S  # past S: zeroed padding rows
    one_group = G == 1 or dg % block_n == 0
    grid = (triton.cdiv(s_sc, block_t), triton.cdiv(dg, block_n), G) if one_group else (
        triton.cdiv(s_sc, block_t), triton.cdiv(row, block_n), 1)
    rope_dim = 2 * cos_cache.shape[1]
    with launch_lock():
        _group_quant_kernel[grid](
            o, positions, cos_cache, sin_cache, x.view(torch.uint8) if quant else x, xs,
            S, s_sc, row, row // group_size, cos_cache.shape[0], positions.stride(0), cos_cache.stride(0),
            sin_cache.stride(0), x.stride(0), x.stride(1), sc_s, sc_k,
            HEAD_DIM=D, ROPE_DIM=rope_dim, GS=group_size, DG=dg, BLOCK_T=block_t, BLOCK_N=block_n,
            ONE_GROUP=one_group, CROSSINGS=crossings(dg, block_n),
            FP8_MAX=FP8_MAX[fp8], FP8_TYPE=_FP8_TL[fp8], FNUZ=fp8 == torch.float8_e4m3fnuz,
            SCALE_FP32=scale_fp32, PACKED=packed, MFMA_K=mfma_k, N32K4=n32k4, PLAIN=quant and scale_format == "fp32",
            QUANT=quant, ROPE=rope,
            TAIL_SEGMENTS=rope and tail_segments(D, rope_dim, block_n),
            EXACT=exact, num_warps=num_warps_for(block_t * block_n, per_thread=QUANT_PER_THREAD),
            enable_fp_fusion=False,  # no FMA: the rope matches the reference bit for bit, so scale bytes do too
        )


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, x, x_scale, quant_group_size, *,
                             scale_layout: str = "row", pdl: bool = False, scale_format: str = "ue8m0") -> None:
    """Triton backend: ``x [S, G, Dg]`` (fp8, or o's dtype when ``x_scale`` is None: quantize=False) with any token
    and group strides, ``x_scale`` in ``scale_format`` and ``scale_layout`` ("row" / "col" read off its strides,
    "mfma_tile" or "n32k4"). ``pdl`` is a launch hint for the compiled backends: accepted, nothing to do here."""
    named = {"o": o, "positions": positions, "cos_cache": cos_cache, "sin_cache": sin_cache, "x": x}
    if x_scale is not None:
        named["x_scale"] = x_scale
    check_aligned("inverse_rope_group_quant", named)
    _launch_quant(o, positions, cos_cache, sin_cache, x, x_scale, quant_group_size, rope=True,
                  scale_layout=scale_layout, scale_format=scale_format)


def rope_tail_inplace(o, positions, cos_cache, sin_cache) -> None:
    S, H, D = o.shape
    half = cos_cache.shape[1]
    half_p2 = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(H), 16)
    block_t = max(1, min(triton.next_power_of_2(S), 4096 // (block_h * 2 * half_p2)))  # up to 4K tail elements
    grid = (triton.cdiv(S, block_t), triton.cdiv(H, block_h))
    with launch_lock():
        _rope_tail_inplace_kernel[grid](
            o, positions, cos_cache, sin_cache, S, H, cos_cache.shape[0], positions.stride(0), cos_cache.stride(0),
            sin_cache.stride(0), HEAD_DIM=D, HALF=half, HALF_P2=half_p2, BLOCK_T=block_t, BLOCK_H=block_h,
            EXACT=INTERPRETED, num_warps=num_warps_for(block_t * block_h * 2 * half_p2), enable_fp_fusion=False,
        )


def group_quant(o, positions, cos_cache, x, x_scale, quant_group_size, *, scale_layout: str = "row",
                pdl: bool = False) -> None:
    """Baseline step 2: the per-group e8m0 quant alone (the fused kernel with the rotation compiled out, so
    ``positions`` and ``cos_cache`` are never read: they only fill the kernel's pointer slots, with no
    allocation or extra launch that would add to the baseline's time). Same outputs and layouts as
    :func:`inverse_rope_group_quant` (``pdl`` ignored)."""
    _launch_quant(o, positions, cos_cache, cos_cache, x, x_scale, quant_group_size, rope=False,
                  scale_layout=scale_layout)
