"""scripts/perf_tables.py: docs/PERF.md's tables from bench reports, and its --check of them (CPU
only; the reports here are synthetic, in the format of harness/bench/report.cpp and
benchmarks/common.py)."""

import json
from pathlib import Path

import pytest

import script_module

ROOT = Path(__file__).resolve().parents[2]


pt = script_module.load("perf_tables")

PEAKS = {"gpu": "Test GPU", "device": 0, "sm_count": 100, "l2_mb": 50.0, "memory_gb": 80.0,
         "driver_version": 12040, "runtime_version": 12040, "copy_gbps": 4000.0,
         "bf16_tflops": 800.0}


def row(op, provider, dtype, shape, median_ms, bytes_=0.0, flops=0.0, derived=True, peaks=PEAKS):
    """One row as the engine writes it; derived=False leaves GB/s and the percentages null, as a
    report without peaks has them, so the script must compute them."""
    r = {"op": op, "provider": provider, "dtype": dtype, "shape": shape, "size": 0,
         "bytes": bytes_, "flops": flops, "median_ms": median_ms, "p20_ms": median_ms,
         "p80_ms": median_ms, "min_ms": median_ms, "max_ms": median_ms, "mean_ms": median_ms,
         "reps": 25, "gbps": None, "tflops": None, "pct_copy": None, "pct_gemm": None}
    if derived and bytes_ > 0:
        r["gbps"] = bytes_ / (median_ms * 1e6)
        r["pct_copy"] = 100 * r["gbps"] / peaks["copy_gbps"]
    return r


def python_report():
    """benchmarks/*.py: several providers per case, a parameter in the op name, notes."""
    return {"peaks": PEAKS, "rows": [
        row("softmax", "tessera", "float32", "[4096, 1024]", 0.010, 2e7),
        row("softmax", "torch", "float32", "[4096, 1024]", 0.015, 2e7),
        row("softmax", "triton", "float32", "[4096, 1024]", 0.0125, 2e7),
        row("softmax", "tessera", "bfloat16", "[256, 262144]", 0.2, 1.6e8),
        row("softmax", "torch", "bfloat16", "[256, 262144]", 0.1, 1.6e8),
        row("dropout[p=0.5]", "tessera", "float32", "[16777216]", 0.04, 1.6e8),
        row("dropout[p=0.5]", "torch", "float32", "[16777216]", 0.05, 1.6e8),
    ], "notes": ["a note the tables do not use"]}


def engine_report():
    """`tessera bench --out`: tessera alone; GB/s and percentages left for the script."""
    peaks = dict(PEAKS, copy_gbps=4100.0)
    return {"peaks": peaks, "rows": [
        row("softmax", "tessera", "float32", "[4096, 1024]", 0.011, 2e7, derived=False),
        row("layer_norm", "tessera", "float32", "[4096, 4096]", 0.05, 1.3e8, derived=False),
        row("matmul", "tessera", "bfloat16", "[8192, 8192, 8192]", 2.2, 0.0, 1.1e12, derived=False),
    ]}


PERF_BEFORE = """# Performance
Text above the section stays.

<!-- perf:begin -->
Lead-in text stays.

<!-- perf:op softmax -->
### softmax
an old table, to be replaced

<!-- perf:op isin -->
### isin
a hand-kept table of an op not in these reports
<!-- perf:end -->

Text below stays.
"""

SOFTMAX_BLOCK = """<!-- perf:op softmax -->
### softmax
Test GPU (100 SMs, CUDA runtime 12.4), 2026-01-02, torch 9.9; copy 4000 GB/s measured in the same run.
Command: `bash run.sh`

| dtype | shape | tessera (us) | torch (us) | triton (us) | tessera GB/s | % of copy | best peer | tessera / best peer |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
| float32 | 4096 x 1024 | 10.0 | 15.0 | 12.5 | 2000 | 50.0 | triton | 1.25 |
| bfloat16 | 256 x 262144 | 200.0 | 100.0 | - | 800 | 20.0 | torch | 0.50 |
"""


def write(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture
def bench_files(tmp_path):
    py = write(tmp_path / "run" / "rowreport" / "bench.json", python_report())
    cpp = write(tmp_path / "run" / "creport" / "bench.json", engine_report())
    perf = tmp_path / "PERF.md"
    perf.write_text(PERF_BEFORE, encoding="utf-8")
    return tmp_path, py, cpp, perf


def run(perf, *reports, extra=()):
    return pt.main([str(r) for r in reports] + ["--perf", str(perf), "--date", "2026-01-02",
                                                "--command", "bash run.sh", "--env", "torch 9.9",
                                                *extra])


def test_rewrites_the_section(bench_files):
    _, py, cpp, perf = bench_files
    assert run(perf, py, cpp) == 0
    text = perf.read_text(encoding="utf-8")
    # The softmax table replaces the old block in place, from the report with the peers.
    assert SOFTMAX_BLOCK in text
    assert "an old table" not in text
    # Everything outside the blocks of measured ops is kept as it was.
    assert text.startswith("# Performance\nText above the section stays.\n\n<!-- perf:begin -->\n"
                           "Lead-in text stays.\n\n<!-- perf:op softmax -->\n")
    assert "<!-- perf:op isin -->\n### isin\na hand-kept table of an op not in these reports\n" in text
    assert text.endswith("<!-- perf:end -->\n\nText below stays.\n")
    # New ops go after the kept blocks, in the order the reports list them.
    marks = [line for line in text.splitlines() if line.startswith("<!-- perf:op ")]
    assert marks == ["<!-- perf:op softmax -->", "<!-- perf:op isin -->",
                     "<!-- perf:op dropout -->", "<!-- perf:op layer_norm -->",
                     "<!-- perf:op matmul -->"]


def test_params_flops_and_engine_only_tables(bench_files):
    _, py, cpp, perf = bench_files
    run(perf, py, cpp)
    text = perf.read_text(encoding="utf-8")
    # "dropout[p=0.5]" is table dropout with a params column; 1-D powers of two as 2^k.
    assert ("| params | dtype | shape | tessera (us) | torch (us) | tessera GB/s | % of copy | "
            "best peer | tessera / best peer |") in text
    assert "| p=0.5 | float32 | 2^24 | 40.0 | 50.0 | 4000 | 100.0 | torch | 1.25 |" in text
    # tessera bench alone: no peer columns; GB/s and % of copy computed against its own copy rate.
    assert "copy 4100 GB/s measured in the same run." in text
    assert ("| dtype | shape | tessera (us) | tessera GB/s | % of copy |\n| --- | --- | --- | --- | --- |\n"
            "| float32 | 4096 x 4096 | 50.0 | 2600 | 63.4 |") in text
    # An op with FLOPs and no bytes: TFLOP/s and % of the GEMM rate, no GB/s.
    assert ("| dtype | shape | tessera (us) | tessera TFLOP/s | % of bf16 GEMM |\n"
            "| --- | --- | --- | --- | --- |\n| bfloat16 | 8192 x 8192 x 8192 | 2200 | 500.0 | 62.5 |") in text


def test_same_inputs_same_bytes(bench_files):
    _, py, cpp, perf = bench_files
    run(perf, py, cpp)
    first = perf.read_text(encoding="utf-8")
    assert run(perf, py, cpp) == 0
    assert perf.read_text(encoding="utf-8") == first
    # A directory stands for the bench.json files under it, in sorted order (creport, rowreport).
    perf.write_text(PERF_BEFORE, encoding="utf-8")
    run(perf, cpp.parent.parent)
    by_dir = perf.read_text(encoding="utf-8")
    perf.write_text(PERF_BEFORE, encoding="utf-8")
    run(perf, cpp, py)
    assert perf.read_text(encoding="utf-8") == by_dir


def test_gbps_cells(bench_files):
    _, py, _, perf = bench_files
    run(perf, py, extra=["--cells", "gbps", "--gpu", "GPU named by hand"])
    text = perf.read_text(encoding="utf-8")
    assert "GPU named by hand, 2026-01-02, torch 9.9; copy 4000 GB/s measured in the same run." in text
    assert ("| dtype | shape | tessera (GB/s) | torch (GB/s) | triton (GB/s) | % of copy | best peer | "
            "tessera / best peer |") in text
    assert "| float32 | 4096 x 1024 | 2000 | 1333 | 1600 | 50.0 | triton | 1.25 |" in text


def test_print_leaves_perf_alone(bench_files, capsys):
    _, py, _, perf = bench_files
    assert run(perf, py, extra=["--print"]) == 0
    assert perf.read_text(encoding="utf-8") == PERF_BEFORE
    out = capsys.readouterr().out
    assert out.startswith("Lead-in text stays.\n") and SOFTMAX_BLOCK in out


def test_shapes():
    assert pt.fmt_shape("[4096, 1024]") == "4096 x 1024"
    assert pt.fmt_shape("[268435456]") == "2^28"
    assert pt.fmt_shape("[1000]") == "1000"
    assert pt.fmt_shape("[1048576, 1024]") == "2^20 x 2^10"
    assert pt.fmt_shape("[1024, 1024]") == "1024 x 1024"
    assert pt.fmt_shape("a x b") == "a x b"
    assert pt.split_op("dropout+bwd[p=0.1]") == ("dropout+bwd", "p=0.1")
    assert pt.split_op("softmax") == ("softmax", "")


def expect_error(capsys, code, text):
    assert code == 2
    assert text in capsys.readouterr().err


def test_errors(bench_files, capsys):
    tmp, py, cpp, perf = bench_files
    # The same case in two reports with as many providers: which run to show is not guessed.
    twin = write(tmp / "twin" / "bench.json", python_report())
    expect_error(capsys, run(perf, py, twin), "with as many providers")
    # Tables never mix GPUs.
    other = write(tmp / "other" / "bench.json",
                  {"peaks": dict(PEAKS, gpu="Other GPU"),
                   "rows": [row("layer_norm", "torch", "float32", "[4096, 8192]", 0.06, 1.3e8)]})
    expect_error(capsys, run(perf, cpp, other), "different GPUs")
    # No GPU anywhere.
    bare = write(tmp / "bare" / "bench.json", {"peaks": None, "rows": engine_report()["rows"]})
    expect_error(capsys, run(perf, bare), "pass --gpu")
    assert run(perf, bare, extra=["--gpu", "Named"]) == 0
    assert "Named, 2026-01-02, torch 9.9; no copy rate in the report." in perf.read_text("utf-8")
    # A provider twice in one report.
    doc = python_report()
    doc["rows"].append(dict(doc["rows"][0]))
    expect_error(capsys, run(perf, write(tmp / "dup" / "bench.json", doc)), "provider tessera twice")
    # Not a report; a row without a time.
    expect_error(capsys, run(perf, write(tmp / "x" / "bench.json", {"rows": None})), "no \"rows\"")
    doc = python_report()
    doc["rows"][0]["median_ms"] = 0
    expect_error(capsys, run(perf, write(tmp / "t" / "bench.json", doc)), "has no time")
    expect_error(capsys, run(perf, tmp / "missing"), "no such file")
    expect_error(capsys, run(perf, py, extra=["--date", "Jan 2"]), "expected YYYY-MM-DD")
    # PERF.md without the section.
    perf.write_text("# Performance\n", encoding="utf-8")
    expect_error(capsys, run(perf, py), "needs a section")
    assert perf.read_text(encoding="utf-8") == "# Performance\n"


def test_hand_kept_block_of_several_ops(bench_files, capsys):
    _, py, _, perf = bench_files
    before = PERF_BEFORE.replace("<!-- perf:op softmax -->", "<!-- perf:op softmax,gelu -->")
    perf.write_text(before, encoding="utf-8")
    # The reports measure softmax but not gelu: replacing the block would lose gelu's table.
    expect_error(capsys, run(perf, py), "also holds gelu")
    assert perf.read_text(encoding="utf-8") == before
    assert run(perf, py, extra=["--drop-old"]) == 0
    text = perf.read_text(encoding="utf-8")
    assert SOFTMAX_BLOCK in text and "softmax,gelu" not in text


# ---- family blocks: one table of several ops --------------------------------------------------

FAMILY_BEFORE = """# Performance

<!-- perf:begin -->
<!-- perf:op rows, and more: layer_norm,softmax -->
### rows, and more
an old table of both
<!-- perf:end -->
"""

def test_family_block(bench_files):
    _, py, cpp, perf = bench_files
    perf.write_text(FAMILY_BEFORE, encoding="utf-8")
    assert run(perf, py, cpp) == 0
    text = perf.read_text(encoding="utf-8")
    # One table for the marker's ops, in the marker's order (layer_norm first though the reports
    # name softmax first), headed by the title, with an op column and the providers of all its
    # ops ("-" where an op has no such peer); the ops in no marker get blocks of their own.
    assert ("<!-- perf:op rows, and more: layer_norm,softmax -->\n### rows, and more\n"
            "Test GPU (100 SMs, CUDA runtime 12.4), 2026-01-02, torch 9.9; copy 4000-4100 GB/s "
            "measured in the runs.\nCommand: `bash run.sh`\n\n"
            "| op | dtype | shape | tessera (us) | torch (us) | triton (us) | tessera GB/s | "
            "% of copy | best peer | tessera / best peer |\n"
            "|" + " --- |" * 10 + "\n"
            "| layer_norm | float32 | 4096 x 4096 | 50.0 | - | - | 2600 | 63.4 | - | - |\n"
            "| softmax | float32 | 4096 x 1024 | 10.0 | 15.0 | 12.5 | 2000 | 50.0 | triton | "
            "1.25 |\n"
            "| softmax | bfloat16 | 256 x 262144 | 200.0 | 100.0 | - | 800 | 20.0 | torch | "
            "0.50 |\n"
            "\n<!-- perf:op dropout -->\n### dropout\n") in text
    assert "an old table" not in text
    marks = [line for line in text.splitlines() if line.startswith("<!-- perf:op ")]
    assert marks == ["<!-- perf:op rows, and more: layer_norm,softmax -->",
                     "<!-- perf:op dropout -->", "<!-- perf:op matmul -->"]
    # The script's own output passes --check.
    assert pt.main(["--check", "--perf", str(perf)]) == 0


def test_family_block_with_an_op_not_measured(bench_files, capsys):
    _, py, _, perf = bench_files
    perf.write_text(FAMILY_BEFORE, encoding="utf-8")
    # py measures softmax, not layer_norm: the family's table would lose a row of another run.
    expect_error(capsys, run(perf, py), "also holds layer_norm")
    assert perf.read_text(encoding="utf-8") == FAMILY_BEFORE
    assert run(perf, py, extra=["--drop-old"]) == 0
    text = perf.read_text(encoding="utf-8")
    assert "<!-- perf:op rows, and more: softmax -->\n### rows, and more\n" in text
    # A titled block of one op still names the op in each row.
    assert "| softmax | float32 | 4096 x 1024 | 10.0 | 15.0 | 12.5 |" in text


def test_markers(bench_files, capsys):
    _, py, _, perf = bench_files
    twice = PERF_BEFORE.replace("<!-- perf:op isin -->", "<!-- perf:op set: isin,softmax -->")
    perf.write_text(twice, encoding="utf-8")
    expect_error(capsys, run(perf, py), "op softmax in two markers")
    perf.write_text(PERF_BEFORE.replace("<!-- perf:op isin -->", "<!-- perf:op isin softmax -->"),
                    encoding="utf-8")
    expect_error(capsys, run(perf, py), "a marker the script cannot read")


def test_marker_shapes_pick_the_sizes_shown(bench_files, capsys):
    _, py, cpp, perf = bench_files
    picked = PERF_BEFORE.replace("<!-- perf:op softmax -->", "<!-- perf:op softmax | shapes: 4096 x 1024 -->")
    picked = picked.replace("<!-- perf:op isin -->\n### isin\na hand-kept table of an op not in these reports\n", "")
    perf.write_text(picked, encoding="utf-8")
    assert run(perf, py) == 0
    text = perf.read_text(encoding="utf-8")
    # The marker is kept; its table holds the shape it lists, the report's other shape left out.
    assert ("<!-- perf:op softmax | shapes: 4096 x 1024 -->\n### softmax\n" in text
            and "| float32 | 4096 x 1024 | 10.0 | 15.0 | 12.5 | 2000 | 50.0 | triton | 1.25 |\n\n" in text
            and "256 x 262144" not in text)
    assert pt.main(["--check", "--perf", str(perf)]) == 0
    # --check: a row of a shape the marker does not list.
    row = "| bfloat16 | 256 x 262144 | 200.0 | 100.0 | - | 800 | 20.0 | torch | 0.50 |"
    perf.write_text(text.replace("| triton | 1.25 |\n", "| triton | 1.25 |\n" + row + "\n"), encoding="utf-8")
    capsys.readouterr()
    assert pt.main(["--check", "--perf", str(perf)]) == 1
    assert "shape '256 x 262144' is not among the marker's" in capsys.readouterr().err
    # A family's marker takes shapes too, written back as it was read.
    mark = "<!-- perf:op rows, and more: layer_norm,softmax | shapes: 4096 x 4096; 4096 x 1024 -->"
    perf.write_text(FAMILY_BEFORE.replace("<!-- perf:op rows, and more: layer_norm,softmax -->", mark),
                    encoding="utf-8")
    assert run(perf, py, cpp) == 0
    text = perf.read_text(encoding="utf-8")
    assert mark + "\n### rows, and more\n" in text and "256 x 262144" not in text
    assert "| layer_norm | float32 | 4096 x 4096 | 50.0 |" in text
    assert "| softmax | float32 | 4096 x 1024 | 10.0 | 15.0 | 12.5 |" in text
    assert pt.main(["--check", "--perf", str(perf)]) == 0
    # A marker whose shapes the reports do not hold for one of its ops is refused.
    perf.write_text(picked.replace("4096 x 1024 -->", "8 x 8 -->"), encoding="utf-8")
    expect_error(capsys, run(perf, py), "at none of the shapes its marker lists (8 x 8)")


# ---- --check ------------------------------------------------------------------------------------

def test_check_finds_hand_edits(bench_files, capsys):
    _, py, cpp, perf = bench_files
    perf.write_text(FAMILY_BEFORE, encoding="utf-8")
    run(perf, py, cpp)
    good = perf.read_text(encoding="utf-8")
    capsys.readouterr()
    assert pt.main(["--check", "--perf", str(perf)]) == 0
    assert "3 block(s), 5 row(s), as the script writes them" in capsys.readouterr().out

    def check_of(text):
        perf.write_text(text, encoding="utf-8")
        code = pt.main(["--check", "--perf", str(perf)])
        return code, capsys.readouterr().err

    row = "| softmax | float32 | 4096 x 1024 | 10.0 | 15.0 | 12.5 | 2000 | 50.0 | triton | 1.25 |"
    assert row in good
    # A ratio that the time cells do not give, beyond their rounding.
    code, err = check_of(good.replace(row, row.replace("| 1.25 |", "| 1.30 |")))
    assert code == 1 and "ratio 1.30, but triton 12.5 against tessera 10.0 gives 1.250" in err
    # A best peer that is not the fastest peer.
    code, err = check_of(good.replace(row, row.replace("| triton |", "| torch |")))
    assert code == 1 and "best peer torch, but the fastest peer cell is triton" in err
    # A column dropped by hand, a row cut short, a heading renamed, a marker's op without rows.
    code, err = check_of(good.replace("| tessera GB/s | % of copy | best peer",
                                      "| % of copy | best peer"))
    assert code == 1 and "the script writes" in err
    code, err = check_of(good.replace(row, row.replace(" 2000 | 50.0 |", "")))
    assert code == 1 and "not a row of 10 cells" in err
    code, err = check_of(good.replace("### rows, and more", "### rows"))
    assert code == 1 and "heading '### rows'" in err
    code, err = check_of(good.replace("layer_norm,softmax -->", "layer_norm,softmax,gelu -->"))
    assert code == 1 and "no rows of gelu" in err
    # A table of the old per-op layout under a family's marker: the op column is missing.
    single = good.replace("<!-- perf:op dropout -->", "<!-- perf:op lone: dropout -->").replace(
        "### dropout", "### lone")
    code, err = check_of(single)
    assert code == 1 and "an op column goes with a titled block" in err
    # --check takes no reports, and the other mode needs its arguments.
    with pytest.raises(SystemExit):
        pt.main(["--check", str(py)])
    with pytest.raises(SystemExit):
        pt.main([str(py)])


def test_repo_perf_md_is_as_the_script_writes_it():
    """docs/PERF.md itself: every block passes --check (tables edited by hand fail here)."""
    n, rows, problems = pt.check((ROOT / "docs" / "PERF.md").read_text(encoding="utf-8"))
    assert problems == []
    assert n > 0 and rows > 0
