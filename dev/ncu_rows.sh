#!/usr/bin/env bash
# Nsight Compute metrics (duration, DRAM throughput, occupancy, main stall reasons) for every
# kernel of one run of each row-wise/dropout op given as "op dtype size" (size as `tessera
# profile` takes it: the row length N, or elements for dropout). Device run, devbin/ carried:
#   bash dev/ncu_rows.sh "layer_norm_backward bfloat16 1024" "softmax float32 256" ...
# Caches are flushed before every kernel (ncu's default), so durations are cold-HBM kernel times
# without launch overhead. Prints one line per kernel; raw CSVs packed into $OUT/ncu_rows.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/ncu_rows"
export LD_LIBRARY_PATH=$PWD/devbin
stall=smsp__average_warps_issue_stalled
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size
metrics+=,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,sm__inst_issued.avg.pct_of_peak_sustained_active
metrics+=,${stall}_long_scoreboard_per_issue_active.ratio,${stall}_barrier_per_issue_active.ratio
metrics+=,${stall}_lg_throttle_per_issue_active.ratio,${stall}_membar_per_issue_active.ratio
metrics+=,${stall}_drain_per_issue_active.ratio,${stall}_short_scoreboard_per_issue_active.ratio
i=0
for spec in "$@"; do
  set -- $spec
  i=$((i + 1))
  f="$OUT/ncu_rows/$i.csv"
  # `tessera profile` runs the op twice before its own (CUPTI) trace, which fails under ncu; those
  # two runs' kernels are the ones measured.
  ncu --clock-control none --csv --print-units base --metrics "$metrics" devbin/tessera profile "$1" --dtype "$2" \
      --size "$3" > "$f" 2>&1
  python3 - "$f" "$spec" <<'PY'
import csv, sys
path, spec = sys.argv[1], sys.argv[2]
lines = open(path).read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
if start is None:
    print(f"{spec}: no ncu rows ({lines[-1] if lines else 'empty'})"); sys.exit()
rows = list(csv.DictReader(lines[start:]))
by = {}
for r in rows:
    by.setdefault((r["ID"], r["Kernel Name"]), {})[r["Metric Name"]] = r["Metric Value"]
for (kid, name), m in sorted(by.items(), key=lambda kv: int(kv[0][0])):
    if "fill_uniform" in name: continue  # the case's input generation
    g = lambda k: m.get(k, "?").replace(",", "")
    st = lambda s: g(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio")
    us = float(g("gpu__time_duration.sum")) / 1e3 if g("gpu__time_duration.sum") != "?" else 0
    mb = (float(g("dram__bytes_read.sum")) + float(g("dram__bytes_write.sum"))) / 1e6
    print(f"{spec:<34} {name[:38]:<38} {us:8.2f}us {mb:8.1f}MB dram%={g('dram__throughput.avg.pct_of_peak_sustained_elapsed'):>5} "
          f"occ%={g('sm__warps_active.avg.pct_of_peak_sustained_active'):>5} issue%={g('sm__inst_issued.avg.pct_of_peak_sustained_active'):>5} grid={g('launch__grid_size')} blk={g('launch__block_size')} "
          f"reg={g('launch__registers_per_thread')} smem={g('launch__shared_mem_per_block_dynamic')} "
          f"stall lsb={st('long_scoreboard')} bar={st('barrier')} lgt={st('lg_throttle')} mbar={st('membar')} "
          f"drain={st('drain')} ssb={st('short_scoreboard')}")
PY
done
tar -C "$OUT" -czf "$OUT/ncu_rows.tgz" ncu_rows && rm -rf "$OUT/ncu_rows"
