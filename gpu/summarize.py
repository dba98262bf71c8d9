#!/usr/bin/env python3
"""The short combined table that gpu/run_all.sh prints last: build and script exit codes, each script's checks
and sections, the files under $OUT (8 come back at most), both ops' seed tables (fusedrope.benchmark's), then
the issues' speed targets judged from the same rows (gpu/targets.py).

    python3 gpu/summarize.py $OUT --build-rc 0 --tts-rc 0 --quant-rc 0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fusedrope import benchmark as B  # noqa: E402
from fusedrope.benchmark import report  # noqa: E402
import targets  # noqa: E402  (gpu/targets.py, beside this script)
from check_inverse_rope_group_quant import HEAD_GROUPS, SWEEP_S, bench_configs  # noqa: E402  (the op-2 plan)
from fusedrope.testing import QuantCase  # noqa: E402

MAX_FILES = 8  # what the device tool brings back from $OUT


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except Exception as e:  # noqa: BLE001 - a script killed early may have left nothing
        return {"_missing": f"{path}: {type(e).__name__}: {e}"}


def rows_line(rows: list) -> str:
    failed = B.failed_rows(rows)
    ok = [r for r in rows if r.get("status") == "ok" and r not in failed]
    skipped = len(rows) - len(ok) - len(failed)
    return (f"{len(ok)}/{len(rows)} bench rows ok" + (f", {skipped} skipped" if skipped else "")
            + (f" (FAILED: {', '.join(r['case'] + '/' + r['contender'] for r in failed[:4])})" if failed else ""))


def tts_line(res: dict) -> str:
    if "_missing" in res:
        return res["_missing"]
    checks = res.get("checks", [])
    bad = [c["section"] + "/" + c["name"] for c in checks if not c["ok"]]
    not_ok = [f"{n} ({s['status'][:60]})" for n, s in res.get("sections", {}).items() if s["status"] != "ok"]
    rows = res.get("rows", [])
    return (f"{len(checks) - len(bad)}/{len(checks)} checks ok" + (f", FAILED {bad[:4]}" if bad else "")
            + f"; {rows_line(rows)}; sections not ok: {', '.join(not_ok) or 'none'}")


def quant_line(res: dict) -> str:
    if "_missing" in res:
        return res["_missing"]
    secs = res.get("sections", {})
    rows = secs.get("bench", {}).get("rows", [])
    return ", ".join(_section_word(n, s) for n, s in secs.items()) + f"; {rows_line(rows)}"


def _section_word(name: str, sec: dict) -> str:
    """``name ok`` / ``name NOT OK``, with what was skipped or cut (a missing tool, a cut memcheck, bench points
    the budget left out), so a skip never reads as a plain ok."""
    skipped = sec.get("skipped")
    if isinstance(skipped, list):
        skipped = f"{len(skipped)} points cut by the time budget" if skipped else None
    word = "ok" if sec.get("ok") else "NOT OK"
    return f"{name} {word}" + (f" (skipped: {str(skipped)[:70]})" if skipped else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    for name in ("build", "tts", "quant"):
        ap.add_argument(f"--{name}-rc", default="?")
    args = ap.parse_args(argv)
    tts, quant = _load(args.out / "tts" / "results.json"), _load(args.out / "quant" / "results.json")
    meta = tts.get("meta") or quant.get("meta") or {}
    copy = tts.get("copy", {}).get("tbps") or quant.get("sections", {}).get("bench", {}).get("copy", {}).get("tbps")
    files = sorted(p.relative_to(args.out).as_posix() for p in args.out.rglob("*") if p.is_file())
    print(f"\n== gpu/run_all.sh: {meta.get('gpu') or B.CPU_LABEL} | commit {str(meta.get('git_commit'))[:12]}"
          f"{' (dirty)' if meta.get('git_dirty') else ''} | copy roofline "
          + (f"{copy:.2f} TB/s" if copy else "-"))
    print(f"build           exit {args.build_rc}")
    print(f"qwen3_tts_rope  exit {args.tts_rc}: {tts_line(tts)}")
    print(f"inverse_rope_q  exit {args.quant_rc}: {quant_line(quant)}")
    warn = "" if len(files) <= MAX_FILES else f"  MORE THAN {MAX_FILES}: some will not come back"
    print(f"files under $OUT: {len(files)} ({', '.join(files)}){warn}")
    gpu, tts_rows = bool(meta.get("gpu")), tts.get("rows", [])
    fused = [r for r in tts_rows if r.get("contender") == report.tts_fused_name(tts_rows)]
    print(f"\n## qwen3_tts_rope (per call us, host overhead included; TB/s from {report.time_basis(fused, gpu)})\n")
    print(report.tts_seed_table(tts_rows))
    quant_rows = quant.get("sections", {}).get("bench", {}).get("rows", [])
    print(f"## inverse_rope_group_quant, row-major scale (times: {report.time_basis(quant_rows, gpu)})\n")
    print(report.quant_seed_tables([r for r in quant_rows if not r.get("transpose_scale")]))
    print("## the speed targets of issues #4 and #5\n")
    points = [(QuantCase(S, H, G, quant_group_size=q), col) for _, _, H, G, S, q, col in bench_configs()]
    sweep_rows = quant.get("sections", {}).get("sweep", {}).get("rows", [])
    n_small = sum(S <= targets.QUANT_SMALL_S for S in SWEEP_S) * len(HEAD_GROUPS)
    print(targets.markdown(targets.tts_targets(tts.get("rows", []), tts.get("copy", {}).get("tbps"))
                           + targets.quant_targets(quant_rows, points)
                           + [targets.quant_small_s_kernel_time(sweep_rows, n_small),
                              targets.quant_triton_vs_unfused(quant_rows, points)]))
    return 0 if len(files) <= MAX_FILES else 1


if __name__ == "__main__":
    sys.exit(main())
