"""CPU-side checks of HIP kernels: compile a framework-free ``.hip`` source for an AMD GPU with clang (device
only, no ROCm needed) and read its ISA and code-object metadata. No GPU needed.

* ``find_hip_clang() -> str | None``: ``$HIP_CLANG``, then ``clang++-19``/``-20``/``-21``/``-18``,
  ``/opt/rocm/llvm/bin/clang++``, ``clang++``; the first that lists the ``amdgcn`` target.
* ``arch_supported(arch) -> (bool, reason)``: can that clang compile for ``arch`` (e.g. clang-19 and gfx950:
  no)?
* ``hip_asm(src, arch) -> str``: the assembly (``-S``) of ``clang++ -x hip --offload-arch=ARCH
  --cuda-device-only -nogpulib -nogpuinc -O3``, cached by content; ``kernel_asm(text) -> {kernel symbol: its
  instructions}``; ``mnemonics(kernel_text) -> [str]``.
* ``hip_code_object(src, arch) -> Path``: the same compile to a code object (needs ``ld.lld``);
  ``kernel_notes(code_object) -> {kernel name: {metadata key: value}}`` from ``llvm-readelf --notes``
  (``.vgpr_count``, ``.sgpr_count``, ``.private_segment_fixed_size`` = scratch bytes per lane, spills, ...);
  ``asm_metadata(text)`` reads the same ``amdhsa.kernels`` block out of the assembly.

Debian/Ubuntu: ``apt-get install -y --no-install-recommends clang-19 lld-19`` (llvm-readelf of any LLVM
version reads the notes; without one the tests fall back to the assembly's identical metadata block).
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from compile_cache import compile_once, source_key

DEVICE_FLAGS = ("-x", "hip", "--cuda-device-only", "-nogpulib", "-nogpuinc", "-O3", "-std=c++17")
CACHE_DIR = Path(tempfile.gettempdir()) / f"fusedrope-hip-cache-{os.getuid()}"


@functools.lru_cache(maxsize=None)
def find_hip_clang() -> str | None:
    cands = [os.environ.get("HIP_CLANG"), "clang++-19", "clang++-20", "clang++-21", "clang++-18",
             "/opt/rocm/llvm/bin/clang++", "clang++"]
    for cand in cands:
        path = shutil.which(cand) if cand else None
        if not path:
            continue
        try:
            out = subprocess.run([path, "--print-targets"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "amdgcn" in out:
            return path
    return None


def _require_clang() -> str:
    clang = find_hip_clang()
    if clang is None:
        pytest.skip("no clang with the amdgcn target (apt-get install -y --no-install-recommends clang-19 "
                    "lld-19, or set HIP_CLANG): cannot compile HIP here")
    return clang


@functools.lru_cache(maxsize=None)
def arch_supported(arch: str) -> tuple[bool, str]:
    """Whether the found clang compiles device code for ``arch``; the reason when not."""
    clang = find_hip_clang()
    if clang is None:
        return False, "no clang with the amdgcn target"
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "probe.hip"
        src.write_text('extern "C" __attribute__((global)) void probe(int* p) { *p = 1; }\n')
        proc = subprocess.run([clang, *DEVICE_FLAGS, f"--offload-arch={arch}", "-S", str(src), "-o",
                               str(Path(d) / "probe.s")], capture_output=True, text=True)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["failed"])[0]
        return False, f"{Path(clang).name} cannot compile for {arch}: {msg}"
    return True, ""


def _cache_key(clang: str, src: Path, flags: list[str]) -> str:
    version = subprocess.run([clang, "--version"], capture_output=True, text=True).stdout
    return source_key(src, (".hip", ".h", ".hpp", ".cuh"), clang, version, " ".join(flags))


def _compile(src, arch: str, kind: str, extra_flags=()) -> Path:
    clang = _require_clang()
    ok, why = arch_supported(arch)
    if not ok:
        pytest.skip(why)
    src = Path(src).resolve()
    if kind == "asm":
        flags = [*DEVICE_FLAGS, f"--offload-arch={arch}", *extra_flags, "-S"]
        suffix = ".s"
    else:
        flags = [*DEVICE_FLAGS, f"--offload-arch={arch}", *extra_flags, "--no-gpu-bundle-output"]
        suffix = ".hsaco"
    out = CACHE_DIR / f"{src.stem}-{arch}-{_cache_key(clang, src, flags)}{suffix}"

    def on_error(stderr: str) -> None:
        if kind == "obj" and "ld.lld" in stderr:
            pytest.skip(f"no ld.lld for the code object (apt-get install lld-19): {stderr.strip()[:300]}")
        pytest.fail(f"clang failed for {src.name} ({arch}):\n{' '.join([clang, *flags])}\n{stderr[-4000:]}")

    return compile_once(clang, flags, src, out, on_error)


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
