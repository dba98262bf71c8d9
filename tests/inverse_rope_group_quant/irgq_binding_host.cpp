// The checks of the op-2 torch bindings (../kernels_cuda/inverse_rope_group_quant_binding.h, shared by the CUDA
// and the HIP binding) built against a CPU torch and run on CPU tensors:
// tests/inverse_rope_group_quant/test_inverse_rope_group_quant_binding.py loads this
// as a torch library. Every tensor here is on the CPU, so is_cuda() is read as is_cpu() inside the header: the
// device checks pass, and everything after them (shapes, dtypes, strides, the scale layout, the parameters the
// kernels get) runs as on the GPU.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#define is_cuda is_cpu
#include "inverse_rope_group_quant_binding.h"
#undef is_cuda

#include <vector>

namespace {

// [launch, S, H, G, quant_group_size, scale_stride_s, scale_stride_b, pos_stride, cos_stride, sin_stride,
//  x_stride_s, x_stride_g, scale_layout, scale_rows, pdl, kernel]
std::vector<int64_t> params(const at::Tensor& o, const at::Tensor& positions, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& x_fp8, const at::Tensor& x_scale, int64_t q,
                            int64_t scale_layout, int64_t pdl, int64_t kernel) {
  const fusedrope::irgq::BindingNames n{"fusedrope_host::params", "CPU", "float8_e4m3fn or float8_e4m3fnuz"};
  fusedrope::irgq::Params p;
  const bool launch = fusedrope::irgq::params_from_tensors(n, o, positions, cos, sin, x_fp8, x_scale, q,
                                                           scale_layout, pdl, kernel, &p);
  return {launch,           p.num_tokens,     p.num_heads,  p.num_groups,     p.quant_group_size,
          p.scale_stride_s, p.scale_stride_b, p.pos_stride, p.cos_stride,     p.sin_stride,
          p.x_stride_s,     p.x_stride_g,     p.scale_layout, p.scale_rows,   p.pdl,
          p.kernel};
}

}  // namespace

TORCH_LIBRARY(fusedrope_host, m) {
  m.def("params(Tensor o, Tensor positions, Tensor cos, Tensor sin, Tensor x_fp8, Tensor x_scale, int q, "
        "int scale_layout=0, int pdl=0, int kernel=0) -> int[]",
        &params);
}
