"""The backend registry: per op, an ordered list of backends; the first that can serve a call runs it. Each backend
answers ``available(device)`` (asked once per device) and ``supports(facts)`` (the op's named tuple of what
selection may depend on, so the choice is cached per layout class) with None (yes) or a reason (no); one with an
``opt_in`` reason runs only when named. ``backend="name"`` or ``FUSEDROPE_BACKEND=name`` forces one, and a named
backend that cannot serve raises ``BackendUnavailableError``. docs/design.md has the whole story.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ._validation import BackendUnavailableError

ENV_BACKEND = "FUSEDROPE_BACKEND"
# the built-in backends, fastest first (cuda_head: op 2's head kernel; what is opt-in: docs/status.md)
BACKENDS = ("cuda", "cuda_head", "hip", "triton", "reference")

Reason = Optional[str]


def _yes(_) -> Reason:
    return None


def getenv(name: str) -> str:
    """The environment variable ``name``, or "" when unset; read on every call, on POSIX from os.environ's own
    bytes dict (~0.05 us against ~0.7 us for ``os.environ.get``), non-UTF-8 bytes as surrogate escapes."""
    if _ENVIRON_BYTES is not None:
        value = _ENVIRON_BYTES.get(name.encode())
        return value.decode("utf-8", "surrogateescape") if value else ""
    return os.environ.get(name) or ""


# os.environ's own bytes dict, which setenv and monkeypatch change in place (POSIX; on Windows its keys are str)
_ENVIRON_BYTES = os.environ._data if hasattr(os, "environb") and isinstance(getattr(os.environ, "_data", None),
                                                                            dict) else None


def forced_backend() -> str:
    """``FUSEDROPE_BACKEND`` or "auto"."""
    return getenv(ENV_BACKEND) or "auto"


@dataclass(eq=False)
class Backend:
    """One backend of one op.

    ``run(inputs..., outputs...)`` writes into the outputs it is handed; ``run_alloc(inputs...)``, optional,
    allocates and returns them itself where the Python path allocates (a compiled op does that in C++, cheaper;
    the compiled checks, when built, allocate plain calls' outputs before choosing a backend). ``load``, for a
    backend whose kernel module needs an optional toolchain: called on first use, it returns ``(run, run_alloc)``.
    """

    name: str
    run: Optional[Callable] = None
    supports: Callable[[tuple], Reason] = _yes
    available: Callable[[torch.device], Reason] = _yes
    run_alloc: Optional[Callable] = None
    load: Optional[Callable[[], tuple]] = None
    opt_in: Callable[[tuple], Reason] = _yes  # why auto passes it over for these facts (runs when named), or None

    def loaded(self) -> "Backend":
        if self.run is None:
            run, self.run_alloc = self.load()
            self.run = run  # last: a thread that sees run set sees run_alloc too
        return self


class OpRegistry:
    """The backends of one op, in the order ``auto`` tries them: user backends first, then ``BACKENDS``."""

    def __init__(self, op: str, facts: type, user_protocol: Optional[Callable] = None):
        self.op = op
        self.facts = facts  # the op's NamedTuple of selection facts
        # register_backend's run protocol: (run, supports) -> (run, supports) the registry calls
        self.user_protocol = user_protocol or (lambda run, supports: (run, supports))
        self.backends: list[Backend] = []
        self._available: dict = {}
        self._select: dict = {}
        self._generation = 0  # bumped by every change of the backends: a choice made before one is not kept
        self._lock = threading.RLock()

    def register(self, backend: Backend) -> None:
        """Add ``backend``, replacing one of the same name (a replaced user backend moves behind the others)."""
        def rank(b):
            return BACKENDS.index(b.name) if b.name in BACKENDS else -1
        with self._lock:
            self.backends = sorted([b for b in self.backends if b.name != backend.name] + [backend], key=rank)
            self.clear_cache()

    def unregister(self, name: str) -> None:
        if name in BACKENDS:
            raise ValueError(f"{self.op}: argument 'name' expected a backend of register_backend's (the built-in "
                             f"ones stay), got {name!r}")
        with self._lock:
            self.backends = [b for b in self.backends if b.name != name]
            self.clear_cache()

    def backend(self, name: str) -> Backend:
        for b in self.backends:
            if b.name == name:
                return b
        raise ValueError(f"{self.op}: argument 'backend' expected one of {[b.name for b in self.backends]}, "
                         f"got {name!r}")

    def clear_cache(self) -> None:
        with self._lock:
            self._generation += 1
            self._available.clear()
            self._select.clear()

    def availability(self, backend: Backend, device: torch.device) -> Reason:
        key = (backend.name, device)
        try:
            return self._available[key]
        except KeyError:
            pass
        with self._lock:  # one probe per (backend, device), even from several threads
            if key not in self._available:
                try:
                    reason = backend.available(device)
                except Exception as e:  # a broken toolchain must not break the fallback
                    reason = f"unavailable: {type(e).__name__}: {e}"
                self._available[key] = self._reason(backend, "available(device)", reason)
            return self._available[key]

    def _reason(self, backend: Backend, asked: str, reason) -> Reason:
        if reason is None or isinstance(reason, str):  # False would read as available, or as the reason "False"
            return reason
        raise TypeError(f"{self.op}: backend {backend.name!r}: {asked} expected to return None or a str (why "
                        f"not), got {type(reason).__name__} {reason!r}")

    def decide(self, backend: Backend, key: tuple, auto: bool = False) -> Reason:
        """None when ``backend`` would run a call with this key (or facts), else why not."""
        facts = self.facts(*key)
        reason = self.availability(backend, facts[0])
        if reason is None:
            try:
                reason = backend.supports(facts)
            except Exception as e:  # a user's bug: that backend's reason, and auto passes over it
                reason = f"backend {backend.name!r}: supports(facts) raised {type(e).__name__}: {e}"
            reason = self._reason(backend, "supports(facts)", reason)
        if reason is None and auto and (opt_in := backend.opt_in(facts)):
            return f"opt-in ({opt_in}): name it to use it"
        return reason

    def select(self, key: tuple, backend: str = "auto") -> Backend:
        """The backend for ``key`` (the call's Facts, or a tuple equal to them), cached."""
        forced = getenv(ENV_BACKEND) if backend == "auto" else ""
        try:
            return self._select[key, backend, forced]
        except KeyError:
            pass
        except TypeError:  # unhashable: a list, a dict
            raise self._not_a_name(backend) from None
        with self._lock:
            generation = self._generation
        chosen = self._select_uncached(self.facts(*key), forced or backend, backend).loaded()
        with self._lock:
            if generation == self._generation:  # no backend came or went meanwhile
                self._select[key, backend, forced] = chosen
        return chosen

    def _not_a_name(self, backend) -> TypeError:
        return TypeError(f"{self.op}: argument 'backend' expected 'auto' or one of "
                         f"{sorted(b.name for b in self.backends)}, got {type(backend).__name__} {backend!r}")

    def _select_uncached(self, facts: tuple, request: str, backend: str) -> Backend:
        if request == "auto":
            for b in self.backends:
                if self.decide(b, facts, auto=True) is None:
                    return b
            raise BackendUnavailableError(f"{self.op}: no backend can run these inputs:\n{self.explain(facts)}")
        by_name = {b.name: b for b in self.backends}
        if request not in by_name:
            if backend == "auto" and _named_elsewhere(request):  # another op's backend: this op picks itself
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

    def explain(self, key: tuple, backend: str = "auto"):
        """Every backend's decision for a call with this key, and the one it would run (nothing is loaded)."""
        from .backends import explain_key

        return explain_key(self, key, backend)


REGISTRIES: dict[str, OpRegistry] = {}


def registry(op: str) -> OpRegistry:
    """The registry of ``op`` ("qwen3_tts_rope" or "inverse_rope_group_quant"); ValueError for any other name."""
    if op not in REGISTRIES:
        raise ValueError(f"registry: argument 'op' expected one of {sorted(REGISTRIES)}, got {op!r}")
    return REGISTRIES[op]


def _named_elsewhere(name: str) -> bool:
    """A built-in backend, or one registered for any op."""
    return name in BACKENDS or any(name in {b.name for b in r.backends} for r in REGISTRIES.values())


def new_registry(op: str, facts: type, user_protocol: Optional[Callable] = None) -> OpRegistry:
    """An op's own registry, made when its package is first imported."""
    return REGISTRIES.setdefault(op, OpRegistry(op, facts, user_protocol))
