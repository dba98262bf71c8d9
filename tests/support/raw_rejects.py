"""Bad inputs to a raw compiled op, each run in a child process: a case passes when it raises a RuntimeError
naming the op; one that returns silently, raises something else, or kills the process (what a TORCH_CHECK that
streamed an int64 did on an H200) fails, and the cases after a crash show as not reached.

* ``run_child(module, path)``: ``module.reject_cases()`` (a dict name -> call, ``module`` importable from
  ``path``) in a child process, each case between ``START name`` and ``END name <verdict>`` lines.
* ``reject_failure(child, name)``: "" when case ``name`` raised a RuntimeError naming the op, else what happened.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys, torch
from {module} import reject_cases
for name, call in reject_cases().items():
    print("START", name, flush=True)
    try:
        call()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        print("END", name, "no error raised", flush=True)
    except Exception as e:
        named = isinstance(e, RuntimeError) and "fusedrope_cuda" in str(e)
        first = (str(e).splitlines() or [""])[0]
        print("END", name, "raised" if named else "other", type(e).__name__, first, flush=True)
"""


def run_child(module: str, path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(path), str(ROOT / "tests"),
                                                       str(ROOT / "tests" / "support")]))
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD.format(module=module)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def reject_failure(child: subprocess.CompletedProcess, name: str) -> str:
    ends = {line.split()[1]: line for line in child.stdout.splitlines() if line.startswith("END ")}
    if name not in ends:
        how = "died on" if f"START {name}" in child.stdout else "never reached"
        return f"the child (rc {child.returncode}) {how} this case: {child.stderr[-2000:]}"
    return "" if ends[name].split()[2] == "raised" else ends[name]
