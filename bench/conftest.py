"""Shared machinery of the pytest-benchmark suites (``pytest bench/ --benchmark-only``).

Every test times one contender on one seed case; ``benchmark.group`` is the case, so pytest-benchmark prints
the contenders of a case side by side. What is timed and how comes from ``fusedrope.benchmark``:

* the stats pytest-benchmark prints are per call over back-to-back calls rotating among input sets (inputs >=
  3x the last cache on a GPU: the L2, or AMD's Infinity Cache), with a timer that synchronises the GPU before
  reading the clock, so a round ends when the device work ends (host overhead included: the seeds' method);
* ``extra_info`` (in ``--benchmark-json``) adds the device time per call from CUDA-graph replay
  (``device_us``; ``graph_l2_resident`` when the replayed inputs fit in the last cache), ``tbps`` (from
  device time on a GPU, per-call time on a CPU), ``frac_copy`` against a device-to-device copy measured once
  per session and ``frac_peak`` against the GPU's spec-sheet bandwidth;
* ``machine_info`` (in ``--benchmark-json``) adds ``fusedrope``: ``fusedrope.benchmark.machine_info``, the same
  provenance as the CLI's results (GPU, its architecture, L2, driver and clocks, library versions, git commit).

A contender that cannot run here is skipped with the reason (no GPU, backend unavailable, liger_kernel
missing, Triton only in its CPU interpreter). On a CPU, op-2 cases above ``FUSEDROPE_BENCH_CPU_MAX_TOKENS``
(default 1024) tokens are skipped too.
"""

import itertools
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before fusedrope's Triton kernels are imported

import pytest  # noqa: E402

from fusedrope import benchmark as B  # noqa: E402
from fusedrope.benchmark import timing  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu":
    torch.set_num_threads(1)  # on a shared CPU, parallel regions wait for descheduled threads (ms per call)
CPU_MAX_TOKENS = int(os.environ.get("FUSEDROPE_BENCH_CPU_MAX_TOKENS", "1024"))


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["fusedrope"] = B.machine_info(DEVICE)


@pytest.fixture(scope="session")
def copy_tbps():
    return B.copy_roofline(DEVICE)["tbps"]


@pytest.fixture(scope="session")
def contenders_here():
    return {op: {c.name: c for c in B.contenders(op, DEVICE)} for op in B.OPS}


@pytest.fixture
def run_contender(benchmark, copy_tbps, contenders_here):
    """``run_contender(op, case, name)``: skip with the reason, or time it into ``benchmark``."""

    def run(op, case, name):
        contender = contenders_here[op][name]
        if contender.reason:
            pytest.skip(f"{name}: {contender.reason}")
        if DEVICE.type == "cpu" and op == B.QUANT and case.num_tokens > CPU_MAX_TOKENS:
            pytest.skip(f"CPU: S={case.num_tokens} > {CPU_MAX_TOKENS} tokens takes seconds per call here "
                        "(FUSEDROPE_BENCH_CPU_MAX_TOKENS raises the limit)")
        sets = B.make_sets(op, case, DEVICE)
        reason = contender.case_reason(case, sets)
        if reason:
            pytest.skip(f"{name}: {reason}")
        benchmark.group = f"{op} {case.id}"
        call = contender.make(case, sets)
        for i in range(2):  # compile / autotune / first-use build outside the timing
            call(i)
        moved = B.case_fields(op, case)["bytes_moved"]
        info = {"contender": name, "what": contender.what, "n_sets": len(sets), "bytes_moved": moved,
                "device": DEVICE.type, "copy_tbps": copy_tbps}
        if DEVICE.type == "cuda":
            set_bytes = B.input_bytes(op, case)
            replay = B.replay_fields(contender, len(sets), set_bytes, DEVICE)  # as in the CLI's rows
            info.update(device_us=timing.time_graph_us(call, replay["graph_calls"]), **replay,
                        rotated_over_l2=round(len(sets) * set_bytes / B.cache_bytes(DEVICE), 2))
        iterations = timing.calls_per_sample(call, len(sets), DEVICE)
        counter = itertools.count()
        benchmark.pedantic(lambda: call(next(counter)), rounds=5 if DEVICE.type == "cuda" else 10,
                           iterations=iterations, warmup_rounds=1)
        if benchmark.stats is None:  # --benchmark-disable: the calls ran once, nothing was timed
            return
        info["per_call_us"] = benchmark.stats.stats.median * 1e6
        if contender.counts_bytes:  # not the launch floor, which moves none of the case's bytes
            seconds = (info.get("device_us") or info["per_call_us"]) * 1e-6
            info["tbps"] = moved / seconds / 1e12
            info.update(B.bandwidth_fields(info["tbps"], copy_tbps, DEVICE))
        benchmark.extra_info.update(info)

    return run
