// Fused inverse RoPE + FP8 per-group quant with e8m0 (power-of-two) scales, HIP (gfx942 / gfx950).
//
// Framework-free: raw pointers, element strides and a hipStream_t. The torch binding lives in
// inverse_rope_group_quant_torch.cpp; fusedrope/hip_ext.py builds both with torch.utils.cpp_extension.
// Parameters (fusedrope::irgq::Params), status codes, kernel arguments and the scalar math (e8m0 byte, exact
// software fp8 RNE, token division) are the plain-C++ header the CUDA kernel shares,
// ../kernels_cuda/inverse_rope_group_quant_common.h (tested on the CPU with g++ against the reference).
//
// Contract (identical to fusedrope.reference.inverse_rope_group_quant, see docs/inverse_rope_group_quant.md):
//   o          [S, H, 512] bf16 or fp16, contiguous
//   positions  [>= S] int64 or int32, element stride pos_stride; clamped to [0, max_pos) on the device
//   cos, sin   [max_pos, 32] bf16 / fp16 / fp32, row strides cos_stride / sin_stride (elements), last dim
//              contiguous; the rope tail is the last 64 dims of every head (GPT-J pairs, inverse rotation)
//   x_fp8      [S, G, Dg] contiguous, OCP e4m3fn (FP8_MAX 448) or e4m3fnuz (240)
//   x_scale    [S, G, Ks], Ks = Dg / quant_group_size; element (s, g, k) lives at
//              s * scale_stride_s + (g * Ks + k) * scale_stride_b (elements of the scale type), which covers the
//              row-major layout (G*Ks, Ks, 1) and the column-major view (1, Ks*L, L), L >= S; the scale type
//              is the e8m0 byte (float8_e8m0fnu or uint8) or float32 holding 2^(byte - 127).
// Only head_dim 512 with rope_dim 64 is compiled; other shapes return kUnsupportedShape (the Python side sends
// those to Triton before they get here).
#pragma once

#include "../kernels_cuda/inverse_rope_group_quant_common.h"

#if !defined(FUSEDROPE_HIP_NO_RUNTIME_HEADERS) && __has_include(<hip/hip_runtime.h>)
#include <hip/hip_runtime.h>
#define FUSEDROPE_HIP_HAVE_RUNTIME 1
#else
// Compile-only checks (clang -nogpuinc, no ROCm installed): the same opaque handle type HIP declares.
typedef struct ihipStream_t* hipStream_t;
#define FUSEDROPE_HIP_HAVE_RUNTIME 0
#endif

namespace fusedrope_hip {

// Launches on `stream` (no synchronisation). Returns a fusedrope::irgq::Status; S == 0 is a no-op. On
// kLaunchFailed the hipError_t is stored in *hip_error when given.
int launch_inverse_rope_group_quant(const fusedrope::irgq::Params& p, hipStream_t stream,
                                    int* hip_error = nullptr);

const char* irgq_status_string(int status);

}  // namespace fusedrope_hip
