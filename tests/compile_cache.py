"""Compile a kernel source once per content: what tests/kernel_asm.py (nvcc) and tests/hip_asm.py (clang for
AMD GPUs) share.

* ``source_key(src, suffixes, *parts) -> str``: a short hash of ``parts`` (compiler, its version, flags),
  every file with one of ``suffixes`` beside ``src``, every file reached from ``src`` through
  ``#include "..."`` (``"../kernels_cuda/x.h"`` included) and ``src``'s name.
* ``compile_once(tool, flags, src, out, on_error, env=None) -> Path``: ``tool *flags src -o out`` (``tool`` a
  path or an argv prefix such as ``[zig, "clang"]``) unless ``out`` exists,
  written under a temporary name and renamed (parallel test processes never see half a file);
  ``on_error(stderr)`` must raise (``pytest.fail`` / ``pytest.skip``) when the compiler fails.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path


# Versioned Debian/Ubuntu clang names first (the ones CI installs), then the unversioned one.
CLANG_NAMES = ("clang++-19", "clang++-20", "clang++-21", "clang++-18", "clang++")


def quoted_includes(src: Path) -> set[Path]:
    """Every file reached through ``#include "..."`` from ``src`` (resolved beside the including file)."""
    seen: set[Path] = set()
    todo = [Path(src).resolve()]
    while todo:
        f = todo.pop()
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read_text(), re.M):
            inc = (f.parent / name).resolve()
            if inc.is_file() and inc not in seen:
                seen.add(inc)
                todo.append(inc)
    return seen


def source_key(src: Path, suffixes: tuple[str, ...], *parts: str) -> str:
    src = Path(src).resolve()
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
    beside = sorted(f for f in src.parent.glob("*") if f.suffix in suffixes and f.is_file())
    for f in beside:  # the source and every header it may include
        h.update(f.name.encode())
        h.update(f.read_bytes())
    for f in sorted(quoted_includes(src) - set(beside)):  # "../kernels_cuda/...h" and the like
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(src.name.encode())
    return h.hexdigest()[:16]


def compile_once(tool: str | list[str], flags: list[str], src: Path, out: Path, on_error: Callable[[str], None],
                 env: dict[str, str] | None = None) -> Path:
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.tmp{out.suffix}")
    argv = [tool] if isinstance(tool, str) else list(tool)
    proc = subprocess.run([*argv, *flags, str(src), "-o", str(tmp)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        on_error(proc.stderr)
        raise AssertionError(f"{tool} failed for {src}:\n{proc.stderr[-4000:]}")  # on_error did not raise
    os.replace(tmp, out)
    return out
