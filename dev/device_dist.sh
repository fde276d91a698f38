#!/usr/bin/env bash
# The distributed and model-step work's device call (2 GPUs for tests, tp, dp): installs what the
# workstation staged (dev/device_lib.sh), then the steps asked for; logs under $OUT, a
# summary last.
#   device: bash dev/device_dist.sh [steps]     (carry ["devbin-pack", "devwheel"])
# Steps:
#   tests   pytest of test_distributed.py and test_sharding.py (the 2-GPU tests run here)
#   tp      examples/llama_tensor_parallel.py on the full model (TP_PIECES, default all,swiglu,linear)
#   dp      examples/llama_distributed.py on the full model: single, ddp and fsdp2 with --compare,
#           DP_ARGS (default --steps 20 --batch 8)
#   swiglu  the sm90 swiglu epilogue: its C++ and Python tests, fused against unfused (bench)
#   mlp     tessera.mlp's tests: test_mlp.py, its opchecks, the README, the C++ verify cases
#   llama   benchmarks/llama_step.py LLAMA_ARGS (default --tessera all,swiglu --profile), on GPU 0
#   ops     benchmarks/llama_ops.py OPS_ARGS (default --rounds 5), on GPU 0
set -uo pipefail
cd "$(dirname "$0")/.." || exit
STEPS="${*:-tests tp dp}"
DEFAULT_STEP_TIMEOUT=500
source dev/device_lib.sh  # devbin, the package installed, step() and print_summary
export TESSERA_CACHE_DIR=/tmp/tessera-cache
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$OUT/gpus.txt" 2>&1
TR=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
DP_ARGS=${DP_ARGS:---steps 20 --batch 8}
for s in $STEPS; do
  case $s in
    tests) step tests python3 -m pytest -q -rs tests/python/test_distributed.py tests/python/test_sharding.py ;;
    tp) step tp "${TR[@]}" examples/llama_tensor_parallel.py --tessera "${TP_PIECES:-all,swiglu,linear}" ;;
    dp)
      step dp-single python3 examples/llama_distributed.py --mode single $DP_ARGS --out "$OUT/single.json"
      for m in ddp fsdp2; do
        step "dp-$m" "${TR[@]}" examples/llama_distributed.py --mode $m $DP_ARGS --out "$OUT/$m.json" \
          --compare "$OUT/single.json"
      done ;;
    swiglu)
      step swiglu-ctest devbin/tessera_tests --gtest_brief=1 \
        --gtest_filter='MatmulArgs.*:MatmulGpu.*:Op/VerifyGpu.MatchesReference/matmul*:Registry*'
      step swiglu-pytest python3 -m pytest -q tests/python/test_matrix.py -k "swiglu or preactivation"
      step swiglu-bench devbin/tessera bench matmul_swiglu matmul_swiglu_unfused --dtype bfloat16,float16 --no-peaks ;;
    mlp)
      step mlp-pytest python3 -m pytest -q tests/python/test_mlp.py tests/python/test_readme.py
      step mlp-opcheck python3 -m pytest -q tests/python/test_torch_ops.py -k "mlp or swiglu_backward"
      step mlp-ctest devbin/tessera_tests --gtest_brief=1 \
        --gtest_filter='Op/VerifyGpu.MatchesReference/mlp*:Op/VerifyGpu.MatchesReference/swiglu*:Registry*' ;;
    llama) step llama env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/llama_step.py --out "$OUT/llama" \
             ${LLAMA_ARGS:---tessera all,swiglu --profile} ;;
    ops) step ops env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/llama_ops.py --out "$OUT/ops" ${OPS_ARGS:---rounds 5} ;;
    *) echo "unknown step $s" >&2 ;;
  esac
done
cat "$OUT/gpus.txt"
[ -f "$OUT/llama.log" ] && { echo "== llama.log"; tail -n 40 "$OUT/llama.log"; }
[ -f "$OUT/ops.log" ] && { echo "== ops.log"; tail -n 14 "$OUT/ops.log"; }
for f in "$OUT"/dp-*.log "$OUT"/tp.log; do
  [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E "tokens/s|loss|scaling|rank [01]|ok|FAIL|Error" "$f" | tail -8; }
done
grep -E "^FAILED|^ERROR" "$OUT"/tests.log "$OUT"/swiglu-pytest.log "$OUT"/mlp-*.log 2>/dev/null | head -20
print_summary
