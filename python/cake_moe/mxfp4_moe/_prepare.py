"""Canonical MXFP4 weights <-> the kernel operand layout ``cake_mma_v3`` (docs/mxfp4_moe.md).

Both permutations of the layout are index-bit permutations, so neither needs an index tensor
(gathers through index tensors are an order of magnitude slower on CPU). For the contract bank
(L=112, H=7168, I=3072: 3.7 GB) that is one strided row copy plus a few in-place integer passes
per tensor, run slab by slab so that the passes stay in cache.

Rows, prepared row ``p`` of a 64-row group ``G``, ``b = p // 16``, ``r = p % 16`` (the doc's
formulas written as axis orders):

- w1: canonical row ``half*I + 32G + 4rr + b`` (``half = r // 8``: up, gate; ``rr = r % 8``):
  canonical axes (half, G, rr, b) -> prepared axes (G, b, half, rr).
- w2: canonical row ``64G + 8rr + 2b + hb`` (``rr = r % 8``, ``hb = r // 8``):
  canonical axes (G, rr, b, hb) -> prepared axes (G, b, hb, rr).

Nibbles of each 32-byte chunk (64 elements; canonical element ``e`` is nibble ``e`` of the chunk,
low nibble = even element): prepared slot (q, wi, p) is nibble ``16q + 8wi + p``; with
``p = 4n + 2a + h`` it holds canonical element ``8R + 2q + p//4 = 32wi + 16a + 8h + 2q + n``.
So the six index bits map as

    canonical [wi a h q1 q0 n]  ->  prepared [q1 q0 wi n a h]      (bit 5 .. bit 0)

Bits 5-4 select one of the chunk's four int64 words, bits 3-0 a nibble inside it. Four
exchanges, each between a word bit and a nibble bit, produce that order:
(W1, P3), (W1, P0), (W1, P2) rotate wi -> P3, h -> P0, n -> P2, q1 -> W1, and (W0, P1) swaps
a and q0. Each exchange is an involution, so the inverse applies them in reverse order.

Bits inside each 32-bit word: the element of nibble slot ``p`` (register ``r = p % 4``, half
``h = p // 4``) is not stored as a nibble but spread so that the kernel extracts register ``r``
as a BF16x2 pattern (magnitude at bits 6-8, sign at 15, + 16 for the high half) with one rotate
and one mask (``r = 0``: the mask alone; ``r = 3``: mask, multiply, mask): bit ``b`` (0: mantissa,
1, 2: exponent, 3: sign) of slot (r, h) sits at ``(T[b] + 16h - ROT[r]) mod 32`` for r < 3,
``T = (6, 7, 8, 15)``, ``ROT = (0, 10, 13)``, and at ``(3, 4, 0, 1)[b] + 16h`` for r = 3
(cpp/kernels/mxfp4_moe/weight_fragments.cuh). The move is nine (mask, shift) groups per word.
"""
from __future__ import annotations

import torch

LAYOUT = "cake_mma_v3"
_CHUNK = 32                                          # bytes of one 64-element K chunk
_EXCHANGES = ((1, 3), (1, 0), (1, 2), (0, 1))        # (word bit, nibble bit), applied in order
_SLAB_BYTES = {"cpu": 1 << 22, "cuda": 1 << 28}      # in-place passes run slab by slab (CPU: in cache)


def _rows_view(kind: str, num_local: int, rows: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(view shape, permutation) of the row axes: canonical rows viewed as ``shape`` and permuted
    with ``perm`` run in prepared row order (the leading axis is the expert)."""
    if kind == "w1":
        return (num_local, 2, rows // 64, 8, 4), (0, 2, 4, 1, 3)   # (L, half, G, rr, b) -> (L, G, b, half, rr)
    return (num_local, rows // 64, 8, 4, 2), (0, 1, 3, 4, 2)       # (L, G, rr, b, hb) -> (L, G, b, hb, rr)


def _row_axes(kind: str, t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The row axes of a weight or scale tensor [L, rows, cols]; the column axis stays last."""
    num_local, rows, cols = t.shape
    shape, perm = _rows_view(kind, num_local, rows)
    return (*shape, cols), (*perm, len(shape))


def _permute_rows(t: torch.Tensor, kind: str, inverse: bool = False) -> torch.Tensor:
    """A new contiguous tensor holding t's rows in prepared order (or back, ``inverse=True``).
    The row axes always move, so ``reshape`` copies and t is never aliased."""
    shape, perm = _row_axes(kind, t)
    if inverse:
        shape = tuple(shape[i] for i in perm)
        perm = tuple(sorted(range(len(perm)), key=perm.__getitem__))
    return t.contiguous().view(shape).permute(perm).reshape(t.shape)


def _nibble_mask(bit: int) -> int:
    """The nibbles of an int64 whose nibble index has ``bit`` clear (never the top nibble, so
    the value stays a non-negative int64)."""
    return sum(0xF << (4 * i) for i in range(16) if not (i >> bit) & 1)


def _exchange_(words: torch.Tensor, word_bit: int, nibble_bit: int, scratch: torch.Tensor) -> None:
    """Swap index bit ``word_bit`` (of the word inside a chunk) with index bit ``nibble_bit`` (of
    the nibble inside a word), in place, for words [n, 2 (W1), 2 (W0)] int64. For each pair of
    words x (word bit 0), y (word bit 1), the nibbles of x with the nibble bit set trade places
    with those of y with it clear: t = ((x >> s) ^ y) & m; y ^= t; x ^= t << s."""
    shift, mask = 4 << nibble_bit, _nibble_mask(nibble_bit)
    for other in (0, 1):
        x, y = (words[:, 0, other], words[:, 1, other]) if word_bit == 1 else (words[:, other, 0], words[:, other, 1])
        t = scratch[:x.shape[0]]
        torch.bitwise_right_shift(x, shift, out=t)
        t.bitwise_xor_(y).bitwise_and_(mask)
        y.bitwise_xor_(t)
        x.bitwise_xor_(t.bitwise_left_shift_(shift))


def _permute_nibbles_(w: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Apply the chunk nibble permutation (or its inverse) to a contiguous uint8 tensor in place."""
    words = w.view(-1).view(torch.int64).view(-1, 2, 2)
    step = max(1, _SLAB_BYTES.get(w.device.type, _SLAB_BYTES["cuda"]) // _CHUNK)
    scratch = torch.empty(min(step, words.shape[0]), dtype=torch.int64, device=w.device)
    order = _EXCHANGES[::-1] if inverse else _EXCHANGES
    for c0 in range(0, words.shape[0], step):
        slab = words[c0:c0 + step]
        for word_bit, nibble_bit in order:
            _exchange_(slab, word_bit, nibble_bit, scratch)
    return w


_BF16X2_BITS = (6, 7, 8, 15)        # mantissa, exponent lo, exponent hi, sign of a BF16 (x 2^-126) half
_ROTATE = (0, 10, 13)               # register r < 3: rotate left by _ROTATE[r], then mask
_REG3_BITS = (3, 4, 0, 1)           # register 3: where its bits sit (one multiply moves them)


def bit_position(r: int, h: int, b: int) -> int:
    """Bit of a prepared 32-bit word holding bit ``b`` of the element of register ``r``, half ``h``."""
    if r < 3:
        return (_BF16X2_BITS[b] + 16 * h - _ROTATE[r]) % 32
    return _REG3_BITS[b] + 16 * h


def _bit_groups(inverse: bool) -> tuple[tuple[int, int], ...]:
    """(int64 mask of source bits, left shift) groups moving nibble-slot bits (slot p at bits
    4p..4p+3) to their positions, in both 32-bit words of an int64; ``inverse`` moves them back."""
    groups: dict[int, int] = {}
    for p in range(8):
        for b in range(4):
            src, dst = 4 * p + b, bit_position(p % 4, p // 4, b)
            if inverse:
                src, dst = dst, src
            groups[dst - src] = groups.get(dst - src, 0) | (1 << src) | (1 << (src + 32))
    return tuple((mask, shift) for shift, mask in sorted(groups.items()))


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _place_bits_(w: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Spread the nibbles of every 32-bit word to their bit positions (or gather them back), in
    place, for a contiguous uint8 tensor whose size is a multiple of 8."""
    words = w.view(-1).view(torch.int64)
    step = max(1, _SLAB_BYTES.get(w.device.type, _SLAB_BYTES["cuda"]) // 8)
    acc = torch.empty(min(step, words.shape[0]), dtype=torch.int64, device=w.device)
    tmp = torch.empty_like(acc)
    groups = _bit_groups(inverse)
    for c0 in range(0, words.shape[0], step):
        x = words[c0:c0 + step]
        a, t = acc[:x.shape[0]], tmp[:x.shape[0]]
        a.zero_()
        for mask, shift in groups:
            if shift >= 0:
                torch.bitwise_and(x, _signed64(mask), out=t).bitwise_left_shift_(shift)
            else:   # arithmetic shift: the shifted mask clears the sign-extended bits
                torch.bitwise_right_shift(x, -shift, out=t).bitwise_and_(_signed64(mask >> -shift))
            a.bitwise_or_(t)
        x.copy_(a)
    return w


def _to_prepared(w: torch.Tensor, kind: str) -> torch.Tensor:
    return _place_bits_(_permute_nibbles_(_permute_rows(w, kind)))


def _from_prepared(w: torch.Tensor, kind: str) -> torch.Tensor:
    return _permute_nibbles_(_place_bits_(_permute_rows(w, kind, inverse=True), inverse=True), inverse=True)


def _check_bank(w1, w1_scale, w2, w2_scale, names: tuple[str, str, str, str]) -> tuple[int, int, int]:
    """Validate a canonical or prepared bank; returns (L, H, I)."""
    tensors = (w1, w1_scale, w2, w2_scale)
    for t, name in zip(tensors, names):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.uint8:
            raise ValueError(f"{name} must have dtype torch.uint8, got {t.dtype}")
        if t.dim() != 3:
            hint = (" (mxfp4_quantize of an [L, rows, K] bank gives its scales as [L * rows, K/32]: "
                    "view them as [L, rows, K/32])" if t.dim() == 2 and name.endswith("scale") else "")
            raise ValueError(f"{name} must be 3-D [L, rows, bytes], got shape {tuple(t.shape)}{hint}")
    num_local, two_i, half_h = w1.shape
    if num_local < 1:   # the wrapper serves num_local_experts >= 1
        raise ValueError(f"{names[0]} must hold at least one expert (L = shape[0] >= 1), got shape {tuple(w1.shape)}")
    if two_i % 2:
        raise ValueError(f"{names[0]} must have 2*I rows (up then gate), got {two_i}")
    hidden, inter = 2 * half_h, two_i // 2
    for value, what in ((hidden, "hidden size H (2 * w1.shape[2])"), (inter, "intermediate size I (w1.shape[1] / 2)")):
        if value <= 0 or value % 128:
            raise ValueError(f"{what} must be a positive multiple of 128, got {value}")
    expected = ((num_local, two_i, hidden // 32), (num_local, hidden, inter // 2), (num_local, hidden, inter // 32))
    for t, name, shape in zip(tensors[1:], names[1:], expected):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} for L={num_local}, H={hidden}, I={inter}, "
                             f"got {tuple(t.shape)}")
    for t, name in zip(tensors[1:], names[1:]):
        if t.device != w1.device:
            raise ValueError(f"{name} is on {t.device}, expected {w1.device} (the device of {names[0]})")
    return num_local, hidden, inter


def scale_code_max(scale: torch.Tensor) -> torch.Tensor:
    """The largest UE8M0 code of each expert of a scale bank [L, rows, cols]: uint8 [L]."""
    return scale.reshape(scale.shape[0], -1).amax(dim=1).contiguous()


def prepare_cake_mxfp4_weights(w1: torch.Tensor, w1_scale: torch.Tensor, w2: torch.Tensor,
                               w2_scale: torch.Tensor) -> dict:
    """Canonical MXFP4 expert bank -> the ``cake_mma_v3`` kernel operands (pure torch).

    w1 [L, 2*I, H/2] (rows: up then gate), w1_scale [L, 2*I, H/32], w2 [L, H, I/2],
    w2_scale [L, H, I/32], all uint8 on one device; H and I multiples of 128. Returns a dict of
    contiguous uint8 tensors on the same device with unchanged shapes, ``w1``, ``w1_sf``,
    ``w2``, ``w2_sf``, the largest scale code of each expert ``w1_sf_max`` and ``w2_sf_max``
    (uint8 [L]), plus ``layout``, ``num_local_experts``, ``hidden_size``,
    ``intermediate_shard``. Run it once per rank at load time; the inputs are not modified.

    The largest codes let the sm_90a prefill forms convert an expert whose codes are all <= 128
    (every weight of magnitude <= 12: real weights) with one multiply instead of two. They
    describe the scales they were computed from: to load new weights into prepared tensors in
    place, copy every tensor of a new ``prepare_cake_mxfp4_weights`` result, these included.
    """
    num_local, hidden, inter = _check_bank(w1, w1_scale, w2, w2_scale, ("w1", "w1_scale", "w2", "w2_scale"))
    return {
        "w1": _to_prepared(w1, "w1"),
        "w1_sf": _permute_rows(w1_scale, "w1"),
        "w2": _to_prepared(w2, "w2"),
        "w2_sf": _permute_rows(w2_scale, "w2"),
        "w1_sf_max": scale_code_max(w1_scale),
        "w2_sf_max": scale_code_max(w2_scale),
        "layout": LAYOUT,
        "num_local_experts": num_local,
        "hidden_size": hidden,
        "intermediate_shard": inter,
    }


def unprepare_cake_mxfp4_weights(prepared: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact inverse of :func:`prepare_cake_mxfp4_weights`: (w1, w1_scale, w2, w2_scale)."""
    if not isinstance(prepared, dict) or prepared.get("layout") != LAYOUT:
        raise ValueError(f"prepared must be the dict returned by prepare_cake_mxfp4_weights (layout {LAYOUT!r})")
    keys = ("w1", "w1_sf", "w2", "w2_sf")
    missing = [k for k in keys if k not in prepared]
    if missing:
        raise ValueError(f"prepared is missing the key(s) {', '.join(map(repr, missing))} "
                         f"(the dict of prepare_cake_mxfp4_weights holds {', '.join(keys)})")
    w1, w1_sf, w2, w2_sf = (prepared[k] for k in keys)
    _check_bank(w1, w1_sf, w2, w2_sf, ("prepared['w1']", "prepared['w1_sf']", "prepared['w2']", "prepared['w2_sf']"))
    return (_from_prepared(w1, "w1"),
            _permute_rows(w1_sf, "w1", inverse=True),
            _from_prepared(w2, "w2"),
            _permute_rows(w2_sf, "w2", inverse=True))
