"""qwen3_tts_rope on a CUDA device: the checks the rest of the suite does not make there. Every test here is
marked ``gpu`` and skips, saying why, where torch sees no CUDA device (the rest of the suite runs on the GPU
by itself when there is one: tests/conftest.py). ``gpu/run.sh`` runs these under compute-sanitizer too.

* auto picks the hand-written kernel on an NVIDIA GPU, and Triton runs there too;
* ``cuda`` and ``triton`` on the 18 seed cases and on layouts beyond them (a 4-byte-aligned view, a seed-sized
  projection at an odd element offset, tables with their own batch strides, 100 heads, S = 3000), outputs
  poisoned inside guard bytes that must stay untouched (compute-sanitizer does not see a write into the
  caching allocator's slack), and through the public function's own allocation;
* every launch shape and vector width the CUDA kernel's launcher makes, the modes' kernels too, out of place and
  in place;
* bad inputs to the raw compiled op raise a RuntimeError naming it, in a child process, so that a crash is one
  failed case and not the end of the run;
* CUDA-graph replay gives the same bytes as eager, out of place and in place.
"""

from pathlib import Path

import pytest
import torch

import fusedrope
from fusedrope.qwen3_tts_rope import REGISTRY, validate
from fusedrope.testing import (TTS_CASES, TtsCase, assert_tts_rope_close, bytes_written_outside, guarded_poison,
                               make_tts_inputs, own_batch_strides, to_device_keeping_layout)

from conftest import GPU_ONLY, backends_here, needs_cuda_kernel
from raw_rejects import reject_failure, run_child

OP = "qwen3_tts_rope"
pytestmark = GPU_ONLY
DEV = torch.device("cuda")
BACKENDS = [p for p in backends_here(OP) if p.id in ("cuda", "triton")]
needs_cuda_kernel = needs_cuda_kernel(OP)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(autouse=True)
def _synchronize():
    yield
    torch.cuda.synchronize()  # an asynchronous fault fails the test that caused it, not a later one


def _guarded_outputs(q, k, offset=0):
    """Poisoned outputs in guard bytes, ``offset`` elements off 16 bytes (0, 2 and 1 take the 16-, 4- and 2-byte
    paths), and a function that counts the guard bytes written."""
    (q_out, q_buf), (k_out, k_buf) = (guarded_poison(t.shape, t.dtype, DEV, lead=64 + offset) for t in (q, k))
    return q_out, k_out, lambda: bytes_written_outside(q_buf, q_out) + bytes_written_outside(k_buf, k_out)


def run_guarded(backend, q, k, cos, sin):
    """The backend on poisoned outputs inside poisoned guard bytes; the contract and untouched guards."""
    q_out, k_out, stray = _guarded_outputs(q, k)
    REGISTRY.select(validate(q, k, cos, sin), backend).run(q, k, cos, sin, q_out, k_out)
    assert stray() == 0, f"{backend} wrote {stray()} guard bytes"
    assert_tts_rope_close(q_out, k_out, q, k, cos, sin)


def test_auto_picks_the_cuda_kernel_on_an_nvidia_gpu():
    """And Triton, the portable kernel, runs there too: neither may be missing on the GPU machine."""
    if torch.version.hip:
        pytest.skip("ROCm: no hand-written op-1 kernel")
    ex = fusedrope.explain(OP, *make_tts_inputs(TTS_CASES[0], device=DEV))
    assert ex.chosen == "cuda" and {"cuda", "triton"} <= {d.backend for d in ex if d.runs}, str(ex)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", TTS_CASES, ids=lambda c: c.id)
def test_seed_matrix(backend, case):
    q, k, cos, sin = make_tts_inputs(case, device=DEV, seed=case.seed)
    run_guarded(backend, q, k, cos, sin)
    q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)  # outputs the backend allocates
    assert q_out.is_contiguous() and k_out.is_contiguous() and q_out.dtype == q.dtype
    assert_tts_rope_close(q_out, k_out, q, k, cos, sin)


def _layouts():
    """{name: (q, k, cos, sin)} on the CPU, layouts the seed matrix and the rest of the suite do not reach."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 9, 5, 160, generator=g).to(torch.bfloat16)[:, 1:8:2, :4, 16:144].transpose(1, 2)
    cs = torch.randn(2, 4, 2, 136, generator=g).to(torch.bfloat16)
    k2 = torch.randn(4, 4, 3, 130, generator=g).to(torch.bfloat16)[::2, :, :, 2:130].transpose(1, 2)
    proj = torch.randn(1 + 8 * 16 * 24 * 128, generator=g).to(torch.bfloat16)[1:].view(8, 16, 24, 128)
    c, s = make_tts_inputs(TtsCase("m", 8, 16, 16, 8), seed=3)[2:]
    q3, k3, c3, s3 = make_tts_inputs(TtsCase("tb", 4, 16, 16, 8), seed=4, random_cos_sin=True)
    return {
        "4byte_aligned_k": (q, k2, cs[:, :, 0, 8:136], cs[:, :, 1, :128]),  # the bf16x2 path
        "odd_element_offset_projection": (proj[:, :, :16].transpose(1, 2), proj[:, :, 16:].transpose(1, 2), c, s),
        # cos expanded over B, sin's batch stride S*D + 4: rows b >= 1 not 16-byte aligned (no vector path)
        "tables_own_batch_strides": (q3, k3, *own_batch_strides(c3, s3)),
        "D256_fp16_contiguous": make_tts_inputs(TtsCase("d256h", 3, 5, 7, 3, 256), torch.float16,
                                                layout="contiguous", seed=5),
        "100_q_heads": make_tts_inputs(TtsCase("mh", 2, 3, 100, 37), seed=6, random_cos_sin=True),
        "long_seq_3000": make_tts_inputs(TtsCase("ls", 1, 3000, 16, 8), seed=7),
    }


LAYOUTS = _layouts()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts_beyond_the_seed_matrix(backend, name):
    # .to(device) would make the strided and offset views dense and aligned: the layouts these cases are about
    run_guarded(backend, *(to_device_keeping_layout(t, DEV) for t in LAYOUTS[name]))


def _raw(q, k, cos, sin, q_out, k_out, **kw):
    """The CUDA backend's compiled op: writes q_out, k_out (q, k themselves in place); ``kw``: the modes, pdl."""
    from fusedrope import cuda_ext

    cuda_ext.load()
    torch.ops.fusedrope_cuda.qwen3_tts_rope_out(q, k, cos, sin, q_out, k_out, **kw)


@needs_cuda_kernel
@pytest.mark.parametrize("offset", [0, 2, 1], ids=["vec8", "vec2", "vec1"])
@pytest.mark.parametrize("shape", [(3, 7, 2, 1, 128), (3, 17, 16, 8, 128), (2, 9, 30, 10, 128), (2, 5, 48, 16, 128),
                                   (2, 9, 13, 5, 64), (2, 9, 7, 3, 256), (3, 701, 2, 1, 128), (3, 351, 13, 5, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_launch_shapes(shape, offset):
    """Every block shape the launcher makes (tests/qwen3_tts_rope/test_qwen3_tts_rope_cuda.py's LAUNCH_SHAPES)
    at every vector width, out of place and in place."""
    q, k, cos, sin = make_tts_inputs(TtsCase("shape", *shape), device=DEV, seed=11, random_cos_sin=True)
    q_out, k_out, stray = _guarded_outputs(q, k, offset)
    _raw(q, k, cos, sin, q_out, k_out)
    assert stray() == 0
    assert_tts_rope_close(q_out, k_out, q, k, cos, sin)
    qi, ki = q.clone(), k.clone()
    _raw(qi, ki, cos, sin, qi, ki)
    assert_tts_rope_close(qi, ki, q, k, cos, sin)


@needs_cuda_kernel
@pytest.mark.parametrize("launch", [dict(offset=0), dict(offset=2), dict(offset=1), dict(offset=0, pdl=True),
                                    dict(offset=1, pdl=True), dict(offset=0, shape=(3, 351, 13, 5, 128))],
                         ids=["vec8", "vec2", "vec1", "pdl", "pdl-vec1", "tpc2"])
@pytest.mark.parametrize("mode", ["eager", "fp32-table", "norm-eager", "norm-fp32-table-eager"])
def test_launch_shapes_of_the_modes(mode, launch):
    """The modes' kernels (opt-in) against the reference on the GPU, out of place and in place, every width,
    2-D blocks and programmatic dependent launches."""
    from test_qwen3_tts_rope_cuda import assert_matches_reference, mode_inputs, reference_of

    pdl, shape = launch.get("pdl", False), launch.get("shape", (3, 17, 16, 8, 128))
    if pdl and torch.cuda.get_device_capability(DEV) < (9, 0):
        pytest.skip("pdl needs sm_90")
    q, k, cos, sin, kw = mode_inputs(TtsCase("modes", *shape), torch.bfloat16, mode, seed=21)
    q, k, cos, sin = (to_device_keeping_layout(t, DEV) for t in (q, k, cos, sin))
    kw = {n: t.to(DEV) if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
    want = reference_of(q, k, cos, sin, kw)
    q_out, k_out, stray = _guarded_outputs(q, k, launch["offset"])
    _raw(q, k, cos, sin, q_out, k_out, **kw, pdl=pdl)
    assert stray() == 0
    assert_matches_reference((q_out, k_out), want, "q_weight" in kw)
    qi, ki = q.clone(), k.clone()
    _raw(qi, ki, cos, sin, qi, ki, **kw, pdl=pdl)
    assert torch.equal(qi, q_out) and torch.equal(ki, k_out)


@needs_cuda_kernel
def test_pdl_launch_waits_for_the_kernel_that_writes_its_input():
    """A programmatic dependent launch right after the kernel that writes q, k (and the norm weights): every time
    the bytes of the same call launched plainly."""
    if torch.cuda.get_device_capability(DEV) < (9, 0):
        pytest.skip("pdl needs sm_90")
    q, k, cos, sin = make_tts_inputs(TtsCase("pdl", 32, 32, 32, 8), device=DEV, seed=31, random_cos_sin=True)
    w = torch.rand(q.shape[-1], device=DEV, dtype=q.dtype) + 0.5
    norm = dict(q_weight=w, k_weight=w.flip(0), eps=1e-6)
    want = [torch.empty_like(q), torch.empty_like(k)]
    _raw(q, k, cos, sin, *want, **norm)
    plain = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="cuda")
    qd, kd, wd = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(w)
    got = [torch.empty_like(q), torch.empty_like(k)]
    for _ in range(20):
        for dst in (qd, kd, wd, *got):
            dst.zero_()
        torch.add(q, 0, out=qd), torch.add(k, 0, out=kd), torch.add(w, 0, out=wd)  # the writers, just before
        _raw(qd, kd, cos, sin, *got, q_weight=wd, k_weight=wd.flip(0).contiguous(), eps=1e-6, pdl=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        qd.zero_()
        torch.add(q, 0, out=qd)  # and the public function's enable_pdl, on the plain op
        pub = fusedrope.qwen3_tts_rope(qd, k, cos, sin, enable_pdl=True, backend="cuda")
        assert torch.equal(pub[0], plain[0])


# ------------------------------------------------------------------------------------------------------------
# bad inputs to the raw op, in a child process: a crash (the H200 once segfaulted on one) fails that case only
# ------------------------------------------------------------------------------------------------------------
def reject_cases() -> dict:
    """Bad inputs to ``torch.ops.fusedrope_cuda.qwen3_tts_rope_out`` (reached only through misuse)."""
    from fusedrope import cuda_ext

    cuda_ext.load()
    ops = torch.ops.fusedrope_cuda
    q, k, cos, sin = make_tts_inputs(TtsCase("bad", 2, 3, 4, 2), device=DEV)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    return {"fp32": lambda: ops.qwen3_tts_rope_out(*(t.float() for t in (q, k, cos, sin, qo, ko))),
            "cpu_k": lambda: ops.qwen3_tts_rope_out(q, k.cpu(), cos, sin, qo, ko),
            "D96": lambda: ops.qwen3_tts_rope_out(*(t[..., :96] for t in (q, k, cos, sin, qo, ko))),
            "k_batch_mismatch": lambda: ops.qwen3_tts_rope_out(q, k[:1], cos, sin, qo, ko[:1]),
            "one_norm_weight": lambda: ops.qwen3_tts_rope_out(q, k, cos, sin, qo, ko, q_weight=cos[0, 0]),
            "positions_3d": lambda: ops.qwen3_tts_rope_out(q, k, cos[0], sin[0], qo, ko,
                                                           positions=torch.zeros(1, 2, 3, dtype=torch.int64,
                                                                                 device=DEV))}


REJECTS = ("fp32", "cpu_k", "D96", "k_batch_mismatch", "one_norm_weight", "positions_3d")
@pytest.fixture(scope="module")
def rejected():
    return run_child(Path(__file__).stem, HERE)


@needs_cuda_kernel
@pytest.mark.parametrize("name", REJECTS)
def test_raw_op_rejects_bad_inputs_without_crashing(rejected, name):
    """(The check's power, a crash or a silent call failing its case, is shown on the CPU in
    tests/inverse_rope_group_quant/test_inverse_rope_group_quant_gpu.py.)"""
    failure = reject_failure(rejected, name)
    assert not failure, failure


# ------------------------------------------------------------------------------------------------------------
# CUDA graphs
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [TtsCase("g", 1, 16, 16, 8), TtsCase("g", 32, 32, 32, 8)], ids=lambda c: c.id)
def test_cuda_graph_replay_equals_eager(backend, case):
    """Captured once, replayed on new inputs copied into the captured ones: the same bytes as eager, out of
    place and in place."""
    from fusedrope.benchmark.timing import capture_graph

    q, k, cos, sin = make_tts_inputs(case, device=DEV, seed=12)
    static = [t.clone() for t in (q, k, cos, sin)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (and Triton's compile) outside the capture
        fusedrope.qwen3_tts_rope(*static, backend=backend)
        fusedrope.qwen3_tts_rope(*(t.clone() for t in static), inplace=True, backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    graph, got = torch.cuda.CUDAGraph(), {}
    capture_graph(graph, lambda i: got.update(out=fusedrope.qwen3_tts_rope(*static, backend=backend)), 1)
    new = make_tts_inputs(case, device=DEV, seed=13)
    for s, t in zip(static, new):
        s.copy_(t)
    graph.replay()
    want = fusedrope.qwen3_tts_rope(*new, backend=backend)
    for a, b in zip(got["out"], want):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))

    iq, ik = q.clone(), k.clone()
    graph = torch.cuda.CUDAGraph()
    capture_graph(graph, lambda i: fusedrope.qwen3_tts_rope(iq, ik, cos, sin, inplace=True, backend=backend), 1)
    iq.copy_(q), ik.copy_(k)
    graph.replay()
    want = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)
    assert torch.equal(iq.view(torch.int16), want[0].view(torch.int16))
    assert torch.equal(ik.view(torch.int16), want[1].view(torch.int16))
