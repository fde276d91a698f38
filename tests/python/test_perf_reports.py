"""scripts/perf_reports.py: a benchmark's own markdown report as a block of docs/PERF.md, and its
--check that PERF.md holds the method, the op tables and such blocks, nothing else (CPU only)."""

from pathlib import Path

import script_module

pr = script_module.load("perf_reports")

PERF = """# Performance
Method text.
<!-- perf:begin -->
<!-- perf:op softmax -->
a table
<!-- perf:end -->

<!-- perf:reports:begin -->
<!-- perf:reports:end -->
"""

ARGS = ["--title", "The step", "--date", "2026-11-30", "--command", "python benchmarks/llama_step.py",
        "--env", "torch 2.11.0"]


def write(tmp_path, text):
    p = tmp_path / "PERF.md"
    p.write_text(text)
    return p


def test_a_report_becomes_a_block_with_its_run_and_is_rewritten_in_place(tmp_path):
    perf = write(tmp_path, PERF)
    report = tmp_path / "llama_step.md"
    report.write_text("| run | ms |\n| --- | ---: |\n| tessera | 55.0 |\n")
    assert pr.main(["llama_step", str(report), "--perf", str(perf)] + ARGS) == 0
    text = perf.read_text()
    assert "<!-- perf:report llama_step -->\n### The step\n**Run:** NVIDIA H200, 2026-11-30, torch 2.11.0. " \
           "Command: `python benchmarks/llama_step.py`.\n\n| run | ms |" in text
    assert pr.main(["--check", "--perf", str(perf)]) == 0
    report.write_text("| run | ms |\n| --- | ---: |\n| tessera | 54.0 |\n")
    other = tmp_path / "overhead.md"
    other.write_text("host cost\n")
    assert pr.main(["overhead", str(other), "--perf", str(perf)] + ARGS) == 0
    assert pr.main(["llama_step", str(report), "--perf", str(perf)] + ARGS) == 0
    text = perf.read_text()
    assert "55.0" not in text and "54.0" in text
    assert text.index("perf:report llama_step") < text.index("perf:report overhead")  # in place
    assert pr.main(["--check", "--perf", str(perf)]) == 0


def test_check_refuses_text_outside_the_sections_and_blocks_without_a_run(tmp_path, capsys):
    perf = write(tmp_path, PERF.replace("<!-- perf:reports:begin -->", "Copied by hand.\n<!-- perf:reports:begin -->"))
    assert pr.main(["--check", "--perf", str(perf)]) == 1
    assert "text between the op tables and the reports: Copied by hand." in capsys.readouterr().err
    perf = write(tmp_path, PERF + "A note after.\n")
    assert pr.main(["--check", "--perf", str(perf)]) == 1
    perf = write(tmp_path, PERF.replace("<!-- perf:reports:end -->",
                                        "<!-- perf:report x -->\n### X\nno run line\n\n<!-- perf:reports:end -->"))
    assert pr.main(["--check", "--perf", str(perf)]) == 1
    assert "report x: expected a ### heading and a **Run:** line" in capsys.readouterr().err


def test_bad_input_is_refused_by_name(tmp_path, capsys):
    perf = write(tmp_path, PERF)
    report = tmp_path / "r.md"
    report.write_text("<!-- perf:reports:end -->\n")
    assert pr.main(["r", str(report), "--perf", str(perf)] + ARGS) == 2
    assert "holds a marker line" in capsys.readouterr().err
    report.write_text("ok\n")
    bad_date = ARGS[:3] + ["30.11.2026"] + ARGS[4:]
    assert pr.main(["r", str(report), "--perf", str(perf)] + bad_date) == 2
    assert "expected YYYY-MM-DD" in capsys.readouterr().err
    perf = write(tmp_path, "# no sections\n")
    assert pr.main(["--check", "--perf", str(perf)]) == 1


def test_the_repositorys_perf_md_checks_and_stays_short():
    """docs/PERF.md holds the method, the op tables and the reports, nothing else, in at most 500
    lines: older runs leave it (git keeps them) rather than pile up."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "PERF.md").read_text(encoding="utf-8")
    assert pr.check(text) == []
    assert pr.MAX_LINES == 500
    assert len(text.splitlines()) <= pr.MAX_LINES
    names = [name for name, _ in pr.split(text)[1]]
    assert set(names) <= set(pr.REPORTS), "a block no REPORTS entry would rewrite"


def test_check_refuses_a_perf_md_past_its_length(tmp_path, capsys):
    perf = write(tmp_path, PERF.replace("Method text.\n", "Method text.\n" * pr.MAX_LINES))
    assert pr.main(["--check", "--perf", str(perf)]) == 1
    assert f"more than {pr.MAX_LINES}" in capsys.readouterr().err


def test_a_block_holds_the_reports_tables_not_its_listings():
    """The report's own title goes (the block's heading stands for it), and so do its code
    blocks, fenced or indented, each with the paragraph introducing it; tables and text stay."""
    report = ("# Step figures\n\nThe runs:\n\n| run | ms |\n| --- | ---: |\n| tessera | 54.0 |\n\n"
              "GPU time per category:\n\n| category | tessera |\n| --- | ---: |\n| gemm | 40.5 |\n\n"
              "tessera: top CUDA kernels of one step\n\n```\nkernel  ms\ngemm_kernel  12.0\n```\n\n"
              "torch: top CUDA kernels of one step\n\n```\nkernel  ms\nnvjet  11.0\n```\n\n"
              "A closing note.\n\nMeasured by:\n\n    python3 a.py\n    python3 b.py\n")
    block = pr.render("step", report, title="The step", date="2026-11-30", command="c", gpu="G", env=None)
    assert block == ["<!-- perf:report step -->", "### The step", "**Run:** G, 2026-11-30. Command: `c`.", "",
                     "The runs:", "", "| run | ms |", "| --- | ---: |", "| tessera | 54.0 |", "",
                     "GPU time per category:", "", "| category | tessera |", "| --- | ---: |", "| gemm | 40.5 |",
                     "", "A closing note.", ""]
    # A code block right under a table takes no table with it.
    assert pr.compact(["| a |", "| --- |", "| 1 |", "```", "x", "```"]) == ["| a |", "| --- |", "| 1 |"]


def test_run_writes_each_report_with_its_run_and_insert_puts_them_in(tmp_path, monkeypatch):
    perf = write(tmp_path, PERF)
    reports = {
        "good": ("A good one", "python3 -c \"open('{out}/good.md', 'w').write('| a |\\n| --- |\\n| 1 |\\n')\"",
                 "good.md"),
        "bad": ("A failing one", "python3 -c \"raise SystemExit(3)\"", "bad.md"),
    }
    out = tmp_path / "runs"
    monkeypatch.setattr(pr, "_versions", lambda: ("NVIDIA H200", "torch 2.11.0"))
    assert pr.run_reports(out, ["good", "bad"], "abc1234", 60, reports) == 1
    assert (out / "good" / "run.json").is_file() and not (out / "bad" / "run.json").exists()
    text, done = pr.insert_reports(perf.read_text(), out, ["good", "bad"], reports)
    assert done == ["good"]
    assert "### A good one\n**Run:** " in text and "code at abc1234. Command: `python3 -c" in text
    assert "DIR/good.md" in text and "| 1 |" in text  # the command as run, its directory named DIR
    perf.write_text(text)
    assert pr.main(["--check", "--perf", str(perf)]) == 0


def test_the_reports_commands_name_their_output_directory():
    for name, (title, command, md) in pr.REPORTS.items():
        assert "{out}" in command and md.endswith(".md") and title, name


def test_run_refuses_without_a_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pr, "_versions", lambda: ("no GPU", "torch 2.11.0"))
    reports = {"x": ("X", "touch {out}/ran", "x.md")}
    assert pr.run_reports(tmp_path, ["x"], "abc1234", 60, reports) == 1
    assert not (tmp_path / "x").exists() and "needs a CUDA GPU" in capsys.readouterr().err
