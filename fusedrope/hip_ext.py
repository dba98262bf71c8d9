"""The compiled HIP kernels for AMD GPUs: ONE torch extension built from every ``kernels_hip/*.hip`` and
``kernels_hip/*_torch.cpp`` source with hipcc, registering its ops under ``torch.ops.fusedrope_hip``.

* Built on first use (JIT, torch.utils.cpp_extension on a ROCm build of torch, with ROCm's hipcc) or ahead of
  time with ``build()``; one log line on stderr when a build starts.
* Cached in torch's extension directory (``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``) under a
  name that hashes the sources, the torch and HIP versions, the flags and the target architectures, so a
  changed source or torch never loads a stale build, and a finished build loads without a compiler.
* Sources are found in-tree (``<repo>/kernels_hip``) and installed (the wheel ships them as the package
  ``fusedrope.kernels_hip``).
* Targets: ``$PYTORCH_ROCM_ARCH`` (e.g. ``"gfx942"`` or ``"gfx942;gfx950"``) if set, else the visible GPUs;
  only gfx942 and gfx950 are compiled (the kernels use their fp8 instructions).

Status: the HIP kernel is compile-checked on CPU for gfx942 (tests/test_hip_kernels.py); this module and the
torch binding have not been run on a ROCm machine from this repository (docs/kernels_hip.md).
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

NAMESPACE = "fusedrope_hip"
ARCHS = ("gfx942", "gfx950")
BUILD_MESSAGE = "fusedrope: building HIP kernels (first use, a few minutes) ..."
HIPCC_FLAGS = ("-O3", "-std=c++17")
CXX_FLAGS = ("-O3", "-std=c++17")

_lock = threading.Lock()
_loaded: Optional[str] = None
_failure: Optional[str] = None


# -- sources ---------------------------------------------------------------------------------------------
def kernel_dir() -> Path:
    """The directory holding the HIP sources: the installed package ``fusedrope.kernels_hip`` or
    ``<repo>/kernels_hip``."""
    here = Path(__file__).resolve().parent
    candidates = [here / "kernels_hip"]
    try:
        spec = importlib.util.find_spec("fusedrope.kernels_hip")
        if spec is not None and spec.submodule_search_locations:
            candidates += [Path(p) for p in spec.submodule_search_locations]
    except (ImportError, ValueError):
        pass
    candidates.append(here.parent / "kernels_hip")
    for c in candidates:
        if c.is_dir() and any(c.glob("*.hip")):
            return c
    raise FileNotFoundError(
        "fusedrope: HIP kernel sources not found (looked in " + ", ".join(str(c) for c in candidates) + ")")


def sources() -> list[Path]:
    """Every source compiled into the extension: ``*.hip`` kernels and the ``*_torch.cpp`` bindings,
    sorted."""
    d = kernel_dir()
    return sorted(d.glob("*.hip")) + sorted(d.glob("*_torch.cpp"))


def _hashed_files() -> list[Path]:
    d = kernel_dir()
    return sorted(p for p in d.iterdir() if p.suffix in (".hip", ".h", ".hpp", ".cpp") and p.is_file())


# -- targets and build location --------------------------------------------------------------------------
def arch_list() -> str:
    """The target architectures, ``;``-separated (``"gfx942"``, ``"gfx942;gfx950"``)."""
    env = os.environ.get("PYTORCH_ROCM_ARCH", "").replace(",", ";").strip()
    if env:
        archs = [a.split(":")[0].strip() for a in env.split(";") if a.strip()]
    else:
        if not torch.cuda.is_available():
            raise RuntimeError("no GPU is visible to pick target architectures from: set PYTORCH_ROCM_ARCH "
                               "(e.g. 'gfx942' for MI300, 'gfx950' for MI350/MI355, or both)")
        archs = sorted({torch.cuda.get_device_properties(i).gcnArchName.split(":")[0]
                        for i in range(torch.cuda.device_count())})
    keep = [a for a in archs if a in ARCHS]
    if not keep:
        raise RuntimeError(f"no supported target: the HIP kernels are written for {', '.join(ARCHS)}, "
                           f"asked for {', '.join(archs) or 'nothing'}")
    return ";".join(sorted(set(keep)))


def ext_name(archs: Optional[str] = None) -> str:
    """``fusedrope_hip_<hash>``: the hash covers the sources, torch and HIP versions, flags and archs."""
    h = hashlib.sha256()
    for p in _hashed_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    key = f"{torch.__version__}|{torch.version.hip}|{archs or arch_list()}|{HIPCC_FLAGS}|{CXX_FLAGS}"
    h.update(key.encode())
    return f"{NAMESPACE}_{h.hexdigest()[:12]}"


def build_root() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(cache, "torch_extensions")
    tag = "rocm" + str(torch.version.hip or "").replace(".", "")[:4] if torch.version.hip else "cpu"
    return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}_{tag}"


def _library_path(name: str) -> Path:
    return build_root() / name / f"{name}.so"


def _short(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower() and not ln.startswith("ninja: build stopped"):
            return ln[:300]
    return (lines[0] if lines else type(e).__name__)[:300]


def _build(name: str, archs: str, verbose: bool) -> Path:
    from torch.utils import cpp_extension  # heavy: only when a build is really needed

    directory = build_root() / name
    directory.mkdir(parents=True, exist_ok=True)
    offload = [f"--offload-arch={a}" for a in archs.split(";")]
    cpp_extension.load(
        name=name,
        sources=[str(s) for s in sources()],
        extra_cflags=list(CXX_FLAGS),
        extra_cuda_cflags=[*HIPCC_FLAGS, *offload],  # torch adds no other --offload-arch when one is given
        extra_include_paths=[str(kernel_dir())],
        build_directory=str(directory),
        is_python_module=False,
        with_cuda=True,
        verbose=verbose,
    )
    return _library_path(name)


def load(verbose: bool = False) -> str:
    """Load the extension (building it first when no cached build matches); return the library's path.

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
            if lib.exists() and not (lib.parent / "lock").exists():
                torch.ops.load_library(str(lib))
            else:
                if not lib.exists():
                    print(BUILD_MESSAGE, file=sys.stderr, flush=True)
                lib = _build(name, archs, verbose)  # waits on torch's file baton if another process builds it
            _loaded = str(lib)
            return _loaded
        except Exception as e:  # noqa: BLE001 - any failure becomes the backend's reason
            _failure = f"HIP build failed: {_short(e)}"
            raise RuntimeError(_failure) from e


def build(verbose: bool = False) -> str:
    """Ahead-of-time build: compile and load the extension for ``$PYTORCH_ROCM_ARCH`` or the visible GPUs.

    Returns the library path; raises RuntimeError saying why it cannot.
    """
    reason = toolkit_reason()
    if reason:
        raise RuntimeError(f"fusedrope: cannot build the HIP kernels: {reason}")
    return load(verbose=verbose)


# -- availability ----------------------------------------------------------------------------------------
def toolkit_reason() -> Optional[str]:
    """Why no HIP build is possible here (torch flavour, hipcc), independent of a device; None if it is."""
    if not torch.version.hip:
        return ("this torch build has no ROCm (torch.version.hip is None); the 'hip' backend needs a ROCm "
                "torch (NVIDIA GPUs use the 'cuda' backend)")
    from torch.utils import cpp_extension

    if getattr(cpp_extension, "ROCM_HOME", None) is None:
        return "no ROCm toolkit to build the kernels: hipcc not found (set ROCM_HOME, or build ahead of time)"
    return None


def available(device: torch.device) -> Optional[str]:
    """None when the compiled HIP kernels can run on ``device`` (building or loading them if needed), else why
    not."""
    from .backends import gpu_arch, hip_toolkit_reason

    reason = hip_toolkit_reason(device)
    if reason:
        return reason
    arch = gpu_arch(device)
    if arch not in ARCHS:
        return f"the HIP kernels are built for {' and '.join(ARCHS)}, this GPU is {arch or 'unknown'}"
    if _loaded:
        return None
    if _failure:
        return _failure
    try:
        name = ext_name()
    except Exception as e:  # noqa: BLE001
        return f"cannot name the build: {_short(e)}"
    if not _library_path(name).exists():  # a cached build loads without hipcc; a new build needs it
        reason = toolkit_reason()
        if reason:
            return reason
    try:
        load()
    except RuntimeError as e:
        return str(e)
    return None
