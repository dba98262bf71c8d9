"""The benchmark engine for both ops: case matrices, rotating input sets, contenders, the copy roofline,
measuring, provenance and a whole run (``python -m fusedrope bench``, which ``gpu/run.sh`` runs on a GPU). The
timers are in :mod:`fusedrope.benchmark.timing`, the result files, tables and plots in
:mod:`fusedrope.benchmark.report`. The pytest-benchmark suites in ``bench/`` use all three.

Timing on a GPU (both per call, in microseconds, median over ``reps`` samples):

* ``per_call_us`` (a): CUDA events around ``n`` back-to-back calls, host overhead included: the seeds' method.
* ``device_us`` (b): ``n`` calls captured in one CUDA graph and replayed: device time with the launch gaps of
  a graph replay instead of Python's.

Each call takes the next of ``n`` input sets whose inputs together hold at least 3x the GPU's last cache (the L2,
60 MB on an H200; the 256 MB Infinity Cache behind the L2 on MI300/MI350), so bandwidth numbers are not cache
hits. A device-to-device copy measured in the same run is the roofline (bytes read plus written); ``tbps`` = the
case's ``bytes_moved()`` / time, ``frac_copy`` = ``tbps`` / copy TB/s, and ``frac_peak`` = ``tbps`` / the GPU's
spec-sheet memory bandwidth (:data:`SPEC_PEAK_TBPS`) where it is known.

On a CPU-only machine the same code runs on tiny sizes with the wall clock, and every output says
"CPU, not representative".

Examples
--------
>>> import torch
>>> from fusedrope import benchmark as B
>>> from fusedrope.testing import TTS_CASES
>>> dev = torch.device("cpu")
>>> eager = next(c for c in B.contenders("qwen3_tts_rope", dev, compile=False) if c.name == "eager")
>>> rows = B.measure("qwen3_tts_rope", TTS_CASES[3], [eager], dev, reps=1)
>>> rows[0]["contender"], rows[0]["status"], rows[0]["per_call_us"] > 0
('eager', 'ok', True)
"""

from __future__ import annotations

import functools
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from .. import __version__
from .. import reference as R
from .._device import gpu_arch, native_fp8_dtype, sm_number, triton_available
from ..inverse_rope_group_quant import OP as QUANT
from ..inverse_rope_group_quant.buffers import quant_output_shapes
from ..qwen3_tts_rope import OP as TTS
from ..registry import registry
from . import vllm_peer
from .report import markdown, plot, write_results
from .timing import time_graph_us, time_per_call_us
from ..testing import (QUANT_CASES, QUANT_GROUP_SIZE_CASES, QUANT_HEAD_GROUPS, TTS_CASES, QuantCase, TtsCase,
                      deepseek_rope_cache, qwen3_tts_cos_sin)

OPS = (TTS, QUANT)
ENV_GIT_COMMIT = "FUSEDROPE_GIT_COMMIT"
ENV_GIT_DIRTY = "FUSEDROPE_GIT_DIRTY"  # "0" / "1": the state of the tree named by ENV_GIT_COMMIT
CPU_LABEL = "CPU, not representative: wall-clock timing on a CPU, no GPU kernel ran"
DEFAULT_L2_BYTES = 60 * 2**20  # H200; used when the device does not report its L2
# Caches behind the L2 that rotated inputs must outgrow too, by arch prefix: the 256 MB AMD Infinity Cache (MALL)
# of MI300X/MI325X (gfx94x; AMD CDNA 3 architecture whitepaper) and MI350X/MI355X (gfx95x; AMD CDNA 4
# architecture whitepaper). On NVIDIA GPUs the L2 is the last cache.
LAST_LEVEL_CACHE_BYTES = (("gfx94", 256 * 2**20), ("gfx95", 256 * 2**20))
ROTATE_L2_FACTOR = 3
MAX_SETS = 4800
GRAPH_CAP_MANY_KERNELS = 400  # eager / compile / reference launch many kernels per call: capture fewer calls
QUANT_MAX_POS = 4096
QUANT_CACHE_DTYPE = torch.float32

# Vendor spec-sheet memory bandwidth, TB/s, by a lower-case substring of torch's device name (first match wins:
# the more specific names come first). The fraction of the copy measured in the same run is the roofline this
# project reports first; this one says how far the copy itself is from the datasheet.
SPEC_PEAK_TBPS = (
    ("gh200 144g", 4.9, "NVIDIA GH200 144GB HBM3e datasheet"),
    ("gh200", 4.0, "NVIDIA GH200 96GB HBM3 datasheet"),
    ("h200", 4.8, "NVIDIA H200 datasheet (HBM3e)"),
    ("h100 nvl", 3.9, "NVIDIA H100 NVL datasheet"),
    ("h100 pcie", 2.0, "NVIDIA H100 PCIe datasheet"),
    ("h100", 3.35, "NVIDIA H100 SXM5 datasheet (HBM3)"),
    ("h20", 4.0, "NVIDIA H20 spec (HBM3)"),
    ("gb200", 8.0, "NVIDIA GB200 datasheet, per B200 GPU"),
    ("b200", 8.0, "NVIDIA B200 datasheet (HBM3e)"),
    ("a100-sxm4-80gb", 2.039, "NVIDIA A100 80GB SXM datasheet"),
    ("a100 80gb pcie", 1.935, "NVIDIA A100 80GB PCIe datasheet"),
    ("a100", 1.555, "NVIDIA A100 40GB datasheet"),
    ("mi355x", 8.0, "AMD Instinct MI355X datasheet (HBM3E)"),
    ("mi350x", 8.0, "AMD Instinct MI350X datasheet (HBM3E)"),
    ("mi325x", 6.0, "AMD Instinct MI325X datasheet (HBM3E)"),
    ("mi300x", 5.3, "AMD Instinct MI300X datasheet (HBM3)"),
)


def bandwidth_fields(tbps: float, copy_tbps: Optional[float], device: torch.device) -> dict:
    """``frac_copy`` (against the copy of this run) and ``frac_peak`` (against the spec sheet), where known."""
    out = {}
    if copy_tbps:
        out["frac_copy"] = _sig(tbps / copy_tbps)
    peak = spec_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    if peak:
        out["frac_peak"] = _sig(tbps / peak[0])
    return out


def spec_peak(device_name: str) -> Optional[tuple[float, str]]:
    """``(TB/s, source)`` of the spec-sheet memory bandwidth for a device name, or None when unknown.

    >>> spec_peak("NVIDIA H200")
    (4.8, 'NVIDIA H200 datasheet (HBM3e)')
    >>> spec_peak("NVIDIA H100 80GB HBM3")[0], spec_peak("AMD Instinct MI300X")[0], spec_peak("Tesla T4")
    (3.35, 5.3, None)
    """
    name = device_name.lower()
    return next(((tbps, src) for key, tbps, src in SPEC_PEAK_TBPS if key in name), None)


TIMING = {
    "per_call_us": "(a) CUDA events around back-to-back calls over n rotating input sets (n calls, or the "
                   "smallest multiple of n >= 50), host overhead included (the seeds' method); median of reps",
    "device_us": "(b) device time per call: n calls captured in one CUDA graph, replayed; median of reps, "
                 "/ n",
    "tbps": "case.bytes_moved() (bytes read + written) / time; time = device_us where measured, else "
            "per_call_us",
    "frac_copy": "tbps / bandwidth of a device-to-device copy measured in the same run (bytes read + "
                 "written)",
    "frac_peak": "tbps / the GPU's spec-sheet memory bandwidth (hbm_peak_tbps, where known)",
}
CPU_TIMING = {
    "per_call_us": ("time.perf_counter around back-to-back calls on the CPU, torch on one thread; median of "
                    "reps (" + CPU_LABEL + ")"),
    "device_us": "not measured: no GPU",
    "tbps": TIMING["tbps"],
    "frac_copy": "tbps / bandwidth of a CPU memory copy measured in the same run",
}


# ------------------------------------------------------------------------------------------------------------
# case matrices
# ------------------------------------------------------------------------------------------------------------
def seed_cases(op: str) -> list:
    """The seed PRs' benchmark matrix: 18 TTS cases, or 20 (H, G) x S cases plus the group-size axis."""
    if op == TTS:
        return list(TTS_CASES)
    return list(dict.fromkeys(QUANT_CASES + QUANT_GROUP_SIZE_CASES))


def quick_cases(op: str, device: torch.device) -> list:
    """A short matrix: a few seed cases on a GPU; tiny sizes on a CPU (where only the wall clock exists)."""
    gpu = device.type == "cuda"
    if op == TTS:
        ids = ("qwen3_tts-B1", "qwen3_tts-B8", "qwen3_tts-B32", "wide_heads-B32") if gpu else \
              ("small_tts-B1", "qwen3_tts-B1")
        return [c for c in TTS_CASES if c.id in ids]
    seqs, group_axis_seqs = ((1, 128, 1024, 8192), (8192,)) if gpu else ((1, 8), (8,))
    cases = [QuantCase(s, h, g) for h, g in QUANT_HEAD_GROUPS.values() for s in seqs]
    cases += [QuantCase(s, 16, 2, quant_group_size=q) for s in group_axis_seqs for q in (32, 64, 128)]
    return list(dict.fromkeys(cases))


def case_fields(op: str, case) -> dict:
    """The case's parameters as result-row fields; ``size`` is the x axis of the plots (bytes moved)."""
    if op == TTS:
        return {"case": case.id, "shape": case.name, "batch": case.batch, "seq_len": case.seq_len,
                "num_q_heads": case.num_q_heads, "num_kv_heads": case.num_kv_heads, "head_dim": case.head_dim,
                "rows": case.rows, "bytes_moved": case.bytes_moved()}
    return {"case": case.id, "num_tokens": case.num_tokens, "num_heads": case.num_heads,
            "num_groups": case.num_groups, "head_dim": case.head_dim, "rope_dim": case.rope_dim,
            "quant_group_size": case.quant_group_size,
            "bytes_moved": case.bytes_moved(torch.bfloat16, QUANT_CACHE_DTYPE)}


# ------------------------------------------------------------------------------------------------------------
# input sets: rotated so that bandwidth numbers are not L2 hits
# ------------------------------------------------------------------------------------------------------------
def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or DEFAULT_L2_BYTES)


def cache_bytes(device: torch.device) -> int:
    """The cache that rotated input sets must outgrow: the L2, or the larger cache behind it where the GPU has one
    (:data:`LAST_LEVEL_CACHE_BYTES`); 0 on a CPU."""
    if device.type != "cuda":
        return 0
    arch = gpu_arch(device)
    return max([l2_bytes(device)] + [size for prefix, size in LAST_LEVEL_CACHE_BYTES if arch.startswith(prefix)])


def replay_fields(contender, n: int, set_bytes: int, device: torch.device) -> dict:
    """``graph_calls``: how many of ``n`` rotating calls a CUDA graph of ``contender`` captures (fewer for one
    that launches many kernels per call); ``graph_rotated_over_l2``: their inputs over the last cache (the row's
    ``rotated_over_l2`` counts all ``n`` sets); ``graph_l2_resident``: whether they fit in it (so a replay times
    cache hits)."""
    calls = min(n, GRAPH_CAP_MANY_KERNELS) if contender.many_kernels else n
    cache = cache_bytes(device)
    return {"graph_calls": calls, "graph_rotated_over_l2": round(calls * set_bytes / cache, 2),
            "graph_l2_resident": calls * set_bytes < cache}


def input_bytes(op: str, case) -> int:
    """Bytes of one input set (outputs not counted): q, k, cos, sin; or o and its positions."""
    if op == TTS:
        return (case.rows + 2 * case.batch * case.seq_len) * case.head_dim * 2
    return case.num_tokens * (case.num_heads * case.head_dim * 2 + 8)


def num_sets(set_bytes: int, device: torch.device, max_sets: int = MAX_SETS) -> int:
    """Enough input sets of ``set_bytes`` to hold ``ROTATE_L2_FACTOR`` x the last cache (:func:`cache_bytes`; at
    least 2); 2 on a CPU."""
    if device.type != "cuda":
        return 2
    return max(2, min(max_sets, math.ceil(ROTATE_L2_FACTOR * cache_bytes(device) / max(set_bytes, 1))))


def tts_sets(case: TtsCase, n: int, device: torch.device, dtype=torch.bfloat16, seed: int = 0) -> list:
    """``n`` input sets ``(q, k, cos, sin)``: q/k views of one ``[B, S, Hq+Hkv, D]`` projection each (the
    engine layout), cos/sin as Qwen3-TTS builds them, each sequence at its own position."""
    B, S, HQ, HKV, D = case.batch, case.seq_len, case.num_q_heads, case.num_kv_heads, case.head_dim
    g = torch.Generator(device=device).manual_seed(seed)
    proj = torch.randn(n, B, S, HQ + HKV, D, device=device, generator=g).to(dtype)
    start = torch.randint(0, 4096, (n * B, 1), device=device, generator=g)
    cos, sin = qwen3_tts_cos_sin(start + torch.arange(S, device=device), D, dtype=dtype)
    cos, sin = cos.view(n, B, S, D), sin.view(n, B, S, D)
    return [(proj[i, :, :, :HQ].transpose(1, 2), proj[i, :, :, HQ:].transpose(1, 2), cos[i], sin[i])
            for i in range(n)]


def quant_sets(case: QuantCase, n: int, device: torch.device, transpose_scale: bool = False,
               fp8_dtype: Optional[torch.dtype] = None, seed: int = 0) -> list:
    """``n`` input sets ``(o, positions, cos_cache, sin_cache, x_fp8, x_scale, transpose_scale)`` with
    preallocated outputs (the CUDA-graph use); o's magnitudes vary by token and head over 12 binades, as in
    ``testing.make_quant_inputs``."""
    S, H, D, G, q = case.num_tokens, case.num_heads, case.head_dim, case.num_groups, case.quant_group_size
    g = torch.Generator(device=device).manual_seed(seed)
    mag = torch.exp2(torch.randint(-6, 7, (n, S, H, 1), device=device, generator=g).float())
    o = (torch.randn(n, S, H, D, device=device, generator=g) * mag).to(torch.bfloat16)
    pos = torch.randint(0, QUANT_MAX_POS, (n, S), device=device, generator=g)
    cos, sin = deepseek_rope_cache(QUANT_MAX_POS, case.rope_dim, dtype=QUANT_CACHE_DTYPE, device=device)
    fp_shape, (_, _, Ks) = quant_output_shapes(S, H, D, G, q)
    x = torch.empty((n, *fp_shape), dtype=fp8_dtype or native_fp8_dtype(device), device=device)
    if transpose_scale:  # storage [G, Ks, S] per set, seen as [S, G, Ks]
        sc = torch.empty(n, G, Ks, S, dtype=torch.float8_e8m0fnu, device=device).permute(0, 3, 1, 2)
    else:
        sc = torch.empty(n, S, G, Ks, dtype=torch.float8_e8m0fnu, device=device)
    return [(o[i], pos[i], cos, sin, x[i], sc[i], transpose_scale) for i in range(n)]


def make_sets(op: str, case, device: torch.device, n: Optional[int] = None,
              transpose_scale: bool = False) -> list:
    """Rotating input sets for ``case`` (``n`` defaults to :func:`num_sets` of the case's bytes)."""
    if n is None:
        n = num_sets(input_bytes(op, case), device)
    return tts_sets(case, n, device) if op == TTS else quant_sets(case, n, device, transpose_scale)


def op_args(op: str, case, one_set: tuple) -> tuple:
    """The public function's positional arguments for one input set."""
    if op == TTS:
        return one_set
    o, pos, cos, sin, x, sc, transpose_scale = one_set
    return o, pos, cos, sin, case.num_groups, case.quant_group_size, transpose_scale, x, sc


# ------------------------------------------------------------------------------------------------------------
# contenders
# ------------------------------------------------------------------------------------------------------------
def tts_formula(q, k, cos, sin):
    """The seed's eager baseline, HF's ``apply_rotary_pos_emb``: ``q*cos + rotate_half(q)*sin`` in the input
    dtype (each product and the sum rounded)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + R.rotate_half(q) * sin, k * cos + R.rotate_half(k) * sin


def quant_formula(o, positions, cos_cache, sin_cache, num_groups: int, quant_group_size: int,
                  fp8_dtype: torch.dtype):
    """Op 2 in plain torch (``fusedrope.reference``'s steps, fp32): returns ``(x_fp8, scale bytes)``."""
    x = R.inverse_rope_tail(o, positions, cos_cache, sin_cache)
    return R.group_quant_e8m0(x, num_groups, quant_group_size, fp8_dtype)


_COMPILED: dict = {}


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn)`` with default options (what a user gets), once per process."""
    if fn not in _COMPILED:
        import torch._dynamo.config as cfg

        # One compiled graph per shape class would exceed the default limit over a seed matrix and fall back
        # to eager silently; the benchmark must time compiled code.
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), 64))
        _COMPILED[fn] = torch.compile(fn)
    return _COMPILED[fn]


@dataclass
class Contender:
    """One thing to time. ``make(case, sets)`` returns ``call(i)``, which runs it on input set
    ``i % len(sets)``. ``reason`` says why it cannot run on this machine (None: it can); ``backend`` names a
    fusedrope backend, whose per-case support :meth:`case_reason` asks the registry about."""

    name: str
    op: str
    what: str
    make: Callable
    reason: Optional[str] = None
    backend: Optional[str] = None
    many_kernels: bool = False
    counts_bytes: bool = True  # False: moves none of the case's bytes (the launch floor), so no TB/s
    bytes_moved: Optional[Callable] = None  # bytes_moved(case): other traffic than the case's (bf16 output)

    def case_reason(self, case, sets: list) -> Optional[str]:
        """Why this contender cannot run this case (None: it can)."""
        if self.reason or self.backend is None:
            return self.reason
        from .. import explain

        ex = explain(self.op, *op_args(self.op, case, sets[0]), backend=self.backend)
        d = next((d for d in ex if d.backend == self.backend), None)
        return None if d is None or d.runs else d.reason


def _triton_reason(device: torch.device, interpreter: bool) -> Optional[str]:
    reason = triton_available(device)
    if reason is None and device.type == "cpu" and not interpreter:
        reason = "CPU interpreter timings are not meaningful"
    return reason


def _backend_reason(op: str, backend: str, device: torch.device, interpreter: bool) -> Optional[str]:
    reg = registry(op)
    impl = reg.backend(backend)
    reason = reg.availability(impl, device)
    if reason:
        return f"{backend} backend unavailable: {reason}"
    if backend == "triton":
        return _triton_reason(device, interpreter)
    return None


def _liger():
    """(LigerRopeFunction.apply, version) or (None, why not)."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except ImportError as e:
        return None, f"liger_kernel not installed ({e})"
    except Exception as e:  # noqa: BLE001 - a peer broken by this torch/triton must not cost our own rows
        return None, f"liger_kernel failed to import: {type(e).__name__}: {str(e)[:200]}"
    try:
        return LigerRopeFunction.apply, metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        return LigerRopeFunction.apply, "unknown"


def _tts_maker(get_fn: Callable) -> Callable:
    """``make(case, sets)`` whose ``call(i)`` runs ``get_fn()(q, k, cos, sin)`` on set ``i % len(sets)``;
    ``get_fn`` runs at make time (so torch.compile happens only for contenders that run)."""
    def make(case, sets):
        fn = get_fn()
        return lambda i: fn(*sets[i % len(sets)])
    return make


def rms_norm_rope(q, k, q_weight, k_weight, cos, sin, eps: float = 1e-6):
    """The Qwen3-TTS code predictor's eager chain: ``q_norm``, ``k_norm`` (Qwen3TTSRMSNorm), then
    ``apply_rotary_pos_emb``, in the input dtype (HF's modules)."""
    return tts_formula(R.rms_norm(q, q_weight, eps), R.rms_norm(k, k_weight, eps), cos, sin)


def _qk_norm_rope(backend: str = "auto"):
    from ..qwen3_tts_rope.modes import qwen3_tts_qk_norm_rope

    return functools.partial(qwen3_tts_qk_norm_rope, backend=backend)


def _two_norms_then_rope(q, k, q_weight, k_weight, cos, sin, eps: float = 1e-6):
    from .. import qwen3_tts_rope

    return qwen3_tts_rope(R.rms_norm(q, q_weight, eps), R.rms_norm(k, k_weight, eps), cos, sin)


def _norm_weights(case, sets) -> tuple:
    g = torch.Generator().manual_seed(1)
    w = (1 + 0.3 * torch.randn(2, case.head_dim, generator=g)).to(sets[0][0].dtype).to(sets[0][0].device)
    return w[0], w[1]


def _tts_norm_maker(get_fn: Callable) -> Callable:
    """``call(i)`` runs ``get_fn()(q, k, q_weight, k_weight, cos, sin)`` on set ``i``: the norm+RoPE chains."""
    def make(case, sets):
        fn, (qw, kw) = get_fn(), _norm_weights(case, sets)

        def call(i):
            q, k, cos, sin = sets[i % len(sets)]
            return fn(q, k, qw, kw, cos, sin)
        return call
    return make


def _tts_table_maker(gather: bool, backend: str = "auto") -> Callable:
    """cos/sin read from ``[B*S, D]`` tables at ``[B, S]`` positions: by the kernel (``positions=``), or gathered
    by torch first (``gather``), as an engine without the table path does."""
    def make(case, sets):
        from .. import qwen3_tts_rope

        B, S = case.batch, case.seq_len
        tables = [(c.reshape(B * S, -1).clone(), n.reshape(B * S, -1).clone()) for _, _, c, n in sets]
        pos = torch.arange(B * S, device=sets[0][0].device).view(B, S)

        def call(i):
            (q, k, _, _), (ct, st) = sets[i % len(sets)], tables[i % len(sets)]
            if gather:
                return qwen3_tts_rope(q, k, ct[pos], st[pos], backend=backend)
            return qwen3_tts_rope(q, k, ct, st, positions=pos, backend=backend)
        return call
    return make


def _quant_formula_maker(get_fn: Callable) -> Callable:
    def make(case, sets):
        fn, fp8_dtype = get_fn(), sets[0][4].dtype
        return lambda i: fn(*sets[i % len(sets)][:4], case.num_groups, case.quant_group_size, fp8_dtype)
    return make


def _quant_api_maker(fn: Callable) -> Callable:
    """For functions with the public op's signature (outputs written into the set's buffers)."""
    def make(case, sets):
        return lambda i: fn(*op_args(QUANT, case, sets[i % len(sets)]))
    return make


# Op 2's CUDA kernels through the raw op with these launch modes (kernels_cuda/README.md): ``pdl`` 1 a
# programmatic dependent launch, ``kernel`` 1 the head kernel (the ``cuda_head`` backend's); ``cache_dtype``: on a
# copy of the sets' fp32 cos/sin cache in that dtype.
QUANT_CUDA_MODES = {"cuda:pdl": {"pdl": 1}, "cuda_head:pdl": {"pdl": 1, "kernel": 1},
                    "cuda:bf16_cache": {"cache_dtype": torch.bfloat16},
                    "cuda_head:bf16_cache": {"kernel": 1, "cache_dtype": torch.bfloat16}}


def _quant_raw_maker(kw: dict) -> Callable:
    def make(case, sets):
        from .. import cuda_ext

        cuda_ext.load()
        op = torch.ops.fusedrope_cuda.inverse_rope_group_quant_out
        kws = dict(kw)
        dtype = kws.pop("cache_dtype", None)
        cache = tuple(t.to(dtype) for t in sets[0][2:4]) if dtype else None  # every set shares the cache

        def call(i):
            o, p, c, s, x, sc = sets[i % len(sets)][:6]
            op(o, p, *(cache or (c, s)), x, sc, case.quant_group_size, 0, kws.get("pdl", 0), kws.get("kernel", 0))
        return call
    return make


def _bf16_output_bytes(case) -> int:
    """``quantize=False`` traffic: the seed's bytes with a bf16 output (2 B per element) and no scales."""
    elements = case.num_tokens * case.num_heads * case.head_dim
    return case.bytes_moved(torch.bfloat16, QUANT_CACHE_DTYPE) + elements - elements // case.quant_group_size


def _quant_layout_maker(kw: dict) -> Callable:
    """The public op (``backend="auto"`` unless ``kw`` names one) with the layout keywords ``kw``, into outputs of
    that layout allocated once per set: ``x_layout="group_major"`` is vLLM's ``[S, G, Dg]`` over ``[G, S, Dg]``."""
    from .. import empty_quant_outputs, inverse_rope_group_quant

    kw = dict(kw)
    group_major = kw.pop("x_layout", None) == "group_major"
    quantize = kw.get("quantize", True)
    layout = {k: v for k, v in kw.items() if k in ("scale_layout", "quantize")}

    def make(case, sets):
        outs = []
        for o, *_, x, _, _ in sets:
            x_new, sc = empty_quant_outputs(o, case.num_groups, case.quant_group_size,
                                            fp8_dtype=x.dtype if quantize else None, **layout)
            if group_major:
                S, G, dg = x_new.shape
                x_new = x_new.new_empty(G, S, dg).transpose(0, 1)
            outs.append((x_new, sc if quantize else None))

        def call(i):
            o, p, c, s = sets[i % len(sets)][:4]
            return inverse_rope_group_quant(o, p, c, s, case.num_groups, case.quant_group_size, False,
                                            *outs[i % len(outs)], **kw)
        return call
    return make


def _vllm_bytes(case) -> int:
    """The vLLM drop-in's traffic: fp32 scales (4 B per block), and the zeroed padding tokens of their storage."""
    blocks = case.num_heads * case.head_dim // case.quant_group_size  # per token
    padding = -case.num_tokens % 4
    return case.bytes_moved(torch.bfloat16, QUANT_CACHE_DTYPE) + 3 * case.num_tokens * blocks + 4 * padding * blocks


def _vllm_maker(case, sets):
    from ..integrations.vllm import fused_inv_rope_fp8_quant

    cache = torch.cat(sets[0][2:4], dim=1)  # vLLM's one cos||sin cache (every set shares it)
    hpg = case.num_heads // case.num_groups
    return lambda i: fused_inv_rope_fp8_quant(sets[i % len(sets)][0], sets[i % len(sets)][1], cache,
                                              case.num_groups, hpg, case.head_dim - case.rope_dim, case.rope_dim,
                                              case.quant_group_size)


# The engines' layouts and modes through the public op (backend "auto": the kernel a caller gets), beside the
# row-major contenders; "auto:vllm" is fusedrope.integrations.vllm, allocating as vLLM's own op does.
QUANT_LAYOUTS = {"auto:col": {"scale_layout": "col"}, "auto:group_major": {"x_layout": "group_major"},
                 "auto:mfma_tile": {"scale_layout": "mfma_tile"}, "auto:bf16": {"quantize": False},
                 "auto:pdl": {"enable_pdl": True}}
# The same layouts on the compiled CUDA kernels: column-major scales on both, group-major x on the head kernel
# (opt-in, the only one writing it).
QUANT_CUDA_LAYOUTS = {"cuda:col": {"scale_layout": "col", "backend": "cuda"},
                      "cuda_head:col": {"scale_layout": "col", "backend": "cuda_head"},
                      "cuda_head:group_major": {"x_layout": "group_major", "backend": "cuda_head"},
                      "cuda_head:group_major:col": {"x_layout": "group_major", "scale_layout": "col",
                                                    "backend": "cuda_head"}}


def _vllm_peer_maker(case, sets):
    kernel = vllm_peer.load_kernel(vllm_peer.find_source())
    cache = torch.cat(sets[0][2:4], dim=1)  # vLLM's one cos||sin cache (every set shares it)
    outs = [vllm_peer.outputs(s[0], case.num_groups, case.quant_group_size) for s in sets]
    return lambda i: vllm_peer.launch(kernel, sets[i % len(sets)][0], sets[i % len(sets)][1], cache,
                                      *outs[i % len(outs)], case.num_groups, case.quant_group_size, case.rope_dim)


def _floor_maker(case, sets):
    t = torch.zeros(1, device=sets[0][0].device)
    return lambda i: t.fill_(1.0)


def _pdl_reason(no_cuda: Optional[str], device: torch.device, switch: str) -> Optional[str]:
    """Why a programmatic dependent launch (``switch``) of the cuda kernel cannot run here, or None."""
    if no_cuda or sm_number(gpu_arch(device)) >= 90:
        return no_cuda
    return f"a programmatic dependent launch ({switch}) needs sm_90 or newer"


def contenders(op: str, device: torch.device, *, compile: bool = True, interpreter: bool = False,
               only: Optional[Iterable[str]] = None) -> list[Contender]:
    """Every contender of ``op`` in table order, each with the reason it cannot run here (or None).

    Op 1: eager torch formula, its ``torch.compile``, each registered fusedrope backend (``backend=``),
    Liger's ``LigerRopeFunction`` (in place on its own contiguous copy; reads only the first half of cos/sin).
    Op 2: eager torch formula, its ``torch.compile``, each registered backend, the CUDA kernels' launch modes
    (:data:`QUANT_CUDA_MODES`; ``pdl`` needs sm_90+), the engines' layouts, the unfused two-kernel baseline
    (``fusedrope.benchmark.unfused``; rotates ``o`` in place, which changes no timing).
    Both: ``floor``, one trivial kernel per call, the launch floor under them all.

    Parameters
    ----------
    op : {"qwen3_tts_rope", "inverse_rope_group_quant"}
    device : torch.device
        Where they will run; availability reasons are asked for this device.
    compile : bool, default True
        False: the ``compile`` contender carries the reason "torch.compile disabled (--no-compile)".
    interpreter : bool, default False
        On a CPU, time Triton (and the Triton-based baseline) in its interpreter instead of skipping them.
    only : iterable of str, optional
        Keep only these names.

    Returns
    -------
    list of Contender
    """
    from .. import inverse_rope_group_quant, qwen3_tts_rope
    from .unfused import unfused_inverse_rope_group_quant

    out: list[Contender] = []
    no_compile = None if compile else "torch.compile disabled (--no-compile)"
    if compile and device.type == "cpu":
        # Inductor's pool of compile workers would compete with the timed CPU code for the same cores.
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    if op == TTS:
        out.append(Contender("eager", op,
                             "torch formula q*cos + rotate_half(q)*sin in bf16 (the seed's eager)",
                             _tts_maker(lambda: tts_formula), many_kernels=True))
        out.append(Contender("compile", op, "torch.compile of that formula (default options)",
                             _tts_maker(lambda: compiled(tts_formula)), reason=no_compile, many_kernels=True))
        for b in (b.name for b in registry(op).backends):
            out.append(Contender(b, op, f"fusedrope.qwen3_tts_rope(..., backend={b!r}), allocating outputs",
                                 _tts_maker(lambda b=b: functools.partial(qwen3_tts_rope, backend=b)),
                                 reason=_backend_reason(op, b, device, interpreter), backend=b,
                                 many_kernels=b == "reference"))
        # the modes and the fused q/k norm through the public functions (on a CPU auto picks Triton's interpreter
        # for them: timed only with --interpreter), beside the model's eager chain and torch.compile of it
        no_auto = _triton_reason(device, interpreter) if device.type == "cpu" else None
        out.append(Contender("auto:eager", op, "fusedrope.qwen3_tts_rope(..., numerics='eager'): HF's rounding",
                             _tts_maker(lambda: functools.partial(qwen3_tts_rope, numerics="eager")),
                             reason=no_auto))
        out.append(Contender("auto:table", op, "fusedrope.qwen3_tts_rope(..., positions=): cos/sin rows read from "
                                               "[B*S, D] tables by the kernel", _tts_table_maker(False),
                             reason=no_auto))
        out.append(Contender("gather+auto", op, "the same tables gathered by torch (cos[pos], sin[pos]), then "
                                                "fusedrope.qwen3_tts_rope", _tts_table_maker(True), reason=no_auto,
                             many_kernels=True))
        out.append(Contender("norm_rope:eager", op, "the model's chain: q_norm, k_norm (RMSNorm), then "
                                                    "apply_rotary_pos_emb, eager torch", _tts_norm_maker(
                                                        lambda: rms_norm_rope), many_kernels=True))
        out.append(Contender("norm_rope:compile", op, "torch.compile of that chain (default options)",
                             _tts_norm_maker(lambda: compiled(rms_norm_rope)), reason=no_compile,
                             many_kernels=True))
        out.append(Contender("norm_rope:2norms+auto", op, "two torch RMSNorms, then fusedrope.qwen3_tts_rope",
                             _tts_norm_maker(lambda: _two_norms_then_rope), reason=no_auto, many_kernels=True))
        out.append(Contender("auto:qk_norm_rope", op, "fusedrope.qwen3_tts_qk_norm_rope: both norms and the RoPE "
                                                      "in one launch", _tts_norm_maker(_qk_norm_rope),
                             reason=no_auto))
        # the cuda kernels of the modes and pdl (opt-in: kernels_cuda/README.md lists what decides them)
        no_cuda = _backend_reason(op, "cuda", device, interpreter)
        no_pdl = _pdl_reason(no_cuda, device, "enable_pdl=True")
        out.append(Contender("cuda:eager", op, "fusedrope.qwen3_tts_rope(..., numerics='eager', backend='cuda')",
                             _tts_maker(lambda: functools.partial(qwen3_tts_rope, numerics="eager",
                                                                  backend="cuda")), reason=no_cuda, backend="cuda"))
        out.append(Contender("cuda:table", op, "auto:table on the cuda kernel", _tts_table_maker(False, "cuda"),
                             reason=no_cuda, backend="cuda"))
        out.append(Contender("cuda:qk_norm_rope", op, "auto:qk_norm_rope on the cuda kernel",
                             _tts_norm_maker(lambda: _qk_norm_rope("cuda")), reason=no_cuda, backend="cuda"))
        out.append(Contender("cuda:pdl", op, "fusedrope.qwen3_tts_rope(..., enable_pdl=True, backend='cuda')",
                             _tts_maker(lambda: functools.partial(qwen3_tts_rope, enable_pdl=True,
                                                                  backend="cuda")), reason=no_pdl, backend="cuda"))
        fn, info = _liger()
        reason = info if fn is None else (
            None if device.type == "cuda" else "liger_kernel's Triton kernel needs a GPU")
        out.append(Contender("liger", op,
                             f"liger_kernel.ops.rope.LigerRopeFunction.apply (liger-kernel {info})",
                             _tts_maker(lambda: fn), reason=reason))
    elif op == QUANT:
        out.append(Contender("eager", op,
                             "fusedrope.reference's torch steps (inverse RoPE, then group quant)",
                             _quant_formula_maker(lambda: quant_formula), many_kernels=True))
        out.append(Contender("compile", op, "torch.compile of that formula (default options)",
                             _quant_formula_maker(lambda: compiled(quant_formula)), reason=no_compile,
                             many_kernels=True))
        for b in (b.name for b in registry(op).backends):
            out.append(Contender(b, op, f"fusedrope.inverse_rope_group_quant(..., backend={b!r}) into "
                                        "preallocated outputs",
                                 _quant_api_maker(functools.partial(inverse_rope_group_quant, backend=b)),
                                 reason=_backend_reason(op, b, device, interpreter), backend=b,
                                 many_kernels=b == "reference"))
        no_cuda = _backend_reason(op, "cuda", device, interpreter)
        no_pdl = _pdl_reason(no_cuda, device, "pdl=1")
        for name, kw in QUANT_CUDA_MODES.items():
            out.append(Contender(name, op, f"the raw CUDA op with {kw}, into preallocated outputs",
                                 _quant_raw_maker(kw), reason=no_pdl if kw.get("pdl") else no_cuda,
                                 backend="cuda_head" if kw.get("kernel") else "cuda"))
        # on a CPU auto picks Triton's interpreter for these: timed only with --interpreter
        no_auto = _triton_reason(device, interpreter) if device.type == "cpu" else None
        for name, kw in QUANT_LAYOUTS.items():
            out.append(Contender(name, op, f"fusedrope.inverse_rope_group_quant(..., {kw}) into preallocated "
                                           "outputs of that layout", _quant_layout_maker(kw), reason=no_auto,
                                 bytes_moved=_bf16_output_bytes if kw.get("quantize") is False else None))
        for name, kw in QUANT_CUDA_LAYOUTS.items():
            out.append(Contender(name, op, f"the public op, {kw}, into preallocated outputs of that layout",
                                 _quant_layout_maker(kw), reason=no_cuda, backend=kw["backend"]))
        out.append(Contender("auto:vllm", op, "fusedrope.integrations.vllm.fused_inv_rope_fp8_quant (group-major "
                                              "fp8, MN-major TMA-aligned fp32 scales), allocating its outputs",
                             _vllm_maker, reason=no_auto, bytes_moved=_vllm_bytes))
        source = vllm_peer.find_source()
        out.append(Contender("vllm", op, "vLLM's own fused_inv_rope_fp8_quant Triton kernel, read from "
                                         f"{source.name if source else 'its wheel'} (its layout), into its buffers",
                             _vllm_peer_maker, bytes_moved=_vllm_bytes,
                             reason=("vLLM's kernel source not found: bash gpu/run.sh --fetch-wheels" if not source
                                     else None if device.type == "cuda" else "vLLM's Triton kernel needs a GPU")))
        out.append(Contender("unfused", op, "fusedrope.benchmark.unfused: Triton inverse RoPE in place (bf16), then a "
                                            "separate Triton group-quant kernel",
                             _quant_api_maker(unfused_inverse_rope_group_quant),
                             reason=_triton_reason(device, interpreter)))
    else:
        raise ValueError(f"contenders: argument 'op' expected one of {OPS}, got {op!r}")
    out.append(Contender("floor", op, "one trivial kernel per call (a 1-element fill): the launch floor, no case "
                                      "bytes moved", _floor_maker, counts_bytes=False))
    if only is not None:
        only = set(only)
        out = [c for c in out if c.name in only]
    return out


def contender_names(op: str) -> list[str]:
    """Every contender's name, in table order, whether or not it can run here (for parametrising tests)."""
    return [c.name for c in contenders(op, torch.device("cpu"), compile=False)]


# ------------------------------------------------------------------------------------------------------------
# the copy roofline
# ------------------------------------------------------------------------------------------------------------
def copy_roofline(device: torch.device, nbytes: Optional[int] = None, reps: int = 5) -> dict:
    """Bandwidth of a device-to-device copy, the roofline of this run: the faster of two copies of the same
    bytes, ``dst.copy_(src)`` (cudaMemcpyAsync on a GPU) and an elementwise kernel that reads and writes as
    many bytes (``torch.bitwise_not`` on int32 views). On the H200 the first reached only 57% of the spec
    sheet's bandwidth and our kernels beat it (docs/benchmarks.md), so a memcpy alone is too weak a roofline.

    Parameters
    ----------
    device : torch.device
    nbytes : int, optional
        Bytes copied each way (a multiple of 4); default 1 GiB on a GPU (device time from graph replay), 64 MiB
        on a CPU (wall clock).
    reps : int, default 5

    Returns
    -------
    dict
        ``bytes_each_way``, ``us`` per copy and ``tbps`` (bytes read + written per second / 1e12) of the faster
        copy, ``copy`` (its name), ``copies`` (``{name: {"us", "tbps"}}`` for both), ``timing``.
    """
    gpu = device.type == "cuda"
    nbytes = nbytes or (2**30 if gpu else 64 * 2**20)
    # random bytes, not zeros: zeros can run faster than real data
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    src32, dst32 = src.view(torch.int32), dst.view(torch.int32)
    calls = {"memcpy": lambda i: dst.copy_(src), "kernel": lambda i: torch.bitwise_not(src32, out=dst32)}
    copies = {}
    for name, call in calls.items():
        if gpu:
            us = time_graph_us(call, 4, reps)
        else:
            us = time_per_call_us(call, 2, device, reps, warmup=1)
        copies[name] = {"us": round(us, 3), "tbps": _sig(2 * nbytes / (us * 1e-6) / 1e12)}
    best = min(copies, key=lambda n: copies[n]["us"])
    how = "CUDA-graph replay of 4 copies" if gpu else "wall clock (" + CPU_LABEL + ")"
    return {"bytes_each_way": nbytes, "us": copies[best]["us"], "tbps": copies[best]["tbps"], "copy": best,
            "copies": copies,
            "timing": f"{how}; the faster of copy_ (memcpy) and an elementwise kernel (bitwise_not): {best}"}


# ------------------------------------------------------------------------------------------------------------
# measuring
# ------------------------------------------------------------------------------------------------------------
def auto_backend(op: str, case, sets: list) -> Optional[str]:
    """The backend ``backend="auto"`` picks for this case on this machine."""
    from .. import explain

    return explain(op, *op_args(op, case, sets[0])).chosen


def failed_rows(rows: list) -> list:
    """The rows whose contender failed: its call raised, or its graph capture did (that row keeps its per-call
    time but has no device time: an error too)."""
    return [r for r in rows if r.get("status") == "error" or r.get("device_error")]


def measure(op: str, case, contender_list: list[Contender], device: torch.device, *, reps: int = 5,
            copy_tbps: Optional[float] = None, graph: bool = True, transpose_scale: bool = False,
            sets: Optional[list] = None, log: Callable[[str], None] = lambda s: None) -> list[dict]:
    """Time every contender on one case.

    Parameters
    ----------
    op : str
    case : TtsCase or QuantCase
    contender_list : list of Contender
    device : torch.device
    reps : int, default 5
    copy_tbps : float, optional
        The copy roofline of this run, for ``frac_copy``.
    graph : bool, default True
        Also measure device time by CUDA-graph replay (GPU only).
    transpose_scale : bool, default False
        Op 2 with the column-major scale layout.
    sets : list, optional
        Input sets (default :func:`make_sets`).
    log : callable, optional
        Receives one line per measurement.

    Returns
    -------
    list of dict
        One row per contender: the case's fields, ``contender``, ``status`` ("ok", "skipped" or "error"),
        ``reason``, ``per_call_us``, ``device_us`` (GPU), ``tbps``, ``frac_copy``, ``frac_peak`` (GPUs in
        :data:`SPEC_PEAK_TBPS`), ``n_sets``, ``auto_backend``.
    """
    sets = sets if sets is not None else make_sets(op, case, device, transpose_scale=transpose_scale)
    n = len(sets)
    set_bytes = input_bytes(op, case)
    base = {"op": op, **case_fields(op, case), "n_sets": n, "rotated_mb": round(n * set_bytes / 2**20, 2),
            "auto_backend": auto_backend(op, case, sets), "device": device.type}
    if device.type == "cuda":  # below 2, small cases (capped at MAX_SETS sets) partly hit the last cache
        base["rotated_over_l2"] = round(n * set_bytes / cache_bytes(device), 2)
    if op == QUANT:
        base["transpose_scale"] = bool(sets[0][6])
    rows, call = [], None
    for c in contender_list:
        call = None  # the last contender's call and its buffers go before the next one allocates its own
        row = {**base, "contender": c.name, "status": "ok", "reason": ""}
        if c.bytes_moved is not None:
            row["bytes_moved"] = c.bytes_moved(case)
        rows.append(row)
        reason = c.case_reason(case, sets)
        if reason:
            row.update(status="skipped", reason=reason)
            continue
        try:
            call = c.make(case, sets)
            row["per_call_us"] = round(time_per_call_us(call, n, device, reps), 3)
        except Exception as e:  # noqa: BLE001 - one contender's failure must not lose the others
            row.update(status="error", reason=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
                       if str(e).strip() else type(e).__name__)
            call = None  # before emptying the cache: the failed contender's buffers go too
            _recover(device)
            continue
        if graph and device.type == "cuda":
            replay = replay_fields(c, n, set_bytes, device)
            try:
                row["device_us"] = round(time_graph_us(call, replay["graph_calls"], reps), 3)
                row.update(replay)
            except Exception as e:  # noqa: BLE001
                row["device_error"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
                _recover(device)
        t = row.get("device_us") or row["per_call_us"]
        row["tbps_basis"] = "device_us" if row.get("device_us") else "per_call_us"
        if c.counts_bytes:
            row["tbps"] = _sig(row["bytes_moved"] / (t * 1e-6) / 1e12)
            row.update(bandwidth_fields(row["tbps"], copy_tbps, device))
        log(f"  {case.id:<28} {c.name:<10} per call {row['per_call_us']:>10.2f} us"
            + (f"   device {row['device_us']:>9.2f} us" if row.get("device_us") else "")
            + (f"   {row['tbps']:.3f} TB/s" if "tbps" in row else ""))
    del sets, call  # the caller's sets, if any, are the caller's; ours go now, before the empty_cache
    _recover(device)
    return rows


def _sig(x: float, digits: int = 5) -> float:
    return float(f"{x:.{digits}g}")


def _recover(device: torch.device) -> None:
    if device.type == "cuda":
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a sticky error shows up in the next row anyway
            pass


# ------------------------------------------------------------------------------------------------------------
# provenance
# ------------------------------------------------------------------------------------------------------------
def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return done.stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


def git_state() -> tuple[str, Optional[bool]]:
    """``(commit, dirty)``: ``$FUSEDROPE_GIT_COMMIT`` if set (a copy of the tree without ``.git``, as a device
    machine gets), else the checkout's HEAD, else "unknown"; ``dirty`` is None where the checkout cannot say
    (no checkout, or its HEAD is not the commit named), unless ``$FUSEDROPE_GIT_DIRTY`` ("0" / "1", set where
    the tree was sent from) says."""
    head, named = _git("rev-parse", "HEAD"), os.environ.get(ENV_GIT_COMMIT, "")
    if not head or (named and not head.startswith(named)):
        told = os.environ.get(ENV_GIT_DIRTY, "")
        return named or head or "unknown", {"0": False, "1": True}.get(told) if named else None
    return head, bool(_git("status", "--porcelain"))  # untracked files too: the device builds and runs them


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


NVIDIA_SMI_FIELDS = ("name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,"
                     "power.limit,temperature.gpu,clocks_event_reasons.active")


def _smi_commands() -> list[list[str]]:
    if torch.version.hip:
        return [["amd-smi", "metric", "--clock", "--power", "--temperature"],
                ["rocm-smi", "--showdriverversion", "--showclocks", "--showpower", "--showtemp"]]
    # a driver that does not know one field rejects the whole query: the short list is the fallback
    return [["nvidia-smi", f"--query-gpu={NVIDIA_SMI_FIELDS}", "--format=csv"],
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem", "--format=csv"]]


def smi_under_load(device: torch.device, nbytes: int = 256 << 20, timeout_s: float = 20.0) -> str:
    """The vendor tool's driver / clock / power report, read while copies keep the GPU busy: read idle, the
    clocks would be the idle ones, not those the benchmarks ran at. A failure is returned as text."""
    try:
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
    except Exception as e:  # noqa: BLE001 - provenance must not stop a run
        src = dst = None
        failures = [f"no load ({type(e).__name__}: {e})"[:200]]
    else:
        failures = []
    for cmd in _smi_commands():
        try:
            if dst is not None:
                for _ in range(20):  # the clocks ramp up before the tool samples them
                    dst.copy_(src)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            deadline = time.time() + timeout_s
            while proc.poll() is None and time.time() < deadline:
                if dst is not None:
                    for _ in range(10):
                        dst.copy_(src)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)  # bounded work in flight, so the loop sees the tool end
                else:
                    time.sleep(0.01)
            if proc.poll() is None:
                proc.kill()
            out = proc.communicate()[0].strip()
            if proc.returncode == 0:
                return f"{out}\n(read {'under a copy loop' if dst is not None else 'idle: ' + failures[0]})"
            failures.append(f"{' '.join(cmd[:2])}: rc {proc.returncode}: {out[-200:]}")
        except Exception as e:  # noqa: BLE001
            failures.append(f"{cmd[0]}: {type(e).__name__}: {e}"[:200])
    return "; ".join(failures)


def machine_info(device: torch.device, command: Optional[str] = None) -> dict:
    """Where and how results were made: host, GPU, library versions, git commit, the exact command.

    The commit is ``$FUSEDROPE_GIT_COMMIT`` when set (for a copy of the tree without ``.git``, as a device machine
    gets), else the checkout's ``HEAD``."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    commit, dirty = git_state()
    info = {
        "hostname": platform.node(), "platform": platform.platform(), "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "fusedrope": __version__,
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "torch_hip": torch.version.hip,
        "triton": triton_version, "liger_kernel": _version("liger-kernel"), "device": device.type,
        "git_commit": commit, "git_dirty": dirty,
        "command": command or " ".join([sys.executable, *sys.argv]),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""), "torch_threads": torch.get_num_threads(),
        "timing": TIMING if device.type == "cuda" else CPU_TIMING,
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, gpu_arch=gpu_arch(device), multiprocessors=p.multi_processor_count,
                    l2_bytes=l2_bytes(device), rotate_cache_bytes=cache_bytes(device), gpu_memory_bytes=p.total_memory)
        peak = spec_peak(p.name)
        if peak:
            info.update(hbm_peak_tbps=peak[0], hbm_peak_source=peak[1])
        info["smi_under_load"] = smi_under_load(device)
    else:
        info.update(gpu=None, label=CPU_LABEL)
    return info


# ------------------------------------------------------------------------------------------------------------
# a whole run
# ------------------------------------------------------------------------------------------------------------
@dataclass
class RunConfig:
    ops: tuple = OPS
    matrix: str = "seed"  # "seed" or "quick"
    reps: int = 5
    compile: bool = True
    graph: bool = True
    interpreter: bool = False
    transpose_scale: bool = False
    only_contenders: Optional[tuple] = None
    only_cases: Optional[tuple] = None  # case ids; an op none of whose cases is named runs its whole matrix
    cases: Optional[dict] = None  # {op: [case, ...]}: an explicit matrix instead of ``matrix``'s
    budget_s: Optional[float] = None
    plots: bool = True


def run(cfg: RunConfig, out_dir, device: Optional[torch.device] = None, command: Optional[str] = None,
        log: Callable[[str], None] = print) -> dict:
    """Measure a whole matrix and write the result files.

    Parameters
    ----------
    cfg : RunConfig
        Ops, matrix, contenders, timing options.
    out_dir : str or Path
        Receives ``results.json``, ``results.csv``, ``results.md`` (rewritten after every case, so a run cut
        short keeps what it measured) and the PNG plots.
    device : torch.device, optional
        Default: the GPU if torch sees one, else the CPU (then torch runs on one thread for the run).
    command : str, optional
        Recorded as the command that made the results (default ``sys.argv``).
    log : callable, default print

    Returns
    -------
    dict
        ``meta`` (provenance), ``config``, ``contenders``, ``copy``, ``rows``, ``files``.
    """
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    threads = torch.get_num_threads()
    if device.type == "cpu":
        # One thread: on a shared CPU, parallel regions wait for a descheduled thread (tens of ms per call).
        torch.set_num_threads(1)
    try:
        return _run(cfg, Path(out_dir), device, command, log)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: RunConfig, out: Path, device: torch.device, command: Optional[str], log) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results = {"meta": machine_info(device, command), "config": {k: v for k, v in vars(cfg).items()},
               "contenders": {}, "copy": {}, "rows": []}
    log(f"== copy roofline on {results['meta'].get('gpu') or 'CPU'}")
    results["copy"] = copy_roofline(device, reps=cfg.reps)
    copy_tbps = results["copy"]["tbps"]
    log(f"  {copy_tbps:.3f} TB/s (bytes read + written)")
    for op in cfg.ops:
        cl = contenders(op, device, compile=cfg.compile, interpreter=cfg.interpreter,
                        only=cfg.only_contenders)
        results["contenders"][op] = [{"name": c.name, "what": c.what, "unavailable": c.reason} for c in cl]
        cases = (cfg.cases or {}).get(op) or (
            seed_cases(op) if cfg.matrix == "seed" else quick_cases(op, device))
        if cfg.only_cases and any(c.id in cfg.only_cases for c in cases):  # an op none of them names runs all
            cases = [c for c in cases if c.id in cfg.only_cases]
        log(f"== {op}: {len(cases)} cases x {len(cl)} contenders"
            + "".join(f"\n  skip {c.name}: {c.reason}" for c in cl if c.reason))
        for case in cases:
            if cfg.budget_s is not None and time.time() - t0 > cfg.budget_s:
                why = f"time budget ({cfg.budget_s:.0f} s) ran out"
                results["rows"] += [{"op": op, **case_fields(op, case), "contender": c.name,
                                     "status": "skipped", "reason": why} for c in cl]
                continue
            results["rows"] += measure(op, case, cl, device, reps=cfg.reps, copy_tbps=copy_tbps,
                                       graph=cfg.graph, transpose_scale=cfg.transpose_scale, log=log)
            write_results(results, out)
    results["meta"]["seconds"] = round(time.time() - t0, 1)
    files = write_results(results, out)
    if cfg.plots:
        try:
            files += plot(results, out)
        except ImportError as e:
            log(f"plots skipped: {e} (pip install 'fusedrope[bench]')")
    results["files"] = [str(f) for f in files]
    return results


# ------------------------------------------------------------------------------------------------------------
# the CLI: python -m fusedrope bench
# ------------------------------------------------------------------------------------------------------------
CPU_REFUSAL = ("No GPU here: running the quick CPU matrix (tiny sizes) instead of the seed matrix. On a CPU "
               "the seed sizes take minutes per case, Triton runs only in its interpreter, and wall-clock "
               "CPU timings say nothing about GPU kernels. Pass --full to run the seed matrix anyway.")


def default_out_dir(device: torch.device, matrix: str) -> Path:
    """``bench/results/<gpu or cpu>-<matrix>-<commit>``."""
    where = "cpu"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).lower()
        where = "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")
    commit = git_state()[0]
    return Path("bench") / "results" / f"{where}-{matrix}-{commit[:7] if commit != 'unknown' else 'nogit'}"


def cli(args, command: str) -> int:
    """``python -m fusedrope bench``: run, write the files, print the tables. Exit 1 if a contender failed
    (or its graph capture did)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    matrix = "quick" if args.quick else "seed"
    if device.type == "cpu" and matrix == "seed" and not args.full:
        print(CPU_REFUSAL)
        matrix = "quick"
    split = lambda s: tuple(x for x in s.split(",") if x) or None  # noqa: E731
    ops = OPS if args.op == "all" else (args.op,)
    known = {n for op in ops for n in contender_names(op)}
    unknown = sorted(set(split(args.contenders) or ()) - known)
    if unknown:
        print(f"bench: --contenders: unknown {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    ids = [c.id for op in ops for c in (seed_cases(op) if matrix == "seed" else quick_cases(op, device))]
    unknown = sorted(set(split(args.cases) or ()) - set(ids))
    if unknown:
        print(f"bench: --cases: not in the {matrix} matrix: {unknown}; its cases: {', '.join(ids)}",
              file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else default_out_dir(device, matrix)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"bench: --out: cannot create {out}: {e}", file=sys.stderr)
        return 2
    cfg = RunConfig(ops=ops, matrix=matrix,
                    reps=args.reps or (5 if device.type == "cuda" else 3), compile=not args.no_compile,
                    graph=not args.no_graph, interpreter=args.interpreter,
                    transpose_scale=args.transpose_scale, only_contenders=split(args.contenders),
                    only_cases=split(args.cases), budget_s=args.budget_s, plots=args.plots)
    results = run(cfg, out, device, command)
    print()
    print(markdown(results))
    print("files:", *results["files"], sep="\n  ")
    errors = failed_rows(results["rows"])
    for r in errors:
        print(f"ERROR {r['op']} {r['case']} {r['contender']}: {r.get('device_error') or r['reason']}")
    return 1 if errors else 0
