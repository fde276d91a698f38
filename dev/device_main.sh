#!/usr/bin/env bash
# The main job on the lent GPU machine as a new user meets it: a fresh copy of the working tree
# (no build/, .venv/, report/ or staged binaries), then `bash scripts/main.sh` as the README writes
# it, with the machine's python3 (a virtual environment's interpreter, not activated) and no
# network. Liger-Kernel, where its wheel is carried in .whl/, goes onto PYTHONPATH first, as a
# user's installed peer. Logs, report/README.md, the headline table and the whole report (packed)
# land in $OUT.
#   device: bash dev/device_main.sh            (carry [".whl"] for Liger-Kernel)
# MAIN_TIMEOUT: seconds main.sh may take (default 570).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site
fi
{
  echo "python3: $(command -v python3) ($(python3 -c 'import sys; print(sys.prefix, "venv" if sys.prefix != sys.base_prefix else "")'))"
  echo "VIRTUAL_ENV=${VIRTUAL_ENV:-} CONDA_PREFIX=${CONDA_PREFIX:-}"
  nproc
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
} >"$OUT/env.txt" 2>&1
fresh=/tmp/fresh
rm -rf "$fresh" && mkdir -p "$fresh"
tar --exclude=./build --exclude='./build-*' --exclude=./.venv --exclude=./report --exclude='./devbin*' \
  --exclude=./devwheel --exclude=./.whl --exclude=./.git -cf - . | tar -C "$fresh" -xf -
cd "$fresh" || exit
unset VIRTUAL_ENV
t0=$SECONDS
timeout "${MAIN_TIMEOUT:-570}" bash scripts/main.sh >"$OUT/main.log" 2>&1
rc=$?
echo "main.sh exit status $rc in $((SECONDS - t0)) s" | tee -a "$OUT/main.log"
[ -f report/README.md ] && cp report/README.md "$OUT/report-README.md"
[ -f report/verify.txt ] && cp report/verify.txt "$OUT/verify.txt"
[ -f build/main-install.log ] && tail -n 200 build/main-install.log >"$OUT/install-tail.log"
python3 -c "import tarfile; t = tarfile.open('$OUT/report.tar.xz', 'w:xz'); t.add('report'); t.close()" 2>/dev/null
# verify's cases nearest their bounds (rel_err / tol), the margin the error model leaves
grep -E '^(PASS|FAIL)' report/verify.txt 2>/dev/null | sed -n 's/.*(\([0-9.e+inf-]*\) of tol).*/\1 &/p' |
  sort -g -r | head -n 12 | cut -c1-200
grep -E '^FAIL|closest|passed,' report/verify.txt 2>/dev/null | head -20
# the build's longest objects (its critical path on this machine's cores)
for f in $(find build -name .ninja_log 2>/dev/null); do cp "$f" "$OUT/ninja_log_$(echo "$f" | tr / _)"; done
cat $(find build -name .ninja_log 2>/dev/null) 2>/dev/null | awk '!/^#/ {printf "%7.1f s  %s\n", ($2 - $1) / 1000, $4}' |
  sort -rn | head -n 12
sed -n '/== what each step took/,$p' "$OUT/main.log" | head -60
tail -n 5 "$OUT/main.log"
# Then, where asked (AFTER="cmd; cmd"), commands in the fresh copy with what main.sh installed
# (pytest files, a benchmark), each line's output in $OUT/after.txt, its tail printed.
if [ -n "${AFTER:-}" ]; then
  timeout "${AFTER_TIMEOUT:-200}" bash -c "export PATH=\"$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):\$PATH\"; $AFTER" >"$OUT/after.txt" 2>&1
  echo "after: exit status $?"; tail -n 40 "$OUT/after.txt" | cut -c1-200
fi
# Then, where asked, verify of some ops over more seeds with the command main.sh installed
# (SEEDS_OPS="softmax cross_entropy" SEEDS="1 2 3 4 5"), the seeds at once.
if [ -n "${SEEDS_OPS:-}" ]; then
  tessera="$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/tessera"
  for s in ${SEEDS:-1 2 3 4 5}; do
    timeout "${SEEDS_TIMEOUT:-60}" "$tessera" verify $SEEDS_OPS --seed "$s" >"/tmp/seed$s.txt" 2>&1 &
  done
  wait
  for s in ${SEEDS:-1 2 3 4 5}; do echo "== seed $s"; cat "/tmp/seed$s.txt"; done >"$OUT/seeds.txt"
  for s in ${SEEDS:-1 2 3 4 5}; do echo "seed $s: $(grep -E 'closest' "/tmp/seed$s.txt" | cut -c1-150); $(tail -n 1 "/tmp/seed$s.txt")"; done
  grep -h '^FAIL' /tmp/seed*.txt | cut -c1-200
fi
