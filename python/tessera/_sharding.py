"""DTensor sharding rules for tessera's torch ops (torch.distributed.tensor's register_sharding),
so that torch.ops.tessera.* on DTensors run tessera's kernels on each rank's local shard.

Each rule lists the placements (per mesh dimension) under which the op on local shards gives the
global result; DTensor picks the one that needs the least communication and redistributes the
inputs to it. An op that cannot run sharded lists Replicate only, and DTensor gathers: seeded
dropout, whose mask depends on each element's global index; a loss averaged over rows (its
divisor is the whole batch's).

A rule is the placements of one mesh dimension; DTensor combines them over the mesh's dimensions.
Its inputs list a placement for every tensor argument given (keyword ones included, in schema
order). DTensor redistributes positional arguments only, never keyword ones, so the strategies
are kept only where each keyword tensor (matmul's bias and residual, attention's alibi_slopes,
rotary's seqlen_offsets, linear_cross_entropy's grad_loss) is placed as it already is
(_keywords_as_placed); the public functions split replicated ones where the operands are
sharded (tessera.matmul, tessera.flash_attention) or place the loss's gradient
(tessera.linear_cross_entropy). Likewise ops that write an argument in place
(cross_entropy.inplace, cross_entropy.backward) list only that argument's present placements:
DTensor would redistribute it into a copy, and the write would be lost.

torch.distributed.tensor takes a third of a second to import, so the rules are registered when a
program imports it (install()), not when tessera is imported.
"""

from __future__ import annotations

import math

from ._imports import after_import

_MODULE = "torch.distributed.tensor"
_done = False


def install(torch) -> None:
    """Registers the rules now if torch.distributed.tensor is loaded, else once it is."""
    after_import(_MODULE, register, torch)


def register(torch) -> bool:
    """Registers every rule (once); False where this torch has no register_sharding."""
    global _done
    if _done:
        return True
    try:
        from torch.distributed.tensor import Partial, Replicate, Shard
        from torch.distributed.tensor.experimental import register_sharding as torch_register_sharding
    except ImportError:
        return False
    ruled = set()  # the ops given a rule below; the generic ones left take their family's default
    register_sharding = _recording(_keywords_as_placed(torch_register_sharding), ruled)
    _done = True
    ops = torch.ops.tessera
    R = Replicate()

    def is_tensor(a):
        return hasattr(a, "ndim")

    def each(args, placement):
        """`placement` for every tensor argument, None for the others."""
        return [placement if is_tensor(a) else None for a in args]

    # Elementwise ops over tensors of one shape: any dimension, or replicated. The default of the
    # generic kernel's elementwise ops (below, after every written rule).
    def same_shape(op):
        outs = len(op._schema.returns)

        @register_sharding(op)
        def rule(*args, **kwargs):
            ndim = next(a for a in args if is_tensor(a)).ndim
            return [([R] * outs, each(args, R))] + [([Shard(d)] * outs, each(args, Shard(d))) for d in range(ndim)]

    # Seeded dropout: element i's mask bit comes from the Philox stream at (seed, offset + i), the
    # global index; a shard would draw another mask.
    def replicated(op):
        @register_sharding(op)
        def rule(*args, **kwargs):
            return [([R], each(args, R))]

    for name in ("dropout", "dropout_backward"):
        replicated(getattr(ops, name).default)

    # softmax(input, dim), softmax_backward(grad_output, output, dim): any dimension but dim.
    def rows(op, tensors):
        @register_sharding(op)
        def rule(*args, **kwargs):
            ndim = args[0].ndim
            dim = args[tensors] % max(ndim, 1)
            return [([R], [R] * tensors + [None])] + \
                [([Shard(d)], [Shard(d)] * tensors + [None]) for d in range(ndim) if d != dim]

    for name, tensors in (("softmax", 1), ("log_softmax", 1), ("softmax_backward", 2), ("log_softmax_backward", 2)):
        rows(getattr(ops, name).default, tensors)

    # RoPE: q and k by batch or by heads (k's heads divided as q's), the angles replicated, or
    # by batch where they are per sequence ((batch, positions, ...)); seqlen_offsets (one per
    # sequence) likewise.
    def rotary_rule(q, k, cos, sin, *args, **kwargs):
        layout = kwargs.get("layout", args[0] if args else "bshd")
        offsets = kwargs.get("seqlen_offsets")
        rest = [None] * len(args)

        def ins(p, angles, per_sequence):
            return [p, p, angles, angles] + rest + ([per_sequence] if offsets is not None else [])

        per_batch = Shard(0) if cos.ndim == 3 and cos.shape[0] == q.shape[0] else R
        heads = Shard(2 if layout == "bshd" else 1)
        return [([R] * 2, ins(R, R, R)), ([Shard(0)] * 2, ins(Shard(0), per_batch, Shard(0))),
                ([heads] * 2, ins(heads, R, R))]

    register_sharding(ops.rotary_embedding.default)(rotary_rule)
    register_sharding(ops.rotary_embedding_backward.default)(rotary_rule)

    # Attention in FlashAttention's layout, (batch, seq, heads, dim): by batch or by heads; lse is
    # (batch, heads, seq). By heads only where each shard's query heads map to its own key heads:
    # as many of each, or GQA's key heads a multiple of the mesh's size (every group whole).
    # ALiBi's slopes, (heads,) or (batch, heads), sharded with the heads or the batch.
    def by_heads(q, k, dim=2):
        return q.shape[dim] == k.shape[dim] or k.shape[dim] % q.mesh.size() == 0

    def slopes(alibi, p):
        """ALiBi's slopes where q is `p`: sharded along with the batch or the heads."""
        if alibi is None or p == R or p == Shard(0) and alibi.ndim == 1:
            return R
        return Shard(0) if p == Shard(0) else Shard(alibi.ndim - 1)

    @register_sharding(ops.attention.default)
    def attention_rule(q, k, v, *args, **kwargs):
        alibi = kwargs.get("alibi_slopes")
        rest = [None] * len(args)

        def ins(p):
            return [p] * 3 + rest + ([slopes(alibi, p)] if alibi is not None else [])

        strategies = [([R] * 2, ins(R)), ([Shard(0)] * 2, ins(Shard(0)))]
        if by_heads(q, k):
            strategies.append(([Shard(2), Shard(1)], ins(Shard(2))))
        return strategies

    @register_sharding(ops.attention_backward.default)
    def attention_backward_rule(grad_out, q, k, v, out, lse, *args, **kwargs):
        alibi = kwargs.get("alibi_slopes")
        rest = [None] * len(args)

        def ins(p, lse_p):
            return [p] * 5 + [lse_p] + rest + ([slopes(alibi, p)] if alibi is not None else [])

        strategies = [([R] * 3, ins(R, R)), ([Shard(0)] * 3, ins(Shard(0), Shard(0)))]
        if by_heads(q, k):
            strategies.append(([Shard(2)] * 3, ins(Shard(2), Shard(1))))
        return strategies

    # Packed sequences (q (total_q, heads, dim), lse (heads, total_q)): by heads only, the
    # sequences' offsets replicated; the tokens cannot shard (the offsets are global).
    @register_sharding(ops.attention.varlen)
    def attention_varlen_rule(q, k, v, cu_seqlens_q, cu_seqlens_k, *args, **kwargs):
        alibi = kwargs.get("alibi_slopes")

        def ins(p):
            return [p] * 3 + [R, R] + [None] * len(args) + ([slopes(alibi, p)] if alibi is not None else [])
        return [([R] * 2, ins(R))] + ([([Shard(1), Shard(0)], ins(Shard(1)))] if by_heads(q, k, 1) else [])

    @register_sharding(ops.attention_backward.varlen)
    def attention_backward_varlen_rule(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *args, **kwargs):
        alibi = kwargs.get("alibi_slopes")

        def ins(p, lse_p):
            return [p] * 5 + [lse_p, R, R] + [None] * len(args) + ([slopes(alibi, p)] if alibi is not None else [])
        return [([R] * 3, ins(R, R))] + ([([Shard(1)] * 3, ins(Shard(1), Shard(0)))] if by_heads(q, k, 1) else [])

    # Decoding against a cache (q (batch, seq_q, heads, dim), the caches (batch, seq_k, heads_kv,
    # dim), or a paged pool (blocks, block_size, heads_kv, dim) that block_table (batch, blocks)
    # indexes): by heads, the caches' heads along; or by batch, each rank its sequences' rows of
    # the caches, or of block_table with the pool kept whole.
    @register_sharding(ops.attention.kvcache)
    def attention_kvcache_rule(q, k_cache, v_cache, cache_seqlens, *args, **kwargs):
        alibi = kwargs.get("alibi_slopes")
        paged = bool(args) and is_tensor(args[0])

        def ins(p, cache, per_sequence, table):
            tail = [table if paged else None] if args else []
            return [p, cache, cache, per_sequence] + tail + ([slopes(alibi, p)] if alibi is not None else [])
        strategies = [([R] * 2, ins(R, R, R, R))]
        if paged or k_cache.shape[0] == q.shape[0]:
            strategies.append(([Shard(0)] * 2, ins(Shard(0), R if paged else Shard(0), Shard(0), Shard(0))))
        if by_heads(q, k_cache):
            strategies.append(([Shard(2), Shard(1)], ins(Shard(2), Shard(2), R, R)))
        return strategies

    # Row-wise ops of the generic kernel (the norm family): rows are independent, so the leading
    # dimensions shard (all but the normalized ones: a Trailing argument's count, else the last).
    # Tensors of the rows' rank and the float32 statistics shard alike; the others (weight, bias)
    # are replicated, and outputs shaped like one of those (their gradients: column sums over the
    # rows) are partial sums.
    def rows_default(d):
        op = getattr(ops, d["name"]).default
        names = [a.name for a in op._schema.arguments]
        outs = list(d["output_rules"].values())
        trailing = next(iter(d["trailing"]), None)
        stats = set(d["float32_args"])

        @register_sharding(op)
        def rule(*args, **kwargs):
            bound = dict(zip(names, args), **kwargs)
            given = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
            x = bound[outs[0]["like"]]
            dims = bound.get(trailing) if trailing else None
            lead = x.ndim - (1 if dims is None or isinstance(dims, int) else len(dims))

            def rows(name):
                t = bound.get(name)
                return is_tensor(t) and (t.ndim == x.ndim or name in stats)

            def ins(p):
                return [(p if rows(n) else R) if is_tensor(a) else None for n, a in zip(names, given)]

            def present(r):  # None where it is like (or needs) an absent tensor or is masked off
                mask = bound.get(r["mask"]) if r["mask"] else True
                return bound.get(r["like"]) is not None and (not r["needs"] or bound.get(r["needs"]) is not None) and \
                    (mask if r["mask_index"] < 0 else mask[r["mask_index"]])

            def results(p, param):
                return [(p if r["shape"] == "leading" or rows(r["like"]) else param) if present(r) else None
                        for r in outs]
            return [(results(R, R), ins(R))] + [(results(Shard(k), Partial()), ins(Shard(k))) for k in range(lead)]

    _more_rules(torch, ops, register_sharding, Replicate, Shard, Partial)
    _moe_rules(ops, register_sharding, Replicate, Shard, Partial)
    # The defaults, unless written above: an elementwise op of the generic kernel whose outputs are
    # all shaped like an argument (gelu, silu_mul, ...) shards along any dimension; a row-wise one
    # with statistics or a normalized shape along its leading dimensions.
    from . import _C
    for d in _C.op_descriptions():
        if not d["generic"] or d["name"] in ruled:
            continue
        rules = d["output_rules"].values()
        if d["family"] == "elementwise" and all(r["shape"] == "like" for r in rules):
            same_shape(getattr(ops, d["name"]).default)
        elif d["family"] == "rowwise" and (d["trailing"] or d["float32_args"] or
                                           any(r["internal"] for r in rules)):
            rows_default(d)
    return True


def _recording(register_sharding, names: set):
    """register_sharding that also adds each op's name (its overload packet's) to `names`."""
    def register(op):
        names.add(op._schema.name.split("::")[-1])
        return register_sharding(op)
    return register


def _keywords_as_placed(register_sharding):
    """register_sharding whose rules keep the tensors given by keyword where they are. DTensor
    redistributes an op's positional arguments only (torch's redistribute_local_args: "it's very
    rare that we need to reshard kwargs so we intentionally skip it"): a strategy placing a
    keyword tensor elsewhere would hand the op that tensor's present local shard, silently. So
    of a rule's strategies only those are kept where each keyword tensor (matmul's bias and
    residual, attention's alibi_slopes, rotary's seqlen_offsets, linear_cross_entropy's
    grad_loss) stays as it is; a rule lists its inputs positional ones first, then the keyword
    ones in the schema's order (DTensor's order). On a mesh of several dimensions such a tensor
    must be placed alike on each (the strategies are per mesh dimension, and DTensor could
    combine them otherwise)."""
    def register(op):
        def decorate(rule):
            def kept(*args, **kwargs):
                strategies = rule(*args, **kwargs)
                given = [(name, v) for name, v in kwargs.items() if hasattr(v, "placements")]
                if not given:
                    return strategies
                for name, spec in given:
                    if len(set(spec.placements)) > 1:
                        raise RuntimeError(
                            f"{op}: argument '{name}' is placed {tuple(spec.placements)}; DTensor does not "
                            "redistribute keyword arguments, and tessera's rules take one placed alike on every "
                            "mesh dimension: redistribute it first")
                wanted = [spec.placements[0] for _, spec in given]
                kept_strategies = [s for s in strategies if [p for p in s[1] if p is not None][-len(wanted):] == wanted]
                if not kept_strategies:
                    raise RuntimeError(
                        f"{op}: no sharding of its other arguments takes "
                        + ", ".join(f"'{name}' placed {spec.placements[0]!r}" for name, spec in given)
                        + " (DTensor does not redistribute keyword arguments): redistribute it first")
                return kept_strategies
            register_sharding(op)(kept)
            return rule
        return decorate
    return register


SWIGLU_PAIR = 128  # matmul's 'swiglu' interleaves gate and up in blocks of 64 columns each


def _more_rules(torch, ops, register_sharding, Replicate, Shard, Partial) -> None:
    """The rules of add, isin, swiglu_backward, matmul, scaled_mm, float8_quantize, mlp, the losses
    and copy."""
    R = Replicate()
    linear = ("sum", "avg")  # the reductions a linear op commutes with (Partial.LINEAR_REDUCE_OPS)

    def aligned(t, shape, d):
        """The placement of `t` (broadcast to `shape`, aligned from the right) where a result of
        `shape` is Shard(d): its own dimension where it has d's full size, else (broadcast along
        d) Replicate."""
        k = d - (len(shape) - t.ndim)
        return Shard(k) if k >= 0 and t.shape[k] == shape[d] else R

    # add: each dimension of the broadcast result, the inputs along it or broadcast; two partial
    # sums add up to a partial sum. add.Scalar: any dimension (not Partial: each rank would add
    # the number).
    @register_sharding(ops.add.default)
    def add_rule(input, other, *args, **kwargs):
        shape = torch.broadcast_shapes(input.shape, other.shape)
        strategies = [([R], [R, R])]
        for d in range(len(shape)):
            placements = [aligned(input, shape, d), aligned(other, shape, d)]
            if placements != [R, R]:
                strategies.append(([Shard(d)], placements))
        return strategies + [([Partial(op)], [Partial(op)] * 2) for op in linear]

    @register_sharding(ops.add.Scalar)
    def add_scalar_rule(input, other, *args, **kwargs):
        return [([R], [R])] + [([Shard(d)], [Shard(d)]) for d in range(input.ndim)]

    # isin: each element's answer alone; the set replicated.
    @register_sharding(ops.isin.default)
    def isin_rule(elements, test_elements, **kwargs):
        return [([R], [R, R])] + [([Shard(d)], [Shard(d), R]) for d in range(elements.ndim)]

    def whole_pairs(n, mesh):
        """A shard of N product columns (or w_in rows) holds whole gate/up blocks on any dimensions
        of `mesh`."""
        return n % (SWIGLU_PAIR * mesh.size()) == 0

    # swiglu_backward(grad_output [..., N / 2], input [..., N]): rows anywhere; columns where
    # each shard holds whole blocks of 64 gate and 64 up columns (as matmul's column shards).
    # .recompute returns the forward's output too, placed alike.
    def swiglu_backward_rule(outputs):
        def rule(grad_output, input):
            strategies = [([R] * outputs, [R, R])] + \
                [([Shard(d)] * outputs, [Shard(d)] * 2) for d in range(input.ndim - 1)]
            if input.ndim and whole_pairs(input.shape[-1], input.mesh):
                strategies.append(([Shard(input.ndim - 1)] * outputs, [Shard(input.ndim - 1)] * 2))
            return strategies
        return rule

    register_sharding(ops.swiglu_backward.default)(swiglu_backward_rule(1))
    register_sharding(ops.swiglu_backward.recompute)(swiglu_backward_rule(2))
    register_sharding(ops.geglu_blocks_backward.default)(swiglu_backward_rule(1))
    register_sharding(ops.geglu_blocks_backward.recompute)(swiglu_backward_rule(2))

    # mlp(input [..., K], w_in [N, K], w_out [D, N']) -> out [..., D] (and the pre-activation
    # [..., N]): input's rows (any leading dimension) with the weights replicated, or Megatron's
    # MLP: input replicated, w_in's rows and w_out's columns sharded alike (each rank its share of
    # the hidden features, whole 128-row gate/up blocks for 'swiglu'), each rank's output a partial
    # sum (Partial) and its pre-activation the same share of the product's columns. Its backward
    # runs matmul and swiglu_backward.recompute (or the activation's ops) on what these give.
    def mlp_rule(outputs):
        def rule(input, w_in, w_out, *, activation="swiglu", **kwargs):
            def strategy(out, z, ins):
                return [out, z][:outputs], ins
            strategies = [strategy(R, R, [R, R, R])]
            strategies += [strategy(Shard(d), Shard(d), [Shard(d), R, R]) for d in range(input.ndim - 1)]
            if activation not in ("swiglu", "geglu") or whole_pairs(w_in.shape[0], w_in.mesh):
                strategies.append(strategy(Partial(), Shard(input.ndim - 1), [R, Shard(0), Shard(1)]))
            return strategies
        return rule

    register_sharding(ops.mlp.default)(mlp_rule(1))
    register_sharding(ops.mlp.preactivation)(mlp_rule(2))

    # matmul: input [M, K] or [B, M, K] @ other [K, N] or [B, K, N], epilogue
    # activation(alpha * product + bias) + residual; bias [N], residual the output's shape.
    # aten.mm's strategies (torch's gen_single_dim_einsum_strategies):
    # - input's rows (M) or the batch sharded, other replicated (or sharded along the batch):
    #   the output sharded alike;
    # - other's columns (N) sharded, input replicated (a column-parallel linear): the output's
    #   columns, bias's and residual's with them. With 'swiglu' (the output has N / 2 columns,
    #   gate and up interleaved in blocks of 64) only where each shard holds whole 128-column
    #   blocks; its output then is the same shard of the N / 2 features.
    # - K sharded in both (a row-parallel linear): a partial sum on each rank (Partial), and
    #   input or other a partial sum with the other replicated. Only without an activation, which
    #   does not distribute over a sum; bias and residual then are partial sums too (DTensor
    #   splits a replicated one among the ranks, as for aten.addmm's bias).
    # matmul.preactivation returns the product before the activation too (N columns), placed as
    # the output.
    def matmul_rule(outputs):
        def rule(input, other, *, bias=None, residual=None, activation="none", **kwargs):
            a, b = input, other
            nd = 3 if a.ndim == 3 or b.ndim == 3 else 2
            n = b.shape[-1]
            batch = max(a.shape[0] if a.ndim == 3 else 1, b.shape[0] if b.ndim == 3 else 1)
            shape = ((batch,) if nd == 3 else ()) + (a.shape[-2], n // 2 if activation in ("swiglu", "geglu") else n)

            def strategy(out, pa, pb, pbias, pres):
                ins = [pa, pb] + ([pbias] if bias is not None else []) + ([pres] if residual is not None else [])
                return [out] * outputs, ins

            def res(d):
                return aligned(residual, shape, d) if residual is not None else None

            strategies = [strategy(R, R, R, R, R),
                          strategy(Shard(nd - 2), Shard(a.ndim - 2), R, R, res(nd - 2))]
            if nd == 3 and batch > 1:
                strategies.append(strategy(Shard(0), Shard(0) if a.ndim == 3 and a.shape[0] == batch else R,
                                           Shard(0) if b.ndim == 3 and b.shape[0] == batch else R, R, res(0)))
            if activation not in ("swiglu", "geglu") or whole_pairs(n, b.mesh):
                strategies.append(strategy(Shard(nd - 1), R, Shard(b.ndim - 1),
                                           Shard(bias.ndim - 1) if bias is not None else None, res(nd - 1)))
            if activation == "none":
                strategies.append(strategy(Partial(), Shard(a.ndim - 1), Shard(b.ndim - 2), Partial(), Partial()))
                for op in linear:
                    p = Partial(op)
                    strategies += [strategy(p, p, R, p, p), strategy(p, R, p, p, p)]
            return strategies
        return rule

    register_sharding(ops.matmul.default)(matmul_rule(1))
    register_sharding(ops.matmul.preactivation)(matmul_rule(2))

    # scaled_mm(input [M, K], other [K, N], scale_a, scale_b, *, bias [N]): matmul's 2-d
    # strategies without an activation: rows, other's columns (bias along), or K in both (a
    # partial sum, bias too). Per-tensor scales (one number each) replicated in every one;
    # row-wise ones (scale_a [M, 1], scale_b [1, N]) sharded with their operand's rows or
    # columns, and replicated under K (each rank's partial sum scaled alike).
    # Block-wise scales (scale_a [M, K / 128], scale_b [K / 128, N / 128]) shard with the rows
    # only: a shard of N or K need not start on a 128 block. The epilogue as matmul's: a residual
    # [M, N] placed as the output; columns sharded under swiglu / geglu only where each shard holds
    # whole gate/up blocks; K's partial sums only without an activation.
    @register_sharding(ops.scaled_mm.default)
    def scaled_mm_rule(input, other, scale_a, scale_b, *, bias=None, residual=None, activation="none", **kwargs):
        rowwise = math.prod(scale_a.shape) != 1 or math.prod(scale_b.shape) != 1
        blockwise = rowwise and tuple(scale_b.shape) != (1, other.shape[1])
        rows, cols = (Shard(0), Shard(1)) if rowwise else (R, R)

        def strategy(out, pa, pb, psa, psb, pbias):
            return [out], ([pa, pb, psa, psb] + ([pbias] if bias is not None else [])
                           + ([out] if residual is not None else []))
        strategies = [strategy(R, R, R, R, R, R)]
        if blockwise:
            return strategies + [strategy(Shard(0), Shard(0), R, Shard(0), R, R)]
        strategies.append(strategy(Shard(0), Shard(0), R, rows, R, R))
        if activation not in ("swiglu", "geglu") or whole_pairs(other.shape[1], other.mesh):
            strategies.append(strategy(Shard(1), R, Shard(1), R, cols, Shard(0)))
        if activation in (None, "none"):
            strategies.append(strategy(Partial(), Shard(1), Shard(0), R, R, Partial()))
        return strategies

    # float8_quantize(input [M, K]) -> (q [M, K], scale): 'row' scales each row by its own amax
    # ('block' each row's 1 x 128 blocks), so rows sharded give each rank its rows' q and scales
    # (Shard(0) both, comm-free); K sharded would split a row's amax: no rule, the input gathered.
    # 'tensor' takes one amax over the whole tensor, 'block2d' 128 x 128 blocks that an even
    # split of the rows may cut: replicated. .columns also quantizes each column along M, whose amax rows
    # sharded would split, as K sharded splits the rows': replicated only (no placement keeps
    # both kinds of group whole; a caller that shards quantizes each layout in its own call);
    # .transposed likewise.
    @register_sharding(ops.float8_quantize.default)
    def float8_quantize_rule(input, *, granularity="row", **kwargs):
        strategies = [([R, R], [R])]
        if granularity in ("row", "block") and input.ndim == 2:
            strategies.append(([Shard(0), Shard(0)], [Shard(0)]))
        return strategies

    @register_sharding(ops.float8_quantize.columns)
    def float8_quantize_columns_rule(input, **kwargs):
        return [([R, R, R, R], [R])]

    @register_sharding(ops.float8_quantize.transposed)
    def float8_quantize_transposed_rule(input, **kwargs):
        return [([R, R], [R])]

    # float8_quantize_gated: the product act(gate) * up, elementwise, quantized as above; gate and up
    # placed alike.
    @register_sharding(ops.float8_quantize_gated.default)
    def float8_quantize_gated_rule(gate, up, *, granularity="row", **kwargs):
        strategies = [([R, R], [R, R])]
        if granularity in ("row", "block") and gate.ndim == 2:
            strategies.append(([Shard(0), Shard(0)], [Shard(0), Shard(0)]))
        return strategies

    @register_sharding(ops.float8_quantize_gated.columns)
    def float8_quantize_gated_columns_rule(gate, up, **kwargs):
        return [([R, R, R, R], [R, R])]

    # The losses: rows (tokens) are independent, so logits (and target, and the gradient) sharded
    # by rows give each row's loss, lse and gradient on its rank; 'sum' adds the rows' losses, a
    # partial sum on each rank (Partial). 'mean' divides by the count of the rows not ignored (or
    # the sum of their class weights) over the whole batch, which a shard does not know: its own
    # mean, and its gradient's 1 / count, would be wrong (no Partial reduces them exactly, unless
    # every shard had the same divisor). So 'mean' runs replicated (gathering the rows); 'none'
    # and 'sum' run sharded (tessera.cross_entropy and linear_cross_entropy compute a row-sharded
    # 'mean' without class weights as 'sum' over the all-reduced count). Class weights replicated.
    # A vocabulary sharded (vocab-parallel cross-entropy, whose max and sum of exp need
    # all-reduces) has no rule: gathered.
    def loss_strategies(logits, weight, reduction, outputs, grad=True):
        """Replicated, and (not for 'mean') by rows: logits and target Shard(0), the outputs
        (loss, lse, grad)[:outputs] by rows (grad None where there is none), the loss a partial
        sum for 'sum'."""
        def ins(p):
            return [p, p] + ([R] if weight is not None else [])

        def outs(loss, rows):
            return [loss, rows, rows if grad else None][:outputs]
        strategies = [(outs(R, R), ins(R))]
        if reduction != "mean" and logits.ndim == 2:
            strategies.append((outs(Shard(0) if reduction == "none" else Partial(), Shard(0)), ins(Shard(0))))
        return strategies

    # (loss, lse, grad): grad (N, V) where with_grad, else None.
    @register_sharding(ops.cross_entropy.default)
    def cross_entropy_rule(logits, target, weight=None, *, reduction="mean", with_grad=False, **kwargs):
        return loss_strategies(logits, weight, reduction, 3, with_grad)

    def placed_as(spec, allowed, op, arg):
        """`spec`'s present placements, all among `allowed` (an op writing it in place must not
        have it redistributed)."""
        present = list(dict.fromkeys(spec.placements))
        for p in present:
            if p not in allowed:
                raise RuntimeError(
                    f"tessera.{op}: argument '{arg}' is written in place, and as a DTensor it must stay "
                    f"as it is placed; expected {' or '.join(map(repr, allowed))}, got {p!r} "
                    f"(placements {tuple(spec.placements)})")
        return present

    @register_sharding(ops.cross_entropy.inplace)
    def cross_entropy_inplace_rule(logits, target, weight=None, *, reduction="mean", **kwargs):
        strategies = loss_strategies(logits, weight, reduction, 2)
        allowed = [s[1][0] for s in strategies]  # the logits' placement in each
        present = placed_as(logits, allowed, "cross_entropy (inplace_grad=True)", "logits")
        return [s for s in strategies if s[1][0] in present]

    # jsd(student, teacher, target) -> (loss [N], grad [N, V]): rows independent, so replicated or
    # all by rows; jsd.inplace keeps the student's placement (its gradient is written there).
    def jsd_strategies(student, target, outputs, with_grad=True):
        def ins(p):
            return [p, p] + ([p] if target is not None else [])
        strategies = [([R, R if with_grad else None][:outputs], ins(R))]
        if student.ndim == 2:
            strategies.append(([Shard(0), Shard(0) if with_grad else None][:outputs], ins(Shard(0))))
        return strategies

    @register_sharding(ops.jsd.default)
    def jsd_rule(student, teacher, target=None, *, with_grad=False, **kwargs):
        return jsd_strategies(student, target, 2, with_grad)

    @register_sharding(ops.jsd.inplace)
    def jsd_inplace_rule(student, teacher, target=None, **kwargs):
        strategies = jsd_strategies(student, target, 1)
        present = placed_as(student, [s[1][0] for s in strategies], "jsd (inplace)", "student")
        return [s for s in strategies if s[1][0] in present]

    # cross_entropy.backward(grad_loss, grad(a!)): grad *= grad_loss, in place. grad_loss is a
    # number ('mean', 'sum'; replicated) or one per row ('none': sharded as grad's rows). grad
    # anywhere, a partial sum too (linear_cross_entropy's d_weight): scaling commutes with them.
    @register_sharding(ops.cross_entropy.backward)
    def cross_entropy_backward_rule(grad_loss, grad, *args, **kwargs):
        per_row = grad_loss.ndim == 1
        allowed = [R] + [Shard(d) for d in range(grad.ndim)] + [Partial(op) for op in linear]
        present = placed_as(grad, allowed, "cross_entropy_backward", "grad")
        return [([], [Shard(0) if per_row and p == Shard(0) else R, p]) for p in present]

    # linear_cross_entropy(hidden [N, H], weight [V, H], bias [V], target [N], ..., grad_loss,
    # ce_weight) -> (loss, lse, d_hidden, d_weight, d_bias, accuracy, predicted): rows as
    # cross_entropy's, the weight, bias and class weights replicated; d_hidden and the predicted
    # tokens by rows, d_weight and d_bias sums over the rows (Partial). grad_loss (the backward of
    # 'none': one per row) by rows. The token accuracy, a ratio of counts over all rows, only with
    # the rows gathered (without it, None).
    @register_sharding(ops.linear_cross_entropy.default)
    def linear_cross_entropy_rule(hidden, weight, bias, target, *, reduction="mean", output_mask=(False,) * 3,
                                  grad_loss=None, ce_weight=None, token_accuracy=False, predicted_tokens=False,
                                  **kwargs):
        def ins(p):
            rows = grad_loss is not None and grad_loss.ndim == 1
            return [p, R] + ([R] if bias is not None else []) + [p] + \
                ([p if rows else R] if grad_loss is not None else []) + ([R] if ce_weight is not None else [])
        # (loss, lse, d_hidden, d_weight, d_bias, accuracy, predicted), None where an output is None
        present = [True, True, output_mask[0], output_mask[1], output_mask[2] and bias is not None, token_accuracy,
                   predicted_tokens]

        def outs(*placements):
            return [p if on else None for p, on in zip(placements, present)]
        strategies = [(outs(*[R] * 7), ins(R))]
        if reduction != "mean" and hidden.ndim == 2 and not token_accuracy:
            loss = Shard(0) if reduction == "none" else Partial()
            strategies.append((outs(loss, Shard(0), Shard(0), Partial(), Partial(), R, Shard(0)), ins(Shard(0))))
        return strategies

    # copy(src, dst) writes dst in place: dst stays as it is placed (a copy commutes with any
    # sharding and with partial sums) and src is brought to the same placement.
    @register_sharding(ops.copy.default)
    def copy_rule(src, dst):
        allowed = [R] + [Shard(d) for d in range(dst.ndim)] + [Partial(op) for op in linear]
        return [([], [p, p]) for p in placed_as(dst, allowed, "copy", "dst")]


def _moe_rules(ops, register_sharding, Replicate, Shard, Partial) -> None:
    """grouped_mm by its form, and the pairs' permutations along the hidden dimension (the rows
    index the whole token set, so tokens and pairs never split)."""
    R, P = Replicate(), Partial()

    # grouped_mm: the offsets (replicated) index the grouped dimension, which never splits; the
    # other product dimensions do, K as a partial sum (not in the depth form, where K is grouped).
    @register_sharding(ops.grouped_mm.default)
    def grouped_rule(input, other, offs=None, **kwargs):
        o = R if offs is not None else None
        strategies = [([R], [R, R, o])]
        if input.ndim == 2 and other.ndim == 3:  # rows: [M, K] x [G, K, N]
            strategies += [([Shard(1)], [R, Shard(2), o]), ([P], [Shard(1), Shard(1), o])]
        elif input.ndim == 3 and other.ndim == 2:  # columns: [G, M, K] x [K, N]
            strategies += [([Shard(0)], [Shard(1), R, o]), ([P], [Shard(2), Shard(0), o])]
        elif input.ndim == 2:  # depth: [M, K] x [K, N] -> [G, M, N]
            strategies += [([Shard(1)], [Shard(0), R, o]), ([Shard(2)], [R, Shard(1), o])]
        else:  # batched
            strategies += [([Shard(0)], [Shard(0), Shard(0), o]), ([Shard(1)], [Shard(1), R, o]),
                           ([Shard(2)], [R, Shard(2), o]), ([P], [Shard(2), Shard(1), o])]
        return strategies

    def permutation(op):
        @register_sharding(op)
        def rule(input, rows, weight=None):
            w = R if weight is not None else None
            return [([R], [R, R, w]), ([Shard(1)], [Shard(1), R, w])]

    def permutation_backward(op):  # the weight's gradient a dot over the hidden dimension
        @register_sharding(op)
        def rule(grad_output, input, rows, weight=None):
            w = R if weight is not None else None
            return [([R, w], [R, R, R, w]), ([Shard(1), P if w else None], [Shard(1), Shard(1), R, w])]

    for name in ("moe_permute", "moe_unpermute"):
        permutation(getattr(ops, name).default)
        permutation_backward(getattr(ops, name + "_backward").default)
