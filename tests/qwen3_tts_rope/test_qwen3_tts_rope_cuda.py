"""The hand-written CUDA kernel of qwen3_tts_rope, checked without a GPU.

1. nvcc compiles kernels_cuda/qwen3_tts_rope.cu for sm_80 and sm_90; the SASS of the 16-byte path moves data with
   128-bit global loads/stores, the narrow paths with 32-/16-bit ones, and no kernel touches local memory.
2. The same source, compiled by the host C++ compiler against tests/support/cuda_emul (a bit-exact host model of the
   few CUDA intrinsics it uses, every thread run in turn; tests/support/tts_emulator.py), runs the whole contract
   suite of tests/qwen3_tts_rope as the backend ``cuda_emulated``. Here, what the contract does not reach: every
   vector path the launcher picks and why, every launch shape it makes, the modes at every width with their
   threads in lockstep, the launcher's own refusals and empty calls, and out-of-bounds writes; built with
   AddressSanitizer and the alignment check, on tensors in exact-size allocations, it must not read or write
   out of bounds, nor make a misaligned vector access (a fault on the GPU), either.
3. On this CPU machine the registry falls back from ``cuda`` and says why; the torch binding compiles against
   torch's headers (syntax only: a CPU torch cannot link a CUDA extension).
On a GPU the real extension is checked by test_qwen3_tts_rope_gpu.py (and the rest of the suite).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

import fusedrope
from fusedrope import cuda_ext
from fusedrope.qwen3_tts_rope import Facts
from fusedrope.qwen3_tts_rope import cuda as cuda_tts_rope
from fusedrope.reference import neox_rope, qwen3_tts_rope_oracle
from fusedrope.reference import qwen3_tts_rope as qwen3_tts_rope_reference
from fusedrope.testing import (TTS_CASES, TtsCase, assert_tts_rope_close, assert_ulp_close, bytes_written_outside,
                               guarded_poison, make_tts_inputs, own_batch_strides)

import kernel_asm as K
from compile_cache import ASAN_FLAGS, CUDA_CPU_WHEEL_STUBS, cuda_include_dir, host_cxx, torch_syntax_check
from tts_emulator import build as _emulator
from tts_emulator import emu_call, emu_pick_vec, lockstep_stats

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "kernels_cuda" / "qwen3_tts_rope.cu"
BINDING = ROOT / "kernels_cuda" / "qwen3_tts_rope_torch.cpp"
EMUL = ROOT / "tests" / "support" / "cuda_emul"


# ----------------------------------------------------------------------------------------------------------
# 1. nvcc + SASS
# ----------------------------------------------------------------------------------------------------------
def _kernels(arch, which=None):
    """``{mangled name: SASS}`` of the plain kernels (``which="plain"``: 2 dtypes x 3 head dims x 3 widths), the
    modes' kernels (``"modes"``: the same, each with a cos/sin table in the dtype and in fp32) or both."""
    cubin = K.nvcc_cubin(SRC, arch)
    funcs = K.sass_functions(K.sass(cubin))
    usage = K.resource_usage(cubin)
    tts = {n: f for n, f in funcs.items() if "qwen3_tts_rope_kernel" in n}
    plain = {n: f for n, f in tts.items() if "ELb0E" in n}
    modes = {n: f for n, f in tts.items() if "ELb1E" in n}
    assert (len(plain), len(modes), len(tts)) == (18, 36, 54), f"unexpected kernels: {sorted(tts)}"
    return {"plain": plain, "modes": modes, None: tts}[which], usage


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_no_local_memory_and_bounded_registers(arch):
    tts, usage = _kernels(arch)
    for name, code in tts.items():
        u = usage[name]
        assert u["stack"] == 0 and u["local"] == 0, f"{K.demangle_hint(name)} uses local memory: {u}"
        ops = set(K.opcodes(code))
        assert not {o for o in ops if o.startswith(("LDL", "STL"))}, f"{K.demangle_hint(name)} spills: {ops}"
        assert u["registers"] <= 128, f"{K.demangle_hint(name)}: {u['registers']} registers (occupancy)"
        # A subroutine call names its target (CALL.REL.NOINC `(__internal_...)`); a bare CALL.REL.NOINC with an
        # address is how sm_80 code leaves a loop.
        calls = [ln for ln in code.splitlines() if "CALL" in ln and "`(" in ln]
        assert not calls, f"{K.demangle_hint(name)} calls a subroutine: {calls[0].strip()}"


# q/k (load, store) of each VEC, as nvcc 13 / cuobjdump print them; cos/sin go through the read-only path
# (LDG.E.128.CONSTANT)
WIDTHS = {8: ("LDG.E.128", "STG.E.128"), 2: ("LDG.E", "STG.E"), 1: ("LDG.E.U16", "STG.E.U16")}


def _global_memory_ops(code):
    return Counter(o for o in K.opcodes(code) if o.startswith(("LDG", "STG", "LD.", "ST.")))


def _vec(name):
    """The VEC template argument of a mangled kernel name."""
    return int(name.split("qwen3_tts_rope_kernel", 1)[1].split("ELi")[-1].split("E")[0])


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_vector_paths_use_the_intended_access_widths(arch):
    """Each plain kernel's widths; on sm_90 the 16-byte bf16 D=128 kernel issues its 4 passes x 2 halves of q/k
    loads before the first store (memory-level parallelism) and reads cos/sin (4 x 128-bit) once per token."""
    tts, _ = _kernels(arch, "plain")
    assert {_vec(n) for n in tts} == {8, 2, 1}
    for name, code in tts.items():
        ops = _global_memory_ops(code)
        load, store = WIDTHS[_vec(name)]
        loads = {o for o in ops if o.startswith("LDG")}
        stores = {o for o in ops if o.startswith("STG")}
        assert stores == {store}, f"{K.demangle_hint(name)}: stores {dict(ops)}, expected only {store}"
        assert loads == {load, load + ".CONSTANT"}, f"{K.demangle_hint(name)}: loads {dict(ops)}"
        assert not any(o.startswith(("LD.", "ST.")) for o in ops), f"{K.demangle_hint(name)}: generic accesses"
        # Each row chunk is loaded and stored in both halves: as many stores as q/k loads.
        assert ops[load] == ops[store], f"{K.demangle_hint(name)}: {dict(ops)}"
    if arch == "sm_90":
        name = next(n for n in tts if "13__nv_bfloat16Li128ELi8E" in n)
        ops = [o for o in K.opcodes(tts[name]) if o.startswith(("LDG", "STG"))]
        assert ops[:ops.index("STG.E.128")].count("LDG.E.128") == 8, ops
        assert ops.count("LDG.E.128.CONSTANT") == 4, ops


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_modes_kernels_keep_the_access_widths_and_shuffle_only_in_the_norm(arch):
    """The modes' kernels: q/k through the same loads and stores as the plain kernel of their width; cos/sin
    (also an fp32 table: two 16-byte loads per 8 elements) and the norm weights through the read-only path, as wide;
    one int32 and one int64 position load; the norm's sum as a butterfly of warp shuffles."""
    tts, _ = _kernels(arch, "modes")
    for name, code in tts.items():
        vec = _vec(name)
        fp32_table = name.split("ELb1E", 1)[1].startswith("f")
        ops = _global_memory_ops(code)
        load, store = WIDTHS[vec]
        assert {o for o in ops if o.startswith("STG")} == {store}, f"{K.demangle_hint(name)}: {dict(ops)}"
        assert {o for o in ops if o.startswith("LDG") and not o.endswith(".CONSTANT")} == {load}, dict(ops)
        table = {8: "LDG.E.128", 2: "LDG.E.64" if fp32_table else "LDG.E", 1: "LDG.E" if fp32_table else load}[vec]
        read_only = {o for o in ops if o.endswith(".CONSTANT")}
        assert read_only <= {load + ".CONSTANT", table + ".CONSTANT", "LDG.E.CONSTANT", "LDG.E.64.CONSTANT"}, dict(ops)
        assert table + ".CONSTANT" in read_only and load + ".CONSTANT" in read_only, dict(ops)  # table, weights
        if vec == 8:  # the positions: one 4-byte and one 8-byte load, everything else 16 bytes wide
            assert ops["LDG.E.CONSTANT"] == 1 and ops["LDG.E.64.CONSTANT"] == 1, dict(ops)
        assert "SHFL.BFLY" in set(K.opcodes(code)), f"{K.demangle_hint(name)}: no butterfly"
    plain, _ = _kernels(arch, "plain")
    assert not any("SHFL" in o for code in plain.values() for o in K.opcodes(code))


# ----------------------------------------------------------------------------------------------------------
# 2. The kernel source on the host, through tests/support/cuda_emul
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emu():
    return _emulator(lockstep=False)


# Outputs this many elements off 16 bytes take the launcher to each vector width (4-byte aligned: 2, odd: 1).
OFFSET_OF_WIDTH = {8: 0, 2: 2, 1: 1}


def guarded_like(t: torch.Tensor, offset: int = 0):
    """``(view, buffer)``: a contiguous view shaped like ``t`` inside a poisoned buffer, 64 guard elements on each
    side; ``offset`` shifts it (e.g. 1 = misaligned by one element)."""
    return guarded_poison(t.shape, t.dtype, lead=64 + offset, tail=64)


def check_guards(*bufs_and_views):
    written = sum(bytes_written_outside(buf, view) for buf, view in bufs_and_views)
    assert written == 0, f"{written} guard bytes were written"


check = assert_tts_rope_close  # within 1 ulp, correctly rounded except rare ties


def run_emu(lib, q, k, cos, sin, expect_vec=None, offset=0, **kw):
    q_out, qbuf = guarded_like(q, offset=offset)
    k_out, kbuf = guarded_like(k, offset=offset)
    if expect_vec is not None:
        assert emu_pick_vec(lib, q, k, cos, sin, q_out, k_out) == expect_vec
    before = lib.emu_launch_count()
    assert emu_call(lib, q, k, cos, sin, q_out, k_out, **kw) == 0
    assert lib.emu_launch_count() == before + (1 if q.shape[0] * q.shape[2] and q.shape[1] + k.shape[1] else 0)
    check_guards((qbuf, q_out), (kbuf, k_out))
    check(q_out, k_out, q, k, cos, sin)
    return q_out, k_out


def last_launch(lib):
    """``(grid.x, grid.y, grid.z, block.x, block.y, block.z)`` of the launcher's last launch."""
    grid = (ctypes.c_uint * 6)()
    lib.emu_last_launch(grid)
    return tuple(grid)


# The automatic launch shape of three seed cases (tiny, launch-bound: one token per block), block (x, y): wide_heads
# B=32 (40 heads, 4 rows per 16-byte pass) has 3 warps per token, so each warp's 3-4 passes are one round of loads.
SEED_BLOCKS = {"qwen3_tts-B1": (64, 1), "wide_heads-B32": (96, 1), "small_tts-B1": (32, 1)}


@pytest.mark.parametrize("case", TTS_CASES, ids=lambda c: c.id)
def test_emulated_kernel_on_seed_matrix(emu, case):
    q, k, cos, sin = make_tts_inputs(case, seed=case.seed)
    run_emu(emu, q, k, cos, sin, expect_vec=8)
    if case.id in SEED_BLOCKS:
        grid = last_launch(emu)
        assert (grid[3], grid[4]) == SEED_BLOCKS[case.id] and grid[0] == case.batch * case.seq_len, grid


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("vec", [8, 2, 1])
@pytest.mark.parametrize("layout", ["projection", "contiguous"])
def test_emulated_every_path(emu, dtype, head_dim, vec, layout):
    """Into outputs, and in place (every element rotated exactly once), that many elements off 16 bytes."""
    case = TtsCase("paths", 2, 5, 7, 3, head_dim)
    q, k, cos, sin = make_tts_inputs(case, dtype, seed=head_dim + vec, layout=layout, random_cos_sin=True)
    off = OFFSET_OF_WIDTH[vec]
    run_emu(emu, q, k, cos, sin, expect_vec=vec, offset=off)
    # in place: copies in one buffer (the projection's, or q then k), as many elements off
    base = q._base if layout == "projection" else torch.cat([q.reshape(-1), k.reshape(-1)])
    buf = torch.empty(base.numel() + off, dtype=q.dtype)[off:].view(base.shape).copy_(base)
    if layout == "projection":
        qi, ki = (buf.as_strided(t.shape, t.stride(), off + t.storage_offset()) for t in (q, k))
    else:
        qi, ki = buf[:q.numel()].view(q.shape), buf[q.numel():].view(k.shape)
    assert emu_pick_vec(emu, qi, ki, cos, sin, qi, ki) == vec
    assert emu_call(emu, qi, ki, cos, sin, qi, ki) == 0
    check(qi, ki, q, k, cos, sin)


def test_emulated_misaligned_and_odd_strides_pick_narrow_paths(emu):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(2, 9, 5, 160, generator=g).to(torch.bfloat16)
    q = base[:, 1:8:2, :4, 16:144].transpose(1, 2)  # strides multiples of 8, 32-byte offset: 16-byte path
    kb = torch.randn(4, 4, 3, 131, generator=g).to(torch.bfloat16)
    k = kb[::2, :, :, 3:131].transpose(1, 2)  # odd element offset and odd strides: scalar path
    cs = torch.randn(2, 4, 2, 136, generator=g).to(torch.bfloat16)
    cos, sin = cs[:, :, 0, 8:136], cs[:, :, 1, :128]  # 16-byte aligned, strides % 8 == 0
    run_emu(emu, q, k, cos, sin, expect_vec=1)
    k2 = torch.randn(4, 4, 3, 130, generator=g).to(torch.bfloat16)[::2, :, :, 2:130].transpose(1, 2)
    run_emu(emu, q, k2, cos, sin, expect_vec=2)  # 4-byte aligned, even strides
    run_emu(emu, q, k2.contiguous(), cos, sin, expect_vec=8)
    run_emu(emu, q, k2.contiguous(), cos, sin, expect_vec=1, offset=1)  # outputs misaligned by one element
    run_emu(emu, q, k2.contiguous(), cos, sin, expect_vec=2, offset=2)


# (B, S, Hq, Hkv, D) -> the launcher's (warps per token, tokens per block): warps from the heads' passes (4 rows a
# pass at D = 128, 8 at 64, 2 at 256), tokens per block from B*S x warps past 2048; none divides evenly
LAUNCH_SHAPES = {(3, 7, 2, 1, 128): (1, 1), (3, 7, 13, 5, 128): (2, 1), (2, 9, 30, 10, 128): (3, 1),
                 (2, 5, 48, 16, 128): (4, 1), (2, 9, 13, 5, 64): (1, 1), (2, 9, 7, 3, 256): (2, 1),
                 (3, 701, 2, 1, 128): (1, 4), (3, 351, 13, 5, 128): (2, 2)}


@pytest.mark.parametrize("shape", list(LAUNCH_SHAPES), ids=lambda s: "x".join(map(str, s)))
def test_emulated_launch_shapes(emu, shape):
    """Every block shape the launcher makes, with partial last blocks, out of place and in place (in place, a
    token visited twice would rotate twice)."""
    wpt, tpc = LAUNCH_SHAPES[shape]
    q, k, cos, sin = make_tts_inputs(TtsCase("shape", *shape), seed=sum(shape), random_cos_sin=True)
    run_emu(emu, q, k, cos, sin, expect_vec=8)
    grid = last_launch(emu)
    assert (grid[3], grid[4], grid[0]) == (32 * wpt, tpc, -(-shape[0] * shape[1] // tpc))
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    assert emu_call(emu, q, k, cos, sin, q, k) == 0
    assert_ulp_close(q, q_ref, 1, "q")
    assert_ulp_close(k, k_ref, 1, "k")


@pytest.mark.parametrize("stride", ["batch", "seq"])
@pytest.mark.parametrize("table", ["cos", "sin"])
def test_emulated_table_strides_are_each_checked_for_the_vector_path(emu, table, stride):
    """cos and sin carry their own batch and row (seq) strides: one table's, 4 elements (8 bytes) past dense (its
    batch stride with the other table expanded over B, stride 0), breaks 16-byte alignment. The 16-byte path must
    be refused whichever table it is (on a GPU its loads of the misaligned rows fault; x86 emulation forgives a
    misaligned load, only the path chosen shows it), the 4-byte one serves, exactly."""
    q, k, cos, sin = make_tts_inputs(TtsCase("ts", 2, 4, 4, 2), seed=3, random_cos_sin=True)
    if stride == "batch":
        cos, sin = own_batch_strides(cos, sin, "sin" if table == "cos" else "cos")
        assert (sin if table == "cos" else cos).stride(0) == 0
    else:
        wide = torch.empty(*cos.shape[:-1], cos.shape[-1] + 4, dtype=cos.dtype)[..., :cos.shape[-1]]
        cos, sin = (wide.copy_(cos), sin.contiguous()) if table == "cos" else (cos.contiguous(), wide.copy_(sin))
    assert (cos if table == "cos" else sin).stride(0 if stride == "batch" else 1) % 8 == 4
    run_emu(emu, q, k, cos, sin, expect_vec=2)


def test_emulated_independent_halves_and_specials(emu):
    """cos[i] != cos[i+h] everywhere; zeros, infinities and NaN propagate like the fp32 formula."""
    q, k, cos, sin = make_tts_inputs(TtsCase("sp", 1, 3, 2, 1), seed=11, random_cos_sin=True)
    q = q.contiguous()
    q[0, 0, 0, 0] = float("inf")
    q[0, 1, 1, 5] = float("nan")
    q[0, 0, 2, :] = 0
    q_out, k_out = torch.empty_like(q), torch.empty_like(k.contiguous())
    assert emu_call(emu, q, k, cos, sin, q_out, k_out) == 0
    want = neox_rope(q, cos, sin, torch.float32).to(q.dtype)
    assert torch.equal(q_out.view(torch.int16)[~want.isnan()], want.view(torch.int16)[~want.isnan()])
    assert bool(q_out[want.isnan()].isnan().all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vec", [8, 2, 1])
def test_emulated_subnormal_inputs(emu, dtype, vec):
    q, k, cos, sin = make_tts_inputs(TtsCase("sub", 2, 3, 4, 2), dtype, seed=21, random_cos_sin=True,
                                     subnormal=True)
    q_out, _ = run_emu(emu, q, k, cos, sin, expect_vec=vec, offset=OFFSET_OF_WIDTH[vec])
    assert (q_out != 0).any() and (q_out.abs() < torch.finfo(dtype).tiny).any()


@pytest.mark.parametrize("shape", [(0, 4, 3, 128), (2, 4, 0, 128), (2, 0, 3, 128)])
def test_emulated_empty_launches_nothing(emu, shape):
    B, H, S, D = shape
    q, k = torch.randn(B, H, S, D).to(torch.bfloat16), torch.randn(B, 2 if H else 0, S, D).to(torch.bfloat16)
    cos = sin = torch.randn(max(B, 1), S, D).to(torch.bfloat16)
    run_emu(emu, q, k, cos, sin)  # which counts no launch for these


def test_emulation_rounding_model_matches_torch(emu):
    """The emulated conversions (the model the kernel is checked with) round like torch: RNE, NaN kept."""
    x = torch.randn(20000) * torch.logspace(-30, 30, 20000)
    x = torch.cat([x, torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 65504.0, 65520.0, 1e-8])])
    for dtype in (torch.bfloat16, torch.float16):
        # The kernel's output for x = [a, 0, ...], cos = [1.5, 0, ...], sin = 0 is RNE(a * 1.5), a in dtype.
        a = x.to(dtype)
        q64 = torch.zeros(1, a.numel(), 1, 64, dtype=dtype)
        q64[0, :, 0, 0] = a
        c64, s64 = torch.zeros(1, 1, 64, dtype=dtype), torch.zeros(1, 1, 64, dtype=dtype)
        c64[..., 0] = 1.5
        k64 = torch.zeros(1, 1, 1, 64, dtype=dtype)
        out, kout = torch.empty_like(q64), torch.empty_like(k64)
        assert emu_call(emu, q64, k64, c64, s64, out, kout) == 0
        want = (a.float() * 1.5).to(dtype)
        got = out[0, :, 0, 0]
        ok = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
        assert bool(ok.all()), f"{dtype}: {int((~ok).sum())} conversions differ from torch"


# ----------------------------------------------------------------------------------------------------------
# 2b. The modes' kernels (eager, positions, the q/k norm, pdl), threads in lockstep (the norm shuffles)
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emu_modes():
    return _emulator(lockstep=True)


def _tables(max_pos, head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.rand(max_pos, head_dim, generator=g) * 2 - 1).to(dtype) for _ in range(2))


def _weights(head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple((1 + 0.3 * torch.randn(head_dim, generator=g)).to(dtype) for _ in range(2))


MODES = {  # name: (numerics eager, table dtype or None, positions dtype, positions [B, S] or [S], norm)
    "eager": (True, None, None, None, False),
    "table": (False, "q", torch.int64, "BS", False),
    "table-eager": (True, "q", torch.int32, "S", False),
    "fp32-table": (False, torch.float32, torch.int32, "BS", False),
    "fp32-table-eager": (True, torch.float32, torch.int64, "S", False),
    "norm": (False, None, None, None, True),
    "norm-eager": (True, None, None, None, True),
    "norm-fp32-table-eager": (True, torch.float32, torch.int64, "BS", True),
}


def mode_inputs(case, dtype, mode, seed, layout="projection"):
    """q, k, cos, sin and the keyword arguments of one mode; positions run past both ends of the table."""
    eager, table, pos_dtype, pos_shape, norm = MODES[mode]
    q, k, cos, sin = make_tts_inputs(case, dtype, seed=seed, layout=layout, random_cos_sin=True)
    kw = dict(eager=eager)
    if table is not None:
        max_pos = 3 * case.seq_len
        cos, sin = _tables(max_pos, case.head_dim, dtype if table == "q" else table, seed + 1)
        g = torch.Generator().manual_seed(seed + 2)
        shape = (case.batch, case.seq_len) if pos_shape == "BS" else (case.seq_len,)
        kw["positions"] = torch.randint(-3, max_pos + 3, shape, generator=g).to(pos_dtype)
    if norm:
        kw["q_weight"], kw["k_weight"] = _weights(case.head_dim, dtype, seed + 3)
        kw["eps"] = 1e-6
    return q, k, cos, sin, kw


def reference_of(q, k, cos, sin, kw):
    """fusedrope's reference backend (PyTorch on the CPU) on the same call."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    qwen3_tts_rope_reference(q, k, cos, sin, q_out, k_out, kw.get("positions"), kw["eager"], kw.get("q_weight"),
                             kw.get("k_weight"), kw.get("eps", 0.0))
    return q_out, k_out


def run_modes(lib, q, k, cos, sin, kw, inplace=False, offset=0, pdl=False):
    """The kernel into poisoned, guarded outputs (or in place), no divergent shuffle; returns its outputs."""
    if inplace:
        q_out, k_out, bufs = q, k, ()
    else:
        (q_out, qbuf), (k_out, kbuf) = guarded_like(q, offset), guarded_like(k, offset)
        bufs = ((qbuf, q_out), (kbuf, k_out))
    lockstep_stats(lib)
    assert emu_call(lib, q, k, cos, sin, q_out, k_out, pdl=pdl, **kw) == 0
    errors, exchanges, first = lockstep_stats(lib)
    assert errors == 0, first
    assert (exchanges > 0) == ("q_weight" in kw), exchanges  # the norm's butterfly, and nothing else, shuffles
    check_guards(*bufs)
    return q_out, k_out


def assert_matches_reference(got, want, norm):
    """Bit-identical to the reference; with the norm, except where the fp32 sum of squares' order differs from
    PyTorch's (rarely, by a rounding step)."""
    if not norm:
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        return
    same = sum(int((g == w).sum()) for g, w in zip(got, want)) / sum(w.numel() for w in want)
    assert same >= 0.999, f"{same:.5%} identical"
    for g, w in zip(got, want):
        assert (g.float() - w.float()).abs().max() <= 4 * torch.finfo(g.dtype).eps * w.float().abs().max()


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("vec", [8, 2, 1])
def test_emulated_modes_match_the_reference(emu_modes, mode, dtype, head_dim, vec):
    case = TtsCase("modes", 2, 5, 6, 2, head_dim)  # 7 heads: a pass that runs past the last head
    q, k, cos, sin, kw = mode_inputs(case, dtype, mode, seed=head_dim + vec)
    got = run_modes(emu_modes, q, k, cos, sin, kw, offset=OFFSET_OF_WIDTH[vec])
    assert_matches_reference(got, reference_of(q, k, cos, sin, kw), "q_weight" in kw)


MODE_SHAPES = [(m, s) for m in ("norm-eager", "norm-fp32-table-eager", "fp32-table")
               for s in ((3, 7, 2, 1, 128), (2, 9, 30, 10, 128), (2, 5, 48, 16, 128))]
MODE_SHAPES.append(pytest.param("norm-eager", (3, 351, 13, 5, 128), marks=pytest.mark.slow))  # 2-D blocks once:
# a thousand tokens in lockstep


@pytest.mark.parametrize("mode,shape", MODE_SHAPES, ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v)))
def test_emulated_modes_launch_shapes(emu_modes, mode, shape):
    """Warps sharing a token's heads and 2-D blocks (LAUNCH_SHAPES): the shuffles stay within each warp's rows."""
    q, k, cos, sin, kw = mode_inputs(TtsCase("shape", *shape), torch.bfloat16, mode, seed=sum(shape))
    got = run_modes(emu_modes, q, k, cos, sin, kw)
    assert_matches_reference(got, reference_of(q, k, cos, sin, kw), "q_weight" in kw)


@pytest.mark.parametrize("tables,want_vec", [("fp32+0", 8), ("fp32+2", 2), ("fp32+1", 1), ("rows130-S1", 2),
                                             ("rows130-S2", 2)])
def test_emulated_table_layout_picks_the_width(emu_modes, tables, want_vec):
    """An fp32 table's 8-element chunks are two 16-byte loads, its 2-element chunks one 8-byte load: a table 8 bytes
    off 16 takes the 2-element path, 4 bytes off the scalar one. A table's row stride decides the width whatever the
    tokens: with S = 1 (decode) too, rows 130 elements apart take the 2-element path (16-byte loads of row 3 would
    be misaligned on a GPU). All still right."""
    if tables.startswith("fp32"):
        q, k, cos, sin, kw = mode_inputs(TtsCase("align", 1, 2, 3, 1, 64), torch.bfloat16, "fp32-table", seed=41)
        off = int(tables[-1])
        cos, sin = (torch.empty(t.numel() + 4)[off:off + t.numel()].view(t.shape).copy_(t) for t in (cos, sin))
    else:
        q, k, _, _, kw = mode_inputs(TtsCase("rows", 1, int(tables[-1]), 2, 1, 128), torch.bfloat16, "table", seed=45)
        cos, sin = (torch.randn(8, 130).to(torch.bfloat16)[:, :128] for _ in range(2))  # 16-byte aligned bases
        kw["positions"] = torch.full_like(kw["positions"], 3)
    outs = (torch.empty_like(q.contiguous()), torch.empty_like(k.contiguous()))
    assert emu_pick_vec(emu_modes, q.contiguous(), k.contiguous(), cos, sin, *outs,
                        **{n: kw[n] for n in ("positions", "eager")}) == want_vec
    got = run_modes(emu_modes, q, k, cos, sin, kw)
    assert_matches_reference(got, reference_of(q, k, cos, sin, kw), False)


def test_emulated_pdl_launch(emu_modes):
    """pdl: a programmatic dependent launch of the modes' kernel (also for a plain call: the plain kernels have no
    wait), refused for a kernel image older than sm_90."""
    case = TtsCase("pdl", 1, 4, 3, 2, 128)
    q, k, cos, sin, kw = mode_inputs(case, torch.bfloat16, "norm", seed=51)
    got = run_modes(emu_modes, q, k, cos, sin, kw, pdl=True)
    assert emu_modes.emul_last_pdl() == 1
    assert_matches_reference(got, reference_of(q, k, cos, sin, kw), True)
    plain = dict(eager=False)
    got = run_modes(emu_modes, q, k, cos, sin, plain, pdl=True)
    assert emu_modes.emul_last_pdl() == 1
    assert_matches_reference(got, reference_of(q, k, cos, sin, plain), False)
    run_modes(emu_modes, q, k, cos, sin, plain)
    assert emu_modes.emul_last_pdl() == 0
    emu_modes.emul_set_ptx_version(80)
    try:
        before = emu_modes.emu_launch_count()
        assert emu_call(emu_modes, q, k, cos, sin, *guarded_like(q)[:1], guarded_like(k)[0], pdl=True) == 801
        assert emu_modes.emu_launch_count() == before  # cudaErrorNotSupported, nothing launched
    finally:
        emu_modes.emul_set_ptx_version(90)


def test_emulated_launcher_refuses_bad_calls(emu, emu_modes):
    """An unsupported head dim (plain kernels), a table of no rows, one norm weight, a negative or NaN eps."""
    q, k, cos, sin = make_tts_inputs(TtsCase("hd", 1, 2, 2, 1, 96))
    assert emu_call(emu, q, k, cos, sin, torch.empty_like(q), torch.empty_like(k)) == 1
    q, k, cos, sin, kw = mode_inputs(TtsCase("bad", 1, 2, 3, 1, 64), torch.bfloat16, "norm-fp32-table-eager", seed=61)
    outs = (torch.empty_like(q.contiguous()), torch.empty_like(k.contiguous()))
    assert emu_call(emu_modes, q, k, cos, sin, *outs, **kw) == 0
    for bad in (dict(max_pos=0), dict(k_weight=None), dict(eps=-1.0), dict(eps=float("nan"))):
        assert emu_call(emu_modes, q, k, cos, sin, *outs, **{**kw, **bad}) == 1, bad

# ----------------------------------------------------------------------------------------------------------
# 3. Registry and binding on this machine
# ----------------------------------------------------------------------------------------------------------
def test_registry_falls_back_from_cuda_on_cpu_and_explains_why():
    q, k, cos, sin = make_tts_inputs(TtsCase("reg", 1, 2, 2, 1))
    ex = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin)
    decisions = {d.backend: d for d in ex}
    assert ex[0].backend == "cuda", "cuda must be tried first"
    assert not decisions["cuda"].runs
    if not torch.cuda.is_available():
        assert "CUDA device" in decisions["cuda"].reason and "cpu" in decisions["cuda"].reason
        assert ex.chosen in ("triton", "reference")
        assert "cuda" in str(ex)
        with pytest.raises(fusedrope.BackendUnavailableError, match="backend 'cuda' cannot run.*CUDA device"):
            fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="cuda")
    # Without a GPU the result is still right, from the fallback.
    q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin)
    check(q_out, k_out, q, k, cos, sin)


def test_cuda_supports_reasons():
    dev = torch.device("cuda")
    assert cuda_tts_rope.supports(Facts(dev, torch.bfloat16, 128, False)) is None
    assert cuda_tts_rope.supports(Facts(dev, torch.float16, 64, True)) is None
    assert cuda_tts_rope.supports(Facts(dev, torch.bfloat16, 256, False)) is None
    r = cuda_tts_rope.supports(Facts(dev, torch.float32, 96, False))
    assert r == "cuda kernel serves bfloat16/float16 with D in (64, 128, 256), got float32 D=96"
    assert "D=2" in cuda_tts_rope.supports(Facts(dev, torch.bfloat16, 2, False))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU reasons")
def test_cuda_ext_reasons_without_gpu(monkeypatch):
    assert "CUDA device" in cuda_ext.available(torch.device("cpu"))
    if not torch.version.cuda:
        assert cuda_ext.available(torch.device("cuda")) == "this torch build has no CUDA (torch.version.cuda is None)"
        with pytest.raises(RuntimeError, match="cannot build the CUDA kernels: this torch build has no CUDA"):
            cuda_ext.build()
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    assert "ROCm" in cuda_ext.available(torch.device("cuda"))


def test_cuda_ext_finds_sources_and_names_builds_by_content(tmp_path, monkeypatch):
    srcs = cuda_ext.sources()
    names = [s.name for s in srcs]
    assert "qwen3_tts_rope.cu" in names and "qwen3_tts_rope_torch.cpp" in names
    assert all(s.suffix == ".cu" or s.name.endswith("_torch.cpp") for s in srcs)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    a = cuda_ext.ext_name()
    assert a.startswith("fusedrope_cuda_") and a == cuda_ext.ext_name()
    assert cuda_ext.ext_name("8.0") != a
    assert str(cuda_ext.build_root()).startswith(str(tmp_path))


def test_cuda_ext_import_stays_light():
    code = ("import sys, torch, fusedrope; "
            "assert 'torch.utils.cpp_extension' not in sys.modules, 'cpp_extension imported at package import'")
    proc = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow  # a C++ compile against torch's headers
def test_torch_binding_compiles_against_torch_headers(tmp_path):
    """Syntax check of the binding (a CPU torch cannot link it; the GPU machine builds it for real, and
    tests/test_cuda_extension_build.py links it against a CUDA torch where CI has one)."""
    cuda_inc = cuda_include_dir()
    if cuda_inc is None:
        pytest.skip("needs the CUDA headers (cuda_runtime_api.h under $CUDA_HOME or /usr/local/cuda)")
    torch_syntax_check(BINDING, tmp_path, CUDA_CPU_WHEEL_STUBS, [cuda_inc])


ASAN_SCRIPT = r"""
import ctypes, sys, torch
import test_qwen3_tts_rope_cuda as T
from fusedrope.testing import TTS_CASES, TtsCase, make_tts_inputs, own_batch_strides
lib = ctypes.CDLL(sys.argv[1])
def exact(t, offset=0):  # a copy in its own allocation of exactly offset + numel elements
    buf = torch.empty(t.numel() + offset, dtype=t.dtype)
    v = buf[offset:].view(t.shape)
    v.copy_(t)
    return v
if sys.argv[2] == "modes":  # the lockstep build: every mode, tables and weights in exact allocations too
    lib.emul_stats.argtypes = [ctypes.POINTER(ctypes.c_longlong), ctypes.c_char_p, ctypes.c_int]
    n = 0
    for mode in T.MODES:
        for case in (TtsCase("m", 2, 5, 3, 2, 64), TtsCase("n", 1, 3, 4, 1, 256)):
            for off in (0, 1):
                q, k, cos, sin, kw = T.mode_inputs(case, torch.bfloat16, mode, seed=off)
                q, k, cos, sin = (exact(t, off) for t in (q, k, cos, sin))
                kw = {n_: exact(t, off) if isinstance(t, torch.Tensor) else t for n_, t in kw.items()}
                qo, ko = exact(q.contiguous(), off), exact(k.contiguous(), off)
                assert T.emu_call(lib, q, k, cos, sin, qo, ko, **kw) == 0
                T.assert_matches_reference((qo, ko), T.reference_of(q, k, cos, sin, kw), "q_weight" in kw)
                n += 1
    # decode (S = 1) on tables whose rows are 130 elements apart: row 3 is not 16-byte aligned
    q, k, _, _, kw = T.mode_inputs(TtsCase("rows", 1, 1, 2, 1, 128), torch.bfloat16, "table", seed=5)
    q, k = exact(q), exact(k)
    cos, sin = (exact(torch.randn(8, 130).to(torch.bfloat16))[:, :128] for _ in range(2))
    kw["positions"] = exact(torch.full((1, 1), 3))
    qo, ko = exact(q.contiguous()), exact(k.contiguous())
    assert T.emu_call(lib, q, k, cos, sin, qo, ko, **kw) == 0
    T.assert_matches_reference((qo, ko), T.reference_of(q, k, cos, sin, kw), False)
    print("ASAN RUN OK", n + 1)
    sys.exit(0)
n = 0
for case in (TTS_CASES[0], TTS_CASES[-1], TtsCase("x", 3, 7, 13, 5, 64), TtsCase("y", 2, 5, 3, 2, 256)):
    for layout in ("projection", "contiguous"):
        for off in (0, 1, 2):
            q, k, cos, sin = make_tts_inputs(case, layout=layout, random_cos_sin=True, seed=off)
            if layout == "contiguous":
                q, k, cos, sin = (exact(t, off) for t in (q, k, cos, sin))
            qo, ko = exact(q.contiguous(), off), exact(k.contiguous(), off)  # off 0, 1, 2: every vector width
            assert T.emu_call(lib, q, k, cos, sin, qo, ko) == 0
            T.check(qo, ko, q, k, cos, sin)
            n += 1
# cos expanded over B (batch stride 0), sin with a batch stride of S*D + 4: sin's rows for b >= 1 are not 16-byte
# aligned (the alignment check aborts if the 16-byte path reads them)
q, k, cos, sin = make_tts_inputs(TtsCase("tb", 2, 4, 4, 2), seed=3, random_cos_sin=True)
cos, sin = own_batch_strides(exact(cos[:1]).expand_as(cos), sin)  # cos: one exact batch
qo, ko = exact(q.contiguous()), exact(k.contiguous())
assert T.emu_call(lib, q, k, cos, sin, qo, ko) == 0
T.check(qo, ko, q, k, cos, sin)
print("ASAN RUN OK", n + 1)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["plain", "modes"])
def test_emulated_kernel_stays_in_bounds_under_asan(tmp_path, kernels):
    """The kernel source, built with AddressSanitizer, on tensors in allocations of exactly their size (torch's
    CPU allocator is intercepted): any read or write past the end of q, k, cos, sin, a table, a weight or an output
    aborts. The modes' kernels run in the lockstep build."""
    cxx = host_cxx()
    if cxx is None or "g++" not in Path(cxx).name:
        pytest.skip("needs g++ (for libasan)")
    libasan = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not libasan or not Path(libasan).is_file():
        pytest.skip("libasan not installed")
    so = tmp_path / "harness_asan.so"
    lockstep = ["-std=c++20", "-pthread", "-DCUDA_EMUL_LOCKSTEP=1", "-I", str(EMUL.parent)]
    cmd = [cxx, *(lockstep if kernels == "modes" else ["-std=c++17"]), "-O1", *ASAN_FLAGS, "-shared", "-fPIC",
           "-Wno-unknown-pragmas", "-I", str(EMUL), "-x", "c++", str(EMUL / "harness.cpp"),
           f'-DKERNEL_SOURCE="{SRC}"', "-o", str(so)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(EMUL.parent), str(Path(__file__).parent)]))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([os.sys.executable, "-c", ASAN_SCRIPT, str(so), kernels], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0 and "ASAN RUN OK" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]


def test_toolkit_root_sees_past_a_wrapper_nvcc(tmp_path, monkeypatch):
    """torch guesses CUDA_HOME from the nvcc on PATH; where that is a wrapper script (this CPU image's
    /usr/local/bin/nvcc) the guess has no headers, and the build uses the first real toolkit instead."""
    from torch.utils import cpp_extension

    def toolkit(root):
        (root / "include").mkdir(parents=True)
        (root / "include" / "cuda_runtime.h").write_text("")
        (root / "bin").mkdir()
        (root / "bin" / "nvcc").write_text("")
        return root

    wrapper_home = tmp_path / "usr-local"
    (wrapper_home / "bin").mkdir(parents=True)
    real = toolkit(tmp_path / "cuda-13.0")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cuda_ext, "TOOLKIT_CANDIDATES", (str(tmp_path / "cuda"), str(tmp_path / "cuda-*")))
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(wrapper_home))
    assert cuda_ext.toolkit_root() == str(real)
    with cuda_ext.EXT.target_env("9.0"):
        assert cpp_extension.CUDA_HOME == str(real)
    assert cpp_extension.CUDA_HOME == str(wrapper_home)  # restored
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(toolkit(tmp_path / "explicit")))
    assert cuda_ext.toolkit_root() == str(tmp_path / "explicit")  # a good guess stands
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(wrapper_home))
    monkeypatch.setenv("CUDA_HOME", str(wrapper_home))
    assert cuda_ext.toolkit_root() is None  # an explicit choice is not overridden


@pytest.mark.parametrize("dim", [0, 1, 2], ids=["batch", "head", "seq"])
@pytest.mark.parametrize("which", ["q_out", "k_out"])
def test_emulated_output_strides_are_each_checked_for_the_vector_path(emu, which, dim):
    """One output's batch, head or seq stride is 4 elements (8 bytes) longer than dense: its rows are 8-byte
    aligned only, so the 16-byte path must be refused for that output alone, the 4-byte one serves, exactly,
    and nothing between the padded rows is written."""
    q, k, cos, sin = make_tts_inputs(TtsCase("os", 2, 4, 4, 2), seed=3, random_cos_sin=True, layout="contiguous")
    outs = []
    for name, src in (("q_out", q), ("k_out", k)):
        strides = [1]  # row-major; for `which`, 4 elements more after each index of `dim`
        for d in (3, 2, 1):
            strides.insert(0, strides[0] * src.shape[d] + (4 if name == which and d - 1 == dim else 0))
        outs.append(guarded_poison(src.shape, src.dtype, strides=strides, tail=64))
    (q_out, qbuf), (k_out, kbuf) = outs
    padded = q_out if which == "q_out" else k_out
    assert padded.stride(dim) % 8 == 4 and padded.stride(3) == 1
    assert emu_pick_vec(emu, q, k, cos, sin, q_out, k_out) == 2
    assert emu_call(emu, q, k, cos, sin, q_out, k_out) == 0
    check_guards((qbuf, q_out), (kbuf, k_out))
    check(q_out, k_out, q, k, cos, sin)
