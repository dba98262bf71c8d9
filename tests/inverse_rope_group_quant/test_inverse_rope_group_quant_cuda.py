"""CPU checks of the inverse_rope_group_quant CUDA kernel (kernels_cuda/inverse_rope_group_quant.cu):

* nvcc compiles it for sm_90 and the SASS has 16-byte global loads and stores (LDG.E.128 / STG.E.128), packed
  hardware E4M3 conversions (F2FP.SATFINITE.E4M3.F32.PACK_AB...), butterfly shuffles whose count grows with
  the quant group (group 32 needs fewer than group 128: the seed's weakness), and no local memory;
* sm_80 compiles too (software fp8, no F2FP E4M3 there);
* the whole kernel runs on the CPU in lockstep host emulation (tests/test_emulated_quant_kernels.py, shared with
  the HIP kernel), and the shared scalar math alone (every bf16/fp16 value, fp8 ties, scale boundaries), the
  launcher's arguments and the token division are checked in tests/test_irgq_common.py.

The hardware conversion path itself runs only on a GPU: gpu/check_inverse_rope_group_quant.py checks it.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from compile_cache import CUDA_CPU_WHEEL_STUBS, cuda_include_dir, torch_syntax_check
from kernel_asm import nvcc_cubin, opcodes, resource_usage, sass, sass_functions

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "kernels_cuda" / "inverse_rope_group_quant.cu"
HEADER = ROOT / "kernels_cuda" / "inverse_rope_group_quant.cuh"
GROUPS = (32, 64, 128, 256)


def _kernels(text: str) -> dict[str, str]:
    funcs = {n: s for n, s in sass_functions(text).items() if "irgq_kernel" in n}
    assert funcs, "no irgq_kernel in the SASS"
    return funcs


def _variant_of(name: str) -> tuple[int, int, bool, int]:
    """(quant group, chunks per thread, tail warps, fast-layout cache dtype or -1) of an
    irgq_kernel<dtype, Q, U, tail warps, kFastCache> instantiation's mangled name."""
    m = re.search(r"irgq_kernelILi(\d+)ELi(\d+)ELi(\d+)ELb([01])ELi(n?\d+)E", name)
    assert m, name
    fast = int(m.group(5).replace("n", "-"))
    return int(m.group(2)), int(m.group(3)), m.group(4) == "1", fast


F32_CACHE, BF16_CACHE, GENERIC = 2, 0, -1  # kF32, kBF16, kGenericLayout (inverse_rope_group_quant_common.h)


# ------------------------------------------------------------------------------------------------ SASS checks
def test_sm90_sass_vector_io_hw_e4m3_no_local_memory():
    cubin = nvcc_cubin(KERNEL, "sm_90")
    funcs = _kernels(sass(cubin))
    usage = resource_usage(cubin)
    # {bf16, fp16} x {32, 64, 128, 256} x {1 chunk per thread, 1 with the rope-tail chunks in their own warps}
    # x {generic layout, the fast layout with an fp32 cache, with a bf16 cache}, and 2 chunks per thread (generic)
    assert len(funcs) == 2 * 4 * (2 * 3 + 1), sorted(funcs)
    shuffles = {}
    sizes = {}
    for name, text in funcs.items():
        ops = opcodes(text)
        q, u, tw, fast = _variant_of(name)  # every count below is per chunk, times u
        ldg128 = sum(bool(re.fullmatch(r"LDG\.E(\.\w+)*\.128(\.CONSTANT)?", o)) for o in ops)
        stg128 = sum(bool(re.fullmatch(r"STG\.E(\.\w+)*\.128", o)) for o in ops)
        first_ldg = next(o for o in ops if o.startswith("LDG"))
        assert re.fullmatch(r"LDG\.E(\.\w+)*\.128", first_ldg), f"{name}: o's first load is {first_ldg}"
        # o: 2 per chunk; aligned cos/sin rows: 2 x (2 fp32 / 1 bf16 or fp16): 6 in the generic kernel (it has
        # both paths), 4 in the fast fp32-cache one, 2 in the bf16 one
        rows = {GENERIC: 6, F32_CACHE: 4, BF16_CACHE: 2}[fast]
        assert ldg128 >= (2 + rows) * u, f"{name}: {ldg128} LDG.E.128 (expected {2 * u} for o + {rows * u} rows)"
        # cos/sin rows through the read-only path, and every load issued before the first store: no chain of
        # o -> position -> cos -> sin -> store -> next chunk's loads (two waves of loads instead)
        assert sum(o == "LDG.E.128.CONSTANT" for o in ops) >= rows * u, f"{name}: cos/sin rows not read-only loads"
        first_store = next(i for i, o in enumerate(ops) if o.startswith("STG"))
        late = [o for o in ops[first_store:] if o.startswith("LDG")]
        assert not late, f"{name}: {len(late)} loads after the first store ({late[:3]})"
        # programmatic dependent launch: the wait for the previous grid (griddepcontrol.wait: ACQBULK) before the
        # first global load, the next grid's go-ahead (griddepcontrol.launch_dependents: PREEXIT) after the last
        # load and before the first store
        loads = [i for i, o in enumerate(ops) if o.startswith("LDG")]
        assert ops.count("ACQBULK") == 1 and ops.index("ACQBULK") < loads[0], f"{name}: no wait before the loads"
        assert ops.count("PREEXIT") == 1 and loads[-1] < ops.index("PREEXIT") < first_store, (
            f"{name}: PREEXIT not between the last load and the first store")
        assert stg128 >= u, f"{name}: {stg128} STG.E.128 (one 16-byte fp8 store per chunk, {u} per lane)"
        if fast != GENERIC:  # the fast layout is 16-byte aligned: no narrow path for o, x_fp8 or the cache left
            narrow = [o for o in ops if re.fullmatch(r"(LDG|STG)\.E\.(U|S)?16(\.CONSTANT)?", o)]
            assert not narrow, f"{name}: 16-bit global accesses in the fast-layout kernel: {narrow[:3]}"
            # one 32-bit read-only load (an int32 position) and one byte store (the e8m0 scale) at most; the generic
            # kernel has 17 of each (the fp32 cache's and x_fp8's narrow paths)
            assert sum(o == "LDG.E.CONSTANT" for o in ops) <= 1, f"{name}: narrow fp32 cache loads"
            assert sum(o == "STG.E.U8" for o in ops) <= 1, f"{name}: byte stores of x_fp8"
        f2fp = [o for o in ops if o.startswith("F2FP") and "E4M3" in o]
        assert f2fp, f"{name}: no packed hardware E4M3 conversion (F2FP...E4M3)"
        assert all("SATFINITE" in o and "PACK" in o for o in f2fp), f2fp
        # 16 values per chunk -> 8 packed conversions per chunk
        assert len(f2fp) >= 8 * u, f"{name}: {len(f2fp)} F2FP E4M3"
        assert not [o for o in ops if o.startswith(("LDL", "STL"))], f"{name}: local memory in SASS"
        res = usage[name]
        assert res["local"] == 0 and res["stack"] == 0, f"{name}: {res}"
        # __launch_bounds__(256, 6) on the fast-layout kernels: 48 warps per SM
        if fast != GENERIC:
            assert res["registers"] <= 40, f"{name}: {res['registers']} registers (6 blocks of 256 need <= 40)"
        shuffles.setdefault(q, set()).add(sum(o.startswith("SHFL.BFLY") for o in ops) // u)
        sizes[(name[name.index("irgq_kernel") + 13:name.index("irgq_kernel") + 15], q, u, tw, fast)] = len(ops)
        print(f"sm_90 {name}: {res['registers']} registers, stack {res['stack']}, local {res['local']}, "
              f"{len(ops)} instructions, {len(f2fp)} F2FP E4M3, {sum(o.startswith('SHFL') for o in ops)} SHFL")
    # log2(Q/16) butterfly steps per chunk: 1, 2, 3, 4 shuffles per chunk
    for q, counts in shuffles.items():
        assert counts == {int(math.log2(q // 16))}, f"group {q}: shuffle counts per chunk {counts}"
    # the fast-layout kernels fold the per-call layout branches away: under half the generic kernel's size
    for (dt, q, u, tw, fast), n in sizes.items():
        if fast != GENERIC:
            generic = sizes[(dt, q, u, tw, GENERIC)]
            assert n * 2 < generic, f"fast kernel {(dt, q, tw, fast)}: {n} instructions against {generic} generic"


@pytest.mark.parametrize("arch", ["sm_100", "sm_120"])
def test_blackwell_no_local_memory_and_bounded_fast_kernels(arch):
    """__launch_bounds__(256, 6) holds the fast-layout kernels to 40 registers without spilling on Blackwell too
    (the generic kernels, which would spill there, are not bounded)."""
    cubin = nvcc_cubin(KERNEL, arch)
    usage = resource_usage(cubin)
    names = [n for n in usage if "irgq_kernel" in n]
    assert len(names) == 56, len(names)
    for name in names:
        res = usage[name]
        assert res["local"] == 0 and res["stack"] == 0, f"{arch} {name}: {res}"
        if _variant_of(name)[3] != GENERIC:
            assert res["registers"] <= 40, f"{arch} {name}: {res['registers']} registers"


def test_sm80_sass_software_fp8_no_local_memory():
    cubin = nvcc_cubin(KERNEL, "sm_80")
    funcs = _kernels(sass(cubin))
    usage = resource_usage(cubin)
    for name, text in funcs.items():
        ops = opcodes(text)
        assert any(re.fullmatch(r"LDG\.E(\.\w+)*\.128", o) for o in ops), f"{name}: no 128-bit global load"
        assert not [o for o in ops if o.startswith("F2FP") and "E4M3" in o], "sm_80 has no E4M3 conversion"
        assert "ACQBULK" not in ops and "PREEXIT" not in ops, f"{name}: griddepcontrol before sm_90"
        assert usage[name]["local"] == 0 and usage[name]["stack"] == 0, usage[name]
        print(f"sm_80 {name}: {usage[name]['registers']} registers")


# ------------------------------------------------------------------------------------ binding and selection
def test_torch_binding_compiles_against_torch_headers(tmp_path):
    """g++ -fsyntax-only of the torch binding with this torch's headers and the CUDA toolkit's (the CPU wheel
    lacks one generated c10/cuda header: a stub stands in). Catches API mistakes before a GPU build."""
    cuda_inc = cuda_include_dir()
    if cuda_inc is None:
        pytest.skip("needs the CUDA toolkit headers (cuda_runtime_api.h under $CUDA_HOME or /usr/local/cuda)")
    torch_syntax_check(HEADER.parent / "inverse_rope_group_quant_torch.cpp", tmp_path, CUDA_CPU_WHEEL_STUBS,
                       [cuda_inc, HEADER.parent])


def test_cuda_backend_supports(monkeypatch):
    from fusedrope.inverse_rope_group_quant import Facts
    from fusedrope.inverse_rope_group_quant import cuda as cq

    dev = torch.device("cuda", 0)
    base = (dev, torch.bfloat16, 512, 64, 128, torch.bfloat16, torch.int64, torch.float8_e4m3fn,
            torch.float8_e8m0fnu, False)
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_90")
    assert cq.supports(Facts(*base)) is None
    assert cq.supports(Facts(*base[:4] + (32,) + base[5:9] + (True,))) is None
    assert cq.supports(Facts(*base[:8] + (torch.float32, False))) is None
    assert "e4m3fn" in cq.supports(Facts(*base[:7] + (torch.float8_e4m3fnuz,) + base[8:]))
    assert "packed UE8M0" in cq.supports(Facts(*base[:8] + (torch.int32, False)))
    assert "head_dim 512" in cq.supports(Facts(*(dev, torch.bfloat16, 256, 64) + base[4:]))
    assert "rope_dim 64" in cq.supports(Facts(*(dev, torch.bfloat16, 512, 128) + base[4:]))
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_75")
    assert "sm_80" in cq.supports(Facts(*base))
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "gfx942")
    assert "NVIDIA" in cq.supports(Facts(*base))


def test_gpu_check_script_cpu_selftest(tmp_path):
    """gpu/check_inverse_rope_group_quant.py's plumbing (inputs, poisoning, comparisons, reports) on CPU."""
    import sys

    script = ROOT / "gpu" / "check_inverse_rope_group_quant.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script), "--cpu-selftest", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "correctness  yes" in proc.stdout
    for f in ("results.json", "bench.csv", "bench.md"):
        assert (tmp_path / f).exists(), f


def test_gpu_check_script_launch_shape_sweep_on_cpu(monkeypatch):
    """The op-2 script's sweep section at small S with CPU inputs and stand-in timers that call each contender
    once: every (H, G, S) point gets the graph times of the five CUDA launch shapes (automatic, 256-thread blocks,
    2 chunks per thread, tail warps, pdl; each call reaches the config op with its forced shape), of triton (the public
    function with backend="triton" into the set's buffers) and of unfused, and the profiler times of four; the
    larger points time 1, 2, tail warps and 1 with an fp16 cache (the generic kernel) and a bf16 one (the fast
    kernel) on the bench's input sets, with their own group size; the table shows them all with the speedups; a
    profiler that fails leaves its cells "-" and records why once; a spent deadline records a skip."""
    import importlib
    import sys

    from fusedrope.benchmark import unfused

    sys.path.insert(0, str(ROOT / "gpu"))
    script = importlib.import_module("check_inverse_rope_group_quant")
    seen = []
    time_of = {"cpt0": 1.0, "cpt1": 2.0, "b256": 1.75, "cpt2": 3.0, "tw": 1.5, "pdl": 0.75, "triton": 4.0,
               "unfused": 5.0, "gen": 2.5, "b16": 2.25}

    def fake_op(o, p, c, s, x, sc, q, u, tw=0, block=0, pdl=0):
        assert c.dtype == s.dtype and block in (0, 256) and pdl in (0, 1)
        name = "tw" if tw else {torch.float16: "gen", torch.bfloat16: "b16"}.get(c.dtype, f"cpt{u}")
        name = "b256" if block else "pdl" if pdl else name
        assert name not in ("gen", "b16", "b256") or (u, tw) == (1, 0)  # one chunk per thread, plain
        assert name != "pdl" or (u, tw, block) == (0, 0, 0)  # the automatic launch
        seen.append((name, o.shape[0], o.shape[1], q))
        assert not tw or u == 1

    def fake_api(name):
        def fn(o, p, c, s, G, q, x_fp8=None, x_scale=None, backend=None):
            assert x_fp8 is not None and x_scale is not None and x_fp8.shape[1] == G
            assert backend == ("triton" if name == "triton" else None)
            seen.append((name, o.shape[0], o.shape[1], q))
        return fn

    monkeypatch.setattr(script.torch.ops.fusedrope_cuda, "inverse_rope_group_quant_out_config", fake_op,
                        raising=False)
    monkeypatch.setattr(script.fusedrope, "inverse_rope_group_quant", fake_api("triton"))
    monkeypatch.setattr(unfused, "unfused_inverse_rope_group_quant", fake_api("unfused"))
    monkeypatch.setattr(script, "launch_floor", lambda res, reps, device: {"one_graph_us": 0.5, "one_kernel_us": 0.25,
                                                                   "two_graph_us": 1.0, "two_kernel_us": 0.5,
                                                                   "copy_graph_us": 0.75, "copy_kernel_us": 0.5,
                                                                   "gather_graph_us": 1.25, "gather_kernel_us": 1.0})

    def fake_graph_us(call, n, reps):
        call(0)
        return time_of[seen[-1][0]]

    def fake_kernels_us(call, n):
        call(0)
        return time_of[seen[-1][0]] / 2, 1.0 + (seen[-1][0] == "unfused")

    monkeypatch.setattr(script.timing, "time_graph_us", fake_graph_us)
    monkeypatch.setattr(script.timing, "time_kernels_us", fake_kernels_us)
    monkeypatch.setattr(script, "SWEEP_S", (1, 8))
    monkeypatch.setattr(script, "SWEEP_LARGE", ((4, 8, 1, 32),))
    res = {}
    script.section_sweep(res, deadline=float("inf"), device="cpu")
    assert [(r["H"], r["G"], r["S"]) for r in res["rows"]] == [(16, 2, 1), (16, 2, 8), (8, 1, 1), (8, 1, 8)]
    assert res["large_rows"] == [{"S": 4, "H": 8, "G": 1, "q": 32, "n_sets": 2, "us_cpt1": 2.0, "us_cpt2": 3.0,
                                  "us_tw": 1.5, "us_gen": 2.5, "us_b16": 2.25}]
    assert seen[-5:] == [("cpt1", 4, 8, 32), ("cpt2", 4, 8, 32), ("tw", 4, 8, 32), ("gen", 4, 8, 32),
                         ("b16", 4, 8, 32)]
    small = {k: v for k, v in time_of.items() if k not in ("gen", "b16", "cpt1")}
    for r in res["rows"]:
        assert {k: r[f"us_{k}"] for k in small} == small
        assert (r["kernel_us_cpt0"], r["kernel_us_b256"], r["kernel_us_triton"], r["kernel_us_unfused"]) == (
            0.5, 0.875, 2.0, 2.5)
        assert (r["kernels_cpt0"], r["kernels_unfused"]) == (1.0, 2.0)
    assert seen[:7] == [("cpt0", 1, 16, 128), ("b256", 1, 16, 128), ("cpt2", 1, 16, 128), ("tw", 1, 16, 128),
                        ("pdl", 1, 16, 128), ("triton", 1, 16, 128), ("unfused", 1, 16, 128)]
    table = script.sweep_table(res)
    assert ("| 8 | 8 | 1 | 1.00 | 1.75 | 3.00 | 1.50 | 0.75 | 4.00 | 5.00 | 5.00x | 1.33x | 1.75x | 0.50 | 0.88 "
            "| 2.00 | 2.50 | 5.00x |" in table)
    assert "one trivial kernel 0.50 us by graph replay, 0.25 us kernel time; two 1.00 / 0.50 us" in table
    assert "a copy (neg) of o 0.75 / 0.50 us; a position -> cos row gather" in table
    assert "earlier load) 1.25 / 1.00 us." in table
    assert "| 4 | 8 | 1 | 32 | 2 | 2.00 | 3.00 | 1.50x | 1.50 | 1.33x | 2.50 | 2.25 | 1.11x |" in table

    def broken_profiler(call, n):
        raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(script.timing, "time_kernels_us", broken_profiler)
    res = {}
    script.section_sweep(res, deadline=float("inf"), device="cpu")
    assert res["kernel_time_error"] == "RuntimeError: CUPTI unavailable"
    assert all(r["us_cpt0"] == 1.0 and r["kernel_us_cpt0"] is None for r in res["rows"])
    assert ("| 8 | 8 | 1 | 1.00 | 1.75 | 3.00 | 1.50 | 0.75 | 4.00 | 5.00 | 5.00x | 1.33x | 1.75x | - | - | - | - "
            "| - |" in script.sweep_table(res))
    res = {}
    script.section_sweep(res, deadline=0.0, device="cpu")
    assert res["rows"] == [] and "deadline" in res["skipped"]

    def tail_warps_fail(call, n, reps):  # a graph capture that fails: that cell only, small S and large
        call(0)
        if seen[-1][0] == "tw":
            raise RuntimeError("capture refused")
        return time_of[seen[-1][0]]

    monkeypatch.setattr(script.timing, "time_graph_us", tail_warps_fail)
    res = {}
    script.section_sweep(res, deadline=float("inf"), device="cpu")
    for r in res["rows"] + res["large_rows"]:
        assert r["us_tw"] is None and r["errors"] == {"tw": "RuntimeError: capture refused"}
        assert r["us_cpt2"] == 3.0
    table = script.sweep_table(res)
    assert "| 8 | 8 | 1 | 1.00 | 1.75 | 3.00 | - | 0.75 |" in table
    assert "| 4 | 8 | 1 | 32 | 2 | 2.00 | 3.00 | 1.50x | - | - | 2.50 | 2.25 | 1.11x |" in table


def test_gpu_check_script_launch_floor_on_cpu(monkeypatch):
    """The sweep's launch floor on CPU tensors: four calls (one and two trivial kernels, a copy, a gather), each
    timed by graph replay and the profiler; a timing that fails leaves that entry None with its error, and the
    floor's line in the table shows "-" for it."""
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "gpu"))
    script = importlib.import_module("check_inverse_rope_group_quant")
    timed = []

    def graph_us(call, n, reps):
        call(0)
        timed.append(n)
        if len(timed) == 4:
            raise RuntimeError("no graph")
        return float(len(timed))

    monkeypatch.setattr(script.timing, "time_graph_us", graph_us)
    monkeypatch.setattr(script.timing, "time_kernels_us", lambda call, n: (0.5, 1.0))
    res = {}
    f = script.launch_floor(res, 1, device="cpu")
    assert f == {"one_graph_us": 1.0, "one_kernel_us": 0.5, "two_graph_us": 2.0, "two_kernel_us": 0.5,
                 "copy_graph_us": 3.0, "copy_kernel_us": 0.5, "gather_graph_us": None, "gather_kernel_us": 0.5,
                 "errors": {"gather": "RuntimeError: no graph"}}
    table = script.sweep_table({"floor": f, "rows": [{"S": 1, "H": 16, "G": 2, "us_cpt0": 1.0, "us_unfused": 2.0,
                                                       "kernel_us_cpt0": None, "kernel_us_unfused": None}]})
    assert "a position -> cos row gather (a load whose address needs an earlier load) - / 0.50 us." in table


def test_gpu_check_script_pdl_after_writer_on_cpu(monkeypatch):
    """The op-2 script's programmatic-dependent-launch check on CPU, with stand-ins for the raw op: one whose
    writes land at once passes; one whose plain-launch writes land only after the next (pdl=1) call has read its
    o (what a dependent launch that did not wait could see) fails every round."""
    import importlib
    import sys

    from fusedrope import reference as ref

    sys.path.insert(0, str(ROOT / "gpu"))
    script = importlib.import_module("check_inverse_rope_group_quant")
    calls = []

    def good(o, p, c, s, x, sc, q, pdl=0):
        calls.append(pdl)
        ref.inverse_rope_group_quant(o, p, c, s, x, sc, q)

    pending = []

    def late_writes(o, p, c, s, x, sc, q, pdl=0):
        if pdl == 0:  # the writer: its results become visible only after the next call has read
            xs, ss = x.clone(), sc.clone()
            ref.inverse_rope_group_quant(o, p, c, s, xs, ss, q)
            pending.append(lambda: (x.copy_(xs), sc.copy_(ss)))
            return
        o_read = o.clone()
        while pending:
            pending.pop()()
        ref.inverse_rope_group_quant(o_read, p, c, s, x, sc, q)

    monkeypatch.setattr(script.cuda_inverse_rope_quant, "inverse_rope_group_quant_config", good)
    assert script.pdl_after_writer_case("cpu", rounds=3, S=8, tail=4) == {"ok": True, "rounds": 3,
                                                                           "rounds_differing": 0}
    assert calls == [0, 1] * 3
    monkeypatch.setattr(script.cuda_inverse_rope_quant, "inverse_rope_group_quant_config", late_writes)
    assert script.pdl_after_writer_case("cpu", rounds=3, S=8, tail=4) == {"ok": False, "rounds": 3,
                                                                           "rounds_differing": 3}
