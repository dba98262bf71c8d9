"""CPU checks of the inverse_rope_group_quant CUDA kernels (kernels_cuda/inverse_rope_group_quant.cu):

* nvcc compiles it for sm_90 into exactly the kernels kernels_cuda/README.md lists (the generic kernel and the head
  kernel), and the SASS has 16-byte loads of o and stores of x_fp8 (LDG.E.128 / STG.E.128), packed hardware E4M3
  conversions, the butterfly shuffles of the quant blocks, no local memory; the head kernel has no branch (its
  layout is compile-time) and every lane rotates a rope pair;
* sm_80, sm_100 and sm_120 compile too (software fp8 on sm_80), without local memory;
* the whole kernels run on the CPU in lockstep host emulation
  (tests/inverse_rope_group_quant/test_inverse_rope_group_quant_emulated.py, shared with the HIP kernel), and the
  shared scalar math alone (every bf16/fp16 value, fp8 ties, scale boundaries), the launcher's arguments and the
  token division are checked in tests/inverse_rope_group_quant/test_inverse_rope_group_quant_common.py;
* what each kernel issues per byte is gated by tests/test_issue_budget.py.

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
F32_CACHE, BF16_CACHE = 2, 0  # kF32, kBF16 (inverse_rope_group_quant_common.h)
ROW_MAJOR, STRIDED = 0, 1     # kRowMajorE8m0, kStridedScales


def _generic(names) -> dict[str, tuple[int, int]]:
    """{name: (o dtype, quant group)} of the irgq_kernel<dtype, Q> instantiations: exactly 8."""
    got = {n: tuple(int(g) for g in m.groups()) for n in names if (m := re.search(r"irgq_kernelILi(\d+)ELi(\d+)EE", n))}
    assert sorted(got.values()) == sorted((dt, q) for dt in (0, 1) for q in GROUPS), got
    return got


def _head(names) -> dict[str, tuple[int, int, int]]:
    """{name: (quant group, cache dtype, scales)} of the irgq_head_kernel<Q, cache, scales> instantiations: 16."""
    got = {n: tuple(int(g) for g in m.groups())
           for n in names if (m := re.search(r"irgq_head_kernelILi(\d+)ELi(\d+)ELi(\d+)EE", n))}
    want = sorted((q, c, sc) for q in GROUPS for c in (F32_CACHE, BF16_CACHE) for sc in (ROW_MAJOR, STRIDED))
    assert sorted(got.values()) == want, got
    return got


def _wide(ops, kind: str) -> int:
    return sum(bool(re.fullmatch(rf"{kind}\.E(\.\w+)*\.128(\.CONSTANT)?", o)) for o in ops)


def _pdl_and_order(name, ops) -> None:
    """Every load before the first store; PDL's wait before the first load, its go-ahead between the last load and
    the first store (griddepcontrol.wait: ACQBULK; launch_dependents: PREEXIT)."""
    loads = [i for i, o in enumerate(ops) if o.startswith("LDG")]
    first_store = next(i for i, o in enumerate(ops) if o.startswith("STG"))
    assert loads[-1] < first_store, f"{name}: loads after the first store"
    assert ops.count("ACQBULK") == 1 and ops.index("ACQBULK") < loads[0], f"{name}: no wait before the loads"
    assert ops.count("PREEXIT") == 1 and loads[-1] < ops.index("PREEXIT") < first_store, name


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100", "sm_120"])
def test_instantiations_and_no_local_memory(arch):
    """Exactly the 24 kernels kernels_cuda/README.md lists, none spilling."""
    cubin = nvcc_cubin(KERNEL, arch)
    usage = resource_usage(cubin)
    assert len(usage) == len(_generic(usage)) + len(_head(usage)) == 24, sorted(usage)
    for name, res in usage.items():
        assert res["local"] == 0 and res["stack"] == 0, f"{arch} {name}: {res}"


def test_generic_kernel_sm90_sass():
    """One chunk per thread: two 16-byte loads of o, one 16-byte store, 8 packed E4M3 conversions, log2(Q/16)
    butterfly shuffles."""
    cubin = nvcc_cubin(KERNEL, "sm_90")
    funcs = sass_functions(sass(cubin))
    for name, (dt, q) in _generic(funcs).items():
        ops = opcodes(funcs[name])
        first_ldg = next(o for o in ops if o.startswith("LDG"))
        assert re.fullmatch(r"LDG\.E(\.\w+)*\.128", first_ldg), f"{name}: o's first load is {first_ldg}"
        assert _wide(ops, "LDG") >= 2 + 6 and _wide(ops, "STG") >= 1, name  # o, and both cos/sin row paths
        _pdl_and_order(name, ops)
        f2fp = [o for o in ops if o.startswith("F2FP") and "E4M3" in o]
        assert len(f2fp) >= 8 and all("SATFINITE" in o and "PACK" in o for o in f2fp), f"{name}: {f2fp}"
        assert sum(o.startswith("SHFL.BFLY") for o in ops) == int(math.log2(q // 16)), name


def test_head_kernel_sm90_sass():
    """A warp per (token, head): no branch on the layout (compile-time); the row-major kernel's warps past the last
    token exit, the strided kernel's skip to the scale exchange (one uniform branch after a vote, so no divergence
    path around the shuffles); two 16-byte loads of o and a predicated 16-byte store per lane, one 4-byte
    load of o and one of cos and sin (fp32) for the lane's rope pair, its 2-byte fp8 store; 9 packed E4M3
    conversions (8 for the chunk, packed bf16 scaling before them, 1 for the pair); the shuffles of the chunks'
    blocks (log2(Q/16)), of the rope tail's block (4 for Q = 32, else 5), the scale's broadcast to the pairs (and
    Q = 32's second tail block); the strided-scale kernels exchange the scale bytes of 8 tokens in shared memory
    behind one barrier."""
    cubin = nvcc_cubin(KERNEL, "sm_90")
    funcs, usage = sass_functions(sass(cubin)), resource_usage(cubin)
    for name, (q, cache, scales) in _head(funcs).items():
        ops = opcodes(funcs[name])
        # after the barrier the strided-scale kernels branch on the scale format and the padding rows; the BRA
        # after the row-major kernel's last EXIT is the end's trap loop
        upto = ops.index("BAR.SYNC.DEFER_BLOCKING") if scales == STRIDED else max(
            i for i, o in enumerate(ops) if o == "EXIT")
        branches = [o for o in ops[:upto] if o.startswith("BRA") or o.startswith("WARPSYNC")]
        assert branches == (["BRA"] if scales == STRIDED else []), f"{name}: {branches}"
        assert ops.count("VOTE.ALL") == (scales == STRIDED), name
        assert _wide(ops, "LDG") == 2 and _wide(ops, "STG") == 1, name
        cache_loads = sum(o == ("LDG.E.CONSTANT" if cache == F32_CACHE else "LDG.E.U16.CONSTANT") for o in ops)
        assert cache_loads == 2 and ops.count("STG.E.U16") == 1, f"{name}: {cache_loads} cos/sin loads"
        _pdl_and_order(name, ops)
        f2fp = [o for o in ops if o.startswith("F2FP") and "E4M3" in o]
        assert len(f2fp) == 9 and sum(o.startswith("HMUL2.BF16") or o.startswith("HFMA2.MMA.BF16") for o in ops) == 8
        shuffles = int(math.log2(q // 16)) + (4 if q == 32 else 5) + (2 if q == 32 else 1)
        assert sum(o.startswith("SHFL") for o in ops) == shuffles, f"{name}: {sum(o.startswith('SHFL') for o in ops)}"
        assert ops.count("BAR.SYNC.DEFER_BLOCKING") == (scales == STRIDED), name
        assert usage[name]["registers"] <= 64, f"{name}: {usage[name]}"


def test_sm80_sass_software_fp8():
    cubin = nvcc_cubin(KERNEL, "sm_80")
    funcs = sass_functions(sass(cubin))
    for name in funcs:
        ops = opcodes(funcs[name])
        assert any(re.fullmatch(r"LDG\.E(\.\w+)*\.128", o) for o in ops), f"{name}: no 128-bit global load"
        assert not [o for o in ops if o.startswith("F2FP") and "E4M3" in o], "sm_80 has no E4M3 conversion"
        assert "ACQBULK" not in ops and "PREEXIT" not in ops, f"{name}: griddepcontrol before sm_90"


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

    def head(**change):
        return cq.head_supports(base._replace(**change))

    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_90")
    assert reason() is None and reason(quant_group_size=32, scale_layout="col") is None
    assert reason(scale_dtype=torch.float32) is None and reason(pdl=True) is None
    assert "e4m3fn" in reason(fp8_dtype=torch.float8_e4m3fnuz)
    assert "packed UE8M0" in reason(scale_dtype=torch.int32)
    assert "head_dim 512" in reason(head_dim=256) and "rope_dim 64" in reason(rope_dim=128)
    assert "quantize=False" in reason(quantize=False, fp8_dtype=torch.bfloat16, scale_dtype=None)
    assert "mfma_tile" in reason(scale_layout="mfma_tile") and "mfma_tile" in head(scale_layout="mfma_tile")
    # what only the head kernel writes: cuda says which backend does; cuda_head serves it, opt-in
    for change, what in ((dict(x_contiguous=False), "group-major"), (dict(scale_layout="col", scale_pad=True),
                                                                       "padding rows")):
        assert what in reason(**change) and "cuda_head" in reason(**change), change
        assert head(**change) is None and "GPU" in cq.head_opt_in(base._replace(**change)), change
    assert head() is None and head(cache_dtype=torch.float32) is None
    assert "bfloat16 o" in head(o_dtype=torch.float16) and "int64" in head(positions_dtype=torch.int32)
    assert "caches" in head(cache_dtype=torch.float16)
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_80")
    assert reason() is None and "sm_90" in reason(pdl=True)
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "sm_75")
    assert "sm_80" in reason() and "sm_80" in head()
    monkeypatch.setattr(cq, "gpu_arch", lambda d: "gfx942")
    assert "NVIDIA" in reason()
