"""qwen3_tts_rope over the seed matrix (6 shapes x batch 1, 8, 32): eager torch, torch.compile, every
fusedrope backend, numerics='eager', cos/sin tables, the fused q/k norm+RoPE against the model's chain,
Liger-Kernel's RoPE. One pytest-benchmark group per case:

    pytest bench/test_bench_tts_rope.py --benchmark-only [--benchmark-json out.json]
"""

import pytest

from fusedrope import benchmark as B
from fusedrope.benchmark import timing
from fusedrope.testing import TTS_CASES

pytestmark = pytest.mark.benchmark(timer=timing.synchronized_timer)


@pytest.mark.parametrize("contender", B.contender_names(B.TTS))
@pytest.mark.parametrize("case", TTS_CASES, ids=lambda c: c.id)
def test_qwen3_tts_rope(run_contender, case, contender):
    run_contender(B.TTS, case, contender)
