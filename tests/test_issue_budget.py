"""The issue budget, gated: the warp-instructions each kernel a GPU call can get issues for the CI shapes
(``bench/static/budget.py --quick``), counted on the CPU from its sm_90 SASS, may not rise more than 3% over the
committed run, and every kernel but the CUDA default issues less per byte than vLLM's own Triton kernel did
there. docs/benchmarks.md#issue-budget says what the count means and what it cannot see."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_asm import find_cuobjdump, find_nvcc

ROOT = Path(__file__).resolve().parent.parent
RUNS = sorted(ROOT.glob("bench/results/cpu-issue-budget-*/budget.json"))  # the committed full runs
RISE = 1.03
VLLM = "vLLM fused_inv_rope_fp8_quant"
DEFAULT_CUDA = "cuda (default, generic kernel)"  # above vLLM's kernel: what the head kernel's GPU run decides

pytestmark = pytest.mark.slow  # compiles every kernel and interprets a sample of each launch: about 3 minutes


def newest_run() -> Path:
    """The committed run the gate compares against: re-run budget.py after a kernel change and commit its folder."""
    assert RUNS, "no committed bench/results/cpu-issue-budget-*/budget.json"
    if len(RUNS) == 1:
        return RUNS[0]

    def depth(path):  # the commits up to the run's own: the newest run has the most
        commit = json.loads(path.read_text())["provenance"]["commit"]
        return int(subprocess.run(["git", "rev-list", "--count", commit], cwd=ROOT, capture_output=True, text=True,
                                  check=True).stdout)
    return max(RUNS, key=depth)


def key(r: dict) -> tuple:
    shape = ("S", "H", "G", "q", "layout") if r["op"] == "inverse_rope_group_quant" else ("case", "B")
    return (r["kernel"], r["op"]) + tuple(r[f] for f in shape)


@pytest.fixture(scope="module")
def budget(tmp_path_factory):
    if not (find_nvcc() and find_cuobjdump()):
        pytest.skip("needs nvcc and cuobjdump (the CUDA toolkit) to read the kernels' SASS")
    out = tmp_path_factory.mktemp("budget")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "static" / "budget.py"), "--quick", "--out", str(out),
                          "--no-vllm"], capture_output=True, text=True, env=env, timeout=1200, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((out / "budget.json").read_text()), json.loads(newest_run().read_text())


def test_no_kernel_issues_more_than_the_committed_run(budget):
    now, base = budget
    same = {"cuda": now["provenance"]["nvcc"] == base["provenance"]["nvcc"],
            "triton": now["provenance"]["triton"] == base["provenance"]["triton"]}
    if not any(same.values()):
        pytest.skip(f"neither nvcc ({now['provenance']['nvcc']}) nor Triton ({now['provenance']['triton']}) is the "
                    f"committed run's: re-run bench/static/budget.py with them and commit it")
    was = {key(r): r for r in base["rows"]}
    risen = []
    for r in now["rows"]:
        if not same["cuda" if r["kernel"].startswith("cuda") else "triton"]:
            continue
        b = was[key(r)]  # a CI shape the committed run lacks is a KeyError: re-run it
        if r["instructions"] > b["instructions"] * RISE:
            risen.append(f"{key(r)}: {r['instructions']} warp-instructions, {b['instructions']} committed")
    assert not risen, "issue count rose over the committed run:\n" + "\n".join(risen)


def test_every_kernel_but_the_default_issues_less_per_byte_than_vllms(budget):
    now, base = budget
    vllm = {(r["S"], r["H"], r["G"]): r["issue_over_bytes"] for r in base["rows"] if r["kernel"] == VLLM}
    assert vllm, "the committed run has no rows of vLLM's kernel: run budget.py with its wheel (--vllm-wheel)"
    over = [f"{key(r)}: {r['issue_over_bytes']} issue/bytes, vLLM's {vllm[r['S'], r['H'], r['G']]}"
            for r in now["rows"] if r["op"] == "inverse_rope_group_quant" and r["q"] == 128 and r["S"] >= 128
            and r["kernel"] != DEFAULT_CUDA and r["issue_over_bytes"] >= vllm[r["S"], r["H"], r["G"]]]
    assert not over, "\n".join(over)
