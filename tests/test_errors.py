"""Bad input raises a clear exception naming the argument, what was expected and what was given."""

import contextlib
import functools
import re

import numpy as np
import pytest
import torch
from torch.autograd import forward_ad as fwAD

import fusedrope
from fusedrope.testing import QuantCase, make_quant_inputs

bf16 = torch.bfloat16


def tts_inputs(B=2, HQ=4, HKV=2, S=3, D=8, dtype=bf16):
    return (torch.randn(B, HQ, S, D).to(dtype), torch.randn(B, HKV, S, D).to(dtype),
            torch.randn(B, S, D).to(dtype), torch.randn(B, S, D).to(dtype))


def tts_bad(**change):
    q, k, cos, sin = tts_inputs()
    args = dict(q=q, k=k, cos=cos, sin=sin)
    args.update({n: (v(args[n]) if callable(v) else v) for n, v in change.items()})
    return args


TTS_CASES = {
    "q not a tensor": (tts_bad(q=[1.0]), TypeError, "argument 'q' expected a torch.Tensor, got list"),
    "q 3-D": (tts_bad(q=lambda t: t[0]), ValueError,
              "argument 'q' expected a 4-D tensor [B, Hq, S, D], got 3-D shape [4, 3, 8]"),
    "k 5-D": (tts_bad(k=lambda t: t[None]), ValueError, "argument 'k' expected a 4-D tensor [B, Hkv, S, D]"),
    "cos 2-D": (tts_bad(cos=lambda t: t[0]), ValueError, "argument 'cos' expected a 3-D tensor [B or 1, S, D]"),
    "odd D": (tts_bad(q=torch.randn(2, 4, 3, 7).to(bf16), k=torch.randn(2, 2, 3, 7).to(bf16),
                      cos=torch.randn(2, 3, 7).to(bf16), sin=torch.randn(2, 3, 7).to(bf16)), ValueError,
              "argument 'q' expected an even head_dim D >= 2 (last dim), got D=7"),
    "k batch": (tts_bad(k=lambda t: t[:1]), ValueError, "argument 'k' expected shape [2, Hkv, 3, 8], got [1, 2, 3, 8]"),
    "k seq": (tts_bad(k=lambda t: t[:, :, :2]), ValueError, "argument 'k' expected shape [2, Hkv, 3, 8], got [2, 2, 2, 8]"),
    "k head_dim": (tts_bad(k=torch.randn(2, 2, 3, 6).to(bf16)), ValueError, "argument 'k' expected shape [2, Hkv, 3, 8]"),
    "cos batch": (tts_bad(cos=torch.randn(3, 3, 8).to(bf16)), ValueError,
                  "argument 'cos' expected shape [2 or 1, 3, 8], got [3, 3, 8]"),
    "cos batch, B=1": (tts_bad(q=lambda t: t[:1], k=lambda t: t[:1], cos=torch.randn(2, 3, 8).to(bf16)), ValueError,
                       "argument 'cos' expected shape [1, 3, 8], got [2, 3, 8]"),
    "cos seq": (tts_bad(cos=lambda t: t[:, :2]), ValueError, "argument 'cos' expected shape [2, 3, 8], got [2, 2, 8]"),
    "sin shape": (tts_bad(sin=lambda t: t[:1]), ValueError, "argument 'sin' expected shape [2, 3, 8], got [1, 3, 8]"),
    "q int": (tts_bad(q=lambda t: t.to(torch.int32)), TypeError,
              "argument 'q' expected dtype bfloat16 or float16 or float32, got int32"),
    "q fp64": (tts_bad(q=lambda t: t.double()), TypeError, "argument 'q' expected dtype bfloat16 or float16 or float32, got float64"),
    "k dtype": (tts_bad(k=lambda t: t.half()), TypeError, "argument 'k' expected dtype bfloat16 (same as 'q'), got float16"),
    "sin dtype": (tts_bad(sin=lambda t: t.float()), TypeError, "argument 'sin' expected dtype bfloat16 (same as 'q'), got float32"),
    "k device": (tts_bad(k=lambda t: t.to("meta")), ValueError,
                 "argument 'k' expected a tensor on cpu (same device as 'q'), got a tensor on meta"),
    # q the odd one out: q is blamed, not the first of the others
    "q device": (tts_bad(q=lambda t: t.to("meta")), ValueError,
                 "argument 'q' expected a tensor on cpu (same device as 'k', 'cos', 'sin'), got a tensor on meta"),
    "q dtype": (tts_bad(q=lambda t: t.float()), TypeError,
                "argument 'q' expected dtype bfloat16 (same as 'k', 'cos', 'sin'), got float32"),
    "k and cos device": (tts_bad(k=lambda t: t.to("meta"), cos=lambda t: t.to("meta")), ValueError,
                         "argument 'k' expected a tensor on cpu (same device as 'q'), got a tensor on meta"),
    "q last stride": (tts_bad(q=lambda t: torch.randn(2, 4, 3, 16).to(bf16)[..., ::2]), ValueError,
                      "argument 'q' expected a contiguous last dimension (stride 1), got strides (192, 48, 16, 2)"),
    "cos last stride": (tts_bad(cos=lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
                        "argument 'cos' expected a contiguous last dimension (stride 1)"),
    "cos dtype": (tts_bad(cos=lambda t: t.float()), TypeError, "argument 'cos' expected dtype bfloat16 (same as 'q'), got float32"),
    "sin 2-D": (tts_bad(sin=lambda t: t[0]), ValueError,
                "argument 'sin' expected a 3-D tensor [B or 1, S, D], got 2-D shape [3, 8]"),
    "k last stride": (tts_bad(k=lambda t: torch.randn(2, 2, 3, 16).to(bf16)[..., ::2]), ValueError,
                      "argument 'k' expected a contiguous last dimension (stride 1), got strides (96, 48, 16, 2)"),
    "sin last stride": (tts_bad(sin=lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
                        "argument 'sin' expected a contiguous last dimension (stride 1), got strides (24, 1, 3)"),
    "cos device": (tts_bad(cos=lambda t: t.to("meta")), ValueError,
                   "argument 'cos' expected a tensor on cpu (same device as 'q'), got a tensor on meta"),
    "sin device": (tts_bad(sin=lambda t: t.to("meta")), ValueError,
                   "argument 'sin' expected a tensor on cpu (same device as 'q'), got a tensor on meta"),
    "cos sparse": (tts_bad(cos=lambda t: t.to_sparse()), TypeError,
                   "argument 'cos' expected a dense (strided) tensor, got layout torch.sparse_coo"),
    # cos and sin both for other token counts (e.g. the whole table passed): no tensor agrees to the wrong S
    "cos and sin seq": (tts_bad(cos=torch.randn(2, 5, 8).to(bf16), sin=torch.randn(2, 5, 8).to(bf16)), ValueError,
                        "argument 'cos' expected shape [2, 3, 8], got [2, 5, 8]"),
    "D=0": (tts_bad(q=torch.randn(2, 4, 3, 0).to(bf16), k=torch.randn(2, 2, 3, 0).to(bf16),
                    cos=torch.randn(2, 3, 0).to(bf16), sin=torch.randn(2, 3, 0).to(bf16)), ValueError,
            "argument 'q' expected an even head_dim D >= 2 (last dim), got D=0"),
}


@pytest.mark.parametrize("name", TTS_CASES)
def test_qwen3_tts_rope_bad_input(name):
    args, exc, msg = TTS_CASES[name]
    with pytest.raises(exc, match="^qwen3_tts_rope: " + re.escape(msg)):
        fusedrope.qwen3_tts_rope(args["q"], args["k"], args["cos"], args["sin"], backend="reference")
    if not all(isinstance(a, torch.Tensor) for a in args.values()):
        return  # the torch op's schema rejects non-tensors itself
    q, k = args["q"], args["k"]
    with pytest.raises(exc, match=re.escape(msg)):  # the torch op validates the same way
        torch.ops.fusedrope.qwen3_tts_rope_out(q, k, args["cos"], args["sin"], q.clone(), k.clone(), "reference")


@pytest.mark.parametrize("name, dim", [("k", 1), ("q", 1), ("q", 0)])
def test_qwen3_tts_rope_inplace_into_broadcast_tensor(name, dim):
    args = dict(zip("q k cos sin".split(), tts_inputs()))
    t = args[name]
    args[name] = t.narrow(dim, 0, 1).expand(t.shape)  # stride 0 on `dim`: several indices on one element
    strides = tuple(0 if d == dim else s for d, s in enumerate(t.stride()))
    before = args[name].clone()
    msg = re.escape(f"argument '{name}' expected a writable tensor without broadcast (stride-0) dimensions, "
                    f"got strides {strides}")
    with pytest.raises(ValueError, match="^qwen3_tts_rope: " + msg):
        fusedrope.qwen3_tts_rope(**args, inplace=True)
    with pytest.raises(ValueError, match=msg):  # the in-place torch op validates the same way
        torch.ops.fusedrope.qwen3_tts_rope_out(args["q"], args["k"], args["cos"], args["sin"], args["q"], args["k"],
                                               "reference")
    assert torch.equal(args[name], before)  # refused before anything was written


@pytest.mark.parametrize("flag, shown", [("False", "str 'False'"), (0, "int 0"), (None, "NoneType None"),
                                         (np.bool_(False), "numpy.bool np.False_")])  # its type named: no bool
def test_inplace_must_be_a_bool(flag, shown):
    """A truthy "False" must not write into q and k; eager, explain and the traced call agree."""
    args = tts_bad()
    before = args["q"].clone()
    msg = f"^qwen3_tts_rope: argument 'inplace' expected a bool, got {re.escape(shown)}$"
    with pytest.raises(TypeError, match=msg):
        fusedrope.qwen3_tts_rope(**args, inplace=flag, backend="reference")
    with pytest.raises(TypeError, match=msg):
        fusedrope.explain("qwen3_tts_rope", **args, inplace=flag)
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, cos, sin: fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=flag), fullgraph=True,
                       backend="eager")
    with pytest.raises(Exception) as traced:  # Dynamo wraps it, or cannot trace repr() of a numpy scalar
        fn(**args)
    assert isinstance(flag, np.generic) or re.search(msg[1:-1], str(traced.value))
    assert torch.equal(args["q"], before)


def test_unknown_backend_and_env():
    q, k, cos, sin = tts_inputs()
    with pytest.raises(ValueError, match=r"argument 'backend' expected 'auto' or one of \[.*'reference'.*\], got 'cudnn'"):
        fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="cudnn")
    with pytest.raises(TypeError, match=r"^qwen3_tts_rope: argument 'backend' expected 'auto' or one of \[.*'reference'.*"
                                        r"\], got list \['triton'\]$"):
        fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=["triton"])
    (args, _), = [quant_bad()]
    with pytest.raises(TypeError, match=r"^inverse_rope_group_quant: argument 'backend' expected .*, got dict \{\}$"):
        fusedrope.inverse_rope_group_quant(**args, backend={})


def quant_bad(**change):
    case = QuantCase(3, 4, 2)
    o, pos, cos, sin = make_quant_inputs(case, max_pos=64)
    args = dict(o=o, positions=pos, cos_cache=cos, sin_cache=sin, num_groups=2, quant_group_size=128,
                transpose_scale=False, x_fp8=None, x_scale=None)
    kw = {}
    for n, v in change.items():
        if n in ("fp8_dtype", "scale_dtype", "scale_layout", "quantize", "enable_pdl", "scale_format"):
            kw[n] = v
        else:
            args[n] = v(args) if callable(v) else v
    return args, kw


def _bufs(**kw):
    return lambda a: fusedrope.empty_quant_outputs(a["o"], 2, 128, **kw)


_ONE_CACHE = torch.zeros(64, 48)  # rows of 48: [:, :32] and [:, 16:] overlap

QUANT_CASES = {
    "o 2-D": (quant_bad(o=lambda a: a["o"][0]), ValueError, "argument 'o' expected a 3-D tensor [S, H, head_dim], got 2-D"),
    "o fp32": (quant_bad(o=lambda a: a["o"].float()), TypeError, "argument 'o' expected dtype bfloat16 or float16, got float32"),
    "o strided": (quant_bad(o=lambda a: torch.cat([a["o"], a["o"]], 2)[..., ::2]), ValueError,
                  "argument 'o' expected a contiguous tensor, got strides (4096, 1024, 2)"),
    "positions 2-D": (quant_bad(positions=lambda a: a["positions"][None]), ValueError,
                      "argument 'positions' expected a 1-D tensor [>= S], got 2-D"),
    "positions float": (quant_bad(positions=lambda a: a["positions"].float()), TypeError,
                        "argument 'positions' expected dtype int64 or int32, got float32"),
    "positions short": (quant_bad(positions=lambda a: a["positions"][:2]), ValueError,
                        "argument 'positions' expected at least S=3 elements, got 2"),
    "positions device": (quant_bad(positions=lambda a: a["positions"].to("meta")), ValueError,
                         "argument 'positions' expected a tensor on cpu (same device as 'o'), got a tensor on meta"),
    "o device": (quant_bad(o=lambda a: a["o"].to("meta")), ValueError,
                 "argument 'o' expected a tensor on cpu (same device as 'positions', 'cos_cache', 'sin_cache'), got a "
                 "tensor on meta"),
    "cos 1-D": (quant_bad(cos_cache=lambda a: a["cos_cache"][0]), ValueError,
                "argument 'cos_cache' expected a 2-D tensor [max_pos, rope_dim/2]"),
    "cos int": (quant_bad(cos_cache=lambda a: a["cos_cache"].int()), TypeError, "argument 'cos_cache' expected dtype bfloat16 or float16 or float32, got int32"),
    "sin dtype": (quant_bad(sin_cache=lambda a: a["sin_cache"].half()), TypeError,
                  "argument 'sin_cache' expected dtype float32 (same as 'cos_cache'), got float16"),
    "sin shape": (quant_bad(sin_cache=lambda a: a["sin_cache"][:, :16]), ValueError,
                  "argument 'sin_cache' expected shape [64, 32], got [64, 16]"),
    "cos last stride": (quant_bad(cos_cache=lambda a: a["cos_cache"].t().contiguous().t(),
                                  sin_cache=lambda a: a["sin_cache"].t().contiguous().t()), ValueError,
                        "argument 'cos_cache' expected a contiguous last dimension (stride 1)"),
    "rope too wide": (quant_bad(cos_cache=torch.zeros(4, 300), sin_cache=torch.zeros(4, 300)), ValueError,
                      "argument 'cos_cache' expected shape [max_pos >= 1, rope_dim/2] with 1 <= rope_dim <= head_dim=512, got [4, 300]"),
    "groups": (quant_bad(num_groups=3), ValueError, "argument 'num_groups' expected a positive int dividing H*head_dim=2048, got 3"),
    "groups float": (quant_bad(num_groups=2.0), TypeError, "argument 'num_groups' expected a positive int dividing H*head_dim=2048, got 2.0 of type float"),
    "group size": (quant_bad(quant_group_size=48), ValueError,
                   "argument 'quant_group_size' expected one of (32, 64, 128, 256), got 48"),
    "group size vs Dg": (quant_bad(num_groups=32, quant_group_size=128), ValueError,
                         "argument 'quant_group_size' expected a divisor of the group width Dg=H*head_dim/num_groups=64, got 128"),
    "fp8 dtype": (quant_bad(fp8_dtype=torch.float8_e5m2), TypeError,
                  "argument 'fp8_dtype' expected float8_e4m3fn or float8_e4m3fnuz, got torch.float8_e5m2"),
    "scale dtype": (quant_bad(scale_dtype=torch.float16), TypeError,
                    "argument 'scale_dtype' expected float8_e8m0fnu or uint8 or float32 or int32, got torch.float16"),
    "packed needs 4 blocks": (quant_bad(num_groups=8, quant_group_size=128, scale_dtype=torch.int32), ValueError,
                             "argument 'scale_dtype' expected int32 (packed UE8M0) only when the blocks per group "
                             "Dg/quant_group_size are a multiple of 4, got 256/128=2"),
    "x_fp8 shape": (quant_bad(x_fp8=lambda a: torch.empty(3, 2, 512, dtype=torch.float8_e4m3fn)), ValueError,
                    "argument 'x_fp8' expected shape [3, 2, 1024], got [3, 2, 512]"),
    "x_fp8 dtype": (quant_bad(x_fp8=lambda a: torch.empty(3, 2, 1024, dtype=torch.float8_e4m3fn), fp8_dtype=torch.float8_e4m3fnuz),
                    TypeError, "argument 'x_fp8' expected dtype float8_e4m3fnuz (as fp8_dtype says), got float8_e4m3fn"),
    "x_fp8 strided": (quant_bad(x_fp8=lambda a: torch.empty(3, 1024, 2, dtype=torch.float8_e4m3fn).transpose(1, 2)),
                      ValueError, "argument 'x_fp8' expected rows of Dg=1024 contiguous and apart (row-major, group-major (Dg, S*Dg, 1), or padded rows), got strides (2048, 1, 2)"),
    # with both buffers validate()'s hot path decides: it must refuse rows that overlap too
    "x_fp8 overlapping rows, both buffers": (
        quant_bad(x_fp8=lambda a: torch.empty(3 * 2 * 1024, dtype=torch.float8_e4m3fn).as_strided((3, 2, 1024), (1024, 512, 1)),
                  x_scale=lambda a: _bufs()(a)[1]), ValueError,
        "argument 'x_fp8' expected rows of Dg=1024 contiguous and apart (row-major, group-major (Dg, S*Dg, 1), or padded rows), got strides (1024, 512, 1)"),
    "scale_layout unknown": (quant_bad(scale_layout="tiles"), ValueError,
                             "argument 'scale_layout' expected None or one of ('row', 'col', 'mfma_tile', 'n32k4'), got 'tiles'"),
    "n32k4 quant group": (quant_bad(scale_layout="n32k4"), ValueError,
                          "argument 'quant_group_size' expected quant_group_size=32 and blocks per group Dg/32 a multiple of 4 "
                          "for scale_layout='n32k4' (a lane of the WMMA reads the 4 scales of one K=128 step), got 128 (Dg=1024, Ks=8)"),
    "n32k4 blocks per group": (quant_bad(scale_layout="n32k4", quant_group_size=32, num_groups=32), ValueError,
                               "argument 'num_groups' expected quant_group_size=32 and blocks per group Dg/32 a multiple of 4 "
                               "for scale_layout='n32k4' (a lane of the WMMA reads the 4 scales of one K=128 step), got 32 (Dg=64, Ks=2)"),
    "n32k4 fp32 scales": (quant_bad(scale_layout="n32k4", quant_group_size=32, scale_dtype=torch.float32), TypeError,
                          "argument 'scale_dtype' expected float8_e8m0fnu or uint8, got torch.float32"),
    "scale_format unknown": (quant_bad(scale_format="e8m0"), ValueError,
                             "argument 'scale_format' expected one of ('ue8m0', 'fp32'), got 'e8m0'"),
    "scale_format not a str": (quant_bad(scale_format=None), ValueError,
                               "argument 'scale_format' expected one of ('ue8m0', 'fp32'), got None"),
    "fp32 format in tiles": (quant_bad(scale_format="fp32", scale_layout="mfma_tile"), ValueError,
                             "argument 'scale_format' expected 'ue8m0' with scale_layout='mfma_tile' (its tiles hold e8m0 "
                             "bytes), got 'fp32'"),
    "fp32 format without quant": (quant_bad(scale_format="fp32", quantize=False), ValueError,
                                  "argument 'scale_format' expected 'ue8m0' with quantize=False (there are no scales), got 'fp32'"),
    "fp32 format e8m0 scales": (quant_bad(scale_format="fp32", scale_dtype=torch.float8_e8m0fnu), TypeError,
                                "argument 'scale_dtype' expected float32, got torch.float8_e8m0fnu"),
    "fp32 format e8m0 buffer": (quant_bad(scale_format="fp32", x_fp8=lambda a: _bufs()(a)[0], x_scale=lambda a: _bufs()(a)[1]),
                                TypeError, "argument 'x_scale' expected dtype float32, got float8_e8m0fnu"),
    "scale_layout vs transpose_scale": (quant_bad(transpose_scale=True, scale_layout="row"), ValueError,
                                        "argument 'transpose_scale' expected False with scale_layout='row' (True means "
                                        "scale_layout='col'), got True"),
    "mfma_tile fp32 scales": (quant_bad(scale_layout="mfma_tile", scale_dtype=torch.float32), TypeError,
                              "argument 'scale_dtype' expected float8_e8m0fnu or uint8, got torch.float32"),
    "mfma_tile scale buffer shape": (quant_bad(scale_layout="mfma_tile", x_fp8=lambda a: _bufs()(a)[0],
                                               x_scale=lambda a: torch.empty(3, 2, 8, dtype=torch.float8_e8m0fnu)),
                                     ValueError, "argument 'x_scale' expected shape [2, 32, 8], got [3, 2, 8]"),
    "mfma_tile scale buffer strides": (
        quant_bad(scale_layout="mfma_tile", x_fp8=lambda a: _bufs()(a)[0],
                  x_scale=lambda a: torch.empty(2, 8, 32, dtype=torch.float8_e8m0fnu).transpose(1, 2)), ValueError,
        "argument 'x_scale' expected contiguous strides (256, 8, 1) for scale_layout='mfma_tile', got strides (256, 1, 32)"),
    "quantize not a bool": (quant_bad(quantize="no"), TypeError, "argument 'quantize' expected a bool, got str 'no'"),
    "quantize=False with fp8_dtype": (quant_bad(quantize=False, fp8_dtype=torch.float8_e4m3fn), ValueError,
                                      "argument 'fp8_dtype' expected None with quantize=False (the output has o's "
                                      "dtype, and there are no scales), got torch.float8_e4m3fn"),
    "quantize=False with a scale layout": (quant_bad(quantize=False, scale_layout="col"), ValueError,
                                           "argument 'scale_layout' expected None with quantize=False (there are no "
                                           "scales), got 'col'"),
    "quantize=False with transpose_scale": (quant_bad(quantize=False, transpose_scale=True), ValueError,
                                            "argument 'transpose_scale' expected False with quantize=False (there are "
                                            "no scales), got True"),
    "quantize=False with x_scale": (quant_bad(quantize=False, x_scale=lambda a: _bufs()(a)[1]), ValueError,
                                    "argument 'x_scale' expected None with quantize=False (the output has o's dtype, "
                                    "and there are no scales), got a tensor"),
    "quantize=False into fp8": (quant_bad(quantize=False, x_fp8=lambda a: _bufs()(a)[0]), TypeError,
                                "argument 'x_fp8' expected dtype bfloat16 (o's, as quantize=False), got float8_e4m3fn"),
    "enable_pdl not a bool": (quant_bad(enable_pdl=1), TypeError, "argument 'enable_pdl' expected a bool, got int 1"),
    "one cos||sin cache as both": (quant_bad(sin_cache=lambda a: a["cos_cache"]), ValueError,
                                   "argument 'sin_cache' expected memory apart from 'cos_cache' (a cos||sin cache "
                                   "[max_pos, rope_dim] splits into cache[:, :rope_dim//2] and cache[:, rope_dim//2:]), "
                                   "got a tensor sharing elements with 'cos_cache'"),
    "cos and sin overlapping views": (
        quant_bad(cos_cache=_ONE_CACHE[:, :32], sin_cache=_ONE_CACHE[:, 16:]),
        ValueError, "argument 'sin_cache' expected memory apart from 'cos_cache'"),
    "x_scale shape": (quant_bad(x_scale=lambda a: torch.empty(3, 2, 4, dtype=torch.float8_e8m0fnu)), ValueError,
                      "argument 'x_scale' expected shape [3, 2, 8], got [3, 2, 4]"),
    "x_scale dtype": (quant_bad(x_scale=lambda a: torch.empty(3, 2, 8, dtype=torch.float16)), TypeError,
                      "argument 'x_scale' expected dtype float8_e8m0fnu or uint8 or float32 or int32, got float16"),
    "x_fp8 not fp8": (quant_bad(x_fp8=lambda a: torch.empty(3, 2, 1024, dtype=bf16)), TypeError,
                      "argument 'x_fp8' expected dtype float8_e4m3fn or float8_e4m3fnuz, got bfloat16"),
    "x_fp8 not fp8, both buffers": (quant_bad(x_fp8=lambda a: torch.empty(3, 2, 1024, dtype=bf16),
                                              x_scale=lambda a: _bufs()(a)[1]), TypeError,
                                    "argument 'x_fp8' expected dtype float8_e4m3fn or float8_e4m3fnuz, got bfloat16"),
    "fp8 dtype str": (quant_bad(fp8_dtype="float8_e4m3fn"), TypeError,
                      "argument 'fp8_dtype' expected float8_e4m3fn or float8_e4m3fnuz, got 'float8_e4m3fn'"),
    "odd head_dim": (quant_bad(o=torch.randn(3, 4, 65).to(bf16), num_groups=1, quant_group_size=32), ValueError,
                     "argument 'o' expected an even head_dim (last dim), so that rope pairs never straddle a head "
                     "or a quant block, got head_dim=65"),
    "groups numpy": (quant_bad(num_groups=np.int64(2)), TypeError,
                     "argument 'num_groups' expected a positive int dividing H*head_dim=2048, got np.int64(2) of type int64"),
    "group size float": (quant_bad(quant_group_size=128.0), TypeError,
                         "argument 'quant_group_size' expected one of (32, 64, 128, 256), got 128.0 of type float"),
    "group size numpy": (quant_bad(quant_group_size=np.int64(64)), TypeError,
                         "argument 'quant_group_size' expected one of (32, 64, 128, 256), got np.int64(64) of type int64"),
    "group size bool": (quant_bad(quant_group_size=True), TypeError,
                        "argument 'quant_group_size' expected one of (32, 64, 128, 256), got True of type bool"),
    "x_scale vs scale_dtype": (quant_bad(x_scale=lambda a: torch.empty(3, 2, 8, dtype=torch.uint8), scale_dtype=torch.float32),
                               TypeError, "argument 'x_scale' expected dtype float32 (as scale_dtype says), got uint8"),
    "x_scale layout": (quant_bad(x_scale=lambda a: _bufs(transpose_scale=True)(a)[1]), ValueError,
                       "argument 'x_scale' expected contiguous strides (16, 8, 1) for transpose_scale=False, got strides (1, 24, 3)"),
    "x_scale layout T": (quant_bad(transpose_scale=True, x_scale=lambda a: _bufs()(a)[1]), ValueError,
                         "argument 'x_scale' expected column-major strides (1, 8*L, L) with L >= S=3 (empty_quant_outputs gives (1, 24, 3)) for transpose_scale=True, got strides (16, 8, 1)"),
    "x_scale lead < S": (quant_bad(transpose_scale=True,
                                   x_scale=lambda a: torch.empty(64, dtype=torch.float8_e8m0fnu).as_strided((3, 2, 8),
                                                                                              (1, 16, 2))), ValueError,
                         "argument 'x_scale' expected column-major strides (1, 8*L, L) with L >= S=3 (empty_quant_outputs gives (1, 24, 3)) for transpose_scale=True, got strides (1, 16, 2)"),
    "packed x_scale T": (quant_bad(transpose_scale=True, quant_group_size=32, scale_dtype=torch.int32,
                                   x_scale=lambda a: torch.empty(3, 2, 8, dtype=torch.int32)), ValueError,
                         "argument 'x_scale' expected column-major strides (1, 8*L, L) with L >= S=3 (empty_quant_outputs gives (1, 32, 4)) for transpose_scale=True, got strides (16, 8, 1)"),
    "x_scale device": (quant_bad(x_scale=lambda a: _bufs()(a)[1].to("meta")), ValueError,
                       "argument 'x_scale' expected a tensor on cpu (same device as 'o'), got a tensor on meta"),
    "empty cache": (quant_bad(cos_cache=torch.zeros(0, 32), sin_cache=torch.zeros(0, 32)), ValueError,
                    "argument 'cos_cache' expected shape [max_pos >= 1, rope_dim/2] with 1 <= rope_dim <= head_dim=512, got [0, 32]"),
    "cos device": (quant_bad(cos_cache=lambda a: a["cos_cache"].to("meta")), ValueError,
                   "argument 'cos_cache' expected a tensor on cpu (same device as 'o'), got a tensor on meta"),
    "sin device": (quant_bad(sin_cache=lambda a: a["sin_cache"].to("meta")), ValueError,
                   "argument 'sin_cache' expected a tensor on cpu (same device as 'o'), got a tensor on meta"),
    "x_fp8 device": (quant_bad(x_fp8=lambda a: _bufs()(a)[0].to("meta"), x_scale=lambda a: _bufs()(a)[1]), ValueError,
                     "argument 'x_fp8' expected a tensor on cpu (same device as 'o'), got a tensor on meta"),
    "sin last stride": (quant_bad(sin_cache=lambda a: a["sin_cache"].t().contiguous().t()), ValueError,
                        "argument 'sin_cache' expected a contiguous last dimension (stride 1), got strides (1, 64)"),
    "transpose_scale not a bool": (quant_bad(transpose_scale="False"), TypeError,
                                   "argument 'transpose_scale' expected a bool, got str 'False'"),
    "transpose_scale int": (quant_bad(transpose_scale=1), TypeError,
                            "argument 'transpose_scale' expected a bool, got int 1"),
    "o sparse": (quant_bad(o=lambda a: a["o"].to_sparse()), TypeError,
                 "argument 'o' expected a dense (strided) tensor, got layout torch.sparse_coo"),
    "positions sparse": (quant_bad(positions=lambda a: a["positions"].to_sparse()), TypeError,
                         "argument 'positions' expected a dense (strided) tensor, got layout torch.sparse_coo"),
    "groups zero": (quant_bad(num_groups=0), ValueError,
                    "argument 'num_groups' expected a positive int dividing H*head_dim=2048, got 0"),
    "positions column": (quant_bad(positions=lambda a: a["positions"][:, None]), ValueError,
                         "argument 'positions' expected a 1-D tensor [>= S], got 2-D shape [3, 1]"),
    "cos last stride only": (quant_bad(cos_cache=lambda a: a["cos_cache"].t().contiguous().t()), ValueError,
                             "argument 'cos_cache' expected a contiguous last dimension (stride 1), got strides (1, 64)"),
    "rope_dim 0": (quant_bad(cos_cache=torch.zeros(64, 0), sin_cache=torch.zeros(64, 0)), ValueError,
                   "argument 'cos_cache' expected shape [max_pos >= 1, rope_dim/2] with 1 <= rope_dim <= head_dim=512, got [64, 0]"),
    "x_fp8 4-D": (quant_bad(x_fp8=lambda a: torch.empty(3, 2, 1024, 1, dtype=torch.float8_e4m3fn)), ValueError,
                  "argument 'x_fp8' expected shape [3, 2, 1024], got [3, 2, 1024, 1]"),
    "x_scale 2-D": (quant_bad(x_scale=lambda a: torch.empty(3, 2, dtype=torch.float8_e8m0fnu)), ValueError,
                    "argument 'x_scale' expected shape [3, 2, 8], got [3, 2]"),
    # with both buffers validate()'s hot path decides: it must refuse each of these too
    "x_fp8 shape, both buffers": (quant_bad(x_fp8=lambda a: torch.empty(3, 2, 512, dtype=torch.float8_e4m3fn),
                                            x_scale=lambda a: _bufs()(a)[1]), ValueError,
                                  "argument 'x_fp8' expected shape [3, 2, 1024], got [3, 2, 512]"),
    "x_scale shape, both buffers": (quant_bad(x_fp8=lambda a: _bufs()(a)[0],
                                              x_scale=lambda a: torch.empty(3, 2, 4, dtype=torch.float8_e8m0fnu)),
                                    ValueError, "argument 'x_scale' expected shape [3, 2, 8], got [3, 2, 4]"),
    "x_scale device, both buffers": (quant_bad(x_fp8=lambda a: _bufs()(a)[0], x_scale=lambda a: _bufs()(a)[1].to("meta")),
                                     ValueError, "argument 'x_scale' expected a tensor on cpu (same device as 'o'), got a tensor on meta"),
    "positions int16": (quant_bad(positions=lambda a: a["positions"].to(torch.int16)), TypeError,
                        "argument 'positions' expected dtype int64 or int32, got int16"),
}


@pytest.mark.parametrize("name", QUANT_CASES)
def test_inverse_rope_group_quant_bad_input(name):
    (args, kw), exc, msg = QUANT_CASES[name]
    with pytest.raises(exc, match="^inverse_rope_group_quant: " + re.escape(msg)):
        fusedrope.inverse_rope_group_quant(**args, **kw, backend="reference")


def test_quant_helpers_check_their_arguments():
    o = torch.zeros(2, 2, 128, dtype=bf16)
    with pytest.raises(ValueError, match="argument 'num_groups' expected a positive int dividing H\\*head_dim=256, got 3"):
        fusedrope.empty_quant_outputs(o, 3)
    with pytest.raises(ValueError, match="argument 'quant_group_size' expected one of \\(32, 64, 128, 256\\), got 96"):
        fusedrope.empty_quant_outputs(o, 2, 96)
    with pytest.raises(ValueError, match="argument 'quant_group_size' expected a divisor of the group width"):
        fusedrope.empty_quant_outputs(o, 2, 256)
    with pytest.raises(ValueError, match="argument 'scale_dtype' expected int32 \\(packed UE8M0\\) only when"):
        fusedrope.quant_output_shapes(2, 2, 128, 2, 64, torch.int32)
    with pytest.raises(TypeError, match="argument 'fp8_dtype' expected float8_e4m3fn or float8_e4m3fnuz, got "
                                        "torch.bfloat16"):
        fusedrope.empty_quant_outputs(o, 2, fp8_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^empty_quant_outputs: argument 'o' expected a 3-D tensor"):
        fusedrope.empty_quant_outputs(o[0], 2)
    with pytest.raises(TypeError, match="^empty_quant_outputs: argument 'transpose_scale' expected a bool, got str"):
        fusedrope.empty_quant_outputs(o, 2, transpose_scale="True")


@pytest.mark.parametrize("args, exc, msg", [
    ((-3, 16, 512, 2), ValueError, "argument 'num_tokens' expected a non-negative int, got -3"),
    ((3, 16.0, 512, 2), TypeError, "argument 'num_heads' expected a non-negative int, got 16.0"),
    ((3, 16, torch.tensor(512), 2), TypeError, "argument 'head_dim' expected a non-negative int, got tensor(512)"),
    ((3, 16, 512, 2, 128, torch.float16), TypeError,
     "argument 'scale_dtype' expected float8_e8m0fnu or uint8 or float32 or int32, got torch.float16"),
    ((3, 16, 512, 3), ValueError, "argument 'num_groups' expected a positive int dividing H*head_dim=8192, got 3"),
])
def test_quant_output_shapes_names_itself_and_the_argument(args, exc, msg):
    with pytest.raises(exc, match="^quant_output_shapes: " + re.escape(msg)):
        fusedrope.quant_output_shapes(*args)


def test_quant_output_shapes_take_zero_tokens():
    """An engine step with no tokens on this rank is a valid call: the shape helper answers it as the op does."""
    H, G = 4, 2
    o = torch.randn(0, H, 512).to(bf16)
    pos, cos, sin = torch.zeros(0, dtype=torch.int64), torch.randn(16, 32), torch.randn(16, 32)
    x, s = fusedrope.inverse_rope_group_quant(o, pos, cos, sin, G, backend="reference")
    assert fusedrope.quant_output_shapes(0, H, 512, G) == (tuple(x.shape), tuple(s.shape)) == ((0, 2, 1024), (0, 2, 8))


@pytest.mark.parametrize("op", ["tts", "quant", "quant type"])
def test_bad_input_under_torch_compile_keeps_the_message(op):
    """Dynamo re-raises the error it meets while tracing as its own RuntimeError (docs/design.md says so);
    the message a user reads must still be fusedrope's."""
    torch._dynamo.reset()
    if op == "tts":
        args = tts_bad(cos=lambda t: t.double())
        fn = torch.compile(lambda q, k, cos, sin: fusedrope.qwen3_tts_rope(q, k, cos, sin), fullgraph=True)
        msg = "argument 'cos' expected dtype bfloat16"
    else:  # a group count that does not divide, or one of a type torch's schema would refuse with its message
        (args, _), = [quant_bad()]
        groups = 3 if op == "quant" else 2.0
        fn = torch.compile(lambda **a: fusedrope.inverse_rope_group_quant(**a, num_groups=groups), fullgraph=True)
        msg = f"argument 'num_groups' expected a positive int dividing H*head_dim=2048, got {groups}"
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        fn(**{n: v for n, v in args.items() if n != "num_groups"})


def test_out_op_requires_both_buffers():
    (args, _), = [quant_bad()]
    with pytest.raises(TypeError, match="argument 'x_fp8' expected a torch.Tensor, got NoneType"):
        torch.ops.fusedrope.inverse_rope_group_quant_out(*[args[n] for n in list(args)[:7]], None, None, "reference")


def test_inplace_into_itself_or_with_autograd():
    q, k, cos, sin = tts_inputs()
    with pytest.raises(ValueError, match="argument 'k' expected memory apart from 'q' for inplace=True"):
        fusedrope.qwen3_tts_rope(q, q, cos, sin, inplace=True, backend="reference")
    leaf = q.clone().requires_grad_()
    with pytest.raises(RuntimeError, match=re.escape(
            "qwen3_tts_rope: inplace=True has no autograd formula, and argument 'q' requires grad; call it under "
            "torch.no_grad() or torch.inference_mode(), or use inplace=False")):
        fusedrope.qwen3_tts_rope(leaf, k, cos, sin, inplace=True, backend="reference")
    k_leaf, k_before = k.clone().requires_grad_(), k.clone()
    with pytest.raises(RuntimeError, match="inplace=True has no autograd formula, and argument 'k' requires grad"):
        fusedrope.qwen3_tts_rope(q, k_leaf, cos, sin, inplace=True, backend="reference")  # k alone
    assert torch.equal(k_leaf.detach(), k_before)
    with torch.inference_mode():
        q_inf = q.clone()
    with pytest.raises(RuntimeError, match=re.escape(
            "qwen3_tts_rope: argument 'q' (inplace=True) expected a tensor writable outside torch.inference_mode(), "
            "got an inference tensor")):
        fusedrope.qwen3_tts_rope(q_inf, k, cos, sin, inplace=True, backend="reference")
    with pytest.raises(ValueError, match="argument 'q' expected memory apart from 'cos' for inplace=True"):
        fusedrope.qwen3_tts_rope(q, k, q[:, 0], sin, inplace=True, backend="reference")  # cos read from q


def test_backend_the_op_does_not_have(monkeypatch):
    q, k, cos, sin = tts_inputs()
    no_hip = r"argument 'backend' expected 'auto' or one of \[.*\], got 'hip' \(qwen3_tts_rope has no 'hip' backend\)"
    with pytest.raises(ValueError, match=no_hip):
        fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="hip")
    # FUSEDROPE_BACKEND=hip, set for op 2 on AMD, leaves op 1 to pick for itself
    auto = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin).chosen
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "hip")
    ex = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin)
    assert auto is not None and ex.chosen == auto
    assert not ex.forced and "forced" not in str(ex)  # not forced by a variable naming another op's backend
    q_out, _ = fusedrope.qwen3_tts_rope(q, k, cos, sin)
    assert torch.equal(q_out, fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=auto)[0])
    with pytest.raises(ValueError, match=no_hip):  # the fallback cached for the variable is not the argument's
        fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="hip")
    monkeypatch.setenv(fusedrope.ENV_BACKEND, "cudnn")
    with pytest.raises(ValueError, match="environment variable FUSEDROPE_BACKEND expected 'auto' or one of"):
        fusedrope.qwen3_tts_rope(q, k, cos, sin)


def test_inputs_that_require_grad_get_the_same_errors():
    q, k, cos, sin = tts_inputs()
    with pytest.raises(ValueError, match="argument 'backend' expected 'auto' or one of"):
        fusedrope.qwen3_tts_rope(q.requires_grad_(), k, cos, sin, backend=None)
    (args, _), = [quant_bad(num_groups=np.int64(2))]
    args["o"].requires_grad_()
    with pytest.raises(TypeError, match="argument 'num_groups' expected a positive int"):
        fusedrope.inverse_rope_group_quant(**args, backend="reference")


def test_buffers_that_are_inference_tensors_outside_inference_mode():
    (args, _), = [quant_bad()]
    with torch.inference_mode():
        args["x_fp8"], args["x_scale"] = fusedrope.empty_quant_outputs(args["o"], 2)
    calls = [functools.partial(fusedrope.inverse_rope_group_quant, backend=b) for b in ("reference", "triton")]
    for call in (*calls, functools.partial(fusedrope.explain, "inverse_rope_group_quant")):
        with pytest.raises(RuntimeError, match=re.escape(
                "inverse_rope_group_quant: argument 'x_fp8' expected a tensor writable outside "
                "torch.inference_mode(), got an inference tensor")):
            call(**args)


def test_explain_names_the_op_for_missing_arguments():
    q, k, cos, _ = tts_inputs()
    with pytest.raises(TypeError, match=r"^explain\('qwen3_tts_rope', ...\): missing a required argument: 'sin'"):
        fusedrope.explain("qwen3_tts_rope", q, k, cos)


def test_explain_rejects_unknown_op():
    with pytest.raises(ValueError, match="explain: argument 'op' expected one of"):
        fusedrope.explain("rope_everything")


NOT_DENSE = {  # name: (a [B, S, D] cos made into it, a 1-D positions made into it, what the message says)
    "csr": (lambda t: t[0].to_sparse_csr(), lambda p: p[None].to_sparse_csr(), "layout torch.sparse_csr"),
    "nested": (lambda t: torch.nested.nested_tensor([t[0], t[0]]), lambda p: torch.nested.nested_tensor([p, p]),
               "a nested tensor"),
    "jagged": (lambda t: torch.nested.nested_tensor([t[0], t[0]], layout=torch.jagged),
               lambda p: torch.nested.nested_tensor([p, p], layout=torch.jagged), "a nested tensor"),
}


@pytest.mark.parametrize("kind", NOT_DENSE)
def test_sparse_csr_and_nested_tensors_get_the_usual_type_error(kind):
    """Not a RuntimeError from deep inside torch: the usual TypeError naming the argument."""
    make_cos, make_positions, got = NOT_DENSE[kind]
    q, k, cos, sin = tts_inputs()
    with pytest.raises(TypeError, match=f"^qwen3_tts_rope: argument 'cos' expected a dense \\(strided\\) tensor, got {got}"):
        fusedrope.qwen3_tts_rope(q, k, make_cos(cos), sin, backend="reference")
    (args, _), = [quant_bad()]
    args["positions"] = make_positions(args["positions"])
    with pytest.raises(TypeError, match="^inverse_rope_group_quant: argument 'positions' expected a dense"):
        fusedrope.inverse_rope_group_quant(**args, backend="reference")


def _vllm(**kw):
    from fusedrope.integrations.vllm import fused_inv_rope_fp8_quant

    (args, _), = [quant_bad()]
    cache = torch.cat([args["cos_cache"], args["sin_cache"]], 1)
    return lambda: fused_inv_rope_fp8_quant(args["o"], args["positions"], cache, 2, 2, **kw)


def _aiter(**kw):
    from fusedrope.integrations import aiter

    (args, _), = [quant_bad()]
    return lambda: aiter.inverse_rope_group_quant(*[args[n] for n in ("o", "positions", "cos_cache", "sin_cache")], 2,
                                                  **kw)


ADAPTER_CASES = {  # the engines' call sites check their flags as the op does: name -> (call, exception, message)
    "vllm tma_aligned_scales str": (_vllm(tma_aligned_scales="False"), TypeError,
                                    "fused_inv_rope_fp8_quant: argument 'tma_aligned_scales' expected a bool, got str 'False'"),
    "vllm tma_aligned_scales numpy": (_vllm(tma_aligned_scales=np.bool_(True)), TypeError,
                                      "fused_inv_rope_fp8_quant: argument 'tma_aligned_scales' expected a bool, got numpy.bool np.True_"),
    "vllm quantize None": (_vllm(quantize=None), TypeError,
                           "fused_inv_rope_fp8_quant: argument 'quantize' expected a bool, got NoneType None"),
    "vllm quantize 0": (_vllm(quantize=0), TypeError, "fused_inv_rope_fp8_quant: argument 'quantize' expected a bool, got int 0"),
    "vllm quantize []": (_vllm(quantize=[]), TypeError, "fused_inv_rope_fp8_quant: argument 'quantize' expected a bool, got list []"),
    "aiter scale_layout bool": (_aiter(scale_layout=True), ValueError,
                                "inverse_rope_group_quant: argument 'scale_layout' expected one of ('row', 'mfma_tile', 'n32k4'), got True"),
    "aiter scale_layout list": (_aiter(scale_layout=["row"]), ValueError,
                                "inverse_rope_group_quant: argument 'scale_layout' expected one of ('row', 'mfma_tile', 'n32k4'), got ['row']"),
}


@pytest.mark.parametrize("name", ADAPTER_CASES)
def test_adapters_check_their_flags(name):
    call, exc, msg = ADAPTER_CASES[name]
    with pytest.raises(exc, match="^" + re.escape(msg) + "$"):
        call()


# -- tensors whose memory does not hold their values: every backend but the reference reads data pointers ----------
_MEMORY = "expected a tensor whose memory holds its values (the kernels read it through its data pointer), got "
UNREADABLE = {  # kind: (the tensor made of a plain one, the context it lives in, exception, what the message says)
    "negative view": (torch._neg_view, contextlib.nullcontext, TypeError,
                      _MEMORY + "a negative view (torch._neg_view, .imag of a conjugate); pass .resolve_neg()"),
    "ZeroTensor": (lambda t: torch._efficientzerotensor(t.shape, dtype=t.dtype), contextlib.nullcontext, TypeError,
                   _MEMORY + "a tensor without storage (a ZeroTensor, a torch.func vmap / grad / jvp wrapper, a functional tensor); call the op on plain tensors, outside the transform"),
    "dual": (lambda t: fwAD.make_dual(t, torch.ones_like(t)), fwAD.dual_level, RuntimeError,
             "expected a tensor without a forward-mode AD tangent (the op has no derivative formula), got a dual tensor, whose tangent the op would drop"),
}
# (kind, argument) of each op; a dual tensor needs a floating dtype, so int positions cannot be one
TTS_UNREADABLE = [(kind, arg) for kind in UNREADABLE for arg in ("q", "k", "cos", "sin", "q_out", "k_norm_weight")]
QUANT_UNREADABLE = [(kind, arg) for kind in UNREADABLE for arg in ("o", "positions", "cos_cache", "sin_cache", "x_fp8")
                    if (kind, arg) != ("dual", "positions")]


@pytest.mark.parametrize("kind, arg", TTS_UNREADABLE)
def test_qwen3_tts_rope_refuses_tensors_whose_memory_is_not_their_values(kind, arg):
    """A negative view read through its data pointer gives minus the answer, a dual tensor loses its tangent, a
    ZeroTensor has no memory: every entry point refuses them, naming the argument (explain too)."""
    make, context, exc, msg = UNREADABLE[kind]
    with context():
        args = tts_bad()
        q, k, cos, sin = args.values()
        w = torch.ones(8, dtype=bf16)
        if arg == "q_out":
            calls = [lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, q_out=make(torch.empty_like(q)))]
        elif arg == "k_norm_weight":
            calls = [lambda: fusedrope.qwen3_tts_qk_norm_rope(q, k, w, make(w), cos, sin)]
        else:
            args[arg] = make(args[arg])
            calls = [functools.partial(f, **args, **kw) for f in (fusedrope.qwen3_tts_rope,
                                                                  functools.partial(fusedrope.explain, "qwen3_tts_rope"))
                     for kw in ({}, {"backend": "reference"}, {"numerics": "eager"}, {"inplace": True})]
        for call in calls:
            with pytest.raises(exc, match="^qwen3_tts_rope: argument '" + arg + "' " + re.escape(msg) + "$"):
                call()


@pytest.mark.parametrize("kind, arg", QUANT_UNREADABLE)
def test_inverse_rope_group_quant_refuses_tensors_whose_memory_is_not_their_values(kind, arg):
    make, context, exc, msg = UNREADABLE[kind]
    with context():
        if arg == "x_fp8":
            (args, _), = [quant_bad(x_fp8=lambda a: make(_bufs()(a)[0]), x_scale=lambda a: _bufs()(a)[1])]
        else:
            (args, _), = [quant_bad(**{arg: lambda a: make(a[arg])})]
        for kw in ({}, {"backend": "reference"}, {"scale_layout": "mfma_tile"}):
            if "x_fp8" in args and args["x_fp8"] is not None and kw:
                continue
            with pytest.raises(exc, match="^inverse_rope_group_quant: argument '" + arg + "' " + re.escape(msg) + "$"):
                fusedrope.inverse_rope_group_quant(**args, **kw)
        with pytest.raises(exc, match=re.escape(msg)):
            fusedrope.explain("inverse_rope_group_quant", **args)


def test_dual_tensors_are_refused_by_the_vllm_adapter_without_quantization():
    """vLLM's quantize=False call returns o's dtype, where a lost tangent would go unnoticed."""
    from fusedrope.integrations.vllm import fused_inv_rope_fp8_quant

    (args, _), = [quant_bad()]
    cache = torch.cat([args["cos_cache"], args["sin_cache"]], 1)
    with fwAD.dual_level():
        o = fwAD.make_dual(args["o"], torch.ones_like(args["o"]))
        with pytest.raises(RuntimeError, match="^inverse_rope_group_quant: argument 'o' expected a tensor without a "
                                               "forward-mode AD tangent"):
            fused_inv_rope_fp8_quant(o, args["positions"], cache, 2, 2, quantize=False)


TRANSFORMS = {  # torch.func transforms whose wrappers have no storage: name -> call f under it with x
    "vmap": lambda f, x: torch.func.vmap(f)(x[None]),
    "jvp": lambda f, x: torch.func.jvp(f, (x,), (x,)),
    "grad": lambda f, x: torch.func.grad(lambda x: f(x).float().sum())(x),
    "functionalize": lambda f, x: torch.func.functionalize(f)(x),
}


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_torch_func_transforms_get_a_clear_error(transform, backend):
    """Not torch's "Cannot access data pointer of Tensor that doesn't have storage" from inside a backend: the
    validation names the argument and the cause, for every backend alike (docs/design.md says why)."""
    q, k, cos, sin = tts_inputs()
    (args, _), = [quant_bad()]
    quant = {n: args[n] for n in ("positions", "cos_cache", "sin_cache", "num_groups")}
    for name, f, x in (("qwen3_tts_rope: argument 'q' ", lambda x: fusedrope.qwen3_tts_rope(x, k, cos, sin, backend=backend)[0], q),
                       ("inverse_rope_group_quant: argument 'o' ", lambda x: fusedrope.inverse_rope_group_quant(x, **quant, quantize=False, backend=backend)[0], args["o"])):
        with pytest.raises(TypeError, match="^" + re.escape(name + UNREADABLE["ZeroTensor"][3]) + "$"):
            TRANSFORMS[transform](f, x)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_a_default_device_of_the_caller_does_not_reach_the_backends(backend):
    """Inside ``with torch.device("meta"):`` every tensor the op makes is on the inputs' device (a scalar tensor
    made on the default device would meet them in torch's device-mismatch error)."""
    (args, _), = [quant_bad()]
    q, k, cos, sin = tts_inputs()
    w, table, positions = torch.ones(8, dtype=bf16), torch.randn(4, 8).to(bf16), torch.tensor([0, 2, 3])
    calls = [lambda: fusedrope.inverse_rope_group_quant(**args, backend=backend),
             lambda: fusedrope.inverse_rope_group_quant(**args, quantize=False, backend=backend),
             lambda: fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend),
             lambda: fusedrope.qwen3_tts_rope(q, k, table, table, positions=positions, numerics="eager", backend=backend),
             lambda: fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w, cos, sin, backend=backend)]
    for call in calls:
        want = call()
        with torch.device("meta"):
            got = call()
        assert all(g.device == v.device and torch.equal(g.view(torch.uint8), v.view(torch.uint8))
                   for g, v in zip(got, want))


def test_a_backend_name_that_is_not_utf8_is_a_value_error(monkeypatch):
    import os

    if not hasattr(os, "environb"):
        pytest.skip("no bytes environment on this platform")
    q, k, cos, sin = tts_inputs()
    monkeypatch.setitem(os.environb, b"FUSEDROPE_BACKEND", b"trit\xffon")
    with pytest.raises(ValueError, match="environment variable FUSEDROPE_BACKEND expected 'auto' or one of .*, got "
                                         "'trit\\\\udcffon'"):
        fusedrope.qwen3_tts_rope(q, k, cos, sin)
    (args, _), = [quant_bad()]
    with pytest.raises(ValueError, match="environment variable FUSEDROPE_BACKEND"):
        fusedrope.inverse_rope_group_quant(**args)


def _at_byte_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """``t``'s values in a new tensor whose data starts ``offset`` bytes into a buffer (as a numpy or DLPack
    buffer at an odd offset can): misaligned for its element size when ``offset`` is not a multiple of it."""
    raw = bytearray(t.numel() * t.element_size() + offset)
    out = torch.frombuffer(raw, dtype=t.dtype, offset=offset, count=t.numel()).view(t.shape)
    out.copy_(t)
    return out


@pytest.mark.skipif(torch.cuda.is_available(), reason="frombuffer makes CPU tensors")
def test_misaligned_data_is_refused_before_a_kernel_reads_it():
    """An int64 positions view at an odd byte offset, a bf16 q one byte off: the Triton kernels (and, in their
    bindings, the compiled ones) refuse them by name instead of faulting on a GPU; the reference reads them."""
    from conftest import backends_here

    if not any(p.values[0] == "triton" and not p.marks for p in backends_here("qwen3_tts_rope")):
        pytest.skip("triton is not available here")
    (args, _), = [quant_bad()]
    pos = _at_byte_offset(args["positions"], 1)
    assert pos.data_ptr() % 8 == 1 and torch.equal(pos, args["positions"])
    with pytest.raises(ValueError, match="^inverse_rope_group_quant: argument 'positions' expected data aligned to "
                                         "its element size \\(8 bytes\\), got a data pointer 1 bytes past that"):
        fusedrope.inverse_rope_group_quant(**dict(args, positions=pos), backend="triton")
    want = fusedrope.inverse_rope_group_quant(**args, backend="reference")
    got = fusedrope.inverse_rope_group_quant(**dict(args, positions=pos), backend="reference")
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))
    q, k, cos, sin = tts_inputs()
    with pytest.raises(ValueError, match="^qwen3_tts_rope: argument 'q' expected data aligned to its element size"):
        fusedrope.qwen3_tts_rope(_at_byte_offset(q, 1), k, cos, sin, backend="triton")
