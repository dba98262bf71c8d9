"""gpu/memcheck.py (what both GPU check scripts run compute-sanitizer through), exercised on the CPU with a
stand-in ``compute-sanitizer`` that runs the command it is given and prints memcheck's summary line; and
gpu/run_all.sh's build fallback and arguments (``--smoke``), the latter with a stand-in python."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "gpu"))

import memcheck  # noqa: E402

FAKE = """#!/bin/sh
# compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode N --print-limit M cmd...
[ "$3 $4" = "--report-api-errors no" ] || { echo "API errors must not be reported: $*"; exit 3; }
shift 4; code=$2; shift 4
"$@"; rc=$?
echo "========= ERROR SUMMARY: ${FAKE_ERRORS:-0} errors"
[ "${FAKE_ERRORS:-0}" != 0 ] && exit "$code"
exit "$rc"
"""


@pytest.fixture
def fake_tool(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text(FAKE)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    return str(tool)


def test_finds_the_tool_on_path(fake_tool):
    assert memcheck.find_sanitizer() == fake_tool


def test_reads_exit_status_error_count_and_output(fake_tool, monkeypatch):
    probe = "import os; print(os.environ['PYTORCH_NO_CUDA_MEMORY_CACHING'])"
    r = memcheck.run_memcheck(fake_tool, [sys.executable, "-c", probe], 60, error_exitcode=9)
    assert r["returncode"] == 0 and r["errors"] == 0 and "1\n" in r["text"], r
    monkeypatch.setenv("FAKE_ERRORS", "3")
    r = memcheck.run_memcheck(fake_tool, [sys.executable, "-c", "pass"], 60, error_exitcode=9)
    assert r["returncode"] == 9 and r["errors"] == 3, r
    r = memcheck.run_memcheck(fake_tool, [sys.executable, "-c", "import time; time.sleep(30)"], 1, error_exitcode=9)
    assert r["returncode"] == "timeout" and r["errors"] is None and r["reported"] == 0, r


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _assert_gone(pid_file: Path, when: str) -> None:
    pid = int(pid_file.read_text())
    for _ in range(50):
        if not _running(pid):
            return
        time.sleep(0.1)
    pytest.fail(f"the instrumented child {pid} outlived {when}")


def _child(pid_file: Path, then: str) -> str:
    return (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
            f"print('========= Invalid __global__ write of size 2 bytes', flush=True); {then}")


def test_a_timeout_kills_the_instrumented_child_and_keeps_what_it_reported(fake_tool, tmp_path):
    """The tool's python child must not run on beside the sections that follow (it would skew their timings),
    and memory errors printed before the cut still count."""
    t = time.monotonic()
    r = memcheck.run_memcheck(fake_tool, [sys.executable, "-c", _child(tmp_path / "pid", "time.sleep(60)")], 2,
                              error_exitcode=9)
    assert r["returncode"] == "timeout" and r["reported"] == 1 and not memcheck.cut_clean(r), r
    assert time.monotonic() - t < 30
    _assert_gone(tmp_path / "pid", "the timeout")


def test_a_child_left_behind_neither_stalls_the_verdict_nor_runs_on(fake_tool, tmp_path):
    """The tool exits with its verdict while something it started still holds the output open."""
    leftover = ("import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', %r])\n"
                "while not os.path.getsize(%r) if os.path.exists(%r) else True: time.sleep(0.05)"
                % (_child(tmp_path / "pid", "time.sleep(60)"), *[str(tmp_path / "pid")] * 2))
    t = time.monotonic()
    r = memcheck.run_memcheck(fake_tool, [sys.executable, "-c", leftover], 30, error_exitcode=9)
    assert r["returncode"] == 0 and r["errors"] == 0 and time.monotonic() - t < 20, r
    _assert_gone(tmp_path / "pid", "the tool's exit")


def test_stopping_the_checking_script_stops_the_tool(fake_tool, tmp_path):
    """run_all.sh's `timeout` sends SIGTERM to the script's process group; the tool runs in a session of its own,
    so the script must take it down itself."""
    script = ("import sys; sys.path.insert(0, %r); import memcheck; "
              "memcheck.run_memcheck(%r, [sys.executable, '-c', %r], 60, 9)"
              % (str(ROOT / "gpu"), fake_tool, _child(tmp_path / "pid", "time.sleep(60)")))
    proc = subprocess.Popen([sys.executable, "-c", script])
    for _ in range(100):
        if (tmp_path / "pid").exists() and (tmp_path / "pid").read_text():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    _assert_gone(tmp_path / "pid", "the script's SIGTERM")


def test_memory_error_lines_are_counted_once_each():
    text = "\n".join(["========= COMPUTE-SANITIZER", "========= Invalid __global__ read of size 16 bytes",
                      "=========     at qwen3_tts_rope_kernel+0x1a0", "=========     Address 0x7f00 is out of bounds",
                      "========= Illegal instruction", "========= Out-of-range Shared or Local Address",
                      "========= Target application returned an error", "========= ERROR SUMMARY: 3 errors"])
    assert len(memcheck.ERROR_LINE.findall(text)) == 3


def test_op2_script_sanitize_section_plumbing(fake_tool):
    """The op-2 script's section with the stand-in: its --sanitize-subset child finds no GPU here and exits 2,
    which the section records (a real run needs returncode 0 and 0 errors)."""
    import check_inverse_rope_group_quant as script

    res = {}
    script.section_sanitize(res, 120)
    assert res["returncode"] == 2 and res["errors"] == 0 and "compute-sanitizer" in res["command"], res


def test_tts_bench_keeps_time_only_for_later_sections_that_will_run(monkeypatch):
    """The op-1 GPU script's bench leaves the later sections what they ask (need()), only for those that will
    run, and never takes its own share below BENCH_MIN_S: a slow build costs later sections before timings."""
    import argparse

    import check_qwen3_tts_rope as tts

    monkeypatch.setattr(tts, "find_sanitizer", lambda: "/usr/bin/compute-sanitizer")
    args = argparse.Namespace(budget_s=290.0, skip="", no_compile=False)
    assert tts.bench_reserve(args, now=60.0) == 25 + 60 + 30
    assert tts.bench_reserve(argparse.Namespace(budget_s=290.0, skip="sweep", no_compile=True), 60.0) == 60
    monkeypatch.setattr(tts, "find_sanitizer", lambda: None)
    assert tts.bench_reserve(args, now=60.0) == 25 + 30
    monkeypatch.setattr(tts, "find_sanitizer", lambda: "/usr/bin/compute-sanitizer")
    # 135 s budget after a 200 s build: 100 s left at the bench, which keeps 60 s for itself
    assert tts.bench_reserve(argparse.Namespace(budget_s=135.0, skip="", no_compile=False), 35.0) == 40
    assert tts.bench_reserve(argparse.Namespace(budget_s=135.0, skip="", no_compile=False), 130.0) == 0


def test_gpu_scripts_do_not_build_again_after_run_all_failed(monkeypatch):
    """gpu/run_all.sh sets FUSEDROPE_NO_BUILD=1 when its build failed: neither script compiles again (op 1 not
    even its qwen3-only fallback), so their budgets go to the Triton checks and timings."""
    import argparse

    import check_inverse_rope_group_quant as quant
    import check_qwen3_tts_rope as tts
    from torch.utils import cpp_extension

    from fusedrope import cuda_ext, jit_ext

    def refuse(*args, **kwargs):
        raise jit_ext.NoBuildAllowed("no cached CUDA build")

    monkeypatch.setenv(jit_ext.ENV_NO_BUILD, "1")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setattr(cuda_ext, "load", refuse)
    monkeypatch.setattr(cuda_ext, "build", lambda *a, **k: pytest.fail("built despite FUSEDROPE_NO_BUILD"))
    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("fallback built"))
    res = {}
    with pytest.raises(jit_ext.NoBuildAllowed):
        tts.build(res, argparse.Namespace(budget_s=290.0, skip="", no_compile=False))
    assert res["build"]["ok"] is False and "no cached CUDA build" in res["build"]["error"]
    with pytest.raises(jit_ext.NoBuildAllowed):
        quant.section_build({})


STUB_PYTHON = """#!/bin/sh
# stands in for python3 in gpu/run_all.sh: records each command line, succeeds
echo "$*" >> "$STUB_LOG"
"""


def _run_all(tmp_path, *args, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    """gpu/run_all.sh with a stand-in python that records what it was asked to run (no build, no GPU)."""
    tmp_path.mkdir(exist_ok=True)
    stub = tmp_path / "python"
    stub.write_text(STUB_PYTHON)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.txt"
    base = {k: v for k, v in os.environ.items() if k not in ("TOTAL_S", "QUANT_S", "TTS_ARGS", "QUANT_ARGS")}
    proc = subprocess.run(["bash", str(ROOT / "gpu" / "run_all.sh"), *args], capture_output=True, text=True,
                          timeout=60, env={**base, "PYTHON": str(stub), "STUB_LOG": str(log),
                                           "OUT": str(tmp_path / "out"), **env})
    return proc, log.read_text().splitlines() if log.exists() else []


def test_run_all_smoke_is_a_short_first_call(tmp_path):
    """``--smoke``: a 120 s total, op 1 benchmarks two cases without torch.compile, the sanitizer and the sweep,
    op 2 skips its sanitizer; both keep their correctness and graph checks. The full run passes none of that."""
    proc, calls = _run_all(tmp_path, "--smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "run_all.sh --smoke:" in proc.stdout and "TOTAL_S=120" in proc.stdout, proc.stdout
    tts = next(c for c in calls if "check_qwen3_tts_rope.py" in c)
    quant = next(c for c in calls if "check_inverse_rope_group_quant.py" in c)
    assert "--no-compile --cases qwen3_tts-B1,wide_heads-B32 --skip sanitize,sweep" in tts, tts
    assert "--skip-sanitize" in quant, quant
    assert any("cuda_ext.build" in c for c in calls), calls  # the build is part of what the smoke checks

    proc, calls = _run_all(tmp_path / "full")
    assert proc.returncode == 0 and "TOTAL_S=520" in proc.stdout, proc.stdout + proc.stderr
    tts = next(c for c in calls if "check_qwen3_tts_rope.py" in c)
    quant = next(c for c in calls if "check_inverse_rope_group_quant.py" in c)
    assert "--cases" not in tts and "--skip" not in tts and "--skip" not in quant, calls

    # knobs set in the environment win over the smoke's defaults
    proc, calls = _run_all(tmp_path / "knobs", "--smoke", TOTAL_S="200", TTS_ARGS="--no-liger")
    assert proc.returncode == 0 and "TOTAL_S=200" in proc.stdout, proc.stdout + proc.stderr
    assert next(c for c in calls if "check_qwen3_tts_rope.py" in c).endswith("--no-liger"), calls


def test_run_all_refuses_an_unknown_argument(tmp_path):
    proc, calls = _run_all(tmp_path, "--smoek")
    assert proc.returncode == 2 and "unknown argument '--smoek'" in proc.stderr, proc.stderr
    assert calls == [] and not (tmp_path / "out").exists()
