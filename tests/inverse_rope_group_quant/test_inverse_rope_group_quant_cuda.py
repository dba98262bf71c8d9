"""CPU checks of the inverse_rope_group_quant CUDA kernel (kernels_cuda/inverse_rope_group_quant.cu):

* nvcc compiles it for sm_90 into exactly the kernels kernels_cuda/README.md lists (the default launch's generic
  kernels and the experiments'), and the SASS has 16-byte global loads and stores (LDG.E.128 / STG.E.128), packed
  hardware E4M3 conversions (F2FP.SATFINITE.E4M3.F32.PACK_AB...), butterfly shuffles whose count grows with
  the quant group (group 32 needs fewer than group 128: the seed's weakness), and no local memory;
* sm_80 compiles too (software fp8, no F2FP E4M3 there);
* the whole kernel runs on the CPU in lockstep host emulation
(tests/inverse_rope_group_quant/test_inverse_rope_group_quant_emulated.py, shared with
  the HIP kernel), and the shared scalar math alone (every bf16/fp16 value, fp8 ties, scale boundaries), the
  launcher's arguments and the token division are checked in
  tests/inverse_rope_group_quant/test_inverse_rope_group_quant_common.py.

The hardware conversion path itself runs only on a GPU: test_inverse_rope_group_quant_gpu.py checks it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from compile_cache import CUDA_CPU_WHEEL_STUBS, cuda_include_dir, torch_syntax_check
from kernel_asm import nvcc_cubin, opcodes, resource_usage, sass, sass_functions

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "kernels_cuda" / "inverse_rope_group_quant.cu"
HEADER = ROOT / "kernels_cuda" / "inverse_rope_group_quant.cuh"
GROUPS = (32, 64, 128, 256)


def _kernels(text: str) -> dict[str, str]:
    funcs = {n: s for n, s in sass_functions(text).items() if "irgq_kernel" in n}
    assert funcs, "no irgq_kernel in the SASS"
    return funcs


def _variant_of(name: str) -> tuple[int, int, bool, int]:
    """(o dtype, quant group, tail warps, fast-layout cache dtype or -1) of an
    irgq_kernel<dtype, Q, tail warps, kFastCache> instantiation's mangled name."""
    m = re.search(r"irgq_kernelILi(\d+)ELi(\d+)ELb([01])ELi(n?\d+)E", name)
    assert m, name
    return int(m.group(1)), int(m.group(2)), m.group(3) == "1", int(m.group(4).replace("n", "-"))


F32_CACHE, BF16_CACHE, GENERIC = 2, 0, -1  # kF32, kBF16, kGenericLayout (inverse_rope_group_quant_common.h)
# The instantiations kernels_cuda/README.md lists, per (o dtype, group): the default launch's generic kernel, and the
# experiments' tail-warps kernel (generic layout) and fast-layout kernels (fp32 and bf16 cache), one chunk per thread
VARIANTS = {(False, GENERIC), (True, GENERIC), (False, F32_CACHE), (False, BF16_CACHE)}
KERNEL_COUNT = 2 * 4 * len(VARIANTS)


def _check_instantiations(names) -> None:
    got = sorted(_variant_of(n) for n in names)
    want = sorted((dt, q, tw, fast) for dt in (0, 1) for q in GROUPS for tw, fast in VARIANTS)
    assert got == want and len(names) == KERNEL_COUNT, got


# ------------------------------------------------------------------------------------------------ SASS checks
def test_sm90_sass_vector_io_hw_e4m3_no_local_memory():
    cubin = nvcc_cubin(KERNEL, "sm_90")
    funcs = _kernels(sass(cubin))
    usage = resource_usage(cubin)
    # {bf16, fp16} x {32, 64, 128, 256} x {generic, tail warps (generic), fast layout with an fp32 / a bf16 cache}
    _check_instantiations(funcs)
    shuffles = {}
    sizes = {}
    for name, text in funcs.items():
        ops = opcodes(text)
        dt, q, tw, fast = _variant_of(name)  # one chunk per thread: every count below is per chunk
        ldg128 = sum(bool(re.fullmatch(r"LDG\.E(\.\w+)*\.128(\.CONSTANT)?", o)) for o in ops)
        stg128 = sum(bool(re.fullmatch(r"STG\.E(\.\w+)*\.128", o)) for o in ops)
        first_ldg = next(o for o in ops if o.startswith("LDG"))
        assert re.fullmatch(r"LDG\.E(\.\w+)*\.128", first_ldg), f"{name}: o's first load is {first_ldg}"
        # o: 2 per chunk; aligned cos/sin rows: 2 x (2 fp32 / 1 bf16 or fp16): 6 in the generic kernel (it has
        # both paths), 4 in the fast fp32-cache one, 2 in the bf16 one
        rows = {GENERIC: 6, F32_CACHE: 4, BF16_CACHE: 2}[fast]
        assert ldg128 >= 2 + rows, f"{name}: {ldg128} LDG.E.128 (expected 2 for o + {rows} rows)"
        # cos/sin rows through the read-only path, and every load issued before the first store: no chain of
        # o -> position -> cos -> sin -> store -> next chunk's loads (two waves of loads instead)
        assert sum(o == "LDG.E.128.CONSTANT" for o in ops) >= rows, f"{name}: cos/sin rows not read-only loads"
        first_store = next(i for i, o in enumerate(ops) if o.startswith("STG"))
        late = [o for o in ops[first_store:] if o.startswith("LDG")]
        assert not late, f"{name}: {len(late)} loads after the first store ({late[:3]})"
        # programmatic dependent launch: the wait for the previous grid (griddepcontrol.wait: ACQBULK) before the
        # first global load, the next grid's go-ahead (griddepcontrol.launch_dependents: PREEXIT) after the last
        # load and before the first store
        loads = [i for i, o in enumerate(ops) if o.startswith("LDG")]
        assert ops.count("ACQBULK") == 1 and ops.index("ACQBULK") < loads[0], f"{name}: no wait before the loads"
        assert ops.count("PREEXIT") == 1 and loads[-1] < ops.index("PREEXIT") < first_store, (
            f"{name}: PREEXIT not between the last load and the first store")
        assert stg128 >= 1, f"{name}: {stg128} STG.E.128 (one 16-byte fp8 store per chunk)"
        if fast != GENERIC:  # the fast layout is 16-byte aligned: no narrow path for o, x_fp8 or the cache left
            narrow = [o for o in ops if re.fullmatch(r"(LDG|STG)\.E\.(U|S)?16(\.CONSTANT)?", o)]
            assert not narrow, f"{name}: 16-bit global accesses in the fast-layout kernel: {narrow[:3]}"
            # one 32-bit read-only load (an int32 position) and one byte store (the e8m0 scale) at most; the generic
            # kernel has 17 of each (the fp32 cache's and x_fp8's narrow paths)
            assert sum(o == "LDG.E.CONSTANT" for o in ops) <= 1, f"{name}: narrow fp32 cache loads"
            assert sum(o == "STG.E.U8" for o in ops) <= 1, f"{name}: byte stores of x_fp8"
        f2fp = [o for o in ops if o.startswith("F2FP") and "E4M3" in o]
        assert f2fp, f"{name}: no packed hardware E4M3 conversion (F2FP...E4M3)"
        assert all("SATFINITE" in o and "PACK" in o for o in f2fp), f2fp
        # 16 values per chunk -> 8 packed conversions per chunk
        assert len(f2fp) >= 8, f"{name}: {len(f2fp)} F2FP E4M3"
        assert not [o for o in ops if o.startswith(("LDL", "STL"))], f"{name}: local memory in SASS"
        res = usage[name]
        assert res["local"] == 0 and res["stack"] == 0, f"{name}: {res}"
        # __launch_bounds__(256, 6) on the fast-layout kernels: 48 warps per SM
        if fast != GENERIC:
            assert res["registers"] <= 40, f"{name}: {res['registers']} registers (6 blocks of 256 need <= 40)"
        shuffles.setdefault(q, set()).add(sum(o.startswith("SHFL.BFLY") for o in ops))
        sizes[(dt, q, tw, fast)] = len(ops)
        print(f"sm_90 {name}: {res['registers']} registers, stack {res['stack']}, local {res['local']}, "
              f"{len(ops)} instructions, {len(f2fp)} F2FP E4M3, {sum(o.startswith('SHFL') for o in ops)} SHFL")
    # log2(Q/16) butterfly steps per chunk: 1, 2, 3, 4 shuffles per chunk
    for q, counts in shuffles.items():
        assert counts == {int(math.log2(q // 16))}, f"group {q}: shuffle counts per chunk {counts}"
    # the fast-layout kernels fold the per-call layout branches away: under half the generic kernel's size
    for (dt, q, tw, fast), n in sizes.items():
        if fast != GENERIC:
            generic = sizes[(dt, q, tw, GENERIC)]
            assert n * 2 < generic, f"fast kernel {(dt, q, tw, fast)}: {n} instructions against {generic} generic"


def _tiled_kernels(cubin) -> dict[str, tuple[int, int]]:
    """{name: (o dtype, quant group)} of the irgq_tiled_kernel<dtype, Q> instantiations: exactly 8."""
    names = {n: re.search(r"irgq_tiled_kernelILi(\d+)ELi(\d+)E", n) for n in sass_functions(sass(cubin))
             if "irgq_tiled_kernel" in n}
    got = {n: (int(m.group(1)), int(m.group(2))) for n, m in names.items()}
    assert sorted(got.values()) == sorted((dt, q) for dt in (0, 1) for q in GROUPS), got
    return got


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tiled_kernel_sass_stages_scales_in_shared_memory(arch):
    """The tiled kernel (4 tokens of one head per warp, in 2 rounds of 2): 16-byte o loads and x_fp8 stores for
    each token, a round's loads before its first store (PDL's wait before the first load, its go-ahead after the
    last), log2(Q/16) shuffles per token, the scale bytes stored to shared memory, one barrier, then read back and
    written to global memory: no 32-bit (fp32 scale) global store before the barrier and no x_fp8 store after it;
    no local memory, at most 128 registers (2 blocks of 256 threads per SM)."""
    cubin = nvcc_cubin(KERNEL, arch)
    funcs, usage = sass_functions(sass(cubin)), resource_usage(cubin)
    for name, (dt, q) in _tiled_kernels(cubin).items():
        ops = opcodes(funcs[name])
        ldg128 = sum(bool(re.fullmatch(r"LDG\.E(\.\w+)*\.128(\.CONSTANT)?", o)) for o in ops)
        stg128 = sum(bool(re.fullmatch(r"STG\.E(\.\w+)*\.128", o)) for o in ops)
        assert ldg128 >= 4 * 2 and stg128 >= 4, f"{name}: {ldg128} LDG.E.128, {stg128} STG.E.128"
        stores = [i for i, o in enumerate(ops) if o.startswith("STG")]
        loads = [i for i, o in enumerate(ops) if o.startswith("LDG")]
        first_round = [o for o in ops[:stores[0]] if re.fullmatch(r"LDG\.E(\.\w+)*\.128", o)]
        assert len(first_round) >= 2 * 2, f"{name}: {len(first_round)} 16-byte o loads before the first store"
        bars = [i for i, o in enumerate(ops) if o.startswith("BAR")]
        assert len(bars) == 1 and ops[bars[0]].startswith("BAR.SYNC"), f"{name}: barriers {[ops[i] for i in bars]}"
        bar = bars[0]
        before, after = ops[:bar], ops[bar:]
        assert any(o.startswith("STS") for o in before) and any(o.startswith("LDS") for o in after), name
        assert not [o for o in before if re.fullmatch(r"STG\.E(\.STRONG\.\w+)?", o)], f"{name}: fp32 scale store early"
        assert not [o for o in after if o.endswith(".128")], f"{name}: an x_fp8 store after the barrier"
        assert "STG.E.U8" in after and any(re.fullmatch(r"STG\.E(\.STRONG\.\w+)?", o) for o in after), (
            f"{name}: no byte and fp32 scale stores after the barrier")
        assert sum(o.startswith("SHFL.BFLY") for o in ops) == 4 * int(math.log2(q // 16)), name
        if arch == "sm_90":
            assert ops.count("ACQBULK") == 1 and ops.index("ACQBULK") < loads[0], name
            assert ops.count("PREEXIT") == 1 and loads[-1] < ops.index("PREEXIT") < bar, name
            assert len([o for o in ops if o.startswith("F2FP") and "E4M3" in o]) >= 4 * 8, name
        res = usage[name]
        assert res["local"] == 0 and res["stack"] == 0 and res["registers"] <= 128, f"{name}: {res}"
        print(f"{arch} tiled {dt} {q}: {res['registers']} registers, shared {res['shared']}, {len(ops)} instructions")


@pytest.mark.parametrize("arch", ["sm_100", "sm_120"])
def test_blackwell_no_local_memory_and_bounded_fast_kernels(arch):
    """__launch_bounds__(256, 6) holds the fast-layout kernels to 40 registers without spilling on Blackwell too
    (the generic kernels, which would spill there, are not bounded); the tiled kernels do not spill either."""
    cubin = nvcc_cubin(KERNEL, arch)
    usage = resource_usage(cubin)
    for name in _tiled_kernels(cubin):
        assert usage[name]["local"] == 0 and usage[name]["stack"] == 0, f"{arch} {name}: {usage[name]}"
    names = [n for n in usage if "irgq_kernel" in n]
    _check_instantiations(names)
    for name in names:
        res = usage[name]
        assert res["local"] == 0 and res["stack"] == 0, f"{arch} {name}: {res}"
        if _variant_of(name)[3] != GENERIC:
            assert res["registers"] <= 40, f"{arch} {name}: {res['registers']} registers"


def test_sm80_sass_software_fp8_no_local_memory():
    cubin = nvcc_cubin(KERNEL, "sm_80")
    funcs = _kernels(sass(cubin))
    usage = resource_usage(cubin)
    _check_instantiations(funcs)
    for name, text in funcs.items():
        ops = opcodes(text)
        assert any(re.fullmatch(r"LDG\.E(\.\w+)*\.128", o) for o in ops), f"{name}: no 128-bit global load"
        assert not [o for o in ops if o.startswith("F2FP") and "E4M3" in o], "sm_80 has no E4M3 conversion"
        assert "ACQBULK" not in ops and "PREEXIT" not in ops, f"{name}: griddepcontrol before sm_90"
        assert usage[name]["local"] == 0 and usage[name]["stack"] == 0, usage[name]
        print(f"sm_80 {name}: {usage[name]['registers']} registers")


# ------------------------------------------------------------------------------------ binding and selection
@pytest.mark.slow  # a C++ compile against torch's headers
def test_torch_binding_compiles_against_torch_headers(tmp_path):
    """g++ -fsyntax-only of the torch binding with this torch's headers and the CUDA toolkit's (the CPU wheel
    lacks one generated c10/cuda header: a stub stands in). Catches API mistakes before a GPU build."""
    cuda_inc = cuda_include_dir()
    if cuda_inc is None:
        pytest.skip("needs the CUDA toolkit headers (cuda_runtime_api.h under $CUDA_HOME or /usr/local/cuda)")
    torch_syntax_check(HEADER.parent / "inverse_rope_group_quant_torch.cpp", tmp_path, CUDA_CPU_WHEEL_STUBS,
                       [cuda_inc, HEADER.parent])


def test_cuda_backend_supports(monkeypatch):
    from fusedrope.inverse_rope_group_quant import Facts
    from fusedrope.inverse_rope_group_quant import cuda as cq

    base = Facts(torch.device("cuda", 0), torch.bfloat16, 512, 64, 128, torch.bfloat16, torch.int64,
                 torch.float8_e4m3fn, torch.float8_e8m0fnu, "row", True, True, False)

    def reason(**change):
        return cq.supports(base._replace(**change))

    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_90")
    assert reason() is None and reason(quant_group_size=32, scale_layout="col") is None
    assert reason(scale_dtype=torch.float32) is None and reason(pdl=True) is None
    assert "e4m3fn" in reason(fp8_dtype=torch.float8_e4m3fnuz)
    assert "packed UE8M0" in reason(scale_dtype=torch.int32)
    assert "head_dim 512" in reason(head_dim=256) and "rope_dim 64" in reason(rope_dim=128)
    assert "quantize=False" in reason(quantize=False, fp8_dtype=torch.bfloat16, scale_dtype=None)
    # every layout; what only the tiled kernel writes is opt-in (auto passes over it, backend="cuda" runs it)
    tiled = dict(scale_layout="mfma_tile"), dict(x_contiguous=False), dict(scale_layout="col", scale_pad=True)
    for change, what in zip(tiled, ("mfma_tile", "group-major", "padding rows")):
        assert reason(**change) is None and what in cq.opt_in(base._replace(**change)), change
    assert cq.opt_in(base) is None and cq.opt_in(base._replace(scale_layout="col")) is None
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_80")
    assert reason() is None and "sm_90" in reason(pdl=True)
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_75")
    assert "sm_80" in reason()
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "gfx942")
    assert "NVIDIA" in reason()
