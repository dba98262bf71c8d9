"""Backend selection: order, forcing by argument and environment, explain(), caching, fallbacks."""

import re

import pytest
import torch

import fusedrope
from fusedrope.registry import Impl, OpRegistry
from fusedrope.testing import QuantCase, TtsCase, make_quant_inputs, make_tts_inputs

from conftest import DEVICE

ON_CPU = DEVICE.type == "cpu"


def tts_args():
    return make_tts_inputs(TtsCase("r", 1, 2, 2, 1), device=DEVICE)


def test_backends_are_registered_in_priority_order():
    assert [i.backend for i in fusedrope.registry("qwen3_tts_rope").impls][-2:] == ["triton", "reference"]
    assert [i.backend for i in fusedrope.registry("inverse_rope_group_quant").impls][-2:] == ["triton", "reference"]
    for op in ("qwen3_tts_rope", "inverse_rope_group_quant"):
        names = [i.backend for i in fusedrope.registry(op).impls]
        assert names == sorted(names, key=fusedrope.BACKENDS.index)


def test_registry_of_an_unknown_op_is_refused_and_adds_nothing():
    from fusedrope.registry import REGISTRIES

    known = ["inverse_rope_group_quant", "qwen3_tts_rope"]
    with pytest.raises(ValueError, match=re.escape(
            f"registry: argument 'op' expected one of {known}, got 'qwen3_tts_ropee'")):
        fusedrope.registry("qwen3_tts_ropee")
    assert sorted(REGISTRIES) == known


@pytest.mark.skipif(not ON_CPU, reason="checks the CPU machine's choices")
def test_auto_on_cpu_uses_triton_interpreter_and_explains_compiled_backends():
    ex = fusedrope.explain("qwen3_tts_rope", *tts_args())
    assert ex.chosen == "triton"
    rows = {d.backend: d for d in ex}
    assert rows["triton"].runs and rows["reference"].runs
    for compiled in set(rows) & {"cuda", "hip"}:
        assert not rows[compiled].runs and "device" in rows[compiled].reason
    assert "-> triton" in str(ex) and "qwen3_tts_rope: chosen backend = triton" in str(ex)


@pytest.mark.skipif(not ON_CPU, reason="checks the CPU machine's choices")
def test_forcing_an_unavailable_backend_says_why():
    q, k, cos, sin = tts_args()
    reg = fusedrope.registry("qwen3_tts_rope")
    missing = [i.backend for i in reg.impls if reg.availability(i, DEVICE)]
    for name in missing:
        with pytest.raises(fusedrope.BackendUnavailableError, match=f"backend '{name}' cannot run these inputs: "):
            fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=name)


def test_backend_argument_forces(monkeypatch):
    q, k, cos, sin = tts_args()
    assert fusedrope.explain("qwen3_tts_rope", q, k, cos, sin, backend="reference").chosen == "reference"
    # The forced backend really runs: make the reference fail loudly.
    impl = next(i for i in fusedrope.registry("qwen3_tts_rope").impls if i.backend == "reference")

    def boom(*a):
        raise RuntimeError("reference ran")

    monkeypatch.setattr(impl, "_fn", boom)
    with pytest.raises(RuntimeError, match="reference ran"):
        fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")


def test_environment_variable_forces_auto_only(monkeypatch):
    q, k, cos, sin = tts_args()
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "reference")
    assert fusedrope.explain(fusedrope.qwen3_tts_rope, q, k, cos, sin).chosen == "reference"
    assert fusedrope.explain(fusedrope.qwen3_tts_rope, q, k, cos, sin, backend="triton").chosen == "triton"
    o, pos, c, s = make_quant_inputs(QuantCase(2, 2, 1), device=DEVICE)
    assert fusedrope.explain("inverse_rope_group_quant", o, pos, c, s, 1).chosen == "reference"
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "nope")
    with pytest.raises(ValueError, match="environment variable FUSEDROPE_BACKEND expected 'auto' or one of"):
        fusedrope.qwen3_tts_rope(q, k, cos, sin)


def test_a_backend_forced_by_the_environment_is_named_as_such(monkeypatch):
    reg = OpRegistry("toy")
    reg.register(Impl("reference", "x:y", lambda f: None, lambda d: None))
    reg.register(Impl("triton", "x:y", lambda f: "no odd sizes", lambda d: None))
    facts = (torch.device("cpu"), 3)
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "triton")
    with pytest.raises(fusedrope.BackendUnavailableError,
                       match="backend 'triton' \\(forced by FUSEDROPE_BACKEND=triton\\) cannot run these inputs"):
        reg.select(facts)
    assert "forced by FUSEDROPE_BACKEND=triton" in str(reg.explain(facts))
    # an explicit argument is not the environment's doing
    with pytest.raises(fusedrope.BackendUnavailableError, match="backend 'triton' cannot run these inputs"):
        reg.select(facts, "triton")
    assert "forced" not in str(reg.explain(facts, "reference"))
    monkeypatch.delenv(fusedrope.ENV_BACKEND)
    assert "forced" not in str(reg.explain(facts))


def test_selection_is_cached_and_cheap_to_key():
    reg = fusedrope.registry("qwen3_tts_rope")
    facts = fusedrope.tts_rope.validate(*tts_args(), False)
    assert facts == (DEVICE, torch.bfloat16, 128, False)
    assert reg.select(facts) is reg.select(facts)
    assert (facts, "auto", True) in reg._select  # True: the request came from backend="auto"


def test_unsupported_inputs_fall_through_to_the_next_backend():
    reg = OpRegistry("toy")
    calls = []
    reg.register(Impl("reference", "x:y", lambda f: None, lambda d: None))
    reg.register(Impl("triton", "x:y", lambda f: "no odd sizes" if f[1] % 2 else None, lambda d: None))
    reg.register(Impl("cuda", "x:y", lambda f: None, lambda d: calls.append(d) or "no CUDA here"))
    dev = torch.device("cpu")
    assert reg.select((dev, 2)).backend == "triton"
    assert reg.select((dev, 3)).backend == "reference"
    assert len(calls) == 1  # availability is asked once per device
    ex = reg.explain((dev, 3))
    assert [(d.backend, d.runs, d.reason) for d in ex] == [
        ("cuda", False, "no CUDA here"),
        ("triton", False, "no odd sizes"),
        ("reference", True, "supports these inputs"),
    ]
    with pytest.raises(fusedrope.BackendUnavailableError,
                       match="backend 'triton' cannot run these inputs: no odd sizes"):
        reg.select((dev, 3), "triton")


def test_a_broken_backend_probe_becomes_a_reason():
    reg = OpRegistry("toy")
    probes = []
    reg.register(Impl("reference", "x:y", lambda f: None, lambda d: None))
    reg.register(Impl("cuda", "x:y", lambda f: None, lambda d: probes.append(d) or 1 / 0))
    assert reg.select((torch.device("cpu"),)).backend == "reference"
    assert "ZeroDivisionError" in reg.explain((torch.device("cpu"),))[0].reason
    assert reg.select((torch.device("cpu"), "other facts")).backend == "reference"
    assert len(probes) == 1  # the failure is the answer for this device, cached like any other


def test_an_unavailable_backend_gives_availability_as_its_reason():
    """Can it run here at all comes first: a backend that is unavailable and would not support the inputs either
    is explained (and refused when forced) by its availability."""
    reg = OpRegistry("toy")
    reg.register(Impl("reference", "x:y", lambda f: None, lambda d: None))
    reg.register(Impl("cuda", "x:y", lambda f: "no odd sizes", lambda d: "no CUDA here"))
    facts = (torch.device("cpu"), 3)
    assert [(d.backend, d.reason) for d in reg.explain(facts)] == [("cuda", "no CUDA here"),
                                                                    ("reference", "supports these inputs")]
    with pytest.raises(fusedrope.BackendUnavailableError,
                       match="backend 'cuda' cannot run these inputs: no CUDA here$"):
        reg.select(facts, "cuda")


def test_registering_a_backend_drops_the_cached_choices():
    reg = OpRegistry("toy")
    reg.register(Impl("reference", "x:y", lambda f: None, lambda d: None))
    facts = (torch.device("cpu"), 2)
    assert reg.select(facts).backend == "reference"
    reg.register(Impl("triton", "x:y", lambda f: None, lambda d: None))  # faster, registered later
    assert reg.select(facts).backend == "triton"
    assert reg.explain(facts).chosen == "triton"


def test_an_empty_environment_variable_forces_nothing(monkeypatch):
    """FUSEDROPE_BACKEND set to the empty string (as `FUSEDROPE_BACKEND= cmd` or a container spec leaves it) is
    "auto", not a backend name to refuse."""
    q, k, cos, sin = tts_args()
    auto = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin).chosen
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "")
    ex = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin)
    assert ex.chosen == auto and not ex.forced
    got = fusedrope.qwen3_tts_rope(q, k, cos, sin)
    want = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=auto)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_explain_reports_a_backend_name_the_op_does_not_have():
    """explain() is how a user finds out why a call cannot run: a bad backend name is its last row, not a raise."""
    q, k, cos, sin = tts_args()
    ex = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin, backend="cudnn")
    assert ex.chosen is None and ex[-1].backend == "(error)" and not ex[-1].runs
    assert "argument 'backend' expected 'auto' or one of" in ex[-1].reason and "'cudnn'" in ex[-1].reason
    assert "chosen backend = none" in str(ex)


def test_device_probes(monkeypatch):
    """gpu_arch() drops the feature suffix ROCm reports (gfx942:sramecc+:xnack-), so that the fp8 format and the
    hip kernel's arch check see gfx942; a visible GPU is not enough for HIP kernels without a ROCm torch; Triton
    runs on GPUs and, interpreted, on the CPU only."""
    from types import SimpleNamespace

    from fusedrope import backends as K

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-", major=9, minor=4))
    assert K.gpu_arch(gpu) == "gfx942" and K.native_fp8_dtype(gpu) == torch.float8_e4m3fnuz
    assert K.hip_toolkit_reason(gpu) is None
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(major=9, minor=0))
    assert K.gpu_arch(gpu) == "sm_90" and K.native_fp8_dtype(gpu) == torch.float8_e4m3fn
    assert K.hip_toolkit_reason(gpu) == "this torch build has no ROCm (torch.version.hip is None)"
    assert K.triton_available(torch.device("meta")) == "Triton does not run on device type 'meta'"


def test_availability_is_answered_per_device():
    """A GPU host calls with CPU and GPU tensors: one device's answer must not stand for another's (a CPU answer
    would shut cuda out for CUDA tensors, or send CPU tensors to a CUDA kernel)."""
    asked = []
    reg = OpRegistry("toy")
    reg.register(Impl("reference", "x:y", lambda f: None, lambda d: None))
    reg.register(Impl("cuda", "x:y", lambda f: None,
                      lambda d: asked.append(d.type) or (None if d.type == "meta" else "needs a meta device")))
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert reg.select((cpu,)).backend == "reference"
    assert reg.select((meta,)).backend == "cuda"
    assert reg.select((cpu,)).backend == "reference" and asked == ["cpu", "meta"]  # each asked once, then cached


def test_a_backend_that_allocates_its_outputs_gets_no_python_allocated_ones(monkeypatch):
    """``Impl.run_alloc`` (the cuda backend's C++-allocating op): used for new outputs, never for in place, for
    empty inputs or for inputs that require grad; the writing variant serves those."""
    from fusedrope import tts_rope

    calls = []

    def writes(q, k, cos, sin, q_out, k_out):
        calls.append(("writes", q_out is q))
        fusedrope.reference.qwen3_tts_rope(q, k, cos, sin, q_out, k_out)

    def allocates(q, k, cos, sin):
        calls.append(("allocates",))
        return fusedrope.reference.qwen3_tts_rope_oracle(q, k, cos, sin)

    import types
    mod = types.ModuleType("fake_alloc_backend")
    mod.writes, mod.allocates = writes, allocates
    monkeypatch.setitem(__import__("sys").modules, "fake_alloc_backend", mod)
    impl = Impl("fake", "fake_alloc_backend:writes", lambda f: None, lambda d: None,
                run_alloc="fake_alloc_backend:allocates")
    monkeypatch.setattr(tts_rope.REGISTRY, "select", lambda facts, backend: impl)
    q, k, cos, sin = tts_args()
    q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin)
    assert calls == [("allocates",)] and q_out.dtype == torch.float64  # the oracle's outputs, returned as is
    calls.clear()
    fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True)
    assert calls == [("writes", True)]
    calls.clear()
    fusedrope.qwen3_tts_rope(q.detach().clone().requires_grad_(), k, cos, sin)  # autograd: the Python path
    assert calls == [("writes", False)]
    calls.clear()
    fusedrope.qwen3_tts_rope(q, k.detach().clone().requires_grad_(), cos, sin)  # k alone requires grad: the same
    assert calls == [("writes", False)]
    calls.clear()
    q0, k0 = q[:, :, :0], k[:, :, :0]
    out = fusedrope.qwen3_tts_rope(q0, k0, cos[:, :0], sin[:, :0])
    assert calls == [] and out[0].shape == q0.shape and out[1].shape == k0.shape


def test_registered_entry_points_resolve():
    """Every registered backend's entry points import and are callables (no extension is built or loaded)."""
    for op in ("qwen3_tts_rope", "inverse_rope_group_quant"):
        for impl in fusedrope.registry(op).impls:
            assert callable(impl.fn()), impl
            assert impl.fn_alloc() is None if not impl.run_alloc else callable(impl.fn_alloc()), impl
    cuda = next(i for i in fusedrope.registry("qwen3_tts_rope").impls if i.backend == "cuda")
    assert cuda.fn_alloc().__name__ == "qwen3_tts_rope_new"
