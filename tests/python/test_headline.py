"""scripts/headline.py: the README's headline table from a report directory (CPU only; the reports
here are synthetic, in the formats benchmarks/common.py, llama_ops.py, attention.py and
cross_entropy.py write)."""

import json
import re
from pathlib import Path

import pytest

import script_module

ROOT = Path(__file__).resolve().parents[2]


hl = script_module.load("headline")

PEAKS = {"gpu": "NVIDIA H200", "copy_gbps": 4280.0, "bf16_tflops": 700.0}
FULL = {"layers": 8, "dim": 2048, "heads": 16, "kv_heads": 4, "head_dim": 128, "ffn": 5632,
        "vocab": 128256, "batch": 2, "seq": 4096, "rope_theta": 500000.0, "eps": 1e-5}


def bench_row(op, provider, dtype, shape, median_ms, pct_copy=None, tflops=None):
    """A row of bench.json as tessera.bench.Report writes it."""
    return {"op": op, "provider": provider, "dtype": dtype, "shape": shape, "size": 0,
            "bytes": 1.0, "flops": 0.0, "median_ms": median_ms, "gbps": None, "tflops": tflops,
            "pct_copy": pct_copy, "pct_gemm": None}


def write(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)


def make_report(root: Path, model=FULL) -> None:
    write(root / "elementwise" / "bench.json", {"peaks": PEAKS, "rows": [
        bench_row("add", "tessera", "bfloat16", "[16777216]", 0.0273, pct_copy=86.3),
        bench_row("add", "torch", "bfloat16", "[16777216]", 0.0253),
        bench_row("add", "triton", "bfloat16", "[16777216]", 0.0260),
        bench_row("add", "tessera", "bfloat16", "[4194304]", 0.001),   # another size: not the case
        bench_row("add", "torch", "float32", "[16777216]", 0.001),     # another dtype: not the case
        bench_row("gelu", "tessera", "bfloat16", "[16777216]", 0.0227, pct_copy=69.2),  # no peer
        bench_row("copy", "tessera", "bfloat16", "[4096, 4096]", 0.040, pct_copy=80.0),
        bench_row("copy", "torch", "bfloat16", "[4096, 4096]", 0.060),
        bench_row("copy", "torch.compile", "bfloat16", "[4096, 4096]", 0.050),
    ]})
    write(root / "llama_ops" / "llama_ops.json", {"meta": {"gpu": "NVIDIA H200", "model": model}, "rows": [
        # GPU times are the headline's (wall times here rank the peers otherwise); compile2 (the
        # harness's repeat) is no peer
        {"op": "rms_norm", "tessera": 140.0, "compile": 666.0, "compile2": 90.0, "liger": 200.0,
         "gpu_tessera": 50.0, "gpu_compile": 52.0, "gpu_compile2": 10.0, "gpu_liger": 60.0,
         "gbs": 3400.0, "of_copy": 0.795},
        {"op": "mlp", "tessera": 1000.0, "compile": 900.0, "compile2": 900.0, "gpu_tessera": 1000.0,
         "gpu_compile": 900.0, "tflops": 500.0},
    ]})
    write(root / "attention" / "attention.json", {"meta": {"gpu": "NVIDIA H200"}, "rows": [
        {"b": 4, "h": 32, "s": 4096, "d": 128, "causal": False, "tessera_tflops": 100.0,
         "cudnn_tflops": 900.0, "flash2_tflops": 1.0, "efficient_tflops": 1.0},
        {"b": 4, "h": 32, "s": 4096, "d": 128, "causal": True, "tessera_tflops": 500.0,
         "cudnn_tflops": 550.0, "cudnn2_tflops": 600.0, "flash2_tflops": 400.0,
         "efficient_tflops": 200.0},
    ]})
    write(root / "cross_entropy" / "cross_entropy.json", {
        "meta": {"gpu": "NVIDIA H200", "rows": 8192, "vocab": 128256}, "rows": [
            {"provider": "torch", "ms": 3.0, "extra_mb": 1},
            {"provider": "compile", "ms": 1.5, "extra_mb": 1},
            {"provider": "liger", "ms": 1.2, "extra_mb": 0},
            {"provider": "tessera", "ms": 1.0, "extra_mb": 0},
            {"provider": "tessera_inplace", "ms": 0.5, "extra_mb": 0},  # not tessera's headline
        ]})
    write(root / "set" / "bench.json", "{not json")


def cells(out: str, op: str) -> list:
    """The cells of the table row of `op` (the README's first cell)."""
    for line in out.splitlines():
        if line.startswith(f"| {op} |"):
            return [c.strip() for c in line.strip().strip("|").split("|")]
    raise AssertionError(f"no row for {op} in:\n{out}")


def run(capsys, *argv) -> str:
    assert hl.main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def test_ratio_is_the_best_peer_time_over_tessera(tmp_path, capsys):
    make_report(tmp_path)
    out = run(capsys, tmp_path)
    add = cells(out, "`add`")
    assert add[1] == "bfloat16, 2^24"
    assert add[2:8] == ["27.3", "torch", "25.3", "0.93x", "86.3% of copy", "elementwise/bench.json"]
    copy = cells(out, "`copy`")
    assert copy[2:6] == ["40.0", "torch.compile", "50.0", "1.25x"]
    # llama_ops: GPU times in us, the best of compile and liger; compile2 is no peer
    rms = cells(out, "`rms_norm`")
    assert rms[2:7] == ["50.0", "compile", "52.0", "1.04x", "79.5% of copy"]
    mlp = cells(out, "`mlp`")
    assert mlp[2:7] == ["1000", "compile", "900.0", "0.90x", "500 TFLOP/s"]
    # attention: times from TFLOP/s and the causal forward's FLOPs; cudnn2 is no peer
    flops = 4.0 * 4 * 32 * 4096 ** 2 * 128 * 0.5
    att = cells(out, "attention")
    assert att[2:7] == [hl.fmt_us(flops / 500e6), "cudnn", hl.fmt_us(flops / 550e6),
                        f"{500 / 550:.2f}x", "500 TFLOP/s"]
    assert hl.fmt_us(flops / 550e6) == "999.6" and hl.fmt_us(flops / 500e6) == "1100"
    # one row per provider, the case in meta: tessera, not tessera_inplace
    ce = cells(out, "`cross_entropy`")
    assert ce[2:6] == ["1000", "liger", "1200", "1.20x"]
    assert "measured on NVIDIA H200" in out


def test_missing_cases_get_a_row_saying_why(tmp_path, capsys):
    make_report(tmp_path)
    out = run(capsys, tmp_path)
    soft = cells(out, "`softmax`, `log_softmax`")
    assert soft[2] == f"not measured ({tmp_path / 'rowwise' / 'bench.json'} missing)"
    assert soft[3:7] == ["-", "-", "-", "-"] and soft[7] == "rowwise/bench.json"
    assert "unreadable" in cells(out, "`isin`")[2]
    # the file is there, the case is not
    assert cells(out, "`silu`")[2].startswith("not measured (no op=silu dtype=bfloat16 shape=[16777216] in ")
    assert cells(out, "`silu_mul`, `geglu`")[2].startswith("not measured (no op=silu_mul in ")
    gelu = cells(out, "`gelu`")
    assert gelu[2] == "22.7" and gelu[3].startswith("no peer measured") and gelu[5] == "-"
    # the runs that measure them are listed
    assert "python3 benchmarks/rowwise.py --out" in out


def test_another_model_is_not_the_headline_case(tmp_path, capsys):
    make_report(tmp_path, model=dict(FULL, dim=512, seq=512))
    out = run(capsys, tmp_path)
    assert "measured another case" in cells(out, "`rms_norm`")[2]


def test_empty_report_and_write(tmp_path, capsys):
    out = run(capsys, tmp_path / "report", "--write")
    rows = [l for l in out.splitlines() if l.startswith("| `") or l.startswith("| attention")]
    assert len(rows) == len(hl.HEADLINES)
    assert all("not measured" in l for l in rows)
    text = (tmp_path / "report" / "headline.md").read_text()
    assert "| `add` | bfloat16, 2^24 | not measured" in text


def test_every_readme_operator_has_one_headline_in_order():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Operators", 1)[1].split("\n## ", 1)[0]
    ops = [l.split("|")[1].strip() for l in section.splitlines()
           if l.startswith("| ") and not l.startswith("| op ") and not l.startswith("| ---")]
    assert ops and [h.op for h in hl.HEADLINES] == ops


def test_every_headline_has_a_run(capsys):
    for h in hl.HEADLINES:
        assert h.fmt in hl.FORMATS, h.op
        assert hl.run_of(h) in hl.RUNS, h.op
        assert set(h.peers) and hl.OURS not in h.peers, h.op
    for name, (script, args) in hl.RUNS.items():
        assert (ROOT / script).is_file(), script
        assert "--out" not in args
    out = run(capsys, "--commands")
    assert [l.split()[0] for l in out.splitlines()] == list(hl.RUNS)
    assert re.search(r"^llama_ops benchmarks/llama_ops\.py .*--ops \S*rms_norm", out, re.M)


@pytest.mark.parametrize("bad", [["--nope"]])
def test_bad_arguments_exit_2(bad):
    with pytest.raises(SystemExit) as e:
        hl.main(bad)
    assert e.value.code == 2
