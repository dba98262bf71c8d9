"""Both ops' plain-call checks and output allocation compiled (csrc/fast_checks.cpp), from the build that
``python -m fusedrope build`` or the kernels' first-use build makes: loaded on the first call, which never compiles
them, and only once its bytes match the digest the build wrote beside it (a truncated or corrupted library would
kill the process as it loads). ``checks.<op>(Facts, args)`` returns ``(selection key, new outputs)``, the key an
instance of the op's ``Facts``, or None and the Python path runs, as every call does without a build;
``checks.tts_facts(Facts, q, k, cos, sin, inplace, *modes)`` the key of any valid op-1 call (op 1's only fast
accept path); ``checks.readable`` is :func:`_validation.readable`."""

import hashlib
import importlib.util
import os
import sys
import threading
import types
from pathlib import Path

import torch

from ._validation import readable

SOURCE = Path(__file__).parent / "csrc" / "fast_checks.cpp"
Python = types.SimpleNamespace(qwen3_tts_rope=lambda *args: None, inverse_rope_group_quant=lambda *args: None,
                               tts_facts=lambda *args: None, readable=readable)
_lock = threading.Lock()
failure = None  # why the build found was not loaded (None: loaded, or there is none)
DIGEST = ".sha256"  # the library's name + DIGEST: its sha256 (sha256sum's format), written by the build beside it


def extensions_folder(tag: str) -> Path:
    """torch's JIT extension folder for this Python and toolkit ``tag`` (``cpu``, ``cu130``), as its load() uses."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(cache, "torch_extensions")
    return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}_{tag}"


def library_path() -> Path:
    """Named by a hash of the source, torch and Python: a stale build never loads."""
    name = "fusedrope_fast_checks_" + hashlib.sha256(
        SOURCE.read_bytes() + f"|{torch.__version__}|{sys.version}".encode()).hexdigest()[:12]
    return extensions_folder("cpu") / name / f"{name}.so"


def load(again: bool = False):
    """The build's module, or ``Python`` (``again``: look for a build once more, e.g. one just made)."""
    global checks, failure
    with _lock:
        if again or checks is _first_call:
            checks, failure = Python, None
            try:
                path = library_path()
                if path.exists():
                    digest = path.with_name(path.name + DIGEST)
                    digest = digest.read_text().split()[:1] if digest.exists() else []
                    if digest != [hashlib.sha256(path.read_bytes()).hexdigest()]:
                        failure = f"{path} does not match the digest written at build time " + (
                            "(a truncated or corrupted file?)" if digest else "(there is none: an interrupted build?)")
                    else:
                        spec = importlib.util.spec_from_file_location(path.stem, path)
                        module = importlib.util.module_from_spec(spec)
                        spec.loader.exec_module(module)
                        checks = module
            except (ImportError, OSError) as e:  # a build that no longer loads (a changed libtorch): the Python path
                failure = f"the build does not load: {e}"
    return checks


# Until the first call: load the build (or settle on Python), then ask it.
_first_call = checks = types.SimpleNamespace(**{op: lambda *args, op=op: getattr(load(), op)(*args)
                                               for op in ("qwen3_tts_rope", "inverse_rope_group_quant", "tts_facts",
                                                         "readable")})
