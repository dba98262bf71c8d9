"""The compiled plain-call checks (fusedrope/csrc/fast_checks.cpp) against the Python validation: they accept the
valid plain calls the Python path would run, with its selection key and outputs laid out as it allocates them,
and return None for everything else, bad input included (the Python path then names what is wrong)."""

import contextlib
import functools
import os
import subprocess
import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fusedrope
from fusedrope import fast_checks
from fusedrope.qwen3_tts_rope import PLAIN, Modes, Facts as TTS_FACTS, validate as tts_validate
from fusedrope.testing import QuantCase, deepseek_rope_cache, make_quant_inputs, to_device_keeping_layout
from conftest import gpu
from test_errors import QUANT_CASES, QUANT_UNREADABLE, TTS_CASES, TTS_UNREADABLE, UNREADABLE

QUANT = sys.modules["fusedrope.inverse_rope_group_quant"]
bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture(scope="module")
def compiled():
    module = fast_checks.load()
    if module is fast_checks.Python:
        from fusedrope.jit_ext import build_fast_checks

        try:
            build_fast_checks()
        except RuntimeError as e:
            pytest.skip(f"the compiled checks cannot be built here: {e}")
        module = fast_checks.load()
    # each op passes its Facts class first, which the key is made of
    return types.SimpleNamespace(qwen3_tts_rope=functools.partial(module.qwen3_tts_rope, TTS_FACTS),
                                 tts_facts=functools.partial(module.tts_facts, TTS_FACTS),
                                 inverse_rope_group_quant=functools.partial(module.inverse_rope_group_quant,
                                                                            QUANT.Facts), readable=module.readable)


@contextlib.contextmanager
def python_path():
    """The Python validation alone (validate calls the compiled checks where they are built)."""
    checks, fast_checks.checks = fast_checks.checks, fast_checks.Python
    try:
        yield
    finally:
        fast_checks.checks = checks


def python_key(*args, **kwargs):
    """op 1's selection key from the Python checker, or None where it raises."""
    with python_path():
        try:
            return tts_validate(*args, **kwargs)
        except (TypeError, ValueError):
            return None


@pytest.fixture
def python_checks(monkeypatch):
    """The public functions without the compiled checks, as without a build."""
    monkeypatch.setattr(fast_checks, "checks", fast_checks.Python)


def quant_args(o, positions, cos_cache, sin_cache, num_groups, quant_group_size=128, transpose_scale=False):
    return o, positions, cos_cache, sin_cache, num_groups, quant_group_size, transpose_scale


def python_quant(args):
    """The Python path's key and new outputs for a plain call."""
    key, fp8, scale = QUANT.validate(*args)
    o, _, _, _, num_groups, group_size, _ = args
    return key, QUANT._outputs(o, num_groups, group_size, key.scale_layout, fp8, scale, True, None, None)


# -- bad input: always left to the Python checks, which raise ---------------------------------------------------
@pytest.mark.parametrize("name", TTS_CASES)
def test_bad_tts_input_is_left_to_python(compiled, name):
    args = TTS_CASES[name][0]
    assert compiled.qwen3_tts_rope(args["q"], args["k"], args["cos"], args["sin"]) is None


@pytest.mark.parametrize("name", [n for n, ((a, kw), _, _) in QUANT_CASES.items()
                                  if not kw and a["x_fp8"] is None and a["x_scale"] is None])
def test_bad_quant_input_is_left_to_python(compiled, name):
    (args, _), _, _ = QUANT_CASES[name]
    assert compiled.inverse_rope_group_quant(*quant_args(**{n: v for n, v in args.items() if n[:2] != "x_"})) is None


@pytest.mark.parametrize("kind, arg", [*TTS_UNREADABLE, *QUANT_UNREADABLE])
def test_tensors_whose_memory_is_not_their_values_are_left_to_python(compiled, kind, arg):
    """Negative views, ZeroTensors and dual tensors (test_errors.UNREADABLE): the compiled checks of plain calls
    refuse them, and their ``readable`` answers as the Python path's :func:`_validation.readable` does."""
    make, context, _, _ = UNREADABLE[kind]
    tts, quant = _tts(), _quant()
    with context():
        for names, args, check in ((("q", "k", "cos", "sin"), tts, compiled.qwen3_tts_rope),
                                   (("o", "positions", "cos_cache", "sin_cache"), quant,
                                    compiled.inverse_rope_group_quant)):
            if arg in names:
                assert check(*args) is not None
                i = names.index(arg)
                assert check(*args[:i], make(args[i]), *args[i + 1:]) is None
        t = make(tts[0])
        assert compiled.readable(t) is False and fusedrope._validation.readable(t) is False
        assert compiled.readable(tts[0], None, t) is False and fusedrope._validation.readable(tts[0], None, t) is False
        assert compiled.readable(*tts, None) is True and fusedrope._validation.readable(*tts, None) is True


# -- valid plain calls: the Python path's key, outputs and results -----------------------------------------------
def _tts(B=2, Hq=4, Hkv=2, S=3, D=8, dtype=bf16, cos_batch=None, layout="dense"):
    g = torch.Generator().manual_seed(B * 1000 + Hq * 100 + S * 10 + D)
    cb = B if cos_batch is None else cos_batch
    if layout == "qkv":  # q and k heads of one fused projection [B, S, Hq + Hkv, D], cos/sin rows strided
        qkv = torch.randn(B, S, Hq + Hkv, D, generator=g).to(dtype)
        q, k = qkv[:, :, :Hq].transpose(1, 2), qkv[:, :, Hq:].transpose(1, 2)
        cs = torch.randn(cb, S, 2 * D, generator=g).to(dtype)
        return q, k, cs[..., :D], cs[..., D:]
    return (torch.randn(B, Hq, S, D, generator=g).to(dtype), torch.randn(B, Hkv, S, D, generator=g).to(dtype),
            torch.randn(cb, S, D, generator=g).to(dtype), torch.randn(cb, S, D, generator=g).to(dtype))


TTS_VALID = {
    "bf16": _tts(), "fp16": _tts(dtype=f16), "fp32": _tts(dtype=f32), "cos broadcast": _tts(cos_batch=1),
    "fused qkv": _tts(layout="qkv"), "odd sizes": _tts(B=1, Hq=3, Hkv=1, S=5, D=2), "no k heads": _tts(Hkv=0),
    "B=1 with cos batch 1": _tts(B=1, cos_batch=1, dtype=f32),
}


@pytest.mark.parametrize("name", TTS_VALID)
def test_valid_tts_call_gets_the_python_key_outputs_and_results(compiled, name, monkeypatch):
    q, k, cos, sin = TTS_VALID[name]
    key, q_out, k_out = compiled.qwen3_tts_rope(q, k, cos, sin)
    assert key == python_key(q, k, cos, sin) == compiled.tts_facts(q, k, cos, sin, False, *PLAIN.op_args()[:6])
    for out, src in ((q_out, q), (k_out, k)):
        assert (out.shape, out.dtype, out.device) == (src.shape, src.dtype, src.device) and out.is_contiguous()
    fast = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")
    monkeypatch.setattr(fast_checks, "checks", fast_checks.Python)
    slow = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")
    for a, b in zip(fast, slow):
        assert torch.equal(a, b) and a.stride() == b.stride()


def _quant(S=3, H=4, D=128, groups=2, group_size=128, dtype=bf16, cache_dtype=f32, positions=torch.int64,
           extra_positions=0, max_pos=64, halves=False, transpose=False, row_stride=None):
    o, pos, cos, sin = make_quant_inputs(QuantCase(S, H, groups, head_dim=D, quant_group_size=group_size), dtype,
                                         cache_dtype, max_pos=max_pos, positions_dtype=positions)
    pos = torch.cat([pos, pos[:extra_positions]]) if extra_positions else pos
    if halves:  # both from one [max_pos, rope_dim] cos||sin cache: apart
        cache = torch.cat([cos, sin], dim=1)
        cos, sin = cache[:, :cos.shape[1]], cache[:, cos.shape[1]:]
    if row_stride:  # one cache row: its stride addresses nothing and may be anything
        cos, sin = (t.as_strided((1, t.shape[1]), (row_stride, 1)) for t in (cos, sin))
    return quant_args(o, pos, cos, sin, groups, group_size, transpose)


QUANT_VALID = {
    "row": _quant(), "col": _quant(transpose=True), "fp16, bf16 cache": _quant(dtype=f16, cache_dtype=bf16),
    "fp16 cache, int32 positions": _quant(cache_dtype=f16, positions=torch.int32),
    "more positions than tokens": _quant(extra_positions=2), "halves of one cache": _quant(halves=True),
    "one cache row": _quant(max_pos=1, halves=True), "one row, any stride": _quant(max_pos=1, row_stride=2 ** 62),
    "group 32, 4 groups": _quant(group_size=32, groups=4),
    "group 256, one group": _quant(group_size=256, groups=1, transpose=True), "one token": _quant(S=1),
    "group 64, col": _quant(S=5, group_size=64, transpose=True),
}


@pytest.mark.parametrize("name", QUANT_VALID)
def test_valid_quant_call_gets_the_python_key_outputs_and_results(compiled, name, monkeypatch):
    args = QUANT_VALID[name]
    key, x_fp8, x_scale = compiled.inverse_rope_group_quant(*args)
    want_key, want_outputs = python_quant(args)
    assert key == want_key
    for got, want in zip((x_fp8, x_scale), want_outputs):
        assert (got.shape, got.stride(), got.dtype, got.device) == (want.shape, want.stride(), want.dtype,
                                                                    want.device)
        assert got.untyped_storage().nbytes() == want.untyped_storage().nbytes()
    fast = fusedrope.inverse_rope_group_quant(*args, backend="reference")
    monkeypatch.setattr(fast_checks, "checks", fast_checks.Python)
    slow = fusedrope.inverse_rope_group_quant(*args, backend="reference")
    for a, b in zip(fast, slow):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) and a.stride() == b.stride()


@gpu
@pytest.mark.parametrize("op", ["tts", "quant"])
def test_on_the_gpu_both_paths_give_the_same_bytes(compiled, op, monkeypatch):
    """CUDA tensors: the compiled checks' key and CUDA allocations, and the results of the backend auto picks, as
    on the Python path (the gpu step of gpu/run.sh runs this after building the checks)."""
    dev = torch.device("cuda")
    cases = TTS_VALID if op == "tts" else QUANT_VALID
    fn = fusedrope.qwen3_tts_rope if op == "tts" else fusedrope.inverse_rope_group_quant
    check = compiled.qwen3_tts_rope if op == "tts" else compiled.inverse_rope_group_quant
    for name, args in cases.items():
        args = tuple(to_device_keeping_layout(a, dev) if isinstance(a, torch.Tensor) else a for a in args)
        key, *outputs = check(*args)
        assert key.device == dev and all(o.device == dev for o in outputs), name
        monkeypatch.setattr(fast_checks, "checks", compiled)
        fast = fn(*args)
        monkeypatch.setattr(fast_checks, "checks", fast_checks.Python)
        slow = fn(*args)
        for a, b in zip(fast, slow):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) and a.stride() == b.stride(), name


# -- valid calls that are not plain: left to the Python path, which serves them -----------------------------------
class _Mode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_calls_the_python_path_serves_are_left_to_it(compiled):
    q, k, cos, sin = _tts()
    meta = [t.to("meta") for t in (q, k, cos, sin)]
    refused = {
        "meta": meta, "a Parameter": (torch.nn.Parameter(q), k, cos, sin),
        "requires grad": (q.clone().requires_grad_(), k, cos, sin), "no work": _tts(Hq=0, Hkv=0),
        "a wrong argument count": (q, k, cos),
    }
    for name, args in refused.items():
        assert compiled.qwen3_tts_rope(*args) is None, name
    with torch.no_grad():
        assert compiled.qwen3_tts_rope(q.clone().requires_grad_(), k, cos, sin) is not None
    with _Mode():
        assert compiled.qwen3_tts_rope(q, k, cos, sin) is None

    args = _quant()
    o, pos, cs, sn = args[:4]
    one_cache = torch.zeros(64, 48)
    refused = {
        "meta": quant_args(*[t.to("meta") for t in args[:4]], 2), "no tokens": _quant(S=0),
        "o requires grad": (o.clone().requires_grad_(), *args[1:]), "a bool num_groups": (*args[:4], True, 128, False),
        "overlapping caches": (o, pos, one_cache[:, :32], one_cache[:, 16:], 2), "cos is sin": (o, pos, cs, cs, 2),
        "rows of two strides": (o, pos, cs, torch.cat([sn] * 3, 1)[:, :sn.shape[1]], 2),
        "a huge group count": (*args[:4], 2 ** 70, 128, False),
    }
    for name, a in refused.items():
        a = quant_args(*a) if len(a) < 7 else a
        assert compiled.inverse_rope_group_quant(*a) is None, name
    with torch.no_grad():
        assert compiled.inverse_rope_group_quant(o.clone().requires_grad_(), *args[1:]) is not None


def test_rows_of_two_strides_still_get_the_python_answer(compiled):
    """Caches whose rows the compiled check cannot compare are left to Python's exact test, which accepts
    these (apart) and refuses overlap."""
    o, pos, cos, sin = _quant()[:4]
    wide = torch.cat([sin] * 3, 1)[:, :sin.shape[1]]
    assert wide.stride(0) != cos.stride(0)
    assert compiled.inverse_rope_group_quant(*quant_args(o, pos, cos, wide, 2)) is None
    x, _ = fusedrope.inverse_rope_group_quant(o, pos, cos, wide, 2, backend="reference")
    assert torch.equal(x.view(torch.uint8),
                       fusedrope.inverse_rope_group_quant(o, pos, cos, sin.clone(), 2, backend="reference")[0]
                       .view(torch.uint8))


# -- any metadata: the compiled checks accept exactly what the Python validation accepts ---------------------------
DTYPES = (bf16, f16, f32, torch.float64, torch.int32)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_tts_checks_agree_with_python_on_any_metadata(compiled, data):
    draw = data.draw
    B, Hq, Hkv, S, D = (draw(st.integers(0, 3)) for _ in range(5))
    dims = {"q": [B, Hq, S, D], "k": [B, Hkv, S, D], "cos": [B, S, D], "sin": [B, S, D]}
    for name in dims:  # sometimes one size off, sometimes the broadcast batch
        if draw(st.booleans()):
            i = draw(st.integers(0, len(dims[name]) - 1))
            dims[name][i] = draw(st.sampled_from([1, dims[name][i] + 1, max(dims[name][i] - 1, 0)]))
    dtype = draw(st.sampled_from(DTYPES[:3]))
    tensors = []
    for name, shape in dims.items():
        t = torch.randn(*shape[:-1], shape[-1] * 2).to(draw(st.sampled_from((dtype,) * 4 + DTYPES)))
        tensors.append(t[..., ::2] if draw(st.integers(0, 5)) == 0 else t[..., :shape[-1]])
    want = python_key(*tensors)
    got = compiled.qwen3_tts_rope(*tensors)
    work = tensors[0].numel() or tensors[1].numel()
    assert (got[0] if got else None) == (want if work else None)
    assert compiled.tts_facts(*tensors, False, *PLAIN.op_args()[:6]) == want


BREAKS = ("numerics", "eps negative", "eps negative int", "eps nan", "eps bool", "eps str", "pdl int",
          "positions float", "positions shape", "positions str", "table dtype", "table width", "table empty",
          "cos 3-D", "sin short", "weight short", "weight dtype", "weight strided", "k weight missing", "D odd")


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_tts_facts_agree_with_python_on_any_mode(compiled, data):
    """Every call of either op-1 function takes tts_facts, its only fast accept path: the same key as the Python
    checker for the calls it accepts, None for every call the checker refuses (valid calls with at most one
    argument broken)."""
    draw = data.draw
    broken = draw(st.sampled_from(("",) * len(BREAKS) + BREAKS))
    B, Hq, Hkv, S = (draw(st.integers(0, 3)) for _ in range(4))
    D = 5 if broken == "D odd" else draw(st.sampled_from([2, 4, 8]))
    dtype = draw(st.sampled_from(DTYPES[:3]))
    q, k = torch.randn(B, Hq, S, D).to(dtype), torch.randn(B, Hkv, S, D).to(dtype)
    table = draw(st.booleans()) or broken.startswith(("positions", "table", "cos"))
    if table and broken != "cos 3-D":
        rows = 0 if broken == "table empty" else draw(st.integers(1, 5))
        cos = torch.randn(rows, D + 2 * (broken == "table width")).to(
            torch.float64 if broken == "table dtype" else draw(st.sampled_from([dtype, f32])))
    else:
        cos = torch.randn(draw(st.sampled_from([B, 1])), S, D).to(dtype)
    sin = cos[..., :1] if broken == "sin short" else cos.clone()
    positions = None
    if table:
        shape = draw(st.sampled_from([(B, S), (S,)])) if broken != "positions shape" else (S + 1,)
        positions = ("pos" if broken == "positions str" else
                     torch.zeros(shape, dtype=f32 if broken == "positions float" else draw(
                         st.sampled_from([torch.int64, torch.int32]))))
    qw = kw = None
    if draw(st.booleans()) or broken.startswith(("weight", "k weight", "eps")):
        qw = (torch.ones(D - 1, dtype=dtype) if broken == "weight short" else
              torch.ones(D, dtype=torch.float64) if broken == "weight dtype" else
              torch.ones(2 * D, dtype=dtype)[::2] if broken == "weight strided" else torch.ones(D, dtype=dtype))
        kw = None if broken == "k weight missing" else qw.clone()
    eps = {"eps negative": -1.0, "eps negative int": -1, "eps nan": float("nan"), "eps bool": True,
           "eps str": "1e-6"}.get(broken, draw(st.sampled_from([1e-6, 0.0, 0, 2])))
    numerics = "fast" if broken == "numerics" else draw(st.sampled_from(["fp32", "eager"]))
    pdl = 1 if broken == "pdl int" else draw(st.sampled_from([None, True, False]))
    modes, inplace = Modes(positions, numerics, qw, kw, eps, pdl), draw(st.booleans())
    want = python_key(q, k, cos, sin, inplace, modes)
    assert (want is None) == bool(broken)
    assert compiled.tts_facts(q, k, cos, sin, inplace, *modes.op_args()[:6]) == want


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_quant_checks_agree_with_python_on_any_metadata(compiled, data):
    draw = data.draw
    S, H = draw(st.integers(0, 3)), draw(st.integers(1, 3))
    D = draw(st.sampled_from([32, 64, 96, 128, 130]))
    max_pos, half = draw(st.integers(1, 4)), draw(st.sampled_from([8, 16, 40, 80]))
    o = torch.randn(S, H, D).to(draw(st.sampled_from((bf16, f16, f32))))
    if draw(st.integers(0, 5)) == 0:
        o = o.transpose(0, 1)
    positions = torch.zeros(draw(st.integers(0, 4)), dtype=draw(st.sampled_from((torch.int64, torch.int32,
                                                                                    torch.int16))))
    cos = deepseek_rope_cache(max_pos, 2 * half, dtype=draw(st.sampled_from((f32, bf16, f16))))[0]
    sin = {"copy": cos.clone(), "other dtype": cos.to(torch.float64), "one row short": cos[:-1].clone(),
           "strided": torch.cat([cos, cos], 1)[:, ::2][:, :half]}[draw(st.sampled_from(["copy", "copy", "other dtype",
                                                                                    "one row short", "strided"]))]
    args = quant_args(o, positions, cos, sin, draw(st.sampled_from([1, 2, 3, 4, 0, -1])),
                      draw(st.sampled_from([32, 64, 128, 256, 16])), draw(st.sampled_from([False, True, 0])))
    try:
        want = QUANT.validate(*args)[0]
        QUANT._refuse_one_cache(cos, sin)
    except (TypeError, ValueError):
        want = None
    got = compiled.inverse_rope_group_quant(*args)
    comparable = max_pos == 1 or sin.stride(0) == cos.stride(0)  # else the compiled check leaves overlap to Python
    assert (got[0] if got else None) == (want if o.numel() and comparable else None)


# -- loading ---------------------------------------------------------------------------------------------------
def test_without_a_loadable_build_every_call_takes_the_python_path(compiled, monkeypatch, tmp_path):
    broken = tmp_path / "fusedrope_fast_checks_broken.so"
    broken.write_bytes(b"not a library")
    try:
        for path in (tmp_path / "missing.so", broken):
            monkeypatch.setattr(fast_checks, "library_path", lambda: path)
            assert fast_checks.load(again=True) is fast_checks.Python
            q, k, cos, sin = _tts()
            assert fast_checks.checks.qwen3_tts_rope(TTS_FACTS, q, k, cos, sin) is None
            torch.testing.assert_close(fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference"),
                                       fusedrope.reference.qwen3_tts_rope_oracle(q, k, cos, sin), check_dtype=False,
                                       atol=1e-2, rtol=1e-2)
    finally:
        monkeypatch.undo()
        assert fast_checks.load(again=True) is not fast_checks.Python


def test_the_build_is_named_by_its_source_and_torch(monkeypatch, tmp_path):
    names = [fast_checks.library_path().stem]
    source = tmp_path / "fast_checks.cpp"
    source.write_bytes(fast_checks.SOURCE.read_bytes() + b"// changed\n")
    monkeypatch.setattr(fast_checks, "SOURCE", source)
    names.append(fast_checks.library_path().stem)
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    names.append(fast_checks.library_path().stem)
    assert len(set(names)) == 3


FIRST_CALL = r"""
import torch, fusedrope
from fusedrope import fast_checks
from fusedrope.__main__ import machine
q, c = torch.randn(1, 2, 3, 8), torch.randn(1, 3, 8)
out = fusedrope.qwen3_tts_rope(q, q[:, :1], c, c, backend="reference")  # the first call loads the build, or not
assert torch.equal(out[0], fusedrope.qwen3_tts_rope(q, q[:, :1], c, c, backend="reference")[0])
print("path:", "python" if fast_checks.checks is fast_checks.Python else "compiled")
machine()
"""


def _damage(data: bytes, how: str) -> bytes:
    if how == "truncated":  # as an interrupted link leaves it: the loader maps pages past the end (SIGBUS)
        return data[:len(data) // 2]
    if how == "corrupted":  # bytes overwritten: code and relocations the loader would run (SIGSEGV)
        n = len(data)
        return data[:n // 8] + b"\xff" * (n // 2 - n // 8) + data[n // 2:]
    return data


@pytest.mark.parametrize("how", ["intact", "truncated", "corrupted", "no digest"])
def test_a_damaged_build_takes_the_python_path_and_the_report_says_so(compiled, how, tmp_path, monkeypatch):
    """A damaged library in the build folder is never loaded (that would kill the process): the first call, in a
    process of its own, takes the Python path, and ``python -m fusedrope``'s report says why."""
    built = fast_checks.library_path()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    path = fast_checks.library_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(_damage(built.read_bytes(), how))
    if how != "no digest":
        digest = built.with_name(built.name + fast_checks.DIGEST)
        path.with_name(path.name + fast_checks.DIGEST).write_bytes(digest.read_bytes())
    run = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, env=dict(os.environ),
                         timeout=300)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    if how == "intact":
        assert "path: compiled" in run.stdout and "Compiled checks of the plain calls: built" in run.stdout
        return
    why = "there is none" if how == "no digest" else "a truncated or corrupted file"
    assert "path: python" in run.stdout
    assert f"Compiled checks of the plain calls: not loaded: {path} does not match the digest written at build time" \
           in run.stdout and why in run.stdout


def test_the_build_replaces_a_file_whole_or_not_at_all(tmp_path, monkeypatch):
    """The library and its digest are written under a temporary name, then renamed: a write that fails midway
    leaves what was there, and no temporary file."""
    from fusedrope import jit_ext

    target = tmp_path / "lib.so"
    target.write_bytes(b"old")

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        jit_ext._write_whole(target, b"new bytes")
    assert target.read_bytes() == b"old" and sorted(tmp_path.iterdir()) == [target]
    monkeypatch.undo()
    jit_ext._write_whole(target, b"new bytes")
    assert target.read_bytes() == b"new bytes" and sorted(tmp_path.iterdir()) == [target]
