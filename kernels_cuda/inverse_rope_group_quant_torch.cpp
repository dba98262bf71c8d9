// Torch binding of the inverse_rope_group_quant CUDA kernels (inverse_rope_group_quant.cu, framework-free).
//
//   torch.ops.fusedrope_cuda.inverse_rope_group_quant_out(o, positions, cos, sin, x_fp8, x_scale,
//                                                         quant_group_size, scale_layout=0, pdl=0, kernel=0) -> ()
//
// Writes x_fp8 [S, G, Dg] (rows of Dg contiguous: row-major, group-major or padded) and x_scale in place.
// scale_layout 0: x_scale [S, G, Dg/Q], row-major or the column-major view with strides (1, Ks*L, L), read from its
// strides (column-major may have more token rows than S, L >= them: written as zeros); 1 (mfma_tile) is HIP's.
// Its dtype picks the format: float8_e8m0fnu or uint8 for the e8m0 byte, float32 for 2^(byte-127). pdl 1: a
// programmatic dependent launch (sm_90+). kernel 1: the head kernel for a layout the generic kernel writes too
// (README.md). Launches on the current stream of o's device and never synchronizes (CUDA-graph capturable).
// fusedrope/inverse_rope_group_quant/__init__.py validates the inputs first; the checks
// (inverse_rope_group_quant_binding.h, shared with the HIP binding) are the defensive second line (the op is
// callable directly), with the same kind of messages.
//
// Other sources of this extension register ops in the same namespace: TORCH_LIBRARY_FRAGMENT, as
// qwen3_tts_rope_torch.cpp does.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "inverse_rope_group_quant.cuh"
#include "check_message.h"
#include "inverse_rope_group_quant_binding.h"

namespace {

constexpr fusedrope::irgq::BindingNames kNames{"fusedrope_cuda::inverse_rope_group_quant_out", "CUDA",
                                               "float8_e4m3fn or float8_e4m3fnuz"};

void inverse_rope_group_quant_out(const at::Tensor& o, const at::Tensor& positions, const at::Tensor& cos,
                                  const at::Tensor& sin, at::Tensor& x_fp8, at::Tensor& x_scale,
                                  int64_t quant_group_size, int64_t scale_layout, int64_t pdl, int64_t kernel) {
  fusedrope::irgq::Params p;
  if (!fusedrope::irgq::params_from_tensors(kNames, o, positions, cos, sin, x_fp8, x_scale, quant_group_size,
                                            scale_layout, pdl, kernel, &p)) {
    return;  // S == 0 or H == 0: nothing to write
  }
  const c10::cuda::CUDAGuard guard(o.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(o.device().index()).stream();
  int cuda_error = 0;
  const int status = fusedrope::irgq::launch(p, stream, &cuda_error);
  TORCH_CHECK(status == fusedrope::irgq::kOk, kNames.op, ": ", fusedrope::irgq::status_string(status),
              status == fusedrope::irgq::kLaunchFailed ? ": " : "",
              status == fusedrope::irgq::kLaunchFailed ? cudaGetErrorString(static_cast<cudaError_t>(cuda_error))
                                                      : "");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedrope_cuda, m) { m.def(fusedrope::irgq::kOpSchema); }

TORCH_LIBRARY_IMPL(fusedrope_cuda, CUDA, m) {
  m.impl("inverse_rope_group_quant_out", &inverse_rope_group_quant_out);
}
