"""CPU tests of the MXFP4 MoE host side (SPEC §7, docs/mxfp4_moe.md): the workspace size, the
wrapper, and every refusal of plan() reachable without a GPU. The binding contract is checked
against a stand-in for the compiled extension. The weight layout and the decision table have
their own modules (test_mxfp4_moe_prepare.py, test_mxfp4_moe_decide.py)."""
from __future__ import annotations

import pytest
import torch

from cake_moe import _runtime
from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper, Mxfp4MoEPlan, prepare_cake_mxfp4_weights
from cake_moe.mxfp4_moe import _kept_plans, _wrapper
from cake_moe.reference import moe as ref

from .mxfp4_moe_cases import CONTRACT_ARGS as CONTRACT, EP8_ARGS as EP8, TP8_ARGS as TP8, byte_bank

E, K, H, I = 8, 2, 256, 128          # small geometry for plan() checks

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


def test_last_tile_reads_the_choice_words(fake_ext, monkeypatch):
    """plan.last_tile() names the form the routing kernel's words in the workspace chose: the
    tile list header's word (0: the decision's tile ran, else its alt_tile) and, where the plan
    bound the width per expert, the second list's word too (both 0: both pairs ran)."""
    import dataclasses
    w, a = _cpu_wrapper_args()
    at = _wrapper._workspace_offsets(5, H, I, E, K)
    first, second = at["tiles"] + 4 * _wrapper._TILE_CHOICE_AT, at["alt_tiles"] + 4 * _wrapper._TILE_CHOICE_AT
    words = a["workspace"].view(torch.int32)
    a["workspace"].fill_(0x5A)

    def run(plan, first_word, second_word):
        words[first // 4], words[second // 4] = first_word, second_word
        return plan.last_tile()

    plan = _call(w, a)
    assert plan._choice_at == (first, None)   # no width per expert bound
    assert run(plan, 1, 1) == plan.decision.tile, "a decision without alt_tile reads no word"
    plan.decision = dataclasses.replace(plan.decision, tile="wg64x4", alt_tile="wg32x4")
    assert [run(plan, 0, 7), run(plan, 1, 0)] == ["wg64x4", "wg32x4"]
    monkeypatch.setattr(_FakeBound, "split_width", True)
    w.release()
    split = _call(w, a)
    assert split._choice_at == (first, second)
    split.decision = plan.decision
    assert [run(split, 0, 0), run(split, 1, 0), run(split, 0, 1)] == ["wg64x4+wg32x4", "wg32x4", "wg64x4"]


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
    if not torch.cuda.is_available():
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
    if not torch.cuda.is_available():
        assert CakeMxfp4MoEWrapper(**CONTRACT, device=3).device == torch.device("cuda", 3)
        plain = CakeMxfp4MoEWrapper(**CONTRACT, device="cuda")
        assert (by_index.device, by_index.sm_count) == (plain.device, plain.sm_count) == (by_name.device, 132)


def test_wrapper_takes_numpy_integers():
    np = pytest.importorskip("numpy")
    w = CakeMxfp4MoEWrapper(np.int64(896), np.int32(16), np.int64(7168), np.int64(3072),
                            num_local_experts=np.int64(112), local_expert_offset=np.int64(336), sm_count=132)
    assert (w.num_experts, w.local_expert_offset) == (896, 336) and type(w.num_experts) is int


def test_repr_names_the_layout():
    assert "local_expert_offset=336" in repr(CakeMxfp4MoEWrapper(**CONTRACT, **EP8))


# --- plan(): refusals without a GPU ----------------------------------------------------------

def _aligned_bytes(n: int, align: int = 256) -> torch.Tensor:
    buf = torch.zeros(n + align, dtype=torch.uint8)
    off = (-buf.data_ptr()) % align
    return buf[off:off + n]


def _plan_args(t: int = 5, packed: bool = False) -> tuple[CakeMxfp4MoEWrapper, dict]:
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
             workspace=_aligned_bytes(w.get_workspace_size(t)), output=torch.empty(t, H, dtype=torch.bfloat16))
    return w, a


def _cpu_wrapper_args(packed: bool = False, t: int = 5):
    """_plan_args with the wrapper's device set to the tensors' (the CPU) but its kernel path kept:
    plan() gets past the device check to every other check."""
    w, a = _plan_args(t=t, packed=packed)
    w.device = torch.device("cpu")
    return w, a


_MISSING = object()   # a keyword left out of the call


def _call(w: CakeMxfp4MoEWrapper, a: dict, **kw):
    given = {k: a[k] for k in ("beta", "linear_beta", "workspace", "output") if a[k] is not _MISSING}
    return w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], a["w1"], a["w1_sf"], a["w2"], a["w2_sf"],
                  **given, **kw)


def _set(**changes):
    return lambda a: a.update(changes)


def _with(name, fn):
    return lambda a: a.update({name: fn(a[name])})


_BAD_PLAN = {
    "beta None": (_set(beta=None), "beta is required"),
    "linear_beta None": (_set(linear_beta=None), "linear_beta is required"),
    "beta left out": (_set(beta=_MISSING), "beta is required"),
    "linear_beta left out": (_set(linear_beta=_MISSING), "linear_beta is required"),
    "x dtype": (_with("x", lambda x: x.to(torch.bfloat16)), "x must have dtype"),
    "x 3-D": (_with("x", lambda x: x.view(1, *x.shape)), "x must be 2-D"),
    "x columns": (_with("x", lambda x: torch.cat([x.view(torch.uint8)] * 2, 1).view(torch.float8_e4m3fn)),
                  "hidden_size"),
    "x no tokens": (_with("x", lambda x: x[:0]), "^x: num_tokens"),
    "x non-contiguous": (_with("x", lambda x: x.view(torch.uint8).t().contiguous().t().view(torch.float8_e4m3fn)),
                         "x must be contiguous"),
    "x_sf shape": (_with("x_sf", lambda s: s[:, :4].contiguous()), "x_sf must have shape"),
    "x_sf dtype": (_with("x_sf", lambda s: s.view(torch.float8_e8m0fnu)), "x_sf must have dtype"),
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
    "workspace misaligned": (_with("workspace", lambda t: _aligned_bytes(t.numel() + 16)[16:]), "256-byte aligned"),
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
    w, a = _cpu_wrapper_args()
    change(a)
    with pytest.raises(ValueError, match=match):
        _call(w, a)


_REQUIRED = ("beta None", "linear_beta None", "beta left out", "linear_beta left out")


@pytest.mark.parametrize("what,packed", [(None, False), (None, True),
                                         *((what, False) for what in sorted(set(_BAD_PLAN) - set(_REQUIRED)))])
def test_plan_checks_the_device_first(what, packed):
    """CPU tensors given to a CUDA wrapper are refused for their device, well formed or not: a
    misaligned workspace, a wrong shape or dtype is not reported ahead of the device."""
    w, a = _plan_args(packed=packed)
    if what is not None:
        _BAD_PLAN[what][0](a)
    with pytest.raises(ValueError, match=r"x is on cpu, expected cuda:0"):
        _call(w, a)


def test_plan_names_the_tensor_on_another_device():
    w, a = _cpu_wrapper_args()
    a["workspace"] = a["workspace"].to("meta")
    a["output"] = a["output"][:, :128].contiguous()   # a shape error too: the device is reported first
    with pytest.raises(ValueError, match=r"workspace is on meta, expected cpu"):
        _call(w, a)


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
    w, a = _cpu_wrapper_args()
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
        _plan_args()[0].plan(*args, prepared, **common)


def test_plan_accepts_the_prepared_dict():
    w, a = _plan_args()
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
    w, a = _plan_args()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="captur"):
        _call(w, a)


# --- the binding contract, against a stand-in extension --------------------------------------

class _FakeBound:
    forms = "moe_route,fmt_mxfp8_dequantize,mxfp4_moe_gemm1_n8,mxfp4_moe_gemm2_n8,moe_finalize"
    split_width = False

    def __init__(self):
        self.streams = []

    def run(self, stream):
        self.streams.append(stream)


class _FakeExt:
    def __init__(self):
        self.calls = []

    def mxfp4_moe_plan(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return _FakeBound()


@pytest.fixture
def fake_ext(monkeypatch):
    """plan() with the device, SM-count and arch queries answered for CPU tensors and the
    extension replaced by a recorder."""
    ext = _FakeExt()
    monkeypatch.setattr(_runtime, "ext", lambda: ext)
    monkeypatch.setattr(_runtime, "require_served", lambda device, what: None)
    monkeypatch.setattr(_runtime, "stream_handle", lambda device: 1234)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("Props", (), {"multi_processor_count": 132})())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    return ext


@pytest.mark.parametrize("packed,kind", [(False, 0), (True, 2)])
def test_plan_binding_call(fake_ext, packed, kind):
    w, a = _cpu_wrapper_args(packed=packed)
    plan = _call(w, a)
    (args, kwargs), = fake_ext.calls
    assert args[0].dtype == torch.uint8 and args[0].data_ptr() == a["x"].data_ptr()
    assert args[1] is a["x_sf"] and args[2] is a["topk_ids"] and args[3] is a["topk_weights"]
    assert args[4] == kind
    assert args[5:] == (a["w1"], a["w1_sf"], a["w2"], a["w2_sf"], a["beta"], a["linear_beta"], a["workspace"],
                        a["output"], None, None)   # positional weights: no largest scale codes
    assert kwargs == dict(num_tokens=5, hidden=H, inter=I, num_experts=E, num_local=E, local_offset=0, top_k=K,
                          gemm1_tile="n8_shortk", gemm2_tile="n8_shortk",   # H = 256, I = 128: both K short
                          tile_sync=False)                                  # 5 * 2 / 8 = 1.25 routes per expert
    assert isinstance(plan, Mxfp4MoEPlan)
    assert plan._plan.streams == [], "plan() enqueues nothing"
    assert plan.run() is a["output"] and plan._plan.streams == [1234]
    assert plan.num_tokens == 5 and plan.decision.block_n == 8 and "gemm1_n8" in plan.forms
    assert any(t is a["workspace"] for t in plan._keep) and any(t is a["w2"] for t in plan._keep)


def test_plan_binding_passes_the_dicts_largest_codes(fake_ext):
    w, a = _cpu_wrapper_args()
    prepared = prepare_cake_mxfp4_weights(*(t.clone() for t in byte_bank(E, H, I)))
    w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared, beta=a["beta"],
           linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"])
    (args, _), = fake_ext.calls
    assert args[5] is prepared["w1"] and args[8] is prepared["w2_sf"]
    assert args[13] is prepared["w1_sf_max"] and args[14] is prepared["w2_sf_max"]
    # the four tensors positionally, the largest codes as keywords: the same binding
    w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared["w1"], prepared["w1_sf"], prepared["w2"],
           prepared["w2_sf"], beta=a["beta"], linear_beta=a["linear_beta"], workspace=a["workspace"],
           output=a["output"], w1_sf_max=prepared["w1_sf_max"], w2_sf_max=prepared["w2_sf_max"])
    args2, _ = fake_ext.calls[-1]
    assert args2[13] is prepared["w1_sf_max"] and args2[14] is prepared["w2_sf_max"]


def test_plan_binding_fp32_weights_and_tile(fake_ext):
    w, a = _cpu_wrapper_args(t=400)   # 400 * 2 / 8 = 100 routes per expert -> prefill (BN 128)
    a["topk_weights"] = a["topk_weights"].float()
    plan = _call(w, a)
    (args, kwargs), = fake_ext.calls
    # I = 128 <= RESIDENT_K: GEMM2 keeps its token rows resident
    assert args[4] == 1 and (kwargs["gemm1_tile"], kwargs["gemm2_tile"]) == ("wg128x4", "wg128x4_rb")
    assert plan.decision.path == "prefill"


def test_plan_tile_sync(fake_ext):
    w, a = _cpu_wrapper_args(t=1)   # 1 * 2 / 8 = 0.25 routes per expert: the table syncs per tile
    plan = _call(w, a)
    assert fake_ext.calls[-1][1]["tile_sync"] is True and plan.decision.tile_sync
    plan = _call(w, a, tile_sync=False)
    assert fake_ext.calls[-1][1]["tile_sync"] is False and not plan.decision.tile_sync
    for tile in ("wg64x4", "wg128"):   # the refusal is tile_sync's, not x's
        with pytest.raises(ValueError, match="^tile_sync needs an mma.sync"):
            _call(w, a, tile=tile, tile_sync=True)


def test_plan_forced_tile(fake_ext):
    w, a = _cpu_wrapper_args(t=200)
    plan = _call(w, a, tile="n32")
    (_, kwargs), = fake_ext.calls
    assert (kwargs["gemm1_tile"], kwargs["gemm2_tile"]) == ("n32", "n32")
    assert plan.decision.path == "forced" and plan.decision.block_n == 32


def test_plan_refuses_an_sm90_tile_on_another_arch(fake_ext):
    w, a = _cpu_wrapper_args(t=200)
    w.capability = (10, 0)
    torch.cuda.get_device_capability = lambda device: (10, 0)  # fake_ext's monkeypatch restores it
    with pytest.raises(ValueError, match="^tile 'wg128' is an sm_90a form"):
        _call(w, a, tile="wg128")
    assert _call(w, a) is not None and fake_ext.calls[-1][1]["gemm1_tile"] == "n64"


def test_plan_refuses_another_capability(fake_ext):
    w, a = _cpu_wrapper_args()
    w.capability = (10, 0)
    with pytest.raises(RuntimeError, match="compute capability"):
        _call(w, a)
    assert fake_ext.calls == []


def test_plan_refuses_another_sm_count(fake_ext):
    w, a = _cpu_wrapper_args()
    w.sm_count = 148
    with pytest.raises(RuntimeError, match="132 SMs"):
        _call(w, a)
    assert fake_ext.calls == []


def test_check_mode_finds_stale_largest_codes(fake_ext, monkeypatch):
    w, a = _cpu_wrapper_args()
    bank = [t.clone() for t in byte_bank(E, H, I)]
    for sf in (bank[1], bank[3]):
        sf.clamp_(max=124)
    prepared = prepare_cake_mxfp4_weights(*bank)
    plan = w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared, beta=a["beta"],
                  linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"])
    monkeypatch.setenv("CAKE_MOE_CHECK", "1")
    plan.run()                                   # codes and their largest values agree
    prepared["w2_sf"][3, 5, 1] = 200             # new scales written in place, w2_sf_max not
    prepared["w2_sf"][6, 0, 0] = 129
    runs = len(plan._plan.streams)
    with pytest.raises(ValueError, match=r"w2_sf_max says <= 128 for 2 expert\(s\)"):
        plan.run()
    assert len(plan._plan.streams) == runs, "nothing is launched after a failed check"
    prepared["w2_sf_max"].copy_(prepared["w2_sf"].reshape(E, -1).amax(dim=1))
    plan.run()                                   # the largest codes written too: accepted


@pytest.mark.parametrize("packed", [False, True])
def test_check_mode_counts_bad_ids(fake_ext, monkeypatch, packed):
    w, a = _cpu_wrapper_args(packed=packed)
    plan = _call(w, a)
    monkeypatch.setenv("CAKE_MOE_CHECK", "1")
    plan.run()                                   # every id valid
    bad = torch.tensor([E, -1], dtype=torch.int32)
    if packed:
        a["topk_ids"][0] = ref.pack_routes(bad, torch.ones(2))
    else:
        a["topk_ids"][0] = bad
    runs = len(plan._plan.streams)
    with pytest.raises(ValueError, match=r"2 expert id\(s\) outside \[0, 8\)"):
        plan.run()
    assert len(plan._plan.streams) == runs, "nothing is launched after a failed check"
    monkeypatch.delenv("CAKE_MOE_CHECK")
    plan.run()                                   # without the debug mode the kernels drop them


# --- the plans a wrapper keeps (the same tensors planned again) ------------------------------

@pytest.fixture
def kept_plans(fake_ext, monkeypatch):
    """fake_ext with the keeping switch and every plan-time switch unset."""
    for name in (_kept_plans.CACHE_SWITCH, *_kept_plans.PLAN_SWITCHES):
        monkeypatch.delenv(name, raising=False)
    return fake_ext


def test_plan_keeps_what_it_bound(kept_plans):
    """plan() with the same tensors again binds nothing: the new plan object holds the given
    tensors around the plan bound before. The same values at another address bind anew (once)."""
    w, a = _cpu_wrapper_args()
    first = _call(w, a)
    again = _call(w, a)
    assert len(kept_plans.calls) == 1 and len(w._kept) == 1
    assert again is not first and again._plan is first._plan and again._number != first._number
    assert again.output is a["output"] and [t for t in again._keep] == [t for t in first._keep]
    assert again.decision == first.decision and again.forms == first.forms
    assert again.run() is a["output"] and first._plan.streams == [1234]
    for name in ("x", "x_sf", "topk_ids", "topk_weights", "w1", "w1_sf", "w2", "w2_sf", "beta", "linear_beta",
                 "workspace", "output"):
        other = dict(a)
        other[name] = _aligned_bytes(a[name].numel()).view(a[name].dtype).view(a[name].shape).copy_(a[name]) \
            if name == "workspace" else a[name].clone()
        bound = len(kept_plans.calls)
        plans = [_call(w, other) for _ in range(2)]
        assert len(kept_plans.calls) == bound + 1, name
        assert plans[1]._plan is plans[0]._plan is not first._plan, name
        (args, _) = kept_plans.calls[-1]
        assert other[name].data_ptr() in {t.data_ptr() for t in args if isinstance(t, torch.Tensor)}, name


def test_plan_keys_every_argument_its_checks_read(kept_plans, monkeypatch):
    """What the checks and the binding read is in the key: fewer tokens at the same addresses, a
    size-1 dimension's stride, tile_sync, the weights as the prepared dict, a plan-time switch
    bind anew; another dtype at the same address, a non-bool tile_sync, a dict's wrong layout
    field or positional weights beside the dict are refused as when nothing was kept."""
    w, a = _cpu_wrapper_args(t=2)
    _call(w, a)
    few = dict(a, **{name: a[name][:1] for name in ("x", "x_sf", "topk_ids", "topk_weights", "output")})
    assert _call(w, few).num_tokens == 1 and _call(w, few).num_tokens == 1
    assert len(kept_plans.calls) == 2 and kept_plans.calls[-1][1]["num_tokens"] == 1
    strided = dict(few, output=few["output"].as_strided(few["output"].shape, (3 * H, 1)))
    assert strided["output"].is_contiguous() and strided["output"].data_ptr() == few["output"].data_ptr()
    _call(w, strided)
    _call(w, strided)
    assert len(kept_plans.calls) == 3
    _call(w, few, tile_sync=False)
    _call(w, few, tile_sync=False)
    assert len(kept_plans.calls) == 4 and kept_plans.calls[-1][1]["tile_sync"] is False
    with pytest.raises(ValueError, match="tile_sync must be None, True or False"):
        _call(w, few, tile_sync=0)
    with pytest.raises(ValueError, match="tile must be one of"):
        _call(w, few, tile=["n8"])
    for name, dtype in (("x_sf", torch.float8_e8m0fnu), ("topk_weights", torch.float16), ("beta", torch.int32)):
        with pytest.raises(ValueError, match=f"{name} must have dtype"):
            _call(w, dict(a, **{name: a[name].view(dtype)}))
    prepared = prepare_cake_mxfp4_weights(*byte_bank(E, H, I))

    def with_dict(weights, **kw):
        return w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], weights, beta=a["beta"],
                      linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"], **kw)

    bound = len(kept_plans.calls)
    plans = [with_dict(prepared) for _ in range(2)]
    assert len(kept_plans.calls) == bound + 1 and plans[0]._plan is plans[1]._plan
    assert plans[1]._code_max[0][2] is prepared["w1_sf_max"]   # the dict's largest codes, kept
    with pytest.raises(ValueError, match="hidden_size=512, the wrapper expects 256"):
        with_dict(dict(prepared, hidden_size=2 * H))
    with pytest.raises(ValueError, match="either as the dict or as four tensors"):
        w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared, prepared["w1_sf"],
               beta=a["beta"], linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"])
    with pytest.raises(ValueError, match="x must be a torch.Tensor"):
        _call(w, dict(a, x=[[0] * H] * 2))
    for name in _kept_plans.PLAN_SWITCHES:
        bound = len(kept_plans.calls)
        monkeypatch.setenv(name, "1")
        _call(w, a)
        _call(w, a)
        monkeypatch.delenv(name)
        assert len(kept_plans.calls) == bound + 1, name
    _call(w, a)
    monkeypatch.setenv(_kept_plans.CACHE_SWITCH, "0")
    kept, bound = len(w._kept), len(kept_plans.calls)
    _call(w, a)
    _call(w, a)
    assert len(kept_plans.calls) == bound + 2 and len(w._kept) == kept


def test_kept_plans_hold_no_tensor(kept_plans, monkeypatch):
    """A kept plan holds addresses, not tensors: the buffers go when the caller's plans do. A
    full cache is emptied at once."""
    import gc
    import weakref
    w, a = _cpu_wrapper_args()
    refs = [weakref.ref(a[name]) for name in ("x", "workspace", "output", "w1")]
    plan = _call(w, a)
    _call(w, a)
    kept_plans.calls.clear()   # (the stand-in extension records its arguments; the real one keeps addresses)
    del plan, a
    gc.collect()
    assert len(w._kept) == 1 and all(r() is None for r in refs)
    monkeypatch.setattr(_kept_plans, "MAX_KEPT", 2)
    w, a = _cpu_wrapper_args()
    for t in range(1, 4):
        _call(w, dict(a, **{name: a[name][:t] for name in ("x", "x_sf", "topk_ids", "topk_weights", "output")}))
    assert len(w._kept) == 1 and len(kept_plans.calls) == 3


def test_kept_plans_go_at_exit_and_on_release(kept_plans):
    """The hook run at exit empties every wrapper's kept plans (the extension's plan objects must
    go before its types do); ``release()`` empties one wrapper's."""
    wrappers = [_cpu_wrapper_args()[0] for _ in range(2)]
    for w in wrappers:
        _call(w, _cpu_wrapper_args()[1])
    assert [len(w._kept) for w in wrappers] == [1, 1]
    _kept_plans.clear_all()
    assert [len(w._kept) for w in wrappers] == [0, 0]
    w, a = _cpu_wrapper_args()
    plan = _call(w, a)
    w.release()
    assert len(w._kept) == 0 and _call(w, a)._plan is not plan._plan
    plan.run()   # a plan made before release() still runs


def test_plan_switches_are_what_the_extension_reads():
    """PLAN_SWITCHES (in every kept plan's key) names each variable the extension's plan
    reads from the environment."""
    import re
    from pathlib import Path
    source = (Path(__file__).resolve().parents[1] / "cpp/host/mxfp4_moe/mxfp4_moe.cpp").read_text()
    read = set(re.findall(r'(?:getenv|env_or)\("(CAKE_MOE_\w+)"', source))
    assert read and read == set(_kept_plans.PLAN_SWITCHES)


# --- CPU plans and the torch.library op ------------------------------------------------------

def _cpu_layer(name: str, t: int, *, regime: str = "balanced", weights_dtype=torch.float32, seed: int = 3):
    """(plan, case, bank) of a general geometry on a CPU wrapper (the reference runs)."""
    from .mxfp4_moe_cases import GENERAL, make_case, random_weights
    geom = GENERAL[name]
    bank = random_weights(geom, seed=seed, device="cpu")
    case = make_case(geom, t, regime, seed=seed + 1, device="cpu", weights_dtype=weights_dtype)
    args, kw = geom.wrapper_args()
    moe = CakeMxfp4MoEWrapper(*args, **kw, device="cpu")
    prepared = prepare_cake_mxfp4_weights(bank["w1"], bank["w1_scale"], bank["w2"], bank["w2_scale"])
    out = torch.full((t, geom.hidden), float("nan"), dtype=torch.bfloat16)
    plan = moe.plan(case.x, case.x_sf, case.topk_ids, case.topk_weights, prepared, beta=case.beta,
                    linear_beta=case.linear_beta, workspace=torch.empty(moe.get_workspace_size(t), dtype=torch.uint8),
                    output=out)
    return plan, case, bank


@pytest.mark.parametrize("name,regime,weights_dtype", [("h256_e8_k2", "balanced", torch.float32),
                                                        ("h384_ep_k8", "oob", torch.bfloat16),
                                                        ("h256_tp_k4", "dup", None)])
def test_cpu_plan_runs_the_reference(name, regime, weights_dtype):
    """A CPU wrapper's plan takes the same arguments and checks, and run() writes the FP64
    reference of its bound tensors (expert parallel, tensor parallel, packed routes)."""
    from .mxfp4_moe_cases import reference
    plan, case, bank = _cpu_layer(name, 6, regime=regime, weights_dtype=weights_dtype)
    assert plan.forms == "cpu-reference" and plan.output.isnan().all(), "plan() on CPU runs nothing"
    assert torch.equal(plan.run(), reference(case, bank))
    case.topk_ids.copy_(case.topk_ids.flip(0))                  # new routes written in place
    assert torch.equal(plan.run(), reference(case, bank))


def test_cpu_plan_picks_up_weights_written_in_place():
    """As on the GPU, a CPU plan reads the bound prepared weights at each run: another bank
    copied into them gives that bank's reference."""
    from .mxfp4_moe_cases import GENERAL, make_case, random_weights, reference
    geom = GENERAL["h256_e8_k2"]
    banks = [random_weights(geom, seed=seed, device="cpu") for seed in (3, 11)]
    prepared = [prepare_cake_mxfp4_weights(b["w1"], b["w1_scale"], b["w2"], b["w2_scale"]) for b in banks]
    case = make_case(geom, 5, "balanced", seed=4, device="cpu")
    args, kw = geom.wrapper_args()
    moe = CakeMxfp4MoEWrapper(*args, **kw, device="cpu")
    plan = moe.plan(case.x, case.x_sf, case.topk_ids, case.topk_weights, prepared[0], beta=case.beta,
                    linear_beta=case.linear_beta, workspace=torch.empty(moe.get_workspace_size(5), dtype=torch.uint8),
                    output=torch.empty(5, geom.hidden, dtype=torch.bfloat16))
    first = reference(case, banks[0])
    assert torch.equal(plan.run(), first)
    for key, t in prepared[0].items():
        if isinstance(t, torch.Tensor):
            t.copy_(prepared[1][key])
    second = reference(case, banks[1])
    assert not torch.equal(first, second) and torch.equal(plan.run(), second)


def test_cpu_wrapper_refuses_other_devices():
    with pytest.raises(ValueError, match="CUDA device or the CPU"):
        CakeMxfp4MoEWrapper(E, K, H, I, device="meta")
    plan, case, _ = _cpu_layer("h256_e8_k2", 3)
    assert plan.run().device.type == "cpu"


def test_run_with_copies_what_is_not_bound():
    """The op's path: tensors other than the bound ones are copied in for the run (and the
    output out), and the bound ones get their contents back after (the op writes only output)."""
    plan, case, bank = _cpu_layer("h256_e8_k2", 4)
    want = plan.run().clone()
    other = torch.empty_like(plan.output)
    x_bytes = case.x.view(torch.uint8)
    saved = x_bytes.clone()
    x_bytes.zero_()                                             # the bound x now holds zeros
    got = plan.run_with(saved.clone(), case.x_sf.clone(), case.topk_ids.clone(), case.topk_weights.clone(), other)
    assert got is other and torch.equal(other, want)
    assert not x_bytes.any(), "the bound x must hold what it held before the op (zeros)"
    with pytest.raises(ValueError, match="topk_ids must match the bound tensor"):
        plan.run_with(saved, case.x_sf, case.topk_ids[:2], case.topk_weights, other)
    with pytest.raises(ValueError, match="topk_weights: the plan was made with it"):
        plan.run_with(saved, case.x_sf, case.topk_ids, None, other)


@pytest.mark.parametrize("weights_dtype", [torch.float32, None])
def test_torch_library_opcheck_on_cpu(weights_dtype):
    plan, case, _ = _cpu_layer("h256_e8_k2", 5, weights_dtype=weights_dtype)
    torch.library.opcheck(torch.ops.cake_moe.mxfp4_moe_run.default,
                          (plan._number, case.x.view(torch.uint8), case.x_sf, case.topk_ids, case.topk_weights,
                           plan.output))


def test_compiled_run_fullgraph_on_cpu():
    """torch.compile(fullgraph=True) of a function calling plan.run(): the same bits as eager,
    and new routes written into the bound tensor are picked up."""
    from .mxfp4_moe_cases import reference
    plan, case, bank = _cpu_layer("h256_e8_k2", 5)

    def step(p):
        return p.run().float() * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(plan), reference(case, bank).float() * 2)
    case.topk_ids.copy_(case.topk_ids.roll(1, 0))
    assert torch.equal(compiled(plan), reference(case, bank).float() * 2)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_run_leaves_the_bound_tensors_as_the_graph_expects(backend):
    """The op declares only `output` as written; where a compiled graph hands it other tensors
    than the bound ones, the bound ones get their contents back after the run, so a graph that
    reads them around the op (which inductor may reorder) sees what eager code sees: the same
    plan run twice on new routes, the previous output read before a run, a bound input read
    before new values are written into it, and new FP8 tokens written into x in the graph."""
    plan, case, _ = _cpu_layer("h256_e8_k2", 5)
    plan.run()   # a previous result in the output (finite, so that the comparisons mean something)

    def twice(p, ids1, ids2):
        p._topk_ids.copy_(ids1)
        y1 = p.run().float()
        p._topk_ids.copy_(ids2)
        return y1 - p.run().float()

    def after_previous(p):
        prev = p.output.float() * 3
        return p.run().float() + prev

    def input_read_first(p, new_weights):
        old = p._inputs[3] * 3
        p._inputs[3].copy_(new_weights)
        return p.run().float() + old[:, :1]

    def new_tokens(p, x, new_x):
        x.copy_(new_x)
        return p.run().clone()

    other = _cpu_layer("h256_e8_k2", 5, seed=11)[1]
    cases = [(twice, lambda: (case.topk_ids.clone(), case.topk_ids.roll(1, 0).clone())),
             (after_previous, lambda: ()),
             (input_read_first, lambda: (case.topk_weights.flip(0).clone(),)),
             (new_tokens, lambda: (case.x, other.x))]
    for fn, args in cases:
        saved = [t.clone() for t in (case.x.view(torch.uint8), case.topk_ids, case.topk_weights, plan.output)]
        want = fn(plan, *args()).clone()
        for t, s in zip((case.x.view(torch.uint8), case.topk_ids, case.topk_weights, plan.output), saved):
            t.copy_(s)
        got = torch.compile(fn, fullgraph=True, backend=backend)(plan, *args())
        assert torch.equal(got, want), f"{fn.__name__} ({backend})"
        for t, s in zip((case.x.view(torch.uint8), case.topk_ids, case.topk_weights, plan.output), saved):
            t.copy_(s)


def test_a_collected_plan_is_forgotten():
    plan, case, _ = _cpu_layer("h256_e8_k2", 2)
    number, args = plan._number, (case.x.view(torch.uint8), case.x_sf, case.topk_ids, case.topk_weights)
    out = plan.output
    del plan
    import gc
    gc.collect()
    with pytest.raises(ValueError, match=f"no live Mxfp4MoEPlan has number {number}"):
        torch.ops.cake_moe.mxfp4_moe_run(number, *args, out)
