"""CPU tests of what the MXFP4 MoE plan() hands the compiled extension, against a stand-in for it
(SPEC §7): the binding call, forced tiles and syncs, the arch and SM-count checks, check mode,
the choice words last_tile() reads, and the plans a wrapper keeps."""
from __future__ import annotations

import pytest
import torch

from cake_moe import _runtime
from cake_moe.mxfp4_moe import Mxfp4MoEPlan, prepare_cake_mxfp4_weights
from cake_moe.mxfp4_moe import _kept_plans, _wrapper
from cake_moe.reference import moe as ref

from .mxfp4_moe_cases import byte_bank
from .mxfp4_moe_plan_args import E, H, I, K, WRONG_SCALE_DTYPE, aligned_bytes, call, cpu_wrapper_args


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


def test_last_tile_reads_the_choice_words(fake_ext, monkeypatch):
    """plan.last_tile() names the form the routing kernel's words in the workspace chose: the
    tile list header's word (0: the decision's tile ran, else its alt_tile) and, where the plan
    bound the width per expert, the second list's word too (both 0: both pairs ran)."""
    import dataclasses
    w, a = cpu_wrapper_args()
    at = _wrapper._workspace_offsets(5, H, I, E, K)
    first, second = at["tiles"] + 4 * _wrapper._TILE_CHOICE_AT, at["alt_tiles"] + 4 * _wrapper._TILE_CHOICE_AT
    words = a["workspace"].view(torch.int32)
    a["workspace"].fill_(0x5A)

    def run(plan, first_word, second_word):
        words[first // 4], words[second // 4] = first_word, second_word
        return plan.last_tile()

    plan = call(w, a)
    assert plan._choice_at == (first, None)   # no width per expert bound
    assert run(plan, 1, 1) == plan.decision.tile, "a decision without alt_tile reads no word"
    plan.decision = dataclasses.replace(plan.decision, tile="wg64x4", alt_tile="wg32x4")
    assert [run(plan, 0, 7), run(plan, 1, 0)] == ["wg64x4", "wg32x4"]
    monkeypatch.setattr(_FakeBound, "split_width", True)
    w.release()
    split = call(w, a)
    assert split._choice_at == (first, second)
    split.decision = plan.decision
    assert [run(split, 0, 0), run(split, 1, 0), run(split, 0, 1)] == ["wg64x4+wg32x4", "wg32x4", "wg64x4"]


@pytest.mark.parametrize("packed,kind", [(False, 0), (True, 2)])
def test_plan_binding_call(fake_ext, packed, kind):
    w, a = cpu_wrapper_args(packed=packed)
    plan = call(w, a)
    (args, kwargs), = fake_ext.calls
    assert args[0].dtype == torch.uint8 and args[0].data_ptr() == a["x"].data_ptr()
    assert args[1] is a["x_sf"] and args[2] is a["topk_ids"] and args[3] is a["topk_weights"]
    assert args[4] == kind
    assert args[5:] == (a["w1"], a["w1_sf"], a["w2"], a["w2_sf"], a["beta"], a["linear_beta"], a["workspace"],
                        a["output"], None, None)   # positional weights: no largest scale codes
    assert kwargs == dict(num_tokens=5, hidden=H, inter=I, num_experts=E, num_local=E, local_offset=0, top_k=K,
                          gemm1_tile="n8_shortk", gemm2_tile="n8_shortk",   # H = 256, I = 128: both K short
                          tile_sync=True)       # an sm_90 decode decision syncs at every load (1.25 routes per expert)
    assert isinstance(plan, Mxfp4MoEPlan)
    assert plan._plan.streams == [], "plan() enqueues nothing"
    assert plan.run() is a["output"] and plan._plan.streams == [1234]
    assert plan.num_tokens == 5 and plan.decision.block_n == 8 and "gemm1_n8" in plan.forms
    assert any(t is a["workspace"] for t in plan._keep) and any(t is a["w2"] for t in plan._keep)


def test_plan_binding_passes_the_dicts_largest_codes(fake_ext):
    w, a = cpu_wrapper_args()
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
    w, a = cpu_wrapper_args(t=400)   # 400 * 2 / 8 = 100 routes per expert -> prefill (BN 128)
    a["topk_weights"] = a["topk_weights"].float()
    plan = call(w, a)
    (args, kwargs), = fake_ext.calls
    # I = 128 <= RESIDENT_K: GEMM2 keeps its token rows resident
    assert args[4] == 1 and (kwargs["gemm1_tile"], kwargs["gemm2_tile"]) == ("wg128x4", "wg128x4_rb")
    assert plan.decision.path == "prefill"


def test_plan_tile_sync(fake_ext):
    w, a = cpu_wrapper_args(t=1)   # 1 * 2 / 8 = 0.25 routes per expert: the table syncs per tile
    plan = call(w, a)
    assert fake_ext.calls[-1][1]["tile_sync"] is True and plan.decision.tile_sync
    plan = call(w, a, tile_sync=False)
    assert fake_ext.calls[-1][1]["tile_sync"] is False and not plan.decision.tile_sync
    for tile in ("wg64x4", "wg128"):   # the refusal is tile_sync's, not x's
        with pytest.raises(ValueError, match="^tile_sync needs an mma.sync"):
            call(w, a, tile=tile, tile_sync=True)


def test_plan_forced_tile(fake_ext):
    w, a = cpu_wrapper_args(t=200)
    plan = call(w, a, tile="n32")
    (_, kwargs), = fake_ext.calls
    assert (kwargs["gemm1_tile"], kwargs["gemm2_tile"]) == ("n32", "n32")
    assert plan.decision.path == "forced" and plan.decision.block_n == 32


def test_plan_refuses_an_sm90_tile_on_another_arch(fake_ext):
    w, a = cpu_wrapper_args(t=200)
    w.capability = (10, 0)
    torch.cuda.get_device_capability = lambda device: (10, 0)  # fake_ext's monkeypatch restores it
    with pytest.raises(ValueError, match="^tile 'wg128' is an sm_90a form"):
        call(w, a, tile="wg128")
    assert call(w, a) is not None and fake_ext.calls[-1][1]["gemm1_tile"] == "n64"


def test_plan_refuses_another_capability(fake_ext):
    w, a = cpu_wrapper_args()
    w.capability = (10, 0)
    with pytest.raises(RuntimeError, match="compute capability"):
        call(w, a)
    assert fake_ext.calls == []


def test_plan_refuses_another_sm_count(fake_ext):
    w, a = cpu_wrapper_args()
    w.sm_count = 148
    with pytest.raises(RuntimeError, match="132 SMs"):
        call(w, a)
    assert fake_ext.calls == []


def test_check_mode_finds_stale_largest_codes(fake_ext, monkeypatch):
    w, a = cpu_wrapper_args()
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
    w, a = cpu_wrapper_args(packed=packed)
    plan = call(w, a)
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
    w, a = cpu_wrapper_args()
    first = call(w, a)
    again = call(w, a)
    assert len(kept_plans.calls) == 1 and len(w._kept) == 1
    assert again is not first and again._plan is first._plan and again._number != first._number
    assert again.output is a["output"] and [t for t in again._keep] == [t for t in first._keep]
    assert again.decision == first.decision and again.forms == first.forms
    assert again.run() is a["output"] and first._plan.streams == [1234]
    for name in ("x", "x_sf", "topk_ids", "topk_weights", "w1", "w1_sf", "w2", "w2_sf", "beta", "linear_beta",
                 "workspace", "output"):
        other = dict(a)
        other[name] = aligned_bytes(a[name].numel()).view(a[name].dtype).view(a[name].shape).copy_(a[name]) \
            if name == "workspace" else a[name].clone()
        bound = len(kept_plans.calls)
        plans = [call(w, other) for _ in range(2)]
        assert len(kept_plans.calls) == bound + 1, name
        assert plans[1]._plan is plans[0]._plan is not first._plan, name
        (args, _) = kept_plans.calls[-1]
        assert other[name].data_ptr() in {t.data_ptr() for t in args if isinstance(t, torch.Tensor)}, name


def test_plan_keys_every_argument_its_checks_read(kept_plans, monkeypatch):
    """What the checks and the binding read is in the key: fewer tokens at the same addresses, a
    size-1 dimension's stride, tile_sync, the weights as the prepared dict, a plan-time switch
    bind anew; another dtype at the same address, a non-bool tile_sync, a dict's wrong layout
    field or positional weights beside the dict are refused as when nothing was kept."""
    w, a = cpu_wrapper_args(t=2)
    call(w, a)
    few = dict(a, **{name: a[name][:1] for name in ("x", "x_sf", "topk_ids", "topk_weights", "output")})
    assert call(w, few).num_tokens == 1 and call(w, few).num_tokens == 1
    assert len(kept_plans.calls) == 2 and kept_plans.calls[-1][1]["num_tokens"] == 1
    strided = dict(few, output=few["output"].as_strided(few["output"].shape, (3 * H, 1)))
    assert strided["output"].is_contiguous() and strided["output"].data_ptr() == few["output"].data_ptr()
    call(w, strided)
    call(w, strided)
    assert len(kept_plans.calls) == 3
    call(w, few, tile_sync=False)
    call(w, few, tile_sync=False)
    assert len(kept_plans.calls) == 4 and kept_plans.calls[-1][1]["tile_sync"] is False
    with pytest.raises(ValueError, match="tile_sync must be None, True or False"):
        call(w, few, tile_sync=0)
    with pytest.raises(ValueError, match="tile must be one of"):
        call(w, few, tile=["n8"])
    for name, dtype in (("x_sf", WRONG_SCALE_DTYPE), ("topk_weights", torch.float16), ("beta", torch.int32)):
        with pytest.raises(ValueError, match=f"{name} must have dtype"):
            call(w, dict(a, **{name: a[name].view(dtype)}))
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
        call(w, dict(a, x=[[0] * H] * 2))
    for name in _kept_plans.PLAN_SWITCHES:
        bound = len(kept_plans.calls)
        monkeypatch.setenv(name, "1")
        call(w, a)
        call(w, a)
        monkeypatch.delenv(name)
        assert len(kept_plans.calls) == bound + 1, name
    call(w, a)
    monkeypatch.setenv(_kept_plans.CACHE_SWITCH, "0")
    kept, bound = len(w._kept), len(kept_plans.calls)
    call(w, a)
    call(w, a)
    assert len(kept_plans.calls) == bound + 2 and len(w._kept) == kept


def test_kept_plans_hold_no_tensor(kept_plans, monkeypatch):
    """A kept plan holds addresses, not tensors: the buffers go when the caller's plans do. A
    full cache is emptied at once."""
    import gc
    import weakref
    w, a = cpu_wrapper_args()
    refs = [weakref.ref(a[name]) for name in ("x", "workspace", "output", "w1")]
    plan = call(w, a)
    call(w, a)
    kept_plans.calls.clear()   # (the stand-in extension records its arguments; the real one keeps addresses)
    del plan, a
    gc.collect()
    assert len(w._kept) == 1 and all(r() is None for r in refs)
    monkeypatch.setattr(_kept_plans, "MAX_KEPT", 2)
    w, a = cpu_wrapper_args()
    for t in range(1, 4):
        call(w, dict(a, **{name: a[name][:t] for name in ("x", "x_sf", "topk_ids", "topk_weights", "output")}))
    assert len(w._kept) == 1 and len(kept_plans.calls) == 3


def test_kept_plans_go_at_exit_and_on_release(kept_plans):
    """The hook run at exit empties every wrapper's kept plans (the extension's plan objects must
    go before its types do); ``release()`` empties one wrapper's."""
    wrappers = [cpu_wrapper_args()[0] for _ in range(2)]
    for w in wrappers:
        call(w, cpu_wrapper_args()[1])
    assert [len(w._kept) for w in wrappers] == [1, 1]
    _kept_plans.clear_all()
    assert [len(w._kept) for w in wrappers] == [0, 0]
    w, a = cpu_wrapper_args()
    plan = call(w, a)
    w.release()
    assert len(w._kept) == 0 and call(w, a)._plan is not plan._plan
    plan.run()   # a plan made before release() still runs


def test_plan_switches_are_what_the_extension_reads():
    """PLAN_SWITCHES (in every kept plan's key) names each variable the extension's plan
    reads from the environment."""
    import re
    from pathlib import Path
    source = (Path(__file__).resolve().parents[1] / "cpp/host/mxfp4_moe/mxfp4_moe.cpp").read_text()
    read = set(re.findall(r'(?:getenv|env_or)\("(CAKE_MOE_\w+)"', source))
    assert read and read == set(_kept_plans.PLAN_SWITCHES)
