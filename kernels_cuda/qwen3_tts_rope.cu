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
// the products are exact. An fp32 table's products are not: that path rounds each one (__fmul_rn), as PyTorch
// evaluates the formula in fp32.
//
// In-place (outputs aliasing inputs) is safe: each element is read and written by the same lane, reads first.
// No __restrict__ on q/k/outputs for that reason; cos/sin go through the read-only path.
//
// Modes (eager, positions, the q/k norm, pdl; see the header) run the kModes kernels, in which the head loop is
// warp-uniform (the norm's sum of squares is a butterfly of __shfl_xor_sync over the LPR lanes of a row, which
// every lane of the warp must reach). With an fp32 table, CosT is float. Eager rounds each product to the dtype
// before the sum: the conversion between them keeps nvcc from contracting the two into an FMA.

#include "qwen3_tts_rope.cuh"
#include "pdl.cuh"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace fusedrope {
namespace {

constexpr int kUnroll = 4;       // passes whose loads are issued together
constexpr int kMaxThreads = 256;  // a bound on the launcher's blocks (32 x warps per token x tokens per block <= 128)
constexpr unsigned kFullWarp = 0xffffffffu;

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
  static __device__ __forceinline__ float rnd(float a) { return one(pack1(a)); }  // rounded to bf16 (RNE)
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
  static __device__ __forceinline__ float rnd(float a) { return one(pack1(a)); }  // rounded to fp16 (RNE)
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

// VEC consecutive fp32 elements of a cos/sin table, read-only: 2 x 16 bytes, 8 bytes or 4 bytes.
template <int VEC>
struct F32Chunk {
  float v[VEC];
  __device__ __forceinline__ void load_ro(const float* p) {
    if constexpr (VEC == 8) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = __uint_as_float(w[e]);
    } else if constexpr (VEC == 2) {
      const float2 a = __ldg(reinterpret_cast<const float2*>(p));
      v[0] = a.x;
      v[1] = a.y;
    } else {
      v[0] = __ldg(p);
    }
  }
  __device__ __forceinline__ void unpack(float (&f)[VEC]) const {
#pragma unroll
    for (int e = 0; e < VEC; ++e) f[e] = v[e];
  }
};

template <typename T, typename CosT, int VEC>
using CosChunk = std::conditional_t<std::is_same_v<CosT, float>, F32Chunk<VEC>, Chunk<T, VEC>>;

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

// ---- the q/k norm (kModes) --------------------------------------------------------------------------------
// Qwen3's RMSNorm of one head row, in place in the lane's chunks x1/x2: x -> rnd(w * rnd(x * rsqrt(mean(x^2) +
// eps))), the mean of squares in fp32, summed over the row's LPR lanes by a butterfly. Every lane of the warp
// calls it (rows past the last head are zeros, and not stored). `w` is the row's weight at the lane's column,
// read from global memory (L1-resident, 2*D bytes for q and k) rather than kept in registers.
template <typename T, int D, int VEC, int CPL = Geometry<D, VEC>::kChunksPerLane>
__device__ __forceinline__ void normalize(Chunk<T, VEC> (&x1)[CPL], Chunk<T, VEC> (&x2)[CPL], const T* w, float eps) {
  constexpr int LPR = Geometry<D, VEC>::kLanesPerRow, HALF = Geometry<D, VEC>::kHalf;
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < CPL; ++j) {
    float a[VEC], z[VEC];
    x1[j].unpack(a);
    x2[j].unpack(z);
#pragma unroll
    for (int e = 0; e < VEC; ++e) ss += a[e] * a[e] + z[e] * z[e];
  }
#pragma unroll
  for (int m = LPR / 2; m > 0; m /= 2) ss += __uint_as_float(__shfl_xor_sync(kFullWarp, __float_as_uint(ss), m));
  const float r = rsqrtf(ss * (1.f / D) + eps);
#pragma unroll
  for (int j = 0; j < CPL; ++j) {
    float a[VEC], z[VEC], w1[VEC], w2[VEC];
    Chunk<T, VEC> wc;
    wc.load_ro(w + j * LPR * VEC);        wc.unpack(w1);
    wc.load_ro(w + j * LPR * VEC + HALF); wc.unpack(w2);
    x1[j].unpack(a);
    x2[j].unpack(z);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      a[e] = w1[e] * Elem<T>::rnd(a[e] * r);  // exact in fp32: rounded once, by pack
      z[e] = w2[e] * Elem<T>::rnd(z[e] * r);
    }
    x1[j].pack(a);
    x2[j].pack(z);
  }
}

// ---- the kernel ----------------------------------------------------------------------------------------------
// blockDim = (32 * warps_per_token, tokens_per_cta). Token-strided loop over B*S tokens.
// The modes' kernels say "at least one block per SM" (.minnctapersm 1): without it ptxas spilled one of them
// (sm_80, fp32 table) at 80 registers. 0 emits no directive, so the plain kernels compile as before.
template <typename T, int D, int VEC, bool kModes = false, typename CosT = T>
__global__ void __launch_bounds__(kMaxThreads, kModes ? 1 : 0)
qwen3_tts_rope_kernel(const TtsRopeParams p, uint32_t tokens, uint32_t seq, int heads_q, int heads) {
  using G = Geometry<D, VEC>;
  constexpr int HALF = G::kHalf, LPR = G::kLanesPerRow, CPL = G::kChunksPerLane, RPW = G::kRowsPerPass;

  const CosT* __restrict__ cos_p = static_cast<const CosT*>(p.cos);
  const CosT* __restrict__ sin_p = static_cast<const CosT*>(p.sin);
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  T* qo = static_cast<T*>(p.q_out);
  T* ko = static_cast<T*>(p.k_out);

  const int lane = threadIdx.x & 31;
  const int row = (threadIdx.x >> 5) * RPW + lane / LPR;  // this lane's first head row of the token
  const int col = (lane % LPR) * VEC;                     // element offset of its first chunk in a half row
  const int hstep = (blockDim.x >> 5) * RPW;              // rows rotated per pass by all warps of the token
  // kModes: the head loop runs over the warp's rows, each lane adding its own (warp-uniform, for the shuffles);
  // two passes per round, not four, keep the norm's extra registers within 128 (occupancy).
  const int sub = kModes ? lane / LPR : 0;
  constexpr int UNROLL = kModes ? 2 : kUnroll;

  if constexpr (kModes) {  // pdl.cuh: the previous grid's writes before any load; the next grid may launch
    wait_for_previous_grid();
    allow_next_grid();
  }
  const T* qw = kModes ? static_cast<const T*>(p.q_weight) + col : nullptr;  // the norm's weights, or null
  const T* kw = kModes ? static_cast<const T*>(p.k_weight) + col : nullptr;

  for (uint32_t tok = blockIdx.x * blockDim.y + threadIdx.y; tok < tokens; tok += gridDim.x * blockDim.y) {
    const int64_t b = tok / seq;
    const int64_t s = tok - uint32_t(b) * seq;

    // cos/sin of this token, both halves, this lane's chunks only: read once, kept in fp32 registers.
    float c1[CPL][VEC], c2[CPL][VEC], s1[CPL][VEC], s2[CPL][VEC];
    {
      int64_t c_off = b * p.c_sb + s * p.c_ss, s_off = b * p.s_sb + s * p.s_ss;
      if (kModes && p.positions != nullptr) {  // a table row, at the token's position clamped to [0, max_pos)
        const int64_t i = b * p.p_sb + s * p.p_ss;
        int64_t pos = p.positions_int64 ? __ldg(static_cast<const long long*>(p.positions) + i)
                                        : __ldg(static_cast<const int*>(p.positions) + i);
        pos = pos < 0 ? 0 : pos >= p.max_pos ? p.max_pos - 1 : pos;
        c_off = pos * p.c_ss;
        s_off = pos * p.s_ss;
      }
      const CosT* cr = cos_p + c_off + col;
      const CosT* sr = sin_p + s_off + col;
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        CosChunk<T, CosT, VEC> t;
        t.load_ro(cr + j * LPR * VEC);        t.unpack(c1[j]);
        t.load_ro(cr + j * LPR * VEC + HALF); t.unpack(c2[j]);
        t.load_ro(sr + j * LPR * VEC);        t.unpack(s1[j]);
        t.load_ro(sr + j * LPR * VEC + HALF); t.unpack(s2[j]);
        if (std::is_same_v<CosT, float> && p.eager) {  // an fp32 table is rounded to the dtype first, as the model's
#pragma unroll                                         // rotary module returns it
          for (int e = 0; e < VEC; ++e) {
            c1[j][e] = Elem<T>::rnd(c1[j][e]), c2[j][e] = Elem<T>::rnd(c2[j][e]);
            s1[j][e] = Elem<T>::rnd(s1[j][e]), s2[j][e] = Elem<T>::rnd(s2[j][e]);
          }
        }
      }
    }
    // This token's rows of head 0, at this lane's column.
    const T* q_row = q + (b * p.q_sb + s * p.q_ss + col);
    const T* k_row = k + (b * p.k_sb + s * p.k_ss + col);
    T* qo_row = qo + (b * p.qo_sb + s * p.qo_ss + col);
    T* ko_row = ko + (b * p.ko_sb + s * p.ko_ss + col);

    for (int h0 = row - sub; h0 < heads; h0 += UNROLL * hstep) {
      Chunk<T, VEC> x1[UNROLL][CPL], x2[UNROLL][CPL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {  // all loads of UNROLL passes first
        const int h = h0 + sub + u * hstep;
        if (h < heads) {
          const bool is_q = h < heads_q;
          const T* src = (is_q ? q_row : k_row) + (is_q ? h : h - heads_q) * (is_q ? p.q_sh : p.k_sh);
#pragma unroll
          for (int j = 0; j < CPL; ++j) {
            x1[u][j].load(src + j * LPR * VEC);
            x2[u][j].load(src + j * LPR * VEC + HALF);
          }
        } else if (kModes) {  // rows past the last head: zeros into the norm's sum, never stored
#pragma unroll
          for (int j = 0; j < CPL; ++j) x1[u][j] = x2[u][j] = Chunk<T, VEC>{};
        }
      }
      if (kModes && p.q_weight != nullptr) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          normalize<T, D, VEC>(x1[u], x2[u], h0 + sub + u * hstep < heads_q ? qw : kw, p.eps);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int h = h0 + sub + u * hstep;
        if (h < heads) {
          const bool is_q = h < heads_q;
          T* dst = (is_q ? qo_row : ko_row) + (is_q ? h : h - heads_q) * (is_q ? p.qo_sh : p.ko_sh);
#pragma unroll
          for (int j = 0; j < CPL; ++j) {
            float a[VEC], z[VEC], o1[VEC], o2[VEC];
            x1[u][j].unpack(a);
            x2[u][j].unpack(z);
            if (kModes && p.eager) {  // PyTorch in the dtype: each product rounded, then the sum (rounded by pack)
#pragma unroll
              for (int e = 0; e < VEC; ++e) {
                o1[e] = Elem<T>::rnd(a[e] * c1[j][e]) - Elem<T>::rnd(z[e] * s1[j][e]);
                o2[e] = Elem<T>::rnd(z[e] * c2[j][e]) + Elem<T>::rnd(a[e] * s2[j][e]);
              }
            } else if constexpr (std::is_same_v<CosT, float>) {  // inexact products: no FMA contraction
#pragma unroll
              for (int e = 0; e < VEC; ++e) {
                o1[e] = __fmul_rn(a[e], c1[j][e]) - __fmul_rn(z[e], s1[j][e]);
                o2[e] = __fmul_rn(z[e], c2[j][e]) + __fmul_rn(a[e], s2[j][e]);
              }
            } else {
#pragma unroll
              for (int e = 0; e < VEC; ++e) {
                o1[e] = a[e] * c1[j][e] - z[e] * s1[j][e];
                o2[e] = z[e] * c2[j][e] + a[e] * s2[j][e];
              }
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

bool aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0; }

bool fits(const TtsRopeParams& p, int64_t bytes) {
  const void* ptrs[6] = {p.q, p.k, p.cos, p.sin, p.q_out, p.k_out};
  for (int i = 0; i < 6; ++i)  // an fp32 table's chunks are twice as wide (two 16-byte loads at most)
    if (!aligned(ptrs[i], (i == 2 || i == 3) && p.table_fp32 ? std::min<int64_t>(16, 2 * bytes) : bytes)) return false;
  if (p.q_weight && !(aligned(p.q_weight, bytes) && aligned(p.k_weight, bytes))) return false;
  const int64_t elems = bytes / 2;  // both dtypes are 2-byte
  const int64_t rows = p.positions ? p.max_pos : p.S;  // cos/sin rows: a table's, or the tokens'
  const int64_t strides[16] = {
      eff(p.q_sb, p.B),    eff(p.q_sh, p.Hq),   eff(p.q_ss, p.S),  eff(p.k_sb, p.B),   eff(p.k_sh, p.Hkv),
      eff(p.k_ss, p.S),    eff(p.c_sb, p.B),    eff(p.c_ss, rows), eff(p.s_sb, p.B),   eff(p.s_ss, rows),
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

bool has_modes(const TtsRopeParams& p, bool pdl) { return p.eager || p.positions || p.q_weight || pdl; }

template <typename K>
cudaError_t launch_kernel(K kernel, dim3 grid, dim3 block, bool pdl, cudaStream_t stream, void** args) {
  // cudaLaunchKernel rather than <<<>>>: the same launch, and plain C++, so the host-emulation test
  // (tests/support/cuda_emul) can compile this file with a C++ compiler and run the kernel on the CPU.
  if (!pdl) return cudaLaunchKernel(kernel, grid, block, args, 0, stream);
  return launch_pdl(kernel, grid, block, stream, *static_cast<const TtsRopeParams*>(args[0]),
                    *static_cast<uint32_t*>(args[1]), *static_cast<uint32_t*>(args[2]), *static_cast<int*>(args[3]),
                    *static_cast<int*>(args[4]));
}

template <typename T, int D, int VEC>
cudaError_t launch_vec(const TtsRopeParams& p, dim3 grid, dim3 block, bool pdl, cudaStream_t stream, void** args) {
  if (!has_modes(p, pdl)) return launch_kernel(qwen3_tts_rope_kernel<T, D, VEC>, grid, block, false, stream, args);
  if (p.table_fp32) return launch_kernel(qwen3_tts_rope_kernel<T, D, VEC, true, float>, grid, block, pdl, stream, args);
  return launch_kernel(qwen3_tts_rope_kernel<T, D, VEC, true>, grid, block, pdl, stream, args);
}

template <typename T, int D>
cudaError_t launch_d(int vec, const TtsRopeParams& p, dim3 grid, dim3 block, bool pdl, cudaStream_t stream) {
  TtsRopeParams params = p;
  uint32_t tokens = uint32_t(p.B * p.S), seq = uint32_t(p.S);
  int hq = int(p.Hq), heads = int(p.Hq + p.Hkv);
  void* args[] = {&params, &tokens, &seq, &hq, &heads};
  switch (vec) {
    case 8: return launch_vec<T, D, 8>(p, grid, block, pdl, stream, args);
    case 2: return launch_vec<T, D, 2>(p, grid, block, pdl, stream, args);
    case 1: return launch_vec<T, D, 1>(p, grid, block, pdl, stream, args);
    default: return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t launch_t(int vec, const TtsRopeParams& p, dim3 grid, dim3 block, bool pdl, cudaStream_t stream) {
  switch (p.D) {
    case 64: return launch_d<T, 64>(vec, p, grid, block, pdl, stream);
    case 128: return launch_d<T, 128>(vec, p, grid, block, pdl, stream);
    case 256: return launch_d<T, 256>(vec, p, grid, block, pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int qwen3_tts_rope_pick_vec(const TtsRopeParams& p) {
  if (fits(p, 16)) return 8;
  if (fits(p, 4)) return 2;
  return 1;
}

cudaError_t qwen3_tts_rope_launch(const TtsRopeParams& p, TtsRopeDtype dtype, cudaStream_t stream, bool pdl) {
  if (p.D != 64 && p.D != 128 && p.D != 256) return cudaErrorInvalidValue;
  if (p.B < 0 || p.S < 0 || p.Hq < 0 || p.Hkv < 0) return cudaErrorInvalidValue;
  const int64_t tokens = p.B * p.S, heads = p.Hq + p.Hkv;
  if (tokens == 0 || heads == 0) return cudaSuccess;
  if (tokens > INT32_MAX || heads > (int64_t(1) << 30)) return cudaErrorInvalidValue;
  if (!p.cos || !p.sin || (p.Hq && (!p.q || !p.q_out)) || (p.Hkv && (!p.k || !p.k_out)))
    return cudaErrorInvalidValue;
  if ((p.positions && p.max_pos < 1) || (p.table_fp32 && !p.positions) || !(p.eps >= 0.f) ||
      (p.q_weight == nullptr) != (p.k_weight == nullptr))
    return cudaErrorInvalidValue;

  const int vec = qwen3_tts_rope_pick_vec(p);

  // Warps per token: enough that each warp's rows fit in one round of kUnroll passes (all its loads in
  // flight at once), at most 4. Tokens per block: 1 while the grid is small (spread over SMs: the tiny TTS
  // shapes are latency-bound), else about 4 warps per block.
  const int64_t passes = (heads + rows_per_pass(p.D, vec) - 1) / rows_per_pass(p.D, vec);
  const int wpt = int(std::min<int64_t>(4, std::max<int64_t>(1, (passes + kUnroll - 1) / kUnroll)));
  const int tpc = tokens * wpt <= 2048 ? 1 : std::max(1, 4 / wpt);
  const dim3 grid{unsigned((tokens + tpc - 1) / tpc)}, block{unsigned(32 * wpt), unsigned(tpc)};
  cudaError_t err = cudaErrorInvalidValue;
  switch (dtype) {
    case TtsRopeDtype::kBFloat16: err = launch_t<__nv_bfloat16>(vec, p, grid, block, pdl, stream); break;
    case TtsRopeDtype::kFloat16: err = launch_t<__half>(vec, p, grid, block, pdl, stream); break;
  }
  if (err != cudaSuccess) (void)cudaGetLastError();  // do not leave the error for the next launch check
  return err;
}

}  // namespace fusedrope
