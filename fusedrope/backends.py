"""Choosing and adding backends: :func:`explain` says which backend a call would use and why not the others;
:func:`register_backend` plugs in your own kernel. Loaded on first use (``fusedrope.explain``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from importlib import import_module
from typing import Callable, Optional

from ._validation import BackendUnavailableError
from .registry import BACKENDS, ENV_BACKEND, Backend, OpRegistry, _yes, forced_backend, registry


@dataclass
class Decision:
    backend: str
    runs: bool
    reason: str


class Explanation(list):
    """``[Decision, ...]`` in registry order, plus ``chosen`` (a backend name or None); prints as a table."""

    chosen: Optional[str] = None
    op: str = ""
    forced: str = ""  # "FUSEDROPE_BACKEND=name" when the environment forced the choice of a backend="auto" call

    def __str__(self) -> str:
        forced = f" (forced by {self.forced})" if self.forced else ""
        lines = [f"{self.op}: chosen backend = {self.chosen or 'none'}{forced}"]
        for d in self:
            mark = "->" if d.backend == self.chosen else ("ok" if d.runs else "no")
            lines.append(f"  {mark} {d.backend:<10} {d.reason}")
        return "\n".join(lines)


def explain(op, *args, **kwargs) -> Explanation:
    """Say, per backend, whether it would run this call and why not.

    Parameters
    ----------
    op : str or callable
        The op's name (``"qwen3_tts_rope"``) or the public function itself.
        ``qwen3_tts_qk_norm_rope`` is served by ``qwen3_tts_rope``'s registry.
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
        ``inverse_rope_group_quant`` and of ``qwen3_tts_rope`` with ``positions=`` (a device sync, as in the call).

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
    explainer = _explainer(name)
    try:
        inspect.signature(explainer).bind(*args, **kwargs)
    except TypeError as e:  # name the op, not the internal helper
        raise TypeError(f"explain({name!r}, ...): {e}") from None
    key, backend = explainer(*args, **kwargs)
    return registry(_EXPLAINERS[name][2]).explain(key, backend)


# op -> (its module, the function that checks a call's arguments as the op does, the op's registry)
_EXPLAINERS = {
    "qwen3_tts_rope": (".qwen3_tts_rope.modes", "explain_args", "qwen3_tts_rope"),
    "qwen3_tts_qk_norm_rope": (".qwen3_tts_rope.modes", "explain_norm_args", "qwen3_tts_rope"),
    "inverse_rope_group_quant": (".inverse_rope_group_quant", "explain_args", "inverse_rope_group_quant"),
}


def _explainer(name: str) -> Callable:
    """The function that checks a call of ``name`` (a key of :data:`_EXPLAINERS`) as the op does."""
    return getattr(import_module(_EXPLAINERS[name][0], __package__), _EXPLAINERS[name][1])


def register_backend(op: str, name: str, run: Callable, *, supports: Optional[Callable] = None,
                     available: Optional[Callable] = None) -> None:
    """Plug your own kernel into an op: it gets fusedrope's validation, output allocation, dispatch,
    ``explain`` and test helpers (:func:`fusedrope.testing.check_backend`).

    Parameters
    ----------
    op : str
        ``"qwen3_tts_rope"`` or ``"inverse_rope_group_quant"``.
    name : str
        The backend's name, for ``backend=name`` and ``FUSEDROPE_BACKEND`` (which the other op, without such a
        backend, ignores): a Python identifier, not ``"auto"`` or a built-in one. Registering a name again replaces
        that backend; ``fusedrope.registry(op).unregister(name)`` removes it (built-in backends stay).
    run : callable
        Called with validated inputs and allocated outputs, which it writes in place; its return value is
        ignored. ``qwen3_tts_rope``: ``run(q, k, cos, sin, q_out, k_out)`` (``q_out``/``k_out`` may be ``q``/``k``
        for ``inplace=True``) with ``numerics="fp32"`` on cos/sin rows; ``numerics="eager"``, ``positions=`` and
        ``qwen3_tts_qk_norm_rope`` go to the built-in backends. ``inverse_rope_group_quant``: ``run(o, positions,
        cos_cache, sin_cache, x_fp8, x_scale, quant_group_size)`` with a row-major ``x_fp8`` and row- or
        column-major scales (read their strides); calls asking for more (``scale_layout="mfma_tile"``,
        ``quantize=False``, a group-major ``x_fp8``) go to the built-in backends.
    supports : callable, optional
        ``supports(facts) -> None or str``: None when it serves the inputs described by ``facts`` (the op's
        named tuple: ``device``, ``dtype``, ``head_dim``, ...), else why not. Default: every input. An exception
        it raises becomes its reason (naming the backend and the exception), and ``auto`` passes over it.
    available : callable, optional
        ``available(device) -> None or str``, asked once per device (an exception is the reason). Default: every
        device. Either returning anything else (``False``, say) raises ``TypeError`` naming the backend.

    ``backend="auto"`` tries user backends first, in the order registered, then the built-in ones.

    Examples
    --------
    >>> import torch, fusedrope
    >>> def my_rope(q, k, cos, sin, q_out, k_out):
    ...     fusedrope.reference.qwen3_tts_rope(q, k, cos, sin, q_out, k_out)  # your kernel here
    >>> fusedrope.register_backend("qwen3_tts_rope", "mine", my_rope,
    ...                            supports=lambda f: None if f.head_dim == 64 else "head_dim 64 only")
    >>> q, k = torch.randn(1, 2, 3, 64), torch.randn(1, 1, 3, 64)
    >>> cos, sin = torch.ones(1, 3, 64), torch.zeros(1, 3, 64)
    >>> fusedrope.explain("qwen3_tts_rope", q, k, cos, sin).chosen
    'mine'
    >>> fusedrope.registry("qwen3_tts_rope").unregister("mine")
    """
    reg = registry(op)
    if not isinstance(name, str) or not name.isidentifier() or name == "auto" or name in BACKENDS:
        raise ValueError(f"register_backend: argument 'name' expected a new backend name, a Python identifier (not "
                         f"'auto' or one of {list(BACKENDS)}), got {name!r}")
    for arg, fn in (("run", run), ("supports", supports or _yes), ("available", available or _yes)):
        if not callable(fn):
            raise TypeError(f"register_backend: argument '{arg}' expected a callable, got {type(fn).__name__}")
    run, supports = reg.user_protocol(run, supports or _yes)
    reg.register(Backend(name, run, supports, available or _yes))


def explain_key(reg: OpRegistry, key: tuple, backend: str = "auto") -> Explanation:
    """:meth:`OpRegistry.explain`: every backend's decision for a call with this key, and the one it would run."""
    facts = reg.facts(*key)
    if not isinstance(backend, str):
        raise reg._not_a_name(backend)
    request = forced_backend() if backend == "auto" else backend
    out = Explanation(  # a named backend is judged as named: opt-in is no reason to pass it over then
        Decision(b.name, (r := reg.decide(b, facts, auto=b.name != request)) is None, r or "supports these inputs")
        for b in reg.backends
    )
    out.op = reg.op
    if backend == "auto" and request in {b.name for b in reg.backends}:
        out.forced = f"{ENV_BACKEND}={request}"
    try:
        out.chosen = reg._select_uncached(facts, request, backend).name
    except (BackendUnavailableError, ValueError) as e:
        out.chosen = None
        out.append(Decision("(error)", False, str(e).splitlines()[0]))
    return out


def _status_calls() -> dict:
    """Per op, the calls the status table describes: a name and the arguments of one small such call (CPU tensors:
    ``opt_in`` reads the call's facts, not its device)."""
    import torch

    from .testing import QuantCase, TtsCase, make_quant_inputs, make_tts_inputs

    q, k, cos, sin = make_tts_inputs(TtsCase("status", 1, 2, 2, 1))
    w, table, pos = torch.ones(128, dtype=q.dtype), cos[0], torch.arange(2)
    o, p, cc, sc = make_quant_inputs(QuantCase(2, 8, 1))
    return {
        "qwen3_tts_rope": [
            ("plain", "qwen3_tts_rope", (q, k, cos, sin), {}),
            ('numerics="eager"', "qwen3_tts_rope", (q, k, cos, sin), {"numerics": "eager"}),
            ("positions=", "qwen3_tts_rope", (q, k, table, table), {"positions": pos}),
            ("qwen3_tts_qk_norm_rope", "qwen3_tts_qk_norm_rope", (q, k, w, w, cos, sin), {}),
            ("enable_pdl=True", "qwen3_tts_rope", (q, k, cos, sin), {"enable_pdl": True}),
        ],
        "inverse_rope_group_quant": [
            ("row-major scales", "inverse_rope_group_quant", (o, p, cc, sc, 1), {}),
            ('scale_layout="col"', "inverse_rope_group_quant", (o, p, cc, sc, 1), {"scale_layout": "col"}),
            ("enable_pdl=True", "inverse_rope_group_quant", (o, p, cc, sc, 1), {"enable_pdl": True}),
        ],
    }


def status_table() -> str:
    """What ``backend="auto"`` passes over, and why: a markdown table of every built-in backend's ``opt_in`` reason
    for the calls it serves (docs/status.md is this table). Backends without one run where they serve a call."""
    rows = ["| op | backend | calls `auto` passes over | why (the backend's `opt_in` reason) |", "|---|---|---|---|"]
    for op, calls in _status_calls().items():
        reg = registry(op)
        for b in (b for b in reg.backends if b.name in BACKENDS and b.opt_in is not _yes):
            reasons: dict = {}
            for name, fn, args, kwargs in calls:
                facts = reg.facts(*_explainer(fn)(*args, **kwargs)[0])
                if (why := b.opt_in(facts)) is not None:
                    reasons.setdefault(why, []).append(name)
            for why, names in reasons.items():
                which = "every call" if len(names) == len(calls) else ", ".join(f"`{n}`" for n in names)
                rows.append(f"| `{op}` | `{b.name}` | {which} | {why} |")
    return "\n".join(rows) + "\n"
