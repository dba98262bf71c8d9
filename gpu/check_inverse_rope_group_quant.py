#!/usr/bin/env python3
"""One-shot GPU check of the inverse_rope_group_quant CUDA kernel on an H200 (sm_90): build, correctness,
compute-sanitizer, CUDA-graph replay, benchmark. Every section runs in its own try/except; the whole run is
meant to stay under 4 minutes (a first build of the CUDA extension takes about 2 of them).

    PYTHONPATH=$PWD TORCH_CUDA_ARCH_LIST=9.0 python3 gpu/check_inverse_rope_group_quant.py --out $OUT

Sections
  build        fusedrope.cuda_ext.build() (the whole fusedrope_cuda extension), which backend "auto" picks
  correctness  CUDA backend vs fusedrope.reference (on the GPU) over the seed matrix ((H, G) = (16, 2), (8,
               1); several S; group 32/64/128/256; both scale layouts) plus dtype / stride / alignment /
               clamping / NaN-Inf cases: scale bytes bit-exact, fp8 within 1 ulp (and the count of fp8 bytes
               that differ at all: expected 0, since the hardware cvt.rn.satfinite is the reference's RNE +
               clamp); outputs poisoned first so unwritten bytes fail; a few cases also against the CPU
               reference
  sanitize     re-runs this script with --sanitize-subset under `compute-sanitizer --tool memcheck` with
               PYTORCH_NO_CUDA_MEMORY_CACHING=1 (so each tensor is its own allocation and an overrun is seen)
  graph        CUDA-graph capture + replay equals eager, also after new data is copied into the inputs
  bench        fused CUDA kernel, fused Triton kernel (backend="triton") and the unfused baseline
               (fusedrope.baseline.unfused_inverse_rope_group_quant) over the seed's S axis for (H, G) = (16,
               2) and (8, 1), and its group-size axis (32/64/128 at S = 2048, 8192; plus column-major scales);
               device time from CUDA-graph replay over input sets rotated beyond the L2; TB/s by the seed's
               byte count (read o, one cos + one sin row per token, write fp8 1 B/elem + 1 scale byte per
               block) and as a fraction of a device-to-device copy measured in the same run (bytes read +
               written)

Outputs under --out: results.json (everything: GPU, versions, commit, command, per-case results, errors),
bench.csv, bench.md; a short table is printed last.

--cpu-selftest runs the correctness machinery on the CPU with the reference backend (tiny shapes) and writes
the output files, so the script's plumbing can be checked without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fusedrope  # noqa: E402
from fusedrope import reference as ref  # noqa: E402
from fusedrope.inverse_rope_quant import empty_quant_outputs  # noqa: E402
from fusedrope.testing import (QUANT_SEQ_LENS, QuantCase, deepseek_rope_cache, poison_like,  # noqa: E402
                               scale_bytes, ulp_diff)

HEAD_GROUPS = {"V4-Pro-TP8": (16, 2), "V4-Flash-TP8": (8, 1)}
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
             scale_dtype=torch.float8_e8m0fnu, x_offset=0, cpu_reference=False):
    """Run ``backend`` into poisoned buffers and compare with the reference. Returns a result dict."""
    x0, s0 = empty_quant_outputs(o, G, q, transpose, fp8_dtype=fp8_dtype, scale_dtype=scale_dtype)
    if x_offset:  # caller-provided x_fp8 that is contiguous but not 16-byte aligned
        buf = torch.empty(x0.numel() + x_offset, dtype=torch.uint8, device=o.device)
        x = buf[x_offset:].view(fp8_dtype).view(x0.shape)
        x.view(torch.uint8).fill_(0x7F)
    else:
        x = poison_like(x0)
    sc = poison_like(s0, 0xA5)  # not 0xFF: that is a legitimate scale byte (NaN block)
    fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, transpose, x, sc, backend=backend)
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
    ok = scale_equal and max_ulp <= 1
    return {"ok": bool(ok), "scale_bit_exact": bool(scale_equal), "fp8_bytes_differ": nb,
            "fp8_max_ulp": max_ulp}


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
    ]
    if subset:
        extra = [e for e in extra if e[0] in ("unaligned-o", "unaligned-x_fp8", "unaligned-cache-rows",
                                              "float32-scale", "fp16-cache-out-of-range-pos")]
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
    from fusedrope import cuda_ext

    t = time.time()
    path = cuda_ext.build()
    res["seconds"] = round(time.time() - t, 1)
    res["library"] = path
    res["op_registered"] = hasattr(torch.ops.fusedrope_cuda, "inverse_rope_group_quant_out")
    o, p, c, s = make_inputs(4, 16, device="cuda")
    res["explain"] = str(fusedrope.explain("inverse_rope_group_quant", o, p, c, s, 2))
    log(f"build: {res['seconds']} s, {path}")


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
    res["n_cases"] = len(cases) + 1
    res["failed"] = fails
    res["fp8_bytes_differ_total"] = sum(v.get("fp8_bytes_differ", 0) for v in res["cases"].values())
    log(f"correctness[{backend}]: {len(cases) + 1 - len(fails)}/{len(cases) + 1} cases ok, "
        f"{res['fp8_bytes_differ_total']} fp8 bytes differ from the reference"
        + (f"; FAILED: {fails}" if fails else ""))


def section_sanitize(res, out: Path, budget_s: float):
    cs = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",
                     "/opt/nvidia/compute-sanitizer/compute-sanitizer")
         if os.path.exists(p)), None)
    if cs is None:
        res["skipped"] = "compute-sanitizer not found"
        log("sanitize: skipped (compute-sanitizer not found)")
        return
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [cs, "--tool", "memcheck", "--error-exitcode", "17", "--print-limit", "20", sys.executable,
           str(Path(__file__).resolve()), "--sanitize-subset", "--out", str(out / "sanitize")]
    res["command"] = " ".join(cmd)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30.0, budget_s), env=env)
        text = proc.stdout + proc.stderr
        res["returncode"] = proc.returncode
        m = re.search(r"ERROR SUMMARY:\s*(\d+) error", text)
        res["errors"] = int(m.group(1)) if m else None
        res["tail"] = text[-3000:]
        sub = out / "sanitize" / "results.json"
        if sub.exists():
            sections = json.loads(sub.read_text()).get("sections", {})
            res["subset"] = sections.get("correctness", {}).get("failed")
        log(f"sanitize: rc={proc.returncode}, memcheck errors={res['errors']}, "
            f"subset failures={res.get('subset')}")
    except subprocess.TimeoutExpired as e:
        res["timeout_s"] = e.timeout
        text = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        res["tail"] = text[-2000:]
        log(f"sanitize: timed out after {e.timeout:.0f} s")


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
        with torch.cuda.graph(graph):
            fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, t, x_g, s_g, backend=backend)
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


def graph_time_us(fn_sets, reps=15) -> float:
    """Median device time per call (us): one CUDA graph holds one call per input set; replay it ``reps``
    times."""
    for f in fn_sets:  # warm-up (compiles Triton kernels) outside the capture
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fn_sets:
            f()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fn_sets))
    del graph
    return statistics.median(times)


def copy_bandwidth(res) -> float:
    n = 1 << 30  # 1 GiB each way
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = graph_time_us([lambda: dst.copy_(src)] * 4, reps=10)
    tbps = 2 * n / (us * 1e-6) / 1e12
    res["copy"] = {"bytes_each_way": n, "us": round(us, 2), "tbps_read_plus_write": round(tbps, 3)}
    log(f"copy roofline: {tbps:.2f} TB/s (read + write)")
    return tbps


def bench_configs():
    """In priority order (the deadline cuts from the end): (16, 2) over S, the group-size axis, (8, 1) over S,
    column-major scales."""
    cfgs = [("seq", "V4-Pro-TP8", 16, 2, S, 128, False) for S in QUANT_SEQ_LENS]
    for S in (2048, 8192):
        for q in (32, 64, 128):
            cfgs.append(("group", "V4-Pro-TP8", 16, 2, S, q, False))
    cfgs += [("seq", "V4-Flash-TP8", 8, 1, S, 128, False) for S in QUANT_SEQ_LENS]
    for q in (32, 128):
        cfgs.append(("colmajor", "V4-Pro-TP8", 16, 2, 8192, q, True))
    return cfgs


def section_bench(res, deadline: float):
    from fusedrope.baseline import unfused_inverse_rope_group_quant

    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
    res["l2_bytes"] = l2
    copy_tbps = copy_bandwidth(res)
    rows = []
    cache_dtype = torch.float32
    for (axis, hg_name, H, G, S, q, t) in bench_configs():
        if time.time() > deadline:
            res.setdefault("skipped", []).append(f"{axis}-{hg_name}-S{S}-g{q}")
            continue
        case = QuantCase(S, H, G, quant_group_size=q)
        nbytes = case.bytes_moved(torch.bfloat16, cache_dtype)
        set_bytes = S * H * 512 * 3 + S * H * 512 // q
        n_sets = max(2, min(64, math.ceil(3 * l2 / set_bytes)))
        cos, sin = deepseek_rope_cache(4096, 64, dtype=cache_dtype)
        cos, sin = cos.cuda(), sin.cuda()
        sets = []
        for i in range(n_sets):
            o = (torch.randn(S, H, 512, device="cuda") * (1 + i)).to(torch.bfloat16)
            p = torch.randint(0, 4096, (S,), device="cuda")
            x, sc = empty_quant_outputs(o, G, q, t)
            sets.append((o, p, x, sc))
        row = {"axis": axis, "hg": hg_name, "H": H, "G": G, "S": S, "group": q, "transpose_scale": t,
               "bytes": nbytes, "n_sets": n_sets, "l2_resident": n_sets * set_bytes < l2}
        impls = {
            "cuda": lambda o, p, x, sc: fusedrope.inverse_rope_group_quant(o, p, cos, sin, G, q, t, x, sc,
                                                                           backend="cuda"),
            "triton": lambda o, p, x, sc: fusedrope.inverse_rope_group_quant(o, p, cos, sin, G, q, t, x, sc,
                                                                             backend="triton"),
            "unfused": lambda o, p, x, sc: unfused_inverse_rope_group_quant(o, p, cos, sin, G, q, t, x, sc),
        }
        for impl, fn in impls.items():
            try:
                us = graph_time_us([(lambda a=a: fn(*a)) for a in sets])
                row[f"{impl}_us"] = round(us, 3)
                row[f"{impl}_tbps"] = round(nbytes / (us * 1e-6) / 1e12, 4)
                row[f"{impl}_frac_copy"] = round(row[f"{impl}_tbps"] / copy_tbps, 4)
            except Exception as e:  # noqa: BLE001
                row[f"{impl}_error"] = f"{type(e).__name__}: {e}"[:300]
        if "cuda_us" in row and "unfused_us" in row:
            row["speedup_vs_unfused"] = round(row["unfused_us"] / row["cuda_us"], 3)
        if "cuda_us" in row and "triton_us" in row:
            row["speedup_vs_triton"] = round(row["triton_us"] / row["cuda_us"], 3)
        rows.append(row)
        log(f"bench {axis} {hg_name} S={S} g={q}{' col' if t else ''}: cuda {row.get('cuda_us')} us "
            f"({row.get('cuda_tbps')} TB/s), triton {row.get('triton_us')} us, "
            f"unfused {row.get('unfused_us')} us")
        del sets
    res["rows"] = rows
    res["copy_tbps"] = copy_tbps


# ------------------------------------------------------------------------------------------------ reports
CSV_COLS = ["axis", "hg", "H", "G", "S", "group", "transpose_scale", "bytes", "n_sets", "l2_resident",
            "cuda_us", "cuda_tbps", "cuda_frac_copy", "triton_us", "triton_tbps", "triton_frac_copy",
            "unfused_us", "unfused_tbps", "unfused_frac_copy", "speedup_vs_unfused", "speedup_vs_triton"]


def write_reports(results, out: Path) -> str:
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    rows = results["sections"].get("bench", {}).get("rows", [])
    with open(out / "bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    copy = results["sections"].get("bench", {}).get("copy_tbps")
    md = [f"# inverse_rope_group_quant on {results['meta'].get('gpu', '?')}", "",
          f"Device-to-device copy (read + write): {copy and round(copy, 2)} TB/s. "
          "Device time from CUDA-graph replay, "
          "inputs rotated beyond the L2. TB/s by the seed's byte count.", "",
          "| axis | H,G | S | group | scale | cuda us | cuda TB/s | % copy | triton us | unfused us "
          "| vs unfused | vs triton |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        frac = r.get("cuda_frac_copy")
        md.append(f"| {r['axis']} | {r['H']},{r['G']} | {r['S']} | {r['group']} | "
                  f"{'col' if r['transpose_scale'] else 'row'} | {r.get('cuda_us', '-')} | "
                  f"{r.get('cuda_tbps', '-')} | "
                  f"{'-' if frac is None else round(100 * frac, 1)} | {r.get('triton_us', '-')} | "
                  f"{r.get('unfused_us', '-')} | {r.get('speedup_vs_unfused', '-')} | "
                  f"{r.get('speedup_vs_triton', '-')} |")
    (out / "bench.md").write_text("\n".join(md) + "\n")
    short = ["", "section      ok   notes"]
    for name, sec in results["sections"].items():
        note = sec.get("error") or sec.get("skipped") or ""
        if name == "correctness" and "failed" in sec:
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
        short.append(f"{name:<12} {'yes' if sec.get('ok') else 'NO ':<4} {str(note)[:150]}")
    skipped = results["sections"].get("bench", {}).get("skipped")
    if skipped:
        short.append(f"bench: {len(skipped)} configs skipped at the time budget (--budget-s): "
                     f"{skipped[:3]} ...")
    if rows:
        short += ["", f"copy {copy:.2f} TB/s | H,G  S      g   sc  | cuda us  TB/s  %cp | triton us "
                      "| unfused us | x unf"]
        for r in rows:
            if r["axis"] == "seq" and r["S"] not in (1, 128, 1024, 4096, 8192, 16384):
                continue
            frac = r.get("cuda_frac_copy")
            short.append(f"{r['axis']:<8} {r['H']:>2},{r['G']:<2} {r['S']:>6} {r['group']:>3} "
                         f"{'col' if r['transpose_scale'] else 'row'} | {r.get('cuda_us', '-'):>7} "
                         f"{r.get('cuda_tbps', '-'):>5} {'-' if frac is None else round(100 * frac):>3} | "
                         f"{r.get('triton_us', '-'):>9} | {r.get('unfused_us', '-'):>10} | "
                         f"{r.get('speedup_vs_unfused', '-')}")
    return "\n".join(short)


def meta(args) -> dict:
    m = {"command": " ".join([sys.executable, *sys.argv]), "python": platform.python_version(),
         "torch": torch.__version__, "torch_cuda": torch.version.cuda, "host": platform.node(),
         "time": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args)}
    try:
        import triton

        m["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        m["triton"] = None
    try:
        m["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                     timeout=10).stdout.strip()
        m["dirty"] = bool(subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                                         text=True,
                                         timeout=10).stdout.strip())
    except Exception:  # noqa: BLE001
        m["commit"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        m.update(gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                 l2_bytes=getattr(p, "L2_cache_size", None))
        try:
            m["nvidia_smi"] = subprocess.run(["nvidia-smi",
                                              "--query-gpu=name,driver_version,clocks.sm,clocks.mem",
                                              "--format=csv,noheader"], capture_output=True, text=True,
                                             timeout=20).stdout.strip()
        except Exception:  # noqa: BLE001
            pass
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_out", help="output folder")
    ap.add_argument("--sanitize-subset", action="store_true",
                    help="only the small correctness subset (what runs under compute-sanitizer)")
    ap.add_argument("--skip-sanitize", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--budget-s", type=float, default=225.0,
                    help="stop starting new work after this many seconds")
    ap.add_argument("--cpu-selftest", action="store_true",
                    help="no GPU: run the correctness machinery with the reference backend on CPU tensors")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = T_START + args.budget_s
    results = {"meta": meta(args), "sections": {}}

    def section(name, fn, *a, **k):
        res = results["sections"].setdefault(name, {})
        try:
            fn(res, *a, **k)
            ok = True
            if name.startswith("correctness"):
                ok = not res.get("failed")
            elif name == "graph":
                ok = res.get("ok_all", False)
            elif name == "sanitize":
                ok = ("skipped" not in res and res.get("errors") == 0 and res.get("returncode") == 0
                      and not res.get("subset"))
            res["ok"] = ok
        except Exception as e:  # noqa: BLE001
            res.update(ok=False, error=f"{type(e).__name__}: {e}"[:500],
                       traceback=traceback.format_exc()[-4000:])
            log(f"{name}: FAILED: {type(e).__name__}: {e}")

    if args.cpu_selftest:
        section("correctness", section_correctness, "cpu", "reference", subset=True)
        print(write_reports(results, out))
        return 0 if results["sections"]["correctness"].get("ok") else 1

    if not torch.cuda.is_available():
        print("no CUDA device visible: nothing to check (use --cpu-selftest to exercise the script on CPU)")
        return 2
    if args.sanitize_subset:  # runs under compute-sanitizer: the built extension is loaded from the cache
        section("correctness", section_correctness, "cuda", "cuda", subset=True)
        write_reports(results, out)
        return 0 if results["sections"]["correctness"].get("ok") else 1

    section("build", section_build)
    if results["sections"]["build"].get("ok"):
        section("correctness", section_correctness, "cuda", "cuda", cpu_reference_every=9)
        section("graph", section_graph)
        if not args.skip_sanitize:
            section("sanitize", section_sanitize, out, max(45.0, min(120.0, deadline - time.time() - 60)))
    # the fused Triton kernel against the reference on the small subset, for the record
    section("correctness_triton", section_correctness, "cuda", "triton", subset=True)
    if not args.skip_bench:
        section("bench", section_bench, deadline)
    summary = write_reports(results, out)
    print(summary)
    return 0 if all(s.get("ok") for s in results["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
