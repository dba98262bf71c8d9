// The part of the inverse_rope_group_quant torch bindings that both vendors share
// (inverse_rope_group_quant_torch.cpp here and ../kernels_hip/inverse_rope_group_quant_torch.cpp): the checks
// that keep the kernels in bounds (fusedrope/inverse_rope_group_quant/__init__.py validates the inputs first, but
// the op is callable directly) and the kernel parameters taken from the tensors. Torch only, no vendor
// header: each binding keeps its device guard, stream, launch and error string, and says in BindingNames what
// its messages call the op, the device and the fp8 formats.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

#include "check_message.h"
#include "inverse_rope_group_quant_common.h"

namespace fusedrope {
namespace irgq {

// The op's schema, the same in both namespaces (torch.ops.fusedrope_cuda / torch.ops.fusedrope_hip).
// pdl 1: a programmatic dependent launch (CUDA, sm_90+; HIP ignores it). kernel 1: the head kernel for a layout
// the generic kernel writes too (kernels_cuda/README.md).
constexpr const char* kOpSchema =
    "inverse_rope_group_quant_out(Tensor o, Tensor positions, Tensor cos, Tensor sin, Tensor(a!) x_fp8, "
    "Tensor(b!) x_scale, int quant_group_size, int scale_layout=0, int pdl=0, int kernel=0) -> ()";

struct BindingNames {
  const char* op;          // "fusedrope_cuda::inverse_rope_group_quant_out"
  const char* device;      // "expected a <device> tensor"
  const char* fp8_dtypes;  // "expected dtype <fp8_dtypes>" for x_fp8
};

inline void check_device(const BindingNames& n, const at::Tensor& t, const char* name, const at::Tensor& o) {
  TORCH_CHECK(t.defined(), n.op, ": argument '", name, "' is an undefined tensor");
  TORCH_CHECK(t.is_cuda(), n.op, ": argument '", name, "' expected a ", n.device, " tensor, got a tensor on ",
              t.device());
  TORCH_CHECK(t.device() == o.device(), n.op, ": argument '", name, "' expected a tensor on ", o.device(),
              " (same device as 'o'), got ", t.device());
}

// A data pointer off its element size (a view of a numpy / DLPack / frombuffer buffer at an odd byte offset)
// would make the kernels' element loads and stores misaligned: a fault on the GPU.
inline void check_aligned(const BindingNames& n, const at::Tensor& t, const char* name) {
  const int64_t esz = static_cast<int64_t>(t.element_size());
  const int64_t off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) % static_cast<uintptr_t>(esz));
  TORCH_CHECK(t.numel() == 0 || off == 0, n.op, ": argument '", name,
              "' expected a data pointer aligned to its element size (", msg::num(esz), " bytes), got one ",
              msg::num(off), " bytes past");
}

inline int dtype_code(at::ScalarType t) { return t == at::kBFloat16 ? kBF16 : t == at::kHalf ? kF16 : kF32; }

// x_fp8 [S, G, Dg]: rows of Dg contiguous that no two (s, g) share (row-major, group-major, padded rows): taking
// the token and group dims (longer than 1) smaller stride first, each stride reaches past all that the dims below
// it cover (fusedrope/inverse_rope_group_quant/outputs.py: rows_apart, the same rule).
inline bool rows_apart(const at::Tensor& x) {
  const int64_t dg = x.size(2);
  if (x.numel() == 0) return true;
  if (dg > 1 && x.stride(2) != 1) return false;
  int64_t st[2] = {x.stride(0), x.stride(1)}, n[2] = {x.size(0), x.size(1)};
  if (st[1] < st[0]) std::swap(st[0], st[1]), std::swap(n[0], n[1]);
  int64_t reach = dg;  // elements from a row's start that the dims below cover
  for (int d = 0; d < 2; ++d) {
    if (n[d] <= 1) continue;
    if (st[d] < reach) return false;
    reach = st[d] * (n[d] - 1) + reach;
  }
  return true;
}

// Check the arguments of inverse_rope_group_quant_out (TORCH_CHECK errors name n.op) and fill *p from them.
// Returns false when there is nothing to launch (S == 0 or H == 0: empty outputs).
inline bool params_from_tensors(const BindingNames& n, const at::Tensor& o, const at::Tensor& positions,
                                const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& x_fp8,
                                const at::Tensor& x_scale, int64_t quant_group_size, int64_t scale_layout,
                                int64_t pdl, int64_t kernel, Params* p) {
  TORCH_CHECK(pdl == 0 || pdl == 1, n.op, ": argument 'pdl' expected 0 or 1, got ", msg::num(pdl));
  TORCH_CHECK(kernel == kGenericKernel || kernel == kHeadKernel, n.op,
              ": argument 'kernel' expected 0 (generic) or 1 (head), got ", msg::num(kernel));
  TORCH_CHECK(o.defined() && o.is_cuda(), n.op, ": argument 'o' expected a ", n.device, " tensor");
  check_device(n, positions, "positions", o);
  check_device(n, cos, "cos", o);
  check_device(n, sin, "sin", o);
  check_device(n, x_fp8, "x_fp8", o);
  check_device(n, x_scale, "x_scale", o);
  TORCH_CHECK(o.dim() == 3, n.op, ": argument 'o' expected a 3-D tensor [S, H, head_dim], got shape ",
              msg::shape(o.sizes()));
  TORCH_CHECK(o.scalar_type() == at::kBFloat16 || o.scalar_type() == at::kHalf, n.op,
              ": argument 'o' expected dtype bfloat16 or float16, got ", o.scalar_type());
  TORCH_CHECK(o.is_contiguous(), n.op, ": argument 'o' expected a contiguous tensor, got strides ",
              msg::shape(o.strides()));
  const int64_t S = o.size(0), H = o.size(1), D = o.size(2);
  TORCH_CHECK(D == 512, n.op, ": argument 'o' expected head_dim 512 (the compiled kernel's), got ", msg::num(D));
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) >= S, n.op,
              ": argument 'positions' expected a 1-D tensor with at least S=", msg::num(S), " elements, got shape ",
              msg::shape(positions.sizes()));
  TORCH_CHECK(positions.scalar_type() == at::kLong || positions.scalar_type() == at::kInt, n.op,
              ": argument 'positions' expected dtype int64 or int32, got ", positions.scalar_type());
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == 32 && cos.size(0) >= 1, n.op,
              ": argument 'cos' expected shape [max_pos >= 1, 32] (rope_dim 64), got ", msg::shape(cos.sizes()));
  TORCH_CHECK(sin.sizes() == cos.sizes(), n.op, ": argument 'sin' expected shape ", msg::shape(cos.sizes()),
              " (same as 'cos'), got ", msg::shape(sin.sizes()));
  TORCH_CHECK(cos.scalar_type() == at::kBFloat16 || cos.scalar_type() == at::kHalf ||
                  cos.scalar_type() == at::kFloat,
              n.op, ": argument 'cos' expected dtype bfloat16, float16 or float32, got ", cos.scalar_type());
  TORCH_CHECK(sin.scalar_type() == cos.scalar_type(), n.op, ": argument 'sin' expected dtype ", cos.scalar_type(),
              " (same as 'cos'), got ", sin.scalar_type());
  TORCH_CHECK(cos.stride(1) == 1 && sin.stride(1) == 1, n.op,
              ": arguments 'cos'/'sin' expected a contiguous last dimension, got strides ",
              msg::shape(cos.strides()), " / ",
              msg::shape(sin.strides()));
  const int64_t q = quant_group_size;
  TORCH_CHECK(q == 32 || q == 64 || q == 128 || q == 256, n.op,
              ": argument 'quant_group_size' expected 32, 64, 128 or 256, got ", msg::num(q));
  TORCH_CHECK(x_fp8.dim() == 3 && x_fp8.size(0) == S && x_fp8.size(1) >= 1 && x_fp8.size(1) * x_fp8.size(2) == H * D,
              n.op, ": argument 'x_fp8' expected shape [", msg::num(S), ", G, ", msg::num(H * D), "/G], got ",
              msg::shape(x_fp8.sizes()));
  TORCH_CHECK(x_fp8.scalar_type() == at::kFloat8_e4m3fn || x_fp8.scalar_type() == at::kFloat8_e4m3fnuz, n.op,
              ": argument 'x_fp8' expected dtype ", n.fp8_dtypes, ", got ", x_fp8.scalar_type());
  const int64_t G = x_fp8.size(1), Dg = x_fp8.size(2);
  TORCH_CHECK(rows_apart(x_fp8), n.op, ": argument 'x_fp8' expected rows of Dg=", msg::num(Dg),
              " contiguous and apart (row-major, group-major (Dg, S*Dg, 1) or padded rows), got strides ",
              msg::shape(x_fp8.strides()));
  TORCH_CHECK(Dg % q == 0, n.op, ": argument 'quant_group_size' expected a divisor of Dg=",
              msg::num(Dg), ", got ", msg::num(q));
  const int64_t Ks = Dg / q;
  TORCH_CHECK(scale_layout == kScaleStrided || scale_layout == kScaleMfmaTile, n.op,
              ": argument 'scale_layout' expected 0 (row- or column-major, read off the strides) or 1 (mfma_tile), "
              "got ", msg::num(scale_layout));
  const auto st = x_scale.scalar_type();
  if (scale_layout == kScaleMfmaTile) {
    long long s_pad, ks_pad;
    mfma_tile_dims(S, Ks, static_cast<int>(q), &s_pad, &ks_pad);
    TORCH_CHECK(x_scale.dim() == 3 && x_scale.size(0) == G && x_scale.size(1) == s_pad &&
                    x_scale.size(2) == ks_pad && x_scale.is_contiguous(),
                n.op, ": argument 'x_scale' expected a contiguous mfma_tile buffer [", msg::num(G), ", ",
                msg::num(s_pad), ", ", msg::num(ks_pad), "], got shape ", msg::shape(x_scale.sizes()), " strides ",
                msg::shape(x_scale.strides()));
    TORCH_CHECK(st == at::kFloat8_e8m0fnu || st == at::kByte, n.op,
                ": argument 'x_scale' expected dtype float8_e8m0fnu or uint8 for mfma_tile, got ", st);
  } else {
    // Token rows past S (a column-major buffer padded to a TMA multiple) are written as zeros, by a launch for a
    // non-empty o only.
    TORCH_CHECK(x_scale.dim() == 3 && (x_scale.size(0) == S || (S > 0 && x_scale.size(0) > S)) &&
                    x_scale.size(1) == G && x_scale.size(2) == Ks,
                n.op, ": argument 'x_scale' expected shape [", msg::num(S),
                " (or more rows, column-major, for S > 0), ", msg::num(G), ", ", msg::num(Ks), "], got ",
                msg::shape(x_scale.sizes()));
    TORCH_CHECK(st == at::kFloat8_e8m0fnu || st == at::kByte || st == at::kFloat, n.op,
                ": argument 'x_scale' expected dtype float8_e8m0fnu, uint8 or float32, got ", st);
  }
  const int64_t rows = scale_layout == kScaleStrided ? x_scale.size(0) : S;
  // The kernel addresses scale (s, g, k) as s*stride(0) + (g*Ks + k)*stride_b. Only the two layouts the op
  // writes (buffer_scale_strides in fusedrope/inverse_rope_group_quant/outputs.py): row-major (G*Ks, Ks, 1), or
  // column-major (1, Ks*L, L) with L >= x_scale.size(0); strides of size-1 dims address nothing. Anything else
  // (stride(0) == 0, say) could make two blocks write one byte.
  const auto same_layout = [&](int64_t a, int64_t b, int64_t c) {
    const int64_t want[3] = {a, b, c};
    for (int d = 0; d < 3; ++d)
      if (x_scale.size(d) > 1 && x_scale.stride(d) != want[d]) return false;
    return true;
  };
  const int64_t lead = Ks > 1 ? x_scale.stride(2) : G > 1 ? x_scale.stride(1) : rows;
  TORCH_CHECK(scale_layout == kScaleMfmaTile || x_scale.numel() == 0 || (rows == S && same_layout(G * Ks, Ks, 1)) ||
                  (lead >= rows && same_layout(1, Ks * lead, lead)),
              n.op,
              ": argument 'x_scale' expected row-major strides (", msg::num(G * Ks), ", ", msg::num(Ks),
              ", 1) or column-major (1, ", msg::num(Ks), "*L, L) with L >= x_scale.size(0)=", msg::num(rows), ", got ",
              msg::shape(x_scale.strides()));
  check_aligned(n, o, "o");
  check_aligned(n, positions, "positions");
  check_aligned(n, cos, "cos");
  check_aligned(n, sin, "sin");
  check_aligned(n, x_fp8, "x_fp8");
  check_aligned(n, x_scale, "x_scale");
  // What a launch can index is the launcher's to say (kTooLarge: per kernel); the Params fields must hold H and S.
  TORCH_CHECK(H * D / 16 <= INT32_MAX && S <= INT32_MAX, n.op,
              ": expected H*head_dim/16 < 2^31 and S < 2^31, got S=", msg::num(S), " H=", msg::num(H));
  if (S == 0 || H == 0) return false;

  p->o = o.data_ptr();
  p->num_tokens = S;
  p->num_heads = static_cast<int32_t>(H);
  p->head_dim = static_cast<int32_t>(D);
  p->o_dtype = dtype_code(o.scalar_type());
  p->positions = positions.data_ptr();
  p->pos_is_int64 = positions.scalar_type() == at::kLong;
  // The stride of a size-1 dim addresses nothing and may be anything (2^62, say): 0, so that the launcher's
  // byte strides (stride * element size) cannot overflow.
  p->pos_stride = S > 1 ? positions.stride(0) : 0;
  p->cos = cos.data_ptr();
  p->sin = sin.data_ptr();
  p->cache_dtype = dtype_code(cos.scalar_type());
  p->cos_stride = cos.size(0) > 1 ? cos.stride(0) : 0;
  p->sin_stride = sin.size(0) > 1 ? sin.stride(0) : 0;
  p->max_pos = cos.size(0);
  p->rope_dim = static_cast<int32_t>(2 * cos.size(1));
  p->x_fp8 = x_fp8.data_ptr();
  p->fp8_fnuz = x_fp8.scalar_type() == at::kFloat8_e4m3fnuz;
  p->num_groups = static_cast<int32_t>(G);
  p->quant_group_size = static_cast<int32_t>(q);
  p->x_scale = x_scale.data_ptr();
  p->scale_is_f32 = st == at::kFloat;
  const bool strided = scale_layout == kScaleStrided;
  p->scale_stride_s = strided && rows > 1 ? x_scale.stride(0) : 0;
  p->scale_stride_b = !strided ? 0 : Ks > 1 ? x_scale.stride(2) : G > 1 ? x_scale.stride(1) : 0;  // b = g*Ks + k
  p->scale_layout = static_cast<int32_t>(scale_layout);
  p->scale_rows = rows;
  p->x_stride_s = S > 1 ? x_fp8.stride(0) : 0;
  p->x_stride_g = G > 1 ? x_fp8.stride(1) : 0;
  p->pdl = static_cast<int32_t>(pdl);
  p->kernel = static_cast<int32_t>(kernel);
  return true;
}

}  // namespace irgq
}  // namespace fusedrope
