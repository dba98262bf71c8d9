"""Triton helpers shared by both ops.

Under ``TRITON_INTERPRET=1`` (how CI runs the kernels on CPU) Triton 3.9's float conversions are wrong:
``.to(tl.bfloat16)`` truncates and ``.to(tl.float8e4nv)`` rounds wrongly and makes NaN instead of
saturating. The kernels take an ``EXACT`` constexpr, set only when interpreting, that swaps in the
integer-bit roundings below; compiled GPU code keeps the native conversions.
"""

import os

import triton
import triton.language as tl

INTERPRET_ENV = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _probe():
    pass


# What the kernels of this process really are (decided when @triton.jit ran, i.e. at import).
INTERPRETED = type(_probe).__name__ == "InterpretedFunction"


@triton.jit
def f32_to_bf16_rne(x):
    """fp32 -> bf16, round to nearest even, NaN kept quiet; integer ops only."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = tl.where(x != x, (bits >> 16) | 0x40, rounded)
    return out.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def round_to(x, dtype: tl.constexpr, EXACT: tl.constexpr):
    """Round fp32 ``x`` once to ``dtype`` (RNE); exact under the interpreter too."""
    if EXACT and dtype == tl.bfloat16:
        return f32_to_bf16_rne(x)
    else:
        return x.to(dtype)
