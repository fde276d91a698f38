#!/usr/bin/env bash
# Device run: install tessera in seconds instead of minutes. With a wheel carried in devwheel/ (one
# that an earlier call built and sent back through $OUT), installs it, then lays over it the
# working tree's Python files and, where present, devwheel/libtessera_torch.so (the torch ops,
# built on the workstation, where torch's headers and libraries match the device's torch):
#   here:   cmake --build build-main --target tessera_torch && cp build-main/python/libtessera_torch.so devwheel/
#           && cmake -P scripts/devwheel_rpath.cmake
#   device: bash scripts/devwheel.sh            (carry ["devwheel"])
# Without a wheel, builds one for sm_90a (several minutes), installs it and leaves it in $OUT to
# be copied into devwheel/ for the next call. The wheel's libraries must come from the same
# sources as the workstation's build (src/, include/): the overlay replaces no C++ library.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
whl=$(ls devwheel/tessera-*.whl 2>/dev/null | head -1)
if [ -z "$whl" ]; then
  TESSERA_CUDA_ARCHITECTURES=90a python3 -m pip wheel --no-build-isolation --no-deps -q -w "$OUT" . || exit
  whl=$(ls "$OUT"/tessera-*.whl | head -1)
fi
python3 -m pip install --no-deps --force-reinstall -q "$whl" || exit
pkg=$(cd /tmp && python3 -c "import importlib.util as u; print(u.find_spec('tessera').submodule_search_locations[0])")
cp python/tessera/*.py "$pkg"/
if [ -f devwheel/libtessera_torch.so ] && [ -n "$(ls devwheel/tessera-*.whl 2>/dev/null)" ]; then
  cp devwheel/libtessera_torch.so "$pkg"/
fi
echo "tessera installed from $whl at $pkg"
