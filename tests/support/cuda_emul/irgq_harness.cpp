// C entry points around the inverse_rope_group_quant CUDA source run in lockstep host emulation (cuda_emul.h,
// ../lockstep.h), for ctypes (tests/inverse_rope_group_quant/irgq_harness.py: cuda_harness()). The kernel and its
// launcher are the
// repository's own code, unchanged.
// Build: g++ -std=c++20 -O1 -shared -fPIC -pthread -ffp-contract=off -I tests -I tests/support/cuda_emul -x c++
//        tests/support/cuda_emul/irgq_harness.cpp -DKERNEL_SOURCE='"/abs/kernels_cuda/inverse_rope_group_quant.cu"'
#define CUDA_EMUL_LOCKSTEP 1
#include "cuda_emul.h"
#include KERNEL_SOURCE

#include "irgq_params.h"

extern "C" {

// The launcher on the CPU (ptrs and ints as for irgq_test::params_from); returns its status code.
int irgq_host_run(void** ptrs, const long long* ints) {
  int cuda_error = 0;
  return fusedrope::irgq::launch(irgq_test::params_from(ptrs, ints), nullptr, &cuda_error);
}

#include "emul_stats.inc"

// Whether the last launch was a programmatic dependent launch (cudaLaunchKernelEx with the attribute set).
int emul_last_pdl() { return emu_last_pdl; }

// The PTX version of the kernel images the emulated device runs (90: sm_90; below 90: no griddepcontrol wait).
void emul_set_ptx_version(int ptx_version) { emu_ptx_version = ptx_version; }

// The emulated runtime's last error: set it (a caller's error pending before a launch), read it without clearing.
void emul_set_last_error(int e) { emu_last_error = static_cast<cudaError_t>(e); }
int emul_peek_last_error() { return emu_last_error; }

// __nv_cvt_float2_to_fp8x2 calls made through the model since the last call (builds with
// -DFUSEDROPE_IRGQ_HW_E4M3=1); -1 when a call used another saturation mode or format.
long long emul_hw_cvts() {
  if (emu_fp8x2_misuse.exchange(0)) return -1;
  return emu_fp8x2_cvts.exchange(0);
}
}
