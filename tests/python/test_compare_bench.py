"""scripts/compare_bench.py (the `ab` step of dev/device.sh) on synthetic reports, written by
the same writer `tessera bench --out` uses (bench::Report::write_json), so a change of that format
shows here. CPU only."""

import importlib.util
import json
from pathlib import Path

import pytest

from tessera.bench import Report, summarize

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_bench.py"


@pytest.fixture(scope="module")
def compare_bench():
    spec = importlib.util.spec_from_file_location("compare_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# (op, dtype, shape) -> median us per round, for each side
OLD = {
    ("add", "float32", (1024,)): [10.0, 11.0, 30.0],        # one disturbed round
    ("softmax", "bfloat16", (4096, 1024)): [20.0, 20.0, 20.0],
    ("layer_norm", "float32", (4096, 1024)): [50.0, 50.0, 50.0],
    ("gelu", "bfloat16", (1024,)): [5.0, 5.0, 5.0],          # not measured on the new side
}
NEW = {
    ("add", "float32", (1024,)): [11.5, 11.0, 11.4],        # median 11.4: 3.6% slower
    ("softmax", "bfloat16", (4096, 1024)): [19.0, 19.5, 25.0],
    ("layer_norm", "float32", (4096, 1024)): [50.9, 50.9, 50.9],  # 1.8%: within 2%
}


def write_rounds(directory: Path, side: dict, name: str) -> list:
    paths = []
    for r in range(3):
        report = Report()
        for (op, dtype, shape), times in side.items():
            stats = summarize([times[r] / 1e3] * 5)
            report.add(op, "tessera", dtype, shape, shape[-1], 1e6, 0, stats)
        path = directory / f"{name}{r}" / "bench.json"
        path.parent.mkdir()
        report.write_json(path)
        paths.append(str(path))
    return paths


def run(compare_bench, tmp_path, capsys, *extra):
    old = write_rounds(tmp_path, OLD, "old")
    new = write_rounds(tmp_path, NEW, "new")
    rc = compare_bench.main(["--old", *old, "--new", *new, *extra])
    return rc, capsys.readouterr().out.splitlines()


def row(lines, op):
    return next(l.split() for l in lines if l.startswith(op + " "))


def test_medians_ratios_and_flags(compare_bench, tmp_path, capsys):
    rc, lines = run(compare_bench, tmp_path, capsys)
    assert rc == 0
    add = row(lines, "add")
    assert add[:6] == ["add", "float32", "[1024]", "11.00", "11.40", "1.036"]
    assert add[6] == "SLOWER"
    softmax = row(lines, "softmax")
    assert softmax[:3] == ["softmax", "bfloat16", "[4096,"]
    assert softmax[-2:] == ["19.50", "0.975"]  # faster: no flag
    assert row(lines, "layer_norm")[-1] == "1.018"  # slower, but within 2%
    assert "only in old: gelu tessera bfloat16 [1024]" in lines
    assert lines[-1] == "1 of 3 case(s) slower by more than 2%"


def test_threshold_and_failing_exit(compare_bench, tmp_path, capsys):
    rc, lines = run(compare_bench, tmp_path, capsys, "--threshold", "0.01", "--fail-slower")
    assert rc == 1
    assert row(lines, "layer_norm")[-1] == "SLOWER"
    assert lines[-1] == "2 of 3 case(s) slower by more than 1%"


def test_a_round_without_a_time_is_left_out(compare_bench, tmp_path):
    path = tmp_path / "bench.json"
    report = Report()
    report.add("add", "tessera", "float32", (8,), 8, 64, 0, summarize([1e-3]))
    report.write_json(path)
    doc = json.loads(path.read_text())
    doc["rows"].append(dict(doc["rows"][0], median_ms=None))  # the writer's form of a NaN
    path.write_text(json.dumps(doc))
    assert compare_bench.read_rounds([path]) == {("add", "tessera", "float32", "[8]"): [1e-3]}


def test_unreadable_report_names_the_file(compare_bench, tmp_path):
    bad = tmp_path / "bench.json"
    bad.write_text("{\"peaks\": null}")
    with pytest.raises(SystemExit, match=r"bench\.json: not a `tessera bench` JSON report"):
        compare_bench.read_rounds([bad])
