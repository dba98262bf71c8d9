"""The reference implementations of both ops, in plain PyTorch: the ``reference`` backend and the oracles tests
and other kernel authors compare against (``*_oracle`` compute and return float64). Each op's own lives in its
package (``fusedrope.qwen3_tts_rope.reference``, ``fusedrope.inverse_rope_group_quant.reference``); this module
gathers them under one name."""

from .inverse_rope_group_quant.reference import (AMAX_FLOOR, E8M0_NAN, FP8_MAX, clamp_positions, e8m0_scale_bytes,
                                                 e8m0_to_float, group_quant_e8m0, inverse_rope_group_quant,
                                                 inverse_rope_oracle, inverse_rope_tail, pack_ue8m0, store_scale)
from .qwen3_tts_rope.reference import neox_rope, qwen3_tts_rope, qwen3_tts_rope_oracle, rotate_half

__all__ = [
    "rotate_half", "neox_rope", "qwen3_tts_rope", "qwen3_tts_rope_oracle",
    "FP8_MAX", "AMAX_FLOOR", "E8M0_NAN", "clamp_positions", "inverse_rope_tail", "e8m0_scale_bytes",
    "e8m0_to_float", "group_quant_e8m0", "pack_ue8m0", "store_scale", "inverse_rope_group_quant",
    "inverse_rope_oracle",
]
