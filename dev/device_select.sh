#!/usr/bin/env bash
# One call on the GPU machine: the package built there for sm_90a as main.sh builds it, then
#   select  `tessera verify --full --write-selection` over every op, the ops dealt round-robin to
#           JOBS processes at once (default 8): the default selection's file ($OUT/verify_default.txt),
#           each case's time and the largest per op;
#   fp32    benchmarks/matrix.py --fp32 (float32 exact and TF32, every layout, 4096 and 8192);
#   compiled benchmarks/transformers_step.py over every family, each patched run compiled and not
#           (COMPILED_ARGS: its size and rounds);
#   moebench benchmarks/moe.py (MOEBENCH_ARGS); families: the dense families' convergence tests
#           beyond the first seven; vlm: the vision-language rows' and Nemotron's; ptbench:
#           benchmarks/post_training.py (PTBENCH_ARGS; carry .whl for Liger-Kernel);
#   cmd     bash -c "$CMD" (CMD_LIMIT seconds) with the package installed;
#   ctest   the C++ tests built in the package's build tree and run (CTEST_FILTER, a gtest filter);
#   ncu     Nsight Compute of the TF32 NT 4096 kernel beside cuBLAS's (NCU=1);
#   grouped grouped_mm: its pytest file and torch-ops checks, `tessera verify grouped_mm matmul`,
#           benchmarks/grouped_mm.py (GROUPED_ARGS), and the bf16 GEMM at 4096 and 8192 (matrix.py);
#   moe     the MoE pytest files (grouped_mm, transformers' MoE rows, their convergence) and the
#           issue's Qwen3-MoE step (benchmarks/transformers_step.py, MOE_RUNS, profiled; MSTEP=0 / MCONV=0 skip
#           the step / the convergence).
# Logs under $OUT (packed), a short summary last.
#   device: bash dev/device_select.sh [steps]      (carry [".whl"] for Liger-Kernel)
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" /tmp/logs
STEPS="${*:-select fp32 compiled}"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site
fi
summary=()
step() {  # step NAME SECONDS CMD... (CMD may be a function of this script: exported, run by bash)
  local name=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  # every step ends by DEADLINE seconds into the call, so the logs still come back within the call's limit
  [ $((SECONDS + limit)) -le "${DEADLINE:-560}" ] || limit=$(("${DEADLINE:-560}" - SECONDS))
  if [ "$limit" -le 5 ]; then summary+=("$(printf '%-9s skipped: past the deadline' "$name")"); return; fi
  timeout "$limit" bash -c '"$@"' bash "$@" >"/tmp/logs/$name.log" 2>&1 || rc=$?
  summary+=("$(printf '%-9s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "/tmp/logs/$name.log" | cut -c1-110)")")
}
build_install() {
  source scripts/common.sh
  export TESSERA_CUDA_ARCHITECTURES=90a ARCHS=90a CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
  pick_env && make_venv && install_pins build && pick_generator && install_package -v
}
export -f build_install
step install 300 build_install
TESSERA="$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/tessera"
[ -x "$TESSERA" ] || TESSERA=tessera
export TESSERA OUT

select_cases() {
  local jobs="${JOBS:-8}" ops i=0
  mapfile -t ops < <("$TESSERA" verify --full --list | awk 'NF > 1 && $2 != "case(s)" {print $1}' | uniq)
  declare -a group
  for op in "${ops[@]}"; do group[i % jobs]+=" $op"; i=$((i + 1)); done
  for g in $(seq 0 $((jobs - 1))); do
    [ -n "${group[g]:-}" ] || continue
    # shellcheck disable=SC2086
    "$TESSERA" verify --full --write-selection "/tmp/logs/sel$g.txt" ${group[g]} >"/tmp/logs/verify$g.txt" 2>&1 &
  done
  wait
  { head -n 2 /tmp/logs/sel0.txt; for g in $(seq 0 $((jobs - 1))); do grep -v '^#' "/tmp/logs/sel$g.txt" 2>/dev/null; done; } >"$OUT/verify_default.txt"
  cat /tmp/logs/verify*.txt >/tmp/logs/verify_full.txt
  grep -hE '^(default selection|[0-9]+ passed)' /tmp/logs/verify*.txt
  grep -h '^FAIL' /tmp/logs/verify*.txt | cut -c1-200
  # seconds per op (the last field of each case line), the largest first
  awk '/^(PASS|FAIL)/ {t[$2] += $(NF - 1)} END {for (o in t) printf "%8.1f s  %s\n", t[o], o}' /tmp/logs/verify*.txt | sort -rn | head -15
  echo "selected $(grep -vc '^#' "$OUT/verify_default.txt") of $(grep -cE '^(PASS|FAIL)' /tmp/logs/verify_full.txt) cases"
}
export -f select_cases

for s in $STEPS; do
  case $s in
    select) step select 240 select_cases ;;
    fp32) step fp32 240 python3 benchmarks/matrix.py --no-sizes --fp32 --rounds 3 --out /tmp/logs/matrix_fp32 ;;
    compiled) step compiled "${COMPILED_LIMIT:-330}" python3 benchmarks/transformers_step.py --family all \
                ${COMPILED_ARGS:---layers 2 --vocab 32000 --rounds 2 --steps 4 --warmup 2} \
                --runs tessera,tessera_compile,tessera_sdpa,tessera_sdpa_compile --out /tmp/logs/compiled ;;
    grouped)
      step gtest 240 python3 -m pytest -x -q tests/python/test_grouped_mm.py tests/python/test_torch_ops.py -k "grouped or opcheck and grouped"
      step gverify 180 "$TESSERA" verify grouped_mm matmul
      step gbench 300 python3 benchmarks/grouped_mm.py ${GROUPED_ARGS:---rounds 3} --out /tmp/logs/grouped_mm
      step gemm16 120 python3 benchmarks/matrix.py --sizes 4096,8192 --dtypes bfloat16 --rounds 3 --out /tmp/logs/matrix16 ;;
    moe)
      step mtest 150 python3 -m pytest -q tests/python/test_moe.py tests/python/test_grouped_mm.py tests/python/test_transformers_moe.py tests/python/test_post_training.py
      step mverify 90 "$TESSERA" verify moe_permute moe_unpermute moe_permute_backward moe_unpermute_backward grouped_mm
      [ "${MCONV:-1}" = 1 ] && step mconv 200 python3 -m pytest -q tests/python/test_transformers_convergence.py -k "moe or mixtral or gpt_oss or deepseek"
      [ "${MSTEP:-1}" = 1 ] && step mstep 300 python3 benchmarks/transformers_step.py --family qwen3_moe --layers 4 --heads 32 --kv-heads 4 \
        --head-dim 128 --experts 128 --top-k 8 --moe-intermediate 768 --vocab 151936 --rounds 2 --steps 4 --warmup 2 \
        --runs "${MOE_RUNS:-eager,compile,liger,tessera,tessera_sdpa}" --profile --out /tmp/logs/moe_step ;;
    moebench) step moebench "${MOEBENCH_LIMIT:-300}" python3 benchmarks/moe.py ${MOEBENCH_ARGS:---families qwen3_moe --rounds 2} \
                --out /tmp/logs/moe ;;
    families) step families 300 python3 -m pytest -q tests/python/test_transformers_convergence.py \
                -k "gemma-bf16 or gemma-fp32 or granite or ministral or olmo or smollm3 or glm or exaone4 or hunyuan_v1_dense or helium or ernie" ;;
    vlm) step vlm "${VLM_LIMIT:-300}" python3 -m pytest -v tests/python/test_transformers_convergence.py \
                -k "${VLM_K:-vl or glm4v or gemma3-bf16 or gemma3-fp32 or mllama or llava or paligemma or internvl or smolvlm or mistral3 or nemotron}" ;;
    ptbench) step ptbench "${PTBENCH_LIMIT:-300}" python3 benchmarks/post_training.py ${PTBENCH_ARGS:---rounds 3} \
                --out /tmp/logs/post_training ;;
    cmd) step cmd "${CMD_LIMIT:-200}" bash -c "$CMD" ;;
    ctest) step ctest "${CTEST_LIMIT:-240}" bash -c 'source scripts/common.sh && pick_env &&
             cmake -S . -B "$BUILD" -DTESSERA_BUILD_TESTS=ON >/dev/null && cmake --build "$BUILD" --target tessera_tests &&
             "$BUILD/tests/cpp/tessera_tests" --gtest_brief=1 --gtest_filter="${CTEST_FILTER:-*}" 2>&1 | tail -n 30' ;;
    ncu) step ncu 120 ncu --target-processes all -k "regex:gemm|sm90|xmma|cutlass" -c 4 --section SpeedOfLight \
                --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats python3 -c "
import torch, tessera
a = torch.randn(4096, 4096, device='cuda'); b = torch.randn(4096, 4096, device='cuda').t()
torch.set_float32_matmul_precision('high')
for _ in range(2): torch.matmul(a, b); tessera.matmul(a, b)
torch.cuda.synchronize()" ;;
  esac
done
cp /tmp/logs/matrix_fp32/bench.json "$OUT/matrix_fp32.json" 2>/dev/null
cp /tmp/logs/compiled/transformers_step.md "$OUT/compiled.md" 2>/dev/null
python3 -c "import tarfile; t = tarfile.open('$OUT/logs.tar.xz', 'w:xz'); t.add('/tmp/logs', 'logs'); t.close()"
cp /tmp/logs/grouped_mm/grouped_mm.json "$OUT/grouped_mm.json" 2>/dev/null
cp /tmp/logs/moe_step/transformers_step.md "$OUT/moe_step.md" 2>/dev/null
cp /tmp/logs/moe/moe.md "$OUT/moe.md" 2>/dev/null
cp /tmp/logs/post_training/post_training.md "$OUT/post_training.md" 2>/dev/null
for s in select fp32 compiled ncu ctest gtest gverify gbench gemm16 mtest mverify mconv mstep moebench families vlm ptbench cmd; do
  [ -f "/tmp/logs/$s.log" ] || continue
  echo "== $s"; tail -n 30 "/tmp/logs/$s.log" | cut -c1-220
done
printf '%s\n' "${summary[@]}"
