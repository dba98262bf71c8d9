"""budget.json -> the README.md beside it: one table per op, the provenance and the constants the ratios use."""

from __future__ import annotations

COLUMNS = ("kernel", "shape", "grid x block", "regs", "occ.", "waves", "instr/warp", "instr/KB", "issue/bytes",
           "lane use", "predicated off/warp")


def _shape(r: dict) -> str:
    if r["op"] == "inverse_rope_group_quant":
        return f"S={r['S']} H={r['H']} G={r['G']} q={r['q']} {r['layout']}"
    return f"{r['case']} B={r['B']}"


def _cells(r: dict) -> list[str]:
    lo, hi = r["per_warp_range"]
    spread = f" ({lo:g}-{hi:g})" if lo != hi else ""
    return [r["kernel"], _shape(r), f"{'x'.join(map(str, r['grid']))} x {r['block'][0]}", str(r["registers"]),
            f"{r['occupancy']:.2f}", f"{r['waves']:.2f}", f"{r['per_warp']:g}{spread}", f"{r['per_kb']:g}",
            f"{r['issue_over_bytes']:.2f}", f"{r['lane_use']:.2f}", f"{r['predicated_off']:g}"]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(_cells(r)) + " |" for r in rows])


def markdown(provenance: dict, rows: list[dict]) -> str:
    g = provenance["gpu_model"]
    vllm = provenance.get("vllm_wheel")
    head = [
        "# Issue budget, counted on the CPU",
        "",
        f"Command: `{provenance['command']}` at commit {provenance['commit']}"
        f"{' (with uncommitted changes)' if provenance['dirty'] else ''}, {provenance['date']}, "
        f"on {provenance['machine']} ({provenance['cpu']}); {provenance['nvcc']}; Triton {provenance['triton']}; "
        f"torch {provenance['torch']}; "
        + (f"vLLM's kernel from {vllm}." if vllm else "vLLM's kernel not found: its rows are left out."),
        "",
        "Each row is one launch as fusedrope's launcher makes it for that shape, compiled for sm_90 and read from its "
        "SASS: `instr/warp` is the warp-instructions a warp issues along the path it takes (the range over warps), "
        "`instr/KB` the total over the ideal bytes the op must move. `issue/bytes` is issue time "
        f"(instructions / ({g['sms']} SMs x {g['schedulers']} schedulers x {g['clock_ghz']} GHz)) over byte time "
        f"(ideal bytes / {g['copy_tbs']} TB/s, the {g['name']}'s measured copy): near 1, a kernel cannot reach the "
        "memory roofline. `occ.` is resident warps over 64 per SM from registers, block size and shared memory; "
        "`lane use` the fraction of lanes active per issued instruction. The count does not model stalls, sectors "
        "per access or the last wave's tail: docs/benchmarks.md#issue-budget.",
        "",
    ]
    out = head
    for op in ("inverse_rope_group_quant", "qwen3_tts_rope"):
        mine = [r for r in rows if r["op"] == op]
        if mine:
            out += [f"## {op}", "", table(mine), ""]
    return "\n".join(out)
