"""Compile once per content: what the ISA checks (tests/support/kernel_asm.py: nvcc, tests/support/hip_asm.py:
clang for AMD GPUs) and the host-emulation libraries (tests/inverse_rope_group_quant/irgq_harness.py,
tests/qwen3_tts_rope/test_qwen3_tts_rope_cuda.py) share.

* ``content_key(files, *parts) -> str``: a short hash of ``parts`` (compiler, flags, ...) and the names and
  bytes of ``files``.
* ``source_key(src, suffixes, *parts) -> str``: ``content_key`` over every file with one of ``suffixes``
  beside ``src`` and every file reached from ``src`` through ``#include "..."`` (``"../kernels_cuda/x.h"``
  included).
* ``build_once(argv, out, on_error, env=None) -> Path``: ``argv -o out`` unless ``out`` exists, written under
  a temporary name and renamed (parallel test processes never see half a file); ``on_error(stderr)`` must raise
  (``pytest.fail`` / ``pytest.skip``) when the compiler fails.
* ``compile_once(tool, flags, src, out, on_error, env=None) -> Path``: ``build_once`` of ``tool *flags src``
  (``tool`` a path or an argv prefix such as ``[zig, "clang"]``).
* ``torch_syntax_check(source, tmp_path, stubs, include_dirs=(), defines=())``: ``g++ -fsyntax-only`` of a torch
  binding against this torch's headers, in the C++ standard torch builds extensions with; ``stubs`` are stand-in
  headers ({path relative to an include dir: text}) for what a CPU torch wheel or a machine without ROCm lacks.
* ``host_cxx()``: the host C++ compiler the plain-C++ harnesses build with: ``$CXX``, else g++, c++, clang++.
* ``cuda_include_dir()``: the CUDA toolkit's headers (``$CUDA_HOME/include``, else /usr/local/cuda/include), or
  None.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path


# The emulated kernels' sanitizer builds: ASan, plus the alignment check, since a misaligned vector access faults
# on a GPU and so must abort here too.
ASAN_FLAGS = ["-fsanitize=address,alignment", "-fno-sanitize-recover=alignment", "-fno-omit-frame-pointer", "-g"]
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


def content_key(files, *parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
    for f in files:
        h.update(Path(f).name.encode())
        h.update(Path(f).read_bytes())
    return h.hexdigest()[:16]


def source_key(src: Path, suffixes: tuple[str, ...], *parts: str) -> str:
    src = Path(src).resolve()
    beside = sorted(f for f in src.parent.glob("*") if f.suffix in suffixes and f.is_file())
    included = sorted(quoted_includes(src) - set(beside))  # "../kernels_cuda/...h" and the like
    return content_key(beside + included, *parts, src.name)


def build_once(argv: list[str], out: Path, on_error: Callable[[str], None], env: dict[str, str] | None = None) -> Path:
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.tmp{out.suffix}")
    proc = subprocess.run([*argv, "-o", str(tmp)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        on_error(proc.stderr)
        raise AssertionError(f"{' '.join(argv)} failed:\n{proc.stderr[-4000:]}")  # on_error did not raise
    os.replace(tmp, out)
    return out


def compile_once(tool: str | list[str], flags: list[str], src: Path, out: Path, on_error: Callable[[str], None],
                 env: dict[str, str] | None = None) -> Path:
    argv = [tool] if isinstance(tool, str) else list(tool)
    return build_once([*argv, *flags, str(src)], out, on_error, env)


# Generated when torch is built with CUDA, absent from its CPU wheels; the CUDA bindings include it.
CUDA_CPU_WHEEL_STUBS = {"c10/cuda/impl/cuda_cmake_macros.h": "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"}


def host_cxx() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def cuda_include_dir() -> Path | None:
    inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    return inc if (inc / "cuda_runtime_api.h").is_file() else None


def torch_syntax_check(source: Path, tmp_path: Path, stubs: dict[str, str], include_dirs=(), defines=()) -> None:
    import pytest
    from torch.utils import cpp_extension

    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ to syntax-check the torch binding")
    for rel, text in stubs.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    std = "-std=c++20" if "c++20" in Path(cpp_extension.__file__).read_text() else "-std=c++17"  # as torch builds
    cmd = [gxx, std, "-fsyntax-only", "-w", *[f"-D{d}" for d in defines], f"-I{tmp_path}",
           *[f"-I{p}" for p in cpp_extension.include_paths()], *[f"-I{d}" for d in include_dirs], str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
