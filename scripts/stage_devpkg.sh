#!/usr/bin/env bash
# Stages, on the workstation, what the device's Python package needs beyond devbin's libraries:
# the nanobind extension built for the device's Python (3.12, from pyenv here) and the torch ops
# built against the torch of that Python (pip install torch --no-deps: headers and libraries to
# link with), into devwheel/pkg (git-ignored; carry ["devwheel"]). scripts/devwheel.sh installs it.
#   PY312=/path/to/python3.12 BUILD_DIR=build-main bash scripts/stage_devpkg.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build-main}"
PY="${PY312:-/work/venv312/bin/python3}"
# torch's package directory without importing it (its CUDA libraries are not installed here).
TORCH_DIR=$("$PY" -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])')
# Another Python's cached findings (a wheel build in the same directory, scripts/test.sh) go first.
cmake -S . -B "$BUILD" -U 'Python_*' -U '_Python_*' -U 'Python3_*' -UCMAKE_MODULE_PATH -DTESSERA_BUILD_PYTHON=ON \
      "-DPython_EXECUTABLE=$PY" "-DTESSERA_TORCH_DIR=$TORCH_DIR" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target _C tessera_torch _torch_fast
rm -rf devwheel && mkdir -p devwheel/pkg
cp "$BUILD"/python/_C*.so "$BUILD"/python/_torch_fast*.so "$BUILD"/python/libtessera_torch.so devwheel/pkg/
for f in devwheel/pkg/*.so; do cmake -DF="$f" -P scripts/devwheel_rpath.cmake; done
du -sh devwheel
