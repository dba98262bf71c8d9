// inverse_rope_group_quant: DeepSeek-V4 attention output -> inverse GPT-J RoPE on each head's 64-dim tail ->
// FP8 e4m3 per-block quant with e8m0 (power-of-two) scales, one launch. NVIDIA sm_80+ (hardware packed e4m3
// conversion on sm_89+/sm_90, exact software RNE below that).
//
// Framework-free: raw pointers, element strides, a cudaStream_t. The torch binding is
// inverse_rope_group_quant_torch.cpp. Parameters, status codes, kernel arguments and the scalar math the HIP
// kernel shares (amax, e8m0 byte, software fp8 RNE, token division) are in inverse_rope_group_quant_common.h;
// the CUDA-only per-chunk math below is plain C++ marked __host__ __device__ too, so that the whole kernel
// compiles with g++ against tests/support/cuda_emul and runs on the CPU in
// tests/inverse_rope_group_quant/test_inverse_rope_group_quant_emulated.py
// (bit-exact scale bytes and fp8 bytes against fusedrope.reference).
//
// Contract: fusedrope.reference.inverse_rope_group_quant (docs/inverse_rope_group_quant.md); the parameters are
// described at Params in inverse_rope_group_quant_common.h. e4m3fnuz output takes the software path only.
#pragma once

#include "inverse_rope_group_quant_common.h"

#if defined(__CUDACC__) || __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define FUSEDROPE_IRGQ_HAVE_CUDA_RUNTIME 1
#else
typedef struct CUstream_st* cudaStream_t;  // the same opaque handle the CUDA headers declare
#define FUSEDROPE_IRGQ_HAVE_CUDA_RUNTIME 0
#endif

namespace fusedrope {
namespace irgq {

// Enqueue on `stream`; never synchronizes. S == 0 returns kOk without a launch. On kLaunchFailed the CUDA
// error code is stored in *cuda_error when given.
int launch(const Params& p, cudaStream_t stream, int* cuda_error = nullptr);
const char* status_string(int status);

// ------------------------------------------------------------------------------------------------------------
// CUDA-only per-chunk math (the HIP kernel has its own, on its vector types and instructions).
// ------------------------------------------------------------------------------------------------------------
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

// Two packed bf16 values times the packed bf16 power of two p2, rounded to nearest (exact unless the product is
// below 2^-126, which the GPU may flush to a zero of the same sign: fp8 rounds both to that zero).
IRGQ_HD uint32_t mul_bf16x2(uint32_t w, uint32_t p2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(w), "r"(p2));
  return r;
#elif defined(__CUDA_ARCH__)
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(p2), "r"(0x80008000u));
  return r;
#else
  const auto half = [](uint32_t x, uint32_t y) {
    const uint32_t u = float_to_bits(bits_to_float(x << 16) * bits_to_float(y << 16));
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? (u >> 16) | 0x40u : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  };
  return half(w & 0xFFFFu, p2 & 0xFFFFu) | (half(w >> 16, p2 >> 16) << 16);
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

}  // namespace irgq
}  // namespace fusedrope
