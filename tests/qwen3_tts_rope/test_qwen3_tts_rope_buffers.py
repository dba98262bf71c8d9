"""qwen3_tts_rope into caller buffers (``q_out=`` / ``k_out=``): e.g. rotated keys straight into a slice of a
static KV cache. Every backend against the oracle with nothing written around the slice; the checks a buffer
gets; the torch op under torch.compile."""

import re

import pytest
import torch

import fusedrope
from fusedrope.testing import TtsCase, assert_tts_rope_close, make_tts_inputs

from conftest import DEVICE, backends_here

BACKENDS = backends_here("qwen3_tts_rope")
CASE = TtsCase("buf", 2, 3, 4, 2, 64)
POS = 4  # where this step's tokens go in the cache


def _inputs(seed=31):
    return make_tts_inputs(CASE, device=DEVICE, seed=seed, random_cos_sin=True)


def _cache(src, length=10):
    """A NaN-filled static cache ``[B, H, length, D]`` and the slice for this step's S tokens at POS."""
    B, H, S, D = src.shape
    cache = torch.full((B, H, length, D), float("nan"), dtype=src.dtype, device=src.device)
    return cache, cache[:, :, POS:POS + S]


def _untouched_outside(cache, view):
    outside = torch.ones(cache.shape, dtype=torch.bool, device=cache.device)
    outside[:, :, POS:POS + view.shape[2]] = False
    return bool(cache[outside].isnan().all())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["both", "k_out", "q_out"])
def test_results_land_in_the_buffers(backend, which):
    q, k, cos, sin = _inputs()
    q0, k0 = q.clone(), k.clone()
    (q_cache, q_view), (k_cache, k_view) = _cache(q), _cache(k)
    bufs = {"q_out": q_view, "k_out": k_view}
    bufs = bufs if which == "both" else {which: bufs[which]}
    versions = {n: t._version for n, t in bufs.items()}
    q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend, **bufs)
    assert_tts_rope_close(q_out, k_out, q, k, cos, sin)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    for name, got, cache in (("q_out", q_out, q_cache), ("k_out", k_out, k_cache)):
        if name in bufs:
            assert got is bufs[name] and _untouched_outside(cache, got) and got._version > versions[name]
        else:
            assert got.is_contiguous() and got.data_ptr() != cache.data_ptr()


def test_empty_inputs_return_the_buffers_unwritten():
    q, k = torch.zeros(2, 4, 0, 64, dtype=torch.bfloat16), torch.zeros(2, 2, 0, 64, dtype=torch.bfloat16)
    cos = sin = torch.zeros(2, 0, 64, dtype=torch.bfloat16)
    k_out = torch.empty(2, 2, 0, 64, dtype=torch.bfloat16)
    q_out, got = fusedrope.qwen3_tts_rope(q, k, cos, sin, k_out=k_out)
    assert got is k_out and q_out.shape == q.shape


def _bad(case):
    q, k, cos, sin = _inputs()
    args = dict(q=q, k=k, cos=cos, sin=sin)
    if case == "q_out is q":
        return args, dict(q_out=q), ValueError, "argument 'q_out' expected a buffer apart from 'q' (inplace=True writes into q and k), got 'q' itself"
    if case == "k_out inside q":
        big = torch.randn(2, 4, 3, 64, dtype=q.dtype, device=q.device)
        args["q"] = big
        return args, dict(k_out=big[:, :2]), ValueError, "argument 'k_out' expected memory apart from 'q', got a tensor sharing elements with 'q'"
    if case == "q_out over cos":
        buf = torch.randn(2 * 4 * 3 * 64, dtype=q.dtype, device=q.device)
        args["cos"] = buf[:2 * 3 * 64].view(2, 3, 64)
        return args, dict(q_out=buf.view(2, 4, 3, 64)), ValueError, "argument 'q_out' expected memory apart from 'cos', got a tensor sharing elements with 'cos'"
    if case == "q_out and k_out overlap":
        buf = torch.randn(2, 4, 3, 64, dtype=q.dtype, device=q.device)
        return args, dict(q_out=buf, k_out=buf[:, 2:]), ValueError, "argument 'q_out' expected memory apart from 'k_out', got a tensor sharing elements with 'k_out'"
    if case == "shape":
        return args, dict(k_out=torch.empty(2, 1, 3, 64, dtype=q.dtype)), ValueError, "argument 'k_out' expected shape [2, 2, 3, 64], got [2, 1, 3, 64]"
    if case == "dtype":
        return args, dict(q_out=torch.empty(2, 4, 3, 64)), TypeError, "argument 'q_out' expected dtype bfloat16 (same as 'q'), got float32"
    if case == "device":
        return args, dict(k_out=torch.empty(2, 2, 3, 64, dtype=q.dtype, device="meta")), ValueError, "argument 'k_out' expected a tensor on cpu (same device as 'k'), got a tensor on meta"
    if case == "last stride":
        return args, dict(q_out=torch.empty(2, 4, 3, 128, dtype=q.dtype)[..., ::2]), ValueError, "argument 'q_out' expected a contiguous last dimension (stride 1), got strides (1536, 384, 128, 2)"
    if case == "broadcast":
        return args, dict(k_out=torch.empty(2, 1, 3, 64, dtype=q.dtype).expand(2, 2, 3, 64)), ValueError, "argument 'k_out' expected a writable tensor without broadcast (stride-0) dimensions, got strides (192, 0, 64, 1)"
    if case == "not a tensor":
        return args, dict(q_out=[0.0]), TypeError, "argument 'q_out' expected a torch.Tensor, got list"
    if case == "with inplace":
        return args, dict(inplace=True, k_out=torch.empty_like(k)), ValueError, "argument 'k_out' expected None with inplace=True (which writes into q and k), got a tensor"
    if case == "requires grad":
        return args, dict(q_out=torch.zeros(2, 4, 3, 64, dtype=q.dtype, requires_grad=True)), RuntimeError, "q_out= / k_out= have no autograd formula, and argument 'q_out' requires grad"
    if case == "input requires grad":
        args["q"] = q.clone().requires_grad_()
        return args, dict(k_out=torch.empty_like(k)), RuntimeError, "q_out= / k_out= have no autograd formula, and argument 'q' requires grad"
    if case == "sin requires grad":
        args["sin"] = args["sin"].clone().requires_grad_()
        return args, dict(q_out=torch.empty_like(q)), RuntimeError, "q_out= / k_out= have no autograd formula, and argument 'sin' requires grad"
    if case == "inference tensor":
        with torch.inference_mode():
            buf = torch.empty(2, 2, 3, 64, dtype=q.dtype)
        return args, dict(k_out=buf), RuntimeError, "argument 'k_out' expected a tensor writable outside torch.inference_mode(), got an inference tensor"
    if case == "over sin":
        buf = torch.randn(2, 2, 3, 64, dtype=q.dtype, device=q.device)
        args["sin"] = buf[0]
        return args, dict(k_out=buf), ValueError, "argument 'k_out' expected memory apart from 'sin', got a tensor sharing elements with 'sin'"
    raise AssertionError(case)


BAD = ["q_out is q", "k_out inside q", "q_out over cos", "q_out and k_out overlap", "over sin", "shape", "dtype",
       "device", "last stride", "broadcast", "not a tensor", "with inplace", "requires grad", "input requires grad",
       "sin requires grad", "inference tensor"]


@pytest.mark.parametrize("case", BAD)
def test_bad_buffers_are_refused_before_anything_is_written(case):
    args, bufs, exc, msg = _bad(case)
    if DEVICE.type != "cpu" and case in ("shape", "dtype", "last stride", "broadcast", "requires grad",
                                         "inference tensor"):
        bufs = {n: t.to(DEVICE) if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t
                for n, t in bufs.items()}
    before = {n: t.clone() for n, t in bufs.items() if isinstance(t, torch.Tensor) and t.device.type != "meta"}
    with pytest.raises(exc, match="^qwen3_tts_rope: " + re.escape(msg)):
        fusedrope.qwen3_tts_rope(**args, **bufs, backend="reference")
    for n, t in before.items():
        assert torch.equal(bufs[n], t) or (t.isnan().any() and torch.equal(bufs[n].isnan(), t.isnan()))


def test_inputs_that_require_grad_under_no_grad():
    """Refused in grad mode (see BAD), as torch's out= arguments are; under torch.no_grad() plain bytes."""
    q, k, cos, sin = _inputs()
    leaf = q.clone().requires_grad_()
    _, k_view = _cache(k)
    with torch.no_grad():
        q_out, k_out = fusedrope.qwen3_tts_rope(leaf, k, cos, sin, k_out=k_view, backend="reference")
    assert k_out is k_view and not k_out.requires_grad and not q_out.requires_grad
    assert_tts_rope_close(q_out, k_out, q, k, cos, sin)


def test_explain_takes_the_buffers_and_raises_what_the_call_would():
    q, k, cos, sin = _inputs()
    ex = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin, k_out=torch.empty_like(k), backend="reference")
    assert ex.chosen == "reference"
    with pytest.raises(ValueError, match="^qwen3_tts_rope: argument 'k_out' expected shape"):
        fusedrope.explain("qwen3_tts_rope", q, k, cos, sin, k_out=torch.empty_like(q))
    with pytest.raises(ValueError, match="^qwen3_tts_rope: argument 'k_out' expected None with inplace=True"):
        fusedrope.explain("qwen3_tts_rope", q, k, cos, sin, inplace=True, k_out=torch.empty_like(k))
    with pytest.raises(RuntimeError, match="^qwen3_tts_rope: q_out= / k_out= have no autograd formula, and argument 'k'"):
        fusedrope.explain("qwen3_tts_rope", q, k.clone().requires_grad_(), cos, sin, q_out=torch.empty_like(q))


def test_torch_op_and_its_fake_check_the_buffers():
    q, k, cos, sin = _inputs()
    torch.library.opcheck(torch.ops.fusedrope.qwen3_tts_rope_out.default,
                          (q, k, cos, sin, torch.empty_like(q), _cache(k)[1], "reference"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fk, fc, fs = (mode.from_tensor(t) for t in (q, k, cos, sin))
        with pytest.raises(ValueError, match="argument 'k_out' expected shape"):
            torch.ops.fusedrope.qwen3_tts_rope_out(fq, fk, fc, fs, torch.empty_like(fq), torch.empty_like(fq))


@pytest.mark.parametrize("which", ["q_out", "k_out", "both", "k_cache_slice"])
def test_torch_compile_into_buffers(which):
    """Buffers handed to the compiled function, or (k_cache_slice) a slice of a cache taken inside it: written
    as eager writes them, nothing around the slice."""
    q, k, cos, sin = _inputs()
    names = {"q_out": ["q_out"], "k_out": ["k_out"], "both": ["q_out", "k_out"], "k_cache_slice": ["k_out"]}[which]

    def step(q, k, cos, sin, q_buf, k_buf):
        bufs = {"q_out": q_buf, "k_out": k_buf[:, :, POS:POS + q.shape[2]] if which == "k_cache_slice" else k_buf}
        q_out, k_out = fusedrope.qwen3_tts_rope(q * 2, k, cos, sin, **{n: bufs[n] for n in names})
        return q_out + 1, k_out.sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    k_buf = (lambda: _cache(k)[0]) if which == "k_cache_slice" else (lambda: torch.empty_like(k))
    eager_bufs, compiled_bufs = (torch.empty_like(q), k_buf()), (torch.empty_like(q), k_buf())
    want = step(q, k, cos, sin, *eager_bufs)
    got = compiled(q, k, cos, sin, *compiled_bufs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    for name, e, c in zip(("q_out", "k_out"), eager_bufs, compiled_bufs):
        if name in names and which != "k_cache_slice":
            assert torch.equal(e, c)
    if which == "k_cache_slice":
        assert torch.equal(compiled_bufs[1].nan_to_num(7.0), eager_bufs[1].nan_to_num(7.0))
        assert not compiled_bufs[1][:, :, POS:POS + q.shape[2]].isnan().any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_and_into_buffers_inside_inference_mode(backend):
    """How an engine calls: inputs and buffers made inside torch.inference_mode() are written there (only
    outside it does torch refuse writes into inference tensors)."""
    with torch.inference_mode():
        q, k, cos, sin = _inputs(seed=37)
        q0, k0 = q.clone(), k.clone()
        k_cache, k_view = _cache(k)
        q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, k_out=k_view, backend=backend)
        assert k_out is k_view and _untouched_outside(k_cache, k_view)
        assert_tts_rope_close(q_out, k_out, q0, k0, cos, sin)
        fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend=backend)
        assert_tts_rope_close(q, k, q0, k0, cos, sin)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stride_0_on_a_size_1_dim_is_not_a_broadcast(backend):
    """A size-1 dim addresses one element whatever its stride (0 too, as as_strided or a custom allocator may
    leave it): such a q written in place, or such a k_out, is no broadcast and is accepted."""
    q, k, cos, sin = make_tts_inputs(TtsCase("b1", 1, 3, 4, 2, 64), device=DEVICE, seed=41, random_cos_sin=True)
    q0, k0 = q.clone(), k.clone()
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    k_out = k_out.as_strided(k_out.shape, (0, *k_out.stride()[1:]))
    q_out, got = fusedrope.qwen3_tts_rope(q, k, cos, sin, k_out=k_out, backend=backend)
    assert got is k_out
    assert_tts_rope_close(q_out, k_out, q0, k0, cos, sin)
    q_in = q.clone(memory_format=torch.contiguous_format)
    q_in = q_in.as_strided(q_in.shape, (0, *q_in.stride()[1:]))
    k_in = k.clone()
    fusedrope.qwen3_tts_rope(q_in, k_in, cos, sin, inplace=True, backend=backend)
    assert_tts_rope_close(q_in, k_in, q0, k0, cos, sin)
