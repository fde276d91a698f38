#!/usr/bin/env python3
"""Host cost per call of two builds of the package, in one run: benchmarks/overhead.py in a fresh
process per build, the builds alternated round after round, so that clock drift falls on both.

    python dev/host_ab.py OLD_DIR NEW_DIR [--rounds R] [--calls N] [--out DIR]

OLD_DIR and NEW_DIR each hold a `tessera` package (put first on PYTHONPATH). Per op and mode the
table gives the median over rounds of tessera's time per call in each build and new / old, and the
same for torch in the same processes: torch is the same code in both, so its new / old is the
harness's reading of itself (1.00 up to noise). Processes differ more than rounds within one, so
the verdict is the last column: per build the median of tessera / torch measured in the same
process (interleaved), new over old. Each process is pinned to one CPU core where taskset exists.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_once(pkg_dir, calls, out_dir):
    # Each build's own libraries first: an inherited LD_LIBRARY_PATH (devbin/) would win over the
    # package's RUNPATH and hand the old build the new libtessera.
    env = dict(os.environ, PYTHONPATH=f"{Path(pkg_dir).resolve()}:{ROOT / 'benchmarks'}",
               LD_LIBRARY_PATH=str(Path(pkg_dir).resolve() / "tessera"))
    pin = ["taskset", "-c", "2"] if shutil.which("taskset") else []
    subprocess.run(pin + [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--calls", str(calls),
                    "--rounds", "3", "--out", out_dir], env=env, check=True, cwd="/tmp",
                   stdout=subprocess.DEVNULL)
    return json.loads((Path(out_dir) / "overhead.json").read_text())["rows"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    runs = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for build in order:
                out = os.path.join(tmp, f"{build}{r}")
                runs[build].append(run_once(getattr(args, build), args.calls, out))
                print(f"round {r} {build} done", file=sys.stderr, flush=True)

    def median(build, op, autograd, key):
        return statistics.median(row[key] for rows in runs[build] for row in rows
                                 if row["op"] == op and row["autograd"] == autograd)

    lines = ["| op | mode | tessera old (us) | tessera new (us) | new / old | torch new / old | "
             "(tessera / torch) new / old |", "| --- | --- | --- | --- | --- | --- | --- |"]
    rows = []
    for row in runs["new"][0]:
        op, ag = row["op"], row["autograd"]
        t_old, t_new = median("old", op, ag, "tessera"), median("new", op, ag, "tessera")
        p_old, p_new = median("old", op, ag, "torch"), median("new", op, ag, "torch")
        rel = median("new", op, ag, "ratio") / median("old", op, ag, "ratio")
        rows.append({"op": op, "autograd": ag, "old": t_old, "new": t_new, "ratio": t_new / t_old,
                     "torch_ratio": p_new / p_old, "relative": rel})
        lines.append(f"| {op} | {'forward + backward' if ag else 'no grad'} | {t_old:.2f} | {t_new:.2f} | "
                     f"{t_new / t_old:.2f} | {p_new / p_old:.2f} | {rel:.2f} |")
    geo = statistics.geometric_mean(r["ratio"] for r in rows)
    geo_torch = statistics.geometric_mean(r["torch_ratio"] for r in rows)
    geo_rel = statistics.geometric_mean(r["relative"] for r in rows)
    lines.append(f"\ngeomean new / old: tessera {geo:.3f}, torch {geo_torch:.3f}, "
                 f"tessera / torch {geo_rel:.3f} "
                 f"({args.rounds} rounds, {args.calls} calls)")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "host_ab.json").write_text(json.dumps(rows, indent=1))
        (Path(args.out) / "host_ab.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
