"""One family-B layer at the contract geometry, planned once and run a few times: the target
for Nsight Compute / Systems (e.g. ncu -k regex:gemm1 --launch-skip 2 --launch-count 1).
usage: python ci/profile_moe.py LAYOUT T [TILE] [RUNS]"""
import sys

import torch

from cake_moe.bench import mxfp4_moe as b
from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper, prepare_cake_mxfp4_weights

layout, t = sys.argv[1], int(sys.argv[2])
tile = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 3
l, offset, i_shard = b.layout_dims(layout)
gen = torch.Generator(device="cuda").manual_seed(0)
bank = b.random_bank(l, i_shard, gen)
prepared = prepare_cake_mxfp4_weights(bank["w1"], bank["w1_scale"], bank["w2"], bank["w2_scale"])
del bank
beta, lbeta = b.random_situ(l, gen)
runner = CakeMxfp4MoEWrapper(b.E, b.TOP_K, b.H, b.I, **b.LAYOUTS[layout])
x, x_sf, ids, w = b.random_inputs(t, l, offset, gen)
out = torch.empty(t, b.H, dtype=torch.bfloat16, device="cuda")
ws = torch.empty(runner.get_workspace_size(t), dtype=torch.uint8, device="cuda")
plan = runner.plan(x, x_sf, ids, w, prepared, beta=beta, linear_beta=lbeta, workspace=ws, output=out, tile=tile)
for _ in range(runs):
    plan.run()
torch.cuda.synchronize()
print(plan)
