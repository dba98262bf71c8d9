"""Host cost of the public entry points: validation + backend selection, on tiny tensors, for both ops.

    pytest bench/test_overhead.py --benchmark-only --benchmark-group-by=group

``public`` calls ``fusedrope.qwen3_tts_rope`` (also ``inplace`` into views of one fused qkv buffer, and into
caller buffers); ``direct`` calls the same backend function on outputs allocated the same way;
``validate+select`` is the difference the public API adds (target: < 3 us).
A no-op backend isolates the host path from any kernel time.
"""

import pytest
import torch

import fusedrope
from fusedrope.inverse_rope_group_quant import REGISTRY as QUANT_REGISTRY
from fusedrope.inverse_rope_group_quant import validate as quant_validate
from fusedrope.qwen3_tts_rope import REGISTRY, _new_out, validate

pytestmark = pytest.mark.benchmark(group="qwen3_tts_rope host overhead", warmup=True, min_rounds=2000)


def _noop(q, k, cos, sin, q_out, k_out):
    return None


@pytest.fixture
def tiny():
    q = torch.randn(1, 2, 1, 8, dtype=torch.bfloat16)
    k = torch.randn(1, 1, 1, 8, dtype=torch.bfloat16)
    cos, sin = torch.randn(1, 1, 8, dtype=torch.bfloat16), torch.randn(1, 1, 8, dtype=torch.bfloat16)
    return q, k, cos, sin


@pytest.fixture
def noop_reference(monkeypatch):
    impl = next(i for i in REGISTRY.impls if i.backend == "reference")
    monkeypatch.setattr(impl, "_fn", _noop)
    return impl


def test_public_call(benchmark, tiny, noop_reference):
    q, k, cos, sin = tiny
    benchmark(lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference"))


def test_public_call_auto(benchmark, tiny, noop_reference, monkeypatch):
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "reference")
    q, k, cos, sin = tiny
    benchmark(lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin))


def test_public_call_inplace_fused_qkv(benchmark, noop_reference):
    """In place into q and k heads of one fused projection buffer, the engine layout: the overlap check
    compares their layouts (cached), since they share a storage."""
    qkv = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16)
    q, k = qkv[:, :, :2].transpose(1, 2), qkv[:, :, 2:3].transpose(1, 2)
    cos, sin = torch.randn(1, 1, 8, dtype=torch.bfloat16), torch.randn(1, 1, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        benchmark(lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend="reference"))


def test_public_call_into_buffers(benchmark, tiny, noop_reference):
    """q_out= / k_out= (e.g. a KV-cache slice): the buffers' checks on top of the out-of-place call."""
    q, k, cos, sin = tiny
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    benchmark(lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, q_out=q_out, k_out=k_out, backend="reference"))


def test_direct_backend_call(benchmark, tiny, noop_reference):
    q, k, cos, sin = tiny
    fn = noop_reference.fn()
    benchmark(lambda: fn(q, k, cos, sin, _new_out(q), _new_out(k)))


def test_validate_and_select(benchmark, tiny):
    q, k, cos, sin = tiny
    REGISTRY.select(validate(q, k, cos, sin, False))  # first call imports and probes backends
    benchmark(lambda: REGISTRY.select(validate(q, k, cos, sin, False)))


# -- inverse_rope_group_quant ------------------------------------------------------------------------------
QUANT_GROUP = pytest.mark.benchmark(group="inverse_rope_group_quant host overhead", warmup=True, min_rounds=2000)


@pytest.fixture
def quant_tiny():
    o = torch.randn(2, 2, 128, dtype=torch.bfloat16)
    cos, sin = fusedrope.testing.deepseek_rope_cache(16)
    return o, torch.arange(2), cos, sin


@pytest.fixture
def quant_noop_reference(monkeypatch):
    impl = next(i for i in QUANT_REGISTRY.impls if i.backend == "reference")
    monkeypatch.setattr(impl, "_fn", lambda *args: None)
    return impl


@QUANT_GROUP
def test_quant_public_call(benchmark, quant_tiny, quant_noop_reference):
    o, pos, cos, sin = quant_tiny
    benchmark(lambda: fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, backend="reference"))


@QUANT_GROUP
def test_quant_public_call_into_buffers(benchmark, quant_tiny, quant_noop_reference):
    o, pos, cos, sin = quant_tiny
    x_fp8, x_scale = fusedrope.empty_quant_outputs(o, 2)
    benchmark(lambda: fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, False, x_fp8, x_scale,
                                                         backend="reference"))


@QUANT_GROUP
def test_quant_validate_and_select(benchmark, quant_tiny):
    o, pos, cos, sin = quant_tiny
    args = (o, pos, cos, sin, 2, 128, False, None, None, None, None)
    benchmark(lambda: QUANT_REGISTRY.select(quant_validate(*args)[0]))
