#!/usr/bin/env bash
# Builds the C++ targets on the workstation (no GPU needed) and stages the binaries the device run
# uses in devbin/ (git-ignored; carried to the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=${TESSERA_CUDA_ARCHITECTURES:-80;90a}" >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
rm -rf devbin && mkdir -p devbin
# libtessera.so alone: a Python-on configure leaves a stale libtessera.so.0.1.0 beside it
cp "$BUILD"/src/libtessera.so "$BUILD"/harness/libtessera_harness.so devbin/
# The binaries may name the libraries by soname (a versioned build): those names point at the
# fresh copies.
for lib in libtessera libtessera_harness; do ln -sf "$lib.so" "devbin/$lib.so.0"; done
cp "$BUILD"/tests/cpp/tessera_tests devbin/
cp "$BUILD"/tools/tessera devbin/ 2>/dev/null || true
du -sh devbin
# The device call carries at most 64 MiB: the staged binaries also go packed (xz; the device has
# Python's tarfile, not zstd), for `carry: ["devbin-pack"]`; dev/device.sh and
# dev/device_gemm.sh unpack it where devbin/ is missing.
mkdir -p devbin-pack
tar -cJf devbin-pack/devbin.tar.xz devbin
# The code the binaries are built from, for the reports' run line: the device's copy of the tree
# does not carry an up-to-date git HEAD. "-dirty": tracked files differed from that commit.
code=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- src include python tools harness || code="$code-dirty"
echo "$code" > devbin-pack/CODE
du -sh devbin-pack; echo "code $code"
