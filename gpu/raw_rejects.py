"""Bad inputs to a raw compiled op (``torch.ops.fusedrope_cuda.*``), checked in a child process.

Each bad input must raise a RuntimeError whose message names the op's namespace. The child prints a START line
before each case and an END line after it, so a case that kills the process (the H200 run at 63f6bd6: a
TORCH_CHECK message with an integer segfaulted) is one failed check naming that case, and the calling script
goes on. Both GPU scripts use it: ``--raw-rejects`` runs :func:`child` there, :func:`checks` starts it.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Callable


def child(cases: dict[str, Callable[[], None]], namespace: str = "fusedrope_cuda") -> int:
    """Run each case (a call that must raise); print ``START name`` and ``END name <1|0> <message>``."""
    import torch

    for name, call in cases.items():
        print(f"START {name}", flush=True)
        try:
            call()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            print(f"END {name} 0 no error raised", flush=True)
        except RuntimeError as e:
            first = (str(e).splitlines() or [""])[0]
            print(f"END {name} {int(namespace in str(e))} {first}", flush=True)
    return 0


def parse(names, stdout: str, rc, stderr: str = "") -> list[tuple[str, bool, str]]:
    """(name, ok, detail) per case from the child's output; a case without its END line failed."""
    ended = {}
    for line in stdout.splitlines():
        if line.startswith("END "):
            _, name, ok, msg = (line.split(" ", 3) + [""])[:4]
            ended[name] = (ok == "1", msg)
    out = []
    for name in names:
        if name in ended:
            out.append((name, *ended[name]))
        else:
            how = f"the process died (rc {rc}) on this case" if f"START {name}" in stdout else f"not reached (rc {rc})"
            out.append((name, False, f"{how}; stderr tail: {stderr[-1500:]}"))
    return out


def checks(script: str, names, timeout: float = 180.0) -> list[tuple[str, bool, str]]:
    """Run ``python -X faulthandler <script> --raw-rejects`` and parse its lines."""
    cmd = [sys.executable, "-X", "faulthandler", script, "--raw-rejects"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return parse(names, p.stdout, p.returncode, p.stderr)
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return parse(names, text, "timeout")
