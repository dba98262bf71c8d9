"""fusedrope: fused RoPE kernels for inference engines.

* :func:`qwen3_tts_rope`: NeoX RoPE on standalone Q/K (Qwen3-TTS short-sequence decoding).
* :func:`inverse_rope_group_quant`: DeepSeek-V4 attention output -> inverse RoPE -> FP8 per-group quant with
  power-of-two (e8m0) scales, the wo_a GEMM input, in one pass.
* :func:`explain`: which backend each op would use for given inputs, and why not the others.

Backends: ``cuda`` / ``hip`` (compiled fast paths), ``triton`` (portable), ``reference`` (plain torch, the
oracle). ``FUSEDROPE_BACKEND=name`` forces one for every call made with ``backend="auto"``.
"""

from __future__ import annotations

import inspect

from ._checks import BackendUnavailableError
from .registry import BACKENDS, ENV_BACKEND, Explanation, registry
from .tts_rope import qwen3_tts_rope
from .inverse_rope_quant import empty_quant_outputs, inverse_rope_group_quant, quant_output_shapes
from . import inverse_rope_quant as _inverse_rope_quant
from . import tts_rope as _tts_rope
from . import reference, testing  # noqa: F401  (public: the oracle and the test helpers)

__version__ = "0.1.0"

_EXPLAINERS = {
    "qwen3_tts_rope": _tts_rope.explain_args,
    "inverse_rope_group_quant": _inverse_rope_quant.explain_args,
}


def explain(op, *args, **kwargs) -> Explanation:
    """Say, per backend, whether it would run this call and why not.

    Parameters
    ----------
    op : str or callable
        The op's name (``"qwen3_tts_rope"``) or the public function itself.
    *args, **kwargs
        Exactly what you would pass to the op, ``backend=`` included.

    Returns
    -------
    Explanation
        A list of ``Decision(backend, runs, reason)`` in registry order with ``.chosen``; ``print()`` it.
        Where the call would raise at selection (a named or forced backend that cannot run these inputs, or a
        ``backend=`` the op does not have), ``.chosen`` is None and a last ``(error)`` row holds the message.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        What the call itself would raise for these arguments (validation, caller buffers, overlap), before any
        backend runs; with ``FUSEDROPE_CHECK_POSITIONS=1`` that includes op 2's host check of the positions
        (a device sync, as in the call).

    Examples
    --------
    >>> import torch, fusedrope
    >>> q, k = torch.zeros(1, 2, 4, 8), torch.zeros(1, 1, 4, 8)
    >>> cos = sin = torch.zeros(1, 4, 8)
    >>> fusedrope.explain("qwen3_tts_rope", q, k, cos, sin, backend="reference").chosen
    'reference'
    """
    name = op if isinstance(op, str) else getattr(op, "__name__", str(op))
    if name not in _EXPLAINERS:
        raise ValueError(f"explain: argument 'op' expected one of {sorted(_EXPLAINERS)}, got {name!r}")
    explainer = _EXPLAINERS[name]
    try:
        inspect.signature(explainer).bind(*args, **kwargs)
    except TypeError as e:  # name the op, not the internal helper
        raise TypeError(f"explain({name!r}, ...): {e}") from None
    facts, backend = explainer(*args, **kwargs)
    return registry(name).explain(facts, backend)


__all__ = [
    "qwen3_tts_rope", "inverse_rope_group_quant", "empty_quant_outputs", "quant_output_shapes", "explain",
    "BackendUnavailableError", "BACKENDS", "ENV_BACKEND", "__version__",
]
