"""Your own kernel behind fusedrope's API: ``fusedrope.register_backend`` gives it fusedrope's validation, output
allocation, dispatch (``backend="mine"``, ``FUSEDROPE_BACKEND=mine``, and ``auto``, which tries yours first),
``explain`` and ``fusedrope.testing.check_backend``.

The "kernel" here is a plain torch function written from the op's contract, standing in for a CUDA/Triton
kernel of yours. It serves bf16 and fp16 only; fusedrope sends other calls to its own backends.

    python examples/custom_backend.py
"""

import torch

import fusedrope
from fusedrope.testing import check_backend

NAME = "mine"


def my_qwen3_tts_rope(q, k, cos, sin, q_out, k_out):
    """Writes ``q_out``/``k_out`` (``q``/``k`` themselves for ``inplace=True``): x*cos + rotate_half(x)*sin, in
    fp32, rounded once. Inputs arrive validated: shapes, dtypes, devices and the last stride are fusedrope's
    checks, not this function's."""
    h = q.shape[-1] // 2
    c, s = cos.float()[:, None], sin.float()[:, None]  # [B or 1, 1, S, D]: broadcast over the heads
    for x, out in ((q, q_out), (k, k_out)):
        xf = x.float()
        rotated = torch.cat((-xf[..., h:], xf[..., :h]), dim=-1)
        out.copy_(xf * c + rotated * s)


def supports(facts):
    """``facts``: ``fusedrope.qwen3_tts_rope.Facts(device, dtype, head_dim, inplace, eager, table, norm, pdl)``, the
    call's device, q's dtype, ``D``, ``inplace=True``, ``numerics="eager"``, ``positions=`` given, the norm
    (``qwen3_tts_qk_norm_rope``) and ``enable_pdl=True``; a registered backend is asked only about calls with the
    last four False (the others go to the built-in backends). Returns None to serve the call, else why not.

    A backend of ``inverse_rope_group_quant`` reads ``fusedrope.inverse_rope_group_quant.Facts(device, o_dtype,
    head_dim, rope_dim, quant_group_size, cache_dtype, positions_dtype, fp8_dtype, scale_dtype, scale_layout,
    quantize, x_contiguous, pdl, scale_pad)``, asked only with ``scale_layout`` "row" or "col", ``quantize`` and
    ``x_contiguous`` True and ``scale_pad`` False (docs/design.md says what each field is)."""
    return None if facts.dtype in (torch.bfloat16, torch.float16) else "serves bf16 and fp16 only"


def register():
    fusedrope.register_backend("qwen3_tts_rope", NAME, my_qwen3_tts_rope, supports=supports)


def main():
    register()
    print(f"check_backend: {check_backend('qwen3_tts_rope', NAME)} cases within the contract")
    q, k = torch.randn(1, 16, 8, 128, dtype=torch.bfloat16), torch.randn(1, 8, 8, 128, dtype=torch.bfloat16)
    cos, sin = fusedrope.testing.qwen3_tts_cos_sin(torch.arange(8)[None])
    print(fusedrope.explain("qwen3_tts_rope", q, k, cos, sin))
    print(fusedrope.explain("qwen3_tts_rope", q.float(), k.float(), cos.float(), sin.float()))


if __name__ == "__main__":
    main()
