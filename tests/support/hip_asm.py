"""CPU-side checks of HIP kernels: compile a framework-free ``.hip`` source for an AMD GPU with clang (device
only, no ROCm needed) and read its ISA and code-object metadata. No GPU needed.

* ``hip_clang(arch) -> (argv, reason)``: the first clang that compiles device code for ``arch``, tried in the
  order ``$HIP_CLANG``, ``clang++-19``/``-20``/``-21``/``-18``, ``/opt/rocm/llvm/bin/clang++``, ``clang++``, then
  the clang that the ``ziglang`` wheel bundles (``zig clang``, LLVM 20+, which knows gfx950 where clang-19 does
  not); ``argv`` is None with the reason when none can.
* ``hip_asm(src, arch) -> str``: the assembly (``-S``) of ``clang++ -x hip --offload-arch=ARCH
  --cuda-device-only -nogpulib -nogpuinc -O3``, cached by content; ``kernel_asm(text) -> {kernel symbol: its
  instructions}``; ``mnemonics(kernel_text) -> [str]``.
* ``hip_code_object(src, arch) -> Path``: the same compile to a code object (needs ``ld.lld``);
  ``kernel_notes(code_object) -> {kernel name: {metadata key: value}}`` from ``llvm-readelf --notes``
  (``.vgpr_count``, ``.sgpr_count``, ``.private_segment_fixed_size`` = scratch bytes per lane, spills, ...);
  ``asm_metadata(text)`` reads the same ``amdhsa.kernels`` block out of the assembly.

Debian/Ubuntu: ``apt-get install -y --no-install-recommends clang-19 lld-19`` (llvm-readelf of any LLVM
version reads the notes; without one the tests fall back to the assembly's identical metadata block). For gfx950:
``pip install ziglang`` (in the ``test`` extra); its clang links code objects with zig's own lld, through a
two-line ``lld`` shim this module writes into its cache (the clang driver looks for ``lld`` on PATH).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from compile_cache import CLANG_NAMES, compile_once, source_key

DEVICE_FLAGS = ("-x", "hip", "--cuda-device-only", "-nogpulib", "-nogpuinc", "-O3", "-std=c++17")
CACHE_DIR = Path(tempfile.gettempdir()) / f"fusedrope-hip-cache-{os.getuid()}"


def _candidates() -> list[tuple[str, ...]]:
    cands = []
    for name in (os.environ.get("HIP_CLANG"), *CLANG_NAMES[:-1], "/opt/rocm/llvm/bin/clang++", CLANG_NAMES[-1]):
        path = shutil.which(name) if name else None
        if path:
            cands.append((path,))
    spec = importlib.util.find_spec("ziglang")
    if spec is not None and spec.origin:
        zig = Path(spec.origin).parent / "zig"
        if zig.is_file():
            cands.append((str(zig), "clang"))
    return cands


def _zig_env(argv: tuple[str, ...]) -> dict[str, str] | None:
    """For ``zig clang``: PATH led by a folder whose ``lld`` runs this zig's ``ld.lld`` (the AMDGPU link step).
    The folder is named by a hash of the zig path, and the script rewritten when it differs, so another
    environment's zig is never used."""
    if argv[1:] != ("clang",):
        return None
    text = f'#!/bin/sh\n[ "$1" = -flavor ] && shift 2\nexec "{argv[0]}" ld.lld "$@"\n'
    shim = CACHE_DIR / f"zig-lld-{hashlib.sha256(argv[0].encode()).hexdigest()[:12]}" / "lld"
    if not shim.exists() or shim.read_text() != text:
        shim.parent.mkdir(parents=True, exist_ok=True)
        tmp = shim.with_name(f"lld.{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, shim)
    return {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@functools.lru_cache(maxsize=None)
def hip_clang(arch: str) -> tuple[tuple[str, ...] | None, str]:
    """The first clang that compiles device code for ``arch``, or None and why none does."""
    reasons = []
    for argv in _candidates():
        name = " ".join(Path(a).name for a in argv)
        try:
            targets = subprocess.run([*argv, "--print-targets"], capture_output=True, text=True,
                                     timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            reasons.append(f"{name}: {e}")
            continue
        if "amdgcn" not in targets:
            reasons.append(f"{name}: no amdgcn target")
            continue
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "probe.hip"
            src.write_text('extern "C" __attribute__((global)) void probe(int* p) { *p = 1; }\n')
            proc = subprocess.run([*argv, *DEVICE_FLAGS, f"--offload-arch={arch}", "-S", str(src), "-o",
                                   str(Path(d) / "probe.s")], capture_output=True, text=True)
        if proc.returncode == 0:
            return argv, ""
        reasons.append(f"{name} cannot compile for {arch}: {(proc.stderr.strip().splitlines() or ['failed'])[0]}")
    if not reasons:
        return None, ("no clang with the amdgcn target (apt-get install -y --no-install-recommends clang-19 "
                      "lld-19, pip install ziglang, or set HIP_CLANG): cannot compile HIP here")
    return None, "; ".join(reasons)


def _cache_key(argv: tuple[str, ...], src: Path, flags: list[str]) -> str:
    version = subprocess.run([*argv, "--version"], capture_output=True, text=True).stdout
    return source_key(src, (".hip", ".h", ".hpp", ".cuh"), " ".join(argv), version, " ".join(flags))


def _compile(src, arch: str, kind: str, extra_flags=()) -> Path:
    argv, why = hip_clang(arch)
    if argv is None:
        pytest.skip(why)
    src = Path(src).resolve()
    if kind == "asm":
        flags = [*DEVICE_FLAGS, f"--offload-arch={arch}", *extra_flags, "-S"]
        suffix = ".s"
    else:
        flags = [*DEVICE_FLAGS, f"--offload-arch={arch}", *extra_flags, "--no-gpu-bundle-output"]
        suffix = ".hsaco"
    out = CACHE_DIR / f"{src.stem}-{arch}-{_cache_key(argv, src, flags)}{suffix}"

    def on_error(stderr: str) -> None:
        missing = ("unable to execute", "not found", "No such file")
        if kind == "obj" and "lld" in stderr and any(m in stderr for m in missing):
            pytest.skip(f"no ld.lld for the code object (apt-get install lld-19): {stderr.strip()[:300]}")
        pytest.fail(f"clang failed for {src.name} ({arch}):\n{' '.join([*argv, *flags])}\n{stderr[-4000:]}")

    return compile_once(list(argv), flags, src, out, on_error, env=_zig_env(argv))


def compiler_name(arch: str) -> str:
    """What compiles ``arch`` here, for the tests' printed lines."""
    argv, why = hip_clang(arch)
    return " ".join(Path(a).name for a in argv) if argv else f"none ({why})"


def hip_asm(src, arch: str, extra_flags=()) -> str:
    return _compile(src, arch, "asm", extra_flags).read_text()


def hip_code_object(src, arch: str, extra_flags=()) -> Path:
    return _compile(src, arch, "obj", extra_flags)


def kernel_asm(text: str) -> dict[str, str]:
    """``{kernel symbol: its instruction text}`` for every ``.amdhsa_kernel`` in the assembly."""
    names = re.findall(r"^\s*\.amdhsa_kernel\s+(\S+)", text, re.M)
    out = {}
    for name in names:
        m = re.search(rf"^{re.escape(name)}:.*?$(.*?)^\s*s_endpgm", text, re.M | re.S)
        out[name] = m.group(1) if m else ""
    return out


def mnemonics(kernel_text: str) -> list[str]:
    """Instruction mnemonics of one kernel (labels, directives and comments dropped)."""
    ops = []
    for line in kernel_text.splitlines():
        line = line.split(";")[0].strip()
        if not line or line.startswith(".") or line.endswith(":"):
            continue
        ops.append(line.split()[0])
    return ops


def _parse_kernels_yaml(text: str) -> dict[str, dict[str, str]]:
    """The top-level scalar keys of each ``amdhsa.kernels`` entry (no YAML library needed)."""
    block = text.split("amdhsa.kernels:", 1)
    if len(block) < 2:
        return {}
    lines = block[1].splitlines()
    items = [(len(m.group(1)), i) for i, line in enumerate(lines) if (m := re.match(r"^(\s*)- \.\w+:", line))]
    if not items:
        return {}
    indent = min(i for i, _ in items)
    starts = [i for ind, i in items if ind == indent] + [len(lines)]
    out = {}
    for a, b in zip(starts, starts[1:]):
        entry = {}
        for line in lines[a:b]:
            m = re.match(rf"^\s{{{indent}}}(?:- |  )\.(\w+):\s+(\S.*)$", line)
            if m:
                entry[m.group(1)] = m.group(2).strip().strip("'\"")
        if "name" in entry:
            out[entry["name"]] = entry
    return out


def asm_metadata(text: str) -> dict[str, dict[str, str]]:
    m = re.search(r"\.amdgpu_metadata(.*?)\.end_amdgpu_metadata", text, re.S)
    return _parse_kernels_yaml(m.group(1)) if m else {}


def find_readelf() -> str | None:
    cands = [os.environ.get("LLVM_READELF"), "llvm-readelf-19", "llvm-readelf-20", "llvm-readelf",
             "/opt/rocm/llvm/bin/llvm-readelf"]
    cands += sorted(glob.glob("/usr/bin/llvm-readelf-*"), reverse=True)
    for cand in cands:
        path = shutil.which(cand) if cand else None
        if path:
            return path
    return None


def kernel_notes(code_object) -> dict[str, dict[str, str]]:
    """``{kernel name: metadata}`` from the code object's NT_AMDGPU_METADATA note (``llvm-readelf
    --notes``)."""
    tool = find_readelf()
    if tool is None:
        pytest.skip("no llvm-readelf to read the code object's notes")
    proc = subprocess.run([tool, "--notes", str(code_object)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"{tool} --notes failed:\n{proc.stderr[-2000:]}")
    return _parse_kernels_yaml(proc.stdout)
