#!/usr/bin/env python3
"""The call tree under one function of dev/sampler's raw samples (X.txt.raw from
dev/sample_host.py): per callee, the samples that pass through it, down to --depth levels and
--min samples. Frames named lib+0xOFFSET are symbolized with addr2line where --lib NAME=PATH gives
the library (the same build as the device's).

    python dev/sample_tree.py FILE.raw --root 'Engine::evaluate_function' [--lib libtorch_cpu.so=PATH]
"""
import argparse
import collections
import re
import subprocess


def symbolizer(libs):
    cache = {}

    def name(frame):
        m = re.fullmatch(r"(\S+?)\+(0x[0-9a-f]+)", frame)
        if not m or m.group(1) not in libs:
            return frame
        if frame not in cache:
            out = subprocess.run(["addr2line", "-f", "-C", "-e", libs[m.group(1)], hex(int(m.group(2), 16) - 1)],
                                 capture_output=True, text=True).stdout.split("\n")[0]
            cache[frame] = f"{m.group(1).split('.')[0]}:{out}"
        return cache[frame]
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw")
    ap.add_argument("--root", required=True)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--min", type=int, default=5)
    ap.add_argument("--lib", action="append", default=[])
    ap.add_argument("--width", type=int, default=150)
    a = ap.parse_args()
    name = symbolizer(dict(kv.split("=", 1) for kv in a.lib))
    stacks = [[name(f) for f in line.rstrip("\n").split("\t")][::-1] for line in open(a.raw) if line.strip()]
    tree = lambda: collections.defaultdict(tree)  # noqa: E731
    counts = collections.Counter()
    total = 0
    for s in stacks:
        i = next((k for k, f in enumerate(s) if a.root in f), None)
        if i is None:
            continue
        total += 1
        path = ()
        for f in s[i:i + a.depth + 1]:
            path += (f,)
            counts[path] += 1
    print(f"{total} of {len(stacks)} samples under {a.root!r}")

    def show(prefix, level):
        kids = [(c, p) for p, c in counts.items() if len(p) == len(prefix) + 1 and p[:len(prefix)] == prefix]
        for c, p in sorted(kids, reverse=True):
            if c < a.min:
                continue
            print(f"{c:6d} {'  ' * level}{p[-1][:a.width]}")
            show(p, level + 1)
    roots = sorted(((c, p) for p, c in counts.items() if len(p) == 1), reverse=True)
    for c, p in roots:
        print(f"{c:6d} {p[0][:a.width]}")
        show(p, 1)


if __name__ == "__main__":
    main()
