#!/usr/bin/env python3
"""Why our kernels stop near 2.9 TB/s while an elementwise copy reaches 4.3 on the H200: one launch each of
the kernels below, between cudaProfilerStart/Stop, for Nsight Compute to profile (`gpu/ncu_probe.sh` runs it under
`ncu --profile-from-start off`):

  copy      torch.bitwise_not on int32 views of 512 MiB (the benchmark's copy roofline, fusedrope.benchmark)
  irgq_u1   inverse_rope_group_quant CUDA kernel, S = 8192, (H, G) = (16, 2), group 128, 1 chunk per thread
            (the launcher's choice; since the fast-layout kernels, the one for an aligned fp32 cache)
  irgq_u2   the same, 2 chunks per thread (the generic kernel: since ea81d7e u1 against u2 is also fast
            against generic, not unrolling alone)
  irgq_tw   the same, 1 chunk per thread with the rope-tail chunks in warps of their own (tail_warps=1)
  tts       qwen3_tts_rope CUDA kernel on wide_heads-B32 (the seed's largest case), through the public function

Each is run twice first (build, warm-up). Without a GPU it says so and exits 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def probes() -> dict:
    import fusedrope
    from fusedrope import benchmark as B
    from fusedrope import cuda_ext
    from fusedrope.testing import TTS_CASES, QuantCase

    cuda_ext.load()
    dev = torch.device("cuda")
    src = torch.empty(2**29, dtype=torch.uint8, device=dev).random_().view(torch.int32)
    dst = torch.empty_like(src)
    (o, p, c, s, x, sc, _), = B.quant_sets(QuantCase(8192, 16, 2), 1, dev)
    config = torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config
    wide = next(case for case in TTS_CASES if case.id == "wide_heads-B32")
    q, k, cos, sin = B.tts_sets(wide, 1, dev)[0]
    return {"copy": lambda: torch.bitwise_not(src, out=dst),
            "irgq_u1": lambda: config(o, p, c, s, x, sc, 128, 1),
            "irgq_u2": lambda: config(o, p, c, s, x, sc, 128, 2),
            "irgq_tw": lambda: config(o, p, c, s, x, sc, 128, 1, 1),
            "tts": lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="cuda")}


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to profile")
        return 2
    calls = probes()
    for call in calls.values():
        call(), call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, call in calls.items():
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled, in this order:", ", ".join(calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
