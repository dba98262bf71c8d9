// inverse_rope_group_quant CUDA kernel and launcher (contract and math: inverse_rope_group_quant.cuh).
//
// One thread owns one chunk of 16 consecutive elements: two 16-byte loads of o (LDG.E.128), one 16-byte store of
// fp8 (STG.E.128). A quant block of Q elements is Q/16 adjacent lanes, reduced with log2(Q/16) xor shuffles (1
// for Q=32, 3 for Q=128), after which every lane of the block holds the block amax and computes the same scale
// byte; the block's first lane stores it. So group 32 costs fewer shuffles per byte than group 128. Every load
// is issued before any math: o with the position, then the cos/sin rows it selects (read-only path). No local
// memory, and no shared memory but the tiled kernel's scale tile.
//
// The public op runs the generic kernel (the layout read per call) in 256-thread blocks, and the tiled kernel
// below for the layouts the generic one does not write. The launch experiments of kernels_cuda/README.md (tail
// warps, fast-layout kernels, block size, PDL, the tiled kernel for any layout) are taken only when Params asks.
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
    store_fp8(a.x_fp8, 16ull * chunk, kFast || a.io_vec, fnuz, v, byte);
    if (cp.r % kLanes == 0) {
      store_scale(static_cast<unsigned char*>(a.x_scale) + scale_offset_bytes(a, cp.s, cp.r, kLanes),
                  a.scale_is_f32, byte);
    }
  }
}

// The tiled kernel: a block of 8 warps takes one head of 32 consecutive tokens, a warp 4 of them in 2 rounds of 2,
// a lane one 16-element chunk of the head. Each round issues its loads before any math, as the generic kernel
// does (o with the positions, then cos / sin); 2 tokens per round, not 4, keeps it under 128 registers without a
// spill. The scale bytes meet in shared memory and leave after one barrier in token order: a warp's 32
// consecutive threads write one block's scales of the 32 tokens, one 32-byte run (e8m0, column-major; 128 bytes
// for fp32) or one half-filled 64-byte run (mfma_tile) where the generic kernel writes 32 scattered bytes.
// x_fp8 rows are addressed through their token and group strides (group-major, padded rows, contiguous). It
// writes what the generic kernel cannot (x_fp8 not contiguous, mfma_tile scales, zeroed padding rows of
// column-major scales), and any call with Params::tiled (an experiment).
constexpr unsigned kTileTokens = 32, kTileWarps = kThreads / 32, kRounds = 2;
constexpr unsigned kTokensPerRound = kTileTokens / kTileWarps / kRounds;
static_assert(kTileTokens == 32, "tile_slot and mfma_tile's 32-token tiles");

template <int kDtype, int kQ>
__global__ void __launch_bounds__(kThreads) irgq_tiled_kernel(const KArgs a) {
  constexpr int kLanes = kQ / kChunk;
  constexpr unsigned kBlocksPerHead = kHeadDim / kQ;
  __shared__ unsigned char scales[kTileTokens][kBlocksPerHead];
  const unsigned head = blockIdx.x % a.num_heads, s0 = blockIdx.x / a.num_heads * kTileTokens;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned col = head * kHeadDim + lane * kChunk;  // the chunk's first element in the token row
  const unsigned g = col / a.dg;
  const unsigned long long x_col = (unsigned long long)a.x_stride_g_bytes * g + (col - g * a.dg);
  const bool tail = lane >= (unsigned)kFirstTailChunk;
  const bool vec = a.io_vec != 0, fnuz = a.fp8_fnuz != 0;

  wait_for_previous_grid();
#pragma unroll
  for (unsigned round = 0; round < kRounds; ++round) {
    uint32_t raw[kTokensPerRound][8], cw[kTokensPerRound][8], sw[kTokensPerRound][8];
    long long pos[kTokensPerRound];
#pragma unroll
    for (unsigned i = 0; i < kTokensPerRound; ++i) {  // o and the positions, then the cos / sin rows
      const unsigned s = s0 + warp + kTileWarps * (round * kTokensPerRound + i);
      pos[i] = 0;
      if (s < a.num_tokens) {
        const unsigned long long e = (unsigned long long)s * a.num_heads * kHeadDim + col;  // element of o
        load_words16(static_cast<const unsigned char*>(a.o) + 2ull * e, vec, raw[i]);
        if (tail) pos[i] = load_position(a, s);
      } else {
#pragma unroll
        for (int w = 0; w < 8; ++w) raw[i][w] = 0u;
      }
    }
#pragma unroll
    for (unsigned i = 0; i < kTokensPerRound; ++i) {
      if (tail && s0 + warp + kTileWarps * (round * kTokensPerRound + i) < a.num_tokens) {
        load_cos_sin(a, pos[i], lane, a.cache_dtype, a.cache_vec != 0, cw[i], sw[i]);
      }
    }
    if (round == kRounds - 1) allow_next_grid();

#pragma unroll
    for (unsigned i = 0; i < kTokensPerRound; ++i) {
      const unsigned t = warp + kTileWarps * (round * kTokensPerRound + i), s = s0 + t;
      float v[16];
      const uint32_t byte = rotate_and_scale<kDtype, kLanes>(raw[i], tail && s < a.num_tokens, cw[i], sw[i],
                                                             a.cache_dtype, fnuz, v);
      if (s < a.num_tokens) {
        store_fp8(a.x_fp8, (unsigned long long)a.x_stride_s_bytes * s + x_col, vec, fnuz, v, byte);
      }
      if (lane % kLanes == 0) scales[t][lane / kLanes] = s < a.num_tokens ? (unsigned char)byte : 0;  // padding: 0
    }
  }
  __syncthreads();
  for (unsigned i = threadIdx.x; i < kTileTokens * kBlocksPerHead; i += kThreads) {
    const TileSlot slot = tile_slot(i);
    const unsigned s = s0 + slot.t;
    if (s < (a.mfma_k ? a.num_tokens : a.scale_rows)) {
      store_scale(static_cast<unsigned char*>(a.x_scale) +
                      tile_scale_offset_bytes(a, s, head * kBlocksPerHead + slot.kb),
                  a.scale_is_f32, scales[slot.t][slot.kb]);
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

// One head of 32 tokens per block, over o's tokens and x_scale's padding rows.
template <int kDtype>
cudaError_t launch_tiled(int q, bool pdl, cudaStream_t stream, const KArgs& a) {
  const dim3 grid((a.scale_rows + kTileTokens - 1) / kTileTokens * a.num_heads), block(kThreads);
  void (*kernel)(KArgs) = q == 32    ? irgq_tiled_kernel<kDtype, 32>
                          : q == 64  ? irgq_tiled_kernel<kDtype, 64>
                          : q == 128 ? irgq_tiled_kernel<kDtype, 128>
                                     : irgq_tiled_kernel<kDtype, 256>;
  if (pdl) return launch_pdl(kernel, grid, block, stream, a);
  KArgs args_copy = a;
  void* args[] = {&args_copy};
  return cudaLaunchKernel(kernel, grid, block, args, 0, stream);
}

// The tiled kernel where the layout or the call asks for it; else the generic kernel, unless the call asks for tail
// warps, or for the fast-layout kernels and has their layout.
template <int kDtype>
cudaError_t launch_dtype(int q, bool tail_warps, bool fast_layout, bool tiled, const Shape& sh, cudaStream_t stream,
                         const KArgs& a) {
  if (tiled) return launch_tiled<kDtype>(q, sh.pdl, stream, a);
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
    case kTooLarge:
      return "too large to index: S*H*head_dim/16 >= 2^31 for the generic kernel; H*head_dim, the token rows or "
             "the blocks (rows / 32 * H) >= 2^31 for the tiled kernel";
    case kLaunchFailed: return "kernel launch failed";
    case kBadConfig:
      return "tail_warps, fast_layout, pdl and tiled must be 0 or 1, tail_warps and fast_layout not both 1, "
             "block_threads 0 (256) or a multiple of 32 from 32 to 256, and the tiled kernel (tiled 1, or a layout "
             "only it writes) without tail_warps, fast_layout or block_threads";
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
  const bool tiled = p.tiled == 1 || a.needs_tiled;
  if (!flag(p.tail_warps) || !flag(p.fast_layout) || !flag(p.pdl) || !flag(p.tiled) ||
      (p.tail_warps == 1 && p.fast_layout == 1) || (bt != 0 && (bt < 32 || bt > kThreads || bt % 32 != 0)) ||
      (tiled && (p.tail_warps || p.fast_layout || bt))) {
    return kBadConfig;
  }
  const Shape sh{(unsigned)num_chunks, bt == 0 ? (unsigned)kThreads : (unsigned)bt, p.pdl == 1};
  const bool tw = p.tail_warps == 1, fl = p.fast_layout == 1;
  const int q = p.quant_group_size;
  const cudaError_t err = p.o_dtype == kBF16 ? launch_dtype<kBF16>(q, tw, fl, tiled, sh, stream, a)
                                             : launch_dtype<kF16>(q, tw, fl, tiled, sh, stream, a);
  if (err != cudaSuccess) (void)cudaGetLastError();  // do not leave the error for the next launch check
  if (cuda_error) *cuda_error = (int)err;
  if (err == cudaErrorNotSupported && sh.pdl) return kPdlUnsupported;
  return err == cudaSuccess ? kOk : kLaunchFailed;
}

}  // namespace irgq
}  // namespace fusedrope
