// Host emulation of the small part of the CUDA runtime and device API that fusedrope's framework-free kernels
// use, so a kernel source compiles with a plain C++ compiler (g++ -x c++) and runs on the CPU. Two modes:
//
//   * default: one thread after another. Valid only for kernels whose threads do not communicate (no
//     __syncthreads, shared memory, warp shuffles or atomics): such a kernel computes the same result in any
//     thread order. tests/qwen3_tts_rope/test_qwen3_tts_rope_cuda.py runs qwen3_tts_rope this way.
//   * CUDA_EMUL_LOCKSTEP defined before the include: 1-D or 2-D blocks; each thread of a block runs on
//     its own std::thread (../lockstep.h) and __shfl_xor_sync exchanges values in lockstep inside its warp of 32
//     (consecutive linear thread ids, as on the GPU), a divergent shuffle being reported; __syncthreads is a
//     barrier of the block and __shared__ variables are shared by its threads.
//     tests/inverse_rope_group_quant/test_inverse_rope_group_quant_emulated.py runs inverse_rope_group_quant so, and
//     tests/qwen3_tts_rope/test_qwen3_tts_rope_cuda.py the kernels of qwen3_tts_rope's modes (the q/k norm shuffles).
//
// The conversions are bit-exact models of the CUDA intrinsics: round-to-nearest-even, NaN kept quiet.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#ifdef CUDA_EMUL_LOCKSTEP
#include "lockstep.h"
#endif

// ---- qualifiers ---------------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict

// ---- vector types and launch geometry ----------------------------------------------------------------------
// With CUDA's alignments, so that a misaligned vector access (a fault on the GPU) is one for the alignment
// sanitizer of the ASan builds too.
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct uint3 { unsigned int x, y, z; };
struct alignas(8) float2 { float x, y; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};
inline thread_local uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// ---- runtime ------------------------------------------------------------------------------------------------
enum cudaError_t : int {
  cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9, cudaErrorNotSupported = 801,
};
typedef struct CUstream_st* cudaStream_t;
// The runtime's last error: a failing call records it, cudaGetLastError returns and clears it, cudaPeekAtLastError
// returns it.
inline cudaError_t emu_last_error = cudaSuccess;
inline cudaError_t emu_fail(cudaError_t e) { return emu_last_error = e; }
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu_last_error;
  emu_last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return emu_last_error; }
// The device runs kernels compiled for PTX version emu_ptx_version (90: sm_90).
inline int emu_ptx_version = 90;
struct cudaFuncAttributes { int ptxVersion, binaryVersion; };
template <class... A>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, void (*)(A...)) {
  attr->ptxVersion = attr->binaryVersion = emu_ptx_version;
  return cudaSuccess;
}
inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }

// Launch statistics, read by the tests.
inline long long emu_launches = 0;
inline dim3 emu_last_grid, emu_last_block;
inline int emu_last_pdl = 0;  // whether the last launch asked for programmatic stream serialization
inline int emu_max_threads_per_block = 1024;

#ifdef CUDA_EMUL_RECORD
// Record mode (bench/static): a launch is not run but recorded: the kernel's host address, and its arguments laid
// out as the CUDA ABI lays out a kernel's parameters (each at its alignment, in order).
inline struct {
  const void* kernel;
  unsigned char params[4096];
  unsigned size;
} emu_record;
extern "C" [[gnu::used]] inline const void* emul_record_anchor() { return reinterpret_cast<const void*>(&emul_record_anchor); }
extern "C" [[gnu::used]] inline long long emul_record_kernel() {
  return reinterpret_cast<const char*>(emu_record.kernel) - reinterpret_cast<const char*>(&emul_record_anchor);
}
extern "C" [[gnu::used]] inline void emul_record_launch(unsigned* geometry, unsigned char* params, unsigned* size) {
  const unsigned g[6] = {emu_last_grid.x, emu_last_grid.y, emu_last_grid.z, emu_last_block.x, emu_last_block.y,
                         emu_last_block.z};
  std::memcpy(geometry, g, sizeof g);
  std::memcpy(params, emu_record.params, emu_record.size);
  *size = emu_record.size;
}
#endif

namespace cuda_emul_detail {
#ifdef CUDA_EMUL_RECORD
template <class... A, std::size_t... I>
void pack(void** args, std::index_sequence<I...>) {
  ((emu_record.size = (emu_record.size + alignof(A) - 1) / alignof(A) * alignof(A),
    std::memcpy(emu_record.params + emu_record.size, args[I], sizeof(A)), emu_record.size += sizeof(A)), ...);
}
#endif
template <class... A, std::size_t... I>
void call(void (*f)(A...), void** args, std::index_sequence<I...>) {
  f(*static_cast<A*>(args[I])...);
}

template <class... A, std::size_t... I>
void run(void (*f)(A...), dim3 g, dim3 b, void** args, std::index_sequence<I...>) {
  gridDim = g;
  blockDim = b;
  for (unsigned bz = 0; bz < g.z; ++bz)
    for (unsigned by = 0; by < g.y; ++by)
      for (unsigned bx = 0; bx < g.x; ++bx) {
        blockIdx = uint3{bx, by, bz};
        for (unsigned tz = 0; tz < b.z; ++tz)
          for (unsigned ty = 0; ty < b.y; ++ty)
            for (unsigned tx = 0; tx < b.x; ++tx) {
              threadIdx = uint3{tx, ty, tz};
              f(*static_cast<A*>(args[I])...);
            }
      }
}
}  // namespace cuda_emul_detail

template <class... A>
cudaError_t cudaLaunchKernel(void (*f)(A...), dim3 g, dim3 b, void** args, std::size_t shared = 0,
                             cudaStream_t stream = nullptr) {
  (void)shared;
  (void)stream;
  const unsigned long long threads = 1ull * b.x * b.y * b.z;
  if (!g.x || !g.y || !g.z || !threads || threads > unsigned(emu_max_threads_per_block) || g.x > 0x7fffffffu ||
      g.y > 65535u || g.z > 65535u || b.z > 64u)
    return emu_fail(cudaErrorInvalidConfiguration);
  ++emu_launches;
  emu_last_pdl = 0;
  emu_last_grid = g;
  emu_last_block = b;
#ifdef CUDA_EMUL_RECORD
  emu_record.kernel = reinterpret_cast<const void*>(f);
  emu_record.size = 0;
  cuda_emul_detail::pack<A...>(args, std::index_sequence_for<A...>{});
  return cudaSuccess;
#endif
#ifdef CUDA_EMUL_LOCKSTEP
  if (b.z != 1) return emu_fail(cudaErrorInvalidConfiguration);
  gridDim = g;
  blockDim = b;
  lockstep::run(g.x * g.y * g.z, b.x * b.y, [&] {
    threadIdx = uint3{lockstep::tid % b.x, lockstep::tid / b.x, 0};
    blockIdx = uint3{lockstep::bid % g.x, lockstep::bid / g.x % g.y, lockstep::bid / (g.x * g.y)};
    cuda_emul_detail::call(f, args, std::index_sequence_for<A...>{});
  });
#else
  cuda_emul_detail::run(f, g, b, args, std::index_sequence_for<A...>{});
#endif
  return cudaSuccess;
}

// cudaLaunchKernelEx with the one launch attribute the kernels use: emu_last_pdl says whether the last launch
// asked for programmatic stream serialization (a programmatic dependent launch).
enum cudaLaunchAttributeID : int { cudaLaunchAttributeProgrammaticStreamSerialization = 3 };
union cudaLaunchAttributeValue { int programmaticStreamSerializationAllowed; char pad[64]; };
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  char pad[8 - sizeof(cudaLaunchAttributeID)];
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  std::size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned int numAttrs;
};
template <class... E, class... A>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*f)(E...), A&&... args) {
  int pdl = 0;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (config->attrs[i].id != cudaLaunchAttributeProgrammaticStreamSerialization)
      return emu_fail(cudaErrorInvalidValue);
    pdl = config->attrs[i].val.programmaticStreamSerializationAllowed != 0;
  }
  return [&](E... coerced) {
    void* p[] = {&coerced...};
    const cudaError_t err = cudaLaunchKernel(f, config->gridDim, config->blockDim, p, config->dynamicSmemBytes,
                                             config->stream);
    emu_last_pdl = pdl;
    return err;
  }(std::forward<A>(args)...);
}

#ifdef CUDA_EMUL_LOCKSTEP
// Shared memory: one variable for the whole launch, since blocks run one after another. A barrier of the block's
// threads (those that returned no longer count).
#define __shared__ static
inline void __syncthreads() { lockstep::block->bar.arrive_and_wait(); }
#endif

// ---- device intrinsics --------------------------------------------------------------------------------------
template <class T>
inline T __ldg(const T* p) { return *p; }
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
// The GPU's rsqrtf is within 2 ulp; this model is 1/sqrt correctly rounded, as torch computes rsqrt on the CPU.
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
// An fp32 product rounded to nearest, never contracted into an FMA (the host build contracts nothing either).
inline float __fmul_rn(float a, float b) { return a * b; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }

// bfloat16
struct __nv_bfloat16 { unsigned short bits; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float(unsigned(h.bits) << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{static_cast<unsigned short>((u >> 16) | 0x40u)};
  return __nv_bfloat16{static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) {
  return __nv_bfloat162{__float2bfloat16_rn(f.x), __float2bfloat16_rn(f.y)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{__bfloat162float(h.x), __bfloat162float(h.y)}; }

// float16 (through the compiler's _Float16: IEEE binary16, conversions round to nearest even)
struct __half { unsigned short bits; };
struct alignas(4) __half2 { __half x, y; };
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __half2float(__half h) { _Float16 v; std::memcpy(&v, &h.bits, 2); return static_cast<float>(v); }
inline __half __float2half_rn(float f) {
  const _Float16 v = static_cast<_Float16>(f);
  __half h;
  std::memcpy(&h.bits, &v, 2);
  return h;
}
inline __half2 __float22half2_rn(float2 f) { return __half2{__float2half_rn(f.x), __float2half_rn(f.y)}; }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }

// ---- lockstep-only device functions ------------------------------------------------------------------------
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
// Byte i of the result is byte (s >> 4i) & 7 of {b, a} (a the low word); the sign-replicating mode is not modelled.
inline unsigned int __byte_perm(unsigned int a, unsigned int b, unsigned int s) {
  const unsigned long long v = a | ((unsigned long long)b << 32);
  unsigned int r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned int)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
// Per 16-bit half, the unsigned maximum.
inline unsigned int __vmaxu2(unsigned int a, unsigned int b) {
  return max(a & 0xFFFFu, b & 0xFFFFu) | (max(a >> 16, b >> 16) << 16);
}

#ifndef CUDA_EMUL_LOCKSTEP
// Threads run one after another here: a kernel that shuffles gets its own value back, and the count says so.
inline long long emu_shuffles_out_of_lockstep = 0;
inline unsigned int __shfl_xor_sync(unsigned int, unsigned int var, int, int = 32) {
  ++emu_shuffles_out_of_lockstep;
  return var;
}
inline unsigned int __shfl_sync(unsigned int, unsigned int var, int, int = 32) {
  ++emu_shuffles_out_of_lockstep;
  return var;
}
inline int __all_sync(unsigned int, int pred) {
  ++emu_shuffles_out_of_lockstep;
  return pred;
}
#else
// Full-warp xor shuffle (width 32); a partial mask or width is reported, as is a lane whose partner did not
// shuffle with it.
inline unsigned int __shfl_xor_sync(unsigned int mask, unsigned int var, int lane_mask, int width = 32,
                                    const std::source_location loc = std::source_location::current()) {
  if (mask != 0xFFFFFFFFu || width != 32) lockstep::report("__shfl_xor_sync with a partial mask or width", lane_mask);
  return (unsigned int)lockstep::exchange(var, lane_mask, 32, [&](int l) { return l ^ lane_mask; }, var, loc);
}
// Full-warp indexed shuffle: each lane reads lane src_lane's value (its own choice of lane).
inline unsigned int __shfl_sync(unsigned int mask, unsigned int var, int src_lane, int width = 32,
                                const std::source_location loc = std::source_location::current()) {
  if (mask != 0xFFFFFFFFu || width != 32) lockstep::report("__shfl_sync with a partial mask or width", src_lane);
  return (unsigned int)lockstep::exchange(var, -1, 32, [&](int) { return src_lane & 31; }, var, loc);
}
// Full-warp vote: whether `pred` holds in every lane (a butterfly of exchanges).
inline int __all_sync(unsigned int mask, int pred, const std::source_location loc = std::source_location::current()) {
  if (mask != 0xFFFFFFFFu) lockstep::report("__all_sync with a partial mask", 0);
  unsigned long long all = pred != 0;
  for (int off = 1; off < 32; off <<= 1)
    all &= lockstep::exchange(all, 0x100 | off, 32, [&](int l) { return l ^ off; }, all, loc);
  return (int)all;
}
#endif
