// CPU checks of the plain C++ both inverse_rope_group_quant kernels share (kernels_cuda/
// inverse_rope_group_quant_common.h, which the HIP kernel includes from kernels_hip/inverse_rope_group_quant.h),
// for ctypes (tests/inverse_rope_group_quant/test_inverse_rope_group_quant_common.py): the e8m0 byte, the software fp8
// RNE, the launcher's argument derivation
// (status codes, byte strides, alignment flags) and the multiply-shift token division. The whole kernels run in
// lockstep host emulation instead (tests/inverse_rope_group_quant/test_inverse_rope_group_quant_emulated.py).
//
// Both vendors' headers are included, so g++ -Wall -Werror checks that each compiles as plain C++ too.
// Build: g++ -std=c++17 -O2 -ffp-contract=off -shared -fPIC -I kernels_cuda -I kernels_hip -I tests
//        tests/inverse_rope_group_quant/irgq_host_harness.cpp -o h.so
#include "inverse_rope_group_quant.cuh"  // kernels_cuda: the CUDA kernel's header (includes the shared one)
#define FUSEDROPE_HIP_NO_RUNTIME_HEADERS 1
#include "inverse_rope_group_quant.h"  // kernels_hip: the HIP kernel's header (includes the shared one)
#include "irgq_params.h"               // tests: Params from the ctypes arrays

using namespace fusedrope::irgq;

using irgq_test::params_from;

extern "C" {

// amax values (finite, >= 0) -> e8m0 bytes, exactly as the generic kernels compute them (carry 0) or the head
// kernel (carry 1: e8m0_byte_carry).
void irgq_host_e8m0(const float* amax, long long n, int fnuz, int carry, unsigned char* out) {
  for (long long i = 0; i < n; ++i) {
    const uint32_t bits = float_to_bits(amax[i]) & 0x7FFFFFFFu;
    out[i] = (unsigned char)(carry ? e8m0_byte_carry(bits, fnuz != 0) : e8m0_byte(bits, fnuz != 0));
  }
}

// bf16 pairs (words) times a packed bf16 power of two, as the head kernel scales before the fp8 conversion.
void irgq_host_mul_bf16x2(const unsigned* w, long long n, unsigned p2, unsigned* out) {
  for (long long i = 0; i < n; ++i) out[i] = mul_bf16x2(w[i], p2);
}

// values with |x| <= FP8_MAX -> fp8 bytes through the software RNE.
void irgq_host_encode(const float* x, long long n, int fnuz, unsigned char* out) {
  for (long long i = 0; i < n; ++i) out[i] = (unsigned char)fp8_encode_sw(x[i], fnuz != 0);
}

// make_kargs on the given sizes (ptrs and ints as for params_from); fills out[0..12] = status, num_chunks,
// chunks_per_token, tok_shift, pos_stride_bytes, cos_stride_bytes, scale_stride_s_bytes, scale_stride_b_bytes,
// cache_vec, io_vec, needs_head, scale_rows, heads_per_group.
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
  out[10] = a.needs_head;
  out[11] = a.scale_rows;
  out[12] = a.heads_per_group;
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

// The HIP tiled kernel's write-out for the first 32-token tile (ptrs and ints as for params_from): out[h][i] = the byte
// offset that slot i of head h's block writes (tile_slot, tile_scale_offset_bytes), -1 past the rows it writes;
// H * 32 * (512 / quant_group_size) values.
int irgq_host_tile_offsets(void** ptrs, const long long* ints, long long* out) {
  const Params p = params_from(ptrs, ints);
  KArgs a{};
  long long n = 0;
  const int st = make_kargs(p, &a, &n);
  if (st != kOk) return st;
  const unsigned per_head = kHeadDim / (unsigned)p.quant_group_size, slots = 32u * per_head;
  for (unsigned h = 0; h < a.num_heads; ++h)
    for (unsigned i = 0; i < slots; ++i) {
      const TileSlot slot = tile_slot(i);
      const bool written = slot.t < (a.mfma_k ? a.num_tokens : a.scale_rows);
      out[h * slots + i] = written ? tile_scale_offset_bytes(a, slot.t, h * per_head + slot.kb) : -1;
    }
  return kOk;
}

}  // extern "C"
