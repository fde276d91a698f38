# Sourced by the per-family device scripts (device_attention.sh, device_loss.sh): devbin/ from
# devbin-pack where only the pack was carried, the Python package installed (dev/devwheel.sh)
# with devbin's libraries and command laid into it, and step(), which runs one step under
# STEP_TIMEOUT (default $DEFAULT_STEP_TIMEOUT, else 900 s) with its log in $OUT/NAME.log and a
# summary line kept for print_summary.
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if [ ! -d devbin ] && [ -f devbin-pack/devbin.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('devbin-pack/devbin.tar.xz').extractall('.')"
fi
export LD_LIBRARY_PATH=$PWD/devbin
bash dev/devwheel.sh >"$OUT/install.log" 2>&1
pkg=$(cd /tmp && python3 -c "import importlib.util as u; print(u.find_spec('tessera').submodule_search_locations[0])")
cp devbin/libtessera.so devbin/libtessera_harness.so "$pkg"/ && mkdir -p "$pkg/bin" && cp devbin/tessera "$pkg/bin/"

summary=()
step() {  # step NAME CMD...: run with a time limit, log to $OUT/NAME.log, record the last line
  local name=$1; shift
  local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-${DEFAULT_STEP_TIMEOUT:-900}}" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-8s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)")")
}
print_summary() { printf '%s\n' "${summary[@]}"; }
