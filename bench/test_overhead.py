"""Host cost of the public entry point: validation + backend selection, on tiny tensors.

    pytest bench/test_overhead.py --benchmark-only --benchmark-group-by=group

``public`` calls ``fusedrope.qwen3_tts_rope``; ``direct`` calls the same backend function on outputs
allocated the same way; ``validate+select`` is the difference the public API adds (target: < 3 us).
A no-op backend isolates the host path from any kernel time.
"""

import pytest
import torch

import fusedrope
from fusedrope.tts_rope import REGISTRY, validate

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


def test_direct_backend_call(benchmark, tiny, noop_reference):
    q, k, cos, sin = tiny
    fn = noop_reference.fn()
    benchmark(lambda: fn(q, k, cos, sin, q.new_empty(q.shape), k.new_empty(k.shape)))


def test_validate_and_select(benchmark, tiny):
    q, k, cos, sin = tiny
    REGISTRY.select(validate(q, k, cos, sin, False))  # first call imports and probes backends
    benchmark(lambda: REGISTRY.select(validate(q, k, cos, sin, False)))
