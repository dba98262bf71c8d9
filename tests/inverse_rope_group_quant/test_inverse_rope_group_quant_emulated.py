"""Both hand-written inverse_rope_group_quant kernels, whole and unchanged (kernels_cuda/...cu with its launcher,
kernels_hip/...hip with its launcher), run on the CPU in lockstep host emulation: every work-item is a thread,
cross-lane reads (CUDA __shfl_xor_sync in warps of 32, HIP DPP in 16-lane rows of a wave64) happen in lockstep,
and a read from a lane that did not take part is an error (tests/support/lockstep.h, tests/support/cuda_emul/,
tests/support/hip_emul/).

The output must equal fusedrope.reference byte for byte, every output byte written (poisoned buffers), over the
seed shapes, all group sizes, both scale layouts and formats, both fp8 types, bf16/fp16 o, bf16/fp16/fp32
strided caches, int32/int64 strided positions (some out of range), the narrow paths for a misaligned o,
NaN/Inf blocks and partial last blocks; for CUDA both kernels, the generic one (the default launch, in 256-thread
blocks) and the head kernel (kernel=1; where a call is outside it, the launcher takes the generic one), which alone
writes group-major or padded x_fp8 and padding rows; under AddressSanitizer on exact-size allocations; and mutated
copies of each kernel's block reductions, fp8 packing and indexing must fail.

Each kernel also runs with its hardware fp8 path switched on, through a model of the conversion: the CUDA kernel
as for sm_90 (__nv_cvt_float2_to_fp8x2, tests/support/cuda_emul/cuda_fp8.h), the HIP kernel as for gfx942 and gfx950
(v_cvt_pk_fp8_f32, tests/support/hip_emul/hip_emul.h). That checks the kernels' use of the instructions (format per
arch, clamping or saturation, byte and word order), not the silicon's rounding.

Not covered here: the real conversion instructions (the SASS/ISA tests check they are used), timing, and the
CUDA/HIP runtimes and torch bindings.
"""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fusedrope.testing import QuantCase

from irgq_harness import (CUDA_SRC, HIP_SRC, asan_runtime, check_emulated, emul_stats, emulate, emulated_kernel,
                          quant_inputs, quant_outputs)
from irgq_layouts import DEEPSEEK, check_layout

GROUPS = (32, 64, 128, 256)
# cuda / hip: the software fp8 paths; cuda-sm90, hip-gfxN: the hardware conversion paths, through models
VENDORS = ("cuda", "cuda-sm90", "hip", "hip-gfx942", "hip-gfx950")
HEAD = {"cuda-head": "cuda", "cuda-sm90-head": "cuda-sm90"}  # the CUDA launcher asked for the head kernel


@pytest.fixture(scope="module", params=VENDORS + tuple(HEAD))
def lib(request):
    lib = emulated_kernel(HEAD.get(request.param, request.param))
    lib.vendor = request.param
    lib.launch = dict(kernel=1) if request.param in HEAD else {}
    return lib


def chunks_per_thread(lib) -> int:
    """Chunks per thread: the CUDA kernel's 1, the HIP kernel's 2."""
    return 1 if lib.vendor.startswith("cuda") else 2


def cuda_launch(threads: int, block: int = 256) -> tuple[int, int]:
    """(grid, block) of a CUDA launch of ``threads`` threads in blocks of ``block`` (the default: 256)."""
    return -(-threads // block), block


def expected_launch(lib, S: int, H: int, G: int = 1) -> tuple[int, int]:
    """(blocks, block) of the launch of S tokens of H heads: the generic kernels' blocks of 256 threads over the
    chunks, the head kernel's (token rows / 8, H / G, G) blocks of 8 warps."""
    if lib.launch.get("kernel"):
        return -(-S // 8) * H, 256
    return cuda_launch(-(-S * H * 32 // chunks_per_thread(lib)))


def _run_checked(lib, *args, **kw):
    lib.emul_reset()
    check_emulated(lib, *args, **{**getattr(lib, "launch", {}), **kw})
    st = emul_stats(lib)
    assert st["errors"] == 0, st["first_error"]
    return st


def head_shuffles(q: int) -> int:
    """The head kernel's shuffles per lane: the chunks' blocks, the rope tail's block (16 lanes for Q = 32), the
    scale broadcast to the pairs, and Q = 32's second tail block."""
    return int(math.log2(q // 16)) + (4 if q == 32 else 5) + (2 if q == 32 else 1)


@pytest.mark.parametrize("q", GROUPS)
def test_seed_shapes_all_groups_both_layouts(lib, q):
    for H, G in ((16, 2), (8, 1)):
        for transpose in (False, True):
            o, p, c, s = quant_inputs(5, H, seed=q + H + transpose)
            st = _run_checked(lib, o, p, c, s, G, q, transpose)
            grid, block = expected_launch(lib, 5, H, G)
            assert st["launches"] == 1 and (st["grid"], st["block"]) == (grid, block), st
            if lib.launch.get("kernel"):  # the 5 tokens' warps shuffle; the 3 past them exit (row-major scales),
                # or all 8 first vote on whether they hold a token (5 butterfly steps in the emulation)
                want = 32 * H * (5 * head_shuffles(q) + (8 * 5 if transpose else 0))
            else:  # every work-item does log2(q/16) cross-lane steps for each of its u chunks, valid or not
                want = grid * block * chunks_per_thread(lib) * int(math.log2(q // 16))
            assert st["exchanges"] == want, st


@pytest.mark.parametrize("case", [
    dict(dtype=torch.float16, cache_dtype=torch.float32, pos_dtype=torch.int32, strided_cache=True,
         strided_pos=True, H=3, G=3, q=64),
    dict(dtype=torch.bfloat16, cache_dtype=torch.float16, strided_cache=True, H=5, G=1, q=32, transpose=True),
    dict(dtype=torch.bfloat16, cache_dtype=torch.float32, H=4, G=4, q=256, fp8=torch.float8_e4m3fnuz),
    dict(dtype=torch.float16, cache_dtype=torch.bfloat16, H=16, G=2, q=128, scale=torch.float32, transpose=True),
    dict(dtype=torch.bfloat16, cache_dtype=torch.bfloat16, H=16, G=8, q=32, fp8=torch.float8_e4m3fnuz,
         scale=torch.uint8),
    dict(dtype=torch.bfloat16, cache_dtype=torch.bfloat16, H=16, G=2, q=128, misaligned=True),
    dict(dtype=torch.float16, cache_dtype=torch.float32, H=7, G=7, q=256, misaligned=True, transpose=True,
         scale=torch.float32),
], ids=["fp16-f32cache-int32pos-H3", "bf16-f16cache-colmajor-H5", "fnuz-q256", "f32scale-colmajor",
        "fnuz-uint8scale-q32", "misaligned-o", "misaligned-o-f32scale-colmajor-H7"])
def test_layouts_dtypes_and_narrow_paths(lib, case):
    o, p, c, s = quant_inputs(3, case["H"], dtype=case["dtype"], cache_dtype=case["cache_dtype"],
                              pos_dtype=case.get("pos_dtype", torch.int64),
                              strided_cache=case.get("strided_cache", False),
                              strided_pos=case.get("strided_pos", False), misaligned=case.get("misaligned", False),
                              seed=len(str(case)))
    _run_checked(lib, o, p, c, s, case["G"], case["q"], case.get("transpose", False),
                 case.get("fp8", torch.float8_e4m3fn), case.get("scale", torch.float8_e8m0fnu))


@pytest.mark.parametrize("scale_dtype", [torch.float8_e8m0fnu, torch.float32])
def test_column_major_scales_with_padded_tokens(lib, scale_dtype):
    """x_scale with strides (1, Ks*L, L), L > S (a max-size buffer sliced to this call's tokens), addressed as the
    bindings do (block stride = stride(2)): the S tokens of each column are written, the padding is not."""
    from fusedrope import reference as ref
    from fusedrope.testing import bytes_written_outside, guarded_poison

    S, H, G, q, L = 3, 16, 2, 64, 7
    o, p, c, s = quant_inputs(S, H, seed=41)
    x, _ = quant_outputs(o, G, q, True, scale_dtype=scale_dtype)
    ks = H * 512 // G // q
    sc, buf = guarded_poison((S, G, ks), scale_dtype, strides=(1, ks * L, L), lead=5, byte=0xA5)
    xr, sr = quant_outputs(o, G, q, True, scale_dtype=scale_dtype)
    assert emulate(lib, o, p, c, s, x, sc, q) == 0
    ref.inverse_rope_group_quant(o, p, c, s, xr, sr, q)
    assert bytes_written_outside(buf, sc, 0xA5) == 0
    assert torch.equal(sc.contiguous().view(torch.uint8), sr.contiguous().view(torch.uint8))
    assert torch.equal(x.view(torch.uint8), xr.view(torch.uint8))


@pytest.mark.parametrize("fp8_dtype,scale_dtype", [(torch.float8_e4m3fn, torch.float8_e8m0fnu),
                                                   (torch.float8_e4m3fnuz, torch.float8_e8m0fnu),
                                                   (torch.float8_e4m3fn, torch.float32)])
def test_special_blocks(lib, fp8_dtype, scale_dtype):
    """NaN / Inf only poison their own block (byte 0xFF, fp8 NaN; a float32 scale NaN); a zero block gets byte 92
    (2^-35); blocks of tiny and huge values; negative values rounding to zero (-0 in e4m3fn, +0 in fnuz)."""
    o, p, c, s = quant_inputs(4, 8, dtype=torch.float16, seed=3)
    o[0, 0, 0:32] = 0
    o[0, 1, 5] = float("nan")
    o[1, 2, 100] = float("inf")
    o[1, 3, 500] = float("-inf")  # inside the rope tail
    o[2, 4, 480] = float("nan")   # a tail pair: both values become NaN
    o[2, 5, 0:32] = torch.linspace(-6e-8, 6e-8, 32).half()
    o[3, 6, 64:96] = 65504.0
    o[3, 7, 0] = 1.0
    o[3, 7, 1:32] = -1e-6  # x 2^-8 < half the smallest subnormal
    for q in (32, 128, 256):
        for transpose in (False, True):
            _run_checked(lib, o, p, c, s, 2, q, transpose, fp8_dtype, scale_dtype)


@pytest.mark.parametrize("vendor,hw_fp8,per_chunk,launch", [
    ("cuda-sm90", torch.float8_e4m3fn, 8, {}), ("cuda-sm90", torch.float8_e4m3fn, 9, dict(kernel=1)),
    ("hip-gfx942", torch.float8_e4m3fnuz, 8, {}), ("hip-gfx950", torch.float8_e4m3fn, 8, {})],
    ids=["cuda-sm90", "cuda-sm90-head", "hip-gfx942", "hip-gfx950"])
def test_hardware_fp8_path_is_taken_for_its_format_only(vendor, hw_fp8, per_chunk, launch):
    """sm_90 and gfx950 convert OCP e4m3fn with the instruction and FNUZ in software; gfx942 the other way. 8
    conversions (pairs of pairs) per 16-element chunk, every chunk of every token; the head kernel's lanes one
    more for their rope pair."""
    lib = emulated_kernel(vendor)
    o, p, c, s = quant_inputs(2, 16, seed=len(vendor))
    for fp8 in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        lib.emul_hw_cvts()
        _run_checked(lib, o, p, c, s, 2, 128, False, fp8, **launch)
        n = lib.emul_hw_cvts()
        assert n == (2 * 16 * 32 * per_chunk if fp8 == hw_fp8 else 0), (vendor, fp8, n)


def test_token_count_not_a_multiple_of_the_block(lib):
    """S*H*32 chunks not a multiple of 512 (S not of 8 for the head kernel): the last block's idle lanes still
    take part in every cross-lane step and store nothing (the poisoned buffers prove it); S = 1 fills less than
    one block."""
    for S, H in ((1, 1), (1, 3), (3, 5)):
        o, p, c, s = quant_inputs(S, H, seed=S * 10 + H)
        st = _run_checked(lib, o, p, c, s, 1, 64, False)
        assert (st["grid"], st["block"]) == expected_launch(lib, S, H), st


@pytest.mark.slow  # S = 513: a thousand emulated blocks
def test_cuda_default_launch_takes_256_thread_blocks_at_every_size():
    """The default launch is one chunk per thread in blocks of 256 threads, whatever the grid size: S = 1 for
    H = 16 (2 blocks), S = 40 (80 blocks), S = 513 (1026 blocks), bit-exact against the reference. An error the
    caller had pending before a launch that succeeds is still pending after it (the launcher clears only its own)."""
    lib = emulated_kernel("cuda")
    for S, seed in ((1, 3), (40, 4), (513, 513)):
        o, p, c, s = quant_inputs(S, 16, seed=seed)
        st = _run_checked(lib, o, p, c, s, 2, 128, S == 40)
        assert st["launches"] == 1 and (st["grid"], st["block"]) == (S * 16 * 32 // 256, 256), (S, st)
    o, p, c, s = quant_inputs(1, 16, seed=3)
    try:
        lib.emul_set_last_error(700)
        _run_checked(lib, o, p, c, s, 2, 128, False)
        assert lib.emul_peek_last_error() == 700
    finally:
        lib.emul_set_last_error(0)


def test_cuda_programmatic_dependent_launch():
    """Params::pdl 1 launches through cudaLaunchKernelEx with programmatic stream serialization, 0 through
    cudaLaunchKernel; the same bytes either way, for both kernels (the kernels' griddepcontrol instructions exist
    from sm_90 only: the SASS test checks where they are); pdl other than 0 or 1 is kBadConfig; pdl 1 on a device
    that runs a kernel image compiled for an older arch (PTX version < 90: no wait in it) is kPdlUnsupported, no
    launch."""
    lib = emulated_kernel("cuda-sm90")
    lib.emul_last_pdl.restype = ctypes.c_int
    o, p, c, s = quant_inputs(3, 16, seed=9)
    for pdl in (1, 0, 1):
        for kernel in (0, 1):
            _run_checked(lib, o, p, c, s, 2, 128, False, pdl=pdl, kernel=kernel)
            assert lib.emul_last_pdl() == pdl
    _run_checked(lib, o, p, c, s, 2, 128, False)  # the default launch: no pdl
    assert lib.emul_last_pdl() == 0
    x, sc = quant_outputs(o, 2, 128, False)
    assert emulate(lib, o, p, c, s, x, sc, 128, pdl=2) == 6
    lib.emul_reset()
    try:
        lib.emul_set_ptx_version(80)
        assert emulate(lib, o, p, c, s, x, sc, 128, pdl=1) == 7  # kPdlUnsupported
        assert emul_stats(lib)["launches"] == 0
        _run_checked(lib, o, p, c, s, 2, 128, False)  # without pdl the same image runs
    finally:
        lib.emul_set_ptx_version(90)


def test_cuda_head_kernel_bad_configs():
    """kernel other than 0 or 1: kBadConfig (6); the head kernel where only it writes the layout but the call is
    outside it (fp16 o, int32 positions): kNotHeadLayout (8); both before any launch (mfma_tile's refusal:
    test_layouts_only_the_head_kernel_writes_take_it_by_default). Asked for on a call it does not serve where the
    generic one does, the launcher takes the generic kernel."""
    lib = emulated_kernel("cuda")
    o, p, c, s = quant_inputs(3, 16)
    x, sc = quant_outputs(o, 2, 128, False)
    lib.emul_reset()
    assert emulate(lib, o, p, c, s, x, sc, 128, kernel=2) == 6
    gm = torch.empty(2, 3, 4096, dtype=torch.float8_e4m3fn).permute(1, 0, 2)
    o16, p16, c16, s16 = quant_inputs(3, 16, dtype=torch.float16)
    assert emulate(lib, o16, p16, c16, s16, gm, sc, 128) == 8
    assert emulate(lib, o, p.to(torch.int32), c, s, gm, sc, 128) == 8
    assert emul_stats(lib)["launches"] == 0
    st = _run_checked(lib, o16, p16, c16, s16, 2, 128, False, kernel=1)
    assert (st["grid"], st["block"]) == cuda_launch(3 * 16 * 32), st  # the generic kernel


def test_empty_and_status_codes(lib):
    o, p, c, s = quant_inputs(2, 4)
    x, sc = quant_outputs(o, 1, 128, False)
    lib.emul_reset()
    assert emulate(lib, o, p, c, s, x, sc, 128, head_dim=256) == 1  # kUnsupportedShape
    assert emulate(lib, o, p, c, s, x, sc, 128, rope_dim=128) == 1
    assert emulate(lib, o, p, c, s, x, sc, 48) == 2                  # kBadGroup
    o0 = o[:0]
    x0, s0 = quant_outputs(o0, 1, 128, False)
    assert emulate(lib, o0, p, c, s, x0, s0, 128) == 0
    assert emul_stats(lib)["launches"] == 0  # S == 0: no launch


def _mutated_copy(tmp_path: Path, src_file: Path, old: str, new: str) -> Path:
    """A copy of a kernel source (with its headers and the shared one) in which ``old`` became ``new``."""
    src = src_file.read_text()
    assert old in src
    kdir = tmp_path / src_file.parent.name
    kdir.mkdir()
    for f in src_file.parent.glob("inverse_rope_group_quant*"):
        shutil.copy(f, kdir)
    (kdir / src_file.name).write_text(src.replace(old, new))
    (tmp_path / "kernels_cuda").mkdir(exist_ok=True)
    for shared in ("inverse_rope_group_quant_common.h", "pdl.cuh"):
        shutil.copy(CUDA_SRC.with_name(shared), tmp_path / "kernels_cuda")
    return kdir / src_file.name


E4M3, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
MUTATIONS = [  # (vendor, text, replacement, fp8 dtype, what goes wrong, quant group, launch)
    ("hip", "0x140, 0xF, 0xF", "0x141, 0xF, 0xF", E4M3, "scale mismatch", 256, {}),  # 16-lane step: half rows
    ("hip", "0xB1, 0xF, 0xF", "0xE4, 0xF, 0xF", E4M3, "scale mismatch", 256, {}),    # first step reads itself
    ("cuda", "off <<= 1) m = max", "off <<= 2) m = max", E4M3, "scale mismatch", 256, {}),  # steps skipped
    ("cuda", "__shfl_xor_sync(0xFFFFFFFFu, m, off)", "__shfl_xor_sync(0xFFFFFFFFu, m, 0)", E4M3,
     "scale mismatch", 256, {}),  # reads itself
    ("hip-gfx942", "cvt_pk_fp8_f32(v2, v3, w, true)", "cvt_pk_fp8_f32(v3, v2, w, true)", FNUZ,
     "fp8 bytes differ", 256, {}),  # the hardware path's bytes 2 and 3 swapped
    ("hip-gfx950", "cvt_pk_fp8_f32(v0, v1, 0, false)", "cvt_pk_fp8_f32(v0, v1, 0, true)", E4M3,
     "fp8 bytes differ", 256, {}),  # the first pair written to the high word, then overwritten
    ("cuda-sm90", "out[i] = byte == 0xFFu ? 0x7F7F7F7Fu : (lo | (hi << 16));",
     "out[i] = byte == 0xFFu ? 0x7F7F7F7Fu : (hi | (lo << 16));", E4M3, "fp8 bytes differ", 256, {}),  # pairs
    ("hip-gfx942", "return (unsigned)w & (((t + 0x7F7F7F7Fu) & 0x80808080u) | 0x7F7F7F7Fu);",
     "return (unsigned)w | (t & 0u);", FNUZ, "fp8 bytes differ", 256, {}),  # a signed zero left as 0x80 (NaN)
    # the head kernel: the rope tail's block without its rope-free chunks (Q >= 128); Q = 32's first tail block
    # given the second's maximum; the pairs' scale taken from a lane of another block; the packed bf16 scaling's
    # halves swapped; the tail reduction stopped at 16 lanes
    ("cuda-sm90", "if (kQ >= 128 && lane >= kTailBlockLane && body) t = max(t, chunk_m);", "", E4M3,
     "scale mismatch", 128, dict(kernel=1)),
    ("cuda-sm90", "kQ == 32 && lane < 30 ? t_other : t", "kQ == 32 && lane < 30 ? t : t_other", E4M3,
     "scale mismatch", 32, dict(kernel=1)),
    ("cuda-sm90", "kQ == 32 ? 28 + 2 * (lane / 16) : 31", "kQ == 32 ? 28 : 31", E4M3, "fp8 bytes differ", 32,
     dict(kernel=1)),
    ("cuda", "(e4m3x2(bits_to_float(y1 << 16), bits_to_float(y1 & 0xFFFF0000u)) << 16)",
     "(e4m3x2(bits_to_float(y1 & 0xFFFF0000u), bits_to_float(y1 << 16)) << 16)", E4M3, "fp8 bytes differ", 64,
     dict(kernel=1)),
    ("cuda", "off < (kQ == 32 ? 16u : 32u)", "off < 16u", E4M3, "scale mismatch", 128, dict(kernel=1)),
]
MUTATION_IDS = ["hip-row-mirror-as-half-mirror", "hip-identity-quad-perm", "cuda-skipped-steps", "cuda-self-shuffle",
                "gfx942-swapped-bytes", "gfx950-wrong-word", "sm90-swapped-pairs", "gfx942-negative-zero",
                "head-tail-block-without-body", "head-q32-tail-blocks", "head-pair-scale-lane", "head-swapped-halves",
                "head-short-tail-reduction"]


@pytest.mark.slow  # builds a mutated copy of the kernel: a check of the checks
@pytest.mark.parametrize("vendor,old,new,fp8,what,q,launch", MUTATIONS, ids=MUTATION_IDS)
def test_a_broken_kernel_is_caught(tmp_path, vendor, old, new, fp8, what, q, launch):
    """The check can fail: a copy of the kernel with its reduction, its fp8 packing or its indexing broken is
    caught."""
    src_file = HIP_SRC if vendor.startswith("hip") else CUDA_SRC
    bad = emulated_kernel(vendor, _mutated_copy(tmp_path, src_file, old, new))
    o, p, c, s = quant_inputs(2, 16, seed=7)
    with pytest.raises(AssertionError, match=what):
        # every 32 elements of a head their own magnitude, so that neighbouring blocks' scales differ at every
        # group size; the largest of the rope tail's block in its first rope dims (448..479), then in its dims
        # without rope (384..415)
        for magnitudes in ([0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 0, 1, 6, 2], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 0, 6, 1,
                                                                              2, 3]):
            scale = torch.exp2(torch.tensor(magnitudes, dtype=torch.float32).repeat_interleave(32))
            check_emulated(bad, (o.float() * scale).to(o.dtype), p, c, s, 2, q, False, fp8, **launch)


DIVERGENT = [  # a shuffle / the first DPP step made by even work-items only: their partners never take part
    ("cuda", "off < kLanes; off <<= 1) m = max", "off < kLanes && (threadIdx.x & 1) == 0; off <<= 1) m = max"),
    ("hip", "if (kLanes >= 2) x =", "if (kLanes >= 2 && (__builtin_amdgcn_workitem_id_x() & 1) == 0) x ="),
]


@pytest.mark.slow  # builds a mutated copy of the kernel: a check of the checks
@pytest.mark.parametrize("vendor,old,new", DIVERGENT, ids=["cuda", "hip"])
def test_divergent_cross_lane_reads_are_reported(tmp_path, vendor, old, new):
    """The emulators' own check can fire: a kernel copy whose odd lanes skip the butterfly is reported."""
    src_file = HIP_SRC if vendor == "hip" else CUDA_SRC
    lib = emulated_kernel(vendor, _mutated_copy(tmp_path, src_file, old, new))
    o, p, c, s = quant_inputs(1, 16, seed=1)
    x, sc = quant_outputs(o, 2, 64, False)
    lib.emul_reset()
    assert emulate(lib, o, p, c, s, x, sc, 64) == 0
    st = emul_stats(lib)
    assert st["errors"] > 0, st
    assert "did not make this exchange" in st["first_error"] or "disagree" in st["first_error"], st


ASAN_SCRIPT = r"""
import sys, torch
from irgq_harness import check_emulated, emul_stats, emulated_kernel, quant_inputs
lib = emulated_kernel(sys.argv[1], asan=True)
def exact(t):  # a copy in its own allocation of exactly its size (torch's CPU allocator goes through malloc)
    return torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t) if t.is_contiguous() else t
n = 0
for S, H, G, q, kw in ((3, 16, 2, 32, {}), (1, 3, 1, 256, dict(misaligned=True)),
                       (2, 5, 5, 64, dict(cache_dtype=torch.float32, pos_dtype=torch.int32)), (4, 8, 1, 128, {})):
    o, p, c, s = quant_inputs(S, H, seed=n, **kw)
    if not kw.get("misaligned"):
        o = exact(o)
    p, c, s = exact(p), exact(c), exact(s)
    for transpose in (False, True):
        for scale in (torch.float8_e8m0fnu, torch.float32):
            check_emulated(lib, o, p, c, s, G, q, transpose, scale_dtype=scale)
            n += 1
# the layouts only the CUDA head kernel and the HIP tiled kernel write: group-major x, padded column-major scales
# (and, HIP's, mfma_tile); CUDA's head kernel for the row-major ones too
from fusedrope.inverse_rope_group_quant import reference as R
from irgq_harness import emulate
hip = sys.argv[1].startswith("hip")
if not hip:
    for S, H, G, q in ((3, 16, 2, 32), (9, 8, 1, 128)):
        o, p, c, s = (exact(t) for t in quant_inputs(S, H, seed=S))
        check_emulated(lib, o, p, c, s, G, q, False, kernel=1)
        n += 1
for S, H, G, q in ((37, 16, 2, 128), (3, 8, 1, 32)):
    o, p, c, s = (exact(t) for t in quant_inputs(S, H, seed=S))
    dg, rows = H * 512 // G, S + 3
    ks = dg // q
    for layout in ("col", "mfma_tile") if hip else ("col",):
        outs = []
        for _ in range(2):
            x = torch.empty(G, S, dg, dtype=torch.float8_e4m3fn).permute(1, 0, 2)
            sc = (torch.empty(G, ks, rows, dtype=torch.uint8).permute(2, 0, 1) if layout == "col" else
                  torch.zeros(R.mfma_tile_shape(S, G, ks, q), dtype=torch.uint8))
            outs.append((x, sc))
        (x, sc), (xr, sr) = outs
        assert emulate(lib, o, p, c, s, x, sc, q, scale_layout=layout) == 0
        R.inverse_rope_group_quant(o, p, c, s, xr, sr, q, scale_layout=layout)
        assert torch.equal(x.view(torch.uint8), xr.view(torch.uint8)) and torch.equal(sc, sr)
        n += 1
st = emul_stats(lib)
assert st["errors"] == 0, st
print("ASAN RUN OK", n)
"""


@pytest.mark.slow
@pytest.mark.parametrize("vendor", VENDORS)
def test_stays_in_bounds_under_asan(tmp_path, vendor):
    """The kernel built with AddressSanitizer and the alignment check, on tensors in allocations of exactly their
    size: a read or write past the end of o, positions, cos, sin, x_fp8 or x_scale, or a misaligned vector
    access (the misaligned-o case), aborts the run."""
    rt = asan_runtime(vendor)
    if rt is None:
        pytest.skip("no AddressSanitizer runtime for the host compiler (apt-get install libclang-rt-19-dev for "
                    "clang, libasan for g++)")
    here = Path(__file__).resolve().parent
    env = dict(os.environ, LD_PRELOAD=rt, ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0",
               PYTHONPATH=os.pathsep.join([str(here.parents[1]), str(here.parent / "support"), str(here)]))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", ASAN_SCRIPT, vendor], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0 and "ASAN RUN OK" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]


@pytest.mark.parametrize("layout", ["row", "col", "group-major-x-padded-col", "mfma_tile"])
def test_backend_entry_splits_what_one_launch_cannot_index(layout, monkeypatch):
    """Past 2^31 16-element chunks of o (S*H*512/16) the compiled backends' entry (CompiledOp) launches the
    generic kernel on token ranges in turn. With its limit lowered to 3 tokens' worth, 10 tokens take launches of
    3, 3, 3 and 1 token of the emulated CUDA kernel, whose bytes (every one written) equal one reference call over
    all 10: each range gets its own positions and scale rows, the column-major scale slice included. The layouts
    of the head kernel (group-major x_fp8 with 12 scale rows for 10 tokens) and HIP's mfma_tile take one launch:
    those kernels address o and x_fp8 in 64 bits."""
    from fusedrope import reference as ref
    from fusedrope.inverse_rope_group_quant.cuda import CompiledOp

    emu = emulated_kernel("hip" if layout == "mfma_tile" else "cuda")
    o, p, c, s = quant_inputs(10, 4, seed=2)
    scale_layout = {"row": "row", "mfma_tile": "mfma_tile"}.get(layout, "col")

    def outputs():
        if layout == "group-major-x-padded-col":
            x = torch.full((2, 10, 1024), 0xA5, dtype=torch.uint8).view(torch.float8_e4m3fn).permute(1, 0, 2)
            buf = torch.full((2, 16, 16), 0xA5, dtype=torch.uint8).view(torch.float8_e8m0fnu)
            return x, buf.permute(2, 0, 1)[:12]  # [12, G, Ks], strides (1, Ks*16, 16)
        x, sc = quant_outputs(o, 2, 64, layout == "col")
        return (x, torch.full((2, 32, 16), 0xA5, dtype=torch.uint8)) if layout == "mfma_tile" else (x, sc)

    (x, sc), (xr, sr) = outputs(), outputs()
    launches = []

    def op(o, positions, cos, sin, x_fp8, x_scale, q, mfma, pdl, kernel):
        launches.append(o.shape[0])
        assert mfma == (scale_layout == "mfma_tile") and pdl == 0 and kernel == 0
        assert emulate(emu, o, positions, cos, sin, x_fp8, x_scale, q, scale_layout=scale_layout) == 0

    entry = CompiledOp(op)
    monkeypatch.setattr(entry, "max_chunks", 3 * 4 * 512 // 16 + 5)
    entry(o, p, c, s, x, sc, 64, scale_layout=scale_layout)
    assert launches == ([3, 3, 3, 1] if layout in ("row", "col") else [10])
    ref.inverse_rope_group_quant(o, p, c, s, xr, sr, 64, scale_layout=scale_layout)
    assert torch.equal(x.view(torch.uint8), xr.view(torch.uint8))
    assert torch.equal(sc.view(torch.uint8), sr.view(torch.uint8))
    if layout in ("row", "col"):
        launches.clear()
        entry(o[:3], p, c, s, x[:3], sc[:3], 64, scale_layout=scale_layout)  # within the limit: one launch
        assert launches == [3]


# -- the layouts only the CUDA head kernel and HIP's tiled kernel write: group-major / padded x, padding rows of
# column-major scales (and HIP's mfma_tile); the scales written in token order
LAYOUT_SCALES = [(torch.float8_e8m0fnu, "row"), (torch.uint8, "col"), (torch.float32, "col"),
                 (torch.float8_e8m0fnu, "mfma_tile"), (torch.uint8, "mfma_tile")]


def emulated_backend(lib, **launch):
    """A backend's run (irgq_layouts.check_layout calls it) on the emulated kernel; the launcher must say kOk."""
    def run(o, positions, cos, sin, x, x_scale, q, *, scale_layout="row"):
        lib.emul_reset()
        assert emulate(lib, o, positions, cos, sin, x, x_scale, q, scale_layout=scale_layout, **launch) == 0
        st = emul_stats(lib)
        assert st["errors"] == 0, st["first_error"]
        run.stats = st
    return run


def layout_blocks(vendor: str, S: int, H: int, G: int) -> int:
    """Blocks of the launch that writes those layouts: the CUDA head kernel's (token rows / 8) x H, HIP's tiled
    kernel's (token rows / 32) x H."""
    return -(-S // (32 if vendor.startswith("hip") else 8)) * H


LAYOUT_CASES = [pytest.param(vendor, x_layout, dtype, layout, id=f"{vendor}-{x_layout}-{str(dtype)[6:]}-{layout}",
                              marks=[pytest.mark.slow] if vendor not in ("cuda", "hip") else [])  # the others run
                 for vendor in ("cuda", "hip", "cuda-sm90", "hip-gfx942", "hip-gfx950")  # their paths elsewhere
                 for x_layout in ("group_major", "padded", "row") for dtype, layout in LAYOUT_SCALES
                 if not (layout == "mfma_tile" and vendor.startswith("cuda"))]  # gfx950's layout: HIP's only


@pytest.mark.parametrize("vendor,x_layout,scale_dtype,scale_layout", LAYOUT_CASES)
def test_head_and_tiled_kernel_layouts(vendor, x_layout, scale_dtype, scale_layout):
    """Every byte the reference's, nothing outside the outputs or in mfma padding written: S = 37 (4 full blocks of
    8 tokens and a partial one; a full and a partial 32-token tile), the DeepSeek-V4 shapes, groups 128 and 32."""
    run = emulated_backend(emulated_kernel(vendor), kernel=1)
    for i, (H, G) in enumerate(DEEPSEEK.values()):
        q = (128, 32)[i]
        check_layout(QuantCase(37, H, G, quant_group_size=q), x_layout, scale_dtype, scale_layout, seed=H + q,
                     backend=run, exact=True)
        assert (run.stats["grid"], run.stats["block"]) == (layout_blocks(vendor, 37, H, G), 256), run.stats


@pytest.mark.parametrize("x_layout,scale_layout", [("group_major", "row"), ("row", "mfma_tile")])
def test_layouts_only_the_head_kernel_writes_take_it_by_default(lib, x_layout, scale_layout):
    """... and mfma_tile, HIP's, the CUDA launcher refuses (kUnsupportedShape) before any launch."""
    if scale_layout == "mfma_tile" and lib.vendor.startswith("cuda"):
        o, p, c, s = quant_inputs(3, 16)
        x, _ = quant_outputs(o, 2, 128, False)
        lib.emul_reset()
        assert emulate(lib, o, p, c, s, x, torch.zeros(2, 32, 32, dtype=torch.uint8), 128,
                       scale_layout="mfma_tile", **lib.launch) == 1
        assert emul_stats(lib)["launches"] == 0
        return
    run = emulated_backend(lib)
    check_layout(QuantCase(5, 16, 2), x_layout, torch.float8_e8m0fnu, scale_layout, backend=run, exact=True)
    assert (run.stats["grid"], run.stats["block"]) == (16, 256), run.stats  # not the generic kernel's 10 or 5


def check_padding_rows(lib, S, rows, scale_dtype, **launch):
    """vLLM's x_scale: [rows, G, Ks] column-major over [G, Ks, L] storage (L = rows + 8, a max-size buffer); the
    rows past S are zeros, the bytes past rows in each column untouched."""
    from fusedrope.inverse_rope_group_quant import reference as R

    o, p, c, s = quant_inputs(S, 8, seed=S)
    G, q, L = 2, 64, rows + 8
    ks = 8 * 512 // G // q
    x, _ = quant_outputs(o, G, q, False, scale_dtype=scale_dtype)
    xr = x.clone()
    buf = torch.full((G, ks, L), -3.0).to(scale_dtype) if scale_dtype == torch.float32 else \
        torch.full((G, ks, L), 0xA5, dtype=torch.uint8).view(scale_dtype)
    bufr, before = buf.clone(), buf.clone()
    view = lambda b: b.permute(2, 0, 1)[:rows]  # noqa: E731  [rows, G, Ks], strides (1, Ks*L, L)
    lib.emul_reset()
    assert emulate(lib, o, p, c, s, x, view(buf), q, scale_layout="col", **launch) == 0
    R.inverse_rope_group_quant(o, p, c, s, xr, view(bufr), q, scale_layout="col")
    assert torch.equal(x.view(torch.uint8), xr.view(torch.uint8))
    assert torch.equal(buf.view(torch.uint8), bufr.view(torch.uint8))
    assert not buf[..., S:rows].view(torch.uint8).any()
    assert torch.equal(buf[..., rows:].view(torch.uint8), before[..., rows:].view(torch.uint8))
    return emul_stats(lib)


@pytest.mark.parametrize("scale_dtype", [torch.float8_e8m0fnu, torch.float32])
@pytest.mark.parametrize("S,rows", [(37, 40), (3, 64), (32, 33)])
def test_padding_rows_of_column_major_scales_are_zeros(lib, S, rows, scale_dtype):
    """Rows 64 against S = 3: blocks that hold padding only."""
    st = check_padding_rows(lib, S, rows, scale_dtype, **lib.launch)
    assert st["grid"] == layout_blocks(lib.vendor, rows, 8, 2), st


LAYOUT_MUTATIONS = [  # (vendor, text, replacement): the indexing of a kernel writing those layouts broken
    ("cuda", "uint32_t byte = 0;  // this lane's", "uint32_t byte = 127;  // this lane's"),
    ("cuda", "a.x_stride_g_bytes * blockIdx.z", "a.x_stride_s_bytes * blockIdx.z"),
    ("cuda", "const unsigned ts = blockIdx.x * kHeadTokens + i % kHeadTokens",
     "const unsigned ts = blockIdx.x * kHeadTokens + i % 4"),
    ("hip", "scales[t][lane / kLanes] =", "scales[t % 16][lane / kLanes] ="),
    ("hip", "(unsigned long long)a.x_stride_g_bytes * g", "(unsigned long long)a.x_stride_s_bytes * g"),
    ("hip", "if (a.mfma_k == 2) return tile + (k / 2) * 64 + (k % 2) * 2;",
     "if (a.mfma_k == 2) return tile + (k / 2) * 64 + (k % 2);"),  # mfma k%2 and token-half bits collide
]


@pytest.mark.slow  # builds mutated copies of the kernel: a check of the checks
@pytest.mark.parametrize("vendor,old,new", LAYOUT_MUTATIONS,
                         ids=["cuda-padding-rows", "cuda-group-stride", "cuda-token-run", "hip-token-half",
                              "hip-group-stride", "mfma-k-bit"])
def test_a_broken_layout_kernel_is_caught(tmp_path, vendor, old, new):
    copy = _mutated_copy(tmp_path, HIP_SRC if vendor == "hip" else CUDA_SRC, "", "")  # with its headers
    mutated = next(f for f in sorted(tmp_path.rglob("*")) if f.is_file() and old in f.read_text()
                   and f.suffix in (copy.suffix, ".h"))
    mutated.write_text(mutated.read_text().replace(old, new))
    bad = emulated_kernel(vendor, copy)
    layouts = [("group_major", "col")] + ([("row", "mfma_tile")] if vendor == "hip" else [])
    with pytest.raises(AssertionError):
        for x_layout, scale_layout in layouts:
            case = QuantCase(37, 16, 2)
            check_layout(case, x_layout, torch.uint8, scale_layout, backend=emulated_backend(bad), exact=True)
        check_padding_rows(bad, 37, 40, torch.uint8)
