#!/usr/bin/env bash
# GPU check for CUDA:N devices: the CUDA test suite on the real driver (the fake-driver
# tests run too), then the CUDA benchmark (a 1000-kernel graph through actorgraph vs a
# raw CUDA graph launch vs plain launches, and a 2-queue copy/compute overlap timing).
# Takes well under 5 minutes on one H200.
#
# Wheels: the GPU machine has python3 with torch, numpy, attrs, pytest, hypothesis,
# msgpack and cuda-python, but not trio, outcome, sniffio or pytest-trio. They (and what
# trio needs, so the set is complete on any Python 3.12) travel as
# wheels in .whl/ (ignored by git) and are installed into /tmp/site there:
#   bash scripts/gpu_check.sh wheels    # where pip reaches PyPI: downloads them into .whl/
#   bash scripts/gpu_check.sh           # on the GPU machine (carry .whl along)
# Results are printed and written to $OUT (when set) or benchmarks/results/.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "wheels" ]; then
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        -d .whl trio==0.35.0 outcome==1.3.0.post0 sniffio==1.3.1 pytest-trio==0.8.0 \
        sortedcontainers==2.4.0 attrs==26.1.0 idna==3.11
    exit 0
fi

if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit
    export PYTHONPATH="/tmp/site:$PWD"
else
    echo "no .whl/ folder: assuming trio and pytest-trio are installed" >&2
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
RESULTS="${OUT:-benchmarks/results}"
mkdir -p "$RESULTS"

nvidia-smi -L || true
python3 -c "import sys, trio, numpy; from cuda.bindings import driver; print(sys.version.split()[0], 'trio', trio.__version__, 'numpy', numpy.__version__)"

status=0
# -p no:cacheprovider: the working tree may be read-only; -rs lists what was skipped.
timeout 180 python3 -m pytest -q -rs -p no:cacheprovider \
    tests/test_cuda_driver.py tests/test_cuda_fake.py tests/test_cuda_real.py 2>&1 | tee "$RESULTS/gpu_tests.txt" || status=1

timeout 100 python3 benchmarks/cuda_replay.py --driver real --json "$RESULTS/cuda.json" 2>&1 \
    | tee "$RESULTS/cuda_bench.txt" || status=1
exit $status
