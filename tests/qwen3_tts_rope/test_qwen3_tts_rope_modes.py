"""qwen3_tts_rope's ``numerics="eager"`` and ``positions=``, and qwen3_tts_qk_norm_rope, on every backend that
serves them: against the model's formulas written out here in plain PyTorch (not fusedrope's reference), on
fresh random data, into poisoned buffers, in place, with tables and clamped positions; their errors; selection;
torch.compile."""

from types import SimpleNamespace

import pytest
import torch

import fusedrope
from fusedrope.qwen3_tts_rope import REGISTRY, Facts
from fusedrope.qwen3_tts_rope import cuda as cuda_glue
from fusedrope.testing import TTS_CASES, TtsCase, make_tts_inputs, poison_like

from conftest import DEVICE, backends_here, gpu

BACKENDS = backends_here("qwen3_tts_rope")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
CASES = [TtsCase("odd", 3, 5, 6, 2, 64), TtsCase("seed", 2, 16, 16, 8, 128)]


def rotate_half(x):  # as the modeling files write it
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def hf_rope(q, cos, sin):
    """transformers' / qwen-tts's apply_rotary_pos_emb for one tensor, evaluated in its dtype."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin)


def hf_rms_norm(x, weight, eps):
    """Qwen3RMSNorm / Qwen3TTSRMSNorm.forward."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def inputs(case, dtype, seed, cos_batch=None):
    return make_tts_inputs(case, dtype=dtype, device=DEVICE, seed=seed, random_cos_sin=True, cos_batch=cos_batch)


def _case_id(c):
    return c.id


# -- numerics="eager" -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_eager_is_bit_identical_to_the_formula_in_the_dtype(backend, dtype, case):
    """For numbers; a NaN in gives NaN out wherever the formula's does, but its sign and payload are not kept
    (Triton writes the canonical NaN, torch keeps them): docs/qwen3_tts_rope.md says so."""
    reason = REGISTRY.decide(REGISTRY.backend(backend), (DEVICE, dtype, case.head_dim, False, True))
    if reason:
        pytest.skip(reason)
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[dtype]
    for seed, cos_batch, nans in ((1, None, False), (2, 1, False), (3, None, True)):
        q, k, cos, sin = inputs(case, dtype, seed, cos_batch)
        if nans:
            q.view(bits)[0, 0, 0, 3] = -1  # all ones: a negative NaN with a full payload (0xFFFF in bf16)
            q[0, 1, 2, 40], k[0, 0, 1, 7], cos[0, 0, 5] = float("nan"), float("nan"), float("nan")
        for got, want in zip(fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager", backend=backend),
                             (hf_rope(q, cos, sin), hf_rope(k, cos, sin))):
            nan = torch.isnan(want)
            assert bool(nan.any()) == nans and torch.equal(torch.isnan(got), nan)
            assert torch.equal(got[~nan], want[~nan])


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_eager_differs_from_fp32_math_where_the_model_rounds_thrice(backend):
    """The switch does something: in bf16 a good share of fp32-math results differ from the model's."""
    if dict((b.values[0], b.marks) for b in BACKENDS)[backend]:
        pytest.skip("backend unavailable here")
    q, k, cos, sin = inputs(CASES[1], torch.bfloat16, 3)
    fp32 = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)[0]
    eager = fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager", backend=backend)[0]
    assert torch.equal(eager, hf_rope(q, cos, sin))
    assert (fp32 != eager).float().mean() > 0.01


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["inplace", "buffers"])
def test_eager_in_place_and_into_buffers(backend, how):
    case = CASES[0]
    q, k, cos, sin = inputs(case, torch.bfloat16, 4)
    want_q, want_k = hf_rope(q, cos, sin), hf_rope(k, cos, sin)
    if how == "inplace":
        got = fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager", inplace=True, backend=backend)
        assert got[0] is q and got[1] is k
    else:
        cache = poison_like(torch.empty(case.batch, case.num_kv_heads, 3 * case.seq_len, case.head_dim,
                                        dtype=k.dtype, device=DEVICE))
        k_view = cache[:, :, case.seq_len:2 * case.seq_len]
        got = fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager", q_out=poison_like(q), k_out=k_view,
                                       backend=backend)
        assert got[1] is k_view and torch.equal(cache[:, :, :case.seq_len].view(torch.int16),
                                                poison_like(cache[:, :, :case.seq_len]).view(torch.int16))
    assert torch.equal(got[0], want_q) and torch.equal(got[1], want_k)


# -- positions= -------------------------------------------------------------------------------------------------
def _tables(max_pos, head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.rand(max_pos, head_dim, generator=g) * 2 - 1).to(dtype).to(DEVICE) for _ in range(2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("numerics", ["fp32", "eager"])
@pytest.mark.parametrize("table_dtype", ["q", "fp32"])
@pytest.mark.parametrize("pos_shape", ["BS", "S"])
def test_positions_read_each_tokens_row(backend, numerics, table_dtype, pos_shape):
    """Against the same call on rows gathered here by hand, positions out of range clamped to the table."""
    case = CASES[0]
    q, k, _, _ = inputs(case, torch.bfloat16, 5)
    max_pos = 40
    cos_t, sin_t = _tables(max_pos, case.head_dim, q.dtype if table_dtype == "q" else torch.float32, 6)
    g = torch.Generator().manual_seed(7)
    shape = (case.batch, case.seq_len) if pos_shape == "BS" else (case.seq_len,)
    positions = torch.randint(-5, max_pos + 5, shape, generator=g, dtype=torch.int32).to(DEVICE)
    facts = (DEVICE, q.dtype, case.head_dim, False, numerics == "eager", True)
    if reason := REGISTRY.decide(REGISTRY.backend(backend), facts):
        pytest.skip(reason)
    got = fusedrope.qwen3_tts_rope(q, k, cos_t, sin_t, positions=positions, numerics=numerics, backend=backend)
    per_seq = positions.reshape(-1, case.seq_len).tolist()
    rows = torch.tensor([[min(max(p, 0), max_pos - 1) for p in seq] for seq in per_seq], device=DEVICE)
    cos, sin = cos_t[rows], sin_t[rows]
    if numerics == "eager":  # the model's rotary module hands the RoPE cos/sin in q's dtype
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        want = hf_rope(q, cos, sin), hf_rope(k, cos, sin)
    else:  # fp32 math on the table's values, one rounding: the fp32 formula, rounded once
        want = tuple(hf_rope(x.float(), cos.float(), sin.float()).to(x.dtype) for x in (q, k))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_positions_debug_switch_raises_instead_of_clamping(monkeypatch):
    case = CASES[0]
    q, k, _, _ = inputs(case, torch.bfloat16, 8)
    cos_t, sin_t = _tables(10, case.head_dim, q.dtype, 9)
    positions = torch.arange(case.seq_len, device=DEVICE) + 7  # 10.. out of range
    fusedrope.qwen3_tts_rope(q, k, cos_t, sin_t, positions=positions, backend="reference")  # clamped
    monkeypatch.setenv("FUSEDROPE_CHECK_POSITIONS", "1")
    with pytest.raises(ValueError, match=r"argument 'positions' expected values in \[0, max_pos=10\), got "
                                         r"positions\[3\]=10 \(2 out of range\)"):
        fusedrope.qwen3_tts_rope(q, k, cos_t, sin_t, positions=positions, backend="reference")


# -- qwen3_tts_qk_norm_rope ---------------------------------------------------------------------------------------
def _weights(head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple((1 + 0.3 * torch.randn(head_dim, generator=g)).to(dtype).to(DEVICE) for _ in range(2))


def model_norm_rope(q, k, qw, kw, cos, sin, eps):
    """The model's three modules: q_norm and k_norm on [B, S, H, D], the transpose, then the RoPE."""
    qn = hf_rms_norm(q.transpose(1, 2), qw, eps).transpose(1, 2)
    kn = hf_rms_norm(k.transpose(1, 2), kw, eps).transpose(1, 2)
    return hf_rope(qn, cos, sin), hf_rope(kn, cos, sin)


def _identical_share(got, want) -> float:
    return sum(int((g == w).sum()) for g, w in zip(got, want)) / sum(g.numel() for g in got)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_qk_norm_rope_matches_the_models_modules(backend, dtype, case):
    """At least 99.9% of elements bit-identical (the rest only where the fp32 variance's summation order
    differs); the reference backend, which is the model's code, every one."""
    if reason := REGISTRY.decide(REGISTRY.backend(backend), (DEVICE, dtype, case.head_dim, False, True, False, True)):
        pytest.skip(reason)
    q, k, cos, sin = inputs(case, dtype, 10)
    qw, kw = _weights(case.head_dim, dtype, 11)
    got = fusedrope.qwen3_tts_qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, backend=backend)
    want = model_norm_rope(q, k, qw, kw, cos, sin, 1e-6)
    share = _identical_share(got, want)
    assert share >= (1.0 if backend == "reference" else 0.999), f"{share:.5%} identical"
    for g, w in zip(got, want):  # where they differ, by a rounding step of the largest values at most
        assert (g.float() - w.float()).abs().max() <= 4 * torch.finfo(dtype).eps * w.float().abs().max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_qk_norm_rope_into_a_kv_cache_slice_in_place_and_with_positions(backend):
    case = CASES[0]
    dtype = torch.bfloat16
    if reason := REGISTRY.decide(REGISTRY.backend(backend), (DEVICE, dtype, case.head_dim, False, True, True, True)):
        pytest.skip(reason)
    q, k, _, _ = inputs(case, dtype, 12)
    qw, kw = _weights(case.head_dim, dtype, 13)
    cos_t, sin_t = _tables(64, case.head_dim, torch.float32, 14)
    positions = torch.arange(case.seq_len, device=DEVICE) + 20
    cos, sin = cos_t[positions][None].to(dtype), sin_t[positions][None].to(dtype)
    want = model_norm_rope(q, k, qw, kw, cos, sin, 1e-5)
    cache = poison_like(torch.empty(case.batch, case.num_kv_heads, 2 * case.seq_len, case.head_dim, dtype=dtype,
                                    device=DEVICE))
    q_out, k_out = fusedrope.qwen3_tts_qk_norm_rope(q, k, qw, kw, cos_t, sin_t, 1e-5, positions=positions,
                                                    k_out=cache[:, :, case.seq_len:], backend=backend)
    assert _identical_share((q_out, k_out), want) >= 0.999
    assert torch.equal(cache[:, :, :case.seq_len].view(torch.int16),
                       poison_like(cache[:, :, :case.seq_len]).view(torch.int16))
    q2, k2 = q.clone(), k.clone()
    got = fusedrope.qwen3_tts_qk_norm_rope(q2, k2, qw, kw, cos_t, sin_t, 1e-5, positions=positions, inplace=True,
                                           backend=backend)
    assert got[0] is q2 and torch.equal(q2, q_out) and torch.equal(k2, k_out)


def test_qk_norm_rope_with_fp32_numerics_rotates_the_models_norm_in_fp32():
    case = CASES[0]
    q, k, cos, sin = inputs(case, torch.bfloat16, 15)
    qw, kw = _weights(case.head_dim, torch.bfloat16, 16)
    got = fusedrope.qwen3_tts_qk_norm_rope(q, k, qw, kw, cos, sin, numerics="fp32", backend="reference")
    qn = hf_rms_norm(q.transpose(1, 2), qw, 1e-6).transpose(1, 2)
    assert torch.equal(got[0], hf_rope(qn.float(), cos.float(), sin.float()).to(torch.bfloat16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_inputs_run_nothing(backend):
    q = torch.zeros(2, 4, 0, 64, dtype=torch.bfloat16, device=DEVICE)
    k = torch.zeros(2, 2, 0, 64, dtype=torch.bfloat16, device=DEVICE)
    cos_t = sin_t = torch.zeros(8, 64, dtype=torch.bfloat16, device=DEVICE)
    w = torch.ones(64, dtype=torch.bfloat16, device=DEVICE)
    positions = torch.zeros(2, 0, dtype=torch.int64, device=DEVICE)
    q_out, k_out = fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w, cos_t, sin_t, positions=positions, backend=backend)
    assert q_out.shape == q.shape and k_out.shape == k.shape


# -- errors ----------------------------------------------------------------------------------------------------
def _ok():
    q, k, cos, sin = inputs(CASES[0], torch.bfloat16, 17)
    w = torch.ones(64, dtype=torch.bfloat16, device=DEVICE)
    return q, k, cos, sin, w


@pytest.mark.parametrize("change, exc, message", [
    (dict(numerics="fast"), ValueError, "argument 'numerics' expected 'fp32' or 'eager', got 'fast'"),
    (dict(positions="pos"), TypeError, "argument 'positions' expected a torch.Tensor, got str"),
    (dict(positions=torch.zeros(3, 5)), TypeError, "argument 'positions' expected dtype"),
    (dict(positions=torch.zeros(4, dtype=torch.int64)), ValueError, "argument 'positions' expected shape [3, 5] or [5]"),
    (dict(cos3d=True), ValueError, "argument 'cos' expected a 2-D tensor [max_pos, D] (a table, with positions=)"),
    (dict(table=torch.zeros(0, 64)), ValueError, "argument 'cos' expected shape [1, 64], got [0, 64]"),
    (dict(table=torch.zeros(9, 64, dtype=torch.float16)), TypeError, "argument 'cos' expected dtype"),
    (dict(eps=-1.0), ValueError, "argument 'eps' expected a float >= 0, got -1.0"),
    (dict(eps="1e-6"), TypeError, "argument 'eps' expected a float >= 0, got '1e-6'"),
    (dict(w=torch.ones(32, dtype=torch.bfloat16)), ValueError, "argument 'q_norm_weight' expected shape [64], got [32]"),
    (dict(w=torch.ones(64)), TypeError, "argument 'q_norm_weight' expected dtype bfloat16, got float32"),
    (dict(w=None), TypeError, "argument 'q_norm_weight' expected a torch.Tensor, got NoneType"),
    (dict(enable_pdl=1), TypeError, "argument 'enable_pdl' expected a bool, got int 1"),
])
def test_bad_mode_arguments_name_the_argument(change, exc, message):
    q, k, cos, sin, w = _ok()
    kwargs = {n: change[n] for n in ("numerics", "eps", "enable_pdl") if n in change}
    if "positions" in change or "cos3d" in change or "table" in change:
        table = change.get("table", torch.zeros(9, 64, dtype=torch.bfloat16))
        cos = sin = table.to(DEVICE) if "cos3d" not in change else cos
        kwargs["positions"] = change.get("positions", torch.zeros(5, dtype=torch.int64))
        if isinstance(kwargs["positions"], torch.Tensor):
            kwargs["positions"] = kwargs["positions"].to(DEVICE)
    if "table" in change:
        sin = sin.clone()
    w = change.get("w", w)
    w = w.to(DEVICE) if isinstance(w, torch.Tensor) else w
    with pytest.raises(exc) as e:
        fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w, cos, sin, **kwargs, backend="reference")
    assert message in str(e.value) and str(e.value).startswith("qwen3_tts_rope:")


def test_inplace_refuses_a_norm_weight_inside_q():
    q, k, cos, sin, _ = _ok()
    w = q[0, 0, 0]  # the weight is q's first row: writing q would change it mid-call
    with pytest.raises(ValueError, match="'q_norm_weight'"):
        fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w, cos, sin, inplace=True, backend="reference")


# -- enable_pdl -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["new", "inplace", "buffers", "norm"])
def test_enable_pdl_is_a_launch_hint_that_changes_no_byte(backend, how):
    if reason := REGISTRY.decide(REGISTRY.backend(backend), Facts(DEVICE, torch.bfloat16, 64, how == "inplace",
                                                                  norm=how == "norm", pdl=True)):
        pytest.skip(reason)
    q, k, cos, sin, w = _ok()
    for pdl in (True, False, None):
        if how == "norm":
            got = fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w, cos, sin, enable_pdl=pdl, backend=backend)
        elif how == "inplace":
            got = fusedrope.qwen3_tts_rope(q.clone(), k.clone(), cos, sin, inplace=True, enable_pdl=pdl,
                                           backend=backend)
        else:
            bufs = dict(q_out=poison_like(q), k_out=poison_like(k)) if how == "buffers" else {}
            got = fusedrope.qwen3_tts_rope(q, k, cos, sin, enable_pdl=pdl, backend=backend, **bufs)
        if pdl is True:
            first = got
        assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])


def test_enable_pdl_selection():
    """The cuda kernel launches with pdl on sm_90+ and says why not before (registered backends decline it: below)."""
    facts = Facts(torch.device("cuda"), torch.bfloat16, 128, False, pdl=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(major=8, minor=0))
        assert cuda_glue.supports(facts) == "cuda kernel launches with enable_pdl=True on sm_90 or newer, this " \
                                            "device is sm_80"
        mp.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(major=10, minor=0))
        assert cuda_glue.supports(facts) is None and cuda_glue.opt_in(facts) is None  # the caller's own opt-in


# -- selection ----------------------------------------------------------------------------------------------
def test_the_cuda_kernel_serves_the_modes_when_named():
    """Its modes' kernels are opt-in: auto passes over them with the reason, a call naming cuda runs them."""
    cuda = REGISTRY.backend("cuda")
    for flags in ((True, False, False), (False, True, False), (False, False, True)):
        facts = Facts(torch.device("cuda"), torch.bfloat16, 128, False, *flags)
        assert cuda_glue.supports(facts) is None
        assert cuda.opt_in(facts) == cuda_glue.MODES_OPT_IN and "kernels_cuda/README.md" in cuda.opt_in(facts)
    plain = Facts(torch.device("cuda"), torch.bfloat16, 128, False)
    assert cuda_glue.supports(plain) is None and cuda.opt_in(plain) is None


def test_registered_backends_get_plain_calls_only():
    calls = []
    fusedrope.register_backend("qwen3_tts_rope", "mine", lambda *a: calls.append(len(a)))
    try:
        q, k, cos, sin, w = _ok()
        fusedrope.qwen3_tts_rope(q, k, cos, sin)
        assert calls == [6]
        fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager")
        fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w, cos, sin)
        assert calls == [6]  # both went to a built-in backend
        assert "a registered backend serves numerics='fp32'" in str(
            fusedrope.explain("qwen3_tts_qk_norm_rope", q, k, w, w, cos, sin))
        with pytest.raises(fusedrope.BackendUnavailableError, match="backend 'mine' cannot run these inputs"):
            fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager", backend="mine")
        with pytest.raises(fusedrope.BackendUnavailableError, match="without positions=, norm or enable_pdl"):
            fusedrope.qwen3_tts_rope(q, k, cos, sin, enable_pdl=True, backend="mine")
        assert calls == [6]
    finally:
        REGISTRY.unregister("mine")


# -- torch.compile ----------------------------------------------------------------------------------------------
def test_modes_compile_with_fullgraph():
    q, k, cos, sin, w = _ok()
    cos_t, sin_t = _tables(16, 64, torch.bfloat16, 18)
    positions = torch.arange(5, device=DEVICE)

    def f(q, k, cos, sin, w, cos_t, sin_t, positions):
        a = fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager", enable_pdl=True, backend="reference")
        b = fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w, cos_t, sin_t, positions=positions, backend="reference")
        return a + b

    args = (q, k, cos, sin, w, cos_t, sin_t, positions)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    want = f(*args)
    assert all(torch.equal(g, h) for g, h in zip(got, want))


# -- on a GPU: against PyTorch's own GPU kernels, the seed matrix ------------------------------------------------
@gpu
@pytest.mark.parametrize("backend", ["auto", "cuda"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_seed_matrix_against_torch_on_the_gpu(dtype, backend):
    """On the device the model runs on: eager numerics and the table path bit-identical to PyTorch's formula,
    the fused norm+RoPE at least 99.9% identical to PyTorch's norm and RoPE (whose rsqrt and summation order
    are the GPU's); by auto's choice and by the cuda kernel (opt-in)."""
    if backend != "auto" and (reason := REGISTRY.decide(REGISTRY.backend(backend), (DEVICE, dtype, 128, False))):
        pytest.skip(reason)
    same = total = 0
    for case in (c for c in TTS_CASES if c.batch <= 8):
        q, k, cos, sin = make_tts_inputs(case, dtype=dtype, device=DEVICE, seed=case.seed)
        got = fusedrope.qwen3_tts_rope(q, k, cos, sin, numerics="eager", backend=backend)
        assert torch.equal(got[0], hf_rope(q, cos, sin)) and torch.equal(got[1], hf_rope(k, cos, sin)), case.id
        tables = cos.reshape(-1, case.head_dim), sin.reshape(-1, case.head_dim)
        positions = torch.arange(case.batch * case.seq_len, device=DEVICE).view(case.batch, case.seq_len)
        by_table = fusedrope.qwen3_tts_rope(q, k, *tables, positions=positions, numerics="eager", backend=backend)
        assert all(torch.equal(a, b) for a, b in zip(by_table, got)), case.id
        qw, kw = _weights(case.head_dim, dtype, case.seed + 1)
        fused = fusedrope.qwen3_tts_qk_norm_rope(q, k, qw, kw, cos, sin, backend=backend)
        want = model_norm_rope(q, k, qw, kw, cos, sin, 1e-6)
        same += sum(int((a == b).sum()) for a, b in zip(fused, want))
        total += sum(a.numel() for a in want)
    assert same / total >= 0.999, f"{same / total:.5%} identical"
