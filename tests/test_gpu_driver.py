"""gpu/run.sh, the one GPU driver, on the CPU: its syntax, its size, and its plumbing with stand-ins for python
(a build that fails, pytest runs that pass, a bench that outlives its limit) and compute-sanitizer: every step
runs or says why not, a failed or cut step does not stop the later ones, the steps after the build never compile,
the summary table comes last, and what lands under $OUT is what the device tool brings back (8 files at most,
2 folders down, plain names)."""

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "gpu" / "run.sh"

PYTHON = f"""#!{sys.executable}
# stands in for python3: records each call (and FUSEDROPE_NO_BUILD) and fakes the steps; runs the rest for real
import os, sys, time
args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as f:
    f.write(f"{{os.environ.get('FUSEDROPE_NO_BUILD', '-')}} {{' '.join(args)}}\\n")
if args[:3] == ["-m", "fusedrope", "build"]:
    sys.exit("stand-in build: nvcc failed")
if args[:3] == ["-m", "fusedrope", "bench"]:
    time.sleep(60)  # past its limit: cut
if args[:2] == ["-m", "pip"]:  # the carried wheels, where .whl/ holds some: not installed here
    sys.exit(0)
if args[:2] == ["-m", "pytest"]:
    if "--junitxml" in args:
        with open(args[args.index("--junitxml") + 1], "w") as f:
            f.write('<testsuites><testsuite tests="3" failures="0" errors="0" skipped="1"/></testsuites>')
    print("2 passed, 1 skipped in 0.01s")
    sys.exit(0)
os.execv(sys.executable, [sys.executable, *args])
"""

SANITIZER = f"""#!{sys.executable}
# stands in for compute-sanitizer: runs the command after its options, then prints memcheck's summary line
import subprocess, sys
args = sys.argv[1:]
rc = subprocess.call(args[args.index("--print-limit") + 2:])
print("========= ERROR SUMMARY: 0 errors")
sys.exit(rc)
"""


def _tool(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_driver_syntax_and_size():
    subprocess.run(["bash", "-n", str(DRIVER)], check=True)
    lines = sum(len(p.read_text().splitlines()) for p in DRIVER.parent.iterdir() if p.is_file())
    assert lines <= 300, f"gpu/ holds {lines} lines: the driver stays thin"
    assert subprocess.run(["bash", str(DRIVER), "--no-such-flag"], capture_output=True).returncode == 2


def test_driver_runs_every_step_and_records_failures(tmp_path):
    out, calls = tmp_path / "out", tmp_path / "calls.txt"
    env = dict(os.environ, OUT=str(out), CALLS=str(calls), TOTAL_S="300", MIN_S="1", BENCH_S="3",
               PYTHON=_tool(tmp_path / "python", PYTHON), SANITIZER=_tool(tmp_path / "sanitizer", SANITIZER), NCU="",
               FUSEDROPE_GIT_COMMIT="0123abc")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(["bash", str(DRIVER)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    log = proc.stdout
    assert proc.returncode == 1, log + proc.stderr  # the build failed
    assert (out / "log.txt").read_text() == log
    table = log[log.index("| step | status | seconds | notes |"):]
    rows = dict(re.findall(r"^\| ([\w-]+) \| ([^|]+) \|", table, re.M)[1:])  # not the header
    assert rows == {"env": "ok", "build": "FAILED (rc 1)", "gpu-tests": "ok", "memcheck": "ok",
                    "bench": "cut at 3 s", "overhead": "ok", "ncu": "skipped", "tests": "ok"}, table
    assert "| gpu-tests | ok |" in table and "2 passed, 0 failed, 0 errors, 1 skipped" in table
    assert "ERROR SUMMARY: 0 errors; 2 passed, 1 skipped" in table and "ncu not found" in table
    assert "commit 0123abc" in log and "python 3." in log and "stand-in build: nvcc failed" in log
    steps = [line for line in calls.read_text().splitlines() if " -m pip " not in line and " -m " in line]
    want = [("-", "-m fusedrope build"), ("1", "-m pytest -q -rfEs -p no:cacheprovider -m gpu"),
            ("1", "-m pytest -q -rfE -p no:cacheprovider -m gpu -k not rejects and not seed and not graph"),
            ("1", "-m fusedrope bench --out"), ("1", "-m pytest -q -s -p no:cacheprovider bench/test_overhead.py"),
            ("1", "-m pytest -q -rfE -p no:cacheprovider -m not gpu")]
    assert len(steps) == len(want), steps
    for line, (no_build, start) in zip(steps, want):
        assert line.startswith(f"{no_build} {start}"), line
    assert "--op all" in steps[3] and "cuda_head" in steps[3] and "vllm" in steps[3] and "auto:qk_norm_rope" in steps[3]
    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(p.parts) <= 3 and re.fullmatch(r"[\w.-]+", p.name) for p in files), files
    assert {"log.txt", "pytest-gpu.xml", "pytest.xml", "memcheck.txt"} <= {str(p) for p in files}


def test_driver_runs_only_the_steps_named(tmp_path):
    """STEPS="tests" (a rerun of what a first call left out): the others say so and nothing else runs."""
    out, calls = tmp_path / "out", tmp_path / "calls.txt"
    env = dict(os.environ, OUT=str(out), CALLS=str(calls), STEPS="tests", PYTHON=_tool(tmp_path / "python", PYTHON),
               SANITIZER="", NCU="")
    proc = subprocess.run(["bash", str(DRIVER)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("build", "gpu-tests", "bench", "overhead"):
        assert f"| {name} | skipped | 0 | not in STEPS |" in proc.stdout
    assert "| tests | ok |" in proc.stdout
    steps = [line for line in calls.read_text().splitlines() if " -m pip " not in line and " -m " in line]
    assert len(steps) == 1 and " -m not gpu " in steps[0] and "test_qwen3_tts_rope.py" in steps[0], steps
