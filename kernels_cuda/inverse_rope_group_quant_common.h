// inverse_rope_group_quant: the plain-C++ part that the CUDA kernel (inverse_rope_group_quant.cu) and the HIP
// kernel (../kernels_hip/inverse_rope_group_quant.hip) share: parameters and status codes, launch geometry,
// kernel-argument derivation with the multiply-shift token division, and the scalar math of a quant block (amax
// on |v| bits, e8m0 scale byte, exact software fp8 RNE, scale address and value).
//
// No vendor header: the functions are __host__ __device__ under nvcc (__CUDACC__) and hip-clang (__HIP__,
// spelled as attributes so that a compile check with -nogpuinc needs no HIP header) and plain inline under a
// host compiler: tests/inverse_rope_group_quant/irgq_host_harness.cpp compiles them with g++ and checks them
// bit-exactly against
// fusedrope.reference. The HIP sources include this file as "../kernels_cuda/inverse_rope_group_quant_common.h"
// (the wheel ships both folders as siblings: fusedrope/kernels_cuda and fusedrope/kernels_hip).
//
// Contract (fusedrope.reference.inverse_rope_group_quant; docs/inverse_rope_group_quant.md), per block of
// Q = quant_group_size consecutive elements: amax = max(max|v|, 1e-8), t = amax * fp32(1/FP8_MAX),
// byte = exponent field of t + (mantissa(t) != 0), fp8 = RNE(clamp(v * 2^(127 - byte), +-FP8_MAX)). A block with
// NaN or Inf gets byte 0xFF and fp8 NaN (0x7F; 0x80 for fnuz) in every value.
#pragma once

#include <stdint.h>
#if !defined(__HIP__)
#include <math.h>
#include <string.h>
#endif

#if defined(__CUDACC__)
#define IRGQ_HD __host__ __device__ __forceinline__
#define IRGQ_UNROLL _Pragma("unroll")
#elif defined(__HIP__)
#define IRGQ_HD __attribute__((host)) __attribute__((device)) inline
#define IRGQ_UNROLL _Pragma("unroll")
#else
#define IRGQ_HD inline
#define IRGQ_UNROLL
#endif

namespace fusedrope {
namespace irgq {

enum Status : int {
  kOk = 0,
  kUnsupportedShape = 1,  // head_dim != 512 or rope_dim != 64, a non-positive size, or a scale layout the kernel
                          // does not write
  kBadGroup = 2,          // quant_group_size not in {32, 64, 128, 256}, or not dividing Dg
  kBadDtype = 3,
  kTooLarge = 4,          // the generic kernel: S * H * 512 / 16 >= 2^31; the head kernel: token rows >= 2^31,
                          // heads per group or groups > 65535
  kLaunchFailed = 5,      // the runtime's kernel launch failed (the launcher also returns its error code)
  kBadConfig = 6,         // pdl not 0 or 1, or kernel not kGenericKernel / kHeadKernel
  kPdlUnsupported = 7,    // pdl 1, but the kernel image the device runs was not compiled for sm_90+ (no wait in it)
  kNotHeadLayout = 8,     // the head kernel asked for, or needed by the layout, outside what it is compiled for
};

// Which kernel a launch takes: the generic one (every layout with contiguous x_fp8 rows and no padding rows), or
// the head kernel (its layouts, compile-time; it alone writes group-major or padded x_fp8 and padding rows).
enum Kernel : int { kGenericKernel = 0, kHeadKernel = 1 };

enum ScaleLayout : int { kScaleStrided = 0, kScaleMfmaTile = 1 };

enum Dtype : int { kBF16 = 0, kF16 = 1, kF32 = 2 };

//   o          [S, H, 512] bf16 or fp16, contiguous
//   positions  [>= S] int64 or int32 with element stride pos_stride; clamped to [0, max_pos) on the device
//   cos, sin   [max_pos, 32] bf16 / fp16 / fp32, row strides in elements, last dim contiguous
//   x_fp8      [S, G, Dg] e4m3fn (448) or e4m3fnuz (240), row (s, g) at s * x_stride_s + g * x_stride_g,
//              the Dg elements of a row contiguous (both strides 0: contiguous)
//   x_scale    kScaleStrided: element (s, g, k) at s * scale_stride_s + (g * Ks + k) * scale_stride_b, Ks = Dg / Q,
//              in the e8m0 byte (float8_e8m0fnu / uint8) or float32 = 2^(byte - 127); covers row-major and the
//              column-major view (strides (1, Ks*L, L), L >= scale_rows: the token dim may be padded); token rows
//              S .. scale_rows - 1 get zeros. kScaleMfmaTile: the e8m0 bytes of the contiguous [G, S_pad, Ks_pad]
//              buffer gfx950's scaled MFMA GEMM reads (tile_scale_offset_bytes), padding bytes untouched.
struct Params {
  const void* o = nullptr;
  int64_t num_tokens = 0;   // S
  int32_t num_heads = 0;    // H
  int32_t head_dim = 0;     // must be 512
  int32_t o_dtype = kBF16;  // kBF16 / kF16
  const void* positions = nullptr;
  int32_t pos_is_int64 = 1;
  int64_t pos_stride = 1;   // elements
  const void* cos = nullptr;
  const void* sin = nullptr;
  int32_t cache_dtype = kBF16;
  int64_t cos_stride = 0;   // row strides, elements
  int64_t sin_stride = 0;
  int64_t max_pos = 0;
  int32_t rope_dim = 0;     // must be 64
  void* x_fp8 = nullptr;
  int32_t fp8_fnuz = 0;
  int32_t num_groups = 1;
  int32_t quant_group_size = 128;
  void* x_scale = nullptr;
  int32_t scale_is_f32 = 0;
  int64_t scale_stride_s = 0;  // elements of the scale type
  int64_t scale_stride_b = 0;
  int64_t x_stride_s = 0;      // elements; 0 and 0: contiguous
  int64_t x_stride_g = 0;
  int32_t scale_layout = kScaleStrided;
  int64_t scale_rows = 0;      // token rows of a strided x_scale (>= S; 0: S)
  int32_t pdl = 0;           // 1: a programmatic dependent launch (CUDA, sm_90+: the kernel may start while the
                             // stream's previous kernel finishes, and waits for it before its first global load)
  int32_t kernel = kGenericKernel;  // kHeadKernel: the head kernel for a layout the generic one writes too
};

// ------------------------------------------------------------------------------------------------------------
// Geometry. One lane owns a chunk of 16 consecutive elements: 16 | 512 and 16 | Q, so a chunk lies inside one
// head, one token and one quant block, and a block is Q/16 adjacent lanes (2..16: inside one warp / DPP row).
// ------------------------------------------------------------------------------------------------------------
constexpr int kThreads = 256;
constexpr int kChunk = 16;
constexpr int kHeadDim = 512;
constexpr int kRopeDim = 64;
constexpr int kChunksPerHead = kHeadDim / kChunk;                // 32
constexpr int kFirstTailChunk = (kHeadDim - kRopeDim) / kChunk;  // 28

// Kernel arguments (host and device see the same layout).
struct KArgs {
  const void* o;
  void* x_fp8;
  const void* positions;
  const void* cos;
  const void* sin;
  void* x_scale;
  long long pos_stride_bytes, cos_stride_bytes, sin_stride_bytes, max_pos;
  long long scale_stride_s_bytes, scale_stride_b_bytes;
  unsigned long long tok_magic;  // token = (chunk * tok_magic) >> tok_shift  ==  chunk / chunks_per_token
  unsigned num_chunks, chunks_per_token, tok_shift;
  int pos_is_int64, cache_dtype;
  int cache_vec;  // cos/sin rows 16-byte aligned: 16-byte loads
  int io_vec;     // o and x_fp8 16-byte aligned: 16-byte loads / stores
  int fp8_fnuz, scale_is_f32;
  // The tiled kernel's: x_fp8 row strides, sizes, and the mfma_tile geometry (mfma_k 0: strided scales; 2 or 8:
  // the k alignment of mfma_tile, with the bytes of one 32-token row of tiles and of one group).
  long long x_stride_s_bytes, x_stride_g_bytes, mfma_tile_stride, mfma_group_stride;
  unsigned num_tokens, scale_rows, num_heads, dg, ks, mfma_k;
  unsigned heads_per_group;  // H / G where heads do not straddle groups, else 0
  int needs_head;            // a layout the generic kernel does not write
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The mfma_tile buffer [G, S_pad, Ks_pad]: tokens padded to 32, blocks per group to mfma_k_align(Q) (2 for group
// 128, else 8); *s_pad and *ks_pad from S and Ks.
inline unsigned mfma_k_align(int q) { return q == 128 ? 2u : 8u; }
inline void mfma_tile_dims(long long S, long long ks, int q, long long* s_pad, long long* ks_pad) {
  const long long align = mfma_k_align(q);
  *s_pad = (S + 31) / 32 * 32;
  *ks_pad = (ks + align - 1) / align * align;
}

// Validate and derive the kernel arguments (host). Returns a Status; *num_chunks_out = 0 means nothing to do.
inline int make_kargs(const Params& p, KArgs* a, long long* num_chunks_out) {
  *num_chunks_out = 0;
  if (p.head_dim != kHeadDim || p.rope_dim != kRopeDim) return kUnsupportedShape;
  if (p.o_dtype != kBF16 && p.o_dtype != kF16) return kBadDtype;
  if (p.cache_dtype != kBF16 && p.cache_dtype != kF16 && p.cache_dtype != kF32) return kBadDtype;
  const int q = p.quant_group_size;
  if (q != 32 && q != 64 && q != 128 && q != 256) return kBadGroup;
  if (p.num_heads < 1 || p.num_groups < 1 || p.max_pos < 1 || p.num_tokens < 0) return kUnsupportedShape;
  const long long per_token = (long long)p.num_heads * kHeadDim;
  if (per_token % p.num_groups != 0 || (per_token / p.num_groups) % q != 0) return kBadGroup;
  if (p.scale_layout != kScaleStrided && p.scale_layout != kScaleMfmaTile) return kUnsupportedShape;
  if (p.num_tokens == 0) return kOk;
  const long long chunks_per_token = per_token / kChunk;
  const long long rows = p.scale_rows > p.num_tokens ? p.scale_rows : p.num_tokens;
  const long long num_chunks = p.num_tokens * chunks_per_token;
  a->o = p.o;
  a->x_fp8 = p.x_fp8;
  a->positions = p.positions;
  a->cos = p.cos;
  a->sin = p.sin;
  a->x_scale = p.x_scale;
  const long long esz = p.cache_dtype == kF32 ? 4 : 2, ssz = p.scale_is_f32 ? 4 : 1;
  a->pos_stride_bytes = p.pos_stride * (p.pos_is_int64 ? 8 : 4);
  a->cos_stride_bytes = p.cos_stride * esz;
  a->sin_stride_bytes = p.sin_stride * esz;
  a->max_pos = p.max_pos;
  a->scale_stride_s_bytes = p.scale_stride_s * ssz;
  a->scale_stride_b_bytes = p.scale_stride_b * ssz;
  // floor(n / d) == (n * m) >> (31 + l) for every n < 2^31, l = ceil(log2 d), m = ceil(2^(31+l) / d)
  // (Granlund-Montgomery: 2^(31+l) <= m*d < 2^(31+l) + 2^l).
  const unsigned long long d = (unsigned long long)chunks_per_token;
  unsigned l = 0;
  while ((1ull << l) < d) ++l;
  a->tok_shift = 31 + l;
  a->tok_magic = ((1ull << (31 + l)) + d - 1) / d;
  a->num_chunks = (unsigned)num_chunks;
  a->chunks_per_token = (unsigned)chunks_per_token;
  a->pos_is_int64 = p.pos_is_int64 ? 1 : 0;
  a->cache_dtype = p.cache_dtype;
  a->cache_vec = aligned16(p.cos) && aligned16(p.sin) && a->cos_stride_bytes % 16 == 0 &&
                 a->sin_stride_bytes % 16 == 0;
  a->fp8_fnuz = p.fp8_fnuz ? 1 : 0;
  a->scale_is_f32 = p.scale_is_f32 ? 1 : 0;
  const long long dg = per_token / p.num_groups, ks = dg / q;
  const bool x_default = p.x_stride_s == 0 && p.x_stride_g == 0;
  a->x_stride_s_bytes = x_default ? per_token : p.x_stride_s;
  a->x_stride_g_bytes = x_default ? dg : p.x_stride_g;
  a->io_vec = aligned16(p.o) && aligned16(p.x_fp8) && a->x_stride_s_bytes % 16 == 0 &&
              a->x_stride_g_bytes % 16 == 0;
  a->num_tokens = (unsigned)p.num_tokens;
  a->scale_rows = (unsigned)rows;
  a->num_heads = (unsigned)p.num_heads;
  a->dg = (unsigned)dg;
  a->ks = (unsigned)ks;
  a->mfma_k = p.scale_layout == kScaleMfmaTile ? mfma_k_align(q) : 0u;
  long long s_pad, ks_pad;
  mfma_tile_dims(p.num_tokens, ks, q, &s_pad, &ks_pad);
  a->mfma_tile_stride = 32 * ks_pad;
  a->mfma_group_stride = s_pad * ks_pad;
  const bool x_rows = (a->x_stride_s_bytes == per_token || p.num_tokens == 1) &&
                      (a->x_stride_g_bytes == dg || p.num_groups == 1);
  a->heads_per_group = dg % kHeadDim == 0 ? (unsigned)(dg / kHeadDim) : 0u;
  a->needs_head = !x_rows || a->mfma_k != 0 || rows > p.num_tokens;
  // The generic kernel numbers o's 16-element chunks with 32-bit ints; the head kernel's grid is (token rows / 8,
  // heads per group, groups), and it addresses o and x_fp8 in 64 bits.
  if (a->needs_head || p.kernel == kHeadKernel) {
    if (rows > 0x7FFFFFFFLL || p.num_groups > 65535 || a->heads_per_group > 65535 ||
        rows * p.num_heads > 0xFFFFFFFFLL)
      return kTooLarge;
  } else if (p.num_tokens > 0x7FFFFFFFLL / chunks_per_token) {
    return kTooLarge;
  }
  *num_chunks_out = num_chunks;
  return kOk;
}

// Whether the head kernel is compiled for the call: bf16 o and 16-byte aligned o and x_fp8 rows, e4m3fn, int64
// positions, an fp32 or bf16 cache (fp32 rows 4-byte aligned) of fewer than 2^31 rows, each under 2^31 bytes
// apart, and heads inside groups.
inline bool head_kernel_serves(const Params& p, const KArgs& a) {
  const bool f32_aligned = ((uintptr_t)p.cos | (uintptr_t)p.sin | (uintptr_t)a.cos_stride_bytes |
                            (uintptr_t)a.sin_stride_bytes) % 4 == 0;
  const bool cache = (p.cache_dtype == kBF16 || (p.cache_dtype == kF32 && f32_aligned)) && p.max_pos < 0x7FFFFFFFLL &&
                     a.cos_stride_bytes < 0x7FFFFFFFLL && a.sin_stride_bytes < 0x7FFFFFFFLL;
  return p.o_dtype == kBF16 && a.io_vec && !a.fp8_fnuz && p.pos_is_int64 && cache && a.heads_per_group != 0;
}

// ------------------------------------------------------------------------------------------------------------
// Scalar math, host and device.
// ------------------------------------------------------------------------------------------------------------
IRGQ_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#elif defined(__HIP__)
  return __builtin_bit_cast(float, u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}
IRGQ_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#elif defined(__HIP__)
  return __builtin_bit_cast(uint32_t, f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

// One fp32 product, rounded once (nvcc: __fmul_rn, so it is never contracted into an FMA; a lone product
// feeding no addition cannot be contracted elsewhere either).
IRGQ_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// max of |v| as integer bits: for non-negative floats integer order is float order, and NaN / Inf bits are the
// largest, so the block maximum says directly whether the block holds a non-finite value. A tree, not a running
// maximum: 4 dependent max steps instead of 8 on sm_90 (3-input VIMNMX3), for 2 more max instructions per chunk.
IRGQ_HD uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }
IRGQ_HD uint32_t amax_bits16(const float (&v)[16]) {
  uint32_t m[8];
IRGQ_UNROLL
  for (int i = 0; i < 8; ++i) {
    m[i] = max_u32(float_to_bits(v[i]) & 0x7FFFFFFFu, float_to_bits(v[i + 8]) & 0x7FFFFFFFu);
  }
  return max_u32(max_u32(max_u32(m[0], m[4]), max_u32(m[2], m[6])),
                 max_u32(max_u32(m[1], m[5]), max_u32(m[3], m[7])));
}

IRGQ_HD bool nonfinite_bits(uint32_t amax_bits) { return amax_bits >= 0x7F800000u; }

// fp32(1 / FP8_MAX): 1/448 for e4m3fn, 1/240 for e4m3fnuz.
IRGQ_HD float inv_fp8_max(bool fnuz) { return fnuz ? (float)(1.0 / 240.0) : (float)(1.0 / 448.0); }

// e8m0 byte of a finite block: the exponent field of t = max(amax, 1e-8) * inv_max plus one when t's mantissa
// is non-zero (scale = 2^ceil(log2 t)).
IRGQ_HD uint32_t e8m0_byte_finite(uint32_t amax_bits, float inv_max) {
  float amax = bits_to_float(amax_bits);
  amax = amax < 1e-8f ? 1e-8f : amax;
  const uint32_t t = float_to_bits(mul_rn(amax, inv_max));
  return ((t >> 23) & 0xFFu) + ((t & 0x7FFFFFu) != 0u ? 1u : 0u);
}

// e8m0 byte for a block: 0xFF when non-finite, else e8m0_byte_finite with 1/FP8_MAX.
IRGQ_HD uint32_t e8m0_byte(uint32_t amax_bits, bool fnuz) {
  if (nonfinite_bits(amax_bits)) return 0xFFu;
  return e8m0_byte_finite(amax_bits, inv_fp8_max(fnuz));
}

// e8m0_byte by a carry (the head kernels): amax clamped to [1e-8, Inf] on its bits (NaN to Inf), t = amax *
// inv_max, and t's exponent field rounded up by adding the all-ones mantissa, which carries into the exponent
// exactly when the mantissa is non-zero; an Inf t (a non-finite block) gives 0xFF.
IRGQ_HD uint32_t e8m0_byte_carry(uint32_t amax_bits, bool fnuz) {
  const uint32_t a = amax_bits < 0x322BCC77u ? 0x322BCC77u : amax_bits > 0x7F800000u ? 0x7F800000u : amax_bits;
  return (float_to_bits(mul_rn(bits_to_float(a), inv_fp8_max(fnuz))) + 0x7FFFFFu) >> 23;  // 0x322BCC77: 1e-8f
}

// The bits of 2^(127 - byte), or of NaN for 0xFF (a non-finite block: v * inv is NaN).
IRGQ_HD uint32_t inv_scale_bits_or_nan(uint32_t byte) { return byte == 0xFFu ? 0x7FC00000u : (254u - byte) << 23; }

// 2^(127 - byte) as fp32 (byte in [1, 253]; a finite amax gives [91, 248]).
IRGQ_HD float inv_scale(uint32_t byte) { return bits_to_float((254u - byte) << 23); }

// The fp32 scale value written when x_scale is float32: 2^(byte - 127), NaN for 0xFF.
IRGQ_HD uint32_t scale_f32_bits(uint32_t byte) { return byte == 0xFFu ? 0x7FC00000u : (byte << 23); }

// Exact RNE of a finite x with |x| <= FP8_MAX to e4m3fn (bias 7) or e4m3fnuz (bias 8, no negative zero).
IRGQ_HD uint32_t fp8_encode_sw(float x, bool fnuz) {
  const uint32_t u = float_to_bits(x);
  uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  const float af = bits_to_float(a);
  uint32_t code;
  if (af < (fnuz ? 0.0078125f : 0.015625f)) {  // below the smallest normal: multiples of 2^-10 / 2^-9
    // exact product, RNE; 8 = the smallest normal, also correct
#if defined(__HIP__)
    code = (uint32_t)__builtin_rintf(af * (fnuz ? 1024.0f : 512.0f));
#else
    code = (uint32_t)rintf(af * (fnuz ? 1024.0f : 512.0f));
#endif
  } else {  // round the 23-bit mantissa to 3 bits, RNE, carry into the exponent
    code = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - ((127u - (fnuz ? 8u : 7u)) << 3);
  }
  if (fnuz && code == 0u) sign = 0u;
  return sign | code;
}

// Chunk geometry: token s, chunk index r inside the token, whether the chunk is in a head's rope tail.
struct ChunkPos {
  unsigned s, r;
  bool tail;
};
IRGQ_HD ChunkPos chunk_pos(const KArgs& a, unsigned chunk) {
  ChunkPos c;
  c.s = (unsigned)(((unsigned long long)chunk * a.tok_magic) >> a.tok_shift);
  c.r = chunk - c.s * a.chunks_per_token;
  c.tail = (c.r % kChunksPerHead) >= (unsigned)kFirstTailChunk;
  return c;
}

// Byte offset of the scale of the block that starts at chunk r of token s (lanes per block = Q / 16).
IRGQ_HD long long scale_offset_bytes(const KArgs& a, unsigned s, unsigned r, int lanes) {
  return a.scale_stride_s_bytes * (long long)s + a.scale_stride_b_bytes * (long long)(r / (unsigned)lanes);
}

// The tiled kernel's write-out: thread slot i of a block writes the scale of token t = i % 32 of its 32-token tile
// and of block kb = i / 32 of its head, so a warp's 32 lanes write 32 consecutive tokens of one block.
struct TileSlot {
  unsigned t, kb;
};
IRGQ_HD TileSlot tile_slot(unsigned i) { return TileSlot{i % 32u, i / 32u}; }

// The tiled kernel's byte offset of the scale of block b (= g * Ks + k) of token s, in either scale layout. mfma_tile:
// index (g, s / 32, k / 2, s % 16, k % 2, (s / 16) % 2) of [G, S_pad/32, Ks_pad/2, 16, 2, 2] (mfma_k 2, group 128),
// else (g, s / 32, k / 8, k % 4, s % 16, (k / 4) % 2, (s / 16) % 2) of [G, S_pad/32, Ks_pad/8, 4, 16, 2, 2].
IRGQ_HD long long tile_scale_offset_bytes(const KArgs& a, unsigned s, unsigned b) {
  if (a.mfma_k == 0) return a.scale_stride_s_bytes * (long long)s + a.scale_stride_b_bytes * (long long)b;
  const unsigned g = b / a.ks, k = b - g * a.ks;
  const long long tile = a.mfma_group_stride * g + a.mfma_tile_stride * (s / 32) + (s % 16) * 4 + (s / 16) % 2;
  if (a.mfma_k == 2) return tile + (k / 2) * 64 + (k % 2) * 2;
  return tile + (k / 8) * 256 + (k % 4) * 64 + ((k / 4) % 2) * 2;
}

IRGQ_HD long long clamp_position(long long p, long long max_pos) { return p < 0 ? 0 : (p >= max_pos ? max_pos - 1 : p); }

}  // namespace irgq
}  // namespace fusedrope
