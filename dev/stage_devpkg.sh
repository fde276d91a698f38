#!/usr/bin/env bash
# Stages, on the workstation, what the device's Python package needs beyond devbin's libraries:
# the nanobind extension built for the device's Python (3.12, from pyenv here) and the torch ops
# built against the torch of that Python (pip install torch --no-deps: headers and libraries to
# link with), into devwheel/pkg (git-ignored; carry ["devwheel"]). dev/devwheel.sh installs it.
#   PY312=/path/to/python3.12 BUILD_DIR=build-main bash dev/stage_devpkg.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build-main}"
PY="${PY312:-/work/venv312/bin/python3}"
# torch's package directory without importing it (its CUDA libraries are not installed here).
TORCH_DIR=$("$PY" -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])')
# Another Python's cached findings (a wheel build in the same directory, scripts/test.sh) go first:
# out of the cache file, since a configure run to drop them would find a Python of its own again.
if [ -f "$BUILD/CMakeCache.txt" ]; then
  python3 - "$BUILD/CMakeCache.txt" <<'PYEOF'
import re, sys
lines, out, notes = open(sys.argv[1]).read().splitlines(), [], []
for line in lines:  # an entry goes with the // comment lines just above it
    if line.startswith("//"):
        notes.append(line)
        continue
    if not re.match(r"_?Python3?_|PYTHON_|SKBUILD|NB_|nanobind_|CMAKE_MODULE_PATH|CMAKE_PREFIX_PATH|FIND_PACKAGE_MESSAGE_DETAILS_Python", line):
        out += notes + [line]
    notes = []
open(sys.argv[1], "w").write("\n".join(out + notes) + "\n")
PYEOF
fi
cmake -S . -B "$BUILD" -DTESSERA_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$PY" "-DTESSERA_TORCH_DIR=$TORCH_DIR" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target _C tessera_torch _torch_fast
SUFFIX=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
rm -rf devwheel && mkdir -p devwheel/pkg
cp "$BUILD/python/_C$SUFFIX" "$BUILD/python/_torch_fast$SUFFIX" "$BUILD"/python/libtessera_torch.so devwheel/pkg/
for f in devwheel/pkg/*.so; do cmake -DF="$f" -P dev/devwheel_rpath.cmake; done
du -sh devwheel
