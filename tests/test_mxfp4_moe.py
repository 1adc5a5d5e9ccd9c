"""CPU tests of the MXFP4 MoE host side (SPEC §7, docs/mxfp4_moe.md): the workspace size, the
wrapper, and every refusal of plan() reachable without a GPU. The binding contract and the kept
plans are in test_mxfp4_moe_binding.py, CPU plans and the torch.library op in
test_mxfp4_moe_cpu_plans.py; the weight layout and the decision table have their own modules
(test_mxfp4_moe_prepare.py, test_mxfp4_moe_decide.py)."""
from __future__ import annotations

import pytest
import torch

from cake_moe import _runtime
from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper, prepare_cake_mxfp4_weights
from cake_moe.mxfp4_moe import _wrapper

from .mxfp4_moe_cases import CONTRACT_ARGS as CONTRACT, EP8_ARGS as EP8, TP8_ARGS as TP8, byte_bank
from .mxfp4_moe_plan_args import (E, H, I, MISSING, WRONG_SCALE_DTYPE, aligned_bytes, call, cpu_wrapper_args,
                                  plan_args)


# --- workspace -------------------------------------------------------------------------------

def test_workspace_formula_by_hand():
    # T=1, H=I=128, L=1, k=1: one tile (8 B + the 528-byte header: 3 units of 256 bytes), four
    # 64-row GEMM1 units of 16 KiB parking slots (256 units), the second tile list as the first
    # (3 units), the other eight segments one unit each
    assert _wrapper._workspace_bytes(1, 128, 128, 1, 1) == (8 + 3 + 256 + 3) * 256
    # T=100, H=256, I=128, L=4, k=2: R=200, 29 tiles, 29 x 4 parking slots
    t, h, i, l, k = 100, 256, 128, 4, 2
    segs = [20, 800, 800, (25 + 4) * 8 + 528, (25 + 4) * 4, 64 * l * 4, 116 * 16384, t * h * 2, 200 * i * 2,
            200 * h * 2, (25 + 4) * 8 + 528]
    assert _wrapper._workspace_bytes(t, h, i, l, k) == sum(-(-s // 256) * 256 for s in segs)


@pytest.mark.parametrize("layout", [EP8, TP8, {}])
def test_workspace_monotonic_and_formula(layout):
    w = CakeMxfp4MoEWrapper(**CONTRACT, **layout)
    ts = sorted({1, 2, 7, 8, 9, 63, 64, 65, 1000, 4095, 4096, 16384, 20000, *range(1, 20001, 97)})
    sizes = [w.get_workspace_size(t) for t in ts]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    for t, s in zip(ts, sizes):
        assert s == _wrapper._workspace_bytes(t, 7168, w.intermediate_shard, w.num_local_experts, 16)
        assert s % 256 == 0
    assert w.get_workspace_size(max_tokens=16384) == w.get_workspace_size(16384)


def test_workspace_extension_matches_python_formula():
    """Python's mirror of the workspace layout (its total, and each segment's offset, which
    plans read the tile choice words at) is the extension's, segment by segment."""
    try:
        fn = _runtime.ext().mxfp4_moe_workspace_bytes
        layout = _runtime.ext().mxfp4_moe_workspace_layout
    except (ImportError, AttributeError):
        pytest.skip("the compiled extension (with mxfp4_moe_workspace_bytes) is not available here")
    for t in (1, 5, 8, 100, 337, 2689, 16384, 16385):
        for h, i, l, k in ((7168, 3072, 112, 16), (7168, 384, 896, 16), (256, 128, 8, 2), (128, 128, 1024, 32),
                           (256, 128, 63, 2)):   # (L + 1) x 4 = 256: one int more or less moves every offset
            assert fn(t, h, i, l, k) == _wrapper._workspace_bytes(t, h, i, l, k)
            got = layout(t, h, i, l, k)
            assert (got.pop("tile_header_ints"), got.pop("tile_choice_at")) == (_wrapper._TILE_HEADER_INTS,
                                                                               _wrapper._TILE_CHOICE_AT)
            assert got == _wrapper._workspace_offsets(t, h, i, l, k), (t, h, i, l, k)


@pytest.mark.parametrize("kwargs,match", [
    ({}, "exactly one"), ({"num_tokens": 4, "max_tokens": 8}, "exactly one"),
    ({"num_tokens": 0}, "num_tokens"), ({"max_tokens": -1}, "max_tokens"), ({"num_tokens": 1.5}, "num_tokens"),
])
def test_workspace_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CakeMxfp4MoEWrapper(**CONTRACT).get_workspace_size(**kwargs)


# --- wrapper construction --------------------------------------------------------------------

def test_wrapper_defaults_and_layouts():
    w = CakeMxfp4MoEWrapper(**CONTRACT)
    assert (w.num_local_experts, w.local_expert_offset, w.intermediate_shard) == (896, 0, 3072)
    ep = CakeMxfp4MoEWrapper(**CONTRACT, **EP8)
    assert (ep.num_local_experts, ep.local_expert_offset, ep.intermediate_shard) == (112, 336, 3072)
    tp = CakeMxfp4MoEWrapper(**CONTRACT, **TP8)
    assert (tp.num_local_experts, tp.intermediate_shard) == (896, 384)
    assert CakeMxfp4MoEWrapper(**CONTRACT, sm_count=148).sm_count == 148


# Where there is no GPU, a wrapper is host-only: decisions for an H200-like part.
_HOST_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="a host-only wrapper needs a machine without a GPU")


@_HOST_ONLY
def test_host_only_wrapper_defaults():
    w = CakeMxfp4MoEWrapper(**CONTRACT)
    assert w.sm_count == _wrapper.HOST_ONLY_SM_COUNT == 132
    assert w.device == torch.device("cuda", 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(**EP8, **TP8), "cannot be combined"),
    (dict(hidden_size=7168 + 64), "hidden_size must be a multiple of 128"),
    (dict(intermediate_shard=3072 // 2 + 64), "intermediate_shard must be a multiple of 128"),
    (dict(intermediate_shard=1280), "multiple of intermediate_shard"),
    (dict(top_k=0), "top_k"), (dict(top_k=33), "top_k must be in"),
    (dict(num_experts=8, top_k=16), "num_experts must be in"), (dict(num_experts=1025), "num_experts must be in"),
    (dict(num_local_experts=112, local_expert_offset=800), "exceeds"),
    (dict(num_local_experts=897), "exceeds"),
    (dict(local_expert_offset=-1), "local_expert_offset"),
    (dict(num_local_experts=0), "num_local_experts"),
    (dict(hidden_size=True), "hidden_size"), (dict(intermediate_size=3072.0), "intermediate_size"),
    (dict(hidden_size=2**19 + 128), "hidden_size must be at most"),
    (dict(intermediate_size=2**19 + 128, intermediate_shard=2**19 + 128), "intermediate_size must be at most"),
    (dict(num_experts=896.0), "num_experts must be an integer"),
    (dict(sm_count=0), "sm_count"), (dict(device="meta"), "CUDA device or the CPU"),
    (dict(intermediate_size=3072 + 64), "intermediate_size must be a multiple of 128"),   # no shard given
    (dict(device="bogus"), "device must name a CUDA device or the CPU"),
    (dict(device=-1), "device must be a CUDA device index >= 0"),
    (dict(device=1.5), "device must be a torch.device, a device string or a CUDA device index"),
    (dict(device=True), "device must be a torch.device"),
])
def test_wrapper_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CakeMxfp4MoEWrapper(**{**CONTRACT, **kwargs})


def test_wrapper_takes_a_cuda_index_as_its_device_string():
    """device=N is "cuda:N": without a GPU it gives the host-only wrapper "cuda" gives."""
    by_index, by_name = CakeMxfp4MoEWrapper(**CONTRACT, device=0), CakeMxfp4MoEWrapper(**CONTRACT, device="cuda:0")
    assert by_index.device == by_name.device == torch.device("cuda", 0)
    assert (by_index.sm_count, by_index.capability) == (by_name.sm_count, by_name.capability)


def test_wrapper_refuses_a_cuda_index_past_the_devices(monkeypatch):
    """Where there are GPUs, an index past them is a ValueError (torch's own check asserts)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for device in (1, "cuda:3"):
        with pytest.raises(ValueError, match="one of the 1 CUDA devices"):
            CakeMxfp4MoEWrapper(**CONTRACT, device=device)


@_HOST_ONLY
def test_host_only_wrapper_takes_any_cuda_index():
    assert CakeMxfp4MoEWrapper(**CONTRACT, device=3).device == torch.device("cuda", 3)
    by_index, plain = CakeMxfp4MoEWrapper(**CONTRACT, device=0), CakeMxfp4MoEWrapper(**CONTRACT, device="cuda")
    assert (by_index.device, by_index.sm_count) == (plain.device, plain.sm_count) == (torch.device("cuda", 0), 132)


def test_wrapper_takes_numpy_integers():
    np = pytest.importorskip("numpy")
    w = CakeMxfp4MoEWrapper(np.int64(896), np.int32(16), np.int64(7168), np.int64(3072),
                            num_local_experts=np.int64(112), local_expert_offset=np.int64(336), sm_count=132)
    assert (w.num_experts, w.local_expert_offset) == (896, 336) and type(w.num_experts) is int


def test_repr_names_the_layout():
    assert "local_expert_offset=336" in repr(CakeMxfp4MoEWrapper(**CONTRACT, **EP8))


# --- plan(): refusals without a GPU ----------------------------------------------------------

def _set(**changes):
    return lambda a: a.update(changes)


def _with(name, fn):
    return lambda a: a.update({name: fn(a[name])})


_BAD_PLAN = {
    "beta None": (_set(beta=None), "beta is required"),
    "linear_beta None": (_set(linear_beta=None), "linear_beta is required"),
    "beta left out": (_set(beta=MISSING), "beta is required"),
    "linear_beta left out": (_set(linear_beta=MISSING), "linear_beta is required"),
    "x dtype": (_with("x", lambda x: x.to(torch.bfloat16)), "x must have dtype"),
    "x 3-D": (_with("x", lambda x: x.view(1, *x.shape)), "x must be 2-D"),
    "x columns": (_with("x", lambda x: torch.cat([x.view(torch.uint8)] * 2, 1).view(torch.float8_e4m3fn)),
                  "hidden_size"),
    "x no tokens": (_with("x", lambda x: x[:0]), "^x: num_tokens"),
    "x non-contiguous": (_with("x", lambda x: x.view(torch.uint8).t().contiguous().t().view(torch.float8_e4m3fn)),
                         "x must be contiguous"),
    "x_sf shape": (_with("x_sf", lambda s: s[:, :4].contiguous()), "x_sf must have shape"),
    "x_sf dtype": (_with("x_sf", lambda s: s.view(WRONG_SCALE_DTYPE)), "x_sf must have dtype"),
    "topk_ids dtype": (_with("topk_ids", lambda t: t.long()), "topk_ids must have dtype"),
    "topk_ids top_k": (_with("topk_ids", lambda t: t[:, :1].contiguous()), "topk_ids must have shape"),
    "topk_weights dtype": (_with("topk_weights", lambda t: t.half()), "topk_weights must have dtype"),
    "topk_weights tokens": (_with("topk_weights", lambda t: t[:2].contiguous()), "topk_weights must have shape"),
    "w1 shape": (_with("w1", lambda t: t[:, :128].contiguous()), "w1 must have shape"),
    "w1 experts": (_with("w1", lambda t: t[:4].contiguous()), "w1 must have shape"),
    "w1_sf dtype": (_with("w1_sf", lambda t: t.view(torch.int8)), "w1_sf must have dtype"),
    "w2 shape": (_with("w2", lambda t: t.transpose(1, 2).contiguous()), "w2 must have shape"),
    "w2_sf 2-D": (_with("w2_sf", lambda t: t[0]), "w2_sf must be 3-D"),
    "beta dtype": (_with("beta", lambda t: t.double()), "beta must have dtype"),
    "linear_beta length": (_with("linear_beta", lambda t: t[:3]), "linear_beta must have shape"),
    "workspace small": (_with("workspace", lambda t: t[:-1]), "workspace must hold"),
    "workspace 2-D": (_with("workspace", lambda t: t.view(1, -1)), "workspace must be 1-D"),
    "workspace misaligned": (_with("workspace", lambda t: aligned_bytes(t.numel() + 16)[16:]), "256-byte aligned"),
    "output dtype": (_with("output", lambda t: t.float()), "output must have dtype"),
    "output shape": (_with("output", lambda t: t[:, :128].contiguous()), "output must have shape"),
    "output misaligned": (_with("output", lambda t: torch.empty(t.numel() + 4, dtype=t.dtype)[4:].view(t.shape)),
                          "output must be 16-byte aligned"),
    "output inside workspace": (lambda a: a.update(output=a["workspace"][256:256 + 2 * 5 * H].view(torch.bfloat16)
                                                   .view(5, H)), "overlap"),
    "x inside output": (lambda a: a.update(x=a["output"].view(torch.uint8).view(-1)[:5 * H].view(5, H)
                                           .view(torch.float8_e4m3fn)), "overlap"),
    "workspace over beta": (lambda a: a.update(beta=a["workspace"][:4 * E].view(torch.float32)), "overlap"),
}


@pytest.mark.parametrize("what", sorted(_BAD_PLAN))
def test_plan_refuses(what):
    change, match = _BAD_PLAN[what]
    w, a = cpu_wrapper_args()
    change(a)
    with pytest.raises(ValueError, match=match):
        call(w, a)


_REQUIRED = ("beta None", "linear_beta None", "beta left out", "linear_beta left out")


@pytest.mark.parametrize("what,packed", [(None, False), (None, True),
                                         *((what, False) for what in sorted(set(_BAD_PLAN) - set(_REQUIRED)))])
def test_plan_checks_the_device_first(what, packed):
    """CPU tensors given to a CUDA wrapper are refused for their device, well formed or not: a
    misaligned workspace, a wrong shape or dtype is not reported ahead of the device."""
    w, a = plan_args(packed=packed)
    if what is not None:
        _BAD_PLAN[what][0](a)
    with pytest.raises(ValueError, match=r"x is on cpu, expected cuda:0"):
        call(w, a)


def test_plan_names_the_tensor_on_another_device():
    w, a = cpu_wrapper_args()
    a["workspace"] = a["workspace"].to("meta")
    a["output"] = a["output"][:, :128].contiguous()   # a shape error too: the device is reported first
    with pytest.raises(ValueError, match=r"workspace is on meta, expected cpu"):
        call(w, a)


def test_prepare_records_each_experts_largest_scale_code():
    bank = list(byte_bank(3, 256, 128, seed=5))
    for sf in (bank[1], bank[3]):
        sf.clamp_(max=127)
    bank[1][1, 7, 3] = 200   # w1_scale of expert 1
    bank[3][2, 0, 0] = 129   # w2_scale of expert 2
    p = prepare_cake_mxfp4_weights(*bank)
    for key, scale in (("w1_sf_max", bank[1]), ("w2_sf_max", bank[3])):
        got = p[key]
        assert got.dtype == torch.uint8 and got.shape == (3,) and got.is_contiguous()
        assert got.tolist() == [int(scale[e].max()) for e in range(3)]
    assert p["w1_sf_max"][1] == 200 and p["w2_sf_max"][2] == 129


def test_plan_checks_the_largest_scale_codes():
    w, a = cpu_wrapper_args()
    prepared = prepare_cake_mxfp4_weights(*byte_bank(E, H, I))
    common = dict(beta=a["beta"], linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"])
    args = (a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"])
    one = {k: v for k, v in prepared.items() if k != "w2_sf_max"}
    with pytest.raises(ValueError, match="w1_sf_max.*w2_sf_max.*or neither"):
        w.plan(*args, one, **common)
    with pytest.raises(ValueError, match="w1_sf_max and w2_sf_max come together"):
        w.plan(*args, prepared["w1"], prepared["w1_sf"], prepared["w2"], prepared["w2_sf"],
               w1_sf_max=prepared["w1_sf_max"], **common)
    with pytest.raises(ValueError, match="either as the dict or as four tensors"):
        w.plan(*args, prepared, w1_sf_max=prepared["w1_sf_max"], w2_sf_max=prepared["w2_sf_max"], **common)
    with pytest.raises(ValueError, match=r"w1_sf_max must have shape \(8,\)"):
        w.plan(*args, {**prepared, "w1_sf_max": prepared["w1_sf_max"][:2]}, **common)
    with pytest.raises(ValueError, match="w2_sf_max must have dtype"):
        w.plan(*args, {**prepared, "w2_sf_max": prepared["w2_sf_max"].int()}, **common)
    with pytest.raises(ValueError, match="is on cpu"):   # well formed: a CUDA wrapper refuses only the device
        plan_args()[0].plan(*args, prepared, **common)


def test_plan_accepts_the_prepared_dict():
    w, a = plan_args()
    prepared = dict(w1=a["w1"], w1_sf=a["w1_sf"], w2=a["w2"], w2_sf=a["w2_sf"], layout="cake_mma_v3",
                    num_local_experts=E, hidden_size=H, intermediate_shard=I)
    common = dict(beta=a["beta"], linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"])
    with pytest.raises(ValueError, match="is on cpu"):
        w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared, **common)
    with pytest.raises(ValueError, match="either as the dict or as four tensors"):
        w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared, a["w1_sf"], **common)
    with pytest.raises(ValueError, match="layout"):
        w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], {**prepared, "layout": "canonical"}, **common)
    with pytest.raises(ValueError, match="intermediate_shard"):
        w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], {**prepared, "intermediate_shard": 256}, **common)


def test_plan_refused_during_capture(monkeypatch):
    """plan() refuses while the wrapper's device captures a graph on its current stream, asked
    of that device (not of the current one); the check comes before any other."""
    w, a = plan_args()
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_runtime, "capturing", lambda device: asked.append(device) or True)
    with pytest.raises(RuntimeError, match="captur"):
        call(w, a)
    assert asked == [w.device] and w.device.type == "cuda"
