#!/usr/bin/env bash
# Device run: install tessera in seconds instead of minutes. Either a package staged on the
# workstation (devwheel/pkg, dev/stage_devpkg.sh: the extension and the torch ops, with the
# caller laying devbin's libraries over it), or a wheel carried in devwheel/ (one that an earlier
# call built and sent back through $OUT) with the working tree's Python files laid over it.
#   device: bash dev/devwheel.sh            (carry ["devwheel"])
# With neither, builds a wheel for sm_90a (several minutes), installs it and leaves it in $OUT to
# be copied into devwheel/ for the next call. Staged libraries must come from the same sources as
# the workstation's build (src/, include/).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
# A package staged on the workstation (dev/stage_devpkg.sh: the extension for the device's
# Python and the torch ops), completed by the caller with devbin's libraries: no build here.
if [ -d devwheel/pkg ]; then
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -rf "$site/tessera" && mkdir -p "$site/tessera" || exit
  cp devwheel/pkg/* python/tessera/*.py python/tessera/py.typed "$site/tessera/" || exit
  echo "tessera staged from devwheel/pkg at $site/tessera"
  exit 0
fi
whl=$(ls devwheel/tessera-*.whl 2>/dev/null | head -1)
if [ -z "$whl" ]; then
  TESSERA_CUDA_ARCHITECTURES=90a python3 -m pip wheel --no-build-isolation --no-deps -q -w "$OUT" . || exit
  whl=$(ls "$OUT"/tessera-*.whl | head -1)
fi
python3 -m pip install --no-deps --force-reinstall -q "$whl" || exit
pkg=$(cd /tmp && python3 -c "import importlib.util as u; print(u.find_spec('tessera').submodule_search_locations[0])")
cp python/tessera/*.py "$pkg"/
echo "tessera installed from $whl at $pkg"
