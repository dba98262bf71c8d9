"""The benchmark engine (fusedrope/benchmark/: the engine, timing.py, report.py), the CLI
`python -m fusedrope bench` and the pytest-benchmark suites in bench/, end to end on CPU at tiny sizes (GPU timing
itself runs only on a GPU)."""

import csv
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import fusedrope
from fusedrope import benchmark as B
from fusedrope.benchmark import report
from fusedrope.benchmark import timing
from fusedrope.__main__ import main
from fusedrope.testing import TTS_CASES, QuantCase

from conftest import DEVICE

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


def tts_seed_columns(fused="cuda"):
    if fused == "triton":  # no column compares Triton with itself
        return ("| shape | batch | rows | eager us | torch.compile us | triton us | compile / triton | triton TB/s "
                "| % copy |")
    return (f"| shape | batch | rows | eager us | torch.compile us | triton us | {fused} us | compile / {fused} | "
            f"triton / {fused} | {fused} TB/s | % copy |")


TTS_SEED_COLUMNS = tts_seed_columns()
QUANT_SEED_COLUMNS = "| S | fused us | fused TB/s | unfused us | unfused TB/s | speedup | % copy |"
GROUP_COLUMNS = "| S | group | fused us | fused TB/s | unfused us | unfused TB/s | speedup | % copy |"

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu",
                                reason="CPU end-to-end checks; on a GPU run the CLI itself")


@pytest.mark.slow  # whole benchmark runs in subprocesses
def test_cli_bench_on_cpu_writes_every_file(tmp_path, capsys):
    """The CPU refuses the seed matrix and runs the tiny one; JSON, CSV, markdown and PNGs come out."""
    out = tmp_path / "run"
    rc = main(["bench", "--out", str(out), "--no-compile", "--reps", "1", "--interpreter",
               "--cases", "small_tts-B1,S1-H8-G1-D512-R64-g128"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert B.CPU_REFUSAL in printed

    results = json.loads((out / "results.json").read_text())
    meta = results["meta"]
    for key in ("hostname", "gpu", "torch", "triton", "torch_cuda", "torch_hip", "git_commit", "command",
                "timing"):
        assert key in meta
    assert meta["gpu"] is None and meta["label"] == B.CPU_LABEL
    assert "-m fusedrope bench" in meta["command"] and "--interpreter" in meta["command"]
    assert results["copy"]["tbps"] > 0

    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = {(r["op"], r["case"], r["contender"]): r for r in rows}
    for contender in ("eager", "triton", "reference"):
        assert got[("qwen3_tts_rope", "small_tts-B1", contender)]["status"] == "ok"
        assert float(got[("qwen3_tts_rope", "small_tts-B1", contender)]["per_call_us"]) > 0
    for contender in ("eager", "triton", "reference", "unfused"):
        row = got[("inverse_rope_group_quant", "S1-H8-G1-D512-R64-g128", contender)]
        assert row["status"] == "ok" and float(row["tbps"]) > 0, row
    skipped = got[("qwen3_tts_rope", "small_tts-B1", "cuda")]
    assert skipped["status"] == "skipped" and "CUDA device" in skipped["reason"]
    compile_row = got[("qwen3_tts_rope", "small_tts-B1", "compile")]
    assert compile_row["reason"] == "torch.compile disabled (--no-compile)"

    md = (out / "results.md").read_text()
    # no cuda kernel here: op 1's fused column is the backend auto picks, as op 2's is
    assert tts_seed_columns("triton") in md and QUANT_SEED_COLUMNS in md and B.CPU_LABEL in md
    assert "| small_tts | 1 | 96 |" in md and "fused = triton" in md
    assert md in printed  # the tables are printed too
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["inverse_rope_group_quant_H8_G1.png", "qwen3_tts_rope.png"]
    for p in out.glob("*.png"):
        assert p.stat().st_size > 5000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_group_size_axis_and_torch_compile(tmp_path):
    cases = {B.QUANT: [QuantCase(1, 16, 2, quant_group_size=32), QuantCase(1, 16, 2, quant_group_size=128)]}
    cfg = B.RunConfig(ops=(B.QUANT,), reps=1, cases=cases, only_contenders=("eager", "compile", "reference"),
                      plots=False)
    results = B.run(cfg, tmp_path, CPU, command="test", log=lambda s: None)
    assert {r["status"] for r in results["rows"]} == {"ok"}, results["rows"]
    md = (tmp_path / "results.md").read_text()
    assert "Quant group size axis, hg = (16, 2), row-major scale" in md and GROUP_COLUMNS in md
    assert "| 1 | 32 |" in md and "| 1 | 128 |" in md and "fused = reference" in md


def _row(contender, **kw):
    case = TTS_CASES[0]
    return {"op": B.TTS, **B.case_fields(B.TTS, case), "contender": contender, "status": "ok", **kw}


def test_fused_columns_follow_autos_pick_and_say_when_it_was_not_measured():
    """Where auto picks a backend late in the registry's order (FUSEDROPE_BACKEND=reference, or Triton left out)
    the fused columns are that backend's, not the first name measured; where auto's pick was not measured the
    header says which one stands in for it."""
    base = {"op": B.QUANT, **B.case_fields(B.QUANT, QuantCase(8, 16, 2)), "status": "ok", "auto_backend": "cuda"}
    rows = [{**base, "contender": "triton", "device_us": 4.0, "tbps": 1.0},
            {**base, "contender": "cuda", "device_us": 2.0, "tbps": 2.0, "frac_copy": 0.5},
            {**base, "contender": "unfused", "device_us": 5.0, "tbps": 0.8}]
    text = report.quant_seed_tables(rows)
    assert "fused = cuda" in text and "| 8 | 2.00 | 2.000 | 5.00 | 0.800 | 2.50x | 50 |" in text
    tts = [_row(n, per_call_us=us, auto_backend="reference") for n, us in (("triton", 20.0), ("reference", 90.0))]
    assert report.tts_fused_name(tts) == "reference"
    base["auto_backend"] = "reference"
    rows = [{**base, "contender": "triton", "device_us": 4.0, "tbps": 1.0},
            {**base, "contender": "reference", "device_us": 8.0, "tbps": 0.5},
            {**base, "contender": "unfused", "device_us": 6.0, "tbps": 0.6}]
    text = report.quant_seed_tables(rows)
    assert text.startswith("fused = reference\n") and "| 8 | 8.00 | 0.500 | 6.00 | 0.600 | 0.75x |" in text
    for r in rows:
        r["auto_backend"] = "cuda"  # e.g. --contenders triton,unfused on an NVIDIA GPU
    assert report.quant_seed_tables(rows).startswith("fused = triton (auto picks cuda, not measured)\n")


def test_group_size_axis_and_not_measured_notes():
    """The group-size table holds only token counts measured at more than one group size; "Not measured" lists
    only contenders that ran nowhere (one skipped in some cases but measured in others has its column)."""
    rows = []
    for case in [QuantCase(8, 16, 2, quant_group_size=q) for q in (32, 64, 128)] + [QuantCase(8, 8, 1)]:
        base = {"op": B.QUANT, **B.case_fields(B.QUANT, case), "status": "ok", "auto_backend": "triton"}
        rows += [{**base, "contender": "triton", "device_us": 4.0, "tbps": 1.0},
                 {**base, "contender": "unfused", "device_us": 6.0, "tbps": 0.6}]
    text = report.quant_seed_tables(rows)
    assert "Quant group size axis, hg = (16, 2)" in text and "Quant group size axis, hg = (8, 1)" not in text
    other = {"op": B.TTS, **B.case_fields(B.TTS, TTS_CASES[1]), "per_call_us": 7.0}
    tts = [_row("cuda", per_call_us=6.0), _row("liger", per_call_us=9.0),
           {**other, "contender": "cuda", "status": "ok"},
           {**other, "contender": "liger", "status": "skipped", "reason": "liger: shape not served"},
           _row("flashinfer", status="skipped", reason="not installed")]
    every = report.contender_tables(tts, B.TTS)
    assert "Not measured:\n- flashinfer: not installed\n" in every and "liger: shape not served" not in every


def test_l2_resident_replay_times_are_marked():
    """A device time from replaying inputs that fit in the L2 is an L2 hit: every cell derived from it carries
    the mark and the tables say why; per-call times and HBM-sized rotations stay unmarked."""
    case = QuantCase(8, 16, 2)
    base = {"op": B.QUANT, **B.case_fields(B.QUANT, case), "status": "ok", "tbps_basis": "device_us"}
    rows = [{**base, "contender": "cuda", "per_call_us": 9.0, "device_us": 2.0, "tbps": 2.0, "frac_copy": 0.5,
             "graph_l2_resident": False},
            {**base, "contender": "unfused", "per_call_us": 9.5, "device_us": 5.0, "tbps": 0.8,
             "graph_l2_resident": True}]
    M = report.L2_MARK
    seed = report.quant_seed_tables(rows)
    assert f"| 8 | 2.00 | 2.000 | 5.00{M} | 0.800{M} | 2.50x | 50 |" in seed and report.L2_NOTE in seed
    every = report.contender_tables(rows, B.QUANT)
    assert f"| {case.id} | 9.00 | 9.50 |" in every  # per call: not from the replay
    assert f"| {case.id} | 2.00 | 5.00{M} |" in every and report.L2_NOTE in every
    rows[1]["graph_l2_resident"] = False
    assert M not in report.quant_seed_tables(rows) + report.contender_tables(rows, B.QUANT)
    tts = [_row("cuda", per_call_us=6.8, device_us=2.0, tbps=0.03, frac_copy=0.0067, tbps_basis="device_us",
                graph_l2_resident=True)]
    assert f"| 0.030{M} | 1{M} |" in report.tts_seed_table(tts) and report.L2_NOTE in report.tts_seed_table(tts)


def test_spec_peak_and_its_report_line():
    """The datasheet bandwidth is matched by name (specific names first) and reported beside the copy."""
    assert B.spec_peak("NVIDIA H200")[0] == 4.8
    assert B.spec_peak("NVIDIA H100 80GB HBM3")[0] == 3.35
    assert B.spec_peak("NVIDIA H100 PCIe")[0] == 2.0
    assert B.spec_peak("NVIDIA H20")[0] == 4.0
    assert B.spec_peak("NVIDIA GH200 480GB")[0] == 4.0 and B.spec_peak("NVIDIA GH200 144G HBM3e")[0] == 4.9
    assert B.bandwidth_fields(2.0, 4.0, CPU) == {"frac_copy": 0.5}
    assert B.spec_peak("AMD Instinct MI300X")[0] == 5.3 and B.spec_peak("AMD Instinct MI355X")[0] == 8.0
    assert B.spec_peak("NVIDIA GeForce RTX 4090") is None
    results = {"meta": {**B.machine_info(CPU), "gpu": "NVIDIA H200", "gpu_arch": "sm_90", "l2_bytes": 60 * 2**20,
                        "hbm_peak_tbps": 4.8, "hbm_peak_source": "NVIDIA H200 datasheet (HBM3e)"},
               "rows": [], "copy": {"tbps": 4.0, "timing": "x"}}
    assert "- spec-sheet memory bandwidth: 4.8 TB/s (NVIDIA H200 datasheet (HBM3e)), the copy reaches 83% of it" \
        in report.markdown(results)
    assert "(sm_90, L2 60 MiB)" in report.markdown(results)
    results["meta"].update(gpu="AMD Instinct MI300X", gpu_arch="gfx942", l2_bytes=4 * 2**20,
                           rotate_cache_bytes=256 * 2**20)
    assert "(gfx942, L2 4 MiB, last cache 256 MiB)" in report.markdown(results)
    rows = [_row("cuda", device_us=2.0, tbps=3.6, frac_copy=0.9, frac_peak=0.75)]
    assert "% of spec-sheet bandwidth" in report.contender_tables(rows, B.TTS)


def test_measure_records_skips_and_errors():
    """A contender named for a fusedrope backend asks the registry per case: where that backend cannot run the
    case it is skipped with the registry's reason (not timed into an error row that fails the run)."""
    def broken(case, sets):
        raise RuntimeError("boom")

    def cuda(case, sets):
        return lambda i: fusedrope.qwen3_tts_rope(*sets[i % len(sets)], backend="cuda")

    cl = [B.Contender("absent", B.TTS, "not here", lambda c, s: None, reason="not installed"),
          B.Contender("broken", B.TTS, "raises", broken), B.Contender("cuda", B.TTS, "cuda", cuda, backend="cuda")]
    rows = B.measure(B.TTS, TTS_CASES[6], cl, CPU, reps=1)
    assert [(r["contender"], r["status"], r["reason"]) for r in rows[:2]] == [
        ("absent", "skipped", "not installed"), ("broken", "error", "RuntimeError: boom")]
    assert rows[2]["status"] == "skipped" and "CUDA device" in rows[2]["reason"], rows[2]
    assert rows[0]["auto_backend"] in fusedrope.BACKENDS and rows[0]["n_sets"] == 2


def test_input_bytes_are_the_bytes_of_one_input_set():
    """input_bytes() sizes the rotation (how many sets outgrow the cache): the bytes of the tensors one set holds
    (q, k, cos, sin; o and its int64 positions), outputs not counted."""
    for op, case in ((B.TTS, TTS_CASES[6]), (B.QUANT, QuantCase(8, 16, 2))):
        one = B.make_sets(op, case, CPU, n=1)[0][:4]
        held = sum(t.numel() * t.element_size() for t in one if t.dim() != 2 or op == B.TTS)  # not the shared cache
        assert B.input_bytes(op, case) == held, op


def test_seed_matrices_are_the_specs_each_case_once():
    """The seed matrices (docs/benchmarks.md): op 1's 6 shapes x batch 1, 8, 32; op 2's (16, 2) and (8, 1) over
    10 token counts, plus group sizes 32 and 64 at S = 2048 and 8192 (group 128 there is already in the S axis:
    measured once, not twice)."""
    tts, quant = B.seed_cases(B.TTS), B.seed_cases(B.QUANT)
    assert len(tts) == len({c.id for c in tts}) == 18
    assert len(quant) == len({c.id for c in quant}) == 24
    axis = {(c.num_tokens, c.quant_group_size) for c in quant if (c.num_heads, c.num_groups) == (16, 2)}
    assert {(s, q) for s in (2048, 8192) for q in (32, 64, 128)} <= axis


def test_a_run_past_its_budget_measures_nothing_more(tmp_path):
    """--budget-s: cases after the budget ran out get one skipped row per contender and are not measured."""
    cfg = B.RunConfig(ops=(B.TTS,), matrix="quick", reps=1, compile=False, budget_s=1e-9, plots=False,
                      only_contenders=("eager", "reference"))
    results = B.run(cfg, tmp_path, CPU, log=lambda s: None)
    cases = B.quick_cases(B.TTS, CPU)
    assert len(results["rows"]) == 2 * len(cases)
    assert {(r["status"], r["reason"]) for r in results["rows"]} == {("skipped", "time budget (0 s) ran out")}


def test_measure_frees_each_contenders_buffers_before_the_next_makes_its_own():
    """On a GPU a contender's buffers can be GBs: two contenders' at once could run out of memory."""
    import weakref

    alive = []

    def make(case, sets):
        held = torch.empty(4)
        seen = [ref() is not None for ref in alive]
        alive.append(weakref.ref(held))
        assert not any(seen), "an earlier contender's buffers are still alive"
        return lambda i: held.add_(0)

    cl = [B.Contender(name, B.TTS, "holds a buffer", make) for name in ("first", "second")]
    rows = B.measure(B.TTS, TTS_CASES[6], cl, CPU, reps=1)
    assert [r["status"] for r in rows] == ["ok", "ok"], rows


def test_contenders_say_why_they_cannot_run_here():
    tts = {c.name: c for c in B.contenders(B.TTS, CPU)}
    quant = {c.name: c for c in B.contenders(B.QUANT, CPU)}
    modes = ["auto:eager", "auto:table", "gather+auto", "norm_rope:2norms+auto", "auto:qk_norm_rope"]
    assert list(tts) == ["eager", "compile", "cuda", "triton", "reference", "auto:eager", "auto:table", "gather+auto",
                         "norm_rope:eager", "norm_rope:compile", "norm_rope:2norms+auto", "auto:qk_norm_rope",
                         "cuda:eager", "cuda:table", "cuda:qk_norm_rope", "cuda:pdl", "liger", "floor"]
    assert {tts[n].reason for n in ("cuda:eager", "cuda:table", "cuda:qk_norm_rope", "cuda:pdl")} == {
        tts["cuda"].reason}
    assert {tts[n].reason for n in modes} == {tts["triton"].reason}  # on a CPU, auto runs Triton's interpreter
    assert tts["norm_rope:eager"].reason is None and tts["norm_rope:compile"].reason == tts["compile"].reason
    assert list(quant) == ["eager", "compile", "cuda", "cuda_head", "hip", "triton", "reference", *B.QUANT_CUDA_MODES,
                           *B.QUANT_LAYOUTS, *B.QUANT_CUDA_LAYOUTS, "auto:vllm", "vllm", "unfused", "floor"]
    assert {quant[n].reason for n in (*B.QUANT_LAYOUTS, "auto:vllm")} == {quant["triton"].reason}
    assert {quant[n].reason for n in B.QUANT_CUDA_LAYOUTS} == {quant["cuda"].reason}
    assert tts["triton"].reason == quant["unfused"].reason == "CPU interpreter timings are not meaningful"
    assert tts["cuda"].reason.startswith("cuda backend unavailable: ")
    assert quant["hip"].reason.startswith("hip backend unavailable: ")
    assert {quant[n].reason for n in B.QUANT_CUDA_MODES} == {quant["cuda"].reason}
    assert tts["liger"].reason and quant["vllm"].reason  # not installed / fetched here, or needs a GPU
    assert tts["eager"].reason is tts["reference"].reason is tts["floor"].reason is None
    assert B.contenders(B.TTS, CPU, interpreter=True)[3].reason is None


@pytest.mark.parametrize("arch,pdl_reason", [("sm_90", None), ("sm_100", None), ("sm_80", "needs sm_90 or newer")])
def test_cuda_launch_modes_run_the_raw_op_where_the_cuda_backend_runs(monkeypatch, arch, pdl_reason):
    """Op 2's launch modes: one contender each, runnable wherever the cuda backend is (pdl=1 from sm_90 on), each
    calling the raw op on the set's buffers with its own pdl and kernel (checked here through a stand-in for the
    raw op and a faked GPU)."""
    from fusedrope import cuda_ext

    monkeypatch.setattr(B, "_backend_reason", lambda op, b, device, interpreter: None)
    monkeypatch.setattr(B, "gpu_arch", lambda device: arch)
    quant = {c.name: c for c in B.contenders(B.QUANT, torch.device("cuda", 0), compile=False)}
    assert quant["cuda:pdl"].reason == quant["cuda_head:pdl"].reason == (
        pdl_reason and "a programmatic dependent launch (pdl=1) needs sm_90 or newer")
    assert all(quant[n].reason is None and quant[n].backend == ("cuda_head" if n.startswith("cuda_head") else "cuda")
               for n in B.QUANT_CUDA_MODES if not n.endswith(":pdl"))
    calls = []
    monkeypatch.setattr(cuda_ext, "load", lambda: None)
    monkeypatch.setattr(torch.ops, "fusedrope_cuda", type("Ops", (), {"inverse_rope_group_quant_out": staticmethod(
        lambda o, p, c, s, x, sc, q, layout, pdl, kernel: calls.append((o.shape, x is sets[1][4], c.dtype, q, layout,
                                                                      pdl, kernel)))}), raising=False)
    case = QuantCase(2, 16, 2, quant_group_size=64)
    sets = B.make_sets(B.QUANT, case, CPU, n=2)
    for name, kw in B.QUANT_CUDA_MODES.items():
        quant[name].make(case, sets)(3)
        assert calls.pop() == ((2, 16, 512), True, kw.get("cache_dtype", torch.float32), 64, 0, kw.get("pdl", 0),
                               kw.get("kernel", 0)), name
    assert {"pdl", "kernel", "cache_dtype"} == {k for kw in B.QUANT_CUDA_MODES.values() for k in kw}


def test_tts_mode_contenders_compute_what_they_name(monkeypatch):
    """The op-1 modes' contenders, on the reference backend: the table path equals the gathered one, the fused
    q/k norm+RoPE equals the model's eager chain and two norms then the op in eager numerics."""
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "reference")
    case = TTS_CASES[0]
    sets = B.make_sets(B.TTS, case, CPU, n=2)
    tts = {c.name: c for c in B.contenders(B.TTS, CPU, compile=False, interpreter=True)}
    run = {name: tts[name].make(case, sets)(3) for name in ("eager", "auto:eager", "auto:table", "gather+auto",
                                                            "norm_rope:eager", "auto:qk_norm_rope")}
    assert all(torch.equal(a, b) for a, b in zip(run["auto:eager"], run["eager"]))
    assert all(torch.equal(a, b) for a, b in zip(run["auto:table"], run["gather+auto"]))
    assert all(torch.equal(a, b) for a, b in zip(run["auto:table"], fusedrope.qwen3_tts_rope(*sets[1])))
    assert all(torch.equal(a, b) for a, b in zip(run["auto:qk_norm_rope"], run["norm_rope:eager"]))
    assert not torch.equal(run["auto:qk_norm_rope"][0], run["eager"][0])  # the norms did something


def test_layout_contenders_call_the_public_op_with_their_layout(monkeypatch):
    """auto:* time the engines' layouts through the public op: each call writes the bytes the reference writes
    for that layout (into a group-major x for auto:group_major), and auto:bf16 counts a bf16 output."""
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "reference")
    case = QuantCase(3, 4, 2, head_dim=128, quant_group_size=32)
    sets = B.make_sets(B.QUANT, case, CPU, n=2)
    quant = {c.name: c for c in B.contenders(B.QUANT, CPU, compile=False, interpreter=True)}
    for name, kw in B.QUANT_LAYOUTS.items():
        x, sc = quant[name].make(case, sets)(3)
        kw = {k: v for k, v in kw.items() if k != "x_layout"}
        want_x, want_sc = fusedrope.inverse_rope_group_quant(*sets[1][:4], 2, 32, **kw, backend="reference",
                                                             **({} if kw.get("quantize") is False else
                                                                {"fp8_dtype": sets[1][4].dtype}))
        assert x.view(torch.uint8).equal(want_x.view(torch.uint8)), name
        if name == "auto:mfma_tile":  # padding bytes are not part of the layout
            at = fusedrope.reference.mfma_tile_offsets(3, 2, 8, 32)
            sc, want_sc = sc.view(torch.uint8).flatten()[at], want_sc.view(torch.uint8).flatten()[at]
        assert sc.shape == want_sc.shape and sc.view(torch.uint8).equal(want_sc.view(torch.uint8)), name
        assert (x.stride() == (256, 3 * 256, 1)) == (name == "auto:group_major"), name
    x, sc = quant["auto:vllm"].make(case, sets)(1)  # vLLM's layouts, on the set's o and its cos||sin cache
    assert x.stride() == (256, 3 * 256, 1) and sc.dtype == torch.float32 and sc.stride() == (1, 8 * 4, 4)
    assert x.view(torch.uint8).equal(fusedrope.inverse_rope_group_quant(*sets[1][:4], 2, 32)[0].view(torch.uint8))
    assert quant["auto:vllm"].bytes_moved(case) == case.bytes_moved(torch.bfloat16, B.QUANT_CACHE_DTYPE) + \
        3 * 3 * 16 + 4 * 1 * 16  # fp32 scales: 3 more bytes per block; one padding token of 16 zeroed blocks
    elements = 3 * 4 * 128
    assert quant["auto:bf16"].bytes_moved(case) == case.bytes_moved(torch.bfloat16, B.QUANT_CACHE_DTYPE) + \
        elements - elements // 32
    row, = B.measure(B.QUANT, case, [quant["auto:bf16"]], CPU, reps=1, copy_tbps=1.0)
    assert row["bytes_moved"] == quant["auto:bf16"].bytes_moved(case) and row["tbps"] > 0


def test_the_launch_floor_is_timed_without_a_bandwidth():
    """``floor`` (one trivial kernel per call) moves none of the case's bytes: timed, with no TB/s or % of copy,
    and the tables and plots take its rows."""
    floor = [c for c in B.contenders(B.QUANT, CPU, compile=False) if c.name == "floor"]
    row, = B.measure(B.QUANT, QuantCase(1, 8, 1), floor, CPU, reps=1, copy_tbps=1.0)
    assert row["status"] == "ok" and row["per_call_us"] > 0 and "tbps" not in row and "frac_copy" not in row
    tables = report.contender_tables([row], B.QUANT)
    assert "| S1-H8-G1-D512-R64-g128 | " in tables and "TB/s" not in tables


def test_candidate_table_against_the_default():
    """Each candidate contender against the same call on the default kernel (cuda_head:x against cuda:x, cuda_head
    against cuda), else against auto (cuda_head:group_major, a layout only the candidate writes)."""
    case = QuantCase(8, 16, 2)
    base = {"op": B.QUANT, **B.case_fields(B.QUANT, case), "status": "ok", "tbps_basis": "device_us"}
    rows = [{**base, "contender": "cuda", "device_us": 2.0},
            {**base, "contender": "cuda_head", "device_us": 1.6},
            {**base, "contender": "cuda:pdl", "status": "skipped", "reason": "needs sm_90"},
            {**base, "contender": "cuda_head:pdl", "device_us": 2.5, "graph_l2_resident": True},
            {**base, "contender": "cuda:bf16_cache", "device_us": 1.9},
            {**base, "contender": "cuda_head:bf16_cache", "device_us": 0.95},
            {**base, "contender": "auto:group_major", "device_us": 3.0},
            {**base, "contender": "cuda_head:group_major", "device_us": 1.5}]
    table = report.candidate_table(rows, B.QUANT)
    M = report.L2_MARK
    assert "| case | cuda_head | cuda_head:pdl | cuda_head:bf16_cache | cuda_head:group_major |" in table
    assert f"| {case.id} | 1.60 (1.25x) | 2.50{M} | 0.95 (2.00x) | 1.50 (2.00x) |" in table
    assert "in brackets the default (the same call on cuda, else auto) / the candidate" in table
    assert report.L2_NOTE in table
    assert report.candidate_table(rows[:1] + rows[4:5], B.QUANT) == ""  # defaults only: no candidate

def test_a_peer_that_fails_to_import_costs_only_its_own_row(monkeypatch):
    """Liger imports ~40 op modules against the machine's torch/triton: an error other than ImportError there
    must become the liger row's reason, not lose every op-1 contender."""
    broken = types.ModuleType("liger_kernel.ops.rope")

    def fail(name):
        raise RuntimeError("triton.language has no attribute 'foo'")

    broken.__getattr__ = fail
    for name in ("liger_kernel", "liger_kernel.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.ops.rope", broken)
    tts = {c.name: c for c in B.contenders(B.TTS, CPU)}
    assert tts["liger"].reason == ("liger_kernel failed to import: RuntimeError: triton.language has no attribute "
                                   "'foo'")
    assert tts["eager"].reason is None


def test_sets_rotate_distinct_inputs_in_engine_layouts():
    q, k, cos, sin = B.make_sets(B.TTS, TTS_CASES[0], CPU)[1]
    assert not q.is_contiguous() and q.shape == (1, 16, 16, 128) and k.shape == (1, 8, 16, 128)
    sets = B.make_sets(B.QUANT, QuantCase(3, 16, 2), CPU, n=3, transpose_scale=True)
    o, pos, c, s, x, sc, t = sets[2]
    assert t and sc.shape == (3, 2, 32) and sc.stride() == (1, 32 * 3, 3) and x.dtype == torch.float8_e4m3fn
    assert not torch.equal(sets[0][0], sets[1][0])
    x2, sc2 = fusedrope.inverse_rope_group_quant(*B.op_args(B.QUANT, QuantCase(3, 16, 2), sets[2]),
                                                 backend="reference")
    assert x2 is x and sc2 is sc


def test_cpu_timers_and_copy_roofline():
    calls = []
    us = timing.time_per_call_us(calls.append, 2, CPU, reps=2, warmup=1)
    assert us > 0 and len(calls) > 5  # calibrated to a 10 ms sample
    copy = B.copy_roofline(CPU, nbytes=2**20, reps=1)
    assert copy["tbps"] > 0 and "not representative" in copy["timing"]


@pytest.mark.slow  # whole benchmark runs in subprocesses
def test_pytest_benchmark_suite_runs_and_skips_with_reasons(tmp_path):
    # a child of an xdist worker would count as xdist and have pytest-benchmark refuse --benchmark-only
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")} | {"PYTHONPATH": str(ROOT)}
    saved = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "bench/test_bench_tts_rope.py",
         "bench/test_bench_inverse_rope_quant.py", "--benchmark-only", "-q", "-rs", "-p", "no:cacheprovider",
         "-k", "(small_tts-B1 or S1-H8-G1) and not compile", f"--benchmark-json={saved}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "benchmark 'qwen3_tts_rope small_tts-B1'" in out
    assert "benchmark 'inverse_rope_group_quant S1-H8-G1-D512-R64-g128'" in out
    assert "triton: CPU interpreter timings are not meaningful" in out
    assert "unfused: CPU interpreter timings are not meaningful" in out
    assert "cuda: cuda backend unavailable" in out
    assert "7 passed" in out  # eager, reference and the launch floor, for each op; op 1's norm_rope:eager chain
    # the JSON carries our provenance next to pytest-benchmark's, and each row its bandwidth fields
    saved = json.loads(saved.read_text())
    meta = saved["machine_info"]["fusedrope"]
    assert meta["device"] == "cpu" and meta["torch"] == torch.__version__ and meta["git_commit"]
    assert meta["timing"] == B.CPU_TIMING and "command" in meta
    rows = {b["extra_info"]["contender"]: b["extra_info"] for b in saved["benchmarks"]}
    assert len(saved["benchmarks"]) == 7 and set(rows) == {"eager", "reference", "norm_rope:eager", "floor"}
    assert all(r["per_call_us"] > 0 and r["bytes_moved"] > 0 for r in rows.values())
    assert all(r["tbps"] > 0 for n, r in rows.items() if n != "floor") and "tbps" not in rows["floor"]
    # --benchmark-disable (a smoke run of the suite) runs each call once and times nothing: no crash
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "bench/test_bench_tts_rope.py", "--benchmark-disable", "-q",
         "-p", "no:cacheprovider", "-k", "small_tts-B1-eager]"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]


def test_provenance_without_a_git_checkout(monkeypatch):
    """A device machine's copy of the tree has no .git: the commit comes from FUSEDROPE_GIT_COMMIT and the tree
    state is reported unknown, not clean."""
    monkeypatch.setattr(B, "_git", lambda *args: "")
    monkeypatch.delenv(B.ENV_GIT_COMMIT, raising=False)
    monkeypatch.delenv(B.ENV_GIT_DIRTY, raising=False)
    meta = B.machine_info(CPU)
    assert meta["git_commit"] == "unknown" and meta["git_dirty"] is None
    monkeypatch.setenv(B.ENV_GIT_COMMIT, "0123abc")
    meta = B.machine_info(CPU)
    assert meta["git_commit"] == "0123abc" and meta["git_dirty"] is None
    md = report.markdown({"meta": meta, "rows": [], "copy": {}})
    assert "- commit: 0123abc (no git checkout: tree state unknown)" in md
    d = B.default_out_dir(CPU, "quick")
    assert d.parent == Path("bench/results") and d.name == "cpu-quick-0123abc"
    # a checkout whose HEAD is another commit cannot vouch for the named one's tree
    monkeypatch.setattr(B, "_git", lambda *args: "fedcba9876" if args[0] == "rev-parse" else "")
    assert B.git_state() == ("0123abc", None)
    monkeypatch.setenv(B.ENV_GIT_COMMIT, "fedcba9")
    assert B.git_state() == ("fedcba9876", False)
    # where the tree was sent from, its state can travel with the commit
    monkeypatch.setattr(B, "_git", lambda *args: "")
    monkeypatch.setenv(B.ENV_GIT_COMMIT, "0123abc")
    for told, dirty in (("1", True), ("0", False), ("yes", None)):
        monkeypatch.setenv(B.ENV_GIT_DIRTY, told)
        assert B.git_state() == ("0123abc", dirty)


@pytest.mark.parametrize("argv,message", [
    (["--reps", "-3"], "argument --reps: expected a number above 0, got -3"),
    (["--budget-s", "0"], "argument --budget-s: expected a number above 0, got 0"),
    (["--quick", "--full"], "argument --full: not allowed with argument --quick"),
    (["--contenders", "eager,nope"], "bench: --contenders: unknown ['nope']"),
    (["--cases", "small_tts-B1,nothing"], "bench: --cases: not in the quick matrix: ['nothing']"),
    (["--out", "/proc/no/such/dir"], "bench: --out: cannot create /proc/no/such/dir"),
])
def test_cli_bench_refuses_bad_arguments_before_running(argv, message, capsys):
    try:
        rc = main(["bench", "--quick", "--no-plots", *argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    assert rc == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv,no_timing", [([], False), (["--no-timing"], True), (["report"], False),
                                            (["report", "--no-timing"], True), (["--no-timing", "report"], True)])
def test_cli_report_takes_no_timing_with_or_without_its_name(argv, no_timing, monkeypatch):
    import fusedrope.__main__ as cli

    seen = []
    monkeypatch.setattr(cli, "report", lambda args: seen.append(args.no_timing) or 0)
    assert main(argv) == 0
    assert seen == [no_timing]


def test_cli_no_timing_is_refused_outside_the_report(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--no-timing", "build"])
    assert e.value.code == 2
    assert "--no-timing belongs to the report, not to `build`" in capsys.readouterr().err


@pytest.mark.parametrize("cuda, hip, code", [
    ("ok", "cannot build", 0),            # a CUDA machine: HIP only cannot build here
    ("cannot build", "ok", 0),            # a ROCm machine
    ("cannot build", "cannot build", 1),  # a CPU machine: nothing built, the AOT step must not pass silently
    ("ok", "nvcc failed", 1),             # a build that broke
    ("nvcc failed", "cannot build", 1),   # ... and nothing built: the message must not blame the toolchain
])
def test_cli_build_exit_status(cuda, hip, code, monkeypatch, capsys):
    from fusedrope import cuda_ext, hip_ext, jit_ext

    def builder(outcome):
        def build(verbose=False):
            if outcome != "ok":
                raise RuntimeError(f"fusedrope: {outcome} the kernels: a reason")
            return "ext.so"
        return build

    monkeypatch.setattr(cuda_ext, "build", builder(cuda))
    monkeypatch.setattr(hip_ext, "build", builder(hip))
    monkeypatch.setattr(jit_ext, "build_fast_checks", builder("ok"))
    assert main(["build"]) == code
    out = capsys.readouterr().out
    assert ("nothing was built" in out) == (cuda != "ok" and hip != "ok")
    assert ("no toolchain" in out) == (cuda == hip == "cannot build")
    assert "compiled checks: built ext.so" in out
    assert main(["build", "--checks"]) == 0  # the kernels are not asked for
    assert "CUDA" not in capsys.readouterr().out
    monkeypatch.setattr(jit_ext, "build_fast_checks", builder("g++ failed"))
    assert main(["build", "--checks"]) == 1 and main(["build"]) == 1  # the checks failed: the kernels do not save it
    assert "compiled checks: not built: fusedrope: g++ failed" in capsys.readouterr().out


@pytest.mark.parametrize("name,arch,hip,l2,cache", [
    ("NVIDIA H200", "", None, 60 * 2**20, 60 * 2**20),
    ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", "6.4", 4 * 2**20, 256 * 2**20),
    ("AMD Instinct MI355X", "gfx950:sramecc+:xnack-", "7.0", 4 * 2**20, 256 * 2**20),
])
def test_rotated_inputs_outgrow_the_last_cache(monkeypatch, name, arch, hip, l2, cache):
    """Input sets hold 3x the GPU's last cache: the L2 on NVIDIA, the 256 MiB Infinity Cache behind the small L2 of
    MI300/MI355; the results' metadata records the size used beside the L2."""
    from types import SimpleNamespace

    props = SimpleNamespace(name=name, L2_cache_size=l2, major=9, minor=0, gcnArchName=arch,
                            multi_processor_count=304, total_memory=192 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.version, "hip", hip)
    gpu = torch.device("cuda", 0)
    assert B.cache_bytes(gpu) == cache
    assert B.num_sets(2**20, gpu) == 3 * cache // 2**20
    meta = B.machine_info(gpu)
    assert meta["l2_bytes"] == l2 and meta["rotate_cache_bytes"] == cache


def test_smi_report_is_read_under_load_and_falls_back(monkeypatch):
    """Clocks are read while copies run (idle clocks say nothing of the run); a tool that rejects the long field
    list falls back to the short one; a missing tool or a failed load is recorded as text, never raised."""
    copies = []
    real_copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src: copies.append(1) or real_copy(self, src))
    monkeypatch.setattr(B, "_smi_commands", lambda: [["sh", "-c", "echo bad field; exit 2"],
                                                     ["sh", "-c", "sleep 0.3; echo 1980 MHz"]])
    got = B.smi_under_load(CPU, nbytes=1024)
    assert got == "1980 MHz\n(read under a copy loop)" and len(copies) > 30
    monkeypatch.setattr(B, "_smi_commands", lambda: [["sh", "-c", "echo bad field; exit 2"],
                                                     ["/nonexistent/nvidia-smi"]])
    got = B.smi_under_load(CPU, nbytes=1024)
    assert got.startswith("sh -c: rc 2: bad field; /nonexistent/nvidia-smi: FileNotFoundError")
    monkeypatch.setattr(B, "_smi_commands", lambda: [["sh", "-c", "echo 1980 MHz"]])
    def no_memory(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(torch, "empty", no_memory)
    got = B.smi_under_load(CPU, nbytes=1024)  # copies cannot run: read idle, and says so
    assert got == "1980 MHz\n(read idle: no load (RuntimeError: out of memory))"


def test_time_basis_says_where_rows_fell_back_to_per_call():
    rows = [_row("cuda", per_call_us=6.0, device_us=2.0, tbps_basis="device_us"),
            _row("eager", per_call_us=60.0, tbps_basis="per_call_us")]
    assert report.time_basis(rows[:1], gpu=True) == "device time from CUDA-graph replay"
    assert report.time_basis(rows, gpu=True).endswith("except per call (host overhead included) for rows of eager")
    assert report.time_basis(rows[1:], gpu=True).startswith("per call (CUDA events")
    assert report.time_basis(rows, gpu=False) == "per call, wall clock"
    assert report.time_basis(rows, gpu=True, short=True) == "device time, per call where not replayed"


def test_tts_seed_table_ratios_and_columns():
    """On ROCm (no hand-written op-1 kernel) the fused column is the backend auto picks, not an empty cuda one."""
    rows = [_row("eager", per_call_us=66.45), _row("compile", per_call_us=32.66),
            _row("triton", per_call_us=23.05), _row("cuda", per_call_us=6.83, tbps=0.0288, frac_copy=0.0067)]
    table = report.tts_seed_table(rows)
    assert table.splitlines()[0] == TTS_SEED_COLUMNS
    assert table.splitlines()[2] == "| qwen3_tts | 1 | 384 | 66.45 | 32.66 | 23.05 | 6.83 | 4.78x | 3.37x | 0.029 | 1 |"
    rows = [_row("eager", per_call_us=66.0, auto_backend="triton"),
            _row("compile", per_call_us=30.0, auto_backend="triton"),
            _row("cuda", status="skipped", reason="no CUDA", auto_backend="triton"),
            _row("triton", per_call_us=20.0, tbps=0.05, frac_copy=0.01, auto_backend="triton")]
    table = report.tts_seed_table(rows)
    assert table.splitlines()[0] == tts_seed_columns("triton")
    assert table.splitlines()[2] == "| qwen3_tts | 1 | 384 | 66.00 | 30.00 | 20.00 | 1.50x | 0.050 | 1 |"
    rows[2].update(status="ok", per_call_us=6.0)
    assert report.tts_seed_table(rows).splitlines()[0] == TTS_SEED_COLUMNS  # cuda wherever it was measured


def test_a_failed_graph_capture_raises_the_calls_error_and_restores_the_stream(monkeypatch):
    """torch's graph context ends the capture before restoring the stream; when ending raises (as it does after
    an error inside the capture) the stream stays the capture's, and its error hides the call's."""
    stream = {"now": "caller"}

    class EndingRaises:  # torch.cuda.graph(g), whose ending raises after an error inside the capture
        def __init__(self, g):
            pass

        def __enter__(self):
            stream["now"] = "capture"

        def __exit__(self, *exc):
            if exc[0] is not None:
                raise RuntimeError("operation failed due to a previous error during capture")
            stream["now"] = "caller"

    monkeypatch.setattr(torch.cuda, "graph", EndingRaises)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream["now"])
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: stream.update(now=s))

    def call(i):
        raise ValueError("a host sync inside the capture")

    with pytest.raises(ValueError, match="host sync"):
        timing.capture_graph(object(), call, 3)
    assert stream["now"] == "caller"
    calls = []
    timing.capture_graph(object(), calls.append, 3)  # a good capture: every call, stream left as it was
    assert calls == [0, 1, 2] and stream["now"] == "caller"


def test_replay_fields_cap_many_kernel_contenders_and_flag_cache_hits(monkeypatch):
    """What both the CLI's rows and the pytest suite record of a graph replay (GPU-only code, so faked here)."""
    monkeypatch.setattr(B, "cache_bytes", lambda device: 1_000_000)
    one = B.Contender("cuda", B.TTS, "one kernel", None)
    many = B.Contender("eager", B.TTS, "many kernels", None, many_kernels=True)
    cap = B.GRAPH_CAP_MANY_KERNELS
    assert B.replay_fields(one, 2 * cap, 1000, CPU) == {"graph_calls": 2 * cap, "graph_rotated_over_l2": 0.8,
                                                        "graph_l2_resident": True}
    assert B.replay_fields(one, 2000, 1000, CPU) == {"graph_calls": 2000, "graph_rotated_over_l2": 2.0,
                                                     "graph_l2_resident": False}
    # the capped replay rotates only its own calls' inputs, whatever the row's rotated_over_l2 says of all n
    assert B.replay_fields(many, 2000, 1000, CPU) == {"graph_calls": cap, "graph_rotated_over_l2": 0.4,
                                                      "graph_l2_resident": True}


@pytest.mark.parametrize("case", [TTS_CASES[0], TTS_CASES[-1]], ids=lambda c: c.id)
def test_tts_bytes_moved_is_the_seeds_ideal_traffic(case):
    """Every TB/s figure and the launch-bound definition rest on it: read Q and K, one cos and one sin row per
    token, write Q and K (2 bytes each in bf16), written out from the shapes."""
    B_, S, Hq, Hkv, D = case.batch, case.seq_len, case.num_q_heads, case.num_kv_heads, case.head_dim
    q_k = B_ * S * (Hq + Hkv) * D
    want = 2 * (2 * q_k + 2 * B_ * S * D)  # bf16: read q,k + cos,sin; write q,k
    assert case.bytes_moved() == want
    assert case.bytes_moved(torch.float32) == 2 * want
    assert TTS_CASES[0].bytes_moved() == 204800  # qwen3_tts-B1, as bench/results/*/results.json record it


@pytest.mark.parametrize("gs", [32, 128])
def test_quant_bytes_moved_is_the_seeds_count(gs):
    """The seed's byte count (docs/benchmarks.md): read o, one cos and one sin row per token, write fp8 at 1 B/elem
    plus one scale byte per block."""
    case = QuantCase(8, 16, 2, quant_group_size=gs)
    elems = 8 * 16 * 512
    cos_sin = 8 * 2 * 32  # rope_dim/2 cos + rope_dim/2 sin per token
    assert case.bytes_moved() == 2 * elems + 2 * cos_sin + elems + elems // gs
    assert case.bytes_moved(torch.bfloat16, torch.float32) == 2 * elems + 4 * cos_sin + elems + elems // gs
    assert B.case_fields(B.QUANT, case)["bytes_moved"] == case.bytes_moved(torch.bfloat16, B.QUANT_CACHE_DTYPE)


@pytest.mark.parametrize("memcpy_us,kernel_us", [(100.0, 100.0), (200.0, 50.0)])
def test_copy_roofline_is_the_faster_copy_counting_bytes_read_and_written(monkeypatch, memcpy_us, kernel_us):
    """nbytes read plus nbytes written per copy, as every kernel's bytes_moved counts both directions (a one-way
    count would double every frac_copy); the faster of memcpy and a kernel copy (on the H200 memcpy was weaker)."""
    times = iter([memcpy_us, kernel_us])  # memcpy first, then the elementwise kernel
    monkeypatch.setattr(B, "time_per_call_us", lambda *a, **k: next(times))
    copy = B.copy_roofline(CPU, nbytes=2**20, reps=1)
    assert copy["us"] == kernel_us and copy["bytes_each_way"] == 2**20
    assert copy["copies"]["memcpy"]["us"] == memcpy_us and copy["tbps"] == B._sig(2 * 2**20 / kernel_us / 1e6)
    if memcpy_us > kernel_us:
        assert copy["copy"] == "kernel" and "kernel" in copy["timing"]


def test_the_kernel_copy_moves_the_bytes_it_counts():
    """bitwise_not over int32 views reads every source byte and writes every destination byte."""
    src = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    torch.bitwise_not(src.view(torch.int32), out=dst.view(torch.int32))
    assert torch.equal(dst, ~src)


def test_tbps_comes_from_device_time_where_the_graph_replay_measured_it(monkeypatch):
    """On a GPU (faked here: the timers, the cache size and the device name) a row's TB/s and frac_copy come from
    the replayed device time, not from the per-call time with its host overhead."""
    monkeypatch.setattr(B, "time_per_call_us", lambda *a, **k: 50.0)
    monkeypatch.setattr(B, "time_graph_us", lambda *a, **k: 10.0)
    monkeypatch.setattr(B, "cache_bytes", lambda device: 60 * 2**20)
    monkeypatch.setattr(B, "_recover", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    case = TTS_CASES[0]
    sets = B.make_sets(B.TTS, case, CPU, n=2)
    stand_in = B.Contender("cuda", B.TTS, "stand-in", lambda c, s: (lambda i: None))
    row, = B.measure(B.TTS, case, [stand_in], torch.device("cuda", 0), reps=1, copy_tbps=4.0, sets=sets)
    assert row["per_call_us"] == 50.0 and row["device_us"] == 10.0 and row["tbps_basis"] == "device_us"
    tbps = case.bytes_moved() / 10e-6 / 1e12
    assert row["tbps"] == B._sig(tbps) and row["frac_copy"] == B._sig(B._sig(tbps) / 4.0)
    assert row["frac_peak"] == B._sig(B._sig(tbps) / 4.8)


@pytest.mark.parametrize("set_bytes", [7 * 2**20, 3_000_000, 123_457])
def test_rotated_sets_hold_at_least_three_caches_whatever_the_set_size(monkeypatch, set_bytes):
    """num_sets rounds up: the sets together hold at least 3x the last cache (and one set fewer would not)."""
    cache = 60 * 2**20
    monkeypatch.setattr(B, "cache_bytes", lambda device: cache)
    n = B.num_sets(set_bytes, torch.device("cuda", 0))
    assert n * set_bytes >= B.ROTATE_L2_FACTOR * cache > (n - 1) * set_bytes


def _quiet_report(cli, monkeypatch):
    for step in ("machine", "backends", "selection", "timing"):
        monkeypatch.setattr(cli, step, lambda: None)


@pytest.mark.parametrize("ok,code", [(True, 0), (False, 1)])
def test_cli_report_exit_status_follows_the_self_check(ok, code, monkeypatch, capsys):
    import fusedrope.__main__ as cli

    _quiet_report(cli, monkeypatch)
    monkeypatch.setattr(cli, "self_check", lambda: ok)
    assert main([]) == code
    assert main(["report", "--no-timing"]) == code
    assert ("FAILURES above" in capsys.readouterr().out) == (not ok)


def test_cli_report_says_whether_the_compiled_checks_are_built(monkeypatch, capsys):
    import fusedrope.__main__ as cli
    from fusedrope import fast_checks

    monkeypatch.setattr(fast_checks, "load", lambda again=False: fast_checks.Python)
    cli.machine()
    assert "Compiled checks of the plain calls: not built (each call takes the Python" in capsys.readouterr().out
    monkeypatch.setattr(fast_checks, "load", lambda again=False: object())
    cli.machine()
    assert "Compiled checks of the plain calls: built\n" in capsys.readouterr().out


@pytest.mark.parametrize("op", ["qwen3_tts_rope", "inverse_rope_group_quant"])
def test_cli_self_check_fails_when_a_backend_is_wrong(op, monkeypatch, capsys):
    import fusedrope.__main__ as cli

    def wrong(*args, **kw):
        raise AssertionError("1 fp8 byte differs")

    monkeypatch.setattr(cli, "_available", lambda name: ["reference"] if name == op else [])
    monkeypatch.setattr(cli, "assert_quant_close" if op == "inverse_rope_group_quant" else "assert_ulp_close", wrong)
    assert cli.self_check() is False
    out = capsys.readouterr().out
    assert f"FAIL {op}" in out and "1 fp8 byte differs" in out
    _quiet_report(cli, monkeypatch)
    assert main(["--no-timing"]) == 1


def test_cli_plot_redraws_committed_results_of_both_layouts(tmp_path, capsys):
    """`python -m fusedrope plot` on the committed H200 run: op 1's results.json (rows at the top) and op 2's
    (rows under sections.bench) each give their PNGs; a missing file and a JSON that is not a results file are
    named, exit 2."""
    run = max((Path(__file__).resolve().parent.parent / "bench/results").glob("nvidia-h200-gpu-checks-*"))
    assert main(["plot", str(run / "tts/results.json"), str(run / "quant/results.json"), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "inverse_rope_group_quant_H16_G2.png", "inverse_rope_group_quant_H8_G1.png", "qwen3_tts_rope.png"]
    for p in tmp_path.glob("*.png"):
        assert p.stat().st_size > 5000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "other.json").write_text('{"a": 1}')
    assert main(["plot", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err
    assert "missing.json" in err and "expected a fusedrope results.json" in err and "got keys ['a']" in err
