"""How often fusedrope differs from the model's own code, bit for bit, over the seed cases: qwen3_tts_qk_norm_rope
against q_norm, k_norm, then apply_rotary_pos_emb evaluated by PyTorch on the same device; and qwen3_tts_rope's
default fp32 numerics against apply_rotary_pos_emb alone (what numerics="eager" removes).

    python bench/qk_norm_identity.py [--backend triton] [--max-batch 8]

On a CPU, Triton runs in its interpreter (set here) and PyTorch's CPU kernels are the model's; on a GPU, both
run there. Prints one row per dtype and comparison: elements compared, elements that differ, the identical share.
"""

import argparse
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusedrope  # noqa: E402
from fusedrope.benchmark import rms_norm_rope, tts_formula  # noqa: E402
from fusedrope.testing import TTS_CASES, make_tts_inputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--max-batch", type=int, default=8, help="the seed cases up to this batch")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"| comparison | dtype | elements | differ | identical |  ({args.backend} backend on {device}, "
          f"cases with batch <= {args.max_batch})\n|---|---|---|---|---|")
    for what in ("qk_norm_rope vs the model's norms and RoPE", "qwen3_tts_rope fp32 numerics vs the model's RoPE"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            total = differ = 0
            for case in (c for c in TTS_CASES if c.batch <= args.max_batch):
                q, k, cos, sin = make_tts_inputs(case, dtype=dtype, device=device, seed=case.seed)
                if what.startswith("qk_norm"):
                    g = torch.Generator().manual_seed(case.seed + 1)
                    qw, kw = (1 + 0.3 * torch.randn(2, case.head_dim, generator=g)).to(dtype).to(device)
                    got = fusedrope.qwen3_tts_qk_norm_rope(q, k, qw, kw, cos, sin, backend=args.backend)
                    want = rms_norm_rope(q, k, qw, kw, cos, sin)
                else:
                    got, want = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=args.backend), tts_formula(
                        q, k, cos, sin)
                total += sum(w.numel() for w in want)
                differ += sum(int((a != b).sum()) for a, b in zip(got, want))
            print(f"| {what} | {str(dtype).removeprefix('torch.')} | {total:,} | {differ:,} | "
                  f"{1 - differ / total:.5%} |")


if __name__ == "__main__":
    main()
