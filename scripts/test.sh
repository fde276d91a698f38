#!/usr/bin/env bash
# The test command: builds everything, runs the C++ tests (GPU tests skip without a GPU, saying
# why), checks that a consumer project builds against the installed CMake package, installs the
# Python package into a fresh virtual environment and runs the Python tests.
#   bash scripts/test.sh            # from the repository root
# Environment: TESSERA_CUDA_ARCHITECTURES (default "80;90a"), BUILD_DIR (default build),
#              JOBS (default: all cores), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHS="${TESSERA_CUDA_ARCHITECTURES:-80;90a}"
BUILD="${BUILD_DIR:-build}"
case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac  # absolute: later steps change directory
JOBS="${JOBS:-$(nproc)}"
PY="${PYTHON:-python3}"
export PATH="/usr/local/cuda/bin:$PATH"

echo "== C++ build ($ARCHS)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" >/dev/null
cmake --build "$BUILD" -j "$JOBS"

echo "== C++ tests"
ctest --test-dir "$BUILD" --output-on-failure -j 1

echo "== installed package: a consumer project"
cmake --install "$BUILD" --prefix "$BUILD/install" >/dev/null
cmake -S tests/consumer -B "$BUILD/consumer" -DCMAKE_PREFIX_PATH="$BUILD/install" >/dev/null
cmake --build "$BUILD/consumer" -j "$JOBS" >/dev/null
"$BUILD/consumer/consumer"
"$BUILD/install/bin/tessera" --help >/dev/null

echo "== Python package"
if [ ! -x "$BUILD/venv/bin/python" ]; then
  "$PY" -m venv "$BUILD/venv"
fi
"$BUILD/venv/bin/python" -m pip install -q --upgrade pip
"$BUILD/venv/bin/python" -m pip install -q scikit-build-core nanobind pytest numpy
TESSERA_CUDA_ARCHITECTURES="$ARCHS" "$BUILD/venv/bin/python" -m pip install -q --no-build-isolation .
echo "== Python tests"
PATH="$BUILD/venv/bin:$PATH" "$BUILD/venv/bin/python" -m pytest tests/python -q -rs
