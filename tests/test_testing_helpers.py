"""fusedrope.testing's helpers, which others use to check their own kernels: a wrong output must not pass."""

import re
import zlib

import pytest
import torch

import fusedrope
from fusedrope.reference import qwen3_tts_rope_oracle, rotate_half
from fusedrope.testing import (QuantCase, TtsCase, assert_quant_close, assert_tts_rope_close, assert_ulp_close,
                               bytes_written_outside, deepseek_rope_cache, guarded_poison, make_quant_inputs,
                               make_tts_inputs, qwen3_tts_cos_sin, rope_blocks, round_once, scale_bytes,
                               tie_allowance, to_device_keeping_layout, ulp_diff)


@pytest.fixture(autouse=True)
def _reproducible_random_data(request):
    """Random data and picks from the global generator, seeded per test: a failure reproduces."""
    torch.manual_seed(zlib.crc32(request.node.name.encode()))


def test_inputs_keep_their_layout_on_another_device():
    """.to(device) would make the projection views and the strided cache dense: the layouts under test."""
    q, k, cos, sin = make_tts_inputs(TtsCase("t", 2, 3, 4, 2), device="meta")
    q0, k0 = make_tts_inputs(TtsCase("t", 2, 3, 4, 2))[:2]
    assert q.device.type == "meta" and q.stride() == q0.stride() and k.stride() == k0.stride()
    assert k.storage_offset() == k0.storage_offset() == 4 * 128 and not q.is_contiguous()
    o, pos, cos_cache, sin_cache = make_quant_inputs(QuantCase(2, 4, 2), device="meta")
    assert cos_cache.stride() == sin_cache.stride() == (64, 1) and sin_cache.storage_offset() == 32
    odd = torch.zeros(1 + 5 * 8, dtype=torch.bfloat16)[1:].view(5, 8)[:, 2:6]
    moved = to_device_keeping_layout(odd, "meta")
    assert (moved.shape, moved.stride(), moved.storage_offset()) == (odd.shape, odd.stride(), 3)


def test_ulp_check_refuses_the_wrong_dtype_or_device():
    want = torch.randn(4, 8, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="dtype torch.float32, expected torch.bfloat16"):
        assert_ulp_close(want.float(), want)
    with pytest.raises(AssertionError, match="dtype torch.int16"):
        assert_ulp_close(torch.zeros(4, 8, dtype=torch.int16), want.double())
    with pytest.raises(AssertionError, match="on meta, expected on cpu"):
        assert_ulp_close(want.to("meta"), want)
    with pytest.raises(AssertionError, match="shape"):
        assert_ulp_close(want[:2], want)
    assert_ulp_close(want, want.double())  # an fp64 oracle against any floating dtype


@pytest.mark.parametrize("bad", [1.5, -1.0, 0.0, float("inf"), 3.0])
def test_float32_scales_must_be_powers_of_two(bad):
    good = torch.tensor([[[2.0 ** -127, 1.0, 2.0 ** 127, float("nan")]]])
    assert scale_bytes(good).tolist() == [[[0, 127, 254, 255]]]
    with pytest.raises(ValueError, match="a float32 scale must be 2\\^k"):
        scale_bytes(torch.tensor([[[1.0, bad]]]))


def test_quant_check_refuses_the_other_scale_layout():
    case = QuantCase(3, 4, 2)
    o, pos, cos, sin = make_quant_inputs(case)
    row = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, backend="reference")
    col = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, transpose_scale=True, backend="reference")
    assert_quant_close(*col, *col, rope_blocks(case))
    with pytest.raises(AssertionError, match="scale layout"):
        assert_quant_close(*row, *col, rope_blocks(case))
    with pytest.raises(AssertionError, match="scale layout"):
        assert_quant_close(*col, *row, rope_blocks(case))


def test_ulp_distance_rounds_the_oracle_once():
    """torch's float64 -> bfloat16 cast goes through float32 and can round twice; the distance must not."""
    x = torch.tensor([1 + 2.0 ** -8 + 2.0 ** -40], dtype=torch.float64)  # just above the tie of 1 and 1+2^-7
    bf = lambda v: torch.tensor([v], dtype=torch.bfloat16)  # noqa: E731
    assert x.to(torch.bfloat16).item() == 1.0  # the double rounding this guards against
    assert ulp_diff(bf(1.0078125), x).item() == 0
    assert ulp_diff(bf(1.0), x).item() == 1
    assert ulp_diff(bf(1 - 2.0 ** -8), x).item() == 2  # 1.5 ulp from x: more than 1 ulp off
    with pytest.raises(AssertionError, match="more than 1 ulp away"):
        assert_ulp_close(bf(1 - 2.0 ** -8), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_round_once_is_the_nearest_value(dtype):
    ints = {1: torch.int8, 2: torch.int16}[torch.empty(0, dtype=dtype).element_size()]
    vals = torch.arange(-(2 ** 15), 2 ** 15).to(ints).view(dtype).double()
    vals = vals[torch.isfinite(vals)].unique()
    g = torch.Generator().manual_seed(1)
    i = torch.randint(0, len(vals) - 1, (4000,), generator=g)
    mid = (vals[i] + vals[i + 1]) / 2
    x = torch.cat([mid, mid * (1 + 1e-12), mid * (1 - 1e-12), torch.randn(4000, generator=g, dtype=torch.float64)])
    x = x[x.abs() < vals.max()]
    j = torch.searchsorted(vals, x).clamp(1, len(vals) - 1)
    lo, hi = vals[j - 1], vals[j]
    lo_even = (lo.to(dtype).view(ints) & 1) == 0
    nearest = torch.where((x - lo).abs() < (hi - x).abs(), lo,
                          torch.where((hi - x).abs() < (x - lo).abs(), hi, torch.where(lo_even, lo, hi)))
    assert torch.equal(round_once(x, dtype).double(), nearest)


def _quant_reference(transpose_scale=False):
    """Reference outputs of a small case on fresh random data, and which of its blocks hold rope dims."""
    case = QuantCase(3, 4, 2)
    o, pos, cos, sin = make_quant_inputs(case, seed=int(torch.randint(0, 2 ** 31, ())))
    ref = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, case.num_groups, case.quant_group_size,
                                             transpose_scale, backend="reference")
    return case, ref


def _fp8_nudged(ref_fp8, case, in_rope_block: bool, ulps: int):
    """A copy of ``ref_fp8`` with one random element of a (non-)rope block moved ``ulps`` steps toward zero
    (away from it if too small), which never crosses into NaN."""
    mask = rope_blocks(case)
    S, G, Dg = ref_fp8.shape
    blocks = (mask if in_rope_block else ~mask).nonzero()
    g, kb = blocks[torch.randint(0, len(blocks), ())].tolist()
    s = int(torch.randint(0, S, ()))
    d = kb * case.quant_group_size + int(torch.randint(0, case.quant_group_size, ()))
    out = ref_fp8.clone()
    raw = out.view(torch.uint8)
    byte = int(raw[s, g, d])
    mag = byte & 0x7F
    raw[s, g, d] = (byte & 0x80) | (mag - ulps if mag >= ulps else mag + ulps)
    assert ulp_diff(out, ref_fp8).sum().item() == ulps  # the copy is exactly `ulps` off, in one element
    return out


@pytest.mark.parametrize("transpose_scale", [False, True])
def test_quant_check_fails_on_one_scale_byte(transpose_scale):
    case, (ref_fp8, ref_scale) = _quant_reference(transpose_scale)
    bad = ref_scale.clone()
    assert bad.stride() == ref_scale.stride()
    raw = bad.view(torch.uint8)
    idx = tuple(int(torch.randint(0, n, ())) for n in raw.shape)
    raw[idx] += 1
    assert_quant_close(ref_fp8, ref_scale, ref_fp8, ref_scale, rope_blocks(case))
    with pytest.raises(AssertionError, match=re.escape(f"scale bytes differ in 1 blocks; first at {idx}: got "
                                                       f"{int(raw[idx])}, expected {int(raw[idx]) - 1}")):
        assert_quant_close(ref_fp8, bad, ref_fp8, ref_scale, rope_blocks(case))


@pytest.mark.parametrize("in_rope_block,ulps,msg", [
    (False, 1, "fp8 bytes differ in 1 elements of non-rope blocks"),
    (True, 2, "1 of .* elements are more than 1 ulp away; worst 2 ulp")], ids=["non-rope-bit-exact", "rope-1-ulp"])
def test_quant_check_allows_one_ulp_in_rope_blocks_only(in_rope_block, ulps, msg):
    case, (ref_fp8, ref_scale) = _quant_reference()
    if in_rope_block:
        assert_quant_close(_fp8_nudged(ref_fp8, case, True, ulps=1), ref_scale, ref_fp8, ref_scale, rope_blocks(case))
    with pytest.raises(AssertionError, match=msg):
        assert_quant_close(_fp8_nudged(ref_fp8, case, in_rope_block, ulps), ref_scale, ref_fp8, ref_scale,
                           rope_blocks(case))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_ulp_check_sees_the_sign(dtype):
    x = torch.randn(4, 8).to(dtype)
    x = torch.where(x == 0, torch.ones_like(x), x)
    assert_ulp_close(x, x.double(), 1)
    with pytest.raises(AssertionError, match="32 of 32 elements are more than 1 ulp away"):
        assert_ulp_close(-x, x.double(), 1)
    i = int(torch.randint(0, 8, ()))
    one = x.clone()
    one[1, i] = -one[1, i]
    steps = x[1, i].abs().view({4: torch.int32, 2: torch.int16}[x.element_size()]).item()  # from +0 to |x|
    with pytest.raises(AssertionError, match=re.escape(f"1 of 32 elements are more than 1 ulp away; worst "
                                                       f"{2 * steps} ulp at (1, {i})")):
        assert_ulp_close(one, x.double(), 1)


def _bf16_bits(*bits):
    return torch.tensor([b - (1 << 16) if b >= 1 << 15 else b for b in bits], dtype=torch.int16).view(torch.bfloat16)


def test_ulp_check_and_nan():
    """As documented in ulp_diff: two NaNs (any sign or payload) are 0 apart, NaN and a number are not close."""
    x = torch.randn(32).to(torch.bfloat16)
    i = int(torch.randint(0, 32, ()))
    got = x.clone()
    got[i] = float("nan")
    with pytest.raises(AssertionError, match=f"1 of 32 elements are more than 1 ulp away; worst {2 ** 40} ulp "
                                             f"at \\({i},\\): got nan"):
        assert_ulp_close(got, x.double())  # NaN for a number
    with pytest.raises(AssertionError, match="1 of 1 elements are more than 1 ulp away"):
        assert_ulp_close(_bf16_bits(0x7FC0), torch.ones(1, dtype=torch.float64))  # NaN for 1.0
    with pytest.raises(AssertionError, match="1 of 1 elements are more than 1 ulp away"):
        assert_ulp_close(torch.ones(1, dtype=torch.bfloat16), _bf16_bits(0x7FC0))  # 1.0 for NaN
    nans = _bf16_bits(0x7FC0, 0xFFC0, 0x7F81, 0xFFFF)  # quiet, negative, signalling, negative with payload
    assert torch.isnan(nans.float()).all()
    assert_ulp_close(nans, nans.flip(0), 0)
    assert_ulp_close(nans, torch.full((4,), float("nan"), dtype=torch.float64), 0)
    want = x.double()
    want[i] = float("nan")
    got[i] = nans[int(torch.randint(0, 4, ()))]
    assert_ulp_close(got, want)


def _toward_zero(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (float64) truncated to ``dtype``: what a kernel that drops the rounding gets."""
    r = round_once(x, dtype)
    over = r.double().abs() > x.abs()
    bits = r.view({2: torch.int16, 1: torch.uint8}[r.element_size()])
    return torch.where(over, (bits - 1).view(dtype), r)  # one step back toward zero where it rounded up


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ulp_check_fails_a_kernel_that_truncates(dtype):
    """Truncation stays within 1 ulp, so only the count of inexact elements tells it from rounding."""
    want = torch.randn(64, 64, dtype=torch.float64)
    assert_ulp_close(round_once(want, dtype), want)
    cut = _toward_zero(want, dtype)
    assert int(ulp_diff(cut, want).max()) == 1 and int((ulp_diff(cut, want) != 0).sum()) > 1000
    with pytest.raises(AssertionError, match=r"elements are not correctly rounded \(at most 6 may be"):
        assert_ulp_close(cut, want)
    assert_ulp_close(cut, want, max_inexact=None)  # the plain 1-ulp bound lets it through
    few = round_once(want, dtype)
    few.view(-1)[:tie_allowance(want.numel())] = cut.view(-1)[:tie_allowance(want.numel())]
    assert_ulp_close(few, want)  # a few inexact elements are rounding ties, not a bug


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tts_contract_check_passes_the_oracle_and_fails_shared_halves(dtype):
    q, k, cos, sin = make_tts_inputs(TtsCase("t", 2, 5, 4, 2), dtype=dtype, random_cos_sin=True,
                                     seed=int(torch.randint(0, 2**31, ())))
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    assert_tts_rope_close(q_ref.to(dtype), k_ref.to(dtype), q, k, cos, sin)
    h = q.shape[-1] // 2
    shared = torch.cat((cos[..., :h], cos[..., :h]), -1)  # a kernel that reads cos[i] for both halves
    q_bad, k_bad = qwen3_tts_rope_oracle(q, k, shared, sin)
    with pytest.raises(AssertionError, match="^q .* elements are (more than 1 ulp away|off by more than two)"):
        assert_tts_rope_close(q_bad.to(dtype), k_bad.to(dtype), q, k, cos, sin)
    # a precomputed oracle is the one compared against
    assert_tts_rope_close(q_ref.to(dtype), k_ref.to(dtype), q, k, cos, sin, oracle=(q_ref, k_ref))
    with pytest.raises(AssertionError, match="^q "):
        assert_tts_rope_close(q_ref.to(dtype), k_ref.to(dtype), q, k, cos, sin, oracle=(q_bad, k_bad))
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(AssertionError, match=f"^q dtype {other}, expected {dtype}"):  # measured in the wrong ulps
        assert_tts_rope_close(q_ref.to(other), k_ref.to(other), q, k, cos, sin)
    if dtype == torch.bfloat16:  # products rounded to bf16 before the sum: within a few ulps, not once rounded
        x, c, s_ = q.float(), cos.float()[:, None], sin.float()[:, None]
        twice = (x * c).to(dtype).float() + (rotate_half(x) * s_).to(dtype).float()
        with pytest.raises(AssertionError, match="^q "):
            assert_tts_rope_close(twice.to(dtype), k_ref.to(dtype), q, k, cos, sin)


def test_quant_check_names_dtype_shape_and_where_plain_blocks_differ():
    case, (ref_fp8, ref_scale) = _quant_reference()
    with pytest.raises(AssertionError, match="fp8 dtype torch.float8_e4m3fnuz, expected torch.float8_e4m3fn"):
        assert_quant_close(ref_fp8.view(torch.float8_e4m3fnuz), ref_scale, ref_fp8, ref_scale, rope_blocks(case))
    with pytest.raises(AssertionError, match=r"scale shape \(3, 16\), expected \[S, G, Ks\] like \(3, 2, 8\)"):
        assert_quant_close(ref_fp8, ref_scale.reshape(3, -1), ref_fp8, ref_scale, rope_blocks(case))
    bad = ref_fp8.clone()
    raw = bad.view(torch.uint8)
    raw[2, 1, 5] ^= 0x01  # block 0 of group 1 holds no rope dims
    assert not bool(rope_blocks(case)[1, 0])
    with pytest.raises(AssertionError, match=re.escape(
            f"first at [s, g, block, i] = (2, 1, 0, 5): got {int(raw[2, 1, 5]):#04x}, expected "
            f"{int(ref_fp8.view(torch.uint8)[2, 1, 5]):#04x}")):
        assert_quant_close(bad, ref_scale, ref_fp8, ref_scale, rope_blocks(case))


def test_edge_case_quant_inputs_hold_what_random_data_does_not():
    case = QuantCase(6, 4, 2, quant_group_size=64)
    o, pos, cos, sin = make_quant_inputs(case, edge_cases=True, max_pos=100, seed=3)
    assert pos[:3].tolist() == [-7, 100, 100 + 10**6]
    blocks = o.float().reshape(-1, 64)
    amax = blocks.abs().amax(-1)
    assert bool((blocks == 0).all(-1).any())  # the amax floor
    assert bool(torch.isnan(blocks).any()) and bool(torch.isinf(blocks).any())
    finite = amax[torch.isfinite(amax) & (amax > 0)]
    for fp8_max in (448.0, 240.0):  # an amax exactly on a scale boundary of each fp8 format
        k = torch.log2(finite / fp8_max)
        assert bool((k == k.round()).any())
    for empty in (QuantCase(0, 4, 2), QuantCase(2, 0, 2)):  # no room: nothing planted, no error
        assert make_quant_inputs(empty, edge_cases=True)[0].numel() == 0
    same = make_quant_inputs(case, edge_cases=False, max_pos=100, seed=3)
    assert bool((same[1] >= 0).all()) and not bool(torch.isnan(same[0].float()).any())
    x, s = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 64, backend="reference")
    assert {92, 0xFF} <= set(scale_bytes(s).flatten().tolist())  # the floor's byte; a NaN/Inf block's


@pytest.mark.parametrize("bad", ["2-D cos", "unsqueezed cos", "k of another batch"])
def test_tts_oracle_and_check_refuse_shapes_that_would_broadcast(bad):
    """A 2-D [S, D] cos (an engine's layout) would broadcast by head when S == H: the oracle and the check
    must refuse it rather than pass a kernel with exactly that bug."""
    q, k, cos, sin = make_tts_inputs(TtsCase("t", 1, 8, 8, 8, 64), random_cos_sin=True)
    args = {"2-D cos": (q, k, cos[0], sin[0]), "unsqueezed cos": (q, k, cos[:, None], sin[:, None]),
            "k of another batch": (q, k.expand(2, -1, -1, -1), cos, sin)}[bad]
    arg = "k" if bad.startswith("k") else "cos"
    with pytest.raises(ValueError, match=f"^qwen3_tts_rope_oracle: argument '{arg}' expected"):
        qwen3_tts_rope_oracle(*args)
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    with pytest.raises(ValueError, match=f"^assert_tts_rope_close: argument '{arg}' expected"):
        assert_tts_rope_close(q_ref.to(q.dtype), k_ref.to(q.dtype), *args)


@pytest.mark.parametrize("call, msg", [
    (lambda: qwen3_tts_cos_sin(torch.arange(4)[None], head_dim=63),
     "qwen3_tts_cos_sin: argument 'head_dim' expected an even int >= 2, got 63"),
    (lambda: deepseek_rope_cache(8, rope_dim=63),
     "deepseek_rope_cache: argument 'rope_dim' expected an even int >= 2, got 63"),
    (lambda: deepseek_rope_cache(8, rope_dim=0),
     "deepseek_rope_cache: argument 'rope_dim' expected an even int >= 2, got 0"),
])
def test_cos_sin_builders_refuse_odd_widths(call, msg):
    with pytest.raises(ValueError, match="^" + re.escape(msg)):
        call()


def test_tts_contract_check_fails_fp32_results_rounded_through_half():
    """fp32 inputs: "within fp32 rounding of the operands". A kernel that computes or stores through fp16
    (11-bit significand, error up to 2^-12 of the result) is off by far more than two fp32 roundings."""
    q, k, cos, sin = make_tts_inputs(TtsCase("t", 2, 5, 4, 2), dtype=torch.float32, random_cos_sin=True, seed=9)
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    assert_tts_rope_close(q_ref.float(), k_ref.float(), q, k, cos, sin)
    with pytest.raises(AssertionError, match="^q .* fp32 elements are off by more than two roundings"):
        assert_tts_rope_close(q_ref.half().float(), k_ref.float(), q, k, cos, sin)
    with pytest.raises(AssertionError, match="^k .* fp32 elements are off by more than two roundings"):
        assert_tts_rope_close(q_ref.float(), k_ref.float().half().float(), q, k, cos, sin)


def test_tts_inputs_put_each_sequence_at_its_own_position():
    """make_tts_inputs' model cos/sin (the default) differ by batch, so a kernel that reads batch 0's cos/sin
    for every sequence (a dropped or zero batch stride) fails the contract check on them."""
    q, k, cos, sin = make_tts_inputs(TtsCase("t", 4, 3, 2, 1, 64))
    assert all(not torch.equal(cos[0], cos[b]) for b in range(1, 4))
    assert all(not torch.equal(sin[0], sin[b]) for b in range(1, 4))
    q_bad, k_bad = qwen3_tts_rope_oracle(q, k, cos[:1].expand_as(cos), sin[:1].expand_as(sin))
    with pytest.raises(AssertionError, match="^q "):
        assert_tts_rope_close(q_bad.to(q.dtype), k_bad.to(k.dtype), q, k, cos, sin)


def test_bytes_written_outside_sees_the_gaps_of_a_strided_view():
    """An output with padded rows (e.g. a slice of a bigger cache) has elements between its rows that are not
    its own: a kernel writing there (a row stride mistaken for the row length) writes outside it."""
    out, buf = guarded_poison((2, 3), torch.bfloat16, strides=(5, 1))
    assert out.storage_offset() == 64
    out.fill_(1.0)
    assert bytes_written_outside(buf, out) == 0
    buf[64 + 3] = 0  # the gap after row 0
    assert bytes_written_outside(buf, out) == 2
    buf[64 + 9] = 0  # the gap after row 1 (past the view's last element)
    assert bytes_written_outside(buf, out) == 4


def test_quant_check_allows_ties_by_the_rope_elements_only():
    """The allowance for rounding ties is tie_allowance of the elements in rope blocks (where the rotation may
    land next to a rounding boundary), not of the whole output: one more rope element off fails, and so does a
    kernel that truncates (or rounds the rotation through bf16): 1 ulp off in every rope element."""
    case, (ref_fp8, ref_scale) = _quant_reference()
    mask = rope_blocks(case)
    S, G, Dg = ref_fp8.shape
    n_rope = int(mask.sum()) * S * case.quant_group_size
    allowed = tie_allowance(n_rope)
    assert tie_allowance(ref_fp8.numel()) > allowed  # the two readings differ for this case
    raw_ref = ref_fp8.view(torch.uint8).reshape(S, G, mask.shape[1], -1)  # [s, g, block, i]
    # rope-block elements whose magnitude can step toward zero without a zero or NaN crossing
    picks = (((raw_ref & 0x7F) > 1) & ((raw_ref & 0x7F) < 0x7E) & mask[None, :, :, None]).nonzero()

    def nudged(n):
        out = ref_fp8.clone()
        out.view(torch.uint8).reshape(S, G, mask.shape[1], -1)[tuple(picks[:n].T)] -= 1  # toward zero: 1 ulp
        return out

    assert_quant_close(nudged(allowed), ref_scale, ref_fp8, ref_scale, mask)
    assert len(picks) > allowed + 1
    for n in (allowed + 1, len(picks)):
        with pytest.raises(AssertionError, match=f"fp8 bytes differ in {n} elements of rope blocks "
                                                 f"\\(at most {allowed} may"):
            assert_quant_close(nudged(n), ref_scale, ref_fp8, ref_scale, mask)
