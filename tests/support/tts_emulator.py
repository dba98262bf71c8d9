"""The qwen3_tts_rope CUDA kernel source (kernels_cuda/qwen3_tts_rope.cu with its launcher) built for the host
against tests/support/cuda_emul, and a registry backend, ``cuda_emulated``, that runs it on CPU tensors: the
contract suite (tests/qwen3_tts_rope) runs it as it runs every backend (tests/conftest.py registers it for the tests
that name it). The plain kernels run their threads one after another; the modes' (which shuffle) in lockstep."""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

import pytest
import torch

from compile_cache import build_once, content_key, host_cxx

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "kernels_cuda" / "qwen3_tts_rope.cu"
EMUL = ROOT / "tests" / "support" / "cuda_emul"
NAME = "cuda_emulated"
BACKENDS = (NAME,)


def build(lockstep: bool) -> ctypes.CDLL:
    """The kernel source and tests/support/cuda_emul/harness.cpp built for the host (cached by content): threads
    one after another, or each block's in lockstep (the modes' kernels shuffle)."""
    cxx = host_cxx()
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ or clang++) to run the kernel source in host emulation")
    flags = (["-std=c++20", "-pthread", "-ffp-contract=off", "-DCUDA_EMUL_LOCKSTEP=1", "-I", str(EMUL.parent)]
             if lockstep else ["-std=c++17"])
    cmd = [cxx, *flags, "-O1", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
           "-I", str(EMUL), "-x", "c++", str(EMUL / "harness.cpp"), f'-DKERNEL_SOURCE="{SRC}"']
    deps = [SRC, SRC.with_suffix(".cuh"), SRC.with_name("pdl.cuh"), *EMUL.glob("*"), EMUL.parent / "lockstep.h",
            EMUL.parent / "emul_stats.inc"]
    key = content_key(sorted(deps), *cmd)
    out = Path(tempfile.gettempdir()) / f"fusedrope-emu-{'lockstep-' * lockstep}{os.getuid()}-{key}.so"

    def on_error(stderr: str) -> None:
        pytest.fail(f"host-emulation build failed:\n{stderr[-4000:]}")

    lib = ctypes.CDLL(str(build_once(cmd, out, on_error)))
    lib.emu_qwen3_tts_rope.restype = ctypes.c_int
    lib.emu_qwen3_tts_rope_pick_vec.restype = ctypes.c_int
    lib.emu_launch_count.restype = ctypes.c_longlong
    if lockstep:
        lib.emul_stats.argtypes = [ctypes.POINTER(ctypes.c_longlong), ctypes.c_char_p, ctypes.c_int]
    return lib


def _pack(q, k, cos, sin, q_out, k_out):
    ptrs = (ctypes.c_void_p * 6)(*(t.data_ptr() for t in (q, k, cos, sin, q_out, k_out)))
    cb = 0 if cos.shape[0] == 1 else cos.stride(0)
    sb = 0 if sin.shape[0] == 1 else sin.stride(0)
    B, Hq, S, D = q.shape
    ints = (ctypes.c_int64 * 21)(*q.stride()[:3], *k.stride()[:3], cb, cos.stride(1), sb, sin.stride(1),
                                 *q_out.stride()[:3], *k_out.stride()[:3], B, S, Hq, k.shape[1], D)
    return ptrs, ints


def _pack_modes(q, k, cos, sin, q_out, k_out, positions=None, eager=False, q_weight=None, k_weight=None,
                max_pos=None) -> tuple:
    """``_pack`` and the modes, as the torch binding passes them (``max_pos`` overrides the table's)."""
    ptrs, ints = _pack(q, k, cos, sin, q_out, k_out)
    table = positions is not None
    if table:  # rows of the tables: c_ss / s_ss
        ints[6], ints[7], ints[8], ints[9] = 0, cos.stride(0), 0, sin.stride(0)
    p_sb, p_ss = ((positions.stride(0) if positions.dim() == 2 else 0), positions.stride(-1)) if table else (0, 0)
    modes = (ctypes.c_void_p * 3)(*(None if t is None else t.data_ptr() for t in (positions, q_weight, k_weight)))
    mode_ints = (ctypes.c_int64 * 6)(p_sb, p_ss, (cos.shape[0] if max_pos is None else max_pos) if table else 0,
                                     table and positions.dtype == torch.int64, table and cos.dtype == torch.float32,
                                     eager)
    return ptrs, ints, modes, mode_ints


def emu_call(lib, q, k, cos, sin, q_out, k_out, *, eps=0.0, pdl=False, **modes) -> int:
    """The launcher on the host; ``modes``: positions, eager, q_weight, k_weight, max_pos (see _pack_modes)."""
    ptrs, ints, mode_ptrs, mode_ints = _pack_modes(q, k, cos, sin, q_out, k_out, **modes)
    dtype = {torch.bfloat16: 0, torch.float16: 1}[q.dtype]
    return lib.emu_qwen3_tts_rope(ptrs, ints, dtype, int(pdl), mode_ptrs, mode_ints, ctypes.c_float(eps))


def emu_pick_vec(lib, q, k, cos, sin, q_out, k_out, **modes) -> int:
    return lib.emu_qwen3_tts_rope_pick_vec(*_pack_modes(q, k, cos, sin, q_out, k_out, **modes))


def lockstep_stats(lib) -> tuple[int, int, str]:
    """(errors, exchanges, first error) since the last call: a divergent shuffle is an error."""
    out, msg = (ctypes.c_longlong * 5)(), ctypes.create_string_buffer(256)
    lib.emul_stats(out, msg, 256)
    lib.emul_reset()
    return out[0], out[4], msg.value.decode()


_LIBS: dict = {}


def _run(q, k, cos, sin, q_out, k_out, positions=None, eager=False, q_weight=None, k_weight=None, eps=0.0,
         pdl=False):
    """The backend's ``run``: the launcher and kernel on the host, the modes' kernels with their threads in
    lockstep (a divergent shuffle is an error)."""
    lockstep = eager or positions is not None or q_weight is not None or pdl
    lib = _LIBS.get(lockstep) or _LIBS.setdefault(lockstep, build(lockstep))
    if lockstep:
        lockstep_stats(lib)
    rc = emu_call(lib, q, k, cos, sin, q_out, k_out, positions=positions, eager=eager, q_weight=q_weight,
                  k_weight=k_weight, eps=eps, pdl=pdl)
    if rc != 0:
        raise RuntimeError(f"{NAME}: the launcher returned {rc}")
    if lockstep and (stats := lockstep_stats(lib))[0]:
        raise AssertionError(f"{NAME}: {stats[2]}")


def backend(name: str = NAME):
    """``cuda_emulated`` for the registry: served as the cuda backend serves (bf16/fp16, head_dim 64, 128, 256),
    on CPU tensors, opt-in (auto never takes it)."""
    from fusedrope.qwen3_tts_rope import cuda
    from fusedrope.registry import Backend

    def supports(facts):
        if facts.device.type != "cpu":
            return "runs on CPU tensors"
        return cuda.supports(facts._replace(pdl=False))

    return Backend(NAME, _run, supports=supports, opt_in=lambda facts: "a test-only emulation")
