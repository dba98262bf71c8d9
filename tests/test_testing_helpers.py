"""fusedrope.testing's helpers, which others use to check their own kernels: a wrong output must not pass."""

import pytest
import torch

import fusedrope
from fusedrope.testing import (QuantCase, TtsCase, assert_quant_close, assert_ulp_close, make_quant_inputs,
                               make_tts_inputs, rope_blocks, round_once, scale_bytes, to_device_keeping_layout,
                               ulp_diff)


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
