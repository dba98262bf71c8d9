"""CPU checks of the HIP inverse_rope_group_quant kernel (kernels_hip/inverse_rope_group_quant.hip): clang
compiles the device code (no ROCm, no GPU) and the ISA must show what the design promises:

* gfx942: dwordx4 global loads and stores, hardware FNUZ conversion (v_cvt_pk_fp8_f32), DPP butterfly steps
  whose number grows with the quant group (1 for group 32 ... 4 for group 256; no LDS, no full-wave
  reduction), no scratch (``.private_segment_fixed_size`` 0 in the code object's notes, no scratch_*
  instructions), no spills;
* gfx950 (OCP e4m3fn in hardware): the same, where a clang that knows gfx950 is installed (clang-19 does not:
  skipped with the reason);
* gfx90a (no fp8 instructions): the software fallback compiles, still without scratch.

The kernel has never run on AMD hardware from this repository; see docs/kernels_hip.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hip_asm import asm_metadata, hip_asm, hip_code_object, kernel_asm, kernel_notes, mnemonics

SRC = Path(__file__).resolve().parents[1] / "kernels_hip" / "inverse_rope_group_quant.hip"
# DPP controls of the butterfly: quad_perm [1,0,3,2], quad_perm [2,3,0,1], row_half_mirror, row_mirror
DPP_STEPS = ("quad_perm:[1,0,3,2]", "quad_perm:[2,3,0,1]", "row_half_mirror", "row_mirror")


def _group(name: str) -> int:
    m = re.search(r"irgq_kernelINS0_\d+(?:BF16|F16)ELi(\d+)E", name)
    assert m, name
    return int(m.group(1))


def _check_isa(arch: str, hw_fp8: bool) -> dict[str, str]:
    text = hip_asm(SRC, arch)
    kernels = kernel_asm(text)
    meta = asm_metadata(text)
    assert len(kernels) == 8, sorted(kernels)  # {bf16, fp16} x {32, 64, 128, 256}
    for name, body in kernels.items():
        ops = mnemonics(body)
        q = _group(name)
        assert "global_load_dwordx4" in ops, f"{arch} {name}: no global_load_dwordx4"
        loads = [o for o in ops if o.startswith("global_load")]
        # the kernel issues the loads of o first: they must be the 16-byte ones
        assert loads[:2] == ["global_load_dwordx4"] * 2, f"{arch} {name}: first loads {loads[:4]}"
        assert "global_store_dwordx4" in ops, f"{arch} {name}: no global_store_dwordx4"
        assert not [o for o in ops if o.startswith("scratch_")], f"{arch} {name}: scratch instructions"
        assert not [o for o in ops if o.startswith("ds_")], f"{arch} {name}: LDS instructions (none intended)"
        assert not [o for o in ops if o.startswith("flat_")], \
            f"{arch} {name}: flat (not global) memory access"
        cvt = ops.count("v_cvt_pk_fp8_f32")
        if hw_fp8:
            assert cvt >= 16, \
                f"{arch} {name}: {cvt} v_cvt_pk_fp8_f32 (8 per 16-element chunk, 2 chunks per lane)"
        else:
            assert cvt == 0, f"{arch} {name}: unexpected v_cvt_pk_fp8_f32"
        # The block reduction: log2(q/16) DPP steps per chunk, two chunks per lane; never a wave-wide pattern.
        steps = int(q // 16).bit_length() - 1
        for i, ctl in enumerate(DPP_STEPS):
            n = body.count(ctl)
            assert n == (2 if i < steps else 0), f"{arch} {name}: {n} x {ctl} for group {q}"
        assert not re.search(r"row_bcast|wave_sh|wave_ro|ds_swizzle|ds_bpermute|readlane", body), \
            f"{arch} {name}: cross-row / wave-wide lane traffic"
        md = meta.get(name, {})
        assert md.get("private_segment_fixed_size") == "0", f"{arch} {name}: scratch {md}"
        print(f"{arch} {name}: vgpr {md.get('vgpr_count')}, sgpr {md.get('sgpr_count')}, "
              f"scratch {md.get('private_segment_fixed_size')} B, "
              f"lds {md.get('group_segment_fixed_size')} B, "
              f"{cvt} v_cvt_pk_fp8_f32, {ops.count('global_load_dwordx4')} global_load_dwordx4")
    return kernels


def _check_notes(arch: str) -> None:
    notes = kernel_notes(hip_code_object(SRC, arch))
    assert len(notes) == 8, sorted(notes)
    for name, md in notes.items():
        assert md["private_segment_fixed_size"] == "0", \
            f"{arch} {name}: scratch {md['private_segment_fixed_size']}"
        assert md.get("uses_dynamic_stack", "false") == "false", f"{arch} {name}: dynamic stack"
        assert md.get("vgpr_spill_count", "0") == "0" and md.get("sgpr_spill_count", "0") == "0", md
        assert md["group_segment_fixed_size"] == "0", md
        assert md["wavefront_size"] == "64", md
        vgpr = int(md["vgpr_count"])
        assert vgpr <= 128, f"{arch} {name}: {vgpr} VGPRs (keep >= 4 waves per SIMD)"
        print(f"{arch} notes {name}: .vgpr_count {vgpr}, .sgpr_count {md['sgpr_count']}, "
              f".private_segment_fixed_size {md['private_segment_fixed_size']}")


def test_gfx942_isa():
    _check_isa("gfx942", hw_fp8=True)


def test_gfx942_code_object_notes_no_scratch():
    _check_notes("gfx942")


def test_gfx950_isa_and_notes():
    _check_isa("gfx950", hw_fp8=True)  # skips with the compiler's reason where clang does not know gfx950
    _check_notes("gfx950")


def test_gfx90a_software_fp8_fallback_compiles():
    _check_isa("gfx90a", hw_fp8=False)


def test_hw_conversion_is_guarded_by_arch_and_has_builtin():
    """The fp8 builtin is only reachable under the arch macros and __has_builtin (other targets: software)."""
    text = SRC.read_text()
    for m in re.finditer(r"__builtin_amdgcn_cvt_pk_fp8_f32\(", text):
        before = text[: m.start()]
        last_if = max(before.rfind("#if "), before.rfind("#elif "))
        guard = before[last_if: before.find("\n", last_if)]
        assert "__has_builtin(__builtin_amdgcn_cvt_pk_fp8_f32)" in guard and "__gfx9" in guard, guard


def test_torch_binding_compiles_against_torch_headers(tmp_path):
    """g++ -fsyntax-only of the HIP torch binding against this torch's headers, with stand-ins for the three
    ROCm torch declarations it uses (masquerading guard, current stream, hipGetErrorString): catches torch API
    mistakes without ROCm. The real build happens only on a ROCm machine."""
    import shutil
    import subprocess

    from torch.utils.cpp_extension import include_paths

    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++")
    d = tmp_path / "ATen" / "hip" / "impl"
    d.mkdir(parents=True)
    (d / "HIPGuardImplMasqueradingAsCUDA.h").write_text(
        "#pragma once\n#include <c10/core/Device.h>\ntypedef struct ihipStream_t* hipStream_t;\n"
        "enum hipError_t { hipSuccess = 0 };\n"
        "inline const char* hipGetErrorString(hipError_t) { return \"\"; }\n"
        "namespace c10 { namespace hip {\n"
        "struct HIPGuardMasqueradingAsCUDA { explicit HIPGuardMasqueradingAsCUDA(c10::Device) {} };\n"
        "struct HIPStreamMasqueradingAsCUDA { hipStream_t stream() const { return nullptr; } };\n"
        "inline HIPStreamMasqueradingAsCUDA getCurrentHIPStreamMasqueradingAsCUDA(c10::DeviceIndex = -1) "
        "{ return {}; }\n} }\n")
    (d / "HIPStreamMasqueradingAsCUDA.h").write_text(
        "#pragma once\n#include <ATen/hip/impl/HIPGuardImplMasqueradingAsCUDA.h>\n")
    cmd = [gxx, "-std=c++17", "-fsyntax-only", "-w", "-DFUSEDROPE_HIP_NO_RUNTIME_HEADERS",
           "-I", str(tmp_path),
           *[f"-I{p}" for p in include_paths()], "-I", str(SRC.parent),
           str(SRC.parent / "inverse_rope_group_quant_torch.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_hip_backend_supports(monkeypatch):
    import torch

    from fusedrope import hip_inverse_rope_quant as hq

    dev = torch.device("cuda", 0)
    base = (dev, torch.bfloat16, 512, 64, 128, torch.bfloat16, torch.int64, torch.float8_e4m3fnuz,
            torch.float8_e8m0fnu, False)
    monkeypatch.setattr(hq, "gpu_arch", lambda d: "gfx942")
    assert hq.supports(base) is None
    assert hq.supports(base[:4] + (32,) + base[5:8] + (torch.float32, True)) is None
    assert "float8_e4m3fnuz" in hq.supports(base[:7] + (torch.float8_e4m3fn,) + base[8:])
    assert "packed UE8M0" in hq.supports(base[:8] + (torch.int32, True))
    assert "head_dim 512" in hq.supports((dev, torch.bfloat16, 128, 64) + base[4:])
    monkeypatch.setattr(hq, "gpu_arch", lambda d: "gfx950")
    assert hq.supports(base[:7] + (torch.float8_e4m3fn,) + base[8:]) is None
    assert "float8_e4m3fn" in hq.supports(base)
    monkeypatch.setattr(hq, "gpu_arch", lambda d: "gfx90a")
    assert "gfx942/gfx950" in hq.supports(base)
    monkeypatch.setattr(hq, "gpu_arch", lambda d: "sm_90")
    assert "gfx942/gfx950" in hq.supports(base)


def test_hip_ext_sources_and_reasons():
    import torch

    from fusedrope import hip_ext

    names = [p.name for p in hip_ext.sources()]
    assert "inverse_rope_group_quant.hip" in names and "inverse_rope_group_quant_torch.cpp" in names
    if not torch.version.hip:
        assert "ROCm" in hip_ext.toolkit_reason()
        assert hip_ext.available(torch.device("cpu"))


# ------------------------------------------------------------------- the plain-C++ part, run on the CPU (g++)
HARNESS = Path(__file__).resolve().parent / "irgq_hip_host_harness.cpp"
COMMON_H = SRC.parents[1] / "kernels_cuda" / "inverse_rope_group_quant_common.h"  # shared with CUDA


def _hip_harness():
    import ctypes
    import hashlib
    import os
    import shutil
    import subprocess
    import tempfile

    gxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not gxx:
        pytest.skip("no C++ compiler (g++) for the HIP host harness")
    h = hashlib.sha256()
    for f in (HARNESS, COMMON_H, SRC.parent / "inverse_rope_group_quant.h"):
        h.update(f.read_bytes())
    out = Path(tempfile.gettempdir()) / f"fusedrope-irgq-hip-harness-{os.getuid()}-{h.hexdigest()[:16]}.so"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [gxx, "-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Werror", "-shared", "-fPIC", "-I",
               str(SRC.parent), str(HARNESS), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"HIP host harness build failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}")
        os.replace(tmp, out)
    lib = ctypes.CDLL(str(out))
    lib.irgq_hip_fastdiv_mismatches.restype = ctypes.c_longlong
    lib.irgq_hip_fastdiv_mismatches.argtypes = [ctypes.c_longlong, ctypes.c_longlong]
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


@pytest.mark.parametrize("fnuz", [False, True], ids=["e4m3fn", "e4m3fnuz"])
def test_hip_scalar_math_matches_reference(fnuz):
    """The e8m0 byte and the software fp8 RNE of the HIP kernel, compiled by g++, bit-exact against
    fusedrope.reference (e8m0_scale_bytes) and torch's fp8 casts (what the reference uses)."""
    import ctypes

    import torch

    from fusedrope import reference as ref

    lib = _hip_harness()
    dtype = torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn
    fp8_max = ref.FP8_MAX[dtype]
    amax = e8m0_probe_values()
    got = torch.empty(amax.numel(), dtype=torch.uint8)
    lib.irgq_hip_e8m0(ctypes.c_void_p(amax.data_ptr()), ctypes.c_longlong(amax.numel()), ctypes.c_int(fnuz),
                      ctypes.c_void_p(got.data_ptr()))
    want = ref.e8m0_scale_bytes(amax, fp8_max)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (f"e8m0 differs for amax={amax[bad[0]].item()!r}: {got[bad[0]].item()} "
                              f"vs {want[bad[0]].item()}")

    x = fp8_probe_values(fp8_max)
    got = torch.empty(x.numel(), dtype=torch.uint8)
    lib.irgq_hip_encode(ctypes.c_void_p(x.data_ptr()), ctypes.c_longlong(x.numel()), ctypes.c_int(fnuz),
                        ctypes.c_void_p(got.data_ptr()))
    want = x.to(dtype).view(torch.uint8)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (f"{bad.numel()} fp8 codes differ; first x={x[bad[0]].item()!r}: "
                              f"{got[bad[0]].item():#x} vs torch {want[bad[0]].item():#x}")


def test_hip_launcher_arguments():
    import ctypes

    lib = _hip_harness()

    def kargs(ptrs=(4096, 8192, 16384, 16384 + 128, 65536, 131072), **kw):
        ints = dict(S=5, H=16, D=512, o_dtype=0, pos64=1, pos_stride=1, cache_dtype=2, cos_stride=64,
                    sin_stride=64, max_pos=100, rope=64, fnuz=1, G=2, q=128, f32=0, ss0=64, ss2=1)
        ints.update(kw)
        p = (ctypes.c_void_p * 6)(*ptrs)
        arr = (ctypes.c_longlong * 17)(*ints.values())
        out = (ctypes.c_longlong * 10)()
        lib.irgq_hip_kargs(p, arr, out)
        return list(out)

    r = kargs()
    assert r[:8] == [0, 5 * 16 * 32, 16 * 32, 31 + 9, 8, 256, 64, 1], r
    assert r[8:] == [1, 1]
    assert kargs(ptrs=(4096 + 2, 8192, 16384, 16384 + 128, 65536, 131072))[9] == 0  # o off 16-byte alignment
    assert kargs(ptrs=(4096, 8192, 16384, 16384 + 128, 65536 + 3, 131072))[9] == 0  # x_fp8 too
    assert kargs(cos_stride=65)[8] == 0                                              # cache rows unaligned
    assert kargs(cache_dtype=0, cos_stride=72, sin_stride=72)[8] == 1                # 144 B rows: aligned
    assert kargs(pos64=0, pos_stride=3)[4] == 12
    assert kargs(f32=1, ss0=1, ss2=5)[6:8] == [4, 20]
    assert kargs(D=256)[0] == 1 and kargs(rope=128)[0] == 1                          # kUnsupportedShape
    assert kargs(q=48)[0] == 2 and kargs(G=3)[0] == 2                                # kBadGroup
    assert kargs(o_dtype=2)[0] == 3 and kargs(cache_dtype=7)[0] == 3                 # kBadDtype
    assert kargs(S=(1 << 31) // (16 * 32) + 1)[0] == 4                               # kTooLarge
    assert kargs(S=0)[:2] == [0, 0]                                                  # nothing to launch


def test_hip_token_division_magic_numbers():
    lib = _hip_harness()
    for heads in (1, 2, 3, 5, 7, 8, 12, 16, 24, 32, 61, 64, 100, 128, 1000, 4093):
        assert lib.irgq_hip_fastdiv_mismatches(heads, 200_000) == 0, heads
