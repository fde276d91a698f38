#!/usr/bin/env bash
# The test command: builds everything, runs the C++ tests (GPU tests skip without a GPU), checks
# that a consumer project builds against the installed CMake package, builds the Python package
# with its torch ops into the Python environment and runs the Python tests. Skipped tests are
# counted per reason; their full list goes to $BUILD/skipped-tests.txt.
#   bash scripts/test.sh            # from anywhere
# Environment: TESSERA_CUDA_ARCHITECTURES (default "80;90a"), BUILD_DIR (default build), JOBS
#              (default: all cores), PYTHON (default: python3 on PATH), TESSERA_TORCH=OFF (no
#              torch: the torch ops are neither built nor tested).
# The Python environment, the one scripts/main.sh uses (pick_env in scripts/common.sh): an
# activated one as it is; else that of $PYTHON or python3 where it is a virtual or conda
# environment that imports torch (a venv made from it would not see its packages); else .venv,
# made from that Python with its packages visible. A torch that imports is never installed
# again, nor a pinned tool already there: offline, what is installed suffices.
#
# The CUDA sources are compiled once: the C++ configuration (tests on, Python off; it has the
# install rules the consumer project needs) is built first, then the wheel is built by
# scikit-build-core in the same build directory, adding the extension and the torch ops; the
# objects are reused, and scripts/main.sh reuses them again.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
JOBS="${JOBS:-$(nproc)}"
# The consumer project's find_package(CUDAToolkit) looks for nvcc on PATH.
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
pick_generator
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
TORCH="${TESSERA_TORCH:-ON}"

# Each phase's wall time, printed as the next begins and listed at the end: where the command's
# minutes go.
SECONDS=0
phase_name="environment" phase_t0=0 phases=()
phase() {  # phase NAME: ends the running phase, starts NAME
  phases+=("$(printf '%-34s %5d s' "$phase_name" $((SECONDS - phase_t0)))")
  echo "== ($phase_name: $((SECONDS - phase_t0)) s)"
  phase_name=$1 phase_t0=$SECONDS
}

pick_env
make_venv
install_pins build test
if [ "$TORCH" != OFF ]; then
  if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "== torch from PyPI, for the torch ops (TESSERA_TORCH=OFF goes without)"
    install_pins torch
  fi
  echo "== torch $("$PY" -c 'import torch; print(torch.__version__)')"
  # After torch: these need it, and pip would otherwise bring the newest torch as their dependency.
  install_pins transformers-test
fi

phase "C++ build"
echo "== C++ build ($ARCHS, $BUILD)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" \
      -DTESSERA_BUILD_TESTS=ON -DTESSERA_BUILD_PYTHON=OFF -DTESSERA_BUILD_CLI=ON >/dev/null
cmake --build "$BUILD" -j "$JOBS"

phase "C++ tests"
echo "== C++ tests"
# A failing test does not stop the remaining steps; the command fails at the end. The run's
# whole output goes to $BUILD/ctest.log; here its summary, and the failures' output.
rc=0
ctest --test-dir "$BUILD" -j 1 --output-junit "$BUILD/ctest-junit.xml" >"$BUILD/ctest.log" 2>&1 || rc=$?
grep -E '^[0-9]+% tests passed' "$BUILD/ctest.log" || tail -n 5 "$BUILD/ctest.log"
if [ "$rc" -ne 0 ]; then
  ctest --test-dir "$BUILD" --rerun-failed --output-on-failure -j 1 || true
fi

phase "consumer project"
echo "== installed package: a consumer project"
cmake --install "$BUILD" --prefix "$BUILD/install" >/dev/null
cmake -S tests/consumer -B "$BUILD/consumer" -DCMAKE_PREFIX_PATH="$BUILD/install" >/dev/null
cmake --build "$BUILD/consumer" -j "$JOBS" >/dev/null
"$BUILD/consumer/consumer"
"$BUILD/install/bin/tessera" --help >/dev/null

phase "Python package"
if [ "$TORCH" != OFF ]; then
  echo "== Python package (the extension and the torch ops, in $BUILD)"
else
  echo "== Python package (the extension, in $BUILD)"
fi
install_package -q
if [ "$TORCH" != OFF ]; then
  # A torch that CMake could not use (another C++ ABI, no headers) builds no torch ops, quietly:
  # here it is an error.
  if ! "$PY" -c 'import os, tessera; d = os.path.dirname(tessera.__file__); raise SystemExit(not os.path.exists(os.path.join(d, "libtessera_torch.so")))'; then
    echo "the torch ops (libtessera_torch.so) were not built against $("$PY" -c 'import torch; print(torch.__file__)'): see the configure output in $BUILD" >&2
    exit 1
  fi
  echo "libtessera_torch.so built"
  export TESSERA_REQUIRE_TORCH_OPS=1  # tests that need the torch ops fail instead of skipping
fi

phase "Python tests"
echo "== Python tests"
prc=0
PATH="$VENV/bin:$PATH" "$PY" -m pytest tests/python -q -p no:cacheprovider \
  --junitxml="$BUILD/pytest-junit.xml" || prc=$?

# Skips, counted per reason (both runs); the full list in a file. ctest counts a GoogleTest skip
# as "Skipped" but keeps GTEST_SKIP's message in the test's output only ("<file>:<line>:
# Skipped", then the message).
"$PY" - "$BUILD/ctest-junit.xml" "$BUILD/pytest-junit.xml" "$BUILD/skipped-tests.txt" <<'EOF'
import collections, sys, xml.etree.ElementTree as ET


def reason_of(case):
    out = (case.findtext("system-out") or "").splitlines()
    for i, line in enumerate(out):
        if line.rstrip().endswith(": Skipped"):
            more = []
            for m in out[i + 1:]:
                if m.startswith("[  SKIPPED ]") or m.startswith("[       OK ]"):
                    break
                if m.strip():
                    more.append(m.strip())
            if more:
                return " ".join(more)
    tag = case.find("skipped")
    return (tag.get("message", "") if tag is not None else "") or "(no message)"


full = []
for kind, path in (("C++", sys.argv[1]), ("Python", sys.argv[2])):
    try:
        cases = list(ET.parse(path).getroot().iter("testcase"))
    except (OSError, ET.ParseError) as e:
        print(f"(no {kind} skip reasons: {e})")
        continue
    reasons = collections.Counter()
    for case in cases:
        if case.get("status") not in ("notrun", "disabled") and case.find("skipped") is None:
            continue
        why = reason_of(case)
        why = why[len("Skipped: "):] if why.startswith("Skipped: ") else why
        reasons[why] += 1
        name = ".".join(x for x in (case.get("classname"), case.get("name")) if x)
        full.append(f"{kind}\t{name}\t{why}")
    if reasons:
        print(f"skipped {kind} tests: {sum(reasons.values())} of {len(cases)}, by reason:")
        for why, n in reasons.most_common():
            print(f"  {n:5d}  {why[:150]}")
with open(sys.argv[3], "w") as f:
    f.write("\n".join(full) + "\n")
print(f"(each skipped test and its reason: {sys.argv[3]})")
EOF

phase "done"
echo "== what each phase took ($SECONDS s in all)"
printf '%s\n' "${phases[@]}"
if [ "$rc" -ne 0 ]; then
  echo "C++ tests failed (ctest exit status $rc; the failures are above, the whole run in $BUILD/ctest.log)" >&2
  exit "$rc"
fi
exit "$prc"
