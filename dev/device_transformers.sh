#!/usr/bin/env bash
# One call on the GPU machine for tessera.transformers: the staged package (dev/devwheel.sh), the
# geglu op's verify cases and tests, the transformers tests (the CPU patch tests, the attention's
# CUDA path, the convergence tests), the fused ops at the Llama step's sizes against
# torch.compile and Liger (benchmarks/llama_ops.py), the fused linear cross-entropy's time and
# memory against Liger, and the training step (benchmarks/transformers_step.py); logs under $OUT,
# a short summary last.
#   here:   bash dev/stage_devbin.sh && PY312=... BUILD_DIR=build bash dev/stage_devpkg.sh
#   device: bash dev/device_transformers.sh [steps]   (carry ["devbin-pack", "devwheel", ".whl"])
# Steps (default: geglu tpytest ops flce step; map: the elementwise ops' verify cases, dev/map_lab
# where it was built and carried, and their Python tests; lceprof: dev/lce_profile.py; step2: a
# second transformers_step run, STEP2_ARGS, by default Gemma 2 against Liger; norm: rms_norm's
# verify cases and tests; lce: linear_cross_entropy's; gated: matmul's and mlp's swiglu and geglu). STEP_ARGS: extra transformers_step.py arguments;
# OPS: llama_ops.py's --ops.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
STEPS="${*:-geglu tpytest ops flce step}"
DEFAULT_STEP_TIMEOUT=600
# shellcheck source=dev/device_lib.sh
source dev/device_lib.sh
if ls .whl/*.whl >/dev/null 2>&1; then  # Liger-Kernel, as a user's installed peer
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
for s in $STEPS; do
  case $s in
    geglu) step geglu bash -c "devbin/tessera verify geglu silu_mul &&
                               python3 -m pytest -q -rs tests/python/test_elementwise.py -k 'geglu or silu_mul'" ;;
    map) step map bash -c "if [ -x dev/map_lab ]; then dev/map_lab; fi; devbin/tessera verify add copy gelu silu silu_mul geglu &&
                           python3 -m pytest -q -rs tests/python/test_elementwise.py" ;;
    norm) step norm bash -c "devbin/tessera verify rms_norm rms_norm_backward &&
                             python3 -m pytest -q -rs tests/python/test_rowwise.py -k rms" ;;
    lce) step lce bash -c "devbin/tessera verify linear_cross_entropy &&
                           python3 -m pytest -q -rs tests/python/test_cross_entropy.py tests/python/test_sharding.py" ;;
    gated) step gated bash -c "devbin/tessera verify matmul_swiglu matmul_swiglu_unfused mlp swiglu_backward geglu_blocks_backward &&
                               python3 -m pytest -q -rs tests/python/test_mlp.py tests/python/test_matrix.py tests/python/test_torch_ops.py tests/python/test_sharding.py -k 'swiglu or geglu or mlp or activation or rms_norm or linear_cross or matmul'" ;;
    tpytest) step tpytest python3 -m pytest -q -rs tests/python/test_transformers_patch.py tests/python/test_transformers_training.py \
               tests/python/test_transformers_convergence.py ${TPYTEST_K:+-k "$TPYTEST_K"} ;;
    ops) step ops python3 benchmarks/llama_ops.py --rounds "${ROUNDS:-3}" \
           --ops "${OPS:-rms_norm,add_rms_norm,rotary,silu_mul,geglu,cross_entropy,linear_ce}" --out "$OUT/ops" ;;
    flce) step flce python3 benchmarks/cross_entropy.py --linear --rows 8192 --hidden 2048 --rounds "${ROUNDS:-3}" \
            --chunks "${CHUNKS:-256,1024}" ;;
    lceprof) step lceprof python3 dev/lce_profile.py ;;
    step2) step step2 python3 benchmarks/transformers_step.py --rounds 2 ${STEP2_ARGS:---family gemma2 --runs liger,tessera} \
             --out "$OUT/step2" ;;
    step) step step python3 benchmarks/transformers_step.py --rounds "${ROUNDS:-3}" ${STEP_ARGS:-} --out "$OUT/step" ;;
    *) echo "device_transformers.sh: unknown step $s" >&2 ;;
  esac
done
for s in norm lce gated tpytest; do
  grep -E "passed|failed|cases" "$OUT/$s.log" 2>/dev/null | tail -n 3
  grep -E "^FAILED|FAIL " "$OUT/$s.log" 2>/dev/null | head -n 20 | cut -c1-220
done
[ -f "$OUT/lceprof.log" ] && cat "$OUT/lceprof.log"
for s in ops flce; do [ -f "$OUT/$s.log" ] && sed -n '/==== final table/,$p' "$OUT/$s.log" | tail -n 30; done
[ -f "$OUT/map.log" ] && grep -E "GB/s|passed|failed" "$OUT/map.log" | tail -n 20
for s in step step2; do [ -f "$OUT/$s.log" ] && grep -E '^\| |against' "$OUT/$s.log"; done
print_summary
