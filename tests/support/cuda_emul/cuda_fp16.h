// Host emulation stand-in for <cuda_fp16.h>: see cuda_emul.h.
#pragma once
#include "cuda_emul.h"
