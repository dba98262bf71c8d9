"""Backend selection: order, forcing by argument and environment, explain(), caching, fallbacks."""

import re

import pytest
import torch

import fusedrope
from typing import NamedTuple

from fusedrope.qwen3_tts_rope import validate
from fusedrope.registry import Backend, OpRegistry
from fusedrope.testing import QuantCase, TtsCase, make_quant_inputs, make_tts_inputs

from conftest import DEVICE

ON_CPU = DEVICE.type == "cpu"


def tts_args():
    return make_tts_inputs(TtsCase("r", 1, 2, 2, 1), device=DEVICE)


class Toy(NamedTuple):
    device: torch.device
    size: int = 0


def toy(*backends) -> OpRegistry:
    reg = OpRegistry("toy", Toy)
    for b in backends:
        reg.register(b)
    return reg


def entry(name, supports=lambda f: None, available=lambda d: None, **kw):
    return Backend(name, lambda *a: None, supports, available, **kw)


def test_backends_are_registered_in_priority_order():
    assert [b.name for b in fusedrope.registry("qwen3_tts_rope").backends][-2:] == ["triton", "reference"]
    assert [b.name for b in fusedrope.registry("inverse_rope_group_quant").backends][-2:] == ["triton", "reference"]
    for op in ("qwen3_tts_rope", "inverse_rope_group_quant"):
        names = [b.name for b in fusedrope.registry(op).backends]
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
    missing = [b.name for b in reg.backends if reg.availability(b, DEVICE)]
    for name in missing:
        with pytest.raises(fusedrope.BackendUnavailableError, match=f"backend '{name}' cannot run these inputs: "):
            fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=name)


def test_backend_argument_forces(monkeypatch):
    q, k, cos, sin = tts_args()
    assert fusedrope.explain("qwen3_tts_rope", q, k, cos, sin, backend="reference").chosen == "reference"
    # The forced backend really runs: make the reference fail loudly.
    impl = fusedrope.registry("qwen3_tts_rope").backend("reference")

    def boom(*a):
        raise RuntimeError("reference ran")

    monkeypatch.setattr(impl, "run", boom)
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
    reg = toy(entry("reference"), entry("triton", lambda f: "no odd sizes"))
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


def test_selection_is_cached_and_cheap_to_key(monkeypatch):
    monkeypatch.delenv(fusedrope.ENV_BACKEND, raising=False)
    reg = fusedrope.registry("qwen3_tts_rope")
    facts = fusedrope.registry("qwen3_tts_rope").facts(*validate(*tts_args()))
    assert facts == (DEVICE, torch.bfloat16, 128, False, False, False, False, False, False)  # fp32 rows, no modes
    assert reg.select(facts) is reg.select(facts)
    assert (tuple(facts), "auto", "") in reg._select  # "": FUSEDROPE_BACKEND unset


def test_unsupported_inputs_fall_through_to_the_next_backend():
    calls = []
    reg = toy(entry("reference"), entry("triton", lambda f: "no odd sizes" if f.size % 2 else None),
              entry("cuda", available=lambda d: calls.append(d) or "no CUDA here"))
    dev = torch.device("cpu")
    assert reg.select((dev, 2)).name == "triton"
    assert reg.select((dev, 3)).name == "reference"
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
    probes = []
    reg = toy(entry("reference"), entry("cuda", available=lambda d: probes.append(d) or 1 / 0))
    assert reg.select((torch.device("cpu"),)).name == "reference"
    assert "ZeroDivisionError" in reg.explain((torch.device("cpu"),))[0].reason
    assert reg.select((torch.device("cpu"), 7)).name == "reference"
    assert len(probes) == 1  # the failure is the answer for this device, cached like any other


def test_an_unavailable_backend_gives_availability_as_its_reason():
    """Can it run here at all comes first: a backend that is unavailable and would not support the inputs either
    is explained (and refused when forced) by its availability."""
    reg = toy(entry("reference"), entry("cuda", lambda f: "no odd sizes", lambda d: "no CUDA here"))
    facts = (torch.device("cpu"), 3)
    assert [(d.backend, d.reason) for d in reg.explain(facts)] == [("cuda", "no CUDA here"),
                                                                    ("reference", "supports these inputs")]
    with pytest.raises(fusedrope.BackendUnavailableError,
                       match="backend 'cuda' cannot run these inputs: no CUDA here$"):
        reg.select(facts, "cuda")


def test_registering_a_backend_drops_the_cached_choices():
    reg = toy(entry("reference"))
    facts = (torch.device("cpu"), 2)
    assert reg.select(facts).name == "reference"
    reg.register(entry("triton"))  # faster, registered later
    assert reg.select(facts).name == "triton"
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

    from fusedrope import _device as K

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
    # the arch rules of the cuda backends (sm_80+, pdl from sm_90) and of Triton's fp8 (sm_89+) read it as a number
    assert [K.sm_number(a) for a in ("sm_80", "sm_89", "sm_90", "sm_100", "sm_120", "gfx942", "")] == [
        80, 89, 90, 100, 120, 0, 0]


def test_availability_is_answered_per_device():
    """A GPU host calls with CPU and GPU tensors: one device's answer must not stand for another's (a CPU answer
    would shut cuda out for CUDA tensors, or send CPU tensors to a CUDA kernel)."""
    asked = []
    reg = toy(entry("reference"),
              entry("cuda", available=lambda d: asked.append(d.type) or (None if d.type == "meta" else "needs meta")))
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert reg.select((cpu,)).name == "reference"
    assert reg.select((meta,)).name == "cuda"
    assert reg.select((cpu,)).name == "reference" and asked == ["cpu", "meta"]  # each asked once, then cached


def test_a_backend_that_allocates_its_outputs_gets_no_python_allocated_ones(monkeypatch):
    """``Backend.run_alloc`` (the cuda backend's C++-allocating op): used for new outputs on the Python path (the
    compiled checks allocate them themselves), never for in place, for empty inputs or for inputs that require
    grad; the writing variant serves those."""
    from fusedrope import fast_checks
    from fusedrope.qwen3_tts_rope import REGISTRY

    monkeypatch.setattr(fast_checks, "checks", fast_checks.Python)

    calls = []

    def writes(q, k, cos, sin, q_out, k_out):
        calls.append(("writes", q_out is q))
        fusedrope.reference.qwen3_tts_rope(q, k, cos, sin, q_out, k_out)

    def allocates(q, k, cos, sin):
        calls.append(("allocates",))
        return fusedrope.reference.qwen3_tts_rope_oracle(q, k, cos, sin)

    impl = Backend("fake", writes, run_alloc=allocates)
    monkeypatch.setattr(REGISTRY, "select", lambda facts, backend: impl)
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


def test_registered_backends_are_functions_or_loaders():
    """Every backend holds its function, or (an optional toolchain) a loader that is a plain function of its op's
    package; the Triton loader imports the kernel module and hands back its launcher."""
    for op in ("qwen3_tts_rope", "inverse_rope_group_quant"):
        for b in fusedrope.registry(op).backends:
            assert callable(b.run) or callable(b.load), b
            assert b.load is None or b.load.__module__.startswith(f"fusedrope.{op}"), b
    if ON_CPU:
        run, alloc = fusedrope.registry("qwen3_tts_rope").backend("triton").load()
        assert run.__module__ == "fusedrope.qwen3_tts_rope.triton" and alloc is None


def test_an_opt_in_backend_runs_only_when_named(monkeypatch):
    """A backend with an opt_in reason (a kernel not yet run on a GPU) is passed over by auto, with the reason,
    and runs when named by argument or by FUSEDROPE_BACKEND."""
    reg = toy(entry("reference"), entry("hip", opt_in=lambda facts: "never run on AMD hardware"))
    facts = (torch.device("cpu"), 1)
    assert reg.select(facts).name == "reference"
    row = reg.explain(facts)[0]
    assert (row.backend, row.runs) == ("hip", False)
    assert row.reason == "opt-in (never run on AMD hardware): name it to use it"
    assert reg.select(facts, "hip").name == "hip"
    named = reg.explain(facts, "hip")
    assert named.chosen == "hip" and named[0].runs and named[0].reason == "supports these inputs"
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "hip")
    assert reg.select(facts).name == "hip"
    assert reg.explain(facts)[0].runs and reg.explain(facts).forced == "FUSEDROPE_BACKEND=hip"


def test_a_lazy_backend_loads_once_when_first_chosen():
    loads = []
    reg = toy(entry("reference"), Backend("triton", load=lambda: loads.append(1) or (print, None)))
    assert loads == [] and reg.backend("triton").run is None
    assert reg.select((torch.device("cpu"), 1)).run is print and loads == [1]
    reg.select((torch.device("cpu"), 2))
    assert loads == [1]


def test_a_choice_made_while_the_backends_change_is_not_kept():
    """register() from another thread while a choice is being made: that choice is returned but not cached, so
    the next call sees the new backend (a stale cached choice used to survive)."""
    reg = toy(entry("reference"))

    def supports(facts):  # another thread registers a faster backend while this choice is being made
        if "triton" not in [b.name for b in reg.backends]:
            reg.register(entry("triton"))
        return None

    reg.backend("reference").supports = supports
    assert reg.select((torch.device("cpu"), 1)).name == "reference"  # chosen before triton came
    assert reg.select((torch.device("cpu"), 1)).name == "triton"  # not the stale choice from the cache


def test_a_user_backend_named_in_the_environment_leaves_the_other_op_alone(monkeypatch):
    fusedrope.register_backend("qwen3_tts_rope", "mine", lambda *a: None)
    try:
        monkeypatch.setenv(fusedrope.ENV_BACKEND, "mine")
        o, pos, c, s = make_quant_inputs(QuantCase(2, 2, 1), device=DEVICE)
        assert fusedrope.explain("inverse_rope_group_quant", o, pos, c, s, 1).chosen in ("triton", "reference", "cuda")
        fusedrope.inverse_rope_group_quant(o, pos, c, s, 1)
        assert fusedrope.explain("qwen3_tts_rope", *tts_args()).chosen == "mine"
    finally:
        fusedrope.registry("qwen3_tts_rope").unregister("mine")
    with pytest.raises(ValueError, match="environment variable FUSEDROPE_BACKEND expected 'auto' or one of"):
        fusedrope.qwen3_tts_rope(*tts_args())  # a name no op has is still refused


def test_register_backend_checks_its_callables_and_backend_names_an_unknown_one():
    for arg in ("supports", "available"):
        with pytest.raises(TypeError, match=f"register_backend: argument '{arg}' expected a callable, got str"):
            fusedrope.register_backend("qwen3_tts_rope", "mine", print, **{arg: "bf16 only"})
    assert "mine" not in [b.name for b in fusedrope.registry("qwen3_tts_rope").backends]
    with pytest.raises(ValueError, match="qwen3_tts_rope: argument 'backend' expected one of .*, got 'nope'"):
        fusedrope.registry("qwen3_tts_rope").backend("nope")


def test_explain_loads_nothing():
    """explain() says which backend would run; it does not import or build it (a load error is the call's)."""
    loads = []
    reg = toy(entry("reference"), Backend("triton", load=lambda: loads.append(1) or (print, None)))
    assert reg.explain((torch.device("cpu"), 1)).chosen == "triton" and loads == []
