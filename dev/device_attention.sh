#!/usr/bin/env bash
# One call on the GPU machine for the attention family: the C++ tests and verify cases, the Python
# tests (through the workstation's torch-op library, dev/devwheel.sh), then the forward and
# backward benchmarks against torch's SDPA backends; logs under $OUT, a short summary last.
#   here:   BUILD_DIR=build-main bash dev/stage_devbin.sh && bash dev/stage_devpkg.sh
#   device: bash dev/device_attention.sh [steps]      (carry ["devbin-pack", "devwheel"])
# Steps (default: ctest verify pytest bwd fwd): bwd and fwd take BENCH_ARGS (e.g. --quick);
# sanitize: compute-sanitizer memcheck over the tensor-core, varlen, decode and KV cache tests;
# tune: `tessera tune attention` on the decode shape. STEP_TIMEOUT: seconds a step may take (900).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
STEPS="${*:-ctest verify pytest bwd fwd}"
DEFAULT_STEP_TIMEOUT=900
# shellcheck source=dev/device_lib.sh
source dev/device_lib.sh
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
print_summary
