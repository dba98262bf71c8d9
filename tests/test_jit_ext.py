"""The JIT builder shared by the CUDA and HIP extensions (fusedrope/jit_ext.py), on a stand-in extension over a
temporary kernel folder: no toolchain, no global state. A build's name hashes every source's contents; a failed
build is remembered for the process; a finished build loads without building."""

import pytest
import torch


def _fake_extension(tmp_path, monkeypatch):
    from fusedrope import jit_ext

    kdir = tmp_path / "kernels_x"
    kdir.mkdir()
    (kdir / "k.cu").write_text("// kernel v1\n")
    (kdir / "k.cuh").write_text("// header v1\n")
    (kdir / "k_torch.cpp").write_text("// binding\n")

    class Fake(jit_ext.Extension):
        vendor, namespace, folder, kernel_suffix = "X", "fusedrope_x", "kernels_x", ".cu"
        hashed_suffixes = (".cu", ".cuh", ".cpp")

        def arch_list(self):
            return "9.0"

        def toolkit_version(self):
            return "13.0"

        def build_tag(self):
            return "cu130"

        def kernel_dir(self):
            return kdir

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    return Fake(), kdir


def test_ext_name_changes_with_every_hashed_source(tmp_path, monkeypatch):
    ext, kdir = _fake_extension(tmp_path, monkeypatch)
    names = {ext.ext_name()}
    for f in ("k.cu", "k.cuh", "k_torch.cpp"):
        (kdir / f).write_text((kdir / f).read_text() + "// edited\n")
        names.add(ext.ext_name())
    assert len(names) == 4, names
    assert ext.ext_name() == ext.ext_name()


def test_ext_load_failure_is_remembered(tmp_path, monkeypatch):
    ext, _ = _fake_extension(tmp_path, monkeypatch)
    builds = []

    def build(name, archs, verbose):
        builds.append(name)
        raise RuntimeError("x.cu(3): error: expected a ';'")

    monkeypatch.setattr(ext, "_build", build)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="build failed: x.cu\\(3\\): error: expected a ';'"):
            ext.load()
    assert len(builds) == 1  # not retried in this process


def test_ext_cached_build_loads_without_building(tmp_path, monkeypatch):
    ext, _ = _fake_extension(tmp_path, monkeypatch)
    lib = ext.library_path(ext.ext_name())
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    loaded = []
    monkeypatch.setattr(torch.ops, "load_library", lambda path: loaded.append(path))
    monkeypatch.setattr(ext, "_build", lambda *a: pytest.fail("a cached build was rebuilt"))
    assert ext.load() == str(lib) and loaded == [str(lib)]
    assert ext.load() == str(lib) and loaded == [str(lib)]  # loaded once


def test_no_build_env_refuses_to_compile_but_loads_a_cached_build(tmp_path, monkeypatch):
    """FUSEDROPE_NO_BUILD=1: no first-use compile (the reason names the variable and the AOT command, and is not
    remembered); a cached build still loads; the ahead-of-time build() compiles anyway."""
    from fusedrope import jit_ext

    ext, _ = _fake_extension(tmp_path, monkeypatch)
    lib = ext.library_path(ext.ext_name())
    builds = []

    def build(name, archs, verbose):
        builds.append(name)
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_bytes(b"\x7fELF")
        return lib

    monkeypatch.setattr(ext, "_build", build)
    monkeypatch.setattr(ext, "toolkit_reason", lambda: None)
    monkeypatch.setattr(ext, "device_reason", lambda device: None)
    monkeypatch.setattr(torch.ops, "load_library", lambda path: None)
    monkeypatch.setenv(jit_ext.ENV_NO_BUILD, "1")
    for _ in range(2):
        with pytest.raises(jit_ext.NoBuildAllowed, match="no cached X build .* FUSEDROPE_NO_BUILD=1 forbids "
                                                         "compiling one here .*python -m fusedrope build"):
            ext.load()
        reason = ext.available(torch.device("cuda"))
        assert reason.startswith("no cached X build") and ext.failure is None
    assert builds == [] and not lib.exists()
    assert ext.build() == str(lib) and len(builds) == 1  # ahead of time: builds regardless
    ext.loaded = None
    assert ext.load() == str(lib) and len(builds) == 1  # the cached build loads under the variable
    monkeypatch.setenv(jit_ext.ENV_NO_BUILD, "0")
    ext.loaded = None
    lib.unlink()
    assert ext.load() == str(lib) and len(builds) == 2  # "0" allows building


def test_ext_name_changes_with_the_compiler_version(tmp_path, monkeypatch):
    """A toolkit upgraded under the same torch must not load the build the old compiler made."""
    ext, _ = _fake_extension(tmp_path, monkeypatch)
    monkeypatch.setattr(type(ext), "compiler_version", lambda self: "Cuda compilation tools, release 12.8")
    old = ext.ext_name()
    monkeypatch.setattr(type(ext), "compiler_version", lambda self: "Cuda compilation tools, release 13.0")
    assert ext.ext_name() != old


def test_cuda_toolkit_discovery_takes_the_newest_version_by_number(tmp_path, monkeypatch):
    """/usr/local/cuda-* ordered by version, not as strings: 12.10 after 12.9, 13.0 after 9.2."""
    from torch.utils import cpp_extension

    from fusedrope import cuda_ext

    for name in ("cuda-9.2", "cuda-12.9", "cuda-12.10", "cuda-11.8"):
        (tmp_path / name / "include").mkdir(parents=True)
        (tmp_path / name / "include" / "cuda_runtime.h").write_text("")
        (tmp_path / name / "bin").mkdir()
        (tmp_path / name / "bin" / "nvcc").write_text("")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setattr(cuda_ext, "TOOLKIT_CANDIDATES", (str(tmp_path / "cuda"), str(tmp_path / "cuda-*")))
    assert cuda_ext.toolkit_root() == str(tmp_path / "cuda-12.10")


def test_compiler_version_is_read_from_the_toolkit_once(tmp_path, monkeypatch):
    from fusedrope import cuda_ext, jit_ext

    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 42.1'\n")
    nvcc.chmod(0o755)
    monkeypatch.setattr(cuda_ext, "toolkit_root", lambda: str(tmp_path))
    jit_ext.version_output.cache_clear()
    assert cuda_ext.EXT.compiler_version() == "Cuda compilation tools, release 42.1"
    nvcc.write_text("#!/bin/sh\necho other\n")
    assert cuda_ext.EXT.compiler_version().endswith("42.1")  # asked once per process
