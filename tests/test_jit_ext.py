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
