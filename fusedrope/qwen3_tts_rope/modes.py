"""qwen3_tts_rope's modes beyond fp32 math on cos/sin rows, loaded on first use: ``numerics="eager"``,
``positions=`` (cos/sin tables read at each token's position), ``enable_pdl`` and :func:`qwen3_tts_qk_norm_rope`,
the model's per-head RMSNorm then the RoPE. They share the op's registry, buffers checks and torch ops. Also
what :func:`fusedrope.explain` asks of both functions."""

from __future__ import annotations

import torch

from .. import _validation as V, fast_checks
from ..registry import getenv
from . import DTYPES, OP, reference
from . import Facts, Modes, describe
from . import _call as call
from . import _check_call, _check_outputs
from . import _check_inplace as check_inplace

NUMERICS = ("fp32", "eager")
POSITION_DTYPES = (torch.int64, torch.int32)
_Tensor, _F32 = torch.Tensor, torch.float32


def validate_modes(q, k, cos, sin, inplace, modes: Modes, traced=False) -> Facts:
    """:func:`validate` for calls with ``numerics="eager"``, ``positions=``, the norm (``q_norm_weight`` not None)
    or ``enable_pdl``: ``positions [B, S]`` or ``[S]`` int32/int64, with cos/sin tables ``[max_pos, D]`` in q's
    dtype or fp32; norm weights ``[D]`` in q's dtype; ``eps`` a number >= 0; ``enable_pdl`` None or a bool. Valid
    inputs take one expression, as in validate."""
    positions, numerics, q_weight, k_weight, eps, pdl = modes.op_args()
    table, norm = positions is not None, q_weight is not None
    try:
        B, _, S, D = q.shape
        kb, _, ks, kd = k.shape
        dt, dev, c_dt = q.dtype, q.device, cos.dtype
        ok = (
            (numerics == "eager" or numerics == "fp32") and (pdl is None or type(pdl) is bool)
            and type(q) is _Tensor and type(k) is _Tensor and type(cos) is _Tensor and type(sin) is _Tensor
            and kb == B and ks == S and kd == D and D % 2 == 0 and D > 0 and dt in DTYPES and k.dtype is dt
            and k.device == dev and cos.device == dev
            and sin.device == dev and sin.shape == cos.shape and sin.dtype is c_dt and q.stride()[3] == 1
            and k.stride()[3] == 1 and cos.stride()[-1] == 1 and sin.stride()[-1] == 1
            and ((cos.dim() == 2 and cos.shape[0] > 0 and cos.shape[1] == D and (c_dt is dt or c_dt is _F32)
                  and type(positions) is _Tensor and positions.dtype in POSITION_DTYPES and positions.device == dev
                  and (positions.shape == (B, S) or positions.shape == (S,))) if table else
                 (cos.dim() == 3 and c_dt is dt and cos.shape[1] == S and cos.shape[2] == D
                  and (cos.shape[0] == B or cos.shape[0] == 1)))
            and (not norm or (isinstance(q_weight, _Tensor) and isinstance(k_weight, _Tensor)
                              and q_weight.shape == (D,) and k_weight.shape == (D,) and q_weight.dtype is dt
                              and k_weight.dtype is dt and q_weight.device == dev and k_weight.device == dev
                              and q_weight.stride()[0] == 1 and k_weight.stride()[0] == 1
                              and (type(eps) is float or type(eps) is int) and eps >= 0))
            and (traced or fast_checks.checks.readable(q, k, cos, sin, positions, q_weight, k_weight))
        )
    except (AttributeError, TypeError, ValueError, IndexError, RuntimeError):
        ok = False
    if not ok:
        diagnose(q, k, cos, sin, modes, traced)
    if table and getenv(V.ENV_CHECK_POSITIONS).lower() not in V.SWITCH_OFF:
        V.check_positions_on_host(OP, positions, cos.shape[0])
    if inplace:
        check_inplace(q, k, cos, sin, modes.tensors())
    return Facts(q.device, q.dtype, q.shape[3], inplace is True, numerics == "eager", table, norm, pdl is True)


def diagnose(q, k, cos, sin, modes: Modes, traced=False) -> None:
    """The op's one checker: the precise error, naming the argument, for inputs a fast check refused (the plain
    :func:`validate`'s expression, :func:`validate_modes`'); valid inputs and valid tensor subclasses pass."""
    positions, numerics, q_weight, k_weight, eps, pdl = modes.op_args()
    if numerics not in NUMERICS:
        V.fail(OP, "numerics", "'fp32' or 'eager'", repr(numerics))
    if pdl is not None:
        V.check_bool(OP, "enable_pdl", pdl)
    reference.check_shapes(q, k, cos, sin, positions=positions)
    V.check_dtype(OP, "q", q, DTYPES)
    V.check_same_dtype(OP, "q", q, {"k": k} if positions is not None else {"k": k, "cos": cos, "sin": sin})
    named = {"k": k, "cos": cos, "sin": sin}
    if positions is not None:
        V.check_dtype(OP, "cos", cos, (q.dtype, torch.float32))
        V.check_same_dtype(OP, "cos", cos, {"sin": sin})
        V.check_dtype(OP, "positions", positions, POSITION_DTYPES)
        named["positions"] = positions
    if q_weight is not None:
        for name, w in (("q_norm_weight", q_weight), ("k_norm_weight", k_weight)):
            V.check_tensor(OP, name, w, 1, "[D]")
            V.check_shape(OP, name, w, (q.shape[3],))
            V.check_dtype(OP, name, w, (q.dtype,))
            named[name] = w
        number = isinstance(eps, (int, float)) and not isinstance(eps, bool)  # np.float64 is a float
        if not number or not eps >= 0:
            V.fail(OP, "eps", "a float >= 0", repr(eps), ValueError if number else TypeError)
    V.check_same_device(OP, "q", q, named)
    for name, t in (("q", q), *named.items()):
        V.check_last_dim_contiguous(OP, name, t)
    if not traced:
        V.check_readable(OP, {"q": q, **named})


def qwen3_tts_qk_norm_rope(q, k, q_norm_weight, k_norm_weight, cos, sin, eps: float = 1e-6, *,
                           numerics: str = "eager", positions=None, inplace: bool = False, q_out=None, k_out=None,
                           backend: str = "auto", enable_pdl=None):
    """Qwen3(-TTS)'s per-head RMSNorm (``q_norm``, ``k_norm``) then NeoX RoPE on q and k, in one launch.

    Every head row ``x`` becomes ``n = w * (x * rsqrt(mean(x**2) + eps))``, as the model's RMSNorm computes it
    (fp32 variance, the normalised value rounded to the dtype, then times the weight, rounded), and then
    ``n * cos + rotate_half(n) * sin`` as :func:`qwen3_tts_rope` computes it.

    Parameters
    ----------
    q, k, cos, sin, positions, inplace, q_out, k_out, backend, enable_pdl
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
    return call(q, k, cos, sin, Modes(positions, numerics, q_norm_weight, k_norm_weight, eps, enable_pdl), inplace,
                q_out, k_out, backend)


# -- what fusedrope.explain asks: the selection key and backend of a call, after every check the call makes ---------
def explain_args(q, k, cos, sin, *, numerics: str = "fp32", positions=None, inplace: bool = False, q_out=None,
                 k_out=None, backend: str = "auto", enable_pdl=None):
    """For :func:`qwen3_tts_rope`."""
    return _explain(q, k, cos, sin, describe(positions, numerics, None, None, 0.0, enable_pdl), inplace, q_out, k_out,
                    backend)


def explain_norm_args(q, k, q_norm_weight, k_norm_weight, cos, sin, eps: float = 1e-6, *, numerics: str = "eager",
                      positions=None, inplace: bool = False, q_out=None, k_out=None, backend: str = "auto",
                      enable_pdl=None):
    """For :func:`qwen3_tts_qk_norm_rope`."""
    return _explain(q, k, cos, sin, Modes(positions, numerics, q_norm_weight, k_norm_weight, eps, enable_pdl),
                    inplace, q_out, k_out, backend)


def _explain(q, k, cos, sin, modes, inplace, q_out, k_out, backend):
    key = _check_call(q, k, cos, sin, inplace, q_out, k_out, modes)
    if q_out is not None or k_out is not None:
        _check_outputs(q, k, cos, sin, q_out, k_out, modes)
    return key, backend
