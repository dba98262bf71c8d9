#!/usr/bin/env python3
"""One-shot GPU check of the inverse_rope_group_quant CUDA kernel on an H200 (sm_90): build, correctness,
CUDA-graph replay, benchmark, compute-sanitizer, in that order. Every section runs in its own try/except, and
the result files are rewritten after each, so a run killed later keeps them. --budget-s bounds the run (a first
build of the CUDA extension took 11 s on a 2-core VM; gpu/run_all.sh builds it once and runs this script after the
op-1 one).

    PYTHONPATH=$PWD TORCH_CUDA_ARCH_LIST=9.0 python3 gpu/check_inverse_rope_group_quant.py --out $OUT

Sections
  build        fusedrope.cuda_ext.build() (the whole fusedrope_cuda extension), which backend "auto" picks
  correctness  CUDA backend vs fusedrope.reference (on the GPU) over the seed matrix ((H, G) = (16, 2), (8,
               1); several S; group 32/64/128/256; both scale layouts) plus dtype / stride / alignment /
               clamping / NaN-Inf cases: scale bytes bit-exact, fp8 within 1 ulp (and the count of fp8 bytes
               that differ at all: expected 0, since the hardware cvt.rn.satfinite is the reference's RNE +
               clamp); outputs poisoned first so unwritten bytes fail, inside guard bytes that must stay
               untouched; a few cases also against the CPU reference
  graph        CUDA-graph capture + replay equals eager, also after new data is copied into the inputs
  bench        fusedrope.benchmark: the copy roofline, then measure() of the cuda, triton and unfused
               (fusedrope.baseline) contenders over the seed's S axis for (H, G) = (16, 2) and (8, 1), its
               group-size axis (32/64/128 at S = 2048, 8192) and column-major scales, in priority order until
               the deadline; per call (CUDA events) and device time (CUDA-graph replay) over input sets
               rotated beyond the L2 (at most --max-sets); TB/s by the seed's byte count and as a fraction of
               the copy
  sanitize     re-runs this script with --sanitize-subset under `compute-sanitizer --tool memcheck` with
               PYTORCH_NO_CUDA_MEMORY_CACHING=1 (so each tensor is its own allocation and an overrun is seen);
               the bench starts no config within SANITIZE_RESERVE_S + TRITON_SUBSET_RESERVE_S of the deadline
               to leave it the time (when compute-sanitizer is there)
  sweep        the launch floors (trivial kernels, a copy, a position -> row gather), then cuda with 1 / 2
               chunks per thread and tail warps forced and automatic, triton and unfused at small S (graph replay
               and the profiler's kernel time), then 1 / 2 chunks per thread, tail warps and the generic kernel at
               larger S (section_sweep); --skip-sweep skips it
  correctness_triton  the Triton backend on the small subset, for the record (skipped when time is spent)

Outputs under --out, rewritten after every section: results.json (everything: machine_info, per-case results,
bench rows, errors), bench.csv (fusedrope.bench_report.write_csv), bench.md (the engine's seed and contender
tables, one set per scale layout); the seed tables are printed last.

--cpu-selftest runs the correctness machinery on the CPU with the reference backend (tiny shapes) and the
bench section on two tiny configs (the reference backend on the wall clock; the GPU contenders skipped with
their reasons), and writes the output files, so the script's plumbing can be checked without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fusedrope  # noqa: E402
from fusedrope import benchmark as B  # noqa: E402
from fusedrope.benchmark import report  # noqa: E402
from fusedrope.benchmark import timing  # noqa: E402
from fusedrope import reference as ref  # noqa: E402
from fusedrope.inverse_rope_group_quant import cuda as cuda_inverse_rope_quant  # noqa: E402
from fusedrope.inverse_rope_group_quant import empty_quant_outputs  # noqa: E402
from fusedrope.testing import (QUANT_HEAD_GROUPS, QUANT_SEQ_LENS, QuantCase, assert_quant_close,  # noqa: E402
                               bytes_written_outside, deepseek_rope_cache, guarded_poison, poison_like,
                               rope_blocks, scale_bytes, ulp_diff)
import raw_rejects  # noqa: E402  (gpu/raw_rejects.py, beside this script)
from memcheck import CUT, cut_clean, cut_reason, find_sanitizer, run_memcheck  # noqa: E402  (gpu/memcheck.py, beside this script)

HEAD_GROUPS = QUANT_HEAD_GROUPS
BENCH_CONTENDERS = ("cuda", "triton", "unfused")
SANITIZE_RESERVE_S = 60  # kept from the bench for compute-sanitizer (the bench also leaves the Triton subset its 20 s)
TRITON_SUBSET_RESERVE_S = 20
SWEEP_RESERVE_S = 15  # kept from compute-sanitizer for the sweep when there is time for both (the sweep took 8 s)
NO_SANITIZER = "compute-sanitizer not found"
T_START = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T_START:6.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------ helpers
def make_inputs(S, H, *, device, dtype=torch.bfloat16, cache_dtype=torch.float32, max_pos=4096, seed=0,
                pos_dtype=torch.int64, pos_stride=1, cache_offset=0, o_offset=0, out_of_range=False):
    """o [S, H, 512] with per-(token, head) magnitudes over ~40 binades; positions (optionally strided, or
    with values outside [0, max_pos) that the kernel must clamp); cos/sin as views of one combined cache: with
    ``cache_offset=0`` the DeepSeek layout ``[max_pos, 64]`` (16-byte aligned rows), else rows shifted off
    alignment (the kernel's narrow cache loads); o optionally at an element offset inside a bigger buffer
    (2-byte aligned: the narrow o loads)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dev = torch.device(device)
    mag = torch.exp2(torch.randint(-30, 10, (S, H, 1), generator=g).float())
    o_val = (torch.randn(S, H, 512, generator=g) * mag).to(dtype)
    buf = torch.empty(S * H * 512 + o_offset, dtype=dtype, device=dev)
    o = buf[o_offset:].view(S, H, 512)
    o.copy_(o_val)
    lo, hi = (-7, max_pos + 7) if out_of_range else (0, max_pos)
    positions = torch.randint(lo, hi, (S * pos_stride,), generator=g).to(pos_dtype).to(dev)[::pos_stride]
    cos, sin = deepseek_rope_cache(max_pos, 64, dtype=cache_dtype)
    k = cache_offset
    width = 64 if k == 0 else 64 + 2 * k + 1
    big = torch.zeros(max_pos, width, dtype=cache_dtype, device=dev)
    c0, s0 = (0, 32) if k == 0 else (k, 2 * k + 33)
    big[:, c0:c0 + 32] = cos.to(dev)
    big[:, s0:s0 + 32] = sin.to(dev)
    return o, positions, big[:, c0:c0 + 32], big[:, s0:s0 + 32]


def fp8_stats(x, xr):
    """(#bytes that differ, max ulp distance) between two fp8 tensors."""
    nb = int((x.view(torch.uint8) != xr.view(torch.uint8)).sum())
    d = ulp_diff(x, xr)
    return nb, int(d.max()) if d.numel() else 0


def run_case(backend, o, p, c, s, G, q, transpose, *, fp8_dtype=torch.float8_e4m3fn,
             scale_dtype=torch.float8_e8m0fnu, x_offset=0, scale_pad=0, cpu_reference=False, chunks_per_thread=None,
             tail_warps=0, block_threads=0):
    """Run ``backend`` into poisoned buffers inside poisoned guard bytes (compute-sanitizer misses a write into
    the caching allocator's slack) and compare with the reference. Returns a result dict. ``chunks_per_thread``
    (1 or 2), ``tail_warps`` (0 or 1) and ``block_threads`` (0 = automatic): the raw CUDA op with that launch
    shape forced, instead of the public function."""
    x0, s0 = empty_quant_outputs(o, G, q, transpose, fp8_dtype=fp8_dtype, scale_dtype=scale_dtype)
    # x_offset: caller-provided x_fp8 that is contiguous but not 16-byte aligned
    x, x_buf = guarded_poison(x0.shape, fp8_dtype, o.device, lead=64 + x_offset)
    # scale_pad: a column-major x_scale whose token dim is padded (strides (1, Ks*L, L), L = S + scale_pad)
    S, _, ks = s0.shape
    strides = (1, ks * (S + scale_pad), S + scale_pad) if scale_pad else s0.stride()
    # 0xA5, not 0xFF: that is a legitimate scale byte (NaN block)
    sc, sc_buf = guarded_poison(s0.shape, scale_dtype, o.device, strides, byte=0xA5)
    if chunks_per_thread is None:
        fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, transpose, x, sc, backend=backend)
    else:
        cuda_inverse_rope_quant.inverse_rope_group_quant_config(o, p, c, s, x, sc, q,
                                                                chunks_per_thread=chunks_per_thread,
                                                                tail_warps=tail_warps, block_threads=block_threads)
    xr, sr = poison_like(x0), poison_like(s0, 0xA5)
    if cpu_reference:
        xr_c, sr_c = empty_quant_outputs(o.cpu(), G, q, transpose, fp8_dtype=fp8_dtype,
                                         scale_dtype=scale_dtype)
        ref.inverse_rope_group_quant(o.cpu(), p.cpu(), c.cpu(), s.cpu(), xr_c, sr_c, q)
        xr.copy_(xr_c)
        sr.copy_(sr_c)
    else:
        ref.inverse_rope_group_quant(o, p, c, s, xr, sr, q)
    scale_equal = torch.equal(scale_bytes(sc), scale_bytes(sr))
    nb, max_ulp = fp8_stats(x, xr)
    stray = bytes_written_outside(x_buf, x) + bytes_written_outside(sc_buf, sc, 0xA5)
    S, H, D = o.shape
    try:  # the whole contract: scales exact, fp8 within 1 ulp, plain blocks exact, rope blocks rounded but for ties
        assert_quant_close(x, sc, xr, sr, rope_blocks(QuantCase(S, H, G, D, 2 * c.shape[1], q)))
        contract = "ok"
    except AssertionError as e:
        contract = str(e).strip()
    ok = stray == 0 and contract == "ok"  # the contract holds scale_equal and max_ulp <= 1
    return {"ok": bool(ok), "scale_bit_exact": bool(scale_equal), "fp8_bytes_differ": nb,
            "fp8_max_ulp": max_ulp, "guard_bytes_written": stray, "contract": contract}


def correctness_cases(subset: bool):
    """(name, kwargs for make_inputs, run kwargs) tuples."""
    cases = []
    seqs = (1, 3, 33) if subset else (1, 8, 33, 128, 1024)
    groups = (32, 128) if subset else (32, 64, 128, 256)
    for name, (H, G) in HEAD_GROUPS.items():
        for S in seqs:
            for q in groups:
                for t in (False, True):
                    cases.append((f"{name}-S{S}-g{q}-{'col' if t else 'row'}", dict(S=S, H=H, seed=S * 7 + q),
                                  dict(G=G, q=q, transpose=t)))
    extra = [
        ("fp16-o-bf16-cache-int32-strided-pos",
         dict(S=37, H=16, dtype=torch.float16, cache_dtype=torch.bfloat16, pos_dtype=torch.int32,
              pos_stride=3),
         dict(G=2, q=64, transpose=False)),
        ("fp16-cache-out-of-range-pos", dict(S=29, H=8, cache_dtype=torch.float16, out_of_range=True),
         dict(G=1, q=128, transpose=True)),
        ("unaligned-cache-rows", dict(S=21, H=16, cache_dtype=torch.bfloat16, cache_offset=3),
         dict(G=2, q=32, transpose=False)),
        ("unaligned-fp32-cache-rows", dict(S=21, H=8, cache_dtype=torch.float32, cache_offset=1),
         dict(G=4, q=256, transpose=True)),
        ("unaligned-o", dict(S=19, H=16, o_offset=1), dict(G=2, q=128, transpose=False)),
        ("unaligned-x_fp8", dict(S=19, H=16), dict(G=2, q=128, transpose=True, x_offset=3)),
        ("uint8-scale", dict(S=17, H=16), dict(G=2, q=128, transpose=True, scale_dtype=torch.uint8)),
        ("float32-scale", dict(S=17, H=8), dict(G=1, q=32, transpose=False, scale_dtype=torch.float32)),
        ("odd-heads-H3-G3", dict(S=11, H=3), dict(G=3, q=64, transpose=False)),
        ("many-groups-H16-G16", dict(S=9, H=16), dict(G=16, q=256, transpose=True)),
        ("padded-col-scale", dict(S=13, H=16), dict(G=2, q=64, transpose=True, scale_dtype=torch.float32,
                                                    scale_pad=3)),
    ]
    if subset:
        extra = [e for e in extra if e[0] in ("unaligned-o", "unaligned-x_fp8", "unaligned-cache-rows",
                                              "float32-scale", "fp16-cache-out-of-range-pos", "padded-col-scale")]
    return cases + extra


def nan_inf_case(device, backend):
    o, p, c, s = make_inputs(6, 16, device=device, seed=5)
    o[0, 0, 3] = float("nan")
    o[1, 5, 500] = float("inf")   # rope tail
    o[2, 9, 130] = float("-inf")
    o[3, 2, 0:128] = 0.0
    r = {}
    for q in (32, 128):
        for t in (False, True):
            r[f"g{q}-{'col' if t else 'row'}"] = run_case(backend, o, p, c, s, 2, q, t)
    return r


# ------------------------------------------------------------------------------------------------ sections
def section_build(res):
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    from fusedrope import cuda_ext, jit_ext

    t = time.time()
    # FUSEDROPE_NO_BUILD (run_all.sh sets it when its build failed): load a cached build, never compile again
    path = cuda_ext.build() if jit_ext.builds_allowed() else cuda_ext.load()
    res["seconds"] = round(time.time() - t, 1)
    res["library"] = path
    res["op_registered"] = hasattr(torch.ops.fusedrope_cuda, "inverse_rope_group_quant_out")
    o, p, c, s = make_inputs(4, 16, device="cuda")
    res["explain"] = str(fusedrope.explain("inverse_rope_group_quant", o, p, c, s, 2))
    log(f"build: {res['seconds']} s, {path}")


def empty_direct_case(device):
    """The raw CUDA op with S == 0 or H == 0 and plain empty buffers: returns without a launch or an error."""
    op = torch.ops.fusedrope_cuda.inverse_rope_group_quant_out
    c = torch.zeros(8, 32, device=device)
    out = {}
    for S, H in ((0, 16), (3, 0)):
        o = torch.zeros(S, H, 512, dtype=torch.bfloat16, device=device)
        dg = H * 512 // 2
        x = torch.empty(S, 2, dg, dtype=torch.float8_e4m3fn, device=device)
        sc = torch.empty(S, 2, dg // 128, dtype=torch.uint8, device=device)
        try:
            op(o, torch.zeros(max(S, 1), dtype=torch.long, device=device), c, c, x, sc, 128)
            torch.cuda.synchronize(device)
            out[f"S{S}-H{H}"] = {"ok": True}
        except Exception as e:  # noqa: BLE001
            out[f"S{S}-H{H}"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return out


def pdl_after_writer_case(device, rounds: int = 5, S: int = 4096, tail: int = 128) -> dict:
    """The raw CUDA op as a programmatic dependent launch (pdl=1) that reads what the kernel before it writes: a
    plain call quantises S tokens, and lets a dependent grid launch once its last blocks have issued their loads,
    before their stores (griddepcontrol.launch_dependents); then a small pdl=1 call takes the bytes of the first
    call's last ``tail`` tokens of x_fp8 (what its last blocks store), viewed as bf16 (tail/2 tokens), as its o.
    Both are queued behind a GPU sleep, so the second launches while the first still stores: its outputs meet the
    contract against the reference on what the first wrote (scales exact, fp8 within 1 ulp) only if it waited
    (griddepcontrol.wait). Each round negates the first call's o, which flips the sign bits of every fp8 byte it
    writes, so a read of the round before's bytes fails too. A note, not a failure, below sm_90, where pdl is
    refused."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (9, 0):
        return {"ok": True, "skipped": "a programmatic dependent launch needs sm_90 or newer"}
    H, G, q = 16, 2, 128
    o, p, c, s = make_inputs(S, H, device=device, seed=77)
    x, sc = empty_quant_outputs(o, G, q, False)
    x.view(torch.uint8).fill_(0x11)  # not a freed buffer's bytes, which may hold what the first round writes
    # the second call's o: the fp8 bytes of the first call's last tokens (no NaN or Inf as bf16: the fp8 bytes
    # are never 0x7F / 0xFF, so a bf16 exponent field is at most 253)
    o2 = x[S - tail:].view(torch.bfloat16).view(tail // 2, H, 512)
    p2 = p[:tail // 2]
    x2, sc2 = empty_quant_outputs(o2, G, q, False)
    xr, sr = empty_quant_outputs(o2, G, q, False)
    blocks = rope_blocks(QuantCase(tail // 2, H, G, 512, 64, q))
    differ = 0
    try:
        for _ in range(rounds):
            o.neg_()
            x2.view(torch.uint8).fill_(0xA5)
            sc2.view(torch.uint8).fill_(0xA5)
            if dev.type == "cuda":
                torch.cuda._sleep(2_000_000)  # ~1 ms: both calls below are queued before the first one runs
            cuda_inverse_rope_quant.inverse_rope_group_quant_config(o, p, c, s, x, sc, q, pdl=0)
            cuda_inverse_rope_quant.inverse_rope_group_quant_config(o2, p2, c, s, x2, sc2, q, pdl=1)
            ref.inverse_rope_group_quant(o2, p2, c, s, xr, sr, q)
            try:  # not byte equality: a rope element may round the other way at a tie
                assert_quant_close(x2, sc2, xr, sr, blocks)
            except AssertionError:
                differ += 1
        return {"ok": differ == 0, "rounds": rounds, "rounds_differing": differ}
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def raw_reject_cases() -> dict:
    """Bad inputs to the raw CUDA op (they reach it only through misuse): each must raise, not crash. Most
    messages hold integers (the kind that crashed op 1's raw op on the H200 at 63f6bd6)."""
    from fusedrope import cuda_ext

    cuda_ext.load()
    op = torch.ops.fusedrope_cuda.inverse_rope_group_quant_out
    S, H, G, q = 4, 16, 2, 128
    o, p, c, s = make_inputs(S, H, device="cuda")
    dg = H * 512 // G
    x = torch.empty(S, G, dg, dtype=torch.float8_e4m3fn, device="cuda")
    sc = torch.empty(S, G, dg // q, dtype=torch.uint8, device="cuda")
    o256 = o[..., :256].contiguous()
    return {"fp32_o": lambda: op(o.float(), p, c, s, x, sc, q),
            "cpu_positions": lambda: op(o, p.cpu(), c, s, x, sc, q),
            "head_dim_256": lambda: op(o256, p, c, s, x[..., :dg // 2], sc[..., :dg // 2 // q], q),
            "group_48": lambda: op(o, p, c, s, x, sc, 48),
            "positions_short": lambda: op(o, p[:2], c, s, x, sc, q),
            "x_scale_shape": lambda: op(o, p, c, s, x, sc[:, :, :1], q),
            "x_scale_tokens_overlapping": lambda: op(o, p, c, s, x, sc.as_strided(sc.shape, (0, dg // q, 1)), q),
            "x_scale_column_lead_short": lambda: op(o, p, c, s, x, sc.as_strided(sc.shape, (1, dg // q * 2, 2)),
                                                    q),
            "chunks_per_thread_3": lambda: torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config(
                o, p, c, s, x, sc, q, 3),
            "tail_warps_with_2_chunks": lambda: torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config(
                o, p, c, s, x, sc, q, 2, 1),
            "block_threads_48": lambda: torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config(
                o, p, c, s, x, sc, q, 0, 0, 48),
            "pdl_2": lambda: torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config(
                o, p, c, s, x, sc, q, 0, 0, 0, 2)}


def section_correctness(res, device, backend, subset=False, cpu_reference_every=0):
    cases = correctness_cases(subset)
    fails = []
    for i, (name, mk, run) in enumerate(cases):
        try:
            o, p, c, s = make_inputs(device=device, **mk)
            on_cpu = bool(cpu_reference_every) and i % cpu_reference_every == 0 and mk["S"] <= 128
            r = run_case(backend, o, p, c, s, cpu_reference=on_cpu, **run)
            r["cpu_reference"] = on_cpu
        except Exception as e:  # noqa: BLE001
            r = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        res.setdefault("cases", {})[name] = r
        if not r["ok"]:
            fails.append(name)
    try:
        res["nan_inf"] = nan_inf_case(device, backend)
        if not all(v["ok"] for v in res["nan_inf"].values()):
            fails.append("nan_inf")
    except Exception as e:  # noqa: BLE001
        res["nan_inf"] = {"error": f"{type(e).__name__}: {e}"}
        fails.append("nan_inf")
    extra = 0  # checks beyond the case list and nan_inf
    if backend == "cuda":  # each forced launch shape: 1 or 2 chunks per thread, the tail warps (tw), block size
        # (and the cache dtype: bf16, with bf16 o, takes the fast bf16-cache kernel the large-S sweep times)
        f32, b16 = torch.float32, torch.bfloat16
        for S, H, G, q, u, tw, bt, cd in ((3, 16, 2, 128, 2, 0, 0, f32), (3, 16, 2, 32, 1, 0, 0, f32),
                                          (300, 16, 2, 64, 1, 0, 0, f32), (300, 8, 1, 256, 2, 0, 0, f32),
                                          (3, 16, 2, 128, 1, 1, 0, f32), (5, 8, 1, 32, 1, 1, 0, f32),
                                          (300, 16, 2, 64, 1, 1, 0, f32), (301, 8, 1, 256, 1, 1, 0, f32),
                                          (3, 16, 2, 128, 1, 0, 32, f32), (300, 16, 2, 64, 2, 0, 96, f32),
                                          (5, 8, 1, 32, 1, 1, 64, f32), (1, 16, 2, 128, 1, 0, 256, f32),
                                          (300, 16, 2, 128, 1, 0, 0, b16), (33, 8, 1, 32, 1, 1, 0, b16)):
            name = (f"forced_chunks_per_thread{u}{'_tail_warps' if tw else ''}{f'_block{bt}' if bt else ''}"
                    f"{'_bf16_cache' if cd is b16 else ''}-S{S}-H{H}-G{G}-g{q}")
            try:
                o, p, c, s = make_inputs(S, H, device=device, seed=S + u + tw, cache_dtype=cd)
                r = run_case(backend, o, p, c, s, G, q, False, chunks_per_thread=u, tail_warps=tw,
                             block_threads=bt)
            except Exception as e:  # noqa: BLE001
                r = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            res.setdefault("cases", {})[name] = r
            if not r["ok"]:
                fails.append(name)
            extra += 1
        res["empty_direct"] = empty_direct_case(device)
        if not all(v["ok"] for v in res["empty_direct"].values()):
            fails.append("empty_direct")
        res["pdl_after_writer"] = pdl_after_writer_case(device)
        if not res["pdl_after_writer"]["ok"]:
            fails.append("pdl_after_writer")
        extra += 1
        res["raw_rejects"] = {name: {"ok": ok, "detail": detail} for name, ok, detail in
                              raw_rejects.checks(os.path.abspath(__file__), list(raw_reject_cases()))}
        fails += [f"raw_rejects/{n}" for n, v in res["raw_rejects"].items() if not v["ok"]]
        extra += 1 + len(res["raw_rejects"])
    if device != "cpu":  # an asynchronous error of a case above (sticky: every later call fails) is reported here
        try:
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            res["sync_error"] = f"{type(e).__name__}: {e}"[:500]
            fails.append("sync_error")
    n = len(cases) + 1 + extra
    res["n_cases"] = n
    res["failed"] = fails
    res["fp8_bytes_differ_total"] = sum(v.get("fp8_bytes_differ", 0) for v in res["cases"].values())
    log(f"correctness[{backend}]: {n - len(fails)}/{n} cases ok, "
        f"{res['fp8_bytes_differ_total']} fp8 bytes differ from the reference"
        + (f"; FAILED: {fails}" if fails else ""))


def section_sanitize(res, budget_s: float):
    cs = find_sanitizer()
    if cs is None:
        res["skipped"] = NO_SANITIZER
        log(f"sanitize: skipped ({NO_SANITIZER})")
        return
    if budget_s < 30:
        res["skipped"] = f"time budget spent ({budget_s:.0f} s left for it)"
        log(f"sanitize: skipped ({res['skipped']})")
        return
    sub_out = Path(tempfile.mkdtemp(prefix="irgq_sanitize_"))  # not under --out: $OUT holds 8 files at most
    try:
        mc = run_memcheck(cs, [sys.executable, str(Path(__file__).resolve()), "--sanitize-subset", "--out",
                               str(sub_out)], budget_s, error_exitcode=17, print_limit=20)
        res["command"], res["reported"] = mc["command"], mc["reported"]
        if mc["returncode"] == "timeout":
            res["timeout_s"] = budget_s
            res["tail"] = mc["text"][-2000:]
            if cut_clean(mc):  # no verdict: shown as cut short, neither passed nor failed
                res["skipped"] = cut_reason(budget_s)
            log(f"sanitize: timed out after {res['timeout_s']:.0f} s, {mc['reported']} memory errors reported")
            return
        res["returncode"], res["errors"], res["tail"] = mc["returncode"], mc["errors"], mc["text"][-3000:]
        sub = sub_out / "results.json"
        if sub.exists():
            sections = json.loads(sub.read_text()).get("sections", {})
            res["subset"] = sections.get("correctness", {}).get("failed")
        log(f"sanitize: rc={res['returncode']}, memcheck errors={res['errors']}, "
            f"subset failures={res.get('subset')}")
    finally:
        shutil.rmtree(sub_out, ignore_errors=True)


def section_graph(res, backend="cuda"):
    results = {}
    for (H, G, S, q, t) in ((16, 2, 1024, 128, False), (8, 1, 333, 32, True)):
        o, p, c, s = make_inputs(S, H, device="cuda", seed=11)
        x_e, s_e = empty_quant_outputs(o, G, q, t)
        fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, t, x_e, s_e, backend=backend)
        x_g, s_g = poison_like(x_e), poison_like(s_e)
        # warm up (and compile) outside the capture
        fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, t, x_g, s_g, backend=backend)
        x_g, s_g = poison_like(x_e), poison_like(s_e)
        graph = torch.cuda.CUDAGraph()
        # capture_graph restores the stream after a failed capture and raises the call's own error
        timing.capture_graph(graph, lambda i: fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, t, x_g, s_g,
                                                                            backend=backend), 1)
        graph.replay()
        torch.cuda.synchronize()
        same1 = torch.equal(x_g.view(torch.uint8), x_e.view(torch.uint8)) and torch.equal(
            s_g.view(torch.uint8), s_e.view(torch.uint8))
        o2, p2, _, _ = make_inputs(S, H, device="cuda", seed=12)
        o.copy_(o2)
        p.copy_(p2)
        graph.replay()
        fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, t, x_e, s_e, backend=backend)
        torch.cuda.synchronize()
        same2 = torch.equal(x_g.view(torch.uint8), x_e.view(torch.uint8)) and torch.equal(
            s_g.view(torch.uint8), s_e.view(torch.uint8))
        results[f"H{H}-G{G}-S{S}-g{q}-{'col' if t else 'row'}"] = {"replay_equals_eager": bool(same1),
                                                                   "after_new_inputs": bool(same2)}
    res["cases"] = results
    res["ok_all"] = all(v["replay_equals_eager"] and v["after_new_inputs"] for v in results.values())
    log(f"graph[{backend}]: replay identical to eager: {res['ok_all']}")



SWEEP_S = (1, 8, 32, 64, 128, 256, 512)
SWEEP_SETS = 100  # input sets per sweep point (the small points fit in the L2 anyway)
# the larger points: the forced launch shapes only (1 and 2 chunks per thread, tail warps, and 1 with 16-bit
# caches: the generic kernel and the fast bf16-cache one), inputs rotating beyond the L2 as in the bench
SWEEP_LARGE = tuple((S, H, G, 128) for H, G in HEAD_GROUPS.values() for S in (1024, 2048, 4096, 8192, 16384)) + (
    (8192, 16, 2, 32),)


def us(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def ratio(a, b) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def kernel_time(res, call, n):
    """``timing.time_kernels_us`` rounded, or (None, None) with the profiler's error recorded once in ``res``:
    the graph-replay numbers of the sweep do not depend on the profiler working on this machine."""
    if res.get("kernel_time_error"):
        return None, None
    try:
        return tuple(round(v, 3) for v in timing.time_kernels_us(call, n))
    except Exception as e:  # noqa: BLE001
        res["kernel_time_error"] = f"{type(e).__name__}: {e}"[:300]
        log(f"  profiler kernel time unavailable: {res['kernel_time_error']}")
        return None, None


def graph_time(record: dict, name: str, call, n: int, reps: int):
    """``timing.time_graph_us`` rounded, or None with the error kept under ``record["errors"][name]`` (e.g. a
    programmatic dependent launch the runtime will not capture): one failed timing leaves its cell "-"."""
    try:
        return round(timing.time_graph_us(call, n, reps), 3)
    except RuntimeError as e:
        record.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:300]
        return None


def launch_floor(res, reps: int = 5, device: str = "cuda") -> dict:
    """What one and two trivial kernels (a 1-element fill) cost per call, by graph replay and by the profiler's
    kernel time: the floor under any fused kernel, and under the two-kernel unfused baseline, on this GPU. Then
    two one-kernel floors with loads, at op 2's S = 1, (16, 2) sizes: ``copy`` (``neg`` of o's 16 KiB into another
    buffer: an elementwise kernel, one level of loads before the stores; a plain ``copy_`` would be a memcpy node,
    not a kernel) and ``gather`` (``index_select`` of one fp32 cos row by a position: a load whose address needs
    an earlier load, the position -> cos/sin chain of op 2's rope tail)."""
    t = torch.zeros(2, device=device)
    src, dst = torch.randn(16 * 512, device=device).bfloat16(), torch.empty(16 * 512, device=device).bfloat16()
    cache, rows = torch.randn(4096, 32, device=device), torch.empty(1, 32, device=device)
    pos = torch.randint(0, 4096, (1,), device=device)
    calls = {"one": lambda i: t[:1].fill_(1.0),
             "two": lambda i: (t[:1].fill_(1.0), t[1:].fill_(2.0)),
             "copy": lambda i: torch.neg(src, out=dst),
             "gather": lambda i: torch.index_select(cache, 0, pos, out=rows)}
    out = {}
    for name, call in calls.items():
        out[f"{name}_graph_us"] = graph_time(out, name, call, SWEEP_SETS, reps)
        out[f"{name}_kernel_us"] = kernel_time(res, call, SWEEP_SETS)[0]
    return out


def section_sweep(res, deadline: float, reps: int = 5, device: str = "cuda"):
    """At small S (SWEEP_S) for both seed (H, G), group 128, row-major scales: device time (graph replay) of the
    CUDA kernel's automatic launch (one chunk per thread, blocks spread over the SMs when the grid is small), of
    the same with 256-thread blocks forced (the launch before the spreading), with 2 chunks per thread and with
    tail warps, and as a programmatic dependent launch (pdl=1: in the replayed graph each call may start while
    the one before finishes; data for the launcher's choices), of the fused Triton kernel and of the unfused
    baseline; and the kernel time from the profiler of the first two and the last two (the op-2 seed's method:
    kernel durations summed, launch gaps not counted). A launch shape whose graph capture or replay fails is
    recorded as None, with its error under the row's "errors".
    First the launch floors (:func:`launch_floor`): how close to one kernel's floor the fused kernels are. Then
    the larger points (SWEEP_LARGE): the three forced launch shapes only, on the bench's input sets (one chunk per
    thread takes the fast-layout kernel of the fp32 cache, two the generic kernel), and one chunk per thread with
    16-bit copies of the cos/sin cache: fp16 ("gen"), which takes the generic kernel (the one that reads the
    layout per call), and bf16 ("b16"), which takes the fast bf16-cache kernel. The two read the same bytes and
    convert alike, so b16 against gen is what the fast kernels gained."""
    from fusedrope.benchmark.unfused import unfused_inverse_rope_group_quant

    res["floor"] = launch_floor(res, reps, device)
    f = res["floor"]
    log(f"  launch floor: one kernel {us(f.get('one_graph_us'))} us graph / {us(f.get('one_kernel_us'))} us kernel "
        f"time; two kernels {us(f.get('two_graph_us'))} / {us(f.get('two_kernel_us'))}; a copy (neg) of o at S = 1 "
        f"{us(f.get('copy_graph_us'))} / {us(f.get('copy_kernel_us'))}; a position -> row gather "
        f"{us(f.get('gather_graph_us'))} / {us(f.get('gather_kernel_us'))}")
    rows = res["rows"] = []
    for H, G in HEAD_GROUPS.values():
        for S in SWEEP_S:
            if time.time() > deadline:
                res["skipped"] = f"deadline reached before (H, G) = ({H}, {G}), S = {S}"
                return
            o, p, c, s = make_inputs(S, H, device=device, seed=S)
            sets = [(o.clone(), p.clone(), c, s, *empty_quant_outputs(o, G, 128, False))
                    for _ in range(SWEEP_SETS)]
            row = {"S": S, "H": H, "G": G}

            def config_call(u, tw=0, block=0, pdl=0):
                def call(i):
                    o, p, c, s, x, sc = sets[i % len(sets)]
                    torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config(o, p, c, s, x, sc, 128, u, tw,
                                                                                 block, pdl)
                return call

            def api_call(fn, **kw):
                def call(i):
                    o, p, c, s, x, sc = sets[i % len(sets)]
                    fn(o, p, c, s, G, 128, x_fp8=x, x_scale=sc, **kw)
                return call

            calls = {"cpt0": config_call(0), "b256": config_call(1, 0, 256), "cpt2": config_call(2),
                     "tw": config_call(1, 1), "pdl": config_call(0, 0, 0, 1),
                     "triton": api_call(fusedrope.inverse_rope_group_quant, backend="triton"),
                     "unfused": api_call(unfused_inverse_rope_group_quant)}
            for name, call in calls.items():
                row[f"us_{name}"] = graph_time(row, name, call, len(sets), reps)
            for name in ("cpt0", "b256", "triton", "unfused"):
                row[f"kernel_us_{name}"], row[f"kernels_{name}"] = kernel_time(res, calls[name], len(sets))
            rows.append(row)
            log(f"  sweep S{S}-H{H}-G{G}: cuda auto {us(row['us_cpt0'])} us (256-thread blocks "
                f"{us(row['us_b256'])}, 2 chunks/thread {us(row['us_cpt2'])}, tail warps {us(row['us_tw'])}, "
                f"pdl {us(row['us_pdl'])}), "
                f"triton {us(row['us_triton'])}, unfused {us(row['us_unfused'])}; kernel time cuda "
                f"{us(row['kernel_us_cpt0'])} (256-thread blocks {us(row['kernel_us_b256'])}), "
                f"triton {us(row['kernel_us_triton'])}, unfused {us(row['kernel_us_unfused'])}")
    large = res["large_rows"] = []
    dev = torch.device(device)
    for S, H, G, q in SWEEP_LARGE:
        if time.time() > deadline:
            res["skipped"] = f"deadline reached before the large S point S = {S}, (H, G) = ({H}, {G}), group {q}"
            return
        case = QuantCase(S, H, G, quant_group_size=q)
        big = B.quant_sets(case, B.num_sets(B.input_bytes(B.QUANT, case), dev, 200), dev)
        row = {"S": S, "H": H, "G": G, "q": q, "n_sets": len(big)}
        caches = {"gen": torch.float16, "b16": torch.bfloat16}  # every set shares the cache
        caches = {k: (big[0][2].to(dt), big[0][3].to(dt)) for k, dt in caches.items()}
        for name, u, tw in (("cpt1", 1, 0), ("cpt2", 2, 0), ("tw", 1, 1), ("gen", 1, 0), ("b16", 1, 0)):
            def call(i, u=u, tw=tw, big=big, q=q, cache=caches.get(name)):
                o, p, c, s, x, sc, _ = big[i % len(big)]
                if cache:
                    c, s = cache
                torch.ops.fusedrope_cuda.inverse_rope_group_quant_out_config(o, p, c, s, x, sc, q, u, tw)
            row[f"us_{name}"] = graph_time(row, name, call, len(big), reps)
        large.append(row)
        big = None  # freed before the next point's inputs are made
        log(f"  sweep S{S}-H{H}-G{G}-g{q}: 1 chunk/thread {us(row['us_cpt1'])} us, 2 {us(row['us_cpt2'])}, "
            f"tail warps {us(row['us_tw'])}; fp16 cache (generic kernel) {us(row['us_gen'])}, bf16 cache (fast) "
            f"{us(row['us_b16'])}")


def sweep_table(res) -> str:
    rows = res.get("rows") or []
    if not rows:
        return ""
    out = ["", "## At small S: cuda launch shapes, triton, unfused (group 128, row-major scale)", "",
           "Device us from graph replay, and kernel us (the profiler's summed kernel durations, the op-2 seed's "
           "method); speedup = unfused / cuda automatic (auto / pdl: what a dependent launch gains against "
           "the same launch without it; 256 / auto: what the automatic block size gained). Every cuda column "
           "but the 256-thread one takes the automatic block size (fewer threads per block when 256-thread "
           "blocks would leave SMs idle); pdl: a programmatic dependent launch, each replayed call may start "
           "while the one before finishes.", ""]
    f = res.get("floor")
    if f:
        out += [f"Launch floor: one trivial kernel {us(f.get('one_graph_us'))} us by graph replay, "
                f"{us(f.get('one_kernel_us'))} us kernel time; two {us(f.get('two_graph_us'))} / "
                f"{us(f.get('two_kernel_us'))} us. "
                f"One kernel with loads, at S = 1 sizes: a copy (neg) of o {us(f.get('copy_graph_us'))} / "
                f"{us(f.get('copy_kernel_us'))} us; a position -> cos row gather (a load whose address needs an "
                f"earlier load) {us(f.get('gather_graph_us'))} / {us(f.get('gather_kernel_us'))} us.", ""]
    out += ["| S | H | G | cuda automatic | 256-thread blocks | 2 chunks / thread | tail warps | pdl | triton "
            "| unfused | speedup | auto / pdl | 256 / auto | cuda kernel us | 256-thread blocks kernel us "
            "| triton kernel us | unfused kernel us | kernel-time speedup |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["S"], r["H"], r["G"]] + [us(r.get(f"us_{k}"))
                                            for k in ("cpt0", "b256", "cpt2", "tw", "pdl", "triton", "unfused")]
        cells += [ratio(r["us_unfused"], r["us_cpt0"]), ratio(r["us_cpt0"], r.get("us_pdl")),
                  ratio(r.get("us_b256"), r["us_cpt0"])]
        cells += [us(r.get(f"kernel_us_{k}")) for k in ("cpt0", "b256", "triton", "unfused")]
        cells += [ratio(r["kernel_us_unfused"], r["kernel_us_cpt0"])]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    large = res.get("large_rows") or []
    if large:
        out += ["", "Larger S (inputs rotating beyond the L2): device us by graph replay", "",
                "| S | H | G | group | sets | 1 chunk / thread | 2 chunks / thread | 2 over 1 | tail warps "
                "| 1 over tail warps | fp16 cache: generic kernel | bf16 cache: fast kernel | generic over fast |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['S']} | {r['H']} | {r['G']} | {r['q']} | {r['n_sets']} | {us(r.get('us_cpt1'))} "
                f"| {us(r.get('us_cpt2'))} | {ratio(r.get('us_cpt2'), r['us_cpt1'])} | {us(r.get('us_tw'))} "
                f"| {ratio(r['us_cpt1'], r.get('us_tw'))} | {us(r.get('us_gen'))} | {us(r.get('us_b16'))} "
                f"| {ratio(r.get('us_gen'), r.get('us_b16'))} |" for r in large]
    return "\n".join(out) + "\n"


def bench_configs():
    """(axis, (H, G) name, H, G, S, quant group, column-major scale) in priority order (the deadline cuts from
    the end): first the points issue #5's targets name ((16, 2) at S <= 32 and S >= 8192, and the group-size
    axis, group 32 included), then the rest of (16, 2) over S, (8, 1) over S, column-major scales. The rows
    are kept in table order (layout, (H, G), S, group) whatever the measuring order."""
    first = [S for S in QUANT_SEQ_LENS if S <= 32 or S >= 8192]
    cfgs = [("seq", "V4-Pro-TP8", 16, 2, S, 128, False) for S in first]
    cfgs += [("group", "V4-Pro-TP8", 16, 2, S, q, False) for S in (8192, 2048) for q in (32, 64)]
    cfgs += [("seq", "V4-Pro-TP8", 16, 2, S, 128, False) for S in QUANT_SEQ_LENS if S not in first]
    cfgs += [("seq", "V4-Flash-TP8", 8, 1, S, 128, False) for S in QUANT_SEQ_LENS]
    cfgs += [("colmajor", "V4-Pro-TP8", 16, 2, 8192, q, True) for q in (32, 128)]
    return cfgs


def section_bench(res, device: torch.device, deadline: float, configs=None, only=BENCH_CONTENDERS,
                  max_sets: int = B.MAX_SETS, reps: int = 5, after_config=lambda: None):
    """fusedrope.benchmark's copy roofline and measure() per config, until the deadline."""
    res["copy"] = B.copy_roofline(device)
    copy = res["copy"]["tbps"]
    log(f"copy roofline: {copy:.2f} TB/s (read + write; {res['copy'].get('timing', '')})")
    cl = B.contenders(B.QUANT, device, compile=False, only=only)
    res["contenders"] = [{"name": c.name, "what": c.what, "unavailable": c.reason} for c in cl]
    rows = res.setdefault("rows", [])
    for (axis, hg_name, H, G, S, q, t) in configs or bench_configs():
        case = QuantCase(S, H, G, quant_group_size=q)
        if time.time() > deadline:
            res.setdefault("skipped", []).append(f"{axis}-{case.id}{'-col' if t else ''}")
            continue
        sets = B.quant_sets(case, B.num_sets(B.input_bytes(B.QUANT, case), device, max_sets), device, t)
        rows += [dict(r, axis=axis, hg=hg_name)
                 for r in B.measure(B.QUANT, case, cl, device, reps=reps, copy_tbps=copy, sets=sets, log=log)]
        # in table order whatever the measuring order (stable: contenders keep theirs)
        rows.sort(key=lambda r: (bool(r.get("transpose_scale")), -r["num_heads"], r["num_tokens"],
                                 r["quant_group_size"]))
        del sets
        after_config()  # a run killed later keeps these rows


# ------------------------------------------------------------------------------------------------ reports
def bench_tables(rows) -> str:
    """The engine's op-2 seed tables and every-contender tables, one set per scale layout (the engine's
    tables key rows by case id, which does not hold the layout)."""
    out = []
    for t, layout in ((False, "row-major"), (True, "column-major")):
        rs = [r for r in rows if bool(r.get("transpose_scale")) == t]
        if rs:
            out.append(f"## inverse_rope_group_quant, {layout} scale (seed columns; fused = the backend auto "
                       "picks)\n\n" + report.quant_seed_tables(rs)
                       + f"\n### every contender, {layout} scale\n\n" + report.contender_tables(rs, B.QUANT))
    return "\n".join(out)


def write_reports(results, out: Path) -> str:
    """results.json, bench.csv, bench.md; returns the short summary (the row-major seed tables last)."""
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(results, out / "results.json")
    bench = results["sections"].get("bench", {})
    rows = bench.get("rows", [])
    report.write_csv(rows, out / "bench.csv")
    md = report.markdown({"meta": results["meta"], "rows": [], "copy": bench.get("copy", {})})
    (out / "bench.md").write_text(md + "\n" + bench_tables(rows)
                                  + sweep_table(results["sections"].get("sweep", {})))
    short = ["", "section      ok   notes"]
    for name, sec in results["sections"].items():
        note = sec.get("error") or sec.get("skipped") or ""
        if name.startswith("correctness") and "failed" in sec:
            note = f"{sec['n_cases'] - len(sec['failed'])}/{sec['n_cases']} ok, fp8 bytes differing: " \
                   f"{sec.get('fp8_bytes_differ_total')}" \
                   + (f", failed {sec['failed'][:4]}" if sec["failed"] else "")
        if name == "sanitize" and "errors" in sec:
            note = (f"memcheck errors {sec['errors']}, rc {sec.get('returncode')}, "
                    f"subset failures {sec.get('subset')}")
        if name == "graph" and "ok_all" in sec:
            note = f"replay == eager: {sec['ok_all']}"
        if name == "build" and "seconds" in sec:
            note = f"{sec['seconds']} s"
        if name == "bench" and rows:
            bad = sum(r.get("status") == "error" for r in rows)
            cut = len(bench.get("skipped", []))
            note = f"{len(rows)} rows, {bad} errors, {cut} configs cut by the deadline"
        short.append(f"{name:<12} {'yes' if sec.get('ok') else 'NO ':<4} {str(note)[:150]}")
    row_major = [r for r in rows if not r.get("transpose_scale")]
    if row_major:
        short += ["", f"copy {bench['copy']['tbps']:.2f} TB/s; " + report.quant_seed_tables(row_major)]
    return "\n".join(short)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_out", help="output folder")
    ap.add_argument("--sanitize-subset", action="store_true",
                    help="only the small correctness subset (what runs under compute-sanitizer)")
    ap.add_argument("--skip-sanitize", action="store_true")
    ap.add_argument("--raw-rejects", action="store_true",
                    help="(internal) bad inputs to the raw op, in a child process (a crash is one failed check)")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true",
                    help="skip the launch-shape sweep (launch floor, small S, larger S)")
    ap.add_argument("--budget-s", type=float, default=225.0,
                    help="stop starting new work after this many seconds")
    ap.add_argument("--max-sets", type=int, default=1000,
                    help="cap on rotating input sets per bench config (S = 1 stays in the L2 below 3840)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per timing (median)")
    ap.add_argument("--cpu-selftest", action="store_true",
                    help="no GPU: the correctness machinery with the reference backend on CPU tensors, and "
                         "the bench section on two tiny configs")
    args = ap.parse_args(argv)
    if args.raw_rejects:
        return raw_rejects.child(raw_reject_cases())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = T_START + args.budget_s
    dev = torch.device("cpu" if args.cpu_selftest or not torch.cuda.is_available() else "cuda")
    results = {"meta": B.machine_info(dev), "args": vars(args), "sections": {}}

    def section(name, fn, *a, **k):
        res = results["sections"].setdefault(name, {})
        try:
            fn(res, *a, **k)
            ok = True
            if name.startswith("correctness"):
                ok = not res.get("failed")
            elif name == "graph":
                ok = res.get("ok_all", False)
            elif name == "sanitize":  # a missing tool or a cut run is a skip (recorded, shown); no time left fails
                ok = (res.get("skipped") == NO_SANITIZER or str(res.get("skipped")).startswith(CUT)
                      or (res.get("errors") == 0 and res.get("returncode") == 0 and not res.get("subset")))
            elif name == "bench":
                ok = not B.failed_rows(res.get("rows", []))
            res["ok"] = ok
        except Exception as e:  # noqa: BLE001
            res.update(ok=False, error=f"{type(e).__name__}: {e}"[:500],
                       traceback=traceback.format_exc()[-4000:])
            log(f"{name}: FAILED: {type(e).__name__}: {e}")
        finally:  # a run killed later (run_all.sh's hard timeout) keeps what this section found
            results["meta"]["seconds"] = round(time.time() - T_START, 1)
            write_reports(results, out)

    if args.cpu_selftest:
        torch.set_num_threads(1)  # as the engine on a CPU: a shared VM's parallel regions wait tens of ms
        section("correctness", section_correctness, "cpu", "reference", subset=True)
        tiny = [("seq", "V4-Pro-TP8", 16, 2, 8, 128, False),
                ("colmajor", "V4-Pro-TP8", 16, 2, 8, 128, True)]
        section("bench", section_bench, dev, deadline, configs=tiny, only=("reference",) + BENCH_CONTENDERS,
                reps=1)
        print(write_reports(results, out))
        return 0 if all(s.get("ok") for s in results["sections"].values()) else 1

    if dev.type != "cuda":
        print("no CUDA device visible: nothing to check (use --cpu-selftest to exercise the script on CPU)")
        return 2
    if args.sanitize_subset:  # runs under compute-sanitizer: the built extension is loaded from the cache
        section("correctness", section_correctness, "cuda", "cuda", subset=True)
        report.write_json(results, out / "results.json")
        return 0 if results["sections"]["correctness"].get("ok") else 1

    # Order: the checks, then the bench (the seed tables) with time kept back for compute-sanitizer and the
    # Triton subset, which both stop at the deadline; run_all.sh's hard timeout comes a little after it.
    section("build", section_build)
    built = results["sections"]["build"].get("ok")
    if built:
        section("correctness", section_correctness, "cuda", "cuda", cpu_reference_every=9)
        section("graph", section_graph)
    if not args.skip_bench:
        reserve = SANITIZE_RESERVE_S if built and not args.skip_sanitize and find_sanitizer() else 0
        section("bench", section_bench, dev, deadline - reserve - TRITON_SUBSET_RESERVE_S,
                max_sets=args.max_sets, reps=args.reps, after_config=lambda: write_reports(results, out))
    if built and not args.skip_sanitize:  # at least 30 s (its minimum) before the sweep's share, if there are 30
        left = deadline - time.time() - TRITON_SUBSET_RESERVE_S
        sweep_share = 0 if args.skip_sweep else SWEEP_RESERVE_S
        section("sanitize", section_sanitize, min(120.0, max(left - sweep_share, 30.0), left))
    if built and not args.skip_sweep:
        section("sweep", section_sweep, deadline - TRITON_SUBSET_RESERVE_S)
    # the fused Triton kernel against the reference on the small subset, for the record
    if deadline - time.time() >= TRITON_SUBSET_RESERVE_S / 2:
        section("correctness_triton", section_correctness, "cuda", "triton", subset=True)
    else:
        results["sections"]["correctness_triton"] = {"ok": True, "skipped": "time budget spent"}
    summary = write_reports(results, out)
    print(summary)
    return 0 if all(s.get("ok") for s in results["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
