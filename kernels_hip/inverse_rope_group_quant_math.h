// Plain-C++ part of the HIP inverse_rope_group_quant kernel: launch geometry, kernel arguments and the scalar
// math (e8m0 byte, exact software fp8 RNE, token division). Included by inverse_rope_group_quant.hip; also
// compiled by g++ on the CPU (tests/irgq_hip_host_harness.cpp) and checked there against fusedrope.reference,
// so this copy of the math is tested even though the HIP kernel cannot run here.
#pragma once

#include "inverse_rope_group_quant.h"

#if defined(__HIP__)
#define FR_HIP_HD __host__ __device__ inline
#else
#define FR_HIP_HD inline
#endif

namespace fusedrope_hip {
namespace detail {

constexpr int kThreads = 256;  // 4 waves of 64
constexpr int kUnroll = 2;     // chunks per lane
constexpr int kChunk = 16;     // elements per lane and chunk
constexpr int kHeadDim = 512;
constexpr int kRopeDim = 64;
constexpr int kChunksPerHead = kHeadDim / kChunk;                // 32
constexpr int kFirstTailChunk = (kHeadDim - kRopeDim) / kChunk;  // 28

// Kernel arguments (host and device see the same layout: generic pointers, cast to global in the kernel).
struct KArgs {
  const void* o;
  void* x_fp8;
  const void* positions;
  const void* cos;
  const void* sin;
  void* x_scale;
  long long pos_stride_bytes;
  long long cos_stride_bytes;
  long long sin_stride_bytes;
  long long max_pos;
  long long scale_stride_s_bytes;
  long long scale_stride_b_bytes;
  unsigned long long tok_magic;  // token = (chunk * tok_magic) >> tok_shift == chunk / chunks_per_token
  unsigned num_chunks;
  unsigned chunks_per_token;
  unsigned tok_shift;
  int pos_is_int64;
  int cache_dtype;
  int cache_vec;                 // cos/sin rows 16-byte aligned: dwordx4 loads
  int io_vec;                    // o and x_fp8 16-byte aligned: dwordx4 loads/stores
  int fp8_fnuz;
  int scale_is_f32;
};

inline bool aligned16(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0; }

// Validate the parameters and derive the kernel arguments (host). Returns an IrgqStatus;
// *num_chunks_out == 0 means there is nothing to launch.
inline int make_kargs(const IrgqParams& p, KArgs* a, long long* num_chunks_out) {
  *num_chunks_out = 0;
  if (p.head_dim != kHeadDim || p.rope_dim != kRopeDim) return kIrgqUnsupportedShape;
  if (p.o_dtype != kIrgqBF16 && p.o_dtype != kIrgqF16) return kIrgqBadDtype;
  if (p.cache_dtype != kIrgqBF16 && p.cache_dtype != kIrgqF16 && p.cache_dtype != kIrgqF32) return kIrgqBadDtype;
  const int q = p.quant_group_size;
  if (q != 32 && q != 64 && q != 128 && q != 256) return kIrgqBadGroup;
  if (p.num_heads < 1 || p.num_groups < 1 || p.max_pos < 1 || p.num_tokens < 0) return kIrgqUnsupportedShape;
  const long long per_token = (long long)p.num_heads * kHeadDim;
  if (per_token % p.num_groups != 0 || (per_token / p.num_groups) % q != 0) return kIrgqBadGroup;
  if (p.num_tokens == 0) return kIrgqOk;
  const long long chunks_per_token = per_token / kChunk;
  if (p.num_tokens > 0x7FFFFFFFLL / chunks_per_token) return kIrgqTooLarge;
  const long long num_chunks = p.num_tokens * chunks_per_token;

  a->o = p.o;
  a->x_fp8 = p.x_fp8;
  a->positions = p.positions;
  a->cos = p.cos;
  a->sin = p.sin;
  a->x_scale = p.x_scale;
  const long long esz = p.cache_dtype == kIrgqF32 ? 4 : 2;
  const long long ssz = p.scale_is_f32 ? 4 : 1;
  a->pos_stride_bytes = p.pos_stride * (p.pos_is_int64 ? 8 : 4);
  a->cos_stride_bytes = p.cos_stride * esz;
  a->sin_stride_bytes = p.sin_stride * esz;
  a->max_pos = p.max_pos;
  a->scale_stride_s_bytes = p.scale_stride_s * ssz;
  a->scale_stride_b_bytes = p.scale_stride_b * ssz;
  // floor(n / d) == (n * m) >> (31 + l) for all n < 2^31 with l = ceil(log2 d), m = ceil(2^(31+l) / d)
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
  return kIrgqOk;
}

FR_HIP_HD float as_float(unsigned u) { return __builtin_bit_cast(float, u); }
FR_HIP_HD unsigned as_uint(float f) { return __builtin_bit_cast(unsigned, f); }

// Token of a chunk (multiply-shift division by chunks_per_token).
FR_HIP_HD unsigned chunk_token(const KArgs& a, unsigned chunk) {
  return (unsigned)(((unsigned long long)chunk * a.tok_magic) >> a.tok_shift);
}

// e8m0 byte of 2^ceil(log2(max(amax, 1e-8) * fp32(1/fp8_max))) for a finite amax (given as |v| bits): the
// exponent field of t plus one when t's mantissa is non-zero.
FR_HIP_HD unsigned e8m0_byte(unsigned amax_bits, float inv_fp8_max) {
  float amax = as_float(amax_bits);
  amax = amax < 1e-8f ? 1e-8f : amax;
  const unsigned t = as_uint(amax * inv_fp8_max);
  return ((t >> 23) & 0xFFu) + ((t & 0x7FFFFFu) != 0u ? 1u : 0u);
}

// fp32 value of a scale byte, 2^(byte - 127); NaN for 0xFF.
FR_HIP_HD unsigned scale_f32_bits(unsigned byte) { return byte == 0xFFu ? 0x7FC00000u : (byte << 23); }

// Exact RNE encoding of a finite |x| <= FP8_MAX into e4m3fn (bias 7) or e4m3fnuz (bias 8, no negative zero).
FR_HIP_HD unsigned fp8_encode_sw(float x, bool fnuz) {
  const unsigned u = as_uint(x);
  unsigned sign = (u >> 24) & 0x80u;
  const unsigned a = u & 0x7FFFFFFFu;
  const float af = as_float(a);
  const float min_normal = fnuz ? 0.0078125f : 0.015625f;  // 2^-7 / 2^-6
  unsigned code;
  if (af < min_normal) {  // subnormal: multiples of 2^-10 / 2^-9, RNE (8 -> the smallest normal, correct)
    code = (unsigned)__builtin_rintf(af * (fnuz ? 1024.0f : 512.0f));
  } else {                // normal: round the 23-bit mantissa to 3 bits, RNE, carry into the exponent
    const unsigned bias = fnuz ? 8u : 7u;
    code = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - ((127u - bias) << 3);
  }
  if (fnuz && code == 0u) sign = 0u;
  return sign | code;
}

}  // namespace detail
}  // namespace fusedrope_hip
