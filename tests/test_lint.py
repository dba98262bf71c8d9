"""The code base stays lint-clean (pyflakes errors, pycodestyle errors and warnings, 120 columns)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "E,F,W", "fusedrope", "tests", "bench",
                          "examples", "gpu"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
