// Host emulation stand-in for <cuda_runtime_api.h>: see cuda_emul.h.
#pragma once
#include "cuda_emul.h"
