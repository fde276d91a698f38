#!/usr/bin/env bash
# One call on the GPU machine for the attention family: the C++ tests and verify cases, the Python
# tests (through the workstation's torch-op library, scripts/devwheel.sh), then the forward and
# backward benchmarks against torch's SDPA backends; logs under $OUT, a short summary last.
#   here:   BUILD_DIR=build-main bash scripts/stage_devbin.sh && bash scripts/stage_devpkg.sh
#   device: bash scripts/device_attention.sh [steps]      (carry ["devbin-pack", "devwheel"])
# Steps (default: ctest verify pytest bwd fwd): bwd and fwd take BENCH_ARGS (e.g. --quick);
# sanitize: compute-sanitizer memcheck over the tensor-core, varlen, decode and KV cache tests;
# tune: `tessera tune attention` on the decode shape. STEP_TIMEOUT: seconds a step may take (900).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
STEPS="${*:-ctest verify pytest bwd fwd}"
if [ ! -d devbin ] && [ -f devbin-pack/devbin.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('devbin-pack/devbin.tar.xz').extractall('.')"
fi
export LD_LIBRARY_PATH=$PWD/devbin
# The Python package from the slim wheel, with the workstation's libraries laid over it.
bash scripts/devwheel.sh >"$OUT/install.log" 2>&1
pkg=$(cd /tmp && python3 -c "import importlib.util as u; print(u.find_spec('tessera').submodule_search_locations[0])")
cp devbin/libtessera.so devbin/libtessera_harness.so "$pkg"/ && mkdir -p "$pkg/bin" && cp devbin/tessera "$pkg/bin/"

summary=()
step() {  # step NAME CMD...: run with a time limit, log to $OUT/NAME.log, record the last line
  local name=$1; shift
  local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-900}" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-8s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)")")
}
for s in $STEPS; do
  case $s in
    ctest) step ctest devbin/tessera_tests --gtest_filter='Attention*:*VerifyGpu*attention*' ;;
    sanitize) step sanitize compute-sanitizer --tool memcheck --error-exitcode 1 devbin/tessera_tests \
                --gtest_filter='AttentionGpu.Sm90*:AttentionGpu.Varlen*:AttentionGpu.Decode*:AttentionGpu.KvCache*' ;;
    tune) step tune env TESSERA_CACHE_DIR="$OUT/cache" devbin/tessera tune attention --shapes 1x1x32768x32x8x128,8x1x8192x32x8x128 ;;
    verify) step verify devbin/tessera verify attention attention_causal attention_backward ;;
    pytest) step pytest bash -c "python3 -m pytest -q -rs tests/python/test_attention.py tests/python/test_routing.py &&
                                 python3 -m pytest -q -rs tests/python/test_torch_ops.py -k attention" ;;
    bwd) step bwd python3 benchmarks/attention.py --backward --rounds 3 ${BENCH_ARGS:-} ;;
    fwd) step fwd python3 benchmarks/attention.py --rounds 3 --extras ${BENCH_ARGS:-} ;;
    *) echo "device_attention.sh: unknown step $s" >&2 ;;
  esac
done
for s in bwd fwd; do [ -f "$OUT/$s.log" ] && sed -n '/==== final table/,$p' "$OUT/$s.log"; done
printf '%s\n' "${summary[@]}"
