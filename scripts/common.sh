# What scripts/test.sh, scripts/main.sh and .ci/run share (sourced, from the repository root):
# one virtual environment and one build directory, so that whichever command runs second
# compiles nothing that has not changed, and the build and test tools at the versions
# pyproject.toml pins.
#   ROOT, BUILD (BUILD_DIR, default build, absolute), VENV (the active virtual environment, else
#   .venv), PY (its python), and the functions below.

ROOT="$PWD"
BUILD="${BUILD_DIR:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac  # absolute: later steps change directory
VENV="${VIRTUAL_ENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
ARCHS="${TESSERA_CUDA_ARCHITECTURES:-80;90a}"

# Creates $VENV where it does not exist. --system-site-packages: the peers installed for the
# system Python (torch, Triton) stay visible, so the benchmarks compare against them and a torch
# already there is not downloaded again.
make_venv() {
  [ -x "$PY" ] && return 0
  echo "== creating the virtual environment $VENV"
  if ! "${PYTHON:-python3}" -m venv --system-site-packages "$VENV"; then
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

# pip install of the pinned lists named (build, test, torch) into $VENV; requirements already met
# are left alone, without network access.
install_pins() {
  local reqs=() line list
  for list in "$@"; do
    while IFS= read -r line; do reqs+=("$line"); done < <(pins "$list" "$PY")
  done
  "$PY" -m pip install -q "${reqs[@]}"
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
