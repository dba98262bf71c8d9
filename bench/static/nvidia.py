"""NVIDIA launches, without a GPU: a kernel's sm_90 SASS, registers and shared memory, and the exact launch (kernel,
grid, block, parameter bytes) that fusedrope's own launcher makes for a call.

* CUDA: the kernel sources compiled by nvcc as torch's extension build compiles them; the launcher (the same
  ``.cu`` file) built with g++ against tests/support/cuda_emul in its record mode, which keeps the launch
  instead of running it, and called on CPU tensors through the emulation harnesses' ctypes entry points.
* Triton: the launcher called on CPU tensors with ``JITFunction.run`` intercepted; each recorded launch compiled
  for sm_90 with the specialization Triton's runtime gives those arguments (16-divisible pointers and integers,
  integers equal to 1 as constants), its parameters laid out as in the PTX entry.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "tests", ROOT / "tests" / "support", ROOT / "tests" / "inverse_rope_group_quant"):
    sys.path.insert(0, str(p))

from compile_cache import content_key  # noqa: E402
from kernel_asm import TORCH_NVCC_FLAGS, find_cuobjdump, find_nvcc, resource_usage, sass_functions  # noqa: E402

import sass as S  # noqa: E402

CACHE = Path(tempfile.gettempdir()) / f"fusedrope-static-{os.getuid()}"
ARCH = "sm_90"


@dataclass
class Launch:
    kernel: str          # mangled name (the anonymous namespace left out)
    sass: str
    grid: tuple
    block: tuple
    params: bytes
    registers: int
    shared: int          # static shared memory, bytes

    def count(self, sample_blocks: int = 6) -> S.Count:
        return S.launch_counts(S.Kernel(self.sass), self.grid, self.block, self.params, sample_blocks=sample_blocks)


def without_anonymous_namespace(mangled: str) -> str:
    """``...4irgq12_GLOBAL__N_111irgq_kernel...`` -> ``...4irgq11irgq_kernel...``: g++ and nvcc name the anonymous
    namespace differently; the rest of the mangled name is the same."""
    i = mangled.find("_GLOBAL__N_")
    if i < 0:
        return mangled
    j = i
    while mangled[j - 1].isdigit():
        j -= 1
    return mangled[:j] + mangled[i + int(mangled[j:i]):]


def _run(cmd, **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def cubin_functions(src: Path, extra=()) -> dict[str, tuple[str, dict]]:
    """{kernel name: (SASS, resource usage)} of ``src`` compiled for sm_90 as the extension build compiles it."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found")
    flags = ["-cubin", f"-arch={ARCH}", "-O3", "-std=c++17", *TORCH_NVCC_FLAGS, *extra]
    CACHE.mkdir(exist_ok=True)
    out = CACHE / f"{src.stem}-{content_key(sorted(src.parent.glob('*.*h')) + [src], nvcc, *flags)}.cubin"
    if not out.exists():
        _run([nvcc, *flags, str(src), "-o", str(out)])
    tool = find_cuobjdump()
    usage = {without_anonymous_namespace(k): v for k, v in resource_usage(out).items()}
    return {without_anonymous_namespace(k): (v, usage.get(without_anonymous_namespace(k), {}))
            for k, v in sass_functions(_run([tool, "-sass", str(out)])).items()}


class Recorder:
    """A launcher built in cuda_emul's record mode (``lib``): call its entry point, then ``launch(status)`` is the
    launch it made."""

    def __init__(self, kernel_src: Path, harness: Path, lockstep: bool):
        flags = ["-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-ffp-contract=off", "-DCUDA_EMUL_RECORD",
                 "-Wno-unknown-pragmas", "-x", "c++", "-I", str(ROOT / "tests" / "support"),
                 "-I", str(ROOT / "tests" / "inverse_rope_group_quant"), "-I", str(ROOT / "tests/support/cuda_emul"),
                 "-I", str(kernel_src.parent), f'-DKERNEL_SOURCE="{kernel_src}"'] + (
                     ["-DCUDA_EMUL_LOCKSTEP=1"] if lockstep else [])
        deps = sorted(kernel_src.parent.glob("*.*h")) + sorted((ROOT / "tests/support/cuda_emul").glob("*")) + [
            kernel_src, harness]
        CACHE.mkdir(exist_ok=True)
        self.path = CACHE / f"record-{kernel_src.stem}-{content_key(deps, *flags)}.so"
        if not self.path.exists():
            _run(["g++", *flags, str(harness), "-o", str(self.path)])
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.emul_record_kernel.restype = ctypes.c_longlong
        syms = {}
        for line in _run(["nm", "--defined-only", str(self.path)]).splitlines():
            f = line.split()
            if len(f) >= 3:
                syms.setdefault(int(f[0], 16), f[2])
        self.anchor = next(a for a, n in syms.items() if n == "emul_record_anchor")
        self.symbols = syms
        self.functions = cubin_functions(kernel_src)

    def launch(self, status: int) -> Launch:
        """The launch the launcher just recorded; ``status``, what the call returned, must be 0."""
        if status:
            raise RuntimeError(f"launcher status {status}")
        geo, buf, n = (ctypes.c_uint * 6)(), (ctypes.c_ubyte * 4096)(), ctypes.c_uint()
        self.lib.emul_record_launch(geo, buf, ctypes.byref(n))
        name = without_anonymous_namespace(self.symbols[self.anchor + self.lib.emul_record_kernel()])
        sass, usage = self.functions[name]
        return Launch(name, sass, tuple(geo[:3]), tuple(geo[3:]), bytes(buf[:n.value]), usage.get("registers", 0),
                      usage.get("shared", 0))


# ---- Triton ------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def recorded_triton_launches():
    """Within: every ``kernel[grid](...)`` is recorded as (JITFunction, grid, args, kwargs), not run."""
    from triton.runtime.jit import JITFunction

    calls = []
    real = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        calls.append((self, grid, args, kwargs))

    JITFunction.run = record
    try:
        yield calls
    finally:
        JITFunction.run = real


def triton_launch_of(call) -> Launch:
    """The one Triton launch ``call()`` makes, compiled (:func:`triton_launch`)."""
    with recorded_triton_launches() as calls:
        call()
    (fn, grid, args, kwargs), = calls
    return triton_launch(fn, grid, args, kwargs)


_PTX_SIZE = {"u64": 8, "b64": 8, "s64": 8, "u32": 4, "b32": 4, "s32": 4, "f32": 4, "u8": 1, "b8": 1, "u16": 2,
             "s16": 2, "f64": 8}


def triton_launch(fn, grid, args, kwargs, target=None) -> Launch:
    """Compile one recorded launch for sm_90 with its runtime specialization and lay out its parameters."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource
    from triton.runtime.jit import native_specialize_impl

    target = target or GPUTarget("cuda", 90, 32)
    bound = dict(zip(fn.arg_names, args))
    options = {k: kwargs.pop(k) for k in list(kwargs) if k not in fn.arg_names}
    bound.update(kwargs)
    sig, consts, attrs, values = {}, {}, {}, []
    for i, p in enumerate(fn.params):
        v = bound[p.name] if p.name in bound else p.default
        if p.is_constexpr:
            sig[p.name], consts[p.name] = "constexpr", v
            continue
        ty, key = native_specialize_impl(CUDABackend, v, False, not p.do_not_specialize,
                                         not p.do_not_specialize_on_alignment)
        if ty == "constexpr":
            sig[p.name], consts[p.name] = "constexpr", key
            continue
        sig[p.name] = ty
        if key == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
        values.append((ty, v))
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=target,
                       options=options)
    params = _pack_params(k.asm["ptx"], values)
    cubin = _write_cubin(k.asm["cubin"])
    (name, sass), = sass_functions(_run([find_cuobjdump(), "-sass", cubin])).items()
    (usage,) = resource_usage(cubin).values()
    g = tuple(grid) + (1,) * (3 - len(grid))
    return Launch(name, sass, g, (32 * options.get("num_warps", 4), 1, 1), params, usage["registers"],
                  k.metadata.shared)


def _write_cubin(data: bytes) -> str:
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"triton-{hashlib.sha256(data).hexdigest()[:16]}.cubin"
    if not path.exists():
        path.write_bytes(data)
    return str(path)


def _pack_params(ptx: str, values: list) -> bytes:
    """The parameter bytes of the PTX entry: the non-constexpr arguments in order, then Triton's scratch pointers
    (zero), each at its natural alignment."""
    entry = re.search(r"\.entry\s+\w+\s*\((.*?)\)", ptx, re.S).group(1)
    kinds = re.findall(r"\.param\s+\.(\w+)", entry)
    out = bytearray()
    for i, kind in enumerate(kinds):
        size = _PTX_SIZE[kind]
        out += b"\0" * (-len(out) % size)
        if i < len(values):
            ty, v = values[i]
            if isinstance(v, torch.Tensor):
                raw = struct.pack("<Q", v.data_ptr())
            elif ty.startswith("fp"):
                raw = struct.pack("<f", float(v))
            elif ty.startswith("u1"):
                raw = struct.pack("<B", int(bool(v)))
            else:
                raw = int(v).to_bytes(size, "little", signed=True)
            out += raw[:size]
        else:
            out += b"\0" * size
    return bytes(out)
