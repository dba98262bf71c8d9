"""Triton helpers shared by both ops.

Under ``TRITON_INTERPRET=1`` (how CI runs the kernels on CPU) Triton 3.9's float conversions are wrong:
``.to(tl.bfloat16)`` truncates, ``.to(tl.float8e4nv)`` rounds wrongly and makes NaN instead of saturating,
and bf16 -> fp32 flushes or mangles subnormals. The kernels take an ``EXACT`` constexpr, set when
interpreting, that swaps in the integer-bit conversions below; compiled GPU code keeps the native conversions,
except for fp8 formats the GPU has none for (``inverse_rope_group_quant.triton.integer_fp8_rounding``).
"""

import contextlib
import functools
import threading
from typing import Optional

import torch
import triton
import triton.language as tl

from ._validation import fail

# AMD GPUs run 64-wide wavefronts: launchers size num_warps by it to keep 16-byte accesses per thread.
WARP_SIZE = 64 if torch.version.hip else 32


@triton.jit
def _probe():
    pass


# What the kernels of this process really are (decided when @triton.jit ran, i.e. at import).
INTERPRETED = type(_probe).__name__ == "InterpretedFunction"
# The interpreter patches triton.language for the duration of a launch: two threads launching at once break each
# other (InterpreterError). Interpreted launches take turns; compiled ones need no lock.
_INTERPRETER_LOCK = threading.Lock()


def launch_lock():
    """A context for one kernel launch: the interpreter's lock when interpreting, else nothing."""
    return _INTERPRETER_LOCK if INTERPRETED else contextlib.nullcontext()


@triton.jit
def _runtime_loop(out_ptr, n):
    acc = 0
    for _ in range(0, n, 2):
        acc += 1
    tl.store(out_ptr, acc)


@functools.lru_cache(maxsize=None)
def interpreter_defect() -> Optional[str]:
    """Why this Triton's interpreter cannot run fusedrope's kernels, or None (also when not interpreting).

    Triton 3.6's interpreter and numpy >= 2.4 fail on a loop whose bound is a kernel argument (a scalar
    argument's value is a 1-element array, which numpy 2.4 no longer turns into an int: triton-lang/triton#9171,
    fixed in later Triton). Probed once, on a one-element tensor, rather than guessed from version numbers."""
    if not INTERPRETED:
        return None
    out = torch.zeros(1, dtype=torch.int32, device="cpu")
    try:
        with launch_lock():
            _runtime_loop[(1,)](out, 5)
    except Exception as e:  # noqa: BLE001 - whatever breaks, the reason says it and the registry falls back
        cause = e.__cause__ or e
        known = isinstance(cause, TypeError) and "0-dimensional" in str(cause)
        return (f"this Triton's interpreter cannot run a loop with a runtime bound ({type(cause).__name__}: "
                f"{str(cause)[:120]})" + ("; with numpy >= 2.4 that is triton-lang/triton#9171: upgrade Triton, "
                                          "or use numpy < 2.4" if known else ""))
    return None if int(out) == 3 else f"this Triton's interpreter runs a 3-step loop {int(out)} times"


@triton.jit
def to_f32(x, EXACT: tl.constexpr):
    """Widen a loaded value to fp32, exactly under the interpreter too (bf16 is fp32's upper half)."""
    if EXACT and x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


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


@triton.jit
def f32_to_fp8_bits(x, FNUZ: tl.constexpr):
    """fp32 -> e4m3fn (FNUZ=False) or e4m3fnuz byte, RNE, integer ops only. ``x`` must already lie in
    [-FP8_MAX, FP8_MAX] or be NaN (the kernels clamp first)."""
    if FNUZ:
        REBIAS: tl.constexpr = 119  # 127 - 8
        MIN_NORMAL: tl.constexpr = 0x3C000000  # 2^-7
        SUB_STEPS: tl.constexpr = 1024.0  # subnormal step 2^-10
        NAN: tl.constexpr = 0x80
    else:
        REBIAS: tl.constexpr = 120  # 127 - 7
        MIN_NORMAL: tl.constexpr = 0x3C800000  # 2^-6
        SUB_STEPS: tl.constexpr = 512.0  # subnormal step 2^-9
        NAN: tl.constexpr = 0x7F
    bits = x.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    r = mag - (REBIAS << 23)  # rebias the exponent; keep 3 mantissa bits, round the other 20 to even
    normal = (r + 0x7FFFF + ((r >> 20) & 1)) >> 20
    # Subnormal: a multiple of the step, rounded to even by the 2^23 trick (exact for values below 2^22).
    scaled = mag.to(tl.float32, bitcast=True) * SUB_STEPS
    sub = ((scaled + 8388608.0) - 8388608.0).to(tl.uint32)
    code = tl.where(mag >= MIN_NORMAL, normal, sub)
    if FNUZ:
        code = tl.where(code == 0, 0, code | sign)  # fnuz has no negative zero (0x80 is NaN)
    else:
        code = code | sign
    return tl.where(x != x, NAN, code).to(tl.uint8)


def check_aligned(op: str, named: dict) -> None:
    """Each tensor's data starts at a multiple of its element size, as a compiled kernel's loads need (torch's
    own tensors always do; one over a numpy, DLPack or ``frombuffer`` buffer at an odd offset may not)."""
    for name, t in named.items():
        size = t.element_size()
        if t.data_ptr() % size:
            fail(op, name, f"data aligned to its element size ({size} bytes)",
                 f"a data pointer {t.data_ptr() % size} bytes past that (e.g. a view at an odd byte offset)")
