"""tessera.flash_attention and tessera.scaled_dot_product_attention against a float64 reference
(masks, GQA/MQA, soft-cap, ALiBi, odd and unequal lengths, fully masked rows, window sides past
the keys), forward and backward through autograd, held to FlashAttention's own bound: at most
twice the error of the same reference computed in the inputs' dtype; ALiBi also against torch's
SDPA with the bias as a float mask. Also torch's contract (what falls back to torch's SDPA) and
the errors that name their argument."""

import itertools
import math

import pytest

import tessera


def alibi_bias(torch, slopes, b, hq, sq, sk, dtype):
    """ALiBi's bias (b, hq, sq, sk) as FlashAttention defines it: -slope |i + sk - sq - j|."""
    i = torch.arange(sq, device=slopes.device)[:, None]
    j = torch.arange(sk, device=slopes.device)[None, :]
    dist = (i + sk - sq - j).abs().to(dtype)
    sl = slopes.to(dtype).expand(b, hq) if slopes.dim() == 1 else slopes.to(dtype)
    return -sl[:, :, None, None] * dist


def make_slopes(torch, shape):
    """ALiBi's slopes, float32 on the GPU, random in [0.02, 0.5)."""
    return torch.rand(*shape, device="cuda") * 0.48 + 0.02


def reference(torch, q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, alibi=None):
    """softmax(scale q k^T, masked) v in q's dtype and device, FlashAttention's layout; rows that
    see no key give 0. ALiBi's bias (alibi: the slopes) after the scale and the soft-cap; a window
    side at or beyond seq_k is unbounded. Returns (out, lse) with lse +inf on such rows."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hk, dim=2)
    v = v.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * (scale if scale is not None else 1 / math.sqrt(d))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        s = s + alibi_bias(torch, alibi, b, hq, sq, sk, s.dtype)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    diag = i + sk - sq
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        keep &= j <= diag
    if 0 <= window[0] < sk:
        keep &= j >= diag - window[0]
    if 0 <= window[1] < sk:
        keep &= j <= diag + window[1]
    s = s.masked_fill(~keep, -1e4 if s.dtype != torch.float64 else -1e300)
    seen = keep.any(-1)[:, None].to(s.dtype)
    p = torch.softmax(s, -1) * seen
    out = torch.einsum("bhij,bjhd->bihd", p.to(v.dtype), v)
    lse = torch.where(seen[:, 0].bool(), torch.logsumexp(s.double(), -1), torch.tensor(math.inf, device=q.device))
    return out, lse


def inputs(torch, dtype, b, sq, sk, hq, hk, d, dv=None):
    def x(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    return x(b, sq, hq, d), x(b, sk, hk, d), x(b, sk, hk, dv or d)


def check_bound(torch, got, low, exact, what):
    """FlashAttention's bound: max |got - exact| <= 2 max |low - exact| (+ float32 rounding, of
    unit-sized terms where the exact result is 0: dq and dk of a query that sees one key)."""
    err = (got.double() - exact).abs().max().item()
    base = (low.double() - exact).abs().max().item()
    assert err <= 2 * base + 1e-5 * max(exact.abs().max().item(), 1.0), (what, err, base)


CASES = [
    # b, sq, sk, hq, hk, d, options
    (2, 17, 17, 4, 4, 64, {}),
    (1, 1, 1, 2, 2, 128, {}),
    (2, 127, 127, 8, 2, 128, {"causal": True}),
    (1, 40, 7, 2, 2, 128, {"causal": True}),               # fully masked rows
    (1, 300, 1000, 4, 1, 128, {}),                         # MQA, seq_q < seq_k
    (1, 1000, 1000, 2, 2, 64, {"causal": True}),
    (1, 257, 300, 2, 1, 256, {"causal": True}),
    (1, 100, 100, 2, 2, 256, {"window_size": (16, 4)}),
    (2, 33, 65, 4, 2, 64, {"causal": True, "window_size": (8, -1), "softcap": 30.0}),
    (1, 4097, 64, 1, 1, 64, {"causal": True}),
    (1, 2, 100, 4, 1, 80, {}),                              # head_dim 80: the generic kernel
    (1, 50, 20, 2, 2, 64, {"window_size": (30, 25)}),       # window sides past the keys: unbounded
    # ALiBi: slopes (heads_q,) ("h") or (batch, heads_q) ("bh")
    (2, 17, 33, 4, 2, 64, {"alibi": "h"}),
    (2, 127, 127, 8, 2, 128, {"causal": True, "alibi": "bh"}),
    (1, 40, 7, 2, 2, 128, {"causal": True, "alibi": "h"}),  # fully masked rows
    (1, 100, 100, 2, 2, 256, {"window_size": (16, 4), "alibi": "bh"}),
    (2, 33, 65, 4, 2, 64, {"causal": True, "window_size": (8, -1), "softcap": 30.0, "alibi": "bh"}),
    (1, 300, 300, 2, 2, 128, {"softcap": 20.0, "alibi": "h"}),
    (2, 3, 1000, 8, 2, 128, {"alibi": "bh"}),               # the decode tier
    (1, 2, 100, 4, 1, 80, {"alibi": "h"}),                  # the generic kernel
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])) + "".join(sorted(c[6])))
def test_forward_and_backward_within_flash_attentions_bound(torch, dtype, case):
    b, sq, sk, hq, hk, d, opts = case
    dt = getattr(torch, dtype)
    q, k, v = inputs(torch, dt, b, sq, sk, hq, hk, d)
    opts = dict(opts)
    alibi = opts.pop("alibi", None)
    slopes = None if alibi is None else make_slopes(torch, (hq,) if alibi == "h" else (b, hq))
    ref_opts = {"causal": opts.get("causal", False), "window": opts.get("window_size", (-1, -1)),
                "softcap": opts.get("softcap", 0.0), "alibi": slopes}
    out, lse = tessera.flash_attention(q, k, v, return_lse=True, alibi_slopes=slopes, **opts)
    exact_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact, exact_lse = reference(torch, *exact_in, **ref_opts)
    low, _ = reference(torch, q, k, v, **ref_opts)
    check_bound(torch, out, low, exact, "out")
    assert torch.equal(torch.isinf(lse), torch.isinf(exact_lse))
    finite = torch.isfinite(exact_lse)
    assert torch.allclose(lse[finite].double(), exact_lse[finite], atol=1e-3, rtol=1e-4)
    assert not torch.isnan(out).any()
    if sq * sk > 300 * 1000 and dtype != "float32" and d not in (64, 128):
        return  # the generic backward is slow on long rows; the shorter cases cover its paths
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    exact_grads = torch.autograd.grad(exact, exact_in, g.double())
    low_grads = torch.autograd.grad(low, (q, k, v), g)
    for name, got, lo, ex in zip("qkv", grads, low_grads, exact_grads):
        check_bound(torch, got, lo, ex, "d" + name)


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_backward_repeats_bit_for_bit(torch, causal):
    q, k, v = inputs(torch, torch.bfloat16, 1, 1000, 1100, 4, 2, 128)
    out = tessera.flash_attention(q, k, v, causal=causal, deterministic=True)
    g = torch.randn_like(out)
    first = torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
    second = torch.autograd.grad(out, (q, k, v), g)
    for name, a, b in zip("qkv", first, second):
        assert torch.equal(a, b), "d" + name


def test_fully_masked_rows_are_zero_with_infinite_lse(torch):
    q, k, v = inputs(torch, torch.bfloat16, 1, 8, 3, 2, 2, 128)
    out, lse = tessera.flash_attention(q, k, v, causal=True, return_lse=True)
    assert torch.count_nonzero(out[:, :5]) == 0 and torch.isinf(lse[:, :, :5]).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sdpa_matches_torch(torch, dtype):
    F = torch.nn.functional
    dt = getattr(torch, dtype)
    q = torch.randn(2, 8, 300, 128, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(2, 2, 300, 128, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(2, 2, 300, 128, device="cuda", dtype=dt, requires_grad=True)
    for causal in (False, True):
        got = tessera.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal, enable_gqa=True)
        low = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        assert got.shape == want.shape and got.dtype == dt
        check_bound(torch, got, low, want, "sdpa")


def test_sdpa_gives_torch_what_it_does_not_take(torch):
    F = torch.nn.functional
    q, k, v = (torch.randn(1, 2, 16, 64, device="cuda") for _ in range(3))
    mask = torch.rand(16, 16, device="cuda") > 0.5
    assert torch.equal(tessera.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    kk = torch.randn(1, 2, 20, 64, device="cuda")  # causal with seq_q != seq_k: torch's top-left mask
    assert torch.allclose(tessera.scaled_dot_product_attention(q, kk, kk, is_causal=True),
                          F.scaled_dot_product_attention(q, kk, kk, is_causal=True), atol=1e-6)
    k1 = torch.randn(1, 1, 16, 64, device="cuda")  # heads differ without enable_gqa: torch's call
    assert torch.equal(tessera.scaled_dot_product_attention(q, k1, k1), F.scaled_dot_product_attention(q, k1, k1))
    cpu = q.cpu()
    assert torch.allclose(tessera.scaled_dot_product_attention(cpu, cpu, cpu),
                          F.scaled_dot_product_attention(cpu, cpu, cpu))


def test_errors_name_the_argument(torch):
    q = torch.randn(1, 4, 6, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 4, 4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="argument 'k'.*heads_kv dividing"):
        tessera.flash_attention(q, k, k)
    with pytest.raises(TypeError, match="argument 'k'"):
        tessera.flash_attention(q, k.half(), k.half())
    with pytest.raises(ValueError, match="argument 'q'.*at most 256"):
        big = torch.randn(1, 4, 2, 512, device="cuda", dtype=torch.bfloat16)
        tessera.flash_attention(big, big, big)
    with pytest.raises(ValueError, match="argument 'scale'"):
        tessera.flash_attention(q, q, q, softmax_scale=-1.0)
    with pytest.raises(TypeError, match="argument 'q'"):
        tessera.flash_attention([1.0], k, k)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_is_each_sequence_alone(torch, dtype, causal):
    dt = getattr(torch, dtype)
    lens_q, lens_k = [5, 0, 300, 1, 130], [7, 3, 300, 64, 1]
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), device="cuda", dtype=torch.int32)
    q = torch.randn(sum(lens_q), 4, 128, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(sum(lens_k), 2, 128, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(sum(lens_k), 2, 128, device="cuda", dtype=dt, requires_grad=True)
    out, lse = tessera.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                              return_lse=True)
    assert out.shape == q.shape and lse.shape == (4, sum(lens_q))
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    for b in range(len(lens_q)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        qb, kb, vb = (t.detach()[s][None].requires_grad_() for t, s in ((q, sq), (k, sk), (v, sk)))
        ob, lb = tessera.flash_attention(qb, kb, vb, causal=causal, return_lse=True)
        gb = torch.autograd.grad(ob, (qb, kb, vb), g[sq][None])
        tol = dict(atol=2e-2, rtol=2e-2) if dtype == "bfloat16" else dict(atol=1e-5, rtol=1e-5)
        assert torch.allclose(out[sq], ob[0], **tol)
        assert torch.equal(torch.isinf(lse[:, sq]), torch.isinf(lb[0]))
        for got, want in zip((dq[sq], dk[sk], dv[sk]), gb):
            assert torch.allclose(got, want[0], **tol)


def test_varlen_offsets_are_checked(torch):
    q = torch.randn(40, 2, 64, device="cuda", dtype=torch.bfloat16)
    bad = torch.tensor([0, 10, 5, 40], device="cuda", dtype=torch.int32)
    with pytest.raises(ValueError, match="argument 'cu_seqlens_q'.*non-decreasing"):
        tessera.flash_attention_varlen(q, q, q, bad, bad, 40, 40)
    ok = torch.tensor([0, 10, 20, 40], device="cuda", dtype=torch.int32)
    with pytest.raises(ValueError, match="argument 'max_seqlen_k'"):
        tessera.flash_attention_varlen(q, q, q, ok, ok, 40, 15)
    with pytest.raises(TypeError, match="argument 'cu_seqlens_q'"):
        tessera.flash_attention_varlen(q, q, q, ok.long(), ok, 40, 40)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("seq_q,causal,block_size", [(1, False, 256), (4, True, 16), (3, True, 0)])
def test_kvcache_is_attention_over_the_cached_keys(torch, dtype, seq_q, causal, block_size):
    """Paged and contiguous caches against the reference over each sequence's cached keys, under
    FlashAttention's bound; a CUDA graph capture of the call replays with new lengths."""
    dt = getattr(torch, dtype)
    lens, hq, hk, d, cap = [1000, 0, 517], 8, 2, 128, 1024
    b = len(lens)
    q = torch.randn(b, seq_q, hq, d, device="cuda", dtype=dt)
    if block_size:
        num_blocks = b * cap // block_size + 3
        table = torch.randperm(num_blocks, device="cuda", dtype=torch.int32)[:b * cap // block_size].view(b, -1)
        k_cache = torch.randn(num_blocks, block_size, hk, d, device="cuda", dtype=dt)
        v_cache = torch.randn_like(k_cache)
        rows = [table[s].repeat_interleave(block_size).long() * block_size + torch.arange(cap, device="cuda") % block_size
                for s in range(b)]
        k_seq = [k_cache.flatten(0, 1)[r] for r in rows]
        v_seq = [v_cache.flatten(0, 1)[r] for r in rows]
    else:
        table = None
        k_cache = torch.randn(b, cap, hk, d, device="cuda", dtype=dt)
        v_cache = torch.randn_like(k_cache)
        k_seq, v_seq = list(k_cache), list(v_cache)
    seqlens = torch.tensor(lens, device="cuda", dtype=torch.int32)
    out, lse = tessera.flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table,
                                                    causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == (b, hq, seq_q)
    for s, n in enumerate(lens):
        if n == 0:
            assert torch.equal(out[s], torch.zeros_like(out[s])) and torch.isinf(lse[s]).all()
            continue
        qs, ks, vs = q[s:s + 1], k_seq[s][None, :n], v_seq[s][None, :n]
        exact, exact_lse = reference(torch, qs.double(), ks.double(), vs.double(), causal=causal)
        low, _ = reference(torch, qs, ks, vs, causal=causal)
        check_bound(torch, out[s:s + 1], low, exact, f"sequence {s}")
        assert torch.allclose(lse[s].double(), exact_lse[0], atol=1e-4)
    # Captured once, replayed with the lengths changed in place: the lengths are read on the GPU.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replay = tessera.flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table,
                                                      causal=causal)
    seqlens.copy_(torch.tensor([517, 1000, 0], device="cuda", dtype=torch.int32))
    graph.replay()
    want = tessera.flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, causal=causal)
    assert torch.equal(replay, want)
    assert torch.equal(replay[2], torch.zeros_like(replay[2]))


def test_kvcache_bad_entries_give_nan_and_arguments_are_checked(torch):
    q = torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(8, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    table = torch.tensor([[0, 1], [2, 9]], device="cuda", dtype=torch.int32)  # block 9 is past the cache
    out = tessera.flash_attention_with_kvcache(q, k_cache, k_cache, torch.tensor([20, 20], device="cuda",
                                               dtype=torch.int32), block_table=table)
    assert not out[0].isnan().any() and out[1].isnan().all()
    out = tessera.flash_attention_with_kvcache(q, k_cache, k_cache, 33, block_table=table[:1].expand(2, 2))
    assert out.isnan().all()  # 33 keys past a two-block cache of 32
    with pytest.raises(TypeError, match="argument 'block_table'"):
        tessera.flash_attention_with_kvcache(q, k_cache, k_cache, 4, block_table=table.long())
    with pytest.raises(ValueError, match="argument 'cache_seqlens'"):
        tessera.flash_attention_with_kvcache(q, k_cache, k_cache, torch.ones(3, device="cuda", dtype=torch.int32),
                                             block_table=table)
    with pytest.raises(ValueError, match="argument 'k_cache'"):
        tessera.flash_attention_with_kvcache(q, k_cache[..., :32], k_cache[..., :32], 4, block_table=table)


# ---- ALiBi (alibi_slopes) -----------------------------------------------------------------------

def sdpa_with_alibi(torch, q, k, v, slopes, *, causal=False, window=(-1, -1), scale=None):
    """torch's composition: F.scaled_dot_product_attention in (batch, heads, seq, dim) with the
    bias (and the masks, as -inf) in a float attn_mask, in q's dtype; k, v repeated for GQA."""
    b, sq, hq, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    mask = alibi_bias(torch, slopes, b, hq, sq, sk, q.dtype)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    diag = i + sk - sq
    hide = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        hide |= j > diag
    if 0 <= window[0] < sk:
        hide |= j < diag - window[0]
    if 0 <= window[1] < sk:
        hide |= j > diag + window[1]
    mask = mask.masked_fill(hide, -math.inf)
    kk, vv = (t.repeat_interleave(hq // hk, dim=2) for t in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("shape,opts", [
    ((2, 64, 64, 4, 4, 64), {"causal": True}),
    ((2, 33, 300, 8, 2, 128), {}),                            # GQA, seq_q < seq_k
    ((1, 257, 300, 4, 1, 128), {"causal": True, "window": (64, 8)}),
    ((3, 5, 700, 4, 2, 64), {}),                              # the decode tier
    ((1, 40, 40, 2, 2, 96), {"causal": True}),                # the generic kernels
], ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else "".join(sorted(x)))
@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes_h", "slopes_bh"])
def test_alibi_matches_sdpa_with_a_float_mask(torch, dtype, shape, opts, per_batch):
    """Forward and backward against torch's SDPA with the bias in a float mask: float64 on the GPU
    as the exact result, the inputs' dtype for the bound; no row here sees no key (SDPA's NaN)."""
    b, sq, sk, hq, hk, d = shape
    dt = getattr(torch, dtype)
    q, k, v = inputs(torch, dt, b, sq, sk, hq, hk, d)
    slopes = make_slopes(torch, (b, hq) if per_batch else (hq,))
    causal, window = opts.get("causal", False), opts.get("window", (-1, -1))
    out = tessera.flash_attention(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes)
    exact_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact = sdpa_with_alibi(torch, *exact_in, slopes, causal=causal, window=window)
    low = sdpa_with_alibi(torch, q, k, v, slopes, causal=causal, window=window)
    check_bound(torch, out, low, exact, "out")
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    exact_grads = torch.autograd.grad(exact, exact_in, g.double())
    low_grads = torch.autograd.grad(low, (q, k, v), g)
    for name, got, lo, ex in zip("qkv", grads, low_grads, exact_grads):
        check_bound(torch, got, lo, ex, "d" + name)


def test_alibi_slopes_get_no_gradient(torch):
    """As in FlashAttention, the slopes are not differentiated: q, k and v get theirs, the slopes
    None, even where they require one."""
    q, k, v = inputs(torch, torch.bfloat16, 2, 16, 16, 4, 4, 64)
    slopes = make_slopes(torch, (4,)).requires_grad_()
    out = tessera.flash_attention(q, k, v, causal=True, alibi_slopes=slopes)
    out.sum().backward()
    assert slopes.grad is None
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    # Slopes alone requiring a gradient: no graph, no error.
    out = tessera.flash_attention(q.detach(), k.detach(), v.detach(), alibi_slopes=slopes)
    assert not out.requires_grad


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_varlen_uses_each_sequences_lengths(torch, causal):
    lens_q, lens_k = [5, 0, 300, 1, 130], [7, 3, 300, 64, 1]
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), device="cuda", dtype=torch.int32)
    q = torch.randn(sum(lens_q), 4, 128, device="cuda", dtype=torch.float32, requires_grad=True)
    k = torch.randn(sum(lens_k), 2, 128, device="cuda", dtype=torch.float32, requires_grad=True)
    v = torch.randn(sum(lens_k), 2, 128, device="cuda", dtype=torch.float32, requires_grad=True)
    slopes = make_slopes(torch, (len(lens_q), 4))
    out = tessera.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         alibi_slopes=slopes)
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    for b in range(len(lens_q)):
        if lens_q[b] == 0:
            continue
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        qb, kb, vb = (t.detach()[s][None].double().requires_grad_() for t, s in ((q, sq), (k, sk), (v, sk)))
        ob, _ = reference(torch, qb, kb, vb, causal=causal, alibi=slopes[b])
        gb = torch.autograd.grad(ob, (qb, kb, vb), g[sq][None].double())
        assert torch.allclose(out[sq].double(), ob[0], atol=1e-4, rtol=1e-4), b
        for got, want in zip((dq[sq], dk[sk], dv[sk]), gb):
            assert torch.allclose(got.double(), want[0], atol=1e-4, rtol=1e-4), b


@pytest.mark.parametrize("seq_q,causal,block_size", [(1, False, 256), (4, True, 16), (20, True, 0)])
def test_alibi_kvcache_measures_from_each_cache_length(torch, seq_q, causal, block_size):
    lens, hq, hk, d, cap = [1000, 0, 517], 8, 2, 128, 1024
    b = len(lens)
    q = torch.randn(b, seq_q, hq, d, device="cuda", dtype=torch.bfloat16)
    if block_size:
        num_blocks = b * cap // block_size
        table = torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(b, -1)
        k_cache = torch.randn(num_blocks, block_size, hk, d, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        within = torch.arange(cap, device="cuda") % block_size
        rows = [table[s].repeat_interleave(block_size).long() * block_size + within for s in range(b)]
        k_seq, v_seq = [k_cache.flatten(0, 1)[r] for r in rows], [v_cache.flatten(0, 1)[r] for r in rows]
    else:
        table = None
        k_cache = torch.randn(b, cap, hk, d, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        k_seq, v_seq = list(k_cache), list(v_cache)
    slopes = make_slopes(torch, (b, hq))
    seqlens = torch.tensor(lens, device="cuda", dtype=torch.int32)
    out, lse = tessera.flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, causal=causal,
                                                    alibi_slopes=slopes, return_lse=True)
    for s, n in enumerate(lens):
        if n == 0:
            assert torch.equal(out[s], torch.zeros_like(out[s])) and torch.isinf(lse[s]).all()
            continue
        qs, ks, vs = q[s:s + 1], k_seq[s][None, :n], v_seq[s][None, :n]
        exact, exact_lse = reference(torch, qs.double(), ks.double(), vs.double(), causal=causal, alibi=slopes[s])
        low, _ = reference(torch, qs, ks, vs, causal=causal, alibi=slopes[s])
        check_bound(torch, out[s:s + 1], low, exact, f"sequence {s}")
        assert torch.allclose(lse[s].double(), exact_lse[0], atol=1e-4)


def test_alibi_slopes_errors_name_the_argument(torch):
    q = torch.randn(2, 4, 6, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 5, 3, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"'alibi_slopes'.*\[heads_q\] = \[6\] or \[batch, heads_q\] = \[2, 6\]"):
        tessera.flash_attention(q, k, k, alibi_slopes=torch.rand(4, device="cuda"))
    with pytest.raises(ValueError, match=r"argument 'alibi_slopes'.*got 2-d \[6, 2\]"):
        tessera.flash_attention(q, k, k, alibi_slopes=torch.rand(6, 2, device="cuda"))
    with pytest.raises(TypeError, match="argument 'alibi_slopes'.*float32"):
        tessera.flash_attention(q, k, k, alibi_slopes=torch.rand(6, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="argument 'alibi_slopes'.*CUDA"):
        tessera.flash_attention(q, k, k, alibi_slopes=torch.rand(6))
    with pytest.raises(ValueError, match="attention_kvcache: argument 'alibi_slopes'"):
        tessera.flash_attention_with_kvcache(q, k, k, 5, alibi_slopes=torch.rand(3, 6, device="cuda"))
    cu = torch.tensor([0, 10, 20], device="cuda", dtype=torch.int32)
    qp = torch.randn(20, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"attention_varlen: argument 'alibi_slopes'.*\[batch, heads_q\] = \[2, 2\]"):
        tessera.flash_attention_varlen(qp, qp, qp, cu, cu, 10, 10, alibi_slopes=torch.rand(3, 2, device="cuda"))


def test_alibi_under_torch_compile(torch):
    """torch.compile(fullgraph=True) traces flash_attention with slopes (the fake kernel takes the
    new argument), forward and backward, with the eager result."""
    q, k, v = inputs(torch, torch.bfloat16, 2, 64, 64, 4, 2, 64)
    slopes = make_slopes(torch, (2, 4))

    def f(q, k, v, slopes):
        return tessera.flash_attention(q, k, v, causal=True, alibi_slopes=slopes).float().square().sum()
    eager = torch.autograd.grad(f(q, k, v, slopes), (q, k, v))
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(q, k, v, slopes), (q, k, v))
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)


def test_window_sides_past_the_keys_are_unbounded(torch):
    """As in FlashAttention: a side at or beyond seq_k means -1 (with seq_q > seq_k the diagonal
    starts left of the first key, so a bounded right side would hide keys from the first rows)."""
    q, k, v = inputs(torch, torch.bfloat16, 1, 50, 20, 2, 2, 64)
    want = tessera.flash_attention(q, k, v)
    for window in ((30, 25), (20, 20), (-1, 20), (100, -1)):
        assert torch.equal(tessera.flash_attention(q, k, v, window_size=window), want), window
    bounded = tessera.flash_attention(q, k, v, window_size=(-1, 19))
    assert torch.count_nonzero(bounded[:, :11]) == 0  # rows 0..10: i - 30 + 19 < 0, no key
    assert torch.count_nonzero(bounded[:, 11:]) > 0


# ---- rotary_embedding --------------------------------------------------------------------------

def _rope_angles(torch, positions, rotary_dim, device):
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rotary_dim, 2, device=device).float() / rotary_dim)
    return torch.outer(torch.arange(positions, device=device).float(), inv_freq)  # (positions, rd / 2)


def _rope_reference(torch, x, freqs, interleaved, layout):
    """Independent formulas: Hugging Face's rotate_half (NeoX) and Llama's complex product
    (interleaved), on the first rotary_dim features; freqs (batch or 1, seq, rd / 2)."""
    rd = 2 * freqs.shape[-1]
    f = freqs.unsqueeze(2) if layout == "bshd" else freqs.unsqueeze(1)
    xf, rest = x.double()[..., :rd], x.double()[..., rd:]
    if interleaved:
        z = torch.view_as_complex(xf.reshape(*xf.shape[:-1], -1, 2).contiguous())
        out = torch.view_as_real(z * torch.polar(torch.ones_like(f.double()), f.double())).flatten(-2)
    else:
        emb = torch.cat((f, f), -1).double()
        rot = torch.cat((-xf[..., rd // 2:], xf[..., :rd // 2]), -1)
        out = xf * emb.cos() + rot * emb.sin()
    return torch.cat((out, rest), -1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("layout,interleaved,rotary_dim,offset", [
    ("bshd", False, 128, 0), ("bshd", True, 64, 3), ("bhsd", False, 64, 0), ("bhsd", True, 128, 7)])
def test_rotary_matches_the_reference_formulas(torch, dtype, layout, interleaved, rotary_dim, offset):
    dt = getattr(torch, dtype)
    b, s, hq, hk, d = 2, 33, 8, 2, 128

    def make(h):
        shape = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
        return torch.randn(*shape, device="cuda", dtype=dt, requires_grad=True)
    q, k = make(hq), make(hk)
    freqs = _rope_angles(torch, s + offset, rotary_dim, "cuda")
    for cos, sin in ((freqs.cos(), freqs.sin()), (freqs.cos().to(dt), freqs.sin().to(dt))):
        qo, ko = tessera.rotary_embedding(q, k, cos, sin, layout=layout, interleaved=interleaved,
                                          seqlen_offset=offset)
        f = freqs[offset:].unsqueeze(0)
        # The output's rounding, and for half-precision angles theirs (the reference's are exact).
        tol = 1e-5 if dtype == "float32" else 2e-2
        atol = 8e-2 if cos.dtype != torch.float32 else 2 * tol
        for got, x in ((qo, q), (ko, k)):
            want = _rope_reference(torch, x.detach(), f, interleaved, layout)
            assert got.shape == x.shape and got.dtype == x.dtype
            torch.testing.assert_close(got.double(), want, atol=atol, rtol=tol)
    # The backward: the opposite rotation, as autograd of the reference gives it.
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    qr = q.detach().double().requires_grad_()
    kr = k.detach().double().requires_grad_()
    f = freqs[offset:].unsqueeze(0)
    rq, rk = _rope_reference(torch, qr, f, interleaved, layout), _rope_reference(torch, kr, f, interleaved, layout)
    wq, wk = torch.autograd.grad((rq, rk), (qr, kr), (gq.double(), gk.double()))
    tol = 1e-5 if dtype == "float32" else 2e-2
    torch.testing.assert_close(dq.double(), wq, atol=4 * tol, rtol=tol)
    torch.testing.assert_close(dk.double(), wk, atol=4 * tol, rtol=tol)


def test_rotary_hugging_face_angles_and_decode_offsets(torch):
    b, s, h, d = 3, 1, 4, 64
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, 2, d, device="cuda", dtype=torch.bfloat16)
    freqs = _rope_angles(torch, 40, d, "cuda")
    emb = torch.cat((freqs, freqs), -1)  # Hugging Face's (1, positions, head_dim)
    offsets = torch.tensor([0, 17, 39], device="cuda", dtype=torch.int32)
    got = tessera.rotary_embedding(q, k, emb.cos()[None], emb.sin()[None], seqlen_offsets=offsets)
    f = freqs[offsets.long()].unsqueeze(1)  # (batch, 1, d / 2)
    for g, x in zip(got, (q, k)):
        torch.testing.assert_close(g.double(), _rope_reference(torch, x, f, False, "bshd"), atol=3e-2, rtol=2e-2)


def test_rotary_packed_qkv_views_and_errors(torch):
    qkv = torch.randn(2, 9, 12, 64, device="cuda", dtype=torch.float16)
    q, k = qkv[:, :, :8], qkv[:, :, 8:10]
    freqs = _rope_angles(torch, 9, 32, "cuda")
    qo, ko = tessera.rotary_embedding(q, k, freqs.cos(), freqs.sin(), interleaved=True)
    torch.testing.assert_close(qo.double(), _rope_reference(torch, q, freqs[None], True, "bshd"),
                               atol=3e-3, rtol=2e-3)
    with pytest.raises(ValueError, match="cos"):  # too few positions for the sequence
        tessera.rotary_embedding(q, k, freqs.cos()[:4], freqs.sin()[:4])
    with pytest.raises(ValueError, match="layout"):
        tessera.rotary_embedding(q, k, freqs.cos(), freqs.sin(), layout="sbhd")


def test_rotary_on_cpu_takes_torchs_composition():
    """No GPU needed: CPU tensors take the declaration's torch composition."""
    torch = pytest.importorskip("torch", reason="torch not installed")
    q, k = torch.randn(2, 5, 4, 32, dtype=torch.float64), torch.randn(2, 5, 2, 32, dtype=torch.float64)
    freqs = _rope_angles(torch, 5, 32, "cpu").double()
    qo, ko = tessera.rotary_embedding(q, k, freqs.cos(), freqs.sin())
    torch.testing.assert_close(qo, _rope_reference(torch, q, freqs[None], False, "bshd"))
    torch.testing.assert_close(ko, _rope_reference(torch, k, freqs[None], False, "bshd"))
