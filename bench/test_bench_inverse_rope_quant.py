"""inverse_rope_group_quant over the seed matrix ((H, G) = (16, 2), (8, 1) x S = 1 .. 16384, and the quant
group size axis 32 / 64 / 128 at S = 2048, 8192): eager torch, torch.compile, every fusedrope backend, the
unfused two-kernel baseline. One pytest-benchmark group per case:

    pytest bench/test_bench_inverse_rope_quant.py --benchmark-only [--benchmark-json out.json]
"""

import pytest

from fusedrope import benchmark as B
from fusedrope.benchmark import timing

pytestmark = pytest.mark.benchmark(timer=timing.synchronized_timer)


@pytest.mark.parametrize("contender", B.contender_names(B.QUANT))
@pytest.mark.parametrize("case", B.seed_cases(B.QUANT), ids=lambda c: c.id)
def test_inverse_rope_group_quant(run_contender, case, contender):
    run_contender(B.QUANT, case, contender)
