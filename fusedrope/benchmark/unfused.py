"""The unfused pair the fused op replaces (the seed's baseline): inverse RoPE in place on the tail of ``o``,
rounded to o's dtype, then a separate per-group e8m0 quant launch. Both in Triton. Benchmarks only."""

from __future__ import annotations

from ..inverse_rope_group_quant import QuantModes, validate
from ..inverse_rope_group_quant.buffers import empty_quant_outputs


def unfused_inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size=128,
                                     transpose_scale=False, x_fp8=None, x_scale=None, *, fp8_dtype=None,
                                     scale_dtype=None):
    """Same arguments and outputs as :func:`fusedrope.inverse_rope_group_quant`, but two launches with a
    round trip of the rotated tail through memory. **Rotates ``o``'s tails in place** (as the seed's pair does).
    Its fp8 values can differ from the fused op's by the bf16 rounding of the tail."""
    from ..inverse_rope_group_quant import triton as k

    _, fp8_dtype, scale_dtype = validate(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                                             transpose_scale, x_fp8, x_scale, QuantModes(fp8_dtype, scale_dtype))
    if x_fp8 is None or x_scale is None:
        x_fp8, x_scale = empty_quant_outputs(o, num_groups, quant_group_size, transpose_scale,
                                                 fp8_dtype=fp8_dtype, scale_dtype=scale_dtype)
    if o.numel():
        k.rope_tail_inplace(o, positions, cos_cache, sin_cache)
        k.group_quant(o, positions, cos_cache, x_fp8, x_scale, quant_group_size)
    return x_fp8, x_scale
