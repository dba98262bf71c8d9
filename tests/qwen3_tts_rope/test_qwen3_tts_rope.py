"""qwen3_tts_rope: every backend against the float64 oracle (the contract, docs/qwen3_tts_rope.md: within 1 ulp
for bf16/fp16)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusedrope
from fusedrope.reference import qwen3_tts_rope_oracle, rotate_half
from fusedrope.testing import (TTS_CASES, TtsCase, assert_tts_rope_close, assert_ulp_close, bytes_written_outside,
                               guarded_poison, make_tts_inputs, round_once)
from fusedrope.qwen3_tts_rope import REGISTRY, validate

from conftest import DEVICE, backends_here

BACKENDS = backends_here("qwen3_tts_rope")
# The Triton interpreter costs ~5 ms per program (one program per token): keep its cases small.
SMALL_CASES = [c for c in TTS_CASES if c.batch == 1] + [TTS_CASES[1]]


def run_backend(backend, q, k, cos, sin):
    """Call the backend itself on poisoned outputs inside poisoned guard elements, so an element it does not
    write fails the check, and one it writes out of bounds fails here."""
    facts = REGISTRY.facts(*validate(q, k, cos, sin))
    impl = REGISTRY.backend(backend)
    reason = REGISTRY.decide(impl, facts)
    if reason:  # e.g. the cuda kernel serves bf16/fp16 with D in (64, 128, 256) only
        pytest.skip(f"{backend} does not serve these inputs: {reason}")
    (q_out, q_buf), (k_out, k_buf) = (guarded_poison(t.shape, t.dtype, t.device) for t in (q, k))
    impl.loaded().run(q, k, cos, sin, q_out, k_out)
    for name, buf, out in (("q_out", q_buf, q_out), ("k_out", k_buf, k_out)):
        assert bytes_written_outside(buf, out) == 0, f"{backend} wrote {name} out of bounds"
    return q_out, k_out


# bf16/fp16: within 1 ulp and correctly rounded except rare ties; fp32: within two roundings (the contract)
check = assert_tts_rope_close


def test_oracle_is_the_spec_formula_element_by_element():
    """The oracle shares rotate_half with the reference backend; check it against the contract's per-element
    formula (docs/qwen3_tts_rope.md), written out independently, with cos and sin halves that differ."""
    q, k, cos, sin = make_tts_inputs(TtsCase("spec", 2, 3, 3, 2, 16), seed=12, random_cos_sin=True)
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    c, s = cos.double()[:, None], sin.double()[:, None]  # [B, 1, S, D]
    for x, got in ((q.double(), q_ref), (k.double(), k_ref)):
        h = x.shape[-1] // 2
        want = torch.empty_like(x)
        for i in range(h):
            want[..., i] = x[..., i] * c[..., i] - x[..., i + h] * s[..., i]
            want[..., i + h] = x[..., i + h] * c[..., i + h] + x[..., i] * s[..., i + h]
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_subnormal_inputs(backend, dtype):
    """Subnormal q (and sin for k) within 1 ulp like any other value: a kernel (or Triton's interpreter, whose
    bf16 -> fp32 flushes or mangles them) that flushes subnormals to zero fails here."""
    q, k, cos, sin = make_tts_inputs(TtsCase("sub", 1, 4, 2, 1, 64), dtype=dtype, device=DEVICE, seed=21,
                                     random_cos_sin=True, subnormal=True)
    tiny = torch.finfo(dtype).tiny  # the smallest normal
    assert ((q.abs() < tiny) & (q != 0)).float().mean() > 0.5 and ((sin.abs() < tiny) & (sin != 0)).any()
    q_out, k_out = run_backend(backend, q, k, cos, sin)
    check(q_out, k_out, q, k, cos, sin)
    assert (q_out != 0).any() and (q_out.abs() < tiny).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_quarter_turn_and_identity_are_exact(backend):
    """cos=0, sin=1 moves the halves: out[:h] = -x[h:], out[h:] = x[:h]; cos=1, sin=0 is the identity. Both
    exact on every backend (a swapped half or sign fails here whatever the tolerance)."""
    q, k, cos, _ = make_tts_inputs(TtsCase("qt", 2, 3, 4, 2), device=DEVICE, seed=13)
    zero, one = torch.zeros_like(cos), torch.ones_like(cos)
    q_out, k_out = run_backend(backend, q, k, zero, one)
    for x, out in ((q, q_out), (k, k_out)):
        h = x.shape[-1] // 2
        assert torch.equal(out[..., :h], -x[..., h:]) and torch.equal(out[..., h:], x[..., :h])
    q_out, k_out = run_backend(backend, q, k, one, zero)
    assert torch.equal(q_out, q) and torch.equal(k_out, k)


@pytest.mark.parametrize("case", TTS_CASES, ids=lambda c: c.id)
def test_reference_matches_oracle_on_seed_matrix(case):
    q, k, cos, sin = make_tts_inputs(case, device=DEVICE)
    check(*fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference"), q, k, cos, sin)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", SMALL_CASES, ids=lambda c: c.id)
def test_backend_matches_oracle(backend, case):
    q, k, cos, sin = make_tts_inputs(case, device=DEVICE, seed=case.seed)
    check(*run_backend(backend, q, k, cos, sin), q, k, cos, sin)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hq,hkv", [(3, 40), (40, 3), (17, 33)])
@pytest.mark.parametrize("inplace", [False, True])
def test_head_counts_over_several_tiles_either_side_larger(backend, hq, hkv, inplace):
    """More heads than one tile (Triton: 32 per tile at D=128, Q's and K's tiles in the same loop), with Hkv
    larger than Hq as well as smaller: one side's mask runs out while the other's is still live."""
    q, k, cos, sin = make_tts_inputs(TtsCase("tiles", 2, 3, hq, hkv, 128), device=DEVICE, seed=hq * hkv,
                                     random_cos_sin=True)
    want = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")
    if inplace:
        got = (q.clone(), k.clone())
        fusedrope.qwen3_tts_rope(*got, cos, sin, inplace=True, backend=backend)
    else:
        got = run_backend(backend, q, k, cos, sin)
    check(*got, q, k, cos, sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["projection", "contiguous"])
def test_dtypes_layouts_and_independent_halves(backend, dtype, layout):
    case = TtsCase("odd", 2, 5, 6, 3, 128)
    q, k, cos, sin = make_tts_inputs(case, dtype, DEVICE, seed=3, layout=layout, random_cos_sin=True)
    check(*run_backend(backend, q, k, cos, sin), q, k, cos, sin)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim", [2, 64, 96, 256])
def test_other_head_dims(backend, head_dim):
    q, k, cos, sin = make_tts_inputs(TtsCase("hd", 1, 3, 4, 2, head_dim), device=DEVICE, seed=4,
                                     random_cos_sin=True)
    check(*run_backend(backend, q, k, cos, sin), q, k, cos, sin)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cos_sin_broadcast_over_batch(backend):
    q, k, cos, sin = make_tts_inputs(TtsCase("bc", 3, 4, 4, 2), device=DEVICE, cos_batch=1, seed=5)
    check(*run_backend(backend, q, k, cos, sin), q, k, cos, sin)
    # The same as the batch-expanded cos/sin.
    q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)
    q_exp, k_exp = fusedrope.qwen3_tts_rope(q, k, cos.expand(3, -1, -1), sin.expand(3, -1, -1), backend=backend)
    assert torch.equal(q_out, q_exp) and torch.equal(k_out, k_exp)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_views_everywhere(backend):
    g = torch.Generator().manual_seed(6)
    # q: [2, 4, 4, 128] from a padded [B, S', H', D'] buffer, every leading stride unusual.
    q = torch.randn(2, 9, 5, 160, generator=g).to(torch.bfloat16)[:, 1:8:2, :4, 16:144].transpose(1, 2)
    # k: [2, 3, 4, 128] starting at an odd element offset, so no vector path can assume alignment.
    k = torch.randn(4, 4, 3, 131, generator=g).to(torch.bfloat16)[::2, :, :, 3:131].transpose(1, 2)
    cs = torch.randn(2, 4, 2, 136, generator=g).to(torch.bfloat16)
    cos, sin = cs[:, :, 0, 4:132], cs[:, :, 1, 7:135]
    q, k, cos, sin = (t.to(DEVICE) for t in (q, k, cos, sin))
    assert not q.is_contiguous() and not k.is_contiguous() and not cos.is_contiguous()
    check(*run_backend(backend, q, k, cos, sin), q, k, cos, sin)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_writes_through_strides(backend):
    q, k, cos, sin = make_tts_inputs(TtsCase("ip", 2, 3, 4, 2), device=DEVICE, seed=7)
    proj = q._base
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    before = proj.clone()
    q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend=backend)
    assert q_out is q and k_out is k
    assert_ulp_close(q, q_ref, 1, "q")
    assert_ulp_close(k, k_ref, 1, "k")
    assert q._base is proj and not torch.equal(proj, before)  # written through the view into the projection


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(0, 4, 3, 128), (2, 4, 0, 128), (2, 0, 3, 128)])
def test_empty(backend, shape):
    B, H, S, D = shape  # bf16, D=128: inputs every backend serves, so only emptiness is tested
    q = torch.randn(B, H, S, D, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(B, 2, S, D, device=DEVICE, dtype=torch.bfloat16)
    cos = sin = torch.randn(max(B, 1), S, D, device=DEVICE, dtype=torch.bfloat16)
    q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    check(q_out, k_out, q, k, cos, sin)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(0, 4, 3, 128), (2, 4, 0, 128), (2, 0, 3, 128)])
def test_empty_launches_nothing(backend, shape, monkeypatch):
    """The contract (docs/qwen3_tts_rope.md): empty tensors return empty results without a launch (q and k both
    empty here)."""
    B, H, S, D = shape
    q = torch.randn(B, H, S, D, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(B, H // 2, S, D, device=DEVICE, dtype=torch.bfloat16)
    cos = sin = torch.randn(max(B, 1), S, D, device=DEVICE, dtype=torch.bfloat16)

    def launch(*args):
        raise AssertionError(f"{backend} launched on empty inputs")

    monkeypatch.setattr(REGISTRY, "_select", {})  # a choice of a patched backend must not outlive the test
    for b in REGISTRY.backends:
        monkeypatch.setattr(b, "run", launch)
        monkeypatch.setattr(b, "run_alloc", launch if b.run_alloc or b.name == "cuda" else None)
    for inplace in (False, True):
        q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=inplace, backend=backend)
        assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == q.dtype


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_on_padded_views_leaves_the_padding(backend):
    """In place through views into padded buffers: the views get the rotation, every other element of the
    buffers keeps its value."""
    g = torch.Generator().manual_seed(14)
    qb = torch.randn(2, 9, 5, 160, generator=g).to(torch.bfloat16).to(DEVICE)
    kb = torch.randn(4, 4, 3, 131, generator=g).to(torch.bfloat16).to(DEVICE)
    q, k = qb[:, 1:8:2, :4, 16:144].transpose(1, 2), kb[::2, :, :, 3:131].transpose(1, 2)
    cos, sin = make_tts_inputs(TtsCase("pad", 2, 4, 1, 1), device=DEVICE, seed=14, random_cos_sin=True)[2:]
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    q_keep, k_keep = qb.clone(), kb.clone()
    fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend=backend)
    assert_ulp_close(q, q_ref, 1, "q")
    assert_ulp_close(k, k_ref, 1, "k")
    for buf, keep, view in ((qb, q_keep, q), (kb, k_keep, k)):
        outside = torch.ones_like(buf, dtype=torch.bool)
        outside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(False)
        assert torch.equal(buf[outside], keep[outside]), "an element outside the view was written"


@pytest.mark.parametrize("backend", BACKENDS)
def test_public_outputs_are_new_and_contiguous(backend):
    q, k, cos, sin = make_tts_inputs(TtsCase("new", 2, 3, 4, 2), device=DEVICE, seed=8)
    q0, k0 = q.clone(), k.clone()
    q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    assert q_out.data_ptr() != q.data_ptr() and torch.equal(q, q0) and torch.equal(k, k0)
    check(q_out, k_out, q, k, cos, sin)


def test_torch_op_matches_function():
    """The one torch op writes into the outputs it is given: new buffers, or q and k themselves (in place)."""
    q, k, cos, sin = make_tts_inputs(TtsCase("op", 2, 3, 4, 2), device=DEVICE, seed=9)
    q_fn, k_fn = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")
    q_op, k_op = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    torch.ops.fusedrope.qwen3_tts_rope_out(q, k, cos, sin, q_op, k_op, "reference")
    assert torch.equal(q_op, q_fn) and torch.equal(k_op, k_fn)
    q_in, k_in = q.clone(), k.clone()
    torch.ops.fusedrope.qwen3_tts_rope_out(q_in, k_in, cos, sin, q_in, k_in, "reference")
    assert torch.equal(q_in, q_fn) and torch.equal(k_in, k_fn)
    op = torch.ops.fusedrope.qwen3_tts_rope_out.default
    torch.library.opcheck(op, (q, k, cos, sin, torch.empty_like(q), torch.empty_like(k), "reference"))
    q_in, k_in = q.clone(), k.clone()
    torch.library.opcheck(op, (q_in, k_in, cos, sin, q_in, k_in, "reference"))


@pytest.mark.parametrize("inplace", [False, True])
def test_torch_compile_fullgraph_matches_eager(inplace):
    q, k, cos, sin = make_tts_inputs(TtsCase("tc", 2, 3, 4, 2), device=DEVICE, seed=10)

    def attention_prologue(q, k, cos, sin):
        q, k = fusedrope.qwen3_tts_rope(q * 2, k, cos, sin, inplace=inplace)
        return q + 1, k * 3  # elementwise consumers: a reduction may sum in another order when compiled (GPU)

    torch._dynamo.reset()
    compiled = torch.compile(attention_prologue, fullgraph=True)
    eager = attention_prologue(q.clone(), k.clone(), cos, sin)
    got = compiled(q.clone(), k.clone(), cos, sin)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    B=st.integers(1, 3), S=st.integers(1, 4), HQ=st.integers(1, 5), HKV=st.integers(1, 3),
    half=st.sampled_from([1, 3, 8, 64]), pad=st.integers(0, 3), perm=st.booleans(), bcast=st.booleans(),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), seed=st.integers(0, 2**16),
)
def test_property_random_shapes_and_strides(B, S, HQ, HKV, half, pad, perm, bcast, dtype, seed):
    D = 2 * half
    g = torch.Generator().manual_seed(seed)

    def make(shape):  # a view into a padded buffer, optionally with permuted leading dims
        if perm:
            b = torch.randn(shape[0], shape[2], shape[1] + pad, D + pad, generator=g).to(dtype)
            return b[:, :, :shape[1], pad:pad + D].transpose(1, 2)
        b = torch.randn(shape[0], shape[1] + pad, shape[2], D + pad, generator=g).to(dtype)
        return b[:, pad:, :, :D]

    q, k = make((B, HQ, S)), make((B, HKV, S))
    nb = 1 if bcast else B
    cos = (torch.rand(nb, S, D + pad, generator=g) * 2 - 1).to(dtype)[..., pad:]
    sin = (torch.rand(nb, S, D + pad, generator=g) * 2 - 1).to(dtype)[..., :D]
    q, k, cos, sin = (t.to(DEVICE) for t in (q, k, cos, sin))
    for backend in ("triton", "reference"):
        if REGISTRY.availability(REGISTRY.backend(backend), DEVICE) is None:
            check(*run_backend(backend, q, k, cos, sin), q, k, cos, sin)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_bumps_versions_so_autograd_sees_the_write(backend):
    q, k, cos, sin = make_tts_inputs(TTS_CASES[0], device=DEVICE)
    before = q._version, k._version
    fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend=backend)
    assert q._version > before[0] and k._version > before[1]
    # q saved for a backward, then rotated in place under no_grad: autograd refuses, as for torch's own ops
    w = torch.ones((), device=DEVICE, requires_grad=True)
    y = (q * w).sum()  # saves q for w's gradient
    with torch.no_grad():
        fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend=backend)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_inplace_with_grad_under_torch_compile_raises():
    """Compiled, an in-place call on inputs that require grad would drop the rotation from the backward pass:
    it raises, as in eager mode."""
    q, k, cos, sin = make_tts_inputs(TTS_CASES[0], device=DEVICE)

    def f(q, k, cos, sin):
        q2 = q * 1
        fusedrope.qwen3_tts_rope(q2, k, cos, sin, inplace=True, backend="reference")
        return q2 * 2

    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    with pytest.raises(RuntimeError, match="inplace=True has no autograd formula, and argument 'q' requires"):
        g(q.clone().requires_grad_(), k, cos, sin)
    with pytest.raises(RuntimeError, match="inplace=True has no autograd formula, and argument 'cos' requires"):
        g(q.clone(), k, cos.clone().requires_grad_(), sin)
    with torch.no_grad():
        assert torch.equal(g(q.clone().requires_grad_(), k, cos, sin), f(q, k, cos, sin))


@pytest.mark.parametrize("name", ["q", "sin", "k_out"])
def test_buffers_with_grad_under_torch_compile_raise(name):
    """Compiled, buffers with an input or buffer that requires grad are refused naming it, as in eager mode;
    under no_grad the compiled call writes what eager writes."""
    q, k, cos, sin = make_tts_inputs(TTS_CASES[0], device=DEVICE)
    args = dict(q=q, k=k, cos=cos, sin=sin, q_out=torch.empty_like(q), k_out=torch.empty_like(k))

    def f(q, k, cos, sin, q_out, k_out):
        return fusedrope.qwen3_tts_rope(q * 1, k, cos, sin, q_out=q_out, k_out=k_out, backend="reference")

    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    bad = dict(args, **{name: args[name].clone().requires_grad_()})
    with pytest.raises(RuntimeError, match=f"q_out= / k_out= have no autograd formula, and argument '{name}'"):
        g(**bad)
    want = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")
    with torch.no_grad():
        q_out, k_out = g(**bad)
    assert torch.equal(q_out, want[0]) and torch.equal(k_out, want[1])


@pytest.mark.parametrize("name", ["k", "cos", "sin"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_refuses_any_input_that_requires_grad(backend, name):
    """cos/sin that require grad (a learned or scaled rope table) are refused in place as q and k are, before
    anything is written, on every backend; under no_grad the rotation is written."""
    args = dict(zip(("q", "k", "cos", "sin"), make_tts_inputs(TTS_CASES[0], device=DEVICE)))
    want = fusedrope.qwen3_tts_rope(*args.values(), backend="reference")
    args[name] = args[name].clone().requires_grad_()
    q, k = args["q"].clone(), args["k"].clone()
    before = (q.clone(), k.clone())
    with pytest.raises(RuntimeError, match=f"inplace=True has no autograd formula, and argument '{name}' requires"):
        fusedrope.qwen3_tts_rope(q, k, args["cos"], args["sin"], inplace=True, backend=backend)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    with torch.no_grad():
        fusedrope.qwen3_tts_rope(q, k, args["cos"], args["sin"], inplace=True, backend=backend)
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_that_require_grad_give_outputs_that_refuse_backward(backend):
    """No backend has a derivative: every one raises on backward instead of cutting the graph silently."""
    q, k, cos, sin = make_tts_inputs(TTS_CASES[0], device=DEVICE)
    want = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")
    q_out, k_out = fusedrope.qwen3_tts_rope(q.clone().requires_grad_(), k, cos, sin, backend=backend)
    assert torch.equal(q_out.detach(), want[0]) and torch.equal(k_out.detach(), want[1])
    assert q_out.requires_grad
    with pytest.raises(RuntimeError, match="no autograd formula"):
        q_out.float().sum().backward()


def test_traced_call_of_inputs_that_require_grad_is_refused():
    """Dynamo cannot trace the eager outputs' raising backward: a traced call refuses instead, naming the input."""
    q, k, cos, sin = make_tts_inputs(TTS_CASES[0], device=DEVICE)
    torch._dynamo.reset()
    step = torch.compile(lambda q: fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference"), fullgraph=True)
    with pytest.raises(RuntimeError, match="torch.compile of this op has no autograd formula, and argument 'q'"):
        step(q.clone().requires_grad_())
    w = torch.nn.Parameter(torch.ones(q.shape[3], dtype=q.dtype, device=DEVICE))  # the model's q_norm.weight
    norm = torch.compile(lambda q: fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w.detach(), cos, sin, backend="reference"),
                         fullgraph=True)
    with pytest.raises(RuntimeError, match="no autograd formula, and argument 'q_norm_weight' requires grad"):
        norm(q)


def test_oracle_is_exact_where_fp32_is_not():
    """qwen3_tts_rope_oracle is the exact value (float64), not an fp32 computation widened: (1) a bf16 row whose
    exact result lies just above a bf16 tie, which an fp32 sum rounds onto the tie (then to even, the wrong
    way); (2) fp32 inputs, whose products are inexact in fp32."""
    x, c, z, s = -0.39453125, -0.55078125, 3.600120544433594e-05, 0.423828125  # all exact in bf16
    bf = torch.bfloat16
    q = torch.tensor([x, z], dtype=bf).view(1, 1, 1, 2)
    cos = torch.tensor([c, 1.0], dtype=bf).view(1, 1, 2)
    sin = torch.tensor([s, 0.0], dtype=bf).view(1, 1, 2)
    q_ref, _ = qwen3_tts_rope_oracle(q, q, cos, sin)
    exact = x * c - z * s  # exact in float64: two 16-bit products, 30 bits apart
    assert q_ref[0, 0, 0, 0].item() == exact
    assert float(torch.tensor(exact, dtype=torch.float32)) == 0.21728515625  # fp32 lands on the bf16 tie
    assert round_once(q_ref, bf)[0, 0, 0, 0].item() == 0.2177734375  # the correctly rounded value
    # fp32 inputs: the oracle is the float64 formula, element by element
    q, k, cos, sin = make_tts_inputs(TtsCase("f32", 2, 3, 3, 2, 16), torch.float32, seed=12, random_cos_sin=True)
    q_ref, k_ref = qwen3_tts_rope_oracle(q, k, cos, sin)
    c64, s64 = cos.double()[:, None], sin.double()[:, None]
    for x64, got in ((q.double(), q_ref), (k.double(), k_ref)):
        assert got.dtype == torch.float64 and torch.equal(got, x64 * c64 + rotate_half(x64) * s64)
