// CPU checks of the plain-C++ part of the HIP inverse_rope_group_quant kernel (kernels_hip/inverse_rope_group_quant.h
// and the ../kernels_cuda/inverse_rope_group_quant_common.h it shares with the CUDA kernel), for ctypes
// (tests/test_hip_kernels.py): the e8m0 byte, the software fp8 RNE the kernel uses where the hardware format
// differs, the launcher's argument derivation (status codes, byte strides, alignment flags) and its
// multiply-shift token division.
//
// Build: g++ -std=c++17 -O2 -ffp-contract=off -shared -fPIC -I kernels_hip tests/irgq_hip_host_harness.cpp
#define FUSEDROPE_HIP_NO_RUNTIME_HEADERS 1
#include "inverse_rope_group_quant.h"

using namespace fusedrope::irgq;

extern "C" {

// amax values (finite, >= 0) -> e8m0 bytes, exactly as the kernel computes them.
void irgq_hip_e8m0(const float* amax, long long n, int fnuz, unsigned char* out) {
  const float inv = fnuz ? (float)(1.0 / 240.0) : (float)(1.0 / 448.0);
  for (long long i = 0; i < n; ++i) out[i] = (unsigned char)e8m0_byte_finite(float_to_bits(amax[i]) & 0x7FFFFFFFu, inv);
}

// values with |x| <= FP8_MAX -> fp8 bytes through the software RNE.
void irgq_hip_encode(const float* x, long long n, int fnuz, unsigned char* out) {
  for (long long i = 0; i < n; ++i) out[i] = (unsigned char)fp8_encode_sw(x[i], fnuz != 0);
}

// make_kargs on the given sizes; fills out[0..9] = status, num_chunks, chunks_per_token, tok_shift,
// pos_stride_bytes, cos_stride_bytes, scale_stride_s_bytes, scale_stride_b_bytes, cache_vec, io_vec.
void irgq_hip_kargs(void** ptrs, const long long* ints, long long* out) {
  Params p{};
  p.o = ptrs[0];
  p.positions = ptrs[1];
  p.cos = ptrs[2];
  p.sin = ptrs[3];
  p.x_fp8 = ptrs[4];
  p.x_scale = ptrs[5];
  p.num_tokens = ints[0];
  p.num_heads = (int32_t)ints[1];
  p.head_dim = (int32_t)ints[2];
  p.o_dtype = (int32_t)ints[3];
  p.pos_is_int64 = (int32_t)ints[4];
  p.pos_stride = ints[5];
  p.cache_dtype = (int32_t)ints[6];
  p.cos_stride = ints[7];
  p.sin_stride = ints[8];
  p.max_pos = ints[9];
  p.rope_dim = (int32_t)ints[10];
  p.fp8_fnuz = (int32_t)ints[11];
  p.num_groups = (int32_t)ints[12];
  p.quant_group_size = (int32_t)ints[13];
  p.scale_is_f32 = (int32_t)ints[14];
  p.scale_stride_s = ints[15];
  p.scale_stride_b = ints[16];
  KArgs a{};
  long long n = 0;
  out[0] = make_kargs(p, &a, &n);
  out[1] = n;
  out[2] = a.chunks_per_token;
  out[3] = a.tok_shift;
  out[4] = a.pos_stride_bytes;
  out[5] = a.cos_stride_bytes;
  out[6] = a.scale_stride_s_bytes;
  out[7] = a.scale_stride_b_bytes;
  out[8] = a.cache_vec;
  out[9] = a.io_vec;
}

// Mismatches of chunk_pos().s against '/' for chunks_per_token = 32 * heads over edge and random chunk indices.
long long irgq_hip_fastdiv_mismatches(long long heads, long long count) {
  Params p{};
  p.num_tokens = 1;
  p.num_heads = (int32_t)heads;
  p.head_dim = kHeadDim;
  p.rope_dim = kRopeDim;
  p.max_pos = 1;
  p.num_groups = 1;
  p.quant_group_size = 32;
  KArgs a{};
  long long n = 0;
  if (make_kargs(p, &a, &n) != kOk) return -1;
  const unsigned long long d = a.chunks_per_token;
  long long bad = 0;
  unsigned long long x = 0x2545F4914F6CDD1Dull;
  for (long long i = 0; i < count; ++i) {
    unsigned long long c;
    if (i < 4096) c = (unsigned long long)i;
    else if (i < 8192) c = 0x7FFFFFFFull - (unsigned long long)(i - 4096);
    else if (i < 12288) c = (unsigned long long)((i - 8192) / 2 + 1) * d - (unsigned long long)(i & 1);
    else {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      c = x & 0x7FFFFFFFull;
    }
    if (c > 0x7FFFFFFFull) continue;
    if (chunk_pos(a, (unsigned)c).s != c / d) ++bad;
  }
  return bad;
}

}  // extern "C"
