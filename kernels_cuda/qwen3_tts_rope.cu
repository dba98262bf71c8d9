// qwen3_tts_rope CUDA kernel: see qwen3_tts_rope.cuh for the contract.
//
// Work split. One (b, s) token is served by `warps_per_token` warps of one thread block. Each lane owns
// CPL chunks of VEC consecutive elements of the first half of a head row and the matching chunks of the second
// half, so the rotation partner of every element it reads is in its own registers. The token's cos and sin
// rows (both halves) are read once per warp into fp32 registers and reused for every one of the Hq + Hkv head
// rows the warp rotates: Q rows and K rows are one list of heads, so Q and K take one launch. Within a
// warp, 32 / LPR rows are rotated per pass; UNROLL passes issue all their loads before the first store, so
// several independent 16-byte loads per lane are in flight.
//
// Vector width (chosen per call by the launcher, from the actual pointers and strides):
//   VEC = 8: 16-byte uint4 loads/stores (all base pointers 16-byte aligned, leading strides % 8 == 0);
//   VEC = 2: 4-byte bf16x2 / half2 accesses (4-byte aligned, even strides);
//   VEC = 1: 2-byte scalar accesses (anything else, e.g. a view starting at an odd element).
//
// Numerics: bf16/fp16 -> fp32 is exact, every product of two such values is exact in fp32, the sum is rounded
// once in fp32 and once (RNE) to the output type, so the result is within 1 ulp of the exact value (equal to
// it except at double-rounding ties). Contracting a product into an FMA does not change the value, because
// the products are exact.
//
// In-place (outputs aliasing inputs) is safe: each element is read and written by the same lane, reads first.
// No __restrict__ on q/k/outputs for that reason; cos/sin go through the read-only path.

#include "qwen3_tts_rope.cuh"

#include <algorithm>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace fusedrope {
namespace {

constexpr int kUnroll = 4;       // passes whose loads are issued together
constexpr int kMaxThreads = 256;  // warps_per_token * tokens_per_cta <= 8

// ---- element types: bits <-> fp32 ------------------------------------------------------------------------
template <typename T>
struct Elem;

template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
  static __device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
  static __device__ __forceinline__ float one(uint16_t u) { return __uint_as_float(uint32_t(u) << 16); }
  static __device__ __forceinline__ uint32_t pack2(float a, float b) {  // a -> low half, b -> high half
    const __nv_bfloat162 r = __float22bfloat162_rn(make_float2(a, b));
    uint32_t bits;
    memcpy(&bits, &r, sizeof(bits));
    return bits;
  }
  static __device__ __forceinline__ uint16_t pack1(float a) { return __bfloat16_as_ushort(__float2bfloat16_rn(a)); }
};

template <>
struct Elem<__half> {
  static __device__ __forceinline__ float lo(uint32_t w) { return __half2float(__ushort_as_half(uint16_t(w))); }
  static __device__ __forceinline__ float hi(uint32_t w) { return __half2float(__ushort_as_half(uint16_t(w >> 16))); }
  static __device__ __forceinline__ float one(uint16_t u) { return __half2float(__ushort_as_half(u)); }
  static __device__ __forceinline__ uint32_t pack2(float a, float b) {
    const __half2 r = __float22half2_rn(make_float2(a, b));
    uint32_t bits;
    memcpy(&bits, &r, sizeof(bits));
    return bits;
  }
  static __device__ __forceinline__ uint16_t pack1(float a) { return __half_as_ushort(__float2half_rn(a)); }
};

// ---- VEC consecutive elements as one memory access ---------------------------------------------------------
template <typename T, int VEC>
struct Chunk;

template <typename T>
struct Chunk<T, 8> {
  uint4 v;
  __device__ __forceinline__ void load(const T* p) { v = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void load_ro(const T* p) { v = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<uint4*>(p) = v; }
  __device__ __forceinline__ void unpack(float (&f)[8]) const {
    f[0] = Elem<T>::lo(v.x); f[1] = Elem<T>::hi(v.x);
    f[2] = Elem<T>::lo(v.y); f[3] = Elem<T>::hi(v.y);
    f[4] = Elem<T>::lo(v.z); f[5] = Elem<T>::hi(v.z);
    f[6] = Elem<T>::lo(v.w); f[7] = Elem<T>::hi(v.w);
  }
  __device__ __forceinline__ void pack(const float (&f)[8]) {
    v.x = Elem<T>::pack2(f[0], f[1]);
    v.y = Elem<T>::pack2(f[2], f[3]);
    v.z = Elem<T>::pack2(f[4], f[5]);
    v.w = Elem<T>::pack2(f[6], f[7]);
  }
};

template <typename T>
struct Chunk<T, 2> {
  uint32_t v;
  __device__ __forceinline__ void load(const T* p) { v = *reinterpret_cast<const uint32_t*>(p); }
  __device__ __forceinline__ void load_ro(const T* p) { v = __ldg(reinterpret_cast<const unsigned int*>(p)); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<uint32_t*>(p) = v; }
  __device__ __forceinline__ void unpack(float (&f)[2]) const { f[0] = Elem<T>::lo(v); f[1] = Elem<T>::hi(v); }
  __device__ __forceinline__ void pack(const float (&f)[2]) { v = Elem<T>::pack2(f[0], f[1]); }
};

template <typename T>
struct Chunk<T, 1> {
  uint16_t v;
  __device__ __forceinline__ void load(const T* p) { v = *reinterpret_cast<const uint16_t*>(p); }
  __device__ __forceinline__ void load_ro(const T* p) { v = __ldg(reinterpret_cast<const unsigned short*>(p)); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<uint16_t*>(p) = v; }
  __device__ __forceinline__ void unpack(float (&f)[1]) const { f[0] = Elem<T>::one(v); }
  __device__ __forceinline__ void pack(const float (&f)[1]) { v = Elem<T>::pack1(f[0]); }
};

// ---- lane geometry -----------------------------------------------------------------------------------------
template <int D, int VEC>
struct Geometry {
  static constexpr int kHalf = D / 2;
  static constexpr int kChunks = kHalf / VEC;                     // accesses per half row
  static constexpr int kLanesPerRow = kChunks < 32 ? kChunks : 32;  // LPR
  static constexpr int kChunksPerLane = kChunks / kLanesPerRow;     // CPL
  static constexpr int kRowsPerPass = 32 / kLanesPerRow;            // rows a warp rotates per pass
  static_assert(D % (2 * VEC) == 0, "D must be a multiple of 2*VEC");
  static_assert(kChunks % kLanesPerRow == 0 && 32 % kLanesPerRow == 0, "lane geometry");
};

// ---- the kernel ----------------------------------------------------------------------------------------------
// blockDim = (32 * warps_per_token, tokens_per_cta). Token-strided loop over B*S tokens (grid may be capped).
template <typename T, int D, int VEC>
__global__ void __launch_bounds__(kMaxThreads)
qwen3_tts_rope_kernel(const TtsRopeParams p, uint32_t tokens, uint32_t seq, int heads_q, int heads) {
  using G = Geometry<D, VEC>;
  constexpr int HALF = G::kHalf, LPR = G::kLanesPerRow, CPL = G::kChunksPerLane, RPW = G::kRowsPerPass;

  const T* __restrict__ cos_p = static_cast<const T*>(p.cos);
  const T* __restrict__ sin_p = static_cast<const T*>(p.sin);
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  T* qo = static_cast<T*>(p.q_out);
  T* ko = static_cast<T*>(p.k_out);

  const int lane = threadIdx.x & 31;
  const int row = (threadIdx.x >> 5) * RPW + lane / LPR;  // this lane's first head row of the token
  const int col = (lane % LPR) * VEC;                     // element offset of its first chunk in a half row
  const int hstep = (blockDim.x >> 5) * RPW;              // rows rotated per pass by all warps of the token

  for (uint32_t tok = blockIdx.x * blockDim.y + threadIdx.y; tok < tokens; tok += gridDim.x * blockDim.y) {
    const int64_t b = tok / seq;
    const int64_t s = tok - uint32_t(b) * seq;

    // cos/sin of this token, both halves, this lane's chunks only: read once, kept in fp32 registers.
    float c1[CPL][VEC], c2[CPL][VEC], s1[CPL][VEC], s2[CPL][VEC];
    {
      const T* cr = cos_p + (b * p.c_sb + s * p.c_ss) + col;
      const T* sr = sin_p + (b * p.s_sb + s * p.s_ss) + col;
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        Chunk<T, VEC> t;
        t.load_ro(cr + j * LPR * VEC);        t.unpack(c1[j]);
        t.load_ro(cr + j * LPR * VEC + HALF); t.unpack(c2[j]);
        t.load_ro(sr + j * LPR * VEC);        t.unpack(s1[j]);
        t.load_ro(sr + j * LPR * VEC + HALF); t.unpack(s2[j]);
      }
    }
    // This token's rows of head 0, at this lane's column.
    const T* q_row = q + (b * p.q_sb + s * p.q_ss + col);
    const T* k_row = k + (b * p.k_sb + s * p.k_ss + col);
    T* qo_row = qo + (b * p.qo_sb + s * p.qo_ss + col);
    T* ko_row = ko + (b * p.ko_sb + s * p.ko_ss + col);

    for (int h0 = row; h0 < heads; h0 += kUnroll * hstep) {
      Chunk<T, VEC> x1[kUnroll][CPL], x2[kUnroll][CPL];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // all loads of kUnroll passes first
        const int h = h0 + u * hstep;
        if (h < heads) {
          const bool is_q = h < heads_q;
          const T* src = (is_q ? q_row : k_row) + (is_q ? h : h - heads_q) * (is_q ? p.q_sh : p.k_sh);
#pragma unroll
          for (int j = 0; j < CPL; ++j) {
            x1[u][j].load(src + j * LPR * VEC);
            x2[u][j].load(src + j * LPR * VEC + HALF);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int h = h0 + u * hstep;
        if (h < heads) {
          const bool is_q = h < heads_q;
          T* dst = (is_q ? qo_row : ko_row) + (is_q ? h : h - heads_q) * (is_q ? p.qo_sh : p.ko_sh);
#pragma unroll
          for (int j = 0; j < CPL; ++j) {
            float a[VEC], z[VEC], o1[VEC], o2[VEC];
            x1[u][j].unpack(a);
            x2[u][j].unpack(z);
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              o1[e] = a[e] * c1[j][e] - z[e] * s1[j][e];
              o2[e] = z[e] * c2[j][e] + a[e] * s2[j][e];
            }
            Chunk<T, VEC> y;
            y.pack(o1);
            y.store(dst + j * LPR * VEC);
            y.pack(o2);
            y.store(dst + j * LPR * VEC + HALF);
          }
        }
      }
    }
  }
}

// ---- launcher ------------------------------------------------------------------------------------------------
inline int64_t eff(int64_t stride, int64_t size) { return size > 1 ? stride : 0; }  // strides of size-1 dims are unused

bool fits(const TtsRopeParams& p, int64_t bytes) {
  const uintptr_t ptrs[6] = {reinterpret_cast<uintptr_t>(p.q), reinterpret_cast<uintptr_t>(p.k),
                             reinterpret_cast<uintptr_t>(p.cos), reinterpret_cast<uintptr_t>(p.sin),
                             reinterpret_cast<uintptr_t>(p.q_out), reinterpret_cast<uintptr_t>(p.k_out)};
  for (uintptr_t a : ptrs)
    if (a % uintptr_t(bytes)) return false;
  const int64_t elems = bytes / 2;  // both dtypes are 2-byte
  const int64_t strides[16] = {
      eff(p.q_sb, p.B),    eff(p.q_sh, p.Hq),   eff(p.q_ss, p.S),  eff(p.k_sb, p.B),   eff(p.k_sh, p.Hkv),
      eff(p.k_ss, p.S),    eff(p.c_sb, p.B),    eff(p.c_ss, p.S),  eff(p.s_sb, p.B),   eff(p.s_ss, p.S),
      eff(p.qo_sb, p.B),   eff(p.qo_sh, p.Hq),  eff(p.qo_ss, p.S), eff(p.ko_sb, p.B),  eff(p.ko_sh, p.Hkv),
      eff(p.ko_ss, p.S)};
  for (int64_t s : strides)
    if (s % elems) return false;
  return true;
}

int rows_per_pass(int64_t D, int vec) {
  const int64_t chunks = D / 2 / vec;
  return chunks >= 32 ? 1 : int(32 / chunks);
}

template <typename T, int D>
cudaError_t launch_d(int vec, const TtsRopeParams& p, dim3 grid, dim3 block, cudaStream_t stream) {
  // cudaLaunchKernel rather than <<<>>>: the same launch, and plain C++, so the host-emulation test
  // (tests/support/cuda_emul) can compile this file with a C++ compiler and run the kernel on the CPU.
  TtsRopeParams params = p;
  uint32_t tokens = uint32_t(p.B * p.S), seq = uint32_t(p.S);
  int hq = int(p.Hq), heads = int(p.Hq + p.Hkv);
  void* args[] = {&params, &tokens, &seq, &hq, &heads};
  switch (vec) {
    case 8: return cudaLaunchKernel(qwen3_tts_rope_kernel<T, D, 8>, grid, block, args, 0, stream);
    case 2: return cudaLaunchKernel(qwen3_tts_rope_kernel<T, D, 2>, grid, block, args, 0, stream);
    case 1: return cudaLaunchKernel(qwen3_tts_rope_kernel<T, D, 1>, grid, block, args, 0, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t launch_t(int vec, const TtsRopeParams& p, dim3 grid, dim3 block, cudaStream_t stream) {
  switch (p.D) {
    case 64: return launch_d<T, 64>(vec, p, grid, block, stream);
    case 128: return launch_d<T, 128>(vec, p, grid, block, stream);
    case 256: return launch_d<T, 256>(vec, p, grid, block, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int qwen3_tts_rope_pick_vec(const TtsRopeParams& p) {
  if (fits(p, 16)) return 8;
  if (fits(p, 4)) return 2;
  return 1;
}

cudaError_t qwen3_tts_rope_launch(const TtsRopeParams& p, TtsRopeDtype dtype, cudaStream_t stream,
                                  const TtsRopeLaunchConfig* config) {
  if (p.D != 64 && p.D != 128 && p.D != 256) return cudaErrorInvalidValue;
  if (p.B < 0 || p.S < 0 || p.Hq < 0 || p.Hkv < 0) return cudaErrorInvalidValue;
  const int64_t tokens = p.B * p.S, heads = p.Hq + p.Hkv;
  if (tokens == 0 || heads == 0) return cudaSuccess;
  if (tokens > INT32_MAX || heads > (int64_t(1) << 30)) return cudaErrorInvalidValue;
  if (!p.cos || !p.sin || (p.Hq && (!p.q || !p.q_out)) || (p.Hkv && (!p.k || !p.k_out)))
    return cudaErrorInvalidValue;

  const TtsRopeLaunchConfig none{};
  const TtsRopeLaunchConfig& cfg = config ? *config : none;
  const int natural = qwen3_tts_rope_pick_vec(p);
  int vec = natural;
  if (cfg.vec) {  // a forced width may only be narrower than what the layout allows
    if (cfg.vec != 8 && cfg.vec != 2 && cfg.vec != 1) return cudaErrorInvalidValue;
    if (cfg.vec > natural) return cudaErrorInvalidValue;
    vec = cfg.vec;
  }

  // Warps per token: enough that each warp's rows fit in one round of kUnroll passes (all its loads in
  // flight at once), at most 4. Tokens per block: 1 while the grid is small (spread over SMs: the tiny TTS
  // shapes are latency-bound), else about 4 warps per block.
  const int64_t passes = (heads + rows_per_pass(p.D, vec) - 1) / rows_per_pass(p.D, vec);
  int wpt = int(std::min<int64_t>(4, std::max<int64_t>(1, (passes + kUnroll - 1) / kUnroll)));
  int tpc = tokens * wpt <= 2048 ? 1 : std::max(1, 4 / wpt);
  if (cfg.warps_per_token) wpt = cfg.warps_per_token;
  if (cfg.tokens_per_cta) tpc = cfg.tokens_per_cta;
  if (wpt < 1 || tpc < 1 || wpt > 8 || tpc > 8 || wpt * tpc * 32 > kMaxThreads) return cudaErrorInvalidValue;

  int64_t blocks = std::min<int64_t>((tokens + tpc - 1) / tpc, INT32_MAX);
  if (cfg.max_blocks > 0) blocks = std::min<int64_t>(blocks, cfg.max_blocks);  // the kernel loops over tokens
  const dim3 grid{unsigned(blocks)}, block{unsigned(32 * wpt), unsigned(tpc)};
  cudaError_t err = cudaErrorInvalidValue;
  switch (dtype) {
    case TtsRopeDtype::kBFloat16: err = launch_t<__nv_bfloat16>(vec, p, grid, block, stream); break;
    case TtsRopeDtype::kFloat16: err = launch_t<__half>(vec, p, grid, block, stream); break;
  }
  if (err != cudaSuccess) (void)cudaGetLastError();  // do not leave the error for the next launch check
  return err;
}

}  // namespace fusedrope
