"""tessera.grouped_mm beside torch._grouped_mm once each, forward form (2-d x 3-d with offsets),
at an MoE family's expert shapes and balanced routing, for ncu (dev tool; device:
ncu -k "regex:gemm|grouped|cutlass|xmma" --section SpeedOfLight ... python3 dev/ncu_grouped.py [family]).
Families: qwen3 (8192 tokens x top-8 of 128 experts, 2048 -> 1536), deepseek (256 experts, 7168 -> 4096);
"-exact" after one: every group the same whole number of tiles."""
import sys

import torch
import tessera

SHAPES = {"qwen3": (8192 * 8, 128, 2048, 1536), "deepseek": (8192 * 8, 256, 7168, 4096)}
# "<family>-exact": every group the mean's rows, a whole number of 128-row tiles (no partial tile,
# every unit the same length), against the routed sizes
name = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
rows, groups, k, n = SHAPES[name.removesuffix("-exact")]
a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
b = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # [G, K, N], K contiguous
# balanced as a router balances: each group's rows within +-1/16 of the mean, so most groups end mid-tile
g = torch.Generator().manual_seed(0)
spread = 0 if name.endswith("-exact") else (rows // groups) // 16
sizes = rows // groups + torch.randint(-spread, spread + 1, (groups,), generator=g)
sizes[-1] += rows - sizes.sum()
offs = sizes.cumsum(0).to(device="cuda", dtype=torch.int32)
for _ in range(2):
    tessera.grouped_mm(a, b, offs)
    torch._grouped_mm(a, b, offs)
torch.cuda.synchronize()
