#!/usr/bin/env bash
# A/B of examples/llama_train.py: old package (devbin-base) vs new, alternated; profiles last.
set -uo pipefail
export PYTHONPATH=/tmp/site
OUT=${OUT:-/tmp/out}
OUT=/tmp/o1 bash dev/device_surface.sh install base | tail -3
for r in 1 2 3; do for v in old new; do
  LD_LIBRARY_PATH=/tmp/pkg-$v/tessera PYTHONPATH=/tmp/pkg-$v:/tmp/site timeout 100 python3 examples/llama_train.py --steps 60 --modes torch,enable --no-compile --out $OUT/$v$r > $OUT/$v$r.log 2>&1
  echo "$v$r: $(grep -E '^(torch|enable) ' $OUT/$v$r.log | tr -s ' ' | tr '\n' ';')"
done; done
for v in old new; do
  LD_LIBRARY_PATH=/tmp/pkg-$v/tessera PYTHONPATH=/tmp/pkg-$v:/tmp/site timeout 120 python3 examples/llama_train.py --steps 20 --modes enable --no-compile --profile --out $OUT/prof-$v > $OUT/prof-$v.log 2>&1
  grep -A25 "GPU time per step" $OUT/prof-$v/report.md | head -28
done
tar czf /tmp/l.tgz -C $OUT . && find $OUT -mindepth 1 -delete && mv /tmp/l.tgz $OUT/logs.tgz
