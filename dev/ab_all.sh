#!/usr/bin/env bash
# Device run: `tessera bench` of every op, a baseline build against the new one in one run, the
# sides alternated round by round; each op group with the dtypes it takes (an explicit --dtype an
# op lacks is an error), then scripts/compare_bench.py per group.
#   device: bash dev/ab_all.sh BASELINE_DIR [NEW_DIR]   (each a devbin: libtessera.so,
#           libtessera_harness.so, tessera; AB_ROUNDS (default 2), AB_ARGS: extra bench arguments)
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
old=$(cd "$1" && pwd) new=$(cd "${2:-devbin}" && pwd)
float_ops="add gelu gelu_backward silu silu_backward silu_mul silu_mul_backward dropout dropout_backward copy
  softmax log_softmax softmax_backward log_softmax_backward layer_norm layer_norm_backward rms_norm
  rms_norm_backward matmul attention attention_causal attention_backward cross_entropy linear_cross_entropy"
groups=("bfloat16,float32|$float_ops" "float32|matmul_tf32" "float8_e4m3fn|scaled_mm" "int32|isin")
rc=0
for g in "${groups[@]}"; do
  dtypes=${g%%|*} ops=${g#*|} name=${dtypes%%,*}
  for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"
    for side in $order; do
      dir=$old; [ "$side" = new ] && dir=$new
      # shellcheck disable=SC2086 # ops and extra arguments split into words
      env LD_LIBRARY_PATH="$dir" "$dir/tessera" bench $ops --dtype "$dtypes" --no-peaks ${AB_ARGS:-} \
        --out "$OUT/ab/$name/$side$r" >"$OUT/ab_${name}_$side$r.log" 2>&1 || { rc=1; tail -3 "$OUT/ab_${name}_$side$r.log"; }
      find "$OUT/ab/$name/$side$r" -type f ! -name bench.json -delete 2>/dev/null
    done
  done
  echo "================ $dtypes: $(echo $ops | wc -w) ops"
  python3 scripts/compare_bench.py --old "$OUT"/ab/"$name"/old*/bench.json --new "$OUT"/ab/"$name"/new*/bench.json || rc=1
done
exit $rc
