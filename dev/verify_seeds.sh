#!/usr/bin/env bash
# `tessera verify` over several seeds at once on the GPU machine (devbin/ or devbin-pack/ carried):
# each seed's output, every line prefixed with the seconds since its start, in
# $OUT/verify-seeds.tar.xz; then a summary: each seed's counts, every failure, the cases nearest
# their bounds over all seeds (rel_err / tol), and the seconds each op took (the first seed).
#   device: SEEDS="1 2 3 4 5" bash dev/verify_seeds.sh [OPS...]
# VERIFY_TIMEOUT: seconds each seed may take (default 420).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/verify-seeds"
if [ ! -d devbin ] && [ -f devbin-pack/devbin.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('devbin-pack/devbin.tar.xz').extractall('.')"
fi
export LD_LIBRARY_PATH=$PWD/devbin
SEEDS="${SEEDS:-1 2 3 4 5}"
for s in $SEEDS; do
  (
    t0=$SECONDS
    timeout "${VERIFY_TIMEOUT:-420}" devbin/tessera verify --seed "$s" "$@" 2>&1 |
      while IFS= read -r line; do echo "$((SECONDS - t0)) $line"; done >"$OUT/verify-seeds/seed$s.txt"
  ) &
done
wait
python3 -c "import tarfile; t = tarfile.open('$OUT/verify-seeds.tar.xz', 'w:xz'); t.add('$OUT/verify-seeds', 'verify-seeds'); t.close()"
python3 - "$OUT/verify-seeds" <<'EOF'
import collections, glob, os, re, sys
worst, fails, op_time = {}, [], collections.OrderedDict()
line_re = re.compile(r"^(\d+) (PASS|FAIL)  (\S+)\s+(.*?)\s+rel_err (\S+)\s.*tol (\S+)\s+\((\S+) of tol\)")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "seed*.txt"))):
    seed = os.path.basename(path)[4:-4]
    lines = open(path).read().splitlines()
    print(f"seed {seed}: {lines[-1] if lines else '(no output)'}")
    prev = 0
    for ln in lines:
        m = line_re.match(ln)
        if not m:
            continue
        t, verdict, op, name, ratio = int(m.group(1)), m.group(2), m.group(3), m.group(4), float(m.group(7))
        if seed == "1":
            op_time[op] = op_time.get(op, 0) + t - prev
            prev = t
        key = (op, name)
        if ratio > worst.get(key, (-1, ""))[0]:
            worst[key] = (ratio, seed)
        if verdict == "FAIL":
            fails.append(f"seed {seed}: {op} {name} ({ratio} of tol)")
print(f"{len(fails)} failures over all seeds")
for f in fails[:40]:
    print("  " + f)
print("nearest their bounds (max over seeds):")
for (op, name), (r, seed) in sorted(worst.items(), key=lambda kv: -kv[1][0])[:25]:
    print(f"  {r:7.3f}  seed {seed}  {op}  {name[:90]}")
print("largest ratio per op (max over seeds):")
per_op = {}
for (op, _), (r, _) in worst.items():
    per_op[op] = max(per_op.get(op, 0), r)
print("  " + ", ".join(f"{op} {r:.2f}" for op, r in per_op.items()))
print("seconds per op (seed 1): " + ", ".join(f"{op} {t}" for op, t in op_time.items()))
EOF
