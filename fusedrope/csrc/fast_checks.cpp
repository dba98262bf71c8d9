// Both ops' plain calls checked and their outputs allocated, compiled: the host cost of a call is mostly reading
// four tensors' shapes, strides, dtypes and devices, which from Python costs more than allocating the outputs.
// Each function returns (selection key: the op's Facts, passed first; new outputs) when the arguments pass every check the Python validation
// makes (the `validate` functions of fusedrope/qwen3_tts_rope and fusedrope/inverse_rope_group_quant) and there is
// work to do, and None for anything else, valid or not: the Python path then runs and names what is wrong. So
// None is always safe; accepting is the claim tests/test_fast_checks.py holds against the Python validation.
// `tts_facts` is op 1's only fast accept path, for every call (it allocates nothing). `readable` is
// _validation.readable, which op 2's one-expression check calls, at the cost of a call.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

// Tensors whose memory does not hold their values, which a kernel reading the data pointer would get wrong
// (_validation.unreadable says why): negative and conjugate views, ZeroTensors, functional and torch.func
// wrappers (no storage); and dual tensors (forward-mode AD), whose tangent it would drop.
constexpr c10::DispatchKeySet unreadable_ks =
    c10::DispatchKeySet({c10::DispatchKey::Negative, c10::DispatchKey::Conjugate, c10::DispatchKey::ZeroTensor,
                         c10::DispatchKey::Functionalize}) |
    c10::functorch_transforms_ks;

bool readable(const at::Tensor& t) { return !t.key_set().has_any(unreadable_ks) && !t._fw_grad(0).defined(); }

// A dense, readable torch.Tensor or nn.Parameter (THPVariable_CheckExact; no other subclass, no Python-key
// wrapper) on a device with data (not meta), outside a TorchFunctionMode (which would see the Python path's
// allocations). A Parameter gets the Python path's key too (op 2's exact-type expression refuses it, but
// _validate_all accepts it, as op 1's diagnose does).
const at::Tensor* plain(PyObject* obj) {
  if (!THPVariable_CheckExact(obj) || at::impl::torch_function_mode_enabled()) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (t.layout() != at::kStrided || t.is_nested() || t.is_meta() || t.key_set().has_any(c10::python_ks) ||
      !readable(t))
    return nullptr;
  return &t;
}

// readable(*tensors): True when each is None or a readable tensor (_validation.readable, the Python path's).
PyObject* readable_all(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  for (Py_ssize_t i = 0; i < nargs; ++i)
    if (args[i] != Py_None && !(THPVariable_Check(args[i]) && readable(THPVariable_Unpack(args[i]))))
      Py_RETURN_FALSE;
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

bool one_of(at::ScalarType t, std::initializer_list<at::ScalarType> types) {
  for (auto u : types)
    if (t == u) return true;
  return false;
}

PyObject* item(PyObject* obj) {  // a new reference to obj
  Py_INCREF(obj);
  return obj;
}

PyObject* dtype_object(at::ScalarType t) { return item(reinterpret_cast<PyObject*>(torch::getTHPDtype(t))); }

// A tuple of new references, which it takes over (or releases, and returns null, when one is null).
PyObject* tuple(std::initializer_list<PyObject*> items) {
  PyObject* t = nullptr;
  for (PyObject* i : items)
    if (!i) goto fail;
  if ((t = PyTuple_New(static_cast<Py_ssize_t>(items.size())))) {
    Py_ssize_t n = 0;
    for (PyObject* i : items) PyTuple_SET_ITEM(t, n++, i);
    return t;
  }
fail:
  for (PyObject* i : items) Py_XDECREF(i);
  return nullptr;
}

// The op's Facts (a NamedTuple class, passed first) of these items, as tuple.__new__(Facts, items) makes it
// (without the Python-level __new__); null, and the items released, when one is null.
PyObject* facts(PyObject* type, std::initializer_list<PyObject*> items) {
  PyObject* values = tuple(items);
  PyObject* args = values ? PyTuple_Pack(1, values) : nullptr;
  PyObject* key = args ? PyTuple_Type.tp_new(reinterpret_cast<PyTypeObject*>(type), args, nullptr) : nullptr;
  Py_XDECREF(args);
  Py_XDECREF(values);
  return key;
}

bool facts_type(PyObject* type) {
  return PyType_Check(type) && PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type), &PyTuple_Type);
}

// qwen3_tts_rope's rule for q, k and cos/sin rows (diagnose's, the readable checker's): shapes, dtypes,
// devices and unit last strides; cos/sin [B or 1, S, D] in q's dtype, or with positions tables [max_pos, D] in
// q's dtype or fp32.
bool tts_tensors_ok(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                    bool table) {
  if (q.dim() != 4 || k.dim() != 4 || cos.dim() != (table ? 2 : 3) || sin.sizes() != cos.sizes()) return false;
  const int64_t B = q.size(0), S = q.size(2), D = q.size(3);
  const auto dt = q.scalar_type(), c_dt = cos.scalar_type();
  const auto dev = q.device();
  const bool rows = table ? cos.size(0) > 0 && cos.size(1) == D && (c_dt == dt || c_dt == at::kFloat)
                          : c_dt == dt && cos.size(1) == S && cos.size(2) == D &&
                                (cos.size(0) == B || cos.size(0) == 1);
  return rows && k.size(0) == B && k.size(2) == S && k.size(3) == D && D % 2 == 0 && D > 0 &&
         one_of(dt, {at::kBFloat16, at::kHalf, at::kFloat}) && k.scalar_type() == dt &&
         sin.scalar_type() == c_dt && k.device() == dev && cos.device() == dev && sin.device() == dev &&
         q.stride(3) == 1 && k.stride(3) == 1 && cos.stride(-1) == 1 && sin.stride(-1) == 1;
}

// qwen3_tts_rope(Facts, q, k, cos, sin): (Facts(device, dtype, D, False, ...), q_out, k_out) or None.
PyObject* qwen3_tts_rope(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 5 || !facts_type(argv[0])) Py_RETURN_NONE;
  PyObject* const* args = argv + 1;
  const at::Tensor *q = plain(args[0]), *k = plain(args[1]), *cos = plain(args[2]), *sin = plain(args[3]);
  if (!q || !k || !cos || !sin || !tts_tensors_ok(*q, *k, *cos, *sin, false) ||
      (c10::GradMode::is_enabled() &&
       (q->requires_grad() || k->requires_grad() || cos->requires_grad() || sin->requires_grad())) ||
      (q->numel() == 0 && k->numel() == 0))
    Py_RETURN_NONE;
  auto q_out = at::empty_like(*q, at::TensorOptions(), at::MemoryFormat::Contiguous);
  auto k_out = at::empty_like(*k, at::TensorOptions(), at::MemoryFormat::Contiguous);
  return tuple({facts(argv[0], {THPDevice_New(q->device()), dtype_object(q->scalar_type()),
                                PyLong_FromLongLong(q->size(3)), item(Py_False), item(Py_False), item(Py_False),
                                item(Py_False), item(Py_False), item(Py_False)}),
                THPVariable_Wrap(std::move(q_out)), THPVariable_Wrap(std::move(k_out))});
  END_HANDLE_TH_ERRORS
}

// A number >= 0 of exact type float or int (not bool), as eps must be.
bool eps_ok(PyObject* eps) {
  if (PyFloat_CheckExact(eps)) return PyFloat_AS_DOUBLE(eps) >= 0;
  if (!PyLong_CheckExact(eps)) return false;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(eps, &overflow);
  if (v == -1 && !overflow && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return overflow > 0 || (!overflow && v >= 0);
}

// tts_facts(Facts, q, k, cos, sin, inplace, positions, numerics, q_norm_weight, k_norm_weight, eps, enable_pdl):
// the selection key of any call of either op-1 function whose inputs pass every check (inplace: True or False,
// the in-place checks left to Python), or None. Allocates nothing.
PyObject* tts_facts(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 12 || !facts_type(argv[0])) Py_RETURN_NONE;
  PyObject *inplace = argv[5], *positions = argv[6], *numerics = argv[7], *qw = argv[8], *kw = argv[9],
           *eps = argv[10], *pdl = argv[11];
  const at::Tensor *q = plain(argv[1]), *k = plain(argv[2]), *cos = plain(argv[3]), *sin = plain(argv[4]);
  const bool table = positions != Py_None, norm = qw != Py_None;
  if (!q || !k || !cos || !sin || (inplace != Py_True && inplace != Py_False) || !PyUnicode_CheckExact(numerics) ||
      (pdl != Py_None && pdl != Py_True && pdl != Py_False) || !tts_tensors_ok(*q, *k, *cos, *sin, table))
    Py_RETURN_NONE;
  const bool eager = PyUnicode_CompareWithASCIIString(numerics, "eager") == 0;
  if (!eager && PyUnicode_CompareWithASCIIString(numerics, "fp32") != 0) Py_RETURN_NONE;
  const int64_t B = q->size(0), S = q->size(2), D = q->size(3);
  if (table) {
    const at::Tensor* p = plain(positions);
    if (!p || !one_of(p->scalar_type(), {at::kLong, at::kInt}) || p->device() != q->device() ||
        !(p->sizes() == at::IntArrayRef({B, S}) || p->sizes() == at::IntArrayRef({S})))
      Py_RETURN_NONE;
  }
  if (norm) {
    for (PyObject* obj : {qw, kw}) {
      const at::Tensor* w = plain(obj);
      if (!w || w->dim() != 1 || w->size(0) != D || w->scalar_type() != q->scalar_type() ||
          w->device() != q->device() || w->stride(0) != 1)
        Py_RETURN_NONE;
    }
    if (!eps_ok(eps)) Py_RETURN_NONE;
  }
  return facts(argv[0], {THPDevice_New(q->device()), dtype_object(q->scalar_type()), PyLong_FromLongLong(D),
                         item(inplace), item(eager ? Py_True : Py_False), item(table ? Py_True : Py_False),
                         item(norm ? Py_True : Py_False), item(pdl == Py_True ? Py_True : Py_False),
                         item(Py_False)});  // mrope: multimodal calls take diagnose
  END_HANDLE_TH_ERRORS
}

// A Python int's value in out; false for anything else (bool included, as `type(x) is int`) or one too large.
bool int_arg(PyObject* obj, int64_t& out) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  out = PyLong_AsLongLongAndOverflow(obj, &overflow);
  return !overflow && !(out == -1 && PyErr_Occurred());
}

// The cos||sin mistake check (_refuse_one_cache) for rows of one stride: true when no row of sin meets a row of
// cos. Other layouts return false and take the Python check.
bool caches_apart(const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t max_pos = cos.size(0), size = cos.element_size(), row = cos.size(1) * size;
  const int64_t gap = reinterpret_cast<int64_t>(sin.data_ptr()) - reinterpret_cast<int64_t>(cos.data_ptr());
  if (max_pos == 1) return std::llabs(gap) >= row;
  int64_t st = 0;  // a size-1 dim may carry any stride: only past max_pos == 1 is it a real row stride
  if (cos.stride(0) != sin.stride(0) || __builtin_mul_overflow(cos.stride(0), size, &st) || st < row) return false;
  const int64_t k = gap >= 0 ? gap / st : -((-gap + st - 1) / st);  // floor division, as Python's //
  for (int64_t i = k; i <= k + 1; ++i)
    if (-max_pos < i && i < max_pos && std::llabs(gap - i * st) < row) return false;
  return true;
}

// inverse_rope_group_quant(Facts, o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
// transpose_scale) with no buffers and the other arguments at their defaults: (Facts(...), x_fp8, x_scale) or None.
PyObject* inverse_rope_group_quant(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 8 || !facts_type(argv[0])) Py_RETURN_NONE;
  PyObject* const* args = argv + 1;
  const at::Tensor *o = plain(args[0]), *pos = plain(args[1]), *cos = plain(args[2]), *sin = plain(args[3]);
  int64_t groups = 0, group_size = 0;
  PyObject* transpose = args[6];
  if (!o || !pos || !cos || !sin || !int_arg(args[4], groups) || !int_arg(args[5], group_size) ||
      (transpose != Py_True && transpose != Py_False) || o->dim() != 3 || pos->dim() != 1 || cos->dim() != 2 ||
      sin->dim() != 2 || args[2] == args[3])
    Py_RETURN_NONE;
  const int64_t S = o->size(0), D = o->size(2), max_pos = cos->size(0), half = cos->size(1);
  int64_t row = 0;
  if (__builtin_mul_overflow(o->size(1), D, &row)) Py_RETURN_NONE;
  const auto dev = o->device();
  const bool ok =
      groups > 0 && row % groups == 0 &&
      (group_size == 32 || group_size == 64 || group_size == 128 || group_size == 256) &&
      (row / groups) % group_size == 0 &&
      one_of(o->scalar_type(), {at::kBFloat16, at::kHalf}) && D % 2 == 0 && o->is_contiguous() &&
      one_of(pos->scalar_type(), {at::kLong, at::kInt}) && pos->size(0) >= S &&
      one_of(cos->scalar_type(), {at::kBFloat16, at::kHalf, at::kFloat}) &&
      sin->scalar_type() == cos->scalar_type() && sin->sizes() == cos->sizes() && cos->stride(1) == 1 &&
      sin->stride(1) == 1 && max_pos >= 1 && half >= 1 && 2 * half <= D && pos->device() == dev &&
      cos->device() == dev && sin->device() == dev &&
      !(c10::GradMode::is_enabled() && (o->requires_grad() || cos->requires_grad() || sin->requires_grad())) &&
      caches_apart(*cos, *sin);
  if (!ok || o->numel() == 0) Py_RETURN_NONE;
  const int64_t G = groups, dg = row / groups, ks = dg / group_size;
  const bool col = transpose == Py_True;
  auto x = at::empty({S, G, dg}, o->options().dtype(at::kFloat8_e4m3fn));
  auto scale_options = o->options().dtype(at::kFloat8_e8m0fnu);  // "col": storage [G, Ks, S] seen as [S, G, Ks]
  auto scale =
      col ? at::empty_strided({S, G, ks}, {1, ks * S, S}, scale_options) : at::empty({S, G, ks}, scale_options);
  static PyObject *row_name = nullptr, *col_name = nullptr, *ue8m0_name = nullptr;  // made once; a failure retries
  if ((!row_name && !(row_name = PyUnicode_InternFromString("row"))) ||
      (!col_name && !(col_name = PyUnicode_InternFromString("col"))) ||
      (!ue8m0_name && !(ue8m0_name = PyUnicode_InternFromString("ue8m0"))))
    return nullptr;
  PyObject* key = facts(argv[0],
      {THPDevice_New(dev), dtype_object(o->scalar_type()), PyLong_FromLongLong(D), PyLong_FromLongLong(2 * half),
      PyLong_FromLongLong(group_size), dtype_object(cos->scalar_type()), dtype_object(pos->scalar_type()),
      dtype_object(at::kFloat8_e4m3fn), dtype_object(at::kFloat8_e8m0fnu), item(col ? col_name : row_name),
      item(Py_True), item(Py_True), item(Py_False), item(Py_False), item(ue8m0_name)});
  return tuple({key, THPVariable_Wrap(std::move(x)), THPVariable_Wrap(std::move(scale))});
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"qwen3_tts_rope", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(qwen3_tts_rope)), METH_FASTCALL,
     "(Facts, q, k, cos, sin) -> (selection key, q_out, k_out) of a plain call, or None"},
    {"tts_facts", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(tts_facts)), METH_FASTCALL,
     "(Facts, q, k, cos, sin, inplace, *modes) -> the selection key of a valid op-1 call, or None"},
    {"inverse_rope_group_quant",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(inverse_rope_group_quant)), METH_FASTCALL,
     "(Facts, o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale) -> (selection key, "
     "x_fp8, x_scale) of a plain call, or None"},
    {"readable", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(readable_all)), METH_FASTCALL,
     "(*tensors) -> True when each is None or a tensor whose memory holds its values, without a tangent"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "fast_checks", nullptr, -1, methods};

}  // namespace

#define FUSEDROPE_CONCAT(a, b) a##b
#define FUSEDROPE_INIT(name) FUSEDROPE_CONCAT(PyInit_, name)
PyMODINIT_FUNC FUSEDROPE_INIT(TORCH_EXTENSION_NAME)() { return PyModule_Create(&module); }
