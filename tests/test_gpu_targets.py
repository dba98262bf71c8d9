"""gpu/targets.py: the issues' speed targets judged from benchmark rows (synthetic rows here: what a GPU run
writes, through fusedrope.benchmark.case_fields)."""

import sys
from pathlib import Path

from fusedrope import benchmark as B
from fusedrope.testing import TTS_CASES, QuantCase

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))

import targets as T  # noqa: E402

COPY_TBPS = 4.0


def tts_row(case_id, contender, per_call_us, device_us=None):
    case = next(c for c in TTS_CASES if c.id == case_id)
    row = {"op": B.TTS, **B.case_fields(B.TTS, case), "contender": contender, "status": "ok",
           "per_call_us": per_call_us}
    if device_us:
        row.update(device_us=device_us, frac_copy=case.bytes_moved() / (device_us * 1e-6) / 1e12 / COPY_TBPS)
    return row


def quant_row(S, contender, device_us, q=128, col=False):
    case = QuantCase(S, 16, 2, quant_group_size=q)
    fields = B.case_fields(B.QUANT, case)
    return {"op": B.QUANT, **fields, "contender": contender, "status": "ok", "transpose_scale": col,
            "device_us": device_us, "frac_copy": fields["bytes_moved"] / (device_us * 1e-6) / 1e12 / COPY_TBPS}


def verdicts(targets):
    return {t.name.split(" ", 1)[1]: t.ok for t in targets}


def test_tts_targets_met_missed_and_unmeasured():
    wide = next(c for c in TTS_CASES if c.id == "wide_heads-B32").bytes_moved()
    at_80 = wide / (0.80 * COPY_TBPS * 1e12) * 1e6  # device us at 80% of the copy
    rows = [tts_row("wide_heads-B32", "cuda", 40.0, at_80), tts_row("wide_heads-B32", "compile", 200.0),
            tts_row("wide_heads-B32", "liger", 100.0),
            tts_row("qwen3_tts-B1", "cuda", 8.0, 2.5), tts_row("qwen3_tts-B1", "compile", 30.0),  # 3.75x: missed
            tts_row("qwen3_tts-B1", "liger", 20.0)]
    got = T.tts_targets(rows, COPY_TBPS)
    v = verdicts(got)
    assert v["wide_heads-B32 device time at >= 75% of the copy"] is True
    assert v["launch-bound cases (<= 1 us at the copy's bandwidth) at <= 3 us device time"] is True
    compile_t = next(t for t in got if "compile" in t.name)
    assert compile_t.ok is False and "worst qwen3_tts-B1: 3.75x" in compile_t.detail and "1/2 met" in compile_t.detail
    assert v["per call >= 2x faster than liger, every case"] is True
    # wide_heads-B32 is not launch-bound at 4 TB/s (its bytes take longer than 1 us); a slow small case misses
    rows[3] = tts_row("qwen3_tts-B1", "cuda", 8.0, 3.5)
    assert verdicts(T.tts_targets(rows, COPY_TBPS))[
        "launch-bound cases (<= 1 us at the copy's bandwidth) at <= 3 us device time"] is False
    # without the cuda rows nothing is measured, and nothing passes
    assert all(t.ok is None for t in T.tts_targets([r for r in rows if r["contender"] != "cuda"], COPY_TBPS))


def test_quant_targets_judge_every_point():
    big = QuantCase(8192, 16, 2).bytes_moved()
    at_85 = big / (0.85 * COPY_TBPS * 1e12) * 1e6
    rows = [quant_row(8192, "cuda", at_85), quant_row(8192, "unfused", 2 * at_85),
            quant_row(8, "cuda", 3.0), quant_row(8, "unfused", 6.0),
            quant_row(8192, "cuda", at_85, q=32), quant_row(8192, "unfused", 0.9 * at_85, q=32)]  # group 32 loses
    v = verdicts(T.quant_targets(rows))
    assert v["cuda at >= 80% of the copy for S >= 8192"] is True
    assert v["cuda >= 1.9x the unfused baseline for S <= 32"] is True
    assert v["cuda faster than the unfused baseline at every (S, group) point"] is False
    rows[3] = quant_row(8, "unfused", 5.0)  # 1.67x
    assert verdicts(T.quant_targets(rows))["cuda >= 1.9x the unfused baseline for S <= 32"] is False
    assert "| MISSED |" in T.markdown(T.quant_targets(rows))
