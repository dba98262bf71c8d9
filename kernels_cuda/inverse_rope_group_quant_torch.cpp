// Torch binding of the inverse_rope_group_quant CUDA kernel (inverse_rope_group_quant.cu, framework-free).
//
//   torch.ops.fusedrope_cuda.inverse_rope_group_quant_out(o, positions, cos, sin, x_fp8, x_scale,
//                                                         quant_group_size, scale_layout=0) -> ()
//   torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config(..., quant_group_size, tail_warps=0,
//                                                                fast_layout=0, block_threads=0, pdl=0, tiled=0,
//                                                                scale_layout=0) -> ()
//     the same with the launch experiments of README.md switched on (all 0: the default launch), for tests and
//     the benchmarks that decide them
//
// Writes x_fp8 [S, G, Dg] (rows of Dg contiguous: row-major, group-major or padded) and x_scale in place.
// scale_layout 0: x_scale [S, G, Dg/Q], row-major or the column-major view with strides (1, Ks*L, L), read from its
// strides (column-major may have more token rows than S, L >= them: written as zeros); 1: the contiguous
// [G, S_pad, Ks_pad] mfma_tile buffer. Its dtype picks the format: float8_e8m0fnu or uint8 for the e8m0 byte,
// float32 for 2^(byte-127). Launches on the current stream of o's device and never synchronizes (CUDA-graph
// capturable). fusedrope/inverse_rope_group_quant/__init__.py validates the inputs first; the checks
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

constexpr fusedrope::irgq::BindingNames kNamesConfig{"fusedrope_cuda::inverse_rope_group_quant_out_config",
                                                     "CUDA", "float8_e4m3fn or float8_e4m3fnuz"};

void run(const fusedrope::irgq::BindingNames& names, const at::Tensor& o, const at::Tensor& positions,
         const at::Tensor& cos, const at::Tensor& sin, at::Tensor& x_fp8, at::Tensor& x_scale,
         int64_t quant_group_size, int64_t scale_layout, int64_t tail_warps, int64_t fast_layout,
         int64_t block_threads, int64_t pdl, int64_t tiled) {
  // Range checks before the int32 Params fields take them (the launcher checks the rest).
  TORCH_CHECK(tail_warps == 0 || tail_warps == 1, names.op, ": argument 'tail_warps' expected 0 or 1, got ",
              fusedrope::msg::num(tail_warps));
  TORCH_CHECK(fast_layout == 0 || fast_layout == 1, names.op, ": argument 'fast_layout' expected 0 or 1, got ",
              fusedrope::msg::num(fast_layout));
  TORCH_CHECK(tail_warps == 0 || fast_layout == 0, names.op,
              ": arguments 'tail_warps' and 'fast_layout' are separate experiments: expected at most one of them 1");
  TORCH_CHECK(block_threads == 0 || (block_threads >= 32 && block_threads <= 256 && block_threads % 32 == 0),
              names.op, ": argument 'block_threads' expected 0 (256) or a multiple of 32 from 32 to 256, got ",
              fusedrope::msg::num(block_threads));
  TORCH_CHECK(pdl == 0 || pdl == 1, names.op, ": argument 'pdl' expected 0 or 1, got ", fusedrope::msg::num(pdl));
  TORCH_CHECK(tiled == 0 || tiled == 1, names.op, ": argument 'tiled' expected 0 or 1, got ",
              fusedrope::msg::num(tiled));
  fusedrope::irgq::Params p;
  if (!fusedrope::irgq::params_from_tensors(names, o, positions, cos, sin, x_fp8, x_scale, quant_group_size,
                                            scale_layout, &p)) {
    return;  // S == 0 or H == 0: nothing to write
  }
  p.tail_warps = static_cast<int32_t>(tail_warps);
  p.fast_layout = static_cast<int32_t>(fast_layout);
  p.block_threads = static_cast<int32_t>(block_threads);
  p.pdl = static_cast<int32_t>(pdl);
  p.tiled = static_cast<int32_t>(tiled);
  const c10::cuda::CUDAGuard guard(o.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(o.device().index()).stream();
  int cuda_error = 0;
  const int status = fusedrope::irgq::launch(p, stream, &cuda_error);
  TORCH_CHECK(status == fusedrope::irgq::kOk, names.op, ": ", fusedrope::irgq::status_string(status),
              status == fusedrope::irgq::kLaunchFailed ? ": " : "",
              status == fusedrope::irgq::kLaunchFailed ? cudaGetErrorString(static_cast<cudaError_t>(cuda_error))
                                                      : "");
}

void inverse_rope_group_quant_out(const at::Tensor& o, const at::Tensor& positions, const at::Tensor& cos,
                                  const at::Tensor& sin, at::Tensor& x_fp8, at::Tensor& x_scale,
                                  int64_t quant_group_size, int64_t scale_layout) {
  run(kNames, o, positions, cos, sin, x_fp8, x_scale, quant_group_size, scale_layout, 0, 0, 0, 0, 0);
}

// The same with the launch experiments of README.md switched on: tail_warps 1 (the rope-tail chunks in warps of
// their own), fast_layout 1 (the fast-layout kernels, where the layout allows), block_threads (0 = 256), pdl 1
// (a programmatic dependent launch, sm_90+), tiled 1 (the tiled kernel for any layout).
void inverse_rope_group_quant_out_config(const at::Tensor& o, const at::Tensor& positions, const at::Tensor& cos,
                                         const at::Tensor& sin, at::Tensor& x_fp8, at::Tensor& x_scale,
                                         int64_t quant_group_size, int64_t tail_warps, int64_t fast_layout,
                                         int64_t block_threads, int64_t pdl, int64_t tiled, int64_t scale_layout) {
  run(kNamesConfig, o, positions, cos, sin, x_fp8, x_scale, quant_group_size, scale_layout, tail_warps, fast_layout,
      block_threads, pdl, tiled);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedrope_cuda, m) {
  m.def(fusedrope::irgq::kOpSchema);
  m.def("inverse_rope_group_quant_out_config(Tensor o, Tensor positions, Tensor cos, Tensor sin, Tensor(a!) x_fp8, "
        "Tensor(b!) x_scale, int quant_group_size, int tail_warps=0, int fast_layout=0, int block_threads=0, "
        "int pdl=0, int tiled=0, int scale_layout=0) -> ()");
}

TORCH_LIBRARY_IMPL(fusedrope_cuda, CUDA, m) {
  m.impl("inverse_rope_group_quant_out", &inverse_rope_group_quant_out);
  m.impl("inverse_rope_group_quant_out_config", &inverse_rope_group_quant_out_config);
}
