#!/usr/bin/env bash
# Download the pure-Python peers the GPU checks compare against, as wheels for the H200 machine (Python 3.12,
# no network there). Run here, in the repository; the wheels land in .whl/ (git-ignored) and travel with a
# device call that names `.whl` in `carry`. Install them there first, e.g.
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# Only Liger-Kernel for now: its rope needs torch and triton, which the machine has (--no-deps on purpose).
set -euo pipefail
cd "$(dirname "$0")/.."
LIGER_VERSION="${LIGER_VERSION:-0.8.5}"
PY="${PYTHON:-python3}"
exclude="$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)"
grep -qxF '/.whl/' .gitignore 2>/dev/null || grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
mkdir -p .whl
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "liger-kernel==${LIGER_VERSION}"
ls -la .whl
