#!/usr/bin/env bash
# One call on the lent GPU machine: tests, verify, benchmarks, profile, sanitizer, A/B comparison;
# logs under $OUT and a short summary printed last. Expects the C++ outputs built on the
# workstation in devbin/ (carried):
#   bash dev/stage_devbin.sh                                  # here: build and stage binaries
#   device run: bash dev/device.sh [--ops a,b] [--baseline DIR] [steps]
# --ops: op names as `tessera verify/bench` take them (a name also selects its variants, e.g.
#   softmax: softmax, softmax_backward); every step then covers those ops only. Default: all.
# Steps (default: env ctest verify pytest pybench bench):
#   env        GPU, toolkit, torch/triton versions, devbin's library dependencies
#   ctest      the C++ tests (devbin/tessera_tests), filtered to the suites of --ops (see below)
#   verify     tessera verify; large: the same with --large
#   bench      tessera bench --dtype $BENCH_DTYPES (default float32,bfloat16)
#   pyinstall  builds and installs the wheel here; pytest: the Python tests
#   pybench    each benchmarks/*.py that covers one of --ops, with --ops (PYBENCH_ARGS: extra
#              arguments, e.g. PYBENCH_ARGS=--quick); one step (and log) per script
#   sanitize   compute-sanitizer memcheck over the ctest filter
#   profile    tessera profile of each op named in --ops (PROFILE_OPS without --ops;
#              PROFILE_ARGS: extra arguments, e.g. "--dtype bfloat16 --size 4096")
#   ab         needs --baseline DIR (a second staged devbin, e.g. devbin0): tessera bench of
#              --ops from the baseline and from devbin alternately, AB_ROUNDS rounds (default 3),
#              then scripts/compare_bench.py: per case the median of each side, new/old, the
#              cases slower by more than 2% (AB_ARGS: extra `tessera bench` arguments, e.g.
#              "--sizes 64k,1M")
# The ctest filter: the GoogleTest suites whose names start with a word of a selected op's name or
# family, in CamelCase (layer_norm: Layer*, Norm*, Rowwise*; isin: Isin*, Set*), and the selected
# ops' generated verify tests (VerifyGpu.*/<op>); CTEST_FILTER replaces it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"

OPS=""
BASELINE=""
STEPS=""
while [ $# -gt 0 ]; do
  case $1 in
    --ops) OPS="${2:?--ops needs a comma-separated list}"; shift 2 ;;
    --ops=*) OPS="${1#--ops=}"; shift ;;
    --baseline) BASELINE="${2:?--baseline needs a directory}"; shift 2 ;;
    --baseline=*) BASELINE="${1#--baseline=}"; shift ;;
    -*) echo "device.sh: unknown option $1" >&2; exit 2 ;;
    *) STEPS="$STEPS $1"; shift ;;
  esac
done
STEPS="${STEPS:-env ctest verify pytest pybench bench}"
OP_ARGS="${OPS//,/ }"  # the command's operands: names separated by spaces
BENCH_DTYPES="${BENCH_DTYPES:-float32,bfloat16}"

# A packed devbin (dev/stage_devbin.sh) where devbin itself was not carried.
if [ ! -d devbin ] && [ -f devbin-pack/devbin.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('devbin-pack/devbin.tar.xz').extractall('.')"
fi
# devbin's binaries find devbin's libraries (libtessera, libtessera_harness) through this; the
# Python steps use the wheel's own.
export DEVLIB="LD_LIBRARY_PATH=$PWD/devbin"
BIN="env $DEVLIB $PWD/devbin/tessera"

summary=()
step() {  # step NAME CMD...: run, log to $OUT/NAME.log, record pass/fail
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-12s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-100)")")
}

# The gtest filter of the selected ops: a suite pattern per CamelCase word of each op's name and
# family. The families come from the descriptions through the installed wheel (pyinstall); without
# it, the words of the names alone (add and gelu then match no suite: use CTEST_FILTER).
selected_words() {
  python3 - "$OPS" 2>/dev/null <<'EOF' || name_words
import sys
from tessera.bench import ops
words, names = set(), []
for o in ops(sys.argv[1] or None):
    names.append(o.name)
    for part in o.name.split("_") + [o.family]:
        words.add(part[:1].upper() + part[1:])
print(":".join([f"{w}*.*" for w in sorted(words)] + [f"*VerifyGpu.*/{n}" for n in names]))
EOF
}

name_words() {
  echo "ctest: no tessera wheel here, the filter takes the op names' words only" >&2
  local word filter=""
  for word in ${OPS//[,_]/ }; do filter="$filter:${word^}*.*"; done
  for word in ${OPS//,/ }; do filter="$filter:*VerifyGpu.*/$word*"; done
  echo "${filter#:}"
}

ctest_filter() {
  if [ -n "${CTEST_FILTER:-}" ]; then echo "$CTEST_FILTER"
  elif [ -z "$OPS" ]; then echo "*"
  else selected_words
  fi
}

ab_round() {  # ab_round SIDE DIR ROUND: one `tessera bench` of the selected ops, JSON kept
  local side=$1 dir=$2 r=$3
  # shellcheck disable=SC2086 # OP_ARGS: one operand per op
  env LD_LIBRARY_PATH="$dir" "$dir/tessera" bench $OP_ARGS --dtype "$BENCH_DTYPES" --no-peaks \
      --out "$OUT/ab/$side$r" ${AB_ARGS:-} || return
  find "$OUT/ab/$side$r" -type f ! -name bench.json -delete
}

ab() {
  [ -n "$BASELINE" ] || { echo "ab: needs --baseline DIR (a staged devbin of the baseline)"; return 2; }
  [ -x "$BASELINE/tessera" ] || { echo "ab: no $BASELINE/tessera"; return 2; }
  local base; base=$(cd "$BASELINE" && pwd)
  rm -rf "$OUT/ab" && mkdir -p "$OUT/ab"
  local r rc=0
  for r in $(seq 1 "${AB_ROUNDS:-3}"); do
    # Alternate which side goes first, so drift in clocks or temperature over the run falls on
    # both sides alike.
    if [ $((r % 2)) -eq 1 ]; then
      ab_round old "$base" "$r" && ab_round new "$PWD/devbin" "$r" || rc=1
    else
      ab_round new "$PWD/devbin" "$r" && ab_round old "$base" "$r" || rc=1
    fi
  done
  python3 scripts/compare_bench.py --old "$OUT"/ab/old*/bench.json --new "$OUT"/ab/new*/bench.json \
      || rc=1
  return $rc
}

pybench() {  # one step per benchmarks/*.py that covers one of the selected ops
  local script name ops
  for script in benchmarks/*.py; do
    name=$(basename "$script" .py)
    [ "$name" = common ] && continue
    ops=$(python3 "$script" --ops "${OPS:-all}" --list-ops 2>&1) || { summary+=("py$name: $ops"); continue; }
    [ -n "$ops" ] || continue
    # shellcheck disable=SC2086 # the extra arguments are meant to split into words
    step "py$name" python3 "$script" --ops "${OPS:-all}" --out "$OUT/py$name" ${PYBENCH_ARGS:-}
  done
}

profile() {  # each op profiles even when one before it fails; the step fails if any did
  local op rc=0
  for op in ${OP_ARGS:-${PROFILE_OPS:-add softmax layer_norm isin}}; do
    # shellcheck disable=SC2086
    $BIN profile "$op" ${PROFILE_ARGS:-} || rc=1
  done
  return $rc
}

for s in $STEPS; do
  # SC2086: OP_ARGS is one operand per op; SC2016: $DEVLIB expands in the env step's shell.
  # shellcheck disable=SC2086,SC2016
  case $s in
    env) step env bash -c 'nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; ls /usr/local/cuda/lib64 | grep -E "cupti|cublas" | head; env $DEVLIB ldd devbin/tessera | grep -E "not found|tessera|cuda|cublas|cupti"' ;;
    ctest) step ctest env $DEVLIB ./devbin/tessera_tests --gtest_filter="$(ctest_filter)" --gtest_brief=1 ;;
    verify) step verify $BIN verify $OP_ARGS ;;
    large) step large $BIN verify --large $OP_ARGS ;;
    bench) step bench $BIN bench $OP_ARGS --dtype "$BENCH_DTYPES" --out "$OUT/report" ;;
    pyinstall) step pyinstall bash -c 'c++ --version | head -1; cmake --version | head -1; TESSERA_CUDA_ARCHITECTURES=90a python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -20; python3 -c "import tessera; print(tessera.__version__)"' ;;
    pytest) step pytest python3 -X faulthandler -m pytest tests/python -q -rs ;;
    pybench) pybench ;;
    # Less the profiler's tests: CUPTI takes no second subscriber, and the sanitizer is one. API
    # errors are the tests' own business (some provoke them on purpose); memory errors fail it.
    sanitize) step sanitize timeout "${SANITIZE_TIMEOUT:-540}" env $DEVLIB compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 ./devbin/tessera_tests --gtest_filter="$(ctest_filter)-BenchProfile.*" --gtest_brief=1 ;;
    profile) step profile profile ;;
    ab) step ab ab ;;
    *) summary+=("$s: unknown step") ;;
  esac
done

# The benchmarks' last tables (and failures), and the A/B comparison, from their logs.
for log in "$OUT"/py*.log; do
  if [ ! -f "$log" ] || ! grep -q '^==== final table' "$log"; then continue; fi
  echo "================ $(basename "$log" .log)"
  sed -n '/^==== final table/,$p' "$log"
done
if [ -f "$OUT/ab.log" ] && grep -q '^median time per case' "$OUT/ab.log"; then
  echo "================ ab"
  sed -n '/^median time per case/,$p' "$OUT/ab.log"
fi
# $OUT returns at most 8 files: pack the report folders, then, if still too many, the logs into
# one logs.tgz; if that is not enough, everything goes into all.tgz.
for d in "$OUT"/*/; do
  [ -d "$d" ] || continue
  d=$(basename "$d")
  tar -C "$OUT" -czf "$OUT/$d.tgz" "$d" && rm -rf "${OUT:?}/$d"
done
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
