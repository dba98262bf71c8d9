"""inverse_rope_group_quant on the hand-written HIP kernel (kernels_hip/inverse_rope_group_quant.hip), AMD only.
Opt-in (``backend="hip"``) until it has run on AMD hardware.

Serves gfx942 (MI300, FP8 = float8_e4m3fnuz in hardware) and gfx950 (MI350/MI355, FP8 = OCP float8_e4m3fn in
hardware), in the envelope the CUDA kernels serve (:func:`.cuda.envelope_reason`), every layout included (a
generic and a tiled kernel, as for CUDA). Other shapes, the non-native fp8 format of an arch and packed int32
UE8M0 scales go to Triton. Pointer alignment is decided inside the compiled op.
"""

from __future__ import annotations

from typing import Optional

import torch

from .._device import HIP_ARCHS, arch_fp8_dtype, gpu_arch
from .._validation import dtype_name
from .cuda import CompiledOp, envelope_reason


def supports(facts, arch: Optional[str] = None) -> Optional[str]:
    """The HIP kernel on facts.device (or a GPU of ``arch``, e.g. "gfx942")."""
    arch = arch or gpu_arch(facts.device)
    if arch not in HIP_ARCHS:
        return f"hip kernel runs on {'/'.join(HIP_ARCHS)}, this device is {arch or facts.device}"
    native = arch_fp8_dtype(arch)
    reason = envelope_reason("hip kernel", facts)
    if reason is None and facts.fp8_dtype != native:
        return (f"hip kernel writes {dtype_name(native)} on {arch} (its hardware fp8 format), "
                f"got fp8_dtype={dtype_name(facts.fp8_dtype)} (Triton serves it)")
    return reason


def available(device: torch.device) -> Optional[str]:
    """Asked for ROCm devices (the registry asks ``hip_toolkit_reason`` first): builds or loads the extension."""
    from .. import hip_ext

    return hip_ext.available(device)


def load() -> tuple:
    """The backend's ``(run, None)``, once the extension is loaded."""
    from .. import hip_ext

    hip_ext.load()
    return CompiledOp(torch.ops.fusedrope_hip.inverse_rope_group_quant_out.default), None
