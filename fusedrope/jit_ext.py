"""One JIT builder for the compiled kernels of every vendor: a torch extension built from the sources of one
kernel folder (``kernels_cuda`` or ``kernels_hip``) with torch.utils.cpp_extension, registering its ops under
one namespace (``torch.ops.fusedrope_cuda`` / ``torch.ops.fusedrope_hip``).

:class:`Extension` holds what is the same for both: finding the sources in-tree or in the installed package,
the build name that hashes the sources, toolkit versions, flags and target architectures (so a changed source
or a different torch never loads a stale build), torch's extension directory, loading under a lock (a cached
build loads without a compiler; one log line on stderr when a build really starts), the failure remembered
for the process, ``build()`` for ``python -m fusedrope build`` and ``available(device)`` for the registry.
A vendor module (fusedrope/cuda_ext.py, fusedrope/hip_ext.py) subclasses it with its target architectures,
compiler flags and toolkit checks, and exposes the instance's methods as module functions (:func:`export`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator, Optional

import torch

from .fast_checks import extensions_folder


ENV_NO_BUILD = "FUSEDROPE_NO_BUILD"  # "1": never compile on first use; a cached build still loads


def builds_allowed() -> bool:
    """False where ``$FUSEDROPE_NO_BUILD`` is set (to anything but "" or "0"): a deployment that must not stall on
    a first-use compile, or a script whose earlier build failed; ``python -m fusedrope build`` builds anyway."""
    return os.environ.get(ENV_NO_BUILD, "") in ("", "0")


class NoBuildAllowed(RuntimeError):
    """No cached build, and ``$FUSEDROPE_NO_BUILD`` forbids making one (not remembered: checked on each call)."""


class Extension:
    """One vendor's extension. Subclasses set the attributes below and the vendor hooks at the end."""

    vendor: str = ""                       # "CUDA" / "HIP", for messages
    namespace: str = ""                    # torch.ops namespace, also the build name's prefix
    folder: str = ""                       # kernels_cuda / kernels_hip (installed: fusedrope.<folder>)
    kernel_suffix: str = ""                # ".cu" / ".hip": the kernel sources (and the folder's marker)
    hashed_suffixes: tuple[str, ...] = ()  # the folder's files with these suffixes are in the build's hash
    # Headers of sibling kernel folders that the sources include ("../kernels_cuda/x.h"): hashed too.
    sibling_headers: tuple[tuple[str, str], ...] = ()
    build_message: str = ""
    device_flags: tuple[str, ...] = ()     # nvcc / hipcc flags (without target architectures)
    cxx_flags: tuple[str, ...] = ()
    failure_prefix: str = "build failed"   # the remembered failure reads "<prefix>: <error line>"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.loaded: Optional[str] = None   # path of the loaded library
        self.failure: Optional[str] = None  # why loading failed in this process (not retried)

    # -- vendor hooks ----------------------------------------------------------------------------------------
    def arch_list(self) -> str:
        """The target architectures, ``;``-separated."""
        raise NotImplementedError

    def toolkit_version(self) -> Optional[str]:
        """torch.version.cuda / torch.version.hip (part of the build's hash)."""
        raise NotImplementedError

    def compiler_version(self) -> str:
        """What the device compiler says of its own version (part of the build's hash: a toolkit upgrade under
        the same torch must not load a stale build); "" when there is none to ask."""
        return ""

    def build_tag(self) -> str:
        """The toolkit part of torch's extension subfolder (``cu130``, ``rocm62``, ``cpu``)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def target_env(self, archs: str) -> Iterator[None]:
        """The environment torch's build reads the target architectures from (TORCH_CUDA_ARCH_LIST,
        PYTORCH_ROCM_ARCH), set to ``archs`` for the build's duration."""
        yield

    def toolkit_reason(self) -> Optional[str]:
        """Why no build is possible on this machine (torch flavour, compiler), independent of a device."""
        raise NotImplementedError

    def device_reason(self, device: torch.device) -> Optional[str]:
        """Why the kernels cannot run on ``device`` whatever is built; None if they can."""
        raise NotImplementedError

    # -- sources ---------------------------------------------------------------------------------------------
    def kernel_dir(self) -> Path:
        """The folder holding the sources: the installed package ``fusedrope.<folder>`` or
        ``<repo>/<folder>``."""
        here = Path(__file__).resolve().parent
        candidates = [here / self.folder]
        try:
            spec = importlib.util.find_spec(f"fusedrope.{self.folder}")
            if spec is not None and spec.submodule_search_locations:
                candidates += [Path(p) for p in spec.submodule_search_locations]
        except (ImportError, ValueError):
            pass
        candidates.append(here.parent / self.folder)
        for c in candidates:
            if c.is_dir() and any(c.glob(f"*{self.kernel_suffix}")):
                return c
        raise FileNotFoundError(f"fusedrope: {self.vendor} kernel sources not found (looked in "
                                + ", ".join(str(c) for c in candidates) + ")")

    @staticmethod
    def _ours(p: Path) -> bool:
        """False for the ``*_hip.*`` copies torch's hipify writes beside the sources on ROCm: compiling them
        too would define every kernel twice."""
        return not p.stem.endswith("_hip")

    def sources(self) -> list[Path]:
        """Every source compiled into the extension: the kernels and the torch bindings ``*_torch.cpp``,
        sorted."""
        d = self.kernel_dir()
        return [p for p in sorted(d.glob(f"*{self.kernel_suffix}")) + sorted(d.glob("*_torch.cpp")) if self._ours(p)]

    def hashed_files(self) -> list[Path]:
        d = self.kernel_dir()
        files = sorted(p for p in d.iterdir() if p.suffix in self.hashed_suffixes and p.is_file() and self._ours(p))
        for folder, pattern in self.sibling_headers:
            files += sorted(p for p in (d.parent / folder).glob(pattern) if p.is_file())
        return files

    # -- where the build lives -------------------------------------------------------------------------------
    def ext_name(self, archs: Optional[str] = None) -> str:
        """``<namespace>_<hash>``: the hash covers the sources, the torch and toolkit versions, flags and
        archs."""
        h = hashlib.sha256()
        for p in self.hashed_files():
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
        archs = archs or self.arch_list()
        key = (f"{torch.__version__}|{self.toolkit_version()}|{self.compiler_version()}|{archs}|{self.device_flags}|"
               f"{self.cxx_flags}")
        h.update(key.encode())
        return f"{self.namespace}_{h.hexdigest()[:12]}"

    def build_root(self) -> Path:
        """torch's JIT extension folder for this toolkit (``py311_cu130``), the one torch's own load() uses."""
        return extensions_folder(self.build_tag())

    def library_path(self, name: str) -> Path:
        return self.build_root() / name / f"{name}.so"

    # -- build and load --------------------------------------------------------------------------------------
    def _build(self, name: str, archs: str, verbose: bool) -> Path:
        from torch.utils import cpp_extension  # heavy: only when a build is really needed

        directory = self.build_root() / name
        directory.mkdir(parents=True, exist_ok=True)
        with self.target_env(archs):
            cpp_extension.load(
                name=name,
                sources=[str(s) for s in self.sources()],
                extra_cflags=list(self.cxx_flags),
                extra_cuda_cflags=list(self.device_flags),
                extra_include_paths=[str(self.kernel_dir())],
                build_directory=str(directory),
                is_python_module=False,
                with_cuda=True,
                verbose=verbose,
            )
        try:  # the compiled checks come along: seconds more of a build that takes minutes, for every later call
            build_fast_checks(verbose)
        except RuntimeError:
            pass  # every call takes the Python checks; `python -m fusedrope build --checks` says why
        return self.library_path(name)

    def load(self, verbose: bool = False, allow_build: Optional[bool] = None) -> str:
        """Load the extension (building it first if no cached build matches); return the library's path.

        ``allow_build`` (default: :func:`builds_allowed`, i.e. unless ``$FUSEDROPE_NO_BUILD`` is set) False makes
        a missing build an error (:class:`NoBuildAllowed`) instead of a compile. Raises RuntimeError with the
        reason when it cannot load. Thread-safe; a failed build is remembered for the process.
        """
        if self.loaded:
            return self.loaded
        with self._lock:
            if self.loaded:
                return self.loaded
            if self.failure:
                raise RuntimeError(self.failure)
            try:
                archs = self.arch_list()
                name = self.ext_name(archs)
                lib = self.library_path(name)
                done = False
                if lib.exists():  # a finished build of exactly these sources: load it, no toolchain needed
                    try:
                        torch.ops.load_library(str(lib))
                        done = True
                    except Exception:  # noqa: BLE001
                        if not (lib.parent / "lock").exists():  # no other process mid-build: a real failure
                            raise
                if not done:
                    if not (builds_allowed() if allow_build is None else allow_build):
                        raise NoBuildAllowed(
                            f"no cached {self.vendor} build {name} in {lib.parent.parent}, and "
                            f"{ENV_NO_BUILD}={os.environ.get(ENV_NO_BUILD, '')} forbids compiling one here "
                            "(`python -m fusedrope build` builds it ahead of time)")
                    if not lib.exists():
                        print(self.build_message, file=sys.stderr, flush=True)
                    lib = self._build(name, archs, verbose)  # waits on torch's baton if another one builds
                self.loaded = str(lib)
                return self.loaded
            except NoBuildAllowed:
                raise
            except Exception as e:  # noqa: BLE001 - any failure becomes the backend's reason
                self.failure = f"{self.failure_prefix}: {short_error(e)}"
                raise RuntimeError(self.failure) from e

    def build(self, verbose: bool = False) -> str:
        """Ahead-of-time build (``python -m fusedrope build``): compile and load the extension; return its
        path.

        Raises RuntimeError saying why it cannot.
        """
        reason = self.toolkit_reason()
        if reason:
            raise RuntimeError(f"fusedrope: cannot build the {self.vendor} kernels: {reason}")
        return self.load(verbose=verbose, allow_build=True)

    # -- availability ----------------------------------------------------------------------------------------
    def available(self, device: torch.device) -> Optional[str]:
        """None when the compiled kernels can run on ``device`` (building or loading them if needed), else why
        not."""
        reason = self.device_reason(device)
        if reason:
            return reason
        if self.loaded:
            return None
        if self.failure:
            return self.failure
        try:
            name = self.ext_name()
        except Exception as e:  # noqa: BLE001
            return f"cannot name the build: {short_error(e)}"
        if not self.library_path(name).exists():  # a cached build loads without a compiler, a new one not
            reason = self.toolkit_reason()
            if reason:
                return reason
        try:
            self.load()
        except RuntimeError as e:
            return str(e)
        return None


def build_fast_checks(verbose: bool = False) -> str:
    """Compile fusedrope/csrc/fast_checks.cpp with the host compiler (``python -m fusedrope build``) and load
    it for this process; return the library's path. Raises RuntimeError saying why it cannot.

    The compiler links in ``build/`` beside the library; the library and its digest then come into place each as a
    whole (written under a temporary name, then renamed), so an interrupted build leaves no library that
    :func:`fast_checks.load` would load, only one it refuses."""
    from torch.utils import cpp_extension

    from . import fast_checks

    path = fast_checks.library_path()
    (path.parent / "build").mkdir(parents=True, exist_ok=True)
    try:
        module = cpp_extension.load(name=path.stem, sources=[str(fast_checks.SOURCE)],
                                    build_directory=str(path.parent / "build"), extra_cflags=["-O2"], verbose=verbose)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"fusedrope: cannot build the compiled checks: {short_error(e)}") from e
    data = Path(module.__file__).read_bytes()
    digest = f"{hashlib.sha256(data).hexdigest()}  {path.name}\n"
    _write_whole(path.with_name(path.name + fast_checks.DIGEST), digest.encode())
    _write_whole(path, data)
    if fast_checks.load(again=True) is fast_checks.Python:
        raise RuntimeError(f"fusedrope: the compiled checks built at {path} do not load: {fast_checks.failure}")
    return str(path)


def _write_whole(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never part of it: written and synced under a temporary name
    in the same folder, then renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@functools.lru_cache(maxsize=None)
def version_output(argv: tuple) -> str:
    """``argv``'s output (e.g. ``nvcc --version``), cached for the process; "" when it cannot run."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def short_error(e: BaseException) -> str:
    """The most telling line of a build error (the compiler's 'error:' line if there is one)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower() and not ln.startswith("ninja: build stopped"):
            return ln[:300]
    return (lines[0] if lines else type(e).__name__)[:300]


@contextlib.contextmanager
def env_set(var: str, value: str) -> Iterator[None]:
    """``os.environ[var] = value`` for the duration, then the previous value (or none) again."""
    old = os.environ.get(var)
    os.environ[var] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old


def export(module_name: str, ext: Extension) -> None:
    """Give the vendor module the extension's interface as module attributes: ``kernel_dir``, ``sources``,
    ``arch_list``, ``ext_name``, ``build_root``, ``load``, ``build``, ``toolkit_reason``, ``available``.
    The load state lives on the extension object itself (``EXT.loaded`` / ``EXT.failure``)."""
    module = sys.modules[module_name]
    for attr in ("kernel_dir", "sources", "arch_list", "ext_name", "build_root", "load", "build",
                 "toolkit_reason", "available"):
        setattr(module, attr, getattr(ext, attr))
