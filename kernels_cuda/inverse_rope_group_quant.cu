// inverse_rope_group_quant CUDA kernel (contract and math: inverse_rope_group_quant.cuh).
//
// One lane owns 16 consecutive elements: two 16-byte loads of o (LDG.E.128), one 16-byte store of fp8
// (STG.E.128). A quant block of Q elements is Q/16 adjacent lanes, reduced with log2(Q/16) xor shuffles
// (1 for Q=32, 3 for Q=128), after which every lane of the block holds the block amax and computes the same
// scale byte; the block's first lane stores it. So group 32 costs fewer shuffles per byte than group 128, and
// the same instruction count otherwise (one scale store instruction per warp for any Q). Each lane handles one
// chunk (the launcher's choice; Params::chunks_per_thread can force 2), all loads issued before any math: o with
// the positions, then the cos/sin rows they select (read-only path). No shared memory, no local memory.
//
// The common layout (o and x_fp8 16-byte aligned, cos/sin rows 16-byte aligned in fp32 or bf16, e4m3fn output)
// has kernels of its own, in which that layout is a compile-time constant (kFastCache): their per-call branches
// on it fold away. Nsight Compute on the H200 (c5d5262) counted 304 instructions issued per warp of the generic
// kernel, issuing in 62% of cycles at 62% of DRAM peak, so instructions matter here as much as bytes. The fast
// kernel for that case (bf16 o, group 128, fp32 cache) is 264 SASS instructions long on sm_90, against 744 for
// the generic one (which holds every layout's path), and has no loop: a warp issues at most about 250 of them.
// The fast kernels also ask for 6 blocks of 256 threads per SM (__launch_bounds__), which holds them to 39-40
// registers: 48 warps per SM (75% occupancy) against 40 for the generic kernel (42 registers at c5d5262, 44 now).
//
// fp8: sm_89+ converts pairs with cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float2_to_fp8x2, __NV_SATFINITE; the
// saturation is the reference's clamp to +-448); sm_80 and the fnuz format use the exact software RNE of the
// header. The rotation uses __fmul_rn / __fadd_rn / __fsub_rn, so no FMA contraction changes the fp32 values.
#include "inverse_rope_group_quant.cuh"

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

// The hardware packed e4m3 conversion exists from sm_89. tests/cuda_emul defines the switch to run this path on
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

// Programmatic dependent launch (sm_90+): wait for the stream's previous kernel (its writes visible) before the
// first global load, and let the next kernel start launching once this one's loads are issued. Both are no-ops
// in a kernel launched without the attribute (Params::pdl 0), and absent before sm_90.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Tail warps (Params::tail_warps): every head's last kTailSpan chunks (its rope tail, widened to whole quant
// blocks) go to warps of their own, after the warps that take the other kBodySpan chunks of every head, so that
// most warps neither branch into the rotation nor wait for the position -> cos/sin loads. Nsight Compute on
// the H200 (c5d5262) found warps of the plain layout running 17.8 of 32 threads on average: each warp is one
// head, whose 4 rope-tail lanes rotate while the other 28 wait. Opt-in until measured on a GPU.
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

// kU chunks per thread (a block apart): 1 is the launcher's choice (see launch()); 2 (kUnroll) keeps two
// chunks' loads in flight per thread but needed 77 registers against 42 (c5d5262), and so ran slower on the H200.
// kTailWarps (with kU = 1 only): the TailSplit layout above.
// kFastCache: kGenericLayout (the layout is read from KArgs per call), or the cache dtype (kF32 / kBF16) of the
// common layout, which the launcher picks this kernel for: io_vec, cache_vec and e4m3fn.
constexpr int kGenericLayout = -1;
// 6 blocks of 256 threads per SM hold a kernel to 40 registers. The fast-layout kernels fit without spilling
// (sm_80 ... sm_120, tests/test_cuda_quant_kernels.py); the generic ones would spill on some of them (the
// tail-warps one on sm_90, the plain one on sm_100), so they, and the two-chunk one, are left unbounded.
template <int kU, int kFastCache>
constexpr int min_blocks_per_sm() { return kU == 1 && kFastCache != kGenericLayout ? 6 : 1; }

template <int kDtype, int kQ, int kU, bool kTailWarps, int kFastCache>
__global__ void __launch_bounds__(kThreads, (min_blocks_per_sm<kU, kFastCache>())) irgq_kernel(
    const KArgs a) {
  static_assert(kU == 1 || !kTailWarps, "tail warps take one chunk per thread");
  static_assert(kFastCache == kGenericLayout || kFastCache == kF32 || kFastCache == kBF16, "fast layouts");
  constexpr bool kFast = kFastCache != kGenericLayout;
  const int cache_dtype = kFast ? kFastCache : a.cache_dtype;
  const bool cache_vec = kFast || a.cache_vec != 0;
  const bool fnuz = !kFast && a.fp8_fnuz != 0;
  constexpr int kLanes = kQ / kChunk;
  const unsigned first = blockIdx.x * blockDim.x * kU + threadIdx.x;  // blockDim.x: the launcher's block size
  const unsigned char* o = static_cast<const unsigned char*>(a.o);
  unsigned chunks[kU];
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    chunks[j] = kTailWarps ? TailSplit<kQ>::chunk(first, a.num_chunks) : first + j * blockDim.x;
  }

  // Every load of the lane is issued before any math, in two waves: o and the positions of its rope-tail
  // chunks, then (needing the positions) the cos and sin rows of all of them: two waves, not a chain of
  // o -> position -> cos -> sin -> store per chunk.
  uint32_t raw[kU][8];
  ChunkPos cps[kU];
  long long pos[kU];
  wait_for_previous_grid();
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    const unsigned chunk = chunks[j];
    cps[j] = chunk_pos(a, chunk);
    pos[j] = 0;
    if (chunk < a.num_chunks) {
      load_words16(o + 32ull * chunk, kFast || a.io_vec != 0, raw[j]);
      if (cps[j].tail) {
        const unsigned char* pp = static_cast<const unsigned char*>(a.positions) + a.pos_stride_bytes * cps[j].s;
        pos[j] = a.pos_is_int64 ? __ldg(reinterpret_cast<const long long*>(pp))
                                : (long long)__ldg(reinterpret_cast<const int*>(pp));
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) raw[j][i] = 0u;
    }
  }
  uint32_t cw[kU][8], sw[kU][8];  // raw cos / sin words of the rope-tail chunks
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    if (chunks[j] < a.num_chunks && cps[j].tail) {  // 16 rope dims = 8 (e, d) pairs of a head's tail
      const long long p = clamp_position(pos[j], a.max_pos);
      const unsigned j0 = (cps[j].r % kChunksPerHead - kFirstTailChunk) * 8u;
      const unsigned esz = cache_dtype == kF32 ? 4u : 2u;
      load_cache_words(static_cast<const unsigned char*>(a.cos) + p * a.cos_stride_bytes + j0 * esz, cache_dtype,
                       cache_vec, cw[j]);
      load_cache_words(static_cast<const unsigned char*>(a.sin) + p * a.sin_stride_bytes + j0 * esz, cache_dtype,
                       cache_vec, sw[j]);
    }
  }
  allow_next_grid();

#pragma unroll
  for (int j = 0; j < kU; ++j) {
    const unsigned chunk = chunks[j];
    const bool valid = chunk < a.num_chunks;
    const ChunkPos cp = cps[j];
    float v[16];
    unpack16(raw[j], kDtype, v);
    if (valid && cp.tail) {
      float c[8], n[8];
      cache8_from_words(cw[j], cache_dtype, c);
      cache8_from_words(sw[j], cache_dtype, n);
      rotate8(v, c, n);
    }

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
}

// Threads per block when the call does not force it: kThreads, or, for a grid of fewer such blocks than the device
// has SMs (small S: 2 blocks at S = 1, (H, G) = (16, 2)), blocks of fewer whole warps, so that the warps spread
// over up to num_sms SMs instead of queueing 8 to an SM. On the H200 (c5d5262) the fused Triton kernel, one warp
// per program at S <= 8, took 1.51 us of kernel time at S = 1 against 1.66 for this kernel's 2 blocks of 8 warps.
unsigned block_threads_for(unsigned long long threads, int num_sms) {
  const unsigned long long warps = (threads + 31u) / 32u, per_block = kThreads / 32;
  if (num_sms <= 0 || warps >= per_block * (unsigned long long)num_sms) return kThreads;
  return 32u * (unsigned)((warps + num_sms - 1) / num_sms);
}

// The launch's shape: the chunks, the block size asked for (Params::block_threads: 0 = block_threads_for), and
// whether it is a programmatic dependent launch (Params::pdl).
struct Shape {
  unsigned num_chunks;
  int block_threads, num_sms;
  bool pdl;
};

// cudaLaunchKernel rather than <<<>>>: the same launch, and plain C++, so tests/test_emulated_quant_kernels.py
// compiles this file with g++ against tests/cuda_emul and runs the whole kernel on the CPU.
template <int kDtype, int kQ, int kU, bool kTailWarps, int kFastCache>
cudaError_t launch_one(const Shape& sh, cudaStream_t stream, void** args) {
  const unsigned long long threads = kTailWarps ? TailSplit<kQ>::threads(sh.num_chunks)
                                                : ((unsigned long long)sh.num_chunks + kU - 1) / kU;
  const unsigned block = sh.block_threads > 0 ? (unsigned)sh.block_threads : block_threads_for(threads, sh.num_sms);
  const dim3 grid((unsigned)((threads + block - 1) / block));
  if (!sh.pdl) {
    return cudaLaunchKernel(irgq_kernel<kDtype, kQ, kU, kTailWarps, kFastCache>, grid, dim3(block), args, 0, stream);
  }
  // A kernel image without the wait (built for an older arch and JIT-compiled from its PTX for this device) would
  // read before the previous kernel's writes are visible: refuse pdl for it.
  cudaFuncAttributes fa;
  const cudaError_t fe = cudaFuncGetAttributes(&fa, irgq_kernel<kDtype, kQ, kU, kTailWarps, kFastCache>);
  if (fe != cudaSuccess) return fe;
  if (fa.ptxVersion < 90) return cudaErrorNotSupported;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, irgq_kernel<kDtype, kQ, kU, kTailWarps, kFastCache>,
                            *static_cast<const KArgs*>(args[0]));
}

template <int kDtype, int kU, bool kTailWarps, int kFastCache>
cudaError_t launch_qu(int q, const Shape& sh, cudaStream_t stream, void** args) {
  switch (q) {
    case 32: return launch_one<kDtype, 32, kU, kTailWarps, kFastCache>(sh, stream, args);
    case 64: return launch_one<kDtype, 64, kU, kTailWarps, kFastCache>(sh, stream, args);
    case 128: return launch_one<kDtype, 128, kU, kTailWarps, kFastCache>(sh, stream, args);
    default: return launch_one<kDtype, 256, kU, kTailWarps, kFastCache>(sh, stream, args);
  }
}

// One chunk per thread, plain or tail warps, in the kernel for the call's layout.
template <int kDtype, bool kTailWarps>
cudaError_t launch_u1(int q, int fast_cache, const Shape& sh, cudaStream_t stream, void** args) {
  switch (fast_cache) {
    case kF32: return launch_qu<kDtype, 1, kTailWarps, kF32>(q, sh, stream, args);
    case kBF16: return launch_qu<kDtype, 1, kTailWarps, kBF16>(q, sh, stream, args);
    default: return launch_qu<kDtype, 1, kTailWarps, kGenericLayout>(q, sh, stream, args);
  }
}

template <int kDtype>
cudaError_t launch_q(int q, int chunks_per_thread, bool tail_warps, const Shape& sh, cudaStream_t stream,
                     const KArgs& a) {
  KArgs args_copy = a;
  void* args[] = {&args_copy};
  const bool fast = a.io_vec && a.cache_vec && !a.fp8_fnuz && (a.cache_dtype == kF32 || a.cache_dtype == kBF16);
  const int fast_cache = fast ? a.cache_dtype : kGenericLayout;
  if (tail_warps) return launch_u1<kDtype, true>(q, fast_cache, sh, stream, args);
  return chunks_per_thread == 1 ? launch_u1<kDtype, false>(q, fast_cache, sh, stream, args)
                                : launch_qu<kDtype, kUnroll, false, kGenericLayout>(q, sh, stream, args);
}

// The launcher gives each thread one chunk: on the H200 (the op-2 GPU script's sweep, commits 9147894 and
// c5d5262) one chunk per thread was as fast as two or faster at every point measured, S = 1 ... 16384 for
// (H, G) = (16, 2) and (8, 1), group 128, and group 32 at S = 8192: 1.90 against 2.49 us at S = 1, 67.5 against
// 72.1 us at S = 8192 (16, 2), 66.7 against 76.4 us at S = 16384 (8, 1). Nsight Compute at S = 8192 (16, 2):
// 42 registers (62.5% theoretical occupancy) against 77 (37.5%), 3.00 against 2.70 TB/s of DRAM traffic.
// Two per thread stays reachable through Params::chunks_per_thread, for such measurements.

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
      return "chunks_per_thread must be 0 (automatic), 1 or 2, and 0 or 1 with tail_warps; block_threads 0 "
             "(automatic) or a multiple of 32 from 32 to 256; pdl 0 or 1";
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
  int u = p.chunks_per_thread;
  if (u == 0) u = 1;
  if ((u != 1 && u != kUnroll) || (p.tail_warps != 0 && (p.tail_warps != 1 || u != 1))) return kBadConfig;
  const int bt = p.block_threads;
  if ((bt != 0 && (bt < 32 || bt > kThreads || bt % 32 != 0)) || (p.pdl != 0 && p.pdl != 1)) return kBadConfig;
  Shape sh{(unsigned)num_chunks, bt, p.num_sms, p.pdl == 1};
  if (bt == 0 && sh.num_sms <= 0) {  // ask the runtime; on failure keep kThreads (num_sms 0)
    int dev = 0;
    const bool none_pending = cudaPeekAtLastError() == cudaSuccess;  // else an error stays pending for the caller
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sh.num_sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      if (none_pending) (void)cudaGetLastError();
      sh.num_sms = 0;
    }
  }
  const bool tw = p.tail_warps == 1;
  const cudaError_t err = p.o_dtype == kBF16 ? launch_q<kBF16>(p.quant_group_size, u, tw, sh, stream, a)
                                             : launch_q<kF16>(p.quant_group_size, u, tw, sh, stream, a);
  if (err != cudaSuccess) (void)cudaGetLastError();  // do not leave the error for the next launch check
  if (cuda_error) *cuda_error = (int)err;
  if (err == cudaErrorNotSupported && sh.pdl) return kPdlUnsupported;
  return err == cudaSuccess ? kOk : kLaunchFailed;
}

}  // namespace irgq
}  // namespace fusedrope
