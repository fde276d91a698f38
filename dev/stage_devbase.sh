#!/usr/bin/env bash
# Stages, on the workstation, the baseline of a two-build comparison on the device (host cost:
# dev/host_ab.py; GPU time: dev/device.sh ab --baseline devbase): another commit's libtessera and
# harness (sm_90a only), its tessera CLI and its Python package for the device's Python (3.12),
# packed into devbin-base/devbase.tar.xz (git-ignored; carry ["devbin-base"] beside devbin-pack
# and devwheel, within the 64 MiB carry). dev/device_surface.sh's step `base` unpacks it into
# devbase/ (the CLI and libraries) and /tmp/pkg-old/tessera (the package, with devbase's
# libraries beside it).
#   REF=main PY312=/work/venv312/bin/python3 bash dev/stage_devbase.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REF="${REF:-main}"
PY="${PY312:-/work/venv312/bin/python3}"
SRC=/tmp/devbase-src
BUILD="${BASE_BUILD_DIR:-/tmp/devbase-build}"
TORCH_DIR=$("$PY" -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])')
rm -rf "$SRC" && mkdir -p "$SRC"
git archive "$REF" | tar -x -C "$SRC"
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DTESSERA_BUILD_PYTHON=ON \
  "-DPython_EXECUTABLE=$PY" "-DTESSERA_TORCH_DIR=$TORCH_DIR" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target tessera tessera_harness tessera_cli _C tessera_torch _torch_fast
SUFFIX=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
STAGE=/tmp/devbase-stage
rm -rf "$STAGE" && mkdir -p "$STAGE/devbase" "$STAGE/pkg/tessera"
cp "$BUILD/src/libtessera.so" "$BUILD/harness/libtessera_harness.so" "$BUILD/tools/tessera" "$STAGE/devbase/"
cp "$BUILD/python/_C$SUFFIX" "$BUILD/python/_torch_fast$SUFFIX" "$BUILD/python/libtessera_torch.so" \
  "$SRC"/python/tessera/*.py "$SRC/python/tessera/py.typed" "$STAGE/pkg/tessera/"
for f in "$STAGE"/pkg/tessera/*.so; do cmake -DF="$f" -P dev/devwheel_rpath.cmake; done
git rev-parse --short "$REF" >"$STAGE/REF"
mkdir -p devbin-base
tar -cJf devbin-base/devbase.tar.xz -C "$STAGE" devbase pkg REF
du -sh devbin-base
