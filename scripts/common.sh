# What scripts/test.sh, scripts/main.sh and .ci/run share (sourced, from the repository root):
# one Python environment and one build directory, so that whichever command runs second
# compiles nothing that has not changed, and the build and test tools at the versions
# pyproject.toml pins.
#   ROOT, BUILD (BUILD_DIR, default build, absolute), and the functions below; pick_env sets
#   VENV (the environment's prefix), PY (its python) and BASE_PY.

ROOT="$PWD"
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="${BUILD_DIR:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac  # absolute: later steps change directory
ARCHS="${TESSERA_CUDA_ARCHITECTURES:-80;90a}"

# The architectures main.sh builds: TESSERA_CUDA_ARCHITECTURES where set; else those the build
# directory was configured with (test.sh's, so nothing is compiled twice); else the GPU's own, one
# architecture instead of two (sm_90a on Hopper, sm_80 on the A100 and other 8.x GPUs, which run
# sm_80 code); else the default.
gpu_archs() {
  if [ -n "${TESSERA_CUDA_ARCHITECTURES:-}" ]; then echo "$TESSERA_CUDA_ARCHITECTURES"; return; fi
  local cached cap
  cached="$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)"
  if [ -n "$cached" ]; then echo "$cached"; return; fi
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ' || true)"
  case "$cap" in
    9.0) echo 90a ;;
    8.*) echo 80 ;;
    *) echo "$ARCHS" ;;
  esac
}

# Chooses the Python environment, and says in one line which and why. An activated virtual
# environment ($VIRTUAL_ENV) is used as it is. Else, of $PYTHON or python3 on PATH: its own
# environment where that is a virtual or conda environment (activated or not) that imports torch,
# tessera going into it (a venv made from it would see its base interpreter's packages, not its
# own); else $ROOT/.venv, made from it by make_venv (on a system Python that imports torch, it
# sees that torch; where none imports, scripts/test.sh installs the pinned one there). The rule
# is pick in scripts/pyenv.py. TESSERA_ENV_PROBE: a module to look for other than torch (the
# tests' stand-in).
pick_env() {
  local py="${PYTHON:-python3}" name='python3' out why
  if [ -n "${PYTHON:-}" ]; then name="\$PYTHON"; fi
  if [ -n "${VIRTUAL_ENV:-}" ]; then py="$VIRTUAL_ENV/bin/python" name="\$VIRTUAL_ENV"; fi
  if [ -n "${VIRTUAL_ENV:-}" ] && [ ! -x "$py" ]; then
    echo "the activated virtual environment \$VIRTUAL_ENV=$VIRTUAL_ENV has no bin/python" >&2
    return 1
  elif ! command -v "$py" >/dev/null; then
    echo "no Python interpreter: $py not found (install Python >= 3.10, or name one in \$PYTHON)" >&2
    return 1
  fi
  out="$("$py" "$SCRIPTS/pyenv.py" pick "$ROOT" "$name" "${TESSERA_ENV_PROBE:-torch}")" || {
    echo "$py could not run scripts/pyenv.py (tessera needs Python >= 3.10)" >&2
    return 1
  }
  { read -r VENV; read -r PY; read -r BASE_PY; read -r why; } <<<"$out"
  echo "== Python: $PY ($why)"
}

# Creates $VENV where it does not exist, from $BASE_PY. --system-site-packages: the peers
# installed for that Python (torch, Triton) stay visible, so the benchmarks compare against them
# and a torch already there is not downloaded again.
make_venv() {
  [ -x "$PY" ] && return 0
  echo "== creating the virtual environment $VENV"
  if ! "$BASE_PY" -m venv --system-site-packages "$VENV"; then
    rm -rf "$VENV"
    echo "could not create $VENV: install Python's venv module (Debian/Ubuntu: apt-get install python3-venv)" >&2
    return 1
  fi
  # Keeps git from listing the environment (what `python3 -m venv` does itself from 3.13 on).
  printf '*\n' >"$VENV/.gitignore"
}

# The requirement strings of pyproject.toml's lists: `pins build` (build-system.requires),
# `pins test`, `pins torch` (optional dependencies). Read with a pattern, not tomllib, which
# Python 3.10 lacks.
pins() {
  "${2:-python3}" - "$1" <<'EOF'
import ast, re, sys
text = open("pyproject.toml").read()
key = "requires" if sys.argv[1] == "build" else sys.argv[1]
m = re.search(rf"^{key} = (\[.*?\])", text, re.M | re.S)
if not m:
    sys.exit(f"pyproject.toml has no list {key!r}")
print("\n".join(ast.literal_eval(m.group(1))))
EOF
}

# The pinned lists named (build, test, torch) that $PY lacks, pip-installed into $VENV. What is
# installed is kept, even at a version outside its pin (with a warning): offline, nothing already
# there needs the network.
install_pins() {
  local reqs=() line list out
  for list in "$@"; do
    out="$(pins "$list" "$PY")" || return 1
    while IFS= read -r line; do reqs+=("$line"); done <<<"$out"
  done
  out="$("$PY" "$SCRIPTS/pyenv.py" unmet "${reqs[@]}")" || return 1
  reqs=()
  while IFS= read -r line; do [ -n "$line" ] && reqs+=("$line"); done <<<"$out"
  if [ "${#reqs[@]}" -gt 0 ]; then pip_install "${reqs[@]}"; fi
}

# pip install of requirements into $VENV. Where pip cannot (offline, no pip), the message names
# what is missing and the command that installs it.
pip_install() {
  echo "== pip install $*"
  if ! "$PY" -m pip install -q "$@"; then
    echo "missing from $VENV: $*; pip could not install it (see above). Install it with:" >&2
    echo "  $PY -m pip install$(printf " '%s'" "$@")" >&2
    return 1
  fi
}

# CMake >= 3.24 on PATH (Ubuntu 22.04 ships 3.22).
cmake_ok() {
  local major minor
  read -r major minor < <(cmake --version 2>/dev/null |
    sed -n 's/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p') || return 1
  [ "$major" -gt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -ge 24 ]; }
}

# The CMake generator: the build directory's own (CMake refuses to switch in one), else Ninja
# where installed. scikit-build-core follows CMAKE_GENERATOR too.
pick_generator() {
  if [ -f "$BUILD/CMakeCache.txt" ]; then
    CMAKE_GENERATOR="$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$BUILD/CMakeCache.txt")"
  fi
  if [ -z "${CMAKE_GENERATOR:-}" ]; then
    if command -v ninja >/dev/null; then CMAKE_GENERATOR=Ninja; else CMAKE_GENERATOR="Unix Makefiles"; fi
  fi
  export CMAKE_GENERATOR
}

# pip install of the package from the source tree, in $BUILD: the configuration test.sh left
# there (its tests and command kept), so nothing already compiled is compiled again.
install_package() {
  local tests=OFF
  if grep -q '^TESSERA_BUILD_TESTS:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then tests=ON; fi
  TESSERA_CUDA_ARCHITECTURES="$ARCHS" PATH="$VENV/bin:$PATH" "$PY" -m pip install "$@" --no-build-isolation \
    --config-settings=build-dir="$BUILD" \
    --config-settings=cmake.define.TESSERA_BUILD_TESTS="$tests" \
    --config-settings=cmake.define.TESSERA_BUILD_CLI=ON .
}
