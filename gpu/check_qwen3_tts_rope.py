#!/usr/bin/env python3
"""qwen3_tts_rope on a GPU: build the CUDA extension, check the `cuda` and `triton` backends, benchmark them.

One run of a few minutes on the H200 test machine (gpu/README.md; gpu/run_all.sh runs it with the op-2 script
in one device call):

    PYTHONPATH=$PWD python3 gpu/check_qwen3_tts_rope.py --out $OUT

Sections (each in its own try/except: one failure does not lose the others; results rewritten after each):
  env       fusedrope.benchmark.machine_info (GPU, versions, commit, command) plus nvcc
  build     JIT-build the extension (all kernels_cuda sources); if that fails, the qwen3 sources alone
  correct   cuda + triton vs the float64 oracle (<= 1 ulp, correctly rounded but for rare ties) on the 18 seed
            cases, strided, misaligned (odd element offset), 4-byte-aligned, cos-broadcast, in place,
            contiguous, fp16, D=64/256, forced launch shapes and vector widths, a capped grid, empty inputs,
            bad input errors
  graph     CUDA-graph replay gives the same bytes as eager (cuda and triton, out of place and in place)
  copy      fusedrope.benchmark.copy_roofline: device-to-device copy (bytes read + written), the roofline
  bench     fusedrope.benchmark.measure over the seed cases: (a) per call, CUDA events around back-to-back
            calls (host overhead included, as the seed measured), (b) device time per call from CUDA-graph
            replay; inputs rotate among sets holding >= 3x the L2. Contenders: the engine's eager, compile,
            triton, cuda, liger, plus cuda_op (raw op, preallocated outputs) and cuda_ip (public API in place)
  sanitize  re-runs this script with --sanitize-subset under `compute-sanitizer --tool memcheck`
  compile   the public op under torch.compile(fullgraph=True) equals eager
  sweep     cuda launch shapes (warps per token x tokens per block, vector width) on a few cases, graph timing

Outputs in --out: results.json (everything), bench.csv and bench.md (the engine's writers; bench.md ends with
the sweep), sanitizer.log. The seed table is printed last.

`--fake` is the CPU self-test: the sections that need no GPU (env, copy, bench with the eager contender on the
wall clock, every GPU contender skipped with its reason), written to the same files.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fusedrope import benchmark as B  # noqa: E402
from fusedrope.benchmark import report  # noqa: E402
from fusedrope.benchmark import timing  # noqa: E402
from fusedrope.testing import TTS_CASES  # noqa: E402
import raw_rejects  # noqa: E402  (gpu/raw_rejects.py, beside this script)
from memcheck import cut_clean, cut_reason, find_sanitizer, run_memcheck  # noqa: E402  (gpu/memcheck.py, beside this script)

T0 = time.time()
BENCH_CONTENDERS = ("eager", "compile", "triton", "cuda", "liger")  # the engine's; cuda_op / cuda_ip added
# Seconds each section after the bench asks of the budget before it starts (need()); the bench keeps that much
# for the ones that will run, but never so much that it gets less than BENCH_MIN_S itself (its target cases come
# first), so a slow build costs the later sections (each skipped visibly) before it costs every timing.
LATER_S = {"compile": 25, "sanitize": 60, "sweep": 30}
BENCH_MIN_S = 60
# The bench measures these first (issue #4's bandwidth target, wide_heads B=32, and the Qwen3-TTS shapes the op
# exists for), then the rest of the seed matrix, so a budget cut loses the least; tables keep seed order.
BENCH_FIRST = ("wide_heads-B32", "qwen3_tts-B1", "qwen3_tts-B8", "qwen3_tts-B32")
SWEEP_CASES = ("qwen3_tts-B1", "qwen3_tts-B8", "qwen3_tts-B32", "wide_heads-B8", "wide_heads-B32", "gqa1-B32")


def elapsed() -> float:
    return time.time() - T0


def log(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_out"), help="output folder (default $OUT)")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="wall-clock budget: the bench stops early and optional sections (sanitize, sweep) "
                        "are skipped when it runs out")
    p.add_argument("--max-sets", type=int, default=B.MAX_SETS, help="cap on rotating input sets per case")
    # 5, as the bench CLI on a GPU and the op-2 script: on the H200 (63f6bd6, 3 reps) per-call times of the same
    # code path varied from 15 to 26 us between neighbouring cases
    p.add_argument("--reps", type=int, default=5, help="repetitions per timing (median)")
    p.add_argument("--cases", default="", help="comma-separated case ids to benchmark (default: all 18)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (saves its compile time)")
    p.add_argument("--no-liger", action="store_true")
    p.add_argument("--skip", default="", help="comma-separated sections to skip: correct,graph,copy,bench,"
                                              "sanitize,compile,sweep")
    p.add_argument("--sanitize-subset", action="store_true",
                   help="(internal) the small correctness subset run under compute-sanitizer")
    p.add_argument("--sanitize-timeout", type=float, default=150.0)
    p.add_argument("--raw-rejects", action="store_true",
                   help="(internal) bad inputs to the raw op, in a child process (a crash is one failed check)")
    p.add_argument("--commit", default="", help="git commit to record (sets FUSEDROPE_GIT_COMMIT; default: "
                   "that variable, else git rev-parse HEAD)")
    p.add_argument("--fake", action="store_true",
                   help="CPU self-test: env, copy and bench on the CPU (eager only, wall clock), same files")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------------------
# results bookkeeping
# ------------------------------------------------------------------------------------------------------------
class Results(dict):
    """results.json; ``meta``, ``copy`` and ``rows`` have the engine's shapes, so its writers take it."""

    def __init__(self, out: Path, args, device: torch.device):
        super().__init__()
        self.out = out
        self.device = device
        self.update(meta={}, args=vars(args), sections={}, errors={}, checks=[], copy={}, rows=[])

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
        self["checks"].append({"section": section, "name": name, "ok": bool(ok),
                               "detail": str(detail)[:2000]})
        if not ok:
            log(f"   FAIL {section}/{name}: {str(detail)[:400]}")

    def write(self):
        self.out.mkdir(parents=True, exist_ok=True)
        report.write_json(self, self.out / "results.json")
        if self["rows"] and self["meta"]:
            report.write_csv(self["rows"], self.out / "bench.csv")
            (self.out / "bench.md").write_text(report.markdown(self) + sweep_markdown(self.get("sweep", [])))


class SkipSection(Exception):
    pass


def need(seconds: float, args, what: str):
    left = args.budget_s - elapsed()
    if left < seconds:
        raise SkipSection(f"{what} needs ~{seconds:.0f}s, {left:.0f}s of the budget left")


def checks_summary(res) -> str:
    checks = res.get("checks", [])
    bad = [c for c in checks if not c["ok"]]
    lines = [f"checks: {len(checks) - len(bad)} passed, {len(bad)} failed"]
    for c in bad[:15]:
        lines.append(f"  FAIL {c['section']}/{c['name']}: {c['detail'][:200]}")
    for name, s in res.get("sections", {}).items():
        lines.append(f"  section {name:<9} {s['status'][:150]} ({s['seconds']}s)")
    return "\n".join(lines)


def sweep_markdown(rows) -> str:
    if not rows:
        return ""
    lines = [[r["case"], str(r["sets"]), str(r.get("v0_w0_t0", "-")), str(r.get("best", "-")),
              str(r.get(r.get("best"), "-")), str(r.get("auto_over_best", "-"))] for r in rows]
    return ("\n## cuda launch-shape sweep (device us per call from graph replay; v = vector width, w = warps "
            "per token, t = tokens per block, 0 = automatic)\n\n"
            + report._table(["case", "sets", "auto us", "best shape", "best us", "auto / best"], lines))


# ------------------------------------------------------------------------------------------------------------
# environment
# ------------------------------------------------------------------------------------------------------------
def env_info(res, args):
    if args.commit:  # the engine's own override, so the tree state is judged against this commit too
        os.environ[B.ENV_GIT_COMMIT] = args.commit
    info = B.machine_info(res.device)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    try:
        info["nvcc"] = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                                      timeout=20).stdout.strip().splitlines()[-1]
    except Exception as e:  # noqa: BLE001
        info["nvcc"] = f"unavailable: {e}"
    if res.device.type == "cuda":
        info["sm"] = "%d.%d" % torch.cuda.get_device_capability(res.device)
    res["meta"] = info
    log(f"   {info.get('gpu') or 'no GPU'} sm {info.get('sm')} | torch {info['torch']} "
        f"cuda {info['torch_cuda']} | triton {info['triton']} | {info['nvcc']} | "
        f"commit {info['git_commit'][:12]}")


# ------------------------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------------------------
def build(res, args):
    from fusedrope import cuda_ext, jit_ext

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
        if isinstance(e, jit_ext.NoBuildAllowed):  # run_all.sh's build failed: its log says why; not retried
            raise
        # Debug aid: the qwen3 sources alone (another op's source must not hide whether this one builds).
        need(90, args, "the qwen3-only fallback build")
        from torch.utils import cpp_extension

        d = cuda_ext.kernel_dir()
        name = "fusedrope_cuda_qwen3_only"
        bdir = cuda_ext.build_root() / name
        bdir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", info["arch_list"])
        try:
            lib = cpp_extension.load(name=name, sources=[str(d / "qwen3_tts_rope.cu"),
                                                         str(d / "qwen3_tts_rope_torch.cpp")],
                                     extra_cflags=list(cuda_ext.CXX_FLAGS),
                                     extra_cuda_cflags=list(cuda_ext.NVCC_FLAGS),
                                     build_directory=str(bdir), is_python_module=False, verbose=False)
            cuda_ext.EXT.loaded, cuda_ext.EXT.failure = str(lib), None  # let the backend use it for the checks
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
def _ulp_stats(out, ref):
    from fusedrope.testing import ulp_diff

    d = ulp_diff(out, ref)
    worst = int(d.max()) if d.numel() else 0
    return f"max {worst} ulp, {int((d != 0).sum())}/{out.numel()} not correctly rounded"


def _contract(q_out, k_out, q, k, cos, sin, oracle=None):
    """The op's accuracy contract (fusedrope.testing.assert_tts_rope_close): "" when met, else why not."""
    from fusedrope.testing import assert_tts_rope_close

    try:
        assert_tts_rope_close(q_out, k_out, q, k, cos, sin, oracle=oracle)
        return ""
    except AssertionError as e:
        return str(e)


def _sync(t) -> None:
    if t.is_cuda:
        torch.cuda.synchronize()


def _verify(res, section, name, q_out, k_out, q, k, cos, sin, written=None):
    """Outputs within 1 ulp of the oracle; ``written`` (from :func:`_guarded_outputs`): and no byte written
    around them."""
    from fusedrope.reference import qwen3_tts_rope_oracle

    _sync(q)
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    why = _contract(q_out, k_out, q, k, cos, sin, (q_ref, k_ref))
    stray = written() if written else 0
    ok = not why and stray == 0
    res.check(section, name, ok, f"q: {_ulp_stats(q_out, q_ref)}; k: {_ulp_stats(k_out, k_ref)}"
              + (f"; {why}" if why else "") + (f"; {stray} guard bytes written" if stray else ""))
    return ok


def _guarded_outputs(q, k):
    """Poisoned q_out, k_out inside poisoned guard buffers (compute-sanitizer misses a write into the caching
    allocator's slack), and a function that counts the guard bytes written."""
    from fusedrope.testing import bytes_written_outside, guarded_poison

    (q_out, q_buf), (k_out, k_buf) = (guarded_poison(t.shape, t.dtype, t.device) for t in (q, k))
    return q_out, k_out, lambda: bytes_written_outside(q_buf, q_out) + bytes_written_outside(k_buf, k_out)


def _extra_inputs(device):
    """(name, q, k, cos, sin) beyond the seed matrix."""
    from fusedrope.testing import TtsCase, make_tts_inputs, own_batch_strides, to_device_keeping_layout

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
    out.append(("misaligned_odd_offset", proj[:, :, :16].transpose(1, 2), proj[:, :, 16:].transpose(1, 2),
                c, s))
    # cos expanded over B (batch stride 0), sin with its own batch stride S*D + 4: sin's rows for b >= 1 are not
    # 16-byte aligned, so the vector path must be refused (each table's stride checked on its own).
    q3, k3, c3, s3 = make_tts_inputs(TtsCase("tb", 4, 16, 16, 8), seed=4, random_cos_sin=True)
    out.append(("tables_own_batch_strides", q3, k3, *own_batch_strides(c3, s3)))
    for name, case, kw in (
        ("cos_broadcast", TtsCase("bc", 8, 16, 16, 8), dict(cos_batch=1)),
        ("contiguous_layout", TtsCase("ct", 8, 17, 16, 8), dict(layout="contiguous")),
        ("independent_halves", TtsCase("ih", 4, 9, 12, 4), dict(random_cos_sin=True)),
        ("fp16", TtsCase("h", 8, 16, 16, 8), dict(dtype=torch.float16, random_cos_sin=True)),
        ("D64", TtsCase("d64", 4, 9, 16, 2, 64), dict(random_cos_sin=True)),
        ("D256", TtsCase("d256", 4, 9, 16, 2, 256), dict(random_cos_sin=True)),
        ("D256_fp16_contig", TtsCase("d256h", 3, 5, 7, 3, 256),
         dict(dtype=torch.float16, layout="contiguous")),
        ("many_heads", TtsCase("mh", 2, 3, 100, 37), dict(random_cos_sin=True)),
        ("long_seq", TtsCase("ls", 1, 3000, 16, 8), dict()),
        ("subnormal", TtsCase("sn", 4, 9, 16, 8), dict(random_cos_sin=True, subnormal=True)),
        ("subnormal_fp16", TtsCase("snh", 4, 9, 16, 8), dict(dtype=torch.float16, subnormal=True)),
    ):
        out.append((name, *make_tts_inputs(case, seed=len(name), **kw)))
    # .to(device) would make the strided and offset views dense and aligned: the layouts these cases are about
    return [(n, *(to_device_keeping_layout(t, device) for t in ts)) for n, *ts in out]


def correct(res, args):
    import fusedrope
    from fusedrope.testing import TTS_CASES, make_tts_inputs
    from fusedrope.qwen3_tts_rope import REGISTRY, validate

    dev = torch.device("cuda")
    ex = fusedrope.explain("qwen3_tts_rope", *make_tts_inputs(TTS_CASES[0], device=dev))
    res["explain_auto"] = str(ex)
    log("   " + str(ex).replace("\n", "\n   "))
    res.check("correct", "auto_picks_cuda", ex.chosen == "cuda", str(ex))
    backends = [d.backend for d in ex if d.backend in ("cuda", "triton") and d.runs]
    for backend in ("cuda", "triton"):
        res.check("correct", f"{backend}/available", backend in backends, str(ex))

    def run(backend, q, k, cos, sin):
        q_out, k_out, written = _guarded_outputs(q, k)
        REGISTRY.select(validate(q, k, cos, sin, False), backend).run(q, k, cos, sin, q_out, k_out)
        return q_out, k_out, written

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
    import fusedrope
    from fusedrope.testing import TTS_CASES, TtsCase, make_tts_inputs

    for case in TTS_CASES:
        q, k, cos, sin = make_tts_inputs(case, device=dev, seed=case.seed)
        q_out, k_out, written = run(backend, q, k, cos, sin)
        _verify(res, "correct", f"{backend}/{case.id}", q_out, k_out, q, k, cos, sin, written)
    for name, q, k, cos, sin in _extra_inputs(dev):
        q_out, k_out, written = run(backend, q, k, cos, sin)
        _verify(res, "correct", f"{backend}/{name}", q_out, k_out, q, k, cos, sin, written)
    # new outputs through the public API (the cuda backend allocates them inside its C++ op): contiguous, right
    for case in [*TTS_CASES[::3], TtsCase("pub", 3, 17, 16, 8)]:
        q, k, cos, sin = make_tts_inputs(case, device=dev, seed=3)
        qo, ko = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)
        shapes = (qo.shape == q.shape and ko.shape == k.shape and qo.is_contiguous() and ko.is_contiguous()
                  and qo.dtype == q.dtype and ko.device == k.device)
        ok = _verify(res, "correct", f"{backend}/public/{case.id}", qo, ko, q, k, cos, sin)
        res.check("correct", f"{backend}/public/{case.id}/layout", shapes and ok)
    # in place through the projection view, public API
    q, k, cos, sin = make_tts_inputs(TtsCase("ip", 8, 17, 16, 8), device=dev, seed=7)
    q0, k0 = q.clone(), k.clone()
    qo, ko = fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend=backend)
    _sync(q)
    why = _contract(q, k, q0, k0, cos, sin)
    res.check("correct", f"{backend}/inplace", qo is q and ko is k and not why, why)
    # into caller buffers: k_out a slice of a NaN-filled static KV cache (a 16-byte-aligned, strided view)
    q, k, cos, sin = make_tts_inputs(TtsCase("buf", 4, 9, 16, 8), device=dev, seed=8)
    cache = torch.full((4, 8, 32, 128), float("nan"), dtype=k.dtype, device=dev)
    qo, ko = fusedrope.qwen3_tts_rope(q, k, cos, sin, k_out=cache[:, :, 5:14], backend=backend)
    ok = _verify(res, "correct", f"{backend}/k_out_cache_slice", qo, ko, q, k, cos, sin)
    cache[:, :, 5:14] = 0
    res.check("correct", f"{backend}/k_out_cache_slice/outside", ok and bool(cache.isnan().sum() == cache.numel()
                                                                              - 4 * 8 * 9 * 128))
    for shape in ((0, 4, 3, 128), (2, 4, 0, 128), (2, 0, 3, 128)):
        B, H, S, D = shape
        qe = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
        ke = torch.randn(B, 2, S, D, device=dev, dtype=torch.bfloat16)
        ce = torch.randn(max(B, 1), S, D, device=dev, dtype=torch.bfloat16)
        qo, ko = fusedrope.qwen3_tts_rope(qe, ke, ce, ce, backend=backend)
        res.check("correct", f"{backend}/empty{shape}", qo.shape == qe.shape and ko.shape == ke.shape)


def _correct_reference_cpu(res, args):
    """--fake: the correctness machinery of _correct_backend, on the CPU with the reference backend."""
    from fusedrope.qwen3_tts_rope import REGISTRY, validate

    def run(backend, q, k, cos, sin):
        q_out, k_out, written = _guarded_outputs(q, k)
        REGISTRY.select(validate(q, k, cos, sin, False), backend).run(q, k, cos, sin, q_out, k_out)
        return q_out, k_out, written

    _correct_backend(res, "reference", run, torch.device("cpu"))


def _correct_cuda_only(res, dev):
    """Forced launch shapes / vector widths, a capped grid (token loop), in place with each; bad inputs."""
    from fusedrope.qwen3_tts_rope import cuda as cuda_tts_rope
    from fusedrope.testing import TtsCase, make_tts_inputs

    cfgs = [dict(vec=8), dict(vec=2), dict(vec=1), dict(warps_per_token=1, tokens_per_cta=1),
            dict(warps_per_token=4, tokens_per_cta=2), dict(warps_per_token=8, tokens_per_cta=1),
            dict(warps_per_token=1, tokens_per_cta=8),
            dict(warps_per_token=3, tokens_per_cta=2, max_blocks=7),
            dict(vec=1, warps_per_token=2, tokens_per_cta=4, max_blocks=1)]
    for case in (TtsCase("cfg", 3, 17, 16, 8), TtsCase("cfg64", 2, 9, 13, 5, 64),
                 TtsCase("cfg256", 2, 9, 7, 3, 256)):
        q, k, cos, sin = make_tts_inputs(case, device=dev, seed=11, random_cos_sin=True)
        for cfg in cfgs:
            tag = ",".join(f"{a}={b}" for a, b in cfg.items())
            q_out, k_out, written = _guarded_outputs(q, k)
            cuda_tts_rope.qwen3_tts_rope_config(q, k, cos, sin, q_out, k_out, **cfg)
            _verify(res, "correct", f"cuda_cfg/{case.name}/{tag}", q_out, k_out, q, k, cos, sin, written)
            qi, ki = q.clone(), k.clone()
            cuda_tts_rope.qwen3_tts_rope_config(qi, ki, cos, sin, qi, ki, **cfg)
            _verify(res, "correct", f"cuda_cfg_inplace/{case.name}/{tag}", qi, ki, q, k, cos, sin)

    _raw_op_rejects(res)


def _raw_reject_cases() -> dict:
    """Bad inputs to the raw op (they reach it only through misuse): each must raise, not crash."""
    from fusedrope import cuda_ext
    from fusedrope.testing import TtsCase, make_tts_inputs

    cuda_ext.load()
    dev = torch.device("cuda")
    q, k, cos, sin = make_tts_inputs(TtsCase("bad", 2, 3, 4, 2), device=dev)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    ops = torch.ops.fusedrope_cuda

    def misaligned_wide():
        buf = torch.empty(q.numel() + 1, device=dev, dtype=q.dtype)
        ops.qwen3_tts_rope_out_config(q, k, cos, sin, buf[1:].view(q.shape), ko, 8, 0, 0, 0)

    return {"fp32": lambda: ops.qwen3_tts_rope_out(*(t.float() for t in (q, k, cos, sin, qo, ko))),
            "cpu_k": lambda: ops.qwen3_tts_rope_out(q, k.cpu(), cos, sin, qo, ko),
            "D96": lambda: ops.qwen3_tts_rope_out(*(t[..., :96] for t in (q, k, cos, sin, qo, ko))),
            "k_batch_mismatch": lambda: ops.qwen3_tts_rope_out(q, k[:1], cos, sin, qo, ko[:1]),
            "config_out_of_range": lambda: ops.qwen3_tts_rope_out_config(q, k, cos, sin, qo, ko, 3, 9, 0, 0),
            "wide_vec_on_misaligned": misaligned_wide}


def _raw_op_rejects(res):
    """The raw op's bad inputs, in a child process (gpu/raw_rejects.py): a crash is one failed check."""
    for name, ok, detail in raw_rejects.checks(os.path.abspath(__file__), list(_raw_reject_cases())):
        res.check("correct", f"cuda_rejects/{name}", ok, detail)


def _liger_accuracy(res, dev):
    """Peer accuracy, for information (Liger rotates in place and reads only the first half of cos/sin)."""
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
    need(LATER_S["compile"], args, "the compile check")  # two cold inductor compiles
    import fusedrope
    from fusedrope.testing import TtsCase, make_tts_inputs

    q, k, cos, sin = make_tts_inputs(TtsCase("tc", 4, 16, 16, 8), device="cuda", seed=10)
    for inplace in (False, True):
        def f(q, k, cos, sin):  # elementwise consumers only: a reduction's order may differ under inductor
            a, b = fusedrope.qwen3_tts_rope(q * 2, k, cos, sin, inplace=inplace, backend="cuda")
            return a + 1, b - 1

        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True)(q.clone(), k.clone(), cos, sin)
        want = f(q.clone(), k.clone(), cos, sin)
        res.check("compile", f"fullgraph_inplace={inplace}",
                  all(torch.equal(a, b) for a, b in zip(got, want)))


# ------------------------------------------------------------------------------------------------------------
# CUDA graphs: replay == eager, bytewise
# ------------------------------------------------------------------------------------------------------------
def graph(res, args):
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
            g, got = torch.cuda.CUDAGraph(), {}
            # capture_graph: a failed capture restores the stream and raises the call's own error (torch's bare
            # context manager would leave every later section on the dead capture stream)
            timing.capture_graph(
                g, lambda i: got.update(out=fusedrope.qwen3_tts_rope(sq, sk, sc, ss, backend=backend)), 1)
            gq, gk = got["out"]
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
            timing.capture_graph(
                g2, lambda i: fusedrope.qwen3_tts_rope(iq, ik, cos, sin, inplace=True, backend=backend), 1)
            iq.copy_(q), ik.copy_(k)
            g2.replay()
            torch.cuda.synchronize()
            same = torch.equal(iq.view(torch.int16), eq.view(torch.int16)) and \
                torch.equal(ik.view(torch.int16), ek.view(torch.int16))
            res.check("graph", f"{backend}/B{case.batch}/inplace", same)

# ------------------------------------------------------------------------------------------------------------
# bandwidth roofline and benchmark: the engine's (fusedrope/benchmark.py)
# ------------------------------------------------------------------------------------------------------------
def copy_section(res, args):
    res["copy"] = B.copy_roofline(res.device)
    log(f"   copy: {res['copy']['tbps']:.2f} TB/s (read + write, {res['copy']['bytes_each_way'] >> 20} MiB; "
        f"{res['copy'].get('timing', '')})")


def _cuda_op_maker(case, sets):
    """The raw torch op on preallocated outputs: the kernel plus the dispatcher, no Python wrapper."""
    op = torch.ops.fusedrope_cuda.qwen3_tts_rope_out.default
    q, k = sets[0][:2]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    return lambda i: op(*sets[i % len(sets)], q_out, k_out)


def _cuda_ip_maker(case, sets):
    import fusedrope

    fn = functools.partial(fusedrope.qwen3_tts_rope, inplace=True, backend="cuda")
    return lambda i: fn(*sets[i % len(sets)])


class _OnTargetCases(B.Contender):
    """A contender for information only (where the per-call time goes), timed on BENCH_FIRST's cases alone so
    that the budget goes to the whole matrix of the contenders the targets compare."""

    def case_reason(self, case, sets):
        if case.id not in BENCH_FIRST:
            return f"timed on {', '.join(BENCH_FIRST)} only (time budget)"
        return super().case_reason(case, sets)


def bench_contenders(args, device: torch.device) -> list:
    """The engine's contenders plus cuda_op and cuda_ip (after cuda, on BENCH_FIRST's cases), with the cuda
    backend's reason."""
    only = [n for n in BENCH_CONTENDERS if not (n == "liger" and args.no_liger)]
    cl = B.contenders(B.TTS, device, compile=device.type == "cuda" and not args.no_compile, only=only)
    cuda = next(c for c in cl if c.name == "cuda")
    extra = [_OnTargetCases("cuda_op", B.TTS, "torch.ops.fusedrope_cuda.qwen3_tts_rope_out on preallocated "
                                           "outputs (the kernel plus the dispatcher)",
                         _cuda_op_maker, reason=cuda.reason, backend="cuda"),
             _OnTargetCases("cuda_ip", B.TTS, "fusedrope.qwen3_tts_rope(..., inplace=True, backend='cuda')",
                         _cuda_ip_maker, reason=cuda.reason, backend="cuda")]
    at = cl.index(cuda) + 1
    return cl[:at] + extra + cl[at:]


def skipped_by_args(name: str, args) -> bool:
    """Whether ``--skip`` (or ``--no-compile`` for the compile check) leaves section ``name`` out."""
    return name in set(filter(None, args.skip.split(","))) or (name == "compile" and args.no_compile)


def bench_reserve(args, now: float) -> float:
    """Seconds the bench leaves for the later sections that will run (LATER_S), capped so that the bench itself
    gets BENCH_MIN_S of what is left at ``now``."""
    later = [n for n in LATER_S if not skipped_by_args(n, args)
             and not (n == "sanitize" and find_sanitizer() is None)]
    return min(sum(LATER_S[n] for n in later), max(0.0, args.budget_s - now - BENCH_MIN_S))


def selected_cases(args) -> list:
    """The seed cases the bench times: all 18, or those ``--cases`` names (seed order)."""
    return [c for c in TTS_CASES if not args.cases or c.id in args.cases.split(",")]


def bench(res, args):
    dev = res.device
    seed_order = {c.id: i for i, c in enumerate(TTS_CASES)}
    first = {cid: i for i, cid in enumerate(BENCH_FIRST)}
    cases = sorted(selected_cases(args),
                   key=lambda c: (first.get(c.id, len(first)), seed_order[c.id]))
    cl = bench_contenders(args, dev)
    res["contenders"] = [{"name": c.name, "what": c.what, "unavailable": c.reason} for c in cl]
    for c in cl:
        if c.reason:
            log(f"   skip {c.name}: {c.reason}")
    reserve = bench_reserve(args, elapsed())
    res["bench_reserve_s"] = reserve
    for case in cases:
        if elapsed() > args.budget_s - reserve:
            why = f"time budget (--budget-s {args.budget_s:.0f}, {reserve:.0f} s kept for later sections)"
            res["rows"] += [{"op": B.TTS, **B.case_fields(B.TTS, case), "contender": c.name,
                             "status": "skipped", "reason": why} for c in cl]
            continue
        sets = B.tts_sets(case, B.num_sets(B.input_bytes(B.TTS, case), dev, args.max_sets), dev)
        res["rows"] += B.measure(B.TTS, case, cl, dev, reps=args.reps, copy_tbps=res["copy"].get("tbps"),
                                 sets=sets, log=log)
        res["rows"].sort(key=lambda r: seed_order[r["case"]])  # stable: contenders keep their order
        del sets
        res.write()
    res["rows"].sort(key=lambda r: seed_order[r["case"]])  # the cases the budget cut too


# ------------------------------------------------------------------------------------------------------------
# launch-shape sweep (cuda)
# ------------------------------------------------------------------------------------------------------------
def sweep(res, args):
    need(LATER_S["sweep"], args, "the sweep")
    dev = res.device
    shapes = [(0, 0, 0)] + [(0, w, t) for w in (1, 2, 3, 4) for t in (1, 2, 4) if w * t <= 8] + \
             [(2, 0, 0), (1, 0, 0)]
    rows = res.setdefault("sweep", [])
    cfg_op = torch.ops.fusedrope_cuda.qwen3_tts_rope_out_config.default
    for cid in SWEEP_CASES:
        if elapsed() > args.budget_s - 10:
            break
        case = next(c for c in TTS_CASES if c.id == cid)
        sets = B.tts_sets(case, B.num_sets(B.input_bytes(B.TTS, case), dev, min(args.max_sets, 1500)), dev)
        n = len(sets)
        q, k = sets[0][:2]
        q_out = torch.empty(q.shape, dtype=q.dtype, device=dev)
        k_out = torch.empty(k.shape, dtype=k.dtype, device=dev)
        row = {"case": cid, "sets": n}
        for vec, w, t in shapes:
            def call(i, vec=vec, w=w, t=t, st=sets):
                return cfg_op(*st[i % n], q_out, k_out, vec, w, t, 0)
            try:
                row[f"v{vec}_w{w}_t{t}"] = round(timing.time_graph_us(call, n, args.reps), 3)
            except Exception as e:  # noqa: BLE001
                row[f"v{vec}_w{w}_t{t}"] = f"error: {str(e)[:100]}"
        timed = {k: v for k, v in row.items() if isinstance(v, float)}
        if timed:
            best = min(timed, key=timed.get)
            row["best"] = best
            row["auto_over_best"] = round(timed.get("v0_w0_t0", float("nan")) / timed[best], 3)
        rows.append(row)
        log(f"   sweep {cid}: auto {row.get('v0_w0_t0')} us, best {row.get('best')} "
            f"{timed.get(row.get('best'), float('nan')):.3f} us")
        del sets


# ------------------------------------------------------------------------------------------------------------
# compute-sanitizer
# ------------------------------------------------------------------------------------------------------------
def sanitize(res, args):
    tool = find_sanitizer()
    if tool is None:
        raise SkipSection("compute-sanitizer not found")
    need(LATER_S["sanitize"], args, "compute-sanitizer")
    timeout = min(args.sanitize_timeout, max(30.0, args.budget_s - elapsed() - 15))
    t = time.time()
    mc = run_memcheck(tool, [sys.executable, os.path.abspath(__file__), "--sanitize-subset", "--out", str(res.out)],
                      timeout, error_exitcode=9)
    text, rc, errors = mc["text"], mc["returncode"], mc["errors"]
    (res.out / "sanitizer.log").write_text(text[-4_000_000:])
    subset_ok = "SANITIZE SUBSET OK" in text
    res["sanitizer"] = {"returncode": rc, "errors": errors, "reported": mc["reported"], "subset_ok": subset_ok,
                        "seconds": round(time.time() - t, 1), "command": mc["command"]}
    log(f"   memcheck: rc={rc} errors={errors} reported={mc['reported']} subset_ok={subset_ok}")
    if cut_clean(mc):  # no verdict: recorded as cut short, neither passed nor failed
        raise SkipSection(f"{cut_reason(timeout)} (see sanitizer.log)")
    res.check("sanitize", "memcheck", rc == 0 and errors == 0 and subset_ok,
              f"rc={rc} errors={errors} reported={mc['reported']} subset_ok={subset_ok} (see sanitizer.log)")


def sanitize_subset_main(args) -> int:
    """Run under compute-sanitizer: small cases on every kernel path, checked against the oracle."""
    from fusedrope import cuda_ext, cuda_tts_rope
    from fusedrope.testing import TtsCase, make_tts_inputs, poison_like
    from fusedrope.qwen3_tts_rope import REGISTRY, validate

    lib = cuda_ext.load()
    print("loaded", lib, flush=True)
    dev = torch.device("cuda")
    failures = []
    n = 0

    def check(name, q_out, k_out, q, k, cos, sin):
        nonlocal n
        n += 1
        torch.cuda.synchronize()
        why = _contract(q_out, k_out, q, k, cos, sin)
        if why:
            failures.append(name)
            print("FAIL", name, why, flush=True)

    inputs = [(f"seed_{c.name}", *make_tts_inputs(c, device=dev, seed=1))
              for c in (TtsCase("qwen3_tts", 1, 16, 16, 8), TtsCase("gqa1", 2, 17, 16, 1))]
    inputs += [x for x in _extra_inputs(dev) if x[0] != "long_seq"]
    for backend in ("cuda", "triton"):
        for name, q, k, cos, sin in inputs:
            if backend == "triton" and not name.startswith(("seed", "strided", "misaligned")):
                continue
            q_out, k_out = poison_like(q.contiguous()), poison_like(k.contiguous())
            REGISTRY.select(validate(q, k, cos, sin, False), backend).run(q, k, cos, sin, q_out, k_out)
            check(f"{backend}/{name}", q_out, k_out, q, k, cos, sin)
    q, k, cos, sin = make_tts_inputs(TtsCase("cfg", 3, 7, 13, 5), device=dev, seed=2, random_cos_sin=True)
    for cfg in (dict(vec=2), dict(vec=1), dict(warps_per_token=8, tokens_per_cta=1),
                dict(warps_per_token=1, tokens_per_cta=8),
                dict(warps_per_token=3, tokens_per_cta=2, max_blocks=2)):
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
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.sanitize_subset:
        return sanitize_subset_main(args)
    if args.raw_rejects:
        return raw_rejects.child(_raw_reject_cases())
    if args.fake:  # CPU self-test: the sections that need no GPU, on the CPU, through the same engine calls
        res = Results(Path(args.out), args, torch.device("cpu"))
        args.no_compile = True
        torch.set_num_threads(1)  # as the engine on a CPU: a shared VM's parallel regions wait tens of ms
        for name, fn in (("env", env_info), ("copy", copy_section), ("bench", bench)):
            res.section(name, fn, args)
        res.section("correct_reference", _correct_reference_cpu, args)
        eager = [r for r in res["rows"] if r["contender"] == "eager"]
        res.check("fake", "eager_timed_on_every_case", len(eager) == len(selected_cases(args)) > 0
                  and all(r["status"] == "ok" for r in eager), [r.get("reason") for r in eager][:3])
        sections = ()
    else:
        res = Results(Path(args.out), args, torch.device("cuda"))
        res.section("env", env_info, args)
        res.section("build", build, args)
        # the compile check (cheap) before the sanitizer, whose run may take what is left
        sections = (("correct", correct), ("graph", graph), ("copy", copy_section), ("bench", bench),
                    ("compile", compile_check), ("sanitize", sanitize), ("sweep", sweep))
    built = res.get("build", {}).get("ok") or res.get("build", {}).get("fallback_qwen3_only") == "ok"
    for name, fn in sections:
        if skipped_by_args(name, args):
            continue
        if not built and name not in ("correct", "copy", "bench"):
            continue  # without the extension, still check and time triton (cuda columns stay empty)
        res.section(name, fn, args)
    res["meta"]["seconds"] = round(elapsed(), 1)
    res.write()
    print()
    print(checks_summary(res))
    print()
    print(report.tts_seed_table(res["rows"]), end="")
    bad = [c for c in res["checks"] if not c["ok"]]
    return 1 if bad or res["errors"] or B.failed_rows(res["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
