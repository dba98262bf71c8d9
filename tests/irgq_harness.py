"""The CPU harness of the inverse_rope_group_quant kernels' plain C++ (tests/irgq_host_harness.cpp), built
with g++ and loaded with ctypes; and the probe values the scalar-math checks run over.

* ``harness() -> ctypes.CDLL``: ``irgq_host_run`` (the CUDA kernel emulated on the CPU), ``irgq_host_e8m0``,
  ``irgq_host_encode``, ``irgq_host_kargs``, ``irgq_host_fastdiv_mismatches``. Cached by content in a temp
  dir; ``pytest.skip`` when there is no C++ compiler, ``pytest.fail`` with the compiler's message on an error.
* ``e8m0_probe_values()``, ``fp8_probe_values(fp8_max)``: float32 tensors.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARNESS = Path(__file__).resolve().parent / "irgq_host_harness.cpp"
COMMON_H = ROOT / "kernels_cuda" / "inverse_rope_group_quant_common.h"  # shared by both kernels
CUDA_H = ROOT / "kernels_cuda" / "inverse_rope_group_quant.cuh"
HIP_H = ROOT / "kernels_hip" / "inverse_rope_group_quant.h"


def harness() -> ctypes.CDLL:
    gxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not gxx:
        pytest.skip("no C++ compiler (g++) to build the CPU harness of the kernels' plain C++")
    h = hashlib.sha256()
    for f in (HARNESS, COMMON_H, CUDA_H, HIP_H):
        h.update(f.read_bytes())
    h.update(gxx.encode())
    out = Path(tempfile.gettempdir()) / f"fusedrope-irgq-harness-{os.getuid()}-{h.hexdigest()[:16]}.so"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [gxx, "-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Werror", "-shared", "-fPIC",
               "-I", str(CUDA_H.parent), "-I", str(HIP_H.parent), str(HARNESS), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"harness build failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}")
        os.replace(tmp, out)
    lib = ctypes.CDLL(str(out))
    lib.irgq_host_run.restype = ctypes.c_int
    lib.irgq_host_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong)]
    lib.irgq_host_fastdiv_mismatches.restype = ctypes.c_longlong
    lib.irgq_host_fastdiv_mismatches.argtypes = [ctypes.c_longlong, ctypes.c_longlong, ctypes.c_ulonglong]
    return lib


def e8m0_probe_values():
    """amax values around every scale boundary (FP8_MAX * 2^k and its fp32 neighbours), random magnitudes,
    values at and below the 1e-8 floor, zero."""
    import torch

    k = torch.arange(-40, 120, dtype=torch.float64)
    edges = torch.cat([(m * torch.exp2(k)) for m in (448.0, 240.0, 1.0)]).float()
    edges = edges[torch.isfinite(edges)]
    up = torch.nextafter(edges, torch.full_like(edges, float("inf")))
    down = torch.nextafter(edges, torch.zeros_like(edges))
    g = torch.Generator().manual_seed(0)
    rnd = torch.exp2(torch.rand(20000, generator=g, dtype=torch.float64) * 160 - 40).float()
    low = torch.tensor([0.0, 1e-12, 9.99e-9, 1e-8, 1.0001e-8, 3e-8], dtype=torch.float32)
    v = torch.cat([edges, up, down, rnd, low])
    return v[torch.isfinite(v)].contiguous()


def fp8_probe_values(fp8_max: float):
    """Every bf16 and fp16 bit pattern, every fp8 code's value and the midpoints between neighbouring codes
    (ties) with their fp32 neighbours, random fp32; clamped to [-FP8_MAX, FP8_MAX] as the kernel does."""
    import torch

    bf = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    hf = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = torch.cat([codes.view(torch.float8_e4m3fn).float(), codes.view(torch.float8_e4m3fnuz).float()])
    vals = vals[torch.isfinite(vals)].unique()
    mids = (vals[1:] + vals[:-1]) / 2
    mids = torch.cat([mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)])
    g = torch.Generator().manual_seed(1)
    rnd = (torch.randn(50000, generator=g) * torch.exp2(torch.randint(-14, 9, (50000,), generator=g).float()))
    v = torch.cat([bf, hf, vals, mids, rnd, torch.tensor([0.0, -0.0, fp8_max, -fp8_max])])
    v = v[torch.isfinite(v)]
    return v.clamp(-fp8_max, fp8_max).contiguous()
