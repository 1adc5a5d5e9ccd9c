"""Exact-rational check of the FMA-corrected FP32 division the NVFP4 quantize kernel uses in
place of a per-element division (numerics.cuh `div_by_block_scale`): with y = RN(1/b),
q0 = RN(a * y), r = fma(-q0, b, a), q = fma(r, y, q0) must equal RN(a / b).

Quantize divides a = fl(x * q) by the block's E4M3 scale (every nonzero code, with a near each
E2M1 decision point and at random). The second part, e2m1 * s over random FP32 global scales,
covers the dequantize direction, which the kernel computes with a per-element division instead
(the global scale may be any FP32 value, also where 1 / q is subnormal or infinite).
Runs on the CPU in about a minute: `python ci/fp32_division_check.py`."""
from __future__ import annotations

import random
from fractions import Fraction as F


def rn32(v: F) -> F:
    """v rounded to the nearest FP32 value, ties to even (subnormals included; no overflow)."""
    if v == 0:
        return F(0)
    sign, v = (-1 if v < 0 else 1), abs(v)
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if F(2) ** e > v:
        e -= 1
    quantum = F(2) ** (max(e, -126) - 23)
    m = v / quantum
    whole, rest = divmod(m.numerator, m.denominator)
    if 2 * rest > m.denominator or (2 * rest == m.denominator and whole % 2):
        whole += 1
    return sign * whole * quantum


def corrected_quotient(a: F, b: F) -> F:
    y = rn32(1 / b)
    q0 = rn32(a * y)
    r = rn32(a - q0 * b)     # exact (the FMA's remainder is representable)
    return rn32(r * y + q0)


def e4m3_scales() -> list[F]:
    out = []
    for code in range(1, 127):
        e, m = code >> 3, code & 7
        out.append(F(m, 8) * F(2) ** -6 if e == 0 else (1 + F(m, 8)) * F(2) ** (e - 7))
    return out


def main() -> None:
    rng = random.Random(0)
    points = [F(1, 4), F(3, 4), F(5, 4), F(7, 4), F(5, 2), F(7, 2), F(5)]
    cases = bad = 0
    for s in e4m3_scales():
        for t in points:
            c = rn32(t * s)
            ulp = F(2) ** ((c.numerator.bit_length() - c.denominator.bit_length()) - 24)
            for a in [rn32(c + k * ulp) for k in range(-40, 41)] + [rn32(F(rng.uniform(-8, 8)) * s)
                                                                   for _ in range(30)]:
                cases += 1
                bad += corrected_quotient(a, s) != rn32(a / s)
    e2m1 = [F(v) for v in (0.5, 1, 1.5, 2, 3, 4, 6)]
    scales = e4m3_scales()
    for _ in range(60000):
        g = rn32(F(rng.uniform(1, 2)) * F(2) ** rng.randint(-20, 20))
        a = rng.choice(e2m1) * rng.choice(scales)
        cases += 1
        bad += corrected_quotient(a, g) != rn32(a / g)
    print(f"{cases} cases, {bad} differ from the correctly rounded quotient")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
