"""fusedrope.integrations.hf against qwen-tts's own code, the package on PyPI (``make test`` and ``.ci/run``
install it without its dependencies): its ``apply_rotary_pos_emb`` and ``Qwen3TTSRMSNorm``, the code predictor's
attention block built from its own config class with and without ``patch_qk_norm_rope``, and the talker's block
(multimodal RoPE after the same norms), both patched by one call.

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


def _talker_block(qwen_tts, dtype, interleaved=False):
    """The talker's attention block (Qwen3TTSTalkerAttention: the same norms, then multimodal RoPE), norms not the
    identity."""
    config = types.SimpleNamespace(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   attention_bias=False, attention_dropout=0.0, rms_norm_eps=1e-6,
                                   rope_scaling={"mrope_section": [8, 12, 12], "interleaved": interleaved},
                                   _attn_implementation="eager")
    torch.manual_seed(6)
    attn = qwen_tts.modeling.Qwen3TTSTalkerAttention(config, layer_idx=0)
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.copy_(1 + 0.3 * torch.randn(64))
    return attn.to(DEVICE, dtype).eval()


def _planes(S, D, dtype):
    """cos/sin ``[3, 2, S, D]``: temporal, height and width planes at different positions, per batch row."""
    cos, sin = _cos_sin(S + 16, D, dtype)
    starts = ((0, 5), (3, 11), (7, 2))  # (batch 0, batch 1) per plane
    pick = lambda t: torch.stack([torch.cat([t[:, a:a + S] for a in row]) for row in starts])  # noqa: E731
    return pick(cos), pick(sin)


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_patched_talker_and_code_predictor_give_the_models_outputs(qwen_tts, backend, interleaved):
    """A model with both kinds of block: one call patches both, the talker's (apply_multimodal_rotary_pos_emb after
    its norms) fused on its planes and sections where the backend serves multimodal RoPE (else the block's own
    code runs: the CUDA kernel does not); unpatching restores the model's own code."""
    dtype = torch.bfloat16
    model = torch.nn.ModuleDict({"talker": _talker_block(qwen_tts, dtype, interleaved),
                                 "code_predictor": _code_predictor_block(qwen_tts, dtype)})
    hidden = _randn(2, 6, 256, dtype=dtype, seed=8)
    cos, sin = _cos_sin(6, 64, dtype)
    mcos, msin = _planes(6, 64, dtype)
    models_rope = qwen_tts.modeling.apply_multimodal_rotary_pos_emb
    runs = lambda: (model["talker"](hidden, (mcos, msin), None)[0],  # noqa: E731
                    model["code_predictor"](hidden, (cos, sin), None)[0])
    calls = []
    real = fusedrope.qwen3_tts_rope.__globals__["_into_new_outputs"]
    with torch.no_grad():
        want = runs()
        with hf.patch_qk_norm_rope(model, backend=backend) as patch:
            assert patch.blocks == [model["talker"], model["code_predictor"]]
            assert qwen_tts.modeling.apply_multimodal_rotary_pos_emb is not models_rope
            fused = fusedrope.qwen3_tts_rope.__globals__
            fused["_into_new_outputs"] = lambda *a, **kw: calls.append(1) or real(*a, **kw)
            try:
                got = runs()
            finally:
                fused["_into_new_outputs"] = real
        again = runs()
    talker_fused = backend in ("reference", "triton")
    assert calls == [1] * (1 + talker_fused)  # one fused call per block it serves
    assert qwen_tts.modeling.apply_multimodal_rotary_pos_emb is models_rope
    assert all(torch.equal(a, w) for a, w in zip(again, want))
    for i, (g, w) in enumerate(zip(got, want)):
        if backend == "reference" or (i == 0 and not talker_fused):
            assert torch.equal(g, w)
        else:  # a norm's variance summed in another order may move an element by one rounding step
            torch.testing.assert_close(g, w, rtol=2 ** -7, atol=2 ** -7)


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.id in ("reference", "triton")])  # the mRoPE ones
@pytest.mark.parametrize("section", [[8, 12, 12], [12, 12, 8], [16, 16, 0]], ids=str)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("table", [False, True], ids=["planes", "table"])
def test_multimodal_rope_is_qwen_tts_bit_for_bit(qwen_tts, backend, section, interleaved, table):
    """``mrope_section`` against qwen-tts's ``apply_multimodal_rotary_pos_emb`` on random planes (every channel's
    plane tells): cos/sin ``[3, B, S, D]``, or fp32 tables read at positions ``[3, B, S]`` (the model's rotary
    module rounds them to the dtype, as ``numerics="eager"`` does)."""
    B, S, D, dtype = 2, 5, 64, torch.bfloat16
    q, k = _randn(B, 4, S, D, dtype=dtype, seed=11), _randn(B, 2, S, D, dtype=dtype, seed=12)
    if table:
        tab_c, tab_s = _randn(40, D, dtype=torch.float32, seed=13), _randn(40, D, dtype=torch.float32, seed=14)
        positions = torch.randint(0, 40, (3, B, S), generator=torch.Generator().manual_seed(15)).to(DEVICE)
        cos, sin, kw = tab_c, tab_s, {"positions": positions}
        mcos, msin = tab_c[positions].to(dtype), tab_s[positions].to(dtype)
    else:
        mcos, msin = _randn(3, B, S, D, dtype=dtype, seed=13), _randn(3, B, S, D, dtype=dtype, seed=14)
        cos, sin, kw = mcos, msin, {}
    want = qwen_tts.modeling.apply_multimodal_rotary_pos_emb(q, k, mcos, msin, section, interleaved)
    got = fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager", mrope_section=section,
                                   mrope_interleaved=interleaved, backend=backend, **kw)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    if not table and section[2]:  # one plane read for another: the test can fail
        swapped = fusedrope.qwen3_tts_rope(q, k, cos[[0, 2, 1]], sin[[0, 2, 1]], numerics="eager",
                                           mrope_section=section, mrope_interleaved=interleaved, backend=backend)
        assert not torch.equal(swapped[0], want[0])


def test_multimodal_rope_arguments_are_checked():
    q, k = torch.zeros(1, 2, 3, 64), torch.zeros(1, 2, 3, 64)
    planes = torch.zeros(3, 1, 3, 64)
    for section, match in (([8, 12], "mrope_section' expected three ints >= 0 \\(t, h, w\\) summing to D/2=32, "
                                     "got \\[8, 12\\]"),
                           ([8, 12, 13], "summing to D/2=32, got \\[8, 12, 13\\]"),
                           ([8.0, 12, 12], "got \\[8.0, 12, 12\\]")):
        with pytest.raises(ValueError, match=match):
            fusedrope.qwen3_tts_rope(q, k, planes, planes, mrope_section=section)
    with pytest.raises(ValueError, match="argument 'cos' expected a 4-D tensor \\[3, B or 1, S, D\\] \\(one plane per "
                                         "modality\\), got 3-D"):
        fusedrope.qwen3_tts_rope(q, k, planes[0], planes[0], mrope_section=[8, 12, 12])
    with pytest.raises(ValueError, match="argument 'cos' expected shape \\[3, 1, 3, 64\\], got \\[2, 1, 3, 64\\]"):
        fusedrope.qwen3_tts_rope(q, k, planes[:2], planes[:2], mrope_section=[8, 12, 12])
    with pytest.raises(ValueError, match="argument 'positions' expected shape \\[3, 1, 3\\] or \\[3, 3\\]"):
        fusedrope.qwen3_tts_rope(q, k, planes[0, 0], planes[0, 0], positions=torch.zeros(1, 3, dtype=torch.long),
                                 mrope_section=[8, 12, 12])
    with pytest.raises(ValueError, match="argument 'mrope_interleaved' expected False without mrope_section"):
        fusedrope.qwen3_tts_rope(q, k, planes[0], planes[0], mrope_interleaved=True)
