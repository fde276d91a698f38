#!/usr/bin/env bash
# The measured cost of the ptxas spills that remain (docs/DESIGN.md, "Build cost and register
# spills"): one launch of each spilling kernel instance the CLI can reach, under Nsight Compute.
# Per launch: duration, local-memory bytes through L1 and the part of them that misses L1 (goes to
# L2), beside the kernel's global traffic through L1 (LSU loads and stores), its whole L2 traffic
# (TMA kernels move their operands past the LSU) and DRAM bytes. Device run, devbin/ carried (or
# devbin-pack/, unpacked here):
#   bash dev/ncu_spills.sh
# Writes $OUT/ncu_spills.csv (one row per launch) and prints a table; the raw ncu CSVs go into
# $OUT/ncu_spills.tgz. Caches are flushed before the kernel (ncu's default); clocks are not locked.
# About 2 minutes (13 launches, each call cut at 60 s).
#
# What the CLI cannot select, and so is not here: attention_bwd_sm90_kernel with both the soft-cap
# and ALiBi (no bench or verify case has both at head_dim 128); the sm_80-only spills (the H200 runs
# the sm_90a code); the ring-of-2 norm_backward instances that sm_90 routes to the staged tier.
# Two come from a verify case, the only call that selects them (small problems): gemm_f32_kernel
# with a row-major other operand, and scaled_mm with a float32 output.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT="${OUT:-/tmp/out}"
RAW="$OUT/ncu_spills"
mkdir -p "$RAW"
if [ ! -d devbin ] && [ -f devbin-pack/devbin.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('devbin-pack/devbin.tar.xz').extractall('.')"
fi
export LD_LIBRARY_PATH=$PWD/devbin

want=(gpu__time_duration.sum launch__registers_per_thread launch__grid_size launch__block_size
      l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum
      l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_miss.sum
      l1tex__t_sectors_pipe_lsu_mem_local_op_st_lookup_miss.sum
      lts__t_bytes_equiv_l1sectormiss_pipe_lsu_mem_local_op_ld.sum
      lts__t_bytes_equiv_l1sectormiss_pipe_lsu_mem_local_op_st.sum
      l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum
      lts__t_bytes.sum dram__bytes_read.sum dram__bytes_write.sum
      smsp__sass_inst_executed_op_local_ld.sum smsp__sass_inst_executed_op_local_st.sum)
# Only the metrics this GPU and ncu know: one unknown name would fail every launch.
known=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
metrics=""
for m in "${want[@]}"; do
  if [ -z "$known" ] || [[ $m == launch__* ]] || grep -qx "${m%%.*}" <<<"$known"; then metrics+="${metrics:+,}$m"
  else echo "ncu_spills: metric ${m%%.*} not offered here, left out"; fi
done

# label | environment | kernel regex (on the mangled name: demanglers differ) | launches skipped |
# instance expected (demangled) | tessera arguments
rows=(
  "gemm sm90 pingpong f32-out (tf32)|TESSERA_MATMUL_SCHEDULE=pingpong|gemm_sm90_kernelIffNS1_8ScheduleILi128ELb1EEE|2|gemm_sm90_kernel<float, float, tessera::matrix::sm90::Schedule<128, true>, true, true>|bench matmul_tf32 --dtype float32 --sizes 4096 --reps 3 --no-peaks"
  "gemm sm90 cooperative f32-out (tf32, no spill)|TESSERA_MATMUL_SCHEDULE=cooperative|gemm_sm90_kernelIffNS1_8ScheduleILi256ELb0EEE|2|gemm_sm90_kernel<float, float, tessera::matrix::sm90::Schedule<256, false>, true, true>|bench matmul_tf32 --dtype float32 --sizes 4096 --reps 3 --no-peaks"
  "gemm sm90 pingpong f32-out (fp8 e4m3, verify 300x208x528)||gemm_sm90_kernelI13__nv_fp8_e4m3fNS1_8ScheduleILi128ELb1EEE|0|gemm_sm90_kernel<__nv_fp8_e4m3, float, tessera::matrix::sm90::Schedule<128, true>, true, true>|verify scaled_mm"
  "gemm_f32 <true,false> (verify case 200x150x300)||gemm_f32_kernelILb1ELb0E|0|gemm_f32_kernel<true, false>|verify matmul"
  "norm fwd add LN bf16 prefetch VPT4||norm_forward_kernel|2|norm_forward_kernel<__nv_bfloat16, 8, 4, false, true, 0, true>|bench add_layer_norm --dtype bfloat16 --sizes 4096 --reps 3 --no-peaks"
  "norm fwd add LN bf16 VPT4||norm_forward_kernel|2|norm_forward_kernel<__nv_bfloat16, 8, 4, false, true, 0, false>|bench add_layer_norm --dtype bfloat16 --sizes 16384 --reps 3 --no-peaks"
  "norm fwd add RMS bf16 prefetch VPT4||norm_forward_kernel|2|norm_forward_kernel<__nv_bfloat16, 8, 4, true, true, 0, true>|bench add_rms_norm --dtype bfloat16 --sizes 4096 --reps 3 --no-peaks"
  "norm fwd add LN f32 prefetch VPT4||norm_forward_kernel|2|norm_forward_kernel<float, 4, 4, false, true, 0, true>|bench add_layer_norm --dtype float32 --sizes 2048 --reps 3 --no-peaks"
  "norm fwd RMS f32 VPT8 group 32||norm_forward_kernel|2|norm_forward_kernel<float, 4, 8, true, false, 32, false>|bench rms_norm --dtype float32 --sizes 1024 --reps 3 --no-peaks"
  "norm bwd LN fp16 ring 2 VPT2||norm_backward_kernel|2|norm_backward_kernel<__half, 8, 2, false, false, 2, 1024>|bench layer_norm_backward --dtype float16 --sizes 16384 --reps 3 --no-peaks"
  "norm bwd add LN fp16 ring 2 VPT2||norm_backward_kernel|2|norm_backward_kernel<__half, 8, 2, false, true, 2, 1024>|bench add_layer_norm_backward --dtype float16 --sizes 16384 --reps 3 --no-peaks"
  "norm bwd add LN bf16 staged 256x2||norm_backward_staged_kernel|2|norm_backward_staged_kernel<__nv_bfloat16, 8, 4, false, true, 256, 2>|bench add_layer_norm_backward --dtype bfloat16 --sizes 8192 --reps 3 --no-peaks"
  "norm bwd add LN bf16 staged 512x1||norm_backward_staged_kernel|2|norm_backward_staged_kernel<__nv_bfloat16, 8, 4, false, true, 512, 1>|bench add_layer_norm_backward --dtype bfloat16 --sizes 16384 --reps 3 --no-peaks"
)

i=0
for row in "${rows[@]}"; do
  IFS='|' read -r label env regex skip expect args <<<"$row"
  i=$((i + 1))
  f="$RAW/$i.csv"
  printf '%s\n%s\n' "$label" "$expect" > "$RAW/$i.what"
  # shellcheck disable=SC2086  # args and env are word lists
  timeout 60 env $env ncu --clock-control none --csv --print-units base --kernel-name-base mangled \
      --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 --metrics "$metrics" \
      devbin/tessera $args > "$f" 2>&1
  echo "ncu_spills: $i/${#rows[@]} $label (rc $?)"
done

python3 - "$RAW" "${#rows[@]}" "$OUT/ncu_spills.csv" <<'PY'
import csv, re, sys
raw, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def plain(name):  # template arguments as c++filt writes them: ncu's may read (bool)1, (int)8
    name = name.replace("(bool)1", "true").replace("(bool)0", "false")
    return re.sub(r"\((?:unsigned |signed )?(?:int|long|short|char)[a-z ]*\)(-?\d+)", r"\1", name)


def same_instance(expect, name):
    """ncu demangles without namespaces and with bools as 1 and 0: compare the two that way."""
    def norm(text):
        text = re.sub(r"\b(?:[A-Za-z_]\w*::)+", "", text)
        text = re.sub(r"\btrue\b", "1", re.sub(r"\bfalse\b", "0", text))
        return text.replace(" ", "").replace("(anonymousnamespace)", "")
    return norm(expect) in norm(name)


cols = ["label", "instance_ok", "kernel", "us", "regs", "grid", "block", "local_ld_B", "local_st_B",
        "local_l1_miss_B", "local_l2_B", "global_l1_B", "l2_B", "dram_B", "local_ld_inst", "local_st_inst",
        "local_of_l1_pct", "local_miss_of_l2_pct"]
table = []
for i in range(1, n + 1):
    label, expect = open(f"{raw}/{i}.what").read().splitlines()[:2]
    lines = open(f"{raw}/{i}.csv", errors="replace").read().splitlines()
    start = next((k for k, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        table.append({"label": label, "kernel": "no launch profiled: " + (lines[-1][:80] if lines else "no output")})
        continue
    m, name = {}, ""
    for r in csv.DictReader(lines[start:]):
        name = plain(r["Kernel Name"])
        m[r["Metric Name"]] = r["Metric Value"].replace(",", "")
    num = lambda k: float(m[k]) if m.get(k, "") not in ("", "n/a") else float("nan")
    ld, st = num("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"), num("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum")
    miss = 32 * (num("l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_miss.sum") +
                 num("l1tex__t_sectors_pipe_lsu_mem_local_op_st_lookup_miss.sum"))
    l2loc = (num("lts__t_bytes_equiv_l1sectormiss_pipe_lsu_mem_local_op_ld.sum") +
             num("lts__t_bytes_equiv_l1sectormiss_pipe_lsu_mem_local_op_st.sum"))
    glob = num("l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum") + num("l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum")
    l2 = num("lts__t_bytes.sum")
    pct = lambda a, b: 100 * a / b if b == b and b > 0 else float("nan")
    table.append({
        "label": label, "instance_ok": "yes" if same_instance(expect, name) else "NO", "kernel": name[:name.rfind(">(") + 1] or name,
        "us": num("gpu__time_duration.sum") / 1e3, "regs": m.get("launch__registers_per_thread", ""),
        "grid": m.get("launch__grid_size", ""), "block": m.get("launch__block_size", ""),
        "local_ld_B": ld, "local_st_B": st, "local_l1_miss_B": miss, "local_l2_B": l2loc, "global_l1_B": glob,
        "l2_B": l2, "dram_B": num("dram__bytes_read.sum") + num("dram__bytes_write.sum"),
        "local_ld_inst": m.get("smsp__sass_inst_executed_op_local_ld.sum", ""),
        "local_st_inst": m.get("smsp__sass_inst_executed_op_local_st.sum", ""),
        "local_of_l1_pct": pct(ld + st, ld + st + glob), "local_miss_of_l2_pct": pct(miss, l2)})
with open(out, "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=cols)
    w.writeheader()
    for r in table:
        w.writerow(r)
print(f"{'spilling kernel (launch measured)':<48} {'inst':>4} {'us':>8} {'reg':>4} {'local L1 KB':>11} "
      f"{'of L1 %':>8} {'to L2 KB':>9} {'of L2 %':>8} {'L2 MB':>8} {'DRAM MB':>8}")
for r in table:
    if "us" not in r:
        print(f"{r['label']:<48} {r['kernel']}")
        continue
    print(f"{r['label'][:48]:<48} {r['instance_ok']:>4} {r['us']:8.1f} {r['regs']:>4} "
          f"{(r['local_ld_B'] + r['local_st_B']) / 1024:11.1f} {r['local_of_l1_pct']:8.2f} "
          f"{r['local_l1_miss_B'] / 1024:9.1f} {r['local_miss_of_l2_pct']:8.3f} {r['l2_B'] / 1e6:8.1f} "
          f"{r['dram_B'] / 1e6:8.1f}")
print("inst: the launch measured is the spilling instance named in the script (else: which ran is in the CSV)")
PY
tar -C "$OUT" -czf "$OUT/ncu_spills.tgz" ncu_spills && rm -rf "$RAW"
