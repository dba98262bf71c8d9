"""CPU-side checks of compiled CUDA: compile a framework-free ``.cu`` to a cubin with nvcc and read its SASS and
resource usage with ``cuobjdump`` (no GPU needed).

* ``nvcc_cubin(src_path, arch) -> Path``: ``nvcc -cubin -arch=sm_XX -O3 -std=c++17`` with the macros torch's
  extension build passes (so the kernel is checked the way it is built), cached by content in a temp dir.
  ``pytest.skip`` with the reason when nvcc is missing.
* ``sass(cubin) -> str``: ``cuobjdump -sass``; ``sass_functions(text) -> {kernel name: its SASS}``.
* ``resource_usage(cubin) -> {kernel name: {"registers", "stack", "local", "shared"}}``.
* ``demangle_hint(name)``: a short readable form of a mangled kernel name, for messages.

cuobjdump comes from ``$CUOBJDUMP``, the Triton wheel (``triton/backends/nvidia/bin``), ``$CUDA_HOME/bin`` or
PATH, in that order.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from compile_cache import compile_once, source_key

# What torch.utils.cpp_extension passes to nvcc for every CUDA source of an extension.
TORCH_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr",
)
CACHE_DIR = Path(tempfile.gettempdir()) / f"fusedrope-cubin-cache-{os.getuid()}"


def find_nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").is_file():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return None


def find_cuobjdump() -> str | None:
    cands = [os.environ.get("CUOBJDUMP")]
    try:
        import triton

        cands.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    except ImportError:
        pass
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        cands.append(str(Path(cuda_home) / "bin" / "cuobjdump"))
    cands.append(shutil.which("cuobjdump"))
    for cand in cands:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def _arch_flag(arch) -> str:
    a = str(arch).lower().removeprefix("sm_").removeprefix("sm").replace(".", "")
    if not re.fullmatch(r"\d+[a-z]?", a):
        raise ValueError(f"nvcc_cubin: argument 'arch' expected e.g. 'sm_90', '90' or 90, got {arch!r}")
    return f"sm_{a}"


def nvcc_cubin(src_path, arch, extra_flags=()) -> Path:
    """Compile ``src_path`` for ``arch`` (``"sm_90"``, ``"90"`` or ``90``) to a cubin and return its path.

    Cached by (source text, headers beside it and the ones it includes, nvcc, flags). Skips the test when nvcc
    is missing; a compile error fails it with nvcc's message.
    """
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC or CUDA_HOME, or put nvcc on PATH): cannot compile CUDA here")
    src = Path(src_path).resolve()
    flags = ["-cubin", f"-arch={_arch_flag(arch)}", "-O3", "-std=c++17", *TORCH_NVCC_FLAGS, *extra_flags]
    key = source_key(src, (".cu", ".cuh", ".h", ".hpp"), nvcc, " ".join(flags))
    out = CACHE_DIR / f"{src.stem}-{_arch_flag(arch)}-{key}.cubin"

    def on_error(stderr: str) -> None:
        pytest.fail(f"nvcc failed for {src.name} ({_arch_flag(arch)}):\n{stderr[-4000:]}")

    return compile_once(nvcc, flags, src, out, on_error)


def _cuobjdump(args) -> str:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (install triton, or set CUOBJDUMP / CUDA_HOME)")
    proc = subprocess.run([tool, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"cuobjdump {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def sass(cubin) -> str:
    """The SASS of every kernel in ``cubin`` (``cuobjdump -sass``)."""
    return _cuobjdump(["-sass", str(cubin)])


def sass_functions(text: str) -> dict[str, str]:
    """Split ``sass()`` output into ``{mangled kernel name: that kernel's SASS}``."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function\s*:\s*(\S+)", line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


def opcodes(function_sass: str) -> list[str]:
    """The instruction mnemonics (with modifiers, e.g. ``LDG.E.128``) of one kernel's SASS, predicates dropped."""
    ops = []
    for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_.]*)", function_sass):
        ops.append(m.group(1))
    return ops


def resource_usage(cubin) -> dict[str, dict[str, int]]:
    """``{kernel name: {"registers", "stack", "local", "shared"}}`` from ``cuobjdump --dump-resource-usage``."""
    text = _cuobjdump(["--dump-resource-usage", str(cubin)])
    out: dict[str, dict[str, int]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function\s+(\S+?):?\s*$", line)
        if m:
            name = m.group(1)
            continue
        if name is not None and "REG:" in line:
            vals = dict(re.findall(r"([A-Z_]+(?:\[\d+\])?):(\d+)", line))
            out[name] = {"registers": int(vals["REG"]), "stack": int(vals["STACK"]),
                         "local": int(vals["LOCAL"]), "shared": int(vals["SHARED"])}
            name = None
    return out


def demangle_hint(name: str) -> str:
    """``..._kernelI13__nv_bfloat16Li128ELi8EEE...`` -> ``kernel<__nv_bfloat16,128,8>`` (good enough for messages)."""
    m = re.search(r"(\w+?)I(.*)E(?:Ev|Ev\w*)", name)
    if not m:
        return name
    args = re.findall(r"Li(-?\d+)E|\d+(__\w+?|\w+?)(?=L|E|$)", m.group(2))
    parts = [a or b for a, b in args]
    base = re.sub(r"^.*\d", "", m.group(1)) or m.group(1)
    return f"{base}<{','.join(parts)}>"
