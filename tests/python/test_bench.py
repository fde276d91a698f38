"""tessera.bench from Python: statistics and the report writers (CPU side), do_bench and peaks
(GPU)."""

import csv
import json
import math
import xml.etree.ElementTree as ET

import pytest

import tessera
from tessera.bench import Report, do_bench, summarize


def test_summarize_quantiles():
    s = summarize([5, 1, 4, 2, 3])
    assert s["median_ms"] == 3 and s["min_ms"] == 1 and s["max_ms"] == 5 and s["mean_ms"] == 3
    assert math.isclose(s["p20_ms"], 1.8) and math.isclose(s["p80_ms"], 4.2)  # numpy's linear
    assert s["reps"] == 5
    with pytest.raises(ValueError, match="at least one sample"):
        summarize([])


def make_report():
    r = Report()
    for size in (1 << 16, 1 << 20, 1 << 24):
        for provider, scale in (("tessera", 1.0), ("torch", 1.25)):
            stats = summarize([scale * size * 12 / 3e9 * f for f in (0.98, 1.0, 1.01, 1.05)])
            r.add("add", provider, "float32", (size,), size, 12 * size, 0, stats)
            r.add("gelu", provider, "bfloat16", [size], size, 4 * size, 0, stats)
    r.note("2^16 timed in graph mode")
    return r


def test_report_rows_and_table():
    r = make_report()
    rows = r.rows()
    assert len(rows) == 12
    assert rows[0]["op"] == "add" and rows[0]["shape"] == "[65536]" and rows[0]["size"] == 65536
    assert rows[0]["gbps"] > 0
    assert r.peaks is None
    r.set_peaks({"gpu": "Test GPU", "copy_gbps": 4000.0, "bf16_tflops": 800.0, "sm_count": 132})
    assert r.peaks["gpu"] == "Test GPU" and r.peaks["copy_gbps"] == 4000.0
    table = r.table()
    assert "provider" in table and "tessera" in table and "torch" in table
    assert "notes:" in table and "2^16 timed in graph mode" in table


def test_report_csv(tmp_path):
    r = make_report()
    r.set_peaks({"gpu": "Test GPU", "copy_gbps": 4000.0, "bf16_tflops": 800.0})
    path = tmp_path / "bench.csv"
    r.write_csv(path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12
    first = rows[0]
    assert (first["op"], first["provider"], first["dtype"], first["shape"]) == \
        ("add", "tessera", "float32", "[65536]")
    stats = r.rows()[0]["stats"]
    assert math.isclose(float(first["median_ms"]), stats["median_ms"], rel_tol=1e-6)
    gbps = 12 * 65536 / (stats["median_ms"] * 1e-3) / 1e9
    assert math.isclose(float(first["gbps"]), gbps, rel_tol=1e-4)
    assert math.isclose(float(first["pct_copy"]), 100 * gbps / 4000.0, rel_tol=1e-4)


def test_report_json(tmp_path):
    r = make_report()
    path = tmp_path / "bench.json"
    r.write_json(path)
    doc = json.loads(path.read_text())
    assert doc["peaks"] is None
    assert len(doc["rows"]) == 12
    assert doc["rows"][1]["op"] == "gelu" and doc["rows"][1]["dtype"] == "bfloat16"
    assert doc["notes"] == ["2^16 timed in graph mode"]


def test_report_svgs(tmp_path):
    r = make_report()
    r.set_peaks({"gpu": "Test GPU", "copy_gbps": 4000.0, "bf16_tflops": 800.0})
    paths = r.write_svgs(tmp_path / "svg")
    assert len(paths) == 2  # one per (op, dtype)
    for p in paths:
        root = ET.parse(p).getroot()
        assert root.tag.endswith("svg")
        text = open(p).read()
        assert "tessera" in text and "torch" in text
    assert r.svg("add", "float32").lstrip().startswith("<")
    with pytest.raises(ValueError):
        r.svg("softmax", "float32")


def test_do_bench_arguments():
    with pytest.raises(ValueError, match="graph_batch"):
        do_bench(lambda: None, graph_batch=0)


@pytest.mark.skipif(tessera.is_available(), reason="checks the error without a GPU")
def test_do_bench_without_gpu_is_an_error_not_a_crash():
    with pytest.raises(RuntimeError):
        do_bench(lambda: None, warmup_ms=0, min_reps=1, max_reps=1)


# ---- operator descriptions (CPU: nothing is allocated) ----

def test_every_op_is_described():
    ops = tessera.bench.ops()
    assert len(ops) == len({o.name for o in ops}) > 0
    for o in ops:
        assert o.family and o.summary and o.size_meaning, o.name
        assert o.dtypes and set(o.dtypes) <= set(tessera._C.DTYPES), o.name
        assert o.bench_sizes and all(n > 0 for n in o.bench_sizes), o.name
        for d in o.dtypes:
            assert o.tolerance(d) >= 0, (o.name, d)
            for n in o.bench_sizes:
                case = o.bench_shape(d, n)
                assert case.shapes and all(case.shapes), (o.name, d, n)
                assert case.shape and case.bytes > 0 and case.flops >= 0, (o.name, d, n)


def test_bench_shapes_follow_the_size_and_dtype():
    numel = math.prod
    for o in tessera.bench.ops():
        n = o.bench_sizes[-1]
        main = o.bench_shape(o.dtypes[0], n).shapes[0]
        if o.size_meaning.startswith("elements"):
            assert numel(main) == n, o.name
        elif o.size_meaning.startswith("sequence length"):  # [batch, seq, heads, head_dim]
            assert main[1] == n, (o.name, o.size_meaning, main)
        elif o.family == "moe":  # tokens [T, H] or their pairs [T k, H], k = 8, H = 2048
            assert main[0] in (n, 8 * n) and main[1] == 2048, (o.name, o.size_meaning, main)
        elif o.size_meaning.startswith("tokens"):  # [batch, seq, heads, head_dim], batch x seq tokens
            assert main[0] * main[1] == n, (o.name, o.size_meaning, main)
        elif o.name == "linear_cross_entropy":  # hidden [N, H], then weight [V, H]
            assert o.bench_shape(o.dtypes[0], n).shapes[1][0] == n, o.name
        else:  # a row length
            assert main[-1] == n, (o.name, o.size_meaning, main)
    softmax = tessera.bench.op("softmax")
    wide = softmax.bench_shape("float32", 4096)
    narrow = softmax.bench_shape("bfloat16", 4096)
    assert wide.shapes == narrow.shapes and wide.shape == narrow.shape
    assert wide.bytes == 2 * narrow.bytes  # 4-byte against 2-byte elements, nothing else moved
    assert wide.bytes >= 2 * 4 * numel(wide.shapes[0])  # reads x, writes y at least


def test_tolerances_order_by_precision():
    for o in tessera.bench.ops():
        if {"float32", "bfloat16"} <= set(o.dtypes):
            assert o.tolerance("float32") <= o.tolerance("bfloat16"), o.name


def test_tolerance_grows_with_the_sum():
    # DESIGN.md's error model: c * (u(dtype) + 2^-24 sqrt(k)), c = 4.
    softmax = tessera.bench.op("softmax")
    u32 = 2.0 ** -24
    assert softmax.tolerance("float32") == pytest.approx(4 * (u32 + u32))
    assert softmax.tolerance("float32", k=4096) == pytest.approx(4 * (u32 + 64 * u32))
    assert softmax.tolerance("bfloat16", k=4096) > softmax.tolerance("float32", k=4096)
    with pytest.raises(ValueError, match="k"):
        softmax.tolerance("float32", k=0)
    assert tessera.bench.op("isin").tolerance("int32", k=4096) == 0  # exact


def test_select_takes_variants_as_the_command_line_does():
    names = lambda sel: [o.name for o in tessera.bench.ops(sel)]
    assert names("softmax") == ["softmax", "softmax_backward"]
    assert names(["softmax"]) == names("softmax")
    assert "log_softmax" not in names("softmax")
    assert {"gelu", "gelu_backward", "gelu_tanh", "gelu_tanh_backward"} <= set(names("gelu"))
    assert set(names("softmax,layer_norm")) == set(names("softmax")) | set(names("layer_norm"))
    assert names(None) == [o.name for o in tessera.bench.ops()]
    assert tessera.bench.op("softmax").name == "softmax"


def test_description_errors_name_the_argument():
    softmax = tessera.bench.op("softmax")
    with pytest.raises(ValueError, match=r"argument 'select': expected op names .*got 'nope'"):
        tessera.bench.ops("softmax,nope")
    with pytest.raises(ValueError, match=r"tessera\.bench\.op: argument 'name'.*got 'soft'"):
        tessera.bench.op("soft")
    with pytest.raises(ValueError, match=r"argument 'dtype': expected a dtype of softmax "
                                         r"\(float32.*got 'int32'"):
        softmax.bench_shape("int32", 1024)
    with pytest.raises(TypeError, match=r"argument 'dtype': expected a tessera dtype name, "
                                        r"got 'float8'"):
        softmax.tolerance("float8")
    with pytest.raises(ValueError, match=r"argument 'size': expected a positive size"):
        softmax.bench_shape("float32", 0)


# ---- GPU ----

def check_stats(s, min_reps):
    assert set(s) >= {"median_ms", "p20_ms", "p80_ms", "min_ms", "max_ms", "mean_ms", "reps"}
    assert 0 < s["min_ms"] <= s["p20_ms"] <= s["median_ms"] <= s["p80_ms"] <= s["max_ms"]
    assert s["reps"] >= min_reps


def test_do_bench_torch(torch):
    x = torch.randn(1 << 22, device="cuda")
    out = torch.empty_like(x)
    check_stats(do_bench(lambda: tessera.gelu(x, out=out), min_reps=10, budget_ms=20), 10)
    check_stats(do_bench(lambda: tessera.add(x, x, out=out), flush_l2=False, min_reps=5), 5)


def test_do_bench_graph_mode(torch):
    x = torch.randn(1 << 16, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    s = do_bench(lambda: tessera.gelu(x, out=out), cuda_graph=True, graph_batch=10, min_reps=10)
    check_stats(s, 10)
    # Backward through autograd, with the forward on the capture stream.
    xs = x.clone().requires_grad_()
    g = torch.randn_like(x)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = tessera.gelu(xs)
    s = do_bench(lambda: torch.autograd.grad(y, xs, g, retain_graph=True), cuda_graph=True,
                 stream=stream, min_reps=5)
    check_stats(s, 5)


def test_peaks(torch):
    p = tessera.bench.peaks()
    assert p["copy_gbps"] > 0 and p["bf16_tflops"] > 0 and p["sm_count"] > 0 and p["gpu"]


def test_do_bench_memory_counts_torch_and_tessera_scratch(torch):
    """memory=True: one call's peak above what was allocated (what it returns included), and the
    high-water mark of tessera's own scratch pool. With the torch ops loaded, tessera's scratch
    memory comes from torch's caching allocator: counted in torch's peak, the pool unused."""
    from tessera.bench import do_bench
    stats = do_bench(lambda: torch.empty(1_000_000, device="cuda"), memory=True, min_reps=3, budget_ms=1)
    assert 3.9 <= stats["extra_mb"] <= 4.5, stats
    logits = torch.randn(4096, 1000, device="cuda")
    target = torch.randint(0, 1000, (4096,), device="cuda")
    stats = do_bench(lambda: tessera.cross_entropy(logits, target), memory=True, min_reps=3, budget_ms=1)
    # The per-row losses the mean sums (scratch), the loss and lse: no gradient without autograd.
    assert 2 * 4096 * 4 / 1e6 <= stats["extra_mb"] < 1.0, stats
    assert stats["scratch_mb"] == 0.0, stats
