#!/usr/bin/env bash
# After device_select.sh's install (run as its `cmd` step): the GPU tests of what changed
# (TESTS, pytest files; TESTS_K, their -k), `tessera verify` of VERIFY's ops, the perf reports REPORTS
# (scripts/perf_reports.py --run into $OUT/reports, REPORT_LIMIT seconds each), and ncu of the
# grouped GEMM beside torch's (NCU_GROUPED: families of dev/ncu_grouped.py) into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
[ -n "${TESTS:-}" ] && python3 -m pytest -q $TESTS ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tail -n 15
[ -n "${VERIFY:-}" ] && "$TESSERA" verify $VERIFY 2>&1 | grep -E "^FAIL|passed|failed" | tail -n 15
for r in ${REPORTS:-}; do
  python3 scripts/perf_reports.py --run "$OUT/reports" "$r" --code "${CODE:-unknown}" --timeout "${REPORT_LIMIT:-300}"
  tail -n 25 "$OUT/reports/$r/log.txt" | cut -c1-200
done
for f in ${NCU_GROUPED:-}; do
  timeout 150 ncu -k "regex:gemm_sm90|device_kernel|cutlass|xmma" -c 4 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    python3 dev/ncu_grouped.py "$f" >"$OUT/ncu_grouped_$f.txt" 2>&1
  grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy" \
    "$OUT/ncu_grouped_$f.txt" | cut -c1-150 | head -n 40
done
