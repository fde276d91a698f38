#!/usr/bin/env bash
# One call on the lent GPU machine: tests, verify, benchmarks, profile; logs under $OUT and a short
# summary printed last. Expects the C++ outputs built on the workstation in devbin/ (carried):
#   bash scripts/stage_devbin.sh               # here: build and stage binaries
#   device run: bash scripts/device.sh [steps]  # steps: env ctest verify large pytest bench pybench profile
#     row-wise/dropout: rowctest rowverify rowlarge rowbench dropbench rowprofile
#     (ROWBENCH_ARGS / DROPBENCH_ARGS: extra arguments, e.g. ROWBENCH_ARGS="--ops softmax --quick")
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
STEPS="${*:-env ctest verify pytest pybench bench profile}"
# devbin's binaries find devbin's libtessera through this; the Python steps use the wheel's own.
export DEVLIB="LD_LIBRARY_PATH=$PWD/devbin"
BIN="env $DEVLIB $PWD/devbin/tessera"
summary=()
step() {  # step NAME CMD...: run, log to $OUT/NAME.log, record pass/fail
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-10s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-100)")")
}
for s in $STEPS; do
  case $s in
    env) step env bash -c 'nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; ls /usr/local/cuda/lib64 | grep -E "cupti|cublas" | head; env $DEVLIB ldd devbin/tessera | grep -E "not found|cuda|cublas|cupti"' ;;
    ctest) step ctest env $DEVLIB ./devbin/tessera_tests --gtest_brief=1 ;;
    verify) step verify $BIN verify ;;
    large) step large $BIN verify --large add gelu ;;
    sanitize) step sanitize env $DEVLIB compute-sanitizer --tool memcheck ./devbin/tessera_tests --gtest_filter='ElementwiseGpu.*:TileGpu.*' --gtest_brief=1 ;;
    pyinstall) step pyinstall bash -c 'c++ --version | head -1; cmake --version | head -1; TESSERA_CUDA_ARCHITECTURES=90a python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -20; python3 -c "import tessera; print(tessera.__version__)"' ;;
    pytest) step pytest python3 -X faulthandler -m pytest tests/python -q -rs ;;
    pydiag) step pydiag bash -c 'LD_DEBUG=libs python3 -c "import tessera._C" 2>&1 | grep -E "tessera|cudart" | head; python3 -X faulthandler -m pytest tests/python/test_bench.py -q -x 2>&1 | tail -30' ;;
    pybench) step pybench python3 benchmarks/elementwise.py --out "$OUT/pyreport" ;;
    bench) step bench $BIN bench add gelu gelu_tanh --dtype float32,bfloat16 --out "$OUT/report" ;;
    profile) step profile bash -c "$BIN profile add --dtype float32 --size 2^28 && $BIN profile gelu_tanh --dtype bfloat16 --size 2^24" ;;
    cbench) step cbench $BIN bench ${CBENCH_OPS:-softmax log_softmax layer_norm rms_norm dropout} --dtype float32,bfloat16 --out "$OUT/creport" ;;
    setctest) step setctest env $DEVLIB ./devbin/tessera_tests --gtest_filter='Set*' --gtest_brief=1 ;;
    rowsanitize) step rowsanitize timeout 300 env $DEVLIB compute-sanitizer --tool memcheck --error-exitcode 9 ./devbin/tessera_tests --gtest_filter="${SANITIZE_FILTER:-SoftmaxGpu.*:NormGpu.LayerNorm:NormGpu.RmsNormBackward:DropoutGpu.Forward:CopyGpu.*:SetGpu.*}" --gtest_brief=1 ;;
    setpy) step setpy python3 benchmarks/set.py --out "$OUT/setpyreport" ${SETPY_ARGS:-} ;;
    setbench) step setbench $BIN bench isin --dtype int32 --out "$OUT/setreport" ;;
    rowctest) step rowctest env $DEVLIB ./devbin/tessera_tests --gtest_filter='*Softmax*:*Norm*:*Dropout*:*Copy*' --gtest_brief=1 ;;
    rowverify) step rowverify $BIN verify softmax log_softmax layer_norm rms_norm dropout copy ;;
    rowlarge) step rowlarge $BIN verify --large softmax layer_norm dropout ;;
    rowbench)
      # shellcheck disable=SC2086 # the extra arguments are meant to split into words
      step rowbench python3 benchmarks/rowwise.py --out "$OUT/rowreport" ${ROWBENCH_ARGS:-} ;;
    dropbench)
      # shellcheck disable=SC2086
      step dropbench python3 benchmarks/dropout.py --out "$OUT/dropreport" ${DROPBENCH_ARGS:-} ;;
    rowprofile)
      # For row-wise ops --size is the row length N (4096 rows); for dropout, elements. Each
      # profile runs even when one before it fails; the step fails if any did.
      step rowprofile bash -c "rc=0; $BIN profile softmax --dtype bfloat16 --size 4096 || rc=1; $BIN profile layer_norm --dtype bfloat16 --size 4096 || rc=1; $BIN profile dropout --dtype bfloat16 --size 2^24 || rc=1; exit \$rc" ;;
    *) echo "unknown step $s" ;;
  esac
done
# $OUT returns at most 8 files: pack the report folders.
for d in report pyreport creport setreport setpyreport rowreport dropreport; do
  [ -d "$OUT/$d" ] && tar -C "$OUT" -czf "$OUT/$d.tgz" "$d" && rm -rf "${OUT:?}/$d"
done
# The benchmarks' last tables (and failures), from their logs, before the logs may be packed.
for name in rowbench dropbench setpy; do
  if [ -f "$OUT/$name.log" ] && grep -q '^==== final table' "$OUT/$name.log"; then
    echo "================ $name"
    sed -n '/^==== final table/,$p' "$OUT/$name.log"
  fi
done
# Still more than 8 files: the logs go into one logs.tgz; if that is not enough, everything does.
nfiles() { find "$OUT" -type f | wc -l; }
if [ "$(nfiles)" -gt 8 ] && compgen -G "$OUT/*.log" >/dev/null; then
  (cd "$OUT" && tar -czf logs.tgz ./*.log && rm -f ./*.log)
fi
if [ "$(nfiles)" -gt 8 ]; then
  all=$(mktemp /tmp/out_all.XXXXXX)
  tar -C "$OUT" -czf "$all" . && find "$OUT" -mindepth 1 -delete && mv "$all" "$OUT/all.tgz"
fi
echo "================ summary"
printf '%s\n' "${summary[@]}"
