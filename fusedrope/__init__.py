"""fusedrope: fused RoPE kernels for inference engines.

* :func:`qwen3_tts_rope`: NeoX RoPE on standalone Q/K (Qwen3-TTS short-sequence decoding).
* :func:`inverse_rope_group_quant`: DeepSeek-V4 attention output -> inverse RoPE -> FP8 per-group quant with
  power-of-two (e8m0) scales, the wo_a GEMM input, in one pass.
* :func:`explain`: which backend each op would use for given inputs, and why not the others.
* :func:`register_backend`: plug in your own kernel, with fusedrope's validation, dispatch and test helpers.
* ``fusedrope.reference`` (the oracles) and ``fusedrope.testing`` (cases, inputs, contract checks).

Backends: ``cuda`` / ``hip`` (hand-written kernels), ``triton`` (portable), ``reference`` (plain torch, the
oracle). ``FUSEDROPE_BACKEND=name`` forces one for every call made with ``backend="auto"``.
"""

import importlib as _importlib
import inspect as _inspect

from ._validation import BackendUnavailableError
from .inverse_rope_group_quant import empty_quant_outputs, inverse_rope_group_quant, quant_output_shapes
from .qwen3_tts_rope import qwen3_tts_rope
from .registry import BACKENDS, ENV_BACKEND, Explanation, register_backend, registry

__version__ = "0.1.0"


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
        backend runs; with ``FUSEDROPE_CHECK_POSITIONS=1`` that includes the positions check of
        ``inverse_rope_group_quant`` (a device sync, as in the call).

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
        _inspect.signature(explainer).bind(*args, **kwargs)
    except TypeError as e:  # name the op, not the internal helper
        raise TypeError(f"explain({name!r}, ...): {e}") from None
    key, backend = explainer(*args, **kwargs)
    return registry(name).explain(key, backend)


# The op packages (the attributes of the same names are the public functions).
_EXPLAINERS = {op: _importlib.import_module(f".{op}", __name__).explain_args
               for op in ("qwen3_tts_rope", "inverse_rope_group_quant")}


def __getattr__(name):  # reference and testing load on first use: the ops themselves need neither
    if name in ("reference", "testing"):
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'fusedrope' has no attribute {name!r}")


def __dir__():
    return sorted(__all__ + ["reference", "testing"])


__all__ = [
    "qwen3_tts_rope", "inverse_rope_group_quant", "empty_quant_outputs", "quant_output_shapes", "explain",
    "register_backend", "registry", "BackendUnavailableError", "BACKENDS", "ENV_BACKEND", "__version__",
]
