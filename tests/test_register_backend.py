"""A backend from a file outside the package (examples/custom_backend.py) plugged in with
``fusedrope.register_backend``: it gets the validation, dispatch, ``explain`` and ``check_backend``, and
``check_backend`` catches a kernel that breaks the contract."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import fusedrope
from fusedrope.testing import TtsCase, check_backend, make_tts_inputs

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "custom_backend.py"


@pytest.fixture
def custom(monkeypatch):
    spec = importlib.util.spec_from_file_location("custom_backend", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.register()
    yield module
    fusedrope.registry("qwen3_tts_rope").unregister(module.NAME)


def test_it_passes_the_contract_checks_and_auto_tries_it_first(custom):
    assert check_backend("qwen3_tts_rope", custom.NAME) >= 10
    q, k, cos, sin = make_tts_inputs(TtsCase("c", 1, 4, 4, 2, 64))
    ex = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin)
    assert ex.chosen == custom.NAME and [d.backend for d in ex][0] == custom.NAME
    fp32 = fusedrope.explain("qwen3_tts_rope", *(t.float() for t in (q, k, cos, sin)))
    assert fp32.chosen != custom.NAME and "serves bf16 and fp16 only" in str(fp32)  # its supports() is asked
    with pytest.raises(fusedrope.BackendUnavailableError, match="backend 'mine' cannot run these inputs: serves bf16"):
        fusedrope.qwen3_tts_rope(*(t.float() for t in (q, k, cos, sin)), backend="mine")


def test_it_gets_fusedrope_validation_before_it_runs(custom, monkeypatch):
    calls = []
    monkeypatch.setattr(fusedrope.registry("qwen3_tts_rope").backend(custom.NAME), "run",
                        lambda *a: calls.append(a))
    q, k, cos, sin = make_tts_inputs(TtsCase("c", 2, 4, 4, 2, 64))
    with pytest.raises(ValueError, match="^qwen3_tts_rope: argument 'k' expected shape"):
        fusedrope.qwen3_tts_rope(q, k[:1], cos, sin, backend="mine")
    assert calls == []
    fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="mine")
    assert len(calls) == 1 and calls[0][4].is_contiguous() and calls[0][4].shape == q.shape


def test_check_backend_catches_a_kernel_that_breaks_the_contract(custom, monkeypatch):
    """A kernel that rounds an intermediate to bf16 (within 1 ulp almost everywhere, but not correctly rounded),
    and one that assumes cos[i] == cos[i + D/2]: both fail."""
    def rounds_twice(q, k, cos, sin, q_out, k_out):
        custom.my_qwen3_tts_rope(q, k, cos, sin, q_out, k_out)
        q_out.copy_((q.float() * cos.float()[:, None]).to(q.dtype).float()
                    + (q_out.float() - q.float() * cos.float()[:, None]))

    def one_half_of_cos(q, k, cos, sin, q_out, k_out):
        h = cos.shape[-1] // 2
        custom.my_qwen3_tts_rope(q, k, cos[..., :h].repeat(1, 1, 2), sin, q_out, k_out)

    for broken in (rounds_twice, one_half_of_cos):
        fusedrope.register_backend("qwen3_tts_rope", "broken", broken)
        try:
            with pytest.raises(AssertionError, match="qwen3_tts_rope backend 'broken', case"):
                check_backend("qwen3_tts_rope", "broken")
        finally:
            fusedrope.registry("qwen3_tts_rope").unregister("broken")


def test_register_backend_refuses_non_callables_and_unknown_ops():
    with pytest.raises(TypeError, match="register_backend: argument 'run' expected a callable, got int"):
        fusedrope.register_backend("qwen3_tts_rope", "x", 3)
    with pytest.raises(ValueError, match="registry: argument 'op' expected one of"):
        fusedrope.register_backend("rope", "x", print)
    assert "x" not in [b.name for b in fusedrope.registry("qwen3_tts_rope").backends]


def test_the_example_runs(capsys):
    spec = importlib.util.spec_from_file_location("custom_backend_main", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.main()
    finally:
        fusedrope.registry("qwen3_tts_rope").unregister(module.NAME)
    out = capsys.readouterr().out
    assert "cases within the contract" in out and "chosen backend = mine" in out


def test_a_quant_backend_keeps_its_seven_argument_run_and_serves_row_major_x_and_row_or_col_scales():
    """register_backend's protocol for inverse_rope_group_quant predates scale_layout, quantize and group-major
    outputs: a registered kernel gets the calls it can write, and the others go to the built-in backends."""
    from fusedrope.reference import inverse_rope_group_quant as kernel
    from fusedrope.testing import QuantCase, make_quant_inputs

    calls = []

    def mine(o, positions, cos, sin, x_fp8, x_scale, quant_group_size):
        calls.append(x_scale.stride())
        kernel(o, positions, cos, sin, x_fp8, x_scale, quant_group_size)

    fusedrope.register_backend("inverse_rope_group_quant", "mine", mine)
    try:
        args = make_quant_inputs(QuantCase(5, 4, 2, head_dim=128, quant_group_size=64))
        for layout in ("row", "col"):
            got = fusedrope.inverse_rope_group_quant(*args, 2, 64, scale_layout=layout, backend="auto")
            want = fusedrope.inverse_rope_group_quant(*args, 2, 64, scale_layout=layout, backend="reference")
            assert all(g.view(torch.uint8).equal(w.view(torch.uint8)) for g, w in zip(got, want))
        assert len(calls) == 2 and calls[1][0] == 1  # the column-major view, read off its strides
        for kwargs in ({"scale_layout": "mfma_tile"}, {"quantize": False}):
            ex = fusedrope.explain("inverse_rope_group_quant", *args, 2, 64, **kwargs)
            assert ex.chosen != "mine" and "a registered backend writes row-major x_fp8" in str(ex), kwargs
            fusedrope.inverse_rope_group_quant(*args, 2, 64, **kwargs)
        assert len(calls) == 2
        with pytest.raises(fusedrope.BackendUnavailableError, match="backend 'mine' cannot run these inputs: a reg"):
            fusedrope.inverse_rope_group_quant(*args, 2, 64, quantize=False, backend="mine")
    finally:
        fusedrope.registry("inverse_rope_group_quant").unregister("mine")


MISUSE = {  # backends whose supports() / available() misbehave: name -> (register_backend keyword arguments,
    # the call and the answer the TypeError names)
    "supports raises": ({"supports": lambda facts: 1 / 0}, None, None),
    "supports returns False": ({"supports": lambda facts: False}, "supports(facts)", "bool False"),
    "available returns False": ({"available": lambda device: False}, "available(device)", "bool False"),
    "available returns 0": ({"available": lambda device: 0}, "available(device)", "int 0"),
}


@pytest.mark.parametrize("case", MISUSE)
def test_a_misbehaving_backend_is_named_and_never_taken_for_serving(case):
    """A supports() that raises is that backend's reason, naming it and the exception, and auto passes over it;
    answers that are neither None nor a str (False would read as "available", or as the reason "False") raise
    TypeError naming the backend, and the backend never runs."""
    ran = []
    kwargs, asked, got = MISUSE[case]
    fusedrope.register_backend("qwen3_tts_rope", "mine", lambda *a: ran.append(a), **kwargs)
    try:
        q, k, cos, sin = make_tts_inputs(TtsCase("c", 1, 4, 4, 2, 64))
        if case == "supports raises":
            reason = "backend 'mine': supports(facts) raised ZeroDivisionError: division by zero"
            ex = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin)
            assert ex.chosen != "mine" and ex[0].backend == "mine" and ex[0].reason == reason
            fusedrope.qwen3_tts_rope(q, k, cos, sin)  # auto: the next backend serves it
            unavailable = re.escape(f"'mine' cannot run these inputs: {reason}")
            with pytest.raises(fusedrope.BackendUnavailableError, match=unavailable):
                fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="mine")
        else:
            msg = (f"^qwen3_tts_rope: backend 'mine': {re.escape(asked)} expected to return None or a str "
                   f"\\(why not\\), got {got}$")
            for call in (fusedrope.qwen3_tts_rope, fusedrope.explain):
                with pytest.raises(TypeError, match=msg):
                    call(*(("qwen3_tts_rope",) if call is fusedrope.explain else ()), q, k, cos, sin)
        assert ran == []
    finally:
        fusedrope.registry("qwen3_tts_rope").unregister("mine")


@pytest.mark.parametrize("name", [" mine", "auto ", "", "my-kernel", "2fast", "auto", "reference", "triton", None])
def test_register_backend_wants_a_new_identifier(name):
    before = [b.name for b in fusedrope.registry("qwen3_tts_rope").backends]
    msg = "^register_backend: argument 'name' expected a new backend name, a Python identifier \\(not 'auto' or one of "
    with pytest.raises(ValueError, match=msg + ".*\\), got " + re.escape(repr(name)) + "$"):
        fusedrope.register_backend("qwen3_tts_rope", name, print)
    assert [b.name for b in fusedrope.registry("qwen3_tts_rope").backends] == before


@pytest.mark.parametrize("op", ["qwen3_tts_rope", "inverse_rope_group_quant"])
def test_built_in_backends_cannot_be_unregistered(op):
    reg = fusedrope.registry(op)
    before = [b.name for b in reg.backends]
    for name in ("triton", "reference"):
        with pytest.raises(ValueError, match=f"^{op}: argument 'name' expected a backend of register_backend's "
                                             f"\\(the built-in ones stay\\), got '{name}'$"):
            reg.unregister(name)
    assert [b.name for b in reg.backends] == before
