#!/usr/bin/env bash
# The main job, on a machine with a GPU: build and install the Python package into the Python
# environment, verify every operator, dtype and kernel tier against its CPU reference, then run
# the benchmarks of the headline cases against the peers that are installed (torch,
# torch.compile, cuBLAS, cuDNN, Triton, Liger-Kernel) into report/ (tables, CSV, JSON, SVG plots;
# report/README.md indexes them under the headline table, one row per operator against its best
# peer). The failures, each step's time, the report and the headline table are printed last.
#   bash scripts/main.sh            # from anywhere
# Environment: TESSERA_CUDA_ARCHITECTURES (default: the build directory's, else the GPU's own,
#              e.g. 90a on an H100/H200; "80;90a" builds both),
#              BUILD_DIR (the CMake build directory, shared with scripts/test.sh; default build),
#              PYTHON (default: python3 on PATH).
# The Python environment, as scripts/test.sh picks it (pick_env in scripts/common.sh): an
# activated one as it is; else that of $PYTHON or python3 where it is a virtual or conda
# environment that imports torch; else .venv in the repository root, created or reused, with that
# Python's packages visible. Offline, build tools already installed suffice.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
source scripts/common.sh
ARCHS="$(gpu_archs)"
export TESSERA_CUDA_ARCHITECTURES="$ARCHS"
pick_env
make_venv

echo "== build dependencies"
install_pins build
# CMake >= 3.24 and a build tool: from PyPI, into the venv, where the system has none fit.
deps=()
if ! PATH="$VENV/bin:$PATH" cmake_ok; then deps+=("cmake>=3.24,<5"); fi
if ! PATH="$VENV/bin:$PATH" command -v ninja >/dev/null; then deps+=("ninja>=1.10,<2"); fi
if [ "${#deps[@]}" -gt 0 ]; then pip_install "${deps[@]}"; fi
export PATH="$VENV/bin:$PATH"
pick_generator

echo "== building the CUDA library and the Python package in $BUILD (architectures $ARCHS; what scripts/test.sh built is reused)"
mkdir -p "$BUILD"
log="$BUILD/main-install.log"
# pip -v streams the build; show its stages and the build tool's [done/total] lines only, keep the
# rest in the log, and print the log's end if it fails.
{
  rc=0
  install_package -v 2>&1 || rc=$?
  echo "pip exit status: $rc"
} | tee "$log" | { grep --line-buffered -E '^ *(\*\*\* |\[[0-9]+/[0-9]+\] |Successfully installed)' || true; }
if ! tail -n 1 "$log" | grep -q '^pip exit status: 0$'; then
  tail -n 40 "$log" >&2
  echo "installing tessera failed; the whole log: $log" >&2
  exit 1
fi
TESSERA="$VENV/bin/tessera"

# Without a usable GPU nothing below can run: say why in one line.
if ! reason="$("$PY" -c 'import tessera; print("" if tessera.is_available() else tessera.no_gpu_reason() or "no usable CUDA GPU")' 2>&1)"; then
  reason="import tessera failed: $(printf '%s\n' "$reason" | tail -n 1)"
fi
if [ -n "$reason" ]; then
  echo "tessera is installed in $VENV, but the main job needs an NVIDIA GPU: $reason" >&2
  exit 1
fi

# Each step's wall time, printed as it ends and kept for the summary: what the main job costs.
t_start=0
timings=()
timed() {  # timed LABEL CMD...: runs CMD, prints and records its wall time, returns its status
  local label=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  echo "== $label: $((SECONDS - t0)) s (exit status $rc)"
  timings+=("$(printf '%-28s %5d s  exit %d' "$label" $((SECONDS - t0)) "$rc")")
  return "$rc"
}
echo "== build and install: $((SECONDS - t_start)) s"
timings+=("$(printf '%-28s %5d s' "build and install" $((SECONDS - t_start)))")

# A failed check (verify, a benchmark's own correctness gate) does not stop the job: the report is
# written, the failures are listed at the end, and the exit status is 1.
failed=()
echo "== tessera info"
timed "tessera info" "$TESSERA" info || failed+=("tessera info")
echo "== tessera verify"
mkdir -p report
timed "tessera verify" bash -c '"$0" verify 2>&1 | tee report/verify.txt; exit "${PIPESTATUS[0]}"' "$TESSERA" ||
  failed+=("tessera verify (report/verify.txt)")

has_torch=0
if "$PY" -c "import torch" 2>/dev/null; then has_torch=1; fi
describe() {  # the first line of a benchmark script's docstring
  "$PY" -c 'import ast, sys; d = ast.get_docstring(ast.parse(open(sys.argv[1]).read())) or ""; print((d.splitlines() or [""])[0])' "$1"
}
declare -A what=()
# The benchmarks the main job runs: the runs that measure the headline cases at the sizes the
# table cites (the list scripts/headline.py keeps beside its table), and the float32 GEMMs in every
# layout (exact and TF32, against cuBLAS: PERF.md's table of them is regenerated from this run, so
# a regression of those tiers shows there). Each script run alone, without these arguments, covers
# every size, dtype and run; the training steps (benchmarks/transformers_step.py, llama_step.py),
# autograd.py, overhead.py (host cost per call) and `tessera bench` (tessera's own suite) are
# left to be run alone, to keep the job in minutes.
runs=()
while IFS= read -r line; do runs+=("$line"); done < <("$PY" scripts/headline.py --commands)
runs+=("matrix_fp32 benchmarks/matrix.py --no-sizes --fp32 --rounds 2")
for run in "${runs[@]}"; do
  read -ra words <<<"$run"
  name=${words[0]} script=${words[1]}
  if [ "$has_torch" = 0 ] && grep -qE '^(import|from) torch' "$script"; then
    echo "== skipping $script: needs torch, which $PY cannot import"
    continue
  fi
  if grep -qE '^import transformers' "$script" && ! "$PY" -c 'import transformers' 2>/dev/null; then
    echo "== skipping $script: needs transformers (pip install 'transformers>=5'), which $PY cannot import"
    continue
  fi
  echo "== $script ${words[*]:2}"
  rm -rf "report/$name"
  timed "$name" env PATH="$VENV/bin:$PATH" "$PY" "$script" --out "report/$name" "${words[@]:2}" ||
    failed+=("$script (its output above; report/$name)")
  what[$name]="$script: $(describe "$script")"
done
# PERF.md's float32 GEMM table from this run (the other tables are regenerated by hand: PERF.md).
if [ -f report/matrix_fp32/bench.json ]; then
  code="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  versions="$("$PY" -c 'import torch; print(f"torch {torch.__version__}")' 2>/dev/null || true)"
  timed "PERF.md float32 GEMM table" "$PY" scripts/perf_tables.py report/matrix_fp32 --date "$(date -u +%F)" \
    --env "$versions, code at $code" --command "bash scripts/main.sh (matrix.py --no-sizes --fp32 --rounds 2)" ||
    failed+=("scripts/perf_tables.py report/matrix_fp32")
fi

# report/README.md: the headline table, then each folder, what it is, and a link to each file.
headline=""
if [ "$has_torch" = 1 ]; then headline="$("$PY" scripts/headline.py report --write 2>&1)" || failed+=("scripts/headline.py"); fi
{
  echo "# Benchmark report"
  echo
  echo "Written by \`bash scripts/main.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), in $((SECONDS - t_start)) s."
  if [ -n "$headline" ]; then
    echo
    echo "## Headline: each operator against its best peer"
    echo
    echo "$headline"
  fi
  echo
  echo "## What each step took"
  echo
  echo '```'
  printf '%s\n' "${timings[@]}"
  echo '```'
  for dir in report/*/; do
    [ -d "$dir" ] || continue
    name="$(basename "$dir")"
    echo
    echo "## $name"
    echo
    echo "${what[$name]:-$name}"
    echo
    find "$dir" -type f | sort | while read -r f; do
      rel="${f#report/}"
      echo "- [$rel]($rel)"
    done
  done
} >report/README.md

echo "== what each step took"
printf '%s\n' "${timings[@]}"
echo "== the main job took $((SECONDS - t_start)) s; report: report/README.md (verify: report/verify.txt)"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "== failed: ${failed[*]}" >&2
fi
if [ -n "$headline" ]; then
  echo "== headline (report/headline.md)"
  echo "$headline"
fi
[ "${#failed[@]}" -eq 0 ]
