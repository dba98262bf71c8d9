""":func:`qwen3_tts_qk_norm_rope`, the model's per-head RMSNorm then the RoPE, on qwen3_tts_rope's registry,
checks and torch op, loaded on first use; and what :func:`fusedrope.explain` asks of both functions."""

from __future__ import annotations

from .. import _validation as V
from . import OP, Modes, describe
from . import _call as call
from . import _check_call, _check_outputs


def qwen3_tts_qk_norm_rope(q, k, q_norm_weight, k_norm_weight, cos, sin, eps: float = 1e-6, *,
                           numerics: str = "eager", positions=None, inplace: bool = False, q_out=None, k_out=None,
                           backend: str = "auto", enable_pdl=None, mrope_section=None, mrope_interleaved=False):
    """Qwen3(-TTS)'s per-head RMSNorm (``q_norm``, ``k_norm``) then NeoX RoPE on q and k, in one launch.

    Every head row ``x`` becomes ``n = w * (x * rsqrt(mean(x**2) + eps))``, as the model's RMSNorm computes it
    (fp32 variance, the normalised value rounded to the dtype, then times the weight, rounded), and then
    ``n * cos + rotate_half(n) * sin`` as :func:`qwen3_tts_rope` computes it.

    Parameters
    ----------
    q, k, cos, sin, positions, inplace, q_out, k_out, backend, enable_pdl, mrope_section, mrope_interleaved
        As for :func:`qwen3_tts_rope`: q/k ``[B, H, S, D]`` views such as the transposed ``[B, S, H, D]``
        projection, before the norm.
    q_norm_weight, k_norm_weight : torch.Tensor
        ``[D]``, q's dtype: the weights of the model's ``q_norm`` and ``k_norm``.
    eps : float, default 1e-6
        The norms' ``variance_epsilon``.
    numerics : {"eager", "fp32"}, default "eager"
        The RoPE's arithmetic (see :func:`qwen3_tts_rope`). ``"eager"`` matches the model's own modules bit for
        bit except where the fp32 variance's summation order differs (docs/qwen3_tts_rope.md says how often), and
        for NaN: NaN out, its sign and payload not guaranteed.

    Returns
    -------
    (q_out, k_out) : tuple of torch.Tensor
        As :func:`qwen3_tts_rope` returns them.

    Examples
    --------
    >>> import torch, fusedrope
    >>> q = torch.randn(1, 16, 4, 128, dtype=torch.bfloat16)
    >>> k = torch.randn(1, 8, 4, 128, dtype=torch.bfloat16)
    >>> w = torch.ones(128, dtype=torch.bfloat16)
    >>> cos, sin = torch.ones(1, 4, 128, dtype=torch.bfloat16), torch.zeros(1, 4, 128, dtype=torch.bfloat16)
    >>> q_out, k_out = fusedrope.qwen3_tts_qk_norm_rope(q, k, w, w, cos, sin, backend="reference")
    >>> bool(q_out.float().pow(2).mean(-1).sub(1).abs().max() < 0.02)  # unit RMS per head
    True
    """
    if q_norm_weight is None or k_norm_weight is None:
        V.check_tensor(OP, "q_norm_weight" if q_norm_weight is None else "k_norm_weight", None)
    return call(q, k, cos, sin, Modes(positions, numerics, q_norm_weight, k_norm_weight, eps, enable_pdl,
                                      mrope_section, mrope_interleaved), inplace, q_out, k_out, backend)


# -- what fusedrope.explain asks: the selection key and backend of a call, after every check the call makes ---------
def explain_args(q, k, cos, sin, *, numerics: str = "fp32", positions=None, inplace: bool = False, q_out=None,
                 k_out=None, backend: str = "auto", enable_pdl=None, mrope_section=None, mrope_interleaved=False):
    """For :func:`qwen3_tts_rope`."""
    return _explain(q, k, cos, sin, describe(positions, numerics, None, None, 0.0, enable_pdl, mrope_section,
                                             mrope_interleaved), inplace, q_out, k_out, backend)


def explain_norm_args(q, k, q_norm_weight, k_norm_weight, cos, sin, eps: float = 1e-6, *, numerics: str = "eager",
                      positions=None, inplace: bool = False, q_out=None, k_out=None, backend: str = "auto",
                      enable_pdl=None, mrope_section=None, mrope_interleaved=False):
    """For :func:`qwen3_tts_qk_norm_rope`."""
    return _explain(q, k, cos, sin, Modes(positions, numerics, q_norm_weight, k_norm_weight, eps, enable_pdl,
                                          mrope_section, mrope_interleaved), inplace, q_out, k_out, backend)


def _explain(q, k, cos, sin, modes, inplace, q_out, k_out, backend):
    key = _check_call(q, k, cos, sin, inplace, q_out, k_out, modes)
    if q_out is not None or k_out is not None:
        _check_outputs(q, k, cos, sin, q_out, k_out, modes)
    return key, backend
