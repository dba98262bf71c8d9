// C entry points around the HIP kernel source run under the wave emulator (hip_emul.h), for ctypes
// (tests/inverse_rope_group_quant/irgq_harness.py: hip_harness()). The kernel and its launcher are the repository's
// own code, unchanged;
// only hipLaunchKernel is provided here.
// Build: clang++ -std=c++20 -O1 -shared -fPIC -pthread -ffp-contract=off -I tests -I tests/support/hip_emul -I
// kernels_cuda
//        tests/support/hip_emul/harness.cpp -DKERNEL_SOURCE='"/abs/kernels_hip/inverse_rope_group_quant.hip"'
#include "hip_emul.h"

#define FUSEDROPE_HIP_NO_RUNTIME_HEADERS 1
#include KERNEL_SOURCE

#include "irgq_params.h"

extern "C" hipError_t hipLaunchKernel(const void* function_address, dim3 numBlocks, dim3 dimBlocks, void** args,
                                      unsigned long sharedMemBytes, hipStream_t stream) {
  (void)sharedMemBytes;
  (void)stream;
  if (numBlocks.y != 1 || numBlocks.z != 1 || dimBlocks.y != 1 || dimBlocks.z != 1 || dimBlocks.x % 64 != 0 ||
      dimBlocks.x > 1024 || numBlocks.x == 0)
    return 1;  // the kernel is written for a 1-D grid of whole wave64 blocks
  using Kernel = void (*)(fusedrope::irgq::KArgs);
  const Kernel kernel = reinterpret_cast<Kernel>(const_cast<void*>(function_address));
  const fusedrope::irgq::KArgs a = *static_cast<const fusedrope::irgq::KArgs*>(args[0]);
  lockstep::run(numBlocks.x, dimBlocks.x, [&] { kernel(a); });
  return hipSuccess;
}

extern "C" hipError_t hipGetLastError(void) { return hipSuccess; }

extern "C" {

// The launcher on the CPU (ptrs and ints as for irgq_test::params_from); returns its status code.
int irgq_host_run(void** ptrs, const long long* ints) {
  const fusedrope::irgq::Params p = irgq_test::params_from(ptrs, ints);
  int hip_error = 0;
  return fusedrope_hip::launch_inverse_rope_group_quant(p, nullptr, &hip_error);
}

#include "emul_stats.inc"

// v_cvt_pk_fp8_f32 calls made through the model (builds with -DHIP_EMUL_GFX) since the last call; resets.
long long emul_hw_cvts() { return hip_emul::hw_cvts.exchange(0); }
}
