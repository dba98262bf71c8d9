"""Output memory that shares elements with another operand: detected where certain, never a false alarm.

``fusedrope._validation.shares_memory`` is checked against brute force (the byte sets of the two views) on random
views of one storage; the ops are checked to refuse in-place or caller buffers that overlap, and to accept the
layouts engines really use (interleaved heads of one fused qkv buffer, outputs carved from one workspace).
"""

import random

import pytest
import torch

import fusedrope
from fusedrope import _validation as C
from fusedrope.testing import deepseek_rope_cache

STORAGE_BYTES = 96


def _view(storage, dtype, offset, shape, strides):
    return torch.empty(0, dtype=dtype).set_(storage, offset, shape, strides)


def _bytes(t):
    """The storage bytes ``t``'s elements occupy, by brute force."""
    if not t.numel():
        return set()
    size = t.element_size()
    index = torch.arange(t.untyped_storage().nbytes() // size).as_strided(t.shape, t.stride(), t.storage_offset())
    return {int(i) * size + b for i in index.flatten() for b in range(size)}


def _random_view(rng, storage):
    dtype = rng.choice((torch.uint8, torch.bfloat16, torch.float32))
    size = torch.empty(0, dtype=dtype).element_size()
    slots = STORAGE_BYTES // size
    ndim = rng.randint(1, 3)
    shape = [rng.choice((0, 1, 1, 2, 3, 4)) if rng.random() < 0.1 else rng.randint(1, 4) for _ in range(ndim)]
    if rng.random() < 0.5:  # dense, in a random dim order
        order, strides, step = rng.sample(range(ndim), ndim), [0] * ndim, 1
        for d in order:
            strides[d], step = step, step * shape[d]
    else:
        strides = [rng.randint(0, 6) for _ in range(ndim)]
    extent = sum((n - 1) * s for n, s in zip(shape, strides)) + 1 if all(shape) else 1
    if extent > slots:
        return None
    return _view(storage, dtype, rng.randint(0, slots - extent), shape, strides)


def _dense(t):
    dims = sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1)
    step = 1
    for s, n in dims:
        if s != step:
            return False
        step *= n
    return True


def test_shares_memory_against_brute_force():
    """Never true for views with no byte in common; always right when both are dense or start together."""
    rng = random.Random(0)
    storage = torch.empty(STORAGE_BYTES, dtype=torch.uint8).untyped_storage()
    seen = {True: 0, False: 0}
    for _ in range(3000):
        a, b = _random_view(rng, storage), _random_view(rng, storage)
        if a is None or b is None:
            continue
        truth = bool(_bytes(a) & _bytes(b))
        got = C.shares_memory(a, b)
        assert got == C.shares_memory(b, a)
        where = f"{a.dtype}{tuple(a.shape)}{a.stride()}@{a.storage_offset()} vs " \
                f"{b.dtype}{tuple(b.shape)}{b.stride()}@{b.storage_offset()}"
        assert not got or truth, f"false alarm: {where}"
        if (_dense(a) and _dense(b)) or (a.numel() and b.numel() and a.data_ptr() == b.data_ptr()):
            assert got == truth, f"missed: {where}"
        seen[got] += 1
    assert min(seen.values()) > 200, seen  # both answers were exercised


def test_separate_allocations_and_tensors_without_data():
    a, b = torch.zeros(4), torch.zeros(4)
    assert not C.shares_memory(a, b)
    C.check_apart("op", {"a": a}, {"b": b})
    with pytest.raises(ValueError, match="op: argument 'a' expected memory apart from 'b', got a tensor sharing "
                                         "elements with 'b'"):
        C.check_apart("op", {"a": a[1:]}, {"b": a[:2]})
    meta = torch.empty(4, device="meta")
    assert not C.shares_memory(meta, meta[1:])
    C.check_apart("op", {"a": meta}, {"b": meta})  # no data to compare: tracing decides nothing here


# -- qwen3_tts_rope, inplace=True ----------------------------------------------------------------------------
def _qkv(B=2, S=3, Hq=4, Hkv=2, D=16):
    """Heads of one fused projection ``[B, S, Hq + 2 Hkv, D]``, as ``[B, H, S, D]`` views."""
    qkv = torch.randn(B, S, Hq + 2 * Hkv, D, dtype=torch.bfloat16)
    return qkv, qkv[:, :, :Hq].transpose(1, 2), qkv[:, :, Hq:Hq + Hkv].transpose(1, 2)


def test_inplace_into_interleaved_heads_of_one_buffer_is_accepted():
    qkv, q, k = _qkv()
    cos, sin = torch.randn(2, 1, 3, 16, dtype=torch.bfloat16)
    want = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")
    v = qkv[:, :, 6:].clone()
    fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend="reference")
    assert torch.equal(q, want[0]) and torch.equal(k, want[1]) and torch.equal(qkv[:, :, 6:], v)


@pytest.mark.parametrize("how", ["k inside q", "q inside k", "k straddles q's start", "k straddles q's end"])
def test_inplace_with_overlapping_q_and_k_is_refused(how):
    """Views of one buffer, none dense: found by looking for each one's first and last byte in the other."""
    base = torch.randn(2, 6, 3, 16, dtype=torch.bfloat16)
    q, k = {"k inside q": (base[:, :4], base[:, 1:3]),  # e.g. GQA's k taken from q's heads by mistake
            "q inside k": (base[:, 2:3], base[:, 1:4]),
            "k straddles q's start": (base[:, 2:4], base[:, 1:3]),
            "k straddles q's end": (base[:, :4], base[:, 3:5])}[how]
    cos = torch.randn(1, 3, 16, dtype=torch.bfloat16)
    before = base.clone()
    with pytest.raises(ValueError, match="argument 'k' expected memory apart from 'q' for inplace=True, got a "
                                         "tensor sharing elements with 'q'"):
        fusedrope.qwen3_tts_rope(q, k, cos, cos, inplace=True, backend="reference")
    assert torch.equal(base, before)  # refused before anything was written


# -- inverse_rope_group_quant, caller buffers --------------------------------------------------------------
def _quant_args(S=3):
    o = torch.randn(S, 2, 512, dtype=torch.bfloat16)
    cos, sin = deepseek_rope_cache(16)
    return o, torch.arange(S), cos, sin


def _carve(nbytes, S=3, G=2, fp8_at=0, scale_at=None, transpose_scale=False):
    """x_fp8 and an e8m0 x_scale laid out in one byte workspace at the given byte offsets."""
    ws = torch.zeros(nbytes, dtype=torch.uint8)
    x_fp8 = ws[fp8_at:fp8_at + S * 1024].view(torch.float8_e4m3fn).view(S, G, 512)
    at = fp8_at + S * 1024 if scale_at is None else scale_at
    sc = ws[at:at + S * G * 4].view(torch.float8_e8m0fnu)
    x_scale = sc.view(G, 4, S).permute(2, 0, 1) if transpose_scale else sc.view(S, G, 4)
    return ws, x_fp8, x_scale


@pytest.mark.parametrize("transpose_scale", [False, True])
def test_buffers_carved_from_one_workspace_are_accepted(transpose_scale):
    o, pos, cos, sin = _quant_args()
    want = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, transpose_scale=transpose_scale,
                                              backend="reference")
    _, x_fp8, x_scale = _carve(4096, transpose_scale=transpose_scale)
    got = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, transpose_scale=transpose_scale, x_fp8=x_fp8,
                                             x_scale=x_scale, backend="reference")
    assert got[0] is x_fp8 and got[1] is x_scale
    assert torch.equal(x_fp8.view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(x_scale.view(torch.uint8), want[1].view(torch.uint8))


@pytest.mark.parametrize("name,other", [("x_fp8", "x_scale"), ("x_fp8", "o"), ("x_scale", "cos_cache"),
                                        ("x_scale", "positions")])
@pytest.mark.parametrize("how", ["call", "explain"])
def test_buffers_sharing_memory_are_refused(name, other, how):
    o, pos, cos, sin = _quant_args()
    args = dict(o=o, positions=pos, cos_cache=cos, sin_cache=sin)
    if other == "x_scale":  # x_scale inside x_fp8
        _, args["x_fp8"], args["x_scale"] = _carve(4096, scale_at=100)
    elif other == "o":  # quantised into the attention output's own memory
        args["x_fp8"] = o.view(-1).view(torch.uint8)[1024:4096].view(torch.float8_e4m3fn).view(3, 2, 512)
    else:
        raw = args[other].view(torch.uint8)
        args["x_scale"] = (raw[0] if raw.dim() > 1 else raw)[:24].view(torch.float8_e8m0fnu).view(3, 2, 4)
    before = {n: t.clone() for n, t in args.items() if n in ("o", "positions", "cos_cache")}
    with pytest.raises(ValueError, match=f"inverse_rope_group_quant: argument '{name}' expected memory apart "
                                         f"from '{other}', got a tensor sharing elements with '{other}'"):
        if how == "call":
            fusedrope.inverse_rope_group_quant(**args, num_groups=2, backend="reference")
        else:  # explain raises what the call would
            fusedrope.explain("inverse_rope_group_quant", **args, num_groups=2)
    assert all(torch.equal(args[n], t) for n, t in before.items())


# -- one buffer behind several storage objects (numpy, DLPack, from_blob) -----------------------------------
def _other_storage(t: torch.Tensor, skip: int = 0) -> torch.Tensor:
    """``t``'s bytes from the ``skip``-th on, in a tensor torch does not know shares them: a new storage object
    from DLPack, which starts where that view starts."""
    alias = torch.from_dlpack(t.view(torch.uint8).reshape(-1)[skip:])
    assert alias.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() + skip
    return alias


def test_buffers_over_an_inputs_bytes_are_refused_whatever_storage_object_holds_them():
    """x_fp8 over o's bytes through DLPack (numpy's and from_blob's storages are new objects the same way): found
    by address, not by storage identity; before, such a buffer was accepted and the results were wrong."""
    o, pos, cos, sin = _quant_args()
    x_fp8 = _other_storage(o, skip=2)[: o.numel()].view(torch.float8_e4m3fn).view(3, 2, 512)
    x_scale = torch.empty(3, 2, 4, dtype=torch.float8_e8m0fnu)
    before = o.clone()
    with pytest.raises(ValueError, match="argument 'x_fp8' expected memory apart from 'o', got a tensor sharing "
                                         "elements with 'o'"):
        fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, False, x_fp8, x_scale, backend="reference")
    assert torch.equal(o, before)
    qkv, q, k = _qkv()
    shifted = _other_storage(qkv, skip=2).view(torch.bfloat16)  # qkv from its second element on
    k_out = shifted.as_strided(k.shape, k.stride(), k.storage_offset() - 1)  # k's own bytes
    with pytest.raises(ValueError, match="argument 'k_out' expected memory apart from 'k'"):
        fusedrope.qwen3_tts_rope(q, k, *torch.randn(2, 2, 3, 16, dtype=torch.bfloat16), k_out=k_out,
                                 backend="reference")
    v = qkv[:, :, 6:].transpose(1, 2)
    v_out = shifted.as_strided(v.shape, v.stride(), v.storage_offset() - 1)  # v's bytes: apart from q and k
    fusedrope.qwen3_tts_rope(q, k, *torch.randn(2, 2, 3, 16, dtype=torch.bfloat16), k_out=v_out,
                             backend="reference")
