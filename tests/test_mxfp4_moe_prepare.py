"""CPU tests of the MXFP4 MoE weight preparation (SPEC §7, docs/mxfp4_moe.md "Weight layout"):
prepare_cake_mxfp4_weights against the documented formulas element by element, the bit table,
round trips and refusals."""
from __future__ import annotations

import pytest
import torch

from cake_moe.mxfp4_moe import prepare_cake_mxfp4_weights, unprepare_cake_mxfp4_weights

from .mxfp4_moe_cases import byte_bank

def _nibble(row: list[int], element: int) -> int:
    byte = row[element // 2]
    return byte >> 4 if element % 2 else byte & 0xF


def _bit(r: int, h: int, b: int) -> int:
    """The doc's bit table: bit b (0 mantissa, 1-2 exponent, 3 sign) of register slot r, half h
    of a prepared 32-bit word."""
    if r < 3:
        return ((6, 7, 8, 15)[b] + 16 * h - (0, 10, 13)[r]) % 32
    return (3, 4, 0, 1)[b] + 16 * h


def _slow_prepare_rows(canonical: torch.Tensor, canon_row, weights: bool) -> torch.Tensor:
    """The doc's formulas, one element at a time: prepared row P of expert e is canonical row
    canon_row(P); with ``weights``, slot (q, wi, p) of chunk c (word 8q + 4wi of the chunk's bytes)
    holds canonical element 64c + 16s + 8h + 2q + odd, R = 4wi + p%4, s = R//2, h = R%2,
    odd = p//4, its bits spread by the bit table (register slot p%4, half p//4)."""
    num_local, rows, cols = canonical.shape
    out = torch.empty_like(canonical)
    for e in range(num_local):
        src = canonical[e].tolist()
        for prow in range(rows):
            row = src[canon_row(prow)]
            if not weights:
                out[e, prow] = torch.tensor(row, dtype=torch.uint8)
                continue
            new = [0] * cols
            for c in range(cols // 32):
                for q in range(4):
                    for wi in range(2):
                        for p in range(8):
                            r = 4 * wi + p % 4
                            element = 64 * c + 16 * (r // 2) + 8 * (r % 2) + 2 * q + p // 4
                            v = _nibble(row, element)
                            for b in range(4):
                                pos = _bit(p % 4, p // 4, b)
                                new[32 * c + 8 * q + 4 * wi + pos // 8] |= ((v >> b) & 1) << (pos % 8)
            out[e, prow] = torch.tensor(new, dtype=torch.uint8)
    return out


def _w1_row(inter: int):
    def canon(prow: int) -> int:
        g, p = divmod(prow, 64)
        b, r = divmod(p, 16)
        return 32 * g + 4 * r + b if r < 8 else inter + 32 * g + 4 * (r - 8) + b
    return canon


def _w2_row(prow: int) -> int:
    g, p = divmod(prow, 64)
    b, r = divmod(p, 16)
    return 64 * g + 8 * (r % 8) + 2 * b + r // 8


@pytest.mark.parametrize("hidden,inter", [(128, 128), (256, 384)])
def test_prepare_matches_the_doc_formulas_element_by_element(hidden, inter):
    w1, w1s, w2, w2s = byte_bank(2, hidden, inter, seed=hidden + inter)
    p = prepare_cake_mxfp4_weights(w1, w1s, w2, w2s)
    assert not torch.equal(p["w1"], w1) and not torch.equal(p["w2"], w2)
    assert torch.equal(p["w1"], _slow_prepare_rows(w1, _w1_row(inter), weights=True))
    assert torch.equal(p["w1_sf"], _slow_prepare_rows(w1s, _w1_row(inter), weights=False))
    assert torch.equal(p["w2"], _slow_prepare_rows(w2, _w2_row, weights=True))
    assert torch.equal(p["w2_sf"], _slow_prepare_rows(w2s, _w2_row, weights=False))


def test_bit_table_is_a_permutation_and_matches_the_module():
    from cake_moe.mxfp4_moe import _prepare
    slots = [(r, h, b) for r in range(4) for h in range(2) for b in range(4)]
    assert sorted(_bit(*x) for x in slots) == list(range(32))
    assert all(_prepare.bit_position(*x) == _bit(*x) for x in slots)


# weight_fragments.cuh's masks (tests/test_cpp_mirrors.py holds them to the header)
SLOT_MASK = 0x81C081C0
SLOT3_BITS = 0x001B001B
SLOT3_SHIFTS = (1 << 3) | (1 << 8) | (1 << 14)


def _extract(word: int, r: int) -> int:
    """The kernel's extraction of register slot r (weight_fragments.cuh), in Python."""
    rotl = lambda x, k: ((x << k) | (x >> (32 - k))) & 0xFFFFFFFF if k else x  # noqa: E731
    if r < 3:
        return rotl(word, (0, 10, 13)[r]) & SLOT_MASK
    return (((word & SLOT3_BITS) * SLOT3_SHIFTS) & 0xFFFFFFFF) & SLOT_MASK


def test_kernel_extraction_yields_the_bf16_patterns():
    """Every slot's nibble comes out as the BF16x2 pattern 2^-126 * E2M1 (magnitude at bits 6-8,
    sign at 15, + 16 for the high half), whatever the other slots hold."""
    g = torch.Generator().manual_seed(7)
    for _ in range(200):
        nibbles = torch.randint(0, 16, (8,), generator=g).tolist()
        word = 0
        for p, v in enumerate(nibbles):
            for b in range(4):
                word |= ((v >> b) & 1) << _bit(p % 4, p // 4, b)
        for r in range(4):
            lo, hi = nibbles[r], nibbles[r + 4]
            want = ((lo & 7) << 6) | ((lo >> 3) << 15) | ((hi & 7) << 22) | ((hi >> 3) << 31)
            assert _extract(word, r) == want


def test_prepare_pairs_up_and_gate_of_one_column():
    """Prepared w1 rows r and r + 8 of a group are up and gate of the same intermediate column;
    the scale rows move with them (the scale column here carries the canonical row number)."""
    inter = 128
    w1, _, w2, w2s = byte_bank(1, 128, inter)
    w1s = torch.arange(2 * inter, dtype=torch.int32).to(torch.uint8).view(1, -1, 1).repeat(1, 1, 4)
    canon_row = prepare_cake_mxfp4_weights(w1, w1s, w2, w2s)["w1_sf"][0, :, 0].long()
    assert canon_row[:8].tolist() == [0, 4, 8, 12, 16, 20, 24, 28]
    assert canon_row[8:16].tolist() == [inter + j for j in (0, 4, 8, 12, 16, 20, 24, 28)]
    assert canon_row[16:24].tolist() == [1, 5, 9, 13, 17, 21, 25, 29]
    assert sorted(canon_row.tolist()) == list(range(2 * inter))


@pytest.mark.parametrize("shape", [(3, 256, 128), (2, 384, 640), (2, 7168, 3072)])
def test_prepare_round_trip(shape):
    num_local, hidden, inter = shape
    bank = byte_bank(num_local, hidden, inter, seed=sum(shape))
    before = [t.clone() for t in bank]
    p = prepare_cake_mxfp4_weights(*bank)
    assert p["layout"] == "cake_mma_v3"
    assert (p["num_local_experts"], p["hidden_size"], p["intermediate_shard"]) == shape
    for name, canonical in zip(("w1", "w1_sf", "w2", "w2_sf"), bank):
        t = p[name]
        assert t.dtype == torch.uint8 and t.shape == canonical.shape and t.is_contiguous()
        assert t.data_ptr() != canonical.data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(bank, before)), "prepare modified its inputs"
    back = unprepare_cake_mxfp4_weights(p)
    assert all(torch.equal(a, b) for a, b in zip(back, bank))


def test_prepare_accepts_non_contiguous_inputs():
    bank = byte_bank(2, 256, 128)
    wide = torch.zeros(2, 256, 256, dtype=torch.uint8)
    wide[:, :, :128] = bank[0]
    p = prepare_cake_mxfp4_weights(wide[:, :, :128], *bank[1:])
    assert torch.equal(p["w1"], prepare_cake_mxfp4_weights(*bank)["w1"])


def _badbyte_bank(what: str):
    w1, w1s, w2, w2s = byte_bank(2, 256, 128)
    return {
        "w1 dtype": (w1.view(torch.int8), w1s, w2, w2s),
        "w1_scale 2-D": (w1, w1s[0], w2, w2s),
        "w2_scale flat": (w1, w1s, w2, w2s.reshape(-1, w2s.shape[-1])),   # as mxfp4_quantize gives them
        "w2 shape": (w1, w1s, w2[:, :, :32], w2s),
        "w2_scale shape": (w1, w1s, w2, w2s[:1]),
        "w1_scale shape": (w1, w1s[:, :128], w2, w2s),
        "hidden size": (w1[:, :, :32], w1s[:, :, :4], w2[:, :128], w2s[:, :128]),
        "intermediate size": (w1[:, :128], w1s[:, :128], w2[:, :, :32], w2s[:, :, :2]),
        "w2 device": (w1, w1s, w2.to("meta"), w2s),
        "w1 not a tensor": (w1.numpy(), w1s, w2, w2s),
        "no experts": (w1[:0], w1s[:0], w2[:0], w2s[:0]),
    }[what]


@pytest.mark.parametrize("what,match", [
    ("w1 dtype", "w1 must have dtype torch.uint8"), ("w1_scale 2-D", "w1_scale must be 3-D"),
    ("w2_scale flat", r"w2_scale must be 3-D .* view them as \[L, rows, K/32\]"),
    ("w2 shape", "w2 must have shape"), ("w2_scale shape", "w2_scale must have shape"),
    ("w1_scale shape", "w1_scale must have shape"), ("hidden size", "hidden size H"),
    ("intermediate size", "intermediate size I"), ("w2 device", "w2 is on meta"),
    ("w1 not a tensor", "w1 must be a torch.Tensor"), ("no experts", "w1 must hold at least one expert"),
])
def test_prepare_refuses(what, match):
    with pytest.raises(ValueError, match=match):
        prepare_cake_mxfp4_weights(*_badbyte_bank(what))


def test_unprepare_refuses_what_prepare_did_not_make():
    with pytest.raises(ValueError, match="layout"):
        unprepare_cake_mxfp4_weights({"w1": None})
    with pytest.raises(ValueError, match="layout"):
        unprepare_cake_mxfp4_weights(byte_bank(1, 128, 128))


def test_unprepare_names_the_missing_keys():
    with pytest.raises(ValueError, match=r"missing the key\(s\) 'w1', 'w1_sf', 'w2', 'w2_sf'"):
        unprepare_cake_mxfp4_weights({"layout": "cake_mma_v3"})
    prepared = prepare_cake_mxfp4_weights(*byte_bank(1, 128, 128))
    del prepared["w2_sf"]
    with pytest.raises(ValueError, match=r"missing the key\(s\) 'w2_sf' "):
        unprepare_cake_mxfp4_weights(prepared)


def test_unprepare_refuses_a_bank_without_experts():
    prepared = {**prepare_cake_mxfp4_weights(*byte_bank(1, 128, 128)), "num_local_experts": 0}
    for key in ("w1", "w1_sf", "w2", "w2_sf"):
        prepared[key] = prepared[key][:0]
    with pytest.raises(ValueError, match=r"prepared\['w1'\] must hold at least one expert"):
        unprepare_cake_mxfp4_weights(prepared)
