// Host emulation stand-in for <cuda_fp8.h>: see cuda_emul.h. Built plainly, the emulated kernels take their
// software fp8 paths and use none of it. With -DFUSEDROPE_IRGQ_HW_E4M3=1 the inverse_rope_group_quant kernel
// takes its sm_89+ path through this model of __nv_cvt_float2_to_fp8x2 (CUDA's cuda_fp8.h documents it: x.x to
// the low byte, x.y to the high byte, round to nearest even, __NV_SATFINITE clamps finite values to +-448 and
// keeps NaN): what that checks is the kernel's use of the conversion, not the silicon's rounding.
#pragma once
#include <atomic>
#include <cmath>

#include "cuda_emul.h"
#include "inverse_rope_group_quant_common.h"  // fp8_encode_sw: the RNE the model rounds with

enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
typedef unsigned short __nv_fp8x2_storage_t;

inline std::atomic<long long> emu_fp8x2_cvts{0};
inline std::atomic<long long> emu_fp8x2_misuse{0};  // a saturation mode or format the kernel must not use

inline unsigned emu_e4m3_satfinite(float x) {
  if (std::isnan(x)) return 0x7Fu;
  return fusedrope::irgq::fp8_encode_sw(std::fmin(std::fmax(x, -448.0f), 448.0f), false);
}

inline __nv_fp8x2_storage_t __nv_cvt_float2_to_fp8x2(float2 x, __nv_saturation_t sat, __nv_fp8_interpretation_t fmt) {
  ++emu_fp8x2_cvts;
  if (sat != __NV_SATFINITE || fmt != __NV_E4M3) ++emu_fp8x2_misuse;
  return (__nv_fp8x2_storage_t)(emu_e4m3_satfinite(x.x) | (emu_e4m3_satfinite(x.y) << 8));
}
