// inverse_rope_group_quant: DeepSeek-V4 attention output -> inverse GPT-J RoPE on each head's 64-dim tail ->
// FP8 e4m3 per-block quant with e8m0 (power-of-two) scales, one launch. NVIDIA sm_80+ (hardware packed e4m3
// conversion on sm_89+/sm_90, exact software RNE below that).
//
// Framework-free: raw pointers, element strides, a cudaStream_t. The torch binding is
// inverse_rope_group_quant_torch.cpp. The scalar math below is plain C++ marked __host__ __device__ so that
// tests/test_cuda_quant_kernels.py compiles it with g++ and runs the kernel's per-chunk / per-block pipeline on
// the CPU against fusedrope.reference (bit-exact scale bytes and fp8 bytes).
//
// Contract (fusedrope.reference.inverse_rope_group_quant; SPEC.md "Op 2"):
//   o          [S, H, 512] bf16 or fp16, contiguous
//   positions  [>= S] int64 or int32 with element stride pos_stride; clamped to [0, max_pos) on the device
//   cos, sin   [max_pos, 32] bf16 / fp16 / fp32, row strides in elements, last dim contiguous
//   x_fp8      [S, G, Dg] contiguous e4m3fn (448) or e4m3fnuz (240, software path only)
//   x_scale    element (s, g, k) at s * scale_stride_s + (g * Ks + k) * scale_stride_b, Ks = Dg / Q, in the
//              e8m0 byte (float8_e8m0fnu / uint8) or float32 = 2^(byte - 127); covers row-major and the
//              column-major view (strides (1, Ks*S, S)).
// Per block of Q = quant_group_size consecutive elements: amax = max(max|v|, 1e-8), t = amax * fp32(1/FP8_MAX),
// byte = exponent field of t + (mantissa(t) != 0), fp8 = RNE(clamp(v * 2^(127 - byte), +-FP8_MAX)). A block with
// NaN or Inf gets byte 0xFF and fp8 NaN (0x7F; 0x80 for fnuz) in every value.
#pragma once

#include <stdint.h>
#include <math.h>
#include <string.h>

#if defined(__CUDACC__) || __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define FUSEDROPE_IRGQ_HAVE_CUDA_RUNTIME 1
#else
typedef struct CUstream_st* cudaStream_t;  // the same opaque handle the CUDA headers declare
#define FUSEDROPE_IRGQ_HAVE_CUDA_RUNTIME 0
#endif

#if defined(__CUDACC__)
#define IRGQ_HD __host__ __device__ __forceinline__
#define IRGQ_UNROLL _Pragma("unroll")
#else
#define IRGQ_HD inline
#define IRGQ_UNROLL
#endif

namespace fusedrope {
namespace irgq {

enum Status : int {
  kOk = 0,
  kUnsupportedShape = 1,  // head_dim != 512 or rope_dim != 64, or a non-positive size
  kBadGroup = 2,          // quant_group_size not in {32, 64, 128, 256}, or not dividing Dg
  kBadDtype = 3,
  kTooLarge = 4,          // S * H * 512 / 16 >= 2^31
  kLaunchFailed = 5,      // cudaLaunchKernel error (cudaGetLastError() has it)
};

enum Dtype : int { kBF16 = 0, kF16 = 1, kF32 = 2 };

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
};

// Enqueue on `stream`; never synchronizes. S == 0 returns kOk without a launch. On kLaunchFailed the CUDA
// error code is stored in *cuda_error when given.
int launch(const Params& p, cudaStream_t stream, int* cuda_error = nullptr);
const char* status_string(int status);

// ------------------------------------------------------------------------------------------------------------
// Geometry and per-chunk / per-block math, shared by the kernel and the CPU emulation test.
// One lane owns a chunk of 16 consecutive elements: 16 | 512 and 16 | Q, so a chunk lies inside one head, one
// token and one quant block, and a block is Q/16 adjacent lanes (2..16, inside one warp).
// ------------------------------------------------------------------------------------------------------------
constexpr int kThreads = 256;
constexpr int kUnroll = 2;
constexpr int kChunk = 16;
constexpr int kHeadDim = 512;
constexpr int kRopeDim = 64;
constexpr int kChunksPerHead = kHeadDim / kChunk;                // 32
constexpr int kFirstTailChunk = (kHeadDim - kRopeDim) / kChunk;  // 28

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
  int pos_is_int64, cache_dtype, cache_vec, io_vec, fp8_fnuz, scale_is_f32;
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

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
  if (p.num_tokens == 0) return kOk;
  const long long chunks_per_token = per_token / kChunk;
  if (p.num_tokens > 0x7FFFFFFFLL / chunks_per_token) return kTooLarge;
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
  a->io_vec = aligned16(p.o) && aligned16(p.x_fp8);
  a->fp8_fnuz = p.fp8_fnuz ? 1 : 0;
  a->scale_is_f32 = p.scale_is_f32 ? 1 : 0;
  *num_chunks_out = num_chunks;
  return kOk;
}

IRGQ_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}
IRGQ_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

// IEEE half -> float (exact). Device: the cvt instruction; host: bit manipulation.
IRGQ_HD float half_to_float(uint32_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
  return f;
#else
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return bits_to_float(sign | 0x7F800000u | (m << 13));  // Inf / NaN
  if (e != 0) return bits_to_float(sign | ((e + 112u) << 23) | (m << 13));
  const float mag = (float)m * (1.0f / 16777216.0f);  // subnormal: m * 2^-24, exact
  return sign ? -mag : mag;
#endif
}

// word w holds two 16-bit values, element 2i in the low half
IRGQ_HD float lo16_to_float(uint32_t w, int dtype) { return dtype == kBF16 ? bits_to_float(w << 16) : half_to_float(w & 0xFFFFu); }
IRGQ_HD float hi16_to_float(uint32_t w, int dtype) { return dtype == kBF16 ? bits_to_float(w & 0xFFFF0000u) : half_to_float(w >> 16); }

IRGQ_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
IRGQ_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
IRGQ_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// 16 elements of o (8 words, element 2i in the low half of word i) -> fp32.
IRGQ_HD void unpack16(const uint32_t (&w)[8], int dtype, float (&v)[16]) {
IRGQ_UNROLL
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = lo16_to_float(w[i], dtype);
    v[2 * i + 1] = hi16_to_float(w[i], dtype);
  }
}

// 8 cache entries -> fp32: fp32 entries are words 0..7, 16-bit entries fill words 0..3.
IRGQ_HD void cache8_from_words(const uint32_t (&w)[8], int dtype, float (&c)[8]) {
  if (dtype == kF32) {
IRGQ_UNROLL
    for (int i = 0; i < 8; ++i) c[i] = bits_to_float(w[i]);
  } else {
IRGQ_UNROLL
    for (int i = 0; i < 4; ++i) {
      c[2 * i] = lo16_to_float(w[i], dtype);
      c[2 * i + 1] = hi16_to_float(w[i], dtype);
    }
  }
}

// Inverse GPT-J rotation of 8 pairs (e, d) = (v[2i], v[2i+1]): e' = e*c + d*n, d' = d*c - e*n. Every product
// and sum is rounded once (explicit _rn intrinsics: no FMA contraction), as the fp32 reference computes it.
IRGQ_HD void rotate8(float (&v)[16], const float (&c)[8], const float (&n)[8]) {
IRGQ_UNROLL
  for (int i = 0; i < 8; ++i) {
    const float e = v[2 * i], d = v[2 * i + 1];
    v[2 * i] = add_rn(mul_rn(e, c[i]), mul_rn(d, n[i]));
    v[2 * i + 1] = sub_rn(mul_rn(d, c[i]), mul_rn(e, n[i]));
  }
}

// max of |v| as integer bits: for non-negative floats integer order is float order, and NaN / Inf bits are the
// largest, so the block maximum says directly whether the block holds a non-finite value.
IRGQ_HD uint32_t amax_bits16(const float (&v)[16]) {
  uint32_t m = 0;
IRGQ_UNROLL
  for (int i = 0; i < 16; ++i) {
    const uint32_t a = float_to_bits(v[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return m;
}

IRGQ_HD bool nonfinite_bits(uint32_t amax_bits) { return amax_bits >= 0x7F800000u; }

// e8m0 byte for a block: 0xFF when non-finite, else the exponent field of t = max(amax, 1e-8) * fp32(1/FP8_MAX)
// plus one when t's mantissa is non-zero (scale = 2^ceil(log2 t)).
IRGQ_HD uint32_t e8m0_byte(uint32_t amax_bits, bool fnuz) {
  if (nonfinite_bits(amax_bits)) return 0xFFu;
  float amax = bits_to_float(amax_bits);
  amax = amax < 1e-8f ? 1e-8f : amax;
  const float inv_max = fnuz ? (float)(1.0 / 240.0) : (float)(1.0 / 448.0);
  const uint32_t t = float_to_bits(mul_rn(amax, inv_max));
  return ((t >> 23) & 0xFFu) + ((t & 0x7FFFFFu) != 0u ? 1u : 0u);
}

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
    code = (uint32_t)rintf(af * (fnuz ? 1024.0f : 512.0f));  // exact product, RNE; 8 = smallest normal
  } else {
    code = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - ((127u - (fnuz ? 8u : 7u)) << 3);
  }
  if (fnuz && code == 0u) sign = 0u;
  return sign | code;
}

IRGQ_HD float clamp_fp8(float y, bool fnuz) {
  const float m = fnuz ? 240.0f : 448.0f;
  return y > m ? m : (y < -m ? -m : y);
}

// Software quant of a 16-element chunk to 16 fp8 bytes (4 little-endian words), the reference's formula.
IRGQ_HD void quant16_sw(const float (&v)[16], uint32_t byte, bool fnuz, uint32_t (&out)[4]) {
  if (byte == 0xFFu) {
    const uint32_t nan4 = fnuz ? 0x80808080u : 0x7F7F7F7Fu;
IRGQ_UNROLL
    for (int i = 0; i < 4; ++i) out[i] = nan4;
    return;
  }
  const float inv = inv_scale(byte);
IRGQ_UNROLL
  for (int i = 0; i < 4; ++i) {
    uint32_t w = 0;
IRGQ_UNROLL
    for (int k = 0; k < 4; ++k) w |= fp8_encode_sw(clamp_fp8(mul_rn(v[4 * i + k], inv), fnuz), fnuz) << (8 * k);
    out[i] = w;
  }
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

IRGQ_HD long long clamp_position(long long p, long long max_pos) { return p < 0 ? 0 : (p >= max_pos ? max_pos - 1 : p); }

}  // namespace irgq
}  // namespace fusedrope
