"""Triton's interpreter, probed before it is trusted: an interpreter that cannot run fusedrope's kernels (Triton
3.6 with numpy >= 2.4, triton-lang/triton#9171) leaves the triton backend out with the reason, and the ops fall
back to the reference instead of raising."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

import fusedrope
from fusedrope import _triton as triton_utils
from fusedrope._device import triton_interpreting
from fusedrope.testing import TtsCase, make_tts_inputs

from conftest import DEVICE

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(DEVICE.type != "cpu" or not triton_interpreting(),
                                reason="the interpreter runs only where no GPU is")


def test_this_environments_interpreter_has_no_defect():
    assert triton_utils.interpreter_defect() is None


class _Broken:
    """A kernel whose launch fails as Triton 3.6's interpreter does under numpy 2.4."""

    def __getitem__(self, grid):
        def launch(*args):
            raise RuntimeError("InterpreterError") from TypeError(
                "only 0-dimensional arrays can be converted to Python scalars")
        return launch


def _forget():
    triton_utils.interpreter_defect.cache_clear()
    for op in ("qwen3_tts_rope", "inverse_rope_group_quant"):
        fusedrope.registry(op).clear_cache()


def test_calls_from_several_threads_neither_fail_nor_poison_the_choice():
    """The interpreter patches triton.language while it runs a kernel: two threads at once broke each other
    (InterpreterError), and a probe that failed that way left auto on the reference for the rest of the
    process. Launches now take turns; every call is right and auto still picks triton afterwards."""
    import threading

    from fusedrope.testing import QuantCase, make_quant_inputs

    _forget()
    tts = make_tts_inputs(TtsCase("t", 1, 2, 2, 1, 64))
    quant = (*make_quant_inputs(QuantCase(2, 2, 1, head_dim=128, rope_dim=32, quant_group_size=64)), 1, 64)
    want_tts = fusedrope.qwen3_tts_rope(*tts, backend="reference")
    want_quant = fusedrope.inverse_rope_group_quant(*quant, backend="reference")
    _forget()
    errors, start = [], threading.Barrier(4)

    def work(i):
        try:
            start.wait()
            for _ in range(3):
                if i % 2:
                    got = fusedrope.qwen3_tts_rope(*tts)
                    assert all(torch.equal(a, b) for a, b in zip(got, want_tts))
                else:
                    got = fusedrope.inverse_rope_group_quant(*quant)
                    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want_quant))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert fusedrope.explain("qwen3_tts_rope", *tts).chosen == "triton"
    assert fusedrope.explain("inverse_rope_group_quant", *quant).chosen == "triton"


def test_a_defective_interpreter_leaves_triton_out_with_the_reason():
    probe, triton_utils._runtime_loop = triton_utils._runtime_loop, _Broken()
    triton_utils.interpreter_defect.cache_clear()
    _forget()
    try:
        q, k, cos, sin = make_tts_inputs(TtsCase("t", 1, 3, 2, 1, 64))
        ex = fusedrope.explain("qwen3_tts_rope", q, k, cos, sin)
        reason = next(d.reason for d in ex if d.backend == "triton")
        assert ex.chosen == "reference" and "triton-lang/triton#9171" in reason and "TypeError" in reason
        want = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")
        assert all(torch.equal(a, b) for a, b in zip(fusedrope.qwen3_tts_rope(q, k, cos, sin), want))
    finally:
        triton_utils._runtime_loop = probe
        _forget()
    assert fusedrope.explain("qwen3_tts_rope", q, k, cos, sin).chosen == "triton"


SCRIPT = r"""
import torch, fusedrope
from fusedrope.testing import QuantCase, TtsCase, make_quant_inputs, make_tts_inputs
tts = make_tts_inputs(TtsCase("t", 2, 5, 4, 2))
quant = make_quant_inputs(QuantCase(3, 4, 2))
for op, args, extra in (("qwen3_tts_rope", tts, ()), ("inverse_rope_group_quant", quant, (2,))):
    ex = fusedrope.explain(op, *args, *extra)
    fn = getattr(fusedrope, op)
    got, want = fn(*args, *extra), fn(*args, *extra, backend="reference")
    same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))
    print(op, ex.chosen, same, next(d.reason for d in ex if d.backend == "triton"))
"""


def test_the_device_images_triton_falls_back_or_runs():
    """Under Triton 3.6 (the oldest tested on GPUs; with this environment's numpy), every op runs, on triton or
    on the reference with the reason; never the interpreter's TypeError."""
    python = os.environ.get("FUSEDROPE_DEVICE_TRITON_PYTHON", "")
    if not python:
        pytest.skip("set FUSEDROPE_DEVICE_TRITON_PYTHON to a Python with triton==3.6.0 to run this; "
                    "`bash .ci/run` makes one")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    out = subprocess.run([python, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(out.stdout.splitlines()) == 2, out.stdout
    for line in out.stdout.splitlines():
        op, chosen, same, reason = line.split(" ", 3)
        assert same == "True", line
        assert chosen == "triton" or (chosen == "reference" and "runtime bound" in reason), line
