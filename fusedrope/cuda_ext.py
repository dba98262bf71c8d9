"""The compiled CUDA kernels: ONE torch extension built from every ``kernels_cuda/*.cu`` and
``kernels_cuda/*_torch.cpp`` source, registering its ops under ``torch.ops.fusedrope_cuda``.

* Built on first use (JIT, torch.utils.cpp_extension + ninja + nvcc) on a machine with a CUDA torch and a CUDA
  toolkit, or ahead of time with ``build()`` (``python -m fusedrope build``).
* Cached in torch's extension directory (``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``) under a
  name that hashes the sources, the torch and CUDA versions, nvcc's own version and the target architectures,
  so a changed source, torch or toolkit never loads a stale build. A cached build loads without nvcc.
* Sources are found in-tree (``<repo>/kernels_cuda``) and installed (the wheel ships them as the package
  ``fusedrope.kernels_cuda``).
* Target architectures: ``$TORCH_CUDA_ARCH_LIST`` if set (e.g. ``"9.0"`` or ``"8.0;9.0"``), else the visible
  GPUs.

``available(device)`` answers the registry (None, or the reason the ``cuda`` backend cannot run); it builds or
loads the extension the first time it is asked about a CUDA device, once per process. The build, load and
cache logic is fusedrope/jit_ext.py's (shared with the HIP extension); this module says what is CUDA's.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
from typing import Iterator, Optional

import torch

from . import jit_ext

NAMESPACE = "fusedrope_cuda"
BUILD_MESSAGE = "fusedrope: building CUDA kernels (first use, then cached) ..."
# No -std: torch picks the standard its headers need (C++17 or C++20, by version); the kernels build with
# both.
NVCC_FLAGS = ("-O3", "-lineinfo")
CXX_FLAGS = ("-O3",)


class CudaExtension(jit_ext.Extension):
    vendor = "CUDA"
    namespace = NAMESPACE
    folder = "kernels_cuda"
    kernel_suffix = ".cu"
    hashed_suffixes = (".cu", ".cuh", ".cpp", ".h", ".hpp")
    build_message = BUILD_MESSAGE
    device_flags = NVCC_FLAGS
    cxx_flags = CXX_FLAGS
    failure_prefix = "build failed"

    def arch_list(self) -> str:
        """The target architectures, as TORCH_CUDA_ARCH_LIST spells them (``"9.0"``, ``"8.0;9.0"``)."""
        env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
        if env:
            return env
        if not torch.cuda.is_available():
            raise RuntimeError("no GPU is visible to pick target architectures from: set "
                               "TORCH_CUDA_ARCH_LIST (e.g. '9.0' for H100/H200, '8.0;9.0;10.0' for several)")
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
        return ";".join(f"{a}.{b}" for a, b in caps)

    def toolkit_version(self) -> Optional[str]:
        return torch.version.cuda

    def compiler_version(self) -> str:
        root = toolkit_root()
        return jit_ext.version_output((os.path.join(root, "bin", "nvcc"), "--version")) if root else ""

    def build_tag(self) -> str:
        return "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else "cpu"

    @contextlib.contextmanager
    def target_env(self, archs: str) -> Iterator[None]:
        """TORCH_CUDA_ARCH_LIST (torch's nvcc flags come from it) and a CUDA_HOME that holds the toolkit's headers
        and libraries, for the build's duration."""
        from torch.utils import cpp_extension

        guessed, root = cpp_extension.CUDA_HOME, toolkit_root()
        cpp_extension.CUDA_HOME = root or guessed
        try:
            with jit_ext.env_set("TORCH_CUDA_ARCH_LIST", archs):
                yield
        finally:
            cpp_extension.CUDA_HOME = guessed

    def toolkit_reason(self) -> Optional[str]:
        """Why no build is possible on this machine (torch flavour, nvcc), independent of a device; None if it
        is."""
        if torch.version.hip:
            return (f"this torch is a ROCm build (torch.version.hip={torch.version.hip}); the 'cuda' backend "
                    "needs a CUDA torch (the 'hip' backend serves AMD GPUs)")
        if not torch.version.cuda:
            return "this torch build has no CUDA (torch.version.cuda is None)"
        from torch.utils import cpp_extension

        if cpp_extension.CUDA_HOME is None:
            return ("no CUDA toolkit to build the kernels: nvcc not found (set CUDA_HOME or put nvcc on "
                    "PATH, or build ahead of time with `python -m fusedrope build` where one is)")
        if toolkit_root() is None:
            return (f"no CUDA toolkit headers: CUDA_HOME={cpp_extension.CUDA_HOME} (torch's guess) has no "
                    "include/cuda_runtime.h and no /usr/local/cuda* has: set CUDA_HOME to the toolkit's root")
        return None

    def device_reason(self, device: torch.device) -> Optional[str]:
        if device.type == "cuda" and torch.version.hip:
            return self.toolkit_reason()
        from ._device import cuda_toolkit_reason

        return cuda_toolkit_reason(device)


TOOLKIT_CANDIDATES = ("/usr/local/cuda", "/usr/local/cuda-*")  # where toolkit_root looks when torch's guess fails


def _is_toolkit(root: Optional[str]) -> bool:
    return bool(root) and os.path.isfile(os.path.join(root, "include", "cuda_runtime.h")) and \
        os.path.isfile(os.path.join(root, "bin", "nvcc"))


def toolkit_root() -> Optional[str]:
    """The CUDA toolkit to build with: torch's CUDA_HOME when it holds the headers and nvcc, else (without an
    explicit CUDA_HOME / CUDA_PATH) the first that does of /usr/local/cuda, then /usr/local/cuda-* newest first.
    torch guesses CUDA_HOME from the folder of the nvcc on PATH, which is wrong where that nvcc is a wrapper
    script (e.g. /usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc: the guess is /usr/local)."""
    from torch.utils import cpp_extension

    if _is_toolkit(cpp_extension.CUDA_HOME):
        return cpp_extension.CUDA_HOME
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return None  # the user's choice stands; toolkit_reason says what is missing
    for pattern in TOOLKIT_CANDIDATES:
        for root in sorted(glob.glob(pattern), key=_version_key, reverse=True):  # the newest first
            if _is_toolkit(root):
                return root
    return None


def _version_key(path: str) -> tuple:
    """``/usr/local/cuda-12.10`` -> (12, 10): toolkits ordered by version number, not as strings (12.10 is
    newer than 12.9, 13.0 than 9.2)."""
    return tuple(int(n) for n in re.findall(r"\d+", os.path.basename(path)))


EXT = CudaExtension()
# kernel_dir, sources, arch_list, ext_name, build_root, load, build, toolkit_reason, available
jit_ext.export(__name__, EXT)
