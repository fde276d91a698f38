#!/usr/bin/env bash
# A/B of a kernel change in one device call: `tessera bench` with devbin's libtessera.so against
# devbin_base's (the same build with the baseline's objects linked in: dev/stage_ab.sh), rounds
# interleaved (GPU clocks drift), one table per side and round in $OUT/ab.
#   AB_OPS="float8_quantize" AB_ARGS="--dtype bf16 --sizes 2048,4096,8192,14336" AB_ROUNDS=3 bash dev/ab_lib.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit
out="${OUT:-/tmp/out}/ab"
mkdir -p "$out"
for r in $(seq "${AB_ROUNDS:-3}"); do
  for side in base new; do
    lib=devbin; [ "$side" = base ] && lib=devbin_base
    LD_LIBRARY_PATH="$PWD/$lib" devbin/tessera bench ${AB_OPS:-float8_quantize} ${AB_ARGS:-} >"$out/$side-$r.txt" 2>&1
    echo "== $side round $r"; grep -E "^[a-z_0-9]+ +tessera " "$out/$side-$r.txt" | head -20
  done
done
