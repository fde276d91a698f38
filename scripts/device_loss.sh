#!/usr/bin/env bash
# One call on the GPU machine for the loss family: the C++ tests and verify cases, the Python tests
# (the staged package, scripts/devwheel.sh), `tessera bench cross_entropy`, then the forward +
# backward benchmark against torch, torch.compile and the Liger-style Triton kernel; logs under
# $OUT, a short summary last.
#   here:   BUILD_DIR=build-main bash scripts/stage_devbin.sh && bash scripts/stage_devpkg.sh
#   device: bash scripts/device_loss.sh [steps]      (carry ["devbin-pack", "devwheel"])
# Steps (default: ctest pytest cbench bench sanitize; flce: the linear cross-entropy bench). STEP_TIMEOUT: seconds a step may take (600).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
STEPS="${*:-ctest pytest cbench bench sanitize}"
if [ ! -d devbin ] && [ -f devbin-pack/devbin.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('devbin-pack/devbin.tar.xz').extractall('.')"
fi
export LD_LIBRARY_PATH=$PWD/devbin
bash scripts/devwheel.sh >"$OUT/install.log" 2>&1
pkg=$(cd /tmp && python3 -c "import importlib.util as u; print(u.find_spec('tessera').submodule_search_locations[0])")
cp devbin/libtessera.so devbin/libtessera_harness.so "$pkg"/ && mkdir -p "$pkg/bin" && cp devbin/tessera "$pkg/bin/"

summary=()
step() {  # step NAME CMD...: run with a time limit, log to $OUT/NAME.log, record the last line
  local name=$1; shift
  local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-600}" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-8s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)")")
}
for s in $STEPS; do
  case $s in
    ctest) step ctest devbin/tessera_tests --gtest_filter='CrossEntropy*:*VerifyGpu*cross_entropy*' ;;
    pytest) step pytest bash -c "python3 -m pytest -q -rs tests/python/test_cross_entropy.py &&
                                 python3 -m pytest -q -rs tests/python/test_torch_ops.py -k cross_entropy" ;;
    cbench) step cbench devbin/tessera bench cross_entropy --dtype bf16 ;;
    bench) step bench python3 benchmarks/cross_entropy.py --rounds "${ROUNDS:-3}" ;;
    flce) step flce python3 benchmarks/cross_entropy.py --linear --rounds "${ROUNDS:-3}" ;;
    sanitize) step sanitize compute-sanitizer --tool memcheck --error-exitcode 1 devbin/tessera_tests \
                --gtest_filter='CrossEntropy*:*VerifyGpu*cross_entropy*' ;;
    *) echo "device_loss.sh: unknown step $s" >&2 ;;
  esac
done
for s in bench flce; do [ -f "$OUT/$s.log" ] && sed -n '/==== final table/,$p' "$OUT/$s.log"; done
[ -f "$OUT/cbench.log" ] && tail -n 12 "$OUT/cbench.log"
printf '%s\n' "${summary[@]}"
