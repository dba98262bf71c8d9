// Host emulation stand-in for <cuda_fp8.h>: see cuda_emul.h. The emulated kernels take their software fp8 paths
// (no __CUDA_ARCH__), so nothing of it is needed.
#pragma once
#include "cuda_emul.h"
