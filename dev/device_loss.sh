#!/usr/bin/env bash
# One call on the GPU machine for the loss family: the C++ tests and verify cases, the Python tests
# (the staged package, dev/devwheel.sh), `tessera bench cross_entropy`, then the forward +
# backward benchmark against torch, torch.compile and the Liger-style Triton kernel; logs under
# $OUT, a short summary last.
#   here:   BUILD_DIR=build-main bash dev/stage_devbin.sh && bash dev/stage_devpkg.sh
#   device: bash dev/device_loss.sh [steps]      (carry ["devbin-pack", "devwheel"])
# Steps (default: ctest pytest cbench bench sanitize; flce: the linear cross-entropy bench; gemm: the
# matmul tests and verify cases, then its d_weight accumulate step against cuBLAS; gemmpp: that step
# on the pingpong schedule). STEP_TIMEOUT:
# seconds a step may take (600).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
STEPS="${*:-ctest pytest cbench bench sanitize}"
DEFAULT_STEP_TIMEOUT=600
# shellcheck source=dev/device_lib.sh
source dev/device_lib.sh
for s in $STEPS; do
  case $s in
    ctest) step ctest devbin/tessera_tests --gtest_filter='*CrossEntropy*:*VerifyGpu*cross_entropy*:BenchReport*' ;;
    pytest) step pytest bash -c "python3 -m pytest -q -rs tests/python/test_cross_entropy.py &&
                                 python3 -m pytest -q -rs tests/python/test_torch_ops.py -k cross_entropy" ;;
    gemm) step gemm bash -c "devbin/tessera_tests --gtest_filter='Matmul*:*VerifyGpu*matmul*' &&
                             python3 benchmarks/matrix.py --no-sizes --accumulate --self-check --rounds ${ROUNDS:-3} --out \$OUT/gemm" ;;
    gemmpp) step gemmpp env TESSERA_MATMUL_SCHEDULE=pingpong python3 benchmarks/matrix.py --no-sizes --accumulate \
              --rounds "${ROUNDS:-3}" --out "$OUT/gemmpp" ;;
    cbench) step cbench devbin/tessera bench cross_entropy linear_cross_entropy --dtype bf16 ;;
    bench) step bench python3 benchmarks/cross_entropy.py --rounds "${ROUNDS:-3}" ;;
    flce) step flce python3 benchmarks/cross_entropy.py --linear --rounds "${ROUNDS:-3}" ${CHUNKS:+--chunks $CHUNKS} ;;
    sanitize) step sanitize compute-sanitizer --tool memcheck --error-exitcode 1 devbin/tessera_tests \
                --gtest_filter='*CrossEntropy*:*VerifyGpu*cross_entropy*' ;;
    *) echo "device_loss.sh: unknown step $s" >&2 ;;
  esac
done
for s in bench flce gemm gemmpp; do [ -f "$OUT/$s.log" ] && sed -n '/==== final table/,$p' "$OUT/$s.log"; done
[ -f "$OUT/cbench.log" ] && tail -n 12 "$OUT/cbench.log"
print_summary
