"""The op-2 torch bindings' argument checks (kernels_cuda/inverse_rope_group_quant_binding.h, shared by the CUDA
and the HIP binding) run on the CPU: tests/inverse_rope_group_quant/irgq_binding_host.cpp builds them against this
torch as a small torch
library, on CPU tensors. Without it they would run only where a GPU builds the extension.

* every scale layout the binding accepts is one the kernels address exactly: the (stride_s, stride_b) it hands
  them reach the view's own elements, no two alike; and it accepts what fusedrope's own validation
  (``buffer_scale_strides``) does, the row-major or the column-major layout, over a grid of strides;
* bad arguments raise a RuntimeError naming the op and the argument, with the integers in the message; among them
  a tensor whose data pointer is off its element size (a frombuffer / numpy / DLPack view at an odd byte offset),
  which the kernels' element loads and stores would fault on.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import pytest
import torch

from compile_cache import build_once, content_key, host_cxx, quoted_includes
from fusedrope.inverse_rope_group_quant import buffer_scale_strides
from fusedrope.testing import deepseek_rope_cache

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent / "irgq_binding_host.cpp"
BINDING = ROOT / "kernels_cuda" / "inverse_rope_group_quant_binding.h"
OP = "fusedrope_host::params"


@pytest.fixture(scope="module")
def params():
    from torch.utils import cpp_extension

    gxx = host_cxx()
    if not gxx:
        pytest.skip("no C++ compiler (g++) to build the binding's checks against torch")
    cmd = [gxx, "-std=c++20" if "c++20" in Path(cpp_extension.__file__).read_text() else "-std=c++17", "-O1", "-w",
           "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           f"-I{BINDING.parent}", *[f"-I{p}" for p in cpp_extension.include_paths()], str(HARNESS),
           *[f"-L{p}" for p in cpp_extension.library_paths()], "-ltorch_cpu", "-lc10"]
    inputs = [HARNESS, BINDING, *sorted(quoted_includes(BINDING))]
    out = Path(tempfile.gettempdir()) / f"fusedrope-binding-host-{os.getuid()}-{content_key(inputs, *cmd)}.so"

    def on_error(stderr: str) -> None:
        pytest.fail(f"binding host build failed:\n{' '.join(cmd)}\n{stderr[-4000:]}")

    torch.ops.load_library(str(build_once(cmd, out, on_error)))
    return torch.ops.fusedrope_host.params


def inputs(S=4, H=16, G=2, q=128):
    o = torch.randn(S, H, 512).bfloat16()
    cos, sin = deepseek_rope_cache(64, 64)
    dg = H * 512 // G
    x = torch.empty(S, G, dg, dtype=torch.float8_e4m3fn)
    sc = torch.empty(S, G, dg // q, dtype=torch.uint8)
    return o, torch.arange(S), cos, sin, x, sc, q


def at_byte_offset(t, offset):
    """A contiguous copy of ``t`` whose data pointer lies ``offset`` bytes past a 64-byte boundary, as a view of a
    frombuffer / numpy / DLPack buffer can."""
    base = torch.zeros(t.numel() * t.element_size() + 64, dtype=torch.uint8)
    assert base.data_ptr() % 64 == 0
    view = torch.frombuffer(base.numpy(), dtype=t.dtype, offset=offset, count=t.numel()).view(t.shape)
    assert view.data_ptr() % 64 == offset
    return view.copy_(t)


def addresses(shape, strides):
    S, G, Ks = shape
    idx = torch.stack(torch.meshgrid(torch.arange(S), torch.arange(G), torch.arange(Ks), indexing="ij"), -1)
    return (idx * torch.tensor(strides)).sum(-1).flatten()


# (S, H, G, q): Ks = H*512/G/q > 1; G = 1; Ks = 1 (H = 1, G = 2, q = 256); S = 1
SHAPES = [(4, 16, 2, 128), (3, 8, 1, 256), (5, 1, 2, 256), (1, 2, 2, 128)]


@pytest.mark.parametrize("S, H, G, q", SHAPES)
def test_scale_layouts_accepted_are_the_validated_ones_and_addressed_exactly(params, S, H, G, q):
    o, p, c, s, x, sc, q = inputs(S, H, G, q)
    Ks = sc.shape[2]
    choices = sorted({0, 1, 2, Ks, G * Ks, S, S + 3, Ks * S, Ks * (S + 3), Ks * (S - 1)})
    base = torch.empty((S + G + Ks) * max(choices) + 1, dtype=torch.uint8)
    accepted = 0
    for st in itertools.product(choices, repeat=3):
        view = base.as_strided(sc.shape, st)
        ours = [buffer_scale_strides(view, t, torch.uint8) for t in ("row", "col")]
        try:
            launch, *_, st_s, st_b = params(o, p, c, s, x, view, q)[:7]
        except RuntimeError as e:
            assert ours == [None, None], (st, str(e))
            assert f"{OP}: argument 'x_scale' expected row-major strides ({G * Ks}, {Ks}, 1) or column-major (1, " \
                   f"{Ks}*L, L) with L >= x_scale.size(0)={S}, got [{', '.join(map(str, st))}]" in str(e)
            continue
        assert launch == 1 and any(w is not None for w in ours), st
        accepted += 1
        # the kernels' address of scale (s, g, k): s*stride_s + (g*Ks + k)*stride_b; the view's: its strides
        kernel = addresses((S, G * Ks, 1), (st_s, st_b, 0))
        assert torch.equal(kernel, addresses(sc.shape, st)), st
        assert kernel.unique().numel() == kernel.numel(), st
    assert accepted >= 2  # row-major and column-major at least


def test_accepted_launch_parameters(params):
    o, p, c, s, x, sc, q = inputs()
    # ... x_stride_s, x_stride_g, scale_layout, scale_rows, pdl, kernel
    assert params(o, p, c, s, x, sc, q) == [1, 4, 16, 2, 128, 64, 1, 1, 64, 64, 8192, 4096, 0, 4, 0, 0]
    col = torch.empty(2, 32, 7, dtype=torch.uint8).permute(2, 0, 1)[:4]  # column-major, token dim padded to 7
    assert params(o, p, c, s, x, col, q) == [1, 4, 16, 2, 128, 1, 7, 1, 64, 64, 8192, 4096, 0, 4, 0, 0]
    p3 = torch.arange(12)[::3]
    assert params(o, p3, c, s, x, sc, q)[7] == 3
    # size-1 dims: their strides address nothing and may be anything; the kernels get 0 (no overflow in bytes)
    huge = 2 ** 62
    o1, p1, c1, s1, x1, sc1, _ = inputs(S=1, H=1, G=2, q=256)  # Ks = 1

    def one(t):
        return t.as_strided(t.shape, [huge if n == 1 else st for n, st in zip(t.shape, t.stride())])

    assert params(o1, one(p1), one(c1[:1]), one(s1[:1]), one(x1), one(sc1), 256) == [1, 1, 1, 2, 256, 0, 1, 0, 0, 0,
                                                                                      0, 256, 0, 1, 0, 0]
    # data pointers aligned to their elements but not to 16 bytes: the kernels' narrow paths take them
    f32 = [at_byte_offset(t.float(), 4) for t in (c, s)]
    assert params(at_byte_offset(o, 2), at_byte_offset(p, 8), *f32, at_byte_offset(x, 1),
                  at_byte_offset(sc.float(), 4), q)[:10] == [1, 4, 16, 2, 128, 64, 1, 1, 32, 32]
    assert params(*inputs(S=0))[0] == 0  # nothing to launch
    assert params(*inputs(S=3, H=0, G=2))[0] == 0  # x_scale [3, 2, 0]: no layout to check either


def bad_cases():
    o, p, c, s, x, sc, q = inputs()
    return {
        "fp32 o": ((o.float(), p, c, s, x, sc, q), "argument 'o' expected dtype bfloat16 or float16, got Float"),
        "head_dim 256": ((o[..., :256].contiguous(), p, c, s, x[..., :2048], sc[..., :16], q),
                         "argument 'o' expected head_dim 512 (the compiled kernel's), got 256"),
        "positions short": ((o, p[:2], c, s, x, sc, q),
                            "argument 'positions' expected a 1-D tensor with at least S=4 elements, got shape [2]"),
        "group 48": ((o, p, c, s, x, sc, 48), "argument 'quant_group_size' expected 32, 64, 128 or 256, got 48"),
        "x_scale shape": ((o, p, c, s, x, sc[:, :, :1], q),
                          "argument 'x_scale' expected shape [4 (or more rows, column-major, for S > 0), 2, 32], got "
                          "[4, 2, 1]"),
        "x_fp8 strided": ((o, p, c, s, x.transpose(1, 2).contiguous().transpose(1, 2), sc, q),
                          "argument 'x_fp8' expected rows of Dg=4096 contiguous and apart (row-major, group-major "
                          "(Dg, S*Dg, 1) or padded rows), got strides [8192, 1, 2]"),
        "x_fp8 rows overlap": ((o, p, c, s, x.as_strided(x.shape, (4096, 2048, 1)), sc, q),
                               "argument 'x_fp8' expected rows of Dg=4096 contiguous and apart"),
        "row-major x_scale with more rows": ((o, p, c, s, x, torch.empty(6, 2, 32, dtype=torch.uint8), q),
                                             "argument 'x_scale' expected row-major strides (64, 32, 1) or "
                                             "column-major (1, 32*L, L) with L >= x_scale.size(0)=6, got [64, 32, 1]"),
        "scale_layout 2": ((o, p, c, s, x, sc, q, 2), "argument 'scale_layout' expected 0 (row- or column-major, "
                                                      "read off the strides) or 1 (mfma_tile), got 2"),
        "mfma_tile shape": ((o, p, c, s, x, torch.empty(2, 32, 33, dtype=torch.uint8), q, 1),
                            "argument 'x_scale' expected a contiguous mfma_tile buffer [2, 32, 32], got shape "
                            "[2, 32, 33] strides [1056, 33, 1]"),
        "mfma_tile fp32": ((o, p, c, s, x, torch.empty(2, 32, 32), q, 1),
                           "argument 'x_scale' expected dtype float8_e8m0fnu or uint8 for mfma_tile, got Float"),
        "cos rope_dim": ((o, p, c[:, :16], s[:, :16], x, sc, q),
                         "argument 'cos' expected shape [max_pos >= 1, 32] (rope_dim 64), got [64, 16]"),
        "o misaligned": ((at_byte_offset(o, 1), p, c, s, x, sc, q), misaligned("o", 2, 1)),
        "positions misaligned": ((o, at_byte_offset(p, 1), c, s, x, sc, q), misaligned("positions", 8, 1)),
        "int32 positions misaligned": ((o, at_byte_offset(p.int(), 6), c, s, x, sc, q),
                                       misaligned("positions", 4, 2)),
        "cos misaligned": ((o, p, at_byte_offset(c.float(), 2), s.float(), x, sc, q), misaligned("cos", 4, 2)),
        "sin misaligned": ((o, p, c, at_byte_offset(s, 3), x, sc, q), misaligned("sin", 4, 3)),
        "x_scale misaligned": ((o, p, c, s, x, at_byte_offset(sc.float(), 7), q), misaligned("x_scale", 4, 3)),
        # an empty o launches nothing, so nothing would zero the padding rows of its x_scale
        "padding rows without tokens": ((*inputs(S=0)[:5], torch.empty(2, 32, 4, dtype=torch.uint8).permute(2, 0, 1),
                                         q), "argument 'x_scale' expected shape [0 (or more rows, column-major, for "
                                             "S > 0), 2, 32], got [4, 2, 32]"),
    }


def misaligned(name, size, off):
    return (f"argument '{name}' expected a data pointer aligned to its element size ({size} bytes), got one {off} "
            "bytes past")


def test_output_layouts_only_the_head_kernel_writes(params):
    """Group-major and padded x_fp8 (its strides handed over), column-major scales with more token rows than o
    (scale_rows; their stride L at least those rows), and the contiguous mfma_tile buffer (scale_layout 1, the
    scale strides unused)."""
    o, p, c, s, x, sc, q = inputs()
    gm = torch.empty(2, 4, 4096, dtype=torch.float8_e4m3fn).permute(1, 0, 2)
    assert params(o, p, c, s, gm, sc, q)[10:14] == [4096, 4 * 4096, 0, 4]
    padded = torch.empty(4, 2, 4096 + 64, dtype=torch.float8_e4m3fn)[..., :4096]
    assert params(o, p, c, s, padded, sc, q)[10:12] == [2 * 4160, 4160]
    col = torch.empty(2, 32, 8, dtype=torch.uint8).permute(2, 0, 1)  # 8 rows for 4 tokens
    assert params(o, p, c, s, gm, col, q)[5:7] == [1, 8] and params(o, p, c, s, gm, col, q)[12:14] == [0, 8]
    short = torch.empty(2 * 32 * 7 + 8, dtype=torch.uint8).as_strided((8, 2, 32), (1, 224, 7))  # L = 7 < 8 rows
    with pytest.raises(RuntimeError, match=r"with L >= x_scale.size\(0\)=8, got \[1, 224, 7\]"):
        params(o, p, c, s, gm, short, q)
    mfma = torch.empty(2, 32, 32, dtype=torch.uint8)
    assert params(o, p, c, s, gm, mfma, q, 1)[5:7] == [0, 0] and params(o, p, c, s, gm, mfma, q, 1)[12:14] == [1, 4]


def test_launch_modes_handed_over_and_checked(params):
    """pdl and kernel reach the kernels' parameters as given (0 or 1); anything else is refused, naming them."""
    o, p, c, s, x, sc, q = inputs()
    assert params(o, p, c, s, x, sc, q)[14:] == [0, 0] and params(o, p, c, s, x, sc, q, 0, 1, 1)[14:] == [1, 1]
    with pytest.raises(RuntimeError, match=f"{OP}: argument 'pdl' expected 0 or 1, got 2"):
        params(o, p, c, s, x, sc, q, 0, 2, 0)
    with pytest.raises(RuntimeError, match=rf"{OP}: argument 'kernel' expected 0 \(generic\) or 1 \(head\), got -1"):
        params(o, p, c, s, x, sc, q, 0, 0, -1)


@pytest.mark.parametrize("S, G", [(2, 2), (3, 1), (1, 4), (3, 2)])
def test_x_layouts_accepted_are_the_validated_ones(params, S, G):
    """The binding accepts exactly the x_fp8 strides fusedrope's own validation does (outputs.rows_apart: rows
    of Dg contiguous, no two sharing an element), over a grid of strides, and hands them to the kernels."""
    from fusedrope.inverse_rope_group_quant.outputs import rows_apart

    o, p, c, s, x, sc, q = inputs(S, 1, G, 128 // G if G > 1 else 128)
    dg = x.shape[2]
    choices = sorted({0, 1, dg - 1, dg, dg + 16, 2 * dg, S * dg, G * dg, (S - 1) * dg + 88, (G - 1) * (dg + 16) + dg})
    base = torch.empty((S + G) * max(choices) + dg, dtype=torch.float8_e4m3fn)
    for st in itertools.product(choices, choices, (1, 2)):
        view = base.as_strided(x.shape, st)
        ours = rows_apart(tuple(x.shape), st)
        try:
            got = params(o, p, c, s, view, sc, q)
        except RuntimeError as e:
            assert not ours and "argument 'x_fp8' expected rows of Dg" in str(e), (st, str(e))
            continue
        assert ours, st
        assert got[10:12] == [st[0] if S > 1 else 0, st[1] if G > 1 else 0], st


@pytest.mark.parametrize("name", list(bad_cases()))
def test_bad_arguments_raise_naming_the_argument(params, name):
    args, msg = bad_cases()[name]
    with pytest.raises(RuntimeError) as e:
        params(*args)
    assert f"{OP}: {msg}" in str(e.value)

