// A wave emulator for the HIP kernel (kernels_hip/inverse_rope_group_quant.hip) on the CPU: the kernel source is
// compiled as host C++ by clang (its ext_vector_type and __builtin_elementwise_max are clang's) with the few
// AMDGPU builtins it uses mapped to the functions below, and the work-items run in lockstep (../lockstep.h: one
// std::thread each, cross-lane reads through barriers), so the DPP reads happen as on a wave64 GPU:
//
//   * __builtin_amdgcn_update_dpp: each lane reads its source lane inside its 16-lane row (quad_perm,
//     row_half_mirror, row_mirror; any other control is reported); row/bank masks and bound_ctrl as the ISA
//     manual defines them; a source lane that did not execute the same DPP is reported (lockstep.h says how
//     far that goes).
//   * __builtin_amdgcn_workitem_id_x / workgroup_id_x: the thread's ids; __builtin_amdgcn_fmed3f: the median;
//     address_space(1) pointers become plain pointers, and the launch bounds attribute is dropped;
//     __shared__ (LDS) variables are shared by the block's threads and __builtin_amdgcn_s_barrier is its barrier.
//
// The fp8 conversion: built plainly, the host compile has no gfx9 macros and the kernel takes its exact software
// fp8 path. Built with -DHIP_EMUL_GFX=942 or 950, the kernel sees __gfx942__ / __gfx950__ and the builtin, and
// takes its hardware path through a model of v_cvt_pk_fp8_f32 (below): what that checks is the kernel's use of
// the instruction (clamping first, which format on which arch, byte and word order), not the silicon's rounding.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>

#include "lockstep.h"

#ifdef HIP_EMUL_GFX
#include "inverse_rope_group_quant_common.h"  // fp8_encode_sw: the RNE the model rounds with
#if HIP_EMUL_GFX == 942
#define __gfx942__ 1
#elif HIP_EMUL_GFX == 950
#define __gfx950__ 1
#endif
#endif

namespace hip_emul {

// Source position inside the 16-lane row for the DPP controls the kernel may use; -1 for any other.
inline int dpp_source(int ctrl, int pos) {
  if (ctrl >= 0 && ctrl <= 0xFF) return (pos & ~3) | ((ctrl >> (2 * (pos & 3))) & 3);  // quad_perm
  if (ctrl == 0x140) return 15 - pos;                                                   // row_mirror
  if (ctrl == 0x141) return (pos & 8) | (7 - (pos & 7));                                // row_half_mirror
  return -1;
}

inline int update_dpp(int old, int src, int ctrl, int row_mask, int bank_mask, bool bound_ctrl,
                      const std::source_location loc = std::source_location::current()) {
  if (dpp_source(ctrl, 0) < 0) lockstep::report("unsupported DPP control", ctrl);
  const unsigned lane = lockstep::tid % 64;
  const bool enabled = ((row_mask >> (lane / 16)) & 1) && ((bank_mask >> (lane % 16 / 4)) & 1);
  const unsigned long long fallback = (unsigned)(bound_ctrl ? 0 : old);
  const unsigned long long v = lockstep::exchange((unsigned)src, ctrl, 64, [&](int l) {
    const int s = dpp_source(ctrl, l % 16);
    return enabled && s >= 0 ? (l / 16) * 16 + s : -1;
  }, fallback, loc);
  return enabled ? (int)(unsigned)v : old;
}

inline float fmed3(float a, float b, float c) { return std::max(std::min(a, b), std::min(std::max(a, b), c)); }

inline std::atomic<long long> hw_cvts{0};

#ifdef HIP_EMUL_GFX
// v_cvt_pk_fp8_f32 dst, src0, src1 (the AMD CDNA3 ISA guide; LLVM's llvm.amdgcn.cvt.pk.fp8.f32): src0 and src1
// rounded to nearest even into fp8 (FNUZ e4m3 on gfx942, OCP e4m3fn on gfx950); word_sel false writes them to
// bytes 0 and 1 of dst, true to bytes 2 and 3; the other 16 bits keep `old`. Without the clamp modifier, values
// beyond the format's range are out of contract here: the kernel must have clamped them (reported if not).
inline int cvt_pk_fp8_f32(float src0, float src1, int old, bool word_sel) {
  constexpr bool fnuz = HIP_EMUL_GFX == 942;
  constexpr float fp8_max = fnuz ? 240.0f : 448.0f;
  ++hw_cvts;
  for (float x : {src0, src1})
    if (!std::isnan(x) && std::fabs(x) > fp8_max) lockstep::report("v_cvt_pk_fp8_f32 input beyond the fp8 range", 0);
  unsigned b0 = fusedrope::irgq::fp8_encode_sw(src0, fnuz), b1 = fusedrope::irgq::fp8_encode_sw(src1, fnuz);
  // Whether FNUZ hardware keeps the sign of a negative value that rounds to zero (writing 0x80, its NaN) is not
  // documented: modelled as keeping it, the worse case, which the kernel must undo.
  if (fnuz && b0 == 0 && std::signbit(src0)) b0 = 0x80u;
  if (fnuz && b1 == 0 && std::signbit(src1)) b1 = 0x80u;
  const unsigned pair = b0 | (b1 << 8);
  const unsigned o = (unsigned)old;
  return (int)(word_sel ? (o & 0x0000FFFFu) | (pair << 16) : (o & 0xFFFF0000u) | pair);
}
#endif

}  // namespace hip_emul

#ifdef HIP_EMUL_GFX
// The kernel asks __has_builtin before using the fp8 builtin; on the host target clang answers no, so the
// answer comes from this list (the kernel asks about nothing else).
#undef __has_builtin
#define __has_builtin(x) HIP_EMUL_HAS_##x
#define HIP_EMUL_HAS___builtin_amdgcn_cvt_pk_fp8_f32 1
#define __builtin_amdgcn_cvt_pk_fp8_f32 hip_emul::cvt_pk_fp8_f32
#endif

#define __builtin_amdgcn_workitem_id_x() (lockstep::tid)
#define __builtin_amdgcn_workgroup_id_x() (lockstep::bid)
#define __builtin_amdgcn_update_dpp hip_emul::update_dpp
#define __builtin_amdgcn_fmed3f hip_emul::fmed3
// LDS: one variable for the whole launch (blocks run one after another); the barrier is the block's, and the
// fences around it have nothing to order on the host.
#define __shared__ static
#define __builtin_amdgcn_s_barrier() lockstep::block->bar.arrive_and_wait()
#define __builtin_amdgcn_fence(order, scope) ((void)0)
#define address_space(n)
#define amdgpu_flat_work_group_size(lo, hi)
