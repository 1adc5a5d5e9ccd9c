"""Test data for family B (MXFP4 x MXFP8 SiTU routed MoE, SPEC §7): geometries, random weight
banks, activations, routing regimes and the FP64 reference call. The checks the GPU test modules
share are in tests/mxfp4_moe_checks.py.

Weights are drawn directly as MXFP4 codes (uniform random nibbles, UE8M0 scale codes 118..124,
that is 2^-9 .. 2^-3, near the codes of real checkpoints): no FP32 bank is ever materialised, so
the contract geometry (3.7 GB of codes per layout) is generated on the GPU in milliseconds.
Activations are random normal rows with per-row magnitudes 2^-2 .. 2^2, quantized by the
reference MXFP8 quantizer on the data's device. Everything is seeded and reproducible.

Absolute imports only: ci/sanitize.py imports this file with tests/ on sys.path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cake_moe.bench.mxfp4_moe import random_bank, random_situ
from cake_moe.reference import formats as fmt
from cake_moe.reference import moe as ref

# Ids that must never be dereferenced. The packed route form keeps the id in 16 bits, so
# packable_bad_ids fit a signed 16-bit field; EXTREME_BAD_IDS only exist in the unpacked form.
EXTREME_BAD_IDS = (2**31 - 1, -2**31)


def packable_bad_ids(num_experts: int) -> tuple[int, ...]:
    return (-1, -2, -num_experts, num_experts, num_experts + 1, 32767, -32768)


@dataclass(frozen=True)
class Geometry:
    """One rank's view of a layer: E global experts of which `num_local` (from `offset`) live
    here (expert parallel), or every expert with a slice `shard` of I (MoE tensor parallel)."""
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int
    num_local: int | None = None
    offset: int = 0
    shard: int | None = None

    @property
    def local(self) -> int:
        return self.num_experts if self.num_local is None else self.num_local

    @property
    def i_shard(self) -> int:
        return self.intermediate if self.shard is None else self.shard

    @property
    def has_remote(self) -> bool:
        return self.local < self.num_experts

    def wrapper_args(self) -> tuple[tuple, dict]:
        """(args, kwargs) of CakeMxfp4MoEWrapper for this rank."""
        kw = {}
        if self.num_local is not None:
            kw.update(num_local_experts=self.num_local, local_expert_offset=self.offset)
        if self.shard is not None:
            kw.update(intermediate_shard=self.shard)
        return (self.num_experts, self.top_k, self.hidden, self.intermediate), kw


# The contract geometry (SPEC §7): H=7168, I=3072, E=896, top_k=16 on rank 3 of 8.
CONTRACT = {
    "ep8": Geometry(7168, 3072, 896, 16, num_local=112, offset=336),
    "tp8": Geometry(7168, 3072, 896, 16, shard=384),
}

# General shapes: H and I_shard multiples of 128, 1 <= top_k <= 32, top_k <= E <= 1024.
GENERAL = {
    "h256_e8_k2": Geometry(256, 128, 8, 2),
    "h512_e40_k5": Geometry(512, 256, 40, 5),
    "h384_ep_k8": Geometry(384, 256, 64, 8, num_local=16, offset=16),
    "h256_tp_k4": Geometry(256, 512, 16, 4, shard=128),
    "h128_e1024_k32": Geometry(128, 128, 1024, 32),
    "h256_e4_k1": Geometry(256, 256, 4, 1),
    # I > 512: the sm_90a GEMM2 streams its token rows through the ring (no resident-row form)
    "i640_h256_e8_k2": Geometry(256, 640, 8, 2),
    # H = 512: the sm_90a GEMM1 takes its scale codes through the code ring (K a multiple of
    # 512; GemmParams::code_ring), I = 512: the largest K of the resident-row GEMM2 forms
    "ring_h512_i512_e8_k2": Geometry(512, 512, 8, 2),
    # I = 1024: the sm_90a `wg160x3` GEMM2 takes its scale codes through the ring too
    "ring_h256_i1024_e4_k2": Geometry(256, 1024, 4, 2),
    # H = 2048: two K stages of the narrow GEMM1 (1024 each), so its units can be K halves
    "split_h2048_e8_k2": Geometry(2048, 256, 8, 2),
}

# The contract geometry as CakeMxfp4MoEWrapper keywords (the host-side tests).
CONTRACT_ARGS = dict(num_experts=896, top_k=16, hidden_size=7168, intermediate_size=3072)
EP8_ARGS = dict(num_local_experts=112, local_expert_offset=336)
TP8_ARGS = dict(intermediate_shard=384)


def byte_bank(num_local: int, hidden: int, inter: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(w1, w1_scale, w2, w2_scale) of uniformly random bytes on the CPU, scale codes included:
    for layout round trips and refusals, not for numerics."""
    g = torch.Generator().manual_seed(seed)
    shapes = ((num_local, 2 * inter, hidden // 2), (num_local, 2 * inter, hidden // 32),
              (num_local, hidden, inter // 2), (num_local, hidden, inter // 32))
    return tuple(torch.randint(0, 256, s, generator=g, dtype=torch.uint8) for s in shapes)


REGIMES = ("balanced", "remote", "hot", "zipf", "dup", "oob", "solo")


def _gen(seed: int, device) -> torch.Generator:
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


def random_weights(geom: Geometry, *, seed: int = 0, device="cuda") -> dict[str, torch.Tensor]:
    """Canonical rank-local bank (the benchmark's generator): w1 [L, 2*I_shard, H/2] (up rows
    then gate rows), w1_scale [L, 2*I_shard, H/32], w2 [L, H, I_shard/2], w2_scale
    [L, H, I_shard/32], all uint8."""
    return random_bank(geom.local, geom.i_shard, _gen(seed, device), h=geom.hidden)


def wide_scale_weights(geom: Geometry, *, seed: int = 0, device="cuda") -> dict[str, torch.Tensor]:
    """random_weights whose experts take both paths of the kernels' E2M1 conversion (one
    multiply for UE8M0 codes <= 128, two above): experts e % 4 == 1 draw codes 122..134 (most
    blocks above 128), e % 4 == 3 keep 118..124 with ~1% of the blocks at 129..131 (pipeline
    stages of either kind), the even experts keep 118..124."""
    bank = random_weights(geom, seed=seed, device=device)
    g = _gen(seed + 1, device)
    for key in ("w1_scale", "w2_scale"):
        sf = bank[key]
        for e in range(sf.shape[0]):
            if e % 4 == 1:
                sf[e] = torch.randint(122, 135, sf[e].shape, dtype=torch.uint8, device=device, generator=g)
            elif e % 4 == 3:
                hit = torch.rand(sf[e].shape, device=device, generator=g) < 0.01
                big = torch.randint(129, 132, sf[e].shape, dtype=torch.uint8, device=device, generator=g)
                sf[e] = torch.where(hit, big, sf[e])
    return bank


def random_activations(t: int, h: int, *, seed: int = 0, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """(x [T, H] float8_e4m3fn, x_sf [T, H/32] uint8): MXFP8 of random normal rows whose
    magnitudes vary by row (so the scale codes vary too)."""
    g = _gen(seed, device)
    x = torch.randn(t, h, generator=g, device=device)
    x = x * torch.exp2(torch.randint(-2, 3, (t, 1), generator=g, device=device).float())
    return fmt.quantize_mx(x, "mxfp8")


def situ_params(geom: Geometry, *, seed: int = 0, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-expert FP32 (beta, linear_beta), uniform in [3, 5] and [20, 30] (defaults 4 and 25)."""
    return random_situ(geom.local, _gen(seed, device))


# --- routing ---------------------------------------------------------------------------------

def _distinct(keys: torch.Tensor, k: int) -> torch.Tensor:
    """k distinct experts per token: the k largest keys."""
    return keys.topk(k, dim=1).indices.to(torch.int32)


def _shuffle_slots(ids: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    perm = torch.rand(ids.shape, generator=g, device=ids.device).argsort(dim=1)
    return ids.gather(1, perm)


def _balanced(geom: Geometry, t: int, g: torch.Generator, device, shuffle: bool = True) -> torch.Tensor:
    """Distinct uniform experts over all E, one of them forced local so that every token
    exercises the layer even when most experts are remote (EP). Unshuffled, the local one is
    in slot 0."""
    keys = torch.rand(t, geom.num_experts, generator=g, device=device)
    first = geom.offset + torch.randint(0, geom.local, (t,), generator=g, device=device)
    keys[torch.arange(t, device=device), first] = 2.0
    ids = _distinct(keys, geom.top_k)
    return _shuffle_slots(ids, g) if shuffle else ids


def _remote(geom: Geometry, t: int, g: torch.Generator, device) -> torch.Tensor:
    if not geom.has_remote:
        raise ValueError("this geometry has no remote experts (every expert is local)")
    keys = torch.rand(t, geom.num_experts, generator=g, device=device)
    keys[:, geom.offset:geom.offset + geom.local] = -1.0
    if geom.num_experts - geom.local < geom.top_k:
        raise ValueError("fewer remote experts than top_k")
    return _distinct(keys, geom.top_k)


def _hot(geom: Geometry, t: int, g: torch.Generator, device) -> torch.Tensor:
    """Slot 0 of every token is one local expert; the other slots are distinct uniform."""
    keys = torch.rand(t, geom.num_experts, generator=g, device=device)
    keys[:, geom.offset + geom.local // 3] = 2.0
    return _distinct(keys, geom.top_k)


def _zipf(geom: Geometry, t: int, g: torch.Generator, device) -> torch.Tensor:
    """Distinct experts drawn with Zipf(1.2) popularity over a random ranking whose most
    popular expert is local."""
    e = geom.num_experts
    rank = torch.randperm(e, generator=g, device=device)
    top = geom.offset + geom.local // 2
    swap = int((rank == 0).nonzero()[0])
    rank[swap], rank[top] = rank[top].clone(), 0
    p = 1.0 / (rank.double() + 1.0) ** 1.2
    return torch.multinomial(p.float().expand(t, e), geom.top_k, replacement=False, generator=g).to(torch.int32)


def _dup(geom: Geometry, t: int, g: torch.Generator, device) -> torch.Tensor:
    """Balanced, then the token's local expert repeated inside its top-k: slot 1 repeats it on
    even tokens, the last slot on every third token (three copies on every sixth); slots
    shuffled afterwards."""
    if geom.top_k < 2:
        raise ValueError("duplicates need top_k >= 2")
    ids = _balanced(geom, t, g, device, shuffle=False)
    tok = torch.arange(t, device=device)
    ids[:, 1] = torch.where(tok % 2 == 0, ids[:, 0], ids[:, 1])
    ids[:, -1] = torch.where(tok % 3 == 0, ids[:, 0], ids[:, -1])
    return _shuffle_slots(ids, g)


SOLO_EXPERTS = 8
SOLO_TOKENS = 513  # from this T the "solo" groups reach EXPERT_GROUP tokens (3/4 of T over <= 8 experts)


def _solo(geom: Geometry, t: int, g: torch.Generator, device) -> torch.Tensor:
    """Balanced, then three tokens in four routed to one local expert in every slot (k
    duplicates), that expert one of at most SOLO_EXPERTS drawn for the call: groups of tokens
    that only one expert feeds, so the per-expert budget (check_token_rows) holds in every
    layout, those with no remote expert included."""
    ids = _balanced(geom, t, g, device)
    few = geom.offset + torch.randperm(geom.local, generator=g, device=device)[:SOLO_EXPERTS]
    pick = few[torch.randint(0, len(few), (t,), generator=g, device=device)].to(ids.dtype)
    solo = torch.arange(t, device=device) % 4 != 3
    return torch.where(solo[:, None], pick[:, None].expand_as(ids), ids)


def _oob(geom: Geometry, t: int, g: torch.Generator, device, extreme: bool = False) -> torch.Tensor:
    """Balanced, then about a quarter of the slots replaced by ids outside [0, E)."""
    ids = _balanced(geom, t, g, device)
    bad = torch.tensor(packable_bad_ids(geom.num_experts) + (EXTREME_BAD_IDS if extreme else ()),
                       dtype=torch.int32, device=device)
    pick = bad[torch.randint(0, len(bad), ids.shape, generator=g, device=device)]
    hit = torch.rand(ids.shape, generator=g, device=device) < 0.25
    return torch.where(hit, pick, ids)


_REGIME_FNS = {"balanced": _balanced, "remote": _remote, "hot": _hot, "zipf": _zipf, "dup": _dup, "oob": _oob,
               "solo": _solo}


def routes(geom: Geometry, t: int, regime: str = "balanced", *, seed: int = 0, device="cuda",
           extreme_ids: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids [T, k] int32 global ids, topk_weights [T, k] FP32 softmax weights).

    extreme_ids (regime "oob" only) adds +-2^31 ids, which the packed form cannot carry.
    """
    g = _gen(seed, device)
    fn = _REGIME_FNS[regime]
    ids = fn(geom, t, g, device, extreme_ids) if regime == "oob" else fn(geom, t, g, device)
    weights = torch.randn(t, geom.top_k, generator=g, device=device).softmax(dim=1)
    return ids.contiguous(), weights.contiguous()


def regime_applies(geom: Geometry, regime: str) -> bool:
    return not ((regime == "remote" and not geom.has_remote) or (regime == "dup" and geom.top_k < 2))


def bad_slots(geom: Geometry, ids: torch.Tensor) -> torch.Tensor:
    """Slots whose id is outside [0, E)."""
    return (ids < 0) | (ids >= geom.num_experts)


def without_slots(geom: Geometry, ids: torch.Tensor, weights: torch.Tensor, drop: torch.Tensor):
    """The same routes with the `drop` slots made inert in a legal way: a remote expert where
    the layout has one, otherwise local expert `offset` with weight zero (fma(row, 0, acc) ==
    acc). The layer's output must not change bit for bit."""
    if geom.has_remote:
        remote = geom.offset + geom.local if geom.offset + geom.local < geom.num_experts else 0
        return torch.where(drop, torch.full_like(ids, remote), ids), weights
    return (torch.where(drop, torch.full_like(ids, geom.offset), ids),
            torch.where(drop, torch.zeros_like(weights), weights))


def local_routes(geom: Geometry, ids: torch.Tensor) -> torch.Tensor:
    """Local expert per route, -1 where the route contributes nothing."""
    return ref.local_slot_experts(ids, geom.num_experts, geom.local, geom.offset)


def route_ids(case: Case) -> torch.Tensor:
    """The expert id of every route slot, from either route form."""
    return ref.unpack_routes(case.topk_ids)[0] if case.topk_weights is None else case.topk_ids


def route_weights(case: Case) -> torch.Tensor:
    """The weight of every route slot, from either route form."""
    return ref.unpack_routes(case.topk_ids)[1] if case.topk_weights is None else case.topk_weights


# --- one problem -----------------------------------------------------------------------------

@dataclass
class Case:
    """Inputs of one layer call (weights apart): what plan() binds and the reference reads."""
    geom: Geometry
    x: torch.Tensor
    x_sf: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor | None
    beta: torch.Tensor
    linear_beta: torch.Tensor

    def to(self, device) -> "Case":
        move = {f: getattr(self, f) for f in ("x", "x_sf", "topk_ids", "topk_weights", "beta", "linear_beta")}
        return Case(self.geom, **{f: None if v is None else v.to(device) for f, v in move.items()})


def make_case(geom: Geometry, t: int, regime: str = "balanced", *, seed: int = 0, device="cuda",
              weights_dtype: torch.dtype | None = torch.float32, extreme_ids: bool = False) -> Case:
    """A fresh problem; weights_dtype None gives the packed route form (BF16 weights in the
    low 16 bits of topk_ids, topk_weights None)."""
    x, x_sf = random_activations(t, geom.hidden, seed=seed, device=device)
    ids, w = routes(geom, t, regime, seed=seed + 1, device=device, extreme_ids=extreme_ids)
    beta, lbeta = situ_params(geom, seed=seed + 2, device=device)
    if weights_dtype is None:
        return Case(geom, x, x_sf, ref.pack_routes(ids, w).contiguous(), None, beta, lbeta)
    return Case(geom, x, x_sf, ids, w.to(weights_dtype).contiguous(), beta, lbeta)


def reference(case: Case, bank: dict[str, torch.Tensor]) -> torch.Tensor:
    """The FP64 reference layer on the canonical bank, on the inputs' device."""
    g = case.geom
    return ref.mxfp4_situ_moe(case.x, case.x_sf, case.topk_ids, case.topk_weights, bank["w1"], bank["w1_scale"],
                              bank["w2"], bank["w2_scale"], beta=case.beta, linear_beta=case.linear_beta,
                              num_experts=g.num_experts, num_local_experts=g.local, local_expert_offset=g.offset)


class Layer:
    """A geometry's random bank (canonical, for the reference; prepared, for the kernels) and
    its runner. The public API is imported here, on first use, so that this module stays
    importable where the extension is not built."""

    def __init__(self, geom: Geometry, *, seed: int = 0, device="cuda", bank: dict[str, torch.Tensor] | None = None):
        from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper, prepare_cake_mxfp4_weights
        self.geom = geom
        self.device = torch.device(device)
        self.bank = random_weights(geom, seed=seed, device=device) if bank is None else bank
        b = self.bank
        self.prepared = prepare_cake_mxfp4_weights(b["w1"], b["w1_scale"], b["w2"], b["w2_scale"])
        args, kw = geom.wrapper_args()
        self.runner = CakeMxfp4MoEWrapper(*args, device=self.device, **kw)

    def workspace(self, t: int) -> torch.Tensor:
        return torch.empty(self.runner.get_workspace_size(t), dtype=torch.uint8, device=self.device)

    def plan(self, case: Case, *, workspace: torch.Tensor | None = None, output: torch.Tensor | None = None,
             tile: str | None = None, tile_sync: bool | None = None, positional: bool = False):
        """(plan, output) bound to the case's tensors; fresh workspace and output by default;
        ``tile`` forces a tile form, ``tile_sync`` the per-tile GEMM1 -> GEMM2 sync. The
        prepared dict is passed whole (with its per-expert largest scale codes), or with
        ``positional`` as its four tensors (no codes: every expert converts with two multiplies)."""
        t, h = case.x.shape
        ws = self.workspace(t) if workspace is None else workspace
        out = torch.empty(t, h, dtype=torch.bfloat16, device=self.device) if output is None else output
        p = self.prepared
        weights = (p["w1"], p["w1_sf"], p["w2"], p["w2_sf"]) if positional else (p,)
        plan = self.runner.plan(case.x, case.x_sf, case.topk_ids, case.topk_weights, *weights, beta=case.beta,
                                linear_beta=case.linear_beta, workspace=ws, output=out, tile=tile, tile_sync=tile_sync)
        return plan, out

    def run(self, case: Case, **kw) -> torch.Tensor:
        """One plan + run into a NaN-poisoned output."""
        plan, out = self.plan(case, **kw)
        out.fill_(float("nan"))
        plan.run()
        torch.cuda.synchronize(self.device)
        return out


LAYER_NAMES = tuple(sorted(CONTRACT)) + tuple(sorted(GENERAL))


def named_layer(name: str) -> Layer:
    """The Layer of a CONTRACT or GENERAL geometry, with a seed fixed by its name (so another
    process rebuilds the same bank)."""
    geom = CONTRACT[name] if name in CONTRACT else GENERAL[name]
    return Layer(geom, seed=LAYER_NAMES.index(name) + 1)


# GEMM1 lookahead (at most 32 routes: the routes name each CTA's expert before the routing kernel
# lists the tiles): several tiles of one expert (hot), duplicates, out-of-range ids, remote
# routes, k = 32, a forced n8 with k = 1, the packed route form. (name, regime, T, tile, packed)
LOOKAHEAD_CASES = [("ep8", "hot", 2, None, False), ("tp8", "dup", 2, None, False), ("ep8", "remote", 1, None, False),
                   ("h128_e1024_k32", "hot", 1, None, False), ("h384_ep_k8", "oob", 4, None, False),
                   ("h256_e4_k1", "balanced", 32, "n8", False), ("h512_e40_k5", "zipf", 6, None, True)]


def few_routes_case(geom: Geometry, regime: str, t: int, packed: bool) -> Case:
    """The inputs of a LOOKAHEAD_CASES row (also used for the routing-table tests)."""
    return make_case(geom, t, regime, seed=t + 57, weights_dtype=None if packed else torch.float32,
                     extreme_ids=regime == "oob")


def lookahead_case(layer: Layer, regime: str, t: int, tile: str | None, packed: bool) -> tuple[Case, torch.Tensor]:
    """One LOOKAHEAD_CASES row: the case and the layer's output."""
    case = few_routes_case(layer.geom, regime, t, packed)
    return case, layer.run(case, tile=tile)


def plan_args(layer: Layer, t: int) -> dict:
    """plan()'s arguments for a fresh case of T tokens, by name, with a NaN-poisoned output."""
    case = make_case(layer.geom, t, seed=41)
    p = layer.prepared
    return dict(x=case.x, x_sf=case.x_sf, topk_ids=case.topk_ids, topk_weights=case.topk_weights, w1=p["w1"],
                w1_sf=p["w1_sf"], w2=p["w2"], w2_sf=p["w2_sf"], beta=case.beta, linear_beta=case.linear_beta,
                workspace=layer.workspace(t),
                output=torch.empty(t, layer.geom.hidden, dtype=torch.bfloat16, device="cuda").fill_(float("nan")))


def call_plan(layer: Layer, a: dict, runner=None):
    """plan() with the arguments of plan_args, positional as the API takes them."""
    return (runner or layer.runner).plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], a["w1"], a["w1_sf"],
                                         a["w2"], a["w2_sf"], beta=a["beta"], linear_beta=a["linear_beta"],
                                         workspace=a["workspace"], output=a["output"])
