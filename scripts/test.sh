#!/usr/bin/env bash
# The test command: builds everything, runs the C++ tests (GPU tests skip without a GPU; their
# reasons are printed after the run), checks that a consumer project builds against the installed
# CMake package, installs the Python package into a fresh virtual environment and runs the Python
# tests.
#   bash scripts/test.sh            # from the repository root
# Environment: TESSERA_CUDA_ARCHITECTURES (default "80;90a"), BUILD_DIR (default build),
#              JOBS (default: all cores), PYTHON (default python3).
#
# The CUDA sources are compiled once: the C++ configuration (tests on, Python off; it has the
# install rules the consumer project needs) is built first, then the wheel is built by
# scikit-build-core in the same build directory. Its configuration differs only in adding the
# extension (and keeping the tests, so that they are not dropped and rebuilt on the next run), so
# the objects are reused and only the extension is compiled and the libraries relinked.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHS="${TESSERA_CUDA_ARCHITECTURES:-80;90a}"
BUILD="${BUILD_DIR:-build}"
case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac  # absolute: later steps change directory
JOBS="${JOBS:-$(nproc)}"
PY="${PYTHON:-python3}"
# The consumer project's find_package(CUDAToolkit) looks for nvcc on PATH.
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

# Both configurations must use one generator (CMake refuses to switch in a build directory), and
# scikit-build-core follows CMAKE_GENERATOR: take the directory's own, else Ninja where installed.
if [ -f "$BUILD/CMakeCache.txt" ]; then
  CMAKE_GENERATOR="$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$BUILD/CMakeCache.txt")"
fi
if [ -z "${CMAKE_GENERATOR:-}" ]; then
  if command -v ninja >/dev/null; then CMAKE_GENERATOR=Ninja; else CMAKE_GENERATOR="Unix Makefiles"; fi
fi
export CMAKE_GENERATOR
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"

echo "== C++ build ($ARCHS, $BUILD)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" \
      -DTESSERA_BUILD_TESTS=ON -DTESSERA_BUILD_PYTHON=OFF -DTESSERA_BUILD_CLI=ON >/dev/null
cmake --build "$BUILD" -j "$JOBS"

echo "== C++ tests"
# A failing C++ test does not stop the remaining steps; the command fails at the end.
rc=0
ctest --test-dir "$BUILD" --output-on-failure -j 1 --output-junit "$BUILD/ctest-junit.xml" || rc=$?
# ctest counts a GoogleTest skip as "Skipped" but hides GTEST_SKIP's message: print it from the
# test's output, which the JUnit file keeps ("<file>:<line>: Skipped", then the message).
"$PY" - "$BUILD/ctest-junit.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
except (OSError, ET.ParseError) as e:
    sys.exit(f"(no skip reasons: {e})")
skipped = []
for case in cases:
    if case.get("status") not in ("notrun", "disabled") and case.find("skipped") is None:
        continue
    out = (case.findtext("system-out") or "").splitlines()
    reason = []
    for i, line in enumerate(out):
        if line.rstrip().endswith(": Skipped"):
            for more in out[i + 1:]:
                if more.startswith("[  SKIPPED ]") or more.startswith("[       OK ]"):
                    break
                if more.strip():
                    reason.append(more.strip())
            break
    if not reason:
        tag = case.find("skipped")
        reason = [tag.get("message", "") if tag is not None else ""]
    skipped.append((case.get("name"), " ".join(r for r in reason if r) or "(no message)"))
if skipped:
    print(f"skipped C++ tests ({len(skipped)}):")
    for name, why in skipped:
        print(f"  {name}: {why}")
EOF

echo "== installed package: a consumer project"
cmake --install "$BUILD" --prefix "$BUILD/install" >/dev/null
cmake -S tests/consumer -B "$BUILD/consumer" -DCMAKE_PREFIX_PATH="$BUILD/install" >/dev/null
cmake --build "$BUILD/consumer" -j "$JOBS" >/dev/null
"$BUILD/consumer/consumer"
"$BUILD/install/bin/tessera" --help >/dev/null

echo "== Python package (the extension, in $BUILD)"
if [ ! -x "$BUILD/venv/bin/python" ]; then
  "$PY" -m venv "$BUILD/venv"
fi
"$BUILD/venv/bin/python" -m pip install -q --upgrade pip
"$BUILD/venv/bin/python" -m pip install -q scikit-build-core nanobind pytest numpy mypy
TESSERA_CUDA_ARCHITECTURES="$ARCHS" "$BUILD/venv/bin/python" -m pip install -q --no-build-isolation \
  --config-settings=build-dir="$BUILD" \
  --config-settings=cmake.define.TESSERA_BUILD_TESTS=ON \
  --config-settings=cmake.define.TESSERA_BUILD_CLI=ON .
echo "== Python tests"
PATH="$BUILD/venv/bin:$PATH" "$BUILD/venv/bin/python" -m pytest tests/python -q -rs
if [ "$rc" -ne 0 ]; then
  echo "C++ tests failed (ctest exit status $rc; the failures are listed above)" >&2
  exit "$rc"
fi
