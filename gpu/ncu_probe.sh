#!/usr/bin/env bash
# gpu/ncu_probe.sh OUT_FILE: Nsight Compute on gpu/ncu_probe.py's five kernels (a copy; op 2 with 1 and 2 chunks
# per thread and with tail warps; op 1), one launch each: speed of light, memory workload, occupancy, warp stall
# reasons, launch and scheduler statistics, DRAM bytes. --clock-control none leaves the GPU's clocks as they run
# (the device tool's METHOD.md). Needs the CUDA extension built (cuda_ext.load()); on a runtime where ncu cannot
# read the counters it says so in OUT_FILE and exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu/ncu_probe.sh OUT_FILE}"
NCU="${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)}"
if [ -z "$NCU" ]; then echo "ncu not found" | tee "$out"; exit 3; fi
"$NCU" --version | tee "$out"
"$NCU" --profile-from-start off --clock-control none --nvtx \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
    --section LaunchStats --section SchedulerStats \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,smsp__inst_executed.sum \
    "${PYTHON:-python3}" gpu/ncu_probe.py >>"$out" 2>&1
rc=$?
tail -3 "$out"
exit $rc
