"""gpu/raw_rejects.py on the CPU: the child's START/END protocol, with a stand-in op that raises, raises the
wrong message, returns silently, and kills its process with SIGSEGV (what the raw CUDA op did on the H200 at
63f6bd6); the cases after the crash are reported as not reached."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "gpu"))

import raw_rejects  # noqa: E402

CHILD = r'''
import os, signal, sys
sys.path.insert(0, {gpu!r})
import raw_rejects

def bad(msg):
    def call():
        raise RuntimeError(msg)
    return call

cases = {{"named": bad("fusedrope_cuda::op: argument 'q' expected 64, got 96"),
         "unnamed": bad("some other error"),
         "silent": lambda: None,
         "crash": lambda: os.kill(os.getpid(), signal.SIGSEGV),
         "after": bad("fusedrope_cuda::op: never reached")}}
if "--raw-rejects" in sys.argv:
    sys.exit(raw_rejects.child(cases))
'''


def test_child_protocol_survives_a_crash(tmp_path):
    script = tmp_path / "stand_in.py"
    script.write_text(CHILD.format(gpu=str(ROOT / "gpu")))
    got = {name: (ok, detail) for name, ok, detail in
           raw_rejects.checks(str(script), ["named", "unnamed", "silent", "crash", "after"], timeout=120)}
    assert got["named"] == (True, "fusedrope_cuda::op: argument 'q' expected 64, got 96")
    assert got["unnamed"][0] is False and "some other error" in got["unnamed"][1]
    assert got["silent"] == (False, "no error raised")
    assert got["crash"][0] is False and "died" in got["crash"][1] and "-11" in got["crash"][1]
    assert got["after"][0] is False and "not reached" in got["after"][1]


def test_parse_without_output_fails_every_case():
    got = raw_rejects.parse(["a", "b"], "", "timeout")
    assert [(n, ok) for n, ok, _ in got] == [("a", False), ("b", False)]
    assert all("not reached (rc timeout)" in d for _, _, d in got)
