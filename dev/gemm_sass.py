#!/usr/bin/env python3
"""What the GEMM kernels compiled to: per sm90 kernel instance, its registers, local memory (spills)
and the warpgroup-MMA instructions of its SASS (HGMMA for 16-bit and tf32, QGMMA for fp8).

    python3 dev/gemm_sass.py [LIB]     # LIB: devbin/libtessera.so; needs cuobjdump (CUDA)

Prints one line per kernel instance: the kernel's template arguments, REG, STACK/LOCAL bytes, and
each distinct *GMMA opcode with its count.
"""
import collections
import re
import subprocess
import sys


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines()


def main() -> int:
    lib = sys.argv[1] if len(sys.argv) > 1 else "devbin/libtessera.so"
    res = subprocess.run(["cuobjdump", "-res-usage", lib], capture_output=True, text=True).stdout
    usage = {}
    fn = None
    for line in res.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            fn = m.group(1)
        elif fn and "REG:" in line:
            usage[fn] = line.strip()
            fn = None
    sass = subprocess.run(["cuobjdump", "-sass", lib], capture_output=True, text=True).stdout
    gmma = collections.defaultdict(collections.Counter)
    fn = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"\b([HQ]GMMA\.\S+)", line)
        if fn and m:
            gmma[fn][m.group(1).rstrip(",;")] += 1
    names = [f for f in usage if "gemm_sm90_kernel" in f]
    for mangled, pretty in zip(names, demangle(names)):
        args = pretty[pretty.find("<") + 1:pretty.rfind(">")] if "<" in pretty else pretty
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(gmma[mangled].items())) or "no GMMA"
        print(f"{args}\n    {usage[mangled]}\n    {ops}")
    return 0 if names else 1


if __name__ == "__main__":
    sys.exit(main())
