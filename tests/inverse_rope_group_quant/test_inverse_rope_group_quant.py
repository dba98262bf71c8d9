"""inverse_rope_group_quant: reference against independent fp64 formulations; every backend against the
reference (scale bytes bit-exact, fp8 within 1 ulp and bit-exact in blocks without rope dims)."""

import math
import struct

import importlib

import pytest
import torch
from torch._inductor.exc import InductorError

import fusedrope
from fusedrope import reference as R
from fusedrope._device import native_fp8_dtype
from fusedrope.benchmark.unfused import unfused_inverse_rope_group_quant
from fusedrope._validation import ENV_CHECK_POSITIONS
from fusedrope.inverse_rope_group_quant import REGISTRY, QuantModes, scale_strides, validate
from fusedrope.testing import (QuantCase, assert_quant_close, assert_ulp_close, bytes_written_outside,
                               deepseek_rope_cache, guarded_poison, make_quant_inputs, poison_like, rope_blocks,
                               scale_bytes)

from conftest import DEVICE, backends_here

BACKENDS = backends_here("inverse_rope_group_quant")
FP8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]
# The tests' default: what this device writes natively (fnuz on gfx942), the one format a compiled kernel writes
# there, so that it gets every test and not only those that pass fp8_dtype.
FP8_HERE = native_fp8_dtype(DEVICE)
SHAPES = [  # (H, G) of DeepSeek-V4 TP8, and shapes that are not DeepSeek's (groups splitting heads)
    QuantCase(3, 16, 2), QuantCase(5, 8, 1), QuantCase(4, 2, 3, head_dim=192, rope_dim=32, quant_group_size=64),
    QuantCase(2, 4, 2, head_dim=64, rope_dim=16, quant_group_size=32),
]


def skip_unless_available(backend):
    """Skip the test, with the registry's reason, where ``backend`` cannot run on this machine's device."""
    reason = REGISTRY.availability(REGISTRY.backend(backend), DEVICE)
    if reason:
        pytest.skip(f"{backend}: {reason}")


def skip_unless_served(backend, facts):
    """Skip the test, with the registry's reason, where ``backend`` does not serve these inputs (e.g. the
    compiled kernels serve head_dim 512 / rope_dim 64 only)."""
    reason = REGISTRY.decide(REGISTRY.backend(backend), facts)
    if reason:
        pytest.skip(f"{backend} does not serve these inputs: {reason}")


def run(backend, o, positions, cos, sin, case, transpose_scale=False, fp8_dtype=FP8_HERE,
        scale_dtype=torch.float8_e8m0fnu):
    """The backend on poisoned caller-provided buffers, through the public function."""
    x_fp8, x_scale = fusedrope.empty_quant_outputs(o, case.num_groups, case.quant_group_size, transpose_scale,
                                                   fp8_dtype=fp8_dtype, scale_dtype=scale_dtype)
    facts = validate(o, positions, cos, sin, case.num_groups, case.quant_group_size, transpose_scale, x_fp8,
                     x_scale)[0]
    skip_unless_served(backend, facts)
    x_fp8, x_scale = poison_like(x_fp8), poison_like(x_scale)
    out = fusedrope.inverse_rope_group_quant(o, positions, cos, sin, case.num_groups, case.quant_group_size,
                                             transpose_scale, x_fp8, x_scale, backend=backend)
    assert out[0] is x_fp8 and out[1] is x_scale
    return x_fp8, x_scale


def reference(o, positions, cos, sin, case, transpose_scale=False, fp8_dtype=FP8_HERE,
              scale_dtype=torch.float8_e8m0fnu):
    return fusedrope.inverse_rope_group_quant(o, positions, cos, sin, case.num_groups, case.quant_group_size,
                                              transpose_scale, fp8_dtype=fp8_dtype, scale_dtype=scale_dtype,
                                              backend="reference")


# -- the oracle against independent float64 formulations -------------------------------------------------
@pytest.mark.parametrize("case", SHAPES, ids=lambda c: c.id)
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_rotation_matches_complex_conjugate_oracle(case, cache_dtype):
    o, pos, cos, sin = make_quant_inputs(case, cache_dtype=cache_dtype, seed=1)
    got = R.inverse_rope_tail(o, pos, cos, sin).double()
    exact = R.inverse_rope_oracle(o, pos, cos, sin)
    # fp32: each output is one product sum of exact products, rounded at most twice.
    mag = o.double().abs().amax(-1, keepdim=True)
    assert bool(((got - exact).abs() <= mag * 2**-22).all())
    untouched = slice(0, case.head_dim - case.rope_dim)
    assert torch.equal(got[..., untouched], o.double()[..., untouched])


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("case", SHAPES[:3], ids=lambda c: c.id)
def test_quant_matches_float64_oracle(case, fp8_dtype):
    o, pos, cos, sin = make_quant_inputs(case, seed=2)
    x_fp8, x_scale = reference(o, pos, cos, sin, case, fp8_dtype=fp8_dtype)
    fp8_max = R.FP8_MAX[fp8_dtype]
    v = R.inverse_rope_tail(o, pos, cos, sin).double().reshape(case.num_tokens, case.num_groups, -1,
                                                                case.quant_group_size)
    amax = v.abs().amax(-1).clamp_min(1e-8)
    expo = torch.ceil(torch.log2(amax / fp8_max))  # no block of random data sits on a power of two
    assert torch.equal(scale_bytes(x_scale).long(), (expo + 127).long().reshape(x_scale.shape))
    q = (v / torch.exp2(expo)[..., None]).clamp(-fp8_max, fp8_max).reshape(x_fp8.shape)
    assert_ulp_close(x_fp8, q, 0, "fp8 vs fp64 / scale")  # fp8 of the exactly scaled value, rounded once


# -- backends ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", SHAPES, ids=lambda c: c.id)
@pytest.mark.parametrize("transpose_scale", [False, True])
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_backend_matches_reference(backend, case, transpose_scale, fp8_dtype):
    # with what random data lacks: clamped positions, a zero block, exact scale boundaries, NaN and Inf
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=3, edge_cases=True)
    got = run(backend, o, pos, cos, sin, case, transpose_scale, fp8_dtype)
    ref = reference(o, pos, cos, sin, case, transpose_scale, fp8_dtype)
    assert got[1].stride() == ref[1].stride()
    assert_quant_close(*got, *ref, rope_blocks(case), backend)


@pytest.mark.parametrize("case", SHAPES + [QuantCase(3, 3, 1, head_dim=96, rope_dim=24, quant_group_size=32),
                                  QuantCase(2, 3, 1, head_dim=1024, rope_dim=1024, quant_group_size=256)],
                         ids=lambda c: c.id)
@pytest.mark.parametrize("segments", ["launcher", "gather"])
def test_triton_rotation_forms_match_reference(case, segments, monkeypatch):
    """The Triton kernel's two rotations: by rope_dim segments where rope_dim is a power of two dividing
    head_dim and the 512-column tile (every shape here but the last two: 24 is no power of two, 1024 is wider
    than the tile), and the per-pair cos/sin gather, forced."""
    from fusedrope.inverse_rope_group_quant import triton as TK

    skip_unless_available("triton")
    assert TK.tail_segments(case.head_dim, case.rope_dim, 512) == (case.rope_dim not in (24, 1024))
    if segments == "gather":
        monkeypatch.setattr(TK, "tail_segments", lambda *a: False)
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=13, edge_cases=True)
    got = run("triton", o, pos, cos, sin, case)
    assert_quant_close(*got, *reference(o, pos, cos, sin, case), rope_blocks(case), "triton")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
@pytest.mark.parametrize("scale_dtype", [torch.float8_e8m0fnu, torch.uint8, torch.float32, torch.int32])
def test_group_sizes_and_scale_formats(backend, group_size, scale_dtype):
    case = QuantCase(3, 4, 2, quant_group_size=group_size)
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=4)
    got = run(backend, o, pos, cos, sin, case, scale_dtype=scale_dtype)
    ref = reference(o, pos, cos, sin, case, scale_dtype=torch.float8_e8m0fnu)
    assert got[1].dtype == scale_dtype
    if scale_dtype == torch.float32:  # the same powers of two, as floats
        assert torch.equal(got[1], R.e8m0_to_float(scale_bytes(ref[1])))
    assert_quant_close(*got, *ref, rope_blocks(case), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("o_dtype,cache_dtype,pos_dtype", [
    (torch.float16, torch.float16, torch.int32), (torch.bfloat16, torch.bfloat16, torch.int64),
    (torch.float16, torch.float32, torch.int64)])
def test_dtypes(backend, o_dtype, cache_dtype, pos_dtype):
    case = SHAPES[2]
    o, pos, cos, sin = make_quant_inputs(case, o_dtype, cache_dtype, DEVICE, seed=5, positions_dtype=pos_dtype)
    assert_quant_close(*run(backend, o, pos, cos, sin, case), *reference(o, pos, cos, sin, case),
                       rope_blocks(case), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_positions_and_cache_rows(backend):
    case = SHAPES[0]
    o, pos, _, _ = make_quant_inputs(case, device=DEVICE, seed=6)
    long_pos = torch.cat([pos, pos.flip(0)])  # longer than S: only the first S are read
    wide = torch.randn(300, 3, 64).to(DEVICE)  # cos rows 192 apart, sin's 100: each table's stride is its own
    cos, sin = wide[:, 0, 5:37], torch.randn(300, 100).to(DEVICE)[:, 20:52]
    assert long_pos.shape[0] > case.num_tokens and cos.stride(0) == 192 and sin.stride(0) == 100
    pos2 = long_pos % 300
    assert_quant_close(*run(backend, o, pos2, cos, sin, case), *reference(o, pos2, cos, sin, case),
                       rope_blocks(case), backend)
    strided = (torch.arange(2 * case.num_tokens, device=DEVICE) * 7 % 300)[::2]
    assert strided.stride(0) == 2
    assert_quant_close(*run(backend, o, strided, cos, sin, case), *reference(o, strided, cos, sin, case),
                       rope_blocks(case), backend)


def _boundary_inputs(fp8_max, o_dtype=torch.bfloat16, ks=(-3, 0, 5, 9)):
    """A [1, 4, 512] o whose rope blocks (the last block of each head) have amax exactly fp8_max*2^k and one
    fp32 ulp either side, made exactly in fp32 by the rotation: e' = e*1 + d*2^-16 with e = fp8_max*2^k,
    d = +-2^(k+1), so d*n = +-ulp(e). Non-rope blocks hold fp8_max*2^k exactly (bf16 represents it)."""
    case = QuantCase(1, 4, 1)
    o = torch.zeros(1, 4, 512)
    expect = torch.zeros(4, 4, dtype=torch.long)  # [head, block]
    cos = torch.ones(8, 32)
    sin = torch.zeros(8, 32)
    sin[2, 0] = 2.0**-16
    for h, k in enumerate(ks):
        o[0, h, :128] = 0.5  # a small value beside the boundary one
        o[0, h, 5] = fp8_max * 2.0**k  # block 0: exactly on the boundary
        o[0, h, 200] = -fp8_max * 2.0**k * 0.75  # block 1: in between
        o[0, h, 300] = fp8_max * 2.0 ** (k - 1)  # block 2: the boundary below
        tail = 448
        o[0, h, tail] = fp8_max * 2.0**k
        o[0, h, tail + 1] = (2.0 ** (k + 1)) * (1 if h % 2 == 0 else -1)  # +1 ulp on even heads, -1 on odd
        expect[h] = torch.tensor([127 + k, 127 + k, 126 + k, 128 + k if h % 2 == 0 else 127 + k])
    positions = torch.full((1,), 2)
    return case, o.to(o_dtype), positions, cos, sin, expect


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("o_dtype", [torch.bfloat16, torch.float16])
def test_exact_power_of_two_boundaries(backend, fp8_dtype, o_dtype):
    fp8_max = R.FP8_MAX[fp8_dtype]
    ks = (-3, 0, 5, 9) if o_dtype == torch.bfloat16 else (-3, 0, 3, 6)  # fp16 tops out at 65504
    case, o, pos, cos, sin, expect = _boundary_inputs(fp8_max, o_dtype, ks)
    assert bool(torch.isfinite(o.float()).all())
    x_fp8, x_scale = run(backend, *(t.to(DEVICE) for t in (o, pos, cos, sin)), case, fp8_dtype=fp8_dtype)
    assert torch.equal(scale_bytes(x_scale).reshape(4, 4).long().cpu(), expect)
    # The boundary element itself quantises to exactly +-fp8_max.
    assert x_fp8.float()[0, 0, 5].item() == fp8_max


def test_boundary_inputs_really_straddle_the_boundary():
    ks = (-3, 0, 5, 9)
    case, o, pos, cos, sin, _ = _boundary_inputs(448.0, torch.bfloat16, ks)
    rot = R.inverse_rope_tail(o, pos, cos, sin)
    for h, k in enumerate(ks):
        e = torch.tensor(448.0 * 2.0**k)
        want = torch.nextafter(e, torch.tensor(math.inf if h % 2 == 0 else -math.inf))  # one fp32 ulp
        assert rot[0, h, 448].item() == want.item() != e.item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_zero_blocks_get_the_floor_byte(backend):
    """92 for e4m3fn, 93 for fnuz (test_scale_bytes_from_the_formula_at_every_boundary)."""
    case = QuantCase(2, 4, 2, quant_group_size=32)
    o = torch.zeros(2, 4, 512, dtype=torch.bfloat16, device=DEVICE)
    o[1, 3, 7] = 1.0
    pos = torch.tensor([0, 9], device=DEVICE)
    cos, sin = (t.to(DEVICE) for t in deepseek_rope_cache(16))
    x_fp8, x_scale = run(backend, o, pos, cos, sin, case)
    b, floor = scale_bytes(x_scale), _e8m0_byte(0.0, R.FP8_MAX[FP8_HERE])
    assert int(b[0].min()) == int(b[0].max()) == floor and int((b != floor).sum()) == 1
    assert int(x_fp8.float().count_nonzero()) == 1  # (the rotation may leave -0.0: IEEE 0*c - 0*n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_nan_and_inf_stay_in_their_block(backend, fp8_dtype):
    case = QuantCase(2, 4, 2, quant_group_size=64)
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=8)
    clean = run(backend, o, pos, cos, sin, case, fp8_dtype=fp8_dtype)
    bad = o.clone()
    bad[0, 0, 3] = float("nan")  # a block with no rope dims
    bad[1, 1, 511] = float("inf")  # the rope tail: the rotation spreads it within its pair only
    bad[1, 3, 70] = -float("inf")
    got = run(backend, bad, pos, cos, sin, case, fp8_dtype=fp8_dtype)
    blocks = torch.zeros(2, 4 * 512 // 64, dtype=torch.bool)
    blocks[0, 0] = blocks[1, (512 + 511) // 64] = blocks[1, (3 * 512 + 70) // 64] = True
    sb, cb = scale_bytes(got[1]).reshape(2, -1), scale_bytes(clean[1]).reshape(2, -1)
    assert torch.equal(sb[blocks], torch.full((3,), 0xFF, dtype=torch.uint8))
    assert torch.equal(sb[~blocks], cb[~blocks])
    vals = got[0].view(torch.uint8).reshape(2, -1, 64)
    assert bool(torch.isnan(got[0].float().reshape(2, -1, 64)[blocks]).all())
    assert torch.equal(vals[~blocks], clean[0].view(torch.uint8).reshape(2, -1, 64)[~blocks])
    ref = reference(bad, pos, cos, sin, case, fp8_dtype=fp8_dtype)
    assert torch.equal(scale_bytes(ref[1]), scale_bytes(got[1]))


@pytest.mark.parametrize("value, on", [("", False), ("0", False), ("false", False), ("OFF", False), ("No", False),
                                       ("1", True), ("true", True), ("yes", True)])
def test_position_check_switch_values(value, on, monkeypatch):
    """FUSEDROPE_CHECK_POSITIONS: off when empty, 0, false, no or off (any case), on for anything else."""
    case = QuantCase(2, 2, 1)
    o, _, cos, sin = make_quant_inputs(case, device=DEVICE, seed=3, max_pos=32)
    wild = torch.tensor([-1, 40], device=DEVICE)
    monkeypatch.setenv("FUSEDROPE_CHECK_POSITIONS", value)
    if on:
        with pytest.raises(ValueError, match=r"argument 'positions' expected values in \[0, max_pos=32\)"):
            fusedrope.inverse_rope_group_quant(o, wild, cos, sin, 1, backend="reference", fp8_dtype=FP8_HERE)
    else:
        fusedrope.inverse_rope_group_quant(o, wild, cos, sin, 1, backend="reference", fp8_dtype=FP8_HERE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_position_check_reads_only_the_first_s_positions(backend, monkeypatch):
    """positions may be longer than S (an engine's max-size buffer, its tail stale or padded with -1): the debug
    check looks at the S positions the op reads, as the op does, and the call gives the bytes it gives without
    the check."""
    case = QuantCase(3, 2, 1)
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=13, max_pos=32)
    padded = torch.cat([pos[:3], torch.tensor([-1, 32, 10**9], device=DEVICE)])
    want = run(backend, o, pos[:3], cos, sin, case)
    monkeypatch.setenv("FUSEDROPE_CHECK_POSITIONS", "1")
    got = run(backend, o, padded, cos, sin, case)
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(scale_bytes(got[1]), scale_bytes(want[1]))
    padded[1] = 32
    with pytest.raises(ValueError, match=r"got positions\[1\]=32 \(1 out of range\)"):
        run(backend, o, padded, cos, sin, case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_token(backend):
    """(S = 0: test_empty_inputs_launch_nothing.)"""
    case = QuantCase(1, 16, 2)
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=10)
    got = run(backend, o, pos, cos, sin, case, transpose_scale=True)
    assert got[0].shape == (1, 2, 4096) and got[1].shape == (1, 2, 32)
    assert_quant_close(*got, *reference(o, pos, cos, sin, case, True), rope_blocks(case), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_allocating_call_and_layouts(backend):
    case = SHAPES[0]
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=11)
    x, s = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, backend=backend, fp8_dtype=FP8_HERE)
    assert x.dtype == FP8_HERE and x.is_contiguous() and s.dtype == torch.float8_e8m0fnu
    assert s.is_contiguous()
    xt, st = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, True, backend=backend, fp8_dtype=FP8_HERE)
    S, G, Ks = st.shape
    assert st.stride() == (1, Ks * S, S)
    assert torch.equal(st.view(torch.uint8), s.view(torch.uint8))
    assert torch.equal(xt.view(torch.uint8), x.view(torch.uint8))
    # The column-major storage really is [G, Ks, S] with S fastest.
    storage = torch.as_strided(st.view(torch.uint8), (G, Ks, S), (Ks * S, S, 1))
    assert torch.equal(storage, s.view(torch.uint8).permute(1, 2, 0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose_scale", [False, True])
def test_packed_ue8m0_is_deepgemms_layout(backend, transpose_scale):
    case = QuantCase(3, 16, 2)  # S = 3: the MN-major layout pads tokens to 4
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=16)
    got = run(backend, o, pos, cos, sin, case, transpose_scale, scale_dtype=torch.int32)[1]
    byte = scale_bytes(reference(o, pos, cos, sin, case)[1]).long().cpu()  # [S, G, 32]
    assert got.shape == (3, 2, 8) and got.dtype == torch.int32
    assert got.stride() == ((1, 8 * 4, 4) if transpose_scale else (16, 8, 1))
    for s, g, j in [(0, 0, 0), (2, 1, 7), (1, 0, 5), (2, 0, 3)]:
        word = int(got[s, g, j]) & 0xFFFFFFFF
        want = sum(int(byte[s, g, 4 * j + i]) << (8 * i) for i in range(4))
        assert word == want
    if transpose_scale:  # DeepGEMM's tensor is [G, S, Ks/4] with strides (Ks/4 * align(S, 4), 1, align(S, 4))
        assert got.permute(1, 0, 2).stride() == (8 * 4, 1, 4)
        # ... and the storage the op allocates holds the padding tokens of the last column too (a consumer may
        # map all of it, as DeepGEMM allocates it), as does empty_quant_outputs'
        own = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, True, backend=backend,
                                                 fp8_dtype=FP8_HERE, scale_dtype=torch.int32)
        assert own[1].untyped_storage().nbytes() == 2 * 8 * 4 * 4 and torch.equal(own[1], got)
        made = fusedrope.empty_quant_outputs(o, 2, 128, True, scale_dtype=torch.int32)[1]
        assert made.untyped_storage().nbytes() == 2 * 8 * 4 * 4 and made.stride() == got.stride()


# -- baseline ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", SHAPES + [QuantCase(5, 3, 1, head_dim=96, rope_dim=24, quant_group_size=32),
                                  QuantCase(3, 5, 1, head_dim=64, rope_dim=2, quant_group_size=32),
                                  QuantCase(37, 17, 1, head_dim=64, rope_dim=64, quant_group_size=64)],
                         ids=lambda c: c.id)
def test_unfused_baseline_is_the_bf16_round_trip(case, monkeypatch):
    from fusedrope.inverse_rope_group_quant import triton as TK

    skip_unless_available("triton")
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=12, max_pos=64)
    pos[0] = 10**6  # clamped, as in the fused op
    # No cache row is the identity (row 0, which masked-off tokens read, would rewrite the bytes it read), and
    # each head opens with the pair (-0.0, inf), which even an identity rotation changes: a kernel that writes
    # past the tails (padding pairs of a rope_dim that is no power of two spill into the next head) or past
    # the last token shows in o or in the guard bytes.
    cos, sin = cos * 0.75 + 0.125, sin * 0.75 - 0.25
    if case.rope_dim < case.head_dim:
        o[..., 0], o[..., 1] = -0.0, float("inf")
    rotated_bf16 = R.inverse_rope_tail(o, pos, cos, sin).to(o.dtype)
    # in place: nothing outside o may change, and the guard around it is (-0.0, inf) pairs, which the identity
    # rotation that masked-off tokens get from the cos/sin loads' defaults changes too
    o_work, buf = guarded_poison(o.shape, o.dtype, DEVICE)
    pairs = torch.tensor([-0.0, float("inf")], dtype=o.dtype, device=DEVICE).repeat(buf.numel() // 2 + 1)
    buf.copy_(pairs[:buf.numel()])
    o_work.copy_(o)
    guard = buf.view(torch.int16).clone()
    launch, positions_given = TK._launch_quant, []
    monkeypatch.setattr(TK, "_launch_quant", lambda o, p, *a, **k: positions_given.append(p) or launch(o, p, *a, **k))
    x, s = unfused_inverse_rope_group_quant(o_work, pos, cos, sin, case.num_groups, case.quant_group_size)
    # the quant step fills its unused positions slot with the caller's tensor: no per-call allocation (and
    # fill kernel) that would add to the baseline's measured time
    assert len(positions_given) == 1 and positions_given[0] is pos
    assert torch.equal(o_work, rotated_bf16)  # step 1 rotated the tails in place, rounded to bf16
    changed = buf.view(torch.int16) != guard
    changed[o_work.storage_offset():o_work.storage_offset() + o_work.numel()] = False
    assert not changed.any(), f"{int(changed.sum())} elements written outside o"
    q, byte = R.group_quant_e8m0(rotated_bf16, case.num_groups, case.quant_group_size, torch.float8_e4m3fn)
    assert torch.equal(scale_bytes(s), byte) and torch.equal(x.view(torch.uint8), q.view(torch.uint8))


# -- torch.compile and the torch ops ------------------------------------------------------------------------
INDUCTOR_E8M0 = pytest.mark.xfail(
    DEVICE.type == "cpu", strict=True, raises=InductorError,
    reason="torch 2.13's CPU inductor cannot compile a mutated e8m0 graph input (InductorError: "
           "auto_functionalized_v2 was not removed); pass the same bytes as a uint8 buffer instead")


@pytest.mark.parametrize("transpose_scale", [False, pytest.param(True, marks=pytest.mark.slow)])  # a compile each
@pytest.mark.parametrize("scale_dtype,buffers", [
    (torch.float8_e8m0fnu, False), (torch.uint8, False), (torch.float32, False), (torch.uint8, True),
    (torch.float32, True), pytest.param(torch.float8_e8m0fnu, True, marks=INDUCTOR_E8M0)])
def test_torch_compile_gets_identical_bytes(transpose_scale, scale_dtype, buffers):
    case = SHAPES[0]
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=13)

    def wo_a_input(o, pos, cos, sin, x_fp8=None, x_scale=None):
        x, s = fusedrope.inverse_rope_group_quant(o * 1, pos, cos, sin, 2, 128, transpose_scale, x_fp8, x_scale,
                                                  scale_dtype=None if buffers else scale_dtype)
        # Read the outputs elementwise after the op: fake strides unlike the real ones would read garbage.
        s_read = s if s.dtype == torch.float8_e8m0fnu else s.to(torch.float32) * 3
        return x.view(torch.uint8).to(torch.int32) + 1, s_read, s

    torch._dynamo.reset()
    compiled = torch.compile(wo_a_input, fullgraph=True)
    if buffers:
        bufs = lambda: fusedrope.empty_quant_outputs(o, 2, 128, transpose_scale, scale_dtype=scale_dtype)  # noqa: E731
        eager, got = wo_a_input(o, pos, cos, sin, *bufs()), compiled(o, pos, cos, sin, *bufs())
    else:
        eager, got = wo_a_input(o, pos, cos, sin), compiled(o, pos, cos, sin)
    bytes_of = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t  # noqa: E731
    for a, b in zip(got, eager):
        assert a.stride() == b.stride() and torch.equal(bytes_of(a), bytes_of(b))


@pytest.mark.parametrize("given", ["x_fp8", "x_scale"])
def test_torch_compile_with_one_buffer_allocates_the_other_as_eager_does(given):
    o, pos, cos, sin = make_quant_inputs(SHAPES[0], device=DEVICE, seed=15)

    def wo_a_input(o, pos, cos, sin, buf):
        kw = {given: buf}
        return fusedrope.inverse_rope_group_quant(o * 1, pos, cos, sin, 2, 64, True, **kw)

    def buffer():
        x, s = fusedrope.empty_quant_outputs(o, 2, 64, True, scale_dtype=torch.uint8)
        return poison_like(x if given == "x_fp8" else s)

    torch._dynamo.reset()
    eager_buf, got_buf = buffer(), buffer()
    eager = wo_a_input(o, pos, cos, sin, eager_buf)
    got = torch.compile(wo_a_input, fullgraph=True)(o, pos, cos, sin, got_buf)
    mine = 0 if given == "x_fp8" else 1
    assert got[mine] is got_buf and eager[mine] is eager_buf
    for a, b in zip(got, eager):
        assert a.dtype == b.dtype and a.stride() == b.stride()
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# opcheck's test_schema does arithmetic on the outputs, which torch has no fp8 kernels for on CPU.
OPCHECKS = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def test_opcheck_the_torch_op():
    case = SHAPES[3]
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=14)
    for ts in (False, True):
        for sd in (torch.uint8, torch.int32):  # int32 column-major: a view of its padded storage
            x, s = fusedrope.empty_quant_outputs(o, 2, 32, ts, scale_dtype=sd)
            torch.library.opcheck(torch.ops.fusedrope.inverse_rope_group_quant_out.default,
                                  (o, pos, cos, sin, 2, 32, ts, x, s, "reference"), test_utils=OPCHECKS)


def test_selection_facts_are_cached_per_layout():
    case = SHAPES[0]
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=15)
    facts = validate(o, pos, cos, sin, 2, 128, True)[0]
    assert REGISTRY.select(facts) is REGISTRY.select(facts)


# -- property-based: random shapes, layouts and formats -------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def quant_shapes(draw):
    gs = draw(st.sampled_from([32, 64, 128]))
    head_dim = draw(st.sampled_from([64, 96, 128, 192, 512]))
    rope_dim = 2 * draw(st.integers(1, head_dim // 2))
    heads = draw(st.integers(1, 6))
    blocks = heads * head_dim // gs
    if heads * head_dim % gs or blocks == 0:
        head_dim, rope_dim = 512, 64  # fall back to a shape every group size divides
        blocks = heads * 512 // gs
    groups = draw(st.sampled_from([g for g in range(1, blocks + 1) if blocks % g == 0]))
    return QuantCase(draw(st.integers(1, 5)), heads, groups, head_dim, rope_dim, gs)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=quant_shapes(), transpose_scale=st.booleans(), fp8_dtype=st.sampled_from(FP8),
       scale_dtype=st.sampled_from([torch.float8_e8m0fnu, torch.float32]), seed=st.integers(0, 2**16))
def test_property_triton_matches_reference(case, transpose_scale, fp8_dtype, scale_dtype, seed):
    backend = "triton"
    skip_unless_available(backend)
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=seed, max_pos=64)
    pos[0] = 10**6  # out of range: clamped
    got = run(backend, o, pos, cos, sin, case, transpose_scale, fp8_dtype, scale_dtype)
    ref = reference(o, pos, cos, sin, case, transpose_scale, fp8_dtype, scale_dtype)
    assert got[1].stride() == ref[1].stride()
    assert_quant_close(*got, *ref, rope_blocks(case), backend)


# -- caller buffers, autograd, tracing ---------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose_scale", [False, True])
def test_one_block_per_group_scale_buffer_with_any_size1_stride(backend, transpose_scale):
    """Ks == 1: the scale buffer's last dim has size 1, so its stride addresses nothing and may be anything.
    Every block lands where the layout says, and no byte past the buffer's elements is written."""
    case = QuantCase(3, 2, 2, head_dim=128, quant_group_size=128)  # Dg = 128 -> Ks = 1
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=21)
    if REGISTRY.decide(REGISTRY.backend(backend), validate(o, pos, cos, sin, 2, 128, transpose_scale, None, None,
                                                         QuantModes(FP8_HERE))[0]):
        pytest.skip(f"{backend} does not serve head_dim 128")
    want_fp8, want_scale = reference(o, pos, cos, sin, case, transpose_scale)
    S, G = 3, 2
    arena = torch.full((4096,), 0xAB, dtype=torch.uint8, device=DEVICE)
    strides = (1, S, 1000) if transpose_scale else (G, 1, 1000)  # as torch.empty(G, S).t().unsqueeze(-1) gives
    x_scale = arena.as_strided((S, G, 1), strides).view(torch.float8_e8m0fnu)
    x_fp8 = poison_like(torch.empty(S, G, 128, dtype=FP8_HERE, device=DEVICE))
    fusedrope.inverse_rope_group_quant(o, pos, cos, sin, G, 128, transpose_scale, x_fp8, x_scale, backend=backend)
    assert torch.equal(x_scale.view(torch.uint8), want_scale.view(torch.uint8))
    assert torch.equal(arena[S * G:], torch.full_like(arena[S * G:], 0xAB)), "wrote past the scale buffer"
    assert_quant_close(x_fp8, x_scale, want_fp8, want_scale, rope_blocks(case), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_tokens_with_any_scale_buffer_strides(backend):
    """S = 0: strides of an empty buffer mean nothing, so the natural column-major allocation is accepted."""
    o, pos, cos, sin = make_quant_inputs(QuantCase(0, 16, 2), device=DEVICE)
    x_fp8 = torch.empty(0, 2, 4096, dtype=FP8_HERE, device=DEVICE)
    x_scale = torch.empty(2, 32, 0, dtype=torch.float8_e8m0fnu, device=DEVICE).permute(2, 0, 1)
    out = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, True, x_fp8, x_scale, backend=backend)
    assert out[0] is x_fp8 and out[1] is x_scale


def _valid_calls():
    o, pos, cos, sin = make_quant_inputs(QuantCase(3, 16, 2), device=DEVICE)
    yield (o, pos, cos, sin, 2, 128, False, None, None, QuantModes())
    yield (o, pos, cos, sin, 2, 32, True, None, None, QuantModes(torch.float8_e4m3fnuz, torch.int32))
    for ts in (False, True):
        for sd in (torch.float8_e8m0fnu, torch.uint8, torch.float32, torch.int32):
            bufs = fusedrope.empty_quant_outputs(o, 2, 64, ts, scale_dtype=sd)
            yield (o, pos, cos, sin, 2, 64, ts, *bufs)
            yield (o, pos, cos, sin, 2, 64, ts, *bufs, QuantModes(torch.float8_e4m3fn, sd))
    yield (o, pos, cos[:, :8], sin[:, :8], 16, 256, False)
    yield (o[:0], pos[:0], cos, sin, 1, 128, False)
    # column-major scales in a max-size buffer: the token dim padded to 8
    x, s = fusedrope.empty_quant_outputs(torch.empty(8, 16, 512, dtype=torch.bfloat16, device=DEVICE), 2, 64, True,
                                         scale_dtype=torch.float32)
    yield (o, pos, cos, sin, 2, 64, True, x[:3], s[:3])
    # the whole head rotated: rope_dim == head_dim
    o, pos, cos, sin = make_quant_inputs(QuantCase(3, 4, 2, head_dim=64, rope_dim=64, quant_group_size=32),
                                         device=DEVICE)
    yield (o, pos, cos, sin, 2, 32, False)


def test_fast_validation_agrees_with_every_check(monkeypatch):
    """validate()'s one-expression path takes every valid call (without falling back to the check-by-check
    path) and returns what the check-by-check path returns."""
    irq = importlib.import_module("fusedrope.inverse_rope_group_quant")  # the package (fusedrope.X is the function)

    check_by_check = irq._validate_all

    def not_here(*args):
        raise AssertionError("validate() left its fast path for a valid call")

    n = 0
    for args in _valid_calls():
        monkeypatch.setattr(irq, "_validate_all", not_here)
        fast = validate(*args)
        monkeypatch.setattr(irq, "_validate_all", check_by_check)
        assert fast == check_by_check(*args)
        n += 1
    assert n == 22


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_dim_2_caches_with_any_last_stride(backend):
    """rope_dim = 2: the caches' last dim has size 1, so its stride addresses nothing (a column of a transposed
    table); accepted, with the bytes a contiguous cache gives."""
    case = QuantCase(3, 2, 1, head_dim=64, rope_dim=2, quant_group_size=32)
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=23, max_pos=16)
    cos_t, sin_t = cos.t().contiguous().t(), sin.t().contiguous().t()
    assert cos_t.stride() == sin_t.stride() == (1, 16) and torch.equal(cos_t, cos) and torch.equal(sin_t, sin)
    want_fp8, want_scale = reference(o, pos, cos.contiguous(), sin.contiguous(), case)
    x_fp8, x_scale = run(backend, o, pos, cos_t, sin_t, case)
    assert_quant_close(x_fp8, x_scale, want_fp8, want_scale, rope_blocks(case), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_buffers_made_inside_inference_mode(backend):
    """How an engine calls: inputs and caller buffers made inside torch.inference_mode() are written there (only
    outside it does torch refuse writes into inference tensors)."""
    case = QuantCase(3, 16, 2)
    with torch.inference_mode():
        o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=29)
        want_fp8, want_scale = reference(o, pos, cos, sin, case)
        x_fp8, x_scale = run(backend, o, pos, cos, sin, case)
        assert x_fp8.is_inference() and x_scale.is_inference()
    assert_quant_close(x_fp8, x_scale, want_fp8, want_scale, rope_blocks(case), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_that_require_grad_give_outputs_that_refuse_backward(backend):
    """No backend has a derivative: every one of them raises on backward instead of cutting the graph; caller
    buffers written from such inputs carry no history."""
    case = SHAPES[0]
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE)
    want = reference(o, pos, cos, sin, case)
    o.requires_grad_()
    x, s = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, backend=backend, fp8_dtype=FP8_HERE)
    assert torch.equal(x.view(torch.uint8), want[0].view(torch.uint8))
    assert x.requires_grad
    with pytest.raises(RuntimeError, match="no autograd formula"):
        x.float().sum().backward()
    with torch.no_grad():  # the usual inference call: plain outputs
        assert not fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, backend=backend,
                                                      fp8_dtype=FP8_HERE)[0].requires_grad
    x_fp8, x_scale = fusedrope.empty_quant_outputs(o, 2, fp8_dtype=FP8_HERE)
    fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, False, x_fp8, x_scale, backend=backend)
    assert not x_fp8.requires_grad and x_fp8.grad_fn is None and x_scale.grad_fn is None
    assert torch.equal(x_fp8.view(torch.uint8), want[0].view(torch.uint8))


def test_num_groups_traced_as_symint():
    """Under torch.compile(dynamic=True) num_groups arrives as a SymInt, which the op's schema allows."""
    o, pos, cos, sin = make_quant_inputs(QuantCase(3, 16, 2), device=DEVICE)
    fn = torch.compile(lambda o, p, c, s, g: fusedrope.inverse_rope_group_quant(o, p, c, s, g, 128,
                                                                               backend="reference"),
                       fullgraph=True, dynamic=True, backend="eager")
    for g in (2, 1, 4):
        got, want = fn(o, pos, cos, sin, g), fusedrope.inverse_rope_group_quant(o, pos, cos, sin, g,
                                                                                backend="reference")
        assert got[0].shape == want[0].shape == (3, g, 16 * 512 // g)
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
        assert torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))


def test_fp8_dtype_defaults_to_e4m3fn_on_every_device():
    """The default is the contract's float8_e4m3fn (docs/inverse_rope_group_quant.md), also where the tests
    default to the device's own format."""
    o, pos, cos, sin = make_quant_inputs(SHAPES[0], device=DEVICE)
    assert fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, backend="reference")[0].dtype == torch.float8_e4m3fn
    assert fusedrope.empty_quant_outputs(o, 2)[0].dtype == torch.float8_e4m3fn


def test_position_check_skips_meta_tensors(monkeypatch):
    monkeypatch.setenv(ENV_CHECK_POSITIONS, "1")
    o, pos, cos, sin = (t.to("meta") for t in make_quant_inputs(QuantCase(3, 16, 2)))
    x, s = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, backend="reference")
    assert x.device.type == "meta" and s.shape == (3, 2, 32)


# -- clamping against hand-picked rows, fnuz zero, guard bytes, empty launches ------------------------------
def _quant_at_rows(o, rows, cos, sin, case, fp8_dtype=FP8_HERE):
    """The op's math on cache rows picked by hand, never through reference.clamp_positions (which the oracle
    and the reference backend share): the fp32 rotation as the reference writes it, then its quantiser."""
    rows = torch.tensor(rows, device=o.device)
    c, n = cos[rows].float()[:, None, :], sin[rows].float()[:, None, :]
    x = o.float().clone()
    tail = x[..., case.head_dim - case.rope_dim:]
    e, d = tail[..., 0::2].clone(), tail[..., 1::2].clone()
    tail[..., 0::2] = e * c + d * n
    tail[..., 1::2] = d * c - e * n
    return R.group_quant_e8m0(x, case.num_groups, case.quant_group_size, fp8_dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("wild", [torch.tensor([-5, 31, 32, 10**12]),
                                  torch.tensor([-5, 31, 32, 2**31 - 1], dtype=torch.int32)], ids=["int64", "int32"])
def test_clamping_lands_on_row_max_pos_minus_1(backend, wild, monkeypatch):
    """Out-of-range positions read row 0 / row max_pos-1 exactly, against rows written by hand (a backend and
    the reference that both clamped to max_pos-2 would pass a same-backend comparison), and give the bytes the
    in-range positions give; FUSEDROPE_CHECK_POSITIONS=1 refuses them, explain() too."""
    case = QuantCase(4, 2, 1)
    o, _, cos, sin = make_quant_inputs(case, device=DEVICE, seed=31, max_pos=32)
    assert not torch.equal(cos[30], cos[31]) and not torch.equal(sin[30], sin[31])
    wild, tame = wild.to(DEVICE), torch.tensor([0, 31, 31, 31], device=DEVICE)
    got_fp8, got_scale = run(backend, o, wild, cos, sin, case)
    want = _quant_at_rows(o, [0, 31, 31, 31], cos, sin, case)
    with pytest.raises(AssertionError):  # the contract's tolerance still tells row 30 from row 31
        assert_quant_close(*_quant_at_rows(o, [0, 30, 30, 30], cos, sin, case), *want, rope_blocks(case))
    assert_quant_close(got_fp8, got_scale, *want, rope_blocks(case), backend)
    same = run(backend, o, tame, cos, sin, case)
    assert torch.equal(got_fp8.view(torch.uint8), same[0].view(torch.uint8))
    assert torch.equal(scale_bytes(got_scale), scale_bytes(same[1]))
    monkeypatch.setenv("FUSEDROPE_CHECK_POSITIONS", "1")
    with pytest.raises(ValueError, match=r"argument 'positions' expected values in \[0, max_pos=32\), "
                                         r"got positions\[0\]=-5 \(3 out of range\)"):
        fusedrope.inverse_rope_group_quant(o, wild, cos, sin, 1, backend=backend, fp8_dtype=FP8_HERE)
    with pytest.raises(ValueError, match=r"argument 'positions' expected values in \[0, max_pos=32\)"):
        fusedrope.explain("inverse_rope_group_quant", o, wild, cos, sin, 1, backend=backend)  # as the call would
    fusedrope.inverse_rope_group_quant(o, tame, cos, sin, 1, backend=backend, fp8_dtype=FP8_HERE)  # in range: fine


def _fp32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _e8m0_byte(amax: float, fp8_max: float) -> int:
    """The contract's formula (docs/inverse_rope_group_quant.md) in plain fp32 arithmetic: t = max(amax, 1e-8) *
    fp32(1/FP8_MAX); the byte is t's biased exponent plus 1 when its mantissa is non-zero. (The fp64 product of two
    fp32 values is exact, so rounding it to fp32 once gives the fp32 product.)"""
    bits = struct.unpack("<I", struct.pack("<f", _fp32(_fp32(max(amax, 1e-8)) * _fp32(1.0 / fp8_max))))[0]
    return ((bits >> 23) & 0xFF) + int((bits & 0x7FFFFF) != 0)


@pytest.mark.parametrize("fp8_max", [448.0, 240.0])
def test_scale_bytes_from_the_formula_at_every_boundary(fp8_max):
    """The reference's bit-mask scale bytes against the plain-arithmetic formula over the probe amaxes, among
    them those whose t has a single mantissa bit set (t = 1.5 * 2^k must round up too)."""
    from irgq_harness import e8m0_probe_values

    amax = e8m0_probe_values()
    t_bits = (amax.clamp_min(1e-8) * torch.tensor(1.0 / fp8_max)).view(torch.int32)
    if fp8_max == 240.0:  # the probes reach t = 1.5 * 2^k exactly (with 448 no fp32 amax lands on it)
        assert bool(((t_bits & 0x7FFFFF) == 0x400000).any())
    assert 0.0 in amax.tolist() and _e8m0_byte(0.0, fp8_max) == {448.0: 92, 240.0: 93}[fp8_max]  # the floor's byte
    got = R.e8m0_scale_bytes(amax, fp8_max).tolist()
    want = [_e8m0_byte(a, fp8_max) for a in amax.tolist()]
    assert got == want, next((a, g, w) for a, g, w in zip(amax.tolist(), got, want) if g != w)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("big", [240.0, 448.0])
def test_tiny_negatives_quantise_to_plus_zero_in_fnuz(backend, fp8_dtype, big):
    """A negative value that rounds to zero is byte 0x00 in e4m3fnuz, never 0x80 (its NaN); an all-zero block
    (here of -0.0 values) gets the floor's byte from the formula (93 for fnuz, 92 for e4m3fn)."""
    case = QuantCase(2, 2, 1)
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=32)
    tiny = -1e-4
    o[1, 1, 128:256] = tiny
    o[1, 1, 128] = big
    o[0, 0, 0:128] = -0.0
    byte_big = _e8m0_byte(big, R.FP8_MAX[fp8_dtype])
    step = torch.finfo(fp8_dtype).smallest_normal / 8  # the smallest subnormal: 3 mantissa bits
    assert abs(o[1, 1, 129].item()) / 2.0 ** (byte_big - 127) < step / 2  # really rounds to zero
    x_fp8, x_scale = run(backend, o, pos, cos, sin, case, fp8_dtype=fp8_dtype)
    assert not bool(torch.isnan(x_fp8.float()).any())
    assert_quant_close(x_fp8, x_scale, *reference(o, pos, cos, sin, case, fp8_dtype=fp8_dtype), rope_blocks(case),
                       backend)
    b = scale_bytes(x_scale)  # [S, G=1, Ks=8]: token 1, head 1, block 1 is block 5
    assert int(b[1, 0, 5]) == byte_big
    assert int(b[0, 0, 0]) == _e8m0_byte(0.0, R.FP8_MAX[fp8_dtype])
    q = x_fp8.view(torch.uint8)
    assert bool((x_fp8.float()[1, 0, 512 + 129:768] == 0).all()) and bool((x_fp8.float()[0, 0, :128] == 0).all())
    if fp8_dtype == torch.float8_e4m3fnuz:
        assert torch.equal(q[1, 0, 512 + 129:768], torch.zeros(127, dtype=torch.uint8, device=q.device))
        assert torch.equal(q[0, 0, :128], torch.zeros(128, dtype=torch.uint8, device=q.device))


GUARD = 0xA5


def run_guarded(backend, case, transpose_scale, scale_dtype, lead, seed, sc_strides=None):
    """The backend into x_fp8 and x_scale views at offset ``lead`` inside guard bytes (x_scale's strides
    ``sc_strides``, default the layout's): nothing written outside them, scale bits equal, fp8 to the contract."""
    G, q = case.num_groups, case.quant_group_size
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=seed)
    skip_unless_served(backend, validate(o, pos, cos, sin, G, q, transpose_scale, None, None,
                                         QuantModes(FP8_HERE, scale_dtype))[0])
    fp_shape, sc_shape = fusedrope.quant_output_shapes(*o.shape, G, q, scale_dtype)
    sc_strides = tuple(sc_strides or scale_strides(sc_shape, "col" if transpose_scale else "row", scale_dtype))
    x_fp8, fp_buf = guarded_poison(fp_shape, FP8_HERE, DEVICE, None, lead, byte=GUARD)
    x_scale, sc_buf = guarded_poison(sc_shape, scale_dtype, DEVICE, sc_strides, lead, byte=GUARD)
    out = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, G, q, transpose_scale, x_fp8, x_scale, backend=backend)
    assert out[0] is x_fp8 and out[1] is x_scale and x_scale.stride() == sc_strides
    for name, buf, view in (("x_fp8", fp_buf, x_fp8), ("x_scale", sc_buf, x_scale)):
        stray = bytes_written_outside(buf, view, GUARD)
        assert stray == 0, f"{backend} wrote {stray} {name} bytes outside the view"
    ref = reference(o, pos, cos, sin, case, transpose_scale, scale_dtype=scale_dtype)
    assert torch.equal(x_scale.contiguous().view(torch.uint8), ref[1].contiguous().view(torch.uint8))
    assert_quant_close(x_fp8, x_scale, *ref, rope_blocks(case), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case,lead", [(QuantCase(1, 8, 1), 16), (QuantCase(5, 16, 2, quant_group_size=32), 5),
                                       (QuantCase(5, 8, 1, quant_group_size=32), 64),
                                       (QuantCase(1, 16, 2, quant_group_size=128), 3)],
                         ids=lambda v: v.id if isinstance(v, QuantCase) else f"lead{v}")
@pytest.mark.parametrize("transpose_scale", [False, True])
@pytest.mark.parametrize("scale_dtype", [torch.float8_e8m0fnu, torch.int32])
def test_outputs_inside_poisoned_buffers_write_nothing_outside(backend, case, lead, transpose_scale, scale_dtype):
    """x_fp8 and x_scale are views at an offset inside bigger buffers: every byte before, after and between
    the view's elements (the packed column-major layout's padding tokens) keeps its guard value."""
    run_guarded(backend, case, transpose_scale, scale_dtype, lead, seed=33)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale_dtype", [torch.float8_e8m0fnu, torch.float32, torch.int32])
@pytest.mark.parametrize("case", [QuantCase(5, 8, 2, quant_group_size=32),
                                  QuantCase(5, 2, 2, head_dim=128, quant_group_size=128)],  # Ks = 1
                         ids=lambda c: c.id)
def test_column_major_scales_with_padded_tokens(backend, scale_dtype, case):
    """A column-major x_scale whose token dim is padded to L > S, strides (1, Ks*L, L): what an engine gets by
    slicing this step's tokens out of one max-size buffer (or TMA-aligned fp32 scales). The op writes the S
    tokens of every column and none of the padding. With one block per group (Ks = 1) the group stride L says
    the padding (the last dim's stride addresses nothing)."""
    G, q = case.num_groups, case.quant_group_size
    if scale_dtype == torch.int32 and case.head_dim * case.num_heads // G // q % 4:
        pytest.skip("packed UE8M0 needs a multiple of 4 blocks per group")
    Ks, L = fusedrope.quant_output_shapes(case.num_tokens, case.num_heads, case.head_dim, G, q, scale_dtype)[1][2], 11
    run_guarded(backend, case, True, scale_dtype, lead=3, seed=35, sc_strides=(1, Ks * L, L))


def _no_launch(*args, **kwargs):
    raise AssertionError("the backend was called for empty inputs")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("S,H", [(0, 16), (3, 0), (0, 0)])
@pytest.mark.parametrize("transpose_scale", [False, True])
def test_empty_inputs_launch_nothing(backend, S, H, transpose_scale, monkeypatch):
    o, pos, cos, sin = make_quant_inputs(QuantCase(S, H, 2), device=DEVICE)
    impl = REGISTRY.backend(backend)
    facts = validate(o, pos, cos, sin, 2, 128, transpose_scale, None, None, QuantModes(FP8_HERE, None))[0]
    skip_unless_served(backend, facts)
    monkeypatch.setattr(impl, "run", _no_launch)
    monkeypatch.setattr(impl, "run_alloc", _no_launch)
    one = make_quant_inputs(QuantCase(1, 16, 2), device=DEVICE)
    with pytest.raises(AssertionError, match="called for empty"):  # the patch does intercept a real launch
        fusedrope.inverse_rope_group_quant(*one, 2, backend=backend, fp8_dtype=FP8_HERE)
    dg = H * 512 // 2
    for bufs in (None, fusedrope.empty_quant_outputs(o, 2, 128, transpose_scale, fp8_dtype=FP8_HERE)):
        x, s = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, transpose_scale,
                                                  *(bufs or (None, None)), backend=backend, fp8_dtype=FP8_HERE)
        assert x.shape == (S, 2, dg) and x.dtype == FP8_HERE
        assert s.shape == (S, 2, dg // 128) and s.dtype == torch.float8_e8m0fnu
        if bufs is not None:
            assert x is bufs[0] and s is bufs[1]
    other = validate(o, pos, cos, sin, 2, 32, transpose_scale, None, None,
                     QuantModes(torch.float8_e4m3fnuz, torch.int32))[0]
    if REGISTRY.decide(impl, other):  # e.g. the compiled kernels write no packed int32 scales
        return
    x, s = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 32, transpose_scale, backend=backend,
                                              fp8_dtype=torch.float8_e4m3fnuz, scale_dtype=torch.int32)
    assert x.shape == (S, 2, dg) and x.dtype == torch.float8_e4m3fnuz
    assert s.shape == (S, 2, dg // 128) and s.dtype == torch.int32


def test_out_op_declares_both_buffers_mutated():
    """Both buffers are in the _out op's schema as written, so traced code reads the op's scales, not the
    buffer's old bytes."""
    schema = torch.ops.fusedrope.inverse_rope_group_quant_out.default._schema
    assert [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write] == \
        ["x_fp8", "x_scale"]
    o, pos, cos, sin = make_quant_inputs(QuantCase(2, 4, 2), device=DEVICE, seed=21)

    def f(o, pos, cos, sin):
        x, s = fusedrope.empty_quant_outputs(o, 2, 32, scale_dtype=torch.uint8)
        s.fill_(7)  # no e8m0 byte of these inputs
        torch.ops.fusedrope.inverse_rope_group_quant_out(o, pos, cos, sin, 2, 32, False, x, s, "reference")
        return x.view(torch.uint8) + 0, s + 0

    want = f(o, pos, cos, sin)
    assert not (want[1] == 7).any()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(o, pos, cos, sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("which", [("x_fp8",), ("x_scale",), ("x_fp8", "x_scale")], ids="+".join)
@pytest.mark.parametrize("backend", BACKENDS)
def test_caller_buffers_get_a_new_version(backend, which):
    o, pos, cos, sin = make_quant_inputs(QuantCase(2, 16, 2), device=DEVICE, seed=22)
    bufs = {k: v for k, v in zip(("x_fp8", "x_scale"), fusedrope.empty_quant_outputs(o, 2, fp8_dtype=FP8_HERE))
            if k in which}
    before = {k: b._version for k, b in bufs.items()}
    out = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, False, backend=backend, fp8_dtype=FP8_HERE,
                                             **bufs)
    for k, b in bufs.items():
        assert out[0 if k == "x_fp8" else 1] is b and b._version > before[k], k
