// CPU checks of the inverse_rope_group_quant kernels' plain C++, for ctypes (tests/test_irgq_common.py,
// tests/test_cuda_quant_kernels.py).
//
// * The part both kernels share (kernels_cuda/inverse_rope_group_quant_common.h, which the HIP kernel includes
//   from kernels_hip/inverse_rope_group_quant.h): the e8m0 byte, the software fp8 RNE, the launcher's argument
//   derivation (status codes, byte strides, alignment flags) and the multiply-shift token division.
// * A CPU emulation of the CUDA kernel: it runs the kernel's own per-chunk and per-block functions
//   (inverse_rope_group_quant.cuh and the shared header: make_kargs, chunk_pos, unpack16, cache8_from_words,
//   rotate8, amax_bits16, e8m0_byte, quant16_sw, scale_offset_bytes, scale_f32_bits) in the kernel's order;
//   only the memory instructions and the warp shuffle are replaced (the shuffle by a max over the Q/16 chunks
//   of a block, which is what the xor butterfly computes). The sm_89+ hardware cvt.rn.satfinite.e4m3x2 path is
//   not emulated: the GPU script checks it.
//
// Both vendors' headers are included, so g++ -Wall -Werror checks that each compiles as plain C++ too.
// Build: g++ -std=c++17 -O2 -ffp-contract=off -shared -fPIC -I kernels_cuda -I kernels_hip
//        tests/irgq_host_harness.cpp -o h.so
#include <string.h>

#include "inverse_rope_group_quant.cuh"  // kernels_cuda: the CUDA kernel's header (includes the shared one)
#define FUSEDROPE_HIP_NO_RUNTIME_HEADERS 1
#include "inverse_rope_group_quant.h"  // kernels_hip: the HIP kernel's header (includes the shared one)
#include "irgq_params.h"               // tests: Params from the ctypes arrays

using namespace fusedrope::irgq;

namespace {

void load_bytes(const void* base, long long off, void* dst, size_t n) {
  memcpy(dst, static_cast<const unsigned char*>(base) + off, n);
}

using irgq_test::params_from;

}  // namespace

extern "C" {

// The CUDA kernel on the CPU (ptrs and ints as for params_from).
int irgq_host_run(void** ptrs, const long long* ints) {
  const Params p = params_from(ptrs, ints);

  KArgs a;
  long long num_chunks = 0;
  const int st = make_kargs(p, &a, &num_chunks);
  if (st != kOk || num_chunks == 0) return st;
  const int lanes = p.quant_group_size / kChunk;
  const bool fnuz = a.fp8_fnuz != 0;

  for (long long base = 0; base < num_chunks; base += lanes) {  // one quant block = `lanes` adjacent lanes
    float v[16][16];
    ChunkPos cps[16];
    uint32_t m = 0;
    for (int l = 0; l < lanes; ++l) {
      const unsigned chunk = (unsigned)(base + l);
      cps[l] = chunk_pos(a, chunk);
      uint32_t w[8];
      load_bytes(a.o, 32ll * chunk, w, 32);
      unpack16(w, p.o_dtype, v[l]);
      if (cps[l].tail) {
        long long pos;
        if (a.pos_is_int64) {
          load_bytes(a.positions, a.pos_stride_bytes * cps[l].s, &pos, 8);
        } else {
          int32_t p32;
          load_bytes(a.positions, a.pos_stride_bytes * cps[l].s, &p32, 4);
          pos = p32;
        }
        pos = clamp_position(pos, a.max_pos);
        const unsigned j0 = (cps[l].r % kChunksPerHead - kFirstTailChunk) * 8u;
        const long long esz = a.cache_dtype == kF32 ? 4 : 2;
        uint32_t cw[8] = {0, 0, 0, 0, 0, 0, 0, 0}, nw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        load_bytes(a.cos, pos * a.cos_stride_bytes + j0 * esz, cw, (size_t)(8 * esz));
        load_bytes(a.sin, pos * a.sin_stride_bytes + j0 * esz, nw, (size_t)(8 * esz));
        float c[8], n[8];
        cache8_from_words(cw, a.cache_dtype, c);
        cache8_from_words(nw, a.cache_dtype, n);
        rotate8(v[l], c, n);
      }
      const uint32_t ml = amax_bits16(v[l]);
      m = ml > m ? ml : m;
    }
    const uint32_t byte = e8m0_byte(m, fnuz);
    for (int l = 0; l < lanes; ++l) {
      const unsigned chunk = (unsigned)(base + l);
      uint32_t q[4];
      quant16_sw(v[l], byte, fnuz, q);
      memcpy(static_cast<unsigned char*>(a.x_fp8) + 16ll * chunk, q, 16);
      if (cps[l].r % (unsigned)lanes == 0) {
        unsigned char* sd = static_cast<unsigned char*>(a.x_scale) + scale_offset_bytes(a, cps[l].s, cps[l].r, lanes);
        if (a.scale_is_f32) {
          const uint32_t bits = scale_f32_bits(byte);
          memcpy(sd, &bits, 4);
        } else {
          *sd = (unsigned char)byte;
        }
      }
    }
  }
  return kOk;
}

// amax values (finite, >= 0) -> e8m0 bytes, exactly as both kernels compute them.
void irgq_host_e8m0(const float* amax, long long n, int fnuz, unsigned char* out) {
  for (long long i = 0; i < n; ++i) out[i] = (unsigned char)e8m0_byte(float_to_bits(amax[i]) & 0x7FFFFFFFu, fnuz != 0);
}

// values with |x| <= FP8_MAX -> fp8 bytes through the software RNE.
void irgq_host_encode(const float* x, long long n, int fnuz, unsigned char* out) {
  for (long long i = 0; i < n; ++i) out[i] = (unsigned char)fp8_encode_sw(x[i], fnuz != 0);
}

// make_kargs on the given sizes (ptrs and ints as for params_from); fills out[0..9] = status, num_chunks,
// chunks_per_token, tok_shift, pos_stride_bytes, cos_stride_bytes, scale_stride_s_bytes, scale_stride_b_bytes,
// cache_vec, io_vec.
void irgq_host_kargs(void** ptrs, const long long* ints, long long* out) {
  const Params p = params_from(ptrs, ints);
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

// Checks the kernels' multiply-shift token division (chunk_pos: token s and chunk r inside it) against '/' and
// '%' for `count` chunk indices in [0, 2^31): the first and last 4096, 4096 around multiples of
// chunks_per_token = 32 * heads, the rest xorshift-random from `seed`. Returns the mismatches (-1: bad sizes).
long long irgq_host_fastdiv_mismatches(long long heads, long long count, unsigned long long seed) {
  Params p;
  p.num_tokens = 1;
  p.num_heads = (int32_t)heads;
  p.head_dim = kHeadDim;
  p.rope_dim = kRopeDim;
  p.max_pos = 1;
  p.num_groups = 1;
  p.quant_group_size = 32;
  KArgs a;
  long long n = 0;
  if (make_kargs(p, &a, &n) != kOk) return -1;
  const unsigned long long d = a.chunks_per_token;
  long long bad = 0;
  unsigned long long x = seed;
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
    const ChunkPos cp = chunk_pos(a, (unsigned)c);
    if (cp.s != c / d || cp.r != c % d) ++bad;
  }
  return bad;
}

}  // extern "C"
