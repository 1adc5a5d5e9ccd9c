"""Outputs of fixed layers (seeded), saved for a bit comparison between builds.
usage: python ci/dump_moe.py NAME  (writes /tmp/dump_NAME.pt);  python ci/dump_moe.py --compare A B
For A/B of kernel changes: dump with each build, then compare (bit-identical or by how much)."""
import sys
import torch

if sys.argv[1] == "--compare":
    a, b_ = (torch.load(f"/tmp/dump_{n}.pt") for n in sys.argv[2:4])
    for key in a:
        x, y = a[key].float(), b_[key].float()
        same = torch.equal(a[key], b_[key])
        rel = ((x - y).norm() / x.norm()).item()
        ndiff = (a[key] != b_[key]).sum().item()
        print(f"{sys.argv[2]} vs {sys.argv[3]} {key}: equal={same} differing={ndiff}/{x.numel()} relnorm={rel:.3e}")
    sys.exit(0)

from cake_moe.bench import mxfp4_moe as b

# (T, forced tile form or None for the decision table's): the table's rows, and the decode and
# mid mma.sync forms (K split over warps) forced at a few T
FORCED = [(t, f) for t in (1, 16, 200) for f in ("n8", "n8_narrow", "n8_narrow4", "n32")]
CASES = {"ep8": [(t, None) for t in (1, 4, 16, 64, 1024, 4096)] + FORCED,
         "tp8": [(t, None) for t in (1, 4, 16, 64, 1024, 2048, 4096)] + FORCED}
res = {}
for layout, cases in CASES.items():
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = b.rank_layer(layout, gen)
    l, offset, runner, prepared, beta, lbeta = r.local, r.offset, r.runner, r.prepared, r.beta, r.linear_beta
    for t, tile in cases:
        x, x_sf, ids, w = b.random_inputs(t, l, offset, gen)
        out = torch.full((t, b.H), float("nan"), dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(runner.get_workspace_size(t), dtype=torch.uint8, device="cuda")
        plan = runner.plan(x, x_sf, ids, w, prepared, beta=beta, linear_beta=lbeta, workspace=ws, output=out,
                           tile=tile)
        plan.run()
        torch.cuda.synchronize()
        assert torch.isfinite(out.float()).all()
        res[f"{layout} T={t} ({plan.decision.tile}{'' if tile is None else ' forced'})"] = out.cpu()
torch.save(res, f"/tmp/dump_{sys.argv[1]}.pt")
print("dumped", sys.argv[1], list(res))
