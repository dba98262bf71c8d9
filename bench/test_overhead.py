"""Host cost of the public entry points (validation + backend selection + output allocation), on tiny tensors,
for both ops, with a no-op backend registered through ``fusedrope.register_backend``:

    pytest bench/test_overhead.py --benchmark-only -s

``public`` calls the op; ``direct`` allocates the same outputs with ``torch.empty_like`` (two calls) and calls
the no-op itself; ``bare aten`` is one ``torch.neg`` on a tiny tensor. The last test prints, per op, how many
bare aten calls the public call costs over the direct one (the ratio engines compare against torch.compile
and CUDA-graph replay); ``--benchmark-json`` keeps it in that test's ``extra_info``. qwen3_tts_rope's other
entry points (``numerics="eager"``, ``positions=``, ``qwen3_tts_qk_norm_rope``) go to built-in backends only: a
no-op registered as one of those (``noop_builtin``) stands in for the kernel there. ``python checks`` times the
plain calls again without the compiled checks (``python -m fusedrope build --checks``), as on a machine where
they are not built.
"""

import pytest
import torch

import fusedrope
from fusedrope import fast_checks
from fusedrope.qwen3_tts_rope import REGISTRY as TTS_REGISTRY
from fusedrope.registry import Backend

pytestmark = pytest.mark.benchmark(warmup=True, min_rounds=2000)
MEDIANS: dict = {}  # test name -> median seconds, for the ratio at the end


def _noop(*args):
    return None


@pytest.fixture(scope="module", autouse=True)
def noop_backends():
    for op in ("qwen3_tts_rope", "inverse_rope_group_quant"):
        fusedrope.register_backend(op, "noop", _noop)
    TTS_REGISTRY.register(Backend("noop_builtin", _noop))  # takes the modes' arguments, as built-in ones do
    yield
    for op in ("qwen3_tts_rope", "inverse_rope_group_quant"):
        fusedrope.registry(op).unregister("noop")
    TTS_REGISTRY.unregister("noop_builtin")


@pytest.fixture(scope="module")
def tts():
    q = torch.randn(1, 2, 1, 8, dtype=torch.bfloat16)
    k = torch.randn(1, 1, 1, 8, dtype=torch.bfloat16)
    cos, sin = torch.randn(1, 1, 8, dtype=torch.bfloat16), torch.randn(1, 1, 8, dtype=torch.bfloat16)
    return q, k, cos, sin


@pytest.fixture(scope="module")
def quant():
    o = torch.randn(2, 2, 128, dtype=torch.bfloat16)
    cos, sin = fusedrope.testing.deepseek_rope_cache(16)
    return o, torch.arange(2), cos, sin


def timed(benchmark, name, fn):
    benchmark.group = "host overhead"
    benchmark(fn)
    if benchmark.stats is not None:
        MEDIANS[name] = benchmark.stats.stats.median


def test_bare_aten_call(benchmark, tts):
    timed(benchmark, "aten", lambda: torch.neg(tts[2]))


def test_tts_public(benchmark, tts):
    q, k, cos, sin = tts
    timed(benchmark, "tts public", lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="noop"))


def test_tts_public_python_checks(benchmark, tts, monkeypatch):
    monkeypatch.setattr(fast_checks, "checks", fast_checks.Python)
    q, k, cos, sin = tts
    timed(benchmark, "tts python checks", lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="noop"))


def test_tts_public_auto(benchmark, tts, monkeypatch):
    """backend="auto" with FUSEDROPE_BACKEND naming the no-op: the environment lookup and the cached choice."""
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "noop")
    q, k, cos, sin = tts
    timed(benchmark, "tts public auto", lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin))


def test_tts_direct(benchmark, tts):
    q, k, cos, sin = tts
    timed(benchmark, "tts direct", lambda: _noop(q, k, cos, sin, torch.empty_like(q), torch.empty_like(k)))


def test_tts_public_eager(benchmark, tts):
    q, k, cos, sin = tts
    timed(benchmark, "eager public", lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager",
                                                                      backend="noop_builtin"))


def test_tts_public_table(benchmark, tts):
    q, k, cos, sin = tts
    table, positions = cos[0], torch.zeros(1, dtype=torch.int64)
    timed(benchmark, "table public", lambda: fusedrope.qwen3_tts_rope(q, k, table, table, positions=positions,
                                                                      backend="noop_builtin"))


def test_qk_norm_rope_public(benchmark, tts):
    q, k, cos, sin = tts
    w = torch.ones(8, dtype=torch.bfloat16)
    timed(benchmark, "qk_norm public", lambda: fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w, cos, sin,
                                                                                backend="noop_builtin"))


def test_tts_public_inplace_fused_qkv(benchmark):
    """In place into q and k heads of one fused projection buffer (the engine layout): the overlap check
    compares their layouts, since they share a storage."""
    qkv = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16)
    q, k = qkv[:, :, :2].transpose(1, 2), qkv[:, :, 2:3].transpose(1, 2)
    cos, sin = torch.randn(1, 1, 8, dtype=torch.bfloat16), torch.randn(1, 1, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        timed(benchmark, "tts in place", lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True,
                                                                          backend="noop"))


def test_tts_public_into_buffers(benchmark, tts):
    q, k, cos, sin = tts
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    timed(benchmark, "tts buffers",
          lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, q_out=q_out, k_out=k_out, backend="noop"))


def test_quant_public(benchmark, quant):
    o, pos, cos, sin = quant
    timed(benchmark, "quant public", lambda: fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, backend="noop"))


def test_quant_public_python_checks(benchmark, quant, monkeypatch):
    monkeypatch.setattr(fast_checks, "checks", fast_checks.Python)
    o, pos, cos, sin = quant
    timed(benchmark, "quant python checks",
          lambda: fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, backend="noop"))


def test_quant_direct(benchmark, quant):
    o, pos, cos, sin = quant
    x_shape, s_shape = fusedrope.quant_output_shapes(2, 2, 128, 2)

    def direct():
        _noop(o, pos, cos, sin, torch.empty(x_shape, dtype=torch.float8_e4m3fn),
              torch.empty(s_shape, dtype=torch.float8_e8m0fnu), 128)
    timed(benchmark, "quant direct", direct)


def test_quant_public_into_buffers(benchmark, quant):
    o, pos, cos, sin = quant
    x_fp8, x_scale = fusedrope.empty_quant_outputs(o, 2)
    timed(benchmark, "quant buffers", lambda: fusedrope.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, False,
                                                                                x_fp8, x_scale, backend="noop"))


def test_ratio_public_over_direct_in_bare_aten_calls(benchmark):
    """(public - direct) / bare aten call, per op, from the medians above (run last)."""
    needed = ("aten", "tts public", "tts direct", "quant public", "quant direct")
    if any(n not in MEDIANS for n in needed):
        pytest.skip("needs the timings above (run the whole file with --benchmark-only)")
    aten = MEDIANS["aten"]
    ratios = {op: round((MEDIANS[f"{op} public"] - MEDIANS[f"{op} direct"]) / aten, 2) for op in ("tts", "quant")}
    ratios.update({f"{op} python checks": round((MEDIANS[f"{op} python checks"] - MEDIANS[f"{op} direct"]) / aten, 2)
                   for op in ("tts", "quant") if f"{op} python checks" in MEDIANS})
    ratios.update({f"tts {mode}": round((MEDIANS[f"{mode} public"] - MEDIANS["tts direct"]) / aten, 2)
                   for mode in ("eager", "table", "qk_norm") if f"{mode} public" in MEDIANS})
    built = fast_checks.load() is not fast_checks.Python
    benchmark.extra_info.update({"ratios": ratios, "medians_us": {k: v * 1e6 for k, v in MEDIANS.items()},
                                 "compiled_checks": built})
    benchmark.pedantic(lambda: None, rounds=1)
    print(f"\nhost overhead over a direct backend call, in bare aten calls ({aten * 1e6:.2f} us each), "
          f"{'with the compiled checks' if built else 'WITHOUT the compiled checks (not built)'}: "
          f"qwen3_tts_rope {ratios['tts']}, inverse_rope_group_quant {ratios['quant']}; with the Python checks: "
          f"{ratios.get('tts python checks')} and {ratios.get('quant python checks')}; qwen3_tts_rope's "
          f"numerics='eager' {ratios.get('tts eager')}, positions= {ratios.get('tts table')}, "
          f"qwen3_tts_qk_norm_rope {ratios.get('tts qk_norm')}")
