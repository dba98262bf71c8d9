// inverse_rope_group_quant CUDA kernel and launcher (contract and math: inverse_rope_group_quant.cuh).
//
// One thread owns one chunk of 16 consecutive elements: two 16-byte loads of o (LDG.E.128), one 16-byte store of
// fp8 (STG.E.128). A quant block of Q elements is Q/16 adjacent lanes, reduced with log2(Q/16) xor shuffles (1
// for Q=32, 3 for Q=128), after which every lane of the block holds the block amax and computes the same scale
// byte; the block's first lane stores it. So group 32 costs fewer shuffles per byte than group 128. Every load
// is issued before any math: o with the position, then the cos/sin rows it selects (read-only path). No shared
// memory, no local memory.
//
// The public op runs the generic kernel (the layout read per call) in 256-thread blocks. The launch experiments
// of kernels_cuda/README.md (tail warps, fast-layout kernels, block size, PDL) are taken only when Params asks.
//
// fp8: sm_89+ converts pairs with cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float2_to_fp8x2, __NV_SATFINITE; the
// saturation is the reference's clamp to +-448); sm_80 and the fnuz format use the exact software RNE of the
// header. The rotation uses __fmul_rn / __fadd_rn / __fsub_rn, so no FMA contraction changes the fp32 values.
#include "inverse_rope_group_quant.cuh"
#include "pdl.cuh"

#include <cuda_runtime.h>
#include <cuda_fp8.h>

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

// Programmatic dependent launch (pdl.cuh): the kernel waits for the previous grid before its first global load
// and lets the next one start launching once its loads are issued (Params::pdl 1 launches it so).

// Tail warps (Params::tail_warps, an experiment): every head's last kTailSpan chunks (its rope tail, widened to
// whole quant blocks) go to warps of their own, after the warps that take the other kBodySpan chunks of every
// head, so that the body warps neither branch into the rotation nor wait for the position -> cos/sin loads.
template <int kQ>
struct TailSplit {
  static constexpr unsigned kTailSpan = kQ / kChunk > 4 ? kQ / kChunk : 4;     // 4, 4, 8, 16 chunks per head
  static constexpr unsigned kBodySpan = kChunksPerHead - kTailSpan;           // 28, 28, 24, 16
  // threads of the body warps (whole warps): thread indices below this take body chunks
  static IRGQ_HD unsigned body_threads(unsigned num_chunks) {
    return (num_chunks / kChunksPerHead * kBodySpan + 31u) / 32u * 32u;
  }
  static IRGQ_HD unsigned long long threads(unsigned num_chunks) {
    return body_threads(num_chunks) + (num_chunks / kChunksPerHead * kTailSpan + 31u) / 32u * 32u;
  }
  // the chunk thread `idx` takes, or num_chunks (no chunk) past the end of its part
  static IRGQ_HD unsigned chunk(unsigned idx, unsigned num_chunks) {
    const unsigned heads = num_chunks / kChunksPerHead, body = body_threads(num_chunks);
    if (idx < body) {
      return idx < heads * kBodySpan ? idx / kBodySpan * kChunksPerHead + idx % kBodySpan : num_chunks;
    }
    const unsigned t = idx - body;
    return t < heads * kTailSpan ? t / kTailSpan * kChunksPerHead + kBodySpan + t % kTailSpan : num_chunks;
  }
};

// kFastCache: kGenericLayout (the layout is read from KArgs per call), or the cache dtype (kF32 / kBF16) of the
// common layout (io_vec, cache_vec, e4m3fn) as a compile-time constant, so that its per-call branches fold away
// (Params::fast_layout, an experiment).
constexpr int kGenericLayout = -1;
// 6 blocks of 256 threads per SM hold a kernel to 40 registers. The fast-layout kernels fit without spilling
// (sm_80 ... sm_120, tests/inverse_rope_group_quant/test_inverse_rope_group_quant_cuda.py); the generic ones would
// spill on some archs, so they are left unbounded.
template <int kFastCache>
constexpr int min_blocks_per_sm() { return kFastCache != kGenericLayout ? 6 : 1; }

template <int kDtype, int kQ, bool kTailWarps, int kFastCache>
__global__ void __launch_bounds__(kThreads, (min_blocks_per_sm<kFastCache>())) irgq_kernel(const KArgs a) {
  static_assert(kFastCache == kGenericLayout || kFastCache == kF32 || kFastCache == kBF16, "fast layouts");
  static_assert(kFastCache == kGenericLayout || !kTailWarps, "tail warps use the generic layout");
  constexpr bool kFast = kFastCache != kGenericLayout;
  const int cache_dtype = kFast ? kFastCache : a.cache_dtype;
  const bool cache_vec = kFast || a.cache_vec != 0;
  const bool fnuz = !kFast && a.fp8_fnuz != 0;
  constexpr int kLanes = kQ / kChunk;
  const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;  // blockDim.x: the launcher's block size
  const unsigned chunk = kTailWarps ? TailSplit<kQ>::chunk(idx, a.num_chunks) : idx;
  const bool valid = chunk < a.num_chunks;
  const ChunkPos cp = chunk_pos(a, chunk);

  // Every load is issued before any math, in two waves: o and (rope-tail chunks) the position, then the cos and
  // sin rows the position selects.
  uint32_t raw[8];
  long long pos = 0;
  wait_for_previous_grid();
  if (valid) {
    load_words16(static_cast<const unsigned char*>(a.o) + 32ull * chunk, kFast || a.io_vec != 0, raw);
    if (cp.tail) {
      const unsigned char* pp = static_cast<const unsigned char*>(a.positions) + a.pos_stride_bytes * cp.s;
      pos = a.pos_is_int64 ? __ldg(reinterpret_cast<const long long*>(pp))
                           : (long long)__ldg(reinterpret_cast<const int*>(pp));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) raw[i] = 0u;
  }
  uint32_t cw[8], sw[8];  // raw cos / sin words of a rope-tail chunk
  if (valid && cp.tail) {  // 16 rope dims = 8 (e, d) pairs of a head's tail
    const long long p = clamp_position(pos, a.max_pos);
    const unsigned j0 = (cp.r % kChunksPerHead - kFirstTailChunk) * 8u;
    const unsigned esz = cache_dtype == kF32 ? 4u : 2u;
    load_cache_words(static_cast<const unsigned char*>(a.cos) + p * a.cos_stride_bytes + j0 * esz, cache_dtype,
                     cache_vec, cw);
    load_cache_words(static_cast<const unsigned char*>(a.sin) + p * a.sin_stride_bytes + j0 * esz, cache_dtype,
                     cache_vec, sw);
  }
  allow_next_grid();

  float v[16];
  unpack16(raw, kDtype, v);
  if (valid && cp.tail) {
    float c[8], n[8];
    cache8_from_words(cw, cache_dtype, c);
    cache8_from_words(sw, cache_dtype, n);
    rotate8(v, c, n);
  }

  // Every lane shuffles, valid or not: the block's lanes are adjacent and the warp's mask is full.
  uint32_t m = amax_bits16(v);
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  const uint32_t byte = e8m0_byte(m, fnuz);

  if (valid) {
    uint32_t q[4];
    if (fnuz) quant16<true>(v, byte, q);
    else quant16<false>(v, byte, q);
    unsigned char* dst = static_cast<unsigned char*>(a.x_fp8) + 16ull * chunk;
    if (kFast || a.io_vec) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(q[0], q[1], q[2], q[3]);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) dst[i] = (unsigned char)(q[i >> 2] >> (8 * (i & 3)));
    }
    if (cp.r % kLanes == 0) {
      unsigned char* sd = static_cast<unsigned char*>(a.x_scale) + scale_offset_bytes(a, cp.s, cp.r, kLanes);
      if (a.scale_is_f32) *reinterpret_cast<uint32_t*>(sd) = scale_f32_bits(byte);
      else *sd = (unsigned char)byte;
    }
  }
}

// The launch: the chunks, threads per block, and whether it is a programmatic dependent launch.
struct Shape {
  unsigned num_chunks, block;
  bool pdl;
};

// cudaLaunchKernel rather than <<<>>>: the same launch, and plain C++, so that
// tests/inverse_rope_group_quant/test_inverse_rope_group_quant_emulated.py compiles this file with g++ against
// tests/support/cuda_emul and runs the whole kernel on the CPU.
template <int kDtype, int kQ, bool kTailWarps, int kFastCache>
cudaError_t launch_one(const Shape& sh, cudaStream_t stream, void** args) {
  const unsigned long long threads = kTailWarps ? TailSplit<kQ>::threads(sh.num_chunks) : sh.num_chunks;
  const dim3 grid((unsigned)((threads + sh.block - 1) / sh.block));
  if (!sh.pdl) {
    return cudaLaunchKernel(irgq_kernel<kDtype, kQ, kTailWarps, kFastCache>, grid, dim3(sh.block), args, 0, stream);
  }
  return launch_pdl(irgq_kernel<kDtype, kQ, kTailWarps, kFastCache>, grid, dim3(sh.block), stream,
                    *static_cast<const KArgs*>(args[0]));
}

template <int kDtype, bool kTailWarps, int kFastCache>
cudaError_t launch_q(int q, const Shape& sh, cudaStream_t stream, void** args) {
  switch (q) {
    case 32: return launch_one<kDtype, 32, kTailWarps, kFastCache>(sh, stream, args);
    case 64: return launch_one<kDtype, 64, kTailWarps, kFastCache>(sh, stream, args);
    case 128: return launch_one<kDtype, 128, kTailWarps, kFastCache>(sh, stream, args);
    default: return launch_one<kDtype, 256, kTailWarps, kFastCache>(sh, stream, args);
  }
}

// The generic kernel, unless the call asks for tail warps, or for the fast-layout kernels and has their layout.
template <int kDtype>
cudaError_t launch_dtype(int q, bool tail_warps, bool fast_layout, const Shape& sh, cudaStream_t stream,
                         const KArgs& a) {
  KArgs args_copy = a;
  void* args[] = {&args_copy};
  if (tail_warps) return launch_q<kDtype, true, kGenericLayout>(q, sh, stream, args);
  if (fast_layout && a.io_vec && a.cache_vec && !a.fp8_fnuz) {
    if (a.cache_dtype == kF32) return launch_q<kDtype, false, kF32>(q, sh, stream, args);
    if (a.cache_dtype == kBF16) return launch_q<kDtype, false, kBF16>(q, sh, stream, args);
  }
  return launch_q<kDtype, false, kGenericLayout>(q, sh, stream, args);
}

}  // namespace

const char* status_string(int status) {
  switch (status) {
    case kOk: return "ok";
    case kUnsupportedShape:
      return "the CUDA kernel is compiled for head_dim 512 and rope_dim 64 only, and needs num_heads, "
             "num_groups and max_pos >= 1";
    case kBadGroup:
      return "num_groups must divide H*head_dim, and quant_group_size be 32, 64, 128 or 256 and divide "
             "Dg = H*head_dim/num_groups";
    case kBadDtype: return "unsupported dtype code";
    case kTooLarge: return "S*H*head_dim/16 exceeds 2^31 - 1";
    case kLaunchFailed: return "kernel launch failed";
    case kBadConfig:
      return "tail_warps, fast_layout and pdl must be 0 or 1, tail_warps and fast_layout not both 1, and "
             "block_threads 0 (256) or a multiple of 32 from 32 to 256";
    case kPdlUnsupported:
      return "pdl=1 unsupported here: it needs the kernel compiled for sm_90 or newer (its wait for the previous "
             "kernel), and this device runs one compiled for an older arch, or the runtime refused the programmatic "
             "dependent launch";
    default: return "unknown status";
  }
}

int launch(const Params& p, cudaStream_t stream, int* cuda_error) {
  KArgs a;
  long long num_chunks = 0;
  const int st = make_kargs(p, &a, &num_chunks);
  if (st != kOk || num_chunks == 0) return st;
  const auto flag = [](int32_t v) { return v == 0 || v == 1; };
  const int bt = p.block_threads;
  if (!flag(p.tail_warps) || !flag(p.fast_layout) || !flag(p.pdl) || (p.tail_warps == 1 && p.fast_layout == 1) ||
      (bt != 0 && (bt < 32 || bt > kThreads || bt % 32 != 0))) {
    return kBadConfig;
  }
  const Shape sh{(unsigned)num_chunks, bt == 0 ? (unsigned)kThreads : (unsigned)bt, p.pdl == 1};
  const bool tw = p.tail_warps == 1, fl = p.fast_layout == 1;
  const int q = p.quant_group_size;
  const cudaError_t err = p.o_dtype == kBF16 ? launch_dtype<kBF16>(q, tw, fl, sh, stream, a)
                                             : launch_dtype<kF16>(q, tw, fl, sh, stream, a);
  if (err != cudaSuccess) (void)cudaGetLastError();  // do not leave the error for the next launch check
  if (cuda_error) *cuda_error = (int)err;
  if (err == cudaErrorNotSupported && sh.pdl) return kPdlUnsupported;
  return err == cudaSuccess ? kOk : kLaunchFailed;
}

}  // namespace irgq
}  // namespace fusedrope
