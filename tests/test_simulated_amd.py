"""What runs on an AMD GPU, simulated on this machine: gpu_arch() answers gfx942 (MI300) or gfx950 (MI350/MI355),
the registry reports the ``hip`` backend available, and the reference backend stands in for its kernel, which
checks that it is handed the one fp8 format the kernel writes on that arch. Only selection and the callers'
choice of fp8 format are exercised (the kernel itself: tests/test_emulated_quant_kernels.py)."""

import importlib.util
from pathlib import Path

import pytest

from fusedrope import backends
from fusedrope import hip_inverse_rope_quant as hq
from fusedrope.inverse_rope_quant import REGISTRY

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["gfx942", "gfx950"])
def amd(request, monkeypatch):
    """The simulated arch; ``amd.calls`` lists the fp8 dtypes the stand-in hip kernel was handed."""
    arch = request.param
    for module in (backends, hq):
        monkeypatch.setattr(module, "gpu_arch", lambda device: arch)
    impls = {i.backend: i for i in REGISTRY.impls}
    calls = []

    def kernel(o, positions, cos, sin, x_fp8, x_scale, quant_group_size):
        assert x_fp8.dtype == backends.arch_fp8_dtype(arch), f"the hip kernel was handed {x_fp8.dtype} on {arch}"
        calls.append(x_fp8.dtype)
        impls["reference"].fn()(o, positions, cos, sin, x_fp8, x_scale, quant_group_size)

    monkeypatch.setattr(impls["hip"], "available", lambda device: None)
    monkeypatch.setattr(impls["hip"], "_fn", kernel)
    REGISTRY.clear_cache()
    request.addfinalizer(REGISTRY.clear_cache)  # no simulated decision outlives the test
    return type("Amd", (), {"arch": arch, "calls": calls})


def test_self_check_passes_every_backend_in_the_devices_fp8_format(amd, capsys):
    from fusedrope import __main__ as cli

    assert cli.self_check()
    out = capsys.readouterr().out
    assert "FAIL" not in out and "PASS inverse_rope_group_quant hip" in out, out
    assert str(backends.arch_fp8_dtype(amd.arch)).replace("torch.", "") in out
    assert amd.calls


def test_deepseek_v4_example_writes_the_devices_fp8_format(amd):
    spec = importlib.util.spec_from_file_location("deepseek_v4_wo_a", ROOT / "examples" / "deepseek_v4_wo_a.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    r = example.check(num_tokens=2, backend="auto", device="cpu")
    assert r["backend"] == "hip" and r["row-major"] == r["column-major"] < example.GEMM_REL_TOL
    assert set(amd.calls) == {backends.arch_fp8_dtype(amd.arch)}
