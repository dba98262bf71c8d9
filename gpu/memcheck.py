"""compute-sanitizer memcheck for the gpu/ check scripts: find the tool, re-run a script's correctness subset
under it, and read its verdict. Each script decides what the result means for its own report.

* ``find_sanitizer() -> str | None``: on PATH, under $CUDA_HOME, /usr/local/cuda or /usr/local/cuda-* (``bin/``
  or its own ``compute-sanitizer/`` folder), or /opt/nvidia/compute-sanitizer.
* ``run_memcheck(tool, argv, timeout, error_exitcode) -> dict``: ``tool --tool memcheck ... argv`` with
  ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (each tensor its own allocation, so an overrun is seen) and the repository
  on PYTHONPATH; returns ``returncode`` (``"timeout"`` when cut), ``errors`` (memcheck's ERROR SUMMARY count or
  None), ``reported`` (memory errors printed so far: what a cut run still tells) and ``text`` (its output).
  CUDA API calls that return an error are not reported (``--report-api-errors no``): torch and Triton make
  such calls on purpose (``cudaEventQuery`` answering "not ready"), and counting them would fail a clean run;
  a failed launch still raises in the checked script. A timeout kills the tool's whole process group, so its
  instrumented child does not run on beside the sections that follow.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
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


def run_memcheck(tool: str, argv: list[str], timeout: float, error_exitcode: int, print_limit: int = 30) -> dict:
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [tool, "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", str(error_exitcode),
           "--print-limit", str(print_limit), *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the tool and the python it instruments
        text, _ = proc.communicate()
        rc = "timeout"
    m = re.search(r"ERROR SUMMARY:\s*(\d+)\s+error", text)
    return {"returncode": rc, "errors": int(m.group(1)) if m else None,
            "reported": len(re.findall(r"^=+ (?:Invalid|Out-of-range|Misaligned|Malloc|Leaked|Address)", text, re.M)),
            "text": text, "command": " ".join(cmd)}
