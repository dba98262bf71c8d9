#!/usr/bin/env bash
# gpu/run_all.sh: both ops' GPU checks in ONE device call on a lent H200 (gpu/README.md gives the `run` call).
#
#   1. installs the wheels carried in .whl/ (gpu/fetch_wheels.sh: Liger-Kernel) with pip --target /tmp/site;
#   2. builds the CUDA extension once (TORCH_CUDA_ARCH_LIST=9.0); both scripts then load that build (if it
#      failed, they run with FUSEDROPE_NO_BUILD=1: the Triton checks and timings, no second try at the build);
#   3. gpu/check_qwen3_tts_rope.py, then gpu/check_inverse_rope_group_quant.py, each with its own --budget-s
#      taken from what is left of TOTAL_S (default 520 s) and a hard `timeout` a little above it;
#   4. prints a short combined table last (gpu/summarize.py).
#
# Files under $OUT (the device tool brings back 8 at most, 2 folders down; summarize.py counts them):
#   log.txt  tts/results.json tts/bench.csv tts/bench.md tts/sanitizer.log
#            quant/results.json quant/bench.csv quant/bench.md
# Exit status: 0 only if the build and both scripts passed and no more than 8 files are under $OUT.
#
# Knobs (environment): TOTAL_S, QUANT_S (seconds kept for the op-2 script, default 150), BUILD_TIMEOUT_S (200),
# TTS_ARGS / QUANT_ARGS (extra arguments, e.g. TTS_ARGS="--no-compile"), PYTHON (python3), FUSEDROPE_GIT_COMMIT
# (the commit to record; default `git rev-parse HEAD`, which a copy of the tree without .git cannot answer),
# FUSEDROPE_GIT_DIRTY (0 / 1: whether that tree had uncommitted changes; recorded as unknown without it).
# `gpu/run_all.sh --cpu-selftest` runs the same pipeline with the scripts' CPU modes (no GPU, no build).
# `gpu/run_all.sh --smoke`: a minute or two, a first call that finds what would break the full
# run (the build, both ops' correctness and graph checks, two op-1 bench cases, op 2's bench until its budget
# ends) while leaving the lease time for the full run (gpu/README.md); knobs set in the environment still win.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
PY="${PYTHON:-python3}"
SELFTEST=0
SMOKE=0
for arg in "$@"; do
    case "$arg" in
        --cpu-selftest) SELFTEST=1 ;;
        --smoke) SMOKE=1 ;;
        *) echo "gpu/run_all.sh: unknown argument '$arg' (expected --cpu-selftest and/or --smoke)" >&2; exit 2 ;;
    esac
done
if [ "$SMOKE" = 1 ]; then
    TOTAL_S="${TOTAL_S:-120}"
    QUANT_S="${QUANT_S:-45}"
    TTS_ARGS="${TTS_ARGS:---no-compile --cases qwen3_tts-B1,wide_heads-B32 --skip sanitize,sweep}"
    QUANT_ARGS="${QUANT_ARGS:---skip-sanitize}"
fi
TOTAL_S="${TOTAL_S:-520}"
QUANT_S="${QUANT_S:-150}"
mkdir -p "$OUT/tts" "$OUT/quant"

clamp() { local v=$1; [ "$v" -lt "$2" ] && v=$2; [ "$v" -gt "$3" ] && v=$3; echo "$v"; }

main() {
    export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
    local path="$PWD"
    if compgen -G ".whl/*.whl" >/dev/null && [ "$SELFTEST" = 0 ]; then
        if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target /tmp/site .whl/*.whl; then
            path="$PWD:/tmp/site"
            echo "installed: $(cd .whl && ls -- *.whl | tr '\n' ' ')"
        else
            echo "wheel install failed: going on without the carried peers"
        fi
    fi
    export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
    # The device machine's copy of the tree has no .git: pass FUSEDROPE_GIT_COMMIT=<sha> for the results' provenance
    FUSEDROPE_GIT_COMMIT="${FUSEDROPE_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"
    export FUSEDROPE_GIT_COMMIT
    echo "== gpu/run_all.sh$([ "$SMOKE" = 1 ] && echo " --smoke"): commit ${FUSEDROPE_GIT_COMMIT:-unknown}, OUT=$OUT," \
         "TOTAL_S=$TOTAL_S, TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader 2>/dev/null

    local build_rc=0 tts_rc quant_rc left budget
    if [ "$SELFTEST" = 1 ]; then
        build_rc="skipped (cpu self-test)"
        # shellcheck disable=SC2086
        "$PY" gpu/check_qwen3_tts_rope.py --fake --out "$OUT/tts" ${TTS_ARGS:-}
        tts_rc=$?
        # shellcheck disable=SC2086
        "$PY" gpu/check_inverse_rope_group_quant.py --cpu-selftest --out "$OUT/quant" ${QUANT_ARGS:-}
        quant_rc=$?
    else
        echo "== build the CUDA extension once ($(date -u +%T))"
        # SIGINT, not TERM: Python unwinds, so torch's build lock is released (a lock left behind would make
        # both scripts wait on it until their hard timeouts); the lock removal below covers a harder kill.
        timeout -s INT -k 15 "${BUILD_TIMEOUT_S:-200}" "$PY" -c \
            'from fusedrope import cuda_ext; print("built", cuda_ext.build(verbose=False))'
        build_rc=$?
        if [ "$build_rc" != 0 ]; then
            "$PY" -c 'from fusedrope import cuda_ext; print(cuda_ext.build_root())' 2>/dev/null \
                | xargs -r -I{} find {} -maxdepth 2 -name lock -print -delete
            # the scripts check and time Triton without compiling again (a retry would eat their budgets)
            export FUSEDROPE_NO_BUILD=1
            echo "== build failed (rc $build_rc): FUSEDROPE_NO_BUILD=1 for both scripts"
        fi

        left=$((TOTAL_S - SECONDS))
        budget=$(clamp $((left - QUANT_S - 20)) 60 290)  # op 1: 18 cases x 6 contenders, compile included
        echo "== qwen3_tts_rope: --budget-s $budget (${left} s left of $TOTAL_S)"
        # shellcheck disable=SC2086
        timeout -k 10 $((budget + 40)) "$PY" gpu/check_qwen3_tts_rope.py --out "$OUT/tts" --budget-s "$budget" \
            ${TTS_ARGS:-}
        tts_rc=$?

        left=$((TOTAL_S - SECONDS))
        budget=$(clamp $((left - 15)) 45 240)
        echo "== inverse_rope_group_quant: --budget-s $budget (${left} s left of $TOTAL_S)"
        # shellcheck disable=SC2086
        timeout -k 10 $((budget + 30)) "$PY" gpu/check_inverse_rope_group_quant.py --out "$OUT/quant" \
            --budget-s "$budget" ${QUANT_ARGS:-}
        quant_rc=$?
    fi
    echo "== done in ${SECONDS} s"
    find "$OUT" -name '*.tmp' -delete  # a results file cut mid-write (bench_report.write_json): not a 9th file
    "$PY" gpu/summarize.py "$OUT" --build-rc "$build_rc" --tts-rc "$tts_rc" --quant-rc "$quant_rc"
    local files_rc=$?
    [ "$build_rc" = 0 ] || [ "$SELFTEST" = 1 ] || return 1
    [ "$tts_rc" = 0 ] && [ "$quant_rc" = 0 ] && [ "$files_rc" = 0 ]
}

main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
