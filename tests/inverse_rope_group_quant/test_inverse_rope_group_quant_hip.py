"""CPU checks of the HIP inverse_rope_group_quant kernel (kernels_hip/inverse_rope_group_quant.hip): clang
compiles the device code (no ROCm, no GPU) and the ISA must show what the design promises:

* gfx942: dwordx4 global loads and stores, hardware FNUZ conversion (v_cvt_pk_fp8_f32), DPP butterfly steps
  whose number grows with the quant group (1 for group 32 ... 4 for group 256; no LDS, no full-wave
  reduction), no scratch (``.private_segment_fixed_size`` 0 in the code object's notes, no scratch_*
  instructions), no spills; the tiled kernel (group-major x, mfma_tile and padded scales) stages its scale
  bytes in LDS and writes them after one s_barrier;
* gfx950 (OCP e4m3fn in hardware): the same, with the first clang that knows gfx950 (clang-19 does not; the clang
  22 of the ``ziglang`` wheel in the test extra does; skipped with the reasons where none is installed);
* gfx90a (no fp8 instructions): the software fallback compiles, still without scratch.

Its plain-C++ part (the header shared with the CUDA kernel: launcher arguments, e8m0 byte, software fp8 RNE,
token division) is run on the CPU against the reference in
tests/inverse_rope_group_quant/test_inverse_rope_group_quant_common.py.

The kernel has never run on AMD hardware from this repository; see docs/kernels_hip.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from compile_cache import torch_syntax_check
from hip_asm import asm_metadata, compiler_name, hip_asm, hip_code_object, kernel_asm, kernel_notes, mnemonics

SRC = Path(__file__).resolve().parents[2] / "kernels_hip" / "inverse_rope_group_quant.hip"
# DPP controls of the butterfly: quad_perm [1,0,3,2], quad_perm [2,3,0,1], row_half_mirror, row_mirror
DPP_STEPS = ("quad_perm:[1,0,3,2]", "quad_perm:[2,3,0,1]", "row_half_mirror", "row_mirror")


def _group(name: str) -> int:
    m = re.search(r"irgq_(?:tiled_)?kernelINS0_\d+(?:BF16|F16)ELi(\d+)E", name)
    assert m, name
    return int(m.group(1))


def _split(kernels: dict) -> tuple[dict, dict]:
    """(the generic kernels, the tiled ones): 8 each, {bf16, fp16} x {32, 64, 128, 256}."""
    tiled = {n: k for n, k in kernels.items() if "irgq_tiled_kernel" in n}
    generic = {n: k for n, k in kernels.items() if n not in tiled}
    for part in (generic, tiled):
        assert sorted(_group(n) for n in part) == [32, 32, 64, 64, 128, 128, 256, 256], sorted(kernels)
    return generic, tiled


def _check_tiled_isa(arch: str, hw_fp8: bool, kernels: dict, meta: dict) -> None:
    """The tiled kernel (4 tokens per lane in 2 rounds of 2): dwordx4 loads of o before the first store, the
    scale bytes written to LDS, one s_barrier, read back and stored (byte or dword) after it and no dwordx4
    store after it; log2(Q/16) DPP steps per token; no scratch."""
    for name, body in kernels.items():
        ops = mnemonics(body)
        q = _group(name)
        stores = [i for i, o in enumerate(ops) if o.startswith("global_store")]
        assert ops[:stores[0]].count("global_load_dwordx4") >= 2 * 2, f"{arch} {name}: a round's o loads"
        bar = [i for i, o in enumerate(ops) if o == "s_barrier"]
        assert len(bar) == 1, f"{arch} {name}: {len(bar)} s_barrier"
        before, after = ops[:bar[0]], ops[bar[0]:]
        assert "ds_write_b8" in before and "ds_read_u8" in after, f"{arch} {name}: no LDS staging of the scales"
        assert "global_store_dwordx4" in before and "global_store_dwordx4" not in after, name
        assert "global_store_byte" in after and "global_store_dword" in after, f"{arch} {name}: scale stores"
        assert "global_store_dword" not in before, f"{arch} {name}: an fp32 scale store before the barrier"
        steps = int(q // 16).bit_length() - 1
        for i, ctl in enumerate(DPP_STEPS):
            assert body.count(ctl) == (4 if i < steps else 0), f"{arch} {name}: {body.count(ctl)} x {ctl}"
        assert (ops.count("v_cvt_pk_fp8_f32") >= 4 * 8) == hw_fp8, name
        assert not [o for o in ops if o.startswith(("scratch_", "flat_"))], f"{arch} {name}: scratch or flat"
        md = meta.get(name, {})
        assert md.get("private_segment_fixed_size") == "0", f"{arch} {name}: scratch {md}"
        assert md.get("group_segment_fixed_size") == str(32 * 512 // q), f"{arch} {name}: LDS {md}"
        print(f"{arch} tiled {name}: vgpr {md.get('vgpr_count')}, lds {md.get('group_segment_fixed_size')} B")


def _check_isa(arch: str, hw_fp8: bool) -> dict[str, str]:
    text = hip_asm(SRC, arch)
    kernels, tiled = _split(kernel_asm(text))
    meta = asm_metadata(text)
    _check_tiled_isa(arch, hw_fp8, tiled, meta)
    for name, body in kernels.items():
        ops = mnemonics(body)
        q = _group(name)
        assert "global_load_dwordx4" in ops, f"{arch} {name}: no global_load_dwordx4"
        loads = [o for o in ops if o.startswith("global_load")]
        # the kernel issues the loads of o first: they must be the 16-byte ones
        assert loads[:2] == ["global_load_dwordx4"] * 2, f"{arch} {name}: first loads {loads[:4]}"
        assert "global_store_dwordx4" in ops, f"{arch} {name}: no global_store_dwordx4"
        # every load (o, positions, then the cos/sin rows they select) issued before the first store: two waves
        # of loads per lane, not a chain of o -> position -> cos -> sin -> store -> next chunk's loads
        first_store = next(i for i, o in enumerate(ops) if o.startswith("global_store"))
        late = [o for o in ops[first_store:] if o.startswith("global_load")]
        assert not late, f"{arch} {name}: {len(late)} loads after the first store ({late[:3]})"
        for prefix, what in (("scratch_", "scratch"), ("ds_", "LDS (none intended)"), ("flat_", "flat (not global)")):
            assert not [o for o in ops if o.startswith(prefix)], f"{arch} {name}: {what} instructions"
        cvt = ops.count("v_cvt_pk_fp8_f32")  # hardware fp8: 8 per 16-element chunk, 2 chunks per lane; else none
        assert (cvt >= 16 if hw_fp8 else cvt == 0), f"{arch} {name}: {cvt} v_cvt_pk_fp8_f32"
        # The block reduction: log2(q/16) DPP steps per chunk, two chunks per lane; never a wave-wide pattern.
        steps = int(q // 16).bit_length() - 1
        for i, ctl in enumerate(DPP_STEPS):
            n = body.count(ctl)
            assert n == (2 if i < steps else 0), f"{arch} {name}: {n} x {ctl} for group {q}"
        assert not re.search(r"row_bcast|wave_sh|wave_ro|ds_swizzle|ds_bpermute|readlane", body), \
            f"{arch} {name}: cross-row / wave-wide lane traffic"
        md = meta.get(name, {})
        assert md.get("private_segment_fixed_size") == "0", f"{arch} {name}: scratch {md}"
        print(f"{arch} ({compiler_name(arch)}) {name}: vgpr {md.get('vgpr_count')}, sgpr {md.get('sgpr_count')}, "
              f"scratch {md.get('private_segment_fixed_size')} B, "
              f"lds {md.get('group_segment_fixed_size')} B, "
              f"{cvt} v_cvt_pk_fp8_f32, {ops.count('global_load_dwordx4')} global_load_dwordx4")
    return kernels


def _check_notes(arch: str) -> None:
    notes = kernel_notes(hip_code_object(SRC, arch))
    assert len(notes) == 16, sorted(notes)  # the generic and the tiled kernels
    for name, md in notes.items():
        assert md["private_segment_fixed_size"] == "0", \
            f"{arch} {name}: scratch {md['private_segment_fixed_size']}"
        assert md.get("uses_dynamic_stack", "false") == "false", f"{arch} {name}: dynamic stack"
        assert md.get("vgpr_spill_count", "0") == "0" and md.get("sgpr_spill_count", "0") == "0", md
        tiled = "irgq_tiled_kernel" in name  # only it stages scales in LDS
        assert md["group_segment_fixed_size"] == (str(32 * 512 // _group(name)) if tiled else "0"), md
        assert md["wavefront_size"] == "64", md
        vgpr = int(md["vgpr_count"])
        assert vgpr <= 128, f"{arch} {name}: {vgpr} VGPRs (keep >= 4 waves per SIMD)"
        print(f"{arch} notes {name}: .vgpr_count {vgpr}, .sgpr_count {md['sgpr_count']}, "
              f".private_segment_fixed_size {md['private_segment_fixed_size']}")


# gfx950 skips with the compiler's reason where clang does not know it; gfx90a: the software fp8 fallback compiles
@pytest.mark.parametrize("arch,hw_fp8", [("gfx942", True), ("gfx950", True), ("gfx90a", False)])
def test_isa_and_code_object_notes(arch, hw_fp8):
    _check_isa(arch, hw_fp8)
    if hw_fp8:
        _check_notes(arch)


def test_hw_conversion_is_guarded_by_arch_and_has_builtin():
    """The fp8 builtin is only reachable under the arch macros and __has_builtin (other targets: software)."""
    text = SRC.read_text()
    for m in re.finditer(r"__builtin_amdgcn_cvt_pk_fp8_f32\(", text):
        before = text[: m.start()]
        last_if = max(before.rfind("#if "), before.rfind("#elif "))
        guard = before[last_if: before.find("\n", last_if)]
        assert "__has_builtin(__builtin_amdgcn_cvt_pk_fp8_f32)" in guard and "__gfx9" in guard, guard


@pytest.mark.slow  # a C++ compile against torch's headers
def test_torch_binding_compiles_against_torch_headers(tmp_path):
    """g++ -fsyntax-only of the HIP torch binding against this torch's headers, with stand-ins for the three
    ROCm torch declarations it uses (masquerading guard, current stream, hipGetErrorString): catches torch API
    mistakes without ROCm. The real build happens only on a ROCm machine."""
    guard = ("#pragma once\n#include <c10/core/Device.h>\ntypedef struct ihipStream_t* hipStream_t;\n"
             "enum hipError_t { hipSuccess = 0 };\n"
             "inline const char* hipGetErrorString(hipError_t) { return \"\"; }\n"
             "namespace c10 { namespace hip {\n"
             "struct HIPGuardMasqueradingAsCUDA { explicit HIPGuardMasqueradingAsCUDA(c10::Device) {} };\n"
             "struct HIPStreamMasqueradingAsCUDA { hipStream_t stream() const { return nullptr; } };\n"
             "inline HIPStreamMasqueradingAsCUDA getCurrentHIPStreamMasqueradingAsCUDA(c10::DeviceIndex = -1) "
             "{ return {}; }\n} }\n")
    stubs = {"ATen/hip/impl/HIPGuardImplMasqueradingAsCUDA.h": guard,
             "ATen/hip/impl/HIPStreamMasqueradingAsCUDA.h":
                 "#pragma once\n#include <ATen/hip/impl/HIPGuardImplMasqueradingAsCUDA.h>\n"}
    torch_syntax_check(SRC.parent / "inverse_rope_group_quant_torch.cpp", tmp_path, stubs, [SRC.parent],
                       ["FUSEDROPE_HIP_NO_RUNTIME_HEADERS"])


def test_hip_backend_supports(monkeypatch):
    import torch

    from fusedrope.inverse_rope_group_quant import Facts
    from fusedrope.inverse_rope_group_quant import hip as hq

    def supports(facts: tuple):
        return hq.supports(Facts(*facts[:9], "col" if facts[9] else "row", True, True, False))

    dev = torch.device("cuda", 0)
    base = (dev, torch.bfloat16, 512, 64, 128, torch.bfloat16, torch.int64, torch.float8_e4m3fnuz,
            torch.float8_e8m0fnu, False)
    monkeypatch.setattr(hq, "gpu_arch", lambda d: "gfx942")
    assert supports(base) is None
    assert supports(base[:4] + (32,) + base[5:8] + (torch.float32, True)) is None
    assert "float8_e4m3fnuz" in supports(base[:7] + (torch.float8_e4m3fn,) + base[8:])
    assert "packed UE8M0" in supports(base[:8] + (torch.int32, True))
    assert "head_dim 512" in supports((dev, torch.bfloat16, 128, 64) + base[4:])
    monkeypatch.setattr(hq, "gpu_arch", lambda d: "gfx950")
    assert supports(base[:7] + (torch.float8_e4m3fn,) + base[8:]) is None
    assert "float8_e4m3fn" in supports(base)
    assert "quantize=False" in hq.supports(Facts(*base[:7], torch.bfloat16, None, "row", False, True, False))
    for tiled in (("mfma_tile", True, True, False), ("row", True, False, False), ("col", True, True, False, True)):
        # every layout (the tiled kernel), in gfx950's fp8 format
        assert hq.supports(Facts(*base[:7], torch.float8_e4m3fn, base[8], *tiled)) is None, tiled
    monkeypatch.setattr(hq, "gpu_arch", lambda d: "gfx90a")
    assert "gfx942/gfx950" in supports(base)
    monkeypatch.setattr(hq, "gpu_arch", lambda d: "sm_90")
    assert "gfx942/gfx950" in supports(base)


def test_hip_ext_sources_and_reasons():
    import torch

    from fusedrope import hip_ext

    names = [p.name for p in hip_ext.sources()]
    assert "inverse_rope_group_quant.hip" in names and "inverse_rope_group_quant_torch.cpp" in names
    if not torch.version.hip:
        assert "ROCm" in hip_ext.toolkit_reason()
        assert hip_ext.available(torch.device("cpu"))


def test_hip_build_targets_exactly_its_archs(tmp_path, monkeypatch):
    """torch's JIT build adds an --offload-arch of its own for every arch in PYTORCH_ROCM_ARCH (ROCm images set
    long lists) before our flags: the build sees it set to the kernels' archs only, then the caller's again."""
    import os

    from torch.utils import cpp_extension

    from fusedrope import hip_ext

    def load(**kw):  # hipcc's target flags as cpp_extension.load composes them: its own, then extra_cuda_cflags
        flags = cpp_extension._get_rocm_arch_flags(["-DWITH_HIP"]) + kw["extra_cuda_cflags"]
        seen.extend(f for f in flags if "offload-arch" in f or "amdgpu-target" in f)

    seen, image_list = [], "gfx90a;gfx942;gfx1100"
    monkeypatch.setenv("PYTORCH_ROCM_ARCH", image_list)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", load)
    archs = hip_ext.arch_list()
    assert archs == "gfx942"
    hip_ext.EXT._build("fusedrope_hip_test", archs, verbose=False)
    assert seen == ["--offload-arch=gfx942"]
    assert os.environ["PYTORCH_ROCM_ARCH"] == image_list


def test_hipified_copies_are_not_sources(tmp_path, monkeypatch):
    """On ROCm, torch's hipify writes ``*_hip.*`` copies beside the sources; building them too would define every
    kernel twice, and hashing them would change the build name after the first build."""
    from fusedrope import hip_ext

    for name in ("k.hip", "k_hip.hip", "b_torch.cpp", "b_torch_hip.cpp", "k.h", "k_hip.h"):
        (tmp_path / name).write_text("//")
    monkeypatch.setattr(hip_ext.EXT, "kernel_dir", lambda: tmp_path)
    monkeypatch.setattr(hip_ext.EXT, "sibling_headers", ())
    assert [p.name for p in hip_ext.EXT.sources()] == ["k.hip", "b_torch.cpp"]
    assert sorted(p.name for p in hip_ext.EXT.hashed_files()) == ["b_torch.cpp", "k.h", "k.hip"]


def test_hip_build_name_covers_the_shared_cuda_header(tmp_path, monkeypatch):
    from fusedrope import hip_ext

    kdir, shared = tmp_path / "kernels_hip", tmp_path / "kernels_cuda"
    kdir.mkdir()
    shared.mkdir()
    (kdir / "k.hip").write_text('#include "../kernels_cuda/common.h"\n')
    (kdir / "b_torch.cpp").write_text("//")
    (shared / "common.h").write_text("// v1\n")
    (shared / "k.cu").write_text("// a CUDA kernel: not the HIP build's\n")
    monkeypatch.setattr(hip_ext.EXT, "kernel_dir", lambda: kdir)
    monkeypatch.setattr(hip_ext.EXT, "arch_list", lambda: "gfx942")
    monkeypatch.setattr(hip_ext.EXT, "toolkit_version", lambda: "6.4")
    assert [p.name for p in hip_ext.EXT.hashed_files()] == ["b_torch.cpp", "k.hip", "common.h"]
    before = hip_ext.EXT.ext_name()
    (shared / "common.h").write_text("// v2\n")
    assert hip_ext.EXT.ext_name() != before
