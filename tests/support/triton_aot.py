"""Compile fusedrope's Triton kernels ahead of time for GPUs this machine does not have (sm_90, sm_80, gfx942,
gfx950; the quant kernel in both fp8 formats, with the EXACT its launcher picks for the arch) and count the
memory instructions that say whether accesses are 16 bytes wide.

Run as a script (TRITON_INTERPRET must be unset): prints one JSON object {kernel/target: {counts}}.
Pointers and the strides an engine's tensors have are declared divisible by 16, as Triton's launcher
specialises them at run time.
"""

import json
import os
import re
import sys

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "unset TRITON_INTERPRET to compile for GPUs"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from fusedrope.inverse_rope_group_quant import triton as irq  # noqa: E402
from fusedrope._device import arch_fp8_dtype  # noqa: E402
from fusedrope.qwen3_tts_rope import triton as tts  # noqa: E402

TARGETS = {"sm_90": GPUTarget("cuda", 90, 32), "sm_80": GPUTarget("cuda", 80, 32),
           "gfx942": GPUTarget("hip", "gfx942", 64), "gfx950": GPUTarget("hip", "gfx950", 64)}
FNUZ = torch.float8_e4m3fnuz
FP8_FORMATS = {"fn": torch.float8_e4m3fn, "fnuz": FNUZ}


def compile_kernel(fn, pointers: dict, constexprs: dict, divisible: set, target, num_warps: int, **opts):
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = pointers.get(name, "i32")
        if name in pointers or name in divisible:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=target, options={"num_warps": num_warps, **opts})


def cuobjdump_sass(cubin: bytes) -> str:
    """SASS of a cubin, by the cuobjdump that ships inside the Triton wheel."""
    import subprocess
    import tempfile
    from pathlib import Path

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), "-sass", f.name], check=True, capture_output=True, text=True).stdout


def _loads_after_first_store(mem_ops: list, load: str, store: str) -> int:
    """Global loads that come after the first 16-byte global store (the tile's x data) in the instruction stream;
    a narrower store before it is the padding-row programs' zero scales, a branch of their own."""
    return mem_ops[mem_ops.index(store):].count(load) if store in mem_ops else 0


def counts(k, target) -> dict:
    if target.backend == "cuda":
        ptx = k.asm["ptx"]
        sass = cuobjdump_sass(k.asm["cubin"])
        mem = ["STG.128" if m.endswith("128") and m.startswith("STG") else m[:3]
               for m in re.findall(r"\b(?:LDG|STG)\.E\S*", sass)]
        ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", sass, re.M)
        return {"sass_ldg128": len(re.findall(r"LDG\.E\.128", sass)),
                "instructions": len(ops), "shared": ops.count("LDS") + ops.count("STS"), "barriers": ops.count("BAR"),
                "loads_after_first_store": _loads_after_first_store(mem, "LDG", "STG.128"),
                "sass_stg128": len(re.findall(r"STG\.E\.128", sass)),
                "sass_local": len(re.findall(r"\b(?:LDL|STL)\b", sass)),
                "ld_v4": len(re.findall(r"ld\.global(?:\.\w+)*\.v4", ptx)),
                "st_v4": len(re.findall(r"st\.global(?:\.\w+)*\.v4", ptx)),
                "ld": ptx.count("ld.global"), "st": ptx.count("st.global"),
                "cvt_e4m3": len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2", ptx))}
    asm = k.asm["amdgcn"]
    ops = re.findall(r"\b(?:global|buffer)_(load|store)_(\w+)", asm)
    code = [ln for ln in asm.splitlines() if re.match(r"\t[a-z]", ln)]  # instructions, not directives or labels
    return {"load_x4": sum(1 for a, b in ops if a == "load" and b == "dwordx4"),
            "instructions": len(code), "shared": len(re.findall(r"\bds_(?:read|write|load|store)", asm)),
            "barriers": asm.count("s_barrier"),
            "loads_after_first_store": _loads_after_first_store(
                ["store_x4" if (a, b) == ("store", "dwordx4") else a for a, b in ops], "load", "store_x4"),
            "store_x4": sum(1 for a, b in ops if a == "store" and b == "dwordx4"),
            "loads": sum(1 for a, _ in ops if a == "load"), "stores": sum(1 for a, _ in ops if a == "store"),
            "scratch": int(bool(re.search(r"\bscratch_(load|store)", asm)))}


TTS_TENSORS = ("q_ptr", "k_ptr", "cos_ptr", "sin_ptr", "qo_ptr", "ko_ptr", "qw_ptr", "kw_ptr")


def tts_ptrs(dtype: str, table: str = "", positions: str = "i64") -> dict:
    ptrs = {n: f"*{dtype}" for n in TTS_TENSORS}
    ptrs.update(pos_ptr=f"*{positions}", eps="fp32")
    if table:
        ptrs.update(cos_ptr=f"*{table}", sin_ptr=f"*{table}")
    return ptrs


def tts_kernel(target, dtype="bf16", head_dim=128, hq=32, hkv=8, eager=False, table="", norm=False):
    """The kernel with the launch shape the launcher picks on ``target`` (default: wide_heads, the widest tile);
    ``eager`` numerics (no FP fusion, as launched), cos/sin ``table`` of that dtype read at positions, the q/k
    ``norm``."""
    block_d, block_hq, block_hk, warps = tts.launch_shape(hq, hkv, head_dim, target.warp_size)
    ptrs = tts_ptrs(dtype, table)
    strides = {n for n in tts._tts_rope_kernel.arg_names if "_s" in n and n not in ptrs}
    consts = dict(HALF=head_dim // 2, BLOCK_D=block_d, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, EAGER=eager,
                  TABLE=bool(table), NORM=norm, EXACT=False, MROPE=0, SEC_T=0, SEC_H=0)
    return compile_kernel(tts._tts_rope_kernel, ptrs, consts, strides, target, warps, enable_fp_fusion=not eager)


def x_strides(layout: str, tokens: int, groups: int, dg: int) -> tuple:
    """x [S, G, Dg]'s token and group strides in each layout the kernel serves (vLLM's group-major: [G, S, Dg])."""
    return {"row": (groups * dg, dg), "group_major": (dg, tokens * dg), "padded": (groups * dg + 64, dg)}[layout]


def quant_kernel(tname, fp8, group_size=128, rope=True, x_layout="row", quant=True, mfma=False, heads=16,
                 head_dim=512, rope_dim=64, groups=2, o="bf16", strides=None, packed=False, tokens=1024,
                 n32k4=False, plain=False):
    """The fused quant kernel for target ``tname`` writing ``fp8`` (o's dtype ``o`` with ``quant=False``) into x in
    ``x_layout`` (or with token and group ``strides``), scales row-major (``packed`` int32, ``plain`` fp32 of
    scale_format="fp32") or ``mfma`` / ``n32k4`` tiles, with
    the EXACT its launcher picks there, and the tile and group path its launcher picks at S = ``tokens``. x's
    strides are declared divisible by 16 where their values are, as Triton's launcher specialises them."""
    target = TARGETS[tname]
    row = heads * head_dim
    dg = row // groups
    block_t, block_n = irq._tiles(tokens, row, group_size, packed)
    ptrs = dict(o_ptr=f"*{o}", pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", xq_ptr="*u8" if quant else f"*{o}",
                xs_ptr=("*i32" if packed else "*fp32" if plain else "*u8") if quant else f"*{o}")
    consts = dict(HEAD_DIM=head_dim, ROPE_DIM=rope_dim, GS=group_size, DG=dg, BLOCK_T=block_t, BLOCK_N=block_n,
                  ONE_GROUP=groups == 1 or dg % block_n == 0, CROSSINGS=irq.crossings(dg, block_n),
                  FP8_MAX=irq.FP8_MAX[fp8], FP8_TYPE=irq._FP8_TL[fp8], FNUZ=fp8 == FNUZ, SCALE_FP32=plain,
                  PACKED=packed, MFMA_K=(2 if group_size == 128 else 8) if mfma else 0, N32K4=n32k4, PLAIN=plain,
                  QUANT=quant, ROPE=rope,
                  TAIL_SEGMENTS=rope and irq.tail_segments(head_dim, rope_dim, block_n),
                  EXACT=irq.integer_fp8_rounding(fp8, tname) if quant else False)
    stride_s, stride_g = strides or x_strides(x_layout, tokens, groups, dg)
    divisible = {"ROW", "NBLK", "cos_stride", "sin_stride"} | {
        name for name, v in dict(x_stride_s=stride_s, x_stride_g=stride_g).items() if v % 16 == 0}
    return compile_kernel(irq._group_quant_kernel, ptrs, consts, divisible, target,
                          irq.num_warps_for(block_t * block_n, target.warp_size, irq.QUANT_PER_THREAD),
                          enable_fp_fusion=False)


def variants(tname) -> int:
    """Compile every other specialisation a GPU call can hit (dtypes, head_dims, masked halves, fp32 / packed
    scales, plain fp32 scales, int32 positions, x layouts and tiles straddling groups, mfma and n32k4 scale
    tiles, quantize=False, the
    baseline's rope kernel): a first GPU run must not die in the compiler."""
    target = TARGETS[tname]
    n = 0
    for dt in ("fp16", "fp32", "bf16"):
        for head_dim in (64, 96, 256):
            block_d, block_hq, block_hk, warps = tts.launch_shape(32, 8, head_dim, target.warp_size)
            for eager, table, norm, pos in ((False, "", False, "i64"), (True, "fp32", True, "i32")):
                ptrs = tts_ptrs(dt, table, pos)
                consts = dict(HALF=head_dim // 2, BLOCK_D=block_d, BLOCK_HQ=block_hq, BLOCK_HK=block_hk,
                              EAGER=eager, TABLE=bool(table), NORM=norm, EXACT=False, MROPE=0, SEC_T=0,
                              SEC_H=0)
                compile_kernel(tts._tts_rope_kernel, ptrs, consts, set(), target, warps, enable_fp_fusion=not eager)
                n += 1
    # multimodal RoPE (the talker's): contiguous sections on [3, B, S, D] planes, interleaved ones on a table
    for mrope, table in ((1, ""), (2, "fp32")):
        block_d, block_hq, block_hk, warps = tts.launch_shape(16, 8, 128, target.warp_size)
        consts = dict(HALF=64, BLOCK_D=block_d, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, EAGER=True, TABLE=bool(table),
                      NORM=True, EXACT=False, MROPE=mrope, SEC_T=24, SEC_H=20)
        compile_kernel(tts._tts_rope_kernel, tts_ptrs("bf16", table, "i64"), consts, set(), target, warps,
                       enable_fp_fusion=False)
        n += 1
    fp8 = arch_fp8_dtype(tname)
    # (3, 96, 24): a rope_dim that is no power of two, the per-pair cos/sin gather
    for (heads, head_dim, rope_dim, gs) in ((3, 192, 32, 64), (16, 512, 64, 256), (3, 96, 24, 32)):
        for scale_fp32, packed in ((True, False), (False, True)):
            block_t, block_n = irq._tiles(7, heads * head_dim, gs, packed)
            ptrs = dict(o_ptr="*fp16", pos_ptr="*i32", cos_ptr="*bf16", sin_ptr="*bf16", xq_ptr="*u8",
                        xs_ptr="*fp32" if scale_fp32 else "*i32")
            consts = dict(HEAD_DIM=head_dim, ROPE_DIM=rope_dim, GS=gs, DG=heads * head_dim, BLOCK_T=block_t,
                          BLOCK_N=block_n, ONE_GROUP=True, CROSSINGS=0,
                          FP8_MAX=irq.FP8_MAX[fp8], FP8_TYPE=irq._FP8_TL[fp8], FNUZ=fp8 == FNUZ,
                          SCALE_FP32=scale_fp32, PACKED=packed, MFMA_K=0, N32K4=False, PLAIN=False, QUANT=True,
                          ROPE=True,
                          TAIL_SEGMENTS=irq.tail_segments(head_dim, rope_dim, block_n),
                          EXACT=irq.integer_fp8_rounding(fp8, tname))
            compile_kernel(irq._group_quant_kernel, ptrs, consts, set(), target, 4, enable_fp_fusion=False)
            n += 1
    # The output layouts: tiles that straddle groups (Dg 384 and 192 with a 1024-column tile) into group-major x,
    # packed scales there (at S = 7); mfma tiles in both k alignments where tiles straddle groups (Dg 384);
    # quantize=False in fp16 (group-major) and bf16 (straddling, row-padded); token and group strides not
    # divisible by 16 (scalar stores), quantized and not.
    d192 = dict(head_dim=192, rope_dim=32, x_layout="group_major")
    quant_kernel(tname, fp8, 64, heads=4, groups=2, **d192)
    quant_kernel(tname, fp8, 64, heads=6, groups=6, **d192)
    quant_kernel(tname, fp8, 32, heads=4, groups=2, packed=True, tokens=7, **d192)
    for gs in (128, 32):
        quant_kernel(tname, fp8, gs, mfma=True, heads=6, head_dim=128, groups=2)
    quant_kernel(tname, fp8, quant=False, o="fp16", x_layout="group_major")
    quant_kernel(tname, fp8, 64, quant=False, heads=4, groups=2, **dict(d192, x_layout="padded"))
    for quant in (True, False):
        quant_kernel(tname, fp8, quant=quant, strides=(8195, 4097 * 1024))
    # the scale formats and layouts only Triton writes: plain fp32 scales, n32k4 tiles (quant group 32)
    quant_kernel(tname, fp8, plain=True)
    quant_kernel(tname, fp8, 32, n32k4=True)
    n += 11
    compile_kernel(irq._rope_tail_inplace_kernel, dict(o_ptr="*bf16", pos_ptr="*i64", cos_ptr="*fp32",
                                                       sin_ptr="*fp32"),
                   dict(HEAD_DIM=512, HALF=32, HALF_P2=32, BLOCK_T=4, BLOCK_H=16, EXACT=False), set(), target,
                   8, enable_fp_fusion=False)
    return n + 1


def main() -> dict:
    out = {}
    for tname, target in TARGETS.items():
        out[f"tts_rope/{tname}"] = counts(tts_kernel(target), target)
        out[f"tts_rope_eager/{tname}"] = counts(tts_kernel(target, eager=True), target)
        out[f"tts_rope_table/{tname}"] = counts(tts_kernel(target, table="bf16"), target)
        out[f"tts_qk_norm_rope/{tname}"] = counts(tts_kernel(target, eager=True, table="fp32", norm=True), target)
        for fmt, fp8 in FP8_FORMATS.items():  # every format on every target: fnuz on gfx950 is a real call
            for gs in (32, 128):
                out[f"inverse_rope_quant_g{gs}_{fmt}/{tname}"] = counts(quant_kernel(tname, fp8, gs), target)
        for gs in (32, 128):  # the quant alone, in the arch's own format: what the rotation adds to it
            out[f"quant_only_g{gs}/{tname}"] = counts(quant_kernel(tname, arch_fp8_dtype(tname), gs, False), target)
        # the output layouts, in the arch's own format: x group-major (vLLM) and row-padded, mfma scale tiles,
        # quantize=False (bf16 x), and a head_dim whose tiles straddle groups (Dg 384, x group-major)
        fp8 = arch_fp8_dtype(tname)
        for layout in ("group_major", "padded"):
            out[f"x_{layout}/{tname}"] = counts(quant_kernel(tname, fp8, x_layout=layout), target)
        for gs in (32, 128):
            out[f"mfma_tile_g{gs}/{tname}"] = counts(quant_kernel(tname, fp8, gs, mfma=True), target)
        out[f"quantize_false/{tname}"] = counts(quant_kernel(tname, fp8, quant=False), target)
        out[f"quantize_false_group_major/{tname}"] = counts(quant_kernel(tname, fp8, quant=False,
                                                                         x_layout="group_major"), target)
        out[f"straddling_group_major/{tname}"] = counts(quant_kernel(
            tname, fp8, 64, x_layout="group_major", heads=4, head_dim=192, rope_dim=32, groups=2), target)
        out[f"straddling_row/{tname}"] = counts(quant_kernel(
            tname, fp8, 64, heads=4, head_dim=192, rope_dim=32, groups=2), target)
        out[f"variants/{tname}"] = {"compiled": variants(tname)}
    return out


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    json.dump(main(), sys.stdout, indent=1)
