"""fusedrope: fused RoPE kernels for inference engines.

* :func:`qwen3_tts_rope`: NeoX RoPE on standalone Q/K (Qwen3-TTS short-sequence decoding).
* :func:`qwen3_tts_qk_norm_rope`: the model's per-head q/k RMSNorm, then that RoPE, in one launch.
* :func:`inverse_rope_group_quant`: DeepSeek-V4 attention output -> inverse RoPE -> FP8 per-group quant with
  power-of-two (e8m0) scales, the wo_a GEMM input, in one pass.
* :func:`explain`: which backend each op would use for given inputs, and why not the others.
* :func:`register_backend`: plug in your own kernel, with fusedrope's validation, dispatch and test helpers.
* ``fusedrope.reference`` (the oracles) and ``fusedrope.testing`` (cases, inputs, contract checks).

Backends: ``cuda`` / ``hip`` (hand-written kernels), ``triton`` (portable), ``reference`` (plain torch, the
oracle). ``FUSEDROPE_BACKEND=name`` forces one for every call made with ``backend="auto"``.
"""

import importlib as _importlib

from ._validation import BackendUnavailableError
from .inverse_rope_group_quant import inverse_rope_group_quant
from .qwen3_tts_rope import qwen3_tts_rope
from .registry import BACKENDS, ENV_BACKEND, registry

__version__ = "0.1.0"


# Loaded on first use: the ops' plain calls need none of these. name -> (module, attribute or None for the module)
_LAZY = {"reference": (".reference", None), "testing": (".testing", None),
         "qwen3_tts_qk_norm_rope": (".qwen3_tts_rope.modes", "qwen3_tts_qk_norm_rope"),
         "explain": (".backends", "explain"), "register_backend": (".backends", "register_backend"),
         "Explanation": (".backends", "Explanation"),
         "empty_quant_outputs": (".inverse_rope_group_quant.buffers", "empty_quant_outputs"),
         "quant_output_shapes": (".inverse_rope_group_quant.buffers", "quant_output_shapes")}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'fusedrope' has no attribute {name!r}")
    module, attr = _LAZY[name]
    module = _importlib.import_module(module, __name__)
    globals()[name] = value = module if attr is None else getattr(module, attr)  # next time, a plain attribute
    return value


def __dir__():
    return sorted(set(__all__) | set(_LAZY))


__all__ = [
    "qwen3_tts_rope", "qwen3_tts_qk_norm_rope", "inverse_rope_group_quant", "empty_quant_outputs",
    "quant_output_shapes", "explain", "register_backend", "registry", "BackendUnavailableError", "Explanation",
    "BACKENDS", "ENV_BACKEND", "__version__",
]
