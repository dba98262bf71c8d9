"""GPU and CPU timers for the benchmarks: per-call time of back-to-back calls (CUDA events around them, host
overhead included: the seeds' method), device time from CUDA-graph replay, the summed durations of the kernels a
call launches from the profiler (how the op-2 seed's ``run_perftest`` counts), and a pytest-benchmark timer that
ends a round when the GPU has drained. On a CPU the wall clock stands in for CUDA events.

Examples
--------
>>> import torch
>>> from fusedrope.benchmark.timing import time_per_call_us
>>> x = torch.randn(1024)
>>> time_per_call_us(lambda i: x.mul(2.0), 4, torch.device("cpu"), reps=3) > 0
True
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch


def synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def synchronized_timer() -> float:
    """``time.perf_counter()`` after the GPU has drained: a pytest-benchmark timer
    (``pytest.mark.benchmark(timer=...)``) that makes a timed round end when the device work ends."""
    synchronize()
    return time.perf_counter()


GPU_MIN_CALLS = 50  # per sample: the idle GPU's wait for the first launch is then <= 2% of a call's time


def calls_per_sample(call: Callable[[int], object], n: int, device: torch.device, min_s: float = 0.01) -> int:
    """On a GPU ``n`` (the rotating sets), or its smallest multiple of at least ``GPU_MIN_CALLS`` where large
    inputs leave few sets: the start event fires on an idle GPU, and over 2 calls the first launch's latency
    would add a few % to the per-call time. On a CPU a multiple of ``n`` that lasts at least ``min_s`` (one pass
    is timed to find it), so the wall clock's noise stays small.

    >>> calls_per_sample(None, 2, torch.device("cuda")), calls_per_sample(None, 3, torch.device("cuda"))
    (50, 51)
    >>> calls_per_sample(None, 1200, torch.device("cuda"))
    1200
    """
    if device.type == "cuda":
        return n * math.ceil(GPU_MIN_CALLS / n)
    t0 = time.perf_counter()
    for i in range(n):
        call(i)
    return n * max(1, min(1000, math.ceil(min_s / max(time.perf_counter() - t0, 1e-9))))


def time_per_call_us(call: Callable[[int], object], n: int, device: torch.device, reps: int = 5,
                     warmup: int = 2) -> float:
    """(a) Per-call time of back-to-back calls, host overhead included (the seeds' method).

    Parameters
    ----------
    call : callable
        ``call(i)`` runs the contender on input set ``i mod n``.
    n : int
        Calls per sample (the number of input sets); on a CPU a multiple of it (:func:`calls_per_sample`).
    device : torch.device
        CUDA events on a GPU, ``time.perf_counter`` on a CPU.
    reps : int, default 5
        Samples; the median is returned.
    warmup : int, default 2
        Untimed calls first (compilation, autotuning, first-use builds).

    Returns
    -------
    float
        Microseconds per call.
    """
    for i in range(warmup):
        call(i)
    synchronize()
    n = calls_per_sample(call, n, device)
    samples = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(n):
                call(i)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / n)
        else:
            t0 = time.perf_counter()
            for i in range(n):
                call(i)
            samples.append((time.perf_counter() - t0) * 1e6 / n)
    return statistics.median(samples)


def capture_graph(graph, call: Callable[[int], object], n: int) -> None:
    """Capture ``n`` calls into ``graph``. On failure the caller's stream is restored (torch's context manager
    skips that when ending the capture raises, leaving later work on the dead capture stream) and the call's own
    error is raised, not the capture's "operation failed due to a previous error during capture"."""
    prev, first = torch.cuda.current_stream(), []
    try:
        with torch.cuda.graph(graph):
            try:
                for i in range(n):
                    call(i)
            except BaseException as e:
                first.append(e)
                raise
    except BaseException as e:
        torch.cuda.set_stream(prev)
        if first and first[0] is not e:
            raise first[0] from e
        raise


def time_graph_us(call: Callable[[int], object], n: int, reps: int = 5) -> float:
    """(b) Device time per call from CUDA-graph replay. GPU only.

    Parameters
    ----------
    call : callable
        ``call(i)`` runs the contender on input set ``i mod len(sets)``; it must be capturable.
    n : int
        Calls captured in the graph (after warm-up calls on a side stream).
    reps : int, default 5
        Timed replays, each right after an untimed one (so the GPU is busy when timing starts); the median
        is returned.

    Returns
    -------
    float
        Microseconds per call: median replay time / ``n``.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as capture requires
        for i in range(min(n, 3)):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    capture_graph(graph, call, n)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()  # untimed: the GPU is busy when `start` fires, so the launch latency is not timed
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / n)
    del graph
    return statistics.median(samples)


def kernel_us_per_call(events, n: int) -> tuple[float, float]:
    """(Microseconds of device activity per call, device events per call) from profiler ``events`` of ``n``
    calls: the summed durations of the events that ran on the GPU (kernels, memsets, copies), gaps between them
    not counted. ``torch.profiler``'s "Context Sync" marker is not an activity and is left out.

    >>> from types import SimpleNamespace as E
    >>> from torch.autograd import DeviceType
    >>> ev = [E(device_type=DeviceType.CUDA, name="k", time_range=E(elapsed_us=lambda: 2.0)),
    ...       E(device_type=DeviceType.CPU, name="aten::add", time_range=E(elapsed_us=lambda: 9.0))]
    >>> kernel_us_per_call(ev * 4, 2)
    (4.0, 2.0)
    """
    from torch.autograd import DeviceType

    dev = [e for e in events if e.device_type == DeviceType.CUDA and e.name != "Context Sync"]
    return sum(e.time_range.elapsed_us() for e in dev) / n, len(dev) / n


def time_kernels_us(call: Callable[[int], object], n: int) -> tuple[float, float]:
    """(c) The summed device durations of the kernels a call launches, from ``torch.profiler`` (CUPTI) over
    ``n`` calls after warm-up: :func:`kernel_us_per_call`. GPU only. Launch gaps and the time between a
    graph's kernels are not counted, so a call of two kernels costs the sum of their run times: how the op-2 seed
    measured (aiter's ``run_perftest``), which CUDA-graph replay (:func:`time_graph_us`) does not reproduce.

    Returns
    -------
    (float, float)
        Microseconds of kernel time per call, and device events (kernels) per call.
    """
    for i in range(min(n, 3)):
        call(i)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            call(i)
        torch.cuda.synchronize()
    return kernel_us_per_call(prof.events(), n)
