"""qwen3_tts_rope on the hand-written CUDA kernel (kernels_cuda/qwen3_tts_rope.cu).

Serves bf16 and fp16 with head_dim 64, 128 or 256, with every mode: ``numerics="eager"``, ``positions=`` (tables
in q's dtype or fp32) and the q/k norm. The kernel itself picks 16-byte vector accesses when every pointer and
leading stride allows them, and a narrower path otherwise (alignment is a run-time fact, so it is decided inside
the compiled op, not here). The extension is loaded on first use (``fusedrope.cuda_ext``).
"""

from __future__ import annotations

from typing import Optional

import torch

from .._device import gpu_arch, sm_number
from .._validation import dtype_name

DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128, 256)
# The modes run kernels of their own, opt-in (docs/status.md).
MODES_OPT_IN = ("the eager, positions= and norm kernels have not run on a GPU "
                "(kernels_cuda/README.md: what decides them)")


def supports(facts) -> Optional[str]:
    if facts.mrope:
        return "cuda kernel reads one cos/sin row per token, got mrope_section= (Triton serves it)"
    if facts.dtype not in DTYPES or facts.head_dim not in HEAD_DIMS:
        return (f"cuda kernel serves bfloat16/float16 with D in {HEAD_DIMS}, got {dtype_name(facts.dtype)} "
                f"D={facts.head_dim}")
    if facts.pdl and sm_number(arch := gpu_arch(facts.device)) < 90:
        return f"cuda kernel launches with enable_pdl=True on sm_90 or newer, this device is {arch or facts.device}"
    return None


def opt_in(facts) -> Optional[str]:  # enable_pdl=True alone is the caller's own opt-in, as in the other op
    return MODES_OPT_IN if facts.eager or facts.table or facts.norm else None


def available(device: torch.device) -> Optional[str]:
    """Asked for CUDA devices (the registry asks ``cuda_toolkit_reason`` first): builds or loads the extension."""
    from .. import cuda_ext

    return cuda_ext.available(device)


def load() -> tuple:
    """The backend's ``(run, run_alloc)``: the compiled ops ``qwen3_tts_rope_out(q, k, cos, sin, q_out, k_out,
    positions=None, eager=False, q_weight=None, k_weight=None, eps=0.0, pdl=False)``, which writes the outputs
    (``q``/``k`` themselves for in place) in one launch, and ``qwen3_tts_rope(q, k, cos, sin) -> (q_out, k_out)``, which
    allocates them in C++ (one Python -> C++ call fewer per output)."""
    from .. import cuda_ext

    cuda_ext.load()
    ops = torch.ops.fusedrope_cuda
    return ops.qwen3_tts_rope_out.default, ops.qwen3_tts_rope.default
