"""The Triton kernel's output layouts, called through the backend entry point directly: ``x`` with any token and
group strides (vLLM's group-major ``[G, S, Dg]`` storage, row-padded buffers), the "mfma_tile" scale layout, and
quantize=False (``x_scale`` None: ``x`` in o's dtype). Every output lies inside a poisoned guard buffer and is
compared with the reference called with the same layout: scale bytes bit-exact, fp8 within the contract (and
bit-exact where the kernel runs in the interpreter), bf16 / fp16 bytes equal; nothing outside the outputs, and no
mfma padding byte, changes."""

import pytest
import torch

import fusedrope
from fusedrope.inverse_rope_group_quant import reference as R
from fusedrope.testing import QuantCase, bytes_written_outside, guarded_poison, make_quant_inputs

import irgq_layouts
from conftest import DEVICE
from irgq_layouts import DEEPSEEK, E8M0, POISON, scale_buffer, x_strides

_REG = fusedrope.registry("inverse_rope_group_quant")
_REASON = _REG.availability(_REG.backend("triton"), DEVICE)
pytestmark = pytest.mark.skipif(bool(_REASON), reason=f"triton: {_REASON}")

def _tk():
    from fusedrope.inverse_rope_group_quant import triton as TK

    return TK


def check_layout(*args, **kw):
    """irgq_layouts.check_layout on the Triton entry point: bit-exact in the interpreter (its fp32 math is the
    reference's)."""
    from fusedrope._triton import INTERPRETED

    return irgq_layouts.check_layout(*args, backend=_tk().inverse_rope_group_quant, exact=INTERPRETED, **kw)


# -- x with any token and group strides ----------------------------------------------------------------------
@pytest.mark.parametrize("scale_dtype,scale_layout", [(E8M0, "row"), (torch.uint8, "col"), (torch.float32, "row"),
                                                      (torch.int32, "col")], ids=["e8m0-row", "u8-col", "f32-row",
                                                                                 "packed-col"])
@pytest.mark.parametrize("x_layout", ["group_major", pytest.param("padded", marks=pytest.mark.slow)])  # vLLM's first
@pytest.mark.parametrize("shape", list(DEEPSEEK), ids=list(DEEPSEEK))
def test_deepseek_shapes_write_strided_x(shape, x_layout, scale_dtype, scale_layout):
    H, G = DEEPSEEK[shape]
    check_layout(QuantCase(3, H, G), x_layout, scale_dtype, scale_layout, seed=H + G)


def spy_launches(monkeypatch) -> list:
    """Record the fused kernel's launches (grid and constexprs) while still running them."""
    TK, seen = _tk(), []
    real = TK._group_quant_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append(dict(kw, grid=grid))
                return real[grid](*args, **kw)
            return launch

    monkeypatch.setattr(TK, "_group_quant_kernel", Spy())
    return seen


@pytest.mark.parametrize("x_layout", ["row", "group_major", "padded"])
@pytest.mark.parametrize("case,crossings", [
    (QuantCase(5, 4, 2, head_dim=192, rope_dim=32, quant_group_size=64), 1),
    (QuantCase(4, 6, 6, head_dim=192, rope_dim=32, quant_group_size=64), 3)], ids=["Dg384", "Dg192"])
def test_other_head_dim_tiles_straddle_groups(case, crossings, x_layout, monkeypatch):
    """Dg = 384 and 192 with a 512-column tile: tiles straddle groups (the kernel's per-column group path); with
    Dg = 192 the tile at column 512 starts 128 columns into a group and crosses three boundaries (the most any
    tile can)."""
    seen = spy_launches(monkeypatch)
    check_layout(case, x_layout, seed=7)
    (kw,) = seen
    assert kw["BLOCK_N"] == 512 and not kw["ONE_GROUP"] and kw["CROSSINGS"] == crossings, kw
    assert kw["grid"][2] == 1


def test_fnuz_group_major():
    check_layout(QuantCase(2, 16, 2), "group_major", fp8=torch.float8_e4m3fnuz, seed=3)


# -- the mfma_tile scale layout ------------------------------------------------------------------------------
@pytest.mark.parametrize("group_size", [128, 32, 64, 256])
def test_mfma_tile_padded_tokens_and_blocks(group_size):
    """S = 53 (two 32-token tiles, the second part padding) and Ks = 3, 12, 6, 3: none a multiple of the k
    alignment (2 for group 128, 8 for the others), with groups that tiles straddle (Dg = 384, or 768 for G = 1)."""
    G = 1 if group_size == 256 else 2
    case = QuantCase(53, 6, G, head_dim=128, rope_dim=64, quant_group_size=group_size)
    ks = 6 * 128 // G // group_size
    assert ks % (2 if group_size == 128 else 8) and case.num_tokens % 32
    check_layout(case, "row", E8M0, "mfma_tile", seed=group_size)


@pytest.mark.slow  # the full DeepSeek-V4 shapes in the interpreter
@pytest.mark.parametrize("group_size", [128, 32])
@pytest.mark.parametrize("shape", list(DEEPSEEK), ids=list(DEEPSEEK))
def test_mfma_tile_deepseek_shapes_group_major_x(shape, group_size):
    H, G = DEEPSEEK[shape]
    check_layout(QuantCase(18, H, G, quant_group_size=group_size), "group_major", torch.uint8, "mfma_tile",
                 seed=group_size + G)


@pytest.mark.parametrize("group_size", [128, 32])
def test_mfma_tile_several_tokens_per_program(group_size, monkeypatch):
    """A 128-column row: four tokens per program, so the last program's tile holds tokens 53..55, which are
    S_pad padding: masked tokens must not write their (padding) bytes. Ks = 1 and 4."""
    seen = spy_launches(monkeypatch)
    check_layout(QuantCase(53, 1, 1, head_dim=128, rope_dim=64, quant_group_size=group_size), "padded", E8M0,
                 "mfma_tile", seed=5)
    assert seen[0]["BLOCK_T"] == 4 and 53 % 4


# -- quantize=False ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("o_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case,x_layout", [
    (QuantCase(3, 16, 2), "group_major"), (QuantCase(2, 8, 1), "row"),
    (QuantCase(5, 4, 2, head_dim=192, rope_dim=32, quant_group_size=64), "padded")], ids=lambda v: getattr(v, "id", v))
def test_quantize_false_writes_the_rotation_in_o_dtype(case, x_layout, o_dtype):
    check_layout(case, x_layout, None, o_dtype=o_dtype, seed=11)


# -- the baseline's quant step and the checks --------------------------------------------------------------------
def test_group_quant_baseline_writes_group_major_x():
    case = QuantCase(3, 16, 2)
    TK = _tk()

    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE, seed=2, edge_cases=True)
    S, G = 3, 2
    x, xbuf = guarded_poison((S, G, 4096), torch.float8_e4m3fn, DEVICE, x_strides("group_major", S, G, 4096),
                             byte=POISON)
    s, sbuf = scale_buffer(case, E8M0, "col")
    rotated = R.inverse_rope_tail(o, pos, cos, sin).to(o.dtype)
    TK.group_quant(rotated, pos, cos, x, s, 128, scale_layout="col", pdl=True)
    q, byte = R.group_quant_e8m0(rotated, G, 128, torch.float8_e4m3fn)
    assert torch.equal(x.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s.view(torch.uint8), byte)
    assert bytes_written_outside(xbuf, x, POISON) == 0 and bytes_written_outside(sbuf, s, POISON) == 0


@pytest.mark.skipif(DEVICE.type != "cpu", reason="frombuffer makes CPU tensors")
def test_misaligned_x_is_refused():
    """``x`` in o's dtype (quantize=False) one byte off its element size: refused by name, as the other tensors."""
    case = QuantCase(1, 8, 1)
    o, pos, cos, sin = make_quant_inputs(case)
    raw = bytearray(4096 * 2 + 1)
    x = torch.frombuffer(raw, dtype=torch.bfloat16, offset=1, count=4096).view(1, 1, 4096)
    assert x.data_ptr() % 2 == 1
    with pytest.raises(ValueError, match="argument 'x' expected data aligned to its element size"):
        _tk().inverse_rope_group_quant(o, pos, cos, sin, x, None, 128)
