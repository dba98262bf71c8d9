"""What runs on an AMD GPU, simulated on this machine: gpu_arch() answers gfx942 (MI300) or gfx950 (MI350/MI355),
the registry reports the ``hip`` backend available (opt-in: named through FUSEDROPE_BACKEND), and the reference
backend stands in for its kernel, which checks that it is handed the one fp8 format the kernel writes on that arch.
Only selection and the callers' choice of fp8 format are exercised (the kernel itself:
test_inverse_rope_group_quant_emulated.py)."""

import importlib.util
from pathlib import Path

import pytest

import fusedrope

from fusedrope import _device as backends
from fusedrope.inverse_rope_group_quant import hip as hq
from fusedrope.inverse_rope_group_quant import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["gfx942", "gfx950"])
def amd(request, monkeypatch):
    """The simulated arch; ``amd.calls`` lists the fp8 dtypes the stand-in hip kernel was handed."""
    arch = request.param
    for module in (backends, hq):
        monkeypatch.setattr(module, "gpu_arch", lambda device: arch)
    impls = {b.name: b for b in REGISTRY.backends}
    calls = []

    def kernel(o, positions, cos, sin, x_fp8, x_scale, quant_group_size, **layout):
        assert x_fp8.dtype == backends.arch_fp8_dtype(arch), f"the hip kernel was handed {x_fp8.dtype} on {arch}"
        calls.append(x_fp8.dtype)
        impls["reference"].run(o, positions, cos, sin, x_fp8, x_scale, quant_group_size, **layout)

    monkeypatch.setattr(impls["hip"], "available", lambda device: None)
    monkeypatch.setattr(impls["hip"], "run", kernel)
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "hip")  # opt-in (docs/status.md)
    REGISTRY.clear_cache()
    request.addfinalizer(REGISTRY.clear_cache)  # no simulated decision outlives the test
    return type("Amd", (), {"arch": arch, "calls": calls})


@pytest.mark.slow  # the whole self-check, per simulated arch
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


def test_auto_passes_over_the_opt_in_hip_kernel(amd, monkeypatch):
    monkeypatch.delenv(fusedrope.ENV_BACKEND)
    o, pos, cos, sin = fusedrope.testing.make_quant_inputs(fusedrope.testing.QuantCase(2, 16, 2))
    ex = fusedrope.explain("inverse_rope_group_quant", o, pos, cos, sin, 2, fp8_dtype=backends.arch_fp8_dtype(amd.arch))
    hip = next(d for d in ex if d.backend == "hip")
    assert ex.chosen != "hip" and not hip.runs and "opt-in" in hip.reason, str(ex)
