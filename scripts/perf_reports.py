#!/usr/bin/env python3
"""Puts a benchmark's own report into docs/PERF.md; checks that PERF.md holds nothing else.

    python3 scripts/perf_reports.py NAME REPORT.md --title TITLE --date YYYY-MM-DD --command 'CMD'
                                   [--gpu NAME] [--env TEXT] [--perf docs/PERF.md] [--print]
    python3 scripts/perf_reports.py --check [--perf docs/PERF.md]
    python3 scripts/perf_reports.py --run DIR [NAME ...] [--code HASH] [--timeout S]   (on the GPU)
    python3 scripts/perf_reports.py --insert DIR [NAME ...]                            (then here)

The benchmarks that measure more than one op's time (a training step, host cost per call, a
model's ops one at a time, a lab's kernels against cuBLAS) write their tables as markdown next to
their JSON (`--out DIR`: llama_step.md, overhead.md, llama_ops.md, ...). PERF.md holds them
between the lines `<!-- perf:reports:begin -->` and `<!-- perf:reports:end -->`, one block each,
opened by `<!-- perf:report NAME -->` and running to the next marker or the end line. A block
is written whole from one report: a `### TITLE` heading, one line naming the GPU, the date, the
versions and the command, a blank line, then the report as the benchmark wrote it less its own
`# ` title (the heading stands for it) and its code blocks, each with the paragraph introducing
it: a profile's kernel listings, a list of commands, which stay in the benchmark's report and
log, while its tables (GPU time per category among them) come whole. NAME's block is rewritten
in place, or appended where there is none.

REPORTS lists the blocks PERF.md holds and the command that writes each. --run runs them (all, or
the NAMEs) from the repository root, each into DIR/NAME/ with its log and run.json (the day, the
GPU, the versions, the code); --insert puts every report found under DIR into PERF.md with that
run line. So one device call regenerates them and no number is copied by hand.

What PERF.md is: the method (the text before the first section), the op tables of
scripts/perf_tables.py (between `<!-- perf:begin -->` and `<!-- perf:end -->`) and these reports,
in at most MAX_LINES lines (older runs are in its git history). --check says whether that holds:
nothing but blank lines between and after the sections, every report block with its heading and
run line, the length. It exits 1 and lists what differs otherwise.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

BEGIN = "<!-- perf:reports:begin -->"
END = "<!-- perf:reports:end -->"
TABLES_END = "<!-- perf:end -->"
MARK = re.compile(r"^<!-- perf:report (?P<name>[a-z0-9_]+) -->$")
RUN = re.compile(r"^\*\*Run:\*\* .+, \d{4}-\d{2}-\d{2}(, .+)?\. Command: `.+`\.$")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PERF = ROOT / "docs" / "PERF.md"
MAX_LINES = 500  # PERF.md's length: a report that would pass it calls for a shorter one
FENCE, INDENT = "```", "    "  # how a report's code blocks open (compact)

# Each report PERF.md holds: its heading, the command that writes it ({out}: a directory of its
# own) and the markdown file the command writes there. One report per benchmark and setting:
# the current run, not earlier ones.
REPORTS = {
    "headline": ("The main job: each operator against its best peer (scripts/main.sh)",
                 "bash scripts/main.sh && cp report/headline.md {out}/", "headline.md"),
    "transformers_step": ("Hugging Face transformers: the training step (benchmarks/transformers_step.py)",
                          "python3 benchmarks/transformers_step.py --rounds 3 --runs eager,compile,liger,tessera,"
                          "tessera_compile,tessera_sdpa,tessera_sdpa_compile --out {out}", "transformers_step.md"),
    "transformers_step_compiled": ("Hugging Face transformers: every family's patched step, compiled and not "
                                   "(benchmarks/transformers_step.py)",
                                   "python3 benchmarks/transformers_step.py --family all --layers 2 --vocab 32000 "
                                   "--rounds 2 --steps 4 --warmup 2 --runs tessera,tessera_compile,tessera_sdpa,"
                                   "tessera_sdpa_compile --out {out}", "transformers_step.md"),
    "transformers_step_kinds": ("Hugging Face transformers: a text decoder and a vision-language model's language "
                                "model (benchmarks/transformers_step.py)",
                                "python3 benchmarks/transformers_step.py --family granite,qwen2_vl --rounds 2 --runs "
                                "eager,compile,liger,tessera --out {out}", "transformers_step.md"),
    "llama_step_compile": ("The Llama-style training step under torch.compile (benchmarks/llama_step.py)",
                           "python3 benchmarks/llama_step.py --tessera all,swiglu --rounds 2 --steps 6 "
                           "--warmup 2 --profile --runs torch-compile,tessera-compile --out {out}",
                           "llama_step.md"),
    "transformers_step_gemma2": ("Hugging Face transformers: Gemma 2's training step (benchmarks/transformers_step.py)",
                                 "python3 benchmarks/transformers_step.py --family gemma2 --rounds 2 --runs "
                                 "eager,compile,liger,tessera --out {out}", "transformers_step.md"),
    "llama_ops": ("The Llama step's ops one at a time (benchmarks/llama_ops.py)",
                  "python3 benchmarks/llama_ops.py --rounds 3 --out {out}", "llama_ops.md"),
    "attention_gqa_forward": ("Attention with GQA against cuDNN, forward (benchmarks/attention.py)",
                              "python3 benchmarks/attention.py --gqa --rounds 3 --out {out}",
                              "attention_gqa_forward.md"),
    "attention_gqa_backward": ("Attention with GQA against cuDNN, backward (benchmarks/attention.py)",
                               "python3 benchmarks/attention.py --gqa --backward --rounds 3 --out {out}",
                               "attention_gqa_backward.md"),
    "grouped_mm": ("Grouped GEMM against torch._grouped_mm at MoE expert shapes (benchmarks/grouped_mm.py)",
                   "python3 benchmarks/grouped_mm.py --rounds 2 --families qwen3_moe,mixtral,gpt_oss --out {out}",
                   "grouped_mm.md"),
    "moe": ("A Mixture-of-Experts layer's routed experts, forward + backward (benchmarks/moe.py)",
            "python3 benchmarks/moe.py --families all --runs tessera,grouped_mm,grouped_mm_compile,liger --rounds 3 "
            "--out {out}", "moe.md"),
    "fp8_step": ("float8 training: HF Llama at Llama-3 8B's layer shapes, one step (benchmarks/transformers_step.py)",
                 "python3 benchmarks/transformers_step.py --family llama --layers 4 --hidden 4096 --heads 32 "
                 "--kv-heads 8 --intermediate 14336 --vocab 128256 --batch 2 --seq 2048 --rounds 2 --steps 4 "
                 "--warmup 2 --runs 'tessera,compile,tessera fp8 rowwise,tessera fp8 rowwise head,tessera fp8 blockwise,"
                 "torchao tensorwise compile,torchao tensorwise head compile' --out {out}", "transformers_step.md"),
    "fp8_public_step": ("float8 training: HF Llama at the public size (8 layers of 2048, 2 x 4096 tokens), one step "
                        "(benchmarks/transformers_step.py)",
                        "python3 benchmarks/transformers_step.py --family llama --rounds 2 --steps 4 --warmup 2 "
                        "--runs 'tessera,compile,tessera fp8 rowwise,tessera fp8 rowwise head' --out {out}",
                        "transformers_step.md"),
    "float8_quantize": ("float8_quantize against torch's quantizing code, and SwiGLU's product quantized where it is "
                        "computed (benchmarks/float8_quantize.py)",
                        "python3 benchmarks/float8_quantize.py --no-compile --gated --rounds 3 --out {out}",
                        "float8_quantize.md"),
    "rms_norm_float8": ("RMSNorm (add_rms_norm) with its output quantized for the float8 projections after it "
                        "(benchmarks/rms_norm_float8.py)",
                        "python3 benchmarks/rms_norm_float8.py --no-compile --rounds 3 --out {out}",
                        "rms_norm_float8.md"),
    "post_training": ("TRL's post-training losses against Liger-Kernel's modules, forward + backward "
                      "(benchmarks/post_training.py)",
                      "python3 benchmarks/post_training.py --rounds 3 --out {out}", "post_training.md"),
    "jsd": ("Distillation's divergence: tessera.jsd against LigerJSD, torch and torch.compile, forward + backward "
            "(benchmarks/jsd.py)", "python3 benchmarks/jsd.py --rounds 3 --out {out}", "jsd.md"),
    "overhead": ("Host cost per call (benchmarks/overhead.py)",
                 "python3 benchmarks/overhead.py --rounds 5 --calls 500 --out {out}", "overhead.md"),
    "llama_train": ("The example model under `tessera.enable()` (examples/llama_train.py)",
                    "python3 examples/llama_train.py --steps 60 --modes torch,enable --no-compile --out {out}",
                    "report.md"),
    "llama_distributed": ("Data parallel on 2 GPUs: DDP and FSDP2 (examples/llama_distributed.py)",
                          "python3 examples/llama_distributed.py --mode single --steps 20 --batch 8 --out {out}/single.json"
                          " && for m in ddp fsdp2; do torchrun --standalone --nproc-per-node 2"
                          " examples/llama_distributed.py --mode $m --steps 20 --batch 8 --out {out}/$m.json"
                          " --compare {out}/single.json || exit; done"
                          " && python3 examples/llama_distributed.py --table {out}", "llama_distributed.md"),
    "llama_tensor_parallel": ("Tensor parallelism on 2 GPUs against the unsharded model "
                              "(examples/llama_tensor_parallel.py)",
                              "i=0; for p in all,swiglu,linear all; do i=$((i+1)); torchrun --standalone"
                              " --nproc-per-node 2 examples/llama_tensor_parallel.py --tessera $p --out {out}/$i.json"
                              " || exit; done && python3 examples/llama_tensor_parallel.py --table {out}",
                              "llama_tensor_parallel.md"),
}
# Run only when named (a machine of two GPUs).
TWO_GPUS = {"llama_distributed", "llama_tensor_parallel"}


class PerfError(Exception):
    """A PERF.md or report this script cannot work with; the message says why."""


def split(text: str):
    """(before, [(name, lines)], after) around the reports' section."""
    lines = text.split("\n")
    try:
        b = lines.index(BEGIN)
        e = lines.index(END, b + 1)
    except ValueError:
        raise PerfError(f"PERF.md needs a section between the lines {BEGIN} and {END}") from None
    blocks: list = []
    for line in lines[b + 1:e]:
        if line.startswith("<!-- perf:report"):
            m = MARK.match(line)
            if not m:
                raise PerfError(f"PERF.md: a marker the script cannot read: {line}")
            if any(n == m["name"] for n, _ in blocks):
                raise PerfError(f"PERF.md: report {m['name']} twice")
            blocks.append((m["name"], [line]))
        elif blocks:
            blocks[-1][1].append(line)
        elif line.strip():
            raise PerfError(f"PERF.md: text before the first report block: {line}")
    return lines[:b + 1], blocks, lines[e:]


def compact(lines: list) -> list:
    """A report's lines as PERF.md holds them: without its own `# ` title, and without its code
    blocks, fenced or indented (kernel listings, lists of commands), each with the paragraph that
    introduces it; runs of blank lines made one."""
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    out, i = [], 0
    while i < len(lines):
        fenced = lines[i].startswith(FENCE)
        if not fenced and not (lines[i].startswith(INDENT) and (not out or not out[-1].strip())):
            out.append(lines[i])
            i += 1
            continue
        while out and not out[-1].strip():
            out.pop()
        while out and out[-1].strip() and not out[-1].startswith("|"):
            out.pop()  # the paragraph introducing the block, not a table above it
        if fenced:
            i += 1
            while i < len(lines) and not lines[i].startswith(FENCE):
                i += 1
            i += 1
        else:
            while i < len(lines) and (lines[i].startswith(INDENT) or not lines[i].strip()):
                i += 1
    kept = []
    for line in out:
        if line.strip() or (kept and kept[-1].strip()):
            kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    return kept


def render(name: str, report: str, *, title: str, date: str, command: str, gpu: str, env: str | None) -> list:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise PerfError(f"--date {date!r}: expected YYYY-MM-DD")
    body = compact(report.strip("\n").split("\n"))
    if not body:
        raise PerfError(f"report {name}: empty")
    if any(MARK.match(line) or line in (BEGIN, END) for line in body):
        raise PerfError(f"report {name}: holds a marker line")
    run = f"**Run:** {gpu}, {date}{', ' + env if env else ''}. Command: `{command}`."
    return [f"<!-- perf:report {name} -->", f"### {title}", run, ""] + body + [""]


def put(text: str, name: str, block: list) -> str:
    before, blocks, after = split(text)
    names = [n for n, _ in blocks]
    if name in names:
        blocks[names.index(name)] = (name, block)
    else:
        blocks.append((name, block))
    return "\n".join(before + [line for _, lines in blocks for line in lines] + after)


def check(text: str) -> list:
    """What in PERF.md is neither method, nor the op tables, nor a well-formed report block."""
    problems = []
    try:
        before, blocks, after = split(text)
    except PerfError as e:
        return [str(e)]
    lines = text.split("\n")
    if TABLES_END in lines:
        between = lines[lines.index(TABLES_END) + 1:lines.index(BEGIN)]
        problems += [f"text between the op tables and the reports: {l}" for l in between if l.strip()]
    problems += [f"text after the reports: {l}" for l in after[1:] if l.strip()]
    n = len(text.rstrip("\n").split("\n"))
    if n > MAX_LINES:
        problems.append(f"{n} lines, more than {MAX_LINES}: shorten a report (older runs are in git)")
    for name, block in blocks:
        if len(block) < 4 or not block[1].startswith("### ") or not RUN.match(block[2]):
            problems.append(f"report {name}: expected a ### heading and a **Run:** line (GPU, date, command)")
    return problems


def _versions() -> tuple:
    """(GPU name, 'torch X, transformers Y, Liger-Kernel Z') of this machine, as far as importable."""
    probe = ("import importlib.metadata as m, torch\n"
             "print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')\n"
             "v = ['torch ' + torch.__version__]\n"
             "for d, n in (('transformers', 'transformers'), ('liger-kernel', 'Liger-Kernel')):\n"
             "    try: v.append(n + ' ' + m.version(d))\n"
             "    except m.PackageNotFoundError: pass\n"
             "print(', '.join(v))\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    lines = r.stdout.strip().split("\n") if r.returncode == 0 else []
    return (lines[0], lines[1]) if len(lines) == 2 else ("unknown GPU", "torch not importable")


def run_reports(out: Path, names: list, code: str, timeout: float, reports=None) -> int:
    """Runs each named report's command into out/NAME/ (its log and run.json beside); returns how
    many failed. A failed command leaves no run.json, so --insert skips it."""
    reports = REPORTS if reports is None else reports
    gpu, env = _versions()
    if gpu in ("no GPU", "unknown GPU"):  # the commands build and time on the GPU machine only
        print(f"perf_reports: --run needs a CUDA GPU that torch sees ({gpu}: {env})", file=sys.stderr)
        return len(names)
    failed = 0
    for name in names:
        _, command, _ = reports[name]
        d = (out / name).resolve()
        d.mkdir(parents=True, exist_ok=True)
        (d / "run.json").unlink(missing_ok=True)
        t0 = time.time()
        with open(d / "log.txt", "w") as log:
            try:
                rc = subprocess.run(command.format(out=d), shell=True, cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        ok = rc == 0
        failed += not ok
        print(f"perf_reports: {name}: {'ok' if ok else f'failed ({rc})'} in {time.time() - t0:.0f} s", flush=True)
        if ok:
            (d / "run.json").write_text(json.dumps({
                "date": time.strftime("%Y-%m-%d"), "gpu": gpu, "command": command.format(out="DIR"),
                "env": f"{env}, code at {code}"}))
    return failed


def insert_reports(text: str, out: Path, names: list, reports=None) -> tuple:
    """text with each report found under out (a run.json and its markdown) put in; and their names."""
    reports = REPORTS if reports is None else reports
    done = []
    for name in names:
        title, _, md = reports[name]
        run = out / name / "run.json"
        if not run.is_file():
            continue
        r = json.loads(run.read_text())
        block = render(name, (out / name / md).read_text(encoding="utf-8"), title=title, date=r["date"],
                       command=r["command"], gpu=r["gpu"], env=r["env"])
        text = put(text, name, block)
        done.append(name)
    return text, done


def _code() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="the report's block name, e.g. llama_step")
    p.add_argument("report", nargs="?", type=Path, help="the markdown the benchmark wrote")
    p.add_argument("--title", help="the block's heading")
    p.add_argument("--date", help="the day of the run, YYYY-MM-DD")
    p.add_argument("--command", help="the exact command of the run")
    p.add_argument("--gpu", default="NVIDIA H200", help="default: NVIDIA H200")
    p.add_argument("--env", help="versions worth naming, e.g. 'torch 2.11.0, code at abc1234'")
    p.add_argument("--perf", type=Path, default=DEFAULT_PERF, help="default: docs/PERF.md")
    p.add_argument("--print", action="store_true", dest="print_only", help="print the block, write nothing")
    p.add_argument("--check", action="store_true", help="check PERF.md; no report")
    p.add_argument("--run", type=Path, metavar="DIR", help="run the reports' commands (all, or NAMEs) into DIR")
    p.add_argument("--insert", type=Path, metavar="DIR", help="put the reports found under DIR into PERF.md")
    p.add_argument("--code", help="--run: the commit the run's build is from (default: git's HEAD)")
    p.add_argument("--timeout", type=float, default=1800, help="--run: seconds per command (default 1800)")
    p.add_argument("more", nargs="*", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.run or a.insert:
        names = [str(n) for n in (a.name, a.report, *a.more) if n] or [n for n in REPORTS if n not in TWO_GPUS]
        unknown = [n for n in names if n not in REPORTS]
        if unknown:
            p.error(f"unknown report(s) {unknown}; expected names of {', '.join(REPORTS)}")
        if a.run:
            return 1 if run_reports(a.run, names, a.code or _code(), a.timeout) else 0
        try:
            text, done = insert_reports(a.perf.read_text(encoding="utf-8"), a.insert, names)
        except (OSError, PerfError, KeyError, ValueError) as e:
            print(f"perf_reports: {e}", file=sys.stderr)
            return 2
        a.perf.write_text(text, encoding="utf-8")
        print(f"perf_reports: {a.perf}: {len(done)} report(s) from {a.insert}: {', '.join(done) or 'none found'}")
        n = len(text.rstrip("\n").split("\n"))
        if n > MAX_LINES:
            print(f"perf_reports: {a.perf}: {n} lines, more than {MAX_LINES}: --check fails until a "
                  "report is shorter", file=sys.stderr)
        return 0 if done else 1
    try:
        text = a.perf.read_text(encoding="utf-8")
    except OSError as e:
        print(f"perf_reports: {e}", file=sys.stderr)
        return 2
    if a.check:
        problems = check(text)
        for line in problems:
            print(f"perf_reports: {a.perf}: {line}", file=sys.stderr)
        if not problems:
            print(f"perf_reports: {a.perf}: {len(split(text)[1])} report(s), nothing else after the method")
        return 1 if problems else 0
    if not (a.name and a.report and a.title and a.date and a.command):
        p.error("name the block and its report, --title, --date and --command (or pass --check)")
    try:
        block = render(a.name, a.report.read_text(encoding="utf-8"), title=a.title, date=a.date,
                       command=a.command, gpu=a.gpu, env=a.env)
        new = put(text, a.name, block)
    except (OSError, PerfError) as e:
        print(f"perf_reports: {e}", file=sys.stderr)
        return 2
    if a.print_only:
        sys.stdout.write("\n".join(block) + "\n")
        return 0
    if new != text:
        a.perf.write_text(new, encoding="utf-8")
    print(f"perf_reports: {a.perf}: report {a.name} from {a.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
