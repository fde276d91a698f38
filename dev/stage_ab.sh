#!/usr/bin/env bash
# devbin_base/libtessera.so for dev/ab_lib.sh: the build's link line with the objects named in
# AB_OBJECTS (build-relative object = saved baseline object, space-separated) swapped in.
#   AB_OBJECTS="ops/matrix/float8_quantize.cu.o=/tmp/fq_base.o" bash dev/stage_ab.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build}"
link=$(cat "$BUILD/src/CMakeFiles/tessera.dir/link.txt")
for pair in ${AB_OBJECTS:?}; do
  link=${link//CMakeFiles\/tessera.dir\/${pair%%=*}/${pair#*=}}
done
link=$(sed -E "s#-o [^ ]+#-o $PWD/devbin_base/libtessera.so#" <<<"$link")  # the build's own output untouched
rm -rf devbin_base && mkdir -p devbin_base
(cd "$BUILD/src" && eval "$link")
ln -sf libtessera.so devbin_base/libtessera.so.0
cp devbin/libtessera_harness.so devbin_base/ && ln -sf libtessera_harness.so devbin_base/libtessera_harness.so.0
mkdir -p devbin-pack && tar -cJf devbin-pack/devbin_base.tar.xz devbin_base
du -sh devbin-pack/devbin_base.tar.xz
