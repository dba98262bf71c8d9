"""CPU checks of the inverse_rope_group_quant CUDA kernel (kernels_cuda/inverse_rope_group_quant.cu):

* nvcc compiles it for sm_90 and the SASS has 16-byte global loads and stores (LDG.E.128 / STG.E.128), packed
  hardware E4M3 conversions (F2FP.SATFINITE.E4M3.F32.PACK_AB...), butterfly shuffles whose count grows with
  the quant group (group 32 needs fewer than group 128: the seed's weakness), and no local memory;
* sm_80 compiles too (software fp8, no F2FP E4M3 there);
* the kernel's own per-chunk / per-block math (the __host__ __device__ functions of the .cuh and of the header
  it shares with the HIP kernel, magic-number token division included) compiled with g++ and run on the CPU
  gives bit-exact scale bytes and fp8 bytes against fusedrope.reference, over both scale layouts, all group
  sizes, dtypes, strides, clamped positions and NaN / Inf / zero blocks. The shared scalar math alone (every
  bf16/fp16 value, fp8 ties, scale boundaries), the launcher's arguments and the token division are checked in
  tests/test_irgq_common.py.

The hardware conversion path itself runs only on a GPU: gpu/check_inverse_rope_group_quant.py checks it.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from irgq_harness import check_emulated as _check
from irgq_harness import emulate as _emulate
from irgq_harness import harness as _harness
from irgq_harness import quant_inputs as _inputs
from irgq_harness import quant_outputs as _outputs
from kernel_asm import nvcc_cubin, opcodes, resource_usage, sass, sass_functions

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "kernels_cuda" / "inverse_rope_group_quant.cu"
HEADER = ROOT / "kernels_cuda" / "inverse_rope_group_quant.cuh"
GROUPS = (32, 64, 128, 256)


def _kernels(text: str) -> dict[str, str]:
    funcs = {n: s for n, s in sass_functions(text).items() if "irgq_kernel" in n}
    assert funcs, "no irgq_kernel in the SASS"
    return funcs


def _group_of(name: str) -> int:
    m = re.search(r"irgq_kernelILi(\d+)ELi(\d+)E", name)
    assert m, name
    return int(m.group(2))


# ------------------------------------------------------------------------------------------------ SASS checks
def test_sm90_sass_vector_io_hw_e4m3_no_local_memory():
    cubin = nvcc_cubin(KERNEL, "sm_90")
    funcs = _kernels(sass(cubin))
    usage = resource_usage(cubin)
    assert len(funcs) == 8, sorted(funcs)  # {bf16, fp16} x {32, 64, 128, 256}
    shuffles = {}
    for name, text in funcs.items():
        ops = opcodes(text)
        q = _group_of(name)
        ldg128 = sum(bool(re.fullmatch(r"LDG\.E(\.\w+)*\.128", o)) for o in ops)
        stg128 = sum(bool(re.fullmatch(r"STG\.E(\.\w+)*\.128", o)) for o in ops)
        # o: 2 per chunk x 2 chunks per lane = 4; aligned cos/sin rows: 2 x (1 bf16/fp16 or 2 fp32) x 2 chunks
        # = 12
        first_ldg = next(o for o in ops if o.startswith("LDG"))
        assert re.fullmatch(r"LDG\.E(\.\w+)*\.128", first_ldg), f"{name}: o's first load is {first_ldg}"
        assert ldg128 >= 16, f"{name}: {ldg128} LDG.E.128 (expected 4 for o + 12 for the cos/sin rows)"
        assert stg128 >= 2, f"{name}: {stg128} STG.E.128 (one 16-byte fp8 store per chunk, 2 chunks per lane)"
        f2fp = [o for o in ops if o.startswith("F2FP") and "E4M3" in o]
        assert f2fp, f"{name}: no packed hardware E4M3 conversion (F2FP...E4M3)"
        assert all("SATFINITE" in o and "PACK" in o for o in f2fp), f2fp
        # 16 values per chunk -> 8 packed conversions per chunk, 2 chunks per lane
        assert len(f2fp) >= 16, f"{name}: {len(f2fp)} F2FP E4M3"
        assert not [o for o in ops if o.startswith(("LDL", "STL"))], f"{name}: local memory in SASS"
        u = usage[name]
        assert u["local"] == 0 and u["stack"] == 0, f"{name}: {u}"
        shuffles.setdefault(q, set()).add(sum(o.startswith("SHFL.BFLY") for o in ops))
        print(f"sm_90 {name}: {u['registers']} registers, stack {u['stack']}, local {u['local']}, "
              f"{len(f2fp)} F2FP E4M3, {sum(o.startswith('SHFL') for o in ops)} SHFL")
    # log2(Q/16) butterfly steps per chunk, 2 chunks per lane: 2, 4, 6, 8 shuffles
    for q, counts in shuffles.items():
        assert counts == {2 * int(math.log2(q // 16))}, f"group {q}: shuffle counts {counts}"


def test_sm80_sass_software_fp8_no_local_memory():
    cubin = nvcc_cubin(KERNEL, "sm_80")
    funcs = _kernels(sass(cubin))
    usage = resource_usage(cubin)
    for name, text in funcs.items():
        ops = opcodes(text)
        assert any(re.fullmatch(r"LDG\.E(\.\w+)*\.128", o) for o in ops), f"{name}: no 128-bit global load"
        assert not [o for o in ops if o.startswith("F2FP") and "E4M3" in o], "sm_80 has no E4M3 conversion"
        assert usage[name]["local"] == 0 and usage[name]["stack"] == 0, usage[name]
        print(f"sm_80 {name}: {usage[name]['registers']} registers")


# ---------------------------------------------------------------------------------------- CPU emulation (g++)
def test_emulated_kernel_matches_reference_seed_shapes():
    lib = _harness()
    for (H, G) in ((16, 2), (8, 1)):
        for q in GROUPS:
            for transpose in (False, True):
                o, p, c, s = _inputs(7, H, seed=q + H)
                _check(lib, o, p, c, s, G, q, transpose)


@pytest.mark.parametrize("case", [
    dict(dtype=torch.float16, cache_dtype=torch.float32, pos_dtype=torch.int32, strided_cache=True,
         strided_pos=True, H=3, G=3, q=64),
    dict(dtype=torch.bfloat16, cache_dtype=torch.float16, pos_dtype=torch.int64, strided_cache=True, H=5, G=1,
         q=32, transpose=True),
    dict(dtype=torch.bfloat16, cache_dtype=torch.float32, H=4, G=4, q=256, fp8=torch.float8_e4m3fnuz),
    dict(dtype=torch.float16, cache_dtype=torch.bfloat16, H=16, G=2, q=128, scale=torch.float32,
         transpose=True),
    dict(dtype=torch.bfloat16, cache_dtype=torch.bfloat16, H=16, G=8, q=32, fp8=torch.float8_e4m3fnuz,
         scale=torch.uint8),
], ids=["fp16-f32cache-int32pos-H3", "bf16-f16cache-colmajor-H5", "fnuz-q256", "f32scale-colmajor",
        "fnuz-uint8scale-q32"])
def test_emulated_kernel_matches_reference_layouts(case):
    lib = _harness()
    o, p, c, s = _inputs(6, case["H"], dtype=case["dtype"], cache_dtype=case["cache_dtype"],
                         pos_dtype=case.get("pos_dtype", torch.int64),
                         strided_cache=case.get("strided_cache", False),
                         strided_pos=case.get("strided_pos", False), seed=len(str(case)))
    _check(lib, o, p, c, s, case["G"], case["q"], case.get("transpose", False),
           case.get("fp8", torch.float8_e4m3fn), case.get("scale", torch.float8_e8m0fnu))


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_emulated_kernel_special_blocks(fp8_dtype):
    """NaN / Inf only poison their own block (byte 0xFF, fp8 NaN); a zero block gets byte 92; blocks of tiny
    and huge values; negative values rounding to zero (-0 in e4m3fn, +0 in fnuz)."""
    lib = _harness()
    o, p, c, s = _inputs(4, 8, dtype=torch.float16, seed=3)
    o[0, 0, 0:32] = 0
    o[0, 1, 5] = float("nan")
    o[1, 2, 100] = float("inf")
    o[1, 3, 500] = float("-inf")       # inside the rope tail
    o[2, 4, 480] = float("nan")        # tail pair partner of 481: both values of the pair become NaN
    o[2, 5, 0:32] = torch.linspace(-6e-8, 6e-8, 32).half()  # below the 1e-8 floor's reach: fp16 subnormals
    o[3, 6, 64:96] = 65504.0
    o[3, 7, 0] = 1.0
    o[3, 7, 1:32] = -1e-6              # x 2^-8 < half the smallest subnormal: -0 (e4m3fn) / +0 (fnuz)
    for q in (32, 128):
        for transpose in (False, True):
            _check(lib, o, p, c, s, 2, q, transpose, fp8_dtype)


def test_emulated_status_codes():
    lib = _harness()
    o, p, c, s = _inputs(2, 4)
    x, sc = _outputs(o, 1, 128, False)
    assert _emulate(lib, o, p, c, s, x, sc, 128, head_dim=256) == 1  # kUnsupportedShape
    assert _emulate(lib, o, p, c, s, x, sc, 128, rope_dim=128) == 1
    assert _emulate(lib, o, p, c, s, x, sc, 48) == 2                  # kBadGroup


# ------------------------------------------------------------------------------------ binding and selection
def _torch_includes() -> list[str]:
    from torch.utils.cpp_extension import include_paths

    return include_paths()


def test_torch_binding_compiles_against_torch_headers(tmp_path):
    """g++ -fsyntax-only of the torch binding with this torch's headers and the CUDA toolkit's (the CPU wheel
    lacks one generated c10/cuda header: a stub stands in). Catches API mistakes before a GPU build."""
    gxx = shutil.which("g++")
    cuda_inc = Path("/usr/local/cuda/include")
    if gxx is None or not (cuda_inc / "cuda_runtime_api.h").exists():
        pytest.skip("needs g++ and the CUDA toolkit headers (/usr/local/cuda/include)")
    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cmd = [gxx, "-std=c++17", "-fsyntax-only", "-w", "-I", str(tmp_path),
           *[f"-I{p}" for p in _torch_includes()], "-I", str(cuda_inc), "-I", str(HEADER.parent),
           str(HEADER.parent / "inverse_rope_group_quant_torch.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_cuda_backend_supports(monkeypatch):
    from fusedrope import cuda_inverse_rope_quant as cq

    dev = torch.device("cuda", 0)
    base = (dev, torch.bfloat16, 512, 64, 128, torch.bfloat16, torch.int64, torch.float8_e4m3fn,
            torch.float8_e8m0fnu, False)
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_90")
    assert cq.supports(base) is None
    assert cq.supports(base[:4] + (32,) + base[5:9] + (True,)) is None
    assert cq.supports(base[:8] + (torch.float32, False)) is None
    assert "e4m3fn" in cq.supports(base[:7] + (torch.float8_e4m3fnuz,) + base[8:])
    assert "packed UE8M0" in cq.supports(base[:8] + (torch.int32, False))
    assert "head_dim 512" in cq.supports((dev, torch.bfloat16, 256, 64) + base[4:])
    assert "rope_dim 64" in cq.supports((dev, torch.bfloat16, 512, 128) + base[4:])
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_75")
    assert "sm_80" in cq.supports(base)
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "gfx942")
    assert "NVIDIA" in cq.supports(base)


def test_gpu_check_script_cpu_selftest(tmp_path):
    """gpu/check_inverse_rope_group_quant.py's plumbing (inputs, poisoning, comparisons, reports) on CPU."""
    import sys

    script = ROOT / "gpu" / "check_inverse_rope_group_quant.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script), "--cpu-selftest", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "correctness  yes" in proc.stdout
    for f in ("results.json", "bench.csv", "bench.md"):
        assert (tmp_path / f).exists(), f
