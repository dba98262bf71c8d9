#!/usr/bin/env python3
"""qwen3_tts_rope on a GPU: build the CUDA extension, check the `cuda` and `triton` backends, benchmark them.

One run of a few minutes on the H200 test machine (see gpu/README.md):

    PYTHONPATH=$PWD python3 gpu/check_qwen3_tts_rope.py --out $OUT

Sections (each in its own try/except: one failure does not lose the others; results are rewritten after each):
  build       JIT-build the extension (all kernels_cuda sources); if that fails, retry with the qwen3 sources alone
  correct     cuda + triton vs the float64 oracle (<= 1 ulp, correctly rounded but for rare ties) on the 18 seed
              cases, strided, misaligned (odd element offset), 4-byte-aligned, cos-broadcast, in place, contiguous,
              fp16, D=64/256, forced launch shapes and vector widths, a capped grid, empty inputs, bad input errors
  graph       CUDA-graph replay gives the same bytes as eager (cuda and triton, out of place and in place)
  copy        device-to-device copy bandwidth (bytes read + written): the roofline of this run
  bench       every seed case: (a) per call, CUDA events around a loop of back-to-back calls (host overhead
              included, as the seed measured) and (b) device time per call from replaying a CUDA graph of N calls;
              inputs rotate among sets totalling > 120 MB so they are not L2-resident. Backends: eager torch
              formula, torch.compile'd formula, triton, cuda (public API), cuda_op (raw op, preallocated outputs),
              cuda_ip (in place), liger (LigerRopeFunction, in place, if importable). TB/s = bytes_moved / (b).
  sanitize    re-runs this script with --sanitize-subset under `compute-sanitizer --tool memcheck`
  sweep       cuda launch shapes (warps per token x tokens per block, vector width) on a few cases, graph timing

Outputs in --out: results.json (everything, with GPU name, versions, git commit, command line), bench.csv,
bench.md, sanitizer.log. The short table is printed last.

`--fake` exercises the CPU-only parts (argument parsing, tables, output files) with made-up numbers.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import platform
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

T0 = time.time()
BACKENDS_A = ("eager", "compile", "triton", "cuda", "cuda_op", "cuda_ip", "liger")  # per-call loop
BACKENDS_B = ("eager", "compile", "triton", "cuda", "cuda_op", "cuda_ip", "liger")  # graph replay
SHORT = ("eager", "compile", "triton", "cuda", "liger")  # columns of the printed table
SWEEP_CASES = ("qwen3_tts-B1", "qwen3_tts-B8", "qwen3_tts-B32", "wide_heads-B8", "wide_heads-B32", "gqa1-B32")


def elapsed() -> float:
    return time.time() - T0


def log(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_out"), help="output folder (default $OUT)")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="wall-clock budget: optional sections (sanitize, sweep) are skipped when it runs out")
    p.add_argument("--rotate-mb", type=float, default=128.0, help="input bytes rotated through per benchmark")
    p.add_argument("--max-sets", type=int, default=4800, help="cap on input sets per case")
    p.add_argument("--reps", type=int, default=3, help="repetitions per timing (median)")
    p.add_argument("--graph-cap", type=int, default=1500,
                   help="max calls per captured graph for eager/compile/liger (many kernels per call)")
    p.add_argument("--cases", default="", help="comma-separated case ids to benchmark (default: all 18)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (saves its compile time)")
    p.add_argument("--no-liger", action="store_true")
    p.add_argument("--skip", default="", help="comma-separated sections to skip: correct,graph,copy,bench,"
                                              "sanitize,sweep")
    p.add_argument("--sanitize-subset", action="store_true",
                   help="(internal) the small correctness subset run under compute-sanitizer")
    p.add_argument("--sanitize-timeout", type=float, default=150.0)
    p.add_argument("--commit", default="", help="git commit to record (default: git rev-parse HEAD)")
    p.add_argument("--fake", action="store_true", help="CPU self-test: tables and files from made-up numbers")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------------------
# results bookkeeping
# ------------------------------------------------------------------------------------------------------------
class Results(dict):
    def __init__(self, out: Path, args):
        super().__init__()
        self.out = out
        self["command_line"] = " ".join([sys.executable, *sys.argv])
        self["args"] = vars(args)
        self["sections"] = {}
        self["errors"] = {}
        self["checks"] = []

    def section(self, name: str, fn, *a, **kw):
        """Run one section; record its time and any exception; never raise."""
        log(f"== {name}")
        t = time.time()
        status = "ok"
        try:
            fn(self, *a, **kw)
        except SkipSection as e:
            status = f"skipped: {e}"
            log(f"   skipped: {e}")
        except BaseException as e:  # noqa: BLE001 - keep going whatever happens
            if isinstance(e, KeyboardInterrupt):
                raise
            status = f"error: {type(e).__name__}: {e}"
            self["errors"][name] = traceback.format_exc()
            log(f"   ERROR in {name}: {type(e).__name__}: {str(e)[:500]}")
        self["sections"][name] = {"status": status, "seconds": round(time.time() - t, 2)}
        self.write()

    def check(self, section, name, ok, detail=""):
        self["checks"].append({"section": section, "name": name, "ok": bool(ok), "detail": str(detail)[:2000]})
        if not ok:
            log(f"   FAIL {section}/{name}: {str(detail)[:400]}")

    def write(self):
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "results.json").write_text(json.dumps(self, indent=1, default=str))
        rows = self.get("bench", [])
        if rows:
            (self.out / "bench.csv").write_text(bench_csv(rows))
            (self.out / "bench.md").write_text(bench_markdown(rows, self.get("copy", {}).get("tbps")))


class SkipSection(Exception):
    pass


def need(seconds: float, args, what: str):
    left = args.budget_s - elapsed()
    if left < seconds:
        raise SkipSection(f"{what} needs ~{seconds:.0f}s, {left:.0f}s of the budget left")


# ------------------------------------------------------------------------------------------------------------
# tables (CPU-testable)
# ------------------------------------------------------------------------------------------------------------
CSV_FIELDS = ["case", "batch", "seq_len", "num_q_heads", "num_kv_heads", "rows", "bytes_moved", "sets", "rotated_mb"]


def bench_csv(rows) -> str:
    fields = list(CSV_FIELDS)
    for b in BACKENDS_A:
        fields.append(f"{b}_call_us")
    for b in BACKENDS_B:
        fields.append(f"{b}_graph_us")
    fields += ["cuda_tbps", "cuda_frac_copy", "cuda_op_tbps", "cuda_op_frac_copy"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    return buf.getvalue()


def _fmt(v, nd=2):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{nd}f}"


def _ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b


def bench_table(rows, copy_tbps=None) -> str:
    """The short text table printed last: per-call us (a), graph us (b) and the cuda kernel's bandwidth."""
    head = (f"{'case':<26}{'rows':>7} |" + "".join(f"{b:>9}" for b in SHORT) + " | graph us:"
            + "".join(f"{b:>9}" for b in ("compile", "triton", "cuda", "cuda_op", "liger"))
            + " | cuda_op TB/s %copy  x_cmp  x_trt")
    lines = ["per-call us = CUDA events around back-to-back calls (host overhead included); graph us = device time "
             "per call from CUDA-graph replay" + (f"; copy roofline {copy_tbps:.2f} TB/s" if copy_tbps else ""),
             head, "-" * len(head)]
    for r in rows:
        a = "".join(f"{_fmt(r.get(f'{b}_call_us')):>9}" for b in SHORT)
        g = "".join(f"{_fmt(r.get(f'{b}_graph_us')):>9}" for b in ("compile", "triton", "cuda", "cuda_op", "liger"))
        frac = r.get("cuda_op_frac_copy")
        x_cmp = _ratio(r.get("compile_call_us"), r.get("cuda_call_us"))
        x_trt = _ratio(r.get("triton_call_us"), r.get("cuda_call_us"))
        lines.append(f"{r['case']:<26}{r['rows']:>7} |{a} |          {g} | {_fmt(r.get('cuda_op_tbps')):>9}"
                     f" {_fmt(None if frac is None else 100 * frac, 0):>5}% {_fmt(x_cmp):>6} {_fmt(x_trt):>6}")
    lines.append("x_cmp / x_trt: per-call speedup of cuda over torch.compile / triton. TB/s and %copy from the "
                 "cuda_op graph time.")
    return "\n".join(lines)


def bench_markdown(rows, copy_tbps=None) -> str:
    cols = ["case", "rows"] + [f"{b} us" for b in BACKENDS_A] + [f"{b} graph us" for b in BACKENDS_B] + \
           ["cuda_op TB/s", "% of copy", "compile/cuda", "triton/cuda"]
    out = []
    if copy_tbps:
        out.append(f"Device-to-device copy in the same run: {copy_tbps:.2f} TB/s (bytes read + written).\n")
    out.append("| " + " | ".join(cols) + " |")
    out.append("|" + "---|" * len(cols))
    for r in rows:
        frac = r.get("cuda_op_frac_copy")
        vals = [r["case"], str(r["rows"])] + [_fmt(r.get(f"{b}_call_us")) for b in BACKENDS_A] + \
               [_fmt(r.get(f"{b}_graph_us")) for b in BACKENDS_B] + \
               [_fmt(r.get("cuda_op_tbps")), _fmt(None if frac is None else 100 * frac, 0),
                _fmt(_ratio(r.get("compile_call_us"), r.get("cuda_call_us"))),
                _fmt(_ratio(r.get("triton_call_us"), r.get("cuda_call_us")))]
        out.append("| " + " | ".join(vals) + " |")
    return "\n".join(out) + "\n"


def checks_summary(res) -> str:
    checks = res.get("checks", [])
    bad = [c for c in checks if not c["ok"]]
    lines = [f"checks: {len(checks) - len(bad)} passed, {len(bad)} failed"]
    for c in bad[:15]:
        lines.append(f"  FAIL {c['section']}/{c['name']}: {c['detail'][:200]}")
    for name, s in res.get("sections", {}).items():
        lines.append(f"  section {name:<9} {s['status'][:150]} ({s['seconds']}s)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# environment
# ------------------------------------------------------------------------------------------------------------
def env_info(res, args):
    import torch

    info = {"python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "hostname": platform.node()}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        info["triton"] = f"not importable: {e}"
    commit = args.commit
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                    timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001
            commit = ""
    info["git_commit"] = commit or "unknown"
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    try:
        info["nvcc"] = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[-1]
    except Exception as e:  # noqa: BLE001
        info["nvcc"] = f"unavailable: {e}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sm=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    l2_mb=round(getattr(p, "L2_cache_size", 0) / 2**20, 1), mem_gb=round(p.total_memory / 1e9, 1))
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=20).stdout.strip()
        except Exception:  # noqa: BLE001
            pass
    res["env"] = info
    log(f"   {info.get('gpu', 'no GPU')} sm {info.get('sm')} | torch {info['torch']} cuda {info['torch_cuda']} | "
        f"triton {info['triton']} | {info['nvcc']} | commit {info['git_commit'][:12]}")


# ------------------------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------------------------
def build(res, args):
    import torch
    from fusedrope import cuda_ext

    info = res.setdefault("build", {})
    info["sources"] = [s.name for s in cuda_ext.sources()]
    info["arch_list"] = cuda_ext.arch_list()
    info["name"] = cuda_ext.ext_name()
    t = time.time()
    try:
        info["library"] = cuda_ext.load(verbose=False)
        info["ok"] = True
    except Exception as e:  # noqa: BLE001
        info["ok"] = False
        cause = e.__cause__ or e
        info["error"] = f"{e}\n--- full:\n{cause}"[-20000:]
        log(f"   full build failed: {e}")
        # Debug aid: the qwen3 sources alone (another op's source must not hide whether this one builds).
        need(90, args, "the qwen3-only fallback build")
        from torch.utils import cpp_extension

        d = cuda_ext.kernel_dir()
        name = "fusedrope_cuda_qwen3_only"
        bdir = cuda_ext.build_root() / name
        bdir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", info["arch_list"])
        try:
            lib = cpp_extension.load(name=name, sources=[str(d / "qwen3_tts_rope.cu"), str(d / "qwen3_tts_rope_torch.cpp")],
                                     extra_cflags=list(cuda_ext.CXX_FLAGS), extra_cuda_cflags=list(cuda_ext.NVCC_FLAGS),
                                     build_directory=str(bdir), is_python_module=False, verbose=False)
            cuda_ext._loaded, cuda_ext._failure = str(lib), None  # let the backend use it for the checks
            info["fallback_qwen3_only"] = "ok"
        except Exception as e2:  # noqa: BLE001
            info["fallback_qwen3_only"] = f"failed: {str(e2)[-5000:]}"
            raise
    finally:
        info["seconds"] = round(time.time() - t, 1)
    log(f"   built/loaded in {info['seconds']}s: {info.get('library')}")
    assert hasattr(torch.ops.fusedrope_cuda, "qwen3_tts_rope_out")


# ------------------------------------------------------------------------------------------------------------
# correctness
# ------------------------------------------------------------------------------------------------------------
def _ulp_check(out, q_ref):
    from fusedrope.testing import ulp_diff

    d = ulp_diff(out, q_ref)
    worst = int(d.max()) if d.numel() else 0
    off = int((d != 0).sum())
    ok = worst <= 1 and off <= 2 + out.numel() // 1000
    return ok, f"max {worst} ulp, {off}/{out.numel()} not correctly rounded"


def _verify(res, section, name, q_out, k_out, q, k, cos, sin):
    import torch

    from fusedrope.reference import qwen3_tts_rope_oracle

    torch.cuda.synchronize()
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    okq, dq = _ulp_check(q_out, q_ref)
    okk, dk = _ulp_check(k_out, k_ref)
    res.check(section, name, okq and okk, f"q: {dq}; k: {dk}")
    return okq and okk


def _poisoned_outputs(q, k):
    from fusedrope.testing import poison_like

    return poison_like(q.contiguous()), poison_like(k.contiguous())


def _extra_inputs(device):
    """(name, q, k, cos, sin) beyond the seed matrix."""
    import torch

    from fusedrope.testing import TtsCase, make_tts_inputs

    g = torch.Generator().manual_seed(6)
    out = []
    # Every leading stride unusual, k at an odd element offset (scalar path), cos/sin views of one buffer.
    q = torch.randn(2, 9, 5, 160, generator=g).to(torch.bfloat16)[:, 1:8:2, :4, 16:144].transpose(1, 2)
    k = torch.randn(4, 4, 3, 131, generator=g).to(torch.bfloat16)[::2, :, :, 3:131].transpose(1, 2)
    cs = torch.randn(2, 4, 2, 136, generator=g).to(torch.bfloat16)
    out.append(("strided_misaligned_k", q, k, cs[:, :, 0, 4:132], cs[:, :, 1, 7:135]))
    # 4-byte aligned, even strides: the bf16x2 path.
    k2 = torch.randn(4, 4, 3, 130, generator=g).to(torch.bfloat16)[::2, :, :, 2:130].transpose(1, 2)
    out.append(("strided_4byte", q, k2, cs[:, :, 0, 8:136], cs[:, :, 1, :128]))
    # Odd element offset on a seed-sized projection (misaligned q and k).
    buf = torch.randn(1 + 8 * 16 * 24 * 128, generator=g).to(torch.bfloat16)
    proj = buf[1:].view(8, 16, 24, 128)
    c, s = make_tts_inputs(TtsCase("m", 8, 16, 16, 8), seed=3)[2:]
    out.append(("misaligned_odd_offset", proj[:, :, :16].transpose(1, 2), proj[:, :, 16:].transpose(1, 2), c, s))
    for name, case, kw in (
        ("cos_broadcast", TtsCase("bc", 8, 16, 16, 8), dict(cos_batch=1)),
        ("contiguous_layout", TtsCase("ct", 8, 17, 16, 8), dict(layout="contiguous")),
        ("independent_halves", TtsCase("ih", 4, 9, 12, 4), dict(random_cos_sin=True)),
        ("fp16", TtsCase("h", 8, 16, 16, 8), dict(dtype=torch.float16, random_cos_sin=True)),
        ("D64", TtsCase("d64", 4, 9, 16, 2, 64), dict(random_cos_sin=True)),
        ("D256", TtsCase("d256", 4, 9, 16, 2, 256), dict(random_cos_sin=True)),
        ("D256_fp16_contig", TtsCase("d256h", 3, 5, 7, 3, 256), dict(dtype=torch.float16, layout="contiguous")),
        ("many_heads", TtsCase("mh", 2, 3, 100, 37), dict(random_cos_sin=True)),
        ("long_seq", TtsCase("ls", 1, 3000, 16, 8), dict()),
    ):
        out.append((name, *make_tts_inputs(case, seed=len(name), **kw)))
    return [(n, *(t.to(device) for t in ts)) for n, *ts in out]


def correct(res, args):
    import torch

    import fusedrope
    from fusedrope.testing import TTS_CASES, make_tts_inputs
    from fusedrope.tts_rope import REGISTRY, validate

    dev = torch.device("cuda")
    ex = fusedrope.explain("qwen3_tts_rope", *make_tts_inputs(TTS_CASES[0], device=dev))
    res["explain_auto"] = str(ex)
    log("   " + str(ex).replace("\n", "\n   "))
    res.check("correct", "auto_picks_cuda", ex.chosen == "cuda", str(ex))
    backends = [d.backend for d in ex if d.backend in ("cuda", "triton") and d.runs]
    for backend in ("cuda", "triton"):
        res.check("correct", f"{backend}/available", backend in backends, str(ex))

    def run(backend, q, k, cos, sin):
        q_out, k_out = _poisoned_outputs(q, k)
        REGISTRY.select(validate(q, k, cos, sin, False), backend).fn()(q, k, cos, sin, q_out, k_out)
        return q_out, k_out

    for backend in backends:
        try:
            _correct_backend(res, backend, run, dev)
        except Exception:  # noqa: BLE001 - a crash of one backend must not hide the other's results
            res.check("correct", f"{backend}/crashed", False, traceback.format_exc()[-3000:])
            torch.cuda.synchronize()
    if "cuda" in backends:
        _correct_cuda_only(res, dev)
    _liger_accuracy(res, dev)
    n = len(res["checks"])
    bad = sum(not c["ok"] for c in res["checks"])
    log(f"   {n - bad}/{n} checks passed")


def _correct_backend(res, backend, run, dev):
    import torch

    import fusedrope
    from fusedrope.reference import qwen3_tts_rope_oracle
    from fusedrope.testing import TTS_CASES, TtsCase, make_tts_inputs, ulp_diff

    for case in TTS_CASES:
        q, k, cos, sin = make_tts_inputs(case, device=dev, seed=hash(case.id) % 1000)
        _verify(res, "correct", f"{backend}/{case.id}", *run(backend, q, k, cos, sin), q, k, cos, sin)
    for name, q, k, cos, sin in _extra_inputs(dev):
        _verify(res, "correct", f"{backend}/{name}", *run(backend, q, k, cos, sin), q, k, cos, sin)
    # in place through the projection view, public API
    q, k, cos, sin = make_tts_inputs(TtsCase("ip", 8, 17, 16, 8), device=dev, seed=7)
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    qo, ko = fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend=backend)
    torch.cuda.synchronize()
    ok = qo is q and ko is k and int(ulp_diff(q, q_ref).max()) <= 1 and int(ulp_diff(k, k_ref).max()) <= 1
    res.check("correct", f"{backend}/inplace", ok)
    for shape in ((0, 4, 3, 128), (2, 4, 0, 128), (2, 0, 3, 128)):
        B, H, S, D = shape
        qe = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
        ke = torch.randn(B, 2, S, D, device=dev, dtype=torch.bfloat16)
        ce = torch.randn(max(B, 1), S, D, device=dev, dtype=torch.bfloat16)
        qo, ko = fusedrope.qwen3_tts_rope(qe, ke, ce, ce, backend=backend)
        res.check("correct", f"{backend}/empty{shape}", qo.shape == qe.shape and ko.shape == ke.shape)


def _correct_cuda_only(res, dev):
    """Forced launch shapes / vector widths, a capped grid (token loop), in place with each; bad inputs."""
    import torch

    from fusedrope import cuda_tts_rope
    from fusedrope.testing import TtsCase, make_tts_inputs

    cfgs = [dict(vec=8), dict(vec=2), dict(vec=1), dict(warps_per_token=1, tokens_per_cta=1),
            dict(warps_per_token=4, tokens_per_cta=2), dict(warps_per_token=8, tokens_per_cta=1),
            dict(warps_per_token=1, tokens_per_cta=8), dict(warps_per_token=3, tokens_per_cta=2, max_blocks=7),
            dict(vec=1, warps_per_token=2, tokens_per_cta=4, max_blocks=1)]
    for case in (TtsCase("cfg", 3, 17, 16, 8), TtsCase("cfg64", 2, 9, 13, 5, 64), TtsCase("cfg256", 2, 9, 7, 3, 256)):
        q, k, cos, sin = make_tts_inputs(case, device=dev, seed=11, random_cos_sin=True)
        for cfg in cfgs:
            tag = ",".join(f"{a}={b}" for a, b in cfg.items())
            q_out, k_out = _poisoned_outputs(q, k)
            cuda_tts_rope.qwen3_tts_rope_config(q, k, cos, sin, q_out, k_out, **cfg)
            _verify(res, "correct", f"cuda_cfg/{case.name}/{tag}", q_out, k_out, q, k, cos, sin)
            qi, ki = q.clone(), k.clone()
            cuda_tts_rope.qwen3_tts_rope_config(qi, ki, cos, sin, qi, ki, **cfg)
            _verify(res, "correct", f"cuda_cfg_inplace/{case.name}/{tag}", qi, ki, q, k, cos, sin)

    # Bad inputs reach the raw op only through misuse; they must raise, not crash.
    q, k, cos, sin = make_tts_inputs(TtsCase("bad", 2, 3, 4, 2), device=dev)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    for name, argsx in (("fp32", (q.float(), k.float(), cos.float(), sin.float(), qo.float(), ko.float())),
                        ("cpu_k", (q, k.cpu(), cos, sin, qo, ko)),
                        ("D96", (q[..., :96], k[..., :96], cos[..., :96], sin[..., :96], qo[..., :96], ko[..., :96])),
                        ("wide_vec_on_misaligned", None)):
        try:
            if argsx is None:
                buf = torch.empty(q.numel() + 1, device=dev, dtype=q.dtype)
                qm = buf[1:].view(q.shape)
                torch.ops.fusedrope_cuda.qwen3_tts_rope_out_config(q, k, cos, sin, qm, ko, 8, 0, 0, 0)
            else:
                torch.ops.fusedrope_cuda.qwen3_tts_rope_out(*argsx)
            torch.cuda.synchronize()
            res.check("correct", f"cuda_rejects/{name}", False, "no error raised")
        except RuntimeError as e:
            res.check("correct", f"cuda_rejects/{name}", "fusedrope_cuda" in str(e), str(e).splitlines()[0])



def _liger_accuracy(res, dev):
    """Peer accuracy, for information (Liger rotates in place and reads only the first half of cos/sin)."""
    import torch

    from fusedrope.reference import qwen3_tts_rope_oracle
    from fusedrope.testing import TTS_CASES, make_tts_inputs

    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        q, k, cos, sin = make_tts_inputs(TTS_CASES[1], device=dev, seed=1)
        q_ref, _ = qwen3_tts_rope_oracle(q, k, cos, sin)
        ql, _ = LigerRopeFunction.apply(q.clone(), k.clone(), cos, sin)
        torch.cuda.synchronize()
        from fusedrope.testing import ulp_diff

        d = ulp_diff(ql, q_ref)
        res["liger_accuracy"] = {"max_ulp": int(d.max()), "not_correctly_rounded": int((d != 0).sum()),
                                 "elements": d.numel()}
    except Exception as e:  # noqa: BLE001
        res["liger_accuracy"] = f"not measured: {type(e).__name__}: {e}"


def compile_check(res, args):
    """The public op under torch.compile(fullgraph) with the cuda backend equals eager."""
    import torch

    import fusedrope
    from fusedrope.testing import TtsCase, make_tts_inputs

    q, k, cos, sin = make_tts_inputs(TtsCase("tc", 4, 16, 16, 8), device="cuda", seed=10)
    for inplace in (False, True):
        def f(q, k, cos, sin):
            a, b = fusedrope.qwen3_tts_rope(q * 2, k, cos, sin, inplace=inplace, backend="cuda")
            return a + 1, b.sum(-1)

        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True)(q.clone(), k.clone(), cos, sin)
        want = f(q.clone(), k.clone(), cos, sin)
        res.check("compile", f"fullgraph_inplace={inplace}", all(torch.equal(a, b) for a, b in zip(got, want)))


# ------------------------------------------------------------------------------------------------------------
# CUDA graphs: replay == eager, bytewise
# ------------------------------------------------------------------------------------------------------------
def graph(res, args):
    import torch

    import fusedrope
    from fusedrope.testing import TtsCase, make_tts_inputs

    for backend in ("cuda", "triton"):
        for case in (TtsCase("g", 1, 16, 16, 8), TtsCase("g", 32, 32, 32, 8)):
            q, k, cos, sin = make_tts_inputs(case, device="cuda", seed=12)
            eq, ek = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)
            sq, sk, sc, ss = q.clone(), k.clone(), cos.clone(), sin.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fusedrope.qwen3_tts_rope(sq, sk, sc, ss, backend=backend)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                gq, gk = fusedrope.qwen3_tts_rope(sq, sk, sc, ss, backend=backend)
            # new inputs copied in, then replay
            q2, k2, c2, s2 = make_tts_inputs(case, device="cuda", seed=13)
            sq.copy_(q2), sk.copy_(k2), sc.copy_(c2), ss.copy_(s2)
            g.replay()
            e2q, e2k = fusedrope.qwen3_tts_rope(q2, k2, c2, s2, backend=backend)
            torch.cuda.synchronize()
            same = torch.equal(gq.view(torch.int16), e2q.view(torch.int16)) and \
                torch.equal(gk.view(torch.int16), e2k.view(torch.int16))
            res.check("graph", f"{backend}/B{case.batch}/out_of_place", same)
            # in place: one replay on fresh inputs rotates once
            iq, ik = q.clone(), k.clone()
            g2 = torch.cuda.CUDAGraph()
            with torch.cuda.stream(s):
                fusedrope.qwen3_tts_rope(iq.clone(), ik.clone(), cos, sin, inplace=True, backend=backend)
            torch.cuda.synchronize()
            with torch.cuda.graph(g2):
                fusedrope.qwen3_tts_rope(iq, ik, cos, sin, inplace=True, backend=backend)
            iq.copy_(q), ik.copy_(k)
            g2.replay()
            torch.cuda.synchronize()
            same = torch.equal(iq.view(torch.int16), eq.view(torch.int16)) and \
                torch.equal(ik.view(torch.int16), ek.view(torch.int16))
            res.check("graph", f"{backend}/B{case.batch}/inplace", same)


# ------------------------------------------------------------------------------------------------------------
# bandwidth roofline
# ------------------------------------------------------------------------------------------------------------
def copy_bw(res, args):
    import torch

    n = 2**30  # 1 GiB each way
    src = torch.randn(n // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    t = statistics.median(times)
    res["copy"] = {"bytes": 2 * n, "seconds": t, "tbps": 2 * n / t / 1e12}
    del src, dst
    torch.cuda.empty_cache()
    log(f"   copy: {res['copy']['tbps']:.2f} TB/s (read + write, 1 GiB)")


# ------------------------------------------------------------------------------------------------------------
# benchmark
# ------------------------------------------------------------------------------------------------------------
def _torch_formula(q, k, cos, sin):
    """The seed's baseline: q*cos + rotate_half(q)*sin in the input dtype."""
    from fusedrope.reference import rotate_half

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class InputSets:
    """Rotating input sets of one case: q/k as projection views, cos/sin as the model builds them."""

    def __init__(self, case, rotate_mb, max_sets, device="cuda"):
        import torch

        from fusedrope.testing import qwen3_tts_cos_sin

        B, S, HQ, HKV, D = case.batch, case.seq_len, case.num_q_heads, case.num_kv_heads, case.head_dim
        set_bytes = (case.rows + 2 * B * S) * D * 2  # q, k, cos, sin
        self.n = max(2, min(max_sets, math.ceil(rotate_mb * 2**20 / set_bytes)))
        self.rotated_mb = self.n * set_bytes / 2**20
        g = torch.Generator(device=device).manual_seed(0)
        self.proj = torch.randn(self.n, B, S, HQ + HKV, D, device=device, generator=g, dtype=torch.float32).to(torch.bfloat16)
        pos = torch.randint(0, 4096, (self.n * B, 1), device=device, generator=g) + torch.arange(S, device=device)
        cos, sin = qwen3_tts_cos_sin(pos, D)
        self.cos, self.sin = cos.view(self.n, B, S, D), sin.view(self.n, B, S, D)
        self.sets = [(self.proj[i, :, :, :HQ].transpose(1, 2), self.proj[i, :, :, HQ:].transpose(1, 2),
                      self.cos[i], self.sin[i]) for i in range(self.n)]
        self.q_out = torch.empty(B, HQ, S, D, device=device, dtype=torch.bfloat16)
        self.k_out = torch.empty(B, HKV, S, D, device=device, dtype=torch.bfloat16)


def time_calls(fn, n, reps):
    """(a) per call: CUDA events around n back-to-back calls; median over reps, in us."""
    import torch

    for i in range(min(n, 10)):
        fn(i)
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(n):
            fn(i)
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / n)
    return statistics.median(out)


def time_graph(fn, n, reps):
    """(b) device time per call: a CUDA graph of n calls, replayed; median over reps, in us."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / n)
    del g
    return statistics.median(out)


def _bench_fns(sets, compiled, liger):
    import torch

    import fusedrope

    S = sets.sets
    n = sets.n
    fns = {
        "eager": lambda i: _torch_formula(*S[i % n]),
        "triton": lambda i: fusedrope.qwen3_tts_rope(*S[i % n], backend="triton"),
    }
    if hasattr(torch.ops.fusedrope_cuda, "qwen3_tts_rope_out"):
        op = torch.ops.fusedrope_cuda.qwen3_tts_rope_out.default
        fns.update({
            "cuda": lambda i: fusedrope.qwen3_tts_rope(*S[i % n], backend="cuda"),
            "cuda_op": lambda i: op(*S[i % n], sets.q_out, sets.k_out),
            "cuda_ip": lambda i: fusedrope.qwen3_tts_rope(*S[i % n], inplace=True, backend="cuda"),
        })
    if compiled is not None:
        fns["compile"] = lambda i: compiled(*S[i % n])
    if liger is not None:
        fns["liger"] = lambda i: liger(*S[i % n])
    return fns


def bench(res, args):
    import torch

    from fusedrope.testing import TTS_CASES

    cases = [c for c in TTS_CASES if not args.cases or c.id in args.cases.split(",")]
    compiled = None
    if not args.no_compile:
        t = time.time()
        try:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
            compiled = torch.compile(_torch_formula, dynamic=True)
            res["compile_note"] = "torch.compile(dynamic=True) of the seed formula"
        except Exception as e:  # noqa: BLE001
            res["compile_note"] = f"torch.compile unavailable: {e}"
        res["compile_setup_s"] = round(time.time() - t, 1)
    liger = None
    if not args.no_liger:
        try:
            from liger_kernel.ops.rope import LigerRopeFunction

            liger = LigerRopeFunction.apply
            import liger_kernel

            res["liger"] = getattr(liger_kernel, "__version__", None) or _dist_version("liger-kernel")
        except Exception as e:  # noqa: BLE001
            res["liger"] = f"not importable: {type(e).__name__}: {e}"
    log(f"   liger: {res.get('liger')}")
    copy_tbps = res.get("copy", {}).get("tbps")
    rows = res.setdefault("bench", [])
    for case in cases:
        if elapsed() > args.budget_s - 45:
            res.setdefault("bench_skipped", []).append(case.id)
            continue
        sets = InputSets(case, args.rotate_mb, args.max_sets)
        row = {"case": case.id, "batch": case.batch, "seq_len": case.seq_len, "num_q_heads": case.num_q_heads,
               "num_kv_heads": case.num_kv_heads, "rows": case.rows, "bytes_moved": case.bytes_moved(),
               "sets": sets.n, "rotated_mb": round(sets.rotated_mb, 1)}
        for name, fn in _bench_fns(sets, compiled, liger).items():
            try:
                t = time.time()
                row[f"{name}_call_us"] = time_calls(fn, sets.n, args.reps)
                # Many-kernel backends: a shorter graph keeps capture time in bounds (their launches dominate).
                ng = sets.n if name not in ("eager", "compile", "liger") else min(sets.n, args.graph_cap)
                row[f"{name}_graph_us"] = time_graph(fn, ng, args.reps)
                row[f"{name}_graph_n"] = ng
                row[f"{name}_seconds"] = round(time.time() - t, 2)
            except Exception as e:  # noqa: BLE001
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                torch.cuda.synchronize()
        for name in ("cuda", "cuda_op", "cuda_ip", "triton", "liger", "compile"):
            t = row.get(f"{name}_graph_us")
            if t:
                row[f"{name}_tbps"] = case.bytes_moved() / (t * 1e-6) / 1e12
                if copy_tbps:
                    row[f"{name}_frac_copy"] = row[f"{name}_tbps"] / copy_tbps
        rows.append(row)
        log(f"   {case.id:<26} sets {sets.n:>5}  call us: " +
            " ".join(f"{b}={_fmt(row.get(f'{b}_call_us'))}" for b in BACKENDS_A) +
            f" | graph cuda_op {_fmt(row.get('cuda_op_graph_us'))} us = {_fmt(row.get('cuda_op_tbps'))} TB/s")
        del sets
        res.write()
    torch.cuda.empty_cache()


def _dist_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return "unknown"


# ------------------------------------------------------------------------------------------------------------
# launch-shape sweep (cuda)
# ------------------------------------------------------------------------------------------------------------
def sweep(res, args):
    import torch

    from fusedrope.testing import TTS_CASES

    need(30, args, "the sweep")
    shapes = [(0, 0, 0)] + [(0, w, t) for w in (1, 2, 3, 4) for t in (1, 2, 4) if w * t <= 8] + [(2, 0, 0), (1, 0, 0)]
    rows = res.setdefault("sweep", [])
    cfg_op = torch.ops.fusedrope_cuda.qwen3_tts_rope_out_config.default
    for cid in SWEEP_CASES:
        if elapsed() > args.budget_s - 10:
            break
        case = next(c for c in TTS_CASES if c.id == cid)
        sets = InputSets(case, min(args.rotate_mb, 128), min(args.max_sets, 1500))
        row = {"case": cid, "sets": sets.n}
        for vec, w, t in shapes:
            fn = (lambda i, vec=vec, w=w, t=t, st=sets:
                  cfg_op(*st.sets[i % st.n], st.q_out, st.k_out, vec, w, t, 0))
            try:
                row[f"v{vec}_w{w}_t{t}"] = round(time_graph(fn, sets.n, args.reps), 3)
            except Exception as e:  # noqa: BLE001
                row[f"v{vec}_w{w}_t{t}"] = f"error: {str(e)[:100]}"
        timed = {k: v for k, v in row.items() if isinstance(v, float)}
        if timed:
            best = min(timed, key=timed.get)
            row["best"], row["auto_over_best"] = best, round(timed.get("v0_w0_t0", float("nan")) / timed[best], 3)
        rows.append(row)
        log(f"   sweep {cid}: auto {row.get('v0_w0_t0')} us, best {row.get('best')} "
            f"{timed.get(row.get('best'), float('nan')):.3f} us")
        del sets


# ------------------------------------------------------------------------------------------------------------
# compute-sanitizer
# ------------------------------------------------------------------------------------------------------------
def _find_sanitizer():
    cands = [shutil.which("compute-sanitizer")]
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            cands.append(os.path.join(home, "bin", "compute-sanitizer"))
            cands.append(os.path.join(home, "compute-sanitizer", "compute-sanitizer"))
    return next((c for c in cands if c and os.path.isfile(c)), None)


def sanitize(res, args):
    import re

    tool = _find_sanitizer()
    if tool is None:
        raise SkipSection("compute-sanitizer not found")
    need(60, args, "compute-sanitizer")
    timeout = min(args.sanitize_timeout, max(30.0, args.budget_s - elapsed() - 15))
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
    cmd = [tool, "--tool", "memcheck", "--error-exitcode", "9", "--print-limit", "30", sys.executable,
           os.path.abspath(__file__), "--sanitize-subset", "--out", str(res.out)]
    t = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        text += "\n" + ((e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""))
        rc = "timeout"
    (res.out / "sanitizer.log").write_text(text[-4_000_000:])
    m = re.search(r"ERROR SUMMARY:\s*(\d+)\s+error", text)
    errors = int(m.group(1)) if m else None
    subset_ok = "SANITIZE SUBSET OK" in text
    res["sanitizer"] = {"returncode": rc, "errors": errors, "subset_ok": subset_ok, "seconds": round(time.time() - t, 1),
                        "command": " ".join(cmd)}
    res.check("sanitize", "memcheck", rc == 0 and errors == 0 and subset_ok,
              f"rc={rc} errors={errors} subset_ok={subset_ok} (see sanitizer.log)")
    log(f"   memcheck: rc={rc} errors={errors} subset_ok={subset_ok}")


def sanitize_subset_main(args) -> int:
    """Run under compute-sanitizer: small cases on every kernel path, checked against the oracle."""
    import torch

    from fusedrope import cuda_ext, cuda_tts_rope
    from fusedrope.reference import qwen3_tts_rope_oracle
    from fusedrope.testing import TtsCase, make_tts_inputs, poison_like, ulp_diff
    from fusedrope.tts_rope import REGISTRY, validate

    lib = cuda_ext.load()
    print("loaded", lib, flush=True)
    dev = torch.device("cuda")
    failures = []
    n = 0

    def check(name, q_out, k_out, q, k, cos, sin):
        nonlocal n
        n += 1
        torch.cuda.synchronize()
        q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
        if int(ulp_diff(q_out, q_ref).max()) > 1 or int(ulp_diff(k_out, k_ref).max()) > 1:
            failures.append(name)
            print("FAIL", name, flush=True)

    inputs = [(f"seed_{c.name}", *make_tts_inputs(c, device=dev, seed=1))
              for c in (TtsCase("qwen3_tts", 1, 16, 16, 8), TtsCase("gqa1", 2, 17, 16, 1))]
    inputs += [x for x in _extra_inputs(dev) if x[0] != "long_seq"]
    for backend in ("cuda", "triton"):
        for name, q, k, cos, sin in inputs:
            if backend == "triton" and not name.startswith(("seed", "strided", "misaligned")):
                continue
            q_out, k_out = poison_like(q.contiguous()), poison_like(k.contiguous())
            REGISTRY.select(validate(q, k, cos, sin, False), backend).fn()(q, k, cos, sin, q_out, k_out)
            check(f"{backend}/{name}", q_out, k_out, q, k, cos, sin)
    q, k, cos, sin = make_tts_inputs(TtsCase("cfg", 3, 7, 13, 5), device=dev, seed=2, random_cos_sin=True)
    for cfg in (dict(vec=2), dict(vec=1), dict(warps_per_token=8, tokens_per_cta=1),
                dict(warps_per_token=1, tokens_per_cta=8), dict(warps_per_token=3, tokens_per_cta=2, max_blocks=2)):
        q_out, k_out = poison_like(q.contiguous()), poison_like(k.contiguous())
        cuda_tts_rope.qwen3_tts_rope_config(q, k, cos, sin, q_out, k_out, **cfg)
        check(f"cfg/{cfg}", q_out, k_out, q, k, cos, sin)
        qi, ki = q.clone(), k.clone()
        cuda_tts_rope.qwen3_tts_rope_config(qi, ki, cos, sin, qi, ki, **cfg)
        check(f"cfg_inplace/{cfg}", qi, ki, q, k, cos, sin)
    torch.cuda.synchronize()
    if failures:
        print(f"SANITIZE SUBSET FAILED {len(failures)}/{n}: {failures}", flush=True)
        return 1
    print(f"SANITIZE SUBSET OK {n} checks", flush=True)
    return 0


# ------------------------------------------------------------------------------------------------------------
def fake_rows():
    from fusedrope.testing import TTS_CASES

    rows = []
    for i, c in enumerate(TTS_CASES):
        r = {"case": c.id, "batch": c.batch, "seq_len": c.seq_len, "num_q_heads": c.num_q_heads,
             "num_kv_heads": c.num_kv_heads, "rows": c.rows, "bytes_moved": c.bytes_moved(), "sets": 100,
             "rotated_mb": 128.0}
        for j, b in enumerate(BACKENDS_A):
            r[f"{b}_call_us"] = 5.0 + 3 * j + 0.1 * i
            r[f"{b}_graph_us"] = 2.0 + j + 0.05 * i
        if i % 5 == 0:
            r["liger_call_us"] = r["liger_graph_us"] = None
        r["cuda_op_tbps"] = c.bytes_moved() / (r["cuda_op_graph_us"] * 1e-6) / 1e12
        r["cuda_op_frac_copy"] = r["cuda_op_tbps"] / 4.3
        rows.append(r)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.sanitize_subset:
        return sanitize_subset_main(args)
    res = Results(out, args)
    if args.fake:
        res["bench"] = fake_rows()
        res["copy"] = {"tbps": 4.3}
        res.check("fake", "formatting", True)
        res.write()
        print(checks_summary(res))
        print(bench_table(res["bench"], 4.3))
        return 0
    skip = set(filter(None, args.skip.split(",")))
    res.section("env", env_info, args)
    res.section("build", build, args)
    built = res.get("build", {}).get("ok") or res.get("build", {}).get("fallback_qwen3_only") == "ok"
    for name, fn in (("correct", correct), ("graph", graph), ("copy", copy_bw), ("bench", bench),
                     ("sanitize", sanitize), ("compile", compile_check), ("sweep", sweep)):
        if name in skip:
            continue
        if name == "compile" and args.no_compile:
            continue
        if not built and name not in ("correct", "copy", "bench"):
            continue  # without the extension, still check and time triton (cuda columns stay empty)
        res.section(name, fn, args)
    res["total_seconds"] = round(elapsed(), 1)
    res.write()
    print()
    print(checks_summary(res))
    print()
    print(bench_table(res.get("bench", []), res.get("copy", {}).get("tbps")))
    bad = [c for c in res["checks"] if not c["ok"]]
    return 1 if bad or res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
