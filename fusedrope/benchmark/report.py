"""Benchmark result files and how they read: JSON and CSV rows, markdown tables in the seeds' own columns next to
every contender side by side, and PNG plots (time and bandwidth against bytes moved, one line per contender).
Everything here works on the result dicts of :func:`fusedrope.benchmark.run` (or a saved ``results.json``), so
committed results can be tabulated and plotted again without a GPU.

Examples
--------
>>> from fusedrope.benchmark import report
>>> rows = [{"op": "qwen3_tts_rope", "case": "qwen3_tts_b1", "contender": c, "status": "ok", "tbps": t}
...         for c, t in (("eager", 0.5), ("cuda", 3.5))]
>>> print(report.contender_tables(rows, "qwen3_tts_rope"))
TB/s
<BLANKLINE>
| case | eager | cuda |
|---|---|---|
| qwen3_tts_b1 | 0.500 | 3.500 |
<BLANKLINE>
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Optional

from ..inverse_rope_group_quant import OP as QUANT
from ..qwen3_tts_rope import OP as TTS
from ..registry import BACKENDS


# ------------------------------------------------------------------------------------------------------------
# result files
# ------------------------------------------------------------------------------------------------------------
CSV_FIRST = ["op", "case", "contender", "status", "per_call_us", "device_us", "tbps", "frac_copy", "frac_peak",
             "tbps_basis", "graph_calls", "graph_rotated_over_l2", "graph_l2_resident", "n_sets", "rotated_mb",
             "rotated_over_l2", "bytes_moved", "auto_backend", "device"]


def write_json(results: dict, path) -> Path:
    """Written whole or not at all (a temporary file renamed over it): a run killed mid-write (a GPU session's
    time limit) keeps the last complete version."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


def write_csv(rows: list[dict], path) -> Path:
    """One line per (case, contender); columns: :data:`CSV_FIRST`, then the case fields, then the rest."""
    fields = list(CSV_FIRST)
    for r in rows:
        fields += [k for k in r if k not in fields and k != "reason"]
    fields.append("reason")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in fields})
    path = Path(path)
    path.write_text(buf.getvalue())
    return path


def write_results(results: dict, out_dir) -> list[Path]:
    out = Path(out_dir)
    return [write_json(results, out / "results.json"), write_csv(results["rows"], out / "results.csv"),
            _write_text(out / "results.md", markdown(results))]


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------------------------
# markdown tables
# ------------------------------------------------------------------------------------------------------------
def where(meta: dict) -> str:
    """What the results were measured on: the GPU's name, else the CPU label that
    :func:`fusedrope.benchmark.machine_info` wrote."""
    return meta.get("gpu") or meta.get("label") or "CPU"


def _f(v, nd: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


L2_MARK = "†"
L2_NOTE = (f"{L2_MARK} device time from CUDA-graph replay over input sets that together fit in the GPU's last cache "
           "(the L2; the Infinity Cache on MI300/MI350; multi-kernel contenders are captured over at most a few "
           "hundred calls): cache hits, not memory bandwidth.\n")


def _device_based(row: dict, key: str) -> bool:
    """Whether ``row[key]`` comes from graph replay (so is L2-resident when the row says so)."""
    return key == "device_us" or (key in ("tbps", "frac_copy", "frac_peak", "time")
                                  and row.get("tbps_basis") == "device_us")


def _cell(row: dict, key: str, nd: int = 2, scale: float = 1, value=None) -> str:
    """One table cell of ``row[key]`` (or ``value``), marked when it is an L2-resident replay time."""
    v = row.get(key) if value is None else value
    text = _f(None if v is None else scale * v, nd)
    return text + L2_MARK if v is not None and row.get("graph_l2_resident") and _device_based(row, key) else text


def _l2_note(rows) -> str:
    return "\n" + L2_NOTE if any(r.get("graph_l2_resident") and r.get("status") == "ok" for r in rows) else ""


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _table(header: list[str], lines: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(x) + " |" for x in lines]) + "\n"


def _by_case(rows: list[dict], op: str) -> dict:
    """``{case id: {contender: row}}`` of the ok rows, cases in measured order."""
    out: dict = {}
    for r in rows:
        if r.get("op") == op:
            out.setdefault(r["case"], {})
            if r.get("status") == "ok":
                out[r["case"]][r["contender"]] = r
    return out


def _first(case_rows: dict) -> dict:
    return next(iter(case_rows.values()), {})


def tts_fused_name(rows: list[dict]) -> str:
    """Op 1's fused contender for the seed table: ``cuda`` where it was measured, else the backend auto picks
    (Triton on ROCm, which has no hand-written op-1 kernel), else the first measured in the registry's order."""
    ok = [r for r in rows if r.get("op") == TTS and r.get("status") == "ok"]
    names = {r["contender"] for r in ok}
    for name in ["cuda"] + [r.get("auto_backend") for r in ok[:1]] + list(BACKENDS):
        if name in names:
            return name
    return "cuda"


def tts_seed_table(rows: list[dict]) -> str:
    """Op 1 in the seed's columns (per-call us, CUDA events around back-to-back calls), with the fused kernel's
    TB/s and fraction of the copy roofline added (:func:`tts_fused_name`: the cuda kernel where measured)."""
    f = tts_fused_name(rows)
    vs_triton = f != "triton"  # where Triton is the fused kernel (ROCm), no column compares it with itself
    header = ["shape", "batch", "rows", "eager us", "torch.compile us", *(["triton us"] * vs_triton), f"{f} us",
              f"compile / {f}", *([f"triton / {f}"] * vs_triton), f"{f} TB/s", "% copy"]
    lines = []
    meta = {r["case"]: r for r in rows if r.get("op") == TTS}
    by_case = _by_case(rows, TTS)
    for cid, cr in by_case.items():
        m = meta[cid]
        t = {k: cr.get(k, {}).get("per_call_us") for k in ("eager", "compile", "triton", f)}
        lines.append([m["shape"], str(m["batch"]), str(m["rows"]), _f(t["eager"]), _f(t["compile"]),
                      *([_f(t["triton"])] * vs_triton), _f(t[f]), _ratio(t["compile"], t[f]),
                      *([_ratio(t["triton"], t[f])] * vs_triton), _cell(cr.get(f, {}), "tbps", 3),
                      _cell(cr.get(f, {}), "frac_copy", 0, 100)])
    return _table(header, lines) + _l2_note(cr.get(f, {}) for cr in by_case.values())


def time_basis(rows: list[dict], gpu: bool, short: bool = False) -> str:
    """What the ok ``rows``' times (and so their TB/s) are: device time from graph replay, or per call where a
    row has no device time (``--no-graph``, or a failed capture), said per contender (``short``: for a plot
    axis)."""
    if not gpu:
        return "per call, wall clock"
    ok = [r for r in rows if r.get("status") == "ok"]
    per_call = sorted({r["contender"] for r in ok if r.get("tbps_basis") != "device_us"})
    if not per_call:
        return "device time (CUDA-graph replay)" if short else "device time from CUDA-graph replay"
    if len(per_call) == len({r["contender"] for r in ok}):
        return "per call (CUDA events)" if short else \
            "per call (CUDA events around back-to-back calls, host overhead included): no graph replay"
    if short:
        return "device time, per call where not replayed"
    return ("device time from CUDA-graph replay, except per call (host overhead included) for rows of "
            + ", ".join(per_call))


def fused_row(case_rows: dict) -> tuple[Optional[str], dict]:
    """Op 2's "fused" contender of one case: the backend auto picks if it was measured, else the first
    measured one in the registry's order (:data:`fusedrope.BACKENDS`, fastest first)."""
    auto = _first(case_rows).get("auto_backend")
    for name in ([auto] if auto else []) + list(BACKENDS):
        if name in case_rows:
            return name, case_rows[name]
    return None, {}


def _quant_line(case_rows: dict, lead: list[str]) -> tuple[list[str], str]:
    name, fr = fused_row(case_rows)
    auto = _first(case_rows).get("auto_backend")
    label = ("none measured" if name is None else name if name == auto
             else f"{name} (auto picks {auto}, not measured)")
    un = case_rows.get("unfused", {})
    tf, tu = _time(fr), _time(un)
    return (lead + [_cell(fr, "time", value=tf), _cell(fr, "tbps", 3), _cell(un, "time", value=tu),
                    _cell(un, "tbps", 3), _ratio(tu, tf), _cell(fr, "frac_copy", 0, 100)], label)


def _time(row: dict):
    """The time a row's TB/s came from: device time where measured, else per call."""
    return row.get("device_us") or row.get("per_call_us")


def quant_seed_tables(rows: list[dict]) -> str:
    """Op 2 in the seed's columns: one table per (H, G) over S, and the quant-group-size axis."""
    by_case = _by_case(rows, QUANT)
    meta = {r["case"]: r for r in rows if r.get("op") == QUANT}
    out, fused_names = [], set()
    layout = "column-major" if any(m.get("transpose_scale") for m in meta.values()) else "row-major"
    head = ["fused us", "fused TB/s", "unfused us", "unfused TB/s", "speedup", "% copy"]
    hgs = list(dict.fromkeys((m["num_heads"], m["num_groups"]) for m in meta.values()))
    for h, g in hgs:
        ids = [c for c, m in meta.items() if (m["num_heads"], m["num_groups"]) == (h, g)
               and m["quant_group_size"] == 128]
        if not ids:
            continue
        lines = []
        for cid in sorted(ids, key=lambda c: meta[c]["num_tokens"]):
            line, name = _quant_line(by_case.get(cid, {}), [str(meta[cid]["num_tokens"])])
            lines.append(line)
            fused_names.add(name)
        out.append(f"hg = (n_local_heads, n_local_groups) = ({h}, {g}), quant_group_size 128, {layout} "
                   "scale\n\n" + _table(["S"] + head, lines))
    # the group-size axis: token counts of one (H, G) measured at more than one group size
    for h, g in hgs:
        gs: dict = {}
        for cid, m in meta.items():
            if (m["num_heads"], m["num_groups"]) == (h, g):
                gs.setdefault(m["num_tokens"], []).append(cid)
        lines = []
        for s in sorted(k for k, v in gs.items() if len(v) > 1):
            for cid in sorted(gs[s], key=lambda c: meta[c]["quant_group_size"]):
                line, name = _quant_line(by_case.get(cid, {}), [str(s), str(meta[cid]["quant_group_size"])])
                lines.append(line)
                fused_names.add(name)
        if lines:
            out.append(f"Quant group size axis, hg = ({h}, {g}), {layout} scale\n\n"
                       + _table(["S", "group"] + head, lines))
    return (f"fused = {', '.join(sorted(fused_names)) or 'none measured'}\n\n" + "\n".join(out)
            + _l2_note(r for r in rows if r.get("op") == QUANT))


def contender_tables(rows: list[dict], op: str) -> str:
    """Every contender side by side: one table per metric (per-call us, device us, TB/s, % of copy)."""
    by_case = _by_case(rows, op)
    names = list(dict.fromkeys(r["contender"] for r in rows if r.get("op") == op))
    skipped = {}
    for r in rows:
        if r.get("op") == op and r.get("status") != "ok":
            skipped.setdefault(r["contender"], r.get("reason", ""))
    ran = [n for n in names if any(n in cr for cr in by_case.values())]
    out = []
    for key, title, nd, scale in (("per_call_us", "per call, us", 2, 1),
                                  ("device_us", "device time, us", 2, 1),
                                  ("tbps", "TB/s", 3, 1), ("frac_copy", "% of copy", 0, 100),
                                  ("frac_peak", "% of spec-sheet bandwidth", 0, 100)):
        if not any(key in r for cr in by_case.values() for r in cr.values()):
            continue
        lines = [[cid] + [_cell(cr.get(n, {}), key, nd, scale) for n in ran] for cid, cr in by_case.items()]
        out.append(f"{title}\n\n" + _table(["case"] + ran, lines))
    notes = [f"- {n}: {skipped[n]}" for n in names if n not in ran and n in skipped]
    if notes:
        out.append("Not measured:\n" + "\n".join(notes) + "\n")
    note = _l2_note(r for r in rows if r.get("op") == op)
    if note:
        out.append(note.lstrip("\n"))
    return "\n".join(out)


def candidate_table(rows: list[dict], op: str, gpu: bool = True) -> str:
    """The candidate kernel (contenders named ``cuda_head...``) case by case against what it would replace: each
    one's time and, in brackets, the default's over it (above 1x: the candidate is faster). The default of
    ``cuda_head[:x]`` is ``cuda[:x]``, else ``auto:x`` (what a call gets today where only the candidate writes
    the layout). "" where no candidate was measured."""
    by_case = _by_case(rows, op)
    names = [n for n in dict.fromkeys(r["contender"] for r in rows if r.get("op") == op)
             if n.split(":")[0] == "cuda_head" and any(n in cr for cr in by_case.values())]
    if not names:
        return ""

    def default(name, cr):
        suffix = name.split(":")[1:]
        return next((d for d in (":".join(["cuda", *suffix]), ":".join(["auto", *suffix])) if d in cr), None)

    lines = []
    for cid, cr in by_case.items():
        cells = []
        for n in names:
            e, d = cr.get(n, {}), default(n, cr)
            cells.append(_cell(e, "time", value=_time(e)) + (f" ({_ratio(_time(cr[d]), _time(e))})" if d else ""))
        lines.append([cid] + cells)
    timed = [r for r in rows if r.get("op") == op and r["contender"] in names]
    return (f"us per call ({time_basis(timed, gpu, short=True)}); in brackets the default (the same call on cuda, "
            "else auto) / the candidate\n\n" + _table(["case"] + names, lines)
            + _l2_note(r for cr in by_case.values() for r in cr.values() if r["contender"] in names))


def markdown(results: dict) -> str:
    """All tables of a run, with the machine, commit, command and timing method above them."""
    m, rows, cp = results["meta"], results["rows"], results.get("copy", {})
    gpu = m.get("gpu")
    behind = m.get("rotate_cache_bytes", 0) > m.get("l2_bytes", 0)  # a cache behind the L2 (AMD Infinity Cache)
    on_gpu = (f"; GPU {gpu} ({m.get('gpu_arch')}, L2 {m.get('l2_bytes', 0) / 2**20:.0f} MiB"
              + (f", last cache {m['rotate_cache_bytes'] / 2**20:.0f} MiB" if behind else "") + ")") if gpu else ""
    dirty = {True: " (working tree had uncommitted changes)", None: " (no git checkout: tree state unknown)"}.get(
        m["git_dirty"], "")
    lines = [f"# fusedrope benchmark: {where(m)}", "",
             f"- machine: {m['hostname']} ({m['platform']}, {m['cpu_count']} CPUs){on_gpu}",
             (f"- versions: fusedrope {m['fusedrope']}, torch {m['torch']} (CUDA {m['torch_cuda']}, HIP "
              f"{m['torch_hip']}), triton {m['triton']}, liger-kernel {m['liger_kernel']}, "
              f"python {m['python']}"),
             f"- commit: {m['git_commit']}{dirty}",
             f"- command: `{m['command']}`", f"- time: {m['time_utc']}",
             f"- copy roofline: {cp.get('tbps', 0):.3f} TB/s ({cp.get('timing', '')})"
             + "".join(f"; {n} {c['tbps']:.3f} TB/s" for n, c in cp.get("copies", {}).items())]
    if m.get("hbm_peak_tbps"):
        frac = f", the copy reaches {cp['tbps'] / m['hbm_peak_tbps']:.0%} of it" if cp.get("tbps") else ""
        lines.append(f"- spec-sheet memory bandwidth: {m['hbm_peak_tbps']} TB/s ({m['hbm_peak_source']}){frac}")
    lines.append("")
    lines += [f"- {k}: {v}" for k, v in m["timing"].items()]
    if not gpu:
        lines += ["", (f"**{where(m)}.** These numbers show the format and that the harness runs; they say "
                       "nothing about GPU kernels.")]
    text = "\n".join(lines) + "\n"
    if any(r.get("op") == TTS for r in rows):
        f = tts_fused_name(rows)
        basis = time_basis([r for r in rows if r.get("op") == TTS and r["contender"] == f], gpu)
        text += ("\n## qwen3_tts_rope (seed columns: per call, host overhead included; TB/s and % copy of "
                 f"{f} from {basis})\n\n" + tts_seed_table(rows))
        text += "\n### every contender\n\n" + contender_tables(rows, TTS)
    if any(r.get("op") == QUANT for r in rows):
        text += ("\n## inverse_rope_group_quant (seed columns; times are "
                 + time_basis([r for r in rows if r.get("op") == QUANT], gpu) + ")\n\n" + quant_seed_tables(rows))
        text += "\n### every contender\n\n" + contender_tables(rows, QUANT)
        candidates = candidate_table(rows, QUANT, bool(gpu))
        if candidates:
            text += "\n### the candidate kernel (cuda_head) against the default\n\n" + candidates
    return text


# ------------------------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------------------------
def load_results(path) -> dict:
    """A saved ``results.json`` as :func:`plot` and the tables take it (``meta``, ``rows``, ``copy``): the bench
    CLI's and op 1's GPU script's as written, op 2's GPU script's from its ``sections.bench``."""
    with open(path) as f:
        data = json.load(f)
    if "rows" not in data and "bench" in data.get("sections", {}):
        bench = data["sections"]["bench"]
        data = {**data, "rows": bench.get("rows", []), "copy": bench.get("copy", {})}
    if "meta" not in data or "rows" not in data:
        raise ValueError(f"{path}: expected a fusedrope results.json (keys 'meta' and 'rows', or "
                         f"'sections.bench'), got keys {sorted(data)}")
    return data


def plot(results: dict, out_dir) -> list[Path]:
    """PNG plots, time and bandwidth against bytes moved, one line per contender: one figure for op 1, one per
    (H, G) for op 2 (quant group 128, row-major scales). Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, rows = results["meta"], results["rows"]
    copy_tbps = results.get("copy", {}).get("tbps")
    series = [(TTS, "qwen3_tts_rope", lambda r: True)]
    hgs = dict.fromkeys((r["num_heads"], r["num_groups"]) for r in rows if r.get("op") == QUANT)
    for h, g in hgs:
        series.append((QUANT, f"inverse_rope_group_quant_H{h}_G{g}",
                       lambda r, h=h, g=g: (r["num_heads"], r["num_groups"]) == (h, g)
                       and r["quant_group_size"] == 128 and not r.get("transpose_scale")))
    files = []
    for op, name, keep in series:
        ok = [r for r in rows if r.get("op") == op and r.get("status") == "ok" and keep(r)]
        if not ok:
            continue
        fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 4.8))
        for contender in dict.fromkeys(r["contender"] for r in ok):
            pts = sorted((r["bytes_moved"] / 1e6, _time(r), r.get("tbps"))
                         for r in ok if r["contender"] == contender)
            x = [p[0] for p in pts]
            ax_t.plot(x, [p[1] for p in pts], marker="o", label=contender)
            if all(p[2] is not None for p in pts):  # not the launch floor, which moves no case bytes
                ax_b.plot(x, [p[2] for p in pts], marker="o", label=contender)
        if copy_tbps:
            ax_b.axhline(copy_tbps, color="gray", linestyle="--", label=f"copy {copy_tbps:.2f} TB/s")
        basis = time_basis(ok, bool(m.get("gpu")), short=True)
        ax_t.set(xscale="log", yscale="log", xlabel="bytes moved per call (MB)",
                 ylabel=f"us per call, {basis}", title=f"{name}: time")
        ax_b.set(xscale="log", xlabel="bytes moved per call (MB)", ylabel="TB/s (bytes read + written)",
                 title=f"{name}: bandwidth")
        for ax in (ax_t, ax_b):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"{where(m)} | commit {m['git_commit'][:10]} | {m['time_utc']}", fontsize=9)
        fig.tight_layout()
        path = Path(out_dir) / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)  # re-plotting committed results into a new folder
        fig.savefig(path, dpi=100)
        plt.close(fig)
        files.append(path)
    return files
