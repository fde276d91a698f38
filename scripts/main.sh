#!/usr/bin/env bash
# The main job, on a machine with a GPU: build and install the Python package into a virtual
# environment, verify every operator against its CPU reference, then run every benchmark family
# against the peers that are installed (torch, torch.compile, Triton) and tessera's own suite,
# into report/ (tables, CSV, JSON, SVG plots; report/README.md lists them).
#   bash scripts/main.sh            # from anywhere
# Environment: VIRTUAL_ENV (an activated environment is used as it is; otherwise .venv in the
#              repository root is created or reused), TESSERA_CUDA_ARCHITECTURES (default
#              "80;90a"; "90a" alone builds about twice as fast), BUILD_DIR (the CMake build
#              directory; default pyproject.toml's build/<wheel tag>), PYTHON (the interpreter
#              that creates .venv; default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
export TESSERA_CUDA_ARCHITECTURES="${TESSERA_CUDA_ARCHITECTURES:-80;90a}"

# A stock Debian/Ubuntu python3 refuses `pip install` outside a virtual environment
# (externally-managed-environment), and pip's script folder need not be on PATH: install into a
# venv and call its programs by path.
if [ -n "${VIRTUAL_ENV:-}" ]; then
  VENV="$VIRTUAL_ENV"
else
  VENV="$ROOT/.venv"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating the virtual environment $VENV"
    # --system-site-packages: the peers installed for the system Python (torch, Triton) stay
    # visible, so they are benchmarked; tessera and its build tools go into the venv.
    if ! "${PYTHON:-python3}" -m venv --system-site-packages "$VENV"; then
      rm -rf "$VENV"
      echo "could not create $VENV: install Python's venv module (Debian/Ubuntu: apt-get install python3-venv)" >&2
      exit 1
    fi
    # Keeps git from listing the environment (what `python3 -m venv` does itself from 3.13 on).
    printf '*\n' >"$VENV/.gitignore"
  fi
fi
PY="$VENV/bin/python"
echo "== Python: $PY"

echo "== build dependencies"
# Only what is missing, so that a machine without network access that has them can still build.
deps=()
"$PY" -c "import scikit_build_core" 2>/dev/null || deps+=(scikit-build-core)
"$PY" -c "import nanobind" 2>/dev/null || deps+=(nanobind)
# CMake >= 3.24 and a build tool: from PyPI, into the venv, where the system has none fit.
cmake_ok() {
  local major minor
  read -r major minor < <(cmake --version 2>/dev/null |
    sed -n 's/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p') || return 1
  [ "$major" -gt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -ge 24 ]; }
}
if ! PATH="$VENV/bin:$PATH" cmake_ok; then deps+=(cmake); fi
if ! PATH="$VENV/bin:$PATH" command -v ninja >/dev/null; then deps+=(ninja); fi
if [ "${#deps[@]}" -gt 0 ]; then "$PY" -m pip install -q "${deps[@]}"; fi

echo "== building the CUDA library and the Python package (several minutes; architectures $TESSERA_CUDA_ARCHITECTURES)"
build_args=()
if [ -n "${BUILD_DIR:-}" ]; then build_args+=(--config-settings=build-dir="$BUILD_DIR"); fi
mkdir -p "$ROOT/build"
log="$ROOT/build/main-install.log"
# pip -v streams the build; show its stages and the build tool's [done/total] lines only, keep the
# rest in the log, and print the log's end if it fails.
{
  rc=0
  PATH="$VENV/bin:$PATH" "$PY" -m pip install -v --no-build-isolation "${build_args[@]}" . 2>&1 || rc=$?
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
for script in benchmarks/*.py; do
  name="$(basename "$script" .py)"
  [ "$name" = common ] && continue  # shared code, not a benchmark
  if [ "$has_torch" = 0 ] && grep -qE '^(import|from) torch' "$script"; then
    echo "== skipping $script: needs torch, which $PY cannot import"
    continue
  fi
  echo "== $script"
  rm -rf "report/$name"
  PATH="$VENV/bin:$PATH" "$PY" "$script" --out "report/$name"
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
