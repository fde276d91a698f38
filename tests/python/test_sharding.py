"""DTensor sharding rules of tessera's torch ops (tessera/_sharding.py), on a CPU: a fake process
group of two ranks, a CPU device mesh, and DTensors made under FakeTensorMode, so that each op's
fake kernel runs on the local shard. Each test checks the placements DTensor chose from the rule,
the local shapes, and whether the op itself communicated.

Autograd runs on the CPU mesh (the engine needs a real device for CUDA tensors), calling the ops
themselves. The public functions on DTensors: test_sharding_public.py."""

import pytest
from fake_dist import cuda_mesh, cuda_run, mesh, placements, run  # noqa: F401 (fixtures)


def test_elementwise_ops_keep_any_sharding(run):
    ops = run.torch.ops.tessera
    for d in (0, 1):
        x = run.tensor((8, 16), run.Shard(d))
        (y,), comms = run.call(ops.silu.default, x)
        assert placements([y]) == [(run.Shard(d),)] and comms == 0
        assert y.shape == (8, 16) and y.to_local().shape == ((4, 16) if d == 0 else (8, 8))
        (z,), comms = run.call(ops.silu_mul.default, x, run.tensor((8, 16), run.Shard(d)))
        assert placements([z]) == [(run.Shard(d),)] and comms == 0


def test_every_generic_op_has_a_rule_and_elementwise_ones_default_to_any_dimension(run):
    """An op of the generic kernel gets a rule without writing one: the elementwise ones shard along
    any dimension unless their rule is written (dropout, the interleaved gates' backwards)."""
    from torch.distributed.tensor import DTensor
    from tessera import _C
    funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    ops = run.torch.ops.tessera
    generic = [d["name"] for d in _C.op_descriptions() if d["generic"]]
    assert "gelu" in generic and "silu_mul_backward" in generic
    assert [n for n in generic if getattr(ops, n).default not in funcs] == []
    x = run.tensor((8, 16), run.Shard(1))
    (y,), comms = run.call(ops.gelu_backward.default, x, run.tensor((8, 16), run.Shard(1)))
    assert placements([y]) == [(run.Shard(1),)] and comms == 0
    (a, b), comms = run.call(ops.geglu_backward.default, x, run.tensor((8, 16), run.Shard(1)),
                             run.tensor((8, 16), run.Shard(1)))
    assert placements([a, b]) == [(run.Shard(1),)] * 2 and comms == 0


def test_softmax_shards_rows_and_gathers_its_own_dimension(run):
    ops = run.torch.ops.tessera
    (y,), comms = run.call(ops.softmax.default, run.tensor((8, 16), run.Shard(0)), -1)
    assert placements([y]) == [(run.Shard(0),)] and comms == 0
    (y,), comms = run.call(ops.softmax.default, run.tensor((8, 16), run.Shard(1)), -1)
    assert run.Shard(1) not in y.placements and comms > 0  # redistributed: rows stay whole
    assert y.shape == (8, 16)


def test_norms_shard_rows_and_sum_parameter_gradients(run):
    ops = run.torch.ops.tessera
    from torch.distributed.tensor import Partial
    x, w = run.tensor((8, 16), run.Shard(0)), run.tensor((16,), run.R)
    (out, rstd), comms = run.call(ops.rms_norm.default, x, [16], w, 1e-6)
    assert placements([out, rstd]) == [(run.Shard(0),)] * 2 and comms == 0
    assert out.to_local().shape == (4, 16) and rstd.shape == (8,)
    g = run.tensor((8, 16), run.Shard(0))
    (gi, gw), comms = run.call(ops.rms_norm_backward.default, g, x, [16], rstd, w, [True, True])
    assert placements([gi, gw]) == [(run.Shard(0),), (Partial(),)] and comms == 0
    (out, mean, rstd), comms = run.call(ops.layer_norm.default, x, [16], w, w, 1e-5)
    assert placements([out, mean, rstd]) == [(run.Shard(0),)] * 3 and comms == 0
    # Sharded along the normalized dimension: gathered first.
    (out, _), comms = run.call(ops.rms_norm.default, run.tensor((8, 16), run.Shard(1)), [16], w, 1e-6)
    assert run.Shard(1) not in out.placements and comms > 0


def test_add_norms_shard_rows_and_sum_parameter_gradients(run):
    ops = run.torch.ops.tessera
    from torch.distributed.tensor import Partial
    x, r = run.tensor((8, 16), run.Shard(0)), run.tensor((8, 16), run.Shard(0))
    w = run.tensor((16,), run.R)
    (out, res, rstd), comms = run.call(ops.add_rms_norm.default, x, r, w, 1e-6)
    assert placements([out, res, rstd]) == [(run.Shard(0),)] * 3 and comms == 0
    assert res.to_local().shape == (4, 16) and rstd.shape == (8,)
    g = run.tensor((8, 16), run.Shard(0))
    (gi, gw), comms = run.call(ops.add_rms_norm_backward.default, g, g, res, rstd, w, [True, True])
    assert placements([gi, gw]) == [(run.Shard(0),), (Partial(),)] and comms == 0
    (gi, gw), comms = run.call(ops.add_rms_norm_backward.default, g, None, res, rstd, w, [True, True])
    assert placements([gi, gw]) == [(run.Shard(0),), (Partial(),)] and comms == 0
    outs, comms = run.call(ops.add_layer_norm.default, x, r, w, w, 1e-5)
    assert placements(outs) == [(run.Shard(0),)] * 4 and comms == 0
    _, res, mean, rstd = outs
    outs, comms = run.call(ops.add_layer_norm_backward.default, g, g, res, mean, rstd, w, w, [True, True, True])
    assert placements(outs) == [(run.Shard(0),), (Partial(),), (Partial(),)] and comms == 0
    # The residual sharded along the normalized dimension: gathered first.
    (out, res, _), comms = run.call(ops.add_rms_norm.default, x, run.tensor((8, 16), run.Shard(1)), w, 1e-6)
    assert run.Shard(1) not in res.placements and comms > 0


def test_dropout_does_not_run_sharded(run):
    (y,), comms = run.call(run.torch.ops.tessera.dropout.default, run.tensor((8, 16), run.Shard(0)), 0.1, 7, 0)
    assert placements([y]) == [(run.R,)] and comms > 0


def test_rotary_and_attention_shard_by_heads(run):
    ops = run.torch.ops.tessera
    q, k = run.tensor((2, 6, 4, 16), run.Shard(2)), run.tensor((2, 6, 2, 16), run.Shard(2))
    angles = run.tensor((6, 8), run.R)
    outs, comms = run.call(ops.rotary_embedding.default, q, k, angles, angles)
    assert placements(outs) == [(run.Shard(2),)] * 2 and comms == 0
    assert outs[0].to_local().shape == (2, 6, 2, 16) and outs[1].to_local().shape == (2, 6, 1, 16)
    v = run.tensor((2, 6, 2, 16), run.Shard(2))
    (out, lse), comms = run.call(ops.attention.default, q, k, v, causal=True)
    assert placements([out, lse]) == [(run.Shard(2),), (run.Shard(1),)] and comms == 0
    assert out.shape == (2, 6, 4, 16) and lse.shape == (2, 4, 6)


def test_attention_alibi_slopes_shard_with_the_batch_or_heads_and_gqa_groups_stay_whole(run):
    """ALiBi's slopes go with the heads (or the batch) they belong to: given so sharded, nothing
    moves (a rule replicating them would gather them, and one leaving them replicated under a
    head shard would give each rank the first heads' slopes)."""
    ops, S = run.ops, run.Shard
    q, k = run.tensor((2, 6, 4, 16), S(2)), run.tensor((2, 6, 4, 16), S(2))
    for slopes in (run.tensor((4,), S(0)), run.tensor((2, 4), S(1))):
        (out, lse), comms = run.call(ops.attention.default, q, k, k, alibi_slopes=slopes)
        assert placements([out, lse]) == [(S(2),), (S(1),)] and comms == 0
        grads, comms = run.call(ops.attention_backward.default, out, q, k, k, out, lse, alibi_slopes=slopes)
        assert placements(grads) == [(S(2),)] * 3 and comms == 0
    b = run.tensor((2, 6, 4, 16), S(0))
    (out, _), comms = run.call(ops.attention.default, b, b, b, alibi_slopes=run.tensor((2, 4), S(0)))
    assert placements([out]) == [(S(0),)] and comms == 0
    # GQA, 6 query heads on 3 key heads: two ranks would split a group (3 and 3 query heads, 2
    # and 1 key heads). Gathered.
    kv = run.tensor((2, 6, 3, 16), S(2))
    (out, _), comms = run.call(ops.attention.default, run.tensor((2, 6, 6, 16), S(2)), kv, kv)
    assert S(2) not in out.placements and comms > 0
    (out, _), comms = run.call(ops.attention.default, run.tensor((2, 6, 8, 16), S(2)), q, q)  # 8 on 4: whole groups
    assert out.placements == (S(2),) and comms == 0


def test_varlen_attention_shards_by_heads_only(run):
    ops, S, R = run.ops, run.Shard, run.R
    q, k, v = run.tensor((16, 4, 8), S(1)), run.tensor((16, 2, 8), S(1)), run.tensor((16, 2, 8), S(1))
    cu = run.ints((3,), 16, R)
    (out, lse), comms = run.call(ops.attention.varlen, q, k, v, cu, cu, 8, 8, causal=True)
    assert placements([out, lse]) == [(S(1),), (S(0),)] and comms == 0
    assert out.to_local().shape == (16, 2, 8) and lse.to_local().shape == (2, 16)
    (dq, dk, dv), comms = run.call(ops.attention_backward.varlen, out, q, k, v, out, lse, cu, cu, 8, 8)
    assert placements([dq, dk, dv]) == [(S(1),)] * 3 and comms == 0
    # The packed tokens sharded: gathered, the offsets being global.
    (out, _), comms = run.call(ops.attention.varlen, run.tensor((16, 4, 8), S(0)), k, v, cu, cu, 8, 8)
    assert S(0) not in out.placements and comms > 0
    # GQA whose key heads do not divide among the ranks: replicated.
    k1 = run.tensor((16, 1, 8), R)
    (out, _), comms = run.call(ops.attention.varlen, q, k1, k1, cu, cu, 8, 8)
    assert placements([out]) == [(R,)]


def test_kvcache_attention_shards_by_batch_or_heads_and_keeps_a_paged_pool_whole(run):
    ops, S, R = run.ops, run.Shard, run.R
    q = run.tensor((2, 1, 4, 8), S(0))
    kc, vc = run.tensor((2, 16, 2, 8), S(0)), run.tensor((2, 16, 2, 8), S(0))
    lens = run.ints((2,), 16, S(0))
    (out, lse), comms = run.call(ops.attention.kvcache, q, kc, vc, lens)
    assert placements([out, lse]) == [(S(0),)] * 2 and comms == 0 and out.to_local().shape == (1, 1, 4, 8)
    qh, kh, vh = run.tensor((2, 1, 4, 8), S(2)), run.tensor((2, 16, 2, 8), S(2)), run.tensor((2, 16, 2, 8), S(2))
    (out, lse), comms = run.call(ops.attention.kvcache, qh, kh, vh, run.ints((2,), 16, R))
    assert placements([out, lse]) == [(S(2),), (S(1),)] and comms == 0
    # Paged: each rank its rows of block_table, the pool replicated.
    pool = run.tensor((6, 4, 2, 8), R)
    table = run.ints((2, 3), 6, S(0))
    (out, _), comms = run.call(ops.attention.kvcache, q, pool, pool, lens, table)
    assert placements([out]) == [(S(0),)] and comms == 0


def test_rotary_shards_per_sequence_angles_and_offsets_with_the_batch(run):
    ops, S = run.ops, run.Shard
    q, k = run.tensor((2, 6, 4, 16), S(0)), run.tensor((2, 6, 2, 16), S(0))
    angles = run.tensor((2, 6, 8), S(0))  # one row of angles per sequence
    outs, comms = run.call(ops.rotary_embedding.default, q, k, angles, angles, seqlen_offsets=run.ints((2,), 4, S(0)))
    assert placements(outs) == [(S(0),)] * 2 and comms == 0 and outs[0].to_local().shape == (1, 6, 4, 16)
    # By heads: the angles whole.
    q, k = run.tensor((2, 6, 4, 16), S(2)), run.tensor((2, 6, 2, 16), S(2))
    outs, comms = run.call(ops.rotary_embedding.default, q, k, angles, angles)
    assert placements(outs) == [(S(2),)] * 2 and comms > 0  # the angles gathered


def test_add_broadcasts_shards_and_partial_sums(run):
    ops = run.ops
    x, bias = run.tensor((8, 16), run.Shard(1)), run.tensor((16,), run.R)
    (y,), comms = run.call(ops.add.default, x, bias)
    assert placements([y]) == [(run.Shard(1),)] and comms == 0 and y.to_local().shape == (8, 8)
    (y,), comms = run.call(ops.add.default, run.tensor((8, 16), run.P), run.tensor((8, 16), run.P), alpha=2.0)
    assert placements([y]) == [(run.P,)] and comms == 0
    (y,), comms = run.call(ops.add.Scalar, run.tensor((8, 16), run.Shard(0)), 2.0)
    assert placements([y]) == [(run.Shard(0),)] and comms == 0
    (y,), comms = run.call(ops.add.Scalar, run.tensor((8, 16), run.P), 2.0)  # each rank would add 2
    assert placements([y]) != [(run.P,)] and comms > 0


def test_isin_shards_the_elements(run):
    (y,), comms = run.call(run.ops.isin.default, run.ints((8, 16), 32, run.Shard(1)), run.ints((5,), 32, run.R))
    assert placements([y]) == [(run.Shard(1),)] and comms == 0 and y.to_local().shape == (8, 8)


def test_matmul_shards_rows_batch_and_columns(run):
    mm, S, R = run.ops.matmul.default, run.Shard, run.R
    (y,), comms = run.call(mm, run.tensor((8, 16), S(0)), run.tensor((16, 32), R))
    assert placements([y]) == [(S(0),)] and comms == 0 and y.to_local().shape == (4, 32)
    # Column-parallel: other's columns, with bias and residual along, and an activation.
    (y,), comms = run.call(mm, run.tensor((8, 16), R), run.tensor((16, 32), S(1)), bias=run.tensor((32,), S(0)),
                           residual=run.tensor((8, 32), S(1)), activation="gelu")
    assert placements([y]) == [(S(1),)] and comms == 0 and y.to_local().shape == (8, 16)
    # bias and residual are keyword arguments, which DTensor does not redistribute: the op takes
    # them as placed, so replicated ones make the product replicated (other gathered).
    (y,), comms = run.call(mm, run.tensor((8, 16), R), run.tensor((16, 32), S(1)), bias=run.tensor((32,), R),
                           residual=run.tensor((8, 32), R))
    assert placements([y]) == [(R,)] and comms > 0
    (y,), comms = run.call(mm, run.tensor((8, 16), S(0)), run.tensor((16, 32), R), bias=run.tensor((32,), R),
                           residual=run.tensor((8, 32), S(0)))
    assert placements([y]) == [(S(0),)] and comms == 0
    with pytest.raises(RuntimeError, match="does not redistribute keyword arguments"):
        run.call(mm, run.tensor((8, 16), S(0)), run.tensor((16, 32), R), bias=run.tensor((32,), S(0)),
                 activation="swiglu")  # no strategy shards the bias without other's columns
    # 3-d: the batch (a shared 2-d other, or a batched one sharded alike), or the rows.
    (y,), comms = run.call(mm, run.tensor((4, 8, 16), S(0)), run.tensor((16, 32), R))
    assert placements([y]) == [(S(0),)] and comms == 0 and y.to_local().shape == (2, 8, 32)
    (y,), comms = run.call(mm, run.tensor((4, 8, 16), S(0)), run.tensor((4, 16, 32), S(0)))
    assert placements([y]) == [(S(0),)] and comms == 0
    (y,), comms = run.call(mm, run.tensor((4, 8, 16), S(1)), run.tensor((16, 32), R))
    assert placements([y]) == [(S(1),)] and comms == 0 and y.to_local().shape == (4, 4, 32)
    (y,), comms = run.call(mm, run.tensor((4, 8, 16), R), run.tensor((16, 32), S(1)))
    assert placements([y]) == [(S(2),)] and comms == 0 and y.to_local().shape == (4, 8, 16)


def test_scaled_mm_shards_as_matmul_with_the_scales_replicated(run):
    smm, S, R, P = run.ops.scaled_mm.default, run.Shard, run.R, run.P
    torch = run.torch

    def f8(shape, p):
        t = run.tensor(shape, p)
        with run.mode:
            return t.to(torch.float8_e4m3fn)
    scale = run.tensor((), R)
    (y,), comms = run.call(smm, f8((8, 16), S(0)), f8((16, 32), R), scale, scale)
    assert placements([y]) == [(S(0),)] and comms == 0 and y.to_local().shape == (4, 32)
    (y,), comms = run.call(smm, f8((8, 16), R), f8((16, 32), S(1)), scale, scale,
                           bias=run.tensor((32,), S(0), dtype=torch.bfloat16))
    assert placements([y]) == [(S(1),)] and comms == 0 and y.to_local().shape == (8, 16)
    (y,), comms = run.call(smm, f8((8, 16), S(1)), f8((16, 32), S(0)), scale, scale)
    assert placements([y]) == [(P,)] and comms == 0 and y.to_local().shape == (8, 32)
    # A bias given replicated (keyword arguments stay as placed): K is not split, rows are.
    (y,), comms = run.call(smm, f8((8, 16), S(0)), f8((16, 32), R), scale, scale,
                           bias=run.tensor((32,), R, dtype=torch.bfloat16))
    assert placements([y]) == [(S(0),)] and comms == 0


def test_scaled_mm_shards_rowwise_scales_with_their_operand(run):
    smm, S, R, P = run.ops.scaled_mm.default, run.Shard, run.R, run.P
    torch = run.torch

    def f8(shape, p):
        t = run.tensor(shape, p)
        with run.mode:
            return t.to(torch.float8_e4m3fn)
    # Rows: scale_a's rows with input's; columns: scale_b's with other's; K: both replicated.
    (y,), comms = run.call(smm, f8((8, 16), S(0)), f8((16, 32), R), run.tensor((8, 1), S(0)), run.tensor((1, 32), R))
    assert placements([y]) == [(S(0),)] and comms == 0 and y.to_local().shape == (4, 32)
    (y,), comms = run.call(smm, f8((8, 16), R), f8((16, 32), S(1)), run.tensor((8, 1), R), run.tensor((1, 32), S(1)))
    assert placements([y]) == [(S(1),)] and comms == 0 and y.to_local().shape == (8, 16)
    (y,), comms = run.call(smm, f8((8, 16), S(1)), f8((16, 32), S(0)), run.tensor((8, 1), R), run.tensor((1, 32), R))
    assert placements([y]) == [(P,)] and comms == 0 and y.to_local().shape == (8, 32)


def test_float8_quantize_shards_rows_only_where_each_group_is_a_row(run):
    fq, S, R = run.ops.float8_quantize, run.Shard, run.R
    torch = run.torch
    # 'row': rows sharded with their scales, comm-free.
    (q, scale), comms = run.call(fq.default, run.tensor((8, 16), S(0)))
    assert placements([q, scale]) == [(S(0),)] * 2 and comms == 0
    assert q.to_local().shape == (4, 16) and q.dtype == torch.float8_e4m3fn and scale.to_local().shape == (4, 1)
    # 'block': each row's 1 x 128 blocks, rows sharded likewise.
    (q, scale), comms = run.call(fq.default, run.tensor((8, 256), S(0)), granularity="block")
    assert placements([q, scale]) == [(S(0),)] * 2 and comms == 0 and scale.to_local().shape == (4, 2)
    # K sharded splits each row's amax: gathered, the outputs whole.
    (q, scale), comms = run.call(fq.default, run.tensor((8, 16), S(1)))
    assert S(1) not in q.placements and comms > 0 and q.shape == (8, 16)
    # one scale for the tensor, and the transposed copy (each column's amax over all rows): replicated.
    (q, scale), comms = run.call(fq.default, run.tensor((8, 16), S(0)), granularity="tensor")
    assert placements([q, scale]) == [(R,)] * 2 and comms > 0 and scale.shape == ()
    outs, comms = run.call(fq.columns, run.tensor((16, 32), S(0)))
    assert placements(outs) == [(R,)] * 4 and comms > 0
    assert [tuple(o.shape) for o in outs] == [(16, 32), (16, 1), (32, 16), (1, 32)]


def test_float8_quantize_gated_shards_as_float8_quantize_with_gate_and_up_alike(run):
    fq, S, R = run.ops.float8_quantize_gated, run.Shard, run.R
    torch = run.torch
    # 'row': both inputs' rows sharded, q and scale with them, comm-free.
    (q, scale), comms = run.call(fq.default, run.tensor((8, 16), S(0)), run.tensor((8, 16), S(0)))
    assert placements([q, scale]) == [(S(0),)] * 2 and comms == 0
    assert q.to_local().shape == (4, 16) and q.dtype == torch.float8_e4m3fn and scale.to_local().shape == (4, 1)
    # up placed otherwise: moved to gate's placement, the rows still sharded.
    (q, scale), comms = run.call(fq.default, run.tensor((8, 16), S(0)), run.tensor((8, 16), R))
    assert placements([q, scale]) == [(S(0),)] * 2
    # per tensor, and the transposed copy: replicated.
    (q, scale), comms = run.call(fq.default, run.tensor((8, 16), S(0)), run.tensor((8, 16), S(0)), granularity="tensor")
    assert placements([q, scale]) == [(R,)] * 2 and comms > 0 and scale.shape == ()
    outs, comms = run.call(fq.columns, run.tensor((16, 32), S(0)), run.tensor((16, 32), S(0)), activation="gelu_tanh")
    assert placements(outs) == [(R,)] * 4 and comms > 0
    assert [tuple(o.shape) for o in outs] == [(16, 32), (16, 1), (32, 16), (1, 32)]


def test_copy_writes_dst_where_it_is_placed(run):
    cp, S, R = run.ops.copy.default, run.Shard, run.R
    for p in (R, S(0), S(1), run.P):
        dst = run.tensor((8, 16), p)
        _, comms = run.call(cp, run.tensor((8, 16), p), dst)
        assert placements([dst]) == [(p,)] and comms == 0
    dst = run.tensor((8, 16), S(1))
    _, comms = run.call(cp, run.tensor((8, 16), S(0)), dst)  # src brought to dst's placement
    assert placements([dst]) == [(S(1),)] and comms > 0


def test_matmul_row_parallel_is_a_partial_sum_only_without_an_activation(run):
    mm, S, R, P = run.ops.matmul.default, run.Shard, run.R, run.P
    a, b = run.tensor((8, 16), S(1)), run.tensor((16, 32), S(0))
    (y,), comms = run.call(mm, a, b, alpha=0.5)
    assert placements([y]) == [(P,)] and comms == 0 and y.to_local().shape == (8, 32)
    (y,), comms = run.call(mm, run.tensor((4, 8, 16), S(2)), b)
    assert placements([y]) == [(P,)] and comms == 0
    # bias and residual distribute over the sum as partial sums themselves (aten.addmm's way);
    # replicated ones (keyword arguments, not redistributed) do not: K gathered.
    (y,), comms = run.call(mm, a, b, bias=run.tensor((32,), P), residual=run.tensor((8, 32), P))
    assert placements([y]) == [(P,)] and comms == 0
    (y,), comms = run.call(mm, a, b, bias=run.tensor((32,), R))
    assert not y.placements[0].is_partial() and comms > 0
    # An activation does not: K is gathered first.
    for activation in ("gelu", "relu", "silu"):
        (y,), comms = run.call(mm, a, b, activation=activation)
        assert not y.placements[0].is_partial() and comms > 0
    # A partial sum times a replicated operand stays one.
    (y,), comms = run.call(mm, run.tensor((8, 16), P), run.tensor((16, 32), R))
    assert placements([y]) == [(P,)] and comms == 0
    (y,), comms = run.call(mm, run.tensor((8, 16), P), run.tensor((16, 32), R), activation="gelu")
    assert not y.placements[0].is_partial() and comms > 0


def test_matmul_swiglu_shards_columns_of_whole_gate_up_blocks(run):
    ops, S, R = run.ops, run.Shard, run.R
    x = run.tensor((8, 16), R)
    # N = 256: 128 columns (one gate/up block pair) on each rank; its output is 64 of the 128 features.
    (y,), comms = run.call(ops.matmul.default, x, run.tensor((16, 256), S(1)), bias=run.tensor((256,), S(0)),
                           activation="swiglu")
    assert placements([y]) == [(S(1),)] and comms == 0 and y.shape == (8, 128) and y.to_local().shape == (8, 64)
    (y, z), comms = run.call(ops.matmul.preactivation, x, run.tensor((16, 256), S(1)), activation="swiglu")
    assert placements([y, z]) == [(S(1),)] * 2 and comms == 0 and z.to_local().shape == (8, 128)
    # N = 128: a column shard would split a block between gate and up: gathered.
    (y,), comms = run.call(ops.matmul.default, x, run.tensor((16, 128), S(1)), activation="swiglu")
    assert S(1) not in y.placements and comms > 0
    # Rows shard whatever N.
    (y,), comms = run.call(ops.matmul.default, run.tensor((8, 16), S(0)), run.tensor((16, 128), R), activation="swiglu")
    assert placements([y]) == [(S(0),)] and comms == 0
    # K sharded: the activation does not distribute over the partial sums.
    (y,), comms = run.call(ops.matmul.default, run.tensor((8, 16), S(1)), run.tensor((16, 256), S(0)),
                           activation="swiglu")
    assert not y.placements[0].is_partial() and comms > 0
    # Its backward by the same blocks.
    (g,), comms = run.call(ops.swiglu_backward.default, run.tensor((8, 128), S(1)), run.tensor((8, 256), S(1)))
    assert placements([g]) == [(S(1),)] and comms == 0 and g.to_local().shape == (8, 128)
    (g,), comms = run.call(ops.swiglu_backward.default, run.tensor((8, 64), S(1)), run.tensor((8, 128), S(1)))
    assert S(1) not in g.placements and comms > 0
    (g,), comms = run.call(ops.swiglu_backward.default, run.tensor((8, 64), S(0)), run.tensor((8, 128), S(0)))
    assert placements([g]) == [(S(0),)] and comms == 0


def test_matmul_autograd_column_then_row_parallel(run):
    """The Megatron MLP on the ops: x @ w1 (columns, swiglu) @ w2 (rows) + b2. The forward
    communicates nothing (a partial sum out); the gradients land where the parameters are."""
    ops, S, R, P = run.ops, run.Shard, run.R, run.P
    x, w1 = run.tensor((2, 8, 16), R, requires_grad=True), run.tensor((16, 256), S(1), requires_grad=True)
    w2, b2 = run.tensor((128, 16), S(0), requires_grad=True), run.tensor((16,), R, requires_grad=True)
    from tessera.matrix import _epilogue_as_placed
    with run.mode, run.comm() as c:
        h = ops.matmul.default(x, w1, activation="swiglu")
        bias, _ = _epilogue_as_placed(h, w2, b2, None, None)  # as tessera.matmul places it
        y = ops.matmul.default(h, w2, bias=bias)
    assert placements([h, bias, y]) == [(S(2),), (P,), (P,)] and c.get_total_counts() == 0
    with run.mode, run.comm() as c:
        y.full_tensor().sum().backward()
    assert c.get_total_counts() == 1  # full_tensor's all-reduce; the backward itself none
    assert placements([w1.grad, w2.grad, b2.grad, x.grad]) == [(S(1),), (S(0),), (R,), (P,)]
    assert w1.grad.to_local().shape == (16, 128) and w2.grad.to_local().shape == (64, 16)


def test_mlp_shards_rows_or_runs_megatrons_mlp(run):
    """mlp(x [..., K], w_in [N, K], w_out [D, N']): rows with replicated weights; x replicated with
    w_in's rows and w_out's columns sharded, a partial sum out (for swiglu in whole 128-row
    blocks: N = 256 on 2 ranks, not 128)."""
    ops, S, R, P = run.ops, run.Shard, run.R, run.P
    w_in, w_out = run.tensor((256, 16), R), run.tensor((24, 128), R)
    for shape, d in (((8, 16), 0), ((2, 8, 16), 0), ((2, 8, 16), 1)):
        (y,), comms = run.call(ops.mlp.default, run.tensor(shape, S(d)), w_in, w_out)
        assert placements([y]) == [(S(d),)] and comms == 0 and y.shape == shape[:-1] + (24,)
    (y, z), comms = run.call(ops.mlp.preactivation, run.tensor((2, 8, 16), S(0)), w_in, w_out)
    assert placements([y, z]) == [(S(0),)] * 2 and comms == 0 and z.to_local().shape == (1, 8, 256)
    x = run.tensor((2, 8, 16), R)
    (y, z), comms = run.call(ops.mlp.preactivation, x, run.tensor((256, 16), S(0)), run.tensor((24, 128), S(1)))
    assert placements([y, z]) == [(P,), (S(2),)] and comms == 0
    assert y.to_local().shape == (2, 8, 24) and z.to_local().shape == (2, 8, 128)
    (y,), comms = run.call(ops.mlp.default, x, run.tensor((96, 16), S(0)), run.tensor((24, 96), S(1)),
                           activation="gelu")
    assert placements([y]) == [(P,)] and comms == 0
    # 128 rows of swiglu on 2 ranks would split a gate/up block: gathered, not a partial sum.
    (y,), comms = run.call(ops.mlp.default, x, run.tensor((128, 16), S(0)), run.tensor((24, 64), S(1)))
    assert not y.placements[0].is_partial() and comms > 0
    # The recomputing backward of swiglu by the same blocks.
    (g, h), comms = run.call(ops.swiglu_backward.recompute, run.tensor((8, 128), S(1)), run.tensor((8, 256), S(1)))
    assert placements([g, h]) == [(S(1),)] * 2 and comms == 0 and h.to_local().shape == (8, 64)
    (g, h), comms = run.call(ops.swiglu_backward.recompute, run.tensor((8, 64), S(0)), run.tensor((8, 128), S(0)))
    assert placements([g, h]) == [(S(0),)] * 2 and comms == 0


def test_mlp_autograd_megatron_and_rows(run):
    """The backward of mlp's sharded forwards communicates nothing, and the gradients land where
    the parameters are (Megatron: w_in by rows, w_out by columns, x's a partial sum; rows: the
    weights' partial sums)."""
    S, R, P = run.Shard, run.R, run.P
    ops = run.ops
    x = run.tensor((2, 8, 16), R, requires_grad=True)
    w_in, w_out = run.tensor((256, 16), S(0), requires_grad=True), run.tensor((24, 128), S(1), requires_grad=True)
    with run.mode, run.comm() as c:
        y = ops.mlp.default(x, w_in, w_out)
    assert placements([y]) == [(P,)] and c.get_total_counts() == 0
    with run.mode, run.comm() as c:
        y.full_tensor().sum().backward()
    assert c.get_total_counts() == 1  # full_tensor's all-reduce; the backward itself none
    assert placements([w_in.grad, w_out.grad, x.grad]) == [(S(0),), (S(1),), (P,)]
    assert w_in.grad.to_local().shape == (128, 16) and w_out.grad.to_local().shape == (24, 64)
    x = run.tensor((2, 8, 16), S(0), requires_grad=True)
    w_in, w_out = run.tensor((256, 16), R, requires_grad=True), run.tensor((24, 128), R, requires_grad=True)
    with run.mode, run.comm() as c:
        ops.mlp.default(x, w_in, w_out).sum().backward()  # the sum a partial sum too
    assert placements([x.grad, w_in.grad, w_out.grad]) == [(S(0),), (P,), (P,)] and c.get_total_counts() == 0


def test_losses_shard_rows_for_none_and_sum_and_replicate_mean(run):
    ops, S, R, P = run.ops, run.Shard, run.R, run.P
    logits, target = run.tensor((8, 32), S(0)), run.ints((8,), 32, S(0))
    outs, comms = run.call(ops.cross_entropy.default, logits, target, reduction="none", with_grad=True)
    assert placements(outs) == [(S(0),)] * 3 and comms == 0 and outs[2].to_local().shape == (4, 32)
    outs, comms = run.call(ops.cross_entropy.default, logits, target, run.tensor((32,), R), reduction="sum",
                           label_smoothing=0.1, z_loss=1e-4)
    assert placements(outs[:2]) == [(P,), (S(0),)] and outs[2] is None and comms == 0 and outs[0].shape == ()
    probs = run.tensor((8, 32), S(0))  # class probabilities: sharded as the logits
    outs, comms = run.call(ops.cross_entropy.default, logits, probs, reduction="sum")
    assert placements(outs[:1])[0] == (P,) and comms == 0
    # 'mean' divides by the whole batch's count: rows gathered.
    outs, comms = run.call(ops.cross_entropy.default, logits, target, reduction="mean")
    assert placements(outs[:2]) == [(R,)] * 2 and outs[2] is None and comms > 0
    # The vocabulary sharded (vocab-parallel) has no rule: gathered.
    outs, comms = run.call(ops.cross_entropy.default, run.tensor((8, 32), S(1)), target, reduction="none")
    assert S(1) not in outs[0].placements and comms > 0
    hidden, weight = run.tensor((8, 16), S(0)), run.tensor((32, 16), R)
    outs, comms = run.call(ops.linear_cross_entropy.default, hidden, weight, run.tensor((32,), R), target,
                           reduction="sum", output_mask=[True, True, True])
    assert placements(outs[:5]) == [(P,), (S(0),), (S(0),), (P,), (P,)] and outs[5] is None and comms == 0
    assert outs[2].to_local().shape == (4, 16) and outs[3].to_local().shape == (32, 16)
    outs, comms = run.call(ops.linear_cross_entropy.default, hidden, weight, None, target, reduction="none",
                           output_mask=[True, True, False], grad_loss=run.tensor((8,), S(0)))
    assert placements(outs[:4]) == [(S(0),), (S(0),), (S(0),), (P,)] and outs[4] is None and comms == 0
    outs, comms = run.call(ops.linear_cross_entropy.default, hidden, weight, None, target, reduction="mean")
    assert placements(outs[:1]) == [(R,)] and comms > 0


def test_mean_losses_of_row_sharded_dtensors_move_no_logits(run):
    """tessera.cross_entropy and linear_cross_entropy with 'mean' on rows sharded: the op's 'sum'
    by rows (a partial sum) over the batch's count of rows not ignored (all-reduced scalars), not
    the op's 'mean', which gathers the rows. With class weights (a divisor of their sum) the rows
    are gathered."""
    import tessera
    S, R = run.Shard, run.R
    target = run.ints((8,), 32, S(0))
    logits = run.tensor((8, 32), S(0), requires_grad=True)
    hidden, weight = run.tensor((8, 16), S(0), requires_grad=True), run.tensor((32, 16), R, requires_grad=True)
    calls = [lambda: tessera.cross_entropy(logits, target, label_smoothing=0.1),
             lambda: tessera.cross_entropy(logits, run.tensor((8, 32), S(0))),  # probabilities: over N
             lambda: tessera.cross_entropy(logits.detach().clone(), target, inplace_grad=True),
             lambda: tessera.linear_cross_entropy(hidden, weight, target)]
    for fn in calls:
        with run.mode, run.comm() as c:
            loss = fn()
            if loss.requires_grad:
                loss.backward()
        kinds = {str(k) for k in c.get_comm_counts()}
        assert loss.shape == () and not any("all_gather" in k for k in kinds), kinds
    assert placements([logits.grad, hidden.grad, weight.grad]) == [(S(0),), (S(0),), (run.P,)]
    with run.mode, run.comm() as c:
        loss = tessera.cross_entropy(logits, target, run.tensor((32,), R))
    assert loss.placements == (R,) and any("all_gather" in str(k) for k in c.get_comm_counts())


def test_losses_written_in_place_never_move(run):
    """cross_entropy.inplace writes the gradient over the logits and cross_entropy.backward scales
    the gradient in place: a redistribution would write a copy. Their rules keep the argument
    where it is, or refuse."""
    ops, S, R, P = run.ops, run.Shard, run.R, run.P
    target = run.ints((8,), 32, S(0))
    outs, comms = run.call(ops.cross_entropy.inplace, run.tensor((8, 32), S(0)), target, reduction="sum")
    assert placements(outs) == [(P,), (S(0),)] and comms == 0
    outs, comms = run.call(ops.cross_entropy.inplace, run.tensor((8, 32), R), target, reduction="mean")
    assert placements(outs) == [(R,)] * 2
    for logits, reduction in ((run.tensor((8, 32), S(0)), "mean"), (run.tensor((8, 32), S(1)), "sum")):
        with pytest.raises(RuntimeError, match="written in place"):
            run.call(ops.cross_entropy.inplace, logits, target, reduction=reduction)
    scale = run.tensor((), R)
    for grad in (run.tensor((8, 32), S(0)), run.tensor((8, 32), S(1)), run.tensor((32, 16), P),
                 run.tensor((8, 32), R)):
        _, comms = run.call(ops.cross_entropy.backward, scale, grad, reduction="sum")
        assert comms == 0
    for per_row in (run.tensor((8,), S(0)), run.tensor((8,), R)):  # 'none': one factor a row, with the rows
        _, comms = run.call(ops.cross_entropy.backward, per_row, run.tensor((8, 32), S(0)), reduction="none")
        assert comms == 0


def test_loss_autograd_by_rows(run):
    ops, S, R, P = run.ops, run.Shard, run.R, run.P
    target = run.ints((8,), 32, S(0))
    logits = run.tensor((8, 32), S(0), requires_grad=True)
    with run.mode, run.comm() as c:
        loss, _, _ = ops.cross_entropy.default(logits, target, reduction="sum")
        loss.backward()
    assert placements([loss, logits.grad]) == [(P,), (S(0),)] and c.get_total_counts() == 0
    import tessera
    hidden, weight = run.tensor((8, 16), S(0), requires_grad=True), run.tensor((32, 16), R, requires_grad=True)
    for reduction in ("sum", "none"):
        hidden.grad = weight.grad = None
        with run.mode, run.comm() as c:
            loss = tessera.linear_cross_entropy(hidden, weight, target, reduction=reduction)
            (loss if reduction == "sum" else loss.sum()).backward()
        assert placements([hidden.grad, weight.grad]) == [(S(0),), (P,)] and c.get_total_counts() == 0
    # 'none' backward's gradient of the loss (grad_loss, a keyword argument) replicated: the
    # rows gathered, not misread (tessera.linear_cross_entropy places it as the loss, above).
    outs, comms = run.call(ops.linear_cross_entropy.default, hidden.detach(), weight.detach(), None, target,
                           reduction="none", output_mask=[True, True, False], grad_loss=run.tensor((8,), R))
    assert placements(outs[2:3]) == [(R,)] and comms > 0


def test_grouped_mm_shards_its_free_dimensions_and_never_the_groups(run):
    ops = run.torch.ops.tessera
    with run.mode:
        offs = run.distribute(run.torch.tensor([3, 8], dtype=run.torch.int32), run.mesh, [run.R])
    a, b = run.tensor((8, 16), run.R), run.tensor((2, 16, 12), run.Shard(2))  # rows form, N sharded
    (y,), comms = run.call(ops.grouped_mm.default, a, b, offs)
    assert placements([y]) == [(run.Shard(1),)] and comms == 0 and y.to_local().shape == (8, 6)
    a, b = run.tensor((8, 16), run.Shard(1)), run.tensor((2, 16, 12), run.Shard(1))  # K: a partial sum
    (y,), comms = run.call(ops.grouped_mm.default, a, b, offs)
    assert placements([y]) == [(run.P,)] and comms == 0
    a = run.tensor((8, 16), run.Shard(0))  # rows sharded: the offsets index them all, so gathered
    (y,), _ = run.call(ops.grouped_mm.default, a, run.tensor((2, 16, 12), run.R), offs)
    assert y.to_local().shape[0] == 8


def test_moe_permutations_shard_the_hidden_dimension(run):
    ops = run.torch.ops.tessera
    with run.mode:
        rows = run.distribute(run.torch.randperm(8).to(run.torch.int32).view(4, 2), run.mesh, [run.R])
    w = run.tensor((4, 2), run.R)
    x = run.tensor((4, 16), run.Shard(1))
    (y,), comms = run.call(ops.moe_permute.default, x, rows, w)
    assert placements([y]) == [(run.Shard(1),)] and comms == 0 and y.to_local().shape == (8, 8)
    (z,), comms = run.call(ops.moe_unpermute.default, y, rows, w)
    assert placements([z]) == [(run.Shard(1),)] and comms == 0
    (gx, gw), comms = run.call(ops.moe_unpermute_backward.default, z, y, rows, w)
    assert placements([gx, gw]) == [(run.Shard(1),), (run.P,)] and comms == 0
