"""The backend registry: per op, an ordered list of implementations; the first that can serve a call runs it.

Each implementation answers two questions with ``None`` (yes) or a reason (no):
  * ``available(device)``: can this backend run on this device of this machine at all? (cached per device)
  * ``supports(facts)``: does it handle these inputs? ``facts`` is a small hashable tuple the op derives
    from its arguments (device, dtypes, head_dim, ...), so the decision is cached per layout class and the
    hot path costs one dict lookup.
Run-time facts that are not traceable (pointer alignment, exact strides) are decided inside the kernels.

Forcing: ``backend="name"`` on a call, or the environment variable ``FUSEDROPE_BACKEND=name`` for every
call made with ``backend="auto"`` to an op that has that backend (``hip`` exists for op 2 only; op 1's calls
then pick as ``auto`` does). A forced backend that cannot serve raises ``BackendUnavailableError``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ._checks import BackendUnavailableError

ENV_BACKEND = "FUSEDROPE_BACKEND"
BACKENDS = ("cuda", "hip", "triton", "reference")

Reason = Optional[str]


def getenv(name: str) -> str:
    """The environment variable ``name``, or "" when unset; read on every call (so it can change at run time)
    but cheaply: ``os.environ.get`` costs ~0.6-1 us, a lookup in its underlying bytes dict ~0.05 us."""
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict):
        value = data.get(name.encode())
        return value.decode() if value else ""
    return os.environ.get(name) or ""


def forced_backend() -> str:
    """``FUSEDROPE_BACKEND`` or "auto"."""
    return getenv(ENV_BACKEND) or "auto"


@dataclass
class Impl:
    """One backend's implementation of one op. ``run`` is "module:function", imported on first use; it writes
    into output tensors the caller passes. ``run_alloc``, optional, is a variant that allocates and returns the
    outputs itself (a compiled op does that in C++, cheaper than Python allocating them first)."""

    backend: str
    run: str
    supports: Callable[[tuple], Reason]
    available: Callable[[torch.device], Reason]
    run_alloc: str = ""
    _fn: Optional[Callable] = field(default=None, repr=False)
    _fn_alloc: Optional[Callable] = field(default=None, repr=False)

    def fn(self) -> Callable:
        if self._fn is None:
            self._fn = _resolve(self.run)
        return self._fn

    def fn_alloc(self) -> Optional[Callable]:
        """The allocating variant, or None when the backend has none."""
        if self._fn_alloc is None and self.run_alloc:
            self._fn_alloc = _resolve(self.run_alloc)
        return self._fn_alloc


def _resolve(target: str) -> Callable:
    module, name = target.split(":")
    return getattr(importlib.import_module(module, __package__), name)


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


class OpRegistry:
    def __init__(self, op: str):
        self.op = op
        self.impls: list[Impl] = []
        self._available: dict = {}
        self._select: dict = {}

    def register(self, impl: Impl) -> None:
        """Add an implementation; the list stays in ``BACKENDS`` order (fastest first)."""
        self.impls = sorted([i for i in self.impls if i.backend != impl.backend] + [impl],
                            key=lambda i: BACKENDS.index(i.backend))
        self.clear_cache()

    def clear_cache(self) -> None:
        self._available.clear()
        self._select.clear()

    def availability(self, impl: Impl, device: torch.device) -> Reason:
        key = (impl.backend, device)
        if key not in self._available:
            try:
                self._available[key] = impl.available(device)
            except Exception as e:  # a broken toolchain must not break the fallback
                self._available[key] = f"unavailable: {type(e).__name__}: {e}"
        return self._available[key]

    def decide(self, impl: Impl, facts: tuple) -> Reason:
        return self.availability(impl, facts[0]) or impl.supports(facts)

    def select(self, facts: tuple, backend: str = "auto") -> Impl:
        """The implementation for these facts (``facts[0]`` is the device). Cached."""
        request = forced_backend() if backend == "auto" else backend
        key = (facts, request, backend == "auto")  # a name from the environment may fall back, an argument not
        try:
            impl = self._select.get(key)
        except TypeError:  # unhashable: a list, a dict
            raise TypeError(f"{self.op}: argument 'backend' expected 'auto' or one of "
                            f"{sorted(i.backend for i in self.impls)}, got {type(backend).__name__} "
                            f"{backend!r}") from None
        if impl is None:
            impl = self._select[key] = self._select_uncached(facts, request, backend)
        return impl

    def _select_uncached(self, facts: tuple, request: str, backend: str) -> Impl:
        if request == "auto":
            for impl in self.impls:
                if self.decide(impl, facts) is None:
                    return impl
            raise BackendUnavailableError(f"{self.op}: no backend can run these inputs:\n{self.explain(facts)}")
        by_name = {i.backend: i for i in self.impls}
        if request not in by_name:
            if backend == "auto" and request in BACKENDS:  # set for another op's backend: this op picks itself
                return self._select_uncached(facts, "auto", backend)
            source = "argument 'backend'" if backend != "auto" else f"environment variable {ENV_BACKEND}"
            has = f" ({self.op} has no {request!r} backend)" if request in BACKENDS else ""
            raise ValueError(f"{self.op}: {source} expected 'auto' or one of {sorted(by_name)}, got "
                             f"{request!r}{has}")
        reason = self.decide(by_name[request], facts)
        if reason is not None:
            forced = f" (forced by {ENV_BACKEND}={request})" if backend == "auto" else ""
            raise BackendUnavailableError(f"{self.op}: backend {request!r}{forced} cannot run these inputs: {reason}")
        return by_name[request]

    def explain(self, facts: tuple, backend: str = "auto") -> Explanation:
        out = Explanation(
            Decision(i.backend, (r := self.decide(i, facts)) is None, r or "supports these inputs")
            for i in self.impls
        )
        out.op = self.op
        if backend == "auto" and forced_backend() in {i.backend for i in self.impls}:
            out.forced = f"{ENV_BACKEND}={forced_backend()}"
        try:
            out.chosen = self.select(facts, backend).backend
        except (BackendUnavailableError, ValueError) as e:
            out.chosen = None
            out.append(Decision("(error)", False, str(e).splitlines()[0]))
        return out


REGISTRIES: dict[str, OpRegistry] = {}


def registry(op: str) -> OpRegistry:
    """The registry of ``op`` ("qwen3_tts_rope" or "inverse_rope_group_quant"); ValueError for any other name."""
    if op not in REGISTRIES:
        raise ValueError(f"registry: argument 'op' expected one of {sorted(REGISTRIES)}, got {op!r}")
    return REGISTRIES[op]


def new_registry(op: str) -> OpRegistry:
    """An op module's own registry, made when the module is first imported."""
    return REGISTRIES.setdefault(op, OpRegistry(op))
