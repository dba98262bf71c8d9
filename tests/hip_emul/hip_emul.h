// A wave emulator for the HIP kernel (kernels_hip/inverse_rope_group_quant.hip) on the CPU: the kernel source is
// compiled as host C++ by clang (its ext_vector_type and __builtin_elementwise_max are clang's) with the few
// AMDGPU builtins it uses mapped to the functions below, and the work-items run in lockstep (../lockstep.h: one
// std::thread each, cross-lane reads through barriers), so the DPP reads happen as on a wave64 GPU:
//
//   * __builtin_amdgcn_update_dpp: each lane reads its source lane inside its 16-lane row (quad_perm,
//     row_half_mirror, row_mirror; any other control is reported); row/bank masks and bound_ctrl as the ISA
//     manual defines them; a source lane that did not execute the same DPP is reported (undefined on hardware).
//   * __builtin_amdgcn_workitem_id_x / workgroup_id_x: the thread's ids; __builtin_amdgcn_fmed3f: the median;
//     address_space(1) pointers become plain pointers, and the launch bounds attribute is dropped.
//
// Not emulated: v_cvt_pk_fp8_f32 (the host compile has no gfx9 macros, so the kernel's exact software fp8 path
// runs; the hardware path is checked in the ISA tests and owed on AMD hardware).
#pragma once

#include <algorithm>

#include "lockstep.h"

namespace hip_emul {

// Source position inside the 16-lane row for the DPP controls the kernel may use; -1 for any other.
inline int dpp_source(int ctrl, int pos) {
  if (ctrl >= 0 && ctrl <= 0xFF) return (pos & ~3) | ((ctrl >> (2 * (pos & 3))) & 3);  // quad_perm
  if (ctrl == 0x140) return 15 - pos;                                                   // row_mirror
  if (ctrl == 0x141) return (pos & 8) | (7 - (pos & 7));                                // row_half_mirror
  return -1;
}

inline int update_dpp(int old, int src, int ctrl, int row_mask, int bank_mask, bool bound_ctrl) {
  if (dpp_source(ctrl, 0) < 0) lockstep::report("unsupported DPP control", ctrl);
  const unsigned lane = lockstep::tid % 64;
  const bool enabled = ((row_mask >> (lane / 16)) & 1) && ((bank_mask >> (lane % 16 / 4)) & 1);
  const unsigned long long fallback = (unsigned)(bound_ctrl ? 0 : old);
  const unsigned long long v = lockstep::exchange((unsigned)src, ctrl, 64, [&](int l) {
    const int s = dpp_source(ctrl, l % 16);
    return enabled && s >= 0 ? (l / 16) * 16 + s : -1;
  }, fallback);
  return enabled ? (int)(unsigned)v : old;
}

inline float fmed3(float a, float b, float c) { return std::max(std::min(a, b), std::min(std::max(a, b), c)); }

}  // namespace hip_emul

#define __builtin_amdgcn_workitem_id_x() (lockstep::tid)
#define __builtin_amdgcn_workgroup_id_x() (lockstep::bid)
#define __builtin_amdgcn_update_dpp hip_emul::update_dpp
#define __builtin_amdgcn_fmed3f hip_emul::fmed3
#define address_space(n)
#define amdgpu_flat_work_group_size(lo, hi)
