#!/usr/bin/env bash
# Nsight Compute sections (speed of light, occupancy, warp states, launch) for one launch of the
# softmax row kernel at the bench shapes that were furthest from the copy rate. Device run, with
# devbin/ carried:  bash scripts/ncu_softmax.sh   (reports packed into $OUT/ncu.tgz)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/devbin
for spec in "float32 16384" "float32 32768" "float32 262144" "bfloat16 4096"; do
  set -- $spec
  ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section LaunchStats -k regex:rows_kernel -c 1 devbin/tessera profile softmax --dtype "$1" \
      --size "$2" > "$OUT/ncu_$1_$2.txt" 2>&1
done
tar -C "$OUT" -czf "$OUT/ncu.tgz" $(cd "$OUT" && ls ncu_*.txt) && rm "$OUT"/ncu_*.txt
