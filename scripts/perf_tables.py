#!/usr/bin/env python3
"""Regenerates the per-operator tables of docs/PERF.md from the JSON reports of one bench run.

    python3 scripts/perf_tables.py REPORT... --date YYYY-MM-DD --command 'CMD'
                                  [--gpu NAME] [--env TEXT] [--ours tessera] [--cells time|gbps]
                                  [--perf docs/PERF.md] [--drop-old] [--print]

REPORT: a bench.json, or a directory searched (recursively, in sorted path order) for bench.json
files. Both writers give the same format: `tessera bench --out DIR` (src/bench/report.cpp,
Report::write_json: one provider, "tessera") and the Python benchmarks' `--out DIR`
(benchmarks/common.py, Suite.finish -> tessera.bench.Report.write_json: several providers per
case, tessera and its peers, plus a "notes" list, which is not used here):

    {"peaks": {"gpu", "sm_count", "driver_version", "runtime_version", "copy_gbps",
               "bf16_tflops", ...} or null,
     "rows": [{"op", "provider", "dtype", "shape": "[4096, 1024]", "size", "bytes", "flops",
               "median_ms", "p20_ms", "p80_ms", ..., "gbps", "tflops", "pct_copy",
               "pct_gemm"}, ...]}

What it writes. PERF.md holds one section between the lines `<!-- perf:begin -->` and
`<!-- perf:end -->`; inside it, each table is a block opened by `<!-- perf:op NAME -->` (a
hand-kept block may list several ops: `<!-- perf:op add,gelu -->`) and running to the next
block or the end marker. Text before the first block is kept. One table per op, named by the
report's op without a bracketed parameter part ("dropout[p=0.5]" is table "dropout", with a
"params" column "p=0.5"); rows are (params,) dtype x shape; columns:
  - dtype, shape ("4096 x 1024"; 1-D powers of two, and shapes of powers of two with a dimension
    of 2^20 or more, as 2^k),
  - per provider (ours first, then the peers in order of appearance): the median time in us
    (--cells time, the default; 2 decimals under 10 us, 1 under 1000, none above) or GB/s
    (--cells gbps),
  - our GB/s (time cells only) and % of the copy rate measured in the same run, where the op
    moves bytes; our TFLOP/s and % of the bf16 GEMM rate, where it does FLOPs,
  - the best (fastest) peer and our ratio to it, best peer median / our median (> 1: ours is
    faster); left out where no case of the op has a peer.
Above each table: the GPU (--gpu, else the report's peaks: name, SMs, CUDA runtime), the date,
--env (versions, the commit measured), the copy rate of the run, and the command. The JSON has
no date or command: --date and --command are required.

Rules. A case (op, dtype, shape) is taken whole from one report, so a table never mixes runs:
when several reports hold it, the one with the most providers for it wins (the peer run over a
`tessera bench` run of the same case); a tie, a provider given twice in one report, or reports
from different GPUs are errors. Blocks of ops not in the reports are kept as they are; a
regenerated op replaces its block in place; new ops are appended in order of appearance. A
hand-kept block listing several ops is replaced only if the reports cover all of them
(--drop-old replaces it anyway, dropping the rest). Rows and columns follow the order of the
reports on the command line and of the rows in each file; nothing depends on the clock or on
how the file system lists a directory, so the same inputs always give the same bytes.

--print writes the new section to stdout and leaves PERF.md alone. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

BEGIN = "<!-- perf:begin -->"
END = "<!-- perf:end -->"
OP_MARK = re.compile(r"^<!-- perf:op (?P<ops>[^ ]+) -->$")
DEFAULT_PERF = Path(__file__).resolve().parent.parent / "docs" / "PERF.md"


class PerfError(Exception):
    """A report or PERF.md that the tables cannot be built from; the message says why."""


# ---- reading reports ------------------------------------------------------------------------

@dataclass
class Report:
    path: str
    peaks: dict | None
    rows: list


def report_paths(args: list) -> list:
    """Files named, and every bench.json under the directories named (sorted), in order."""
    paths = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            found = sorted(p.rglob("bench.json"))
            if not found:
                raise PerfError(f"{a}: no bench.json under this directory")
            paths += found
        elif p.is_file():
            paths.append(p)
        else:
            raise PerfError(f"{a}: no such file or directory")
    return paths


REQUIRED = ("op", "provider", "dtype", "shape", "bytes", "flops", "median_ms")


def load_report(path) -> Report:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PerfError(f"{path}: cannot read a JSON report ({e})") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise PerfError(f"{path}: not a bench report (no \"rows\" list)")
    for i, row in enumerate(doc["rows"]):
        missing = [k for k in REQUIRED if not isinstance(row, dict) or row.get(k) is None]
        if missing:
            raise PerfError(f"{path}: row {i} lacks {', '.join(missing)}")
        if not row["median_ms"] > 0:
            raise PerfError(f"{path}: row {i} ({row['op']} {row['provider']}) has no time")
    peaks = doc.get("peaks")
    return Report(str(path), peaks if isinstance(peaks, dict) else None, doc["rows"])


# ---- cases and tables -----------------------------------------------------------------------

def split_op(op: str):
    """"dropout[p=0.5]" -> ("dropout", "p=0.5"); "softmax" -> ("softmax", "")."""
    m = re.fullmatch(r"(?P<name>[^\[\]]+)\[(?P<params>[^\]]*)\]", op)
    return (m["name"], m["params"]) if m else (op, "")


@dataclass
class Case:
    table: str
    params: str
    dtype: str
    shape: str
    report: Report
    rows: dict = field(default_factory=dict)  # provider -> row, in the report's order


def collect_cases(reports: list) -> list:
    """Every (op, dtype, shape), each from one report (see the rules at the top)."""
    chosen: dict = {}
    order: list = []
    for rep in reports:
        mine: dict = {}
        for row in rep.rows:
            table, params = split_op(row["op"])
            key = (table, params, row["dtype"], row["shape"])
            case = mine.setdefault(key, Case(table, params, row["dtype"], row["shape"], rep))
            if row["provider"] in case.rows:
                raise PerfError(f"{rep.path}: {row['op']} {row['dtype']} {row['shape']} has "
                                f"provider {row['provider']} twice")
            case.rows[row["provider"]] = row
        for key, case in mine.items():
            if key not in chosen:
                chosen[key] = case
                order.append(key)
                continue
            old = chosen[key]
            if len(case.rows) == len(old.rows):
                raise PerfError(f"{key[0]} {key[2]} {key[3]}: in {old.report.path} and "
                                f"{case.report.path} with as many providers; pass one of them")
            if len(case.rows) > len(old.rows):
                chosen[key] = case
    return [chosen[k] for k in order]


def gpu_of(rep: Report, gpu_arg: str | None) -> str:
    if gpu_arg:
        return gpu_arg
    p = rep.peaks or {}
    if not p.get("gpu"):
        raise PerfError(f"{rep.path}: no GPU in the report (no peaks); pass --gpu")
    extra = []
    if p.get("sm_count"):
        extra.append(f"{p['sm_count']} SMs")
    if p.get("runtime_version"):
        v = int(p["runtime_version"])
        extra.append(f"CUDA runtime {v // 1000}.{v % 1000 // 10}")
    return p["gpu"] + (f" ({', '.join(extra)})" if extra else "")


# ---- formatting -----------------------------------------------------------------------------

def fmt_shape(shape: str) -> str:
    """"[4096, 1024]" -> "4096 x 1024"; "[268435456]" -> "2^28"; anything else as it is."""
    try:
        dims = [int(d) for d in shape.strip().strip("[]").split(",")]
    except ValueError:
        return shape
    pow2 = all(d > 0 and d & (d - 1) == 0 for d in dims)
    if pow2 and (len(dims) == 1 or max(dims) >= 1 << 20):
        return " x ".join(f"2^{d.bit_length() - 1}" for d in dims)
    return " x ".join(str(d) for d in dims)


def fmt_us(ms: float) -> str:
    us = ms * 1e3
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def fmt_num(v, decimals: int) -> str:
    return "-" if v is None else f"{v:.{decimals}f}"


def gbps_of(row: dict):
    if row.get("gbps") is not None:
        return float(row["gbps"])
    return row["bytes"] / (row["median_ms"] * 1e6) if row["bytes"] > 0 else None


def tflops_of(row: dict):
    if row.get("tflops") is not None:
        return float(row["tflops"])
    return row["flops"] / (row["median_ms"] * 1e9) if row["flops"] > 0 else None


def pct_of(row: dict | None, key: str, value, peaks: dict | None, peak_key: str):
    """The report's percentage of the peak, or value / the peak of the run; None without one."""
    if row is None:
        return None
    if row.get(key) is not None:
        return float(row[key])
    peak = (peaks or {}).get(peak_key)
    return 100.0 * value / peak if value is not None and peak else None


def render_table(name: str, cases: list, ours: str, cells: str) -> list:
    """The markdown lines of one op's table (header, rule, one line per case)."""
    providers = [ours]
    for c in cases:
        providers += [p for p in c.rows if p not in providers]
    peers = providers[1:]
    with_params = any(c.params for c in cases)
    moves = any(r["bytes"] > 0 for c in cases for r in c.rows.values())
    computes = any(r["flops"] > 0 for c in cases for r in c.rows.values())

    unit = "us" if cells == "time" else "GB/s"
    head = (["params"] if with_params else []) + ["dtype", "shape"]
    head += [f"{p} ({unit})" for p in providers]
    if moves:
        head += ([f"{ours} GB/s"] if cells == "time" else []) + ["% of copy"]
    if computes:
        head += [f"{ours} TFLOP/s", "% of bf16 GEMM"]
    if peers:
        head += ["best peer", f"{ours} / best peer"]

    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in cases:
        cell = [c.params] if with_params else []
        cell += [c.dtype, fmt_shape(c.shape)]
        for p in providers:
            r = c.rows.get(p)
            if r is None:
                cell.append("-")
            elif cells == "time":
                cell.append(fmt_us(r["median_ms"]))
            else:
                cell.append(fmt_num(gbps_of(r), 0))
        mine = c.rows.get(ours)
        peaks = c.report.peaks
        if moves:
            g = gbps_of(mine) if mine else None
            if cells == "time":
                cell.append(fmt_num(g, 0))
            cell.append(fmt_num(pct_of(mine, "pct_copy", g, peaks, "copy_gbps"), 1))
        if computes:
            t = tflops_of(mine) if mine else None
            cell += [fmt_num(t, 1 if t is not None and t >= 100 else 2),
                     fmt_num(pct_of(mine, "pct_gemm", t, peaks, "bf16_tflops"), 1)]
        if peers:
            rivals = [(c.rows[p]["median_ms"], i, p) for i, p in enumerate(peers) if p in c.rows]
            if rivals:
                best_ms, _, best = min(rivals)
                ratio = best_ms / mine["median_ms"] if mine else None
                cell += [best, fmt_num(ratio, 2)]
            else:
                cell += ["-", "-"]
        lines.append("| " + " | ".join(cell) + " |")
    return lines


def render_block(name: str, cases: list, *, ours: str, cells: str, gpu: str | None, date: str,
                 command: str, env: str | None) -> list:
    reports = []
    for c in cases:
        if c.report not in reports:
            reports.append(c.report)
    gpus = sorted({gpu_of(r, gpu) for r in reports})
    if len(gpus) > 1:
        raise PerfError(f"{name}: reports from different GPUs ({'; '.join(gpus)}): one GPU per run")
    copies = sorted({round(float(r.peaks["copy_gbps"])) for r in reports
                     if r.peaks and r.peaks.get("copy_gbps")})
    first = f"{gpus[0]}, {date}"
    if env:
        first += f", {env}"
    if not copies:
        first += "; no copy rate in the report."
    elif len(copies) == 1:
        first += f"; copy {copies[0]} GB/s measured in the same run."
    else:
        first += f"; copy {copies[0]}-{copies[-1]} GB/s measured in the runs."
    return [f"<!-- perf:op {name} -->", f"### {name}", first, f"Command: `{command}`", "",
            *render_table(name, cases, ours, cells), ""]


# ---- PERF.md --------------------------------------------------------------------------------

def split_section(text: str):
    """(before, lead-in lines, [(ops, block lines)], after) of PERF.md."""
    lines = text.split("\n")
    try:
        b = lines.index(BEGIN)
        e = lines.index(END, b + 1)
    except ValueError:
        raise PerfError(f"PERF.md needs a section between the lines {BEGIN} and {END}") from None
    lead, blocks = [], []
    for line in lines[b + 1:e]:
        m = OP_MARK.match(line)
        if m:
            blocks.append(([o for o in m["ops"].split(",") if o], [line]))
        elif blocks:
            blocks[-1][1].append(line)
        else:
            lead.append(line)
    return lines[:b + 1], lead, blocks, lines[e:]


def build_section(text: str, new_blocks: dict, *, drop_old: bool = False) -> str:
    """PERF.md's text with the blocks of `new_blocks` (op -> lines) put in (see the rules)."""
    before, lead, blocks, after = split_section(text)
    out, placed = [], set()
    for ops, lines in blocks:
        covered = [o for o in ops if o in new_blocks]
        if not covered:
            out += lines
            continue
        missing = [o for o in ops if o not in new_blocks]
        if missing and not drop_old:
            raise PerfError(f"the block of {','.join(ops)} also holds {', '.join(missing)}, which "
                            "these reports do not measure; pass --drop-old to drop them")
        for o in covered:
            if o not in placed:
                out += new_blocks[o]
                placed.add(o)
    for o, lines in new_blocks.items():
        if o not in placed:
            out += lines
    return "\n".join(before + lead + out + after)


def make_blocks(cases: list, **kw) -> dict:
    tables: dict = {}
    for c in cases:
        if "," in c.table or " " in c.table or "-->" in c.table:
            raise PerfError(f"op name {c.table!r} cannot name a PERF.md block")
        tables.setdefault(c.table, []).append(c)
    return {name: render_block(name, cs, **kw) for name, cs in tables.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", help="bench.json files or directories holding them")
    p.add_argument("--date", required=True, help="the day of the run, YYYY-MM-DD")
    p.add_argument("--command", required=True, help="the exact command of the run")
    p.add_argument("--gpu", help="the GPU (default: read from the reports' peaks)")
    p.add_argument("--env", help="versions worth naming, e.g. 'torch 2.11.0, Triton 3.6.0'")
    p.add_argument("--ours", default="tessera", help="the provider the tables are about")
    p.add_argument("--cells", choices=("time", "gbps"), default="time",
                   help="provider columns: median us (default) or GB/s")
    p.add_argument("--perf", type=Path, default=DEFAULT_PERF, help="default: docs/PERF.md")
    p.add_argument("--drop-old", action="store_true",
                   help="replace hand-kept blocks even where they also hold ops not measured")
    p.add_argument("--print", action="store_true", dest="print_only",
                   help="print the new section instead of writing PERF.md")
    a = p.parse_args(argv)
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", a.date):
            raise PerfError(f"--date {a.date!r}: expected YYYY-MM-DD")
        reports = [load_report(path) for path in report_paths(a.reports)]
        cases = collect_cases(reports)
        if not cases:
            raise PerfError("the reports hold no rows")
        blocks = make_blocks(cases, ours=a.ours, cells=a.cells, gpu=a.gpu, date=a.date,
                             command=a.command, env=a.env)
        text = a.perf.read_text(encoding="utf-8") if a.perf.exists() else ""
        new = build_section(text, blocks, drop_old=a.drop_old)
    except PerfError as e:
        print(f"perf_tables: {e}", file=sys.stderr)
        return 2
    if a.print_only:
        _, lead, section, _ = split_section(new)
        sys.stdout.write("\n".join(lead + [l for _, ls in section for l in ls]) + "\n")
        return 0
    if new != text:
        a.perf.write_text(new, encoding="utf-8")
    tables = ", ".join(blocks)
    print(f"perf_tables: {a.perf}: {len(blocks)} table(s) from {len(reports)} report(s): {tables}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
