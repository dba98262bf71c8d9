"""Both ops under ``torch.compile(fullgraph=True, dynamic=True)``, as an engine compiles its step once for every
batch: the token counts change from call to call, the graph compiles once, and every call gives the eager bytes
(the fakes compute their output shapes and strides from symbolic sizes without specialising them)."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import fusedrope
from fusedrope.testing import QuantCase, TtsCase, make_quant_inputs, make_tts_inputs

from conftest import DEVICE

pytestmark = pytest.mark.slow  # a compile per case; plain torch.compile is in the ops' own tests


def _compiled(fn):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")  # fake propagation and functionalization, no codegen
    return torch.compile(fn, fullgraph=True, dynamic=True, backend=counter), counter


@pytest.mark.parametrize("how", ["new outputs", "in place", "into buffers"])
def test_tts_rope_compiles_once_for_every_batch(how):
    def step(q, k, cos, sin):
        q = q * 2  # something of the engine's around the op
        if how == "in place":
            fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True)
            return q, k
        if how == "into buffers":
            q_out, k_out = torch.empty_like(q), torch.empty_like(k)
            fusedrope.qwen3_tts_rope(q, k, cos, sin, q_out=q_out, k_out=k_out)
            return q_out, k_out
        return fusedrope.qwen3_tts_rope(q, k, cos, sin)

    fn, counter = _compiled(step)
    # The first call's sizes are all different (else duck sizing guards their equality) and none is 0 or 1.
    for seed, (B, S) in enumerate([(3, 5), (5, 7), (6, 3), (7, 17)]):
        q, k, cos, sin = make_tts_inputs(TtsCase("dyn", B, S, 4, 2), device=DEVICE, seed=seed)
        got, want = fn(q.clone(), k.clone(), cos, sin), step(q.clone(), k.clone(), cos, sin)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.stride() == w.stride() and torch.equal(g, w), (B, S)
    assert counter.frame_count == 1


@pytest.mark.parametrize("transpose_scale", [False, True])
@pytest.mark.parametrize("buffers", [False, True])
def test_inverse_rope_group_quant_compiles_once_for_every_token_count(transpose_scale, buffers):
    def step(o, pos, cos, sin):
        o = o + 0  # the attention output, as the engine's graph hands it over
        if buffers:
            x_fp8, x_scale = fusedrope.empty_quant_outputs(o, 2, 128, transpose_scale)
            fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, transpose_scale, x_fp8, x_scale)
            return x_fp8, x_scale
        return fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, transpose_scale)

    fn, counter = _compiled(step)
    for seed, S in enumerate([3, 6, 9, 33]):  # column-major scales pad the token axis to a multiple of 4
        o, pos, cos, sin = make_quant_inputs(QuantCase(S, 4, 2), device=DEVICE, seed=seed)
        got, want = fn(o, pos, cos, sin), step(o, pos, cos, sin)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.stride() == w.stride(), (S, g.stride(), w.stride())
            assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), S
    assert counter.frame_count == 1
