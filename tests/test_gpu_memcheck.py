"""gpu/memcheck.py (what both GPU check scripts run compute-sanitizer through), exercised on the CPU with a
stand-in ``compute-sanitizer`` that runs the command it is given and prints memcheck's summary line."""

import os
import stat
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


def test_a_timeout_kills_the_instrumented_child_and_keeps_what_it_reported(fake_tool, tmp_path):
    """The tool's python child must not run on beside the sections that follow (it would skew their timings),
    and memory errors printed before the cut still count."""
    pid_file = tmp_path / "child.pid"
    child = ("import os, time; open(%r, 'w').write(str(os.getpid())); "
             "print('========= Invalid __global__ write of size 2 bytes', flush=True); time.sleep(60)") % str(pid_file)
    t = time.monotonic()
    r = memcheck.run_memcheck(fake_tool, [sys.executable, "-c", child], 2, error_exitcode=9)
    assert r["returncode"] == "timeout" and r["reported"] == 1 and time.monotonic() - t < 30, r
    pid = int(pid_file.read_text())
    for _ in range(50):  # reaped by init shortly after the kill
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the instrumented child {pid} outlived the timeout")


def test_op2_script_sanitize_section_plumbing(fake_tool):
    """The op-2 script's section with the stand-in: its --sanitize-subset child finds no GPU here and exits 2,
    which the section records (a real run needs returncode 0 and 0 errors)."""
    import check_inverse_rope_group_quant as script

    res = {}
    script.section_sanitize(res, 120)
    assert res["returncode"] == 2 and res["errors"] == 0 and "compute-sanitizer" in res["command"], res
