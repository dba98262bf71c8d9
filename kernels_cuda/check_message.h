// Numbers and shapes for TORCH_CHECK messages, formatted with std::to_string rather than streamed.
//
// Why: on the H200 test machine (torch 2.11.0+cu130, CUDA 13.0, the extension built there) a TORCH_CHECK of
// this extension that streamed an int64 segfaulted the process inside std::basic_ostream::_M_insert<long>
// (cuda-gdb backtrace at the end of bench/results/nvidia-h200-gpu-checks-63f6bd6/log.txt), while messages of
// strings, dtypes and devices raised cleanly. The same source with the same torch raises cleanly on the CPU VM;
// the cause on that machine is not known. std::to_string does not go through a stream or its locale, and
// c10::str then only inserts strings. Torch only, no vendor header: the CUDA and HIP bindings both use it.
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
