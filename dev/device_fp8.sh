#!/usr/bin/env bash
# The fp8 work's device call: the main job on a cold copy (dev/device_main.sh; MAIN=0 skips it);
# where devwheel is carried, the package staged here (dev/stage_devpkg.sh, with devbin's libraries:
# seconds) on the machine's python3; then with devbin (carried packed: dev/stage_devbin.sh) the
# float8 and matmul C++ tests, `tessera verify --full` of float8_quantize and scaled_mm,
# compute-sanitizer memcheck over float8_quantize's cases, an A/B against devbin_base where staged
# (dev/stage_ab.sh); with the package the main job installed (else the staged one):
# test_float8*.py with the float8 tests of test_torch_ops.py and test_transformers_patch.py, each
# recipe's kernels in one Float8Linear step (dev/fp8_kernels.py),
# benchmarks/moe.py (MOE_ARGS, MOE_LIMIT seconds), benchmarks/float8_quantize.py (QUANT_ARGS), the Llama-3-8B-layer
# step (FP8_RUNS), the public-size step (8 layers of 2048, 2 x 4096 tokens: PUBLIC_RUNS) and
# PERF.md's REPORTS (on python3). CTEST_FILTER and VERIFY_OPS replace the C++ tests' filter and
# verify's ops; MEMCHECK_TESTS runs C++ tests (a gtest filter) under memcheck; normbench is
# benchmarks/rms_norm_float8.py (NORM_ARGS). Every step ends by DEADLINE seconds into the call (default 570),
# later ones skipped. The logs and reports packed in $OUT/logs.tar.xz (a call returns 8 files at
# most), a summary last.
#   device: bash dev/device_fp8.sh        (carry [".whl", "devbin-pack", "devwheel"])
set -uo pipefail
cd "$(dirname "$0")/.." || exit
FINAL="${OUT:-/tmp/out}"
OUT=/tmp/fp8logs  # each step's log and reports, packed into $FINAL at the end
mkdir -p "$FINAL" "$OUT"
root=$PWD
summary=()
ALL="main ctest verify memcheck memcheck2 memcheck3 ab matrix pytest pytest2 conv moebench kernels ncu quant normbench gaps fp8step public reports"  # STEPS picks
step() {  # step NAME SECONDS CMD...: log to $OUT/NAME.log, keep the last line
  local name=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  [[ " ${STEPS:-$ALL} " == *" $name "* ]] || return 0
  [ $((SECONDS + limit)) -le "${DEADLINE:-570}" ] || limit=$(("${DEADLINE:-570}" - SECONDS))
  if [ "$limit" -le 10 ]; then summary+=("$(printf '%-8s skipped: past the deadline' "$name")"); return; fi
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  summary+=("$(printf '%-8s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-120)")")
}
[ "${MAIN:-1}" = 1 ] && step main 450 env OUT="$OUT/main" MAIN_TIMEOUT=440 bash dev/device_main.sh
python3 -c "import tarfile; tarfile.open('devbin-pack/devbin.tar.xz').extractall('.')"
[ -f devbin-pack/devbin_base.tar.xz ] && python3 -c "import tarfile; tarfile.open('devbin-pack/devbin_base.tar.xz').extractall('.')"
if [ -d devwheel ]; then  # the staged package on the machine's python3 (the reports' interpreter)
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  bash dev/devwheel.sh >"$OUT/install.log" 2>&1 && cp devbin/libtessera.so devbin/libtessera_harness.so "$site/tessera/" &&
    mkdir -p "$site/tessera/bin" && cp devbin/tessera "$site/tessera/bin/"
fi
(
  export LD_LIBRARY_PATH=$root/devbin
  step ctest 120 devbin/tessera_tests --gtest_brief=1 --gtest_filter="${CTEST_FILTER:-Float8*:MatmulSimt.*:MatmulArgs.*:MatmulTuneGpu.*}"
  step verify 120 devbin/tessera verify --full ${VERIFY_OPS:-float8_quantize scaled_mm}  # float8_quantize selects _gated too
  step memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 9 devbin/tessera verify --full float8_quantize
  step memcheck2 120 compute-sanitizer --tool memcheck --error-exitcode 9 devbin/tessera verify scaled_mm
  # MEMCHECK_TESTS: C++ tests (a gtest filter) under memcheck
  [ -n "${MEMCHECK_TESTS:-}" ] && step memcheck3 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
    devbin/tessera_tests --gtest_brief=1 --gtest_filter="$MEMCHECK_TESTS"
  # devbin's library against devbin_base's (dev/stage_ab.sh), interleaved
  [ -d devbin_base ] && step ab "${AB_LIMIT:-120}" env OUT="$OUT" bash dev/ab_lib.sh
  printf '%s\n' "${summary[@]}" >"$OUT/summary-bin.txt"
)
[ -f "$OUT/summary-bin.txt" ] && mapfile -t summary <"$OUT/summary-bin.txt"
# The package main.sh installed (the fresh copy's venv where it made one), Liger and torchao from
# the carried wheels.
PY=python3
[ -x /tmp/fresh/.venv/bin/python ] && PY=/tmp/fresh/.venv/bin/python
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
step matrix "${MATRIX_LIMIT:-60}" "$PY" benchmarks/matrix.py ${MATRIX_ARGS:---no-sizes --fp32 --rounds 1} --out "$OUT/matrix"
step pytest 150 "$PY" -m pytest -q -x tests/python/test_float8.py tests/python/test_float8_gated.py \
  tests/python/test_float8_head.py tests/python/test_torch_ops.py tests/python/test_transformers_patch.py -k "float8 or fp8"
# PYTEST2: more test files (with their own -k), a second pytest step
[ -n "${PYTEST2:-}" ] && step pytest2 150 "$PY" -m pytest -q -x $PYTEST2
step conv 150 "$PY" -m pytest -q -x tests/python/test_float8_convergence.py
step moebench "${MOE_LIMIT:-150}" "$PY" benchmarks/moe.py ${MOE_ARGS:---families qwen3_moe --runs tessera,grouped_mm,grouped_mm_compile,liger --rounds 3} --out "$OUT/moe"
step kernels 90 "$PY" dev/fp8_kernels.py
step ncu 120 ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section MemoryWorkloadAnalysis ${NCU_SECTIONS:-} "$PY" dev/fp8_ncu.py ${NCU_ARGS:-}
step quant 90 "$PY" benchmarks/float8_quantize.py ${QUANT_ARGS:---no-compile --rounds 3} --out "$OUT/float8_quantize"
step normbench 120 "$PY" benchmarks/rms_norm_float8.py ${NORM_ARGS:---no-compile} --out "$OUT/rms_norm_float8"
step gaps 120 "$PY" dev/step_gaps.py ${GAPS_RUNS:+--runs "$GAPS_RUNS"} --top 25
step fp8step "${STEP_LIMIT:-200}" "$PY" benchmarks/transformers_step.py --family llama --layers 4 --hidden 4096 --heads 32 \
  --kv-heads 8 --intermediate 14336 --vocab 128256 --batch 2 --seq 2048 --rounds 2 --steps 4 --warmup 2 \
  --runs "${FP8_RUNS:-tessera,tessera fp8 rowwise,tessera fp8 blockwise}" --profile --out "$OUT/fp8_step"
step public "${PUBLIC_LIMIT:-150}" "$PY" benchmarks/transformers_step.py --family llama --rounds 2 --steps 4 --warmup 2 \
  --runs "${PUBLIC_RUNS:-tessera,tessera fp8 rowwise}" --profile --out "$OUT/public_step"
# PERF.md's reports (REPORTS names them), each into $OUT/perf/NAME for perf_reports.py --insert here
step reports "${REPORTS_LIMIT:-300}" python3 scripts/perf_reports.py --run "$OUT/perf" ${REPORTS:-fp8_step} \
  --code "$(cat devbin-pack/CODE 2>/dev/null || echo unknown)"
for s in $ALL; do
  [ -f "$OUT/$s.log" ] || continue
  echo "== $s"; tail -n "${TAIL:-25}" "$OUT/$s.log" | cut -c1-200
done
tail -n 3 "$OUT/main/main.log" 2>/dev/null
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
python3 -c "import tarfile; t = tarfile.open('$FINAL/logs.tar.xz', 'w:xz'); t.add('$OUT', 'logs'); t.close()"
cp "$OUT/summary.txt" "$FINAL/" 2>/dev/null
