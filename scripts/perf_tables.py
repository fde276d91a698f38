#!/usr/bin/env python3
"""Regenerates the tables of docs/PERF.md from the JSON reports of one bench run; checks them.

    python3 scripts/perf_tables.py REPORT... --date YYYY-MM-DD --command 'CMD'
                                  [--gpu NAME] [--env TEXT] [--ours tessera] [--cells time|gbps]
                                  [--perf docs/PERF.md] [--drop-old] [--print]
    python3 scripts/perf_tables.py --check [--perf docs/PERF.md]

REPORT: a bench.json, or a directory searched (recursively, in sorted path order) for bench.json
files. Both writers give the same format: `tessera bench --out DIR` (harness/bench/report.cpp,
Report::write_json: one provider, "tessera") and the Python benchmarks' `--out DIR`
(benchmarks/common.py, Suite.finish -> tessera.bench.Report.write_json: several providers per
case, tessera and its peers, plus a "notes" list, which is not used here):

    {"peaks": {"gpu", "sm_count", "driver_version", "runtime_version", "copy_gbps",
               "bf16_tflops", ...} or null,
     "rows": [{"op", "provider", "dtype", "shape": "[4096, 1024]", "size", "bytes", "flops",
               "median_ms", "p20_ms", "p80_ms", ..., "gbps", "tflops", "pct_copy",
               "pct_gemm"}, ...]}

What it writes. PERF.md holds one section between the lines `<!-- perf:begin -->` and
`<!-- perf:end -->`; inside it, each table is a block opened by a marker and running to the next
marker or the end marker. Text before the first block is kept. A marker names the ops of its
table, with an optional title: `<!-- perf:op softmax -->` is one op's table, headed by the op;
`<!-- perf:op rowwise: softmax,layer_norm -->` is one table of a family, headed by the title,
its rows in the marker's order of ops, with an "op" column (as has any titled block, or any
block of several ops). A marker may end in a list of shapes, as the table writes them:
`<!-- perf:op elementwise: add,gelu | shapes: 2^20; 2^28 -->` shows the cases of those shapes
alone (a few sizes of a family; the reports hold every size run). The markers are the layout,
kept by hand (to move an op into a family or pick the sizes shown, edit them); what follows each
marker is the script's. An op is named by the report's op without a bracketed parameter part
("dropout[p=0.5]" is op "dropout", with a "params" column "p=0.5"); rows are (op,) (params,)
dtype x shape; columns:
  - dtype, shape ("4096 x 1024"; 1-D powers of two, and shapes of powers of two with a dimension
    of 2^20 or more, as 2^k),
  - per provider (ours first, then the peers in order of appearance): the median time in us
    (--cells time, the default; 2 decimals under 10 us, 1 under 1000, none above) or GB/s
    (--cells gbps); "-" where a provider did not run the case,
  - our GB/s (time cells only) and % of the copy rate measured in the same run, where the table
    moves bytes; our TFLOP/s and % of the bf16 GEMM rate, where it does FLOPs,
  - the best (fastest) peer and our ratio to it, best peer median / our median (> 1: ours is
    faster); left out where no case of the table has a peer.
Above each table: the GPU (--gpu, else the report's peaks: name, SMs, CUDA runtime), the date,
--env (versions, the commit measured), the copy rate of the run, and the command. The JSON has
no date or command: --date and --command are required. One invocation is one run: give it the
reports of one command, so that the line above each table is true of every row.

Rules. A case (op, dtype, shape) is taken whole from one report, so a row never mixes runs:
when several reports hold it, the one with the most providers for it wins (the peer run over a
`tessera bench` run of the same case); a tie, a provider given twice in one report, or reports
from different GPUs are errors. Blocks of ops not in the reports are kept as they are; a
measured op's block is rewritten in place; ops in no block get a block of their own, appended
in order of appearance. A block of several ops is rewritten only if the reports cover all of
them (--drop-old rewrites it anyway, with the ops measured, dropping the rest); an op in two
markers is an error, and so is an op of which the reports hold none of its marker's shapes. Rows
and columns follow the marker's order of ops, the order of the reports on the command line and
of the rows in each file; nothing depends on the clock or on how the file system lists a
directory, so the same inputs always give the same bytes.

--check reads PERF.md alone (no reports) and says whether every block is as the script writes
it: the marker, heading, run and command lines, the header its columns imply, every row's cell
count, the ops of the marker present, each row's shape among the marker's, and the best peer and
the ratio agreeing with the time (or GB/s) cells to their rounding. It exits 1 and lists what
differs otherwise.

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
OP_MARK = re.compile(r"^<!-- perf:op (?:(?P<title>[^:|]+): )?(?P<ops>[^ :|]+)"
                     r"(?: \| shapes: (?P<shapes>[^|]+?))? -->$")
SHAPES_SEP = "; "
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


def table_head(providers: list, *, ours: str, cells: str, with_op: bool, with_params: bool,
               moves: bool, computes: bool) -> list:
    """The header cells of a table; --check rebuilds them from what a header names."""
    unit = "us" if cells == "time" else "GB/s"
    head = (["op"] if with_op else []) + (["params"] if with_params else []) + ["dtype", "shape"]
    head += [f"{p} ({unit})" for p in providers]
    if moves:
        head += ([f"{ours} GB/s"] if cells == "time" else []) + ["% of copy"]
    if computes:
        head += [f"{ours} TFLOP/s", "% of bf16 GEMM"]
    if len(providers) > 1:
        head += ["best peer", f"{ours} / best peer"]
    return head


def render_table(cases: list, ours: str, cells: str, with_op: bool = False) -> list:
    """The markdown lines of one table (header, rule, one line per case)."""
    providers = [ours]
    for c in cases:
        providers += [p for p in c.rows if p not in providers]
    peers = providers[1:]
    with_params = any(c.params for c in cases)
    moves = any(r["bytes"] > 0 for c in cases for r in c.rows.values())
    computes = any(r["flops"] > 0 for c in cases for r in c.rows.values())
    head = table_head(providers, ours=ours, cells=cells, with_op=with_op, with_params=with_params,
                      moves=moves, computes=computes)

    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in cases:
        cell = [c.table] if with_op else []
        cell += [c.params] if with_params else []
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


def marker(title: str | None, ops: list, shapes: list | None = None) -> str:
    tail = f" | shapes: {SHAPES_SEP.join(shapes)}" if shapes else ""
    return f"<!-- perf:op {title + ': ' if title else ''}{','.join(ops)}{tail} -->"


def heading(title: str | None, ops: list) -> str:
    return f"### {title or ', '.join(ops)}"


def with_op_column(title: str | None, ops: list) -> bool:
    """A family's table (a title, or several ops) names each row's op."""
    return bool(title) or len(ops) > 1


def render_block(title: str | None, ops: list, cases: list, *, ours: str, cells: str,
                 gpu: str | None, date: str, command: str, env: str | None,
                 shapes: list | None = None) -> list:
    """One block: marker, heading, the run's line, the command, the table of `ops` (in order;
    the cases given, which build_section has already narrowed to the marker's shapes)."""
    cases = [c for o in ops for c in cases if c.table == o]
    reports = []
    for c in cases:
        if c.report not in reports:
            reports.append(c.report)
    gpus = sorted({gpu_of(r, gpu) for r in reports})
    if len(gpus) > 1:
        raise PerfError(f"{','.join(ops)}: reports from different GPUs ({'; '.join(gpus)}): "
                        "one GPU per run")
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
    return [marker(title, ops, shapes), heading(title, ops), first, f"Command: `{command}`", "",
            *render_table(cases, ours, cells, with_op=with_op_column(title, ops)), ""]


# ---- PERF.md --------------------------------------------------------------------------------

@dataclass
class Block:
    title: str | None
    ops: list
    lines: list
    shapes: list | None = None  # the shapes shown, as the table writes them; None: all


def split_section(text: str):
    """(before, lead-in lines, [Block], after) of PERF.md."""
    lines = text.split("\n")
    try:
        b = lines.index(BEGIN)
        e = lines.index(END, b + 1)
    except ValueError:
        raise PerfError(f"PERF.md needs a section between the lines {BEGIN} and {END}") from None
    lead, blocks, seen = [], [], set()
    for line in lines[b + 1:e]:
        if line.startswith("<!-- perf:op"):
            m = OP_MARK.match(line)
            ops = [o for o in m["ops"].split(",") if o] if m else []
            if not ops:
                raise PerfError(f"PERF.md: a marker the script cannot read: {line}")
            twice = [o for o in ops if o in seen]
            if twice or len(set(ops)) < len(ops):
                raise PerfError(f"PERF.md: op {', '.join(twice or ops)} in two markers")
            seen.update(ops)
            shapes = [x.strip() for x in m["shapes"].split(";")] if m["shapes"] else None
            if shapes is not None and not all(shapes):
                raise PerfError(f"PERF.md: an empty shape in the marker: {line}")
            blocks.append(Block(m["title"], ops, [line], shapes))
        elif blocks:
            blocks[-1].lines.append(line)
        else:
            lead.append(line)
    return lines[:b + 1], lead, blocks, lines[e:]


def build_section(text: str, tables: dict, render, *, drop_old: bool = False) -> str:
    """PERF.md's text with the tables of the ops in `tables` (op -> cases) put in their blocks
    (see the rules); render(title, ops, cases, shapes) gives a block's lines."""
    before, lead, blocks, after = split_section(text)
    out, placed = [], set()
    for blk in blocks:
        covered = [o for o in blk.ops if o in tables]
        if not covered:
            out += blk.lines
            continue
        missing = [o for o in blk.ops if o not in tables]
        if missing and not drop_old:
            raise PerfError(f"the block of {','.join(blk.ops)} also holds {', '.join(missing)}, "
                            "which these reports do not measure; pass --drop-old to drop them")
        cases = [c for o in covered for c in tables[o]]
        if blk.shapes:
            cases = [c for c in cases if fmt_shape(c.shape) in blk.shapes]
            bare = [o for o in covered if not any(c.table == o for c in cases)]
            if bare:
                raise PerfError(f"the reports hold {', '.join(bare)} at none of the shapes its "
                                f"marker lists ({SHAPES_SEP.join(blk.shapes)})")
        out += render(blk.title, covered, cases, blk.shapes)
        placed.update(covered)
    for o, cases in tables.items():
        if o not in placed:
            out += render(None, [o], cases, None)
    return "\n".join(before + lead + out + after)


def group_tables(cases: list) -> dict:
    """op -> its cases, in order of appearance."""
    tables: dict = {}
    for c in cases:
        if "," in c.table or " " in c.table or ":" in c.table or "-->" in c.table:
            raise PerfError(f"op name {c.table!r} cannot name a PERF.md block")
        tables.setdefault(c.table, []).append(c)
    return tables


# ---- --check ----------------------------------------------------------------------------------

RUN_LINE = re.compile(r"^.+, \d{4}-\d{2}-\d{2}(, .+)?; (copy \d+(-\d+)? GB/s measured in "
                      r"(the same run|the runs)|no copy rate in the report)\.$")
PROVIDER_COL = re.compile(r"^(?P<p>.+) \((?P<unit>us|GB/s)\)$")


def _cells(line: str):
    if not (line.startswith("| ") and line.endswith(" |")):
        return None
    return line[2:-2].split(" | ")


def _half_ulp(text: str) -> float:
    """Half the unit of the last printed digit: the rounding a printed value may carry."""
    return 0.5 * 10 ** -(len(text.split(".")[1]) if "." in text else 0)


def check_block(blk: Block) -> list:
    """What differs between one block and what the script writes; [] when nothing does."""
    name = ",".join(blk.ops)
    bad = []
    lines = list(blk.lines)
    while lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 7:
        return [f"{name}: too short for marker, heading, run, command, blank, header and rule"]
    if lines[1] != heading(blk.title, blk.ops):
        bad.append(f"{name}: heading {lines[1]!r}, expected {heading(blk.title, blk.ops)!r}")
    if not RUN_LINE.match(lines[2]):
        bad.append(f"{name}: the run's line is not as the script writes it: {lines[2]!r}")
    if not (lines[3].startswith("Command: `") and lines[3].endswith("`")):
        bad.append(f"{name}: no command line: {lines[3]!r}")
    if lines[4] != "":
        bad.append(f"{name}: no blank line before the table")
    head = _cells(lines[5])
    if head is None or len(head) < 3:
        return bad + [f"{name}: no table header: {lines[5]!r}"]
    if lines[6] != "|" + " --- |" * len(head):
        bad.append(f"{name}: the rule under the header is not {len(head)} columns")
    with_op = head[0] == "op"
    i = 1 if with_op else 0
    with_params = head[i] == "params"
    i += 1 if with_params else 0
    providers, units = [], set()
    for h in head[i + 2:]:
        m = PROVIDER_COL.match(h)
        if not m:
            break
        providers.append(m["p"])
        units.add(m["unit"])
    if head[i:i + 2] != ["dtype", "shape"] or not providers or len(units) != 1:
        return bad + [f"{name}: the header names no dtype, shape and provider columns"]
    cells = "time" if units == {"us"} else "gbps"
    ours, rest = providers[0], head[i + 2 + len(providers):]
    want = table_head(providers, ours=ours, cells=cells, with_op=with_op,
                      with_params=with_params, moves="% of copy" in rest,
                      computes="% of bf16 GEMM" in rest)
    if head != want:
        bad.append(f"{name}: header {' | '.join(head)}; the script writes {' | '.join(want)}")
        return bad
    if with_op != with_op_column(blk.title, blk.ops):
        bad.append(f"{name}: an op column goes with a titled block or one of several ops, "
                   "and only there")
    first = i + 2
    seen_ops = set()
    for n, line in enumerate(lines[7:], 8):
        row = _cells(line)
        where = f"{name}, line {n} of the block"
        if row is None or len(row) != len(head):
            bad.append(f"{where}: not a row of {len(head)} cells: {line!r}")
            continue
        op = row[0] if with_op else blk.ops[0]
        if op not in blk.ops:
            bad.append(f"{where}: op {op!r} is not in the marker")
        seen_ops.add(op)
        if blk.shapes and row[first - 1] not in blk.shapes:
            bad.append(f"{where}: shape {row[first - 1]!r} is not among the marker's")
        vals = {}
        for p, text in zip(providers, row[first:first + len(providers)]):
            if text != "-":
                try:
                    vals[p] = float(text)
                except ValueError:
                    bad.append(f"{where}: {p}'s cell {text!r} is not a number")
        if len(providers) == 1:
            continue
        best, ratio = row[-2], row[-1]
        rivals = {p: v for p, v in vals.items() if p != ours}
        if not rivals:
            if (best, ratio) != ("-", "-"):
                bad.append(f"{where}: no peer ran, yet best peer {best} and ratio {ratio}")
            continue
        pick = min if cells == "time" else max
        if best not in rivals or rivals[best] != pick(rivals.values()):
            bad.append(f"{where}: best peer {best}, but the fastest peer cell is "
                       f"{min(rivals, key=lambda p: rivals[p] if cells == 'time' else -rivals[p])}")
            continue
        if ours not in vals:
            if ratio != "-":
                bad.append(f"{where}: no {ours} cell, yet a ratio {ratio}")
            continue
        try:
            got = float(ratio)
        except ValueError:
            bad.append(f"{where}: ratio {ratio!r} is not a number")
            continue
        b_text = row[first + providers.index(best)]
        o_text = row[first]
        b, o = vals[best], vals[ours]
        if b <= 0 or o <= 0:
            bad.append(f"{where}: a cell of zero")
            continue
        r = b / o if cells == "time" else o / b
        slack = r * (_half_ulp(b_text) / b + _half_ulp(o_text) / o) * 1.01 + _half_ulp(ratio)
        if abs(got - r) > slack + 1e-9:
            bad.append(f"{where}: ratio {ratio}, but {best} {b_text} against {ours} {o_text} "
                       f"gives {r:.3f}")
    missing = [o for o in blk.ops if o not in seen_ops]
    if missing:
        bad.append(f"{name}: no rows of {', '.join(missing)}")
    return bad


def check(text: str) -> tuple:
    """(blocks, rows, problems) of PERF.md's section."""
    _, _, blocks, _ = split_section(text)
    problems, rows = [], 0
    for blk in blocks:
        problems += check_block(blk)
        rows += sum(1 for line in blk.lines[7:] if line.startswith("| "))
    return len(blocks), rows, problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="*", help="bench.json files or directories holding them")
    p.add_argument("--date", help="the day of the run, YYYY-MM-DD (required with reports)")
    p.add_argument("--command", help="the exact command of the run (required with reports)")
    p.add_argument("--gpu", help="the GPU (default: read from the reports' peaks)")
    p.add_argument("--env", help="versions worth naming, e.g. 'torch 2.11.0, Triton 3.6.0'")
    p.add_argument("--ours", default="tessera", help="the provider the tables are about")
    p.add_argument("--cells", choices=("time", "gbps"), default="time",
                   help="provider columns: median us (default) or GB/s")
    p.add_argument("--perf", type=Path, default=DEFAULT_PERF, help="default: docs/PERF.md")
    p.add_argument("--drop-old", action="store_true",
                   help="rewrite blocks of several ops even where the reports miss some of them")
    p.add_argument("--print", action="store_true", dest="print_only",
                   help="print the new section instead of writing PERF.md")
    p.add_argument("--check", action="store_true",
                   help="check PERF.md's blocks against what the script writes; no reports")
    a = p.parse_args(argv)
    if a.check:
        if a.reports:
            p.error("--check reads PERF.md alone: name no reports")
        try:
            n, rows, problems = check(a.perf.read_text(encoding="utf-8"))
        except (OSError, PerfError) as e:
            print(f"perf_tables: {e}", file=sys.stderr)
            return 2
        for line in problems:
            print(f"perf_tables: {a.perf}: {line}", file=sys.stderr)
        if problems:
            return 1
        print(f"perf_tables: {a.perf}: {n} block(s), {rows} row(s), as the script writes them")
        return 0
    if not a.reports or not a.date or not a.command:
        p.error("name the reports, --date and --command (or pass --check)")
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", a.date):
            raise PerfError(f"--date {a.date!r}: expected YYYY-MM-DD")
        reports = [load_report(path) for path in report_paths(a.reports)]
        cases = collect_cases(reports)
        if not cases:
            raise PerfError("the reports hold no rows")
        tables = group_tables(cases)

        def render(title, ops, cs, shapes):
            return render_block(title, ops, cs, ours=a.ours, cells=a.cells, gpu=a.gpu,
                                date=a.date, command=a.command, env=a.env, shapes=shapes)

        text = a.perf.read_text(encoding="utf-8") if a.perf.exists() else ""
        new = build_section(text, tables, render, drop_old=a.drop_old)
    except PerfError as e:
        print(f"perf_tables: {e}", file=sys.stderr)
        return 2
    if a.print_only:
        _, lead, section, _ = split_section(new)
        sys.stdout.write("\n".join(lead + [l for b in section for l in b.lines]) + "\n")
        return 0
    if new != text:
        a.perf.write_text(new, encoding="utf-8")
    print(f"perf_tables: {a.perf}: {len(tables)} op(s) from {len(reports)} report(s): "
          f"{', '.join(tables)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
