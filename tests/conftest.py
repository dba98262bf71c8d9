"""Tests run on the GPU when torch sees one (every backend compiled), else on CPU, where Triton kernels run in
its interpreter: that must be switched on before any kernel module is imported."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import fusedrope  # noqa: E402
from fusedrope.backends import triton_interpreting  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def backends_here(op: str) -> list:
    """Backends that can run on DEVICE of this machine, as pytest params (the others skip with the reason)."""
    reg = fusedrope.registry(op)
    out = []
    for impl in reg.impls:
        reason = reg.availability(impl, DEVICE)
        marks = [pytest.mark.skip(reason=f"{impl.backend}: {reason}")] if reason else []
        out.append(pytest.param(impl.backend, marks=marks, id=impl.backend))
    return out


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv(fusedrope.ENV_BACKEND, raising=False)


# On (a defective interpreter, e.g. Triton 3.6's under numpy >= 2.4, is on too: its backend then skips, with why)
assert torch.cuda.is_available() or triton_interpreting(), "interpreter not active"
