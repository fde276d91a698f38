#!/usr/bin/env python3
"""Compares two builds from alternating `tessera bench --out` runs (the `ab` step of
dev/device.sh): the median time of each case on each side over the rounds, new/old, and the
cases slower by more than a threshold.

    python3 scripts/compare_bench.py --old R1/bench.json R2/bench.json ... \\
                                     --new R1/bench.json R2/bench.json ... [--threshold 0.02]

Reads the JSON that bench::Report::write_json writes (harness/bench/report.cpp): {"peaks": ...,
"rows": [{"op", "provider", "dtype", "shape", "size", "median_ms", ...}, ...]}. A case is
(op, dtype, shape), per provider; each round contributes its row's median_ms, and each side's
figure is the median of its rounds (robust to one disturbed round). Cases measured on one side
only are listed apart. The last line is the count of slower cases; the exit status is 0 unless
the inputs cannot be read (--fail-slower: 1 when any case is slower).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def read_rounds(paths) -> dict:
    """(op, provider, dtype, shape) -> [median_ms of each round], in the order rows first appear."""
    cases: dict = {}
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            rows = doc["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"compare_bench.py: {path}: not a `tessera bench` JSON report ({e})")
        for row in rows:
            key = (row["op"], row.get("provider", "tessera"), row["dtype"], row["shape"])
            ms = row.get("median_ms")
            times = cases.setdefault(key, [])
            if isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0:
                times.append(float(ms))
    return cases


def compare(old: dict, new: dict, threshold: float) -> tuple[list, list, list]:
    """Rows [op, dtype, shape, old us, new us, new/old, flag] for the cases both sides have, their
    new/old ratios, and the keys only one side has (with that side)."""
    lines, ratios, one_sided = [], [], []
    for key in list(old) + [k for k in new if k not in old]:
        a, b = old.get(key), new.get(key)
        if not a or not b:
            one_sided.append((key, "old" if a else "new" if b else "neither (no valid time)"))
            continue
        t_old, t_new = statistics.median(a), statistics.median(b)
        ratio = t_new / t_old
        ratios.append(ratio)
        flag = ratio > 1 + threshold
        op, provider, dtype, shape = key
        label = op if provider == "tessera" else f"{op} ({provider})"
        lines.append([label, dtype, shape, f"{1e3 * t_old:.2f}", f"{1e3 * t_new:.2f}",
                      f"{ratio:.3f}", "SLOWER" if flag else ""])
    return lines, ratios, one_sided


def format_table(header, lines) -> str:
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    left = {0, 1, 2, 6}
    fmt = lambda cells: "  ".join(c.ljust(w) if i in left else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([fmt(header), "-" * (sum(widths) + 2 * (len(widths) - 1))] +
                     [fmt(l) for l in lines])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", nargs="+", required=True, metavar="JSON",
                   help="the baseline's reports, one per round")
    p.add_argument("--new", nargs="+", required=True, metavar="JSON",
                   help="the current build's reports, one per round")
    p.add_argument("--threshold", type=float, default=0.02,
                   help="flag cases with new/old above 1 + this (default 0.02: 2%% slower)")
    p.add_argument("--fail-slower", action="store_true",
                   help="exit 1 when any case is slower than the threshold")
    args = p.parse_args(argv)
    if args.threshold < 0:
        p.error(f"--threshold: expected a fraction >= 0, got {args.threshold}")
    old, new = read_rounds(args.old), read_rounds(args.new)
    lines, ratios, one_sided = compare(old, new, args.threshold)
    slower = sum(r > 1 + args.threshold for r in ratios)
    rounds = f"{len(args.old)} old and {len(args.new)} new round(s)"
    print(f"median time per case over {rounds}; new/old > {1 + args.threshold:g} flagged")
    print(format_table(["op", "dtype", "shape", "old us", "new us", "new/old", ""], lines))
    if ratios:
        print(f"geometric mean new/old: {math.exp(statistics.fmean(map(math.log, ratios))):.3f}")
    for (op, provider, dtype, shape), side in one_sided:
        print(f"only in {side}: {op} {provider} {dtype} {shape}")
    print(f"{slower} of {len(lines)} case(s) slower by more than {100 * args.threshold:g}%")
    return 1 if args.fail_slower and slower else 0


if __name__ == "__main__":
    sys.exit(main())
