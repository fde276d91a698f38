"""tessera inside torch.distributed (issue 36).

On any machine (CI): examples/llama_distributed.py's arguments, its split of a global batch over
the ranks and its loss comparison (pure Python), and, where torch.distributed has gloo, its DDP
and FSDP2 plumbing on the CPU (torchrun, 2 processes, torch's functions, a tiny model) against
its own single-process run.

Expert parallelism (tests/python/dist_moe.py): tessera.moe_experts over 2 gloo ranks against one
process, and on 2 GPUs where there are two.

Tensor parallelism (examples/llama_tensor_parallel.py): on any machine, its plan applied to the
small model on a fake process group of two ranks (fake CUDA tensors), whose forward must reach
tessera's registered ops on the shards with one all-reduce per sublayer; with 2 GPUs, the example
itself under torchrun (forward and backward against the unsharded model, the collectives, tessera's
kernels on both ranks).

With 2 GPUs: the example under torchrun in ddp and fsdp2 against the 1-GPU run of the same
global batch (tessera's pieces), and every op on the tensor's device and that device's current
stream whatever the current device: two devices in one process.
"""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_dist import cuda_mesh, cuda_run, mesh, run  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama_distributed.py"
TP_EXAMPLE = ROOT / "examples" / "llama_tensor_parallel.py"
VOCAB_CHECK = Path(__file__).resolve().parent / "dist_vocab_parallel.py"
MOE_CHECK = Path(__file__).resolve().parent / "dist_moe.py"


def _module(name, path):
    """An example as a module (importing it runs nothing; it needs torch and llama_step)."""
    pytest.importorskip("torch", reason="the example is a torch program")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def ex():
    return _module("llama_distributed", EXAMPLE)


def _run(cmd, timeout, env=None):
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr


def _torchrun(n):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]


# ---- CPU: arguments, batch split, comparison ----------------------------------------------------

def test_help_runs():
    rc, out = _run([sys.executable, str(EXAMPLE), "--help"], timeout=120)
    assert rc == 0, out
    for flag in ("--mode", "--tessera", "--steps", "--small", "--compare", "--device", "--batch"):
        assert flag in out


def test_arguments(ex):
    c, a = ex.parse_args(["--mode", "fsdp2", "--small", "--steps", "5", "--tessera", "all,-rope",
                          "--batch", "4"])
    assert a.mode == "fsdp2" and a.steps == 5 and c.batch == 4 and c.dim == ex.SMALL["dim"]
    assert "rope" not in a.pieces and "rms_norm" in a.pieces
    assert a.optim == "adamw" and a.lr == 3e-4 and a.out.endswith("fsdp2.json")
    c, a = ex.parse_args(["--optim", "sgd", "--steps", "2", "--warmup", "5"])
    assert a.mode == "single" and a.lr == 0.5 and a.warmup == 1 and c.dim == ex.FULL["dim"]
    with pytest.raises(SystemExit):
        ex.parse_args(["--mode", "tp"])
    with pytest.raises(SystemExit):
        ex.parse_args(["--tessera", "nonsense"])
    with pytest.raises(SystemExit):  # tessera's ops need CUDA
        ex.parse_args(["--device", "cpu"])
    assert ex.parse_args(["--device", "cpu", "--tessera", "none"])[1].pieces == ()


def test_local_rows(ex):
    assert ex.local_rows(8, 0, 1) == slice(0, 8)
    assert [ex.local_rows(8, r, 2) for r in range(2)] == [slice(0, 4), slice(4, 8)]
    rows = [ex.local_rows(12, r, 4) for r in range(4)]
    assert [i for s in rows for i in range(12)[s]] == list(range(12))  # a partition, in order
    with pytest.raises(ValueError, match="multiple of the world size"):
        ex.local_rows(3, 0, 2)
    with pytest.raises(ValueError):
        ex.local_rows(4, 2, 2)


def test_markov_tokens_same_everywhere(ex):
    a, b = ex.markov_tokens(50, 3, 9, seed=1), ex.markov_tokens(50, 3, 9, seed=1)
    assert a.shape == (3, 9) and bool((a == b).all()) and int(a.max()) < 50
    assert not bool((a == ex.markov_tokens(50, 3, 9, seed=2)).all())


def _result(losses, tps=1000.0, **kw):
    r = dict(model={"dim": 8}, pieces=["rms_norm"], global_batch=4, steps=len(losses), seed=0,
             optim="adamw", lr=3e-4, losses=losses, tokens_per_s=tps)
    r.update(kw)
    return r


def test_table_of_the_runs(ex, tmp_path):
    import json
    base = dict(world_size=1, precision="bf16 params", warmup=1, step_ms=[9.0, 4.0, 6.0], peak_gib_per_rank=[2.5])
    runs = {"single": _result([10.0, 9.5, 9.0], mode="single", **base),
            "ddp": _result([10.0, 9.5, 9.02], tps=1800.0, **dict(base, mode="ddp", world_size=2,
                                                                   peak_gib_per_rank=[2.0, 2.25]))}
    for name, r in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    assert ex.main(["--table", str(tmp_path)]) == 0
    lines = (tmp_path / "llama_distributed.md").read_text().splitlines()
    assert lines[2] == "| single (bf16 params) | 1 | 5 | 1,000 | 1.00x | 2.50 | - |"
    assert lines[3] == "| ddp (bf16 params) | 2 | 5 | 1,800 | 1.80x | 2.00, 2.25 | 0.02 (step 0: 0) |"
    (tmp_path / "single.json").unlink()
    assert ex.main(["--table", str(tmp_path)]) == 2  # no reference


def test_compare(ex):
    ref = _result([10.0, 9.5, 9.0], tps=1000.0)
    r = ex.compare(_result([10.0005, 9.51, 9.0], tps=1900.0), ref)
    assert r["ok"] and r["problems"] == []
    assert math.isclose(r["max_diff"], 0.01, rel_tol=1e-6) and r["at_step"] == 1
    assert math.isclose(r["scaling"], 1.9)
    # a later step beyond LOSS_TOL
    r = ex.compare(_result([10.0, 9.5, 9.1]), ref)
    assert not r["ok"] and r["at_step"] == 2 and "step 2" in r["problems"][0]
    # the first step beyond STEP0_TOL though within LOSS_TOL: same weights, same tokens
    r = ex.compare(_result([10.01, 9.5, 9.0]), ref)
    assert not r["ok"] and "step 0" in r["problems"][0]
    # a NaN is never within tolerance
    r = ex.compare(_result([10.0, float("nan"), 9.0]), ref)
    assert not r["ok"] and r["max_diff"] == math.inf
    # configurations that differ are not compared
    r = ex.compare(_result([10.0, 9.5, 9.0], global_batch=8), ref)
    assert not r["ok"] and "global_batch" in r["problems"][0]
    r = ex.compare(_result([10.0, 9.5]), ref)
    assert not r["ok"]
    # scaling: reported; a failure only below min_scaling
    r = ex.compare(_result([10.0, 9.5, 9.0], tps=1500.0), ref, min_scaling=1.8)
    assert not r["ok"] and "1.50x" in r["problems"][0]
    assert ex.compare(_result([10.0, 9.5, 9.0], tps=None), ref)["scaling"] is None


def test_mode_checks(ex, monkeypatch):
    # ddp without torchrun's environment says how to launch it
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    c, a = ex.parse_args(["--mode", "ddp", "--device", "cpu", "--tessera", "none"])
    with pytest.raises(SystemExit, match="torchrun"):
        ex.setup(c, a)
    monkeypatch.setenv("WORLD_SIZE", "2")
    c, a = ex.parse_args(["--mode", "single", "--device", "cpu", "--tessera", "none"])
    with pytest.raises(SystemExit, match="one process"):
        ex.setup(c, a)
    monkeypatch.setenv("RANK", "1")  # a global batch the ranks cannot share
    c, a = ex.parse_args(["--mode", "ddp", "--device", "cpu", "--tessera", "none", "--batch", "3"])
    with pytest.raises(SystemExit, match="multiple of the world size"):
        ex.setup(c, a)


# The plumbing on the CPU: tiny model, torch's functions, gloo.
TINY = ["--device", "cpu", "--tessera", "none", "--small", "--layers", "1", "--dim", "64", "--heads", "2",
        "--kv-heads", "1", "--head-dim", "32", "--ffn", "128", "--vocab", "256", "--seq", "32",
        "--batch", "4", "--steps", "4", "--warmup", "1"]


def _gloo():
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed without gloo")


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_cpu_gloo_ddp_fsdp2_match_single(tmp_path, optim):
    """DDP and FSDP2 over 2 CPU processes give the single process's losses. With SGD a gradient
    summed instead of averaged would double every update: the comparison sees it."""
    _gloo()
    args = TINY + ["--optim", optim] + (["--lr", "3e-3"] if optim == "adamw" else [])  # it trains in 4 steps
    ref = tmp_path / "single.json"
    rc, out = _run([sys.executable, str(EXAMPLE), "--mode", "single", *args, "--out", str(ref)], timeout=300)
    assert rc == 0, out
    single = json.loads(ref.read_text())
    assert single["world_size"] == 1 and len(single["losses"]) == 4
    assert single["losses"][-1] < single["losses"][0]  # it trains
    for mode in ("ddp", "fsdp2"):
        dst = tmp_path / f"{mode}.json"
        rc, out = _run(_torchrun(2) + [str(EXAMPLE), "--mode", mode, *args, "--out", str(dst),
                                       "--compare", str(ref)], timeout=300)
        assert rc == 0, f"{mode}:\n{out}"
        r = json.loads(dst.read_text())
        assert r["world_size"] == 2 and r["mode"] == mode and r["local_batch"] == 2
        assert r.get("ranks_in_sync", True)
        assert "max |loss - ref|" in out


# ---- 2 GPUs ---------------------------------------------------------------------------------------

def _two_gpus():
    torch = pytest.importorskip("torch")
    import tessera
    if not tessera.is_available():
        pytest.skip(f"needs 2 CUDA GPUs: {tessera.no_gpu_reason() or 'none usable'}")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs, torch sees {torch.cuda.device_count()}")
    return torch


@pytest.mark.gpu
@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_two_gpus_ddp_fsdp2_match_one_gpu(tmp_path, optim):
    """The benchmark model (small) with tessera's pieces: ddp and fsdp2 on 2 GPUs, the same
    global batch as the 1-GPU run, losses within bf16 noise (the example's --compare; SGD sees a
    gradient's scale, AdamW is the default)."""
    _two_gpus()
    args = ["--small", "--steps", "6", "--warmup", "2", "--batch", "4", "--optim", optim]
    ref = tmp_path / "single.json"
    rc, out = _run([sys.executable, str(EXAMPLE), "--mode", "single", *args, "--out", str(ref)], timeout=600)
    assert rc == 0, out
    for mode in ("ddp", "fsdp2"):
        dst = tmp_path / f"{mode}.json"
        rc, out = _run(_torchrun(2) + [str(EXAMPLE), "--mode", mode, *args, "--out", str(dst),
                                       "--compare", str(ref)], timeout=600)
        assert rc == 0, f"{mode}:\n{out}"
        r = json.loads(dst.read_text())
        assert r["world_size"] == 2 and all(p and p > 0 for p in r["peak_gib_per_rank"])


# Each case: (inputs, made on the CPU; how many of the first are differentiable; tessera's
# function; torch's).
def _cases(torch):
    F = torch.nn.functional
    import tessera
    bf = torch.bfloat16

    def rope_torch(q, k, cos, sin):  # tessera's contract: (x1 cos - x2 sin, x1 sin + x2 cos)
        def rot(x):
            x1, x2 = x.float().chunk(2, -1)
            c, s = cos[None, :, None], sin[None, :, None]
            return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), -1).to(x.dtype)
        return rot(q), rot(k)

    def add_norm_torch(x, r, w):
        s = x + r
        return F.rms_norm(s, (s.shape[-1],), w, 1e-5), s

    angles = torch.outer(torch.arange(64).float(), torch.rand(32))
    cos, sin = angles.cos(), angles.sin()  # float32 (seq, head_dim / 2)
    return {
        "rms_norm": (lambda: [torch.randn(64, 512, dtype=bf), torch.rand(512, dtype=bf) + 0.5], 2,
                     lambda x, w: tessera.rms_norm(x, (512,), w, 1e-5),
                     lambda x, w: F.rms_norm(x, (512,), w, 1e-5)),
        "add_rms_norm": (lambda: [torch.randn(64, 512, dtype=bf), torch.randn(64, 512, dtype=bf),
                                  torch.rand(512, dtype=bf) + 0.5], 3,
                         lambda x, r, w: tessera.add_rms_norm(x, r, w, 1e-5), add_norm_torch),
        "linear": (lambda: [torch.randn(128, 256, dtype=bf), torch.randn(384, 256, dtype=bf) / 16], 2,
                   tessera.linear, F.linear),
        "matmul": (lambda: [torch.randn(128, 256, dtype=bf), torch.randn(256, 384, dtype=bf) / 16], 2,
                   tessera.matmul, torch.matmul),
        "attention": (lambda: [torch.randn(2, 4, 128, 64, dtype=bf), torch.randn(2, 2, 128, 64, dtype=bf),
                               torch.randn(2, 2, 128, 64, dtype=bf)], 3,
                      lambda q, k, v: tessera.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                           enable_gqa=True),
                      lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                     enable_gqa=True)),
        "cross_entropy": (lambda: [torch.randn(256, 1000), torch.randint(0, 1000, (256,))], 1,
                          tessera.cross_entropy, F.cross_entropy),
        "silu_mul": (lambda: [torch.randn(64, 512, dtype=bf), torch.randn(64, 512, dtype=bf)], 2,
                     tessera.silu_mul, lambda g, u: F.silu(g) * u),
        "rotary_embedding": (lambda: [torch.randn(2, 64, 4, 64, dtype=bf), torch.randn(2, 64, 2, 64, dtype=bf),
                                      cos, sin], 2,
                             lambda q, k, c, s: tessera.rotary_embedding(q, k, c, s, layout="bshd"),
                             rope_torch),
    }


SLEEP_CYCLES = 200_000_000  # ~0.1 s at 2 GHz, before the inputs are written on the side stream


def _outputs(o):
    return tuple(o) if isinstance(o, (tuple, list)) else (o,)


def _loss(outs, grads_out):
    return sum((o.float() * g).sum() for o, g in zip(outs, grads_out))


@pytest.mark.gpu
@pytest.mark.parametrize("data_dev,current_dev", [(1, 0), (0, 1)])
@pytest.mark.parametrize("name", ["rms_norm", "add_rms_norm", "linear", "matmul", "attention",
                                  "cross_entropy", "silu_mul", "rotary_embedding"])
def test_op_on_tensors_device_and_its_current_stream(name, data_dev, current_dev):
    """Inputs on cuda:data_dev while the current device is cuda:current_dev, and data_dev's
    current stream a side stream on which a long sleep comes before the inputs are written: an
    op that ran on the current device, or on data_dev's default stream, would read the inputs
    unwritten (zeros) or fail. The forward without autograd (tessera's fast path), the forward
    with autograd (the registered op) and its backward all match torch's (computed afterwards,
    plainly), every output and gradient on the inputs' device, and tessera's kernels ran."""
    torch = _two_gpus()
    from torch.profiler import ProfilerActivity, profile
    make, n_diff, fn, ref_fn = _cases(torch)[name]
    torch.manual_seed(0)
    dev = torch.device("cuda", data_dev)
    prev = torch.cuda.current_device()
    src = [t.to(dev) for t in make()]
    with torch.no_grad():  # the gradients fed back to the outputs: fixed, made plainly
        grads_out = [torch.randn_like(o.float()) for o in _outputs(ref_fn(*src))]
    ins = [torch.zeros_like(t) for t in src]  # on data_dev's default stream
    torch.cuda.synchronize(dev)
    side = torch.cuda.Stream(device=dev)
    try:
        torch.cuda.set_device(data_dev)
        torch.cuda.set_stream(side)
        torch.cuda._sleep(SLEEP_CYCLES)
        for dst, s in zip(ins, src):
            dst.copy_(s)
        torch.cuda.set_device(current_dev)
        assert torch.cuda.current_device() == current_dev and torch.cuda.current_stream(dev) == side
        with torch.no_grad():
            fast = [o.clone() for o in _outputs(fn(*ins))]
        leaves = [t.detach().requires_grad_(i < n_diff) for i, t in enumerate(ins)]
        outs = _outputs(fn(*leaves))
        _loss(outs, grads_out).backward()
        torch.cuda.synchronize(dev)
        assert torch.cuda.current_device() == current_dev
        got = [o.detach() for o in outs]
        got_grads = [t.grad for t in leaves[:n_diff]]
    finally:
        torch.cuda.set_device(data_dev)
        torch.cuda.set_stream(torch.cuda.default_stream(dev))
        torch.cuda.set_device(prev)
    ref_ins = [t.clone().requires_grad_(i < n_diff) for i, t in enumerate(src)]  # torch's, plainly
    want = _outputs(ref_fn(*ref_ins))
    _loss(want, grads_out).backward()
    checks = ([("output, no autograd", a, b) for a, b in zip(fast, want)]
              + [("output", a, b) for a, b in zip(got, want)]
              + [(f"gradient of input {i}", g, t.grad)
                 for i, (g, t) in enumerate(zip(got_grads, ref_ins[:n_diff]))])
    for what, a, b in checks:
        assert a is not None and a.device == dev, f"{name}: {what} on {None if a is None else a.device}"
        tol = 2e-2 if b.dtype == torch.bfloat16 else 1e-3
        torch.testing.assert_close(a.float(), b.detach().float(), atol=4 * tol, rtol=tol,
                                   msg=lambda m: f"{name} {what}, data on cuda:{data_dev}, current "
                                                 f"cuda:{current_dev}: {m}")
    # tessera's own kernels ran (not torch's in its place), profiled apart: starting the profiler
    # may synchronise the devices, which would hide the race above.
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.no_grad():
            fn(*src)
        leaves = [t.detach().requires_grad_(i < n_diff) for i, t in enumerate(src)]
        _loss(_outputs(fn(*leaves)), grads_out).backward()
        torch.cuda.synchronize(dev)
    kernels = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any("tessera" in k.lower() for k in kernels), f"{name}: no tessera kernel ran: {kernels[:10]}"


# ---- tensor parallelism -------------------------------------------------------------------------

def test_tensor_parallel_table_of_the_runs(tmp_path):
    """--table writes one row per run's JSON (what rank 0 writes with --out), in file-name order,
    the worst rank's figures and every problem."""
    import json
    tp = _module("llama_tensor_parallel", TP_EXAMPLE)

    def rank(r, diff, worst, problems=()):
        return dict(rank=r, loss=1.0, ref_loss=1.0, loss_diff=diff, worst_grad=worst, comms={"all_reduce": 32},
                    tessera_kernels=136, kernels=525, peak_gib=20.5 + r, problems=list(problems), top=[])
    runs = {"1": [rank(0, 1.1e-5, ["layers.7.attention.wk", 0.011]), rank(1, 2e-6, ["tok", 0.002])],
            "2": [rank(0, 1e-6, ["a", 0.001]), rank(1, 1e-6, ["b", 0.5], ["b: gradient off by 0.5 of its norm"])]}
    pieces = {"1": "all", "2": "all,swiglu"}
    for name, ranks in runs.items():
        run = dict(world_size=2, blocks=8, pieces=pieces[name], tokens=8192, ranks=ranks)
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    assert tp.main(["--table", str(tmp_path)]) == 0
    lines = (tmp_path / "llama_tensor_parallel.md").read_text().splitlines()
    assert len(lines) == 4
    assert lines[2] == ("| all | 1.1e-05 | 0.011 (layers.7.attention.wk) | 32 all_reduce | 136 / 525, 136 / 525 | "
                        "20.50, 21.50 | ok |")
    assert lines[3].endswith("| 0.5 (b) | 32 all_reduce | 136 / 525, 136 / 525 | 20.50, 21.50 | "
                             "b: gradient off by 0.5 of its norm |")
    for f in tmp_path.glob("*.json"):
        f.unlink()
    assert tp.main(["--table", str(tmp_path)]) == 2  # no run



@pytest.mark.parametrize("pieces", ["all", "all,swiglu,linear"])
def test_tensor_parallel_plan_runs_tesseras_ops_on_shards(cuda_run, pieces):
    """The example's plan on the small model (one block), fake CUDA tensors on a fake 2-rank
    mesh: the projections are sharded as the plan says, the forward reaches tessera's registered
    ops with DTensors (the rules, not a gather), the local q/k/v have half the heads, and the
    only collectives are the two sublayer outputs' all-reduces."""
    tp = _module("llama_tensor_parallel", TP_EXAMPLE)
    run, S = cuda_run, cuda_run.Shard
    c, args = tp.parse_args(["--small", "--layers", "1", "--seq", "64", "--tessera", pieces])
    model = tp.build(c, args.pieces, device="cpu")
    # The same model in fake CUDA tensors (module.to() cannot swap fake parameters).
    real = [(m, table, name, t.detach()) for m in model.modules()
            for table in (m._parameters, m._buffers) for name, t in table.items() if t is not None]
    with run.mode:
        for m, table, name, t in real:
            fake = run.mode.from_tensor(t).to("cuda")
            table[name] = run.torch.nn.Parameter(fake) if table is m._parameters else fake
        blocks = tp.tp_plan(model, run.mesh)
        tokens = run.torch.randint(0, c.vocab, (c.batch, c.seq), device="cuda")
        targets = run.torch.randint(0, c.vocab, (c.batch * c.seq,), device="cuda")
    a, ff = model.layers[0].attention, model.layers[0].feed_forward
    assert blocks == 1 and a.wq.weight.placements == (S(0),) and a.wo.weight.placements == (S(1),)
    assert ff.w2.weight.placements == (S(1),)
    fused = "swiglu" in args.pieces
    assert (ff.w13 if fused else ff.w1.weight).placements == (S(0),)
    local_shapes = []
    a.register_forward_hook(lambda m, i, o: local_shapes.append(i[0].to_local().shape))
    (loss,), comms, seen = run.traced(model, tokens, targets)
    assert loss.shape == () and comms == 2 * blocks
    ops = {s.split(".")[1] for s in seen if s.startswith("tessera.")}
    want = {"rms_norm", "add_rms_norm", "rotary_embedding", "attention", "linear_cross_entropy"}
    want |= {"mlp"} if fused else {"silu_mul"}  # the swiglu piece: the feed-forward in one op
    want |= {"matmul"} if "linear" in args.pieces else set()
    assert want <= ops, (want - ops, seen)
    assert local_shapes == [(c.batch, c.seq, c.dim)]  # the attention's input: replicated


@pytest.mark.gpu
@pytest.mark.parametrize("pieces", ["all", "all,swiglu,linear"])
def test_two_gpus_tensor_parallel_matches_unsharded(pieces):
    """The example on 2 GPUs, the small model: loss and every gradient against the unsharded
    model, 4 all-reduces per block and nothing else, tessera's kernels on both ranks."""
    _two_gpus()
    rc, out = _run(_torchrun(2) + [str(TP_EXAMPLE), "--small", "--tessera", pieces], timeout=600)
    # rank 0's report (stdout) ends with "ok"; torch's warnings (stderr) may come after it
    assert rc == 0 and re.search(r"^ok$", out, re.M) and "FAIL" not in out, out
    assert out.count("tessera kernels") == 2, out


def _worker_ok(script, device="cpu"):
    """A dist_*.py worker under torchrun on 2 ranks (gloo on the CPU, NCCL on 2 GPUs): rank 0 says ok."""
    _gloo() if device == "cpu" else _two_gpus()
    rc, out = _run(_torchrun(2) + [str(script)] + (["--device", device] if device != "cpu" else []), timeout=300)
    assert rc == 0 and re.search(r"^ok$", out, re.M), out


# ---- vocabulary-parallel linear_cross_entropy -----------------------------------------------------

def test_vocab_parallel_cross_entropy_matches_the_whole_logits_on_cpu():
    """A weight sharded over the vocabulary (unevenly) on 2 gloo ranks: loss, d_hidden and the
    gathered d_weight equal torch's cross-entropy of the whole logits, for each reduction, with
    ignored rows and several chunks (tests/python/dist_vocab_parallel.py)."""
    _worker_ok(VOCAB_CHECK)


@pytest.mark.gpu
def test_two_gpus_vocab_parallel_cross_entropy():
    """The same on 2 GPUs in bf16: the slices' logits from tessera's GEMM, NCCL's all-reduces."""
    _worker_ok(VOCAB_CHECK, "cuda")


def test_vocab_parallel_cross_entropy_refuses_what_it_does_not_support(run):
    """Options the vocabulary-parallel path lacks are refused by name, before any collective; a
    hidden sharded by rows with a vocabulary-sharded weight too."""
    import tessera
    torch = run.torch
    w = run.distribute(torch.randn(64, 16), run.mesh, [run.Shard(0)])
    h, t = torch.randn(8, 16), torch.randint(0, 64, (8,))
    for kw, arg in ((dict(bias=torch.zeros(64)), "bias"), (dict(label_smoothing=0.1), "label_smoothing"),
                    (dict(z_loss=1e-4), "z_loss"), (dict(softcap=30.0), "softcap"),
                    (dict(reduction="max"), "reduction")):
        with pytest.raises(ValueError, match=f"argument '{arg}'"):
            tessera.linear_cross_entropy(h, w, t, **kw)
    rows = run.distribute(h, run.mesh, [run.Shard(0)])
    with pytest.raises(ValueError, match="argument 'hidden': with a vocabulary-sharded weight"):
        tessera.linear_cross_entropy(rows, w, t)


# ---- expert parallelism -----------------------------------------------------------------------------

def test_expert_parallel_moe_matches_one_process_on_cpu():
    """tessera.moe_experts with each of 2 gloo ranks holding half the experts (tokens exchanged by
    all-to-all; uneven routing and a dropped pair): each rank's output and gradients equal the
    one-process layer's on the whole weights, SwiGLU and gpt-oss's gate with biases
    (tests/python/dist_moe.py)."""
    _worker_ok(MOE_CHECK)


@pytest.mark.gpu
def test_two_gpus_expert_parallel_moe():
    """The same on 2 GPUs in bf16: tessera's kernels, NCCL's all-to-alls."""
    _worker_ok(MOE_CHECK, "cuda")
