"""The compiled HIP kernels for AMD GPUs: ONE torch extension built from every ``kernels_hip/*.hip`` and
``kernels_hip/*_torch.cpp`` source with hipcc, registering its ops under ``torch.ops.fusedrope_hip``.

* Built on first use (JIT, torch.utils.cpp_extension on a ROCm build of torch, with ROCm's hipcc) or ahead of
  time with ``build()``; one log line on stderr when a build starts.
* Cached in torch's extension directory (``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``) under a
  name that hashes the sources (with the plain-C++ ``kernels_cuda/*.h`` headers they include), the torch and
  HIP versions, hipcc's own version, the flags and the target architectures, so a changed source, torch or
  toolkit never loads a stale build, and a finished build loads without a compiler.
* Sources are found in-tree (``<repo>/kernels_hip``) and installed (the wheel ships them as the package
  ``fusedrope.kernels_hip``, beside ``fusedrope.kernels_cuda`` whose shared headers the HIP sources include as
  ``"../kernels_cuda/<name>.h"``).
* Targets: ``$PYTORCH_ROCM_ARCH`` (e.g. ``"gfx942"`` or ``"gfx942;gfx950"``) if set, else the visible GPUs;
  only gfx942 and gfx950 are compiled (the kernels use their fp8 instructions): the build sees
  PYTORCH_ROCM_ARCH set to just those.

The build, load and cache logic is fusedrope/jit_ext.py's (shared with the CUDA extension); this module says
what is HIP's.

Status: the HIP kernel is compiled and ISA-checked on CPU for gfx942 and gfx950
(tests/inverse_rope_group_quant/test_inverse_rope_group_quant_hip.py) and
runs whole in CPU lockstep emulation, built as for each
(tests/inverse_rope_group_quant/test_inverse_rope_group_quant_emulated.py); the backend is opt-in
(docs/status.md, docs/kernels_hip.md).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

import torch

from . import jit_ext
from ._device import HIP_ARCHS as ARCHS

NAMESPACE = "fusedrope_hip"
BUILD_MESSAGE = "fusedrope: building HIP kernels (first use, a few minutes) ..."
HIPCC_FLAGS = ("-O3", "-std=c++17")
CXX_FLAGS = ("-O3", "-std=c++17")


class HipExtension(jit_ext.Extension):
    vendor = "HIP"
    namespace = NAMESPACE
    folder = "kernels_hip"
    kernel_suffix = ".hip"
    hashed_suffixes = (".hip", ".h", ".hpp", ".cpp")
    sibling_headers = (("kernels_cuda", "*.h"),)  # the plain-C++ headers shared with the CUDA kernels
    build_message = BUILD_MESSAGE
    device_flags = HIPCC_FLAGS
    cxx_flags = CXX_FLAGS
    failure_prefix = "HIP build failed"

    def arch_list(self) -> str:
        """The target architectures, ``;``-separated (``"gfx942"``, ``"gfx942;gfx950"``)."""
        env = os.environ.get("PYTORCH_ROCM_ARCH", "").replace(",", ";").strip()
        if env:
            archs = [a.split(":")[0].strip() for a in env.split(";") if a.strip()]
        else:
            if not torch.cuda.is_available():
                raise RuntimeError("no GPU is visible to pick target architectures from: set "
                                   "PYTORCH_ROCM_ARCH (e.g. 'gfx942' for MI300, 'gfx950' for MI350/MI355, or "
                                   "both)")
            archs = sorted({torch.cuda.get_device_properties(i).gcnArchName.split(":")[0]
                            for i in range(torch.cuda.device_count())})
        keep = [a for a in archs if a in ARCHS]
        if not keep:
            raise RuntimeError(f"no supported target: the HIP kernels are written for {', '.join(ARCHS)}, "
                               f"asked for {', '.join(archs) or 'nothing'}")
        return ";".join(sorted(set(keep)))

    def toolkit_version(self) -> Optional[str]:
        return torch.version.hip

    def compiler_version(self) -> str:
        from torch.utils import cpp_extension

        home = getattr(cpp_extension, "ROCM_HOME", None)
        return jit_ext.version_output((os.path.join(home, "bin", "hipcc"), "--version")) if home else ""

    def build_tag(self) -> str:
        return "rocm" + str(torch.version.hip or "").replace(".", "")[:4] if torch.version.hip else "cpu"

    @contextlib.contextmanager
    def target_env(self, archs: str) -> Iterator[None]:
        """PYTORCH_ROCM_ARCH = exactly ``archs`` for the build's duration: torch's cpp_extension adds an
        --offload-arch for every arch it names (every visible card when unset), whatever flags we pass, and
        ROCm images often set it to a long list that the kernels' fp8 instructions do not compile for."""
        with jit_ext.env_set("PYTORCH_ROCM_ARCH", archs):
            yield

    def toolkit_reason(self) -> Optional[str]:
        """Why no HIP build is possible here (torch flavour, hipcc), independent of a device; None if it
        is."""
        if not torch.version.hip:
            return ("this torch build has no ROCm (torch.version.hip is None); the 'hip' backend needs a "
                    "ROCm torch (NVIDIA GPUs use the 'cuda' backend)")
        from torch.utils import cpp_extension

        if getattr(cpp_extension, "ROCM_HOME", None) is None:
            return ("no ROCm toolkit to build the kernels: hipcc not found (set ROCM_HOME, or build ahead "
                    "of time)")
        return None

    def device_reason(self, device: torch.device) -> Optional[str]:
        from ._device import gpu_arch, hip_toolkit_reason

        reason = hip_toolkit_reason(device)
        if reason:
            return reason
        arch = gpu_arch(device)
        if arch not in ARCHS:
            return f"the HIP kernels are built for {' and '.join(ARCHS)}, this GPU is {arch or 'unknown'}"
        return None


EXT = HipExtension()
# kernel_dir, sources, arch_list, ext_name, build_root, load, build, toolkit_reason, available
jit_ext.export(__name__, EXT)
