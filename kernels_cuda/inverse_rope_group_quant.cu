// inverse_rope_group_quant CUDA kernels and launcher (contract and math: inverse_rope_group_quant.cuh).
//
// Two kernels. The generic kernel (the default): a thread owns a chunk of 16 consecutive elements of o, two
// 16-byte loads and one 16-byte store of fp8; a quant block of Q elements is Q/16 adjacent lanes, reduced with
// log2(Q/16) xor shuffles; the layout (alignment, cache dtype, fp8 format, scale strides) is read per call, and
// the four lanes of a head's rope tail rotate eight pairs each while the other 28 wait. The head kernel (backend
// cuda_head, opt-in: docs/status.md): a warp per (token, head), every lane rotating one of the
// head's 32 rope pairs, the layout compile-time; it alone writes group-major or padded x_fp8 and padding rows.
// Its issue budget is measured on the CPU by bench/static/budget.py (docs/benchmarks.md).
//
// Every load is issued before any math: o with the position, then the cos/sin rows it selects (read-only path).
// No local memory, and no shared memory but the head kernel's scale exchange for strided scales.
//
// fp8: sm_89+ converts pairs with cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float2_to_fp8x2, __NV_SATFINITE; the
// saturation is the reference's clamp to +-448); sm_80 and the fnuz format use the exact software RNE of the
// header. The rotation uses __fmul_rn / __fadd_rn / __fsub_rn, so no FMA contraction changes the fp32 values.
#include "inverse_rope_group_quant.cuh"
#include "pdl.cuh"

#include <cuda_runtime.h>
#include <cuda_fp8.h>

#include <type_traits>

namespace fusedrope {
namespace irgq {
namespace {

__device__ __forceinline__ void load_words16(const void* p, bool vec, uint32_t (&w)[8]) {
  if (vec) {
    const uint4 a = reinterpret_cast<const uint4*>(p)[0];
    const uint4 b = reinterpret_cast<const uint4*>(p)[1];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else {  // 2-byte aligned (an odd storage offset): 16-bit loads
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = (uint32_t)h[2 * i] | ((uint32_t)h[2 * i + 1] << 16);
  }
}

// The raw words of 8 cache entries at byte address p (16 bytes for bf16/fp16, 32 for fp32; the other words 0),
// through the read-only path: no kernel writes a cache, so these loads may be issued ahead of any store.
__device__ __forceinline__ void load_cache_words(const unsigned char* p, int dtype, bool vec, uint32_t (&w)[8]) {
  if (dtype == kF32) {
    if (vec) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
      const uint4 b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = __ldg(reinterpret_cast<const uint32_t*>(p) + i);
    }
  } else {
    if (vec) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    } else {
      const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = (uint32_t)__ldg(h + 2 * i) | ((uint32_t)__ldg(h + 2 * i + 1) << 16);
    }
    w[4] = w[5] = w[6] = w[7] = 0u;
  }
}

// The hardware packed e4m3 conversion exists from sm_89. tests/support/cuda_emul defines the switch to run this path on
// the CPU through its model of __nv_cvt_float2_to_fp8x2.
#ifndef FUSEDROPE_IRGQ_HW_E4M3
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define FUSEDROPE_IRGQ_HW_E4M3 1
#else
#define FUSEDROPE_IRGQ_HW_E4M3 0
#endif
#endif

template <bool kFnuz>
__device__ __forceinline__ void quant16(const float (&v)[16], uint32_t byte, uint32_t (&out)[4]) {
#if FUSEDROPE_IRGQ_HW_E4M3
  if (!kFnuz) {
    const float inv = inv_scale(byte == 0xFFu ? 127u : byte);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * i] * inv, v[4 * i + 1] * inv),
                                                   __NV_SATFINITE, __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * i + 2] * inv, v[4 * i + 3] * inv),
                                                   __NV_SATFINITE, __NV_E4M3);
      out[i] = byte == 0xFFu ? 0x7F7F7F7Fu : (lo | (hi << 16));
    }
    return;
  }
#endif
  quant16_sw(v, byte, kFnuz, out);
}

// The position of token s, for its rope-tail chunks.
__device__ __forceinline__ long long load_position(const KArgs& a, unsigned s) {
  const unsigned char* pp = static_cast<const unsigned char*>(a.positions) + a.pos_stride_bytes * s;
  return a.pos_is_int64 ? __ldg(reinterpret_cast<const long long*>(pp))
                        : (long long)__ldg(reinterpret_cast<const int*>(pp));
}

// The raw cos / sin words of rope-tail chunk r (its index in the token row) at position pos (clamped here).
__device__ __forceinline__ void load_cos_sin(const KArgs& a, long long pos, unsigned r, int cache_dtype, bool vec,
                                             uint32_t (&cw)[8], uint32_t (&sw)[8]) {
  const long long p = clamp_position(pos, a.max_pos);
  const unsigned j0 = (r % kChunksPerHead - kFirstTailChunk) * 8u;  // 16 rope dims = 8 (e, d) pairs
  const unsigned esz = cache_dtype == kF32 ? 4u : 2u;
  load_cache_words(static_cast<const unsigned char*>(a.cos) + p * a.cos_stride_bytes + j0 * esz, cache_dtype, vec, cw);
  load_cache_words(static_cast<const unsigned char*>(a.sin) + p * a.sin_stride_bytes + j0 * esz, cache_dtype, vec, sw);
}

// A chunk's 16 values (rotated back in a rope tail) and its quant block's e8m0 byte. Every lane shuffles, valid or
// not: a block's lanes are adjacent and the warp's mask is full.
template <int kDtype, int kLanes>
__device__ __forceinline__ uint32_t rotate_and_scale(const uint32_t (&raw)[8], bool tail, const uint32_t (&cw)[8],
                                                     const uint32_t (&sw)[8], int cache_dtype, bool fnuz,
                                                     float (&v)[16]) {
  unpack16(raw, kDtype, v);
  if (tail) {
    float c[8], n[8];
    cache8_from_words(cw, cache_dtype, c);
    cache8_from_words(sw, cache_dtype, n);
    rotate8(v, c, n);
  }
  uint32_t m = amax_bits16(v);
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  return e8m0_byte(m, fnuz);
}

// A chunk quantized with its block's byte, its 16 fp8 bytes stored at x_fp8 + offset: one 16-byte store, or byte
// stores where that is not 16-byte aligned.
__device__ __forceinline__ void store_fp8(void* x_fp8, unsigned long long offset, bool vec, bool fnuz,
                                          const float (&v)[16], uint32_t byte) {
  uint32_t q[4];
  if (fnuz) quant16<true>(v, byte, q);
  else quant16<false>(v, byte, q);
  unsigned char* dst = static_cast<unsigned char*>(x_fp8) + offset;
  if (vec) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(q[0], q[1], q[2], q[3]);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) dst[i] = (unsigned char)(q[i >> 2] >> (8 * (i & 3)));
  }
}

// A scale byte at dst, as the byte or as the fp32 2^(byte - 127).
__device__ __forceinline__ void store_scale(unsigned char* dst, bool f32, uint32_t byte) {
  if (f32) *reinterpret_cast<uint32_t*>(dst) = scale_f32_bits(byte);
  else *dst = (unsigned char)byte;
}

// The generic kernel: the layout (alignment, cache dtype, fp8 format, scale strides) read from KArgs per call.
template <int kDtype, int kQ>
__global__ void __launch_bounds__(kThreads) irgq_kernel(const KArgs a) {
  const int cache_dtype = a.cache_dtype;
  const bool cache_vec = a.cache_vec != 0;
  const bool fnuz = a.fp8_fnuz != 0;
  constexpr int kLanes = kQ / kChunk;
  const unsigned chunk = blockIdx.x * kThreads + threadIdx.x;
  const bool valid = chunk < a.num_chunks;
  const ChunkPos cp = chunk_pos(a, chunk);

  // Every load is issued before any math, in two waves: o and (rope-tail chunks) the position, then the cos and
  // sin rows the position selects.
  uint32_t raw[8];
  long long pos = 0;
  wait_for_previous_grid();
  if (valid) {
    load_words16(static_cast<const unsigned char*>(a.o) + 32ull * chunk, a.io_vec != 0, raw);
    if (cp.tail) pos = load_position(a, cp.s);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) raw[i] = 0u;
  }
  uint32_t cw[8], sw[8];  // raw cos / sin words of a rope-tail chunk
  if (valid && cp.tail) load_cos_sin(a, pos, cp.r, cache_dtype, cache_vec, cw, sw);
  allow_next_grid();

  float v[16];
  const uint32_t byte = rotate_and_scale<kDtype, kLanes>(raw, valid && cp.tail, cw, sw, cache_dtype, fnuz, v);
  if (valid) {
    store_fp8(a.x_fp8, 16ull * chunk, a.io_vec, fnuz, v, byte);
    if (cp.r % kLanes == 0) {
      store_scale(static_cast<unsigned char*>(a.x_scale) + scale_offset_bytes(a, cp.s, cp.r, kLanes),
                  a.scale_is_f32, byte);
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// The head kernel: a warp takes one head of one token and a block 8 consecutive tokens of one head. Lane i holds
// chunk i of the head's 32 (16 elements, two 16-byte loads and one 16-byte store) for the 448 dims without rope,
// and pair i of the head's 32 rope pairs (one 4-byte load of o, one cos and one sin entry, one 2-byte store): every
// lane rotates one pair, so no lane idles while four rotate eight. The layout is compile-time: bf16 o 16-byte
// aligned, e4m3fn, the cache dtype (kCache), and the scales (kScales): row-major e8m0, or any strides, e8m0 or
// fp32, with padding rows, which meet in shared memory and leave in token order (8 consecutive tokens per run).
// x_fp8 rows go through their token and group strides (row-major, group-major, padded).
// ------------------------------------------------------------------------------------------------------------
enum HeadScales : int { kRowMajorE8m0 = 0, kStridedScales = 1 };
constexpr unsigned kHeadTokens = kThreads / 32;

// |bf16| maximum of 8 words of packed bf16 pairs, as fp32 bits (integer order is |value| order, NaN above Inf).
__device__ __forceinline__ uint32_t amax_bits_bf16(const uint4& a, const uint4& b) {
  constexpr uint32_t kAbs = 0x7FFF7FFFu;
  const uint32_t m = __vmaxu2(__vmaxu2(__vmaxu2(a.x & kAbs, a.y & kAbs), __vmaxu2(a.z & kAbs, a.w & kAbs)),
                              __vmaxu2(__vmaxu2(b.x & kAbs, b.y & kAbs), __vmaxu2(b.z & kAbs, b.w & kAbs)));
  return max(m << 16, m & 0xFFFF0000u);
}

// Two fp32 values -> two e4m3fn bytes (x to the low one), saturated to +-448, NaN to 0x7F.
__device__ __forceinline__ uint32_t e4m3x2(float x, float y) {
#if FUSEDROPE_IRGQ_HW_E4M3
  return __nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3);
#else
  const auto one = [](float v) { return v != v ? 0x7Fu : fp8_encode_sw(clamp_fp8(v, false), false); };
  return one(x) | (one(y) << 8);
#endif
}

// 16 bf16 values (two uint4 of packed pairs) times 2^(127 - byte) (inv: its bits, NaN for byte 0xFF) -> 16 e4m3fn
// bytes. The scaling is a packed bf16 product, exact (a power of two), so each value is converted from the same
// fp32 number as v * inv in fp32.
__device__ __forceinline__ uint4 quant16_bf16(const uint4& a, const uint4& b, uint32_t inv) {
  const uint32_t inv2 = __byte_perm(inv, 0u, 0x3232u), w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t y0 = mul_bf16x2(w[2 * i], inv2), y1 = mul_bf16x2(w[2 * i + 1], inv2);
    q[i] = e4m3x2(bits_to_float(y0 << 16), bits_to_float(y0 & 0xFFFF0000u)) |
           (e4m3x2(bits_to_float(y1 << 16), bits_to_float(y1 & 0xFFFF0000u)) << 16);
  }
  return make_uint4(q[0], q[1], q[2], q[3]);
}

// *p = v where `on`, as one predicated store (no branch around it: the head kernel branches only per warp).
__device__ __forceinline__ void store_if(bool on, uint4* p, const uint4& v) {
#if defined(__CUDA_ARCH__)
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %0, 0;\n @q st.global.v4.b32 [%1], {%2, %3, %4, %5};\n}"
               :: "r"((int)on), "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#else
  if (on) *p = v;
#endif
}

// Entry j of row p of a cos / sin cache (rows `stride` bytes apart) as fp32.
template <int kCache>
__device__ __forceinline__ float cache_entry(const void* cache, unsigned p, unsigned stride, unsigned j) {
  using E = typename std::conditional<kCache == kF32, float, unsigned short>::type;
  const E* col = static_cast<const E*>(cache) + j;
  const E v = __ldg(reinterpret_cast<const E*>(reinterpret_cast<const unsigned char*>(col) +
                                               (unsigned long long)p * stride));
  if (kCache == kF32) return v;
  return bits_to_float((uint32_t)v << 16);
}

template <int kQ, int kCache, int kScales>
__global__ void __launch_bounds__(kThreads) irgq_head_kernel(const KArgs a) {
  static_assert(kCache == kF32 || kCache == kBF16, "the head kernel's caches");
  constexpr unsigned kLanes = kQ / kChunk;                                // chunk lanes per quant block
  constexpr unsigned kBlocks = kHeadDim / kQ;                             // quant blocks per head
  constexpr unsigned kTailBlockLane = kFirstTailChunk / kLanes * kLanes;  // first lane of the rope tail's block
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned s = blockIdx.x * kHeadTokens + warp;
  const unsigned head = blockIdx.z * a.heads_per_group + blockIdx.y;
  const bool body = lane < kFirstTailChunk;  // lanes holding a chunk without rope dims
  // Past the last token: nothing in the row-major kernel; in the strided one, zero scales (padding rows) only.
  const bool real = s < a.num_tokens;
  if (kScales == kRowMajorE8m0 && !real) return;
  wait_for_previous_grid();
  uint32_t byte = 0;  // this lane's quant block's scale byte; 0 in the padding rows
  // The padding warps of the strided kernel go straight to the exchange. A vote: the compiler then knows the
  // branch is warp-uniform, and puts no divergence path around the shuffles.
  if (kScales == kRowMajorE8m0 || __all_sync(0xFFFFFFFFu, real)) {
    const unsigned row = s * a.num_heads + head;  // (token, head): S * H < 2^32 (make_kargs)
    // Every lane loads a chunk (the tail's four are unused: their values, maxima and stores are the pairs').
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(a.o) + kChunk * 2 * lane) +
                       (unsigned long long)row * (kHeadDim / 8);
    const uint4 v0 = src[0], v1 = src[1];
    const uint32_t ed = (static_cast<const uint32_t*>(a.o) + (kHeadDim - kRopeDim) / 2 + lane)[
        (unsigned long long)row * (kHeadDim / 2)];
    // not __ldg: a read-only load may be hoisted above the wait for the previous grid, which may write positions
    const long long pos = *reinterpret_cast<const long long*>(static_cast<const unsigned char*>(a.positions) +
                                                              a.pos_stride_bytes * s);
    // clamped to [0, max_pos) (max_pos < 2^31): a negative position is past max_pos as unsigned, then 0
    const unsigned below = (unsigned long long)pos < (unsigned long long)a.max_pos ? (unsigned)pos
                                                                                   : (unsigned)a.max_pos - 1u;
    const unsigned p = pos < 0 ? 0u : below;
    const float c = cache_entry<kCache>(a.cos, p, (unsigned)a.cos_stride_bytes, lane);
    const float n = cache_entry<kCache>(a.sin, p, (unsigned)a.sin_stride_bytes, lane);
    allow_next_grid();

    // The rope pair, rotated back: e' = e*c + d*n, d' = d*c - e*n, each product and sum rounded once.
    const float e = bits_to_float(ed << 16), d = bits_to_float(ed & 0xFFFF0000u);
    const float e2 = add_rn(mul_rn(e, c), mul_rn(d, n)), d2 = sub_rn(mul_rn(d, c), mul_rn(e, n));
    // Block maxima of |v| as integer bits: the chunks' over their kLanes lanes; the tail's block over the pairs
    // (and, for Q >= 128, the chunks of the rope tail's block that hold no rope dims).
    const uint32_t chunk_m = amax_bits_bf16(v0, v1);
    uint32_t m = chunk_m;
#pragma unroll
    for (unsigned off = 1; off < kLanes; off <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    uint32_t t = max(float_to_bits(e2) & 0x7FFFFFFFu, float_to_bits(d2) & 0x7FFFFFFFu);
    if (kQ >= 128 && lane >= kTailBlockLane && body) t = max(t, chunk_m);
#pragma unroll
    for (unsigned off = 1; off < (kQ == 32 ? 16u : 32u); off <<= 1) t = max(t, __shfl_xor_sync(0xFFFFFFFFu, t, off));
    // The chunk lanes from the rope tail's block on take its maximum, and so its scale, which the pairs then read
    // from them: for Q = 32 its two blocks are pairs 0..15 (chunk lanes 28, 29) and 16..31 (30, 31).
    const uint32_t t_other = kQ == 32 ? __shfl_xor_sync(0xFFFFFFFFu, t, 16) : t;
    if (lane >= kTailBlockLane) m = kQ == 32 && lane < 30 ? t_other : t;
    byte = e8m0_byte_carry(m, false);
    const uint32_t inv = inv_scale_bits_or_nan(byte);
    const float ti = bits_to_float(__shfl_sync(0xFFFFFFFFu, inv, kQ == 32 ? 28 + 2 * (lane / 16) : 31));

    unsigned char* x_row = static_cast<unsigned char*>(a.x_fp8) + a.x_stride_s_bytes * s +
                           a.x_stride_g_bytes * blockIdx.z + (unsigned long long)kHeadDim * blockIdx.y;
    store_if(body, reinterpret_cast<uint4*>(x_row + kChunk * lane), quant16_bf16(v0, v1, inv));
    *reinterpret_cast<unsigned short*>(x_row + (kHeadDim - kRopeDim) + 2 * lane) =
        (unsigned short)e4m3x2(e2 * ti, d2 * ti);
    if (kScales == kRowMajorE8m0 && lane % kLanes == 0) {
      (static_cast<unsigned char*>(a.x_scale) + lane / kLanes)[(unsigned long long)row * kBlocks] =
          (unsigned char)byte;
    }
  }
  if (kScales == kStridedScales) {  // every block's bytes of the 8 tokens, then runs of 8 tokens per block
    __shared__ unsigned char bytes[kBlocks][kHeadTokens];
    if (lane % kLanes == 0) bytes[lane / kLanes][warp] = (unsigned char)byte;
    __syncthreads();
#pragma unroll
    for (unsigned i = threadIdx.x; i < kBlocks * kHeadTokens; i += kThreads) {
      const unsigned ts = blockIdx.x * kHeadTokens + i % kHeadTokens, b = head * kBlocks + i / kHeadTokens;
      if (ts < a.scale_rows) {
        store_scale(static_cast<unsigned char*>(a.x_scale) + a.scale_stride_s_bytes * ts + a.scale_stride_b_bytes * b,
                    a.scale_is_f32, bytes[i / kHeadTokens][i % kHeadTokens]);
      }
    }
  }
}

// cudaLaunchKernel rather than <<<>>>: the same launch, and plain C++, so that
// tests/inverse_rope_group_quant/test_inverse_rope_group_quant_emulated.py compiles this file with g++ against
// tests/support/cuda_emul and runs the whole kernel on the CPU.
cudaError_t launch_kernel(void (*kernel)(KArgs), dim3 grid, bool pdl, cudaStream_t stream, const KArgs& a) {
  if (pdl) return launch_pdl(kernel, grid, dim3(kThreads), stream, a);
  KArgs args_copy = a;
  void* args[] = {&args_copy};
  return cudaLaunchKernel(kernel, grid, dim3(kThreads), args, 0, stream);
}

template <int kQ>
void (*head_kernel(const KArgs& a, bool row_major))(KArgs) {
  if (a.cache_dtype == kF32) return row_major ? irgq_head_kernel<kQ, kF32, kRowMajorE8m0> : irgq_head_kernel<kQ, kF32, kStridedScales>;
  return row_major ? irgq_head_kernel<kQ, kBF16, kRowMajorE8m0> : irgq_head_kernel<kQ, kBF16, kStridedScales>;
}

template <int kQ>
void (*generic_kernel(int o_dtype))(KArgs) {
  return o_dtype == kBF16 ? irgq_kernel<kBF16, kQ> : irgq_kernel<kF16, kQ>;
}

}  // namespace

const char* status_string(int status) {
  switch (status) {
    case kOk: return "ok";
    case kUnsupportedShape:
      return "the CUDA kernels are compiled for head_dim 512 and rope_dim 64, need num_heads, num_groups and "
             "max_pos >= 1, and write row- or column-major scales (not mfma_tile)";
    case kBadGroup:
      return "num_groups must divide H*head_dim, and quant_group_size be 32, 64, 128 or 256 and divide "
             "Dg = H*head_dim/num_groups";
    case kBadDtype: return "unsupported dtype code";
    case kTooLarge:
      return "too large to index: S*H*head_dim/16 >= 2^31 for the generic kernel; token rows >= 2^31, heads per "
             "group or groups > 65535 for the head kernel";
    case kLaunchFailed: return "kernel launch failed";
    case kBadConfig: return "pdl must be 0 or 1, and kernel 0 (generic) or 1 (head)";
    case kPdlUnsupported:
      return "pdl=1 unsupported here: it needs the kernel compiled for sm_90 or newer (its wait for the previous "
             "kernel), and this device runs one compiled for an older arch, or the runtime refused the programmatic "
             "dependent launch";
    case kNotHeadLayout:
      return "the head kernel (asked for, or the only one writing a group-major or padded x_fp8 or padding rows "
             "of x_scale) needs bfloat16 o, o and x_fp8 rows 16-byte aligned, float8_e4m3fn, a float32 or "
             "bfloat16 cache and H divisible by num_groups";
    default: return "unknown status";
  }
}

int launch(const Params& p, cudaStream_t stream, int* cuda_error) {
  KArgs a;
  long long num_chunks = 0;
  const int st = make_kargs(p, &a, &num_chunks);
  if (st != kOk || num_chunks == 0) return st;
  if ((p.pdl != 0 && p.pdl != 1) || (p.kernel != kGenericKernel && p.kernel != kHeadKernel)) return kBadConfig;
  if (p.scale_layout != kScaleStrided) return kUnsupportedShape;
  // The head kernel where asked for or needed; where asked for and the call is outside it, the generic kernel.
  bool head = p.kernel == kHeadKernel || a.needs_head;
  if (head && !head_kernel_serves(p, a)) {
    if (a.needs_head) return kNotHeadLayout;
    head = false;
  }
  const int q = p.quant_group_size;
  void (*kernel)(KArgs);
  dim3 grid;
  if (head) {
    const bool row_major = a.scale_rows == a.num_tokens && a.scale_stride_b_bytes == 1 && !a.scale_is_f32 &&
                           a.scale_stride_s_bytes == (long long)a.num_heads * (kHeadDim / q);
    kernel = q == 32 ? head_kernel<32>(a, row_major) : q == 64 ? head_kernel<64>(a, row_major)
             : q == 128 ? head_kernel<128>(a, row_major) : head_kernel<256>(a, row_major);
    grid = dim3((a.scale_rows + kHeadTokens - 1) / kHeadTokens, a.heads_per_group, p.num_groups);
  } else {
    kernel = q == 32 ? generic_kernel<32>(p.o_dtype) : q == 64 ? generic_kernel<64>(p.o_dtype)
             : q == 128 ? generic_kernel<128>(p.o_dtype) : generic_kernel<256>(p.o_dtype);
    grid = dim3((unsigned)((num_chunks + kThreads - 1) / kThreads));
  }
  const cudaError_t err = launch_kernel(kernel, grid, p.pdl == 1, stream, a);
  if (err != cudaSuccess) (void)cudaGetLastError();  // do not leave the error for the next launch check
  if (cuda_error) *cuda_error = (int)err;
  if (err == cudaErrorNotSupported && p.pdl == 1) return kPdlUnsupported;
  return err == cudaSuccess ? kOk : kLaunchFailed;
}

}  // namespace irgq
}  // namespace fusedrope
