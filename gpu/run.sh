#!/usr/bin/env bash
# gpu/run.sh: the GPU checks and benchmarks of fusedrope in ONE device call. Each step is time-limited, a failed
# or cut step is recorded and the later steps run all the same, and a short table comes last.
#
# Usage, from the repository root:
#   bash gpu/run.sh --fetch-wheels   HERE (the device has no network): Liger-Kernel's wheel into the git-ignored
#                                    .whl/, for the bench's op-1 peer (installed on the device when carried), and
#                                    vLLM's op-2 kernel file out of its wheel (fusedrope/benchmark/vllm_peer.py)
#   then one device call (both values read here: the device's copy of the tree has no .git):
#     run(command="FUSEDROPE_GIT_COMMIT=<git rev-parse HEAD> FUSEDROPE_GIT_DIRTY=<1 if git status --porcelain
#         prints anything, else 0> TOTAL_S=400 bash gpu/run.sh", carry=[".whl"], timeout_s=440)
#
# Steps (none is started with less than MIN_S seconds left of TOTAL_S; each gets at most its cap, less what the
# steps after it keep):
#   env        provenance: commit, GPU and driver, python / torch / CUDA / triton / nvcc / liger versions
#   build      python -m fusedrope build (the compiled checks and the CUDA extension, ahead of time); the later
#              steps never compile (FUSEDROPE_NO_BUILD=1): after a failed build the cuda tests skip with its error
#   gpu-tests  pytest -m gpu tests/: the tests that need a GPU (tests/*/test_*_gpu.py, op 1's modes' GPU test)
#   memcheck   compute-sanitizer memcheck (PYTORCH_NO_CUDA_MEMORY_CACHING=1, so each tensor is its own
#              allocation) over the gpu tests of both ops but those MEMCHECK_K leaves out (the child processes,
#              the seed sizes, and the CUDA graphs, whose capture cannot allocate without the caching allocator)
#   bench      python -m fusedrope bench with BENCH_ARGS (default: op 1 on four seed cases: numerics='eager',
#              cos/sin tables read by the kernel against gathered ones, the fused q/k norm+RoPE against the
#              model's eager chain, torch.compile of it and two torch RMSNorms then the op, beside cuda and triton,
#              and the cuda kernels of those modes and of enable_pdl (opt-in: docs/status.md);
#              then op 2's seed matrix, S sweep first: the candidate head kernel (cuda_head, opt-in:
#              docs/status.md) against the default generic kernel (cuda), Triton, vLLM's own kernel (vllm, from
#              the carried .whl/), the unfused baseline and the launch floor, with PDL and a bf16 cache on both
#              kernels, the engines' layouts through the public op (auto:col, auto:group_major, auto:mfma_tile,
#              auto:bf16, auto:pdl, auto:vllm) and on the kernels (cuda:col, cuda_head:col,
#              cuda_head:group_major, cuda_head:group_major:col); the copy roofline is measured in the same run),
#              --budget-s a little under its limit
#   overhead   bench/test_overhead.py: the host cost of both public calls, with and without the compiled checks, on
#              this machine's CPU (its ratios in log.txt)
#   tests      pytest -m "not gpu" over TESTS: by default the suites that run kernels on the device (TESTS=tests:
#              the whole suite, whose CPU-only parts, emulation, SASS, AOT, lint, give on the GPU machine what
#              they give in CI, at the cost of minutes)
#   ncu        Nsight Compute on op 2's generic and head kernels, row-major then column-major scales (S = 8192,
#              (H, G) = (16, 2))
# Files under $OUT (the device tool brings back 8): log.txt (all printed), pytest-gpu.xml and pytest.xml (junit),
# memcheck.txt, ncu.txt, bench/results.json, bench/results.csv, bench/results.md (plots: `python -m fusedrope
# plot bench/results.json` here). Exit status 0 when no step failed (skipped or cut steps are not failures).
# Knobs (environment): TOTAL_S (520), OUT (./gpu_out), PYTHON (python3), MIN_S (20), STEPS (the steps to run,
# e.g. STEPS="build tests" for a rerun), the caps BUILD_S (240), GPU_TESTS_S (150), MEMCHECK_S (100), BENCH_S (210),
# OVERHEAD_S (50), TESTS_S (200), NCU_S (45), MEMCHECK_K, BENCH_ARGS, TESTS, SANITIZER, NCU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ "${1:-}" = --fetch-wheels ]; then
    exclude="$(git rev-parse --git-path info/exclude)"
    grep -qxF '/.whl/' .gitignore "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "liger-kernel==${LIGER_VERSION:-0.8.5}" || exit 1
    # vLLM's wheel is too big to carry (the device takes 64 MiB): its one kernel file is, for op 2's "vllm" peer
    tmp="$(mktemp -d)"
    "$PY" -m pip download --no-deps --only-binary=:all: -d "$tmp" "vllm${VLLM_VERSION:+==$VLLM_VERSION}" \
        && unzip -p "$tmp"/vllm-*.whl vllm/models/deepseek_v4/common/ops/fused_inv_rope_fp8_quant.py \
            >.whl/fused_inv_rope_fp8_quant.py
    status=$?
    rm -rf "$tmp"
    exit $status
elif [ $# -gt 0 ]; then
    echo "usage: bash gpu/run.sh [--fetch-wheels] (knobs in the environment: see the header)" >&2
    exit 2
fi
OUT="${OUT:-$PWD/gpu_out}"
TOTAL_S="${TOTAL_S:-520}"
MIN_S="${MIN_S:-20}"
STEPS="${STEPS:-build gpu-tests memcheck bench overhead tests ncu}"
MEMCHECK_K="${MEMCHECK_K:-not rejects and not seed and not graph}"
BENCH_ARGS="${BENCH_ARGS:---op all --contenders cuda,cuda_head,triton,vllm,cuda:pdl,cuda_head:pdl,cuda:bf16_cache,\
cuda_head:bf16_cache,auto:col,auto:group_major,auto:mfma_tile,auto:bf16,auto:pdl,auto:vllm,unfused,floor,\
cuda:col,cuda_head:col,cuda_head:group_major,cuda_head:group_major:col,\
auto:eager,auto:table,gather+auto,norm_rope:eager,norm_rope:compile,norm_rope:2norms+auto,auto:qk_norm_rope,liger,\
cuda:eager,cuda:table,cuda:qk_norm_rope,cuda:pdl \
--cases qwen3_tts-B1,qwen3_tts-B8,qwen3_tts-B32,wide_heads-B32}"
SANITIZER="${SANITIZER-$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null \
    | head -1)}"
NCU="${NCU-$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}"
GPU_TEST_FILES=(tests/qwen3_tts_rope/test_qwen3_tts_rope_gpu.py
                tests/inverse_rope_group_quant/test_inverse_rope_group_quant_gpu.py)
TESTS="${TESTS:-tests/qwen3_tts_rope/test_qwen3_tts_rope.py tests/qwen3_tts_rope/test_qwen3_tts_rope_buffers.py \
tests/qwen3_tts_rope/test_qwen3_tts_rope_modes.py \
tests/inverse_rope_group_quant/test_inverse_rope_group_quant.py tests/test_registry.py tests/test_dynamic_shapes.py \
tests/test_examples.py}"
ROWS=()     # "step|status|seconds|note", one per step, for the summary
FAILED=0

left() { echo $((TOTAL_S - SECONDS)); }
# limit CAP KEEP: seconds for the next step: at most CAP, keeping KEEP for the steps after it
limit() { local l=$(($(left) - $2)); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }
record() { ROWS+=("$1|$2|$3|${4:-}"); }

# step NAME LIMIT CMD...: CMD under `timeout` (SIGINT first: pytest then writes its junit file, a build releases
# its lock), its output to $TO (the last lines shown) when set, else shown whole; the result recorded.
step() {
    local name=$1 lim=$2 t0=$SECONDS rc
    shift 2
    if [[ " $STEPS " != *" $name "* ]]; then
        record "$name" skipped 0 "not in STEPS"
        return
    elif [ "$lim" -lt "$MIN_S" ]; then
        echo "== $name: skipped, $(left) s left of TOTAL_S=$TOTAL_S"
        record "$name" skipped 0 "no time: $(left) s left of TOTAL_S=$TOTAL_S"
        return
    fi
    echo "== $name ($(date -u +%T), at most $lim s): $*"
    if [ -n "${TO:-}" ]; then
        timeout -s INT -k 15 "$lim" "$@" >"$TO" 2>&1
        rc=$?
        tail -n 25 "$TO"
    else
        timeout -s INT -k 15 "$lim" "$@"
        rc=$?
    fi
    if [ "$rc" = 0 ]; then
        record "$name" ok $((SECONDS - t0))
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        record "$name" "cut at $lim s" $((SECONDS - t0))
    else
        record "$name" "FAILED (rc $rc)" $((SECONDS - t0))
        FAILED=1
    fi
}

provenance() {
    echo "commit ${FUSEDROPE_GIT_COMMIT:-unknown}, tree dirty: ${FUSEDROPE_GIT_DIRTY:-unknown}, $(date -u +%FT%TZ)"
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
        || echo "nvidia-smi: not available"
    timeout 20 nvcc --version 2>/dev/null | tail -n 1 || echo "nvcc: not on PATH"
    echo "compute-sanitizer: ${SANITIZER:-not found}; ncu: ${NCU:-not found}"
    timeout 60 "$PY" -c '
import sys, torch
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
print("python", sys.version.split()[0], "| torch", torch.__version__, "CUDA", torch.version.cuda, "| triton",
      version("triton"), "| liger-kernel", version("liger-kernel"), "| GPU", gpu)'
}

NCU_PY='
import torch
from fusedrope import benchmark as B, cuda_ext
from fusedrope import empty_quant_outputs
from fusedrope.testing import QuantCase
cuda_ext.load()
op = torch.ops.fusedrope_cuda.inverse_rope_group_quant_out
(o, p, c, s, x, sc, _), = B.quant_sets(QuantCase(8192, 16, 2), 1, torch.device("cuda"))
col = empty_quant_outputs(o, 2, 128, True)[1]
for scales in (sc, col):
    for kernel in (0, 1):
        op(o, p, c, s, x, scales, 128, 0, 0, kernel)
torch.cuda.synchronize()
print("profiled: the generic and the head kernel, row-major then column-major scales")'

main() {
    export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "== gpu/run.sh: OUT=$OUT TOTAL_S=$TOTAL_S"
    if compgen -G ".whl/*.whl" >/dev/null; then  # the peers carried as wheels (gpu/run.sh --fetch-wheels)
        if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
                .whl/*.whl; then
            export PYTHONPATH="$PYTHONPATH:/tmp/site"
        else
            echo "wheel install failed: going on without the carried peers"
        fi
    fi
    provenance
    record env ok "$SECONDS"

    step build "$(limit "${BUILD_S:-240}" 200)" "$PY" -m fusedrope build
    export FUSEDROPE_NO_BUILD=1
    step gpu-tests "$(limit "${GPU_TESTS_S:-150}" 200)" "$PY" -m pytest -q -rfEs -p no:cacheprovider -m gpu \
        --junitxml "$OUT/pytest-gpu.xml" tests
    if [ -n "$SANITIZER" ]; then
        TO="$OUT/memcheck.txt" step memcheck "$(limit "${MEMCHECK_S:-100}" 130)" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
            "$SANITIZER" --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 30 \
            "$PY" -m pytest -q -rfE -p no:cacheprovider -m gpu -k "$MEMCHECK_K" "${GPU_TEST_FILES[@]}"
    else
        record memcheck skipped 0 "compute-sanitizer not found"
    fi
    local lim
    lim=$(limit "${BENCH_S:-210}" 100)
    # shellcheck disable=SC2086  # BENCH_ARGS, TESTS: several arguments
    step bench "$lim" "$PY" -m fusedrope bench --out "$OUT/bench" --no-plots \
        --budget-s $((lim > 80 ? lim - 40 : (lim + 1) / 2)) $BENCH_ARGS
    step overhead "$(limit "${OVERHEAD_S:-50}" 50)" "$PY" -m pytest -q -s -p no:cacheprovider bench/test_overhead.py \
        --benchmark-only --benchmark-columns=median,rounds
    # shellcheck disable=SC2086
    step tests "$(limit "${TESTS_S:-200}" 25)" "$PY" -m pytest -q -rfE -p no:cacheprovider -m "not gpu" \
        --junitxml "$OUT/pytest.xml" $TESTS
    if [ -n "$NCU" ]; then
        TO="$OUT/ncu.txt" step ncu "$(limit "${NCU_S:-45}" 0)" "$NCU" --clock-control none --kernel-name regex:irgq \
            --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
            --section WarpStateStats --section LaunchStats \
            --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum "$PY" -c "$NCU_PY"
    else
        record ncu skipped 0 "ncu not found"
    fi

    find "$OUT" -name '*.tmp' -delete  # a results file cut mid-write: not one more file to bring back
    echo "== done in $SECONDS s (commit ${FUSEDROPE_GIT_COMMIT:-unknown})"
    "$PY" - "$OUT" "${ROWS[@]}" <<'PY' || printf '%s\n' "${ROWS[@]}"
import json, re, sys
import xml.etree.ElementTree as ET
from pathlib import Path
out = Path(sys.argv[1])
def junit(name):
    try:
        root = ET.parse(out / name).getroot()
    except (OSError, ET.ParseError) as e:
        return f"no {name} ({type(e).__name__})"
    s = root if root.tag == "testsuite" else root.find("testsuite")
    n = {k: int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    return f"{passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped"
def tail_match(name, pattern):
    try:
        found = re.findall(pattern, (out / name).read_text(errors="replace"))
    except OSError:
        return f"no {name}"
    return found[-1] if found else "-"
bench = {}
try:
    bench = json.loads((out / "bench" / "results.json").read_text())
except (OSError, ValueError) as e:
    print(f"no bench results: {e}")
rows = bench.get("rows", [])
notes = {"gpu-tests": junit("pytest-gpu.xml"), "tests": junit("pytest.xml"),
         "memcheck": tail_match("memcheck.txt", r"ERROR SUMMARY: \d+ errors?") + "; "
                     + tail_match("memcheck.txt", r"\d+ (?:passed|failed)[^\n]*"),
         "ncu": tail_match("ncu.txt", r"profiled: [^\n]*|==ERR==[^\n]*"),
         "bench": ", ".join(f"{sum(r.get('status') == s for r in rows)} {s}" for s in ('ok', 'skipped', 'error'))
                  + (f"; copy {bench['copy']['tbps']:.2f} TB/s" if bench.get('copy') else '')}
print("\n| step | status | seconds | notes |\n|---|---|---|---|")
for line in sys.argv[2:]:
    name, status, seconds, note = line.split("|", 3)
    print(f"| {name} | {status} | {seconds} | {note or notes.get(name, '')} |")
files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
more = " (MORE THAN 8: some will not come back)" if len(files) > 8 else ""
print(f"\nfiles under OUT: {len(files)}{more}: " + " ".join(files))
if rows:
    from fusedrope.benchmark import report
    gpu = bool(bench["meta"].get("gpu"))
    for op in dict.fromkeys(r["op"] for r in rows):
        table = report.experiment_table(rows, op, gpu)
        if table:
            print(f"\n{op}, the CUDA launch experiments against the default launch:\n\n{table}")
        if op == "inverse_rope_group_quant":
            print(f"\n{op} (seed columns):\n\n" + report.quant_seed_tables([r for r in rows if r["op"] == op]))
PY
    return "$FAILED"
}

mkdir -p "$OUT/bench"
main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
