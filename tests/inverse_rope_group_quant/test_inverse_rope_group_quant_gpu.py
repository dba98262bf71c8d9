"""inverse_rope_group_quant on a CUDA device: the checks the rest of the suite does not make there. Every test
here is marked ``gpu`` and skips, saying why, where torch sees no CUDA device (the rest of the suite runs on the
GPU by itself when there is one: tests/conftest.py). ``gpu/run.sh`` runs these under compute-sanitizer too.

* ``cuda`` and ``triton`` over the seed's (H, G) at several S, every quant group and both scale layouts (a few
  against the reference on the CPU), over layouts the compiled kernels read through their narrow paths (o,
  x_fp8 or cache rows off 16-byte alignment, strided int32 positions, padded column-major scales), and with
  NaN, Inf and all-zero blocks; outputs poisoned inside guard bytes that must stay untouched;
* ``cuda_head``, the head kernel (opt-in: docs/status.md), in all of the above, and the layouts only it
  writes (group-major and padded x_fp8, zeroed padding rows of column-major scales) through the public op; both
  kernels through the raw op with ``pdl`` and ``kernel`` forced, each held to the same contract;
* the raw op with no token or no head returns without a launch; a programmatic dependent launch reads what the
  kernel before it wrote;
* bad inputs to the raw compiled ops raise a RuntimeError naming them, in a child process, so that a crash is
  one failed case and not the end of the run;
* CUDA-graph replay gives the same bytes as eager, also after new inputs are copied into the captured ones.

Three tests run on the CPU, with stand-ins for the raw op, to show that these checks can fail: the contract
check, the dependent-launch check and the child-process protocol.
"""

from pathlib import Path

import pytest
import torch

import fusedrope
from fusedrope import reference as ref
from fusedrope.inverse_rope_group_quant.buffers import empty_quant_outputs
from fusedrope.testing import (QUANT_HEAD_GROUPS, QuantCase, assert_quant_close, bytes_written_outside,
                               deepseek_rope_cache, guarded_poison, poison_like, rope_blocks)

from conftest import HAS_CUDA, backends_here, gpu, needs_cuda_kernel
from raw_rejects import reject_failure, run_child

OP = "inverse_rope_group_quant"
DEV = torch.device("cuda")
BACKENDS = [p for p in backends_here(OP) if p.id in ("cuda", "cuda_head", "triton")]
needs_cuda_kernel = needs_cuda_kernel(OP)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GUARD = 0xA5  # not 0xFF: that is a legitimate scale byte (a NaN block)
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


@pytest.fixture(autouse=True)
def _synchronize():
    yield
    if HAS_CUDA:
        torch.cuda.synchronize()  # an asynchronous fault fails the test that caused it, not a later one


def make_inputs(S, H, *, dtype=BF16, cache_dtype=F32, max_pos=4096, seed=0, pos_dtype=torch.int64, pos_stride=1,
                cache_offset=0, o_offset=0, out_of_range=False, device=DEV):
    """o [S, H, 512] with per-(token, head) magnitudes over ~40 binades, optionally at an element offset inside a
    bigger buffer; positions (optionally strided, or outside [0, max_pos), which the kernel clamps); cos/sin as
    views of one combined cache, ``[max_pos, 64]`` with ``cache_offset=0`` (16-byte aligned rows), else rows
    shifted off alignment."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-30, 10, (S, H, 1), generator=g).float())
    o = torch.empty(S * H * 512 + o_offset, dtype=dtype, device=device)[o_offset:].view(S, H, 512)
    o.copy_((torch.randn(S, H, 512, generator=g) * mag).to(dtype))
    lo, hi = (-7, max_pos + 7) if out_of_range else (0, max_pos)
    positions = torch.randint(lo, hi, (S * pos_stride,), generator=g).to(pos_dtype).to(device)[::pos_stride]
    cos, sin = deepseek_rope_cache(max_pos, 64, dtype=cache_dtype)
    k = cache_offset
    big = torch.zeros(max_pos, 64 if k == 0 else 64 + 2 * k + 1, dtype=cache_dtype, device=device)
    c0, s0 = (0, 32) if k == 0 else (k, 2 * k + 33)
    big[:, c0:c0 + 32], big[:, s0:s0 + 32] = cos.to(device), sin.to(device)
    return o, positions, big[:, c0:c0 + 32], big[:, s0:s0 + 32]


def raw(o, p, c, s, x, sc, q, pdl=0, kernel=0):
    """The raw CUDA op with ``pdl`` and ``kernel`` forced (row- or column-major scales)."""
    from fusedrope import cuda_ext

    cuda_ext.load()
    torch.ops.fusedrope_cuda.inverse_rope_group_quant_out(o, p, c, s, x, sc, q, 0, pdl, kernel)


def check(o, p, c, s, G, q, transpose=False, *, backend="cuda", config=None, scale_dtype=torch.float8_e8m0fnu,
          x_offset=0, scale_pad=0, cpu_reference=False):
    """``backend`` through the public function, or with ``config`` (``pdl``, ``kernel``) the raw CUDA op with that
    launch forced (:func:`raw`), into poisoned outputs inside guard bytes: scales exact, fp8 within 1 ulp of the
    reference (on the CPU with ``cpu_reference``), nothing written outside. ``x_offset`` misaligns x_fp8;
    ``scale_pad`` pads a column-major x_scale's token dim."""
    x0, s0 = empty_quant_outputs(o, G, q, transpose, scale_dtype=scale_dtype)
    x, x_buf = guarded_poison(x0.shape, x0.dtype, o.device, lead=64 + x_offset)
    S, _, ks = s0.shape
    strides = (1, ks * (S + scale_pad), S + scale_pad) if scale_pad else s0.stride()
    sc, sc_buf = guarded_poison(s0.shape, scale_dtype, o.device, strides, byte=GUARD)
    if config is None:
        fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, transpose, x, sc, backend=backend)
    else:
        raw(o, p, c, s, x, sc, q, **config)
    on = torch.device("cpu") if cpu_reference else o.device
    xr, sr = (poison_like(t.to(on)) for t in (x0, s0))
    ref.inverse_rope_group_quant(*(t.to(on) for t in (o, p, c, s)), xr, sr, q)
    stray = bytes_written_outside(x_buf, x) + bytes_written_outside(sc_buf, sc, GUARD)
    assert stray == 0, f"{stray} guard bytes written"
    assert_quant_close(x, sc, xr.to(o.device), sr.to(o.device), rope_blocks(QuantCase(S, o.shape[1], G, 512, 64, q)))


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [False, True], ids=["row", "col"])
@pytest.mark.parametrize("q", [32, 64, 128, 256])
@pytest.mark.parametrize("S", [1, 8, 33, 128, 1024])
@pytest.mark.parametrize("hg", list(QUANT_HEAD_GROUPS))
def test_seed_shapes(backend, hg, S, q, transpose):
    H, G = QUANT_HEAD_GROUPS[hg]
    o, p, c, s = make_inputs(S, H, seed=S * 7 + q)
    check(o, p, c, s, G, q, transpose, backend=backend, cpu_reference=S == 33)


LAYOUTS = {  # name: (make_inputs keywords, check keywords)
    "fp16_o_bf16_cache_int32_strided_pos": (dict(S=37, H=16, dtype=F16, cache_dtype=BF16, pos_dtype=torch.int32,
                                                 pos_stride=3), dict(G=2, q=64)),
    "fp16_cache_out_of_range_pos": (dict(S=29, H=8, cache_dtype=F16, out_of_range=True),
                                    dict(G=1, q=128, transpose=True)),
    "unaligned_bf16_cache_rows": (dict(S=21, H=16, cache_dtype=BF16, cache_offset=3), dict(G=2, q=32)),
    "unaligned_fp32_cache_rows": (dict(S=21, H=8, cache_offset=1), dict(G=4, q=256, transpose=True)),
    "unaligned_o": (dict(S=19, H=16, o_offset=1), dict(G=2, q=128)),
    "unaligned_x_fp8": (dict(S=19, H=16), dict(G=2, q=128, transpose=True, x_offset=3)),
    "uint8_scale": (dict(S=17, H=16), dict(G=2, q=128, transpose=True, scale_dtype=torch.uint8)),
    "float32_scale": (dict(S=17, H=8), dict(G=1, q=32, scale_dtype=F32)),
    "odd_heads_H3_G3": (dict(S=11, H=3), dict(G=3, q=64)),
    "many_groups_H16_G16": (dict(S=9, H=16), dict(G=16, q=256, transpose=True)),
    "padded_col_scale": (dict(S=13, H=16), dict(G=2, q=64, transpose=True, scale_dtype=F32, scale_pad=3)),
}


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts(backend, name):
    make, run = LAYOUTS[name]
    check(*make_inputs(seed=len(name), **make), backend=backend, **run)


EXPERIMENTS = [  # (S, H, G, q, column-major scales, config, make_inputs keywords)
    (3, 16, 2, 128, False, {}, {}),
    (300, 16, 2, 128, False, dict(pdl=1), {}),
    (7, 8, 1, 64, True, dict(pdl=1, kernel=1), {}),
    (300, 16, 2, 64, True, dict(kernel=1), dict(cache_dtype=BF16)),
    (9, 16, 2, 32, False, dict(pdl=1, kernel=1), {}),
    (19, 16, 2, 128, False, dict(kernel=1), dict(o_offset=1)),  # outside the head kernel: the generic one
    (21, 8, 1, 256, False, dict(kernel=1), dict(cache_dtype=F16, cache_offset=3)),
]


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transpose", [False, True], ids=["row", "col"])
@pytest.mark.parametrize("q", [32, 128])
def test_nan_and_inf_stay_in_their_blocks(backend, q, transpose):
    o, p, c, s = make_inputs(6, 16, seed=5)
    o[0, 0, 3], o[1, 5, 500], o[2, 9, 130] = float("nan"), float("inf"), float("-inf")  # 500: the rope tail
    o[3, 2, 0:128] = 0.0
    check(o, p, c, s, 2, q, transpose, backend=backend)


def test_the_check_fails_a_stray_byte_and_a_wrong_scale(monkeypatch):
    """On the CPU, with stand-ins for the raw op: the reference passes ``check``; one more byte written after
    x_fp8, or one scale off by one, fails it."""
    import sys

    here = sys.modules[__name__]

    def stand_in(spoil):
        def config(o, p, c, s, x, sc, q, **kw):
            ref.inverse_rope_group_quant(o, p, c, s, x, sc, q)
            spoil(x, sc)
        return config

    def past_the_end(x, sc):
        torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())[x.storage_offset() + x.numel()] = 0

    def scale_off_by_one(x, sc):
        sc.view(torch.uint8)[0, 0, 0] += 1

    inputs = make_inputs(3, 16, device=torch.device("cpu"))
    monkeypatch.setattr(here, "raw", stand_in(lambda x, sc: None))
    check(*inputs, 2, 128, config={}, x_offset=1)
    for spoil in (past_the_end, scale_off_by_one):
        monkeypatch.setattr(here, "raw", stand_in(spoil))
        with pytest.raises(AssertionError):
            check(*inputs, 2, 128, config={})


@gpu
@needs_cuda_kernel
@pytest.mark.parametrize("S,H,G,q,transpose,config,make", EXPERIMENTS,
                         ids=[f"S{e[0]}-H{e[1]}-G{e[2]}-g{e[3]}{'-col' if e[4] else ''}-"
                              + (",".join(f"{k}={v}" for k, v in {**e[5], **e[6]}.items()) or "default")
                              for e in EXPERIMENTS])
def test_launch_experiments(S, H, G, q, transpose, config, make):
    if config.get("pdl") and torch.cuda.get_device_capability(DEV) < (9, 0):
        pytest.skip("a programmatic dependent launch needs sm_90 or newer")
    check(*make_inputs(S, H, seed=S + q, **make), G, q, transpose, config=config)


def _cuda_head(o, p, c, s, x, sc, q, *, scale_layout="row"):
    fusedrope.inverse_rope_group_quant(o, p, c, s, x.shape[1], q, x_fp8=x, x_scale=sc, scale_layout=scale_layout,
                                       backend="cuda_head")


HEAD_LAYOUTS = [("group_major", torch.float8_e8m0fnu, "row"), ("group_major", torch.uint8, "col"),
                ("padded", F32, "col"), ("group_major", F32, "col")]


@gpu
@needs_cuda_kernel
@pytest.mark.parametrize("S", [5, 37, 300])
@pytest.mark.parametrize("x_layout,scale_dtype,scale_layout", HEAD_LAYOUTS,
                         ids=[f"{t[0]}-{t[2]}-{str(t[1])[6:]}" for t in HEAD_LAYOUTS])
def test_head_kernel_layouts(S, x_layout, scale_dtype, scale_layout):
    """The layouts only the head kernel writes, through the public op (backend="cuda_head"), on the DeepSeek-V4
    shapes: held to the contract, nothing outside the outputs written."""
    from irgq_layouts import DEEPSEEK, check_layout

    for (H, G), q in zip(DEEPSEEK.values(), (128, 32)):
        check_layout(QuantCase(S, H, G, quant_group_size=q), x_layout, scale_dtype, scale_layout, seed=S + q,
                     backend=_cuda_head, exact=False)


@gpu
@needs_cuda_kernel
@pytest.mark.parametrize("S,rows", [(13, 16), (3, 40)])
def test_head_kernel_zeroes_padding_rows(S, rows):
    """vLLM's scales: column-major fp32 with token rows past S (zeros), over a max-size buffer (L = rows + 5)."""
    o, p, c, s = make_inputs(S, 16, seed=rows)
    G, q, L = 2, 128, rows + 5
    buf = torch.full((G, 32, L), -3.0, device=DEV)
    x, scale = fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, x_scale=buf.permute(2, 0, 1)[:rows],
                                                  scale_layout="col", backend="cuda_head")
    xr, sr = fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, transpose_scale=True, backend="reference")
    assert_quant_close(x, scale[:S], xr, sr, rope_blocks(QuantCase(S, 16, G, 512, 64, q)))
    assert not buf[..., S:rows].any() and bool((buf[..., rows:] == -3.0).all())


@gpu
@needs_cuda_kernel
@pytest.mark.parametrize("S,H", [(0, 16), (3, 0)])
def test_raw_op_with_no_tokens_or_no_heads_returns_without_an_error(S, H):
    from fusedrope import cuda_ext

    cuda_ext.load()
    o = torch.zeros(S, H, 512, dtype=BF16, device=DEV)
    dg = H * 512 // 2
    x = torch.empty(S, 2, dg, dtype=torch.float8_e4m3fn, device=DEV)
    sc = torch.empty(S, 2, dg // 128, dtype=torch.uint8, device=DEV)
    c = torch.zeros(8, 32, device=DEV)
    torch.ops.fusedrope_cuda.inverse_rope_group_quant_out(o, torch.zeros(max(S, 1), dtype=torch.long, device=DEV),
                                                          c, c, x, sc, 128)


def dependent_launch_rounds(config, device=DEV, rounds=5, S=4096, tail=128) -> int:
    """How many of ``rounds`` fail: a plain call of ``config`` (the raw op, :func:`raw`) quantises S
    tokens and lets a dependent grid launch once its last blocks have issued their loads, before their stores; a
    small pdl=1 call then takes the fp8 bytes of the first call's last ``tail`` tokens (what those last blocks
    store), viewed as bf16, as its o. Both are queued behind a GPU sleep, so the second launches while the first
    still stores: it meets the contract against the reference on what the first wrote only if it waited. Each
    round negates the first call's o, which flips the sign bit of every fp8 byte it writes, so reading the round
    before's bytes fails too."""
    H, G, q = 16, 2, 128
    o, p, c, s = make_inputs(S, H, seed=77, device=device)
    x, sc = empty_quant_outputs(o, G, q)
    x.view(torch.uint8).fill_(0x11)  # not a freed buffer's bytes, which may hold what a round writes
    # the fp8 bytes are never 0x7F / 0xFF, so as bf16 they hold no NaN or Inf
    o2, p2 = x[S - tail:].view(BF16).view(tail // 2, H, 512), p[:tail // 2]
    x2, sc2 = empty_quant_outputs(o2, G, q)
    xr, sr = empty_quant_outputs(o2, G, q)
    blocks = rope_blocks(QuantCase(tail // 2, H, G, 512, 64, q))
    failed = 0
    for _ in range(rounds):
        o.neg_()
        x2.view(torch.uint8).fill_(GUARD)
        sc2.view(torch.uint8).fill_(GUARD)
        if device.type == "cuda":
            torch.cuda._sleep(2_000_000)  # about 1 ms: both calls are queued before the first one runs
        config(o, p, c, s, x, sc, q, pdl=0)
        config(o2, p2, c, s, x2, sc2, q, pdl=1)
        ref.inverse_rope_group_quant(o2, p2, c, s, xr, sr, q)
        try:
            assert_quant_close(x2, sc2, xr, sr, blocks)
        except AssertionError:
            failed += 1
    return failed


@gpu
@needs_cuda_kernel
@pytest.mark.parametrize("kernel", [0, 1], ids=["generic", "head"])
def test_a_dependent_launch_reads_what_the_kernel_before_it_wrote(kernel):

    if torch.cuda.get_device_capability(DEV) < (9, 0):
        pytest.skip("a programmatic dependent launch needs sm_90 or newer")
    assert dependent_launch_rounds(lambda *args, pdl=0: raw(*args, pdl=pdl, kernel=kernel)) == 0


def test_the_dependent_launch_check_fails_a_launch_that_does_not_wait():
    """On the CPU, with stand-ins for the raw op: one whose writes land at once passes every round; one whose
    plain call's writes land only after the pdl=1 call has read its o (a dependent launch that did not wait)
    fails every round."""
    def at_once(o, p, c, s, x, sc, q, pdl=0):
        ref.inverse_rope_group_quant(o, p, c, s, x, sc, q)

    pending = []

    def late(o, p, c, s, x, sc, q, pdl=0):
        if pdl == 0:
            xs, ss = x.clone(), sc.clone()
            ref.inverse_rope_group_quant(o, p, c, s, xs, ss, q)
            pending.append(lambda: (x.copy_(xs), sc.copy_(ss)))
            return
        read = o.clone()
        while pending:
            pending.pop()()
        ref.inverse_rope_group_quant(read, p, c, s, x, sc, q)

    cpu = torch.device("cpu")
    assert dependent_launch_rounds(at_once, cpu, rounds=3, S=8, tail=4) == 0
    assert dependent_launch_rounds(late, cpu, rounds=3, S=8, tail=4) == 3


# ------------------------------------------------------------------------------------------------------------
# bad inputs to the raw ops, in a child process: a crash (the H200 once segfaulted on one) fails that case only
# ------------------------------------------------------------------------------------------------------------
def reject_cases() -> dict:
    """Bad inputs to ``torch.ops.fusedrope_cuda.inverse_rope_group_quant_out*`` (reached only through misuse);
    most messages hold integers, the kind that once crashed a raw op."""
    from fusedrope import cuda_ext
    cuda_ext.load()
    S, H, G, q = 4, 16, 2, 128
    o, p, c, s = make_inputs(S, H)
    dg = H * 512 // G
    x = torch.empty(S, G, dg, dtype=torch.float8_e4m3fn, device=DEV)
    sc = torch.empty(S, G, dg // q, dtype=torch.uint8, device=DEV)
    o256 = o[..., :256].contiguous()
    op = torch.ops.fusedrope_cuda.inverse_rope_group_quant_out
    return {"fp32_o": lambda: op(o.float(), p, c, s, x, sc, q),
            "cpu_positions": lambda: op(o, p.cpu(), c, s, x, sc, q),
            "head_dim_256": lambda: op(o256, p, c, s, x[..., :dg // 2], sc[..., :dg // 2 // q], q),
            "group_48": lambda: op(o, p, c, s, x, sc, 48),
            "positions_short": lambda: op(o, p[:2], c, s, x, sc, q),
            "x_scale_shape": lambda: op(o, p, c, s, x, sc[:, :, :1], q),
            "x_scale_tokens_overlapping": lambda: op(o, p, c, s, x, sc.as_strided(sc.shape, (0, dg // q, 1)), q),
            "x_scale_column_lead_short": lambda: op(o, p, c, s, x, sc.as_strided(sc.shape, (1, dg // q * 2, 2)), q),
            "pdl_2": lambda: op(o, p, c, s, x, sc, q, 0, 2, 0),
            "kernel_2": lambda: op(o, p, c, s, x, sc, q, 0, 0, 2),
            "mfma_tile": lambda: op(o, p, c, s, x, torch.empty(2, 32, 32, dtype=torch.uint8, device=DEV), q, 1),
            "head_kernel_fp16_group_major": lambda: op(o.half(), p, c, s, x.transpose(0, 1).contiguous()
                                                       .transpose(0, 1), sc, q)}


REJECTS = ("fp32_o", "cpu_positions", "head_dim_256", "group_48", "positions_short", "x_scale_shape",
           "x_scale_tokens_overlapping", "x_scale_column_lead_short", "pdl_2", "kernel_2", "mfma_tile",
           "head_kernel_fp16_group_major")
@pytest.fixture(scope="module")
def rejected():
    return run_child(Path(__file__).stem, HERE)


@gpu
@needs_cuda_kernel
@pytest.mark.parametrize("name", REJECTS)
def test_raw_op_rejects_bad_inputs_without_crashing(rejected, name):
    failure = reject_failure(rejected, name)
    assert not failure, failure


STAND_INS = """
import os, signal
def raises(message):
    def call():
        raise RuntimeError(message)
    return call
def reject_cases():
    return {"named": raises("fusedrope_cuda::op: argument 'q' expected 64, got 96"), "unnamed": raises("other"),
            "silent": lambda: None, "crash": lambda: os.kill(os.getpid(), signal.SIGSEGV),
            "after": raises("fusedrope_cuda::op: not reached")}
"""


def test_the_reject_check_fails_a_crash_a_silent_call_and_an_unnamed_error(tmp_path):
    """On the CPU, with stand-in cases: a crash fails its own case and marks the rest not reached."""
    (tmp_path / "stand_ins.py").write_text(STAND_INS)
    child = run_child("stand_ins", tmp_path)
    got = {name: reject_failure(child, name) for name in ("named", "unnamed", "silent", "crash", "after")}
    assert got["named"] == "" and got["unnamed"].startswith("END unnamed other RuntimeError other"), got
    assert got["silent"].startswith("END silent no error raised"), got
    assert "died on this case" in got["crash"] and "never reached this case" in got["after"], got


# ------------------------------------------------------------------------------------------------------------
# CUDA graphs
# ------------------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H,G,S,q,transpose", [(16, 2, 1024, 128, False), (8, 1, 333, 32, True)],
                         ids=["H16-G2-S1024-g128-row", "H8-G1-S333-g32-col"])
def test_cuda_graph_replay_equals_eager(backend, H, G, S, q, transpose):
    from fusedrope.benchmark.timing import capture_graph

    o, p, c, s = make_inputs(S, H, seed=11)
    x_e, s_e = empty_quant_outputs(o, G, q, transpose)
    x_g, s_g = poison_like(x_e), poison_like(s_e)

    def call(x, sc):
        fusedrope.inverse_rope_group_quant(o, p, c, s, G, q, transpose, x, sc, backend=backend)

    call(x_g, s_g)  # warm-up (and Triton's compile) outside the capture
    x_g, s_g = poison_like(x_e), poison_like(s_e)
    graph = torch.cuda.CUDAGraph()
    capture_graph(graph, lambda i: call(x_g, s_g), 1)
    for new_inputs in (False, True):
        if new_inputs:
            o2, p2, _, _ = make_inputs(S, H, seed=12)
            o.copy_(o2), p.copy_(p2)
        graph.replay()
        call(x_e, s_e)
        assert torch.equal(x_g.view(torch.uint8), x_e.view(torch.uint8)), f"fp8 bytes, new inputs: {new_inputs}"
        assert torch.equal(s_g.view(torch.uint8), s_e.view(torch.uint8)), f"scale bytes, new inputs: {new_inputs}"
