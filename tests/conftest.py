"""Tests run on the GPU when torch sees one (every backend compiled), else on CPU, where Triton kernels run in
its interpreter: that must be switched on before any kernel module is imported."""

import importlib
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import fusedrope  # noqa: E402
from fusedrope._device import triton_interpreting  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


# Test-only backends: the hand-written kernels' sources run on CPU tensors in host emulation (tests/support), named
# like any backend in the contract suite's parameters and registered only for the tests that name them.
EMULATED = {"qwen3_tts_rope": "tts_emulator", "inverse_rope_group_quant": "irgq_emulator"}  # op -> its module


def backends_here(op: str) -> list:
    """Backends that can run on DEVICE of this machine, as pytest params (the others skip with the reason); on a
    CPU, the op's emulated kernels too (their build skips, saying why, where the host has no compiler for them)."""
    reg = fusedrope.registry(op)
    out = []
    for b in reg.backends:
        reason = reg.availability(b, DEVICE)
        marks = [pytest.mark.skip(reason=f"{b.name}: {reason}")] if reason else []
        out.append(pytest.param(b.name, marks=marks, id=b.name))
    if DEVICE.type == "cpu" and op in EMULATED:
        out += [pytest.param(name, id=name) for name in importlib.import_module(EMULATED[op]).BACKENDS]
    return out


@pytest.fixture(autouse=True)
def _emulated_backend(request):
    """Register the emulated backend a test's ``backend`` parameter names, for that test only."""
    name = getattr(getattr(request.node, "callspec", None), "params", {}).get("backend")
    if not (isinstance(name, str) and name.endswith("_emulated")):
        yield
        return
    regs = []
    for op, module in EMULATED.items():
        module = importlib.import_module(module)
        if name in module.BACKENDS:
            regs.append(fusedrope.registry(op))
            regs[-1].register(module.backend(name))
    try:
        yield
    finally:
        for reg in regs:
            reg.unregister(name)


# GPU-only tests: marked `gpu` (pytest -m gpu selects them), skipped with the reason where torch sees no GPU.
HAS_CUDA = torch.cuda.is_available()
GPU_ONLY = [pytest.mark.gpu,
            pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)")]


def gpu(test):
    """A test decorator: :data:`GPU_ONLY`'s marks."""
    for mark in GPU_ONLY:
        test = mark(test)
    return test


def needs_cuda_kernel(op: str):
    """Skip, with the registry's reason, where ``op``'s cuda backend cannot run (no toolkit, failed build)."""
    reg = fusedrope.registry(op)
    reason = reg.availability(reg.backend("cuda"), torch.device("cuda")) if HAS_CUDA else None
    return pytest.mark.skipif(bool(reason), reason=f"cuda backend: {reason}")


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv(fusedrope.ENV_BACKEND, raising=False)


# On (a defective interpreter, e.g. Triton 3.6's under numpy >= 2.4, is on too: its backend then skips, with why)
assert torch.cuda.is_available() or triton_interpreting(), "interpreter not active"
