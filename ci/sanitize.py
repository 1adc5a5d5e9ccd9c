"""Runs every kernel form once on small shapes (odd sizes, swizzled padding, ragged groups) for
compute-sanitizer, and checks the results against the references, so that a clean run is also a
right one.   usage: python ci/sanitize.py [comma list of formats,grouped_gemm,mxfp4_moe | all]"""
import os
import sys

import torch

import cake_moe
from cake_moe import formats
from cake_moe.reference import formats as ref
from cake_moe.reference import grouped_gemm as gref
from cake_moe.bench.grouped_gemm import SM90_TILES

torch.manual_seed(0)
bad = 0


def check(ok: bool, what: str) -> None:
    global bad
    if not ok:
        bad += 1
        print("MISMATCH", what)


def run_formats() -> None:
    for rows, cols in ((3, 64), (130, 96)):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(rows, cols, dtype=dtype, device="cuda")
            g = ref.nvfp4_global_scale(x)
            for swz in (False, True):
                for fmt, fn in (("mxfp8", formats.mxfp8_quantize), ("mxfp4", formats.mxfp4_quantize)):
                    q, s = fn(x, swizzled=swz)
                    rq, rs = ref.quantize_mx(x.cpu(), fmt, swizzled=swz)
                    check(torch.equal(q.view(torch.uint8).cpu(), rq.view(torch.uint8)), f"{fmt} q")
                    deq = formats.mxfp8_dequantize if fmt == "mxfp8" else formats.mxfp4_dequantize
                    y = deq(q, s, swizzled=swz, dtype=dtype)
                    check(torch.equal(y.cpu(), ref.dequantize_mx(rq, rs, fmt, swizzled=swz, dtype=dtype)), f"{fmt} deq")
                q, s = formats.nvfp4_quantize(x, g, swizzled=swz)
                y = formats.nvfp4_dequantize(q, s, g, swizzled=swz, dtype=dtype)
                rq, rs = ref.quantize_nvfp4(x.cpu(), g.cpu(), swizzled=swz)
                check(torch.equal(q.cpu(), rq), "nvfp4 q")
                check(torch.equal(y.cpu(), ref.dequantize_nvfp4(rq, rs, g.cpu(), swizzled=swz, dtype=dtype)), "nvfp4 deq")


def run_grouped_gemm() -> None:
    # the last case splits its first group in two chunks (2048-row chunks through the workspace),
    # so one CTA's ring wraps within a unit
    for sizes, n, k in (([3, 0, 70, 1], 72, 136), ([130, 5], 200, 64), ([2100, 0, 3], 200, 136)):
        rows = sum(sizes) + 3
        offs = torch.tensor(sizes).cumsum(0).to(torch.int32).cuda()
        x = torch.randn(rows, k, device="cuda").bfloat16()
        g = torch.randn(rows, n, device="cuda").bfloat16()
        w = (torch.randn(len(sizes), n, k, device="cuda") * 0.05).bfloat16()
        check(gref.rel_rms(cake_moe.grouped_gemm_fwd(x, w, offs), gref.fwd(x, w, offs)) < 6e-3, "gg fwd")
        check(gref.rel_rms(cake_moe.grouped_gemm_dgrad(g, w, offs), gref.dgrad(g, w, offs)) < 6e-3, "gg dgrad")
        # every sm_90a tile form, not only the chosen one (the portable runs leave them to the native ones)
        if torch.cuda.get_device_capability() == (9, 0) and not os.environ.get("CAKE_MOE_GG_FORCE_PORTABLE"):
            for tile in SM90_TILES:
                y = cake_moe.prepare_grouped_gemm_fwd(x, w, offs, form=f"gg_sm90_fwd_{tile}").launch()
                check(gref.rel_rms(y, gref.fwd(x, w, offs)) < 6e-3, f"gg fwd {tile}")
                dx = cake_moe.prepare_grouped_gemm_dgrad(g, w, offs, form=f"gg_sm90_dgrad_{tile}").launch()
                check(gref.rel_rms(dx, gref.dgrad(g, w, offs)) < 6e-3, f"gg dgrad {tile}")
            for variant in ("det", "fast"):  # the cluster-pair forms (multicast X, remote arrivals)
                dw = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant=variant,
                                                         form=f"gg_sm90_wgrad_{variant}_c2").launch()
                check(gref.rel_rms(dw, gref.wgrad(g, x, offs)) < 6e-3, f"gg wgrad {variant} c2")
        for variant in ("det", "fast"):
            dw = cake_moe.grouped_gemm_wgrad(g, x, offs, variant=variant)
            check(gref.rel_rms(dw, gref.wgrad(g, x, offs)) < 6e-3, f"gg wgrad {variant}")
        xr = x.clone().requires_grad_()   # grouped_mm zeroes the rows past the last end first
        y = cake_moe.grouped_mm(xr, w, offs)
        y.backward(g)
        check(not y.detach()[sum(sizes):].any() and not xr.grad[sum(sizes):].any(), "gg grouped_mm unrouted rows")


_SPLIT_ALL = {"CAKE_MOE_SPLIT_FROM": "0", "CAKE_MOE_SPLIT_MAX": "128"}  # GEMM1: every unit as K halves


def run_mxfp4_moe() -> None:
    """Family B on small shapes (H=256, I=128, E=8, top_k=2; an EP rank with remote experts),
    with ids outside [0, E) (never dereferenced), both route-weight dtypes, the packed form, the
    per-tile GEMM1 -> GEMM2 sync (the table's at T = 1, forced over several tiles), the routing
    over several CTAs (16384 routes) and the prefill tile forms (wgmma on sm_90a: their cp.async ->
    wgmma ring and amax exchange); the FP64 reference runs on the CPU (fast under the sanitizer)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from mxfp4_moe_cases import make_case, named_layer, reference
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    wg_prefill, wg_mid, wg_wide, wg_narrow = ("wg128", "wg128x4", "wg160x3", "wg96x4") if sm90 else ("n64",) * 4
    for name, runs in (("h256_e8_k2", (("balanced", 17, torch.float32, None, None),
                                        ("oob", 17, torch.bfloat16, None, None), ("oob", 17, None, None, None),
                                        ("dup", 1, torch.float32, None, None),   # T = 1: the table's tile sync
                                        ("zipf", 17, torch.float32, "n8", True),
                                        ("zipf", 129, torch.float32, wg_prefill, None),
                                        # GEMM1's unit queue on a grid of 3 CTAs, each taking several
                                        # units: the ring runs on across units, the K-split tail's
                                        # shared memory is reused by the next unit
                                        ("dup", 1, torch.float32, None, 3), ("zipf", 17, torch.float32, "n8", 3),
                                        ("zipf", 17, torch.float32, "n8_narrow", 3))),
                       ("h384_ep_k8", (("balanced", 17, torch.bfloat16, None, None),
                                       ("remote", 17, torch.float32, None, None),
                                       ("zipf", 2048, torch.float32, None, None),   # 4 routing CTAs, 2 GEMM pairs
                                       ("balanced", 200, torch.float32, wg_mid, None),
                                       ("zipf", 300, torch.float32, wg_wide, None),
                                       ("zipf", 300, torch.float32, wg_narrow, None))),
                       # I = 640: the sm_90a GEMM2 streams its token rows (no resident-row form)
                       ("i640_h256_e8_k2", (("zipf", 300, torch.float32, wg_wide, None),
                                            ("balanced", 129, torch.float32, wg_mid, None))),
                       # H = 512: the sm_90a GEMM1 takes its scale codes through the code ring;
                       # I = 512 at T = 1: the narrow GEMM1's GEMM2 is the two-K-warp short form
                       ("ring_h512_i512_e8_k2", (("zipf", 300, torch.float32, wg_wide, None),
                                                 ("balanced", 129, torch.float32, wg_mid, None),
                                                 ("dup", 1, torch.float32, None, None))),
                       # I = 1024: the `wg160x3` GEMM2 takes its scale codes through the ring too
                       ("ring_h256_i1024_e4_k2", (("zipf", 300, torch.float32, wg_wide, None),)),
                       # H = 2048: GEMM1's K halves (every unit split: two CTAs, a parked partial),
                       # on the resident grid and on 3 CTAs taking every piece in turn
                       ("split_h2048_e8_k2", (("zipf", 17, torch.float32, "n8_narrow", _SPLIT_ALL),
                                             ("zipf", 17, torch.float32, "n8", {**_SPLIT_ALL, "CAKE_MOE_UNIT_QUEUE": "3"})))):
        layer = named_layer(name)
        bank = {k: v.cpu() for k, v in layer.bank.items()}
        # sync: None (the table's choice), True (forced on), N (forced on, GEMM1 on a grid of N
        # CTAs) or a dict (forced on, with these plan variables set)
        for regime, t, dtype, tile, sync in runs:
            case = make_case(layer.geom, t, regime, seed=t, weights_dtype=dtype, extreme_ids=dtype is not None)
            queue = isinstance(sync, int) and not isinstance(sync, bool)
            env = {"CAKE_MOE_UNIT_QUEUE": str(sync)} if queue else sync if isinstance(sync, dict) else {}
            os.environ.update(env)
            try:
                got = layer.run(case, tile=tile, tile_sync=None if sync is None else True).cpu()
            finally:
                for k in env:
                    del os.environ[k]
            want = reference(case.to("cpu"), bank)
            ok = torch.equal(got, want) if regime == "remote" else gref.rel_rms(got, want) < 5e-3
            check(ok, f"mxfp4_moe {name} {regime} T={t} {dtype} {tile or 'decided'}"
                      f"{' +sync' if sync else ''}{f', {sync} GEMM1 CTAs' if queue else ''}"
                      f"{''.join(f', {k}={v}' for k, v in env.items()) if isinstance(sync, dict) else ''}")


FAMILIES = {"formats": run_formats, "grouped_gemm": run_grouped_gemm, "mxfp4_moe": run_mxfp4_moe}
which = sys.argv[1] if len(sys.argv) > 1 else "all"
for fam in FAMILIES if which == "all" else which.split(","):
    FAMILIES[fam]()
torch.cuda.synchronize()
print(f"sanitize run ({which}, portable={os.environ.get('CAKE_MOE_GG_FORCE_PORTABLE', '0')}): {bad} mismatches")
raise SystemExit(1 if bad else 0)
