// Host emulation stand-in for <cuda_bf16.h>: see cuda_emul.h.
#pragma once
#include "cuda_emul.h"
