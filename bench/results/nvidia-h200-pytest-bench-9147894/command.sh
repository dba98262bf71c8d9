# The device call that wrote this folder: the same warm H200 machine right after the call of
# nvidia-h200-gpu-checks-9147894/ (whose pytest part its time limit cut), 2026-12-04 18:06-18:08 UTC, 81 s;
# carry: [".whl"]. Without compile, eager and reference, to fit; the Liger wheel installed into /tmp/site.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 FUSEDROPE_GIT_COMMIT=9147894fe8a13d2f6f597594f8619d49a95bf0b6 FUSEDROPE_GIT_DIRTY=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; export PYTHONPATH=$PWD:/tmp/site
mkdir -p $OUT/pytest-bench
timeout -k 10 200 python3 -m pytest bench/ --benchmark-only -q -p no:cacheprovider -rs \
    -k "(qwen3_tts-B1 or wide_heads-B32 or S1-H16 or S8192-H16-G2-D512-R64-g128) and not compile and not reference and not eager or test_overhead" \
    --benchmark-json $OUT/pytest-bench/bench.json --benchmark-columns=min,median,max,rounds,iterations 2>&1 | tee $OUT/pytest-bench/pytest.txt
# then every round's raw time was dropped from bench.json (its statistics kept), as gpu/session.sh does
