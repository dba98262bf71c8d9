"""The inverse_rope_group_quant kernels (kernels_cuda/...cu, kernels_hip/...hip, each with its launcher) in lockstep
host emulation (tests/inverse_rope_group_quant/irgq_harness.py) as registry backends on CPU tensors, so that the
contract suite runs them as it runs every backend (tests/conftest.py registers one for the tests that name it):
``cuda_emulated`` (the generic kernel), ``cuda_head_emulated`` (the head kernel), both with sm_90's hardware fp8
path modelled, and ``hip_emulated`` (gfx950's). Each is the real backend's glue (``CompiledOp``, ``supports``)
around the emulated launcher in place of the compiled torch op."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "inverse_rope_group_quant"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import irgq_harness as H  # noqa: E402

# name -> (emulator vendor, kernel, the GPU arch whose support it has)
BACKENDS = {"cuda_emulated": ("cuda-sm90", 0, "sm_90"), "cuda_head_emulated": ("cuda-sm90", 1, "sm_90"),
            "hip_emulated": ("hip-gfx950", 0, "gfx950")}
_LIBS: dict = {}


def _op(vendor: str):
    """The emulated launcher called as the torch binding is: ``(o, positions, cos, sin, x_fp8, x_scale, q, mfma,
    pdl, kernel)``, raising where the binding would (a status other than kOk, a divergent cross-lane read)."""
    def op(o, positions, cos, sin, x_fp8, x_scale, q, mfma, pdl, kernel):
        lib = _LIBS.get(vendor) or _LIBS.setdefault(vendor, H.emulated_kernel(vendor))
        lib.emul_reset()
        rc = H.emulate(lib, o, positions, cos, sin, x_fp8, x_scale, q, scale_layout="mfma_tile" if mfma else "row",
                       pdl=pdl, kernel=kernel)
        if rc != 0:
            raise RuntimeError(f"{vendor} emulation: the launcher returned {rc}")
        if (st := H.emul_stats(lib))["errors"]:
            raise AssertionError(f"{vendor} emulation: {st['first_error']}")
    return op


def backend(name: str):
    """The registry backend ``name`` (one of :data:`BACKENDS`): opt-in, so auto never takes it."""
    from fusedrope.inverse_rope_group_quant import cuda, hip
    from fusedrope.registry import Backend

    vendor, kernel, arch = BACKENDS[name]
    glue = hip.supports if vendor.startswith("hip") else cuda.head_supports if kernel else cuda.supports

    def supports(facts):
        return "runs on CPU tensors" if facts.device.type != "cpu" else glue(facts, arch)

    return Backend(name, cuda.CompiledOp(_op(vendor), kernel), supports=supports,
                   opt_in=lambda facts: "a test-only emulation")
