"""compute-sanitizer memcheck for the gpu/ check scripts: find the tool, re-run a script's correctness subset
under it, and read its verdict. Each script decides what the result means for its own report.

* ``find_sanitizer() -> str | None``: on PATH, under $CUDA_HOME, /usr/local/cuda or /usr/local/cuda-* (``bin/``
  or its own ``compute-sanitizer/`` folder), or /opt/nvidia/compute-sanitizer.
* ``run_memcheck(tool, argv, timeout, error_exitcode) -> dict``: ``tool --tool memcheck ... argv`` with
  ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (each tensor its own allocation, so an overrun is seen) and the repository
  on PYTHONPATH; returns ``returncode`` (``"timeout"`` when cut), ``errors`` (memcheck's ERROR SUMMARY count or
  None), ``reported`` (memory errors printed so far: what a cut run still tells) and ``text`` (its output).
  CUDA API calls that return an error are not reported (``--report-api-errors no``): libraries probe the driver
  with calls that may fail on purpose (``cuGetProcAddress`` for entry points it lacks, say), and counting those
  would fail a clean run; the checked script still raises on a failed launch (the launchers check it).
  The tool runs in a session of its own, whose whole process group is killed when it returns, is cut, or the
  checking script is stopped (SIGTERM, as run_all.sh's ``timeout`` sends): its instrumented child never runs
  on beside the sections that follow. Output goes to a file, so a child holding it open cannot stall the wait.
* ``cut_clean(result) -> bool``: cut by its time limit with no memory error printed before: no verdict,
  recorded as ``cut_reason(seconds)`` (``CUT ...``) by both scripts.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def find_sanitizer() -> str | None:
    cands = [shutil.which("compute-sanitizer")]
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))):
        if home:
            cands += [os.path.join(home, "bin", "compute-sanitizer"),
                      os.path.join(home, "compute-sanitizer", "compute-sanitizer")]
    cands.append("/opt/nvidia/compute-sanitizer/compute-sanitizer")
    return next((c for c in cands if c and os.path.isfile(c)), None)


# memcheck's error headers ("========= Invalid __global__ write of size 2 bytes", "========= Out-of-range Shared or
# Local Address", "========= Illegal instruction", ...); detail lines are indented, the summary is not an error.
ERROR_LINE = re.compile(r"^=+ (?:Invalid|Out-of-range|Misaligned|Malloc|Leaked|Illegal|Hardware|Warp)", re.M | re.I)


def _stop(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through run_memcheck's finally, which kills the tool's group


def run_memcheck(tool: str, argv: list[str], timeout: float, error_exitcode: int, print_limit: int = 30) -> dict:
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [tool, "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", str(error_exitcode),
           "--print-limit", str(print_limit), *argv]
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _stop) if main else None
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the tool and all it started, whatever happened
            except ProcessLookupError:
                pass
            proc.wait()
            if main:
                signal.signal(signal.SIGTERM, old)
        log.seek(0)
        text = log.read().decode(errors="replace")
    m = re.search(r"ERROR SUMMARY:\s*(\d+)\s+error", text)
    return {"returncode": rc, "errors": int(m.group(1)) if m else None, "reported": len(ERROR_LINE.findall(text)),
            "text": text, "command": " ".join(cmd)}


CUT = "memcheck cut"  # how a cut run with no verdict is named in both scripts' results


def cut_reason(seconds: float) -> str:
    return f"{CUT} at {seconds:.0f} s with no memory error reported before"


def cut_clean(result: dict) -> bool:
    """Cut by its time limit with no memory error printed before it: no verdict (neither passed nor failed)."""
    return result["returncode"] == "timeout" and not result["reported"]
