"""GPU tests of what family B's plan() refuses (SPEC §7, §10): capture, another SM count,
out-of-range ids and unordered runs on a shared workspace in debug mode, tile forms outside their domain, bad tensors."""
from __future__ import annotations

import pytest
import torch

from .mxfp4_moe_cases import call_plan, make_case, plan_args
from .mxfp4_moe_checks import check_reference

pytestmark = pytest.mark.gpu


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
def test_plan_refused_during_capture(layers):
    layer = layers("h256_e8_k2")
    a = plan_args(layer, 17)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"plan\(\) cannot run during CUDA graph capture"):
        with torch.cuda.graph(graph):
            call_plan(layer, a)
    torch.cuda.synchronize()
    assert a["output"].isnan().all(), "a refused plan() wrote the output"


def test_plan_refuses_another_sm_count(layers):
    from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper
    layer = layers("h256_e8_k2")
    args, kw = layer.geom.wrapper_args()
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    other = CakeMxfp4MoEWrapper(*args, sm_count=sms + 4, **kw)
    a = plan_args(layer, 17)
    with pytest.raises(RuntimeError, match="SM"):
        call_plan(layer, a, runner=other)
    assert a["output"].isnan().all(), "a refused plan() wrote the output"


def test_debug_mode_refuses_out_of_range_ids(layers, monkeypatch):
    """CAKE_MOE_CHECK=1 validates ids and raises (SPEC §5); valid routes still run."""
    layer = layers("h256_e8_k2")
    monkeypatch.setenv("CAKE_MOE_CHECK", "1")
    with pytest.raises(ValueError, match="(?i)outside"):
        layer.run(make_case(layer.geom, 17, "oob", seed=51))
    case = make_case(layer.geom, 17, seed=52)
    check_reference(case, layer.run(case), layer.bank)


def test_debug_mode_refuses_an_unordered_run_on_a_shared_workspace(layers, monkeypatch):
    """CAKE_MOE_CHECK=1: a plan whose workspace's last run (another plan's, on a side stream) is
    still going while its own stream has synchronised refuses to run and launches nothing; once
    its stream waits for the side stream, it runs. (A wait queued between the first plan's
    checks and its launches keeps that run going: its checks synchronise the side stream.)"""
    layer = layers("h256_e8_k2")
    workspace = layer.workspace(17)
    first, second = make_case(layer.geom, 17, seed=53), make_case(layer.geom, 17, seed=54)
    plan_a, out_a = layer.plan(first, workspace=workspace)
    plan_b, out_b = layer.plan(second, workspace=workspace)
    monkeypatch.setenv("CAKE_MOE_CHECK", "1")
    checks = plan_a._check_workspace_order
    monkeypatch.setattr(plan_a, "_check_workspace_order", lambda: (checks(), torch.cuda._sleep(int(4e8))))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    out_a.fill_(float("nan"))
    out_b.fill_(float("nan"))
    with torch.cuda.stream(side):
        plan_a.run()
    with pytest.raises(RuntimeError, match="share a workspace must run in order"):
        plan_b.run()
    torch.cuda.synchronize()
    assert out_b.isnan().all(), "a refused run wrote its output"
    check_reference(first, out_a, layer.bank)
    with torch.cuda.stream(side):
        plan_a.run()
    torch.cuda.current_stream().wait_stream(side)   # ordered: accepted
    plan_b.run()
    check_reference(second, out_b, layer.bank)


def _output_in_workspace(a: dict) -> None:
    t, h = a["output"].shape
    a["output"] = a["workspace"][256:256 + 2 * t * h].view(torch.bfloat16).view(t, h)


def _x_in_output(a: dict) -> None:
    t, h = a["x"].shape
    a["x"] = a["output"].view(-1).view(torch.uint8)[:t * h].view(t, h).view(torch.float8_e4m3fn)


def _small_workspace(a: dict) -> None:
    a["workspace"] = a["workspace"][:a["workspace"].numel() // 2]


def _cpu_workspace(a: dict) -> None:
    """A host workspace at a 256-byte aligned address, so that the device check (not the
    alignment check) is the one that refuses it."""
    n = a["workspace"].numel()
    raw = torch.empty(n + 256, dtype=torch.uint8)
    start = -raw.data_ptr() % 256
    a["workspace"] = raw[start:start + n]


_BAD = {   # name: (how the arguments go wrong, what the ValueError says)
    "topk_ids on cpu": (lambda a: a.update(topk_ids=a["topk_ids"].cpu()), "topk_ids is on cpu"),
    "x_sf on cpu": (lambda a: a.update(x_sf=a["x_sf"].cpu()), "x_sf is on cpu"),
    "w2 on cpu": (lambda a: a.update(w2=a["w2"].cpu()), "w2 is on cpu"),
    "beta on cpu": (lambda a: a.update(beta=a["beta"].cpu()), "beta is on cpu"),
    "workspace on cpu": (_cpu_workspace, "workspace is on cpu"),
    "output on cpu": (lambda a: a.update(output=a["output"].cpu()), "output is on cpu"),
    "output inside workspace": (_output_in_workspace, "output and workspace overlap"),
    "x inside output": (_x_in_output, "output and x overlap"),
    "workspace too small": (_small_workspace, "workspace must hold at least"),
}


@pytest.mark.parametrize("name,tiles,match", [
    ("h256_e8_k2", ("wg128x4_rb", "wg128x4_rb"), "is a GEMM2 form"),
    ("h256_e8_k2", ("n8_shortk2", "n8_shortk2"), "is a GEMM2 form"),
    ("ep8", ("wg32x4", "wg32x4_rb"), "shard <= 512"),   # I = 3072: more K than the resident slots
])
def test_native_plan_refuses_resident_row_forms_outside_their_domain(layers, monkeypatch, name, tiles, match):
    """The host's own check, behind the decision table (which never hands it these pairs): the
    resident-rows forms and `n8_shortk2` are GEMM2 forms, a resident-rows one for a shard of at
    most 512. Refused before any launch."""
    from cake_moe.mxfp4_moe import _decide
    layer = layers(name)
    a = plan_args(layer, 17)
    monkeypatch.setattr(_decide, "gemm_tiles", lambda *_a, **_k: tiles)
    with pytest.raises(ValueError, match=match):
        call_plan(layer, a)
    torch.cuda.synchronize()
    assert a["output"].isnan().all(), "a refused plan() wrote the output"


@pytest.mark.parametrize("what", sorted(_BAD))
def test_plan_value_errors(layers, what):
    """Refused before any launch, and nothing written."""
    layer = layers("h256_e8_k2")
    a = plan_args(layer, 17)
    spoil, match = _BAD[what]
    spoil(a)
    a["output"].fill_(float("nan"))
    with pytest.raises(ValueError, match=match):
        call_plan(layer, a)
    torch.cuda.synchronize()
    assert a["output"].isnan().all(), "a refused plan() wrote the output"
