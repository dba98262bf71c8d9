"""inverse_rope_group_quant as the engines call it: vLLM's DeepSeek-V4 ``fused_inv_rope_fp8_quant`` and aiter's
``inverse_rope_group_quant`` / ``scale_shape`` (fusedrope.integrations), and the main op's layouts behind them
(group-major x_fp8, scale_layout, quantize=False). Every layout is checked against a construction written here
from the layout's own description (strides, the mfma_tile index map), from the row-major reference outputs,
on each backend that serves it."""

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fusedrope
from fusedrope.integrations import aiter, vllm
from fusedrope.reference import e8m0_to_float, inverse_rope_tail
from fusedrope.testing import QUANT_HEAD_GROUPS, QuantCase, deepseek_rope_cache, make_quant_inputs, scale_bytes

from conftest import DEVICE, backends_here

OP = "inverse_rope_group_quant"
BACKENDS = [p for p in backends_here(OP) if p.id in ("reference", "triton")]
SEED = [(h, g, s) for (h, g) in QUANT_HEAD_GROUPS.values() for s in (1, 5, 33)]


@pytest.fixture
def force(monkeypatch):
    """Run the adapters (which take no backend argument) on one backend, as FUSEDROPE_BACKEND does."""
    return lambda backend: monkeypatch.setenv(fusedrope.ENV_BACKEND, backend)


def inputs(S, H, seed=0):
    o, pos, _, _ = make_quant_inputs(QuantCase(S, H, 1), device=DEVICE, seed=seed, edge_cases=True)
    cache = torch.cat(deepseek_rope_cache(4096), dim=1).to(DEVICE)  # [max_pos, 64]: cos | sin, as vLLM keeps it
    return o, pos, cache


def row_major(o, pos, cache, G, **kw):
    """The main op's default outputs on the reference: row-major x [S, G, Dg] and scales [S, G, Ks]."""
    return fusedrope.inverse_rope_group_quant(o, pos, cache[:, :32], cache[:, 32:], G, backend="reference", **kw)


class TorchDispatchRecorder(TorchDispatchMode):
    """The aten ops run inside it, by name (the fills poisoned_empty makes included)."""

    def __enter__(self):
        self.ops = []
        super().__enter__()
        return self.ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def storage_of(t: torch.Tensor) -> torch.Tensor:
    """Every element of ``t``'s storage, in storage order, as ``t``'s dtype."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())


# -- vLLM ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H,G,S", SEED)
@pytest.mark.parametrize("tma", [False, True], ids=["fp32-sm90", "ue8m0-sm100"])
def test_vllm_adapter_returns_what_vllm_returns(backend, H, G, S, tma, force):
    force(backend)
    o, pos, cache = inputs(S, H)
    want_x, want_scale = row_major(o, pos, cache, G)
    x, scale = vllm.fused_inv_rope_fp8_quant(o, pos, cache, G, H // G, tma_aligned_scales=tma)
    D, K = want_x.shape[2], want_scale.shape[2]
    # o_fp8: [T, G, D] over [G, T, D] storage, the values of the row-major result
    assert x.dtype == torch.float8_e4m3fn and x.shape == (S, G, D) and x.stride() == (D, S * D, 1)
    assert torch.equal(x.view(torch.uint8), want_x.view(torch.uint8))
    assert torch.equal(storage_of(x).view(torch.uint8), want_x.transpose(0, 1).reshape(-1).view(torch.uint8))
    # o_scale: [T, G, K] MN-major, tokens padded to 4 in storage [G, K', T_pad], padding rows zero
    t_pad, inner = -(-S // 4) * 4, K // 4 if tma else K
    assert scale.shape == (S, G, inner) and scale.stride() == (1, inner * t_pad, t_pad)
    stored = storage_of(scale)[: G * inner * t_pad].view(G, inner, t_pad)
    if tma:
        b = scale_bytes(want_scale).to(torch.int64)  # [S, G, K]
        words = b[..., 0::4] | b[..., 1::4] << 8 | b[..., 2::4] << 16 | b[..., 3::4] << 24  # block 4j+i in byte i
        got = stored[:, :, :S].permute(2, 0, 1).to(torch.int64) & 0xFFFFFFFF
        assert scale.dtype == torch.int32 and torch.equal(got, words)
    else:
        want = e8m0_to_float(scale_bytes(want_scale))  # NaN for a block with NaN/Inf: compare the bits
        assert scale.dtype == torch.float32
        assert torch.equal(stored[:, :, :S].permute(2, 0, 1).contiguous().view(torch.int32), want.view(torch.int32))
    assert not stored[:, :, S:].view(torch.int32).any(), "padding rows are not zero"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tma", [False, True], ids=["fp32-sm90", "ue8m0-sm100"])
def test_vllm_adapter_zeroes_the_padding_in_its_one_launch(backend, tma, force, monkeypatch):
    """T = 5: the op itself writes the 3 padding rows as zeros (its storage comes poisoned here), and the adapter
    launches nothing else: one backend call, no fill."""
    force(backend)
    o, pos, cache = inputs(5, 16, seed=5)
    real_empty, runs = torch.empty, []

    def poisoned_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.view(torch.uint8).fill_(0x7F).view(t.dtype) if t.dim() == 3 and t.dtype in (
            torch.int32, torch.float32) else t

    impl = fusedrope.registry("inverse_rope_group_quant").backend(backend)
    run = impl.loaded().run
    monkeypatch.setattr(impl, "run", lambda *a, **kw: runs.append(1) or run(*a, **kw))
    with monkeypatch.context() as m:
        m.setattr(torch, "empty", poisoned_empty)
        x, scale = vllm.fused_inv_rope_fp8_quant(o, pos, cache, 2, 8, tma_aligned_scales=tma)
    stored = storage_of(scale)[: scale.stride(1) * 2].view(2, -1, 8)
    assert not stored[:, :, 5:].view(torch.int32).any(), "padding rows are not zero"
    assert stored[:, :, :5].view(torch.int32).any()
    assert runs == [1]
    if backend != "reference":  # the reference backend is plain PyTorch, which zeroes with an aten op
        with TorchDispatchRecorder() as ops:
            vllm.fused_inv_rope_fp8_quant(o, pos, cache, 2, 8, tma_aligned_scales=tma)
        assert ops and not [op for op in ops if "fill" in op or "zero" in op], ops


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H,G,S", SEED[:3])
def test_vllm_adapter_without_quantization(backend, H, G, S, force):
    force(backend)
    o, pos, cache = inputs(S, H, seed=3)
    x, scale = vllm.fused_inv_rope_fp8_quant(o, pos, cache, G, H // G, quantize=False)
    want = inverse_rope_tail(o, pos, cache[:, :32], cache[:, 32:]).to(o.dtype).reshape(S, G, -1)  # fp32, rounded once
    assert x.dtype == o.dtype and x.stride() == (want.shape[2], S * want.shape[2], 1) and scale.numel() == 0
    assert torch.equal(x.view(torch.int16), want.view(torch.int16))


def test_vllm_adapter_names_what_does_not_fit():
    o, pos, cache = inputs(2, 16)
    with pytest.raises(ValueError, match="fused_inv_rope_fp8_quant: argument 'o' expected H = n_groups \\* "
                                         "heads_per_group = 12 heads, got H=16"):
        vllm.fused_inv_rope_fp8_quant(o, pos, cache, 2, 6)
    with pytest.raises(ValueError, match="argument 'cos_sin_cache' expected shape \\[max_pos, rope_dim=64\\]"):
        vllm.fused_inv_rope_fp8_quant(o, pos, cache[:, :32], 2, 8)
    with pytest.raises(ValueError, match="^fused_inv_rope_fp8_quant: argument 'o' expected a 3-D tensor"):
        vllm.fused_inv_rope_fp8_quant(o[0], pos, cache, 2, 8)
    with pytest.raises(ValueError, match="^fused_inv_rope_fp8_quant: argument 'tma_aligned_scales' expected False when "
                                         "the blocks per group D/quant_group_size=2 are not a multiple of 4"):
        vllm.fused_inv_rope_fp8_quant(o, pos, cache, 16, 1, quant_group_size=256, tma_aligned_scales=True)


# -- aiter ------------------------------------------------------------------------------------------------------
def mfma_tile_reference(byte: torch.Tensor, quant_group_size: int) -> dict:
    """{flat offset in the [G, S_pad, Ks_pad] buffer: byte} for bytes [S, G, Ks], written from the index maps
    alone: group 128 at (g, s // 32, k // 2, s % 16, k % 2, (s // 16) % 2) of [G, S_pad/32, Ks_pad/2, 16, 2, 2],
    other groups at (g, s // 32, k // 8, k % 4, s % 16, (k // 4) % 2, (s // 16) % 2) of [G, S_pad/32, Ks_pad/8,
    4, 16, 2, 2]."""
    S, G, Ks = byte.shape
    g128 = quant_group_size == 128
    s_pad, k_pad = -(-S // 32) * 32, -(-Ks // (2 if g128 else 8)) * (2 if g128 else 8)
    dims = (G, s_pad // 32, k_pad // 2, 16, 2, 2) if g128 else (G, s_pad // 32, k_pad // 8, 4, 16, 2, 2)
    out = {}
    for s, g, k in itertools.product(range(S), range(G), range(Ks)):
        index = ((g, s // 32, k // 2, s % 16, k % 2, (s // 16) % 2) if g128
                 else (g, s // 32, k // 8, k % 4, s % 16, (k // 4) % 2, (s // 16) % 2))
        flat = 0
        for i, n in zip(index, dims):
            flat = flat * n + i
        out[flat] = int(byte[s, g, k])
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("S,H,G,group", [(1, 16, 2, 128), (33, 8, 1, 128), (5, 16, 2, 32), (40, 4, 2, 64)])
def test_aiter_mfma_tile_scales_sit_where_the_index_map_says(backend, S, H, G, group, force):
    force(backend)
    o, pos, cache = inputs(S, H, seed=S)
    cos, sin = cache[:, :32], cache[:, 32:]
    want_x, want_scale = row_major(o, pos, cache, G, quant_group_size=group, fp8_dtype=torch.float8_e4m3fn)
    Ks = want_scale.shape[2]
    shape = aiter.scale_shape(S, G, Ks, "mfma_tile", group)
    x_scale = torch.full(shape, 0xA5, dtype=torch.uint8, device=DEVICE).view(torch.float8_e8m0fnu)  # poisoned
    x, s = aiter.inverse_rope_group_quant(o, pos, cos, sin, G, group, "mfma_tile", x_scale=x_scale)
    assert s is x_scale and s.shape == shape and torch.equal(x.view(torch.uint8), want_x.view(torch.uint8))
    flat = x_scale.view(torch.uint8).reshape(-1)
    placed = mfma_tile_reference(scale_bytes(want_scale), group)
    assert {i: int(flat[i]) for i in placed} == placed
    untouched = torch.ones(flat.numel(), dtype=torch.bool, device=DEVICE)
    untouched[list(placed)] = False
    assert bool((flat[untouched] == 0xA5).all()), "padding bytes were written"


def n32k4_reference(byte: torch.Tensor, fill: int) -> torch.Tensor:
    """The ``[ceil(S/32), G, Ks*32]`` n32k4 buffer of bytes ``[S, G, Ks]``, written from aiter's statement of the
    layout: tokens padded to 32 (with ``fill``), each super-row of 32 tokens and K=128 step of 4 blocks stored as
    32 token words of 4 bytes: ``[S/32, 32, G, Ks/4, 4]`` permuted to ``[S/32, G, Ks/4, 32, 4]``."""
    S, G, Ks = byte.shape
    padded = torch.full((-(-S // 32) * 32, G, Ks), fill, dtype=torch.uint8, device=byte.device)
    padded[:S] = byte
    return padded.view(-1, 32, G, Ks // 4, 4).permute(0, 2, 3, 1, 4).reshape(-1, G, Ks * 32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("S,H,G", [(1, 16, 2), (33, 8, 1), (70, 4, 2)])
def test_aiter_n32k4_scales_sit_where_the_layout_says(backend, S, H, G, force):
    force(backend)
    o, pos, cache = inputs(S, H, seed=S)
    cos, sin = cache[:, :32], cache[:, 32:]
    want_x, want_scale = row_major(o, pos, cache, G, quant_group_size=32, fp8_dtype=torch.float8_e4m3fn)
    Ks = want_scale.shape[2]
    shape = aiter.scale_shape(S, G, Ks, "n32k4", 32)
    assert shape == (-(-S // 32), G, Ks * 32)
    x_scale = torch.full(shape, 0xA5, dtype=torch.uint8, device=DEVICE).view(torch.float8_e8m0fnu)  # poisoned
    x, s = aiter.inverse_rope_group_quant(o, pos, cos, sin, G, 32, "n32k4", x_scale=x_scale)
    assert s is x_scale and torch.equal(x.view(torch.uint8), want_x.view(torch.uint8))
    assert torch.equal(s.view(torch.uint8), n32k4_reference(scale_bytes(want_scale), 0xA5)), \
        "scales misplaced, or padding bytes written"
    _, new = aiter.inverse_rope_group_quant(o, pos, cos, sin, G, 32, "n32k4")  # allocated by the drop-in
    real = n32k4_reference(torch.ones_like(scale_bytes(want_scale)), 0).bool()
    assert new.shape == shape and torch.equal(new.view(torch.uint8)[real], s.view(torch.uint8)[real])


def fp32_format_reference(o, pos, cos, sin, G, group, fp8=torch.float8_e4m3fn):
    """``(x bytes, scales)`` of ``scale_format="fp32"`` computed in numpy float32 from the rotated fp32 values:
    ``a = max(amax, 1e-12)``, ``scale = a * f32(1/FP8_MAX)``, ``x = fp8_rne(clip(v * (FP8_MAX / a)))`` (IEEE
    division); NaN scale and values for a block holding NaN or Inf."""
    import numpy as np

    fp8_max = np.float32(fusedrope.reference.FP8_MAX[fp8])
    v = inverse_rope_tail(o, pos, cos, sin).reshape(o.shape[0], G, -1, group).cpu().numpy()
    amax = np.abs(v).max(axis=-1, keepdims=True)  # NaN propagates
    a = np.maximum(amax, np.float32(1e-12))
    with np.errstate(invalid="ignore", over="ignore"):
        scale = a * np.float32(1 / float(fp8_max))
        q = np.clip(v * (fp8_max / a), -fp8_max, fp8_max)
    bad = ~np.isfinite(amax)
    q, scale = np.where(bad, np.float32("nan"), q), np.where(bad, np.float32("nan"), scale)
    x = torch.from_numpy(q.reshape(o.shape[0], G, -1)).to(fp8)  # torch's cast: round to nearest even
    return x.view(torch.uint8).to(DEVICE), torch.from_numpy(scale[..., 0]).to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("S,H,G,group", [(1, 16, 2, 128), (33, 8, 1, 32), (5, 4, 2, 64)])
@pytest.mark.parametrize("layout", ["row", "col", "col_padded"])
def test_fp32_scale_format_is_tensorrt_llms(backend, S, H, G, group, layout):
    o, pos, cache = inputs(S, H, seed=S + 1)
    o[0, 0, :group] = 0  # an all-zero block
    cos, sin = cache[:, :32], cache[:, 32:]
    want_x, want_scale = fp32_format_reference(o, pos, cos, sin, G, group)
    assert bool(want_scale.isnan().any()), "the edge cases put a NaN block in the data"
    kw = dict(quant_group_size=group, scale_format="fp32", backend=backend)
    if layout == "col_padded":  # vLLM / TensorRT-LLM's [G, K, T_pad] buffer, poisoned: padding rows get 0.0
        x, _ = fusedrope.empty_quant_outputs(o, G, group)
        Ks = want_scale.shape[2]
        store = torch.full((G, Ks, S + 3), 7.0, device=DEVICE)
        got_x, got = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, G, x_fp8=x, x_scale=store.permute(2, 0, 1),
                                                        transpose_scale=True, **kw)
        assert not store[:, :, S:].any(), "padding rows are not 0.0"
        got = got[:S]
    else:
        got_x, got = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, G, transpose_scale=layout == "col", **kw)
        assert got.dtype == torch.float32 and got.stride() == ((1, got.shape[2] * S, S) if layout == "col" else
                                                                (G * got.shape[2], got.shape[2], 1))
    assert torch.equal(got_x.view(torch.uint8), want_x)
    assert torch.equal(got.contiguous().view(torch.int32), want_scale.view(torch.int32))  # NaN bits included
    assert float(got[0, 0, 0]) == float(torch.tensor(1e-12) * torch.tensor(1 / 448))  # the zero block's scale


def test_only_triton_and_the_reference_write_the_new_formats():
    from fusedrope.inverse_rope_group_quant import cuda, describe, validate

    o, pos, cache = inputs(2, 16)
    cos, sin = cache[:, :32], cache[:, 32:]
    for group, modes in ((128, describe(scale_format="fp32")), (32, describe(scale_layout="n32k4"))):
        facts = validate(o, pos, cos, sin, 2, group, False, modes=modes)[0]
        assert "Triton serves" in cuda.envelope_reason("cuda kernel", facts), modes


def test_aiter_row_layout_scale_shape_and_what_it_refuses():
    o, pos, cache = inputs(4, 16)
    cos, sin = cache[:, :32], cache[:, 32:]
    x, s = aiter.inverse_rope_group_quant(o, pos, cos, sin, 2)
    want = row_major(o, pos, cache, 2, fp8_dtype=fusedrope._device.native_fp8_dtype(DEVICE))
    assert s.shape == aiter.scale_shape(4, 2, 32) == (4, 2, 32) and x.dtype == want[0].dtype
    assert torch.equal(x.view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(scale_bytes(s), scale_bytes(want[1]))
    assert aiter.scale_shape(33, 2, 5, "mfma_tile", 64) == (2, 64, 8)
    assert aiter.scale_shape(1, 1, 3, "mfma_tile") == (1, 32, 4)
    with pytest.raises(ValueError, match="argument 'quant_group_size' expected quant_group_size=32"):
        aiter.inverse_rope_group_quant(o, pos, cos, sin, 2, scale_layout="n32k4")
    with pytest.raises(ValueError, match="argument 'scale_layout' expected one of \\('row', 'mfma_tile', 'n32k4'\\)"):
        aiter.scale_shape(4, 2, 32, "col")


# -- the main op's layouts and switches ------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_group_major_and_padded_rows_hold_the_row_major_values(backend):
    o, pos, cache = inputs(6, 16, seed=7)
    want_x, want_scale = row_major(o, pos, cache, 2)
    for strides in ((4096, 6 * 4096, 1), (2 * 4096 + 64, 4096, 1)):
        buf = torch.full((6 * 2 * 4096 + 1024,), 0x3C, dtype=torch.uint8, device=DEVICE)
        x = buf.view(torch.float8_e4m3fn).as_strided((6, 2, 4096), strides)
        got = fusedrope.inverse_rope_group_quant(o, pos, cache[:, :32], cache[:, 32:], 2, x_fp8=x,
                                                 x_scale=torch.empty_like(want_scale), backend=backend)
        assert got[0] is x and torch.equal(x.view(torch.uint8), want_x.view(torch.uint8)), strides
        assert torch.equal(scale_bytes(got[1]), scale_bytes(want_scale))


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale_layout_col_is_transpose_scale(backend):
    o, pos, cache = inputs(5, 8, seed=9)
    a = fusedrope.inverse_rope_group_quant(o, pos, cache[:, :32], cache[:, 32:], 1, transpose_scale=True,
                                           backend=backend)
    b = fusedrope.inverse_rope_group_quant(o, pos, cache[:, :32], cache[:, 32:], 1, scale_layout="col",
                                           backend=backend)
    assert a[1].stride() == b[1].stride() == (1, 32 * 5, 5) and torch.equal(scale_bytes(a[1]), scale_bytes(b[1]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale_dtype", [torch.float8_e8m0fnu, torch.float32, torch.int32], ids=str)
def test_a_column_major_scale_buffer_with_more_rows_gets_zeros_past_o(backend, scale_dtype):
    """x_scale [S_pad, G, Ks] over storage [G, Ks, S_pad], S_pad > S (vLLM's TMA padding): the first S rows are
    the scales, the rest zeros (the storage comes poisoned); a row-major one with more rows is refused."""
    S, H, G = 5, 16, 2
    o, pos, cache = inputs(S, H, seed=11)
    want_x, want = row_major(o, pos, cache, G, scale_dtype=scale_dtype)
    ks, size = want.shape[2], want.element_size()
    for s_pad in (6, 8, 13):
        storage = torch.full((G, ks, s_pad * size), 0x7F, dtype=torch.uint8, device=DEVICE)  # poisoned
        padded = storage.view(scale_dtype).permute(2, 0, 1)
        x, scale = fusedrope.inverse_rope_group_quant(o, pos, cache[:, :32], cache[:, 32:], G, scale_layout="col",
                                                      x_fp8=torch.empty_like(want_x), x_scale=padded,
                                                      backend=backend)
        assert scale is padded and torch.equal(x.view(torch.uint8), want_x.view(torch.uint8))
        by_token = storage.view(G, ks, s_pad, size).permute(2, 0, 1, 3)  # [S_pad, G, Ks, bytes of a scale]
        assert torch.equal(by_token[:S], want.view(torch.uint8).view(S, G, ks, size))
        assert not by_token[S:].any(), s_pad
    with pytest.raises(ValueError, match=r"argument 'x_scale' expected shape \[5, 2, 32\], got \[8, 2, 32\]"):
        fusedrope.inverse_rope_group_quant(o, pos, cache[:, :32], cache[:, 32:], G, x_fp8=torch.empty_like(want_x),
                                           x_scale=torch.empty(8, G, 32, dtype=torch.float8_e8m0fnu, device=DEVICE))
    short = torch.empty(G * 32 * 6 + 8, dtype=torch.uint8, device=DEVICE).view(torch.float8_e8m0fnu).as_strided(
        (8, G, 32), (1, 32 * 6, 6))  # storage rows of 6 < 8
    with pytest.raises(ValueError, match=r"with L >= S_pad=8 \(empty_quant_outputs gives \(1, 256, 8\)\)"):
        fusedrope.inverse_rope_group_quant(o, pos, cache[:, :32], cache[:, 32:], G, scale_layout="col", x_scale=short)
    with pytest.raises(ValueError, match=r"argument 'x_scale' expected shape \[0, 2, (\d+)\], got \[4, 2, \1\]"):
        fusedrope.inverse_rope_group_quant(o[:0], pos, cache[:, :32], cache[:, 32:], G, scale_layout="col",
                                           x_scale=padded[:4])  # an empty o runs nothing, so nothing would zero
    from fusedrope.inverse_rope_group_quant import QuantModes, cuda, validate
    key = validate(o, pos, cache[:, :32], cache[:, 32:], G, 128, False, torch.empty_like(want_x), padded,
                   QuantModes(scale_layout="col"))[0]
    assert key.scale_pad and cuda.head_layout(key) == "padding rows of x_scale"


def test_one_cos_sin_cache_passed_as_both_is_refused():
    """The likeliest mistake: vLLM's whole [max_pos, 64] cos||sin cache as cos_cache and sin_cache, read as
    rope_dim 128 (the last 128 dims rotated, silently). The same tensor, or overlapping views, are refused."""
    o, pos, cache = inputs(2, 16)
    for layout in ("row", "col", "mfma_tile"):  # each validation path (mfma_tile takes the slow one)
        for cos, sin in ((cache, cache), (cache[:, :40], cache[:, 24:]), (cache[:-1, :32], cache[1:, :32])):
            with pytest.raises(ValueError, match="argument 'sin_cache' expected memory apart from 'cos_cache' \\(a "
                                                 "cos\\|\\|sin cache \\[max_pos, rope_dim\\] splits into"):
                fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, scale_layout=layout, backend="reference")
        fusedrope.inverse_rope_group_quant(o, pos, cache[:, :32], cache[:, 32:], 2, scale_layout=layout)  # the split


def test_x_rows_that_overlap_are_refused():
    o, pos, cache = inputs(3, 16)
    x = torch.empty(3 * 4096 + 4096, dtype=torch.float8_e4m3fn).as_strided((3, 2, 4096), (2048, 4096, 1))
    with pytest.raises(ValueError, match="argument 'x_fp8' expected rows of Dg=4096 contiguous and apart"):
        fusedrope.inverse_rope_group_quant(o, pos, cache[:, :32], cache[:, 32:], 2, x_fp8=x,
                                           x_scale=torch.empty(3, 2, 32, dtype=torch.float8_e8m0fnu))


def test_adapters_under_torch_compile_give_the_eager_bytes():
    o, pos, cache = inputs(5, 16, seed=4)

    def step(o, pos, cache):
        x, s = vllm.fused_inv_rope_fp8_quant(o, pos, cache, 2, 8)
        y, _ = vllm.fused_inv_rope_fp8_quant(o, pos, cache, 2, 8, quantize=False)
        return x.view(torch.uint8) + 0, s.view(torch.int32) + 0, y.view(torch.int16) + 0  # bits: NaN blocks too

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(o, pos, cache), step(o, pos, cache)):
        assert torch.equal(a, b)


@pytest.mark.slow  # dynamic-shape compiles, as tests/test_dynamic_shapes.py
def test_vllm_adapter_compiles_with_a_dynamic_token_count():
    """vLLM compiles its model with fullgraph=True and the token dim marked dynamic: one graph serves every T,
    group-major fp8 and padded scales included."""
    def step(o, pos, cache):
        x, s = vllm.fused_inv_rope_fp8_quant(o, pos, cache, 2, 8)
        return x.view(torch.uint8) + 0, s.view(torch.int32) + 0

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for T in (5, 8, 11):
        o, pos, cache = inputs(T, 16, seed=T)
        torch._dynamo.mark_dynamic(o, 0)
        torch._dynamo.mark_dynamic(pos, 0)
        for a, b in zip(compiled(o, pos, cache), step(o, pos, cache)):
            assert torch.equal(a, b), T
