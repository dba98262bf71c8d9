// Fused inverse RoPE + FP8 per-group quant with e8m0 (power-of-two) scales, HIP (gfx942 / gfx950).
//
// Framework-free: raw pointers, element strides and a hipStream_t. The torch binding lives in
// inverse_rope_group_quant_torch.cpp; fusedrope/hip_ext.py builds both with torch.utils.cpp_extension.
//
// Contract (identical to fusedrope.reference.inverse_rope_group_quant, see SPEC.md "Op 2"):
//   o          [S, H, 512] bf16 or fp16, contiguous
//   positions  [>= S] int64 or int32, element stride pos_stride; clamped to [0, max_pos) on the device
//   cos, sin   [max_pos, 32] bf16 / fp16 / fp32, row strides cos_stride / sin_stride (elements), last dim
//              contiguous; the rope tail is the last 64 dims of every head (GPT-J pairs, inverse rotation)
//   x_fp8      [S, G, Dg] contiguous, OCP e4m3fn (FP8_MAX 448) or e4m3fnuz (240)
//   x_scale    [S, G, Ks], Ks = Dg / quant_group_size; element (s, g, k) lives at
//              s * scale_stride_s + (g * Ks + k) * scale_stride_b (elements of the scale type), which covers the
//              row-major layout (G*Ks, Ks, 1) and the column-major view (1, Ks*S, S); the scale type is the e8m0
//              byte (float8_e8m0fnu or uint8) or float32 holding 2^(byte - 127).
// Only head_dim 512 with rope_dim 64 is compiled; other shapes return kIrgqUnsupportedShape (the Python side
// sends those to Triton before they get here).
#pragma once

#include <stdint.h>

#if !defined(FUSEDROPE_HIP_NO_RUNTIME_HEADERS) && __has_include(<hip/hip_runtime.h>)
#include <hip/hip_runtime.h>
#define FUSEDROPE_HIP_HAVE_RUNTIME 1
#else
// Compile-only checks (clang -nogpuinc, no ROCm installed): the same opaque handle type HIP declares.
typedef struct ihipStream_t* hipStream_t;
#define FUSEDROPE_HIP_HAVE_RUNTIME 0
#endif

namespace fusedrope_hip {

enum IrgqStatus : int {
  kIrgqOk = 0,
  kIrgqUnsupportedShape = 1,  // head_dim != 512 or rope_dim != 64
  kIrgqBadGroup = 2,          // quant_group_size not 32/64/128/256, or G / Dg inconsistent
  kIrgqBadDtype = 3,          // unknown dtype code
  kIrgqTooLarge = 4,          // S * H * 512 / 16 does not fit the 31-bit chunk index
  kIrgqLaunchFailed = 5,      // hipLaunchKernel returned an error
};

enum IrgqDtype : int { kIrgqBF16 = 0, kIrgqF16 = 1, kIrgqF32 = 2 };

struct IrgqParams {
  const void* o;            // [S, H, head_dim]
  int64_t num_tokens;       // S
  int32_t num_heads;        // H
  int32_t head_dim;         // must be 512
  int32_t o_dtype;          // kIrgqBF16 / kIrgqF16
  const void* positions;
  int32_t pos_is_int64;     // 1: int64, 0: int32
  int64_t pos_stride;       // elements
  const void* cos;
  const void* sin;
  int32_t cache_dtype;      // kIrgqBF16 / kIrgqF16 / kIrgqF32
  int64_t cos_stride;       // row stride, elements
  int64_t sin_stride;
  int64_t max_pos;          // >= 1
  int32_t rope_dim;         // must be 64
  void* x_fp8;              // [S, G, Dg] contiguous
  int32_t fp8_fnuz;         // 1: e4m3fnuz (240), 0: OCP e4m3fn (448)
  int32_t num_groups;       // G
  int32_t quant_group_size; // 32 / 64 / 128 / 256
  void* x_scale;
  int32_t scale_is_f32;     // 1: float32 2^(byte-127), 0: the e8m0 byte
  int64_t scale_stride_s;   // elements of the scale type
  int64_t scale_stride_b;
};

// Launches on `stream` (no synchronisation). Returns an IrgqStatus; S == 0 is a no-op. On kIrgqLaunchFailed
// the hipError_t is stored in *hip_error when given.
int launch_inverse_rope_group_quant(const IrgqParams& p, hipStream_t stream, int* hip_error = nullptr);

const char* irgq_status_string(int status);

}  // namespace fusedrope_hip
