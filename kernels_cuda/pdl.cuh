// Programmatic dependent launch (PDL, sm_90+), shared by the CUDA kernels: the device side (wait for the stream's
// previous kernel, let the next one launch) and the host side (the launch with the attribute).
#pragma once

#include <cuda_runtime.h>

namespace fusedrope {

// Wait for the stream's previous kernel (its writes visible): before a kernel's first global load. A no-op in a
// kernel launched without the attribute, and absent before sm_90.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Let the stream's next kernel begin launching (its own wait still covers this kernel's completion).
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// `kernel` on `stream` as a programmatic dependent launch, its arguments by value. A kernel image without the
// wait (built for an older arch, JIT-compiled from its PTX) would read before the previous kernel's writes are
// visible: cudaErrorNotSupported for it, nothing launched. cudaLaunchKernelEx, not <<<>>>: plain C++, so the host
// emulation (tests/support/cuda_emul) compiles it.
template <typename... E, typename... A>
cudaError_t launch_pdl(void (*kernel)(E...), dim3 grid, dim3 block, cudaStream_t stream, A&&... args) {
  cudaFuncAttributes fa;
  const cudaError_t fe = cudaFuncGetAttributes(&fa, kernel);
  if (fe != cudaSuccess) return fe;
  if (fa.ptxVersion < 90) return cudaErrorNotSupported;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<A&&>(args)...);
}

}  // namespace fusedrope
