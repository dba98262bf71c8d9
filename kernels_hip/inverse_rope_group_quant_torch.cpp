// Torch binding of the inverse_rope_group_quant HIP kernel (inverse_rope_group_quant.hip, framework-free), for a
// ROCm build of torch (where AMD GPUs are torch "cuda" devices: the masquerading guard and stream below).
//
//   torch.ops.fusedrope_hip.inverse_rope_group_quant_out(o, positions, cos, sin, x_fp8, x_scale,
//                                                        quant_group_size, scale_layout=0, pdl=0, kernel=0) -> ()
//
// Writes x_fp8 [S, G, Dg] (rows of Dg contiguous) and x_scale in place, as the CUDA binding does
// (../kernels_cuda/inverse_rope_group_quant_torch.cpp: scale_layout 0 reads x_scale's layout, row-major or the
// column-major view with strides (1, Ks*L, L), off its strides; 1 is mfma_tile); its dtype picks the format
// (float8_e8m0fnu or uint8: the e8m0 byte; float32: 2^(byte-127)). x_fp8 is float8_e4m3fnuz (gfx942 hardware) or
// float8_e4m3fn (gfx950 hardware); the other one is correct too, through the kernel's software conversion.
// Launches on the current stream of o's device, never synchronizes (HIP-graph capturable).
// fusedrope/inverse_rope_group_quant/__init__.py validates the inputs first; the checks
// (../kernels_cuda/inverse_rope_group_quant_binding.h, shared with the CUDA binding, plain torch C++) are the
// defensive second line.
//
// Built by fusedrope/hip_ext.py (torch.utils.cpp_extension.load with hipcc). NOT compiled in this repository's
// CI (no ROCm there): see docs/kernels_hip.md.
#include <ATen/core/Tensor.h>
#include <ATen/hip/impl/HIPGuardImplMasqueradingAsCUDA.h>
#include <ATen/hip/impl/HIPStreamMasqueradingAsCUDA.h>
#include <torch/library.h>

#include <cstdint>

#include "inverse_rope_group_quant.h"
#include "../kernels_cuda/inverse_rope_group_quant_binding.h"

namespace {

constexpr fusedrope::irgq::BindingNames kNames{"fusedrope_hip::inverse_rope_group_quant_out", "GPU",
                                               "float8_e4m3fnuz or float8_e4m3fn"};

void inverse_rope_group_quant_out(const at::Tensor& o, const at::Tensor& positions, const at::Tensor& cos,
                                  const at::Tensor& sin, at::Tensor& x_fp8, at::Tensor& x_scale,
                                  int64_t quant_group_size, int64_t scale_layout, int64_t pdl, int64_t kernel) {
  fusedrope::irgq::Params p;  // pdl: a CUDA launch mode, checked and ignored here
  if (!fusedrope::irgq::params_from_tensors(kNames, o, positions, cos, sin, x_fp8, x_scale, quant_group_size,
                                            scale_layout, pdl, kernel, &p)) {
    return;  // S == 0 or H == 0: nothing to write
  }
  const c10::hip::HIPGuardMasqueradingAsCUDA guard(o.device());
  const hipStream_t stream = c10::hip::getCurrentHIPStreamMasqueradingAsCUDA(o.device().index()).stream();
  int hip_error = 0;
  const int status = fusedrope_hip::launch_inverse_rope_group_quant(p, stream, &hip_error);
  TORCH_CHECK(status == fusedrope::irgq::kOk, kNames.op, ": ", fusedrope_hip::irgq_status_string(status),
              status == fusedrope::irgq::kLaunchFailed ? ": " : "",
              status == fusedrope::irgq::kLaunchFailed ? hipGetErrorString(static_cast<hipError_t>(hip_error)) : "");
}

}  // namespace

// FRAGMENT: further HIP ops may register in the same namespace from other sources of the extension.
TORCH_LIBRARY_FRAGMENT(fusedrope_hip, m) {
  m.def(fusedrope::irgq::kOpSchema);
}

// ROCm torch dispatches AMD GPU tensors under the CUDA key ("masquerading as CUDA").
TORCH_LIBRARY_IMPL(fusedrope_hip, CUDA, m) {
  m.impl("inverse_rope_group_quant_out", &inverse_rope_group_quant_out);
}
