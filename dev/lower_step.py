#!/usr/bin/env python3
"""Times Inductor's lowering of the Llama step's forward graph (benchmarks/llama_step.py's model,
tessera's pieces) on fake CUDA tensors: the part of torch.compile that runs on the host, measured
without a GPU. `--without-lowerings` drops tessera's up-front registration of its ops' lowerings
(tessera._torch._register_lowerings), to see what Inductor's registration at first use costs.

    python3 dev/lower_step.py [--layers 4] [--tessera all,swiglu,linear] [--without-lowerings]

The model is llama_step's small one at --layers (1 x 128 tokens: lowering does not depend on
sizes). GEMMs must be tessera's (the `linear` piece): Inductor's own mm lowering asks the GPU.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="4")
    ap.add_argument("--tessera", default="all,swiglu,linear")
    ap.add_argument("--without-lowerings", action="store_true")
    args = ap.parse_args()
    import torch
    import tessera._torch  # noqa: F401  (the ops, and the import hook on Inductor's lowerings)
    if args.without_lowerings:
        sys.meta_path[:] = [f for f in sys.meta_path
                            if getattr(f, "key", ("",))[0] != "torch._inductor.lowering"]
    from llama_step import add_shape_args, build, shape_and_pieces
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mp = argparse.ArgumentParser()
    add_shape_args(mp)
    mp.add_argument("--tessera")
    mp.add_argument("--small", action="store_true")
    margs = mp.parse_args(["--small", "--layers", args.layers, "--seq", "128", "--batch", "1",
                           "--tessera", args.tessera])
    c = shape_and_pieces(mp, margs)
    model = build(c, margs.pieces, device="cpu")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        params = {k: mode.from_tensor(v.detach()).to("cuda") for k, v in model.named_parameters()}
        buffers = {k: mode.from_tensor(v).to("cuda") for k, v in model.named_buffers()}
        tokens = torch.randint(0, c.vocab, (c.batch, c.seq), device="cuda")
        targets = torch.randint(0, c.vocab, (c.batch * c.seq,), device="cuda")
    names = list(params)

    def forward(*flat):
        return (torch.func.functional_call(model, {**dict(zip(names, flat)), **buffers}, (tokens, targets)),)
    with mode:
        gm = make_fx(forward, decomposition_table=select_decomp_table())(*params.values())
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    t = time.perf_counter()
    with V.set_fake_mode(mode):
        graph = GraphLowering(gm, example_inputs=list(params.values()))
        with V.set_graph_handler(graph):
            graph.run(*params.values())
    print(f"{args.layers} layers, pieces {','.join(margs.pieces)}: {len(calls)} calls "
          f"({sum('tessera' in str(t) for t in calls)} tessera), lowered in {time.perf_counter() - t:.2f} s"
          f"{' without tessera lowerings' if args.without_lowerings else ''}")


if __name__ == "__main__":
    main()
