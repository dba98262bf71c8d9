"""compute-sanitizer memcheck for the gpu/ check scripts: find the tool, re-run a script's correctness subset
under it, and read its verdict. Each script decides what the result means for its own report.

* ``find_sanitizer() -> str | None``: on PATH, under $CUDA_HOME or /usr/local/cuda (``bin/`` or its own
  ``compute-sanitizer/`` folder), or /opt/nvidia/compute-sanitizer.
* ``run_memcheck(tool, argv, timeout, error_exitcode) -> dict``: ``tool --tool memcheck ... argv`` with
  ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (each tensor its own allocation, so an overrun is seen) and the repository
  on PYTHONPATH; returns ``returncode`` (``"timeout"`` when cut), ``errors`` (memcheck's ERROR SUMMARY count or
  None) and ``text`` (its output).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def find_sanitizer() -> str | None:
    cands = [shutil.which("compute-sanitizer")]
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            cands += [os.path.join(home, "bin", "compute-sanitizer"),
                      os.path.join(home, "compute-sanitizer", "compute-sanitizer")]
    cands.append("/opt/nvidia/compute-sanitizer/compute-sanitizer")
    return next((c for c in cands if c and os.path.isfile(c)), None)


def run_memcheck(tool: str, argv: list[str], timeout: float, error_exitcode: int, print_limit: int = 30) -> dict:
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [tool, "--tool", "memcheck", "--error-exitcode", str(error_exitcode), "--print-limit", str(print_limit),
           *argv]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        text = "\n".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                         for x in (e.stdout, e.stderr))
        rc = "timeout"
    m = re.search(r"ERROR SUMMARY:\s*(\d+)\s+error", text)
    return {"returncode": rc, "errors": int(m.group(1)) if m else None, "text": text, "command": " ".join(cmd)}
