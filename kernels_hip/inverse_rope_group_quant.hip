// Fused inverse RoPE + FP8 per-group quant with e8m0 scales for AMD CDNA3/CDNA4 (gfx942 / gfx950), wave64.
// Contract and parameter meanings: inverse_rope_group_quant.h. Bit-exact to fusedrope.reference for the scale
// bytes; fp8 values are the RNE of the same fp32 numbers (no FMA contraction in the rotation).
//
// Work decomposition (why group 32 costs no more per byte than group 128):
//   The flat element space S*H*512 is cut into 16-element chunks; one lane owns one chunk (two dwordx4 loads of
//   bf16/fp16, one dwordx4 store of 16 fp8 bytes). Since 16 | 512 and 16 | quant_group_size, a chunk never
//   straddles a head, a token or a quant block, and a block of Q elements is exactly Q/16 adjacent lanes of one
//   DPP row: 2 lanes for Q=32 (one DPP step), 4 for 64, 8 for 128, 16 for 256 (four steps). Every lane of a
//   block ends with the block amax (butterfly, no broadcast), computes the same scale byte with a handful of
//   scalar ALU ops, and the first lane of the block writes it: one store instruction per wave for any Q.
//   So smaller groups do fewer cross-lane steps, not more; no full-wave reduction and no LDS (only the tiled
//   kernel below stages its scale bytes there).
//   Each lane handles kUnroll chunks (256 lanes apart) with all loads issued before any math or store: o with
//   the positions, then the cos/sin rows they select.
//
// amax is taken on the integer bits of |v| (v_max_u32): for non-negative floats integer order is float order,
// and NaN (> 0x7f800000) and Inf (== 0x7f800000) win the max, so one compare tells a non-finite block apart; such
// a block gets scale byte 0xFF and fp8 NaN (0x7F for e4m3fn, 0x80 for fnuz) in all its values.
//
// fp8 encoding: gfx942 + e4m3fnuz and gfx950 + e4m3fn use v_cvt_pk_fp8_f32 (the gfx942 hardware format is FNUZ,
// gfx950's is OCP); any other combination uses the exact software RNE of
// ../kernels_cuda/inverse_rope_group_quant_common.h (plain C++ shared with the CUDA kernel, CPU-tested). Inputs
// are clamped to +-FP8_MAX first (v_med3_f32), as the reference does.
//
// Compile-only check without ROCm (what tests/inverse_rope_group_quant/test_inverse_rope_group_quant_hip.py runs):
//   clang++-19 -x hip --offload-arch=gfx942 --cuda-device-only -nogpulib -nogpuinc -O3 -S
// Without the HIP runtime headers the few declarations used here are provided below.

#include "inverse_rope_group_quant.h"

#if !FUSEDROPE_HIP_HAVE_RUNTIME
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
typedef int hipError_t;
#define hipSuccess 0
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern "C" hipError_t hipLaunchKernel(const void* function_address, dim3 numBlocks, dim3 dimBlocks,
                                      void** args, unsigned long sharedMemBytes, hipStream_t stream);
extern "C" hipError_t hipGetLastError(void);
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#endif

namespace fusedrope_hip {
namespace {

typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));
#define FR_GLOBAL __attribute__((address_space(1)))
using namespace fusedrope::irgq;  // Params, constants, KArgs, make_kargs, scalar math (shared with CUDA)
constexpr int kUnroll = 2;         // chunks per lane, kThreads lanes apart

__device__ inline float clamp_fp8(float y, float fp8_max) { return __builtin_amdgcn_fmed3f(y, -fp8_max, fp8_max); }

// ------------------------------------------------------------------------------------------------------------
// device helpers
// ------------------------------------------------------------------------------------------------------------
template <typename TIn>
__device__ inline float lo_f(unsigned w);
template <typename TIn>
__device__ inline float hi_f(unsigned w);
struct BF16 {};
struct F16 {};
template <> __device__ inline float lo_f<BF16>(unsigned w) { return bits_to_float(w << 16); }
template <> __device__ inline float hi_f<BF16>(unsigned w) { return bits_to_float(w & 0xFFFF0000u); }
template <> __device__ inline float lo_f<F16>(unsigned w) {
  return (float)__builtin_bit_cast(_Float16, (unsigned short)(w & 0xFFFFu));
}
template <> __device__ inline float hi_f<F16>(unsigned w) {
  return (float)__builtin_bit_cast(_Float16, (unsigned short)(w >> 16));
}

template <typename TIn>
__device__ inline void unpack16(const u32x4 (&r)[2], float (&v)[16]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[h * 8 + 2 * i] = lo_f<TIn>(r[h][i]);
      v[h * 8 + 2 * i + 1] = hi_f<TIn>(r[h][i]);
    }
  }
}

// The raw words of 8 cache entries at byte address p: 16 bytes for bf16/fp16 (w[1] is then zero), 32 for fp32.
__device__ inline void load_cache_words(const FR_GLOBAL unsigned char* p, int dtype, int vec, u32x4 (&w)[2]) {
  if (vec) {
    w[0] = ((const FR_GLOBAL u32x4*)p)[0];
    w[1] = dtype == kF32 ? ((const FR_GLOBAL u32x4*)p)[1] : u32x4{0u, 0u, 0u, 0u};
  } else if (dtype == kF32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i >> 2][i & 3] = ((const FR_GLOBAL unsigned*)p)[i];
  } else {
    const FR_GLOBAL unsigned short* h = (const FR_GLOBAL unsigned short*)p;
#pragma unroll
    for (int i = 0; i < 4; ++i) w[0][i] = (unsigned)h[2 * i] | ((unsigned)h[2 * i + 1] << 16);
    w[1] = u32x4{0u, 0u, 0u, 0u};
  }
}

// Those words as 8 fp32 values.
__device__ inline void cache8_from_words(const u32x4 (&w)[2], int dtype, float (&c)[8]) {
  if (dtype == kF32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) c[i] = bits_to_float(w[i >> 2][i & 3]);
  } else if (dtype == kBF16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) { c[2 * i] = lo_f<BF16>(w[0][i]); c[2 * i + 1] = hi_f<BF16>(w[0][i]); }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) { c[2 * i] = lo_f<F16>(w[0][i]); c[2 * i + 1] = hi_f<F16>(w[0][i]); }
  }
}

// Inverse GPT-J rotation of 8 pairs: e' = e*c + d*n, d' = d*c - e*n, each product and sum rounded once (no FMA).
__device__ inline void rotate8(float (&v)[16], const float (&c)[8], const float (&n)[8]) {
#pragma clang fp contract(off)
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float e = v[2 * i], d = v[2 * i + 1];
    const float ec = e * c[i], dn = d * n[i], dc = d * c[i], en = e * n[i];
    v[2 * i] = ec + dn;
    v[2 * i + 1] = dc - en;
  }
}

// Max over the kLanes adjacent lanes of a quant block (kLanes | 16, so inside one DPP row). Butterfly: every lane
// ends with the block maximum. quad_perm [1,0,3,2] / [2,3,0,1], then row_half_mirror, then row_mirror.
template <int kLanes>
__device__ inline unsigned block_max(unsigned x) {
  static_assert(kLanes == 1 || kLanes == 2 || kLanes == 4 || kLanes == 8 || kLanes == 16, "lanes per block");
  if (kLanes >= 2) x = __builtin_elementwise_max(x, (unsigned)__builtin_amdgcn_update_dpp(0, (int)x, 0xB1, 0xF, 0xF, false));
  if (kLanes >= 4) x = __builtin_elementwise_max(x, (unsigned)__builtin_amdgcn_update_dpp(0, (int)x, 0x4E, 0xF, 0xF, false));
  if (kLanes >= 8) x = __builtin_elementwise_max(x, (unsigned)__builtin_amdgcn_update_dpp(0, (int)x, 0x141, 0xF, 0xF, false));
  if (kLanes >= 16) x = __builtin_elementwise_max(x, (unsigned)__builtin_amdgcn_update_dpp(0, (int)x, 0x140, 0xF, 0xF, false));
  return x;
}

// 4 clamped values -> 4 fp8 bytes (little-endian: v0 in bits 7:0).
template <bool kFnuz>
__device__ inline unsigned pack4(float v0, float v1, float v2, float v3) {
#if __has_builtin(__builtin_amdgcn_cvt_pk_fp8_f32) && (defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__))
  if (kFnuz) {  // CDNA3 hardware fp8 is FNUZ
    int w = __builtin_amdgcn_cvt_pk_fp8_f32(v0, v1, 0, false);
    w = __builtin_amdgcn_cvt_pk_fp8_f32(v2, v3, w, true);
    // FNUZ has no -0: 0x80 is its NaN, and these values are finite (a non-finite block is replaced by the
    // caller). Should the hardware keep the sign of a negative value that rounds to zero, byte 0x80 becomes 0x00
    // here: per byte, bit 7 is kept only when bits 6:0 are not all zero.
    const unsigned t = (unsigned)w & 0x7F7F7F7Fu;
    return (unsigned)w & (((t + 0x7F7F7F7Fu) & 0x80808080u) | 0x7F7F7F7Fu);
  }
#elif __has_builtin(__builtin_amdgcn_cvt_pk_fp8_f32) && defined(__gfx950__)
  if (!kFnuz) {  // CDNA4 hardware fp8 is OCP e4m3fn
    int w = __builtin_amdgcn_cvt_pk_fp8_f32(v0, v1, 0, false);
    w = __builtin_amdgcn_cvt_pk_fp8_f32(v2, v3, w, true);
    return (unsigned)w;
  }
#endif
  return fp8_encode_sw(v0, kFnuz) | (fp8_encode_sw(v1, kFnuz) << 8) | (fp8_encode_sw(v2, kFnuz) << 16) |
         (fp8_encode_sw(v3, kFnuz) << 24);
}

template <bool kFnuz>
__device__ inline u32x4 quant16(const float (&v)[16], unsigned byte, bool bad) {
  constexpr float kMax = kFnuz ? 240.0f : 448.0f;
  constexpr unsigned kNaN4 = kFnuz ? 0x80808080u : 0x7F7F7F7Fu;
  // 2^(127 - byte): byte is in [91, 248] for any finite amax; a non-finite block is replaced below.
  const float inv = inv_scale(bad ? 127u : byte);
  u32x4 out;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned w = pack4<kFnuz>(clamp_fp8(v[4 * i] * inv, kMax), clamp_fp8(v[4 * i + 1] * inv, kMax),
                                    clamp_fp8(v[4 * i + 2] * inv, kMax), clamp_fp8(v[4 * i + 3] * inv, kMax));
    out[i] = bad ? kNaN4 : w;
  }
  return out;
}

// The 16 elements of o at p: two dwordx4 loads, or 16-bit ones where p is not 16-byte aligned (an odd storage
// offset of o).
__device__ inline void load_o16(const FR_GLOBAL unsigned char* p, int vec, u32x4 (&r)[2]) {
  if (vec) {
    r[0] = ((const FR_GLOBAL u32x4*)p)[0];
    r[1] = ((const FR_GLOBAL u32x4*)p)[1];
  } else {
    const FR_GLOBAL unsigned short* h = (const FR_GLOBAL unsigned short*)p;
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i >> 2][i & 3] = (unsigned)h[2 * i] | ((unsigned)h[2 * i + 1] << 16);
  }
}

// The position of token s, for its rope-tail chunks.
__device__ inline long long load_position(const KArgs& a, unsigned s) {
  const FR_GLOBAL unsigned char* pp = (const FR_GLOBAL unsigned char*)a.positions + a.pos_stride_bytes * s;
  return a.pos_is_int64 ? *(const FR_GLOBAL long long*)pp : (long long)*(const FR_GLOBAL int*)pp;
}

// The raw cos / sin words of rope-tail chunk r of a head (its index in the head, or in the token row) at pos.
__device__ inline void load_cos_sin(const KArgs& a, long long pos, unsigned r, u32x4 (&cw)[2], u32x4 (&sw)[2]) {
  const long long p = clamp_position(pos, a.max_pos);
  const unsigned j0 = (r % kChunksPerHead - kFirstTailChunk) * 8u;  // first pair index of this chunk
  const unsigned esz = a.cache_dtype == kF32 ? 4u : 2u;
  load_cache_words((const FR_GLOBAL unsigned char*)a.cos + p * a.cos_stride_bytes + j0 * esz, a.cache_dtype,
                   a.cache_vec, cw);
  load_cache_words((const FR_GLOBAL unsigned char*)a.sin + p * a.sin_stride_bytes + j0 * esz, a.cache_dtype,
                   a.cache_vec, sw);
}

// A chunk's 16 values, rotated back where it holds rope dims.
template <typename TIn>
__device__ inline void values16(const KArgs& a, const u32x4 (&raw)[2], bool rope, const u32x4 (&cw)[2],
                                const u32x4 (&sw)[2], float (&v)[16]) {
  unpack16<TIn>(raw, v);
  if (rope) {
    float c[8], n[8];
    cache8_from_words(cw, a.cache_dtype, c);
    cache8_from_words(sw, a.cache_dtype, n);
    rotate8(v, c, n);
  }
}

// The chunk quantized with its block's scale byte (bad: the block holds NaN or Inf), stored at dst: one dwordx4
// store, or byte stores where dst is not 16-byte aligned.
__device__ inline void store_fp8(FR_GLOBAL unsigned char* dst, int vec, bool fnuz, const float (&v)[16],
                                 unsigned byte, bool bad) {
  const u32x4 q = fnuz ? quant16<true>(v, byte, bad) : quant16<false>(v, byte, bad);
  if (vec) {
    *(FR_GLOBAL u32x4*)dst = q;
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) dst[i] = (unsigned char)(q[i >> 2] >> (8 * (i & 3)));
  }
}

// A scale byte at dst, as the byte or as the fp32 2^(byte - 127).
__device__ inline void store_scale(FR_GLOBAL unsigned char* dst, bool f32, unsigned byte) {
  if (f32) *(FR_GLOBAL unsigned*)dst = scale_f32_bits(byte);
  else *dst = (unsigned char)byte;
}

template <typename TIn, int kQgs>
__global__ __launch_bounds__(kThreads) void irgq_kernel(KArgs a) {
  constexpr int kLanes = kQgs / kChunk;
  const unsigned tid = __builtin_amdgcn_workitem_id_x();
  const unsigned first = __builtin_amdgcn_workgroup_id_x() * (unsigned)(kThreads * kUnroll) + tid;
  // Every load of the lane is issued before any math or store, in two waves: o and the positions of its
  // rope-tail chunks, then (needing the positions) the cos and sin rows of all of them. Not a chain of
  // o -> position -> cos -> sin -> store per chunk: x_fp8 may alias the caches as far as the compiler knows,
  // so it would keep every later chunk's loads behind the earlier chunk's stores.
  // (The tail test is spelled out rather than read from ChunkPos::tail: that makes clang-19 emit ~40 more
  // instructions per kernel.)
  u32x4 raw[kUnroll][2];
  ChunkPos cps[kUnroll];
  bool rope[kUnroll];  // valid chunk holding 16 rope dims (8 pairs of a head's tail)
  long long pos[kUnroll];
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const unsigned chunk = first + j * kThreads;
    cps[j] = chunk_pos(a, chunk);
    rope[j] = chunk < a.num_chunks && (cps[j].r % kChunksPerHead) >= kFirstTailChunk;
    pos[j] = 0;
    if (chunk < a.num_chunks) {
      load_o16((const FR_GLOBAL unsigned char*)a.o + 32ull * chunk, a.io_vec, raw[j]);
      if (rope[j]) pos[j] = load_position(a, cps[j].s);
    } else {
      raw[j][0] = u32x4{0u, 0u, 0u, 0u};
      raw[j][1] = u32x4{0u, 0u, 0u, 0u};
    }
  }
  u32x4 cw[kUnroll][2], sw[kUnroll][2];  // raw cos / sin words of the rope-tail chunks
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    if (rope[j]) load_cos_sin(a, pos[j], cps[j].r, cw[j], sw[j]);
  }

#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const unsigned chunk = first + j * kThreads;
    const bool valid = chunk < a.num_chunks;
    const ChunkPos cp = cps[j];

    float v[16];
    values16<TIn>(a, raw[j], rope[j], cw[j], sw[j], v);
    const unsigned amax = block_max<kLanes>(amax_bits16(v));
    const bool bad = nonfinite_bits(amax);  // NaN or +-Inf somewhere in the block
    const unsigned byte = e8m0_byte(amax, a.fp8_fnuz != 0);  // 0xFF when bad
    if (valid) {
      store_fp8((FR_GLOBAL unsigned char*)a.x_fp8 + 16ull * chunk, a.io_vec, a.fp8_fnuz != 0, v, byte, bad);
      if (cp.r % kLanes == 0) {
        store_scale((FR_GLOBAL unsigned char*)a.x_scale + scale_offset_bytes(a, cp.s, cp.r, kLanes), a.scale_is_f32,
                    byte);
      }
    }
  }
}

// __syncthreads without the HIP headers: the block's LDS writes are visible to every wave after it.
__device__ inline void block_barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// The tiled kernel (the CUDA one's design, kernels_cuda/inverse_rope_group_quant.cu): a block takes one head of 32
// consecutive tokens; each 32-lane half of a wave takes one token at a time (a lane one 16-element chunk, so a
// quant block stays inside a 16-lane DPP row), 4 tokens in 2 rounds of 2, each round's loads issued before its math.
// The scale bytes meet in LDS and leave after one barrier in token order (tile_slot): 64 lanes write 32
// consecutive tokens of two blocks. x_fp8 rows go through their token and group strides. It writes what the other
// kernel cannot: x_fp8 not contiguous, mfma_tile scales, zeroed padding rows of column-major scales.
constexpr unsigned kTileTokens = 32, kTileRows = kThreads / 32, kRounds = 2;
constexpr unsigned kTokensPerRound = kTileTokens / kTileRows / kRounds;

template <typename TIn, int kQgs>
__global__ __launch_bounds__(kThreads) void irgq_tiled_kernel(KArgs a) {
  constexpr int kLanes = kQgs / kChunk;
  constexpr unsigned kBlocksPerHead = kHeadDim / kQgs;
  __shared__ unsigned char scales[kTileTokens][kBlocksPerHead];
  const unsigned tid = __builtin_amdgcn_workitem_id_x(), bid = __builtin_amdgcn_workgroup_id_x();
  const unsigned head = bid % a.num_heads, s0 = bid / a.num_heads * kTileTokens;
  const unsigned lane = tid % 32, row = tid / 32;  // the chunk in the head; the token of the tile's row
  const unsigned col = head * kHeadDim + lane * kChunk;
  const unsigned g = col / a.dg;
  const unsigned long long x_col = (unsigned long long)a.x_stride_g_bytes * g + (col - g * a.dg);
  const bool tail = lane >= (unsigned)kFirstTailChunk;

#pragma unroll
  for (unsigned round = 0; round < kRounds; ++round) {
    u32x4 raw[kTokensPerRound][2], cw[kTokensPerRound][2], sw[kTokensPerRound][2];
    long long pos[kTokensPerRound];
#pragma unroll
    for (unsigned i = 0; i < kTokensPerRound; ++i) {  // o and the positions, then the cos / sin rows
      const unsigned s = s0 + row + kTileRows * (round * kTokensPerRound + i);
      pos[i] = 0;
      if (s < a.num_tokens) {
        const unsigned long long e = (unsigned long long)s * a.num_heads * kHeadDim + col;  // element of o
        load_o16((const FR_GLOBAL unsigned char*)a.o + 2ull * e, a.io_vec, raw[i]);
        if (tail) pos[i] = load_position(a, s);
      } else {
        raw[i][0] = raw[i][1] = u32x4{0u, 0u, 0u, 0u};
      }
    }
#pragma unroll
    for (unsigned i = 0; i < kTokensPerRound; ++i) {
      if (tail && s0 + row + kTileRows * (round * kTokensPerRound + i) < a.num_tokens) {
        load_cos_sin(a, pos[i], lane, cw[i], sw[i]);
      }
    }

#pragma unroll
    for (unsigned i = 0; i < kTokensPerRound; ++i) {
      const unsigned t = row + kTileRows * (round * kTokensPerRound + i), s = s0 + t;
      float v[16];
      values16<TIn>(a, raw[i], tail && s < a.num_tokens, cw[i], sw[i], v);
      const unsigned amax = block_max<kLanes>(amax_bits16(v));
      const unsigned byte = e8m0_byte(amax, a.fp8_fnuz != 0);
      if (s < a.num_tokens) {
        store_fp8((FR_GLOBAL unsigned char*)a.x_fp8 + (unsigned long long)a.x_stride_s_bytes * s + x_col, a.io_vec,
                  a.fp8_fnuz != 0, v, byte, nonfinite_bits(amax));
      }
      if (lane % kLanes == 0) scales[t][lane / kLanes] = s < a.num_tokens ? (unsigned char)byte : 0;  // padding: 0
    }
  }
  block_barrier();
  for (unsigned i = tid; i < kTileTokens * kBlocksPerHead; i += kThreads) {
    const TileSlot slot = tile_slot(i);
    const unsigned s = s0 + slot.t;
    if (s < (a.mfma_k ? a.num_tokens : a.scale_rows)) {
      store_scale((FR_GLOBAL unsigned char*)a.x_scale + tile_scale_offset_bytes(a, s, head * kBlocksPerHead + slot.kb),
                  a.scale_is_f32, scales[slot.t][slot.kb]);
    }
  }
}

#define FR_INSTANTIATE(TIn, Q) template __global__ void irgq_kernel<TIn, Q>(KArgs);
FR_INSTANTIATE(BF16, 32)
FR_INSTANTIATE(BF16, 64)
FR_INSTANTIATE(BF16, 128)
FR_INSTANTIATE(BF16, 256)
FR_INSTANTIATE(F16, 32)
FR_INSTANTIATE(F16, 64)
FR_INSTANTIATE(F16, 128)
FR_INSTANTIATE(F16, 256)
#undef FR_INSTANTIATE

template <typename TIn>
const void* pick_kernel(int qgs, bool tiled) {
  switch (qgs) {
    case 32: return tiled ? (const void*)&irgq_tiled_kernel<TIn, 32> : (const void*)&irgq_kernel<TIn, 32>;
    case 64: return tiled ? (const void*)&irgq_tiled_kernel<TIn, 64> : (const void*)&irgq_kernel<TIn, 64>;
    case 128: return tiled ? (const void*)&irgq_tiled_kernel<TIn, 128> : (const void*)&irgq_kernel<TIn, 128>;
    case 256: return tiled ? (const void*)&irgq_tiled_kernel<TIn, 256> : (const void*)&irgq_kernel<TIn, 256>;
    default: return nullptr;
  }
}

}  // namespace

const char* irgq_status_string(int status) {
  switch (status) {
    case kOk: return "ok";
    case kUnsupportedShape:
      return "the HIP kernel is compiled for head_dim 512 and rope_dim 64 only, and needs num_heads, "
             "num_groups and max_pos >= 1";
    case kBadGroup:
      return "num_groups must divide H*head_dim, and quant_group_size be 32, 64, 128 or 256 and divide "
             "Dg = H*head_dim/num_groups";
    case kBadDtype: return "unsupported dtype code";
    case kTooLarge:
      return "too large to index: S*H*head_dim/16 >= 2^31 for the generic kernel; H*head_dim, the token rows or "
             "the blocks (rows / 32 * H) >= 2^31 for the tiled kernel";
    case kLaunchFailed: return "hipLaunchKernel failed";
    default: return "unknown status";
  }
}

int launch_inverse_rope_group_quant(const Params& p, hipStream_t stream, int* hip_error) {
  KArgs a;
  long long num_chunks = 0;
  const int st = make_kargs(p, &a, &num_chunks);
  if (st != kOk || num_chunks == 0) return st;
  const int q = p.quant_group_size;
  const bool tiled = a.needs_head || p.kernel == kHeadKernel;

  const void* kernel = p.o_dtype == kBF16 ? pick_kernel<BF16>(q, tiled) : pick_kernel<F16>(q, tiled);
  const long long per_block = (long long)kThreads * kUnroll;
  const dim3 grid(tiled ? (a.scale_rows + kTileTokens - 1) / kTileTokens * a.num_heads
                        : (unsigned)((num_chunks + per_block - 1) / per_block));
  const dim3 block(kThreads);
  void* args[] = {&a};
  const hipError_t err = hipLaunchKernel(kernel, grid, block, args, 0, stream);
  if (err != hipSuccess) (void)hipGetLastError();  // do not leave the error for the next launch check
  if (hip_error) *hip_error = (int)err;
  return err == hipSuccess ? kOk : kLaunchFailed;
}

}  // namespace fusedrope_hip
