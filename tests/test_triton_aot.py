"""The Triton kernels compile ahead of time for sm_90, sm_80, gfx942 and gfx950 (no GPU needed), the quant kernel in
both fp8 formats, and their o / q / k / fp8 accesses are 16 bytes wide with no local memory or scratch: the
performance intent, checked on CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # compiles every kernel for four targets, under two Tritons in CI


# Triton 3.6.0 (what torch 2.11's CUDA wheels bring, and the oldest Triton we test on GPUs) is older than this
# environment's: CI makes a venv with it (borrowing .venv's other packages) and names its python here, so every
# check below also runs under it.
DEVICE_TRITON_ENV = "FUSEDROPE_DEVICE_TRITON_PYTHON"


@pytest.fixture(scope="module", params=["this-env", "device-triton"])
def counts(request, tmp_path_factory):
    python = sys.executable
    if request.param == "device-triton":
        python = os.environ.get(DEVICE_TRITON_ENV, "")
        if not python:
            pytest.skip(f"set {DEVICE_TRITON_ENV} to a Python with triton==3.6.0 (the oldest Triton tested on "
                        "GPUs) to compile under it too; `bash .ci/run` makes one")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    # An empty cache: every kernel really compiles (Triton 3.6's gfx950 fnuz failure shows only after a gfx942
    # compile in the same process, which a cached gfx942 kernel skips).
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp(f"triton-cache-{request.param}"))
    out = subprocess.run([python, str(ROOT / "tests" / "support" / "triton_aot.py")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    if request.param == "device-triton":
        version = subprocess.run([python, "-c", "import triton; print(triton.__version__)"], capture_output=True,
                                 text=True, env=env).stdout.strip()
        assert version == "3.6.0", f"{DEVICE_TRITON_ENV} has triton {version!r}, expected 3.6.0"
    return result


@pytest.mark.parametrize("target", ["sm_90", "sm_80", "gfx942", "gfx950"])
def test_tts_rope_moves_heads_in_16_byte_accesses(counts, target):
    """q, k and their outputs: every access 128-bit (10 loads and 10 stores a thread at wide_heads); the token's
    cos and sin rows (shared by every head) at most 4 narrow loads; no local memory."""
    c = counts[f"tts_rope/{target}"]
    if target.startswith("sm_"):
        assert c["sass_ldg128"] == 10 and c["ld"] - c["sass_ldg128"] <= 4 and c["sass_local"] == 0, c
        assert c["sass_stg128"] == c["st"] == 10, c
    else:
        assert c["load_x4"] == 10 and c["loads"] - c["load_x4"] <= 4 and c["scratch"] == 0, c
        assert c["store_x4"] == c["stores"] == 10, c
    # Q's and K's tiles loaded before either is stored: one memory round trip per program, not two
    assert c["loads_after_first_store"] == 0, c


@pytest.mark.parametrize("kernel", ["tts_rope_eager", "tts_rope_table", "tts_qk_norm_rope"])
@pytest.mark.parametrize("target", ["sm_90", "sm_80", "gfx942", "gfx950"])
def test_tts_modes_keep_16_byte_accesses_and_one_round_trip(counts, target, kernel):
    """numerics="eager", cos/sin tables read at positions, and the fused q/k norm (with an fp32 table): q, k and
    their outputs move in 16-byte vectors; besides, the cos/sin rows, the norm weights and the token's position
    take at most 9 narrow loads (on AMD the position is a scalar-unit load, not counted). No local memory, and
    every load before the first store."""
    c = counts[f"{kernel}/{target}"]
    if target.startswith("sm_"):
        assert c["sass_ldg128"] == 10 and c["ld"] - c["sass_ldg128"] <= 9 and c["sass_stg128"] == c["st"] == 10, c
        assert c["sass_local"] == 0, c
    else:
        assert c["load_x4"] == 10 and c["loads"] - c["load_x4"] <= 9 and c["store_x4"] == c["stores"] == 10, c
        assert c["scratch"] == 0, c
    assert c["loads_after_first_store"] == 0, c


@pytest.mark.parametrize("warp_size", [32, 64])
def test_tts_launch_shape_takes_every_seed_shape_in_one_pass_of_16_byte_vectors(warp_size):
    """Q's and K's heads of every seed shape fit one round (one memory round trip per program) with no masked row
    (each tile exactly its heads: powers of two), and every thread owns at least 8 elements of Q's half-tile and
    of K's where K has that many for one warp: 16-byte bf16/fp16 vectors (GQA's few K heads narrower ones)."""
    from fusedrope.qwen3_tts_rope import triton as tts
    from fusedrope.testing import TTS_SHAPES

    for _, hq, hkv in TTS_SHAPES.values():
        block_d, block_hq, block_hk, warps = tts.launch_shape(hq, hkv, 128, warp_size)
        assert block_d == 64 and (block_hq, block_hk) == (hq, hkv), (hq, hkv, block_hq, block_hk)
        threads = warps * warp_size
        assert block_hq * block_d // threads >= 8, (hq, hkv, warps)
        assert block_hk * block_d // threads >= 8 or warps == 1, (hq, hkv, warps)
    assert tts.launch_shape(64, 8, 128, warp_size)[1] == 32  # beyond that, several rounds of the widest tile


@pytest.mark.parametrize("fmt", ["fn", "fnuz"])
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("target", ["sm_90", "sm_80", "gfx942", "gfx950"])
def test_inverse_rope_quant_reads_o_and_writes_fp8_in_16_bytes(counts, target, group, fmt):
    # Every fp8 format compiles on every target, with the EXACT the launcher picks there (integer rounding for
    # fnuz off gfx942, and for e4m3fn before sm_89).
    c = counts[f"inverse_rope_quant_g{group}_{fmt}/{target}"]
    _assert_16_byte(c, target, 4, group)  # 64 elements per thread; the loads: o, the position, the cos/sin rows
    if target.startswith("sm_"):  # hardware e4m3x2 conversions for e4m3fn on sm_90
        assert c["cvt_e4m3"] >= 32 if (fmt, target) == ("fn", "sm_90") else c["cvt_e4m3"] == 0


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("target", ["sm_90", "sm_80", "gfx942", "gfx950"])
def test_inverse_rope_adds_only_the_cos_sin_exchange_to_the_quant(counts, target, group):
    """DeepSeek-V4's shape (head_dim 512, rope_dim 64) in the arch's own fp8 format: the rotation stays in the
    registers the tile was loaded into; the cos/sin rows, loaded once per thread group, reach the threads of each
    head's tail through shared memory (at most 10 accesses and 4 barriers more than the quant alone), and the
    fused kernel has fewer than 1.6 times the quant alone's instructions. (A per-pair cos/sin gather converted
    the whole tile through shared memory and back: on sm_90 with Triton 3.6 and 16 elements per thread, 776
    instructions, 89 shared-memory accesses and 13 barriers, where the quant alone had 304, 2 and 1.)"""
    import torch

    from fusedrope._device import arch_fp8_dtype

    fmt = "fnuz" if arch_fp8_dtype(target) == torch.float8_e4m3fnuz else "fn"
    fused, alone = counts[f"inverse_rope_quant_g{group}_{fmt}/{target}"], counts[f"quant_only_g{group}/{target}"]
    assert fused["shared"] <= alone["shared"] + 10 and fused["barriers"] <= alone["barriers"] + 4, (fused, alone)
    assert fused["instructions"] < 1.6 * alone["instructions"], (fused, alone)


@pytest.mark.parametrize("arch,fn_exact,fnuz_exact", [
    ("sm_90", False, True), ("sm_89", False, True), ("sm_100", False, True), ("sm_80", True, True),
    ("sm_86", True, True), ("gfx942", False, False), ("gfx950", False, True)])
def test_launcher_rounds_with_integer_ops_where_triton_has_no_conversion(monkeypatch, arch, fn_exact, fnuz_exact):
    """What the quant launcher passes as EXACT on a GPU, per arch: the hardware conversion, except integer
    rounding for fnuz where the hardware format is not fnuz and for e4m3fn before sm_89; the arch is looked up
    once per device and format."""
    import torch

    from fusedrope.inverse_rope_group_quant import triton as irq
    from fusedrope.testing import QuantCase, make_quant_inputs

    seen, looked_up = [], []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(kw["EXACT"])

    monkeypatch.setattr(irq, "INTERPRETED", False)
    monkeypatch.setattr(irq, "_group_quant_kernel", Recorder())
    monkeypatch.setattr(irq, "gpu_arch", lambda d: looked_up.append(d) or arch)
    irq._fp8_in_software.cache_clear()
    try:
        o, pos, cos, sin = make_quant_inputs(QuantCase(1, 16, 2))
        for fp8 in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e4m3fnuz):
            x, s = torch.empty(1, 2, 4096, dtype=fp8), torch.empty(1, 2, 32, dtype=torch.uint8)
            irq.inverse_rope_group_quant(o, pos, cos, sin, x, s, 128)
            assert seen[-1] == irq.integer_fp8_rounding(fp8, arch)  # the AOT check compiles this EXACT
    finally:
        irq._fp8_in_software.cache_clear()
    assert seen == [fn_exact, fnuz_exact, fnuz_exact] and len(looked_up) == 2


def _arch_format(target: str) -> str:
    import torch

    from fusedrope._device import arch_fp8_dtype

    return "fnuz" if arch_fp8_dtype(target) == torch.float8_e4m3fnuz else "fn"


def _assert_16_byte(c: dict, target: str, stores: int, group: int = 128, padding_branch: bool = True) -> None:
    """o's eight 16-byte loads per thread (64 bf16), the position and the cos/sin rows besides; ``stores``
    16-byte stores of x (fp8: 4 of 16 values; bf16: 8) and, quantized, one scale store per quant block a
    thread's 64 values span, at most as many again in the branch of the programs that hold padding rows only
    (``padding_branch``: LLVM may sink a zero store and the main path's into one); nothing spilled."""
    narrow = (stores == 4) * max(1, 64 // group)
    most = narrow * (1 + padding_branch)
    if target.startswith("sm_"):
        assert c["sass_ldg128"] == 8 and c["ld"] - c["sass_ldg128"] <= 3 and c["sass_local"] == 0, c
        assert c["sass_stg128"] == stores and narrow <= c["st"] - stores <= most, c
    else:
        assert c["load_x4"] == 8 and c["loads"] - c["load_x4"] <= 3 and c["scratch"] == 0, c
        assert c["store_x4"] == stores and narrow <= c["stores"] - stores <= most, c
    assert c["loads_after_first_store"] == 0, c


@pytest.mark.parametrize("layout", ["group_major", "padded"])
@pytest.mark.parametrize("target", ["sm_90", "sm_80", "gfx942", "gfx950"])
def test_group_major_and_padded_x_compile_to_the_row_major_kernel(counts, target, layout):
    """x's token and group strides are run-time arguments; vLLM's group-major [G, S, Dg] storage and a row-padded
    buffer have strides divisible by 16 as the row-major x has, so Triton specialises them alike: the same
    kernel, its 16-byte o loads and fp8 stores (DeepSeek-V4's tiles lie in one group: one scalar group per
    program, from the grid)."""
    row_major = counts[f"inverse_rope_quant_g128_{_arch_format(target)}/{target}"]
    assert counts[f"x_{layout}/{target}"] == row_major
    _assert_16_byte(row_major, target, 4)


@pytest.mark.parametrize("target", ["sm_90", "sm_80", "gfx942", "gfx950"])
def test_new_layouts_keep_16_byte_accesses_and_add_no_shared_memory(counts, target):
    """mfma scale tiles (both k alignments), quantize=False (bf16 x, two 16-byte stores a thread, row-major and
    group-major alike), and a head_dim whose tiles straddle groups (Dg 384 in a 1024-column tile: the group of
    each column found by compares against the boundaries, which Triton sees change only every 16 columns). The
    straddling tile adds no barrier to the row-major kernel's (storing it per quant block, reshaped to 3-D, had
    added 4 shared-memory accesses and 2 barriers)."""
    row_major = counts[f"inverse_rope_quant_g128_{_arch_format(target)}/{target}"]
    for name, stores in (("mfma_tile_g128", 4), ("mfma_tile_g32", 4), ("straddling_group_major", 4),
                         ("quantize_false", 8), ("quantize_false_group_major", 8)):
        c = counts[f"{name}/{target}"]
        _assert_16_byte(c, target, stores, 32 if name.endswith("g32") else 128 if "mfma" in name else 64,
                        padding_branch=not name.startswith("mfma"))
        if stores == 4:
            # the head_dim-192 tile straddling groups: its own cos/sin exchange (rope_dim 32), at most 8 accesses
            more = 8 if name.startswith("straddling") else 0
            assert c["shared"] <= row_major["shared"] + more and c["barriers"] <= row_major["barriers"], (name, c)
    assert counts[f"straddling_group_major/{target}"] == counts[f"straddling_row/{target}"]
    assert counts[f"quantize_false_group_major/{target}"] == counts[f"quantize_false/{target}"]
    # no quant: no scale exchange, the cos/sin rows' only (as in the quantizing kernel: 6 accesses at most)
    assert counts[f"quantize_false/{target}"]["shared"] <= 6


@pytest.mark.parametrize("target", ["sm_90", "sm_80", "gfx942", "gfx950"])
def test_every_other_specialisation_compiles(counts, target):
    # 18 TTS dtype x head_dim variants (plain; eager numerics with an fp32 table, int32 positions and the q/k
    # norm), 2 multimodal RoPE variants, 6 quant shape x scale-format variants, 11 output-layout variants (tiles
    # straddling groups, packed scales there, mfma tiles, quantize=False, x strides not divisible by 16, plain
    # fp32 scales, n32k4 tiles), the baseline's rope kernel.
    assert counts[f"variants/{target}"]["compiled"] == 38
