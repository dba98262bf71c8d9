"""fusedrope.integrations.hf against transformers' own Qwen3 code: its apply_rotary_pos_emb and RMSNorm, and a
small randomly initialised Qwen3 attention block with and without patch_qk_norm_rope."""

import pytest
import torch

import fusedrope
from fusedrope.integrations import hf
from fusedrope.qwen3_tts_rope import REGISTRY, Facts

from conftest import DEVICE, backends_here

transformers = pytest.importorskip("transformers", reason="transformers is in the test extras: pip install '.[test]'")
from transformers import Qwen3Config  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3 as qwen3  # noqa: E402

BACKENDS = backends_here("qwen3_tts_rope")


def _skip_unless_served(backend, dtype, norm=False):
    facts = Facts(DEVICE, dtype, 128, False, eager=True, norm=norm)
    if reason := REGISTRY.decide(REGISTRY.backend(backend), facts):
        pytest.skip(reason)


def _randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_apply_rotary_pos_emb_is_transformers_bit_for_bit(backend, dtype, unsqueeze_dim):
    _skip_unless_served(backend, dtype)
    B, S, HQ, HKV, D = 2, 7, 8, 2, 128
    proj = _randn(B, S, HQ + HKV, D, dtype=dtype, seed=1)
    q, k = proj[:, :, :HQ], proj[:, :, HQ:]  # [B, S, H, D] views of one projection
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = _randn(B, S, D, dtype=dtype, seed=2), _randn(B, S, D, dtype=dtype, seed=3)
    want = qwen3.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    got = hf.apply_rotary_pos_emb(q, k, cos, sin, None, unsqueeze_dim, backend=backend)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    if unsqueeze_dim == 2:  # heads second: contiguous, as the modeling code reshapes it
        assert all(g.is_contiguous() for g in got) and got[0].view(B, S, -1).shape == (B, S, HQ * D)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_qk_norm_rope_against_transformers_rmsnorm_and_rope(backend, dtype):
    _skip_unless_served(backend, dtype, norm=True)
    B, S, HQ, HKV, D = 2, 9, 16, 8, 128
    q_norm, k_norm = qwen3.Qwen3RMSNorm(D, eps=1e-6), qwen3.Qwen3RMSNorm(D, eps=1e-6)
    with torch.no_grad():
        q_norm.weight.copy_(1 + 0.2 * _randn(D, dtype=torch.float32, seed=7))
        k_norm.weight.copy_(1 + 0.2 * _randn(D, dtype=torch.float32, seed=8))
    q_norm, k_norm = q_norm.to(DEVICE, dtype), k_norm.to(DEVICE, dtype)
    proj = _randn(B, S, HQ + HKV, D, dtype=dtype, seed=9)
    cos, sin = _randn(B, S, D, dtype=dtype, seed=10), _randn(B, S, D, dtype=dtype, seed=11)
    assert_fused_norm_rope_is_the_models(qwen3.apply_rotary_pos_emb, q_norm, k_norm, proj, HQ, cos, sin, backend)


def assert_fused_norm_rope_is_the_models(apply_rotary_pos_emb, q_norm, k_norm, proj, hq, cos, sin, backend):
    """qwen3_tts_qk_norm_rope on the ``[B, S, Hq + Hkv, D]`` projection against the model's own ``q_norm``,
    ``k_norm`` and ``apply_rotary_pos_emb``: at least 99.9% of elements identical (the reference backend, which
    is the model's code: all)."""
    with torch.no_grad():
        want = apply_rotary_pos_emb(q_norm(proj[:, :, :hq]).transpose(1, 2), k_norm(proj[:, :, hq:]).transpose(1, 2),
                                    cos, sin)
        got = fusedrope.qwen3_tts_qk_norm_rope(proj[:, :, :hq].transpose(1, 2), proj[:, :, hq:].transpose(1, 2),
                                               q_norm.weight, k_norm.weight, cos, sin, q_norm.variance_epsilon,
                                               backend=backend)
    same = sum(int((g == w).sum()) for g, w in zip(got, want)) / sum(w.numel() for w in want)
    assert same >= (1.0 if backend == "reference" else 0.999), f"{same:.5%} identical"


def _attention_block(dtype):
    config = Qwen3Config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         rms_norm_eps=1e-6, attn_implementation="eager")
    torch.manual_seed(12)
    attn = qwen3.Qwen3Attention(config, layer_idx=0)
    with torch.no_grad():  # norms that are not the identity, so skipping one would show
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.copy_(1 + 0.3 * torch.randn(64))
    rotary = qwen3.Qwen3RotaryEmbedding(config)
    return attn.to(DEVICE, dtype).eval(), rotary.to(DEVICE)


def _forward(attn, rotary, hidden):
    position_ids = torch.arange(hidden.shape[1], device=DEVICE)[None].expand(hidden.shape[0], -1)
    cos, sin = rotary(hidden, position_ids)
    return attn(hidden, (cos, sin), None)[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_patched_attention_block_gives_the_models_output(backend):
    dtype = torch.bfloat16
    attn, rotary = _attention_block(dtype)
    hidden = _randn(2, 11, 256, dtype=dtype, seed=13)
    calls = []
    real = fusedrope.qwen3_tts_rope.__globals__["_into_new_outputs"]
    models_rope = qwen3.apply_rotary_pos_emb
    with torch.no_grad():
        want = _forward(attn, rotary, hidden)
        with hf.patch_qk_norm_rope(attn, backend=backend) as patch:
            assert patch.blocks == [attn]
            fused = fusedrope.qwen3_tts_rope.__globals__
            fused["_into_new_outputs"] = lambda *a, **kw: calls.append(1) or real(*a, **kw)
            try:
                got = _forward(attn, rotary, hidden)
            finally:
                fused["_into_new_outputs"] = real
        again = _forward(attn, rotary, hidden)
    assert calls == [1]  # one fused call did the norms and the RoPE
    assert torch.equal(again, want)  # removed: the model's own code again
    if backend == "reference":
        assert torch.equal(got, want)
    else:  # a norm's variance summed in another order may move an element by one rounding step
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=2 ** -7)
    assert "forward" not in attn.__dict__ and "forward" not in attn.q_norm.__dict__
    assert qwen3.apply_rotary_pos_emb is models_rope


def test_patch_runs_the_models_code_where_fusedrope_cannot():
    """Autograd on: the block's own norms and RoPE run, and gradients flow."""
    attn, rotary = _attention_block(torch.float32)
    hidden = _randn(1, 5, 256, dtype=torch.float32, seed=14)
    want = _forward(attn, rotary, hidden)
    with hf.patch_qk_norm_rope(attn):
        got = _forward(attn, rotary, hidden)
        got.sum().backward()
    assert torch.equal(got, want) and attn.q_norm.weight.grad is not None


def test_a_forward_that_skips_the_rope_raises_instead_of_dropping_the_norm():
    class NormOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_norm, self.k_norm = qwen3.Qwen3RMSNorm(8), qwen3.Qwen3RMSNorm(8)

        def forward(self, x, rotate=False):  # calls apply_rotary_pos_emb, but not on this path
            x = self.q_norm(x)
            return qwen3.apply_rotary_pos_emb(x, x, *self.cos_sin) if rotate else x

    NormOnly.forward.__module__ = qwen3.__name__  # as if written in that modeling file (apply_rotary_pos_emb's)
    block = NormOnly()
    with hf.patch_qk_norm_rope(block):
        with pytest.raises(RuntimeError, match="without calling apply_rotary_pos_emb"):
            block(torch.randn(2, 8))


@pytest.mark.parametrize("case", ["float64", "cos over S broadcast", "k last dim strided", "cos batch > q batch",
                                  "positional unsqueeze_dim 2", "fp32 cos, bf16 q", "q requires grad"])
def test_apply_rotary_pos_emb_gives_transformers_result_in_every_call_it_does_not_fuse(case):
    B, S, H, D = 1, 6, 3, 8
    dtype = torch.float64 if case == "float64" else torch.bfloat16
    q, k = _randn(B, H, S, D, dtype=dtype, seed=15), _randn(B, H, S, D, dtype=dtype, seed=16)
    cos, sin = _randn(B, S, D, dtype=dtype, seed=17), _randn(B, S, D, dtype=dtype, seed=18)
    args, kwargs = (), {}
    if case == "cos over S broadcast":
        cos, sin = cos[:, :1], sin[:, :1]
    elif case == "k last dim strided":
        k = _randn(B, H, S, 2 * D, dtype=dtype, seed=19)[..., ::2]
    elif case == "cos batch > q batch":
        cos, sin = cos.expand(2, S, D), sin.expand(2, S, D)
    elif case == "positional unsqueeze_dim 2":  # transformers 5's signature: (q, k, cos, sin, unsqueeze_dim)
        q, k, args = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), (2,)
    elif case == "fp32 cos, bf16 q":  # mixed dtypes promote to fp32 in PyTorch
        cos, sin = (_randn(B, S, D, dtype=torch.float32, seed=s) for s in (17, 18))
    elif case == "q requires grad":
        q.requires_grad_()
    want = qwen3.apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs)
    got = hf.apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs)
    assert all(g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want))
    if q.requires_grad:  # autograd: the formula, which has a backward
        got[0].float().sum().backward()
        assert q.grad is not None


def test_patch_refuses_models_without_such_blocks_other_norms_and_double_patches():
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention  # its norm is x * (1 + w)

    with pytest.raises(ValueError, match="argument 'model' expected a module with attention blocks"):
        hf.patch_qk_norm_rope(torch.nn.Linear(2, 2))
    config = Gemma3TextConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    with pytest.raises(ValueError, match="q_norm and k_norm are Qwen3RMSNorm or Qwen3TTSRMSNorm"):
        hf.patch_qk_norm_rope(Gemma3Attention(config, layer_idx=0))
    attn, _ = _attention_block(torch.float32)
    with hf.patch_qk_norm_rope(attn):
        with pytest.raises(ValueError, match="expected blocks not patched yet"):
            hf.patch_qk_norm_rope(attn)


def test_patched_blocks_serve_several_threads_subclasses_copies_and_compile():
    import copy
    import threading

    class Logged(qwen3.Qwen3Attention):  # a subclass defined here: its forward is still modeling_qwen3's
        pass

    attn, rotary = _attention_block(torch.float32)
    sub = Logged(attn.config, layer_idx=0).eval()
    sub.load_state_dict(attn.state_dict())
    xs = [_randn(1, 5, 256, dtype=torch.float32, seed=s) for s in (23, 24)]
    with torch.no_grad():
        want = [_forward(attn, rotary, x) for x in xs]
        barrier = threading.Barrier(2)
        hook = attn.k_proj.register_forward_hook(lambda m, i, o: (barrier.wait(), o)[1])  # threads interleave
        outs, errors = [None, None], []

        def run(i):
            try:
                with torch.no_grad():
                    outs[i] = _forward(attn, rotary, xs[i])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        with hf.patch_qk_norm_rope(torch.nn.ModuleList([attn, sub]), backend="reference") as patch:
            assert patch.blocks == [attn, sub]
            threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            assert not errors and all(torch.equal(o, w) for o, w in zip(outs, want))
            hook.remove()
            assert torch.equal(_forward(sub, rotary, xs[0]), want[0])
            twin = copy.deepcopy(attn)
            for p in twin.parameters():
                p.mul_(2)
            assert not torch.equal(_forward(twin, rotary, xs[0]), want[0])  # the copy runs its own weights
            hf.Patch.of(twin).remove()  # patched too, until its own patch is removed
            compiled = torch.compile(attn, backend="eager", fullgraph=True)  # traced: the block's own code
            assert torch.equal(compiled(xs[0], rotary(xs[0], torch.arange(5)[None]), None)[0], want[0])


def test_patch_keeps_an_instance_forward_a_hook_installed():
    attn, rotary = _attention_block(torch.float32)
    calls = []
    own = attn.q_norm.forward

    def hooked(x):  # what accelerate's hooks install: an instance forward
        calls.append(1)
        return own(x)

    attn.q_norm.forward = hooked
    hidden = _randn(1, 3, 256, dtype=torch.float32, seed=25)
    with torch.no_grad():
        want = _forward(attn, rotary, hidden)
        with hf.patch_qk_norm_rope(attn, backend="reference"):
            assert torch.equal(_forward(attn, rotary, hidden), want)
    assert attn.q_norm.__dict__["forward"] is hooked and len(calls) == 1  # the fused call skipped the norm itself


def test_a_deep_copy_of_a_patched_model_is_patched_and_unpatches_on_its_own():
    """copy.deepcopy of a model while it is patched (an engine cloning a loaded model): the copy runs fused, keeps
    running after the original's patch is removed, and ``Patch.of(copy).remove()`` restores it and, the last
    patched block gone, the modeling file's function."""
    import copy

    attn, rotary = _attention_block(torch.float32)
    hidden = _randn(1, 5, 256, dtype=torch.float32, seed=26)
    models_rope = qwen3.apply_rotary_pos_emb
    calls = []
    real = hf.qwen3_tts_qk_norm_rope
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf, "qwen3_tts_qk_norm_rope", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        want = _forward(attn, rotary, hidden)
        patch = hf.patch_qk_norm_rope(attn, backend="reference")
        twin = copy.deepcopy(attn)
        assert torch.equal(_forward(twin, rotary, hidden), want) and calls == [1]  # fused
        patch.remove()
        assert torch.equal(_forward(attn, rotary, hidden), want) and calls == [1]  # the original: its own code
        assert qwen3.apply_rotary_pos_emb is not models_rope  # still patched for the copy
        assert torch.equal(_forward(twin, rotary, hidden), want) and calls == [1, 1]  # the copy: still fused
        own = hf.Patch.of(twin)
        assert own.blocks == [twin]
        own.remove()
        assert torch.equal(_forward(twin, rotary, hidden), want) and calls == [1, 1]
        assert "forward" not in twin.__dict__ and "forward" not in twin.q_norm.__dict__
        assert qwen3.apply_rotary_pos_emb is models_rope and hf.Patch.of(twin).blocks == []
        hf.patch_qk_norm_rope(twin).remove()  # patchable again


def test_apply_rotary_pos_emb_gives_the_formula_for_tensors_fusedrope_refuses():
    """Dual tensors (forward-mode AD), negative views and torch.func transforms: the op would refuse them, so the
    Hugging Face function computes the model's formula, tangent and batching included."""
    from torch.autograd import forward_ad as fwAD

    q, k = _randn(1, 4, 3, 64, dtype=torch.float32, seed=27), _randn(1, 2, 3, 64, dtype=torch.float32, seed=28)
    cos, sin = _randn(1, 3, 64, dtype=torch.float32, seed=29), _randn(1, 3, 64, dtype=torch.float32, seed=30)
    tangent = torch.ones_like(q)
    with fwAD.dual_level():
        got = hf.apply_rotary_pos_emb(fwAD.make_dual(q, tangent), k, cos, sin)[0]
        want = qwen3.apply_rotary_pos_emb(fwAD.make_dual(q, tangent), k, cos, sin)[0]
        got, want = fwAD.unpack_dual(got), fwAD.unpack_dual(want)
        assert want.tangent is not None and torch.equal(got.tangent, want.tangent)
        assert torch.equal(got.primal, want.primal)
    neg = torch._neg_view(q)
    assert torch.equal(hf.apply_rotary_pos_emb(neg, k, cos, sin)[0], qwen3.apply_rotary_pos_emb(-q, k, cos, sin)[0])
    qs = torch.stack([q, 2 * q])
    got = torch.func.vmap(lambda x: hf.apply_rotary_pos_emb(x, k, cos, sin)[0])(qs)
    assert torch.equal(got, torch.stack([qwen3.apply_rotary_pos_emb(x, k, cos, sin)[0] for x in qs]))
