#!/usr/bin/env bash
# The GEMM work of one device call: builds the C++ targets, the extension and the torch ops on the
# device's cores where no devbin/ was carried (sm_90a only), then the C++ tests of matmul, copy and
# the tuner, `tessera verify` of matmul (all variants) and copy, compute-sanitizer over the new
# tiers' cases, the Python tests of matmul and the torch ops, and benchmarks/matrix.py against torch in one run (BENCH_ARGS, default: the bars'
# cases). Logs under $OUT, a summary last.
#   device: bash dev/device_gemm.sh [steps]     (default: build ctest verify sanitize pybench)
# Also: gated (verify of the fused activations' and the fused loss's GEMMs), pygated (their Python
# tests), llama (benchmarks/llama_step.py, LLAMA_ARGS), schedules, bench, pytest, sass, pack.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
STEPS="${*:-build ctest verify sanitize pybench}"
BUILD=/tmp/tessera-build
# A build staged here (dev/stage_devbin.sh, dev/stage_devpkg.sh; carry devbin-pack, devwheel):
# unpacked and installed as the other family drivers do, instead of building.
if [ ! -d devbin ] && [ -f devbin-pack/devbin.tar.xz ]; then
  # shellcheck source=dev/device_lib.sh
  source dev/device_lib.sh
fi
summary=()
step() {  # step NAME CMD...: run with a time limit, log to $OUT/NAME.log, record the last line
  local name=$1; shift
  local t0=$SECONDS
  if declare -F "$1" >/dev/null; then "$@" >"$OUT/$name.log" 2>&1  # a function of this script
  else timeout "${STEP_TIMEOUT:-900}" "$@" >"$OUT/$name.log" 2>&1; fi
  local rc=$?
  summary+=("$(printf '%-9s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)")")
}
build() {
  cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DTESSERA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" && \
  cmake --build $BUILD -j "$(nproc)" 2>&1 | grep -v "^\[" ; test "${PIPESTATUS[0]}" = 0 || return 1
  rm -rf devbin && mkdir -p devbin
  cp $BUILD/src/libtessera.so $BUILD/harness/libtessera_harness.so $BUILD/tests/cpp/tessera_tests \
     $BUILD/tools/tessera devbin/ && \
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
  rm -rf "$site/tessera" && mkdir -p "$site/tessera/bin" && \
  cp $BUILD/python/_C*.so $BUILD/python/_torch_fast*.so $BUILD/python/libtessera_torch.so \
     devbin/libtessera.so devbin/libtessera_harness.so python/tessera/*.py python/tessera/py.typed \
     "$site/tessera/" && cp devbin/tessera "$site/tessera/bin/" && echo "built and installed"
}
# pack: the build (devbin/ and the installed package) into $OUT in 15 MB pieces, to be carried as
# devpack/ by the next call, which then installs it instead of building.
pack() {
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  tar -cf - devbin -C "$site" tessera | xz -T0 -1 >/tmp/devpack.tar.xz && split -b 15M /tmp/devpack.tar.xz "$OUT/devpack.part." && ls -la "$OUT"/devpack.part.*
}
if [ -d devpack ] && [ ! -d devbin ]; then
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cat devpack/devpack.part.* > /tmp/devpack.tar.xz && mkdir -p /tmp/devpack && tar -xJf /tmp/devpack.tar.xz -C /tmp/devpack && \
    mv /tmp/devpack/devbin . && rm -rf "$site/tessera" && mv /tmp/devpack/tessera "$site/" && \
    cp python/tessera/*.py "$site/tessera/" && echo "installed from devpack"
fi
export LD_LIBRARY_PATH="$PWD/devbin"
export TESSERA_CACHE_DIR=/tmp/tessera-cache  # $OUT brings back 8 files at most: logs and bench.csv
for s in $STEPS; do
  case $s in
    build) step build build ;;
    ctest) step ctest devbin/tessera_tests --gtest_brief=1 \
             --gtest_filter="${CTEST_FILTER:-Matmul*:TuneCache*:*VerifyGpu*/matmul*:*VerifyGpu*/scaled_mm:*VerifyGpu*/copy}" ;;
    verify) step verify devbin/tessera verify matmul matmul_tf32 scaled_mm copy ;;
    sanitize) step sanitize compute-sanitizer --tool memcheck --print-limit 20 devbin/tessera_tests \
               --gtest_brief=1 --gtest_filter="${SANITIZE_FILTER:-*VerifyGpu*/matmul*:*VerifyGpu*/copy}" ;;
    bench) step bench devbin/tessera bench matmul matmul_tf32 --sizes "${BENCH_SIZES:-4096,8192}" --no-peaks ;;
    schedules)  # each sm90 schedule forced, then what the tuner picks for the bars' square shapes
      step pingpong env TESSERA_MATMUL_SCHEDULE=pingpong devbin/tessera bench matmul --dtype bfloat16 --sizes 2048,4096,8192 --no-peaks
      step cooperative env TESSERA_MATMUL_SCHEDULE=cooperative devbin/tessera bench matmul --dtype bfloat16 --sizes 2048,4096,8192 --no-peaks
      step tune devbin/tessera tune matmul --shapes "${TUNE_SHAPES:-4096x4096x4096,8192x8192x8192,128x4096x4096,1024x4096x4096,128x14336x4096}"
      step show devbin/tessera tune --show ;;
    pytest) step pytest python3 -X faulthandler -m pytest -q -rs tests/python/test_matrix.py \
              tests/python/test_torch_ops.py ;;
    pybench) step pybench env PYTHONUNBUFFERED=1 python3 benchmarks/matrix.py --out /tmp/report \
               ${BENCH_ARGS:---no-sizes --sweep --layouts --narrow --self-check --rounds 5}
             cp /tmp/report/bench.csv /tmp/report/bench.json "$OUT/" ;;
    gated) step gated devbin/tessera verify matmul_swiglu matmul_swiglu_unfused mlp swiglu_backward \
             geglu_blocks_backward linear_cross_entropy ;;
    pygated) step pygated python3 -m pytest -q -rs tests/python/test_mlp.py tests/python/test_cross_entropy.py ;;
    llama) step llama env PYTHONUNBUFFERED=1 python3 benchmarks/llama_step.py --out "$OUT/llama" ${LLAMA_ARGS:-} ;;
    pack) step pack pack ;;
    sass) step sass python3 dev/gemm_sass.py devbin/libtessera.so ;;
    *) echo "unknown step $s" >&2 ;;
  esac
done
printf '%s\n' "${summary[@]}"
