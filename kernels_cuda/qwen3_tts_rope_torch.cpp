// Torch binding of the qwen3_tts_rope CUDA kernel (qwen3_tts_rope.cu, framework-free).
//
//   torch.ops.fusedrope_cuda.qwen3_tts_rope_out(q, k, cos, sin, q_out, k_out, positions=None, eager=False,
//                                                q_weight=None, k_weight=None, eps=0.0, pdl=False) -> ()
//   torch.ops.fusedrope_cuda.qwen3_tts_rope(q, k, cos, sin) -> (q_out, k_out)   new contiguous outputs
//
// Writes q_out / k_out through their own strides (pass q_out=q, k_out=k for in place). Launches on the current
// stream of q's device, never synchronizes (CUDA-graph capturable). fusedrope/qwen3_tts_rope validates the
// inputs before calling; the checks here are a second, defensive line with plain messages. The modes
// (positions with cos/sin tables [max_pos, D], eager, the q/k norm weights) are described in qwen3_tts_rope.cuh.
// pdl makes it a programmatic dependent launch (sm_90+).
//
// Other sources of the same extension register their ops in the namespace with TORCH_LIBRARY_FRAGMENT too:
// only one TORCH_LIBRARY block per namespace is allowed in a process.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "check_message.h"
#include "qwen3_tts_rope.cuh"

namespace {

namespace msg = fusedrope::msg;

constexpr const char* kOp = "fusedrope_cuda::qwen3_tts_rope_out";
constexpr const char* kOpNew = "fusedrope_cuda::qwen3_tts_rope";

// `t` on q's device, in q's dtype, `dim`-D, its last dim contiguous unless `any_strides`, its data pointer aligned.
void check_tensor(const char* op, const at::Tensor& t, const char* name, int64_t dim, const at::Tensor& q,
                  bool any_strides = false) {
  TORCH_CHECK(t.defined(), op, ": argument '", name, "' is an undefined tensor");
  TORCH_CHECK(t.is_cuda(), op, ": argument '", name, "' expected a CUDA tensor, got a tensor on ", t.device());
  TORCH_CHECK(t.device() == q.device(), op, ": argument '", name, "' expected a tensor on ", q.device(),
              " (same device as 'q'), got ", t.device());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), op, ": argument '", name, "' expected dtype ",
              q.scalar_type(), " (same as 'q'), got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, op, ": argument '", name, "' expected a ", msg::num(dim), "-D tensor, got ",
              msg::num(t.dim()),
              "-D shape ", msg::shape(t.sizes()));
  TORCH_CHECK(any_strides || t.size(dim - 1) <= 1 || t.stride(dim - 1) == 1, op, ": argument '", name,
              "' expected a contiguous last dimension (stride 1), got strides ", msg::shape(t.strides()));
  // A data pointer off its element size (a view of a numpy / DLPack / frombuffer buffer at an odd byte offset)
  // would make the kernel's element accesses misaligned: a fault on the GPU.
  const int64_t esz = static_cast<int64_t>(t.element_size());
  const int64_t off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) % static_cast<uintptr_t>(esz));
  TORCH_CHECK(t.numel() == 0 || off == 0, op, ": argument '", name,
              "' expected a data pointer aligned to its element size (", msg::num(esz), " bytes), got one ",
              msg::num(off), " bytes past");
}

// The modes of a call (see qwen3_tts_rope.cuh); none is the plain op.
struct Modes {
  c10::optional<at::Tensor> positions, q_weight, k_weight;
  bool eager = false;
  double eps = 0.0;
};

void check_modes(const char* op, const at::Tensor& q, const at::Tensor& cos, const Modes& m) {
  const int64_t B = q.size(0), S = q.size(2), D = q.size(3);
  if (m.positions) {
    const at::Tensor& pos = *m.positions;  // any strides: read one element per token
    TORCH_CHECK(pos.defined() && (pos.scalar_type() == at::kInt || pos.scalar_type() == at::kLong), op,
                ": argument 'positions' expected an int32 or int64 tensor");
    check_tensor(op, pos, "positions", pos.dim() == 1 ? 1 : 2, pos, true);
    TORCH_CHECK(pos.device() == q.device(), op, ": argument 'positions' expected a tensor on ", q.device(), ", got ",
                pos.device());
    TORCH_CHECK(pos.dim() == 2 ? pos.size(0) == B && pos.size(1) == S : pos.size(0) == S, op,
                ": argument 'positions' expected shape [", msg::num(B), ", ", msg::num(S), "] or [", msg::num(S),
                "], got ", msg::shape(pos.sizes()));
    TORCH_CHECK(cos.size(0) >= 1 && cos.size(1) == D, op, ": argument 'cos' expected a table [max_pos >= 1, ",
                msg::num(D), "], got ", msg::shape(cos.sizes()));
  }
  TORCH_CHECK(m.q_weight.has_value() == m.k_weight.has_value(), op,
              ": arguments 'q_weight' and 'k_weight' expected both or neither");
  for (const auto* w : {&m.q_weight, &m.k_weight}) {
    if (!*w) continue;
    const char* name = w == &m.q_weight ? "q_weight" : "k_weight";
    check_tensor(op, **w, name, 1, q);
    TORCH_CHECK((*w)->size(0) == D, op, ": argument '", name, "' expected shape [", msg::num(D), "], got ",
                msg::shape((*w)->sizes()));
  }
  TORCH_CHECK(m.eps >= 0.0, op, ": argument 'eps' expected a number >= 0");
}

void run(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
         const at::Tensor& q_out, const at::Tensor& k_out, bool pdl, const Modes& m = Modes{}) {
  TORCH_CHECK(q.defined() && q.is_cuda(), op, ": argument 'q' expected a CUDA tensor");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf, op,
              ": argument 'q' expected dtype bfloat16 or float16, got ", q.scalar_type());
  const bool table = m.positions.has_value();
  // An fp32 table is the one input in another dtype: checked against itself.
  const bool table_fp32 = table && cos.defined() && cos.scalar_type() == at::kFloat;
  check_tensor(op, q, "q", 4, q);
  check_tensor(op, k, "k", 4, q);
  check_tensor(op, cos, "cos", table ? 2 : 3, table_fp32 ? cos : q);
  check_tensor(op, sin, "sin", table ? 2 : 3, table_fp32 ? cos : q);
  check_tensor(op, q_out, "q_out", 4, q);
  check_tensor(op, k_out, "k_out", 4, q);
  TORCH_CHECK(cos.device() == q.device(), op, ": argument 'cos' expected a tensor on ", q.device(), ", got ",
              cos.device());

  const int64_t B = q.size(0), Hq = q.size(1), S = q.size(2), D = q.size(3), Hkv = k.size(1);
  TORCH_CHECK(D == 64 || D == 128 || D == 256, op, ": argument 'q' expected head_dim (last dim) 64, 128 or 256, got ",
              msg::num(D));
  TORCH_CHECK(k.size(0) == B && k.size(2) == S && k.size(3) == D, op, ": argument 'k' expected shape [", msg::num(B),
              ", Hkv, ", msg::num(S), ", ", msg::num(D), "], got ", msg::shape(k.sizes()));
  check_modes(op, q, cos, m);
  TORCH_CHECK(table || cos.size(0) == B || cos.size(0) == 1, op, ": argument 'cos' expected shape [", msg::num(B),
              " or 1, ", msg::num(S), ", ", msg::num(D), "], got ", msg::shape(cos.sizes()));
  TORCH_CHECK(table || (cos.size(1) == S && cos.size(2) == D), op, ": argument 'cos' expected shape [", msg::num(B),
              " or 1, ", msg::num(S), ", ", msg::num(D), "], got ", msg::shape(cos.sizes()));
  TORCH_CHECK(sin.sizes() == cos.sizes(), op, ": argument 'sin' expected shape ", msg::shape(cos.sizes()),
              " (same as 'cos'), got ", msg::shape(sin.sizes()));
  TORCH_CHECK(q_out.sizes() == q.sizes(), op, ": argument 'q_out' expected shape ", msg::shape(q.sizes()), ", got ",
              msg::shape(q_out.sizes()));
  TORCH_CHECK(k_out.sizes() == k.sizes(), op, ": argument 'k_out' expected shape ", msg::shape(k.sizes()), ", got ",
              msg::shape(k_out.sizes()));
  TORCH_CHECK(B * S <= INT32_MAX && Hq + Hkv <= (int64_t(1) << 30), op,
              ": expected B*S < 2^31 and Hq+Hkv <= 2^30, got B*S=", msg::num(B * S), ", Hq+Hkv=", msg::num(Hq + Hkv));
  if (B == 0 || S == 0 || Hq + Hkv == 0) return;

  fusedrope::TtsRopeParams p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.cos = cos.data_ptr();
  p.sin = sin.data_ptr();
  p.q_out = q_out.data_ptr();
  p.k_out = k_out.data_ptr();
  p.q_sb = q.stride(0), p.q_sh = q.stride(1), p.q_ss = q.stride(2);
  p.k_sb = k.stride(0), p.k_sh = k.stride(1), p.k_ss = k.stride(2);
  if (table) {  // rows of the tables: c_ss / s_ss
    p.c_ss = cos.stride(0), p.s_ss = sin.stride(0);
    const at::Tensor& pos = *m.positions;
    p.positions = pos.data_ptr();
    p.p_sb = pos.dim() == 2 ? pos.stride(0) : 0;  // [S] positions: the same for every batch
    p.p_ss = pos.stride(pos.dim() - 1);
    p.max_pos = cos.size(0);
    p.positions_int64 = pos.scalar_type() == at::kLong;
    p.table_fp32 = table_fp32;
  } else {
    p.c_sb = cos.size(0) == 1 ? 0 : cos.stride(0), p.c_ss = cos.stride(1);  // batch broadcast: stride 0
    p.s_sb = sin.size(0) == 1 ? 0 : sin.stride(0), p.s_ss = sin.stride(1);
  }
  if (m.q_weight) p.q_weight = m.q_weight->data_ptr(), p.k_weight = m.k_weight->data_ptr();
  p.eps = static_cast<float>(m.eps);
  p.eager = m.eager;
  p.qo_sb = q_out.stride(0), p.qo_sh = q_out.stride(1), p.qo_ss = q_out.stride(2);
  p.ko_sb = k_out.stride(0), p.ko_sh = k_out.stride(1), p.ko_ss = k_out.stride(2);
  p.B = B, p.S = S, p.Hq = Hq, p.Hkv = Hkv, p.D = D;

  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const auto dtype = q.scalar_type() == at::kBFloat16 ? fusedrope::TtsRopeDtype::kBFloat16
                                                      : fusedrope::TtsRopeDtype::kFloat16;
  const cudaError_t err = fusedrope::qwen3_tts_rope_launch(p, dtype, stream, pdl);
  const char* hint = err == cudaErrorInvalidValue ? " (arguments the kernel does not serve)"
                     : err == cudaErrorNotSupported ? " (pdl needs the kernel compiled for sm_90 or newer)"
                                                    : "";
  TORCH_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err), hint);
}

void qwen3_tts_rope_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                        at::Tensor& q_out, at::Tensor& k_out, const c10::optional<at::Tensor>& positions, bool eager,
                        const c10::optional<at::Tensor>& q_weight, const c10::optional<at::Tensor>& k_weight,
                        double eps, bool pdl) {
  run(kOp, q, k, cos, sin, q_out, k_out, pdl, Modes{positions, q_weight, k_weight, eager, eps});
}

// Allocating the outputs here rather than in Python saves two Python calls per call, a large part of the
// host cost of the small, launch-bound Qwen3-TTS shapes.
std::tuple<at::Tensor, at::Tensor> qwen3_tts_rope_new(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                      const at::Tensor& sin) {
  TORCH_CHECK(q.defined() && k.defined(), kOpNew, ": arguments 'q' and 'k' must be defined tensors");
  at::Tensor q_out = at::empty(q.sizes(), q.options());  // contiguous
  at::Tensor k_out = at::empty(k.sizes(), k.options());
  run(kOpNew, q, k, cos, sin, q_out, k_out, false);
  return {q_out, k_out};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedrope_cuda, m) {
  m.def(
      "qwen3_tts_rope_out(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor(a!) q_out, Tensor(b!) k_out, "
      "Tensor? positions=None, bool eager=False, Tensor? q_weight=None, Tensor? k_weight=None, float eps=0.0, "
      "bool pdl=False) -> ()");
  m.def("qwen3_tts_rope(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(fusedrope_cuda, CUDA, m) {
  m.impl("qwen3_tts_rope_out", &qwen3_tts_rope_out);
  m.impl("qwen3_tts_rope", &qwen3_tts_rope_new);
}
