"""The issue budget of every kernel a GPU call can get, counted on the CPU: warp-instructions issued along each
warp's path (bench/static/sass.py) for the exact launch fusedrope's launchers make (bench/static/nvidia.py), against
the bytes the work must move, beside vLLM's own Triton kernel compiled the same way.

    python bench/static/budget.py [--out DIR] [--quick] [--vllm-wheel WHEEL | --no-vllm]

Writes DIR/budget.json (one row per kernel and shape) and DIR/README.md (the tables, the command, the constants).
``--quick`` counts the shapes the CI gate checks (tests/test_issue_budget.py). vLLM's kernel is read at run time
from its wheel or the one file taken out of it (``--vllm-wheel``, else what ``bash gpu/run.sh --fetch-wheels`` put in
``.whl/``: fusedrope/benchmark/vllm_peer.py) and never committed; without it its rows are left out, and the README
says so.

Issue time = warp-instructions / (SMs x schedulers x clock); byte time = ideal bytes / copy bandwidth. Where
issue time comes close to byte time a kernel cannot reach the memory roofline, however clean its accesses. What
the count cannot see: how well memory latency is hidden (occupancy helps, the count does not model stalls), how
many sectors each access touches (coalescing; reported by width only), tail effects of the last wave.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, not the interpreter
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said out loud (vLLM's launch)
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import nvidia as N  # noqa: E402

ROOT = N.ROOT
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "qwen3_tts_rope"))
import torch  # noqa: E402

# H200 (sm_90): 132 SMs x 4 warp schedulers, each issuing one warp-instruction per cycle at the 1.98 GHz boost
# clock; 4.3 TB/s is the device-to-device copy measured on it (read + written bytes, docs/benchmarks.md).
H200 = dict(name="NVIDIA H200", sms=132, schedulers=4, clock_ghz=1.98, copy_tbs=4.3, max_warps=64, regs=65536,
            max_blocks=32, smem=228 * 1024, reg_unit=256)
QUANT_S = (1, 8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384)
QUANT_HG = ((16, 2), (8, 1))
TTS_CASES = {"qwen3_tts": (16, 16, 8), "qwen3_tts_full_groups": (17, 16, 8), "small_tts": (8, 8, 4),
             "gqa1": (17, 16, 1), "no_gqa": (16, 8, 8), "wide_heads": (32, 32, 8)}
MAX_POS = 4096


def occupancy(launch: N.Launch, gpu=H200) -> dict:
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    wpb = -(-threads // 32)
    per_warp = -(-max(launch.registers, 1) * 32 // gpu["reg_unit"]) * gpu["reg_unit"]
    by_smem = gpu["smem"] // (launch.shared + 1024) if launch.shared else gpu["max_blocks"]
    blocks_sm = max(0, min(gpu["max_blocks"], gpu["max_warps"] // wpb, gpu["regs"] // (wpb * per_warp), by_smem))
    blocks = launch.grid[0] * launch.grid[1] * launch.grid[2]
    return dict(blocks_per_sm=blocks_sm, occupancy=blocks_sm * wpb / gpu["max_warps"],
                waves=blocks / (blocks_sm * gpu["sms"]) if blocks_sm else math.inf)


def row(label: str, shape: dict, launch: N.Launch, ideal_bytes: float, gpu=H200, sample_blocks: int = 6) -> dict:
    c = launch.count(sample_blocks)
    issue_s = c.instructions / (gpu["sms"] * gpu["schedulers"] * gpu["clock_ghz"] * 1e9)
    byte_s = ideal_bytes / (gpu["copy_tbs"] * 1e12)
    return dict(kernel=label, **shape, symbol=launch.kernel, grid=list(launch.grid), block=list(launch.block),
                registers=launch.registers, shared=launch.shared, **occupancy(launch, gpu), warps=c.warps,
                instructions=round(c.instructions), per_warp=round(c.instructions / c.warps, 1),
                per_warp_range=[c.per_warp_min, c.per_warp_max], ideal_bytes=int(ideal_bytes),
                per_kb=round(c.instructions / (ideal_bytes / 1024), 1), issue_over_bytes=round(issue_s / byte_s, 3),
                lane_use=round(c.lane_use, 3), memory={k: round(v / c.warps, 3) for k, v in sorted(c.memory.items())},
                predicated_off=round(c.predicated_off / c.warps, 2),
                divergent_branches=round(c.divergent_branches / c.warps, 2),
                loop_trips=round(c.backward_taken / c.warps, 2), data_branches=c.data_branches,
                sampled_blocks=c.sampled_blocks, exact=c.exact)


# ---- inverse_rope_group_quant ---------------------------------------------------------------------------------
def quant_tensors(S: int, H: int, G: int, q: int, layout: str):
    """o, positions, the cos | sin halves of one fp32 cache, x_fp8 and x_scale in ``layout``: "row" (the op's
    default: contiguous x, row-major e8m0 scales) or "vllm" (vLLM's: group-major x, column-major fp32 scales
    with TMA-aligned padding rows)."""
    o = torch.empty(S, H, 512, dtype=torch.bfloat16)
    pos = torch.zeros(S, dtype=torch.int64)
    cache = torch.empty(MAX_POS, 64, dtype=torch.float32)
    cos, sin = cache[:, :32], cache[:, 32:]
    dg = H * 512 // G
    if layout == "row":
        x = torch.empty(S, G, dg, dtype=torch.float8_e4m3fn)
        s = torch.empty(S, G, dg // q, dtype=torch.float8_e8m0fnu)
    else:
        x = torch.empty(G, S, dg, dtype=torch.float8_e4m3fn).transpose(0, 1)
        t_pad = -(-S // 4) * 4
        s = torch.empty(G, dg // q, t_pad, dtype=torch.float32).permute(2, 0, 1)
    return o, pos, cache, cos, sin, x, s


def quant_bytes(S, H, q, scale_bytes) -> int:
    """The contract's ideal bytes: o read, one cos and one sin row (fp32) per token, fp8 written, one scale each."""
    return S * (H * 512 * 2 + 2 * 32 * 4 + H * 512 + H * 512 // q * scale_bytes)


class Quant:
    def __init__(self, root: Path):
        import irgq_harness as H

        self.h = H
        self.rec = N.Recorder(root / "kernels_cuda" / "inverse_rope_group_quant.cu",
                              ROOT / "tests/support/cuda_emul/irgq_harness.cpp", lockstep=True)

    def cuda(self, S, H, G, q, layout, kernel) -> N.Launch:
        o, pos, _, cos, sin, x, s = quant_tensors(S, H, G, q, layout)
        return self.rec.launch(self.h.emulate(self.rec.lib, o, pos, cos, sin, x, s, q, kernel=kernel))

    @staticmethod
    def triton(S, H, G, q, layout) -> N.Launch:
        from fusedrope.inverse_rope_group_quant import triton as irq

        o, pos, _, cos, sin, x, s = quant_tensors(S, H, G, q, layout)
        layout = "row" if layout == "row" else "col"
        return N.triton_launch_of(lambda: irq.inverse_rope_group_quant(o, pos, cos, sin, x, s, q, scale_layout=layout))


def vllm_launch(kernel, S, H, G, q=128) -> N.Launch:
    """The launch vLLM's fused_inv_rope_fp8_quant makes on sm_90 (fusedrope/benchmark/vllm_peer.py)."""
    from fusedrope.benchmark import vllm_peer

    o, pos, cache, *_ = quant_tensors(S, H, G, q, "vllm")
    return N.triton_launch_of(lambda: vllm_peer.launch(kernel, o, pos, cache, *vllm_peer.outputs(o, G, q), G, q))


# ---- qwen3_tts_rope ---------------------------------------------------------------------------------------------
def tts_tensors(B, S, Hq, Hkv, D=128):
    q = torch.empty(B, Hq, S, D, dtype=torch.bfloat16)
    k = torch.empty(B, Hkv, S, D, dtype=torch.bfloat16)
    cos = torch.empty(B, S, D, dtype=torch.bfloat16)
    sin = torch.empty(B, S, D, dtype=torch.bfloat16)
    return q, k, cos, sin, torch.empty_like(q), torch.empty_like(k)


def tts_bytes(B, S, Hq, Hkv, D=128) -> int:
    return B * S * ((Hq + Hkv) * D * 2 * 2 + 2 * D * 2)


class Tts:
    def __init__(self, root: Path):
        import test_qwen3_tts_rope_cuda as t1

        self.t1 = t1
        self.rec = N.Recorder(root / "kernels_cuda" / "qwen3_tts_rope.cu", ROOT / "tests/support/cuda_emul/harness.cpp",
                              lockstep=False)

    def cuda(self, B, S, Hq, Hkv) -> N.Launch:
        return self.rec.launch(self.t1.emu_call(self.rec.lib, *tts_tensors(B, S, Hq, Hkv)))

    @staticmethod
    def triton(B, S, Hq, Hkv) -> N.Launch:
        from fusedrope.qwen3_tts_rope import triton as tt

        return N.triton_launch_of(lambda: tt.qwen3_tts_rope(*tts_tensors(B, S, Hq, Hkv)))


# ---- the run ------------------------------------------------------------------------------------------------------
def quant_matrix(quick: bool):
    """(S, H, G, q) of the seed matrix: the S sweep at group 128 for both (H, G), the group axis at S = 2048 and
    8192 for (16, 2); quick: S = 1, 128 and 8192 at group 128, and 8192 at group 32."""
    if quick:
        return [(S, 16, 2, 128) for S in (1, 128, 8192)] + [(8192, 8, 1, 128), (8192, 16, 2, 32)]
    out = [(S, H, G, 128) for H, G in QUANT_HG for S in QUANT_S]
    return out + [(S, 16, 2, q) for S in (2048, 8192) for q in (32, 64)]


def tts_matrix(quick: bool):
    cases = ("qwen3_tts", "wide_heads") if quick else tuple(TTS_CASES)
    return [(name, B) for name in cases for B in ((1, 32) if quick else (1, 8, 32))]


def run(quick: bool, vllm_wheel: Path | None, root: Path = ROOT, log=print) -> list[dict]:
    rows = []
    quant, tts = Quant(root), Tts(root)
    from fusedrope.benchmark import vllm_peer

    vk = vllm_peer.load_kernel(vllm_wheel) if vllm_wheel else None
    for S, H, G, q in quant_matrix(quick):
        shape = dict(op="inverse_rope_group_quant", S=S, H=H, G=G, q=q)
        row_bytes, vllm_bytes = quant_bytes(S, H, q, 1), quant_bytes(S, H, q, 4)
        contenders = [("cuda (default, generic kernel)", "row", lambda: quant.cuda(S, H, G, q, "row", 0)),
                      ("cuda head kernel (candidate)", "row", lambda: quant.cuda(S, H, G, q, "row", 1)),
                      ("cuda head kernel (candidate), vLLM layout", "vllm", lambda: quant.cuda(S, H, G, q, "vllm", 1)),
                      ("triton", "row", lambda: Quant.triton(S, H, G, q, "row")),
                      ("triton, vLLM layout", "vllm", lambda: Quant.triton(S, H, G, q, "vllm"))]
        if vk is not None and q == 128:
            contenders.append(("vLLM fused_inv_rope_fp8_quant", "vllm", lambda: vllm_launch(vk, S, H, G, q)))
        for label, layout, make in contenders:
            t = time.time()
            r = row(label, dict(shape, layout=layout), make(), row_bytes if layout == "row" else vllm_bytes)
            rows.append(r)
            log(f"{label:44s} S={S:5d} H={H:2d} G={G} q={q:3d}: {r['per_warp']:7.1f}/warp {r['per_kb']:6.1f}/KB "
                f"issue/bytes {r['issue_over_bytes']:.2f} ({time.time() - t:.1f}s)")
    for name, B in tts_matrix(quick):
        S, Hq, Hkv = TTS_CASES[name]
        shape = dict(op="qwen3_tts_rope", case=name, B=B, S=S, Hq=Hq, Hkv=Hkv)
        for label, make in (("cuda (default)", lambda: tts.cuda(B, S, Hq, Hkv)),
                            ("triton", lambda: Tts.triton(B, S, Hq, Hkv))):
            t = time.time()
            r = row(label, shape, make(), tts_bytes(B, S, Hq, Hkv))
            rows.append(r)
            log(f"{label:44s} {name}-B{B}: {r['per_warp']:7.1f}/warp {r['per_kb']:6.1f}/KB "
                f"issue/bytes {r['issue_over_bytes']:.2f} ({time.time() - t:.1f}s)")
    return rows


def provenance(args, vllm_wheel) -> dict:
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return ""
    import triton
    return dict(commit=out(["git", "rev-parse", "HEAD"]), dirty=bool(out(["git", "status", "--porcelain"])),
                command="python bench/static/budget.py " + " ".join(sys.argv[1:]), machine=platform.node(),
                cpu=platform.processor() or platform.machine(), nvcc=out([N.find_nvcc(), "--version"]).splitlines()[-1],
                triton=triton.__version__, torch=torch.__version__, vllm_wheel=vllm_wheel.name if vllm_wheel else None,
                gpu_model=H200, date=time.strftime("%Y-%m-%d"))


def find_vllm_wheel(arg: str | None) -> Path | None:
    from fusedrope.benchmark import vllm_peer

    return Path(arg) if arg else vllm_peer.find_source()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for budget.json and README.md")
    ap.add_argument("--quick", action="store_true", help="the CI gate's shapes only")
    ap.add_argument("--vllm-wheel", default=None, help="vLLM's wheel or its kernel's file (default: .whl/'s)")
    ap.add_argument("--no-vllm", action="store_true", help="leave vLLM's kernel out")
    args = ap.parse_args(argv)
    wheel = None if args.no_vllm else find_vllm_wheel(args.vllm_wheel)
    prov = provenance(args, wheel)  # the tree as the count starts
    rows = run(args.quick, wheel)
    if args.out:
        import report

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "budget.json").write_text(json.dumps(dict(provenance=prov, rows=rows), indent=1))
        (out / "README.md").write_text(report.markdown(prov, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
