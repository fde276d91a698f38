#!/usr/bin/env bash
# The main job, on a machine with a GPU: build and install the Python package into the Python
# environment, verify every operator against its CPU reference, then run every benchmark family
# against the peers that are installed (torch, torch.compile, Triton) and tessera's own suite,
# into report/ (tables, CSV, JSON, SVG plots; report/README.md lists them).
#   bash scripts/main.sh            # from anywhere
# Environment: TESSERA_CUDA_ARCHITECTURES (default "80;90a"; "90a" alone builds faster),
#              BUILD_DIR (the CMake build directory, shared with scripts/test.sh; default build),
#              PYTHON (default: python3 on PATH).
# The Python environment, as scripts/test.sh picks it (pick_env in scripts/common.sh): an
# activated one as it is; else that of $PYTHON or python3 where it is a virtual or conda
# environment that imports torch; else .venv in the repository root, created or reused, with that
# Python's packages visible. Offline, build tools already installed suffice.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
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

echo "== tessera info"
"$TESSERA" info
echo "== tessera verify"
"$TESSERA" verify

mkdir -p report
has_torch=0
if "$PY" -c "import torch" 2>/dev/null; then has_torch=1; fi
describe() {  # the first line of a benchmark script's docstring
  "$PY" -c 'import ast, sys; d = ast.get_docstring(ast.parse(open(sys.argv[1]).read())) or ""; print((d.splitlines() or [""])[0])' "$1"
}
declare -A what=([tessera]="tessera bench: every operator over its dtypes and sizes, in GB/s, TFLOP/s and % of the GPU's measured peaks")
# Arguments beyond --out, per benchmark. llama_step: one round (each round compiles the model
# twice), the small model on a GPU under 32 GiB, and the kernel profile for its per-category
# table and plot.
declare -A bench_args=([llama_step]="--quick --profile" [llama_ops]="--rounds 3")
# llama_step reports a failed run (an op missing, out of memory) in its table and exits 1: the
# report goes on, and main.sh exits 1 at its end. Any other benchmark failing stops main.sh.
status=0
for script in benchmarks/*.py; do
  name="$(basename "$script" .py)"
  [ "$name" = common ] && continue  # shared code, not a benchmark
  [ "$name" = llama_report ] && continue  # llama_step's report and plots, not a benchmark
  if [ "$has_torch" = 0 ] && grep -qE '^(import|from) torch' "$script"; then
    echo "== skipping $script: needs torch, which $PY cannot import"
    continue
  fi
  echo "== $script"
  rm -rf "report/$name"
  read -ra extra <<<"${bench_args[$name]:-}"
  rc=0
  PATH="$VENV/bin:$PATH" "$PY" "$script" --out "report/$name" ${extra[@]+"${extra[@]}"} || rc=$?
  if [ "$rc" != 0 ]; then
    [ "$name" = llama_step ] || exit "$rc"
    echo "== $script exited with status $rc (a run failed or disagreed: report/$name/llama_step.md)" >&2
    status=1
  fi
  what[$name]="benchmarks/$name.py: $(describe "$script")"
done
echo "== tessera bench"
rm -rf report/tessera
"$TESSERA" bench --out report/tessera

# report/README.md: each folder, what it is, and a link to each file in it.
{
  echo "# Benchmark report"
  echo
  echo "Written by \`bash scripts/main.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC')."
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
echo "== report: report/README.md"
exit "$status"
