"""fusedrope.testing's helpers, which others use to check their own kernels: a wrong output must not pass."""

import pytest
import torch

import fusedrope
from fusedrope.testing import (QuantCase, TtsCase, assert_quant_close, assert_ulp_close, make_quant_inputs,
                               make_tts_inputs, rope_blocks, scale_bytes, to_device_keeping_layout)


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
