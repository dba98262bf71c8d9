// fusedrope::irgq::Params from the flat arrays the ctypes harnesses take
// (tests/inverse_rope_group_quant/irgq_harness.py builds them),
// shared by tests/inverse_rope_group_quant/irgq_host_harness.cpp (the kernels' shared scalar math),
// tests/support/cuda_emul/irgq_harness.cpp and
// tests/support/hip_emul/harness.cpp (the whole CUDA and HIP kernels in lockstep emulation).
#pragma once

#include "inverse_rope_group_quant_common.h"

namespace irgq_test {

using fusedrope::irgq::Params;

// ptrs: o, positions, cos, sin, x_fp8, x_scale.
// ints: S, H, head_dim, o_dtype, pos_is_int64, pos_stride, cache_dtype, cos_stride, sin_stride, max_pos,
//       rope_dim, fp8_fnuz, num_groups, quant_group_size, scale_is_f32, scale_stride_s, scale_stride_b,
//       pdl, x_stride_s, x_stride_g, scale_layout, scale_rows, kernel.
inline Params params_from(void** ptrs, const long long* ints) {
  Params p;
  p.o = ptrs[0];
  p.positions = ptrs[1];
  p.cos = ptrs[2];
  p.sin = ptrs[3];
  p.x_fp8 = ptrs[4];
  p.x_scale = ptrs[5];
  p.num_tokens = ints[0];
  p.num_heads = (int32_t)ints[1];
  p.head_dim = (int32_t)ints[2];
  p.o_dtype = (int32_t)ints[3];
  p.pos_is_int64 = (int32_t)ints[4];
  p.pos_stride = ints[5];
  p.cache_dtype = (int32_t)ints[6];
  p.cos_stride = ints[7];
  p.sin_stride = ints[8];
  p.max_pos = ints[9];
  p.rope_dim = (int32_t)ints[10];
  p.fp8_fnuz = (int32_t)ints[11];
  p.num_groups = (int32_t)ints[12];
  p.quant_group_size = (int32_t)ints[13];
  p.scale_is_f32 = (int32_t)ints[14];
  p.scale_stride_s = ints[15];
  p.scale_stride_b = ints[16];
  p.pdl = (int32_t)ints[17];
  p.x_stride_s = ints[18];
  p.x_stride_g = ints[19];
  p.scale_layout = (int32_t)ints[20];
  p.scale_rows = ints[21];
  p.kernel = (int32_t)ints[22];
  return p;
}

}  // namespace irgq_test
