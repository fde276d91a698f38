#!/usr/bin/env bash
# The GEMM checks of one device call (issue 16's capability): C++ tests of matmul and the tuner,
# verify of matmul (and its tf32 variant) and scaled_mm, ahead-of-time tuning and the cache
# listing, `tessera bench` beside cuBLAS, and the SASS summary of the sm90 kernels. Expects
# devbin/ staged by scripts/stage_devbin.sh; logs under $OUT, a summary last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if [ ! -d devbin ] && [ -f devbin-pack/devbin.tar.xz ]; then  # packed: scripts/stage_devbin.sh
  python3 -c "import tarfile; tarfile.open('devbin-pack/devbin.tar.xz').extractall('.')"
fi
export LD_LIBRARY_PATH="$PWD/devbin"
export TESSERA_CACHE_DIR="$OUT/cache"
BIN=devbin/tessera
summary=()
step() {
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  summary+=("$(printf '%-8s rc=%-3s %4ss  %s' "$name" "$?" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)")")
}
step ctest devbin/tessera_tests --gtest_brief=1 \
  --gtest_filter="${CTEST_FILTER:-Matmul*:TuneCache*:Cli*:*VerifyGpu*/matmul*:*VerifyGpu*/scaled_mm}"
step verify $BIN verify matmul scaled_mm
step tune $BIN tune matmul --shapes "${TUNE_SHAPES:-4096x4096x4096,8192x8192x8192,128x4096x4096,16x14336x4096}"
step show $BIN tune --show
step bench $BIN bench matmul matmul_tf32 scaled_mm --sizes "${BENCH_SIZES:-4096,8192}" --no-peaks
step sass python3 scripts/gemm_sass.py devbin/libtessera.so
for s in "${summary[@]}"; do echo "$s"; done
