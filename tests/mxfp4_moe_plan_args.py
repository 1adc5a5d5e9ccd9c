"""plan()'s arguments for the CPU tests of the MXFP4 MoE host side: a small geometry's wrapper,
tensors and workspace, and the call that passes them as the API takes them."""
from __future__ import annotations

import torch

from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper, prepare_cake_mxfp4_weights
from cake_moe.reference import moe as ref

from .mxfp4_moe_cases import byte_bank

E, K, H, I = 8, 2, 256, 128          # small geometry for plan() checks
# a one-byte dtype that x_sf must not have: torch's own E8M0 where it has one (a scale tensor a
# user may well hold), another one-byte dtype on the releases before it
WRONG_SCALE_DTYPE = getattr(torch, "float8_e8m0fnu", torch.int8)


def aligned_bytes(n: int, align: int = 256) -> torch.Tensor:
    """n zero bytes on the CPU starting at a multiple of `align` (a workspace plan() accepts)."""
    buf = torch.zeros(n + align, dtype=torch.uint8)
    off = (-buf.data_ptr()) % align
    return buf[off:off + n]


def plan_args(t: int = 5, packed: bool = False) -> tuple[CakeMxfp4MoEWrapper, dict]:
    """A CPU wrapper of the small geometry and plan()'s arguments for T tokens, by name."""
    w = CakeMxfp4MoEWrapper(E, K, H, I, sm_count=132)
    g = torch.Generator().manual_seed(t)
    prepared = prepare_cake_mxfp4_weights(*byte_bank(E, H, I))
    ids = torch.randint(0, E, (t, K), generator=g, dtype=torch.int32)
    weights = torch.rand(t, K, generator=g).to(torch.bfloat16)
    a = dict(x=torch.randn(t, H, generator=g).to(torch.float8_e4m3fn),
             x_sf=torch.full((t, H // 32), 127, dtype=torch.uint8),
             topk_ids=ref.pack_routes(ids, weights) if packed else ids, topk_weights=None if packed else weights,
             w1=prepared["w1"], w1_sf=prepared["w1_sf"], w2=prepared["w2"], w2_sf=prepared["w2_sf"],
             beta=torch.full((E,), 4.0), linear_beta=torch.full((E,), 25.0),
             workspace=aligned_bytes(w.get_workspace_size(t)), output=torch.empty(t, H, dtype=torch.bfloat16))
    return w, a


def cpu_wrapper_args(packed: bool = False, t: int = 5):
    """plan_args with the wrapper's device set to the tensors' (the CPU) but its kernel path kept:
    plan() gets past the device check to every other check."""
    w, a = plan_args(t=t, packed=packed)
    w.device = torch.device("cpu")
    return w, a


MISSING = object()   # a keyword left out of the call


def call(w: CakeMxfp4MoEWrapper, a: dict, **kw):
    """w.plan() with the arguments of plan_args (those set to MISSING left out)."""
    given = {k: a[k] for k in ("beta", "linear_beta", "workspace", "output") if a[k] is not MISSING}
    return w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], a["w1"], a["w1_sf"], a["w2"], a["w2_sf"],
                  **given, **kw)
