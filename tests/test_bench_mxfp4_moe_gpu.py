"""GPU test of the family-B benchmark on a layer other than the contract's (``--layer``): its
rows carry that layer's geometry, count its rank's experts and bytes, and our layer agrees with
the naive PyTorch layer on the same inputs."""
from __future__ import annotations

import pytest
import torch

from cake_moe.bench import mxfp4_moe as bench_moe

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rank", [{"num_local_experts": 6, "local_expert_offset": 5}, {"intermediate_shard": 128}])
def test_rows_of_another_layer(rank):
    layer = bench_moe.other_layer((16, 4, 512, 384), rank)
    rows = bench_moe.run(tokens=(1, 300), layouts=(layer,))
    assert [r["T"] for r in rows] == [1, 300]
    l = rank.get("num_local_experts", 16)
    shard = rank.get("intermediate_shard", 384)
    for r in rows:
        assert "skipped" not in r, r
        assert r["layout"] == layer.name and r["shape"] == [512, 384, 16, 4]
        assert 0 < r["routed_experts"] <= l
        assert r["bytes"] == pytest.approx(r["routed_experts"] * bench_moe.expert_bytes(shard, 512))
        assert r["flops"] == pytest.approx(2.0 * r["local_routes"] * 3 * shard * 512)
        assert r["ours_us"] > 0 and r["peer_us_perf_md"] is None
        # the naive layer keeps a BF16 intermediate where ours requantizes to MXFP8: a few percent
        assert r["naive_rel_diff"] is not None and r["naive_rel_diff"] < 0.06, r["naive_rel_diff"]
    torch.cuda.empty_cache()
