"""The speed targets of issues #4 (qwen3_tts_rope's CUDA kernel) and #5 (inverse_rope_group_quant's CUDA
kernel) on the H200, judged from a run's benchmark rows: each target with what was measured and by how much
it is met or missed, so a run's summary answers the issues directly. gpu/summarize.py prints them.

A target is met only when every point it names was measured and meets it; one measured point that misses makes
it MISSED; otherwise (points cut by the budget, a contender that could not run) it is "not measured".
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from fusedrope.testing import TTS_CASES, QuantCase, TtsCase

TTS, QUANT = "qwen3_tts_rope", "inverse_rope_group_quant"

# issue #4
TTS_BANDWIDTH_CASE, TTS_BANDWIDTH_FRAC = "wide_heads-B32", 0.75  # device time at >= 75% of the copy
TTS_LAUNCH_BOUND_US = 3.0  # device time of every launch-bound case
# A case is launch-bound when moving its bytes at the copy's bandwidth would take at most this long: its time
# is then the launch and the memory latency, not bandwidth.
TTS_LAUNCH_BOUND_IDEAL_US = 1.0
TTS_PER_CALL_OVER = {"compile": 4.5, "liger": 2.0}  # per-call speedup of cuda over these, on every case
# issue #5
QUANT_BIG_S, QUANT_BIG_FRAC = 8192, 0.80  # cuda at >= 80% of the copy from S = 8192 up
QUANT_SMALL_S, QUANT_SMALL_SPEEDUP = 32, 1.9  # cuda >= 1.9x the unfused baseline up to S = 32


class Target(NamedTuple):
    name: str
    ok: Optional[bool]  # None: not measured on every point it names
    detail: str


def _ok_rows(rows: list[dict], op: str) -> dict:
    """``{(case id, column-major scale): {contender: row}}`` of the rows that ran."""
    out: dict = {}
    for r in rows:
        if r.get("op") == op and r.get("status") == "ok":
            out.setdefault((r["case"], bool(r.get("transpose_scale"))), {})[r["contender"]] = r
    return out


def _judge(name: str, values: list[tuple[str, float]], expected: int, bound: float, at_least: bool,
           unit: str) -> Target:
    """One target over ``expected`` points, of which ``values`` (label, measured) were measured: MISSED as soon
    as one measured point misses, met only when every point was measured and meets it, else not measured. The
    detail names the worst value and its margin."""
    if not values:
        return Target(name, None, f"not measured (0/{expected} points)")
    label, worst = (min if at_least else max)(values, key=lambda v: v[1])
    bad = [lab for lab, v in values if not ((v >= bound) if at_least else (v <= bound))]
    ok = False if bad else (True if len(values) >= expected else None)
    margin = worst / bound if at_least else bound / worst
    detail = (f"worst {label}: {worst:.3g}{unit} vs {'>=' if at_least else '<='} {bound:g}{unit} "
              f"({margin:.2f}x of the target); {len(values) - len(bad)}/{len(values)} met, "
              f"{len(values)}/{expected} points measured"
              + (f"; missed: {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''}" if bad else ""))
    return Target(name, ok, detail)


def launch_bound(case: TtsCase, copy_tbps: float) -> bool:
    """Whether moving ``case``'s bytes at the copy's bandwidth takes at most TTS_LAUNCH_BOUND_IDEAL_US."""
    return case.bytes_moved() / (copy_tbps * 1e12) * 1e6 <= TTS_LAUNCH_BOUND_IDEAL_US


def tts_targets(rows: list[dict], copy_tbps: Optional[float], cases=TTS_CASES) -> list[Target]:
    """Issue #4's targets over ``cases`` (the seed matrix)."""
    by_case = {cid: cr for (cid, _), cr in _ok_rows(rows, TTS).items()}
    cuda = {cid: cr["cuda"] for cid, cr in by_case.items() if "cuda" in cr}
    out = []
    wide = cuda.get(TTS_BANDWIDTH_CASE, {})
    out.append(_judge(f"#4 {TTS_BANDWIDTH_CASE} device time at >= {TTS_BANDWIDTH_FRAC:.0%} of the copy",
                      [(TTS_BANDWIDTH_CASE, wide["frac_copy"])] if wide.get("device_us") and "frac_copy" in wide
                      else [], 1, TTS_BANDWIDTH_FRAC, True, ""))
    bound_ids = [c.id for c in cases if copy_tbps and launch_bound(c, copy_tbps)]
    out.append(_judge(f"#4 launch-bound cases (<= {TTS_LAUNCH_BOUND_IDEAL_US:g} us at the copy's bandwidth) at "
                      f"<= {TTS_LAUNCH_BOUND_US:g} us device time",
                      [(cid, cuda[cid]["device_us"]) for cid in bound_ids if cuda.get(cid, {}).get("device_us")],
                      len(bound_ids) if copy_tbps else 1, TTS_LAUNCH_BOUND_US, False, " us"))
    for peer, factor in TTS_PER_CALL_OVER.items():
        ratios = [(c.id, by_case[c.id][peer]["per_call_us"] / by_case[c.id]["cuda"]["per_call_us"])
                  for c in cases if "cuda" in by_case.get(c.id, {}) and peer in by_case[c.id]]
        out.append(_judge(f"#4 per call >= {factor:g}x faster than {peer}, every case", ratios, len(cases), factor,
                          True, "x"))
    return out


def _fused_points(rows: list[dict], points: list[tuple[QuantCase, bool]], fused: str) -> list[tuple]:
    """``(case, label, fused row, speedup over unfused or None)`` for each point where ``fused`` has a device
    time, in the order of ``points``."""
    cases = _ok_rows(rows, QUANT)
    out = []
    for case, col in points:
        cr = cases.get((case.id, col), {})
        row, unfused = cr.get(fused, {}), cr.get("unfused", {})
        if row.get("device_us"):
            speedup = unfused["device_us"] / row["device_us"] if unfused.get("device_us") else None
            out.append((case, case.id + (" col" if col else ""), row, speedup))
    return out


def quant_targets(rows: list[dict], points: list[tuple[QuantCase, bool]]) -> list[Target]:
    """Issue #5's targets over ``points``: (case, column-major scale) pairs, what the bench was to measure."""
    big, small, everywhere = [], [], []
    for case, label, fused, speedup in _fused_points(rows, points, "cuda"):
        if case.num_tokens >= QUANT_BIG_S and "frac_copy" in fused:
            big.append((label, fused["frac_copy"]))
        if speedup is not None:
            everywhere.append((label, speedup))
            if case.num_tokens <= QUANT_SMALL_S:
                small.append((label, speedup))
    n_big = sum(c.num_tokens >= QUANT_BIG_S for c, _ in points)
    n_small = sum(c.num_tokens <= QUANT_SMALL_S for c, _ in points)
    return [_judge(f"#5 cuda at >= {QUANT_BIG_FRAC:.0%} of the copy for S >= {QUANT_BIG_S}", big, n_big,
                   QUANT_BIG_FRAC, True, ""),
            _judge(f"#5 cuda >= {QUANT_SMALL_SPEEDUP:g}x the unfused baseline for S <= {QUANT_SMALL_S}", small,
                   n_small, QUANT_SMALL_SPEEDUP, True, "x"),
            _judge("#5 cuda faster than the unfused baseline at every (S, group) point", everywhere, len(points),
                   1.0, True, "x")]


def quant_triton_vs_unfused(rows: list[dict], points: list[tuple[QuantCase, bool]]) -> Target:
    """Not an issue's target: the fused Triton kernel (the portable path, and the fallback where no compiled
    kernel serves) faster than the unfused baseline at every point, by device time."""
    values = [(label, speedup) for _, label, _, speedup in _fused_points(rows, points, "triton")
              if speedup is not None]
    return _judge("triton (no issue's target) faster than the unfused baseline at every (S, group) point", values,
                  len(points), 1.0, True, "x")


def quant_small_s_kernel_time(sweep_rows: list[dict], expected: int) -> Target:
    """Issue #5's S <= 32 target again, by the profiler's kernel time (the op-2 seed's method: each call's kernel
    durations summed, launch gaps not counted) from the op-2 script's sweep rows, ``expected`` of which have
    S <= QUANT_SMALL_S. The bench's verdict above is by CUDA-graph replay."""
    values = [(f"S{r['S']}-H{r['H']}-G{r['G']}", r["kernel_us_unfused"] / r["kernel_us_cpt0"]) for r in sweep_rows
              if r["S"] <= QUANT_SMALL_S and r.get("kernel_us_unfused") and r.get("kernel_us_cpt0")]
    return _judge(f"#5 cuda >= {QUANT_SMALL_SPEEDUP:g}x the unfused baseline for S <= {QUANT_SMALL_S}, by kernel "
                  "time (profiler; the seed's method)", values, expected, QUANT_SMALL_SPEEDUP, True, "x")


def markdown(targets: list[Target]) -> str:
    mark = {True: "met", False: "MISSED", None: "not measured"}
    return "| target | verdict | measured |\n|---|---|---|\n" + "".join(
        f"| {t.name} | {mark[t.ok]} | {t.detail} |\n" for t in targets)
