// Torch binding of the inverse_rope_group_quant HIP kernel (inverse_rope_group_quant.hip, framework-free), for a
// ROCm build of torch (where AMD GPUs are torch "cuda" devices: the masquerading guard and stream below).
//
//   torch.ops.fusedrope_hip.inverse_rope_group_quant_out(o, positions, cos, sin, x_fp8, x_scale,
//                                                        quant_group_size) -> ()
//
// Writes x_fp8 [S, G, Dg] and x_scale [S, G, Dg/Q] in place; x_scale's layout (row-major, or the column-major
// view with strides (1, Ks*S, S)) is read from its strides and its dtype picks the format (float8_e8m0fnu or
// uint8: the e8m0 byte; float32: 2^(byte-127)). x_fp8 is float8_e4m3fnuz (gfx942 hardware) or float8_e4m3fn
// (gfx950 hardware); the other one is correct too, through the kernel's software conversion. Launches on the
// current stream of o's device, never synchronizes (HIP-graph capturable). fusedrope/inverse_rope_quant.py
// validates the inputs first; these checks are the defensive second line.
//
// Built by fusedrope/hip_ext.py (torch.utils.cpp_extension.load with hipcc). NOT compiled in this repository's
// CI (no ROCm there): see docs/kernels_hip.md.
#include <ATen/core/Tensor.h>
#include <ATen/hip/impl/HIPGuardImplMasqueradingAsCUDA.h>
#include <ATen/hip/impl/HIPStreamMasqueradingAsCUDA.h>
#include <torch/library.h>

#include <cstdint>

#include "inverse_rope_group_quant.h"

namespace {

constexpr const char* kOp = "fusedrope_hip::inverse_rope_group_quant_out";

void check_device(const at::Tensor& t, const char* name, const at::Tensor& o) {
  TORCH_CHECK(t.defined(), kOp, ": argument '", name, "' is an undefined tensor");
  TORCH_CHECK(t.is_cuda(), kOp, ": argument '", name, "' expected a GPU tensor, got a tensor on ", t.device());
  TORCH_CHECK(t.device() == o.device(), kOp, ": argument '", name, "' expected a tensor on ", o.device(),
              " (same device as 'o'), got ", t.device());
}

int dtype_code(at::ScalarType t) {
  return t == at::kBFloat16 ? fusedrope::irgq::kBF16 : t == at::kHalf ? fusedrope::irgq::kF16 : fusedrope::irgq::kF32;
}

void inverse_rope_group_quant_out(const at::Tensor& o, const at::Tensor& positions, const at::Tensor& cos,
                                  const at::Tensor& sin, at::Tensor& x_fp8, at::Tensor& x_scale,
                                  int64_t quant_group_size) {
  TORCH_CHECK(o.defined() && o.is_cuda(), kOp, ": argument 'o' expected a GPU tensor");
  check_device(positions, "positions", o);
  check_device(cos, "cos", o);
  check_device(sin, "sin", o);
  check_device(x_fp8, "x_fp8", o);
  check_device(x_scale, "x_scale", o);
  TORCH_CHECK(o.dim() == 3, kOp, ": argument 'o' expected a 3-D tensor [S, H, head_dim], got shape ", o.sizes());
  TORCH_CHECK(o.scalar_type() == at::kBFloat16 || o.scalar_type() == at::kHalf, kOp,
              ": argument 'o' expected dtype bfloat16 or float16, got ", o.scalar_type());
  TORCH_CHECK(o.is_contiguous(), kOp, ": argument 'o' expected a contiguous tensor, got strides ", o.strides());
  const int64_t S = o.size(0), H = o.size(1), D = o.size(2);
  TORCH_CHECK(D == 512, kOp, ": argument 'o' expected head_dim 512 (the compiled kernel's), got ", D);
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) >= S, kOp,
              ": argument 'positions' expected a 1-D tensor with at least S=", S, " elements, got shape ",
              positions.sizes());
  TORCH_CHECK(positions.scalar_type() == at::kLong || positions.scalar_type() == at::kInt, kOp,
              ": argument 'positions' expected dtype int64 or int32, got ", positions.scalar_type());
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == 32 && cos.size(0) >= 1, kOp,
              ": argument 'cos' expected shape [max_pos >= 1, 32] (rope_dim 64), got ", cos.sizes());
  TORCH_CHECK(sin.sizes() == cos.sizes(), kOp, ": argument 'sin' expected shape ", cos.sizes(),
              " (same as 'cos'), got ", sin.sizes());
  TORCH_CHECK(cos.scalar_type() == at::kBFloat16 || cos.scalar_type() == at::kHalf ||
                  cos.scalar_type() == at::kFloat,
              kOp, ": argument 'cos' expected dtype bfloat16, float16 or float32, got ", cos.scalar_type());
  TORCH_CHECK(sin.scalar_type() == cos.scalar_type(), kOp, ": argument 'sin' expected dtype ", cos.scalar_type(),
              " (same as 'cos'), got ", sin.scalar_type());
  TORCH_CHECK(cos.stride(1) == 1 && sin.stride(1) == 1, kOp,
              ": arguments 'cos'/'sin' expected a contiguous last dimension, got strides ", cos.strides(), " / ",
              sin.strides());
  const int64_t q = quant_group_size;
  TORCH_CHECK(q == 32 || q == 64 || q == 128 || q == 256, kOp,
              ": argument 'quant_group_size' expected 32, 64, 128 or 256, got ", q);
  TORCH_CHECK(x_fp8.dim() == 3 && x_fp8.size(0) == S && x_fp8.size(1) >= 1 && x_fp8.size(1) * x_fp8.size(2) == H * D,
              kOp, ": argument 'x_fp8' expected shape [", S, ", G, ", H * D, "/G], got ", x_fp8.sizes());
  TORCH_CHECK(x_fp8.scalar_type() == at::kFloat8_e4m3fnuz || x_fp8.scalar_type() == at::kFloat8_e4m3fn, kOp,
              ": argument 'x_fp8' expected dtype float8_e4m3fnuz or float8_e4m3fn, got ", x_fp8.scalar_type());
  TORCH_CHECK(x_fp8.is_contiguous(), kOp, ": argument 'x_fp8' expected a contiguous tensor, got strides ",
              x_fp8.strides());
  const int64_t G = x_fp8.size(1), Dg = x_fp8.size(2);
  TORCH_CHECK(Dg % q == 0, kOp, ": argument 'quant_group_size' expected a divisor of Dg=", Dg, ", got ", q);
  const int64_t Ks = Dg / q;
  TORCH_CHECK(x_scale.dim() == 3 && x_scale.size(0) == S && x_scale.size(1) == G && x_scale.size(2) == Ks, kOp,
              ": argument 'x_scale' expected shape [", S, ", ", G, ", ", Ks, "], got ", x_scale.sizes());
  const auto st = x_scale.scalar_type();
  TORCH_CHECK(st == at::kFloat8_e8m0fnu || st == at::kByte || st == at::kFloat, kOp,
              ": argument 'x_scale' expected dtype float8_e8m0fnu, uint8 or float32, got ", st);
  // The kernel addresses scale (s, g, k) as s*stride(0) + (g*Ks + k)*stride(2): row-major and column-major both
  // satisfy stride(1) == Ks * stride(2).
  TORCH_CHECK(G == 1 || Ks == 1 || x_scale.stride(1) == Ks * x_scale.stride(2), kOp,
              ": argument 'x_scale' expected row-major strides (", G * Ks, ", ", Ks,
              ", 1) or column-major strides (1, ", Ks * S, ", ", S, "), got ", x_scale.strides());
  TORCH_CHECK(S * H * D / 16 <= INT32_MAX, kOp, ": expected S*H*head_dim/16 < 2^31, got S=", S, " H=", H);
  if (S == 0) return;

  fusedrope::irgq::Params p{};
  p.o = o.data_ptr();
  p.num_tokens = S;
  p.num_heads = static_cast<int32_t>(H);
  p.head_dim = static_cast<int32_t>(D);
  p.o_dtype = dtype_code(o.scalar_type());
  p.positions = positions.data_ptr();
  p.pos_is_int64 = positions.scalar_type() == at::kLong;
  p.pos_stride = positions.stride(0);
  p.cos = cos.data_ptr();
  p.sin = sin.data_ptr();
  p.cache_dtype = dtype_code(cos.scalar_type());
  p.cos_stride = cos.stride(0);
  p.sin_stride = sin.stride(0);
  p.max_pos = cos.size(0);
  p.rope_dim = static_cast<int32_t>(2 * cos.size(1));
  p.x_fp8 = x_fp8.data_ptr();
  p.fp8_fnuz = x_fp8.scalar_type() == at::kFloat8_e4m3fnuz;
  p.num_groups = static_cast<int32_t>(G);
  p.quant_group_size = static_cast<int32_t>(q);
  p.x_scale = x_scale.data_ptr();
  p.scale_is_f32 = st == at::kFloat;
  p.scale_stride_s = x_scale.stride(0);
  p.scale_stride_b = Ks > 1 ? x_scale.stride(2) : x_scale.stride(1);  // block index b = g*Ks + k

  const c10::hip::HIPGuardMasqueradingAsCUDA guard(o.device());
  const hipStream_t stream = c10::hip::getCurrentHIPStreamMasqueradingAsCUDA(o.device().index()).stream();
  int hip_error = 0;
  const int status = fusedrope_hip::launch_inverse_rope_group_quant(p, stream, &hip_error);
  TORCH_CHECK(status == fusedrope::irgq::kOk, kOp, ": ", fusedrope_hip::irgq_status_string(status),
              status == fusedrope::irgq::kLaunchFailed ? ": " : "",
              status == fusedrope::irgq::kLaunchFailed ? hipGetErrorString(static_cast<hipError_t>(hip_error)) : "");
}

}  // namespace

// FRAGMENT: further HIP ops may register in the same namespace from other sources of the extension.
TORCH_LIBRARY_FRAGMENT(fusedrope_hip, m) {
  m.def(
      "inverse_rope_group_quant_out(Tensor o, Tensor positions, Tensor cos, Tensor sin, Tensor(a!) x_fp8, "
      "Tensor(b!) x_scale, int quant_group_size) -> ()");
}

// ROCm torch dispatches AMD GPU tensors under the CUDA key ("masquerading as CUDA").
TORCH_LIBRARY_IMPL(fusedrope_hip, CUDA, m) {
  m.impl("inverse_rope_group_quant_out", &inverse_rope_group_quant_out);
}
