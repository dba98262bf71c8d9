"""fusedrope's command line (``fusedrope`` or ``python -m fusedrope``): what this machine can run, which
backend each op picks for the seed shapes and why, a self-check of every available backend against the oracle,
and a short timing table.

    fusedrope            # the report (same as `report`)
    fusedrope build      # build the compiled checks and the CUDA / HIP kernels ahead of time (--checks: only those)
    fusedrope bench      # benchmark both ops: the seed tables, JSON/CSV/markdown and plots
    fusedrope status     # what backend="auto" passes over, and why
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    # No GPU: the Triton kernels can only run in Triton's CPU interpreter. Switch it on before any kernel
    # module is imported, so the self-check exercises the real kernel code.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusedrope  # noqa: E402
from fusedrope import reference as R  # noqa: E402
from fusedrope._device import gpu_arch, native_fp8_dtype  # noqa: E402
from fusedrope._validation import dtype_name  # noqa: E402
from fusedrope.testing import (QUANT_CASES, TTS_CASES, QuantCase, TtsCase, assert_quant_close,  # noqa: E402
                               assert_ulp_close, make_quant_inputs, make_tts_inputs, rope_blocks)

DEVICE = torch.device("cuda" if HAS_GPU else "cpu")
OPS = ("qwen3_tts_rope", "inverse_rope_group_quant")


def _versions() -> str:
    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = "not installed"
    return f"fusedrope {fusedrope.__version__}, torch {torch.__version__}, triton {tv}, python {sys.version.split()[0]}"


def machine() -> None:
    print("== machine")
    print(" ", _versions())
    if HAS_GPU:
        name = torch.cuda.get_device_name(DEVICE)
        flavour = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        print(f"  GPU: {name} ({gpu_arch(DEVICE)}), torch {flavour}")
    else:
        print("  No GPU here: the GPU kernels (CUDA, HIP, Triton on a GPU) cannot run on this machine.")
        if os.environ.get("TRITON_INTERPRET") == "1":
            print("  Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1): correct, but slow,")
            print("  so their timings below say nothing about GPU speed.")
    from . import fast_checks

    built = fast_checks.load() is not fast_checks.Python
    print("  Compiled checks of the plain calls: " + (
        "built" if built else f"{'not loaded: ' + fast_checks.failure if fast_checks.failure else 'not built'} "
        "(each call takes the Python checks; `python -m fusedrope build --checks` builds them)"))


def _tts_args(case: TtsCase):
    return make_tts_inputs(case, device=DEVICE)


def _quant_args(case: QuantCase):
    o, pos, cos, sin = make_quant_inputs(case, device=DEVICE)
    return (o, pos, cos, sin, case.num_groups, case.quant_group_size)


def _quant_fp8() -> torch.dtype:
    """The fp8 format op 2 is asked for here: the device's own (the hip kernel writes only float8_e4m3fnuz on
    gfx942, so with the default e4m3fn it would not run)."""
    return native_fp8_dtype(DEVICE)


def backends() -> None:
    print("\n== backends on this machine (device: %s)" % DEVICE)
    for op in OPS:
        reg = fusedrope.registry(op)
        print(f"  {op}:")
        for b in reg.backends:
            reason = reg.availability(b, DEVICE)
            print(f"    {'yes' if reason is None else 'no ':<4}{b.name:<10}{reason or ''}")


def selection() -> None:
    print("\n== backend chosen for the seed shapes (backend='auto')")
    groups: dict = {}
    small_tts = [c for c in TTS_CASES if c.batch == 1]
    for case in TTS_CASES:
        # cos/sin tensors only shape the choice through dtype, device and D: tiny stand-ins suffice.
        args = _tts_args(TtsCase(case.name, 1, 1, 1, 1, case.head_dim)) if case not in small_tts else _tts_args(case)
        ex = fusedrope.explain("qwen3_tts_rope", *args)
        groups.setdefault(("qwen3_tts_rope", str(ex)), []).append(case.id)
    for case in QUANT_CASES[:3] + QUANT_CASES[10:11]:
        ex = fusedrope.explain("inverse_rope_group_quant", *_quant_args(QuantCase(1, case.num_heads, case.num_groups)),
                               fp8_dtype=_quant_fp8())
        label = f"(H, G)=({case.num_heads}, {case.num_groups})"
        groups.setdefault(("inverse_rope_group_quant", str(ex)), []).append(label)
    for (op, text), ids in groups.items():
        head, *rows = text.splitlines()
        print(f"  {head}   [{', '.join(dict.fromkeys(i.rsplit('-B', 1)[0] if '-B' in i else i for i in ids))}]")
        for r in rows:
            print("    " + r.strip())


def _available(op: str) -> list[str]:
    reg = fusedrope.registry(op)
    return [b.name for b in reg.backends if reg.availability(b, DEVICE) is None]


def self_check() -> bool:
    print("\n== self-check against the oracle")
    ok = True
    tts_cases = [TTS_CASES[0], TTS_CASES[7]]
    quant_cases = [QuantCase(2, 16, 2), QuantCase(3, 8, 1, quant_group_size=32)]
    for backend in _available("qwen3_tts_rope"):
        try:
            for case in tts_cases:
                q, k, cos, sin = _tts_args(case)
                q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend)
                q_ref, k_ref = R.qwen3_tts_rope_oracle(q, k, cos, sin)
                assert_ulp_close(q_out, q_ref, 1, "q")
                assert_ulp_close(k_out, k_ref, 1, "k")
            print(f"  PASS qwen3_tts_rope           {backend:<10} within 1 ulp of the fp64 oracle on "
                  f"{len(tts_cases)} seed cases")
        except Exception as e:  # noqa: BLE001 - report every backend
            ok = False
            print(f"  FAIL qwen3_tts_rope           {backend:<10} {type(e).__name__}: {str(e).splitlines()[0]}")
    fp8 = _quant_fp8()
    for backend in _available("inverse_rope_group_quant"):
        try:
            for case in quant_cases:
                for ts in (False, True):
                    args = _quant_args(case)
                    got = fusedrope.inverse_rope_group_quant(*args, ts, backend=backend, fp8_dtype=fp8)
                    ref = fusedrope.inverse_rope_group_quant(*args, ts, backend="reference", fp8_dtype=fp8)
                    assert_quant_close(*got, *ref, rope_blocks(case), backend)
            print(f"  PASS inverse_rope_group_quant {backend:<10} scale bytes exact, {dtype_name(fp8)} within 1 ulp, "
                  "both layouts")
        except Exception as e:  # noqa: BLE001
            ok = False
            print(f"  FAIL inverse_rope_group_quant {backend:<10} {type(e).__name__}: {str(e).splitlines()[0]}")
    return ok


def _time(fn, reps: int) -> float:
    fn()
    if HAS_GPU:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e6 / reps


def timing() -> None:
    threads = torch.get_num_threads()
    if not HAS_GPU:
        torch.set_num_threads(1)  # on a shared CPU, parallel regions wait for a descheduled thread (ms per call)
    try:
        _timing_table()
    finally:
        torch.set_num_threads(threads)


def _timing_table() -> None:
    columns = list(reversed(fusedrope.BACKENDS))  # every backend an op can register, slowest first
    where = "GPU, CUDA events around back-to-back calls" if HAS_GPU else "CPU wall clock; triton = interpreter"
    print(f"\n== timing, us per call ({where}; bench/ holds the real benchmarks)")
    print(f"  {'op / case':<44}" + "".join(f"{b:>12}" for b in columns))
    reps = 50 if HAS_GPU else 3
    rows = []
    for case in (TTS_CASES[0], TTS_CASES[-1] if HAS_GPU else TTS_CASES[-3]):
        args = _tts_args(case)
        rows.append((f"qwen3_tts_rope {case.id}", "qwen3_tts_rope",
                     lambda b, a=args: fusedrope.qwen3_tts_rope(*a, backend=b)))
    fp8 = _quant_fp8()
    for case in (QuantCase(1, 16, 2), QuantCase(32 if not HAS_GPU else 2048, 16, 2)):
        args = _quant_args(case)
        rows.append((f"inverse_rope_group_quant S={case.num_tokens} H=16 G=2", "inverse_rope_group_quant",
                     lambda b, a=args: fusedrope.inverse_rope_group_quant(*a, backend=b, fp8_dtype=fp8)))
    for label, op, call in rows:
        have = _available(op)
        cells = [f"{_time(lambda: call(b), reps):12.1f}" if b in have else f"{'-':>12}"
                 for b in columns]
        print(f"  {label:<44}" + "".join(cells))


def report(args) -> int:
    machine()
    backends()
    selection()
    ok = self_check()
    if not args.no_timing:
        timing()
    print("\nself-check:", "all available backends PASS" if ok else "FAILURES above")
    return 0 if ok else 1


def build(args) -> int:
    """Exit 0 when the compiled checks were built and (without ``--checks``) a kernel extension was built and the
    other one only cannot build here (the other vendor); 1 when a build failed or no kernels were built, so an
    ahead-of-time step in a Dockerfile or CI fails loudly."""
    from .jit_ext import build_fast_checks

    try:
        print(f"compiled checks: built {build_fast_checks(verbose=args.verbose)}")
    except RuntimeError as e:
        print(f"compiled checks: not built: {e}")
        return 1
    if args.checks:
        return 0
    built, failed = 0, False
    for name, module in (("CUDA", "fusedrope.cuda_ext"), ("HIP", "fusedrope.hip_ext")):
        mod = __import__(module, fromlist=["build"])
        try:
            print(f"{name}: built {mod.build(verbose=args.verbose)}")
            built += 1
        except Exception as e:  # noqa: BLE001
            print(f"{name}: not built: {e}")
            failed = failed or "cannot build" not in str(e)
    if not built:
        print("nothing was built: " + ("see the build errors above" if failed else
                                       "this machine has no toolchain and torch for either kind of compiled kernel"))
    return 0 if built and not failed else 1


def bench(args, argv) -> int:
    from fusedrope import benchmark

    command = " ".join([sys.executable, "-m", "fusedrope", *(sys.argv[1:] if argv is None else argv)])
    return benchmark.cli(args, command)


def _positive(kind):
    """An argparse type: a number of ``kind`` above zero."""
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a number above 0, got {text}")
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def plot(args) -> int:
    """Draw each results file's plots; a file that is missing or not a results.json is named, and exit 2."""
    from fusedrope.benchmark import report as bench_report

    for path in args.results:
        try:
            results = bench_report.load_results(path)
        except (OSError, ValueError) as e:
            print(f"python -m fusedrope plot: {e}", file=sys.stderr)
            return 2
        files = bench_report.plot(results, args.out or os.path.dirname(os.path.abspath(path)))
        print("\n".join(str(f) for f in files) if files else f"{path}: no measured rows to plot")
    return 0


def main(argv=None) -> int:
    prog = "fusedrope" if os.path.basename(sys.argv[0]) == "fusedrope" else "python -m fusedrope"
    about = " ".join(__doc__.split("\n\n")[0].split()).replace("``", "")
    parser = argparse.ArgumentParser(prog=prog, description=about)
    # --no-timing works with and without the word `report`: the default command takes its options too.
    parser.add_argument("--no-timing", action="store_true", help="skip the timing table of the report")
    sub = parser.add_subparsers(dest="command")
    rep = sub.add_parser("report", help="backends, selection, self-check, timing (the default)")
    rep.add_argument("--no-timing", dest="report_no_timing", action="store_true", help="skip the timing table")
    b = sub.add_parser("build", help="build the compiled checks and CUDA/HIP kernels ahead of time")
    b.add_argument("--verbose", action="store_true")
    b.add_argument("--checks", action="store_true", help="only the compiled checks of both ops' plain calls "
                   "(C++ for the host: any machine with a C++ compiler)")
    be = sub.add_parser("bench", help="benchmark both ops against every contender: seed tables, files, plots")
    be.add_argument("--op", default="all", choices=("all",) + OPS)
    size = be.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a short matrix (tiny sizes on a CPU-only machine)")
    size.add_argument("--full", action="store_true", help="run the seed matrix even on a CPU-only machine")
    be.add_argument("--out", help="output folder (default bench/results/<gpu or cpu>-<matrix>-<commit>)")
    be.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                    help="PNG plots (matplotlib)")
    be.add_argument("--reps", type=_positive(int), default=None,
                    help="timing samples per measurement (default 5 GPU, 3 CPU)")
    be.add_argument("--no-compile", action="store_true", help="skip the torch.compile contender")
    be.add_argument("--no-graph", action="store_true", help="skip CUDA-graph device timing")
    be.add_argument("--interpreter", action="store_true", help="on a CPU, time Triton in its interpreter too")
    be.add_argument("--transpose-scale", action="store_true", help="op 2 with the column-major scale layout")
    be.add_argument("--contenders", default="", help="comma-separated contender names to run (default: all)")
    be.add_argument("--cases", default="", help="comma-separated case ids to run (default: the whole matrix; "
                                                "an op none of whose cases is named runs all of them)")
    be.add_argument("--budget-s", type=_positive(float), default=None,
                    help="start no new case after this many seconds")
    sub.add_parser("status", help="what backend='auto' passes over and why (docs/status.md's table)")
    pl = sub.add_parser("plot", help="PNG plots from saved results.json files (bench/results/...)")
    pl.add_argument("results", nargs="+", help="results.json files (the bench CLI's or the gpu/ scripts')")
    pl.add_argument("--out", help="folder for the PNGs (default: each file's own folder)")
    args = parser.parse_args(argv)
    if args.command not in (None, "report") and args.no_timing:
        parser.error(f"--no-timing belongs to the report, not to `{args.command}`")
    if args.command == "build":
        return build(args)
    if args.command == "bench":
        return bench(args, argv)
    if args.command == "plot":
        return plot(args)
    if args.command == "status":
        from fusedrope.backends import status_table

        print(status_table(), end="")
        return 0
    args.no_timing = args.no_timing or getattr(args, "report_no_timing", False)
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
