#!/usr/bin/env bash
# gpu/session.sh: everything a lent H200 session owes, in ONE device call (gpu/README.md gives the `run` call):
#
#   1. gpu/run_all.sh (build, both ops' checks, their benchmarks and the op-2 small-S sweep), TOTAL_S=$CHECKS_S;
#   2. `python -m fusedrope bench --quick --budget-s $CLI_S` (the CLI, bench/results/README.md);
#   3. `pytest bench/ --benchmark-only` on a few seed cases (-k $PYTEST_K), with --benchmark-json.
#
# The device tool brings back 8 files at most, and run_all.sh alone writes 8, so each part's folder comes back
# as one archive: $OUT/checks.tgz (unpacks to gpu-checks/), $OUT/cli.tgz (nvidia-h200-quick-<commit>/),
# $OUT/pytest_bench.tgz (pytest-bench/), beside $OUT/log.txt (everything printed); each archive is written as
# soon as its part ends, so a call cut later keeps it. Exit status: 0 only if all three parts did.
# Time: SESSION_S (default 520) bounds the whole; run_all.sh gets CHECKS_S (default 280) as its TOTAL_S, the CLI
# a --budget-s of at most CLI_S (150) with a hard timeout 60 s above it, pytest at most PYTEST_S (120); each
# takes less when less is left, keeping PYTEST_S for pytest. Other knobs: PYTEST_K, RUN_ALL_ARGS (passed to
# run_all.sh: `RUN_ALL_ARGS=--cpu-selftest PYTHON=.venv/bin/python bash gpu/session.sh` tries the plumbing on a
# CPU, where the CLI runs its CPU matrix and pytest its CPU contenders), and those of run_all.sh;
# FUSEDROPE_GIT_COMMIT / FUSEDROPE_GIT_DIRTY as for run_all.sh (read here, passed in the command).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
mkdir -p "$OUT"
# Without compile, eager and reference: with them (torch.compile of each case) pytest did not finish in 120 s on
# the H200 at 9147894; without them it took 71 s there (bench/results/nvidia-h200-pytest-bench-9147894/).
PYTEST_K="${PYTEST_K:-(qwen3_tts-B1 or wide_heads-B32 or S1-H16 or S8192-H16-G2-D512-R64-g128) and not compile and not reference and not eager or test_overhead}"
SESSION_S="${SESSION_S:-520}"
PYTEST_S="${PYTEST_S:-120}"
left() { echo $((SESSION_S - SECONDS)); }
pack() { tar -C "$WORK" -czf "$OUT/$1" --exclude='*.tmp' "$2" && echo "packed $OUT/$1"; }

main() {
    local commit="${FUSEDROPE_GIT_COMMIT:-unknown}" checks_rc cli_rc pytest_rc
    echo "== gpu/session.sh: commit $commit, $(date -u +%FT%TZ)"
    # shellcheck disable=SC2086
    OUT="$WORK/gpu-checks" TOTAL_S="${CHECKS_S:-280}" bash gpu/run_all.sh ${RUN_ALL_ARGS:-}
    checks_rc=$?
    pack checks.tgz gpu-checks

    # run_all.sh installed the carried wheels into /tmp/site and built the extension: both are reused here
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    [ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
    export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
    local cli_s=$(( $(left) - PYTEST_S - 60 ))
    [ "$cli_s" -gt "${CLI_S:-150}" ] && cli_s="${CLI_S:-150}"
    if [ "$cli_s" -ge 30 ]; then
        echo "== python -m fusedrope bench --quick --budget-s $cli_s ($(date -u +%T))"
        timeout -k 10 $((cli_s + 60)) "$PY" -m fusedrope bench --quick --budget-s "$cli_s" \
            --out "$WORK/nvidia-h200-quick-${commit:0:7}"
        cli_rc=$?
        pack cli.tgz "nvidia-h200-quick-${commit:0:7}"
    else
        cli_rc="skipped: $(left) s left"
    fi

    local pytest_s=$(left)
    [ "$pytest_s" -gt "$PYTEST_S" ] && pytest_s="$PYTEST_S"
    if [ "$pytest_s" -ge 20 ]; then
        echo "== pytest bench/ --benchmark-only -k '$PYTEST_K' ($(date -u +%T), at most $pytest_s s)"
        mkdir -p "$WORK/pytest-bench"
        timeout -k 10 "$pytest_s" "$PY" -m pytest bench/ --benchmark-only -q -p no:cacheprovider -rs \
            -k "$PYTEST_K" --benchmark-json "$WORK/pytest-bench/bench.json" \
            --benchmark-columns=min,median,max,rounds,iterations 2>&1 | tee "$WORK/pytest-bench/pytest.txt"
        pytest_rc=${PIPESTATUS[0]}
        # every round's time is in the JSON too (tens of MB for the host-overhead tests): keep the statistics
        "$PY" - "$WORK/pytest-bench/bench.json" <<'PY'
import json, sys
p = sys.argv[1]
try:
    d = json.load(open(p))
except (OSError, ValueError) as e:
    sys.exit(f"no pytest-benchmark JSON to trim: {e}")
for b in d.get("benchmarks", []):
    b.get("stats", {}).pop("data", None)
json.dump(d, open(p, "w"), indent=1)
PY
        pack pytest_bench.tgz pytest-bench
    else
        pytest_rc="skipped: $pytest_s s left"
    fi
    echo "== done in ${SECONDS} s: run_all.sh rc $checks_rc, bench CLI rc $cli_rc, pytest bench rc $pytest_rc"
    [ "$checks_rc" = 0 ] && [ "$cli_rc" = 0 ] && [ "$pytest_rc" = 0 ]
}

main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
