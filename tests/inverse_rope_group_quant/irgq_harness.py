"""The CPU harnesses of the inverse_rope_group_quant kernels, loaded with ctypes; the inputs, poisoned outputs and
bit-exact comparison against fusedrope.reference that both kernels' emulations share; and the probe values the
scalar-math checks run over.

* ``harness() -> ctypes.CDLL``: tests/inverse_rope_group_quant/irgq_host_harness.cpp built with g++: the shared scalar
math
  ``irgq_host_e8m0``, ``irgq_host_encode``, ``irgq_host_kargs``, ``irgq_host_fastdiv_mismatches``.
* ``emulated_kernel(vendor, source=None, asan=False) -> ctypes.CDLL``: the whole CUDA (g++) or HIP (clang)
  kernel and its launcher in lockstep host emulation (tests/support/lockstep.h, tests/support/cuda_emul/,
  tests/support/hip_emul/):
  ``irgq_host_run``, ``emul_stats``, ``emul_reset``, ``emul_hw_cvts`` (hardware fp8 conversions through the
  models since the last call); ``emul_stats(lib)`` as a dict; ``asan_runtime(vendor)``.
* ``emulate(lib, o, positions, cos, sin, x_fp8, x_scale, q)`` -> the launcher's status code;
  ``quant_inputs(S, H, ...)``, ``quant_outputs(o, G, q, transpose, ...)`` (poisoned),
  ``check_emulated(lib, o, positions, cos, sin, G, q, transpose, ...)``: scale and fp8 bytes bit-exact.
* ``e8m0_probe_values()``, ``fp8_probe_values(fp8_max)``: float32 tensors.

Each library is cached by content in a temp dir; ``pytest.skip`` when the compiler is missing, ``pytest.fail``
with the compiler's message on an error.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from compile_cache import ASAN_FLAGS, CLANG_NAMES, build_once, content_key, host_cxx
from fusedrope import reference as ref

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"  # the emulators and what they share
HARNESS = Path(__file__).resolve().parent / "irgq_host_harness.cpp"
COMMON_H = ROOT / "kernels_cuda" / "inverse_rope_group_quant_common.h"  # shared by both kernels
CUDA_H = ROOT / "kernels_cuda" / "inverse_rope_group_quant.cuh"
HIP_H = ROOT / "kernels_hip" / "inverse_rope_group_quant.h"
HIP_SRC = ROOT / "kernels_hip" / "inverse_rope_group_quant.hip"
CUDA_SRC = ROOT / "kernels_cuda" / "inverse_rope_group_quant.cu"
HIP_EMUL = SUPPORT / "hip_emul"
CUDA_EMUL = SUPPORT / "cuda_emul"
DT = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


def _build(cmd: list[str], inputs: list[Path], name: str) -> Path:
    """``cmd -o OUT.so``, once per content of ``inputs`` and ``cmd``."""
    out = Path(tempfile.gettempdir()) / f"fusedrope-{name}-{os.getuid()}-{content_key(inputs, *cmd)}.so"

    def on_error(stderr: str) -> None:
        pytest.fail(f"{name} build failed:\n{' '.join(cmd)}\n{stderr[-4000:]}")

    return build_once(cmd, out, on_error)


def harness() -> ctypes.CDLL:
    gxx = host_cxx()
    if not gxx:
        pytest.skip("no C++ compiler (g++) to build the CPU harness of the kernels' plain C++")
    out = _build([gxx, "-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Werror", "-shared", "-fPIC",
                  "-I", str(CUDA_H.parent), "-I", str(HIP_H.parent), "-I", str(HARNESS.parent), str(HARNESS)],
                 [HARNESS, HARNESS.with_name("irgq_params.h"), COMMON_H, CUDA_H, HIP_H], "irgq-harness")
    lib = ctypes.CDLL(str(out))
    lib.irgq_host_fastdiv_mismatches.restype = ctypes.c_longlong
    lib.irgq_host_fastdiv_mismatches.argtypes = [ctypes.c_longlong, ctypes.c_longlong, ctypes.c_ulonglong]
    return lib


def host_clang() -> str | None:
    """A clang++ for the host (the HIP source uses clang's vector extensions, so g++ cannot compile it)."""
    for name in (os.environ.get("HOST_CLANG"), *CLANG_NAMES):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def _host_cxx(vendor: str) -> str:
    if vendor.startswith("hip"):
        cxx = host_clang()
        if cxx is None:
            pytest.skip("no host clang++ (apt-get install clang-19) to run the HIP kernel under the wave emulator")
    else:
        cxx = host_cxx()
        if cxx is None:
            pytest.skip("no g++ to run the CUDA kernel in host emulation")
    return cxx


def asan_runtime(vendor: str) -> str | None:
    """The AddressSanitizer runtime to LD_PRELOAD into Python for ``emulated_kernel(vendor, asan=True)``."""
    cxx = _host_cxx(vendor)
    name = "libclang_rt.asan-x86_64.so" if vendor.startswith("hip") else "libasan.so"
    path = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return path if Path(path).is_file() else None


def emulated_kernel(vendor: str, source: Path | None = None, asan: bool = False) -> ctypes.CDLL:
    """The whole kernel and its launcher, unchanged, built for lockstep host emulation (tests/support/lockstep.h with
    tests/support/cuda_emul or tests/support/hip_emul). ``vendor``: "cuda" / "hip" (the kernels' software fp8 paths);
    "cuda-sm90" (the sm_89+ path through tests/support/cuda_emul's model of __nv_cvt_float2_to_fp8x2); "hip-gfx942" /
    "hip-gfx950" (the hardware path through tests/support/hip_emul's model of v_cvt_pk_fp8_f32).
    ``source`` defaults to the repository's file (tests pass a mutated copy)."""
    cxx = _host_cxx(vendor)
    hip = vendor.startswith("hip")
    source = Path(source or (HIP_SRC if hip else CUDA_SRC)).resolve()
    common = source.parents[1] / "kernels_cuda" / COMMON_H.name  # the copy beside a mutated source, if any
    emul = HIP_EMUL if hip else CUDA_EMUL
    harness_cpp = emul / ("harness.cpp" if hip else "irgq_harness.cpp")
    flags = list(ASAN_FLAGS) if asan else []
    if hip:
        flags += ["-Wno-unknown-attributes", "-Wno-ignored-attributes"] + (["-shared-libasan"] if asan else [])
        if vendor != "hip":
            flags += [f"-DHIP_EMUL_GFX={vendor.removeprefix('hip-gfx')}", "-Wno-builtin-macro-redefined"]
    else:
        flags += ["-Wno-unknown-pragmas", "-x", "c++"] + (["-DFUSEDROPE_IRGQ_HW_E4M3=1"] if vendor != "cuda" else [])
    here = HARNESS.parent
    deps = [source, source.with_suffix(".h"), source.with_suffix(".cuh"), source.with_name("pdl.cuh"), common,
            harness_cpp, *emul.glob("*.h"), SUPPORT / "lockstep.h", here / "irgq_params.h", SUPPORT / "emul_stats.inc"]
    out = _build([cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-ffp-contract=off", "-Wall",
                  "-Werror", *flags, "-I", str(SUPPORT), "-I", str(here), "-I", str(emul), "-I", str(common.parent),
                  f'-DKERNEL_SOURCE="{source}"', str(harness_cpp)],
                 [d for d in deps if d.exists()], f"{vendor}-emul{'-asan' if asan else ''}")
    lib = ctypes.CDLL(str(out))
    lib.irgq_host_run.restype = ctypes.c_int
    lib.irgq_host_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong)]
    lib.emul_stats.argtypes = [ctypes.POINTER(ctypes.c_longlong), ctypes.c_char_p, ctypes.c_int]
    lib.emul_hw_cvts.restype = ctypes.c_longlong
    return lib


def emul_stats(lib) -> dict:
    out = (ctypes.c_longlong * 5)()
    msg = ctypes.create_string_buffer(256)
    lib.emul_stats(out, msg, 256)
    return dict(errors=out[0], launches=out[1], grid=out[2], block=out[3], exchanges=out[4],
                first_error=msg.value.decode())


def emulate(lib, o, positions, cos, sin, x_fp8, x_scale, q, *, head_dim=None, rope_dim=None, scale_layout="row",
            pdl=0, kernel=0) -> int:
    """The launcher's status code. ``kernel`` 1: the head kernel for a layout the generic one writes too; ``pdl``
    1: a programmatic dependent launch (CUDA). ``x_fp8``'s row strides and ``x_scale``'s strides and token rows
    are read off them (``scale_layout="mfma_tile"``: a contiguous [G, S_pad, Ks_pad] buffer)."""
    S, H, D = o.shape
    ptrs = (ctypes.c_void_p * 6)(o.data_ptr(), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                 x_fp8.data_ptr(), x_scale.data_ptr())
    mfma = scale_layout == "mfma_tile"
    ints = [S, H, head_dim or D, DT[o.dtype], int(positions.dtype == torch.int64), positions.stride(0),
            DT[cos.dtype], cos.stride(0), sin.stride(0), cos.shape[0], rope_dim or 2 * cos.shape[1],
            int(x_fp8.dtype == torch.float8_e4m3fnuz), x_fp8.shape[1], q, int(x_scale.dtype == torch.float32),
            0 if mfma else x_scale.stride(0), 0 if mfma else x_scale.stride(2), pdl, x_fp8.stride(0),
            x_fp8.stride(1), int(mfma), 0 if mfma else x_scale.shape[0], kernel]
    return lib.irgq_host_run(ptrs, (ctypes.c_longlong * len(ints))(*ints))


def quant_inputs(S, H, *, dtype=torch.bfloat16, cache_dtype=torch.bfloat16, pos_dtype=torch.int64, max_pos=64,
                 strided_cache=False, strided_pos=False, misaligned=False, seed=0):
    """o [S, H, 512], positions (some out of range: clamped; the first three are max_pos, -1 and max_pos - 1,
    the clamp's edges, where S allows), cos/sin [max_pos, 32]; ``strided_cache`` gives cos and sin row strides
    of their own; ``misaligned`` puts o one element past a 16-byte boundary (the kernels' narrow path)."""
    g = torch.Generator().manual_seed(seed)
    # Per-(token, head) magnitudes over a wide range so scales, subnormal fp8 codes and ties all occur.
    mag = torch.exp2(torch.randint(-30, 12, (S, H, 1), generator=g).float())
    o = torch.randn(S, H, 512, generator=g) * mag
    # FNUZ has no -0: negative zeros and negatives that round to fp8 zero must give byte 0x00, never 0x80 (NaN)
    o[:, :, 5] = -0.0
    o[:, :, 6] = -mag[:, :, 0] * 2.0**-20
    o = o.to(dtype)
    if misaligned:
        o = torch.empty(o.numel() + 1, dtype=dtype)[1:].view(o.shape).copy_(o)
    ang = torch.rand(max_pos, 32, generator=g) * 6.3
    if strided_cache:  # views at odd offsets, with row strides 80 (cos) and 48 (sin): each stride is its own
        big, other = torch.zeros(max_pos, 80, dtype=cache_dtype), torch.zeros(max_pos, 48, dtype=cache_dtype)
        big[:, 3:35] = ang.cos().to(cache_dtype)
        other[:, 9:41] = ang.sin().to(cache_dtype)
        cos, sin = big[:, 3:35], other[:, 9:41]
    else:
        cos, sin = ang.cos().to(cache_dtype), ang.sin().to(cache_dtype)
    pos = torch.randint(-5, max_pos + 5, (S * (3 if strided_pos else 1),), generator=g).to(pos_dtype)
    positions = pos[::3] if strided_pos else pos
    positions[:3] = torch.tensor([max_pos, -1, max_pos - 1], dtype=pos_dtype)[:len(positions)]
    return o, positions, cos, sin


def quant_outputs(o, G, q, transpose, fp8_dtype=torch.float8_e4m3fn, scale_dtype=torch.float8_e8m0fnu):
    from fusedrope.inverse_rope_group_quant.buffers import empty_quant_outputs

    x, s = empty_quant_outputs(o, G, q, transpose, fp8_dtype=fp8_dtype, scale_dtype=scale_dtype)
    x.view(torch.uint8).fill_(0xA5)  # poison: every byte must be written
    s.view(torch.uint8).fill_(0xA5) if s.dtype != torch.float32 else s.fill_(-1.0)
    return x, s


def check_emulated(lib, o, positions, cos, sin, G, q, transpose, fp8_dtype=torch.float8_e4m3fn,
                   scale_dtype=torch.float8_e8m0fnu, **launch_shape):
    """The emulated kernel's scale and fp8 bytes equal fusedrope.reference's, every byte written."""
    x, s = quant_outputs(o, G, q, transpose, fp8_dtype, scale_dtype)
    xr, sr = quant_outputs(o, G, q, transpose, fp8_dtype, scale_dtype)
    assert emulate(lib, o, positions, cos, sin, x, s, q, **launch_shape) == 0
    ref.inverse_rope_group_quant(o, positions, cos, sin, xr, sr, q)
    if scale_dtype == torch.float32:
        got, want = s.view(torch.int32), sr.view(torch.int32)
    else:
        got, want = s.view(torch.uint8), sr.view(torch.uint8)
    assert torch.equal(got, want), f"scale mismatch at {(got != want).nonzero()[:5].tolist()}"
    xb, xrb = x.view(torch.uint8), xr.view(torch.uint8)
    bad = (xb != xrb).nonzero()
    assert bad.numel() == 0, (f"{bad.shape[0]} fp8 bytes differ, first at {bad[:5].tolist()}: "
                              f"{xb[tuple(bad[0])].item():#x} vs {xrb[tuple(bad[0])].item():#x}")


def e8m0_probe_values():
    """amax values around every scale boundary (FP8_MAX * 2^k and its fp32 neighbours), around the amaxes whose
    t = amax * fp32(1/FP8_MAX) has a single mantissa bit set (every bit counts in the exponent's round-up),
    random magnitudes, values at and below the 1e-8 floor, zero."""
    k = torch.arange(-40, 120, dtype=torch.float64)
    edges = torch.cat([(m * torch.exp2(k)) for m in (448.0, 240.0, 1.0)]).float()
    edges = edges[torch.isfinite(edges)]
    up = torch.nextafter(edges, torch.full_like(edges, float("inf")))
    down = torch.nextafter(edges, torch.zeros_like(edges))
    one_bit = torch.cat([(1 + torch.exp2(-torch.arange(1, 24, dtype=torch.float64))) * 2.0**e * m
                         for e in range(-20, 20) for m in (448.0, 240.0)]).float()
    one_bit = (one_bit.view(torch.int32)[:, None] + torch.arange(-4, 5, dtype=torch.int32)).flatten()
    g = torch.Generator().manual_seed(0)
    rnd = torch.exp2(torch.rand(20000, generator=g, dtype=torch.float64) * 160 - 40).float()
    low = torch.tensor([0.0, 1e-12, 9.99e-9, 1e-8, 1.0001e-8, 3e-8], dtype=torch.float32)
    v = torch.cat([edges, up, down, one_bit.view(torch.float32), rnd, low])
    return v[torch.isfinite(v)].contiguous()


def fp8_probe_values(fp8_max: float):
    """Every bf16 and fp16 bit pattern, every fp8 code's value and the midpoints between neighbouring codes
    (ties) with their fp32 neighbours, random fp32; clamped to [-FP8_MAX, FP8_MAX] as the kernel does."""
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
