#!/usr/bin/env bash
# Kernel time of tessera's norm forward next to torch.compile's (the Inductor/Triton kernel),
# both under Nsight Compute (caches flushed before each kernel, so no launch overhead and no L2
# carry-over), for "op dtype N" specs with 4096 rows; op is layer_norm or rms_norm. Device run,
# devbin/ carried:   bash dev/ncu_norm_peer.sh "rms_norm bfloat16 8192" "layer_norm float32 4096"
# Prints one line per spec: each kernel's last two calls in us, and the ratio of the better of
# each (above 1: tessera's kernel is faster) and leaves
# Inductor's generated code in $OUT/inductor.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/inductor"
export LD_LIBRARY_PATH=$PWD/devbin
peer=$(mktemp /tmp/norm_peer.XXXXXX.py)
cat >"$peer" <<'PY'
# Compiles F.layer_norm / F.rms_norm for one shape (eps as benchmarks/rowwise.py), saves the
# generated code, then calls the compiled function twice for ncu.
import sys, torch, torch.nn.functional as F
from torch._inductor.utils import run_and_get_code
op, dtype, n, out = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x = torch.randn(4096, n, device="cuda", dtype=dtype)
w = torch.randn(n, device="cuda", dtype=dtype)
b = torch.randn(n, device="cuda", dtype=dtype)
fn = (lambda x: F.layer_norm(x, (n,), w, b, 1e-5)) if op == "layer_norm" else (lambda x: F.rms_norm(x, (n,), w, 1e-6))
cfn = torch.compile(fn, dynamic=False)
_, code = run_and_get_code(cfn, x)
open(f"{out}/{op}_{sys.argv[2]}_{n}.py", "w").write("\n\n".join(code))
for _ in range(2):
    cfn(x)
torch.cuda.synchronize()
PY
# Kernel durations (us) of the ncu CSV on stdin, the last two calls: "a/b".
last_two() {
  python3 -c '
import csv, sys
lines = sys.stdin.read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith("\"ID\"")), None)
ts = [float(r["Metric Value"].replace(",", "")) / 1e3 for r in csv.DictReader(lines[start:])] if start is not None else []
print("/".join(f"{t:.1f}" for t in ts[-2:]) or "none", min(ts[-2:]) if ts else 0)'
}
printf '%-28s %14s %14s %8s\n' "spec" "tessera us" "inductor us" "ind/tes"
for spec in "$@"; do
  set -- $spec
  m=(--clock-control none --csv --print-units base --metrics gpu__time_duration.sum)
  read -r tess tess_min < <(ncu "${m[@]}" -k regex:norm_forward devbin/tessera profile "$1" --dtype "$2" --size "$3" 2>/dev/null | last_two)
  # Compiled once outside ncu (Inductor's caches then serve the profiled run); only this process
  # is profiled, not Inductor's compile workers.
  python3 "$peer" "$1" "$2" "$3" "$OUT/inductor" >/dev/null 2>&1
  read -r peer_us peer_min < <(ncu "${m[@]}" --target-processes application-only -k regex:triton python3 "$peer" "$1" "$2" \
      "$3" "$OUT/inductor" 2>/dev/null | last_two)
  ratio=$(python3 -c "print(f'{$peer_min / $tess_min:.3f}' if $tess_min > 0 else '-')")
  printf '%-28s %14s %14s %8s\n' "$spec" "$tess" "$peer_us" "$ratio" | tee -a "$OUT/ncu_norm_peer.txt"
done
rm -f "$peer"
tar -C "$OUT" -czf "$OUT/inductor.tgz" inductor && rm -rf "$OUT/inductor"
