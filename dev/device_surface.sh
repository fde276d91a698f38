#!/usr/bin/env bash
# The op-surface work's device call (the descriptions, the generic torch kernels, the Python
# surface): builds on the device (build: dev/device_gemm.sh build, minutes) or installs what the
# workstation staged (install: devbin-pack from dev/stage_devbin.sh, devwheel from
# dev/stage_devpkg.sh, seconds), then the C++ tests, the Python tests, what ships (ldd of the
# torch ops), host cost per call; logs under $OUT, a summary last.
#   device: bash dev/device_surface.sh [steps]   (default: install ctest pytest ships overhead)
#   two builds: ... install base hostab benchab   (the baseline from dev/stage_devbase.sh)
#   the generic-kernel branch: install base ctest verify pytest ships hostab benchab
#   PERF.md's reports: REPORTS="overhead llama_ops" ... install reports  (then, here: tar xzf
#   logs.tgz; python3 scripts/perf_reports.py --insert reports)
# Everything under $OUT ends as one archive, logs.tgz, and the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
STEPS="${*:-install ctest pytest ships overhead}"
summary=()
step() {
  local name=$1; shift
  local t0=$SECONDS
  if declare -F "$1" >/dev/null; then "$@" >"$OUT/$name.log" 2>&1  # a function of this script
  else timeout "${STEP_TIMEOUT:-500}" "$@" >"$OUT/$name.log" 2>&1; fi
  local rc=$?
  summary+=("$(printf '%-9s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)")")
}
export LD_LIBRARY_PATH="$PWD/devbin"
export TESSERA_CACHE_DIR=/tmp/tessera-cache
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
install() {
  if [ ! -d devbin ] && [ -f devbin-pack/devbin.tar.xz ]; then
    python3 -c "import tarfile; tarfile.open('devbin-pack/devbin.tar.xz').extractall('.')"
  fi
  bash dev/devwheel.sh && cp devbin/libtessera.so devbin/libtessera_harness.so "$site/tessera/" &&
    mkdir -p "$site/tessera/bin" && cp devbin/tessera "$site/tessera/bin/" && echo "installed"
}
# The baseline of a two-build comparison (dev/stage_devbase.sh): its CLI and libraries in
# devbase/, its package in /tmp/pkg-old; this build's package in /tmp/pkg-new.
base() {
  python3 -c "import tarfile; tarfile.open('devbin-base/devbase.tar.xz').extractall('/tmp/devbase-x')" || return
  rm -rf devbase /tmp/pkg-old /tmp/pkg-new && mv /tmp/devbase-x/devbase . && mkdir -p /tmp/pkg-old /tmp/pkg-new &&
    mv /tmp/devbase-x/pkg/tessera /tmp/pkg-old/ && cp devbase/libtessera*.so /tmp/pkg-old/tessera/ &&
    cp -r "$site/tessera" /tmp/pkg-new/ && echo "baseline $(cat /tmp/devbase-x/REF) staged"
}
for s in $STEPS; do
  case $s in
    install) step install install ;;
    build) step build env OUT=/tmp/out-build bash dev/device_gemm.sh build
           cat /tmp/out-build/build.log >>"$OUT/build.log" 2>/dev/null ;;
    ctest) step ctest devbin/tessera_tests --gtest_brief=1 --gtest_filter="${CTEST_FILTER:-*}" ;;
    verify) step verify devbin/tessera verify ${VERIFY_OPS:-layer_norm rms_norm add_layer_norm add_rms_norm cross_entropy linear_cross_entropy add copy isin silu_mul} ;;
    pytest) step pytest python3 -X faulthandler -m pytest -q --maxfail=25 -rs ${PYTEST_ARGS:-tests/python} ;;
    ships) step ships bash -c "ldd $site/tessera/libtessera_torch.so | grep -i tessera; ! ldd $site/tessera/libtessera_torch.so | grep -q harness && echo 'no harness in libtessera_torch'" ;;
    overhead) step overhead python3 benchmarks/overhead.py ${OVERHEAD_ARGS:-} ;;
    base) step base base ;;
    hostab) step hostab python3 dev/host_ab.py /tmp/pkg-old /tmp/pkg-new --out "$OUT/hostab" ${HOSTAB_ARGS:-} ;;
    benchab) step benchab bash dev/device.sh --baseline devbase --ops "${AB_OPS:-layer_norm,rms_norm,add_rms_norm,cross_entropy}" ab ;;
    bench) step bench devbin/tessera bench ${BENCH_OPS:-silu_mul silu gelu softmax} --dtype float32,bfloat16 --no-peaks ;;
    # docs/PERF.md's reports (scripts/perf_reports.py; REPORTS names some, default all of one GPU)
    # the staged code's commit (dev/stage_devbin.sh): the device's git HEAD is not the tree's
    reports) step reports python3 scripts/perf_reports.py --run "$OUT/reports" ${REPORTS:-} --timeout "${REPORT_TIMEOUT:-500}" \
               --code "$(cat devbin-pack/CODE 2>/dev/null || echo unknown)" ;;
    *) echo "unknown step $s" >&2 ;;
  esac
done
grep -E "FAILED|Error|error:" "$OUT"/ctest.log 2>/dev/null | head -20
grep -E "^FAILED|^ERROR|Error" "$OUT"/pytest.log 2>/dev/null | head -20
printf '%s\n' "${summary[@]}"
# A call brings back only a few files: the logs and reports as one archive.
tar czf /tmp/surface-logs.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/surface-logs.tgz "$OUT/logs.tgz"
