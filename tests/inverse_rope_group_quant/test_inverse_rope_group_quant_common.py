"""CPU checks of the plain C++ both inverse_rope_group_quant kernels share
(kernels_cuda/inverse_rope_group_quant_common.h; the HIP kernel includes it from
kernels_hip/inverse_rope_group_quant.h), compiled with g++ together with both vendors' kernel headers
(tests/inverse_rope_group_quant/irgq_host_harness.cpp):

* the e8m0 scale byte (both forms) and the exact software fp8 RNE (the CUDA kernels' sm_80 and fnuz paths, the HIP
  kernel's path wherever the hardware fp8 format differs) bit-exact against fusedrope.reference and torch's fp8
  casts; the head kernel's packed bf16 scaling against torch's bf16 product;
* the launcher's argument derivation: status codes, byte strides, alignment flags;
* the multiply-shift token division against '/' and '%'.

Both whole kernels run in lockstep host emulation in
tests/inverse_rope_group_quant/test_inverse_rope_group_quant_emulated.py.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from fusedrope import reference as ref
from irgq_harness import e8m0_probe_values, fp8_probe_values, harness


@pytest.mark.parametrize("fnuz", [False, True], ids=["e4m3fn", "e4m3fnuz"])
def test_scalar_math_matches_reference(fnuz):
    """The e8m0 byte and the software fp8 RNE, on every bf16/fp16 value, every fp8 tie and scale boundary,
    bit-exact against fusedrope.reference (e8m0_scale_bytes) and torch's fp8 casts (what the reference
    uses)."""
    lib = harness()
    dtype = torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn
    fp8_max = ref.FP8_MAX[dtype]
    amax = e8m0_probe_values()
    want = ref.e8m0_scale_bytes(amax, fp8_max)
    for carry in (0, 1):
        got = torch.empty(amax.numel(), dtype=torch.uint8)
        lib.irgq_host_e8m0(ctypes.c_void_p(amax.data_ptr()), ctypes.c_longlong(amax.numel()), ctypes.c_int(fnuz),
                           ctypes.c_int(carry), ctypes.c_void_p(got.data_ptr()))
        bad = (got != want).nonzero()
        assert bad.numel() == 0, (f"e8m0 (carry {carry}) differs for amax={amax[bad[0]].item()!r}: "
                                  f"{got[bad[0]].item()} vs {want[bad[0]].item()}")
        assert torch.equal(got, want)  # dtype and shape too

    x = fp8_probe_values(fp8_max)
    got = torch.empty(x.numel(), dtype=torch.uint8)
    lib.irgq_host_encode(ctypes.c_void_p(x.data_ptr()), ctypes.c_longlong(x.numel()), ctypes.c_int(fnuz),
                         ctypes.c_void_p(got.data_ptr()))
    want = x.to(dtype).view(torch.uint8)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (f"{bad.numel()} fp8 codes differ; first x={x[bad[0]].item()!r}: "
                              f"{got[bad[0]].item():#x} vs torch {want[bad[0]].item():#x}")


def test_e8m0_carry_of_non_finite_blocks_is_0xff():
    """The head kernel's e8m0 byte of a NaN or Inf block maximum (|v| bits above or at Inf's) is 0xFF."""
    lib = harness()
    amax = torch.tensor([0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF], dtype=torch.int32).view(torch.float32)
    for carry in (0, 1):
        got = torch.empty(4, dtype=torch.uint8)
        lib.irgq_host_e8m0(ctypes.c_void_p(amax.data_ptr()), ctypes.c_longlong(4), ctypes.c_int(0),
                           ctypes.c_int(carry), ctypes.c_void_p(got.data_ptr()))
        assert got.tolist() == [0xFF] * 4, (carry, got)


def test_packed_bf16_scaling_is_the_exact_product():
    """Every bf16 value times every power of two a block scale can invert (2^-121 .. 2^36) in packed bf16 (the head
    kernel's host form of mul.rn.bf16x2): torch's bf16 product (exact: a power of two), halves kept apart."""
    lib = harness()
    lib.irgq_host_mul_bf16x2.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_uint, ctypes.c_void_p]
    lo = torch.arange(-32768, 32768, dtype=torch.int32)
    words = ((lo & 0xFFFF) | (lo.flip(0) << 16)).to(torch.int32)
    for k in (-121, -60, -1, 0, 1, 20, 36):
        p = torch.tensor(2.0 ** k).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF
        out = torch.empty_like(words)
        lib.irgq_host_mul_bf16x2(words.data_ptr(), words.numel(), p | (p << 16), out.data_ptr())
        halves = torch.stack([words & 0xFFFF, (words >> 16) & 0xFFFF], 1).to(torch.int16).view(torch.bfloat16)
        want = (halves.float() * 2.0 ** k).to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
        got = torch.stack([out & 0xFFFF, (out >> 16) & 0xFFFF], 1)
        nan = halves.isnan()
        assert torch.equal(got[~nan], want[~nan]) and bool((got[nan] & 0x7F80 == 0x7F80).all()), k


def _kargs(lib, ptrs=(4096, 8192, 16384, 16384 + 128, 65536, 131072), **kw):
    ints = dict(S=5, H=16, D=512, o_dtype=0, pos64=1, pos_stride=1, cache_dtype=2, cos_stride=64,
                sin_stride=64, max_pos=100, rope=64, fnuz=1, G=2, q=128, f32=0, ss0=64, ss2=1, pdl=0, xs0=0, xs1=0,
                mfma=0, rows=0, kernel=0)
    ints.update(kw)
    assert len(ints) == 23, "one value per irgq_test::params_from field"
    out = (ctypes.c_longlong * 13)()
    lib.irgq_host_kargs((ctypes.c_void_p * 6)(*ptrs), (ctypes.c_longlong * len(ints))(*ints.values()), out)
    return list(out)


def test_launcher_arguments():
    lib = harness()
    kargs = lambda **kw: _kargs(lib, **kw)  # noqa: E731
    r = kargs()
    assert r[:8] == [0, 5 * 16 * 32, 16 * 32, 31 + 9, 8, 256, 64, 1], r
    assert r[8:10] == [1, 1]
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


# the xorshift seeds the CUDA and the HIP harness used before they became one
@pytest.mark.parametrize("seed", [0x9E3779B97F4A7C15, 0x2545F4914F6CDD1D], ids=["seed0", "seed1"])
def test_token_division_magic_numbers(seed):
    lib = harness()
    for heads in (1, 2, 3, 5, 7, 8, 12, 16, 24, 32, 61, 64, 100, 128, 1000, 4093):
        assert lib.irgq_host_fastdiv_mismatches(heads, 200_000, seed) == 0, heads


def test_launcher_sin_alignment_and_the_largest_launch():
    lib = harness()
    assert _kargs(lib)[8] == 1
    assert _kargs(lib, sin_stride=65)[8] == 0                                           # sin rows unaligned
    assert _kargs(lib, cache_dtype=0, cos_stride=72, sin_stride=68)[8] == 0             # 136 B sin rows
    assert _kargs(lib, ptrs=(4096, 8192, 16384, 16384 + 130, 65536, 131072))[8] == 0    # sin pointer off
    # the largest S whose S*H*32 chunks stay below 2^31 launches; one token more is kTooLarge
    for H in (16, 1, 3, 128):
        s_max = 0x7FFFFFFF // (H * 32)
        assert _kargs(lib, S=s_max, H=H, G=1, q=32, ss0=H * 16)[:2] == [0, s_max * H * 32], H
        assert _kargs(lib, S=s_max + 1, H=H, G=1, q=32, ss0=H * 16)[0] == 4, H


def test_launcher_sends_what_only_the_head_kernel_writes_to_it():
    """needs_head (out[10]): x_fp8 rows not contiguous (group-major, padded; a size-1 dim's stride does not
    count), mfma_tile scales, or scale rows past S; x_fp8 16-byte vector stores only with 16-byte row strides;
    heads per group (out[12]) where heads do not straddle groups, else 0."""
    lib = harness()
    S, H, G = 5, 16, 2
    dg = H * 512 // G
    assert _kargs(lib)[10:] == [0, S, 8] and _kargs(lib, xs0=H * 512, xs1=dg)[10] == 0  # contiguous, as 0, 0 says
    assert _kargs(lib, xs0=dg, xs1=S * dg)[10] == 1                                    # group-major
    assert _kargs(lib, xs0=H * 512 + 64, xs1=dg)[10] == 1                              # padded rows
    assert _kargs(lib, S=1, xs0=7, xs1=dg)[10] == 0 and _kargs(lib, G=1, xs0=H * 512, xs1=3)[10] == 0
    assert _kargs(lib, mfma=1)[10] == 1
    assert _kargs(lib, rows=8)[10:12] == [1, 8] and _kargs(lib, rows=S)[10] == 0
    assert _kargs(lib, xs0=dg, xs1=S * dg)[9] == 1 and _kargs(lib, xs0=dg + 8, xs1=S * (dg + 8))[9] == 0
    assert _kargs(lib, H=3, G=2, q=256)[12] == 0 and _kargs(lib, H=6, G=3, q=256)[12] == 2
    assert _kargs(lib, mfma=2)[0] == 1                                                   # no such layout
    # the head kernel's limits: token rows < 2^31, S*H < 2^32, heads per group and groups <= 65535; padding rows
    # past the generic kernel's 2^31 chunks are fine
    s_max = 0x7FFFFFFF // (128 * 32)
    assert _kargs(lib, S=s_max, H=128, G=16, q=32, rows=s_max + 1, ss0=1, ss2=s_max + 1)[:1] == [0]
    # past the generic kernel's 2^31 chunks: one head-kernel launch (64-bit addresses), not the generic kernel
    assert _kargs(lib, S=s_max + 1, H=128, G=16, q=32, rows=s_max + 4, ss0=1, ss2=s_max + 4)[0] == 0
    assert _kargs(lib, S=s_max + 1, H=128, G=16, q=32, ss0=128 * 512 // 32, ss2=1)[0] == 4
    assert _kargs(lib, S=s_max + 1, H=128, G=16, q=32, ss0=128 * 512 // 32, ss2=1, kernel=1)[0] == 0
    assert _kargs(lib, S=2**20, H=2**13, G=1, q=32, ss0=2**17, ss2=1, kernel=1)[0] == 4  # S*H = 2^33
    assert _kargs(lib, S=1, H=2**17, G=1, q=128, rows=4, ss0=1, ss2=4)[0] == 4          # heads per group
    assert _kargs(lib, S=1, H=2**17, G=1, q=128, ss0=2**19, ss2=1)[:2] == [0, 2**22]   # the generic kernel's
    assert _kargs(lib, S=1, H=2**17, G=1, q=128, ss0=2**19, ss2=1, kernel=1)[0] == 4


@pytest.mark.parametrize("layout,q,scale_bytes", [("col", 128, 1), ("col", 32, 4), ("mfma_tile", 128, 1),
                                                  ("mfma_tile", 64, 1), ("mfma_tile", 256, 1)])
def test_tiled_kernel_writes_a_warps_scales_together(layout, q, scale_bytes):
    """The HIP tiled kernel's write-out (tile_slot, tile_scale_offset_bytes) for the first 32-token tile of S = 40
    tokens, H = 16, G = 2: every scale of those tokens exactly once, at the address of the layout's own map
    (column-major strides; fusedrope.reference.mfma_tile_offsets), and a warp's 32 stores together: one run of 32
    consecutive scales (32 bytes of e8m0, 128 of fp32) column-major; inside one 64-byte row of a tile for
    mfma_tile (its 32 tokens of one block interleave with a neighbouring block's)."""
    from fusedrope.inverse_rope_group_quant import reference as R

    lib = harness()
    lib.irgq_host_tile_offsets.restype = ctypes.c_int
    S, H, G = 40, 16, 2
    ks = H * 512 // G // q
    mfma = layout == "mfma_tile"
    ints = dict(S=S, H=H, D=512, o_dtype=0, pos64=1, pos_stride=1, cache_dtype=2, cos_stride=32, sin_stride=32,
                max_pos=100, rope=64, fnuz=0, G=G, q=q, f32=int(scale_bytes == 4), ss0=0 if mfma else 1,
                ss2=0 if mfma else S, pdl=0, xs0=0, xs1=0, mfma=int(mfma), rows=0 if mfma else S, kernel=1)
    slots = 32 * 512 // q
    out = (ctypes.c_longlong * (H * slots))()
    ptrs = (ctypes.c_void_p * 6)(*([4096] * 6))
    assert lib.irgq_host_tile_offsets(ptrs, (ctypes.c_longlong * 23)(*ints.values()), out) == 0
    got = torch.tensor(list(out)).view(H * slots // 32, 32)  # one row per warp
    idx = torch.stack(torch.meshgrid(torch.arange(32), torch.arange(G), torch.arange(ks), indexing="ij"), -1)
    if mfma:
        want = R.mfma_tile_offsets(S, G, ks, q)[:32]
    else:
        want = (idx * torch.tensor([1, ks * S, S])).sum(-1) * scale_bytes  # [s, g, k] at s + (g*Ks + k)*S
    assert sorted(got.flatten().tolist()) == sorted(want.flatten().tolist())
    span = got.max(1).values - got.min(1).values
    if mfma:
        assert bool((got // 64 == got[:, :1] // 64).all()) and bool((span < 64).all())
    else:
        assert bool((span == 31 * scale_bytes).all()) and bool((got.diff(dim=1) == scale_bytes).all())
