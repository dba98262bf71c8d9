"""The output layouts every inverse_rope_group_quant backend test shares: ``x`` with any token and group strides
(vLLM's group-major ``[G, S, Dg]`` storage, row-padded buffers), scales row- or column-major or in the
"mfma_tile" layout, quantize=False; each output inside a poisoned guard buffer, compared with the reference called
with the same layout (:func:`check_layout`). The mfma_tile offsets come from the reference
(:func:`fusedrope.inverse_rope_group_quant.reference.mfma_tile_offsets`, written from the index map), not from
any kernel's code."""

import torch

from fusedrope.inverse_rope_group_quant import reference as R
from fusedrope.testing import (QuantCase, assert_quant_close, bytes_written_outside, guarded_poison,
                               make_quant_inputs, rope_blocks)

from conftest import DEVICE

POISON = 0x55  # a finite value in every output format (fp8, bf16, fp16, e8m0): a NaN written shows
E8M0 = torch.float8_e8m0fnu
DEEPSEEK = {"V4-Pro-TP8": (16, 2), "V4-Flash-TP8": (8, 1)}


def x_strides(layout: str, S: int, G: int, Dg: int) -> tuple:
    """Strides of ``x [S, G, Dg]`` in each output layout the kernel serves."""
    return {"row": (G * Dg, Dg, 1), "group_major": (Dg, S * Dg, 1), "padded": (G * Dg + 64, Dg, 1)}[layout]


def scale_buffer(case: QuantCase, scale_dtype, scale_layout: str):
    """``(x_scale, its guard buffer)``: ``[S, G, Ks]`` (``Ks/4`` packed int32) row- or column-major, or the
    contiguous ``[G, S_pad, Ks_pad]`` of "mfma_tile"."""
    S, G = case.num_tokens, case.num_groups
    ks = case.num_heads * case.head_dim // G // case.quant_group_size
    if scale_layout == "mfma_tile":
        return guarded_poison(R.mfma_tile_shape(S, G, ks, case.quant_group_size), scale_dtype, DEVICE, byte=POISON)
    k = ks // 4 if scale_dtype == torch.int32 else ks
    strides = (G * k, k, 1) if scale_layout == "row" else (1, S * k, S)
    return guarded_poison((S, G, k), scale_dtype, DEVICE, strides, byte=POISON)


def mfma_bytes(x_scale: torch.Tensor, case: QuantCase) -> torch.Tensor:
    """The ``[S, G, Ks]`` bytes of a "mfma_tile" buffer, read at the reference's offsets."""
    S, G = case.num_tokens, case.num_groups
    ks = case.num_heads * case.head_dim // G // case.quant_group_size
    flat = x_scale.reshape(-1).view(torch.uint8)
    return flat[R.mfma_tile_offsets(S, G, ks, case.quant_group_size, x_scale.device)]


def check_layout(case: QuantCase, x_layout="row", scale_dtype=E8M0, scale_layout="row", fp8=torch.float8_e4m3fn,
                 o_dtype=torch.bfloat16, seed=0, *, backend, exact: bool):
    """Run ``backend(o, pos, cos, sin, x, x_scale, group_size, scale_layout=...)`` and the reference on the same
    layouts; ``scale_dtype`` None is quantize=False. ``exact``: every byte of both guard buffers equal (a kernel
    whose fp32 math is the reference's), else fp8 within the contract."""
    o, pos, cos, sin = make_quant_inputs(case, dtype=o_dtype, device=DEVICE, seed=seed, edge_cases=True)
    S, G, gs = case.num_tokens, case.num_groups, case.quant_group_size
    Dg = case.num_heads * case.head_dim // G
    quant = scale_dtype is not None
    x_dtype = fp8 if quant else o_dtype
    strides = x_strides(x_layout, S, G, Dg)
    (x, xbuf), (xr, xrbuf) = (guarded_poison((S, G, Dg), x_dtype, DEVICE, strides, byte=POISON) for _ in range(2))
    (s, sbuf), (sr, srbuf) = (scale_buffer(case, scale_dtype, scale_layout) if quant else (None, None)
                              for _ in range(2))
    backend(o, pos, cos, sin, x, s, gs, scale_layout=scale_layout)
    R.inverse_rope_group_quant(o, pos, cos, sin, xr, sr, gs, scale_layout=scale_layout)
    assert x.stride() == strides and (x.storage_offset(), x.data_ptr() - xbuf.data_ptr()) == (64, 64 * x.element_size())
    assert bytes_written_outside(xbuf, x, POISON) == 0, "wrote outside x (a row's padding, the guard)"
    if not quant:  # fp32 math rounded once (RNE) to o's dtype: the reference's bytes, NaN where it has NaN
        got, want = x.view(torch.int16), xr.view(torch.int16)
        # (a NaN's payload is the conversion's: torch's CPU copy gives 0xFFFF, a GPU's cvt 0x7FFF)
        differ = (got != want) & ~(x.isnan() & xr.isnan())
        assert bool(xr.isnan().any()), "the edge cases put a NaN in the data"
        assert not differ.any(), (f"{int(differ.sum())} {o_dtype} elements differ; first at "
                                  f"{tuple(int(i) for i in differ.nonzero()[0])}")
        if o_dtype == torch.bfloat16:  # the data tells round-to-nearest-even from truncation (the interpreter's)
            fp32 = R.inverse_rope_tail(o, pos, cos, sin).reshape(S, G, Dg)
            assert not torch.equal(want, (fp32.view(torch.int32) >> 16).to(torch.int16))
        return
    if scale_layout == "mfma_tile":
        # the whole buffer: real bytes as the reference's, padding and guard still the poison
        real = torch.zeros(sbuf.numel(), dtype=torch.bool, device=DEVICE)
        ks = Dg // gs
        real[s.storage_offset() + R.mfma_tile_offsets(S, G, ks, gs, DEVICE).reshape(-1)] = True
        raw = sbuf.view(torch.uint8)
        assert int((raw[~real] != POISON).sum()) == 0, "wrote a padding byte of the mfma tiles (or a guard byte)"
        assert torch.equal(raw, srbuf.view(torch.uint8)), "mfma_tile scale bytes differ from the reference's"
        got_s, ref_s = mfma_bytes(s, case), mfma_bytes(sr, case)
    else:
        assert bytes_written_outside(sbuf, s, POISON) == 0, "wrote outside x_scale"
        got_s, ref_s = s, sr
    assert_quant_close(x, got_s, xr, ref_s, rope_blocks(case), f"x {x_layout}, scales {scale_layout}")
    if exact:  # every byte equal, guards included
        assert torch.equal(xbuf.view(torch.uint8), xrbuf.view(torch.uint8)), "fp8 bytes differ from the reference's"
        assert torch.equal(sbuf.view(torch.uint8), srbuf.view(torch.uint8)), "scale bytes differ from the reference's"


