"""fusedrope.integrations.hf against qwen-tts's own code, the package on PyPI (``make test`` and ``.ci/run``
install it without its dependencies): its ``apply_rotary_pos_emb`` and ``Qwen3TTSRMSNorm``, the code predictor's
attention block built from its own config class with and without ``patch_qk_norm_rope``, and the talker's block
(multimodal RoPE after the same norms), which the patch must leave alone.

The definitions are read from the installed modeling file and run as a module of their own: importing the
package would pull in librosa, gradio, onnxruntime and a pinned transformers, none of which these blocks use.
"""

import ast
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

import fusedrope
from fusedrope.integrations import hf

from conftest import DEVICE, backends_here
from test_qwen3_tts_rope_callers import assert_fused_norm_rope_is_the_models

pytest.importorskip("transformers", reason="transformers is in the test extras: pip install '.[test]'")

ROOT = Path(__file__).resolve().parents[2]
QWEN_TTS = next(ln for ln in (ROOT / "requirements-callers.txt").read_text().splitlines() if ln.startswith("qwen-tts"))
BACKENDS = backends_here("qwen3_tts_rope")
BLOCKS = ("Qwen3TTSRMSNorm", "rotate_half", "repeat_kv", "eager_attention_forward", "apply_rotary_pos_emb",
          "apply_multimodal_rotary_pos_emb", "Qwen3TTSAttention", "Qwen3TTSTalkerAttention")


def _module_from(path: Path, name: str, only=None, namespace=None) -> types.ModuleType:
    """``path``'s top-level statements (only the definitions named ``only``, if given) run as module ``name``;
    its absolute imports that fail (librosa, ...) and its relative ones are skipped, ``namespace`` stands in for
    the latter."""
    module = types.ModuleType(name)
    module.__file__ = str(path)
    module.__dict__.update(namespace or {})
    sys.modules[name] = module  # the patch finds a block's apply_rotary_pos_emb through its forward's module
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if getattr(node, "level", 0):
                continue
        elif only is not None and getattr(node, "name", None) not in only:
            continue
        try:
            exec(compile(ast.Module([node], []), str(path), "exec"), module.__dict__)
        except ImportError:
            assert isinstance(node, (ast.Import, ast.ImportFrom)), ast.dump(node)[:200]
    return module


@pytest.fixture(scope="module")
def qwen_tts():
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None:
        pytest.skip(f"qwen-tts is not installed: pip install --no-deps '{QWEN_TTS}' (make test does)")
    models = Path(spec.submodule_search_locations[0]) / "core" / "models"
    config = _module_from(models / "configuration_qwen3_tts.py", "fusedrope_tests_qwen_tts_config")
    modeling = _module_from(models / "modeling_qwen3_tts.py", "fusedrope_tests_qwen_tts_modeling", BLOCKS,
                            {k: v for k, v in vars(config).items() if k.startswith("Qwen3TTS")})
    yield types.SimpleNamespace(config=config, modeling=modeling)
    for name in (config.__name__, modeling.__name__):
        sys.modules.pop(name, None)


def _randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def _cos_sin(S, D, dtype, theta=10000.0):
    """As qwen-tts's rotary module computes them: fp32 frequencies, both halves, cast to the dtype."""
    inv_freq = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    freqs = torch.arange(S, dtype=torch.float32)[:, None] * inv_freq[None]
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_apply_rotary_pos_emb_is_qwen_tts_bit_for_bit(qwen_tts, backend, dtype):
    B, S, HQ, HKV, D = 2, 9, 16, 8, 128
    proj = _randn(B, S, HQ + HKV, D, dtype=dtype, seed=1)
    q, k = proj[:, :, :HQ].transpose(1, 2), proj[:, :, HQ:].transpose(1, 2)
    cos, sin = _cos_sin(S, D, dtype)
    want = qwen_tts.modeling.apply_rotary_pos_emb(q, k, cos, sin)
    got = hf.apply_rotary_pos_emb(q, k, cos, sin, backend=backend)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_qk_norm_rope_against_qwen_tts_rmsnorm_and_rope(qwen_tts, backend, dtype):
    B, S, HQ, HKV, D = 2, 9, 16, 8, 128
    norms = [qwen_tts.modeling.Qwen3TTSRMSNorm(D, eps=1e-6) for _ in range(2)]
    with torch.no_grad():
        for i, n in enumerate(norms):
            n.weight.copy_(1 + 0.2 * _randn(D, dtype=torch.float32, seed=2 + i))
    q_norm, k_norm = (n.to(DEVICE, dtype) for n in norms)
    proj = _randn(B, S, HQ + HKV, D, dtype=dtype, seed=4)
    assert_fused_norm_rope_is_the_models(qwen_tts.modeling.apply_rotary_pos_emb, q_norm, k_norm, proj, HQ,
                                         *_cos_sin(S, D, dtype), backend)


def _code_predictor_block(qwen_tts, dtype):
    """The code predictor's attention block (Qwen3TTSAttention) from its own config class, with norms that are not
    the identity."""
    config = qwen_tts.config.Qwen3TTSTalkerCodePredictorConfig(hidden_size=256, num_attention_heads=4,
                                                               num_key_value_heads=2, head_dim=64)
    config._attn_implementation = "eager"
    torch.manual_seed(5)
    attn = qwen_tts.modeling.Qwen3TTSAttention(config, layer_idx=0)
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.copy_(1 + 0.3 * torch.randn(64))
    return attn.to(DEVICE, dtype).eval()


def _talker_block(qwen_tts, dtype):
    config = types.SimpleNamespace(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   attention_bias=False, attention_dropout=0.0, rms_norm_eps=1e-6,
                                   rope_scaling={"mrope_section": [8, 12, 12], "interleaved": False},
                                   _attn_implementation="eager")
    torch.manual_seed(6)
    return qwen_tts.modeling.Qwen3TTSTalkerAttention(config, layer_idx=0).to(DEVICE, dtype).eval()


@pytest.mark.parametrize("backend", BACKENDS)
def test_patched_code_predictor_block_gives_the_models_output(qwen_tts, backend):
    dtype = torch.bfloat16
    attn = _code_predictor_block(qwen_tts, dtype)
    hidden = _randn(2, 11, 256, dtype=dtype, seed=7)
    cos, sin = _cos_sin(11, 64, dtype)
    calls = []
    real = fusedrope.qwen3_tts_rope.__globals__["_into_new_outputs"]
    models_rope = qwen_tts.modeling.apply_rotary_pos_emb
    with torch.no_grad():
        want = attn(hidden, (cos, sin), None)[0]
        with hf.patch_qk_norm_rope(attn, backend=backend) as patch:
            assert patch.blocks == [attn]
            fused = fusedrope.qwen3_tts_rope.__globals__
            fused["_into_new_outputs"] = lambda *a, **kw: calls.append(1) or real(*a, **kw)
            try:
                got = attn(hidden, (cos, sin), None)[0]
            finally:
                fused["_into_new_outputs"] = real
        again = attn(hidden, (cos, sin), None)[0]
    assert calls == [1]  # one fused call did both norms and the RoPE
    assert torch.equal(again, want) and qwen_tts.modeling.apply_rotary_pos_emb is models_rope
    if backend == "reference":
        assert torch.equal(got, want)
    else:  # a norm's variance summed in another order may move an element by one rounding step
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=2 ** -7)


def test_patch_leaves_the_talkers_multimodal_rope_blocks_alone(qwen_tts):
    """A model with both kinds of block: one call patches the code predictor's, and the talker's (whose forward
    applies its norms, then apply_multimodal_rotary_pos_emb) keeps running its own code."""
    dtype = torch.bfloat16
    model = torch.nn.ModuleDict({"talker": _talker_block(qwen_tts, dtype),
                                 "code_predictor": _code_predictor_block(qwen_tts, dtype)})
    hidden = _randn(1, 6, 256, dtype=dtype, seed=8)
    cos, sin = _cos_sin(6, 64, dtype)
    mcos, msin = cos[None].expand(3, -1, -1, -1), sin[None].expand(3, -1, -1, -1)  # [3, B, S, D]: t, h, w
    with torch.no_grad():
        want = model["talker"](hidden, (mcos, msin), None)[0], model["code_predictor"](hidden, (cos, sin), None)[0]
        with hf.patch_qk_norm_rope(model, backend="reference") as patch:
            assert patch.blocks == [model["code_predictor"]]
            got = model["talker"](hidden, (mcos, msin), None)[0], model["code_predictor"](hidden, (cos, sin), None)[0]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    with pytest.raises(ValueError, match="expected a module with attention blocks"):
        hf.patch_qk_norm_rope(model["talker"])
