"""The compiled CUDA kernels: ONE torch extension built from every ``kernels_cuda/*.cu`` and
``kernels_cuda/*_torch.cpp`` source, registering its ops under ``torch.ops.fusedrope_cuda``.

* Built on first use (JIT, torch.utils.cpp_extension + ninja + nvcc, about 2 minutes) on a machine with a CUDA
  torch and a CUDA toolkit, or ahead of time with ``build()`` (``python -m fusedrope build``).
* Cached in torch's extension directory (``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``) under a
  name that hashes the sources, the torch and CUDA versions and the target architectures, so a changed
  source or a different torch never loads a stale build. A cached build loads without nvcc.
* Sources are found in-tree (``<repo>/kernels_cuda``) and installed (the wheel ships them as the package
  ``fusedrope.kernels_cuda``).
* Target architectures: ``$TORCH_CUDA_ARCH_LIST`` if set (e.g. ``"9.0"`` or ``"8.0;9.0"``), else the visible GPUs.

``available(device)`` answers the registry (None, or the reason the ``cuda`` backend cannot run); it builds or
loads the extension the first time it is asked about a CUDA device, once per process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Optional

import torch

NAMESPACE = "fusedrope_cuda"
BUILD_MESSAGE = "fusedrope: building CUDA kernels (first use, ~2 min) ..."
# No -std: torch picks the standard its headers need (C++17 or C++20, by version); the kernels build with both.
NVCC_FLAGS = ("-O3", "-lineinfo")
CXX_FLAGS = ("-O3",)

_lock = threading.Lock()
_loaded: Optional[str] = None  # path of the loaded library
_failure: Optional[str] = None  # why loading failed in this process (not retried)


# -- sources ---------------------------------------------------------------------------------------------
def kernel_dir() -> Path:
    """The directory holding the CUDA sources: the installed package ``fusedrope.kernels_cuda`` or ``<repo>/kernels_cuda``."""
    here = Path(__file__).resolve().parent
    candidates = [here / "kernels_cuda"]
    try:
        spec = importlib.util.find_spec("fusedrope.kernels_cuda")
        if spec is not None and spec.submodule_search_locations:
            candidates += [Path(p) for p in spec.submodule_search_locations]
    except (ImportError, ValueError):
        pass
    candidates.append(here.parent / "kernels_cuda")
    for c in candidates:
        if c.is_dir() and any(c.glob("*.cu")):
            return c
    raise FileNotFoundError(
        "fusedrope: CUDA kernel sources not found (looked in " + ", ".join(str(c) for c in candidates) + ")")


def sources() -> list[Path]:
    """Every source compiled into the extension: ``*.cu`` and the torch bindings ``*_torch.cpp``, sorted."""
    d = kernel_dir()
    return sorted(d.glob("*.cu")) + sorted(d.glob("*_torch.cpp"))


def _hashed_files() -> list[Path]:
    d = kernel_dir()
    return sorted(p for p in d.iterdir() if p.suffix in (".cu", ".cuh", ".cpp", ".h", ".hpp") and p.is_file())


# -- where the build lives -------------------------------------------------------------------------------
def arch_list() -> str:
    """The target architectures, as TORCH_CUDA_ARCH_LIST spells them (``"9.0"``, ``"8.0;9.0"``)."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env:
        return env
    if not torch.cuda.is_available():
        raise RuntimeError("no GPU is visible to pick target architectures from: set TORCH_CUDA_ARCH_LIST "
                           "(e.g. '9.0' for H100/H200, '8.0;9.0;10.0' for several)")
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{a}.{b}" for a, b in caps)


def ext_name(archs: Optional[str] = None) -> str:
    """``fusedrope_cuda_<hash>``: the hash covers the sources, the torch and CUDA versions, flags and archs."""
    h = hashlib.sha256()
    for p in _hashed_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(f"{torch.__version__}|{torch.version.cuda}|{archs or arch_list()}|{NVCC_FLAGS}|{CXX_FLAGS}".encode())
    return f"{NAMESPACE}_{h.hexdigest()[:12]}"


def build_root() -> Path:
    """torch's JIT extension root plus the same ``py311_cu130`` subfolder torch's own load() uses."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(cache, "torch_extensions")
    cu = "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else "cpu"
    return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}_{cu}"


def _library_path(name: str) -> Path:
    return build_root() / name / f"{name}.so"


# -- build and load --------------------------------------------------------------------------------------
def _short(e: BaseException) -> str:
    """The most telling line of a build error (nvcc's 'error:' line if there is one)."""
    text = str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower() and not ln.startswith("ninja: build stopped"):
            return ln[:300]
    return (lines[0] if lines else type(e).__name__)[:300]


def _build(name: str, archs: str, verbose: bool) -> Path:
    from torch.utils import cpp_extension  # heavy: only when a build is really needed

    directory = build_root() / name
    directory.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    try:
        cpp_extension.load(
            name=name,
            sources=[str(s) for s in sources()],
            extra_cflags=list(CXX_FLAGS),
            extra_cuda_cflags=list(NVCC_FLAGS),
            extra_include_paths=[str(kernel_dir())],
            build_directory=str(directory),
            is_python_module=False,
            with_cuda=True,
            verbose=verbose,
        )
    finally:
        if old is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old
    return _library_path(name)


def load(verbose: bool = False) -> str:
    """Load the extension (building it first if no cached build matches); return the library's path.

    Raises RuntimeError with the reason when it cannot. Thread-safe; a failure is remembered for the process.
    """
    global _loaded, _failure
    if _loaded:
        return _loaded
    with _lock:
        if _loaded:
            return _loaded
        if _failure:
            raise RuntimeError(_failure)
        try:
            archs = arch_list()
            name = ext_name(archs)
            lib = _library_path(name)
            built = False
            if lib.exists():  # a finished build of exactly these sources: load it, no toolchain needed
                try:
                    torch.ops.load_library(str(lib))
                    built = True
                except Exception:  # noqa: BLE001
                    if not (lib.parent / "lock").exists():  # not another process mid-build: a real failure
                        raise
            if not built:
                if not lib.exists():
                    print(BUILD_MESSAGE, file=sys.stderr, flush=True)
                lib = _build(name, archs, verbose)  # waits on torch's baton if another process builds it
            _loaded = str(lib)
            return _loaded
        except Exception as e:  # noqa: BLE001 - any failure becomes the backend's reason
            _failure = f"build failed: {_short(e)}"
            raise RuntimeError(_failure) from e


def build(verbose: bool = False) -> str:
    """Ahead-of-time build (``python -m fusedrope build``): compile and load the extension; return its path.

    Targets ``$TORCH_CUDA_ARCH_LIST`` or the visible GPUs. Raises RuntimeError saying why it cannot.
    """
    reason = toolkit_reason()
    if reason:
        raise RuntimeError(f"fusedrope: cannot build the CUDA kernels: {reason}")
    return load(verbose=verbose)


# -- availability ----------------------------------------------------------------------------------------
def toolkit_reason() -> Optional[str]:
    """Why no build is possible on this machine (torch flavour, nvcc), independent of a device; None if it is."""
    if torch.version.hip:
        return (f"this torch is a ROCm build (torch.version.hip={torch.version.hip}); the 'cuda' backend needs a "
                "CUDA torch (the 'hip' backend serves AMD GPUs)")
    if not torch.version.cuda:
        return "this torch build has no CUDA (torch.version.cuda is None)"
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        return ("no CUDA toolkit to build the kernels: nvcc not found (set CUDA_HOME or put nvcc on PATH, or build "
                "ahead of time with `python -m fusedrope build` where one is)")
    return None


def available(device: torch.device) -> Optional[str]:
    """None when the compiled CUDA kernels can run on ``device`` (building/loading them if needed), else why not."""
    if device.type == "cuda" and torch.version.hip:
        return toolkit_reason()
    from .backends import cuda_toolkit_reason

    reason = cuda_toolkit_reason(device)
    if reason:
        return reason
    if _loaded:
        return None
    if _failure:
        return _failure
    try:
        name = ext_name()
    except Exception as e:  # noqa: BLE001
        return f"cannot name the build: {_short(e)}"
    if not _library_path(name).exists():  # a cached build loads without nvcc; a new build needs it
        reason = toolkit_reason()
        if reason:
            return reason
    try:
        load()
    except RuntimeError as e:
        return str(e)
    return None
