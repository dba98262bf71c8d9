"""What a device of this machine is and can run: its GPU architecture and native fp8 format, and whether the
Triton, CUDA and HIP backends can run there at all (the per-op ``supports`` checks live beside each op)."""

from __future__ import annotations

import torch

from .registry import Reason


def triton_interpreting() -> bool:
    """True when fusedrope's Triton kernels were compiled for the CPU interpreter (TRITON_INTERPRET=1)."""
    from . import _triton

    return _triton.INTERPRETED


def triton_available(device: torch.device) -> Reason:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not importable ({e})"
    if device.type == "cuda":  # NVIDIA and AMD (ROCm torch reports 'cuda' too)
        return None
    if device.type == "cpu":
        if triton_interpreting():
            from ._triton import interpreter_defect

            return interpreter_defect()
        return ("Triton runs CPU tensors only in its interpreter: set TRITON_INTERPRET=1 before the process's "
                "first fusedrope call or explain() on a CPU tensor (Triton fixes interpreter mode when fusedrope "
                "defines its kernels, at that first check)")
    return f"Triton does not run on device type '{device.type}'"


def gpu_arch(device: torch.device) -> str:
    """'sm_90', 'gfx942', ... for a GPU device; '' otherwise."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return ""
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def sm_number(arch: str) -> int:
    """An NVIDIA arch's compute capability as one number ('sm_90' -> 90, 'sm_100' -> 100); 0 for any other."""
    return int(arch[3:]) if arch.startswith("sm_") else 0


# The fp8 format the ops should write on each GPU, the one its FP8 GEMMs read: float8_e4m3fnuz on gfx942 (MI300),
# OCP float8_e4m3fn on gfx950 (MI350/MI355) and NVIDIA (converted in hardware from sm_89 on); every other device
# gets e4m3fn, the ops' default.
NATIVE_FP8 = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}
HIP_ARCHS = tuple(NATIVE_FP8)  # what the HIP kernels are written for (their fp8 instructions)


def arch_fp8_dtype(arch: str) -> torch.dtype:
    """The fp8 dtype ``arch`` ('sm_90', 'gfx942', '' for no GPU) writes natively (see NATIVE_FP8)."""
    return NATIVE_FP8.get(arch, torch.float8_e4m3fn)


def native_fp8_dtype(device: torch.device) -> torch.dtype:
    """The fp8 dtype ``device`` writes natively: float8_e4m3fnuz on gfx942, float8_e4m3fn everywhere else."""
    return arch_fp8_dtype(gpu_arch(device))


def cuda_toolkit_reason(device: torch.device) -> Reason:
    """Why compiled CUDA kernels cannot run on this device, or None when they can."""
    if device.type != "cuda":
        return f"compiled CUDA kernels need a CUDA device, got a tensor on '{device.type}'"
    if not torch.version.cuda:
        return "this torch build has no CUDA (torch.version.cuda is None)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    return None


def hip_toolkit_reason(device: torch.device) -> Reason:
    if device.type != "cuda":
        return f"compiled HIP kernels need a ROCm device, got a tensor on '{device.type}'"
    if not torch.version.hip:
        return "this torch build has no ROCm (torch.version.hip is None)"
    if not torch.cuda.is_available():
        return "no ROCm device is visible to torch"
    return None

