"""Which patch moves gpt-oss's bf16 log-probabilities: the convergence test's training with one
keyword of apply_tessera on at a time (the others off), the top-k log-prob difference to plain."""
import sys

import torch
import transformers

sys.path.insert(0, "tests/python")
import test_transformers_convergence as c  # noqa: E402
import tessera.transformers as tt  # noqa: E402

KEYS = ("rope", "rms_norm", "swiglu", "experts", "cross_entropy", "fused_linear_cross_entropy", "attention")


def run(model_type, dtype, only):
    name, extra = c.CONFIGS[model_type]
    config = getattr(transformers, name)(**{**c.MINI, **extra})
    torch.manual_seed(42)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype).cuda().train()
    if only is not None:
        kw = {k: (k == only) for k in KEYS}
        if only == "all":
            kw = {}
        tt.apply_tessera(model, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=c.LR)
    g = torch.Generator(device="cuda").manual_seed(0)
    losses = []
    for _ in range(c.STEPS):
        ids = torch.randint(3, c.MINI["vocab_size"], (c.BATCH, c.SEQ), device="cuda", generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        ids = torch.randint(3, c.MINI["vocab_size"], (c.BATCH, c.SEQ), device="cuda", generator=g)
        lp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    tt.revert()
    return losses, lp


for model_type in sys.argv[1:] or ["gpt_oss"]:
    base_l, base = run(model_type, torch.bfloat16, None)
    again_l, again = run(model_type, torch.bfloat16, None)
    top = base.topk(c.TOPK, dim=-1).indices
    def diff(lp):
        return (lp.gather(-1, top) - base.gather(-1, top)).abs().max().item()
    print(f"{model_type} plain twice: lp diff {diff(again):.4f}")
    for only in ("all",) + KEYS:
        try:
            l, lp = run(model_type, torch.bfloat16, only)
            print(f"{model_type} only {only:27s} lp diff {diff(lp):.4f}  loss[-1] {l[-1]:.5f} vs {base_l[-1]:.5f}")
        except Exception as e:  # noqa: BLE001
            print(f"{model_type} only {only}: {type(e).__name__}: {str(e)[:150]}")
