"""Exact-rational check of the FMA-corrected FP32 division the NVFP4 kernels use in place of a
division instruction (numerics.cuh `div_by_reciprocal`): with y = RN(1/b), q0 = RN(a * y),
-r = fma(q0, b, -a) (exact) and q = fma(r, y, q0), q must equal RN(a / b).

Three uses, each checked where its rounding decides:
- quantize divides a = fl(x * q) by the block's E4M3 scale: every nonzero scale, with a near
  each E2M1 decision point and at random;
- the block scale divides p = fl(amax * q) by 6: p near 6x every midpoint of consecutive E4M3
  values (where e4m3(p / 6) decides), and at random over [2^-120, 2^20);
- dequantize divides e2m1 * s by the FP32 global scale, over global scales in [2^-100, 2^100].
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
    neg_r = rn32(q0 * b - a)     # exact (the FMA's residual is representable)
    return rn32(q0 - neg_r * y)


def near(c: F, k: int) -> list[F]:
    """FP32 values within k ulps of c (ulps of c's binade)."""
    ulp = F(2) ** ((c.numerator.bit_length() - c.denominator.bit_length()) - 24)
    return [rn32(c + i * ulp) for i in range(-k, k + 1)]


def e4m3_scales() -> list[F]:
    out = []
    for code in range(1, 127):
        e, m = code >> 3, code & 7
        out.append(F(m, 8) * F(2) ** -6 if e == 0 else (1 + F(m, 8)) * F(2) ** (e - 7))
    return out


def main() -> None:
    rng = random.Random(0)
    points = [F(1, 4), F(3, 4), F(5, 4), F(7, 4), F(5, 2), F(7, 2), F(5)]
    scales = e4m3_scales()
    cases = bad = 0

    def check(a: F, b: F) -> None:
        nonlocal cases, bad
        cases += 1
        bad += corrected_quotient(a, b) != rn32(a / b)

    for s in scales:
        for t in points:
            for a in near(rn32(t * s), 40) + [rn32(F(rng.uniform(-8, 8)) * s) for _ in range(30)]:
                check(a, s)
    grid = [F(0)] + scales + [F(464)]          # 464: where e4m3 saturates to 448
    for lo, hi in zip(grid, grid[1:]):
        for p in near(rn32(3 * (lo + hi)), 12):
            check(p, F(6))
    for _ in range(20000):
        check(rn32(F(rng.uniform(1, 2)) * F(2) ** rng.randint(-120, 19)), F(6))
    e2m1 = [F(v) for v in (0.5, 1, 1.5, 2, 3, 4, 6)]
    for _ in range(60000):
        g = rn32(F(rng.uniform(1, 2)) * F(2) ** rng.randint(-100, 99))
        check(rng.choice(e2m1) * rng.choice(scales), g)
    print(f"{cases} cases, {bad} differ from the correctly rounded quotient")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
