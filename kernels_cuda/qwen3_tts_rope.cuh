// qwen3_tts_rope: NeoX (rotate_half) RoPE on standalone Q and K, both in one launch.
//
// Framework-free: raw pointers, element strides (int64), a cudaStream_t. No torch headers, so nvcc compiles
// and checks this alone; the torch binding lives in qwen3_tts_rope_torch.cpp.
//
// Math, per head row x of length D, h = D/2, in fp32 with one round-to-nearest-even to the output dtype:
//   out[i]   = x[i]   * cos[i]   - x[i+h] * sin[i]        (i < h)
//   out[i+h] = x[i+h] * cos[i+h] + x[i]   * sin[i+h]
// Both halves of cos and sin are read (they need not be equal).
//
// Layout: q [B, Hq, S, D], k [B, Hkv, S, D], cos/sin [B or 1, S, D], outputs shaped like q and k. Every
// tensor may have any leading strides; the last dim must be contiguous. Outputs are written through their own
// strides, so out == in (in place) is allowed. cos/sin broadcast over the batch with a batch stride of 0.
//
// Modes (TtsRopeParams' last fields; all off is the plain op above):
//   eager      each product and the sum rounded to the dtype (PyTorch evaluating the formula in bf16/fp16);
//   positions  cos/sin are tables [max_pos, D] (q's dtype, or fp32 with table_fp32), row c_ss / s_ss, read at
//              positions[b, s] (int32 or int64, strides p_sb, p_ss), clamped to [0, max_pos);
//   q_weight   (and k_weight, [D] contiguous) every head row first becomes w * rnd(x * rsqrt(mean(x^2) + eps)),
//              rnd() rounding to the dtype, as Qwen3's RMSNorm computes it (fp32 mean of squares);
//   pdl        (the launcher's argument) a programmatic dependent launch, sm_90+.
// Calls with any of them run kernels of their own (kModes), so the plain kernels are unchanged.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fusedrope {

enum class TtsRopeDtype : int { kBFloat16 = 0, kFloat16 = 1 };

struct TtsRopeParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  void* q_out = nullptr;
  void* k_out = nullptr;
  // Element strides of the leading dims: (batch, head, seq) for q/k and their outputs, (batch, seq) for
  // cos/sin (batch stride 0 broadcasts one cos/sin over the batch).
  int64_t q_sb = 0, q_sh = 0, q_ss = 0;
  int64_t k_sb = 0, k_sh = 0, k_ss = 0;
  int64_t c_sb = 0, c_ss = 0;
  int64_t s_sb = 0, s_ss = 0;
  int64_t qo_sb = 0, qo_sh = 0, qo_ss = 0;
  int64_t ko_sb = 0, ko_sh = 0, ko_ss = 0;
  int64_t B = 0, S = 0, Hq = 0, Hkv = 0, D = 0;
  // Modes (see above); appended so that the plain kernels read the fields above at the same offsets.
  const void* positions = nullptr;
  const void* q_weight = nullptr;
  const void* k_weight = nullptr;
  int64_t p_sb = 0, p_ss = 0, max_pos = 0;
  float eps = 0.f;
  bool positions_int64 = false, table_fp32 = false, eager = false;
};

// Vector width the launcher would pick for these pointers and strides: 8 when all base pointers (q, k, cos,
// sin, the outputs, the norm weights) are 16-byte aligned and every leading stride (of a dim with more than one
// index) is a multiple of 8 elements, 2 when they are 4-byte aligned (8-byte for an fp32 table) with even
// strides, else 1.
int qwen3_tts_rope_pick_vec(const TtsRopeParams& p);

// Enqueue the kernel on `stream`, its launch shape chosen from the problem (vector width from the pointers and
// strides, warps per token from the heads, tokens per block from the tokens); `pdl` makes it a programmatic
// dependent launch. Returns cudaSuccess, the launch error, or cudaErrorInvalidValue for arguments the kernel does
// not serve (D not in {64, 128, 256}, B*S or Hq+Hkv >= 2^31, null pointers, max_pos < 1 with positions, one norm
// weight without the other, eps < 0), or cudaErrorNotSupported for pdl on a kernel image older than sm_90. Empty
// problems (B, S or Hq+Hkv = 0) return cudaSuccess without a launch. Never synchronizes.
cudaError_t qwen3_tts_rope_launch(const TtsRopeParams& p, TtsRopeDtype dtype, cudaStream_t stream, bool pdl = false);

}  // namespace fusedrope
