"""The generic kernel's torch surface without a GPU (python/src/torch/generic.cpp): its autograd
kernel run on meta tensors, and its Meta kernels under torch.export with a dynamic dimension."""

import pytest


def test_generic_autograd_on_meta_tensors(torch_cpu):
    """The generic autograd kernel, run on meta tensors (its Meta kernel computes nothing): the
    statistics are not differentiable, a None parameter gets no gradient, the add norms give one
    gradient to input and residual, and either of their outputs alone carries the backward."""
    torch = torch_cpu
    ops = torch.ops.tessera

    def t(*shape, grad=True):
        return torch.randn(*shape, device="meta", requires_grad=grad)
    x, w, b = t(4, 8), t(8), t(8)
    out, mean, rstd = ops.layer_norm(x, [8], w, b, 1e-5)
    assert out.requires_grad and not mean.requires_grad and not rstd.requires_grad
    gx, gw, gb = torch.autograd.grad(out.sum(), (x, w, b))
    assert (gx.shape, gw.shape, gb.shape) == ((4, 8), (8,), (8,))
    out = ops.layer_norm(t(4, 8, grad=False), [8], w, None, 1e-5)[0]
    assert torch.autograd.grad(out.sum(), (w,))[0].shape == (8,)
    out = ops.rms_norm(x, [8], None, 1e-6, 0.0)[0]
    assert torch.autograd.grad(out.sum(), (x,))[0].shape == (4, 8)
    xi, ri = t(4, 8), t(4, 8)
    o, res, _, _ = ops.add_layer_norm(xi, ri, w, b, 1e-5)
    grads = torch.autograd.grad(o.sum() + res.sum(), (xi, ri, w, b))
    assert [g.shape for g in grads] == [(4, 8), (4, 8), (8,), (8,)]
    for pick in (0, 1):  # out's gradient alone, residual_out's alone
        outs = ops.add_rms_norm(xi, ri, w, 1e-6)
        gi, gr = torch.autograd.grad(outs[pick].sum(), (xi, ri))
        assert gi.shape == gr.shape == (4, 8)
    with pytest.raises(ValueError, match=r"tessera\.layer_norm: argument 'normalized_shape': expected the "
                                         r"trailing dimensions of the input's shape \[2, 3\]"):
        ops.layer_norm(torch.empty(2, 3, device="meta"), [4], None, None, 1e-5)


def test_meta_kernels_keep_dynamic_dimensions_symbolic(torch_cpu):
    """torch.export with a dynamic batch dimension (no GPU: FakeTensors on the generic Meta
    kernels): the outputs' rules leave it symbolic, so a compiled model does not recompile per
    batch size. A normalized shape is checked against the trailing dimensions only."""
    torch = torch_cpu
    from torch.export import Dim
    ops = torch.ops.tessera

    class M(torch.nn.Module):
        def forward(self, x, y, w, t, e, s):
            out, mean, rstd = ops.layer_norm(x, [8], w, None, 1e-5)
            loss, lse, grad = ops.cross_entropy(x, t, reduction="none", with_grad=True)
            return out, mean, rstd, ops.add(x, y), loss, lse, grad, ops.isin(e, s)

    n = Dim("n")
    args = (torch.randn(6, 8), torch.randn(8), torch.randn(8), torch.randint(0, 8, (6,)),
            torch.randint(0, 9, (6,)), torch.randint(0, 9, (4,)))
    ep = torch.export.export(M(), args, dynamic_shapes=({0: n}, None, None, {0: n}, {0: n}, None))
    shapes = [o.meta["val"].shape for o in ep.graph.output_node().args[0]]
    assert all(isinstance(s[0], torch.SymInt) for s in shapes), shapes
