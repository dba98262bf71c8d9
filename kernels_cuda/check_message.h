// Numbers and shapes for TORCH_CHECK messages, formatted with std::to_string rather than streamed.
//
// Why: on an H200 machine (torch 2.11.0+cu130) a TORCH_CHECK of this extension that streamed an int64 crashed
// the process inside std::basic_ostream::_M_insert<long> (the run is in docs/benchmarks.md), while messages of
// strings, dtypes and devices raised cleanly; the cause is not known. std::to_string does not go through a
// stream or its locale, and c10::str then only inserts strings. Torch only: the CUDA and HIP bindings use it.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace fusedrope {
namespace msg {

inline std::string num(int64_t v) { return std::to_string(v); }

inline std::string shape(c10::IntArrayRef a) {  // "[2, 4, 3, 96]", as torch prints sizes and strides
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}

}  // namespace msg
}  // namespace fusedrope
